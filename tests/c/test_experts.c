/* test_experts.c — the expert cache against the mapping on a checkpoint written here: 2 layers of
 * 6 experts, each three F32 matrices whose bytes differ everywhere. Every callback must see exactly
 * the mapped bytes (cached or not), its rows gathered in ascending slot order with their weights, and
 * every output row must land in its slot (slots grouped by ascending expert); an expert whose tensors are
 * adjacent is one read, one with a gap over EXPERTS_MERGE_GAP two; a two-expert budget evicts; the
 * usage counts saved at free pin experts on the next start; a budget below two experts is refused.
 * With a pool of two threads the mapped experts of a call spread one per pool task (counted), each
 * still run once on its own rows, except one with more than a thread's share of the call's rows,
 * which runs apart; with one thread, or cached, they run one by one in ascending order. */
#include "core/experts.h"
#include "core/threads.h"
#include "core/util.h"
#include "test.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { LAYERS = 2, EXPERTS = 6, ROWS = 4, COLS = 8, MAT = ROWS * COLS * 4, GAP = 8192 };

/* layer 1 expert 5 has a gap before its last matrix: two spans */
static size_t offset_of(int l, int e, int k) {
    size_t at = ((size_t)(l * EXPERTS + e) * 3 + (size_t)k) * MAT;
    return at + (l * EXPERTS + e == LAYERS * EXPERTS - 1 && k == 2 ? GAP : 0);
}

static void write_checkpoint(const char *dir) {
    char json[16384] = "{", path[512];
    size_t end = offset_of(LAYERS - 1, EXPERTS - 1, 2) + MAT;
    for (int l = 0; l < LAYERS; l++)
        for (int e = 0; e < EXPERTS; e++)
            for (int k = 0; k < 3; k++) {
                size_t at = offset_of(l, e, k);
                snprintf(json + strlen(json), sizeof json - strlen(json),
                         "%s\"l%d.e%d.m%d\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                         strlen(json) > 1 ? "," : "", l, e, k, ROWS, COLS, at, at + MAT);
            }
    strcat(json, "}");
    size_t hl = strlen(json);
    while ((8 + hl) % 64) json[hl++] = ' ';   /* data starts 64-aligned, like a real writer */
    json[hl] = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 8; i++) fputc((int)((uint64_t)hl >> (8 * i)) & 0xff, f);
    fwrite(json, 1, hl, f);
    for (size_t i = 0; i < end / 4; i++) {
        float v = (float)i * 0.25f + 1.0f;
        fwrite(&v, 4, 1, f);
    }
    fclose(f);
}

static void register_all(experts *x, const st_file *st) {
    char name[64], err[256];
    for (int l = 0; l < LAYERS; l++)
        for (int e = 0; e < EXPERTS; e++) {
            qmat w[3];
            for (int k = 0; k < 3; k++) {
                snprintf(name, sizeof name, "l%d.e%d.m%d", l, e, k);
                w[k] = (qmat){.fmt = WF_F32, .rows = ROWS, .cols = COLS, .data = st_find(st, name)->data};
            }
            CHECK(!experts_add(x, l, e, w, 3, err, sizeof err), "%s", err);
        }
}

/* ordered: experts must come in ascending order (not spread); runs[e] counts each expert's runs */
typedef struct {
    const st_file *st;
    int layer, last_e, ordered;
    atomic_int calls, bad, runs[EXPERTS];
} seen;

enum { K = 4, OUT_K = K + 1, DOUT = 3 };

/* Checks the matrices are the mapped bytes at the mapping's alignment and that the rows come
 * gathered in ascending slot order (weight[slot] = slot, x[token][0] = token); writes
 * (expert, slot, token) as each row's output. */
