/* tool_inkling_rewind — test helper for tests/test_inkling_ref.py (not a unit test program): why an
 * Inkling state rewinds only through a snapshot.
 *
 * tool_inkling_rewind MODEL U P Q   (P, Q comma-separated ids sharing their first U)
 * prints {"rows_only": D1, "snapshot": D2, "snapshot_bitwise": 0|1}: the largest log-prob
 * difference from a cold run of Q at Q's last position when the state of P is cut back to U by
 * (1) dropping positions past U as a rows-only truncation would, leaving the conv windows as P left
 * them, and (2) restoring a snapshot taken at U. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "models/model.h"

static int parse_ids(const char *s, int *out, int max) {
    int n = 0;
    for (char *end; *s && n < max; s = *end ? end + 1 : end) out[n++] = (int)strtol(s, &end, 10);
    return n;
}

static void log_softmax(float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = fmaxf(mx, x[i]);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] - mx - log(sum));
}

static double max_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

int main(int argc, char **argv) {
    char err[512];
    if (argc != 5) return fprintf(stderr, "usage: tool_inkling_rewind MODEL U P Q\n"), 2;
    int u = atoi(argv[2]), p[256], q[256];
    int np = parse_ids(argv[3], p, 256), nq = parse_ids(argv[4], q, 256);
    model *m = model_open(argv[1], NUMERICS_EXACT, 0, err, sizeof err);
    if (!m) return fprintf(stderr, "%s\n", err), 1;
    int V = m->vocab_size;
    float *cold = malloc((size_t)V * sizeof *cold), *rows = malloc((size_t)V * sizeof *rows);
    float *snap_l = malloc((size_t)V * sizeof *snap_l);
    seq *a = seq_new(m, 256, err, sizeof err), *b = seq_new(m, 256, err, sizeof err), *c = seq_new(m, 256, err, sizeof err);
    if (!a || !b || !c || seq_feed(a, q, nq, cold, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    /* (1) rows-only: every part but the conv windows is as it was at u (ROWS by position, the
     * ring because P fits its window), the record is cut; the convs still hold P's last inputs */
    if (seq_feed(b, p, np, NULL, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    b->st.len = u;
    if (seq_feed(b, q + u, nq - u, rows, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    /* (2) snapshot at u, continue P, restore, continue Q */
    if (seq_feed(c, p, u, NULL, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    snapshot *s = state_snapshot(&c->st, 1);
    if (!s || seq_feed(c, p + u, np - u, NULL, err, sizeof err) || state_restore(&c->st, s) != STATE_OK ||
        seq_feed(c, q + u, nq - u, snap_l, err, sizeof err))
        return fprintf(stderr, "snapshot path failed: %s\n", err), 1;
    int bitwise = !memcmp(snap_l, cold, (size_t)V * sizeof *cold);
    log_softmax(cold, V);
    log_softmax(rows, V);
    log_softmax(snap_l, V);
    printf("{\"rows_only\": %.6f, \"snapshot\": %.6f, \"snapshot_bitwise\": %d}\n", max_diff(rows, cold, V),
           max_diff(snap_l, cold, V), bitwise);
    snapshot_free(s);
    seq_free(a), seq_free(b), seq_free(c);
    free(cold), free(rows), free(snap_l);
    model_close(m);
    return 0;
}
