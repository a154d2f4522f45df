/* arena.c — the scratch arena (see arena.h). */
#include "arena.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { ARENA_ALIGN = 64 };

int arena_init(arena *a, size_t cap) {
    a->used = 0;
    a->cap = cap;
    a->block = calloc(1, cap + ARENA_ALIGN);
    a->base = a->block ? (char *)(((uintptr_t)a->block + ARENA_ALIGN - 1) & ~(uintptr_t)(ARENA_ALIGN - 1)) : NULL;
    return a->block ? 0 : -1;
}

void arena_free(arena *a) {
    free(a->block);
    *a = (arena){0};
}

void *arena_take(arena *a, size_t n, size_t size) {
    size_t bytes = (n * size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    void *p = a->base ? a->base + a->used : NULL;
    if (a->base && a->used + bytes > a->cap) {
        fprintf(stderr, "cairn: scratch arena overflow: %zu + %zu > %zu bytes (the family's scratch_bytes is wrong)\n",
                a->used, bytes, a->cap);
        abort();
    }
    a->used += bytes;
    return p;
}

arena *arena_thread(size_t bytes) {
    static _Thread_local arena block;
    if (bytes > block.cap) {
        arena_free(&block);
        if (arena_init(&block, bytes)) {
            fprintf(stderr, "cairn: out of memory for %zu bytes of per-thread temporaries\n", bytes);
            abort();
        }
    }
    block.used = 0;
    return &block;
}
