#include "http.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "../core/util.h"

int http_err_set(http_err *e, int status, const char *type, const char *code, const char *param,
                 const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    e->param = param;
    e->retry_after = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static __thread char request_id[48];

void http_request_id_set(const char *id) { snprintf(request_id, sizeof request_id, "%s", id); }

char *http_err_body(const http_err *e, api_flavor f) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_CreateObject();
    if (f == API_ANTHROPIC) {
        /* Anthropic names error types by HTTP meaning rather than by OpenAI's categories. */
        const char *type = e->status == 401 ? "authentication_error" : e->status == 403 ? "permission_error"
                         : e->status == 404 ? "not_found_error" : e->status == 413 ? "request_too_large"
                         : e->status == 429 ? "rate_limit_error" : e->status == 503 ? "overloaded_error"
                         : e->status >= 500 ? "api_error" : "invalid_request_error";
        cJSON_AddStringToObject(root, "type", "error");
        cJSON_AddStringToObject(err, "type", type);
        cJSON_AddStringToObject(err, "message", e->message);
    } else {
        cJSON_AddStringToObject(err, "message", e->message);
        cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
        if (e->param) cJSON_AddStringToObject(err, "param", e->param);
        else cJSON_AddNullToObject(err, "param");
        if (e->code) cJSON_AddStringToObject(err, "code", e->code);
        else cJSON_AddNullToObject(err, "code");
    }
    cJSON_AddItemToObject(root, "error", err);
    if (f == API_ANTHROPIC && request_id[0]) cJSON_AddStringToObject(root, "request_id", request_id);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ---- CORS ------------------------------------------------------------------------------------ */

/* Local web chat UIs: Python's http.server and Vite dev servers, and Tauri desktop apps. */
static const char *const cors_default_origins[] = {
    "http://localhost:8000", "http://127.0.0.1:8000", "http://localhost:5173", "http://127.0.0.1:5173",
    "tauri://localhost",     "http://tauri.localhost", "https://tauri.localhost",
};

static const char *const *cors_origins = cors_default_origins;
static int cors_n = sizeof cors_default_origins / sizeof cors_default_origins[0];

void http_cors_allow(const char *const *origins, int n) {
    if (n == 0) return;
    cors_origins = origins;
    cors_n = n;
}

/* The Access-Control-Allow-Origin value for a request from origin, NULL if it is not allowed.
 * Browsers send scheme and host in lower case, but a configured origin may not be. */
static const char *cors_allow_value(const char *origin) {
    for (int i = 0; i < cors_n; i++) {
        if (!strcmp(cors_origins[i], "*")) return "*";
        if (!strcasecmp(cors_origins[i], origin)) return origin;
    }
    return NULL;
}

int http_origin_allowed(const char *origin) { return cors_allow_value(origin) != NULL; }

/* Vary goes on whenever an Origin came, allowed or not: the reply depends on it, and a cache
 * must not hand one origin's answer to another. Expose lists the headers a page's script may
 * read besides the CORS-safelisted ones; x-request-id is listed as the reference gateway
 * lists it, so a page written against that gateway sees the same list here. */
static void cors_headers(struct MHD_Connection *c, struct MHD_Response *r) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin) return;
    MHD_add_response_header(r, "Vary", "Origin");
    const char *allow = cors_allow_value(origin);
    if (!allow) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", allow);
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "x-request-id, request-id, Retry-After");
}

/* Queue r with the CORS headers this request earns, and drop our reference to it. */
static enum MHD_Result queue(struct MHD_Connection *c, int status, struct MHD_Response *r) {
    cors_headers(c, r);
    if (request_id[0]) {
        MHD_add_response_header(r, "x-request-id", request_id);
        MHD_add_response_header(r, "request-id", request_id);
    }
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

/* The headers the official OpenAI and Anthropic SDKs send from a browser, for a preflight that
 * does not list the ones it wants. */
#define CORS_FIXED_HEADERS                                                                                  \
    "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, "                          \
    "anthropic-dangerous-direct-browser-access, openai-organization, openai-project, openai-beta, "        \
    "x-stainless-arch, x-stainless-lang, x-stainless-os, x-stainless-package-version, "                    \
    "x-stainless-runtime, x-stainless-runtime-version, x-stainless-retry-count, x-stainless-timeout, "     \
    "x-stainless-helper-method"

/* A requested header list is echoed back only if it is a plain comma-separated list of header
 * names, so nothing odd from the request ends up in our reply headers. */
static int header_list_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 2048) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-_, ", s[i])) return 0;
    return 1;
}

enum MHD_Result http_send_preflight(struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    const char *wanted = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin && cors_allow_value(origin)) {
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                wanted && header_list_ok(wanted) ? wanted : CORS_FIXED_HEADERS);
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    return queue(c, MHD_HTTP_NO_CONTENT, r);
}

static enum MHD_Result send_owned(struct MHD_Connection *c, int status, const char *ctype, char *body,
                                  int retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(body); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", v);
    }
    return queue(c, status, r);
}

enum MHD_Result http_send_json(struct MHD_Connection *c, int status, cJSON *body) {
    char *s = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    if (!s) return MHD_NO;
    return send_owned(c, status, "application/json", s, 0);
}

enum MHD_Result http_send_text(struct MHD_Connection *c, int status, const char *ctype, const char *text) {
    return send_owned(c, status, ctype, xstrdup(text), 0);
}

enum MHD_Result http_send_error(struct MHD_Connection *c, api_flavor f, const http_err *e) {
    return send_owned(c, e->status, "application/json", http_err_body(e, f), e->retry_after);
}

enum MHD_Result http_send_static(struct MHD_Connection *c, const char *ctype, const void *data, size_t len,
                                 const char *const *headers) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    for (; headers && headers[0]; headers += 2) MHD_add_response_header(r, headers[0], headers[1]);
    return queue(c, MHD_HTTP_OK, r);
}

int http_client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char byte;
    ssize_t n = recv(ci->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return 1;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

typedef struct {
    stream_pump_fn pump;
    stream_done_fn done;
    void *ctx;
    sbuf out;
    size_t out_sent;              /* bytes of out already handed to MHD */
    int finished;                 /* pump returned END or ABORT */
    int aborted;
} stream;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream *s = cls;
    while (s->out_sent == s->out.len) {
        if (s->finished) return s->aborted ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
        s->out.len = s->out_sent = 0;
        int rc = s->pump(s->ctx, &s->out);
        if (rc != STREAM_MORE) {
            s->finished = 1;
            s->aborted = rc == STREAM_ABORT;
        }
    }
    size_t n = MIN(max, s->out.len - s->out_sent);
    memcpy(buf, s->out.p + s->out_sent, n);
    s->out_sent += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream *s = cls;
    s->done(s->ctx);
    sbuf_free(&s->out);
    free(s);
}

enum MHD_Result http_send_stream(struct MHD_Connection *c, stream_pump_fn pump, stream_done_fn done, void *ctx) {
    stream *s = xcalloc(1, sizeof *s);
    s->pump = pump;
    s->done = done;
    s->ctx = ctx;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s, stream_free);
    if (!r) { stream_free(s); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    MHD_add_response_header(r, "Connection", "close");
    return queue(c, MHD_HTTP_OK, r);
}
