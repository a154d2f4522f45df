/* gateway.c — `cairn serve`: the HTTP server (libmicrohttpd, one thread per connection) in front
 * of one `cairn engine` child process.
 *
 * This file owns start-up, flags, routing of URLs to the API modules and the chat page (webui.h),
 * the checks every request
 * passes first (Host guard, API key, body bound), the per-request log line, and the graceful
 * shutdown on SIGTERM/SIGINT. Generation itself is turn.c; the wire to the engine is
 * engine_proc.c; which slot a conversation uses is slots.c.
 *
 * INVARIANTS
 *  - The port is bound before the engine starts, so a busy port fails at once.
 *  - Every request gets exactly one log line and one /metrics count when it completes.
 *  - A connection whose request headers are not complete --header-timeout seconds after it opened
 *    (or after its previous request ended) is closed (header_deadline.h): a client trickling
 *    header bytes cannot hold a connection thread for ever.
 *  - After SIGTERM no new connection is accepted; in-flight requests finish (up to --grace
 *    seconds); then the engine gets EOF on stdin and the process exits 0.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <malloc.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cli.h"
#include "../core/util.h"
#include "anthropic.h"
#include "header_deadline.h"
#include "http.h"
#include "info.h"
#include "malloc_tune.h"
#include "responses.h"
#include "slot_api.h"
#include "openai.h"
#include "reply.h"
#include "turn.h"
#include "webui.h"

#define MAX_ALLOWED_HOSTS 8
#define MAX_ALIASES 8
#define MAX_CORS_ORIGINS 16
#define MAX_ENGINE_ARGS 32
/* --max-header is libmicrohttpd's per-connection memory pool. One of at most 32 KiB is malloc'd
 * (memorypool.c, 0.9.75), a larger one is mapped on its own: mapped, a closed connection's pool
 * goes back to the kernel, where a malloc'd one left a 32 KiB hole between long-lived blocks of
 * the heap and, as connections came and went, the heap's resident pages crept up
 * (docs/reliability.md §4). So the default is just over that line. */
#define DEFAULT_MAX_HEADER (36 << 10)

typedef struct {
    const char *model_dir, *host, *api_key, *model_id, *engine_exe;
    long port, slots, ctx, max_tokens, max_queue, max_conn, max_conn_ip, read_timeout, max_header;
    long max_body;
    double queue_timeout, keepalive, grace, header_timeout;
    const char *allowed_hosts[MAX_ALLOWED_HOSTS];
    int n_allowed;
    const char *cors_origins[MAX_CORS_ORIGINS];   /* none given: http.c's default list */
    int n_cors;
    const char *aliases[MAX_ALIASES];
    int n_aliases;
    int loopback, allow_insecure, no_webui;
    int reply_ids;                /* --reply-ids on|off */
    const char *kv_dir;           /* also passed to the engine; the gateway keeps reply ids there */
    char *engine_args[MAX_ENGINE_ARGS];   /* flags passed through to `cairn engine` */
    int n_engine_args;
} serve_opts;

typedef struct {
    serve_opts *o;
    serve_ctx sc;
    int inflight;                 /* requests begun and not yet completed (atomic) */
    header_deadline *hd;
    char *model_dir_copy;         /* basename() may modify its argument */
    int port;                     /* the bound port */
} server;

/* Per-request state across libmicrohttpd's calls of the access handler. */
typedef struct {
    sbuf body;
    size_t too_large;             /* bytes of an oversized body dropped so far */
    req_info *ri;
    const char *endpoint;         /* label for the log and /metrics */
    char id[48];                  /* request id: reply headers, error bodies, the log line */
    char method[8];
    char path[96];
} req_ctx;

