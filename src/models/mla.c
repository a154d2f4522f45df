/* mla.c — absorbed MLA attention of one head (invariants in mla.h). */
#include "mla.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/ops.h"
#include "../core/quant.h"
#include "../core/util.h"

/* Is every value exact in BF16? Then the copy stores BF16 (half the bytes every token reads). */
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

size_t mla_absorbed_bytes(const mla_absorbed *a) { return a->uk_t.data ? qmat_bytes(&a->uk_t) : 0; }

size_t mla_work_floats(int kv_lora, int rope, int cnt) { return (size_t)kv_lora + rope + kv_lora + cnt; }

/* qcat = [W_uk^T q_nope | q_rope] scores every attended row in one kernel call (latent . q_abs +
 * rope . q_rope as a single dot); the softmax-weighted latent then goes through W_uv. The kernel
 * calls run inside a pool task, so they run on this thread. */
void mla_attend_head(const mla_absorbed *a, int h, int rope, const float *q_h, const float *rows, int cnt,
                     float scale, float *work, float *out) {
    int kvl = a->kv_lora, row_len = kvl + rope, per = a->nope + a->v_dim;
    float *qcat = work, *lat = qcat + row_len, *score = lat + kvl;
    qmat_mul_rows(&a->uk_t, h * kvl, (h + 1) * kvl, q_h, 1, qcat);
    memcpy(qcat + kvl, q_h + a->nope, (size_t)rope * sizeof *qcat);
    qmat attended = {.fmt = WF_F32, .rows = cnt, .cols = row_len, .data = rows};
    qmat_vec(&attended, qcat, score);
    for (int k = 0; k < cnt; k++) score[k] *= scale;
    softmax(score, cnt);
    weighted_rows(lat, score, rows, cnt, (size_t)row_len, kvl);
    qmat_mul_rows(&a->uv, h * per + a->nope, (h + 1) * per, lat, 1, out);
}
