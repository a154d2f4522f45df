/* test_ops.c — norms, RoPE (plain and YaRN), activations, top-k, Hadamard, dot, weighted rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels.h"
#include "core/ops.h"
#include "core/quant.h"
#include "test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static float rnd_float(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return ((int)((rng >> 20) % 20001) - 10000) * 1e-4f;
}

static int close_rel(double got, double want, double rel) { return fabs(got - want) <= rel * fmax(fabs(want), 1e-30); }

static void test_norms(void) {
    enum { N = 96 };
    float x[N], w[N], b[N], out[N];
    uint16_t wb[N];
    for (int i = 0; i < N; i++) {
        x[i] = rnd_float();
        w[i] = bf16_round(rnd_float());
        b[i] = rnd_float();
        wb[i] = f32_to_bf16(w[i]);
    }
    double ss = 0, mean = 0, var = 0;
    for (int i = 0; i < N; i++) { ss += (double)x[i] * x[i]; mean += x[i]; }
    mean /= N;
    for (int i = 0; i < N; i++) var += (x[i] - mean) * (x[i] - mean);
    double inv = 1 / sqrt(ss / N + 1e-6), linv = 1 / sqrt(var / N + 1e-5);
    int bad = 0;
    rmsnorm(out, x, w, N, 1e-6f);
    for (int i = 0; i < N; i++) bad += !close_rel(out[i], x[i] * inv * w[i], 1e-5);
    float outb[N];
    rmsnorm_bf16w(outb, x, wb, N, 1e-6f);
    bad += memcmp(out, outb, sizeof out) != 0;
    rmsnorm(out, x, NULL, N, 1e-6f);
    for (int i = 0; i < N; i++) bad += !close_rel(out[i], x[i] * inv, 1e-5);
    memcpy(out, x, sizeof x);
    rmsnorm(out, out, w, N, 1e-6f);                      /* aliasing allowed */
    for (int i = 0; i < N; i++) bad += !close_rel(out[i], x[i] * inv * w[i], 1e-5);
    layernorm(out, x, w, b, N, 1e-5f);
    for (int i = 0; i < N; i++) bad += fabs(out[i] - ((x[i] - mean) * linv * w[i] + b[i])) > 1e-5;
    CHECK(bad == 0, "%d norm outputs off the double formula", bad);
}

static void test_rope_tables(void) {
    rope_table t;
    rope_init(&t, 64, 10000);
    CHECK(t.dim == 64 && t.inv_freq[0] == 1.0f && close_rel(t.inv_freq[16], pow(10000, -0.5), 1e-7) &&
          close_rel(t.inv_freq[31], pow(10000, -62.0 / 64), 1e-7), "plain RoPE frequencies");
    /* DeepSeek V4 compressed layers: base 160000, factor 16, L = 65536, beta 32 / 1. By hand:
     * low = floor(64 ln(65536 / (32 * 2 pi)) / (2 ln 160000)) = floor(15.45) = 15,
     * high = ceil(64 ln(65536 / (2 pi)) / (2 ln 160000)) = ceil(24.71) = 25, ramp = (k - 15) / 10. */
    rope_init_yarn(&t, 64, 160000, 16, 65536, 32, 1);
    int bad = 0;
    for (int k = 0; k < 32; k++) {
        double f = pow(160000, -2.0 * k / 64), want;
        if (k <= 15) want = f;                            /* fast rotations: unchanged */
        else if (k >= 25) want = f / 16;                  /* slow rotations: interpolated by the factor */
        else want = f / 16 * ((k - 15) / 10.0) + f * (1 - (k - 15) / 10.0);
        if (!close_rel(t.inv_freq[k], want, 2e-7)) {
            bad++;
            printf("  k=%d got %.9g want %.9g\n", k, t.inv_freq[k], want);
        }
    }
    CHECK(bad == 0, "%d YaRN frequencies off the hand-derived table", bad);
    CHECK(close_rel(t.inv_freq[20], pow(160000, -40.0 / 64) * 17 / 32, 2e-7), "k=20 blends half and half");
}

