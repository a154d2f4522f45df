/* inkling.h — private to the Inkling family (model_type inkling_mm_model): inkling.c loads config
 * and weights and declares the state, inkling_forward.c runs the forward pass.
 *
 * ARCHITECTURE (Hugging Face transformers models/inkling, modeling_inkling.py):
 *   x = RMSNorm_embed(embed(id))                 normed embedding, always applied; an audio
 *                                                placeholder position takes RMSNorm(sum of one
 *                                                audio-table row per mel bin) instead
 *   per layer (layer_types: hybrid_sliding / hybrid, default sliding iff (i+1) % 6 != 0):
 *     h  = RMSNorm_in(x)
 *     q  = q_norm(W_q h) per head; k = k_norm(conv_k(W_k h)); v = conv_v(W_v h); r = W_r h
 *     a  = softmax_t(q.k_t / head_dim + bias_h(pos - t)) v_t     GQA, no RoPE; sliding layers
 *          attend t in (pos - window, pos]; bias_h(d) = (r_h . proj)[d] for d < extent (the
 *          window on sliding layers, rel_extent on global ones), 0 beyond; on global layers with
 *          log_scaling_n_floor, q and the bias are both scaled by
 *          tau = 1 + alpha * ln(max((pos+1) / n_floor, 1)), in f32
 *     x += conv_attn(W_o a)
 *     x += conv_mlp(MLP(RMSNorm_post(x)))   dense SwiGLU * global_scale, or MoE: sigmoid router
 *          over routed + shared experts, top-k of the routed on sigmoid + correction bias, and
 *          the k routed and every shared expert weighted by their sigmoids normalised jointly,
 *          times route_scale * gate.global_scale
 *   logits = lm_head(RMSNorm_final(x) / logits_mup_width_multiplier)[:unpadded_vocab_size]
 * Every conv is depthwise causal over sconv_kernel_size taps, in f32, with the residual inside:
 * conv(x)_t = x_t + sum_j w_j x_{t-K+1+j}.
 *
 * STATE (declared as parts; the generic layer does every reuse operation):
 *   "L<i>.ring" RING of window slots, [k | v] per position (sliding layers)
 *   "L<i>.kv"   ROWS, span 1, [k | v] per position (global layers)
 *   "L<i>.kvconv", "L<i>.aconv", "L<i>.mconv"  RECUR: the last K-1 inputs of the k and v convs,
 *               of the attention-output conv and of the MLP-output conv. Three parts, not one,
 *               because a chunk runs them in three phases and a capture must see each part just
 *               before its own first write of the captured position.
 * The convs make the state extend-only: truncating rows without rewinding the conv windows would
 * be wrong, so rewinds go through checkpoints (light snapshots carry the rings and convs).
 * forward calls state_capture before the first write of each position to each ring / conv part.
 *
 * CHUNKING INVARIANCE: projections are batched qmat_mul (row-exact); convs, attention and expert
 * sums run per token in position order with fixed reduction orders. A pass takes rows from several
 * sequences (the engine's batched decode): the token-parallel work is the same per row whatever
 * shares the batch, and the stateful work reads and writes each row's own sequence.
 */
#ifndef CAIRN_INKLING_H
#define CAIRN_INKLING_H

#include "../core/kernels.h"
#include "model.h"

/* A SwiGLU's gate and up projections: two matrices, or one fused [2I, D] matrix whose rows are
 * all gate then all up (HF experts) or interleaved g0, u0, g1, u1, ... (the released layout). */
typedef enum { GLU_SPLIT, GLU_HALVES, GLU_INTERLEAVED } glu_layout;

typedef struct {
    glu_layout layout;
    qmat gate, up;            /* GLU_SPLIT */
    qmat fused;               /* GLU_HALVES / GLU_INTERLEAVED */
    qmat down;
    int inter;
} ink_glu;

