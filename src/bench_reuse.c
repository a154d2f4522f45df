/* bench_reuse.c — `cairn bench reuse -m DIR`: what prefix reuse buys over a multi-turn
 * conversation, and what it costs.
 *
 * Each turn appends a user message (between role markers) to the history and asks for a reply.
 * The warm path is exactly the engine's: reuse_prepare on the conversation's state, then the
 * checkpointing prefill, then the first token. Two references are timed on a second sequence in
 * the same run: the cold TTFT (the whole prompt from an empty state) and the tail time (only the
 * tokens the warm path had to feed, on top of the reused prefix — the prefix is fed first, untimed
 * as far as the tail is concerned). warm / tail close to 1 means checkpoints and the reuse
 * decision are nearly free; warm / cold is the speed-up a user sees. The first token of every
 * turn must equal the cold one (reuse is exact), else the run fails.
 *
 * WHY PAIRS. Both arms do the same forward work (the warm one plus its checkpoint captures), so
 * their ratio sits near 1 and the figure is about a few percent. On a shared machine the fastest
 * run of each arm is a matter of luck: with checkpoints switched off (--ckpt-mb 0), i.e. the
 * same work in both arms, fastest-of-9 ratios spread over 0.90..1.11 at load 7. A ratio of two
 * runs made back to back, under the same load, varies far less; the median of those ratios is
 * the figure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "bench.h"
#include "cli.h"
#include "core/threads.h"
#include "core/util.h"
#include "state/persist.h"

typedef struct {
    const char *model_dir;
    int json;
    long turns, system, user, reply, threads, ckpt_mb, repeat;
    numerics num;
} reuse_opts;

#define MAX_REPEAT 100

typedef struct {
    int prompt_tokens, reused, exact;
    int checkpoints;           /* checkpoints the turn's prefill stored */
    double warm, cold, tail;   /* seconds: fastest warm run, prefix + fastest tail run, fastest tail run */
    double ratio;              /* warm / tail: the median over the back-to-back pairs */
} turn_result;

/* After the conversation: a second slot whose prompt extends the first slot's record (kv-share
 * copies it), and a restart that reloads the slot from --kv-dir. Each against a cold prefill. */
typedef struct {
    turn_result copy, restart;
} extra_result;

static void usage(FILE *f) {
    fprintf(f,
            "usage: cairn bench reuse -m DIR [--json] [--turns N] [--system N] [--user N] [--reply N]\n"
            "                         [--repeat N] [--ckpt-mb N] [--threads N] [--numerics exact|qat]\n"
            "\n"
            "A conversation of N turns (default 10): a system prompt of --system ids (default 64), then per turn\n"
            "a user message of --user ids (default 32) and a greedy reply of --reply tokens (default 16).\n"
            "Per turn: warm TTFT / cold TTFT and warm TTFT / time to prefill only the new tail. Warm and tail run\n"
            "--repeat times (default 3) in back-to-back pairs, as the machine may be shared: warm/tail is the\n"
            "median of the pairs' ratios, the times shown are each arm's fastest run.\n"
            "Then the next user message is answered by a second slot that copies the first slot's state\n"
            "(kv-share) and by a restarted engine that reloads it from a --kv-dir; both against a cold prefill.\n"
            "--json prints {\"turns\":[{\"prompt_tokens\",\"reused\",\"checkpoints\",\"warm_over_cold\",\"warm_over_tail\",\n"
            "  \"exact\"},...], \"cross_slot\":{\"reused\",\"copy_over_cold\",...}, \"restart\":{\"reused\",\"restart_over_cold\",...}}.\n");
}

