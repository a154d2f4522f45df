/* model.h — the boundary between generic code (CLI, engine loop, reuse) and one model family.
 *
 * A family (deepseek_v4.c, glm.c, ...) exports one `family_ops` table, like redis' ae backends.
 * It knows tensors and math; it knows nothing about requests, records or reuse. Its whole
 * contract with the rest of cairn:
 *   load     — read config.json (typed, errors name the key) and look up/validate every tensor.
 *   seq_new  — declare the parts of one sequence state (state_add_part) for `ctx` positions and
 *              return the family's per-sequence handle (pointers into those parts + scratch).
 *   forward  — one call over one or more segments (fwd_seg), each feeding ids at absolute
 *              positions pos0..pos0+n-1 of its own sequence, extending that state. Each
 *              segment's result must be bit-identical to feeding it alone, however a prompt is
 *              split into forward calls (chunking invariance) and whatever other segments share
 *              the call: that is what lets the engine decode several conversations in one call,
 *              reading the weights once for all of them. Writes the logits of a segment's LAST
 *              token when its logits != NULL, and of every token into all_logits[n][vocab] when
 *              that is non-NULL. A family implements this once: its passes take rows from
 *              several sequences (token-parallel work over all rows, stateful work per row in its
 *              own sequence), so a single segment is simply the one-sequence case.
 *   capture  — a family with RING or RECUR parts calls state_capture(st, part, pos) immediately
 *              before the first write position pos makes to each such part (and after every
 *              write of earlier positions, batched phases included). That lets reuse take light
 *              checkpoints inside a call instead of splitting it. Rows-only families need no hook.
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

#include "../core/safetensors.h"
#include "../core/tokenizer.h"
#include "../state/state.h"

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

typedef struct {
    const char *model_type;                       /* config.json model_type this family handles */
    int (*load)(model *m, char *err, size_t errlen);
    void (*free)(model *m);
    void *(*seq_new)(model *m, state *st, int ctx, char *err, size_t errlen);
    void (*seq_free)(model *m, void *fam_seq);
    int (*forward)(model *m, const fwd_seg *segs, int nseg, char *err, size_t errlen);
    /* Weight bytes a decode step reads (dense + active experts), for bandwidth reports. */
    size_t (*decode_bytes)(const model *m);
    /* FLOPs of one token at position pos (for prefill GFLOP/s). */
    double (*token_flops)(const model *m, int pos);
} family_ops;

struct model {
    const family_ops *ops;
    char *dir;
    st_file *st;
    cJSON *config;
    tokenizer *tok;
    numerics num;
    int vocab_size;            /* logits width */
    int bos_id;                /* -1 if none */
    int eos_ids[8];            /* stop ids from config (+ tokenizer) */
    int n_eos;
    int max_ctx;               /* max_position_embeddings */
    uint64_t fingerprint;      /* st_fingerprint: identifies the checkpoint for persisted state */
    int n_validated;           /* tensors the family's load looked up and checked (dtype + shape) */
    void *priv;                /* family data */
};

/* Open DIR: config.json model_type picks the family; tokenizer.json is loaded if present. */
model *model_open(const char *dir, numerics num, int progress, char *err, size_t errlen);
void model_close(model *m);
int model_is_eos(const model *m, int id);

/* One conversation timeline: the generic state (parts + record) and the family's handle. */
typedef struct {
    model *m;
    state st;
    void *fam;
    int chunk;                 /* prefill chunk size (tokens per forward call) */
} seq;

seq *seq_new(model *m, int ctx, char *err, size_t errlen);
void seq_free(seq *s);
/* Feed ids at positions st.len.. (the record's end), in chunks, recording each chunk as it enters
 * the state. logits: last token's logits (vocab floats) or NULL. On failure the state is tainted
 * and -1 returned with err. */
int seq_feed(seq *s, const int *ids, int n, float *logits, char *err, size_t errlen);
/* seq_feed that writes every fed token's logits into all_logits[n][vocab] (echo / scoring). */
int seq_feed_all(seq *s, const int *ids, int n, float *all_logits, char *err, size_t errlen);
/* One decode step of k distinct sequences of one model in a single forward call: ids[i] enters
 * seqs[i] (and its record), logits[i] gets its next-token logits. Each sequence ends exactly as
 * seq_feed(seqs[i], &ids[i], 1, ...) would leave it. On failure every sequence of the call is
 * tainted and -1 returned with err. */
int seq_feed_step(seq **seqs, const int *ids, int k, float **logits, char *err, size_t errlen);

/* Registry of families (model.c). */
const family_ops *family_find(const char *model_type);

#endif
