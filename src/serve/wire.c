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

enum { MAX_FIELDS = 80 };   /* a DATA frame with 32 logprob pairs has 69 */

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

/* An extension-payload byte count (untrusted=B, grammar=B). */
static int parse_size(const fields *v, size_t *out) {
    uint64_t b;
    if (parse_u64(v, 0, WIRE_EXT_BYTES_MAX, &b)) return -1;
    *out = (size_t)b;
    return 0;
}

static int parse_key(const fields *f, int i, wire_submit *s, wire_frame *fr) {
    const char *eq = memchr(f->s[i], '=', (size_t)f->len[i]);
    int klen = (int)(eq - f->s[i]);
    fields v = {.s = {eq + 1}, .len = {f->len[i] - klen - 1}, .n = 1};
    char key[48];                 /* longer keys are unknown ones, still distinct when cut */
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
    else if (!strcmp(key, "seed")) ok = (s->has_seed = parse_u64(&v, 0, UINT64_MAX, &s->seed) == 0);
    else if (!strcmp(key, "untrusted")) ok = parse_size(&v, &s->untrusted_bytes) == 0;
    else if (!strcmp(key, "grammar")) ok = (s->has_grammar_bytes = parse_size(&v, &s->grammar_bytes) == 0);
    else if (!strcmp(key, "think_budget")) ok = parse_int(&v, 0, 1, 1 << 30, &s->think_budget) == 0;
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
    if (ext_len >= WIRE_EXT_MAX) return fail(fr, "BAD_REQUEST", "%s longer than 255 bytes", "extension string");
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
        else if (fr->kind == WIRE_SUBMIT && fr->sub.grammar_bytes > ext - fr->sub.untrusted_bytes)
            fail(fr, "BAD_REQUEST", "%s larger than ext_bytes", "grammar");
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

/* The shortest decimal that strtof reads back as v, so a float field round-trips exactly. */
static const char *float_str(char *buf, size_t cap, float v) {
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtof(buf, NULL) == v) break;
    }
    return buf;
}

void wire_fmt_bias(sbuf *out, const char *id, const wire_bias *b) {
    sbuf p = {0};
    char v[32];
    for (int i = 0; i < b->n; i++) sbuf_printf(&p, "%s%d:%s", i ? " " : "", b->ids[i], float_str(v, sizeof v, b->vals[i]));
    sbuf_printf(out, "BIAS %s %zu\n", id, p.len);
    if (p.len) sbuf_put(out, p.p, p.len);
    sbuf_put(out, "\n", 1);
    sbuf_free(&p);
}

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

size_t wire_fmt_done(char *out, const char *id, const wire_done *d) {
    return (size_t)snprintf(out, WIRE_HEADER_MAX, "DONE %s STAT %d %.3f %.1f %.2f %d %d %d %ld\n", id, d->completion,
                            d->tok_s, d->hit_pct, d->rss_gb, d->prompt_tokens, d->length_limited ? 1 : 0, d->reused,
                            d->prefill_us);
}

size_t wire_fmt_submit(char *out, const char *id, const wire_submit *s, size_t prompt_len, size_t ext_len) {
    char t[32], p[32];
    size_t w = (size_t)snprintf(out, WIRE_HEADER_MAX, "SUBMIT %s %d %zu %d %s %s", id, s->slot, prompt_len,
                                s->max_tokens, float_str(t, sizeof t, s->temperature), float_str(p, sizeof p, s->top_p));
    char keys[WIRE_EXT_MAX * 2] = "";
    size_t k = 0;
    if (s->logprobs) k += (size_t)snprintf(keys + k, sizeof keys - k, " logprobs=%d", s->logprobs);
    if (s->ids) k += (size_t)snprintf(keys + k, sizeof keys - k, " ids=1");
    if (s->pin) k += (size_t)snprintf(keys + k, sizeof keys - k, " pin=1");
    if (s->tokids) k += (size_t)snprintf(keys + k, sizeof keys - k, " tokids=1");
    if (s->has_seed) k += (size_t)snprintf(keys + k, sizeof keys - k, " seed=%llu", (unsigned long long)s->seed);
    if (s->top_k) k += (size_t)snprintf(keys + k, sizeof keys - k, " top_k=%d", s->top_k);
    if (s->min_p) k += (size_t)snprintf(keys + k, sizeof keys - k, " min_p=%s", float_str(t, sizeof t, s->min_p));
    if (s->repetition) k += (size_t)snprintf(keys + k, sizeof keys - k, " rep=%s", float_str(t, sizeof t, s->repetition));
    if (s->presence) k += (size_t)snprintf(keys + k, sizeof keys - k, " pres=%s", float_str(t, sizeof t, s->presence));
    if (s->frequency) k += (size_t)snprintf(keys + k, sizeof keys - k, " freq=%s", float_str(t, sizeof t, s->frequency));
    if (s->untrusted_bytes) k += (size_t)snprintf(keys + k, sizeof keys - k, " untrusted=%zu", s->untrusted_bytes);
    if (s->has_grammar_bytes) k += (size_t)snprintf(keys + k, sizeof keys - k, " grammar=%zu", s->grammar_bytes);
    if (s->think_budget) k += (size_t)snprintf(keys + k, sizeof keys - k, " think_budget=%d", s->think_budget);
    /* protocol.md §1.3: the 7th field (ext bytes) must be present whenever more follows */
    if (ext_len || k || s->prefix_bytes >= 0) w += (size_t)snprintf(out + w, WIRE_HEADER_MAX - w, " %zu", ext_len);
    if (s->prefix_bytes >= 0) w += (size_t)snprintf(out + w, WIRE_HEADER_MAX - w, " %d", s->prefix_bytes);
    w += (size_t)snprintf(out + w, WIRE_HEADER_MAX - w, "%s\n", keys);
    return w;
}

