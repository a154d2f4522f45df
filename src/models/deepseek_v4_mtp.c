/* deepseek_v4_mtp.c — the MTP block (spec §6) for speculative decoding: its rows inside every
 * forward call of a sequence made with model.spec_mtp, and the draft steps (family_ops.draft).
 *
 * MTP position p takes the final 4-stream H of main position p (before the head's hc_head) and
 * the token at p + 1:  X_i = e_proj(enorm(embed(tok))) + h_proj(hnorm(H_i)) for every stream i,
 * then an ordinary block (window-only attention with its own ring, score-routed MoE), then the
 * block's own hc_head + norm and the shared head predict the token at p + 2.
 *
 * STATE. Feeding position p + 1 completes MTP position p, so a forward call writes the block's
 * window row of p (slot (p + 1) mod window: deepseek_v4_attn.c ring_slot) and nothing else of
 * it: the attention output and MoE of those rows feed no later state, so only the KV projection
 * runs. "mtp.h" (one RING slot) carries H of the last fed position into the next call. Both are
 * hooked for captures at the position whose feed writes them, so a capture inside a verify call
 * is exact and speculative decoding rejects drafts by restoring one (model.c, state_rewind).
 *
 * DRAFTS write no state: step 0 copies the block's ring into draft_ring and every step attends
 * to and writes that copy; step j > 0 continues from the block's output streams of step j - 1. */
#include <string.h>

#include "../core/util.h"
#include "deepseek_v4.h"

/* The block's input of k rows into s->h: row r is MTP position pos[r] of seqs[r] with token
 * ids[r] and the streams in[r][hc][dim] (normed in place). Uses s->x, s->xq and s->f; sets the
 * pass's row tables for the block. */
static void mtp_input(const dsv4_model *d, dsv4_seq *s, float *in, int k, const int *ids, const int *pos,
                      dsv4_seq *const *seqs) {
    const dsv4_config *c = &d->c;
    const dsv4_mtp *x = &d->mtp[0];
    int dim = c->dim, hc = c->hc;
    for (int r = 0; r < k; r++) {
        float *e = s->x + (size_t)r * dim;
        qmat_row(&d->embed, ids[r], e);
        rmsnorm_bf16w(e, e, x->enorm, dim, (float)c->eps);
        dsv4_bf16(d, e, dim);
        memcpy(s->xq + (size_t)r * dim, e, sizeof(float) * dim);
        dsv4_act_qdq(d, s->xq + (size_t)r * dim, dim);
        s->row_id[r] = ids[r];
        s->row_pos[r] = pos[r];
        s->row_seq[r] = seqs[r];
    }
    for (int i = 0; i < k * hc; i++) {
        float *h = in + (size_t)i * dim;
        rmsnorm_bf16w(h, h, x->hnorm, dim, (float)c->eps);
        dsv4_bf16(d, h, dim);
        dsv4_act_qdq(d, h, dim);
    }
    qmat_mul(&x->e_proj, s->xq, k, s->f);
    dsv4_bf16(d, s->f, (size_t)k * dim);
    qmat_mul(&x->h_proj, in, k * hc, s->h);
    dsv4_bf16(d, s->h, (size_t)k * hc * dim);
    for (int r = 0; r < k; r++)
        for (int i = 0; i < hc; i++) {
            float *h = s->h + ((size_t)r * hc + i) * dim;
            const float *e = s->f + (size_t)r * dim;
            for (int j = 0; j < dim; j++) h[j] += e[j];
            dsv4_bf16(d, h, dim);
        }
}

void dsv4_mtp_rows(const dsv4_model *d, dsv4_seq *s, int n) {
    const dsv4_config *c = &d->c;
    const dsv4_layer *L = &d->layers[c->n_layers];
    size_t width = (size_t)c->hc * c->dim;
    int ids[DSV4_CHUNK], pos[DSV4_CHUNK], k = 0;
    dsv4_seq *seqs[DSV4_CHUNK];
    float *in = s->mtp_in;
    for (int t = 0; t < n; t++) {       /* a call may batch sequences without MTP (then no buffer) */
        dsv4_seq *own = s->row_seq[t];
        if (!own->mtp_h) continue;
        if (!in) in = own->mtp_in;      /* that sequence's scratch is idle in this call */
        int p = s->row_pos[t];
        if (p > 0) {                    /* H of p - 1 (this call's previous row, or an earlier call) */
            memcpy(in + (size_t)k * width, own->mtp_h, sizeof(float) * width);
            ids[k] = s->row_id[t];
            pos[k] = p - 1;
            seqs[k++] = own;
        }
        state_capture(own->st, own->mtp_h_part, p);
        memcpy(own->mtp_h, s->h + (size_t)t * width, sizeof(float) * width);
    }
    if (!k) return;
    mtp_input(d, s, in, k, ids, pos, seqs);
    dsv4_hc_pre(d, &L->hc_attn, L->attn_norm, s, k);
    dsv4_window_rows(d, L, c->n_layers, s, k);
}

int dsv4_draft(model *m, void *fam_seq, int pos, int id, int step, float *logits, char *err, size_t errlen) {
    const dsv4_model *d = m->priv;
    const dsv4_config *c = &d->c;
    dsv4_seq *s = fam_seq;
    int li = c->n_layers;
    size_t width = (size_t)c->hc * c->dim;
    if (!s->mtp_h) return errf(err, errlen, "draft: this sequence does not run the MTP block");
    if (pos < 1 || pos + step + 1 > s->ctx)
        return errf(err, errlen, "draft: position %d + %d outside [1, %d)", pos, step, s->ctx);
    if (id < 0 || id >= c->vocab) return errf(err, errlen, "draft: token id %d is outside the vocabulary", id);
    dsv4_layer_state kept = s->ls[li];
    if (step == 0) memcpy(s->draft_ring, kept.ring, sizeof(float) * (size_t)c->window * c->head_dim);
    s->ls[li].ring = s->draft_ring;
    s->ls[li].ring_part = -1;
    memcpy(s->mtp_in, step ? s->draft_h : s->mtp_h, sizeof(float) * width);
    int p = pos - 1 + step;
    mtp_input(d, s, s->mtp_in, 1, &id, &p, &s);
    dsv4_block(d, &d->layers[li], li, s, 1);
    s->ls[li] = kept;
    memcpy(s->draft_h, s->h, sizeof(float) * width);
    float mix[DSV4_MAX_HC];
    qmat_mul(&d->mtp[0].hc_head.fn, s->h, 1, mix);
    dsv4_head_state(d, &d->mtp[0].hc_head, d->mtp[0].norm, s, 0, mix, s->x);
    qmat_mul(&d->head, s->x, 1, logits);
    return 0;
}
