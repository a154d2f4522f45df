#include "turn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "../core/util.h"
#include "wire.h"

void turn_req_free(turn_req *rq) {
    free(rq->prompt);
    free(rq->grammar);
    free(rq->ids);
    free(rq->bias.ids);
    free(rq->bias.vals);
    free(rq->untrusted);
    free(rq->media);
    for (int i = 0; i < rq->nstops; i++) free(rq->stops[i]);
    memset(rq, 0, sizeof *rq);
}

/* n bytes of p and a NUL after them (NULL stays NULL). */
static void *dup_bytes(const void *p, size_t n) {
    if (!p) return NULL;
    char *d = xmalloc(n + 1);
    memcpy(d, p, n);
    d[n] = 0;
    return d;
}

void turn_req_copy(turn_req *dst, const turn_req *src) {
    *dst = *src;
    dst->prompt = dup_bytes(src->prompt, src->prompt_len);
    dst->ids = dup_bytes(src->ids, src->ids_len);
    dst->grammar = dup_bytes(src->grammar, src->grammar_len);
    dst->media = dup_bytes(src->media, src->media_len);
    dst->bias.ids = dup_bytes(src->bias.ids, sizeof *src->bias.ids * (size_t)src->bias.n);
    dst->bias.vals = dup_bytes(src->bias.vals, sizeof *src->bias.vals * (size_t)src->bias.n);
    dst->untrusted = dup_bytes(src->untrusted, sizeof *src->untrusted * (size_t)src->nuntrusted);
    for (int i = 0; i < src->nstops; i++) dst->stops[i] = xstrdup(src->stops[i]);
}

/* What on_finish needs after the HTTP side may already be gone. */
typedef struct {
    serve_ctx *sc;
    int slot;
    char *prompt;
    size_t prompt_len;
} finish_ctx;

/* Engine dispatcher thread: the request is over for the engine. Free the slot, remembering what
 * its state now holds so the conversation's next turn finds it: the prompt and the reply as the
 * client saw it (invalid UTF-8 as U+FFFD), which is how the reply comes back in its history. */
static void on_finish(gen *g, void *user) {
    finish_ctx *f = user;
    int keep = g->status == GEN_DONE || (g->status == GEN_ERROR && !strncmp(g->error, "CANCELLED", 9));
    if (keep) {
        size_t len = 0;
        char *data = utf8_clean(g->data ? g->data : "", g->data_len, &len);
        char *rec = data ? malloc(f->prompt_len + len + 1) : NULL;
        if (rec) {
            memcpy(rec, f->prompt, f->prompt_len);
            memcpy(rec + f->prompt_len, data, len);
        }
        slots_release(f->sc->sl, f->slot, rec, rec ? f->prompt_len + len : 0);
        free(data);
        free(rec);
    } else {
        slots_release(f->sc->sl, f->slot, NULL, 0);   /* a failed turn taints the engine's state */
    }
    if (g->status == GEN_DONE)
        metrics_generation(f->sc->mx, g->prompt_tokens, g->reuse, g->completion_tokens, g->prefill_s);
    free(f->prompt);
    free(f);
}

static int conn_gone(void *conn) { return conn && http_client_gone(conn); }

static int remembers(const turn *t) { return t->sc->replies && t->sc->tok && t->sc->tpl && t->rq->chat; }

/* The request as SUBMIT fields and keys (wire.h wire_fmt_submit writes the header). span_bytes:
 * the untrusted span table's (text prompts only; spliced ids were encoded here). */
static wire_submit submit_fields(const turn *t, int slot, size_t span_bytes) {
    const turn_req *rq = t->rq;
    int prefix = rq->ids ? (rq->ids_prefix ? (int)rq->ids_prefix : -1)
                         : (rq->prefix_bytes && !rq->prompt_is_ids ? (int)rq->prefix_bytes : -1);
    return (wire_submit){
        .slot = slot, .max_tokens = rq->max_tokens, .temperature = (float)rq->temperature, .top_p = (float)rq->top_p,
        .prefix_bytes = prefix, .logprobs = rq->logprobs ? MAX(1, rq->top_logprobs) : 0,
        .ids = rq->prompt_is_ids || rq->ids != NULL,
        .tokids = remembers(t) || rq->logprobs,      /* ids: for replies, and a logprob's raw bytes */
        .seed = rq->seed, .has_seed = 1, .top_k = rq->top_k, .min_p = (float)rq->min_p,
        .repetition = (float)rq->repetition, .presence = (float)rq->presence, .frequency = (float)rq->frequency,
        .untrusted_bytes = span_bytes, .grammar_bytes = rq->grammar_len, .has_grammar_bytes = rq->grammar != NULL,
        .think_budget = rq->think_budget};
}

