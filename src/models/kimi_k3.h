/* kimi_k3.h — private to the Kimi K3 family (model_type kimi_k3 with a kimi_linear text_config).
 *
 * The family is split by concern: kimi_k3.c (config, tensors, sequence parts, family_ops),
 * kimi_k3_forward.c (attention residuals, layer loop, head), kimi_k3_kda.c (Kimi Delta Attention),
 * kimi_k3_mla.c (gated NoPE MLA) and kimi_k3_moe.c (latent MoE, SiTU-GLU). Sources followed: Hugging
 * Face transformers models/kimi_linear (KDA recurrence, gate forms, MLA, router), the K3 release's
 * tensor layout and published config, and the K3 attention-residual block structure
 * (KimiK3TransformerBlock._forward_attn_residual); /work/shared/spec/glm_kimi_inkling.md §3.
 *
 * ARCHITECTURE. Layers are KDA (linear attention, kda_layers) or gated NoPE MLA (the rest). Each layer
 *   x_in  = softmax mix of [block snapshots..., prefix] (once a block exists), keyed on
 *           proj . RMSNorm(v); every attn_res_block_size layers the layer input becomes a new block
 *           snapshot and the prefix restarts from the attention output;
 *   prefix += attn(RMSNorm(x_in));  prefix += FFN(RMSNorm(mix of [blocks..., prefix]));
 * then a last mix, the final norm and lm_head. FFN: SiTU-GLU (layer 0) or the latent MoE.
 *
 * STATE (declared in kimi_k3.c, nothing else carries between forward calls):
 *   KDA layer i: "L<i>.kda"  RECUR  [heads][head_dim(k)][head_dim(v)] f32 delta-rule matrices
 *                "L<i>.conv" RECUR  [3 (q,k,v)][proj][kernel-1] f32 raw inputs of the short convs
 *   MLA layer i: "L<i>.kv"   ROWS   kv_lora normalised latent + qk_rope raw key per position
 * The KDA parts cannot rewind: reuse beyond a strict extension goes through the shared layer's
 * checkpoints, fed by the state_capture hooks called before each position's first write.
 *
 * INVARIANTS
 *  - Weight matrices are qmat views into the checkpoint mapping, never copied; small vectors are
 *    copied to f32 once.
 *  - Chunking invariance: projections are batched qmat_mul (row-exact); the short convs, the KDA
 *    recurrence and attention run token by token in position order with fixed reduction orders;
 *    so any split of a prompt into forward calls gives the same bits as token by token.
 */
#ifndef CAIRN_KIMI_K3_H
#define CAIRN_KIMI_K3_H

#include "../core/kernels.h"
#include "../core/ops.h"
#include "mla.h"
#include "model.h"

extern const chat_template kimi_k3_chat;

#define K3_MAX_BLOCKS 32        /* attention-residual snapshots: ceil(layers / block size) */
#define K3_MAX_CONV 8           /* short-conv kernel */
/* Tokens per internal pass: each pass reads every weight once, and its routed experts see its
 * tokens. 64 -> 128 made the bench model's prefill 7 % faster (256 -> same again) for a
 * per-sequence scratch at the real shape of 66 -> 132 MB (263 MB at 256). */
#define K3_CHUNK 128

typedef struct {
    qmat q, k, v, f_a, f_b, b, g, g_a, g_b, o;  /* g full rank, or g_a/g_b low rank (Kimi Linear) */
    const float *conv[3];                    /* [proj][kernel] taps for q, k, v */
    const float *decay_scale;                /* exp(A_log[h]), [heads] */
    const float *dt_bias;                    /* [proj] */
    const float *o_norm;                     /* [head_dim] */
} k3_kda;

typedef struct {
    qmat q_a, q_b, kv_a, kv_b, g, o;
    mla_absorbed absorbed;                   /* kv_b for absorbed attention (mla.h) */
    const float *q_a_norm, *kv_a_norm;
} k3_mla;

