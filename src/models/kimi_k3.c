/* kimi_k3.c — Kimi K3 family: config.json, tensor lookup/validation, sequence state layout, reports.
 * The module's invariants are in kimi_k3.h; the forward pass is in kimi_k3_forward.c and the files
 * it calls. Tensors load as the release ships them, through the family's tensor table
 * (core/tensor_table.h): BF16 matrices (any kernel format is accepted) and norms, F32 A_log /
 * dt_bias / short convs / o_norm / router bias (BF16 or F32 accepted for every vector), routed
 * experts as MXFP4 `weight_packed` (U8, low nibble = even column) + `weight_scale` (UE8M0 per 32
 * inputs, U8 or F8_E8M0), which is the kernels' WF_FP4 layout as is. Names with or without
 * `language_model.`. */
#include "kimi_k3.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/config.h"
#include "../core/quant.h"
#include "../core/util.h"


/* ---- config ----------------------------------------------------------------------------- */

static int read_dims(k3_model *k, const cJSON *c, char *err, size_t errlen) {
    const struct { const char *key; int *out; } req[] = {
        {"vocab_size", &k->vocab}, {"hidden_size", &k->dim}, {"num_hidden_layers", &k->n_layers},
        {"intermediate_size", &k->inter}, {"num_attention_heads", &k->n_heads}, {"q_lora_rank", &k->q_lora},
        {"kv_lora_rank", &k->kv_lora}, {"qk_nope_head_dim", &k->nope}, {"qk_rope_head_dim", &k->rope},
        {"v_head_dim", &k->v_dim}, {"num_experts", &k->n_experts}, {"num_experts_per_token", &k->top_k},
        {"moe_intermediate_size", &k->moe_inter}, {"routed_expert_hidden_size", &k->latent},
        {"linear_attn_config.num_heads", &k->kda_heads}, {"linear_attn_config.head_dim", &k->kda_dim},
    };
    for (size_t i = 0; i < sizeof req / sizeof *req; i++)
        if (config_int(c, req[i].key, req[i].out, err, errlen)) return -1;
    if (k->vocab < 1 || k->dim < 1 || k->n_layers < 1 || k->inter < 1 || k->n_heads < 1 || k->q_lora < 1 ||
        k->kv_lora < 1 || k->nope < 1 || k->rope < 0 || k->v_dim < 1 || k->n_experts < 1 || k->kda_heads < 1 ||
        k->kda_dim < 1)
        return errf(err, errlen, "config.json: text_config dimensions must be positive");
    if (k->top_k < 1 || k->top_k > k->n_experts)
        return errf(err, errlen, "config.json: num_experts_per_token %d must be in [1, num_experts]", k->top_k);
    /* MXFP4 scales cover 32 inputs: both expert widths must be whole groups. */
    if (k->latent < 32 || k->latent % 32 || k->moe_inter < 32 || k->moe_inter % 32)
        return errf(err, errlen, "config.json: routed_expert_hidden_size %d and moe_intermediate_size %d must be "
                    "multiples of 32 (MXFP4 groups)", k->latent, k->moe_inter);
    return 0;
}

