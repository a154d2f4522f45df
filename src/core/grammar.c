/* grammar.c — GBNF text -> compiled byte-level grammar (see grammar.h for the syntax).
 *
 * One recursive-descent pass builds rules as lists of alternatives of symbols. Groups, classes
 * with non-ASCII members and repetitions become helper rules named after the rule they appear
 * in ("value_3"), so error messages can still point somewhere useful. A second pass checks
 * references and left recursion, then everything is flattened into grammar_int.h's arrays.
 */
#include "grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_int.h"
#include "util.h"

enum { REPEAT_MAX = 4096, SYMBOLS_MAX = 1 << 22, CP_MAX = 0x10FFFF };

typedef struct {
    gsym *s;
    int n, cap;
} seqv;

typedef struct {
    char *name;
    seqv *alts;
    int nalts, cap;
    int defined, helpers;
} rulev;

typedef struct {
    unsigned lo, hi;
} cprange;

/* Rules by name, byte sets and non-ASCII classes by value are found through open-addressing tables of entry numbers
 * (-1 = empty, at most half full): a schema's generated grammar has thousands of helper rules and
 * sets, and a linear scan per lookup made parsing it quadratic. */
typedef struct {
    int *slot;
    unsigned cap;             /* a power of two, or 0 */
} lookup;

enum { BY_NAME, BY_SET, BY_CLASS };

typedef struct {
    cprange *r;               /* normalized ranges */
    int n, rule;              /* the helper rule of their UTF-8 sequences */
} classv;

typedef struct {
    const char *src;
    size_t len, pos;
    lookup by[3];
    rulev *rules;
    int nrules, cap;
    byteset *sets;
    int nsets, setcap;
    classv *classes;
    int nclasses, classcap;
    char **lits;
    size_t *lit_len;
    int nlits, litcap;
    long nsym;
    char *err;
    size_t errlen;
    int failed;
} parser;

/* ---- errors and building blocks ---------------------------------------------------------- */

static int fail_at(parser *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_at(parser *p, size_t at, const char *fmt, ...) {
    if (p->failed) return -1;
    p->failed = 1;
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        if (p->src[i] == '\n') { line++; col = 1; }
        else col++;
    }
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return errf(p->err, p->errlen, "grammar: %s at line %d, column %d", msg, line, col);
}

static int seq_add(parser *p, seqv *q, int kind, int arg) {
    if (++p->nsym > SYMBOLS_MAX) return fail_at(p, p->pos, "grammar too large (over %d symbols)", SYMBOLS_MAX);
    if (q->n == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 8;
        q->s = xrealloc(q->s, (size_t)q->cap * sizeof *q->s);
    }
    q->s[q->n++] = (gsym){kind, arg};
    return 0;
}

static seqv *rule_new_alt(rulev *r) {
    if (r->nalts == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 4;
        r->alts = xrealloc(r->alts, (size_t)r->cap * sizeof *r->alts);
    }
    seqv *q = &r->alts[r->nalts++];
    *q = (seqv){0};
    return q;
}

static const void *key_of(const parser *p, int kind, int id, size_t *n) {
    if (kind == BY_NAME) {
        *n = strlen(p->rules[id].name);
        return p->rules[id].name;
    }
    if (kind == BY_CLASS) {
        *n = (size_t)p->classes[id].n * sizeof *p->classes[id].r;
        return p->classes[id].r;
    }
    *n = sizeof p->sets[id];
    return &p->sets[id];
}

