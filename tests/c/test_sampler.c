/* test_sampler.c — greedy and its ties, seeded determinism, the support and the distribution
 * of top-k / top-p / min-p sampling, the temperature -> 0 limit, log_softmax and top_logprobs.
 * Distributions are checked empirically with a generous bound (20k draws, +-0.02 absolute),
 * so a wrong filter or a wrong renormalisation fails while sampling noise does not. */
#include "core/sampler.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DRAWS 20000

/* logits whose softmax is exactly probs */
static void logits_of(const double *probs, int n, float *logits) {
    for (int i = 0; i < n; i++) logits[i] = probs[i] > 0 ? (float)log(probs[i]) : -INFINITY;
}

/* Empirical frequency of every id over DRAWS picks. */
static void frequencies(const sampler_params *p, const float *logits, int n, double *freq) {
    sampler s;
    sampler_init(&s, p, n);
    memset(freq, 0, sizeof(double) * (size_t)n);
    for (int i = 0; i < DRAWS; i++) freq[sampler_pick(&s, logits)] += 1.0 / DRAWS;
    sampler_free(&s);
}

/* freq must be near want (already renormalised) and exactly 0 where want is 0. */
static int matches(const double *freq, const double *want, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        if ((want[i] == 0 && freq[i] != 0) || fabs(freq[i] - want[i]) > 0.02) {
            printf("  %s: id %d drawn %.4f, want %.4f\n", what, i, freq[i], want[i]);
            return 0;
        }
    }
    return 1;
}

static const double P5[5] = {0.5, 0.3, 0.1, 0.06, 0.04};

static void test_greedy(void) {
    sampler_params p = {.temperature = 0, .top_p = 1};
    sampler s;
    sampler_init(&s, &p, 5);
    float a[5] = {1, 3, 2, 3, -1};
    CHECK(sampler_pick(&s, a) == 1, "ties go to the lower id");
    float b[5] = {NAN, 1, INFINITY, 2, -INFINITY};
    CHECK(sampler_pick(&s, b) == 3, "non-finite logits are ignored");
    float c[5] = {NAN, NAN, INFINITY, -INFINITY, NAN};
    CHECK(sampler_pick(&s, c) == 0, "no finite logit: id 0");
    sampler_free(&s);
    p.temperature = 1e-4f;
    sampler_init(&s, &p, 5);
    float d[5] = {0.5f, 0.9f, 0.89f, -3, 0};
    int all_argmax = 1;
    for (int i = 0; i < 1000; i++) all_argmax &= sampler_pick(&s, d) == 1;
    CHECK(all_argmax, "temperature -> 0 approaches greedy");
    sampler_free(&s);
}

static void test_determinism(void) {
    float logits[64];
    for (int i = 0; i < 64; i++) logits[i] = (float)sin(i * 1.7) * 2;
    sampler_params p = {.temperature = 0.9f, .top_p = 0.95f, .top_k = 40, .seed = 1234};
    sampler a, b, c;
    sampler_init(&a, &p, 64);
    sampler_init(&b, &p, 64);
    p.seed = 1235;
    sampler_init(&c, &p, 64);
    int same = 1, differ = 0;
    for (int i = 0; i < 500; i++) {
        int x = sampler_pick(&a, logits), y = sampler_pick(&b, logits), z = sampler_pick(&c, logits);
        same &= x == y;
        differ |= x != z;
    }
    CHECK(same, "identical seeds give identical picks");
    CHECK(differ, "a different seed gives different picks");
    sampler_free(&a);
    sampler_free(&b);
    sampler_free(&c);
}

static void test_filters(void) {
    float logits[5];
    double freq[5];
    logits_of(P5, 5, logits);
    sampler_params p = {.temperature = 1, .top_p = 1};
    frequencies(&p, logits, 5, freq);
    CHECK(matches(freq, P5, 5, "plain"), "temperature 1 samples the softmax");

    p.top_k = 2;
    frequencies(&p, logits, 5, freq);
    CHECK(matches(freq, (double[]){0.625, 0.375, 0, 0, 0}, 5, "top-k"), "top-k 2");

    p.top_k = 0;
    p.top_p = 0.75f;   /* 0.5 < 0.75 <= 0.8: the first two */
    frequencies(&p, logits, 5, freq);
    CHECK(matches(freq, (double[]){0.625, 0.375, 0, 0, 0}, 5, "top-p"), "top-p 0.75");

    p.top_k = 4;
    p.top_p = 0.93f;   /* over the top 4 (0.96): 0.521, 0.833, 0.938: three */
    frequencies(&p, logits, 5, freq);
    CHECK(matches(freq, (double[]){0.5 / 0.9, 0.3 / 0.9, 0.1 / 0.9, 0, 0}, 5, "top-k+top-p"),
          "top-p renormalises over what top-k kept");

    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0.15f;   /* cut at 0.075: 0.06 and 0.04 go */
    frequencies(&p, logits, 5, freq);
    CHECK(matches(freq, (double[]){0.5 / 0.9, 0.3 / 0.9, 0.1 / 0.9, 0, 0}, 5, "min-p"), "min-p 0.15");

    p.min_p = 0;
    p.temperature = 2;   /* softmax(log p / 2) is proportional to sqrt(p) */
    double want[5], z = 0;
    for (int i = 0; i < 5; i++) z += sqrt(P5[i]);
    for (int i = 0; i < 5; i++) want[i] = sqrt(P5[i]) / z;
    frequencies(&p, logits, 5, freq);
    CHECK(matches(freq, want, 5, "temperature 2"), "temperature flattens");
}

