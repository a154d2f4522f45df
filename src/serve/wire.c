/* wire.c — engine line protocol codec; see wire.h for the frame grammar and invariants. */
#include "wire.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"

const char WIRE_READY[] = "\x01\x01READY\x01\x01\n";

/* ---- field parsing ---------------------------------------------------------------------- */

enum { MAX_FIELDS = 64 };

typedef struct {
    const char *s[MAX_FIELDS];
    int len[MAX_FIELDS];
    int n;            /* fields kept (the first MAX_FIELDS) */
    int dropped;      /* fields beyond those: the header is refused, but its sizes still count */
    int positional;   /* fields before the first key=value */
} fields;

/* Split on spaces/tabs. */
static void split(const char *h, size_t n, fields *f) {
    f->n = f->dropped = 0;
    for (size_t i = 0; i < n;) {
        while (i < n && (h[i] == ' ' || h[i] == '\t')) i++;
        if (i == n) break;
        size_t j = i;
        while (j < n && h[j] != ' ' && h[j] != '\t') j++;
        if (f->n == MAX_FIELDS) f->dropped++;
        else {
            f->s[f->n] = h + i;
            f->len[f->n++] = (int)(j - i);
        }
        i = j;
    }
    f->positional = f->n;
    for (int i = 0; i < f->n; i++)
        if (memchr(f->s[i], '=', (size_t)f->len[i])) { f->positional = i; break; }
}

static int field_is(const fields *f, int i, const char *word) {
    return (size_t)f->len[i] == strlen(word) && memcmp(f->s[i], word, (size_t)f->len[i]) == 0;
}

/* Copy field i into a NUL-terminated scratch buffer (fields are at most a header long). */
static const char *field_str(const fields *f, int i, char *tmp, size_t cap) {
    size_t n = MIN((size_t)f->len[i], cap - 1);
    memcpy(tmp, f->s[i], n);
    tmp[n] = 0;
    return tmp;
}

static int parse_u64(const fields *f, int i, uint64_t max, uint64_t *out) {
    if (f->len[i] == 0 || f->len[i] > 20) return -1;
    uint64_t v = 0;
    for (int k = 0; k < f->len[i]; k++) {
        char c = f->s[i][k];
        if (c < '0' || c > '9') return -1;
        if (v > (UINT64_MAX - (uint64_t)(c - '0')) / 10) return -1;
        v = v * 10 + (uint64_t)(c - '0');
    }
    if (v > max) return -1;
    *out = v;
    return 0;
}

