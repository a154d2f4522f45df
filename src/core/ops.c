/* ops.c — norms, RoPE, activations, top-k, Hadamard (see ops.h).
 *
 * Every reduction here runs left to right in f32 (dot_f32 in the kernels' 16-lane order), and
 * none depends on SIMD width or on the caller's chunking, so results are the same in every build. */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels.h"
#include "quant.h"

static float mean_square(const float *x, int n) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    return ss / (float)n;
}

void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float inv = 1.0f / sqrtf(mean_square(x, n) + eps);
    for (int i = 0; i < n; i++) out[i] = w ? x[i] * inv * w[i] : x[i] * inv;
}

void rmsnorm_bf16w(float *out, const float *x, const uint16_t *w, int n, float eps) {
    float inv = 1.0f / sqrtf(mean_square(x, n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * bf16_to_f32(w[i]);
}

void layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps) {
    float mean = 0.0f;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    float var = 0.0f;
    for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    float inv = 1.0f / sqrtf(var / (float)n + eps);
    for (int i = 0; i < n; i++) {
        float v = (x[i] - mean) * inv;
        out[i] = (w ? v * w[i] : v) + (b ? b[i] : 0.0f);
    }
}

void rope_init(rope_table *t, int dim, double base) {
    if (dim > 512) {                     /* inv_freq holds 256 pairs */
        fprintf(stderr, "cairn: RoPE over %d dims is more than the 512 supported; rotating the first 512\n", dim);
        dim = 512;
    }
    t->dim = dim;
    for (int k = 0; k < dim / 2; k++) t->inv_freq[k] = (float)pow(base, -2.0 * k / dim);
}

/* Rotary pair index at which a wavelength makes `rotations` full turns over orig_max positions. */
static double yarn_correction_dim(int dim, double base, double orig_max, double rotations) {
    return dim * log(orig_max / (rotations * 2.0 * M_PI)) / (2.0 * log(base));
}

/* YaRN (deepseek_v4.md §4.3): pairs below `low` (fast rotations) keep their frequency, pairs
 * above `high` (slow rotations) are divided by `factor`, and a linear ramp blends in between. */
void rope_init_yarn(rope_table *t, int dim, double base, double factor, double orig_max, double beta_fast,
                    double beta_slow) {
    rope_init(t, dim, base);
    dim = t->dim;
    double low = floor(yarn_correction_dim(dim, base, orig_max, beta_fast));
    double high = ceil(yarn_correction_dim(dim, base, orig_max, beta_slow));
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001;
    for (int k = 0; k < dim / 2; k++) {
        double ramp = (k - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double f = t->inv_freq[k];
        t->inv_freq[k] = (float)(f / factor * ramp + f * (1.0 - ramp));
    }
}

/* cos/sin of pos * inv_freq[k] for every pair, with the angle formed in double so large positions
 * keep their precision. The last table computed on this thread is kept, because every head of
 * a token rotates at the same position: the trigonometry runs once per token, not per head. The
 * key is the frequencies themselves, so a re-initialised table can never hit a stale entry. */
typedef struct {
    int valid, pos, dim;
    float inv_freq[256], cos[256], sin[256];
} rope_angles;

static const rope_angles *rope_angles_for(const rope_table *t, int pos) {
    static _Thread_local rope_angles cache;
    int pairs = t->dim / 2;
    if (cache.valid && cache.pos == pos && cache.dim == t->dim &&
        !memcmp(cache.inv_freq, t->inv_freq, sizeof(float) * pairs))
        return &cache;
    for (int k = 0; k < pairs; k++) {
        double a = (double)pos * (double)t->inv_freq[k];
        cache.cos[k] = (float)cos(a);
        cache.sin[k] = (float)sin(a);
    }
    memcpy(cache.inv_freq, t->inv_freq, sizeof(float) * pairs);
    cache.pos = pos;
    cache.dim = t->dim;
    cache.valid = 1;
    return &cache;
}

static void rotate_pair(float *a, float *b, float c, float s) {
    float x = *a, y = *b;
    *a = x * c - y * s;
    *b = x * s + y * c;
}

void rope_apply_interleaved(const rope_table *t, float *x, int pos, int inverse) {
    const rope_angles *r = rope_angles_for(t, pos);
    for (int k = 0; k < t->dim / 2; k++)
        rotate_pair(&x[2 * k], &x[2 * k + 1], r->cos[k], inverse ? -r->sin[k] : r->sin[k]);
}

void rope_apply_half(const rope_table *t, float *x, int pos, int inverse) {
    const rope_angles *r = rope_angles_for(t, pos);
    int half = t->dim / 2;
    for (int k = 0; k < half; k++) rotate_pair(&x[k], &x[k + half], r->cos[k], inverse ? -r->sin[k] : r->sin[k]);
}

void softmax(float *x, int n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = fmaxf(mx, x[i]);
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

float silu(float x) { return x / (1.0f + expf(-x)); }

/* log(1 + e^x) without overflow for large x or loss of precision for very negative x. */
float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Selection by repeated insertion into a sorted prefix: k is small (experts, indexer top-k over
 * a few thousand at most), and a strict '>' keeps the earlier index first among equal values. */
void topk(const float *x, int n, int k, int *idx) {
    if (k > n) k = n;
    if (k <= 0) return;
    int have = 0;
    for (int i = 0; i < n; i++) {
        if (have == k && !(x[i] > x[idx[k - 1]])) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && x[i] > x[idx[j - 1]]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
}

void hadamard(float *x, int n) {
    if (n <= 0 || (n & (n - 1))) {
        fprintf(stderr, "cairn: hadamard needs a power-of-two length, got %d; vector left unchanged\n", n);
        return;
    }
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s;
}

float dot_f32(const float *a, const float *b, int n) {
    qmat row = {.fmt = WF_F32, .rows = 1, .cols = n, .data = a};
    return qmat_dot_row(&row, 0, b);
}

/* Blocks of 16 columns with a constant trip count: GCC's -O2 vectorizer (cheap cost model)
 * takes a loop only when it needs no scalar remainder. */
/* Columns in blocks of WEIGHTED_BLOCK for WEIGHTED_HEADS heads at a time, held in registers
 * across the rows: a row's block is loaded once for those heads, and `out` is written once
 * (walking rows outermost loaded and stored it for every term, store-bound). Each column's chain
 * is unchanged. Always inlined so that HB is a constant and the block stays in registers. */
#define WEIGHTED_BLOCK 64
#define WEIGHTED_HEADS 4

static inline __attribute__((always_inline)) void weighted_block(int HB, float *restrict out, size_t out_stride,
                                                                 const float *restrict w, const float *restrict rows,
                                                                 int count, size_t stride, int c0) {
    float acc[WEIGHTED_HEADS][WEIGHTED_BLOCK] = {{0}};
    for (int k = 0; k < count; k++) {
        const float *r = rows + (size_t)k * stride + c0;
        #pragma GCC unroll 4
        for (int h = 0; h < HB; h++) {
            float wk = w[(size_t)h * count + k];
            #pragma GCC unroll 64
            for (int c = 0; c < WEIGHTED_BLOCK; c++) acc[h][c] = fmaf(wk, r[c], acc[h][c]);
        }
    }
    for (int h = 0; h < HB; h++) memcpy(out + (size_t)h * out_stride + c0, acc[h], sizeof acc[h]);
}

void weighted_rows(float *restrict out, size_t out_stride, const float *restrict w, int heads,
                   const float *restrict rows, int count, size_t stride, int width) {
    int c0 = 0;
    for (; c0 + WEIGHTED_BLOCK <= width; c0 += WEIGHTED_BLOCK) {
        int h = 0;
        for (; h + WEIGHTED_HEADS <= heads; h += WEIGHTED_HEADS)
            weighted_block(WEIGHTED_HEADS, out + (size_t)h * out_stride, out_stride, w + (size_t)h * count, rows, count,
                           stride, c0);
        for (; h < heads; h++)
            weighted_block(1, out + (size_t)h * out_stride, out_stride, w + (size_t)h * count, rows, count, stride, c0);
    }
    for (int h = 0; h < heads; h++)
        for (int c = c0; c < width; c++) {
            float acc = 0.0f;
            for (int k = 0; k < count; k++) acc = fmaf(w[(size_t)h * count + k], rows[(size_t)k * stride + c], acc);
            out[(size_t)h * out_stride + c] = acc;
        }
}
