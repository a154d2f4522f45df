/* test_reuse.c — the reuse decision and the checkpointing prefill on two synthetic families:
 * "rows" (ROWS + an unwrapped RING: truncatable, like GLM's MLA) and "recur" (ROWS + a small
 * RING + a RECUR summary: extend-only, like DeepSeek V4). Their forward passes read the state
 * they extend, so a wrong reuse shows up as different bytes. Every warm state is compared with
 * a state built cold from the same ids: full snapshots byte for byte, and the last logits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "models/model.h"
#include "test.h"

#define CTX 96
#define VOCAB 50
#define BAD_ID 49           /* feeding it makes the fake forward fail */
#define MARK 7              /* role-marker id */

typedef struct {
    state *st;
    uint64_t *rows, *ring, *recur;
    int ring_part, recur_part;  /* part indices for the capture hook */
    int window;
} fake_seq;

static int forward_calls;   /* counts splits: each forward call streams the weights once */

static void *fake_seq_new(model *m, state *st, int ctx, arena *scratch, char *err, size_t errlen) {
    int extend_only = *(int *)m->priv;
    fake_seq *f = xcalloc(1, sizeof *f);
    f->st = st;
    f->window = extend_only ? 8 : ctx;
    f->rows = state_add_part(st, PART_ROWS, "rows", 8, ctx, 1, 0);
    f->ring_part = st->nparts;
    f->ring = state_add_part(st, PART_RING, "ring", 8, f->window, 1, 0);
    f->recur_part = st->nparts;
    if (extend_only) f->recur = state_add_part(st, PART_RECUR, "recur", 8, 1, 1, 0);
    return f;
}

static void fake_seq_free(model *m, void *fam) { free(fam); }

static void fake_logits(uint64_t row, float *logits) {
    for (int v = 0; v < VOCAB; v++) logits[v] = (float)(fnv64(row, &v, sizeof v) & 0xffff) / 65536.0f;
}

/* One segment of a call; the fake family's forward takes every segment in turn. */
static int fake_segment(const fwd_seg *seg, char *err, size_t errlen) {
    fake_seq *f = seg->fam_seq;
    const int *ids = seg->ids;
    int pos0 = seg->pos0, n = seg->n;
    for (int i = 0; i < n; i++) {
        int pos = pos0 + i;
        if (ids[i] == BAD_ID) return errf(err, errlen, "fake forward: poisoned id at %d", pos);
        uint64_t h = f->recur ? *f->recur : (pos ? f->rows[pos - 1] : FNV64_INIT);
        h = fnv64(h, &ids[i], sizeof ids[i]);
        for (int q = MAX(0, pos - f->window + 1); q < pos; q++) h = fnv64(h, &f->ring[q % f->window], 8);
        state_capture(f->st, f->ring_part, pos);
        if (f->recur) state_capture(f->st, f->recur_part, pos);
        f->rows[pos] = h;
        f->ring[pos % f->window] = h;
        if (f->recur) *f->recur = fnv64(*f->recur, &ids[i], sizeof ids[i]);
    }
    for (int i = 0; i < n; i++) {
        float *out = seg->all_logits ? seg->all_logits + (size_t)i * VOCAB : NULL;
        if (i == n - 1 && seg->logits) fake_logits(f->rows[pos0 + i], seg->logits);
        if (out) fake_logits(f->rows[pos0 + i], out);
    }
    return 0;
}

static int fake_forward(model *m, const fwd_seg *segs, int nseg, char *err, size_t errlen) {
    forward_calls++;
    for (int i = 0; i < nseg; i++)
        if (fake_segment(&segs[i], err, errlen)) return -1;
    return 0;
}

/* The descriptor declares what the parts are: rows only (truncates) or with a ring. */
static const family_ops fake_rows_ops = {.name = "fake-rows", .truncates = 1, .seq_new = fake_seq_new,
                                          .seq_free = fake_seq_free, .forward = fake_forward};
static const family_ops fake_ring_ops = {.name = "fake-ring", .truncates = 0, .seq_new = fake_seq_new,
                                          .seq_free = fake_seq_free, .forward = fake_forward};

