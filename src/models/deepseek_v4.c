/* deepseek_v4.c — the DeepSeek V4 family: typed config (spec §1), validation of every tensor of
 * the official layout incl. MTP (spec §8), the per-sequence state parts (spec §10) and the
 * family_ops table. The math is in deepseek_v4_{forward,attn,moe}.c. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "../core/config.h"
#include "../core/util.h"
#include "../core/weights.h"
#include "deepseek_v4.h"

/* ---- config ------------------------------------------------------------------------------ */

/* Values the math depends on but this engine implements one way only: refuse anything else. */
static int check_fixed(const cJSON *j, char *err, size_t errlen) {
    const cJSON *v = config_get(j, "scoring_func");
    if (v && (!cJSON_IsString(v) || strcmp(v->valuestring, "sqrtsoftplus")))
        return errf(err, errlen, "config.json: scoring_func must be \"sqrtsoftplus\" for deepseek_v4");
    v = config_get(j, "topk_method");
    if (v && (!cJSON_IsString(v) || strcmp(v->valuestring, "noaux_tc")))
        return errf(err, errlen, "config.json: topk_method must be \"noaux_tc\" for deepseek_v4");
    int norm;
    if (config_bool_or(j, "norm_topk_prob", 1, &norm, err, errlen)) return -1;
    if (!norm) return errf(err, errlen, "config.json: norm_topk_prob false is not supported for deepseek_v4");
    return 0;
}

static int check_shapes(const dsv4_config *c, char *err, size_t errlen) {
    if (c->n_layers < 1 || c->n_layers + c->n_mtp > DSV4_MAX_LAYERS)
        return errf(err, errlen, "config.json: num_hidden_layers %d (+%d MTP) outside [1, %d]", c->n_layers, c->n_mtp,
                    DSV4_MAX_LAYERS);
    if (c->hc < 1 || c->hc > DSV4_MAX_HC) return errf(err, errlen, "config.json: hc_mult %d outside [1, %d]", c->hc, DSV4_MAX_HC);
    if (c->rope_dim < 2 || c->rope_dim % 2 || c->rope_dim > c->head_dim || c->rope_dim > 512)
        return errf(err, errlen, "config.json: qk_rope_head_dim %d invalid for head_dim %d", c->rope_dim, c->head_dim);
    if (c->rope_dim > c->idx_dim) return errf(err, errlen, "config.json: index_head_dim %d smaller than qk_rope_head_dim", c->idx_dim);
    if (c->idx_dim & (c->idx_dim - 1)) return errf(err, errlen, "config.json: index_head_dim %d is not a power of two", c->idx_dim);
    if (c->o_groups < 1 || (c->n_heads * c->head_dim) % c->o_groups)
        return errf(err, errlen, "config.json: o_groups %d does not divide the %d attention features", c->o_groups,
                    c->n_heads * c->head_dim);
    if (c->n_active < 1 || c->n_active > c->n_experts)
        return errf(err, errlen, "config.json: num_experts_per_tok %d outside [1, n_routed_experts=%d]", c->n_active,
                    c->n_experts);
    if (c->window < 1) return errf(err, errlen, "config.json: sliding_window must be >= 1");
    if (c->n_shared < 0 || c->n_hash < 0) return errf(err, errlen, "config.json: n_shared_experts / num_hash_layers must be >= 0");
    if (c->hc_iters < 1) return errf(err, errlen, "config.json: hc_sinkhorn_iters must be >= 1");
    const struct { const char *key; int v; } sizes[] = {
        {"hidden_size", c->dim}, {"vocab_size", c->vocab}, {"num_attention_heads", c->n_heads},
        {"head_dim", c->head_dim}, {"q_lora_rank", c->q_lora}, {"o_lora_rank", c->o_lora},
        {"index_n_heads", c->idx_heads}, {"index_topk", c->idx_topk}, {"moe_intermediate_size", c->moe_inter}};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        if (sizes[i].v < 1) return errf(err, errlen, "config.json: %s is %d (must be >= 1)", sizes[i].key, sizes[i].v);
    for (int l = 0; l < c->n_layers + c->n_mtp; l++)
        if (c->ratios[l] < 0 || c->ratios[l] == 1)
            return errf(err, errlen, "config.json: compress_ratios[%d] = %d (must be 0 or >= 2)", l, c->ratios[l]);
    return 0;
}

