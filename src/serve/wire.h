/* wire.h — the engine line protocol codec (protocol.md §1), pure: bytes in, frames out, and
 * frames formatted into caller buffers. No I/O, no model. It is the one codec of both ends:
 * the engine loop parses what the gateway sends (wire_reader) and formats its answers
 * (wire_fmt_accept/data/done/error/caps); the gateway formats SUBMIT, STOP and CANCEL
 * (wire_fmt_submit, wire_fmt_control) and parses the engine's header lines (wire_parse_out).
 * Every frame kind round-trips: parse(format(x)) == x (tests/c/test_wire.c).
 *
 * INPUT. wire_reader accumulates bytes (wire_reader_push) and hands out one complete frame at a
 * time (wire_reader_next). A frame is a header line of space-separated ASCII fields ended by
 * "\n" (a "\r" before it is dropped); SUBMIT and IMAGE announce a payload of exactly that many
 * bytes followed by one "\n".
 *
 * SLOT <id> save|restore|erase <slot> <bytes>\n<name>\n (a cairn extension, llama.cpp's slot
 * files): save the idle slot's state under the name, load it back into the slot, or empty the
 * slot. The name is 1..63 bytes of [A-Za-z0-9._-], not starting with '.'. Answered DONE (its
 * completion field = the positions saved, restored or erased) or ERROR.
 *
 * BIAS <id> <bytes>\n<payload>\n (a cairn extension) comes right before the SUBMIT with the same
 * id, like IMAGE: its payload is the request's logit bias as space-separated `token_id:bias`.
 *
 * SUBMIT KEYS beyond upstream's logprobs/ids/pin (cairn extensions): tokids=1 (every sampled token
 * gets its own DATA frame ending in tok=<id>), seed=N (u64; without it the engine uses 0),
 * top_k=N, min_p=F in [0, 1], rep=F > 0 (repetition penalty), pres=F and freq=F (presence and
 * frequency penalties), untrusted=B and grammar=B (below), think_budget=N (N >= 1: the reply's
 * reasoning may take at most N tokens, its markers included; the engine ends it with the family's
 * close when it would take more: serve/think_budget.h). Engine answers: ACCEPT carries a third
 * field, the prompt tokens reused; CAPS carries numerics=exact|qat besides the upstream keys.
 *
 * UNTRUSTED SPANS (a cairn extension). `untrusted=B` on a SUBMIT says the first B bytes of its
 * extension payload are a span table: "START LEN" pairs of decimal byte offsets into the prompt,
 * all separated by single spaces, ascending and disjoint, LEN >= 1. The engine encodes those
 * bytes as plain text (tokenizer.h tok_encode_untrusted): the gateway marks every byte of a chat
 * prompt a client wrote, so no client text can become a control token. Any extension data
 * (grammar, audio) follows the table. Without the key the whole prompt is trusted (raw prompts).
 *
 * INVARIANTS
 *  - Every malformed frame becomes exactly one WIRE_ERROR frame (id "0" when the id itself is
 *    unusable) and the stream stays in sync: a header longer than WIRE_HEADER_MAX is drained to
 *    its newline; a frame whose header is bad but whose payload sizes parse has that payload
 *    consumed too. Sizes beyond the limits are never waited for (a lying size must not make the
 *    engine swallow the rest of the session), so such a frame counts as header-only.
 *  - Blank lines and unknown command words are WIRE_IGNORED, never errors (forward compatibility).
 *  - Payload pointers in a frame stay valid until the next wire_reader_* call.
 */
#ifndef CAIRN_WIRE_H
#define CAIRN_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "../core/sbuf.h"
#include "../core/tokenizer.h"

enum {
    WIRE_HEADER_MAX = 4096,       /* bytes in a header line, "\n" excluded */
    WIRE_FIELDS_MAX = 10,         /* positional fields, the command word included */
    WIRE_ID_MAX = 64,             /* an id is shorter than this */
    WIRE_EXT_MAX = 256,           /* joined key=value extension string is shorter than this (upstream:
                                   * 128; cairn's sampling, span and grammar keys need more) */
    WIRE_LOGPROBS_MAX = 32,
    WIRE_PROMPT_MAX = 16 << 20,   /* prompt payload bytes */
    WIRE_EXT_BYTES_MAX = 1 << 20, /* extension payload bytes (grammar, audio) */
    WIRE_IMAGE_MAX = 64 << 20,    /* IMAGE payload bytes */
    WIRE_RECORD_MAX = 32 << 20,   /* RECORD payload bytes: a prompt and its reply */
    WIRE_BIAS_MAX = 1 << 16,      /* BIAS payload bytes */
    WIRE_BIAS_ENTRIES = 4096      /* id:bias pairs in one BIAS frame */
};

typedef enum {
    WIRE_NONE, WIRE_IGNORED, WIRE_SUBMIT, WIRE_STOP, WIRE_CANCEL, WIRE_IMAGE, WIRE_BIAS, WIRE_SLOT, WIRE_ERROR
} wire_kind;

