/* test_wire.c — the frame codec: exact parses, every refusal, stream sync after bad frames,
 * byte-at-a-time delivery, and byte-exact output frames. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve/wire.h"
#include "test.h"

enum { MAXF = 64 };

typedef struct {
    wire_frame f[MAXF];
    char payload[MAXF][256];
    int n;
} frames;

static void collect(wire_reader *r, frames *out) {
    wire_frame f;
    while (out->n < MAXF && wire_reader_next(r, &f)) {
        if (f.kind == WIRE_SUBMIT || f.kind == WIRE_IMAGE) {
            size_t k = f.payload_len + f.ext_len < 255 ? f.payload_len + f.ext_len : 255;
            memcpy(out->payload[out->n], f.payload, k);
            out->payload[out->n][k] = 0;
        }
        out->f[out->n++] = f;
    }
}

/* Parse a whole input, either in one push or one byte per push. */
static void parse_all(const char *in, size_t n, int bytewise, frames *out) {
    wire_reader r;
    wire_reader_init(&r);
    memset(out, 0, sizeof *out);
    if (bytewise)
        for (size_t i = 0; i < n; i++) { wire_reader_push(&r, in + i, 1); collect(&r, out); }
    else { wire_reader_push(&r, in, n); collect(&r, out); }
    wire_frame f;
    if (wire_reader_eof(&r, &f) && out->n < MAXF) out->f[out->n++] = f;
    wire_reader_free(&r);
}

static frames fr;

static void parse(const char *in) { parse_all(in, strlen(in), 0, &fr); }

static int is_error(int i, const char *id, const char *code) {
    return i < fr.n && fr.f[i].kind == WIRE_ERROR && !strcmp(fr.f[i].id, id) && !strcmp(fr.f[i].code, code);
}

static void test_submit_fields(void) {
    parse("SUBMIT req-v4 0 3 4 0 1 4 2\nabcWXYZ\n");
    CHECK(fr.n == 1 && fr.f[0].kind == WIRE_SUBMIT, "golden submit parses (%d)", fr.n);
    wire_frame *f = &fr.f[0];
    CHECK(!strcmp(f->id, "req-v4") && f->sub.slot == 0 && f->sub.max_tokens == 4, "positional");
    CHECK(f->sub.temperature == 0 && f->sub.top_p == 1, "floats");
    CHECK(f->payload_len == 3 && f->ext_len == 4 && !strcmp(fr.payload[0], "abcWXYZ"), "payload + ext");
    CHECK(f->sub.prefix_bytes == 2, "prefix_bytes");

    parse("SUBMIT 7 1 5 8 0.7 0.9\nhello\n");
    f = &fr.f[0];
    CHECK(fr.n == 1 && f->kind == WIRE_SUBMIT && f->sub.slot == 1 && f->sub.prefix_bytes == -1 && f->ext_len == 0,
          "classic 6-field submit");
    CHECK(fabsf(f->sub.temperature - 0.7f) < 1e-6 && fabsf(f->sub.top_p - 0.9f) < 1e-6, "temperature/top_p");

    parse("SUBMIT 9 0 5 0 0 1 0 ids=1 logprobs=5 seed=42 future=x\n1 2 3\n");
    f = &fr.f[0];
    CHECK(fr.n == 1 && f->kind == WIRE_SUBMIT && f->sub.ids == 1 && f->sub.logprobs == 5 && f->sub.seed == 42,
          "extension keys; unknown key ignored");
    CHECK(f->sub.max_tokens == 0, "max_tokens 0 allowed with logprobs");

    parse("SUBMIT a 0 2 1 0 1\r\nhi\n");
    CHECK(fr.n == 1 && fr.f[0].kind == WIRE_SUBMIT && !strcmp(fr.payload[0], "hi"), "CRLF header");

    const char nul[] = "SUBMIT z 0 3 1 0 1\na\0b\n";
    parse_all(nul, sizeof nul - 1, 0, &fr);
    CHECK(fr.n == 1 && fr.f[0].kind == WIRE_SUBMIT && fr.f[0].payload_len == 3 && fr.payload[0][1] == 0,
          "payload may hold NUL and newlines");
}