static int admit(turn *t, const char *text, size_t len, http_err *e) {
    serve_ctx *sc = t->sc;
    int slot = -1;
    slot_request want = {text, len, t->rq->pinned_slot, t->rq->slot_owner};
    int rc = slots_acquire(sc->sl, &want, sc->queue_timeout, conn_gone, t->conn, &slot);
    if (rc == SLOTS_OK) return slot;
    if (rc == SLOTS_FULL) {
        http_err_set(e, 429, "rate_limit_error", "queue_full", NULL, "all %d slots are busy and the queue is full; retry shortly", sc->nslots);
        e->retry_after = 1;
    } else if (rc == SLOTS_TIMEOUT) {
        http_err_set(e, 429, "rate_limit_error", "queue_timeout", NULL, "waited %.0f s for a free slot", sc->queue_timeout);
        e->retry_after = 1;
    } else if (rc == SLOTS_GONE) {
        http_err_set(e, 499, "client_closed", NULL, NULL, "client closed the connection while queued");
    } else {
        http_err_set(e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
    }
    return -1;
}

int turn_begin(turn *t, serve_ctx *sc, turn_req *rq, struct MHD_Connection *conn, double t0, http_err *e) {
    memset(t, 0, sizeof *t);
    t->sc = sc;
    t->rq = rq;
    t->conn = conn;
    t->t0 = t0;
    t->status = -1;
    reply_init(&t->out, rq->stops, rq->nstops, rq->chat);
    size_t text_len = 0;
    char *text = turn_prompt_text(sc, rq, &text_len);
    int slot = admit(t, text, text_len, e);
    if (slot < 0) {
        free(text);
        return -1;
    }

    finish_ctx *f = xcalloc(1, sizeof *f);
    f->sc = sc;
    f->slot = slot;
    f->prompt = text;
    f->prompt_len = text_len;
    t->g = gen_new(on_finish, f);

    char err[200];
    sbuf ext = {0};
    if (!rq->ids) wire_fmt_spans(&ext, rq->untrusted, rq->nuntrusted);
    wire_submit ws = submit_fields(t, slot, ext.len);
    /* after the span table: the grammar, then a media family's frames */
    if (rq->grammar) sbuf_put(&ext, rq->grammar, rq->grammar_len);
    if (rq->media_len) sbuf_put(&ext, rq->media, rq->media_len);
    const char *payload = rq->ids ? rq->ids : rq->prompt;
    size_t payload_len = rq->ids ? rq->ids_len : rq->prompt_len;
    int bad = eng_submit(sc->engine, t->g, &ws, rq->bias.n ? &rq->bias : NULL, payload, payload_len, ext.p, ext.len,
                         sc->queue_timeout, err, sizeof err);
    sbuf_free(&ext);
    if (bad) {
        slots_release(sc->sl, slot, NULL, 0);
        free(f->prompt);
        free(f);
        return http_err_set(e, 503, "server_error", "engine_unavailable", NULL, "%s", err);
    }
    /* Answer headers only once the engine accepted, so a refusal is still a clean 4xx. */
    gen *g = t->g;
    pthread_mutex_lock(&g->mu);
    while (!g->accepted && !g->finished) {
        pthread_mutex_unlock(&g->mu);
        int r = turn_wait(t, 0.1);
        pthread_mutex_lock(&g->mu);
        if (r == TURN_GONE) {
            pthread_mutex_unlock(&g->mu);
            return http_err_set(e, 499, "client_closed", NULL, NULL, "client closed the connection");
        }
    }
    int failed = g->finished && g->status == GEN_ERROR;
    if (!t->prompt_tokens) t->prompt_tokens = g->prompt_tokens;
    t->reused = g->reuse;
    pthread_mutex_unlock(&g->mu);
    if (failed) {
        turn_wait(t, 0);
        turn_error(t, e);
        return -1;
    }
    return 0;
}

/* Keep a frame's logprobs and bytes for the logprob tables. */
static void keep_token(turn *t, const eng_token *k, const char *bytes) {
    if (t->ntoks == t->toks_cap) {
        t->toks_cap = t->toks_cap ? 2 * t->toks_cap : 64;
        t->toks = xrealloc(t->toks, sizeof *t->toks * (size_t)t->toks_cap);
    }
    eng_token *c = &t->toks[t->ntoks++];
    *c = *k;
    c->off = t->raw.len;
    sbuf_put(&t->raw, bytes, k->len);
}

/* Move new DATA frames into the reply. Called with g->mu held. */
static int absorb(turn *t) {
    gen *g = t->g;
    int grew = t->ntoks_seen < g->ntoks;
    for (; t->ntoks_seen < g->ntoks; t->ntoks_seen++) {
        eng_token *k = &g->toks[t->ntoks_seen];
        if (t->rq->logprobs) keep_token(t, k, g->data + k->off);
        if (k->tok >= 0) {
            if (t->nids == t->ids_cap) {
                t->ids_cap = t->ids_cap ? 2 * t->ids_cap : 64;
                t->ids = xrealloc(t->ids, sizeof *t->ids * (size_t)t->ids_cap);
            }
            t->ids[t->nids++] = k->tok;
        }
        if (reply_feed(&t->out, g->data + k->off, k->len)) {
            pthread_mutex_unlock(&g->mu);
            eng_stop_gen(t->sc->engine, g);
            pthread_mutex_lock(&g->mu);
        }
    }
    if (grew && t->t_first == 0) {
        t->t_first = now_seconds();
        metrics_ttft(t->sc->mx, t->t_first - t->t0);
    }
    return grew;
}

static void capture_end(turn *t) {
    gen *g = t->g;
    t->status = (int)g->status;
    t->prompt_tokens = g->prompt_tokens;
    t->completion_tokens = g->completion_tokens;
    t->reused = g->reuse;
    t->length_limited = g->length_limited;
    t->prefill_s = g->prefill_s;
    t->tok_s = g->tok_s;
    snprintf(t->error, sizeof t->error, "%s", g->error);
    reply_finish(&t->out);
}

/* Does the text the client saw start with the cleaned decode of ids[0..k)? (The client sees
 * invalid UTF-8 as U+FFFD.) *len gets that text's length. */
static int covers(const turn *t, int k, size_t *len) {
    size_t n = 0;
    char *raw = tok_decode(t->sc->tok, t->ids, k, &n);
    char *clean = raw ? utf8_clean(raw, n, len) : NULL;
    int ok = clean && *len <= t->out.len && !memcmp(clean, t->out.text, *len);
    free(raw);
    free(clean);
    return ok;
}

/* The assistant message as the client was given it (and sends it back in a history). */
static cJSON *reply_message(const chat_reply *cr) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", cr->content ? cr->content : "");
    if (cr->reasoning && *cr->reasoning) cJSON_AddStringToObject(m, "reasoning_content", cr->reasoning);
    if (cr->tool_calls && cJSON_GetArraySize(cr->tool_calls))
        cJSON_AddItemToObject(m, "tool_calls", cJSON_Duplicate(cr->tool_calls, 1));
    return m;
}

