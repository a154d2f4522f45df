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
 * score_t = (q_abs . latent_t + q_rope . rope_t) / sqrt(qk_head_dim), then the softmax-weighted
 * latent goes through W_uv. The positions attended are all t <= pos until there are more than
 * index_topk of them; from then on the DSA indexer's top-k (ascending positions). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/quant.h"
#include "../core/threads.h"
#include "../core/util.h"
#include "glm.h"

/* Scratch of one forward call; freed together at the end. */
typedef struct {
    void *ptr[32];
    int n;
} scratch;

static float *scratch_floats(scratch *s, size_t n) {
    float *p = xcalloc(n ? n : 1, sizeof(float));
    s->ptr[s->n++] = p;
    return p;
}

static int *scratch_ints(scratch *s, size_t n) {
    int *p = xcalloc(n ? n : 1, sizeof(int));
    s->ptr[s->n++] = p;
    return p;
}

static void scratch_free(scratch *s) {
    for (int i = 0; i < s->n; i++) free(s->ptr[i]);
    s->n = 0;
}

static void act_round(const model *m, float *x, size_t n) {
    if (m->num == NUMERICS_QAT) bf16_round_vec(x, n);
}

static void rope_rotate(const glm_model *g, float *x, int pos, int interleave) {
    if (interleave) rope_apply_interleaved(&g->rope_tab, x, pos, 0);
    else rope_apply_half(&g->rope_tab, x, pos, 0);
}

static void rmsnorm_rows(const model *m, float *out, const float *x, const float *w, int n, int dim, float eps) {
    for (int i = 0; i < n; i++) rmsnorm(out + (size_t)i * dim, x + (size_t)i * dim, w, dim, eps);
    act_round(m, out, (size_t)n * dim);
}

static void project(const model *m, const qmat *w, const float *x, int n, float *y) {
    qmat_mul(w, x, n, y);
    act_round(m, y, (size_t)n * w->rows);
}

/* Which positions token i attends to: nsel[i] < 0 means every t <= pos, else sel[i*cap..] ascending. */
typedef struct {
    int *sel, *nsel;
    int cap;
} selection;

/* ---- DSA indexer ------------------------------------------------------------------------ */

typedef struct {
    const glm_model *g;
    const float *keys;       /* indexer key rows of this layer */
    const float *q;          /* [n][heads * idx_dim], roped */
    const float *w;          /* [n][heads], already scaled by heads^-0.5 */
    int pos0;
    selection *sel;
} index_job;

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* score_t = sum_h w_h * ReLU(q_h . k_t / sqrt(idx_dim)) over t <= pos; keep the best index_topk
 * (ties to the lower position), then sort them by position so attention sums in position order. */
static void index_token(void *ctx, int i) {
    index_job *j = ctx;
    const glm_model *g = j->g;
    int pos = j->pos0 + i, k = g->idx_topk;
    if (pos + 1 <= k) { j->sel->nsel[i] = -1; return; }
    float *score = xmalloc((size_t)(pos + 1) * sizeof *score);
    float inv = 1.0f / sqrtf((float)g->idx_dim);
    const float *q = j->q + (size_t)i * g->idx_heads * g->idx_dim, *w = j->w + (size_t)i * g->idx_heads;
    for (int t = 0; t <= pos; t++) {
        const float *key = j->keys + (size_t)t * g->idx_dim;
        float acc = 0.0f;
        for (int h = 0; h < g->idx_heads; h++) {
            float d = dot_f32(q + (size_t)h * g->idx_dim, key, g->idx_dim) * inv;
            if (d > 0.0f) acc += w[h] * d;
        }
        score[t] = acc;
    }
    int *out = j->sel->sel + (size_t)i * j->sel->cap;
    topk(score, pos + 1, k, out);
    qsort(out, (size_t)k, sizeof *out, cmp_int);
    j->sel->nsel[i] = k;
    free(score);
}