static int read_options(k3_model *k, const cJSON *c, char *err, size_t errlen) {
    int groups, use_nope, gate, latent_norm;
    double scale, b1, b2, eps, lb;
    const char *act = "situ";
    if (config_int_or(c, "num_shared_experts", 0, &k->n_shared, err, errlen) ||
        config_int_or(c, "num_expert_group", 1, &groups, err, errlen) ||
        config_bool_or(c, "moe_renormalize", 1, &k->renormalize, err, errlen) ||
        config_double_or(c, "routed_scaling_factor", 1.0, &scale, err, errlen) ||
        config_double_or(c, "activation_situ_beta", 4.0, &b1, err, errlen) ||
        config_double_or(c, "activation_situ_linear_beta", 25.0, &b2, err, errlen) ||
        config_double_or(c, "rms_norm_eps", 1e-5, &eps, err, errlen) ||
        config_int_or(c, "attn_res_block_size", 0, &k->res_block, err, errlen) ||
        config_bool_or(c, "mla_use_nope", 1, &use_nope, err, errlen) ||
        config_bool_or(c, "mla_use_output_gate", 1, &gate, err, errlen) ||
        config_bool_or(c, "latent_moe_use_norm", 1, &latent_norm, err, errlen) ||
        config_int_or(c, "linear_attn_config.short_conv_kernel_size", 4, &k->conv_k, err, errlen) ||
        config_bool_or(c, "linear_attn_config.use_full_rank_gate", 1, &k->full_rank_gate, err, errlen))
        return -1;
    const cJSON *a = config_get(c, "hidden_act"), *bound = config_get(c, "linear_attn_config.gate_lower_bound");
    if (cJSON_IsString(a)) act = a->valuestring;
    if (strcmp(act, "situ"))
        return errf(err, errlen, "config.json: hidden_act '%s' is not supported (Kimi K3: situ)", act);
    if (groups != 1) return errf(err, errlen, "config.json: num_expert_group %d is not supported (K3 uses 1)", groups);
    if (!use_nope) return errf(err, errlen, "config.json: mla_use_nope false (rotary MLA) is not supported");
    if (!gate) return errf(err, errlen, "config.json: mla_use_output_gate false is not supported (K3 gates MLA)");
    if (!latent_norm) return errf(err, errlen, "config.json: latent_moe_use_norm false is not supported");
    if (k->conv_k < 1 || k->conv_k > K3_MAX_CONV)
        return errf(err, errlen, "config.json: linear_attn_config.short_conv_kernel_size %d must be in [1, %d]",
                    k->conv_k, K3_MAX_CONV);
    if (k->res_block < 0 || (k->res_block && (k->n_layers + k->res_block - 1) / k->res_block > K3_MAX_BLOCKS))
        return errf(err, errlen, "config.json: attn_res_block_size %d gives more than %d blocks", k->res_block,
                    K3_MAX_BLOCKS);
    k->n_blocks = k->res_block ? (k->n_layers + k->res_block - 1) / k->res_block : 0;
    if (!(b1 > 0) || !(b2 > 0)) return errf(err, errlen, "config.json: activation_situ_beta values must be > 0");
    if (bound && !cJSON_IsNull(bound)) {
        if (config_double(c, "linear_attn_config.gate_lower_bound", &lb, err, errlen)) return -1;
        k->has_lower_bound = 1;
        k->lower_bound = (float)lb;
    }
    k->routed_scale = (float)scale;
    k->situ_beta = (float)b1;
    k->situ_linear_beta = (float)b2;
    k->eps = (float)eps;
    return 0;
}

/* kda_layers (1-based) marks KDA layers; first_k_dense_replace the dense ones. */
static int read_layer_kinds(k3_model *k, const cJSON *c, char *err, size_t errlen) {
    int first_dense, *kda = xcalloc((size_t)k->n_layers, sizeof *kda), n = 0;
    if (config_int_or(c, "first_k_dense_replace", 1, &first_dense, err, errlen) ||
        config_int_array(c, "linear_attn_config.kda_layers", kda, k->n_layers, &n, err, errlen)) {
        free(kda);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (kda[i] < 1 || kda[i] > k->n_layers) {
            free(kda);
            return errf(err, errlen, "config.json: linear_attn_config.kda_layers entry %d is not a layer (1..%d)",
                        kda[i], k->n_layers);
        }
        k->layers[kda[i] - 1].kda = 1;
    }
    for (int i = 0; i < k->n_layers; i++) k->layers[i].sparse = i >= first_dense;
    free(kda);
    return 0;
}

/* ---- tensors ---------------------------------------------------------------------------- */

/* The tensor table (core/tensor_table.h). Every vector may be stored [n] or [1, n] (the residual
 * projections ship as [1, n]); A_log may be longer than num_heads (the release zero-pads it). */