static model make_model(int *extend_only) {
    model m;
    memset(&m, 0, sizeof m);
    m.ops = *extend_only ? &fake_ring_ops : &fake_rows_ops;
    m.vocab_size = VOCAB;
    m.priv = extend_only;
    return m;
}

/* prepare + prefill with checkpoints, as the engine does; logits of the last prompt token. */
static reuse_result run_prompt(seq *sq, int slot, store *cs, int share, state *const *donors, int nd, const int *ids,
                               int n, int sys_end, float *logits, int *taken) {
    const int markers[] = {MARK};
    reuse_result r = reuse_prepare(&sq->st, slot, cs, share, donors, nd, ids, n);
    reuse_prefill p;
    reuse_prefill_init(&p, seq_feeder(sq), cs, slot, ids, n, sys_end, markers, 1);
    char err[128];
    int rc;
    while ((rc = reuse_prefill_step(&p, logits, err, sizeof err)) > 0) {}
    if (taken) *taken = p.taken;
    reuse_prefill_free(&p);
    if (rc < 0) r.reused = -1;
    return r;
}

/* A fresh sequence fed ids[0..n) in one go: the reference every warm result must equal. */
static int same_as_cold(model *m, seq *warm, const int *ids, int n, const float *warm_logits) {
    char err[128];
    seq *cold = seq_new(m, CTX, err, sizeof err);
    float logits[VOCAB];
    cold->chunk = 1000;
    int ok = seq_feed(cold, ids, n, logits, err, sizeof err) == 0;
    snapshot *a = state_snapshot(&warm->st, 1), *b = state_snapshot(&cold->st, 1);
    ok = ok && a && b && snapshot_bytes(a) == snapshot_bytes(b) && memcmp(a, b, snapshot_bytes(a)) == 0;
    ok = ok && (!warm_logits || memcmp(warm_logits, logits, sizeof logits) == 0);
    snapshot_free(a);
    snapshot_free(b);
    seq_free(cold);
    return ok;
}

/* A conversation-shaped prompt: [1] sys.. MARK user.. MARK reply.. */
static void conv(int *ids, int n, int seed) {
    for (int i = 0; i < n; i++) ids[i] = 10 + (i * 7 + seed * 13) % 30;
    ids[0] = 1;
    for (int i = 6; i < n; i += 9) ids[i] = MARK;
}

static void test_extend_and_reask(int extend_only) {
    int flag = extend_only;
    model m = make_model(&flag);
    char err[128];
    seq *sq = seq_new(&m, CTX, err, sizeof err);
    sq->chunk = 5;
    store *cs = store_new(1 << 20);
    int ids[80];
    float logits[VOCAB];
    conv(ids, 80, 1);
    reuse_result r = run_prompt(sq, 0, cs, 1, NULL, 0, ids, 30, 0, logits, NULL);
    CHECK(r.kind == REUSE_RESET && r.reused == 0, "first turn resets (%d)", extend_only);
    CHECK(same_as_cold(&m, sq, ids, 30, logits), "first turn == cold (%d)", extend_only);
    /* the generated reply is fed except its last token: record = prompt + reply[:-1] */
    char e2[64];
    CHECK(seq_feed(sq, ids + 30, 5, NULL, e2, sizeof e2) == 0, "decode feed");
    r = run_prompt(sq, 0, cs, 1, NULL, 0, ids, 50, 0, logits, NULL);
    CHECK(r.kind == REUSE_EXTEND && r.reused == 35, "second turn extends: %s %d", reuse_kind_name(r.kind), r.reused);
    CHECK(same_as_cold(&m, sq, ids, 50, logits), "extended == cold (%d)", extend_only);
    /* identical re-ask: truncatable families truncate, extend-only ones hit the n-1 checkpoint */
    r = run_prompt(sq, 0, cs, 1, NULL, 0, ids, 50, 0, logits, NULL);
    CHECK(r.reused == 49 && r.kind == (extend_only ? REUSE_CHECKPOINT : REUSE_TRUNCATE), "re-ask: %s %d",
          reuse_kind_name(r.kind), r.reused);
    CHECK(same_as_cold(&m, sq, ids, 50, logits), "re-ask == cold (%d)", extend_only);
    /* edit inside the last user turn (after the marker at 42): the marker checkpoint at 42 serves */
    int edited[80];
    memcpy(edited, ids, sizeof ids);
    edited[45] = 39;
    r = run_prompt(sq, 0, cs, 1, NULL, 0, edited, 50, 0, logits, NULL);
    CHECK(r.reused == (extend_only ? 42 : 45), "edit: %s %d", reuse_kind_name(r.kind), r.reused);
    CHECK(same_as_cold(&m, sq, edited, 50, logits), "edit == cold (%d)", extend_only);
    /* a prompt diverging at 2 (before any checkpoint of this slot) resets or truncates */
    int other[80];
    memcpy(other, ids, sizeof ids);
    other[2] = 11;
    r = run_prompt(sq, 0, cs, 1, NULL, 0, other, 40, 0, logits, NULL);
    CHECK(r.reused == (extend_only ? 0 : 2), "divergent: %s %d", reuse_kind_name(r.kind), r.reused);
    CHECK(same_as_cold(&m, sq, other, 40, logits), "divergent == cold (%d)", extend_only);
    store_free(cs);
    seq_free(sq);
}

