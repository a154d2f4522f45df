/* inkling_forward.c — the Inkling forward pass over a chunk of tokens (invariants in inkling.h).
 *
 * NUMERICS. --numerics exact keeps every activation in f32. The default rounds to BF16 where the
 * official bf16 inference (modeling_inkling.py) holds bf16 tensors: embeddings and norm outputs,
 * every projection's output (q, k, v, r, attention, router logits, experts), the relative-bias
 * profiles, q and the bias after the f32 log scaling, conv outputs (computed in f32, cast back as
 * `_keep_in_fp32_modules_strict` does) and the residual stream after each add. Attention scores
 * and softmax, the routing weights and the final logits stay f32.
 *
 * ORDER. A layer runs in phases over the chunk: batched projections; per token in position order
 * the k/v convs; attention of every row (rows in parallel, see ATTENTION OF A PASS), then the
 * ring/rows writes in position order; batched o_proj; per token the attention-output conv; the
 * MLP batched; per token the MLP-output conv. Each phase that writes a ring or conv part calls
 * state_capture before writing each position. */
#include <math.h>
#include <string.h>

#include "../core/ops.h"
#include "../core/quant.h"
#include "../core/threads.h"
#include "../core/util.h"
#include "inkling.h"

/* SCRATCH. Every buffer of a chunk comes from the sequence's arena (core/arena.h), carved by
 * chunk_layout for n tokens; inkling_scratch_bytes runs the same layout with a measuring arena
 * for INK_CHUNK tokens (every size grows with n, so a smaller chunk always fits). A row's
 * attention temporaries are its thread's own (arena_thread). */
typedef struct {
    float *x, *hn, *delta, *branch, *heads;          /* [n][D], heads [n][H*hd] */
    float *q, *kv, *raw, *kp, *vp, *r;               /* attention */
    int *run;
    float *logits, *gam, *eout, *ex, *g1, *act, *fused, *choice;   /* MLP (routed experts: core/experts.c's scratch) */
    int *idx;
    float *head_hn, *head_out;                       /* [n][D], [INK_HEAD_ROWS][unpadded] */
} ink_bufs;

static float *floats(arena *a, size_t n) { return arena_take(a, n, sizeof(float)); }

static void chunk_layout(arena *a, const ink_model *g, int n, ink_bufs *b) {
    size_t qmax = 1, kvmax = 1, hmax = 1, imax = (size_t)g->moe_inter;
    for (int i = 0; i < g->n_layers; i++) {
        const ink_layer *l = &g->layers[i];
        qmax = MAX(qmax, (size_t)l->heads * l->head_dim);
        kvmax = MAX(kvmax, (size_t)l->kv_heads * l->head_dim);
        hmax = MAX(hmax, (size_t)l->heads);
        imax = MAX(imax, (size_t)l->mlp.inter);
    }
    size_t nd = (size_t)n * g->dim, ks = (size_t)(g->top_k + g->n_shared);
    b->x = floats(a, nd), b->hn = floats(a, nd), b->delta = floats(a, nd), b->branch = floats(a, nd);
    b->heads = floats(a, n * qmax), b->q = floats(a, n * qmax);
    b->kv = floats(a, n * 2 * kvmax), b->raw = floats(a, n * 2 * kvmax);
    b->kp = floats(a, n * kvmax), b->vp = floats(a, n * kvmax), b->r = floats(a, n * hmax * g->d_rel);
    b->run = arena_take(a, (size_t)n, sizeof(int));
    b->logits = floats(a, (size_t)n * (g->n_experts + g->n_shared)), b->gam = floats(a, n * ks);
    b->idx = arena_take(a, (size_t)n * g->top_k, sizeof(int));
    b->eout = floats(a, nd), b->ex = floats(a, n * ks * g->dim), b->g1 = floats(a, (size_t)n);
    b->act = floats(a, n * imax), b->fused = floats(a, n * 2 * imax), b->choice = floats(a, (size_t)g->n_experts);
    b->head_hn = floats(a, nd), b->head_out = floats(a, (size_t)MIN(n, INK_HEAD_ROWS) * g->unpadded);
}