size_t wire_fmt_control(char *out, wire_kind kind, const char *id) {
    return (size_t)snprintf(out, WIRE_HEADER_MAX, "%s %s\n", kind == WIRE_STOP ? "STOP" : "CANCEL", id);
}

size_t wire_fmt_caps(char *out, const wire_caps *c) {
    return (size_t)snprintf(out, WIRE_HEADER_MAX,
                            "CAPS vision=%d slots=%d ctx=%d logprobs=%d ids=%d family=%s truncate=%d checkpoints=%d "
                            "grammar=%d numerics=%s draft=%d\n",
                            c->vision, c->slots, c->ctx, c->logprobs, c->ids, c->family, c->truncate, c->checkpoints,
                            c->grammar, c->numerics, c->draft);
}

size_t wire_fmt_idle_stat(char *out, double rss_gb) {
    return (size_t)snprintf(out, WIRE_HEADER_MAX, "STAT 0 0.0 0.0 %.2f 0 0\n", rss_gb);
}

/* ---- engine output ---------------------------------------------------------------------- */

static int parse_double(const fields *f, int i, double *out) {
    char tmp[64], *end;
    if (f->len[i] == 0 || f->len[i] >= (int)sizeof tmp) return -1;
    *out = strtod(field_str(f, i, tmp, sizeof tmp), &end);
    return *end ? -1 : 0;
}

/* A logprob: any float, nan and inf included. */
static int parse_lp(const fields *f, int i, float *out) {
    char tmp[64], *end;
    if (f->len[i] == 0 || f->len[i] >= (int)sizeof tmp) return -1;
    *out = strtof(field_str(f, i, tmp, sizeof tmp), &end);
    return *end ? -1 : 0;
}

/* DATA id n [lp k [tid tlp]xk] [tok=ID]: the logprobs are positional, the token id a key. */
static void parse_data_lp(const fields *f, wire_out *o) {
    if (f->positional < f->n && f->len[f->positional] > 4 && !memcmp(f->s[f->positional], "tok=", 4)) {
        fields v = {.s = {f->s[f->positional] + 4}, .len = {f->len[f->positional] - 4}, .n = 1};
        if (parse_int(&v, 0, 0, 1 << 30, &o->tok)) o->tok = -1;
    }
    if (f->positional < 5 || parse_lp(f, 3, &o->lp) || parse_int(f, 4, 0, WIRE_LOGPROBS_MAX, &o->k) ||
        f->positional < 5 + 2 * o->k)
        return;
    for (int j = 0; j < o->k; j++)
        if (parse_int(f, 5 + 2 * j, 0, 1 << 30, &o->top_ids[j]) || parse_lp(f, 6 + 2 * j, &o->top_lps[j])) return;
    o->has_lp = 1;
}

