/* fuzz.h — what several fuzz targets share: the real tokenizer.json they encode with
 * (tests/fuzz/tokenizer.json, DeepSeek-style specials; CAIRN_FUZZ_TOKENIZER overrides). */
#ifndef CAIRN_FUZZ_H
#define CAIRN_FUZZ_H

#include <stdio.h>
#include <stdlib.h>

#include "core/tokenizer.h"

/* Load it once, from LLVMFuzzerInitialize; a target cannot run without it. */
static inline tokenizer *fuzz_tokenizer(const char *target) {
    const char *path = getenv("CAIRN_FUZZ_TOKENIZER");
    char err[256];
    tokenizer *t = tok_load(path ? path : "tests/fuzz/tokenizer.json", err, sizeof err);
    if (!t) {
        fprintf(stderr, "%s: %s\n", target, err);
        exit(1);
    }
    return t;
}

#endif
