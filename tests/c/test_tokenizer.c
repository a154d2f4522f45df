/* test_tokenizer.c — tokenizer behaviour the parity test cannot reach: Split behaviors, byte
 * fallback, single_word, plain encoding, untrusted spans, error reporting, and the streaming decoder on split and
 * invalid UTF-8. Each tokenizer.json is written here, so the expected ids follow from its merges.
 *
 * The byte-level files give byte b the id b (its GPT-2 alphabet character), then merged pieces:
 * 256 "ab", 257 "--", 258 "a-", 259 "-b", with ranks in that order. */
#include "core/tokenizer.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { AB = 256, DASH2 = 257, A_DASH = 258, DASH_B = 259 };

static unsigned alphabet_cp(int b) {
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) return (unsigned)b;
    unsigned k = 0x100;
    for (int i = 0; i < b; i++)
        k += !((i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF));
    return k;
}

static void alphabet_str(int b, char *out) {
    unsigned cp = alphabet_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

static cJSON *added_token(int id, const char *content, int special, const char *flag) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", id);
    cJSON_AddStringToObject(a, "content", content);
    cJSON_AddBoolToObject(a, "special", special);
    cJSON_AddBoolToObject(a, "normalized", 0);
    if (flag) cJSON_AddBoolToObject(a, flag, 1);
    return a;
}

static const char *write_json(cJSON *root) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/cairn_test_tok_%d.json", (int)getpid());
    char *s = cJSON_Print(root);
    FILE *f = fopen(path, "w");
    fputs(s, f);
    fclose(f);
    free(s);
    cJSON_Delete(root);
    return path;
}

/* A byte-level tokenizer with one Split step (pattern, behavior, invert) before ByteLevel. */
static tokenizer *byte_level_tok(const char *pattern, const char *behavior, int invert) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    char s[4];
    for (int b = 0; b < 256; b++) {
        alphabet_str(b, s);
        cJSON_AddNumberToObject(vocab, s, b);
    }
    const char *merged[] = {"ab", "--", "a-", "-b"}, *merges[] = {"a b", "- -", "a -", "- b"};
    cJSON *m = cJSON_AddArrayToObject(model, "merges");
    for (int i = 0; i < 4; i++) {
        cJSON_AddNumberToObject(vocab, merged[i], 256 + i);
        cJSON_AddItemToArray(m, cJSON_CreateString(merges[i]));
    }
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON_AddItemToArray(added, added_token(260, "<s>", 1, NULL));
    cJSON_AddItemToArray(added, added_token(261, "<ab>", 1, NULL));
    cJSON_AddItemToArray(added, added_token(262, "hello", 0, "single_word"));
    cJSON_AddItemToArray(added, added_token(263, "<L>", 0, "lstrip"));
    cJSON_AddItemToArray(added, added_token(264, "<R>", 0, "rstrip"));
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer"), *steps;
    cJSON_AddStringToObject(pre, "type", "Sequence");
    steps = cJSON_AddArrayToObject(pre, "pretokenizers");
    if (pattern) {
        cJSON *sp = cJSON_CreateObject();
        cJSON_AddStringToObject(sp, "type", "Split");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(sp, "pattern"), "Regex", pattern);
        cJSON_AddStringToObject(sp, "behavior", behavior);
        cJSON_AddBoolToObject(sp, "invert", invert);
        cJSON_AddItemToArray(steps, sp);
    }
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddBoolToObject(bl, "use_regex", 0);
    cJSON_AddItemToArray(steps, bl);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "decoder"), "type", "ByteLevel");
    char err[256] = "";
    tokenizer *t = tok_load(write_json(root), err, sizeof err);
    CHECK(t != NULL, "load: %s", err);
    return t;
}

/* Encodes text and compares with the expected ids (terminated by -1). */
static int encodes_to(const tokenizer *t, const char *text, int plain, const int *want) {
    int ids[64], n, k = 0;
    char err[128];
    n = plain ? tok_encode_plain(t, text, strlen(text), ids, 64, err, sizeof err)
              : tok_encode(t, text, strlen(text), ids, 64, err, sizeof err);
    while (want[k] >= 0) k++;
    if (n != k) {
        printf("  \"%s\": got %d ids, want %d\n", text, n, k);
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] != want[i]) {
            printf("  \"%s\": id %d is %d, want %d\n", text, i, ids[i], want[i]);
            return 0;
        }
    return 1;
}

#define ENC(t, text, ...) encodes_to(t, text, 0, (const int[]){__VA_ARGS__, -1})
#define ENC_PLAIN(t, text, ...) encodes_to(t, text, 1, (const int[]){__VA_ARGS__, -1})

