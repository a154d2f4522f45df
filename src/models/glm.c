/* glm.c — GLM-5 family: config.json, tensor lookup/validation, sequence state layout.
 * The forward pass is in glm_forward.c; the module's invariants are in glm.h.
 * Matrices load as the checkpoints ship them, without conversion, through the family's tensor
 * table (core/tensor_table.h, matrices by core/weights.h): BF16 or F32 (official), F8_E4M3 with `_scale_inv` block scales (GLM-5-FP8),
 * or colibri's int8/int4 containers (GLM-5.2 int4: U8 codes + `.qs` F32 scales). */
#include "glm.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/config.h"
#include "../core/quant.h"
#include "../core/util.h"


/* ---- config ----------------------------------------------------------------------------- */

static int read_dims(glm_model *g, const cJSON *c, char *err, size_t errlen) {
    const config_int_field req[] = {
        {"vocab_size", &g->vocab}, {"hidden_size", &g->dim}, {"num_hidden_layers", &g->n_layers},
        {"num_attention_heads", &g->n_heads}, {"q_lora_rank", &g->q_lora}, {"kv_lora_rank", &g->kv_lora},
        {"qk_nope_head_dim", &g->nope}, {"qk_rope_head_dim", &g->rope}, {"v_head_dim", &g->v_dim},
        {"intermediate_size", &g->inter}, {"moe_intermediate_size", &g->moe_inter},
        {"n_routed_experts", &g->n_experts}, {"num_experts_per_tok", &g->top_k},
    };
    if (config_ints(c, req, sizeof req / sizeof *req, err, errlen)) return -1;
    if (g->vocab < 1 || g->dim < 1 || g->n_layers < 1 || g->n_heads < 1 || g->q_lora < 1 || g->kv_lora < 1 ||
        g->nope < 1 || g->v_dim < 1 || g->inter < 1 || g->moe_inter < 1 || g->n_experts < 1)
        return errf(err, errlen, "config.json: dimensions must be positive");
    if (g->rope < 2 || g->rope % 2 || g->rope > 512)
        return errf(err, errlen, "config.json: qk_rope_head_dim %d must be even and in [2, 512]", g->rope);
    if (g->top_k < 1 || g->top_k > g->n_experts)
        return errf(err, errlen, "config.json: num_experts_per_tok %d must be in [1, n_routed_experts]", g->top_k);
    return 0;
}

/* Absent optional keys take Hugging Face GlmMoeDsaConfig's defaults. */
static int read_routing(glm_model *g, const cJSON *c, char *err, size_t errlen) {
    int n_group;
    double scale, eps;
    if (config_int_or(c, "n_shared_experts", 1, &g->n_shared, err, errlen) ||
        config_int_or(c, "n_group", 1, &n_group, err, errlen) ||
        config_bool_or(c, "norm_topk_prob", 1, &g->norm_topk, err, errlen) ||
        config_double_or(c, "routed_scaling_factor", 2.5, &scale, err, errlen) ||
        config_double_or(c, "rms_norm_eps", 1e-5, &eps, err, errlen))
        return -1;
    /* GLM-5 ships n_group 1; group-limited routing (DeepSeek-V3 n_group 8) is another model. */
    if (n_group != 1) return errf(err, errlen, "config.json: n_group %d is not supported (GLM uses 1)", n_group);
    if (g->n_shared < 0) return errf(err, errlen, "config.json: n_shared_experts must be >= 0");
    g->routed_scale = (float)scale;
    g->eps = (float)eps;
    return 0;
}

static int read_rope(glm_model *g, const cJSON *c, char *err, size_t errlen) {
    double theta = 10000.0;
    const cJSON *params = config_get(c, "rope_parameters");
    if (params) {
        const char *type = "default";
        if (config_double_or(params, "rope_theta", theta, &theta, err, errlen)) return -1;
        const cJSON *t = config_get(params, "rope_type");
        if (cJSON_IsString(t)) type = t->valuestring;
        if (strcmp(type, "default"))
            return errf(err, errlen, "config.json: rope_parameters.rope_type '%s' is not supported (GLM-5: default)",
                        type);
    } else if (config_double_or(c, "rope_theta", theta, &theta, err, errlen)) return -1;
    /* GLM-5 rotates interleaved pairs in attention; the indexer flag defaults to split-half as in HF. */
    if (config_bool_or(c, "rope_interleave", 1, &g->rope_interleave, err, errlen) ||
        config_bool_or(c, "indexer_rope_interleave", 0, &g->idx_rope_interleave, err, errlen))
        return -1;
    rope_init(&g->rope_tab, g->rope, theta);
    return 0;
}