#define MAT(n, role, d0, d1, type, field) {{n}, TT_MAT, role, 0, 2, {d0, d1}, offsetof(type, field), 0}
#define VEC(n, d0, type, field, flags) {{n}, TT_F32, TT_DENSE, 0, 1, {d0}, offsetof(type, field), TT_ROW | (flags)}
#define CONV(n, field) {{n}, TT_F32, TT_DENSE, 0, 3, {KD_PROJ, TT_ONE, KD_CONV}, offsetof(k3_kda, field), 0}
static const tt_spec norms[] = {
    VEC("input_layernorm.weight", KD_DIM, k3_layer, attn_norm, 0),
    VEC("post_attention_layernorm.weight", KD_DIM, k3_layer, ffn_norm, 0),
};
/* Layer 0's attention-site mixer exists in the release but has nothing to mix: not loaded. */
static const tt_spec res_attn[] = {
    VEC("self_attention_res_norm.weight", KD_DIM, k3_layer, res_attn_norm, 0),
    VEC("self_attention_res_proj.weight", KD_DIM, k3_layer, res_attn_proj, 0),
};
static const tt_spec res_mlp[] = {
    VEC("mlp_res_norm.weight", KD_DIM, k3_layer, res_mlp_norm, 0),
    VEC("mlp_res_proj.weight", KD_DIM, k3_layer, res_mlp_proj, 0),
};
static const tt_spec kda[] = {
    MAT("q_proj.weight", TT_DENSE, KD_PROJ, KD_DIM, k3_kda, q),
    MAT("k_proj.weight", TT_DENSE, KD_PROJ, KD_DIM, k3_kda, k),
    MAT("v_proj.weight", TT_DENSE, KD_PROJ, KD_DIM, k3_kda, v),
    CONV("q_conv1d.weight", conv[0]),
    CONV("k_conv1d.weight", conv[1]),
    CONV("v_conv1d.weight", conv[2]),
    MAT("f_a_proj.weight", TT_DENSE, KD_KDA_DIM, KD_DIM, k3_kda, f_a),
    MAT("f_b_proj.weight", TT_DENSE, KD_PROJ, KD_KDA_DIM, k3_kda, f_b),
    MAT("b_proj.weight", TT_DENSE, KD_KDA_HEADS, KD_DIM, k3_kda, b),
    VEC("o_norm.weight", KD_KDA_DIM, k3_kda, o_norm, 0),
    MAT("o_proj.weight", TT_DENSE, KD_DIM, KD_PROJ, k3_kda, o),
    VEC("dt_bias", KD_PROJ, k3_kda, dt_bias, 0),
    VEC("A_log", KD_KDA_HEADS, k3_kda, decay_scale, TT_AT_LEAST),
};
static const tt_spec kda_full_gate[] = {MAT("g_proj.weight", TT_DENSE, KD_PROJ, KD_DIM, k3_kda, g)};
static const tt_spec kda_low_gate[] = {
    MAT("g_a_proj.weight", TT_DENSE, KD_KDA_DIM, KD_DIM, k3_kda, g_a),
    MAT("g_b_proj.weight", TT_DENSE, KD_PROJ, KD_KDA_DIM, k3_kda, g_b),
};
static const tt_spec mla[] = {
    MAT("q_a_proj.weight", TT_DENSE, KD_QLORA, KD_DIM, k3_mla, q_a),
    VEC("q_a_layernorm.weight", KD_QLORA, k3_mla, q_a_norm, 0),
    MAT("q_b_proj.weight", TT_DENSE, KD_QB, KD_QLORA, k3_mla, q_b),
    MAT("kv_a_proj_with_mqa.weight", TT_DENSE, KD_KVA, KD_DIM, k3_mla, kv_a),
    VEC("kv_a_layernorm.weight", KD_KVLORA, k3_mla, kv_a_norm, 0),
    MAT("kv_b_proj.weight", TT_DENSE, KD_KVB, KD_KVLORA, k3_mla, kv_b),
    MAT("g_proj.weight", TT_DENSE, KD_OV, KD_DIM, k3_mla, g),
    MAT("o_proj.weight", TT_DENSE, KD_DIM, KD_OV, k3_mla, o),
};
/* SiTU-GLU of KD_INTER: the dense MLP, or the fused shared experts. */
static const tt_spec glu[] = {
    MAT("gate_proj.weight", TT_DENSE, KD_INTER, KD_DIM, k3_layer, gate),
    MAT("up_proj.weight", TT_DENSE, KD_INTER, KD_DIM, k3_layer, up),
    MAT("down_proj.weight", TT_DENSE, KD_DIM, KD_INTER, k3_layer, down),
};
/* Routed experts as released: MXFP4 `weight_packed` + `weight_scale` (core/weights.h). */
static const tt_spec moe[] = {
    MAT("gate.weight", TT_DENSE, KD_EXPERTS, KD_DIM, k3_layer, router),
    VEC("gate.e_score_correction_bias", KD_EXPERTS, k3_layer, router_bias, 0),
    MAT("routed_expert_down_proj.weight", TT_DENSE, KD_LATENT, KD_DIM, k3_layer, lat_down),
    VEC("routed_expert_norm.weight", KD_LATENT, k3_layer, lat_norm, 0),
    MAT("routed_expert_up_proj.weight", TT_DENSE, KD_DIM, KD_LATENT, k3_layer, lat_up),
    MAT("experts.%d.w1.weight_packed", TT_ROUTED, KD_MOE_INTER, KD_LATENT, k3_layer, w1),
    MAT("experts.%d.w2.weight_packed", TT_ROUTED, KD_LATENT, KD_MOE_INTER, k3_layer, w2),
    MAT("experts.%d.w3.weight_packed", TT_ROUTED, KD_MOE_INTER, KD_LATENT, k3_layer, w3),
};
static const tt_spec top[] = {
    MAT("model.embed_tokens.weight", TT_LOOKUP, KD_VOCAB, KD_DIM, k3_model, embed),
    MAT("lm_head.weight", TT_DENSE, KD_VOCAB, KD_DIM, k3_model, head),
    VEC("model.norm.weight", KD_DIM, k3_model, final_norm, 0),
};
static const tt_spec res_out[] = {
    VEC("model.output_attn_res_norm.weight", KD_DIM, k3_model, out_res_norm, 0),
    VEC("model.output_attn_res_proj.weight", KD_DIM, k3_model, out_res_proj, 0),
};
#undef MAT
#undef VEC
#undef CONV
#define N(t) (int)(sizeof t / sizeof *t)

