/* test_think_budget.c — the reasoning budget over scripted token streams: a cue-opened block is
 * closed by force exactly when the tokens spent plus the end marker reach the budget (and the rest
 * of the close follows), a model that begins the end marker itself gets only the rest of it, a
 * natural close stops all forcing, a model-opened block (Inkling-style) counts its marker and may
 * not reopen once the budget closed one, and budgets that cannot hold the end are refused. */
#include "serve/think_budget.h"
#include "test.h"

#include <string.h>

enum { END = 900, RESP = 901, SEP = 902, OPEN = 950, OTHER = 7 };

/* Drive b for up to max tokens: a forced id when the budget forces one, else script[i] (or OTHER
 * past its end), skipping a banned id for OTHER. Returns the tokens taken in out. */
static int run(think_budget *b, const int *script, int ns, int max, int *out) {
    for (int i = 0; i < max; i++) {
        int t = think_budget_force(b);
        if (t < 0) t = i < ns ? script[i] : OTHER;
        if (t == think_budget_ban(b)) t = OTHER;
        think_budget_take(b, t);
        out[i] = t;
    }
    return max;
}

static void cue_opened_block_is_closed_at_the_budget(void) {
    think_budget b;
    char err[128];
    int end[] = {END, SEP}, close[] = {END, SEP, RESP}, out[32];
    CHECK(think_budget_init(&b, 6, NULL, 0, end, 2, close, 3, err, sizeof err) == 0, "%s", err);
    run(&b, NULL, 0, 10, out);
    int want[] = {OTHER, OTHER, OTHER, OTHER, END, SEP, RESP, OTHER, OTHER, OTHER};
    CHECK(!memcmp(out, want, sizeof want), "4 sampled, then END SEP (6 = budget), then the rest of close");
    CHECK(b.spent == 6 && !b.in && b.closed, "spent %d in %d closed %d", b.spent, b.in, b.closed);
    CHECK(!think_budget_live(&b), "a closed cue-opened block leaves nothing to force");
}

static void a_begun_end_marker_is_finished_not_restarted(void) {
    think_budget b;
    char err[128];
    int end[] = {END, SEP}, out[32], script[] = {OTHER, OTHER, OTHER, END};
    think_budget_init(&b, 6, NULL, 0, end, 2, end, 2, err, sizeof err);
    run(&b, script, 4, 6, out);
    CHECK(out[3] == END && out[4] == SEP && b.spent == 5 && !b.in, "the model's END is completed by SEP alone");
}

static void a_natural_close_ends_the_budget(void) {
    think_budget b;
    char err[128];
    int end[] = {END}, out[32], script[] = {OTHER, END, OTHER, OTHER};
    think_budget_init(&b, 3, NULL, 0, end, 1, end, 1, err, sizeof err);
    run(&b, script, 4, 8, out);
    for (int i = 2; i < 8; i++) CHECK(out[i] == OTHER, "token %d: nothing forced after the model closed", i);
    CHECK(b.spent == 2 && !b.closed, "spent %d", b.spent);
}

static void a_model_opened_block_counts_its_marker_and_cannot_reopen(void) {
    think_budget b;
    char err[128];
    int open[] = {OPEN}, end[] = {END}, close[] = {END, RESP}, out[32];
    int script[] = {OPEN, 1, 2, 3, 4, 5, 6, 7, 8, OPEN, OPEN};
    think_budget_init(&b, 4, open, 1, end, 1, close, 2, err, sizeof err);
    CHECK(!b.in, "no block before the model opens one");
    run(&b, script, 11, 11, out);
    int want[] = {OPEN, 1, 2, END, RESP, 5, 6, 7, 8, OTHER, OTHER};
    CHECK(!memcmp(out, want, sizeof want), "OPEN + 2 + END = 4, then no block may open again");
    CHECK(b.spent == 4, "spent %d", b.spent);
    /* a block that cannot fit is not opened either */
    think_budget_init(&b, 1, open, 1, end, 1, close, 2, err, sizeof err);
    CHECK(think_budget_ban(&b) == OPEN, "budget 1 has no room for OPEN + END");
}

static void budgets_that_cannot_hold_the_end_are_refused(void) {
    think_budget b;
    char err[128];
    int end[] = {END, SEP}, bad_close[] = {RESP, END};
    CHECK(think_budget_init(&b, 1, NULL, 0, end, 2, end, 2, err, sizeof err) < 0 && strstr(err, "no room"), "%s", err);
    CHECK(think_budget_init(&b, 9, NULL, 0, end, 2, bad_close, 2, err, sizeof err) < 0, "close must start with end");
    CHECK(think_budget_init(&b, 9, NULL, 0, NULL, 0, NULL, 0, err, sizeof err) < 0, "an end marker is needed");
}

int main(void) {
    cue_opened_block_is_closed_at_the_budget();
    a_begun_end_marker_is_finished_not_restarted();
    a_natural_close_ends_the_budget();
    a_model_opened_block_counts_its_marker_and_cannot_reopen();
    budgets_that_cannot_hold_the_end_are_refused();
    return TEST_END();
}
