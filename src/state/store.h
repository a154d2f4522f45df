/* store.h — the checkpoint store: snapshots of sequence states, keyed by the record they carry,
 * kept in a memory budget and evicted least recently used first.
 *
 * One store serves every slot of an engine (reuse_design.md §4-5). A checkpoint is only ever
 * restored through state_restore, which refuses anything that does not fit, so a stale or
 * foreign entry can cost a lookup but never correctness.
 *
 * INVARIANTS
 *  - store_bytes() <= the budget after every call; a snapshot larger than the whole budget is
 *    freed on store_put, never kept.
 *  - At most one entry per (record, with_rows): a second put of the same one replaces nothing
 *    and frees the newcomer.
 *  - Light checkpoints (no rows) remember the slot that made them: they are useful only while a
 *    state's record still holds their ids, so store_drop_stale drops them once their slot moved on.
 */
#ifndef CAIRN_STORE_H
#define CAIRN_STORE_H

#include <stddef.h>

#include "state.h"

typedef struct store store;

store *store_new(size_t budget_bytes);
void store_free(store *cs);

/* Is a checkpoint of exactly ids[0..len) kept (with rows, if with_rows)? Does not touch LRU order. */
int store_has(const store *cs, const int *ids, int len, int with_rows);
/* Take ownership of snap (made by slot `owner`). Returns 1 if kept, 0 if freed (duplicate, or
 * larger than the budget). Evicts least recently used entries to make room. */
int store_put(store *cs, snapshot *snap, int owner);
/* Restore into s the deepest checkpoint that is longer than min_len, whose record is a prefix of
 * ids[0..u), that was made by `owner` (-1: any slot) and that s accepts (state_restore).
 * Returns the restored length, or -1 with s unchanged. */
int store_restore(store *cs, state *s, const int *ids, int u, int min_len, int owner);
/* Drop owner's light checkpoints whose ids s's record no longer holds. */
void store_drop_stale(store *cs, int owner, const state *s);

/* The deepest (at most max) light checkpoints owner made whose ids s's record holds, deepest
 * first, into out (views: the store keeps them). Returns how many. */
int store_owned(const store *cs, int owner, const state *s, const snapshot **out, int max);

size_t store_bytes(const store *cs);
int store_count(const store *cs);

#endif
