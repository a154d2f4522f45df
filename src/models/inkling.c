/* inkling.c — Inkling family: config.json, tensor lookup/validation for both checkpoint layouts,
 * the sequence state layout and the audio input. The forward pass is in inkling_forward.c; the
 * module's invariants are in inkling.h.
 *
 * LAYOUTS. The Hugging Face layout (InklingForConditionalGeneration: model.language_model.*,
 * experts fused as [E, 2I, D] with all gate rows first) and the released raw layout (model.llm.*,
 * attn.wq_du / mlp.w13_dn / experts.w13_weight / shared_experts.shared_w13_weight, gate and up
 * rows interleaved) are both read in place: a fused matrix stays one matrix and the SwiGLU reads
 * its gate and up rows where the layout puts them, so nothing is copied or reordered at load.
 * The raw layout is recognised by its embedding tensor `model.llm.embed.weight`.
 *
 * CONFIG follows configuration_inkling.py: text keys under `text_config` (or at the top level of a
 * flat text config), its defaults and __post_init__ (layer_types from local_layer_ids or the
 * every-sixth-is-global rule, mlp_layer_types from dense_mlp_idx, dense_intermediate_size
 * overriding intermediate_size, sconv_kernel_size as conv_kernel_size); audio_config n_mel_bins /
 * mel_vocab_size; audio_token_id at the top level. model.mtp.* tensors are ignored, as HF does. */
#include "inkling.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/config.h"
#include "../core/quant.h"
#include "../core/util.h"


/* ---- config ----------------------------------------------------------------------------- */

static const cJSON *text_config(const cJSON *c) {
    const cJSON *t = config_get(c, "text_config");
    return cJSON_IsObject(t) ? t : c;
}

static int read_dims(ink_model *g, const cJSON *t, char *err, size_t errlen) {
    double eps, alpha, scale, div;
    /* log_scaling_n_floor: null or absent (HF default None) turns log scaling off */
    int floor_set = cJSON_IsNumber(config_get(t, "log_scaling_n_floor"));
    if (floor_set && config_int(t, "log_scaling_n_floor", &g->log_floor, err, errlen)) return -1;
    if (config_int_or(t, "vocab_size", 201024, &g->vocab, err, errlen) ||
        config_int_or(t, "unpadded_vocab_size", 0, &g->unpadded, err, errlen) ||
        config_int_or(t, "hidden_size", 6144, &g->dim, err, errlen) ||
        config_int_or(t, "num_hidden_layers", 66, &g->n_layers, err, errlen) ||
        config_int_or(t, "sliding_window_size", 512, &g->window, err, errlen) ||
        config_int_or(t, "d_rel", 16, &g->d_rel, err, errlen) ||
        config_int_or(t, "n_routed_experts", 256, &g->n_experts, err, errlen) ||
        config_int_or(t, "num_experts_per_tok", 6, &g->top_k, err, errlen) ||
        config_int_or(t, "n_shared_experts", 2, &g->n_shared, err, errlen) ||
        config_int_or(t, "moe_intermediate_size", 3072, &g->moe_inter, err, errlen) ||
        config_double_or(t, "rms_norm_eps", 1e-6, &eps, err, errlen) ||
        config_double_or(t, "log_scaling_alpha", 0.1, &alpha, err, errlen) ||
        config_double_or(t, "route_scale", 8.0, &scale, err, errlen) ||
        config_double_or(t, "logits_mup_width_multiplier", 24.0, &div, err, errlen))
        return -1;
    int k = 4;
    if (config_int_or(t, "conv_kernel_size", 4, &k, err, errlen) ||
        config_int_or(t, "sconv_kernel_size", k, &g->conv_k, err, errlen))
        return -1;
    if (g->vocab < 1 || g->dim < 1 || g->n_layers < 1 || g->window < 1 || g->d_rel < 1 || g->n_experts < 1 ||
        g->moe_inter < 1)
        return errf(err, errlen, "config.json: text_config dimensions must be positive");
    if (g->unpadded < 0 || g->unpadded > g->vocab)
        return errf(err, errlen, "config.json: unpadded_vocab_size %d must be in [1, vocab_size %d]", g->unpadded, g->vocab);
    if (!g->unpadded) g->unpadded = g->vocab;
    if (g->top_k < 1 || g->top_k > g->n_experts)
        return errf(err, errlen, "config.json: num_experts_per_tok %d must be in [1, n_routed_experts]", g->top_k);
    if (g->n_shared < 1)
        return errf(err, errlen, "config.json: n_shared_experts %d: the router's shared logits need at least one",
                    g->n_shared);
    if (g->conv_k < 1 || g->conv_k > INK_CONV_MAX)
        return errf(err, errlen, "config.json: sconv_kernel_size %d must be in [1, %d]", g->conv_k, INK_CONV_MAX);
    if (floor_set && g->log_floor < 1)
        return errf(err, errlen, "config.json: log_scaling_n_floor %d must be >= 1 (or null)", g->log_floor);
    if (!(div > 0)) return errf(err, errlen, "config.json: logits_mup_width_multiplier must be positive");
    g->eps = (float)eps, g->log_alpha = (float)alpha, g->route_scale = (float)scale, g->logit_div = (float)div;
    return 0;
}

