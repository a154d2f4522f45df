/* kernels_avx512.c — the AVX-512 (F + BW) path of the canonical reduction order (kernels_path.h).
 *
 * One zmm holds all 16 canonical lanes of an output, so a group of 16 columns is one FMA and
 * the tree starts by adding the two 256-bit halves (lanes i and i+8), exactly as the other paths
 * do. FP8 (unscaled) decodes as in the AVX2 path, BF16 by one byte permute where VBMI exists
 * (widen_bf16); matvec decodes 32 columns per step (FP8: one zmm of f16 patterns, two
 * conversions). Matvec interleaves four rows for independent FMA chains, decoding in registers;
 * so do batches of up to FEW_BATCH input rows (NIB_FEW_BATCH for the nibble formats: batched
 * decode across conversations, MoE experts with few tokens), each decoded vector serving up to
 * FEW_X inputs. Larger batches run a 4x6 register tile (4 weight rows x 6
 * input rows: 24 accumulators, 10 loads per 24 FMAs, so the FMA ports and not the load ports
 * set the pace) over rows dequantized to f32, or where those would crowd L2, BF16 rows in place
 * and FP8 and I8_ROW rows dequantized only into BF16: the tile widens those as it loads them.
 * With GFNI and VBMI the FP8 matvec decodes 64 codes per step (fp8_factors64). I8_ROW widens its
 * codes and takes the row scale on the result (rule 5).
 * The nibble formats (rule 4: FP4, NVFP4, I4_ROW, I4_G64) hold all 16 lanes in one zmm too: a 64-column
 * chunk decodes into four vectors, term t of every lane (kernel_nibble_permute_x width 16), by
 * one vpermps table lookup each, so a chunk is four FMAs of partials and one FMA by the scale
 * vector. Batched calls decode each weight row once into that layout (codes and the chunk's
 * scale vector) and run a NIB_R x NIB_X register tile of (weight row, input row) pairs over
 * column ranges of NIB_KC chunks, the pairs' lanes kept in memory between ranges as the rule-2 tile
 * keeps them: MoE experts see a handful of tokens each, and every one of them reuses the decoded
 * tile instead of decoding the weights again. Both tiles load each input vector once into a
 * register for all weight rows of the tile (folded into every FMA, the loads would compete with
 * the FMAs for the load ports). Range sizes, task sizes and tile shapes only change which
 * partial sums sit in registers or memory, never the order in which a lane adds its terms.
 * While a batched call's tiles compute, the rows after its own stream into L2 (row_stream), and
 * its outputs are reduced 16 weight rows at a time (tree16x16), in rule 3's order. Where an
 * input's partials are exact, they may come from BF16 dot products (the pairs) or, for FP4
 * matvecs with VNNI, from integer dot products (the integer partials): the same bits, faster
 * where the CPU says so. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "kernels_path.h"
#include "quant.h"
#include "util.h"

#define INLINE static inline __attribute__((always_inline))
#define VEC_ROWS 4
#define FEW_X 4          /* inputs per register pass of dot_rows: VEC_ROWS x FEW_X accumulators */
#define FEW_BATCH 8      /* batches up to this many inputs decode in registers (two passes of 4) */
/* The same for the nibble formats, whose tile pays a decoded row's stores (five vectors per 64
 * columns) and which the register kernel decodes once per four inputs at eight uops. One
 * thread, FP4 1024 x 2048 in L2, GFLOP/s tile / register kernel, Xeon, with the tile decoding
 * each range just before its first use (nibble_rows_mul): n = 9 106 / 106, 12 120-121 / 116,
 * 16 127-128 / 116 (two threads from memory: n = 9 174-181 / 182-186, 12 189-200 / 200-207,
 * 16 216-218 / 201-211). */
#define NIB_FEW_BATCH 12
/* Columns per range of the rule-2 tile. A range's MUL_XROWS input slices (6 x 4 KiB) and a tile's
 * four weight rows (16 KiB as f32) fit a 48 KiB L1 together, as NIB_KC's do for the nibble tile,
 * and each tile call's fixed cost (its 24 lanes loaded and stored, its dispatch: 17 % of the
 * tile's samples at 512 columns) is spread over twice the columns. Xeon, prefill of two 256-token
 * prompts, alternated builds, tok/s median of 10-12: GLM 222 / 275 -> 242 / 290 (2048 columns:
 * 272), DeepSeek V4 127.9 -> 132.6, Inkling 333.1 -> 333.2. 512 was measured best on Zen 5. */
#define MUL_CHUNK 1024
#define MUL_XROWS 6       /* input rows per pass (one tile's width): few enough that their lines share L1 sets */
/* Decoded f32 rows of one batched call beyond this many bytes are BF16 instead (avx512_rows_mul).
 * The widening costs the tile a uop per weight vector beside its FMAs (two without VBMI: these
 * figures were measured so); an L2 full of rows costs more. Xeon (2 MiB L2), FP8 from memory, two
 * threads: 8192x1024 (128-row tasks, 512 KiB of f32 rows) n = 256 0.43 GB/s as f32 rows, 0.34 as
 * BF16; 2048x4096 (2 MiB) n = 256 0.29-0.33 and 0.34-0.38, n = 32 1.87-1.94 and 2.12-2.33. */
#define MUL_F32_ROWS_BYTES (1u << 20)
/* BF16 rows copy to f32 for batches of at least this many inputs (avx512_rows_mul). Measured with
 * the two-uop widening; with widen_bf16's one (Xeon, best/median of 5 alternated): 512x2048 at
 * n = 48 ties (one thread 127.9/122.1 copied, 126.5/121.9 in place), 2048x2048 at n = 256 still
 * favours the copy (two threads 235/216 against 225/183 GFLOP/s). */
#define BF16_COPY_MIN_N 32
/* FP8 rows up to this many bytes prefetch the next row group in memory order: DeepSeek V4's
 * wq_b shape (8192 x 1024, 64 matrices, from memory) 30-35 -> 38-46 GB/s on two threads,
 * 17-19 -> 20-24 on one; at 2 KiB and 4 KiB rows it measured 10-15 % slower than row by row. */
#define FP8_SHORT_ROW 1024
#define TILE_R 4
#define TILE_X 6

/* Inputs whose weights decode in registers (rows_few_inputs) rather than through a tile. */
INLINE int few_inputs(const qmat *w, int n) { return n <= (kernel_is_nibbles(w->fmt) ? NIB_FEW_BATCH : FEW_BATCH); }

/* The next group of a batch split into as few groups of at most `max` inputs as can hold the
 * `left` inputs, their sizes as even as they can be (13 -> 5, 4, 4 rather than 6, 6, 1): a
 * tile of one or two inputs loads its weights for too few FMAs. Which inputs share a tile
 * changes no sum. */
INLINE int input_group(int left, int max) {
    int groups = (left + max - 1) / max;
    return (left + groups - 1) / groups;
}

INLINE __mmask16 tail_mask(int c, int cols) {
    int left = cols - c;
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

/* E4M3 bytes -> f16 pattern (value * 2^-8, see the AVX2 path) -> f32, unscaled. */
INLINE __m512 dec16_fp8(const uint8_t *p) {
    __m256i b = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
    __m256i h = _mm256_and_si256(_mm256_srai_epi16(b, 1), _mm256_set1_epi16((short)0xbfff));
    return _mm512_cvtph_ps(h);
}

/* 16 BF16 codes (the low 256 bits) -> f32: each code becomes the high half of its lane. With
 * VBMI one zero-masking byte permute does it (one shuffle uop); otherwise a widening and a shift
 * (two uops on the ports the FMAs use, the larger cost of BF16 rows in the few-input kernels and
 * the tile: 8 FMAs per 32 columns beside 4 such uops with four inputs). */
INLINE __m512 widen_bf16(__m512i codes) {
#ifdef __AVX512VBMI__
    const __m512i high_halves = _mm512_set_epi32(0x1f1e0000, 0x1d1c0000, 0x1b1a0000, 0x19180000, 0x17160000, 0x15140000,
                                                 0x13120000, 0x11100000, 0x0f0e0000, 0x0d0c0000, 0x0b0a0000, 0x09080000,
                                                 0x07060000, 0x05040000, 0x03020000, 0x01000000);
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi8(0xccccccccccccccccULL, high_halves, codes));
#else
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(codes)), 16));
#endif
}

INLINE __m512 dec16_bf16(const uint16_t *p) {
    return widen_bf16(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)));
}

/* Weight factors of columns [c, c + 16) for the rule-2 formats (F32, BF16, FP8, I8_ROW). */
INLINE __m512 decode_step(wformat f, const uint8_t *row, int c) {
    if (f == WF_F32) return _mm512_loadu_ps((const float *)row + c);
    if (f == WF_BF16) return dec16_bf16((const uint16_t *)row + c);
    if (f == WF_FP8) return dec16_fp8(row + c);
    __m128i codes = _mm_loadu_si128((const __m128i *)(row + c));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes));
}

/* Weight factors of columns [c, c + 32) as two vectors. FP8 widens and shifts all 32 codes in
 * one zmm of f16 patterns before the two conversions: per column that is half the integer work
 * of two decode_step calls, and the FP8 matvec is bound by those shuffle and shift ports, not by
 * memory. The values are decode_step's, so the reduction order does not move. */
INLINE void decode_step2(wformat f, const uint8_t *row, int c, __m512 *lo, __m512 *hi) {
    if (f != WF_FP8) {
        *lo = decode_step(f, row, c);
        *hi = decode_step(f, row, c + 16);
        return;
    }
    __m512i b = _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(row + c))), 8);
    __m512i h = _mm512_and_si512(_mm512_srai_epi16(b, 1), _mm512_set1_epi16((short)0xbfff));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

/* FP8_STEP columns per dot_rows step. With GFNI and VBMI, FP8 decodes 64 columns at a time into
 * f32 factors (fp8_factors64); otherwise every format steps 32 columns (decode_step2). */
#if defined(__GFNI__) && defined(__AVX512VBMI__)
#define FP8_STEP 64

/* 64-code groups this thread decoded through f16 patterns (fp8_factors64), for the tests. */
static _Thread_local unsigned long long fp8_f16_groups;

