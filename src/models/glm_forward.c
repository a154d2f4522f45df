/* glm_forward.c — the GLM-5 forward pass over a chunk of tokens (invariants in glm.h).
 *
 * NUMERICS. --numerics exact keeps every activation in f32. The default rounds activations to BF16
 * where the official bf16 inference holds them in bf16 tensors: the residual stream after each
 * add, norm outputs, and the outputs of every projection (attention, indexer, experts). Router
 * logits, attention scores/softmax, indexer scores and the final logits stay f32, as HF computes
 * them in f32. Rounding is per element, so it keeps chunking invariance.
 *
 * ATTENTION uses the absorbed MLA form for every token (prefill and decode alike, so a chunk's
 * split never changes the arithmetic): per head, q_abs = W_uk^T q_nope over the latent,
 * score_t = [q_abs | q_rope] . [latent_t | rope_t] / sqrt(qk_head_dim) (one kernel call over the
 * attended rows), then the softmax-weighted latent goes through W_uv (mla.h; W_uk^T is the
 * layer's copy made at load). The positions attended are all t <= pos until there are more than
 * index_topk of them; from then on the DSA indexer's top-k (ascending positions). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/quant.h"
#include "../core/threads.h"
#include "../core/util.h"
#include "glm.h"

/* SCRATCH. Every buffer comes from the sequence's arena (core/arena.h), taken by the *_layout
 * functions below for n tokens whose last position is below `end`. glm_scratch_bytes runs the
 * same layouts with a measuring arena for GLM_CHUNK tokens at end = ctx, in the order the
 * forward pass holds them, so the bound is exactly what the pass takes. */
static float *floats(arena *a, size_t n) { return arena_take(a, n, sizeof(float)); }
static int *ints(arena *a, size_t n) { return arena_take(a, n, sizeof(int)); }

static void rope_rotate(const glm_model *g, float *x, int pos, int interleave) {
    if (interleave) rope_apply_interleaved(&g->rope_tab, x, pos, 0);
    else rope_apply_half(&g->rope_tab, x, pos, 0);
}

/* The row-wise steps between a pass's products, one pool job each (row i is task i): a task
 * reads and writes only its own row, in the same order as one loop over the rows would, so the
 * pool splits them by row and no result depends on the thread that ran it. */
typedef struct {
    const model *m;
    float *out, *up;               /* swiglu_row: gate rows in out, up rows in up */
    const float *x, *weight;       /* input rows; moe_sum: route weights */
    int dim, k;                    /* row width; moe_sum: experts per token */
} row_job;

/* Which positions token i attends to: nsel[i] < 0 means every t <= pos, else sel[i*cap..] ascending. */
typedef struct {
    int *sel, *nsel;
    int cap;
} selection;

/* The rows of a pass: tokens of the call's segments in order; row i is position pos[i] of seq[i]
 * (a sequence's rows in position order). Stateful work for a row uses its own sequence. */
typedef struct {
    int *pos;
    glm_seq **seq;
    int end;                 /* 1 + the largest position of the pass */
} rows_info;

