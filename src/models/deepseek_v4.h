/* deepseek_v4.h — private to the DeepSeek V4 family (deepseek_v4*.c); nothing outside includes it.
 *
 * The family is split by concern: deepseek_v4.c (config, tensor validation, sequence parts,
 * family_ops), deepseek_v4_forward.c (mHC streams, block loop, head), deepseek_v4_attn.c
 * (query/KV, compressors, indexer, sparse attention with sinks, grouped output) and
 * deepseek_v4_moe.c (routing and experts). The math follows /work/shared/spec/deepseek_v4.md.
 *
 * INVARIANTS
 *  - Weight matrices are qmat views into the checkpoint's mapping: never copied, never written.
 *    Only small vectors (norms, biases, sinks, mixing parameters, ape) are copied, for alignment
 *    (the tensor table, core/tensor_table.h, owns the copies).
 *  - Everything a sequence carries between forward calls lives in its state parts (window ring,
 *    compressor/indexer partials, compressed lists). dsv4_seq's other buffers are scratch that
 *    is fully rewritten before it is read within one call, so a reset or restore of the parts
 *    is a reset or restore of the sequence.
 *  - Chunking invariance: projections run batched over the tokens of a call (each row
 *    bit-identical to a single-row product), the stateful steps (ring write, compressor
 *    emission, indexer, attention) run token by token in position order, and every reduction
 *    has one fixed order. So any split of a prompt into calls gives the same bits.
 *  - The number of valid compressed rows at position p is floor(p / ratio); no counter is kept.
 *  - MTP (deepseek_v4_mtp.c): a sequence made with model.spec_mtp also holds MTP block 0's window
 *    ring ("L<n_layers>.window") and "mtp.h"; both are written, and hooked for captures, at the
 *    position whose feed completes them, so they rewind like every other part (state_rewind).
 *    Drafting writes no state.
 *  - NUMERICS_QAT rounds to BF16 and quantize-dequantizes activations/KV exactly where spec §7/§7.1
 *    say; NUMERICS_EXACT skips all of those (dsv4_bf16 / dsv4_act_qdq become no-ops).
 */
#ifndef CAIRN_DEEPSEEK_V4_H
#define CAIRN_DEEPSEEK_V4_H

#include <stdint.h>

#include "../core/kernels.h"
#include "../core/ops.h"
#include "../core/quant.h"
#include "model.h"

#define DSV4_MAX_LAYERS 128
#define DSV4_MAX_HC 8
/* Tokens per internal pass: bounds scratch, batches weight reads. Large enough that a routed
 * expert sees a few dozen tokens of a pass (256 * n_active / n_experts) and reuses each decoded
 * weight tile across them. */
#define DSV4_CHUNK 256
#define DSV4_HEAD_ROWS 8       /* rows per head product (a batched decode step's sequences) */

typedef struct {
    int dim, n_layers, n_mtp, vocab;
    int n_heads, head_dim, rope_dim, q_lora, o_groups, o_lora, window;
    int ratios[DSV4_MAX_LAYERS];
    int idx_heads, idx_dim, idx_topk;
    int n_experts, n_active, n_shared, moe_inter, n_hash;
    double route_scale, swiglu_limit;
    int hc, hc_iters;
    double hc_eps, eps;
    double rope_theta, compress_theta, yarn_factor, yarn_orig, yarn_beta_fast, yarn_beta_slow;
} dsv4_config;

/* One compressor (main at head_dim, or the indexer's at idx_dim). coff = 2 when ratio == 4:
 * each token then feeds two series, the overlap half of the next entry and its own entry. */
typedef struct {
    int ratio, width, coff;
    qmat wkv, wgate;           /* BF16 [coff*width, dim] */
    const float *ape;          /* [ratio][coff*width] */
    const uint16_t *norm;      /* [width] */
} dsv4_compressor;

/* hc_pre/hc_post parameters of one sub-layer (or the head's collapse). */
typedef struct {
    qmat fn;                   /* F32 [mix, hc*dim] */
    const float *base, *scale;
} dsv4_hc;