size_t inkling_scratch_bytes(const model *m, int ctx) {
    arena a = {0};
    ink_bufs b;
    chunk_layout(&a, m->priv, INK_CHUNK, &b);
    return a.used;
}

/* ROW-PARALLEL ELEMENT WORK. Norms (model_norm_rows), residual adds, the GLU's gating and the
 * expert sum are a tenth of a prefill on one thread; each row's result depends on that row
 * alone, so they run one pool index per row (the same bits on any number of threads). Inside a
 * pool task (an expert's GLU) pool_run runs them serially on that thread. */
typedef struct {
    const model *m;
    float *out;
    const float *x;           /* the residual add's delta */
    int dim;
} row_job;

/* Which conv of a layer a pass runs (each is its own RECUR part, see inkling.h). */
typedef enum { CONV_KV, CONV_ATTN, CONV_MLP } conv_which;

static ink_part *conv_part(ink_layer_state *ls, conv_which w) {
    return w == CONV_KV ? &ls->conv_kv : w == CONV_ATTN ? &ls->conv_attn : &ls->conv_mlp;
}

/* THE CONVS OF A PASS run over stretches of consecutive positions of one sequence that no armed
 * capture splits (state_capture_next), channels in parallel: a channel's taps read only that
 * channel of the history and of the stretch's inputs, so a task of CONV_CHANNELS channels walks
 * the stretch in position order on its own, and the history takes the stretch's last K-1 inputs
 * at its end. Per channel the arithmetic and its order are those of one token at a time:
 * y = x + sum_j w[c][j] * in[t-K+1+j], j ascending, in f32. */
#define CONV_CHANNELS 16         /* channels per pool index: a cache line of each row */
#define CONV_PARALLEL_MIN 2048   /* rows x channels below which one thread runs the stretch */

typedef struct {
    const model *m;
    float *hist;              /* [K-1][C] the inputs before the stretch, oldest first */
    const float *w;           /* [C][K] */
    int K, C, rows, per_task; /* channels per pool index */
    const float *x;           /* rows of the stretch, stride ld */
    float *y;
    size_t ld;
} conv_job;

static void conv_channels(void *ctx, int t) {
    const conv_job *j = ctx;
    int K = j->K, C = j->C, c0 = t * j->per_task, c1 = MIN(C, c0 + j->per_task);
    for (int i = 0; i < j->rows; i++) {
        const float *in[INK_CONV_MAX];   /* input t - K + 1 + k of row i: the history, then the stretch */
        for (int k = 0; k < K; k++) {
            int src = i - (K - 1) + k;
            in[k] = src < 0 ? j->hist + (size_t)(K - 1 + src) * C : j->x + (size_t)src * j->ld;
        }
        const float *x = in[K - 1];
        float *y = j->y + (size_t)i * j->ld;
        for (int c = c0; c < c1; c++) {
            const float *wc = j->w + (size_t)c * K;
            float acc = 0.0f;
            for (int k = 0; k < K - 1; k++) acc += wc[k] * in[k][c];
            acc += wc[K - 1] * x[c];
            y[c] = acc + x[c];
        }
        model_round(j->m, y + c0, (size_t)(c1 - c0));
    }
    for (int k = 0; k < K - 1; k++) {   /* ascending: slot k reads slot k + rows, not yet rewritten */
        int src = j->rows - (K - 1) + k;
        const float *from = src < 0 ? j->hist + (size_t)(K - 1 + src) * C : j->x + (size_t)src * j->ld;
        memmove(j->hist + (size_t)k * C + c0, from + c0, (size_t)(c1 - c0) * sizeof(float));
    }
}

/* The conv over the chunk's rows of x (stride ld, C channels), each row in its own sequence's
 * window; rows of one sequence come in position order. */