/* Multiply-xorshift over 8-byte words (keys are names, 32-byte sets and range lists). */
static unsigned key_hash(const void *key, size_t n) {
    uint64_t h = n;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = 0;
        memcpy(&w, (const char *)key + i, n - i < 8 ? n - i : 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    return (unsigned)(h ^ (h >> 32));
}

/* The slot holding key's entry, or the empty slot where it would go. */
static int *lookup_slot(const parser *p, int kind, const void *key, size_t n) {
    const lookup *t = &p->by[kind];
    for (unsigned i = key_hash(key, n);; i++) {
        int *slot = &t->slot[i & (t->cap - 1)];
        size_t m;
        if (*slot < 0) return slot;
        const void *k = key_of(p, kind, *slot, &m);
        if (m == n && !memcmp(k, key, n)) return slot;
    }
}

/* Room for entry number `count` (entries 0..count-1 exist): doubles and re-inserts when half full. */
static void lookup_reserve(parser *p, int kind, int count) {
    lookup *t = &p->by[kind];
    if (2 * ((size_t)count + 1) <= t->cap) return;
    free(t->slot);
    t->cap = t->cap ? 2 * t->cap : 64;
    t->slot = xmalloc(t->cap * sizeof *t->slot);
    memset(t->slot, 0xff, t->cap * sizeof *t->slot);
    for (int id = 0; id < count; id++) {
        size_t n;
        const void *k = key_of(p, kind, id, &n);
        *lookup_slot(p, kind, k, n) = id;
    }
}

static int rule_id(parser *p, const char *name, size_t n) {
    lookup_reserve(p, BY_NAME, p->nrules);
    int *slot = lookup_slot(p, BY_NAME, name, n);
    if (*slot >= 0) return *slot;
    if (p->nrules == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->rules = xrealloc(p->rules, (size_t)p->cap * sizeof *p->rules);
    }
    rulev *r = &p->rules[p->nrules];
    *r = (rulev){0};
    r->name = xmalloc(n + 1);
    memcpy(r->name, name, n);
    r->name[n] = 0;
    return *slot = p->nrules++;
}

/* A fresh defined rule named parent_K. */
static int helper_rule(parser *p, int parent) {
    char name[300];
    snprintf(name, sizeof name, "%.250s_%d", p->rules[parent].name, ++p->rules[parent].helpers);
    int id = rule_id(p, name, strlen(name));
    p->rules[id].defined = 1;
    return id;
}

static int set_id(parser *p, const byteset *s) {
    lookup_reserve(p, BY_SET, p->nsets);
    int *slot = lookup_slot(p, BY_SET, s, sizeof *s);
    if (*slot >= 0) return *slot;
    if (p->nsets == p->setcap) {
        p->setcap = p->setcap ? 2 * p->setcap : 16;
        p->sets = xrealloc(p->sets, (size_t)p->setcap * sizeof *p->sets);
    }
    p->sets[p->nsets] = *s;
    return *slot = p->nsets++;
}

static void set_range(byteset *s, unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; b++) s->w[b >> 6] |= 1ULL << (b & 63);
}

static int add_byte_range(parser *p, seqv *q, unsigned lo, unsigned hi) {
    byteset s = {{0}};
    set_range(&s, lo, hi);
    return seq_add(p, q, SYM_BYTES, set_id(p, &s));
}

/* ---- lexing ----------------------------------------------------------------------------- */

static int at_end(const parser *p) { return p->pos >= p->len; }
static char cur(const parser *p) { return at_end(p) ? 0 : p->src[p->pos]; }

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/* Position after blanks and comments from i; newlines too when nl_ok. */
static size_t blanks_from(const parser *p, size_t i, int nl_ok) {
    while (i < p->len) {
        char c = p->src[i];
        if (c == ' ' || c == '\t' || (nl_ok && (c == '\n' || c == '\r'))) i++;
        else if (c == '#') { while (i < p->len && p->src[i] != '\n') i++; }
        else break;
    }
    return i;
}

/* Skip blanks; at a newline outside parentheses the sequence ends, unless the next non-blank
 * line starts with `|` (then the rule continues there). */
static void skip(parser *p, int nested) {
    p->pos = blanks_from(p, p->pos, nested);
    if (!nested && (cur(p) == '\n' || cur(p) == '\r')) {
        size_t j = blanks_from(p, p->pos, 1);
        if (j < p->len && p->src[j] == '|') p->pos = j;
    }
}

/* One UTF-8 character of the source as a code point. */
static int src_char(parser *p, unsigned *cp) {
    int n = utf8_decode_one(p->src + p->pos, p->len - p->pos, cp);
    if (!n) return fail_at(p, p->pos, "invalid UTF-8 in the grammar text");
    p->pos += (size_t)n;
    return 0;
}

