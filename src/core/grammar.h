/* grammar.h — context-free grammars over bytes (GBNF syntax) and their pushdown matcher.
 *
 * SYNTAX (llama.cpp's GBNF): `name ::= alternatives` rules, one per line (a rule continues on
 * lines inside parentheses or after `|`, and on a line that starts with `|`); `#` comments;
 * "literals" and [character classes] ([^...] negated, a-z ranges) with the escapes \n \r \t \\ \"
 * \[ \] \- \^ \xHH \uHHHH \UHHHHHHHH; `.` any character; rule names [A-Za-z0-9_-]; grouping ( );
 * postfix * + ? {m} {m,} {m,n}. The start rule is `root`. Not supported (an error says so):
 * llama.cpp's token references <[id]>.
 *
 * COMPILED FORM. Characters are Unicode code points written as UTF-8: every class is compiled to
 * byte-level alternatives (UTF-8 range splitting), so the matcher only ever sees bytes and a
 * token's bytes can be matched one by one even when a token ends inside a character. Negated
 * classes and `.` cover every scalar value (no surrogates). Repetitions become right-recursive
 * helper rules. Compilation refuses undefined rules, a missing root, and left recursion (including
 * a repetition of something that can match nothing), so matching always terminates.
 *
 * MATCHER. A matcher state is the set of parse stacks alive after the bytes fed so far (each
 * stack: positions inside rule alternatives, top = the next byte class to match). States are
 * interned and their byte transitions cached, so repeated walks (every sampling step walks the
 * token trie, tokmask.h) turn into table lookups: a lazily built DFA over the pushdown states.
 * The cache is bounded; when it has grown too big, gm_feed rebuilds it around the current state.
 *
 * INVARIANTS
 *  - grammar_parse never crashes on any input (it is a fuzz target) and every failure names
 *    what was wrong and where (line:column).
 *  - A compiled grammar is immutable; any number of matchers may share it.
 *  - gm_feed either consumes all n bytes and moves the matcher, or returns -1 and leaves the
 *    matcher exactly as it was.
 *  - Matching is bounded in time and memory whatever the grammar: a state may hold at most 4096
 *    parse stacks (beyond, gm_overflowed() and the byte is rejected).
 */
#ifndef CAIRN_GRAMMAR_H
#define CAIRN_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "sbuf.h"

typedef struct grammar grammar;

/* Parse and compile GBNF text src[0..len) (NUL bytes refused). NULL + err on any error. */
grammar *grammar_parse(const char *src, size_t len, char *err, size_t errlen);
void grammar_free(grammar *g);
/* 1 when bytes s[0..n) are exactly one "literal" written somewhere in the grammar (used to let
 * a special token through only where the grammar spells it out). */
int grammar_has_literal(const grammar *g, const char *s, size_t n);

/* GBNF writing helpers for grammar generators (json_schema.c, the families' tool-call syntax).
 * gbnf_literal: UTF-8 text s as one "literal" (0 on success, -1 if s is not valid UTF-8).
 * gbnf_text_without: rule `name` (plus helpers name-K) matching any text, including none, that
 * does not contain `stop` (a non-empty UTF-8 string) — e.g. reasoning before "</think>". */
int gbnf_literal(sbuf *out, const char *s);
int gbnf_text_without(sbuf *out, const char *name, const char *stop);

typedef struct gm gm;

enum { GM_DEAD = -1 };

gm *gm_new(const grammar *g);
void gm_free(gm *m);
/* The current state (an id valid until the next gm_feed or gm_next call that fills the cache). */
int gm_state(const gm *m);
/* The state after byte b from state s, or GM_DEAD. Never invalidates a state id. */
int gm_next(gm *m, int s, unsigned char b);
int gm_accepting(const gm *m, int s);        /* the bytes so far form a complete sentence */
int gm_can_continue(const gm *m, int s);     /* some byte can still follow */
/* Advance the current state by n bytes; -1 (matcher unchanged) if the grammar rejects them.
 * This is the only call that may rebuild the cache (every id but the new gm_state() is then
 * invalid), so a walk over many gm_next calls can hold ids safely between two feeds. */
int gm_feed(gm *m, const void *bytes, size_t n);
/* Per-state scratch for one cached bit mask of `words` 64-bit words (tokmask.h): NULL when the
 * state has none yet; gm_set_mask stores a copy. Dropped when the cache is rebuilt. */
const uint64_t *gm_mask(const gm *m, int s);
void gm_set_mask(gm *m, int s, const uint64_t *mask, int words);
/* Cache rebuilds so far, and the number of cached states that triggers one (default 65536; the
 * cache is also bounded by 2^20 stack nodes and 64 MiB of masks). */
int gm_rebuilds(const gm *m);
void gm_set_cache_limit(gm *m, int states);
/* Closures computed so far: one per (state, byte class) first seen, not per byte. */
long gm_closures(const gm *m);
/* Stack nodes the last cache rebuild copied: the distinct nodes the current state reaches. */
long gm_rebuild_copies(const gm *m);
/* 1 once some state had more than 4096 live parses (a grammar too ambiguous to match in bounded
 * time and memory): those transitions are treated as rejections. */
int gm_overflowed(const gm *m);

#endif
