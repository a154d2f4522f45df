/* cairn — inference engine and server for large Mixture-of-Experts model families.
 * main() only joins the cluster (core/cluster.h: one process unless built with MPI=1 and started
 * by mpirun) and dispatches to a subcommand; ranks other than 0 serve experts (cmd_worker.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/cluster.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: cairn <command> [options]\n"
            "\n"
            "commands:\n"
            "  run     generate from a prompt, token ids or an interactive chat\n"
            "  engine  speak the engine line protocol on stdin/stdout\n"
            "  serve   OpenAI- and Anthropic-compatible HTTP server over engine processes\n"
            "  bench   measure kernels, prefill/decode and prefix reuse\n"
            "  families  list the registered model families (JSON)\n"
            "\n"
            "`cairn <command> --help` describes each command's options.\n");
}

static int dispatch(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    const char *cmd = argv[1];
    if (cluster_rank() > 0) return cmd_worker(argc - 1, argv + 1);
    if (cluster_size() > 1 && strcmp(cmd, "run") && strcmp(cmd, "engine") && strcmp(cmd, "bench")) {
        fprintf(stderr, "cairn: '%s' does not run across MPI ranks; run, engine and bench do (cairn serve can "
                "start its engine that way with --engine, see docs/scale.md)\n", cmd);
        return 2;
    }
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "engine")) return cmd_engine(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "families")) return cmd_families(argc - 1, argv + 1);
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) { usage(stdout); return 0; }
    fprintf(stderr, "cairn: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv) {
    char err[256];
    if (cluster_start(&argc, &argv, err, sizeof err)) {
        fprintf(stderr, "cairn: %s\n", err);
        return 1;
    }
    /* exit() paths of a command stop the cluster too, so no rank waits for a rank 0 that is gone */
    atexit(cluster_stop);
    int rc = dispatch(argc, argv);
    cluster_stop();
    return rc;
}