static void test_refusals(void) {
    struct { const char *in, *id, *code; } cases[] = {
        {"SUBMIT a 0 2 0 0 1\nhi\n", "a", "BAD_REQUEST"},                        /* max_tokens 0 without logprobs */
        {"SUBMIT a 0 2 -1 0 1\nhi\n", "a", "BAD_REQUEST"},
        {"SUBMIT a 0 2 1 nan 1\nhi\n", "a", "BAD_REQUEST"},
        {"SUBMIT a 0 2 1 inf 1\nhi\n", "a", "BAD_REQUEST"},
        {"SUBMIT a 0 2 1 0 0\nhi\n", "a", "BAD_REQUEST"},                        /* top_p 0 */
        {"SUBMIT a 0 2 1 0 1.5\nhi\n", "a", "BAD_REQUEST"},
        {"SUBMIT a 0 2 1 -1 1\nhi\n", "a", "BAD_REQUEST"},
        {"SUBMIT a x 2 1 0 1\nhi\n", "a", "BAD_REQUEST"},                        /* slot */
        {"SUBMIT a -1 2 1 0 1\nhi\n", "a", "BAD_REQUEST"},
        {"SUBMIT a 0 2 1 0\nhi\n", "a", "BAD_REQUEST"},                          /* too few fields */
        {"SUBMIT a 0 2 1 0 1 logprobs=5\nhi\n", "a", "BAD_REQUEST"},             /* keys need ext_bytes */
        {"SUBMIT a 0 2 1 0 1 0 0 9\nhi\n", "a", "BAD_REQUEST"},                  /* 9 positional after SUBMIT */
        {"SUBMIT a 0 2 1 0 1 0 3\nhi\n", "a", "BAD_REQUEST"},                    /* prefix_bytes > bytes */
        {"SUBMIT a 0 2 1 0 1 0 logprobs=33\nhi\n", "a", "BAD_REQUEST"},
        {"SUBMIT a 0 2 1 0 1 0 ids=2\nhi\n", "a", "BAD_REQUEST"},
        {"SUBMIT a 0 2 1 0 1 0 logprobs=\nhi\n", "a", "BAD_REQUEST"},
        {"SUBMIT a 0 2 1 0 1 0 ids=1 0\nhi\n", "a", "BAD_REQUEST"},              /* positional after a key */
        {"SUBMIT 0123456789012345678901234567890123456789012345678901234567890123 0 2 1 0 1\nhi\n", "0", "BAD_REQUEST"},
        {"SUBMIT a 0 2 1 0 1\nhiX", "a", "BAD_FRAME"},                           /* wrong terminator */
        {"STOP\n", "0", "BAD_REQUEST"},
        {"CANCEL\n", "0", "BAD_REQUEST"},
        {"IMAGE i 2 0 1\nab\n", "i", "BAD_REQUEST"},
        {"STOP a\x01\n", "0", "BAD_REQUEST"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        parse(cases[i].in);
        CHECK(is_error(0, cases[i].id, cases[i].code), "case %zu '%s' -> %s %s (got n=%d kind=%d id=%s code=%s)", i,
              cases[i].in, cases[i].id, cases[i].code, fr.n, fr.n ? (int)fr.f[0].kind : -1, fr.n ? fr.f[0].id : "",
              fr.n && fr.f[0].code ? fr.f[0].code : "");
        CHECK(fr.n == 1, "case %zu: exactly one frame (got %d)", i, fr.n);
    }
    /* an extension string of 256+ chars (255 is allowed) */
    char big[512];
    snprintf(big, sizeof big, "SUBMIT a 0 2 1 0 1 0 k1=%0125d k2=%0123d\nhi\n", 1, 2);
    parse(big);
    CHECK(fr.n == 1 && fr.f[0].kind == WIRE_SUBMIT, "a 255-byte extension string is taken");
    snprintf(big, sizeof big, "SUBMIT a 0 2 1 0 1 0 k1=%0125d k2=%0124d\nhi\n", 1, 2);
    parse(big);
    CHECK(is_error(0, "a", "BAD_REQUEST") && fr.n == 1, "extension string limit");
    const char *bad_keys[] = {"tokids=2", "top_k=-1", "min_p=1.5", "min_p=-0.1", "rep=0", "rep=nan", "pres=inf",
                              "freq=x", "seed=-1"};
    for (size_t i = 0; i < sizeof bad_keys / sizeof *bad_keys; i++) {
        snprintf(big, sizeof big, "SUBMIT a 0 2 1 0 1 0 %s\nhi\n", bad_keys[i]);
        parse(big);
        CHECK(is_error(0, "a", "BAD_REQUEST") && fr.n == 1, "SUBMIT %s refused", bad_keys[i]);
    }
}

static void test_sync_after_errors(void) {
    /* A bad header whose sizes parse has its payload consumed; the next frame is read intact. */
    parse("SUBMIT a 0 5 1 nan 1\nSTOP \n\nSTOP b\n");
    CHECK(fr.n == 2 && is_error(0, "a", "BAD_REQUEST") && fr.f[1].kind == WIRE_STOP && !strcmp(fr.f[1].id, "b"),
          "payload of a refused submit skipped (n=%d)", fr.n);
    /* blank lines and unknown words are ignored */
    parse("\n\r\nHELLO there\nPING 1 2 3\nCANCEL c\n");
    CHECK(fr.n == 1 && fr.f[0].kind == WIRE_CANCEL && !strcmp(fr.f[0].id, "c"), "ignored lines (n=%d)", fr.n);
    /* an over-long header is refused and drained to its newline */
    size_t n = 10000;
    char *in = malloc(n + 64);
    memcpy(in, "SUBMIT ", 7);
    memset(in + 7, 'x', n - 7);
    strcpy(in + n, "\nSTOP d\n");
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        parse_all(in, strlen(in), bytewise, &fr);
        CHECK(fr.n == 2 && is_error(0, "0", "BAD_REQUEST") && fr.f[1].kind == WIRE_STOP && !strcmp(fr.f[1].id, "d"),
              "long header drained (bytewise=%d, n=%d)", bytewise, fr.n);
    }
    free(in);
    /* too many fields: refused, but the announced payload is still consumed */
    char many[1024];
    int w = snprintf(many, sizeof many, "SUBMIT m 0 2 1 0 1 0");
    for (int i = 0; i < 100; i++) w += snprintf(many + w, sizeof many - (size_t)w, " k%d=1", i % 10);
    snprintf(many + w, sizeof many - (size_t)w, "\nhi\nSTOP g\n");
    parse(many);
    CHECK(fr.n == 2 && is_error(0, "m", "BAD_REQUEST") && fr.f[1].kind == WIRE_STOP, "many fields (n=%d)", fr.n);
    parse("SUBMIT a 0 2 1 0 1 0 0 9 9\nhi\nSTOP g\n");
    CHECK(fr.n == 2 && is_error(0, "a", "BAD_REQUEST") && fr.f[1].kind == WIRE_STOP, "11 positional fields");
    /* sizes over the limit are not waited for */
    parse("SUBMIT a 0 99999999999 1 0 1\nSTOP e\n");
    CHECK(fr.n == 2 && is_error(0, "a", "BAD_REQUEST") && fr.f[1].kind == WIRE_STOP, "huge size: header only");
    parse("SUBMIT a 0 -5 1 0 1\nSTOP e\n");
    CHECK(fr.n == 2 && is_error(0, "a", "BAD_REQUEST") && fr.f[1].kind == WIRE_STOP, "negative size: header only");
    /* IMAGE payload consumed */
    parse("IMAGE i 3 2 2\n\n\n\n\nSTOP f\n");
    CHECK(fr.n == 2 && fr.f[0].kind == WIRE_IMAGE && fr.f[0].payload_len == 3 && fr.f[1].kind == WIRE_STOP, "image frame");
}