/* indexer_types, else index_topk_pattern ("FSSF..."), else the index_topk_freq / index_skip_topk_offset
 * schedule HF derives: layer i is full iff max(i - offset + 1, 0) % freq == 0. */
static int read_indexer_types(glm_model *g, const cJSON *c, char *err, size_t errlen) {
    const cJSON *types = config_get(c, "indexer_types"), *pattern = config_get(c, "index_topk_pattern");
    int freq, offset;
    if (config_int_or(c, "index_topk_freq", 1, &freq, err, errlen) ||
        config_int_or(c, "index_skip_topk_offset", 2, &offset, err, errlen))
        return -1;
    for (int i = 0; i < g->n_layers; i++) {
        int full;
        if (types) {
            const cJSON *t = cJSON_GetArrayItem(types, i);
            if (!cJSON_IsString(t) || (strcmp(t->valuestring, "full") && strcmp(t->valuestring, "shared")))
                return errf(err, errlen, "config.json: indexer_types[%d] must be \"full\" or \"shared\"", i);
            full = !strcmp(t->valuestring, "full");
        } else if (cJSON_IsString(pattern)) {
            char ch = (size_t)i < strlen(pattern->valuestring) ? pattern->valuestring[i] : 0;
            if (ch != 'F' && ch != 'S')
                return errf(err, errlen, "config.json: index_topk_pattern[%d] must be 'F' or 'S'", i);
            full = ch == 'F';
        } else {
            int v = i - offset + 1;
            full = (v > 0 ? v : 0) % (freq > 1 ? freq : 1) == 0;
        }
        /* A "shared" first layer has nothing to share: HF runs its indexer, so it needs weights. */
        g->layers[i].full_indexer = full || i == 0;
    }
    return 0;
}

static int read_indexer(glm_model *g, const cJSON *c, char *err, size_t errlen) {
    g->has_indexer = config_get(c, "index_topk") != NULL;
    if (!g->has_indexer) return 0;
    if (config_int(c, "index_topk", &g->idx_topk, err, errlen) ||
        config_int(c, "index_n_heads", &g->idx_heads, err, errlen) ||
        config_int(c, "index_head_dim", &g->idx_dim, err, errlen))
        return -1;
    if (g->idx_topk < 1 || g->idx_heads < 1 || g->idx_dim < g->rope)
        return errf(err, errlen, "config.json: index_topk and index_n_heads must be >= 1 and index_head_dim >= "
                    "qk_rope_head_dim");
    return read_indexer_types(g, c, err, errlen);
}

static int read_mlp_types(glm_model *g, const cJSON *c, char *err, size_t errlen) {
    int first_dense;
    const cJSON *types = config_get(c, "mlp_layer_types");
    if (config_int_or(c, "first_k_dense_replace", 3, &first_dense, err, errlen)) return -1;
    for (int i = 0; i < g->n_layers; i++) {
        if (!types) { g->layers[i].sparse = i >= first_dense; continue; }
        const cJSON *t = cJSON_GetArrayItem(types, i);
        if (!cJSON_IsString(t) || (strcmp(t->valuestring, "dense") && strcmp(t->valuestring, "sparse")))
            return errf(err, errlen, "config.json: mlp_layer_types[%d] must be \"dense\" or \"sparse\"", i);
        g->layers[i].sparse = !strcmp(t->valuestring, "sparse");
    }
    return 0;
}

/* ---- tensors ---------------------------------------------------------------------------- */

