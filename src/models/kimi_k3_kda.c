/* kimi_k3_kda.c — Kimi Delta Attention, the recurrent linear-attention layer (invariants in kimi_k3.h).
 *
 * Follows Hugging Face transformers models/kimi_linear (KimiLinearDeltaAttention with
 * torch_recurrent_kda, the flash-linear-attention recurrence), per token t and head h:
 *   q, k, v  = SiLU(causal depthwise conv_K(W x)) over the last K raw projections (oldest first);
 *   q, k    /= sqrt(sum x^2 + 1e-6) (L2), then q /= sqrt(head_dim);
 *   g[c]     = lower_bound * sigmoid(exp(A_log[h]) * (f_b(f_a x)[c] + dt_bias[c]))   (K3)
 *            or -exp(A_log[h]) * softplus(f_b(f_a x)[c] + dt_bias[c])         (no lower bound);
 *   beta     = sigmoid(b_proj x)[h];
 *   S[i][j] *= exp(g[i]);  delta = beta * (v - S^T k);  S += k delta^T;  o = S^T q;
 *   out      = o_proj(RMSNorm_head(o; o_norm) * sigmoid(gate x)), gate = g_proj (full rank) or g_b g_a.
 * Prefill runs this recurrence token by token in position order (the chunked form HF uses for
 * prefill is the same math in another summation order, so it would not be bit-identical to
 * decode): any chunking of a prompt is then bit-identical to feeding it one token at a time.
 * Heads are independent, so one threadpool call runs each head through a whole stretch of tokens
 * (the same operations in the same order as one call per token); before it the convs run in
 * slices of channels over the stretch and the rows' norms, decays and betas one row per pool
 * index, and after the recurrence so do the rows' head norms and output gate. A stretch ends
 * where a capture is armed: the state parts are captured (state_capture) before the first write
 * of the stretch's first position, which is before each position's first write as state.h asks.
 * The projections run over every row of the pass at once, whichever sequence a row belongs to
 * (k3_run). */
#include <math.h>
#include <string.h>

#include "../core/threads.h"
#include "../core/util.h"
#include "kimi_k3.h"

/* A stretch of tokens [t0, t1) of one sequence in one layer, shared by the head jobs; the
 * per-token arrays are the pass's, indexed by row. */
typedef struct {
    int hd, heads, t0, t1;
    float *state;              /* [heads][hd][hd] */
    const float *q, *k, *v;    /* [rows][heads * hd] */
    const float *decay;        /* exp(g), [rows][heads * hd] */
    const float *beta;         /* [rows][heads] */
    float *out;                /* [rows][heads * hd] */
    float *work;               /* [heads][hd] predictions */
} kda_step;

/* Decay, predict, delta-rule write and read for head h at row t; every sum runs over the key index
 * in order. */
static void head_step(const kda_step *j, int h, int t) {
    int d = j->hd;
    size_t at = (size_t)t * j->heads * d + (size_t)h * d;
    float *S = j->state + (size_t)h * d * d, *pred = j->work + (size_t)h * d, *o = j->out + at;
    const float *q = j->q + at, *k = j->k + at, *v = j->v + at, *dec = j->decay + at;
    float beta = j->beta[(size_t)t * j->heads + h];
    memset(pred, 0, (size_t)d * sizeof *pred);
    for (int a = 0; a < d; a++) {
        float *row = S + (size_t)a * d;
        for (int b = 0; b < d; b++) {
            row[b] *= dec[a];
            pred[b] += row[b] * k[a];
        }
    }
    for (int b = 0; b < d; b++) pred[b] = (v[b] - pred[b]) * beta;
    memset(o, 0, (size_t)d * sizeof *o);
    for (int a = 0; a < d; a++) {
        float *row = S + (size_t)a * d;
        for (int b = 0; b < d; b++) {
            row[b] += k[a] * pred[b];
            o[b] += row[b] * q[a];
        }
    }
}

static void head_steps(void *ctx, int h) {
    const kda_step *j = ctx;
    for (int t = j->t0; t < j->t1; t++) head_step(j, h, t);
}

/* Causal depthwise conv of one token over `proj` channels, then SiLU; the window keeps the previous
 * K-1 raw inputs per channel, oldest first, and shifts in x. */
