/* fuzz_grammar — the GBNF parser (grammar_parse) and the matcher on arbitrary bytes: any input is
 * compiled or refused with a message, never a crash; a grammar that compiles is then matched
 * against the input's own bytes (one at a time, as tokens arrive), exercising closure, interning
 * and cache rebuilds (a tiny cache limit forces them). */
#include <stdint.h>
#include <stdlib.h>

#include "core/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[300] = "";
    grammar *g = grammar_parse((const char *)data, size, err, sizeof err);
    if (!g) {
        if (!err[0]) abort();           /* every refusal says why */
        return 0;
    }
    gm *m = gm_new(g);
    gm_set_cache_limit(m, 8);
    for (size_t i = 0; i < size; i++) {
        int s = gm_state(m);
        if (gm_next(m, s, data[i]) == GM_DEAD) {
            if (gm_feed(m, data + i, 1) != -1 || gm_state(m) != s) abort();   /* a rejected feed changes nothing */
            continue;
        }
        if (gm_feed(m, data + i, 1)) abort();
    }
    gm_free(m);
    grammar_free(g);
    return 0;
}