static void fill_dims(k3_model *k) {
    int *d = k->dims, h = k->n_heads;
    d[KD_DIM] = k->dim, d[KD_VOCAB] = k->vocab, d[KD_PROJ] = k->kda_heads * k->kda_dim, d[KD_KDA_DIM] = k->kda_dim;
    d[KD_KDA_HEADS] = k->kda_heads, d[KD_CONV] = k->conv_k, d[KD_QLORA] = k->q_lora;
    d[KD_QB] = h * (k->nope + k->rope), d[KD_KVA] = k->kv_lora + k->rope, d[KD_KVLORA] = k->kv_lora;
    d[KD_KVB] = h * (k->nope + k->v_dim), d[KD_OV] = h * k->v_dim, d[KD_EXPERTS] = k->n_experts;
    d[KD_LATENT] = k->latent, d[KD_MOE_INTER] = k->moe_inter;
}

/* Loads with names under `root` ("language_model." or "") + `sub`; KD_INTER = inter. */
typedef struct {
    tt_table *w;
    k3_model *k;
    const char *root;
} loader;

static int load_group(loader *ld, int layer, const char *sub, void *dst, const tt_spec *t, int n, int inter) {
    char p[160];
    int dims[KD_COUNT];
    memcpy(dims, ld->k->dims, sizeof dims);
    dims[KD_INTER] = inter;
    if (layer >= 0) snprintf(p, sizeof p, "%smodel.layers.%d.%s", ld->root, layer, sub);
    else snprintf(p, sizeof p, "%s%s", ld->root, sub);
    tt_group g = {.prefix = p, .dst = dst, .dims = dims, .layer = layer, .experts = ld->k->n_experts,
                  .active = ld->k->top_k};
    return tt_load(ld->w, t, n, &g);
}

