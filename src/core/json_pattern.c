/* json_pattern.c — the JSON Schema `pattern` subset (json_schema.h) compiled to GBNF.
 *
 * Patterns are ECMAScript regular expressions run with the `u` flag (as validators do), so they
 * work on code points. Every character or class becomes a set of code points; a set is written
 * as the JSON text for its members: most characters raw, `"` and `\` and control characters as
 * the escapes JSON requires. Where several spellings exist (\n or \u000a) one is generated —
 * stricter, never looser. In raw mode (a string written unquoted, json_schema_tagged_rules) every
 * member is written as itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema.h"
#include "util.h"

enum { SET_MAX = 64, NEST_MAX = 32, COUNT_MAX = 4096 };

typedef struct {
    unsigned lo[SET_MAX], hi[SET_MAX];
    int n;
} cpset;

typedef struct {
    const char *s;
    size_t i, n;
    sbuf *e;
    int raw;                      /* members as themselves, not as JSON string content */
    int depth;
    char *err;
    size_t errlen;
} rx;

static const unsigned space_ranges[][2] = {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                           {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                                           {0xFEFF, 0xFEFF}};

static int set_add(rx *r, cpset *c, unsigned lo, unsigned hi) {
    if (c->n == SET_MAX) return errf(r->err, r->errlen, "character class too complex");
    c->lo[c->n] = lo;
    c->hi[c->n++] = hi;
    return 0;
}

static int set_union(rx *r, cpset *c, const cpset *d) {
    for (int i = 0; i < d->n; i++)
        if (set_add(r, c, d->lo[i], d->hi[i])) return -1;
    return 0;
}

/* Sort and merge ranges. */
static void set_norm(cpset *c) {
    for (int i = 1; i < c->n; i++)
        for (int k = i; k > 0 && c->lo[k] < c->lo[k - 1]; k--) {
            unsigned t = c->lo[k]; c->lo[k] = c->lo[k - 1]; c->lo[k - 1] = t;
            t = c->hi[k]; c->hi[k] = c->hi[k - 1]; c->hi[k - 1] = t;
        }
    int m = 0;
    for (int i = 0; i < c->n; i++) {
        if (m && c->lo[i] <= c->hi[m - 1] + 1) { if (c->hi[i] > c->hi[m - 1]) c->hi[m - 1] = c->hi[i]; }
        else { c->lo[m] = c->lo[i]; c->hi[m++] = c->hi[i]; }
    }
    c->n = m;
}

static int set_complement(rx *r, cpset *c) {
    set_norm(c);
    cpset out = {.n = 0};
    unsigned next = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->lo[i] > next && set_add(r, &out, next, c->lo[i] - 1)) return -1;
        next = c->hi[i] + 1;
    }
    if (next <= 0x10FFFF && set_add(r, &out, next, 0x10FFFF)) return -1;
    *c = out;
    return 0;
}

/* Named classes: d w s, upper case negated. */
static int class_escape(rx *r, char k, cpset *c) {
    cpset x = {.n = 0};
    char lower = (char)(k | 0x20);
    if (lower == 'd') set_add(r, &x, '0', '9');
    else if (lower == 'w') { set_add(r, &x, '0', '9'); set_add(r, &x, 'A', 'Z'); set_add(r, &x, '_', '_'); set_add(r, &x, 'a', 'z'); }
    else for (size_t i = 0; i < sizeof space_ranges / sizeof space_ranges[0]; i++) set_add(r, &x, space_ranges[i][0], space_ranges[i][1]);
    if (k != lower && set_complement(r, &x)) return -1;
    return set_union(r, c, &x);
}

/* ---- writing a set as JSON string content -------------------------------------------------- */

static void put_cp_escape(sbuf *e, unsigned cp) { sbuf_printf(e, "\\U%08X", cp); }

/* The C0 controls in [lo, hi] as JSON writes them: \b \t \n \f \r short, the others as \u00XX,
 * one alternative per third hex digit (a "." would otherwise be 32 alternatives every time it
 * appears: a pattern of dots made a grammar ~300 times the size of its schema). */