static void conv_rows(const model *m, const ink_rows *rw, int li, conv_which which, const float *w, int C,
                      const float *x, size_t ld, float *y) {
    const ink_model *g = m->priv;
    for (int i = 0, end; i < rw->n; i = end) {
        ink_seq *s = rw->seq[i];
        ink_part *p = conv_part(&s->layers[li], which);
        state_capture(s->st, p->part, rw->pos[i]);
        int stop = state_capture_next(s->st, rw->pos[i]);
        for (end = i + 1; end < rw->n && rw->seq[end] == s && rw->pos[end] == rw->pos[end - 1] + 1 && rw->pos[end] < stop;)
            end++;
        int rows = end - i, per_task = (size_t)rows * C >= CONV_PARALLEL_MIN ? CONV_CHANNELS : C;
        conv_job j = {.m = m, .hist = p->buf, .w = w, .K = g->conv_k, .C = C, .rows = rows, .per_task = per_task,
                      .x = x + (size_t)i * ld, .y = y + (size_t)i * ld, .ld = ld};
        pool_run((C + per_task - 1) / per_task, conv_channels, &j);
    }
}

/* ---- attention -------------------------------------------------------------------------- */

/* ATTENTION OF A PASS. Every row reads the keys of this pass's earlier rows of its sequence from
 * the pass's own k/v rows, and older keys from its sequence's ring or rows, so no row writes the
 * state before every row has attended: rows can attend in any order and in parallel, and a
 * sliding-window slot is still overwritten only after every earlier token has read it. The
 * writes come after, per row in position order, each captured first (state_capture). A head's
 * result depends only on its row, so which thread runs it changes no bit. */
typedef struct {
    const model *m;
    const ink_model *g;
    const ink_layer *l;
    const ink_rows *rw;
    int li;
    const float *q, *r, *kv;  /* the pass's rows: [n][heads][hd], [n][heads][d_rel], [n][k | v] */
    const int *run;           /* run[i]: the pass's first row of row i's run of consecutive positions */
    size_t work_stride;       /* a head's work: [hd + extent + keys] */
    float *out;               /* [n][heads][hd] */
} attn_job;

/* Key/value row of position t as row i sees it: from the pass if a row of i's run wrote it,
 * else from i's sequence's ring (a slot per position mod window) or rows. */
static const float *key_row(const attn_job *j, int i, int t) {
    const ink_layer *l = j->l;
    size_t kv_len = (size_t)2 * l->kv_heads * l->head_dim;
    int r0 = j->run[i], p0 = j->rw->pos[r0];
    if (t >= p0) return j->kv + (size_t)(r0 + t - p0) * kv_len;
    int slot = l->sliding ? t % j->g->window : t;
    return j->rw->seq[i]->layers[j->li].kv.buf + (size_t)slot * kv_len;
}

/* tau = 1 + alpha * ln(max((pos + 1) / n_floor, 1)) on global layers, in f32 as HF computes it. */
static float log_tau(const ink_model *g, const ink_layer *l, int pos) {
    if (l->sliding || !g->log_floor) return 1.0f;
    float ratio = (float)(pos + 1) / (float)g->log_floor;
    return 1.0f + g->log_alpha * logf(ratio > 1.0f ? ratio : 1.0f);
}

/* Head h of row i, in `work`: relative-bias profile over distances, tau scaling, scores over the
 * attended keys, softmax, weighted values. */
