/* model.h — the boundary between generic code (CLI, engine loop, reuse, gateway) and one model
 * family, and the one registry of families.
 *
 * A FAMILY IS ONE DESCRIPTOR. Each family file exports one `family_ops` (like redis' ae backends)
 * and registers it with one line in families.c; every other module — engine, gateway, `cairn
 * run`, the benches, the tests (through `cairn families`) — learns what it needs from that
 * descriptor and never names a family. Deleting the line removes the family everywhere.
 *
 * WHAT A NEW FAMILY PROVIDES (Kimi K3, Inkling, ...):
 *   name         canonical name (tools/make_tiny.py NAME, tests/, `cairn families`); aliases[]
 *                further names it answers to; model_types[] the config.json model_type values
 *                it loads (official spelling, e.g. "glm_moe_dsa"). All NULL-terminated, and no
 *                two families may share a name, alias or model_type.
 *   chat         its chat template (chat.h: render, parse, system-prompt rule), or NULL when the
 *                family has none (then only completions / token ids work).
 *   turns        the token strings of its chat format, resolved against tokenizer.json at load:
 *                start[] what every rendered conversation begins with, user / assistant the
 *                markers that open those turns, boundaries[] every other turn-boundary token
 *                (system, tool, observation). Reuse checkpoints at every boundary; tests build
 *                synthetic conversations from start / user / assistant.
 *   truncates    1 when the state is rows only (every part PART_ROWS, span 1): it rewinds to any
 *                prefix, so reuse never needs turn-boundary checkpoints. seq_new checks the
 *                declared value against the parts actually declared; CAPS reports it.
 *   load .. extra_flops   the math, below.
 * A family file knows tensors and math; it knows nothing about requests, records or reuse:
 *   load     — read config.json (typed, errors name the key: core/config.h) and walk the
 *              family's tensor table (core/tensor_table.h) through m->weights: one list of rows
 *              (name, kind, shape from the config, multiplicity, role) looks up and validates
 *              every tensor, fills the family's structs, and is the record the weight bytes per
 *              token and the matrix FLOPs are counted from (model_decode_bytes,
 *              model_token_flops). model_open registers every routed expert (TT_ROUTED rows) with
 *              core/experts.h and binds the family's `expert` function; a MoE layer runs its
 *              chosen experts through experts_run (m->experts), so the expert cache
 *              (--expert-cache-mb) and expert parallelism over MPI serve every family.
 *   seq_new  — declare the parts of one sequence state (state_add_part) for `ctx` positions and
 *              return the family's per-sequence handle (pointers into those parts + scratch).
 *   scratch_bytes — the most scratch a forward call can take at `ctx` positions (any n: a family
 *              that bounds its scratch by a chunk loops over chunks inside forward). seq_new and
 *              forward take every buffer from the arena handed over, never malloc per call.
 *   forward  — one call over one or more segments (fwd_seg), each feeding ids at absolute
 *              positions pos0..pos0+n-1 of its own sequence, extending that state (seq_feed /
 *              seq_feed_step have checked n >= 1, the positions against ctx and every id against
 *              the vocabulary, and check the logits they asked for are finite: a family is its
 *              math). Each segment's result must be bit-identical to feeding it alone, however a
 *              prompt is split into forward calls (chunking invariance) and whatever other
 *              segments share the call: that lets the engine decode several conversations in
 *              one call, reading the weights once for all of them. Writes the logits of a
 *              segment's LAST token when its logits != NULL, and of every token into
 *              all_logits[n][vocab] when that is non-NULL. A family implements this once: its
 *              passes take rows from several sequences (token-parallel work over all rows,
 *              stateful work per row in its own sequence, the first segment's scratch), so one
 *              sequence is simply the one-segment case.
 *   set_media — (optional) non-text input for the following feeds: bytes the family consumes at
 *              the positions of its placeholder id `model.media_token` (Inkling: DMel frames at
 *              audio placeholders). Validates them, returns how many placeholders they fill;
 *              NULL bytes clears. Ids cannot describe such input, so seq_feed taints the state
 *              after any chunk in which placeholders met attached media.
 *   capture  — a family with RING or RECUR parts calls state_capture(st, part, pos) immediately
 *              before the first write position pos makes to each such part (and after every
 *              write of earlier positions, batched phases included). That lets reuse take light
 *              checkpoints inside a call instead of splitting it. Rows-only families need no hook.
 * Then: a generator tools/tiny_NAME.py (make(outdir, size, seed)), an independent float64
 * reference in tools/ref/, and the family is covered by tests/test_family_contract.py and every
 * family-parametrized test by registering alone.
 *
 * The generic layer (model.c) owns the sequence record: seq_feed() calls forward chunk by chunk
 * and records each chunk as it enters the state, tainting the state on any failure. Nothing else
 * may call ops->forward.
 */
