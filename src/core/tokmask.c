/* tokmask.c — vocabulary trie and per-state token masks (see tokmask.h).
 *
 * The trie is built first-child / next-sibling, then laid out breadth-first so that a node's
 * children are one contiguous run (nodes[kids .. kids + nkids)): a mask computed on a cache miss
 * walks the vocabulary's trie, and inside a bounded string (maxLength: every position its own
 * matcher state, so every step misses) that walk is the whole cost of the step — contiguous
 * siblings keep it in cache lines it has already loaded. Tokens ending at a node are a run of ids
 * in ends[]. The walk is an explicit DFS of (trie node, matcher state) pairs, so its depth is the
 * longest token, never the vocabulary size; its stacks are allocated once per request.
 */
#include "tokmask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct {                  /* a trie node while building */
    int child, sibling;           /* -1 when none */
    int end_off, end_n;           /* ids ending here: ends[end_off .. + end_n) */
    unsigned char byte;
} bnode;

typedef struct {                  /* a trie node laid out */
    int kids, nkids;              /* children: nodes[kids .. kids + nkids) */
    int end_off, end_n;
    unsigned char byte;
} tnode;

struct tokvocab {
    int vocab, words;             /* logits width; 64-bit words of a mask */
    bnode *build;                 /* while building */
    tnode *nodes;
    int nnodes;
    int *ends;
    unsigned char **bytes;        /* per id: decoded bytes (NULL for ids without a token) */
    int *nbytes;
    char *special;                /* per id */
    int *stop;
    int nstop;
    int depth;                    /* longest token in bytes */
};

static int trie_child(tokvocab *v, int parent, unsigned char b, int *cap) {
    for (int c = v->build[parent].child; c >= 0; c = v->build[c].sibling)
        if (v->build[c].byte == b) return c;
    if (v->nnodes == *cap) v->build = xrealloc(v->build, (size_t)(*cap *= 2) * sizeof *v->build);
    int c = v->nnodes++;
    v->build[c] = (bnode){.child = -1, .sibling = v->build[parent].child, .byte = b};
    v->build[parent].child = c;
    return c;
}

/* The built trie renumbered breadth-first into v->nodes (the root stays node 0). */
static void lay_out_breadth_first(tokvocab *v) {
    v->nodes = xmalloc((size_t)v->nnodes * sizeof *v->nodes);
    int *from = xmalloc((size_t)v->nnodes * sizeof *from), n = 1;
    from[0] = 0;
    for (int i = 0; i < n; i++) {
        const bnode *src = &v->build[from[i]];
        v->nodes[i] = (tnode){.kids = n, .end_off = src->end_off, .end_n = src->end_n, .byte = src->byte};
        for (int c = src->child; c >= 0; c = v->build[c].sibling) {
            from[n++] = c;
            v->nodes[i].nkids++;
        }
    }
    free(v->build);
    v->build = NULL;
    free(from);
}

/* Node of each ordinary token, then the ids grouped by node (counting sort). */
static void build_trie(tokvocab *v) {
    int cap = 1024;
    v->build = xmalloc((size_t)cap * sizeof *v->build);
    v->build[0] = (bnode){.child = -1, .sibling = -1};
    v->nnodes = 1;
    int *at = xmalloc((size_t)v->vocab * sizeof *at);
    for (int id = 0; id < v->vocab; id++) {
        at[id] = -1;
        if (v->special[id] || v->nbytes[id] <= 0) continue;
        int n = 0;
        for (int i = 0; i < v->nbytes[id]; i++) n = trie_child(v, n, v->bytes[id][i], &cap);
        at[id] = n;
        v->depth = MAX(v->depth, v->nbytes[id]);
    }
    for (int id = 0; id < v->vocab; id++)
        if (at[id] >= 0) v->build[at[id]].end_n++;
    int off = 0;
    for (int n = 0; n < v->nnodes; n++) {
        v->build[n].end_off = off;
        off += v->build[n].end_n;
        v->build[n].end_n = 0;
    }
    v->ends = xmalloc((size_t)(off + 1) * sizeof *v->ends);
    for (int id = 0; id < v->vocab; id++)
        if (at[id] >= 0) v->ends[v->build[at[id]].end_off + v->build[at[id]].end_n++] = id;
    free(at);
    lay_out_breadth_first(v);
}

tokvocab *tokvocab_new(const tokenizer *t, int vocab, const int *stop_ids, int nstop) {
    tokvocab *v = xcalloc(1, sizeof *v);
    v->vocab = vocab;
    v->words = (vocab + 63) / 64;
    v->bytes = xcalloc((size_t)vocab, sizeof *v->bytes);
    v->nbytes = xcalloc((size_t)vocab, sizeof *v->nbytes);
    v->special = xcalloc((size_t)vocab, 1);
    int tv = MIN(tok_vocab_size(t), vocab);
    for (int id = 0; id < tv; id++) {
        if (!tok_piece(t, id)) continue;
        size_t n;
        v->bytes[id] = (unsigned char *)tok_decode(t, &id, 1, &n);
        v->nbytes[id] = (int)n;
        v->special[id] = (char)tok_is_special(t, id);
    }
    v->stop = xmalloc((size_t)(nstop + 1) * sizeof *v->stop);
    for (int i = 0; i < nstop; i++)
        if (stop_ids[i] >= 0 && stop_ids[i] < vocab) {
            v->stop[v->nstop++] = stop_ids[i];
            v->special[stop_ids[i]] = 1;     /* a stop id is never matched as text */
        }
    build_trie(v);
    return v;
}

