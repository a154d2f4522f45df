/* Unit tests of src/serve/slots.c: conversation -> slot routing, pinning, owners (users), the
 * bounded FIFO queue (429 when full, timeouts, leaving the queue), records forgotten on engine
 * restart and learned from the new engine. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "serve/slots.h"
#include "test.h"

static int acquire_as(slots *s, const char *prompt, int pinned, unsigned long long owner) {
    int slot = -1;
    slot_request rq = {prompt, strlen(prompt), pinned, owner};
    int rc = slots_acquire(s, &rq, 5, NULL, NULL, &slot);
    return rc == SLOTS_OK ? slot : rc;
}

static int acquire(slots *s, const char *prompt, int pinned) { return acquire_as(s, prompt, pinned, 0); }

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

/* Users: a user's first request is routed (never onto another user's slot while one is empty),
 * later ones follow it whatever the conversation; after a restart the user finds its resumed
 * record by prefix; a request taking the slot ends the ownership. */
static void test_owners(void) {
    enum { ALICE = 11, BOB = 23, CAROL = 35 };
    slots *s = slots_new(3, 4);
    int a = acquire_as(s, "<bos>alice one", -1, ALICE);
    release(s, a, "<bos>alice one<a>r");
    int b = acquire_as(s, "<bos>bob one", -1, BOB);
    CHECK(b >= 0 && b != a, "bob took alice's slot while two were empty (a=%d b=%d)", a, b);
    release(s, b, "<bos>bob one<a>r");
    CHECK(acquire_as(s, "<bos>alice, a different talk", -1, ALICE) == a, "alice's next talk left her slot");
    release(s, a, "<bos>alice, a different talk<a>r");
    CHECK(acquire_as(s, "<bos>alice again", -1, ALICE) == a, "alice's slot is not hers any more");
    release(s, a, "<bos>alice again<a>r");

    /* Restart: records come back in other slots than before; alice's first request finds hers. */
    slots_forget_all(s);
    slots_learn(s, 2, "<bos>alice again<a>r", strlen("<bos>alice again<a>r"));
    slots_learn(s, 0, "<bos>bob one<a>r", strlen("<bos>bob one<a>r"));
    CHECK(acquire_as(s, "<bos>alice again<a>r<u>more", -1, ALICE) == 2, "alice missed her resumed record");
    release(s, 2, "<bos>alice again<a>r<u>more<a>r");
    CHECK(acquire_as(s, "<bos>alice, third talk", -1, ALICE) == 2, "alice does not own the resumed slot");
    release(s, 2, "<bos>alice, third talk<a>r");

    /* A pin onto alice's slot takes it over: alice's next request is routed again, carol too. */
    CHECK(acquire(s, "<bos>someone pinned", 2) == 2, "pin refused");
    release(s, 2, "<bos>someone pinned<a>r");
    CHECK(acquire_as(s, "<bos>alice, fourth talk", -1, ALICE) == 1, "alice did not get the empty slot");
    release(s, 1, "<bos>alice, fourth talk<a>r");
    int c = acquire_as(s, "<bos>carol", -1, CAROL);
    CHECK(c != 1, "carol took alice's slot (c=%d)", c);
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
    slot_request rq = {"x", 1, w->pinned, 0};
    int rc = slots_acquire(w->s, &rq, w->timeout, NULL, NULL, &slot);
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
    slot_request y = {"y", 1, -1, 0};
    CHECK(slots_acquire(s, &y, 0.2, NULL, NULL, &slot) == SLOTS_TIMEOUT, "timeout expected");
    int gone = 1;
    CHECK(slots_acquire(s, &y, 30, gone_now, &gone, &slot) == SLOTS_GONE, "client-gone expected");
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
    test_owners();
    test_queue();
    return TEST_END();
}
