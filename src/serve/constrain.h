/* constrain.h — the request fields that constrain decoding, compiled into the GBNF grammar the
 * engine receives as the SUBMIT extension payload (protocol.md §1.3 field 7; grammar.h):
 *   grammar           raw GBNF, as llama.cpp accepts it (OpenAI and Anthropic bodies)
 *   response_format   OpenAI {type: text | json_object | json_schema, json_schema: {name, schema,
 *                     strict, description}} (json_schema.h; strict or not, output is constrained)
 *   tool calls        OpenAI tool_choice "required" / {function: {name}}, parallel_tool_calls,
 *                     function.strict; Anthropic tool_choice any / tool, disable_parallel_tool_use —
 *                     in the family's own tool-call syntax (chat.h chat_tool_grammar)
 * How they combine:
 *   forced calls (required / a name)        the reply is the calls (response_format has no
 *                                           content to shape then)
 *   tool_choice auto + response_format      the reply is the schema's JSON or calls
 *   tool_choice auto, parallel calls off    free content, then at most one call
 *     or some function strict               free content, then calls
 *   the raw grammar field                   alone: with any of the above it is a 400; it
 *                                           covers the whole reply, reasoning included
 * In thinking mode the reply starts with reasoning (text up to the template's end-of-reasoning
 * marker, which it cannot contain) before the schema's JSON or the calls.
 * INVARIANT: everything is compiled AND parsed here, so a bad schema, keyword or grammar is a 400
 * naming the field before anything reaches the engine; the engine only ever sees GBNF.
 */
#ifndef CAIRN_CONSTRAIN_H
#define CAIRN_CONSTRAIN_H

#include <cjson/cJSON.h>

#include "http.h"
#include "turn.h"

typedef struct {
    int response_format;          /* the API has response_format (OpenAI) */
    const cJSON *tools;           /* declared tools (OpenAI shape) or NULL */
    const char *tool_choice;      /* NULL = auto */
    int parallel;                 /* several calls allowed in one reply */
    int thinking;                 /* the reply starts with reasoning */
} constrain_opts;

/* Set rq->grammar from body and o (nothing when the request is unconstrained). */
int constrain_request(const serve_ctx *sc, const cJSON *body, const constrain_opts *o, turn_req *rq, http_err *e);

#endif