static void test_eof(void) {
    parse("SUBMIT t 0 10 1 0 1\nabc");
    CHECK(fr.n == 1 && is_error(0, "t", "BAD_FRAME"), "payload cut by EOF");
    parse("SUBMIT t 0 3 1 0 1\nabc");
    CHECK(fr.n == 1 && is_error(0, "t", "BAD_FRAME"), "missing terminator at EOF");
    parse("STOP u");
    CHECK(fr.n == 1 && is_error(0, "u", "BAD_FRAME"), "header cut by EOF");
    parse("garbage");
    CHECK(fr.n == 0, "unknown word cut by EOF is ignored");
    parse("");
    CHECK(fr.n == 0, "empty input");
    parse("STOP a\nSUBMIT v 0 9 1 0 1\nabc");
    CHECK(fr.n == 2 && fr.f[0].kind == WIRE_STOP && is_error(1, "v", "BAD_FRAME"), "cut frame after a complete one");
}

static void test_bytewise_equals_whole(void) {
    const char in[] = "SUBMIT 1 0 5 3 0 1 2 logprobs=2\nhelloXY\nSTOP 1\nJUNK\nCANCEL 2\nSUBMIT 3 0 1 1 0 1\nz\n";
    frames whole, bytes;
    parse_all(in, sizeof in - 1, 0, &whole);
    parse_all(in, sizeof in - 1, 1, &bytes);
    int same = whole.n == bytes.n && whole.n == 4;
    for (int i = 0; same && i < whole.n; i++)
        same = whole.f[i].kind == bytes.f[i].kind && !strcmp(whole.f[i].id, bytes.f[i].id) &&
               !strcmp(whole.payload[i], bytes.payload[i]);
    CHECK(same, "byte-at-a-time delivery gives the same frames (%d vs %d)", whole.n, bytes.n);
}