static void test_taint_paths(void) {
    int flag = 1;
    model m = make_model(&flag);
    char err[128];
    seq *sq = seq_new(&m, CTX, err, sizeof err);
    store *cs = store_new(1 << 20);
    int ids[60];
    float logits[VOCAB];
    conv(ids, 60, 2);
    run_prompt(sq, 0, cs, 1, NULL, 0, ids, 30, 0, logits, NULL);
    /* a forward failure mid-prefill taints; the next prompt must not trust the record */
    int bad[60];
    memcpy(bad, ids, sizeof ids);
    bad[40] = BAD_ID;
    reuse_result r = run_prompt(sq, 0, cs, 1, NULL, 0, bad, 50, 0, logits, NULL);
    CHECK(r.reused == -1 && !state_usable(&sq->st), "failed prefill taints");
    r = run_prompt(sq, 0, cs, 1, NULL, 0, ids, 55, 0, logits, NULL);
    /* the tainted record is not trusted; only the system checkpoint (with rows) still serves */
    CHECK(r.kind == REUSE_CHECKPOINT && r.reused == 6, "after taint: (%s %d)", reuse_kind_name(r.kind), r.reused);
    CHECK(same_as_cold(&m, sq, ids, 55, logits), "after taint == cold");
    /* no record memory: everything still works, nothing is reused */
    seq *nr = seq_new(&m, CTX, err, sizeof err);
    free(nr->st.ids);
    nr->st.ids = NULL;
    nr->st.record_ok = 0;
    int taken = -1;
    r = run_prompt(nr, 1, cs, 0, NULL, 0, ids, 30, 0, logits, &taken);
    r = run_prompt(nr, 1, cs, 0, NULL, 0, ids, 40, 0, logits, &taken);
    CHECK(r.kind == REUSE_RESET && r.reused == 0 && taken == 0, "no record: no reuse, no checkpoints");
    seq_free(nr);
    store_free(cs);
    seq_free(sq);
}

static void test_kv_share(int extend_only) {
    int flag = extend_only;
    model m = make_model(&flag);
    char err[128];
    seq *a = seq_new(&m, CTX, err, sizeof err), *b = seq_new(&m, CTX, err, sizeof err);
    state *donors[2] = {&a->st, &b->st};
    int ids[80];
    float logits[VOCAB];
    conv(ids, 80, 3);
    run_prompt(a, 0, NULL, 1, donors, 2, ids, 40, 0, logits, NULL);
    /* slot b, prompt extending a's record: copied */
    reuse_result r = run_prompt(b, 1, NULL, 1, donors, 2, ids, 60, 0, logits, NULL);
    CHECK(r.kind == REUSE_COPY && r.reused == 40, "copy from a whole record: %s %d", reuse_kind_name(r.kind), r.reused);
    CHECK(same_as_cold(&m, b, ids, 60, logits), "copied == cold (%d)", extend_only);
    CHECK(same_as_cold(&m, a, ids, 40, NULL), "donor untouched (%d)", extend_only);
    /* a prompt sharing only part of a's record: truncatable families copy that part */
    int other[80];
    memcpy(other, ids, sizeof ids);
    other[30] = 12;
    state_reset(&b->st);
    r = run_prompt(b, 1, NULL, 1, donors, 2, other, 50, 0, logits, NULL);
    CHECK(r.reused == (extend_only ? 0 : 30), "partial copy: %s %d", reuse_kind_name(r.kind), r.reused);
    CHECK(same_as_cold(&m, b, other, 50, logits), "partial copy == cold (%d)", extend_only);
    /* kv-share off: slots stay apart */
    state_reset(&b->st);
    r = run_prompt(b, 1, NULL, 0, donors, 2, ids, 60, 0, logits, NULL);
    CHECK(r.kind == REUSE_RESET, "kv-share 0: no copy");
    seq_free(a);
    seq_free(b);
}

