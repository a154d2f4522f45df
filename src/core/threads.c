/* threads.c — the process-global worker pool (see threads.h).
 *
 * One job at a time: pool_run publishes (n, fn, ctx) with a new generation number, every worker
 * and the caller run their own contiguous index range, and the caller waits until all workers
 * have reported. Workers spin briefly before sleeping because decode issues thousands of small
 * jobs per token and a condition-variable wake-up costs as much as a small matvec.
 *
 * The split uses `active` parts; workers started earlier beyond that count take an empty range,
 * so pool_set_threads can lower or raise the count between jobs (tests compare thread counts). */
#include "threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define POOL_MAX_THREADS 256
#define POOL_SPIN_ROUNDS 4000     /* polls before sleeping: half with a pause hint, half yielding */

static struct {
    int active;                   /* parts a job is split into, including the calling thread */
    int created;                  /* threads running worker_main, plus the caller */
    int started;
    pthread_mutex_t run_lock;     /* serialises pool_run callers from different threads */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_cond_t done;
    atomic_uint generation;       /* bumped once per job */
    atomic_int pending;           /* workers that have not finished the current job */
    int n;
    pool_task fn;
    void *ctx;
} pool = {.run_lock = PTHREAD_MUTEX_INITIALIZER, .lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static _Thread_local int in_task;   /* set while this thread runs pool work: nested calls go serial */

/* Polling pause: the CPU hint first, then yield the core to anything else runnable. */
static void cpu_relax(int spin) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (spin > POOL_SPIN_ROUNDS / 2) sched_yield();
}

static void run_range(int part) {
    if (part >= pool.active) return;
    int lo = (int)((long)pool.n * part / pool.active);
    int hi = (int)((long)pool.n * (part + 1) / pool.active);
    in_task = 1;
    for (int i = lo; i < hi; i++) pool.fn(pool.ctx, i);
    in_task = 0;
}

static unsigned wait_new_generation(unsigned seen) {
    for (int spin = 0; spin < POOL_SPIN_ROUNDS; spin++) {
        unsigned g = atomic_load_explicit(&pool.generation, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax(spin);
    }
    pthread_mutex_lock(&pool.lock);
    unsigned g;
    while ((g = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen)
        pthread_cond_wait(&pool.wake, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    return g;
}

/* Generation current when each worker was created: a worker started after earlier jobs must
 * wait for the next one, not re-run the last. */
static unsigned start_generation[POOL_MAX_THREADS];

static void *worker_main(void *arg) {
    int part = (int)(long)arg;
    unsigned seen = start_generation[part];
    for (;;) {
        seen = wait_new_generation(seen);
        run_range(part);
        if (atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool.lock);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.lock);
        }
    }
    return NULL;
}

static int threads_from_env(void) {
    const char *s = getenv("CAIRN_THREADS");
    if (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (*end == 0 && v >= 1 && v <= POOL_MAX_THREADS) return (int)v;
        fprintf(stderr, "cairn: ignoring CAIRN_THREADS='%s' (want 1..%d)\n", s, POOL_MAX_THREADS);
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1 : cores > POOL_MAX_THREADS ? POOL_MAX_THREADS : (int)cores;
}

/* Start workers until `want` threads (caller included) exist; called with run_lock held or
 * from pthread_once, never while a job runs. */
static void grow_to(int want) {
    if (pool.created == 0) pool.created = 1;
    while (pool.created < want) {
        pthread_t th;
        start_generation[pool.created] = atomic_load(&pool.generation);
        if (pthread_create(&th, NULL, worker_main, (void *)(long)pool.created) != 0) {
            fprintf(stderr, "cairn: could not start worker thread %d; using %d threads\n", pool.created,
                    pool.created);
            break;
        }
        pthread_detach(th);
        pool.created++;
    }
    pool.active = pool.created < want ? pool.created : want;
}

static void pool_start(void) {
    grow_to(pool.active ? pool.active : threads_from_env());
    pool.started = 1;
}

int pool_threads(void) {
    pthread_once(&pool_once, pool_start);
    return pool.active;
}

void pool_set_threads(int n) {
    n = n < 1 ? 1 : n > POOL_MAX_THREADS ? POOL_MAX_THREADS : n;
    if (in_task) {   /* the running job holds run_lock: resizing now would deadlock */
        fprintf(stderr, "cairn: pool_set_threads(%d) inside a pool task ignored\n", n);
        return;
    }
    if (!pool.started) { pool.active = n; return; }
    pthread_mutex_lock(&pool.run_lock);
    grow_to(n);
    pthread_mutex_unlock(&pool.run_lock);
}

void pool_run(int n, pool_task fn, void *ctx) {
    if (n <= 0) return;
    if (in_task || n == 1 || pool_threads() == 1) {
        int was = in_task;
        in_task = 1;
        for (int i = 0; i < n; i++) fn(ctx, i);
        in_task = was;
        return;
    }
    pthread_mutex_lock(&pool.run_lock);
    pool.n = n;
    pool.fn = fn;
    pool.ctx = ctx;
    atomic_store_explicit(&pool.pending, pool.created - 1, memory_order_relaxed);
    pthread_mutex_lock(&pool.lock);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);

    run_range(0);

    for (int spin = 0; spin < POOL_SPIN_ROUNDS && atomic_load_explicit(&pool.pending, memory_order_acquire); spin++)
        cpu_relax(spin);
    pthread_mutex_lock(&pool.lock);
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.run_lock);
}
