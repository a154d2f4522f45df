/* deepseek_v4.c — the DeepSeek V4 family: typed config (spec §1), validation of every tensor of
 * the official layout incl. MTP (spec §8), the per-sequence state parts (spec §10) and the
 * family_ops table. The math is in deepseek_v4_{forward,attn,moe}.c. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../core/config.h"
#include "../core/util.h"
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

/* The tensor table (core/tensor_table.h), by group. Matrices in any format the kernels run
 * (core/weights.h): the official layout is E4M3 [out, in] + E8M0 `.scale` per 128x128 block for
 * FP8 linears, packed E2M1 + E8M0 per 32 inputs for routed experts, BF16/F32 for the rest; F32
 * block scales and the other formats load too. Small vectors (norm weights, biases, sinks,
 * mixing parameters, ape) are copied out of the mapping: safetensors does not align tensor data
 * and these are read element by element. */
#define MAT(n, role, d0, d1, type, field) {{n}, TT_MAT, role, 0, 2, {d0, d1}, offsetof(type, field), 0}
#define VEC(n, dt, d0, type, field) {{n}, TT_COPY, TT_DENSE, dt, 1, {d0}, offsetof(type, field), 0}
/* hc_pre/hc_post of one sub-layer or of the head, under "<prefix>hc_attn_" etc. */
static const tt_spec hc[] = {
    MAT("fn", TT_DENSE, DD_MIX, DD_HCDIM, dsv4_hc, fn),
    VEC("base", DT_F32, DD_MIX, dsv4_hc, base),
    VEC("scale", DT_F32, DD_NSCALE, dsv4_hc, scale),
};
static const tt_spec attention[] = {
    VEC("attn_norm.weight", DT_BF16, DD_DIM, dsv4_layer, attn_norm),
    VEC("attn.attn_sink", DT_F32, DD_HEADS, dsv4_layer, sink),
    VEC("attn.q_norm.weight", DT_BF16, DD_QLORA, dsv4_layer, q_norm),
    VEC("attn.kv_norm.weight", DT_BF16, DD_HEAD_DIM, dsv4_layer, kv_norm),
    MAT("attn.wq_a.weight", TT_DENSE, DD_QLORA, DD_DIM, dsv4_layer, wq_a),
    MAT("attn.wq_b.weight", TT_DENSE, DD_QW, DD_QLORA, dsv4_layer, wq_b),
    MAT("attn.wkv.weight", TT_DENSE, DD_HEAD_DIM, DD_DIM, dsv4_layer, wkv),
    MAT("attn.wo_a.weight", TT_DENSE, DD_OA, DD_OA_IN, dsv4_layer, wo_a),
    MAT("attn.wo_b.weight", TT_DENSE, DD_DIM, DD_OA, dsv4_layer, wo_b),
};
/* One compressor of DD_RATIO and width DD_CWIDTH (DD_CROWS = coff * width). */
static const tt_spec compressor[] = {
    MAT("wkv.weight", TT_DENSE, DD_CROWS, DD_DIM, dsv4_compressor, wkv),
    MAT("wgate.weight", TT_DENSE, DD_CROWS, DD_DIM, dsv4_compressor, wgate),
    {{"ape"}, TT_COPY, TT_DENSE, DT_F32, 2, {DD_RATIO, DD_CROWS}, offsetof(dsv4_compressor, ape), 0},
    VEC("norm.weight", DT_BF16, DD_CWIDTH, dsv4_compressor, norm),
};
static const tt_spec indexer[] = {
    MAT("attn.indexer.wq_b.weight", TT_DENSE, DD_IQ, DD_QLORA, dsv4_layer, idx_wq_b),
    MAT("attn.indexer.weights_proj.weight", TT_DENSE, DD_IHEADS, DD_DIM, dsv4_layer, idx_wproj),
};
static const tt_spec moe[] = {
    VEC("ffn_norm.weight", DT_BF16, DD_DIM, dsv4_layer, ffn_norm),
    MAT("ffn.gate.weight", TT_DENSE, DD_EXPERTS, DD_DIM, dsv4_layer, gate),
    MAT("ffn.experts.%d.w1.weight", TT_ROUTED, DD_MOE_INTER, DD_DIM, dsv4_layer, w1),
    MAT("ffn.experts.%d.w2.weight", TT_ROUTED, DD_DIM, DD_MOE_INTER, dsv4_layer, w2),
    MAT("ffn.experts.%d.w3.weight", TT_ROUTED, DD_MOE_INTER, DD_DIM, dsv4_layer, w3),
};
/* Hash-routed layers read one row of tid2eid per token; score-routed ones have a bias. */
static const tt_spec hash_route[] = {
    {{"ffn.gate.tid2eid"}, TT_VIEW, TT_LOOKUP, DT_I64, 2, {DD_VOCAB, DD_ACTIVE}, offsetof(dsv4_layer, tid2eid), 0},
};
static const tt_spec score_route[] = {VEC("ffn.gate.bias", DT_F32, DD_EXPERTS, dsv4_layer, gate_bias)};
static const tt_spec shared[] = {
    MAT("ffn.shared_experts.w1.weight", TT_SHARED, DD_SHARED_INTER, DD_DIM, dsv4_layer, sw1),
    MAT("ffn.shared_experts.w2.weight", TT_SHARED, DD_DIM, DD_SHARED_INTER, dsv4_layer, sw2),
    MAT("ffn.shared_experts.w3.weight", TT_SHARED, DD_SHARED_INTER, DD_DIM, dsv4_layer, sw3),
};
static const tt_spec top[] = {
    MAT("embed.weight", TT_LOOKUP, DD_VOCAB, DD_DIM, dsv4_model, embed),
    MAT("head.weight", TT_DENSE, DD_VOCAB, DD_DIM, dsv4_model, head),
    VEC("norm.weight", DT_BF16, DD_DIM, dsv4_model, norm),
};
static const tt_spec mtp_extra[] = {
    MAT("e_proj.weight", TT_DENSE, DD_DIM, DD_DIM, dsv4_mtp, e_proj),
    MAT("h_proj.weight", TT_DENSE, DD_DIM, DD_DIM, dsv4_mtp, h_proj),
    VEC("enorm.weight", DT_BF16, DD_DIM, dsv4_mtp, enorm),
    VEC("hnorm.weight", DT_BF16, DD_DIM, dsv4_mtp, hnorm),
    VEC("norm.weight", DT_BF16, DD_DIM, dsv4_mtp, norm),
};
#undef MAT
#undef VEC
#define N(t) (int)(sizeof t / sizeof *t)

