/* deepseek_v4_attn.c — the attention sub-layer of one block (spec §4): low-rank query with
 * per-head RMS, window KV ring, CSA/HCA compressors, lightning indexer, shared-KV attention with
 * sinks and de-rotation, grouped low-rank output.
 *
 * Projections run over all n tokens of the pass; the ring writes and compressor emissions then
 * run token by token in position order, and last every token's indexer and attention, tokens in
 * parallel: each sees exactly the entries emitted up to and including itself (attend_tokens). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/threads.h"
#include "../core/util.h"
#include "deepseek_v4.h"

/* The per-token steps of the sub-layer, one pool job each (token t is task t): they read and
 * write only row t's scratch, so the pool splits them by token and no result depends on the
 * thread that ran it. */
typedef struct {
    const dsv4_model *d;
    const dsv4_layer *L;
    dsv4_seq *s;
    const float *x;     /* qdq_row: source rows, cols wide, copied to xq */
    float *xq;
    int cols;
} token_job;

static void qdq_row(void *ctx, int t) {
    const token_job *j = ctx;
    float *xq = j->xq + (size_t)t * j->cols;
    memcpy(xq, j->x + (size_t)t * j->cols, sizeof(float) * j->cols);
    dsv4_act_qdq(j->d, xq, j->cols);
}

/* Copy of x[n][cols] with the per-row E4M3 QDQ an FP8 linear's input gets. */
static void qdq_rows(const dsv4_model *d, const float *x, float *xq, int n, int cols) {
    token_job j = {.d = d, .x = x, .xq = xq, .cols = cols};
    pool_run(n, qdq_row, &j);
}

/* Rotate the last rope_dim dims of x (width wide) at pos, inverse = de-rotation. */
static void rope_tail(const dsv4_model *d, const dsv4_layer *L, float *x, int width, int pos, int inverse) {
    rope_apply_interleaved(L->rope, x + width - d->c.rope_dim, pos, inverse);
    dsv4_bf16(d, x, width);
}

/* Row t's query latent: qr = q_norm(qr) (BF16 around it), and its QDQ copy for wq_b. */
static void query_latent_row(void *ctx, int t) {
    const token_job *j = ctx;
    const dsv4_config *c = &j->d->c;
    float *qr = j->s->qr + (size_t)t * c->q_lora, *qrq = j->s->qrq + (size_t)t * c->q_lora;
    dsv4_bf16(j->d, qr, c->q_lora);
    rmsnorm_bf16w(qr, qr, j->L->q_norm, c->q_lora, (float)c->eps);
    dsv4_bf16(j->d, qr, c->q_lora);
    memcpy(qrq, qr, sizeof(float) * c->q_lora);
    dsv4_act_qdq(j->d, qrq, c->q_lora);
}

/* Query head i % n_heads of row i / n_heads: per-head RMS (BF16 around it), RoPE on the tail.
 * A task per head, not per row: a decode step's one row would leave all its heads to the caller. */
static void query_head(void *ctx, int i) {
    const token_job *j = ctx;
    const dsv4_config *c = &j->d->c;
    int hd = c->head_dim, t = i / c->n_heads;
    float *q = j->s->q + (size_t)i * hd;
    dsv4_bf16(j->d, q, hd);
    rmsnorm(q, q, NULL, hd, (float)c->eps);
    dsv4_bf16(j->d, q, hd);
    rope_tail(j->d, j->L, q, hd, j->s->row_pos[t], 0);
}

/* qr (holding wq_a x) = q_norm(qr), also the indexer's query latent; q = wq_b qr with per-head
 * RMS and RoPE. A CSA layer's indexer queries (idx_wq_b qr) come out of the same job. */
static void project_query(const dsv4_model *d, const dsv4_layer *L, dsv4_seq *s, int n) {
    token_job j = {.d = d, .L = L, .s = s};
    pool_run(n, query_latent_row, &j);
    const qmat *w[] = {&L->wq_b, &L->idx_wq_b};
    float *y[] = {s->q, s->iq};
    qmat_mul_each(L->ratio == 4 ? 2 : 1, w, s->qrq, n, y);
    pool_run(n * d->c.n_heads, query_head, &j);
}

/* Row t's window KV (kv holding wkv x): kv_norm, RoPE on the tail, E4M3 QDQ (blocks of 64) of
 * the non-rope dims. */
