/* test_state.c — the generic state on synthetic parts: a "family" whose rows, ring slots and
 * running summary are deterministic functions of the ids fed, so any wrong copy, truncation or
 * restore shows up as a byte difference against a state built cold from the same ids. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "state/state.h"
#include "test.h"

#define CAP 64
#define WINDOW 8
#define SPAN 4

typedef struct {
    state st;
    uint64_t *rows;     /* ROWS span 1: hash of ids[0..pos] */
    uint64_t *crows;    /* ROWS span SPAN: hash of the ids of each completed group */
    uint64_t *ring;     /* RING: slot pos % WINDOW holds the hash at pos */
    float *recur;       /* RECUR: running sum, filled with -inf on reset */
    int ring_part, recur_part;   /* indices for the capture hook */
} fake;

static int fake_init(fake *f, int with_recur) {
    if (state_init(&f->st, CAP)) return -1;
    f->rows = state_add_part(&f->st, PART_ROWS, "rows", sizeof(uint64_t), CAP, 1, 0);
    f->crows = state_add_part(&f->st, PART_ROWS, "crows", sizeof(uint64_t), CAP / SPAN, SPAN, 0);
    f->ring_part = f->st.nparts;
    f->ring = state_add_part(&f->st, PART_RING, "ring", sizeof(uint64_t), WINDOW, 1, 0);
    f->recur_part = f->st.nparts;
    f->recur = with_recur ? state_add_part(&f->st, PART_RECUR, "recur", 4 * sizeof(float), 1, 1, -INFINITY) : NULL;
    return f->rows && f->crows && f->ring && (!with_recur || f->recur) ? 0 : -1;
}

/* The fake forward pass: reads the state the way a family would (previous row, recur), writes
 * position pos, then records the id — exactly the seq_feed order. */
static void fake_feed(fake *f, const int *ids, int n) {
    for (int i = 0; i < n; i++) {
        int pos = f->st.len;
        uint64_t prev = pos ? f->rows[pos - 1] : FNV64_INIT;
        uint64_t h = fnv64(prev, &ids[i], sizeof ids[i]);
        state_capture(&f->st, f->ring_part, pos);
        if (f->recur) state_capture(&f->st, f->recur_part, pos);
        f->rows[pos] = h;
        f->ring[pos % WINDOW] = h;
        if ((pos + 1) % SPAN == 0) f->crows[pos / SPAN] = h;
        if (f->recur) {
            if (isinf(f->recur[0])) f->recur[0] = 0;
            f->recur[0] += (float)ids[i];
            f->recur[1] = (float)pos;
        }
        state_record(&f->st, &ids[i], pos, 1);
    }
}

static int parts_equal(const fake *a, const fake *b) {
    int len = a->st.len;
    if (len != b->st.len) return 0;
    if (memcmp(a->st.ids, b->st.ids, (size_t)len * sizeof(int))) return 0;
    if (memcmp(a->rows, b->rows, (size_t)len * sizeof(uint64_t))) return 0;
    if (memcmp(a->crows, b->crows, (size_t)(len / SPAN) * sizeof(uint64_t))) return 0;
    for (int p = MAX(0, len - WINDOW); p < len; p++)
        if (a->ring[p % WINDOW] != b->ring[p % WINDOW]) return 0;
    if (a->recur && memcmp(a->recur, b->recur, 4 * sizeof(float))) return 0;
    return 1;
}

static void make_ids(int *ids, int n, int seed) {
    for (int i = 0; i < n; i++) ids[i] = (i * 37 + seed * 11) % 1000;
}

static void fake_cold(fake *f, const int *ids, int n, int with_recur) {
    fake_init(f, with_recur);
    fake_feed(f, ids, n);
}

