/* kernels_avx2.c — the AVX2+FMA+F16C path of the canonical reduction order (kernels_path.h).
 *
 * The 16 canonical lanes of one output live in two ymm registers (lanes 0..7 and 8..15), so a
 * group of 16 columns is two FMAs. Two FMA chains cannot hide the FMA latency, so matvec walks
 * four rows at once (eight independent chains), decoding each weight in registers just before
 * its FMA. Batched calls decode a few rows into an f32 buffer once, then run a 3x3 register
 * tile (3 weight rows x 3 input rows) over it, one lane half at a time, which uses 15 of the 16
 * ymm registers and loads 6 vectors per 9 FMAs (see avx2_rows_mul for the cache blocking). */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <string.h>

#include "kernels_path.h"
#include "quant.h"

#define INLINE static inline __attribute__((always_inline))
#define VEC_ROWS 4

/* Lane mask for columns [c, c + 8) that are < cols. */
INLINE __m256i tail_mask(int c, int cols) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(cols - c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* E4M3 bytes -> f16 bit pattern (value * 2^-8) -> f32, the unscaled FP8 weight factor. With
 * the byte in the high half of a 16-bit word, an arithmetic shift right by one puts exponent
 * and mantissa where f16 has them; the copy of the sign it leaves in bit 14 is masked off. */
INLINE void dec16_fp8(const uint8_t *p, __m256 v[2]) {
    __m256i b = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
    __m256i h = _mm256_and_si256(_mm256_srai_epi16(b, 1), _mm256_set1_epi16((short)0xbfff));
    v[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    v[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* 16 bytes = 32 E2M1 codes, low nibble first. For each 8 columns, their 4 bytes are broadcast
 * and shifted so lane j holds code j in its low bits; a permute picks the magnitude (it reads
 * bits 0..2) from `table`, and XOR with the code shifted to bits 28..31 sets the sign (bit 3 ->
 * bit 31). The table entries are stored with their own index pre-XORed into bits 28..30, so
 * that XOR restores them exactly (see fp4_table). */
INLINE void dec32_fp4(const uint8_t *p, __m256 table, __m256 v[4]) {
    const __m256i to_low = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        int32_t word;
        memcpy(&word, p + 4 * k, 4);
        __m256i codes = _mm256_srlv_epi32(_mm256_set1_epi32(word), to_low);
        __m256 mag = _mm256_permutevar8x32_ps(table, codes);
        v[k] = _mm256_xor_ps(mag, _mm256_castsi256_ps(_mm256_slli_epi32(codes, 28)));
    }
}

/* The 8 E2M1 magnitudes times the block's scale factor, entry m XORed with m << 28. */
INLINE __m256 fp4_table(float scale) {
    __m256 mags = _mm256_mul_ps(_mm256_loadu_ps(kernel_fp4_lut), _mm256_set1_ps(scale));
    return _mm256_xor_ps(mags, _mm256_castsi256_ps(_mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28,
                                                                      6 << 28, 7 << 28)));
}

INLINE void dec16_bf16(const uint16_t *p, __m256 v[2]) {
    __m256i u = _mm256_loadu_si256((const __m256i *)p);
    v[0] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(u)), 16));
    v[1] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(u, 1)), 16));
}

/* Columns per decode step: one 32-column scale block for FP4, one 16-column group otherwise. */
INLINE int step_cols(wformat f) { return f == WF_FP4 ? 32 : 16; }

/* Weight factors of columns [c, c + step_cols); `table` is FP4's fp4_table, else unused. */
INLINE void decode_step(wformat f, const uint8_t *row, int c, __m256 table, __m256 v[4]) {
    switch (f) {
    case WF_F32:
        v[0] = _mm256_loadu_ps((const float *)row + c);
        v[1] = _mm256_loadu_ps((const float *)row + c + 8);
        break;
    case WF_BF16: dec16_bf16((const uint16_t *)row + c, v); break;
    case WF_FP8: dec16_fp8(row + c, v); break;
    case WF_FP4: dec32_fp4(row + c / 2, table, v); break;
    }
}

/* Columns [c, cols), fewer than one step, through the scalar dequantizer, zero-padded to 16:
 * FMA into acc (x read with masks, nothing past cols touched) or store to out. */
static void tail_groups(const qmat *w, int r, int c, const float *x, __m256 acc[2], float *out) {
    for (; c < w->cols; c += 16) {
        float wt[16] __attribute__((aligned(32)));
        for (int i = 0; i < 16; i++) wt[i] = kernel_weight(w, r, c + i);
        __m256 lo = _mm256_load_ps(wt), hi = _mm256_load_ps(wt + 8);
        if (out) {
            _mm256_store_ps(out + c, lo);
            _mm256_store_ps(out + c + 8, hi);
        } else {
            acc[0] = _mm256_fmadd_ps(lo, _mm256_maskload_ps(x + c, tail_mask(c, w->cols)), acc[0]);
            acc[1] = _mm256_fmadd_ps(hi, _mm256_maskload_ps(x + c + 8, tail_mask(c + 8, w->cols)), acc[1]);
        }
    }
}