static void kv_row(void *ctx, int t) {
    const token_job *j = ctx;
    const dsv4_model *d = j->d;
    int hd = d->c.head_dim;
    float *kv = j->s->kv + (size_t)t * hd;
    dsv4_bf16(d, kv, hd);
    rmsnorm_bf16w(kv, kv, j->L->kv_norm, hd, (float)d->c.eps);
    dsv4_bf16(d, kv, hd);
    rope_tail(d, j->L, kv, hd, j->s->row_pos[t], 0);
    if (d->qat) act_qdq_e4m3(kv, hd - d->c.rope_dim, 64);
}

static void project_kv(const dsv4_model *d, const dsv4_layer *L, dsv4_seq *s, int n) {
    token_job j = {.d = d, .L = L, .s = s};
    pool_run(n, kv_row, &j);
}

/* Float offset of position pos's window row in the ring: an MTP block's rows are slotted by the
 * position whose feed writes them (pos + 1), so its ring holds what a layer's ring holds after
 * the same feed and a capture or snapshot of it is exact. */
static size_t ring_slot(const dsv4_model *d, const dsv4_layer *L, int pos) {
    return (size_t)((pos + L->mtp) % d->c.window) * d->c.head_dim;
}

/* Column of feature f in slot j: CSA's last r slots (current window) pool the second half. */
static int slot_col(const dsv4_compressor *cp, int j, int f) {
    return cp->coff == 2 && j >= cp->ratio ? cp->width + f : f;
}

/* Feed one token's (a, s + ape) into a compressor's partial state. When the token closes a
 * window (pos+1 multiple of ratio), pool every feature with its own softmax over the slots into
 * the list's next row and return that row (else NULL). CSA (coff 2) slots: the previous
 * window's first half and the current window's second half, after which the current rows
 * become the previous. */
static float *compressor_push(const dsv4_compressor *cp, float *kv, float *score, const float *a, const float *sc,
                              int pos, float *list) {
    int r = cp->ratio, w = cp->width, rw = cp->coff * w;
    int row = (cp->coff == 2 ? r : 0) + pos % r;
    const float *ape = cp->ape + (size_t)(pos % r) * rw;
    memcpy(kv + (size_t)row * rw, a, sizeof(float) * rw);
    for (int k = 0; k < rw; k++) score[(size_t)row * rw + k] = sc[k] + ape[k];
    if ((pos + 1) % r) return NULL;
    float *out = list + (size_t)((pos + 1) / r - 1) * w;
    int slots = cp->coff * r;
    for (int f = 0; f < w; f++) {
        float m = -INFINITY, sum = 0, acc = 0;
        for (int j = 0; j < slots; j++) m = MAX(m, score[(size_t)j * rw + slot_col(cp, j, f)]);
        for (int j = 0; j < slots; j++) sum += expf(score[(size_t)j * rw + slot_col(cp, j, f)] - m);
        for (int j = 0; j < slots; j++) {
            size_t at = (size_t)j * rw + slot_col(cp, j, f);
            acc += expf(score[at] - m) / sum * kv[at];
        }
        out[f] = acc;
    }
    if (cp->coff == 2) {
        memcpy(kv, kv + (size_t)r * rw, sizeof(float) * r * rw);
        memcpy(score, score + (size_t)r * rw, sizeof(float) * r * rw);
    }
    return out;
}

/* Shared post-processing of an emitted entry: BF16, norm, RoPE at its window start. */
static void entry_norm_rope(const dsv4_model *d, const dsv4_layer *L, const dsv4_compressor *cp, float *e, int pos) {
    dsv4_bf16(d, e, cp->width);
    rmsnorm_bf16w(e, e, cp->norm, cp->width, (float)d->c.eps);
    dsv4_bf16(d, e, cp->width);
    rope_tail(d, L, e, cp->width, pos + 1 - cp->ratio, 0);
}

/* Main compressor: the entry becomes a KV row like a window row (E4M3 QDQ of the non-rope dims). */
static void compress_main(const dsv4_model *d, const dsv4_layer *L, dsv4_layer_state *ls, const float *a,
                          const float *sc, int pos) {
    const dsv4_compressor *cp = &L->comp;
    float *e = compressor_push(cp, ls->ckv, ls->cscore, a, sc, pos, ls->clist);
    if (!e) return;
    entry_norm_rope(d, L, cp, e, pos);
    if (d->qat) act_qdq_e4m3(e, cp->width - d->c.rope_dim, 64);
}

