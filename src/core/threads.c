/* threads.c — the process-global worker pool (see threads.h).
 *
 * One job at a time. pool_run cuts [0, n) into one contiguous range per thread (part p: the
 * calling thread is part 0, worker k part k), publishes the job under a new generation number,
 * and every thread claims runs of `grain` indices from the front of its own range, then takes
 * runs from the back of the others' ranges until none are left; the caller returns when all n
 * calls have finished. Taking from the others matters on a shared machine: a worker that the
 * OS has descheduled, or that wakes up late, leaves its range to the others instead of holding
 * the whole job up.
 *
 * Each range, each thread's count of finished calls and the job itself sit in cache lines of
 * their own, so a thread working through its own range touches only lines it holds: on a
 * virtual machine a cache line moving between cores costs about as much as a small task (a
 * counter shared by every claim, next to the done count the caller polls, made a 2-thread job
 * of 64 short tasks slower than one thread running them all). A range word holds the
 * generation with the next and end index, so a claim by a thread that woke for an old job fails
 * instead of running an index of a new one, and a successful claim reads the job's fn and ctx
 * only then: the job cannot finish, and so cannot be replaced, before the claimed calls return.
 * Finished counts only grow; the caller waits until their sum reaches the total of every job's n.
 *
 * Workers spin briefly before sleeping because decode issues hundreds of small jobs per token
 * and a scheduler wake-up costs as much as a small matvec. Sleeping is a futex on a word of its
 * own (the generation for workers, a done word for the caller), and the other side makes the
 * wake-up system call only when a sleeper has announced itself: a job that finds its workers
 * spinning costs no lock and no system call.
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
#define POOL_RUNS_PER_PART 8      /* claims in a range: what the others can take vs claims made */
#define INDEX_BITS 22             /* a range word: generation << 44 | next << 22 | end */
#define INDEX_LIMIT (1 << INDEX_BITS)
#define GEN_MASK ((1u << (64 - 2 * INDEX_BITS)) - 1)

typedef struct { _Alignas(64) _Atomic uint64_t word; } range_line;
typedef struct { _Alignas(64) _Atomic uint64_t calls; } done_line;

static struct {
    _Alignas(64) _Atomic uint32_t gen;   /* the current job's generation: the workers' futex word */
    atomic_int grain, parts;             /* atomic: a late worker may read them as the next job sets them */
    pool_task fn;
    void *ctx;
    _Alignas(64) atomic_int sleepers;    /* workers in (or on their way into) a futex wait on gen */
    _Alignas(64) _Atomic uint32_t done_word;   /* bumped when a call finishes while the caller sleeps */
    atomic_int caller_sleeps;            /* the caller is in (or on its way into) a futex wait on done_word */
    _Alignas(64) atomic_int active;      /* threads that work on a job, including the calling thread */
    int created;                         /* threads running worker_main, plus the caller */
    int started;
    uint64_t total;                      /* calls of every job so far: the finished counts' target */
    pthread_mutex_t run_lock;            /* serialises pool_run callers from different threads */
} pool = {.run_lock = PTHREAD_MUTEX_INITIALIZER};

static range_line ranges[POOL_MAX_THREADS];   /* part p's unclaimed indices */
static done_line finished[POOL_MAX_THREADS];  /* calls part p's thread has finished, ever */

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

static uint64_t range_word(unsigned gen, unsigned next, unsigned end) {
    return (uint64_t)(gen & GEN_MASK) << (2 * INDEX_BITS) | (uint64_t)next << INDEX_BITS | end;
}
static unsigned range_gen(uint64_t w) { return (unsigned)(w >> (2 * INDEX_BITS)); }
static unsigned range_next(uint64_t w) { return (unsigned)(w >> INDEX_BITS) & (INDEX_LIMIT - 1); }
static unsigned range_end(uint64_t w) { return (unsigned)w & (INDEX_LIMIT - 1); }

/* Sleep while *word == expected (the kernel compares atomically with the wake-up); returns at
 * once if it differs, and may return spuriously: callers re-check their condition. */
static void futex_wait(_Atomic uint32_t *word, uint32_t expected) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Claim one run of job `gen` from part p: from the front of the thread's own range, from the
 * back of another's. Returns 0 when the part has none left (or belongs to another job). */
static int claim(unsigned gen, int p, int own, unsigned *lo, unsigned *hi) {
    uint64_t w = atomic_load_explicit(&ranges[p].word, memory_order_acquire);
    for (;;) {
        unsigned next = range_next(w), end = range_end(w);
        if (range_gen(w) != (gen & GEN_MASK) || next >= end) return 0;
        unsigned grain = (unsigned)atomic_load_explicit(&pool.grain, memory_order_relaxed);
        unsigned take = end - next < grain ? end - next : grain;
        *lo = own ? next : end - take;
        *hi = own ? next + take : end;
        uint64_t rest = own ? range_word(gen, *hi, end) : range_word(gen, next, *lo);
        if (atomic_compare_exchange_weak_explicit(&ranges[p].word, &w, rest, memory_order_acq_rel,
                                                  memory_order_acquire))
            return 1;
    }
}

