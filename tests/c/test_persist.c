/* test_persist.c — --kv-dir slot files on synthetic parts: a "family" whose rows, partly filled
 * compressed rows, ring slots and running summary are deterministic functions of the ids fed, so
 * a wrong append, truncation, tail or load shows up as a byte difference against a state built
 * cold from the same ids. Crashes are simulated by building the files a torn save would leave. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "state/persist.h"
#include "test.h"

#define CAP 48
#define WINDOW 8
#define SPAN 4
#define FP 0x1234abcdULL

/* Rows file layout facts the crash tests need (persist.h): a 32-byte identity block, then the
 * 16-byte commit (count, chain); a record is id, rows, chain. */
#define COMMIT_AT 32
#define COMMIT_BYTES 16
#define RECORD_FIXED (sizeof(int32_t) + sizeof(uint64_t))

enum { WITH_CROWS = 1, WITH_RING = 2, WITH_RECUR = 4, MIXED = WITH_CROWS | WITH_RING | WITH_RECUR };

typedef struct {
    state st;
    int parts;
    uint64_t *rows;     /* ROWS span 1: hash of ids[0..pos] */
    uint64_t *crows;    /* ROWS span SPAN: a hash accumulated over each group, so partly filled rows matter */
    uint64_t *ring;     /* RING: slot pos % WINDOW holds the hash at pos */
    float *recur;       /* RECUR: running sum, filled with -inf on reset */
} fake;

static char dir[64];

static void fake_init(fake *f, int parts, int cap) {
    memset(f, 0, sizeof *f);
    f->parts = parts;
    state_init(&f->st, cap);
    f->rows = state_add_part(&f->st, PART_ROWS, "rows", sizeof(uint64_t), cap, 1, 0);
    if (parts & WITH_CROWS) f->crows = state_add_part(&f->st, PART_ROWS, "crows", sizeof(uint64_t), cap / SPAN, SPAN, 0);
    if (parts & WITH_RING) f->ring = state_add_part(&f->st, PART_RING, "ring", sizeof(uint64_t), WINDOW, 1, 0);
    if (parts & WITH_RECUR) f->recur = state_add_part(&f->st, PART_RECUR, "recur", 4 * sizeof(float), 1, 1, -INFINITY);
}

static void fake_feed(fake *f, const int *ids, int n) {
    for (int i = 0; i < n; i++) {
        int pos = f->st.len;
        uint64_t h = fnv64(pos ? f->rows[pos - 1] : FNV64_INIT, &ids[i], sizeof ids[i]);
        f->rows[pos] = h;
        if (f->crows) {
            uint64_t *c = &f->crows[pos / SPAN];
            *c = fnv64(pos % SPAN ? *c : FNV64_INIT, &ids[i], sizeof ids[i]);
        }
        if (f->ring) f->ring[pos % WINDOW] = h;
        if (f->recur) {
            if (isinf(f->recur[0])) f->recur[0] = 0;
            f->recur[0] += (float)ids[i];
            f->recur[1] = (float)pos;
        }
        state_record(&f->st, &ids[i], pos, 1);
    }
}

static void fake_cold(fake *f, int parts, const int *ids, int n) {
    fake_init(f, parts, CAP);
    fake_feed(f, ids, n);
}

static int fake_equal(const fake *a, const fake *b) {
    int len = a->st.len;
    if (len != b->st.len || !state_usable(&a->st) || !state_usable(&b->st)) return 0;
    if (memcmp(a->st.ids, b->st.ids, (size_t)len * sizeof(int))) return 0;
    if (memcmp(a->rows, b->rows, (size_t)len * sizeof(uint64_t))) return 0;
    if (a->crows && memcmp(a->crows, b->crows, (size_t)((len + SPAN - 1) / SPAN) * sizeof(uint64_t))) return 0;
    for (int p = MAX(0, len - WINDOW); a->ring && p < len; p++)
        if (a->ring[p % WINDOW] != b->ring[p % WINDOW]) return 0;
    return !a->recur || !memcmp(a->recur, b->recur, 4 * sizeof(float));
}

static void make_ids(int *ids, int n, int seed) {
    for (int i = 0; i < n; i++) ids[i] = (i * 37 + seed * 11) % 1000;
}

/* Bytes the records of positions [from, to) take in the rows file of a `parts` layout. */
static long records_bytes(int parts, int from, int to) {
    long b = 0;
    for (int pos = from; pos < to; pos++) {
        b += (long)(RECORD_FIXED + sizeof(uint64_t));
        if ((parts & WITH_CROWS) && (pos + 1) % SPAN == 0) b += (long)sizeof(uint64_t);
    }
    return b;
}

