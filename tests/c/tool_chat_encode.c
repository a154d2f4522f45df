/* tool_chat_encode — test helper for tests/test_no_forged_turns.py (not a unit test program).
 *
 * tool_chat_encode MODEL_DIR CASES.json
 * renders each case {"messages", "tools"?, "thinking"?} with the model's chat template and prints
 * one JSON array with, per case, {"text", "ids", "decoded", "whole"}: the prompt, its ids as the
 * engine encodes a chat prompt (untrusted spans as plain text), tok_decode of those ids, and
 * tok_encode of the whole text (what a raw prompt of the same text gives) — or {"error"}.
 */
#include "core/tokenizer.h"
#include "core/util.h"
#include "models/chat.h"
#include "models/model.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cJSON *encode_case(const chat_template *tpl, const tokenizer *t, const cJSON *c) {
    cJSON *o = cJSON_CreateObject();
    chat_opts co = {.thinking = cJSON_IsTrue(cJSON_GetObjectItem(c, "thinking"))};
    chat_prompt p = {0};
    char err[256] = "";
    int *ids = NULL, n = 0;
    if (tpl->render(cJSON_GetObjectItem(c, "messages"), cJSON_GetObjectItem(c, "tools"), &co, &p, err, sizeof err) ||
        chat_prompt_encode(t, &p, &ids, &n, err, sizeof err)) {
        cJSON_AddStringToObject(o, "error", err);
        chat_prompt_free(&p);
        return o;
    }
    int cap = (int)p.text.len + 16, *whole = xmalloc((size_t)cap * sizeof *whole);
    int k = tok_encode(t, p.text.p, p.text.len, whole, cap, err, sizeof err);
    cJSON_AddStringToObject(o, "text", p.text.p);
    cJSON_AddItemToObject(o, "ids", cJSON_CreateIntArray(ids, n));
    char *dec = tok_decode(t, ids, n, NULL);
    cJSON_AddStringToObject(o, "decoded", dec);
    free(dec);
    cJSON_AddItemToObject(o, "whole", cJSON_CreateIntArray(whole, k < 0 || k > cap ? 0 : k));
    free(ids);
    free(whole);
    chat_prompt_free(&p);
    return o;
}

int main(int argc, char **argv) {
    char err[512], path[4096];
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL_DIR CASES.json\n", argv[0]);
        return 2;
    }
    size_t len;
    const family_ops *fam = family_of_dir(argv[1], err, sizeof err);
    const chat_template *tpl = fam ? fam->chat : NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", argv[1]);
    tokenizer *t = tok_load(path, err, sizeof err);
    char *text = read_file(argv[2], &len, err, sizeof err);
    cJSON *cases = text ? cJSON_Parse(text) : NULL;
    if (!tpl || !t || !cJSON_IsArray(cases)) {
        fprintf(stderr, "%s: no chat template, tokenizer or JSON array of cases (%s)\n", argv[1], err);
        return 1;
    }
    cJSON *out = cJSON_CreateArray(), *c;
    cJSON_ArrayForEach(c, cases) cJSON_AddItemToArray(out, encode_case(tpl, t, c));
    char *json = cJSON_PrintUnformatted(out);
    puts(json);
    free(json);
    cJSON_Delete(out);
    cJSON_Delete(cases);
    free(text);
    tok_free(t);
    return 0;
}