static void test_system_checkpoint_with_rows(void) {
    int flag = 1;
    model m = make_model(&flag);
    char err[128];
    seq *a = seq_new(&m, CTX, err, sizeof err), *b = seq_new(&m, CTX, err, sizeof err);
    state *donors[2] = {&a->st, &b->st};
    store *cs = store_new(1 << 20);
    int ids[80], other[80];
    float logits[VOCAB];
    conv(ids, 80, 4);
    conv(other, 80, 5);
    memcpy(other, ids, 20 * sizeof *ids);     /* same system prompt (first 20 ids), different chat */
    int taken;
    run_prompt(a, 0, cs, 1, donors, 2, ids, 50, 20, logits, &taken);
    CHECK(store_has(cs, ids, 20, 1), "system-prompt checkpoint kept with rows");
    CHECK(store_has(cs, ids, 49, 0) && !store_has(cs, ids, 49, 1), "n-1 checkpoint is light");
    CHECK(taken >= 3, "checkpoints taken: %d", taken);
    reuse_result r = run_prompt(b, 1, cs, 1, donors, 2, other, 45, 0, logits, NULL);
    CHECK(r.kind == REUSE_CHECKPOINT && r.reused == 20, "other slot starts from the system checkpoint: %s %d",
          reuse_kind_name(r.kind), r.reused);
    CHECK(same_as_cold(&m, b, other, 45, logits), "system checkpoint == cold");
    /* a moved on: its light checkpoints of the old conversation are dropped, the rows one stays */
    run_prompt(a, 0, cs, 1, donors, 2, other, 30, 0, logits, NULL);
    CHECK(!store_has(cs, ids, 49, 0) && store_has(cs, ids, 20, 1), "stale light checkpoints dropped");
    store_free(cs);
    seq_free(a);
    seq_free(b);
}

/* Light checkpoints are captured inside the forward call: a turn boundary one token past the
 * start of the feed is checkpointed at the start (saving a near-duplicate), and neither it nor
 * n - 1 splits the feed. */
static void test_boundary_near_start_costs_no_split(void) {
    int flag = 1;
    model m = make_model(&flag);
    char err[128];
    seq *sq = seq_new(&m, CTX, err, sizeof err);
    sq->chunk = 64;
    store *cs = store_new(1 << 20);
    int ids[80];
    float logits[VOCAB];
    for (int i = 0; i < 80; i++) ids[i] = 10 + i % 30;
    ids[5] = MARK;                  /* the system prompt ends here */
    ids[21] = MARK;                 /* boundary one past the end of the first prompt's record (20) */
    run_prompt(sq, 0, cs, 1, NULL, 0, ids, 20, 0, logits, NULL);
    forward_calls = 0;
    int taken;
    reuse_result r = run_prompt(sq, 0, cs, 1, NULL, 0, ids, 40, 0, logits, &taken);
    CHECK(r.kind == REUSE_EXTEND && r.reused == 20, "extend (%s %d)", reuse_kind_name(r.kind), r.reused);
    CHECK(forward_calls == 1, "no split for light checkpoints: %d forward calls", forward_calls);
    CHECK(store_has(cs, ids, 20, 0) && !store_has(cs, ids, 21, 0) && store_has(cs, ids, 39, 0),
          "boundary checkpoint moved to the start of the feed");
    CHECK(taken == 2, "taken %d", taken);
    CHECK(same_as_cold(&m, sq, ids, 40, logits), "== cold");
    store_free(cs);
    seq_free(sq);
}

/* Every captured checkpoint restores to exactly the state a cold prefill of its ids builds, and
 * capturing them cost no forward call beyond the one split at the system-prompt end. */