static int hex_escape(parser *p, int digits, unsigned *cp) {
    unsigned v = 0;
    for (int i = 0; i < digits; i++, p->pos++) {
        char c = cur(p);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return fail_at(p, p->pos, "escape needs %d hex digits", digits);
        v = v << 4 | (unsigned)d;
    }
    if (v > CP_MAX || (v >= 0xD800 && v <= 0xDFFF)) return fail_at(p, p->pos, "escape U+%X is not a Unicode scalar value", v);
    *cp = v;
    return 0;
}

/* A character inside a literal or class: an escape or one UTF-8 character. */
static int parse_char(parser *p, unsigned *cp) {
    if (at_end(p)) return fail_at(p, p->pos, "unexpected end of grammar");
    if (cur(p) != '\\') return src_char(p, cp);
    p->pos++;
    char c = cur(p);
    p->pos++;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': *cp = (unsigned char)c; return 0;
    case 'x': return hex_escape(p, 2, cp);
    case 'u': return hex_escape(p, 4, cp);
    case 'U': return hex_escape(p, 8, cp);
    default: return fail_at(p, p->pos - 2, "unknown escape '\\%c'", c ? c : '0');
    }
}

/* ---- character classes ------------------------------------------------------------------ */

static int by_lo(const void *a, const void *b) {
    const cprange *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Sort, merge, drop surrogates; negate over all scalar values when asked. Returns the count. */
static int normalize(cprange *r, int n, int negate, cprange *out) {
    qsort(r, (size_t)n, sizeof *r, by_lo);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i].lo <= out[m - 1].hi + 1) { if (r[i].hi > out[m - 1].hi) out[m - 1].hi = r[i].hi; }
        else out[m++] = r[i];
    }
    if (negate) {
        cprange tmp[m + 1];
        int k = 0;
        unsigned next = 0;
        for (int i = 0; i < m; i++) {
            if (out[i].lo > next) tmp[k++] = (cprange){next, out[i].lo - 1};
            next = out[i].hi + 1;
        }
        if (next <= CP_MAX) tmp[k++] = (cprange){next, CP_MAX};
        memcpy(out, tmp, (size_t)k * sizeof *out);
        m = k;
    }
    int k = 0;
    cprange tmp[2 * m + 1];
    for (int i = 0; i < m; i++) {
        cprange x = out[i];
        if (x.hi < 0xD800 || x.lo > 0xDFFF) { tmp[k++] = x; continue; }
        if (x.lo < 0xD800) tmp[k++] = (cprange){x.lo, 0xD7FF};
        if (x.hi > 0xDFFF) tmp[k++] = (cprange){0xE000, x.hi};
    }
    memcpy(out, tmp, (size_t)k * sizeof *out);
    return k;
}

/* Append one alternative per UTF-8 byte-range sequence covering [lo, hi] (no surrogates). The
 * classic split: ranges of one encoded length whose continuation bytes span their full 6-bit
 * range can be written byte-wise; others are cut at the boundaries where they do not. */
static int utf8_alts(parser *p, rulev *r, unsigned lo, unsigned hi) {
    static const unsigned bound[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bound[i] && hi > bound[i]) return utf8_alts(p, r, lo, bound[i]) || utf8_alts(p, r, bound[i] + 1, hi);
    unsigned char a[4], b[4];
    int n = utf8_encode_one(lo, a);
    utf8_encode_one(hi, b);
    for (int i = 1; i < n; i++) {
        unsigned m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) return utf8_alts(p, r, lo, lo | m) || utf8_alts(p, r, (lo | m) + 1, hi);
            if ((hi & m) != m) return utf8_alts(p, r, lo, (hi & ~m) - 1) || utf8_alts(p, r, hi & ~m, hi);
        }
    }
    seqv *q = rule_new_alt(r);
    for (int i = 0; i < n; i++)
        if (add_byte_range(p, q, a[i], b[i])) return -1;
    return 0;
}

/* Symbols for a set of code point ranges: one byte set when all are ASCII, else a helper rule
 * (one per distinct class). */
