/* info.h — what the server says about itself and its tokenizer, for the clients and tools that
 * look for it: GET /v1/models[/{id}] (OpenAI's shape, or Anthropic's when the request carries
 * anthropic-version), GET /props, and llama.cpp-server's POST /tokenize and POST /detokenize.
 *
 * INVARIANTS
 *  - Every name a client may put in `model` (the model id and each --alias) is listed, and
 *    /v1/models/{name} finds each of them.
 *  - /tokenize gives exactly the ids the engine would get for the same text: with parse_special
 *    (the default, as in llama.cpp) added tokens match as in a raw prompt, without it the text is
 *    encoded as plain text, as chat content is. Fields it does not honour are a 400.
 */
#ifndef CAIRN_INFO_H
#define CAIRN_INFO_H

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "http.h"
#include "turn.h"

/* 1 if name is the served model's id or one of its aliases. */
int info_model_known(const serve_ctx *sc, const char *name);

enum MHD_Result info_models(serve_ctx *sc, struct MHD_Connection *c, const char *id, api_flavor f);
/* n_ctx, total_slots and numerics come from the engine's CAPS (NULL when not known yet). */
enum MHD_Result info_props(serve_ctx *sc, struct MHD_Connection *c, const wire_caps *caps);
enum MHD_Result info_tokenize(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri);
enum MHD_Result info_detokenize(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri);

#endif