/* 64 E4M3 codes -> their weight factors (dec16_fp8's: value * 2^-8, every one a normal f32),
 * columns c..c+15 in w[c / 16]. Each factor comes from a 16-bit pattern whose two bytes are each
 * a fixed bit permutation of the code plus a constant: one GF(2) affine transform per byte
 * (gf2p8affineqb: output bit i is the parity of the code and byte 7 - i of the matrix, XOR bit
 * i of the immediate), and byte unpacks interleave them into words (an unpack pairs the bytes of
 * each 128-bit lane, so a byte permute first puts the codes where their words should land).
 *
 * Where no code of the 64 has exponent field 0 (real checkpoints: a block's codes are scaled to
 * its largest, so subnormals and zeros are rare), the words are the factors' BF16 patterns
 * (s 0111eeee mmm0000: exponent e + 112, exact), placed so that word 2k of each half is column k
 * and word 2k + 1 column 16 + k: a dword shift then gives columns 0..15 as f32 and a mask columns
 * 16..31, with no shuffle. Eleven vector uops for 64 codes, four on the shuffle port (port 5 on a
 * Xeon, which also takes half the FMAs). A code with exponent field 0 has no such pattern (its
 * factor is an E4M3 subnormal but a normal f32), so those groups take f16 patterns
 * (s 0eeee mmm0000000, value * 2^-8 with f16's own subnormals) in column order (a second byte
 * permute) and the conversion, which costs a shuffle uop of its own: 18 uops, ten on the shuffle
 * port (15 and nine before the fast decode existed). Both give the same factors, so every sum is
 * the same either way.
 *
 * Placing the code's bits straight into an f32 for every code (value * 2^-120, no conversion;
 * ed7c23d..5d5bc5f) made subnormal codes f32 denormals, and an Intel core takes a microcode
 * assist for each FMA with a denormal operand: the FP8 matvec fell to 1.25 GB/s on a Xeon (bench
 * kernels; test_kernels checks MXCSR's denormal flag now). A table lookup of the factor's two top
 * bytes lost to the conversion there: 25.2 against 27.7-29.2 GB/s from memory on two threads. */
INLINE void fp8_factors64(const uint8_t *p, __m512 w[4]) {
    const __m512i interleaved = _mm512_set_epi8(63, 47, 62, 46, 61, 45, 60, 44, 31, 15, 30, 14, 29, 13, 28, 12,
                                                59, 43, 58, 42, 57, 41, 56, 40, 27, 11, 26, 10, 25, 9, 24, 8,
                                                55, 39, 54, 38, 53, 37, 52, 36, 23, 7, 22, 6, 21, 5, 20, 4,
                                                51, 35, 50, 34, 49, 33, 48, 32, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i in_order = _mm512_set_epi8(63, 62, 61, 60, 59, 58, 57, 56, 31, 30, 29, 28, 27, 26, 25, 24,
                                             55, 54, 53, 52, 51, 50, 49, 48, 23, 22, 21, 20, 19, 18, 17, 16,
                                             47, 46, 45, 44, 43, 42, 41, 40, 15, 14, 13, 12, 11, 10, 9, 8,
                                             39, 38, 37, 36, 35, 34, 33, 32, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i raw = _mm512_loadu_si512(p);
    __m512i codes = _mm512_permutexvar_epi8(interleaved, raw);
    if (!_mm512_testn_epi8_mask(codes, _mm512_set1_epi8(0x78))) {
        const __m512i high = _mm512_set1_epi64(0x1020400000000080LL), low = _mm512_set1_epi64(0x0000000001020408LL);
        const __m512i odd_words = _mm512_set1_epi32((int)0xffff0000u);
        __m512i h = _mm512_gf2p8affine_epi64_epi8(codes, high, 0x38), l = _mm512_gf2p8affine_epi64_epi8(codes, low, 0);
        __m512i lo = _mm512_unpacklo_epi8(l, h), hi = _mm512_unpackhi_epi8(l, h);
        w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16));
        w[1] = _mm512_castsi512_ps(_mm512_and_si512(lo, odd_words));
        w[2] = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
        w[3] = _mm512_castsi512_ps(_mm512_and_si512(hi, odd_words));
        return;
    }
    fp8_f16_groups++;
    const __m512i high = _mm512_set1_epi64(0x0204081020400080LL), low = _mm512_set1_epi64(0x0000000000000001LL);
    codes = _mm512_permutexvar_epi8(in_order, raw);
    __m512i h = _mm512_gf2p8affine_epi64_epi8(codes, high, 0), l = _mm512_gf2p8affine_epi64_epi8(codes, low, 0);
    __m512i lo = _mm512_unpacklo_epi8(l, h), hi = _mm512_unpackhi_epi8(l, h);
    w[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(lo));
    w[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(lo, 1));
    w[2] = _mm512_cvtph_ps(_mm512_castsi512_si256(hi));
    w[3] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(hi, 1));
}
#else
#define FP8_STEP 32
#endif

/* Columns [c, cols), fewer than 16, via the scalar dequantizer (zero-padded to 16). */
static __m512 tail_groups(const qmat *w, int r, int c, const float *x, __m512 acc, float *out) {
    for (; c < w->cols; c += 16) {
        float wt[16] __attribute__((aligned(64)));
        for (int i = 0; i < 16; i++) wt[i] = kernel_weight(w, r, c + i);
        __m512 v = _mm512_load_ps(wt);
        if (out) _mm512_store_ps(out + c, v);
        else acc = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(tail_mask(c, w->cols), x + c), acc);
    }
    return acc;
}

