/* engine.c — `cairn engine`: one model, N slots, the line protocol on stdin/stdout
 * (protocol.md §1; codec in wire.c, reuse in state/reuse.c).
 *
 * One thread owns every model state. Each turn of the loop advances every decoding request by one
 * token AND the prefilling requests by a chunk in ONE forward call over all of them (the joint
 * step, seq_spec_steps with feed_job chunks), so dense, attention and shared-expert weights
 * stream from memory once per step for all conversations; each conversation's tokens stay
 * bit-identical to running it alone (model.h: chunking invariance). The prefill rows of a step
 * are budgeted by seq_join_rows: they fill the last internal pass the decode rows start, so the
 * step reads the dense weights as often as its decode rows alone would and costs no more than
 * the pass-sized chunk call that used to precede the decode call; the budget goes to prefilling
 * requests in slot order. With nothing decoding, a prefill chunk (the sequence's chunk size) is
 * a call of its own. The reuse layer decides each chunk's end and its checkpoints
 * (reuse_prefill_next / reuse_prefill_fed); a prefill completing inside a joint call samples its
 * first token from its last row. With --spec mtp a decoding request without a grammar, bias or
 * penalties instead takes a speculative step inside that same call (seq_spec_steps: its MTP layer
 * drafts first, and the call verifies its next token + drafts beside the other slots' tokens and
 * chunks), which emits the same tokens plain decoding would (bit-identical when greedy). A request
 * with think_budget=N has its reasoning capped (think_budget.h): once the budget is reached,
 * sample_next takes the next token of the family's close instead of sampling one, and while the
 * budget can still act the request takes no speculative step. stdin is
 * polled with a zero-timeout select between steps, so CANCEL, STOP and new SUBMITs are seen
 * during long prefills and decodes. With nothing active it blocks on stdin. EOF lets in-flight
 * requests finish, then exits 0. CAIRN_STEP_LOG=1 logs on stderr each joint step: how many slots
 * its one forward call decoded, the weight bytes that call streamed (kernels_streamed: dense, and
 * routed experts), and the prefill rows it carried for how many requests, so a test can see the
 * weights read once per pass, on a line after the pool jobs (thread synchronisations) the call
 * took; and each speculative step's kept drafts.
 *
 * Frames go to stdout, one fflush per frame; logs go to stderr. A request's reply is ACCEPT,
 * DATA*, DONE, or a single ERROR. A failure after a slot's state started changing taints that
 * slot only (its next request resets); other slots are never touched, except that a forward call
 * that failed taints every slot it carried (the joint step's requests all fail).
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cli.h"
#include "../core/cluster.h"
#include "../core/grammar.h"
#include "../core/kernels.h"
#include "../core/sampler.h"
#include "../core/threads.h"
#include "../core/tokmask.h"
#include "../core/util.h"
#include "../state/persist.h"
#include "../models/model.h"
#include "think_budget.h"
#include "wire.h"

typedef struct {
    const char *model_dir, *kv_dir;
    int slots, ctx, kv_share, threads;
    long ckpt_mb, draft;    /* draft: --spec mtp drafts per speculative step, 0 = off */
    double expert_cache_mb;
    int mlock;
    numerics num;
} engine_opts;

typedef struct {
    char id[WIRE_ID_MAX];
    int slot;
    wire_submit sub;
    int *prompt;
    int n;
    int reused;
    reuse_prefill pf;
    int prefilling;
    int stop;            /* STOP received: finish through DONE at the next step */
    int token;           /* last sampled token: emitted, fed only if generation goes on */
    int generated;
    sampler smp;
    tok_stream ts;
    double t_first;      /* first token sampled */
    double prefill_s;    /* time spent in this request's prefill steps (not other slots' steps) */
    grammar *g;          /* SUBMIT extension payload: the grammar every sampled token must follow */
    tokmask km;          /* its matcher over this request's output (never part of the slot state) */
    think_budget tb;     /* think_budget=N: the reasoning tokens it may still take (all 0 without one) */
} request;

typedef struct {
    engine_opts o;
    model *m;
    seq **seqs;
    state **states;      /* &seqs[i]->st: kv-share donors */
    request **active;    /* per slot, NULL when idle */
    store *cs;
    float *logits, *logprobs, *top_lps;
    float *step_logits;  /* [slots][draft + 1][vocab]: one joint step's rows (decoding, then prefill logits) */
    request **stepping;  /* [2][slots]: that step's decoding requests, then its prefilling ones */
    int log_steps;
    int *top_ids;
    tokvocab *vocab;     /* token trie for grammar masks (NULL without a tokenizer) */
    wire_reader rd;
    int eof;
    int log_prefix;
    char image_id[WIRE_ID_MAX];   /* an IMAGE announced for this id: its SUBMIT is refused */
    char bias_id[WIRE_ID_MAX];    /* a BIAS announced for this id, for its SUBMIT */
    int *bias_ids, nbias;         /* nbias < 0: the BIAS was bad and its SUBMIT is refused */
    float *bias_vals;
    char bias_error[160];
} engine;

/* ---- output ----------------------------------------------------------------------------- */

static void put_frame(const char *head, size_t n, const char *payload, size_t plen) {
    fwrite(head, 1, n, stdout);
    if (payload) {
        fwrite(payload, 1, plen, stdout);
        fputc('\n', stdout);
    }
    fflush(stdout);
}

static void put_error(const char *id, const char *code, const char *detail) {
    char h[WIRE_HEADER_MAX];
    put_frame(h, wire_fmt_error(h, id, code, detail), NULL, 0);
}

static double rss_gb(void) { return (double)rss_bytes() / (1024.0 * 1024.0 * 1024.0); }

/* ---- request lifecycle ------------------------------------------------------------------ */

