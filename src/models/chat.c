/* chat.c — what the chat templates share (the Python-style JSON writer, reply freeing).
 * Each family's template lives in its own file (chat_<family>.c) and is reached through the
 * family's descriptor (model.h). */
#include "chat.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"

void chat_reply_free(chat_reply *r) {
    if (!r) return;
    free(r->reasoning);
    free(r->content);
    cJSON_Delete(r->tool_calls);
    memset(r, 0, sizeof *r);
}

/* ---- prompts with trusted and untrusted text ------------------------------------------------- */

int chat_effort_accepted(const chat_template *t, const char *effort, char *list, size_t n) {
    if (!effort || !t->efforts) return 1;
    for (const char *const *e = t->efforts; *e; e++)
        if (!strcmp(*e, effort)) return 1;
    size_t used = (size_t)snprintf(list, n, "none");
    for (const char *const *e = t->efforts; *e && used < n; e++) used += (size_t)snprintf(list + used, n - used, ", %s", *e);
    return 0;
}

const char *chat_reasoning(const cJSON *msg) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
    if (!cJSON_IsString(r)) r = cJSON_GetObjectItemCaseSensitive(msg, "reasoning");
    return cJSON_IsString(r) ? r->valuestring : NULL;
}

int chat_reasoning_content_only(const cJSON *msg, int idx, char *err, size_t errlen) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(msg, "reasoning");
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
    if (!cJSON_IsString(r) || (cJSON_IsString(rc) && !strcmp(rc->valuestring, r->valuestring))) return 0;
    return errf(err, errlen, "messages[%d].reasoning: this model's chat template renders reasoning_content only "
                "(send the reasoning there)", idx);
}

void chat_trusted(chat_prompt *p, const char *template_text) { sbuf_puts(&p->text, template_text); }

void chat_untrusted_since(chat_prompt *p, size_t start) {
    size_t end = p->text.len;
    if (end <= start) return;
    tok_span *last = p->nuntrusted ? &p->untrusted[p->nuntrusted - 1] : NULL;
    if (last && last->start + last->len == start) {
        last->len += end - start;
        return;
    }
    if (p->nuntrusted == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->untrusted = xrealloc(p->untrusted, (size_t)p->cap * sizeof *p->untrusted);
    }
    p->untrusted[p->nuntrusted++] = (tok_span){start, end - start};
}

void chat_untrusted(chat_prompt *p, const char *s, size_t n) {
    size_t start = p->text.len;
    sbuf_put(&p->text, s, n);
    chat_untrusted_since(p, start);
}

void chat_untrusted_str(chat_prompt *p, const char *s) { chat_untrusted(p, s, strlen(s)); }

void chat_untrusted_json(chat_prompt *p, const cJSON *v) {
    size_t start = p->text.len;
    chat_json_py(&p->text, v);
    chat_untrusted_since(p, start);
}

void chat_prompt_free(chat_prompt *p) {
    sbuf_free(&p->text);
    free(p->untrusted);
    memset(p, 0, sizeof *p);
}

void chat_prompt_tail(const chat_prompt *p, size_t from, chat_prompt *out) {
    if (from >= p->text.len) return;
    for (int i = 0; i < p->nuntrusted; i++) {
        const tok_span *u = &p->untrusted[i];
        size_t start = MAX(u->start, from), end = u->start + u->len;
        if (end <= start) continue;
        sbuf_put(&out->text, p->text.p + from + out->text.len, start - from - out->text.len);
        chat_untrusted(out, p->text.p + start, end - start);
    }
    sbuf_put(&out->text, p->text.p + from + out->text.len, p->text.len - from - out->text.len);
}

int chat_prompt_encode(const tokenizer *t, const chat_prompt *p, int **ids, int *n, char *err, size_t errlen) {
    int cap = (int)p->text.len + 16;
    *ids = xmalloc((size_t)cap * sizeof **ids);
    const char *text = p->text.p ? p->text.p : "";
    int k = tok_encode_untrusted(t, text, p->text.len, p->untrusted, p->nuntrusted, *ids, cap, err, errlen);
    if (k > cap) {
        *ids = xrealloc(*ids, (size_t)k * sizeof **ids);
        k = tok_encode_untrusted(t, text, p->text.len, p->untrusted, p->nuntrusted, *ids, k, err, errlen);
    }
    if (k < 0) {
        free(*ids);
        *ids = NULL;
        return -1;
    }
    *n = k;
    return 0;
}

/* ---- Python-style JSON ----------------------------------------------------------------------- */

void chat_json_py_string(sbuf *b, const char *s) {
    sbuf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const char *esc = NULL;
        switch (*p) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        }
        if (esc) sbuf_puts(b, esc);
        else if (*p < 0x20) sbuf_printf(b, "\\u%04x", *p);
        else sbuf_put(b, (const char *)p, 1);
    }
    sbuf_put(b, "\"", 1);
}

/* A JSON string left open: the quote that would close it was never generated. */
static void json_open_string(sbuf *b, const char *s, size_t n) {
    char *z = xmalloc(n + 1);
    memcpy(z, s, n);
    z[n] = 0;
    chat_json_py_string(b, z);
    b->len--;
    b->p[b->len] = 0;
    free(z);
}