static int parse_config(const cJSON *j, dsv4_config *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    const config_int_field ints[] = {
        {"hidden_size", &c->dim}, {"num_hidden_layers", &c->n_layers}, {"vocab_size", &c->vocab},
        {"num_attention_heads", &c->n_heads}, {"head_dim", &c->head_dim}, {"qk_rope_head_dim", &c->rope_dim},
        {"q_lora_rank", &c->q_lora}, {"o_groups", &c->o_groups}, {"o_lora_rank", &c->o_lora},
        {"sliding_window", &c->window}, {"index_n_heads", &c->idx_heads}, {"index_head_dim", &c->idx_dim},
        {"index_topk", &c->idx_topk}, {"n_routed_experts", &c->n_experts}, {"num_experts_per_tok", &c->n_active},
        {"n_shared_experts", &c->n_shared}, {"moe_intermediate_size", &c->moe_inter},
        {"num_hash_layers", &c->n_hash}, {"hc_mult", &c->hc}, {"hc_sinkhorn_iters", &c->hc_iters},
    };
    const config_double_field doubles[] = {
        {"routed_scaling_factor", &c->route_scale}, {"swiglu_limit", &c->swiglu_limit}, {"hc_eps", &c->hc_eps},
        {"rms_norm_eps", &c->eps}, {"rope_theta", &c->rope_theta}, {"compress_rope_theta", &c->compress_theta},
    };
    if (config_ints(j, ints, sizeof ints / sizeof *ints, err, errlen) ||
        config_int_or(j, "num_nextn_predict_layers", 0, &c->n_mtp, err, errlen) ||
        config_doubles(j, doubles, sizeof doubles / sizeof *doubles, err, errlen))
        return -1;
    const cJSON *yarn = config_get(j, "rope_scaling");
    if (yarn && !cJSON_IsNull(yarn) &&
        (config_double(j, "rope_scaling.factor", &c->yarn_factor, err, errlen) ||
         config_double(j, "rope_scaling.original_max_position_embeddings", &c->yarn_orig, err, errlen) ||
         config_double(j, "rope_scaling.beta_fast", &c->yarn_beta_fast, err, errlen) ||
         config_double(j, "rope_scaling.beta_slow", &c->yarn_beta_slow, err, errlen)))
        return -1;
    int nr;
    if (config_int_array(j, "compress_ratios", c->ratios, DSV4_MAX_LAYERS, &nr, err, errlen)) return -1;
    if (c->n_mtp < 0 || nr < c->n_layers + c->n_mtp)
        return errf(err, errlen, "config.json: compress_ratios has %d entries, need num_hidden_layers + "
                    "num_nextn_predict_layers = %d", nr, c->n_layers + c->n_mtp);
    if (check_fixed(j, err, errlen)) return -1;
    return check_shapes(c, err, errlen);
}

/* ---- tensors ----------------------------------------------------------------------------- */

/* Looks tensors up by printf-style name; after the first failure every call returns NULL and
 * err keeps the first message (which names the tensor). */
typedef struct {
    const st_file *st;
    dsv4_model *d;             /* owns the small-vector copies */
    char *err;
    size_t errlen;
    int failed, count;
} loader;

