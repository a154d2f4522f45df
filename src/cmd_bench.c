/* cmd_bench.c — `cairn bench`: the dispatcher, the kernel benchmark and the read-bandwidth probe.
 *
 * Kernel throughput is reported as a ratio to the read bandwidth measured in the same run
 * (bench.h), because absolute figures say nothing across machines: a memory-bound matvec is as
 * good as it gets when it streams its weights at the speed a plain summing loop reads memory. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"
#include "core/kernels.h"
#include "core/quant.h"
#include "core/threads.h"
#include "core/util.h"

#define MIB ((size_t)1 << 20)
#define BENCH_COLS 4096          /* a typical hidden size, a multiple of every block width */
#define BENCH_MIN_SECONDS 0.5    /* repeat each measurement at least this long, keep the best */

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: cairn bench kernels [--json] [--mb N]\n"
            "       cairn bench -m DIR [options]          (prefill/decode speed of a model)\n"
            "       cairn bench reuse -m DIR [options]    (prefix-reuse speed of a model)\n"
            "       cairn bench concurrency -m DIR [options]  (batched decode of 1/2/4/8 conversations)\n"
            "       cairn bench grammar -m DIR [options]  (constrained-decoding cost per decode step)\n"
            "       cairn bench mtp -m DIR [options]      (MTP speculative decoding: verify cost, acceptance)\n"
            "\n"
            "kernels: measures the read bandwidth of this machine (stream-like sum over >= 1 GiB on all\n"
            "  threads, 4x the last-level cache), then for each weight layout (f32, bf16, fp8 with E8M0 and with F32 block\n"
            "  scales, fp4 (MXFP4), nvfp4, and the int8-per-row, int4-per-row and int4-g64 containers) the\n"
            "  matrix-vector throughput in weight bytes/s and as a fraction of that bandwidth, and\n"
            "  batched (n=8, n=32 input rows) GFLOP/s.\n"
            "  --json   print one JSON object instead of a table\n"
            "  --mb N   weight matrix size per format in MiB (default: twice the last-level cache,\n"
            "           at least 256, so matvec streams from memory)\n"
            "  Batched GFLOP/s is also printed as a fraction of the f32 FMA peak measured here.\n"
            "  Threads: CAIRN_THREADS (default: online cores).\n"
            "\n"
            "-m DIR, reuse, concurrency, mtp: see `cairn bench -m DIR --help`, `cairn bench reuse --help`,\n"
            "`cairn bench concurrency --help`, `cairn bench mtp --help`.\n");
}

int cmd_bench(int argc, char **argv) {
    if (argc < 2) { bench_usage(stderr); return 2; }
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h")) { bench_usage(stdout); return 0; }
    if (!strcmp(sub, "kernels")) return bench_kernels(argc - 1, argv + 1);
    if (!strcmp(sub, "reuse")) return bench_reuse(argc - 1, argv + 1);
    if (!strcmp(sub, "concurrency")) return bench_concurrency(argc - 1, argv + 1);
    if (!strcmp(sub, "grammar")) return bench_grammar(argc - 1, argv + 1);
    if (!strcmp(sub, "mtp")) return bench_mtp(argc - 1, argv + 1);
    if (sub[0] == '-') return bench_model(argc, argv);
    fprintf(stderr, "cairn bench: unknown benchmark '%s'\n", sub);
    bench_usage(stderr);
    return 2;
}

/* ---- read bandwidth ---- */

#define BW_CHUNK (4 * MIB)

/* The prefetching reader's distance in 64-byte lines (4 KiB): how far ahead of its loads it asks. */
#define BW_PREFETCH_LINES 64

typedef struct {
    const uint64_t *buf;
    size_t words_per_chunk;
    uint64_t *sums;          /* one per chunk, summed into bw_checksum so the reads stay */
    int prefetch;            /* read with software prefetches BW_PREFETCH_LINES ahead */
} bw_job;

static volatile uint64_t bw_checksum;

