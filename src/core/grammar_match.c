/* grammar_match.c — the pushdown matcher over a compiled grammar (grammar.h).
 *
 * A stack is a persistent linked list of parse positions, interned as nodes (pos, next) so equal
 * stacks are one id and tails are shared; node 0 is the empty stack (the sentence is complete).
 * Every stack in a state has a byte class on top (or is empty): the closure expands rule
 * references on top into the first position of each alternative and pops finished alternatives
 * (a reference in tail position pushes no continuation, so right recursion keeps stacks flat).
 * A state is the sorted set of its stack ids, interned too, with a lazily filled table of its
 * 256 byte transitions — after warm-up, matching a byte is one lookup. Bytes that advance exactly
 * the same stacks of a state lead to the same next state, so the bytes are grouped into those
 * classes when the table is made, and the first transition computed for a byte fills its whole
 * class: one closure per class instead of one per byte. (A token mask walks every byte of the
 * vocabulary's trie from states it has not seen — inside a bounded string each position is a new
 * state — so closures were most of a cache miss's cost.)
 *
 * A rebuild keeps the current state and drops the rest. It reuses every buffer (the two node
 * arrays swap, hash tables are cleared in place, dropped states' transition tables go to new
 * states), since a small cache limit rebuilds after nearly every byte: the fuzz target runs with
 * one, and allocating afresh each time was a large part of its time.
 */
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "grammar_int.h"
#include "util.h"

enum { UNKNOWN = -2, NODES_LIMIT = 1 << 20, STATES_LIMIT = 1 << 16, STACKS_MAX = 4096, CLOSURE_WORK_MAX = 1 << 18 };
enum { CLASSED_MAX = 64, TABLES_KEPT = 64 };
#define MASK_BYTES_LIMIT ((size_t)64 << 20)   /* cached token masks (16 KiB each at a 129k vocabulary) */

typedef struct {
    int pos, next;
} gnode;

typedef struct {
    int trans[256];               /* UNKNOWN until computed */
    unsigned char cls[256];       /* byte classes; unused past CLASSED_MAX stacks */
} gtable;

typedef struct {
    int off, n;                   /* stack ids in pool[off .. off + n) */
    int accepting, can_continue;
    gtable *tab;                  /* NULL until the first gm_next from the state */
    uint64_t *mask;
} gstate;

/* Open-addressing table of ids; keys live in the nodes/states themselves. */
typedef struct {
    int *slot;
    size_t cap;                   /* power of two; slots hold id + 1, 0 = empty */
    size_t alloc;                 /* slots allocated (>= cap), kept across resets */
} idtab;

struct gm {
    const grammar *g;
    gnode *nodes;
    int nnodes, capnodes;
    gnode *spare;                 /* a rebuild's other node array: rebuilds swap the two */
    int capspare;
    idtab node_tab;
    gstate *states;
    int nstates, capstates;
    idtab state_tab;
    int *pool;
    size_t npool, cappool;
    int cur;
    int rebuilds;
    size_t mask_bytes;            /* held by cached masks */
    int states_limit;
    int overflow;                 /* a closure went past STACKS_MAX / CLOSURE_WORK_MAX */
    long closures;
    long rebuild_copies;          /* nodes the last rebuild re-interned */
    /* closure scratch */
    int *work, nwork, capwork;
    int *out, nout, capout;
    unsigned *seen;               /* per node: closure stamp */
    unsigned stamp;
    int capseen;
    int *sorted, capsorted;       /* sort_ids scratch */
    int *fresh, capfresh;         /* rebuild scratch: old node id -> new */
    gtable *kept[TABLES_KEPT];    /* tables of dropped states, for new ones: with a small cache */
    int nkept;                    /* limit every byte drops a few and makes a few */
};

static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

/* Always inlined: clang -O1 (the fuzz build) left it a call, 8 % of the fuzzer's time. */
__attribute__((always_inline)) static inline void push(int **v, int *n, int *cap, int x) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *v = xrealloc(*v, (size_t)*cap * sizeof **v);
    }
    (*v)[(*n)++] = x;
}

/* Empty t at cap slots. The allocation is kept: with a small cache limit a rebuild follows
 * nearly every byte, and a fresh calloc each time was a good part of its cost. */
