/* test_kernels.c — qmat kernels for every format: accuracy against a double-precision
 * dequantize-then-dot written from the format definitions, bitwise SIMD == scalar, bitwise
 * invariance to batch size, batch position, row sub-ranges and thread count, hand-built cases
 * that only the canonical orders (rule 2, the nibble formats' rule 4, I8_ROW's rule 5) pass;
 * and the pool, including that idle threads claim the indices of a held-up one. Every format
 * that takes f32 scales (FP8 `_scale_inv` grids, the int8/int4 containers) gets arbitrary,
 * non-power-of-two scales. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "core/kernels.h"
#include "core/quant.h"
#include "core/threads.h"
#include "test.h"

static uint64_t rng = 0x2545F4914F6CDD1DULL;
static uint32_t rnd(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 20);
}
static float rnd_float(void) { return ((int)(rnd() % 20001) - 10000) * 1e-4f; }

typedef struct {
    qmat w;
    uint8_t *data, *scale;
    float *fscale;
} test_matrix;

/* Positive scales with full mantissas, over a few octaves: never powers of two. */
static float rnd_scale(void) { return (0.25f + (float)(rnd() % 100000) * 3.1e-5f) * 1.0000001f; }

static test_matrix make(wformat fmt, int rows, int cols, int f32_scales) {
    test_matrix m = {{fmt, rows, cols, NULL, NULL, NULL, 0, 0, QM_SCRATCH}, NULL, NULL, NULL};
    size_t n = (size_t)rows * cols, scales = 0, bytes = 0;
    switch (fmt) {
    case WF_F32: bytes = n * 4; break;
    case WF_BF16: bytes = n * 2; break;
    case WF_FP8: bytes = n; scales = (size_t)((rows + 127) / 128) * ((cols + 127) / 128); break;
    case WF_FP4: bytes = (size_t)rows * ((cols + 1) / 2); scales = (size_t)rows * ((cols + 31) / 32); break;
    case WF_I8_ROW: bytes = n; scales = (size_t)rows; break;
    case WF_I4_ROW: bytes = (size_t)rows * ((cols + 1) / 2); scales = (size_t)rows; break;
    case WF_I4_G64: bytes = (size_t)rows * ((cols + 1) / 2); scales = (size_t)rows * ((cols + 63) / 64); break;
    case WF_NVFP4: bytes = (size_t)rows * ((cols + 1) / 2); scales = (size_t)rows * ((cols + 15) / 16); break;
    }
    m.data = malloc(bytes);
    for (size_t i = 0; i < n && fmt == WF_F32; i++) ((float *)m.data)[i] = rnd_float();
    for (size_t i = 0; i < n && fmt == WF_BF16; i++) ((uint16_t *)m.data)[i] = f32_to_bf16(rnd_float());
    for (size_t i = 0; i < bytes && fmt == WF_FP8; i++) {
        uint8_t b = (uint8_t)rnd();
        m.data[i] = (b & 0x7f) == 0x7f ? 0x7e : b;       /* NaN codes are not weights */
    }
    for (size_t i = 0; i < bytes && fmt >= WF_FP4; i++) m.data[i] = (uint8_t)rnd();
    if (fmt == WF_NVFP4) {     /* E4M3 scales 2^-7 .. 15 (no NaN), a full-mantissa global either way */
        m.scale = malloc(scales);
        for (size_t i = 0; i < scales; i++) m.scale[i] = (uint8_t)(0x08 + rnd() % 0x50);
        m.w.global_scale = f32_scales ? 448.0f * 6.0f / (3.0f + rnd_scale()) : rnd_scale();
        m.w.global_divides = f32_scales;
    } else if (scales && (f32_scales || fmt == WF_I8_ROW || fmt == WF_I4_ROW || fmt == WF_I4_G64)) {
        m.fscale = malloc(scales * sizeof(float));
        for (size_t i = 0; i < scales; i++) m.fscale[i] = rnd_scale();
    } else if (scales) {
        m.scale = malloc(scales);
        for (size_t i = 0; i < scales; i++) m.scale[i] = (uint8_t)(120 + rnd() % 12);
    }
    m.w.data = m.data;
    m.w.scale = m.scale;
    m.w.scale_f32 = m.fscale;
    return m;
}

static int nibble(const qmat *w, int r, int c) {
    uint8_t byte = ((const uint8_t *)w->data)[(size_t)r * ((w->cols + 1) / 2) + c / 2];
    return c % 2 ? byte >> 4 : byte & 15;
}

