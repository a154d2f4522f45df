/* malloc_tune.h — glibc malloc settings of the `cairn serve` process (not of its engine child).
 *
 * The gateway runs one thread per connection, and under `make soak` (500 keep-alive connections
 * plus 200 slow-loris ones) about 700 of them live for the whole run. glibc keeps memory per
 * thread in two places, and both stay resident however little is live:
 *
 *   - arenas: a thread that finds the heap's lock taken gets an arena of its own (up to 8 per
 *     core), and each keeps its freed pages (the soak's RSS grew by 12% with them).
 *     malloc_tune_process() allows one arena: the gateway's work per request is small next to
 *     the engine's, so the shared lock costs nothing visible.
 *   - the per-thread cache (tcache): up to 7 freed chunks of each size up to 1 KiB per thread,
 *     handed back only when the thread exits. Under the soak it held about 16 MiB of the
 *     gateway's 54 MiB and kept growing: the heap's live bytes were flat (heaptrack) while the
 *     RSS crept up (docs/reliability.md §4). No mallopt()
 *     parameter sets it; only the glibc.malloc.tcache_count tunable, read from GLIBC_TUNABLES when
 *     the process starts. malloc_tune_exec() therefore runs this program again with that tunable
 *     set to 0, before the gateway has done anything.
 *
 * INVARIANTS
 *  - malloc_tune_exec() is called in cmd_serve as soon as the flags are parsed, before any
 *    thread, file or socket exists; it re-executes at most once (the second run finds the
 *    variable it left, SAVED_TUNABLES in malloc_tune.c, and goes on).
 *  - The engine child sees the environment the user started `cairn serve` with: the re-executed
 *    gateway puts GLIBC_TUNABLES back (or removes it) before anything else, so the engine keeps
 *    glibc's defaults: it has few threads, so their caches hold little.
 *  - A GLIBC_TUNABLES that already names glibc.malloc.tcache_count is the user's choice and is
 *    left alone (no re-execution: set it so to keep a tool that wraps the process, heaptrack's
 *    preload or valgrind, on the gateway). If the re-execution fails the gateway says so and
 *    runs with the cache on: more memory, nothing else different.
 */
#ifndef CAIRN_MALLOC_TUNE_H
#define CAIRN_MALLOC_TUNE_H

/* argv as cmd_serve gets it (argv[0] = "serve"). Returns only when this process is to go on. */
void malloc_tune_exec(int argc, char **argv);

/* One malloc arena for every thread; must run before any thread starts. */
void malloc_tune_process(void);

#endif