/* Computes this layer's indexer keys into the state and the selection of every token. */
static void run_indexer(const model *m, const glm_layer *l, float *keys, const float *hn, const float *q_resid,
                        int pos0, int n, selection *sel, scratch *sc) {
    const glm_model *g = m->priv;
    int hd = g->idx_dim, nh = g->idx_heads;
    float *q = scratch_floats(sc, (size_t)n * nh * hd), *k = scratch_floats(sc, (size_t)n * hd);
    float *w = scratch_floats(sc, (size_t)n * nh);
    project(m, &l->idx_wq_b, q_resid, n, q);
    project(m, &l->idx_wk, hn, n, k);
    project(m, &l->idx_weights, hn, n, w);
    float head_scale = 1.0f / sqrtf((float)nh);
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < nh; h++) rope_rotate(g, q + ((size_t)i * nh + h) * hd, pos0 + i, g->idx_rope_interleave);
        for (int h = 0; h < nh; h++) w[(size_t)i * nh + h] *= head_scale;
        float *row = keys + (size_t)(pos0 + i) * hd;
        layernorm(row, k + (size_t)i * hd, l->idx_knorm_w, l->idx_knorm_b, hd, 1e-6f);
        act_round(m, row, (size_t)hd);
        rope_rotate(g, row, pos0 + i, g->idx_rope_interleave);
    }
    index_job job = {g, keys, q, w, pos0, sel};
    pool_run(n, index_token, &job);
}

/* ---- MLA attention ---------------------------------------------------------------------- */

typedef struct {
    const glm_model *g;
    const glm_layer *l;
    const float *rows;       /* latent + rope rows of this layer */
    const float *q;          /* [n][heads][nope + rope], roped */
    const selection *sel;
    int pos0, n;
    float *out;              /* [n][heads * v_dim] */
} attn_job;

static void attend_token(const attn_job *j, int h, int i, const float *w_uk, const float *w_uv, float *q_abs,
                         float *c_lat, float *score) {
    const glm_model *g = j->g;
    int kvl = g->kv_lora, row_len = g->kv_lora + g->rope, pos = j->pos0 + i;
    const float *qn = j->q + ((size_t)i * g->n_heads + h) * (g->nope + g->rope), *qr = qn + g->nope;
    memset(q_abs, 0, (size_t)kvl * sizeof *q_abs);
    for (int d = 0; d < g->nope; d++)
        for (int c = 0; c < kvl; c++) q_abs[c] += qn[d] * w_uk[(size_t)d * kvl + c];
    int dense = j->sel->nsel[i] < 0, cnt = dense ? pos + 1 : j->sel->nsel[i];
    const int *picked = j->sel->sel + (size_t)i * j->sel->cap;
    float scale = 1.0f / sqrtf((float)(g->nope + g->rope));
    for (int k = 0; k < cnt; k++) {
        const float *row = j->rows + (size_t)(dense ? k : picked[k]) * row_len;
        score[k] = (dot_f32(q_abs, row, kvl) + dot_f32(qr, row + kvl, g->rope)) * scale;
    }
    softmax(score, cnt);
    memset(c_lat, 0, (size_t)kvl * sizeof *c_lat);
    for (int k = 0; k < cnt; k++) {
        const float *row = j->rows + (size_t)(dense ? k : picked[k]) * row_len;
        for (int c = 0; c < kvl; c++) c_lat[c] += score[k] * row[c];
    }
    float *o = j->out + (size_t)i * g->n_heads * g->v_dim + (size_t)h * g->v_dim;
    for (int d = 0; d < g->v_dim; d++) o[d] = dot_f32(w_uv + (size_t)d * kvl, c_lat, kvl);
}

static void attend_head(void *ctx, int h) {
    attn_job *j = ctx;
    const glm_model *g = j->g;
    int kvl = g->kv_lora, per_head = g->nope + g->v_dim;
    float *w = xmalloc((size_t)per_head * kvl * sizeof *w);
    float *q_abs = xmalloc((size_t)kvl * sizeof *q_abs), *c_lat = xmalloc((size_t)kvl * sizeof *c_lat);
    float *score = xmalloc((size_t)(j->pos0 + j->n) * sizeof *score);
    for (int r = 0; r < per_head; r++) qmat_row(&j->l->kv_b, h * per_head + r, w + (size_t)r * kvl);
    for (int i = 0; i < j->n; i++) attend_token(j, h, i, w, w + (size_t)g->nope * kvl, q_abs, c_lat, score);
    free(w);
    free(q_abs);
    free(c_lat);
    free(score);
}