static void fill_dims(dsv4_model *d) {
    const dsv4_config *c = &d->c;
    int *v = d->dims, qw = c->n_heads * c->head_dim;
    v[DD_DIM] = c->dim, v[DD_VOCAB] = c->vocab, v[DD_HEADS] = c->n_heads, v[DD_HEAD_DIM] = c->head_dim;
    v[DD_QLORA] = c->q_lora, v[DD_QW] = qw, v[DD_OA] = c->o_groups * c->o_lora, v[DD_OA_IN] = qw / c->o_groups;
    v[DD_IQ] = c->idx_heads * c->idx_dim, v[DD_IHEADS] = c->idx_heads, v[DD_EXPERTS] = c->n_experts;
    v[DD_ACTIVE] = c->n_active, v[DD_MOE_INTER] = c->moe_inter, v[DD_SHARED_INTER] = c->n_shared * c->moe_inter;
    v[DD_HCDIM] = c->hc * c->dim;
}

typedef struct {
    tt_table *w;
    dsv4_model *d;
    int layer, idle, draft;    /* for the record */
} loader;

/* Loads table t under prefix + sub into dst; dims are the model's with the given overrides. */
static int load(loader *ld, const char *prefix, const char *sub, void *dst, const tt_spec *t, int n, const int *dims) {
    char p[128];
    snprintf(p, sizeof p, "%s%s", prefix, sub);
    tt_group g = {.prefix = p, .dst = dst, .dims = dims ? dims : ld->d->dims, .layer = ld->layer,
                  .experts = ld->d->c.n_experts, .active = ld->d->c.n_active, .idle = ld->idle,
                  .draft = ld->draft};
    return tt_load(ld->w, t, n, &g);
}

static int load_hc(loader *ld, dsv4_hc *h, int nmix, const char *prefix, const char *sep) {
    int dims[DD_COUNT];
    memcpy(dims, ld->d->dims, sizeof dims);
    dims[DD_MIX] = nmix;
    dims[DD_NSCALE] = nmix == ld->d->c.hc ? 1 : 3;
    return load(ld, prefix, sep, h, hc, N(hc), dims);
}

static int load_compressor(loader *ld, dsv4_compressor *cp, int ratio, int width, const char *prefix, const char *sub) {
    *cp = (dsv4_compressor){.ratio = ratio, .width = width, .coff = ratio == 4 ? 2 : 1};
    int dims[DD_COUNT];
    memcpy(dims, ld->d->dims, sizeof dims);
    dims[DD_RATIO] = ratio;
    dims[DD_CROWS] = cp->coff * width;
    dims[DD_CWIDTH] = width;
    return load(ld, prefix, sub, cp, compressor, N(compressor), dims);
}

