/* reuse.c — the reuse decision and the checkpointing prefill (see reuse.h). */
#include "reuse.h"

#include <stdlib.h>
#include <string.h>

#include "../core/util.h"

const char *reuse_kind_name(reuse_kind k) {
    static const char *names[] = {"reset", "extend", "truncate", "checkpoint", "copy"};
    return k >= REUSE_RESET && k <= REUSE_COPY ? names[k] : "?";
}

/* ---- the decision ----------------------------------------------------------------------- */

/* Steps 2-5 of the decision on the slot's own state and its own checkpoints. */
static reuse_result own_prefix(state *s, int slot, store *cs, int kv_share, const int *ids, int n) {
    int u = MIN(state_common_prefix(s, ids, n), n - 1);
    if (state_usable(s) && u > 0 && u == s->len) return (reuse_result){REUSE_EXTEND, u};
    if (u > 0 && state_can_truncate(s, u) && state_truncate(s, u) == STATE_OK) return (reuse_result){REUSE_TRUNCATE, u};
    int got = cs ? store_restore(cs, s, ids, n - 1, 0, kv_share ? -1 : slot) : -1;
    if (got > 0) return (reuse_result){REUSE_CHECKPOINT, got};
    state_reset(s);
    return (reuse_result){REUSE_RESET, 0};
}

/* How much of P another slot's state can give: its whole record if that is a prefix of P,
 * else a prefix it could truncate to (checked on the donor, applied to the copy). */
static int donor_offer(const state *d, const int *ids, int n) {
    int u = MIN(state_common_prefix(d, ids, n), n - 1);
    if (u == d->len || state_can_truncate(d, u)) return u;
    return 0;
}

/* Copy the donor's first u positions into s: full snapshot there, restore here, truncate the copy.
 * Returns 0, or -1 with s unchanged (allocation failure). */
static int copy_from(state *s, const state *d, int u) {
    snapshot *snap = state_snapshot(d, 1);
    if (!snap) return -1;
    int rc = state_restore(s, snap);
    snapshot_free(snap);
    if (rc != STATE_OK) return -1;
    if (s->len > u) state_truncate(s, u);    /* donor_offer checked this is allowed */
    return 0;
}

reuse_result reuse_prepare(state *s, int slot, store *cs, int kv_share, state *const *donors, int ndonors,
                           const int *ids, int n) {
    reuse_result r = own_prefix(s, slot, cs, kv_share, ids, n);
    if (!kv_share) return r;
    int best = -1, offer = r.reused;
    for (int i = 0; i < ndonors; i++) {
        if (donors[i] == s) continue;
        int o = donor_offer(donors[i], ids, n);
        if (o > offer) { offer = o; best = i; }
    }
    /* A checkpoint with rows deeper than both beats copying a slot. */
    int got = cs ? store_restore(cs, s, ids, n - 1, offer, -1) : -1;
    if (got > 0) return (reuse_result){REUSE_CHECKPOINT, got};
    if (best >= 0 && copy_from(s, donors[best], offer) == 0) return (reuse_result){REUSE_COPY, offer};
    return r;
}

/* ---- the checkpointing prefill ---------------------------------------------------------- */

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

static int is_marker(int id, const int *markers, int nmarkers) {
    for (int i = 0; i < nmarkers; i++)
        if (markers[i] == id) return 1;
    return 0;
}

/* Every light checkpoint costs a snapshot's worth of store memory, so a turn-boundary point only a
 * few tokens past the previous point is moved back onto it: the checkpoint then covers a few
 * tokens less, which a restore re-prefills for less than a second snapshot costs. The n - 1 and
 * system-prompt points stay exact: a re-ask and the gateway hint must hit in full. */
enum { POINT_MIN_GAP = 4 };

static int add_point(reuse_prefill *p, int pos, int prev) {
    if (pos - prev < POINT_MIN_GAP) pos = prev;
    if (pos > 0) p->points[p->npoints++] = pos;
    return pos;
}

