/* kimi_k3_mla.c — gated NoPE multi-head latent attention (invariants in kimi_k3.h).
 *
 * Follows Hugging Face transformers models/kimi_linear (KimiLinearAttention) with K3's output gate:
 * q = q_b(RMSNorm_1e-6(q_a x)) per head [nope | rope]; the row kept per position is
 * [RMSNorm_1e-6(latent) | rope part], the rope part used raw (mla_use_nope: no rotation anywhere);
 * score_t = (q_nope . k_nope_t + q_rope . rope_t) / sqrt(nope + rope) with k/v from kv_b(latent);
 * out = o_proj(attention * sigmoid(g_proj x)).
 * The absorbed form is used for every token (prefill and decode alike, so chunk boundaries never
 * change the arithmetic): per head q_abs = W_uk^T q_nope over the latent scores every row in one
 * kernel call against [q_abs | q_rope], and the softmax-weighted latent goes through W_uv.
 * A row's heads are one mla_attend_heads call (mla.h: W_uk^T copied once at load, no per-call
 * dequantisation); a run's rows attend in parallel, or a lone row's heads do, four to a task. The projections run once per pass over every row, whichever sequence a row
 * belongs to (k3_run); each row attends over its own sequence's rows. */
#include <math.h>
#include <string.h>

#include "../core/threads.h"
#include "../core/util.h"
#include "kimi_k3.h"

/* The attention of one run's rows: row t0 + i (position pos0 + i) attends rows 0 .. pos0 + i. */
typedef struct {
    const k3_model *k;
    mla_pass pass;
    const float *q;          /* the pass's [n][heads][nope + rope] */
    const float *rows;       /* the layer's state part */
    int t0, pos0;
    int i;                   /* the row whose heads run in parallel (attend_head_group) */
    float *work;             /* [heads][work_stride] for that row */
    size_t work_stride;
} mla_job;

static void attend_heads(mla_job *j, int i, int h0, int h1, float *work) {
    const k3_model *k = j->k;
    int qk = k->nope + k->rope, t = j->t0 + i;
    const float *q = j->q + ((size_t)t * k->n_heads + h0) * qk;
    mla_attend_heads(&j->pass, h0, h1, t, k->rope, q + k->nope, (size_t)qk, j->rows, j->pos0 + i + 1,
                     1.0f / sqrtf((float)qk), work + (size_t)h0 * j->work_stride);
}

/* Several rows: rows in parallel, each row's heads on one thread in its thread's work. */
static void attend_row(void *ctx, int i) {
    mla_job *j = ctx;
    size_t len = (size_t)j->k->n_heads * j->work_stride;
    arena measure = {0};
    arena_take(&measure, len, sizeof(float));
    float *work = arena_take(arena_thread(measure.used), len, sizeof(float));
    attend_heads(j, i, 0, j->k->n_heads, work);
}

/* One row: its heads in parallel, MLA_HEADS_PER_TASK to a pool index, in the pass's work. */
static void attend_head_group(void *ctx, int g) {
    mla_job *j = ctx;
    int h0 = g * MLA_HEADS_PER_TASK;
    attend_heads(j, j->i, h0, MIN(j->k->n_heads, h0 + MLA_HEADS_PER_TASK), j->work);
}

/* The buffers of one MLA layer pass over n tokens whose last position is below `end`. */
typedef struct {
    float *qa, *q, *ckv, *heads, *gate;
    mla_pass pass;
    float *work;               /* per head [q_abs | q_rope | scores] */
    size_t work_stride;
} mla_bufs;

static void mla_layout(arena *a, const k3_model *k, const k3_mla *l, int n, int end, mla_bufs *b) {
    int qk = k->nope + k->rope, row = k->kv_lora + k->rope, hv = k->n_heads * k->v_dim;
    b->qa = k3_floats(a, (size_t)n * k->q_lora);
    b->q = k3_floats(a, (size_t)n * k->n_heads * qk);
    b->ckv = k3_floats(a, (size_t)n * row);
    b->heads = k3_floats(a, (size_t)n * hv);
    b->gate = k3_floats(a, (size_t)n * hv);
    mla_pass_layout(a, &l->absorbed, n, &b->pass);
    b->work_stride = mla_work_floats(k->kv_lora, k->rope, end);
    b->work = k3_floats(a, (size_t)k->n_heads * b->work_stride);
}

size_t k3_mla_scratch(const k3_model *k, const k3_layer *l, int n, int end) {
    arena a = {0};
    mla_bufs b;
    mla_layout(&a, k, &l->mla, n, end, &b);
    return a.used;
}

void k3_mla_forward(const model *m, const k3_layer *l, int li, const k3_run *runs, int nruns, const float *hn, int n,
                    float *out, arena *sc) {
    const k3_model *k = m->priv;
    const k3_mla *a = &l->mla;
    int row = k->kv_lora + k->rope, hv = k->n_heads * k->v_dim, end = 0;
    for (int r = 0; r < nruns; r++) end = MAX(end, runs[r].pos0 + runs[r].n);
    size_t mark = arena_mark(sc);
    mla_bufs b;
    mla_layout(sc, k, a, n, end, &b);
    model_project(m, &a->q_a, hn, n, b.qa);
    model_norm_rows(m, b.qa, b.qa, a->q_a_norm, n, k->q_lora, 1e-6f);
    model_project(m, &a->q_b, b.qa, n, b.q);
    model_project(m, &a->kv_a, hn, n, b.ckv);
    model_project(m, &a->g, hn, n, b.gate);
    mla_job j = {.k = k, .pass = b.pass, .q = b.q, .work = b.work, .work_stride = b.work_stride};
    mla_queries(&j.pass, b.q, k->rope);
    for (int r = 0; r < nruns; r++) {
        const k3_run *u = &runs[r];
        float *rows = u->s->kv[li];
        for (int i = 0; i < u->n; i++) {
            float *dst = rows + (size_t)(u->pos0 + i) * row;
            const float *src = b.ckv + (size_t)(u->t0 + i) * row;
            rmsnorm(dst, src, a->kv_a_norm, k->kv_lora, 1e-6f);
            model_round(m, dst, (size_t)k->kv_lora);
            memcpy(dst + k->kv_lora, src + k->kv_lora, (size_t)k->rope * sizeof *dst);
        }
        j.rows = rows, j.t0 = u->t0, j.pos0 = u->pos0;
        if (u->n >= pool_threads() && u->n > 1) {
            pool_run(u->n, attend_row, &j);
        } else {
            for (j.i = 0; j.i < u->n; j.i++) pool_run(mla_head_tasks(k->n_heads), attend_head_group, &j);
        }
    }
    mla_values(&j.pass, b.heads);
    model_round(m, b.heads, (size_t)n * hv);
    for (size_t c = 0; c < (size_t)n * hv; c++) b.heads[c] *= sigmoid_f32(b.gate[c]);
    model_round(m, b.heads, (size_t)n * hv);
    model_project(m, &a->o, b.heads, n, out);
    arena_release(sc, mark);
}
