#include "params.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "../core/util.h"
#include "info.h"
#include "wire.h"

static int bad(http_err *e, const char *key, const char *what) {
    return http_err_set(e, 400, "invalid_request_error", "invalid_value", key, "'%s' %s", key, what);
}

static const cJSON *field(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

int param_int(const cJSON *o, const char *key, long lo, long hi, long *out, int *present, http_err *e) {
    const cJSON *v = field(o, key);
    if (present) *present = v != NULL;
    if (!v) return 0;
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < (double)lo || d > (double)hi) {
        http_err_set(e, 400, "invalid_request_error", "invalid_value", key,
                     "'%s' must be an integer between %ld and %ld", key, lo, hi);
        return -1;
    }
    *out = (long)d;
    return 0;
}

int param_num(const cJSON *o, const char *key, double lo, double hi, double *out, int *present, http_err *e) {
    const cJSON *v = field(o, key);
    if (present) *present = v != NULL;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
        http_err_set(e, 400, "invalid_request_error", "invalid_value", key,
                     "'%s' must be a number between %g and %g", key, lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

int param_bool(const cJSON *o, const char *key, int *out, http_err *e) {
    const cJSON *v = field(o, key);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad(e, key, "must be a boolean");
    *out = cJSON_IsTrue(v);
    return 0;
}

int param_str(const cJSON *o, const char *key, const char **out, http_err *e) {
    const cJSON *v = field(o, key);
    if (!v) return 0;
    if (!cJSON_IsString(v)) return bad(e, key, "must be a string");
    *out = v->valuestring;
    return 0;
}

int param_only_fields(const cJSON *body, const char *const *known, const char *where, http_err *e) {
    const cJSON *f;
    cJSON_ArrayForEach(f, body) {
        int ok = 0;
        for (const char *const *k = known; *k; k++) ok |= !strcmp(f->string, *k);
        if (!ok)
            return http_err_set(e, 400, "invalid_request_error", "unsupported_parameter", f->string,
                                "'%s' is not supported %s", f->string, where);
    }
    return 0;
}

int param_model(const serve_ctx *sc, const cJSON *body, http_err *e) {
    const char *model = NULL;
    if (param_str(body, "model", &model, e)) return -1;
    if (!model || !*model || info_model_known(sc, model)) return 0;
    return http_err_set(e, 404, "invalid_request_error", "model_not_found", "model",
                        "The model '%s' does not exist; this server serves '%s'", model, sc->model_id);
}

int param_stops(const cJSON *body, const char *key, turn_req *rq, http_err *e) {
    const cJSON *v = field(body, key);
    if (!v) return 0;
    if (cJSON_IsString(v)) {
        if (!*v->valuestring) return bad(e, key, "must not be empty");
        rq->stops[rq->nstops++] = xstrdup(v->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > TURN_MAX_STOPS)
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", key,
                            "'%s' must be a string or a list of at most %d strings", key, TURN_MAX_STOPS);
    const cJSON *s;
    cJSON_ArrayForEach(s, v) {
        if (!cJSON_IsString(s) || !*s->valuestring) return bad(e, key, "entries must be non-empty strings");
        rq->stops[rq->nstops++] = xstrdup(s->valuestring);
    }
    return 0;
}

int param_max_tokens(const serve_ctx *sc, const cJSON *body, const char *const *keys, int required, turn_req *rq,
                     http_err *e) {
    for (; *keys; keys++) {
        long v;
        int present = 0;
        if (param_int(body, *keys, 1, 1L << 30, &v, &present, e)) return -1;
        if (present) {
            rq->max_tokens = (int)MIN(v, (long)sc->max_tokens);   /* larger asks are clamped, not refused */
            return 0;
        }
    }
    if (required) return bad(e, "max_tokens", "is required");
    rq->max_tokens = sc->max_tokens;
    return 0;
}

/* Without a seed every call draws a new one, as OpenAI, llama.cpp and vLLM do: a fixed default
 * would make every temperature > 0 reply the same. */
static unsigned long long random_seed(void) {
    unsigned long long s = 0;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s) s = (unsigned long long)(now_seconds() * 1e9);
    return s;
}

int param_sampling(const cJSON *body, double max_temperature, turn_req *rq, http_err *e) {
    rq->temperature = 1.0;
    rq->top_p = 1.0;
    if (param_num(body, "temperature", 0, max_temperature, &rq->temperature, NULL, e)) return -1;
    if (param_num(body, "top_p", 0, 1, &rq->top_p, NULL, e)) return -1;
    if (rq->top_p <= 0) return bad(e, "top_p", "must be greater than 0");
    long seed, top_k = 0;
    int has_seed = 0;
    if (param_int(body, "seed", -(1L << 53), 1L << 53, &seed, &has_seed, e)) return -1;
    rq->seed = has_seed ? (unsigned long long)seed : random_seed();
    if (param_int(body, "top_k", 0, 1L << 30, &top_k, NULL, e)) return -1;
    rq->top_k = (int)top_k;
    return 0;
}

/* logit_bias: {"<token id>": bias in [-100, 100], ...} -> rq->bias. */
static int param_logit_bias(const cJSON *body, int vocab, turn_req *rq, http_err *e) {
    const cJSON *lb = field(body, "logit_bias");
    if (!lb) return 0;
    if (!cJSON_IsObject(lb)) return bad(e, "logit_bias", "must be an object mapping token ids to biases");
    int n = cJSON_GetArraySize(lb);
    if (n > WIRE_BIAS_ENTRIES)
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "logit_bias",
                            "'logit_bias' has more than %d entries", WIRE_BIAS_ENTRIES);
    wire_bias *b = &rq->bias;
    b->ids = xrealloc(b->ids, sizeof *b->ids * (size_t)(n ? n : 1));
    b->vals = xrealloc(b->vals, sizeof *b->vals * (size_t)(n ? n : 1));
    b->n = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, lb) {
        char *end;
        long id = strtol(v->string, &end, 10);
        if (!*v->string || *end || id < 0 || id >= vocab)
            return http_err_set(e, 400, "invalid_request_error", "invalid_value", "logit_bias",
                                "'logit_bias' key '%s' is not a token id in [0, %d)", v->string, vocab);
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < -100 || v->valuedouble > 100)
            return http_err_set(e, 400, "invalid_request_error", "invalid_value", "logit_bias",
                                "'logit_bias' values must be numbers between -100 and 100 (token %ld)", id);
        b->ids[b->n] = (int)id;
        b->vals[b->n++] = (float)v->valuedouble;
    }
    return 0;
}