static void check_expert(void *ctx, int layer, int e, const qmat *w, const float *in, const float *weight, int cnt,
                         float *out, arena *sc) {
    seen *s = ctx;
    char name[64];
    s->bad += layer != s->layer || (s->ordered && e <= s->last_e);
    if (s->ordered) s->last_e = e;
    s->calls++;
    s->runs[e]++;
    for (int k = 0; k < 3; k++) {
        snprintf(name, sizeof name, "l%d.e%d.m%d", s->layer, e, k);
        s->bad += memcmp(w[k].data, st_find(s->st, name)->data, MAT) != 0;
        s->bad += ((uintptr_t)w[k].data - (uintptr_t)st_find(s->st, name)->data) % 64 != 0;
    }
    float *tmp = arena_take(sc, (size_t)cnt, sizeof(float));   /* the scratch it asked for is there */
    for (int r = 0; r < cnt; r++) {
        tmp[r] = weight[r];
        s->bad += (r && weight[r] <= weight[r - 1]) || in[2 * r] != (float)((int)weight[r] / K) || in[2 * r + 1] != 7;
        out[r * DOUT] = (float)e, out[r * DOUT + 1] = tmp[r], out[r * DOUT + 2] = in[2 * r];
    }
}

static size_t check_scratch(void *ctx, int layer, int cnt) { return (size_t)cnt * sizeof(float) + 64; }

/* Runs `steps` layer calls cycling through patterns of chosen experts (4, 4, 3 and 3 distinct)
 * for one token of K slots; returns the mistakes seen, every slot's output row checked and every
 * chosen expert run exactly once per call. */
static int drive(experts *x, const st_file *st, int steps, int ordered) {
    static const int pat[][K] = {{0, 1, 2, 3}, {4, 5, 0, 1}, {2, 2, 5, 3}, {1, 0, 4, 0}};
    static const float xin[2] = {0, 7}, weight[K] = {0, 1, 2, 3};
    int bad = 0;
    for (int i = 0; i < steps; i++) {
        seen s = {.st = st, .layer = i % LAYERS, .last_e = -1, .ordered = ordered};
        float out[OUT_K * DOUT];
        for (int c = 0; c < OUT_K * DOUT; c++) out[c] = -1;
        experts_bind(x, check_expert, check_scratch, &s);
        experts_io io = {.x = xin, .din = 2, .k = K, .weight = weight, .out = out, .dout = DOUT, .out_k = OUT_K};
        experts_run(x, s.layer, pat[i % 4], K, &io);
        bad += s.bad + (s.calls == 0);
        for (int e = 0; e < EXPERTS; e++) {
            int chosen = 0;
            for (int t = 0; t < K; t++) chosen |= pat[i % 4][t] == e;
            bad += s.runs[e] != chosen;
        }
        for (int t = 0; t < K; t++)
            bad += out[t * DOUT] != (float)pat[i % 4][t] || out[t * DOUT + 1] != (float)t || out[t * DOUT + 2] != 0;
        for (int c = K * DOUT; c < OUT_K * DOUT; c++) bad += out[c] != -1;   /* the layer's own row untouched */
    }
    return bad;
}

/* One call of two tokens (2K slots) where expert 0 takes 5 of the 8 rows, more than a thread's
 * share with two threads: it must run apart across the pool and only experts 1..3 spread. Returns
 * the mistakes seen, as drive. */
static int drive_heavy(experts *x, const st_file *st) {
    static const int idx[2 * K] = {0, 0, 0, 0, 0, 1, 2, 3};
    static const float xin[4] = {0, 7, 1, 7}, weight[2 * K] = {0, 1, 2, 3, 4, 5, 6, 7};
    seen s = {.st = st, .layer = 0, .last_e = -1};
    float out[2 * OUT_K * DOUT];
    for (int c = 0; c < 2 * OUT_K * DOUT; c++) out[c] = -1;
    experts_bind(x, check_expert, check_scratch, &s);
    experts_io io = {.x = xin, .din = 2, .k = K, .weight = weight, .out = out, .dout = DOUT, .out_k = OUT_K};
    experts_run(x, 0, idx, 2 * K, &io);
    int bad = s.bad;
    for (int e = 0; e < EXPERTS; e++) bad += s.runs[e] != (e < 4);
    for (int slot = 0; slot < 2 * K; slot++) {
        const float *o = out + ((size_t)(slot / K) * OUT_K + (size_t)(slot % K)) * DOUT;
        bad += o[0] != (float)idx[slot] || o[1] != (float)slot || o[2] != (float)(slot / K);
    }
    return bad;
}

