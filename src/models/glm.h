/* glm.h — private to the GLM-5 family (model_type glm_moe_dsa): glm.c loads config and weights,
 * glm_forward.c runs the forward pass.
 *
 * ARCHITECTURE (Hugging Face GlmMoeDsa): pre-norm decoder layers, each
 *   h += o_proj(MLA attention(RMSNorm(h)))   with a DSA "lightning indexer" choosing which
 *                                            positions a query may attend to once there are
 *                                            more than index_topk of them;
 *   h += FFN(RMSNorm(h))                     dense SwiGLU for the first layers, then a sigmoid
 *                                            router with score-correction bias choosing top-k
 *                                            routed experts, plus one always-on shared expert;
 * then a final RMSNorm and lm_head.
 *
 * MTP (DeepSeek-V3 style, one layer at index num_hidden_layers, spec glm_kimi_inkling.md §2.6):
 * the MTP row of position p takes the main model's final hidden state of p (after the final
 * norm, as vLLM and SGLang feed it) and the token at p + 1:
 *   x = eh_proj [enorm(embed(tok_{p+1})) ; hnorm(h_p)],  one decoder layer (its own MLA rows
 *   and indexer), then shared_head.norm and the shared lm_head predict tok_{p+2}.
 * It runs only when the model was opened for speculative decoding (model.spec_mtp); then every
 * forward call also computes the MTP rows of the positions its tokens complete, and
 * glm_draft chains the layer on its own output to draft further tokens.
 *
 * STATE (per layer, PART_ROWS, span 1 — every row a pure function of its own token's hidden
 * state, so any prefix of rows is a valid state and truncation, copy and persistence are plain
 * memcpy done by the generic state layer):
 *   "L<i>.kv" : kv_lora normalised latent, then qk_rope rotated rope key (f32)
 *   "L<i>.ik" : index_head_dim indexer key (LayerNorm + rope), only on layers with a full indexer.
 * With MTP running, also ROWS parts (span 1) "mtp.h" (row p: the final hidden state of p) and
 * "L<n>.kv" / "L<n>.ik" for the MTP layer, whose row p + 1 holds MTP position p: it depends on
 * tokens 0..p+1, so row i is still a function of the tokens before i + 1 and truncation stays a
 * prefix cut. Row 0 of those two is never written.
 *
 * CHUNKING INVARIANCE: projections are batched qmat_mul calls (row-exact); attention, indexer
 * scores and expert sums run per token in a fixed order that depends only on the token's position.
 */
#ifndef CAIRN_GLM_H
#define CAIRN_GLM_H

#include "../core/kernels.h"
#include "../core/ops.h"
#include "mla.h"
#include "model.h"

typedef struct {
    float *attn_norm, *ffn_norm, *q_a_norm, *kv_a_norm;     /* f32 copies of the norm weights */
    qmat q_a, q_b, kv_a, kv_b, o;
    mla_absorbed mla;                                        /* kv_b for absorbed attention (mla.h) */
    int full_indexer;                                        /* runs its own indexer (else reuses) */
    qmat idx_wq_b, idx_wk, idx_weights;
    float *idx_knorm_w, *idx_knorm_b;
    int sparse;                                              /* MoE FFN (else dense SwiGLU) */
    qmat gate, up, down;                                     /* dense MLP, or the shared expert */
    qmat router;
    float *router_bias;                                      /* e_score_correction_bias */
    qmat *e_gate, *e_up, *e_down;                            /* [n_experts] */
} glm_layer;

/* The dimensions the tensor table's shapes are written in (glm.c fills glm_model.dims). */
enum { GD_DIM, GD_2DIM, GD_VOCAB, GD_QLORA, GD_QB, GD_KVA, GD_KVLORA, GD_KVB, GD_OV, GD_IQ, GD_IDX, GD_IHEADS,
       GD_EXPERTS, GD_INTER, GD_COUNT };

/* The MTP block's own tensors beside its layer. */
typedef struct {
    qmat eh;                          /* [dim, 2 dim]: [enorm(embed) ; hnorm(hidden)] -> dim */
    float *enorm, *hnorm, *head_norm; /* head_norm is shared_head.norm (the lm_head is the model's) */
} glm_mtp;

typedef struct {
    int vocab, dim, n_layers, n_heads;
    int q_lora, kv_lora, nope, rope, v_dim;
    int inter, moe_inter, n_experts, top_k, n_shared;
    int has_indexer, idx_heads, idx_dim, idx_topk;
    int rope_interleave, idx_rope_interleave;
    int norm_topk;
    float routed_scale, eps;
    rope_table rope_tab;
    qmat embed, head;
    float *final_norm;
    glm_layer *layers;
    glm_layer mtp;                    /* has_mtp = 0 when the checkpoint has none */
    glm_mtp mtp_extra;
    int has_mtp;
    int dims[GD_COUNT];
    experts *experts;                 /* the routed experts (core/experts.h), by layer index; the
                                         MTP layer's are layer n_layers */
} glm_model;

/* Per-sequence handle: pointers into the state's parts, and the sequence's scratch arena. */
typedef struct {
    float **kv;        /* [n_layers + 1] rows of kv_lora + rope floats; [n_layers]: MTP, from row 1 */
    float **ik;        /* [n_layers + 1] rows of idx_dim floats, NULL where the layer shares */
    float *hfin;       /* "mtp.h" [cap][dim] final hidden states, NULL without MTP */
    float *draft_h;    /* [dim] the MTP output of the last draft step (scratch between draft calls) */
    int cap;
    arena *scratch;    /* glm_scratch_bytes(ctx) bytes, owned by the generic seq */
} glm_seq;

/* Tokens per internal pass: bounds the scratch, batches weight reads. Every pass decodes the dense
 * weights again and splits the routed experts' tokens (n_active / n_experts of the pass each): at 64
 * the GLM bench model's 256-token prefill decoded 5.1 GB of BF16 rows for its 1.9 GB of weights, and
 * its experts saw ~16 tokens a pass; 256 (as DeepSeek V4) prefills 17-27 % faster. */
#define GLM_CHUNK 256

size_t glm_scratch_bytes(const model *m, int ctx);
/* One routed expert over gathered rows (core/experts.h expert_fn, ctx the model) and its scratch. */
void glm_expert(void *ctx, int layer, int e, const qmat *w, const float *in, const float *weight, int cnt, float *out,
                arena *sc);
size_t glm_expert_scratch(void *ctx, int layer, int cnt);
int glm_forward(model *m, const fwd_seg *segs, int nseg, char *err, size_t errlen);
int glm_draft(model *m, void *fam_seq, int pos, int id, int step, float *logits, char *err, size_t errlen);

/* chat_glm.c: the template the descriptor points at. */
extern const chat_template glm_chat;

#endif
