/* tool_grammar.c — grammars that force tool calls in a family's own syntax (chat.h tool_syntax).
 *
 * One rule per callable function: its syntax around the name, then its arguments in the order
 * `parameters.properties` declares them (or sorted by key, where the family's template sorts
 * them), required ones always, optional ones optionally (the same L/R chain json_schema.c uses
 * for objects: L_i = arguments i.. with none written yet, R_i = the same after one was, so
 * separators only go between arguments). Undeclared arguments are never generated; each value is
 * compiled from its property schema (JSON text, or tagged with its type where the family writes
 * one). A family whose calls carry their index gets one head per index, so the indexes a reply
 * writes are exactly those its template renders back (the next turn's prompt repeats the reply).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/grammar.h"
#include "../core/json_schema.h"
#include "../core/util.h"
#include "chat.h"

static const char *const params_keys[] = {"type", "properties", "required", "additionalProperties", "$defs",
                                          "definitions", "title", "description", "$schema", "$id", "$comment",
                                          "strict", NULL};

/* An optional syntax field as GBNF: NULL or "" is the empty literal. */
static const char *opt(const char *s) { return s && *s ? s : "\"\""; }

static int is_listed(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k)) return 1;
    return 0;
}

static int is_required(const cJSON *req, const char *key) {
    const cJSON *r;
    cJSON_ArrayForEach(r, req) if (cJSON_IsString(r) && !strcmp(r->valuestring, key)) return 1;
    return 0;
}

/* A function or argument name as the family spells it, as one GBNF literal. */
static int put_name(sbuf *g, int spelling, const char *name) {
    sbuf text = {0};
    if (spelling == NAME_JSON) chat_json_py_string(&text, name);
    for (const char *c = name; spelling == NAME_ATTR && *c; c++) {
        if (*c == '&') sbuf_puts(&text, "&amp;");
        else if (*c == '"') sbuf_puts(&text, "&quot;");
        else sbuf_put(&text, c, 1);
    }
    int rc = gbnf_literal(g, spelling == NAME_RAW ? name : text.p ? text.p : "");
    sbuf_free(&text);
    return rc;
}

typedef struct {
    const char *key;
    const cJSON *schema;
} arg;

static int cmp_arg(const void *a, const void *b) { return strcmp(((const arg *)a)->key, ((const arg *)b)->key); }

/* Rules for one function's arguments; *first gets the rule that starts them ("" = no arguments). */
static int args_rules(const tool_syntax *sx, const cJSON *params, const char *base, sbuf *g, char *first,
                      size_t cap, char *err, size_t errlen) {
    *first = 0;
    if (!params || cJSON_IsNull(params)) return 0;
    if (!cJSON_IsObject(params)) return errf(err, errlen, "'parameters' must be a JSON Schema object");
    const cJSON *k;
    cJSON_ArrayForEach(k, params)
        if (!is_listed(params_keys, k->string))
            return errf(err, errlen, "schema: unsupported keyword '%s' in 'parameters'", k->string);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(params, "type");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(params, "required");
    if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "object")))
        return errf(err, errlen, "'parameters' must have type object");
    if ((props && !cJSON_IsObject(props)) || (req && !cJSON_IsArray(req)))
        return errf(err, errlen, "'parameters': properties must be an object and required an array");
    /* declared properties in order, then required names nobody declared (any value) */
    int n = 0;
    arg *args = xcalloc((size_t)(cJSON_GetArraySize(props) + cJSON_GetArraySize(req) + 1), sizeof *args);
    cJSON *any = cJSON_CreateTrue();
    const cJSON *x;
    cJSON_ArrayForEach(x, props) args[n++] = (arg){x->string, x};
    cJSON_ArrayForEach(x, req) {
        if (!cJSON_IsString(x)) continue;
        int declared = 0;
        for (int i = 0; i < n; i++) declared |= !strcmp(args[i].key, x->valuestring);
        if (!declared) args[n++] = (arg){x->valuestring, any};
    }
    if (sx->sorted_args) qsort(args, (size_t)n, sizeof *args, cmp_arg);
    int rc = 0;
    if (n) {
        sbuf_printf(g, "%s-L%d ::= \"\"\n%s-R%d ::= \"\"\n", base, n, base, n);
        snprintf(first, cap, "%s-L0", base);
    }
    for (int i = n - 1; i >= 0 && !rc; i--) {
        char vname[128];
        snprintf(vname, sizeof vname, "%s-v%d", base, i);
        rc = sx->arg_type ? json_schema_tagged_rules(params, args[i].schema, vname, sx->arg_type, g, err, errlen)
                          : json_schema_rules(params, args[i].schema, vname, g, err, errlen);
        if (rc) break;
        sbuf a = {0};
        sbuf_printf(&a, "%s ", opt(sx->arg_open));
        if (put_name(&a, sx->key_spelling, args[i].key)) rc = errf(err, errlen, "an argument name is not valid UTF-8");
        sbuf_printf(&a, " %s %s %s", opt(sx->arg_mid), vname, opt(sx->arg_close));
        int optional = !is_required(req, args[i].key) && args[i].schema != any;
        sbuf_printf(g, "%s-L%d ::= %s %s-R%d", base, i, a.p, base, i + 1);
        if (optional) sbuf_printf(g, " | %s-L%d", base, i + 1);
        sbuf_printf(g, "\n%s-R%d ::= %s %s %s-R%d", base, i, opt(sx->arg_sep), a.p, base, i + 1);
        if (optional) sbuf_printf(g, " | %s-R%d", base, i + 1);
        sbuf_puts(g, "\n");
        sbuf_free(&a);
    }
    cJSON_Delete(any);
    free(args);
    return rc;
}