/* ---- DSA indexer ------------------------------------------------------------------------ */

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Rows [0, count) of a state part as an f32 matrix, so one kernel call scores a query against all
 * of them (each score's reduction order depends only on the row width: chunking invariant). */
static qmat rows_matrix(const float *rows, int count, int width) {
    return (qmat){.fmt = WF_F32, .rows = count, .cols = width, .data = rows};
}

/* score_t = sum_h w_h * ReLU(q_h . k_t / sqrt(idx_dim)) over t <= pos; keep the best index_topk
 * (ties to the lower position), then sort them by position so attention sums in position order.
 * dots: scratch [heads][pos + 1]. */
static void index_token(const glm_model *g, const float *keys, const float *q, const float *w, int pos, int *out,
                        float *dots) {
    qmat k = rows_matrix(keys, pos + 1, g->idx_dim);
    qmat_mul(&k, q, g->idx_heads, dots);
    float inv = 1.0f / sqrtf((float)g->idx_dim);
    for (int t = 0; t <= pos; t++) {
        float acc = 0.0f;
        for (int h = 0; h < g->idx_heads; h++) {
            float d = dots[(size_t)h * (pos + 1) + t] * inv;
            if (d > 0.0f) acc += w[h] * d;
        }
        dots[t] = acc;     /* row 0 is consumed in order, so scores can overwrite it */
    }
    topk(dots, pos + 1, g->idx_topk, out);
    qsort(out, (size_t)g->idx_topk, sizeof *out, cmp_int);
}

/* Computes this layer's indexer keys into the state and the selection of every token. */
typedef struct {
    float *q, *k, *w, *dots;
} indexer_bufs;

static void indexer_layout(arena *a, const glm_model *g, int n, int end, indexer_bufs *b) {
    b->q = floats(a, (size_t)n * g->idx_heads * g->idx_dim);
    b->k = floats(a, (size_t)n * g->idx_dim);
    b->w = floats(a, (size_t)n * g->idx_heads);
    b->dots = floats(a, (size_t)g->idx_heads * end);
}

static void run_indexer(const model *m, const glm_layer *l, int li, const rows_info *ri, const float *hn,
                        const float *q_resid, int n, selection *sel, arena *sc) {
    const glm_model *g = m->priv;
    int hd = g->idx_dim, nh = g->idx_heads;
    indexer_bufs b;
    indexer_layout(sc, g, n, ri->end, &b);
    float *q = b.q, *k = b.k, *w = b.w, *dots = b.dots;
    model_project(m, &l->idx_wq_b, q_resid, n, q);
    const qmat *wh[] = {&l->idx_wk, &l->idx_weights};
    float *yh[] = {k, w};
    model_project_each(m, 2, wh, hn, n, yh);
    float head_scale = 1.0f / sqrtf((float)nh);
    for (int i = 0; i < n; i++) {
        int pos = ri->pos[i];
        for (int h = 0; h < nh; h++) rope_rotate(g, q + ((size_t)i * nh + h) * hd, pos, g->idx_rope_interleave);
        for (int h = 0; h < nh; h++) w[(size_t)i * nh + h] *= head_scale;
        float *row = ri->seq[i]->ik[li] + (size_t)pos * hd;
        layernorm(row, k + (size_t)i * hd, l->idx_knorm_w, l->idx_knorm_b, hd, 1e-6f);
        model_round(m, row, (size_t)hd);
        rope_rotate(g, row, pos, g->idx_rope_interleave);
    }
    for (int i = 0; i < n; i++) {
        int pos = ri->pos[i];
        sel->nsel[i] = pos + 1 > g->idx_topk ? g->idx_topk : -1;
        if (sel->nsel[i] > 0)
            index_token(g, ri->seq[i]->ik[li], q + (size_t)i * nh * hd, w + (size_t)i * nh, pos,
                        sel->sel + (size_t)i * sel->cap, dots);
    }
}

/* ---- MLA attention ---------------------------------------------------------------------- */

typedef struct {
    const glm_model *g;
    mla_pass pass;
    const rows_info *ri;
    const selection *sel;
    int li;
    const float *q;          /* [n][heads][nope + rope], roped */
    size_t work_stride;
} attn_job;

/* One row's temporaries: its gathered selection ([sel->cap][kv_lora + rope], NULL without an
 * indexer selection) and each head's work. Rows attend in parallel, so each thread carves its
 * own (arena_thread); every one is written before it is read. */
typedef struct {
    float *gathered, *work;
} attend_temps;

static void carve_attend_temps(arena *a, const attn_job *j, attend_temps *t) {
    const glm_model *g = j->g;
    t->gathered = j->sel->cap > 1 ? floats(a, (size_t)j->sel->cap * (g->kv_lora + g->rope)) : NULL;
    t->work = floats(a, (size_t)g->n_heads * j->work_stride);
}

static attend_temps thread_attend_temps(const attn_job *j) {
    arena measure = {0};
    attend_temps t;
    carve_attend_temps(&measure, j, &t);
    carve_attend_temps(arena_thread(measure.used), j, &t);
    return t;
}

/* Row i's attended rows: every t <= pos of its sequence (already contiguous in its state) or
 * the indexer's selection, gathered into `gathered`. */
static const float *attended_rows(const attn_job *j, int i, float *gathered, int *cnt) {
    const glm_model *g = j->g;
    int row_len = g->kv_lora + g->rope, k = j->sel->nsel[i];
    const float *state_rows = j->ri->seq[i]->kv[j->li];
    if (k < 0) {
        *cnt = j->ri->pos[i] + 1;
        return state_rows;
    }
    const int *picked = j->sel->sel + (size_t)i * j->sel->cap;
    for (int r = 0; r < k; r++)
        memcpy(gathered + (size_t)r * row_len, state_rows + (size_t)picked[r] * row_len, (size_t)row_len * sizeof(float));
    *cnt = k;
    return gathered;
}

/* Heads [h0, h1) of row i over its attended rows, in the row's temporaries. */
static void attend_heads(attn_job *j, const attend_temps *t, int i, int h0, int h1, const float *rows, int cnt) {
    const glm_model *g = j->g;
    int qk = g->nope + g->rope;
    const float *q = j->q + ((size_t)i * g->n_heads + h0) * qk;
    mla_attend_heads(&j->pass, h0, h1, i, g->rope, q + g->nope, (size_t)qk, rows, cnt, 1.0f / sqrtf((float)qk),
                     t->work + (size_t)h0 * j->work_stride);
}

/* A pass of several rows: rows in parallel, each row's gather and heads on one thread. */
static void attend_row(void *ctx, int i) {
    attn_job *j = ctx;
    attend_temps t = thread_attend_temps(j);
    int cnt;
    const float *rows = attended_rows(j, i, t.gathered, &cnt);
    attend_heads(j, &t, i, 0, j->g->n_heads, rows, cnt);
}

/* A single row (decode): its heads in parallel, MLA_HEADS_PER_TASK to a pool index, in the
 * calling thread's temporaries. */
typedef struct {
    attn_job *j;
    attend_temps t;
    int i, cnt;
    const float *rows;
} head_job;

static void attend_head_group(void *ctx, int t) {
    head_job *hj = ctx;
    int h0 = t * MLA_HEADS_PER_TASK;
    attend_heads(hj->j, &hj->t, hj->i, h0, MIN(hj->j->g->n_heads, h0 + MLA_HEADS_PER_TASK), hj->rows, hj->cnt);
}

static void attend_layout(arena *a, const glm_model *g, const glm_layer *l, int n, int end, attn_job *j) {
    mla_pass_layout(a, &l->mla, n, &j->pass);
    j->work_stride = mla_work_floats(g->kv_lora, g->rope, end);
}

/* Queries of every row through W_uk^T; attention over each row's attended rows (rows in
 * parallel when there are at least as many as threads, else one row at a time with its heads
 * in parallel: a head's result is the same either way); every row's latents through W_uv. */
static void attend(const glm_model *g, const glm_layer *l, int li, const rows_info *ri, const float *q,
                   const selection *sel, int n, float *out, arena *sc) {
    attn_job j = {.g = g, .ri = ri, .sel = sel, .li = li, .q = q};
    attend_layout(sc, g, l, n, ri->end, &j);
    mla_queries(&j.pass, q, g->rope);
    if (n >= pool_threads() && n > 1) {
        pool_run(n, attend_row, &j);
    } else {
        for (int i = 0; i < n; i++) {
            head_job hj = {&j, thread_attend_temps(&j), i, 0, NULL};
            hj.rows = attended_rows(&j, i, hj.t.gathered, &hj.cnt);
            pool_run(mla_head_tasks(g->n_heads), attend_head_group, &hj);
        }
    }
    mla_values(&j.pass, out);
}

/* out[n][dim] = o_proj(attention(hn)); writes this layer's row of every row's position. */
typedef struct {
    float *qa, *q, *ckv, *heads;
} attention_bufs;

static void attention_layout(arena *a, const glm_model *g, int n, attention_bufs *b) {
    b->qa = floats(a, (size_t)n * g->q_lora);
    b->q = floats(a, (size_t)n * g->n_heads * (g->nope + g->rope));
    b->ckv = floats(a, (size_t)n * (g->kv_lora + g->rope));
    b->heads = floats(a, (size_t)n * g->n_heads * g->v_dim);
}

static void attention(const model *m, const glm_layer *l, int li, const rows_info *ri, const float *hn, int n,
                      selection *sel, float *out, arena *sc) {
    const glm_model *g = m->priv;
    int qk = g->nope + g->rope, row_len = g->kv_lora + g->rope;
    attention_bufs b;
    attention_layout(sc, g, n, &b);
    float *qa = b.qa, *q = b.q, *ckv = b.ckv, *heads = b.heads;
    const qmat *wh[] = {&l->q_a, &l->kv_a};
    float *yh[] = {qa, ckv};
    model_project_each(m, 2, wh, hn, n, yh);
    model_norm_rows(m, qa, qa, l->q_a_norm, n, g->q_lora, 1e-6f);
    model_project(m, &l->q_b, qa, n, q);
    for (int i = 0; i < n; i++) {
        int pos = ri->pos[i];
        for (int h = 0; h < g->n_heads; h++)
            rope_rotate(g, q + ((size_t)i * g->n_heads + h) * qk + g->nope, pos, g->rope_interleave);
        float *row = ri->seq[i]->kv[li] + (size_t)pos * row_len;
        rmsnorm(row, ckv + (size_t)i * row_len, l->kv_a_norm, g->kv_lora, 1e-6f);
        model_round(m, row, (size_t)g->kv_lora);
        memcpy(row + g->kv_lora, ckv + (size_t)i * row_len + g->kv_lora, (size_t)g->rope * sizeof *row);
        rope_rotate(g, row + g->kv_lora, pos, g->rope_interleave);
    }
    if (g->has_indexer && l->full_indexer) run_indexer(m, l, li, ri, hn, qa, n, sel, sc);
    attend(g, l, li, ri, q, sel, n, heads, sc);
    model_round(m, heads, (size_t)n * g->n_heads * g->v_dim);
    model_project(m, &l->o, heads, n, out);
}

/* ---- FFN -------------------------------------------------------------------------------- */

/* y[n][dim] = down(silu(gate x) * up x) */
static void swiglu_layout(arena *sc, int n, int inter, float **a, float **b) {
    *a = floats(sc, (size_t)n * inter);
    *b = floats(sc, (size_t)n * inter);
}

/* Inner row i: gate and up rounded as project_each rounds them, then a = round(silu(a) * b). */
static void swiglu_row(void *ctx, int i) {
    const row_job *j = ctx;
    float *a = j->out + (size_t)i * j->dim, *b = j->up + (size_t)i * j->dim;
    model_round(j->m, a, (size_t)j->dim);
    model_round(j->m, b, (size_t)j->dim);
    for (int k = 0; k < j->dim; k++) a[k] = silu(a[k]) * b[k];
    model_round(j->m, a, (size_t)j->dim);
}

static void swiglu(const model *m, const qmat *gate, const qmat *up, const qmat *down, const float *x, int n,
                   float *y, arena *sc) {
    float *a, *b;
    swiglu_layout(sc, n, gate->rows, &a, &b);
    const qmat *w[] = {gate, up};
    float *ab[] = {a, b};
    qmat_mul_each(2, w, x, n, ab);
    row_job j = {.m = m, .out = a, .up = b, .dim = gate->rows};
    pool_run(n, swiglu_row, &j);
    model_project(m, down, a, n, y);
}

/* Sigmoid router: choose top_k on score + correction bias, weight by the unbiased scores
 * (renormalised when norm_topk_prob), times routed_scaling_factor. */
static void route_layout(arena *sc, const glm_model *g, float **score, float **choice) {
    *score = floats(sc, (size_t)g->n_experts);
    *choice = floats(sc, (size_t)g->n_experts);
}

static void route(const glm_model *g, const glm_layer *l, const float *logits, int *idx, float *weight, arena *sc) {
    size_t mark = arena_mark(sc);
    float *score, *choice;
    route_layout(sc, g, &score, &choice);
    for (int e = 0; e < g->n_experts; e++) {
        score[e] = sigmoid_f32(logits[e]);
        choice[e] = score[e] + l->router_bias[e];
    }
    topk(choice, g->n_experts, g->top_k, idx);
    float sum = 0.0f;
    for (int k = 0; k < g->top_k; k++) sum += weight[k] = score[idx[k]];
    for (int k = 0; k < g->top_k; k++)
        weight[k] = (g->norm_topk ? weight[k] / (sum + 1e-20f) : weight[k]) * g->routed_scale;
    arena_release(sc, mark);
}

typedef struct {
    float *logits, *weight, *ex;
    int *idx;
} moe_bufs;

static void moe_layout(arena *a, const glm_model *g, int n, moe_bufs *b) {
    size_t K = (size_t)g->top_k, d = (size_t)g->dim;
    b->logits = floats(a, (size_t)n * g->n_experts);
    b->weight = floats(a, n * K);
    b->idx = ints(a, n * K);
    b->ex = floats(a, n * K * d);
}

/* Routed expert e (gate, up, down in w) on cnt gathered rows (core/experts.h expert_fn). */
void glm_expert(void *ctx, int layer, int e, const qmat *w, const float *in, const float *weight, int cnt, float *out,
                arena *sc) {
    swiglu(ctx, &w[0], &w[1], &w[2], in, cnt, out, sc);
}

size_t glm_expert_scratch(void *ctx, int layer, int cnt) {
    const glm_model *g = ((const model *)ctx)->priv;
    arena a = {0};
    float *p, *q;
    swiglu_layout(&a, cnt, g->moe_inter, &p, &q);
    return a.used;
}

/* Token i's MoE output: its routed rows weighted and summed in rank order onto the shared
 * expert's row, then rounded. */
static void moe_sum_row(void *ctx, int i) {
    const row_job *j = ctx;
    int d = j->dim, K = j->k;
    float *yi = j->out + (size_t)i * d;
    const float *wi = j->weight + (size_t)i * K, *ex = j->x + (size_t)i * K * d;
    for (int c = 0; c < d; c++) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++) acc += wi[k] * ex[(size_t)k * d + c];
        yi[c] += acc;
    }
    model_round(j->m, yi, (size_t)d);
}

