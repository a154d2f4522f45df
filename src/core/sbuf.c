#include "sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static void reserve(sbuf *b, size_t n) {
    if (b->len + n + 1 <= b->cap) return;
    b->cap = MAX(b->cap * 2, b->len + n + 256);
    b->p = xrealloc(b->p, b->cap);
}

void sbuf_put(sbuf *b, const char *s, size_t n) {
    reserve(b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void sbuf_puts(sbuf *b, const char *s) { sbuf_put(b, s, strlen(s)); }

void sbuf_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *sbuf_take(sbuf *b) {
    char *s = b->p ? b->p : xstrdup("");
    memset(b, 0, sizeof *b);
    return s;
}

void sbuf_free(sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
