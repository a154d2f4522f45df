/* kimi_k3_moe.c — K3's feed-forward blocks: SiTU-GLU (dense layer 0, fused shared experts) and the
 * stable latent MoE (invariants in kimi_k3.h).
 *
 * SiTU-GLU: down(beta * tanh(g / beta) * sigmoid(g) * linear_beta * tanh(u / linear_beta)), with
 * g = gate x, u = up x and both betas from the config (activation_situ_beta / _linear_beta).
 * Latent MoE, per token: sigmoid router scores s; top-k chosen on s + e_score_correction_bias
 * (ties to the lower expert); weights = the unbiased s of the chosen, renormalised to sum 1
 * (moe_renormalize) and times routed_scaling_factor (the official modeling applies it; the RMS
 * norm that follows makes it nearly scale-free); z = routed_expert_down_proj x; the experts'
 * weighted sum in the latent, RMS-normalised (routed_expert_norm), then routed_expert_up_proj;
 * plus the shared experts on x, unweighted. Expert contributions are summed in top-k order. */
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "kimi_k3.h"

/* y[n][down->rows] = SiTU-GLU(x). */
static void situ_glu(const model *m, const qmat *gate, const qmat *up, const qmat *down, const float *x, int n,
                     float *y) {
    size_t len = (size_t)n * gate->rows;
    float *g = xmalloc(len * sizeof *g), *u = xmalloc(len * sizeof *u);
    k3_project(m, gate, x, n, g);
    k3_project(m, up, x, n, u);
    k3_situ(m->priv, g, u, len);
    k3_round(m, g, len);
    k3_project(m, down, g, n, y);
    free(g);
    free(u);
}

static void route(const k3_model *k, const k3_layer *l, const float *logits, int *idx, float *weight) {
    float *score = xmalloc((size_t)k->n_experts * sizeof *score), *choice = xmalloc((size_t)k->n_experts * sizeof *choice);
    for (int e = 0; e < k->n_experts; e++) {
        score[e] = sigmoidf(logits[e]);
        choice[e] = score[e] + l->router_bias[e];
    }
    topk(choice, k->n_experts, k->top_k, idx);
    float sum = 0.0f;
    for (int i = 0; i < k->top_k; i++) sum += weight[i] = score[idx[i]];
    for (int i = 0; i < k->top_k; i++) weight[i] = (k->renormalize ? weight[i] / (sum + 1e-20f) : weight[i]) * k->routed_scale;
    free(score);
    free(choice);
}

static void latent_moe(const model *m, const k3_layer *l, const float *x, int n, float *y, k3_scratch *sc) {
    const k3_model *k = m->priv;
    int K = k->top_k, lat = k->latent;
    float *logits = k3_floats(sc, (size_t)n * k->n_experts), *weight = k3_floats(sc, (size_t)n * K);
    float *z = k3_floats(sc, (size_t)n * lat), *zin = k3_floats(sc, (size_t)n * lat);
    float *ex = k3_floats(sc, (size_t)n * K * lat), *eout = k3_floats(sc, (size_t)n * lat);
    float *agg = k3_floats(sc, (size_t)n * lat), *shared = k3_floats(sc, (size_t)n * k->dim);
    int *idx = xmalloc((size_t)n * K * sizeof *idx), *rows = xmalloc((size_t)n * K * sizeof *rows);
    qmat_mul(&l->router, x, n, logits);
    for (int t = 0; t < n; t++) route(k, l, logits + (size_t)t * k->n_experts, idx + (size_t)t * K, weight + (size_t)t * K);
    k3_project(m, &l->lat_down, x, n, z);
    /* Each expert runs once over the tokens that chose it; results land in ex[token][slot]. */
    for (int e = 0; e < k->n_experts; e++) {
        int cnt = 0;
        for (int s = 0; s < n * K; s++)
            if (idx[s] == e) {
                memcpy(zin + (size_t)cnt * lat, z + (size_t)(s / K) * lat, (size_t)lat * sizeof *z);
                rows[cnt++] = s;
            }
        if (!cnt) continue;
        situ_glu(m, &l->w1[e], &l->w3[e], &l->w2[e], zin, cnt, eout);
        for (int r = 0; r < cnt; r++) memcpy(ex + (size_t)rows[r] * lat, eout + (size_t)r * lat, (size_t)lat * sizeof *ex);
    }
    for (int t = 0; t < n; t++)
        for (int c = 0; c < lat; c++) {
            float acc = 0.0f;
            for (int s = 0; s < K; s++) acc += weight[(size_t)t * K + s] * ex[((size_t)t * K + s) * lat + c];
            agg[(size_t)t * lat + c] = acc;
        }
    k3_round(m, agg, (size_t)n * lat);
    k3_rmsnorm_rows(m, agg, agg, l->lat_norm, n, lat, k->eps);
    k3_project(m, &l->lat_up, agg, n, y);
    situ_glu(m, &l->gate, &l->up, &l->down, x, n, shared);
    for (size_t i = 0; i < (size_t)n * k->dim; i++) y[i] += shared[i];
    k3_round(m, y, (size_t)n * k->dim);
    free(idx);
    free(rows);
}

void k3_ffn_forward(const model *m, const k3_layer *l, const float *x, int n, float *y, k3_scratch *sc) {
    if (l->sparse) latent_moe(m, l, x, n, y, sc);
    else situ_glu(m, &l->gate, &l->up, &l->down, x, n, y);
}
