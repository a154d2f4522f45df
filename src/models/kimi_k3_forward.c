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
 * the mix is the probability-weighted sum of the raw vectors in candidate order.
 *
 * BATCHING. A pass holds up to K3_CHUNK rows taken from the call's segments in order (a batched
 * decode step: one row per conversation), so every weight — projections, experts, head — is read
 * once per pass for all of them; each sequence's recurrence and attention run on its own rows
 * (k3_run). Every row's arithmetic is the same as in a pass of its own, so a conversation's bits do
 * not depend on the others in the call or on where passes split. */
#include <math.h>
#include <string.h>

#include "../core/quant.h"
#include "../core/util.h"
#include "kimi_k3.h"

float *k3_floats(arena *a, size_t n) { return arena_take(a, n, sizeof(float)); }

/* Vectorized by the compiler with the same bits as its scalar remainder (ops.h's tanh_f32). */
void k3_situ(const k3_model *k, float *restrict g, const float *restrict u, size_t n) {
    float b1 = k->situ_beta, b2 = k->situ_linear_beta;
    for (size_t i = 0; i < n; i++) g[i] = b1 * tanh_f32(g[i] / b1) * sigmoid_f32(g[i]) * (b2 * tanh_f32(u[i] / b2));
}

/* What one chunk holds for its whole pass: the residual stream (the prefix and the block
 * snapshots, each [n][dim], in `slots`), the mixed layer input, norm output, sub-layer output and
 * one token's normalised candidate for the residual-mix scores. */
typedef struct {
    float *slots[K3_MAX_BLOCKS + 1];
    float *x, *hn, *delta, *normed;
} chunk_bufs;

static void chunk_layout(arena *a, const k3_model *k, int n, chunk_bufs *b) {
    size_t len = (size_t)n * k->dim;
    for (int i = 0; i <= k->n_blocks; i++) b->slots[i] = k3_floats(a, len);
    b->x = k3_floats(a, len);
    b->hn = k3_floats(a, len);
    b->delta = k3_floats(a, len);
    b->normed = k3_floats(a, (size_t)k->dim);
}

typedef struct {
    float *hn, *out;           /* [cnt][dim], [cnt][vocab] */
} head_bufs;

static void head_layout(arena *a, const k3_model *k, int cnt, head_bufs *b) {
    b->hn = k3_floats(a, (size_t)cnt * k->dim);
    b->out = k3_floats(a, (size_t)cnt * k->vocab);
}

size_t k3_scratch_bytes(const model *m, int ctx) {
    const k3_model *k = m->priv;
    int n = MIN(K3_CHUNK, ctx);
    arena a = {0};
    chunk_bufs cb;
    head_bufs hb;
    chunk_layout(&a, k, n, &cb);
    size_t held = a.used, body = 0;
    for (int li = 0; li < k->n_layers; li++) {
        const k3_layer *l = &k->layers[li];
        body = MAX(body, l->kda ? k3_kda_scratch(k, n) : k3_mla_scratch(k, l, n, ctx));
        body = MAX(body, k3_ffn_scratch(k, l, n));
    }
    head_layout(&a, k, n, &hb);
    return held + MAX(body, a.used - held);
}

/* The residual stream: block snapshots so far, then the running prefix, all in chunk slots. */
typedef struct {
    float *blocks[K3_MAX_BLOCKS];
    int nblocks;
    float *prefix;
    int have_prefix;        /* 0 right after a block boundary: the next sub-layer output starts it */
} k3_stream;

