#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../core/config.h"
#include "../core/experts.h"
#include "../core/ops.h"
#include "../core/quant.h"
#include "../core/sampler.h"
#include "../core/threads.h"
#include "../core/util.h"

/* The family's turn tokens as ids of this tokenizer; a token it lacks is left out (-1). */
static void resolve_markers(model *m) {
    model_markers *k = &m->markers;
    const family_turns *t = &m->ops->turns;
    k->user = k->assistant = -1;
    if (!m->tok) return;
    for (int i = 0; i < FAMILY_MAX_TOKENS && t->start[i]; i++) {
        int id = tok_id(m->tok, t->start[i]);
        if (id >= 0) k->start[k->n_start++] = id;
    }
    k->user = t->user ? tok_id(m->tok, t->user) : -1;
    k->assistant = t->assistant ? tok_id(m->tok, t->assistant) : -1;
    if (k->user >= 0) k->all[k->n_all++] = k->user;
    if (k->assistant >= 0) k->all[k->n_all++] = k->assistant;
    for (int i = 0; i < FAMILY_MAX_TOKENS && t->boundaries[i]; i++) {
        int id = tok_id(m->tok, t->boundaries[i]);
        if (id >= 0) k->all[k->n_all++] = id;
    }
}

static void read_eos_ids(model *m) {
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(m->config, "eos_token_id");
    if (cJSON_IsNumber(eos)) m->eos_ids[m->n_eos++] = eos->valueint;
    else if (cJSON_IsArray(eos)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, eos) if (cJSON_IsNumber(e) && m->n_eos < 8) m->eos_ids[m->n_eos++] = e->valueint;
    }
}

/* Every routed expert the tensor table recorded (TT_ROUTED rows: layer, expert, in table order)
 * goes to the expert registry, so each family's MoE reaches it through experts_run, mapped or
 * cached. One pass over the record: a real checkpoint has ~10^5 expert tensors. */
static int register_experts(model *m, char *err, size_t errlen) {
    const tt_table *w = &m->weights;
    int nl = 0, ne = 0;
    for (int i = 0; i < w->n; i++)
        if (w->list[i].role == TT_ROUTED) {
            nl = MAX(nl, w->list[i].layer + 1);
            ne = MAX(ne, w->list[i].expert + 1);
        }
    size_t cells = (size_t)nl * (size_t)ne;
    qmat *mats = xcalloc(cells * EXPERT_MATS + 1, sizeof *mats);
    int *nm = xcalloc(cells + 1, sizeof *nm), rc = 0;
    for (int i = 0; i < w->n && !rc; i++) {
        const tt_entry *e = &w->list[i];
        if (e->role != TT_ROUTED) continue;
        size_t c = (size_t)e->layer * (size_t)ne + (size_t)e->expert;
        if (!e->mat || e->layer < 0 || e->expert < 0 || nm[c] == EXPERT_MATS)
            rc = errf(err, errlen, "tensor %s: not a routed expert matrix the expert registry can hold", e->t->name);
        else
            mats[c * EXPERT_MATS + (size_t)nm[c]++] = *e->mat;
    }
    for (size_t c = 0; c < cells && !rc; c++)
        if (nm[c]) rc = experts_add(m->experts, (int)(c / (size_t)ne), (int)(c % (size_t)ne), mats + c * EXPERT_MATS, nm[c], err, errlen);
    free(mats);
    free(nm);
    return rc;
}