static void tab_init(idtab *t, size_t cap) {
    if (cap > t->alloc) {
        free(t->slot);
        t->alloc = cap;
        t->slot = xmalloc(cap * sizeof *t->slot);
    }
    t->cap = cap;
    memset(t->slot, 0, cap * sizeof *t->slot);
}

/* ---- nodes ------------------------------------------------------------------------------ */

static uint64_t node_hash(int pos, int next) { return mix(((uint64_t)(unsigned)pos << 32) | (unsigned)next); }

static void node_tab_grow(gm *m) {
    tab_init(&m->node_tab, m->node_tab.cap * 2);
    for (int id = 1; id < m->nnodes; id++) {
        size_t i = node_hash(m->nodes[id].pos, m->nodes[id].next) & (m->node_tab.cap - 1);
        while (m->node_tab.slot[i]) i = (i + 1) & (m->node_tab.cap - 1);
        m->node_tab.slot[i] = id + 1;
    }
}

static int node(gm *m, int pos, int next) {
    size_t mask = m->node_tab.cap - 1, i = node_hash(pos, next) & mask;
    for (; m->node_tab.slot[i]; i = (i + 1) & mask) {
        int id = m->node_tab.slot[i] - 1;
        if (m->nodes[id].pos == pos && m->nodes[id].next == next) return id;
    }
    if (m->nnodes == m->capnodes) {
        m->capnodes *= 2;
        m->nodes = xrealloc(m->nodes, (size_t)m->capnodes * sizeof *m->nodes);
    }
    int id = m->nnodes++;
    m->nodes[id] = (gnode){pos, next};
    m->node_tab.slot[i] = id + 1;
    if ((size_t)m->nnodes * 2 > m->node_tab.cap) node_tab_grow(m);
    return id;
}

/* ---- states ------------------------------------------------------------------------------ */

static uint64_t ids_hash(const int *ids, int n) {
    uint64_t h = (uint64_t)n;
    for (int i = 0; i < n; i++) h = (h ^ (unsigned)ids[i]) * 0x9e3779b97f4a7c15ULL;   /* byte-wise FNV was 8 % */
    return mix(h);
}

static void state_tab_insert(gm *m, int id) {
    const gstate *s = &m->states[id];
    size_t mask = m->state_tab.cap - 1, i = ids_hash(m->pool + s->off, s->n) & mask;
    while (m->state_tab.slot[i]) i = (i + 1) & mask;
    m->state_tab.slot[i] = id + 1;
}

/* The state for sorted unique stack ids[0..n) (n > 0). */
static int state(gm *m, const int *ids, int n) {
    size_t mask = m->state_tab.cap - 1, i = ids_hash(ids, n) & mask;
    for (; m->state_tab.slot[i]; i = (i + 1) & mask) {
        int id = m->state_tab.slot[i] - 1;
        const gstate *s = &m->states[id];
        if (s->n == n && !memcmp(m->pool + s->off, ids, (size_t)n * sizeof *ids)) return id;
    }
    if (m->nstates == m->capstates) {
        m->capstates *= 2;
        m->states = xrealloc(m->states, (size_t)m->capstates * sizeof *m->states);
    }
    if (m->npool + (size_t)n > m->cappool) {
        while (m->npool + (size_t)n > m->cappool) m->cappool *= 2;
        m->pool = xrealloc(m->pool, m->cappool * sizeof *m->pool);
    }
    int id = m->nstates++;
    gstate *s = &m->states[id];
    *s = (gstate){.off = (int)m->npool, .n = n};
    memcpy(m->pool + m->npool, ids, (size_t)n * sizeof *ids);
    m->npool += (size_t)n;
    s->accepting = ids[0] == 0;                 /* sorted: the empty stack comes first */
    s->can_continue = n > 1 || ids[0] != 0;
    m->state_tab.slot[i] = id + 1;
    if ((size_t)m->nstates * 2 > m->state_tab.cap) {
        tab_init(&m->state_tab, m->state_tab.cap * 2);
        for (int k = 0; k < m->nstates; k++) state_tab_insert(m, k);
    }
    return id;
}

/* ---- closure ------------------------------------------------------------------------------ */

