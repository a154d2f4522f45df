/* kernels.c — qmat public API: format bookkeeping, the thread split and the scalar path.
 *
 * Threads split output rows only, so each output element is computed whole by one call of the
 * selected path and inherits the path's canonical reduction order (kernels_path.h). The scalar
 * path below is the reference statement of that order; the SIMD paths reproduce it bit for bit. */
#include "kernels.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels_path.h"
#include "quant.h"
#include "threads.h"
#include "util.h"

/* Output rows per task. Matvec: a few rows interleaved give the SIMD paths independent FMA
 * chains. Batched: every task reads all n input rows (and FP8 scales them per 128-row block on
 * each thread that meets the block), so enough rows to amortise that input traffic, few enough
 * that a task's dequantized rows stay in L2 while the input rows stream past them. */
#define VEC_ROWS_PER_TASK 4
#define MUL_ROWS_PER_TASK 48    /* a multiple of every path's tile height (2, 3, 4) */
/* FP8 products of prefill size (at least FP8_BLOCK_TASK_N input rows) take one 128-row scale
 * block per task instead, so each block's input rows are scaled once (prepared_x): with tasks
 * of 48 rows, every thread that met a block scaled all n x cols inputs for it again, 2.67
 * scalings per block on two threads, and the scaled copy (2 MiB at 256 x 2048) streamed through
 * L2 each time. Decode-sized batches keep the finer split: their scaled input is small. (A path
 * with fp8_raw_from scales a batch's inputs inside its tile loop instead, where they stay in L1;
 * whole scale blocks per task keep that scaling once per block there too.) */
#define FP8_ROWS_PER_TASK 128
#define FP8_BLOCK_TASK_N 9

float kernel_fp8_lut[256];
float kernel_fp8_scale_lut[256];
float kernel_fp4_scale_lut[256];
float kernel_nvfp4_scale_lut[256];

uint8_t kernel_nibble_bf16_lo[2][16], kernel_nibble_bf16_hi[2][16];