/* layer_types, else local_layer_ids, else sliding iff (i+1) % 6 != 0; each with its head shape. */
static int read_layer_types(ink_model *g, const cJSON *t, char *err, size_t errlen) {
    const cJSON *types = config_get(t, "layer_types"), *local = config_get(t, "local_layer_ids");
    int h, kv, hd, sh, skv, shd, extent;
    if (config_int_or(t, "num_attention_heads", 64, &h, err, errlen) ||
        config_int_or(t, "num_key_value_heads", 8, &kv, err, errlen) ||
        config_int_or(t, "head_dim", 128, &hd, err, errlen) ||
        config_int_or(t, "swa_num_attention_heads", 64, &sh, err, errlen) ||
        config_int_or(t, "swa_num_key_value_heads", 16, &skv, err, errlen) ||
        config_int_or(t, "swa_head_dim", 128, &shd, err, errlen) ||
        config_int_or(t, "rel_extent", 1024, &extent, err, errlen))
        return -1;
    if (h < 1 || kv < 1 || h % kv || hd < 1 || sh < 1 || skv < 1 || sh % skv || shd < 1 || extent < 1)
        return errf(err, errlen, "config.json: attention heads must be positive and a multiple of the key/value heads");
    if (cJSON_IsArray(local))
        for (int i = 0; i < g->n_layers; i++) g->layers[i].sliding = 0;
    const cJSON *e;
    if (!types && cJSON_IsArray(local)) cJSON_ArrayForEach(e, local) {
        if (!cJSON_IsNumber(e)) return errf(err, errlen, "config.json: local_layer_ids must hold integers");
        if (e->valueint >= 0 && e->valueint < g->n_layers) g->layers[e->valueint].sliding = 1;
    }
    for (int i = 0; i < g->n_layers; i++) {
        ink_layer *l = &g->layers[i];
        if (types) {
            const cJSON *ty = cJSON_GetArrayItem(types, i);
            if (!cJSON_IsString(ty) || (strcmp(ty->valuestring, "hybrid_sliding") && strcmp(ty->valuestring, "hybrid")))
                return errf(err, errlen, "config.json: layer_types[%d] must be \"hybrid_sliding\" or \"hybrid\"", i);
            l->sliding = !strcmp(ty->valuestring, "hybrid_sliding");
        } else if (!cJSON_IsArray(local))
            l->sliding = (i + 1) % 6 != 0;
        l->heads = l->sliding ? sh : h;
        l->kv_heads = l->sliding ? skv : kv;
        l->head_dim = l->sliding ? shd : hd;
        l->extent = l->sliding ? g->window : extent;
    }
    return 0;
}