static void save_slot(engine *e, int slot) {
    if (!e->o.kv_dir) return;
    char err[512];
    const state *st = &e->seqs[slot]->st;
    if (persist_save(e->o.kv_dir, slot, st, e->m->fingerprint, err, sizeof err) ||
        persist_save_checkpoints(e->o.kv_dir, slot, e->cs, st, e->m->fingerprint, err, sizeof err))
        fprintf(stderr, "cairn engine: kv-dir: %s\n", err);
}

static void request_free(engine *e, request *r) {
    e->active[r->slot] = NULL;
    seq_set_media(e->seqs[r->slot], NULL, 0, NULL, 0);
    reuse_prefill_free(&r->pf);
    sampler_free(&r->smp);
    if (r->g) tokmask_free(&r->km);
    grammar_free(r->g);
    free(r->prompt);
    free(r);
}

/* The slot's state is saved before DONE (or the ERROR ending the request) goes out: once the
 * gateway hears a turn ended, a kill -9 no longer loses it. */
static void finish(engine *e, request *r, int length_limited) {
    char tail[64], h[WIRE_HEADER_MAX];
    size_t n = e->m->tok ? tok_stream_finish(&r->ts, tail, sizeof tail) : 0;
    if (n) put_frame(h, wire_fmt_data(h, r->id, n, 0, 0, NULL, NULL, -1), tail, n);
    double dt = r->generated > 1 ? now_seconds() - r->t_first : 0;
    double tok_s = dt > 0 ? (r->generated - 1) / dt : 0;
    save_slot(e, r->slot);
    wire_done d = {r->generated, tok_s, 100.0 * r->reused / r->n, rss_gb(), r->n, length_limited, r->reused,
                   (long)(r->prefill_s * 1e6)};
    put_frame(h, wire_fmt_done(h, r->id, &d), NULL, 0);
    request_free(e, r);
}

static void fail(engine *e, request *r, const char *code, const char *detail) {
    state_taint(&e->seqs[r->slot]->st);
    save_slot(e, r->slot);
    put_error(r->id, code, detail);
    request_free(e, r);
}

/* One DATA frame per token when logprobs or token ids are asked for (even with no bytes yet),
 * otherwise only when the token released bytes. */
static void emit_token(engine *e, request *r, int t) {
    char text[4096], h[WIRE_HEADER_MAX];
    size_t n = e->m->tok ? tok_stream_put(&r->ts, t, text, sizeof text) : 0;
    int k = r->sub.logprobs, tok = r->sub.tokids ? t : -1;
    if (k > 0) {
        log_softmax(e->logits, e->m->vocab_size, e->logprobs);
        top_logprobs(e->logprobs, e->m->vocab_size, k, e->top_ids);
        for (int i = 0; i < k; i++) e->top_lps[i] = e->logprobs[e->top_ids[i]];
        put_frame(h, wire_fmt_data(h, r->id, n, k, e->logprobs[t], e->top_ids, e->top_lps, tok), text, n);
    } else if (n || tok >= 0) {
        put_frame(h, wire_fmt_data(h, r->id, n, 0, 0, NULL, NULL, tok), text, n);
    }
}

/* A request that cannot go on although its slot's state is sound (every id it holds was fed and
 * recorded): answer the error, keep the state for the next turn. */
static void refuse(engine *e, request *r, const char *code, const char *detail) {
    put_error(r->id, code, detail);
    save_slot(e, r->slot);
    request_free(e, r);
}

/* Take token t, chosen from e->logits: emitted but not fed, it enters the state only if
 * generation continues (so the record never claims a token the state does not hold). Returns 1
 * when the request ended with it (and was freed). */
static int take_token(engine *e, request *r, int t) {
    if (r->generated == 0) r->t_first = now_seconds();
    if (model_is_eos(e->m, t)) return finish(e, r, 0), 1;
    if (r->g && tokmask_feed(&r->km, t))
        return fail(e, r, "ENGINE_ERROR", "sampled a token the grammar mask had excluded"), 1;
    think_budget_take(&r->tb, t);
    sampler_note(&r->smp, &t, 1, 1);
    emit_token(e, r, t);
    r->token = t;
    r->generated++;
    if (r->generated >= r->sub.max_tokens) return finish(e, r, 1), 1;
    return 0;
}

/* Sample from e->logits and take the token. With a grammar, every token it does not allow is
 * masked out first (so logprobs are those of the constrained distribution) and the matcher moves
 * past the chosen one. A reasoning budget may instead make the token the next of the family's
 * close (taken like a sampled one, with its logprob under these logits), or ban one that would
 * open reasoning it has no room for. */
static void sample_next(engine *e, request *r) {
    int forced = think_budget_force(&r->tb), ban = forced < 0 ? think_budget_ban(&r->tb) : -1;
    if (ban >= 0) e->logits[ban] = -INFINITY;
    if (r->g && tokmask_apply(&r->km, e->logits) == 0)
        return refuse(e, r, "GRAMMAR_DEAD_END", gm_overflowed(r->km.m)
                                                    ? "the grammar is too ambiguous (over 4096 parses at once) to continue"
                                                    : "no token of this vocabulary can continue the grammar here");
    if (forced >= 0 && r->g && e->logits[forced] == -INFINITY)
        return refuse(e, r, "GRAMMAR_DEAD_END", "the grammar does not let reasoning end where think_budget ends it");
    take_token(e, r, forced >= 0 ? forced : sampler_pick(&r->smp, e->logits));  /* seq_feed checked the logits are finite */
}

/* Drafts this request may take in a speculative step: none with a grammar (a draft would have to
 * follow the mask too), with logit bias or penalties (the adjusted distribution of each verify row
 * depends on the drafts before it), while a reasoning budget may still force or ban a token (it
 * decides each token before it is sampled), or when fewer than two tokens remain. */