const float kernel_fp4_lut[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
const float kernel_i4_lut[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

__attribute__((constructor)) static void kernel_luts_init(void) {
    for (int b = 0; b < 256; b++) {
        kernel_fp8_lut[b] = f16_to_f32((uint16_t)((b & 0x7f) << 7 | (b & 0x80) << 8));
        kernel_fp8_scale_lut[b] = e8m0_to_f32((uint8_t)b) * 256.0f;
        kernel_fp4_scale_lut[b] = e8m0_to_f32((uint8_t)b) * 0.5f;
        kernel_nvfp4_scale_lut[b] = e4m3_to_f32((uint8_t)b) * 0.5f;
    }
    for (int code = 0; code < 16; code++) {
        uint16_t fp4 = f32_to_bf16(kernel_fp4_lut[code]), i4 = f32_to_bf16(kernel_i4_lut[code]);
        kernel_nibble_bf16_lo[0][code] = (uint8_t)fp4;
        kernel_nibble_bf16_hi[0][code] = (uint8_t)(fp4 >> 8);
        kernel_nibble_bf16_lo[1][code] = (uint8_t)i4;
        kernel_nibble_bf16_hi[1][code] = (uint8_t)(i4 >> 8);
    }
}

const char *wformat_name(wformat f) {
    switch (f) {
    case WF_F32: return "f32";
    case WF_BF16: return "bf16";
    case WF_FP8: return "fp8";
    case WF_FP4: return "fp4";
    case WF_I8_ROW: return "i8-row";
    case WF_I4_ROW: return "i4-row";
    case WF_I4_G64: return "i4-g64";
    case WF_NVFP4: return "nvfp4";
    }
    return "unknown";
}

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

size_t qmat_data_bytes(const qmat *w) {
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    switch (w->fmt) {
    case WF_F32: return rows * cols * 4;
    case WF_BF16: return rows * cols * 2;
    case WF_FP8: case WF_I8_ROW: return rows * cols;
    case WF_FP4: case WF_I4_ROW: case WF_I4_G64: case WF_NVFP4: return rows * kernel_nibble_row_bytes(w);
    }
    return 0;
}

size_t qmat_scale_bytes(const qmat *w) {
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    switch (w->fmt) {
    case WF_F32: case WF_BF16: return 0;
    case WF_FP8: return ceil_div(rows, 128) * ceil_div(cols, 128) * (w->scale_f32 ? 4 : 1);
    case WF_FP4: return rows * ceil_div(cols, 32);
    case WF_NVFP4: return rows * ceil_div(cols, 16);   /* the global scale is held by value */
    case WF_I8_ROW: case WF_I4_ROW: return rows * 4;
    case WF_I4_G64: return rows * ceil_div(cols, 64) * 4;
    }
    return 0;
}

size_t qmat_bytes(const qmat *w) { return qmat_data_bytes(w) + qmat_scale_bytes(w); }

float kernel_fp8_scale(const qmat *w, int r, int c) {
    size_t at = (size_t)(r / 128) * kernel_scale_row_len(w) + (size_t)(c / 128);
    return w->scale_f32 ? w->scale_f32[at] * 256.0f : kernel_fp8_scale_lut[w->scale[at]];
}

float kernel_tree16(const float acc[16]) {
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++) s8[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

static _Thread_local float *scratch;
static _Thread_local size_t scratch_len;

/* Out of memory here is as fatal as in xmalloc (util.h): kernels have no error path. */
static void *scratch_alloc(size_t bytes) {
    void *p = aligned_alloc(64, ceil_div(bytes, 64) * 64);
    if (!p) {
        fprintf(stderr, "cairn: out of memory allocating %zu bytes of kernel scratch\n", bytes);
        abort();
    }
    return p;
}

float *kernel_scratch(size_t n) {
    if (n > scratch_len) {
        free(scratch);
        scratch_len = n + 64;
        scratch = scratch_alloc(scratch_len * sizeof(float));
    }
    return scratch;
}

static void weight_row(const qmat *w, int r, float *out) {
    for (int c = 0; c < w->cols; c++) out[c] = kernel_weight(w, r, c);
}

/* out[c] = x[c] * scale for c < n, in blocks of 16 with a constant trip count so that GCC's -O2
 * vectorizer takes them (it refuses loops that need a scalar remainder; scalar, this loop was 5 %
 * of a DeepSeek V4 prefill). One multiply per element either way: the same bits. */
static void scale_columns(float *restrict out, const float *restrict x, int n, float scale) {
    int full = n / 16 * 16;
    for (int c0 = 0; c0 < full; c0 += 16)
        for (int c = c0; c < c0 + 16; c++) out[c] = x[c] * scale;
    for (int c = full; c < n; c++) out[c] = x[c] * scale;
}

/* The input rows a path reads for rows from r on: x itself, FP8's scaled input of rule 1 for the
 * scale block of r (each column times its block's scale * 2^8), or the nibble formats' permuted
 * input, with its exact BF16 pairs where the path has them and every row qualifies
 * (kernel_path.nibble_pairs; `pairs` NULL otherwise), or for an FP4 matvec its exact integer form
 * where the path has one and the input qualifies (kernel_path.nibble_ints; `ints` NULL otherwise,
 * and then pairs are not made). Kept per thread for the current call (`call` numbers every
 * qmat_mul_rows), since a thread's contiguous rows mostly share one FP8 block and every nibble
 * row one input order. */
typedef struct {
    const float *x;
    const uint32_t *pairs;
    const uint8_t *ints;
} prepared;

/* kernels_force_pairs' and kernels_force_ints' settings: -1 as the path measured (the default),
 * 0 off, 1 on. */
static int pairs_mode = -1, ints_mode = -1;

/* Whether `path` takes the BF16 pairs for a nibble product of n inputs (kernels_pairs_pay). */
static int path_pairs_pay(const kernel_path *path, int n) {
    if (!path->nibble_pairs) return 0;
    if (pairs_mode >= 0) return pairs_mode;
    return !path->pairs_pay || path->pairs_pay(n);
}

/* Whether `path` takes the integer partials for a product of n inputs with w (kernels_ints_pay). */
static int path_ints_pay(const kernel_path *path, const qmat *w, int n) {
    if (!path->nibble_ints || w->fmt != WF_FP4 || n != 1 || w->cols < 64) return 0;
    if (ints_mode >= 0) return ints_mode;
    return !path->ints_pay || path->ints_pay();
}

static uint32_t *grow(uint32_t **buf, size_t *cap, size_t words) {
    if (words > *cap) {
        free(*buf);
        *cap = words;
        *buf = scratch_alloc(sizeof(uint32_t) * words);
    }
    return *buf;
}

/* Whether the path reads a prepared input for w's rows (prepared_x) rather than x itself, in a
 * product of n inputs. */
static int input_prepared(const kernel_path *path, const qmat *w, int n) {
    if (w->fmt == WF_FP8) return !path->fp8_raw_from || n < path->fp8_raw_from;
    return kernel_is_nibbles(w->fmt) && path->nibble_width;
}

static prepared prepared_x(const kernel_path *path, const qmat *w, int r, const float *x, int n,
                           unsigned long long call) {
    static _Thread_local uint32_t *buf, *pair_buf, *int_buf;
    static _Thread_local size_t cap, pair_cap, int_cap;
    static _Thread_local unsigned long long cached_call;
    static _Thread_local int cached_block = -1;
    static _Thread_local prepared cached;
    int fp8 = w->fmt == WF_FP8, block = fp8 ? r / 128 : 0;
    if (!input_prepared(path, w, n)) return (prepared){x, NULL, NULL};
    if (cached_call == call && cached_block == block) return cached;
    cached_call = call;
    cached_block = block;
    if (path_ints_pay(path, w, n)) {   /* rows_ints reads x itself past the full chunks */
        uint8_t *ints = (uint8_t *)grow(&int_buf, &int_cap, (size_t)w->cols / 64 * KERNEL_INT_CHUNK / sizeof(uint32_t));
        if (path->nibble_ints(x, w->cols, ints)) return cached = (prepared){x, NULL, ints};
    }
    float *out_all = (float *)grow(&buf, &cap, (size_t)n * (size_t)w->cols);
    size_t pair_row = (size_t)w->cols / 64 * 32;
    uint32_t *pairs = !fp8 && pair_row && path_pairs_pay(path, n)
                          ? grow(&pair_buf, &pair_cap, (size_t)n * pair_row)
                          : NULL;
    for (int j = 0; j < n; j++) {
        const float *xr = x + (size_t)j * w->cols;
        float *out = out_all + (size_t)j * w->cols;
        if (!fp8) {
            kernel_nibble_permute_x(xr, w->cols, path->nibble_width, out);
            if (pairs && !path->nibble_pairs(out, w->cols, pairs + (size_t)j * pair_row)) pairs = NULL;
            continue;
        }
        for (int c0 = 0; c0 < w->cols; c0 += 128) {
            float scale = kernel_fp8_scale(w, r, c0);
            int c1 = MIN(c0 + 128, w->cols);
            scale_columns(out + c0, xr + c0, c1 - c0, scale);
        }
    }
    return cached = (prepared){out_all, pairs, NULL};
}

/* nibble_src[width == 16][d]: the chunk column that kernel_nibble_permute_x stores at d. */
static uint8_t nibble_src[2][64];

__attribute__((constructor)) static void nibble_src_init(void) {
    for (int t = 0; t < 4; t++)
        for (int L = 0; L < 16; L++) {
            uint8_t src = (uint8_t)(32 * (L / 4 % 2) + 16 * (L / 8) + 4 * (L % 4) + t);
            nibble_src[1][16 * t + L] = src;
            nibble_src[0][32 * (L / 8) + 8 * t + L % 8] = src;
        }
}

void kernel_nibble_permute_x(const float *x, int cols, int width, float *out) {
    const uint8_t *src = nibble_src[width == 16];
    int full = cols / 64 * 64;
    for (int c0 = 0; c0 < full; c0 += 64)
        for (int d = 0; d < 64; d++) out[c0 + d] = x[c0 + src[d]];
    for (int c = full; c < cols; c++) out[c] = x[c];
}

/* One group of 4 columns from c, all inside the row: rule 4's partial, codes read straight from
 * the row bytes (c is a multiple of 4, so the group is two whole bytes). */
static inline float nibble_group(const uint8_t *row, const float *lut, int c, const float *x) {
    uint8_t lo = row[c / 2], hi = row[c / 2 + 1];
    float p = lut[lo & 15] * x[c];
    p = fmaf(lut[lo >> 4], x[c + 1], p);
    p = fmaf(lut[hi & 15], x[c + 2], p);
    return fmaf(lut[hi >> 4], x[c + 3], p);
}

void kernel_nibble_blocks(const qmat *w, int r, int b0, const float *x, float acc[16]) {
    const void *srow = kernel_nibble_scale_row(w, r);
    const uint8_t *row = kernel_row_ptr(w, r);
    const float *lut = kernel_nibble_is_e2m1(w->fmt) ? kernel_fp4_lut : kernel_i4_lut;
    int blocks = (w->cols + 31) / 32, whole = w->cols / 32;
    for (int b = b0; b < whole; b++)
        for (int g = 0; g < 8; g++) {
            int lane = 8 * (g / 4) + 4 * (b % 2) + g % 4;
            float p = nibble_group(row, lut, 32 * b + 4 * g, x);
            acc[lane] = fmaf(p, kernel_nibble_scale(w->fmt, srow, b, g / 4), acc[lane]);
        }
    /* the last, partial block: per element, zero past the row's end */
    for (int b = whole > b0 ? whole : b0; b < blocks; b++) {
        for (int g = 0; g < 8; g++) {
            int c = 32 * b + 4 * g;
            float scale = c < w->cols ? kernel_nibble_scale(w->fmt, srow, b, g / 4) : 0.0f;
            float p = kernel_weight(w, r, c) * (c < w->cols ? x[c] : 0.0f);
            for (int t = 1; t < 4; t++)
                p = fmaf(kernel_weight(w, r, c + t), c + t < w->cols ? x[c + t] : 0.0f, p);
            int lane = 8 * (g / 4) + 4 * (b % 2) + g % 4;
            acc[lane] = fmaf(p, scale, acc[lane]);
        }
    }
}

/* The canonical order over weight and input factors: 16 lanes by column, zero-padded to 16. */
static float dot_canonical(const float *wrow, const float *x, int cols) {
    float acc[16] = {0};
    int padded = (int)ceil_div((size_t)cols, 16) * 16;
    for (int c = 0; c < padded; c++) {
        float wv = c < cols ? wrow[c] : 0.0f, xv = c < cols ? x[c] : 0.0f;
        acc[c & 15] = fmaf(wv, xv, acc[c & 15]);
    }
    return kernel_tree16(acc);
}

static float nibble_dot(const qmat *w, int r, const float *x) {
    float acc[16] = {0};
    kernel_nibble_blocks(w, r, 0, x, acc);
    return kernel_row_finish(w, r, kernel_tree16(acc));
}

static void scalar_rows_mul(const qmat *w, int r0, int r1, const float *x, int n, float *y, int ldy) {
    float *wrow = kernel_scratch((size_t)w->cols);
    int nibbles = kernel_is_nibbles(w->fmt);
    for (int r = r0; r < r1; r++) {
        if (!nibbles) weight_row(w, r, wrow);
        for (int j = 0; j < n; j++) {
            const float *xj = x + (size_t)j * w->cols;
            y[(size_t)j * ldy + (r - r0)] =
                nibbles ? nibble_dot(w, r, xj) : kernel_row_finish(w, r, dot_canonical(wrow, xj, w->cols));
        }
    }
}

static void scalar_rows_vec(const qmat *w, int r0, int r1, const float *x, float *y) {
    scalar_rows_mul(w, r0, r1, x, 1, y, r1 - r0);
}

void kernel_transpose_scalar(const float *src, int r0, int rows, int c0, int cols, size_t lds, float *dst, size_t ldd) {
    for (int r = r0; r < rows; r++)
        for (int c = c0; c < cols; c++) dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
}

static void scalar_transpose(const float *src, int rows, int cols, size_t lds, float *dst, size_t ldd) {
    kernel_transpose_scalar(src, 0, rows, 0, cols, lds, dst, ldd);
}

const kernel_path kernel_path_scalar = {"scalar", scalar_rows_vec, scalar_rows_mul, 0, weight_row, scalar_transpose,
                                        NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL};

static int force_scalar;

static const kernel_path *active_path(void) {
    if (force_scalar) return &kernel_path_scalar;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    return &kernel_path_avx512;
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    return &kernel_path_avx2;
#else
    return &kernel_path_scalar;
#endif
}

void kernels_force_scalar(int on) { force_scalar = on; }

const char *kernels_simd_name(void) { return active_path()->name; }

int kernels_has_pairs(void) { return active_path()->nibble_pairs != NULL; }

int kernels_has_ints(void) { return active_path()->nibble_ints != NULL; }

int kernels_ints_pay(void) {
    const qmat fp4 = {WF_FP4, 1, 64, NULL, NULL, NULL, 0, 0, QM_SCRATCH};
    return path_ints_pay(active_path(), &fp4, 1);
}

void kernels_force_ints(int mode) { ints_mode = mode; }

int kernels_pairs_pay(int n) { return path_pairs_pay(active_path(), n); }

long long kernels_fp8_converted_groups(void) {
    const kernel_path *path = active_path();
    return path->fp8_converted_groups ? (long long)path->fp8_converted_groups() : -1;
}

void kernels_force_pairs(int mode) { pairs_mode = mode; }

void kernels_transpose(const float *src, int rows, int cols, size_t lds, float *dst, size_t ldd) {
    active_path()->transpose(src, rows, cols, lds, dst, ldd);
}

/* PER-THREAD COUNTERS. A 2-thread MoE prefill runs experts on both threads at once, each
 * expert's products calling run_parts; one process-wide call counter and byte counters made
 * their cache line the hottest in the profile (the line moved between the cores on every
 * product: run_parts was 8 % of each thread's time on two threads, 4 % on one, 1 % since, in
 * an Inkling prefill). So each thread numbers its own calls from a base of its own, and counts
 * on a line of its own; the totals sum the lines. A thread's own line takes a plain load and
 * store, not a locked add: the fast-path counts run once per pool task, four matvec rows, and
 * a locked add there (a full barrier, waiting for the task's loads) was 2 % of a DeepSeek V4
 * decode step. Threads past the lines' number share line 0 and add atomically. */
enum { STREAM_LINES = 64 };
typedef enum { COUNT_DENSE, COUNT_ROUTED, COUNT_PAIRED, COUNT_INTS, COUNT_DENSE_NS, COUNTS } counter;
typedef struct {
    _Alignas(64) atomic_ullong n[COUNTS];
} stream_line;
static stream_line streamed[STREAM_LINES];

static unsigned thread_number(void) {
    static atomic_uint threads_seen;
    static _Thread_local unsigned number;
    if (!number) number = atomic_fetch_add(&threads_seen, 1) + 1;
    return number;
}

/* `parts` consecutive call numbers (prepared_x's cache key), unique in the process: the thread's
 * number above bit 40, its own count below. */
static unsigned long long take_calls(int parts) {
    static _Thread_local unsigned long long taken;
    unsigned long long first = ((unsigned long long)thread_number() << 40) + taken + 1;
    taken += (unsigned)parts;
    return first;
}

static void count_add(counter k, unsigned long long v) {
    unsigned t = thread_number();
    if (t >= STREAM_LINES) {
        atomic_fetch_add_explicit(&streamed[0].n[k], v, memory_order_relaxed);
        return;
    }
    atomic_ullong *c = &streamed[t].n[k];
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v, memory_order_relaxed);
}

static unsigned long long count_total(counter k) {
    unsigned long long sum = 0;
    for (int i = 0; i < STREAM_LINES; i++) sum += atomic_load_explicit(&streamed[i].n[k], memory_order_relaxed);
    return sum;
}

unsigned long long kernels_paired_products(void) { return count_total(COUNT_PAIRED); }

unsigned long long kernels_int_products(void) { return count_total(COUNT_INTS); }

double kernels_dense_seconds(void) { return (double)count_total(COUNT_DENSE_NS) * 1e-9; }

/* One matrix's rows [r0, r1) of a job, written to y[n][r1 - r0]; its tasks are indices
 * [first, first + tasks) of the job, rows_per_task rows each (run_parts sets both). */
typedef struct {
    const qmat *w;
    int r0, r1, first;
    float *y;
    int rows_per_task;
} mul_part;

/* A pool job: the parts' tasks one after another, all over the same n input rows. `call`
 * numbers the parts apart for prepared_x (part k is call + k). */
typedef struct {
    const kernel_path *path;
    mul_part part[QMAT_EACH_MAX];
    int parts, n;
    const float *x;
    unsigned long long call;
} mul_job;

/* Rows [lo, hi) of part k, cut at FP8 scale-block boundaries so each piece has one scaled input. */
static void job_rows(const mul_job *job, int k, int lo, int hi) {
    const mul_part *p = &job->part[k];
    const qmat *w = p->w;
    int ldy = p->r1 - p->r0;
    while (lo < hi) {
        int end = hi;
        if (w->fmt == WF_FP8) end = MIN(hi, (lo / 128 + 1) * 128);
        prepared in = prepared_x(job->path, w, lo, job->x, job->n, job->call + (unsigned)k);
        float *y = p->y + (lo - p->r0);
        if (in.ints) {
            job->path->rows_ints(w, lo, end, in.x, in.ints, y);
            count_add(COUNT_INTS, (unsigned)(end - lo));
        } else if (in.pairs) {
            job->path->rows_pairs(w, lo, end, in.x, in.pairs, job->n, y, ldy);
            count_add(COUNT_PAIRED, (unsigned long long)job->n * (unsigned)(end - lo));
        } else if (job->n == 1) job->path->rows_vec(w, lo, end, in.x, y);
        else job->path->rows_mul(w, lo, end, in.x, job->n, y, ldy);
        lo = end;
    }
}

static void mul_task(void *ctx, int i) {
    const mul_job *job = ctx;
    int k = 0;
    while (k + 1 < job->parts && i >= job->part[k + 1].first) k++;
    const mul_part *p = &job->part[k];
    int lo = p->r0 + (i - p->first) * p->rows_per_task;
    job_rows(job, k, lo, MIN(lo + p->rows_per_task, p->r1));
}

void kernels_streamed(unsigned long long *dense, unsigned long long *routed) {
    *dense = count_total(COUNT_DENSE);
    *routed = count_total(COUNT_ROUTED);
}

/* Rows per task of a product with n input rows: see VEC_ROWS_PER_TASK, MUL_ROWS_PER_TASK and
 * FP8_ROWS_PER_TASK. */
static int rows_per_task(const qmat *w, int n) {
    if (n == 1) return VEC_ROWS_PER_TASK;
    return w->fmt == WF_FP8 && n >= FP8_BLOCK_TASK_N ? FP8_ROWS_PER_TASK : MUL_ROWS_PER_TASK;
}

/* Rows [r0, r1) of w read once, for kernels_streamed (QM_SCRATCH views are not weights). */
static void count_rows(const qmat *w, int r0, int r1) {
    if (w->source != QM_SCRATCH)
        count_add(w->source == QM_ROUTED ? COUNT_ROUTED : COUNT_DENSE,
                  qmat_bytes(w) / (size_t)w->rows * (size_t)(r1 - r0));
}

/* Parts with rows go into one job; each part's rows are read once whatever n (kernels.h). */
static void run_parts(int count, const mul_part *parts, const float *x, int n) {
    if (n <= 0) return;
    mul_job job = {.path = active_path(), .n = n, .x = x};
    int tasks = 0;
    for (int k = 0; k < count; k++) {
        const mul_part *p = &parts[k];
        if (p->r1 <= p->r0) continue;
        count_rows(p->w, p->r0, p->r1);
        mul_part *q = &job.part[job.parts++];
        *q = *p;
        q->first = tasks;
        q->rows_per_task = rows_per_task(p->w, n);
        tasks += (p->r1 - p->r0 + q->rows_per_task - 1) / q->rows_per_task;
    }
    if (!tasks) return;
    job.call = take_calls(job.parts);
    /* a top-level product of dense weights is timed (kernels_dense_seconds): two clock reads
     * against a job of microseconds at least */
    const int timed = job.part[0].w->source == QM_DENSE && !pool_in_task();
    const double t0 = timed ? now_seconds() : 0;
    pool_run(tasks, mul_task, &job);
    if (timed) count_add(COUNT_DENSE_NS, (unsigned long long)((now_seconds() - t0) * 1e9));
}

void qmat_mul_rows(const qmat *w, int r0, int r1, const float *x, int n, float *y) {
    mul_part p = {w, r0, r1, 0, y, 0};
    run_parts(1, &p, x, n);
}

void qmat_mul_each(int count, const qmat *const *w, const float *x, int n, float *const *y) {
    if (count > QMAT_EACH_MAX) {
        qmat_mul_each(QMAT_EACH_MAX, w, x, n, y);
        qmat_mul_each(count - QMAT_EACH_MAX, w + QMAT_EACH_MAX, x, n, y + QMAT_EACH_MAX);
        return;
    }
    mul_part p[QMAT_EACH_MAX];
    for (int k = 0; k < count; k++) p[k] = (mul_part){w[k], 0, w[k]->rows, 0, y[k], 0};
    run_parts(count, p, x, n);
}

void qmat_mul(const qmat *w, const float *x, int n, float *y) { qmat_mul_rows(w, 0, w->rows, x, n, y); }

/* The path's matvec of the one row, as job_rows calls it for n == 1. Inputs that the path
 * prepares (FP8's scaled input, the nibble formats' permuted one) take the whole call: their
 * preparation is cached per call number. An Inkling prefill makes about ten thousand 64-column
 * score products per token; through run_parts and mul_task they were 4 % of its profile. */
float qmat_dot_row(const qmat *w, int r, const float *x) {
    const kernel_path *path = active_path();
    float y;
    if (input_prepared(path, w, 1)) {
        qmat_mul_rows(w, r, r + 1, x, 1, &y);
        return y;
    }
    count_rows(w, r, r + 1);
    path->rows_vec(w, r, r + 1, x, &y);
    return y;
}

void qmat_vec(const qmat *w, const float *x, float *y) { qmat_mul_rows(w, 0, w->rows, x, 1, y); }

/* Dequantization: the weight factors times the scale that rules 1, 4 or 5 apply elsewhere, one
 * f32 product (exact for power-of-two scales). The factors of a rule-2 row come from the path's
 * decoder (the MLA families dequantize kv_b_proj rows every forward call), the scale once per
 * block. */
void qmat_row(const qmat *w, int r, float *out) {
    const kernel_path *path = active_path();
    if (path->row_factors && !kernel_is_nibbles(w->fmt)) path->row_factors(w, r, out);
    else weight_row(w, r, out);
    int block = w->fmt == WF_FP8 ? 128 : kernel_is_nibbles(w->fmt) ? 16 : 0;
    const void *srow = kernel_is_nibbles(w->fmt) ? kernel_nibble_scale_row(w, r) : NULL;
    if (w->fmt == WF_I8_ROW)
        for (int c = 0; c < w->cols; c++) out[c] *= w->scale_f32[r];
    for (int c0 = 0; block && c0 < w->cols; c0 += block) {
        float scale = w->fmt == WF_FP8 ? kernel_fp8_scale(w, r, c0) : kernel_nibble_scale(w->fmt, srow, c0 / 32, c0 / 16 % 2);
        for (int c = c0; c < MIN(c0 + block, w->cols); c++) out[c] = kernel_row_finish(w, r, out[c] * scale);
    }
}