/* Sort ids v[0..n) (distinct, non-negative) ascending: insertion for a few, else LSD radix over
 * the bytes the largest id uses, through m->sorted. qsort and its comparator calls were 40 % of a
 * native replay of the fuzz corpus, whose slow inputs make states of thousands of stacks. */
static void sort_ids(gm *m, int *v, int n) {
    if (n <= 32) {
        for (int i = 1; i < n; i++) {
            int x = v[i], j = i;
            for (; j > 0 && v[j - 1] > x; j--) v[j] = v[j - 1];
            v[j] = x;
        }
        return;
    }
    if (m->capsorted < n) {           /* doubling: successive closures tend to grow */
        m->capsorted = n > 2 * m->capsorted ? n : 2 * m->capsorted;
        free(m->sorted);
        m->sorted = xmalloc((size_t)m->capsorted * sizeof *m->sorted);
    }
    unsigned all = 0;
    for (int i = 0; i < n; i++) all |= (unsigned)v[i];
    int *from = v, *to = m->sorted;
    for (int shift = 0; shift < 32 && all >> shift; shift += 8) {
        int start[257] = {0};
        for (int i = 0; i < n; i++) start[((unsigned)from[i] >> shift & 255) + 1]++;
        for (int d = 0; d < 256; d++) start[d + 1] += start[d];
        for (int i = 0; i < n; i++) to[start[(unsigned)from[i] >> shift & 255]++] = from[i];
        int *t = from;
        from = to;
        to = t;
    }
    if (from != v) memcpy(v, from, (size_t)n * sizeof *v);
}

/* Expand the stacks in m->work until every one has a byte class on top (or is empty); the
 * result is interned as a state. GM_DEAD when nothing survives. */
static int closure(gm *m) {
    const grammar *g = m->g;
    m->closures++;
    m->nout = 0;
    if (++m->stamp == 0) {
        memset(m->seen, 0, (size_t)m->capseen * sizeof *m->seen);
        m->stamp = 1;
    }
    for (long work = 0; m->nwork; work++) {
        if (work > CLOSURE_WORK_MAX || m->nout > STACKS_MAX) {
            /* an ambiguous grammar (x++++ and the like) multiplies its parses: refuse, bounded */
            m->overflow = 1;
            m->nwork = 0;
            return GM_DEAD;
        }
        int id = m->work[--m->nwork];
        if (m->capseen < m->nnodes) {
            int old = m->capseen;
            m->capseen = m->capnodes;
            m->seen = xrealloc(m->seen, (size_t)m->capseen * sizeof *m->seen);
            memset(m->seen + old, 0, (size_t)(m->capseen - old) * sizeof *m->seen);
        }
        if (m->seen[id] == m->stamp) continue;
        m->seen[id] = m->stamp;
        if (id == 0) { push(&m->out, &m->nout, &m->capout, 0); continue; }
        int pos = m->nodes[id].pos, next = m->nodes[id].next;
        gsym s = g->sym[pos];
        if (s.kind == SYM_END) push(&m->work, &m->nwork, &m->capwork, next);
        else if (s.kind == SYM_BYTES) push(&m->out, &m->nout, &m->capout, id);
        else {
            int cont = g->sym[pos + 1].kind == SYM_END ? next : node(m, pos + 1, next);
            for (int a = 0; a < g->rule_nalt[s.arg]; a++)
                push(&m->work, &m->nwork, &m->capwork, node(m, g->alt_start[g->rule_alt[s.arg] + a], cont));
        }
    }
    if (!m->nout) return GM_DEAD;
    sort_ids(m, m->out, m->nout);
    return state(m, m->out, m->nout);
}

static int initial_state(gm *m) {
    const grammar *g = m->g;
    m->nwork = 0;
    for (int a = 0; a < g->rule_nalt[g->root]; a++)
        push(&m->work, &m->nwork, &m->capwork, node(m, g->alt_start[g->rule_alt[g->root] + a], 0));
    return closure(m);
}

/* ---- cache ------------------------------------------------------------------------------- */

/* Free a dropped state's mask; keep its table for a new state (up to TABLES_KEPT of them). */
static void state_drop(gm *m, gstate *s) {
    if (s->tab && m->nkept < TABLES_KEPT) m->kept[m->nkept++] = s->tab;
    else free(s->tab);
    free(s->mask);
}

