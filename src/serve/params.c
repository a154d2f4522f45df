#include "params.h"

#include <math.h>
#include <string.h>

#include "../core/util.h"

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

int param_model(const serve_ctx *sc, const cJSON *body, http_err *e) {
    const char *model = NULL;
    if (param_str(body, "model", &model, e)) return -1;
    if (!model || !*model || !strcmp(model, sc->model_id)) return 0;
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

int param_sampling(const cJSON *body, double max_temperature, turn_req *rq, http_err *e) {
    rq->temperature = 1.0;
    rq->top_p = 1.0;
    if (param_num(body, "temperature", 0, max_temperature, &rq->temperature, NULL, e)) return -1;
    if (param_num(body, "top_p", 0, 1, &rq->top_p, NULL, e)) return -1;
    if (rq->top_p <= 0) return bad(e, "top_p", "must be greater than 0");
    long seed;
    int has_seed = 0;
    if (param_int(body, "seed", -(1L << 53), 1L << 53, &seed, &has_seed, e)) return -1;
    rq->has_seed = has_seed;
    rq->seed = (unsigned long long)seed;
    return 0;
}

int param_slot(const serve_ctx *sc, const cJSON *body, const char *user, turn_req *rq, http_err *e) {
    long slot;
    int present = 0;
    rq->pinned_slot = -1;
    if (param_int(body, "cache_slot", 0, sc->nslots - 1, &slot, &present, e)) return -1;
    if (present) rq->pinned_slot = (int)slot;
    else if (user && *user) rq->pinned_slot = (int)(fnv64(FNV64_INIT, user, strlen(user)) % (uint64_t)sc->nslots);
    return 0;
}