static int parse(int argc, char **argv, reuse_opts *o) {
    *o = (reuse_opts){.turns = 10, .system = 64, .user = 32, .reply = 16, .ckpt_mb = 512, .repeat = 3, .num = NUMERICS_QAT};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); exit(0); }
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!v) { fprintf(stderr, "cairn bench reuse: %s needs a value (or unknown flag)\n", a); return -1; }
        i++;
        if (!strcmp(a, "-m")) o->model_dir = v;
        else if (!strcmp(a, "--turns")) { if (cli_int("bench reuse", a, v, 1, 1000, &o->turns)) return -1; }
        else if (!strcmp(a, "--system")) { if (cli_int("bench reuse", a, v, 0, 1 << 20, &o->system)) return -1; }
        else if (!strcmp(a, "--user")) { if (cli_int("bench reuse", a, v, 1, 1 << 20, &o->user)) return -1; }
        else if (!strcmp(a, "--reply")) { if (cli_int("bench reuse", a, v, 1, 1 << 20, &o->reply)) return -1; }
        else if (!strcmp(a, "--repeat")) { if (cli_int("bench reuse", a, v, 1, MAX_REPEAT, &o->repeat)) return -1; }
        else if (!strcmp(a, "--ckpt-mb")) { if (cli_int("bench reuse", a, v, 0, 1L << 30, &o->ckpt_mb)) return -1; }
        else if (!strcmp(a, "--threads")) { if (cli_int("bench reuse", a, v, 1, 1024, &o->threads)) return -1; }
        else if (!strcmp(a, "--numerics")) {
            int n = cli_numerics(v);
            if (n < 0) { fprintf(stderr, "cairn bench reuse: bad value for --numerics: '%s'\n", v); return -1; }
            o->num = (numerics)n;
        } else { fprintf(stderr, "cairn bench reuse: unknown flag '%s' (see cairn bench reuse --help)\n", a); return -1; }
    }
    if (!o->model_dir) { fprintf(stderr, "cairn bench reuse: -m DIR is required\n"); return -1; }
    return 0;
}

/* ---- the conversation --------------------------------------------------------------------- */

typedef struct {
    int *ids;
    int n, cap;
    int user, assistant;   /* role-marker ids, -1 if the tokenizer has none */
    int lo, span;          /* ordinary ids are drawn from [lo, lo + span) */
    uint64_t rng;
} conversation;

static void push(conversation *c, int id) {
    if (id >= 0) c->ids[c->n++] = id;
}

static void push_words(conversation *c, long k) {
    for (long i = 0; i < k; i++) {
        c->rng ^= c->rng << 13, c->rng ^= c->rng >> 7, c->rng ^= c->rng << 17;
        push(c, c->lo + (int)(c->rng % (uint64_t)c->span));
    }
}

static void conversation_init(conversation *c, const model *m, const reuse_opts *o) {
    memset(c, 0, sizeof *c);
    c->cap = (int)(1 + o->system + o->turns * (o->user + o->reply + 2) + o->user + 2);   /* + the extra turn */
    c->ids = xmalloc((size_t)c->cap * sizeof *c->ids);
    c->user = m->markers.user;
    c->assistant = m->markers.assistant;
    /* stay clear of the special ids most vocabularies keep at the bottom */
    c->lo = m->vocab_size > 512 ? 256 : 2;
    c->span = m->vocab_size - c->lo;
    c->rng = 0x9e3779b97f4a7c15ULL;
    push(c, m->bos_id);
    push_words(c, o->system);
}

/* ---- one turn ------------------------------------------------------------------------------ */

/* What one turn's runs share: the two sequences, the states each arm starts from, the store the
 * real warm run checkpoints into and the conversation. */
typedef struct {
    seq *warm, *cold;
    store *cs;                 /* the conversation's checkpoints (NULL: --ckpt-mb 0) */
    size_t budget;
    const conversation *c;
    float *logits;
    snapshot *wstart, *cstart; /* the warm slot before the turn; the cold one holding the reused prefix */
} turn_arms;

/* The engine's path: decide, prefill with checkpoints into cs, first token. Returns the first
 * token; *took gets the time, *reused the reuse count, *ckpts the checkpoints cs gained. */
static int warm_run(const turn_arms *a, store *cs, double *took, int *reused, int *ckpts, char *err, size_t errlen) {
    int before = cs ? store_count(cs) : 0;
    double t0 = now_seconds();
    reuse_result r;
    if (seq_prompt(a->warm, cs, a->c->ids, a->c->n, 0, a->logits, &r, err, errlen)) return -1;
    int first = bench_argmax(a->logits, a->warm->m->vocab_size);
    *took = now_seconds() - t0;
    *reused = r.reused;
    *ckpts = (cs ? store_count(cs) : 0) - before;
    return first;
}