static int read_mlp_types(ink_model *g, const cJSON *t, char *err, size_t errlen) {
    const cJSON *types = config_get(t, "mlp_layer_types");
    int dense_idx, inter;
    if (config_int_or(t, "dense_mlp_idx", 0, &dense_idx, err, errlen) ||
        config_int_or(t, "intermediate_size", 24576, &inter, err, errlen) ||
        config_int_or(t, "dense_intermediate_size", inter, &inter, err, errlen))
        return -1;
    if (inter < 1) return errf(err, errlen, "config.json: intermediate_size must be positive");
    for (int i = 0; i < g->n_layers; i++) {
        ink_layer *l = &g->layers[i];
        if (!types) l->sparse = i >= dense_idx;
        else {
            const cJSON *ty = cJSON_GetArrayItem(types, i);
            if (!cJSON_IsString(ty) || (strcmp(ty->valuestring, "dense") && strcmp(ty->valuestring, "sparse")))
                return errf(err, errlen, "config.json: mlp_layer_types[%d] must be \"dense\" or \"sparse\"", i);
            l->sparse = !strcmp(ty->valuestring, "sparse");
        }
        l->mlp.inter = l->sparse ? g->moe_inter : inter;
    }
    return 0;
}

static int read_audio(ink_model *g, const cJSON *c, char *err, size_t errlen) {
    const cJSON *a = config_get(c, "audio_config");
    g->n_mel = 80, g->mel_vocab = 256;          /* InklingAudioConfig defaults */
    if (config_int_or(c, "audio_token_id", 200021, &g->audio_token, err, errlen) ||
        (a && (config_int_or(a, "n_mel_bins", 80, &g->n_mel, err, errlen) ||
               config_int_or(a, "mel_vocab_size", 256, &g->mel_vocab, err, errlen))))
        return -1;
    if (g->n_mel < 1 || g->mel_vocab < 1 || g->mel_vocab > 256)
        return errf(err, errlen, "config.json: audio_config n_mel_bins must be >= 1 and mel_vocab_size in [1, 256]");
    return 0;
}

/* ---- tensors ---------------------------------------------------------------------------- */

/* The tensor table (core/tensor_table.h): name[0] is the Hugging Face layout's, name[1] the
 * released raw layout's (NULL: the same). Fused gate/up matrices stay one matrix, stacked experts
 * one tensor: the SwiGLU reads gate and up rows where the layout puts them. */
