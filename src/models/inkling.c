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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/config.h"
#include "../core/quant.h"
#include "../core/util.h"

#define NAME_LEN 192

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
    if (g->conv_k < 1 || g->conv_k > 16) return errf(err, errlen, "config.json: sconv_kernel_size %d must be in [1, 16]", g->conv_k);
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

typedef struct {
    ink_model *g;
    const st_file *f;
    int raw;                  /* released layout */
    char *err;
    size_t errlen;
} loader;

static const char *tname(char *buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *tname(char *buf, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, NAME_LEN, fmt, ap);
    va_end(ap);
    return buf;
}

static void *own(ink_model *g, void *p) {
    if (g->n_owned == g->cap_owned) {
        g->cap_owned = g->cap_owned ? 2 * g->cap_owned : 64;
        g->owned = xrealloc(g->owned, (size_t)g->cap_owned * sizeof *g->owned);
    }
    return g->owned[g->n_owned++] = p;
}

/* A tensor of BF16 or F32 with exactly the given shape. */
static const st_tensor *tensor(loader *ld, const char *name, int ndim, const int64_t *shape) {
    const st_tensor *t = st_find(ld->f, name);
    if (!t) { errf(ld->err, ld->errlen, "missing tensor %s", name); return NULL; }
    int ok = t->ndim == ndim && (t->type == DT_BF16 || t->type == DT_F32);
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[96] = "", *p = want;
        for (int i = 0; i < ndim; i++) p += snprintf(p, (size_t)(want + sizeof want - p), "%s%lld", i ? "," : "", (long long)shape[i]);
        errf(ld->err, ld->errlen, "tensor %s in %s: expected BF16 or F32 [%s], found %s with %d dims [%lld,...]", name,
             t->file, want, dtype_name(t->type), t->ndim, (long long)t->shape[0]);
        return NULL;
    }
    ld->g->n_validated++;
    return t;
}

static int get_mat(loader *ld, qmat *out, const char *name, int rows, int cols) {
    const st_tensor *t = tensor(ld, name, 2, (int64_t[]){rows, cols});
    if (!t) return -1;
    *out = (qmat){.fmt = t->type == DT_BF16 ? WF_BF16 : WF_F32, .rows = rows, .cols = cols, .data = t->data};
    return 0;
}

/* Matrix e of a stacked [count, rows, cols] tensor, read in place. */
static int get_stacked(loader *ld, qmat *out, const char *name, int count, int rows, int cols) {
    const st_tensor *t = tensor(ld, name, 3, (int64_t[]){count, rows, cols});
    if (!t) return -1;
    size_t stride = (size_t)rows * cols * dtype_size(t->type);
    for (int e = 0; e < count; e++)
        out[e] = (qmat){.fmt = t->type == DT_BF16 ? WF_BF16 : WF_F32, .rows = rows, .cols = cols,
                        .data = (const unsigned char *)t->data + (size_t)e * stride};
    return 0;
}

/* Any small BF16/F32 tensor of n elements (given shape) as an owned f32 copy. */
static float *get_floats(loader *ld, const char *name, int ndim, const int64_t *shape) {
    const st_tensor *t = tensor(ld, name, ndim, shape);
    if (!t) return NULL;
    size_t n = t->nbytes / dtype_size(t->type);
    float *v = own(ld->g, xmalloc(n * sizeof *v));
    for (size_t i = 0; i < n; i++)
        v[i] = t->type == DT_F32 ? ((const float *)t->data)[i] : bf16_to_f32(((const uint16_t *)t->data)[i]);
    return v;
}

static float *get_vec(loader *ld, const char *name, int n) { return get_floats(ld, name, 1, (int64_t[]){n}); }

/* Depthwise conv weight [channels, 1, K] -> [channels][K]. */
static float *get_conv(loader *ld, const char *name, int channels) {
    return get_floats(ld, name, 3, (int64_t[]){channels, 1, ld->g->conv_k});
}

static int get_scalar(loader *ld, const char *name, float *out) {
    float *v = get_vec(ld, name, 1);
    if (!v) return -1;
    *out = v[0];
    return 0;
}