typedef struct {
    int ratio;                 /* 0 window only, 4 CSA (+ indexer), other: HCA */
    int hash;                  /* routed by tid2eid */
    int mtp;                   /* 1 for an MTP block: its row of position p enters the state with the
                                * token at p + 1, so its ring slot and capture position are p + 1 */
    const rope_table *rope;
    dsv4_hc hc_attn, hc_ffn;
    const uint16_t *attn_norm, *ffn_norm, *q_norm, *kv_norm;
    const float *sink;         /* [n_heads] */
    qmat wq_a, wq_b, wkv, wo_a, wo_b;
    dsv4_compressor comp, idx_comp;
    qmat idx_wq_b, idx_wproj;
    qmat gate;
    const float *gate_bias;    /* score-routed layers */
    const int64_t *tid2eid;    /* hash layers: [vocab][n_active] */
    qmat *w1, *w2, *w3;        /* routed experts [n_experts] */
    qmat sw1, sw2, sw3;        /* shared expert */
} dsv4_layer;

/* An MTP block's tensors beside its layer (spec §6). Block 0 drafts (deepseek_v4_mtp.c). */
typedef struct {
    qmat e_proj, h_proj;
    const uint16_t *enorm, *hnorm, *norm;
    dsv4_hc hc_head;
} dsv4_mtp;

/* The dimensions the tensor table's shapes are written in (deepseek_v4.c fills dsv4_model.dims;
 * the mixing and compressor entries per group). */
enum { DD_DIM, DD_VOCAB, DD_HEADS, DD_HEAD_DIM, DD_QLORA, DD_QW, DD_OA, DD_OA_IN, DD_IQ, DD_IHEADS, DD_EXPERTS,
       DD_ACTIVE, DD_MOE_INTER, DD_SHARED_INTER, DD_HCDIM, DD_MIX, DD_NSCALE, DD_RATIO, DD_CROWS, DD_CWIDTH,
       DD_COUNT };

typedef struct {
    dsv4_config c;
    int qat;                   /* model->num == NUMERICS_QAT */
    rope_table rope_plain, rope_yarn;
    qmat embed, head;
    const uint16_t *norm;
    dsv4_hc hc_head;
    dsv4_layer *layers;        /* n_layers + n_mtp (the MTP blocks after the main layers) */
    dsv4_mtp *mtp;             /* [n_mtp] */
    experts *experts;          /* the model's routed experts (core/experts.h), by layer index */
    int dims[DD_COUNT];
} dsv4_model;

/* Per-layer pointers into the sequence's state parts (NULL where the layer has none), and the
 * part indices the capture hook (state_capture) names them by. */
typedef struct {
    int ring_part, comp_part, idx_part;   /* comp/idx: index of the kv part; its score part is next */
    float *ring;               /* [window][head_dim] */
    float *ckv, *cscore;       /* compressor partials [coff*ratio][coff*head_dim] */
    float *ikv, *iscore;       /* indexer compressor partials [8][2*idx_dim] */
    float *clist;              /* compressed KV [ctx/ratio][head_dim] */
    float *ilist;              /* indexer keys [ctx/4][idx_dim] */
} dsv4_layer_state;

/* A sequence's handle is also the scratch of a pass: a forward call over several sequences
 * runs each pass in the first one's scratch. Rows are tokens of any of the call's sequences
 * (row_seq, row_pos, row_id). A row's attention temporaries (candidates, scores, indexer dots)
 * are per thread, not per sequence (deepseek_v4_attn.c): rows attend in parallel. */
typedef struct dsv4_seq dsv4_seq;
struct dsv4_seq {
    int ctx;
    state *st;                 /* the generic state holding the parts, for state_capture */
    dsv4_layer_state *ls;
    /* every buffer below is carved once from the sequence's arena, sized for DSV4_CHUNK tokens */
    float *h, *mix, *post, *comb;                /* streams [C][hc*dim] and their mixing */
    /* per-token activations [C][..]: x sub-layer input (normed), xq its E4M3 QDQ copy; qr/qrq the
     * query latent and its QDQ copy; q query heads; kv window row; ca/cs and ia/is the main and
     * indexer compressors' kv/score inputs; iq/iw indexer queries and head weights; o attention
     * output; g one output group's slice, ug its wo_a rows, u all groups; f sub-layer output */
    float *x, *xq, *qr, *qrq, *q, *kv, *ca, *cs, *ia, *is, *iq, *iw, *o, *g, *ug, *u, *f;
    float *moe_logit;          /* [C][n_experts] gate logits */
    float *moe_score, *moe_biased;                 /* [n_experts] one token's scores */
    float *moe_w, *moe_rw;     /* [C*k] route weights by (token, rank); the shared expert's (1) */
    int *moe_idx;              /* [C*k] chosen experts */
    float *moe_ge, *moe_ue, *moe_ye;              /* [C][..] the shared expert's inner and output rows */
    float *moe_y;              /* [C][k][dim] routed outputs by rank */
    int max_cand;              /* most attention candidates of one of this sequence's queries */
    /* attention's two steps (deepseek_v4_attn.c): kv_over[t] is the window row that row t's ring
     * write replaced; row t's run is rows run_first[t] .. run_last[t] of its sequence */
    float *kv_over;            /* [C][head_dim] */
    int *run_first, *run_last; /* [C] */
    int *row_id, *row_pos;     /* [C] token id and absolute position of each row of the pass */
    dsv4_seq **row_seq;        /* [C] the sequence each row belongs to */
    float *head_out;           /* [DSV4_HEAD_ROWS][vocab] logits of a group of rows */
    /* speculative decoding (model.spec_mtp, deepseek_v4_mtp.c); NULL / -1 otherwise */
    float *mtp_h;              /* "mtp.h" RING part of one slot: the last fed position's 4-stream H */
    int mtp_h_part;
    float *mtp_in;             /* [C][hc*dim] scratch: each MTP row's H input */
    float *draft_ring;         /* [window][head_dim] the MTP block's ring as the draft steps see it */
    float *draft_h;            /* [hc*dim] the MTP block's output streams of the last draft step */
};