/* Weight (r, c) from the format definitions in quant.h, in double. */
static double ref_weight(const qmat *w, int r, int c) {
    switch (w->fmt) {
    case WF_F32: return ((const float *)w->data)[(size_t)r * w->cols + c];
    case WF_BF16: return bf16_to_f32(((const uint16_t *)w->data)[(size_t)r * w->cols + c]);
    case WF_FP8: {
        int block = (r / 128) * ((w->cols + 127) / 128) + c / 128;
        return (double)e4m3_to_f32(((const uint8_t *)w->data)[(size_t)r * w->cols + c]) *
               (w->scale_f32 ? (double)w->scale_f32[block] : e8m0_to_f32(w->scale[block]));
    }
    case WF_FP4:
        return (double)e2m1_to_f32((uint8_t)nibble(w, r, c)) *
               e8m0_to_f32(w->scale[r * ((w->cols + 31) / 32) + c / 32]);
    case WF_I8_ROW: return (double)((const int8_t *)w->data)[(size_t)r * w->cols + c] * w->scale_f32[r];
    case WF_I4_ROW: return (double)(nibble(w, r, c) - 8) * w->scale_f32[r];
    case WF_I4_G64: return (double)(nibble(w, r, c) - 8) * w->scale_f32[r * ((w->cols + 63) / 64) + c / 64];
    case WF_NVFP4: {
        double v = (double)e2m1_to_f32((uint8_t)nibble(w, r, c)) * e4m3_to_f32(w->scale[r * ((w->cols + 15) / 16) + c / 16]);
        return w->global_divides ? v / w->global_scale : v * w->global_scale;
    }
    }
    return 0;
}

