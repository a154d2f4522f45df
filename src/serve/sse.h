/* sse.h — server-sent-event framing and the incremental "what is new since the last event"
 * logic shared by the OpenAI and Anthropic streams.
 *
 * INVARIANTS
 *  - A delta is emitted only when the new parse of the stable reply text EXTENDS what was
 *    already sent (template markers and tool-call blocks are held back by reply.h / the
 *    template's parse); text sent is never retracted.
 *  - While nothing happens for `keepalive` seconds the stream writes a keep-alive (a comment
 *    line for OpenAI, a `ping` event for Anthropic) so proxies and clients keep the connection
 *    open through long prefills.
 */
#ifndef CAIRN_SSE_H
#define CAIRN_SSE_H

#include "http.h"
#include "turn.h"

/* "data: <json>\n\n" (the JSON is deleted). */
void sse_data(sbuf *out, cJSON *json);
/* "event: <name>\ndata: <json>\n\n" (the JSON is deleted). */
void sse_event(sbuf *out, const char *name, cJSON *json);

/* Wait for news on t, writing `keepalive_text` into out when idle for sc->keepalive seconds
 * since *last_write (updated). Returns TURN_PROGRESS, TURN_DONE, TURN_GONE or TURN_IDLE (a
 * keep-alive was written). */
int sse_wait(turn *t, double *last_write, sbuf *out, const char *keepalive_text);

/* What a stream has sent of the reasoning and the content so far. */
typedef struct {
    sbuf reasoning, content;
} sse_sent;

/* Parse the stable reply and return the new reasoning / content (heap, "" if none), updating
 * sent. cr receives the full parse (tool calls become final only once the turn is done). */
void sse_deltas(const turn *t, sse_sent *sent, char **reasoning, char **content, chat_reply *cr);
void sse_sent_free(sse_sent *s);

/* What every OpenAI and Anthropic call holds: the request sent to the engine, the engine turn,
 * what a stream has sent so far, and the request's log and metrics record. */
typedef struct {
    turn_req rq;
    turn t;
    req_info *ri;
    sse_sent sent;
    double last_write;
} api_call;
/* Record the turn's outcome in ri, end the turn (releasing its slot) and free what c holds. */
void api_call_end(api_call *c);
/* A failed turn reported on a stream that already sent its 200, in the API's shape: OpenAI a
 * data line with the error envelope then `[DONE]`, Anthropic an `error` event then
 * `message_stop`, so clients waiting for the end of the stream see it. */
void sse_error(sbuf *out, const turn *t, api_flavor f);

#endif