static void test_record_and_taint(void) {
    fake f;
    CHECK(fake_init(&f, 1) == 0, "init");
    int ids[20];
    make_ids(ids, 20, 1);
    fake_feed(&f, ids, 10);
    CHECK(f.st.len == 10 && state_usable(&f.st), "len %d", f.st.len);
    CHECK(state_common_prefix(&f.st, ids, 20) == 10, "lcp of an extension");
    int other[20];
    memcpy(other, ids, sizeof other);
    other[4] = 999;
    CHECK(state_common_prefix(&f.st, other, 20) == 4, "lcp stops at the divergence");
    CHECK(state_common_prefix(&f.st, ids, 3) == 3, "lcp bounded by the prompt");
    /* a record write at the wrong position drops the record */
    state_record(&f.st, ids, 5, 1);
    CHECK(!state_usable(&f.st), "out-of-order record taints");
    CHECK(state_common_prefix(&f.st, ids, 20) == 0, "tainted state shares nothing");
    CHECK(state_snapshot(&f.st, 1) == NULL, "tainted state gives no snapshot");
    state_reset(&f.st);
    CHECK(state_usable(&f.st) && f.st.len == 0, "reset clears taint and record");
    CHECK(isinf(f.recur[0]) && f.recur[0] < 0 && isinf(f.recur[3]), "reset refills RECUR with its fill value");
    fake_feed(&f, ids, 3);
    state_taint(&f.st);
    CHECK(!state_usable(&f.st), "explicit taint");
    state_record(&f.st, ids, f.st.len, CAP);
    CHECK(f.st.len == CAP, "overflowing record clamps len to the capacity");
    state_deinit(&f.st);
}

static void test_truncate_rules(void) {
    int ids[40];
    make_ids(ids, 40, 2);
    fake f;
    /* RECUR: only p == len */
    fake_cold(&f, ids, 6, 1);
    CHECK(state_can_truncate(&f.st, 6), "RECUR: truncate to len is a no-op");
    CHECK(!state_can_truncate(&f.st, 5), "RECUR cannot forget");
    CHECK(state_truncate(&f.st, 3) == STATE_EUNSUPPORTED && f.st.len == 6, "refusal changes nothing");
    state_deinit(&f.st);
    /* RING + ROWS, not wrapped: truncatable */
    fake_cold(&f, ids, WINDOW, 0);
    CHECK(state_can_truncate(&f.st, 3), "ring not wrapped: truncatable");
    CHECK(state_truncate(&f.st, 3) == STATE_OK && f.st.len == 3, "truncate");
    fake_feed(&f, ids + 3, 10);
    fake cold;
    fake_cold(&cold, ids, 13, 0);
    CHECK(parts_equal(&f, &cold), "truncate then extend equals cold");
    /* wrapped now (13 > WINDOW) */
    CHECK(!state_can_truncate(&f.st, 12), "wrapped ring cannot truncate");
    CHECK(state_truncate(&f.st, 12) == STATE_EUNSUPPORTED && f.st.len == 13, "refusal changes nothing");
    CHECK(!state_can_truncate(&f.st, 14) && !state_can_truncate(&f.st, -1), "out of range");
    state_deinit(&f.st);
    state_deinit(&cold.st);
    /* ROWS alone: any p */
    state s;
    state_init(&s, CAP);
    CHECK(state_add_part(&s, PART_ROWS, "r", 8, CAP, 1, 0) != NULL, "rows part");
    state_record(&s, ids, 0, 30);
    CHECK(state_truncate(&s, 0) == STATE_OK && s.len == 0, "ROWS truncate to 0");
    state_record(&s, ids, 0, 30);
    state_taint(&s);
    CHECK(!state_can_truncate(&s, 10), "tainted state does not truncate");
    state_deinit(&s);
}