/* How many of the last ids spell the start of what the template writes after the reply (an
 * end-of-message marker the model wrote itself): those the history gets from the template. */
static int template_wrote(const tokenizer *tok, const int *ids, int n, const char *after) {
    int drop = 0;
    for (int j = 1; j <= n; j++) {
        size_t len = 0;
        char *text = tok_decode(tok, ids + n - j, j, &len);
        int starts = text && len && !strncmp(after, text, len);
        free(text);
        if (!starts) break;
        drop = j;
    }
    return drop;
}

/* Keep the reply's exact ids for when it comes back in the history, under the text the
 * template renders for it: all of them when they make the whole text the client saw; after a
 * stop string, the longest run whose text the client saw, then the canonical ids of the rest of
 * that text. Nothing when the engine sent no ids or the reply was in thinking mode. */
static void remember_reply(turn *t) {
    serve_ctx *sc = t->sc;
    if (!remembers(t) || t->rq->thinking || t->status != GEN_DONE || t->nids == 0 || t->nids != t->completion_tokens)
        return;
    size_t len = 0;
    int k = t->nids;
    if (t->out.stopped)
        while (k > 0 && !covers(t, k, &len)) k--;
    else if (!covers(t, k, &len) || len != t->out.len)
        return;
    int cap = k + (int)(t->out.len - len) + 16;
    int *ids = xmalloc(sizeof(int) * (size_t)cap);
    memcpy(ids, t->ids, sizeof(int) * (size_t)k);
    char err[128];
    tok_span whole = {0, t->out.len - len};   /* client-visible text: encoded as plain text, as the template marks it */
    int rest = len < t->out.len ? tok_encode_untrusted(sc->tok, t->out.text + len, whole.len, &whole, 1, ids + k, cap - k,
                                                       err, sizeof err)
                                : 0;
    chat_reply cr;
    turn_parse(t, &cr);
    cJSON *msg = reply_message(&cr);
    chat_opts o = {0};
    size_t n = 0;
    char *after = NULL, *text = rest >= 0 && k + rest <= cap ? replies_rendered(sc->tpl, msg, &o, &n, &after) : NULL;
    int kept = text ? k + rest - template_wrote(sc->tok, ids, k + rest, after) : 0;
    if (kept > 0) replies_put(sc->replies, text, n, ids, kept);
    free(after);
    free(text);
    cJSON_Delete(msg);
    chat_reply_free(&cr);
    free(ids);
}