/* The data of tensor `fmt...` checked to be `type` [d0, d1] (d1 < 0: 1-D [d0]), or NULL. */
static const void *tensor(loader *ld, dtype type, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static const void *tensor(loader *ld, dtype type, int64_t d0, int64_t d1, const char *fmt, ...) {
    if (ld->failed) return NULL;
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t shape[2] = {d0, d1};
    const st_tensor *t = st_expect(ld->st, name, type, d1 < 0 ? 1 : 2, shape, ld->err, ld->errlen);
    if (!t) { ld->failed = 1; return NULL; }
    ld->count++;
    return t->data;
}

/* Small vectors (norm weights, biases, sinks, mixing parameters, ape) are copied out of the
 * mapping: safetensors does not align tensor data and these are read element by element. */
static const void *own(loader *ld, const void *src, size_t bytes) {
    if (!src) return NULL;
    void *p = memcpy(xmalloc(bytes), src, bytes);
    ld->d->owned = xrealloc(ld->d->owned, sizeof(void *) * (ld->d->n_owned + 1));
    ld->d->owned[ld->d->n_owned++] = p;
    return p;
}

/* A weight matrix in any format the kernels run (core/weights.h): the official layout is E4M3
 * [out, in] + E8M0 `.scale` per 128x128 block for FP8 linears, packed E2M1 + E8M0 per 32 inputs
 * for routed experts, BF16/F32 for the rest; F32 block scales and the other formats load too. */
static qmat mat(loader *ld, int rows, int cols, const char *name) {
    qmat q = {0};
    if (ld->failed) return q;
    if (weights_matrix(ld->st, name, rows, cols, &q, &ld->count, ld->err, ld->errlen)) ld->failed = 1;
    return q;
}

/* The linear `prefix + sub + ".weight"` (e.g. "layers.3." + "attn.wq_a"). */
static qmat mat_at(loader *ld, const char *prefix, const char *sub, int rows, int cols) {
    char name[512];
    snprintf(name, sizeof name, "%s%s.weight", prefix, sub);
    return mat(ld, rows, cols, name);
}

static dsv4_hc load_hc(loader *ld, const dsv4_config *c, int nmix, const char *prefix, const char *sep) {
    char name[256];
    dsv4_hc h;
    snprintf(name, sizeof name, "%s%sfn", prefix, sep);
    h.fn = mat(ld, nmix, c->hc * c->dim, name);
    h.base = own(ld, tensor(ld, DT_F32, nmix, -1, "%s%sbase", prefix, sep), nmix * 4);
    int nscale = nmix == c->hc ? 1 : 3;
    h.scale = own(ld, tensor(ld, DT_F32, nscale, -1, "%s%sscale", prefix, sep), nscale * 4);
    return h;
}

static dsv4_compressor load_compressor(loader *ld, const dsv4_config *c, int ratio, int width, const char *prefix) {
    dsv4_compressor cp = {ratio, width, ratio == 4 ? 2 : 1, {0}, {0}, NULL, NULL};
    char name[256];
    snprintf(name, sizeof name, "%s.wkv.weight", prefix);
    cp.wkv = mat(ld, cp.coff * width, c->dim, name);
    snprintf(name, sizeof name, "%s.wgate.weight", prefix);
    cp.wgate = mat(ld, cp.coff * width, c->dim, name);
    cp.ape = own(ld, tensor(ld, DT_F32, ratio, cp.coff * width, "%s.ape", prefix), (size_t)ratio * cp.coff * width * 4);
    cp.norm = own(ld, tensor(ld, DT_BF16, width, -1, "%s.norm.weight", prefix), width * 2);
    return cp;
}

static void load_attention(loader *ld, const dsv4_config *c, dsv4_layer *L, const char *p) {
    char name[256];
    int qw = c->n_heads * c->head_dim;
    L->attn_norm = own(ld, tensor(ld, DT_BF16, c->dim, -1, "%sattn_norm.weight", p), c->dim * 2);
    L->sink = own(ld, tensor(ld, DT_F32, c->n_heads, -1, "%sattn.attn_sink", p), c->n_heads * 4);
    L->q_norm = own(ld, tensor(ld, DT_BF16, c->q_lora, -1, "%sattn.q_norm.weight", p), c->q_lora * 2);
    L->kv_norm = own(ld, tensor(ld, DT_BF16, c->head_dim, -1, "%sattn.kv_norm.weight", p), c->head_dim * 2);
    L->wq_a = mat_at(ld, p, "attn.wq_a", c->q_lora, c->dim);
    L->wq_b = mat_at(ld, p, "attn.wq_b", qw, c->q_lora);
    L->wkv = mat_at(ld, p, "attn.wkv", c->head_dim, c->dim);
    L->wo_a = mat_at(ld, p, "attn.wo_a", c->o_groups * c->o_lora, qw / c->o_groups);
    L->wo_b = mat_at(ld, p, "attn.wo_b", c->dim, c->o_groups * c->o_lora);
    if (L->ratio) {
        snprintf(name, sizeof name, "%sattn.compressor", p);
        L->comp = load_compressor(ld, c, L->ratio, c->head_dim, name);
    }
    if (L->ratio == 4) {
        snprintf(name, sizeof name, "%sattn.indexer.compressor", p);
        L->idx_comp = load_compressor(ld, c, 4, c->idx_dim, name);
        L->idx_wq_b = mat_at(ld, p, "attn.indexer.wq_b", c->idx_heads * c->idx_dim, c->q_lora);
        snprintf(name, sizeof name, "%sattn.indexer.weights_proj.weight", p);
        L->idx_wproj = mat(ld, c->idx_heads, c->dim, name);
    }
}

/* The hash table decides which expert weights are read: every entry must name a real expert. */
static void check_tid2eid(loader *ld, const dsv4_config *c, const int64_t *t, const char *p) {
    if (!t) return;
    for (size_t i = 0; i < (size_t)c->vocab * c->n_active; i++) {
        int64_t e;
        memcpy(&e, t + i, sizeof e);
        if (e < 0 || e >= c->n_experts) {
            ld->failed = 1;
            errf(ld->err, ld->errlen, "tensor %sffn.gate.tid2eid: entry [%zu][%zu] = %lld is not an expert id in [0, %d)",
                 p, i / c->n_active, i % c->n_active, (long long)e, c->n_experts);
            return;
        }
    }
}

static void load_moe(loader *ld, const dsv4_config *c, dsv4_layer *L, const char *p) {
    char name[256];
    L->ffn_norm = own(ld, tensor(ld, DT_BF16, c->dim, -1, "%sffn_norm.weight", p), c->dim * 2);
    snprintf(name, sizeof name, "%sffn.gate.weight", p);
    L->gate = mat(ld, c->n_experts, c->dim, name);
    if (L->hash) {
        L->tid2eid = tensor(ld, DT_I64, c->vocab, c->n_active, "%sffn.gate.tid2eid", p);
        check_tid2eid(ld, c, L->tid2eid, p);
    } else {
        L->gate_bias = own(ld, tensor(ld, DT_F32, c->n_experts, -1, "%sffn.gate.bias", p), c->n_experts * 4);
    }
    L->w1 = xcalloc(c->n_experts, sizeof(qmat));
    L->w2 = xcalloc(c->n_experts, sizeof(qmat));
    L->w3 = xcalloc(c->n_experts, sizeof(qmat));
    for (int e = 0; e < c->n_experts && !ld->failed; e++) {
        snprintf(name, sizeof name, "%sffn.experts.%d.", p, e);
        L->w1[e] = mat_at(ld, name, "w1", c->moe_inter, c->dim);
        L->w2[e] = mat_at(ld, name, "w2", c->dim, c->moe_inter);
        L->w3[e] = mat_at(ld, name, "w3", c->moe_inter, c->dim);
        /* the experts generation runs (MTP is validated only) */
        int li = (int)(L - ld->d->layers);
        if (!ld->failed && li < c->n_layers &&
            experts_add(ld->d->experts, li, e, (qmat[]){L->w1[e], L->w3[e], L->w2[e]}, 3, ld->err, ld->errlen))
            ld->failed = 1;
    }
    int si = c->n_shared * c->moe_inter;
    if (!si) return;
    L->sw1 = mat_at(ld, p, "ffn.shared_experts.w1", si, c->dim);
    L->sw2 = mat_at(ld, p, "ffn.shared_experts.w2", c->dim, si);
    L->sw3 = mat_at(ld, p, "ffn.shared_experts.w3", si, c->dim);
}

/* Layer l < n_layers is "layers.l."; MTP block i is "mtp.i." with ratio compress_ratios[n_layers+i]. */
static void load_layer(loader *ld, dsv4_model *d, int l) {
    const dsv4_config *c = &d->c;
    dsv4_layer *L = &d->layers[l];
    char p[64];
    int mtp = l >= c->n_layers;
    if (mtp) snprintf(p, sizeof p, "mtp.%d.", l - c->n_layers);
    else snprintf(p, sizeof p, "layers.%d.", l);
    L->ratio = c->ratios[l];
    L->hash = !mtp && l < c->n_hash;
    L->rope = L->ratio ? &d->rope_yarn : &d->rope_plain;
    int nmix = (2 + c->hc) * c->hc;
    L->hc_attn = load_hc(ld, c, nmix, p, "hc_attn_");
    L->hc_ffn = load_hc(ld, c, nmix, p, "hc_ffn_");
    load_attention(ld, c, L, p);
    load_moe(ld, c, L, p);
}

/* MTP-only tensors (spec §6). Generation does not run MTP; they are validated so that a damaged
 * checkpoint fails at load, not when speculative decoding first touches them. */
static void check_mtp_extra(loader *ld, const dsv4_config *c, int i) {
    char p[64];
    snprintf(p, sizeof p, "mtp.%d.", i);
    mat_at(ld, p, "e_proj", c->dim, c->dim);
    mat_at(ld, p, "h_proj", c->dim, c->dim);
    tensor(ld, DT_BF16, c->dim, -1, "%senorm.weight", p);
    tensor(ld, DT_BF16, c->dim, -1, "%shnorm.weight", p);
    tensor(ld, DT_BF16, c->dim, -1, "%snorm.weight", p);
    load_hc(ld, c, c->hc, p, "hc_head_");
}

static void init_ropes(dsv4_model *d) {
    const dsv4_config *c = &d->c;
    rope_init(&d->rope_plain, c->rope_dim, c->rope_theta);
    if (c->yarn_orig > 0)
        rope_init_yarn(&d->rope_yarn, c->rope_dim, c->compress_theta, c->yarn_factor, c->yarn_orig, c->yarn_beta_fast,
                       c->yarn_beta_slow);
    else
        rope_init(&d->rope_yarn, c->rope_dim, c->compress_theta);
}

static void dsv4_free(model *m) {
    dsv4_model *d = m->priv;
    if (!d) return;
    if (d->layers)
        for (int l = 0; l < d->c.n_layers + d->c.n_mtp; l++) {
            free(d->layers[l].w1);
            free(d->layers[l].w2);
            free(d->layers[l].w3);
        }
    free(d->layers);
    for (int i = 0; i < d->n_owned; i++) free(d->owned[i]);
    free(d->owned);
    free(d);
    m->priv = NULL;
}

static int dsv4_load(model *m, char *err, size_t errlen) {
    dsv4_model *d = xcalloc(1, sizeof *d);
    m->priv = d;
    if (parse_config(m->config, &d->c, err, errlen)) return -1;
    const dsv4_config *c = &d->c;
    d->qat = m->num == NUMERICS_QAT;
    m->vocab_size = c->vocab;
    init_ropes(d);
    d->experts = m->experts;
    loader ld = {m->st, d, err, errlen, 0, 0};
    d->embed = mat(&ld, c->vocab, c->dim, "embed.weight");
    d->head = mat(&ld, c->vocab, c->dim, "head.weight");
    d->norm = own(&ld, tensor(&ld, DT_BF16, c->dim, -1, "norm.weight"), c->dim * 2);
    d->hc_head = load_hc(&ld, c, c->hc, "", "hc_head_");
    d->layers = xcalloc(c->n_layers + c->n_mtp, sizeof(dsv4_layer));
    for (int l = 0; l < c->n_layers + c->n_mtp && !ld.failed; l++) load_layer(&ld, d, l);
    for (int i = 0; i < c->n_mtp && !ld.failed; i++) check_mtp_extra(&ld, c, i);
    m->n_validated = ld.count;
    return ld.failed ? -1 : 0;
}

/* ---- sequences --------------------------------------------------------------------------- */

/* One compressor's parts: kv and score partials (RECUR; scores reset to -inf so empty slots
 * weigh nothing) and its compressed list (ROWS, one row per `ratio` positions). *kv_part gets the
 * kv part's index (the score part follows it). */
static int compressor_parts(state *st, const dsv4_compressor *cp, const char *tag, int l, int ctx, int *kv_part,
                            float **kv, float **score, float **list) {
    char name[48];
    *kv_part = st->nparts;
    size_t recur = (size_t)cp->coff * cp->ratio * cp->coff * cp->width * sizeof(float);
    snprintf(name, sizeof name, "L%d.%s.kv", l, tag);
    if (!(*kv = state_add_part(st, PART_RECUR, name, recur, 1, 1, 0))) return -1;
    snprintf(name, sizeof name, "L%d.%s.score", l, tag);
    if (!(*score = state_add_part(st, PART_RECUR, name, recur, 1, 1, -INFINITY))) return -1;
    snprintf(name, sizeof name, "L%d.%s.rows", l, tag);
    *list = state_add_part(st, PART_ROWS, name, cp->width * sizeof(float), MAX(1, ctx / cp->ratio), cp->ratio, 0);
    return *list ? 0 : -1;
}

/* Spec §10: the window ring of every layer, plus the compressor (and indexer) state of
 * compressed layers. */
static int layer_parts(state *st, const dsv4_config *c, const dsv4_layer *L, int l, int ctx, dsv4_layer_state *ls) {
    char name[48];
    snprintf(name, sizeof name, "L%d.window", l);
    ls->ring_part = st->nparts;
    if (!(ls->ring = state_add_part(st, PART_RING, name, c->head_dim * sizeof(float), c->window, 1, 0))) return -1;
    if (L->ratio &&
        compressor_parts(st, &L->comp, "comp", l, ctx, &ls->comp_part, &ls->ckv, &ls->cscore, &ls->clist))
        return -1;
    if (L->ratio == 4 &&
        compressor_parts(st, &L->idx_comp, "idx", l, ctx, &ls->idx_part, &ls->ikv, &ls->iscore, &ls->ilist))
        return -1;
    return 0;
}

static void layout_scratch(arena *a, dsv4_seq *s, const dsv4_config *c) {
    size_t C = DSV4_CHUNK, F = sizeof(float), qw = (size_t)c->n_heads * c->head_dim, k = c->n_active;
    size_t inter = (size_t)MAX(c->moe_inter, c->n_shared * c->moe_inter), iw = (size_t)c->idx_heads * c->idx_dim;
    s->h = arena_take(a, C * c->hc * c->dim, F);
    s->mix = arena_take(a, C * (2 + c->hc) * c->hc, F);
    s->post = arena_take(a, C * c->hc, F);
    s->comb = arena_take(a, C * c->hc * c->hc, F);
    s->tmp_hc = arena_take(a, (size_t)c->hc * c->dim, F);
    s->x = arena_take(a, C * c->dim, F);
    s->xq = arena_take(a, C * c->dim, F);
    s->qr = arena_take(a, C * c->q_lora, F);
    s->qrq = arena_take(a, C * c->q_lora, F);
    s->q = arena_take(a, C * qw, F);
    s->kv = arena_take(a, C * c->head_dim, F);
    s->ca = arena_take(a, C * 2 * c->head_dim, F);
    s->cs = arena_take(a, C * 2 * c->head_dim, F);
    s->ia = arena_take(a, C * 2 * c->idx_dim, F);
    s->is = arena_take(a, C * 2 * c->idx_dim, F);
    s->iq = arena_take(a, C * iw, F);
    s->iw = arena_take(a, C * c->idx_heads, F);
    s->o = arena_take(a, C * qw, F);
    s->g = arena_take(a, C * qw / c->o_groups, F);
    s->ug = arena_take(a, C * c->o_lora, F);
    s->u = arena_take(a, C * c->o_groups * c->o_lora, F);
    s->f = arena_take(a, C * c->dim, F);
    s->moe_logit = arena_take(a, C * c->n_experts, F);
    s->moe_score = arena_take(a, c->n_experts, F);
    s->moe_biased = arena_take(a, c->n_experts, F);
    s->moe_w = arena_take(a, C * k, F);
    s->moe_rw = arena_take(a, C * k, F);
    s->moe_idx = arena_take(a, C * k, sizeof(int));
    s->moe_xe = arena_take(a, C * c->dim, F);       /* an expert sees each token at most once */
    s->moe_ge = arena_take(a, C * inter, F);
    s->moe_ue = arena_take(a, C * inter, F);
    s->moe_ye = arena_take(a, C * c->dim, F);
    s->moe_y = arena_take(a, C * k * c->dim, F);
    s->att_scores = arena_take(a, (size_t)c->n_heads * s->max_cand, F);
    s->cand = arena_take(a, s->max_cand, sizeof(float *));
    s->kmat = arena_take(a, (size_t)s->max_cand * c->head_dim, F);
    s->kt = arena_take(a, (size_t)s->max_cand * c->head_dim, F);
    s->idx_dots = arena_take(a, ((size_t)s->ctx / 4 + 1) * c->idx_heads, F);
    s->idx_scores = arena_take(a, (size_t)s->ctx / 4 + 1, F);
    s->idx_top = arena_take(a, c->idx_topk, sizeof(int));
    s->row_id = arena_take(a, C, sizeof(int));
    s->row_pos = arena_take(a, C, sizeof(int));
    s->row_seq = arena_take(a, C, sizeof(dsv4_seq *));
    s->head_out = arena_take(a, (size_t)DSV4_HEAD_ROWS * c->vocab, F);
}

/* Most candidates any query can have: the window plus the largest compressed set. */
static int max_candidates(const dsv4_model *d, int ctx) {
    int most = 0;
    for (int l = 0; l < d->c.n_layers; l++) {
        int r = d->layers[l].ratio;
        if (r) most = MAX(most, r == 4 ? MIN(d->c.idx_topk, ctx / 4) : ctx / r);
    }
    return d->c.window + most;
}

static void dsv4_seq_free(model *m, void *fam) {
    dsv4_seq *s = fam;
    if (!s) return;
    free(s->ls);
    free(s);
}

/* The scratch layout measured for ctx: every buffer, sized for DSV4_CHUNK tokens per pass. */
static size_t dsv4_scratch_bytes(const model *m, int ctx) {
    dsv4_seq probe = {.ctx = ctx, .max_cand = max_candidates(m->priv, ctx)};
    arena measure = {0};
    layout_scratch(&measure, &probe, &((const dsv4_model *)m->priv)->c);
    return measure.used;
}

static void *dsv4_seq_new(model *m, state *st, int ctx, arena *scratch, char *err, size_t errlen) {
    const dsv4_model *d = m->priv;
    if (ctx < 1) { errf(err, errlen, "deepseek_v4: context must be >= 1 (got %d)", ctx); return NULL; }
    dsv4_seq *s = xcalloc(1, sizeof *s);
    s->ctx = ctx;
    s->st = st;
    s->max_cand = max_candidates(d, ctx);
    s->ls = xcalloc(d->c.n_layers, sizeof *s->ls);
    for (int l = 0; l < d->c.n_layers; l++)
        if (layer_parts(st, &d->c, &d->layers[l], l, ctx, &s->ls[l])) {
            errf(err, errlen, "deepseek_v4: out of memory for the state of layer %d (context %d)", l, ctx);
            dsv4_seq_free(m, s);
            return NULL;
        }
    layout_scratch(scratch, s, &d->c);   /* for good: the buffers live as long as the sequence */
    return s;
}

/* ---- reports ----------------------------------------------------------------------------- */

/* Every dense matrix a token passes through in layer L (absent ones have data == NULL). */
static int layer_mats(const dsv4_layer *L, const qmat **out) {
    const qmat *all[] = {&L->hc_attn.fn, &L->hc_ffn.fn, &L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b,
                         &L->comp.wkv, &L->comp.wgate, &L->idx_comp.wkv, &L->idx_comp.wgate, &L->idx_wq_b,
                         &L->idx_wproj, &L->gate, &L->sw1, &L->sw2, &L->sw3};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i]->data) out[n++] = all[i];
    return n;
}

