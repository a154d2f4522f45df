/* kimi_k3_forward.c — the Kimi K3 forward pass over a chunk of tokens: attention residuals, the layer
 * loop and the head (invariants in kimi_k3.h).
 *
 * NUMERICS. --numerics exact keeps every activation in f32. The default rounds activations to BF16
 * where the official bf16 inference holds bf16 tensors: the embedding, the residual stream (prefix
 * and block snapshots) and each mix, norm outputs, the outputs of every projection, the short-conv
 * outputs, the KDA / attention outputs and the expert outputs. The KDA state, decays and beta, the
 * router, attention scores and softmax, the residual-mix scores and the logits stay f32 (HF and
 * flash-linear-attention compute them in f32). Rounding is per element, so it keeps chunking
 * invariance.
 *
 * ATTENTION RESIDUALS (per token, so any chunking gives the same bits): the candidates are the block
 * snapshots taken so far plus the running prefix; score_e = proj . RMSNorm(v_e), softmax over e, and
 * the mix is the probability-weighted sum of the raw vectors in candidate order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/quant.h"
#include "../core/util.h"
#include "kimi_k3.h"

float *k3_floats(k3_scratch *s, size_t n) {
    float *p = xcalloc(n ? n : 1, sizeof(float));
    s->ptr[s->n++] = p;
    return p;
}

void k3_scratch_free(k3_scratch *s) {
    for (int i = 0; i < s->n; i++) free(s->ptr[i]);
    s->n = 0;
}

void k3_round(const model *m, float *x, size_t n) {
    if (m->num == NUMERICS_QAT) bf16_round_vec(x, n);
}

void k3_project(const model *m, const qmat *w, const float *x, int n, float *y) {
    qmat_mul(w, x, n, y);
    k3_round(m, y, (size_t)n * w->rows);
}

void k3_rmsnorm_rows(const model *m, float *out, const float *x, const float *w, int n, int dim, float eps) {
    for (int i = 0; i < n; i++) rmsnorm(out + (size_t)i * dim, x + (size_t)i * dim, w, dim, eps);
    k3_round(m, out, (size_t)n * dim);
}

void k3_situ(const k3_model *k, float *g, const float *u, size_t n) {
    float b1 = k->situ_beta, b2 = k->situ_linear_beta;
    for (size_t i = 0; i < n; i++) g[i] = b1 * tanhf(g[i] / b1) * sigmoidf(g[i]) * (b2 * tanhf(u[i] / b2));
}

/* The residual stream of one forward call: block snapshots [nblocks][n][dim] and the prefix. */
typedef struct {
    float *blocks[K3_MAX_BLOCKS];
    int nblocks;
    float *prefix;
    int have_prefix;        /* 0 right after a block boundary: the next sub-layer output starts it */
} k3_stream;

/* out[n][dim] = softmax-weighted mix of [blocks..., cand_last] for every token. */
static void res_mix(const model *m, const k3_stream *rs, const float *last, const float *norm_w, const float *proj,
                    int n, float *out) {
    const k3_model *k = m->priv;
    int d = k->dim, nc = rs->nblocks + 1;
    float *normed = xmalloc((size_t)d * sizeof *normed), score[K3_MAX_BLOCKS + 1];
    for (int t = 0; t < n; t++) {
        for (int e = 0; e < nc; e++) {
            const float *v = (e < rs->nblocks ? rs->blocks[e] : last) + (size_t)t * d;
            rmsnorm(normed, v, norm_w, d, k->eps);
            k3_round(m, normed, (size_t)d);
            score[e] = dot_f32(normed, proj, d);
        }
        softmax(score, nc);
        float *o = out + (size_t)t * d;
        memset(o, 0, (size_t)d * sizeof *o);
        for (int e = 0; e < nc; e++) {
            const float *v = (e < rs->nblocks ? rs->blocks[e] : last) + (size_t)t * d;
            for (int c = 0; c < d; c++) o[c] += score[e] * v[c];
        }
    }
    free(normed);
    k3_round(m, out, (size_t)n * d);
}

static void add_into(const model *m, k3_stream *rs, const float *delta, size_t len) {
    if (!rs->have_prefix) memcpy(rs->prefix, delta, len * sizeof *delta);
    else
        for (size_t i = 0; i < len; i++) rs->prefix[i] += delta[i];
    rs->have_prefix = 1;
    k3_round(m, rs->prefix, len);
}