static int spec_drafts(const engine *e, const request *r) {
    if (r->g || r->smp.adjusted || think_budget_live(&r->tb)) return 0;
    return (int)MIN(e->o.draft, r->sub.max_tokens - r->generated - 1);
}

/* A generating request whose next token can enter its slot: it joins the batched decode step. */
static int decoding(const engine *e, const request *r) {
    const state *st = &e->seqs[r->slot]->st;
    return !r->prefilling && !r->stop && st->len < st->cap;
}

/* After a prefill chunk went in (rc: reuse_prefill_step's); a completed prompt's last logits are
 * in e->logits, and its first token is sampled from them. */
static void prefilled(engine *e, request *r, int rc) {
    if (rc > 0) {
        if (r->stop) finish(e, r, 0);
        return;
    }
    r->prefilling = 0;
    if (r->stop || r->sub.max_tokens == 0) return finish(e, r, 0);
    sample_next(e, r);
}

/* A prefill chunk in a call of its own, or the end of a request that cannot decode further (STOP,
 * full slot). */
static void step(engine *e, request *r) {
    char err[256];
    if (r->prefilling) {
        double t = now_seconds();
        int rc = reuse_prefill_step(&r->pf, e->logits, err, sizeof err);
        r->prefill_s += now_seconds() - t;
        if (rc < 0) return fail(e, r, "ENGINE_ERROR", err);
        return prefilled(e, r, rc);
    }
    finish(e, r, !r->stop);
}

/* Takes what a request's job of the step produced: with no drafts, the next token sampled from
 * its row (grammar, bias and penalties apply there); else each kept draft and then the chosen
 * token, each from its verify row. A draft that ends the request (EOS, max_tokens) is first cut
 * back out of the state, since plain decoding never feeds the token it ends on. */
static void take_job(engine *e, request *r, const spec_job *j) {
    size_t v = (size_t)e->m->vocab_size;
    state *st = &e->seqs[r->slot]->st;
    if (!j->k) {
        memcpy(e->logits, j->rows, v * sizeof *e->logits);
        return sample_next(e, r);
    }
    if (e->log_steps) fprintf(stderr, "spec: slot %d kept %d of %d drafts\n", r->slot, j->accepted, j->k);
    for (int i = 1; i <= j->n_out; i++) {
        int t = i < j->n_out ? j->out[i] : j->pending;
        memcpy(e->logits, j->rows + (size_t)(i - 1) * v, v * sizeof *e->logits);
        if (i < j->n_out && (model_is_eos(e->m, t) || r->generated + 1 >= r->sub.max_tokens))
            state_truncate(st, st->len - (j->n_out - i));
        if (take_token(e, r, t)) return;
    }
}

/* One step for each of the k decoding requests, in ONE forward call: one token each, or with
 * --spec a speculative step's next + drafts for the requests that may draft (seq_spec_steps);
 * and the next chunk of each of the np prefilling requests ps[] the joint-step budget
 * (seq_join_rows) leaves room for, in slot order, in that same call. A failure taints every slot
 * of the call, so each of its requests fails. Row buffers: decode request i's at step_logits
 * block i, prefill request j's at block k + j. */
static void joint_step(engine *e, request **rs, int k, request **ps, int np) {
    char err[256];
    spec_job jobs[64];
    feed_job feeds[64];
    size_t rows = (size_t)(e->o.draft + 1) * (size_t)e->m->vocab_size;
    int decode_rows = 0, nf = 0, prefill_rows = 0;
    for (int i = 0; i < k; i++) {
        jobs[i] = (spec_job){.s = e->seqs[rs[i]->slot], .next = rs[i]->token, .k = e->o.draft ? spec_drafts(e, rs[i]) : 0,
                             .smp = &rs[i]->smp, .rows = e->step_logits + (size_t)i * rows};
        decode_rows += jobs[i].k + 1;
    }
    for (int budget = seq_join_rows(e->m, decode_rows); nf < np && budget > 0; nf++) {
        request *r = ps[nf];
        seq *s = e->seqs[r->slot];
        feed_job *f = &feeds[nf];
        f->s = s;
        f->n = reuse_prefill_next(&r->pf, MIN(budget, s->chunk), &f->ids);
        f->logits = s->st.len + f->n == r->n ? e->step_logits + (size_t)(k + nf) * rows : NULL;
        budget -= f->n;
        prefill_rows += f->n;
    }
    unsigned long long dense0, routed0, dense1, routed1, jobs0 = pool_jobs();
    kernels_streamed(&dense0, &routed0);
    double t0 = now_seconds();
    int rc = seq_spec_steps(jobs, k, feeds, nf, err, sizeof err);
    double dt = now_seconds() - t0;
    kernels_streamed(&dense1, &routed1);
    if (e->log_steps)
        fprintf(stderr, "step pool jobs: %llu\nstep: %d slots decoded in one forward call, weight bytes streamed: dense %llu"
                        " routed %llu; prefill rows %d of %d requests\n", pool_jobs() - jobs0, k, dense1 - dense0,
                routed1 - routed0, prefill_rows, nf);
    if (rc) {
        for (int i = 0; i < k; i++) fail(e, rs[i], "ENGINE_ERROR", err);
        for (int i = 0; i < nf; i++) fail(e, ps[i], "ENGINE_ERROR", err);
        return;
    }
    for (int i = 0; i < k; i++) take_job(e, rs[i], &jobs[i]);
    for (int i = 0; i < nf; i++) {
        ps[i]->prefill_s += dt;
        if (feeds[i].logits) memcpy(e->logits, feeds[i].logits, (size_t)e->m->vocab_size * sizeof *e->logits);
        prefilled(e, ps[i], reuse_prefill_fed(&ps[i]->pf));
    }
}

/* ---- prompts ------------------------------------------------------------------------------ */