static void test_snapshot_roundtrip(void) {
    int ids[40];
    make_ids(ids, 40, 3);
    fake a, b, cold;
    fake_cold(&a, ids, 21, 1);
    snapshot *snap = state_snapshot(&a.st, 1);
    CHECK(snap && snapshot_len(snap) == 21 && snapshot_has_rows(snap), "full snapshot");
    CHECK(memcmp(snapshot_ids(snap), ids, 21 * sizeof(int)) == 0, "snapshot carries the record");
    fake_feed(&a, ids + 21, 5);
    /* restore into a different, fresh state of the same layout */
    fake_init(&b, 1);
    CHECK(state_restore(&b.st, snap) == STATE_OK, "restore full into fresh");
    fake_cold(&cold, ids, 21, 1);
    CHECK(parts_equal(&b, &cold), "restored == cold, byte for byte");
    fake_feed(&b, ids + 21, 10);
    state_deinit(&cold.st);
    fake_cold(&cold, ids, 31, 1);
    CHECK(parts_equal(&b, &cold), "restore then extend == cold");
    /* rewinding a RECUR state via snapshot */
    CHECK(state_restore(&a.st, snap) == STATE_OK && a.st.len == 21, "rewind by restore");
    state_deinit(&cold.st);
    fake_cold(&cold, ids, 21, 1);
    CHECK(parts_equal(&a, &cold), "rewound == cold");
    CHECK(snapshot_bytes(snap) > 21 * 8, "bytes reported");
    snapshot_free(snap);
    state_deinit(&a.st);
    state_deinit(&b.st);
    state_deinit(&cold.st);
}

static void test_light_and_mismatch(void) {
    int ids[40], other[40];
    make_ids(ids, 40, 4);
    make_ids(other, 40, 5);
    fake a, b, cold;
    fake_cold(&a, ids, 12, 1);
    snapshot *light = state_snapshot(&a.st, 0);
    snapshot *full = state_snapshot(&a.st, 1);
    CHECK(light && !snapshot_has_rows(light) && snapshot_bytes(light) < snapshot_bytes(full), "light is smaller");
    fake_feed(&a, ids + 12, 10);
    CHECK(state_restore(&a.st, light) == STATE_OK && a.st.len == 12, "light restore into the state that holds its rows");
    fake_cold(&cold, ids, 12, 1);
    CHECK(parts_equal(&a, &cold), "light restore == cold");
    fake_feed(&a, ids + 12, 3);
    state_deinit(&cold.st);
    fake_cold(&cold, ids, 15, 1);
    CHECK(parts_equal(&a, &cold), "light restore then extend == cold");
    /* a state whose record diverged before the snapshot's end cannot take it */
    fake_cold(&b, other, 20, 1);
    int before = b.st.len;
    CHECK(state_restore(&b.st, light) == STATE_EMISMATCH && b.st.len == before, "light into a foreign record refused");
    state_reset(&b.st);
    CHECK(state_restore(&b.st, light) == STATE_EMISMATCH, "light into an empty state refused");
    CHECK(state_restore(&b.st, full) == STATE_OK, "full into an empty state works");
    state_deinit(&b.st);
    /* another layout (no RECUR part) refuses both */
    fake_cold(&b, other, 20, 0);
    CHECK(state_restore(&b.st, full) == STATE_EMISMATCH && b.st.len == 20, "other layout refused, unchanged");
    state_deinit(&b.st);
    /* another context size is another shape too */
    state s;
    state_init(&s, CAP * 2);
    state_add_part(&s, PART_ROWS, "rows", sizeof(uint64_t), CAP * 2, 1, 0);
    state_add_part(&s, PART_ROWS, "crows", sizeof(uint64_t), CAP * 2 / SPAN, SPAN, 0);
    state_add_part(&s, PART_RING, "ring", sizeof(uint64_t), WINDOW, 1, 0);
    state_add_part(&s, PART_RECUR, "recur", 4 * sizeof(float), 1, 1, -INFINITY);
    CHECK(state_restore(&s, full) == STATE_EMISMATCH, "other capacity refused");
    state_deinit(&s);
    snapshot_free(light);
    snapshot_free(full);
    state_deinit(&a.st);
    state_deinit(&cold.st);
}

static unsigned char *file_bytes(FILE *f, long *n) {
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    unsigned char *b = malloc((size_t)*n);
    rewind(f);
    if (fread(b, 1, (size_t)*n, f) != (size_t)*n) *n = -1;
    return b;
}

