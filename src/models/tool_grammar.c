/* tool_grammar.c — grammars that force tool calls in a family's own syntax (chat.h tool_syntax).
 *
 * One rule per callable function: its syntax around the name, then its arguments in the order
 * `parameters.properties` declares them, required ones always, optional ones optionally (the
 * same L/R chain json_schema.c uses for objects: L_i = arguments i.. with none written yet,
 * R_i = the same after one was, so separators only go between arguments). Undeclared arguments
 * are never generated; each value is JSON text compiled from its property schema.
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
    int n = 0, cap_n = cJSON_GetArraySize(props) + cJSON_GetArraySize(req) + 1;
    const char **keys = xcalloc((size_t)cap_n, sizeof *keys);
    const cJSON **schemas = xcalloc((size_t)cap_n, sizeof *schemas);
    cJSON *any = cJSON_CreateTrue();
    const cJSON *x;
    cJSON_ArrayForEach(x, props) { keys[n] = x->string; schemas[n++] = x; }
    cJSON_ArrayForEach(x, req) {
        if (!cJSON_IsString(x)) continue;
        int declared = 0;
        for (int i = 0; i < n; i++) declared |= !strcmp(keys[i], x->valuestring);
        if (!declared) { keys[n] = x->valuestring; schemas[n++] = any; }
    }
    int rc = 0;
    if (n) {
        sbuf_printf(g, "%s-L%d ::= \"\"\n%s-R%d ::= \"\"\n", base, n, base, n);
        snprintf(first, cap, "%s-L0", base);
    }
    for (int i = n - 1; i >= 0 && !rc; i--) {
        char vname[128];
        snprintf(vname, sizeof vname, "%s-v%d", base, i);
        if ((rc = json_schema_rules(params, schemas[i], vname, g, err, errlen))) break;
        sbuf arg = {0};
        sbuf_printf(&arg, "%s ", sx->arg_open);
        if (gbnf_literal(&arg, keys[i])) rc = errf(err, errlen, "an argument name is not valid UTF-8");
        sbuf_printf(&arg, " %s %s %s", sx->arg_mid, vname, sx->arg_close);
        int opt = !is_required(req, keys[i]) && schemas[i] != any;
        sbuf_printf(g, "%s-L%d ::= %s %s-R%d", base, i, arg.p, base, i + 1);
        if (opt) sbuf_printf(g, " | %s-L%d", base, i + 1);
        sbuf_printf(g, "\n%s-R%d ::= %s %s %s-R%d", base, i, sx->arg_sep, arg.p, base, i + 1);
        if (opt) sbuf_printf(g, " | %s-R%d", base, i + 1);
        sbuf_puts(g, "\n");
        sbuf_free(&arg);
    }
    cJSON_Delete(any);
    free(keys);
    free(schemas);
    return rc;
}

int chat_tool_grammar(const chat_template *t, const cJSON *tools, const char *choice, int parallel, int thinking,
                      const char *content, sbuf *out, char *err, size_t errlen) {
    const tool_syntax *sx = t ? t->tools : NULL;
    if (!sx) return errf(err, errlen, "this model's chat template has no tool-call syntax to force");
    int any = !strcmp(choice, "required") || !strcmp(choice, "auto");
    sbuf g = {0}, alts = {0};
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
        sbuf_printf(&g, "%s ::= %s ", base, sx->call_open);
        if (gbnf_literal(&g, name->valuestring)) { rc = errf(err, errlen, "tools[%d]: the name is not valid UTF-8", i); break; }
        sbuf_printf(&g, " %s %s %s\n", sx->call_mid, first, sx->call_close);
        sbuf_printf(&alts, "%s%s", n++ ? " | " : "", base);
        i++;
    }
    if (!rc && !n) rc = errf(err, errlen, "no tool named '%s' in 'tools'", choice);
    if (!rc) {
        sbuf_printf(&g, "call ::= %s\n", alts.p);
        sbuf_printf(&g, "calls ::= %s call %s %s\n", sx->block_open, parallel ? "calls-more" : "", sx->block_close);
        if (parallel) sbuf_printf(&g, "calls-more ::= %s call calls-more | \"\"\n", sx->call_sep);
        sbuf root = {0};
        if (thinking) {
            rc |= gbnf_text_without(&g, "reasoning", sx->think_end);
            sbuf_puts(&root, "reasoning ");
            rc |= gbnf_literal(&root, sx->think_end);
        }
        if (!strcmp(choice, "auto") && content) {
            sbuf_printf(&root, " (%s | calls)", content);
        } else if (!strcmp(choice, "auto")) {
            rc |= gbnf_text_without(&g, "text", sx->calls_start);
            sbuf_puts(&root, " text (calls)?");
        } else {
            sbuf_puts(&root, " calls");
        }
        if (rc) rc = errf(err, errlen, "the tool-call syntax is not valid UTF-8");
        else sbuf_printf(out, "root ::= %s\n%s", root.p, g.p);
        sbuf_free(&root);
    }
    sbuf_free(&g);
    sbuf_free(&alts);
    return rc;
}