/* Rule base-hK: the whole call of this function as the K-th call of the reply. */
static int call_rule(const tool_syntax *sx, const char *base, const char *name, const char *args, int k, sbuf *g) {
    int rc = 0;
    sbuf_printf(g, "%s-h%d ::= %s ", base, k, opt(sx->call_open));
    rc |= put_name(g, sx->name_spelling, name);
    if (sx->call_index) {
        sbuf_puts(g, " ");
        sbuf_printf(g, sx->call_index, k);
    }
    sbuf_printf(g, " %s ", opt(sx->call_mid));
    if (sx->call_name_json) {
        rc |= put_name(g, NAME_JSON, name);
        sbuf_printf(g, " %s", sx->call_name_json);
    }
    sbuf_printf(g, " %s %s\n", args, opt(sx->call_close));
    return rc;
}

int chat_think_rules(const tool_syntax *sx, sbuf *g, sbuf *root) {
    int rc = gbnf_text_without(g, "reasoning", sx->think_end);
    sbuf_printf(root, "%s reasoning ", opt(sx->think_open));
    if (sx->think_close && *sx->think_close) sbuf_puts(root, sx->think_close);
    else rc |= gbnf_literal(root, sx->think_end);
    sbuf_puts(root, " ");
    return rc;
}

int chat_tool_grammar(const chat_template *t, const cJSON *tools, const char *choice, int parallel, int thinking,
                      const char *content, sbuf *out, char *err, size_t errlen) {
    const tool_syntax *sx = t ? t->tools : NULL;
    if (!sx) return errf(err, errlen, "this model's chat template has no tool-call syntax to force");
    int any = !strcmp(choice, "required") || !strcmp(choice, "auto");
    /* one head per call index when calls carry one, else one head for every call */
    int most = sx->max_calls ? sx->max_calls : TOOL_CALLS_MAX;
    int heads = sx->call_index && parallel ? most : 1;
    sbuf g = {0}, alts[TOOL_CALLS_MAX] = {{0}};
    int i = 0, n = 0, rc = 0;
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(name) || (!any && strcmp(name->valuestring, choice))) { i++; continue; }
        char base[32], first[64], e2[300];
        snprintf(base, sizeof base, "tool%d", i);
        if (args_rules(sx, cJSON_GetObjectItemCaseSensitive(fn, "parameters"), base, &g, first, sizeof first, e2,
                       sizeof e2)) {
            rc = errf(err, errlen, "tools[%d] (%s): %s", i, name->valuestring, e2);
            break;
        }
        for (int k = 1; k <= heads && !rc; k++) {
            if (call_rule(sx, base, name->valuestring, first, k, &g)) rc = errf(err, errlen, "tools[%d]: the name is not valid UTF-8", i);
            sbuf_printf(&alts[k - 1], "%s%s-h%d", n ? " | " : "", base, k);
        }
        n++;
        i++;
    }
    if (!rc && !n) rc = errf(err, errlen, "no tool named '%s' in 'tools'", choice);
    if (!rc) {
        for (int k = 1; k <= heads; k++) sbuf_printf(&g, "call-%d ::= %s\n", k, alts[k - 1].p);
        if (!parallel) sbuf_printf(&g, "calls ::= %s call-1 %s\n", opt(sx->block_open), opt(sx->block_close));
        else if (heads == 1)
            sbuf_printf(&g, "calls ::= %s call-1 calls-more %s\ncalls-more ::= (%s call-1){0,%d}\n", opt(sx->block_open),
                        opt(sx->block_close), opt(sx->call_sep), most - 1);
        else {
            sbuf_printf(&g, "calls ::= %s call-1 calls-more-2 %s\ncalls-more-%d ::= \"\"\n", opt(sx->block_open),
                        opt(sx->block_close), heads + 1);
            for (int k = 2; k <= heads; k++)
                sbuf_printf(&g, "calls-more-%d ::= %s call-%d calls-more-%d | \"\"\n", k, opt(sx->call_sep), k, k + 1);
        }
        sbuf root = {0};
        if (thinking) rc |= chat_think_rules(sx, &g, &root);
        const char *open = opt(sx->text_open);
        int block = sx->text_open && *sx->text_open;
        if (!strcmp(choice, "auto") && content) {
            sbuf_printf(&root, "(%s %s %s | calls)", open, content, opt(sx->text_close));
        } else if (!strcmp(choice, "auto")) {
            rc |= gbnf_text_without(&g, "text", sx->calls_start);
            sbuf_printf(&root, "(%s text (%s | %s calls)%s)", open, opt(sx->text_close), opt(sx->text_calls),
                        block ? " | calls" : "");
        } else {
            sbuf_puts(&root, "calls");
        }
        if (rc) rc = errf(err, errlen, "the tool-call syntax is not valid UTF-8");
        else sbuf_printf(out, "root ::= %s\n%s", root.p, g.p);
        sbuf_free(&root);
    }
    sbuf_free(&g);
    for (int k = 0; k < TOOL_CALLS_MAX; k++) sbuf_free(&alts[k]);
    return rc;
}
