/* tool_capture_split — test helper for tests/test_family_contract.py (not a unit test program): a
 * light checkpoint a family captures inside one forward call (state_capture, state.h CAPTURES) is
 * byte for byte the light snapshot of a prefill split at that position, for the real families.
 *
 * tool_capture_split MODEL IDS K1,K2,...   (comma-separated; at most STATE_MAX_CAPTURES positions)
 * feeds IDS in one seq_feed with a capture armed at every K; then, for each K, a fresh sequence is
 * fed exactly IDS[0..K) and snapshotted light. Both are serialized (snapshot_write, the persisted
 * form) and compared. Prints one line per K: {"k": K, "bytes": B, "hash": H, "equal": 0|1}, H the
 * FNV-1a hash of the split snapshot's bytes. Exits 1 on a missed capture or any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "models/model.h"

#define MAX_IDS 1024

static int parse_ids(const char *s, int *out, int max) {
    int n = 0;
    for (char *end; *s && n < max; s = *end ? end + 1 : end) out[n++] = (int)strtol(s, &end, 10);
    return n;
}

/* The snapshot as persisted, into a heap buffer (*len bytes). */
static unsigned char *serialized(const snapshot *snap, uint64_t fingerprint, size_t *len) {
    char err[256];
    FILE *f = tmpfile();
    if (!f || snapshot_write(snap, fingerprint, f, err, sizeof err)) {
        fprintf(stderr, "snapshot_write: %s\n", f ? err : "no tmpfile");
        exit(1);
    }
    *len = (size_t)ftell(f);
    unsigned char *buf = xmalloc(*len ? *len : 1);
    rewind(f);
    if (fread(buf, 1, *len, f) != *len) exit(1);
    fclose(f);
    return buf;
}

static void fail(const char *what, const char *err) {
    fprintf(stderr, "tool_capture_split: %s: %s\n", what, err);
    exit(1);
}

int main(int argc, char **argv) {
    char err[512] = "";
    if (argc != 4) return fprintf(stderr, "usage: tool_capture_split MODEL IDS K1,K2,...\n"), 2;
    int ids[MAX_IDS], ks[STATE_MAX_CAPTURES];
    int n = parse_ids(argv[2], ids, MAX_IDS), nk = parse_ids(argv[3], ks, STATE_MAX_CAPTURES);
    model *m = model_open(argv[1], NUMERICS_QAT, 0, err, sizeof err);
    if (!m) fail("open", err);
    seq *whole = seq_new(m, n, err, sizeof err);
    if (!whole) fail("seq_new", err);
    for (int i = 0; i < nk; i++)
        if (ks[i] < 1 || ks[i] > n || state_capture_arm(&whole->st, ks[i]) != STATE_OK) fail("arm", argv[3]);
    if (seq_feed(whole, ids, n, NULL, err, sizeof err)) fail("feed", err);
    int bad = 0;
    for (int i = 0; i < nk; i++) {
        snapshot *cap = state_capture_take(&whole->st, ks[i]);
        seq *split = seq_new(m, n, err, sizeof err);
        if (!split || seq_feed(split, ids, ks[i], NULL, err, sizeof err)) fail("split feed", err);
        snapshot *ref = state_snapshot(&split->st, 0);
        if (!cap || !ref) fail("capture", cap ? "no split snapshot" : "the capture was missed");
        size_t la, lb;
        unsigned char *a = serialized(cap, m->fingerprint, &la), *b = serialized(ref, m->fingerprint, &lb);
        int equal = la == lb && !memcmp(a, b, la);
        bad |= !equal;
        printf("{\"k\": %d, \"bytes\": %zu, \"hash\": %llu, \"equal\": %d}\n", ks[i], lb,
               (unsigned long long)fnv64(FNV64_INIT, b, lb), equal);
        free(a), free(b);
        snapshot_free(cap), snapshot_free(ref);
        seq_free(split);
    }
    seq_free(whole);
    model_close(m);
    return bad;
}