static void test_captured_checkpoints_equal_cold(void) {
    int flag = 1;
    model m = make_model(&flag);
    char err[128];
    seq *sq = seq_new(&m, CTX, err, sizeof err);
    sq->chunk = 64;
    store *cs = store_new(1 << 20);
    int ids[80];
    float logits[VOCAB];
    conv(ids, 80, 8);
    forward_calls = 0;
    int taken;
    run_prompt(sq, 0, cs, 1, NULL, 0, ids, 50, 0, logits, &taken);
    CHECK(forward_calls == 2, "one split (system end at the first marker): %d forward calls", forward_calls);
    const int light[] = {49, 42, 33, 24, 15};    /* n - 1 and the markers after the system end (6) */
    CHECK(taken == 6 && store_has(cs, ids, 6, 1), "system + 5 light checkpoints: %d", taken);
    for (int i = 0; i < 5; i++) {
        int q = light[i];
        CHECK(store_has(cs, ids, q, 0), "light checkpoint at %d", q);
        CHECK(store_restore(cs, &sq->st, ids, q, q - 1, 0) == q, "restore %d", q);
        CHECK(same_as_cold(&m, sq, ids, q, NULL), "captured checkpoint %d == cold", q);
    }
    store_free(cs);
    seq_free(sq);
}

/* A state that can always truncate takes no light checkpoints (no extra forward calls): only
 * the system-prompt one with rows, which other slots copy from. Re-asks still truncate. */
static void test_truncatable_takes_no_light_checkpoints(void) {
    int flag = 0;
    model m = make_model(&flag);
    char err[128];
    seq *sq = seq_new(&m, CTX, err, sizeof err);
    sq->chunk = 64;
    CHECK(state_always_truncatable(&sq->st), "rows family always truncatable");
    store *cs = store_new(1 << 20);
    int ids[80];
    float logits[VOCAB];
    conv(ids, 80, 7);
    forward_calls = 0;
    int taken;
    run_prompt(sq, 0, cs, 1, NULL, 0, ids, 50, 20, logits, &taken);
    CHECK(taken == 1 && store_has(cs, ids, 20, 1) && !store_has(cs, ids, 49, 0), "only the rows checkpoint: %d",
          taken);
    CHECK(forward_calls == 2, "one split (system end): %d forward calls", forward_calls);
    reuse_result r = run_prompt(sq, 0, cs, 1, NULL, 0, ids, 50, 20, logits, NULL);
    CHECK(r.kind == REUSE_TRUNCATE && r.reused == 49, "re-ask truncates (%s %d)", reuse_kind_name(r.kind), r.reused);
    CHECK(same_as_cold(&m, sq, ids, 50, logits), "== cold");
    store_free(cs);
    seq_free(sq);
}

static void test_store_budget(void) {
    int flag = 1;
    model m = make_model(&flag);
    char err[128];
    seq *sq = seq_new(&m, CTX, err, sizeof err);
    int ids[80];
    conv(ids, 80, 6);
    CHECK(seq_feed(sq, ids, 10, NULL, err, sizeof err) == 0, "feed");
    snapshot *s1 = state_snapshot(&sq->st, 1);
    size_t one = snapshot_bytes(s1);
    store *cs = store_new(one * 2 + one / 2);
    CHECK(store_put(cs, s1, 0) == 1, "first fits");
    CHECK(store_put(cs, state_snapshot(&sq->st, 1), 0) == 0 && store_count(cs) == 1, "duplicate refused");
    seq_feed(sq, ids + 10, 1, NULL, err, sizeof err);
    CHECK(store_put(cs, state_snapshot(&sq->st, 1), 0) == 1, "second fits");
    /* use the first, so the second is the least recently used */
    seq *t = seq_new(&m, CTX, err, sizeof err);
    CHECK(store_restore(cs, &t->st, ids, 10, 0, -1) == 10, "restore the first");
    seq_feed(sq, ids + 11, 1, NULL, err, sizeof err);
    CHECK(store_put(cs, state_snapshot(&sq->st, 1), 0) == 1, "third fits after eviction");
    CHECK(store_count(cs) == 2 && store_bytes(cs) <= one * 2 + one / 2, "budget kept (%d, %zu)", store_count(cs),
          store_bytes(cs));
    CHECK(store_has(cs, ids, 10, 1) && !store_has(cs, ids, 11, 1) && store_has(cs, ids, 12, 1), "LRU evicted the second");
    store *tiny = store_new(one / 2);
    CHECK(store_put(tiny, state_snapshot(&sq->st, 1), 0) == 0 && store_bytes(tiny) == 0, "larger than the budget: freed");
    store_free(tiny);
    store_free(cs);
    seq_free(t);
    seq_free(sq);
}