static int class_symbol(parser *p, int rule, seqv *q, cprange *r, int n) {
    if (n == 0) return fail_at(p, p->pos, "character class matches nothing");
    if (r[n - 1].hi < 0x80) {
        byteset s = {{0}};
        for (int i = 0; i < n; i++) set_range(&s, r[i].lo, r[i].hi);
        return seq_add(p, q, SYM_BYTES, set_id(p, &s));
    }
    lookup_reserve(p, BY_CLASS, p->nclasses);
    int *slot = lookup_slot(p, BY_CLASS, r, (size_t)n * sizeof *r);
    if (*slot < 0) {        /* a class met before reuses its rule: "." appears everywhere in patterns */
        int h = helper_rule(p, rule);
        for (int i = 0; i < n; i++)
            if (utf8_alts(p, &p->rules[h], r[i].lo, r[i].hi)) return -1;
        if (p->nclasses == p->classcap) {
            p->classcap = p->classcap ? 2 * p->classcap : 16;
            p->classes = xrealloc(p->classes, (size_t)p->classcap * sizeof *p->classes);
        }
        classv *c = &p->classes[p->nclasses];
        c->r = xmalloc((size_t)n * sizeof *r);
        memcpy(c->r, r, (size_t)n * sizeof *r);
        c->n = n;
        c->rule = h;
        *slot = p->nclasses++;
    }
    return seq_add(p, q, SYM_RULE, p->classes[*slot].rule);
}

static int parse_class(parser *p, int rule, seqv *q) {
    size_t start = p->pos++;
    int negate = cur(p) == '^';
    if (negate) p->pos++;
    int n = 0, cap = 16;
    cprange *r = xmalloc((size_t)cap * sizeof *r);
    int rc = 0;
    while (!rc && cur(p) != ']') {
        if (at_end(p)) { rc = fail_at(p, start, "unterminated character class"); break; }
        unsigned lo, hi;
        if ((rc = parse_char(p, &lo))) break;
        hi = lo;
        if (cur(p) == '-' && p->pos + 1 < p->len && p->src[p->pos + 1] != ']') {
            p->pos++;
            if ((rc = parse_char(p, &hi))) break;
            if (hi < lo) { rc = fail_at(p, p->pos, "class range U+%X-U+%X is reversed", lo, hi); break; }
        }
        if (n == cap) r = xrealloc(r, (size_t)(cap *= 2) * sizeof *r);
        r[n++] = (cprange){lo, hi};
    }
    if (!rc) {
        p->pos++;
        cprange *norm = xmalloc((size_t)(2 * n + 4) * sizeof *norm);
        int m = normalize(r, n, negate, norm);
        rc = class_symbol(p, rule, q, norm, m);
        free(norm);
    }
    free(r);
    return rc;
}

/* ---- literals ----------------------------------------------------------------------------- */

static void add_literal(parser *p, const char *s, size_t n) {
    if (p->nlits == p->litcap) {
        p->litcap = p->litcap ? 2 * p->litcap : 16;
        p->lits = xrealloc(p->lits, (size_t)p->litcap * sizeof *p->lits);
        p->lit_len = xrealloc(p->lit_len, (size_t)p->litcap * sizeof *p->lit_len);
    }
    p->lits[p->nlits] = xmalloc(n + 1);
    memcpy(p->lits[p->nlits], s, n);
    p->lit_len[p->nlits++] = n;
}

static int parse_literal(parser *p, seqv *q) {
    size_t start = p->pos++;
    char *bytes = xmalloc(p->len - p->pos + 1);
    size_t nb = 0;
    int rc = 0;
    while (!rc && cur(p) != '"') {
        if (at_end(p) || cur(p) == '\n') { rc = fail_at(p, start, "unterminated string literal"); break; }
        unsigned cp;
        if ((rc = parse_char(p, &cp))) break;
        nb += (size_t)utf8_encode_one(cp, (unsigned char *)bytes + nb);
    }
    if (!rc) {
        p->pos++;
        if (nb) add_literal(p, bytes, nb);
        for (size_t i = 0; !rc && i < nb; i++) rc = add_byte_range(p, q, (unsigned char)bytes[i], (unsigned char)bytes[i]);
    }
    free(bytes);
    return rc;
}

/* ---- rules, alternatives, repetition ------------------------------------------------------- */

static int parse_alternates(parser *p, int rule, int nested);