/* ---- files ---- */

static void path_of(char *out, const char *suffix) { snprintf(out, 256, "%s/slot-0.cairnkv%s", dir, suffix); }

static long file_size(const char *suffix) {
    char p[256];
    path_of(p, suffix);
    struct stat st;
    return stat(p, &st) ? -1 : (long)st.st_size;
}

static unsigned char *slurp(const char *suffix, long *n) {
    char p[256];
    path_of(p, suffix);
    size_t len;
    unsigned char *d = (unsigned char *)read_file(p, &len, NULL, 0);
    *n = d ? (long)len : -1;
    return d;
}

static void spill(const char *suffix, const unsigned char *d, long n) {
    char p[256];
    path_of(p, suffix);
    FILE *f = fopen(p, "wb");
    if (f) {
        fwrite(d, 1, (size_t)n, f);
        fclose(f);
    }
}

static void remove_slot_files(void) {
    char p[256];
    path_of(p, "");
    unlink(p);
    path_of(p, ".tail");
    unlink(p);
}

static int save(const fake *f) {
    char err[256] = "";
    int rc = persist_save(dir, 0, &f->st, FP, err, sizeof err);
    CHECK(rc == 0, "save: %s", err);
    return rc;
}

/* Load slot 0 into a fresh fake as a restarted process would (nothing remembered). */
static int load(fake *into, int parts, char *err) {
    persist_forget();
    fake_init(into, parts, CAP);
    err[0] = 0;
    return persist_load(dir, 0, &into->st, FP, err, 256);
}

/* Does slot 0 load as exactly `want`? */
static int loads_as(const fake *want, int parts) {
    fake got;
    char err[256];
    int rc = load(&got, parts, err);
    int ok = rc == 1 && fake_equal(&got, want);
    if (!ok) printf("  load rc %d len %d (want %d): %s\n", rc, got.st.len, want->st.len, err);
    state_deinit(&got.st);
    return ok;
}

/* Is slot 0 refused, leaving the state empty, with a reason mentioning `why`? */
static int refused(int parts, const char *why) {
    fake got;
    char err[256];
    int rc = load(&got, parts, err);
    int ok = rc == -1 && got.st.len == 0 && strstr(err, why) != NULL;
    state_deinit(&got.st);
    return ok;
}

/* ---- tests ---- */

static void test_round_trip(void) {
    static const int layouts[] = {0, WITH_CROWS, MIXED, WITH_RING | WITH_RECUR};
    int ids[CAP];
    make_ids(ids, CAP, 1);
    for (size_t l = 0; l < sizeof layouts / sizeof *layouts; l++) {
        for (int len = 1; len <= CAP; len += 5) {
            fake f;
            fake_cold(&f, layouts[l], ids, len);
            remove_slot_files();
            persist_forget();
            if (save(&f)) { state_deinit(&f.st); continue; }
            CHECK(loads_as(&f, layouts[l]), "layout %d, %d positions", layouts[l], len);
            int needs_tail = (layouts[l] & (WITH_RING | WITH_RECUR)) || ((layouts[l] & WITH_CROWS) && len % SPAN);
            CHECK((file_size(".tail") >= 0) == needs_tail, "layout %d len %d: tail file present = %d", layouts[l], len,
                  file_size(".tail") >= 0);
            CHECK(file_size("") - records_bytes(layouts[l], 0, len) == COMMIT_AT + COMMIT_BYTES,
                  "rows file is header + records: %ld", file_size(""));
            state_deinit(&f.st);
        }
    }
    fake none;
    char err[256];
    remove_slot_files();
    CHECK(load(&none, MIXED, err) == 0 && none.st.len == 0, "no file: nothing saved");
    state_deinit(&none.st);
}

/* Turn 2 appends exactly its records: the file grows by their bytes, the bytes before them are
 * untouched, and rows changed in memory below the old length are NOT rewritten — the proof that
 * the save appended instead of rewriting. */