static void moe(const model *m, const glm_layer *l, int li, const float *x, int n, float *y, arena *sc) {
    const glm_model *g = m->priv;
    int d = g->dim, K = g->top_k;
    moe_bufs b;
    moe_layout(sc, g, n, &b);
    float *logits = b.logits, *weight = b.weight, *ex = b.ex;
    int *idx = b.idx;
    qmat_mul(&l->router, x, n, logits);
    for (int i = 0; i < n; i++)
        route(g, l, logits + (size_t)i * g->n_experts, idx + (size_t)i * K, weight + (size_t)i * K, sc);
    /* each routed expert once over the tokens that chose it; outputs land in ex[token][rank] */
    experts_io io = {.x = x, .din = d, .k = K, .out = ex, .dout = d, .out_k = K};
    experts_run(g->experts, li, idx, n * K, &io);
    swiglu(m, &l->gate, &l->up, &l->down, x, n, y, sc);      /* shared expert */
    row_job j = {.m = m, .out = y, .x = ex, .weight = weight, .dim = d, .k = K};
    pool_run(n, moe_sum_row, &j);
}

/* ---- the whole model -------------------------------------------------------------------- */

static void add_residual_row(void *ctx, int i) {
    const row_job *j = ctx;
    float *x = j->out + (size_t)i * j->dim;
    const float *delta = j->x + (size_t)i * j->dim;
    for (int k = 0; k < j->dim; k++) x[k] += delta[k];
    model_round(j->m, x, (size_t)j->dim);
}