model *model_open(const char *dir, numerics num, int progress, char *err, size_t errlen) {
    model *m = xcalloc(1, sizeof *m);
    m->dir = xstrdup(dir);
    m->num = num;
    m->bos_id = -1;
    m->media_token = -1;
    if (!(m->config = config_load(dir, err, errlen))) goto fail;
    const char *type;
    if (config_string(m->config, "model_type", &type, err, errlen)) goto fail;
    if (!(m->ops = family_for_model_type(type))) { errf(err, errlen, "config.json: unsupported model_type '%s'", type); goto fail; }
    if (!(m->st = st_open(dir, progress, err, errlen))) goto fail;
    m->fingerprint = st_fingerprint(m->st);
    m->experts = experts_new(m->st);
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *probe = fopen(path, "rb");
    if (probe) {
        fclose(probe);
        /* Weights are usable without text: a tokenizer.json of a kind cairn does not read (or a
         * broken one) leaves the model serving token-id prompts, and says why. */
        char tok_err[256];
        if (!(m->tok = tok_load(path, tok_err, sizeof tok_err)))
            fprintf(stderr, "cairn: %s: tokenizer not usable, token-id prompts only: %s\n", path, tok_err);
    }
    resolve_markers(m);
    int bos;
    if (config_int_or(m->config, "bos_token_id", -1, &bos, err, errlen)) goto fail;
    m->bos_id = bos;
    read_eos_ids(m);
    if (config_int_or(m->config, "max_position_embeddings", 4096, &m->max_ctx, err, errlen)) goto fail;
    tt_init(&m->weights, m->st, err, errlen);
    if (m->ops->load(m, err, errlen) || register_experts(m, err, errlen)) goto fail;
    if (experts_count(m->experts) && (!m->ops->expert || !m->ops->expert_scratch)) {
        errf(err, errlen, "family %s has routed experts but no expert function", m->ops->name);
        goto fail;
    }
    if (m->pass_rows < 1) {
        errf(err, errlen, "family %s declares no rows per forward pass (model.pass_rows)", m->ops->name);
        goto fail;
    }
    experts_bind(m->experts, m->ops->expert, m->ops->expert_scratch, m);
    m->n_validated = m->weights.count;
    m->weights.err = NULL;     /* the caller's buffer is gone after open */
    m->weights.errlen = 0;
    return m;
fail:
    model_close(m);
    return NULL;
}

int model_expert_cache(model *m, double mb, const char *usage_dir, char *err, size_t errlen) {
    char path[4096];
    if (usage_dir) snprintf(path, sizeof path, "%s/expert_usage.bin", usage_dir);
    return experts_cache(m->experts, (size_t)(mb * 1048576.0), usage_dir ? path : NULL, m->fingerprint, err, errlen);
}

typedef struct {
    uintptr_t lo, hi;
} span;

static int by_lo(const void *a, const void *b) {
    const span *p = a, *q = b;
    return p->lo < q->lo ? -1 : p->lo > q->lo;
}

/* The page spans of every non-routed tensor the decode step reads, sorted and merged. */
static int dense_spans(const model *m, span **out) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    span *sp = xmalloc(((size_t)m->weights.n + 1) * sizeof *sp);
    int n = 0;
    for (int i = 0; i < m->weights.n; i++) {
        const tt_entry *e = &m->weights.list[i];
        if (e->role == TT_ROUTED || e->role == TT_IDLE || !e->t->nbytes) continue;
        uintptr_t lo = (uintptr_t)e->t->data;
        sp[n++] = (span){lo / page * page, (lo + e->t->nbytes + page - 1) / page * page};
    }
    qsort(sp, (size_t)n, sizeof *sp, by_lo);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k && sp[i].lo <= sp[k - 1].hi) sp[k - 1].hi = MAX(sp[k - 1].hi, sp[i].hi);
        else sp[k++] = sp[i];
    }
    *out = sp;
    return k;
}