/* Dense MLP: HF gate_proj/up_proj/down_proj, raw w13_dn (interleaved) / w2_md. */
static int load_dense(loader *ld, ink_layer *l, const char *p) {
    char n[NAME_LEN];
    int d = ld->g->dim, in = l->mlp.inter;
    if (ld->raw) {
        l->mlp.layout = GLU_INTERLEAVED;
        if (get_mat(ld, &l->mlp.fused, tname(n, "%smlp.w13_dn.weight", p), 2 * in, d) ||
            get_mat(ld, &l->mlp.down, tname(n, "%smlp.w2_md.weight", p), d, in))
            return -1;
    } else {
        l->mlp.layout = GLU_SPLIT;
        if (get_mat(ld, &l->mlp.gate, tname(n, "%smlp.gate_proj.weight", p), in, d) ||
            get_mat(ld, &l->mlp.up, tname(n, "%smlp.up_proj.weight", p), in, d) ||
            get_mat(ld, &l->mlp.down, tname(n, "%smlp.down_proj.weight", p), d, in))
            return -1;
    }
    return get_scalar(ld, tname(n, "%smlp.global_scale", p), &l->mlp_scale);
}

/* Stacked SwiGLUs: fused gate/up [count, 2I, D] (halves or interleaved) or separate gate and up
 * [count, I, D], and down [count, D, I]. */
static int load_glus(loader *ld, ink_glu **out, int count, glu_layout layout, const char *gu, const char *up,
                     const char *down) {
    ink_model *g = ld->g;
    int d = g->dim, in = g->moe_inter;
    ink_glu *e = *out = xcalloc((size_t)count, sizeof *e);
    qmat *a = xcalloc((size_t)count, sizeof *a), *b = xcalloc((size_t)count, sizeof *b), *c = xcalloc((size_t)count, sizeof *c);
    int rc = get_stacked(ld, a, gu, count, layout == GLU_SPLIT ? in : 2 * in, d) ||
             (layout == GLU_SPLIT && get_stacked(ld, b, up, count, in, d)) || get_stacked(ld, c, down, count, d, in) ? -1 : 0;
    for (int i = 0; !rc && i < count; i++) {
        e[i] = (ink_glu){.layout = layout, .down = c[i], .inter = in};
        if (layout == GLU_SPLIT) e[i].gate = a[i], e[i].up = b[i];
        else e[i].fused = a[i];
    }
    free(a);
    free(b);
    free(c);
    return rc;
}

int ink_glu_mats(const ink_glu *u, qmat *out) {
    if (u->layout == GLU_SPLIT) {
        out[0] = u->gate, out[1] = u->up, out[2] = u->down;
        return 3;
    }
    out[0] = u->fused, out[1] = u->down;
    return 2;
}

ink_glu ink_glu_with(const ink_glu *u, const qmat *w) {
    ink_glu v = *u;
    if (u->layout == GLU_SPLIT) v.gate = w[0], v.up = w[1], v.down = w[2];
    else v.fused = w[0], v.down = w[1];
    return v;
}

/* Each routed expert's slices of the stacked tensors, for the expert cache. */
static int add_experts(loader *ld, const ink_layer *l) {
    for (int e = 0; e < ld->g->n_experts; e++) {
        qmat w[EXPERT_MATS];
        int nm = ink_glu_mats(&l->experts[e], w);
        if (experts_add(ld->g->experts, (int)(l - ld->g->layers), e, w, nm, ld->err, ld->errlen)) return -1;
    }
    return 0;
}

static int load_moe(loader *ld, ink_layer *l, const char *p) {
    ink_model *g = ld->g;
    char n[NAME_LEN], n2[NAME_LEN], n3[NAME_LEN];
    if (get_mat(ld, &l->router, tname(n, "%smlp.gate.weight", p), g->n_experts + g->n_shared, g->dim) ||
        get_scalar(ld, tname(n, "%smlp.gate.global_scale", p), &l->router_scale) ||
        !(l->router_bias = get_vec(ld, tname(n, ld->raw ? "%smlp.gate.bias" : "%smlp.gate.e_score_correction_bias", p),
                                   g->n_experts)))
        return -1;
    if (ld->raw)
        return load_glus(ld, &l->experts, g->n_experts, GLU_INTERLEAVED, tname(n, "%smlp.experts.w13_weight", p), NULL,
                         tname(n3, "%smlp.experts.w2_weight", p)) || add_experts(ld, l) ||
               load_glus(ld, &l->shared, g->n_shared, GLU_INTERLEAVED,
                         tname(n, "%smlp.shared_experts.shared_w13_weight", p), NULL,
                         tname(n3, "%smlp.shared_experts.shared_w2_weight", p)) ? -1 : 0;
    return load_glus(ld, &l->experts, g->n_experts, GLU_HALVES, tname(n, "%smlp.experts.gate_up_proj", p), NULL,
                     tname(n3, "%smlp.experts.down_proj", p)) || add_experts(ld, l) ||
           load_glus(ld, &l->shared, g->n_shared, GLU_SPLIT, tname(n, "%smlp.shared_experts.gate_proj", p),
                     tname(n2, "%smlp.shared_experts.up_proj", p), tname(n3, "%smlp.shared_experts.down_proj", p)) ? -1 : 0;
}

