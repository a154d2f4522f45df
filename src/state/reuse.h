/* reuse.h — the one reuse layer: how much of a slot's state a new prompt can keep, and the
 * prefill that takes checkpoints on the way. Written once for every family; it sees only
 * states, records and snapshots (no family name appears in reuse.c).
 *
 * THE DECISION (reuse_design.md §2). For prompt P (n ids) and the slot's record R:
 *   u = min(lcp(R, P), n - 1)             at least one prompt token is fed: its logits start generation
 *   u == |R|              -> EXTEND       keep everything, feed P[u..n)
 *   state can truncate u  -> TRUNCATE     drop positions >= u
 *   a checkpoint fits     -> CHECKPOINT   restore the deepest one that is a prefix of P
 *   otherwise             -> RESET        reuse 0
 * With kv-share on, a longer prefix held by ANOTHER slot (its whole record, or a truncatable
 * prefix of it) or by a checkpoint with rows made by any slot is copied in instead (COPY /
 * CHECKPOINT). Every path leaves s holding exactly P[0..reused) and usable, or reset.
 *
 * CHECKPOINTS. reuse_prefill feeds the unfed part of P in chunks and checkpoints at
 * template-aware points: the end of the system prompt (taken with rows, so other slots and
 * conversations can start from it), the position of every role-marker token (a turn boundary),
 * and n - 1 (an identical re-ask or a re-rendered last answer diverges no earlier). Only the
 * system point splits the prefill (its snapshot needs the rows as they are at that point); the
 * others are light and are captured inside a forward call (state_capture_arm / take, state.h),
 * so they cost no extra forward call, i.e. no extra pass over the weights. A light checkpoint
 * is restorable while its slot's record still holds its ids, which is exactly the regenerate /
 * edit-last-message case.
 * A snapshot that cannot be allocated is skipped: a failed optimisation, never a failed request.
 */
#ifndef CAIRN_REUSE_H
#define CAIRN_REUSE_H

#include "state.h"
#include "store.h"

typedef enum { REUSE_RESET, REUSE_EXTEND, REUSE_TRUNCATE, REUSE_CHECKPOINT, REUSE_COPY } reuse_kind;

typedef struct {
    reuse_kind kind;
    int reused;          /* s->len afterwards: the prompt tokens not fed again */
} reuse_result;

/* Prepare s (slot `slot`) for prompt ids[0..n), n >= 1. cs may be NULL (no checkpoints).
 * donors: the other slots' states, consulted only when kv_share is set. */
reuse_result reuse_prepare(state *s, int slot, store *cs, int kv_share, state *const *donors, int ndonors,
                           const int *ids, int n);
const char *reuse_kind_name(reuse_kind k);

/* How the prefill grows the state without knowing what computes it (state/ depends on nothing
 * above it): feed(user, ids, n, logits, ...) must append ids[0..n) at st->len, record them and
 * write the last token's logits when logits != NULL, or return -1 with st tainted and err set.
 * The model layer supplies seq_feed behind it (models/model.h seq_feeder). */
typedef int (*reuse_feed_fn)(void *user, const int *ids, int n, float *logits, char *err, size_t errlen);

typedef struct {
    state *st;
    reuse_feed_fn feed;
    void *user;
    int chunk;           /* tokens per feed call */
} reuse_feeder;

typedef struct {
    reuse_feeder f;
    store *cs;           /* NULL: no checkpoints */
    int slot;
    const int *ids;      /* the whole prompt; positions < f.st->len are already in the state */
    int n;
    int *points;         /* checkpoint positions, ascending */
    int npoints;
    int next;            /* first point not handled yet */
    int armed;           /* points [next, armed) were offered to captures for the feed under way */
    int rows_point;      /* the point snapshotted with rows (system prompt end), -1 if none */
    int taken;           /* checkpoints stored by this prefill (for tests and logs) */
} reuse_prefill;

/* sys_end: token position where the system prompt ends (0: unknown, then the first marker is
 * used); markers: role-marker token ids (turn boundaries). */
void reuse_prefill_init(reuse_prefill *p, reuse_feeder f, store *cs, int slot, const int *ids, int n, int sys_end,
                        const int *markers, int nmarkers);
/* Snapshot with rows if the state sits at the system point, then feed at most one chunk (never
 * past the system point), capturing the light points inside it. Returns 1 while prompt
 * tokens remain, 0 once all are fed (then logits holds the last token's logits), -1 on a
 * forward failure (the state is tainted, err says why). */
int reuse_prefill_step(reuse_prefill *p, float *logits, char *err, size_t errlen);
/* reuse_prefill_step in two halves, for a caller that feeds the chunk inside a larger forward
 * call of its own (the engine's joint step: decode tokens and prefill chunks in one call).
 * reuse_prefill_next does everything before the feed — the rows snapshot at the system point,
 * then the next chunk of at most max >= 1 tokens (never past the system point) with its light
 * points armed — and returns its length k >= 1, *ids its first id. The caller must then feed
 * exactly ids[0..k) at st->len (the last token's logits are the first generated token's when
 * st->len + k == n) and, once that feed succeeded, call reuse_prefill_fed, which stores the
 * captured points and returns what reuse_prefill_step does (1 while tokens remain, 0 when all
 * are fed). A failed feed is followed by reuse_prefill_free, never by reuse_prefill_fed. */
int reuse_prefill_next(reuse_prefill *p, int max, const int **ids);
int reuse_prefill_fed(reuse_prefill *p);
/* Also disarms captures a failed feed left armed. */
void reuse_prefill_free(reuse_prefill *p);

#endif