/* Move q->s[from..n) into a new helper rule and leave one symbol referring to it. */
static int wrap(parser *p, int rule, seqv *q, int from) {
    int h = helper_rule(p, rule);
    seqv *a = rule_new_alt(&p->rules[h]);
    a->n = a->cap = q->n - from;
    a->s = xmalloc((size_t)a->cap * sizeof *a->s);
    memcpy(a->s, q->s + from, (size_t)a->n * sizeof *a->s);
    q->n = from;
    return seq_add(p, q, SYM_RULE, h);
}

/* h ::= x h | ε  (x*) when star, else h ::= x next | ε with next = -1 for none (x? chains). */
static int repeat_rule(parser *p, int rule, gsym x, int tail_rule, int self_loop) {
    int h = helper_rule(p, rule);
    seqv *a = rule_new_alt(&p->rules[h]);
    if (seq_add(p, a, x.kind, x.arg)) return -1;
    int next = self_loop ? h : tail_rule;
    if (next >= 0 && seq_add(p, a, SYM_RULE, next)) return -1;
    rule_new_alt(&p->rules[h]);
    return h;
}

static int parse_count(parser *p, long *v) {
    size_t start = p->pos;
    long x = 0;
    while (cur(p) >= '0' && cur(p) <= '9') {
        x = x * 10 + (cur(p) - '0');
        if (x > REPEAT_MAX) return fail_at(p, start, "repetition count above %d", REPEAT_MAX);
        p->pos++;
    }
    if (p->pos == start) return fail_at(p, start, "expected a repetition count");
    *v = x;
    return 0;
}

/* {m}, {m,}, {m,n} applied to the single symbol x at the end of q. */
static int parse_braces(parser *p, int rule, seqv *q) {
    size_t start = p->pos++;
    long m, n;
    p->pos = blanks_from(p, p->pos, 0);
    if (parse_count(p, &m)) return -1;
    p->pos = blanks_from(p, p->pos, 0);
    n = m;
    if (cur(p) == ',') {
        p->pos = blanks_from(p, p->pos + 1, 0);
        n = -1;
        if (cur(p) != '}' && parse_count(p, &n)) return -1;
        p->pos = blanks_from(p, p->pos, 0);
    }
    if (cur(p) != '}') return fail_at(p, start, "expected '}' to close the repetition");
    p->pos++;
    if (n >= 0 && n < m) return fail_at(p, start, "repetition {%ld,%ld} has max below min", m, n);
    gsym x = q->s[--q->n];
    for (long i = 0; i < m; i++)
        if (seq_add(p, q, x.kind, x.arg)) return -1;
    if (n < 0) {
        int h = repeat_rule(p, rule, x, -1, 1);
        return h < 0 ? -1 : seq_add(p, q, SYM_RULE, h);
    }
    int tail = -1;
    for (long i = m; i < n; i++)
        if ((tail = repeat_rule(p, rule, x, tail, 0)) < 0) return -1;
    return tail >= 0 ? seq_add(p, q, SYM_RULE, tail) : 0;
}

static int parse_postfix(parser *p, int rule, seqv *q, int from) {
    for (;;) {
        char c = cur(p);
        if (c != '*' && c != '+' && c != '?' && c != '{') return 0;
        if (q->n == from) return fail_at(p, p->pos, "'%c' has nothing to repeat", c);
        if (q->n - from > 1 && wrap(p, rule, q, from)) return -1;
        if (c == '{') {
            if (parse_braces(p, rule, q)) return -1;
        } else {
            p->pos++;
            gsym x = q->s[q->n - 1];
            int h = repeat_rule(p, rule, x, -1, c != '?');
            if (h < 0) return -1;
            if (c != '+') q->n--;
            if (seq_add(p, q, SYM_RULE, h)) return -1;
        }
        /* x{2}* and the like: the next operator applies to everything this one produced */
    }
}

