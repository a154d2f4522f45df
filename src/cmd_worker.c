/* cmd_worker.c — what every MPI rank but 0 runs (core/cluster.h): it opens the model named on
 * the shared command line and serves its share of the routed experts to rank 0 until rank 0
 * stops the cluster (core/experts.h experts_serve).
 *
 * mpirun starts every rank with the same arguments (`mpirun -np 2 build/mpi/cairn run -m DIR
 * ...`), so the worker reads from them only what decides how an expert computes and where its
 * bytes come from — -m/--model, --numerics, --threads, --expert-cache-mb, --kv-dir — and leaves
 * the command itself (prompt, protocol, sampling) to rank 0. It never writes to stdout: under
 * `cairn engine` that is rank 0's protocol stream. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "core/cluster.h"
#include "core/threads.h"

typedef struct {
    const char *model_dir, *kv_dir;
    numerics num;
    long threads;
    double expert_cache_mb;
} worker_opts;

static int parse(int argc, char **argv, worker_opts *o) {
    *o = (worker_opts){.num = NUMERICS_QAT};
    const char *sub = argc ? argv[0] : "worker";
    for (int i = 1; i + 1 < argc; i++) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model_dir = v, i++;
        else if (!strcmp(a, "--kv-dir")) o->kv_dir = v, i++;
        else if (!strcmp(a, "--threads")) { if (cli_int(sub, a, v, 1, 1024, &o->threads)) return -1; i++; }
        else if (!strcmp(a, "--expert-cache-mb")) { if (cli_expert_cache_mb(sub, v, &o->expert_cache_mb)) return -1; i++; }
        else if (!strcmp(a, "--numerics")) {
            int n = cli_numerics(v);
            if (n < 0) { fprintf(stderr, "cairn %s: --numerics takes exact or qat\n", sub); return -1; }
            o->num = (numerics)n;
            i++;
        }
    }
    if (!o->model_dir) { fprintf(stderr, "cairn rank %d: the command line names no model (-m DIR)\n", cluster_rank()); return -1; }
    return 0;
}

int cmd_worker(int argc, char **argv) {
    worker_opts o;
    if (parse(argc, argv, &o)) return 2;
    if (o.threads) pool_set_threads((int)o.threads);
    char err[512] = "", sub[32];
    snprintf(sub, sizeof sub, "rank %d", cluster_rank());
    model *m = model_open(o.model_dir, o.num, 0, err, sizeof err);
    if (!m) { fprintf(stderr, "cairn %s: %s\n", sub, err); return 1; }
    int rc = cli_expert_cache(sub, m, o.expert_cache_mb, o.kv_dir) ? 1 : 0;
    if (!rc && experts_serve(m->experts, err, sizeof err)) {
        fprintf(stderr, "cairn %s: %s\n", sub, err);
        rc = 1;
    }
    char line[512];
    experts_parallel_line(m->experts, line, sizeof line);
    fprintf(stderr, "cairn: %s\n", line);
    model_close(m);
    return rc;
}
