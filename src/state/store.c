/* store.c — checkpoint store: a flat array scanned linearly. An engine keeps tens to a few
 * hundred checkpoints, and every scan is dwarfed by the prefill it saves, so no index. */
#include "store.h"

#include <stdlib.h>
#include <string.h>

#include "../core/util.h"

typedef struct {
    snapshot *snap;
    int owner;
    unsigned long used;   /* LRU tick of the last put or restore */
} entry;

struct store {
    entry *e;
    int n, cap;
    size_t bytes, budget;
    unsigned long tick;
};

store *store_new(size_t budget_bytes) {
    store *cs = xcalloc(1, sizeof *cs);
    cs->budget = budget_bytes;
    return cs;
}

void store_free(store *cs) {
    if (!cs) return;
    for (int i = 0; i < cs->n; i++) snapshot_free(cs->e[i].snap);
    free(cs->e);
    free(cs);
}

static int same_record(const snapshot *snap, const int *ids, int len) {
    return snapshot_len(snap) == len && memcmp(snapshot_ids(snap), ids, (size_t)len * sizeof *ids) == 0;
}

int store_has(const store *cs, const int *ids, int len, int with_rows) {
    for (int i = 0; i < cs->n; i++)
        if (snapshot_has_rows(cs->e[i].snap) == (with_rows != 0) && same_record(cs->e[i].snap, ids, len)) return 1;
    return 0;
}

static void drop(store *cs, int i) {
    cs->bytes -= snapshot_bytes(cs->e[i].snap);
    snapshot_free(cs->e[i].snap);
    cs->e[i] = cs->e[--cs->n];
}

static void evict_lru(store *cs) {
    int victim = 0;
    for (int i = 1; i < cs->n; i++)
        if (cs->e[i].used < cs->e[victim].used) victim = i;
    drop(cs, victim);
}

int store_put(store *cs, snapshot *snap, int owner) {
    size_t b = snapshot_bytes(snap);
    if (b > cs->budget || store_has(cs, snapshot_ids(snap), snapshot_len(snap), snapshot_has_rows(snap))) {
        snapshot_free(snap);
        return 0;
    }
    while (cs->n && cs->bytes + b > cs->budget) evict_lru(cs);
    if (cs->n == cs->cap) {
        /* failing to grow the table is a failed optimisation, not an error */
        int cap = cs->cap ? cs->cap * 2 : 16;
        entry *grown = realloc(cs->e, (size_t)cap * sizeof *grown);
        if (!grown) { snapshot_free(snap); return 0; }
        cs->e = grown;
        cs->cap = cap;
    }
    cs->e[cs->n++] = (entry){.snap = snap, .owner = owner, .used = ++cs->tick};
    cs->bytes += b;
    return 1;
}

static int is_prefix_of(const snapshot *snap, const int *ids, int u) {
    int len = snapshot_len(snap);
    return len <= u && memcmp(snapshot_ids(snap), ids, (size_t)len * sizeof *ids) == 0;
}

/* Candidates are tried deepest first; at equal depth a light one first (nothing to copy but the
 * ring and summaries). state_restore decides whether s can take it. */
static int better(const snapshot *a, const snapshot *b) {
    if (snapshot_len(a) != snapshot_len(b)) return snapshot_len(a) > snapshot_len(b);
    return !snapshot_has_rows(a) && snapshot_has_rows(b);
}

int store_restore(store *cs, state *s, const int *ids, int u, int min_len, int owner) {
    char *tried = calloc((size_t)cs->n + 1, 1);
    if (!tried) return -1;
    int got = -1;
    for (;;) {
        int best = -1;
        for (int i = 0; i < cs->n; i++)
            if (!tried[i] && (owner < 0 || cs->e[i].owner == owner) && snapshot_len(cs->e[i].snap) > min_len &&
                is_prefix_of(cs->e[i].snap, ids, u) && (best < 0 || better(cs->e[i].snap, cs->e[best].snap)))
                best = i;
        if (best < 0) break;
        tried[best] = 1;
        if (state_restore(s, cs->e[best].snap) == STATE_OK) {
            cs->e[best].used = ++cs->tick;
            got = snapshot_len(cs->e[best].snap);
            break;
        }
    }
    free(tried);
    return got;
}

static int record_holds(const state *s, const snapshot *snap) {
    int len = snapshot_len(snap);
    return state_usable(s) && s->len >= len && memcmp(s->ids, snapshot_ids(snap), (size_t)len * sizeof(int)) == 0;
}

void store_drop_stale(store *cs, int owner, const state *s) {
    for (int i = cs->n - 1; i >= 0; i--)
        if (cs->e[i].owner == owner && !snapshot_has_rows(cs->e[i].snap) && !record_holds(s, cs->e[i].snap)) drop(cs, i);
}

int store_owned(const store *cs, int owner, const state *s, const snapshot **out, int max) {
    int n = 0;
    for (int i = 0; i < cs->n; i++) {
        const snapshot *snap = cs->e[i].snap;
        if (cs->e[i].owner != owner || snapshot_has_rows(snap) || !record_holds(s, snap)) continue;
        /* insertion into out, deepest first, keeping the max deepest */
        int at = n < max ? n++ : max;
        while (at > 0 && snapshot_len(out[at - 1]) < snapshot_len(snap)) {
            if (at < max) out[at] = out[at - 1];
            at--;
        }
        if (at < max) out[at] = snap;
    }
    return n;
}

size_t store_bytes(const store *cs) { return cs->bytes; }
int store_count(const store *cs) { return cs->n; }