static int parse_sequence(parser *p, int rule, seqv *q, int nested) {
    for (;;) {
        skip(p, nested);
        char c = cur(p);
        int from = q->n, rc;
        if (at_end(p) || c == '|' || c == ')' || c == '\n' || c == '\r') return 0;
        if (c == '"') rc = parse_literal(p, q);
        else if (c == '[') rc = parse_class(p, rule, q);
        else if (c == '.') {
            p->pos++;
            cprange all = {0, CP_MAX}, norm[2];
            rc = class_symbol(p, rule, q, norm, normalize(&all, 1, 0, norm));
        } else if (c == '(') {
            size_t open = p->pos++;
            int h = helper_rule(p, rule);
            rc = parse_alternates(p, h, 1);
            if (!rc) {
                skip(p, 1);
                if (cur(p) != ')') rc = fail_at(p, open, "expected ')' to close this group");
                else p->pos++;
            }
            if (!rc) rc = seq_add(p, q, SYM_RULE, h);
        } else if (is_name_char(c)) {
            size_t s = p->pos;
            while (is_name_char(cur(p))) p->pos++;
            size_t after = blanks_from(p, p->pos, 0);
            if (after + 3 <= p->len && !memcmp(p->src + after, "::=", 3))
                return fail_at(p, s, "expected a newline before the next rule");
            rc = seq_add(p, q, SYM_RULE, rule_id(p, p->src + s, p->pos - s));
        } else if (c == '<') {
            return fail_at(p, p->pos, "token references (<...>) are not supported; write the token's text as a literal");
        } else {
            return fail_at(p, p->pos, "unexpected character '%c'", c);
        }
        if (rc || (q->n > from && parse_postfix(p, rule, q, from))) return -1;
        if (q->n == from && cur(p) && strchr("*+?{", cur(p)))
            return fail_at(p, p->pos, "'%c' has nothing to repeat", cur(p));
    }
}

/* Alternatives of rule `rule`. The rules array may move while a sequence is parsed (helpers are
 * added), so the rule is looked up by id after every sequence. */
static int parse_alternates(parser *p, int rule, int nested) {
    for (;;) {
        seqv q = {0};
        int rc = parse_sequence(p, rule, &q, nested);
        seqv *a = rule_new_alt(&p->rules[rule]);
        *a = q;
        if (rc) return -1;
        if (cur(p) != '|') return 0;
        p->pos = blanks_from(p, p->pos + 1, 1);
    }
}

static int parse_rule(parser *p) {
    size_t s = p->pos;
    while (is_name_char(cur(p))) p->pos++;
    if (p->pos == s) return fail_at(p, s, "expected a rule name");
    int id = rule_id(p, p->src + s, p->pos - s);
    if (p->rules[id].defined) return fail_at(p, s, "rule '%s' is defined twice", p->rules[id].name);
    p->rules[id].defined = 1;
    p->pos = blanks_from(p, p->pos, 0);
    if (p->pos + 3 > p->len || memcmp(p->src + p->pos, "::=", 3)) return fail_at(p, p->pos, "expected '::=' after the rule name");
    p->pos = blanks_from(p, p->pos + 3, 1);
    if (parse_alternates(p, id, 0)) return -1;
    if (!at_end(p) && cur(p) != '\n' && cur(p) != '\r') return fail_at(p, p->pos, "expected a newline or the end after the rule");
    return 0;
}

/* ---- checks ------------------------------------------------------------------------------- */

/* Left recursion would make the matcher expand forever: find a cycle of rules reachable at the
 * left edge of an alternative (through a prefix of rules that can match nothing). */