/* STAT <completion> <tok_s> <hit%> <rss> [<prompt_tokens> [<length_limited> [<reused> [<prefill_us>]]]] */
static int parse_done(const fields *f, wire_out *o) {
    wire_done *d = &o->done;
    if (f->n < 7 || !field_is(f, 2, "STAT")) return -1;
    if (parse_int(f, 3, 0, 1 << 30, &d->completion)) d->completion = -1;
    if (parse_double(f, 4, &d->tok_s)) d->tok_s = 0;
    if (parse_double(f, 5, &d->hit_pct)) d->hit_pct = 0;
    if (parse_double(f, 6, &d->rss_gb)) d->rss_gb = 0;
    if (f->n < 8 || parse_int(f, 7, 0, 1 << 30, &d->prompt_tokens)) d->prompt_tokens = -1;
    d->length_limited = f->n > 8 && field_is(f, 8, "1");
    if (f->n < 10 || parse_int(f, 9, 0, 1 << 30, &d->reused)) d->reused = 0;
    uint64_t us;
    d->prefill_us = f->n > 10 && !parse_u64(f, 10, 1ULL << 50, &us) ? (long)us : 0;
    return 0;
}

static void parse_caps(const fields *f, wire_caps *c) {
    for (int i = 1; i < f->n; i++) {
        const char *eq = memchr(f->s[i], '=', (size_t)f->len[i]);
        if (!eq) continue;
        int klen = (int)(eq - f->s[i]);
        fields v = {.s = {eq + 1}, .len = {f->len[i] - klen - 1}, .n = 1};
        char key[32];
        snprintf(key, sizeof key, "%.*s", klen, f->s[i]);
        int *num = !strcmp(key, "vision") ? &c->vision : !strcmp(key, "slots") ? &c->slots : !strcmp(key, "ctx") ? &c->ctx
                 : !strcmp(key, "logprobs") ? &c->logprobs : !strcmp(key, "ids") ? &c->ids
                 : !strcmp(key, "truncate") ? &c->truncate : !strcmp(key, "checkpoints") ? &c->checkpoints
                 : !strcmp(key, "grammar") ? &c->grammar : !strcmp(key, "draft") ? &c->draft : NULL;
        if (num) parse_int(&v, 0, 0, 1 << 30, num);
        else if (!strcmp(key, "family")) field_str(&v, 0, c->family, sizeof c->family);
        else if (!strcmp(key, "numerics")) field_str(&v, 0, c->numerics, sizeof c->numerics);
    }
}

int wire_parse_out(const char *line, size_t n, wire_out *o) {
    fields f;
    memset(o, 0, sizeof *o);
    o->payload = -1;
    o->prompt_tokens = o->reused = o->tok = -1;
    split(line, n, &f);
    if (f.n == 0) return 0;
    if (f.n >= 2 && f.len[1] < WIRE_ID_MAX) field_str(&f, 1, o->id, sizeof o->id);
    if (field_is(&f, 0, "DATA") || field_is(&f, 0, "ECHO") || field_is(&f, 0, "TOOL")) {
        uint64_t bytes;
        if (f.n < 3 || parse_u64(&f, 2, 65536, &bytes)) return -1;
        o->payload = (long)bytes;
        if (!field_is(&f, 0, "DATA")) return 0;
        o->kind = WIRE_OUT_DATA;
        parse_data_lp(&f, o);
    } else if (field_is(&f, 0, "RECORD")) {
        uint64_t bytes;
        if (f.n < 3 || parse_int(&f, 1, 0, 1 << 20, &o->slot) || parse_u64(&f, 2, WIRE_RECORD_MAX, &bytes)) return -1;
        o->kind = WIRE_OUT_RECORD;
        o->id[0] = 0;
        o->payload = (long)bytes;
    } else if (f.n < 2) {
        return 0;
    } else if (field_is(&f, 0, "ACCEPT")) {
        o->kind = WIRE_OUT_ACCEPT;
        if (f.n < 3 || parse_int(&f, 2, 0, 1 << 30, &o->prompt_tokens)) o->prompt_tokens = -1;
        if (f.n < 4 || parse_int(&f, 3, 0, 1 << 30, &o->reused)) o->reused = -1;
    } else if (field_is(&f, 0, "DONE")) {
        o->kind = WIRE_OUT_DONE;
        return parse_done(&f, o);
    } else if (field_is(&f, 0, "ERROR")) {
        o->kind = WIRE_OUT_ERROR;
        size_t used = 0;
        for (int i = 2; i < f.n && used + 1 < sizeof o->error; i++)
            used += (size_t)snprintf(o->error + used, sizeof o->error - used, "%s%.*s", i > 2 ? " " : "", f.len[i], f.s[i]);
    } else if (field_is(&f, 0, "CAPS")) {
        o->kind = WIRE_OUT_CAPS;
        o->id[0] = 0;
        parse_caps(&f, &o->caps);
    }
    return 0;
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

size_t wire_fmt_record(char *out, int slot, size_t n) {
    return (size_t)snprintf(out, WIRE_HEADER_MAX, "RECORD %d %zu\n", slot, n);
}
