/* constrain.c — request fields -> the GBNF grammar of a constrained turn (see constrain.h). */
#include "constrain.h"

#include <stdlib.h>
#include <string.h>

#include "../core/grammar.h"
#include "../core/json_schema.h"
#include "../core/util.h"

static int bad(http_err *e, const char *field, const char *msg, const char *detail) {
    return http_err_set(e, 400, "invalid_request_error", "invalid_value", field, "%s%s", msg, detail);
}

static int valid_schema_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
            return 0;
    return 1;
}

/* response_format as a JSON Schema to answer with (heap), NULL for none; -1 + e when malformed. */
static int response_schema(const cJSON *body, cJSON **out, http_err *e) {
    *out = NULL;
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(body, "response_format");
    if (!rf || cJSON_IsNull(rf)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
        return bad(e, "response_format", "'response_format' must be {type: text | json_object | json_schema}", "");
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) {
        *out = cJSON_CreateObject();
        cJSON_AddStringToObject(*out, "type", "object");
        return 0;
    }
    if (strcmp(t, "json_schema"))
        return bad(e, "response_format", "'response_format.type' must be text, json_object or json_schema, not ", t);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!cJSON_IsObject(js)) return bad(e, "response_format", "'response_format.json_schema' must be an object", "");
    if (!cJSON_IsString(name) || !valid_schema_name(name->valuestring))
        return bad(e, "response_format", "'response_format.json_schema.name' must be 1-64 characters of a-z, A-Z, 0-9, _ and -", "");
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        return bad(e, "response_format", "'response_format.json_schema.strict' must be a boolean", "");
    if (s && !cJSON_IsNull(s) && !cJSON_IsObject(s) && !cJSON_IsBool(s))
        return bad(e, "response_format", "'response_format.json_schema.schema' must be a JSON Schema object", "");
    *out = s && !cJSON_IsNull(s) ? cJSON_Duplicate(s, 1) : cJSON_CreateTrue();
    return 0;
}

static int any_strict(const cJSON *tools) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "strict"))) return 1;
    }
    return 0;
}

/* The grammar for o's tool calls (content = a rule for the non-call answer, NULL = free text),
 * appended to g; 0 also when the tools need no grammar (*used = 0). */
static int tool_rules(const serve_ctx *sc, const constrain_opts *o, const char *content, sbuf *g, int *used,
                      http_err *e) {
    const char *choice = o->tool_choice ? o->tool_choice : "auto";
    *used = 0;
    if (!o->tools || !cJSON_GetArraySize(o->tools) || !strcmp(choice, "none")) return 0;
    int forced = strcmp(choice, "auto") != 0;
    if (!forced && !content && o->parallel && !any_strict(o->tools)) return 0;
    char err[400];
    if (chat_tool_grammar(sc->tpl, o->tools, choice, o->parallel, o->thinking, forced ? NULL : content, g, err, sizeof err))
        return bad(e, "tools", "cannot constrain tool calls: ", err);
    *used = 1;
    return 0;
}

/* The root of a reply that is the schema's JSON; in thinking mode the reasoning comes first (the
 * template's parser reads everything before the end-of-reasoning text as reasoning). */
static int answer_root(const serve_ctx *sc, int thinking, sbuf *g, http_err *e) {
    if (!thinking) {
        sbuf_puts(g, "root ::= answer\n");
        return 0;
    }
    const tool_syntax *sx = sc->tpl ? sc->tpl->tools : NULL;
    if (!sx) return bad(e, "response_format", "this model's template does not say how reasoning ends", "");
    sbuf root = {0};
    chat_think_rules(sx, g, &root);
    sbuf_printf(g, "root ::= %s %s answer\n", root.p, sx->text_open && *sx->text_open ? sx->text_open : "");
    sbuf_free(&root);
    return 0;
}

int constrain_request(const serve_ctx *sc, const cJSON *body, const constrain_opts *o, turn_req *rq, http_err *e) {
    const cJSON *raw = cJSON_GetObjectItemCaseSensitive(body, "grammar");
    if (raw && cJSON_IsNull(raw)) raw = NULL;
    if (raw && (!cJSON_IsString(raw) || !*raw->valuestring))
        return bad(e, "grammar", "'grammar' must be a non-empty GBNF string", "");
    cJSON *schema = NULL;
    if (o->response_format && response_schema(body, &schema, e)) return -1;
    sbuf g = {0};
    int rc = 0, tools_used = 0;
    const char *field = raw ? "grammar" : schema ? "response_format" : "tool_choice";
    if (raw) {
        if (schema) rc = bad(e, "response_format", "'response_format' cannot be combined with 'grammar'", "");
        else if (!(rc = tool_rules(sc, o, NULL, &g, &tools_used, e)) && tools_used)
            rc = bad(e, "grammar", "'grammar' cannot be combined with constrained tool calls", "");
        else sbuf_puts(&g, raw->valuestring);
    } else {
        char err[400];
        if (schema && json_schema_rules(schema, schema, "answer", &g, err, sizeof err))
            rc = bad(e, "response_format", "'response_format': ", err);
        if (!rc) rc = tool_rules(sc, o, schema ? "answer" : NULL, &g, &tools_used, e);
        if (!rc && schema && !tools_used) rc = answer_root(sc, o->thinking, &g, e);
    }
    cJSON_Delete(schema);
    if (rc || !g.len) {
        sbuf_free(&g);
        return rc;
    }
    /* parse it once here: a 400 beats an engine error */
    char err[300];
    grammar *parsed = memchr(g.p, 0, g.len) ? NULL : grammar_parse(g.p, g.len, err, sizeof err);
    if (!parsed) {
        if (memchr(g.p, 0, g.len)) snprintf(err, sizeof err, "contains a NUL byte");
        sbuf_free(&g);
        return bad(e, field, raw ? "'grammar': " : "the generated grammar does not compile: ", err);
    }
    grammar_free(parsed);
    rq->grammar_len = g.len;
    rq->grammar = sbuf_take(&g);
    return 0;
}
