/* deepseek_v4_forward.c — one forward call: embedding, the hc_mult residual streams with their
 * mHC mixing (spec §3), the block loop, and the HC head + final norm + head (spec §2).
 *
 * A call is cut into passes of at most DSV4_CHUNK tokens; within a pass each layer runs its
 * projections over all tokens at once and its stateful parts token by token (deepseek_v4.h). */
#include <math.h>
#include <string.h>

#include "../core/util.h"
#include "deepseek_v4.h"

/* Sum of squares in double: one fixed order, and accurate enough that the rsqrt does not
 * depend on how a reference happens to order its float sum. */
static float rsqrt_mean_square(const float *x, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(ss / n + eps));
}

/* Split the 24 (=(2+hc)*hc) mixing logits of one token into pre / post / comb; comb is
 * made doubly stochastic by Sinkhorn (softmax rows, then alternate column and row division). */
static void hc_split(const dsv4_config *c, const dsv4_hc *p, const float *mix, float *pre, float *post, float *comb) {
    int hc = c->hc;
    float eps = (float)c->hc_eps;
    for (int i = 0; i < hc; i++) {
        pre[i] = sigmoidf(mix[i] * p->scale[0] + p->base[i]) + eps;
        post[i] = 2.0f * sigmoidf(mix[hc + i] * p->scale[1] + p->base[hc + i]);
    }
    for (int i = 0; i < hc; i++) {
        float *row = comb + i * hc;
        for (int j = 0; j < hc; j++) row[j] = mix[2 * hc + i * hc + j] * p->scale[2] + p->base[2 * hc + i * hc + j];
        softmax(row, hc);
        for (int j = 0; j < hc; j++) row[j] += eps;
    }
    for (int it = 0; it < c->hc_iters; it++) {
        if (it > 0)
            for (int i = 0; i < hc; i++) {
                float sum = 0;
                for (int j = 0; j < hc; j++) sum += comb[i * hc + j];
                for (int j = 0; j < hc; j++) comb[i * hc + j] /= sum + eps;
            }
        for (int j = 0; j < hc; j++) {
            float sum = 0;
            for (int i = 0; i < hc; i++) sum += comb[i * hc + j];
            for (int i = 0; i < hc; i++) comb[i * hc + j] /= sum + eps;
        }
    }
}

/* x = sum_i pre_i * H_i over the streams of one token (FP32 sum, then BF16). */
static void hc_collapse(const dsv4_model *d, const float *h, const float *pre, float *x) {
    int dim = d->c.dim;
    for (int k = 0; k < dim; k++) {
        float acc = 0;
        for (int i = 0; i < d->c.hc; i++) acc += pre[i] * h[i * dim + k];
        x[k] = acc;
    }
    dsv4_bf16(d, x, dim);
}

/* hc_pre for n tokens: mixing logits batched, then per token the split and the collapse into
 * the sub-layer input x, which is normed with `norm`. post/comb are kept for hc_post. */
static void hc_pre(const dsv4_model *d, const dsv4_hc *p, const uint16_t *norm, dsv4_seq *s, int n) {
    const dsv4_config *c = &d->c;
    int width = c->hc * c->dim, nmix = (2 + c->hc) * c->hc;
    qmat_mul(&p->fn, s->h, n, s->mix);
    for (int t = 0; t < n; t++) {
        const float *h = s->h + (size_t)t * width;
        float *mix = s->mix + (size_t)t * nmix, pre[DSV4_MAX_HC];
        float r = rsqrt_mean_square(h, width, c->eps);
        for (int k = 0; k < nmix; k++) mix[k] *= r;
        hc_split(c, p, mix, pre, s->post + t * c->hc, s->comb + t * c->hc * c->hc);
        float *x = s->x + (size_t)t * c->dim;
        hc_collapse(d, h, pre, x);
        rmsnorm_bf16w(x, x, norm, c->dim, (float)c->eps);
        dsv4_bf16(d, x, c->dim);
    }
}