size_t model_mlock(model *m, char *msg, size_t msglen) {
    span *sp;
    int n = dense_spans(m, &sp);
    size_t total = 0, avail = (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < n; i++) total += sp[i].hi - sp[i].lo;
    struct rlimit rl = {0};
    getrlimit(RLIMIT_MEMLOCK, &rl);
    int i = 0, e = 0;
    if (total > avail / 2) {
        snprintf(msg, msglen, "not locked: the dense weights are %zu bytes, more than half the %zu bytes of memory "
                 "available", total, avail);
        i = -1;
    } else {
        while (i < n && !mlock((void *)sp[i].lo, sp[i].hi - sp[i].lo)) i++;
        e = errno;
    }
    if (i >= 0 && i < n) {
        while (i--) munlock((void *)sp[i].lo, sp[i].hi - sp[i].lo);
        if (rl.rlim_cur == RLIM_INFINITY)
            snprintf(msg, msglen, "not locked: mlock of %zu bytes of dense weights failed: %s", total, strerror(e));
        else
            snprintf(msg, msglen, "not locked: the dense weights are %zu bytes and RLIMIT_MEMLOCK allows %llu (raise "
                     "`ulimit -l`, or run with CAP_IPC_LOCK): %s", total, (unsigned long long)rl.rlim_cur, strerror(e));
    }
    m->locked_bytes = i == n ? total : 0;
    if (!n) snprintf(msg, msglen, "not locked: the model has no dense weights in its mapping");
    else if (m->locked_bytes) snprintf(msg, msglen, "locked %zu bytes of dense weights (%d spans)", total, n);
    free(sp);
    return m->locked_bytes;
}

void model_close(model *m) {
    if (!m) return;
    experts_free(m->experts);
    if (m->ops && m->priv) m->ops->free(m);
    tt_free(&m->weights);
    if (m->tok) tok_free(m->tok);
    if (m->st) st_close(m->st);
    cJSON_Delete(m->config);
    free(m->dir);
    free(m);
}

size_t model_decode_bytes(const model *m) { return tt_decode_bytes(&m->weights); }

double model_token_flops(const model *m, int pos) {
    return tt_matmul_flops(&m->weights) + (m->ops->extra_flops ? m->ops->extra_flops(m, pos) : 0);
}

int model_is_eos(const model *m, int id) {
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos_ids[i] == id) return 1;
    return 0;
}

int model_check_layers(const model *m, int n_layers, char *err, size_t errlen) {
    if (n_layers > st_count(m->st))
        return errf(err, errlen, "config.json: num_hidden_layers %d, but the checkpoint holds only %d tensors", n_layers,
                    st_count(m->st));
    return 0;
}

seq *seq_new(model *m, int ctx, char *err, size_t errlen) {
    seq *s = xcalloc(1, sizeof *s);
    s->m = m;
    s->chunk = 256;    /* each forward call streams the weights once: few, large calls */
    state_init(&s->st, ctx);     /* a record allocation failure only disables reuse */
    size_t scratch = m->ops->scratch_bytes ? m->ops->scratch_bytes(m, ctx) : 0;
    if (arena_init(&s->scratch, scratch)) {
        errf(err, errlen, "out of memory for %zu bytes of scratch (context %d)", scratch, ctx);
        state_deinit(&s->st);
        free(s);
        return NULL;
    }
    if (!(s->fam = m->ops->seq_new(m, &s->st, ctx, &s->scratch, err, errlen))) {
        arena_free(&s->scratch);
        state_deinit(&s->st);
        free(s);
        return NULL;
    }
    /* The descriptor's capability is what CAPS and the tests trust: it must be the parts' truth. */
    if (state_always_truncatable(&s->st) != m->ops->truncates) {
        errf(err, errlen, "family %s declares truncates=%d but its state parts say %d", m->ops->name,
             m->ops->truncates, state_always_truncatable(&s->st));
        seq_free(s);
        return NULL;
    }
    return s;
}

int seq_set_media(seq *s, const unsigned char *bytes, size_t len, char *err, size_t errlen) {
    s->media = 0;
    if (!s->m->ops->set_media) return bytes ? errf(err, errlen, "this model takes no media input") : 0;
    int n = s->m->ops->set_media(s->m, s->fam, bytes, len, err, errlen);
    s->media = bytes && n > 0;
    return n;
}

static int holds_media_token(const seq *s, const int *ids, int n) {
    for (int i = 0; s->media && i < n; i++)
        if (ids[i] == s->m->media_token) return 1;
    return 0;
}

void seq_free(seq *s) {
    if (!s) return;
    s->m->ops->seq_free(s->m, s->fam);
    arena_free(&s->scratch);
    state_deinit(&s->st);
    free(s);
}