static void emit_controls(sbuf *e, unsigned lo, unsigned hi, int *n) {
    static const char short_esc[] = "\b\t\n\f\r", letters[] = "btnfr";
    char digits[2][17];
    int nd[2] = {0, 0};
    for (unsigned cp = lo; cp <= hi && cp < 0x20; cp++) {
        const char *k = cp ? strchr(short_esc, (int)cp) : NULL;
        if (k) sbuf_printf(e, "%s\"\\\\%c\"", (*n)++ ? " | " : "", letters[k - short_esc]);
        else digits[cp >> 4][nd[cp >> 4]++] = "0123456789abcdef"[cp & 15];
    }
    for (int h = 0; h < 2; h++) {
        if (!nd[h]) continue;
        digits[h][nd[h]] = 0;
        sbuf_printf(e, "%s\"\\\\u00%d\" [%s]", (*n)++ ? " | " : "", h, digits[h]);
    }
}

static int emit_set(rx *r, cpset *c) {
    set_norm(c);
    sbuf *e = r->e;
    cpset raw = {.n = 0};
    int n = 0;
    sbuf_puts(e, "(");
    for (int i = 0; i < c->n; i++) {
        unsigned lo = c->lo[i], hi = c->hi[i];
        /* the characters JSON writes escaped */
        if (!r->raw) emit_controls(e, lo, hi, &n);
        if (!r->raw && lo <= '"' && '"' <= hi) sbuf_printf(e, "%s\"\\\\\\\"\"", n++ ? " | " : "");
        if (!r->raw && lo <= '\\' && '\\' <= hi) sbuf_printf(e, "%s\"\\\\\\\\\"", n++ ? " | " : "");
        /* the rest raw, split around those and the surrogates (raw mode: around NUL and them) */
        static const unsigned json_cuts[][2] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0xD800, 0xDFFF}};
        static const unsigned raw_cuts[][2] = {{0, 0}, {0xD800, 0xDFFF}};
        const unsigned (*cuts)[2] = r->raw ? raw_cuts : json_cuts;
        size_t ncuts = r->raw ? 2 : 4;
        unsigned start = lo;
        for (size_t k = 0; k < ncuts && start <= hi; k++) {
            if (cuts[k][1] < start) continue;
            if (cuts[k][0] > hi) break;
            if (cuts[k][0] > start && set_add(r, &raw, start, cuts[k][0] - 1)) return -1;
            start = cuts[k][1] + 1;
        }
        if (start <= hi && set_add(r, &raw, start, hi)) return -1;
    }
    if (raw.n) {
        sbuf_puts(e, n++ ? " | [" : "[");
        for (int i = 0; i < raw.n; i++) {
            put_cp_escape(e, raw.lo[i]);
            if (raw.hi[i] != raw.lo[i]) { sbuf_puts(e, "-"); put_cp_escape(e, raw.hi[i]); }
        }
        sbuf_puts(e, "]");
    }
    sbuf_puts(e, ")");
    return n ? 0 : errf(r->err, r->errlen, "a character class matches nothing");
}

/* ---- parsing --------------------------------------------------------------------------------- */

static int at_end(const rx *r) { return r->i >= r->n; }
static char cur(const rx *r) { return at_end(r) ? 0 : r->s[r->i]; }

static int utf8_char(rx *r, unsigned *cp) {
    int n = utf8_decode_one(r->s + r->i, r->n - r->i, cp);
    if (!n) return errf(r->err, r->errlen, "invalid UTF-8");
    r->i += (size_t)n;
    return 0;
}

static int hex(rx *r, int digits, unsigned *cp) {
    unsigned v = 0;
    for (int i = 0; i < digits; i++, r->i++) {
        char c = cur(r);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return errf(r->err, r->errlen, "bad hex escape at offset %zu", r->i);
        v = v << 4 | (unsigned)d;
    }
    *cp = v;
    return 0;
}