int main(void) {
    char dir[] = "/tmp/cairn_test_experts_XXXXXX", err[512], usage[600];
    if (!mkdtemp(dir)) return 2;
    write_checkpoint(dir);
    st_file *st = st_open(dir, 0, err, sizeof err);
    CHECK(st != NULL, "%s", err);
    if (!st) return TEST_END();

    experts *mapped = experts_new(st);
    register_all(mapped, st);
    CHECK(experts_count(mapped) == LAYERS * EXPERTS, "%d", experts_count(mapped));
    experts_stats s;
    pool_set_threads(1);
    CHECK(drive(mapped, st, 16, 1) == 0, "mapped experts seen wrong");
    experts_get_stats(mapped, &s);
    CHECK(s.spread_calls == 0, "%llu calls spread without a pool", (unsigned long long)s.spread_calls);
    pool_set_threads(2);
    CHECK(drive(mapped, st, 16, 0) == 0, "spread mapped experts seen wrong");
    experts_get_stats(mapped, &s);
    /* 16 calls, each of 4, 4, 3 or 3 distinct experts: one pool job each */
    CHECK(s.spread_calls == 16 && s.spread_experts == 56, "spread calls %llu experts %llu",
          (unsigned long long)s.spread_calls, (unsigned long long)s.spread_experts);
    CHECK(s.layer_calls == 32 && s.chosen == 112, "calls %llu chosen %llu", (unsigned long long)s.layer_calls,
          (unsigned long long)s.chosen);
    CHECK(drive_heavy(mapped, st) == 0, "a call with a heavy expert seen wrong");
    experts_get_stats(mapped, &s);
    CHECK(s.spread_calls == 17 && s.spread_experts == 59, "heavy expert: spread calls %llu experts %llu",
          (unsigned long long)s.spread_calls, (unsigned long long)s.spread_experts);
    experts_free(mapped);

    experts *x = experts_new(st);
    register_all(x, st);
    CHECK(experts_cache(x, 2 * 3 * MAT - 1, NULL, 7, err, sizeof err) == -1 && strstr(err, "two routed experts"),
          "%s", err);
    snprintf(usage, sizeof usage, "%s/expert_usage.bin", dir);
    CHECK(!experts_cache(x, 2 * 3 * MAT, usage, 7, err, sizeof err), "%s", err);
    CHECK(drive(x, st, 16, 1) == 0, "cached experts differ from the mapping");
    experts_get_stats(x, &s);
    CHECK(s.spread_calls == 0, "cached experts spread: %llu", (unsigned long long)s.spread_calls);
    CHECK(s.uses == 56 && s.hits + s.misses == s.uses, "uses %llu hits %llu misses %llu",
          (unsigned long long)s.uses, (unsigned long long)s.hits, (unsigned long long)s.misses);
    CHECK(s.evictions > 0 && s.reader_reads > 0 && s.read_errors == 0, "evictions %llu reader %llu",
          (unsigned long long)s.evictions, (unsigned long long)s.reader_reads);
    /* layer 1 expert 5 (the gapped one) takes two reads, every other expert one */
    CHECK(s.reads > s.misses && s.reads <= 2 * s.misses, "reads %llu misses %llu", (unsigned long long)s.reads,
          (unsigned long long)s.misses);
    CHECK(s.resident <= s.budget, "%zu > %zu", s.resident, s.budget);
    experts_free(x);

    /* the saved counts pin the most used experts into half of a roomier budget */
    x = experts_new(st);
    register_all(x, st);
    CHECK(!experts_cache(x, 8 * 3 * MAT, usage, 7, err, sizeof err), "%s", err);
    CHECK(drive(x, st, 8, 1) == 0, "pinned experts differ from the mapping");
    experts_get_stats(x, &s);
    CHECK(s.pinned > 0 && s.pinned_hits > 0, "pinned %llu pinned_hits %llu", (unsigned long long)s.pinned,
          (unsigned long long)s.pinned_hits);
    experts_free(x);

    /* counts of another checkpoint (fingerprint) pin nothing */
    x = experts_new(st);
    register_all(x, st);
    CHECK(!experts_cache(x, 8 * 3 * MAT, usage, 8, err, sizeof err), "%s", err);
    experts_get_stats(x, &s);
    CHECK(s.pinned == 0, "pinned %llu from a foreign usage file", (unsigned long long)s.pinned);
    experts_free(x);

    st_close(st);
    unlink(usage);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    return TEST_END();
}