static int bits_equal(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

static void check_accuracy(const qmat *w, const float *x, const float *y, const char *what) {
    int bad = 0;
    float *row = malloc(sizeof(float) * w->cols);
    for (int r = 0; r < w->rows; r++) {
        double want = 0, mag = 0;
        for (int c = 0; c < w->cols; c++) {
            want += ref_weight(w, r, c) * x[c];
            mag += fabs(ref_weight(w, r, c) * x[c]);
        }
        /* f32 accumulation: about cols/16 + 4 roundings per lane chain and tree, each <= 2^-24 relative. */
        double tol = (w->cols / 16 + 5) * 6e-8 * mag + 1e-30;
        if (fabs(y[r] - want) > tol) {
            if (bad++ < 3) printf("  %s row %d: got %.9g want %.9g (tol %.3g)\n", what, r, y[r], want, tol);
        }
        /* qmat_row rounds code * scale to f32 once (exact for power-of-two scales). */
        qmat_row(w, r, row);
        for (int c = 0; c < w->cols; c++)
            if (row[c] != (float)ref_weight(w, r, c)) { bad++; break; }
    }
    free(row);
    CHECK(bad == 0, "%s: %d rows off the double reference or qmat_row", what, bad);
}

enum { NX = 17, NX_BIG = 40 };   /* NX_BIG: one batch past BF16_COPY_MIN_N (kernels_avx512.c) */

/* Every property for one matrix shape, on the current path. */
static void check_matrix(const qmat *w, const float *x, const char *what, float *ref_out) {
    size_t rows = (size_t)w->rows;
    float *yv = malloc(sizeof(float) * rows * NX), *ym = malloc(sizeof(float) * rows * NX);
    for (int j = 0; j < NX; j++) qmat_vec(w, x + (size_t)j * w->cols, yv + j * rows);
    check_accuracy(w, x, yv, what);

    int bad_batch = 0;
    for (int s = 0; s < NX; s++)
        for (int n = 1; s + n <= NX; n++) {
            qmat_mul(w, x + (size_t)s * w->cols, n, ym);
            if (!bits_equal(ym, yv + s * rows, rows * n)) bad_batch++;
        }
    CHECK(bad_batch == 0, "%s: %d (start, n) batches differ from qmat_vec", what, bad_batch);

    float *big = malloc(sizeof(float) * rows * NX_BIG);
    int bad_big = 0;
    qmat_mul(w, x, NX_BIG, big);
    for (int j = 0; j < NX_BIG; j++) {
        qmat_vec(w, x + (size_t)j * w->cols, ym);
        if (!bits_equal(ym, big + j * rows, rows)) bad_big++;
    }
    free(big);
    CHECK(bad_big == 0, "%s: %d rows of a %d-input batch differ from qmat_vec", what, bad_big, NX_BIG);

    int bad_rows = 0;
    int cuts[][2] = {{0, 1}, {1, 2}, {3, w->rows}, {w->rows / 2, w->rows}, {5, 5 + (w->rows - 5) / 3}};
    for (int k = 0; k < 5; k++) {
        int r0 = cuts[k][0], r1 = cuts[k][1], n = 1 + k * 3;
        qmat_mul_rows(w, r0, r1, x, n, ym);
        for (int j = 0; j < n; j++)
            if (!bits_equal(ym + (size_t)j * (r1 - r0), yv + j * rows + r0, (size_t)(r1 - r0))) bad_rows++;
    }
    CHECK(bad_rows == 0, "%s: %d qmat_mul_rows slices differ", what, bad_rows);

    int bad_dots = 0;
    for (int r = 0; r < w->rows; r++) {
        float d = qmat_dot_row(w, r, x + w->cols);
        if (!bits_equal(&d, yv + rows + r, 1)) bad_dots++;
    }
    CHECK(bad_dots == 0, "%s: %d qmat_dot_row rows differ from qmat_vec", what, bad_dots);
    qmat dense = *w;   /* checkpoint weights: both count the row they read */
    dense.source = QM_DENSE;
    unsigned long long d0, d1, d2, routed;
    kernels_streamed(&d0, &routed);
    qmat_mul_rows(&dense, 0, 1, x, 1, ym);
    kernels_streamed(&d1, &routed);
    (void)qmat_dot_row(&dense, 0, x);
    kernels_streamed(&d2, &routed);
    CHECK(d1 > d0 && d2 - d1 == d1 - d0, "%s: qmat_dot_row counted %llu bytes, a one-row qmat_mul_rows %llu", what,
          d2 - d1, d1 - d0);

    static const int thread_counts[] = {1, 3, 2};
    int bad_threads = 0;
    for (int t = 0; t < 3; t++) {
        pool_set_threads(thread_counts[t]);
        qmat_mul(w, x, NX, ym);
        if (!bits_equal(ym, yv, rows * NX)) bad_threads++;
        qmat_vec(w, x + w->cols, ym);
        if (!bits_equal(ym, yv + rows, rows)) bad_threads++;
    }
    CHECK(bad_threads == 0, "%s: %d thread-count runs differ", what, bad_threads);
    memcpy(ref_out, yv, sizeof(float) * rows * NX);
    free(yv);
    free(ym);
}

static int is_nibbles(wformat fmt) {   /* rule 4's formats, which may take the BF16 pairs */
    return fmt == WF_FP4 || fmt == WF_NVFP4 || fmt == WF_I4_ROW || fmt == WF_I4_G64;
}

/* qdq: the inputs get DeepSeek V4's E4M3 QDQ (blocks of 128, power-of-two scales), which makes
 * every nibble partial exact, so a path with BF16 pairs switched on (kernels_force_pairs) must take
 * them for every product of the full 64-column chunks (kernels_paired_products), switched off
 * for none, and give the scalar path's bits either way. */
static void check_format_input(wformat fmt, int rows, int cols, int f32_scales, int qdq) {
    test_matrix m = make(fmt, rows, cols, f32_scales);
    float *x = malloc(sizeof(float) * (size_t)cols * NX_BIG);
    for (size_t i = 0; i < (size_t)cols * NX_BIG; i++) x[i] = rnd_float() * (qdq ? 1.0f + (float)(i % 7) * 100.0f : 1.0f);
    for (int j = 0; qdq && j < NX_BIG; j++) act_qdq_e4m3(x + (size_t)j * cols, (size_t)cols, 128);
    char what[96];
    const char *scales = f32_scales && fmt == WF_FP8 ? "/f32-scales" : fmt == WF_NVFP4 && f32_scales ? "/divides" : "";
    const char *input = qdq ? " e4m3-qdq input" : "";
    float *simd = malloc(sizeof(float) * rows * NX), *scalar = malloc(sizeof(float) * rows * NX);

    unsigned long long paired = kernels_paired_products(), ints = kernels_int_products();
    snprintf(what, sizeof what, "%s%s %dx%d%s %s", wformat_name(fmt), scales, rows, cols, input, kernels_simd_name());
    check_matrix(&m.w, x, what, simd);
    paired = kernels_paired_products() - paired;
    ints = kernels_int_products() - ints;
    int want_pairs = qdq && cols >= 64 && kernels_pairs_pay(1) && is_nibbles(fmt);
    CHECK(want_pairs ? paired > 0 : paired == 0, "%s: %llu products from BF16 pairs, want %s", what, paired,
          want_pairs ? "some" : "none");
    int want_ints = qdq && cols >= 64 && kernels_ints_pay() && fmt == WF_FP4;
    CHECK(want_ints ? ints > 0 : ints == 0, "%s: %llu products from integer partials, want %s", what, ints,
          want_ints ? "some" : "none");
    kernels_force_scalar(1);
    snprintf(what, sizeof what, "%s%s %dx%d%s %s", wformat_name(fmt), scales, rows, cols, input, kernels_simd_name());
    check_matrix(&m.w, x, what, scalar);
    kernels_force_scalar(0);
    CHECK(bits_equal(simd, scalar, (size_t)rows * NX), "%s%s %dx%d%s: SIMD path differs from scalar",
          wformat_name(fmt), scales, rows, cols, input);
    free(simd); free(scalar); free(x); free(m.data); free(m.scale); free(m.fscale);
}

static void check_format(wformat fmt, int rows, int cols, int f32_scales) {
    check_format_input(fmt, rows, cols, f32_scales, 0);
    if (fmt != WF_F32 && fmt != WF_BF16) check_format_input(fmt, rows, cols, f32_scales, 1);
}

/* The BF16 pairs' exactness bound (kernels_avx512.c): a group whose inputs span 2^-9 .. 2^8 (17
 * binades, E4M3's range) is paired; one more binade is not, and neither is an input with bits
 * below BF16's. Either way the result is the scalar path's. */
static void check_pair_bound(void) {
    enum { C = 64 };
    uint8_t codes[C / 2], scales[C / 32] = {127, 127};
    for (int i = 0; i < C / 2; i++) codes[i] = (uint8_t)(0x77 ^ (i * 0x35));   /* codes up to 12, both signs */
    qmat m = {WF_FP4, 1, C, codes, scales, NULL, 0, 0, QM_SCRATCH};
    struct { float low, high; int paired; } cases[] = {
        {0x1p-9f, 0x1.ep8f, 1}, {0x1p-10f, 0x1.ep8f, 0}, {0x1.01p0f, 1.0f, 0}, {0x1p-126f, 0x1p-110f, 1},
        {0x1p-127f, 0x1p-112f, 0},
    };
    if (!kernels_has_pairs()) printf("  note: %s has no BF16 pairs; only the scalar match is checked\n", kernels_simd_name());
    kernels_force_pairs(1);
    kernels_force_ints(0);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        float x[C], y[2];
        for (int c = 0; c < C; c++) x[c] = c % 4 == 1 ? cases[k].low * (c % 8 == 1 ? -1.0f : 1.0f) : c % 4 == 2 ? cases[k].high : 0.75f * cases[k].high;
        unsigned long long paired = kernels_paired_products();
        for (int s = 0; s < 2; s++) {
            kernels_force_scalar(s);
            qmat_vec(&m, x, &y[s]);
        }
        kernels_force_scalar(0);
        paired = kernels_paired_products() - paired;
        CHECK(!memcmp(&y[0], &y[1], sizeof(float)), "pair bound case %zu: SIMD %.9g, scalar %.9g", k, y[0], y[1]);
        int want = cases[k].paired && kernels_has_pairs();
        CHECK(paired == (unsigned long long)want, "pair bound case %zu: %llu paired products, want %d", k, paired, want);
    }
    kernels_force_pairs(-1);
    kernels_force_ints(-1);
}