/* Hadamard then FP4 QDQ (blocks of 32): how both indexer keys and queries are quantized. */
static void indexer_quant(const dsv4_model *d, float *v, int width) {
    hadamard(v, width);
    dsv4_bf16(d, v, width);
    if (d->qat) act_qdq_fp4(v, width, 32);
}

static void compress_indexer(const dsv4_model *d, const dsv4_layer *L, dsv4_layer_state *ls, const float *a,
                             const float *sc, int pos) {
    const dsv4_compressor *cp = &L->idx_comp;
    float *e = compressor_push(cp, ls->ikv, ls->iscore, a, sc, pos, ls->ilist);
    if (!e) return;
    entry_norm_rope(d, L, cp, e, pos);
    indexer_quant(d, e, cp->width);
}

/* Row t's indexer inputs, from iq (idx_wq_b qr) and iw (idx_wproj x): quantized per-head
 * queries and scaled head weights. */
static void indexer_row(void *ctx, int t) {
    const token_job *j = ctx;
    const dsv4_config *c = &j->d->c;
    int iw = c->idx_heads * c->idx_dim;
    for (int h = 0; h < c->idx_heads; h++) {
        float *q = j->s->iq + (size_t)t * iw + (size_t)h * c->idx_dim;
        dsv4_bf16(j->d, q, c->idx_dim);
        rope_tail(j->d, j->L, q, c->idx_dim, j->s->row_pos[t], 0);
        indexer_quant(j->d, q, c->idx_dim);
    }
    float *w = j->s->iw + (size_t)t * c->idx_heads;
    dsv4_bf16(j->d, w, c->idx_heads);
    float scale = (float)(1.0 / sqrt((double)c->idx_dim * c->idx_heads));
    for (int h = 0; h < c->idx_heads; h++) w[h] *= scale;
}

static void project_indexer(const dsv4_model *d, const dsv4_layer *L, dsv4_seq *s, int n) {
    token_job j = {.d = d, .L = L, .s = s};
    pool_run(n, indexer_row, &j);
}

/* The temporaries of one row's attention. Rows attend in parallel (attend_tokens), so each
 * thread keeps one block of them, grown to the largest sequence it has served, as kernels keep
 * their scratch; every one is written before it is read. */
typedef struct {
    const float **cand;        /* [max_cand] candidate rows of one query */
    float *kmat, *kt;          /* candidates gathered [max_cand][head_dim] and transposed */
    float *scores;             /* [n_heads][max_cand] scores, then weights */
    float *idx_dots;           /* [idx_heads][ctx/4 + 1] */
    float *idx_scores;         /* [ctx/4 + 1] */
    int *idx_top;              /* [idx_topk] */
} row_temps;

static void carve_temps(arena *a, const dsv4_config *c, const dsv4_seq *own, row_temps *t) {
    size_t nc = (size_t)own->max_cand, vis = (size_t)own->ctx / 4 + 1;
    t->cand = arena_take(a, nc, sizeof(float *));
    t->kmat = arena_take(a, nc * c->head_dim, sizeof(float));
    t->kt = arena_take(a, nc * c->head_dim, sizeof(float));
    t->scores = arena_take(a, nc * c->n_heads, sizeof(float));
    t->idx_dots = arena_take(a, vis * c->idx_heads, sizeof(float));
    t->idx_scores = arena_take(a, vis, sizeof(float));
    t->idx_top = arena_take(a, (size_t)c->idx_topk, sizeof(int));
}

static row_temps thread_temps(const dsv4_model *d, const dsv4_seq *own) {
    arena measure = {0};
    row_temps t;
    carve_temps(&measure, &d->c, own, &t);
    carve_temps(arena_thread(measure.used), &d->c, own, &t);
    return t;
}

/* Top entries of I(t,s) = sum_h w_h relu(q_h . k_s) among the nvis visible ones of row t's
 * sequence (its compressed indexer keys). The dots of every head with every key are one product
 * with the key list as the matrix. */
