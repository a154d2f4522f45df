/* cluster_mpi.c — the cluster over OpenMPI (make MPI=1; cluster.h). Messages are MPI_BYTE
 * buffers on MPI_COMM_WORLD; a receive probes first, so it can size its buffer to the message.
 *
 * Waiting is polite: OpenMPI's blocking probe spins a core at 100 % for as long as it waits,
 * which on a shared machine takes the core from the very threads (the other rank's experts,
 * rank 0's attention) the wait is for, and burns one per idle rank between requests. So a
 * receive polls MPI_Iprobe, spinning for its first millisecond only (a MoE layer's round trip
 * is usually shorter: sleeping there costs a decode step several times over, and sched_yield
 * measured worse still), then sleeping 50 us doubling to 1 ms (an idle engine costs nothing). */
#include "cluster.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <time.h>

#include "util.h"

static int started, stopped, rank, size = 1;

static int mpi_errf(int rc, const char *what, char *err, size_t errlen) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return errf(err, errlen, "cluster: %s: %.*s", what, len, msg);
}

int cluster_start(int *argc, char ***argv, char *err, size_t errlen) {
    int provided;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return errf(err, errlen, "cluster: MPI_Init_thread failed");
    started = 1;
    /* errors come back as codes, so a failed send is reported by name instead of aborting the job */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (provided < MPI_THREAD_SERIALIZED) return errf(err, errlen, "cluster: this MPI offers no MPI_THREAD_SERIALIZED");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return 0;
}

void cluster_stop(void) {
    if (!started || stopped) return;
    stopped = 1;
    if (rank == 0)
        for (int r = 1; r < size; r++) MPI_Send(NULL, 0, MPI_BYTE, r, CLUSTER_STOP, MPI_COMM_WORLD);
    MPI_Finalize();
}

int cluster_rank(void) { return rank; }
int cluster_size(void) { return size; }
const char *cluster_kind(void) { return "mpi"; }

int cluster_send(int to, int tag, const void *buf, size_t len, char *err, size_t errlen) {
    if (len > INT_MAX) return errf(err, errlen, "cluster: a message of %zu bytes is over MPI's int count", len);
    int rc = MPI_Send(buf, (int)len, MPI_BYTE, to, tag, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_errf(rc, "MPI_Send", err, errlen);
}

long cluster_recv(int from, int *tag, void **buf, size_t *cap, char *err, size_t errlen) {
    MPI_Status st;
    int rc, len, ready = 0;
    long nap = 50000;
    double until = now_seconds() + 1e-3;
    for (;;) {
        if ((rc = MPI_Iprobe(from, MPI_ANY_TAG, MPI_COMM_WORLD, &ready, &st)) != MPI_SUCCESS)
            return mpi_errf(rc, "MPI_Iprobe", err, errlen);
        if (ready) break;
        if (now_seconds() < until) continue;
        nanosleep(&(struct timespec){0, nap}, NULL);
        if (nap < 1000000) nap *= 2;
    }
    MPI_Get_count(&st, MPI_BYTE, &len);
    if ((size_t)len > *cap) {
        *buf = xrealloc(*buf, (size_t)len);
        *cap = (size_t)len;
    }
    rc = MPI_Recv(*buf, len, MPI_BYTE, from, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_errf(rc, "MPI_Recv", err, errlen);
    *tag = st.MPI_TAG;
    return len;
}
