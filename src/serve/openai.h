/* openai.h — the OpenAI-compatible endpoints: POST /v1/chat/completions, POST /v1/completions
 * (GET /v1/models is info.h). Each handler validates the body (400 naming the field, 404 for another
 * model), runs one turn and answers in JSON or as an SSE stream.
 *
 * INVARIANTS
 *  - usage.prompt_tokens_details.cached_tokens is always present and equals the engine's
 *    reuse count for this request (0 when nothing was reused).
 *  - The prompt sent to the engine is exactly the family template's rendering of the messages,
 *    so an assistant turn fed back in history re-renders to the text the model generated; with
 *    --reply-ids on, a reply this server generated goes back as the ids it was generated as.
 */
#ifndef CAIRN_OPENAI_H
#define CAIRN_OPENAI_H

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "turn.h"

enum MHD_Result openai_chat(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri);
enum MHD_Result openai_completions(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri);

/* Validate OpenAI-shaped messages (roles, content as a string or text parts, tool calls) into a
 * normalized copy with string contents; NULL + e on a bad message. Shared with anthropic.c.
 * media: for a model that takes audio, input_audio parts of user messages are decoded into it
 * (audio_in.h) and such a content stays a list of text and audio parts; NULL refuses them. */
cJSON *openai_normalize_messages(const cJSON *messages, sbuf *media, http_err *e);
/* Render normalized messages + tools with the family template into rq->prompt (and rq->ids
 * when remembered replies are spliced back in). */
int openai_render(serve_ctx *sc, const cJSON *messages, const cJSON *tools, const chat_opts *o, turn_req *rq,
                  http_err *e);

/* A reasoning effort (field param) an OpenAI endpoint was sent: 0 when the API names it and the
 * model's chat format takes it (none always), else -1 + a 400 naming param and the value. */
int openai_effort(const serve_ctx *sc, const char *effort, const char *param, http_err *e);

/* The engine request a body maps to, without running it (chat: /v1/chat/completions, else
 * /v1/completions): 0, or -1 with e (a 4xx). rq is the caller's to turn_req_free either way. For
 * fuzzing and tests of the mapping; the handlers run the same parsers. */
int openai_request(serve_ctx *sc, int chat, const cJSON *body, turn_req *rq, http_err *e);

#endif