int turn_wait(turn *t, double wait) {
    gen *g = t->g;
    double deadline = now_seconds() + wait;
    int grew = 0;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        grew |= absorb(t);
        if (g->finished) {
            int first = t->status < 0;
            capture_end(t);
            pthread_mutex_unlock(&g->mu);
            if (first) remember_reply(t);
            return TURN_DONE;
        }
        if (grew) break;
        double left = deadline - now_seconds();
        if (left <= 0) break;
        pthread_mutex_unlock(&g->mu);
        if (conn_gone(t->conn)) return TURN_GONE;
        pthread_mutex_lock(&g->mu);
        if (g->ntoks != t->ntoks_seen || g->finished) continue;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = (long)(MIN(left, 0.1) * 1e9);
        ts.tv_nsec += ns;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
    return grew ? TURN_PROGRESS : TURN_IDLE;
}

int turn_run(turn *t) {
    for (;;) {
        int r = turn_wait(t, 0.25);
        if (r == TURN_DONE || r == TURN_GONE) return r;
    }
}

int turn_complete(turn *t, http_err *e) {
    if (turn_run(t) == TURN_GONE)
        return http_err_set(e, 499, "client_closed", NULL, NULL, "client closed the connection");
    if (t->status == GEN_ERROR) {
        turn_error(t, e);
        return -1;
    }
    return 0;
}

void turn_end(turn *t) {
    if (t->g) {
        if (t->status < 0) eng_cancel(t->sc->engine, t->g);
        gen_unref(t->g);
        t->g = NULL;
    }
    reply_free(&t->out);
    free(t->toks);
    t->toks = NULL;
    free(t->ids);
    t->ids = NULL;
    sbuf_free(&t->raw);
}

char *turn_prompt_text(const serve_ctx *sc, const turn_req *rq, size_t *len) {
    const char *ids_text = rq->ids ? rq->ids : rq->prompt_is_ids ? rq->prompt : NULL;
    if (!ids_text || !sc->tok) {
        *len = ids_text ? strlen(ids_text) : rq->prompt_len;
        return dup_bytes(ids_text ? ids_text : rq->prompt, *len);
    }
    int n = 0, *ids = xmalloc(sizeof(int) * (strlen(ids_text) / 2 + 1));
    for (const char *p = ids_text; *p;) {
        char *end;
        ids[n++] = (int)strtol(p, &end, 10);
        p = *end ? end + 1 : end;
    }
    size_t raw_len = 0;
    char *raw = tok_decode(sc->tok, ids, n, &raw_len);
    char *clean = utf8_clean(raw ? raw : "", raw ? raw_len : 0, len);
    free(raw);
    free(ids);
    return clean;
}

long turn_count_tokens(const serve_ctx *sc, const turn_req *rq, http_err *e) {
    if (rq->ids || rq->prompt_is_ids) {
        const char *p = rq->ids ? rq->ids : rq->prompt;
        long n = *p != 0;
        for (; *p; p++) n += *p == ' ';
        return n;
    }
    if (!sc->tok)
        return http_err_set(e, 400, "invalid_request_error", "unsupported_model", NULL,
                            "this model has no usable tokenizer.json: tokens cannot be counted");
    char err[128];
    int n = tok_encode_untrusted(sc->tok, rq->prompt, rq->prompt_len, rq->untrusted, rq->nuntrusted, NULL, 0, err,
                                 sizeof err);
    if (n < 0) return http_err_set(e, 400, "invalid_request_error", "invalid_value", "messages", "cannot tokenize: %s", err);
    return n;
}

