/* test_tool_grammar.c — forced tool-call grammars, for every registered family with a tool-call
 * syntax: random sentences of the grammar (a seeded walk over the bytes it allows) must parse back
 * through the family's OWN reply parser as tool calls of the allowed functions whose arguments
 * are JSON objects with the required keys; exactly one call when parallel calls are off;
 * reasoning first in thinking mode, never containing the text that ends it. A reply cut at any
 * byte (max_tokens) parses to the calls before the cut unchanged and a last one marked cut whose
 * arguments are the ones written so far, never completed or made up (chat_cut_arguments). */
#include <stdlib.h>
#include <string.h>

#include "core/grammar.h"
#include "models/model.h"
#include "test.h"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\",\"maxLength\":5},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7}},"
    "\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ping\"}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"xs\":{\"type\":\"array\",\"items\":{\"enum\":[1,2]},\"maxItems\":2}},\"required\":[\"xs\"]}}}]";

static uint64_t next_rand(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A random sentence of g that starts with prefix: after it, uniform over the allowed bytes,
 * stopping at a complete sentence with probability 1/4 (always when nothing can follow). -1 if g
 * rejects the prefix or the sentence does not end within the budget. (Free text — reasoning, auto
 * content — rarely ends by chance, so tests hand the walk a prefix that ends it.) */
static int sample(const grammar *g, uint64_t *rng, const char *prefix, sbuf *out) {
    gm *m = gm_new(g);
    int rc = -1;
    if (gm_feed(m, prefix, strlen(prefix))) {
        gm_free(m);
        return -1;
    }
    sbuf_puts(out, prefix);
    for (int step = 0; step < 20000; step++) {
        int s = gm_state(m);
        if (gm_accepting(m, s) && (!gm_can_continue(m, s) || next_rand(rng) % 4 == 0)) { rc = 0; break; }
        unsigned char ok[256];
        int n = 0;
        for (int b = 0; b < 256; b++)
            if (gm_next(m, s, (unsigned char)b) != GM_DEAD) ok[n++] = (unsigned char)b;
        if (!n) break;
        unsigned char b = ok[next_rand(rng) % (uint64_t)n];
        gm_feed(m, &b, 1);
        sbuf_put(out, (const char *)&b, 1);
    }
    gm_free(m);
    return rc;
}

/* The text a syntax field spells (a sequence of GBNF literals, chat.h tool_syntax), appended. */
static void spelled(sbuf *out, const char *gbnf) {
    for (const char *p = gbnf; p && *p; p++) {
        if (*p != '"') continue;
        for (p++; *p && *p != '"'; p++) {
            char c = *p;
            if (c == '\\') c = *++p == 'n' ? '\n' : *p == 't' ? '\t' : *p;
            sbuf_put(out, &c, 1);
        }
    }
}

/* The reasoning of a thinking reply, closed as the syntax closes it. */
static void reasoning(sbuf *out, const tool_syntax *sx, const char *text) {
    spelled(out, sx->think_open);
    sbuf_puts(out, text);
    if (sx->think_close && *sx->think_close) spelled(out, sx->think_close);
    else sbuf_puts(out, sx->think_end);
}

static grammar *tool_grammar(const chat_template *t, const cJSON *tools, const char *choice, int parallel, int thinking) {
    sbuf g = {0};
    char err[400];
    grammar *gr = NULL;
    if (chat_tool_grammar(t, tools, choice, parallel, thinking, NULL, &g, err, sizeof err)) printf("tool grammar: %s\n", err);
    else if (!(gr = grammar_parse(g.p, g.len, err, sizeof err))) printf("tool grammar does not parse: %s\n%s\n", err, g.p);
    sbuf_free(&g);
    return gr;
}

/* Every call: an allowed name, arguments a JSON object holding the function's required keys. */
static int calls_ok(const cJSON *calls, const char *only, int *ncalls) {
    *ncalls = cJSON_GetArraySize(calls);
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "name"));
        cJSON *args = cJSON_Parse(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "arguments")));
        int ok = name && cJSON_IsObject(args) && (!only || !strcmp(name, only));
        if (ok && !strcmp(name, "weather")) {
            const cJSON *city = cJSON_GetObjectItemCaseSensitive(args, "city");
            const cJSON *days = cJSON_GetObjectItemCaseSensitive(args, "days");
            ok = cJSON_IsString(city) && strlen(city->valuestring) <= 5 * 4 && (!days || cJSON_IsNumber(days));
        } else if (ok && !strcmp(name, "add")) {
            ok = cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(args, "xs"));
        } else if (ok) {
            ok = !strcmp(name, "ping") && cJSON_GetArraySize(args) == 0;
        }
        cJSON_Delete(args);
        if (!ok) return 0;
    }
    return 1;
}