static snapshot *read_bytes(const unsigned char *b, long n, uint64_t fp, char *err, size_t errlen) {
    FILE *f = tmpfile();
    if (n > 0) fwrite(b, 1, (size_t)n, f);
    rewind(f);
    snapshot *s = snapshot_read(f, fp, err, errlen);
    fclose(f);
    return s;
}

static void test_persist(void) {
    int ids[40];
    make_ids(ids, 40, 6);
    fake a, b, cold;
    fake_cold(&a, ids, 17, 1);
    snapshot *snap = state_snapshot(&a.st, 1);
    const uint64_t fp = 0x1234abcdULL;
    char err[256] = "";
    FILE *f = tmpfile();
    CHECK(snapshot_write(snap, fp, f, err, sizeof err) == 0, "write: %s", err);
    long n;
    unsigned char *bytes = file_bytes(f, &n);
    fclose(f);
    CHECK(n > (long)snapshot_bytes(snap), "file holds header + blob (%ld)", n);
    snapshot *back = read_bytes(bytes, n, fp, err, sizeof err);
    CHECK(back && snapshot_bytes(back) == snapshot_bytes(snap) && memcmp(back, snap, snapshot_bytes(snap)) == 0,
          "byte-exact round trip: %s", err);
    fake_init(&b, 1);
    CHECK(back && state_restore(&b.st, back) == STATE_OK, "restore what was read");
    fake_feed(&b, ids + 17, 5);
    fake_cold(&cold, ids, 22, 1);
    CHECK(parts_equal(&b, &cold), "read, restore, extend == cold");
    snapshot_free(back);

    /* every torn length reads as absent, with a reason */
    int torn_ok = 1;
    for (long cut = 0; cut < n; cut++) {
        err[0] = 0;
        snapshot *t = read_bytes(bytes, cut, fp, err, sizeof err);
        if (t || !err[0]) { torn_ok = 0; printf("cut %ld accepted\n", cut); snapshot_free(t); }
    }
    CHECK(torn_ok, "every truncation refused");
    snapshot *t = read_bytes(bytes, n, fp + 1, err, sizeof err);
    CHECK(!t && strstr(err, "another model"), "foreign fingerprint: %s", err);
    /* the length is written last: a file whose length field was never written is absent */
    unsigned char *unfinished = malloc((size_t)n);
    memcpy(unfinished, bytes, (size_t)n);
    memset(unfinished + 48, 0xff, 4);
    t = read_bytes(unfinished, n, fp, err, sizeof err);
    CHECK(!t && strstr(err, "never completed"), "unfinished write: %s", err);
    /* flipping any single payload byte is caught */
    int corrupt_ok = 1;
    for (long i = 56; i < n; i += 7) {
        memcpy(unfinished, bytes, (size_t)n);
        unfinished[i] ^= 0x5a;
        t = read_bytes(unfinished, n, fp, err, sizeof err);
        if (t) { corrupt_ok = 0; printf("flip at %ld accepted\n", i); snapshot_free(t); }
    }
    CHECK(corrupt_ok, "every corruption refused");
    memcpy(unfinished, bytes, (size_t)n);
    unfinished[0] = 'X';
    t = read_bytes(unfinished, n, fp, err, sizeof err);
    CHECK(!t && strstr(err, "magic"), "bad magic: %s", err);
    free(unfinished);
    free(bytes);
    snapshot_free(snap);
    state_deinit(&a.st);
    state_deinit(&b.st);
    state_deinit(&cold.st);
}

