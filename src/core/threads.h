/* threads.h — a fixed pthreads pool for data-parallel loops.
 *
 * pool_run(n, fn, ctx) calls fn(ctx, i) for every i in [0, n), spread over the pool's threads,
 * and returns when all calls are done. Work is split by index only, so a result never depends
 * on the number of threads (each i must write disjoint output).
 *
 * The pool is process-global, created lazily with CAIRN_THREADS (default: online cores).
 * Nested calls from inside a task run serially on the calling thread.
 */
#ifndef CAIRN_THREADS_H
#define CAIRN_THREADS_H

typedef void (*pool_task)(void *ctx, int i);

void pool_run(int n, pool_task fn, void *ctx);
int pool_threads(void);
/* Inside a task: which of the pool_threads() threads runs it, in [0, pool_threads()) (the
 * calling thread is 0), so a task can use scratch of its thread's own; 0 outside the pool. */
int pool_worker(void);
/* Whether the calling thread is running pool work (a task, or a call made serial inside one), so
 * a caller that times its own calls can tell the top-level ones from those that overlap others. */
int pool_in_task(void);
void pool_set_threads(int n);   /* before first use; 1 = no threads */
/* Jobs handed to the pool's threads since the start (pool_run calls that did not run serially:
 * nested, one index, or one thread): each one is a synchronisation of every thread. */
unsigned long long pool_jobs(void);

#endif
