/* think_budget.c — reasoning budget bookkeeping; see think_budget.h. */
#include "think_budget.h"

#include <limits.h>
#include <string.h>

#include "../core/util.h"

/* The last n tokens taken are marker[0..n). */
static int ends_with(const think_budget *b, const int *marker, int n) {
    return n <= b->ntail && !memcmp(b->tail + b->ntail - n, marker, (size_t)n * sizeof *marker);
}

/* The longest proper prefix of marker the last tokens taken spell (0 when none). */
static int begun(const think_budget *b, const int *marker, int n) {
    for (int p = n - 1; p > 0; p--)
        if (ends_with(b, marker, p)) return p;
    return 0;
}

static int copy_marker(int *dst, int *n_dst, const int *src, int n, const char *what, char *err, size_t errlen) {
    if (n < 0 || n > THINK_MARKER_MAX)
        return errf(err, errlen, "think_budget: the %s marker takes %d tokens (at most %d)", what, n, THINK_MARKER_MAX);
    if (n) memcpy(dst, src, (size_t)n * sizeof *src);
    *n_dst = n;
    return 0;
}

int think_budget_init(think_budget *b, int n, const int *open, int n_open, const int *end, int n_end,
                      const int *close, int n_close, char *err, size_t errlen) {
    memset(b, 0, sizeof *b);
    b->forcing = -1;
    if (copy_marker(b->open, &b->n_open, open, n_open, "open", err, errlen) ||
        copy_marker(b->end, &b->n_end, end, n_end, "end", err, errlen) ||
        copy_marker(b->close, &b->n_close, close, n_close, "close", err, errlen))
        return -1;
    if (!n_end || n_close < n_end || memcmp(close, end, (size_t)n_end * sizeof *end))
        return errf(err, errlen, "think_budget: the close marker must start with the (non-empty) end marker");
    if (n < n_end)
        return errf(err, errlen, "think_budget=%d leaves no room for the %d token(s) that end reasoning", n, n_end);
    b->budget = n;
    b->in = n_open == 0;
    return 0;
}

int think_budget_force(think_budget *b) {
    if (!b->budget) return -1;
    if (b->forcing >= 0) return b->close[b->forcing];
    /* one more sampled token may break off an end the model began, and then all of end must still
     * fit: so the close starts once spent + n_end reaches the budget, from what is begun of it */
    if (!b->in || b->spent + b->n_end < b->budget) return -1;
    b->forcing = begun(b, b->end, b->n_end);   /* close starts with end: that much is written */
    return b->close[b->forcing];
}

int think_budget_ban(const think_budget *b) {
    if (!b->budget || !b->n_open || b->in || b->forcing >= 0) return -1;
    if (!b->closed && b->spent + b->n_open + b->n_end <= b->budget) return -1;
    int p = b->n_open == 1 ? 0 : begun(b, b->open, b->n_open);
    return p == b->n_open - 1 ? b->open[p] : -1;
}

void think_budget_take(think_budget *b, int id) {
    if (!b->budget) return;
    if (b->ntail == THINK_MARKER_MAX) memmove(b->tail, b->tail + 1, (size_t)--b->ntail * sizeof *b->tail);
    b->tail[b->ntail++] = id;
    if (b->in) {
        b->spent++;
        if (ends_with(b, b->end, b->n_end)) b->in = 0;
    } else if (b->n_open && b->forcing < 0 && ends_with(b, b->open, b->n_open)) {
        b->in = 1;
        b->spent += b->n_open;   /* its tokens were taken before it was known to be a marker */
    }
    if (b->forcing >= 0 && ++b->forcing == b->n_close) {
        b->forcing = -1;
        b->closed = 1;
    }
}

int think_budget_live(const think_budget *b) { return b->budget && (b->in || b->forcing >= 0 || b->n_open); }

/* One marker of the family's reasoning as ids, special tokens matched. */
static int marker_ids(const tokenizer *t, const char *text, int *ids, int *n, char *err, size_t errlen) {
    *n = 0;
    if (!text) return 0;
    int k = tok_encode(t, text, strlen(text), ids, THINK_MARKER_MAX, err, errlen);
    if (k > THINK_MARKER_MAX) return errf(err, errlen, "think_budget: the marker '%s' takes %d tokens", text, k);
    *n = k;
    return k < 0 ? -1 : 0;
}

int think_budget_for(think_budget *b, int n, const chat_template *c, const tokenizer *t, char *err, size_t errlen) {
    if (!c || !c->example || !t)
        return errf(err, errlen, "think_budget: this model has no chat format (or tokenizer) that says how reasoning ends");
    const char *close = c->example->think_end ? c->example->think_end : "</think>";
    const char *end = c->tools && c->tools->think_end ? c->tools->think_end : close;
    int open_ids[THINK_MARKER_MAX], end_ids[THINK_MARKER_MAX], close_ids[THINK_MARKER_MAX], n_open, n_end, n_close;
    if (marker_ids(t, c->example->think_start, open_ids, &n_open, err, errlen) ||
        marker_ids(t, end, end_ids, &n_end, err, errlen) || marker_ids(t, close, close_ids, &n_close, err, errlen))
        return -1;
    return think_budget_init(b, n, open_ids, n_open, end_ids, n_end, close_ids, n_close, err, errlen);
}

/* A budget no reply reaches never forces or bans: it only counts. */
int think_budget_count(const chat_template *c, const tokenizer *t, const int *ids, int n, int cue_opened) {
    think_budget b;
    char err[160];
    if (think_budget_for(&b, INT_MAX / 2, c, t, err, sizeof err)) return 0;
    if (!b.n_open && !cue_opened) return 0;
    for (int i = 0; i < n; i++) think_budget_take(&b, ids[i]);
    return b.spent;
}
