/* grammar_int.h — the compiled form of a grammar, shared by the compiler (grammar.c) and the
 * matcher (grammar_match.c) only; nothing else includes it.
 *
 * Every alternative of every rule is a run of symbols in sym[] closed by a SYM_END, so a parse
 * position is one index into sym[] and "the next symbol" is pos + 1.
 */
#ifndef CAIRN_GRAMMAR_INT_H
#define CAIRN_GRAMMAR_INT_H

#include <stddef.h>
#include <stdint.h>

enum { SYM_END, SYM_BYTES, SYM_RULE };

typedef struct {
    int kind;
    int arg;                      /* SYM_BYTES: index into sets; SYM_RULE: rule id */
} gsym;

typedef struct {
    uint64_t w[4];                /* bit b set: byte b matches */
} byteset;

static inline int byteset_has(const byteset *s, unsigned char b) { return (int)((s->w[b >> 6] >> (b & 63)) & 1); }

struct grammar {
    gsym *sym;
    int nsym;
    int *alt_start;               /* position of each alternative's first symbol */
    int *rule_alt, *rule_nalt;    /* rule r owns alt_start[rule_alt[r] .. + rule_nalt[r]) */
    int nrules, root;
    byteset *sets;
    int nsets;
    char **lits;                  /* every literal as written (bytes) */
    size_t *lit_len;
    int nlits;
};

#endif