/* "12 7 301" -> ids. *cut_ids gets how many ids end within the first `cut` bytes (cut < 0: none). */
static int parse_id_list(const char *p, size_t n, int vocab, int **out, int *nout, int cut, int *cut_ids, char *err,
                         size_t errlen) {
    int *ids = xmalloc((n / 2 + 1) * sizeof *ids), k = 0;
    *cut_ids = 0;
    for (size_t i = 0; i < n;) {
        if (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r') { i++; continue; }
        long v = 0;
        size_t start = i;
        while (i < n && p[i] >= '0' && p[i] <= '9' && v < vocab) v = v * 10 + (p[i++] - '0');
        int ends = i == n || p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r';
        if (i == start || !ends || v >= vocab) {
            free(ids);
            return errf(err, errlen, "ids=1 prompt: bad token id at byte %zu (decimal ids below %d, space separated)",
                        start, vocab);
        }
        if (cut >= 0 && i <= (size_t)cut) (*cut_ids)++;
        ids[k++] = (int)v;
    }
    *out = ids;
    *nout = k;
    return 0;
}

/* The prompt text's ids; bytes in an untrusted span never become added tokens (wire.h). */
typedef struct {
    const char *p;
    tok_span *untrusted;
    int nuntrusted;
} prompt_text;

static int encode_text(const tokenizer *t, const prompt_text *pt, size_t n, int **out, int *nout, char *err,
                       size_t errlen) {
    int cap = (int)MIN(n + 16, (size_t)WIRE_PROMPT_MAX + 16);
    int *ids = xmalloc((size_t)cap * sizeof *ids);
    int k = tok_encode_untrusted(t, pt->p, n, pt->untrusted, pt->nuntrusted, ids, cap, err, errlen);
    if (k > cap) {
        ids = xrealloc(ids, (size_t)k * sizeof *ids);
        k = tok_encode_untrusted(t, pt->p, n, pt->untrusted, pt->nuntrusted, ids, k, err, errlen);
    }
    if (k < 0) { free(ids); return -1; }
    *out = ids;
    *nout = k;
    return 0;
}

/* Token position of the gateway's system-prompt hint, if the prefix tokenizes to a prefix. */
static int text_sys_end(const tokenizer *t, const prompt_text *pt, int prefix_bytes, const int *ids, int n) {
    int *pre, k;
    char err[64];
    if (prefix_bytes <= 0 || encode_text(t, pt, (size_t)prefix_bytes, &pre, &k, err, sizeof err)) return 0;
    int ok = k > 0 && k < n && memcmp(pre, ids, (size_t)k * sizeof *ids) == 0;
    free(pre);
    return ok ? k : 0;
}

static int tokenize(engine *e, const wire_frame *f, request *r, int *sys_end, char *err, size_t errlen) {
    *sys_end = 0;
    if (f->sub.ids)
        return parse_id_list(f->payload, f->payload_len, e->m->vocab_size, &r->prompt, &r->n, f->sub.prefix_bytes,
                             sys_end, err, errlen);
    if (!e->m->tok) return errf(err, errlen, "this model has no usable tokenizer.json: send token ids with ids=1");
    prompt_text pt = {f->payload, NULL, 0};
    if (f->sub.untrusted_bytes &&
        wire_parse_spans(f->ext, f->sub.untrusted_bytes, f->payload_len, &pt.untrusted, &pt.nuntrusted, err, errlen))
        return -1;
    int rc = encode_text(e->m->tok, &pt, f->payload_len, &r->prompt, &r->n, err, errlen);
    if (!rc) *sys_end = text_sys_end(e->m->tok, &pt, f->sub.prefix_bytes, r->prompt, r->n);
    free(pt.untrusted);
    return rc;
}

/* ---- commands ----------------------------------------------------------------------------- */

static request *find_active(engine *e, const char *id) {
    for (int i = 0; i < e->o.slots; i++)
        if (e->active[i] && !strcmp(e->active[i]->id, id)) return e->active[i];
    return NULL;
}

/* After the span table: the grammar (grammar=B bytes, else all of the rest unless the family takes
 * media), then the family's media. */
static size_t grammar_len(const engine *e, const wire_frame *f) {
    if (f->sub.has_grammar_bytes) return f->sub.grammar_bytes;
    return e->m->media_token >= 0 ? 0 : f->ext_len - f->sub.untrusted_bytes;
}

/* Media (the extension payload of a family that takes it: Inkling's DMel frames) must fill every
 * placeholder of the prompt exactly. Returns the first placeholder position (r->n if none). */
static int attach_media(engine *e, const wire_frame *f, request *r, char *err, size_t errlen) {
    int first = r->n, count = 0;
    for (int i = 0; i < r->n; i++)
        if (r->prompt[i] == e->m->media_token) {
            if (first == r->n) first = i;
            count++;
        }
    size_t skip = f->sub.untrusted_bytes + grammar_len(e, f), len = f->ext_len - skip;
    if (!len) return r->n;
    if (e->m->media_token < 0) return errf(err, errlen, "this model takes no media in the extension payload");
    seq *sq = e->seqs[r->slot];
    int frames = seq_set_media(sq, (const unsigned char *)f->ext + skip, len, err, errlen);
    if (frames >= 0 && frames != count)
        frames = errf(err, errlen, "media: %d frames for %d placeholder positions (token %d)", frames, count,
                      e->m->media_token);
    if (frames < 0) {
        seq_set_media(sq, NULL, 0, NULL, 0);
        return -1;
    }
    return first;
}

static void start_request(engine *e, request *r, int sys_end, int media_from) {
    seq *sq = e->seqs[r->slot];
    /* positions from the first media placeholder on are never taken from a state: ids do not
     * describe them (a text-only record could hold the placeholder id as a plain token) */
    int keep = MIN(r->n, media_from + 1);
    reuse_result rr = reuse_prepare(&sq->st, r->slot, e->cs, e->o.kv_share, e->states, e->o.slots, r->prompt, keep);
    r->reused = rr.reused;
    if (e->log_prefix)
        fprintf(stderr, "prefix: slot %d reused %d/%d (%s)\n", r->slot, rr.reused, r->n, reuse_kind_name(rr.kind));
    reuse_prefill_init(&r->pf, seq_feeder(sq), e->cs, r->slot, r->prompt, r->n, sys_end, e->m->markers.all, e->m->markers.n_all);
    const wire_submit *w = &r->sub;
    sampler_params sp = {.temperature = w->temperature, .top_p = w->top_p, .seed = w->seed, .top_k = w->top_k,
                         .min_p = w->min_p, .repetition_penalty = w->repetition, .presence_penalty = w->presence,
                         .frequency_penalty = w->frequency};
    sampler_init(&r->smp, &sp, e->m->vocab_size);
    sampler_note(&r->smp, r->prompt, r->n, 0);
    if (e->bias_id[0] && !strcmp(e->bias_id, r->id)) sampler_bias(&r->smp, e->bias_ids, e->bias_vals, e->nbias);
    if (e->m->tok) tok_stream_init(&r->ts, e->m->tok);
    r->prefilling = 1;
    e->active[r->slot] = r;
}

/* A SUBMIT refused before it touched any state. */
static void reject(request *r, const char *code, const char *detail) {
    put_error(r->id, code, detail);
    free(r->prompt);
    if (r->g) tokmask_free(&r->km);
    grammar_free(r->g);
    free(r);
}

/* The extension payload after the span table (wire.h) is GBNF text: the gateway compiles JSON
 * Schemas and tool-call syntaxes to it (serve/constrain.h). */
static int open_grammar(engine *e, const wire_frame *f, request *r, char *err, size_t errlen) {
    if (!e->vocab) return errf(err, errlen, "grammar: this model has no usable tokenizer.json to match tokens against");
    if (!(r->g = grammar_parse(f->ext + f->sub.untrusted_bytes, grammar_len(e, f), err, errlen))) return -1;
    tokmask_init(&r->km, e->vocab, r->g);
    return 0;
}

/* think_budget=N over the family's own reasoning markers (think_budget.h). */
static int open_think_budget(engine *e, request *r, char *err, size_t errlen) {
    return think_budget_for(&r->tb, r->sub.think_budget, e->m->ops->chat, e->m->tok, err, errlen);
}

static void on_submit(engine *e, const wire_frame *f) {
    char err[256];
    if (find_active(e, f->id)) return put_error(f->id, "DUPLICATE_ID", "an in-flight request has this id");
    if (f->sub.slot >= e->o.slots) {
        snprintf(err, sizeof err, "slot %d out of range (engine has %d)", f->sub.slot, e->o.slots);
        return put_error(f->id, "BAD_REQUEST", err);
    }
    if (e->active[f->sub.slot]) return put_error(f->id, "SLOT_BUSY", NULL);
    if (e->image_id[0] && !strcmp(e->image_id, f->id)) {
        e->image_id[0] = 0;
        return put_error(f->id, "BAD_REQUEST", "this model takes no images");
    }
    if (e->bias_id[0] && !strcmp(e->bias_id, f->id) && e->nbias < 0) return put_error(f->id, "BAD_REQUEST", e->bias_error);
    if (f->sub.untrusted_bytes && f->sub.ids)
        return put_error(f->id, "BAD_REQUEST", "untrusted spans apply to text prompts, not ids=1");
    if (f->payload_len == 0) return put_error(f->id, "EMPTY_PROMPT", NULL);
    request *r = xcalloc(1, sizeof *r);
    snprintf(r->id, sizeof r->id, "%s", f->id);
    r->slot = f->sub.slot;
    r->sub = f->sub;
    int sys_end;
    if (grammar_len(e, f) && open_grammar(e, f, r, err, sizeof err))
        return reject(r, "BAD_REQUEST", err);
    if (tokenize(e, f, r, &sys_end, err, sizeof err)) return reject(r, "BAD_REQUEST", err);
    if (r->sub.think_budget && open_think_budget(e, r, err, sizeof err)) return reject(r, "BAD_REQUEST", err);
    if (r->n == 0) return reject(r, "EMPTY_PROMPT", NULL);
    int cap = e->seqs[r->slot]->st.cap;
    if (r->n > cap) {
        /* the conversation no longer fits this slot: its state is not worth keeping either */
        snprintf(err, sizeof err, "%d %d", r->n, cap);
        state_taint(&e->seqs[r->slot]->st);
        return reject(r, "CONTEXT_EXCEEDED", err);
    }
    int media_from = attach_media(e, f, r, err, sizeof err);
    if (media_from < 0) return reject(r, "BAD_REQUEST", err);
    start_request(e, r, sys_end, media_from);
    char h[WIRE_HEADER_MAX];
    put_frame(h, wire_fmt_accept(h, r->id, r->n, r->reused), NULL, 0);
}

/* SLOT: llama.cpp-style slot files, DIR/slots/NAME/ in persist.h's layout (as slot 0 there).
 * The slot must be idle; a restore or erase replaces what the slot held, and is persisted. */
static void on_slot(engine *e, const wire_frame *f) {
    char err[512], dir[4096], h[WIRE_HEADER_MAX];
    if (!e->o.kv_dir) return put_error(f->id, "BAD_REQUEST", "slot files live under --kv-dir, which this engine has not");
    if (f->slot >= e->o.slots) return put_error(f->id, "BAD_REQUEST", "no such slot");
    if (e->active[f->slot]) return put_error(f->id, "SLOT_BUSY", NULL);
    if (!wire_slot_name_ok(f->payload, f->payload_len))
        return put_error(f->id, "BAD_REQUEST", "a slot file name is 1..63 of A-Z a-z 0-9 . _ - (not starting with .)");
    snprintf(dir, sizeof dir, "%s/slots", e->o.kv_dir);
    mkdir(dir, 0755);
    snprintf(dir, sizeof dir, "%s/slots/%.*s", e->o.kv_dir, (int)f->payload_len, f->payload);
    state *st = &e->seqs[f->slot]->st;
    int n = st->len;
    if (f->action == WIRE_SLOT_SAVE) {
        if (!state_usable(st) || n == 0) return put_error(f->id, "BAD_REQUEST", "the slot holds nothing to save");
        mkdir(dir, 0755);
        if (persist_save(dir, 0, st, e->m->fingerprint, err, sizeof err)) return put_error(f->id, "BAD_REQUEST", err);
    } else if (f->action == WIRE_SLOT_RESTORE) {
        char rows[4200];
        snprintf(rows, sizeof rows, "%s/slot-0.cairnkv", dir);
        if (access(rows, R_OK)) return put_error(f->id, "BAD_REQUEST", "no slot file of that name");
        state_reset(st);          /* a file that then fails its checks leaves the slot empty */
        int rc = persist_load(dir, 0, st, e->m->fingerprint, err, sizeof err);
        save_slot(e, f->slot);
        if (rc <= 0) return put_error(f->id, "BAD_REQUEST", rc == 0 ? "no slot file of that name" : err);
        n = st->len;
    } else {
        state_reset(st);
        save_slot(e, f->slot);
    }
    wire_done d = {.completion = n, .rss_gb = rss_gb(), .prompt_tokens = n};
    put_frame(h, wire_fmt_done(h, f->id, &d), NULL, 0);
}

/* A BIAS frame: kept for the SUBMIT with its id, which comes next (a bad one refuses that SUBMIT,
 * so the request has one ERROR and never runs without the bias it asked for). */
static void on_bias(engine *e, const wire_frame *f) {
    e->nbias = wire_parse_bias(f->payload, f->payload_len, e->m->vocab_size, e->bias_ids, e->bias_vals, e->bias_error);
    snprintf(e->bias_id, sizeof e->bias_id, "%s", f->id);
}

static void on_cancel(engine *e, const char *id) {
    request *r = find_active(e, id);
    if (!r) return put_error(id, "NOT_FOUND", NULL);
    /* a prefill cut short leaves a state the prompt only partly describes: the next turn resets */
    if (r->prefilling) state_taint(&e->seqs[r->slot]->st);
    save_slot(e, r->slot);
    put_error(r->id, "CANCELLED", NULL);
    request_free(e, r);
}

static void on_frame(engine *e, const wire_frame *f) {
    switch (f->kind) {
    case WIRE_SUBMIT:
        on_submit(e, f);
        e->bias_id[0] = 0;        /* a BIAS belongs to the SUBMIT right after it only */
        return;
    case WIRE_CANCEL: return on_cancel(e, f->id);
    case WIRE_STOP: {
        request *r = find_active(e, f->id);
        if (!r) return put_error(f->id, "NOT_FOUND", NULL);
        r->stop = 1;
        return;
    }
    case WIRE_IMAGE: snprintf(e->image_id, sizeof e->image_id, "%s", f->id); return;
    case WIRE_BIAS: return on_bias(e, f);
    case WIRE_SLOT: return on_slot(e, f);
    case WIRE_ERROR: return put_error(f->id, f->code, f->detail);
    default: return;
    }
}

/* Read what stdin has (waiting only if block) and act on every complete frame. */
static void poll_input(engine *e, int block) {
    if (e->eof) return;
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(0, &rd);
    struct timeval zero = {0, 0};
    int ready = select(1, &rd, NULL, NULL, block ? NULL : &zero);
    if (ready <= 0) return;
    static char buf[1 << 16];
    ssize_t got = read(0, buf, sizeof buf);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
    wire_frame f;
    if (got <= 0) {
        e->eof = 1;
        if (wire_reader_eof(&e->rd, &f)) on_frame(e, &f);
        return;
    }
    wire_reader_push(&e->rd, buf, (size_t)got);
    while (wire_reader_next(&e->rd, &f)) on_frame(e, &f);
}

static int any_active(const engine *e) {
    for (int i = 0; i < e->o.slots; i++)
        if (e->active[i]) return 1;
    return 0;
}

static int any_decoding(const engine *e) {
    for (int i = 0; i < e->o.slots; i++)
        if (e->active[i] && decoding(e, e->active[i])) return 1;
    return 0;
}

/* Requests that cannot decode further end, one at a time with input polled in between; so do
 * prefill chunks when nothing decodes (then a chunk is a call of its own, as large as the
 * sequence's chunk). Then the decoding requests and, while any decodes, the prefilling ones are
 * gathered with no poll in between (a CANCEL there would free one) into one joint step. */
static void run_loop(engine *e) {
    for (;;) {
        poll_input(e, !any_active(e));
        if (e->eof && !any_active(e)) return;
        for (int i = 0; i < e->o.slots; i++) {
            request *r = e->active[i];
            if (r && !decoding(e, r) && !(r->prefilling && any_decoding(e))) step(e, r);
            poll_input(e, 0);
        }
        int k = 0, np = 0;
        request **ps = e->stepping + e->o.slots;
        for (int i = 0; i < e->o.slots; i++)
            if (e->active[i] && decoding(e, e->active[i])) e->stepping[k++] = e->active[i];
            else if (e->active[i] && e->active[i]->prefilling) ps[np++] = e->active[i];
        if (k) joint_step(e, e->stepping, k, ps, np);
    }
}

/* ---- set-up ------------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: cairn engine -m DIR [options]\n"
            "Speaks the engine line protocol (SUBMIT/STOP/CANCEL in, ACCEPT/DATA/DONE/ERROR out) on stdin/stdout.\n"
            "  --slots N          independent conversation slots (default 1)\n"
            "  --ctx N            context positions per slot (default min(4096, model maximum))\n"
            "  --ckpt-mb N        checkpoint memory budget in MiB, 0 = no checkpoints (default 512)\n"
            "  --kv-share 0|1     let a new prompt copy a longer prefix from another slot (default 1)\n"
            "  --kv-dir DIR       save each slot's state before every turn's DONE, reload at start-up\n"
            "  --numerics qat|exact  activation numerics (default qat)\n"
            "  --threads N        worker threads (default: online cores)\n"
            "  --spec mtp         speculative decoding with the checkpoint's MTP layer (CAPS draft=K)\n"
            "  --draft K          drafts per speculative step with --spec (default 2, at most 8)\n"
            CLI_EXPERT_CACHE_HELP
            "                     (with --kv-dir, the expert usage counts that choose the pinned experts\n"
            "                     are kept there)\n"
            CLI_MLOCK_HELP
            "Environment: CAIRN_PREFIX_LOG=1 logs the reuse decision per request on stderr.\n");
}

static int parse_flags(int argc, char **argv, engine_opts *o) {
    *o = (engine_opts){.slots = 1, .ckpt_mb = 512, .kv_share = 1, .num = NUMERICS_QAT};
    int spec = 0;
    for (int i = 1; i < argc;) {
        const char *a = argv[i++], *v;
        long l;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); exit(0); }
        if (!strcmp(a, "--mlock")) { o->mlock = 1; continue; }
        if (i == argc) { fprintf(stderr, "cairn engine: %s needs a value (or unknown flag)\n", a); return -1; }
        v = argv[i++];                      /* every other flag takes a value */
        if (!strcmp(a, "-m")) o->model_dir = v;
        else if (!strcmp(a, "--kv-dir")) o->kv_dir = v;
        else if (!strcmp(a, "--slots")) { if (cli_int("engine", a, v, 1, 64, &l)) return -1; o->slots = (int)l; }
        else if (!strcmp(a, "--ctx")) { if (cli_int("engine", a, v, 1, 1 << 24, &l)) return -1; o->ctx = (int)l; }
        else if (!strcmp(a, "--ckpt-mb")) { if (cli_int("engine", a, v, 0, 1L << 30, &o->ckpt_mb)) return -1; }
        else if (!strcmp(a, "--kv-share")) { if (cli_int("engine", a, v, 0, 1, &l)) return -1; o->kv_share = (int)l; }
        else if (!strcmp(a, "--threads")) { if (cli_int("engine", a, v, 1, 1024, &l)) return -1; o->threads = (int)l; }
        else if (!strcmp(a, "--spec")) {
            if (strcmp(v, "mtp")) { fprintf(stderr, "cairn engine: bad value for --spec: '%s' (mtp)\n", v); return -1; }
            spec = 1;
        } else if (!strcmp(a, "--draft")) { if (cli_int("engine", a, v, 1, SPEC_MAX_DRAFT, &o->draft)) return -1; }
        else if (!strcmp(a, "--expert-cache-mb")) { if (cli_expert_cache_mb("engine", v, &o->expert_cache_mb)) return -1; }
        else if (!strcmp(a, "--numerics")) {
            int n = cli_numerics(v);
            if (n < 0) { fprintf(stderr, "cairn engine: bad value for --numerics: '%s' (exact or qat)\n", v); return -1; }
            o->num = (numerics)n;
        } else { fprintf(stderr, "cairn engine: unknown flag '%s' (see cairn engine --help)\n", a); return -1; }
    }
    if (!o->model_dir) { fprintf(stderr, "cairn engine: -m DIR is required (see cairn engine --help)\n"); return -1; }
    if (o->draft && !spec) { fprintf(stderr, "cairn engine: --draft needs --spec mtp\n"); return -1; }
    if (spec && !o->draft) o->draft = 2;
    return 0;
}

