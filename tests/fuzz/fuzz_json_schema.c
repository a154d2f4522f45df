/* fuzz_json_schema — the JSON Schema compiler (json_schema_grammar) and its pattern subset on
 * arbitrary JSON text: refused with a message naming the problem, or compiled to GBNF that
 * grammar_parse always accepts (a generated grammar that does not parse is a bug). */
#include <stdint.h>
#include <stdlib.h>

#include "core/grammar.h"
#include "core/json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[400] = "";
    sbuf g = {0};
    if (json_schema_grammar((const char *)data, size, &g, err, sizeof err)) {
        if (!err[0]) abort();
        sbuf_free(&g);
        return 0;
    }
    grammar *gr = grammar_parse(g.p, g.len, err, sizeof err);
    if (!gr) abort();
    gm *m = gm_new(gr);
    gm_feed(m, data, size);
    gm_free(m);
    grammar_free(gr);
    sbuf_free(&g);
    return 0;
}
