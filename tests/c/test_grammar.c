/* test_grammar.c — GBNF parsing, byte-level matching (UTF-8 included), error messages. */
#include <string.h>

#include "core/grammar.h"
#include "core/grammar_int.h"
#include "test.h"

/* 1 = complete sentence, 0 = valid prefix only, -1 = rejected. */
static int match(const char *gbnf, const char *input, size_t n) {
    char err[256];
    grammar *g = grammar_parse(gbnf, strlen(gbnf), err, sizeof err);
    if (!g) {
        printf("unexpected parse error: %s\n", err);
        return -2;
    }
    gm *m = gm_new(g);
    int rc = gm_feed(m, input, n) ? -1 : gm_accepting(m, gm_state(m));
    gm_free(m);
    grammar_free(g);
    return rc;
}

static int ok(const char *g, const char *s) { return match(g, s, strlen(s)) == 1; }
static int rejects(const char *g, const char *s) { return match(g, s, strlen(s)) == -1; }

/* The error text for a grammar that must not compile ("" if it compiled). */
static const char *error_of(const char *gbnf, size_t n) {
    static char err[256];
    err[0] = 0;
    grammar *g = grammar_parse(gbnf, n, err, sizeof err);
    if (g) {
        grammar_free(g);
        return "";
    }
    return err;
}

static void test_basics(void) {
    const char *g = "root ::= \"ab\" | \"c\" d\nd ::= [0-9]+";
    CHECK(ok(g, "ab"), "literal alternative");
    CHECK(ok(g, "c123"), "rule ref and +");
    CHECK(match(g, "c", 1) == 0, "prefix is not complete");
    CHECK(rejects(g, "c1x"), "junk rejected");
    CHECK(rejects(g, "abc"), "nothing after a complete sentence");
    CHECK(ok("root ::= \"x\"? \"y\"*", ""), "empty sentence");
    CHECK(ok("root ::= \"x\"? \"y\"*", "xyyy"), "? and *");
    CHECK(rejects("root ::= \"x\"? \"y\"*", "xx"), "? at most once");
    const char *rep = "root ::= [a]{2,3} \"-\" [b]{2} \"-\" [c]{1,}";
    CHECK(ok(rep, "aa-bb-c") && ok(rep, "aaa-bb-ccc"), "{m,n} {m} {m,}");
    CHECK(rejects(rep, "a-") && rejects(rep, "aaaa") && rejects(rep, "aa-b-"), "bounds enforced");
    CHECK(ok("root ::= (\"ab\" | \"c\")* \"!\"", "abcab!"), "group star");
    CHECK(ok("root ::= \"ab\"{2}", "abab") && rejects("root ::= \"ab\"{2}", "aba!"), "literal repeated whole");
    CHECK(ok("root ::= [^\"\\\\]* \"\\\"\"", "abc\""), "negated class with escapes");
    CHECK(rejects("root ::= [^\"\\\\]* \"\\\"\"", "a\\"), "negated class excludes backslash");
    /* comments, continuation lines, blank lines */
    const char *multi = "# top\nroot ::= a\n  | b # c\n\na ::= \"a\"\nb ::= (\n  \"b\"\n  \"c\"\n)\n";
    CHECK(ok(multi, "a") && ok(multi, "bc") && match(multi, "b", 1) == 0 && rejects(multi, "ab"), "multi-line rules");
    /* a right-recursive list keeps working long */
    char big[4001];
    memset(big, 'x', 4000);
    big[4000] = 0;
    CHECK(ok("root ::= \"x\" root | \"x\"", big), "deep right recursion");
    CHECK(ok("root ::= \"(\" root \")\" | \"\"", "((()))") && rejects("root ::= \"(\" root \")\" | \"\"", "(()))"),
          "nested parentheses: a real pushdown");
}

