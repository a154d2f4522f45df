/* bench.h — `cairn bench` parts. cmd_bench (src/cmd_bench.c) dispatches:
 *   cairn bench kernels          -> bench_kernels   (src/cmd_bench.c)
 *   cairn bench -m DIR [--json]  -> bench_model     (src/bench_model.c)
 *   cairn bench reuse -m DIR     -> bench_reuse     (src/bench_reuse.c)
 *   cairn bench grammar -m DIR   -> bench_grammar   (src/bench_grammar.c)
 * Every report is a ratio measured in the same run (e.g. bytes/s over the read bandwidth this
 * run measured), never an absolute figure compared with a constant. */
#ifndef CAIRN_BENCH_H
#define CAIRN_BENCH_H

#include <stddef.h>

int bench_kernels(int argc, char **argv);
int bench_model(int argc, char **argv);
int bench_reuse(int argc, char **argv);
int bench_grammar(int argc, char **argv);

/* Stream-like read bandwidth in bytes/s over a buffer of at least `bytes` (>= 1 GiB for reports),
 * using the same thread pool as the kernels. */
double bench_read_bandwidth(size_t bytes);

#endif
