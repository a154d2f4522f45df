/* kimi_k3.c — Kimi K3 family: config.json, tensor lookup/validation, sequence state layout, reports.
 * The module's invariants are in kimi_k3.h; the forward pass is in kimi_k3_forward.c and the files
 * it calls. Tensors load as the release ships them: BF16 matrices and norms, F32 A_log / dt_bias /
 * short convs / o_norm / router bias (BF16 or F32 accepted for every vector), routed experts as
 * MXFP4 `weight_packed` (U8, low nibble = even column) + `weight_scale` (UE8M0 per 32 inputs, U8 or
 * F8_E8M0), which is the kernels' WF_FP4 layout as is. Names with or without `language_model.`. */
#include "kimi_k3.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/config.h"
#include "../core/quant.h"
#include "../core/util.h"

#define NAME_LEN 200

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

typedef struct {
    k3_model *k;
    const st_file *f;
    const char *prefix;        /* "language_model." or "" */
    char *err;
    size_t errlen;
    int failed;
} loader;

static const st_tensor *lookup(loader *ld, char *name, const char *fmt, va_list ap) {
    int n = snprintf(name, NAME_LEN, "%s", ld->prefix);
    vsnprintf(name + n, NAME_LEN - n, fmt, ap);
    const st_tensor *t = st_find(ld->f, name);
    if (!t) { errf(ld->err, ld->errlen, "missing tensor %s", name); ld->failed = 1; }
    return t;
}

static int fail_shape(loader *ld, const st_tensor *t, const char *want) {
    errf(ld->err, ld->errlen, "tensor %s in %s: expected %s, found %s with %d dims [%lld, ...]", t->name, t->file,
         want, dtype_name(t->type), t->ndim, (long long)t->shape[0]);
    ld->failed = 1;
    return -1;
}