static int load_layer(loader *ld, ink_layer *l, int i) {
    ink_model *g = ld->g;
    char p[NAME_LEN], n[NAME_LEN];
    int raw = ld->raw, d = g->dim, hd = l->head_dim, qd = l->heads * hd, kvd = l->kv_heads * hd;
    float *ck, *cv;
    tname(p, raw ? "model.llm.layers.%d." : "model.language_model.layers.%d.", i);
    const char *a = raw ? "attn." : "self_attn.";
#define NM(hf, rw) tname(n, "%s%s", p, raw ? rw : hf)
#define ATT(hf, rw) tname(n, "%s%s%s", p, a, raw ? rw : hf)
    if (!(l->attn_norm = get_vec(ld, NM("input_layernorm.weight", "attn_norm.weight"), d)) ||
        !(l->mlp_norm = get_vec(ld, NM("post_attention_layernorm.weight", "mlp_norm.weight"), d)) ||
        get_mat(ld, &l->q, ATT("q_proj.weight", "wq_du.weight"), qd, d) ||
        get_mat(ld, &l->k, ATT("k_proj.weight", "wk_dv.weight"), kvd, d) ||
        get_mat(ld, &l->v, ATT("v_proj.weight", "wv_dv.weight"), kvd, d) ||
        get_mat(ld, &l->r, ATT("r_proj.weight", "wr_du.weight"), l->heads * g->d_rel, d) ||
        get_mat(ld, &l->o, ATT("o_proj.weight", "wo_ud.weight"), d, qd) ||
        !(l->q_norm = get_vec(ld, ATT("q_norm.weight", "q_norm.weight"), hd)) ||
        !(l->k_norm = get_vec(ld, ATT("k_norm.weight", "k_norm.weight"), hd)) ||
        !(ck = get_conv(ld, ATT("k_sconv.conv1d.weight", "k_sconv.weight"), kvd)) ||
        !(cv = get_conv(ld, ATT("v_sconv.conv1d.weight", "v_sconv.weight"), kvd)) ||
        !(l->rel = get_floats(ld, ATT("rel_logits_proj.proj", "rel_logits_proj.proj"), 2,
                              (int64_t[]){g->d_rel, l->extent})) ||
        !(l->conv_attn = get_conv(ld, NM("attn_sconv.conv1d.weight", "attn_sconv.weight"), d)) ||
        !(l->conv_mlp = get_conv(ld, NM("mlp_sconv.conv1d.weight", "mlp_sconv.weight"), d)))
        return -1;
#undef NM
#undef ATT
    size_t taps = (size_t)kvd * g->conv_k;
    l->conv_kv = own(g, xmalloc(2 * taps * sizeof *l->conv_kv));
    memcpy(l->conv_kv, ck, taps * sizeof *ck);
    memcpy(l->conv_kv + taps, cv, taps * sizeof *cv);
    return l->sparse ? load_moe(ld, l, p) : load_dense(ld, l, p);
}

/* The audio tower is optional (a text-only checkpoint); when one of its tensors is present both
 * must be well formed. */
static int load_audio(loader *ld) {
    ink_model *g = ld->g;
    const char *emb = ld->raw ? "model.audio.encoder.weight" : "model.audio_tower.embed_audio_tokens.embed_audio_tokens.weight";
    const char *norm = ld->raw ? "model.audio.final_norm.weight" : "model.audio_tower.norm.weight";
    if (!st_find(ld->f, emb) && !st_find(ld->f, norm)) {
        g->audio_token = -1;
        return 0;
    }
    return get_mat(ld, &g->audio_embed, emb, g->n_mel * g->mel_vocab, g->dim) ||
           !(g->audio_norm = get_vec(ld, norm, g->dim)) ? -1 : 0;
}