/* Canonical tree: lanes i + i+8 (the two halves), then 4 apart, 2 apart, 1 apart. */
INLINE float tree16(__m512 a) {
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

/* tree16 of 16 vectors at once: lane k of the result is tree16(a[k * stride ..]). Each level
 * adds the same two values, lower lanes first, as tree16 does for one vector (the pairs 8 apart,
 * then 4, 2, 1 apart), only with two outputs' partial sums side by side in a register: 15 adds
 * and 31 shuffles for 16 outputs instead of 7 + 7 each plus a store per output. */
INLINE __m512 tree16x16(const float *a, size_t stride) {
    __m512 v1[8], v2[4], v3[2];
    #pragma GCC unroll 8
    for (int m = 0; m < 8; m++) {       /* [a[2m] lanes i + i+8, a[2m+1] lanes i + i+8] */
        __m512 p = _mm512_load_ps(a + 2 * m * stride), q = _mm512_load_ps(a + (2 * m + 1) * stride);
        v1[m] = _mm512_add_ps(_mm512_shuffle_f32x4(p, q, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(p, q, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    #pragma GCC unroll 4
    for (int m = 0; m < 4; m++)         /* 128-bit lane l: the four sums 4 apart of a[4m + l] */
        v2[m] = _mm512_add_ps(_mm512_shuffle_f32x4(v1[2 * m], v1[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(v1[2 * m], v1[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    #pragma GCC unroll 2
    for (int m = 0; m < 2; m++)         /* lane l: the sums 2 apart of a[8m + l], then of a[8m + 4 + l] */
        v3[m] = _mm512_add_ps(_mm512_shuffle_ps(v2[2 * m], v2[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(v2[2 * m], v2[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lane l, element t: the result of a[4t + l]; put it at 4t + l */
    __m512 t = _mm512_add_ps(_mm512_shuffle_ps(v3[0], v3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(v3[0], v3[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, t);
}

/* kernel_row_finish of rows r .. r + 15 at once (the same operation per element). */
INLINE __m512 row_finish16(const qmat *w, int r, __m512 sum) {
    if (w->fmt == WF_NVFP4) {
        __m512 g = _mm512_set1_ps(w->global_scale);
        return w->global_divides ? _mm512_div_ps(sum, g) : _mm512_mul_ps(sum, g);
    }
    return w->fmt == WF_I8_ROW ? _mm512_mul_ps(sum, _mm512_loadu_ps(w->scale_f32 + r)) : sum;
}

/* y[i] = kernel_row_finish(tree16(acc + 16 * i)) for weight rows r0 + i, i < nr: rows in
 * groups of 16 through tree16x16, the rest one by one. */
static void finish_rows(const qmat *w, int r0, int nr, const float *acc, float *y) {
    int i = 0;
    for (; i + 16 <= nr; i += 16) _mm512_storeu_ps(y + i, row_finish16(w, r0 + i, tree16x16(acc + 16 * i, 16)));
    for (; i < nr; i++) y[i] = kernel_row_finish(w, r0 + i, tree16(_mm512_load_ps(acc + 16 * i)));
}

/* y[j * ldy + i] = dot(row r + i, input row j) for i < NR, j < NX (inputs cols apart), the rows
 * decoded in registers 16 columns at a time and each decoded vector used by all NX inputs:
 * matvec (NX = 1) and the few-input batches of batched decode, where decoding a row into a
 * buffer first would cost more than it saves. Prefetches one row group ahead: row by row as the
 * AVX2 path does, or for FP8 rows of at most FP8_SHORT_ROW bytes in memory order as the nibble
 * kernels do; and one line in four far ahead (kernel_prefetch_far). */
INLINE void dot_rows(const qmat *w, wformat f, int r, int NR, const float *x, int NX, float *y, int ldy) {
    const int cols = w->cols, full = cols / 16 * 16, pairs = cols / 32 * 32;
    const size_t ahead = kernel_group_ahead(w, VEC_ROWS);
    const int short_fp8_rows = f == WF_FP8 && cols <= FP8_SHORT_ROW;
    const uint8_t *end = kernel_row_ptr(w, w->rows);
    const uint8_t *row[VEC_ROWS];
    __m512 acc[VEC_ROWS][FEW_X];
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        row[i] = kernel_row_ptr(w, r + i);
        #pragma GCC unroll 4
        for (int j = 0; j < NX; j++) acc[i][j] = _mm512_setzero_ps();
    }
    /* Steps of 32 columns, or of FP8_STEP for FP8: a row's step decodes into step / 16 vectors,
     * then each input adds them in column order, so lane l adds c + l, c + 16 + l, ... For FP8
     * with more than one input each row loads the inputs again (the asm keeps GCC from holding
     * them in registers across rows: four inputs' 64 columns would not fit beside 16 accumulators);
     * its decode leaves the load ports idle. F32 and BF16 rows keep the inputs in registers: their
     * loads are the limit (four inputs reloaded per row: 34 -> 17 GFLOP/s BF16, 43 -> 27 F32). */
    for (int c = 0; c < pairs;) {
        const int step = f == WF_FP8 && c + FP8_STEP <= cols ? FP8_STEP : 32;
        if (short_fp8_rows) {
            if (c % 64 == 0) kernel_prefetch_next_group(row[0], NR, (size_t)c, ahead, end);
        } else {
            #pragma GCC unroll 2
            for (size_t b = (kernel_col_bytes(f, c) + 63) & ~(size_t)63; b < kernel_col_bytes(f, c + step); b += 64) {
                #pragma GCC unroll 4
                for (int i = 0; i < NR; i++) _mm_prefetch((const char *)row[i] + b + ahead, _MM_HINT_T0);
                if (b % 256 == 0)
                    #pragma GCC unroll 4
                    for (int i = 0; i < NR; i++) kernel_prefetch_far(row[i] + b, end);
            }
        }
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            __m512 wv[FP8_STEP / 16];
            if (step == 32) decode_step2(f, row[i], c, &wv[0], &wv[1]);
#if FP8_STEP == 64
            else fp8_factors64(row[i] + c, wv);
#endif
            const float *xc = x + c;
            if (NX > 1 && f == WF_FP8) __asm__ volatile("" : "+r"(xc));
            #pragma GCC unroll 4
            for (int j = 0; j < NX; j++) {
                #pragma GCC unroll 4
                for (int v = 0; v < step / 16; v++)
                    acc[i][j] = _mm512_fmadd_ps(wv[v], _mm512_loadu_ps(xc + (size_t)j * cols + 16 * v), acc[i][j]);
            }
        }
        c += step;
    }
    if (pairs < full) {   /* one group of 16 left before the tail */
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            __m512 wv = decode_step(f, row[i], pairs);
            #pragma GCC unroll 4
            for (int j = 0; j < NX; j++)
                acc[i][j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (size_t)j * cols + pairs), acc[i][j]);
        }
    }
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < NX; j++) {
            if (full < cols) acc[i][j] = tail_groups(w, r + i, full, x + (size_t)j * cols, acc[i][j], NULL);
            y[(size_t)j * ldy + i] = kernel_row_finish(w, r + i, tree16(acc[i][j]));
        }
}

/* Row r's rule-2 weight factors into out: f32 (zero-padded to 16 columns), or with BF their BF16
 * patterns, exact for FP8 and I8_ROW (at most 8 significant bits), which the tile widens back to
 * the same f32 as it widens BF16 weights. */
INLINE void decode_row(const qmat *w, wformat f, int BF, int r, void *out) {
    const int full = w->cols / 16 * 16;
    const uint8_t *row = kernel_row_ptr(w, r);
    for (int c = 0; c < full; c += 16) {
        __m512 v = decode_step(f, row, c);
        if (BF) _mm256_storeu_si256((__m256i *)((uint16_t *)out + c),
                                    _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
        else _mm512_store_ps((float *)out + c, v);
    }
    if (full < w->cols && !BF) tail_groups(w, r, full, NULL, _mm512_setzero_ps(), out);
    for (int c = full; c < w->cols && BF; c++) ((uint16_t *)out)[c] = f32_to_bf16(kernel_weight(w, r, c));
}

/* The rows after a batched call's [r0, r1), streamed into L2 while its tiles compute: a
 * task decodes its rows before it computes with them, and without this that decode waits on
 * memory for each row (a BF16 row of 2048 columns is a whole 4 KiB page, where the hardware
 * prefetcher stops): 19-27 % of a GLM prefill. The next rows are the next task's, whichever
 * thread claims it (this core's L2 or the shared L3 serves it then). A few lines per tile call
 * keep the prefetches from queueing up behind each other. Prefetches change no result. */
typedef struct {
    const char *next;
    size_t lines, done, per_step;
} row_stream;

INLINE row_stream row_stream_after(const qmat *w, int r0, int r1, int steps) {
    int end = MIN(w->rows, r1 + (r1 - r0));
    row_stream s = {(const char *)kernel_row_ptr(w, r1), 0, 0, 0};
    if (end > r1) s.lines = (size_t)(kernel_row_ptr(w, end) - kernel_row_ptr(w, r1) + 63) / 64;
    s.per_step = (s.lines + (size_t)steps - 1) / (size_t)MAX(steps, 1);
    return s;
}

INLINE void row_stream_step(row_stream *s) {
    for (size_t k = 0; k < s->per_step && s->done < s->lines; k++, s->done++)
        _mm_prefetch(s->next + 64 * s->done, _MM_HINT_T1);
}

/* ---- nibble formats (rule 4) ---- */

/* The format's 16 weight factors, indexed by code (kernel_fp4_lut or kernel_i4_lut). */
INLINE __m512 nibble_table(wformat f) {
    return _mm512_loadu_ps(kernel_nibble_is_e2m1(f) ? kernel_fp4_lut : kernel_i4_lut);
}

#ifdef __AVX512VBMI__
/* A byte permute control: bytes 0 and 1 of dword L take the chunk's 16-bit word of lane L
 * (dec64_nibbles), bytes 2 and 3 its high byte again. */
INLINE __m512i nibble_lane_bytes(void) {
    return _mm512_set_epi32(0x1f1f1f1e, 0x1d1d1d1c, 0x1b1b1b1a, 0x19191918, 0x0f0f0f0e, 0x0d0d0d0c,
                            0x0b0b0b0a, 0x09090908, 0x17171716, 0x15151514, 0x13131312, 0x11111110,
                            0x07070706, 0x05050504, 0x03030302, 0x01010100);
}
#endif

/* 32 bytes = the 64 codes of blocks b, b + 1 -> z[t] = term t of lanes 0..15. Lane L's four
 * columns are the 16-bit word 8 * ((L / 4) % 2) + 4 * (L / 8) + L % 4 of the chunk: one shuffle
 * puts that word in the low half of dword lane L (the high half is don't-care), and term t is
 * its nibble t. vpermps reads only the low four bits of each index, so shifting the word right
 * by 4t selects nibble t without masking: decoding costs one shuffle, three shifts and four
 * vpermps per chunk, on the two ports that also run the FMAs (the FP4 matvec's bound). The
 * shuffle is a byte permute where VBMI has one: a word permute is two uops on a Xeon, one more
 * per chunk of fifteen (bench kernels' FP4 matvec in L2, one thread: +7 %). */
INLINE void dec64_nibbles(const uint8_t *p, __m512 table, __m512 z[4]) {
    const __m512i codes = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p));
#ifdef __AVX512VBMI__
    __m512i u = _mm512_permutexvar_epi8(nibble_lane_bytes(), codes);
#else
    const __m512i words = _mm512_set_epi16(0, 15, 0, 14, 0, 13, 0, 12, 0, 7, 0, 6, 0, 5, 0, 4,
                                           0, 11, 0, 10, 0, 9, 0, 8, 0, 3, 0, 2, 0, 1, 0, 0);
    __m512i u = _mm512_permutexvar_epi16(words, codes);
#endif
    z[0] = _mm512_permutexvar_ps(u, table);
    #pragma GCC unroll 3
    for (int t = 1; t < 4; t++) z[t] = _mm512_permutexvar_ps(_mm512_srli_epi32(u, 4 * t), table);
}

/* Rule 4's scale factor per lane for blocks b (lanes with (L / 4) % 2 == 0) and b + 1; b is
 * even, so I4_G64's two blocks share a group and I4_ROW has one scale. NVFP4 has one per half
 * block: lane L takes sub-block 2 * (b + (L / 4) % 2) + L / 8. */
INLINE __m512 nibble_scales(wformat f, const void *srow, int b) {
    if (f == WF_NVFP4) {
        const __m512i lane = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 3, 3, 3, 3);
        __m128 s = _mm_setr_ps(kernel_nibble_scale(f, srow, b, 0), kernel_nibble_scale(f, srow, b, 1),
                               kernel_nibble_scale(f, srow, b + 1, 0), kernel_nibble_scale(f, srow, b + 1, 1));
        return _mm512_permutexvar_ps(lane, _mm512_castps128_ps512(s));
    }
    return _mm512_mask_blend_ps(0xf0f0, _mm512_set1_ps(kernel_nibble_scale(f, srow, b, 0)),
                                _mm512_set1_ps(kernel_nibble_scale(f, srow, b + 1, 0)));
}

/* Rule 4 for the blocks past the last full chunk (in column order, as kernel_nibble_permute_x
 * leaves them), then the tree and rule 5. */
static float nibble_finish(const qmat *w, int r, int full, const float *x, __m512 acc) {
    if (full == w->cols) return kernel_row_finish(w, r, tree16(acc));
    float a[16] __attribute__((aligned(64)));
    _mm512_store_ps(a, acc);
    kernel_nibble_blocks(w, r, full / 32, x, a);
    return kernel_row_finish(w, r, kernel_tree16(a));
}

/* The biased exponent of the lowest set bit of each lane's value, for normal f32 lanes (`mag` the
 * lane's bits without the sign, `e` its exponent field): the value is (mantissa | 2^23) *
 * 2^(e - 150), so its lowest bit sits that many trailing zeros above 2^(e - 23). Zero and denormal
 * lanes give 0 or less. The pairs and the integer partials both bound their inputs' span by it. */
INLINE __m512i lowest_bit_exponent(__m512i mag, __m512i e) {
    const __m512i m = _mm512_or_si512(_mm512_and_si512(mag, _mm512_set1_epi32(0x7fffff)), _mm512_set1_epi32(0x800000));
    const __m512i low_bit = _mm512_and_si512(m, _mm512_sub_epi32(_mm512_setzero_si512(), m));
    return _mm512_sub_epi32(e, _mm512_add_epi32(_mm512_set1_epi32(23 - 31), _mm512_lzcnt_epi32(low_bit)));
}

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
/* ---- exact BF16 pairs (the nibble formats' partials as BF16 dot products) ----
 *
 * Rule 4's partial of a 4-column group is exact when its input is coarse enough: the weight
 * factors are integers of magnitude <= 12, so with every input of the group a BF16 value whose
 * bits lie between 2^lo (its lowest set bit) and 2^hi (its exponent), all four products and
 * every partial sum of them are multiples of 2^lo below 48 * 2^(hi + 1) <= 2^(hi + 7), so
 * integers times 2^lo below 2^24 when hi - lo <= 17: exact in f32. Then the partial is the same
 * number however it is summed, and vdpbf16ps (two products per lane, whatever its internal order
 * and rounding) gives bit for bit what the FMA chain gives. A DeepSeek V4 linear's input after its
 * E4M3 QDQ meets this with nothing to spare (E4M3 spans 2^-9 .. 2^8 over a block's scale).
 * Keeping 2^lo >= 2^-126 and hi <= 120 keeps every value normal and finite, so the instruction's
 * flushing of denormals never applies. The canonical order is untouched: this is a faster way to
 * the same partials, chosen per call when every input row qualifies (nibble_pairs), and the
 * scalar path stays its twin. Per 64 columns: a byte shuffle (VBMI, hence the guard), a shift,
 * two word lookups and two dot products where four table lookups and four FMAs were (1.4x the
 * FP4 matvec in L2, Zen 5). */

#define PAIR_SPAN 17       /* hi - lo allowed */
#define PAIR_MAX_EXP 247   /* biased: 2^120 */

/* The 16 lanes of one term vector (width-16 order): lanes that are nonzero get their biased
 * exponent into *hi (max) and the biased exponent of their lowest set bit into *lo (min); returns
 * the lanes that cannot be paired (not BF16, denormal, too large, inf, NaN). */
INLINE __mmask16 pair_span(__m512i bits, __m512i *hi, __m512i *lo) {
    const __m512i mag = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
    const __m512i e = _mm512_srli_epi32(mag, 23);
    const __m512i low = lowest_bit_exponent(mag, e);
    __mmask16 nonzero = _mm512_test_epi32_mask(mag, mag);
    *hi = _mm512_mask_max_epi32(*hi, nonzero, *hi, e);
    *lo = _mm512_mask_min_epi32(*lo, nonzero, *lo, low);
    __mmask16 not_bf16 = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0xffff));
    __mmask16 out_of_range = _mm512_mask_cmpgt_epi32_mask(nonzero, e, _mm512_set1_epi32(PAIR_MAX_EXP)) |
                             _mm512_mask_cmpeq_epi32_mask(nonzero, e, _mm512_setzero_si512());
    return not_bf16 | out_of_range;
}

/* out[32 k .. 32 k + 31] for each full 64-column chunk k of an input row in the width-16 order:
 * lane L of the first 16 dwords holds the BF16 pair (term 0, term 2) of lane L, of the second
 * (term 1, term 3). Returns 0, leaving out partly written, if a group is not exact as above. */
static int avx512_nibble_pairs(const float *x, int cols, uint32_t *out) {
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    for (int c = 0; c + 64 <= cols; c += 64) {
        __m512i v[4], hi = _mm512_setzero_si512(), lo = _mm512_set1_epi32(1 << 20);
        __mmask16 bad = 0;
        #pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            v[t] = _mm512_castps_si512(_mm512_loadu_ps(x + c + 16 * t));
            bad |= pair_span(v[t], &hi, &lo);
        }
        __mmask16 any = _mm512_cmpgt_epi32_mask(hi, _mm512_setzero_si512());
        bad |= _mm512_mask_cmpgt_epi32_mask(any, _mm512_sub_epi32(hi, lo), _mm512_set1_epi32(PAIR_SPAN)) |
               _mm512_mask_cmplt_epi32_mask(any, lo, _mm512_set1_epi32(1));
        if (bad) return 0;
        _mm512_storeu_si512(out + c / 2, _mm512_or_si512(_mm512_and_si512(v[2], top), _mm512_srli_epi32(v[0], 16)));
        _mm512_storeu_si512(out + c / 2 + 16, _mm512_or_si512(_mm512_and_si512(v[3], top), _mm512_srli_epi32(v[1], 16)));
    }
    return 1;
}

/* The format's 16 weight factors as BF16 words, twice: a word lookup reads five index bits, and
 * the fifth (the next nibble's lowest) then selects the same factor. */
INLINE __m512i nibble_table_bf16(wformat f) {
    __m256i words = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(nibble_table(f)), 16));
    return _mm512_inserti64x4(_mm512_castsi256_si512(words), words, 1);
}

/* 32 bytes = the 64 codes of a chunk -> *a, *b: lane L's BF16 weight pairs (term 0, term 2) and
 * (term 1, term 3), matching avx512_nibble_pairs' input pairs (any pairing gives the same exact
 * partial). One byte shuffle puts the low byte of lane L's codes word (dec64_nibbles), terms 0
 * and 1, in the low word of dword L and its high byte, terms 2 and 3, in the high word; those
 * words index the table for terms 0 and 2, and shifted right by 4 for terms 1 and 3. A word
 * lookup reads five index bits and the table is doubled, so the bits above a nibble never
 * matter. Per chunk that is one shuffle and one immediate shift where a word shuffle and two
 * variable shifts were: they share the ports that bound the FP4 matvec. */
INLINE void dec64_pairs(const uint8_t *p, __m512i table, __m512i *a, __m512i *b) {
    const __m512i codes = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p));
    __m512i u = _mm512_permutexvar_epi8(nibble_lane_bytes(), codes);
    *a = _mm512_permutexvar_epi16(u, table);
    *b = _mm512_permutexvar_epi16(_mm512_srli_epi16(u, 4), table);
}

/* Rule 4's partial of every lane from BF16 pairs (exact, see above). */
INLINE __m512 pair_partial(__m512i wa, __m512i wb, __m512i xa, __m512i xb) {
    __m512 p = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)wa, (__m512bh)xa);
    return _mm512_dpbf16_ps(p, (__m512bh)wb, (__m512bh)xb);
}
#define HAVE_PAIRS 1
#else
#define HAVE_PAIRS 0
#endif

/* NR interleaved rows x NX inputs, decoding in registers (as dot_rows; x in the width-16
 * order), prefetching the next row group in memory order (kernel_prefetch_next_group) and one
 * line in four far ahead (kernel_prefetch_far). With
 * DeepSeek V4's expert shapes (FP4 1024x2048 and 2048x1024, six random experts of 512 per step,
 * from memory) that measured 17.2 -> 20.5 GB/s on one thread and 32.5 -> 39.0 on two (medians
 * of 5, alternated), against each row prefetching its own next row plus a second stream 16 KiB
 * ahead in each row. FP8 rows of 4 KiB measured no gain from it, so dot_rows keeps the rows'
 * order. With PAIRS the partials come from `pairs` (avx512_nibble_pairs of each input row) by
 * BF16 dot products. */
INLINE void nibble_dot_rows(const qmat *w, wformat f, int r, int NR, const float *x, const uint32_t *pairs, int PAIRS,
                            int NX, float *y, int ldy) {
    const int cols = w->cols, full = cols / 64 * 64;
    const size_t ahead = kernel_group_ahead(w, VEC_ROWS);
    const uint8_t *end = kernel_row_ptr(w, w->rows);
    const __m512 table = nibble_table(f);
#if HAVE_PAIRS
    const __m512i table16 = nibble_table_bf16(f);
#endif
    const uint8_t *row[VEC_ROWS];
    const void *srow[VEC_ROWS];
    __m512 acc[VEC_ROWS][FEW_X];
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        row[i] = kernel_row_ptr(w, r + i);
        srow[i] = kernel_nibble_scale_row(w, r + i);
        #pragma GCC unroll 4
        for (int j = 0; j < NX; j++) acc[i][j] = _mm512_setzero_ps();
    }
    for (int c = 0; c < full; c += 64) {
        if (c % 128 == 0) kernel_prefetch_next_group(row[0], NR, (size_t)c / 2, ahead, end);
#if HAVE_PAIRS
        if (PAIRS) {   /* the inputs' pairs in registers for all NR rows, as xv below */
            __m512i xa[FEW_X], xb[FEW_X];
            #pragma GCC unroll 4
            for (int j = 0; j < NX; j++) {
                xa[j] = _mm512_loadu_si512(pairs + (size_t)j * (full / 2) + c / 2);
                xb[j] = _mm512_loadu_si512(pairs + (size_t)j * (full / 2) + c / 2 + 16);
                __asm__("" : "+v"(xa[j]), "+v"(xb[j]));
            }
            #pragma GCC unroll 4
            for (int i = 0; i < NR; i++) {
                __m512i wa, wb;
                __m512 scale = nibble_scales(f, srow[i], c / 32);
                dec64_pairs(row[i] + c / 2, table16, &wa, &wb);
                #pragma GCC unroll 4
                for (int j = 0; j < NX; j++) acc[i][j] = _mm512_fmadd_ps(pair_partial(wa, wb, xa[j], xb[j]), scale, acc[i][j]);
            }
            continue;
        }
#endif
        /* With one or two inputs their chunk stays in registers for all NR rows (folded into each
         * row's FMAs the loads would compete with the code and scale loads for the load ports);
         * more inputs would not fit beside the accumulators. */
        __m512 xv[2][4];
        #pragma GCC unroll 2
        for (int j = 0; j < NX && NX <= 2; j++)
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                xv[j][t] = _mm512_loadu_ps(x + (size_t)j * cols + c + 16 * t);
                __asm__("" : "+v"(xv[j][t]));
            }
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            __m512 z[4], scale = nibble_scales(f, srow[i], c / 32);
            dec64_nibbles(row[i] + c / 2, table, z);
            #pragma GCC unroll 4
            for (int j = 0; j < NX; j++) {
                const float *xj = x + (size_t)j * cols + c;
                __m512 p = _mm512_mul_ps(z[0], NX <= 2 ? xv[j][0] : _mm512_loadu_ps(xj));
                #pragma GCC unroll 3
                for (int t = 1; t < 4; t++) p = _mm512_fmadd_ps(z[t], NX <= 2 ? xv[j][t] : _mm512_loadu_ps(xj + 16 * t), p);
                acc[i][j] = _mm512_fmadd_ps(p, scale, acc[i][j]);
            }
        }
    }
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < NX; j++)
            y[(size_t)j * ldy + i] = nibble_finish(w, r + i, full, x + (size_t)j * cols, acc[i][j]);
}