/* A BF16 or F32 matrix [rows, cols], used in place. */
static qmat mat(loader *ld, int rows, int cols, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static qmat mat(loader *ld, int rows, int cols, const char *fmt, ...) {
    qmat q = {.rows = rows, .cols = cols};
    char name[NAME_LEN], want[64];
    if (ld->failed) return q;
    va_list ap;
    va_start(ap, fmt);
    const st_tensor *t = lookup(ld, name, fmt, ap);
    va_end(ap);
    if (!t) return q;
    snprintf(want, sizeof want, "BF16 or F32 [%d,%d]", rows, cols);
    if ((t->type != DT_BF16 && t->type != DT_F32) || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        fail_shape(ld, t, want);
        return q;
    }
    q.fmt = t->type == DT_F32 ? WF_F32 : WF_BF16;
    q.data = t->data;
    ld->k->n_validated++;
    return q;
}

static float *keep(k3_model *k, size_t n) {
    float *p = xmalloc((n ? n : 1) * sizeof *p);
    k->owned = xrealloc(k->owned, sizeof(void *) * (k->n_owned + 1));
    k->owned[k->n_owned++] = p;
    return p;
}

/* A BF16 or F32 vector copied to f32: `count` elements of a tensor shaped [total], [1, total] (the
 * residual projections) or [total/k, 1, k] (the convs: shape3 = k); total < 0 takes the first
 * `count` of any [>= count] (A_log, which the release zero-pads past num_heads). */
static const float *vec(loader *ld, int count, int total, int shape3, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static const float *vec(loader *ld, int count, int total, int shape3, const char *fmt, ...) {
    char name[NAME_LEN], want[80];
    if (ld->failed) return NULL;
    va_list ap;
    va_start(ap, fmt);
    const st_tensor *t = lookup(ld, name, fmt, ap);
    va_end(ap);
    if (!t) return NULL;
    int ok = t->type == DT_BF16 || t->type == DT_F32;
    if (shape3) ok = ok && t->ndim == 3 && t->shape[0] * shape3 == total && t->shape[1] == 1 && t->shape[2] == shape3;
    else if (total < 0) ok = ok && t->ndim == 1 && t->shape[0] >= count;
    else ok = ok && ((t->ndim == 1 && t->shape[0] == total) || (t->ndim == 2 && t->shape[0] == 1 && t->shape[1] == total));
    if (!ok) {
        if (shape3) snprintf(want, sizeof want, "BF16 or F32 [%d,1,%d]", total / shape3, shape3);
        else if (total < 0) snprintf(want, sizeof want, "BF16 or F32 [>= %d]", count);
        else snprintf(want, sizeof want, "BF16 or F32 [%d]", total);
        fail_shape(ld, t, want);
        return NULL;
    }
    float *v = keep(ld->k, (size_t)count);
    for (int i = 0; i < count; i++)
        v[i] = t->type == DT_F32 ? ((const float *)t->data)[i] : bf16_to_f32(((const uint16_t *)t->data)[i]);
    ld->k->n_validated++;
    return v;
}

static const st_tensor *expect_one_of(loader *ld, dtype a, dtype b, int rows, int cols, const char *name) {
    const st_tensor *t = st_find(ld->f, name);
    if (!t) { errf(ld->err, ld->errlen, "missing tensor %s", name); ld->failed = 1; return NULL; }
    char want[64];
    snprintf(want, sizeof want, "%s or %s [%d,%d]", dtype_name(a), dtype_name(b), rows, cols);
    if ((t->type != a && t->type != b) || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        fail_shape(ld, t, want);
        return NULL;
    }
    ld->k->n_validated++;
    return t;
}

/* A routed expert matrix as released: `<name>.weight_packed` E2M1 [rows, cols/2] + `.weight_scale`
 * UE8M0 [rows, cols/32]. */
static qmat mxfp4(loader *ld, int rows, int cols, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static qmat mxfp4(loader *ld, int rows, int cols, const char *fmt, ...) {
    qmat q = {.fmt = WF_FP4, .rows = rows, .cols = cols};
    char base[NAME_LEN], name[NAME_LEN + 16];
    if (ld->failed) return q;
    int n = snprintf(base, NAME_LEN, "%s", ld->prefix);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(base + n, NAME_LEN - n, fmt, ap);
    va_end(ap);
    snprintf(name, sizeof name, "%s.weight_packed", base);
    const st_tensor *p = expect_one_of(ld, DT_U8, DT_I8, rows, cols / 2, name);
    snprintf(name, sizeof name, "%s.weight_scale", base);
    const st_tensor *s = p ? expect_one_of(ld, DT_U8, DT_F8_E8M0, rows, cols / 32, name) : NULL;
    if (p && s) {
        q.data = p->data;
        q.scale = s->data;
    }
    return q;
}

static void load_kda(loader *ld, const k3_model *k, k3_kda *a, const char *p) {
    int proj = k->kda_heads * k->kda_dim, d = k->dim;
    a->q = mat(ld, proj, d, "%sq_proj.weight", p);
    a->k = mat(ld, proj, d, "%sk_proj.weight", p);
    a->v = mat(ld, proj, d, "%sv_proj.weight", p);
    const char *conv[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++)
        a->conv[i] = vec(ld, proj * k->conv_k, proj * k->conv_k, k->conv_k, "%s%s_conv1d.weight", p, conv[i]);
    a->f_a = mat(ld, k->kda_dim, d, "%sf_a_proj.weight", p);
    a->f_b = mat(ld, proj, k->kda_dim, "%sf_b_proj.weight", p);
    a->b = mat(ld, k->kda_heads, d, "%sb_proj.weight", p);
    if (k->full_rank_gate) a->g = mat(ld, proj, d, "%sg_proj.weight", p);
    else {
        a->g_a = mat(ld, k->kda_dim, d, "%sg_a_proj.weight", p);
        a->g_b = mat(ld, proj, k->kda_dim, "%sg_b_proj.weight", p);
    }
    a->o_norm = vec(ld, k->kda_dim, k->kda_dim, 0, "%so_norm.weight", p);
    a->o = mat(ld, d, proj, "%so_proj.weight", p);
    a->dt_bias = vec(ld, proj, proj, 0, "%sdt_bias", p);
    /* A_log: per head, possibly zero-padded past num_heads (the release stores 128 for 96). */
    const float *a_log = vec(ld, k->kda_heads, -1, 0, "%sA_log", p);
    if (a_log) {
        float *scale = (float *)a_log;
        for (int h = 0; h < k->kda_heads; h++) scale[h] = expf(a_log[h]);
        a->decay_scale = scale;
    }
}

static void load_mla(loader *ld, const k3_model *k, k3_mla *a, const char *p) {
    int h = k->n_heads, d = k->dim;
    a->q_a = mat(ld, k->q_lora, d, "%sq_a_proj.weight", p);
    a->q_a_norm = vec(ld, k->q_lora, k->q_lora, 0, "%sq_a_layernorm.weight", p);
    a->q_b = mat(ld, h * (k->nope + k->rope), k->q_lora, "%sq_b_proj.weight", p);
    a->kv_a = mat(ld, k->kv_lora + k->rope, d, "%skv_a_proj_with_mqa.weight", p);
    a->kv_a_norm = vec(ld, k->kv_lora, k->kv_lora, 0, "%skv_a_layernorm.weight", p);
    a->kv_b = mat(ld, h * (k->nope + k->v_dim), k->kv_lora, "%skv_b_proj.weight", p);
    a->g = mat(ld, h * k->v_dim, d, "%sg_proj.weight", p);
    a->o = mat(ld, d, h * k->v_dim, "%so_proj.weight", p);
}

static void load_glu(loader *ld, const k3_model *k, k3_layer *l, int inter, const char *p) {
    l->gate = mat(ld, inter, k->dim, "%sgate_proj.weight", p);
    l->up = mat(ld, inter, k->dim, "%sup_proj.weight", p);
    l->down = mat(ld, k->dim, inter, "%sdown_proj.weight", p);
}

static void load_moe(loader *ld, const k3_model *k, k3_layer *l, const char *p) {
    char sub[NAME_LEN];
    l->router = mat(ld, k->n_experts, k->dim, "%sgate.weight", p);
    l->router_bias = vec(ld, k->n_experts, k->n_experts, 0, "%sgate.e_score_correction_bias", p);
    l->lat_down = mat(ld, k->latent, k->dim, "%srouted_expert_down_proj.weight", p);
    l->lat_norm = vec(ld, k->latent, k->latent, 0, "%srouted_expert_norm.weight", p);
    l->lat_up = mat(ld, k->dim, k->latent, "%srouted_expert_up_proj.weight", p);
    l->w1 = xcalloc((size_t)k->n_experts, sizeof(qmat));
    l->w2 = xcalloc((size_t)k->n_experts, sizeof(qmat));
    l->w3 = xcalloc((size_t)k->n_experts, sizeof(qmat));
    for (int e = 0; e < k->n_experts && !ld->failed; e++) {
        l->w1[e] = mxfp4(ld, k->moe_inter, k->latent, "%sexperts.%d.w1", p, e);
        l->w2[e] = mxfp4(ld, k->latent, k->moe_inter, "%sexperts.%d.w2", p, e);
        l->w3[e] = mxfp4(ld, k->moe_inter, k->latent, "%sexperts.%d.w3", p, e);
        if (!ld->failed && experts_add(k->experts, (int)(l - k->layers), e, (qmat[]){l->w1[e], l->w3[e], l->w2[e]}, 3,
                                       ld->err, ld->errlen))
            ld->failed = 1;
    }
    snprintf(sub, sizeof sub, "%sshared_experts.", p);
    load_glu(ld, k, l, k->moe_inter * k->n_shared, sub);
}

static void load_layer(loader *ld, k3_model *k, k3_layer *l, int i) {
    char p[64], sub[128];
    int d = k->dim;
    snprintf(p, sizeof p, "model.layers.%d.", i);
    l->attn_norm = vec(ld, d, d, 0, "%sinput_layernorm.weight", p);
    l->ffn_norm = vec(ld, d, d, 0, "%spost_attention_layernorm.weight", p);
    if (k->res_block) {
        /* Layer 0's attention-site mixer exists in the release but has nothing to mix: not loaded. */
        if (i > 0) {
            l->res_attn_norm = vec(ld, d, d, 0, "%sself_attention_res_norm.weight", p);
            l->res_attn_proj = vec(ld, d, d, 0, "%sself_attention_res_proj.weight", p);
        }
        l->res_mlp_norm = vec(ld, d, d, 0, "%smlp_res_norm.weight", p);
        l->res_mlp_proj = vec(ld, d, d, 0, "%smlp_res_proj.weight", p);
    }
    snprintf(sub, sizeof sub, "%sself_attn.", p);
    if (l->kda) load_kda(ld, k, &l->lin, sub);
    else load_mla(ld, k, &l->mla, sub);
    if (l->sparse) {
        snprintf(sub, sizeof sub, "%sblock_sparse_moe.", p);
        load_moe(ld, k, l, sub);
    } else {
        snprintf(sub, sizeof sub, "%smlp.", p);
        load_glu(ld, k, l, k->inter, sub);
    }
}

static void k3_free(model *m) {
    k3_model *k = m->priv;
    if (!k) return;
    for (int i = 0; k->layers && i < k->n_layers; i++) {
        free(k->layers[i].w1);
        free(k->layers[i].w2);
        free(k->layers[i].w3);
    }
    for (int i = 0; i < k->n_owned; i++) free(k->owned[i]);
    free(k->owned);
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
    if (read_dims(k, c, err, errlen) || read_options(k, c, err, errlen)) return -1;
    k->layers = xcalloc((size_t)k->n_layers, sizeof *k->layers);
    if (read_layer_kinds(k, c, err, errlen)) return -1;
    if (config_int_or(c, "max_position_embeddings", m->max_ctx, &m->max_ctx, err, errlen)) return -1;
    if (m->n_eos == 0) {
        const cJSON *eos = config_get(c, "eos_token_id");
        if (cJSON_IsNumber(eos)) m->eos_ids[m->n_eos++] = eos->valueint;
    }
    if (m->bos_id < 0 && config_int_or(c, "bos_token_id", -1, &m->bos_id, err, errlen)) return -1;
    loader ld = {k, m->st, st_find(m->st, "language_model.model.embed_tokens.weight") ? "language_model." : "", err,
                 errlen, 0};
    for (int i = 0; i < k->n_layers && !ld.failed; i++) load_layer(&ld, k, &k->layers[i], i);
    k->embed = mat(&ld, k->vocab, k->dim, "model.embed_tokens.weight");
    k->head = mat(&ld, k->vocab, k->dim, "lm_head.weight");
    k->final_norm = vec(&ld, k->dim, k->dim, 0, "model.norm.weight");
    if (k->res_block) {
        k->out_res_norm = vec(&ld, k->dim, k->dim, 0, "model.output_attn_res_norm.weight");
        k->out_res_proj = vec(&ld, k->dim, k->dim, 0, "model.output_attn_res_proj.weight");
    }
    if (ld.failed) return -1;
    m->vocab_size = k->vocab;
    m->n_validated = k->n_validated;
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

static size_t layer_dense_bytes(const k3_layer *l) {
    const qmat *all[] = {&l->lin.q, &l->lin.k, &l->lin.v, &l->lin.f_a, &l->lin.f_b, &l->lin.b, &l->lin.g,
                         &l->lin.g_a, &l->lin.g_b, &l->lin.o, &l->mla.q_a, &l->mla.q_b, &l->mla.kv_a,
                         &l->mla.kv_b, &l->mla.g, &l->mla.o, &l->gate, &l->up, &l->down, &l->router,
                         &l->lat_down, &l->lat_up};
    size_t b = 0;
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i]->data) b += qmat_bytes(all[i]);
    return b;
}

static size_t k3_decode_bytes(const model *m) {
    const k3_model *k = m->priv;
    size_t b = qmat_bytes(&k->head) + (size_t)k->dim * 2;
    for (int i = 0; i < k->n_layers; i++) {
        const k3_layer *l = &k->layers[i];
        b += layer_dense_bytes(l);
        if (l->sparse) b += (size_t)k->top_k * (qmat_bytes(&l->w1[0]) + qmat_bytes(&l->w2[0]) + qmat_bytes(&l->w3[0]));
    }
    return b;
}

/* Multiply-adds x2 of one token at position pos: every projection, the KDA state update and read
 * (about 4 * heads * d^2), absorbed MLA over pos + 1 rows, active experts, head. */
static double k3_token_flops(const model *m, int pos) {
    const k3_model *k = m->priv;
    double f = (double)k->vocab * k->dim;
    for (int i = 0; i < k->n_layers; i++) {
        const k3_layer *l = &k->layers[i];
        f += (double)layer_dense_bytes(l) / 2;      /* BF16 matrices: one multiply-add per element */
        if (l->kda) f += 4.0 * k->kda_heads * k->kda_dim * k->kda_dim;
        else f += (double)k->n_heads * ((double)(k->nope + k->v_dim) * k->kv_lora + 2.0 * (pos + 1) * (k->kv_lora + k->rope));
        if (l->sparse) f += 3.0 * k->top_k * k->moe_inter * k->latent;
    }
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
    .decode_bytes = k3_decode_bytes,
    .token_flops = k3_token_flops,
};
