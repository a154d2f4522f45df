/* Unit tests of src/serve/slots.c: conversation -> slot routing, pinning, the bounded FIFO
 * queue (429 when full, timeouts, leaving the queue), records forgotten on engine restart and
 * learned from the new engine. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "serve/slots.h"
#include "test.h"

static int acquire(slots *s, const char *prompt, int pinned) {
    int slot = -1;
    int rc = slots_acquire(s, prompt, strlen(prompt), pinned, 5, NULL, NULL, &slot);
    return rc == SLOTS_OK ? slot : rc;
}

static void release(slots *s, int slot, const char *record) { slots_release(s, slot, record, strlen(record)); }

static void test_routing(void) {
    slots *s = slots_new(2, 4);
    int a = acquire(s, "<bos>SYS A<u>hi", -1);
    release(s, a, "<bos>SYS A<u>hi<a>reply A");
    int b = acquire(s, "<bos>SYS B<u>yo", -1);
    CHECK(b != a, "a new conversation takes the empty slot, not A's (a=%d b=%d)", a, b);
    release(s, b, "<bos>SYS B<u>yo<a>reply B");
    /* Alternating turns each return to their own slot. */
    for (int turn = 0; turn < 3; turn++) {
        CHECK(acquire(s, "<bos>SYS A<u>hi<a>reply A<eos><u>more", -1) == a, "A turn %d left its slot", turn);
        release(s, a, "<bos>SYS A<u>hi<a>reply A");
        CHECK(acquire(s, "<bos>SYS B<u>yo<a>reply B<eos><u>more", -1) == b, "B turn %d left its slot", turn);
        release(s, b, "<bos>SYS B<u>yo<a>reply B");
    }
    /* Regenerate (same prompt again) prefers the slot sharing most of its record. */
    CHECK(acquire(s, "<bos>SYS B<u>yo", -1) == b, "regenerate went elsewhere");
    /* ... also when the reply it replaces is longer than the prompt (less than half of the record). */
    release(s, b, "<bos>SYS B<u>yo<a>a reply far longer than the prompt that asked for it");
    CHECK(acquire(s, "<bos>SYS B<u>yo", -1) == b, "regenerate after a long reply went elsewhere");
    release(s, b, "<bos>SYS B<u>yo<a>other reply");
    /* A third conversation evicts the least recently used slot (A's). */
    CHECK(acquire(s, "<bos>SYS C<u>new", -1) == a, "LRU eviction picked the wrong slot");
    release(s, a, "<bos>SYS C<u>new<a>c");
    /* Pinning overrides routing. */
    CHECK(acquire(s, "<bos>SYS C<u>new<a>c<u>x", b) == b, "pin ignored");
    release(s, b, "");
    CHECK(slots_record_len(s, b) == 0 && slots_record_len(s, a) > 0, "records after release");
    slots_forget_all(s);
    CHECK(slots_record_len(s, a) == 0, "forget_all keeps a record");
    slots_free(s);
}

/* A restarted engine reports the slots it resumed (RECORD): their conversations find them again,
 * and a new conversation takes a slot that holds nothing rather than a resumed one. */
static void test_learned_records(void) {
    slots *s = slots_new(3, 4);
    slots_learn(s, 2, "<bos>SYS A<u>hi<a>reply A", strlen("<bos>SYS A<u>hi<a>reply A"));
    slots_learn(s, 0, "<bos>SYS B<u>yo<a>reply B", strlen("<bos>SYS B<u>yo<a>reply B"));
    slots_learn(s, 7, "ignored", 7);
    CHECK(acquire(s, "<bos>SYS A<u>hi<a>reply A<eos><u>more", -1) == 2, "A did not find its resumed slot");
    CHECK(acquire(s, "<bos>SYS C<u>new", -1) == 1, "a new conversation took a resumed slot");
    CHECK(acquire(s, "<bos>SYS B<u>yo<a>reply B<eos><u>more", -1) == 0, "B did not find its resumed slot");
    slots_free(s);
}

typedef struct {
    slots *s;
    int pinned, result;
    double timeout;
} waiter_arg;

static void *waiter_main(void *p) {
    waiter_arg *w = p;
    int slot = -1;
    int rc = slots_acquire(w->s, "x", 1, w->pinned, w->timeout, NULL, NULL, &slot);
    w->result = rc == SLOTS_OK ? slot : rc;
    return NULL;
}

static int gone_now(void *arg) { return *(int *)arg; }

static void test_queue(void) {
    slots *s = slots_new(1, 1);
    CHECK(acquire(s, "first", -1) == 0, "first request gets the slot");
    waiter_arg w = {.s = s, .pinned = -1, .result = 99, .timeout = 30};
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &w);
    slots_stats st;
    for (int i = 0; i < 200; i++) {
        slots_get_stats(s, &st);
        if (st.waiting == 1) break;
        usleep(10000);
    }
    CHECK(st.waiting == 1 && st.busy == 1, "second request queues (waiting=%d)", st.waiting);
    CHECK(acquire(s, "third", -1) == SLOTS_FULL, "queue bound of 1 must refuse the third");
    release(s, 0, "first+reply");
    pthread_join(t, NULL);
    CHECK(w.result == 0, "the queued request gets the slot when it is released (got %d)", w.result);
    slots_get_stats(s, &st);
    CHECK(st.rejected == 1 && st.busy == 1 && st.waiting == 0, "stats rejected=%ld busy=%d", st.rejected, st.busy);

    /* A waiter times out and one whose client left gives up; neither keeps a place. */
    int slot = -1;
    CHECK(slots_acquire(s, "y", 1, -1, 0.2, NULL, NULL, &slot) == SLOTS_TIMEOUT, "timeout expected");
    int gone = 1;
    CHECK(slots_acquire(s, "y", 1, -1, 30, gone_now, &gone, &slot) == SLOTS_GONE, "client-gone expected");
    slots_get_stats(s, &st);
    CHECK(st.waiting == 0 && st.timed_out == 1, "waiting=%d timed_out=%ld", st.waiting, st.timed_out);
    release(s, 0, "");
    slots_close(s);
    CHECK(acquire(s, "z", -1) == SLOTS_CLOSED, "closed slots refuse");
    slots_free(s);
}

int main(void) {
    test_routing();
    test_learned_records();
    test_queue();
    return TEST_END();
}