/* seq_feed_step: one forward call for k sequences, each left exactly as feeding it alone would
 * (state bytes, record, logits); a refused step (a sequence twice, a bad id) changes nothing;
 * a forward failure taints every sequence of the call. */
static void test_feed_step(int extend_only) {
    model m = make_model(&extend_only);
    char err[128];
    seq *s[3], *alone[3];
    const int base[3][4] = {{1, 2, 3, 4}, {9, 8}, {5, 5, 5}}, lens[3] = {4, 2, 3}, next[3] = {11, 12, 13};
    float lg[3][VOCAB], la[VOCAB], *lp[3] = {lg[0], lg[1], lg[2]};
    for (int i = 0; i < 3; i++) {
        s[i] = seq_new(&m, CTX, err, sizeof err);
        alone[i] = seq_new(&m, CTX, err, sizeof err);
        seq_feed(s[i], base[i], lens[i], NULL, err, sizeof err);
        seq_feed(alone[i], base[i], lens[i], NULL, err, sizeof err);
    }
    forward_calls = 0;
    CHECK(seq_feed_step(s, next, 3, lp, err, sizeof err) == 0, "step: %s", err);
    CHECK(forward_calls == 1, "three sequences in one forward call: %d calls", forward_calls);
    for (int i = 0; i < 3; i++) {
        seq_feed(alone[i], &next[i], 1, la, err, sizeof err);
        snapshot *a = state_snapshot(&s[i]->st, 1), *b = state_snapshot(&alone[i]->st, 1);
        CHECK(a && b && snapshot_bytes(a) == snapshot_bytes(b) && !memcmp(a, b, snapshot_bytes(a)) &&
                  !memcmp(la, lg[i], sizeof la) && s[i]->st.len == lens[i] + 1,
              "sequence %d of the step differs from feeding it alone", i);
        snapshot_free(a);
        snapshot_free(b);
    }
    seq *twice[2] = {s[0], s[0]};
    const int two[2] = {1, 2}, bad_vocab[2] = {1, VOCAB};
    CHECK(seq_feed_step(twice, two, 2, lp, err, sizeof err) < 0 && s[0]->st.len == 5 && !s[0]->st.tainted,
          "a sequence twice is refused untouched");
    CHECK(seq_feed_step(s, bad_vocab, 2, lp, err, sizeof err) < 0 && s[0]->st.len == 5 && !s[0]->st.tainted &&
              !s[1]->st.tainted,
          "an id outside the vocabulary is refused untouched");
    const int poisoned[2] = {1, BAD_ID};
    CHECK(seq_feed_step(s, poisoned, 2, lp, err, sizeof err) < 0 && s[0]->st.tainted && s[1]->st.tainted &&
              !s[2]->st.tainted,
          "a failed forward taints every sequence of the call, no other");
    for (int i = 0; i < 3; i++) {
        seq_free(s[i]);
        seq_free(alone[i]);
    }
}

/* A joint step (seq_spec_steps with feed_job chunks, the prefill driven by reuse_prefill_next /
 * reuse_prefill_fed as the engine drives it): each step is ONE forward call carrying a decode
 * token of one sequence and a chunk of another's checkpointing prefill. Both end exactly as
 * running alone leaves them (state bytes, logits), the prefill stores the checkpoints a lone
 * prefill stores, and one of them restores exactly. A feed on a sequence a job also steps, or
 * an empty feed, is refused untouched. */