static int indexer_select(const dsv4_model *d, const dsv4_layer_state *ls, const dsv4_seq *s, const row_temps *tmp,
                          int t, int nvis) {
    const dsv4_config *c = &d->c;
    const float *iq = s->iq + (size_t)t * c->idx_heads * c->idx_dim, *w = s->iw + (size_t)t * c->idx_heads;
    qmat keys = {.fmt = WF_F32, .rows = nvis, .cols = c->idx_dim, .data = ls->ilist};
    qmat_mul(&keys, iq, c->idx_heads, tmp->idx_dots);
    for (int e = 0; e < nvis; e++) {
        float acc = 0;
        for (int h = 0; h < c->idx_heads; h++) acc += w[h] * fmaxf(tmp->idx_dots[(size_t)h * nvis + e], 0);
        tmp->idx_scores[e] = acc;
    }
    int k = MIN(c->idx_topk, nvis);
    topk(tmp->idx_scores, nvis, k, tmp->idx_top);
    return k;
}

/* The window row of position p as the query of row t (at pos) sees it. Rows of t's run come from
 * the pass (kv); older ones from the ring, where the pass has written the rows of positions up to
 * its last: a slot one of them overwrote comes from the copy that row kept (kv_over). */
static const float *window_row(const dsv4_model *d, const dsv4_layer *L, const dsv4_layer_state *ls,
                               const dsv4_seq *s, int t, int pos, int p) {
    int hd = d->c.head_dim, w = d->c.window;
    if (p >= s->row_pos[s->run_first[t]]) return s->kv + (size_t)(t - (pos - p)) * hd;
    if (p + w > s->row_pos[s->run_last[t]]) return ls->ring + ring_slot(d, L, p);
    return s->kv_over + (size_t)(t + (p + w - pos)) * hd;
}

/* Candidate keys (= values) for the query of row t at pos, gathered into kmat [nc][head_dim] and
 * its transpose kt [head_dim][nc]: the window oldest first, then compressed rows. */
static int gather_candidates(const dsv4_model *d, const dsv4_layer *L, const dsv4_layer_state *ls, const dsv4_seq *s,
                             const row_temps *tmp, int t, int pos) {
    const dsv4_config *c = &d->c;
    int hd = c->head_dim, nc = 0;
    for (int p = MAX(0, pos - c->window + 1); p <= pos; p++) tmp->cand[nc++] = window_row(d, L, ls, s, t, pos, p);
    if (L->ratio == 4) {
        int k = indexer_select(d, ls, s, tmp, t, (pos + 1) / 4);
        for (int i = 0; i < k; i++) tmp->cand[nc++] = ls->clist + (size_t)tmp->idx_top[i] * hd;
    } else if (L->ratio) {
        for (int e = 0; e < (pos + 1) / L->ratio; e++) tmp->cand[nc++] = ls->clist + (size_t)e * hd;
    }
    for (int i = 0; i < nc; i++) memcpy(tmp->kmat + (size_t)i * hd, tmp->cand[i], sizeof(float) * hd);
    /* in SIMD blocks: element by element it was 80 % of the samples in attend_row's own code
     * (not its products), on the calling thread alone in a decode step */
    kernels_transpose(tmp->kmat, nc, hd, (size_t)hd, tmp->kt, (size_t)nc);
    return nc;
}

/* Softmax of one head's scores z[nc] in place, with the sink logit in the denominator only. */
static void sink_softmax(float *z, int nc, float scale, float sink) {
    float m = -INFINITY, sum = 0;
    for (int i = 0; i < nc; i++) {
        z[i] *= scale;
        m = MAX(m, z[i]);
    }
    for (int i = 0; i < nc; i++) sum += z[i] = expf(z[i] - m);
    sum += expf(sink - m);
    for (int i = 0; i < nc; i++) z[i] /= sum;
}

/* A row's per-head steps between and after its two products, a task per head: in a decode step
 * (one row) they spread over the pool; inside a row's task (rows in parallel) they run inline. */
typedef struct {
    const dsv4_model *d;
    const dsv4_layer *L;
    float *scores, *o;        /* [n_heads][nc], [n_heads][head_dim] */
    int nc, pos;
} head_job;

static void softmax_head(void *ctx, int h) {
    const head_job *j = ctx;
    sink_softmax(j->scores + (size_t)h * j->nc, j->nc, 1.0f / sqrtf((float)j->d->c.head_dim), j->L->sink[h]);
}

static void finish_head(void *ctx, int h) {
    const head_job *j = ctx;
    int hd = j->d->c.head_dim;
    dsv4_bf16(j->d, j->o + (size_t)h * hd, hd);
    rope_tail(j->d, j->L, j->o + (size_t)h * hd, hd, j->pos, 1);
}