static void load_slots(engine *e) {
    for (int i = 0; i < e->o.slots; i++) {
        char err[512];
        int rc = persist_load(e->o.kv_dir, i, &e->seqs[i]->st, e->m->fingerprint, err, sizeof err);
        if (rc < 0) fprintf(stderr, "cairn engine: kv-dir: ignoring %s\n", err);
        if (rc > 0) fprintf(stderr, "cairn engine: kv-dir: slot %d resumed with %d tokens\n", i, e->seqs[i]->st.len);
        int ck = rc > 0 && e->cs ? persist_load_checkpoints(e->o.kv_dir, i, e->cs, &e->seqs[i]->st, e->m->fingerprint,
                                                            err, sizeof err) : 0;
        if (ck < 0) fprintf(stderr, "cairn engine: kv-dir: ignoring %s\n", err);
        if (ck > 0) fprintf(stderr, "cairn engine: kv-dir: slot %d resumed %d checkpoints\n", i, ck);
    }
}

/* Before READY, what every resumed slot holds, as text (wire.h RECORD). The gateway routes a
 * prompt to the slot whose text it extends; without this a restarted engine's resumed slots
 * would all look empty to it, and the first turns would overwrite each other's states. */
static void announce_records(engine *e) {
    if (!e->m->tok) return;
    for (int i = 0; i < e->o.slots; i++) {
        const state *st = &e->seqs[i]->st;
        size_t n = 0;
        char *text = st->len ? tok_decode(e->m->tok, st->ids, st->len, &n) : NULL;
        if (text && n <= WIRE_RECORD_MAX) {
            char h[WIRE_HEADER_MAX];
            fwrite(h, 1, wire_fmt_record(h, i, n), stdout);
            fwrite(text, 1, n, stdout);
            fputc('\n', stdout);
        }
        free(text);
    }
}

