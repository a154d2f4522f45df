/* kernels_path.h — private interface between kernels.c and its SIMD files (kernels_avx2.c,
 * kernels_avx512.c). Not for use outside src/core/kernels*.c.
 *
 * THE CANONICAL REDUCTION ORDER, which every path implements exactly so that all paths give
 * bit-identical results (scalar == AVX2 == AVX-512):
 *  1. Each term is one FMA of a weight factor and an input factor (kernel_weight):
 *     - F32, BF16: the weight and x[c].
 *     - FP8: the E4M3 code read as f16 (value * 2^-8, exact, unscaled), and x[c] times its
 *       block's scale * 2^8, rounded once (prepared_x in kernels.c). The product is code value *
 *       scale * x[c]; putting the scale on the input saves a multiply per weight, and the
 *       scaled input is shared by the 128 rows of a scale block. Scale * 2^8 is exact for E8M0
 *       and F32 scales alike, so an arbitrary F32 scale costs only that one input rounding.
 *     - FP4, NVFP4: twice the E2M1 value (an integer in -12..12, exact, unscaled) and x[c];
 *       the block's scale / 2 multiplies partial sums instead (rule 4), and NVFP4's per-matrix
 *       global scale the finished sum (rule 5).
 *     - I4_ROW, I4_G64: the code value nibble - 8 (exact, unscaled) and x[c]; the row's or
 *       group's f32 scale multiplies partial sums (rule 4).
 *     - I8_ROW: the int8 code (exact, unscaled) and x[c]; the row's f32 scale multiplies the
 *       finished sum (rule 5).
 *  2. Columns are padded with zeros to a multiple of 16. Lane l (0..15) accumulates, in column
 *     order, acc[l] = fma(w[c], x[c], acc[l]) over every c with c % 16 == l, starting from +0.
 *  3. The 16 lanes are summed by kernel_tree16: a[i] + a[i+8], then + 4 apart, + 2 apart, + 1.
 *  4. The nibble formats (FP4, I4_ROW, I4_G64) replace rule 2 (kernel_nibble_blocks): columns
 *     are zero-padded to 32-column blocks. In block b, each group of 4 columns 4g..4g+3
 *     (g = 0..7) forms a partial p = w*x of its first column, then p = fma(w, x, p) over the
 *     other three in order; it is added as acc[l] = fma(p, s_b, acc[l]) to lane
 *     l = 8 * (g / 4) + 4 * (b % 2) + g % 4, where s_b is the block's scale factor
 *     (kernel_nibble_scale): FP4 its E8M0 scale / 2, I4_G64 the scale of its 64-column group
 *     (b / 2), I4_ROW the row's scale, NVFP4 the E4M3 scale / 2 of the 16 columns the group
 *     lies in (sub-block 2b + g / 4, so lanes 0..7 take the first half of a block, 8..15 the
 *     second). FP4's scale is a power of two, so this equals scaling each weight (barring
 *     over/underflow); an f32 or E4M3 scale rounds once per partial. All four decode with a
 *     constant table and take the scale per block, in one SIMD implementation.
 *  5. I8_ROW follows rules 2 and 3 on the int8 codes; the tree's result is then multiplied once
 *     by the row's f32 scale (kernel_row_finish): one multiply per output, not per weight.
 *     NVFP4's tree result is then divided by its global scale (compressed-tensors
 *     `weight_global_scale`, whose dequantization divides) or multiplied by it (ModelOpt
 *     `weight_scale_2`, which multiplies): one operation per output.
 * Consequently a result depends only on the row's weights, x and cols: never on batching,
 * position in a batch, thread count or which path computed it. (The AVX-512 path is held to
 * the same order; it is compiled but could not be run on the machine it was written on.)
 */
#ifndef CAIRN_KERNELS_PATH_H
#define CAIRN_KERNELS_PATH_H

#include "kernels.h"
#include "quant.h"