/* The integer partials' bounds (kernels_avx512.c): a chunk whose inputs are integers q times 2^E,
 * E its lowest set bit, qualifies when E lies in [-21, 1] and 48 |q| < 2^24; below 2^16 it takes
 * two bytes per input, else three. Five rows (a group of four and one alone) of 96 columns (a
 * chunk and a tail), whose scales include E8M0's extremes, so s_b * 2^E reaches 2^-149 and
 * 2^127. Either way the result is the scalar path's. */
static void check_int_bound(void) {
    enum { R = 5, C = 96 };
    uint8_t codes[R * C / 2], scales[R * C / 32];
    for (int i = 0; i < R * C / 2; i++) codes[i] = (uint8_t)(0x77 ^ (i * 0x35));
    for (int i = 0; i < R * C / 32; i++) scales[i] = (uint8_t)(i % 3 == 0 ? 0 : i % 3 == 1 ? 254 : 120 + i);
    qmat m = {WF_FP4, R, C, codes, scales, NULL, 0, 0, QM_SCRATCH};
    struct { float low, high; int ints; } cases[] = {
        {0x1p-9f, 448.0f, 1},        /* E4M3's span over a block: q = 448 * 2^9, three bytes */
        {0x1p-9f, 1.75f, 1},         /* two bytes */
        {0x1p-10f, 448.0f, 0},       /* 48 q >= 2^24 */
        {0x1p-21f, 0x1p-3f, 1},      /* the lowest E */
        {0x1p-22f, 0x1p-20f, 0},     /* below it */
        {2.0f, 1000.0f, 1},          /* the highest E */
        {4.0f, 16.0f, 0},            /* above it */
    };
    if (!kernels_has_ints()) printf("  note: %s has no integer partials; only the scalar match is checked\n", kernels_simd_name());
    kernels_force_ints(1);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        float x[C], y[2][R];
        for (int c = 0; c < C; c++)
            x[c] = c % 4 == 1 ? cases[k].low * (c % 8 == 1 ? -1.0f : 1.0f) : c % 4 == 2 ? -cases[k].high : c % 4 == 3 ? cases[k].high * 0.75f : 0.0f;
        unsigned long long ints = kernels_int_products();
        for (int s = 0; s < 2; s++) {
            kernels_force_scalar(s);
            qmat_vec(&m, x, y[s]);
        }
        kernels_force_scalar(0);
        ints = kernels_int_products() - ints;
        CHECK(!memcmp(y[0], y[1], sizeof y[0]), "int bound case %zu: SIMD %.9g, scalar %.9g", k, y[0][0], y[1][0]);
        unsigned long long want = cases[k].ints && kernels_has_ints() ? R : 0;
        CHECK(ints == want, "int bound case %zu: %llu integer products, want %llu", k, ints, want);
    }
    kernels_force_ints(-1);
}

/* No FMA of the FP8 kernels sees a denormal operand when the inputs are normal: every E4M3 code
 * but NaN (subnormal codes included) against normal inputs, on one thread, for the matvec, every
 * register-kernel batch size and the tile, must leave MXCSR's sticky denormal-operand flag clear.
 * Intel cores take a microcode assist per such instruction (about 50x slower; Zen does not), so
 * a weight factor encoded as an f32 denormal is correct everywhere and 25x slower on Intel. */