static int engine_open(engine *e, char *err, size_t errlen) {
    if (e->o.threads) pool_set_threads(e->o.threads);
    /* the load progress bar goes to stderr (a terminal, or CAIRN_PROGRESS=1): under cairn serve it
     * is the banner's first line, before the engine is ready */
    if (!(e->m = model_open(e->o.model_dir, e->o.num, 1, err, errlen))) return -1;
    if (e->o.mlock) cli_mlock("engine", e->m);
    int ctx = e->o.ctx ? e->o.ctx : MIN(4096, e->m->max_ctx);
    if (ctx > e->m->max_ctx) return errf(err, errlen, "--ctx %d exceeds the model's max_position_embeddings %d", ctx, e->m->max_ctx);
    if (e->o.draft && !(e->m->draft_layers && e->m->ops->draft))
        return errf(err, errlen, "--spec mtp: %s has no MTP layer this engine can draft with", e->o.model_dir);
    e->m->spec_mtp = e->o.draft > 0;
    e->seqs = xcalloc((size_t)e->o.slots, sizeof *e->seqs);
    e->states = xcalloc((size_t)e->o.slots, sizeof *e->states);
    e->active = xcalloc((size_t)e->o.slots, sizeof *e->active);
    for (int i = 0; i < e->o.slots; i++) {
        if (!(e->seqs[i] = seq_new(e->m, ctx, err, errlen))) return -1;
        e->states[i] = &e->seqs[i]->st;
    }
    if (e->o.ckpt_mb > 0) e->cs = store_new((size_t)e->o.ckpt_mb << 20);
    int v = e->m->vocab_size;
    e->logits = xmalloc((size_t)v * sizeof *e->logits);
    e->logprobs = xmalloc((size_t)v * sizeof *e->logprobs);
    e->step_logits = xmalloc((size_t)e->o.slots * (size_t)(e->o.draft + 1) * v * sizeof *e->step_logits);
    e->stepping = xcalloc(2 * (size_t)e->o.slots, sizeof *e->stepping);    /* decoding, then prefilling */
    e->top_ids = xmalloc(WIRE_LOGPROBS_MAX * sizeof *e->top_ids);
    e->bias_ids = xmalloc(WIRE_BIAS_ENTRIES * sizeof *e->bias_ids);
    e->bias_vals = xmalloc(WIRE_BIAS_ENTRIES * sizeof *e->bias_vals);
    e->top_lps = xmalloc(WIRE_LOGPROBS_MAX * sizeof *e->top_lps);
    if (e->m->tok) e->vocab = tokvocab_new(e->m->tok, v, e->m->eos_ids, e->m->n_eos);
    /* the saved states hold conversations: only the engine's user may read them */
    if (e->o.kv_dir && mkdir(e->o.kv_dir, 0700) && errno != EEXIST)
        return errf(err, errlen, "--kv-dir %s: %s", e->o.kv_dir, strerror(errno));
    if (e->o.kv_dir) load_slots(e);
    if (e->o.expert_cache_mb && model_expert_cache(e->m, e->o.expert_cache_mb, e->o.kv_dir, err, errlen)) return -1;
    const char *log = getenv("CAIRN_PREFIX_LOG");
    e->log_prefix = log && !strcmp(log, "1");
    const char *step_log = getenv("CAIRN_STEP_LOG");
    e->log_steps = step_log && !strcmp(step_log, "1");
    wire_reader_init(&e->rd);
    return 0;
}

