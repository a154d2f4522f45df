/* constrain.c — request fields -> the GBNF grammar of a constrained turn (see constrain.h). */
#include "constrain.h"

#include <stdlib.h>
#include <string.h>

#include "../core/grammar.h"
#include "../core/json_schema.h"
#include "../core/util.h"

/* Parse the grammar once here (a 400 beats an engine error), then hand it to the request. */
static int set_grammar(turn_req *rq, const char *field, sbuf *g, http_err *e) {
    if (rq->grammar) {
        int rc = http_err_set(e, 400, "invalid_request_error", "invalid_value", field,
                              "'%s' cannot be combined with '%s': a request takes one constraint", field, rq->grammar_field);
        sbuf_free(g);
        return rc;
    }
    char err[300];
    if (memchr(g->p, 0, g->len)) {
        sbuf_free(g);
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", field, "'%s' contains a NUL byte", field);
    }
    grammar *parsed = grammar_parse(g->p, g->len, err, sizeof err);
    if (!parsed) {
        sbuf_free(g);
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", field, "'%s': %s", field, err);
    }
    grammar_free(parsed);
    rq->grammar_len = g->len;
    rq->grammar = sbuf_take(g);
    rq->grammar_field = field;
    return 0;
}

int constrain_grammar(const cJSON *body, turn_req *rq, http_err *e) {
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(body, "grammar");
    if (!g || cJSON_IsNull(g)) return 0;
    if (!cJSON_IsString(g) || !*g->valuestring)
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "grammar", "'grammar' must be a non-empty GBNF string");
    sbuf b = {0};
    sbuf_puts(&b, g->valuestring);
    return set_grammar(rq, "grammar", &b, e);
}

static int valid_schema_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
            return 0;
    return 1;
}

static int bad_format(http_err *e, const char *msg, const char *detail) {
    return http_err_set(e, 400, "invalid_request_error", "invalid_value", "response_format", "%s%s", msg, detail);
}

int constrain_response_format(const cJSON *body, turn_req *rq, http_err *e) {
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(body, "response_format");
    if (!rf || cJSON_IsNull(rf)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
        return bad_format(e, "'response_format' must be {type: text | json_object | json_schema}", "");
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) return 0;
    cJSON *schema = NULL;
    if (!strcmp(t, "json_object")) {
        schema = cJSON_CreateObject();
        cJSON_AddStringToObject(schema, "type", "object");
    } else if (!strcmp(t, "json_schema")) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(js, "schema");
        if (!cJSON_IsObject(js)) return bad_format(e, "'response_format.json_schema' must be an object", "");
        if (!cJSON_IsString(name) || !valid_schema_name(name->valuestring))
            return bad_format(e, "'response_format.json_schema.name' must be 1-64 characters of a-z, A-Z, 0-9, _ and -", "");
        if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
            return bad_format(e, "'response_format.json_schema.strict' must be a boolean", "");
        if (s && !cJSON_IsNull(s) && !cJSON_IsObject(s) && !cJSON_IsBool(s))
            return bad_format(e, "'response_format.json_schema.schema' must be a JSON Schema object", "");
        schema = s && !cJSON_IsNull(s) ? cJSON_Duplicate(s, 1) : cJSON_CreateTrue();
    } else {
        return bad_format(e, "'response_format.type' must be text, json_object or json_schema, not ", t);
    }
    sbuf g = {0};
    char err[400];
    int rc = json_schema_rules(schema, schema, "root", &g, err, sizeof err);
    cJSON_Delete(schema);
    if (rc) {
        sbuf_free(&g);
        return bad_format(e, "'response_format': ", err);
    }
    return set_grammar(rq, "response_format", &g, e);
}

int constrain_tools(const serve_ctx *sc, const cJSON *tools, const char *choice, int parallel, int thinking,
                    const char *param, turn_req *rq, http_err *e) {
    if (!tools || !cJSON_GetArraySize(tools)) return 0;
    if (!choice) choice = "auto";
    if (!strcmp(choice, "none") || (!strcmp(choice, "auto") && parallel)) return 0;
    sbuf g = {0};
    char err[400];
    if (chat_tool_grammar(sc->tpl, tools, choice, parallel, thinking, &g, err, sizeof err)) {
        sbuf_free(&g);
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "tools", "cannot force tool calls: %s", err);
    }
    return set_grammar(rq, param, &g, e);
}