static void attend_head(const attn_job *j, int i, int h, float *work) {
    const ink_layer *l = j->l;
    int hd = l->head_dim, kvd = l->kv_heads * hd, grp = h / (l->heads / l->kv_heads);
    int pos = j->rw->pos[i], first = l->sliding && pos - j->g->window + 1 > 0 ? pos - j->g->window + 1 : 0;
    int nk = pos - first + 1;
    float tau = log_tau(j->g, l, pos);
    float *q = work, *restrict prof = q + hd, *score = prof + l->extent;
    memcpy(q, j->q + ((size_t)i * l->heads + h) * hd, (size_t)hd * sizeof *q);
    const float *rh = j->r + ((size_t)i * l->heads + h) * j->g->d_rel;
    /* prof[d] = sum over e ascending of rh[e] * rel[e][d], a row of rel at a time (loops over d
     * vectorize; the same sum per d) */
    for (int d = 0; d < l->extent; d++) prof[d] = 0.0f;
    for (int e = 0; e < j->g->d_rel; e++) {
        float re = rh[e];
        const float *restrict rel = l->rel + (size_t)e * l->extent;
        for (int d = 0; d < l->extent; d++) prof[d] += re * rel[d];
    }
    model_round(j->m, prof, (size_t)l->extent);
    if (tau != 1.0f) {
        for (int d = 0; d < hd; d++) q[d] *= tau;
        for (int d = 0; d < l->extent; d++) prof[d] *= tau;
        model_round(j->m, q, (size_t)hd);
        model_round(j->m, prof, (size_t)l->extent);
    }
    float inv = 1.0f / (float)hd;
    for (int k = 0; k < nk; k++) {
        int t = first + k, dist = pos - t;
        score[k] = dot_f32(q, key_row(j, i, t) + (size_t)grp * hd, hd) * inv + (dist < l->extent ? prof[dist] : 0.0f);
    }
    softmax(score, nk);
    float *restrict o = j->out + ((size_t)i * l->heads + h) * hd;
    memset(o, 0, (size_t)hd * sizeof *o);
    for (int k = 0; k < nk; k++) {
        const float *restrict v = key_row(j, i, first + k) + kvd + (size_t)grp * hd;
        float p = score[k];
        for (int d = 0; d < hd; d++) o[d] += p * v[d];
    }
}

/* The calling thread's work for every head of a row (arena_thread: rows attend in parallel). */
static float *thread_work(const attn_job *j) {
    size_t len = (size_t)j->l->heads * j->work_stride;
    arena measure = {0};
    floats(&measure, len);
    return floats(arena_thread(measure.used), len);
}

/* A pass of several rows: rows in parallel, a row's heads one after another on one thread. */
static void attend_row(void *ctx, int i) {
    const attn_job *j = ctx;
    float *work = thread_work(j);
    for (int h = 0; h < j->l->heads; h++) attend_head(j, i, h, work + (size_t)h * j->work_stride);
}

/* A single row (decode): its heads in parallel, each in its slice of the caller's work. */
typedef struct {
    const attn_job *j;
    int i;
    float *work;
} head_job;

static void attend_head_task(void *ctx, int h) {
    const head_job *hj = ctx;
    attend_head(hj->j, hj->i, h, hj->work + (size_t)h * hj->j->work_stride);
}

/* Each row's k/v into its sequence's ring slot or row, in position order. */
static void write_keys(const attn_job *j) {
    const ink_layer *l = j->l;
    size_t kv_len = (size_t)2 * l->kv_heads * l->head_dim;
    for (int i = 0; i < j->rw->n; i++) {
        int pos = j->rw->pos[i], slot = l->sliding ? pos % j->g->window : pos;
        ink_part *kvp = &j->rw->seq[i]->layers[j->li].kv;
        if (l->sliding) state_capture(j->rw->seq[i]->st, kvp->part, pos);
        memcpy(kvp->buf + (size_t)slot * kv_len, j->kv + (size_t)i * kv_len, kv_len * sizeof(float));
    }
}

typedef struct {
    const model *m;
    const ink_model *g;
    const ink_layer *l;
    float *q, *kv;            /* [n][heads][hd], [n][k | v] */
} qk_norm_job;