static void test_utf8(void) {
    const char *g = "root ::= [a-zé-ï]+";
    CHECK(ok(g, "abé"), "two-byte class member");
    CHECK(ok(g, "ï"), "range end");
    CHECK(rejects(g, "ð"), "just past the range");
    CHECK(match(g, "\xc3", 1) == 0, "half a character is a prefix");
    CHECK(rejects(g, "\xc3\x28"), "bad continuation byte");
    const char *any = "root ::= .+";
    CHECK(ok(any, "€😀ü"), ". matches 3- and 4-byte characters");
    CHECK(rejects(any, "\xed\xa0\x80"), "surrogates are not characters");
    CHECK(rejects(any, "\xc0\xaf"), "overlong encodings rejected");
    CHECK(rejects(any, "\xf4\x90\x80\x80"), "above U+10FFFF rejected");
    CHECK(rejects(any, "\xff"), "0xFF never appears in UTF-8");
    const char *neg = "root ::= [^a]+";
    CHECK(ok(neg, "b\xe4\xb8\xad\xf0\x9f\x98\x80"), "negated class includes all other scalars");
    CHECK(rejects(neg, "ba"), "negated class excludes its member");
    CHECK(ok("root ::= \"\\u00e9\\U0001F600\\x41\"", "é😀A"), "escapes are code points");
    CHECK(ok("root ::= [\\u4e00-\\u9fa5]{2}", "中文"), "CJK range");
    CHECK(rejects("root ::= [\\u4e00-\\u9fa5]{2}", "中a"), "CJK range excludes ASCII");
    /* the boundaries of each encoded length */
    CHECK(ok("root ::= [\\x7f-\\u0800]+", "\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80"), "1/2/3-byte boundaries");
    CHECK(ok("root ::= [\\uffff-\\U00010000]+", "\xef\xbf\xbf\xf0\x90\x80\x80"), "3/4-byte boundary");
    CHECK(rejects("root ::= [\\u0100-\\u0200]", "\xc3\xbf"), "U+00FF below range");
    /* a non-ASCII class written again (a pattern's every ".") reuses the first one's rule */
    char err[200];
    const char *g1 = "root ::= [é-ï] \"x\"", *g3 = "root ::= [é-ï] \"x\" [é-ï] t\nt ::= [é-ï]";
    grammar *one = grammar_parse(g1, strlen(g1), err, sizeof err), *three = grammar_parse(g3, strlen(g3), err, sizeof err);
    CHECK(one && three && three->nrules == one->nrules + 1 && three->nsets == one->nsets, "rules %d vs %d, sets %d vs %d",
          three ? three->nrules : -1, one ? one->nrules : -1, three ? three->nsets : -1, one ? one->nsets : -1);
    CHECK(ok(g3, "éxïé") && rejects(g3, "éxïa"), "the shared class rule matches at every use");
    grammar_free(one);
    grammar_free(three);
}

static void test_errors(void) {
    CHECK(strstr(error_of("root ::= foo", 12), "'foo' is used but never defined"), "%s", error_of("root ::= foo", 12));
    CHECK(strstr(error_of("a ::= \"x\"", 9), "no 'root' rule"), "missing root");
    CHECK(strstr(error_of("root ::= root \"x\"", 17), "left-recursive"), "left recursion");
    CHECK(strstr(error_of("root ::= (\"x\"?)*", 16), "left-recursive"), "star of nullable");
    CHECK(strstr(error_of("root ::= \"abc", 13), "unterminated string literal at line 1, column 10"), "%s",
          error_of("root ::= \"abc", 13));
    CHECK(strstr(error_of("root ::= [a-", 12), "unterminated character class"), "class");
    CHECK(strstr(error_of("root ::= [z-a]", 14), "reversed"), "reversed range");
    CHECK(strstr(error_of("root ::= (\"a\"", 13), "expected ')'"), "group");
    CHECK(strstr(error_of("root ::= \"a\"{3,1}", 17), "max below min"), "bounds");
    CHECK(strstr(error_of("root ::= \"a\"{99999}", 19), "above"), "huge count");
    CHECK(strstr(error_of("root ::= \"a\"\nroot ::= \"b\"", 25), "defined twice"), "duplicate");
    CHECK(strstr(error_of("root ::= \"\\q\"", 13), "unknown escape"), "escape");
    CHECK(strstr(error_of("root ::= \"\\ud800\"", 17), "not a Unicode scalar"), "surrogate escape");
    CHECK(strstr(error_of("root ::= <[12]>", 15), "token references"), "tokens");
    CHECK(strstr(error_of("root ::= \"a\" b ::= \"c\"", 22), "newline before the next rule"), "two rules one line");
    CHECK(strstr(error_of("root \"a\"", 8), "expected '::='"), "no ::=");
    CHECK(strstr(error_of("root ::= \"a\0\"", 13), "NUL byte"), "NUL");
    CHECK(strstr(error_of("root ::= [\xff]", 12), "invalid UTF-8"), "bad source UTF-8");
    CHECK(strstr(error_of("root ::= *", 10), "nothing to repeat") || strstr(error_of("root ::= *", 10), "unexpected"),
          "%s", error_of("root ::= *", 10));
    CHECK(strstr(error_of("", 0), "no 'root'"), "empty grammar");
}