/* Run the claimed calls, then count them as this part's; wake the caller if it sleeps. */
static void run_calls(int me, unsigned lo, unsigned hi) {
    pool_task fn = pool.fn;
    void *ctx = pool.ctx;
    for (unsigned i = lo; i < hi; i++) fn(ctx, (int)i);
    /* seq_cst pairs with pool_run's: either it sees the count or this sees it asleep */
    atomic_fetch_add(&finished[me].calls, hi - lo);
    if (atomic_load(&pool.caller_sleeps)) {
        atomic_fetch_add(&pool.done_word, 1);
        futex_wake_all(&pool.done_word);
    }
}

/* Part `me` of job `gen`: its own range, then what is left of the others'. */
static void run_claims(unsigned gen, int me) {
    int parts = atomic_load_explicit(&pool.parts, memory_order_acquire);
    unsigned lo, hi;
    in_task = 1;
    for (int k = 0; k < parts; k++) {
        int p = (me + k) % parts;
        while (claim(gen, p, k == 0, &lo, &hi)) run_calls(me, lo, hi);
    }
    in_task = 0;
}

/* seq_cst: after announcing itself as a sleeper a worker must see a generation published before */
static unsigned current_generation(void) { return atomic_load(&pool.gen); }

static unsigned wait_new_generation(unsigned seen) {
    for (int spin = 0; spin < POOL_SPIN_ROUNDS; spin++) {
        unsigned g = current_generation();
        if (g != seen) return g;
        cpu_relax(spin);
    }
    /* seq_cst pairs with pool_run's: either it sees this sleeper or this sees the new generation */
    atomic_fetch_add(&pool.sleepers, 1);
    unsigned g;
    while ((g = current_generation()) == seen) futex_wait(&pool.gen, seen);
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
        if (part < pool.active) run_claims(seen, part);
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

int pool_in_task(void) { return in_task; }

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

/* Calls finished by every thread that ever ran one (a resize may have idled some since). */
static uint64_t finished_calls(void) {
    uint64_t sum = 0;
    for (int p = 0; p < pool.created; p++) sum += atomic_load(&finished[p].calls);
    return sum;
}

typedef struct {
    pool_task fn;
    void *ctx;
    int first;
} offset_job;

static void offset_task(void *ctx, int i) {
    offset_job *job = ctx;
    job->fn(job->ctx, job->first + i);
}

/* Publish job (n, fn, ctx) to `parts` threads: each range in its line, then the generation. */
static unsigned publish(int n, pool_task fn, void *ctx, int parts) {
    unsigned gen = current_generation() + 1;
    int grain = n / (parts * POOL_RUNS_PER_PART);
    atomic_store_explicit(&pool.grain, grain < 1 ? 1 : grain, memory_order_relaxed);
    atomic_store_explicit(&pool.parts, parts, memory_order_relaxed);
    pool.fn = fn;
    pool.ctx = ctx;
    for (int p = 0; p < parts; p++)
        atomic_store_explicit(&ranges[p].word,
                              range_word(gen, (unsigned)((long)n * p / parts), (unsigned)((long)n * (p + 1) / parts)),
                              memory_order_relaxed);
    atomic_store(&pool.gen, gen);   /* seq_cst: a worker that sees it sees the job; pairs with sleepers */
    if (atomic_load(&pool.sleepers)) futex_wake_all(&pool.gen);
    return gen;
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
    if (n >= INDEX_LIMIT) {   /* more indices than a range word holds: in pieces */
        for (int first = 0; first < n; first += INDEX_LIMIT - 1) {
            offset_job piece = {fn, ctx, first};
            pool_run(n - first < INDEX_LIMIT - 1 ? n - first : INDEX_LIMIT - 1, offset_task, &piece);
        }
        return;
    }
    pthread_mutex_lock(&pool.run_lock);
    atomic_fetch_add_explicit(&jobs_run, 1, memory_order_relaxed);
    int parts = pool.active;
    unsigned gen = publish(n, fn, ctx, parts);
    pool.total += (uint64_t)n;

    run_claims(gen, 0);

    for (int spin = 0; spin < POOL_SPIN_ROUNDS && finished_calls() < pool.total; spin++) cpu_relax(spin);
    if (finished_calls() < pool.total) {
        atomic_store(&pool.caller_sleeps, 1);
        for (;;) {
            uint32_t word = atomic_load(&pool.done_word);
            if (finished_calls() >= pool.total) break;
            futex_wait(&pool.done_word, word);
        }
        atomic_store(&pool.caller_sleeps, 0);
    }
    pthread_mutex_unlock(&pool.run_lock);
}
