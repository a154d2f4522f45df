/* kernels_avx2.c — the AVX2+FMA+F16C path of the canonical reduction order (kernels_path.h).
 *
 * The 16 canonical lanes of one output live in two ymm registers (lanes 0..7 and 8..15), so a
 * group of 16 columns is two FMAs. Two FMA chains cannot hide the FMA latency, so matvec walks
 * four rows at once (eight independent chains), decoding each weight in registers just before
 * its FMA. Batched calls decode a few rows into an f32 buffer once, then run a 3x3 register
 * tile (3 weight rows x 3 input rows) over it, one lane half at a time, which uses 15 of the 16
 * ymm registers and loads 6 vectors per 9 FMAs (see avx2_rows_mul for the cache blocking).
 * The nibble formats (FP4, NVFP4, I4_ROW, I4_G64) follow rule 4: 64 columns (two scale blocks) decode
 * with byte shuffles through the format's table into eight vectors laid out as
 * kernel_nibble_permute_x orders the input (width 8), so no shuffles touch x or acc. I8_ROW is a rule-2
 * format whose codes widen to f32 exactly; its row scale multiplies the result (rule 5). */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

#include "kernels_path.h"
#include "quant.h"

#define INLINE static inline __attribute__((always_inline))
#define VEC_ROWS 4

/* Lane mask for columns [c, c + 8) that are < cols. */
INLINE __m256i tail_mask(int c, int cols) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(cols - c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* E4M3 bytes -> f16 bit pattern (value * 2^-8) -> f32, the unscaled FP8 weight factor. Unpacking
 * with zero bytes puts each byte in the high half of a 16-bit word; an arithmetic shift right by
 * one then puts exponent and mantissa where f16 has them, and the copy of the sign it leaves in
 * bit 14 is masked off. (128-bit unpacks: cheaper than widening to 256 bits and splitting.) */
INLINE void dec16_fp8(const uint8_t *p, __m256 v[2]) {
    const __m128i zero = _mm_setzero_si128(), keep = _mm_set1_epi16((short)0xbfff);
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    v[0] = _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16(_mm_unpacklo_epi8(zero, b), 1), keep));
    v[1] = _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16(_mm_unpackhi_epi8(zero, b), 1), keep));
}

/* The two byte tables of a nibble format (kernel_nibble_bf16_lo/hi), in both 128-bit halves. */
INLINE void nibble_tables(wformat f, __m256i *lo_bytes, __m256i *hi_bytes) {
    int t = kernel_nibble_is_e2m1(f) ? 0 : 1;
    *lo_bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kernel_nibble_bf16_lo[t]));
    *hi_bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kernel_nibble_bf16_hi[t]));
}

/* 32 bytes = 64 codes = scale blocks b (128-bit half 0) and b + 1 (half 1). Each nibble indexes
 * two 16-byte tables, the low and the high byte of bf16(weight factor of the code) (exact: small
 * integers); interleaving the two lookups makes bf16 words, in which byte k of a half (columns
 * 2k, 2k + 1) gives word k of the even-column and of the odd-column vector. A dword's low word
 * becomes f32 by a shift, its high word by a mask. Result v[t] (t < 4), half h, lane j is
 * column 4j + t of block b + h, and v[4 + t] is column 16 + 4j + t: rule 4's lanes. */
