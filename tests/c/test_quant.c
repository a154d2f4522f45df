/* test_quant.c — number formats and activation QDQ against independent formulas:
 * E4M3/E2M1 values from the bit layout via pow(), rounding by brute-force nearest-code search. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/quant.h"
#include "test.h"

static uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint64_t rng = 88172645463325252ULL;
static double rand_unit(void) {     /* uniform in [0, 1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* E4M3 value straight from the definition: bias 7, 3 mantissa bits, e=0 subnormal. */
static double e4m3_formula(int b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? m / 8.0 * pow(2, -6) : (1 + m / 8.0) * pow(2, e - 7);
    return s ? -v : v;
}

/* Nearest representable magnitude among `vals` (ascending, index = code), ties to the even
 * code, saturating at the largest. */
static double nearest_code(double a, const double *vals, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        double d = fabs(a - vals[i]), db = fabs(a - vals[best]);
        if (d < db || (d == db && (i & 1) == 0)) best = i;
    }
    return vals[best];
}

static double e4m3_mags[127], e2m1_mags[8] = {0, .5, 1, 1.5, 2, 3, 4, 6};

static double brute_round(double v, const double *mags, int n) {
    double r = nearest_code(fabs(v), mags, n);
    return v < 0 ? -r : r;
}

static void test_bf16(void) {
    CHECK(f32_to_bf16(1.0f) == 0x3f80, "1.0");
    CHECK(f32_to_bf16(float_of(0x3f808000)) == 0x3f80, "tie rounds down to even");
    CHECK(f32_to_bf16(float_of(0x3f818000)) == 0x3f82, "tie rounds up to even");
    CHECK(f32_to_bf16(float_of(0x3f808001)) == 0x3f81, "above tie rounds up");
    CHECK(isnan(bf16_to_f32(f32_to_bf16(NAN))), "NaN stays NaN");
    CHECK(f32_to_bf16(float_of(0x7f7fffff)) == 0x7f80, "max float rounds to inf");
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_f32((uint16_t)h);
        if (!isnan(f) && f32_to_bf16(f) != h) bad++;
    }
    CHECK(bad == 0, "%d bf16 values do not round-trip", bad);
    float v[3] = {1.00390625f, -2.0f, 3.14159f};
    bf16_round_vec(v, 3);
    CHECK(bits_of(v[0]) == 0x3f800000 && v[1] == -2.0f && bits_of(v[2]) == 0x40490000, "bf16_round_vec %08x %08x",
          bits_of(v[0]), bits_of(v[2]));
}

/* bf16_round_vec (16 at a time, branch-free) against bf16_round per element, on bit patterns
 * that reach every case: ties of both parities, values that round up into the next exponent or
 * to inf, NaNs of both signs with and without the quiet bit, infinities, subnormals, zeros; the
 * length leaves a tail past the last block of 16. */
static void test_bf16_round_vec(void) {
    enum { N = 16 * 64 + 11 };
    static const uint32_t special[] = {0x7f800000, 0xff800000, 0x7f800001, 0xff800001, 0x7fc00000, 0x7fffffff,
                                       0xffbfffff, 0x7f7fffff, 0x7f7f8000, 0x3f808000, 0x3f818000, 0x00008000,
                                       0x80000001, 0x00000000, 0x80000000, 0x3f7fffff};
    float v[N], want[N];
    uint32_t state = 12345;
    for (int i = 0; i < N; i++) {
        state = state * 1664525u + 1013904223u;
        uint32_t u = i % 3 == 0 ? special[(i / 3) % 16] : i % 3 == 1 ? (state & 0xffff8000u) | ((state >> 7) & 0x7fff) : state;
        if (i % 7 == 0) u = (u & 0xffff0000u) | 0x8000u;    /* an exact tie */
        memcpy(&v[i], &u, 4);
        want[i] = bf16_round(v[i]);
    }
    bf16_round_vec(v, N);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += bits_of(v[i]) != bits_of(want[i]);
    CHECK(bad == 0, "%d of %d bf16_round_vec results differ from bf16_round", bad, N);
}

