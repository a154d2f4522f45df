/* mla.c — absorbed MLA attention (invariants in mla.h). */
#include "mla.h"

#include <stdlib.h>
#include <string.h>

#include "../core/ops.h"
#include "../core/quant.h"
#include "../core/threads.h"
#include "../core/util.h"

/* Is every value exact in BF16? Then the copy stores BF16 (half the bytes every row reads). */
static int bf16_exact(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (bf16_round(x[i]) != x[i]) return 0;
    return 1;
}

int mla_absorb(mla_absorbed *a, const qmat *kv_b, int heads, int nope, int v_dim, int kv_lora, char *err,
               size_t errlen) {
    int per = nope + v_dim;
    if (kv_b->rows != heads * per || kv_b->cols != kv_lora)
        return errf(err, errlen, "kv_b_proj is [%d, %d], want [%d, %d]", kv_b->rows, kv_b->cols, heads * per, kv_lora);
    *a = (mla_absorbed){.heads = heads, .nope = nope, .v_dim = v_dim, .kv_lora = kv_lora};
    a->uv = *kv_b;
    a->uv.source = QM_SCRATCH;
    size_t n = (size_t)heads * kv_lora * nope;
    float *t = xmalloc(n * sizeof *t), *row = xmalloc((size_t)kv_lora * sizeof *row);
    for (int h = 0; h < heads; h++)
        for (int d = 0; d < nope; d++) {
            qmat_row(kv_b, h * per + d, row);
            for (int c = 0; c < kv_lora; c++) t[((size_t)h * kv_lora + c) * nope + d] = row[c];
        }
    free(row);
    a->uk_t = (qmat){.fmt = WF_F32, .rows = heads * kv_lora, .cols = nope, .data = t, .source = QM_SCRATCH};
    if (bf16_exact(t, n)) {
        uint16_t *b = xmalloc(n * sizeof *b);
        for (size_t i = 0; i < n; i++) b[i] = f32_to_bf16(t[i]);
        free(t);
        a->uk_t.fmt = WF_BF16;
        a->uk_t.data = b;
    }
    return 0;
}

void mla_absorbed_free(mla_absorbed *a) {
    free((void *)a->uk_t.data);
    a->uk_t.data = NULL;
}

static size_t staged_width(const mla_absorbed *a) { return (size_t)MAX(a->nope, a->v_dim); }

void mla_pass_layout(arena *sc, const mla_absorbed *a, int n, mla_pass *p) {
    size_t per_head = (size_t)a->heads * n;
    p->a = a;
    p->n = n;
    p->q_abs = arena_take(sc, per_head * a->kv_lora, sizeof(float));
    p->lat = arena_take(sc, per_head * a->kv_lora, sizeof(float));
    p->staged = arena_take(sc, per_head * staged_width(a), sizeof(float));
}

size_t mla_work_floats(int kv_lora, int rope, int cnt) { return (size_t)kv_lora + rope + cnt; }

typedef struct {
    mla_pass *p;
    const float *q;
    int rope;
    float *out;
} head_job;

static float *staged_head(const mla_pass *p, int h) { return p->staged + (size_t)h * p->n * staged_width(p->a); }

/* Head h's q_nope of every row, gathered contiguous, through W_uk^T in one call. */
static void queries_head(void *ctx, int h) {
    const head_job *j = ctx;
    const mla_pass *p = j->p;
    const mla_absorbed *a = p->a;
    int qk = a->nope + j->rope, kvl = a->kv_lora;
    float *qn = staged_head(p, h);
    for (int i = 0; i < p->n; i++)
        memcpy(qn + (size_t)i * a->nope, j->q + ((size_t)i * a->heads + h) * qk, (size_t)a->nope * sizeof *qn);
    qmat_mul_rows(&a->uk_t, h * kvl, (h + 1) * kvl, qn, p->n, p->q_abs + (size_t)h * p->n * kvl);
}

void mla_queries(mla_pass *p, const float *q, int rope) {
    head_job j = {.p = p, .q = q, .rope = rope};
    pool_run(p->a->heads, queries_head, &j);
}

void mla_attend_heads(mla_pass *p, int h0, int h1, int i, int rope, const float *q_rope, size_t q_stride,
                      const float *rows, int cnt, float scale, float *work) {
    int kvl = p->a->kv_lora, row_len = kvl + rope, nh = h1 - h0;
    float *qcat = work, *score = qcat + (size_t)nh * row_len;
    for (int h = h0; h < h1; h++) {
        float *qh = qcat + (size_t)(h - h0) * row_len;
        memcpy(qh, p->q_abs + ((size_t)h * p->n + i) * kvl, (size_t)kvl * sizeof *qh);
        memcpy(qh + kvl, q_rope + (size_t)(h - h0) * q_stride, (size_t)rope * sizeof *qh);
    }
    qmat attended = {.fmt = WF_F32, .rows = cnt, .cols = row_len, .data = rows};
    qmat_mul(&attended, qcat, nh, score);
    for (int h = 0; h < nh; h++) {
        float *sh = score + (size_t)h * cnt;
        for (int k = 0; k < cnt; k++) sh[k] *= scale;
        softmax(sh, cnt);
    }
    /* head h's latents are p->n rows of kv_lora apart */
    weighted_rows(p->lat + ((size_t)h0 * p->n + i) * kvl, (size_t)p->n * kvl, score, nh, rows, cnt, (size_t)row_len, kvl);
}

/* Head h's latents of every row through its W_uv in one call, then into each row's output. */
static void values_head(void *ctx, int h) {
    const head_job *j = ctx;
    const mla_pass *p = j->p;
    const mla_absorbed *a = p->a;
    int per = a->nope + a->v_dim, v = a->v_dim;
    float *y = staged_head(p, h);
    qmat_mul_rows(&a->uv, h * per + a->nope, (h + 1) * per, p->lat + (size_t)h * p->n * a->kv_lora, p->n, y);
    for (int i = 0; i < p->n; i++)
        memcpy(j->out + ((size_t)i * a->heads + h) * v, y + (size_t)i * v, (size_t)v * sizeof *y);
}

void mla_values(mla_pass *p, float *out) {
    head_job j = {.p = p, .out = out};
    pool_run(p->a->heads, values_head, &j);
}
