/* think_budget.h — a reply's reasoning budget (SUBMIT think_budget=N), as the engine enforces it
 * token by token. Pure: ids in, the id to force or to ban out; no model, no I/O — except
 * think_budget_for, which reads the family's markers off its chat format and tokenizer once.
 *
 * The reasoning of a reply is every token from where a reasoning block opens — the reply's first
 * token when the generation cue opened it (no `open` marker), else the first token of the `open`
 * marker the model writes (Inkling's <|content_thinking|>) — up to and including its `end` marker
 * (the text the family's parser ends reasoning at, chat.h tool_syntax.think_end). A budget of N
 * caps those tokens over the whole reply, markers included:
 *  - inside a block, once the tokens spent plus the whole `end` reach N (one more sampled token
 *    could break off an `end` the model began), sampling stops and the engine writes the family's close
 *    (`close`: `end` and what the template writes after it before the answer, e.g. Kimi K3's
 *    response opener; chat.h tool_example.think_end) from what the model began of it, one token
 *    per step;
 *  - outside a block, a model that opens blocks itself may not open one that cannot fit (or any
 *    once the budget closed one): the token that would complete `open` is banned.
 * Forced tokens are ordinary generated tokens to everything else (emitted, fed, recorded), so a
 * budgeted reply is a function of the request alone: warm == cold, and the next turn reuses it.
 *
 * INVARIANTS
 *  - spent <= budget at every point, given budget >= n_end (think_budget_init refuses less).
 *  - Markers are matched on ids, as the family's tokenizer spells them (tokenizer.json added
 *    tokens); a model spelling a marker with other ids is not seen closing its reasoning.
 */
#ifndef CAIRN_THINK_BUDGET_H
#define CAIRN_THINK_BUDGET_H

#include <stddef.h>

#include "../core/tokenizer.h"
#include "../models/chat.h"

enum { THINK_MARKER_MAX = 16 };   /* ids of one marker */

typedef struct {
    int budget;                   /* N; 0 = no budget (every call is a no-op) */
    int open[THINK_MARKER_MAX], n_open;     /* n_open 0: the cue opened the first block */
    int end[THINK_MARKER_MAX], n_end;
    int close[THINK_MARKER_MAX], n_close;   /* starts with end */
    int in;                       /* inside a reasoning block */
    int spent;                    /* reasoning tokens so far, markers included */
    int forcing;                  /* next index of close to write, -1 = sampling */
    int closed;                   /* the budget closed a block */
    int tail[THINK_MARKER_MAX], ntail;      /* the last tokens taken, oldest first */
} think_budget;

/* A budget of n (>= 1) tokens with those markers. -1 + err when a marker is empty (end, close)
 * or too long, close does not start with end, or n leaves no room for end. */
int think_budget_init(think_budget *b, int n, const int *open, int n_open, const int *end, int n_end,
                      const int *close, int n_close, char *err, size_t errlen);
/* think_budget_init with the family's own markers (chat.h): the reply opens reasoning at the
 * cue, or where the model writes tool_example.think_start; the parser ends it at
 * tool_syntax.think_end; the template closes it with tool_example.think_end ("</think>" when the
 * family names none) before the answer. -1 + err when the family has no chat format or tokenizer. */
int think_budget_for(think_budget *b, int n, const chat_template *c, const tokenizer *t, char *err, size_t errlen);
/* The reasoning tokens (markers included, as the budget counts them) among a reply's ids[0..n);
 * cue_opened: the prompt's generation cue opened a block (thinking on). 0 without markers. */
int think_budget_count(const chat_template *c, const tokenizer *t, const int *ids, int n, int cue_opened);
/* Before a token is chosen: the id the budget makes the next token, or -1 to sample. */
int think_budget_force(think_budget *b);
/* Before sampling: an id that may not be sampled now, or -1. */
int think_budget_ban(const think_budget *b);
/* After a token was taken (sampled or forced). */
void think_budget_take(think_budget *b, int id);
/* 1 while the budget may still force or ban a token (a speculative step must not run then: its
 * verify samples several tokens at once). */
int think_budget_live(const think_budget *b);

#endif