/* An escape after the backslash: a class (into c) or a single code point (into c too). */
static int escape(rx *r, cpset *c, int in_class) {
    char k = cur(r);
    r->i++;
    unsigned cp = 0;
    switch (k) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': return class_escape(r, k, c);
    case 't': return set_add(r, c, '\t', '\t');
    case 'n': return set_add(r, c, '\n', '\n');
    case 'r': return set_add(r, c, '\r', '\r');
    case 'f': return set_add(r, c, '\f', '\f');
    case 'v': return set_add(r, c, '\v', '\v');
    case '0': return set_add(r, c, 0, 0);
    case 'u': if (hex(r, 4, &cp)) return -1; return set_add(r, c, cp, cp);
    case 'x': if (hex(r, 2, &cp)) return -1; return set_add(r, c, cp, cp);
    case 'b':
        if (in_class) return set_add(r, c, 8, 8);
        return errf(r->err, r->errlen, "word boundaries (\\b) are not supported");
    default:
        if (k && strchr("^$\\.*+?()[]{}|/-", k)) return set_add(r, c, (unsigned char)k, (unsigned char)k);
        if (k >= '1' && k <= '9') return errf(r->err, r->errlen, "backreferences are not supported");
        return errf(r->err, r->errlen, "unsupported escape '\\%c'", k ? k : '0');
    }
}

static int parse_class(rx *r, cpset *c) {
    r->i++;
    int negate = cur(r) == '^';
    if (negate) r->i++;
    while (cur(r) != ']') {
        if (at_end(r)) return errf(r->err, r->errlen, "unterminated character class");
        cpset one = {.n = 0};
        if (cur(r) == '\\') { r->i++; if (escape(r, &one, 1)) return -1; }
        else { unsigned cp; if (utf8_char(r, &cp)) return -1; set_add(r, &one, cp, cp); }
        if (cur(r) == '-' && r->i + 1 < r->n && r->s[r->i + 1] != ']') {
            if (one.n != 1 || one.lo[0] != one.hi[0]) return errf(r->err, r->errlen, "a class range cannot start at \\d, \\w or \\s");
            r->i++;
            cpset end = {.n = 0};
            if (cur(r) == '\\') { r->i++; if (escape(r, &end, 1)) return -1; }
            else { unsigned cp; if (utf8_char(r, &cp)) return -1; set_add(r, &end, cp, cp); }
            if (end.n != 1 || end.lo[0] != end.hi[0] || end.lo[0] < one.lo[0])
                return errf(r->err, r->errlen, "bad class range");
            one.hi[0] = end.lo[0];
        }
        if (set_union(r, c, &one)) return -1;
    }
    r->i++;
    return negate ? set_complement(r, c) : 0;
}

static int parse_alt(rx *r, int *nullable);

static int parse_count(rx *r, long *v) {
    size_t start = r->i;
    long x = 0;
    while (cur(r) >= '0' && cur(r) <= '9') {
        x = x * 10 + (cur(r) - '0');
        r->i++;
        if (x > COUNT_MAX) return errf(r->err, r->errlen, "repetition count above %d", COUNT_MAX);
    }
    if (r->i == start) return errf(r->err, r->errlen, "bad repetition count");
    *v = x;
    return 0;
}

/* Quantifier after an atom, written as the GBNF postfix. *nullable: the atom can match nothing on
 * entry, the quantified item on return. An unbounded repetition of an atom that can match nothing
 * ((a|)*, (b*)+) is refused: the grammar compiler refuses it as left recursion, and its language
 * is the same as the atom's without the empty match, which the pattern should say. */
static int quantifier(rx *r, int *nullable) {
    char c = cur(r);
    size_t at = r->i;
    int unbounded = 0, zero = c == '*' || c == '?';
    if (c == '*' || c == '+' || c == '?') {
        r->i++;
        sbuf_put(r->e, &c, 1);
        unbounded = c != '?';
    } else if (c == '{') {
        long m, n;
        r->i++;
        if (parse_count(r, &m)) return -1;
        n = m;
        if (cur(r) == ',') {
            r->i++;
            n = -1;
            if (cur(r) != '}' && parse_count(r, &n)) return -1;
        }
        if (cur(r) != '}') return errf(r->err, r->errlen, "bad repetition");
        r->i++;
        if (n >= 0 && n < m) return errf(r->err, r->errlen, "repetition {%ld,%ld} has max below min", m, n);
        if (n < 0) sbuf_printf(r->e, "{%ld,}", m);
        else sbuf_printf(r->e, "{%ld,%ld}", m, n);
        unbounded = n < 0;
        zero = m == 0;
    } else {
        return 0;
    }
    if (unbounded && *nullable)
        return errf(r->err, r->errlen, "the repetition at offset %zu repeats something that can match the empty string", at);
    *nullable |= zero;
    if (cur(r) == '?') r->i++;       /* lazy: the same strings */
    if (cur(r) && strchr("*+?{", cur(r))) return errf(r->err, r->errlen, "nothing to repeat at offset %zu", r->i);
    return 0;
}