static void test_rope_apply(void) {
    rope_table t;
    rope_init(&t, 2, 10000);                            /* one pair, inv_freq 1: angle = pos radians */
    float v[2] = {1, 0};
    rope_apply_interleaved(&t, v, 1, 0);
    CHECK(close_rel(v[0], cos(1.0), 1e-6) && close_rel(v[1], sin(1.0), 1e-6), "rotation by 1 rad: %g %g", v[0], v[1]);

    rope_init_yarn(&t, 64, 160000, 16, 65536, 32, 1);
    float x[64], y[64], h[64], back[64];
    for (int i = 0; i < 64; i++) x[i] = rnd_float();
    memcpy(y, x, sizeof x);
    rope_apply_interleaved(&t, y, 12345, 0);
    double n0 = 0, n1 = 0;
    for (int i = 0; i < 64; i++) { n0 += x[i] * x[i]; n1 += y[i] * y[i]; }
    CHECK(close_rel(n1, n0, 1e-5), "rotation keeps the norm");
    CHECK(memcmp(x, y, sizeof x) != 0, "rotation changed the vector");
    memcpy(back, y, sizeof y);
    rope_apply_interleaved(&t, back, 12345, 1);
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += fabs(back[i] - x[i]) > 1e-5;
    CHECK(bad == 0, "interleaved inverse undoes the rotation (%d off)", bad);
    /* Half layout is the same rotation on a permuted vector. */
    for (int k = 0; k < 32; k++) { h[k] = x[2 * k]; h[k + 32] = x[2 * k + 1]; }
    rope_apply_half(&t, h, 12345, 0);
    bad = 0;
    for (int k = 0; k < 32; k++) bad += h[k] != y[2 * k] || h[k + 32] != y[2 * k + 1];
    CHECK(bad == 0, "half layout matches interleaved after permutation (%d off)", bad);
    rope_apply_half(&t, h, 12345, 1);
    bad = 0;
    for (int k = 0; k < 32; k++) bad += fabs(h[k] - x[2 * k]) > 1e-5 || fabs(h[k + 32] - x[2 * k + 1]) > 1e-5;
    CHECK(bad == 0, "half inverse");
    /* Relative property: <rope(q, m), rope(k, n)> depends on m - n only. */
    float q1[64], k1[64], q2[64], k2[64];
    for (int i = 0; i < 64; i++) { q1[i] = q2[i] = rnd_float(); k1[i] = k2[i] = rnd_float(); }
    rope_apply_interleaved(&t, q1, 100, 0); rope_apply_interleaved(&t, k1, 90, 0);
    rope_apply_interleaved(&t, q2, 5010, 0); rope_apply_interleaved(&t, k2, 5000, 0);
    double d1 = 0, d2 = 0;
    for (int i = 0; i < 64; i++) { d1 += q1[i] * k1[i]; d2 += q2[i] * k2[i]; }
    CHECK(fabs(d1 - d2) < 1e-4, "scores depend on relative position: %g vs %g", d1, d2);

    /* Same table struct re-initialised, same position: the result must follow the new table. */
    rope_table a, b;
    float va[64], vb[64];
    rope_init(&a, 64, 10000);
    for (int i = 0; i < 64; i++) va[i] = vb[i] = x[i];
    rope_apply_interleaved(&a, va, 777, 0);
    rope_init(&a, 64, 160000);
    rope_init(&b, 64, 160000);
    memcpy(va, x, sizeof x);
    rope_apply_interleaved(&a, va, 777, 0);
    rope_apply_interleaved(&b, vb, 777, 0);
    CHECK(!memcmp(va, vb, sizeof va), "rotation follows a re-initialised table at the same position");
}

static void test_activations(void) {
    float s[5] = {1, 2, 3, 4, 1000};
    softmax(s, 5);
    CHECK(close_rel(s[4], 1.0, 1e-6) && s[0] == 0.0f, "softmax with a dominant entry");
    float t[4] = {0.5f, -1, 2, 0.25f};
    double z = exp(0.5) + exp(-1) + exp(2) + exp(0.25);
    softmax(t, 4);
    CHECK(close_rel(t[2], exp(2) / z, 1e-6) && close_rel(t[1], exp(-1) / z, 1e-6), "softmax values");
    CHECK(close_rel(silu(1.5f), 1.5 / (1 + exp(-1.5)), 1e-6) && silu(-100) > -1e-30f, "silu");
    CHECK(close_rel(softplus(0.3f), log1p(exp(0.3)), 1e-6) && softplus(100) == 100.0f &&
          close_rel(softplus(-30), exp(-30.0), 1e-5), "softplus");
    CHECK(close_rel(sigmoid_f32(-2), 1 / (1 + exp(2.0)), 1e-6) && sigmoid_f32(0) == 0.5f, "sigmoid");
}

static int cmp_desc_then_index(const float *x, int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); }

