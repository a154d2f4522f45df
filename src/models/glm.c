/* glm.c — GLM-5 family: config.json, tensor lookup/validation, sequence state layout.
 * The forward pass is in glm_forward.c; the module's invariants are in glm.h.
 * Matrices load as the checkpoints ship them, without conversion, through the shared loader
 * (core/weights.h): BF16 or F32 (official), F8_E4M3 with `_scale_inv` block scales (GLM-5-FP8),
 * or colibri's int8/int4 containers (GLM-5.2 int4: U8 codes + `.qs` F32 scales). */
#include "glm.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/config.h"
#include "../core/quant.h"
#include "../core/weights.h"
#include "../core/util.h"

#define NAME_MAX_LEN 160

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

/* Formats a tensor name into buf[NAME_MAX_LEN]; an over-long name is cut and then simply not found. */
static const char *tname(char *buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *tname(char *buf, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, NAME_MAX_LEN, fmt, ap);
    va_end(ap);
    return buf;
}

static void own(glm_model *g, void *p, size_t bytes) {
    if (g->n_owned == g->cap_owned) {
        g->cap_owned = g->cap_owned ? 2 * g->cap_owned : 64;
        g->owned = xrealloc(g->owned, (size_t)g->cap_owned * sizeof *g->owned);
        g->owned_bytes = xrealloc(g->owned_bytes, (size_t)g->cap_owned * sizeof *g->owned_bytes);
    }
    g->owned_bytes[g->n_owned] = bytes;
    g->owned[g->n_owned++] = p;
}

/* A weight matrix in any format the kernels run (core/weights.h); scales count as validated. */
static int get_mat(glm_model *g, const st_file *f, qmat *out, const char *name, int rows, int cols, char *err,
                   size_t errlen) {
    return weights_matrix(f, name, rows, cols, out, &g->n_validated, err, errlen);
}

/* A vector (norm weight, bias) copied to f32 once: they are tiny and read on every token. */
static float *get_vec(glm_model *g, const st_file *f, const char *name, int n, char *err, size_t errlen) {
    const st_tensor *t = st_find(f, name);
    if (!t) { errf(err, errlen, "missing tensor %s", name); return NULL; }
    if (t->ndim != 1 || t->shape[0] != n || (t->type != DT_BF16 && t->type != DT_F32)) {
        errf(err, errlen, "tensor %s in %s: expected BF16 or F32 [%d], found %s", name, t->file, n,
             dtype_name(t->type));
        return NULL;
    }
    float *v = xmalloc((size_t)n * sizeof *v);
    for (int i = 0; i < n; i++)
        v[i] = t->type == DT_F32 ? ((const float *)t->data)[i] : bf16_to_f32(((const uint16_t *)t->data)[i]);
    own(g, v, (size_t)n * sizeof *v);
    g->n_validated++;
    return v;
}

#define MAT(q, rows, cols, ...) get_mat(g, f, q, tname(name, __VA_ARGS__), rows, cols, err, errlen)
#define VEC(dst, n, ...) !((dst) = get_vec(g, f, tname(name, __VA_ARGS__), n, err, errlen))

static int load_swiglu(glm_model *g, const st_file *f, qmat *gate, qmat *up, qmat *down, int inter,
                       const char *prefix, char *err, size_t errlen) {
    char name[NAME_MAX_LEN];
    return MAT(gate, inter, g->dim, "%sgate_proj.weight", prefix) || MAT(up, inter, g->dim, "%sup_proj.weight", prefix) ||
           MAT(down, g->dim, inter, "%sdown_proj.weight", prefix) ? -1 : 0;
}