INLINE void dec64_nibbles(const uint8_t *p, __m256i lo_bytes, __m256i hi_bytes, __m256 v[8]) {
    const __m256i nibble = _mm256_set1_epi8(0x0f), high_word = _mm256_set1_epi32((int)0xffff0000u);
    __m256i b = _mm256_loadu_si256((const __m256i *)p);
    __m256i even = _mm256_and_si256(b, nibble), odd = _mm256_and_si256(_mm256_srli_epi16(b, 4), nibble);
    __m256i even_lo = _mm256_shuffle_epi8(lo_bytes, even), even_hi = _mm256_shuffle_epi8(hi_bytes, even);
    __m256i odd_lo = _mm256_shuffle_epi8(lo_bytes, odd), odd_hi = _mm256_shuffle_epi8(hi_bytes, odd);
    __m256i words[4] = {_mm256_unpacklo_epi8(even_lo, even_hi), _mm256_unpacklo_epi8(odd_lo, odd_hi),
                        _mm256_unpackhi_epi8(even_lo, even_hi), _mm256_unpackhi_epi8(odd_lo, odd_hi)};
    #pragma GCC unroll 2
    for (int k = 0; k < 2; k++) {
        __m256i e = words[2 * k], o = words[2 * k + 1];
        v[4 * k + 0] = _mm256_castsi256_ps(_mm256_slli_epi32(e, 16));
        v[4 * k + 1] = _mm256_castsi256_ps(_mm256_slli_epi32(o, 16));
        v[4 * k + 2] = _mm256_castsi256_ps(_mm256_and_si256(e, high_word));
        v[4 * k + 3] = _mm256_castsi256_ps(_mm256_and_si256(o, high_word));
    }
}

/* Rule 4's scale factors of lanes 0..7 (s[0]) and 8..15 (s[1]): blocks b (128-bit half 0) and
 * b + 1 (half 1); b is even, so both blocks of I4_G64 lie in one group and I4_ROW has one
 * scale. Only NVFP4 scales lanes 8..15 (the second 16 columns of each block) apart. */
INLINE void nibble_scales(wformat f, const void *srow, int b, __m256 s[2]) {
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        if (f == WF_I4_ROW || f == WF_I4_G64) s[h] = _mm256_set1_ps(kernel_nibble_scale(f, srow, b, h));
        else s[h] = _mm256_setr_m128(_mm_set1_ps(kernel_nibble_scale(f, srow, b, h)),
                                     _mm_set1_ps(kernel_nibble_scale(f, srow, b + 1, h)));
    }
}

/* One 64-column chunk of rule 4: each lane's 4-term partial, then acc = fma(p, scale, acc).
 * x is in kernel_nibble_permute_x order. */
INLINE void nibble_chunk(const __m256 v[8], const float *x, const __m256 scale[2], __m256 acc[2]) {
    __m256 p0 = _mm256_mul_ps(v[0], _mm256_loadu_ps(x)), p1 = _mm256_mul_ps(v[4], _mm256_loadu_ps(x + 32));
    #pragma GCC unroll 3
    for (int t = 1; t < 4; t++) {
        p0 = _mm256_fmadd_ps(v[t], _mm256_loadu_ps(x + 8 * t), p0);
        p1 = _mm256_fmadd_ps(v[4 + t], _mm256_loadu_ps(x + 32 + 8 * t), p1);
    }
    acc[0] = _mm256_fmadd_ps(p0, scale[0], acc[0]);
    acc[1] = _mm256_fmadd_ps(p1, scale[1], acc[1]);
}

INLINE void dec16_bf16(const uint16_t *p, __m256 v[2]) {
    __m256i u = _mm256_loadu_si256((const __m256i *)p);
    v[0] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(u)), 16));
    v[1] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(u, 1)), 16));
}

/* 16 int8 codes -> f32 (exact). */
INLINE void dec16_i8(const uint8_t *p, __m256 v[2]) {
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
}

/* Weight factors of columns [c, c + 16) for the rule-2 formats (the nibble formats have their own
 * functions). */