static void test_topk(void) {
    float x[] = {1, 3, 3, 2, 3, -1};
    int idx[6];
    topk(x, 6, 2, idx);
    CHECK(idx[0] == 1 && idx[1] == 2, "ties to lower index: %d %d", idx[0], idx[1]);
    topk(x, 6, 4, idx);
    CHECK(idx[0] == 1 && idx[1] == 2 && idx[2] == 4 && idx[3] == 3, "k=4: %d %d %d %d", idx[0], idx[1], idx[2], idx[3]);
    topk(x, 6, 0, idx);
    topk(x, 2, 5, idx);
    CHECK(idx[0] == 1 && idx[1] == 0, "k > n clamps");
    enum { N = 300, K = 17 };
    float v[N];
    int bad = 0, got[K], order[N];
    for (int trial = 0; trial < 20; trial++) {
        for (int i = 0; i < N; i++) v[i] = (float)((int)(rnd_float() * 20));   /* many ties */
        for (int i = 0; i < N; i++) order[i] = i;
        for (int i = 1; i < N; i++)                                            /* insertion sort reference */
            for (int j = i; j > 0 && cmp_desc_then_index(v, order[j], order[j - 1]); j--) {
                int tmp = order[j]; order[j] = order[j - 1]; order[j - 1] = tmp;
            }
        topk(v, N, K, got);
        bad += memcmp(got, order, sizeof got) != 0;
    }
    CHECK(bad == 0, "%d of 20 random top-k selections differ from a stable sort", bad);
}