static void test_f16(void) {
    CHECK(f16_to_f32(0x3c00) == 1.0f, "1.0");
    CHECK(f16_to_f32(0xc000) == -2.0f, "-2");
    CHECK(f16_to_f32(0x0001) == ldexpf(1, -24), "smallest subnormal");
    CHECK(f16_to_f32(0x7bff) == 65504.0f, "max");
    CHECK(isinf(f16_to_f32(0x7c00)) && isnan(f16_to_f32(0x7e00)), "inf/nan");
}

static void test_e4m3_codes(void) {
    int bad_dec = 0, bad_enc = 0;
    for (int b = 0; b < 256; b++) {
        float v = e4m3_to_f32((uint8_t)b);
        if ((b & 0x7f) == 0x7f) {
            if (!isnan(v)) bad_dec++;
            continue;
        }
        if ((double)v != e4m3_formula(b) || (signbit(v) != 0) != (b >> 7)) bad_dec++;
        if (f32_to_e4m3(v) != b) bad_enc++;
    }
    CHECK(bad_dec == 0, "%d E4M3 codes decode wrong", bad_dec);
    CHECK(bad_enc == 0, "%d E4M3 codes do not encode back", bad_enc);
    CHECK(e4m3_to_f32(0x7e) == 448.0f && e4m3_to_f32(0x01) == ldexpf(1, -9), "extremes");
    CHECK(f32_to_e4m3(NAN) == 0x7f, "NaN encodes to 0x7f");
}

static void test_e4m3_rounding(void) {
    int bad_tie = 0, bad_near = 0;
    for (int b = 0; b < 0x7e; b++) {
        float lo = e4m3_to_f32((uint8_t)b), hi = e4m3_to_f32((uint8_t)(b + 1));
        float mid = (lo + hi) / 2;                  /* exact: both are short binary fractions */
        int even = (b & 1) ? b + 1 : b;
        if (f32_to_e4m3(mid) != even || f32_to_e4m3(-mid) != (even | 0x80)) bad_tie++;
        if (f32_to_e4m3(nextafterf(mid, 0)) != b || f32_to_e4m3(nextafterf(mid, 1000)) != b + 1) bad_near++;
    }
    CHECK(bad_tie == 0, "%d midpoints did not round to the even code", bad_tie);
    CHECK(bad_near == 0, "%d just-off-midpoint values rounded the wrong way", bad_near);
    CHECK(f32_to_e4m3(448) == 0x7e && f32_to_e4m3(464) == 0x7e && f32_to_e4m3(1e6f) == 0x7e, "saturation");
    CHECK(f32_to_e4m3(INFINITY) == 0x7e && f32_to_e4m3(-1e9f) == 0xfe, "saturation of inf / negatives");
    CHECK(e4m3_round(500.0f) == 448.0f && e4m3_round(-500.0f) == -448.0f, "e4m3_round saturates");
    CHECK(f32_to_e4m3(ldexpf(1, -10)) == 0 && f32_to_e4m3(ldexpf(1.01f, -10)) == 1, "subnormal tie");
    int bad_rand = 0;
    for (int i = 0; i < 20000; i++) {
        float v = (float)((rand_unit() * 2 - 1) * pow(2, rand_unit() * 24 - 14));
        if ((double)e4m3_round(v) != brute_round(v, e4m3_mags, 127)) bad_rand++;
    }
    CHECK(bad_rand == 0, "%d random values differ from the brute-force nearest E4M3", bad_rand);
}

static void test_e8m0(void) {
    CHECK(e8m0_to_f32(127) == 1.0f && e8m0_to_f32(128) == 2.0f && e8m0_to_f32(120) == 1.0f / 128, "near 1");
    CHECK(e8m0_to_f32(0) == ldexpf(1, -127) && e8m0_to_f32(254) == ldexpf(1, 127), "extremes");
    CHECK(isnan(e8m0_to_f32(255)), "255 is NaN");
}

