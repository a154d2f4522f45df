/* threads.c — the process-global worker pool (see threads.h).
 *
 * One job at a time: pool_run publishes (n, fn, ctx) under a new generation number, and the
 * caller and every worker then claim runs of `grain` indices from a shared counter until none
 * are left; the caller returns when all n calls have finished. Claiming instead of a fixed
 * split matters on a shared machine: a worker that the OS has descheduled, or that wakes up
 * late, leaves its share to the others instead of holding the whole job up. The generation and
 * the next index live in one 64-bit word, so a claim by a worker that woke for an old job fails
 * instead of running an index of a new one; and before the caller writes a new job's n, fn and
 * ctx it closes the old one (a generation of its own with no index left), so a claim against the
 * old job cannot succeed with the new n. Workers spin briefly before sleeping because decode
 * issues hundreds of small jobs per token and a scheduler wake-up costs as much as a small
 * matvec. Sleeping is a futex on a word of its own (the generation for workers, the done count
 * for the caller), and the other side makes the wake-up system call only when a sleeper has
 * announced itself: a job that finds its workers spinning costs no lock and no system call, and
 * its last call to finish touches only the done count.
 *
 * Only workers with part < `active` claim, so pool_set_threads can lower or raise the count
 * between jobs (tests compare thread counts). */
#include "threads.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define POOL_MAX_THREADS 256
#define POOL_SPIN_ROUNDS 4000     /* polls before sleeping: half with a pause hint, half yielding */
#define POOL_RUNS_PER_THREAD 16   /* claims per thread in an even job: balance vs counter traffic */

static struct {
    atomic_int active;            /* threads that work on a job, including the calling thread */
    int created;                  /* threads running worker_main, plus the caller */
    int started;
    pthread_mutex_t run_lock;     /* serialises pool_run callers from different threads */
    _Atomic uint64_t claim;       /* generation << 32 | next unclaimed index of the current job */
    _Atomic uint32_t wake_word;   /* bumped after each new job is published: the workers' futex */
    atomic_int sleepers;          /* workers in (or on their way into) a futex wait on wake_word */
    _Atomic uint32_t done;        /* calls of the current job that have returned: the caller's futex */
    atomic_int caller_sleeps;     /* the caller is in (or on its way into) a futex wait on done */
    atomic_int n, grain;          /* atomic: a late worker may read them as the next job sets them */
    pool_task fn;
    void *ctx;
} pool = {.run_lock = PTHREAD_MUTEX_INITIALIZER};

static atomic_ullong jobs_run;      /* pool_jobs */
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static _Thread_local int in_task;   /* set while this thread runs pool work: nested calls go serial */
static _Thread_local int worker_part;   /* a worker's part (pool_worker); 0 on every other thread */

/* Polling pause: the CPU hint first, then yield the core to anything else runnable. */
static void cpu_relax(int spin) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (spin > POOL_SPIN_ROUNDS / 2) sched_yield();
}

static unsigned claim_generation(uint64_t c) { return (unsigned)(c >> 32); }

/* Sleep while *word == expected (the kernel compares atomically with the wake-up); returns at
 * once if it differs, and may return spuriously: callers re-check their condition. */
static void futex_wait(_Atomic uint32_t *word, uint32_t expected) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Claim and run index runs of job `gen` until none are left. The job's n, fn and ctx are read
 * only after a successful claim: the job cannot finish, and so cannot be replaced, before the
 * claimed calls return. n is read before claiming: if it is already the next job's, the acquire
 * load also shows that job's close, so the claim fails. */
static void run_claims(unsigned gen) {
    in_task = 1;
    for (;;) {
        uint64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
        int next = (int)(uint32_t)c, n = atomic_load_explicit(&pool.n, memory_order_acquire);
        if (claim_generation(c) != gen || next >= n) break;
        int grain = atomic_load_explicit(&pool.grain, memory_order_relaxed);
        int hi = n - next > grain ? next + grain : n;
        if (!atomic_compare_exchange_weak_explicit(&pool.claim, &c, (uint64_t)gen << 32 | (uint32_t)hi,
                                                   memory_order_acq_rel, memory_order_relaxed))
            continue;
        for (int i = next; i < hi; i++) pool.fn(pool.ctx, i);
        /* seq_cst pairs with pool_run's: either it sees the count or this sees it asleep */
        if (atomic_fetch_add(&pool.done, (uint32_t)(hi - next)) + (uint32_t)(hi - next) == (uint32_t)n &&
            atomic_load(&pool.caller_sleeps))
            futex_wake_all(&pool.done);
    }
    in_task = 0;
}

static unsigned current_generation(void) {
    return claim_generation(atomic_load_explicit(&pool.claim, memory_order_acquire));
}

static unsigned wait_new_generation(unsigned seen) {
    for (int spin = 0; spin < POOL_SPIN_ROUNDS; spin++) {
        unsigned g = current_generation();
        if (g != seen) return g;
        cpu_relax(spin);
    }
    /* seq_cst pairs with pool_run's: either it sees this sleeper or this sees the new word */
    atomic_fetch_add(&pool.sleepers, 1);
    unsigned g;
    for (;;) {
        uint32_t word = atomic_load(&pool.wake_word);
        if ((g = current_generation()) != seen) break;
        futex_wait(&pool.wake_word, word);
    }
    atomic_fetch_sub(&pool.sleepers, 1);
    return g;
}

/* Generation current when each worker was created: a worker started after earlier jobs must
 * wait for the next one, not look at the last. */
static unsigned start_generation[POOL_MAX_THREADS];

static void *worker_main(void *arg) {
    int part = (int)(long)arg;
    unsigned seen = start_generation[part];
    worker_part = part;
    for (;;) {
        seen = wait_new_generation(seen);
        if (part < pool.active) run_claims(seen);
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
        start_generation[pool.created] = current_generation();
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

int pool_worker(void) { return worker_part; }

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

unsigned long long pool_jobs(void) { return atomic_load_explicit(&jobs_run, memory_order_relaxed); }

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
    atomic_fetch_add_explicit(&jobs_run, 1, memory_order_relaxed);
    unsigned gen = current_generation() + 2;   /* gen - 1 closes the last job */
    atomic_store_explicit(&pool.claim, (uint64_t)(gen - 1) << 32 | INT32_MAX, memory_order_relaxed);
    int grain = n / (pool.active * POOL_RUNS_PER_THREAD);
    atomic_store_explicit(&pool.n, n, memory_order_release);   /* a worker that sees it sees the close */
    atomic_store_explicit(&pool.grain, grain < 1 ? 1 : grain, memory_order_relaxed);
    pool.fn = fn;
    pool.ctx = ctx;
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.claim, (uint64_t)gen << 32, memory_order_release);
    atomic_fetch_add(&pool.wake_word, 1);
    if (atomic_load(&pool.sleepers)) futex_wake_all(&pool.wake_word);

    run_claims(gen);

    for (int spin = 0; spin < POOL_SPIN_ROUNDS && atomic_load_explicit(&pool.done, memory_order_acquire) < (uint32_t)n;
         spin++)
        cpu_relax(spin);
    if (atomic_load_explicit(&pool.done, memory_order_acquire) < (uint32_t)n) {
        atomic_store(&pool.caller_sleeps, 1);
        uint32_t d;
        while ((d = atomic_load(&pool.done)) < (uint32_t)n) futex_wait(&pool.done, d);
        atomic_store(&pool.caller_sleeps, 0);
    }
    pthread_mutex_unlock(&pool.run_lock);
}