static void test_append_only(void) {
    for (int parts = 0; parts <= MIXED; parts += MIXED) {
        int ids[CAP];
        make_ids(ids, CAP, 2);
        fake f, want;
        fake_cold(&f, parts, ids, 10);
        fake_cold(&want, parts, ids, 27);
        remove_slot_files();
        persist_forget();
        save(&f);
        long n1;
        unsigned char *before = slurp("", &n1);
        uint64_t saved_row3 = f.rows[3];
        f.rows[3] ^= 0xdead;                       /* same ids, different bytes: invisible to an append */
        fake_feed(&f, ids + 10, 17);
        save(&f);
        long n2;
        unsigned char *after = slurp("", &n2);
        CHECK(n2 - n1 == records_bytes(parts, 10, 27), "layout %d: grew %ld, records %ld", parts, n2 - n1,
              records_bytes(parts, 10, 27));
        CHECK(before && after && n1 <= n2 && !memcmp(before, after, COMMIT_AT) &&
                  !memcmp(before + COMMIT_AT + COMMIT_BYTES, after + COMMIT_AT + COMMIT_BYTES, (size_t)n1 - COMMIT_AT - COMMIT_BYTES),
              "layout %d: bytes before the append changed", parts);
        f.rows[3] = saved_row3;
        CHECK(loads_as(&want, parts), "layout %d: the appended file loads as the cold state", parts);
        fake_feed(&f, ids + 27, 0);
        save(&f);                                   /* nothing new: the file stays byte-identical */
        long n3;
        unsigned char *same = slurp("", &n3);
        CHECK(n3 == n2 && same && after && !memcmp(same, after, (size_t)n2), "layout %d: an unchanged state rewrote", parts);
        free(before);
        free(after);
        free(same);
        state_deinit(&f.st);
        state_deinit(&want.st);
    }
}

/* An edited earlier message: the state diverges at 12 (truncation for all-ROWS, a reset and
 * re-prefill for a recurrent layout); the file drops to the common prefix and extends. */
static void test_truncate_then_extend(void) {
    for (int parts = 0; parts <= MIXED; parts += MIXED) {
        int a[CAP], b[CAP];
        make_ids(a, CAP, 3);
        memcpy(b, a, 12 * sizeof *b);
        make_ids(b + 12, CAP - 12, 4);
        fake f, want;
        fake_cold(&f, parts, a, 30);
        fake_cold(&want, parts, b, 21);
        remove_slot_files();
        persist_forget();
        save(&f);
        long n1;
        unsigned char *before = slurp("", &n1);
        if (state_truncate(&f.st, 12) != STATE_OK) {
            state_reset(&f.st);
            fake_feed(&f, b, 12);
        }
        fake_feed(&f, b + 12, 9);
        save(&f);
        long n2;
        unsigned char *after = slurp("", &n2);
        long prefix = COMMIT_AT + COMMIT_BYTES + records_bytes(parts, 0, 12);
        CHECK(n2 == prefix + records_bytes(parts, 12, 21), "layout %d: %ld bytes, want %ld", parts, n2,
              prefix + records_bytes(parts, 12, 21));
        CHECK(before && after && !memcmp(before + COMMIT_AT + COMMIT_BYTES, after + COMMIT_AT + COMMIT_BYTES,
                                         (size_t)(prefix - COMMIT_AT - COMMIT_BYTES)),
              "layout %d: the common prefix was rewritten", parts);
        CHECK(loads_as(&want, parts), "layout %d: truncated and extended", parts);
        fake_feed(&f, b + 21, 5);                    /* and the next turn appends again */
        fake_feed(&want, b + 21, 5);
        save(&f);
        CHECK(loads_as(&want, parts), "layout %d: extended after the truncation", parts);
        free(before);
        free(after);
        state_deinit(&f.st);
        state_deinit(&want.st);
    }
}

/* A crash during turn 2's save: the records were being appended (commit still turn 1's), or
 * they are committed but the tail rename did not happen. Either loads turn 1. A file cut inside
 * the committed records is refused. */