typedef struct {
    int sliding, heads, kv_heads, head_dim, extent;
    float *attn_norm, *mlp_norm, *q_norm, *k_norm;
    float *conv_k, *conv_v, *conv_attn, *conv_mlp;       /* [channels][K] taps, f32 */
    float *conv_kv;                                      /* conv_k's channels then conv_v's */
    float *rel;                                          /* [d_rel][extent] */
    qmat q, k, v, r, o;
    int sparse;
    ink_glu mlp;                                         /* dense MLP */
    float *mlp_scale;                                    /* [1] */
    qmat router;                                         /* [experts + shared, D] */
    float *router_bias;                                  /* [experts] */
    float *router_scale;                                 /* [1] */
    qmat *ex_gate_up, *ex_down;                          /* stacked [experts] as loaded */
    qmat *sh_gate_up, *sh_up, *sh_down;                  /* stacked [shared]; sh_up in GLU_SPLIT */
    ink_glu *experts, *shared;                           /* the SwiGLUs built from them */
} ink_layer;

/* The dimensions the tensor table's shapes are written in (inkling.c fills ink_model.dims; the
 * attention entries per layer). */
enum { ID_DIM, ID_VOCAB, ID_QD, ID_KVD, ID_RD, ID_HD, ID_DREL, ID_EXTENT, ID_CONV, ID_INTER, ID_2INTER, ID_ROUTER,
       ID_EXPERTS, ID_SHARED, ID_MOE_INTER, ID_2MOE_INTER, ID_AUDIO_ROWS, ID_COUNT };

typedef struct {
    int vocab, unpadded, dim, n_layers;
    int window, d_rel, conv_k;
    int n_experts, top_k, n_shared, moe_inter;
    float eps, log_alpha, route_scale, logit_div;
    int log_floor;                                       /* 0: no log scaling */
    int audio_token, n_mel, mel_vocab;                   /* audio_token -1: no audio tower */
    qmat embed, head, audio_embed;
    float *embed_norm, *final_norm, *audio_norm;
    ink_layer *layers;
    int dims[ID_COUNT];
    experts *experts;                                    /* the routed experts (core/experts.h), by layer index */
} ink_model;

/* u with its matrices replaced by w, in the tensor table's order (gate, up, down; or fused, down):
 * a routed expert as the expert registry hands it out (mapped or cached). */
ink_glu ink_glu_with(const ink_glu *u, const qmat *w);

/* One state part as the forward pass sees it: its buffer and its index (for state_capture). */
typedef struct {
    float *buf;
    int part;
} ink_part;

typedef struct {
    ink_part kv;              /* ring (sliding) or rows (global) of [k | v] */
    ink_part conv_kv, conv_attn, conv_mlp;   /* [K-1][channels] conv inputs, oldest first */
} ink_layer_state;

/* Per-sequence handle: the layers' parts, and the audio frames of the feed under way. */
typedef struct {
    ink_layer_state *layers;
    state *st;
    arena *scratch;           /* inkling_scratch_bytes(ctx) bytes, owned by the generic seq */
    int cap;
    unsigned char *audio;     /* [frames][n_mel] DMel levels, consumed by placeholder ids in order */
    int audio_frames, audio_used;
} ink_seq;

extern const chat_template inkling_chat;   /* chat_inkling.c */

#define INK_CONV_MAX 16   /* sconv_kernel_size allowed (the convs keep K input pointers on the stack) */
#define INK_CHUNK 256      /* rows per internal pass: each pass reads every weight once */
#define INK_HEAD_ROWS 8    /* rows per lm_head product (a batched decode step's sequences) */

/* The rows of one pass: row i is token ids[i] at position pos[i] of sequence seq[i]; its logits
 * go to all[i] or last[i] when set. end = 1 + the largest position. */
typedef struct {
    ink_seq **seq;
    const int *pos, *ids;
    float **all, **last;
    int n, end;
} ink_rows;

size_t inkling_scratch_bytes(const model *m, int ctx);
/* One routed expert over gathered rows (core/experts.h expert_fn, ctx the model) and its scratch. */
void inkling_expert(void *ctx, int layer, int e, const qmat *w, const float *in, const float *weight, int cnt,
                    float *out, arena *sc);
size_t inkling_expert_scratch(void *ctx, int layer, int cnt);
int inkling_forward(model *m, const fwd_seg *segs, int nseg, char *err, size_t errlen);

#endif