typedef struct {
    const char *name;
    /* y[r - r0] = canonical dot product of row r of w with x, for r in [r0, r1). x holds the
     * input factors of rule 1 (for FP8 the scaled input, and then all rows share a scale block). */
    void (*rows_vec)(const qmat *w, int r0, int r1, const float *x, float *y);
    /* y[j * ldy + (r - r0)] = that dot product with x + j * cols, for r in [r0, r1), j in [0, n).
     * For FP8 with n >= fp8_raw_from, x is the input itself and the path scales it (rule 1). */
    void (*rows_mul)(const qmat *w, int r0, int r1, const float *x, int n, float *y, int ldy);
    /* Vector width (8 or 16 lanes) whose kernel_nibble_permute_x order nibble-format input rows
     * must arrive in (the SIMD decode order), or 0 for column order. */
    int nibble_width;
    /* out[c] = rule 1's weight factor (r, c) for c < cols (kernel_weight, unscaled), for the
     * rule-2 formats; NULL: kernel_weight per element. qmat_row applies the scales. */
    void (*row_factors)(const qmat *w, int r, float *out);
    /* dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (kernels_transpose). */
    void (*transpose)(const float *src, int rows, int cols, size_t lds, float *dst, size_t ldd);
    /* Optional (NULL where the path has none): the exact BF16 pairs of rule 4's partials.
     * nibble_pairs writes them for the full 64-column chunks of one input row in the path's
     * nibble order (cols / 64 * 32 words) and returns 1 if every 4-column group's partial is
     * exact in f32 whatever the order of its terms (then a BF16 dot product gives the FMA
     * chain's bits); else 0. rows_pairs is rows_mul for a nibble format whose n inputs all
     * returned 1, their pairs cols / 64 * 32 words apart. */
    int (*nibble_pairs)(const float *x, int cols, uint32_t *out);
    void (*rows_pairs)(const qmat *w, int r0, int r1, const float *x, const uint32_t *pairs, int n, float *y, int ldy);
    /* Optional beside them (NULL: always): whether a product of n inputs takes the pairs on this
     * CPU, where they are not faster everywhere (kernels_pairs_pay; kernels_force_pairs overrides
     * it in kernels.c). */
    int (*pairs_pay)(int n);
    /* Optional (NULL where the path decodes every FP8 code one way): FP8 64-code groups the
     * calling thread decoded through the f16 conversion because a code had exponent field 0,
     * where the others take the cheaper exact BF16 patterns (kernels_fp8_converted_groups). */
    unsigned long long (*fp8_converted_groups)(void);
    /* FP8 batches of at least this many inputs reach rows_mul unscaled (0: never): the path
     * multiplies each column by its block's scale * 2^8 itself, a tile's inputs at a time where
     * they stay in L1, instead of reading a scaled copy of all n inputs from L2. Same product. */
    int fp8_raw_from;
    /* Optional (NULL where the path has none): an FP4 product of one input from exact integer
     * partials. nibble_ints writes an input row's integer form (KERNEL_INT_CHUNK bytes per full
     * 64-column chunk, from x in column order) and returns 1 if every chunk qualifies, so that each
     * 4-column group's partial is exact in f32 and the integer dot products give rule 4's bits;
     * else 0. rows_ints is rows_vec from that form (x as rows_vec reads it, for the columns past
     * the last full chunk). ints_pay: whether they are faster than rows_vec on this CPU. */
    int (*nibble_ints)(const float *x, int cols, uint8_t *out);
    void (*rows_ints)(const qmat *w, int r0, int r1, const float *x, const uint8_t *ints, float *y);
    int (*ints_pay)(void);
} kernel_path;

/* Bytes of nibble_ints' form per 64-column chunk. */
#define KERNEL_INT_CHUNK 320

extern const kernel_path kernel_path_scalar;
extern const kernel_path kernel_path_avx2;     /* defined only when compiled with AVX2+FMA+F16C */
extern const kernel_path kernel_path_avx512;   /* defined only when compiled with AVX-512F + BW (+ AVX2) */
/* The AVX2 path's transpose (8 x 8 blocks), which the AVX-512 path uses too. */
void kernel_transpose_avx2(const float *src, int rows, int cols, size_t lds, float *dst, size_t ldd);
/* Element by element, for what a SIMD transpose leaves: rows [r0, rows) of columns [c0, cols). */
void kernel_transpose_scalar(const float *src, int r0, int rows, int c0, int cols, size_t lds, float *dst, size_t ldd);