INLINE void decode_step(wformat f, const uint8_t *row, int c, __m256 v[2]) {
    if (f == WF_F32) {
        v[0] = _mm256_loadu_ps((const float *)row + c);
        v[1] = _mm256_loadu_ps((const float *)row + c + 8);
    } else if (f == WF_BF16) {
        dec16_bf16((const uint16_t *)row + c, v);
    } else if (f == WF_FP8) {
        dec16_fp8(row + c, v);
    } else {
        dec16_i8(row + c, v);
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

/* y[i] = dot(row r + i, x) for i < NR, the rows interleaved 16 columns at a time.
 * These are VEC_ROWS short streams (4 KiB per FP8 row of 4096 columns), too short for the
 * hardware prefetchers to ramp up, so each row prefetches the same offset of the row VEC_ROWS
 * further on: the rows this thread reads next, and one line in four also far ahead
 * (kernel_prefetch_far). */
INLINE void dot_rows(const qmat *w, wformat f, int r, int NR, const float *x, float *y) {
    const int full = w->cols / 16 * 16;
    const size_t ahead = kernel_group_ahead(w, VEC_ROWS);
    const uint8_t *end = kernel_row_ptr(w, w->rows);
    const uint8_t *row[VEC_ROWS];
    __m256 acc[VEC_ROWS][2];
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        row[i] = kernel_row_ptr(w, r + i);
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    }
    for (int c = 0; c < full; c += 16) {
        if (kernel_col_bytes(f, c) % 64 == 0) {
            #pragma GCC unroll 4
            for (int i = 0; i < NR; i++) {
                _mm_prefetch((const char *)row[i] + kernel_col_bytes(f, c) + ahead, _MM_HINT_T0);
                if (kernel_col_bytes(f, c) % 256 == 0) kernel_prefetch_far(row[i] + kernel_col_bytes(f, c), end);
            }
        }
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            __m256 v[2];
            decode_step(f, row[i], c, v);
            acc[i][0] = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + c), acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x + c + 8), acc[i][1]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        if (full < w->cols) tail_groups(w, r + i, full, x, acc[i], NULL);
        y[i] = kernel_row_finish(w, r + i, tree16(acc[i][0], acc[i][1]));
    }
}

/* Rule 4 for the blocks past the last full 64-column chunk, then the tree and rule 5. */
static float nibble_finish(const qmat *w, int r, int full, const float *x, const __m256 acc[2]) {
    if (full == w->cols) return kernel_row_finish(w, r, tree16(acc[0], acc[1]));
    float a[16] __attribute__((aligned(32)));
    _mm256_store_ps(a, acc[0]);
    _mm256_store_ps(a + 8, acc[1]);
    kernel_nibble_blocks(w, r, full / 32, x, a);
    return kernel_row_finish(w, r, kernel_tree16(a));
}

/* Nibble-format matvec (rule 4) of NR interleaved rows, x in kernel_nibble_permute_x order;
 * prefetching the next row group in memory order, as the AVX-512 path does. */
INLINE void nibble_dot_rows(const qmat *w, wformat f, int r, int NR, const float *x, float *y) {
    const int full = w->cols / 64 * 64;
    const size_t ahead = kernel_group_ahead(w, VEC_ROWS);
    const uint8_t *end = kernel_row_ptr(w, w->rows);
    const uint8_t *row[VEC_ROWS];
    const void *srow[VEC_ROWS];
    __m256i lo_bytes, hi_bytes;
    __m256 acc[VEC_ROWS][2];
    nibble_tables(f, &lo_bytes, &hi_bytes);
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        row[i] = kernel_row_ptr(w, r + i);
        srow[i] = kernel_nibble_scale_row(w, r + i);
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    }
    for (int c = 0; c < full; c += 64) {
        if (c % 128 == 0) kernel_prefetch_next_group(row[0], NR, (size_t)c / 2, ahead, end);
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            __m256 v[8], scale[2];
            dec64_nibbles(row[i] + c / 2, lo_bytes, hi_bytes, v);
            nibble_scales(f, srow[i], c / 32, scale);
            nibble_chunk(v, x + c, scale, acc[i]);
        }
    }
    for (int i = 0; i < NR; i++) y[i] = nibble_finish(w, r + i, full, x, acc[i]);
}