static void test_cache(void) {
    char err[256];
    const char *src = "root ::= (\"a\" | \"b\")*";
    grammar *g = grammar_parse(src, strlen(src), err, sizeof err);
    gm *m = gm_new(g);
    int s0 = gm_state(m);
    CHECK(gm_next(m, s0, 'a') == gm_next(m, s0, 'a'), "transitions are cached");
    CHECK(gm_next(m, gm_next(m, s0, 'a'), 'b') == gm_next(m, s0, 'a'), "loop returns to one state");
    CHECK(gm_next(m, s0, 'c') == GM_DEAD, "dead byte");
    CHECK(gm_feed(m, "abx", 3) == -1 && gm_state(m) == s0, "a rejected feed leaves the matcher unchanged");
    CHECK(grammar_has_literal(g, "a", 1) && !grammar_has_literal(g, "ab", 2), "literals recorded as written");
    gm_free(m);
    grammar_free(g);
    /* bytes that advance the same parses share one closure: the first of a class fills it */
    const char *classes = "root ::= [a-z]{0,3} \"!\"";
    g = grammar_parse(classes, strlen(classes), err, sizeof err);
    m = gm_new(g);
    s0 = gm_state(m);
    long before = gm_closures(m);
    int t = gm_next(m, s0, 'q');
    long after_q = gm_closures(m);
    CHECK(after_q == before + 1, "one closure for the first letter");
    int same = 1;
    for (int b = 'a'; b <= 'z'; b++) same &= gm_next(m, s0, (unsigned char)b) == t;
    CHECK(same && gm_closures(m) == after_q, "every other letter of its class is already known: %ld closures",
          gm_closures(m) - after_q);
    CHECK(gm_next(m, s0, '!') != t && gm_closures(m) == after_q + 1 && gm_next(m, s0, '?') == GM_DEAD,
          "another class, another closure; a byte no parse takes is dead");
    gm_free(m);
    grammar_free(g);
}

/* A tiny cache limit forces rebuilds mid-input; answers must not change. */
static void test_rebuild(void) {
    char err[256];
    const char *src = "root ::= ([a-c]{0,40} \",\")* \"!\"";
    grammar *g = grammar_parse(src, strlen(src), err, sizeof err);
    gm *small = gm_new(g), *big = gm_new(g);
    gm_set_cache_limit(small, 4);
    char in[2000];
    int n = 0;
    for (int i = 0; i < 60; i++) {
        for (int k = 0; k < i % 37; k++) in[n++] = (char)('a' + (i + k) % 3);
        in[n++] = ',';
    }
    int same = 1;
    for (int i = 0; i < n && same; i++) same = gm_feed(small, in + i, 1) == 0 && gm_feed(big, in + i, 1) == 0;
    CHECK(same, "the small cache accepts what the big one does");
    CHECK(gm_rebuilds(small) > 0 && gm_rebuilds(big) == 0, "rebuilds happened only with the small limit");
    CHECK(gm_feed(small, "aaaa,", 5) == 0 && gm_feed(big, "aaaa,", 5) == 0, "prefix still valid");
    CHECK(gm_feed(small, "!", 1) == 0 && gm_accepting(small, gm_state(small)), "complete after a rebuild");
    CHECK(gm_feed(small, "a", 1) == -1, "nothing after the end");
    gm_free(small);
    gm_free(big);
    grammar_free(g);
}

/* A rebuild copies each distinct node once: twelve stacks over one shared chain of k pending "."
 * re-intern ~k + 12 nodes, not the ~12 k positions the stacks hold between them. */
static void test_rebuild_shares_tails(void) {
    char err[256];
    const char *src = "root ::= x\nx ::= \"a\" x \".\" | \"a\" [0-4] | \"a\" [5-9] | \"a\" \"q\"+ | \"a\" \"r\"?";
    grammar *g = grammar_parse(src, strlen(src), err, sizeof err);
    CHECK(g != NULL, "%s", err);
    gm *m = gm_new(g);
    gm_set_cache_limit(m, 1);
    enum { K = 300 };
    int fed = 1;
    for (int i = 0; i < K && fed; i++) fed = gm_feed(m, "a", 1) == 0;
    CHECK(fed && gm_rebuilds(m) > 0, "every feed rebuilt the cache");
    CHECK(gm_rebuild_copies(m) >= K && gm_rebuild_copies(m) <= K + 16, "the last rebuild copied %ld nodes for a depth of %d",
          gm_rebuild_copies(m), K);
    CHECK(gm_feed(m, "7", 1) == 0, "a digit ends the innermost x");
    for (int i = 1; i < K && fed; i++) fed = gm_feed(m, ".", 1) == 0;
    CHECK(fed && gm_accepting(m, gm_state(m)), "and the %d pending dots close the sentence", K - 1);
    gm_free(m);
    grammar_free(g);
}

/* Exponentially ambiguous grammars are cut off, not followed into exhausting memory. */
static void test_ambiguity_bound(void) {
    char err[256];
    const char *src = "root ::= (x | \"y\")++++++++++++++++++++++++++++++++\nx ::= [^z]";
    grammar *g = grammar_parse(src, strlen(src), err, sizeof err);
    CHECK(g != NULL, "%s", err);
    gm *m = gm_new(g);
    for (int i = 0; i < 64 && gm_feed(m, "y", 1) == 0; i++) continue;
    CHECK(gm_overflowed(m), "this grammar multiplies its parses past the bound");
    gm_free(m);
    grammar_free(g);
    CHECK(ok("root ::= (\"a\" | \"a\" | \"a\")*", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"), "bounded ambiguity still matches");
}

int main(void) {
    test_rebuild();
    test_rebuild_shares_tails();
    test_ambiguity_bound();
    test_basics();
    test_utf8();
    test_errors();
    test_cache();
    return TEST_END();
}
