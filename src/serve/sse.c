#include "sse.h"

#include <stdlib.h>
#include <string.h>

#include "../core/util.h"

void sse_data(sbuf *out, cJSON *json) {
    char *s = cJSON_PrintUnformatted(json);
    cJSON_Delete(json);
    sbuf_puts(out, "data: ");
    if (s) sbuf_puts(out, s);
    sbuf_puts(out, "\n\n");
    free(s);
}

void sse_event(sbuf *out, const char *name, cJSON *json) {
    sbuf_printf(out, "event: %s\n", name);
    sse_data(out, json);
}

int sse_wait(turn *t, double *last_write, sbuf *out, const char *keepalive_text) {
    for (;;) {
        int r = turn_wait(t, 0.1);
        if (r == TURN_DONE || r == TURN_GONE) return r;
        /* Tokens may be arriving yet all held back (a tool call being written): still keep alive. */
        if (now_seconds() - *last_write >= t->sc->keepalive) {
            sbuf_puts(out, keepalive_text);
            *last_write = now_seconds();
            return TURN_IDLE;
        }
        if (r == TURN_PROGRESS) return r;
    }
}

/* The part of `now` beyond what `sent` holds, if `now` extends it; "" otherwise. */
static char *extension(sbuf *sent, const char *now) {
    size_t n = now ? strlen(now) : 0;
    if (n <= sent->len || (sent->len && memcmp(now, sent->p, sent->len))) return xstrdup("");
    char *d = xstrdup(now + sent->len);
    sbuf_put(sent, now + sent->len, n - sent->len);
    return d;
}

void sse_deltas(const turn *t, sse_sent *sent, char **reasoning, char **content, chat_reply *cr) {
    turn_parse(t, cr);
    *reasoning = extension(&sent->reasoning, cr->reasoning);
    *content = extension(&sent->content, cr->content);
}

void sse_sent_free(sse_sent *s) {
    sbuf_free(&s->reasoning);
    sbuf_free(&s->content);
}

void api_call_end(api_call *c) {
    turn_summarize(&c->t, c->ri);
    turn_end(&c->t);
    turn_req_free(&c->rq);
    sse_sent_free(&c->sent);
    req_info_unref(c->ri);
}

void sse_error(sbuf *out, const turn *t, api_flavor f) {
    http_err e;
    turn_error(t, &e);
    char *body = http_err_body(&e, f);
    sbuf_printf(out, f == API_ANTHROPIC ? "event: error\ndata: %s\n\n" : "data: %s\n\n", body);
    /* the stream still ends the way clients wait for */
    sbuf_puts(out, f == API_ANTHROPIC ? "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n" : "data: [DONE]\n\n");
    free(body);
}