/* Row i's q heads and k heads through their RMSNorms, then the row's q and k | v rounded. */
static void qk_norm_row(void *ctx, int i) {
    const qk_norm_job *j = ctx;
    const ink_layer *l = j->l;
    size_t hd = (size_t)l->head_dim, qd = l->heads * hd, kvd = l->kv_heads * hd;
    float *q = j->q + i * qd, *kv = j->kv + i * 2 * kvd;
    for (int h = 0; h < l->heads; h++) rmsnorm(q + h * hd, q + h * hd, l->q_norm, (int)hd, j->g->eps);
    for (int h = 0; h < l->kv_heads; h++) rmsnorm(kv + h * hd, kv + h * hd, l->k_norm, (int)hd, j->g->eps);
    model_round(j->m, q, qd);
    model_round(j->m, kv, 2 * kvd);
}

/* heads[n][H*hd] for the pass; writes each row's k/v at its position into its sequence's ring or rows. */
static void attention(const model *m, int li, const ink_rows *rw, const float *hn, ink_bufs *b, float *out) {
    const ink_model *g = m->priv;
    const ink_layer *l = &g->layers[li];
    int n = rw->n;
    int hd = l->head_dim, qd = l->heads * hd, kvd = l->kv_heads * hd;
    float *q = b->q, *kv = b->kv, *raw = b->raw, *r = b->r, *heads = b->heads;
    /* raw[i] = [W_k h | W_v h]: the k/v convs share one part, updated together per token */
    const qmat *wp[] = {&l->q, &l->r, &l->k, &l->v};
    float *yp[] = {q, r, b->kp, b->vp};
    model_project_each(m, 4, wp, hn, n, yp);
    for (int i = 0; i < n; i++) {
        memcpy(raw + (size_t)i * 2 * kvd, b->kp + (size_t)i * kvd, (size_t)kvd * sizeof *raw);
        memcpy(raw + (size_t)i * 2 * kvd + kvd, b->vp + (size_t)i * kvd, (size_t)kvd * sizeof *raw);
    }
    conv_rows(m, rw, li, CONV_KV, l->conv_kv, 2 * kvd, raw, (size_t)2 * kvd, kv);
    qk_norm_job nj = {m, g, l, q, kv};
    pool_run(n, qk_norm_row, &nj);
    for (int i = 0; i < n; i++)
        b->run[i] = i && rw->seq[i - 1] == rw->seq[i] && rw->pos[i - 1] + 1 == rw->pos[i] ? b->run[i - 1] : i;
    int keys = l->sliding ? g->window : rw->end;
    attn_job j = {.m = m, .g = g, .l = l, .rw = rw, .li = li, .q = q, .r = r, .kv = kv, .run = b->run,
                  .work_stride = (size_t)hd + l->extent + keys, .out = heads};
    if (n >= pool_threads() && n > 1) {
        pool_run(n, attend_row, &j);
    } else {
        for (int i = 0; i < n; i++) {
            head_job hj = {&j, i, thread_work(&j)};
            pool_run(l->heads, attend_head_task, &hj);
        }
    }
    write_keys(&j);
    model_round(m, heads, (size_t)n * qd);
    model_project(m, &l->o, heads, n, out);
}

/* ---- MLP -------------------------------------------------------------------------------- */

typedef struct {
    const model *m;
    const ink_glu *u;
    const float *gamma;
    float *act;
    const float *f;
} gate_job;

/* Row i's silu(gate) * up * gamma into act: the gate in act (GLU_SPLIT) or in f's fused row. */
static void gate_row(void *ctx, int i) {
    const gate_job *j = ctx;
    int in = j->u->inter;
    float *a = j->act + (size_t)i * in;
    const float *fi = j->f + (size_t)i * (j->u->layout == GLU_SPLIT ? 1 : 2) * in;
    for (int c = 0; c < in; c++) {
        if (j->u->layout == GLU_SPLIT) a[c] = silu(a[c]) * fi[c];
        else if (j->u->layout == GLU_HALVES) a[c] = silu(fi[c]) * fi[in + c];
        else a[c] = silu(fi[2 * c]) * fi[2 * c + 1];
    }
    if (j->gamma)
        for (int c = 0; c < in; c++) a[c] *= j->gamma[i];
    model_round(j->m, a, (size_t)in);
}

