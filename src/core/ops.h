/* ops.h — the small numeric building blocks of every forward pass.
 *
 * All functions work in f32 on one vector (or one row) at a time with a fixed reduction order,
 * so they are chunking-invariant by construction. None allocates.
 */
#ifndef CAIRN_OPS_H
#define CAIRN_OPS_H

#include <stddef.h>
#include <stdint.h>

/* out = x * rsqrt(mean(x^2) + eps) * w; w may be NULL (unweighted). w as f32. out may alias x. */
void rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* Same with BF16 weights as stored in the checkpoint. */
void rmsnorm_bf16w(float *out, const float *x, const uint16_t *w, int n, float eps);
/* LayerNorm with weight and bias (GLM indexer k_norm). */
void layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps);

/* RoPE tables: inv_freq[k] for k < dim/2, optionally YaRN-scaled (deepseek_v4.md §4.3). */
typedef struct {
    int dim;                 /* rotated dims */
    float inv_freq[256];
} rope_table;
void rope_init(rope_table *t, int dim, double base);
/* YaRN with factor, original_max_position_embeddings, beta_fast, beta_slow (no mscale). */
void rope_init_yarn(rope_table *t, int dim, double base, double factor, double orig_max, double beta_fast,
                    double beta_slow);
/* Rotate interleaved pairs (x[2k], x[2k+1]) by angle pos*inv_freq[k]; inverse=1 rotates by -angle. */
void rope_apply_interleaved(const rope_table *t, float *x, int pos, int inverse);
/* NeoX split-half pairs (x[k], x[k+dim/2]). */
void rope_apply_half(const rope_table *t, float *x, int pos, int inverse);

void softmax(float *x, int n);                     /* in place, max-subtracted */
float silu(float x);
float softplus(float x);
float sigmoidf(float x);
/* Indices of the k largest values of x[n], descending; ties go to the lower index. */
void topk(const float *x, int n, int k, int *idx);
/* In-place normalized fast Walsh-Hadamard transform (n a power of two, scaled by 1/sqrt(n)). */
void hadamard(float *x, int n);
/* Dot product with a fixed order (for attention scores). */
float dot_f32(const float *a, const float *b, int n);
/* For each head h < heads: out[h * out_stride + c] = sum_k w[h * count + k] * rows[k * stride + c]
 * for c < width, k ascending, one fmaf per term from +0 (attention's weighted sums of the value
 * rows every head reads). Each output is its own chain, so the compiler's vector code and the
 * scalar code of a build without SIMD give the same bits, however many heads share a call. */
void weighted_rows(float *restrict out, size_t out_stride, const float *restrict w, int heads,
                   const float *restrict rows, int count, size_t stride, int width);

#endif