/* Row r's weight factors (rule 1) into out, zero-padded to a multiple of 16. */
INLINE void decode_row(const qmat *w, wformat f, int r, float *out) {
    const int full = w->cols / 16 * 16;
    const uint8_t *row = kernel_row_ptr(w, r);
    __m256 v[2];
    for (int c = 0; c < full; c += 16) {
        decode_step(f, row, c, v);
        _mm256_store_ps(out + c, v[0]);
        _mm256_store_ps(out + c + 8, v[1]);
    }
    if (full < w->cols) tail_groups(w, r, full, NULL, NULL, out);
}

static void avx2_rows_vec(const qmat *w, int r0, int r1, const float *x, float *y) {
    int r = r0;
    for (; r + VEC_ROWS <= r1; r += VEC_ROWS)
        KERNEL_FOR_EACH_FORMAT(w->fmt, dot_rows(w, F, r, VEC_ROWS, x, y + (r - r0)),
                               nibble_dot_rows(w, F, r, VEC_ROWS, x, y + (r - r0)))
    for (; r < r1; r++)
        KERNEL_FOR_EACH_FORMAT(w->fmt, dot_rows(w, F, r, 1, x, y + (r - r0)),
                               nibble_dot_rows(w, F, r, 1, x, y + (r - r0)))
}

/* Nibble-format batched multiply: each weight row is decoded once into rule 4's vector order,
 * then up to NIBBLE_XROWS input rows at a time run over it, sharing each weight vector load. */
#define NIBBLE_XROWS 3

INLINE void nibble_rows_x(const float *wb, const qmat *w, wformat f, int r, const float *x, int NX, float *y,
                          int ldy) {
    const int cols = w->cols, full = cols / 64 * 64;
    const void *srow = kernel_nibble_scale_row(w, r);
    __m256 acc[NIBBLE_XROWS][2];
    #pragma GCC unroll 3
    for (int j = 0; j < NX; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int c = 0; c < full; c += 64) {
        __m256 p[NIBBLE_XROWS][2], scale[2];
        nibble_scales(f, srow, c / 32, scale);
        #pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            __m256 w0 = _mm256_load_ps(wb + c + 8 * t), w1 = _mm256_load_ps(wb + c + 32 + 8 * t);
            #pragma GCC unroll 3
            for (int j = 0; j < NX; j++) {
                const float *xj = x + (size_t)j * cols + c;
                __m256 x0 = _mm256_loadu_ps(xj + 8 * t), x1 = _mm256_loadu_ps(xj + 32 + 8 * t);
                p[j][0] = t ? _mm256_fmadd_ps(w0, x0, p[j][0]) : _mm256_mul_ps(w0, x0);
                p[j][1] = t ? _mm256_fmadd_ps(w1, x1, p[j][1]) : _mm256_mul_ps(w1, x1);
            }
        }
        #pragma GCC unroll 3
        for (int j = 0; j < NX; j++) {
            acc[j][0] = _mm256_fmadd_ps(p[j][0], scale[0], acc[j][0]);
            acc[j][1] = _mm256_fmadd_ps(p[j][1], scale[1], acc[j][1]);
        }
    }
    for (int j = 0; j < NX; j++) y[(size_t)j * ldy] = nibble_finish(w, r, full, x + (size_t)j * cols, acc[j]);
}

INLINE void nibble_rows_mul(const qmat *w, wformat f, int r0, int r1, const float *x, int n, float *y, int ldy) {
    const int full = w->cols / 64 * 64;
    float *wb = kernel_scratch((size_t)full);
    __m256i lo_bytes, hi_bytes;
    nibble_tables(f, &lo_bytes, &hi_bytes);
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = kernel_row_ptr(w, r);
        for (int c = 0; c < full; c += 64) {
            __m256 v[8];
            dec64_nibbles(row + c / 2, lo_bytes, hi_bytes, v);
            #pragma GCC unroll 8
            for (int t = 0; t < 8; t++) _mm256_store_ps(wb + c + 8 * t, v[t]);
        }
        float *yr = y + (r - r0);
        int j = 0;
        for (; j + NIBBLE_XROWS <= n; j += NIBBLE_XROWS)
            nibble_rows_x(wb, w, f, r, x + (size_t)j * w->cols, NIBBLE_XROWS, yr + (size_t)j * ldy, ldy);
        for (; j < n; j++) nibble_rows_x(wb, w, f, r, x + (size_t)j * w->cols, 1, yr + (size_t)j * ldy, ldy);
    }
}

