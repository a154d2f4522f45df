#include "engine_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../core/util.h"
#include "wire.h"

#define ENG_LINE_MAX 8192        /* longest header line we accept from the engine */
#define ENG_PAYLOAD_MAX 65536    /* protocol.md §1.4: the server enforces 0 <= n <= 65536 */

/* ---- generations ------------------------------------------------------------------------- */

gen *gen_new(gen_finish_fn on_finish, void *user) {
    gen *g = xcalloc(1, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->refs = 1;
    g->slot = -1;
    g->on_finish = on_finish;
    g->user = user;
    return g;
}

void gen_ref(gen *g) {
    pthread_mutex_lock(&g->mu);
    g->refs++;
    pthread_mutex_unlock(&g->mu);
}

void gen_unref(gen *g) {
    pthread_mutex_lock(&g->mu);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (!last) return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->data);
    free(g->toks);
    free(g);
}

/* ---- the engine link ----------------------------------------------------------------------- */

struct eng {
    eng_config cfg;
    pthread_t dispatcher;
    pthread_mutex_t mu;           /* guards everything below except the write side */
    pthread_cond_t cv;            /* ready / stopping changes */
    pthread_mutex_t wmu;          /* one frame at a time on the engine's stdin */
    pid_t pid;
    int in_fd, out_fd;            /* our ends: engine stdin (write), engine stdout (read) */
    int ready, stopping, restarts;
    int ever_ready, start_failed;     /* a first start that fails is fatal, not retried */
    unsigned long long next_id;
    gen **live;                   /* in-flight generations, each holding one reference */
    int nlive, live_cap;
    wire_caps caps;               /* the engine's last CAPS line */
    int has_caps;
};

typedef struct {
    int fd;
    char buf[65536];
    size_t pos, len;
    char line[ENG_LINE_MAX];          /* the current frame's header */
    char payload[ENG_PAYLOAD_MAX];    /* and its payload */
} reader;

static int reader_fill(reader *r) {
    if (r->pos == r->len) r->pos = r->len = 0;
    if (r->pos > 0 && r->len == sizeof r->buf) {
        memmove(r->buf, r->buf + r->pos, r->len - r->pos);
        r->len -= r->pos;
        r->pos = 0;
    }
    for (;;) {
        ssize_t got = read(r->fd, r->buf + r->len, sizeof r->buf - r->len);
        if (got > 0) { r->len += (size_t)got; return 0; }
        if (got < 0 && errno == EINTR) continue;
        return -1;
    }
}

/* One header line without its '\n' (a '\r' before it is stripped). -1 on EOF or an over-long line. */
static int reader_line(reader *r, char *line, size_t cap) {
    size_t n = 0;
    for (;;) {
        while (r->pos < r->len) {
            char c = r->buf[r->pos++];
            if (c == '\n') {
                if (n && line[n - 1] == '\r') n--;
                line[n] = 0;
                return 0;
            }
            if (n + 1 >= cap) return -1;
            line[n++] = c;
        }
        if (reader_fill(r)) return -1;
    }
}

static int reader_bytes(reader *r, char *out, size_t n) {
    while (n) {
        if (r->pos == r->len && reader_fill(r)) return -1;
        size_t take = MIN(n, r->len - r->pos);
        memcpy(out, r->buf + r->pos, take);
        r->pos += take;
        out += take;
        n -= take;
    }
    return 0;
}

/* A RECORD frame's payload: what a resumed slot holds, handed to cfg.on_record. */
static int read_record(eng *e, reader *r, const wire_out *o) {
    char *text = malloc((size_t)o->payload + 1);
    if (!text) return -1;
    int rc = reader_bytes(r, text, (size_t)o->payload + 1);
    if (!rc && e->cfg.on_record) e->cfg.on_record(e->cfg.user, o->slot, text, (size_t)o->payload);
    free(text);
    return rc;
}

/* Wait until the READY sentinel arrives, learning the RECORDs sent before it; other earlier
 * lines are start-up chatter. */