/* out[n][dim] = o_proj(attention(hn)); writes this layer's rows at pos0..pos0+n-1. */
static void attention(const model *m, const glm_layer *l, int li, glm_seq *s, const float *hn, int pos0, int n,
                      selection *sel, float *out, scratch *sc) {
    const glm_model *g = m->priv;
    int qk = g->nope + g->rope, row_len = g->kv_lora + g->rope;
    float *qa = scratch_floats(sc, (size_t)n * g->q_lora), *q = scratch_floats(sc, (size_t)n * g->n_heads * qk);
    float *ckv = scratch_floats(sc, (size_t)n * row_len);
    float *heads = scratch_floats(sc, (size_t)n * g->n_heads * g->v_dim);
    project(m, &l->q_a, hn, n, qa);
    rmsnorm_rows(m, qa, qa, l->q_a_norm, n, g->q_lora, 1e-6f);
    project(m, &l->q_b, qa, n, q);
    project(m, &l->kv_a, hn, n, ckv);
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < g->n_heads; h++) rope_rotate(g, q + ((size_t)i * g->n_heads + h) * qk + g->nope, pos0 + i,
                                                         g->rope_interleave);
        float *row = s->kv[li] + (size_t)(pos0 + i) * row_len;
        rmsnorm(row, ckv + (size_t)i * row_len, l->kv_a_norm, g->kv_lora, 1e-6f);
        act_round(m, row, (size_t)g->kv_lora);
        memcpy(row + g->kv_lora, ckv + (size_t)i * row_len + g->kv_lora, (size_t)g->rope * sizeof *row);
        rope_rotate(g, row + g->kv_lora, pos0 + i, g->rope_interleave);
    }
    if (g->has_indexer && l->full_indexer) run_indexer(m, l, s->ik[li], hn, qa, pos0, n, sel, sc);
    attn_job job = {g, l, s->kv[li], q, sel, pos0, n, heads};
    pool_run(g->n_heads, attend_head, &job);
    act_round(m, heads, (size_t)n * g->n_heads * g->v_dim);
    project(m, &l->o, heads, n, out);
}

/* ---- FFN -------------------------------------------------------------------------------- */

/* y[n][dim] = down(silu(gate x) * up x) */
static void swiglu(const model *m, const qmat *gate, const qmat *up, const qmat *down, const float *x, int n,
                   float *y, scratch *sc) {
    size_t len = (size_t)n * gate->rows;
    float *a = scratch_floats(sc, len), *b = scratch_floats(sc, len);
    project(m, gate, x, n, a);
    project(m, up, x, n, b);
    for (size_t k = 0; k < len; k++) a[k] = silu(a[k]) * b[k];
    act_round(m, a, len);
    project(m, down, a, n, y);
}

/* Sigmoid router: choose top_k on score + correction bias, weight by the unbiased scores
 * (renormalised when norm_topk_prob), times routed_scaling_factor. */
static void route(const glm_model *g, const glm_layer *l, const float *logits, int *idx, float *weight) {
    float *score = xmalloc((size_t)g->n_experts * sizeof *score), *choice = xmalloc((size_t)g->n_experts * sizeof *choice);
    for (int e = 0; e < g->n_experts; e++) {
        score[e] = sigmoidf(logits[e]);
        choice[e] = score[e] + l->router_bias[e];
    }
    topk(choice, g->n_experts, g->top_k, idx);
    float sum = 0.0f;
    for (int k = 0; k < g->top_k; k++) sum += weight[k] = score[idx[k]];
    for (int k = 0; k < g->top_k; k++)
        weight[k] = (g->norm_topk ? weight[k] / (sum + 1e-20f) : weight[k]) * g->routed_scale;
    free(score);
    free(choice);
}

static void moe(const model *m, const glm_layer *l, const float *x, int n, float *y, scratch *sc) {
    const glm_model *g = m->priv;
    int d = g->dim, K = g->top_k;
    float *logits = scratch_floats(sc, (size_t)n * g->n_experts), *weight = scratch_floats(sc, (size_t)n * K);
    int *idx = scratch_ints(sc, (size_t)n * K), *rows = scratch_ints(sc, (size_t)n);
    float *xin = scratch_floats(sc, (size_t)n * d), *ex = scratch_floats(sc, (size_t)n * K * d);
    float *eout = scratch_floats(sc, (size_t)n * d);
    qmat_mul(&l->router, x, n, logits);
    for (int i = 0; i < n; i++) route(g, l, logits + (size_t)i * g->n_experts, idx + (size_t)i * K, weight + (size_t)i * K);
    /* Batch each expert over the tokens that chose it; results land in ex[token][slot]. */
    for (int e = 0; e < g->n_experts; e++) {
        int cnt = 0;
        for (int t = 0; t < n * K; t++)
            if (idx[t] == e) { memcpy(xin + (size_t)cnt * d, x + (size_t)(t / K) * d, (size_t)d * sizeof *x); rows[cnt++] = t; }
        if (!cnt) continue;
        scratch inner = {0};
        swiglu(m, &l->e_gate[e], &l->e_up[e], &l->e_down[e], xin, cnt, eout, &inner);
        scratch_free(&inner);
        for (int r = 0; r < cnt; r++) memcpy(ex + (size_t)rows[r] * d, eout + (size_t)r * d, (size_t)d * sizeof *ex);
    }
    swiglu(m, &l->gate, &l->up, &l->down, x, n, y, sc);      /* shared expert */
    for (int i = 0; i < n; i++) {
        float *yi = y + (size_t)i * d;
        for (int c = 0; c < d; c++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += weight[(size_t)i * K + k] * ex[((size_t)i * K + k) * d + c];
            yi[c] += acc;
        }
    }
    act_round(m, y, (size_t)n * d);
}