static void usage(FILE *f) {
    fprintf(f,
            "usage: cairn serve -m DIR [options]\n"
            "  OpenAI- and Anthropic-compatible HTTP server over a `cairn engine` child process.\n"
            "  -m, --model DIR          model directory (config.json, safetensors, tokenizer.json)\n"
            "  --host ADDR              bind address (default 127.0.0.1)\n"
            "  --port N                 port (default 8080; 0 = any free port, printed at start)\n"
            "  --slots N                engine slots = concurrent conversations kept (default 2)\n"
            "  --ctx N                  context positions per slot (engine default if absent)\n"
            "  --api-key KEY            require `Authorization: Bearer KEY` or `x-api-key: KEY`\n"
            "                           (also from CAIRN_API_KEY)\n"
            "  --model-id ID            model id clients must name (default: the directory's name)\n"
            "  --alias NAME             another name clients may use for the model; repeatable\n"
            "  --max-tokens N           cap on generated tokens per request (default 1024)\n"
            "  --max-queue N            requests that may wait for a slot before 429 (default 8)\n"
            "  --queue-timeout S        seconds a request may wait for a slot (default 300)\n"
            "  --keepalive S            SSE keep-alive after S idle seconds (default 10)\n"
            "  --max-body BYTES         largest request body (default 4194304)\n"
            "  --max-header BYTES       memory for one request's headers (default %d)\n"
            "  --max-connections N      open connections in total (default 64)\n"
            "  --max-connections-per-ip N (default 16)\n"
            "  --read-timeout S         close a connection idle this long (default 30)\n"
            "  --header-timeout S       close a connection whose request headers are not all in S\n"
            "                           seconds after it opened or its previous request ended (default 30)\n"
            "  --allowed-host NAME      extra Host header value accepted on a loopback bind\n"
            "  --cors-origin ORIGIN     browser origin (scheme://host[:port]) whose pages may call the\n"
            "                           API; repeatable; `*` = any origin. Given at least once, it\n"
            "                           replaces the default list: http://localhost:8000,\n"
            "                           http://127.0.0.1:8000, http://localhost:5173, http://127.0.0.1:5173,\n"
            "                           tauri://localhost, http://tauri.localhost, https://tauri.localhost\n"
            "  --grace S                on SIGTERM, wait this long for requests in flight (default 30)\n"
            "  --reply-ids on|off       remember the exact ids of every generated reply and feed them back\n"
            "                           when the reply returns in a conversation's history, instead of\n"
            "                           re-tokenizing its text (default on; kept under --kv-dir)\n"
            "  --engine PATH            engine binary (default: this cairn)\n"
            "  --allow-insecure-bind    allow a non-loopback bind without --api-key\n"
            "  --no-webui               do not serve the chat page at / (the API alone)\n"
            "  --numerics M, --threads N, --ckpt-mb N, --kv-dir DIR, --kv-share 0|1, --expert-cache-mb N,\n"
            "  --mlock, --spec mtp, --draft K\n"
            "                           passed through to the engine\n",
            DEFAULT_MAX_HEADER);
}

static int is_loopback(const char *host) {
    return !strcmp(host, "localhost") || !strncmp(host, "127.", 4) || !strcmp(host, "::1");
}

/* "*" or scheme://host[:port]: what a browser sends in Origin, so a value with a path or a
 * trailing slash would silently never match. */
static int cors_origin_ok(const char *v) {
    if (!strcmp(v, "*")) return 1;
    const char *host = strstr(v, "://");
    return host && host > v && host[3] && !strchr(host + 3, '/');
}

static int add_cors_origin(serve_opts *o, const char *v) {
    if (!cors_origin_ok(v)) {
        fprintf(stderr, "cairn serve: --cors-origin %s: expected * or scheme://host[:port] (no path)\n", v);
        return -1;
    }
    if (o->n_cors == MAX_CORS_ORIGINS) { fprintf(stderr, "cairn serve: too many --cors-origin\n"); return -1; }
    o->cors_origins[o->n_cors++] = v;
    return 0;
}