static void cache_reset(gm *m) {
    for (int i = 0; i < m->nstates; i++) state_drop(m, &m->states[i]);
    m->nnodes = 1;                    /* node 0: the empty stack */
    m->nodes[0] = (gnode){-1, -1};
    m->nstates = 0;
    m->npool = 0;
    m->mask_bytes = 0;
    tab_init(&m->node_tab, 1024);
    tab_init(&m->state_tab, 256);
}

/* The id, in the rebuilt node table, of old stack `id`: re-interns the chain down to the first node
 * already re-interned, bottom up. Stacks share their tails, so each old node is copied once. */
static int reintern(gm *m, const gnode *old, int *fresh, int top) {
    m->nwork = 0;
    for (int id = top; fresh[id] < 0; id = old[id].next) push(&m->work, &m->nwork, &m->capwork, id);
    while (m->nwork) {
        int k = m->work[--m->nwork];
        fresh[k] = node(m, old[k].pos, fresh[old[k].next]);
        m->rebuild_copies++;
    }
    return fresh[top];
}

/* Drop every cached state and node except what the current state needs. The cost is the number
 * of distinct nodes the current state reaches, not the sum of its stacks' lengths: a state of
 * thousands of deep stacks over shared tails (a recursive rule inside a repetition) rebuilds in
 * the time it took to build. */
static void rebuild(gm *m) {
    const gstate *s = &m->states[m->cur];
    int n = s->n, nold = m->nnodes;
    if (m->capout < n) {              /* the stacks move to m->out: the pool is about to be emptied */
        m->capout = n;
        m->out = xrealloc(m->out, (size_t)n * sizeof *m->out);
    }
    int *ids = m->out;
    memcpy(ids, m->pool + s->off, (size_t)n * sizeof *ids);
    if (m->capfresh < nold) {
        m->capfresh = nold;
        m->fresh = xrealloc(m->fresh, (size_t)nold * sizeof *m->fresh);
    }
    memset(m->fresh, 0xff, (size_t)nold * sizeof *m->fresh);   /* -1: not re-interned yet */
    m->fresh[0] = 0;                  /* the empty stack stays node 0 */
    gnode *old = m->nodes;
    int capold = m->capnodes;
    m->nodes = m->spare;
    m->capnodes = m->capspare;
    m->spare = old;
    m->capspare = capold;
    cache_reset(m);
    m->rebuild_copies = 0;
    for (int i = 0; i < n; i++) ids[i] = reintern(m, old, m->fresh, ids[i]);
    sort_ids(m, ids, n);
    m->cur = state(m, ids, n);
    m->rebuilds++;
}

/* ---- API ---------------------------------------------------------------------------------- */

gm *gm_new(const grammar *g) {
    gm *m = xcalloc(1, sizeof *m);
    m->g = g;
    m->capnodes = m->capspare = 1024;
    m->nodes = xmalloc((size_t)m->capnodes * sizeof *m->nodes);
    m->spare = xmalloc((size_t)m->capspare * sizeof *m->spare);
    m->capstates = 256;
    m->states = xmalloc((size_t)m->capstates * sizeof *m->states);
    m->cappool = 1024;
    m->states_limit = STATES_LIMIT;
    m->pool = xmalloc(m->cappool * sizeof *m->pool);
    cache_reset(m);
    m->cur = initial_state(m);
    return m;
}

void gm_free(gm *m) {
    if (!m) return;
    for (int i = 0; i < m->nstates; i++) state_drop(m, &m->states[i]);
    for (int i = 0; i < m->nkept; i++) free(m->kept[i]);
    free(m->nodes);
    free(m->spare);
    free(m->node_tab.slot);
    free(m->states);
    free(m->state_tab.slot);
    free(m->pool);
    free(m->work);
    free(m->out);
    free(m->seen);
    free(m->sorted);
    free(m->fresh);
    free(m);
}

int gm_state(const gm *m) { return m->cur; }

/* Split every class of cls[0..n) that set cuts into its bytes inside set and those outside; the
 * new count. */
