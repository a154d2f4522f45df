/* mla.h — absorbed multi-head latent attention over cached latent rows, shared by the MLA
 * families (GLM-5, Kimi K3).
 *
 * kv_b_proj is [heads * (nope + v_dim)][kv_lora]: per head, W_uk (nope rows) then W_uv (v_dim
 * rows). The absorbed form needs W_uk^T (q_abs = W_uk^T q_nope) and W_uv (out = W_uv latent).
 * W_uv is read where the checkpoint has it (rows of kv_b). W_uk^T is a transposed copy made once
 * at load (mla_absorb), so no forward call dequantizes kv_b: it is BF16 when every dequantized
 * value is exact in BF16 (BF16 checkpoints; FP8 with power-of-two scales), else F32.
 * MEMORY BUDGET: heads * kv_lora * nope * 2 bytes (BF16; 4 for F32) per MLA layer, shared by
 * every sequence — GLM-5 at full size (64 heads, nope 192, kv_lora 512): 12.6 MB per layer,
 * 0.98 GB over its 78 layers. In exchange a sequence's scratch no longer holds all of kv_b
 * dequantized to f32 (58.7 MB at that size), only a pass's per-head vectors (mla_pass).
 *
 * A PASS over n rows runs in three steps, so the two kv_b products are batched kernel calls that
 * read each head's matrix once for all n rows (prefill chunks, batched decode, speculative
 * verification) instead of once per row:
 *   mla_queries  q_abs[h][i] = W_uk^T q_nope of row i, for every head (one qmat_mul per head);
 *   mla_attend_heads, per row for a range of heads: score_t = [q_abs | q_rope] . [latent_t |
 *                rope_t] * scale over the row's attended rows (one kernel call for all the heads,
 *                which read the same rows), softmax in position order, and the softmax-weighted
 *                latent (weighted_rows, ops.h);
 *   mla_values   out[i][h] = W_uv latent[h][i] (one qmat_mul per head).
 * Every product is a canonical kernel call (kernels.h), whose rows are bit-identical whatever
 * the batch (chunking invariance), and the latent sum runs elementwise in row order, so a row's
 * result depends only on its inputs: the same on every SIMD path, any batch split and any thread
 * count. The copies are attention views (QM_SCRATCH): kernels_streamed does not count them, as
 * it never counted kv_b. */
#ifndef CAIRN_MLA_H
#define CAIRN_MLA_H

#include "../core/arena.h"
#include "../core/kernels.h"

typedef struct {
    int heads, nope, v_dim, kv_lora;
    qmat uk_t;      /* [heads * kv_lora][nope]: W_uk^T of every head, owned (data malloc'ed) */
    qmat uv;        /* kv_b itself, viewed as QM_SCRATCH; head h's W_uv is its rows h*(nope+v)+nope.. */
} mla_absorbed;

/* Builds a's copy from kv_b. 0, or -1 with err set (kv_b of the wrong shape). */
int mla_absorb(mla_absorbed *a, const qmat *kv_b, int heads, int nope, int v_dim, int kv_lora, char *err,
               size_t errlen);
void mla_absorbed_free(mla_absorbed *a);

/* The per-pass buffers, per head, for n rows. */
typedef struct {
    const mla_absorbed *a;
    int n;
    float *q_abs;   /* [heads][n][kv_lora] */
    float *lat;     /* [heads][n][kv_lora]: the softmax-weighted latents */
    float *staged;  /* [heads][n][max(nope, v_dim)]: q_nope gathered per head, then W_uv's outputs */
} mla_pass;

/* Takes p's buffers from the arena (a measuring arena only counts them). */
void mla_pass_layout(arena *sc, const mla_absorbed *a, int n, mla_pass *p);
/* Heads per pool index where a row's heads run in parallel (decode): the weighted sum's block
 * of heads (ops.c), so each index reads the attended rows once for that many heads. */
#define MLA_HEADS_PER_TASK 4
static inline int mla_head_tasks(int heads) { return (heads + MLA_HEADS_PER_TASK - 1) / MLA_HEADS_PER_TASK; }

/* Floats of work mla_attend_heads needs per head for `cnt` attended rows of kv_lora + rope floats. */
size_t mla_work_floats(int kv_lora, int rope, int cnt);

/* q: [n][heads][nope + rope]. Fills p->q_abs (heads in parallel). */
void mla_queries(mla_pass *p, const float *q, int rope);
/* Row i, heads [h0, h1): q_rope is head h0's rope part of the query (head h's q_stride floats
 * on), rows [cnt][kv_lora + rope] the attended latent + rope rows, work (h1 - h0) times
 * mla_work_floats. Fills p->lat[h][i]. The scores of every head come from one kernel call, the
 * bits of one call per head (chunking invariance). Runs on the calling thread (a pool task). */
void mla_attend_heads(mla_pass *p, int h0, int h1, int i, int rope, const float *q_rope, size_t q_stride,
                      const float *rows, int cnt, float scale, float *work);
/* out: [n][heads * v_dim] = W_uv of every row's latents (heads in parallel). */
void mla_values(mla_pass *p, float *out);

#endif