static int reader_wait_ready(eng *e, reader *r, double timeout) {
    double deadline = now_seconds() + timeout;
    for (;;) {
        if (r->pos == r->len) {
            int ms = (int)((deadline - now_seconds()) * 1000);
            if (ms <= 0) return -1;
            struct pollfd p = {.fd = r->fd, .events = POLLIN};
            if (poll(&p, 1, ms) <= 0) continue;
        }
        if (reader_line(r, r->line, sizeof r->line)) return -1;
        if (!strcmp(r->line, "\x01\x01READY\x01\x01")) return 0;
        wire_out o;
        if (wire_parse_out(r->line, strlen(r->line), &o) == 0 && o.kind == WIRE_OUT_RECORD && read_record(e, r, &o))
            return -1;
    }
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int spawn(eng *e) {
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC)) return -1;
    if (pipe2(from_child, O_CLOEXEC)) { close(to_child[0]); close(to_child[1]); return -1; }
    pid_t pid = fork();
    if (pid < 0) {
        close(to_child[0]); close(to_child[1]); close(from_child[0]); close(from_child[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        /* The gateway owns the engine's lifetime: Ctrl-C (SIGINT to the terminal's process group)
         * or systemd's stop signal reaches the engine too, and it must not die with replies in
         * flight. The gateway drains them, then closes the engine's stdin (the graceful stop), and
         * SIGKILLs it only if it does not exit. Ignored dispositions survive exec. */
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        execv(e->cfg.exe, e->cfg.argv);
        fprintf(stderr, "cairn serve: cannot run engine %s: %s\n", e->cfg.exe, strerror(errno));
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    pthread_mutex_lock(&e->mu);
    e->pid = pid;
    e->in_fd = to_child[1];
    e->out_fd = from_child[0];
    pthread_mutex_unlock(&e->mu);
    return 0;
}

static gen *live_find(eng *e, const char *id) {
    for (int i = 0; i < e->nlive; i++)
        if (!strcmp(e->live[i]->id, id)) return e->live[i];
    return NULL;
}

/* Remove g from the live table; 1 if it was there (the caller inherits its reference). */
static int live_remove(eng *e, gen *g) {
    for (int i = 0; i < e->nlive; i++)
        if (e->live[i] == g) {
            e->live[i] = e->live[--e->nlive];
            return 1;
        }
    return 0;
}

/* Move g to a terminal state and run its on_finish once; only then is it marked finished for
 * waiters, so a client that got its reply finds the slot already released. Drops the table's
 * reference. */
static void gen_finish(gen *g, gen_status st, const char *error) {
    pthread_mutex_lock(&g->mu);
    g->status = st;
    if (error) snprintf(g->error, sizeof g->error, "%s", error);
    pthread_mutex_unlock(&g->mu);
    if (g->on_finish) g->on_finish(g, g->user);
    pthread_mutex_lock(&g->mu);
    g->finished = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    gen_unref(g);
}

static gen *take_live(eng *e, const char *id, int terminal) {
    pthread_mutex_lock(&e->mu);
    gen *g = live_find(e, id);
    if (g && terminal) live_remove(e, g);
    pthread_mutex_unlock(&e->mu);
    return g;
}

static void gen_append(gen *g, const char *bytes, size_t n, const wire_out *o) {
    pthread_mutex_lock(&g->mu);
    if (g->data_len + n + 1 > g->data_cap) {
        g->data_cap = MAX(g->data_cap * 2, g->data_len + n + 1024);
        g->data = xrealloc(g->data, g->data_cap);
    }
    if (g->ntoks == g->toks_cap) {
        g->toks_cap = g->toks_cap ? g->toks_cap * 2 : 64;
        g->toks = xrealloc(g->toks, sizeof(eng_token) * g->toks_cap);
    }
    eng_token *t = &g->toks[g->ntoks++];
    memset(t, 0, sizeof *t);
    t->off = g->data_len;
    t->len = n;
    t->tok = o->tok;
    memcpy(g->data + g->data_len, bytes, n);
    g->data_len += n;
    g->data[g->data_len] = 0;
    if (o->has_lp) {
        t->has_lp = 1;
        t->lp = o->lp;
        t->k = MIN(o->k, ENG_TOPK_MAX);
        memcpy(t->top_ids, o->top_ids, sizeof(int) * t->k);
        memcpy(t->top_lps, o->top_lps, sizeof(float) * t->k);
    }
    g->accepted = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void on_done(gen *g, const wire_done *d) {
    pthread_mutex_lock(&g->mu);
    g->completion_tokens = d->completion >= 0 ? d->completion : g->ntoks;
    g->tok_s = d->tok_s;
    if (d->prompt_tokens >= 0) g->prompt_tokens = d->prompt_tokens;
    g->length_limited = d->length_limited;
    g->reuse = d->reused;
    g->prefill_s = d->prefill_us > 0 ? (double)d->prefill_us / 1e6 : 0;
    g->accepted = 1;
    pthread_mutex_unlock(&g->mu);
    gen_finish(g, GEN_DONE, NULL);
}

/* One frame whose header line is `line` (wire.c decodes it). -1 = protocol error: the stream is
 * out of sync. */
static int handle_frame(eng *e, reader *r) {
    wire_out o;
    if (wire_parse_out(r->line, strlen(r->line), &o)) {
        fprintf(stderr, "cairn serve: malformed frame from the engine: %.80s\n", r->line);
        return -1;
    }
    if (o.payload >= 0) {
        char nl;
        if (reader_bytes(r, r->payload, (size_t)o.payload) || reader_bytes(r, &nl, 1) || nl != '\n') return -1;
    }
    if (o.kind == WIRE_OUT_CAPS) {
        pthread_mutex_lock(&e->mu);
        e->caps = o.caps;
        e->has_caps = 1;
        pthread_mutex_unlock(&e->mu);
        if (e->cfg.on_caps) e->cfg.on_caps(e->cfg.user, &o.caps);
    } else if (o.kind == WIRE_OUT_DATA) {
        gen *g = take_live(e, o.id, 0);
        if (g) gen_append(g, r->payload, (size_t)o.payload, &o);
    } else if (o.kind == WIRE_OUT_ACCEPT) {
        gen *g = take_live(e, o.id, 0);
        if (g) {
            pthread_mutex_lock(&g->mu);
            g->accepted = 1;
            if (o.prompt_tokens >= 0) g->prompt_tokens = o.prompt_tokens;
            if (o.reused >= 0) g->reuse = o.reused;   /* DONE repeats it */
            pthread_cond_broadcast(&g->cv);
            pthread_mutex_unlock(&g->mu);
        }
    } else if (o.kind == WIRE_OUT_DONE) {
        gen *g = take_live(e, o.id, 1);
        if (g) on_done(g, &o.done);
    } else if (o.kind == WIRE_OUT_ERROR) {
        gen *g = take_live(e, o.id, 1);
        if (g) gen_finish(g, GEN_ERROR, o.error);
        else fprintf(stderr, "cairn serve: engine error for unknown request %s: %s\n", o.id, o.error);
    }
    return 0;    /* STAT, telemetry and unknown kinds are ignored */
}

static void fail_all_live(eng *e, const char *why) {
    for (;;) {
        pthread_mutex_lock(&e->mu);
        gen *g = e->nlive ? e->live[--e->nlive] : NULL;
        pthread_mutex_unlock(&e->mu);
        if (!g) return;
        gen_finish(g, GEN_ERROR, why);
    }
}

static void reap(eng *e) {
    pthread_mutex_lock(&e->mu);
    pid_t pid = e->pid;
    e->ready = 0;
    int stopping = e->stopping;
    pthread_mutex_unlock(&e->mu);
    /* Its stdout ended or went out of sync: make sure it is gone, unless it is shutting down
     * gracefully (eng_stop kills it after the grace period). */
    if (!stopping && pid > 0) kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    if (WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL)
        fprintf(stderr, "cairn serve: engine (pid %d) died from signal %d\n", (int)pid, WTERMSIG(st));
    else if (WIFEXITED(st) && WEXITSTATUS(st))
        fprintf(stderr, "cairn serve: engine (pid %d) exited with status %d\n", (int)pid, WEXITSTATUS(st));
    pthread_mutex_lock(&e->mu);
    close(e->out_fd);
    pthread_mutex_lock(&e->wmu);
    if (e->in_fd >= 0) close(e->in_fd);
    e->in_fd = -1;
    pthread_mutex_unlock(&e->wmu);
    e->pid = 0;
    pthread_mutex_unlock(&e->mu);
}

/* Sleep up to s seconds, waking early when the server is stopping. */
static void backoff(eng *e, double s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)s;
    ts.tv_nsec += (long)((s - (time_t)s) * 1e9);
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&e->mu);
    while (!e->stopping && pthread_cond_timedwait(&e->cv, &e->mu, &ts) != ETIMEDOUT) {}
    pthread_mutex_unlock(&e->mu);
}

static void *dispatcher_main(void *arg) {
    eng *e = arg;
    double delay = 0.2;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        if (stopping) break;
        if (spawn(e)) {
            fprintf(stderr, "cairn serve: cannot start the engine: %s\n", strerror(errno));
            backoff(e, delay);
            delay = MIN(delay * 2, 5.0);
            continue;
        }
        double started = now_seconds();
        reader *r = xcalloc(1, sizeof *r);
        r->fd = e->out_fd;
        if (reader_wait_ready(e, r, e->cfg.ready_timeout) == 0) {
            pthread_mutex_lock(&e->mu);
            e->ready = e->ever_ready = 1;
            pthread_cond_broadcast(&e->cv);
            pthread_mutex_unlock(&e->mu);
            fprintf(stderr, "cairn serve: engine ready (pid %d)\n", (int)e->pid);
            while (reader_line(r, r->line, sizeof r->line) == 0 && handle_frame(e, r) == 0) {}
        } else {
            fprintf(stderr, "cairn serve: engine did not become ready\n");
        }
        free(r);
        reap(e);
        fail_all_live(e, "engine exited");
        if (!e->ever_ready) {
            /* A model that cannot load will not load on the next try either. */
            pthread_mutex_lock(&e->mu);
            e->start_failed = 1;
            pthread_mutex_unlock(&e->mu);
            if (e->cfg.on_start_failed) e->cfg.on_start_failed(e->cfg.user);
            break;
        }
        pthread_mutex_lock(&e->mu);
        stopping = e->stopping;
        e->restarts += !stopping;
        pthread_mutex_unlock(&e->mu);
        if (stopping) break;
        if (e->cfg.on_restart) e->cfg.on_restart(e->cfg.user);
        /* An engine that ran for a while restarts at once; one that keeps dying backs off. */
        delay = now_seconds() - started > 10 ? 0.2 : MIN(delay * 2, 5.0);
        fprintf(stderr, "cairn serve: restarting the engine in %.1fs\n", delay);
        backoff(e, delay);
    }
    return NULL;
}