/* y[n][D] = down(silu(gate x) * up x * gamma) for the layout's gate/up rows; gamma NULL = 1.
 * act holds n rows of the inner width, f n rows of twice that. */
static void glu(const model *m, const ink_glu *u, const float *x, int n, const float *gamma, float *y, float *act,
                float *f) {
    if (u->layout == GLU_SPLIT) {
        const qmat *w[] = {&u->gate, &u->up};
        float *y2[] = {act, f};
        model_project_each(m, 2, w, x, n, y2);
    } else {
        model_project(m, &u->fused, x, n, f);
    }
    gate_job j = {m, u, gamma, act, f};
    pool_run(n, gate_row, &j);
    model_project(m, &u->down, act, n, y);
}

/* Top-k routed experts on sigmoid + correction bias; the k chosen and every shared expert weighted
 * by their sigmoids normalised jointly (HF: exp(logsigmoid - logsumexp)), times the two scales. */
static void route(const ink_model *g, const ink_layer *l, const float *logits, int *idx, float *gam, float *choice) {
    int E = g->n_experts, K = g->top_k;
    for (int e = 0; e < E; e++) choice[e] = sigmoid_f32(logits[e]) + l->router_bias[e];
    topk(choice, E, K, idx);
    float sum = 0.0f;
    for (int k = 0; k < K + g->n_shared; k++) sum += gam[k] = sigmoid_f32(logits[k < K ? idx[k] : E + k - K]);
    for (int k = 0; k < K + g->n_shared; k++) gam[k] = gam[k] / sum * g->route_scale * *l->router_scale;
}

/* Routed expert e (its matrices w, in ink_glu_mats order) on cnt gathered rows (core/experts.h
 * expert_fn); its route weight is applied by the layer's sum. */
void inkling_expert(void *ctx, int layer, int e, const qmat *w, const float *in, const float *weight, int cnt,
                    float *out, arena *sc) {
    const model *m = ctx;
    const ink_model *g = m->priv;
    ink_glu u = ink_glu_with(&g->layers[layer].experts[e], w);
    float *act = floats(sc, (size_t)cnt * u.inter), *fused = floats(sc, (size_t)cnt * 2 * u.inter);
    glu(m, &u, in, cnt, NULL, out, act, fused);
}

size_t inkling_expert_scratch(void *ctx, int layer, int cnt) {
    const ink_model *g = ((const model *)ctx)->priv;
    arena a = {0};
    floats(&a, (size_t)cnt * g->moe_inter);
    floats(&a, (size_t)cnt * 2 * g->moe_inter);
    return a.used;
}

typedef struct {
    const model *m;
    const ink_model *g;
    const float *gam, *ex;    /* [n][K + S] weights, [n][K + S][D] expert outputs */
    float *y;
} moe_sum_job;

/* Row i: the routed outputs weighted in slot order, plus the shared ones (weighted in their GLU). */
static void moe_sum_row(void *ctx, int i) {
    const moe_sum_job *j = ctx;
    int d = j->g->dim, K = j->g->top_k, S = j->g->n_shared;
    const float *gam = j->gam + (size_t)i * (K + S), *ex = j->ex + (size_t)i * (K + S) * d;
    float *y = j->y + (size_t)i * d;
    for (int c = 0; c < d; c++) {
        float routed = 0.0f, shared = 0.0f;
        for (int k = 0; k < K; k++) routed += gam[k] * ex[(size_t)k * d + c];
        for (int s = 0; s < S; s++) shared += ex[(size_t)(K + s) * d + c];
        y[c] = routed + shared;
    }
    model_round(j->m, y, (size_t)d);
}

