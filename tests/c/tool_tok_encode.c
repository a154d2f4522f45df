/* tool_tok_encode — test helper for tests/test_tokenizer_parity.py (not a unit test program).
 *
 * tool_tok_encode TOKENIZER.json STRINGS.json
 * prints one JSON array with, per input string, {"ids": [...], "decoded": "...", "streamed": "..."}:
 * the ids tok_encode gives, tok_decode of them, and the concatenated streaming-decoder output.
 */
#include "core/tokenizer.h"
#include "core/util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *stream_all(const tokenizer *t, const int *ids, int n) {
    size_t cap = tok_max_token_bytes(t) + 4, len = 0;
    char *buf = xmalloc(cap * (size_t)(n + 1) + 1);
    tok_stream s;
    tok_stream_init(&s, t);
    for (int i = 0; i < n; i++) len += tok_stream_put(&s, ids[i], buf + len, cap);
    len += tok_stream_finish(&s, buf + len, cap);
    buf[len] = 0;
    return buf;
}

static cJSON *encode_one(const tokenizer *t, const char *text) {
    char err[256];
    size_t n = strlen(text);
    int max = (int)n + 8;
    int *ids = xmalloc(sizeof(int) * (size_t)max);
    int k = tok_encode(t, text, n, ids, max, err, sizeof err);
    cJSON *o = cJSON_CreateObject();
    if (k < 0 || k > max) {
        cJSON_AddStringToObject(o, "error", k < 0 ? err : "more ids than bytes");
        free(ids);
        return o;
    }
    cJSON_AddItemToObject(o, "ids", cJSON_CreateIntArray(ids, k));
    char *dec = tok_decode(t, ids, k, NULL), *str = stream_all(t, ids, k);
    cJSON_AddStringToObject(o, "decoded", dec);
    cJSON_AddStringToObject(o, "streamed", str);
    free(dec);
    free(str);
    free(ids);
    return o;
}

int main(int argc, char **argv) {
    char err[512];
    if (argc != 3) {
        fprintf(stderr, "usage: %s TOKENIZER.json STRINGS.json\n", argv[0]);
        return 2;
    }
    tokenizer *t = tok_load(argv[1], err, sizeof err);
    if (!t) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    size_t len;
    char *text = read_file(argv[2], &len, err, sizeof err);
    cJSON *strings = text ? cJSON_Parse(text) : NULL;
    if (!cJSON_IsArray(strings)) {
        fprintf(stderr, "%s: not a JSON array of strings\n", argv[2]);
        return 1;
    }
    cJSON *out = cJSON_CreateArray(), *s;
    cJSON_ArrayForEach(s, strings) cJSON_AddItemToArray(out, encode_one(t, cJSON_IsString(s) ? s->valuestring : ""));
    char *json = cJSON_PrintUnformatted(out);
    puts(json);
    free(json);
    cJSON_Delete(out);
    cJSON_Delete(strings);
    free(text);
    tok_free(t);
    return 0;
}