/* A repeat of the real warm run from the turn's starting state. It checkpoints into a scratch
 * store, so it pays the snapshot cost the real run paid, and must take the real run's path. */
static int warm_again(const turn_arms *a, const turn_result *t, int first, double *took, char *err, size_t errlen) {
    if (state_restore(&a->warm->st, a->wstart) != STATE_OK) return errf(err, errlen, "cannot restore the warm slot");
    store *scratch = a->cs ? store_new(a->budget) : NULL;
    int reused = -1, ckpts = -1;
    int f = warm_run(a, scratch, took, &reused, &ckpts, err, errlen);
    store_free(scratch);
    if (f >= 0 && (f != first || reused != t->reused || ckpts != t->checkpoints))
        return errf(err, errlen, "a repeated warm turn took another path");
    return f;
}

/* The reference: a cold sequence holding the reused prefix prefills only the tail. */
static int tail_run(const turn_arms *a, int reused, double *took, char *err, size_t errlen) {
    if (state_restore(&a->cold->st, a->cstart) != STATE_OK) return errf(err, errlen, "cannot restore the cold slot");
    double t0 = now_seconds();
    if (seq_feed(a->cold, a->c->ids + reused, a->c->n - reused, a->logits, err, errlen)) return -1;
    int first = bench_argmax(a->logits, a->cold->m->vocab_size);
    *took = now_seconds() - t0;
    return first;
}

/* One turn: the real warm run on the conversation's state, then the cold reference on a second
 * sequence: the reused prefix once (untimed for the tail), then the tail alone (the split is free
 * of numerical effect by chunking invariance). Both arms then run `repeat` times in pairs from
 * snapshots of their starting states, in ABBA order (warm-tail, tail-warm, ...; pair 0's warm run
 * is the real one): the two runs of a pair are back to back, so a load that drifts across the
 * turn — the machine may be shared — weighs on both alike. warm/tail is the median of the pairs'
 * ratios; the fastest run of each arm gives the times shown. Every run's first token must be the
 * real one. Returns it, or -1 with err. */
static int measure_turn(turn_arms *a, long repeat, turn_result *t, char *err, size_t errlen) {
    double ratio[MAX_REPEAT], w = 0, tl = 0;
    t->warm = t->tail = 1e30;
    t->exact = 1;
    a->wstart = state_snapshot(&a->warm->st, 1), a->cstart = NULL;
    int first = a->wstart ? warm_run(a, a->cs, &w, &t->reused, &t->checkpoints, err, errlen)
                          : errf(err, errlen, "out of memory");
    state_reset(&a->cold->st);
    double t0 = now_seconds();
    if (first >= 0 && t->reused && seq_feed(a->cold, a->c->ids, t->reused, NULL, err, errlen)) first = -1;
    double prefix = now_seconds() - t0;
    if (first >= 0 && !(a->cstart = state_snapshot(&a->cold->st, 1))) first = errf(err, errlen, "out of memory");
    for (long i = 0; first >= 0 && i < repeat; i++) {
        int warm_first = i % 2 == 0;
        if (warm_first && i > 0 && warm_again(a, t, first, &w, err, errlen) < 0) first = -1;
        int f = first < 0 ? -1 : tail_run(a, t->reused, &tl, err, errlen);
        if (f < 0) first = -1;
        t->exact &= f == first;
        if (first >= 0 && !warm_first && warm_again(a, t, first, &w, err, errlen) < 0) first = -1;
        t->warm = MIN(t->warm, w), t->tail = MIN(t->tail, tl);
        ratio[i] = w / tl;
    }
    if (first >= 0) t->ratio = bench_median(ratio, repeat);
    t->cold = prefix + t->tail;
    snapshot_free(a->wstart);
    snapshot_free(a->cstart);
    return first;
}

/* The reply: every generated token but the last enters the state, as in the engine. */
static int reply(seq *sq, conversation *c, int first, long len, float *logits, char *err, size_t errlen) {
    int tok = first;
    for (long i = 1; i < len; i++) {
        push(c, tok);
        if (seq_feed(sq, &tok, 1, logits, err, errlen)) return -1;
        tok = bench_argmax(logits, sq->m->vocab_size);
    }
    push(c, tok);
    return 0;
}