void turn_error(const turn *t, http_err *e) {
    const char *m = t->error;
    long used = 0, limit = 0;
    if (!strncmp(m, "CONTEXT_EXCEEDED", 16)) {
        if (sscanf(m, "CONTEXT_EXCEEDED %ld %ld", &used, &limit) == 2)
            http_err_set(e, 400, "invalid_request_error", "context_length_exceeded", "messages",
                         "the prompt needs %ld tokens but the context holds %ld", used, limit);
        else
            http_err_set(e, 400, "invalid_request_error", "context_length_exceeded", "messages",
                         "the prompt does not fit the context (%s)", m);
    } else if (!strncmp(m, "BAD_REQUEST", 11) || !strncmp(m, "EMPTY_PROMPT", 12)) {
        http_err_set(e, 400, "invalid_request_error", "invalid_value", "prompt", "the engine refused the prompt: %s", m);
    } else if (!strncmp(m, "CANCELLED", 9)) {
        http_err_set(e, 499, "client_closed", NULL, NULL, "request cancelled");
    } else if (!strcmp(m, "engine exited")) {
        http_err_set(e, 503, "server_error", "engine_restarted",
                     NULL, "the engine exited while generating this reply; it is being restarted, retry the request");
    } else {
        http_err_set(e, 500, "server_error", "engine_error", NULL, "engine error: %s", m);
    }
}

/* Remove every spelling of an added token from s in place: a model may emit role markers or
 * other control tokens inside its answer, and they are the template's, not text for a client. */
static void strip_specials(const serve_ctx *sc, char *s) {
    if (!s) return;
    for (int i = 0; i < sc->nspecials; i++) {
        size_t n = strlen(sc->specials[i]);
        char *at;
        while ((at = strstr(s, sc->specials[i]))) memmove(at, at + n, strlen(at + n) + 1);
    }
}

void turn_parse(const turn *t, chat_reply *cr) {
    memset(cr, 0, sizeof *cr);
    const chat_template *tpl = t->sc->tpl;
    if (t->rq->chat && tpl && tpl->parse) {
        tpl->parse(t->out.text, t->out.stable, t->rq->thinking, cr);
        strip_specials(t->sc, cr->content);
        strip_specials(t->sc, cr->reasoning);
        return;
    }
    cr->content = xmalloc(t->out.stable + 1);
    memcpy(cr->content, t->out.text, t->out.stable);
    cr->content[t->out.stable] = 0;
}

const char *turn_finish_reason(const turn *t, int has_tool_calls) {
    if (t->length_limited && !t->out.stopped) return "length";
    if (has_tool_calls) return "tool_calls";
    return "stop";
}

char *turn_token_text(const turn *t, int id) {
    if (t->sc->tok && id >= 0 && id < tok_vocab_size(t->sc->tok)) {
        size_t n = 0;
        char *raw = tok_decode(t->sc->tok, &id, 1, &n);
        if (raw) {
            char *clean = utf8_clean(raw, n, NULL);
            free(raw);
            return clean;
        }
    }
    char buf[32];
    snprintf(buf, sizeof buf, "<token_id:%d>", id);
    return xstrdup(buf);
}

void turn_make_id(char *out, size_t cap, const char *prefix) {
    unsigned char r[12];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        double t = now_seconds();
        for (size_t i = 0; i < sizeof r; i++) r[i] = (unsigned char)((uint64_t)(t * 1e9) >> (i * 5));
    }
    int n = snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof r && (size_t)n + 2 < cap; i++) n += snprintf(out + n, cap - (size_t)n, "%02x", r[i]);
}

req_info *req_info_new(double t0) {
    req_info *ri = xcalloc(1, sizeof *ri);
    ri->refs = 1;
    ri->t0 = t0;
    ri->slot = -1;
    return ri;
}

void req_info_ref(req_info *ri) { __atomic_add_fetch(&ri->refs, 1, __ATOMIC_SEQ_CST); }

void req_info_unref(req_info *ri) {
    if (__atomic_sub_fetch(&ri->refs, 1, __ATOMIC_SEQ_CST) == 0) free(ri);
}

void turn_summarize(const turn *t, req_info *ri) {
    ri->prompt_tokens = t->prompt_tokens;
    ri->cached_tokens = t->reused;
    ri->completion_tokens = t->completion_tokens;
    ri->slot = -1;
    ri->tok_s = 0;
    if (!t->g) return;
    pthread_mutex_lock(&t->g->mu);
    ri->slot = t->g->slot;
    ri->tok_s = t->g->tok_s;
    pthread_mutex_unlock(&t->g->mu);
}