eng *eng_start(const eng_config *cfg, char *err, size_t errlen) {
    eng *e = xcalloc(1, sizeof *e);
    e->cfg = *cfg;
    e->in_fd = e->out_fd = -1;
    e->next_id = 1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->wmu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if (pthread_create(&e->dispatcher, NULL, dispatcher_main, e)) {
        free(e);
        errf(err, errlen, "cannot create the engine dispatcher thread");
        return NULL;
    }
    return e;
}

void eng_stop(eng *e, double grace) {
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_broadcast(&e->cv);
    pid_t pid = e->pid;
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&e->wmu);
    if (e->in_fd >= 0) close(e->in_fd);     /* EOF = graceful shutdown for the engine */
    e->in_fd = -1;
    pthread_mutex_unlock(&e->wmu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)grace + 1;
    if (pthread_timedjoin_np(e->dispatcher, NULL, &ts)) {
        if (pid > 0) kill(pid, SIGKILL);
        pthread_join(e->dispatcher, NULL);
    }
    free(e->live);
    free(e);
}

int eng_caps(eng *e, wire_caps *out) {
    pthread_mutex_lock(&e->mu);
    int has = e->has_caps;
    if (has) *out = e->caps;
    pthread_mutex_unlock(&e->mu);
    return has ? 0 : -1;
}