/* A decoded nibble row: per 64-column chunk the four term vectors, then its scale vector; or,
 * for inputs with BF16 pairs, the chunk's two pair vectors (dec64_pairs), then the scale vector. */
#define NIB_CHUNK_FLOATS 80
#define NIB_PAIR_CHUNK 48
#define NIB_R 2
#define NIB_X 6
/* Chunks per column range: a range's NIB_X input slices (6 x 16 x 256 B = 24 KiB) and the two
 * decoded rows of a tile (2 x 16 x 320 B = 10 KiB) fit a 48 KiB L1 together, so the inputs stay
 * in L1 while every row pair of the call passes over them. At 32 chunks they took 68 KiB and were
 * read from L2 for each pair: one thread's FP4 product of 12-48 inputs ran 20-35 % slower at 2048,
 * 4096 and 7168 columns (process CPU time, best of 15, alternated builds, Zen 5); at 1024 columns
 * (16 chunks) the two are the same code. */
#define NIB_KC 16

/* NR weight rows (decoded, ldw floats apart) x NX input rows over chunks [k0, k1); each pair's
 * 16 lanes stay in a register over the range and in acc[(input row * nr_all + weight row) * 16]
 * between ranges (as tile() keeps them, starting from zero at k0 == 0), so a range's decoded
 * weights and inputs stay in L1.
 * With PAIRS the rows are decoded as pairs and the inputs are their pairs, `pstride` words apart:
 * two dot products and the scale FMA per (row, input) and chunk instead of five FMAs. */
