/* cli.h — the subcommands of build/cairn. Each lives in its own file and parses its own flags;
 * `--help` on each prints its usage. Shared flag helpers are here so every subcommand spells
 * them the same way. */
#ifndef CAIRN_CLI_H
#define CAIRN_CLI_H

#include "models/model.h"

int cmd_run(int argc, char **argv);      /* src/cmd_run.c     */
int cmd_engine(int argc, char **argv);   /* src/serve/engine.c */
int cmd_serve(int argc, char **argv);    /* src/serve/gateway.c */
int cmd_bench(int argc, char **argv);    /* src/cmd_bench.c   */
int cmd_families(int argc, char **argv); /* src/cmd_families.c */
int cmd_worker(int argc, char **argv);   /* src/cmd_worker.c: MPI ranks other than 0 */

/* "--numerics exact|qat" value -> enum; -1 if unknown. */
int cli_numerics(const char *s);
/* Parse a non-negative int / float flag value, printing "cairn SUB: bad value for --flag: X" on error. */
int cli_int(const char *sub, const char *flag, const char *s, long lo, long hi, long *out);
int cli_float(const char *sub, const char *flag, const char *s, double *out);
/* `--expert-cache-mb N`, spelled the same by run, engine, serve and bench. */
#define CLI_EXPERT_CACHE_HELP \
    "  --expert-cache-mb N   read routed experts with pread into an N MiB LRU cache instead of the mapping\n" \
    "                        (for checkpoints larger than RAM; see docs/scale.md)\n"
/* The flag's value: MiB, fractions allowed, in (0, 2^30]; prints the error. */
int cli_expert_cache_mb(const char *sub, const char *v, double *mb);
/* mb > 0: switch m to the expert cache, usage counts kept in usage_dir (NULL: none); prints
 * "cairn SUB: ..." and returns -1 when the budget or model refuses. mb == 0: nothing. */
int cli_expert_cache(const char *sub, model *m, double mb, const char *usage_dir);

/* `--mlock`, spelled the same by run, engine, serve and bench. */
#define CLI_MLOCK_HELP \
    "  --mlock               lock the dense, shared and lookup weights in memory (model_mlock); refused\n" \
    "                        with a message, and the run goes on unlocked, when RLIMIT_MEMLOCK or memory\n" \
    "                        does not allow it\n"
/* model_mlock with its outcome on stderr as "cairn SUB: --mlock: ..."; the bytes locked. */
size_t cli_mlock(const char *sub, model *m);

#endif