/* x += delta over n rows of dim, then rounded. */
static void add_residual(const model *m, float *x, const float *delta, int n, int dim) {
    row_job j = {.m = m, .out = x, .x = delta, .dim = dim};
    pool_run(n, add_residual_row, &j);
}

static void head_layout(arena *a, const glm_model *g, int cnt, float **hn, float **out) {
    *hn = floats(a, (size_t)cnt * g->dim);
    *out = floats(a, (size_t)cnt * g->vocab);
}

/* Logits of the pass rows that want them (every row of an all_logits segment, each segment's
 * last) through the head in one product: a batched decode step reads the head once. Row t is
 * token tok[t] of segment seg[t]. */
static void head_logits(const model *m, const float *x, const fwd_seg *const *seg, const int *tok, int n,
                        arena *sc) {
    const glm_model *g = m->priv;
    int cnt = 0;
    for (int t = 0; t < n; t++) cnt += seg[t]->all_logits || (seg[t]->logits && tok[t] == seg[t]->n - 1);
    if (!cnt) return;
    size_t mark = arena_mark(sc);
    float *hn, *out;
    head_layout(sc, g, cnt, &hn, &out);
    for (int t = 0, k = 0; t < n; t++)
        if (seg[t]->all_logits || (seg[t]->logits && tok[t] == seg[t]->n - 1))
            rmsnorm(hn + (size_t)k++ * g->dim, x + (size_t)t * g->dim, g->final_norm, g->dim, g->eps);
    model_round(m, hn, (size_t)cnt * g->dim);
    qmat_mul(&g->head, hn, cnt, out);
    size_t v = (size_t)g->vocab;
    for (int t = 0, k = 0; t < n; t++) {
        const fwd_seg *sg = seg[t];
        if (!sg->all_logits && !(sg->logits && tok[t] == sg->n - 1)) continue;
        const float *row = out + (size_t)k++ * v;
        if (sg->all_logits) memcpy(sg->all_logits + (size_t)tok[t] * v, row, v * sizeof *row);
        if (sg->logits && tok[t] == sg->n - 1) memcpy(sg->logits, row, v * sizeof *row);
    }
    arena_release(sc, mark);      /* the MTP rows that follow take the scratch from here */
}