/* What no family re-checks: ids and positions before anything is fed (a bad id leaves the
 * state as it was), and every logit a caller asked for after (a NaN/inf means broken weights,
 * e.g. a NaN scale byte: the state is tainted). */
static int check_ids(const seq *s, const int *ids, int n, char *err, size_t errlen) {
    if (n < 0) return errf(err, errlen, "feed: negative token count %d", n);
    if (s->st.len + n > s->st.cap) return errf(err, errlen, "context full: %d + %d > %d", s->st.len, n, s->st.cap);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->m->vocab_size)
            return errf(err, errlen, "token id %d at position %d is outside the vocabulary [0, %d)", ids[i],
                        s->st.len + i, s->m->vocab_size);
    return 0;
}

static int check_finite(const float *logits, int rows, int vocab, int pos0, char *err, size_t errlen) {
    for (size_t i = 0; logits && i < (size_t)rows * vocab; i++)
        if (!isfinite(logits[i]))
            return errf(err, errlen, "non-finite logit for id %zu at position %zu (corrupt weights?)", i % vocab,
                        pos0 + i / vocab);
    return 0;
}

static int feed(seq *s, const int *ids, int n, float *logits, float *all_logits, char *err, size_t errlen) {
    if (check_ids(s, ids, n, err, errlen)) return -1;
    int vocab = s->m->vocab_size;
    for (int done = 0; done < n;) {
        int k = MIN(s->chunk, n - done);
        int pos0 = s->st.len;
        float *out = done + k == n ? logits : NULL;
        float *all = all_logits ? all_logits + (size_t)done * vocab : NULL;
        fwd_seg seg = {s->fam, ids + done, pos0, k, out, all};
        if (s->m->ops->forward(s->m, &seg, 1, err, errlen) ||
            check_finite(all, k, vocab, pos0, err, errlen) || check_finite(out, 1, vocab, pos0 + k - 1, err, errlen)) {
            state_taint(&s->st);
            return -1;
        }
        state_record(&s->st, ids + done, pos0, k);
        /* the ids do not describe what the placeholders carried: never reuse this state */
        if (holds_media_token(s, ids + done, k)) state_taint(&s->st);
        done += k;
    }
    return 0;
}

int seq_feed(seq *s, const int *ids, int n, float *logits, char *err, size_t errlen) {
    return feed(s, ids, n, logits, NULL, err, errlen);
}

int seq_feed_all(seq *s, const int *ids, int n, float *all_logits, char *err, size_t errlen) {
    return feed(s, ids, n, NULL, all_logits, err, errlen);
}

/* What a batched call refuses before it touches anything: sequence i of another model or
 * context size than sequence 0, a sequence given twice, a bad id. */
static int check_batch(seq *const *seqs, int i, const int *ids, int n, char *err, size_t errlen) {
    if (seqs[i]->m != seqs[0]->m || seqs[i]->st.cap != seqs[0]->st.cap)
        return errf(err, errlen, "batched step: sequences of different models or context sizes");
    for (int j = 0; j < i; j++)
        if (seqs[j] == seqs[i]) return errf(err, errlen, "batched step: sequence %d appears twice", i);
    return check_ids(seqs[i], ids, n, err, errlen);
}

/* One forward call over segs[n] (segment i on seqs[i], with every row's logits or the last
 * row's); records each segment's ids, or taints every sequence of the call when it failed. */
static int forward_batch(seq **seqs, fwd_seg *segs, int n, char *err, size_t errlen) {
    model *m = seqs[0]->m;
    int failed = m->ops->forward(m, segs, n, err, errlen);
    for (int i = 0; i < n && !failed; i++) {
        const fwd_seg *g = &segs[i];
        failed = check_finite(g->all_logits, g->n, m->vocab_size, g->pos0, err, errlen) ||
                 check_finite(g->logits, 1, m->vocab_size, g->pos0 + g->n - 1, err, errlen);
    }
    for (int i = 0; i < n; i++) {
        if (failed) state_taint(&seqs[i]->st);
        else state_record(&seqs[i]->st, segs[i].ids, segs[i].pos0, segs[i].n);
        if (!failed && holds_media_token(seqs[i], segs[i].ids, segs[i].n)) state_taint(&seqs[i]->st);    /* as feed */
    }
    return failed ? -1 : 0;
}