/* Attention of row t, all heads: scores = K q_h, weights with sinks, o_h = K^T p_h, then BF16
 * and de-rotation of the rope dims at the query position (V = K carried key rotations). Reads
 * state only: every write of the pass is done before (attend_tokens). */
static void attend_row(const dsv4_model *d, const dsv4_layer *L, int li, dsv4_seq *s, int t) {
    const dsv4_config *c = &d->c;
    int hd = c->head_dim, qw = c->n_heads * hd, pos = s->row_pos[t];
    const dsv4_seq *own = s->row_seq[t];
    row_temps tmp = thread_temps(d, own);
    int nc = gather_candidates(d, L, &own->ls[li], s, &tmp, t, pos);
    qmat k = {.fmt = WF_F32, .rows = nc, .cols = hd, .data = tmp.kmat};
    qmat kt = {.fmt = WF_F32, .rows = hd, .cols = nc, .data = tmp.kt};
    head_job hj = {d, L, tmp.scores, s->o + (size_t)t * qw, nc, pos};
    qmat_mul(&k, s->q + (size_t)t * qw, c->n_heads, tmp.scores);
    pool_run(c->n_heads, softmax_head, &hj);
    qmat_mul(&kt, tmp.scores, c->n_heads, hj.o);
    pool_run(c->n_heads, finish_head, &hj);
}

/* Offer the layer's ring and partials to an armed capture before position pos changes them:
 * every write to them happens in write_row, in position order, after this call. An MTP
 * block's row of position pos enters the state with the token at pos + 1 (deepseek_v4.h), and a
 * draft step's private ring copy (ring_part -1) is no state at all. */
static void capture_layer(const dsv4_layer *L, const dsv4_layer_state *ls, state *st, int pos) {
    if (ls->ring_part < 0) return;
    pos += L->mtp;
    state_capture(st, ls->ring_part, pos);
    if (L->ratio) {
        state_capture(st, ls->comp_part, pos);
        state_capture(st, ls->comp_part + 1, pos);
    }
    if (L->ratio == 4) {
        state_capture(st, ls->idx_part, pos);
        state_capture(st, ls->idx_part + 1, pos);
    }
}

/* Row t's writes to its sequence's state: the ring row (keeping the row it replaces in
 * kv_over[t]), then the compressors' emissions. The only writes to RING/RECUR parts are here
 * (projections write scratch only); a sequence's rows come in position order. */
static void write_row(const dsv4_model *d, const dsv4_layer *L, int li, dsv4_seq *s, int t) {
    const dsv4_config *c = &d->c;
    int hd = c->head_dim, pos = s->row_pos[t];
    dsv4_seq *own = s->row_seq[t];
    dsv4_layer_state *ls = &own->ls[li];
    capture_layer(L, ls, own->st, pos);
    float *slot = ls->ring + ring_slot(d, L, pos);
    memcpy(s->kv_over + (size_t)t * hd, slot, sizeof(float) * hd);
    memcpy(slot, s->kv + (size_t)t * hd, sizeof(float) * hd);
    if (L->ratio) {
        int cw = L->comp.coff * hd;
        compress_main(d, L, ls, s->ca + (size_t)t * cw, s->cs + (size_t)t * cw, pos);
    }
    if (L->ratio == 4) {
        int iw = L->idx_comp.coff * c->idx_dim;
        compress_indexer(d, L, ls, s->ia + (size_t)t * iw, s->is + (size_t)t * iw, pos);
    }
}

/* Runs: maximal blocks of rows of one sequence at consecutive positions. */
static void mark_runs(dsv4_seq *s, int n) {
    for (int t = 0; t < n; t++)
        s->run_first[t] = t && s->row_seq[t - 1] == s->row_seq[t] && s->row_pos[t - 1] + 1 == s->row_pos[t]
                              ? s->run_first[t - 1] : t;
    for (int t = n - 1; t >= 0; t--) s->run_last[t] = t + 1 < n && s->run_first[t + 1] == s->run_first[t] ? s->run_last[t + 1] : t;
}

typedef struct {
    const dsv4_model *d;
    const dsv4_layer *L;
    int li;
    dsv4_seq *s;
} attend_job;

static void attend_task(void *ctx, int t) {
    const attend_job *j = ctx;
    attend_row(j->d, j->L, j->li, j->s, t);
}