static inline void dsv4_bf16(const dsv4_model *d, float *x, size_t n) {
    if (d->qat) bf16_round_vec(x, n);
}
/* E4M3 QDQ (block 128) of an FP8/FP4 linear's input, as the QAT checkpoint saw it. */
static inline void dsv4_act_qdq(const dsv4_model *d, float *x, size_t n) {
    if (d->qat) act_qdq_e4m3(x, n, 128);
}

/* deepseek_v4_forward.c */
int dsv4_forward(model *m, const fwd_seg *segs, int nseg, char *err, size_t errlen);

/* deepseek_v4_forward.c, shared with the MTP block: mHC around one block over the pass's n rows,
 * and the HC head collapse + final norm of pass row t (hc_head / norm: the model's or a block's). */
void dsv4_block(const dsv4_model *d, const dsv4_layer *L, int li, dsv4_seq *s, int n);
void dsv4_hc_pre(const dsv4_model *d, const dsv4_hc *p, const uint16_t *norm, dsv4_seq *s, int n);
void dsv4_head_state(const dsv4_model *d, const dsv4_hc *hc_head, const uint16_t *norm, const dsv4_seq *s, int t,
                     const float *mix, float *y);
float dsv4_rsqrt_mean_square(const float *x, int n, double eps);

/* deepseek_v4_mtp.c: after a pass's main layers (s->h the final streams of its rows, row_* set),
 * each MTP sequence's "mtp.h" advances and the MTP block's window rows of the positions the pass
 * completes enter its state. dsv4_draft is the family's ops->draft. */
void dsv4_mtp_rows(const dsv4_model *d, dsv4_seq *s, int n);
int dsv4_draft(model *m, void *fam_seq, int pos, int id, int step, float *logits, char *err, size_t errlen);

/* deepseek_v4_attn.c: s->x[n][dim] holds the attn_norm outputs of the pass's n rows (a row's
 * tokens of one sequence in position order); writes the attention sub-layer output of layer li
 * to out[n][dim] and advances each row's sequence state. */
void dsv4_attention(const dsv4_model *d, const dsv4_layer *L, int li, dsv4_seq *s, int n, float *out);
/* Only the window-ring writes of dsv4_attention (no compressor: a ratio-0 layer), for rows whose
 * attention output nobody reads: the MTP block's rows in a forward call. */
void dsv4_window_rows(const dsv4_model *d, const dsv4_layer *L, int li, dsv4_seq *s, int n);

/* deepseek_v4_moe.c: x[n][dim] are ffn_norm outputs of the pass's rows (ids in s->row_id);
 * out[n][dim]. */
/* One routed expert over gathered rows (core/experts.h expert_fn, ctx the model) and its scratch. */
void dsv4_expert(void *ctx, int layer, int e, const qmat *w, const float *xe, const float *weight, int ne, float *ye,
                 arena *sc);
size_t dsv4_expert_scratch(void *ctx, int layer, int ne);
void dsv4_moe(const dsv4_model *d, const dsv4_layer *L, dsv4_seq *s, int n, const float *x, float *out);

/* chat_deepseek_v4.c: the template the descriptor points at. */
extern const chat_template deepseek_v4_chat;

#endif
