/* fuzz_chat — every registered family's chat template (family_at) on arbitrary JSON conversations, and
 * every reply parser on arbitrary text.
 *
 * Input: byte 0 = options (bit 0 thinking, bits 1-2 tool_choice, bits 3-5 reasoning effort), the
 * rest a JSON body {"messages": [...], "tools": [...]} or a bare messages array, and also the
 * reply text. Checked beyond the sanitizers: untrusted spans are ascending, disjoint, non-empty
 * and inside the text; the system prefix is inside the prompt; a prompt that encodes decodes back
 * to its text, and no special id's bytes touch an untrusted span. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tokenizer.h"
#include "fuzz.h"
#include "models/chat.h"
#include "models/model.h"

static tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    tok = fuzz_tokenizer("fuzz_chat");
    return 0;
}

/* Does [a, b) touch an untrusted span of p? */
static int touches(const chat_prompt *p, size_t a, size_t b) {
    for (int i = 0; i < p->nuntrusted; i++)
        if (p->untrusted[i].start < b && a < p->untrusted[i].start + p->untrusted[i].len) return 1;
    return 0;
}

static void check_prompt(const chat_template *tpl, const chat_prompt *p) {
    size_t end = 0;
    for (int i = 0; i < p->nuntrusted; i++) {
        const tok_span *s = &p->untrusted[i];
        if (s->len == 0 || (i && s->start <= end) || s->start + s->len > p->text.len) abort();
        end = s->start + s->len;
    }
    if (tpl->system_prefix_bytes && tpl->system_prefix_bytes(p->text.p, p->text.len) > p->text.len) abort();
    int *ids = NULL, n = 0;
    char err[256];
    if (chat_prompt_encode(tok, p, &ids, &n, err, sizeof err)) return;    /* e.g. invalid UTF-8 */
    size_t len;
    char *dec = tok_decode(tok, ids, n, &len);
    if (len != p->text.len || memcmp(dec, p->text.p, len)) abort();
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        size_t l;
        free(tok_decode(tok, &ids[i], 1, &l));
        if (tok_is_special(tok, ids[i]) && touches(p, at, at + l)) abort();
        at += l;
    }
    free(dec);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const char *choices[] = {NULL, "none", "required", "get"};
    static const char *efforts[] = {NULL, "low", "high", "max", "xhigh", "none", "bogus", "medium"};
    chat_opts o = {.thinking = data[0] & 1, .tool_choice = choices[(data[0] >> 1) & 3],
                   .effort = efforts[(data[0] >> 3) & 7]};
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    cJSON *body = cJSON_ParseWithLength(text, n);
    const cJSON *msgs = cJSON_IsObject(body) ? cJSON_GetObjectItemCaseSensitive(body, "messages") : body;
    const cJSON *tools = cJSON_IsObject(body) ? cJSON_GetObjectItemCaseSensitive(body, "tools") : NULL;
    for (int i = 0; i < family_count(); i++) {
        const chat_template *tpl = family_at(i)->chat;
        if (!tpl) continue;
        if (body) {
            chat_prompt p = {0};
            char err[256];
            if (tpl->render(msgs, tools, &o, &p, err, sizeof err) == 0) check_prompt(tpl, &p);
            chat_prompt_free(&p);
        }
        for (int thinking = 0; thinking < 2; thinking++) {
            chat_reply r;
            tpl->parse(text, n, thinking, &r);
            chat_reply_free(&r);
        }
    }
    cJSON_Delete(body);
    return 0;
}