static void inkling_free(model *m) {
    ink_model *g = m->priv;
    if (!g) return;
    for (int i = 0; g->layers && i < g->n_layers; i++) {
        free(g->layers[i].experts);
        free(g->layers[i].shared);
    }
    for (int i = 0; i < g->n_owned; i++) free(g->owned[i]);
    free(g->owned);
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
    if (read_dims(g, t, err, errlen)) return -1;
    g->layers = xcalloc((size_t)g->n_layers, sizeof *g->layers);
    if (read_layer_types(g, t, err, errlen) || read_mlp_types(g, t, err, errlen) ||
        read_audio(g, m->config, err, errlen) || read_generation(m, t, err, errlen))
        return -1;
    loader ld = {.g = g, .f = m->st, .raw = st_find(m->st, "model.llm.embed.weight") != NULL, .err = err, .errlen = errlen};
    for (int i = 0; i < g->n_layers; i++)
        if (load_layer(&ld, &g->layers[i], i)) return -1;
    int raw = ld.raw;
    if (get_mat(&ld, &g->embed, raw ? "model.llm.embed.weight" : "model.language_model.embed_tokens.weight", g->vocab, g->dim) ||
        !(g->embed_norm = get_vec(&ld, raw ? "model.llm.embed_norm.weight" : "model.language_model.embed_tokens.embed_norm.weight",
                                  g->dim)) ||
        !(g->final_norm = get_vec(&ld, raw ? "model.llm.norm.weight" : "model.language_model.norm.weight", g->dim)) ||
        get_mat(&ld, &g->head, raw ? "model.llm.unembed.weight" : "lm_head.weight", g->vocab, g->dim) ||
        load_audio(&ld))
        return -1;
    if (g->audio_token >= g->vocab) g->audio_token = -1;
    m->vocab_size = g->unpadded;
    m->media_token = g->audio_token;
    m->n_validated = g->n_validated;
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

static size_t glu_bytes(const ink_glu *u) {
    return qmat_bytes(&u->down) + (u->layout == GLU_SPLIT ? qmat_bytes(&u->gate) + qmat_bytes(&u->up) : qmat_bytes(&u->fused));
}

static size_t inkling_decode_bytes(const model *m) {
    const ink_model *g = m->priv;
    size_t b = qmat_bytes(&g->head) + (size_t)g->dim * 2;
    for (int i = 0; i < g->n_layers; i++) {
        const ink_layer *l = &g->layers[i];
        b += qmat_bytes(&l->q) + qmat_bytes(&l->k) + qmat_bytes(&l->v) + qmat_bytes(&l->r) + qmat_bytes(&l->o);
        if (!l->sparse) b += glu_bytes(&l->mlp);
        else b += qmat_bytes(&l->router) + (size_t)g->top_k * glu_bytes(&l->experts[0]) +
                  (size_t)g->n_shared * glu_bytes(&l->shared[0]);
    }
    return b;
}

/* Multiply-adds x2 of one token at position pos: projections, convs, relative bias, attention over
 * the attended keys, active experts, head. */
static double inkling_token_flops(const model *m, int pos) {
    const ink_model *g = m->priv;
    double f = (double)g->vocab * g->dim;
    for (int i = 0; i < g->n_layers; i++) {
        const ink_layer *l = &g->layers[i];
        int keys = l->sliding ? MIN(pos + 1, g->window) : pos + 1;
        double qd = (double)l->heads * l->head_dim, kvd = (double)l->kv_heads * l->head_dim;
        f += (2 * qd + 2 * kvd + (double)l->heads * g->d_rel) * g->dim;
        f += (2 * kvd + 2.0 * g->dim) * g->conv_k + (double)l->heads * g->d_rel * l->extent;
        f += 2.0 * l->heads * keys * l->head_dim;
        int active = l->sparse ? g->moe_inter * (g->top_k + g->n_shared) : l->mlp.inter;
        f += 3.0 * active * g->dim + (l->sparse ? (double)(g->n_experts + g->n_shared) * g->dim : 0);
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
    .decode_bytes = inkling_decode_bytes,
    .token_flops = inkling_token_flops,
};