/* One atom; *nullable: it can match the empty string (a group whose alternatives can). */
static int parse_atom(rx *r, int *nullable) {
    char c = cur(r);
    cpset set = {.n = 0};
    *nullable = 0;
    if (c == '(') {
        r->i++;
        if (cur(r) == '?') {
            if (r->i + 1 < r->n && r->s[r->i + 1] == ':') r->i += 2;
            else return errf(r->err, r->errlen, "lookaround and named groups are not supported");
        }
        if (++r->depth > NEST_MAX) return errf(r->err, r->errlen, "groups nested too deeply");
        sbuf_puts(r->e, "(");
        if (parse_alt(r, nullable)) return -1;
        if (cur(r) != ')') return errf(r->err, r->errlen, "missing ')'");
        r->i++;
        r->depth--;
        sbuf_puts(r->e, ")");
        return 0;
    }
    if (c == '[') {
        if (parse_class(r, &set)) return -1;
    } else if (c == '.') {
        r->i++;
        set_add(r, &set, '\n', '\n');
        set_add(r, &set, '\r', '\r');
        set_add(r, &set, 0x2028, 0x2029);
        if (set_complement(r, &set)) return -1;
    } else if (c == '\\') {
        r->i++;
        if (escape(r, &set, 0)) return -1;
    } else if (c == '^' || c == '$') {
        return errf(r->err, r->errlen, "anchors are supported only at the start and the end of the pattern");
    } else if (strchr("*+?{}]", c)) {
        return errf(r->err, r->errlen, "unexpected '%c' at offset %zu", c, r->i);
    } else {
        unsigned cp;
        if (utf8_char(r, &cp)) return -1;
        set_add(r, &set, cp, cp);
    }
    return emit_set(r, &set);
}

/* *nullable: every item of the sequence can match nothing. */
static int parse_seq(rx *r, int *nullable) {
    int items = 0;
    *nullable = 1;
    sbuf_puts(r->e, "(");
    while (!at_end(r) && cur(r) != '|' && cur(r) != ')') {
        int item;
        if (items++) sbuf_puts(r->e, " ");
        if (parse_atom(r, &item) || quantifier(r, &item)) return -1;
        *nullable &= item;
    }
    if (!items) sbuf_puts(r->e, "\"\"");
    sbuf_puts(r->e, ")");
    return 0;
}

/* *nullable: some alternative can match nothing. */
static int parse_alt(rx *r, int *nullable) {
    if (parse_seq(r, nullable)) return -1;
    while (cur(r) == '|') {
        int alt;
        r->i++;
        sbuf_puts(r->e, " | ");
        if (parse_seq(r, &alt)) return -1;
        *nullable |= alt;
    }
    return 0;
}

int json_pattern_expr(const char *re, const char *char_rule, int raw, sbuf *e, char *err, size_t errlen) {
    size_t n = strlen(re), start = 0;
    int head = n && re[0] == '^';
    if (head) start = 1;
    /* a final $ not escaped by an odd run of backslashes */
    size_t bs = 0;
    while (n >= 2 + bs && re[n - 2 - bs] == '\\') bs++;
    int tail = n > start && re[n - 1] == '$' && bs % 2 == 0;
    rx r = {.s = re + start, .n = n - start - (size_t)tail, .e = e, .raw = raw, .err = err, .errlen = errlen};
    if (!head) sbuf_printf(e, "%s* ", char_rule);
    int nullable;
    sbuf_puts(e, "(");
    if (parse_alt(&r, &nullable)) return -1;
    if (!at_end(&r)) return errf(err, errlen, "unmatched ')'");
    sbuf_puts(e, ")");
    if (!tail) sbuf_printf(e, " %s*", char_rule);
    return 0;
}
