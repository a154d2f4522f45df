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

/* "--numerics exact|qat" value -> enum; -1 if unknown. */
int cli_numerics(const char *s);
/* Parse a non-negative int / float flag value, printing "cairn SUB: bad value for --flag: X" on error. */
int cli_int(const char *sub, const char *flag, const char *s, long lo, long hi, long *out);
int cli_float(const char *sub, const char *flag, const char *s, double *out);

#endif