/* out[n][dim] = softmax-weighted mix of [blocks..., last] for every token. */
static void res_mix(const model *m, const k3_stream *rs, const float *last, const float *norm_w, const float *proj,
                    int n, float *normed, float *out) {
    const k3_model *k = m->priv;
    int d = k->dim, nc = rs->nblocks + 1;
    float score[K3_MAX_BLOCKS + 1];
    for (int t = 0; t < n; t++) {
        for (int e = 0; e < nc; e++) {
            const float *v = (e < rs->nblocks ? rs->blocks[e] : last) + (size_t)t * d;
            rmsnorm(normed, v, norm_w, d, k->eps);
            model_round(m, normed, (size_t)d);
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
    model_round(m, out, (size_t)n * d);
}

static void add_into(const model *m, k3_stream *rs, const float *delta, size_t len) {
    if (!rs->have_prefix) memcpy(rs->prefix, delta, len * sizeof *delta);
    else
        for (size_t i = 0; i < len; i++) rs->prefix[i] += delta[i];
    rs->have_prefix = 1;
    model_round(m, rs->prefix, len);
}

/* One decoder layer over the n rows of a pass; rs->prefix holds its input and receives its output. */
static void layer(const model *m, int li, const k3_run *runs, int nruns, k3_stream *rs, chunk_bufs *b, int n,
                  arena *sc) {
    const k3_model *k = m->priv;
    const k3_layer *l = &k->layers[li];
    size_t len = (size_t)n * k->dim;
    if (k->res_block && rs->nblocks) res_mix(m, rs, rs->prefix, l->res_attn_norm, l->res_attn_proj, n, b->normed, b->x);
    else memcpy(b->x, rs->prefix, len * sizeof *b->x);
    if (k->res_block && li % k->res_block == 0) {
        /* The layer input (before mixing) becomes a block; the prefix restarts at this attention output. */
        rs->blocks[rs->nblocks++] = rs->prefix;
        rs->prefix = b->slots[rs->nblocks];
        rs->have_prefix = 0;
    }
    model_norm_rows(m, b->hn, b->x, l->attn_norm, n, k->dim, k->eps);
    if (l->kda) k3_kda_forward(m, l, li, runs, nruns, b->hn, n, b->delta, sc);
    else k3_mla_forward(m, l, li, runs, nruns, b->hn, n, b->delta, sc);
    add_into(m, rs, b->delta, len);
    if (k->res_block) res_mix(m, rs, rs->prefix, l->res_mlp_norm, l->res_mlp_proj, n, b->normed, b->x);
    else memcpy(b->x, rs->prefix, len * sizeof *b->x);
    model_norm_rows(m, b->hn, b->x, l->ffn_norm, n, k->dim, k->eps);
    k3_ffn_forward(m, l, b->hn, n, b->delta, sc);
    add_into(m, rs, b->delta, len);
}

/* Does row t (token tok of segment g) want logits: every row of an all_logits segment, each
 * segment's last. */
static int wants_logits(const fwd_seg *g, int tok) { return g->all_logits || (g->logits && tok == g->n - 1); }

/* The logits of the rows that want them, through the head in one product. */
static void head_logits(const model *m, const k3_stream *rs, chunk_bufs *cb, const fwd_seg *const *seg,
                        const int *tok, int n, arena *sc) {
    const k3_model *k = m->priv;
    int cnt = 0, d = k->dim;
    for (int t = 0; t < n; t++) cnt += wants_logits(seg[t], tok[t]);
    if (!cnt) return;
    head_bufs b;
    head_layout(sc, k, cnt, &b);
    if (k->res_block) res_mix(m, rs, rs->prefix, k->out_res_norm, k->out_res_proj, n, cb->normed, cb->x);
    else memcpy(cb->x, rs->prefix, (size_t)n * d * sizeof *cb->x);
    for (int t = 0, i = 0; t < n; t++)
        if (wants_logits(seg[t], tok[t])) rmsnorm(b.hn + (size_t)i++ * d, cb->x + (size_t)t * d, k->final_norm, d, k->eps);
    model_round(m, b.hn, (size_t)cnt * d);
    qmat_mul(&k->head, b.hn, cnt, b.out);
    size_t v = (size_t)k->vocab;
    for (int t = 0, i = 0; t < n; t++) {
        const fwd_seg *g = seg[t];
        if (!wants_logits(g, tok[t])) continue;
        const float *row = b.out + (size_t)i++ * v;
        if (g->all_logits) memcpy(g->all_logits + (size_t)tok[t] * v, row, v * sizeof *row);
        if (g->logits && tok[t] == g->n - 1) memcpy(g->logits, row, v * sizeof *row);
    }
}

/* One pass of n rows, row t being token tok[t] of segment seg[t], in scratch sc; all of it is
 * given back at the end. */
static void forward_pass(const model *m, arena *sc, const fwd_seg *const *seg, const int *tok, int n) {
    const k3_model *k = m->priv;
    size_t start = arena_mark(sc);
    chunk_bufs b;
    chunk_layout(sc, k, n, &b);
    k3_run runs[K3_CHUNK];
    int nruns = 0;
    for (int t = 0; t < n; t++) {
        if (!nruns || seg[t] != seg[t - 1])
            runs[nruns++] = (k3_run){.s = seg[t]->fam_seq, .pos0 = seg[t]->pos0 + tok[t], .t0 = t, .n = 0};
        runs[nruns - 1].n++;
    }
    k3_stream rs = {.prefix = b.slots[0], .have_prefix = 1};
    for (int t = 0; t < n; t++) qmat_row(&k->embed, seg[t]->ids[tok[t]], rs.prefix + (size_t)t * k->dim);
    model_round(m, rs.prefix, (size_t)n * k->dim);
    for (int li = 0; li < k->n_layers; li++) layer(m, li, runs, nruns, &rs, &b, n, sc);
    head_logits(m, &rs, &b, seg, tok, n, sc);
    arena_release(sc, start);
}

/* The segments' tokens, concatenated, in passes of at most K3_CHUNK rows (which bound the
 * scratch) in the first segment's scratch: the call's sequences share one context size
 * (seq_feed_step), so that scratch fits every pass. By chunking invariance the split changes no
 * bit. seq_feed has checked the ids and positions and checks the logits. */
int k3_forward(model *m, const fwd_seg *segs, int nseg, char *err, size_t errlen) {
    k3_seq *first = segs[0].fam_seq;
    int rows = MIN(K3_CHUNK, first->cap), gi = 0, j = 0, tok[K3_CHUNK], n;
    const fwd_seg *seg[K3_CHUNK];
    while ((n = fwd_next_pass(segs, nseg, &gi, &j, rows, seg, tok))) forward_pass(m, first->scratch, seg, tok, n);
    return 0;
}