static void test_split_behaviors(void) {
    tokenizer *t = byte_level_tok(NULL, NULL, 0);
    CHECK(ENC(t, "ab", AB), "no split merges");
    CHECK(ENC(t, "a-b", A_DASH, 'b'), "a- has the lower rank than -b");
    tok_free(t);
    struct { const char *behavior; int invert; const char *text; int want[6]; } cases[] = {
        {"Isolated", 0, "a-b", {'a', '-', 'b', -1}},
        {"Isolated", 0, "a--b", {'a', '-', '-', 'b', -1}},
        {"Removed", 0, "a-b", {'a', 'b', -1}},
        {"MergedWithPrevious", 0, "a-b", {A_DASH, 'b', -1}},
        {"MergedWithNext", 0, "a-b", {'a', DASH_B, -1}},
        {"Contiguous", 0, "a--b", {'a', DASH2, 'b', -1}},
        {"Removed", 1, "a-b", {'-', -1}},
        {"Isolated", 1, "ab-ab", {AB, '-', AB, -1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        t = byte_level_tok("-", cases[i].behavior, cases[i].invert);
        CHECK(t && encodes_to(t, cases[i].text, 0, cases[i].want), "%s invert=%d", cases[i].behavior, cases[i].invert);
        tok_free(t);
    }
}

static void test_added_tokens(void) {
    tokenizer *t = byte_level_tok(NULL, NULL, 0);
    CHECK(tok_vocab_size(t) == 265, "vocab %d", tok_vocab_size(t));
    CHECK(tok_id(t, "<s>") == 260 && tok_id(t, "ab") == AB && tok_id(t, "nope") == -1, "tok_id");
    CHECK(tok_is_special(t, 260) && !tok_is_special(t, 262) && !tok_is_special(t, 'a'), "special flags");
    CHECK(strcmp(tok_piece(t, AB), "ab") == 0 && tok_piece(t, 9999) == NULL, "tok_piece");
    CHECK(ENC(t, "a<s>b", 'a', 260, 'b'), "special in text");
    CHECK(ENC(t, "<ab>", 261), "longest added token wins over the ab merge");
    CHECK(ENC_PLAIN(t, "a<s>b", 'a', '<', 's', '>', 'b'), "plain: special tokens are text");
    CHECK(ENC_PLAIN(t, "x hello", 'x', ' ', 262), "plain: non-special added tokens still match");
    CHECK(ENC(t, "ahello", 'a', 'h', 'e', 'l', 'l', 'o'), "single_word: not inside a word");
    CHECK(ENC(t, "hello_", 'h', 'e', 'l', 'l', 'o', '_'), "single_word: _ is a word character");
    CHECK(ENC(t, "a hello!", 'a', ' ', 262, '!'), "single_word: between non-word characters");
    CHECK(ENC(t, "a  \t<L>b", 'a', 263, 'b'), "lstrip swallows spaces before");
    CHECK(ENC(t, "a<R> \u3000b", 'a', 264, 'b'), "rstrip swallows unicode spaces after");
    tok_free(t);

    /* an added token may reuse a vocab id with other content: both spellings stay valid */
    cJSON *root = cJSON_Parse("{\"model\":{\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]},"
                              "\"added_tokens\":[{\"id\":2,\"content\":\"<X>\",\"special\":true}]}");
    char err[256] = "";
    t = tok_load(write_json(root), err, sizeof err);
    CHECK(t != NULL, "load: %s", err);
    if (!t) return;
    CHECK(ENC(t, "ab<X>", 2, 2) && tok_id(t, "ab") == 2 && tok_id(t, "<X>") == 2, "shared id");
    CHECK(strcmp(tok_piece(t, 2), "<X>") == 0, "the added content names the id");
    tok_free(t);
}

/* Encodes text with one untrusted span [a, a + len) and compares (want terminated by -1). */
static int untrusted_to(const tokenizer *t, const char *text, size_t a, size_t len, const int *want) {
    int ids[64], k = 0;
    char err[128];
    tok_span sp = {a, len};
    int n = tok_encode_untrusted(t, text, strlen(text), &sp, 1, ids, 64, err, sizeof err);
    while (want[k] >= 0) k++;
    int ok = n == k;
    for (int i = 0; ok && i < n; i++) ok = ids[i] == want[i];
    if (!ok) {
        printf("  \"%s\" untrusted %zu+%zu: got", text, a, len);
        for (int i = 0; i < n && i < 64; i++) printf(" %d", ids[i]);
        printf(" (%d ids)\n", n);
    }
    return ok;
}

#define ENC_UNTRUSTED(t, text, a, len, ...) untrusted_to(t, text, a, len, (const int[]){__VA_ARGS__, -1})

static void test_untrusted_spans(void) {
    tokenizer *t = byte_level_tok(NULL, NULL, 0);
    CHECK(ENC_UNTRUSTED(t, "<s>a<s>b<s>", 3, 5, 260, 'a', '<', 's', '>', 'b', 260),
          "special text inside the span is plain, the template's tokens around it match");
    CHECK(ENC_UNTRUSTED(t, "x hello!", 2, 5, 'x', ' ', 'h', 'e', 'l', 'l', 'o', '!'),
          "non-special added tokens do not match in a span either");
    CHECK(ENC_UNTRUSTED(t, "a<s>b", 3, 2, 'a', '<', 's', '>', 'b'), "a token partly in a span does not match");
    CHECK(ENC_UNTRUSTED(t, "ab<s>", 0, 2, AB, 260), "text at a span boundary merges as in tok_encode");
    CHECK(ENC_UNTRUSTED(t, "a-b<s>", 1, 1, A_DASH, 'b', 260), "BPE merges across a span boundary");
    CHECK(ENC_UNTRUSTED(t, "a <L>b", 0, 2, 'a', 263, 'b'), "lstrip of a trusted token still takes spaces");
    int ids[8];
    char err[128] = "";
    tok_span two[2] = {{2, 2}, {3, 1}};
    CHECK(tok_encode_untrusted(t, "abcdef", 6, two, 2, ids, 8, err, sizeof err) < 0 && strstr(err, "span 1"),
          "overlapping spans are refused: %s", err);
    tok_span empty = {1, 0};
    CHECK(tok_encode_untrusted(t, "abc", 3, &empty, 1, ids, 8, err, sizeof err) < 0, "an empty span is refused");
    tok_free(t);
}

static void test_errors(void) {
    char err[256] = "";
    CHECK(tok_load("/nonexistent/tokenizer.json", err, sizeof err) == NULL && strstr(err, "nonexistent"), "%s", err);
    cJSON *root = cJSON_Parse("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]}}");
    CHECK(tok_load(write_json(root), err, sizeof err) == NULL && strstr(err, "merges[0]"), "%s", err);
    root = cJSON_Parse("{\"model\":{\"type\":\"Unigram\",\"vocab\":{\"a\":0}}}");
    CHECK(tok_load(write_json(root), err, sizeof err) == NULL && strstr(err, "Unigram"), "%s", err);
    root = cJSON_Parse("{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]},\"normalizer\":{\"type\":\"NFKD\"}}");
    CHECK(tok_load(write_json(root), err, sizeof err) == NULL && strstr(err, "NFKD"), "%s", err);
    root = cJSON_Parse("{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":"
                       "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"([a\"},\"behavior\":\"Isolated\"}}");
    CHECK(tok_load(write_json(root), err, sizeof err) == NULL && strstr(err, "regex"), "%s", err);
    const char *path = write_json(cJSON_CreateString("x"));
    FILE *f = fopen(path, "w");
    fputs("{\"model\": {", f);
    fclose(f);
    CHECK(tok_load(path, err, sizeof err) == NULL && strstr(err, "invalid JSON"), "%s", err);

    tokenizer *t = byte_level_tok(NULL, NULL, 0);
    int ids[4];
    CHECK(tok_encode(t, "a\xC3(b", 4, ids, 4, err, sizeof err) == -1 && strstr(err, "offset 1"), "%s", err);
    CHECK(tok_encode(t, "\xED\xA0\x80", 3, ids, 4, err, sizeof err) == -1, "surrogates are invalid UTF-8");
    CHECK(tok_encode(t, "xyzxyz", 6, ids, 2, err, sizeof err) == 6 && ids[0] == 'x' && ids[1] == 'y',
          "a short buffer gets the first ids and the full count");
    tok_free(t);
}

/* Non-ByteLevel BPE over characters with "<0xNN>" byte fallback (the SentencePiece-style
 * layout) and a ByteFallback decoder. */
static void test_byte_fallback(void) {
    cJSON *root = cJSON_Parse("{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":"
                              "{\"a\":0,\"b\":1,\"\u00e9\":2,\"ab\":3},\"merges\":[[\"a\",\"b\"]]},"
                              "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}}");
    cJSON *vocab = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "vocab");
    char piece[8];
    for (int b = 0; b < 256; b++) {
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        cJSON_AddNumberToObject(vocab, piece, 10 + b);
    }
    char err[256] = "";
    tokenizer *t = tok_load(write_json(root), err, sizeof err);
    CHECK(t != NULL, "load: %s", err);
    if (!t) return;
    CHECK(ENC(t, "ab\u00e9\u20ac", 3, 2, 10 + 0xE2, 10 + 0x82, 10 + 0xAC), "unknown char falls back to bytes");
    int ids[] = {3, 10 + 0xE2, 10 + 0x82, 10 + 0xAC, 2};
    size_t len;
    char *s = tok_decode(t, ids, 5, &len);
    CHECK(strcmp(s, "ab\u20ac\u00e9") == 0 && len == 7, "decode \"%s\"", s);
    free(s);
    tok_free(t);
}

/* Streams ids through a fresh decoder, collecting each put's output separately. */
static void stream_chunks(const tokenizer *t, const int *ids, int n, char chunks[][16], size_t *lens) {
    tok_stream st;
    tok_stream_init(&st, t);
    for (int i = 0; i < n; i++) {
        lens[i] = tok_stream_put(&st, ids[i], chunks[i], 15);
        chunks[i][lens[i]] = 0;
    }
    lens[n] = tok_stream_finish(&st, chunks[n], 15);
    chunks[n][lens[n]] = 0;
}

static void test_stream_decoder(void) {
    tokenizer *t = byte_level_tok(NULL, NULL, 0);
    char c[8][16];
    size_t l[8];
    int emoji[] = {0xF0, 0x9F, 0x98, 0x80, 'a'};   /* U+1F600 one byte per token */
    stream_chunks(t, emoji, 5, c, l);
    CHECK(l[0] == 0 && l[1] == 0 && l[2] == 0, "emoji bytes are held: %zu %zu %zu", l[0], l[1], l[2]);
    CHECK(l[3] == 4 && memcmp(c[3], "\xF0\x9F\x98\x80", 4) == 0, "emoji comes out whole");
    CHECK(l[4] == 1 && c[4][0] == 'a' && l[5] == 0, "then the ascii byte, nothing at finish");

    int stray[] = {0xA9, 'x', 0xC3, 'y', 0xE0, 0x80};   /* stray continuation; lead + ascii; overlong */
    stream_chunks(t, stray, 6, c, l);
    CHECK(l[0] == 1 && (unsigned char)c[0][0] == 0xA9, "a stray continuation byte passes through at once");
    CHECK(l[1] == 1 && l[2] == 0, "a lead byte waits");
    CHECK(l[3] == 2 && (unsigned char)c[3][0] == 0xC3 && c[3][1] == 'y', "a broken sequence passes through raw");
    CHECK(l[4] == 0 && l[5] == 2, "E0 80 is an overlong prefix and is released");

    int cut[] = {0xE4, 0xBD};   /* the first two bytes of U+4F60 */
    stream_chunks(t, cut, 2, c, l);
    CHECK(l[0] == 0 && l[1] == 0 && l[2] == 2 && (unsigned char)c[2][1] == 0xBD, "an unfinished char comes out at finish");

    int e_acute[] = {0xC3, 0xA9, 261, 260};
    stream_chunks(t, e_acute, 4, c, l);
    CHECK(l[1] == 2 && strcmp(c[1], "\u00e9") == 0 && strcmp(c[2], "<ab>") == 0 && strcmp(c[3], "<s>") == 0,
          "added tokens decode to their content");
    CHECK(tok_stream_put(&(tok_stream){t, {0}, 0}, 100000, c[0], 15) == 0, "unknown id adds nothing");

    int all[256];
    for (int b = 0; b < 256; b++) all[b] = b;
    size_t len;
    char *s = tok_decode(t, all, 256, &len);
    int ok = len == 256;
    for (int b = 0; ok && b < 256; b++) ok = (unsigned char)s[b] == b;
    CHECK(ok, "every byte piece decodes to its byte");
    free(s);
    tok_free(t);
}

/* The piece cache is shared: threads encoding at once must get what one thread gets alone. */
typedef struct { const tokenizer *t; int ids[1300]; int n; } encode_job;

static void *encode_job_run(void *arg) {
    encode_job *j = arg;
    char text[1200];
    for (int i = 0; i < 1200; i++) text[i] = "ab-c a--b x-b "[i % 14];
    for (int round = 0; round < 50; round++) j->n = tok_encode(j->t, text, sizeof text, j->ids, 1300, NULL, 0);
    return NULL;
}

static void test_threads(void) {
    tokenizer *t = byte_level_tok(NULL, NULL, 0);
    encode_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].t = t;
        pthread_create(&th[i], NULL, encode_job_run, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    int same = jobs[0].n > 0 && jobs[0].n <= 1300;
    for (int i = 1; i < 4 && same; i++)
        same = jobs[i].n == jobs[0].n && memcmp(jobs[i].ids, jobs[0].ids, sizeof(int) * (size_t)jobs[0].n) == 0;
    CHECK(same, "concurrent encodes agree (%d ids)", jobs[0].n);
    tok_free(t);
}

int main(void) {
    test_split_behaviors();
    test_added_tokens();
    test_untrusted_spans();
    test_errors();
    test_byte_fallback();
    test_stream_decoder();
    test_threads();
    char path[64];
    snprintf(path, sizeof path, "/tmp/cairn_test_tok_%d.json", (int)getpid());
    unlink(path);
    return TEST_END();
}
