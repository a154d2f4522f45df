/* state.h — one sequence state for every model family: its parts, its record, and the
 * operations reuse needs (extend, reset, truncate, snapshot, restore), written once.
 *
 * THE IDEA. A family describes the state it keeps between forward calls as PARTS, each a flat
 * buffer of one kind (reuse_design.md §1):
 *   ROWS  — one self-contained row per `span` positions, addressed absolutely: row i is a fixed
 *           function of the tokens before (i+1)*span. MLA latent/rope rows (span 1), GQA K/V
 *           rows, DeepSeek V4 compressed lists (span = compress ratio). Truncatable.
 *   RING  — `rows` slots reused modulo the window: slot = pos % rows (DSV4 window KV).
 *           Truncatable only while nothing has been overwritten (len <= rows).
 *   RECUR — a running summary of every token so far (compressor/indexer partials, linear-attention
 *           matrices, short-conv windows). Never truncatable. Reset fills it with `fill`.
 * The family allocates nothing itself: state_add_part() returns the buffer, and the family's
 * forward pass reads and writes it. Everything else below is generic memcpy over the parts, so
 * no family file contains reuse logic.
 *
 * THE RECORD. ids[0..len) are exactly the token ids the state was built from, at absolute
 * positions 0..len-1, appended (state_record) as each chunk enters the state — never inferred
 * from the tensors or from caller arithmetic. The last sampled token is never fed, so never
 * recorded. Rows beyond the record are garbage and are never read: the family derives how many
 * rows are valid from the position it is fed at.
 *
 * TAINT. Any failure after the state started changing (error, cancel mid-prefill, NaN, input
 * that ids cannot describe) marks the state tainted; state_usable() is then 0 and the next
 * request resets. Failing to allocate record/snapshot memory disables reuse, never a request.
 *
 * INVARIANTS
 *  - state_truncate / state_restore either succeed completely or change nothing.
 *  - A snapshot carries the record and every part needed to continue bit-identically. A
 *    snapshot taken without ROWS parts ("light") restores only into a state whose record still
 *    holds the snapshot's ids (its rows are then the same bytes), which state_restore checks.
 *
 * CAPTURES. A light snapshot at a position p strictly inside a forward call, without splitting
 * the call there (a split costs the family one more pass over its weights). The caller arms p
 * before feeding; the family calls state_capture(s, part, pos) immediately before the FIRST
 * write position pos makes to a RING or RECUR part (and after every write of earlier positions),
 * which copies that part into each capture armed at pos; the caller then takes the finished
 * snapshot. It is byte-identical to state_snapshot(s, 0) after feeding exactly p tokens. A part
 * the family never hooked leaves the capture incomplete, so take gives NULL: a missed
 * checkpoint, never a wrong one. Reset, truncate and restore disarm every capture.
 *
 * REWINDS. A state that cannot truncate (a ring that wrapped, a RECUR summary) can still give
 * back up to n positions of its NEXT feed: state_rewind_arm(s, n) arms a capture at each of
 * len+1 .. len+m before that feed (m <= n, what could be armed; no capture at all when the state
 * always truncates), and state_rewind(s, p) after it truncates to p or restores the capture at p,
 * either way leaving exactly the state of feeding the first p ids alone (speculative decoding:
 * verified drafts that are rejected never stay in the state). The same works for every part kind
 * and every family that hooks its captures, so no family carries rewind logic.
 */
#ifndef CAIRN_STATE_H
#define CAIRN_STATE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { PART_ROWS, PART_RING, PART_RECUR } part_kind;

typedef struct {
    part_kind kind;
    char name[48];          /* for messages and persistence checks, e.g. "L3.window" */
    size_t row_bytes;       /* ROWS/RING: bytes per row or slot; RECUR: total bytes */
    int rows;               /* ROWS: capacity; RING: window; RECUR: 1 */
    int span;               /* ROWS: positions per row (1, or a compression ratio) */
    float fill;             /* RECUR reset value for every float (0, or -INFINITY for score states) */
    unsigned char *buf;
} state_part;

typedef struct snapshot snapshot;

#define STATE_MAX_CAPTURES 8

/* One armed capture: the light snapshot being filled and which non-ROWS parts it still lacks. */
typedef struct {
    int pos;
    int missing;            /* non-ROWS parts not copied yet */
    unsigned char *done;    /* [nparts] 1 once part i is in snap (ROWS parts start at 1) */
    snapshot *snap;
} state_capture_slot;

typedef struct {
    int *ids;               /* record */
    int len, cap;           /* cap = context capacity in positions */
    int tainted;
    int record_ok;          /* 0 after a record allocation failure: reuse disabled */
    state_part *parts;
    int nparts;
    state_capture_slot captures[STATE_MAX_CAPTURES];
    int ncaptures;          /* armed captures; 0 makes state_capture a single test */
    int rewind_base, rewind_n;   /* state_rewind_arm armed captures at rewind_base + 1 .. + rewind_n */
} state;

