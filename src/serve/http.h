/* http.h — the small layer between libmicrohttpd and the API modules: byte buffers, JSON and
 * error replies in the OpenAI and Anthropic shapes, server-sent-event streams, and noticing a
 * client that went away.
 *
 * The daemon runs one thread per connection, so a handler may block while a generation runs
 * and a stream's pump may block waiting for the next tokens.
 *
 * INVARIANTS
 *  - Every error a client sees has the JSON envelope of the API it called:
 *    OpenAI {"error":{message,type,param,code}}, Anthropic {"type":"error","error":{type,message}}.
 *  - A stream's pump runs only in its connection's thread; once it returns end or abort it is
 *    never called again, and the stream's cleanup runs exactly once.
 *  - Every reply queued here (JSON, text, error, stream, preflight) carries the
 *    Access-Control-* headers exactly when the request's Origin is on the allow-list; other
 *    requests get none (a reply to any Origin still says `Vary: Origin`), so a
 *    browser page from elsewhere cannot read the reply. The allow-list is set once before the
 *    daemon starts and only read afterwards, so connection threads share it without a lock.
 *  - Every reply carries the request's id as `x-request-id` (OpenAI) and `request-id`
 *    (Anthropic), and an Anthropic error body carries it as `request_id`. The id is the
 *    connection thread's (http_request_id_set): the daemon runs one thread per connection, and a
 *    request's handler, its reply and its stream all run in that thread.
 */
#ifndef CAIRN_HTTP_H
#define CAIRN_HTTP_H

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <stddef.h>

#include "../core/sbuf.h"


typedef enum { API_OPENAI, API_ANTHROPIC } api_flavor;

/* An error to answer with. status 0 = no error. */
typedef struct {
    int status;
    const char *type;             /* e.g. invalid_request_error */
    const char *code;             /* e.g. model_not_found; NULL = none */
    const char *param;            /* the offending field; NULL = none */
    char message[384];
    int retry_after;              /* seconds for a Retry-After header; 0 = none */
} http_err;

int http_err_set(http_err *e, int status, const char *type, const char *code, const char *param,
                 const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The JSON error body for e in the given flavour (heap string). */
char *http_err_body(const http_err *e, api_flavor f);

/* Queue a reply. The JSON is printed unformatted and deleted. Returns an MHD_Result. */
enum MHD_Result http_send_json(struct MHD_Connection *c, int status, cJSON *body);
enum MHD_Result http_send_text(struct MHD_Connection *c, int status, const char *ctype, const char *text);
enum MHD_Result http_send_error(struct MHD_Connection *c, api_flavor f, const http_err *e);
/* 200 with len bytes that outlive the server (static files); headers is a NULL-terminated
 * list of name, value pairs added to the reply. */
enum MHD_Result http_send_static(struct MHD_Connection *c, const char *ctype, const void *data, size_t len,
                                 const char *const *headers);

/* The id of the request this connection thread is answering ("req_<hex>"), for the reply
 * headers and error bodies; set once per request before its handler runs. */
void http_request_id_set(const char *id);

/* 1 if the peer closed its side (a zero-byte peek) or the socket failed. */
int http_client_gone(struct MHD_Connection *c);

/* A streamed reply. pump appends bytes to out and returns STREAM_MORE, STREAM_END (out holds
 * the last bytes) or STREAM_ABORT (close the connection without a clean end). done runs once
 * after the last pump call or when the client went away. */
enum { STREAM_MORE = 0, STREAM_END = 1, STREAM_ABORT = -1 };
typedef int (*stream_pump_fn)(void *ctx, sbuf *out);
typedef void (*stream_done_fn)(void *ctx);
enum MHD_Result http_send_stream(struct MHD_Connection *c, stream_pump_fn pump, stream_done_fn done, void *ctx);

/* The browser origins (scheme://host[:port], or "*" for any) whose pages may read replies.
 * n == 0 keeps the default: the usual local dev-server ports and the Tauri app origins. The
 * array and its strings are borrowed and must outlive the server. */
void http_cors_allow(const char *const *origins, int n);
/* 1 if pages of this origin may call the API (it is on that list). */
int http_origin_allowed(const char *origin);
/* Answer a CORS preflight (OPTIONS) with 204 and the methods and request headers allowed. */
enum MHD_Result http_send_preflight(struct MHD_Connection *c);

#endif