static void test_format(void) {
    char out[WIRE_HEADER_MAX];
    wire_done golden = {3, 1.25, 50.0, 1.25, 7, 1, 5, 1234};
    size_t n = wire_fmt_done(out, "req-v4", &golden);
    CHECK(n == strlen("DONE req-v4 STAT 3 1.250 50.0 1.25 7 1 5 1234\n") &&
              !memcmp(out, "DONE req-v4 STAT 3 1.250 50.0 1.25 7 1 5 1234\n", n),
          "DONE golden: %.*s", (int)n, out);
    n = wire_fmt_accept(out, "x", 12, 5);
    CHECK(n == 14 && !memcmp(out, "ACCEPT x 12 5\n", n), "ACCEPT with the reuse count");
    n = wire_fmt_data(out, "x", 4, 0, 0, NULL, NULL, -1);
    CHECK(n == 9 && !memcmp(out, "DATA x 4\n", n), "DATA plain");
    int ids[2] = {17, 3};
    float lps[2] = {-0.5f, -1.25f};
    n = wire_fmt_data(out, "x", 2, 2, -0.5f, ids, lps, -1);
    const char *want = "DATA x 2 -0.5 2 17 -0.5 3 -1.25\n";
    CHECK(n == strlen(want) && !memcmp(out, want, n), "DATA logprobs: %.*s", (int)n, out);
    float nanv[1] = {NAN};
    n = wire_fmt_data(out, "x", 0, 1, -INFINITY, ids, nanv, -1);
    CHECK(n == strlen("DATA x 0 -inf 1 17 nan\n") && !memcmp(out, "DATA x 0 -inf 1 17 nan\n", n), "nan/inf: %.*s", (int)n, out);
    n = wire_fmt_data(out, "x", 3, 1, -0.5f, ids, lps, 42);
    want = "DATA x 3 -0.5 1 17 -0.5 tok=42\n";
    CHECK(n == strlen(want) && !memcmp(out, want, n), "DATA tok after logprobs: %.*s", (int)n, out);
    n = wire_fmt_data(out, "x", 0, 0, 0, NULL, NULL, 0);
    CHECK(n == strlen("DATA x 0 tok=0\n") && !memcmp(out, "DATA x 0 tok=0\n", n), "DATA tok plain: %.*s", (int)n, out);
    n = wire_fmt_error(out, "y", "CONTEXT_EXCEEDED", "130 128");
    CHECK(n == strlen("ERROR y CONTEXT_EXCEEDED 130 128\n") && !memcmp(out, "ERROR y CONTEXT_EXCEEDED 130 128\n", n), "ERROR");
    n = wire_fmt_error(out, "y", "BAD_REQUEST", "two\nlines\r");
    CHECK(n == strlen("ERROR y BAD_REQUEST two lines \n") && !memcmp(out, "ERROR y BAD_REQUEST two lines \n", n),
          "newlines in detail become spaces");
    n = wire_fmt_error(out, "z", "CANCELLED", NULL);
    CHECK(n == strlen("ERROR z CANCELLED\n") && !memcmp(out, "ERROR z CANCELLED\n", n), "bare code");
    CHECK(strlen(WIRE_READY) == 10 && !memcmp(WIRE_READY, "\x01\x01READY\x01\x01\n", 10), "READY sentinel");
}

static void test_untrusted_spans(void) {
    parse("SUBMIT 9 0 6 4 0 1 11 untrusted=7\nabcdef0 2 3 1GRAM\n");
    CHECK(fr.n == 1 && fr.f[0].kind == WIRE_SUBMIT && fr.f[0].sub.untrusted_bytes == 7, "untrusted key parses");
    tok_span *sp = NULL;
    int n = 0;
    char err[160] = "";
    CHECK(wire_parse_spans(fr.f[0].ext, 7, 6, &sp, &n, err, sizeof err) == 0 && n == 2 && sp[0].start == 0 &&
              sp[0].len == 2 && sp[1].start == 3 && sp[1].len == 1, "table parses: %s", err);
    sbuf b = {0};
    wire_fmt_spans(&b, sp, n);
    CHECK(b.len == 7 && !memcmp(b.p, "0 2 3 1", 7), "format reads back: [%s]", b.p ? b.p : "");
    free(sp);
    sbuf_free(&b);
    parse("SUBMIT 9 0 6 4 0 1 3 untrusted=7\nabcdef0 2\n");
    CHECK(is_error(0, "9", "BAD_REQUEST"), "a table longer than ext_bytes is refused");
    const char *bad[] = {"0 2 1 1", "0 0", "5 2", "0", "0 2 ", " 0 2", "0 2  3 1", "0 x", "7 1", "99999999999999999999 1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        sp = NULL;
        CHECK(wire_parse_spans(bad[i], strlen(bad[i]), 6, &sp, &n, err, sizeof err) < 0 && !sp, "table [%s] refused",
              bad[i]);
    }
    CHECK(wire_parse_spans("", 0, 6, &sp, &n, err, sizeof err) == 0 && n == 0, "an empty table is no spans");
}