static int parse_int(const fields *f, int i, long lo, long hi, int *out) {
    char tmp[32], *end;
    if (f->len[i] == 0 || f->len[i] >= (int)sizeof tmp) return -1;
    errno = 0;
    long v = strtol(field_str(f, i, tmp, sizeof tmp), &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int parse_finite(const fields *f, int i, float *out) {
    char tmp[64], *end;
    if (f->len[i] == 0 || f->len[i] >= (int)sizeof tmp) return -1;
    float v = strtof(field_str(f, i, tmp, sizeof tmp), &end);
    if (*end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* ---- header validation ------------------------------------------------------------------ */

static void fail(wire_frame *fr, const char *code, const char *fmt, const char *what) {
    fr->kind = WIRE_ERROR;
    fr->code = code;
    snprintf(fr->detail, sizeof fr->detail, fmt, what);
}

static int take_id(const fields *f, wire_frame *fr) {
    if (f->n < 2) return -1;
    if (f->len[1] >= WIRE_ID_MAX) return -1;
    memcpy(fr->id, f->s[1], (size_t)f->len[1]);
    fr->id[f->len[1]] = 0;
    return 0;
}

static int parse_key(const fields *f, int i, wire_submit *s, wire_frame *fr) {
    const char *eq = memchr(f->s[i], '=', (size_t)f->len[i]);
    int klen = (int)(eq - f->s[i]);
    fields v = {.s = {eq + 1}, .len = {f->len[i] - klen - 1}, .n = 1};
    char key[WIRE_EXT_MAX];
    snprintf(key, sizeof key, "%.*s", klen, f->s[i]);
    int ok = 0;
    if (!strcmp(key, "logprobs")) ok = parse_int(&v, 0, 0, WIRE_LOGPROBS_MAX, &s->logprobs) == 0;
    else if (!strcmp(key, "ids")) ok = parse_int(&v, 0, 0, 1, &s->ids) == 0;
    else if (!strcmp(key, "pin")) ok = parse_int(&v, 0, 0, 1, &s->pin) == 0;
    else if (!strcmp(key, "tokids")) ok = parse_int(&v, 0, 0, 1, &s->tokids) == 0;
    else if (!strcmp(key, "top_k")) ok = parse_int(&v, 0, 0, 1 << 30, &s->top_k) == 0;
    else if (!strcmp(key, "min_p")) ok = parse_finite(&v, 0, &s->min_p) == 0 && s->min_p >= 0 && s->min_p <= 1;
    else if (!strcmp(key, "rep")) ok = parse_finite(&v, 0, &s->repetition) == 0 && s->repetition > 0;
    else if (!strcmp(key, "pres")) ok = parse_finite(&v, 0, &s->presence) == 0;
    else if (!strcmp(key, "freq")) ok = parse_finite(&v, 0, &s->frequency) == 0;
    else if (!strcmp(key, "seed")) ok = parse_u64(&v, 0, UINT64_MAX, &s->seed) == 0;
    else if (!strcmp(key, "untrusted")) {
        uint64_t b;
        ok = parse_u64(&v, 0, WIRE_EXT_BYTES_MAX, &b) == 0;
        s->untrusted_bytes = (size_t)b;
    }
    else ok = 1;                  /* unknown keys are ignored, like unknown frames */
    if (!ok) fail(fr, "BAD_REQUEST", "bad value for extension key %s", key);
    return ok ? 0 : -1;
}

/* Sizes first: they decide how many payload bytes belong to this frame even if the rest of the
 * header is wrong. Returns the payload bytes (prompt + ext) or -1 when they cannot be trusted. */
static int64_t submit_sizes(const fields *f, uint64_t *bytes, uint64_t *ext) {
    if (f->positional < 4 || parse_u64(f, 3, WIRE_PROMPT_MAX, bytes)) return -1;
    *ext = 0;
    if (f->positional > 7 && parse_u64(f, 7, WIRE_EXT_BYTES_MAX, ext)) return -1;
    return (int64_t)(*bytes + *ext);
}

static void parse_submit(const fields *f, wire_frame *fr, uint64_t bytes) {
    wire_submit *s = &fr->sub;
    memset(s, 0, sizeof *s);
    s->prefix_bytes = -1;
    if (f->positional < 7) return fail(fr, "BAD_REQUEST", "%s needs id slot bytes max_tokens temperature top_p", "SUBMIT");
    if (f->positional > 9) return fail(fr, "BAD_REQUEST", "%s has more than 8 positional fields", "SUBMIT");
    if (f->positional == 7 && f->n > 7) return fail(fr, "BAD_REQUEST", "%s key=value fields need ext_bytes first", "SUBMIT");
    if (parse_int(f, 2, 0, 1 << 30, &s->slot)) return fail(fr, "BAD_REQUEST", "bad %s", "slot");
    if (parse_int(f, 4, 0, 1 << 30, &s->max_tokens)) return fail(fr, "BAD_REQUEST", "bad %s", "max_tokens");
    if (parse_finite(f, 5, &s->temperature) || s->temperature < 0)
        return fail(fr, "BAD_REQUEST", "bad %s (finite, >= 0)", "temperature");
    if (parse_finite(f, 6, &s->top_p) || !(s->top_p > 0 && s->top_p <= 1))
        return fail(fr, "BAD_REQUEST", "bad %s (finite, in (0, 1])", "top_p");
    if (f->positional == 9 && parse_int(f, 8, 0, (long)bytes, &s->prefix_bytes))
        return fail(fr, "BAD_REQUEST", "bad %s (0..bytes)", "prefix_bytes");
    int ext_len = 0;
    for (int i = f->positional; i < f->n; i++) {
        if (!memchr(f->s[i], '=', (size_t)f->len[i])) return fail(fr, "BAD_REQUEST", "%s after key=value fields", "positional field");
        ext_len += f->len[i] + (i > f->positional);
        if (parse_key(f, i, s, fr)) return;
    }
    if (ext_len >= WIRE_EXT_MAX) return fail(fr, "BAD_REQUEST", "%s longer than 127 bytes", "extension string");
    if (s->max_tokens == 0 && s->logprobs == 0) return fail(fr, "BAD_REQUEST", "%s must be >= 1 (0 only with logprobs)", "max_tokens");
    fr->kind = WIRE_SUBMIT;
}

static void parse_image(const fields *f, wire_frame *fr) {
    int gh, gw;
    if (f->n < 5 || parse_int(f, 3, 1, 1 << 20, &gh) || parse_int(f, 4, 1, 1 << 20, &gw))
        return fail(fr, "BAD_REQUEST", "%s needs id bytes grid_h grid_w (grids >= 1)", "IMAGE");
    fr->kind = WIRE_IMAGE;
}

static int header_printable(const char *h, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)h[i] < 0x20 && h[i] != '\t') || (unsigned char)h[i] > 0x7e) return 0;
    return 1;
}

/* Classify one header line. *payload gets the bytes that follow it before the closing "\n"
 * (-1: none). The frame is complete except for its payload pointers. */
static void parse_header(const char *h, size_t n, wire_frame *fr, int64_t *payload) {
    fields f;
    *payload = -1;
    memset(fr, 0, sizeof *fr);
    strcpy(fr->id, "0");
    if (!header_printable(h, n)) return fail(fr, "BAD_REQUEST", "%s", "control or non-ASCII byte in header");
    split(h, n, &f);
    if (f.n == 0) { fr->kind = WIRE_IGNORED; return; }
    int submit = field_is(&f, 0, "SUBMIT"), image = field_is(&f, 0, "IMAGE"), bias = field_is(&f, 0, "BIAS");
    int slot = field_is(&f, 0, "SLOT");
    if (!submit && !image && !bias && !slot && !field_is(&f, 0, "STOP") && !field_is(&f, 0, "CANCEL")) {
        fr->kind = WIRE_IGNORED;
        return;
    }
    uint64_t bytes = 0, ext = 0;
    if (submit) *payload = submit_sizes(&f, &bytes, &ext);
    if (image && f.n >= 3 && !parse_u64(&f, 2, WIRE_IMAGE_MAX, &bytes)) *payload = (int64_t)bytes;
    if (bias && f.n >= 3 && !parse_u64(&f, 2, WIRE_BIAS_MAX, &bytes)) *payload = (int64_t)bytes;
    if (slot && f.n >= 5 && !parse_u64(&f, 4, WIRE_SLOT_NAME_MAX, &bytes)) *payload = (int64_t)bytes;
    if (take_id(&f, fr)) return fail(fr, "BAD_REQUEST", "%s missing or longer than 63 bytes", "id");
    if (f.positional > WIRE_FIELDS_MAX || f.dropped) return fail(fr, "BAD_REQUEST", "more than %s fields", "10 positional");
    if (submit && *payload < 0) return fail(fr, "BAD_REQUEST", "bad %s", "bytes or ext_bytes (limits 16 MiB / 1 MiB)");
    if (image && *payload < 0) return fail(fr, "BAD_REQUEST", "bad %s", "IMAGE bytes");
    if (bias && *payload < 0) return fail(fr, "BAD_REQUEST", "bad %s", "BIAS bytes (limit 64 KiB)");
    if (slot && *payload < 0) return fail(fr, "BAD_REQUEST", "%s needs id action slot bytes (a name < 64 bytes)", "SLOT");
    if (submit) {
        parse_submit(&f, fr, bytes);
        fr->payload_len = bytes;
        fr->ext_len = ext;
        if (fr->kind == WIRE_SUBMIT && fr->sub.untrusted_bytes > ext)
            fail(fr, "BAD_REQUEST", "%s larger than ext_bytes", "untrusted span table");
    } else if (image) {
        parse_image(&f, fr);
        fr->payload_len = bytes;
    } else if (slot) {
        static const char *const actions[] = {"save", "restore", "erase"};
        fr->payload_len = bytes;
        fr->kind = WIRE_ERROR;
        for (int a = 0; a < 3; a++)
            if (field_is(&f, 2, actions[a])) fr->action = (wire_slot_action)a, fr->kind = WIRE_SLOT;
        if (fr->kind != WIRE_SLOT) fail(fr, "BAD_REQUEST", "%s action must be save, restore or erase", "SLOT");
        else if (f.n != 5 || parse_int(&f, 3, 0, 1 << 20, &fr->slot)) fail(fr, "BAD_REQUEST", "bad %s", "SLOT slot");
    } else if (bias) {
        fr->kind = f.n == 3 ? WIRE_BIAS : WIRE_ERROR;
        if (f.n != 3) fail(fr, "BAD_REQUEST", "%s needs id bytes", "BIAS");
        fr->payload_len = bytes;
    } else {
        fr->kind = field_is(&f, 0, "STOP") ? WIRE_STOP : WIRE_CANCEL;
    }
}

/* ---- reader ----------------------------------------------------------------------------- */

void wire_reader_init(wire_reader *r) { memset(r, 0, sizeof *r); }

void wire_reader_free(wire_reader *r) {
    free(r->buf);
    memset(r, 0, sizeof *r);
}

void wire_reader_push(wire_reader *r, const char *data, size_t n) {
    if (n == 0) return;
    if (r->start) {
        memmove(r->buf, r->buf + r->start, r->len - r->start);
        r->len -= r->start;
        r->start = 0;
    }
    if (r->len + n > r->cap) {
        r->cap = MAX(r->len + n, r->cap * 2 + 4096);
        r->buf = xrealloc(r->buf, r->cap);
    }
    memcpy(r->buf + r->len, data, n);
    r->len += n;
}

int wire_reader_next(wire_reader *r, wire_frame *f) {
    for (;;) {
        size_t avail = r->len - r->start;
        if (avail == 0) return 0;
        char *p = r->buf + r->start;
        if (r->draining) {
            char *end = memchr(p, '\n', avail);
            r->start = end ? (size_t)(end + 1 - r->buf) : r->len;
            if (!end) return 0;
            r->draining = 0;
            continue;
        }
        /* the header may be WIRE_HEADER_MAX bytes plus an optional "\r" */
        char *nl = memchr(p, '\n', MIN(avail, (size_t)WIRE_HEADER_MAX + 2));
        if (!nl) {
            if (avail <= (size_t)WIRE_HEADER_MAX + 1) return 0;
            memset(f, 0, sizeof *f);
            strcpy(f->id, "0");
            fail(f, "BAD_REQUEST", "header longer than %s bytes", "4096");
            r->draining = 1;
            return 1;
        }
        size_t hlen = (size_t)(nl - p);
        size_t body = hlen + 1;
        if (hlen && p[hlen - 1] == '\r') hlen--;
        int64_t payload;
        if (hlen > WIRE_HEADER_MAX) {
            memset(f, 0, sizeof *f);
            strcpy(f->id, "0");
            fail(f, "BAD_REQUEST", "header longer than %s bytes", "4096");
            payload = -1;
        } else {
            parse_header(p, hlen, f, &payload);
        }
        if (payload >= 0) {
            if (avail < body + (size_t)payload + 1) return 0;
            f->payload = p + body;
            f->ext = f->payload + f->payload_len;
            if (p[body + (size_t)payload] != '\n' && f->kind != WIRE_ERROR)
                fail(f, "BAD_FRAME", "%s", "payload not followed by a newline (byte count wrong?)");
            body += (size_t)payload + 1;
        }
        r->start += body;
        if (f->kind == WIRE_IGNORED) continue;
        return 1;
    }
}

int wire_reader_eof(wire_reader *r, wire_frame *f) {
    size_t avail = r->len - r->start;
    int cut = avail > 0 && !r->draining;
    char *p = cut ? r->buf + r->start : NULL;   /* buf is NULL before the first push */
    r->start = r->len = 0;
    r->draining = 0;
    if (!cut) return 0;
    /* Recover the id from the unfinished header, if it got that far (the bytes stay in buf). */
    char *nl = memchr(p, '\n', avail);
    int64_t payload;
    parse_header(p, nl ? (size_t)(nl - p) : MIN(avail, (size_t)WIRE_HEADER_MAX), f, &payload);
    if (f->kind == WIRE_IGNORED && !nl) return 0;
    fail(f, "BAD_FRAME", "%s", "input ended inside a frame");
    return 1;
}

int wire_parse_bias(const char *p, size_t n, int vocab, int *ids, float *bias, char *detail) {
    int k = 0;
    for (size_t i = 0; i < n;) {
        if (p[i] == ' ') { i++; continue; }
        char item[64];
        size_t j = i;
        while (j < n && p[j] != ' ') j++;
        if (j - i >= sizeof item) return snprintf(detail, 160, "BIAS entry at byte %zu too long", i), -1;
        memcpy(item, p + i, j - i);
        item[j - i] = 0;
        char *colon = strchr(item, ':'), *end;
        long id = colon ? strtol(item, &end, 10) : -1;
        if (!colon || end != colon || id < 0 || id >= vocab)
            return snprintf(detail, 160, "BIAS entry '%s': want token_id:bias with id below %d", item, vocab), -1;
        float b = strtof(colon + 1, &end);
        if (*end || end == colon + 1 || !isfinite(b)) return snprintf(detail, 160, "BIAS entry '%s': bad bias", item), -1;
        if (k == WIRE_BIAS_ENTRIES) return snprintf(detail, 160, "more than %d BIAS entries", WIRE_BIAS_ENTRIES), -1;
        ids[k] = (int)id;
        bias[k++] = b;
        i = j;
    }
    return k;
}

/* ---- untrusted span table ------------------------------------------------------------------ */

/* A decimal number at *p, then a single space before the next one or the end of the table. */
static int span_number(const char **p, const char *end, size_t *out) {
    const char *q = *p;
    size_t v = 0;
    if (q == end || *q < '0' || *q > '9') return -1;
    for (; q < end && *q >= '0' && *q <= '9'; q++) {
        if (v > (SIZE_MAX - (size_t)(*q - '0')) / 10) return -1;
        v = v * 10 + (size_t)(*q - '0');
    }
    if (q < end && (*q != ' ' || ++q == end)) return -1;
    *out = v;
    *p = q;
    return 0;
}

int wire_parse_spans(const char *table, size_t n, size_t prompt_len, tok_span **spans, int *nspans, char *err,
                     size_t errlen) {
    const char *p = table, *end = table + n;
    tok_span *out = NULL;
    int k = 0, cap = 0;
    size_t prev_end = 0;
    while (p < end) {
        size_t start, len;
        if (span_number(&p, end, &start) || p == end || span_number(&p, end, &len)) {
            free(out);
            return errf(err, errlen, "untrusted span table: span %d is not two decimal numbers", k);
        }
        if (len == 0 || start < prev_end || start > prompt_len || len > prompt_len - start) {
            free(out);
            return errf(err, errlen, "untrusted span %d (%zu+%zu) is empty, overlaps, or passes the %zu prompt bytes", k,
                        start, len, prompt_len);
        }
        if (k == cap) {
            cap = cap ? 2 * cap : 16;
            out = xrealloc(out, (size_t)cap * sizeof *out);
        }
        out[k++] = (tok_span){start, len};
        prev_end = start + len;
    }
    *spans = out;
    *nspans = k;
    return 0;
}

void wire_fmt_spans(sbuf *out, const tok_span *spans, int n) {
    for (int i = 0; i < n; i++) sbuf_printf(out, "%s%zu %zu", i ? " " : "", spans[i].start, spans[i].len);
}

int wire_slot_name_ok(const char *name, size_t n) {
    if (n == 0 || n >= WIRE_SLOT_NAME_MAX || name[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return 0;
    }
    return 1;
}

size_t wire_fmt_slot(char *out, const char *id, wire_slot_action action, int slot, size_t n) {
    static const char *const actions[] = {"save", "restore", "erase"};
    return (size_t)snprintf(out, WIRE_HEADER_MAX, "SLOT %s %s %d %zu\n", id, actions[action], slot, n);
}

/* ---- formatting ------------------------------------------------------------------------- */

size_t wire_fmt_accept(char *out, const char *id, int prompt_tokens, int reused) {
    return (size_t)snprintf(out, WIRE_HEADER_MAX, "ACCEPT %s %d %d\n", id, prompt_tokens, reused);
}

size_t wire_fmt_data(char *out, const char *id, size_t n, int k, float lp, const int *top_ids, const float *top_lps,
                     int tok) {
    size_t w = (size_t)snprintf(out, WIRE_HEADER_MAX, "DATA %s %zu", id, n);
    if (k > 0) {
        w += (size_t)snprintf(out + w, WIRE_HEADER_MAX - w, " %.7g %d", lp, k);
        for (int i = 0; i < k; i++) w += (size_t)snprintf(out + w, WIRE_HEADER_MAX - w, " %d %.7g", top_ids[i], top_lps[i]);
    }
    if (tok >= 0) w += (size_t)snprintf(out + w, WIRE_HEADER_MAX - w, " tok=%d", tok);
    out[w++] = '\n';
    return w;
}

size_t wire_fmt_done(char *out, const char *id, int completion, double tok_s, double hit_pct, double rss_gb,
                     int prompt_tokens, int length_limited, int reused, long prefill_us) {
    return (size_t)snprintf(out, WIRE_HEADER_MAX, "DONE %s STAT %d %.3f %.1f %.2f %d %d %d %ld\n", id, completion, tok_s,
                            hit_pct, rss_gb, prompt_tokens, length_limited ? 1 : 0, reused, prefill_us);
}

size_t wire_fmt_error(char *out, const char *id, const char *code, const char *detail) {
    size_t w = (size_t)snprintf(out, WIRE_HEADER_MAX - 1, "ERROR %s %s%s%s", id, code, detail && *detail ? " " : "",
                                detail ? detail : "");
    w = MIN(w, (size_t)WIRE_HEADER_MAX - 2);
    for (size_t i = 0; i < w; i++)
        if (out[i] == '\n' || out[i] == '\r') out[i] = ' ';
    out[w++] = '\n';
    return w;
}