#ifndef CAIRN_MODEL_H
#define CAIRN_MODEL_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/arena.h"
#include "../core/experts.h"
#include "../core/safetensors.h"
#include "../core/tensor_table.h"
#include "../core/tokenizer.h"
#include "../state/reuse.h"
#include "../state/state.h"
#include "chat.h"

typedef enum {
    NUMERICS_QAT,     /* default: BF16 activations, activation/KV QDQ exactly as the checkpoint was trained */
    NUMERICS_EXACT    /* same dequantized weights, f32 activations, no BF16 rounding, no activation/KV QDQ */
} numerics;

typedef struct model model;

/* One sequence's share of a forward call. Segments of a call name distinct sequences. */
typedef struct {
    void *fam_seq;             /* the family's handle (seq_new) */
    const int *ids;
    int pos0, n;               /* n >= 1 ids at positions pos0..pos0+n-1 */
    float *logits;             /* [vocab] logits of the last id, or NULL */
    float *all_logits;         /* [n][vocab] logits of every id, or NULL */
} fwd_seg;

/* A forward call's rows in passes of at most cap: fills the next pass (row t is token tok[t] of
 * segment seg[t]) from the cursor — token *j of segment *gi, both 0 at the start — and advances it.
 * Returns the pass's row count, 0 once every row is taken. */
int fwd_next_pass(const fwd_seg *segs, int nseg, int *gi, int *j, int cap, const fwd_seg **seg, int *tok);

#define FAMILY_MAX_TOKENS 8      /* entries of family_turns.start / .boundaries, NULL-terminated */

/* The turn structure of a family's chat format, as token strings (see the top comment). */
typedef struct {
    const char *start[FAMILY_MAX_TOKENS];
    const char *user, *assistant;
    const char *boundaries[FAMILY_MAX_TOKENS];
} family_turns;

typedef struct {
    const char *name;
    const char *const *aliases;                   /* NULL-terminated, or NULL */
    const char *const *model_types;               /* NULL-terminated, at least one */
    const chat_template *chat;                    /* NULL: no chat template */
    family_turns turns;
    int truncates;                                /* state rewinds to any prefix (rows only) */
    int (*load)(model *m, char *err, size_t errlen);
    void (*free)(model *m);
    /* Scratch bytes any forward call on a sequence of ctx positions can take (arena.h); the
     * model layer allocates them once per sequence and hands them to seq_new. NULL: none. */
    size_t (*scratch_bytes)(const model *m, int ctx);
    void *(*seq_new)(model *m, state *st, int ctx, arena *scratch, char *err, size_t errlen);
    void (*seq_free)(model *m, void *fam_seq);
    int (*forward)(model *m, const fwd_seg *segs, int nseg, char *err, size_t errlen);
    int (*set_media)(model *m, void *fam_seq, const unsigned char *bytes, size_t len, char *err, size_t errlen);
    /* (optional) Speculative decoding with the checkpoint's MTP layer (model.draft_layers > 0),
     * on a sequence made while model.spec_mtp was set (forward then keeps the MTP rows). The
     * record holds positions 0..pos-1 and `id` is the token chosen for pos (not fed). Step 0
     * drafts position pos + 1 from the main model's state and id; step j > 0 continues from step
     * j - 1's output with id = the token drafted at pos + j. Writes the draft logits [vocab] and
     * only state rows at or beyond the record's end (garbage to every later feed), so drafting
     * never changes what the sequence is. */
    int (*draft)(model *m, void *fam_seq, int pos, int id, int step, float *logits, char *err, size_t errlen);
    /* FLOPs of one token at position pos that no weight matrix of the table accounts for
     * (attention over the context, recurrences, convolutions); model_token_flops adds the
     * table's matrix FLOPs. */
    double (*extra_flops)(const model *m, int pos);
    /* One routed expert over its gathered rows, and the scratch it takes (core/experts.h
     * expert_fn / expert_scratch_fn; ctx is the model). model_open binds them to m->experts, so
     * the expert cache and the ranks of an MPI run (core/cluster.h) run the same function. NULL
     * only for a family without routed experts. */
    expert_fn expert;
    expert_scratch_fn expert_scratch;
} family_ops;