static void test_hadamard(void) {
    enum { N = 64 };
    float e[N] = {1}, x[N], y[N];
    hadamard(e, N);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += e[i] != 0.125f;
    CHECK(bad == 0, "H e0 = 1/sqrt(n) everywhere");
    float r[N];
    for (int i = 0; i < N; i++) { r[i] = 0; }
    r[5] = 1;
    hadamard(r, N);
    for (int i = 0; i < N; i++) bad += fabsf(r[i]) != 0.125f || (r[i] < 0) != (__builtin_popcount(i & 5) & 1);
    CHECK(bad == 0, "row 5 of H has the Walsh sign pattern");
    for (int i = 0; i < N; i++) x[i] = y[i] = rnd_float();
    hadamard(y, N);
    double n0 = 0, n1 = 0;
    for (int i = 0; i < N; i++) { n0 += x[i] * x[i]; n1 += y[i] * y[i]; }
    CHECK(close_rel(n1, n0, 1e-5), "orthogonal: norm kept");
    hadamard(y, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += fabsf(y[i] - x[i]) > 1e-5f;
    CHECK(bad == 0, "H H = I");
    float odd[3] = {1, 2, 3};
    hadamard(odd, 3);
    CHECK(odd[0] == 1 && odd[1] == 2 && odd[2] == 3, "non-power-of-two length is refused, vector unchanged");
}

static void test_dot(void) {
    enum { N = 203 };
    float a[N], b[N];
    double want = 0;
    for (int i = 0; i < N; i++) { a[i] = rnd_float(); b[i] = rnd_float(); want += (double)a[i] * b[i]; }
    float d = dot_f32(a, b, N);
    CHECK(fabs(d - want) < 1e-4, "dot %g vs %g", d, want);
    kernels_force_scalar(1);
    float ds = dot_f32(a, b, N);
    kernels_force_scalar(0);
    CHECK(d == ds, "dot: SIMD and scalar agree bitwise");
}

/* weighted_rows: each head's column one fmaf chain over the rows in order from +0 (checked
 * bitwise against that chain written column by column), for one head and for six (a block of
 * four heads and two alone), two full register blocks and a tail, rows read at their stride,
 * each head's output at its own stride, nothing written past `width`. */
static void test_weighted_rows(void) {
    enum { K = 5, W = 2 * 64 + 37, STRIDE = W + 6, H = 6, OUT_STRIDE = W + 3 };
    static float w[H * K], rows[K * STRIDE], out[H * OUT_STRIDE];
    for (int k = 0; k < H * K; k++) w[k] = rnd_float();
    for (int i = 0; i < K * STRIDE; i++) rows[i] = rnd_float();
    for (int heads = 1; heads <= H; heads += H - 1) {
        for (int i = 0; i < H * OUT_STRIDE; i++) out[i] = 12345.0f;
        weighted_rows(out, OUT_STRIDE, w, heads, rows, K, STRIDE, W);
        int bad = 0, off = 0, past = 0;
        for (int h = 0; h < heads; h++) {
            for (int c = 0; c < W; c++) {
                float acc = 0.0f;
                double want = 0;
                for (int k = 0; k < K; k++) {
                    acc = fmaf(w[h * K + k], rows[k * STRIDE + c], acc);
                    want += (double)w[h * K + k] * rows[k * STRIDE + c];
                }
                bad += memcmp(&acc, &out[h * OUT_STRIDE + c], sizeof acc) != 0;
                off += fabs(out[h * OUT_STRIDE + c] - want) > 1e-5;
            }
            for (int c = W; c < OUT_STRIDE; c++) past += out[h * OUT_STRIDE + c] != 12345.0f;
        }
        CHECK(bad == 0, "weighted_rows (%d heads): %d columns differ from the in-order fmaf chain", heads, bad);
        CHECK(off == 0, "weighted_rows (%d heads): %d columns off the double sum", heads, off);
        CHECK(past == 0, "weighted_rows (%d heads) writes nothing past width", heads);
    }
}

/* Error in units of the last place of the f32 nearest want. */
static double ulps(float got, double want) {
    double ulp = want == 0 ? ldexp(1.0, -149) : ldexp(1.0, ilogb(want) - 23);
    return fabs(got - want) / ulp;
}

/* One element through a call the compiler cannot vectorize, for the bitwise comparisons below. */
__attribute__((noinline)) static float tanh_one(float x) { return tanh_f32(x); }
__attribute__((noinline)) static float sigmoid_one(float x) { return sigmoid_f32(x); }

/* ops.h's exp_f32, sigmoid_f32 and tanh_f32: within the ulps their comment states against double
 * precision over [-12, 12] (every 97th f32), tanh odd and exact near zero, saturated past the
 * clamps, and a vectorized loop over an array (this file's own, at -O2) gives the same bits as
 * one call per element. */
static void test_fast_transcendentals(void) {
    double worst_exp = 0, worst_sigmoid = 0, worst_tanh = 0;
    int odd = 0, n = 0;
    for (float x = -12.0f; x < 12.0f; n++) {
        worst_exp = fmax(worst_exp, ulps(exp_f32(x), exp((double)x)));
        worst_sigmoid = fmax(worst_sigmoid, ulps(sigmoid_f32(x), 1 / (1 + exp(-(double)x))));
        worst_tanh = fmax(worst_tanh, ulps(tanh_f32(x), tanh((double)x)));
        odd += tanh_f32(-x) != -tanh_f32(x);
        for (int k = 0; k < 97; k++) x = nextafterf(x, 13.0f);
    }
    CHECK(n > 100000 && worst_exp <= 1.0 && worst_sigmoid <= 2.0 && worst_tanh <= 2.5,
          "worst ulps over %d points: exp %.2f sigmoid %.2f tanh %.2f", n, worst_exp, worst_sigmoid, worst_tanh);
    CHECK(odd == 0, "tanh_f32 is odd (%d points not)", odd);
    float tiny[] = {1e-30f, 1e-10f, 3e-6f, 1e-3f};
    int tiny_bad = 0;
    for (int i = 0; i < 4; i++) tiny_bad += ulps(tanh_f32(tiny[i]), tanh((double)tiny[i])) > 1.0;
    CHECK(tiny_bad == 0 && signbit(tanh_f32(-0.0f)) && tanh_f32(0.0f) == 0.0f, "tanh near zero keeps x and its sign");
    CHECK(tanh_f32(30.0f) == 1.0f && tanh_f32(-1e30f) == -1.0f && sigmoid_f32(-200.0f) >= 0.0f &&
              sigmoid_f32(-200.0f) < 1e-37f && sigmoid_f32(200.0f) == 1.0f && exp_f32(-200.0f) > 0.0f &&
              isfinite(exp_f32(200.0f)),
          "saturation past the clamps");
    enum { N = 4099 };   /* a vector body and a scalar remainder */
    static float x[N], t[N], s[N];
    for (int i = 0; i < N; i++) x[i] = (rnd_float() - 0.5f) * 40.0f;
    for (int i = 0; i < N; i++) t[i] = tanh_f32(x[i]);
    for (int i = 0; i < N; i++) s[i] = sigmoid_f32(x[i]);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        float ti = tanh_one(x[i]), si = sigmoid_one(x[i]);
        bad += memcmp(&ti, &t[i], sizeof ti) != 0 || memcmp(&si, &s[i], sizeof si) != 0;
    }
    CHECK(bad == 0, "%d elements of the vectorized loops differ from one call per element", bad);
}

int main(void) {
    test_norms();
    test_rope_tables();
    test_rope_apply();
    test_activations();
    test_topk();
    test_hadamard();
    test_dot();
    test_weighted_rows();
    test_fast_transcendentals();
    return TEST_END();
}
