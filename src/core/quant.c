/* quant.c — scalar number-format conversions and activation QDQ (see quant.h).
 *
 * E4M3 and E2M1 rounding share one routine: a small float format is a grid whose spacing is
 * 2^(exponent - mantissa_bits) above its smallest normal and constant below it (subnormals).
 * Dividing by that spacing is exact (a power of two), so rounding to an integer in the default
 * rounding mode gives round-half-to-even on the grid. */
#include "quant.h"
#include "threads.h"
#include "util.h"

#include <float.h>
#include <math.h>

float f16_to_f32(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v;
    if (exp == 0) v = ldexpf((float)man, -24);
    else if (exp == 31) v = man ? NAN : INFINITY;
    else v = ldexpf((float)(man | 0x400), exp - 25);
    return sign ? -v : v;
}

float e4m3_to_f32(uint8_t b) {
    int exp = (b >> 3) & 0xf, man = b & 7;
    float v;
    if (exp == 15 && man == 7) v = NAN;
    else if (exp == 0) v = ldexpf((float)man, -9);
    else v = ldexpf((float)(man | 8), exp - 10);
    return (b & 0x80) ? -v : v;
}

/* 2^e for -126 <= e <= 127, from its bits. */
static inline float pow2f(int e) {
    uint32_t u = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Nearest value of a sign-magnitude minifloat with `mbits` mantissa bits, smallest normal
 * exponent `emin` and largest finite value `maxval`; ties to even; saturates; NaN stays NaN.
 * Inlined into the QDQ loops and branch-free on the bits, so GCC vectorizes those loops (see
 * qdq_block): the exponent comes from the bits (clamped to emin, which covers zero and the
 * subnormals), scaling by the spacing 2^(e - mbits) is exact both ways (every spacing and its
 * inverse is a normal float), and a / spacing is below 2^(mbits + 1) + 1, where adding and
 * subtracting 2^23 rounds to an integer exactly as rintf does in the default rounding mode.
 * Values above maxval round to at least maxval's next grid step (or inf, or NaN) and saturate. */
static inline __attribute__((always_inline)) float minifloat_round(float f, int mbits, int emin, float maxval) {
    uint32_t bits, rbits;
    memcpy(&bits, &f, 4);
    uint32_t abits = bits & 0x7fffffffu;
    float a;
    memcpy(&a, &abits, 4);
    int e = (int)(abits >> 23) - 127;
    int spacing_exp = (e < emin ? emin : e) - mbits;
    float r = ((a * pow2f(-spacing_exp) + 8388608.0f) - 8388608.0f) * pow2f(spacing_exp);
    r = r <= maxval ? r : maxval;      /* also inf, and inf * 0 where the spacing of inf underflows */
    memcpy(&rbits, &r, 4);
    rbits |= bits & 0x80000000u;
    float out;
    memcpy(&out, &rbits, 4);
    return f != f ? f : out;
}

static inline __attribute__((always_inline)) float e4m3_round_inline(float f) { return minifloat_round(f, 3, -6, 448.0f); }
static inline __attribute__((always_inline)) float e2m1_round_inline(float f) { return minifloat_round(f, 1, 0, 6.0f); }

float e4m3_round(float f) { return e4m3_round_inline(f); }

float e2m1_round(float f) { return e2m1_round_inline(f); }

uint8_t f32_to_e4m3(float f) {
    if (isnan(f)) return signbit(f) ? 0xff : 0x7f;
    float r = fabsf(e4m3_round(f));
    uint8_t sign = signbit(f) ? 0x80 : 0;
    if (r < ldexpf(1.0f, -6)) return sign | (uint8_t)ldexpf(r, 9);      /* subnormal: r = m * 2^-9 */
    int e = ilogbf(r);
    int man = (int)ldexpf(r, 3 - e) - 8;                                /* r = (8+m) * 2^(e-3) */
    return sign | (uint8_t)((e + 7) << 3) | (uint8_t)man;
}

float e8m0_to_f32(uint8_t b) {
    if (b == 255) return NAN;
    return ldexpf(1.0f, (int)b - 127);
}

float e2m1_to_f32(uint8_t code) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[code & 7];
    return (code & 8) ? -v : v;
}