static void check_fp8_no_denormal_operands(void) {
#if defined(__x86_64__)
    enum { R = 8, C = 256, N = 9, MXCSR_DE = 1 << 1 };
    uint8_t codes[R * C], scales[2] = {127, 126};
    for (int i = 0; i < R * C; i++) codes[i] = (uint8_t)((i * 0x9d + i / 256) & 0xff);
    for (int i = 0; i < R * C; i++)
        if ((codes[i] & 0x7f) == 0x7f) codes[i] ^= 1;
    qmat m = {WF_FP8, R, C, codes, scales, NULL, 0, 0, QM_SCRATCH};
    float x[N * C], y[2][N * R];
    for (int i = 0; i < N * C; i++) x[i] = (float)(i % 11 + 1) * (i % 2 ? -0.37f : 0.61f);
    pool_set_threads(1);
    for (int n = 1; n <= N; n++)
        for (int s = 0; s < 2; s++) {
            kernels_force_scalar(s);
            _mm_setcsr(_mm_getcsr() & ~(unsigned)MXCSR_DE);
            qmat_mul(&m, x, n, y[s]);
            CHECK(!(_mm_getcsr() & MXCSR_DE), "%s: FP8 with %d inputs met a denormal operand", kernels_simd_name(), n);
        }
    kernels_force_scalar(0);
    pool_set_threads(2);
    CHECK(bits_equal(y[0], y[1], (size_t)N * R), "FP8 every code: SIMD path differs from scalar");
#else
    printf("  note: not x86-64; the denormal-operand flag is not read\n");
#endif
}

/* FP8 groups of 64 codes without exponent field 0 decode as BF16 patterns, the others through
 * the f16 conversion (kernels_fp8_converted_groups): both must give the scalar path's bits, and
 * the cheap decode must be the one that ran for the clean rows. Rows of 256 codes, all clean, then
 * the same rows with a subnormal, a zero and a negative zero code in three of them. */
static void check_fp8_decodes(void) {
    enum { R = 8, C = 256, N = 9 };
    uint8_t codes[R * C], scales[2] = {127, 125};
    for (int i = 0; i < R * C; i++) {
        uint8_t b = (uint8_t)rnd();
        if ((b & 0x78) == 0) b |= 0x08;
        codes[i] = (b & 0x7f) == 0x7f ? 0x7e : b;
    }
    qmat m = {WF_FP8, R, C, codes, scales, NULL, 0, 0, QM_SCRATCH};
    float x[N * C], y[2][N * R];
    for (int i = 0; i < N * C; i++) x[i] = rnd_float();
    pool_set_threads(1);
    for (int dirty = 0; dirty < 2; dirty++) {
        if (dirty) {
            codes[1 * C + 70] = 0x05;
            codes[4 * C + 3] = 0x00;
            codes[6 * C + 255] = 0x80;
        }
        for (int n = 1; n <= N; n++) {
            kernels_force_scalar(1);
            qmat_mul(&m, x, n, y[1]);
            kernels_force_scalar(0);
            long long before = kernels_fp8_converted_groups();
            qmat_mul(&m, x, n, y[0]);
            long long converted = kernels_fp8_converted_groups() - before;
            CHECK(bits_equal(y[0], y[1], (size_t)n * R), "FP8 %s rows, %d inputs: SIMD differs from scalar",
                  dirty ? "mixed" : "clean", n);
            if (before < 0 || n > 8) continue;     /* one decode on this path; the tile above 8 */
            CHECK(dirty ? converted >= 3 : converted == 0, "FP8 %s rows, %d inputs: %lld groups converted (want %s)",
                  dirty ? "mixed" : "clean", n, converted, dirty ? "each of the 3 at least once" : "none");
        }
    }
    if (kernels_fp8_converted_groups() < 0)
        printf("  note: %s decodes every FP8 code one way (no GFNI/VBMI): only the bits are checked\n",
               kernels_simd_name());
    pool_set_threads(2);
}

/* The canonical order is fixed, not merely "some order": a hand-built case where it matters. */
static void check_reduction_order(void) {
    enum { C = 48 };
    float w[C], x[C];
    for (int c = 0; c < C; c++) { w[c] = 1.0f; x[c] = 0.0f; }
    x[0] = 1e8f; x[16] = 1.0f; x[32] = -1e8f;    /* all lane 0: ((0 + 1e8) + 1) - 1e8 = 0 in f32 */
    x[1] = 1.0f;                                 /* lane 1 */
    qmat m = {WF_F32, 1, C, w, NULL, NULL, 0, 0, QM_SCRATCH};
    float y;
    for (int s = 0; s < 2; s++) {
        kernels_force_scalar(s);
        qmat_vec(&m, x, &y);
        CHECK(y == 1.0f, "%s: lane order gives %g, want 1", kernels_simd_name(), y);
    }
    kernels_force_scalar(0);
}

/* FP4's rule 4 (kernels_path.h), not rule 2: columns 0..3 form one partial before the scale, so
 * 2^26 + 2 - 2^26 cancels to 0 there (rule 2 would keep the 2 in its own lane and give 1);
 * columns 16 and 33 land in lanes 8 and 12 of the tree with scales 0.5 and 2. */
static void check_fp4_rule4(void) {
    enum { C = 64 };
    uint8_t codes[C / 2], scales[C / 32] = {127, 129};     /* E8M0: 1.0 and 4.0 */
    float x[C] = {0}, y;
    memset(codes, 0x22, sizeof codes);                     /* every code 2: E2M1 1.0 */
    x[0] = 33554432.0f; x[1] = 1.0f; x[2] = -33554432.0f;  /* group 0 of block 0 */
    x[16] = 0.25f;                                         /* group 4 of block 0: 0.25 */
    x[33] = 0.5f;                                          /* group 0 of block 1: 0.5 * 4 = 2 */
    qmat m = {WF_FP4, 1, C, codes, scales, NULL, 0, 0, QM_SCRATCH};
    for (int s = 0; s < 2; s++) {
        kernels_force_scalar(s);
        qmat_vec(&m, x, &y);
        CHECK(y == 2.25f, "%s: FP4 rule 4 gives %.9g, want 2.25", kernels_simd_name(), y);
    }
    kernels_force_scalar(0);
}