/* 256-entry table: E4M3 byte read as an f16 bit pattern ((b&0x7f)<<7 | (b&0x80)<<8), i.e. the
 * E4M3 value times 2^-8 (the NaN codes read as +-480 * 2^-8; checkpoints do not contain them). */
extern float kernel_fp8_lut[256];
/* 16-entry tables of nibble weight factors: FP4 twice the E2M1 value (0, 1, 2, 3, 4, 6, 8, 12,
 * signed; code 8, -0, is +0: a zero weight's sign cannot reach a sum that starts from +0), and
 * the integer formats' nibble - 8. */
extern const float kernel_fp4_lut[16];
extern const float kernel_i4_lut[16];
/* The low and high bytes of bf16(factor) of each code (all exact in bf16), for SIMD table
 * lookups: index 0 FP4, 1 the integer nibble formats. */
extern uint8_t kernel_nibble_bf16_lo[2][16], kernel_nibble_bf16_hi[2][16];

/* E8M0 byte -> scale * 2^8 (FP8, applied to the input) and scale / 2 (FP4): rule 1's factors. */
extern float kernel_fp8_scale_lut[256];
extern float kernel_fp4_scale_lut[256];
/* E4M3 byte -> its value / 2: NVFP4's rule-4 factor (exact; before the global scale). */
extern float kernel_nvfp4_scale_lut[256];

/* Scale factor of FP8 weight (r, c) in rule 1: its block's scale * 2^8 (E8M0 or F32 grid). */
float kernel_fp8_scale(const qmat *w, int r, int c);
static inline size_t kernel_nibble_row_bytes(const qmat *w) {   /* ceil(cols / 2): the nibble formats */
    return ((size_t)w->cols + 1) / 2;
}
/* Scales per scale row (FP8: per 128 rows; I4_G64: groups; NVFP4: 16-column sub-blocks; FP4: blocks).
 * Inline: the nibble kernels look up a row's scales once per row. */
static inline size_t kernel_scale_row_len(const qmat *w) {
    size_t block = w->fmt == WF_FP8 ? 128 : w->fmt == WF_I4_G64 ? 64 : w->fmt == WF_NVFP4 ? 16 : 32;
    return ((size_t)w->cols + block - 1) / block;
}


/* Rule 4 for nibble-format row r over blocks [b0, end): adds into acc[16]. x holds the input
 * for those columns at their own positions (kernel_nibble_permute_x leaves the tail in place). */
void kernel_nibble_blocks(const qmat *w, int r, int b0, const float *x, float acc[16]);

/* Nibble SIMD input order. A full 64-column chunk (blocks b, b + 1) feeds each of rule 4's 16
 * lanes L one 4-term partial: block b + (L / 4) % 2, group g = 4 * (L / 8) + L % 4, so term t
 * (0..3) of lane L is column 32 * ((L / 4) % 2) + 16 * (L / 8) + 4 * (L % 4) + t of the chunk.
 * Width 16 stores it at 16 * t + L (vector t = term t of all 16 lanes); width 8 at
 * 32 * (L / 8) + 8 * t + L % 8 (two vectors per term, lanes 0..7 then 8..15). Columns past the
 * last full chunk are copied. */
void kernel_nibble_permute_x(const float *x, int cols, int width, float *out);

float kernel_tree16(const float acc[16]);

/* Thread-local scratch of at least n floats, 64-byte aligned; grows, never shrinks. */
float *kernel_scratch(size_t n);

/* Run `call` with the constant F set to format f for the rule-2 formats (rule 5's too), or
 * `nibble_call` for the rule-4 formats, so always-inline SIMD code is specialised per format
 * and the format switch leaves the inner loops. */
#define KERNEL_FORMAT_CASE(fmt, call) \
    case fmt: { const wformat F = fmt; (void)F; call; } break;
