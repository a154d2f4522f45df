/* params.h — typed reading of request-body fields, with a 400 that names the field.
 *
 * Every getter: absent or JSON null leaves *out alone and sets *present = 0 (when given);
 * a value of the wrong type or out of range fills e (400 invalid_request_error, param = key)
 * and returns -1. The API modules call these instead of touching cJSON types directly, so a
 * wrong type can never reach the engine or crash a handler.
 */
#ifndef CAIRN_PARAMS_H
#define CAIRN_PARAMS_H

#include <cjson/cJSON.h>

#include "http.h"
#include "turn.h"

int param_int(const cJSON *o, const char *key, long lo, long hi, long *out, int *present, http_err *e);
int param_num(const cJSON *o, const char *key, double lo, double hi, double *out, int *present, http_err *e);
int param_bool(const cJSON *o, const char *key, int *out, http_err *e);
int param_str(const cJSON *o, const char *key, const char **out, http_err *e);

/* Every field of body must be one of known[] (NULL-ended), else a 400 naming the first other
 * one, "'F' is not supported <where>". */
int param_only_fields(const cJSON *body, const char *const *known, const char *where, http_err *e);
/* body.model must be absent, empty, the served model id or an alias (else 404 model_not_found). */
int param_model(const serve_ctx *sc, const cJSON *body, http_err *e);
/* Stop strings: one string or a list of 1..TURN_MAX_STOPS non-empty strings. */
int param_stops(const cJSON *body, const char *key, turn_req *rq, http_err *e);
/* Output budget from the first present of keys[] (positive int), clamped to the server cap;
 * `required` makes its absence a 400. */
int param_max_tokens(const serve_ctx *sc, const cJSON *body, const char *const *keys, int required, turn_req *rq,
                     http_err *e);
/* temperature [0, max] (default 1), top_p (0,1] (default 1), top_k (0 = off), seed (a random
 * one when absent). */
int param_sampling(const cJSON *body, double max_temperature, turn_req *rq, http_err *e);
/* OpenAI's presence_penalty and frequency_penalty [-2, 2], logit_bias {token id: [-100, 100]}, and
 * the min_p [0, 1] and repetition_penalty (> 0, 1 = off) extensions vLLM and llama.cpp accept. */
int param_penalties(const cJSON *body, int vocab, turn_req *rq, http_err *e);
/* Slot pinning: cache_slot (0..slots-1) pins a slot; else a non-empty user string makes the
 * request its user's (slots.h OWNERS: the user's first request is routed, later ones follow it). */
int param_slot(const serve_ctx *sc, const cJSON *body, const char *user, turn_req *rq, http_err *e);

#endif