static void test_torn_writes(void) {
    for (int parts = 0; parts <= MIXED; parts += MIXED) {
        int ids[CAP];
        make_ids(ids, CAP, 5);
        fake f, turn1;
        fake_cold(&f, parts, ids, 9);
        fake_cold(&turn1, parts, ids, 9);
        remove_slot_files();
        persist_forget();
        save(&f);
        long n_old, n_new, n_tail;
        unsigned char *old_rows = slurp("", &n_old), *old_tail = slurp(".tail", &n_tail);
        fake_feed(&f, ids + 9, 14);
        save(&f);
        unsigned char *new_rows = slurp("", &n_new);
        if (!old_rows || !new_rows) { CHECK(0, "files unreadable"); return; }
        int bad = 0;
        for (long cut = n_old; cut <= n_new; cut++) {
            unsigned char *torn = malloc((size_t)n_new);
            memcpy(torn, new_rows, (size_t)cut);
            memcpy(torn + COMMIT_AT, old_rows + COMMIT_AT, COMMIT_BYTES);
            spill("", torn, cut);
            if (old_tail) spill(".tail", old_tail, n_tail);
            bad += !loads_as(&turn1, parts);
            free(torn);
        }
        CHECK(bad == 0, "layout %d: %d torn appends did not load turn 1", parts, bad);
        spill("", new_rows, n_new);
        if (old_tail) {
            spill(".tail", old_tail, n_tail);
            CHECK(loads_as(&turn1, parts), "layout %d: committed rows with turn 1's tail load turn 1", parts);
        }
        bad = 0;
        for (long cut = 0; cut < n_old; cut++) {
            spill("", old_rows, cut);
            bad += !refused(parts, cut < COMMIT_AT + COMMIT_BYTES ? "no header" : "truncated");
        }
        CHECK(bad == 0, "layout %d: %d cuts into committed records were not refused as truncated", parts, bad);
        free(old_rows);
        free(old_tail);
        free(new_rows);
        state_deinit(&f.st);
        state_deinit(&turn1.st);
    }
}

/* Flip every bit of each file in turn: every single one is refused. */
static void flip_every_bit(int parts, const char *suffix) {
    long n;
    unsigned char *good = slurp(suffix, &n);
    if (!good) { CHECK(0, "no %s file", suffix); return; }
    int missed = 0;
    for (long i = 0; i < n; i++)
        for (int bit = 0; bit < 8; bit++) {
            good[i] ^= (unsigned char)(1u << bit);
            spill(suffix, good, n);
            good[i] ^= (unsigned char)(1u << bit);
            if (!refused(parts, "")) {
                missed++;
                printf("  flip of byte %ld bit %d in '%s' was accepted\n", i, bit, suffix);
            }
        }
    spill(suffix, good, n);
    CHECK(missed == 0, "layout %d file '%s': %d flips accepted", parts, suffix, missed);
    free(good);
}

static void test_bit_flips(void) {
    int ids[CAP];
    make_ids(ids, CAP, 6);
    for (int parts = 0; parts <= MIXED; parts += MIXED) {
        fake f;
        fake_cold(&f, parts, ids, 11);
        remove_slot_files();
        persist_forget();
        save(&f);
        flip_every_bit(parts, "");
        if (parts) flip_every_bit(parts, ".tail");
        CHECK(loads_as(&f, parts), "layout %d: restored file loads again", parts);
        state_deinit(&f.st);
    }
}

static void test_foreign(void) {
    int ids[CAP];
    make_ids(ids, CAP, 7);
    fake f, other;
    fake_cold(&f, MIXED, ids, 14);
    remove_slot_files();
    persist_forget();
    save(&f);
    char err[256];
    fake_init(&other, MIXED, CAP);
    persist_forget();
    CHECK(persist_load(dir, 0, &other.st, FP + 1, err, sizeof err) == -1 && other.st.len == 0 &&
              strstr(err, "another model"),
          "another fingerprint: %s", err);
    state_deinit(&other.st);
    CHECK(refused(WITH_CROWS | WITH_RECUR, "another state shape"), "another part layout");
    fake_init(&other, MIXED, CAP + SPAN);
    persist_forget();
    CHECK(persist_load(dir, 0, &other.st, FP, err, sizeof err) == -1 && other.st.len == 0 && strstr(err, "shape"),
          "another context size: %s", err);
    state_deinit(&other.st);
    state_deinit(&f.st);
}

/* The tail: missing, from an earlier length of the same history, from another history. */
static void test_tail_files(void) {
    int a[CAP], b[CAP];
    make_ids(a, CAP, 8);
    memcpy(b, a, 5 * sizeof *b);
    make_ids(b + 5, CAP - 5, 9);
    fake f, at10;
    fake_cold(&f, MIXED, a, 10);
    fake_cold(&at10, MIXED, a, 10);
    remove_slot_files();
    persist_forget();
    save(&f);
    long n10;
    unsigned char *tail10 = slurp(".tail", &n10);
    fake_feed(&f, a + 10, 6);
    save(&f);
    spill(".tail", tail10, n10);
    CHECK(loads_as(&at10, MIXED), "an older tail of the same history resumes at its length");
    char p[256];
    path_of(p, ".tail");
    unlink(p);
    CHECK(refused(MIXED, "no tail file"), "a recurrent layout without its tail is refused");
    fake g;
    fake_cold(&g, MIXED, b, 12);
    persist_forget();
    save(&g);
    spill(".tail", tail10, n10);
    CHECK(refused(MIXED, "another history"), "a tail of another history (same length range) is refused");
    free(tail10);
    state_deinit(&f.st);
    state_deinit(&g.st);
    state_deinit(&at10.st);
}