INLINE void nibble_tile(const float *wb, int ldw, const float *x, const uint32_t *pairs, int PAIRS, int cols,
                        int k0, int k1, int NR, int NX, float *acc, int nr_all) {
    __m512 a[NIB_R][NIB_X];
    #pragma GCC unroll 2
    for (int i = 0; i < NR; i++)
        #pragma GCC unroll 6
        for (int j = 0; j < NX; j++)
            a[i][j] = k0 ? _mm512_load_ps(acc + ((size_t)j * nr_all + i) * 16) : _mm512_setzero_ps();
    for (int k = k0; k < k1; k++) {
#if HAVE_PAIRS
        if (PAIRS) {
            const size_t pstride = (size_t)cols / 64 * 32;
            const float *wk = wb + (size_t)k * NIB_PAIR_CHUNK;
            __m512i wa[NIB_R], wbv[NIB_R];
            __m512 scale[NIB_R];
            #pragma GCC unroll 2
            for (int i = 0; i < NR; i++) {
                wa[i] = _mm512_load_si512(wk + (size_t)i * ldw);
                wbv[i] = _mm512_load_si512(wk + (size_t)i * ldw + 16);
                scale[i] = _mm512_load_ps(wk + (size_t)i * ldw + 32);
            }
            #pragma GCC unroll 6
            for (int j = 0; j < NX; j++) {
                __m512i xa = _mm512_loadu_si512(pairs + (size_t)j * pstride + 32 * k);
                __m512i xb = _mm512_loadu_si512(pairs + (size_t)j * pstride + 32 * k + 16);
                __asm__("" : "+v"(xa), "+v"(xb));
                #pragma GCC unroll 2
                for (int i = 0; i < NR; i++) a[i][j] = _mm512_fmadd_ps(pair_partial(wa[i], wbv[i], xa, xb), scale[i], a[i][j]);
            }
            continue;
        }
#endif
        const float *wk = wb + (size_t)k * NIB_CHUNK_FLOATS;
        __m512 p[NIB_R][NIB_X];
        #pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            __m512 wv[NIB_R];
            #pragma GCC unroll 2
            for (int i = 0; i < NR; i++) wv[i] = _mm512_load_ps(wk + (size_t)i * ldw + 16 * t);
            #pragma GCC unroll 6
            for (int j = 0; j < NX; j++) {
                __m512 xv = _mm512_loadu_ps(x + (size_t)j * cols + 64 * k + 16 * t);
                __asm__("" : "+v"(xv));   /* one load per input, not one folded into each row's FMA */
                #pragma GCC unroll 2
                for (int i = 0; i < NR; i++) p[i][j] = t ? _mm512_fmadd_ps(wv[i], xv, p[i][j]) : _mm512_mul_ps(wv[i], xv);
            }
        }
        #pragma GCC unroll 2
        for (int i = 0; i < NR; i++) {
            __m512 scale = _mm512_load_ps(wk + (size_t)i * ldw + 64);
            #pragma GCC unroll 6
            for (int j = 0; j < NX; j++) a[i][j] = _mm512_fmadd_ps(p[i][j], scale, a[i][j]);
        }
    }
    #pragma GCC unroll 2
    for (int i = 0; i < NR; i++)
        #pragma GCC unroll 6
        for (int j = 0; j < NX; j++) _mm512_store_ps(acc + ((size_t)j * nr_all + i) * 16, a[i][j]);
}

#define NIB_CASE(nr, nx) \
    case (nr) * 8 + (nx): nibble_tile(wb, ldw, x, pairs, PAIRS, cols, k0, k1, nr, nx, acc, nr_all); break
#define NIB_CASES(pairs_const)                                                                                  \
    {                                                                                                           \
        const int PAIRS = pairs_const;                                                                          \
        switch (nr * 8 + nx) {                                                                                  \
            NIB_CASE(1, 1); NIB_CASE(1, 2); NIB_CASE(1, 3); NIB_CASE(1, 4); NIB_CASE(1, 5); NIB_CASE(1, 6);     \
            NIB_CASE(2, 1); NIB_CASE(2, 2); NIB_CASE(2, 3); NIB_CASE(2, 4); NIB_CASE(2, 5); NIB_CASE(2, 6);     \
        }                                                                                                       \
    }

static void nibble_tile_any(const float *wb, int ldw, const float *x, const uint32_t *pairs, int cols, int k0, int k1,
                            int nr, int nx, float *acc, int nr_all) {
    if (pairs) NIB_CASES(HAVE_PAIRS) else NIB_CASES(0)
}

/* Chunks [k0, k1) of row r decoded into out (its decoded row: chunk k at k * the chunk's floats). */
INLINE void nibble_decode_row(const qmat *w, wformat f, int r, int pairs, int k0, int k1, float *out) {
    const __m512 table = nibble_table(f);
    const uint8_t *row = kernel_row_ptr(w, r);
    const void *srow = kernel_nibble_scale_row(w, r);
    for (int k = k0; k < k1; k++) {
#if HAVE_PAIRS
        if (pairs) {
            __m512i a, b;
            float *o = out + (size_t)k * NIB_PAIR_CHUNK;
            dec64_pairs(row + 32 * k, nibble_table_bf16(f), &a, &b);
            _mm512_store_si512(o, a);
            _mm512_store_si512(o + 16, b);
            _mm512_store_ps(o + 32, nibble_scales(f, srow, 2 * k));
            continue;
        }
#endif
        __m512 z[4];
        dec64_nibbles(row + 32 * k, table, z);
        float *o = out + (size_t)k * NIB_CHUNK_FLOATS;
        #pragma GCC unroll 4
        for (int t = 0; t < 4; t++) _mm512_store_ps(o + 16 * t, z[t]);
        _mm512_store_ps(o + 64, nibble_scales(f, srow, 2 * k));
    }
}

/* Batches past NIB_FEW_BATCH: the NIB_R x NIB_X tile over column ranges of NIB_KC chunks, each
 * row decoded once (as pairs when `pairs` holds the inputs'). The first input group decodes a
 * tile's rows range by range just before it uses them, so the decoded lines are still in L1
 * and the decode's stores overlap the tiles' FMAs; later groups read them back from L2. Decoding
 * every row up front instead (480 KiB per 48-row task at 2048 columns, all written to L2 before
 * the first FMA) cost 23 % of the product's samples at n = 24: FP4 1024 x 2048, n = 24, one
 * thread in L2 128 -> 139 GFLOP/s, two threads from memory 202-228 -> 250-253 (alternated);
 * DeepSeek V4 bench prefill 179 -> 183 tok/s (median of 5, alternated). */
static void nibble_rows_mul(const qmat *w, int r0, int r1, const float *x, const uint32_t *pairs, int n, float *y,
                            int ldy) {
    const int cols = w->cols, chunks = cols / 64, nr = r1 - r0;
    const int ldw = chunks * (pairs ? NIB_PAIR_CHUNK : NIB_CHUNK_FLOATS);
    float *wb = kernel_scratch((size_t)nr * ldw + (size_t)NIB_X * nr * 16);
    float *acc = wb + (size_t)nr * ldw;
    row_stream next = row_stream_after(w, r0, r1, (n + NIB_X - 1) / NIB_X * ((chunks + NIB_KC - 1) / NIB_KC) *
                                                      ((nr + NIB_R - 1) / NIB_R));
    for (int j0 = 0, nx; j0 < n; j0 += nx) {
        nx = input_group(n - j0, NIB_X);
        const float *xg = x + (size_t)j0 * cols;
        const uint32_t *pg = pairs ? pairs + (size_t)j0 * chunks * 32 : NULL;
        for (int k0 = 0; k0 == 0 || k0 < chunks; k0 += NIB_KC)   /* once at least: the first range zeroes acc */
            for (int i = 0; i < nr; i += NIB_R, row_stream_step(&next)) {
                const int k1 = MIN(k0 + NIB_KC, chunks), tile_rows = MIN(NIB_R, nr - i);
                float *tile_wb = wb + (size_t)i * ldw;
                for (int t = 0; j0 == 0 && t < tile_rows; t++) {
                    float *out = tile_wb + (size_t)t * ldw;
                    KERNEL_FOR_EACH_FORMAT(w->fmt, (void)0, nibble_decode_row(w, F, r0 + i + t, pairs != NULL, k0, k1, out))
                }
                nibble_tile_any(tile_wb, ldw, xg, pg, cols, k0, k1, tile_rows, nx, acc + (size_t)i * 16, nr);
            }
        for (int j = 0; j < nx; j++) {
            if (chunks * 64 == cols) {
                finish_rows(w, r0, nr, acc + (size_t)j * nr * 16, y + (size_t)(j0 + j) * ldy);
                continue;
            }
            for (int i = 0; i < nr; i++)
                y[(size_t)(j0 + j) * ldy + i] = nibble_finish(w, r0 + i, chunks * 64, xg + (size_t)j * cols,
                                                              _mm512_load_ps(acc + ((size_t)j * nr + i) * 16));
        }
    }
}

