/* tokmask.h — which vocabulary tokens a grammar allows next: the sampling-step mask of
 * constrained decoding.
 *
 * tokvocab is built once per model: a byte trie of every ordinary token (its decoded bytes), the
 * special tokens kept apart, and the stop (EOS) ids. A tokmask is one request's view: a matcher
 * (grammar.h) over the bytes generated so far. tokmask_apply walks the trie against the matcher
 * state — a branch dies at the first byte the grammar rejects — and caches the resulting bit
 * mask on that matcher state, so a state seen again (inside a JSON string, between array items)
 * costs one pass over the logits.
 *
 * INVARIANTS
 *  - An ordinary token is allowed iff the grammar accepts all its bytes from the current state.
 *  - A special token is allowed only where the grammar accepts its bytes AND the grammar spells
 *    its text as one literal (so "<tool_call>" can come as the family's token where the tool-call
 *    syntax writes it, but no special token ever appears inside free text).
 *  - A stop id is allowed iff the bytes so far form a complete sentence of the grammar.
 *  - Tokens that decode to no bytes are never allowed (they would not advance the grammar).
 *  - The mask and the feed depend only on the grammar and the ids fed: the same ids give the
 *    same masks (the generation stays a pure function of seed and logits).
 */
#ifndef CAIRN_TOKMASK_H
#define CAIRN_TOKMASK_H

#include <stdint.h>

#include "grammar.h"
#include "tokenizer.h"

typedef struct tokvocab tokvocab;

/* vocab: the logits width (ids at or above the tokenizer's size are never allowed). */
tokvocab *tokvocab_new(const tokenizer *t, int vocab, const int *stop_ids, int nstop);
void tokvocab_free(tokvocab *v);

typedef struct {
    const tokvocab *v;
    const grammar *g;
    gm *m;
    int *specials;                /* special ids whose text is a literal of the grammar */
    int nspecials;
    uint64_t *bits;               /* scratch mask */
    int *walk;                    /* scratch stacks of the trie walk */
    long steps, cache_hits;       /* tokmask_apply calls; those answered from the cache */
} tokmask;

void tokmask_init(tokmask *k, const tokvocab *v, const grammar *g);
void tokmask_free(tokmask *k);
/* Set the logits of every token the grammar does not allow now to -INFINITY. Returns how many
 * tokens stay allowed (0: the grammar cannot be continued by any token of this vocabulary). */
int tokmask_apply(tokmask *k, float *logits);
/* Move the matcher past token id. 0, or -1 if the grammar does not allow it (matcher unchanged). */
int tokmask_feed(tokmask *k, int id);
/* The output so far is a complete sentence of the grammar. */
int tokmask_complete(const tokmask *k);

#endif
