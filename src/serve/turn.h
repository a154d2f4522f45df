/* turn.h — one generation as the HTTP side sees it: get a slot, SUBMIT to the engine, follow
 * its frames into a reply, and end it (normally, by STOP on a stop string, or by CANCEL when
 * the client left). The API modules (openai.c, anthropic.c) build a turn_req from a request
 * body and turn the finished or growing turn into their JSON.
 *
 * INVARIANTS
 *  - The slot is released by the engine link's on_finish, i.e. only after the engine answered
 *    DONE or ERROR for this request (or died); the slot then records the prompt + generated
 *    text so the next turn of the conversation is routed back to it.
 *  - cached tokens reported anywhere = the engine's reuse count from DONE, nothing else.
 *  - A chat turn that finished normally leaves its reply's exact ids in sc->replies (when on),
 *    cut to the text the client saw.
 *  - turn_end() on an unfinished turn sends CANCEL exactly once and never blocks the caller.
 */
#ifndef CAIRN_TURN_H
#define CAIRN_TURN_H

#include <cjson/cJSON.h>

#include "../core/tokenizer.h"
#include "../models/chat.h"
#include "engine_proc.h"
#include "http.h"
#include "metrics.h"
#include "replies.h"
#include "reply.h"
#include "slots.h"

/* What every request handler shares. */
typedef struct {
    eng *engine;
    slots *sl;
    metrics *mx;
    int nslots;
    const char *model_id;
    const char *const *aliases;   /* --alias: more names clients may use for the model */
    int naliases;
    const char *model_dir;
    const char *family;           /* the model's family name (its descriptor, models/model.h) */
    const chat_template *tpl;     /* NULL: the family has no chat template (completions only) */
    tokenizer *tok;               /* to spell logprob alternatives; NULL = "<token_id:N>" */
    replies *replies;             /* exact ids of generated replies (--reply-ids on), or NULL */
    struct responses *responses;  /* stored /v1/responses (responses.h) */
    char **specials;              /* the text of every added token (never shown as chat content) */
    int nspecials;
    int max_tokens;               /* server cap on generated tokens per request */
    double queue_timeout;         /* seconds a request may wait for a slot */
    double keepalive;             /* seconds of silence before an SSE keep-alive */
} serve_ctx;

#define TURN_MAX_STOPS 4

/* A request, reduced to what the engine and the reply shaping need. */
typedef struct {
    char *prompt;                 /* rendered prompt text, or decimal ids with prompt_is_ids */
    size_t prompt_len;
    tok_span *untrusted;          /* chat prompts: the bytes a client wrote (chat.h), sent to the */
    int nuntrusted;               /* engine as the SUBMIT span table (wire.h) */
    char *media;                  /* media for the template's placeholders (Inkling DMel frames), */
    size_t media_len;             /* sent after the span table in the extension payload */
    int prompt_is_ids;
    size_t prefix_bytes;          /* end of the system prompt (checkpoint hint), 0 = none */
    char *ids;                    /* the prompt as ids with remembered replies spliced in (sent */
    size_t ids_len, ids_prefix;   /* instead of the text; prompt still routes), NULL = none */
    int max_tokens;
    double temperature, top_p;
    unsigned long long seed;      /* the request's, or drawn at random when it has none */
    int top_k;                    /* 0 = off */
    double min_p, repetition;     /* 0 = off */
    double presence, frequency;   /* 0 = off */
    wire_bias bias;               /* logit bias (owned arrays), n = 0 = none */
    int logprobs;                 /* 1 = report logprobs of the sampled tokens */
    int top_logprobs;             /* alternatives per token (0..32) */
    char *stops[TURN_MAX_STOPS];
    int nstops;
    int pinned_slot;              /* -1 = route by prefix */
    unsigned long long slot_owner; /* 0 = none, else the user the slot belongs to (slots.h OWNERS) */
    int chat;                     /* parse the reply with the chat template */
    int thinking;
    int think_budget;             /* reasoning tokens the reply may take (Anthropic budget_tokens), 0 = no cap */
    char *grammar;                /* GBNF the output must follow (constrain.h), NULL = none */
    size_t grammar_len;
} turn_req;

void turn_req_free(turn_req *rq);
/* A deep copy of src (for one more choice of the same request). */
void turn_req_copy(turn_req *dst, const turn_req *src);