/* NVFP4: each 16 columns take their own E4M3 scale (1, 2, 4, 0.5 for columns 0-15, 16-31,
 * 32-47, 48-63), so a scale per 32 (MXFP4's) or a swapped half would show; then the global
 * scale divides (compressed-tensors) or multiplies (ModelOpt) the sum. Low nibble = even
 * column: column 2's code is 0 and x[2] is large. */
static void check_nvfp4_rules(void) {
    enum { C = 64 };
    uint8_t codes[C / 2], scales[C / 16] = {0x38, 0x40, 0x48, 0x30};
    float x[C] = {0}, y;
    memset(codes, 0x22, sizeof codes);                     /* every code 2: E2M1 1.0 */
    codes[1] = 0x20;                                       /* column 2: code 0 */
    x[0] = 1.0f; x[2] = 1e6f; x[16] = 1.0f; x[33] = 1.0f; x[50] = 1.0f;
    for (int divides = 0; divides < 2; divides++) {
        qmat m = {WF_NVFP4, 1, C, codes, scales, NULL, divides ? 2.0f : 3.0f, divides, QM_SCRATCH};
        float want = divides ? 3.75f : 22.5f, row[C];
        for (int s = 0; s < 2; s++) {
            kernels_force_scalar(s);
            qmat_vec(&m, x, &y);
            CHECK(y == want, "%s: NVFP4 (divides %d) gives %.9g, want %.9g", kernels_simd_name(), divides, y, want);
            qmat_row(&m, 0, row);
            CHECK(row[2] == 0.0f && row[16] == (divides ? 1.0f : 6.0f) && row[50] == (divides ? 0.25f : 1.5f),
                  "%s: NVFP4 qmat_row gives %g %g %g", kernels_simd_name(), row[2], row[16], row[50]);
        }
    }
    kernels_force_scalar(0);
}

/* The integer formats' rules with an f32 scale (1.5, not a power of two) applied after an
 * unscaled partial sum: 1 + 2^-24 rounds to 1 before the scale, giving exactly 1.5, where scaled
 * weights would give 1.5 + 1.5 * 2^-24 -> 1.5 + 2^-23. I8_ROW (rule 5): columns 0 and 16 share
 * lane 0. I4_ROW / I4_G64 (rule 4): columns 0 and 1 form one partial; I4_G64 adds column 64
 * (group 1, scale 3): 4.5. Low nibble = even column: x[2] is large and column 2's value is 0
 * (column 3's is 1, x[3] = 0), so a swapped nibble order would show. */
static void check_int_rules(void) {
    enum { C = 128 };
    float x[C] = {0}, y, row_scale = 1.5f, group_scales[2] = {1.5f, 3.0f};
    int8_t i8[C] = {0};
    uint8_t i4[C / 2];
    memset(i4, 0x88, sizeof i4);                           /* every value 0 */
    i8[0] = i8[16] = 1;
    i4[0] = 0x99;                                          /* columns 0 and 1: value 1 */
    i4[1] = 0x98;                                          /* column 2: 0, column 3: 1 */
    i4[32] = 0x89;                                         /* column 64: 1 */
    qmat m8 = {WF_I8_ROW, 1, C, i8, NULL, &row_scale, 0, 0, QM_SCRATCH}, m4 = {WF_I4_ROW, 1, C, i4, NULL, &row_scale, 0, 0, QM_SCRATCH};
    qmat mg = {WF_I4_G64, 1, C, i4, NULL, group_scales, 0, 0, QM_SCRATCH};
    for (int s = 0; s < 2; s++) {
        kernels_force_scalar(s);
        memset(x, 0, sizeof x);
        x[0] = 1.0f; x[16] = 0x1p-24f;
        qmat_vec(&m8, x, &y);
        CHECK(y == 1.5f, "%s: I8_ROW rule 5 gives %.9g, want 1.5", kernels_simd_name(), y);
        memset(x, 0, sizeof x);
        x[0] = 1.0f; x[1] = 0x1p-24f; x[2] = 1000.0f;
        qmat_vec(&m4, x, &y);
        CHECK(y == 1.5f, "%s: I4_ROW rule 4 gives %.9g, want 1.5", kernels_simd_name(), y);
        x[64] = 1.0f;                                      /* one scale per row: 1.5 + 1.5 */
        qmat_vec(&m4, x, &y);
        CHECK(y == 3.0f, "%s: I4_ROW rule 4 gives %.9g, want 3", kernels_simd_name(), y);
        qmat_vec(&mg, x, &y);
        CHECK(y == 4.5f, "%s: I4_G64 rule 4 gives %.9g, want 4.5", kernels_simd_name(), y);
    }
    kernels_force_scalar(0);
}

static void check_simd_selected(void) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    const char *name = kernels_simd_name();
    CHECK(!strcmp(name, "avx2") || !strcmp(name, "avx512"), "native build runs the %s path", name);
