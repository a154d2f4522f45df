/* bench_peak.c — the machine's arithmetic peaks and cache size, the denominators of the compute
 * figures (prefill GFLOP/s as a fraction of peak), so those compare across machines the way
 * bandwidth fractions do.
 *
 * A peak is measured, not looked up: CHAINS independent accumulator registers per thread (more
 * than FMA latency x FMA ports, so the ports never wait) run a long dependent loop on every pool
 * thread. The accumulators converge to a fixed point, so nothing overflows or goes subnormal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include "bench.h"
#include "core/threads.h"
#include "core/util.h"

#define CHAINS 16
#define PEAK_ITERS 2000000
#define PEAK_TASKS_PER_THREAD 4

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* The largest cache a deterministic cache parameters leaf lists (Intel's leaf 4, AMD's
 * 0x8000001D, one subleaf per cache: ways x partitions x line size x sets), 0 if it lists none. */
static size_t cpuid_cache_leaf(unsigned leaf) {
    size_t best = 0;
    for (unsigned sub = 0; sub < 16; sub++) {
        unsigned a, b, c, d;
        if (!__get_cpuid_count(leaf, sub, &a, &b, &c, &d) || !(a & 0x1f)) break;
        size_t size = (size_t)((b >> 22) + 1) * (((b >> 12) & 0x3ff) + 1) * ((b & 0xfff) + 1) * ((size_t)c + 1);
        best = MAX(best, size);
    }
    return best;
}

/* Where sysfs has no cache directory (some virtual machines), what CPUID reports: the leaves
 * above, else AMD's legacy 0x80000006 (EDX[31:18]: L3 in 512 KiB units). A hypervisor may report
 * the host's whole L3, more than a guest's cores share: that only makes streaming buffers larger. */
static size_t cpuid_llc_bytes(void) {
    unsigned a, b, c, d, ext = __get_cpuid(0x80000000, &a, &b, &c, &d) ? a : 0;
    size_t best = cpuid_cache_leaf(4);
    if (ext >= 0x8000001D) best = MAX(best, cpuid_cache_leaf(0x8000001D));
    if (!best && ext >= 0x80000006 && __get_cpuid(0x80000006, &a, &b, &c, &d)) best = (size_t)(d >> 18) << 19;
    return best;
}
#else
static size_t cpuid_llc_bytes(void) { return 0; }
#endif

size_t bench_llc_bytes(void) {
    size_t best = 0;
    for (int i = 0; i < 16; i++) {
        char path[128], text[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f) break;
        size_t got = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[got] = 0;
        char *end;
        size_t v = strtoull(text, &end, 10);
        if (*end == 'K') v <<= 10;
        else if (*end == 'M') v <<= 20;
        else if (*end == 'G') v <<= 30;
        if (v > best) best = v;
    }
    return best ? best : cpuid_llc_bytes();
}

size_t bench_stream_bytes(void) { return MAX((size_t)1 << 30, 4 * bench_llc_bytes()); }

typedef struct {
    int bf16;
    volatile float sink;
} peak_job;

/* FLOPs one task performs. */
static double task_flops(int bf16) {
#if defined(__AVX512F__)
    double lanes = 16;
#elif defined(__FMA__)
    double lanes = 8;
#else
    double lanes = 1;
#endif
    return (double)PEAK_ITERS * CHAINS * lanes * (bf16 ? 4 : 2);
}

static void fma_task(void *ctx, int i) {
    peak_job *job = ctx;
    float out = 0;
#if defined(__AVX512F__)
    __m512 acc[CHAINS], m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-6f);
    for (int k = 0; k < CHAINS; k++) acc[k] = _mm512_set1_ps((float)(k + i));
    for (int it = 0; it < PEAK_ITERS; it++)
        #pragma GCC unroll 16
        for (int k = 0; k < CHAINS; k++) acc[k] = _mm512_fmadd_ps(acc[k], m, a);
    for (int k = 0; k < CHAINS; k++) out += _mm512_reduce_add_ps(acc[k]);
#elif defined(__FMA__)
    __m256 acc[CHAINS], m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-6f);
    for (int k = 0; k < CHAINS; k++) acc[k] = _mm256_set1_ps((float)(k + i));
    for (int it = 0; it < PEAK_ITERS; it++)
        #pragma GCC unroll 16
        for (int k = 0; k < CHAINS; k++) acc[k] = _mm256_fmadd_ps(acc[k], m, a);
    float lanes[8];
    for (int k = 0; k < CHAINS; k++) {
        _mm256_storeu_ps(lanes, acc[k]);
        out += lanes[0];
    }
#else
    /* No FMA in the build: a multiply and an add, the two flops an FMA would do. */
    float acc[CHAINS];
    for (int k = 0; k < CHAINS; k++) acc[k] = (float)(k + i);
    for (int it = 0; it < PEAK_ITERS; it++)
        #pragma GCC unroll 16
        for (int k = 0; k < CHAINS; k++) acc[k] = acc[k] * 0.999999f + 1e-6f;
    for (int k = 0; k < CHAINS; k++) out += acc[k];
#endif
    job->sink = out;
}

#if defined(__AVX512BF16__)
static void bf16_task(void *ctx, int i) {
    peak_job *job = ctx;
    /* acc += a0 * b0 + a1 * b1 per lane with a = b = 2^-10: a small constant increment. */
    __m512bh v = (__m512bh)_mm512_set1_epi16(0x3a80);
    __m512 acc[CHAINS];
    for (int k = 0; k < CHAINS; k++) acc[k] = _mm512_set1_ps((float)(k + i));
    for (int it = 0; it < PEAK_ITERS; it++)
        #pragma GCC unroll 16
        for (int k = 0; k < CHAINS; k++) acc[k] = _mm512_dpbf16_ps(acc[k], v, v);
    float out = 0;
    for (int k = 0; k < CHAINS; k++) out += _mm512_reduce_add_ps(acc[k]);
    job->sink = out;
}
#endif

static double measure_peak(int bf16, pool_task task) {
    peak_job job = {bf16, 0};
    int tasks = pool_threads() * PEAK_TASKS_PER_THREAD;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_seconds();
        pool_run(tasks, task, &job);
        double t = now_seconds() - t0;
        if (t < best) best = t;
    }
    return task_flops(bf16) * tasks / best;
}

double bench_fma_peak(void) { return measure_peak(0, fma_task); }

double bench_bf16_dot_peak(void) {
#if defined(__AVX512BF16__)
    return measure_peak(1, bf16_task);
#else
    return 0;
#endif
}