typedef enum { WIRE_SLOT_SAVE, WIRE_SLOT_RESTORE, WIRE_SLOT_ERASE } wire_slot_action;

/* A request's logit bias: n (token id, bias) pairs, n <= WIRE_BIAS_ENTRIES. */
typedef struct {
    int n;
    int *ids;
    float *vals;
} wire_bias;
enum { WIRE_SLOT_NAME_MAX = 64 };

typedef struct {
    int slot;
    int max_tokens;
    float temperature, top_p;
    int prefix_bytes;             /* 8th field; -1 when absent */
    int logprobs;                 /* logprobs=k, 0 when absent */
    int ids;                      /* ids=1: payload is decimal token ids */
    int pin;                      /* pin=1 (accepted, no effect here) */
    int tokids;                   /* tokids=1: every sampled token gets its own DATA frame with tok=<id> */
    uint64_t seed;                /* seed=N; without the key the engine uses 0 */
    int has_seed;                 /* the key was given (seed=0 is a seed like any other) */
    int top_k;                    /* top_k=N, 0 = off */
    float min_p;                  /* min_p=F, 0 = off */
    float repetition;             /* rep=F (> 0), 0 = off */
    float presence, frequency;    /* pres=F, freq=F, 0 = off */
    size_t untrusted_bytes;       /* untrusted=B: span table bytes at the start of ext, 0 = none */
    size_t grammar_bytes;         /* grammar=B: grammar bytes right after the span table; the rest of ext is
                                   * media (DMel audio). Without the key the rest is all grammar, or all
                                   * media for a family that takes media (protocol.md field 7). */
    int has_grammar_bytes;
    int think_budget;             /* think_budget=N: reasoning tokens the reply may take, 0 = no budget */
} wire_submit;

typedef struct {
    wire_kind kind;
    char id[WIRE_ID_MAX];         /* "0" when unknown */
    wire_submit sub;              /* SUBMIT */
    const char *payload;          /* SUBMIT prompt / IMAGE bytes */
    size_t payload_len;
    const char *ext;              /* SUBMIT extension payload */
    size_t ext_len;
    wire_slot_action action;      /* SLOT */
    int slot;                     /* SLOT */
    const char *code;             /* WIRE_ERROR: protocol error code, e.g. "BAD_REQUEST" */
    char detail[160];             /* WIRE_ERROR: what was wrong */
} wire_frame;

typedef struct {
    char *buf;
    size_t len, cap, start;       /* unread bytes are buf[start..len) */
    int draining;                 /* inside an over-long header: drop bytes up to its "\n" */
} wire_reader;

void wire_reader_init(wire_reader *r);
void wire_reader_free(wire_reader *r);
void wire_reader_push(wire_reader *r, const char *data, size_t n);
/* 1 and *f filled when a frame is complete, 0 when more bytes are needed. */
int wire_reader_next(wire_reader *r, wire_frame *f);
/* At end of input: 1 and a BAD_FRAME error if a frame was cut short, else 0. Clears the buffer. */
int wire_reader_eof(wire_reader *r, wire_frame *f);

/* 1 if name (n bytes) is a valid SLOT name. */
int wire_slot_name_ok(const char *name, size_t n);
/* "SLOT id action slot n\n" for a name of n bytes (the caller writes it and the closing "\n"). */
size_t wire_fmt_slot(char *out, const char *id, wire_slot_action action, int slot, size_t n);

/* A BIAS payload -> up to WIRE_BIAS_ENTRIES (id, bias) pairs (ids below vocab, finite biases).
 * Returns the count, or -1 with what was wrong in detail[160]. */
int wire_parse_bias(const char *p, size_t n, int vocab, int *ids, float *bias, char *detail);
/* The span table of a SUBMIT (the first sub.untrusted_bytes of ext) checked against its prompt:
 * 0 and a heap array (NULL when empty), or -1 with err naming what is wrong. */
int wire_parse_spans(const char *table, size_t n, size_t prompt_len, tok_span **spans, int *nspans, char *err,
                     size_t errlen);
/* Appends the span table for spans (what wire_parse_spans reads back). */
void wire_fmt_spans(sbuf *out, const tok_span *spans, int n);

/* Frame formatting. Each returns the bytes written (the buffer must hold WIRE_HEADER_MAX). */
extern const char WIRE_READY[];   /* "\x01\x01READY\x01\x01\n" */
/* SUBMIT header (the caller writes prompt_len prompt bytes, ext_len extension bytes, "\n"). The
 * shortest form the grammar allows: 6 fields; ext_bytes when anything follows; prefix_bytes when
 * >= 0; then the keys that are set (logprobs, ids, pin, tokids, seed when has_seed, top_k,
 * min_p, rep, pres, freq, untrusted, grammar, think_budget). */