static int load_kda(loader *ld, k3_kda *a, int i) {
    const k3_model *k = ld->k;
    if (load_group(ld, i, "self_attn.", a, kda, N(kda), 0) ||
        (k->full_rank_gate ? load_group(ld, i, "self_attn.", a, kda_full_gate, N(kda_full_gate), 0)
                           : load_group(ld, i, "self_attn.", a, kda_low_gate, N(kda_low_gate), 0)))
        return -1;
    /* A_log (its first num_heads values) becomes the per-head decay scale exp(A_log). */
    float *scale = (float *)a->decay_scale;
    for (int h = 0; h < k->kda_heads; h++) scale[h] = expf(scale[h]);
    return 0;
}

static int load_layer(loader *ld, k3_layer *l, int i) {
    const k3_model *k = ld->k;
    if (load_group(ld, i, "", l, norms, N(norms), 0) ||
        (k->res_block && i > 0 && load_group(ld, i, "", l, res_attn, N(res_attn), 0)) ||
        (k->res_block && load_group(ld, i, "", l, res_mlp, N(res_mlp), 0)) ||
        (l->kda ? load_kda(ld, &l->lin, i) : load_group(ld, i, "self_attn.", &l->mla, mla, N(mla), 0)))
        return -1;
    if (!l->sparse) return load_group(ld, i, "mlp.", l, glu, N(glu), k->inter);
    return load_group(ld, i, "block_sparse_moe.", l, moe, N(moe), 0) ||
           load_group(ld, i, "block_sparse_moe.shared_experts.", l, glu, N(glu), k->moe_inter * k->n_shared);
}

static void k3_free(model *m) {
    k3_model *k = m->priv;
    if (!k) return;
    for (int i = 0; k->layers && i < k->n_layers; i++) mla_absorbed_free(&k->layers[i].mla.absorbed);
    free(k->layers);
    free(k);
    m->priv = NULL;
}

/* The text model's keys sit under text_config (the release); a flat kimi_linear config works too.
 * Root-level bos/eos (read by model.c) take precedence; the text_config's fill in when absent. */
static int k3_load(model *m, char *err, size_t errlen) {
    k3_model *k = xcalloc(1, sizeof *k);
    m->priv = k;
    k->experts = m->experts;
    const cJSON *c = config_get(m->config, "text_config");
    if (!c) c = m->config;
    if (read_dims(k, c, err, errlen) || model_check_layers(m, k->n_layers, err, errlen) ||
        read_options(k, c, err, errlen))
        return -1;
    k->layers = xcalloc((size_t)k->n_layers, sizeof *k->layers);
    if (read_layer_kinds(k, c, err, errlen)) return -1;
    if (config_int_or(c, "max_position_embeddings", m->max_ctx, &m->max_ctx, err, errlen)) return -1;
    if (m->n_eos == 0) {
        const cJSON *eos = config_get(c, "eos_token_id");
        if (cJSON_IsNumber(eos)) m->eos_ids[m->n_eos++] = eos->valueint;
    }
    if (m->bos_id < 0 && config_int_or(c, "bos_token_id", -1, &m->bos_id, err, errlen)) return -1;
    fill_dims(k);
    loader ld = {&m->weights, k, st_find(m->st, "language_model.model.embed_tokens.weight") ? "language_model." : ""};
    for (int i = 0; i < k->n_layers; i++) {
        k3_layer *l = &k->layers[i];
        if (load_layer(&ld, l, i) ||
            (!l->kda && mla_absorb(&l->mla.absorbed, &l->mla.kv_b, k->n_heads, k->nope, k->v_dim, k->kv_lora, err, errlen)))
            return -1;
    }
    if (load_group(&ld, -1, "", k, top, N(top), 0) || (k->res_block && load_group(&ld, -1, "", k, res_out, N(res_out), 0)))
        return -1;
    m->vocab_size = k->vocab;
    m->pass_rows = K3_CHUNK;
    return 0;
}