static size_t layer_dense_bytes(const dsv4_layer *L) {
    const qmat *mats[32];
    size_t b = 0;
    for (int i = 0, n = layer_mats(L, mats); i < n; i++) b += qmat_bytes(mats[i]);
    return b;
}

static size_t dsv4_decode_bytes(const model *m) {
    const dsv4_model *d = m->priv;
    size_t b = qmat_bytes(&d->head) + qmat_bytes(&d->hc_head.fn) + (size_t)d->c.dim * 2;
    for (int l = 0; l < d->c.n_layers; l++) {
        const dsv4_layer *L = &d->layers[l];
        size_t expert = qmat_bytes(&L->w1[0]) + qmat_bytes(&L->w2[0]) + qmat_bytes(&L->w3[0]);
        b += layer_dense_bytes(L) + (size_t)d->c.n_active * expert;
    }
    return b;
}

static double mat_flops(const qmat *q) { return 2.0 * q->rows * q->cols; }

/* FLOPs (2 per multiply-add) of one token at pos: every projection it runs, attention over its
 * candidates and the indexer over the visible entries. */
static double dsv4_token_flops(const model *m, int pos) {
    const dsv4_model *d = m->priv;
    const dsv4_config *c = &d->c;
    double f = mat_flops(&d->head) + mat_flops(&d->hc_head.fn);
    for (int l = 0; l < c->n_layers; l++) {
        const dsv4_layer *L = &d->layers[l];
        const qmat *mats[32];
        for (int i = 0, n = layer_mats(L, mats); i < n; i++) f += mat_flops(mats[i]);
        f += c->n_active * (mat_flops(&L->w1[0]) + mat_flops(&L->w2[0]) + mat_flops(&L->w3[0]));
        int cand = MIN(pos + 1, c->window), nvis = L->ratio ? (pos + 1) / L->ratio : 0;
        cand += L->ratio == 4 ? MIN(nvis, c->idx_topk) : nvis;
        f += 4.0 * c->n_heads * c->head_dim * cand;
        if (L->ratio == 4) f += 2.0 * c->idx_heads * c->idx_dim * nvis;
    }
    return f;
}

static const char *const dsv4_model_types[] = {"deepseek_v4", NULL};

const family_ops deepseek_v4_ops = {
    .name = "deepseek_v4",
    .model_types = dsv4_model_types,
    .chat = &deepseek_v4_chat,
    .turns = {.start = {"<｜begin▁of▁sentence｜>"}, .user = "<｜User｜>", .assistant = "<｜Assistant｜>"},
    .truncates = 0,   /* the window ring and compressor partials cannot rewind */
    .load = dsv4_load,
    .free = dsv4_free,
    .scratch_bytes = dsv4_scratch_bytes,
    .seq_new = dsv4_seq_new,
    .seq_free = dsv4_seq_free,
    .forward = dsv4_forward,
    .decode_bytes = dsv4_decode_bytes,
    .token_flops = dsv4_token_flops,
};
