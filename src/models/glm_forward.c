/* glm_forward.c — the GLM-5 forward pass over a chunk of tokens of one or more sequences
 * (invariants in glm.h): token-parallel work over all rows, KV writes and attention per row in
 * its own sequence.
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
 * attended rows), then the softmax-weighted latent goes through W_uv. The positions attended are all t <= pos until there are more than
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

static void *scratch_alloc(scratch *s, size_t n, size_t size) {
    void *p = xcalloc(n ? n : 1, size);
    s->ptr[s->n++] = p;
    return p;
}

static float *scratch_floats(scratch *s, size_t n) { return scratch_alloc(s, n, sizeof(float)); }

static int *scratch_ints(scratch *s, size_t n) { return scratch_alloc(s, n, sizeof(int)); }

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

/* The rows of a call: its segments' tokens concatenated; row i is position pos[i] of seq[i]
 * (a sequence's rows in position order). Stateful work for a row uses its own sequence. */
typedef struct {
    const int *pos;
    glm_seq *const *seq;
    int max_pos;
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

/* Computes this layer's indexer keys into each row's state and the selection of every row. */
static void run_indexer(const model *m, const glm_layer *l, int li, const rows_info *ri, const float *hn,
                        const float *q_resid, int n, selection *sel, scratch *sc) {
    const glm_model *g = m->priv;
    int hd = g->idx_dim, nh = g->idx_heads;
    float *q = scratch_floats(sc, (size_t)n * nh * hd), *k = scratch_floats(sc, (size_t)n * hd);
    float *w = scratch_floats(sc, (size_t)n * nh);
    project(m, &l->idx_wq_b, q_resid, n, q);
    project(m, &l->idx_wk, hn, n, k);
    project(m, &l->idx_weights, hn, n, w);
    float head_scale = 1.0f / sqrtf((float)nh);
    for (int i = 0; i < n; i++) {
        int pos = ri->pos[i];
        for (int h = 0; h < nh; h++) rope_rotate(g, q + ((size_t)i * nh + h) * hd, pos, g->idx_rope_interleave);
        for (int h = 0; h < nh; h++) w[(size_t)i * nh + h] *= head_scale;
        float *row = ri->seq[i]->ik[li] + (size_t)pos * hd;
        layernorm(row, k + (size_t)i * hd, l->idx_knorm_w, l->idx_knorm_b, hd, 1e-6f);
        act_round(m, row, (size_t)hd);
        rope_rotate(g, row, pos, g->idx_rope_interleave);
    }
    float *dots = scratch_floats(sc, (size_t)nh * (ri->max_pos + 1));
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
    const glm_layer *l;
    float *w;                /* [heads][nope + v_dim][kv_lora]: kv_b_proj dequantized per head */
    const float *q;          /* this token's [heads][nope + rope], roped */
    const float *rows;       /* the attended latent + rope rows, contiguous */
    int cnt;
    float *work;             /* [heads][row_len + kv_lora + cnt_max] */
    size_t work_stride;
    float *out;              /* this token's [heads * v_dim] */
} attn_job;

static void dequant_head(void *ctx, int h) {
    attn_job *j = ctx;
    int kvl = j->g->kv_lora, per_head = j->g->nope + j->g->v_dim;
    for (int r = 0; r < per_head; r++) qmat_row(&j->l->kv_b, h * per_head + r, j->w + ((size_t)h * per_head + r) * kvl);
}

/* One head of one token: qcat = [W_uk^T q_nope | q_rope] scores every attended row in one kernel
 * call (latent . q_abs + rope . q_rope as a single dot), then the softmax-weighted latent goes
 * through W_uv. */
static void attend_head(void *ctx, int h) {
    attn_job *j = ctx;
    const glm_model *g = j->g;
    int kvl = g->kv_lora, row_len = kvl + g->rope;
    const float *w_uk = j->w + (size_t)h * (g->nope + g->v_dim) * kvl, *w_uv = w_uk + (size_t)g->nope * kvl;
    const float *qn = j->q + (size_t)h * (g->nope + g->rope);
    float *qcat = j->work + (size_t)h * j->work_stride, *c_lat = qcat + row_len, *score = c_lat + kvl;
    memset(qcat, 0, (size_t)kvl * sizeof *qcat);
    for (int d = 0; d < g->nope; d++)
        for (int c = 0; c < kvl; c++) qcat[c] += qn[d] * w_uk[(size_t)d * kvl + c];
    memcpy(qcat + kvl, qn + g->nope, (size_t)g->rope * sizeof *qcat);
    qmat rows = rows_matrix(j->rows, j->cnt, row_len);
    qmat_vec(&rows, qcat, score);
    float scale = 1.0f / sqrtf((float)(g->nope + g->rope));
    for (int k = 0; k < j->cnt; k++) score[k] *= scale;
    softmax(score, j->cnt);
    memset(c_lat, 0, (size_t)kvl * sizeof *c_lat);
    for (int k = 0; k < j->cnt; k++)
        for (int c = 0; c < kvl; c++) c_lat[c] += score[k] * j->rows[(size_t)k * row_len + c];
    for (int d = 0; d < g->v_dim; d++) j->out[(size_t)h * g->v_dim + d] = dot_f32(w_uv + (size_t)d * kvl, c_lat, kvl);
}

/* Every row in order: the attended rows are all t <= pos of the row's sequence (already
 * contiguous in its state) or the indexer's selection gathered into one buffer, then heads run
 * in parallel. */
static void attend(const glm_model *g, const glm_layer *l, int li, const rows_info *ri, const float *q,
                   const selection *sel, int n, float *out, scratch *sc) {
    int row_len = g->kv_lora + g->rope, qk = g->nope + g->rope, cnt_max = ri->max_pos + 1;
    attn_job j = {.g = g, .l = l, .work_stride = (size_t)row_len + g->kv_lora + cnt_max};
    j.w = scratch_floats(sc, (size_t)g->n_heads * (g->nope + g->v_dim) * g->kv_lora);
    j.work = scratch_floats(sc, (size_t)g->n_heads * j.work_stride);
    float *gathered = sel->cap > 1 ? scratch_floats(sc, (size_t)sel->cap * row_len) : NULL;
    pool_run(g->n_heads, dequant_head, &j);
    for (int i = 0; i < n; i++) {
        int k = sel->nsel[i];
        const float *state_rows = ri->seq[i]->kv[li];
        if (k < 0) {
            j.rows = state_rows;
            j.cnt = ri->pos[i] + 1;
        } else {
            const int *picked = sel->sel + (size_t)i * sel->cap;
            for (int r = 0; r < k; r++)
                memcpy(gathered + (size_t)r * row_len, state_rows + (size_t)picked[r] * row_len, (size_t)row_len * sizeof(float));
            j.rows = gathered;
            j.cnt = k;
        }
        j.q = q + (size_t)i * g->n_heads * qk;
        j.out = out + (size_t)i * g->n_heads * g->v_dim;
        pool_run(g->n_heads, attend_head, &j);
    }
}

/* out[n][dim] = o_proj(attention(hn)); writes this layer's row of every row's position. */
static void attention(const model *m, const glm_layer *l, int li, const rows_info *ri, const float *hn, int n,
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
        int pos = ri->pos[i];
        for (int h = 0; h < g->n_heads; h++)
            rope_rotate(g, q + ((size_t)i * g->n_heads + h) * qk + g->nope, pos, g->rope_interleave);
        float *row = ri->seq[i]->kv[li] + (size_t)pos * row_len;
        rmsnorm(row, ckv + (size_t)i * row_len, l->kv_a_norm, g->kv_lora, 1e-6f);
        act_round(m, row, (size_t)g->kv_lora);
        memcpy(row + g->kv_lora, ckv + (size_t)i * row_len + g->kv_lora, (size_t)g->rope * sizeof *row);
        rope_rotate(g, row + g->kv_lora, pos, g->rope_interleave);
    }
    if (g->has_indexer && l->full_indexer) run_indexer(m, l, li, ri, hn, qa, n, sel, sc);
    attend(g, l, li, ri, q, sel, n, heads, sc);
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

static int check_seg(const glm_model *g, const fwd_seg *seg, char *err, size_t errlen) {
    const glm_seq *s = seg->fam_seq;
    if (seg->n < 1) return errf(err, errlen, "forward: no tokens");
    if (seg->pos0 < 0 || seg->pos0 + seg->n > s->cap)
        return errf(err, errlen, "forward: positions %d..%d exceed the context of %d", seg->pos0,
                    seg->pos0 + seg->n - 1, s->cap);
    for (int i = 0; i < seg->n; i++)
        if (seg->ids[i] < 0 || seg->ids[i] >= g->vocab)
            return errf(err, errlen, "token id %d at position %d is outside the vocabulary (%d)", seg->ids[i],
                        seg->pos0 + i, g->vocab);
    return 0;
}

/* Logits of the rows that want them (every row of an all_logits segment, each segment's last),
 * through the head in one product over all segments. */
static int head_logits(const model *m, const float *x, const fwd_seg *segs, int nseg, scratch *sc, char *err,
                       size_t errlen) {
    const glm_model *g = m->priv;
    int want = 0, total = 0;
    for (int i = 0; i < nseg; i++) want += segs[i].all_logits ? segs[i].n : segs[i].logits ? 1 : 0;
    if (!want) return 0;
    float *hn = scratch_floats(sc, (size_t)want * g->dim), *out = scratch_floats(sc, (size_t)want * g->vocab);
    int k = 0;
    for (int i = 0; i < nseg; total += segs[i++].n) {
        int first = segs[i].all_logits ? 0 : segs[i].logits ? segs[i].n - 1 : segs[i].n;
        for (int t = first; t < segs[i].n; t++, k++)
            rmsnorm(hn + (size_t)k * g->dim, x + (size_t)(total + t) * g->dim, g->final_norm, g->dim, g->eps);
    }
    act_round(m, hn, (size_t)want * g->dim);
    qmat_mul(&g->head, hn, want, out);
    for (size_t e = 0; e < (size_t)want * g->vocab; e++)
        if (!isfinite(out[e])) return errf(err, errlen, "non-finite logit at logits row %zu of the call", e / g->vocab);
    k = 0;
    for (int i = 0; i < nseg; i++) {
        const fwd_seg *seg = &segs[i];
        size_t v = (size_t)g->vocab;
        if (seg->all_logits) memcpy(seg->all_logits, out + (size_t)k * v, (size_t)seg->n * v * sizeof *out);
        k += seg->all_logits ? seg->n : seg->logits ? 1 : 0;
        if (seg->logits) memcpy(seg->logits, out + (size_t)(k - 1) * v, v * sizeof *out);
    }
    return 0;
}

int glm_forward(model *m, const fwd_seg *segs, int nseg, char *err, size_t errlen) {
    const glm_model *g = m->priv;
    int n = 0;
    for (int i = 0; i < nseg; n += segs[i++].n)
        if (check_seg(g, &segs[i], err, errlen)) return -1;
    scratch sc = {0};
    size_t len = (size_t)n * g->dim;
    float *x = scratch_floats(&sc, len), *hn = scratch_floats(&sc, len), *delta = scratch_floats(&sc, len);
    int cap = g->has_indexer ? g->idx_topk : 1;
    selection sel = {scratch_ints(&sc, (size_t)n * cap), scratch_ints(&sc, (size_t)n), cap};
    int *pos = scratch_ints(&sc, (size_t)n);
    glm_seq **seq = scratch_alloc(&sc, (size_t)n, sizeof *seq);
    rows_info ri = {pos, seq, 0};
    for (int i = 0, r = 0; i < nseg; i++)
        for (int t = 0; t < segs[i].n; t++, r++) {
            pos[r] = segs[i].pos0 + t;
            seq[r] = segs[i].fam_seq;
            ri.max_pos = MAX(ri.max_pos, pos[r]);
            sel.nsel[r] = -1;
            qmat_row(&g->embed, segs[i].ids[t], x + (size_t)r * g->dim);
        }
    act_round(m, x, len);
    for (int li = 0; li < g->n_layers; li++) {
        const glm_layer *l = &g->layers[li];
        scratch layer = {0};
        rmsnorm_rows(m, hn, x, l->attn_norm, n, g->dim, g->eps);
        attention(m, l, li, &ri, hn, n, &sel, delta, &layer);
        add_residual(m, x, delta, len);
        rmsnorm_rows(m, hn, x, l->ffn_norm, n, g->dim, g->eps);
        if (l->sparse) moe(m, l, hn, n, delta, &layer);
        else swiglu(m, &l->gate, &l->up, &l->down, hn, n, delta, &layer);
        add_residual(m, x, delta, len);
        scratch_free(&layer);
    }
    int rc = head_logits(m, x, segs, nseg, &sc, err, errlen);
    scratch_free(&sc);
    return rc;
}
