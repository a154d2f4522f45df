/* tokmask.c — vocabulary trie and per-state token masks (see tokmask.h).
 *
 * The trie is stored first-child / next-sibling in one array; tokens ending at a node are a run
 * of ids in ends[]. The walk is an explicit DFS of (trie node, matcher state) pairs, so its depth
 * is the longest token, never the vocabulary size.
 */
#include "tokmask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct {
    int child, sibling;           /* -1 when none */
    int end_off, end_n;           /* ids ending here: ends[end_off .. + end_n) */
    unsigned char byte;
} tnode;

struct tokvocab {
    int vocab, words;             /* logits width; 64-bit words of a mask */
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
    for (int c = v->nodes[parent].child; c >= 0; c = v->nodes[c].sibling)
        if (v->nodes[c].byte == b) return c;
    if (v->nnodes == *cap) v->nodes = xrealloc(v->nodes, (size_t)(*cap *= 2) * sizeof *v->nodes);
    int c = v->nnodes++;
    v->nodes[c] = (tnode){.child = -1, .sibling = v->nodes[parent].child, .byte = b};
    v->nodes[parent].child = c;
    return c;
}

/* Node of each ordinary token, then the ids grouped by node (counting sort). */
static void build_trie(tokvocab *v) {
    int cap = 1024;
    v->nodes = xmalloc((size_t)cap * sizeof *v->nodes);
    v->nodes[0] = (tnode){.child = -1, .sibling = -1};
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
        if (at[id] >= 0) v->nodes[at[id]].end_n++;
    int off = 0;
    for (int n = 0; n < v->nnodes; n++) {
        v->nodes[n].end_off = off;
        off += v->nodes[n].end_n;
        v->nodes[n].end_n = 0;
    }
    v->ends = xmalloc((size_t)(off + 1) * sizeof *v->ends);
    for (int id = 0; id < v->vocab; id++)
        if (at[id] >= 0) v->ends[v->nodes[at[id]].end_off + v->nodes[at[id]].end_n++] = id;
    free(at);
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
    int cap = v->depth + 2, top = 0;
    int *node = xmalloc((size_t)cap * sizeof *node), *st = xmalloc((size_t)cap * sizeof *st);
    node[0] = v->nodes[0].child;
    st[0] = s;
    while (top >= 0) {
        int c = node[top];
        if (c < 0) { top--; continue; }
        node[top] = v->nodes[c].sibling;
        int t = gm_next(k->m, st[top], v->nodes[c].byte);
        if (t < 0) continue;
        for (int i = 0; i < v->nodes[c].end_n; i++) set_bit(bits, v->ends[v->nodes[c].end_off + i]);
        if (v->nodes[c].child >= 0 && gm_can_continue(k->m, t)) {
            top++;
            node[top] = v->nodes[c].child;
            st[top] = t;
        }
    }
    free(node);
    free(st);
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
