/* fuzz_persist — the readers of persisted state on arbitrary files: persist_load (the --kv-dir
 * rows file + tail file) and snapshot_read (a snapshot stream), into a state with every part
 * kind (span-1 and span-4 ROWS, a RING, a RECUR). A file that fails any check is refused with a
 * reason and leaves the state empty; one that loads gives a record of ids >= 0 within capacity.
 *
 * Input: a 2-byte little-endian length L, L bytes of rows file, the rest the tail file; the whole
 * input is also read as a snapshot stream. CAIRN_FUZZ_PERSIST_SEEDS=DIR writes a few valid inputs
 * (states of several lengths saved by persist_save) there and exits: the committed corpus. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "state/persist.h"
#include "state/state.h"

enum { CAP = 64 };
static const uint64_t FP = 0x5eed;
static char dir[256], rows_path[300], tail_path[300];

static void layout(state *s) {
    state_init(s, CAP);
    state_add_part(s, PART_ROWS, "rows", 8, CAP, 1, 0);
    state_add_part(s, PART_ROWS, "crows", 8, CAP / 4, 4, 0);
    state_add_part(s, PART_RING, "ring", 8, 8, 1, 0);
    state_add_part(s, PART_RECUR, "recur", 16, 1, 1, 0);
}

static void put(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f)) abort();
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { *n = 0; return NULL; }
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    uint8_t *b = malloc(*n + 1);
    if (fread(b, 1, *n, f) != *n) abort();
    fclose(f);
    return b;
}

/* Save a state of len positions, then write rows+tail as one input file. */
static void write_seed(const char *out_dir, int len) {
    state s;
    layout(&s);
    int ids[CAP];
    for (int i = 0; i < len; i++) ids[i] = i * 7 % 50;
    for (int p = 0; p < s.nparts; p++)
        for (size_t b = 0; b < (size_t)s.parts[p].rows * s.parts[p].row_bytes; b++) s.parts[p].buf[b] = (unsigned char)(b * 31 + p);
    state_record(&s, ids, 0, len);
    char err[256];
    if (persist_save(dir, 0, &s, FP, err, sizeof err)) { fprintf(stderr, "seed: %s\n", err); exit(1); }
    size_t rn, tn;
    uint8_t *rows = slurp(rows_path, &rn), *tail = slurp(tail_path, &tn);
    char path[512];
    snprintf(path, sizeof path, "%s/seed-%d", out_dir, len);
    FILE *f = fopen(path, "wb");
    uint8_t head[2] = {(uint8_t)rn, (uint8_t)(rn >> 8)};
    fwrite(head, 1, 2, f);
    fwrite(rows, 1, rn, f);
    if (tail) fwrite(tail, 1, tn, f);
    fclose(f);
    free(rows);
    free(tail);
    persist_forget();
    state_deinit(&s);
}

static void cleanup(void) {
    unlink(rows_path);
    unlink(tail_path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/cairn-fuzz-kv-%d-XXXXXX", tmp ? tmp : "/tmp", (int)getpid());
    if (!mkdtemp(dir)) abort();
    snprintf(rows_path, sizeof rows_path, "%s/slot-0.cairnkv", dir);
    snprintf(tail_path, sizeof tail_path, "%s/slot-0.cairnkv.tail", dir);
    atexit(cleanup);
    const char *seeds = getenv("CAIRN_FUZZ_PERSIST_SEEDS");
    if (seeds) {
        int lens[] = {1, 5, 8, 37};
        for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) write_seed(seeds, lens[i]);
        exit(0);
    }
    return 0;
}

static void check_loaded(const state *s, int rc) {
    if (rc != 1 && s->len != 0) abort();
    if (s->len < 0 || s->len > CAP) abort();
    for (int i = 0; i < s->len; i++)
        if (s->ids[i] < 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t rn = (size_t)(data[0] | data[1] << 8);
    if (rn > size - 2) rn = size - 2;
    put(rows_path, data + 2, rn);
    if (size - 2 - rn) put(tail_path, data + 2 + rn, size - 2 - rn);
    else unlink(tail_path);
    state s;
    layout(&s);
    char err[256];
    persist_forget();
    check_loaded(&s, persist_load(dir, 0, &s, FP, err, sizeof err));
    state_deinit(&s);

    FILE *f = fmemopen((void *)data, size, "rb");
    snapshot *snap = f ? snapshot_read(f, FP, err, sizeof err) : NULL;
    if (f) fclose(f);
    if (snap) {
        state r;
        layout(&r);
        state_restore(&r, snap);
        check_loaded(&r, 1);
        state_deinit(&r);
        snapshot_free(snap);
    }
    return 0;
}