int seq_feed_step(seq **seqs, const int *ids, int k, float **logits, char *err, size_t errlen) {
    if (k == 1) return seq_feed(seqs[0], ids, 1, logits[0], err, errlen);
    fwd_seg *segs = xmalloc(sizeof *segs * (size_t)k);
    int rc = 0;
    for (int i = 0; i < k && !rc; i++) {
        rc = check_batch(seqs, i, ids + i, 1, err, errlen);
        segs[i] = (fwd_seg){seqs[i]->fam, ids + i, seqs[i]->st.len, 1, logits[i], NULL};
    }
    if (!rc) rc = forward_batch(seqs, segs, k, err, errlen);    /* a refused step touched nothing */
    free(segs);
    return rc;
}

/* The token that follows a verify row: greedy its argmax; sampled a draw from p (resid NULL) or
 * from norm(max(0, p - q)) after a rejection (p == q everywhere leaves p itself). */
static int spec_choose(sampler *smp, const float *row, int vocab, const float *q, float *p, float *resid) {
    if (!smp || smp->p.temperature <= 0) return sampler_argmax(row, vocab);
    sampler_dist(smp, row, p);
    if (!q) return sampler_draw(smp, p);
    double left = 0;
    for (int i = 0; i < vocab; i++) left += resid[i] = p[i] > q[i] ? p[i] - q[i] : 0.0f;
    return sampler_draw(smp, left > 0 ? resid : p);
}

int seq_draft(seq *s, int id, int step, float *logits, char *err, size_t errlen) {
    model *m = s->m;
    if (!m->ops->draft || !m->draft_layers || !m->spec_mtp)
        return errf(err, errlen, "speculative decoding: this model was not opened with an MTP layer to draft with");
    if (s->st.len < 1) return errf(err, errlen, "speculative decoding: the sequence holds no token to draft from");
    if (m->ops->draft(m, s->fam, s->st.len, id, step, logits, err, errlen)) return -1;
    return check_finite(logits, 1, m->vocab_size, s->st.len + step + 1, err, errlen);
}

/* One job's working buffers: the ids it feeds (next, then the drafts), the verify rows, and for
 * sampling the draft distributions q and the scratch p / resid. */
typedef struct {
    int ids[SPEC_MAX_DRAFT + 1], k, greedy;
    float *verify, *q, *p;
} spec_work;

/* Drafts j's tokens (k fewer at the end of the context, and no more than the state can rewind
 * after the verify call: state_rewind_arm): they write only rows past the record. */
static int spec_draft(spec_job *j, spec_work *w, char *err, size_t errlen) {
    seq *s = j->s;
    int vocab = s->m->vocab_size;
    double t0 = now_seconds();
    w->greedy = !j->smp || j->smp->p.temperature <= 0;
    w->k = state_rewind_arm(&s->st, MIN(j->k, MAX(0, s->st.cap - s->st.len - 1)));
    w->ids[0] = j->next;
    w->verify = xmalloc(sizeof(float) * (size_t)(w->k + 1) * vocab);
    w->q = w->greedy ? NULL : xmalloc(sizeof(float) * (size_t)MAX(w->k, 1) * vocab);
    w->p = w->greedy ? NULL : xmalloc(sizeof(float) * 2 * (size_t)vocab);
    for (int i = 0; i < w->k; i++) {
        if (seq_draft(s, w->ids[i], i, w->verify, err, errlen)) return -1;
        if (w->greedy) w->ids[i + 1] = sampler_argmax(w->verify, vocab);
        else {
            sampler_dist(j->smp, w->verify, w->q + (size_t)i * vocab);
            w->ids[i + 1] = sampler_draw(j->smp, w->q + (size_t)i * vocab);
        }
    }
    j->draft_s = now_seconds() - t0;
    return 0;
}