/* bf16_round on 16 values at once, on their bits, branch-free so that GCC's -O2 vectorizer
 * (cheap cost model: constant trip count, no remainder) takes it: f32_to_bf16's NaN case (quiet
 * bit set, truncated) selected per element, otherwise round to nearest even. The same bits as
 * bf16_round; the residual stream and every projection output pass through here in QAT
 * numerics, where the scalar loop was 4 % of a DeepSeek V4 prefill. */
static void bf16_round16(float *x) {
    uint32_t u[16];
    memcpy(u, x, sizeof u);
    for (int i = 0; i < 16; i++) {
        uint32_t nan = (u[i] & 0xffff0000u) | 0x00400000u;
        uint32_t rounded = (u[i] + 0x7fffu + ((u[i] >> 16) & 1)) & 0xffff0000u;
        u[i] = (u[i] & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
    }
    memcpy(x, u, sizeof u);
}

void bf16_round_vec(float *x, size_t n) {
    size_t full = n / 16 * 16;
    for (size_t i = 0; i < full; i += 16) bf16_round16(x + i);
    for (size_t i = full; i < n; i++) x[i] = bf16_round(x[i]);
}

typedef struct {
    float *x;
    size_t width;
} round_job;

static void round_row(void *ctx, int i) {
    const round_job *j = ctx;
    bf16_round_vec(j->x + (size_t)i * j->width, j->width);
}

void bf16_round_rows(float *x, int n, size_t width) {
    round_job j = {x, width};
    pool_run(n, round_row, &j);
}

/* 2^ceil(log2(v)) for finite v > 0, computed exactly from the binary exponent (log2f can
 * land on the wrong side of an integer for values just above a power of two). */
static float pow2_ceil(float v) {
    int e;
    float m = frexpf(v, &e);                /* v = m * 2^e, m in [0.5, 1) */
    return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

/* The largest |x|, NaNs skipped (as fmaxf skips them; a comparison with NaN is false), in 16
 * running maxima with a constant trip count so that GCC's -O2 vectorizer takes the loop (a
 * maximum does not depend on the order it is taken in). */
static float block_amax(const float *x, size_t n) {
    float m[16] = {0};
    size_t full = n / 16 * 16;
    for (size_t i0 = 0; i0 < full; i0 += 16)
        for (int k = 0; k < 16; k++) {
            float a = fabsf(x[i0 + k]);
            m[k] = a > m[k] ? a : m[k];
        }
    for (size_t i = full; i < n; i++) {
        float a = fabsf(x[i]);
        m[0] = a > m[0] ? a : m[0];
    }
    float amax = 0.0f;
    for (int k = 0; k < 16; k++) amax = m[k] > amax ? m[k] : amax;
    return amax;
}

/* One QDQ block: scale = 2^ceil(log2(max(amax, floor)/maxval)), x <- round(x/scale)*scale.
 * A block holding inf or NaN is left as it is: there is no meaningful scale for it. Inlined
 * per format so the rounding inlines into the loop, which runs in blocks of 16 for the
 * vectorizer (the same operations per element either way; scalar, this was 3 % of a DeepSeek
 * V4 prefill). */
static inline __attribute__((always_inline)) void qdq_block(float *x, size_t n, float amax_floor, float maxval,
                                                            float (*round_fn)(float)) {
    float amax = block_amax(x, n);
    if (!isfinite(amax)) return;
    float scale = pow2_ceil(fmaxf(amax, amax_floor) / maxval);
    size_t full = n / 16 * 16;
    for (size_t i0 = 0; i0 < full; i0 += 16)
        for (size_t i = i0; i < i0 + 16; i++) x[i] = round_fn(x[i] / scale) * scale;
    for (size_t i = full; i < n; i++) x[i] = round_fn(x[i] / scale) * scale;
}

void act_qdq_e4m3(float *x, size_t n, size_t block) {
    if (block == 0) block = n;
    for (size_t i = 0; i < n; i += block) qdq_block(x + i, MIN(block, n - i), 1e-4f, 448.0f, e4m3_round_inline);
}

/* The FP4 amax floor is 6 * 2^-126 (the official kernel's indexer path): the smallest amax
 * whose scale, 2^-126, is still a normal float. */
void act_qdq_fp4(float *x, size_t n, size_t block) {
    if (block == 0) block = n;
    for (size_t i = 0; i < n; i += block) qdq_block(x + i, MIN(block, n - i), 6.0f * FLT_MIN, 6.0f, e2m1_round_inline);
}