#define FEW_CASE(nx)                                                                                      \
    case nx:                                                                                              \
        KERNEL_FOR_EACH_FORMAT(w->fmt, dot_rows(w, F, r, nr, x, nx, y, ldy),                              \
                               nibble_dot_rows(w, F, r, nr, x, NULL, 0, nx, y, ldy))                      \
        break
#define PAIRS_CASE(nx)                                                                                    \
    case nx:                                                                                              \
        KERNEL_FOR_EACH_FORMAT(w->fmt, (void)0, nibble_dot_rows(w, F, r, nr, x, pairs, 1, nx, y, ldy))   \
        break

/* A register kernel's dispatch on (nr, nx): CASE(nx) sees both as compile-time constants. */
#define FEW_DISPATCH(CASE)                                         \
    if (nr == VEC_ROWS) {                                          \
        enum { nr = VEC_ROWS };                                    \
        switch (nx) { CASE(1); CASE(2); CASE(3); CASE(4); }        \
    } else {                                                       \
        enum { nr = 1 };                                           \
        switch (nx) { CASE(1); CASE(2); CASE(3); CASE(4); }        \
    }

/* Rows [r, r + nr) (nr = VEC_ROWS or 1) x nx <= FEW_X inputs, decoded in registers. */
static void rows_few(const qmat *w, int r, int nr, const float *x, int nx, float *y, int ldy) {
    FEW_DISPATCH(FEW_CASE)
}

/* The same for a nibble format from the inputs' BF16 pairs (a function of its own: inlined into
 * rows_few, the pairs kernels made GCC allocate the f32 kernels' registers worse). */
static void rows_few_pairs(const qmat *w, int r, int nr, const float *x, const uint32_t *pairs, int nx, float *y,
                           int ldy) {
#if HAVE_PAIRS
    FEW_DISPATCH(PAIRS_CASE)
#endif
}

/* y[j * ldy + (r - r0)] for inputs j in [0, n), n <= NIB_FEW_BATCH, rows in groups of VEC_ROWS;
 * from the BF16 pairs where given. */
static void rows_few_inputs(const qmat *w, int r0, int r1, const float *x, const uint32_t *pairs, int n, float *y,
                            int ldy) {
    for (int j = 0; j < n; j += FEW_X) {
        int nx = MIN(FEW_X, n - j);
        const float *xj = x + (size_t)j * w->cols;
        const uint32_t *pj = pairs ? pairs + (size_t)j * (w->cols / 64 * 32) : NULL;
        float *yj = y + (size_t)j * ldy;
        int r = r0;
        for (; r < r1; r += r + VEC_ROWS <= r1 ? VEC_ROWS : 1) {
            int nr = r + VEC_ROWS <= r1 ? VEC_ROWS : 1;
            if (pj) rows_few_pairs(w, r, nr, xj, pj, nx, yj + (r - r0), ldy);
            else rows_few(w, r, nr, xj, nx, yj + (r - r0), ldy);
        }
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
/* ---- exact integer partials (FP4 matvecs through VNNI) ----
 *
 * An FP4 weight factor (rule 1) is an integer w in -12..12. If the 64 inputs of a chunk are
 * integers q times one power of two 2^E (E at most the lowest set bit of any of them) with
 * 48 |q| < 2^24, every product and partial sum of a 4-column group is an integer times 2^E below
 * 2^24 times 2^E, so rule 4's partial is exact: it is 2^E times sum w q, whatever the order. So
 * VPDPBUSD, which sums four byte products into a dword, gives the partials: |q| < 2^16 (else
 * < 2^24) split into two (three) unsigned bytes, the input's sign moved onto the weight (the
 * E2M1 sign bit of the code, flipped per column before the table lookup), one dot product per
 * byte and a shift between. The partial then multiplies the scale factor s_b * 2^E instead of
 * s_b: the same real product, so the same FMA result, provided s_b * 2^E is still a power of two
 * in f32: E in [-21, 1] for any E8M0 scale. A DeepSeek V4 linear's input after its E4M3 QDQ has
 * |q| <= 448 * 2^9 over its block's scale.
 * Per chunk and row that is a byte shuffle selecting nibbles, a sign flip, a byte table lookup,
 * two dot products, a shift, a conversion, the scale blend and one FMA, where the f32 kernel
 * takes eight decode uops and five FMAs: one thread's FP4 1024 x 2048 qmat_vec in L2 ran
 * 14.9-15.3 -> 20.9-22.0 GB/s on a Xeon (Sapphire Rapids class), the row loop alone 16.7 -> 25.4.
 * The codes load as one 32-byte broadcast, and VPMULTISHIFTQB picks, for dword lane 2m + j
 * (m < 4) the nibbles of group 4m + j and for lane 8 + 2m + j those of group 4m + 2 + j (group G
 * = columns 4G .. 4G + 3 of the chunk): lane order lam(G) = 8 ((G % 4) / 2) + 2 (G / 4) + G % 2,
 * not rule 4's; the inputs are stored in that order, and each row's 16 lanes are permuted back
 * to rule 4's once at the end. Block b + 1's groups (G >= 8) land in lanes 4-7 and 12-15, as in
 * rule 4, so the scale blend is nibble_scales'. */
#define HAVE_INTS 1
#define INT_E_MIN (-21)
#define INT_E_MAX 1
#define INT_Q_MAX 349525.0f     /* 48 q < 2^24 */

/* Header of a chunk of nibble_ints' form, then 64 bytes each: the sign flips (0x08 where the
 * input is negative), the top, high and low bytes of |q|, in lam order. */
typedef struct {
    const float *scales;        /* E8M0 byte -> rule 4's scale factor times 2^E */
    int limbs;                  /* 2 or 3 */
} int_head;

static float int_scales[INT_E_MAX - INT_E_MIN + 1][256];
static int8_t int_weights[64];               /* code (low 4 bits of the index) -> rule 1's factor */
static int32_t int_lane_of_group[16];        /* byte order: dword lam(G) <- column dword G */
static int32_t int_lane_back[16];            /* rule 4's lane l(G) <- lam(G) */
static pthread_once_t int_once = PTHREAD_ONCE_INIT;

static void int_tables(void) {
    for (int e = INT_E_MIN; e <= INT_E_MAX; e++)
        for (int b = 0; b < 256; b++) int_scales[e - INT_E_MIN][b] = ldexpf(kernel_fp4_scale_lut[b], e);
    for (int i = 0; i < 64; i++) int_weights[i] = (int8_t)kernel_fp4_lut[i % 16];
    for (int G = 0; G < 16; G++) {
        int lam = 8 * (G % 4 / 2) + 2 * (G / 4) + G % 2, rule4 = 8 * (G % 8 / 4) + 4 * (G / 8) + G % 4;
        int_lane_of_group[lam] = G;
        int_lane_back[rule4] = lam;
    }
}

/* kernel_path.nibble_ints: each full chunk of x (column order) as above; 0 if one does not qualify. */
static int avx512_nibble_ints(const float *x, int cols, uint8_t *out) {
    pthread_once(&int_once, int_tables);
    const __m512i order = _mm512_loadu_si512(int_lane_of_group);
    for (int c = 0; c + 64 <= cols; c += 64) {
        __m512i bits[4], low = _mm512_set1_epi32(1 << 20);
        __mmask16 bad = 0;
        for (int t = 0; t < 4; t++) {
            bits[t] = _mm512_loadu_si512(x + c + 16 * t);
            const __m512i mag = _mm512_and_si512(bits[t], _mm512_set1_epi32(0x7fffffff));
            bad |= _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));   /* inf, NaN */
            low = _mm512_mask_min_epi32(low, _mm512_test_epi32_mask(mag, mag), low,
                                        lowest_bit_exponent(mag, _mm512_srli_epi32(mag, 23)));
        }
        int e = _mm512_reduce_min_epi32(low);   /* biased; a denormal gives 0 or less, out of range */
        e = e == 1 << 20 ? 0 : e - 127;
        if (bad || e < INT_E_MIN || e > INT_E_MAX) return 0;
        uint8_t *rec = out + (size_t)c / 64 * KERNEL_INT_CHUNK;
        uint8_t column_order[4][64];   /* sign, top, high, low bytes */
        __m512i qmax = _mm512_setzero_si512();
        for (int t = 0; t < 4; t++) {
            __m512 q = _mm512_scalef_ps(_mm512_abs_ps(_mm512_castsi512_ps(bits[t])), _mm512_set1_ps((float)-e));
            if (_mm512_cmp_ps_mask(q, _mm512_set1_ps(INT_Q_MAX), _CMP_GE_OQ)) return 0;
            __m512i qi = _mm512_cvttps_epi32(q);
            qmax = _mm512_max_epi32(qmax, qi);
            _mm_storeu_si128((__m128i *)(column_order[0] + 16 * t),
                             _mm512_cvtepi32_epi8(_mm512_slli_epi32(_mm512_srli_epi32(bits[t], 31), 3)));
            for (int k = 1; k < 4; k++)
                _mm_storeu_si128((__m128i *)(column_order[k] + 16 * t), _mm512_cvtepi32_epi8(_mm512_srli_epi32(qi, 8 * (3 - k))));
        }
        for (int k = 0; k < 4; k++)
            _mm512_storeu_si512(rec + 64 * (k + 1), _mm512_permutexvar_epi32(order, _mm512_loadu_si512(column_order[k])));
        int_head h = {int_scales[e - INT_E_MIN], _mm512_reduce_max_epi32(qmax) < 65536 ? 2 : 3};
        memcpy(rec, &h, sizeof h);
    }
    return 1;
}

/* Rows [r, r + NR) of an FP4 matrix times one input in nibble_ints' form, NR rows interleaved for
 * independent chains, prefetching as nibble_dot_rows does. */
