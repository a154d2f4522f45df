/* fuzz_tokenizer_json — parsing arbitrary tokenizer.json text (tok_load_text): a bad file is
 * refused with a message, never a crash. A file that loads must encode and decode a fixed text
 * losslessly (its decoder is then exercised on every id it produced). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    tokenizer *t = tok_load_text((const char *)data, size, "fuzz", err, sizeof err);
    if (!t) return 0;
    static const char text[] = "Hello <s> w\xc3\xb6rld  123\n\tab-ab";
    int ids[128];
    int k = tok_encode(t, text, sizeof text - 1, ids, 128, err, sizeof err);
    if (k > 0 && k <= 128) free(tok_decode(t, ids, k, NULL));
    for (int id = -1; id <= tok_vocab_size(t) && id < 4096; id++) {
        tok_piece(t, id);
        free(tok_decode(t, &id, 1, NULL));
    }
    tok_free(t);
    return 0;
}
