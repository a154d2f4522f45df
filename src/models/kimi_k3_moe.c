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
#include <string.h>

#include "../core/threads.h"
#include "../core/util.h"
#include "kimi_k3.h"

typedef struct {
    float *g, *u;              /* [n][inter] */
} glu_bufs;

static void glu_layout(arena *a, int n, int inter, glu_bufs *b) {
    b->g = k3_floats(a, (size_t)n * inter);
    b->u = k3_floats(a, (size_t)n * inter);
}

typedef struct {
    const model *m;
    float *g;
    const float *u;
    int width;
} situ_job;

/* Row r's activation (a pool task: rows are independent; inside a routed expert's task it runs
 * on that thread, as every nested pool call does). */
static void situ_row(void *ctx, int r) {
    const situ_job *j = ctx;
    size_t at = (size_t)r * j->width;
    k3_situ(j->m->priv, j->g + at, j->u + at, (size_t)j->width);
    model_round(j->m, j->g + at, (size_t)j->width);
}

/* y[n][down->rows] = SiTU-GLU(x). */
static void situ_glu(const model *m, const qmat *gate, const qmat *up, const qmat *down, const float *x, int n,
                     float *y, arena *sc) {
    size_t mark = arena_mark(sc);
    glu_bufs b;
    glu_layout(sc, n, gate->rows, &b);
    const qmat *w[] = {gate, up};
    float *gu[] = {b.g, b.u};
    model_project_each(m, 2, w, x, n, gu);
    situ_job j = {m, b.g, b.u, gate->rows};
    pool_run(n, situ_row, &j);
    model_project(m, down, b.g, n, y);
    arena_release(sc, mark);
}

static void route(const k3_model *k, const k3_layer *l, const float *logits, float *score, float *choice, int *idx,
                  float *weight) {
    for (int e = 0; e < k->n_experts; e++) {
        score[e] = sigmoid_f32(logits[e]);
        choice[e] = score[e] + l->router_bias[e];
    }
    topk(choice, k->n_experts, k->top_k, idx);
    float sum = 0.0f;
    for (int i = 0; i < k->top_k; i++) sum += weight[i] = score[idx[i]];
    for (int i = 0; i < k->top_k; i++) weight[i] = (k->renormalize ? weight[i] / (sum + 1e-20f) : weight[i]) * k->routed_scale;
}

/* The buffers of one latent-MoE pass over n tokens (the experts' SiTU-GLU takes its own after). */
typedef struct {
    float *logits, *weight, *score, *choice;
    float *z, *ex, *agg, *shared;   /* latent inputs, expert outputs [n][top_k][latent], ... */
    int *idx;
} moe_bufs;

static void moe_layout(arena *a, const k3_model *k, int n, moe_bufs *b) {
    size_t nk = (size_t)n * k->top_k, lat = (size_t)k->latent;
    b->logits = k3_floats(a, (size_t)n * k->n_experts);
    b->weight = k3_floats(a, nk);
    b->score = k3_floats(a, (size_t)k->n_experts);
    b->choice = k3_floats(a, (size_t)k->n_experts);
    b->z = k3_floats(a, (size_t)n * lat);
    b->ex = k3_floats(a, nk * lat);
    b->agg = k3_floats(a, (size_t)n * lat);
    b->shared = k3_floats(a, (size_t)n * k->dim);
    b->idx = arena_take(a, nk, sizeof(int));
}

size_t k3_ffn_scratch(const k3_model *k, const k3_layer *l, int n) {
    arena a = {0};
    glu_bufs g;
    if (!l->sparse) {
        glu_layout(&a, n, k->inter, &g);
        return a.used;
    }
    moe_bufs b;
    moe_layout(&a, k, n, &b);
    size_t held = a.used;
    /* the shared experts over n rows (routed experts: core/experts.c's scratch) */
    glu_layout(&a, n, k->moe_inter * k->n_shared, &g);
    return MAX(held, a.used);
}

/* Routed expert e (w1, w2, w3 in w: the table's order) on cnt gathered latent rows
 * (core/experts.h expert_fn). */
void k3_expert(void *ctx, int layer, int e, const qmat *w, const float *in, const float *weight, int cnt, float *out,
               arena *sc) {
    situ_glu(ctx, &w[0], &w[2], &w[1], in, cnt, out, sc);
}

size_t k3_expert_scratch(void *ctx, int layer, int cnt) {
    const k3_model *k = ((const model *)ctx)->priv;
    arena a = {0};
    glu_bufs g;
    glu_layout(&a, cnt, k->moe_inter, &g);
    return a.used;
}

static void latent_moe(const model *m, const k3_layer *l, const float *x, int n, float *y, arena *sc) {
    const k3_model *k = m->priv;
    int K = k->top_k, lat = k->latent;
    size_t mark = arena_mark(sc);
    moe_bufs b;
    moe_layout(sc, k, n, &b);
    qmat_mul(&l->router, x, n, b.logits);
    for (int t = 0; t < n; t++)
        route(k, l, b.logits + (size_t)t * k->n_experts, b.score, b.choice, b.idx + (size_t)t * K, b.weight + (size_t)t * K);
    model_project(m, &l->lat_down, x, n, b.z);
    /* Each expert runs once over the tokens that chose it; results land in ex[token][slot]. */
    experts_io io = {.x = b.z, .din = lat, .k = K, .out = b.ex, .dout = lat, .out_k = K};
    experts_run(k->experts, (int)(l - k->layers), b.idx, n * K, &io);
    for (int t = 0; t < n; t++)
        for (int c = 0; c < lat; c++) {
            float acc = 0.0f;
            for (int s = 0; s < K; s++) acc += b.weight[(size_t)t * K + s] * b.ex[((size_t)t * K + s) * lat + c];
            b.agg[(size_t)t * lat + c] = acc;
        }
    model_round(m, b.agg, (size_t)n * lat);
    model_norm_rows(m, b.agg, b.agg, l->lat_norm, n, lat, k->eps);
    model_project(m, &l->lat_up, b.agg, n, y);
    situ_glu(m, &l->gate, &l->up, &l->down, x, n, b.shared, sc);
    for (size_t i = 0; i < (size_t)n * k->dim; i++) y[i] += b.shared[i];
    model_round(m, y, (size_t)n * k->dim);
    arena_release(sc, mark);
}

void k3_ffn_forward(const model *m, const k3_layer *l, const float *x, int n, float *y, arena *sc) {
    if (l->sparse) latent_moe(m, l, x, n, y, sc);
    else situ_glu(m, &l->gate, &l->up, &l->down, x, n, y, sc);
}
