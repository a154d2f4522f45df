/* util.h — small helpers every module uses: error buffers, checked allocation, clocks.
 *
 * ERROR POLICY (the whole code base follows it): a function that can fail returns an int
 * (0 = ok, negative = failure) and, when given one, writes a one-line human message into a
 * caller buffer `err` of `errlen` bytes. Messages name the thing that was wrong (tensor, file,
 * key, field). exit() is only called from main() at start-up.
 */
#ifndef CAIRN_UTIL_H
#define CAIRN_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* printf into err (if non-NULL) and return -1, so `return errf(err, n, "...")` reads naturally. */
int errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Allocation that never returns NULL: prints and aborts. Use only where running out of memory
 * cannot be handled meaningfully (start-up, tiny bookkeeping). Paths where an allocation failure
 * must degrade gracefully (reuse records, checkpoints) call malloc directly and check. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

double now_seconds(void);        /* monotonic clock */
size_t rss_bytes(void);          /* resident set size of this process (0 if unknown) */

/* Read a whole file into a NUL-terminated heap buffer; *len gets its size. NULL + err on failure. */
char *read_file(const char *path, size_t *len, char *err, size_t errlen);

/* FNV-1a 64-bit hash, for fingerprints and hash tables. `h` is the running value (start with FNV64_INIT). */
#define FNV64_INIT 0xcbf29ce484222325ULL
uint64_t fnv64(uint64_t h, const void *data, size_t n);

/* Crash-test point. With CAIRN_FAULT_KILL_AT=N in the environment the process SIGKILLs itself
 * at the N-th call (counted over its lifetime from 1), as a power cut or kill -9 would stop it;
 * without it a no-op. Code that must survive being cut anywhere (persistence) calls it before
 * every step that changes a file, so tests can cut it at each step in turn. */
void fault_point(void);

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