/* New stream j = post_j * f + sum_i comb[i][j] * R_i; replaces the residual add. */
static void hc_post(const dsv4_model *d, dsv4_seq *s, int n) {
    const dsv4_config *c = &d->c;
    int hc = c->hc, dim = c->dim;
    for (int t = 0; t < n; t++) {
        float *h = s->h + (size_t)t * hc * dim;
        const float *f = s->f + (size_t)t * dim, *post = s->post + t * hc, *comb = s->comb + t * hc * hc;
        memcpy(s->tmp_hc, h, sizeof(float) * hc * dim);
        for (int j = 0; j < hc; j++)
            for (int k = 0; k < dim; k++) {
                float acc = post[j] * f[k];
                for (int i = 0; i < hc; i++) acc += comb[i * hc + j] * s->tmp_hc[i * dim + k];
                h[j * dim + k] = acc;
            }
        dsv4_bf16(d, h, (size_t)hc * dim);
    }
}

static void run_block(const dsv4_model *d, const dsv4_layer *L, dsv4_layer_state *ls, dsv4_seq *s, const int *ids,
                      int pos0, int n) {
    hc_pre(d, &L->hc_attn, L->attn_norm, s, n);
    dsv4_attention(d, L, ls, s, pos0, n, s->f);
    hc_post(d, s, n);
    hc_pre(d, &L->hc_ffn, L->ffn_norm, s, n);
    dsv4_moe(d, L, s, ids, n, s->x, s->f);
    hc_post(d, s, n);
}

/* Logits of pass token t: HC head collapse (no Sinkhorn), final norm, FP32 head. */
static void head_logits(const dsv4_model *d, dsv4_seq *s, int t, float *logits) {
    const dsv4_config *c = &d->c;
    int width = c->hc * c->dim;
    const float *h = s->h + (size_t)t * width;
    float mix[DSV4_MAX_HC], pre[DSV4_MAX_HC];
    qmat_vec(&d->hc_head.fn, h, mix);
    float r = rsqrt_mean_square(h, width, c->eps);
    for (int i = 0; i < c->hc; i++)
        pre[i] = sigmoidf(mix[i] * r * d->hc_head.scale[0] + d->hc_head.base[i]) + (float)c->hc_eps;
    float *y = s->x;
    hc_collapse(d, h, pre, y);
    rmsnorm_bf16w(y, y, d->norm, c->dim, (float)c->eps);
    dsv4_bf16(d, y, c->dim);
    qmat_vec(&d->head, y, logits);
}

static void forward_pass(const dsv4_model *d, dsv4_seq *s, const int *ids, int pos0, int n) {
    const dsv4_config *c = &d->c;
    for (int t = 0; t < n; t++) {
        float *h = s->h + (size_t)t * c->hc * c->dim;
        qmat_row(&d->embed, ids[t], h);
        for (int i = 1; i < c->hc; i++) memcpy(h + (size_t)i * c->dim, h, sizeof(float) * c->dim);
    }
    for (int l = 0; l < c->n_layers; l++) run_block(d, &d->layers[l], &s->ls[l], s, ids, pos0, n);
}

int dsv4_forward(model *m, void *fam_seq, const int *ids, int pos0, int n, float *logits, float *all_logits,
                 char *err, size_t errlen) {
    const dsv4_model *d = m->priv;
    dsv4_seq *s = fam_seq;
    for (int done = 0; done < n;) {
        int k = MIN(DSV4_CHUNK, n - done);
        forward_pass(d, s, ids + done, pos0 + done, k);
        for (int t = 0; all_logits && t < k; t++) head_logits(d, s, t, all_logits + (size_t)(done + t) * d->c.vocab);
        done += k;
        if (logits && done == n) {
            if (all_logits) memcpy(logits, all_logits + (size_t)(n - 1) * d->c.vocab, sizeof(float) * d->c.vocab);
            else head_logits(d, s, k - 1, logits);
        }
    }
    return 0;
}