/* After the verify forward: keeps the longest prefix of drafts the rule accepts, chooses the
 * token after it and cuts the rejected drafts out of the state. */
static int spec_accept(spec_job *j, spec_work *w, char *err, size_t errlen) {
    seq *s = j->s;
    int vocab = s->m->vocab_size, kept = 0, chosen = -1, L = s->st.len - w->k - 1;
    float *resid = w->p ? w->p + vocab : NULL;
    for (; j->k && kept < w->k; kept++) {        /* draft kept + 1 sits at verify row kept */
        const float *row = w->verify + (size_t)kept * vocab;
        int d = w->ids[kept + 1];
        if (w->greedy) {
            chosen = sampler_argmax(row, vocab);
            if (chosen != d) break;
            continue;
        }
        sampler_dist(j->smp, row, w->p);
        const float *qj = w->q + (size_t)kept * vocab;
        if (sampler_uniform(j->smp) * qj[d] < w->p[d]) continue;
        chosen = spec_choose(j->smp, row, vocab, qj, w->p, resid);
        break;
    }
    if (j->k && kept == w->k) chosen = spec_choose(j->smp, w->verify + (size_t)w->k * vocab, vocab, NULL, w->p, resid);
    if (state_rewind(&s->st, L + 1 + kept)) {     /* a plain step drops nothing */
        state_taint(&s->st);
        return errf(err, errlen, "speculative decoding: the state cannot drop the %d rejected drafts", w->k - kept);
    }
    memcpy(j->out, w->ids, sizeof(int) * (size_t)(kept + 1));
    j->n_out = kept + 1;
    j->pending = chosen;
    j->accepted = kept;
    if (j->rows) memcpy(j->rows, w->verify, sizeof(float) * (size_t)(kept + 1) * vocab);
    return 0;
}

int seq_join_rows(const model *m, int decode_rows) { return m->pass_rows - decode_rows % m->pass_rows; }

void model_round(const model *m, float *x, size_t n) {
    if (m->num == NUMERICS_QAT) bf16_round_vec(x, n);
}

void model_project_each(const model *m, int count, const qmat *const *w, const float *x, int n, float *const *y) {
    qmat_mul_each(count, w, x, n, y);
    for (int k = 0; k < count && m->num == NUMERICS_QAT; k++) bf16_round_rows(y[k], n, (size_t)w[k]->rows);
}

void model_project(const model *m, const qmat *w, const float *x, int n, float *y) {
    model_project_each(m, 1, &w, x, n, &y);
}

typedef struct {
    const model *m;
    float *out;
    const float *x, *w;
    int dim;
    float eps;
} norm_job;

static void norm_row(void *ctx, int i) {
    const norm_job *j = ctx;
    float *out = j->out + (size_t)i * j->dim;
    rmsnorm(out, j->x + (size_t)i * j->dim, j->w, j->dim, j->eps);
    model_round(j->m, out, (size_t)j->dim);
}

void model_norm_rows(const model *m, float *out, const float *x, const float *w, int n, int dim, float eps) {
    norm_job j = {m, out, x, w, dim, eps};
    pool_run(n, norm_row, &j);
}

