/* deepseek_v4_moe.c — the MoE FFN of one block (spec §5, §7.1): sqrtsoftplus scores, routing by
 * biased top-k (noaux_tc) or by the token-id table (hash layers), renormalised route weights,
 * SwiGLU experts with the clamp, always-on shared expert.
 *
 * Tokens of a pass are grouped by expert so each expert's weights are read once per pass; the
 * per-token sum then runs in top-k rank order and adds the shared expert last, so the result
 * does not depend on how tokens were grouped. */
#include <math.h>
#include <string.h>

#include "../core/threads.h"
#include "../core/util.h"
#include "deepseek_v4.h"

/* Pick one token's experts and route weights from its gate logits. */
static void route(const dsv4_model *d, const dsv4_layer *L, dsv4_seq *s, int id, const float *logit, int *idx,
                  float *w) {
    const dsv4_config *c = &d->c;
    float *score = s->moe_score;
    for (int e = 0; e < c->n_experts; e++) score[e] = sqrtf(softplus(logit[e]));
    if (L->hash) {
        for (int k = 0; k < c->n_active; k++) {
            int64_t e;   /* memcpy: safetensors does not promise 8-byte alignment */
            memcpy(&e, L->tid2eid + (size_t)id * c->n_active + k, sizeof e);
            idx[k] = (int)e;
        }
    } else {
        for (int e = 0; e < c->n_experts; e++) s->moe_biased[e] = score[e] + L->gate_bias[e];
        topk(s->moe_biased, c->n_experts, c->n_active, idx);
    }
    float sum = 0;
    for (int k = 0; k < c->n_active; k++) sum += score[idx[k]];
    for (int k = 0; k < c->n_active; k++) w[k] = score[idx[k]] / sum * (float)c->route_scale;
}

/* The inner rows of one expert call, for swiglu_row. */
typedef struct {
    const dsv4_model *d;
    const float *weight;
    float *ge, *ue;
    int inter;
} swiglu_job;

/* Inner row r (a pool task: rows are independent; nested in a spread expert's task it runs
 * inline): g and u to BF16, g = bf16(weight * silu(min(g, lim)) * clip(u, lim)), then the down
 * input's QDQ. */
static void swiglu_row(void *ctx, int r) {
    const swiglu_job *j = ctx;
    float lim = (float)j->d->c.swiglu_limit;
    float *g = j->ge + (size_t)r * j->inter;
    float *u = j->ue + (size_t)r * j->inter;
    dsv4_bf16(j->d, g, j->inter);
    dsv4_bf16(j->d, u, j->inter);
    /* fminf/fmaxf by comparison (inlined, unlike the libm calls): the same values, NaN
     * included (it fails the comparison and gives the limit, as fminf/fmaxf do). */
    for (int k = 0; k < j->inter; k++) {
        float gk = g[k] < lim ? g[k] : lim, uk = u[k] > -lim ? u[k] : -lim;
        uk = uk < lim ? uk : lim;
        g[k] = j->weight[r] * (silu(gk) * uk);
    }
    dsv4_bf16(j->d, g, j->inter);
    dsv4_act_qdq(j->d, g, j->inter);
}

/* ye[r] = w2 h(xe[r]) for ne rows, h = bf16(weight * silu(min(g, lim)) * clip(u, lim)); ge and ue
 * hold ne rows of the expert's inner width. */
static void expert_run(const dsv4_model *d, const qmat *w1, const qmat *w3, const qmat *w2, const float *weight,
                       const float *xe, int ne, float *ge, float *ue, float *ye) {
    int inter = w1->rows;
    const qmat *w[] = {w1, w3};
    float *y[] = {ge, ue};
    qmat_mul_each(2, w, xe, ne, y);
    swiglu_job j = {d, weight, ge, ue, inter};
    pool_run(ne, swiglu_row, &j);
    qmat_mul(w2, ge, ne, ye);
    if (d->qat) bf16_round_rows(ye, ne, (size_t)d->c.dim);
}

size_t dsv4_expert_scratch(void *ctx, int layer, int ne) {
    const dsv4_model *d = ((const model *)ctx)->priv;
    arena a = {0};
    arena_take(&a, (size_t)ne * d->c.moe_inter, sizeof(float));
    arena_take(&a, (size_t)ne * d->c.moe_inter, sizeof(float));
    return a.used;
}

/* Routed expert e (its w1, w2, w3 in w, the tensor table's order) on ne gathered rows, each
 * scaled inside by its route weight (core/experts.h expert_fn). */
void dsv4_expert(void *ctx, int layer, int e, const qmat *w, const float *xe, const float *weight, int ne, float *ye,
                 arena *sc) {
    const dsv4_model *d = ((const model *)ctx)->priv;
    float *ge = arena_take(sc, (size_t)ne * w[0].rows, sizeof(float));
    float *ue = arena_take(sc, (size_t)ne * w[0].rows, sizeof(float));
    expert_run(d, &w[0], &w[2], &w[1], weight, xe, ne, ge, ue, ye);
}

typedef struct {
    const dsv4_model *d;
    const dsv4_seq *s;
    float *out;
    int shared;
} moe_sum_job;

/* Token t's output (a pool task: tokens are independent): its routed rows summed in rank order,
 * then the shared expert's row, then BF16; a row at a time over every column (loops that
 * vectorize, the same sum per column). */
static void moe_sum_token(void *ctx, int t) {
    const moe_sum_job *j = ctx;
    int k = j->d->c.n_active, dim = j->d->c.dim;
    const float *restrict y = j->s->moe_y + (size_t)t * k * dim, *restrict sh = j->s->moe_ye + (size_t)t * dim;
    float *restrict o = j->out + (size_t)t * dim;
    for (int c = 0; c < dim; c++) o[c] = 0;
    for (int r = 0; r < k; r++)
        for (int c = 0; c < dim; c++) o[c] += y[(size_t)r * dim + c];
    if (j->shared)
        for (int c = 0; c < dim; c++) o[c] += sh[c];
    dsv4_bf16(j->d, o, dim);
}

void dsv4_moe(const dsv4_model *d, const dsv4_layer *L, dsv4_seq *s, int n, const float *x, float *out) {
    const dsv4_config *c = &d->c;
    int k = c->n_active, dim = c->dim;
    qmat_mul(&L->gate, x, n, s->moe_logit);
    for (int t = 0; t < n; t++)
        route(d, L, s, s->row_id[t], s->moe_logit + (size_t)t * c->n_experts, s->moe_idx + t * k, s->moe_w + t * k);
    memcpy(s->xq, x, sizeof(float) * n * dim);
    for (int t = 0; t < n; t++) dsv4_act_qdq(d, s->xq + (size_t)t * dim, dim);
    /* routed outputs land in moe_y[token][rank] */
    experts_io io = {.x = s->xq, .din = dim, .k = k, .weight = s->moe_w, .out = s->moe_y, .dout = dim, .out_k = k};
    experts_run(d->experts, (int)(L - d->layers), s->moe_idx, n * k, &io);
    int shared = L->sw1.data != NULL;
    if (shared) {
        for (int t = 0; t < n; t++) s->moe_rw[t] = 1.0f;
        expert_run(d, &L->sw1, &L->sw3, &L->sw2, s->moe_rw, s->xq, n, s->moe_ge, s->moe_ue, s->moe_ye);
    }
    moe_sum_job j = {d, s, out, shared};
    pool_run(n, moe_sum_token, &j);
}