enum { STATE_OK = 0, STATE_EUNSUPPORTED = -2, STATE_ENOMEM = -3, STATE_EMISMATCH = -4 };

/* Set up an empty state for a context of `cap` positions. Returns STATE_ENOMEM if the record
 * cannot be allocated (the state still works; reuse is disabled). */
int state_init(state *s, int cap);
void state_deinit(state *s);

/* Declare a part; returns its buffer (zeroed, or filled for RECUR), NULL on allocation failure. */
void *state_add_part(state *s, part_kind kind, const char *name, size_t row_bytes, int rows, int span,
                     float fill);

/* Forget everything: record emptied, taint cleared, RECUR parts refilled. Never fails. */
void state_reset(state *s);

/* Append ids fed at absolute positions pos0..pos0+n-1 (pos0 must equal len, else the record is
 * dropped and the state tainted). */
void state_record(state *s, const int *ids, int pos0, int n);
void state_taint(state *s);
int state_usable(const state *s);        /* record_ok && !tainted */

/* Common prefix length of the record and ids[0..n). 0 if the state is not usable. */
int state_common_prefix(const state *s, const int *ids, int n);

/* Can every part drop positions >= p (p <= len)? */
int state_can_truncate(const state *s, int p);
/* Can this state truncate to any p <= len whatever len is (only ROWS parts, and rings as long as
 * the context)? Such a state needs no light checkpoints: truncation does their work for free. */
int state_always_truncatable(const state *s);
/* Drop positions >= p. STATE_EUNSUPPORTED (and nothing changes) if some part cannot. */
int state_truncate(state *s, int p);

/* ---- snapshots: one contiguous byte blob, suitable for memory stores and files ---------- */
/* with_rows = 0 makes a light snapshot (RING and RECUR parts only). NULL on allocation failure. */
snapshot *state_snapshot(const state *s, int with_rows);
/* Restore s to the snapshot. Light snapshots require s's record to hold snap's ids.
 * STATE_EMISMATCH if the part layout differs (another model/shape) or a light snapshot does not
 * fit; nothing changes then. */
int state_restore(state *s, const snapshot *snap);
void snapshot_free(snapshot *snap);

/* Arm a light capture at position p (p >= len; at most STATE_MAX_CAPTURES at once). Returns
 * STATE_OK (also when p is already armed), STATE_EUNSUPPORTED (p behind the record, no slot
 * free, state unusable) or STATE_ENOMEM; a capture that could not be armed is simply not taken. */
int state_capture_arm(state *s, int p);
/* The family's hook: call before the first write position pos makes to RING/RECUR part `part`. */
void state_capture(state *s, int part, int pos);
/* The first armed capture position after pos, INT_MAX if none: a family that writes several
 * positions in one step (one job per head over a stretch of tokens) ends the stretch there. */
int state_capture_next(const state *s, int pos);
/* Disarm p and return its finished light snapshot (caller frees), or NULL if the feed did not
 * reach p, a part was never captured, or the state is not usable. When len == p, parts not yet
 * captured are copied from the state as it is now (it is the state at p). */
snapshot *state_capture_take(state *s, int p);
/* Disarm every capture (e.g. after a failed feed). */
void state_capture_disarm(state *s);
/* Make the next feed rewindable by up to n positions (see REWINDS); drops the captures of an
 * earlier arm that was never rewound. Returns m <= n: the positions len+1 .. len+m, and len + m +
 * 1 .. after them only if the state always truncates, are the ones state_rewind can return to. */
int state_rewind_arm(state *s, int n);
/* After the feed: keep positions < p (p in [base + 1, len], or any p the parts can truncate to)
 * and drop the other rewind captures. p == len only drops them. STATE_EUNSUPPORTED (nothing
 * changed but the captures) if neither a truncation nor an armed capture can give p. */
int state_rewind(state *s, int p);
int snapshot_len(const snapshot *snap);                 /* positions it covers */
const int *snapshot_ids(const snapshot *snap);
int snapshot_has_rows(const snapshot *snap);
size_t snapshot_bytes(const snapshot *snap);           /* memory it holds */

/* Persistence: versioned header (magic, version, model fingerprint, layout hash, record length,
 * payload checksum); the length is written last so a torn write reads as absent.
 * snapshot_read returns NULL with a reason in err for a truncated, foreign or corrupt file. */
int snapshot_write(const snapshot *snap, uint64_t model_fingerprint, FILE *f, char *err, size_t errlen);
snapshot *snapshot_read(FILE *f, uint64_t model_fingerprint, char *err, size_t errlen);

/* A hash naming the shape of every part (kind, name, row bytes, rows, span): two states with
 * the same hash lay out the same bytes. Persisted files carry it to refuse another shape. */
uint64_t state_layout_hash(const state *s);

/* Bytes of state per position (ROWS parts) and fixed bytes (RING + RECUR), for reports. */
size_t state_bytes_per_token(const state *s);
size_t state_fixed_bytes(const state *s);

#endif