static void test_sizes(void) {
    fake f;
    fake_init(&f, 1);
    CHECK(state_bytes_per_token(&f.st) == 8 + 8 / SPAN, "per token %zu", state_bytes_per_token(&f.st));
    CHECK(state_fixed_bytes(&f.st) == WINDOW * 8 + 16, "fixed %zu", state_fixed_bytes(&f.st));
    CHECK(state_add_part(&f.st, PART_ROWS, "bad", 0, 4, 1, 0) == NULL, "zero-size part refused");
    CHECK(state_add_part(&f.st, PART_ROWS, "bad", 8, 4, 0, 0) == NULL, "zero span refused");
    CHECK(state_add_part(&f.st, PART_ROWS, "huge", SIZE_MAX / 2, 4, 1, 0) == NULL, "overflowing part refused");
    CHECK(f.st.nparts == 4, "refused parts not added");
    state_deinit(&f.st);
}

static void test_always_truncatable(void) {
    state s;
    state_init(&s, 32);
    state_add_part(&s, PART_ROWS, "rows", 8, 32, 1, 0);
    state_add_part(&s, PART_RING, "long ring", 8, 32, 1, 0);
    CHECK(state_always_truncatable(&s), "rows + a ring as long as the context");
    state_add_part(&s, PART_RING, "window", 8, 8, 1, 0);
    CHECK(!state_always_truncatable(&s), "a ring shorter than the context wraps");
    state_deinit(&s);
    state_init(&s, 32);
    state_add_part(&s, PART_RECUR, "recur", 8, 1, 1, 0);
    CHECK(!state_always_truncatable(&s), "a recurrence never truncates");
    state_deinit(&s);
}

/* Is snap byte for byte the light snapshot of a cold state fed ids[0..p)? */
static int same_as_cold_light(const snapshot *snap, const int *ids, int p, int with_recur) {
    fake cold;
    fake_cold(&cold, ids, p, with_recur);
    snapshot *ref = state_snapshot(&cold.st, 0);
    int ok = snap && ref && snapshot_bytes(snap) == snapshot_bytes(ref) && !memcmp(snap, ref, snapshot_bytes(ref));
    snapshot_free(ref);
    state_deinit(&cold.st);
    return ok;
}

/* Captures taken inside one feed equal snapshots of states fed exactly p tokens, at positions
 * before and after the ring wraps, at the start of the feed, and at its very end. */
static void test_capture_matches_snapshot(void) {
    int ids[60];
    make_ids(ids, 60, 9);
    for (int with_recur = 0; with_recur <= 1; with_recur++) {
        fake f;
        CHECK(fake_init(&f, with_recur) == 0, "init");
        fake_feed(&f, ids, 3);
        const int at[] = {3, 5, 8, 13, 41, 50};
        for (int i = 0; i < 6; i++) CHECK(state_capture_arm(&f.st, at[i]) == STATE_OK, "arm %d", at[i]);
        CHECK(state_capture_arm(&f.st, 5) == STATE_OK && f.st.ncaptures == 6, "re-arming %d is one capture", 5);
        fake_feed(&f, ids + 3, 47);
        for (int i = 0; i < 6; i++) {
            snapshot *snap = state_capture_take(&f.st, at[i]);
            CHECK(snap && snapshot_len(snap) == at[i] && !snapshot_has_rows(snap), "captured %d", at[i]);
            CHECK(same_as_cold_light(snap, ids, at[i], with_recur), "capture %d == snapshot after %d (recur %d)",
                  at[i], at[i], with_recur);
            snapshot_free(snap);
        }
        CHECK(f.st.ncaptures == 0 && !state_capture_take(&f.st, 8), "taking disarms");
        state_deinit(&f.st);
    }
}

/* What must not give a snapshot: a position the feed never reached, a part the family never
 * offered to the hook, a position behind the record; and the fixed number of slots. */
