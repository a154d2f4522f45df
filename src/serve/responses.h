/* responses.h — the OpenAI Responses API: POST /v1/responses (text and function calls, streamed
 * as typed events or not), GET /v1/responses/{id}, DELETE /v1/responses/{id}.
 *
 * A request becomes the same OpenAI-shaped messages the chat endpoint renders: `instructions` a
 * system message, `input` (a string, or message / function_call / function_call_output items)
 * the conversation; with `previous_response_id` the stored conversation of that response (its
 * input and output, not its instructions, as the API specifies) comes first. The reply's output
 * items come from the family's template parse: reasoning, a message with output_text, and one
 * function_call per tool call.
 *
 * INVARIANTS
 *  - A continued conversation is fed the exact ids of the stored response's output: its
 *    assistant turns are remembered replies (replies.h), so the next turn reuses all of it.
 *  - usage.input_tokens_details.cached_tokens is the engine's reuse count.
 *  - Stored responses (store, default true) are kept in a bounded LRU (RESPONSES_MAX) until
 *    deleted; a response that is not stored, or was evicted or deleted, is a 404 by id.
 *  - A field this server does not honour (tools other than functions, forced tool choice and
 *    structured text formats before constrained decoding, logprobs) is a 400 naming it.
 */
#ifndef CAIRN_RESPONSES_H
#define CAIRN_RESPONSES_H

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "turn.h"

enum { RESPONSES_MAX = 1024 };

typedef struct responses responses;

responses *responses_new(void);
void responses_free(responses *r);

enum MHD_Result responses_create(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri);
/* GET (del 0) or DELETE (del 1) /v1/responses/{id}. */
enum MHD_Result responses_by_id(serve_ctx *sc, struct MHD_Connection *c, const char *id, int del, req_info *ri);

#endif