static void short_conv(const float *taps, int kern, float *win, const float *x, int proj, float *y) {
    int w = kern - 1;
    for (int c = 0; c < proj; c++) {
        const float *tc = taps + (size_t)c * kern;
        float *wc = win + (size_t)c * w, acc = 0.0f;
        for (int j = 0; j < w; j++) acc += tc[j] * wc[j];
        acc += tc[w] * x[c];
        for (int j = 0; j + 1 < w; j++) wc[j] = wc[j + 1];
        if (w > 0) wc[w - 1] = x[c];
        y[c] = silu(acc);
    }
}

static void l2norm_heads(float *x, int heads, int d, float scale) {
    for (int h = 0; h < heads; h++) {
        float *v = x + (size_t)h * d, ss = 0.0f;
        for (int i = 0; i < d; i++) ss += v[i] * v[i];
        float inv = scale / sqrtf(ss + 1e-6f);
        for (int i = 0; i < d; i++) v[i] *= inv;
    }
}

/* exp of the per-channel log-decay g (see the header comment) for one token. */
static void decays(const k3_model *k, const k3_kda *a, const float *f, float *out) {
    int d = k->kda_dim;
    for (int h = 0; h < k->kda_heads; h++)
        for (int i = 0; i < d; i++) {
            int c = h * d + i;
            float z = f[c] + a->dt_bias[c], s = a->decay_scale[h];
            float g = k->has_lower_bound ? k->lower_bound * sigmoid_f32(s * z) : -s * softplus(z);
            out[c] = expf(g);
        }
}

/* The buffers of one KDA layer pass over n tokens. */
typedef struct {
    float *raw[3], *act[3];    /* q, k, v projections, then conv + SiLU outputs [n][proj] */
    float *fa, *f, *beta, *gate, *ga, *core;
    float *dec;                /* decays [n][proj] */
    float *work;               /* delta-rule predictions [proj] */
} kda_bufs;

static void kda_layout(arena *a, const k3_model *k, int n, kda_bufs *b) {
    size_t P = (size_t)k->kda_heads * k->kda_dim, np = (size_t)n * P;
    for (int i = 0; i < 3; i++) b->raw[i] = k3_floats(a, np), b->act[i] = k3_floats(a, np);
    b->fa = k3_floats(a, (size_t)n * k->kda_dim);
    b->f = k3_floats(a, np);
    b->beta = k3_floats(a, (size_t)n * k->kda_heads);
    b->gate = k3_floats(a, np);
    b->ga = k->full_rank_gate ? NULL : k3_floats(a, (size_t)n * k->kda_dim);
    b->core = k3_floats(a, np);
    b->dec = k3_floats(a, np);
    b->work = k3_floats(a, P);
}

size_t k3_kda_scratch(const k3_model *k, int n) {
    arena a = {0};
    kda_bufs b;
    kda_layout(&a, k, n, &b);
    return a.used;
}

/* Channels per pool index of the convs: each walks the stretch in position order for its channels,
 * the only order a channel's window allows. */
#define KDA_CONV_CHANNELS 16

/* A stretch [t0, t1) of one sequence's rows, for the element work around the recurrence. */
typedef struct {
    const model *m;
    const k3_kda *a;
    kda_bufs *b;
    float *win;                /* the sequence's conv windows of this layer: [3][proj][K - 1] */
    int t0, t1;
} kda_prep;

/* The q, k and v convs (and SiLU) of channels [KDA_CONV_CHANNELS * i, ...) over the stretch. */
static void conv_channels(void *ctx, int i) {
    const kda_prep *j = ctx;
    const k3_model *k = j->m->priv;
    int P = k->kda_heads * k->kda_dim, K = k->conv_k, c0 = i * KDA_CONV_CHANNELS;
    int cnt = MIN(P - c0, KDA_CONV_CHANNELS);
    for (int q = 0; q < 3; q++) {
        const float *taps = j->a->conv[q] + (size_t)c0 * K;
        float *win = j->win + (size_t)q * P * (K - 1) + (size_t)c0 * (K - 1);
        for (int t = j->t0; t < j->t1; t++) {
            size_t o = (size_t)t * P + (size_t)c0;
            short_conv(taps, K, win, j->b->raw[q] + o, cnt, j->b->act[q] + o);
        }
    }
}