int param_penalties(const cJSON *body, int vocab, turn_req *rq, http_err *e) {
    if (param_num(body, "presence_penalty", -2, 2, &rq->presence, NULL, e)) return -1;
    if (param_num(body, "frequency_penalty", -2, 2, &rq->frequency, NULL, e)) return -1;
    if (param_num(body, "min_p", 0, 1, &rq->min_p, NULL, e)) return -1;
    int present = 0;
    double rep = 1;
    if (param_num(body, "repetition_penalty", 0, 10, &rep, &present, e)) return -1;
    if (present && rep <= 0) return bad(e, "repetition_penalty", "must be greater than 0");
    rq->repetition = rep == 1 ? 0 : rep;
    return param_logit_bias(body, vocab, rq, e);
}

int param_slot(const serve_ctx *sc, const cJSON *body, const char *user, turn_req *rq, http_err *e) {
    long slot;
    int present = 0;
    rq->pinned_slot = -1;
    rq->slot_owner = 0;
    if (param_int(body, "cache_slot", 0, sc->nslots - 1, &slot, &present, e)) return -1;
    if (present) rq->pinned_slot = (int)slot;
    else if (user && *user) rq->slot_owner = fnv64(FNV64_INIT, user, strlen(user)) | 1;   /* never 0 = none */
    return 0;
}
