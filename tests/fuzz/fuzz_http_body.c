/* fuzz_http_body — an HTTP request body mapped to the engine request (openai_request,
 * anthropic_request) for every registered family's chat template: the validation and translation the
 * gateway runs before anything reaches the engine (a family without a template, or an index past
 * the registry, runs the no-template path).
 *
 * Input: byte 0 = which API (0 chat completions, 1 completions, 2 messages) and which template;
 * the rest is the body. Checked beyond the sanitizers: an accepted request has a non-empty prompt
 * of prompt_len bytes, max_tokens in 1..the server cap, at most TURN_MAX_STOPS stops, a pinned slot
 * inside the server's slots, and untrusted spans inside the prompt; a refusal is a 4xx with a
 * message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tokenizer.h"
#include "fuzz.h"
#include "models/model.h"
#include "serve/anthropic.h"
#include "serve/openai.h"

static tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    tok = fuzz_tokenizer("fuzz_http_body");
    return 0;
}

static void check(const serve_ctx *sc, const turn_req *rq, int rc, const http_err *e) {
    if (rc) {
        if (e->status < 400 || e->status >= 500 || !e->message[0]) abort();
        return;
    }
    if (!rq->prompt || rq->prompt_len == 0 || (!rq->prompt_is_ids && strlen(rq->prompt) != rq->prompt_len)) abort();
    if (rq->max_tokens < 1 || rq->max_tokens > sc->max_tokens || rq->nstops > TURN_MAX_STOPS) abort();
    if (rq->pinned_slot < -1 || rq->pinned_slot >= sc->nslots) abort();
    for (int i = 0; i < rq->nuntrusted; i++)
        if (rq->untrusted[i].len == 0 || rq->untrusted[i].start + rq->untrusted[i].len > rq->prompt_len) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int api = data[0] % 3, tpl_i = data[0] / 3 % 4;
    serve_ctx sc = {.nslots = 2, .model_id = "m", .family = "fuzz", .tok = tok, .max_tokens = 64};
    sc.tpl = tpl_i < family_count() ? family_at(tpl_i)->chat : NULL;
    cJSON *body = cJSON_ParseWithLength((const char *)data + 1, size - 1);
    if (!body) return 0;
    turn_req rq = {0};
    http_err e = {0};
    int rc = api == 2 ? anthropic_request(&sc, body, &rq, &e) : openai_request(&sc, api == 0, body, &rq, &e);
    check(&sc, &rq, rc, &e);
    turn_req_free(&rq);
    cJSON_Delete(body);
    return 0;
}