/* Every row's stateful part in two steps: first each row's state writes, in row order (each
 * sequence's positions in order); then every row's attention, which only reads, the rows in
 * parallel. A row sees what it saw attending straight after its own writes: later rows' ring rows
 * are not among its window (window_row), and their compressed entries are past its visible ones.
 * A row's products inside a pool task run serially over the same row split: the same bits
 * (kernels.h). A single row (one sequence's decode step) keeps its products across the pool. */
static void attend_tokens(const dsv4_model *d, const dsv4_layer *L, int li, dsv4_seq *s, int n) {
    mark_runs(s, n);
    for (int t = 0; t < n; t++) write_row(d, L, li, s, t);
    if (n == 1) {
        attend_row(d, L, li, s, 0);
        return;
    }
    attend_job j = {.d = d, .L = L, .li = li, .s = s};
    pool_run(n, attend_task, &j);
}

/* Row t of the output latent u: BF16, then the QDQ of wo_b's input. */
static void output_latent_row(void *ctx, int t) {
    const token_job *j = ctx;
    float *u = j->s->u + (size_t)t * j->cols;
    dsv4_bf16(j->d, u, j->cols);
    dsv4_act_qdq(j->d, u, j->cols);
}

/* Grouped low-rank output: group g's heads through wo_a rows [g*o_lora, (g+1)*o_lora) (no
 * activation QDQ: a BF16 einsum in the reference), then wo_b over the concatenation. */
static void project_output(const dsv4_model *d, const dsv4_layer *L, dsv4_seq *s, int n, float *out) {
    const dsv4_config *c = &d->c;
    int qw = c->n_heads * c->head_dim, gw = qw / c->o_groups, uw = c->o_groups * c->o_lora;
    for (int g = 0; g < c->o_groups; g++) {
        for (int t = 0; t < n; t++)
            memcpy(s->g + (size_t)t * gw, s->o + (size_t)t * qw + (size_t)g * gw, sizeof(float) * gw);
        qmat_mul_rows(&L->wo_a, g * c->o_lora, (g + 1) * c->o_lora, s->g, n, s->ug);
        for (int t = 0; t < n; t++)
            memcpy(s->u + (size_t)t * uw + (size_t)g * c->o_lora, s->ug + (size_t)t * c->o_lora,
                   sizeof(float) * c->o_lora);
    }
    token_job j = {.d = d, .s = s, .cols = uw};
    pool_run(n, output_latent_row, &j);
    qmat_mul(&L->wo_b, s->u, n, out);
    if (d->qat) bf16_round_rows(out, n, (size_t)c->dim);
}

void dsv4_window_rows(const dsv4_model *d, const dsv4_layer *L, int li, dsv4_seq *s, int n) {
    int hd = d->c.head_dim;
    qdq_rows(d, s->x, s->xq, n, d->c.dim);
    qmat_mul(&L->wkv, s->xq, n, s->kv);
    project_kv(d, L, s, n);
    for (int t = 0; t < n; t++) {
        dsv4_layer_state *ls = &s->row_seq[t]->ls[li];
        capture_layer(L, ls, s->row_seq[t]->st, s->row_pos[t]);
        memcpy(ls->ring + ring_slot(d, L, s->row_pos[t]), s->kv + (size_t)t * hd, sizeof(float) * hd);
    }
}

void dsv4_attention(const dsv4_model *d, const dsv4_layer *L, int li, dsv4_seq *s, int n, float *out) {
    qdq_rows(d, s->x, s->xq, n, d->c.dim);
    /* The products of xq, then of x, each one pool job (one wait for all its matrices). */
    const qmat *wq[] = {&L->wq_a, &L->wkv};
    float *yq[] = {s->qr, s->kv};
    qmat_mul_each(2, wq, s->xq, n, yq);
    const qmat *wx[] = {&L->comp.wkv, &L->comp.wgate, &L->idx_wproj, &L->idx_comp.wkv, &L->idx_comp.wgate};
    float *yx[] = {s->ca, s->cs, s->iw, s->ia, s->is};
    qmat_mul_each(L->ratio == 4 ? 5 : L->ratio ? 2 : 0, wx, s->x, n, yx);
    project_query(d, L, s, n);
    project_kv(d, L, s, n);
    if (L->ratio == 4) project_indexer(d, L, s, n);
    attend_tokens(d, L, li, s, n);
    project_output(d, L, s, n, out);
}