/* The tensor table (core/tensor_table.h): every tensor of the official layout, by group. */
#define MAT(n, role, d0, d1, field) {{n}, TT_MAT, role, 0, 2, {d0, d1}, offsetof(glm_layer, field), 0}
#define VEC(n, d0, field) {{n}, TT_F32, TT_DENSE, 0, 1, {d0}, offsetof(glm_layer, field), 0}
static const tt_spec norms[] = {
    VEC("input_layernorm.weight", GD_DIM, attn_norm),
    VEC("post_attention_layernorm.weight", GD_DIM, ffn_norm),
};
static const tt_spec attention[] = {
    MAT("q_a_proj.weight", TT_DENSE, GD_QLORA, GD_DIM, q_a),
    VEC("q_a_layernorm.weight", GD_QLORA, q_a_norm),
    MAT("q_b_proj.weight", TT_DENSE, GD_QB, GD_QLORA, q_b),
    MAT("kv_a_proj_with_mqa.weight", TT_DENSE, GD_KVA, GD_DIM, kv_a),
    VEC("kv_a_layernorm.weight", GD_KVLORA, kv_a_norm),
    MAT("kv_b_proj.weight", TT_DENSE, GD_KVB, GD_KVLORA, kv_b),
    MAT("o_proj.weight", TT_DENSE, GD_DIM, GD_OV, o),
};
static const tt_spec indexer[] = {
    MAT("indexer.wq_b.weight", TT_DENSE, GD_IQ, GD_QLORA, idx_wq_b),
    MAT("indexer.wk.weight", TT_DENSE, GD_IDX, GD_DIM, idx_wk),
    VEC("indexer.k_norm.weight", GD_IDX, idx_knorm_w),
    VEC("indexer.k_norm.bias", GD_IDX, idx_knorm_b),
    MAT("indexer.weights_proj.weight", TT_DENSE, GD_IHEADS, GD_DIM, idx_weights),
};
/* A dense SwiGLU of GD_INTER (the MLP, or the shared experts under "shared_experts."). */
static const tt_spec swiglu[] = {
    MAT("gate_proj.weight", TT_DENSE, GD_INTER, GD_DIM, gate),
    MAT("up_proj.weight", TT_DENSE, GD_INTER, GD_DIM, up),
    MAT("down_proj.weight", TT_DENSE, GD_DIM, GD_INTER, down),
};
static const tt_spec moe[] = {
    MAT("gate.weight", TT_DENSE, GD_EXPERTS, GD_DIM, router),
    VEC("gate.e_score_correction_bias", GD_EXPERTS, router_bias),
    MAT("experts.%d.gate_proj.weight", TT_ROUTED, GD_INTER, GD_DIM, e_gate),
    MAT("experts.%d.up_proj.weight", TT_ROUTED, GD_INTER, GD_DIM, e_up),
    MAT("experts.%d.down_proj.weight", TT_ROUTED, GD_DIM, GD_INTER, e_down),
};
#undef MAT
#undef VEC
#define TOP(n, kind, role, ndim, field) {{n}, kind, role, 0, ndim, {GD_VOCAB, GD_DIM}, offsetof(glm_model, field), 0}
static const tt_spec top[] = {
    TOP("model.embed_tokens.weight", TT_MAT, TT_LOOKUP, 2, embed),
    TOP("lm_head.weight", TT_MAT, TT_DENSE, 2, head),
    {{"model.norm.weight"}, TT_F32, TT_DENSE, 0, 1, {GD_DIM}, offsetof(glm_model, final_norm), 0},
};
#undef TOP
#define MTP(n, kind, ndim, field) {{n}, kind, TT_DENSE, 0, ndim, {GD_DIM, GD_2DIM}, offsetof(glm_mtp, field), 0}
static const tt_spec mtp_extra[] = {
    MTP("eh_proj.weight", TT_MAT, 2, eh),
    MTP("enorm.weight", TT_F32, 1, enorm),
    MTP("hnorm.weight", TT_F32, 1, hnorm),
    MTP("shared_head.norm.weight", TT_F32, 1, head_norm),
};
#undef MTP
#define N(t) (int)(sizeof t / sizeof *t)

static void fill_dims(glm_model *g) {
    int *d = g->dims, h = g->n_heads;
    d[GD_DIM] = g->dim, d[GD_2DIM] = 2 * g->dim, d[GD_VOCAB] = g->vocab, d[GD_QLORA] = g->q_lora;
    d[GD_QB] = h * (g->nope + g->rope), d[GD_KVA] = g->kv_lora + g->rope, d[GD_KVLORA] = g->kv_lora;
    d[GD_KVB] = h * (g->nope + g->v_dim), d[GD_OV] = h * g->v_dim, d[GD_IQ] = g->idx_heads * g->idx_dim;
    d[GD_IDX] = g->idx_dim, d[GD_IHEADS] = g->idx_heads, d[GD_EXPERTS] = g->n_experts;
}