/* Canonical lane tree: lo+hi pairs lanes i and i+8, then 4 apart, 2 apart, 1 apart. */
INLINE float tree16(__m256 lo, __m256 hi) {
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

/* y[i] = dot(row r + i, x) for i < NR, the rows interleaved column step by column step.
 * These are VEC_ROWS short streams (2 KiB per FP4 row of 4096 columns), too short for the
 * hardware prefetchers to ramp up, so each row prefetches the same offset of the row VEC_ROWS
 * further on: the rows this thread reads next. */
INLINE void dot_rows(const qmat *w, wformat f, int r, int NR, const float *x, float *y) {
    const int S = step_cols(f), full = w->cols / S * S;
    const size_t ahead = (size_t)(kernel_row_ptr(w, VEC_ROWS) - kernel_row_ptr(w, 0));
    const uint8_t *row[VEC_ROWS], *srow[VEC_ROWS];
    __m256 acc[VEC_ROWS][2], table[VEC_ROWS] = {_mm256_setzero_ps()};
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        row[i] = kernel_row_ptr(w, r + i);
        srow[i] = kernel_scale_row(w, r + i);
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    }
    for (int c = 0; c < full; c += S) {
        if (f == WF_FP4) {    /* a new scale block every step; FP8's scale is on the input */
            #pragma GCC unroll 4
            for (int i = 0; i < NR; i++) table[i] = fp4_table(kernel_fp4_scale_lut[srow[i][c / 32]]);
        }
        if (kernel_col_bytes(f, c) % 64 == 0) {
            #pragma GCC unroll 4
            for (int i = 0; i < NR; i++)
                _mm_prefetch((const char *)row[i] + kernel_col_bytes(f, c) + ahead, _MM_HINT_T0);
        }
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            __m256 v[4];
            decode_step(f, row[i], c, table[i], v);
            #pragma GCC unroll 4
            for (int g = 0; g < S; g += 16) {
                acc[i][0] = _mm256_fmadd_ps(v[g / 8], _mm256_loadu_ps(x + c + g), acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(v[g / 8 + 1], _mm256_loadu_ps(x + c + g + 8), acc[i][1]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        if (full < w->cols) tail_groups(w, r + i, full, x, acc[i], NULL);
        y[i] = tree16(acc[i][0], acc[i][1]);
    }
}

/* Row r's weight factors (rule 1) into out, zero-padded to a multiple of 16. */
INLINE void decode_row(const qmat *w, wformat f, int r, float *out) {
    const int S = step_cols(f), full = w->cols / S * S;
    const uint8_t *row = kernel_row_ptr(w, r), *srow = kernel_scale_row(w, r);
    __m256 table = _mm256_setzero_ps(), v[4];
    for (int c = 0; c < full; c += S) {
        if (f == WF_FP4) table = fp4_table(kernel_fp4_scale_lut[srow[c / 32]]);
        decode_step(f, row, c, table, v);
        #pragma GCC unroll 4
        for (int g = 0; g < S / 8; g++) _mm256_store_ps(out + c + 8 * g, v[g]);
    }
    if (full < w->cols) tail_groups(w, r, full, NULL, NULL, out);
}

static void avx2_rows_vec(const qmat *w, int r0, int r1, const float *x, float *y) {
    int r = r0;
    for (; r + VEC_ROWS <= r1; r += VEC_ROWS)
        KERNEL_FOR_EACH_FORMAT(w->fmt, dot_rows(w, F, r, VEC_ROWS, x, y + (r - r0)))
    for (; r < r1; r++) KERNEL_FOR_EACH_FORMAT(w->fmt, dot_rows(w, F, r, 1, x, y + (r - r0)))
}

/* Batched multiply. Lane halves and column chunks keep the working set in L1: for each chunk of
 * MUL_CHUNK columns, every 3x3 tile of (weight row, input row) pairs runs lanes 0..7 and then
 * lanes 8..15 over the chunk, the second pass re-reading the same cache lines. The partial lanes
 * live in acc[input row][weight row][16] between chunks; each lane still sees its columns in
 * order, so the canonical order holds. */
#define MUL_CHUNK 256
#define MUL_XROWS 12     /* input rows per pass: their chunk, the weight chunk and acc fit in L1 */

/* One lane half h of an NR x NX tile over columns [c0, c1) (c1 - c0 a multiple of 16, or the
 * row end, whose partial group is read with masks). wb rows are zero-padded to ldw. */
INLINE void tile_half(const float *wb, int ldw, const float *x, int cols, int c0, int c1, int NR, int NX, int h,
                      float *acc, int nr_all) {
    __m256 a[3][3];
    const int full_end = c1 & ~15;
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
        #pragma GCC unroll 4
        for (int j = 0; j < NX; j++) a[i][j] = _mm256_load_ps(acc + ((size_t)j * nr_all + i) * 16 + h * 8);
    for (int c = c0 + h * 8; c < full_end; c += 16) {
        __m256 wv[3], xv[3];
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) wv[i] = _mm256_load_ps(wb + (size_t)i * ldw + c);
        #pragma GCC unroll 4
        for (int j = 0; j < NX; j++) {
            xv[j] = _mm256_loadu_ps(x + (size_t)j * cols + c);
            /* Keep the input in a register: folded into each FMA it would be loaded NR times. */
            __asm__("" : "+x"(xv[j]));
        }
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++)
            #pragma GCC unroll 4
            for (int j = 0; j < NX; j++) a[i][j] = _mm256_fmadd_ps(wv[i], xv[j], a[i][j]);
    }
    if (full_end < c1) {
        int c = full_end + h * 8;
        __m256i m = tail_mask(c, cols);
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            __m256 wv = _mm256_load_ps(wb + (size_t)i * ldw + c);
            #pragma GCC unroll 4
            for (int j = 0; j < NX; j++)
                a[i][j] = _mm256_fmadd_ps(wv, _mm256_maskload_ps(x + (size_t)j * cols + c, m), a[i][j]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
        #pragma GCC unroll 4
        for (int j = 0; j < NX; j++) _mm256_store_ps(acc + ((size_t)j * nr_all + i) * 16 + h * 8, a[i][j]);
}

#define TILE_CASE(nr, nx)                                                            \
    case (nr) * 4 + (nx):                                                            \
        tile_half(wb, ldw, x, cols, c0, c1, nr, nx, 0, acc, nr_all);                 \
        tile_half(wb, ldw, x, cols, c0, c1, nr, nx, 1, acc, nr_all);                 \
        break

static void tile_chunk(const float *wb, int ldw, const float *x, int cols, int c0, int c1, int nr, int nx, float *acc,
                       int nr_all) {
    switch (nr * 4 + nx) {
        TILE_CASE(1, 1); TILE_CASE(1, 2); TILE_CASE(1, 3);
        TILE_CASE(2, 1); TILE_CASE(2, 2); TILE_CASE(2, 3);
        TILE_CASE(3, 1); TILE_CASE(3, 2); TILE_CASE(3, 3);
    }
}

static void avx2_rows_mul(const qmat *w, int r0, int r1, const float *x, int n, float *y, int ldy) {
    const int cols = w->cols, ldw = (cols + 15) & ~15, nr = r1 - r0;
    float *wb = kernel_scratch((size_t)nr * ldw + (size_t)MUL_XROWS * nr * 16);
    float *acc = wb + (size_t)nr * ldw;
    for (int r = r0; r < r1; r++) KERNEL_FOR_EACH_FORMAT(w->fmt, decode_row(w, F, r, wb + (size_t)(r - r0) * ldw))
    for (int j0 = 0; j0 < n; j0 += MUL_XROWS) {
        int nx_all = n - j0 < MUL_XROWS ? n - j0 : MUL_XROWS;
        const float *xg = x + (size_t)j0 * cols;
        memset(acc, 0, sizeof(float) * (size_t)nx_all * nr * 16);
        for (int c0 = 0; c0 < cols; c0 += MUL_CHUNK) {
            int c1 = c0 + MUL_CHUNK < cols ? c0 + MUL_CHUNK : cols;
            for (int j = 0; j < nx_all; j += 3)
                for (int i = 0; i < nr; i += 3)
                    tile_chunk(wb + (size_t)i * ldw, ldw, xg + (size_t)j * cols, cols, c0, c1, nr - i < 3 ? nr - i : 3,
                               nx_all - j < 3 ? nx_all - j : 3, acc + ((size_t)j * nr + i) * 16, nr);
        }
        for (int j = 0; j < nx_all; j++)
            for (int i = 0; i < nr; i++) {
                const float *a = acc + ((size_t)j * nr + i) * 16;
                y[(size_t)(j0 + j) * ldy + i] = tree16(_mm256_load_ps(a), _mm256_load_ps(a + 8));
            }
    }
}

const kernel_path kernel_path_avx2 = {"avx2", avx2_rows_vec, avx2_rows_mul};

#endif
