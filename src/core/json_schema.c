/* json_schema.c — JSON Schema -> GBNF (see json_schema.h for what is supported and why the
 * grammar is never looser than the schema).
 *
 * gen() appends a GBNF expression for one schema to an sbuf, emitting the rules it needs into
 * the output as it goes (properties, items and $ref targets get named rules, so expressions stay
 * small and recursion through $ref works: a target's name is registered before its body is
 * generated). Errors carry the JSON pointer of the schema that caused them.
 */
#include "json_schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "util.h"

enum { DEPTH_MAX = 64, REFS_MAX = 256, COUNT_MAX = 4096, INT_DIGITS = 16 };
#define INT_CAP 9999999999999999LL      /* 16 digits: the largest integer generated */
#define NUM_BOUND_MAX 1e15              /* number bounds above this are refused */

typedef struct {
    char *ref;
    char name[96];
    int open;                         /* its body is being generated */
    int containers;                   /* jsg.containers when it opened */
} ref_rule;

typedef struct {
    sbuf *out;
    const char *base;
    const cJSON *root;
    int counter, depth;
    int containers;                   /* objects and arrays being generated: each writes "{" or "[" first */
    const char *tag_close;            /* tagged mode (json_schema_tagged_rules), else NULL */
    int top;                          /* generating the top-level value (not inside a container) */
    unsigned prims;                   /* PRIM_* rules already emitted */
    ref_rule refs[REFS_MAX];
    int nrefs;
    char *err;
    size_t errlen;
} jsg;

enum { PRIM_WS = 1, PRIM_CHAR = 2, PRIM_STRING = 4, PRIM_INT = 8, PRIM_NUMBER = 16, PRIM_VALUE = 32, PRIM_HEX = 64,
       PRIM_RAW = 128 };

static int gen(jsg *j, const cJSON *s, const char *ptr, sbuf *e);

static int fail(jsg *j, const char *ptr, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(jsg *j, const char *ptr, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return errf(j->err, j->errlen, "schema%s%s: %s", *ptr ? " at " : "", ptr, msg);
}

static void new_name(jsg *j, char *name, size_t cap) { snprintf(name, cap, "%s-%d", j->base, ++j->counter); }

/* ---- GBNF text helpers ---------------------------------------------------------------------- */

static int utf8_ok(const char *s) {
    unsigned cp;
    for (size_t n = strlen(s), i = 0, k; i < n; i += k)
        if (!(k = (size_t)utf8_decode_one(s + i, n - i, &cp))) return 0;
    return 1;
}

/* ---- tagged mode: the top-level value's JSON type named first, strings raw ------------------ */

static int tagged_top(const jsg *j) { return j->tag_close && j->top; }

/* The tag of a top-level value of JSON type `type` (integers are numbers). */
static void put_tag(jsg *j, const char *type, sbuf *e) {
    sbuf_printf(e, "\"%s\" %s ", strcmp(type, "integer") ? type : "number", j->tag_close);
}

/* The compact JSON text of v as a GBNF literal (a top-level value of a tagged rule: its tag,
 * then a string's text raw). */
static int put_json_literal(jsg *j, const cJSON *v, const char *ptr, sbuf *e) {
    if (tagged_top(j)) {
        static const struct { cJSON_bool (*is)(const cJSON *); const char *type; } kinds[] = {
            {cJSON_IsString, "string"}, {cJSON_IsNumber, "number"}, {cJSON_IsBool, "boolean"},
            {cJSON_IsNull, "null"}, {cJSON_IsArray, "array"}, {cJSON_IsObject, "object"}};
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
            if (kinds[i].is(v)) put_tag(j, kinds[i].type, e);
        if (cJSON_IsString(v))
            return gbnf_literal(e, v->valuestring) ? fail(j, ptr, "invalid UTF-8 in a string") : 0;
    }
    char *text = cJSON_PrintUnformatted(v);
    if (!text) return fail(j, ptr, "cannot serialize this value");
    int ok = gbnf_literal(e, text) == 0;
    free(text);
    return ok ? 0 : fail(j, ptr, "invalid UTF-8 in a string");
}

static const char *prim(jsg *j, unsigned which, char *name, size_t cap) {
    static const struct { unsigned bit; const char *suffix, *body; } defs[] = {
        {PRIM_WS, "ws", "| \" \" | \"\\n\" [ \\t]{0,8}"},
        {PRIM_HEX, "hex", "[0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}"},
        {PRIM_CHAR, "char", "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" %s-hex)"},
        {PRIM_STRING, "string", "\"\\\"\" %s-char* \"\\\"\""},
        {PRIM_INT, "integer", "\"-\"? (\"0\" | [1-9] [0-9]{0,15})"},
        {PRIM_NUMBER, "number", "%s-integer (\".\" [0-9]{1,15})? ([eE] [-+]? [0-9]{1,2})?"},
        {PRIM_VALUE, "value",
         "%s-object | %s-array | %s-string | %s-number | \"true\" | \"false\" | \"null\"\n"
         "%s-object ::= \"{\" %s-ws (%s-string %s-ws \":\" %s-ws %s-value %s-ws (\",\" %s-ws %s-string %s-ws \":\" "
         "%s-ws %s-value %s-ws)*)? \"}\"\n"
         "%s-array ::= \"[\" %s-ws (%s-value %s-ws (\",\" %s-ws %s-value %s-ws)*)? \"]\""},
        /* one character of a raw (unquoted) string: anything but NUL and the other C0 controls
         * apart from tab, newline and carriage return */
        {PRIM_RAW, "raw", "[^\\x00-\\x08\\x0B\\x0C\\x0E-\\x1F]"},
    };
    static const unsigned deps[] = {0, 0, PRIM_HEX, PRIM_CHAR, 0, PRIM_INT, PRIM_WS | PRIM_STRING | PRIM_NUMBER, 0};
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++) {
        if (defs[i].bit != which) continue;
        for (unsigned d = 1; d <= PRIM_RAW; d <<= 1)
            if (deps[i] & d) prim(j, d, name, cap);
        if (!(j->prims & which)) {
            j->prims |= which;
            sbuf_printf(j->out, "%s-%s ::= ", j->base, defs[i].suffix);
            /* every %s in a body is the base name */
            for (const char *p = defs[i].body; *p; p++) {
                if (p[0] == '%' && p[1] == 's') { sbuf_puts(j->out, j->base); p++; }
                else sbuf_put(j->out, p, 1);
            }
            sbuf_puts(j->out, "\n");
        }
        snprintf(name, cap, "%s-%s", j->base, defs[i].suffix);
        return name;
    }
    return "";
}

