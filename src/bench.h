/* bench.h — `cairn bench` parts. cmd_bench (src/cmd_bench.c) dispatches:
 *   cairn bench kernels          -> bench_kernels   (src/cmd_bench.c)
 *   cairn bench -m DIR [--json]  -> bench_model     (src/bench_model.c; with --expert-cache-mb
 *                                   bench_disk, src/bench_disk.c)
 *   cairn bench reuse -m DIR     -> bench_reuse     (src/bench_reuse.c)
 *   cairn bench concurrency -m DIR -> bench_concurrency (src/bench_concurrency.c)
 *   cairn bench grammar -m DIR   -> bench_grammar   (src/bench_grammar.c)
 *   cairn bench mtp -m DIR       -> bench_mtp       (src/bench_mtp.c)
 * Every report is a ratio measured in the same run (e.g. bytes/s over the read bandwidth this
 * run measured), never an absolute figure compared with a constant. */
#ifndef CAIRN_BENCH_H
#define CAIRN_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "models/model.h"

int bench_kernels(int argc, char **argv);
int bench_model(int argc, char **argv);
int bench_reuse(int argc, char **argv);
int bench_concurrency(int argc, char **argv);
int bench_grammar(int argc, char **argv);
int bench_mtp(int argc, char **argv);

/* A fixed pseudo-random prompt of n ids, one per seed (ids 2.. to stay clear of BOS/EOS in
 * small vocabularies), and the greedy choice the benches decode with. */
int *bench_prompt(int n, int vocab, uint64_t seed);
/* The options `bench -m` and `bench concurrency` share; bench_parse reads them over the defaults
 * already in *o (-1 with a message on a bad flag). */
typedef struct {
    const char *model_dir;
    int json;
    long prompt, decode, threads;
    numerics num;
    double expert_cache_mb;    /* --expert-cache-mb: 0 = the mapping */
    int mlock;                 /* --mlock: lock the dense weights (model_mlock) */
} bench_opts;
int bench_parse(const char *cmd, int argc, char **argv, void (*usage)(FILE *), bench_opts *o);
/* The model the options name, with --mlock and --expert-cache-mb applied as every bench applies them
 * (*mlocked, if not NULL, gets the bytes locked); NULL with "cairn CMD: ..." on stderr. */
model *bench_open(const char *cmd, const bench_opts *o, size_t *mlocked);
int bench_argmax(const float *x, int n);
/* v[0..n) sorted ascending in place; bench_median sorts it and returns its median (the mean of
 * the middle two for even n). */
void bench_sort(double *v, long n);
double bench_median(double *v, long n);
/* bench -m DIR --expert-cache-mb N: decode from disk through the mapping and the expert cache
 * (src/bench_disk.c). */
int bench_disk(const bench_opts *o);

/* Stream-like read bandwidth in bytes/s over a buffer of at least `bytes` (bench_stream_bytes() for reports),
 * using the same thread pool as the kernels: the faster of plain loads and loads behind software prefetches. */
double bench_read_bandwidth(size_t bytes);

/* Size of the largest CPU cache (sysfs, cpu0; else CPUID on x86), 0 if unknown. Streaming measurements use buffers
 * of several times this, so they read memory, not the last-level cache. */
size_t bench_llc_bytes(void);
/* Bytes a streaming measurement should touch: 4 x the last-level cache, at least 1 GiB. */
size_t bench_stream_bytes(void);

/* Measured arithmetic peaks of this machine in FLOP/s on all pool threads: f32 FMA at the widest
 * vector width of the build (2 flops per lane), and the BF16 pair dot product (VDPBF16PS, 4 flops
 * per f32 lane; 0 when the build has none). Prefill GFLOP/s is reported as a fraction of these. */
double bench_fma_peak(void);
double bench_bf16_dot_peak(void);

#endif