/* ---- round trips: every frame formatted by one end parses back to the same values ---------- */

/* A gateway-to-engine frame (header + payload + "\n") through the engine's reader. */
static wire_frame reread(const char *head, size_t hn, const char *payload, size_t pn) {
    char buf[WIRE_HEADER_MAX + 512];
    memcpy(buf, head, hn);
    memcpy(buf + hn, payload, pn);
    buf[hn + pn] = '\n';
    parse_all(buf, hn + (pn ? pn + 1 : 0), 0, &fr);
    return fr.n == 1 ? fr.f[0] : (wire_frame){.kind = WIRE_NONE};
}

static int same_submit(const wire_submit *a, const wire_submit *b) {
    return a->slot == b->slot && a->max_tokens == b->max_tokens && a->temperature == b->temperature &&
           a->top_p == b->top_p && a->prefix_bytes == b->prefix_bytes && a->logprobs == b->logprobs &&
           a->ids == b->ids && a->pin == b->pin && a->seed == b->seed && a->has_seed == b->has_seed &&
           a->tokids == b->tokids && a->top_k == b->top_k && a->min_p == b->min_p && a->repetition == b->repetition &&
           a->presence == b->presence && a->frequency == b->frequency && a->untrusted_bytes == b->untrusted_bytes &&
           a->grammar_bytes == b->grammar_bytes && a->has_grammar_bytes == b->has_grammar_bytes &&
           a->think_budget == b->think_budget;
}

/* think_budget=0 (no budget is the key's absence) and non-numbers are refused. */
static void refuses_bad_budgets(void) {
    const char *bad[] = {"SUBMIT b 0 1 4 0 1 0 think_budget=0\nx\n", "SUBMIT b 0 1 4 0 1 0 think_budget=x\nx\n"};
    for (size_t i = 0; i < 2; i++) {
        frames fr;
        parse_all(bad[i], strlen(bad[i]), 0, &fr);
        CHECK(fr.n == 1 && fr.f[0].kind == WIRE_ERROR && strstr(fr.f[0].detail, "think_budget"), "%s refused", bad[i]);
    }
}