/* The hash table decides which expert weights are read: every entry must name a real expert. */
static int check_tid2eid(tt_table *w, const dsv4_config *c, const int64_t *t, const char *p) {
    for (size_t i = 0; i < (size_t)c->vocab * c->n_active; i++) {
        int64_t e;
        memcpy(&e, t + i, sizeof e);
        if (e < 0 || e >= c->n_experts)
            return tt_fail(w, "tensor %sffn.gate.tid2eid: entry [%zu][%zu] = %lld is not an expert id in [0, %d)", p,
                           i / c->n_active, i % c->n_active, (long long)e, c->n_experts);
    }
    return 0;
}

static int load_ffn(loader *ld, dsv4_layer *L, const char *p) {
    const dsv4_config *c = &ld->d->c;
    if (load(ld, p, "", L, moe, N(moe), NULL)) return -1;
    if (L->hash ? load(ld, p, "", L, hash_route, N(hash_route), NULL) || check_tid2eid(ld->w, c, L->tid2eid, p)
                : load(ld, p, "", L, score_route, N(score_route), NULL))
        return -1;
    return c->n_shared ? load(ld, p, "", L, shared, N(shared), NULL) : 0;
}

/* Layer l < n_layers is "layers.l."; MTP block i is "mtp.i." with ratio compress_ratios[n_layers+i]
 * and its own tensors. Block 0 drafts (counted as draft weights); further blocks are validated only. */
static int load_layer(tt_table *w, dsv4_model *d, int l) {
    const dsv4_config *c = &d->c;
    dsv4_layer *L = &d->layers[l];
    char p[64];
    int mtp = l >= c->n_layers, nmix = (2 + c->hc) * c->hc;
    if (mtp) snprintf(p, sizeof p, "mtp.%d.", l - c->n_layers);
    else snprintf(p, sizeof p, "layers.%d.", l);
    L->ratio = c->ratios[l];
    L->hash = !mtp && l < c->n_hash;
    L->mtp = mtp;
    L->rope = L->ratio ? &d->rope_yarn : &d->rope_plain;
    loader ld = {w, d, l, mtp && l > c->n_layers, l == c->n_layers};
    if (load_hc(&ld, &L->hc_attn, nmix, p, "hc_attn_") || load_hc(&ld, &L->hc_ffn, nmix, p, "hc_ffn_") ||
        load(&ld, p, "", L, attention, N(attention), NULL) ||
        (L->ratio && load_compressor(&ld, &L->comp, L->ratio, c->head_dim, p, "attn.compressor.")) ||
        (L->ratio == 4 && (load_compressor(&ld, &L->idx_comp, 4, c->idx_dim, p, "attn.indexer.compressor.") ||
                           load(&ld, p, "", L, indexer, N(indexer), NULL))) ||
        load_ffn(&ld, L, p))
        return -1;
    if (!mtp) return 0;
    dsv4_mtp *x = &d->mtp[l - c->n_layers];
    return load(&ld, p, "", x, mtp_extra, N(mtp_extra), NULL) || load_hc(&ld, &x->hc_head, c->hc, p, "hc_head_");
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
    free(d->layers);
    free(d->mtp);
    free(d);
    m->priv = NULL;
}

