/* kernels.h — matrix x vector and matrix x (small batch of rows) for every weight format.
 *
 * A qmat describes a weight matrix W [rows, cols] as stored in the checkpoint (no copy):
 *   WF_F32  : float [rows][cols]
 *   WF_BF16 : uint16 [rows][cols]
 *   WF_FP8  : E4M3 bytes [rows][cols] + a scale per 128x128 block [ceil(rows/128)][ceil(cols/128)],
 *             E8M0 (`scale`) or F32 (`scale_f32`, any value: GLM-5-FP8 / DeepSeek-V3 `_scale_inv`)
 *   WF_FP4  : E2M1 nibbles [rows][cols/2] (low nibble = even column) + E8M0 scale [rows][cols/32]
 *   WF_NVFP4: the same nibbles + E4M3 scale [rows][cols/16] (`scale`) + one f32 global scale per
 *             matrix: W = code value * scale / global (compressed-tensors `weight_global_scale`,
 *             global_divides) or * global (ModelOpt `weight_scale_2`)
 * and the colibri integer containers (QT formats 1, 2 and 4), symmetric, scales in `scale_f32`:
 *   WF_I8_ROW : int8 [rows][cols] + one f32 scale per row
 *   WF_I4_ROW : nibbles [rows][ceil(cols/2)] (low nibble = even column, value = nibble - 8)
 *               + one f32 scale per row
 *   WF_I4_G64 : the same nibbles + one f32 scale per row and group of 64 columns [rows][ceil(cols/64)]
 * y = W x computes y[r] = sum_c W[r][c] * x[c] with W[r][c] = code value * scale. Power-of-two
 * scales make that product exact; an f32 scale adds at most one rounding per product or partial
 * sum (kernels_path.h says where), the same on every path.
 *
 * CHUNKING INVARIANCE (hard requirement, reuse_design.md §6): y[r] for one input row is
 * bit-identical whether computed by qmat_vec, or by qmat_mul inside a batch of any size and any
 * position in that batch, on any number of threads. Each output element is reduced in one fixed
 * order that depends only on `cols`.
 *
 * SIMD: the best path for the build machine is compiled in (AVX-512 / AVX2+FMA+F16C), and the
 * scalar path is always available; kernels_force_scalar(1) selects it at run time. Every path
 * implements the same canonical reduction order (kernels_path.h), so scalar, AVX2 and AVX-512
 * results are bitwise equal: a checkpoint gives the same logits on every machine.
 */
#ifndef CAIRN_KERNELS_H
#define CAIRN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { WF_F32, WF_BF16, WF_FP8, WF_FP4, WF_I8_ROW, WF_I4_ROW, WF_I4_G64, WF_NVFP4 } wformat;

/* What a matrix is, for kernels_streamed: a view of state or activations (0: cached rows that
 * attention multiplies through the kernels), or a checkpoint weight, dense or a routed expert's
 * (the tensor table marks its matrices). */
typedef enum { QM_SCRATCH, QM_DENSE, QM_ROUTED } qmat_source;

typedef struct {
    wformat fmt;
    int rows, cols;
    const void *data;
    const uint8_t *scale;       /* E8M0 block scales (FP8, FP4), E4M3 (NVFP4), else NULL */
    const float *scale_f32;     /* FP8 block scales when set (then `scale` is unused); the integer
                                 * formats' row or group scales; else NULL */
    float global_scale;         /* NVFP4: the per-matrix scale (finite, > 0), held by value */
    int global_divides;         /* NVFP4: 1 = the weights are divided by it, 0 = multiplied */
    qmat_source source;
} qmat;

const char *wformat_name(wformat f);
size_t qmat_bytes(const qmat *w);                    /* weight + scale bytes read by one pass */
size_t qmat_data_bytes(const qmat *w);               /* the codes at `data` */
size_t qmat_scale_bytes(const qmat *w);              /* the scales at `scale` / `scale_f32` (0 if none) */