/* Integer vector sums: exact, and cheap enough in every build (GCC vector extensions lower to
 * SSE2 in the portable build) that the loop waits on memory, not on arithmetic. A vector is a
 * whole cache line, one load per line: with 32-byte vectors (two loads per line) this probe read
 * 28-30 GB/s on two threads of the 2-vCPU Xeon VMs of this project, where 64-byte loads read
 * 34-35 and the kernels' matvecs 31-35, so their "of bw" read up to 1.11 and decode_efficiency
 * was as much too high. Two readers, alternated, the faster one's best: the same sums with and
 * without software prefetches BW_PREFETCH_LINES ahead (35-36 against 34-35 there; which reads
 * faster is the machine's business). */
typedef uint64_t bw_vec __attribute__((vector_size(64)));

static void bw_sum_chunk(void *ctx, int i) {
    const bw_job *job = ctx;
    const bw_vec *p = (const bw_vec *)(job->buf + (size_t)i * job->words_per_chunk);
    size_t n = job->words_per_chunk / 8;
    bw_vec a = {0}, b = {0}, c = {0}, d = {0};
    for (size_t k = 0; k < n; k += 4) {   /* four lines */
        for (size_t l = k + BW_PREFETCH_LINES; job->prefetch && l < k + BW_PREFETCH_LINES + 4 && l < n; l++)
            __builtin_prefetch(p + l, 0, 3);
        a += p[k];
        b += p[k + 1];
        c += p[k + 2];
        d += p[k + 3];
    }
    bw_vec s = a + b + c + d;
    job->sums[i] = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static void bw_fill_chunk(void *ctx, int i) {
    const bw_job *job = ctx;
    uint64_t *p = (uint64_t *)job->buf + (size_t)i * job->words_per_chunk;
    for (size_t k = 0; k < job->words_per_chunk; k++) p[k] = k * 0x9e3779b97f4a7c15ULL + (uint64_t)i;
}

double bench_read_bandwidth(size_t bytes) {
    size_t chunks = (bytes + BW_CHUNK - 1) / BW_CHUNK;
    if (chunks == 0) chunks = 1;
    uint64_t *buf = aligned_alloc(64, chunks * BW_CHUNK);
    uint64_t *sums = calloc(chunks, sizeof *sums);
    if (!buf || !sums) {
        fprintf(stderr, "cairn bench: cannot allocate %zu MiB for the bandwidth probe\n", chunks * BW_CHUNK / MIB);
        free(buf);
        free(sums);
        return 0;
    }
    bw_job job = {buf, BW_CHUNK / sizeof(uint64_t), sums, 0};
    pool_run((int)chunks, bw_fill_chunk, &job);     /* each thread first-touches the pages it reads */
    double best = 1e30, start = now_seconds();
    for (int rep = 0; rep < 6 || now_seconds() - start < 2 * BENCH_MIN_SECONDS; rep++) {
        job.prefetch = rep % 2;   /* the two readers alternated: the faster one's best */
        double t0 = now_seconds();
        pool_run((int)chunks, bw_sum_chunk, &job);
        double t = now_seconds() - t0;
        if (t < best) best = t;
    }
    for (size_t i = 0; i < chunks; i++) bw_checksum += sums[i];
    free(buf);
    free(sums);
    return (double)(chunks * BW_CHUNK) / best;
}

/* ---- kernel throughput ---- */

static uint64_t rng_state = 0x853c49e6748fea9bULL;

static uint32_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* The benched layouts: every format, and FP8 with both scale encodings (E8M0 as DeepSeek V4
 * ships it, F32 `_scale_inv` as GLM-5-FP8 does). */
typedef struct {
    wformat fmt;
    int f32_scales;
    const char *label;
} bench_layout;

static const bench_layout layouts[] = {
    {WF_F32, 0, "f32"},       {WF_BF16, 0, "bf16"},     {WF_FP8, 0, "fp8"},       {WF_FP8, 1, "fp8-f32s"},
    {WF_FP4, 0, "fp4"},       {WF_I8_ROW, 0, "i8-row"}, {WF_I4_ROW, 0, "i4-row"}, {WF_I4_G64, 0, "i4-g64"},
    {WF_NVFP4, 0, "nvfp4"},
};
#define N_LAYOUTS (int)(sizeof layouts / sizeof layouts[0])

static size_t scale_count(wformat fmt, size_t rows) {
    switch (fmt) {
    case WF_F32:
    case WF_BF16: return 0;
    case WF_FP8: return rows / 128 * (BENCH_COLS / 128);
    case WF_FP4: return rows * (BENCH_COLS / 32);
    case WF_NVFP4: return rows * (BENCH_COLS / 16);
    case WF_I8_ROW:
    case WF_I4_ROW: return rows;
    case WF_I4_G64: return rows * (BENCH_COLS / 64);
    }
    return 0;
}

/* Random codes of the format (no NaN codes), scales near 1, as a checkpoint would hold. */
static int make_matrix(qmat *w, const bench_layout *lay, size_t mb, char *err, size_t errlen) {
    wformat fmt = lay->fmt;
    size_t bytes_per_row = fmt == WF_F32 ? BENCH_COLS * 4 : fmt == WF_BF16 ? BENCH_COLS * 2
                         : fmt == WF_FP8 || fmt == WF_I8_ROW ? BENCH_COLS : BENCH_COLS / 2;
    size_t rows = (mb * MIB / bytes_per_row + 127) / 128 * 128;
    size_t scale_len = scale_count(fmt, rows);
    int f32_scales = lay->f32_scales || fmt == WF_I8_ROW || fmt == WF_I4_ROW || fmt == WF_I4_G64;
    uint8_t *data = malloc(rows * bytes_per_row);
    uint8_t *scale = scale_len && !f32_scales ? malloc(scale_len) : NULL;
    float *fscale = scale_len && f32_scales ? malloc(scale_len * sizeof(float)) : NULL;
    if (!data || (scale_len && !scale && !fscale)) {
        free(data);
        return errf(err, errlen, "cannot allocate a %zu MiB %s matrix", mb, lay->label);
    }
    if (fmt == WF_F32 || fmt == WF_BF16) {   /* real values: random bytes would include NaN and inf */
        for (size_t i = 0; i < rows * BENCH_COLS; i++) {
            float v = ((int)(rng_next() % 2001) - 1000) * 1e-3f;
            uint16_t h = f32_to_bf16(v);
            if (fmt == WF_F32) memcpy(data + 4 * i, &v, 4);
            else memcpy(data + 2 * i, &h, 2);
        }
    } else {
        for (size_t i = 0; i < rows * bytes_per_row; i++) {
            uint8_t b = (uint8_t)rng_next();
            data[i] = fmt == WF_FP8 && (b & 0x7f) == 0x7f ? b - 1 : b;
        }
    }
    for (size_t i = 0; scale && i < scale_len; i++)   /* E8M0 2^-7..2^0, or E4M3 0.5..1.875 */
        scale[i] = (uint8_t)(fmt == WF_NVFP4 ? 0x30 + rng_next() % 16 : 120 + rng_next() % 8);
    for (size_t i = 0; fscale && i < scale_len; i++) fscale[i] = 0.01f + (float)(rng_next() % 1000) * 1e-4f;
    *w = (qmat){.fmt = fmt, .rows = (int)rows, .cols = BENCH_COLS, .data = data, .scale = scale, .scale_f32 = fscale,
                .global_scale = 0.5f};
    return 0;
}

typedef struct {
    double vec_bytes_per_s, vec_seconds, mul8_gflops, mul32_gflops, mul8_row_speedup;
} kernel_result;

/* Best seconds per call of qmat_mul with n input rows, repeated for at least BENCH_MIN_SECONDS. */
static double time_mul(const qmat *w, const float *x, int n, float *y) {
    double best = 1e30, start = now_seconds();
    for (int rep = 0; rep < 2 || now_seconds() - start < BENCH_MIN_SECONDS; rep++) {
        double t0 = now_seconds();
        qmat_mul(w, x, n, y);
        double t = now_seconds() - t0;
        if (t < best) best = t;
    }
    return best;
}

static void bench_format(const qmat *w, kernel_result *res) {
    float *x = xmalloc(32 * (size_t)w->cols * sizeof(float));
    float *y = xmalloc(32 * (size_t)w->rows * sizeof(float));
    for (size_t i = 0; i < 32 * (size_t)w->cols; i++) x[i] = ((int)(rng_next() % 2001) - 1000) * 1e-3f;
    double flops_per_row = 2.0 * w->rows * w->cols;
    res->vec_seconds = time_mul(w, x, 1, y);
    res->vec_bytes_per_s = qmat_bytes(w) / res->vec_seconds;
    double t8 = time_mul(w, x, 8, y);
    res->mul8_gflops = flops_per_row * 8 / t8 * 1e-9;
    res->mul8_row_speedup = res->vec_seconds / (t8 / 8);
    res->mul32_gflops = flops_per_row * 32 / time_mul(w, x, 32, y) * 1e-9;
    free(x);
    free(y);
}

int bench_kernels(int argc, char **argv) {
    int json = 0;
    long mb = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--mb")) {
            if (cli_int("bench kernels", "--mb", i + 1 < argc ? argv[++i] : NULL, 1, 65536, &mb)) return 2;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            bench_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "cairn bench kernels: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    size_t llc = bench_llc_bytes();
    if (!mb) mb = (long)MAX(256, 2 * llc / MIB);
    double bw = bench_read_bandwidth(bench_stream_bytes());
    if (bw <= 0) return 1;
    double peak = bench_fma_peak();
    kernel_result res[N_LAYOUTS];
    qmat mats[N_LAYOUTS];
    for (int f = 0; f < N_LAYOUTS; f++) {
        char err[256];
        if (make_matrix(&mats[f], &layouts[f], (size_t)mb, err, sizeof err)) {
            fprintf(stderr, "cairn bench kernels: %s\n", err);
            return 1;
        }
        bench_format(&mats[f], &res[f]);
        free((void *)mats[f].data);
        free((void *)mats[f].scale);
        free((void *)mats[f].scale_f32);
    }
    if (json) {
        printf("{\"simd\":\"%s\",\"threads\":%d,\"read_bandwidth_bytes_per_s\":%.0f,\"llc_bytes\":%zu,"
               "\"fma_peak_gflops\":%.2f,\"formats\":{",
               kernels_simd_name(), pool_threads(), bw, llc, peak * 1e-9);
        for (int f = 0; f < N_LAYOUTS; f++)
            printf("%s\"%s\":{\"rows\":%d,\"cols\":%d,\"bytes\":%zu,\"matvec_bytes_per_s\":%.0f,"
                   "\"matvec_vs_bandwidth\":%.3f,\"mul8_gflops\":%.2f,\"mul32_gflops\":%.2f,"
                   "\"mul8_per_row_speedup\":%.2f,\"mul32_vs_fma_peak\":%.3f}",
                   f ? "," : "", layouts[f].label, mats[f].rows, mats[f].cols, qmat_bytes(&mats[f]),
                   res[f].vec_bytes_per_s, res[f].vec_bytes_per_s / bw, res[f].mul8_gflops, res[f].mul32_gflops,
                   res[f].mul8_row_speedup, res[f].mul32_gflops * 1e9 / peak);
        printf("}}\n");
        return 0;
    }
    printf("cairn bench kernels: simd %s, %d threads, read bandwidth %.2f GB/s, last-level cache %zu MiB, "
           "f32 FMA peak %.1f GFLOP/s\n",
           kernels_simd_name(), pool_threads(), bw * 1e-9, llc / MIB, peak * 1e-9);
    if (kernels_has_pairs())   /* timed once per process (kernels_pairs_pay): the rows below depend on it */
        printf("nibble formats from BF16 pairs (this CPU, measured): matvec %s, 2-8 inputs %s, batched tiles %s\n",
               kernels_pairs_pay(1) ? "yes" : "no", kernels_pairs_pay(4) ? "yes" : "no",
               kernels_pairs_pay(12) ? "yes" : "no");
    printf("%-8s %12s %9s %12s %10s %12s %12s %9s %14s\n", "format", "matrix", "MiB", "matvec GB/s", "of bw",
           "n=8 GFLOP/s", "n=32 GFLOP/s", "of peak", "n=8 row speedup");
    for (int f = 0; f < N_LAYOUTS; f++) {
        char shape[32];
        snprintf(shape, sizeof shape, "%dx%d", mats[f].rows, mats[f].cols);
        printf("%-8s %12s %9.0f %12.2f %10.3f %12.2f %12.2f %9.3f %14.2f\n", layouts[f].label, shape,
               qmat_bytes(&mats[f]) / (double)MIB, res[f].vec_bytes_per_s * 1e-9, res[f].vec_bytes_per_s / bw,
               res[f].mul8_gflops, res[f].mul32_gflops, res[f].mul32_gflops * 1e9 / peak, res[f].mul8_row_speedup);
    }
    return 0;
}
