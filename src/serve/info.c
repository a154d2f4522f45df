#include "info.h"

#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "params.h"

int info_model_known(const serve_ctx *sc, const char *name) {
    if (!strcmp(name, sc->model_id)) return 1;
    for (int i = 0; i < sc->naliases; i++)
        if (!strcmp(name, sc->aliases[i])) return 1;
    return 0;
}

static cJSON *model_json(const char *name, api_flavor f) {
    cJSON *m = cJSON_CreateObject();
    if (f == API_ANTHROPIC) {
        cJSON_AddStringToObject(m, "type", "model");
        cJSON_AddStringToObject(m, "id", name);
        cJSON_AddStringToObject(m, "display_name", name);
        cJSON_AddStringToObject(m, "created_at", "1970-01-01T00:00:00Z");
    } else {
        cJSON_AddStringToObject(m, "id", name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", 0);
        cJSON_AddStringToObject(m, "owned_by", "cairn");
    }
    return m;
}

enum MHD_Result info_models(serve_ctx *sc, struct MHD_Connection *c, const char *id, api_flavor f) {
    if (id) {
        if (!info_model_known(sc, id)) {
            http_err e;
            http_err_set(&e, 404, "invalid_request_error", "model_not_found", "model", "The model '%s' does not exist", id);
            return http_send_error(c, f, &e);
        }
        return http_send_json(c, 200, model_json(id, f));
    }
    cJSON *r = cJSON_CreateObject(), *data = cJSON_CreateArray();
    cJSON_AddItemToArray(data, model_json(sc->model_id, f));
    for (int i = 0; i < sc->naliases; i++) cJSON_AddItemToArray(data, model_json(sc->aliases[i], f));
    if (f == API_ANTHROPIC) {
        cJSON_AddItemToObject(r, "data", data);
        cJSON_AddBoolToObject(r, "has_more", 0);
        cJSON_AddStringToObject(r, "first_id", sc->model_id);
        cJSON_AddStringToObject(r, "last_id", sc->naliases ? sc->aliases[sc->naliases - 1] : sc->model_id);
    } else {
        cJSON_AddStringToObject(r, "object", "list");
        cJSON_AddItemToObject(r, "data", data);
    }
    return http_send_json(c, 200, r);
}

static void add_number_or_null(cJSON *o, const char *key, const wire_caps *caps, int v) {
    if (caps) cJSON_AddNumberToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

enum MHD_Result info_props(serve_ctx *sc, struct MHD_Connection *c, const wire_caps *caps) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "model", sc->model_id);
    cJSON_AddStringToObject(r, "model_path", sc->model_dir);
    cJSON_AddStringToObject(r, "family", sc->family);
    cJSON *al = cJSON_AddArrayToObject(r, "model_alias");
    for (int i = 0; i < sc->naliases; i++) cJSON_AddItemToArray(al, cJSON_CreateString(sc->aliases[i]));
    add_number_or_null(r, "n_ctx", caps, caps ? caps->ctx : 0);
    add_number_or_null(r, "total_slots", caps, caps ? caps->slots : 0);
    if (caps) cJSON_AddStringToObject(r, "numerics", caps->numerics);
    else cJSON_AddNullToObject(r, "numerics");
    cJSON *can = cJSON_AddObjectToObject(r, "capabilities");
    cJSON_AddBoolToObject(can, "chat", sc->tpl != NULL);
    cJSON_AddBoolToObject(can, "completions", 1);
    cJSON_AddBoolToObject(can, "tools", sc->tpl != NULL);
    cJSON_AddBoolToObject(can, "thinking", sc->tpl != NULL);
    cJSON_AddBoolToObject(can, "logprobs", 1);
    cJSON_AddBoolToObject(can, "tokenizer", sc->tok != NULL);
    cJSON_AddBoolToObject(can, "reply_ids", sc->replies != NULL);
    cJSON *d = cJSON_AddObjectToObject(r, "default_generation_settings");
    add_number_or_null(d, "n_ctx", caps, caps ? caps->ctx : 0);
    cJSON *p = cJSON_AddObjectToObject(d, "params");
    cJSON_AddNumberToObject(p, "temperature", 1);
    cJSON_AddNumberToObject(p, "top_p", 1);
    cJSON_AddNumberToObject(p, "top_k", 0);
    cJSON_AddNumberToObject(p, "min_p", 0);
    cJSON_AddNumberToObject(p, "max_tokens", sc->max_tokens);
    return http_send_json(c, 200, r);
}

