#include "reply.h"

#include <stdlib.h>
#include <string.h>

#include "../core/util.h"

/* Longest possible template marker we hold back for (e.g. "<｜end▁of▁sentence｜>" is 27 bytes,
 * DSML markers are a little longer). */
#define MARKER_HOLD_MAX 48

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

void reply_init(reply *r, char **stops, int nstops, int hold_markers) {
    memset(r, 0, sizeof *r);
    r->stops = stops;
    r->nstops = nstops;
    r->hold_markers = hold_markers;
    r->stop_index = -1;
    r->cap = 256;
    r->text = xmalloc(r->cap);
    r->text[0] = 0;
}

void reply_free(reply *r) {
    free(r->text);
    r->text = NULL;
}

static void put(reply *r, const void *p, size_t n) {
    if (r->len + n + 1 > r->cap) {
        while (r->len + n + 1 > r->cap) r->cap *= 2;
        r->text = xrealloc(r->text, r->cap);
    }
    memcpy(r->text + r->len, p, n);
    r->len += n;
    r->text[r->len] = 0;
}

/* Bytes a character starting with lead b takes, 0 if b cannot start one. NUL is valid UTF-8 but
 * cannot start one here: the text is handed on as a C string (cJSON, strlen), where a NUL would
 * silently end the reply (a byte-level vocabulary has a token for it). */
static int utf8_lead_len(unsigned char b) {
    if (b == 0) return 0;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

/* Is c a valid byte at position i (>= 1) of a character whose first byte is lead?
 * The second byte has narrower ranges that exclude overlongs, surrogates and > U+10FFFF. */
static int utf8_cont_ok(unsigned char lead, int i, unsigned char c) {
    if (i == 1) {
        if (lead == 0xE0) return c >= 0xA0 && c <= 0xBF;
        if (lead == 0xED) return c >= 0x80 && c <= 0x9F;
        if (lead == 0xF0) return c >= 0x90 && c <= 0xBF;
        if (lead == 0xF4) return c >= 0x80 && c <= 0x8F;
    }
    return c >= 0x80 && c <= 0xBF;
}

/* Feed one raw byte through the decoder into the text. */
static void decode_byte(reply *r, unsigned char c) {
    if (r->npend) {
        if (utf8_cont_ok(r->pend[0], r->npend, c)) {
            r->pend[r->npend++] = c;
            if (r->npend == r->need) { put(r, r->pend, (size_t)r->npend); r->npend = 0; }
            return;
        }
        put(r, REPLACEMENT, 3);       /* the pending character was cut short; c starts afresh */
        r->npend = 0;
    }
    int need = utf8_lead_len(c);
    if (need == 0) { put(r, REPLACEMENT, 3); return; }
    if (need == 1) { put(r, &c, 1); return; }
    r->pend[0] = c;
    r->npend = 1;
    r->need = need;
}

/* Bytes at the end of the text that may still become a stop string or a template marker. */
static size_t holdback(const reply *r) {
    size_t hold = 0;
    for (int i = 0; i < r->nstops; i++) {
        size_t sl = strlen(r->stops[i]);
        for (size_t k = MIN(sl - 1, r->len); k > hold; k--)
            if (!memcmp(r->text + r->len - k, r->stops[i], k)) { hold = k; break; }
    }
    if (r->hold_markers) {
        size_t from = r->len > MARKER_HOLD_MAX ? r->len - MARKER_HOLD_MAX : 0;
        for (size_t i = r->len; i > from; i--) {
            char c = r->text[i - 1];
            if (c == '>') break;
            if (c == '<') { hold = MAX(hold, r->len - (i - 1)); break; }
        }
        /* Templates trim the whitespace before a tool-call block, so it is not final either. */
        size_t keep = r->len - hold;
        while (keep > 0 && r->text[keep - 1] && strchr(" \t\r\n", r->text[keep - 1])) keep--;
        hold = r->len - keep;
    }
    return hold;
}

/* Cut at the first stop string that ends in the part of the text added since old_len. */
static int check_stops(reply *r, size_t old_len) {
    size_t cut = r->len + 1;
    for (int i = 0; i < r->nstops; i++) {
        size_t sl = strlen(r->stops[i]);
        size_t from = old_len >= sl ? old_len - sl + 1 : 0;
        char *hit = memmem(r->text + from, r->len - from, r->stops[i], sl);
        if (hit && (size_t)(hit - r->text) < cut) { cut = (size_t)(hit - r->text); r->stop_index = i; }
    }
    if (cut > r->len) return 0;
    r->len = cut;
    r->text[cut] = 0;
    r->stopped = 1;
    return 1;
}

int reply_feed(reply *r, const char *raw, size_t n) {
    if (r->stopped) return 0;
    size_t old_len = r->len;
    for (size_t i = 0; i < n; i++) decode_byte(r, (unsigned char)raw[i]);
    int hit = check_stops(r, old_len);
    r->stable = r->stopped ? r->len : r->len - holdback(r);
    return hit;
}

void reply_finish(reply *r) {
    if (r->npend && !r->stopped) {
        size_t old_len = r->len;
        put(r, REPLACEMENT, 3);
        check_stops(r, old_len);
    }
    r->npend = 0;
    r->stable = r->len;
}

char *utf8_clean(const char *raw, size_t n, size_t *out_len) {
    reply r;
    reply_init(&r, NULL, 0, 0);
    reply_feed(&r, raw, n);
    reply_finish(&r);
    if (out_len) *out_len = r.len;
    return r.text;
}