/* The cases the branch-free rounding reaches through its bit arithmetic: infinities (whose
 * spacing underflows for E2M1), NaN (kept, sign and all), the largest floats, f32 subnormals,
 * signed zeros. */
static void check_round_specials(void) {
    float nan = nanf(""), big = 3.4028235e38f, sub = ldexpf(1, -140);
    CHECK(e4m3_round(INFINITY) == 448 && e4m3_round(-INFINITY) == -448, "E4M3 of inf");
    CHECK(e2m1_round(INFINITY) == 6 && e2m1_round(-INFINITY) == -6, "E2M1 of inf: %g", e2m1_round(INFINITY));
    CHECK(e4m3_round(big) == 448 && e2m1_round(-big) == -6, "largest floats saturate");
    CHECK(isnan(e4m3_round(nan)) && isnan(e2m1_round(-nan)) && signbit(e2m1_round(-nan)), "NaN stays NaN");
    CHECK(e4m3_round(sub) == 0 && !signbit(e4m3_round(sub)) && signbit(e2m1_round(-sub)), "f32 subnormals");
    CHECK(signbit(e4m3_round(-0.0f)) && e4m3_round(-0.0f) == 0 && !signbit(e2m1_round(0.0f)), "signed zeros");
    CHECK(e4m3_round(ldexpf(1, -9)) == ldexpf(1, -9) && e4m3_round(ldexpf(1.5f, -10)) == ldexpf(1, -9),
          "E4M3 smallest subnormal");
    /* a NaN among finite values: its block is quantized, the NaN kept */
    float v[20];
    for (int i = 0; i < 20; i++) v[i] = 1.0f + i;
    v[3] = nan;
    act_qdq_e4m3(v, 20, 20);
    CHECK(isnan(v[3]) && v[0] == 1.0f && v[19] == 20.0f, "QDQ with a NaN: %g %g", v[0], v[19]);
}

static void test_e2m1(void) {
    int bad = 0;
    for (int c = 0; c < 16; c++) {
        float v = e2m1_to_f32((uint8_t)c);
        double want = (c & 8) ? -e2m1_mags[c & 7] : e2m1_mags[c & 7];
        if ((double)v != want) bad++;
    }
    CHECK(bad == 0, "%d E2M1 codes decode wrong", bad);
    CHECK(e2m1_to_f32(0xf5) == 3.0f, "only the low 4 bits count");
    static const float ties[7][2] = {{.25f, 0}, {.75f, 1}, {1.25f, 1}, {1.75f, 2}, {2.5f, 2}, {3.5f, 4}, {5, 4}};
    for (int i = 0; i < 7; i++) {
        CHECK(e2m1_round(ties[i][0]) == ties[i][1], "tie %g -> %g", ties[i][0], e2m1_round(ties[i][0]));
        CHECK(e2m1_round(-ties[i][0]) == -ties[i][1], "tie -%g", ties[i][0]);
    }
    CHECK(e2m1_round(7) == 6 && e2m1_round(-100) == -6 && e2m1_round(0.26f) == 0.5f, "saturation and near");
    int bad_rand = 0;
    for (int i = 0; i < 20000; i++) {
        float v = (float)((rand_unit() * 2 - 1) * 8);
        if ((double)e2m1_round(v) != brute_round(v, e2m1_mags, 8)) bad_rand++;
    }
    CHECK(bad_rand == 0, "%d random values differ from the brute-force nearest E2M1", bad_rand);
    check_round_specials();
}

/* The QDQ of quant.h written out directly, with the scale from double log2 and rounding by
 * brute-force search. */
