/* fuzz_tokenize — encoding and decoding arbitrary bytes with a real byte-level tokenizer.json
 * (tests/fuzz/tokenizer.json, DeepSeek-style specials; CAIRN_FUZZ_TOKENIZER overrides).
 *
 * The first byte picks how much of the text is untrusted. Checked beyond the sanitizers: valid
 * UTF-8 round-trips through encode + decode (whole, plain and untrusted), an all-untrusted text
 * yields no special id, the streaming decoder's output equals tok_decode, and invalid UTF-8 is
 * refused rather than encoded. Arbitrary ids (the input read as int16s) decode without fault. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tokenizer.h"
#include "fuzz.h"

static tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    tok = fuzz_tokenizer("fuzz_tokenize");
    return 0;
}

static void round_trip(const char *text, size_t n, const int *ids, int k) {
    size_t len;
    char *dec = tok_decode(tok, ids, k, &len);
    if (len != n || memcmp(dec, text, n)) abort();
    size_t cap = tok_max_token_bytes(tok) + 4, w = 0;
    char *streamed = malloc(cap * (size_t)(k + 1) + 1);
    tok_stream s;
    tok_stream_init(&s, tok);
    for (int i = 0; i < k; i++) w += tok_stream_put(&s, ids[i], streamed + w, cap);
    w += tok_stream_finish(&s, streamed + w, cap);
    if (w != n || memcmp(streamed, text, n)) abort();
    free(streamed);
    free(dec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    int cap = (int)n + 8, *ids = malloc(sizeof(int) * (size_t)cap);
    char err[128];
    int k = tok_encode(tok, text, n, ids, cap, err, sizeof err);
    if (k > cap) abort();
    if (k >= 0) {
        round_trip(text, n, ids, k);
        k = tok_encode_plain(tok, text, n, ids, cap, err, sizeof err);
        if (k < 0 || k > cap) abort();
        round_trip(text, n, ids, k);
        /* untrusted: [a, a + len) from the first byte; 0xff = everything */
        size_t a = data[0] == 0xff ? 0 : (data[0] >> 4) * n / 16, len = data[0] == 0xff ? n : (data[0] & 15) * n / 16;
        if (a + len > n) len = n - a;
        tok_span sp = {a, len};
        k = tok_encode_untrusted(tok, text, n, &sp, len > 0, ids, cap, err, sizeof err);
        if (k < 0 || k > cap) abort();
        round_trip(text, n, ids, k);
        for (int i = 0; data[0] == 0xff && i < k; i++)
            if (tok_is_special(tok, ids[i])) abort();
    }
    int m = (int)(n / 2), *raw = malloc(sizeof(int) * (size_t)(m + 1));
    for (int i = 0; i < m; i++) raw[i] = (int16_t)(data[1 + 2 * i] | data[2 + 2 * i] << 8);
    free(tok_decode(tok, raw, m, NULL));
    free(raw);
    free(ids);
    return 0;
}