static void moe(const model *m, const ink_layer *l, const float *x, int n, float *y, ink_bufs *b) {
    const ink_model *g = m->priv;
    int d = g->dim, K = g->top_k, S = g->n_shared, R = g->n_experts + S;
    float *logits = b->logits, *gam = b->gam, *eout = b->eout, *ex = b->ex, *g1 = b->g1;
    int *idx = b->idx;
    model_project(m, &l->router, x, n, logits);
    for (int i = 0; i < n; i++)
        route(g, l, logits + (size_t)i * R, idx + (size_t)i * K, gam + (size_t)i * (K + S), b->choice);
    /* each routed expert once over the tokens that chose it; outputs land in ex[token][slot] */
    experts_io io = {.x = x, .din = d, .k = K, .out = ex, .dout = d, .out_k = K + S};
    experts_run(g->experts, (int)(l - g->layers), idx, n * K, &io);
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < n; i++) g1[i] = gam[(size_t)i * (K + S) + K + s];
        glu(m, &l->shared[s], x, n, g1, eout, b->act, b->fused);
        for (int i = 0; i < n; i++) memcpy(ex + ((size_t)i * (K + S) + K + s) * d, eout + (size_t)i * d, (size_t)d * sizeof *ex);
    }
    moe_sum_job j = {m, g, gam, ex, y};
    pool_run(n, moe_sum_row, &j);
}

static void mlp(const model *m, const ink_layer *l, const float *x, int n, float *y, ink_bufs *b) {
    const ink_model *g = m->priv;
    if (l->sparse) return moe(m, l, x, n, y, b);
    glu(m, &l->mlp, x, n, NULL, y, b->act, b->fused);
    for (size_t k = 0; k < (size_t)n * g->dim; k++) y[k] *= *l->mlp_scale;
    model_round(m, y, (size_t)n * g->dim);
}

/* ---- the whole model -------------------------------------------------------------------- */

/* Normed token embedding, or at an audio placeholder (while frames remain) the audio tower's
 * RMSNorm(sum over mel bins b of row b * mel_vocab + level_b), eps 1e-6 as HF builds it. */
static void embed(const model *m, ink_seq *s, int id, float *x, float *tmp) {
    const ink_model *g = m->priv;
    if (id == g->audio_token && s->audio_used < s->audio_frames) {
        const unsigned char *frame = s->audio + (size_t)s->audio_used++ * g->n_mel;
        memset(x, 0, (size_t)g->dim * sizeof *x);
        for (int b = 0; b < g->n_mel; b++) {
            qmat_row(&g->audio_embed, b * g->mel_vocab + frame[b], tmp);
            for (int c = 0; c < g->dim; c++) x[c] += tmp[c];
        }
        model_round(m, x, (size_t)g->dim);
        rmsnorm(x, x, g->audio_norm, g->dim, 1e-6f);
    } else {
        qmat_row(&g->embed, id, tmp);
        model_round(m, tmp, (size_t)g->dim);
        rmsnorm(x, tmp, g->embed_norm, g->dim, g->eps);
    }
    model_round(m, x, (size_t)g->dim);
}

static void add_row(void *ctx, int i) {
    const row_job *j = ctx;
    float *x = j->out + (size_t)i * j->dim;
    const float *delta = j->x + (size_t)i * j->dim;
    for (int c = 0; c < j->dim; c++) x[c] += delta[c];
    model_round(j->m, x, (size_t)j->dim);
}

static void add_residual(const model *m, float *x, const float *delta, int n) {
    row_job j = {.m = m, .out = x, .x = delta, .dim = ((const ink_model *)m->priv)->dim};
    pool_run(n, add_row, &j);
}

/* lm_head(RMSNorm(x) / logits_mup_width_multiplier), only the unpadded rows, of the rows that
 * want logits (every row a segment asked all of, and each segment's last row), INK_HEAD_ROWS
 * rows per product: a batched decode step reads the head once for all its sequences, and the
 * logits buffer stays a few rows of the vocabulary; the kernel's result for a row does not
 * depend on the batch. */