#define MAT(hf, raw, role, d0, d1, type, field) {{hf, raw}, TT_MAT, role, 0, 2, {d0, d1}, offsetof(type, field), 0}
#define VEC(hf, raw, d0, type, field) {{hf, raw}, TT_F32, TT_DENSE, 0, 1, {d0}, offsetof(type, field), 0}
#define CONV(hf, raw, ch, field) {{hf, raw}, TT_F32, TT_DENSE, 0, 3, {ch, TT_ONE, ID_CONV}, offsetof(ink_layer, field), 0}
#define STACK(hf, raw, role, d0, d1, d2, field) {{hf, raw}, TT_STACK, role, 0, 3, {d0, d1, d2}, offsetof(ink_layer, field), 0}
static const tt_spec attention[] = {
    VEC("input_layernorm.weight", "attn_norm.weight", ID_DIM, ink_layer, attn_norm),
    VEC("post_attention_layernorm.weight", "mlp_norm.weight", ID_DIM, ink_layer, mlp_norm),
    MAT("self_attn.q_proj.weight", "attn.wq_du.weight", TT_DENSE, ID_QD, ID_DIM, ink_layer, q),
    MAT("self_attn.k_proj.weight", "attn.wk_dv.weight", TT_DENSE, ID_KVD, ID_DIM, ink_layer, k),
    MAT("self_attn.v_proj.weight", "attn.wv_dv.weight", TT_DENSE, ID_KVD, ID_DIM, ink_layer, v),
    MAT("self_attn.r_proj.weight", "attn.wr_du.weight", TT_DENSE, ID_RD, ID_DIM, ink_layer, r),
    MAT("self_attn.o_proj.weight", "attn.wo_ud.weight", TT_DENSE, ID_DIM, ID_QD, ink_layer, o),
    VEC("self_attn.q_norm.weight", "attn.q_norm.weight", ID_HD, ink_layer, q_norm),
    VEC("self_attn.k_norm.weight", "attn.k_norm.weight", ID_HD, ink_layer, k_norm),
    CONV("self_attn.k_sconv.conv1d.weight", "attn.k_sconv.weight", ID_KVD, conv_k),
    CONV("self_attn.v_sconv.conv1d.weight", "attn.v_sconv.weight", ID_KVD, conv_v),
    {{"self_attn.rel_logits_proj.proj", "attn.rel_logits_proj.proj"}, TT_F32, TT_DENSE, 0, 2, {ID_DREL, ID_EXTENT},
     offsetof(ink_layer, rel), 0},
    CONV("attn_sconv.conv1d.weight", "attn_sconv.weight", ID_DIM, conv_attn),
    CONV("mlp_sconv.conv1d.weight", "mlp_sconv.weight", ID_DIM, conv_mlp),
};
static const tt_spec dense_hf[] = {
    MAT("mlp.gate_proj.weight", NULL, TT_DENSE, ID_INTER, ID_DIM, ink_layer, mlp.gate),
    MAT("mlp.up_proj.weight", NULL, TT_DENSE, ID_INTER, ID_DIM, ink_layer, mlp.up),
    MAT("mlp.down_proj.weight", NULL, TT_DENSE, ID_DIM, ID_INTER, ink_layer, mlp.down),
    VEC("mlp.global_scale", NULL, TT_ONE, ink_layer, mlp_scale),
};
static const tt_spec dense_raw[] = {
    MAT("mlp.w13_dn.weight", NULL, TT_DENSE, ID_2INTER, ID_DIM, ink_layer, mlp.fused),
    MAT("mlp.w2_md.weight", NULL, TT_DENSE, ID_DIM, ID_INTER, ink_layer, mlp.down),
    VEC("mlp.global_scale", NULL, TT_ONE, ink_layer, mlp_scale),
};
static const tt_spec router[] = {
    MAT("mlp.gate.weight", NULL, TT_DENSE, ID_ROUTER, ID_DIM, ink_layer, router),
    VEC("mlp.gate.global_scale", NULL, TT_ONE, ink_layer, router_scale),
    VEC("mlp.gate.e_score_correction_bias", "mlp.gate.bias", ID_EXPERTS, ink_layer, router_bias),
};
static const tt_spec experts_hf[] = {
    STACK("mlp.experts.gate_up_proj", NULL, TT_ROUTED, ID_EXPERTS, ID_2MOE_INTER, ID_DIM, ex_gate_up),
    STACK("mlp.experts.down_proj", NULL, TT_ROUTED, ID_EXPERTS, ID_DIM, ID_MOE_INTER, ex_down),
    STACK("mlp.shared_experts.gate_proj", NULL, TT_SHARED, ID_SHARED, ID_MOE_INTER, ID_DIM, sh_gate_up),
    STACK("mlp.shared_experts.up_proj", NULL, TT_SHARED, ID_SHARED, ID_MOE_INTER, ID_DIM, sh_up),
    STACK("mlp.shared_experts.down_proj", NULL, TT_SHARED, ID_SHARED, ID_DIM, ID_MOE_INTER, sh_down),
};
static const tt_spec experts_raw[] = {
    STACK("mlp.experts.w13_weight", NULL, TT_ROUTED, ID_EXPERTS, ID_2MOE_INTER, ID_DIM, ex_gate_up),
    STACK("mlp.experts.w2_weight", NULL, TT_ROUTED, ID_EXPERTS, ID_DIM, ID_MOE_INTER, ex_down),
    STACK("mlp.shared_experts.shared_w13_weight", NULL, TT_SHARED, ID_SHARED, ID_2MOE_INTER, ID_DIM, sh_gate_up),
    STACK("mlp.shared_experts.shared_w2_weight", NULL, TT_SHARED, ID_SHARED, ID_DIM, ID_MOE_INTER, sh_down),
};
static const tt_spec top[] = {
    MAT("model.language_model.embed_tokens.weight", "model.llm.embed.weight", TT_LOOKUP, ID_VOCAB, ID_DIM, ink_model,
        embed),
    VEC("model.language_model.embed_tokens.embed_norm.weight", "model.llm.embed_norm.weight", ID_DIM, ink_model,
        embed_norm),
    VEC("model.language_model.norm.weight", "model.llm.norm.weight", ID_DIM, ink_model, final_norm),
    MAT("lm_head.weight", "model.llm.unembed.weight", TT_DENSE, ID_VOCAB, ID_DIM, ink_model, head),
};
/* The audio tower: read at audio placeholders only, so no text token's decode step reads it. */
static const tt_spec audio[] = {
    MAT("model.audio_tower.embed_audio_tokens.embed_audio_tokens.weight", "model.audio.encoder.weight", TT_IDLE,
        ID_AUDIO_ROWS, ID_DIM, ink_model, audio_embed),
    {{"model.audio_tower.norm.weight", "model.audio.final_norm.weight"}, TT_F32, TT_IDLE, 0, 1, {ID_DIM},
     offsetof(ink_model, audio_norm), 0},
};
#undef MAT
#undef VEC
#undef CONV
#undef STACK
#define N(t) (int)(sizeof t / sizeof *t)