/* What one chunk holds for its whole pass: the residual stream, norm output, sub-layer output and
 * the attention selection. */
typedef struct {
    float *x, *hn, *delta;
    selection sel;
    rows_info rows;
} chunk_bufs;

static void chunk_layout(arena *a, const glm_model *g, int n, chunk_bufs *b) {
    size_t len = (size_t)n * g->dim;
    int cap = g->has_indexer ? g->idx_topk : 1;
    b->x = floats(a, len);
    b->hn = floats(a, len);
    b->delta = floats(a, len);
    b->sel = (selection){ints(a, (size_t)n * cap), ints(a, (size_t)n), cap};
    b->rows = (rows_info){ints(a, (size_t)n), arena_take(a, (size_t)n, sizeof(glm_seq *)), 0};
}

/* One layer's scratch at its peak: attention's buffers stay taken while the FFN runs. */
static size_t layer_bytes(const glm_model *g, const glm_layer *l, int n, int end) {
    arena a = {0};
    attention_bufs ab;
    indexer_bufs ib;
    attn_job j;
    float *p, *q;
    attention_layout(&a, g, n, &ab);
    if (g->has_indexer && l->full_indexer) indexer_layout(&a, g, n, end, &ib);
    attend_layout(&a, g, l, n, end, &j);
    if (!l->sparse) {
        swiglu_layout(&a, n, l->gate.rows, &p, &q);
        return a.used;
    }
    moe_bufs mb;
    moe_layout(&a, g, n, &mb);
    size_t inner = a.used, peak;
    route_layout(&a, g, &p, &q);                      /* routed experts: core/experts.c's scratch */
    peak = a.used;
    a.used = inner;
    swiglu_layout(&a, n, l->gate.rows, &p, &q);      /* the shared expert */
    return MAX(peak, a.used);
}