/* A save that dies while overwriting diverged records (here: the file may not grow past 15
 * records) must already have dropped the commit to the common prefix, so the file loads as that
 * prefix; the next save rewrites the file whole and succeeds. */
static void test_failed_save_keeps_prefix(void) {
    int a[CAP], b[CAP];
    make_ids(a, CAP, 12);
    memcpy(b, a, 12 * sizeof *b);
    make_ids(b + 12, CAP - 12, 13);
    fake f, prefix, want;
    fake_cold(&f, 0, a, 30);
    fake_cold(&prefix, 0, b, 12);
    fake_cold(&want, 0, b, 21);
    remove_slot_files();
    persist_forget();
    save(&f);
    state_truncate(&f.st, 12);
    fake_feed(&f, b + 12, 9);
    struct rlimit old, lim = {.rlim_cur = (rlim_t)(COMMIT_AT + COMMIT_BYTES + records_bytes(0, 0, 15))};
    getrlimit(RLIMIT_FSIZE, &old);
    lim.rlim_max = old.rlim_max;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    char err[256] = "";
    int rc = persist_save(dir, 0, &f.st, FP, err, sizeof err);
    setrlimit(RLIMIT_FSIZE, &old);
    CHECK(rc == -1 && err[0], "the save past the size limit fails with a reason: %s", err);
    CHECK(loads_as(&prefix, 0), "the interrupted save left the common prefix committed");
    save(&f);
    CHECK(loads_as(&want, 0), "the next save recovers");
    state_deinit(&f.st);
    state_deinit(&prefix.st);
    state_deinit(&want.st);
}

/* Files this process did not leave are rewritten whole, never appended to blindly. */
static void test_foreign_changes_rewrite(void) {
    int ids[CAP];
    make_ids(ids, CAP, 10);
    fake f, want;
    fake_cold(&f, MIXED, ids, 20);
    fake_cold(&want, MIXED, ids, 26);
    remove_slot_files();
    persist_forget();
    save(&f);
    long n;
    unsigned char *d = slurp("", &n);
    spill("", d, n / 2);                            /* someone cut the file behind our back */
    fake_feed(&f, ids + 20, 6);
    save(&f);
    CHECK(file_size("") == COMMIT_AT + COMMIT_BYTES + records_bytes(MIXED, 0, 26), "rewritten whole: %ld", file_size(""));
    CHECK(loads_as(&want, MIXED), "a cut file is rewritten, not appended to");
    free(d);
    state_deinit(&f.st);
    state_deinit(&want.st);
}

static void test_taint_empty_and_busy(void) {
    int ids[CAP];
    make_ids(ids, CAP, 11);
    fake f;
    fake_cold(&f, MIXED, ids, 13);
    remove_slot_files();
    persist_forget();
    save(&f);
    fake busy;
    char err[256];
    fake_cold(&busy, MIXED, ids + 1, 3);
    uint64_t row0 = busy.rows[0];
    persist_forget();
    CHECK(persist_load(dir, 0, &busy.st, FP, err, sizeof err) == -1 && busy.st.len == 3 && busy.rows[0] == row0,
          "loading into a non-empty state is refused and changes nothing: %s", err);
    state_deinit(&busy.st);
    state_taint(&f.st);
    save(&f);
    CHECK(file_size("") < 0 && file_size(".tail") < 0, "a tainted state removes its files");
    state_reset(&f.st);
    fake_feed(&f, ids, 4);
    save(&f);
    CHECK(file_size("") > 0, "saved again");
    state_reset(&f.st);
    save(&f);
    CHECK(file_size("") < 0 && file_size(".tail") < 0, "an empty state removes its files");
    state_deinit(&f.st);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/cairn-test-persist-XXXXXX");
    if (!mkdtemp(dir)) { printf("FAIL: cannot create a temporary directory\n"); return 1; }
    test_round_trip();
    test_append_only();
    test_truncate_then_extend();
    test_torn_writes();
    test_bit_flips();
    test_foreign();
    test_tail_files();
    test_foreign_changes_rewrite();
    test_failed_save_keeps_prefix();
    test_taint_empty_and_busy();
    remove_slot_files();
    rmdir(dir);
    persist_forget();
    return TEST_END();
}
