#include "util.h"

#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int errf(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static void out_of_memory(size_t n) {
    fprintf(stderr, "cairn: out of memory allocating %zu bytes\n", n);
    abort();
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) out_of_memory(n);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_memory(n * size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) out_of_memory(n);
    return p;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    long pages_total = 0, pages_resident = 0;
    int ok = fscanf(f, "%ld %ld", &pages_total, &pages_resident) == 2;
    fclose(f);
    return ok ? (size_t)pages_resident * (size_t)sysconf(_SC_PAGESIZE) : 0;
}

char *read_file(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { errf(err, errlen, "cannot open %s", path); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = xrealloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        if (got == 0) break;
        n += got;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); errf(err, errlen, "error reading %s", path); return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

uint64_t fnv64(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001b3ULL; }
    return h;
}

void fault_point(void) {
    static long at = -1, calls;
    if (at < 0) {
        const char *v = getenv("CAIRN_FAULT_KILL_AT");
        at = v ? atol(v) : 0;
    }
    if (at > 0 && ++calls == at) raise(SIGKILL);
}