/* One group of layer l's tensors under prefix "model.layers.<i>.<sub>", with GD_INTER = inter. */
static int load_group(tt_table *w, glm_model *g, glm_layer *l, int i, const char *sub, const tt_spec *t, int n,
                      int inter, int draft) {
    char p[160];
    int dims[GD_COUNT];
    memcpy(dims, g->dims, sizeof dims);
    dims[GD_INTER] = inter;
    snprintf(p, sizeof p, "model.layers.%d.%s", i, sub);
    tt_group grp = {.prefix = p, .dst = l, .dims = dims, .layer = i, .experts = g->n_experts, .active = g->top_k,
                    .draft = draft};
    return tt_load(w, t, n, &grp);
}

static int load_layer(tt_table *w, glm_model *g, glm_layer *l, int i, int draft) {
    if (load_group(w, g, l, i, "", norms, N(norms), 0, draft) ||
        load_group(w, g, l, i, "self_attn.", attention, N(attention), 0, draft) ||
        (g->has_indexer && l->full_indexer &&
         load_group(w, g, l, i, "self_attn.", indexer, N(indexer), 0, draft)))
        return -1;
    if (!l->sparse) return load_group(w, g, l, i, "mlp.", swiglu, N(swiglu), g->inter, draft);
    return load_group(w, g, l, i, "mlp.", moe, N(moe), g->moe_inter, draft) ||
           load_group(w, g, l, i, "mlp.shared_experts.", swiglu, N(swiglu), g->moe_inter * g->n_shared, draft);
}

/* The MTP layer (index n_layers) is optional in a checkpoint; when present it must be well formed.
 * It runs only for speculative decoding (glm.h), so the table counts it as draft weights. */
static int load_mtp(tt_table *w, glm_model *g, const cJSON *c, char *err, size_t errlen) {
    char name[160];
    int n_mtp;
    if (config_int_or(c, "num_nextn_predict_layers", 0, &n_mtp, err, errlen)) return -1;
    snprintf(name, sizeof name, "model.layers.%d.eh_proj.weight", g->n_layers);
    if (n_mtp < 1 || !st_find(w->f, name)) return 0;
    g->mtp.sparse = 1;
    snprintf(name, sizeof name, "model.layers.%d.self_attn.indexer.wq_b.weight", g->n_layers);
    g->mtp.full_indexer = st_find(w->f, name) != NULL;
    snprintf(name, sizeof name, "model.layers.%d.", g->n_layers);
    tt_group grp = {.prefix = name, .dst = &g->mtp_extra, .dims = g->dims, .layer = g->n_layers, .draft = 1};
    if (load_layer(w, g, &g->mtp, g->n_layers, 1) || tt_load(w, mtp_extra, N(mtp_extra), &grp)) return -1;
    g->has_mtp = 1;
    return 0;
}

static void glm_free(model *m) {
    glm_model *g = m->priv;
    if (!g) return;
    for (int i = 0; g->layers && i < g->n_layers; i++) mla_absorbed_free(&g->layers[i].mla);
    mla_absorbed_free(&g->mtp.mla);
    free(g->layers);
    free(g);
    m->priv = NULL;
}

static int glm_load(model *m, char *err, size_t errlen) {
    glm_model *g = xcalloc(1, sizeof *g);
    m->priv = g;
    g->experts = m->experts;
    const cJSON *c = m->config;
    tt_table *w = &m->weights;
    if (read_dims(g, c, err, errlen) || model_check_layers(m, g->n_layers, err, errlen) ||
        read_routing(g, c, err, errlen) || read_rope(g, c, err, errlen))
        return -1;
    g->layers = xcalloc((size_t)g->n_layers, sizeof *g->layers);
    if (read_mlp_types(g, c, err, errlen) || read_indexer(g, c, err, errlen)) return -1;
    fill_dims(g);
    for (int i = 0; i < g->n_layers; i++)
        if (load_layer(w, g, &g->layers[i], i, 0)) return -1;
    tt_group grp = {.prefix = "", .dst = g, .dims = g->dims, .layer = -1};
    if (tt_load(w, top, N(top), &grp) || load_mtp(w, g, c, err, errlen)) return -1;
    for (int i = 0; i < g->n_layers + g->has_mtp; i++) {
        glm_layer *l = i < g->n_layers ? &g->layers[i] : &g->mtp;
        if (mla_absorb(&l->mla, &l->kv_b, g->n_heads, g->nope, g->v_dim, g->kv_lora, err, errlen)) return -1;
    }
    m->vocab_size = g->vocab;
    m->pass_rows = GLM_CHUNK;
    m->draft_layers = g->has_mtp;
    return 0;
}