static int load_attention(glm_model *g, const st_file *f, glm_layer *l, const char *p, char *err, size_t errlen) {
    char name[NAME_MAX_LEN];
    int h = g->n_heads;
    if (MAT(&l->q_a, g->q_lora, g->dim, "%sq_a_proj.weight", p) || VEC(l->q_a_norm, g->q_lora, "%sq_a_layernorm.weight", p) ||
        MAT(&l->q_b, h * (g->nope + g->rope), g->q_lora, "%sq_b_proj.weight", p) ||
        MAT(&l->kv_a, g->kv_lora + g->rope, g->dim, "%skv_a_proj_with_mqa.weight", p) ||
        VEC(l->kv_a_norm, g->kv_lora, "%skv_a_layernorm.weight", p) ||
        MAT(&l->kv_b, h * (g->nope + g->v_dim), g->kv_lora, "%skv_b_proj.weight", p) ||
        MAT(&l->o, g->dim, h * g->v_dim, "%so_proj.weight", p))
        return -1;
    if (!g->has_indexer || !l->full_indexer) return 0;
    return MAT(&l->idx_wq_b, g->idx_heads * g->idx_dim, g->q_lora, "%sindexer.wq_b.weight", p) ||
           MAT(&l->idx_wk, g->idx_dim, g->dim, "%sindexer.wk.weight", p) ||
           VEC(l->idx_knorm_w, g->idx_dim, "%sindexer.k_norm.weight", p) ||
           VEC(l->idx_knorm_b, g->idx_dim, "%sindexer.k_norm.bias", p) ||
           MAT(&l->idx_weights, g->idx_heads, g->dim, "%sindexer.weights_proj.weight", p) ? -1 : 0;
}

static int load_moe(glm_model *g, const st_file *f, glm_layer *l, const char *p, char *err, size_t errlen) {
    char name[NAME_MAX_LEN], sub[NAME_MAX_LEN];
    if (MAT(&l->router, g->n_experts, g->dim, "%sgate.weight", p) ||
        VEC(l->router_bias, g->n_experts, "%sgate.e_score_correction_bias", p))
        return -1;
    l->e_gate = xcalloc((size_t)g->n_experts, sizeof(qmat));
    l->e_up = xcalloc((size_t)g->n_experts, sizeof(qmat));
    l->e_down = xcalloc((size_t)g->n_experts, sizeof(qmat));
    for (int e = 0; e < g->n_experts; e++) {
        tname(sub, "%sexperts.%d.", p, e);
        if (load_swiglu(g, f, &l->e_gate[e], &l->e_up[e], &l->e_down[e], g->moe_inter, sub, err, errlen)) return -1;
    }
    tname(sub, "%sshared_experts.", p);
    return load_swiglu(g, f, &l->gate, &l->up, &l->down, g->moe_inter * g->n_shared, sub, err, errlen);
}

static int load_layer(glm_model *g, const st_file *f, glm_layer *l, int i, char *err, size_t errlen) {
    char name[NAME_MAX_LEN], p[NAME_MAX_LEN];
    tname(p, "model.layers.%d.", i);
    if (VEC(l->attn_norm, g->dim, "%sinput_layernorm.weight", p) ||
        VEC(l->ffn_norm, g->dim, "%spost_attention_layernorm.weight", p))
        return -1;
    tname(name, "%sself_attn.", p);
    if (load_attention(g, f, l, name, err, errlen)) return -1;
    tname(name, "%smlp.", p);
    if (l->sparse) return load_moe(g, f, l, name, err, errlen);
    return load_swiglu(g, f, &l->gate, &l->up, &l->down, g->inter, name, err, errlen);
}

/* The MTP layer (index n_layers) is optional in a checkpoint; when present it must be well formed
 * (it runs only for speculative decoding, glm.h). */
static int load_mtp(glm_model *g, const st_file *f, const cJSON *c, char *err, size_t errlen) {
    char name[NAME_MAX_LEN];
    int n_mtp;
    if (config_int_or(c, "num_nextn_predict_layers", 0, &n_mtp, err, errlen)) return -1;
    if (n_mtp < 1 || !st_find(f, tname(name, "model.layers.%d.eh_proj.weight", g->n_layers))) return 0;
    g->mtp.sparse = 1;
    g->mtp.full_indexer = st_find(f, tname(name, "model.layers.%d.self_attn.indexer.wq_b.weight", g->n_layers)) != NULL;
    if (load_layer(g, f, &g->mtp, g->n_layers, err, errlen) ||
        MAT(&g->eh_proj, g->dim, 2 * g->dim, "model.layers.%d.eh_proj.weight", g->n_layers) ||
        VEC(g->enorm, g->dim, "model.layers.%d.enorm.weight", g->n_layers) ||
        VEC(g->hnorm, g->dim, "model.layers.%d.hnorm.weight", g->n_layers) ||
        VEC(g->mtp_norm, g->dim, "model.layers.%d.shared_head.norm.weight", g->n_layers))
        return -1;
    g->has_mtp = 1;
    return 0;
}