static void test_submit_round_trip(void) {
    char h[WIRE_HEADER_MAX];
    const wire_submit cases[] = {
        {.slot = 0, .max_tokens = 8, .temperature = 0, .top_p = 1, .prefix_bytes = -1},
        {.slot = 3, .max_tokens = 100, .temperature = 0.7f, .top_p = 0.95f, .prefix_bytes = 2},
        {.slot = 1, .max_tokens = 0, .temperature = 1.3333333f, .top_p = 0.1f, .prefix_bytes = -1, .logprobs = 32,
         .ids = 1, .pin = 1, .seed = 18446744073709551615ULL, .has_seed = 1},
        {.slot = 2, .max_tokens = 5, .temperature = 1e-7f, .top_p = 0.33333334f, .prefix_bytes = 0, .logprobs = 1,
         .untrusted_bytes = 3, .seed = 42, .has_seed = 1},
        /* seed 0 is a seed: it travels as seed=0 */
        {.slot = 0, .max_tokens = 3, .temperature = 1, .top_p = 1, .prefix_bytes = -1, .seed = 0, .has_seed = 1},
        /* every key at once, the longest values they take, with a grammar after the span table */
        {.slot = 7, .max_tokens = 1 << 30, .temperature = 0.30000001f, .top_p = 0.90000004f, .prefix_bytes = 11,
         .logprobs = 32, .ids = 1, .pin = 1, .tokids = 1, .seed = 18446744073709551615ULL, .has_seed = 1,
         .top_k = 1 << 30, .min_p = 0.123456791f, .repetition = 1.17549435e-38f, .presence = -1.99999988f,
         .frequency = 3.40282347e+38f, .untrusted_bytes = 3, .grammar_bytes = 2, .has_grammar_bytes = 1,
         .think_budget = 1 << 30},
        {.slot = 0, .max_tokens = 2, .temperature = 0, .top_p = 1, .prefix_bytes = -1, .tokids = 1, .top_k = 40,
         .min_p = 0.05f, .repetition = 1.1f, .presence = 0.5f, .frequency = -0.25f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *body = "hello worldABCxyz";
        size_t ext = cases[i].untrusted_bytes || cases[i].has_grammar_bytes ? 6 : 0;
        size_t hn = wire_fmt_submit(h, "rt-1", &cases[i], 11, ext);
        wire_frame f = reread(h, hn, body, 11 + ext);
        CHECK(f.kind == WIRE_SUBMIT && !strcmp(f.id, "rt-1"), "submit %zu parses back (%.80s)", i, h);
        CHECK(same_submit(&f.sub, &cases[i]), "submit %zu fields round-trip (%.80s)", i, h);
        CHECK(f.payload_len == 11 && f.ext_len == ext && !memcmp(f.payload, body, 11 + ext), "submit %zu payload", i);
    }
    size_t hn = wire_fmt_submit(h, "7", &cases[0], 5, 0);
    CHECK(!strncmp(h, "SUBMIT 7 0 5 8 0 1\n", hn), "the plain header is the classic 6 fields: %.*s", (int)hn, h);
    hn = wire_fmt_submit(h, "7", &cases[1], 5, 0);
    CHECK(!strncmp(h, "SUBMIT 7 3 5 100 0.7 0.95 0 2\n", hn), "floats in their shortest form: %.*s", (int)hn, h);
    hn = wire_fmt_submit(h, "7", &cases[4], 5, 0);
    CHECK(!strncmp(h, "SUBMIT 7 0 5 3 1 1 0 seed=0\n", hn), "seed=0 is written: %.*s", (int)hn, h);
    hn = wire_fmt_submit(h, "7", &cases[6], 5, 0);
    const char *want = "SUBMIT 7 0 5 2 0 1 0 tokids=1 top_k=40 min_p=0.05 rep=1.1 pres=0.5 freq=-0.25\n";
    CHECK(hn == strlen(want) && !strncmp(h, want, hn), "sampling keys: %.*s", (int)hn, h);
    wire_submit budget = cases[0];
    budget.think_budget = 1024;
    hn = wire_fmt_submit(h, "7", &budget, 5, 0);
    CHECK(!strncmp(h, "SUBMIT 7 0 5 8 0 1 0 think_budget=1024\n", hn), "the reasoning budget key: %.*s", (int)hn, h);
    refuses_bad_budgets();
    wire_submit none = cases[0];
    hn = wire_fmt_submit(h, "7", &none, 5, 0);
    wire_frame f = reread(h, hn, "hello", 5);
    CHECK(f.kind == WIRE_SUBMIT && !f.sub.has_seed && f.sub.seed == 0, "no seed key: has_seed stays 0");
}

/* BIAS: the frame the gateway writes parses back, and its payload reads back to the same pairs. */
static void test_bias_round_trip(void) {
    int ids[] = {0, 7, 123456, 5};
    float vals[] = {-100, 0.1f, 100, -3.40282347e+38f};
    wire_bias b = {4, ids, vals};
    sbuf out = {0};
    wire_fmt_bias(&out, "b-1", &b);
    parse_all(out.p, out.len, 0, &fr);
    CHECK(fr.n == 1 && fr.f[0].kind == WIRE_BIAS && !strcmp(fr.f[0].id, "b-1"), "BIAS parses back: %.*s",
          (int)out.len, out.p);
    int got_ids[WIRE_BIAS_ENTRIES];
    float got[WIRE_BIAS_ENTRIES];
    char detail[160] = "";
    int n = fr.n == 1 ? wire_parse_bias(fr.f[0].payload, fr.f[0].payload_len, 200000, got_ids, got, detail) : -1;
    int same = n == 4;
    for (int i = 0; same && i < 4; i++) same = got_ids[i] == ids[i] && got[i] == vals[i];
    CHECK(same, "BIAS pairs round-trip exactly (n=%d %s)", n, detail);
    CHECK(wire_parse_bias(fr.f[0].payload, fr.f[0].payload_len, 1000, got_ids, got, detail) < 0 &&
              strstr(detail, "below 1000"), "an id past the vocabulary is refused: %s", detail);
    sbuf_free(&out);
    wire_bias empty = {0, NULL, NULL};
    wire_fmt_bias(&out, "b-2", &empty);
    parse_all(out.p, out.len, 0, &fr);
    CHECK(fr.n == 1 && fr.f[0].kind == WIRE_BIAS && fr.f[0].payload_len == 0 &&
              wire_parse_bias(fr.f[0].payload, 0, 10, got_ids, got, detail) == 0, "an empty BIAS is no pairs");
    sbuf_free(&out);
    const char *bad[] = {"1", "x:1", "1:", "1:nan", "-1:2", "1:2:3"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(wire_parse_bias(bad[i], strlen(bad[i]), 10, got_ids, got, detail) < 0, "BIAS entry [%s] refused", bad[i]);
    parse("BIAS q\nSTOP z\n");
    CHECK(fr.n == 2 && is_error(0, "q", "BAD_REQUEST") && fr.f[1].kind == WIRE_STOP, "BIAS without bytes");
}

/* SLOT: every action round-trips with its slot and name; bad names and actions are refused. */
static void test_slot_round_trip(void) {
    char h[WIRE_HEADER_MAX];
    const wire_slot_action acts[] = {WIRE_SLOT_SAVE, WIRE_SLOT_RESTORE, WIRE_SLOT_ERASE};
    for (int i = 0; i < 3; i++) {
        const char *name = "conv-1.kv";
        size_t hn = wire_fmt_slot(h, "s-9", acts[i], 3, strlen(name));
        wire_frame f = reread(h, hn, name, strlen(name));
        CHECK(f.kind == WIRE_SLOT && !strcmp(f.id, "s-9") && f.action == acts[i] && f.slot == 3 &&
                  f.payload_len == strlen(name) && !memcmp(f.payload, name, strlen(name)),
              "SLOT action %d round-trips (%.*s)", i, (int)hn, h);
    }
    parse("SLOT s flush 0 1\nx\nSTOP z\n");
    CHECK(fr.n == 2 && is_error(0, "s", "BAD_REQUEST") && fr.f[1].kind == WIRE_STOP, "unknown SLOT action, payload skipped");
    CHECK(wire_slot_name_ok("a.b_c-9", 7) && !wire_slot_name_ok(".hidden", 7) && !wire_slot_name_ok("a/b", 3) &&
              !wire_slot_name_ok("", 0), "slot file names");
}

static void test_control_round_trip(void) {
    char h[WIRE_HEADER_MAX];
    const wire_kind kinds[] = {WIRE_STOP, WIRE_CANCEL};
    for (int i = 0; i < 2; i++) {
        size_t n = wire_fmt_control(h, kinds[i], "abc-9");
        wire_frame f = reread(h, n, "", 0);
        CHECK(f.kind == kinds[i] && !strcmp(f.id, "abc-9"), "control %d round-trips (%.*s)", i, (int)n, h);
    }
}

static wire_out out_of(const char *h, size_t n) {
    wire_out o;
    CHECK(n > 0 && h[n - 1] == '\n', "a frame ends its header with a newline");
    CHECK(wire_parse_out(h, n - 1, &o) == 0, "engine frame parses: %.*s", (int)n - 1, h);
    return o;
}

static void test_engine_frames_round_trip(void) {
    char h[WIRE_HEADER_MAX];
    wire_out o = out_of(h, wire_fmt_accept(h, "q1", 321, 300));
    CHECK(o.kind == WIRE_OUT_ACCEPT && !strcmp(o.id, "q1") && o.prompt_tokens == 321 && o.reused == 300 &&
          o.payload < 0, "ACCEPT with its reuse count");
    const char spec_accept[] = "ACCEPT q1 12";
    CHECK(wire_parse_out(spec_accept, strlen(spec_accept), &o) == 0 && o.prompt_tokens == 12 && o.reused == -1,
          "the spec's two-field ACCEPT has no reuse count");

    o = out_of(h, wire_fmt_data(h, "q1", 7, 0, 0, NULL, NULL, -1));
    CHECK(o.kind == WIRE_OUT_DATA && o.payload == 7 && !o.has_lp && o.tok == -1, "DATA without logprobs");
    o = out_of(h, wire_fmt_data(h, "q1", 0, 0, 0, NULL, NULL, 0));
    CHECK(o.kind == WIRE_OUT_DATA && o.payload == 0 && !o.has_lp && o.tok == 0, "DATA tok=0 without bytes");
    int ids[WIRE_LOGPROBS_MAX];
    float lps[WIRE_LOGPROBS_MAX];
    for (int i = 0; i < WIRE_LOGPROBS_MAX; i++) ids[i] = 1000 + i, lps[i] = -0.125f * i;
    lps[3] = -INFINITY;
    o = out_of(h, wire_fmt_data(h, "q1", 2, WIRE_LOGPROBS_MAX, -1.5f, ids, lps, 99999));
    int same = o.kind == WIRE_OUT_DATA && o.has_lp && o.lp == -1.5f && o.k == WIRE_LOGPROBS_MAX && o.payload == 2 &&
               o.tok == 99999;
    for (int i = 0; same && i < WIRE_LOGPROBS_MAX; i++) same = o.top_ids[i] == ids[i] && o.top_lps[i] == lps[i];
    CHECK(same, "DATA with %d logprob pairs and tok= round-trips (-inf included)", WIRE_LOGPROBS_MAX);
    float nanv = NAN;
    o = out_of(h, wire_fmt_data(h, "q1", 0, 1, NAN, ids, &nanv, -1));
    CHECK(o.has_lp && isnan(o.lp) && isnan(o.top_lps[0]), "nan logprobs are allowed");

    wire_done d = {17, 12.5, 33.3, 1.25, 40, 1, 39, 987654};
    o = out_of(h, wire_fmt_done(h, "q2", &d));
    CHECK(o.kind == WIRE_OUT_DONE && !strcmp(o.id, "q2") && o.done.completion == 17 && o.done.tok_s == 12.5 &&
          fabs(o.done.hit_pct - 33.3) < 1e-9 && o.done.rss_gb == 1.25 && o.done.prompt_tokens == 40 &&
          o.done.length_limited == 1 && o.done.reused == 39 && o.done.prefill_us == 987654, "DONE round-trips");
    const char upstream[] = "DONE u STAT 3 1.000 0.0 0.50";
    CHECK(wire_parse_out(upstream, strlen(upstream), &o) == 0 && o.done.completion == 3 && o.done.prompt_tokens == -1 &&
          o.done.reused == 0 && o.done.prefill_us == 0 && !o.done.length_limited,
          "the upstream minimum DONE (no optional fields)");
    const char broken[] = "DONE u 3 1.0 0.0";
    CHECK(wire_parse_out(broken, strlen(broken), &o) < 0, "a DONE without STAT is a protocol error");
    const char bad_len[] = "DATA u x";
    CHECK(wire_parse_out(bad_len, strlen(bad_len), &o) < 0, "a payload frame with a bad length is a protocol error");

    o = out_of(h, wire_fmt_error(h, "q3", "CONTEXT_EXCEEDED", "300 128"));
    CHECK(o.kind == WIRE_OUT_ERROR && !strcmp(o.id, "q3") && !strcmp(o.error, "CONTEXT_EXCEEDED 300 128"), "ERROR");

    wire_caps c = {.vision = 0, .slots = 4, .ctx = 4096, .logprobs = 32, .ids = 1, .family = "fam-x", .truncate = 1,
                   .checkpoints = 1, .grammar = 1, .numerics = "qat", .draft = 3};
    o = out_of(h, wire_fmt_caps(h, &c));
    CHECK(o.kind == WIRE_OUT_CAPS && !memcmp(&o.caps, &c, sizeof c), "CAPS round-trips: %s", h);
    o = out_of(h, wire_fmt_record(h, 5, 123456));
    CHECK(o.kind == WIRE_OUT_RECORD && o.slot == 5 && o.payload == 123456 && !o.id[0], "RECORD round-trips: %s", h);
    const char huge_record[] = "RECORD 1 99999999999";
    CHECK(wire_parse_out(huge_record, strlen(huge_record), &o) < 0, "a RECORD beyond WIRE_RECORD_MAX is refused");
    const char bad_slot[] = "RECORD -1 4";
    CHECK(wire_parse_out(bad_slot, strlen(bad_slot), &o) < 0, "a RECORD with a negative slot is refused");
    size_t n = wire_fmt_idle_stat(h, 1.5);
    CHECK(n == strlen("STAT 0 0.0 0.0 1.50 0 0\n") && !memcmp(h, "STAT 0 0.0 0.0 1.50 0 0\n", n), "idle STAT: %.*s",
          (int)n, h);
    CHECK(wire_parse_out(h, n - 1, &o) == 0 && o.kind == WIRE_OUT_OTHER, "the gateway reads STAT as telemetry");
    const char telemetry[] = "HWINFO 2 23 22 0 0 cpu";
    CHECK(wire_parse_out(telemetry, strlen(telemetry), &o) == 0 && o.kind == WIRE_OUT_OTHER, "telemetry is ignored");
    const char echo[] = "ECHO q1 5 0 nan 0";
    CHECK(wire_parse_out(echo, strlen(echo), &o) == 0 && o.kind == WIRE_OUT_OTHER && o.payload == 5,
          "an unhandled payload frame still says how much to skip");
}

int main(void) {
    test_submit_fields();
    test_refusals();
    test_sync_after_errors();
    test_eof();
    test_bytewise_equals_whole();
    test_format();
    test_untrusted_spans();
    test_submit_round_trip();
    test_bias_round_trip();
    test_slot_round_trip();
    test_control_round_trip();
    test_engine_frames_round_trip();
    return TEST_END();
}