#define KERNEL_FOR_EACH_FORMAT(f, call, nibble_call)    \
    switch (f) {                                        \
    KERNEL_FORMAT_CASE(WF_F32, call)                    \
    KERNEL_FORMAT_CASE(WF_BF16, call)                   \
    KERNEL_FORMAT_CASE(WF_FP8, call)                    \
    KERNEL_FORMAT_CASE(WF_I8_ROW, call)                 \
    KERNEL_FORMAT_CASE(WF_FP4, nibble_call)             \
    KERNEL_FORMAT_CASE(WF_I4_ROW, nibble_call)          \
    KERNEL_FORMAT_CASE(WF_I4_G64, nibble_call)          \
    KERNEL_FORMAT_CASE(WF_NVFP4, nibble_call)           \
    }

static inline int kernel_is_nibbles(wformat f) {
    return f == WF_FP4 || f == WF_I4_ROW || f == WF_I4_G64 || f == WF_NVFP4;
}

/* The nibble formats whose codes are E2M1 (kernel_fp4_lut), not integers. */
static inline int kernel_nibble_is_e2m1(wformat f) { return f == WF_FP4 || f == WF_NVFP4; }

/* Weight factor (r, c) of rule 1 (unscaled for the scaled formats); 0 for c >= cols (the zero
 * padding). Inline: the scalar paths and the SIMD tails call it per element, and inlined into
 * their loops the format switch is hoisted out (on the tiny test models, whose widths are not
 * multiples of 16, an out-of-line call per weight was a quarter of the decode time). */
static inline float kernel_weight(const qmat *w, int r, int c) {
    if (c >= w->cols) return 0.0f;
    size_t cols = (size_t)w->cols;
    switch (w->fmt) {
    case WF_F32: return ((const float *)w->data)[(size_t)r * cols + c];
    case WF_BF16: return bf16_to_f32(((const uint16_t *)w->data)[(size_t)r * cols + c]);
    case WF_FP8: return kernel_fp8_lut[((const uint8_t *)w->data)[(size_t)r * cols + c]];
    case WF_I8_ROW: return (float)((const int8_t *)w->data)[(size_t)r * cols + c];
    case WF_FP4:
    case WF_NVFP4:
    case WF_I4_ROW:
    case WF_I4_G64: {
        uint8_t byte = ((const uint8_t *)w->data)[(size_t)r * kernel_nibble_row_bytes(w) + (size_t)c / 2];
        int code = c & 1 ? byte >> 4 : byte & 15;
        return kernel_nibble_is_e2m1(w->fmt) ? kernel_fp4_lut[code] : kernel_i4_lut[code];
    }
    }
    return 0.0f;
}

/* Byte offset of column c within a row (nibble formats: c even). */
static inline size_t kernel_col_bytes(wformat f, int c) {
    if (kernel_is_nibbles(f)) return (size_t)c / 2;
    return f == WF_F32 ? (size_t)c * 4 : f == WF_BF16 ? (size_t)c * 2 : (size_t)c;
}

static inline const uint8_t *kernel_row_ptr(const qmat *w, int r) {
    size_t row_bytes = kernel_is_nibbles(w->fmt) ? kernel_nibble_row_bytes(w) : kernel_col_bytes(w->fmt, w->cols);
    return (const uint8_t *)w->data + (size_t)r * row_bytes;
}

/* Bytes ahead of a matvec's walk that kernel_prefetch_far touches. */
#define KERNEL_FAR_AHEAD (32u << 10)

/* The line KERNEL_FAR_AHEAD bytes past `at` (where a matvec's walk over its rows is, in memory
 * order), into L2, if it lies before `end` (past the matrix's last code byte). Matvecs call it
 * for one line in four of their stream. Their near prefetches run a few KiB ahead
 * (kernel_group_ahead), too few lines in flight for one thread to stream from memory (measured
 * when they went into L1); a touch well ahead starts the L2 prefetchers on those lines early.
 * Xeon, from memory, two threads: FP4 1024 x 2048 (DeepSeek V4's expert shape) 16.6-17.4 ->
 * 19.6-20.9 GB/s, one thread 8.5-8.8 -> 10.2-10.6 (12.7 in cache); FP8 matvecs of DeepSeek V4's
 * bench model 3-8 % faster each. Changes no result. */
static inline void kernel_prefetch_far(const uint8_t *at, const uint8_t *end) {
    if (end - at > (ptrdiff_t)KERNEL_FAR_AHEAD) __builtin_prefetch(at + KERNEL_FAR_AHEAD, 0, 1);
}

