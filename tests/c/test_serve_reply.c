/* Unit tests of src/serve/reply.c: UTF-8 repair across DATA frames, stop strings split across
 * frames, and the hold-back that keeps a stream from emitting text it would have to retract. */
#include <stdlib.h>
#include <string.h>

#include "serve/reply.h"
#include "test.h"

static void feed_all(reply *r, const char *const *frames, int n) {
    for (int i = 0; i < n; i++) reply_feed(r, frames[i], strlen(frames[i]));
}

static void test_utf8_split_and_invalid(void) {
    reply r;
    reply_init(&r, NULL, 0, 0);
    /* "é" = C3 A9 split across frames; "€" = E2 82 AC split 1+2. */
    const char *frames[] = {"a\xC3", "\xA9", "b\xE2", "\x82\xAC", "c"};
    reply_feed(&r, frames[0], strlen(frames[0]));
    CHECK(r.len == 1 && r.stable == 1, "partial char must be held back, len=%zu", r.len);
    feed_all(&r, frames + 1, 4);
    reply_finish(&r);
    CHECK(!strcmp(r.text, "a\xC3\xA9" "b\xE2\x82\xAC" "c"), "got '%s'", r.text);
    reply_free(&r);

    /* Lone continuation, overlong, surrogate, and a truncated char at the end -> U+FFFD each. */
    reply_init(&r, NULL, 0, 0);
    const char bad[] = "x\x80y\xC0\xAFz\xED\xA0\x80w\xE2\x82";
    reply_feed(&r, bad, sizeof bad - 1);
    reply_finish(&r);
    const char *want = "x\xEF\xBF\xBDy\xEF\xBF\xBD\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDw\xEF\xBF\xBD";
    CHECK(!strcmp(r.text, want), "invalid bytes not replaced as expected: '%s'", r.text);
    reply_free(&r);

    /* A NUL byte (a byte-level vocabulary has a token for it) must not end the reply: the text
     * is handed on as a C string. */
    reply_init(&r, NULL, 0, 0);
    reply_feed(&r, "a\0b", 3);
    reply_finish(&r);
    CHECK(r.len == 5 && !strcmp(r.text, "a\xEF\xBF\xBD" "b"), "NUL not replaced: len %zu '%s'", r.len, r.text);
    reply_free(&r);

    size_t n = 0;
    char *clean = utf8_clean("ok\xFF", 3, &n);
    CHECK(n == 5 && !memcmp(clean, "ok\xEF\xBF\xBD", 5), "utf8_clean gave %zu bytes", n);
    free(clean);
}

static void test_stop_split_across_frames(void) {
    char *stops[] = {"STOP", "zz"};
    reply r;
    reply_init(&r, stops, 2, 0);
    CHECK(reply_feed(&r, "hello S", 7) == 0, "no stop yet");
    CHECK(r.stable == 6, "'S' may start a stop string: stable=%zu", r.stable);
    CHECK(reply_feed(&r, "TO", 2) == 0, "still no stop");
    CHECK(r.stable == 6, "stable=%zu", r.stable);
    CHECK(reply_feed(&r, "P and more", 10) == 1, "stop must fire");
    CHECK(r.stopped && !strcmp(r.text, "hello ") && r.stable == 6, "text after stop: '%s'", r.text);
    CHECK(r.stop_index == 0, "stop_index=%d", r.stop_index);
    CHECK(reply_feed(&r, "zz", 2) == 0 && !strcmp(r.text, "hello "), "text after a stop is ignored");
    reply_free(&r);

    /* A near miss is released once it cannot become a stop string any more. */
    reply_init(&r, stops, 2, 0);
    reply_feed(&r, "aST", 3);
    CHECK(r.stable == 1, "stable=%zu", r.stable);
    reply_feed(&r, "x", 1);
    CHECK(r.stable == 4 && !r.stopped, "stable=%zu", r.stable);
    reply_free(&r);

    /* The earliest of two stops wins. */
    reply_init(&r, stops, 2, 0);
    reply_feed(&r, "azzbSTOP", 8);
    CHECK(r.stopped && !strcmp(r.text, "a") && r.stop_index == 1, "got '%s' index %d", r.text, r.stop_index);
    reply_free(&r);
}

static void test_marker_holdback(void) {
    reply r;
    reply_init(&r, NULL, 0, 1);
    reply_feed(&r, "answer\n\n<｜DS", strlen("answer\n\n<｜DS"));
    CHECK(r.stable == 6, "a possible marker and the whitespace before it are held: stable=%zu", r.stable);
    reply_feed(&r, "ML｜tool_calls>", strlen("ML｜tool_calls>"));
    CHECK(r.stable == r.len, "a closed marker is stable: %zu/%zu", r.stable, r.len);
    reply_free(&r);

    reply_init(&r, NULL, 0, 0);
    reply_feed(&r, "a <b", 4);
    CHECK(r.stable == 4, "no marker hold-back without hold_markers");
    reply_free(&r);

    reply_init(&r, NULL, 0, 1);
    reply_feed(&r, "x < y ", 6);
    reply_finish(&r);
    CHECK(r.stable == r.len && !strcmp(r.text, "x < y "), "finish releases everything");
    reply_free(&r);
}

int main(void) {
    test_utf8_split_and_invalid();
    test_stop_split_across_frames();
    test_marker_holdback();
    return TEST_END();
}
