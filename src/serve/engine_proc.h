/* engine_proc.h — the gateway's side of the engine line protocol (protocol.md §1): one child
 * `cairn engine` process, a dispatcher thread that reads its stdout and routes frames to
 * in-flight generations by id, and frame writes to its stdin under one lock.
 *
 * INVARIANTS
 *  - The server talks to the engine only through the pipes, so an engine crash never takes the
 *    server down: on EOF every in-flight generation fails with a clean error, the child is
 *    reaped and a new one is started (with back-off if it keeps dying). Only an engine that
 *    never once became ready (a model that does not load) is not restarted.
 *  - Every generation handed to eng_submit() reaches exactly one terminal state (DONE, ERROR or
 *    "engine exited"), and the on_finish callback runs exactly once for it, from the dispatcher,
 *    AFTER the engine has acknowledged (or died). Whoever owns the slot releases it there, so a
 *    slot is never reused while the engine may still be writing into it.
 *  - The child ignores SIGINT and SIGTERM (a terminal's Ctrl-C and systemd signal the whole
 *    group): only the gateway ends it, by closing its stdin after the replies in flight are done.
 *  - Frames are read as the spec says: a DONE with >= 7 fields (missing trailing fields = 0),
 *    unknown frame kinds ignored, CAPS before STAT accepted, payload frames always consumed.
 */
#ifndef CAIRN_ENGINE_PROC_H
#define CAIRN_ENGINE_PROC_H

#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>

#include "wire.h"

#define ENG_TOPK_MAX 32

/* One generated token as a DATA frame delivers it. */
typedef struct {
    size_t off, len;              /* its bytes in gen.data */
    int tok;                      /* the sampled token id (tok= field), -1 when the frame has none */
    int has_lp;                   /* the frame carried logprobs */
    float lp;                     /* logprob of the sampled token */
    int k;
    int top_ids[ENG_TOPK_MAX];
    float top_lps[ENG_TOPK_MAX];
} eng_token;

typedef enum { GEN_RUNNING, GEN_DONE, GEN_ERROR } gen_status;

typedef struct gen gen;
typedef void (*gen_finish_fn)(gen *g, void *user);

struct gen {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    char id[24];
    int slot;
    int accepted, prompt_tokens;  /* from ACCEPT (or DONE when an engine sends none) */
    char *data;                   /* raw DATA bytes so far (may hold partial UTF-8) */
    size_t data_len, data_cap;
    eng_token *toks;
    int ntoks, toks_cap;
    gen_status status;
    int finished;                 /* status is final AND on_finish has run */
    /* DONE fields (reuse already from ACCEPT when the engine sends it there) */
    int completion_tokens, length_limited, reuse;
    double tok_s;
    double prefill_s;             /* engine time prefilling prompt_tokens - reuse tokens; 0 = not sent */
    char error[256];              /* ERROR text (e.g. "CONTEXT_EXCEEDED 300 128"), or why it failed */
    int cancel_sent, stop_sent;
    gen_finish_fn on_finish;
    void *user;
};

gen *gen_new(gen_finish_fn on_finish, void *user);
void gen_ref(gen *g);
void gen_unref(gen *g);

typedef struct eng eng;

typedef struct {
    const char *exe;              /* binary to run (normally /proc/self/exe) */
    char **argv;                  /* its argv, NULL-terminated (argv[0] included) */
    double ready_timeout;         /* seconds to wait for READY at each start */
    void (*on_restart)(void *user); /* called from the dispatcher after the engine died (state lost) */
    void (*on_start_failed)(void *user); /* the first start never reached READY: nothing is retried */
    /* before READY, for each slot the engine resumed (wire.h RECORD): its state as text */
    void (*on_record)(void *user, int slot, const char *text, size_t n);
    /* the engine announced its capabilities (CAPS), at each start. Called on the dispatcher thread,
     * possibly before eng_start has returned: use `caps`, not the eng handle. */
    void (*on_caps)(void *user, const wire_caps *caps);
    void *user;
} eng_config;

/* Start the child and the dispatcher thread. Returns NULL + err if it cannot even fork. The engine
 * may still be loading when this returns; eng_ready() tells. */
eng *eng_start(const eng_config *cfg, char *err, size_t errlen);
/* Graceful stop: close stdin (the engine finishes in-flight work), wait up to `grace` seconds,
 * then SIGKILL. Frees everything. */
void eng_stop(eng *e, double grace);

int eng_ready(eng *e);
/* The engine's last CAPS line: 0 and *out, or -1 before the engine announced one. */
int eng_caps(eng *e, wire_caps *out);
int eng_restarts(eng *e);
int eng_start_failed(eng *e);
pid_t eng_pid(eng *e);

/* Send SUBMIT for g (id is assigned here) with the fields and keys of s (wire.h
 * wire_fmt_submit): n prompt bytes, then ext_n extension bytes; bias (or NULL) goes first as a
 * BIAS frame for the same id. Waits up to wait_ready seconds for a running engine. On failure
 * returns -1 with err, and g is NOT registered (on_finish will not run). */
int eng_submit(eng *e, gen *g, const wire_submit *s, const wire_bias *bias, const char *payload, size_t n,
               const char *ext, size_t ext_n, double wait_ready, char *err, size_t errlen);
/* Send SLOT action for an idle slot (wire.h) as g: it ends DONE (completion_tokens = the
 * positions saved, restored or erased) or ERROR, like a generation. */
int eng_slot(eng *e, gen *g, int slot, wire_slot_action action, const char *name, double wait_ready, char *err,
             size_t errlen);
/* Send CANCEL / STOP for g once (no-op if already sent or finished). */
void eng_cancel(eng *e, gen *g);
void eng_stop_gen(eng *e, gen *g);

#endif