static int need_tokenizer(const serve_ctx *sc, http_err *e) {
    if (sc->tok) return 0;
    return http_err_set(e, 400, "invalid_request_error", "unsupported_model", NULL,
                        "this model has no usable tokenizer.json");
}

static enum MHD_Result failed(struct MHD_Connection *c, req_info *ri, const http_err *e) {
    ri->status = e->status;
    return http_send_error(c, API_OPENAI, e);
}

enum MHD_Result info_tokenize(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri) {
    static const char *const known[] = {"content", "add_special", "parse_special", "with_pieces", "model", NULL};
    http_err e = {0};
    const char *text = NULL;
    int add_special = 0, parse_special = 1, pieces = 0;
    if (!cJSON_IsObject(body)) http_err_set(&e, 400, "invalid_request_error", "invalid_json", NULL, "the body must be a JSON object");
    else if (!param_only_fields(body, known, "here", &e) && !need_tokenizer(sc, &e) && !param_str(body, "content", &text, &e) &&
             !param_bool(body, "add_special", &add_special, &e) && !param_bool(body, "parse_special", &parse_special, &e) &&
             !param_bool(body, "with_pieces", &pieces, &e)) {
        if (!text) http_err_set(&e, 400, "invalid_request_error", "invalid_value", "content", "'content' is required");
        else if (add_special)
            http_err_set(&e, 400, "invalid_request_error", "invalid_value", "add_special",
                         "'add_special' is not supported: the chat templates write every special token themselves");
    }
    if (e.status) return failed(c, ri, &e);
    size_t n = strlen(text);
    tok_span all = {0, n};
    char err[128];
    int k = tok_encode_untrusted(sc->tok, text, n, &all, parse_special ? 0 : 1, NULL, 0, err, sizeof err);
    int *ids = xmalloc(sizeof(int) * (size_t)(k > 0 ? k : 1));
    if (k > 0) tok_encode_untrusted(sc->tok, text, n, &all, parse_special ? 0 : 1, ids, k, err, sizeof err);
    if (k < 0) {
        free(ids);
        http_err_set(&e, 400, "invalid_request_error", "invalid_value", "content", "cannot tokenize: %s", err);
        return failed(c, ri, &e);
    }
    cJSON *r = cJSON_CreateObject(), *toks = cJSON_AddArrayToObject(r, "tokens");
    for (int i = 0; i < k; i++) {
        if (!pieces) {
            cJSON_AddItemToArray(toks, cJSON_CreateNumber(ids[i]));
            continue;
        }
        size_t len = 0;
        char *raw = tok_decode(sc->tok, &ids[i], 1, &len);
        char *clean = utf8_clean(raw ? raw : "", raw ? len : 0, NULL);
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "id", ids[i]);
        cJSON_AddStringToObject(p, "piece", clean);
        cJSON_AddItemToArray(toks, p);
        free(raw);
        free(clean);
    }
    free(ids);
    ri->status = 200;
    return http_send_json(c, 200, r);
}

enum MHD_Result info_detokenize(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri) {
    static const char *const known[] = {"tokens", "model", NULL};
    http_err e = {0};
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(body, "tokens");
    if (!cJSON_IsObject(body)) http_err_set(&e, 400, "invalid_request_error", "invalid_json", NULL, "the body must be a JSON object");
    else if (!param_only_fields(body, known, "here", &e) && !need_tokenizer(sc, &e) && !cJSON_IsArray(toks))
        http_err_set(&e, 400, "invalid_request_error", "invalid_value", "tokens", "'tokens' must be a list of token ids");
    if (e.status) return failed(c, ri, &e);
    int n = cJSON_GetArraySize(toks), vocab = tok_vocab_size(sc->tok), k = 0;
    int *ids = xmalloc(sizeof(int) * (size_t)(n ? n : 1));
    const cJSON *t;
    cJSON_ArrayForEach(t, toks) {
        if (!cJSON_IsNumber(t) || t->valuedouble != (double)(long)t->valuedouble || t->valuedouble < 0 || t->valuedouble >= vocab) {
            free(ids);
            http_err_set(&e, 400, "invalid_request_error", "invalid_value", "tokens",
                         "'tokens' entries must be integers in [0, %d)", vocab);
            return failed(c, ri, &e);
        }
        ids[k++] = (int)t->valuedouble;
    }
    size_t len = 0;
    char *raw = tok_decode(sc->tok, ids, k, &len);
    char *clean = utf8_clean(raw ? raw : "", raw ? len : 0, NULL);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "content", clean);
    free(raw);
    free(clean);
    free(ids);
    ri->status = 200;
    return http_send_json(c, 200, r);
}