/* One decoder layer over n tokens; rs->prefix holds its input and receives its output. */
static void layer(const model *m, int li, k3_seq *s, k3_stream *rs, int pos0, int n, float *x, float *hn,
                  float *delta) {
    const k3_model *k = m->priv;
    const k3_layer *l = &k->layers[li];
    size_t len = (size_t)n * k->dim;
    k3_scratch sc = {0};
    if (k->res_block && rs->nblocks) res_mix(m, rs, rs->prefix, l->res_attn_norm, l->res_attn_proj, n, x);
    else memcpy(x, rs->prefix, len * sizeof *x);
    if (k->res_block && li % k->res_block == 0) {
        /* The layer input (before mixing) becomes a block; the prefix restarts at this attention output. */
        rs->blocks[rs->nblocks++] = rs->prefix;
        rs->prefix = xmalloc(len * sizeof *rs->prefix);
        rs->have_prefix = 0;
    }
    k3_rmsnorm_rows(m, hn, x, l->attn_norm, n, k->dim, k->eps);
    if (l->kda) k3_kda_forward(m, l, li, s, hn, pos0, n, delta, &sc);
    else k3_mla_forward(m, l, li, s, hn, pos0, n, delta, &sc);
    add_into(m, rs, delta, len);
    if (k->res_block) res_mix(m, rs, rs->prefix, l->res_mlp_norm, l->res_mlp_proj, n, x);
    else memcpy(x, rs->prefix, len * sizeof *x);
    k3_rmsnorm_rows(m, hn, x, l->ffn_norm, n, k->dim, k->eps);
    k3_ffn_forward(m, l, hn, n, delta, &sc);
    add_into(m, rs, delta, len);
    k3_scratch_free(&sc);
}

static int check_input(const k3_model *k, const k3_seq *s, const int *ids, int pos0, int n, char *err, size_t errlen) {
    if (n < 1) return errf(err, errlen, "forward: no tokens");
    if (pos0 < 0 || pos0 + n > s->cap)
        return errf(err, errlen, "forward: positions %d..%d exceed the context of %d", pos0, pos0 + n - 1, s->cap);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= k->vocab)
            return errf(err, errlen, "token id %d at position %d is outside the vocabulary (%d)", ids[i], pos0 + i,
                        k->vocab);
    return 0;
}

static int head_logits(const model *m, const k3_stream *rs, int n, float *logits, float *all_logits, char *err,
                       size_t errlen) {
    const k3_model *k = m->priv;
    int first = all_logits ? 0 : n - 1, cnt = n - first, d = k->dim;
    k3_scratch sc = {0};
    float *x = k3_floats(&sc, (size_t)n * d), *hn = k3_floats(&sc, (size_t)cnt * d);
    float *out = k3_floats(&sc, (size_t)cnt * k->vocab);
    if (k->res_block) res_mix(m, rs, rs->prefix, k->out_res_norm, k->out_res_proj, n, x);
    else memcpy(x, rs->prefix, (size_t)n * d * sizeof *x);
    k3_rmsnorm_rows(m, hn, x + (size_t)first * d, k->final_norm, cnt, d, k->eps);
    qmat_mul(&k->head, hn, cnt, out);
    int rc = 0;
    for (size_t i = 0; i < (size_t)cnt * k->vocab && !rc; i++)
        if (!isfinite(out[i])) rc = errf(err, errlen, "non-finite logit at token %zu of the chunk", first + i / k->vocab);
    if (!rc && all_logits) memcpy(all_logits, out, (size_t)n * k->vocab * sizeof *out);
    if (!rc && logits) memcpy(logits, out + (size_t)(cnt - 1) * k->vocab, (size_t)k->vocab * sizeof *out);
    k3_scratch_free(&sc);
    return rc;
}

int k3_forward(model *m, void *fam_seq, const int *ids, int pos0, int n, float *logits, float *all_logits,
               char *err, size_t errlen) {
    const k3_model *k = m->priv;
    k3_seq *s = fam_seq;
    if (check_input(k, s, ids, pos0, n, err, errlen)) return -1;
    size_t len = (size_t)n * k->dim;
    k3_stream rs = {.prefix = xmalloc(len * sizeof(float)), .have_prefix = 1};
    float *x = xmalloc(len * sizeof *x), *hn = xmalloc(len * sizeof *hn), *delta = xmalloc(len * sizeof *delta);
    for (int i = 0; i < n; i++) qmat_row(&k->embed, ids[i], rs.prefix + (size_t)i * k->dim);
    k3_round(m, rs.prefix, len);
    for (int li = 0; li < k->n_layers; li++) layer(m, li, s, &rs, pos0, n, x, hn, delta);
    int rc = logits || all_logits ? head_logits(m, &rs, n, logits, all_logits, err, errlen) : 0;
    for (int b = 0; b < rs.nblocks; b++) free(rs.blocks[b]);
    free(rs.prefix);
    free(x);
    free(hn);
    free(delta);
    return rc;
}