/* Row t's rounding, q/k L2 norms, decays and beta (a pool task: rows are independent). */
static void prep_row(void *ctx, int i) {
    const kda_prep *j = ctx;
    const k3_model *k = j->m->priv;
    int H = k->kda_heads, d = k->kda_dim, t = j->t0 + i;
    size_t o = (size_t)t * H * d;
    for (int q = 0; q < 3; q++) model_round(j->m, j->b->act[q] + o, (size_t)H * d);
    l2norm_heads(j->b->act[0] + o, H, d, 1.0f / sqrtf((float)d));
    l2norm_heads(j->b->act[1] + o, H, d, 1.0f);
    decays(k, j->a, j->b->f + o, j->b->dec + o);
    for (int h = 0; h < H; h++) j->b->beta[(size_t)t * H + h] = sigmoid_f32(j->b->beta[(size_t)t * H + h]);
}

/* The recurrence of one run (rows t0.. of the pass, positions pos0.. of its sequence), in
 * stretches that end where a capture is armed. */
static void run_recurrence(const model *m, const k3_kda *a, int li, const k3_run *r, kda_bufs *b) {
    const k3_model *k = m->priv;
    k3_seq *s = r->s;
    int H = k->kda_heads, d = k->kda_dim, P = H * d;
    kda_step j = {.hd = d, .heads = H, .state = s->kda[li], .work = b->work, .q = b->act[0], .k = b->act[1],
                  .v = b->act[2], .decay = b->dec, .beta = b->beta, .out = b->core};
    for (int t0 = r->t0, end = r->t0 + r->n; t0 < end;) {
        int pos = r->pos0 + (t0 - r->t0), t1 = end;
        int next = state_capture_next(s->st, pos);
        if (next - pos < t1 - t0) t1 = t0 + (next - pos);
        state_capture(s->st, s->conv_part[li], pos);
        state_capture(s->st, s->kda_part[li], pos);
        kda_prep prep = {m, a, b, s->conv[li], t0, t1};
        pool_run((P + KDA_CONV_CHANNELS - 1) / KDA_CONV_CHANNELS, conv_channels, &prep);
        pool_run(t1 - t0, prep_row, &prep);
        j.t0 = t0;
        j.t1 = t1;
        pool_run(H, head_steps, &j);
        t0 = t1;
    }
}

typedef struct {
    const model *m;
    const k3_kda *a;
    float *core;
    const float *gate;
} kda_out_job;

/* Row r of the recurrence's output: per-head RMS norm, then the output gate (a pool task). */
static void out_row(void *ctx, int r) {
    const kda_out_job *j = ctx;
    const k3_model *k = j->m->priv;
    int H = k->kda_heads, d = k->kda_dim;
    size_t P = (size_t)H * d;
    float *core = j->core + (size_t)r * P;
    const float *gate = j->gate + (size_t)r * P;
    model_round(j->m, core, P);
    for (int h = 0; h < H; h++) rmsnorm(core + (size_t)h * d, core + (size_t)h * d, j->a->o_norm, d, k->eps);
    model_round(j->m, core, P);
    for (size_t c = 0; c < P; c++) core[c] *= sigmoid_f32(gate[c]);
    model_round(j->m, core, P);
}

void k3_kda_forward(const model *m, const k3_layer *l, int li, const k3_run *runs, int nruns, const float *hn, int n,
                    float *out, arena *sc) {
    const k3_model *k = m->priv;
    const k3_kda *a = &l->lin;
    size_t mark = arena_mark(sc);
    kda_bufs b;
    kda_layout(sc, k, n, &b);
    /* every projection of the layer input in one pool job, then the low-rank second halves */
    const qmat *proj[] = {&a->q, &a->k, &a->v, &a->f_a, &a->b, a->g.data ? &a->g : &a->g_a};
    float *dst[] = {b.raw[0], b.raw[1], b.raw[2], b.fa, b.beta, a->g.data ? b.gate : b.ga};
    model_project_each(m, 6, proj, hn, n, dst);
    model_project(m, &a->f_b, b.fa, n, b.f);
    if (!a->g.data) model_project(m, &a->g_b, b.ga, n, b.gate);
    for (int r = 0; r < nruns; r++) run_recurrence(m, a, li, &runs[r], &b);
    kda_out_job oj = {m, a, b.core, b.gate};
    pool_run(n, out_row, &oj);
    model_project(m, &a->o, b.core, n, out);
    arena_release(sc, mark);
}
