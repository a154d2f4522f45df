/* cluster_none.c — the default build's cluster: this process alone, rank 0 of 1 (cluster.h).
 * There is nobody to send to, so a send or receive is a caller's error, reported as such. */
#include "cluster.h"

#include "util.h"

int cluster_start(int *argc, char ***argv, char *err, size_t errlen) { return 0; }
void cluster_stop(void) {}
int cluster_rank(void) { return 0; }
int cluster_size(void) { return 1; }
const char *cluster_kind(void) { return "none"; }

int cluster_send(int to, int tag, const void *buf, size_t len, char *err, size_t errlen) {
    return errf(err, errlen, "cluster: this build has no MPI (build/mpi/cairn has: make MPI=1)");
}

long cluster_recv(int from, int *tag, void **buf, size_t *cap, char *err, size_t errlen) {
    return errf(err, errlen, "cluster: this build has no MPI (build/mpi/cairn has: make MPI=1)");
}