static int split(byteset *cls, int n, const byteset *set) {
    for (int c = 0, was = n; c < was; c++) {
        byteset in, out;
        uint64_t any_in = 0, any_out = 0;
        for (int w = 0; w < 4; w++) {
            in.w[w] = cls[c].w[w] & set->w[w];
            out.w[w] = cls[c].w[w] & ~set->w[w];
            any_in |= in.w[w];
            any_out |= out.w[w];
        }
        if (any_in && any_out) {
            cls[c] = in;
            cls[n++] = out;
        }
    }
    return n;
}

/* The transition table of state s, with its bytes grouped by the stacks they advance: starting
 * from one class of all 256 bytes, each stack's byte set splits the classes it cuts, 256-bit words
 * at a time (bounded to states of 64 stacks, so a table costs at most 64 passes over the classes). */
static void make_table(gm *m, gstate *st) {
    gtable *t = st->tab = m->nkept ? m->kept[--m->nkept] : xmalloc(sizeof *t);
    for (int i = 0; i < 256; i++) t->trans[i] = UNKNOWN;
    if (st->n > CLASSED_MAX) return;
    byteset cls[256] = {{{~0ULL, ~0ULL, ~0ULL, ~0ULL}}};
    int ncls = 1;
    for (int i = 0; i < st->n && ncls < 256; i++) {
        int id = m->pool[st->off + i];
        if (id) ncls = split(cls, ncls, &m->g->sets[m->g->sym[m->nodes[id].pos].arg]);
    }
    for (int c = 0; c < ncls; c++)
        for (int w = 0; w < 4; w++)
            for (uint64_t x = cls[c].w[w]; x; x &= x - 1) t->cls[64 * w + __builtin_ctzll(x)] = (unsigned char)c;
}

int gm_next(gm *m, int s, unsigned char b) {
    if (s < 0) return GM_DEAD;
    if (!m->states[s].tab) make_table(m, &m->states[s]);
    int t = m->states[s].tab->trans[b];
    if (t != UNKNOWN) return t;
    m->nwork = 0;
    for (int i = 0; i < m->states[s].n; i++) {
        int id = m->pool[m->states[s].off + i];
        if (!id) continue;
        int pos = m->nodes[id].pos;
        if (byteset_has(&m->g->sets[m->g->sym[pos].arg], b))
            push(&m->work, &m->nwork, &m->capwork, node(m, pos + 1, m->nodes[id].next));
    }
    t = m->nwork ? closure(m) : GM_DEAD;
    gstate *st = &m->states[s];       /* states[] may have moved: index again */
    gtable *tab = st->tab;
    if (st->n > CLASSED_MAX) tab->trans[b] = t;
    else
        for (int i = 0; i < 256; i++)
            if (tab->cls[i] == tab->cls[b]) tab->trans[i] = t;
    return t;
}

int gm_accepting(const gm *m, int s) { return s >= 0 && m->states[s].accepting; }
int gm_can_continue(const gm *m, int s) { return s >= 0 && m->states[s].can_continue; }

int gm_feed(gm *m, const void *bytes, size_t n) {
    const unsigned char *b = bytes;
    int s = m->cur;
    for (size_t i = 0; i < n && s >= 0; i++) s = gm_next(m, s, b[i]);
    if (s < 0) return -1;
    m->cur = s;
    if (m->nnodes > NODES_LIMIT || m->nstates > m->states_limit || m->mask_bytes > MASK_BYTES_LIMIT) rebuild(m);
    return 0;
}

const uint64_t *gm_mask(const gm *m, int s) { return s >= 0 ? m->states[s].mask : NULL; }

void gm_set_mask(gm *m, int s, const uint64_t *mask, int words) {
    if (s < 0) return;
    if (m->states[s].mask) m->mask_bytes -= (size_t)words * sizeof *mask;
    free(m->states[s].mask);
    m->mask_bytes += (size_t)words * sizeof *mask;
    m->states[s].mask = xmalloc((size_t)words * sizeof *mask);
    memcpy(m->states[s].mask, mask, (size_t)words * sizeof *mask);
}

int gm_rebuilds(const gm *m) { return m->rebuilds; }

long gm_closures(const gm *m) { return m->closures; }

long gm_rebuild_copies(const gm *m) { return m->rebuild_copies; }

int gm_overflowed(const gm *m) { return m->overflow; }

void gm_set_cache_limit(gm *m, int states) { m->states_limit = states > 1 ? states : 1; }