static int parse_flags(int argc, char **argv, serve_opts *o) {
    static const char *const passthrough[] = {"--numerics", "--threads", "--ckpt-mb", "--kv-dir", "--kv-share",
                                              "--expert-cache-mb", "--spec", "--draft"};
    *o = (serve_opts){.host = "127.0.0.1", .port = 8080, .slots = 2, .max_tokens = 1024, .max_queue = 8,
                      .max_conn = 64, .max_conn_ip = 16, .read_timeout = 30, .max_header = DEFAULT_MAX_HEADER,
                      .max_body = 4 << 20, .queue_timeout = 300, .keepalive = 10, .grace = 30, .reply_ids = 1,
                      .header_timeout = 30};
    o->api_key = getenv("CAIRN_API_KEY");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        else if (!strcmp(a, "--allow-insecure-bind")) { o->allow_insecure = 1; continue; }
        else if (!strcmp(a, "--no-webui")) { o->no_webui = 1; continue; }
        else if (!strcmp(a, "--mlock")) {
            if (o->n_engine_args + 1 > MAX_ENGINE_ARGS) return -1;
            o->engine_args[o->n_engine_args++] = (char *)a;
            continue;
        }
        if (!v) { fprintf(stderr, "cairn serve: %s needs a value\n", a); return -1; }
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model_dir = v;
        else if (!strcmp(a, "--host")) o->host = v;
        else if (!strcmp(a, "--api-key")) o->api_key = v;
        else if (!strcmp(a, "--model-id")) o->model_id = v;
        else if (!strcmp(a, "--engine")) o->engine_exe = v;
        else if (!strcmp(a, "--port")) rc = cli_int("serve", a, v, 0, 65535, &o->port);
        else if (!strcmp(a, "--slots")) rc = cli_int("serve", a, v, 1, 64, &o->slots);
        else if (!strcmp(a, "--ctx")) rc = cli_int("serve", a, v, 16, 1 << 24, &o->ctx);
        else if (!strcmp(a, "--max-tokens")) rc = cli_int("serve", a, v, 1, 1 << 24, &o->max_tokens);
        else if (!strcmp(a, "--max-queue")) rc = cli_int("serve", a, v, 0, 100000, &o->max_queue);
        else if (!strcmp(a, "--max-body")) rc = cli_int("serve", a, v, 1024, 1L << 30, &o->max_body);
        else if (!strcmp(a, "--max-header")) rc = cli_int("serve", a, v, 4096, 1 << 24, &o->max_header);
        else if (!strcmp(a, "--max-connections")) rc = cli_int("serve", a, v, 1, 100000, &o->max_conn);
        else if (!strcmp(a, "--max-connections-per-ip")) rc = cli_int("serve", a, v, 1, 100000, &o->max_conn_ip);
        else if (!strcmp(a, "--read-timeout")) rc = cli_int("serve", a, v, 1, 86400, &o->read_timeout);
        else if (!strcmp(a, "--queue-timeout")) rc = cli_float("serve", a, v, &o->queue_timeout);
        else if (!strcmp(a, "--keepalive")) rc = cli_float("serve", a, v, &o->keepalive);
        else if (!strcmp(a, "--grace")) rc = cli_float("serve", a, v, &o->grace);
        else if (!strcmp(a, "--header-timeout")) rc = cli_float("serve", a, v, &o->header_timeout);
        else if (!strcmp(a, "--allowed-host")) {
            if (o->n_allowed == MAX_ALLOWED_HOSTS) { fprintf(stderr, "cairn serve: too many --allowed-host\n"); return -1; }
            o->allowed_hosts[o->n_allowed++] = v;
        } else if (!strcmp(a, "--cors-origin")) rc = add_cors_origin(o, v);
        else if (!strcmp(a, "--alias")) {
            if (o->n_aliases == MAX_ALIASES) { fprintf(stderr, "cairn serve: at most %d --alias\n", MAX_ALIASES); return -1; }
            o->aliases[o->n_aliases++] = v;
        }
        else if (!strcmp(a, "--reply-ids")) {
            if (strcmp(v, "on") && strcmp(v, "off")) { fprintf(stderr, "cairn serve: --reply-ids takes on or off\n"); return -1; }
            o->reply_ids = !strcmp(v, "on");
        } else {
            size_t k = 0;
            while (k < sizeof passthrough / sizeof passthrough[0] && strcmp(a, passthrough[k])) k++;
            if (k == sizeof passthrough / sizeof passthrough[0]) {
                fprintf(stderr, "cairn serve: unknown option %s (see cairn serve --help)\n", a);
                return -1;
            }
            if (o->n_engine_args + 2 > MAX_ENGINE_ARGS) return -1;
            if (!strcmp(a, "--kv-dir")) o->kv_dir = v;
            o->engine_args[o->n_engine_args++] = (char *)a;
            o->engine_args[o->n_engine_args++] = (char *)v;
        }
        if (rc) return -1;
    }
    if (!o->model_dir) { fprintf(stderr, "cairn serve: -m DIR is required\n"); usage(stderr); return -1; }
    if (o->queue_timeout <= 0 || o->keepalive <= 0 || o->header_timeout <= 0 || o->grace < 0) {
        fprintf(stderr, "cairn serve: --queue-timeout, --keepalive and --header-timeout must be > 0, --grace >= 0\n");
        return -1;
    }
    o->loopback = is_loopback(o->host);
    if (!o->loopback && !o->api_key && !o->allow_insecure) {
        fprintf(stderr, "cairn serve: refusing to listen on %s without --api-key (pass --allow-insecure-bind to override)\n",
                o->host);
        return -1;
    }
    return 0;
}

/* ---- request checks ------------------------------------------------------------------------ */

/* Constant-time string equality, so a wrong key's timing says nothing about the right one. */
static int secret_equal(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned char diff = na != nb;
    for (size_t i = 0; i < na; i++) diff |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0;
}

static int authorized(const serve_opts *o, struct MHD_Connection *c) {
    if (!o->api_key) return 1;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *xkey = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (auth && !strncasecmp(auth, "Bearer ", 7) && secret_equal(auth + 7, o->api_key)) return 1;
    return xkey && secret_equal(xkey, o->api_key);
}

/* DNS-rebinding guard: on a loopback bind a browser page from elsewhere must not reach us, so
 * the Host header has to name this machine (or an --allowed-host). */
