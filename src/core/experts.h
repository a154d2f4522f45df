/* experts.h — the routed experts of a model and the one way a MoE layer reaches them: straight
 * from the checkpoint's mapping (the default), or through an expert cache that reads them with
 * pread into a memory budget, for checkpoints larger than RAM (`--expert-cache-mb N`), and on
 * the MPI rank that owns them when the model runs across processes (core/cluster.h).
 *
 * Every family registers each routed expert of each layer at load (experts_add: its matrices,
 * views into the mapping) and binds the one function that runs an expert (experts_bind: gathered
 * input rows in, output rows out, the model as its only context). A MoE layer hands experts_run
 * its routing (the expert of each (token, rank) slot) and where the rows are (experts_io):
 * experts_run groups the slots by expert, gathers each chosen expert's input rows, runs it once
 * over them, and scatters its output rows to their slots. The layer then sums the slots in its
 * own fixed order, so a token's result never depends on grouping, caching, which thread or which
 * process ran an expert. Dense weights are not this module's business.
 *
 * HOW A CALL USES THE POOL (core/threads.h): split by work, an expert's work being its rows
 * (every expert of a layer has the same weight bytes).
 *  - An expert with more rows than a thread's share of the call's (rows x threads > the call's
 *    rows) runs alone across the pool through its kernel calls, one after another ascending.
 *  - The others, when there are at least two, mapped experts and a pool, spread over the pool:
 *    one pool job, one task per expert, most rows first (so the pool's claims hand out the big
 *    ones first and the small ones even out the end), each run whole on one thread with that
 *    thread's scratch (pool_worker). The call pays one pool synchronisation instead of one per
 *    matrix product of every expert (a 4-conversation DeepSeek V4 decode step chooses ~21
 *    experts a layer, a 256-token prefill pass all 64), and an expert's gathered rows, inner
 *    rows and output stay in one core's cache. The expert function's own kernel calls run
 *    serially inside the task over the same row split, so the bits are the same as run across
 *    the pool (kernels.h).
 *  - Otherwise (one expert, the cache, one thread, the serving ranks) experts run one after
 *    another in ascending order, each across the pool through its kernel calls.
 *
 * EXPERT PARALLELISM (cluster_size() > 1, build/mpi/cairn under mpirun):
 *  - Expert e of every layer belongs to rank e % cluster_size(); rank 0 runs everything else.
 *  - Rank 0's experts_run sends each other rank, in one message, the layer, the (expert, rows)
 *    list of its chosen experts, their gathered input rows and route weights; runs its own
 *    experts meanwhile; then receives one output row per (slot, expert) and scatters it, exactly
 *    where its own run would have put it. An expert's rows reach its owner in the same order and
 *    number as on one process, and the kernels are bitwise deterministic (kernels.h), so output
 *    is bit-identical to a single process.
 *  - Every other rank runs experts_serve: it answers each request with the same expert function
 *    over its own registry (mapped or cached) until rank 0 stops the cluster.
 *
 * THE CACHE (experts_cache):
 *  - An expert is read with as few preads as its layout allows: its matrices' codes and scales
 *    are sorted by file offset and pieces closer than EXPERTS_MERGE_GAP merged, so an expert
 *    whose tensors are adjacent in its shard (DeepSeek V4, GLM-5, Kimi K3) is one read; a
 *    stacked layout (Inkling's [E, 2I, D] + [E, D, I]) is one read per stacked tensor. The page
 *    cache copy is dropped after the read (POSIX_FADV_DONTNEED), so the budget is the memory.
 *  - Resident experts live in an LRU within the budget. Pinned experts (the most used ones by the
 *    usage counts saved at the last close, at most half the budget) are read at configure time
 *    and never evicted. Counts are saved with the checkpoint's fingerprint at experts_free (the
 *    engine keeps them beside --kv-dir); a file of another checkpoint is ignored.
 *  - Read-ahead: a reader thread reads a layer's missing experts in the order the layer will use
 *    them while the layer computes the ones already resident, then the experts the next layer
 *    used at its previous call (its likely choice: consecutive tokens share experts). A
 *    read-ahead that would evict an expert the current call still needs is dropped instead.
 *  - Each buffer keeps its file offset's alignment mod 64, so a kernel sees the same addresses mod
 *    64 as on the mapping: the output is bit-identical to mmap, whatever the budget.
 *  - A failed read (I/O error, short file) falls back to the mapping for that call and is counted.
 *
 * THREADS: one forward call at a time per model (model.h); the expert function may use the pool.
 */
#ifndef CAIRN_EXPERTS_H
#define CAIRN_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "kernels.h"
#include "safetensors.h"

#define EXPERT_MATS 3             /* matrices of one expert: gate, up, down (or fused gate+up, down) */
#define EXPERTS_MERGE_GAP 4096    /* pieces of one expert closer than this are read as one span */