static const char *call_field(const cJSON *calls, int i, const char *key) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, i), "function"), key));
}

static int starts_with(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

/* Cut reply text[0..n) (which parses to complete calls) at every byte. strict: the last call's
 * arguments must be a prefix of the whole call's (values whose JSON text the parser keeps as
 * written); otherwise they either do not parse or are the whole call's arguments. 0 = all good. */
static int check_cuts(const family_ops *f, const char *text, size_t n, int strict) {
    chat_reply whole;
    f->chat->parse(text, n, 0, &whole);
    int calls = cJSON_GetArraySize(whole.tool_calls), bad = whole.cut_call || !calls;
    for (size_t i = 0; i < n && !bad; i++) {
        chat_reply r;
        f->chat->parse(text, i, 0, &r);
        int k = r.tool_calls ? cJSON_GetArraySize(r.tool_calls) : 0;
        bad = k > calls;
        for (int j = 0; j < k && !bad; j++) {
            const char *name = call_field(r.tool_calls, j, "name"), *args = call_field(r.tool_calls, j, "arguments");
            const char *full_name = call_field(whole.tool_calls, j, "name"), *full = call_field(whole.tool_calls, j, "arguments");
            int same = !strcmp(name, full_name) && !strcmp(args, full);
            if (j < k - 1) { bad = !same; continue; }
            cJSON *a = cJSON_Parse(args), *b = cJSON_Parse(full);
            bad = !starts_with(full_name, name) || (!same && !r.cut_call) ||
                  (strict ? !starts_with(full, args) : a && !cJSON_Compare(a, b, 1));
            cJSON_Delete(a);
            cJSON_Delete(b);
        }
        if (bad) printf("%s: reply cut after %zu bytes: %s\n  -> %s (cut_call %d)\n", f->name, i, text,
                        r.tool_calls ? cJSON_PrintUnformatted(r.tool_calls) : "no calls", r.cut_call);
        chat_reply_free(&r);
    }
    chat_reply_free(&whole);
    return bad;
}

static void check_family(const family_ops *f, const cJSON *tools) {
    const chat_template *t = f->chat;
    struct { const char *choice; int parallel, thinking; } modes[] = {
        {"required", 1, 0}, {"required", 0, 0}, {"add", 1, 0}, {"weather", 0, 1}, {"auto", 0, 0}, {"auto", 0, 1},
    };
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        grammar *g = tool_grammar(t, tools, modes[k].choice, modes[k].parallel, modes[k].thinking);
        CHECK(g != NULL, "%s: %s grammar", f->name, modes[k].choice);
        if (!g) continue;
        int forced = strcmp(modes[k].choice, "auto") != 0;
        const char *only = forced && strcmp(modes[k].choice, "required") ? modes[k].choice : NULL;
        grammar *one = tool_grammar(t, tools, "required", 0, 0);
        sbuf think = {0};
        if (modes[k].thinking) reasoning(&think, t->tools, "I think");
        int bad = 0, multi = 0, with_calls = 0;
        uint64_t rng = 0x9E3779B97F4A7C15ULL + k;
        for (int i = 0; i < 200 && !bad; i++) {
            sbuf s = {0}, prefix = {0}, call = {0};
            sbuf_puts(&prefix, think.p ? think.p : "");
            if (!forced) {   /* content, closed or followed by one call as the forced grammar writes it */
                spelled(&prefix, t->tools->text_open);
                sbuf_puts(&prefix, "Hi");
                spelled(&prefix, i % 2 ? t->tools->text_calls : t->tools->text_close);
            }
            if (!forced && i % 2) {
                if (sample(one, &rng, "", &call)) bad = 1;
                else sbuf_puts(&prefix, call.p);
            }
            if (sample(g, &rng, prefix.p, &s)) { printf("%s: sample %d rejected or unended: %s\n", f->name, i, s.p); bad = 1; }
            sbuf_free(&prefix);
            sbuf_free(&call);
            if (bad) { sbuf_free(&s); break; }
            chat_reply r;
            t->parse(s.p ? s.p : "", s.len, modes[k].thinking, &r);
            int n = 0;
            if ((forced && !r.tool_calls) || (r.tool_calls && !calls_ok(r.tool_calls, only, &n))) {
                printf("%s %s: bad reply: %s\n", f->name, modes[k].choice, s.p);
                bad = 1;
            }
            if (modes[k].thinking && r.reasoning && strstr(r.reasoning, t->tools->think_end)) bad = 1;
            if (r.content && strstr(r.content, t->tools->calls_start)) bad = 1;
            if (!bad && forced && !modes[k].thinking && i < 20 && check_cuts(f, s.p, s.len, 0)) bad = 1;
            multi |= n > 1;
            with_calls += n > 0;
            chat_reply_free(&r);
            sbuf_free(&s);
        }
        CHECK(!bad, "%s %s parallel=%d thinking=%d: every sentence parses as valid calls", f->name, modes[k].choice,
              modes[k].parallel, modes[k].thinking);
        CHECK(!multi || modes[k].parallel, "%s %s: one call when parallel calls are off", f->name, modes[k].choice);
        CHECK(!modes[k].parallel || multi, "%s %s: parallel grammars do produce several calls", f->name, modes[k].choice);
        CHECK(forced || with_calls > 0, "%s auto: some sentences call a tool", f->name);
        grammar_free(g);
        grammar_free(one);
        sbuf_free(&think);
    }
    if (t->example) {
        const char *reply = t->example->reply;
        CHECK(!check_cuts(f, reply, strlen(reply), 1), "%s: the example call cut anywhere keeps what was written", f->name);
    }
    /* reasoning cannot contain its own end marker: after it the calls must begin */
    grammar *g = tool_grammar(t, tools, "required", 1, 1);
    gm *m = gm_new(g);
    sbuf text = {0};
    reasoning(&text, t->tools, "hm");
    CHECK(gm_feed(m, text.p, text.len) == 0, "%s: reasoning closed as the syntax closes it", f->name);
    CHECK(gm_feed(m, "x", 1) == -1, "%s: text after the end of reasoning must be a call", f->name);
    sbuf_free(&text);
    gm_free(m);
    grammar_free(g);
}

int main(void) {
    cJSON *tools = cJSON_Parse(TOOLS);
    int families = 0;
    for (int i = 0; family_at(i); i++) {
        const family_ops *f = family_at(i);
        if (!f->chat || !f->chat->tools) continue;
        families++;
        check_family(f, tools);
    }
    CHECK(families > 0, "no family has a tool-call syntax");
    char err[200];
    sbuf g = {0};
    CHECK(chat_tool_grammar(family_at(0)->chat, tools, "nope", 1, 0, NULL, &g, err, sizeof err) == -1 && strstr(err, "'nope'"),
          "unknown forced name: %s", err);
    cJSON *bad = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                             "\"properties\":{\"a\":{\"if\":{}}}}}}]");
    CHECK(chat_tool_grammar(family_at(0)->chat, bad, "required", 1, 0, NULL, &g, err, sizeof err) == -1 && strstr(err, "'if'") &&
              strstr(err, "tools[0] (f)"),
          "unsupported keyword names the tool: %s", err);
    sbuf_free(&g);
    cJSON_Delete(bad);
    cJSON_Delete(tools);
    return TEST_END();
}
