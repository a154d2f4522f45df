/* mla.h — one head of absorbed multi-head latent attention over cached latent rows, shared by
 * the MLA families (GLM-5, Kimi K3).
 *
 * kv_b_proj is [heads * (nope + v_dim)][kv_lora]: per head, W_uk (nope rows) then W_uv (v_dim
 * rows). The absorbed form needs W_uk^T (q_abs = W_uk^T q_nope) and W_uv (out = W_uv latent).
 * W_uv is read where the checkpoint has it (rows of kv_b). W_uk^T is a transposed copy made once
 * at load (mla_absorb), so no forward call dequantizes kv_b: it is BF16 when every dequantized
 * value is exact in BF16 (BF16 checkpoints; FP8 with power-of-two scales), else F32.
 * MEMORY BUDGET: heads * kv_lora * nope * 2 (or 4) bytes per MLA layer, i.e. at most half (BF16)
 * or all (F32) of kv_b's own f32 size — GLM-5 at full size (64 heads, nope 192, kv_lora 512):
 * 12.6 MB per layer, 0.98 GB over its 78 layers, shared by every sequence (the per-sequence
 * scratch no longer holds a dequantized kv_b: 58.7 MB less per layer pass).
 *
 * Every product is a canonical kernel call (kernels.h) and the latent sum runs elementwise in
 * row order (weighted_rows, ops.h), so a head's result depends only on its inputs: the same on
 * every SIMD path, any batch split and any thread count. The copies are attention views
 * (QM_SCRATCH): kernels_streamed does not count them, as it never counted kv_b. */
#ifndef CAIRN_MLA_H
#define CAIRN_MLA_H

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
size_t mla_absorbed_bytes(const mla_absorbed *a);   /* the copy's bytes (the memory budget above) */

/* Floats of work one head needs for `cnt` attended rows of kv_lora + rope floats. */
size_t mla_work_floats(int kv_lora, int rope, int cnt);

/* out[v_dim] = head h's attention of q_h [nope | rope] over rows [cnt][kv_lora + rope] (latent,
 * then rope key), scores scaled by `scale` and softmaxed in position order. */
void mla_attend_head(const mla_absorbed *a, int h, int rope, const float *q_h, const float *rows, int cnt,
                     float scale, float *work, float *out);

#endif
