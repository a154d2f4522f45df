/* model.h — the boundary between generic code (CLI, engine loop, reuse) and one model family.
 *
 * A family (deepseek_v4.c, glm.c, ...) exports one `family_ops` table, like redis' ae backends.
 * It knows tensors and math; it knows nothing about requests, records or reuse. Its whole
 * contract with the rest of cairn:
 *   load     — read config.json (typed, errors name the key) and look up/validate every tensor.
 *   seq_new  — declare the parts of one sequence state (state_add_part) for `ctx` positions and
 *              return the family's per-sequence handle (pointers into those parts + scratch).
 *   forward  — feed ids at absolute positions pos0..pos0+n-1, extending that state. Result must
 *              be bit-identical however a prompt is split into forward calls (chunking
 *              invariance). Writes the logits of the LAST fed token when logits != NULL, and of
 *              every fed token into all_logits[n][vocab] when that is non-NULL.
 *   set_media — (optional) non-text input for the following feeds: bytes the family consumes at
 *              the positions of its placeholder id `model.media_token` (Inkling: DMel frames at
 *              audio placeholders). Validates them, returns how many placeholders they fill;
 *              NULL bytes clears. Ids cannot describe such input, so seq_feed taints the state
 *              after any chunk in which placeholders met attached media.
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

typedef struct {
    const char *model_type;                       /* config.json model_type this family handles */
    int (*load)(model *m, char *err, size_t errlen);
    void (*free)(model *m);
    void *(*seq_new)(model *m, state *st, int ctx, char *err, size_t errlen);
    void (*seq_free)(model *m, void *fam_seq);
    int (*forward)(model *m, void *fam_seq, const int *ids, int pos0, int n, float *logits, float *all_logits,
                   char *err, size_t errlen);
    int (*set_media)(model *m, void *fam_seq, const unsigned char *bytes, size_t len, char *err, size_t errlen);
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
    int media_token;           /* placeholder id consuming set_media input, -1 if the family takes none */
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

/* Registry of families (model.c). */
const family_ops *family_find(const char *model_type);

#endif