static void qdq_reference(float *x, int n, int block, double amax_floor, double maxval, const double *mags, int nm) {
    for (int b0 = 0; b0 < n; b0 += block) {
        int len = n - b0 < block ? n - b0 : block;
        float amax = 0;
        for (int i = 0; i < len; i++) amax = fmaxf(amax, fabsf(x[b0 + i]));
        float ratio = fmaxf(amax, (float)amax_floor) / (float)maxval;
        double scale = pow(2, ceil(log2((double)ratio)));
        for (int i = 0; i < len; i++) x[b0 + i] = (float)(brute_round(x[b0 + i] / scale, mags, nm) * scale);
    }
}

static void test_qdq(void) {
    enum { N = 512 };
    float x[N], got[N], want[N];
    for (int trial = 0; trial < 4; trial++) {
        for (int i = 0; i < N; i++) x[i] = bf16_round((float)((rand_unit() * 2 - 1) * pow(10, trial - 2)));
        x[7] = 0; x[100] = -x[99];
        int blocks[2] = {128, 64};
        for (int k = 0; k < 2; k++) {
            memcpy(got, x, sizeof x);
            memcpy(want, x, sizeof x);
            act_qdq_e4m3(got, N, (size_t)blocks[k]);
            qdq_reference(want, N, blocks[k], 1e-4, 448, e4m3_mags, 127);
            CHECK(!memcmp(got, want, sizeof got), "E4M3 QDQ block %d trial %d differs from formula", blocks[k], trial);
        }
        memcpy(got, x, sizeof x);
        memcpy(want, x, sizeof x);
        act_qdq_fp4(got, N, 32);
        qdq_reference(want, N, 32, 6 * pow(2, -126), 6, e2m1_mags, 8);
        CHECK(!memcmp(got, want, sizeof got), "FP4 QDQ trial %d differs from formula", trial);
    }
    /* Blocks are independent: one huge value pushes only its own block into the subnormals. */
    float v[256];
    for (int i = 0; i < 256; i++) v[i] = 1.0f + i / 1024.0f;
    v[200] = 100000.0f;   /* scale 256: x[150] / 256 falls among the E4M3 subnormals */
    float w128[256], w64[256];
    memcpy(w128, v, sizeof v);
    memcpy(w64, v, sizeof v);
    act_qdq_e4m3(w128, 256, 128);
    act_qdq_e4m3(w64, 256, 64);
    CHECK(w64[150] != w128[150], "the 1e5 must coarsen x[150] with 128-blocks but not with 64-blocks");
    CHECK(w64[10] == w128[10], "block 0 is the same under both block sizes");
    float part[256];
    memcpy(part, v, sizeof v);
    act_qdq_e4m3(part, 128, 128);
    act_qdq_e4m3(part + 128, 128, 128);
    CHECK(!memcmp(part, w128, sizeof part), "QDQ per block call == QDQ of the whole vector");
    /* Scale is an exact power of two at boundaries: amax = 448 * 2^k keeps the value exact. */
    float p[4] = {448.0f * 4, 1.0f, -3.0f, 0.0f};
    act_qdq_e4m3(p, 4, 4);
    CHECK(p[0] == 1792.0f && p[1] == 1.0f && p[2] == -3.0f, "power-of-two amax: %g %g %g", p[0], p[1], p[2]);
    float z[4] = {0, 0, 0, 0};
    act_qdq_fp4(z, 4, 32);
    CHECK(z[0] == 0 && z[3] == 0, "all-zero block stays zero");
    /* Tiny blocks keep their shape: amax 3e-6 gives scale 2^-20 (a 1e-4 floor would give 2^-15 and zeros). */
    float t[2] = {3e-6f, -1e-6f};
    act_qdq_fp4(t, 2, 32);
    CHECK(t[0] == 3 * ldexpf(1, -20) && t[1] == -ldexpf(1, -20), "tiny FP4 block: %g %g", t[0], t[1]);
}

int main(void) {
    for (int b = 0; b < 127; b++) e4m3_mags[b] = e4m3_formula(b);
    test_bf16();
    test_bf16_round_vec();
    test_f16();
    test_e4m3_codes();
    test_e4m3_rounding();
    test_e8m0();
    test_e2m1();
    test_qdq();
    return TEST_END();
}