INLINE void nibble_int_rows(const qmat *w, int r, int NR, const float *x, const uint8_t *ints, float *y) {
    const int full = w->cols / 64 * 64;
    const size_t ahead = kernel_group_ahead(w, VEC_ROWS);
    const uint8_t *end = kernel_row_ptr(w, w->rows);
    const __m512i pick = _mm512_set_epi64(0x3c3834302c282420LL, 0x3c3834302c282420LL, 0x3c3834302c282420LL,
                                          0x3c3834302c282420LL, 0x1c1814100c080400LL, 0x1c1814100c080400LL,
                                          0x1c1814100c080400LL, 0x1c1814100c080400LL);
    const __m512i table = _mm512_loadu_si512(int_weights);
    const uint8_t *row[VEC_ROWS], *srow[VEC_ROWS];
    __m512 acc[VEC_ROWS];
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        row[i] = kernel_row_ptr(w, r + i);
        srow[i] = kernel_nibble_scale_row(w, r + i);
        acc[i] = _mm512_setzero_ps();
    }
    for (int c = 0; c < full; c += 64) {
        if (c % 128 == 0) kernel_prefetch_next_group(row[0], NR, (size_t)c / 2, ahead, end);
        const uint8_t *rec = ints + (size_t)c / 64 * KERNEL_INT_CHUNK;
        int_head h;
        memcpy(&h, rec, sizeof h);
        const __m512i sign = _mm512_loadu_si512(rec + 64), top = _mm512_loadu_si512(rec + 128);
        const __m512i high = _mm512_loadu_si512(rec + 192), low = _mm512_loadu_si512(rec + 256);
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            const __m512i codes = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(row[i] + c / 2)));
            const __m512i wt = _mm512_permutexvar_epi8(_mm512_xor_si512(_mm512_multishift_epi64_epi8(pick, codes), sign), table);
            __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), h.limbs == 3 ? top : high, wt);
            if (h.limbs == 3) d = _mm512_dpbusd_epi32(_mm512_slli_epi32(d, 8), high, wt);
            d = _mm512_dpbusd_epi32(_mm512_slli_epi32(d, 8), low, wt);
            const __m512 scale = _mm512_mask_blend_ps(0xf0f0, _mm512_set1_ps(h.scales[srow[i][c / 32]]),
                                                      _mm512_set1_ps(h.scales[srow[i][c / 32 + 1]]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), scale, acc[i]);
        }
    }
    const __m512i back = _mm512_loadu_si512(int_lane_back);
    for (int i = 0; i < NR; i++) y[i] = nibble_finish(w, r + i, full, x, _mm512_permutexvar_ps(back, acc[i]));
}

/* kernel_path.rows_ints. */
static void avx512_rows_ints(const qmat *w, int r0, int r1, const float *x, const uint8_t *ints, float *y) {
    int r = r0;
    for (; r + VEC_ROWS <= r1; r += VEC_ROWS) nibble_int_rows(w, r, VEC_ROWS, x, ints, y + (r - r0));
    for (; r < r1; r++) nibble_int_rows(w, r, 1, x, ints, y + (r - r0));
}
#else
#define HAVE_INTS 0
#endif

static void avx512_rows_vec(const qmat *w, int r0, int r1, const float *x, float *y) {
    rows_few_inputs(w, r0, r1, x, NULL, 1, y, r1 - r0);
}

/* Weight factors of tile row i at columns [c, c + 16): decoded f32 rows, or with BF the BF16 codes
 * themselves, widened here (masked at the row's end: the columns past it read as +0). */
INLINE __m512 tile_weight(const void *wb, int BF, int ldw, int i, int c, __mmask16 m) {
    if (!BF) return _mm512_load_ps((const float *)wb + (size_t)i * ldw + c);
    const uint16_t *p = (const uint16_t *)wb + (size_t)i * ldw + c;
    __m256i codes = m == 0xffff ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(m, p);
    return widen_bf16(_mm512_castsi256_si512(codes));
}

/* NR x NX tile over columns [c0, c1); partial lanes in acc[input row][weight row][16], which
 * the first range (c0 == 0) starts from zero rather than reads. Input j holds column c at
 * x + j * ldx + c - xc0 (the inputs themselves, or their range scaled in avx512_rows_mul). */
INLINE void tile(const void *wb, int BF, int ldw, const float *x, size_t ldx, int xc0, int cols, int c0, int c1, int NR,
                 int NX, float *acc, int nr_all) {
    __m512 a[TILE_R][TILE_X];
    const int full_end = c1 & ~15;
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
        #pragma GCC unroll 6
        for (int j = 0; j < NX; j++)
            a[i][j] = c0 ? _mm512_load_ps(acc + ((size_t)j * nr_all + i) * 16) : _mm512_setzero_ps();
    for (int c = c0; c < full_end; c += 16) {
        __m512 xv[TILE_X];
        #pragma GCC unroll 6
        for (int j = 0; j < NX; j++) {
            xv[j] = _mm512_loadu_ps(x + (size_t)j * ldx + (c - xc0));
            /* Keep the input in a register: folded into each FMA it would be loaded NR times. */
            __asm__("" : "+v"(xv[j]));
        }
        /* One weight vector live at a time: 24 accumulators + 6 inputs + 1 weight = 31 of the 32
         * zmm registers (all four weights at once would spill accumulators to the stack). */
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            __m512 wv = tile_weight(wb, BF, ldw, i, c, 0xffff);
            __asm__("" : "+v"(wv));
            #pragma GCC unroll 6
            for (int j = 0; j < NX; j++) a[i][j] = _mm512_fmadd_ps(wv, xv[j], a[i][j]);
        }
    }
    if (full_end < c1) {
        __mmask16 m = tail_mask(full_end, cols);
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            __m512 wv = tile_weight(wb, BF, ldw, i, full_end, m);
            #pragma GCC unroll 6
            for (int j = 0; j < NX; j++)
                a[i][j] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + (size_t)j * ldx + (full_end - xc0)), a[i][j]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
        #pragma GCC unroll 6
        for (int j = 0; j < NX; j++) _mm512_store_ps(acc + ((size_t)j * nr_all + i) * 16, a[i][j]);
}

#define TILE_CASE(nr, nx) \
    case (nr) * 8 + (nx): tile(wb, BF, ldw, x, ldx, xc0, cols, c0, c1, nr, nx, acc, nr_all); break
#define TILE_CASES(bf)                                                                                      \
    {                                                                                                       \
        const int BF = bf;                                                                                  \
        switch (nr * 8 + nx) {                                                                              \
            TILE_CASE(1, 1); TILE_CASE(1, 2); TILE_CASE(1, 3); TILE_CASE(1, 4); TILE_CASE(1, 5); TILE_CASE(1, 6); \
            TILE_CASE(2, 1); TILE_CASE(2, 2); TILE_CASE(2, 3); TILE_CASE(2, 4); TILE_CASE(2, 5); TILE_CASE(2, 6); \
            TILE_CASE(3, 1); TILE_CASE(3, 2); TILE_CASE(3, 3); TILE_CASE(3, 4); TILE_CASE(3, 5); TILE_CASE(3, 6); \
            TILE_CASE(4, 1); TILE_CASE(4, 2); TILE_CASE(4, 3); TILE_CASE(4, 4); TILE_CASE(4, 5); TILE_CASE(4, 6); \
        }                                                                                                   \
    }

/* One tile call; bf: the weights are BF16 patterns, widened in the tile (see avx512_rows_mul). */
static void tile_chunk(const void *wb, int bf, int ldw, const float *x, size_t ldx, int xc0, int cols, int c0, int c1,
                       int nr, int nx, float *acc, int nr_all) {
    if (bf) TILE_CASES(1) else TILE_CASES(0)
}

/* Rule 1's FP8 input factors of nx inputs (x, cols apart) for the scale block of row r, columns
 * [c0, c1), into out (MUL_CHUNK apart, column c at c - c0): each column times its 128-column
 * block's scale * 2^8, one rounding, as prepared_x does for the other kernels. */
static void scale_inputs(const qmat *w, int r, const float *x, int nx, int c0, int c1, float *out) {
    for (int b = c0; b < c1; b += 128) {
        const __m512 s = _mm512_set1_ps(kernel_fp8_scale(w, r, b));
        for (int j = 0; j < nx; j++)
            for (int c = b; c < MIN(b + 128, c1); c += 16) {
                __mmask16 m = tail_mask(c, c1);
                _mm512_mask_storeu_ps(out + (size_t)j * MUL_CHUNK + (c - c0), m,
                                      _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + (size_t)j * w->cols + c), s));
            }
    }
}