/* Time `fresh` answering the conversation after `prepare` (copy or reload) and the prefill of
 * what is left, against a cold prefill of the whole prompt on `cold`. */
static int time_against_cold(seq *fresh, seq *cold, const conversation *c, reuse_result r, double t0, float *logits,
                             turn_result *t, char *err, size_t errlen) {
    if (seq_feed(fresh, c->ids + r.reused, c->n - r.reused, logits, err, errlen)) return -1;
    int first = bench_argmax(logits, fresh->m->vocab_size);
    t->warm = now_seconds() - t0;
    t->reused = r.reused;
    t->prompt_tokens = c->n;
    state_reset(&cold->st);
    t0 = now_seconds();
    if (seq_feed(cold, c->ids, c->n, logits, err, errlen)) return -1;
    t->cold = now_seconds() - t0;
    t->exact = bench_argmax(logits, cold->m->vocab_size) == first;
    return 0;
}

static int measure_copy(seq *donor, seq *cold, const conversation *c, float *logits, turn_result *t, char *err,
                        size_t errlen) {
    seq *fresh = seq_new(donor->m, donor->st.cap, err, errlen);
    if (!fresh) return -1;
    state *donors[1] = {&donor->st};
    double t0 = now_seconds();
    reuse_result r = reuse_prepare(&fresh->st, 1, NULL, 1, donors, 1, c->ids, c->n);
    int rc = time_against_cold(fresh, cold, c, r, t0, logits, t, err, errlen);
    seq_free(fresh);
    return rc;
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

static int measure_restart(seq *slot, seq *cold, const conversation *c, float *logits, turn_result *t, char *err,
                           size_t errlen) {
    char dir[] = "/tmp/cairn-bench-kv-XXXXXX";
    if (!mkdtemp(dir)) return errf(err, errlen, "cannot create a temporary --kv-dir");
    seq *fresh = seq_new(slot->m, slot->st.cap, err, errlen);
    int rc = fresh ? persist_save(dir, 0, &slot->st, slot->m->fingerprint, err, errlen) : -1;
    if (rc == 0) {
        double t0 = now_seconds();
        if (persist_load(dir, 0, &fresh->st, fresh->m->fingerprint, err, errlen) != 1)
            rc = errf(err, errlen, "the saved slot did not load back: %s", err);
        else
            rc = time_against_cold(fresh, cold, c, reuse_prepare(&fresh->st, 0, NULL, 0, NULL, 0, c->ids, c->n), t0,
                                   logits, t, err, errlen);
    }
    seq_free(fresh);
    remove_dir(dir);
    persist_forget();
    return rc;
}

static int run_turns(model *m, const reuse_opts *o, turn_result *res, extra_result *x, char *err, size_t errlen) {
    conversation c;
    conversation_init(&c, m, o);
    int ctx = c.cap + 8;
    seq *warm = seq_new(m, ctx, err, errlen), *cold = warm ? seq_new(m, ctx, err, errlen) : NULL;
    store *cs = o->ckpt_mb ? store_new((size_t)o->ckpt_mb << 20) : NULL;
    float *logits = xmalloc((size_t)m->vocab_size * sizeof *logits);
    int rc = warm && cold ? 0 : -1;
    /* page the weights in so the first turn measures compute, not the disk */
    if (rc == 0) rc = seq_feed(cold, c.ids, MIN(c.n, 8), logits, err, errlen);
    turn_arms a = {.warm = warm, .cold = cold, .cs = cs, .budget = (size_t)o->ckpt_mb << 20, .c = &c, .logits = logits};
    for (long k = 0; rc == 0 && k < o->turns; k++) {
        push(&c, c.user);
        push_words(&c, o->user);
        push(&c, c.assistant);
        turn_result *t = &res[k];
        t->prompt_tokens = c.n;
        int w = measure_turn(&a, o->repeat, t, err, errlen);
        rc = w < 0 ? -1 : reply(warm, &c, w, o->reply, logits, err, errlen);
    }
    /* the next user message, answered by another slot and by a restarted engine */
    push(&c, c.user);
    push_words(&c, o->user);
    push(&c, c.assistant);
    if (rc == 0) rc = measure_copy(warm, cold, &c, logits, &x->copy, err, errlen);
    if (rc == 0) rc = measure_restart(warm, cold, &c, logits, &x->restart, err, errlen);
    free(logits);
    store_free(cs);
    seq_free(warm);
    seq_free(cold);
    free(c.ids);
    return rc;
}

static void report(const reuse_opts *o, const turn_result *res, const extra_result *x) {
    double worst = 0;
    for (long k = 1; k < o->turns; k++) worst = MAX(worst, res[k].ratio);
    const turn_result *cp = &x->copy, *rs = &x->restart;
    if (o->json) {
        printf("{\"turns\":[");
        for (long k = 0; k < o->turns; k++)
            printf("%s{\"prompt_tokens\":%d,\"reused\":%d,\"checkpoints\":%d,\"warm_over_cold\":%.4f,"
                   "\"warm_over_tail\":%.4f,\"exact\":%s}",
                   k ? "," : "", res[k].prompt_tokens, res[k].reused, res[k].checkpoints, res[k].warm / res[k].cold,
                   res[k].ratio, res[k].exact ? "true" : "false");
        printf("],\"worst_warm_over_tail_from_turn_2\":%.4f", worst);
        printf(",\"cross_slot\":{\"prompt_tokens\":%d,\"reused\":%d,\"copy_over_cold\":%.4f,\"exact\":%s}",
               cp->prompt_tokens, cp->reused, cp->warm / cp->cold, cp->exact ? "true" : "false");
        printf(",\"restart\":{\"prompt_tokens\":%d,\"reused\":%d,\"restart_over_cold\":%.4f,\"exact\":%s}}\n",
               rs->prompt_tokens, rs->reused, rs->warm / rs->cold, rs->exact ? "true" : "false");
        return;
    }
    printf("turn  prompt  reused  ckpts  warm_ms  cold_ms  tail_ms  warm/cold  warm/tail  first token\n");
    for (long k = 0; k < o->turns; k++)
        printf("%4ld  %6d  %6d  %5d  %7.1f  %7.1f  %7.1f  %9.3f  %9.3f  %s\n", k + 1, res[k].prompt_tokens,
               res[k].reused, res[k].checkpoints, res[k].warm * 1e3, res[k].cold * 1e3, res[k].tail * 1e3,
               res[k].warm / res[k].cold, res[k].ratio, res[k].exact ? "same as cold" : "DIFFERS FROM COLD");
    printf("(times: each arm's fastest run; warm/tail: the median of %ld back-to-back pairs)\n", o->repeat);
    printf("worst warm/tail from turn 2: %.3f (goal <= 1.05)\n", worst);
    printf("cross-slot copy: prompt %d, reused %d, TTFT copy/cold %.3f, first token %s\n", cp->prompt_tokens,
           cp->reused, cp->warm / cp->cold, cp->exact ? "same as cold" : "DIFFERS FROM COLD");
    printf("restart from --kv-dir: prompt %d, reused %d, (load + TTFT)/cold %.3f, first token %s\n",
           rs->prompt_tokens, rs->reused, rs->warm / rs->cold, rs->exact ? "same as cold" : "DIFFERS FROM COLD");
}

int bench_reuse(int argc, char **argv) {
    reuse_opts o;
    if (parse(argc, argv, &o)) return 2;
    if (o.threads) pool_set_threads((int)o.threads);
    char err[512];
    model *m = model_open(o.model_dir, o.num, 0, err, sizeof err);
    if (!m) { fprintf(stderr, "cairn bench reuse: %s\n", err); return 1; }
    turn_result *res = xcalloc((size_t)o.turns, sizeof *res);
    extra_result x = {0};
    int rc = run_turns(m, &o, res, &x, err, sizeof err);
    if (rc) fprintf(stderr, "cairn bench reuse: %s\n", err);
    else report(&o, res, &x);
    int exact = x.copy.exact && x.restart.exact;
    for (long k = 0; k < o.turns; k++) exact &= res[k].exact;
    if (!rc && !exact) fprintf(stderr, "cairn bench reuse: a warm first token differs from the cold one\n");
    free(res);
    model_close(m);
    return rc || !exact ? 1 : 0;
}
