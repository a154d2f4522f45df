/* tool_spec — test helper for tests/test_spec_mtp.py (not a unit test program): MTP speculative
 * decoding against plain decoding on one model, through the public seq API.
 *
 * tool_spec MODEL TEMPERATURE SEED K N IDS   (IDS comma-separated prompt ids)
 * prints one JSON object:
 *   "plain":   N tokens of plain decoding (sampler_pick per step, no MTP rows kept),
 *   "spec":    N tokens of speculative decoding, K drafts per step (seq_spec_step),
 *   "steps", "drafted", "accepted": verify calls made and drafts offered / kept,
 *   "record_ok": 1 when the speculative sequence's record is the prompt and its emitted tokens
 *                but the last (the pending one, never fed),
 *   "state_equal": 1 when every state part is byte-identical to a cold sequence (same parts: MTP
 *                rows kept) fed the record's ids in one call: ROWS their complete rows, RING the
 *                slots positions [0, len) wrote, RECUR all of it (what a snapshot carries and a
 *                later feed reads; a compressed row still being filled is rewritten before use),
 *   "logits_equal": 1 when the last verify row equals the cold sequence's last logits bitwise.
 * With TEMPERATURE 0 "plain" and "spec" must be identical; sampled runs are compared run to run.
 *
 * tool_spec MODEL draft IDS   (--numerics exact)
 * prints one line per MTP position p = 0 .. n-2, {"pos": p, "top": [[id, logprob] x 5]}: the draft
 * log-probs of token p + 2 from the state of ids[0..p] and the token ids[p + 1] (seq_draft). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/sampler.h"
#include "core/util.h"
#include "models/model.h"

static int parse_ids(const char *s, int *out, int max) {
    int n = 0;
    for (char *end; *s && n < max; s = *end ? end + 1 : end) out[n++] = (int)strtol(s, &end, 10);
    return n;
}

static void print_ids(const char *key, const int *ids, int n) {
    printf("\"%s\":[", key);
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("],");
}

/* Bytes of part x that the state of len positions defines (see "state_equal" above). */
static size_t defined_bytes(const state_part *x, int len) {
    switch (x->kind) {
    case PART_ROWS: return x->row_bytes * (size_t)(len / x->span);
    case PART_RING: return x->row_bytes * (size_t)MIN(len, x->rows);
    case PART_RECUR: return x->row_bytes;
    }
    return 0;
}

static int parts_equal(const state *a, const state *b) {
    if (a->nparts != b->nparts || a->len != b->len) return 0;
    for (int i = 0; i < a->nparts; i++) {
        const state_part *x = &a->parts[i], *y = &b->parts[i];
        if (x->kind != y->kind || strcmp(x->name, y->name) || memcmp(x->buf, y->buf, defined_bytes(x, a->len))) return 0;
    }
    return 1;
}

static void die(const char *what, const char *err) {
    fprintf(stderr, "tool_spec: %s: %s\n", what, err);
    exit(1);
}