static void fill_dims(ink_model *g) {
    int *d = g->dims;
    d[ID_DIM] = g->dim, d[ID_VOCAB] = g->vocab, d[ID_DREL] = g->d_rel, d[ID_CONV] = g->conv_k;
    d[ID_ROUTER] = g->n_experts + g->n_shared, d[ID_EXPERTS] = g->n_experts, d[ID_SHARED] = g->n_shared;
    d[ID_MOE_INTER] = g->moe_inter, d[ID_2MOE_INTER] = 2 * g->moe_inter, d[ID_AUDIO_ROWS] = g->n_mel * g->mel_vocab;
}

ink_glu ink_glu_with(const ink_glu *u, const qmat *w) {
    ink_glu v = *u;
    if (u->layout == GLU_SPLIT) v.gate = w[0], v.up = w[1], v.down = w[2];
    else v.fused = w[0], v.down = w[1];
    return v;
}

/* The SwiGLUs of a sparse layer, built from the stacked matrices as the layout fuses them. */
static void build_glus(ink_model *g, ink_layer *l, int raw) {
    l->experts = xcalloc((size_t)g->n_experts, sizeof *l->experts);
    l->shared = xcalloc((size_t)g->n_shared, sizeof *l->shared);
    for (int e = 0; e < g->n_experts; e++)
        l->experts[e] = (ink_glu){.layout = raw ? GLU_INTERLEAVED : GLU_HALVES, .fused = l->ex_gate_up[e],
                                  .down = l->ex_down[e], .inter = g->moe_inter};
    for (int e = 0; e < g->n_shared; e++) {
        ink_glu *u = &l->shared[e];
        *u = (ink_glu){.layout = raw ? GLU_INTERLEAVED : GLU_SPLIT, .down = l->sh_down[e], .inter = g->moe_inter};
        if (raw) u->fused = l->sh_gate_up[e];
        else u->gate = l->sh_gate_up[e], u->up = l->sh_up[e];
    }
}

static int load_layer(tt_table *w, ink_model *g, ink_layer *l, int i, int raw) {
    char p[96];
    int *d = g->dims, taps = l->kv_heads * l->head_dim * g->conv_k;
    snprintf(p, sizeof p, raw ? "model.llm.layers.%d." : "model.language_model.layers.%d.", i);
    d[ID_QD] = l->heads * l->head_dim, d[ID_KVD] = l->kv_heads * l->head_dim, d[ID_RD] = l->heads * g->d_rel;
    d[ID_HD] = l->head_dim, d[ID_EXTENT] = l->extent, d[ID_INTER] = l->mlp.inter, d[ID_2INTER] = 2 * l->mlp.inter;
    tt_group grp = {.prefix = p, .dst = l, .dims = d, .variant = raw, .layer = i, .experts = g->n_experts,
                    .active = g->top_k};
    l->mlp.layout = raw ? GLU_INTERLEAVED : GLU_SPLIT;
    if (tt_load(w, attention, N(attention), &grp) ||
        (l->sparse ? tt_load(w, router, N(router), &grp) ||
                         (raw ? tt_load(w, experts_raw, N(experts_raw), &grp) : tt_load(w, experts_hf, N(experts_hf), &grp))
                   : raw ? tt_load(w, dense_raw, N(dense_raw), &grp) : tt_load(w, dense_hf, N(dense_hf), &grp)))
        return -1;
    l->conv_kv = xmalloc(2 * (size_t)taps * sizeof *l->conv_kv);
    memcpy(l->conv_kv, l->conv_k, (size_t)taps * sizeof *l->conv_k);
    memcpy(l->conv_kv + taps, l->conv_v, (size_t)taps * sizeof *l->conv_v);
    if (l->sparse) build_glus(g, l, raw);
    return 0;
}