static void put_prim(jsg *j, unsigned which, sbuf *e) {
    char name[128];
    sbuf_printf(e, "%s", prim(j, which, name, sizeof name));
}

/* Any value at the top level: one tagged alternative per JSON type. */
static void put_tagged_any(jsg *j, sbuf *e) {
    char v[128], raw[128];
    prim(j, PRIM_VALUE, v, sizeof v);
    prim(j, PRIM_RAW, raw, sizeof raw);
    static const char *const types[] = {"object", "array", "string", "number", "boolean", "null"};
    sbuf_puts(e, "(");
    for (int i = 0; i < 6; i++) {
        sbuf_puts(e, i ? " | (" : "(");
        put_tag(j, types[i], e);
        if (i == 2) sbuf_printf(e, "%s*", raw);
        else if (i == 4) sbuf_puts(e, "(\"true\" | \"false\")");
        else if (i == 5) sbuf_puts(e, "\"null\"");
        else sbuf_printf(e, "%s-%s", j->base, types[i]);
        sbuf_puts(e, ")");
    }
    sbuf_puts(e, ")");
}

/* The quotes around a string: none for a raw top-level string. */
static void put_quote(const jsg *j, sbuf *e) {
    if (!tagged_top(j)) sbuf_puts(e, " \"\\\"\" ");
}

/* Generate schema s as its own rule; name receives the rule name. */
static int rule_for(jsg *j, const cJSON *s, const char *ptr, char *name, size_t cap) {
    new_name(j, name, cap);
    sbuf body = {0};
    int rc = gen(j, s, ptr, &body);
    if (!rc) sbuf_printf(j->out, "%s ::= %s\n", name, body.p);
    sbuf_free(&body);
    return rc;
}

static void child_ptr(char *out, size_t cap, const char *ptr, const char *a, const char *b) {
    snprintf(out, cap, "%s/%s%s%s", ptr, a, b ? "/" : "", b ? b : "");
}

/* ---- keywords ------------------------------------------------------------------------------ */

static const char *const annotations[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL};
static const char *const supported[] = {"type", "enum", "const", "properties", "required", "additionalProperties",
                                        "items", "prefixItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf",
                                        "$ref", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
                                        "exclusiveMinimum", "exclusiveMaximum", "uniqueItems", NULL};

static int listed(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k)) return 1;
    return 0;
}

static int check_keywords(jsg *j, const cJSON *s, const char *ptr) {
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        if (listed(annotations, k->string)) continue;
        if (!listed(supported, k->string)) return fail(j, ptr, "unsupported keyword '%s'", k->string);
        if (!strcmp(k->string, "uniqueItems") && !cJSON_IsFalse(k))
            return fail(j, ptr, "unsupported keyword 'uniqueItems' (only false is supported)");
    }
    return 0;
}

/* The only keywords of s are `allowed` ones and annotations. */
static int only(jsg *j, const cJSON *s, const char *ptr, const char *what, const char *const *allowed) {
    const cJSON *k;
    cJSON_ArrayForEach(k, s)
        if (!listed(annotations, k->string) && !listed(allowed, k->string))
            return fail(j, ptr, "keyword '%s' next to '%s' is not supported", k->string, what);
    return 0;
}

static const cJSON *get(const cJSON *s, const char *k) { return cJSON_GetObjectItemCaseSensitive(s, k); }

