/* sbuf.h — a growing byte buffer, always NUL-terminated, for building strings (prompts, JSON,
 * SSE events, metrics text).
 *
 * INVARIANT: a zero-initialised sbuf is an empty buffer; after any append p[len] == 0.
 * Appends never fail (xrealloc aborts on exhaustion, which building a reply cannot recover from).
 */
#ifndef CAIRN_SBUF_H
#define CAIRN_SBUF_H

#include <stddef.h>

typedef struct {
    char *p;
    size_t len, cap;
} sbuf;

void sbuf_put(sbuf *b, const char *s, size_t n);
void sbuf_puts(sbuf *b, const char *s);
void sbuf_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hand the string to the caller (an empty buffer gives ""), leaving b empty. */
char *sbuf_take(sbuf *b);
void sbuf_free(sbuf *b);

#endif