static void head_logits(const model *m, const ink_rows *rw, const float *x, ink_bufs *b) {
    const ink_model *g = m->priv;
    size_t d = (size_t)g->dim, v = (size_t)g->unpadded;
    float *dest[INK_CHUNK];
    int cnt = 0;
    for (int i = 0; i < rw->n; i++)
        if (rw->all[i] || rw->last[i]) {
            model_norm_rows(m, b->head_hn + (size_t)cnt * d, x + i * d, g->final_norm, 1, g->dim, g->eps);
            dest[cnt++] = rw->all[i] ? rw->all[i] : rw->last[i];
        }
    for (size_t k = 0; k < (size_t)cnt * d; k++) b->head_hn[k] /= g->logit_div;
    model_round(m, b->head_hn, (size_t)cnt * d);
    for (int k0 = 0; k0 < cnt; k0 += INK_HEAD_ROWS) {
        int rows = MIN(INK_HEAD_ROWS, cnt - k0);
        qmat_mul_rows(&g->head, 0, g->unpadded, b->head_hn + (size_t)k0 * d, rows, b->head_out);
        for (int k = 0; k < rows; k++) memcpy(dest[k0 + k], b->head_out + (size_t)k * v, v * sizeof(float));
    }
}

/* One pass over at most INK_CHUNK rows (from one or more sequences); all its scratch is given
 * back at the end. Token-parallel work runs over all rows, stateful work per row in its own
 * sequence. */
static void forward_rows(const model *m, const ink_rows *rw, arena *sc) {
    const ink_model *g = m->priv;
    size_t start = arena_mark(sc);
    ink_bufs b;
    chunk_layout(sc, g, rw->n, &b);
    float *x = b.x, *hn = b.hn, *delta = b.delta, *branch = b.branch;
    for (int i = 0; i < rw->n; i++) embed(m, rw->seq[i], rw->ids[i], x + (size_t)i * g->dim, delta);
    for (int li = 0; li < g->n_layers; li++) {
        const ink_layer *l = &g->layers[li];
        model_norm_rows(m, hn, x, l->attn_norm, rw->n, g->dim, g->eps);
        attention(m, li, rw, hn, &b, branch);
        conv_rows(m, rw, li, CONV_ATTN, l->conv_attn, g->dim, branch, (size_t)g->dim, delta);
        add_residual(m, x, delta, rw->n);
        model_norm_rows(m, hn, x, l->mlp_norm, rw->n, g->dim, g->eps);
        mlp(m, l, hn, rw->n, branch, &b);
        conv_rows(m, rw, li, CONV_MLP, l->conv_mlp, g->dim, branch, (size_t)g->dim, delta);
        add_residual(m, x, delta, rw->n);
    }
    head_logits(m, rw, x, &b);
    arena_release(sc, start);
}

/* Rows of INK_CHUNK at most, taken from the segments in order (a segment may span passes);
 * by chunking invariance and per-row state the grouping changes no bit. The passes use the
 * first segment's scratch. */
int inkling_forward(model *m, const fwd_seg *segs, int nseg, char *err, size_t errlen) {
    const ink_model *g = m->priv;
    ink_seq *first = segs[0].fam_seq;
    ink_seq *seq[INK_CHUNK];
    int pos[INK_CHUNK], ids[INK_CHUNK];
    float *all[INK_CHUNK], *last[INK_CHUNK];
    ink_rows rw = {.seq = seq, .pos = pos, .ids = ids, .all = all, .last = last};
    for (int si = 0; si < nseg; si++)
        for (int t = 0; t < segs[si].n; t++) {
            const fwd_seg *sg = &segs[si];
            int k = rw.n++;
            seq[k] = sg->fam_seq, pos[k] = sg->pos0 + t, ids[k] = sg->ids[t];
            all[k] = sg->all_logits ? sg->all_logits + (size_t)t * g->unpadded : NULL;
            last[k] = t == sg->n - 1 ? sg->logits : NULL;
            rw.end = MAX(rw.end, pos[k] + 1);
            if (rw.n == INK_CHUNK || (si == nseg - 1 && t == sg->n - 1)) {
                forward_rows(m, &rw, first->scratch);
                rw.n = rw.end = 0;
            }
        }
    return 0;
}
