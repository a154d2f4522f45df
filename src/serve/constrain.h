/* constrain.h — the request fields that constrain decoding, compiled into the GBNF grammar the
 * engine receives as the SUBMIT extension payload (protocol.md §1.3 field 7; grammar.h):
 *   grammar           raw GBNF, as llama.cpp accepts it (OpenAI and Anthropic bodies)
 *   response_format   OpenAI {type: text | json_object | json_schema, json_schema: {name, schema,
 *                     strict, description}} (json_schema.h; strict or not, output is constrained)
 *   forced tool calls OpenAI tool_choice "required" / {function: {name}}, parallel_tool_calls;
 *                     Anthropic tool_choice any / tool, disable_parallel_tool_use — in the
 *                     family's own tool-call syntax (chat.h chat_tool_grammar). With tool_choice
 *                     auto and parallel calls off, the grammar allows content and at most one call.
 * INVARIANTS
 *  - At most one source per request: combining two is a 400 naming both fields.
 *  - Everything is compiled AND parsed here, so a bad schema, keyword or grammar is a 400 naming
 *    the field before anything reaches the engine; the engine only ever sees GBNF.
 */
#ifndef CAIRN_CONSTRAIN_H
#define CAIRN_CONSTRAIN_H

#include <cjson/cJSON.h>

#include "http.h"
#include "turn.h"

/* body.grammar (a string, or absent/null). */
int constrain_grammar(const cJSON *body, turn_req *rq, http_err *e);
/* body.response_format (absent, null or {type: text}: nothing). */
int constrain_response_format(const cJSON *body, turn_req *rq, http_err *e);
/* Tool calls for tool_choice `choice` (NULL = auto; "none" and auto with parallel calls allowed
 * add nothing). param names the request field errors point at. */
int constrain_tools(const serve_ctx *sc, const cJSON *tools, const char *choice, int parallel, int thinking,
                    const char *param, turn_req *rq, http_err *e);

#endif