static int check_left_recursion(parser *p) {
    int n = p->nrules;
    char *nullable = xcalloc((size_t)n, 1);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++)
            for (int a = 0; !nullable[r] && a < p->rules[r].nalts; a++) {
                seqv *q = &p->rules[r].alts[a];
                int all = 1;
                for (int i = 0; all && i < q->n; i++) all = q->s[i].kind == SYM_RULE && nullable[q->s[i].arg];
                if (all) nullable[r] = changed = 1;
            }
    }
    /* left edges r -> s as one list per rule (first[r] .. first[r+1]) */
    int *first = xcalloc((size_t)n + 1, sizeof *first), ne = 0, cap = 64;
    int *to = xmalloc((size_t)cap * sizeof *to);
    for (int r = 0; r < n; r++) {
        first[r] = ne;
        for (int a = 0; a < p->rules[r].nalts; a++) {
            seqv *q = &p->rules[r].alts[a];
            for (int i = 0; i < q->n && q->s[i].kind == SYM_RULE; i++) {
                if (ne == cap) to = xrealloc(to, (size_t)(cap *= 2) * sizeof *to);
                to[ne++] = q->s[i].arg;
                if (!nullable[q->s[i].arg]) break;
            }
        }
    }
    first[n] = ne;
    /* iterative DFS: mark 0 unvisited, 1 on the path, 2 done; edge[] = next edge to try */
    char *mark = xcalloc((size_t)n, 1);
    int *stack = xmalloc((size_t)n * sizeof *stack), *edge = xmalloc((size_t)n * sizeof *edge);
    int bad = -1;
    for (int s = 0; s < n && bad < 0; s++) {
        if (mark[s]) continue;
        int top = 0;
        stack[0] = s;
        edge[0] = first[s];
        mark[s] = 1;
        while (top >= 0 && bad < 0) {
            int r = stack[top];
            if (edge[top] == first[r + 1]) { mark[r] = 2; top--; continue; }
            int next = to[edge[top]++];
            if (mark[next] == 1) bad = next;
            else if (!mark[next]) { mark[next] = 1; stack[++top] = next; edge[top] = first[next]; }
        }
    }
    int rc = 0;
    if (bad >= 0)
        rc = fail_at(p, p->len, "rule '%s' is left-recursive or repeats something that can match nothing",
                     p->rules[bad].name);
    free(nullable);
    free(first);
    free(to);
    free(mark);
    free(stack);
    free(edge);
    return rc;
}

/* ---- flattening --------------------------------------------------------------------------- */

static grammar *flatten(parser *p, int root) {
    grammar *g = xcalloc(1, sizeof *g);
    int nalt = 0, nsym = 0;
    for (int r = 0; r < p->nrules; r++) {
        nalt += p->rules[r].nalts;
        for (int a = 0; a < p->rules[r].nalts; a++) nsym += p->rules[r].alts[a].n + 1;
    }
    g->sym = xmalloc((size_t)(nsym + 1) * sizeof *g->sym);
    g->alt_start = xmalloc((size_t)(nalt + 1) * sizeof *g->alt_start);
    g->rule_alt = xmalloc((size_t)p->nrules * sizeof *g->rule_alt);
    g->rule_nalt = xmalloc((size_t)p->nrules * sizeof *g->rule_nalt);
    int k = 0, s = 0;
    for (int r = 0; r < p->nrules; r++) {
        g->rule_alt[r] = k;
        g->rule_nalt[r] = p->rules[r].nalts;
        for (int a = 0; a < p->rules[r].nalts; a++) {
            seqv *q = &p->rules[r].alts[a];
            g->alt_start[k++] = s;
            if (q->n) memcpy(g->sym + s, q->s, (size_t)q->n * sizeof *q->s);
            s += q->n;
            g->sym[s++] = (gsym){SYM_END, 0};
        }
    }
    g->sym[s] = (gsym){SYM_END, 0};
    g->nsym = s;
    g->nrules = p->nrules;
    g->root = root;
    g->sets = p->sets;
    g->nsets = p->nsets;
    g->lits = p->lits;
    g->lit_len = p->lit_len;
    g->nlits = p->nlits;
    p->sets = NULL;
    p->lits = NULL;
    p->lit_len = NULL;
    p->nlits = 0;
    return g;
}

static void parser_free(parser *p) {
    for (int r = 0; r < p->nrules; r++) {
        for (int a = 0; a < p->rules[r].nalts; a++) free(p->rules[r].alts[a].s);
        free(p->rules[r].alts);
        free(p->rules[r].name);
    }
    free(p->rules);
    free(p->sets);
    for (int i = 0; i < p->nclasses; i++) free(p->classes[i].r);
    free(p->classes);
    for (int k = 0; k < 3; k++) free(p->by[k].slot);
    for (int i = 0; i < p->nlits; i++) free(p->lits[i]);
    free(p->lits);
    free(p->lit_len);
}