static void log_softmax_top5(const float *logits, int n, int pos) {
    double mx = logits[0], sum = 0;
    for (int i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    int best[5];
    for (int j = 0; j < 5; j++) {
        best[j] = -1;
        for (int i = 0; i < n; i++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= best[q] == i;
            if (!taken && (best[j] < 0 || logits[i] > logits[best[j]])) best[j] = i;
        }
    }
    printf("{\"pos\": %d, \"top\": [", pos);
    for (int j = 0; j < 5; j++) printf("%s[%d, %.6f]", j ? ", " : "", best[j], logits[best[j]] - mx - log(sum));
    printf("]}\n");
}

static int draft_logits(const char *dir, const char *ids_arg) {
    char err[512] = "";
    int ids[256], n = parse_ids(ids_arg, ids, 256);
    model *m = model_open(dir, NUMERICS_EXACT, 0, err, sizeof err);
    if (!m) die("open", err);
    m->spec_mtp = 1;
    float *logits = xmalloc(sizeof(float) * (size_t)m->vocab_size);
    seq *s = seq_new(m, n + 2, err, sizeof err);
    if (!s) die("seq", err);
    for (int p = 0; p + 1 < n; p++) {
        if (seq_feed(s, &ids[p], 1, NULL, err, sizeof err) || seq_draft(s, ids[p + 1], 0, logits, err, sizeof err))
            die("draft", err);
        log_softmax_top5(logits, m->vocab_size, p);
    }
    seq_free(s);
    model_close(m);
    free(logits);
    return 0;
}

int main(int argc, char **argv) {
    char err[512] = "";
    if (argc == 4 && !strcmp(argv[2], "draft")) return draft_logits(argv[1], argv[3]);
    if (argc != 7) return fprintf(stderr, "usage: tool_spec MODEL TEMPERATURE SEED K N IDS\n"), 2;
    sampler_params sp = {.temperature = (float)atof(argv[2]), .top_p = 1.0f, .seed = strtoull(argv[3], NULL, 10)};
    int k = atoi(argv[4]), n = atoi(argv[5]), prompt[256];
    int np = parse_ids(argv[6], prompt, 256), ctx = np + n + SPEC_MAX_DRAFT + 2;
    model *m = model_open(argv[1], NUMERICS_QAT, 0, err, sizeof err);
    if (!m) die("open", err);
    int V = m->vocab_size, *plain = xmalloc(sizeof(int) * (size_t)n), *spec = xmalloc(sizeof(int) * (size_t)(n + SPEC_MAX_DRAFT + 1));
    float *logits = xmalloc(sizeof(float) * (size_t)V), *cold_logits = xmalloc(sizeof(float) * (size_t)V);
    float *rows = xmalloc(sizeof(float) * (size_t)(SPEC_MAX_DRAFT + 1) * V);
    sampler smp;

    seq *a = seq_new(m, ctx, err, sizeof err);
    if (!a || seq_feed(a, prompt, np, logits, err, sizeof err)) die("plain prefill", err);
    sampler_init(&smp, &sp, V);
    for (int i = 0; i < n; i++) {
        plain[i] = sampler_pick(&smp, logits);
        if (i + 1 < n && seq_feed(a, &plain[i], 1, logits, err, sizeof err)) die("plain decode", err);
    }
    sampler_free(&smp);

    m->spec_mtp = 1;
    seq *b = seq_new(m, ctx, err, sizeof err);
    if (!b || seq_feed(b, prompt, np, logits, err, sizeof err)) die("spec prefill", err);
    sampler_init(&smp, &sp, V);
    int got = 0, steps = 0, drafted = 0, kept_total = 0, pending = sampler_pick(&smp, logits);
    while (got + 1 < n) {
        int out[SPEC_MAX_DRAFT + 1], n_out, kept, want = MIN(k, n - got - 2);
        if (want < 1) {                        /* one token short of n: a plain step */
            spec[got++] = pending;
            if (seq_feed(b, &pending, 1, logits, err, sizeof err)) die("spec tail", err);
            pending = sampler_pick(&smp, logits);
            continue;
        }
        if (seq_spec_step(b, pending, want, &smp, out, &n_out, &pending, rows, &kept, err, sizeof err))
            die("spec step", err);
        memcpy(logits, rows + (size_t)(n_out - 1) * V, sizeof(float) * (size_t)V);
        memcpy(spec + got, out, sizeof(int) * (size_t)n_out);
        got += n_out;
        steps++;
        drafted += want;
        kept_total += kept;
    }
    spec[got++] = pending;
    sampler_free(&smp);

    int record_ok = b->st.len == np + got - 1 && !memcmp(b->st.ids, prompt, sizeof(int) * (size_t)np) &&
                    !memcmp(b->st.ids + np, spec, sizeof(int) * (size_t)(got - 1));
    seq *c = seq_new(m, ctx, err, sizeof err);
    if (c) c->chunk = b->st.len;
    if (!c || seq_feed(c, b->st.ids, b->st.len, cold_logits, err, sizeof err)) die("cold feed", err);
    int state_equal = parts_equal(&b->st, &c->st), logits_equal = !memcmp(logits, cold_logits, sizeof(float) * (size_t)V);

    printf("{");
    print_ids("plain", plain, n);
    print_ids("spec", spec, n);
    printf("\"steps\":%d,\"drafted\":%d,\"accepted\":%d,\"record_ok\":%d,\"state_equal\":%d,\"logits_equal\":%d,"
           "\"parts\":%d}\n",
           steps, drafted, kept_total, record_ok, state_equal, logits_equal, b->st.nparts);
    seq_free(a);
    seq_free(b);
    seq_free(c);
    model_close(m);
    free(plain);
    free(spec);
    free(logits);
    free(cold_logits);
    free(rows);
    return 0;
}
