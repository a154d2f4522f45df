/* fuzz_config — a family's config.json parser and checkpoint validation (family_ops.load) on
 * arbitrary config.json text, against the real tiny checkpoint of each family: every key missing,
 * of the wrong type or out of range, and every shape that no longer matches the tensors, must be
 * refused with a message naming it, never crash or allocate without bound.
 *
 * CAIRN_FUZZ_MODELS lists the model directories (colon-separated); byte 0 of the input picks one,
 * the rest is its config.json. The family is the directory's own, so a mutated model_type only
 * tests the parser. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "models/model.h"

enum { MAX_MODELS = 8 };
static struct {
    st_file *st;
    const family_ops *ops;
} models[MAX_MODELS];
static int nmodels;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *list = getenv("CAIRN_FUZZ_MODELS");
    char err[512], *dirs = strdup(list ? list : ""), *save = NULL;
    for (char *d = strtok_r(dirs, ":", &save); d && nmodels < MAX_MODELS; d = strtok_r(NULL, ":", &save)) {
        if (!(models[nmodels].ops = family_of_dir(d, err, sizeof err)) ||
            !(models[nmodels].st = st_open(d, 0, err, sizeof err))) {
            fprintf(stderr, "fuzz_config: %s: %s\n", d, err);
            exit(1);
        }
        nmodels++;
    }
    free(dirs);
    if (!nmodels) {
        fprintf(stderr, "fuzz_config: set CAIRN_FUZZ_MODELS to model directories\n");
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int i = data[0] % nmodels;
    cJSON *cfg = cJSON_ParseWithLength((const char *)data + 1, size - 1);
    if (!cfg) return 0;
    model m = {.config = cfg, .st = models[i].st, .ops = models[i].ops, .bos_id = -1, .max_ctx = 4096};
    char err[512] = "";
    tt_init(&m.weights, m.st, err, sizeof err);      /* as model_open does */
    if (m.ops->load(&m, err, sizeof err) && !err[0]) abort();
    if (m.priv) m.ops->free(&m);    /* as model_close does, after a failed load too */
    tt_free(&m.weights);
    cJSON_Delete(cfg);
    return 0;
}