void tokvocab_free(tokvocab *v) {
    if (!v) return;
    for (int id = 0; id < v->vocab; id++) free(v->bytes[id]);
    free(v->bytes);
    free(v->nbytes);
    free(v->special);
    free(v->stop);
    free(v->nodes);
    free(v->ends);
    free(v);
}

static int is_stop(const tokvocab *v, int id) {
    for (int i = 0; i < v->nstop; i++)
        if (v->stop[i] == id) return 1;
    return 0;
}

void tokmask_init(tokmask *k, const tokvocab *v, const grammar *g) {
    *k = (tokmask){.v = v, .g = g, .m = gm_new(g)};
    k->bits = xmalloc((size_t)v->words * sizeof *k->bits);
    k->walk = xmalloc(3 * (size_t)(v->depth + 2) * sizeof *k->walk);
    k->specials = xmalloc(sizeof *k->specials);
    for (int id = 0; id < v->vocab; id++) {
        if (!v->special[id] || is_stop(v, id) || v->nbytes[id] <= 0) continue;
        if (!grammar_has_literal(g, (const char *)v->bytes[id], (size_t)v->nbytes[id])) continue;
        k->specials = xrealloc(k->specials, (size_t)(k->nspecials + 1) * sizeof *k->specials);
        k->specials[k->nspecials++] = id;
    }
}

void tokmask_free(tokmask *k) {
    gm_free(k->m);
    free(k->specials);
    free(k->bits);
    free(k->walk);
    k->walk = NULL;
    k->m = NULL;
    k->specials = NULL;
    k->bits = NULL;
}

static void set_bit(uint64_t *bits, int id) { bits[id >> 6] |= 1ULL << (id & 63); }

/* Does the grammar accept bytes b[0..n) from state s? */
static int accepts(gm *m, int s, const unsigned char *b, int n) {
    for (int i = 0; i < n && s >= 0; i++) s = gm_next(m, s, b[i]);
    return s >= 0;
}

static void compute_mask(tokmask *k, int s, uint64_t *bits) {
    const tokvocab *v = k->v;
    memset(bits, 0, (size_t)v->words * sizeof *bits);
    int top = 0, *next = k->walk, *last = k->walk + v->depth + 2, *st = k->walk + 2 * (v->depth + 2);
    next[0] = v->nodes[0].kids;        /* children still to visit at each depth: next .. last */
    last[0] = next[0] + v->nodes[0].nkids;
    st[0] = s;
    while (top >= 0) {
        int c = next[top];
        if (c == last[top]) { top--; continue; }
        next[top]++;
        const tnode *nd = &v->nodes[c];
        int t = gm_next(k->m, st[top], nd->byte);
        if (t < 0) continue;
        for (int i = 0; i < nd->end_n; i++) set_bit(bits, v->ends[nd->end_off + i]);
        if (nd->nkids && gm_can_continue(k->m, t)) {
            top++;
            next[top] = nd->kids;
            last[top] = nd->kids + nd->nkids;
            st[top] = t;
        }
    }
    for (int i = 0; i < k->nspecials; i++) {
        int id = k->specials[i];
        if (accepts(k->m, s, v->bytes[id], v->nbytes[id])) set_bit(bits, id);
    }
    if (gm_accepting(k->m, s))
        for (int i = 0; i < v->nstop; i++) set_bit(bits, v->stop[i]);
}

int tokmask_apply(tokmask *k, float *logits) {
    int s = gm_state(k->m);
    const uint64_t *bits = gm_mask(k->m, s);
    k->steps++;
    if (bits) k->cache_hits++;
    else {
        compute_mask(k, s, k->bits);
        gm_set_mask(k->m, s, k->bits, k->v->words);
        bits = k->bits;
    }
    int allowed = 0;
    for (int id = 0; id < k->v->vocab; id++) {
        if ((bits[id >> 6] >> (id & 63)) & 1) allowed++;
        else logits[id] = -INFINITY;
    }
    return allowed;
}

int tokmask_feed(tokmask *k, int id) {
    const tokvocab *v = k->v;
    if (id < 0 || id >= v->vocab) return -1;
    if (is_stop(v, id)) return gm_accepting(k->m, gm_state(k->m)) ? 0 : -1;
    if (v->nbytes[id] <= 0) return -1;
    if (v->special[id]) {
        int listed = 0;
        for (int i = 0; i < k->nspecials; i++) listed |= k->specials[i] == id;
        if (!listed) return -1;
    }
    return gm_feed(k->m, v->bytes[id], (size_t)v->nbytes[id]);
}

int tokmask_complete(const tokmask *k) { return gm_accepting(k->m, gm_state(k->m)); }