/* ---- sequence state --------------------------------------------------------------------- */

static void k3_seq_free(model *m, void *fam_seq) {
    k3_seq *s = fam_seq;
    if (!s) return;
    free(s->kda);
    free(s->conv);
    free(s->kv);
    free(s->kda_part);
    free(s->conv_part);
    free(s);
}

static void *k3_seq_new(model *m, state *st, int ctx, arena *scratch, char *err, size_t errlen) {
    const k3_model *k = m->priv;
    k3_seq *s = xcalloc(1, sizeof *s);
    int L = k->n_layers, proj = k->kda_heads * k->kda_dim;
    s->st = st;
    s->scratch = scratch;
    s->cap = ctx;
    s->kda = xcalloc((size_t)L, sizeof *s->kda);
    s->conv = xcalloc((size_t)L, sizeof *s->conv);
    s->kv = xcalloc((size_t)L, sizeof *s->kv);
    s->kda_part = xcalloc((size_t)L, sizeof *s->kda_part);
    s->conv_part = xcalloc((size_t)L, sizeof *s->conv_part);
    char name[48];
    for (int i = 0; i < L; i++) {
        if (k->layers[i].kda) {
            size_t mats = (size_t)k->kda_heads * k->kda_dim * k->kda_dim * sizeof(float);
            size_t wins = (size_t)3 * proj * (k->conv_k - 1) * sizeof(float);
            snprintf(name, sizeof name, "L%d.kda", i);
            s->kda_part[i] = st->nparts;
            if (!(s->kda[i] = state_add_part(st, PART_RECUR, name, mats, 1, 1, 0))) goto oom;
            snprintf(name, sizeof name, "L%d.conv", i);
            s->conv_part[i] = st->nparts;
            /* A kernel of 1 keeps no window; the part still exists (one float) so layouts stay uniform. */
            if (!(s->conv[i] = state_add_part(st, PART_RECUR, name, wins ? wins : sizeof(float), 1, 1, 0))) goto oom;
        } else {
            snprintf(name, sizeof name, "L%d.kv", i);
            if (!(s->kv[i] = state_add_part(st, PART_ROWS, name, (size_t)(k->kv_lora + k->rope) * sizeof(float), ctx,
                                            1, 0)))
                goto oom;
        }
    }
    return s;
oom:
    errf(err, errlen, "out of memory allocating the state of %d positions (%s)", ctx, name);
    k3_seq_free(m, s);
    return NULL;
}

/* ---- reports ---------------------------------------------------------------------------- */

/* Beyond the table's matrices: the KDA state update and read (about 4 * heads * d^2) and the
 * absorbed MLA scores and values over pos + 1 rows. */
static double k3_extra_flops(const model *m, int pos) {
    const k3_model *k = m->priv;
    double f = 0;
    for (int i = 0; i < k->n_layers; i++)
        f += k->layers[i].kda ? 4.0 * k->kda_heads * k->kda_dim * k->kda_dim
                              : 2.0 * k->n_heads * (pos + 1) * (k->kv_lora + k->rope);
    return 2.0 * f;
}

static const char *const k3_model_types[] = {"kimi_k3", NULL};

/* K3 has no role tokens: every message ends with <|end_of_msg|>, and the next one (user or
 * assistant alike) opens right after it with <|open|>; a rendered conversation starts with it. */
const family_ops kimi_k3_ops = {
    .name = "kimi_k3",
    .model_types = k3_model_types,
    .chat = &kimi_k3_chat,
    .turns = {.start = {"<|open|>"}, .user = "<|end_of_msg|>", .assistant = "<|end_of_msg|>"},
    .truncates = 0,   /* the KDA matrices and short-conv windows cannot rewind */
    .load = k3_load,
    .free = k3_free,
    .scratch_bytes = k3_scratch_bytes,
    .seq_new = k3_seq_new,
    .seq_free = k3_seq_free,
    .forward = k3_forward,
    .extra_flops = k3_extra_flops,
    .expert = k3_expert,
    .expert_scratch = k3_expert_scratch,
};