/* A non-negative integer keyword; *out untouched when absent. */
static int count_kw(jsg *j, const cJSON *s, const char *k, const char *ptr, long *out) {
    const cJSON *v = get(s, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return fail(j, ptr, "'%s' must be a non-negative integer", k);
    if (v->valuedouble > COUNT_MAX) return fail(j, ptr, "'%s' above %d is not supported", k, COUNT_MAX);
    *out = (long)v->valuedouble;
    return 0;
}

/* ---- $ref ---------------------------------------------------------------------------------- */

static const cJSON *resolve(jsg *j, const char *ref, const char *ptr) {
    if (ref[0] != '#') {
        fail(j, ptr, "$ref '%s': only references inside the schema (#...) are supported", ref);
        return NULL;
    }
    const cJSON *at = j->root;
    for (const char *p = ref + 1; *p && at;) {
        if (*p != '/') break;
        p++;
        char seg[256];
        size_t n = 0;
        for (; *p && *p != '/' && n + 1 < sizeof seg; p++) {
            if (p[0] == '~' && p[1] == '0') { seg[n++] = '~'; p++; }
            else if (p[0] == '~' && p[1] == '1') { seg[n++] = '/'; p++; }
            else seg[n++] = *p;
        }
        seg[n] = 0;
        at = cJSON_IsArray(at) ? cJSON_GetArrayItem(at, atoi(seg)) : get(at, seg);
    }
    if (!at) fail(j, ptr, "$ref '%s' does not point into the schema", ref);
    return at;
}

static int gen_ref(jsg *j, const cJSON *s, const char *ptr, sbuf *e) {
    const cJSON *r = get(s, "$ref");
    static const char *const alone[] = {"$ref", NULL};
    if (!cJSON_IsString(r)) return fail(j, ptr, "'$ref' must be a string");
    if (only(j, s, ptr, "$ref", alone)) return -1;
    /* a target at the top level of a tagged value is its own rule (tagged, strings raw) */
    char key[300];
    snprintf(key, sizeof key, "%s%s", tagged_top(j) ? "@top" : "", r->valuestring);
    for (int i = 0; i < j->nrefs; i++) {
        if (strcmp(j->refs[i].ref, key)) continue;
        /* back to a target still open with no "{" or "[" written since: a left-recursive rule */
        if (j->refs[i].open && j->refs[i].containers == j->containers)
            return fail(j, ptr, "$ref '%s' refers back to itself before matching anything", r->valuestring);
        sbuf_puts(e, j->refs[i].name);
        return 0;
    }
    if (j->nrefs == REFS_MAX) return fail(j, ptr, "more than %d distinct $ref targets", REFS_MAX);
    const cJSON *target = resolve(j, r->valuestring, ptr);
    if (!target) return -1;
    ref_rule *rr = &j->refs[j->nrefs++];
    rr->ref = xstrdup(key);
    new_name(j, rr->name, sizeof rr->name);
    char name[96];
    snprintf(name, sizeof name, "%s", rr->name);
    sbuf body = {0};
    rr->open = 1;
    rr->containers = j->containers;
    int rc = gen(j, target, r->valuestring + 1, &body);
    rr->open = 0;
    if (!rc) sbuf_printf(j->out, "%s ::= %s\n", name, body.p);
    sbuf_free(&body);
    if (!rc) sbuf_puts(e, name);
    return rc;
}

/* ---- enum / const ------------------------------------------------------------------------- */

static int type_matches(const char *type, const cJSON *v) {
    if (!strcmp(type, "string")) return cJSON_IsString(v);
    if (!strcmp(type, "number")) return cJSON_IsNumber(v);
    if (!strcmp(type, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(type, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(type, "null")) return cJSON_IsNull(v);
    if (!strcmp(type, "object")) return cJSON_IsObject(v);
    if (!strcmp(type, "array")) return cJSON_IsArray(v);
    return 0;
}

/* v fits s's `type` (absent: any). */
static int fits_type(const cJSON *s, const cJSON *v) {
    const cJSON *t = get(s, "type");
    if (!t) return 1;
    if (cJSON_IsString(t)) return type_matches(t->valuestring, v);
    const cJSON *x;
    cJSON_ArrayForEach(x, t) if (cJSON_IsString(x) && type_matches(x->valuestring, v)) return 1;
    return 0;
}

static int gen_enum(jsg *j, const cJSON *s, const char *ptr, sbuf *e) {
    static const char *const with[] = {"enum", "const", "type", NULL};
    if (only(j, s, ptr, get(s, "const") ? "const" : "enum", with)) return -1;
    const cJSON *c = get(s, "const"), *en = get(s, "enum");
    if (en && (!cJSON_IsArray(en) || !cJSON_GetArraySize(en))) return fail(j, ptr, "'enum' must be a non-empty array");
    int n = 0;
    sbuf_puts(e, "(");
    const cJSON *v;
    if (!c) cJSON_ArrayForEach(v, en) {
        if (!fits_type(s, v)) continue;
        if (n++) sbuf_puts(e, " | ");
        if (put_json_literal(j, v, ptr, e)) return -1;
    }
    if (c) {
        int in_enum = !en;
        cJSON_ArrayForEach(v, en) in_enum |= cJSON_Compare(v, c, 1);
        if (!in_enum || !fits_type(s, c)) return fail(j, ptr, "'const' contradicts 'enum' or 'type': nothing validates");
        if (put_json_literal(j, c, ptr, e)) return -1;
        n = 1;
    }
    sbuf_puts(e, ")");
    return n ? 0 : fail(j, ptr, "no 'enum' value has the schema's 'type': nothing validates");
}

/* ---- integers and numbers ----------------------------------------------------------------- */

static long long pow10ll(int n) {
    long long p = 1;
    while (n--) p *= 10;
    return p;
}

static int digits(long long x) {
    int n = 1;
    while (x >= 10) { x /= 10; n++; }
    return n;
}

/* Decimal strings of exactly L digits (leading zeros allowed) with value in [x, y]. */
static void fixed_range(sbuf *e, long long x, long long y, int L) {
    if (L == 1) { sbuf_printf(e, "[%lld-%lld]", x, y); return; }
    long long p = pow10ll(L - 1);
    long long dx = x / p, dy = y / p, rx = x % p, ry = y % p;
    if (rx == 0 && ry == p - 1) { sbuf_printf(e, "[%lld-%lld] [0-9]{%d}", dx, dy, L - 1); return; }
    if (dx == dy) {
        sbuf_printf(e, "\"%lld\" (", dx);
        fixed_range(e, rx, ry, L - 1);
        sbuf_puts(e, ")");
        return;
    }
    sbuf_printf(e, "\"%lld\" (", dx);
    fixed_range(e, rx, p - 1, L - 1);
    sbuf_puts(e, ")");
    if (dx + 1 <= dy - 1) sbuf_printf(e, " | [%lld-%lld] [0-9]{%d}", dx + 1, dy - 1, L - 1);
    sbuf_printf(e, " | \"%lld\" (", dy);
    fixed_range(e, 0, ry, L - 1);
    sbuf_puts(e, ")");
}

/* Non-negative integers in [a, b] written without leading zeros, as alternatives. */
static void nonneg_range(sbuf *e, long long a, long long b, int *n) {
    for (int L = digits(a); L <= digits(b); L++) {
        long long lo = MAX(a, L == 1 ? 0 : pow10ll(L - 1)), hi = MIN(b, pow10ll(L) - 1);
        if (lo > hi) continue;
        sbuf_puts(e, (*n)++ ? " | (" : "(");
        fixed_range(e, lo, hi, L);
        sbuf_puts(e, ")");
    }
}

static int gen_integer_range(jsg *j, long long lo, long long hi, const char *ptr, sbuf *e) {
    if (lo > hi) return fail(j, ptr, "the integer bounds leave no value");
    int n = 0;
    sbuf_puts(e, "(");
    if (lo < 0) {
        sbuf_puts(e, "\"-\" (");
        int m = 0;
        nonneg_range(e, MAX(1, -hi), -lo, &m);
        sbuf_puts(e, ")");
        n++;
    }
    if (hi >= 0) nonneg_range(e, MAX(0, lo), hi, &n);
    sbuf_puts(e, ")");
    return 0;
}

typedef struct {
    double lo, hi;
    int lo_incl, hi_incl;
} bounds;

static int read_bounds(jsg *j, const cJSON *s, const char *ptr, bounds *b) {
    *b = (bounds){-INFINITY, INFINITY, 1, 1};
    static const char *const kw[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++) {
        const cJSON *v = get(s, kw[i]);
        if (!v) continue;
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
            return fail(j, ptr, "'%s' must be a number (boolean exclusive bounds are draft-04, not supported)", kw[i]);
        double x = v->valuedouble;
        int excl = i == 1 || i == 3;
        if (i < 2 && (x > b->lo || (x == b->lo && excl))) { b->lo = x; b->lo_incl = !excl; }
        if (i >= 2 && (x < b->hi || (x == b->hi && excl))) { b->hi = x; b->hi_incl = !excl; }
    }
    return 0;
}

static int gen_integer(jsg *j, const cJSON *s, const char *ptr, sbuf *e) {
    bounds b;
    if (read_bounds(j, s, ptr, &b)) return -1;
    if (isinf(b.lo) && isinf(b.hi)) { put_prim(j, PRIM_INT, e); return 0; }
    double lo = isinf(b.lo) ? (double)-INT_CAP : b.lo_incl ? ceil(b.lo) : floor(b.lo) + 1;
    double hi = isinf(b.hi) ? (double)INT_CAP : b.hi_incl ? floor(b.hi) : ceil(b.hi) - 1;
    lo = MAX(lo, (double)-INT_CAP);
    hi = MIN(hi, (double)INT_CAP);
    /* checked before the casts: a bound past the cap (maximum -1e70) is not a long long */
    if (lo > hi) return fail(j, ptr, "the integer bounds leave no value of at most 16 digits");
    return gen_integer_range(j, (long long)lo, (long long)hi, ptr, e);
}

/* Decimal magnitudes I[.F] in the range from A to B (B < 0: unbounded), as alternatives. */
static void magnitude(sbuf *e, long long A, int incA, long long B, int incB, int *n) {
    static const char frac[] = " (\".\" [0-9]{1,15})?", nzfrac[] = " \".\" [0-9]{0,14} [1-9]", zfrac[] = " (\".\" \"0\"{1,15})?";
    if (B >= 0 && A == B) {
        if (incA && incB) sbuf_printf(e, "%s\"%lld\"%s", (*n)++ ? " | " : "", A, zfrac);
        return;
    }
    sbuf_printf(e, "%s\"%lld\"%s", (*n)++ ? " | " : "", A, incA ? frac : nzfrac);
    long long top = B < 0 ? (long long)NUM_BOUND_MAX - 1 : B - 1;
    if (A + 1 <= top) {
        int m = 0;
        sbuf_puts(e, " | ((");
        nonneg_range(e, A + 1, top, &m);
        sbuf_printf(e, ")%s)", frac);
    }
    if (B >= 0 && incB) sbuf_printf(e, " | \"%lld\"%s", B, zfrac);
}

static int gen_number(jsg *j, const cJSON *s, const char *ptr, sbuf *e) {
    bounds b;
    if (read_bounds(j, s, ptr, &b)) return -1;
    if (isinf(b.lo) && isinf(b.hi)) { put_prim(j, PRIM_NUMBER, e); return 0; }
    double lim[2] = {b.lo, b.hi};
    for (int i = 0; i < 2; i++)
        if (isfinite(lim[i]) && (lim[i] != floor(lim[i]) || fabs(lim[i]) >= NUM_BOUND_MAX))
            return fail(j, ptr, "number bounds must be integers below 1e15 in magnitude (got %g); use type integer or "
                                "integer-valued bounds", lim[i]);
    int n = 0;
    sbuf_puts(e, "(");
    if (!(b.hi < 0)) {
        long long A = b.lo > 0 ? (long long)b.lo : 0;
        int incA = b.lo > 0 ? b.lo_incl : b.lo < 0 || b.lo_incl;
        long long B = isinf(b.hi) ? -1 : (long long)b.hi;
        if (B < 0 || A < B || (A == B && incA && b.hi_incl)) magnitude(e, A, incA, B, b.hi_incl, &n);
    }
    if (b.lo < 0) {
        long long A = b.hi >= 0 ? 0 : (long long)-b.hi;
        int incA = b.hi >= 0 ? 0 : b.hi_incl;
        long long B = isinf(b.lo) ? -1 : (long long)-b.lo;
        if (B < 0 || A < B || (A == B && incA && b.lo_incl)) {
            sbuf_puts(e, n ? " | \"-\" (" : "\"-\" (");
            int m = 0;
            magnitude(e, A, incA, B, b.lo_incl, &m);
            sbuf_puts(e, ")");
            n++;
        }
    }
    sbuf_puts(e, ")");
    return n ? 0 : fail(j, ptr, "the number bounds leave no value");
}

/* ---- strings -------------------------------------------------------------------------------- */

typedef struct {
    const char *name, *body;
} format_def;

/* Each is exactly what the common validators (ajv-formats "full") accept, or a subset of it. */
static const format_def formats[] = {
    {"date", "%s-year \"-\" (\"0\" [13578] \"-\" %s-d31 | \"1\" [02] \"-\" %s-d31 | \"0\" [469] \"-\" %s-d30 | "
             "\"11-\" %s-d30 | \"02-\" %s-d28) | %s-leap \"-02-29\"\n"
             "%s-year ::= [0-9]{4}\n"
             "%s-d28 ::= \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]\n"
             "%s-d30 ::= %s-d28 | \"29\" | \"30\"\n"
             "%s-d31 ::= %s-d30 | \"31\"\n"
             "%s-leap ::= [0-9] [0-9] (\"0\" [48] | [2468] [048] | [13579] [26]) | (\"0\" [48] | [2468] [048] | [13579] "
             "[26]) \"00\""},
    {"time", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,9})? (\"Z\" | [+-] ([01] "
             "[0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
    {"uuid", "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}"},
    {"email", "%s-atom (\".\" %s-atom)* \"@\" (%s-label \".\")+ %s-label\n"
              "%s-atom ::= [a-z0-9!#$%&'*+/=?^_`{|}~-]{1,16}\n"
              "%s-label ::= [a-z0-9] ([a-z0-9-]{0,14} [a-z0-9])?"},
    {"ipv4", "%s-octet \".\" %s-octet \".\" %s-octet \".\" %s-octet\n"
             "%s-octet ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9]? [0-9]"},
};

static int gen_format(jsg *j, const char *fmt, const char *ptr, sbuf *e) {
    char base[96];
    if (!strcmp(fmt, "date-time")) {
        put_quote(j, e);
        char d[96], t[96];
        snprintf(d, sizeof d, "%s-date", j->base);
        snprintf(t, sizeof t, "%s-time", j->base);
        /* both rules are emitted at most once per grammar, like the primitives */
        for (int i = 0; i < 2; i++) {
            const format_def *f = &formats[i];
            char ref[32];
            snprintf(ref, sizeof ref, "@%s", f->name);
            int have = 0;
            for (int k = 0; k < j->nrefs; k++) have |= !strcmp(j->refs[k].ref, ref);
            if (!have && j->nrefs < REFS_MAX) {
                ref_rule *rr = &j->refs[j->nrefs++];
                rr->ref = xstrdup(ref);
                snprintf(rr->name, sizeof rr->name, "%s", i ? t : d);
                sbuf_printf(j->out, "%s ::= ", rr->name);
                for (const char *p = f->body; *p; p++) {
                    if (p[0] == '%' && p[1] == 's') { sbuf_puts(j->out, rr->name); p++; }
                    else sbuf_put(j->out, p, 1);
                }
                sbuf_puts(j->out, "\n");
            }
        }
        sbuf_printf(e, "%s \"T\" %s", d, t);
        put_quote(j, e);
        return 0;
    }
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        if (strcmp(formats[i].name, fmt)) continue;
        new_name(j, base, sizeof base);
        sbuf_printf(j->out, "%s ::= ", base);
        for (const char *p = formats[i].body; *p; p++) {
            if (p[0] == '%' && p[1] == 's') { sbuf_puts(j->out, base); p++; }
            else sbuf_put(j->out, p, 1);
        }
        sbuf_puts(j->out, "\n");
        put_quote(j, e);
        sbuf_puts(e, base);
        put_quote(j, e);
        return 0;
    }
    return fail(j, ptr, "unsupported format '%s' (supported: date, time, date-time, uuid, email, ipv4)", fmt);
}

static int gen_string(jsg *j, const cJSON *s, const char *ptr, sbuf *e) {
    const cJSON *fmt = get(s, "format"), *pat = get(s, "pattern");
    long minl = 0, maxl = -1;
    if (count_kw(j, s, "minLength", ptr, &minl) || count_kw(j, s, "maxLength", ptr, &maxl)) return -1;
    int lengths = get(s, "minLength") || get(s, "maxLength");
    if (fmt && (pat || lengths)) return fail(j, ptr, "'format' together with 'pattern' or a length is not supported");
    if (pat && lengths) return fail(j, ptr, "'pattern' together with 'minLength'/'maxLength' is not supported");
    if (fmt) {
        if (!cJSON_IsString(fmt)) return fail(j, ptr, "'format' must be a string");
        return gen_format(j, fmt->valuestring, ptr, e);
    }
    char cname[128];
    int raw = tagged_top(j);
    prim(j, raw ? PRIM_RAW : PRIM_CHAR, cname, sizeof cname);
    put_quote(j, e);
    if (pat) {
        if (!cJSON_IsString(pat) || !utf8_ok(pat->valuestring)) return fail(j, ptr, "'pattern' must be a string");
        char perr[200];
        sbuf_puts(e, "(");
        if (json_pattern_expr(pat->valuestring, cname, raw, e, perr, sizeof perr)) return fail(j, ptr, "pattern: %s", perr);
        sbuf_puts(e, ")");
    } else {
        if (maxl >= 0 && maxl < minl) return fail(j, ptr, "'maxLength' is below 'minLength': nothing validates");
        if (maxl < 0) sbuf_printf(e, "%s{%ld,}", cname, minl);
        else sbuf_printf(e, "%s{%ld,%ld}", cname, minl, maxl);
    }
    put_quote(j, e);
    return 0;
}

/* ---- arrays --------------------------------------------------------------------------------- */

static int gen_array(jsg *j, const cJSON *s, const char *ptr, sbuf *e) {
    const cJSON *prefix = get(s, "prefixItems"), *items = get(s, "items");
    long minI = 0, maxI = -1;
    if (count_kw(j, s, "minItems", ptr, &minI) || count_kw(j, s, "maxItems", ptr, &maxI)) return -1;
    if (cJSON_IsArray(items) && !prefix) { prefix = items; items = NULL; }   /* draft-07 tuples */
    else if (cJSON_IsArray(items)) return fail(j, ptr, "'items' must be a schema when 'prefixItems' is given");
    if (prefix && !cJSON_IsArray(prefix)) return fail(j, ptr, "'prefixItems' must be an array of schemas");
    if (maxI >= 0 && maxI < minI) return fail(j, ptr, "'maxItems' is below 'minItems': nothing validates");
    char ws[96], pp[300], name[96];
    prim(j, PRIM_WS, ws, sizeof ws);
    int k = prefix ? cJSON_GetArraySize(prefix) : 0;
    if (maxI >= 0 && k > maxI) k = (int)maxI;
    int extras = !cJSON_IsFalse(items);
    long emin = MAX(0, minI - k), emax = maxI < 0 ? -1 : maxI - k;
    if (!extras && emin > 0) return fail(j, ptr, "'minItems' exceeds 'prefixItems' while 'items' is false");
    sbuf_printf(e, "\"[\" %s", ws);
    for (int i = 0; i < k; i++) {
        char idx[16];
        snprintf(idx, sizeof idx, "%d", i);
        child_ptr(pp, sizeof pp, ptr, "prefixItems", idx);
        if (rule_for(j, cJSON_GetArrayItem(prefix, i), pp, name, sizeof name)) return -1;
        sbuf_printf(e, "%s %s %s ", i ? " \",\"" : "", i ? ws : "", name);
        sbuf_puts(e, ws);
    }
    if (extras && emax != 0) {
        child_ptr(pp, sizeof pp, ptr, "items", NULL);
        if (items && !cJSON_IsTrue(items)) {
            if (rule_for(j, items, pp, name, sizeof name)) return -1;
        } else {
            prim(j, PRIM_VALUE, name, sizeof name);
        }
        char more[64];
        if (k > 0) {
            if (emax < 0) snprintf(more, sizeof more, "{%ld,}", emin);
            else snprintf(more, sizeof more, "{%ld,%ld}", emin, emax);
            sbuf_printf(e, " (\",\" %s %s %s)%s", ws, name, ws, more);
        } else {
            long rmin = MAX(0, emin - 1);
            if (emax < 0) snprintf(more, sizeof more, "{%ld,}", rmin);
            else snprintf(more, sizeof more, "{%ld,%ld}", rmin, emax - 1);
            sbuf_printf(e, " (%s %s (\",\" %s %s %s)%s)%s", name, ws, ws, name, ws, more, emin ? "" : "?");
        }
    }
    sbuf_puts(e, " \"]\"");
    return 0;
}

/* ---- objects -------------------------------------------------------------------------------- */

typedef struct {
    const char *key;
    const cJSON *schema;          /* NULL: any value (required but undeclared) */
    int required;
} prop;

static int is_required(const cJSON *req, const char *key) {
    const cJSON *r;
    cJSON_ArrayForEach(r, req) if (cJSON_IsString(r) && !strcmp(r->valuestring, key)) return 1;
    return 0;
}

static int gen_object(jsg *j, const cJSON *s, const char *ptr, sbuf *e) {
    const cJSON *props = get(s, "properties"), *req = get(s, "required"), *addl = get(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(j, ptr, "'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return fail(j, ptr, "'required' must be an array of strings");
    const cJSON *x;
    cJSON_ArrayForEach(x, req) if (!cJSON_IsString(x)) return fail(j, ptr, "'required' must be an array of strings");
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        return fail(j, ptr, "'additionalProperties' must be a boolean or a schema");
    char ws[96], str[96], pp[300], name[96];
    prim(j, PRIM_WS, ws, sizeof ws);
    int n = 0;
    prop *list = xcalloc((size_t)(cJSON_GetArraySize(props) + cJSON_GetArraySize(req) + 1), sizeof *list);
    cJSON_ArrayForEach(x, props) list[n++] = (prop){x->string, x, is_required(req, x->string)};
    cJSON_ArrayForEach(x, req) {
        int declared = 0;
        for (int i = 0; i < n; i++) declared |= !strcmp(list[i].key, x->valuestring);
        if (!declared) list[n++] = (prop){x->valuestring, NULL, 1};
    }
    int rc = 0;
    if (n == 0) {
        if (cJSON_IsFalse(addl)) sbuf_printf(e, "\"{\" %s \"}\"", ws);
        else {
            if (addl && !cJSON_IsTrue(addl)) {
                child_ptr(pp, sizeof pp, ptr, "additionalProperties", NULL);
                rc = rule_for(j, addl, pp, name, sizeof name);
            } else {
                prim(j, PRIM_VALUE, name, sizeof name);
            }
            prim(j, PRIM_STRING, str, sizeof str);
            if (!rc)
                sbuf_printf(e, "\"{\" %s (%s %s \":\" %s %s %s (\",\" %s %s %s \":\" %s %s %s)*)? \"}\"", ws, str, ws,
                            ws, name, ws, ws, str, ws, ws, name, ws);
        }
        free(list);
        return rc;
    }
    /* L_i: properties i.. with none written yet; R_i: the same after one was (commas first) */
    char chain[96];
    new_name(j, chain, sizeof chain);
    sbuf_printf(j->out, "%s-L%d ::= \"\"\n%s-R%d ::= \"\"\n", chain, n, chain, n);
    for (int i = n - 1; i >= 0 && !rc; i--) {
        if (!utf8_ok(list[i].key)) { rc = fail(j, ptr, "invalid UTF-8 in a property name"); break; }
        if (list[i].schema) {
            child_ptr(pp, sizeof pp, ptr, "properties", list[i].key);
            if ((rc = rule_for(j, list[i].schema, pp, name, sizeof name))) break;
        } else {
            prim(j, PRIM_VALUE, name, sizeof name);
        }
        sbuf kv = {0};
        cJSON *k = cJSON_CreateString(list[i].key);
        rc = put_json_literal(j, k, ptr, &kv);
        cJSON_Delete(k);
        sbuf_printf(&kv, " %s \":\" %s %s %s", ws, ws, name, ws);
        if (!rc) {
            sbuf_printf(j->out, "%s-L%d ::= %s %s-R%d", chain, i, kv.p, chain, i + 1);
            if (!list[i].required) sbuf_printf(j->out, " | %s-L%d", chain, i + 1);
            sbuf_printf(j->out, "\n%s-R%d ::= \",\" %s %s %s-R%d", chain, i, ws, kv.p, chain, i + 1);
            if (!list[i].required) sbuf_printf(j->out, " | %s-R%d", chain, i + 1);
            sbuf_puts(j->out, "\n");
        }
        sbuf_free(&kv);
    }
    free(list);
    if (!rc) sbuf_printf(e, "\"{\" %s %s-L0 \"}\"", ws, chain);
    return rc;
}

/* ---- combinators ------------------------------------------------------------------------------ */

/* The schema a branch stands for (following one $ref). */
static const cJSON *deref(jsg *j, const cJSON *s, const char *ptr) {
    const cJSON *r = get(s, "$ref");
    return cJSON_IsString(r) ? resolve(j, r->valuestring, ptr) : s;
}

static const char *single_type(const cJSON *s) {
    const cJSON *t = get(s, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* Can no JSON value validate against two branches of this oneOf? (The cases we can tell.) */
static int disjoint(jsg *j, const cJSON *branches, const char *ptr) {
    int n = cJSON_GetArraySize(branches), types = 1, consts = 1;
    const cJSON *b[n > 0 ? n : 1];
    for (int i = 0; i < n; i++)
        if (!(b[i] = deref(j, cJSON_GetArrayItem(branches, i), ptr))) return -1;
    for (int i = 0; i < n; i++)
        for (int k = i + 1; k < n; k++) {
            const char *ti = single_type(b[i]), *tk = single_type(b[k]);
            int num = ti && tk && ((!strcmp(ti, "integer") && !strcmp(tk, "number")) || (!strcmp(ti, "number") && !strcmp(tk, "integer")));
            if (!ti || !tk || !strcmp(ti, tk) || num) types = 0;
            const cJSON *ci = get(b[i], "const"), *ck = get(b[k], "const");
            if (!ci || !ck || cJSON_Compare(ci, ck, 1)) consts = 0;
        }
    if (types || consts) return 1;
    /* objects told apart by a required property with a const in every branch */
    const cJSON *p0 = get(b[0], "properties"), *key;
    cJSON_ArrayForEach(key, p0) {
        int ok = 1;
        for (int i = 0; ok && i < n; i++) {
            const cJSON *pi = get(get(b[i], "properties"), key->string);
            ok = pi && get(pi, "const") && is_required(get(b[i], "required"), key->string);
            for (int k = 0; ok && k < i; k++)
                ok = !cJSON_Compare(get(get(get(b[k], "properties"), key->string), "const"), get(pi, "const"), 1);
        }
        if (ok) return 1;
    }
    return 0;
}

static int gen_any_of(jsg *j, const cJSON *s, const char *kw, const char *ptr, sbuf *e) {
    const cJSON *br = get(s, kw);
    const char *const with[] = {kw, NULL};
    if (only(j, s, ptr, kw, with)) return -1;
    if (!cJSON_IsArray(br) || !cJSON_GetArraySize(br)) return fail(j, ptr, "'%s' must be a non-empty array", kw);
    if (!strcmp(kw, "oneOf")) {
        int d = disjoint(j, br, ptr);
        if (d < 0) return -1;
        if (!d)
            return fail(j, ptr, "'oneOf' is supported only for branches of distinct types, distinct 'const' values, or "
                                "objects told apart by a required 'const' property");
    }
    sbuf_puts(e, "(");
    int i = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, br) {
        char pp[300], idx[16], name[96];
        snprintf(idx, sizeof idx, "%d", i);
        child_ptr(pp, sizeof pp, ptr, kw, idx);
        if (rule_for(j, b, pp, name, sizeof name)) return -1;
        sbuf_printf(e, "%s%s", i++ ? " | " : "", name);
    }
    sbuf_puts(e, ")");
    return 0;
}

/* allOf: the branches (and the schema around them) merged into one object schema. */
static int gen_all_of(jsg *j, const cJSON *s, const char *ptr, sbuf *e) {
    const cJSON *br = get(s, "allOf");
    if (!cJSON_IsArray(br) || !cJSON_GetArraySize(br)) return fail(j, ptr, "'allOf' must be a non-empty array");
    cJSON *m = cJSON_CreateObject(), *props = NULL, *req = NULL;
    int rc = 0, n = cJSON_GetArraySize(br);
    for (int i = -1; i < n && !rc; i++) {
        const cJSON *part = i < 0 ? s : deref(j, cJSON_GetArrayItem(br, i), ptr);
        if (!part) { rc = -1; break; }
        if (!cJSON_IsObject(part)) { rc = fail(j, ptr, "'allOf' branches must be schema objects"); break; }
        const cJSON *k;
        cJSON_ArrayForEach(k, part) {
            if (!strcmp(k->string, "allOf") || listed(annotations, k->string)) continue;
            if (!strcmp(k->string, "properties") && cJSON_IsObject(k)) {
                if (!props) props = cJSON_AddObjectToObject(m, "properties");
                const cJSON *p;
                cJSON_ArrayForEach(p, k) {
                    if (get(props, p->string)) { rc = fail(j, ptr, "'allOf': property '%s' is declared in more than one branch", p->string); break; }
                    cJSON_AddItemToObject(props, p->string, cJSON_Duplicate(p, 1));
                }
            } else if (!strcmp(k->string, "required") && cJSON_IsArray(k)) {
                if (!req) req = cJSON_AddArrayToObject(m, "required");
                const cJSON *r;
                cJSON_ArrayForEach(r, k) cJSON_AddItemToArray(req, cJSON_Duplicate(r, 1));
            } else if (get(m, k->string)) {
                if (!cJSON_Compare(get(m, k->string), k, 1))
                    rc = fail(j, ptr, "'allOf': keyword '%s' appears in more than one branch with different values", k->string);
            } else {
                cJSON_AddItemToObject(m, k->string, cJSON_Duplicate(k, 1));
            }
            if (rc) break;
        }
    }
    if (!rc) rc = gen(j, m, ptr, e);
    cJSON_Delete(m);
    return rc;
}

/* ---- dispatch --------------------------------------------------------------------------------- */

static int gen_untagged_type(jsg *j, const char *t, const cJSON *s, const char *ptr, sbuf *e);

/* A value of type t; at the top level of a tagged rule its tag first, and what it contains is
 * not at the top level any more. */
static int gen_type(jsg *j, const char *t, const cJSON *s, const char *ptr, sbuf *e) {
    if (!tagged_top(j)) return gen_untagged_type(j, t, s, ptr, e);
    sbuf_puts(e, "(");
    put_tag(j, t, e);
    j->top = !strcmp(t, "string");
    int rc = gen_untagged_type(j, t, s, ptr, e);
    j->top = 1;
    sbuf_puts(e, ")");
    return rc;
}

static int gen_untagged_type(jsg *j, const char *t, const cJSON *s, const char *ptr, sbuf *e) {
    if (!strcmp(t, "string")) return gen_string(j, s, ptr, e);
    if (!strcmp(t, "integer")) return gen_integer(j, s, ptr, e);
    if (!strcmp(t, "number")) return gen_number(j, s, ptr, e);
    if (!strcmp(t, "object") || !strcmp(t, "array")) {
        j->containers++;
        int rc = (t[0] == 'o' ? gen_object : gen_array)(j, s, ptr, e);
        j->containers--;
        return rc;
    }
    if (!strcmp(t, "boolean")) { sbuf_puts(e, "(\"true\" | \"false\")"); return 0; }
    if (!strcmp(t, "null")) { sbuf_puts(e, "\"null\""); return 0; }
    return fail(j, ptr, "unknown type '%s'", t);
}

/* The type a schema without `type` stands for, from its keywords; NULL = any value. */
static const char *implied_type(const cJSON *s) {
    static const struct { const char *kw, *type; } by_kw[] = {
        {"properties", "object"}, {"required", "object"}, {"additionalProperties", "object"},
        {"items", "array"}, {"prefixItems", "array"}, {"minItems", "array"}, {"maxItems", "array"},
        {"minLength", "string"}, {"maxLength", "string"}, {"pattern", "string"}, {"format", "string"},
        {"minimum", "number"}, {"maximum", "number"}, {"exclusiveMinimum", "number"}, {"exclusiveMaximum", "number"},
    };
    for (size_t i = 0; i < sizeof by_kw / sizeof by_kw[0]; i++)
        if (get(s, by_kw[i].kw)) return by_kw[i].type;
    return NULL;
}

static void put_any(jsg *j, sbuf *e) {
    if (tagged_top(j)) put_tagged_any(j, e);
    else put_prim(j, PRIM_VALUE, e);
}

static int gen_body(jsg *j, const cJSON *s, const char *ptr, sbuf *e) {
    if (cJSON_IsTrue(s)) { put_any(j, e); return 0; }
    if (cJSON_IsFalse(s)) return fail(j, ptr, "schema false: nothing validates");
    if (!cJSON_IsObject(s)) return fail(j, ptr, "a schema must be an object or a boolean");
    if (check_keywords(j, s, ptr)) return -1;
    if (get(s, "$ref")) return gen_ref(j, s, ptr, e);
    if (get(s, "allOf")) return gen_all_of(j, s, ptr, e);
    if (get(s, "anyOf")) return gen_any_of(j, s, "anyOf", ptr, e);
    if (get(s, "oneOf")) return gen_any_of(j, s, "oneOf", ptr, e);
    if (get(s, "enum") || get(s, "const")) return gen_enum(j, s, ptr, e);
    const cJSON *t = get(s, "type");
    if (!t) {
        const char *implied = implied_type(s);
        if (!implied) { put_any(j, e); return 0; }
        return gen_type(j, implied, s, ptr, e);
    }
    if (cJSON_IsString(t)) return gen_type(j, t->valuestring, s, ptr, e);
    if (!cJSON_IsArray(t) || !cJSON_GetArraySize(t)) return fail(j, ptr, "'type' must be a string or a non-empty array");
    sbuf_puts(e, "(");
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, t) {
        if (!cJSON_IsString(x)) return fail(j, ptr, "'type' entries must be strings");
        sbuf_puts(e, i++ ? " | (" : "(");
        if (gen_type(j, x->valuestring, s, ptr, e)) return -1;
        sbuf_puts(e, ")");
    }
    sbuf_puts(e, ")");
    return 0;
}

static int gen(jsg *j, const cJSON *s, const char *ptr, sbuf *e) {
    if (++j->depth > DEPTH_MAX) return fail(j, ptr, "schema nested deeper than %d", DEPTH_MAX);
    int rc = gen_body(j, s, ptr, e);
    j->depth--;
    return rc;
}

static int schema_rules(const cJSON *root, const cJSON *schema, const char *name, const char *tag_close, sbuf *out,
                        char *err, size_t errlen) {
    jsg j = {.out = out, .base = name, .root = root, .tag_close = tag_close, .top = 1, .err = err, .errlen = errlen};
    sbuf e = {0};
    int rc = gen(&j, schema, "", &e);
    if (!rc) sbuf_printf(out, "%s ::= %s\n", name, e.p);
    sbuf_free(&e);
    for (int i = 0; i < j.nrefs; i++) free(j.refs[i].ref);
    return rc;
}

int json_schema_rules(const cJSON *root, const cJSON *schema, const char *name, sbuf *out, char *err, size_t errlen) {
    return schema_rules(root, schema, name, NULL, out, err, errlen);
}

int json_schema_tagged_rules(const cJSON *root, const cJSON *schema, const char *name, const char *tag_close, sbuf *out,
                             char *err, size_t errlen) {
    return schema_rules(root, schema, name, tag_close, out, err, errlen);
}

int json_schema_grammar(const char *text, size_t len, sbuf *out, char *err, size_t errlen) {
    cJSON *s = cJSON_ParseWithLength(text, len);
    if (!s) return errf(err, errlen, "schema: not valid JSON");
    sbuf g = {0};
    int rc = json_schema_rules(s, s, "root", &g, err, errlen);
    cJSON_Delete(s);
    if (!rc) sbuf_put(out, g.p, g.len);
    sbuf_free(&g);
    return rc;
}