static void engine_close(engine *e) {
    for (int i = 0; e->active && i < e->o.slots; i++)
        if (e->active[i]) request_free(e, e->active[i]);
    for (int i = 0; e->seqs && i < e->o.slots; i++) seq_free(e->seqs[i]);
    free(e->seqs);
    free(e->states);
    free(e->active);
    store_free(e->cs);
    free(e->logits);
    free(e->logprobs);
    free(e->step_logits);
    free(e->stepping);
    free(e->top_ids);
    free(e->bias_ids);
    free(e->bias_vals);
    free(e->top_lps);
    tokvocab_free(e->vocab);
    wire_reader_free(&e->rd);
    persist_forget();
    if (e->m && experts_cached(e->m->experts)) {
        char line[1024];
        experts_stats_line(e->m->experts, line, sizeof line);
        fprintf(stderr, "cairn engine: %s\n", line);
    }
    if (e->m && cluster_size() > 1) {
        char line[512];
        experts_parallel_line(e->m->experts, line, sizeof line);
        fprintf(stderr, "cairn engine: %s\n", line);
    }
    model_close(e->m);
}

int cmd_engine(int argc, char **argv) {
    engine e = {0};
    if (parse_flags(argc, argv, &e.o)) return 2;
    /* it reads a model, writes --kv-dir and talks over its pipes: it never needs to gain
     * privileges (setuid binaries, file capabilities) from anything it might execute */
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    char err[512];
    if (engine_open(&e, err, sizeof err)) {
        fprintf(stderr, "cairn engine: %s\n", err);
        engine_close(&e);
        return 1;
    }
    /* a gateway that went away must not kill us mid-write; the next read sees EOF */
    signal(SIGPIPE, SIG_IGN);
    wire_caps caps = {.slots = e.o.slots, .ctx = e.seqs[0]->st.cap, .logprobs = WIRE_LOGPROBS_MAX, .ids = 1,
                      .truncate = e.m->ops->truncates, .checkpoints = e.cs != NULL,
                      .grammar = e.vocab != NULL, .draft = (int)e.o.draft};
    snprintf(caps.numerics, sizeof caps.numerics, "%s", e.o.num == NUMERICS_EXACT ? "exact" : "qat");
    snprintf(caps.family, sizeof caps.family, "%s", e.m->ops->name);
    char h[WIRE_HEADER_MAX];
    announce_records(&e);
    fputs(WIRE_READY, stdout);
    fwrite(h, 1, wire_fmt_caps(h, &caps), stdout);
    fwrite(h, 1, wire_fmt_idle_stat(h, rss_gb()), stdout);
    fflush(stdout);
    run_loop(&e);
    engine_close(&e);
    return 0;
}