static void test_joint_step(int extend_only) {
    model m = make_model(&extend_only);
    char err[128];
    int prompt[40], dec_ids[3] = {3, 4, 5}, tok = 6, steps = 0, rc = 1, taken = 0;
    conv(prompt, 40, 3);
    seq *d = seq_new(&m, CTX, err, sizeof err), *p = seq_new(&m, CTX, err, sizeof err);
    store *cs = store_new(1 << 20), *cs_alone = store_new(1 << 20);
    float row[VOCAB], last[VOCAB], ref[VOCAB];
    seq_feed(d, dec_ids, 3, NULL, err, sizeof err);
    const int markers[] = {MARK};
    reuse_prefill pf;
    reuse_prefill_init(&pf, seq_feeder(p), cs, 1, prompt, 40, 0, markers, 1);
    while (rc > 0 && steps < 64) {      /* 64: a prefill that stopped advancing fails below, never hangs */
        spec_job j = {.s = d, .next = tok, .rows = row};
        feed_job f = {.s = p};
        f.n = reuse_prefill_next(&pf, 7, &f.ids);
        f.logits = p->st.len + f.n == 40 ? last : NULL;
        forward_calls = 0;
        CHECK(seq_spec_steps(&j, 1, &f, 1, err, sizeof err) == 0 && forward_calls == 1, "joint step: %s", err);
        rc = reuse_prefill_fed(&pf);
        tok = 10 + (int)(row[0] * 20);
        steps++;
    }
    taken = pf.taken;
    reuse_prefill_free(&pf);
    CHECK(steps >= 6 && p->st.len == 40 && same_as_cold(&m, p, prompt, 40, last), "the joined prefill is exact");
    seq *dl = seq_new(&m, CTX, err, sizeof err);
    int toks[64], t = 6;
    seq_feed(dl, dec_ids, 3, NULL, err, sizeof err);
    for (int i = 0; i < steps; i++, t = 10 + (int)(ref[0] * 20)) {
        toks[i] = t;
        seq_feed(dl, &t, 1, ref, err, sizeof err);
    }
    snapshot *a = state_snapshot(&d->st, 1), *b = state_snapshot(&dl->st, 1);
    CHECK(a && b && snapshot_bytes(a) == snapshot_bytes(b) && !memcmp(a, b, snapshot_bytes(a)) && !memcmp(ref, row, sizeof ref),
          "the decoding sequence is exact beside the chunks");
    snapshot_free(a);
    snapshot_free(b);
    seq *q = seq_new(&m, CTX, err, sizeof err);
    int alone_taken = 0;
    run_prompt(q, 1, cs_alone, 0, NULL, 0, prompt, 40, 0, ref, &alone_taken);
    CHECK(taken > 0 && taken == alone_taken && store_bytes(cs) == store_bytes(cs_alone),
          "the joined prefill stores the checkpoints a lone one does (%d vs %d)", taken, alone_taken);
    int edited[40];
    memcpy(edited, prompt, sizeof edited);
    edited[39] = 11 + edited[39] % 20;
    reuse_result r = run_prompt(p, 1, cs, 0, NULL, 0, edited, 40, 0, last, NULL);
    CHECK(r.reused == 39 && same_as_cold(&m, p, edited, 40, last), "edit-last from the joint prefill's point: %d", r.reused);
    spec_job j = {.s = d, .next = 7, .rows = row};
    feed_job same = {.s = d, .ids = toks, .n = 1}, empty = {.s = q, .ids = toks, .n = 0};
    int dlen = d->st.len;
    CHECK(seq_spec_steps(&j, 1, &same, 1, err, sizeof err) < 0 && d->st.len == dlen && !d->st.tainted,
          "a feed on a stepped sequence is refused untouched");
    CHECK(seq_spec_steps(&j, 1, &empty, 1, err, sizeof err) < 0 && d->st.len == dlen && q->st.len == 40,
          "an empty feed is refused untouched");
    store_free(cs);
    store_free(cs_alone);
    seq_free(d);
    seq_free(dl);
    seq_free(p);
    seq_free(q);
}

int main(void) {
    test_extend_and_reask(0);
    test_extend_and_reask(1);
    test_joint_step(0);
    test_joint_step(1);
    test_taint_paths();
    test_kv_share(0);
    test_kv_share(1);
    test_system_checkpoint_with_rows();
    test_boundary_near_start_costs_no_split();
    test_captured_checkpoints_equal_cold();
    test_truncatable_takes_no_light_checkpoints();
    test_store_budget();
    test_feed_step(0);
    test_feed_step(1);
    return TEST_END();
}