static void inkling_free(model *m) {
    ink_model *g = m->priv;
    if (!g) return;
    for (int i = 0; g->layers && i < g->n_layers; i++) {
        free(g->layers[i].experts);
        free(g->layers[i].shared);
        free(g->layers[i].conv_kv);
    }
    free(g->layers);
    free(g);
    m->priv = NULL;
}

/* Stop ids and context length live in text_config for the multimodal config. */
static int read_generation(model *m, const cJSON *t, char *err, size_t errlen) {
    const cJSON *eos = config_get(t, "eos_token_id");
    m->n_eos = 0;
    if (cJSON_IsNumber(eos)) m->eos_ids[m->n_eos++] = eos->valueint;
    const cJSON *e;
    if (cJSON_IsArray(eos)) cJSON_ArrayForEach(e, eos) if (cJSON_IsNumber(e) && m->n_eos < 8) m->eos_ids[m->n_eos++] = e->valueint;
    m->bos_id = -1;                     /* no token opens an Inkling conversation */
    return config_int_or(t, "max_position_embeddings", 131072, &m->max_ctx, err, errlen);
}

static int inkling_load(model *m, char *err, size_t errlen) {
    ink_model *g = xcalloc(1, sizeof *g);
    m->priv = g;
    g->experts = m->experts;
    const cJSON *t = text_config(m->config);
    if (read_dims(g, t, err, errlen) || model_check_layers(m, g->n_layers, err, errlen)) return -1;
    g->layers = xcalloc((size_t)g->n_layers, sizeof *g->layers);
    if (read_layer_types(g, t, err, errlen) || read_mlp_types(g, t, err, errlen) ||
        read_audio(g, m->config, err, errlen) || read_generation(m, t, err, errlen))
        return -1;
    int raw = st_find(m->st, "model.llm.embed.weight") != NULL;
    tt_table *w = &m->weights;
    fill_dims(g);
    for (int i = 0; i < g->n_layers; i++)
        if (load_layer(w, g, &g->layers[i], i, raw)) return -1;
    tt_group grp = {.prefix = "", .dst = g, .dims = g->dims, .variant = raw, .layer = -1};
    if (tt_load(w, top, N(top), &grp)) return -1;
    /* The audio tower is optional (a text-only checkpoint); when one of its tensors is present
     * both must be well formed. */
    if (!st_find(m->st, audio[0].name[raw]) && !st_find(m->st, audio[1].name[raw])) g->audio_token = -1;
    else if (tt_load(w, audio, N(audio), &grp)) return -1;
    if (g->audio_token >= g->vocab) g->audio_token = -1;
    m->vocab_size = g->unpadded;
    m->pass_rows = INK_CHUNK;
    m->media_token = g->audio_token;
    return 0;
}

/* ---- sequence state --------------------------------------------------------------------- */

static int add_part(state *st, ink_part *p, part_kind kind, const char *name, size_t row_bytes, int rows) {
    p->buf = state_add_part(st, kind, name, row_bytes, rows, 1, 0);
    p->part = st->nparts - 1;
    return p->buf ? 0 : -1;
}

static void inkling_seq_free(model *m, void *fam_seq) {
    ink_seq *s = fam_seq;
    if (!s) return;
    free(s->layers);
    free(s->audio);
    free(s);
}

