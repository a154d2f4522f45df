/* slots.h — which engine slot a request runs on, and the bounded admission queue in front of them.
 *
 * The engine keeps one conversation state per slot and reuses it when the next prompt extends
 * it, so routing decides whether a turn is cheap. Per slot we keep the text of what its state
 * holds (the last prompt as the engine holds it, turn.h turn_prompt_text, + the reply as the
 * client saw it): a text-prefix match stands in for the token record the engine keeps.
 *
 * ROUTING (slots_acquire): an explicit pin waits for its slot, and so does an owner (a user:
 * OpenAI `user`, Anthropic `metadata.user_id`) for the slot it owns. Otherwise, among FREE slots:
 *   1. a slot whose record is a prefix of the prompt (the same conversation, one turn on),
 *      longest record first;
 *   2. a slot sharing a prefix with the prompt covering at least half of its record (edit of
 *      the last message), or holding the whole prompt as a prefix (regenerate: the same prompt
 *      again, however long the reply it replaces);
 *   3. a slot that holds nothing;
 *   4. the least recently used slot.
 * A request never waits for a busy slot while another is free unless it is pinned or owns it.
 *
 * OWNERS: an owner's first request is routed by the rules above, like any other, and the slot it
 * gets becomes the owner's; its later requests (any conversation of that user) go there. So
 * users never share a slot while one is empty, and after a restart a user's first request finds
 * the slot its conversation was resumed in (slots_learn) by its prefix — an assignment fixed by
 * hashing the user would not: it collides, and disagrees with where the records are.
 *  - A slot has at most one owner and an owner at most one slot. A request taking a slot it
 *    does not own (pinned, or routed) ends the slot's ownership: the slot holds someone else now.
 *  - slots_forget_all() ends every ownership along with the records.
 *
 * INVARIANTS
 *  - A slot is busy from slots_acquire until slots_release; release is called only once the
 *    engine has acknowledged the request's end (engine_proc.h), never earlier.
 *  - Waiters are served in arrival order (a waiter only skips ahead when the slot it needs
 *    differs); at most max_queue wait, further requests are refused at once (HTTP 429).
 *  - slots_forget_all() (engine restarted) empties every record; busy flags are untouched. The
 *    new engine then reports the slots it resumed from --kv-dir (slots_learn), before it is
 *    ready, so no request is routed as if they were empty.
 */
#ifndef CAIRN_SLOTS_H
#define CAIRN_SLOTS_H

#include <stddef.h>

enum { SLOTS_OK = 0, SLOTS_FULL = -1, SLOTS_TIMEOUT = -2, SLOTS_CLOSED = -3, SLOTS_GONE = -4 };

typedef struct slots slots;

slots *slots_new(int n, int max_queue);
void slots_free(slots *s);

/* Wait for a slot for rq (ROUTING above). `gone` is polled while waiting
 * (a client that disconnects leaves the queue: SLOTS_GONE). Returns SLOTS_OK and *slot, or
 * SLOTS_FULL (queue bound hit), SLOTS_TIMEOUT, SLOTS_CLOSED (shutting down). */
typedef struct {
    const char *prompt;
    size_t n;
    int pinned;                   /* >= 0: this slot, whatever it holds */
    unsigned long long owner;     /* 0 = none, else the user's key (a hash of its name) */
} slot_request;
int slots_acquire(slots *s, const slot_request *rq, double timeout, int (*gone)(void *), void *gone_arg, int *slot);
/* Free a slot; record (may be NULL = unknown) becomes what the slot is known to hold. */
void slots_release(slots *s, int slot, const char *record, size_t n);
void slots_forget_all(slots *s);
/* What slot i holds as a (re)started engine reports it (a resumed --kv-dir state, wire.h
 * RECORD); out-of-range slots are ignored. */
void slots_learn(slots *s, int i, const char *record, size_t n);
void slots_close(slots *s);

/* Snapshot for /health and /metrics. */
typedef struct {
    int n, busy, waiting, max_queue;
    long admitted, rejected, timed_out;
} slots_stats;
void slots_get_stats(slots *s, slots_stats *st);
/* Bytes of record held by slot i (for /health). */
size_t slots_record_len(slots *s, int i);
/* A heap copy of slot i's record (NULL, *n = 0 when it has none), e.g. to release it unchanged. */
char *slots_record(slots *s, int i, size_t *n);

#endif