/* ---- sequence state --------------------------------------------------------------------- */

static void *glm_seq_new(model *m, state *st, int ctx, arena *scratch, char *err, size_t errlen) {
    glm_model *g = m->priv;
    glm_seq *s = xcalloc(1, sizeof *s);
    s->scratch = scratch;
    int mtp = m->spec_mtp && g->has_mtp;
    s->kv = xcalloc((size_t)g->n_layers + 1, sizeof *s->kv);
    s->ik = xcalloc((size_t)g->n_layers + 1, sizeof *s->ik);
    s->cap = ctx;
    char name[48];
    size_t kv_row = (size_t)(g->kv_lora + g->rope) * sizeof(float), ik_row = (size_t)g->idx_dim * sizeof(float);
    for (int i = 0; i < g->n_layers + mtp; i++) {
        const glm_layer *l = i < g->n_layers ? &g->layers[i] : &g->mtp;
        int first = i < g->n_layers ? 0 : 1;      /* the MTP layer's row p + 1 is position p */
        snprintf(name, sizeof name, "L%d.kv", i);
        unsigned char *rows = state_add_part(st, PART_ROWS, name, kv_row, ctx, 1, 0);
        if (!rows) goto oom;
        s->kv[i] = (float *)(rows + first * kv_row);
        if (!g->has_indexer || !l->full_indexer) continue;
        snprintf(name, sizeof name, "L%d.ik", i);
        if (!(rows = state_add_part(st, PART_ROWS, name, ik_row, ctx, 1, 0))) goto oom;
        s->ik[i] = (float *)(rows + first * ik_row);
    }
    if (mtp) {
        snprintf(name, sizeof name, "mtp.h");
        if (!(s->hfin = state_add_part(st, PART_ROWS, name, (size_t)g->dim * sizeof(float), ctx, 1, 0))) goto oom;
        s->draft_h = xcalloc((size_t)g->dim, sizeof(float));
    }
    return s;
oom:
    errf(err, errlen, "out of memory allocating the state of %d positions (%s)", ctx, name);
    free(s->kv);
    free(s->ik);
    free(s);
    return NULL;
}

static void glm_seq_free(model *m, void *fam_seq) {
    glm_seq *s = fam_seq;
    if (!s) return;
    free(s->kv);
    free(s->ik);
    free(s->draft_h);
    free(s);
}

/* ---- reports ---------------------------------------------------------------------------- */

/* Beyond the table's matrices (kv_b counts as the absorbed per-head products): absorbed
 * attention over the attended rows, and the indexer's scores over every visible key. */
static double glm_extra_flops(const model *m, int pos) {
    const glm_model *g = m->priv;
    int attended = g->has_indexer ? MIN(pos + 1, g->idx_topk) : pos + 1;
    double f = 0;
    for (int i = 0; i < g->n_layers; i++) {
        f += 2.0 * g->n_heads * attended * (g->kv_lora + g->rope);
        if (g->has_indexer && g->layers[i].full_indexer) f += (double)g->idx_heads * g->idx_dim * (pos + 1);
    }
    return 2.0 * f;
}

static const char *const glm_aliases[] = {"glm_moe_dsa", NULL};
static const char *const glm_model_types[] = {"glm_moe_dsa", NULL};

const family_ops glm_ops = {
    .name = "glm",
    .aliases = glm_aliases,
    .model_types = glm_model_types,
    .chat = &glm_chat,
    .turns = {.start = {"[gMASK]", "<sop>"}, .user = "<|user|>", .assistant = "<|assistant|>",
              .boundaries = {"<|system|>", "<|observation|>"}},
    .truncates = 1,   /* per-position rows only */
    .load = glm_load,
    .free = glm_free,
    .scratch_bytes = glm_scratch_bytes,
    .seq_new = glm_seq_new,
    .seq_free = glm_seq_free,
    .forward = glm_forward,
    .draft = glm_draft,
    .extra_flops = glm_extra_flops,
    .expert = glm_expert,
    .expert_scratch = glm_expert_scratch,
};
