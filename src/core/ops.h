/* ops.h — the small numeric building blocks of every forward pass.
 *
 * All functions work in f32 on one vector (or one row) at a time with a fixed reduction order,
 * so they are chunking-invariant by construction. None allocates.
 */
#ifndef CAIRN_OPS_H
#define CAIRN_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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
/* exp and tanh for elementwise loops the compiler vectorizes: branch-free, from +, *, fmaf and
 * bit moves only, so a loop's vector body and its scalar remainder (and a build without SIMD)
 * give the same bits for the same input, which libm's calls cannot be vectorized to promise.
 * y = n ln2 + r with |r| <= ln2/2 (n rounded to nearest even by the 1.5 * 2^23 trick, ln2 in
 * two parts so r is exact to well past f32); expm1(r) by its Taylor series to r^8 (remainder
 * below 2^-31 relative); then exp(y) = 2^n (1 + expm1(r)) and expm1(y) = 2^n expm1(r) + (2^n - 1),
 * the second exact in its small part when n = 0. y is clamped to [-87, 88], where 2^n is a
 * normal f32. Against double precision over [-12, 12]: exp within 1 ulp, sigmoid 2, tanh 2.5. */
static inline void exp_parts_f32(float y, float *pow2n, float *em1_r) {
    y = y < -87.0f ? -87.0f : y > 88.0f ? 88.0f : y;
    const float round = 12582912.0f;                      /* 1.5 * 2^23 */
    float n = (y * 1.44269504f + round) - round;
    float r = fmaf(n, -0.693145752f, y);                  /* ln2's top 16 bits */
    r = fmaf(n, -1.42860677e-6f, r);                      /* the rest */
    float q = fmaf(r, 2.48015873e-5f, 1.98412698e-4f);    /* 1/8!, 1/7! */
    q = fmaf(q, r, 1.38888889e-3f);
    q = fmaf(q, r, 8.33333333e-3f);
    q = fmaf(q, r, 4.16666667e-2f);
    q = fmaf(q, r, 1.66666667e-1f);
    q = fmaf(q, r, 0.5f);
    *em1_r = fmaf(q * r, r, r);
    int32_t bits = ((int32_t)n + 127) << 23;
    memcpy(pow2n, &bits, sizeof bits);
}

static inline float exp_f32(float y) {
    float s, q;
    exp_parts_f32(y, &s, &q);
    return fmaf(s, q, s);
}

static inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

/* tanh |x| = -e / (2 + e) with e = expm1(-2|x|), no cancellation for small |x|; |x| > 9 gives 1. */
static inline float tanh_f32(float x) {
    float a = x < 0 ? -x : x, s, q;
    exp_parts_f32(-2.0f * (a > 9.0f ? 9.0f : a), &s, &q);
    float e = fmaf(s, q, s - 1.0f);
    return copysignf(-e / (2.0f + e), x);
}

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
