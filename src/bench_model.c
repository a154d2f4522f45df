/* bench_model.c — `cairn bench -m DIR`: prefill and decode speed of one model, and decode
 * efficiency = weight bytes a decode step reads x decode tok/s / the read bandwidth measured in
 * this same run. Decode of a large MoE is bound by streaming weights, so that ratio says how
 * close the engine gets to the machine's limit (1.0 = every byte at memory speed).
 *
 * The weights are paged in by one untimed prefill first, so the timed runs measure compute and
 * memory, not the disk. The timed run is repeated TIMED_ROUNDS times, each time on every thread and
 * then on one (with more than one), and every figure is the median over the rounds: the ratios of
 * the two speeds are the thread scaling of prefill and decode. The read bandwidth is measured
 * just before each round too, and its median is the efficiency's denominator: on a shared
 * machine another tenant's load moves bandwidth and decode speed together, and one measurement
 * before all rounds once read 23.7 GB/s against 29.5-30.8 in the runs around it, turning the
 * same decode speed from 0.70 into 0.92 of "bandwidth". */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"
#include "core/cluster.h"
#include "core/kernels.h"
#include "core/threads.h"
#include "core/util.h"

typedef struct {
    double prefill_tok_s, prefill_gflops, decode_tok_s, bandwidth_gbs, decode_efficiency;
    double fma_peak_gflops, bf16_peak_gflops;    /* measured in this run (bench_peak.c) */
    double verify_cost_ratio;  /* one VERIFY_TOKENS-token forward call / one decode step */
    double scaling_prefill, scaling_decode;   /* tok/s on all threads / on one (0: one thread only) */
    size_t decode_bytes, mlocked_bytes;
    double mpi_bytes_per_token, mpi_messages_per_token;   /* decode, between the ranks (core/cluster.h) */
} bench_result;

static void usage(FILE *f) {
    fprintf(f,
            "usage: cairn bench -m DIR [--json] [--prompt N] [--decode N] [--threads N] [--numerics exact|qat]\n"
            "                          [--expert-cache-mb N] [--mlock]\n"
            "\n"
            "Measures, in one run: the read bandwidth (bench_stream_bytes: >= 1 GiB, 4x the LLC), prefill of an N-token prompt\n"
            "(default 64) in tok/s and GFLOP/s, greedy decode of N tokens (default 16) in tok/s, and\n"
            "decode efficiency = weight bytes per decode step x decode tok/s / read bandwidth.\n"
            "Prefill GFLOP/s is also given as a fraction of the f32 FMA (and BF16 dot) peak measured here,\n"
            "and one 4-token forward call (a speculative verify step) as a multiple of one decode step.\n"
            "With more than one thread (--threads N, default every core) prefill and decode are timed again\n"
            "on one thread: thread scaling = tok/s on N threads / tok/s on one. The timed runs are repeated\n"
            "3 times, the thread counts alternating, and every figure is the median of the 3 (the read\n"
            "bandwidth too: it is measured before each round).\n"
            "--json prints {prefill_tok_s, prefill_gflops, prefill_vs_fma_peak, decode_tok_s, bandwidth_gbs,\n"
            "decode_efficiency, thread_scaling_prefill, thread_scaling_decode, ...}.\n"
            "\n"
            "With --expert-cache-mb N: decode from disk instead (run it in a memory cgroup smaller than the\n"
            "checkpoint, as make bench does): the disk's read bandwidth, then for the mapping and for the\n"
            "expert cache, each after dropping the checkpoint's cached pages: decode tok/s, bytes read from\n"
            "storage per token, that rate as a fraction of the disk bandwidth, and the cache's hit rate.\n"
            "With --mlock: the dense weights are locked in memory first (mlocked_bytes in the JSON).\n");
}

int bench_parse(const char *cmd, int argc, char **argv, void (*usage)(FILE *), bench_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); exit(0); }
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--mlock")) { o->mlock = 1; continue; }
        if (!v) { fprintf(stderr, "cairn %s: %s needs a value (or unknown flag)\n", cmd, a); return -1; }
        i++;
        if (!strcmp(a, "-m")) o->model_dir = v;
        else if (!strcmp(a, "--prompt")) { if (cli_int(cmd, a, v, 1, 1 << 20, &o->prompt)) return -1; }
        else if (!strcmp(a, "--decode")) { if (cli_int(cmd, a, v, 1, 1 << 20, &o->decode)) return -1; }
        else if (!strcmp(a, "--threads")) { if (cli_int(cmd, a, v, 1, 1024, &o->threads)) return -1; }
        else if (!strcmp(a, "--expert-cache-mb")) { if (cli_expert_cache_mb(cmd, v, &o->expert_cache_mb)) return -1; }
        else if (!strcmp(a, "--numerics")) {
            int n = cli_numerics(v);
            if (n < 0) { fprintf(stderr, "cairn %s: bad value for --numerics: '%s'\n", cmd, v); return -1; }
            o->num = (numerics)n;
        } else { fprintf(stderr, "cairn %s: unknown flag '%s' (see --help)\n", cmd, a); return -1; }
    }
    if (!o->model_dir) { fprintf(stderr, "cairn %s: -m DIR is required\n", cmd); return -1; }
    return 0;
}