/* The MTP pass's own inputs beside a chunk's buffers: [enorm(embed) ; hnorm(hidden)] rows. */
static float *mtp_layout(arena *a, const glm_model *g, int n) { return floats(a, (size_t)n * 2 * g->dim); }

size_t glm_scratch_bytes(const model *m, int ctx) {
    const glm_model *g = m->priv;
    arena a = {0};
    chunk_bufs cb;
    float *hn, *out;
    chunk_layout(&a, g, GLM_CHUNK, &cb);
    size_t body = 0;
    for (int li = 0; li < g->n_layers; li++) body = MAX(body, layer_bytes(g, &g->layers[li], GLM_CHUNK, ctx));
    if (g->has_mtp) {      /* the MTP pass holds its input rows, its row table and one layer */
        arena t = {0};      /* the takes of forward_chunk's ids, mtp_rows and mtp_pass, in order */
        chunk_bufs mb;
        for (int i = 0; i < 3; i++) ints(&t, GLM_CHUNK);
        for (int i = 0; i < 2; i++) arena_take(&t, GLM_CHUNK, sizeof(void *));
        floats(&t, (size_t)GLM_CHUNK * g->dim);
        mtp_layout(&t, g, GLM_CHUNK);
        chunk_layout(&t, g, GLM_CHUNK, &mb);
        body = MAX(body, t.used + layer_bytes(g, &g->mtp, GLM_CHUNK, ctx) + (size_t)64 * 8);
    }
    size_t held = a.used;
    head_layout(&a, g, GLM_CHUNK, &hn, &out);
    return held + MAX(body, a.used - held) + (size_t)64 * 16;
}

