/* deepseek_v4_forward.c — one forward call: embedding, the hc_mult residual streams with their
 * mHC mixing (spec §3), the block loop, and the HC head + final norm + head (spec §2).
 *
 * A call is cut into passes of at most DSV4_CHUNK rows, taken in order from its segments (one
 * sequence each); within a pass each layer runs its projections over all rows at once and its
 * stateful parts row by row, each in its own sequence (deepseek_v4.h). */
#include <math.h>
#include <string.h>

#include "../core/threads.h"
#include "../core/util.h"
#include "deepseek_v4.h"

/* Sum of squares in double: one fixed order, and accurate enough that the rsqrt does not
 * depend on how a reference happens to order its float sum. Eight running sums (element i in
 * sum i % 8, squares exact in double), added pairwise: one chain of 8192 dependent adds was a
 * serial 1 % of a decode step. */
float dsv4_rsqrt_mean_square(const float *x, int n, double eps) {
    double acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)x[i + j] * x[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += (double)x[i] * x[i];
    double ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    return (float)(1.0 / sqrt(ss / n + eps));
}

/* Split the 24 (=(2+hc)*hc) mixing logits of one token into pre / post / comb; comb is
 * made doubly stochastic by Sinkhorn (softmax rows, then alternate column and row division). */
