/* arena.h — one scratch block per sequence, sized once, carved in order, released to a mark.
 *
 * A family declares how much scratch its forward pass can need for a context (family_ops
 * scratch_bytes, usually computed by running its layout with a measuring arena); the model
 * layer allocates that block once when the sequence is made, and the forward pass takes its
 * buffers from it instead of allocating per call, per layer or per token.
 *
 * INVARIANTS
 *  - Every take is 64-byte aligned and never overlaps another live take.
 *  - A measuring arena (base == NULL) hands out NULL and only counts, so the same layout code
 *    measures and carves: the measured size is exactly what carving that layout uses.
 *  - Taking more than the capacity is a broken scratch_bytes bound, a programming error: it
 *    aborts with a message naming the sizes rather than writing past the block.
 *  - The block starts zeroed (calloc: untouched pages cost no memory); afterwards buffers keep
 *    what the last taker left, so every taker writes before it reads.
 */
#ifndef CAIRN_ARENA_H
#define CAIRN_ARENA_H

#include <stddef.h>

typedef struct {
    char *base;        /* NULL: measuring */
    size_t used, cap;
    void *block;       /* the allocation base points into */
} arena;

/* A real arena of cap bytes (one zeroed allocation); -1 if it cannot be allocated. */
int arena_init(arena *a, size_t cap);
void arena_free(arena *a);
/* n elements of size bytes; NULL while measuring. */
void *arena_take(arena *a, size_t n, size_t size);
/* This thread's own arena of at least `bytes`, emptied: for pool tasks that each need
 * temporaries of their own (a row's attention, say). Grown (contents lost) when too small,
 * never shrunk, as the kernels keep their scratch; aborts when out of memory. One user at a
 * time per thread: a task takes it, carves, and is done with it before it returns. */
arena *arena_thread(size_t bytes);
/* Everything taken after mark is given back by arena_release(a, mark). */
static inline size_t arena_mark(const arena *a) { return a->used; }
static inline void arena_release(arena *a, size_t mark) { a->used = mark; }

#endif