static int host_allowed(const serve_opts *o, struct MHD_Connection *c) {
    if (!o->loopback) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!h) return 1;                      /* HTTP/1.0 without Host: nothing to check */
    char name[256];
    size_t n = 0;
    if (h[0] == '[') {
        const char *end = strchr(h, ']');
        if (!end || (size_t)(end - h) >= sizeof name) return 0;
        n = (size_t)(end - h - 1);
        memcpy(name, h + 1, n);
    } else {
        while (h[n] && h[n] != ':' && n + 1 < sizeof name) { name[n] = (char)tolower((unsigned char)h[n]); n++; }
    }
    name[n] = 0;
    if (is_loopback(name)) return 1;
    for (int i = 0; i < o->n_allowed; i++)
        if (!strcasecmp(name, o->allowed_hosts[i]) || !strcmp(o->allowed_hosts[i], "*")) return 1;
    return 0;
}

/* The chat page (webui.h) calls the API from this server's own origin, http://<Host>. That is
 * trusted only where the Host is: under the loopback Host guard, or behind the API key (on an
 * open non-loopback bind a rebound DNS name would pass for "own origin"). */
static int own_origin(const serve_opts *o, struct MHD_Connection *c, const char *origin) {
    if (!o->loopback && !o->api_key) return 0;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    return host && !strncmp(origin, "http://", 7) && !strcasecmp(origin + 7, host);
}

static api_flavor flavor_of(struct MHD_Connection *c, const char *path) {
    if (!strncmp(path, "/v1/messages", 12)) return API_ANTHROPIC;
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, "anthropic-version") ? API_ANTHROPIC : API_OPENAI;
}

static enum MHD_Result reject(struct MHD_Connection *c, req_ctx *rc, int status, const char *type, const char *code,
                              const char *msg) {
    http_err e;
    http_err_set(&e, status, type, code, NULL, "%s", msg);
    rc->ri->status = status;
    return http_send_error(c, flavor_of(c, rc->path), &e);
}

/* ---- endpoints ----------------------------------------------------------------------------- */

static enum MHD_Result health(server *s, struct MHD_Connection *c, req_ctx *rc) {
    slots_stats st;
    slots_get_stats(s->sc.sl, &st);
    int up = eng_ready(s->sc.engine);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "status", up ? "ok" : "starting");
    cJSON_AddStringToObject(r, "model", s->sc.model_id);
    cJSON *e = cJSON_AddObjectToObject(r, "engine");
    cJSON_AddBoolToObject(e, "up", up);
    cJSON_AddNumberToObject(e, "pid", (double)eng_pid(s->sc.engine));
    cJSON_AddNumberToObject(e, "restarts", eng_restarts(s->sc.engine));
    cJSON *sl = cJSON_AddObjectToObject(r, "slots");
    cJSON_AddNumberToObject(sl, "total", st.n);
    cJSON_AddNumberToObject(sl, "busy", st.busy);
    cJSON_AddNumberToObject(sl, "waiting", st.waiting);
    cJSON_AddNumberToObject(sl, "max_queue", st.max_queue);
    cJSON_AddNumberToObject(sl, "admitted", (double)st.admitted);
    cJSON_AddNumberToObject(sl, "rejected", (double)st.rejected);
    cJSON *rec = cJSON_AddArrayToObject(sl, "record_bytes");
    for (int i = 0; i < st.n; i++) cJSON_AddItemToArray(rec, cJSON_CreateNumber((double)slots_record_len(s->sc.sl, i)));
    rc->ri->status = up ? 200 : 503;
    return http_send_json(c, rc->ri->status, r);
}

static enum MHD_Result metrics_page(server *s, struct MHD_Connection *c, req_ctx *rc) {
    slots_stats st;
    slots_get_stats(s->sc.sl, &st);
    sbuf b = {0};
    metrics_render(s->sc.mx, &b, st.busy, st.n, st.waiting, st.rejected + st.timed_out, eng_ready(s->sc.engine),
                   eng_restarts(s->sc.engine));
    rc->ri->status = 200;
    enum MHD_Result r = http_send_text(c, 200, "text/plain; version=0.0.4", b.p ? b.p : "");
    sbuf_free(&b);
    return r;
}