/* One decoder layer over the n rows of x (in place); hn and delta are scratch of the same size. */
static void run_layer(const model *m, const glm_layer *l, int li, const rows_info *ri, float *x, float *hn,
                      float *delta, selection *sel, int n, arena *sc) {
    const glm_model *g = m->priv;
    size_t mark = arena_mark(sc);
    model_norm_rows(m, hn, x, l->attn_norm, n, g->dim, g->eps);
    attention(m, l, li, ri, hn, n, sel, delta, sc);
    add_residual(m, x, delta, n, g->dim);
    model_norm_rows(m, hn, x, l->ffn_norm, n, g->dim, g->eps);
    if (l->sparse) moe(m, l, li, hn, n, delta, sc);
    else swiglu(m, &l->gate, &l->up, &l->down, hn, n, delta, sc);
    add_residual(m, x, delta, n, g->dim);
    arena_release(sc, mark);
}

/* The MTP layer over n rows: row i is MTP position pos[i] of seq[i], its token id[i] (the token
 * at pos[i] + 1) and prev[i] the hidden state it continues from. Leaves the layer's output
 * (before shared_head.norm) in out[n][dim]; writes MTP row pos[i] + 1 of each sequence. */
static void mtp_pass(const model *m, glm_seq *const *seqs, const int *pos, const int *id, const float *const *prev,
                     int n, float *out, arena *sc) {
    const glm_model *g = m->priv;
    size_t mark = arena_mark(sc);
    int d = g->dim;
    float *in = mtp_layout(sc, g, n);
    chunk_bufs b;
    chunk_layout(sc, g, n, &b);
    for (int i = 0; i < n; i++) {
        float *row = in + (size_t)i * 2 * d;
        qmat_row(&g->embed, id[i], b.x);
        model_round(m, b.x, (size_t)d);
        rmsnorm(row, b.x, g->mtp_extra.enorm, d, g->eps);
        rmsnorm(row + d, prev[i], g->mtp_extra.hnorm, d, g->eps);
        b.sel.nsel[i] = -1;
        b.rows.pos[i] = pos[i];
        b.rows.seq[i] = seqs[i];
        b.rows.end = MAX(b.rows.end, pos[i] + 1);
    }
    model_round(m, in, (size_t)n * 2 * d);
    model_project(m, &g->mtp_extra.eh, in, n, out);
    run_layer(m, &g->mtp, g->n_layers, &b.rows, out, b.hn, b.delta, &b.sel, n, sc);
    arena_release(sc, mark);
}

/* shared_head.norm, then the shared lm_head: draft logits of one MTP output row. */
static void mtp_logits(const model *m, const float *x, float *logits, arena *sc) {
    const glm_model *g = m->priv;
    size_t mark = arena_mark(sc);
    float *hn = floats(sc, (size_t)g->dim);
    rmsnorm(hn, x, g->mtp_extra.head_norm, g->dim, g->eps);
    model_round(m, hn, (size_t)g->dim);
    qmat_vec(&g->head, hn, logits);
    arena_release(sc, mark);
}

/* After a pass's main layers (x[n][dim], row i at ri->pos[i] of ri->seq[i]): for the rows of
 * sequences that keep MTP rows (a batched call may mix them with others), each row's final
 * hidden state into its sequence's "mtp.h" row, then the MTP rows this pass completes: a token
 * at pos >= 1 completes MTP position pos - 1 (hidden of pos - 1, this token). */