int eng_ready(eng *e) {
    pthread_mutex_lock(&e->mu);
    int r = e->ready;
    pthread_mutex_unlock(&e->mu);
    return r;
}

int eng_restarts(eng *e) {
    pthread_mutex_lock(&e->mu);
    int r = e->restarts;
    pthread_mutex_unlock(&e->mu);
    return r;
}

int eng_start_failed(eng *e) {
    pthread_mutex_lock(&e->mu);
    int r = e->start_failed;
    pthread_mutex_unlock(&e->mu);
    return r;
}

pid_t eng_pid(eng *e) {
    pthread_mutex_lock(&e->mu);
    pid_t p = e->pid;
    pthread_mutex_unlock(&e->mu);
    return p;
}

static int wait_ready(eng *e, double seconds) {
    double deadline = now_seconds() + seconds;
    while (!e->ready && !e->stopping) {
        double left = deadline - now_seconds();
        if (left <= 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double wake = MIN(left, 0.5);
        ts.tv_nsec += (long)(wake * 1e9);
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    return e->ready && !e->stopping;
}

/* Register g as in flight on slot with a fresh id, once the engine runs. */
static int live_add(eng *e, gen *g, int slot, double wait_ready_s, char *err, size_t errlen) {
    pthread_mutex_lock(&e->mu);
    if (!wait_ready(e, wait_ready_s)) {
        pthread_mutex_unlock(&e->mu);
        return errf(err, errlen, e->stopping ? "server is shutting down" : "engine is not running (restarting)");
    }
    snprintf(g->id, sizeof g->id, "%llu", e->next_id++);
    g->slot = slot;
    if (e->nlive == e->live_cap) {
        e->live_cap = e->live_cap ? e->live_cap * 2 : 16;
        e->live = xrealloc(e->live, sizeof(gen *) * e->live_cap);
    }
    gen_ref(g);
    e->live[e->nlive++] = g;
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* After writing g's frames: on a failed write g leaves the live set again (unless the
 * dispatcher already failed it, and so ran on_finish). */
static int written(eng *e, gen *g, int bad, char *err, size_t errlen) {
    if (!bad) return 0;
    pthread_mutex_lock(&e->mu);
    int mine = live_remove(e, g);
    pthread_mutex_unlock(&e->mu);
    if (!mine) return 0;
    gen_unref(g);
    return errf(err, errlen, "cannot write to the engine (it is restarting)");
}

int eng_submit(eng *e, gen *g, const wire_submit *s, const wire_bias *bias, const char *payload, size_t n,
               const char *ext, size_t ext_n, double wait_ready_s, char *err, size_t errlen) {
    if (live_add(e, g, s->slot, wait_ready_s, err, errlen)) return -1;
    sbuf head = {0};
    if (bias) wire_fmt_bias(&head, g->id, bias);
    char sh[WIRE_HEADER_MAX];
    size_t hl = wire_fmt_submit(sh, g->id, s, n, ext_n);
    int bad = hl >= sizeof sh;
    if (!bad) sbuf_put(&head, sh, hl);
    pthread_mutex_lock(&e->wmu);
    bad = bad || e->in_fd < 0 || write_all(e->in_fd, head.p, head.len) || write_all(e->in_fd, payload, n) ||
          (ext_n && write_all(e->in_fd, ext, ext_n)) || write_all(e->in_fd, "\n", 1);
    pthread_mutex_unlock(&e->wmu);
    sbuf_free(&head);
    return written(e, g, bad, err, errlen);
}

int eng_slot(eng *e, gen *g, int slot, wire_slot_action action, const char *name, double wait_ready_s, char *err,
             size_t errlen) {
    if (live_add(e, g, slot, wait_ready_s, err, errlen)) return -1;
    char head[WIRE_HEADER_MAX];
    size_t n = strlen(name), hl = wire_fmt_slot(head, g->id, action, slot, n);
    pthread_mutex_lock(&e->wmu);
    int bad = e->in_fd < 0 || write_all(e->in_fd, head, hl) || write_all(e->in_fd, name, n) ||
              write_all(e->in_fd, "\n", 1);
    pthread_mutex_unlock(&e->wmu);
    return written(e, g, bad, err, errlen);
}

static void send_control(eng *e, gen *g, wire_kind verb, int *flag) {
    pthread_mutex_lock(&g->mu);
    int send = g->status == GEN_RUNNING && !*flag && g->id[0];
    if (send) *flag = 1;
    pthread_mutex_unlock(&g->mu);
    if (!send) return;
    char line[WIRE_HEADER_MAX];
    size_t n = wire_fmt_control(line, verb, g->id);
    pthread_mutex_lock(&e->wmu);
    if (e->in_fd >= 0) write_all(e->in_fd, line, n);
    pthread_mutex_unlock(&e->wmu);
}

void eng_cancel(eng *e, gen *g) { send_control(e, g, WIRE_CANCEL, &g->cancel_sent); }
void eng_stop_gen(eng *e, gen *g) { send_control(e, g, WIRE_STOP, &g->stop_sent); }