static void test_capture_refusals(void) {
    int ids[60];
    make_ids(ids, 60, 10);
    fake f;
    fake_init(&f, 1);
    fake_feed(&f, ids, 10);
    CHECK(state_capture_arm(&f.st, 9) == STATE_EUNSUPPORTED, "behind the record");
    CHECK(state_capture_arm(&f.st, 30) == STATE_OK, "arm 30");
    fake_feed(&f, ids + 10, 10);
    CHECK(!state_capture_take(&f.st, 30), "never reached: NULL");
    CHECK(state_capture_arm(&f.st, 22) == STATE_OK, "arm 22");
    state_record(&f.st, ids + 20, 20, 5);   /* positions fed without the hook */
    CHECK(!state_capture_take(&f.st, 22), "parts never captured: NULL");
    for (int i = 0; i < STATE_MAX_CAPTURES; i++) state_capture_arm(&f.st, 40 + i);
    CHECK(state_capture_arm(&f.st, 60) == STATE_EUNSUPPORTED, "no free slot");
    state_reset(&f.st);
    CHECK(f.st.ncaptures == 0, "reset disarms");
    state_deinit(&f.st);
}

/* A state with only ROWS parts has nothing to capture: the capture is the ids alone. */
static void test_capture_rows_only(void) {
    state s;
    state_init(&s, CAP);
    CHECK(state_add_part(&s, PART_ROWS, "rows", 8, CAP, 1, 0) != NULL, "part");
    int ids[10];
    make_ids(ids, 10, 11);
    CHECK(state_capture_arm(&s, 6) == STATE_OK, "arm without non-ROWS parts");
    state_record(&s, ids, 0, 4);
    CHECK(!state_capture_take(&s, 6), "not reached yet");
    CHECK(state_capture_arm(&s, 6) == STATE_OK, "arm again");
    state_record(&s, ids + 4, 4, 2);
    snapshot *snap = state_capture_take(&s, 6), *ref = state_snapshot(&s, 0);
    CHECK(snap && ref && snapshot_bytes(snap) == snapshot_bytes(ref) && !memcmp(snap, ref, snapshot_bytes(ref)),
          "rows-only capture == light snapshot");
    snapshot_free(snap);
    snapshot_free(ref);
    state_deinit(&s);
}

/* Rewinds (speculative decoding's rejected drafts): after a feed of n + 1 tokens past a wrapped
 * ring and a RECUR summary (which cannot truncate), rewinding to every position the arm covered
 * gives exactly the cold state of that prefix, and the captures not used are gone; a position
 * the arm did not cover is refused and changes nothing. */
static void test_rewind(void) {
    int ids[40];
    make_ids(ids, 40, 12);
    for (int keep = 1; keep <= 5; keep++) {
        fake f, cold;
        fake_cold(&f, ids, 20, 1);
        CHECK(state_rewind_arm(&f.st, 4) == 4, "four positions armed");
        fake_feed(&f, ids + 20, 5);
        CHECK(state_rewind(&f.st, 20 + keep) == STATE_OK, "rewind to %d", 20 + keep);
        fake_cold(&cold, ids, 20 + keep, 1);
        CHECK(parts_equal(&f, &cold) && f.st.ncaptures == 0, "rewound to %d == cold, no capture left", 20 + keep);
        state_deinit(&f.st);
        state_deinit(&cold.st);
    }
    fake f;
    fake_cold(&f, ids, 20, 1);
    CHECK(state_rewind_arm(&f.st, 2) == 2, "two positions armed");
    fake_feed(&f, ids + 20, 5);
    CHECK(state_rewind(&f.st, 23) == STATE_EUNSUPPORTED && f.st.len == 25, "23 was not armed: refused, unchanged");
    CHECK(f.st.ncaptures == 0, "the refused rewind dropped its captures");
    state_deinit(&f.st);
    state s;
    state_init(&s, CAP);
    state_add_part(&s, PART_ROWS, "rows", 8, CAP, 1, 0);
    CHECK(state_rewind_arm(&s, 6) == 6 && s.ncaptures == 0, "a state that always truncates arms nothing");
    state_deinit(&s);
}

int main(void) {
    test_rewind();
    test_capture_matches_snapshot();
    test_capture_refusals();
    test_capture_rows_only();
    test_always_truncatable();
    test_record_and_taint();
    test_truncate_rules();
    test_snapshot_roundtrip();
    test_light_and_mismatch();
    test_persist();
    test_sizes();
    return TEST_END();
}