grammar *grammar_parse(const char *src, size_t len, char *err, size_t errlen) {
    parser p = {.src = src, .len = len, .err = err, .errlen = errlen};
    const char *nul = memchr(src, 0, len);
    if (nul) {
        fail_at(&p, (size_t)(nul - src), "NUL byte in the grammar text");
        return NULL;
    }
    p.pos = blanks_from(&p, 0, 1);
    while (!at_end(&p) && !parse_rule(&p)) p.pos = blanks_from(&p, p.pos, 1);
    int root = -1;
    for (int r = 0; !p.failed && r < p.nrules; r++) {
        if (!p.rules[r].defined) fail_at(&p, p.len, "rule '%s' is used but never defined", p.rules[r].name);
        if (!strcmp(p.rules[r].name, "root")) root = r;
    }
    if (!p.failed && root < 0) fail_at(&p, p.len, "no 'root' rule (the start rule must be called root)");
    if (!p.failed) check_left_recursion(&p);
    grammar *g = p.failed ? NULL : flatten(&p, root);
    parser_free(&p);
    return g;
}

void grammar_free(grammar *g) {
    if (!g) return;
    free(g->sym);
    free(g->alt_start);
    free(g->rule_alt);
    free(g->rule_nalt);
    free(g->sets);
    for (int i = 0; i < g->nlits; i++) free(g->lits[i]);
    free(g->lits);
    free(g->lit_len);
    free(g);
}

int grammar_has_literal(const grammar *g, const char *s, size_t n) {
    for (int i = 0; i < g->nlits; i++)
        if (g->lit_len[i] == n && !memcmp(g->lits[i], s, n)) return 1;
    return 0;
}

/* ---- writing GBNF ------------------------------------------------------------------------- */

/* Code points of UTF-8 s into cp (at most cap); -1 if s is not valid UTF-8. */
static int decode_all(const char *s, unsigned *cp, int cap) {
    parser p = {.src = s, .len = strlen(s)};
    int n = 0;
    while (!at_end(&p)) {
        if (n == cap || src_char(&p, &cp[n])) return -1;
        n++;
    }
    return n;
}

int gbnf_literal(sbuf *out, const char *s) {
    size_t n = strlen(s);
    unsigned *cp = xmalloc((n + 1) * sizeof *cp);
    int k = decode_all(s, cp, (int)n + 1);
    if (k >= 0) {
        sbuf_puts(out, "\"");
        for (int i = 0; i < k; i++) {
            if (cp[i] == '"' || cp[i] == '\\') sbuf_printf(out, "\\%c", (char)cp[i]);
            else if (cp[i] < 0x20 || cp[i] == 0x7F) sbuf_printf(out, "\\x%02X", cp[i]);
            else {
                unsigned char b[4];
                sbuf_put(out, (const char *)b, (size_t)utf8_encode_one(cp[i], b));
            }
        }
        sbuf_puts(out, "\"");
    }
    free(cp);
    return k >= 0 ? 0 : -1;
}

/* A KMP automaton over the code points of stop: state i = the last i characters written are
 * stop's first i. Rule name-i lists the moves out of state i; the move that would complete stop
 * is the one left out. */
int gbnf_text_without(sbuf *out, const char *name, const char *stop) {
    size_t len = strlen(stop);
    unsigned *w = xmalloc((len + 1) * sizeof *w);
    int k = decode_all(stop, w, (int)len + 1);
    if (k <= 0) { free(w); return -1; }
    int *fail = xcalloc((size_t)k, sizeof *fail);
    for (int i = 1, f = 0; i < k; i++) {
        while (f && w[i] != w[f]) f = fail[f - 1];
        if (w[i] == w[f]) f++;
        fail[i] = f;
    }
    sbuf_printf(out, "%s ::= %s-0\n", name, name);
    for (int i = 0; i < k; i++) {
        sbuf_printf(out, "%s-%d ::= \"\"", name, i);
        sbuf other = {0};
        for (int c = 0; c < k; c++) {
            int dup = 0;
            for (int d = 0; d < c; d++) dup |= w[d] == w[c];
            if (dup) continue;
            int t = i;
            while (t && w[t] != w[c]) t = fail[t - 1];
            if (w[t] == w[c]) t++;
            if (t == 0) continue;
            sbuf_printf(&other, "\\U%08X", w[c]);
            if (t < k) sbuf_printf(out, " | \"\\U%08X\" %s-%d", w[c], name, t);
        }
        sbuf_printf(out, " | [^%s] %s-0\n", other.p ? other.p : "", name);
        sbuf_free(&other);
    }
    free(w);
    free(fail);
    return 0;
}