/* Can these bytes begin a JSON value (a family that writes values as JSON text)? */
static int json_value_start(const char *v, size_t n) {
    static const char *const words[] = {"true", "false", "null"};
    if (!n || strchr("\"{[-0123456789", v[0])) return 1;
    for (int i = 0; i < 3; i++)
        if (n <= strlen(words[i]) && !memcmp(v, words[i], n)) return 1;
    return 0;
}

const char *chat_find(const char *s, const char *end, const char *needle) {
    return s < end ? memmem(s, (size_t)(end - s), needle, strlen(needle)) : NULL;
}

size_t chat_cut_marker(const char *s, size_t n, const char *marker) {
    for (size_t k = strlen(marker) - 1; k >= 1; k--)
        if (k <= n && !memcmp(s + n - k, marker, k)) return n - k;
    return n;
}

char *chat_cut_arguments(const char *done, const char *item_sep, const char *key_sep, const char *key, int key_done,
                         const char *value, size_t value_n, int value_string) {
    sbuf b = {0};
    size_t n = strlen(done);
    sbuf_put(&b, done, n ? n - 1 : 0);   /* the '}' the model did not write */
    if (!n) sbuf_puts(&b, "{");
    if (key) {
        if (n > 2) sbuf_puts(&b, item_sep);
        json_open_string(&b, key, strlen(key));
        if (key_done) {
            sbuf_puts(&b, "\"");
            sbuf_puts(&b, key_sep);
        }
    }
    if (key && key_done && value) {
        while (value_n && (*value == ' ' || *value == '\n' || *value == '\t' || *value == '\r')) value++, value_n--;
        if (value_string || !json_value_start(value, value_n)) json_open_string(&b, value, value_n);
        else sbuf_put(&b, value, value_n);
    }
    return sbuf_take(&b);
}

/* cJSON keeps only a double: integral values print as integers, others in the shortest form
 * that reads back exactly (what Python's float repr prints). */
static void json_py_number(sbuf *b, double v) {
    char buf[40];
    if (v == floor(v) && fabs(v) < 1e15) snprintf(buf, sizeof buf, "%.0f", v);
    else
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, v);
            if (strtod(buf, NULL) == v) break;
        }
    sbuf_puts(b, buf);
}

/* One writer for both spacings; sort orders object keys by bytes (= Python's sorted() on code
 * points for UTF-8 keys). */
static void json_write(sbuf *b, const cJSON *v, const char *item_sep, const char *key_sep, int sort) {
    if (cJSON_IsString(v)) chat_json_py_string(b, v->valuestring);
    else if (cJSON_IsNumber(v)) json_py_number(b, v->valuedouble);
    else if (cJSON_IsTrue(v)) sbuf_puts(b, "true");
    else if (cJSON_IsFalse(v)) sbuf_puts(b, "false");
    else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        int obj = cJSON_IsObject(v), n = 0;
        for (const cJSON *e = v->child; e; e = e->next) n++;
        const cJSON **items = xmalloc((size_t)(n ? n : 1) * sizeof *items);
        n = 0;
        for (const cJSON *e = v->child; e; e = e->next) items[n++] = e;
        for (int i = 1; obj && sort && i < n; i++)      /* insertion sort: stable, small objects */
            for (int j = i; j > 0 && strcmp(items[j - 1]->string, items[j]->string) > 0; j--) {
                const cJSON *t = items[j];
                items[j] = items[j - 1];
                items[j - 1] = t;
            }
        sbuf_puts(b, obj ? "{" : "[");
        for (int i = 0; i < n; i++) {
            if (obj) {
                chat_json_py_string(b, items[i]->string);
                sbuf_puts(b, key_sep);
            }
            json_write(b, items[i], item_sep, key_sep, sort);
            if (i + 1 < n) sbuf_puts(b, item_sep);
        }
        sbuf_puts(b, obj ? "}" : "]");
        free(items);
    } else sbuf_puts(b, "null");
}

void chat_json_py(sbuf *b, const cJSON *v) { json_write(b, v, ", ", ": ", 0); }

void chat_json_compact(sbuf *b, const cJSON *v, int sort_keys) { json_write(b, v, ",", ":", sort_keys); }

int chat_content_walk(const cJSON *content, int idx, const chat_content_rule *rule, char *err, size_t errlen) {
    if (!content || cJSON_IsNull(content)) return 0;
    if (cJSON_IsString(content)) {
        rule->text(rule->ctx, content->valuestring, 0);
        return 0;
    }
    if (!cJSON_IsArray(content))
        return errf(err, errlen, "messages[%d].content must be a string or an array of content parts", idx);
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "text") && cJSON_IsString(text))
            rule->text(rule->ctx, text->valuestring, 1);
        else if (rule->other(rule->ctx, part, idx, err, errlen))
            return -1;
    }
    return 0;
}

cJSON *chat_tool_call(const char *name, const char *arguments_json, const char *text, size_t n, int k) {
    char id[40];
    uint64_t h = fnv64(FNV64_INIT, text, n);
    snprintf(id, sizeof id, "call_%016llx%08x", (unsigned long long)h, (unsigned)(fnv64(h, &k, sizeof k) & 0xffffffffu));
    cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    cJSON_AddStringToObject(call, "id", id);
    cJSON_AddStringToObject(call, "type", "function");
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddStringToObject(fn, "arguments", arguments_json);
    cJSON_AddItemToObject(call, "function", fn);
    return call;
}