static void free_layer(glm_layer *l) {
    free(l->e_gate);
    free(l->e_up);
    free(l->e_down);
}

static void glm_free(model *m) {
    glm_model *g = m->priv;
    if (!g) return;
    for (int i = 0; g->layers && i < g->n_layers; i++) free_layer(&g->layers[i]);
    free_layer(&g->mtp);
    for (int i = 0; i < g->n_owned; i++) free(g->owned[i]);
    free(g->owned);
    free(g->owned_bytes);
    free(g->layers);
    free(g);
    m->priv = NULL;
}

static int glm_load(model *m, char *err, size_t errlen) {
    glm_model *g = xcalloc(1, sizeof *g);
    m->priv = g;
    const cJSON *c = m->config;
    const st_file *f = m->st;
    char name[NAME_MAX_LEN];
    if (read_dims(g, c, err, errlen) || read_routing(g, c, err, errlen) || read_rope(g, c, err, errlen)) return -1;
    g->layers = xcalloc((size_t)g->n_layers, sizeof *g->layers);
    if (read_mlp_types(g, c, err, errlen) || read_indexer(g, c, err, errlen)) return -1;
    for (int i = 0; i < g->n_layers; i++)
        if (load_layer(g, f, &g->layers[i], i, err, errlen)) return -1;
    if (MAT(&g->embed, g->vocab, g->dim, "model.embed_tokens.weight") ||
        MAT(&g->head, g->vocab, g->dim, "lm_head.weight") || VEC(g->final_norm, g->dim, "model.norm.weight") ||
        load_mtp(g, f, c, err, errlen))
        return -1;
    m->vocab_size = g->vocab;
    m->n_validated = g->n_validated;
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

static size_t layer_dense_bytes(const glm_model *g, const glm_layer *l) {
    size_t b = qmat_bytes(&l->q_a) + qmat_bytes(&l->q_b) + qmat_bytes(&l->kv_a) + qmat_bytes(&l->kv_b) +
               qmat_bytes(&l->o) + qmat_bytes(&l->gate) + qmat_bytes(&l->up) + qmat_bytes(&l->down);
    if (g->has_indexer && l->full_indexer)
        b += qmat_bytes(&l->idx_wq_b) + qmat_bytes(&l->idx_wk) + qmat_bytes(&l->idx_weights);
    if (l->sparse) b += qmat_bytes(&l->router);
    return b;
}

static size_t glm_decode_bytes(const model *m) {
    const glm_model *g = m->priv;
    size_t b = qmat_bytes(&g->head) + (size_t)g->dim * 2;
    for (int i = 0; i < g->n_layers; i++) {
        const glm_layer *l = &g->layers[i];
        b += layer_dense_bytes(g, l);
        if (l->sparse)   /* top_k experts of average size */
            b += (size_t)g->top_k * (qmat_bytes(&l->e_gate[0]) + qmat_bytes(&l->e_up[0]) + qmat_bytes(&l->e_down[0]));
    }
    return b;
}

/* Multiply-adds x2 of one token at position pos: projections, absorbed attention over the
 * attended rows, indexer scores, active experts, head. */
static double glm_token_flops(const model *m, int pos) {
    const glm_model *g = m->priv;
    double f = (double)g->vocab * g->dim;
    int attended = g->has_indexer ? MIN(pos + 1, g->idx_topk) : pos + 1;
    for (int i = 0; i < g->n_layers; i++) {
        const glm_layer *l = &g->layers[i];
        f += (double)g->q_lora * g->dim + (double)l->q_b.rows * g->q_lora + (double)l->kv_a.rows * g->dim +
             (double)l->o.rows * l->o.cols;
        f += (double)g->n_heads * ((double)(g->nope + g->v_dim) * g->kv_lora +
                                   2.0 * attended * (g->kv_lora + g->rope));
        if (g->has_indexer && l->full_indexer)
            f += (double)l->idx_wq_b.rows * g->q_lora + (double)g->idx_dim * g->dim +
                 (double)g->idx_heads * g->idx_dim * (pos + 1);
        int inter = l->sparse ? g->moe_inter * (g->top_k + g->n_shared) : g->inter;
        f += 3.0 * inter * g->dim + (l->sparse ? (double)g->n_experts * g->dim : 0);
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
    .decode_bytes = glm_decode_bytes,
    .token_flops = glm_token_flops,
};