static enum MHD_Result generate(server *s, struct MHD_Connection *c, req_ctx *rc) {
    if (rc->too_large) return reject(c, rc, 413, "invalid_request_error", "body_too_large", "request body too large");
    int slot_op = !strncmp(rc->path, "/slots/", 7);
    if (slot_op && !rc->body.len) return slot_action(&s->sc, c, rc->path + 7, NULL, rc->ri);   /* erase has none */
    if (!rc->body.len) return reject(c, rc, 400, "invalid_request_error", "invalid_json", "request body is empty");
    const char *end = NULL;
    cJSON *body = cJSON_ParseWithLengthOpts(rc->body.p, rc->body.len, &end, 0);
    if (!body) {
        char msg[96];
        snprintf(msg, sizeof msg, "request body is not valid JSON (error near byte %zu)",
                 end ? (size_t)(end - rc->body.p) : 0);
        return reject(c, rc, 400, "invalid_request_error", "invalid_json", msg);
    }
    enum MHD_Result r;
    if (!strcmp(rc->path, "/v1/chat/completions")) r = openai_chat(&s->sc, c, body, rc->ri);
    else if (!strcmp(rc->path, "/v1/completions")) r = openai_completions(&s->sc, c, body, rc->ri);
    else if (!strcmp(rc->path, "/v1/messages/count_tokens")) r = anthropic_count_tokens(&s->sc, c, body, rc->ri);
    else if (!strcmp(rc->path, "/v1/responses")) r = responses_create(&s->sc, c, body, rc->ri);
    else if (slot_op) r = slot_action(&s->sc, c, rc->path + 7, body, rc->ri);
    else if (!strcmp(rc->path, "/tokenize")) r = info_tokenize(&s->sc, c, body, rc->ri);
    else if (!strcmp(rc->path, "/detokenize")) r = info_detokenize(&s->sc, c, body, rc->ri);
    else r = anthropic_messages(&s->sc, c, body, rc->ri);
    cJSON_Delete(body);
    return r;
}

static const char *const post_paths[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages",
                                         "/v1/messages/count_tokens", "/v1/responses", "/tokenize", "/detokenize"};

static enum MHD_Result route(server *s, struct MHD_Connection *c, req_ctx *rc) {
    int get = !strcmp(rc->method, "GET"), post = !strcmp(rc->method, "POST");
    for (size_t i = 0; i < sizeof post_paths / sizeof post_paths[0]; i++)
        if (!strcmp(rc->path, post_paths[i]))
            return post ? generate(s, c, rc) : reject(c, rc, 405, "invalid_request_error", "method_not_allowed", "use POST");
    if (!strncmp(rc->path, "/slots/", 7))
        return post ? generate(s, c, rc) : reject(c, rc, 405, "invalid_request_error", "method_not_allowed", "use POST");
    wire_caps caps;
    int up = eng_caps(s->sc.engine, &caps) == 0;
    if (!strcmp(rc->path, "/slots") && get) return slot_list(&s->sc, c, up ? &caps : NULL, rc->ri);
    if (!strcmp(rc->path, "/health") && get) return health(s, c, rc);
    if (!strcmp(rc->path, "/metrics") && get) return metrics_page(s, c, rc);
    /* An Anthropic client (it sends anthropic-version) gets the Anthropic model-list shape. */
    api_flavor f = flavor_of(c, rc->path);
    if (!strcmp(rc->path, "/v1/models") && get) {
        rc->ri->status = 200;
        return info_models(&s->sc, c, NULL, f);
    }
    if (!strncmp(rc->path, "/v1/models/", 11) && get) {
        rc->ri->status = info_model_known(&s->sc, rc->path + 11) ? 200 : 404;
        return info_models(&s->sc, c, rc->path + 11, f);
    }
    if (!strncmp(rc->path, "/v1/responses/", 14) && rc->path[14] && (get || !strcmp(rc->method, "DELETE")))
        return responses_by_id(&s->sc, c, rc->path + 14, !get, rc->ri);
    if (!strcmp(rc->path, "/props") && get) {
        rc->ri->status = 200;
        return info_props(&s->sc, c, up ? &caps : NULL);
    }
    return reject(c, rc, 404, "invalid_request_error", "not_found", "no such endpoint");
}