typedef struct {
    serve_ctx *sc;
    turn_req *rq;
    gen *g;
    struct MHD_Connection *conn;  /* for noticing a client that left */
    reply out;
    int ntoks_seen;               /* DATA frames already fed into out */
    eng_token *toks;              /* with logprobs: a copy of those frames, offsets into raw, */
    int ntoks, toks_cap;          /* owned by the turn so a stream can read them without locks */
    int *ids;                     /* the sampled ids the frames named (tok=), for sc->replies */
    int nids, ids_cap;
    sbuf raw;
    double t0, t_first;
    int status;                   /* gen_status once finished, else -1 */
    int prompt_tokens, completion_tokens, reused, length_limited;
    double prefill_s, tok_s;      /* engine clocks from DONE: prefill time, decode speed */
    char error[256];
} turn;

/* Admit and submit. 0 = the engine accepted it (ACCEPT or output seen): a stream may start.
 * Otherwise -1 and e says what to answer (429 queue full, 400 context exceeded, ...). */
int turn_begin(turn *t, serve_ctx *sc, turn_req *rq, struct MHD_Connection *conn, double t0, http_err *e);

enum { TURN_IDLE = 0, TURN_PROGRESS = 1, TURN_DONE = 2, TURN_GONE = -1 };
/* Wait up to `wait` seconds for more output. Feeds new DATA into t->out (sending STOP once a
 * stop string matched). TURN_DONE once the engine finished (t->status and counts set). */
int turn_wait(turn *t, double wait);
/* Block until the turn is finished (or the client left: TURN_GONE). */
int turn_run(turn *t);
/* turn_run for a reply answered at once: 0 when the engine finished it, else -1 and e (499 the
 * client left, or the engine's error). */
int turn_complete(turn *t, http_err *e);
/* Release the turn: CANCEL if unfinished, drop references. */
void turn_end(turn *t);

/* The prompt of rq as text the way the engine will hold it (heap; *len its length): a prompt sent
 * as ids (spliced replies, or token ids given) is their decode with invalid UTF-8 as U+FFFD —
 * what the engine's RECORD of a resumed slot and a client's copy of a reply look like — and a
 * rendered prompt is itself. Routing compares slot records with this text: a spliced reply's
 * rendered text (a content marker the template adds, U+FFFD where the ids hold raw bytes) is
 * not the decode of the ids that stand for it. Without a tokenizer the payload itself. */
char *turn_prompt_text(const serve_ctx *sc, const turn_req *rq, size_t *len);

/* Tokens the prompt of rq has as it would be sent (spliced ids, or the text tokenized), without
 * running it; -1 + e when it cannot be counted. */
long turn_count_tokens(const serve_ctx *sc, const turn_req *rq, http_err *e);

/* The error a finished-with-ERROR turn maps to. */
void turn_error(const turn *t, http_err *e);

/* The reply split by the chat template (reasoning / content / tool calls) over out.text[0..stable),
 * with no special token's text left in reasoning or content. Without a template (a completion)
 * everything is content, as generated. */
void turn_parse(const turn *t, chat_reply *cr);

/* OpenAI-style finish reason: "length" when the token budget cut the reply (even one holding
 * tool calls: the last may be unfinished, chat_reply.cut_call), else "tool_calls" (has_tool_calls)
 * or "stop". */
const char *turn_finish_reason(const turn *t, int has_tool_calls);

/* The text of one token id for logprob tables (heap, valid UTF-8). */
char *turn_token_text(const turn *t, int id);

/* What the per-request log line and /metrics need to know about a request. Shared between the
 * handler and a stream that outlives it, hence reference counted. */
typedef struct {
    int refs;
    double t0;
    int status;                   /* HTTP status sent */
    int prompt_tokens, cached_tokens, completion_tokens, slot;
    double tok_s;                 /* engine-reported decode speed */
} req_info;

req_info *req_info_new(double t0);
void req_info_ref(req_info *ri);
void req_info_unref(req_info *ri);
void turn_summarize(const turn *t, req_info *ri);

/* Random hex id like "chatcmpl-<24 hex>". */
void turn_make_id(char *out, size_t cap, const char *prefix);

#endif