static void avx512_rows_mul(const qmat *w, int r0, int r1, const float *x, int n, float *y, int ldy) {
    if (few_inputs(w, n)) {
        rows_few_inputs(w, r0, r1, x, NULL, n, y, ldy);
        return;
    }
    if (kernel_is_nibbles(w->fmt)) {
        nibble_rows_mul(w, r0, r1, x, NULL, n, y, ldy);
        return;
    }
    /* Decoded rows one cache line further apart than their length: rows of a power-of-two
     * width would otherwise all map to the same L1 sets as each other and as the inputs. Rows
     * decode to f32 once per call, or where those would pass MUL_F32_ROWS_BYTES the tile widens
     * BF16 codes as it loads them (a shift): BF16 rows in place, FP8 and I8_ROW rows decoded to
     * BF16 (exact). FP8's 128-row task of 4096 columns is 2 MiB as f32 rows, all of this Xeon's
     * L2; below that the widening costs more than the copy, once the copy serves enough inputs
     * (BF16 from memory, 2 threads: 2048 x 2048, n = 256, 218-229 -> 250-267 GFLOP/s as f32 rows;
     * 512 x 2048, an Inkling expert: n = 48 184-194 -> 205-228, but n = 24 153-175 -> 131-140). */
    const int cols = w->cols, nr = r1 - r0;
    const int bf = w->fmt != WF_F32 && ((size_t)nr * (size_t)cols * sizeof(float) > MUL_F32_ROWS_BYTES ||
                                        (w->fmt == WF_BF16 && n < BF16_COPY_MIN_N));
    const int in_place = bf && w->fmt == WF_BF16;
    const size_t elem = bf ? sizeof(uint16_t) : sizeof(float);
    const int ldw = in_place ? cols : ((cols + 15) & ~15) + 64 / (int)elem;     /* elements from row to row */
    const size_t row_bytes = (size_t)ldw * elem;
    const size_t decoded = in_place ? 0 : ((size_t)nr * row_bytes / sizeof(float) + 15) & ~(size_t)15;
    /* FP8 inputs arrive unscaled (fp8_raw_from): each pass scales its range of its inputs into
     * xs, MUL_XROWS x MUL_CHUNK floats that stay in L1 while the pass's row tiles read them. */
    const int scaled = w->fmt == WF_FP8;
    float *scratch = kernel_scratch(decoded + (size_t)MUL_XROWS * nr * 16 + (scaled ? (size_t)MUL_XROWS * MUL_CHUNK : 0));
    float *acc = scratch + decoded, *xs = acc + (size_t)MUL_XROWS * nr * 16;
    const char *wb = in_place ? (const char *)kernel_row_ptr(w, r0) : (const char *)scratch;
    for (int r = r0; r < r1 && !in_place; r++)
        KERNEL_FOR_EACH_FORMAT(w->fmt, decode_row(w, F, bf, r, (char *)scratch + (size_t)(r - r0) * row_bytes), (void)0)
    row_stream next = row_stream_after(w, r0, r1, (n + MUL_XROWS - 1) / MUL_XROWS * ((cols + MUL_CHUNK - 1) / MUL_CHUNK) *
                                                      ((nr + TILE_R - 1) / TILE_R));
    for (int j0 = 0, nx_all; j0 < n; j0 += nx_all) {
        nx_all = input_group(n - j0, MUL_XROWS);
        const float *xg = x + (size_t)j0 * cols;
        for (int c0 = 0; c0 < cols; c0 += MUL_CHUNK) {
            int c1 = c0 + MUL_CHUNK < cols ? c0 + MUL_CHUNK : cols;
            if (scaled) scale_inputs(w, r0, xg, nx_all, c0, c1, xs);
            const float *xr = scaled ? xs : xg;
            const size_t ldx = scaled ? MUL_CHUNK : (size_t)cols;
            for (int j = 0; j < nx_all; j += TILE_X)
                for (int i = 0; i < nr; i += TILE_R, row_stream_step(&next))
                    tile_chunk(wb + (size_t)i * row_bytes, bf, ldw, xr + (size_t)j * ldx, ldx, scaled ? c0 : 0, cols, c0, c1,
                               nr - i < TILE_R ? nr - i : TILE_R, nx_all - j < TILE_X ? nx_all - j : TILE_X,
                               acc + ((size_t)j * nr + i) * 16, nr);
        }
        for (int j = 0; j < nx_all; j++) finish_rows(w, r0, nr, acc + (size_t)j * nr * 16, y + (size_t)(j0 + j) * ldy);
    }
}

/* Rule-2 weight factors of one row in column order (qmat_row). */
static void avx512_row_factors(const qmat *w, int r, float *out) {
    const int full = w->cols / 16 * 16;       /* decode_row pads its tail: out holds cols floats */
    const uint8_t *row = kernel_row_ptr(w, r);
    KERNEL_FOR_EACH_FORMAT(w->fmt, for (int c = 0; c < full; c += 16) _mm512_storeu_ps(out + c, decode_step(F, row, c)),
                           (void)0)
    for (int c = full; c < w->cols; c++) out[c] = kernel_weight(w, r, c);
}

#if HAVE_PAIRS
/* rows_mul of a nibble format whose inputs all have BF16 pairs: the register kernels and the
 * tile both use them. */
static void avx512_rows_pairs(const qmat *w, int r0, int r1, const float *x, const uint32_t *pairs, int n, float *y,
                              int ldy) {
    if (few_inputs(w, n)) rows_few_inputs(w, r0, r1, x, pairs, n, y, ldy);
    else nibble_rows_mul(w, r0, r1, x, pairs, n, y, ldy);
}
#endif

#if HAVE_PAIRS || HAVE_INTS
/* The probes' FP4 product (R x C, N input rows), filled once by probe_fill; its inputs qualify
 * for both the pairs and the integer partials. */
enum { PROBE_R = 64, PROBE_C = 1024, PROBE_N = 2 * MUL_XROWS };
static uint8_t probe_codes[PROBE_R * PROBE_C / 2], probe_scales[PROBE_R * PROBE_C / 32];
static float probe_x[PROBE_N * PROBE_C], probe_y[PROBE_N * PROBE_R];
static const qmat probe_w = {WF_FP4, PROBE_R, PROBE_C, probe_codes, probe_scales, NULL, 0, 0, QM_SCRATCH};

static void probe_fill(void) {
    for (int i = 0; i < PROBE_R * PROBE_C / 2; i++) probe_codes[i] = (uint8_t)(i * 37 + i / 64);
    memset(probe_scales, 127, sizeof probe_scales);
    for (int i = 0; i < PROBE_N * PROBE_C; i++) probe_x[i] = (float)(i % 5 + 1) * (i % 3 ? 0.25f : -0.5f);
}

/* Whether run(1, reps) beats run(0, reps), each the same work: alternated, best of 5 each after
 * two warm-up calls (caches, scratch). */
static int second_faster(void (*run)(int second, int reps), int reps) {
    enum { ROUNDS = 5 };
    double best[2] = {1e30, 1e30};
    for (int k = 0; k < 2 * ROUNDS + 2; k++) {
        double t = now_seconds();
        run(k % 2, reps);
        t = now_seconds() - t;
        if (k >= 2 && t < best[k % 2]) best[k % 2] = t;
    }
    return best[1] < best[0];
}
#endif

#if HAVE_PAIRS
/* Whether nibble products take the BF16 pairs on this CPU, per kind of kernel: matvec, the
 * few-input register kernels, the batched tile. Each is timed once per process on a small FP4
 * product that stays in L2, with and without pairs alternated, best of 5 each. The pairs' two dot
 * products replace four FMAs per 64 columns: on Zen 5 that made the FP4 matvec 1.35x and the tile
 * 1.9x as fast; on a Xeon (Sapphire Rapids class, AVX512-BF16) the tile ran at 0.63x (DeepSeek V4
 * prefill 160-168 GFLOP/s with pairs, 201-216 without) and 4 inputs from L3 at 0.5-0.6x. Same
 * bits either way: only the speed depends on the timing. */
enum { PAIR_KINDS = 3 };
static const int pair_probe_n[PAIR_KINDS] = {1, FEW_X, 2 * MUL_XROWS};
static int pairs_faster[PAIR_KINDS];
static uint32_t probe_pairs[PROBE_N * PROBE_C / 2];

static int pair_kind(int n) { return n == 1 ? 0 : n <= NIB_FEW_BATCH ? 1 : 2; }

static void run_pairs_probe(int pairs, int n) {
    for (int rep = 0; rep < PROBE_N / n; rep++) {   /* about the same work at every n */
        if (pairs) avx512_rows_pairs(&probe_w, 0, PROBE_R, probe_x, probe_pairs, n, probe_y, PROBE_R);
        else avx512_rows_mul(&probe_w, 0, PROBE_R, probe_x, n, probe_y, PROBE_R);
    }
}

static void measure_pairs(void) {
    for (int j = 0; j < PROBE_N; j++)
        avx512_nibble_pairs(probe_x + (size_t)j * PROBE_C, PROBE_C, probe_pairs + (size_t)j * (PROBE_C / 2));
    for (int k = 0; k < PAIR_KINDS; k++) pairs_faster[k] = second_faster(run_pairs_probe, pair_probe_n[k]);
}

#endif

#if HAVE_INTS
/* Whether an FP4 matvec takes the integer partials on this CPU, timed once per process as the
 * pairs are (the probe's rows from L2, PROBE_N inputs one after another). */
static uint8_t probe_ints[PROBE_N][PROBE_C / 64 * KERNEL_INT_CHUNK];
static int ints_faster;

static void run_ints_probe(int ints, int reps) {
    for (int j = 0; j < reps; j++) {
        const float *x = probe_x + (size_t)j * PROBE_C;
        if (ints) avx512_rows_ints(&probe_w, 0, PROBE_R, x, probe_ints[j], probe_y);
        else avx512_rows_vec(&probe_w, 0, PROBE_R, x, probe_y);
    }
}

static void measure_ints(void) {
    int qualified = 1;
    for (int j = 0; j < PROBE_N; j++) qualified &= avx512_nibble_ints(probe_x + (size_t)j * PROBE_C, PROBE_C, probe_ints[j]);
    ints_faster = qualified && second_faster(run_ints_probe, PROBE_N);
}

#endif

#if HAVE_PAIRS || HAVE_INTS
/* Both probes, once per process (they share the probe's arrays). */
static pthread_once_t probes_once = PTHREAD_ONCE_INIT;

static void measure_probes(void) {
    probe_fill();
#if HAVE_PAIRS
    measure_pairs();
#endif
#if HAVE_INTS
    measure_ints();
#endif
}
#endif

#if HAVE_PAIRS
/* kernel_path.pairs_pay: as measured, on the first call. */
static int avx512_pairs_pay(int n) {
    pthread_once(&probes_once, measure_probes);
    return pairs_faster[pair_kind(n)];
}
#endif

#if HAVE_INTS
/* kernel_path.ints_pay: as measured, on the first call. */
static int avx512_ints_pay(void) {
    pthread_once(&probes_once, measure_probes);
    return ints_faster;
}
#endif

#if FP8_STEP == 64
static unsigned long long avx512_fp8_converted_groups(void) { return fp8_f16_groups; }
#endif

const kernel_path kernel_path_avx512 = {"avx512", avx512_rows_vec, avx512_rows_mul, 16, avx512_row_factors,
                                        kernel_transpose_avx2,
#if HAVE_PAIRS
                                        avx512_nibble_pairs, avx512_rows_pairs, avx512_pairs_pay,
#else
                                        NULL, NULL, NULL,
#endif
#if FP8_STEP == 64
                                        avx512_fp8_converted_groups,
#else
                                        NULL,
#endif
                                        FEW_BATCH + 1,
#if HAVE_INTS
                                        avx512_nibble_ints, avx512_rows_ints, avx512_ints_pay,
#else
                                        NULL, NULL, NULL,
#endif
};

#endif