/* ---- the whole model -------------------------------------------------------------------- */

static void add_residual(const model *m, float *x, const float *delta, size_t len) {
    for (size_t k = 0; k < len; k++) x[k] += delta[k];
    act_round(m, x, len);
}

static int check_input(const glm_model *g, const glm_seq *s, const int *ids, int pos0, int n, char *err,
                       size_t errlen) {
    if (n < 1) return errf(err, errlen, "forward: no tokens");
    if (pos0 < 0 || pos0 + n > s->cap)
        return errf(err, errlen, "forward: positions %d..%d exceed the context of %d", pos0, pos0 + n - 1, s->cap);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= g->vocab)
            return errf(err, errlen, "token id %d at position %d is outside the vocabulary (%d)", ids[i], pos0 + i,
                        g->vocab);
    return 0;
}

static int head_logits(const model *m, const float *x, int n, float *logits, float *all_logits, scratch *sc,
                       char *err, size_t errlen) {
    const glm_model *g = m->priv;
    int first = all_logits ? 0 : n - 1, cnt = n - first;
    float *hn = scratch_floats(sc, (size_t)cnt * g->dim), *out = scratch_floats(sc, (size_t)cnt * g->vocab);
    rmsnorm_rows(m, hn, x + (size_t)first * g->dim, g->final_norm, cnt, g->dim, g->eps);
    qmat_mul(&g->head, hn, cnt, out);
    for (size_t k = 0; k < (size_t)cnt * g->vocab; k++)
        if (!isfinite(out[k])) return errf(err, errlen, "non-finite logit at token %zu of the chunk", first + k / g->vocab);
    if (all_logits) memcpy(all_logits, out, (size_t)n * g->vocab * sizeof *out);
    if (logits) memcpy(logits, out + (size_t)(cnt - 1) * g->vocab, (size_t)g->vocab * sizeof *out);
    return 0;
}

int glm_forward(model *m, void *fam_seq, const int *ids, int pos0, int n, float *logits, float *all_logits,
                char *err, size_t errlen) {
    const glm_model *g = m->priv;
    glm_seq *s = fam_seq;
    if (check_input(g, s, ids, pos0, n, err, errlen)) return -1;
    scratch sc = {0};
    size_t len = (size_t)n * g->dim;
    float *x = scratch_floats(&sc, len), *hn = scratch_floats(&sc, len), *delta = scratch_floats(&sc, len);
    int cap = g->has_indexer ? g->idx_topk : 1;
    selection sel = {scratch_ints(&sc, (size_t)n * cap), scratch_ints(&sc, (size_t)n), cap};
    for (int i = 0; i < n; i++) sel.nsel[i] = -1;
    for (int i = 0; i < n; i++) qmat_row(&g->embed, ids[i], x + (size_t)i * g->dim);
    act_round(m, x, len);
    int rc = 0;
    for (int li = 0; li < g->n_layers; li++) {
        const glm_layer *l = &g->layers[li];
        scratch layer = {0};
        rmsnorm_rows(m, hn, x, l->attn_norm, n, g->dim, g->eps);
        attention(m, l, li, s, hn, pos0, n, &sel, delta, &layer);
        add_residual(m, x, delta, len);
        rmsnorm_rows(m, hn, x, l->ffn_norm, n, g->dim, g->eps);
        if (l->sparse) moe(m, l, hn, n, delta, &layer);
        else swiglu(m, &l->gate, &l->up, &l->down, hn, n, delta, &layer);
        add_residual(m, x, delta, len);
        scratch_free(&layer);
    }
    if (logits || all_logits) rc = head_logits(m, x, n, logits, all_logits, &sc, err, errlen);
    scratch_free(&sc);
    return rc;
}