#else
    CHECK(!strcmp(kernels_simd_name(), "scalar"), "portable build runs %s", kernels_simd_name());
#endif
    kernels_force_scalar(1);
    CHECK(!strcmp(kernels_simd_name(), "scalar"), "force_scalar");
    kernels_force_scalar(0);
}

typedef struct { int hits[1000]; int nested_ok; } pool_probe;

static void count_task(void *ctx, int i) { __atomic_fetch_add(&((pool_probe *)ctx)->hits[i], 1, __ATOMIC_RELAXED); }

static void nested_task(void *ctx, int i) {
    pool_probe inner = {{0}, 0};
    pool_run(10, count_task, &inner);                   /* must run serially, right here */
    int ok = 1;
    for (int k = 0; k < 10; k++) ok &= inner.hits[k] == 1;
    if (ok) __atomic_fetch_add(&((pool_probe *)ctx)->nested_ok, 1, __ATOMIC_RELAXED);
}

static void check_pool(void) {
    /* The job before each resize: workers started by the resize must not run it again. */
    static pool_probe before_resize[5];
    for (int t = 1; t <= 4; t++) {
        pool_run(1000, count_task, &before_resize[t]);
        pool_set_threads(t);
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);   /* let new workers reach their wait */
        CHECK(pool_threads() == t, "pool_threads %d after set %d", pool_threads(), t);
        for (int n = 0; n <= 1000; n += 333) {
            pool_probe p = {{0}, 0};
            pool_run(n, count_task, &p);
            int bad = 0;
            for (int i = 0; i < 1000; i++) bad += p.hits[i] != (i < n);
            CHECK(bad == 0, "threads %d n %d: %d indices not run exactly once", t, n, bad);
        }
        pool_probe p = {{0}, 0};
        pool_run(7, nested_task, &p);
        CHECK(p.nested_ok == 7, "threads %d: nested pool_run ran %d of 7 correctly", t, p.nested_ok);
    }
    int rerun = 0;
    for (int t = 1; t <= 4; t++)
        for (int i = 0; i < 1000; i++) rerun += before_resize[t].hits[i] != 1;
    CHECK(rerun == 0, "%d indices of jobs finished before a resize ran again", rerun);
    pool_set_threads(2);
}

/* Claiming: while one call of a job is held up, the other thread takes the rest of the indices
 * (a fixed half-and-half split could finish at most half of them). The held call waits for that,
 * with a generous deadlock guard instead of hanging if it never happens. */
typedef struct { atomic_int others_done; int waited_ok; } claim_probe;

static void held_task(void *ctx, int i) {
    claim_probe *p = ctx;
    if (i > 0) {
        atomic_fetch_add(&p->others_done, 1);
        return;
    }
    for (int k = 0; k < 6000 && atomic_load(&p->others_done) < 48; k++)
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    p->waited_ok = atomic_load(&p->others_done) >= 48;
}

static void check_pool_claims(void) {
    pool_set_threads(2);
    claim_probe p = {0, 0};
    pool_run(64, held_task, &p);
    CHECK(p.waited_ok && atomic_load(&p.others_done) == 63, "claiming: %d other indices ran while index 0 was held",
          atomic_load(&p.others_done));
}

/* Past its spin a worker sleeps on a futex: a job must wake it. The held index can only be
 * released by the other thread doing the rest, so this waits on the wake-up (the deadlock
 * guard in held_task ends it if the worker never wakes). */
typedef struct { atomic_int calls[2]; } slow_probe;

static void slow_task(void *ctx, int i) {
    if (i == 1) nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);   /* outlasts the caller's spin */
    atomic_fetch_add(&((slow_probe *)ctx)->calls[i], 1);
}

static void check_pool_sleepers(void) {
    pool_set_threads(2);
    const struct timespec asleep = {0, 300 * 1000 * 1000};   /* well past the workers' spin */
    nanosleep(&asleep, NULL);
    claim_probe p = {0, 0};
    pool_run(64, held_task, &p);
    CHECK(p.waited_ok && atomic_load(&p.others_done) == 63, "after sleeping: %d other indices ran while index 0 was held",
          atomic_load(&p.others_done));
    /* one call outlasting the other thread's spin: whichever thread waits for it sleeps and is woken */
    nanosleep(&asleep, NULL);
    slow_probe q = {{0, 0}};
    pool_run(2, slow_task, &q);
    CHECK(atomic_load(&q.calls[0]) == 1 && atomic_load(&q.calls[1]) == 1, "slow job: calls ran %d and %d times",
          atomic_load(&q.calls[0]), atomic_load(&q.calls[1]));
}

/* kernels_transpose: every element lands where the definition puts it, on the SIMD path and the
 * scalar one, for shapes with and without whole 8 x 8 blocks, and with strides wider than the
 * matrix (a block written past its columns would show in the untouched guard values). */