/* y[rows] = W x[cols] */
void qmat_vec(const qmat *w, const float *x, float *y);
/* Y[n][rows] = X[n][cols] W^T: n input rows, each result bit-identical to qmat_vec on that row. */
void qmat_mul(const qmat *w, const float *x, int n, float *y);
/* Same as qmat_mul but only output rows [r0, r1) of W, written to y[n][r1-r0]
 * (used for the per-group wo_a projection and per-expert slices). */
void qmat_mul_rows(const qmat *w, int r0, int r1, const float *x, int n, float *y);

/* Row r of W times x: the bits qmat_vec gives for that row (and the bytes it counts), computed
 * on the calling thread without the pool's hand-off or the call numbering, for the many short
 * products of attention scores, where those cost more than the product. */
float qmat_dot_row(const qmat *w, int r, const float *x);

/* Y_k[n][W_k rows] = X[n][cols] W_k^T for `count` matrices of the same cols that read the same
 * input (an expert's gate and up, projections of one hidden state), as one pool job: one wait
 * for all of them instead of one per matrix. Each Y_k is bit-identical to qmat_mul(W_k). */
#define QMAT_EACH_MAX 6
void qmat_mul_each(int count, const qmat *const *w, const float *x, int n, float *const *y);

/* Dequantize row r of W into out[cols] (embedding lookups, tests). */
void qmat_row(const qmat *w, int r, float *out);

/* Checkpoint weight bytes the matrix products (qmat_vec / qmat_mul / qmat_mul_rows) have read
 * since the start, QM_DENSE and QM_ROUTED apart: one call reads its rows once, whatever its batch
 * size n, so a forward pass that batches k sequences adds to `dense` what one sequence's pass
 * adds (routed experts depend on what the tokens choose). qmat_row and QM_SCRATCH views are not
 * counted. */
void kernels_streamed(unsigned long long *dense, unsigned long long *routed);
/* Wall seconds since the start in products of dense checkpoint weights (QM_DENSE) called outside
 * pool work: with kernels_streamed's dense bytes, the rate those weights stream at in a forward
 * pass. Products called inside pool work (a MoE layer's experts, one per task) overlap each
 * other and are not counted here. */
double kernels_dense_seconds(void);

/* (weight row, input row) dot products of nibble formats computed from exact BF16 pairs since the
 * start (kernels_path.h: the input qualified and the path has them), for tests and benches that
 * must see the fast path fire; the results are the same bits either way. */
unsigned long long kernels_paired_products(void);
int kernels_has_pairs(void);                         /* the active path has them */
/* FP4 (weight row, input) dot products of matvecs computed from exact integer partials since the
 * start (kernels_path.h: the input qualified and the path has them, AVX-512 with VNNI and VBMI),
 * for tests and benches that must see the fast path fire; the same bits either way.
 * kernels_ints_pay says whether the active path takes them (it times them once per process
 * against its f32 matvec); kernels_force_ints(1 / 0) fixes the choice, -1 returns to the measured
 * one. */
unsigned long long kernels_int_products(void);
int kernels_has_ints(void);
int kernels_ints_pay(void);
void kernels_force_ints(int mode);
/* FP8 64-code groups the calling thread's matvec and few-input kernels decoded through the f16
 * conversion (a code with exponent field 0: zero or subnormal) instead of the BF16 patterns the
 * others take, for tests that must see which decode ran; -1 where the active path has one decode
 * for every code. The factors, and so the results, are the same bits either way. */
long long kernels_fp8_converted_groups(void);
/* Whether a nibble product of n inputs takes the pairs: a CPU's BF16 dot products can be slower
 * than its FMAs, so the AVX-512 path times the matvec, the few-input kernels and the batched tile
 * with and without them once per process and keeps the faster (the same bits either way).
 * kernels_force_pairs(1 / 0) fixes the choice (tests run both), -1 returns to the measured one. */
int kernels_pairs_pay(int n);
void kernels_force_pairs(int mode);

/* dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols: an exact copy (a transposed
 * operand for qmat_mul), in SIMD blocks where the path has them. */
void kernels_transpose(const float *src, int rows, int cols, size_t lds, float *dst, size_t ldd);

void kernels_force_scalar(int on);
const char *kernels_simd_name(void);                 /* "avx512", "avx2" or "scalar" */

#endif