static void hc_split(const dsv4_config *c, const dsv4_hc *p, const float *mix, float *pre, float *post, float *comb) {
    int hc = c->hc;
    float eps = (float)c->hc_eps;
    for (int i = 0; i < hc; i++) {
        pre[i] = sigmoid_f32(mix[i] * p->scale[0] + p->base[i]) + eps;
        post[i] = 2.0f * sigmoid_f32(mix[hc + i] * p->scale[1] + p->base[hc + i]);
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

/* x = sum_i pre_i * H_i over the streams of one token (FP32 sum, i ascending, then BF16). A
 * stream at a time over every column: the same sum per column, in loops that vectorize. */
static void hc_collapse(const dsv4_model *d, const float *restrict h, const float *pre, float *restrict x) {
    int dim = d->c.dim;
    for (int k = 0; k < dim; k++) x[k] = 0;
    for (int i = 0; i < d->c.hc; i++) {
        float p = pre[i];
        const float *restrict hi = h + (size_t)i * dim;
        for (int k = 0; k < dim; k++) x[k] += p * hi[k];
    }
    dsv4_bf16(d, x, dim);
}

/* One pool job of the per-token steps of a pass (token t is task t): hc_pre and hc_post do
 * no batched product there, only work of one token, so the pool splits them by token and no
 * result depends on which thread ran it. */
typedef struct {
    const dsv4_model *d;
    const dsv4_hc *p;
    const uint16_t *norm;
    dsv4_seq *s;
    int cols;                /* hc_post's columns per task */
} hc_job;

/* Token t of hc_pre: scale its mixing logits, split them, collapse the streams into x, norm. */
static void hc_pre_token(void *ctx, int t) {
    const hc_job *j = ctx;
    const dsv4_config *c = &j->d->c;
    dsv4_seq *s = j->s;
    int width = c->hc * c->dim, nmix = (2 + c->hc) * c->hc;
    const float *h = s->h + (size_t)t * width;
    float *mix = s->mix + (size_t)t * nmix, pre[DSV4_MAX_HC];
    float r = dsv4_rsqrt_mean_square(h, width, c->eps);
    for (int k = 0; k < nmix; k++) mix[k] *= r;
    hc_split(c, j->p, mix, pre, s->post + t * c->hc, s->comb + t * c->hc * c->hc);
    float *x = s->x + (size_t)t * c->dim;
    hc_collapse(j->d, h, pre, x);
    rmsnorm_bf16w(x, x, j->norm, c->dim, (float)c->eps);
    dsv4_bf16(j->d, x, c->dim);
}

/* hc_pre for n tokens: mixing logits batched, then per token the split and the collapse into
 * the sub-layer input x, which is normed with `norm`. post/comb are kept for hc_post. */
void dsv4_hc_pre(const dsv4_model *d, const dsv4_hc *p, const uint16_t *norm, dsv4_seq *s, int n) {
    qmat_mul(&p->fn, s->h, n, s->mix);
    hc_job j = {d, p, norm, s, 0};
    pool_run(n, hc_pre_token, &j);
}

/* Columns [k0, k1) of token t's hc_post: new stream j = post_j * f + sum_i comb[i][j] * R_i,
 * replacing the residual add. HC_POST_COLS columns at a time: the old streams' columns are copied
 * before any stream's are overwritten, and each output then sums in the same order (post * f,
 * then i ascending) in loops over columns, which vectorize. Every column is its own: any cut
 * into column ranges gives the same bits. */
#define HC_POST_COLS 64
#define HC_POST_SPLIT 256    /* columns per task when a lone token is cut (see hc_post) */

static void hc_post_cols(const hc_job *job, int t, int k0, int k1) {
    const dsv4_config *c = &job->d->c;
    dsv4_seq *s = job->s;
    int hc = c->hc, dim = c->dim;
    float *h = s->h + (size_t)t * hc * dim;
    const float *restrict f = s->f + (size_t)t * dim, *post = s->post + t * hc, *comb = s->comb + t * hc * hc;
    for (int b0 = k0; b0 < k1; b0 += HC_POST_COLS) {
        int kn = MIN(HC_POST_COLS, k1 - b0);
        float old[DSV4_MAX_HC][HC_POST_COLS];
        for (int i = 0; i < hc; i++) memcpy(old[i], h + (size_t)i * dim + b0, sizeof(float) * kn);
        for (int j = 0; j < hc; j++) {
            float *restrict out = h + (size_t)j * dim + b0, pj = post[j];
            for (int k = 0; k < kn; k++) out[k] = pj * f[b0 + k];
            for (int i = 0; i < hc; i++) {
                float cij = comb[i * hc + j];
                for (int k = 0; k < kn; k++) out[k] += cij * old[i][k];
            }
        }
    }
    for (int j = 0; j < hc; j++) dsv4_bf16(job->d, h + (size_t)j * dim + k0, (size_t)(k1 - k0));
}

/* Task i: columns [k0, k0 + cols) of token i / blocks, k0 = (i % blocks) * cols. */
static void hc_post_task(void *ctx, int i) {
    const hc_job *job = ctx;
    int dim = job->d->c.dim, blocks = (dim + job->cols - 1) / job->cols, k0 = i % blocks * job->cols;
    hc_post_cols(job, i / blocks, k0, MIN(dim, k0 + job->cols));
}

/* A token per task when every thread has one; fewer tokens than threads (a decode step) are cut
 * into HC_POST_SPLIT-column blocks, so the threads share them instead of waiting for the caller. */
static void hc_post(const dsv4_model *d, dsv4_seq *s, int n) {
    int dim = d->c.dim, cols = n < pool_threads() ? MIN(dim, HC_POST_SPLIT) : dim;
    hc_job j = {d, NULL, NULL, s, cols};
    pool_run(n * ((dim + cols - 1) / cols), hc_post_task, &j);
}

void dsv4_block(const dsv4_model *d, const dsv4_layer *L, int li, dsv4_seq *s, int n) {
    dsv4_hc_pre(d, &L->hc_attn, L->attn_norm, s, n);
    dsv4_attention(d, L, li, s, n, s->f);
    hc_post(d, s, n);
    dsv4_hc_pre(d, &L->hc_ffn, L->ffn_norm, s, n);
    dsv4_moe(d, L, s, n, s->x, s->f);
    hc_post(d, s, n);
}

/* Final hidden state of pass row t into y[dim]: HC head collapse (no Sinkhorn) with the row's
 * hc_head->fn product `mix`, final norm (the model's, or an MTP block's own hc_head and norm). */
void dsv4_head_state(const dsv4_model *d, const dsv4_hc *hc_head, const uint16_t *norm, const dsv4_seq *s, int t,
                     const float *mix, float *y) {
    const dsv4_config *c = &d->c;
    int width = c->hc * c->dim;
    const float *h = s->h + (size_t)t * width;
    float pre[DSV4_MAX_HC];
    float r = dsv4_rsqrt_mean_square(h, width, c->eps);
    for (int i = 0; i < c->hc; i++)
        pre[i] = sigmoid_f32(mix[i] * r * hc_head->scale[0] + hc_head->base[i]) + (float)c->hc_eps;
    hc_collapse(d, h, pre, y);
    rmsnorm_bf16w(y, y, norm, c->dim, (float)c->eps);
    dsv4_bf16(d, y, c->dim);
}

/* The pass's n rows (s->row_id, row_pos, row_seq set) through every block. */
static void forward_pass(const dsv4_model *d, dsv4_seq *s, int n) {
    const dsv4_config *c = &d->c;
    for (int t = 0; t < n; t++) {
        float *h = s->h + (size_t)t * c->hc * c->dim;
        qmat_row(&d->embed, s->row_id[t], h);
        for (int i = 1; i < c->hc; i++) memcpy(h + (size_t)i * c->dim, h, sizeof(float) * c->dim);
    }
    for (int l = 0; l < c->n_layers; l++) dsv4_block(d, &d->layers[l], l, s, n);
}

/* Logits of a finished pass whose row t is token j[t] of segment g[t]: the HC head mix of every
 * row in one product, then the final states of the rows that need logits go into s->x (free once
 * the pass is done) and through the FP32 head DSV4_HEAD_ROWS at a time, so a batched decode step
 * reads hc_head and the head once for all its sequences. */
static void pass_logits(const dsv4_model *d, dsv4_seq *s, const fwd_seg *const *g, const int *j, int n) {
    int vocab = d->c.vocab, k = 0, row_tok[DSV4_CHUNK];
    const fwd_seg *row_seg[DSV4_CHUNK];
    float mix[DSV4_CHUNK * DSV4_MAX_HC];
    qmat_mul(&d->hc_head.fn, s->h, n, mix);
    for (int t = 0; t < n; t++)
        if (g[t]->all_logits || (g[t]->logits && j[t] == g[t]->n - 1)) {
            dsv4_head_state(d, &d->hc_head, d->norm, s, t, mix + (size_t)t * d->c.hc, s->x + (size_t)k * d->c.dim);
            row_seg[k] = g[t];
            row_tok[k++] = j[t];
        }
    for (int r0 = 0; r0 < k; r0 += DSV4_HEAD_ROWS) {
        int rows = MIN(DSV4_HEAD_ROWS, k - r0);
        qmat_mul(&d->head, s->x + (size_t)r0 * d->c.dim, rows, s->head_out);
        for (int r = r0; r < r0 + rows; r++) {
            const fwd_seg *seg = row_seg[r];
            const float *row = s->head_out + (size_t)(r - r0) * vocab;
            if (seg->all_logits) memcpy(seg->all_logits + (size_t)row_tok[r] * vocab, row, sizeof(float) * vocab);
            if (seg->logits && row_tok[r] == seg->n - 1) memcpy(seg->logits, row, sizeof(float) * vocab);
        }
    }
}

/* The segments' tokens, concatenated, run in passes of at most DSV4_CHUNK rows in the first
 * segment's scratch; a pass may hold rows of several sequences. */
int dsv4_forward(model *m, const fwd_seg *segs, int nseg, char *err, size_t errlen) {
    const dsv4_model *d = m->priv;
    dsv4_seq *s = segs[0].fam_seq;
    const fwd_seg *row_seg[DSV4_CHUNK];
    int row_tok[DSV4_CHUNK], gi = 0, j = 0, n;  /* next token to place: token j of segment gi */
    while ((n = fwd_next_pass(segs, nseg, &gi, &j, DSV4_CHUNK, row_seg, row_tok))) {
        for (int t = 0; t < n; t++) {
            s->row_id[t] = row_seg[t]->ids[row_tok[t]];
            s->row_pos[t] = row_seg[t]->pos0 + row_tok[t];
            s->row_seq[t] = row_seg[t]->fam_seq;
        }
        forward_pass(d, s, n);
        pass_logits(d, s, row_seg, row_tok, n);
        dsv4_mtp_rows(d, s, n);      /* last: it reuses the pass's buffers */
    }
    return 0;
}