static void check_transpose(void) {
    static const int shapes[][2] = {{8, 8}, {19, 37}, {16, 512}, {1, 9}, {130, 24}, {7, 5}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int rows = shapes[k][0], cols = shapes[k][1];
        size_t lds = (size_t)cols + 3, ldd = (size_t)rows + 5;
        float *src = malloc(sizeof(float) * (size_t)rows * lds), *dst = malloc(sizeof(float) * (size_t)cols * ldd);
        for (size_t i = 0; i < (size_t)rows * lds; i++) src[i] = rnd_float();
        for (int s = 0; s < 2; s++) {
            kernels_force_scalar(s);
            for (size_t i = 0; i < (size_t)cols * ldd; i++) dst[i] = -7.0f;
            kernels_transpose(src, rows, cols, lds, dst, ldd);
            int bad = 0;
            for (int c = 0; c < cols; c++)
                for (size_t r = 0; r < ldd; r++)
                    bad += (int)r < rows ? dst[c * ldd + r] != src[r * lds + (size_t)c] : dst[c * ldd + r] != -7.0f;
            CHECK(!bad, "%s: transpose %dx%d: %d elements wrong", kernels_simd_name(), rows, cols, bad);
        }
        kernels_force_scalar(0);
        free(src); free(dst);
    }
}

int main(void) {
    check_simd_selected();
    check_transpose();
    check_pool();
    check_pool_claims();
    check_pool_sleepers();
    check_reduction_order();
    check_fp4_rule4();
    check_nvfp4_rules();
    check_int_rules();
    check_pair_bound();
    check_int_bound();
    check_fp8_no_denormal_operands();
    check_fp8_decodes();
    static const struct { wformat fmt; int rows, cols, f32_scales; } cases[] = {
        {WF_F32, 37, 45, 0},     {WF_F32, 20, 256, 0},    {WF_BF16, 29, 77, 0},    {WF_BF16, 16, 512, 0},
        {WF_FP8, 150, 200, 0},   {WF_FP8, 131, 256, 0},   {WF_FP8, 7, 24, 0},      {WF_FP8, 150, 200, 1},
        {WF_FP8, 260, 384, 1},   {WF_FP8, 7, 24, 1},      {WF_FP4, 41, 96, 0},     {WF_FP4, 33, 80, 0},
        {WF_FP4, 9, 40, 0},      {WF_FP4, 5, 34, 0},      {WF_FP4, 130, 512, 0},   {WF_FP4, 7, 64, 0},
        {WF_FP4, 11, 120, 0},    {WF_FP4, 6, 4096, 0},    {WF_I8_ROW, 37, 45, 0},  {WF_I8_ROW, 20, 256, 0},
        {WF_I8_ROW, 5, 16, 0},   {WF_I4_ROW, 29, 77, 0},  {WF_I4_ROW, 16, 512, 0}, {WF_I4_ROW, 9, 33, 0},
        {WF_I4_G64, 41, 96, 0},  {WF_I4_G64, 33, 64, 0},  {WF_I4_G64, 9, 40, 0},   {WF_I4_G64, 130, 512, 0},
        {WF_I4_G64, 7, 130, 0},  {WF_I4_G64, 11, 200, 0}, {WF_I4_G64, 6, 4096, 0},
        {WF_NVFP4, 41, 96, 0},   {WF_NVFP4, 33, 80, 1},   {WF_NVFP4, 9, 48, 0},    {WF_NVFP4, 5, 16, 1},
        {WF_NVFP4, 130, 512, 1}, {WF_NVFP4, 7, 64, 0},    {WF_NVFP4, 11, 112, 1},  {WF_NVFP4, 6, 4096, 0},
        /* batched column ranges (1024 columns on AVX-512, 256 on AVX2) with a partial last range and a tail */
        {WF_F32, 9, 1100, 0},    {WF_BF16, 50, 1030, 0},  {WF_FP8, 53, 1100, 0},   {WF_FP4, 13, 1120, 0},
        {WF_NVFP4, 13, 1104, 1}, {WF_I4_G64, 50, 1100, 0},
        /* FP8 in 64-column steps (GFNI), then a 32-column and a 16-column step and a tail */
        {WF_FP8, 19, 247, 0},
        /* batched rows past 1 MiB as f32 (128-row FP8 tasks, 48-row I8_ROW ones): decoded to BF16 */
        {WF_FP8, 130, 2100, 1},  {WF_I8_ROW, 50, 5500, 0}, {WF_BF16, 50, 5500, 0},
    };
    /* Nibble products with the integer partials, with the BF16 pairs, and with neither (the CPU
     * picks by speed); the other formats once. */
    for (int exact = 2; exact >= 0; exact--) {
        kernels_force_ints(exact == 2);
        kernels_force_pairs(exact == 1);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            if (exact == 2 || is_nibbles(cases[i].fmt))
                check_format(cases[i].fmt, cases[i].rows, cases[i].cols, cases[i].f32_scales);
    }
    kernels_force_pairs(-1);
    kernels_force_ints(-1);
    if (kernels_has_pairs())
        printf("  note: %s takes the BF16 pairs here (measured) for 1 input: %s, 4: %s, 12: %s\n", kernels_simd_name(),
               kernels_pairs_pay(1) ? "yes" : "no", kernels_pairs_pay(4) ? "yes" : "no", kernels_pairs_pay(12) ? "yes" : "no");
    if (kernels_has_ints())
        printf("  note: %s takes the integer partials here (measured) for FP4 matvecs: %s\n", kernels_simd_name(),
               kernels_ints_pay() ? "yes" : "no");
    return TEST_END();
}
