/* cluster.h — the processes one model runs on, and the messages between them.
 *
 * The default build is one process: rank 0 of 1 (cluster_none.c, no MPI linked). `make MPI=1`
 * builds build/mpi/cairn with cluster_mpi.c, OpenMPI underneath: started by `mpirun -np R`, every
 * rank runs the same command line; rank 0 is the program (CLI, engine, state), ranks 1..R-1 only
 * serve routed experts (core/experts.h experts_serve, src/cmd_worker.c).
 *
 * INVARIANTS
 *  - Messages between two ranks arrive in the order they were sent (MPI's non-overtaking rule
 *    for one communicator, source and tag set), whole, with their tag.
 *  - cluster_stop on rank 0 sends every other rank CLUSTER_STOP before finalising, so a rank
 *    waiting in cluster_recv returns instead of hanging; it runs at most once (atexit-safe).
 *  - Only one thread of a process calls cluster_send / cluster_recv at a time (the forward pass
 *    on rank 0, the serve loop elsewhere): MPI is initialised at MPI_THREAD_SERIALIZED.
 */
#ifndef CAIRN_CLUSTER_H
#define CAIRN_CLUSTER_H

#include <stddef.h>

enum { CLUSTER_STOP = 1, CLUSTER_EXPERTS = 2, CLUSTER_OUTPUT = 3 };   /* message tags */

/* Join the cluster (MPI_Init_thread; nothing in the one-process build). -1 with err on failure. */
int cluster_start(int *argc, char ***argv, char *err, size_t errlen);
void cluster_stop(void);
int cluster_rank(void);
int cluster_size(void);
/* "mpi" or "none": what this binary was built with. */
const char *cluster_kind(void);

/* Send len bytes to rank `to` with tag; -1 with err on failure. */
int cluster_send(int to, int tag, const void *buf, size_t len, char *err, size_t errlen);
/* Receive the next message from rank `from` into *buf (grown as needed; capacity *cap): its
 * length, its tag in *tag. -1 with err on failure. */
long cluster_recv(int from, int *tag, void **buf, size_t *cap, char *err, size_t errlen);

#endif
