/* deepseek_v4_moe.c — the MoE FFN of one block (spec §5, §7.1): sqrtsoftplus scores, routing by
 * biased top-k (noaux_tc) or by the token-id table (hash layers), renormalised route weights,
 * SwiGLU experts with the clamp, always-on shared expert.
 *
 * Tokens of a pass are grouped by expert so each expert's weights are read once per pass; the
 * per-token sum then runs in top-k rank order and adds the shared expert last, so the result
 * does not depend on how tokens were grouped. */
#include <math.h>
#include <string.h>

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

/* ye[r] = w2 h(xe[r]) for ne gathered rows, h = bf16(weight * silu(min(g, lim)) * clip(u, lim)). */
static void expert_run(const dsv4_model *d, const qmat *w1, const qmat *w3, const qmat *w2, const float *weight,
                       dsv4_seq *s, int ne) {
    int inter = w1->rows;
    float lim = (float)d->c.swiglu_limit;
    qmat_mul(w1, s->moe_xe, ne, s->moe_ge);
    qmat_mul(w3, s->moe_xe, ne, s->moe_ue);
    dsv4_bf16(d, s->moe_ge, (size_t)ne * inter);
    dsv4_bf16(d, s->moe_ue, (size_t)ne * inter);
    for (int r = 0; r < ne; r++) {
        float *g = s->moe_ge + (size_t)r * inter;
        const float *u = s->moe_ue + (size_t)r * inter;
        /* fminf/fmaxf by comparison (inlined, unlike the libm calls): the same values, NaN
         * included (it fails the comparison and gives the limit, as fminf/fmaxf do). */
        for (int k = 0; k < inter; k++) {
            float gk = g[k] < lim ? g[k] : lim, uk = u[k] > -lim ? u[k] : -lim;
            uk = uk < lim ? uk : lim;
            g[k] = weight[r] * (silu(gk) * uk);
        }
        dsv4_bf16(d, g, inter);
        dsv4_act_qdq(d, g, inter);
    }
    qmat_mul(w2, s->moe_ge, ne, s->moe_ye);
    dsv4_bf16(d, s->moe_ye, (size_t)ne * d->c.dim);
}

typedef struct {
    const dsv4_model *d;
    dsv4_seq *s;
} routed_job;

/* Routed expert e (its w1, w2, w3 in w, the tensor table's order) on the (token, rank) slots that chose it; results go to
 * moe_y[token][rank]. */
static void run_routed(void *ctx, int e, const qmat *w, const int *slots, int ne) {
    routed_job *j = ctx;
    const dsv4_config *c = &j->d->c;
    dsv4_seq *s = j->s;
    for (int r = 0; r < ne; r++) s->moe_rw[r] = s->moe_w[slots[r]];
    experts_gather(s->xq, c->dim, c->n_active, slots, ne, s->moe_xe);
    expert_run(j->d, &w[0], &w[2], &w[1], s->moe_rw, s, ne);
    experts_scatter(s->moe_ye, c->dim, slots, ne, s->moe_y);
}

void dsv4_moe(const dsv4_model *d, const dsv4_layer *L, dsv4_seq *s, int n, const float *x, float *out) {
    const dsv4_config *c = &d->c;
    int k = c->n_active, dim = c->dim;
    qmat_mul(&L->gate, x, n, s->moe_logit);
    for (int t = 0; t < n; t++)
        route(d, L, s, s->row_id[t], s->moe_logit + (size_t)t * c->n_experts, s->moe_idx + t * k, s->moe_w + t * k);
    memcpy(s->xq, x, sizeof(float) * n * dim);
    for (int t = 0; t < n; t++) dsv4_act_qdq(d, s->xq + (size_t)t * dim, dim);
    routed_job j = {d, s};
    experts_run(d->experts, (int)(L - d->layers), s->moe_idx, n * k, run_routed, &j);
    int shared = L->sw1.data != NULL;
    if (shared) {
        memcpy(s->moe_xe, s->xq, sizeof(float) * n * dim);
        for (int t = 0; t < n; t++) s->moe_rw[t] = 1.0f;
        expert_run(d, &L->sw1, &L->sw3, &L->sw2, s->moe_rw, s, n);
    }
    for (int t = 0; t < n; t++) {
        const float *y = s->moe_y + (size_t)t * k * dim, *sh = s->moe_ye + (size_t)t * dim;
        float *o = out + (size_t)t * dim;
        for (int j = 0; j < dim; j++) {
            float acc = 0;
            for (int r = 0; r < k; r++) acc += y[(size_t)r * dim + j];
            o[j] = shared ? acc + sh[j] : acc;
        }
    }
    dsv4_bf16(d, out, (size_t)n * dim);
}