/* Role-marker token ids of a loaded model (family_turns resolved against its tokenizer; -1 or
 * absent where the tokenizer lacks the token). */
typedef struct {
    int start[FAMILY_MAX_TOKENS], n_start;
    int user, assistant;
    int all[2 + FAMILY_MAX_TOKENS], n_all;        /* user, assistant and every boundary found */
} model_markers;

struct model {
    const family_ops *ops;
    char *dir;
    st_file *st;
    experts *experts;          /* every routed expert (core/experts.h): model_open registers the table's
                                * TT_ROUTED rows; a MoE layer runs its experts through experts_run */
    cJSON *config;
    tokenizer *tok;
    numerics num;
    int vocab_size;            /* logits width */
    int pass_rows;             /* rows one internal pass of forward takes at most, set by load: the dense
                                * weights stream once per pass, so a call of up to this many rows (from
                                * any segments) reads them once (seq_join_rows) */
    int bos_id;                /* -1 if none */
    int eos_ids[8];            /* stop ids from config (+ tokenizer) */
    int n_eos;
    int max_ctx;               /* max_position_embeddings */
    int media_token;           /* placeholder id consuming set_media input, -1 if the family takes none */
    uint64_t fingerprint;      /* st_fingerprint: identifies the checkpoint for persisted state */
    tt_table weights;          /* the family's tensor table as loaded: the record, bytes, FLOPs */
    int n_validated;           /* tensors the family's load looked up and checked (dtype + shape) */
    size_t locked_bytes;       /* model_mlock */
    model_markers markers;     /* all -1 / empty without a usable tokenizer */
    int draft_layers;          /* MTP layers the family can draft with (0: no speculative decoding) */
    int spec_mtp;              /* set by the caller before seq_new: sequences keep MTP rows (draft) */
    void *priv;                /* family data */
};

/* Open DIR: config.json model_type picks the family; tokenizer.json is loaded if present. */
model *model_open(const char *dir, numerics num, int progress, char *err, size_t errlen);
void model_close(model *m);
/* Read routed experts through the expert cache with a budget of mb MiB (fractions allowed) (core/experts.h) instead of
 * the mapping; usage_dir (NULL: none) keeps the usage counts that pick the pinned experts
 * (`expert_usage.bin`, the engine's --kv-dir). Before the first forward. -1 with err. */
int model_expert_cache(model *m, double mb, const char *usage_dir, char *err, size_t errlen);
/* --mlock: lock the checkpoint pages of every dense, shared and lookup tensor of the table in
 * memory (routed experts are the expert cache's business), so the page cache never evicts what
 * every token reads. Refused — nothing locked, a message in msg naming the bytes against the
 * limit — when they exceed RLIMIT_MEMLOCK (without CAP_IPC_LOCK) or half the memory available.
 * Returns the bytes locked (0 when refused); m->locked_bytes keeps it; munmap unlocks. */
size_t model_mlock(model *m, char *msg, size_t msglen);
int model_is_eos(const model *m, int id);
/* For a family's load, before it sizes anything by the layer count: every layer holds at least one
 * tensor, so a config.json num_hidden_layers above the checkpoint's tensor count is refused by name
 * (a fuzzed 10E6 layers asked calloc for 7.7 GB). 0, or -1 with err. */
int model_check_layers(const model *m, int n_layers, char *err, size_t errlen);
/* Weight bytes a decode step reads (dense + active experts), for bandwidth reports, and the
 * FLOPs of one token at position pos (for prefill GFLOP/s): the tensor table's count, plus the
 * family's extra_flops. */
size_t model_decode_bytes(const model *m);
double model_token_flops(const model *m, int pos);