/* The jobs' segments first, then the feeds': seqs[] and segs[] hold n + nfeeds entries. */
int seq_spec_steps(spec_job *jobs, int n, const feed_job *feeds, int nfeeds, char *err, size_t errlen) {
    if (n + nfeeds == 0) return 0;
    seq **seqs = xmalloc(sizeof *seqs * (size_t)(n + nfeeds));
    fwd_seg *segs = xmalloc(sizeof *segs * (size_t)(n + nfeeds));
    spec_work *w = xcalloc((size_t)MAX(n, 1), sizeof *w);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        seqs[i] = jobs[i].s;
        if (jobs[i].k < 0 || jobs[i].k > SPEC_MAX_DRAFT)
            rc = errf(err, errlen, "speculative decoding: draft length %d outside [0, %d]", jobs[i].k, SPEC_MAX_DRAFT);
        else rc = check_batch(seqs, i, &jobs[i].next, 1, err, errlen);
    }
    for (int i = 0; i < nfeeds && !rc; i++) {
        const feed_job *f = &feeds[i];
        seqs[n + i] = f->s;
        if (f->n < 1) rc = errf(err, errlen, "batched step: prefill chunk %d has %d ids", i, f->n);
        else rc = check_batch(seqs, n + i, f->ids, f->n, err, errlen);
        segs[n + i] = (fwd_seg){f->s->fam, f->ids, f->s->st.len, f->n, f->logits, NULL};
    }
    for (int i = 0; i < n && !rc; i++) rc = spec_draft(&jobs[i], &w[i], err, errlen);
    double t0 = now_seconds();
    for (int i = 0; i < n && !rc; i++) segs[i] = (fwd_seg){seqs[i]->fam, w[i].ids, seqs[i]->st.len, w[i].k + 1, NULL, w[i].verify};
    if (!rc) rc = forward_batch(seqs, segs, n + nfeeds, err, errlen);
    for (int i = 0; i < n && !rc; i++) jobs[i].verify_s = now_seconds() - t0;
    int verified = !rc;
    char later[256];                /* every job accepts (or is tainted) after a verify; err keeps the first error */
    for (int i = 0; i < n && verified; i++)
        if (spec_accept(&jobs[i], &w[i], rc ? later : err, rc ? sizeof later : errlen)) rc = -1;
    for (int i = 0; i < n; i++) {
        if (!verified) state_rewind(&jobs[i].s->st, jobs[i].s->st.len);     /* drops what a failed step armed */
        free(w[i].verify);
        free(w[i].q);
        free(w[i].p);
    }
    free(w);
    free(segs);
    free(seqs);
    return rc ? -1 : 0;
}

int seq_spec_step(seq *s, int next, int k, sampler *smp, int *out, int *n_out, int *pending, float *rows,
                  int *accepted, char *err, size_t errlen) {
    if (k < 1) return errf(err, errlen, "speculative decoding: draft length %d outside [1, %d]", k, SPEC_MAX_DRAFT);
    spec_job j = {.s = s, .next = next, .k = k, .smp = smp, .rows = rows};
    if (seq_spec_steps(&j, 1, NULL, 0, err, errlen)) return -1;
    memcpy(out, j.out, sizeof(int) * (size_t)j.n_out);
    *n_out = j.n_out;
    *pending = j.pending;
    *accepted = j.accepted;
    return 0;
}

static int feed_cb(void *user, const int *ids, int n, float *logits, char *err, size_t errlen) {
    return seq_feed(user, ids, n, logits, err, errlen);
}

reuse_feeder seq_feeder(seq *s) { return (reuse_feeder){&s->st, feed_cb, s, s->chunk}; }

int seq_prompt(seq *s, store *cs, const int *ids, int n, int sys_end, float *logits, reuse_result *rr, char *err,
               size_t errlen) {
    *rr = reuse_prepare(&s->st, 0, cs, 0, NULL, 0, ids, n);
    reuse_prefill p;
    reuse_prefill_init(&p, seq_feeder(s), cs, 0, ids, n, sys_end, s->m->markers.all, s->m->markers.n_all);
    int rc;
    while ((rc = reuse_prefill_step(&p, logits, err, errlen)) > 0) {}
    reuse_prefill_free(&p);
    return rc;
}

int fwd_next_pass(const fwd_seg *segs, int nseg, int *gi, int *j, int cap, const fwd_seg **seg, int *tok) {
    int n = 0;
    for (; *gi < nseg && n < cap; n++) {
        seg[n] = &segs[*gi];
        tok[n] = *j;
        if (++*j == segs[*gi].n) ++*gi, *j = 0;
    }
    return n;
}
