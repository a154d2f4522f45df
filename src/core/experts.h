/* experts.h — the routed experts of a model and the one way a MoE layer reaches them: straight
 * from the checkpoint's mapping (the default), or through an expert cache that reads them with
 * pread into a memory budget, for checkpoints larger than RAM (`--expert-cache-mb N`).
 *
 * Every family registers each routed expert of each layer at load (experts_add: its matrices,
 * views into the mapping) and runs a layer's experts through experts_run, which groups the
 * layer's (token, rank) slots by expert and calls back once per chosen expert, in ascending
 * expert order, with the slots in ascending order and the expert's matrices. Dense weights are
 * not this module's business: they stay mmapped.
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
 * THREADS: one forward call at a time per model (model.h); the callback may use the pool.
 */
#ifndef CAIRN_EXPERTS_H
#define CAIRN_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

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

/* Called once per chosen expert e with its matrices w[nm] and the cnt slots s (ascending, each an
 * index into the idx array given to experts_run) that chose it. */
typedef void (*expert_fn)(void *ctx, int e, const qmat *w, const int *slots, int cnt);
/* idx[nk]: the expert of each (token, rank) slot of one layer call. */
void experts_run(experts *x, int layer, const int *idx, int nk, expert_fn fn, void *ctx);

/* What a callback does around its expert: out[r] = x[slots[r] / k] (rows of dim floats: the token of
 * each slot, k slots per token), and ex[slots[r]] = y[r] (each result to its slot's row). */
void experts_gather(const float *x, int dim, int k, const int *slots, int cnt, float *out);
void experts_scatter(const float *y, int dim, const int *slots, int cnt, float *ex);

void experts_get_stats(const experts *x, experts_stats *out);
/* One line "expert-cache: budget_mb=... hits=... ..." for stderr reports. */
void experts_stats_line(const experts *x, char *buf, size_t len);

#endif
