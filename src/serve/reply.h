/* reply.h — the text of one generation as a client may see it, built incrementally from the
 * engine's raw DATA bytes.
 *
 * INVARIANTS
 *  - text[0..len) is always valid UTF-8: a multibyte character split across DATA frames is held
 *    back until complete, and bytes that can never form a character become U+FFFD (clients parse
 *    JSON as UTF-8; passing invalid bytes through would corrupt their copy of the reply). So does
 *    a NUL byte: text is a C string, and a NUL inside it would cut the reply short.
 *  - A stop string never reaches the client: when one appears the text is cut where it starts,
 *    `stopped` is set and later bytes are ignored.
 *  - text[0..stable) is final: it cannot be cut later by a stop string that is still being
 *    completed, nor (with hold_markers) end inside a template marker such as `</think>` that
 *    is still arriving. Streaming emits only up to `stable`; reply_finish makes all text stable.
 */
#ifndef CAIRN_REPLY_H
#define CAIRN_REPLY_H

#include <stddef.h>

typedef struct {
    char *text;
    size_t len, cap, stable;
    unsigned char pend[4];        /* an incomplete UTF-8 character at the end of the raw stream */
    int npend, need;
    char **stops;                 /* borrowed */
    int nstops;
    int hold_markers;             /* hold back a trailing "<..." that may be a template marker */
    int stopped;
    int stop_index;               /* which stop string matched, -1 none */
} reply;

void reply_init(reply *r, char **stops, int nstops, int hold_markers);
void reply_free(reply *r);
/* Append raw engine bytes. Returns 1 when a stop string matched during this call. */
int reply_feed(reply *r, const char *raw, size_t n);
/* End of generation: a dangling partial character becomes U+FFFD, everything becomes stable. */
void reply_finish(reply *r);

/* Heap copy of n raw bytes as valid UTF-8 (invalid sequences -> U+FFFD); *out_len gets its length. */
char *utf8_clean(const char *raw, size_t n, size_t *out_len);

#endif