typedef struct {
    int kda, sparse;
    const float *attn_norm, *ffn_norm, *res_attn_norm, *res_attn_proj, *res_mlp_norm, *res_mlp_proj;
    k3_kda lin;
    k3_mla mla;
    qmat gate, up, down;                     /* dense SiTU-GLU, or the fused shared experts */
    qmat router, lat_down, lat_up;
    const float *router_bias, *lat_norm;     /* lat_norm NULL without latent_moe_use_norm */
    qmat *w1, *w2, *w3;                      /* routed experts (MXFP4) */
} k3_layer;

/* The dimensions the tensor table's shapes are written in (kimi_k3.c fills k3_model.dims). */
enum { KD_DIM, KD_VOCAB, KD_PROJ, KD_KDA_DIM, KD_KDA_HEADS, KD_CONV, KD_QLORA, KD_QB, KD_KVA, KD_KVLORA, KD_KVB,
       KD_OV, KD_EXPERTS, KD_LATENT, KD_MOE_INTER, KD_INTER, KD_COUNT };

typedef struct {
    int vocab, dim, n_layers, inter;
    int n_heads, q_lora, kv_lora, nope, rope, v_dim;
    int kda_heads, kda_dim, conv_k, has_lower_bound, full_rank_gate;
    float lower_bound;
    int n_experts, top_k, n_shared, moe_inter, latent, renormalize;
    float routed_scale, situ_beta, situ_linear_beta, eps;
    int res_block;                           /* attn_res_block_size; 0 = plain residuals */
    int n_blocks;                            /* snapshots a forward pass takes: ceil(layers / res_block) */
    qmat embed, head;
    const float *final_norm, *out_res_norm, *out_res_proj;
    k3_layer *layers;
    int dims[KD_COUNT];
    experts *experts;                        /* the routed experts (core/experts.h), by layer index */
} k3_model;

/* Per-sequence handle: pointers into the state's parts, and the sequence's scratch arena. */
typedef struct {
    state *st;
    arena *scratch;
    float **kda, **conv, **kv;   /* [n_layers], NULL where the layer has no such part */
    int *kda_part, *conv_part;   /* part indices for state_capture */
    int cap;
} k3_seq;

/* SCRATCH. Every buffer of a forward pass comes from the sequence's arena (core/arena.h), taken
 * by each stage's *_layout function for n <= K3_CHUNK tokens ending at or before `end` positions.
 * k3_scratch_bytes runs the same layouts on a measuring arena, so the bound is exact by
 * construction. A stage gives its buffers back (arena_release) when it returns. */
float *k3_floats(arena *a, size_t n);
size_t k3_kda_scratch(const k3_model *k, int n);
size_t k3_mla_scratch(const k3_model *k, const k3_layer *l, int n, int end);
size_t k3_ffn_scratch(const k3_model *k, const k3_layer *l, int n);
/* One routed expert over gathered latent rows (core/experts.h expert_fn, ctx the model) and its scratch. */
void k3_expert(void *ctx, int layer, int e, const qmat *w, const float *in, const float *weight, int cnt, float *out,
               arena *sc);
size_t k3_expert_scratch(void *ctx, int layer, int cnt);
size_t k3_scratch_bytes(const model *m, int ctx);
/* beta * tanh(g / beta) * sigmoid(g) * linear_beta * tanh(u / linear_beta), into g. */
void k3_situ(const k3_model *k, float *restrict g, const float *restrict u, size_t n);

/* A pass (kimi_k3_forward.c) holds rows of several sequences: rows t0 .. t0+n-1 of it are
 * positions pos0 .. pos0+n-1 of sequence s. The attention layers project all the pass's rows with
 * one read of each weight, then run each run's recurrence or attention on its own sequence. */
typedef struct {
    k3_seq *s;
    int pos0, t0, n;
} k3_run;

void k3_kda_forward(const model *m, const k3_layer *l, int li, const k3_run *runs, int nruns, const float *hn, int n,
                    float *out, arena *sc);
void k3_mla_forward(const model *m, const k3_layer *l, int li, const k3_run *runs, int nruns, const float *hn, int n,
                    float *out, arena *sc);
void k3_ffn_forward(const model *m, const k3_layer *l, const float *x, int n, float *y, arena *sc);

int k3_forward(model *m, const fwd_seg *segs, int nseg, char *err, size_t errlen);

#endif