/* One conversation timeline: the generic state (parts + record) and the family's handle. */
typedef struct {
    model *m;
    state st;
    void *fam;
    arena scratch;             /* the forward pass's scratch, sized once (family_ops.scratch_bytes) */
    int chunk;                 /* prefill chunk size (tokens per forward call) */
    int media;                 /* media attached (seq_set_media) */
} seq;

seq *seq_new(model *m, int ctx, char *err, size_t errlen);
void seq_free(seq *s);
/* Feed ids at positions st.len.. (the record's end), in chunks, recording each chunk as it enters
 * the state. logits: last token's logits (vocab floats) or NULL. On failure the state is tainted
 * and -1 returned with err. */
int seq_feed(seq *s, const int *ids, int n, float *logits, char *err, size_t errlen);
/* Attach media for the following feeds (bytes NULL detaches). Returns the number of placeholder
 * positions it fills, or -1 with err (bad media, or a family that takes none). */
int seq_set_media(seq *s, const unsigned char *bytes, size_t len, char *err, size_t errlen);
/* seq_feed that writes every fed token's logits into all_logits[n][vocab] (echo / scoring). */
int seq_feed_all(seq *s, const int *ids, int n, float *all_logits, char *err, size_t errlen);
/* One decode step of k distinct sequences of one model (one context size) in a single forward
 * call: ids[i] enters seqs[i] (and its record), logits[i] gets its next-token logits. Each
 * sequence ends exactly as seq_feed(seqs[i], &ids[i], 1, ...) would leave it. A refused step
 * (bad id, full context, repeated sequence) changes nothing; a failed forward or a non-finite
 * logit taints every sequence of the call. */
int seq_feed_step(seq **seqs, const int *ids, int k, float **logits, char *err, size_t errlen);
/* SPECULATIVE DECODING with the family's MTP layer (m->spec_mtp set before seq_new, ops->draft;
 * a state that truncates, or whose RING/RECUR parts hook their captures: state_rewind). `next` is
 * the token chosen for position st.len (not fed yet). Drafts k tokens (fewer when the state could
 * not arm a capture for every one), one MTP step each (draft token = smp's choice from the draft
 * distribution q), feeds next and the k drafts in ONE forward call with every row's logits (p),
 * accepts the longest prefix the rule keeps and rewinds the rest out of the state and the record,
 * so rejected tokens never enter it and the state is what feeding the accepted ids alone would
 * have made.
 *   greedy (smp NULL or temperature <= 0): draft j is kept iff it is the argmax of p at its
 *     position, so the emitted tokens are bit-identical to plain greedy decoding;
 *   sampled: draft d is kept with probability min(1, p(d) / q(d)); the first rejection draws the
 *     next token from norm(max(0, p - q)); with every draft kept it comes from p of the last row.
 *     p and q are the sampler's filtered distributions (sampler_dist); deterministic per seed.
 * out[0..*n_out) gets the tokens that entered the record (next, then the kept drafts, k + 1 at
 * most); *pending the token chosen for the position after them (not fed); rows ([k + 1][vocab],
 * or NULL) the verify rows 0..n_out-1: row i is the distribution out[i + 1] (for the last row,
 * *pending) was chosen from; *accepted the drafts kept (n_out - 1). -1 with err
 * (state tainted when the failure came after it started changing). */
#define SPEC_MAX_DRAFT 8
/* One MTP draft step on s (ops->draft at pos = st.len): the draft logits of position st.len + 1 +
 * step, id being the token at st.len + step. Changes no row of the record. */
int seq_draft(seq *s, int id, int step, float *logits, char *err, size_t errlen);
struct sampler;   /* core/sampler.h */
int seq_spec_step(seq *s, int next, int k, struct sampler *smp, int *out, int *n_out, int *pending, float *rows,
                  int *accepted, char *err, size_t errlen);
/* Speculative steps of several sequences sharing ONE verify forward call (the batched decode step
 * of model.h's seq_feed_step, with k + 1 rows per sequence): each job drafts its own tokens, then
 * one call verifies every job's next + drafts, then each job accepts as seq_spec_step does. By
 * chunking invariance every job's tokens, rows and state are bit-identical to its own
 * seq_spec_step. A job with k = 0 is a plain decode step: next is fed, rows[0] gets its logits
 * and pending is -1 (the caller chooses, e.g. through a grammar mask). A refused call (bad id,
 * full context, a sequence twice, a failed draft) changes no record; a failed forward taints
 * every sequence of the call. */