static int dsv4_load(model *m, char *err, size_t errlen) {
    dsv4_model *d = xcalloc(1, sizeof *d);
    m->priv = d;
    d->experts = m->experts;
    if (parse_config(m->config, &d->c, err, errlen) || model_check_layers(m, d->c.n_layers + d->c.n_mtp, err, errlen))
        return -1;
    const dsv4_config *c = &d->c;
    d->qat = m->num == NUMERICS_QAT;
    m->vocab_size = c->vocab;
    m->pass_rows = DSV4_CHUNK;
    init_ropes(d);
    fill_dims(d);
    loader ld = {&m->weights, d, -1, 0, 0};
    if (load(&ld, "", "", d, top, N(top), NULL) || load_hc(&ld, &d->hc_head, c->hc, "", "hc_head_")) return -1;
    d->layers = xcalloc(c->n_layers + c->n_mtp, sizeof(dsv4_layer));
    d->mtp = xcalloc(c->n_mtp + 1, sizeof(dsv4_mtp));
    for (int l = 0; l < c->n_layers + c->n_mtp; l++)
        if (load_layer(&m->weights, d, l)) return -1;
    /* the draft steps keep their own copy of the block's window ring (deepseek_v4_mtp.c); a block
     * with compressors would need copies of those too, so such a checkpoint does not draft */
    m->draft_layers = c->n_mtp > 0 && d->layers[c->n_layers].ratio == 0;
    return 0;
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

static void layout_scratch(arena *a, dsv4_seq *s, const dsv4_config *c, int mtp) {
    size_t C = DSV4_CHUNK, F = sizeof(float), qw = (size_t)c->n_heads * c->head_dim, k = c->n_active;
    size_t inter = (size_t)MAX(c->moe_inter, c->n_shared * c->moe_inter), iw = (size_t)c->idx_heads * c->idx_dim;
    s->h = arena_take(a, C * c->hc * c->dim, F);
    s->mix = arena_take(a, C * (2 + c->hc) * c->hc, F);
    s->post = arena_take(a, C * c->hc, F);
    s->comb = arena_take(a, C * c->hc * c->hc, F);
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
    s->moe_ge = arena_take(a, C * inter, F);        /* the shared expert's rows (routed: core/experts.c) */
    s->moe_ue = arena_take(a, C * inter, F);
    s->moe_ye = arena_take(a, C * c->dim, F);
    s->moe_y = arena_take(a, C * k * c->dim, F);
    s->kv_over = arena_take(a, C * c->head_dim, F);
    s->run_first = arena_take(a, C, sizeof(int));
    s->run_last = arena_take(a, C, sizeof(int));
    s->row_id = arena_take(a, C, sizeof(int));
    s->row_pos = arena_take(a, C, sizeof(int));
    s->row_seq = arena_take(a, C, sizeof(dsv4_seq *));
    s->head_out = arena_take(a, (size_t)DSV4_HEAD_ROWS * c->vocab, F);
    if (mtp) s->mtp_in = arena_take(a, C * c->hc * c->dim, F);
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
    free(s->draft_ring);
    free(s->draft_h);
    free(s);
}

/* Does a sequence made now run the MTP block (model.spec_mtp on a checkpoint that drafts)? */
static int runs_mtp(const model *m) { return m->spec_mtp && m->draft_layers; }

/* The MTP block's parts (deepseek_v4.h): its window ring like a layer's, and "mtp.h", a RING of
 * one slot holding the last fed position's final 4-stream H, which the next position's MTP row
 * (in a forward call, or the first draft step) reads. */
static int mtp_parts(state *st, const dsv4_model *d, int ctx, dsv4_seq *s) {
    const dsv4_config *c = &d->c;
    s->mtp_h_part = st->nparts;
    size_t hbytes = (size_t)c->hc * c->dim * sizeof(float);
    if (!(s->mtp_h = state_add_part(st, PART_RING, "mtp.h", hbytes, 1, 1, 0))) return -1;
    if (layer_parts(st, c, &d->layers[c->n_layers], c->n_layers, ctx, &s->ls[c->n_layers])) return -1;
    s->draft_ring = xcalloc((size_t)c->window * c->head_dim, sizeof(float));
    s->draft_h = xcalloc((size_t)c->hc * c->dim, sizeof(float));
    return 0;
}

/* The scratch layout measured for ctx: every buffer, sized for DSV4_CHUNK tokens per pass. */
static size_t dsv4_scratch_bytes(const model *m, int ctx) {
    dsv4_seq probe = {.ctx = ctx};
    arena measure = {0};
    layout_scratch(&measure, &probe, &((const dsv4_model *)m->priv)->c, runs_mtp(m));
    return measure.used;
}

static void *dsv4_seq_new(model *m, state *st, int ctx, arena *scratch, char *err, size_t errlen) {
    const dsv4_model *d = m->priv;
    if (ctx < 1) { errf(err, errlen, "deepseek_v4: context must be >= 1 (got %d)", ctx); return NULL; }
    dsv4_seq *s = xcalloc(1, sizeof *s);
    s->ctx = ctx;
    s->st = st;
    s->max_cand = max_candidates(d, ctx);
    s->mtp_h_part = -1;
    s->ls = xcalloc(d->c.n_layers + 1, sizeof *s->ls);
    for (int l = 0; l < d->c.n_layers; l++)
        if (layer_parts(st, &d->c, &d->layers[l], l, ctx, &s->ls[l])) {
            errf(err, errlen, "deepseek_v4: out of memory for the state of layer %d (context %d)", l, ctx);
            dsv4_seq_free(m, s);
            return NULL;
        }
    if (runs_mtp(m) && mtp_parts(st, d, ctx, s)) {
        errf(err, errlen, "deepseek_v4: out of memory for the MTP block's state (context %d)", ctx);
        dsv4_seq_free(m, s);
        return NULL;
    }
    layout_scratch(scratch, s, &d->c, runs_mtp(m));   /* for good: the buffers live as long as the sequence */
    return s;
}

/* ---- reports ----------------------------------------------------------------------------- */

/* FLOPs (2 per multiply-add) beyond the table's matrices: attention over a token's candidates
 * and the indexer over the visible entries. */
static double dsv4_extra_flops(const model *m, int pos) {
    const dsv4_model *d = m->priv;
    const dsv4_config *c = &d->c;
    double f = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const dsv4_layer *L = &d->layers[l];
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
    .draft = dsv4_draft,
    .extra_flops = dsv4_extra_flops,
    .expert = dsv4_expert,
    .expert_scratch = dsv4_expert_scratch,
};
