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
 * The state parts are captured (state_capture) before each position's first write. */
#include <math.h>
#include <string.h>

#include "../core/threads.h"
#include "kimi_k3.h"

/* One token of one layer, shared by the head jobs. */
typedef struct {
    int hd;
    float *state;              /* [heads][hd][hd] */
    const float *q, *k, *v;    /* this token's [heads * hd] */
    const float *decay;        /* exp(g), [heads * hd] */
    const float *beta;         /* [heads] */
    float *out;                /* [heads * hd] */
    float *work;               /* [heads][hd] predictions */
} kda_step;

/* Decay, predict, delta-rule write and read for head h; every sum runs over the key index in order. */
static void head_step(void *ctx, int h) {
    kda_step *j = ctx;
    int d = j->hd;
    float *S = j->state + (size_t)h * d * d, *pred = j->work + (size_t)h * d, *o = j->out + (size_t)h * d;
    const float *q = j->q + (size_t)h * d, *k = j->k + (size_t)h * d, *v = j->v + (size_t)h * d;
    const float *dec = j->decay + (size_t)h * d;
    memset(pred, 0, (size_t)d * sizeof *pred);
    for (int a = 0; a < d; a++) {
        float *row = S + (size_t)a * d;
        for (int b = 0; b < d; b++) {
            row[b] *= dec[a];
            pred[b] += row[b] * k[a];
        }
    }
    for (int b = 0; b < d; b++) pred[b] = (v[b] - pred[b]) * j->beta[h];
    memset(o, 0, (size_t)d * sizeof *o);
    for (int a = 0; a < d; a++) {
        float *row = S + (size_t)a * d;
        for (int b = 0; b < d; b++) {
            row[b] += k[a] * pred[b];
            o[b] += row[b] * q[a];
        }
    }
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
            float g = k->has_lower_bound ? k->lower_bound * sigmoidf(s * z) : -s * softplus(z);
            out[c] = expf(g);
        }
}

/* The buffers of one KDA layer pass over n tokens. */
typedef struct {
    float *raw[3], *act[3];    /* q, k, v projections, then conv + SiLU outputs [n][proj] */
    float *fa, *f, *beta, *gate, *ga, *core;
    float *dec, *work;         /* one token's decays and delta-rule predictions [proj] */
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
    b->dec = k3_floats(a, P);
    b->work = k3_floats(a, P);
}

size_t k3_kda_scratch(const k3_model *k, int n) {
    arena a = {0};
    kda_bufs b;
    kda_layout(&a, k, n, &b);
    return a.used;
}

void k3_kda_forward(const model *m, const k3_layer *l, int li, k3_seq *s, const float *hn, int pos0, int n,
                    float *out) {
    const k3_model *k = m->priv;
    const k3_kda *a = &l->lin;
    int H = k->kda_heads, d = k->kda_dim, P = H * d, K = k->conv_k;
    size_t mark = arena_mark(s->scratch);
    kda_bufs b;
    kda_layout(s->scratch, k, n, &b);
    const qmat *proj[3] = {&a->q, &a->k, &a->v};
    for (int i = 0; i < 3; i++) k3_project(m, proj[i], hn, n, b.raw[i]);
    k3_project(m, &a->f_a, hn, n, b.fa);
    k3_project(m, &a->f_b, b.fa, n, b.f);
    k3_project(m, &a->b, hn, n, b.beta);
    if (a->g.data) k3_project(m, &a->g, hn, n, b.gate);
    else {
        k3_project(m, &a->g_a, hn, n, b.ga);
        k3_project(m, &a->g_b, b.ga, n, b.gate);
    }
    kda_step j = {.hd = d, .state = s->kda[li], .work = b.work, .decay = b.dec};
    for (int t = 0; t < n; t++) {
        int pos = pos0 + t;
        size_t o = (size_t)t * P;
        state_capture(s->st, s->conv_part[li], pos);
        for (int i = 0; i < 3; i++)
            short_conv(a->conv[i], K, s->conv[li] + (size_t)i * P * (K - 1), b.raw[i] + o, P, b.act[i] + o);
        for (int i = 0; i < 3; i++) k3_round(m, b.act[i] + o, (size_t)P);
        l2norm_heads(b.act[0] + o, H, d, 1.0f / sqrtf((float)d));
        l2norm_heads(b.act[1] + o, H, d, 1.0f);
        decays(k, a, b.f + o, b.dec);
        for (int h = 0; h < H; h++) b.beta[(size_t)t * H + h] = sigmoidf(b.beta[(size_t)t * H + h]);
        state_capture(s->st, s->kda_part[li], pos);
        j.q = b.act[0] + o;
        j.k = b.act[1] + o;
        j.v = b.act[2] + o;
        j.beta = b.beta + (size_t)t * H;
        j.out = b.core + o;
        pool_run(H, head_step, &j);
    }
    float *core = b.core;
    k3_round(m, core, (size_t)n * P);
    for (size_t r = 0; r < (size_t)n * H; r++) rmsnorm(core + r * d, core + r * d, a->o_norm, d, k->eps);
    k3_round(m, core, (size_t)n * P);
    for (size_t c = 0; c < (size_t)n * P; c++) core[c] *= sigmoidf(b.gate[c]);
    k3_round(m, core, (size_t)n * P);
    k3_project(m, &a->o, core, n, out);
    arena_release(s->scratch, mark);
}