model *bench_open(const char *cmd, const bench_opts *o, size_t *mlocked) {
    char err[512] = "";
    model *m = model_open(o->model_dir, o->num, 0, err, sizeof err);
    if (!m) { fprintf(stderr, "cairn %s: %s\n", cmd, err); return NULL; }
    size_t locked = o->mlock ? cli_mlock(cmd, m) : 0;
    if (mlocked) *mlocked = locked;
    if (cli_expert_cache(cmd, m, o->expert_cache_mb, NULL)) {
        model_close(m);
        return NULL;
    }
    return m;
}

int *bench_prompt(int n, int vocab, uint64_t seed) {
    int *ids = xmalloc(sizeof(int) * n);
    uint64_t x = 0x9e3779b97f4a7c15ULL ^ seed;
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = vocab > 2 ? 2 + (int)(x % (uint64_t)(vocab - 2)) : 0;
    }
    return ids;
}

int bench_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int by_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_sort(double *v, long n) { qsort(v, (size_t)n, sizeof *v, by_double); }

double bench_median(double *v, long n) {
    bench_sort(v, n);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Timed rounds. On a shared 2-core VM one timed run of the same binary scatters by 10-20 %
 * (neighbours, clock), and a ratio of two such runs twice that; alternating the thread counts and
 * taking medians tells the engine's work apart from the machine's noise. */
#define TIMED_ROUNDS 3

static const size_t timed_fields[] = {
    offsetof(bench_result, prefill_tok_s), offsetof(bench_result, prefill_gflops),
    offsetof(bench_result, decode_tok_s), offsetof(bench_result, verify_cost_ratio),
    offsetof(bench_result, bandwidth_gbs),
    offsetof(bench_result, mpi_bytes_per_token), offsetof(bench_result, mpi_messages_per_token)};

/* out's timed figures = the medians of runs[0..n) (its other fields untouched). */
static void take_medians(const bench_result *runs, int n, bench_result *out) {
    for (size_t f = 0; f < sizeof timed_fields / sizeof *timed_fields; f++) {
        double v[TIMED_ROUNDS];
        for (int i = 0; i < n; i++) v[i] = *(const double *)((const char *)&runs[i] + timed_fields[f]);
        *(double *)((char *)out + timed_fields[f]) = bench_median(v, n);
    }
}

/* Timed prefill, greedy decode, then one forward call of VERIFY_TOKENS tokens on a fresh
 * sequence: the shape of a speculative step verifying VERIFY_TOKENS - 1 drafts, against one
 * decode step (`cairn bench mtp` measures MTP speculation itself). */
#define VERIFY_TOKENS 4

static int measure(model *m, const bench_opts *o, const int *ids, int timed, bench_result *r, char *err,
                   size_t errlen) {
    seq *s = seq_new(m, (int)(o->prompt + o->decode + 1 + VERIFY_TOKENS), err, errlen);
    if (!s) return -1;
    float *logits = xmalloc(sizeof(float) * m->vocab_size);
    s->chunk = (int)o->prompt;
    double t0 = now_seconds();
    int rc = seq_feed(s, ids, (int)o->prompt, logits, err, errlen);
    double t1 = now_seconds();
    experts_stats x0, x1;
    experts_get_stats(m->experts, &x0);
    for (long i = 0; timed && !rc && i < o->decode; i++) {
        int id = bench_argmax(logits, m->vocab_size);
        rc = seq_feed(s, &id, 1, logits, err, errlen);
    }
    double t2 = now_seconds();
    experts_get_stats(m->experts, &x1);
    if (timed && !rc) rc = seq_feed(s, ids, VERIFY_TOKENS, logits, err, errlen);
    double t3 = now_seconds();
    if (timed && !rc) {
        double flops = 0;
        for (int p = 0; p < o->prompt; p++) flops += model_token_flops(m, p);
        r->prefill_tok_s = o->prompt / (t1 - t0);
        r->prefill_gflops = flops / (t1 - t0) / 1e9;
        r->decode_tok_s = o->decode / (t2 - t1);
        r->verify_cost_ratio = (t3 - t2) * r->decode_tok_s;
        r->mpi_bytes_per_token = (double)(x1.bytes_sent + x1.bytes_received - x0.bytes_sent - x0.bytes_received) / o->decode;
        r->mpi_messages_per_token = (double)(x1.messages - x0.messages) / o->decode;
    }
    free(logits);
    seq_free(s);
    return rc;
}

static void report(const bench_opts *o, const bench_result *r) {
    if (o->json) {
        printf("{\"prefill_tok_s\":%.3f,\"prefill_gflops\":%.3f,\"fma_peak_gflops\":%.3f,"
               "\"prefill_vs_fma_peak\":%.4f,\"bf16_dot_peak_gflops\":%.3f,\"decode_tok_s\":%.3f,"
               "\"bandwidth_gbs\":%.3f,\"decode_efficiency\":%.6f,\"decode_bytes_per_token\":%zu,\"prompt\":%ld,"
               "\"decode\":%ld,\"verify%d_cost_ratio\":%.3f,\"threads\":%d,\"simd\":\"%s\",\"ranks\":%d,"
               "\"mpi_bytes_per_token\":%.1f,\"mpi_messages_per_token\":%.2f,\"mlocked_bytes\":%zu,"
               "\"thread_scaling_prefill\":%.3f,\"thread_scaling_decode\":%.3f}\n",
               r->prefill_tok_s, r->prefill_gflops, r->fma_peak_gflops, r->prefill_gflops / r->fma_peak_gflops,
               r->bf16_peak_gflops, r->decode_tok_s, r->bandwidth_gbs, r->decode_efficiency, r->decode_bytes,
               o->prompt, o->decode, VERIFY_TOKENS, r->verify_cost_ratio, pool_threads(), kernels_simd_name(),
               cluster_size(), r->mpi_bytes_per_token, r->mpi_messages_per_token, r->mlocked_bytes,
               r->scaling_prefill, r->scaling_decode);
        return;
    }
    printf("read bandwidth      %10.2f GB/s\n", r->bandwidth_gbs);
    printf("prefill (%4ld tok)  %10.2f tok/s  %8.2f GFLOP/s = %.3f of the f32 FMA peak (%.1f GFLOP/s)", o->prompt,
           r->prefill_tok_s, r->prefill_gflops, r->prefill_gflops / r->fma_peak_gflops, r->fma_peak_gflops);
    if (r->bf16_peak_gflops > 0)
        printf(", %.3f of the BF16 dot peak (%.1f)", r->prefill_gflops / r->bf16_peak_gflops, r->bf16_peak_gflops);
    printf("\n");
    printf("decode  (%4ld tok)  %10.2f tok/s  %8.1f MB/token\n", o->decode, r->decode_tok_s, r->decode_bytes / 1e6);
    printf("decode efficiency   %10.3f  (weight bytes/s over read bandwidth; %d threads, %s)\n", r->decode_efficiency,
           pool_threads(), kernels_simd_name());
    if (r->scaling_prefill > 0)
        printf("thread scaling      %10.2f  prefill, %.2f decode (%d threads / 1)\n", r->scaling_prefill,
               r->scaling_decode, pool_threads());
    printf("verify %d tokens     %10.2f  decode steps (one forward call; MTP speculation: cairn bench mtp)\n",
           VERIFY_TOKENS, r->verify_cost_ratio);
    if (cluster_size() > 1)
        printf("expert parallelism  %10d ranks  %8.1f KB/token between them, %.1f messages/token\n", cluster_size(),
               r->mpi_bytes_per_token / 1e3, r->mpi_messages_per_token);
}

int bench_model(int argc, char **argv) {
    bench_opts o = {.prompt = 64, .decode = 16, .num = NUMERICS_QAT};
    if (bench_parse("bench", argc, argv, usage, &o)) return 2;
    if (o.threads) pool_set_threads((int)o.threads);
    if (o.expert_cache_mb > 0) return bench_disk(&o);
    bench_result r = {0};
    model *m = bench_open("bench", &o, &r.mlocked_bytes);
    if (!m) return 1;
    char err[512] = "";
    if (o.prompt + o.decode + 1 > m->max_ctx) {
        fprintf(stderr, "cairn bench: --prompt + --decode exceed the model's %d positions\n", m->max_ctx);
        model_close(m);
        return 2;
    }
    int *ids = bench_prompt((int)o.prompt, m->vocab_size, 0);
    r.decode_bytes = model_decode_bytes(m);
    int rc = measure(m, &o, ids, 0, &r, err, sizeof err);
    int threads = pool_threads();
    bench_result all[TIMED_ROUNDS] = {{0}}, one[TIMED_ROUNDS] = {{0}};
    for (int i = 0; !rc && i < TIMED_ROUNDS; i++) {
        all[i].bandwidth_gbs = bench_read_bandwidth(bench_stream_bytes()) / 1e9;
        rc = measure(m, &o, ids, 1, &all[i], err, sizeof err);
        if (rc || threads == 1) continue;
        pool_set_threads(1);
        rc = measure(m, &o, ids, 1, &one[i], err, sizeof err);
        pool_set_threads(threads);
    }
    take_medians(all, TIMED_ROUNDS, &r);
    if (!rc && threads > 1) {
        bench_result single = {0};
        take_medians(one, TIMED_ROUNDS, &single);
        r.scaling_prefill = r.prefill_tok_s / single.prefill_tok_s;
        r.scaling_decode = r.decode_tok_s / single.decode_tok_s;
    }
    r.fma_peak_gflops = bench_fma_peak() * 1e-9;
    r.bf16_peak_gflops = bench_bf16_dot_peak() * 1e-9;
    if (!rc) {
        r.decode_efficiency = r.bandwidth_gbs > 0 ? r.decode_bytes * r.decode_tok_s / (r.bandwidth_gbs * 1e9) : 0;
        report(&o, &r);
    } else {
        fprintf(stderr, "cairn bench: %s\n", err);
    }
    free(ids);
    model_close(m);
    return rc ? 1 : 0;
}