typedef struct experts experts;

typedef struct {
    uint64_t uses;               /* experts run (one per chosen expert per layer call) */
    uint64_t hits;               /* ... resident when the call began */
    uint64_t pinned_hits;        /* ... of those, pinned */
    uint64_t predicted_hits;     /* ... resident because the previous layer's call predicted and read them */
    uint64_t misses;             /* ... read during their own call */
    uint64_t waits;              /* ... of those, the compute waited for the reader thread */
    uint64_t reader_reads;       /* experts the reader thread read (read-ahead and prediction) */
    uint64_t predicted;          /* next-layer experts queued by prediction */
    uint64_t predicted_reads;    /* ... of those, read before the next call began */
    uint64_t dropped;            /* read-aheads dropped: no room without evicting what the call needs */
    uint64_t evictions, pinned, reads, bytes_read, read_errors;
    size_t budget, resident;     /* bytes */
    /* expert parallelism, rank 0: experts and rows sent to other ranks, bytes each way, messages */
    uint64_t remote_experts, remote_rows, bytes_sent, bytes_received, messages;
    /* expert parallelism, other ranks: requests answered, experts and rows run for rank 0 */
    uint64_t served_requests, served_experts, served_rows;
    /* every mode: experts_run calls, and the distinct experts they chose */
    uint64_t layer_calls, chosen;
    /* ... of those calls, the ones whose experts ran one per pool task, and their experts */
    uint64_t spread_calls, spread_experts;
    /* ... and their wall seconds (rank 0: its own experts and the wait for the other ranks') */
    double seconds;
} experts_stats;

experts *experts_new(const st_file *st);
/* Saves the usage counts when configured with a path, stops the reader, frees every buffer. */
void experts_free(experts *x);
/* Register routed expert e of layer `layer`: nm <= EXPERT_MATS matrices viewing st's mapping. */
int experts_add(experts *x, int layer, int e, const qmat *mats, int nm, char *err, size_t errlen);
int experts_count(const experts *x);          /* registered experts, all layers */

/* Switch to the expert cache with a budget of `budget` bytes; usage_path (NULL: none) keeps the
 * usage counts across runs. The budget must hold two of the largest expert (one computing, one
 * being read). Call once, after every experts_add and before the first forward. */
int experts_cache(experts *x, size_t budget, const char *usage_path, uint64_t fingerprint, char *err, size_t errlen);
int experts_cached(const experts *x);

/* One chosen expert's work: out[r] (dout floats) from in[r] (din floats) for its cnt rows;
 * weight[r] is the route weight of row r's slot (NULL when the layer gave none). Scratch comes
 * from sc. It may depend on nothing but its arguments and ctx (the model), and must not write
 * ctx: the rank that owns the expert runs the same function on the same rows, and a spread call
 * runs several experts at once on different threads. */
typedef void (*expert_fn)(void *ctx, int layer, int e, const qmat *w, const float *in, const float *weight, int cnt,
                          float *out, arena *sc);
/* The most scratch expert_fn takes from sc for cnt rows of layer. */
typedef size_t (*expert_scratch_fn)(void *ctx, int layer, int cnt);
/* The expert function of every registered expert (before the first experts_run / experts_serve). */
void experts_bind(experts *x, expert_fn fn, expert_scratch_fn scratch, void *ctx);

/* Where one layer call's rows are: slot s (token s / k, rank s % k) reads row s / k of x and
 * weight[s] (weight NULL: none), and its expert's output row lands at out[(s / k) * out_k + s % k]
 * (out_k >= k leaves room for rows the layer adds itself, such as shared experts). */
typedef struct {
    const float *x;
    int din, k;
    const float *weight;
    float *out;
    int dout, out_k;
} experts_io;

/* idx[nk]: the expert of each (token, rank) slot of one layer call; slots naming no registered
 * expert are skipped. */
void experts_run(experts *x, int layer, const int *idx, int nk, const experts_io *io);

/* Ranks other than 0: answer rank 0's expert requests until it stops the cluster. -1 with err if
 * a request names an expert this registry does not hold (rank 0 and this rank opened different
 * checkpoints). */
int experts_serve(experts *x, char *err, size_t errlen);

void experts_get_stats(const experts *x, experts_stats *out);
/* One line "expert-cache: budget_mb=... hits=... ..." for stderr reports. */
void experts_stats_line(const experts *x, char *buf, size_t len);
/* One line "expert-parallel: ranks=... remote_experts=... bytes_sent=..." (rank 0) or
 * "expert-parallel: rank=... served_experts=..." (other ranks) for stderr reports. */
void experts_parallel_line(const experts *x, char *buf, size_t len);

#endif