static const char *endpoint_label(const char *path) {
    static const char *const known[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages/count_tokens",
                                        "/v1/messages", "/v1/models", "/v1/responses", "/health", "/metrics", "/props",
                                        "/tokenize", "/detokenize", "/slots"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strncmp(path, known[i], strlen(known[i]))) return known[i];
    return "other";
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    server *s = cls;
    req_ctx *rc = *con_cls;
    if (!rc) {
        rc = xcalloc(1, sizeof *rc);
        rc->ri = req_info_new(now_seconds());
        snprintf(rc->method, sizeof rc->method, "%s", method);
        snprintf(rc->path, sizeof rc->path, "%s", url);
        rc->endpoint = !s->o->no_webui && webui_find(rc->path) ? "/" : endpoint_label(rc->path);
        turn_make_id(rc->id, sizeof rc->id, "req_");
        http_request_id_set(rc->id);
        *con_cls = rc;
        hd_headers_done(s->hd, c);
        __atomic_add_fetch(&s->inflight, 1, __ATOMIC_SEQ_CST);
        /* An announced oversized body is refused before reading it. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > (unsigned long long)s->o->max_body)
            return reject(c, rc, 413, "invalid_request_error", "body_too_large", "request body too large");
        return MHD_YES;
    }
    if (*upload_size) {
        /* A body that outgrows the bound (chunked, or longer than announced) is dropped; it is
         * read on to its end only while that stays cheap, so the client can still get its 413,
         * and the connection is cut beyond that. */
        if (rc->too_large || rc->body.len + *upload_size > (size_t)s->o->max_body) {
            rc->too_large += *upload_size;
            *upload_size = 0;
            return rc->too_large > 4 * (size_t)s->o->max_body ? MHD_NO : MHD_YES;
        }
        sbuf_put(&rc->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    http_request_id_set(rc->id);
    /* Answered after the (bounded) body was read, so the client sees the status rather than a
     * connection reset in the middle of its upload. */
    if (!host_allowed(s->o, c))
        return reject(c, rc, 403, "invalid_request_error", "host_not_allowed", "Host header not allowed");
    /* A page of another site may send a POST its browser does not preflight (text/plain, or
     * after a DNS rebinding): it cannot read the reply, but it would run a turn. Requests that
     * act, from an origin off the CORS list (other than our own page's), are refused;
     * non-browser clients send no Origin. */
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin && strcmp(rc->method, "GET") && strcmp(rc->method, "HEAD") && strcmp(rc->method, "OPTIONS") &&
        !http_origin_allowed(origin) && !own_origin(s->o, c, origin))
        return reject(c, rc, 403, "invalid_request_error", "origin_not_allowed",
                      "requests from this Origin are not allowed (see --cors-origin)");
    /* Browsers never send credentials on a CORS preflight, and it reveals nothing but which
     * methods and headers are allowed, so it comes before the key check. */
    if (!strcmp(rc->method, "OPTIONS")) {
        rc->ri->status = MHD_HTTP_NO_CONTENT;
        return http_send_preflight(c);
    }
    /* The page's files hold no secret, and a browser cannot send a key with a navigation. */
    if (!s->o->no_webui && (!strcmp(rc->method, "GET") || !strcmp(rc->method, "HEAD"))) {
        const webui_asset *a = webui_find(rc->path);
        if (a) {
            rc->ri->status = 200;
            return webui_send(c, a);
        }
    }
    if (strcmp(rc->path, "/health") && !authorized(s->o, c))
        return reject(c, rc, 401, "invalid_request_error", "invalid_api_key", "missing or invalid API key");
    return route(s, c, rc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    server *s = cls;
    req_ctx *rc = *con_cls;
    if (!rc) return;
    req_info *ri = rc->ri;
    int status = ri->status ? ri->status : 499;
    if (why != MHD_REQUEST_TERMINATED_COMPLETED_OK && status == 200) status = 499;   /* client left mid-reply */
    fprintf(stderr, "cairn serve: %s %s %d %.1fms prompt=%d cached=%d completion=%d slot=%d %.1ftok/s id=%s\n",
            rc->method, rc->path, status, (now_seconds() - ri->t0) * 1e3, ri->prompt_tokens, ri->cached_tokens,
            ri->completion_tokens, ri->slot, ri->tok_s, rc->id);
    metrics_request(s->sc.mx, rc->endpoint, status);
    req_info_unref(ri);
    sbuf_free(&rc->body);
    free(rc);
    *con_cls = NULL;
    hd_rearm(s->hd, c);
    __atomic_sub_fetch(&s->inflight, 1, __ATOMIC_SEQ_CST);
}

/* ---- start-up and shutdown ----------------------------------------------------------------- */

/* Bind and listen on --host:--port. Done before the engine starts, so a busy port fails at
 * once; connections wait in the backlog until the HTTP daemon takes the socket over. */
static int listen_on(const char *host, long port, int *bound_port, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res;
    char ps[8];
    snprintf(ps, sizeof ps, "%ld", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc) return errf(err, errlen, "cannot resolve --host %s: %s", host, gai_strerror(rc));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) || listen(fd, 128)) {
        freeaddrinfo(res);
        if (fd >= 0) close(fd);
        return errf(err, errlen, "cannot listen on %s:%ld: %s", host, port, strerror(errno));
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

/* Reply ids belong to the tokenizer that produced them: a file under --kv-dir written with
 * another tokenizer.json is not trusted. */
static uint64_t tokenizer_hash(const char *path) {
    size_t n = 0;
    char err[256];
    char *p = read_file(path, &n, err, sizeof err);
    uint64_t h = p ? fnv64(FNV64_INIT, p, n) : 0;
    free(p);
    return h;
}

/* Every added token (official tokenizers mark some role markers non-special, so not only the
 * special ones), longest first so a marker is removed before one it contains. */
static int longer_first(const void *a, const void *b) {
    size_t x = strlen(*(char *const *)a), y = strlen(*(char *const *)b);
    return (x < y) - (x > y);
}

static void collect_specials(serve_ctx *sc) {
    int n = tok_added_count(sc->tok);
    sc->specials = xcalloc((size_t)(n ? n : 1), sizeof *sc->specials);
    for (int i = 0; i < n; i++)
        if (*tok_added_text(sc->tok, i)) sc->specials[sc->nspecials++] = xstrdup(tok_added_text(sc->tok, i));
    qsort(sc->specials, (size_t)sc->nspecials, sizeof *sc->specials, longer_first);
}

static void forget_records(void *user) { slots_forget_all(((server *)user)->sc.sl); }

/* The start-up banner, once the engine says what it runs (and again after a restart). */
/* on_caps: runs on the engine dispatcher thread, which may get here before eng_start has returned
 * (s->sc.engine not yet set), so everything it prints comes from `caps` and the options. */
static void banner(void *user, const wire_caps *caps) {
    server *s = user;
    fprintf(stderr,
            "cairn serve: ready at http://%s:%d\n"
            "  model     %s (%s)\n"
            "  context   %d tokens per slot, %d slots\n"
            "  numerics  %s; reply ids %s%s%s\n",
            s->o->host, s->port, s->sc.model_id, s->sc.family, caps->ctx, caps->slots, caps->numerics,
            s->sc.replies ? "on" : "off", s->o->kv_dir ? ", kv-dir " : "", s->o->kv_dir ? s->o->kv_dir : "");
}

/* A resumed slot's text is the decode of its ids, raw bytes and all; the client saw (and sends
 * back in its history) U+FFFD for bytes that are not UTF-8, so that is the text routing compares
 * prompts with. Raw, a reply with one such byte made the conversation miss its slot. */
static void learn_record(void *user, int slot, const char *text, size_t n) {
    size_t len = 0;
    char *clean = utf8_clean(text, n, &len);
    slots_learn(((server *)user)->sc.sl, slot, clean, clean ? len : 0);
    free(clean);
}

/* The engine could not start at all: stop the server the same way a SIGTERM would. */
static void engine_start_failed(void *user) {
    (void)user;
    kill(getpid(), SIGTERM);
}

static char **engine_argv(const serve_opts *o, const char *exe) {
    char **argv = xcalloc(12 + (size_t)o->n_engine_args, sizeof *argv);
    int n = 0;
    char num[32];
    argv[n++] = xstrdup(exe);
    argv[n++] = xstrdup("engine");
    argv[n++] = xstrdup("-m");
    argv[n++] = xstrdup(o->model_dir);
    argv[n++] = xstrdup("--slots");
    snprintf(num, sizeof num, "%ld", o->slots);
    argv[n++] = xstrdup(num);
    if (o->ctx) {
        argv[n++] = xstrdup("--ctx");
        snprintf(num, sizeof num, "%ld", o->ctx);
        argv[n++] = xstrdup(num);
    }
    for (int i = 0; i < o->n_engine_args; i++) argv[n++] = xstrdup(o->engine_args[i]);
    return argv;
}

static void free_argv(char **argv) {
    for (char **a = argv; *a; a++) free(*a);
    free(argv);
}

/* Wait (up to grace seconds) until every request begun has been answered completely (a stream
 * to its last byte) and no slot is busy. */
static void drain(server *s, double grace) {
    double deadline = now_seconds() + grace;
    for (;;) {
        slots_stats st;
        slots_get_stats(s->sc.sl, &st);
        int inflight = __atomic_load_n(&s->inflight, __ATOMIC_SEQ_CST);
        if ((st.busy == 0 && st.waiting == 0 && inflight == 0) || now_seconds() >= deadline) return;
        usleep(50 * 1000);
    }
}

/* Block until SIGTERM or SIGINT, giving freed heap pages back to the kernel every few seconds
 * meanwhile: glibc returns only the top of the heap by itself, and the pages freed between
 * live blocks by hundreds of connection threads would otherwise stay in the RSS for good. */
static int wait_for_signal(const sigset_t *sigs) {
    const struct timespec every = {.tv_sec = 5};
    for (;;) {
        int sig = sigtimedwait(sigs, NULL, &every);
        if (sig > 0) return sig;
        malloc_trim(0);
    }
}

static struct MHD_Daemon *start_http(server *s, int listen_fd) {
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC;
    return MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s,
        MHD_OPTION_LISTEN_SOCKET, listen_fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o->max_conn,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->o->max_conn_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->o->read_timeout,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)s->o->max_header,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, hd_notify, s->hd,
        MHD_OPTION_END);
}

