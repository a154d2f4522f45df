/* anthropic.h — POST /v1/messages, the Anthropic Messages API over the same turns.
 *
 * The request is translated into OpenAI-shaped messages (system -> system message, text /
 * thinking / tool_use / tool_result blocks -> content, reasoning_content, tool_calls and tool
 * messages; input_schema tools -> functions) and rendered by the same family template as
 * /v1/chat/completions, so both APIs produce the same prompt for the same conversation.
 *
 * INVARIANT: usage.cache_read_input_tokens = the engine's reuse count, and input_tokens is the
 * uncached remainder (Anthropic's convention: the two add up to the prompt).
 */
#ifndef CAIRN_ANTHROPIC_H
#define CAIRN_ANTHROPIC_H

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "turn.h"

enum MHD_Result anthropic_messages(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri);
/* POST /v1/messages/count_tokens: {"input_tokens": the prompt's tokens as the engine would get them}. */
enum MHD_Result anthropic_count_tokens(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri);


/* The engine request a /v1/messages body maps to, without running it; as openai_request. */
int anthropic_request(serve_ctx *sc, const cJSON *body, turn_req *rq, http_err *e);

#endif