/* A large flat-ish vocabulary: the candidate pre-filter must not change the nucleus. */
enum { BIG = 50000 };
static double big_prob[BIG];

static int by_big_prob_desc(const void *a, const void *b) {
    double x = big_prob[*(const int *)a], y = big_prob[*(const int *)b];
    return x > y ? -1 : x < y;
}

static void test_large_vocab_nucleus(void) {
    static float logits[BIG];
    static int order[BIG];
    srand(7);
    double z = 0, cum = 0;
    for (int i = 0; i < BIG; i++) logits[i] = (float)rand() / (float)RAND_MAX * 6;
    for (int i = 0; i < BIG; i++) z += big_prob[i] = exp((double)logits[i] - 6.0);
    for (int i = 0; i < BIG; i++) order[i] = i;
    qsort(order, BIG, sizeof(int), by_big_prob_desc);
    int n = 0;
    while (cum < 0.05 * z) cum += big_prob[order[n++]];
    double edge = big_prob[order[n - 1]];
    sampler_params p = {.temperature = 1, .top_p = 0.05f, .seed = 3};
    sampler s;
    sampler_init(&s, &p, BIG);
    int inside = 1, hit_edge_half = 0;
    for (int i = 0; i < 500; i++) {
        double q = big_prob[sampler_pick(&s, logits)];
        inside &= q >= edge;
        hit_edge_half |= q < big_prob[order[n / 2]];
    }
    CHECK(inside, "every pick is inside the %d-id nucleus", n);
    CHECK(hit_edge_half, "picks reach the less likely half of the nucleus");
    sampler_free(&s);
}

static void test_logprobs(void) {
    float logits[6] = {1000, 999, 1000, -INFINITY, NAN, 990}, lp[6];
    log_softmax(logits, 6, lp);
    double sum = 0;
    for (int i = 0; i < 6; i++)
        if (isfinite(lp[i])) sum += exp(lp[i]);
    CHECK(fabs(sum - 1) < 1e-6, "probabilities sum to 1 (%.9f)", sum);
    CHECK(fabsf(lp[0] - lp[2]) == 0 && fabsf(lp[0] - lp[1] - 1) < 1e-5, "differences are kept at large magnitude");
    CHECK(isinf(lp[3]) && lp[3] < 0 && isinf(lp[4]) && lp[4] < 0, "non-finite logits get -inf");
    int ids[8];
    top_logprobs(lp, 6, 3, ids);
    CHECK(ids[0] == 0 && ids[1] == 2 && ids[2] == 1, "top 3 = 0 2 1 (ties to lower id): %d %d %d", ids[0], ids[1], ids[2]);
    top_logprobs(lp, 6, 8, ids);
    CHECK(ids[3] == 5 && ids[4] == 3 && ids[6] == -1 && ids[7] == -1, "k > n: NaN skipped, rest -1");
}

/* Bias and penalties move the choice exactly as sampler.h defines them, and leave the caller's
 * logits alone. */
static void test_adjustments(void) {
    float logits[4] = {2.0f, 1.5f, -1.0f, 0.5f}, copy[4];
    memcpy(copy, logits, sizeof logits);
    sampler s;
    sampler_params p = {.temperature = 0, .top_p = 1};
    sampler_init(&s, &p, 4);
    int ids[2] = {3, 9};
    float bias[2] = {1.75f, 100.0f};
    sampler_bias(&s, ids, bias, 2);
    CHECK(sampler_pick(&s, logits) == 3, "bias +1.75 on id 3 beats id 0 (2.25 > 2.0); id 9 ignored");
    CHECK(!memcmp(logits, copy, sizeof logits), "caller's logits unchanged");
    sampler_free(&s);

    p.presence_penalty = 0.4f;
    p.frequency_penalty = 0.1f;
    sampler_init(&s, &p, 4);
    int zero = 0;
    sampler_note(&s, &zero, 1, 0);
    CHECK(sampler_pick(&s, logits) == 0, "prompt tokens carry no presence/frequency penalty");
    sampler_note(&s, &zero, 1, 1);
    CHECK(sampler_pick(&s, logits) == 0, "one occurrence: 2.0 - 0.5 = 1.5 ties id 1, lower id wins");
    sampler_note(&s, &zero, 1, 1);
    CHECK(sampler_pick(&s, logits) == 1, "two occurrences: 2.0 - 0.6 < 1.5");
    sampler_free(&s);

    p = (sampler_params){.temperature = 0, .top_p = 1, .repetition_penalty = 1.5f};
    float neg[3] = {-1.0f, -1.4f, -3.0f};
    sampler_init(&s, &p, 3);
    sampler_note(&s, &zero, 1, 0);
    CHECK(sampler_pick(&s, logits) == 1, "positive logit divided: 2.0 / 1.5 < 1.5");
    CHECK(sampler_pick(&s, neg) == 1, "negative logit multiplied: -1.5 < -1.4");
    sampler_free(&s);
}

int main(void) {
    test_greedy();
    test_adjustments();
    test_determinism();
    test_filters();
    test_large_vocab_nucleus();
    test_logprobs();
    return TEST_END();
}