/* Everything cmd_serve sets up, torn down in one place whatever step failed. */
static void teardown(server *s, struct MHD_Daemon *d, char **eargv, int lfd) {
    serve_ctx *sc = &s->sc;
    if (sc->sl) slots_close(sc->sl);
    if (sc->engine) eng_stop(sc->engine, 5.0);
    if (d) MHD_stop_daemon(d);
    else if (lfd >= 0) close(lfd);
    hd_free(s->hd);
    if (eargv) free_argv(eargv);
    if (sc->sl) slots_free(sc->sl);
    if (sc->mx) metrics_free(sc->mx);
    if (sc->tok) tok_free(sc->tok);
    replies_close(sc->replies);
    responses_free(sc->responses);
    for (int i = 0; i < sc->nspecials; i++) free(sc->specials[i]);
    free(sc->specials);
    free(s->model_dir_copy);
}

int cmd_serve(int argc, char **argv) {
    serve_opts o;
    if (parse_flags(argc, argv, &o)) return 2;
    /* glibc's per-thread caches and arenas would keep memory for each of hundreds of connection
     * threads (malloc_tune.h; docs/reliability.md §4). Before any thread starts. */
    malloc_tune_exec(argc, argv);
    malloc_tune_process();
    char err[512];
    server s = {.o = &o};
    serve_ctx *sc = &s.sc;
    struct MHD_Daemon *d = NULL;
    char **eargv = NULL;
    int lfd = -1, port = 0;
    const family_ops *fam = family_of_dir(o.model_dir, err, sizeof err);
    if (!fam) goto fail;
    sc->family = fam->name;
    s.model_dir_copy = xstrdup(o.model_dir);
    sc->model_id = o.model_id ? o.model_id : basename(s.model_dir_copy);
    sc->model_dir = o.model_dir;
    sc->aliases = o.aliases;
    sc->naliases = o.n_aliases;
    sc->tpl = fam->chat;
    sc->nslots = (int)o.slots;
    sc->max_tokens = (int)o.max_tokens;
    sc->queue_timeout = o.queue_timeout;
    sc->keepalive = o.keepalive;
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", o.model_dir);
    sc->tok = access(tok_path, R_OK) == 0 ? tok_load(tok_path, err, sizeof err) : NULL;
    if (!sc->tpl)
        fprintf(stderr, "cairn serve: family %s has no chat template: only /v1/completions works\n", sc->family);
    /* the reply-id file lives beside the engine's slot files: the directory exists before either
     * opens it (mode 0700, as the engine makes it: both hold conversations) */
    if (o.kv_dir && mkdir(o.kv_dir, 0700) && errno != EEXIST) {
        errf(err, sizeof err, "--kv-dir %s: %s", o.kv_dir, strerror(errno));
        goto fail;
    }
    if (o.reply_ids && sc->tok) sc->replies = replies_open(o.kv_dir, tokenizer_hash(tok_path));
    if (sc->tok) collect_specials(sc);
    sc->responses = responses_new();

    /* Signals are taken by sigwait below; every thread inherits the blocked mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    http_cors_allow(o.cors_origins, o.n_cors);
    sc->sl = slots_new(sc->nslots, (int)o.max_queue);
    sc->mx = metrics_new();
    if (!(s.hd = hd_new(o.header_timeout, sc->mx))) {
        snprintf(err, sizeof err, "cannot start the header-deadline thread");
        goto fail;
    }
    if ((lfd = listen_on(o.host, o.port, &port, err, sizeof err)) < 0) goto fail;
    eargv = engine_argv(&o, o.engine_exe ? o.engine_exe : "/proc/self/exe");
    s.port = port;
    eng_config ec = {.exe = eargv[0], .argv = eargv, .ready_timeout = 600, .on_restart = forget_records,
                     .on_record = learn_record, .on_start_failed = engine_start_failed, .on_caps = banner, .user = &s};
    if (!(sc->engine = eng_start(&ec, err, sizeof err))) goto fail;
    if (!(d = start_http(&s, lfd))) {
        snprintf(err, sizeof err, "cannot start the HTTP server on %s:%d", o.host, port);
        goto fail;
    }
    fprintf(stderr, "cairn serve: listening on http://%s:%d (model %s, %ld slots)\n", o.host, port, sc->model_id, o.slots);

    int sig = wait_for_signal(&sigs);
    if (!eng_start_failed(sc->engine))
        fprintf(stderr, "cairn serve: %s: finishing requests in flight, then stopping\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    MHD_socket lsock = MHD_quiesce_daemon(d);
    if (lsock != MHD_INVALID_SOCKET) close(lsock);
    int engine_failed = eng_start_failed(sc->engine);
    if (engine_failed) snprintf(err, sizeof err, "the engine failed to start (its messages are above)");
    else drain(&s, o.grace);
    teardown(&s, d, eargv, -1);
    if (engine_failed) {
        fprintf(stderr, "cairn serve: %s\n", err);
        return 1;
    }
    fprintf(stderr, "cairn serve: stopped\n");
    return 0;
fail:
    fprintf(stderr, "cairn serve: %s\n", err);
    teardown(&s, d, eargv, lfd);
    return 1;
}
