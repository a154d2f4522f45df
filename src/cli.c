#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_numerics(const char *s) {
    if (!strcmp(s, "exact")) return NUMERICS_EXACT;
    if (!strcmp(s, "qat")) return NUMERICS_QAT;
    return -1;
}

int cli_int(const char *sub, const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "cairn %s: bad value for %s: '%s' (expected an integer in [%ld, %ld])\n", sub, flag,
                s ? s : "(missing)", lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_float(const char *sub, const char *flag, const char *s, double *out) {
    char *end;
    double v = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || !isfinite(v)) {
        fprintf(stderr, "cairn %s: bad value for %s: '%s' (expected a number)\n", sub, flag, s ? s : "(missing)");
        return -1;
    }
    *out = v;
    return 0;
}

int cli_expert_cache(const char *sub, model *m, double mb, const char *usage_dir) {
    char err[512];
    if (mb == 0 || !model_expert_cache(m, mb, usage_dir, err, sizeof err)) return 0;
    fprintf(stderr, "cairn %s: %s\n", sub, err);
    return -1;
}

int cli_expert_cache_mb(const char *sub, const char *v, double *mb) {
    if (cli_float(sub, "--expert-cache-mb", v, mb)) return -1;
    if (*mb > 0 && *mb <= 1 << 30) return 0;
    fprintf(stderr, "cairn %s: bad value for --expert-cache-mb: '%s' (expected MiB in (0, %d])\n", sub, v, 1 << 30);
    return -1;
}

size_t cli_mlock(const char *sub, model *m) {
    char msg[512];
    size_t locked = model_mlock(m, msg, sizeof msg);
    fprintf(stderr, "cairn %s: --mlock: %s\n", sub, msg);
    return locked;
}