void reuse_prefill_init(reuse_prefill *p, reuse_feeder f, store *cs, int slot, const int *ids, int n, int sys_end,
                        const int *markers, int nmarkers) {
    memset(p, 0, sizeof *p);
    p->f = f, p->cs = cs, p->slot = slot, p->ids = ids, p->n = n;
    p->rows_point = -1;
    if (!cs) return;
    int from = f.st->len, prev = from;
    /* Light checkpoints only stand in for a truncation the state cannot do. */
    int light = !state_always_truncatable(f.st);
    p->points = xmalloc((size_t)(n + 2) * sizeof *p->points);
    for (int i = 1; i < n - 1; i++) {
        if (!is_marker(ids[i], markers, nmarkers)) continue;
        if (sys_end <= 0) sys_end = i;
        if (light && i >= from) prev = add_point(p, i, prev);
    }
    if (light && n - 1 > from) p->points[p->npoints++] = n - 1;
    /* a system prompt of one token (a BOS) is not worth a copy of its rows */
    if (sys_end > 1 && sys_end < n) {
        p->rows_point = sys_end;
        if (sys_end > from) p->points[p->npoints++] = sys_end;
    }
    qsort(p->points, (size_t)p->npoints, sizeof *p->points, cmp_int);
    int k = 0;
    for (int i = 0; i < p->npoints; i++)
        if (k == 0 || p->points[i] != p->points[k - 1]) p->points[k++] = p->points[i];
    p->npoints = k;
}

static void keep(reuse_prefill *p, snapshot *snap) {
    if (snap && store_put(p->cs, snap, p->slot)) p->taken++;
}

/* The rows point: the feed was split here, so the state sits at it; snapshot with rows. */
static void checkpoint_rows(reuse_prefill *p) {
    state *st = p->f.st;
    if (!state_usable(st) || store_has(p->cs, st->ids, st->len, 1)) return;
    keep(p, state_snapshot(st, 1));
}

/* Arm the light points among the next k positions; returns k, cut short before the first point
 * no capture slot is left for (it is then armed by the next feed). A point already stored or
 * whose capture cannot be allocated is passed over: no checkpoint, no harm. */
static int arm_points(reuse_prefill *p, int k) {
    state *st = p->f.st;
    int armed = 0;
    for (p->armed = p->next; p->armed < p->npoints && p->points[p->armed] < st->len + k; p->armed++) {
        int at = p->points[p->armed];
        if (armed == STATE_MAX_CAPTURES) return at - st->len;
        if (!store_has(p->cs, p->ids, at, 0) && state_capture_arm(st, at) == STATE_OK) armed++;
    }
    return k;
}

/* After a feed: every armed point now lies behind the record; store what was captured. */
static void take_points(reuse_prefill *p) {
    for (; p->next < p->armed; p->next++) keep(p, state_capture_take(p->f.st, p->points[p->next]));
}

int reuse_prefill_next(reuse_prefill *p, int max, const int **ids) {
    state *st = p->f.st;
    while (p->next < p->npoints && p->points[p->next] < st->len) p->next++;
    if (p->next < p->npoints && p->points[p->next] == st->len && st->len == p->rows_point) {
        checkpoint_rows(p);
        p->next++;
    }
    int stop = p->rows_point > st->len ? p->rows_point : p->n;
    int k = MIN(max, stop - st->len);
    if (p->cs) k = arm_points(p, k);
    *ids = p->ids + st->len;
    return k;
}

int reuse_prefill_fed(reuse_prefill *p) {
    take_points(p);
    if (p->f.st->len < p->n) return 1;
    if (p->cs) store_drop_stale(p->cs, p->slot, p->f.st);
    return 0;
}

int reuse_prefill_step(reuse_prefill *p, float *logits, char *err, size_t errlen) {
    const int *ids;
    int k = reuse_prefill_next(p, p->f.chunk > 0 ? p->f.chunk : 64, &ids);
    if (p->f.feed(p->f.user, ids, k, p->f.st->len + k == p->n ? logits : NULL, err, errlen)) return -1;
    return reuse_prefill_fed(p);
}

void reuse_prefill_free(reuse_prefill *p) {
    if (p->f.st) state_capture_disarm(p->f.st);
    free(p->points);
    p->points = NULL;
}