/* Batched multiply. Lane halves and column chunks keep the working set in L1: for each chunk of
 * MUL_CHUNK columns, every 3x3 tile of (weight row, input row) pairs runs lanes 0..7 and then
 * lanes 8..15 over the chunk, the second pass re-reading the same cache lines. The partial lanes
 * live in acc[input row][weight row][16] between chunks; each lane still sees its columns in
 * order, so the canonical order holds. */
#define MUL_CHUNK 256
#define MUL_XROWS 12     /* input rows per pass: their chunk, the weight chunk and acc fit in L1 */

/* One lane half h of an NR x NX tile over columns [c0, c1) (c1 - c0 a multiple of 16, or the
 * row end, whose partial group is read with masks). wb rows are zero-padded to ldw. The first
 * range (c0 == 0) starts the lanes from zero rather than reading acc. */
INLINE void tile_half(const float *wb, int ldw, const float *x, int cols, int c0, int c1, int NR, int NX, int h,
                      float *acc, int nr_all) {
    __m256 a[3][3];
    const int full_end = c1 & ~15;
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
        #pragma GCC unroll 4
        for (int j = 0; j < NX; j++)
            a[i][j] = c0 ? _mm256_load_ps(acc + ((size_t)j * nr_all + i) * 16 + h * 8) : _mm256_setzero_ps();
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
    if (kernel_is_nibbles(w->fmt)) {
        KERNEL_FOR_EACH_FORMAT(w->fmt, (void)0, nibble_rows_mul(w, F, r0, r1, x, n, y, ldy))
        return;
    }
    for (int r = r0; r < r1; r++)
        KERNEL_FOR_EACH_FORMAT(w->fmt, decode_row(w, F, r, wb + (size_t)(r - r0) * ldw), (void)0)
    for (int j0 = 0; j0 < n; j0 += MUL_XROWS) {
        int nx_all = n - j0 < MUL_XROWS ? n - j0 : MUL_XROWS;
        const float *xg = x + (size_t)j0 * cols;
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
                float sum = tree16(_mm256_load_ps(a), _mm256_load_ps(a + 8));
                y[(size_t)(j0 + j) * ldy + i] = kernel_row_finish(w, r0 + i, sum);
            }
    }
}

/* One 8 x 8 block: rows to columns in three rounds of shuffles (pairs, quads, halves). */
static void transpose8(const float *src, size_t lds, float *dst, size_t ldd) {
    __m256 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + (size_t)i * lds);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + (size_t)i * ldd, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(dst + (size_t)(i + 4) * ldd, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
}

void kernel_transpose_avx2(const float *src, int rows, int cols, size_t lds, float *dst, size_t ldd) {
    int r8 = rows / 8 * 8, c8 = cols / 8 * 8;
    for (int r = 0; r < r8; r += 8)
        for (int c = 0; c < c8; c += 8) transpose8(src + (size_t)r * lds + c, lds, dst + (size_t)c * ldd + r, ldd);
    kernel_transpose_scalar(src, 0, rows, c8, cols, lds, dst, ldd);
    kernel_transpose_scalar(src, r8, rows, 0, c8, lds, dst, ldd);
}

const kernel_path kernel_path_avx2 = {"avx2", avx2_rows_vec, avx2_rows_mul, 8, NULL, kernel_transpose_avx2,
                                      NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL};

#endif