static void *inkling_seq_new(model *m, state *st, int ctx, arena *scratch, char *err, size_t errlen) {
    ink_model *g = m->priv;
    ink_seq *s = xcalloc(1, sizeof *s);
    s->scratch = scratch;
    s->layers = xcalloc((size_t)g->n_layers, sizeof *s->layers);
    s->st = st;
    s->cap = ctx;
    size_t hist = (size_t)(g->conv_k - 1 > 0 ? g->conv_k - 1 : 1) * sizeof(float);
    char name[48];
    for (int i = 0; i < g->n_layers; i++) {
        const ink_layer *l = &g->layers[i];
        ink_layer_state *ls = &s->layers[i];
        size_t kvd = (size_t)l->kv_heads * l->head_dim;
        snprintf(name, sizeof name, l->sliding ? "L%d.ring" : "L%d.kv", i);
        if (add_part(st, &ls->kv, l->sliding ? PART_RING : PART_ROWS, name, 2 * kvd * sizeof(float),
                     l->sliding ? g->window : ctx))
            goto oom;
        snprintf(name, sizeof name, "L%d.kvconv", i);
        if (add_part(st, &ls->conv_kv, PART_RECUR, name, hist * 2 * kvd, 1)) goto oom;
        snprintf(name, sizeof name, "L%d.aconv", i);
        if (add_part(st, &ls->conv_attn, PART_RECUR, name, hist * (size_t)g->dim, 1)) goto oom;
        snprintf(name, sizeof name, "L%d.mconv", i);
        if (add_part(st, &ls->conv_mlp, PART_RECUR, name, hist * (size_t)g->dim, 1)) goto oom;
    }
    return s;
oom:
    errf(err, errlen, "out of memory allocating the state of %d positions (%s)", ctx, name);
    inkling_seq_free(m, s);
    return NULL;
}

/* DMel frames for the next feeds: [frames][n_mel] levels below mel_vocab_size, consumed in order
 * by audio placeholder ids. NULL clears. Returns the frame count. */
static int inkling_set_media(model *m, void *fam_seq, const unsigned char *bytes, size_t len, char *err, size_t errlen) {
    ink_model *g = m->priv;
    ink_seq *s = fam_seq;
    free(s->audio);
    s->audio = NULL;
    s->audio_frames = s->audio_used = 0;
    if (!bytes) return 0;
    if (g->audio_token < 0) return errf(err, errlen, "audio: this checkpoint has no audio tower");
    if (len == 0 || len % (size_t)g->n_mel)
        return errf(err, errlen, "audio: %zu DMel bytes is not a whole number of %d-bin frames", len, g->n_mel);
    for (size_t i = 0; i < len; i++)
        if (bytes[i] >= g->mel_vocab)
            return errf(err, errlen, "audio: DMel level %u at byte %zu is not below mel_vocab_size %d", bytes[i], i,
                        g->mel_vocab);
    s->audio = xmalloc(len);
    memcpy(s->audio, bytes, len);
    s->audio_frames = (int)(len / (size_t)g->n_mel);
    return s->audio_frames;
}

/* ---- reports ---------------------------------------------------------------------------- */

/* Multiply-adds x2 beyond the table's matrices at position pos: the convs, the relative bias and
 * attention over the attended keys. */
static double inkling_extra_flops(const model *m, int pos) {
    const ink_model *g = m->priv;
    double f = 0;
    for (int i = 0; i < g->n_layers; i++) {
        const ink_layer *l = &g->layers[i];
        int keys = l->sliding ? MIN(pos + 1, g->window) : pos + 1;
        double kvd = (double)l->kv_heads * l->head_dim;
        f += (2 * kvd + 2.0 * g->dim) * g->conv_k + (double)l->heads * g->d_rel * l->extent;
        f += 2.0 * l->heads * keys * l->head_dim;
    }
    return 2.0 * f;
}

static const char *const inkling_model_types[] = {"inkling_mm_model", NULL};

const family_ops inkling_ops = {
    .name = "inkling",
    .model_types = inkling_model_types,
    .chat = &inkling_chat,
    /* no token opens a conversation (vLLM's renderer); system and tool messages are boundaries */
    .turns = {.user = "<|message_user|>", .assistant = "<|message_model|>",
              .boundaries = {"<|message_system|>", "<|message_tool|>"}},
    .truncates = 0,   /* sliding rings and short-conv windows: rewinds go through checkpoints */
    .load = inkling_load,
    .free = inkling_free,
    .scratch_bytes = inkling_scratch_bytes,
    .seq_new = inkling_seq_new,
    .seq_free = inkling_seq_free,
    .forward = inkling_forward,
    .set_media = inkling_set_media,
    .extra_flops = inkling_extra_flops,
    .expert = inkling_expert,
    .expert_scratch = inkling_expert_scratch,
};