/* Prefetch into L2 a later row group of a walk over nr consecutive rows (row0 its first),
 * `ahead` bytes on (kernel_group_ahead), in memory order: called once per 64 bytes each row
 * consumes, `done` bytes into each row, it fetches nr lines of that group from where the
 * previous call stopped, and touches one line far ahead of the walk (kernel_prefetch_far; `end`
 * past the matrix's last code byte). A kernel reading nr rows side by side presents nr short
 * interleaved streams; prefetching the same lines in ascending order presents one, which streams
 * from memory faster (nibble rows of 512 B-1 KiB, see kernels_avx512.c). Into L2 (prefetcht1)
 * rather than L1, and at least 8 KiB ahead rather than 4: DeepSeek V4 bench decode, alternated,
 * 12 of 15 pairs faster, medians +1 to +4 %; GLM 4 of 5, Kimi K3 2 of 4 (Xeon, two threads); one
 * thread's FP4 1024 x 2048 matvec from memory 12.3-12.8 -> 13.0-13.1 GB/s. Changes no result. */
static inline void kernel_prefetch_next_group(const uint8_t *row0, int nr, size_t done, size_t ahead,
                                              const uint8_t *end) {
    for (int i = 0; i < nr; i++) __builtin_prefetch(row0 + ahead + done * (size_t)nr + 64 * (size_t)i, 0, 2);
    kernel_prefetch_far(row0 + done * (size_t)nr, end);
}

/* How far kernel_prefetch_next_group (and dot_rows' row by row prefetch) runs ahead of a walk
 * over groups of nr rows: the next group, or as many groups as make KERNEL_NEAR_AHEAD bytes where
 * the rows are short. A group of 2 KiB (four FP4 rows of 1024 columns, DeepSeek V4's expert down
 * projection) fetched one group ahead left one thread's FP4 2048 x 1024 matvec from memory at
 * 12.3-12.9 GB/s; two groups ahead, 13.0-14.1 (Xeon, 400 matrices, integer partials and f32 path
 * alike). 8 KiB with the L2 prefetch: see kernel_prefetch_next_group. */
#define KERNEL_NEAR_AHEAD 8192u
static inline size_t kernel_group_ahead(const qmat *w, int nr) {
    size_t group = (size_t)(kernel_row_ptr(w, nr) - kernel_row_ptr(w, 0));
    return group ? (KERNEL_NEAR_AHEAD + group - 1) / group * group : 0;
}

/* The scales row r of a nibble format reads, for kernel_nibble_scale: FP4 its E8M0 bytes,
 * NVFP4 its E4M3 bytes, I4_G64 its group scales, I4_ROW its one scale. */
static inline const void *kernel_nibble_scale_row(const qmat *w, int r) {
    if (kernel_nibble_is_e2m1(w->fmt)) return w->scale + (size_t)r * kernel_scale_row_len(w);
    if (w->fmt == WF_I4_G64) return w->scale_f32 + (size_t)r * kernel_scale_row_len(w);
    return w->scale_f32 + r;
}

/* Rule 4's scale factor of block b's groups in half `half` (groups 4 * half .. 4 * half + 3),
 * from kernel_nibble_scale_row; only NVFP4 has a scale per half. The caller reads NVFP4's
 * second half only where the row has those columns. */
static inline float kernel_nibble_scale(wformat f, const void *srow, int b, int half) {
    if (f == WF_FP4) return kernel_fp4_scale_lut[((const uint8_t *)srow)[b]];
    if (f == WF_NVFP4) return kernel_nvfp4_scale_lut[((const uint8_t *)srow)[2 * b + half]];
    return ((const float *)srow)[f == WF_I4_G64 ? b / 2 : 0];
}

/* Rule 5: I8_ROW's sum times its row scale, NVFP4's sum divided or multiplied by its global
 * scale; other formats' sums unchanged. */
static inline float kernel_row_finish(const qmat *w, int r, float sum) {
    if (w->fmt == WF_NVFP4) return w->global_divides ? sum / w->global_scale : sum * w->global_scale;
    return w->fmt == WF_I8_ROW ? sum * w->scale_f32[r] : sum;
}

#endif
