/* cairn — inference engine and server for large Mixture-of-Experts model families.
 * main() only dispatches to a subcommand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

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

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    const char *cmd = argv[1];
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
