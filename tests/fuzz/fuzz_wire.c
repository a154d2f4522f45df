/* fuzz_wire — the engine's frame reader and SUBMIT parser (src/serve/wire.h) on arbitrary bytes.
 *
 * The input is delivered in chunks whose sizes come from its first byte, so frames split at every
 * point are exercised; every SUBMIT's untrusted span table goes through wire_parse_spans. Checked
 * beyond the sanitizers: a complete frame's payload and extension lie inside what was pushed, and
 * every span lies inside its prompt. Every line of the input is also read as an engine output
 * header (wire_parse_out, the gateway's side): a logprob table never exceeds its bound and a
 * payload length never exceeds the protocol's 65536 (a RECORD's, a slot's whole text: its own
 * WIRE_RECORD_MAX). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/wire.h"

static void check_frame(const wire_frame *f, const char *lo, const char *hi) {
    if (f->kind != WIRE_SUBMIT && f->kind != WIRE_IMAGE) return;
    if (f->payload < lo || f->payload + f->payload_len > hi) abort();
    if (f->kind != WIRE_SUBMIT) return;
    if (f->ext < f->payload || f->ext + f->ext_len > hi || f->sub.untrusted_bytes > f->ext_len) abort();
    tok_span *sp = NULL;
    int n = 0;
    char err[160];
    if (wire_parse_spans(f->ext, f->sub.untrusted_bytes, f->payload_len, &sp, &n, err, sizeof err) == 0)
        for (int i = 0; i < n; i++)
            if (sp[i].len == 0 || sp[i].start + sp[i].len > f->payload_len) abort();
    free(sp);
}

static void check_output_lines(const char *in, size_t n) {
    for (size_t at = 0; at < n;) {
        const char *nl = memchr(in + at, '\n', n - at);
        size_t len = nl ? (size_t)(nl - in) - at : n - at;
        wire_out o;
        if (wire_parse_out(in + at, len, &o) == 0 &&
            (o.k < 0 || o.k > WIRE_LOGPROBS_MAX || o.payload > (o.kind == WIRE_OUT_RECORD ? WIRE_RECORD_MAX : 65536)))
            abort();
        at += len + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    size_t step = (size_t)(data[0] % 16) + 1;
    const char *in = (const char *)data + 1;
    size_t n = size - 1;
    wire_reader r;
    wire_reader_init(&r);
    wire_frame f;
    for (size_t off = 0; off < n; off += step) {
        wire_reader_push(&r, in + off, off + step <= n ? step : n - off);
        while (wire_reader_next(&r, &f)) check_frame(&f, r.buf, r.buf + r.len);
    }
    wire_reader_eof(&r, &f);
    wire_reader_free(&r);
    check_output_lines(in, n);
    return 0;
}