size_t wire_fmt_submit(char *out, const char *id, const wire_submit *s, size_t prompt_len, size_t ext_len);
/* The whole BIAS frame for id (header, payload, "\n"), appended to out: what wire_parse_bias
 * reads back, each bias in the shortest form that parses to the same float. */
void wire_fmt_bias(sbuf *out, const char *id, const wire_bias *b);
/* "STOP id\n" or "CANCEL id\n" (kind WIRE_STOP / WIRE_CANCEL). */
size_t wire_fmt_control(char *out, wire_kind kind, const char *id);

/* What the engine can do, announced once after READY (a cairn CAPS line). */
typedef struct {
    int vision, slots, ctx, logprobs, ids;
    char family[WIRE_ID_MAX];     /* the model's family (its descriptor's name) */
    int truncate;                 /* the state rewinds to any prefix */
    int checkpoints;              /* a checkpoint store is configured */
    int grammar;                  /* SUBMIT may carry a grammar in its extension payload */
    char numerics[16];            /* "exact" or "qat" (--numerics) */
    int draft;                    /* MTP speculative decoding: drafts per step (0 = off) */
} wire_caps;
size_t wire_fmt_caps(char *out, const wire_caps *c);
/* "STAT 0 0.0 0.0 <rss_gb> 0 0": the idle statistics line after READY (protocol.md §1.2). */
size_t wire_fmt_idle_stat(char *out, double rss_gb);

/* DONE's statistics, in field order. */
typedef struct {
    int completion;               /* -1 when the engine sent no usable count */
    double tok_s, hit_pct, rss_gb;
    int prompt_tokens;            /* -1 when absent */
    int length_limited;
    int reused;                   /* first suffix field: prompt tokens reused; 0 when absent */
    long prefill_us;              /* second suffix field: microseconds the engine spent prefilling this
                                   * request's new tokens (prompt - reused); 0 when absent */
} wire_done;
size_t wire_fmt_done(char *out, const char *id, const wire_done *d);
/* "ACCEPT id prompt_tokens reused": the reuse count is decided before the prefill, so the
 * gateway can report it from the first event on (the spec's ACCEPT has two fields; readers
 * ignore the third). */
size_t wire_fmt_accept(char *out, const char *id, int prompt_tokens, int reused);
/* DATA header for n payload bytes; with logprobs k > 0, the chosen token's logprob and k
 * (id, logprob) pairs follow; tok >= 0 (only for a tokids=1 request) appends " tok=<id>", the
 * sampled token whose bytes these are (bytes a decoder held back from an earlier token may lead
 * them). The caller writes the payload and the closing "\n". */
size_t wire_fmt_data(char *out, const char *id, size_t n, int k, float lp, const int *top_ids, const float *top_lps,
                     int tok);
/* "ERROR id CODE[ detail]\n"; CR/LF in detail become spaces. */
size_t wire_fmt_error(char *out, const char *id, const char *code, const char *detail);
/* "RECORD slot n\n" (a cairn extension, sent before READY): the caller writes the n bytes of
 * what the slot's resumed state holds, as text (its record's ids decoded), and "\n". The
 * gateway's router matches prompts against that text (slots.h), so a restarted engine's resumed
 * slots are found again instead of looking empty. */
size_t wire_fmt_record(char *out, int slot, size_t n);

/* ---- engine output, as the gateway reads it ------------------------------------------------ */

typedef enum {
    WIRE_OUT_OTHER,               /* STAT, telemetry, unknown kinds: ignored (forward compatibility) */
    WIRE_OUT_ACCEPT, WIRE_OUT_DATA, WIRE_OUT_DONE, WIRE_OUT_ERROR, WIRE_OUT_CAPS, WIRE_OUT_RECORD
} wire_out_kind;

typedef struct {
    wire_out_kind kind;
    char id[WIRE_ID_MAX];         /* "" when the frame has none */
    long payload;                 /* bytes + "\n" that follow the header (DATA, ECHO, TOOL, RECORD), else -1 */
    int slot;                     /* RECORD */
    int prompt_tokens;            /* ACCEPT; -1 when unusable */
    int reused;                   /* ACCEPT's third field; -1 when absent */
    int tok;                      /* DATA tok=<id>; -1 when absent */
    int has_lp;                   /* DATA with logprobs: lp, k and the (unsorted) table */
    float lp;
    int k;
    int top_ids[WIRE_LOGPROBS_MAX];
    float top_lps[WIRE_LOGPROBS_MAX];
    wire_done done;
    char error[256];              /* ERROR: the code and detail after the id */
    wire_caps caps;
} wire_out;

/* One engine header line (without its "\n"). 0 and *o filled, or -1 for a malformed frame of a
 * known kind (a payload frame with a bad length, a DONE without STAT and 4 numbers): the stream
 * can no longer be trusted. nan/inf logprobs are accepted, as the protocol allows. */
int wire_parse_out(const char *line, size_t n, wire_out *o);

#endif