typedef struct {
    seq *s;
    int next;                  /* in: the token chosen for position st.len (not fed yet) */
    int k;                     /* in: drafts to take, 0..SPEC_MAX_DRAFT (fewer at the end of the context) */
    struct sampler *smp;       /* in: NULL or temperature <= 0: greedy */
    float *rows;               /* in: NULL or [k + 1][vocab], out: the verify rows 0..n_out-1 */
    int out[SPEC_MAX_DRAFT + 1], n_out, pending, accepted;   /* out, as seq_spec_step's */
    double draft_s, verify_s;  /* out: seconds this job spent drafting; the shared verify call took */
} spec_job;
/* A prefill chunk riding in that same call (the engine's joint step): ids[0..n), n >= 1, enter s
 * at st.len, leaving s exactly as seq_feed(s, ids, n, logits) would (chunking invariance);
 * logits (or NULL) gets the last id's. Its sequence is checked, recorded and tainted with the
 * jobs' (a refused call changes nothing; a failed forward taints every sequence of the call). */
typedef struct {
    seq *s;
    const int *ids;
    int n;
    float *logits;
} feed_job;
int seq_spec_steps(spec_job *jobs, int n, const feed_job *feeds, int nfeeds, char *err, size_t errlen);
/* THE JOINT-STEP BUDGET: how many prefill rows may join a step call whose decode jobs take
 * decode_rows rows (each job's k + 1). They fill the last internal pass the decode rows start
 * (m->pass_rows each), or one whole pass when the decode rows fill theirs exactly: so the call
 * streams the dense weights as often as the decode rows alone need (or once more, which is what
 * a separate prefill call would cost), and the step takes no longer than the pass-sized prefill
 * call that used to run before the decode call: joining saves the decode call's own pass over
 * the weights instead of adding work to it. A prefill always advances (never 0 rows), so no decode load
 * starves it. The same rule as a token budget per step (vLLM's chunked prefill, llama.cpp's
 * n_batch), with the budget set by the pass the step pays for anyway. */
int seq_join_rows(const model *m, int decode_rows);

/* ---- activation steps the families share (a row's result depends only on that row) ---- */
/* x rounded to BF16 where the numerics say so (NUMERICS_QAT), unchanged under NUMERICS_EXACT. */
void model_round(const model *m, float *x, size_t n);
/* y[k] = model_round(w[k] x) for count matrices that read the same n input rows, in one pool
 * job (qmat_mul_each), the rounding one pool index per row. */
void model_project_each(const model *m, int count, const qmat *const *w, const float *x, int n, float *const *y);
void model_project(const model *m, const qmat *w, const float *x, int n, float *y);
/* out[i] = model_round(rmsnorm(x[i]) * w) for n rows of dim, one pool index per row. */
void model_norm_rows(const model *m, float *out, const float *x, const float *w, int n, int dim, float eps);

/* seq_feed behind the reuse layer's feed callback (state/reuse.h), so state/ never calls up. */
reuse_feeder seq_feeder(seq *s);
/* A whole prompt the way one-slot callers (cairn run --chat, bench reuse) take it: the reuse
 * decision on this sequence as slot 0 (cs may be NULL), then the checkpointing prefill to the
 * end, logits = the last prompt token's. *rr gets the decision. -1 with err on failure (tainted). */
int seq_prompt(seq *s, store *cs, const int *ids, int n, int sys_end, float *logits, reuse_result *rr, char *err,
               size_t errlen);

/* The registry (families.c). family_find matches a name or alias, family_for_model_type a
 * config.json model_type; both NULL when no family answers. family_at(i) for i in
 * [0, family_count()) lists them in registration order. */
int family_count(void);
const family_ops *family_at(int i);
const family_ops *family_find(const char *name);
const family_ops *family_for_model_type(const char *model_type);
/* The family of model directory DIR from its config.json alone (no weights are opened). */
const family_ops *family_of_dir(const char *dir, char *err, size_t errlen);

#endif