static void mtp_rows(const model *m, const rows_info *ri, const int *ids, const float *x, int n, arena *sc) {
    const glm_model *g = m->priv;
    size_t mark = arena_mark(sc);
    int d = g->dim, k = 0;
    int *pos = ints(sc, (size_t)n), *id = ints(sc, (size_t)n);
    glm_seq **seqs = arena_take(sc, (size_t)n, sizeof *seqs);
    const float **prev = arena_take(sc, (size_t)n, sizeof *prev);
    float *out = floats(sc, (size_t)n * d);
    for (int i = 0; i < n; i++) {
        glm_seq *s = ri->seq[i];
        if (!s->hfin) continue;
        float *h = s->hfin + (size_t)ri->pos[i] * d;
        rmsnorm(h, x + (size_t)i * d, g->final_norm, d, g->eps);
        model_round(m, h, (size_t)d);
    }
    for (int i = 0; i < n; i++) {
        if (ri->pos[i] == 0 || !ri->seq[i]->hfin) continue;
        seqs[k] = ri->seq[i];
        pos[k] = ri->pos[i] - 1;
        id[k] = ids[i];
        prev[k++] = ri->seq[i]->hfin + (size_t)(ri->pos[i] - 1) * d;
    }
    if (k) mtp_pass(m, seqs, pos, id, prev, k, out, sc);
    arena_release(sc, mark);
}

int glm_draft(model *m, void *fam_seq, int pos, int id, int step, float *logits, char *err, size_t errlen) {
    const glm_model *g = m->priv;
    glm_seq *s = fam_seq;
    if (!s->hfin) return errf(err, errlen, "draft: this sequence does not run the MTP layer");
    if (pos < 1 || pos + step + 1 > s->cap) return errf(err, errlen, "draft: position %d + %d outside [1, %d)", pos, step, s->cap);
    if (id < 0 || id >= g->vocab) return errf(err, errlen, "draft: token id %d is outside the vocabulary", id);
    int p = pos - 1 + step;
    const float *prev = step ? s->draft_h : s->hfin + (size_t)(pos - 1) * g->dim;
    size_t mark = arena_mark(s->scratch);
    float *out = floats(s->scratch, (size_t)g->dim);
    mtp_pass(m, &s, &p, &id, &prev, 1, out, s->scratch);
    memcpy(s->draft_h, out, (size_t)g->dim * sizeof *out);
    mtp_logits(m, out, logits, s->scratch);
    arena_release(s->scratch, mark);
    return 0;
}

/* One pass of n <= GLM_CHUNK rows, row t being token tok[t] of segment seg[t], in the scratch
 * of s; all of it is given back at the end. */
static void forward_chunk(const model *m, glm_seq *s, const fwd_seg *const *seg, const int *tok, int n) {
    const glm_model *g = m->priv;
    arena *sc = s->scratch;
    size_t start = arena_mark(sc);
    chunk_bufs b;
    chunk_layout(sc, g, n, &b);
    size_t len = (size_t)n * g->dim;
    float *x = b.x, *hn = b.hn, *delta = b.delta;
    for (int i = 0; i < n; i++) {
        b.sel.nsel[i] = -1;
        b.rows.pos[i] = seg[i]->pos0 + tok[i];
        b.rows.seq[i] = seg[i]->fam_seq;
        b.rows.end = MAX(b.rows.end, b.rows.pos[i] + 1);
        qmat_row(&g->embed, seg[i]->ids[tok[i]], x + (size_t)i * g->dim);
    }
    model_round(m, x, len);
    for (int li = 0; li < g->n_layers; li++) run_layer(m, &g->layers[li], li, &b.rows, x, hn, delta, &b.sel, n, sc);
    head_logits(m, x, seg, tok, n, sc);
    if (g->has_mtp) {
        int *ids = ints(sc, (size_t)n);
        for (int i = 0; i < n; i++) ids[i] = seg[i]->ids[tok[i]];
        mtp_rows(m, &b.rows, ids, x, n, sc);
    }
    arena_release(sc, start);
}

/* The segments' tokens, concatenated, in passes of GLM_CHUNK rows (which bound the scratch) in
 * the first segment's scratch; by chunking invariance the split changes no bit. The call's
 * sequences share one context size (seq_feed_step), so that scratch fits every row. */
int glm_forward(model *m, const fwd_seg *segs, int nseg, char *err, size_t errlen) {
    const fwd_seg *seg[GLM_CHUNK];
    int tok[GLM_CHUNK], gi = 0, j = 0, n;
    while ((n = fwd_next_pass(segs, nseg, &gi, &j, GLM_CHUNK, seg, tok))) forward_chunk(m, segs[0].fam_seq, seg, tok, n);
    return 0;
}
