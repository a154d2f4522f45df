/* sampler.c — next-token choice: greedy, or temperature softmax cut by top-k, top-p and min-p.
 *
 * The filters are applied in a fixed order, each to what the previous one kept:
 *   top-k: the k most likely ids;
 *   top-p: the shortest most-likely-first prefix whose probability (renormalised over what top-k
 *          kept) reaches top_p;
 *   min-p: drop ids whose probability is below min_p times the most likely one's.
 * Each keeps a prefix of the ids ordered by (probability desc, id asc), so the result is one
 * such prefix, described by its last element (a "cut"). Sorting a 129k vocabulary per token
 * would cost far more than everything else here, so a cut is found from a histogram of the
 * weights over their float exponent (and 3 mantissa bits): only the one bucket the cut falls
 * into is sorted. The draw then walks the kept ids in id order, which needs no sort at all.
 */
#include "sampler.h"
#include "util.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_next(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(uint64_t *state) {
    return (double)(rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

void sampler_init(sampler *s, const sampler_params *p, int vocab) {
    s->p = *p;
    /* xorshift must never hold 0; mixing in a constant also spreads small seeds like 1, 2, 3 */
    s->rng = p->seed ^ 0x9E3779B97F4A7C15ULL;
    if (s->rng == 0) s->rng = 0x9E3779B97F4A7C15ULL;
    s->vocab = vocab;
    size_t n = (size_t)(vocab > 0 ? vocab : 1);
    s->probs = xmalloc(sizeof(float) * n);
    s->order = xmalloc(sizeof(int) * n);
    int rep = p->repetition_penalty > 0 && p->repetition_penalty != 1;
    s->adjusted = rep || p->presence_penalty || p->frequency_penalty ? xmalloc(sizeof(float) * n) : NULL;
    s->bias = NULL;
    s->count = p->presence_penalty || p->frequency_penalty ? xcalloc(n, sizeof(int)) : NULL;
    s->seen = rep ? xcalloc(n, 1) : NULL;
}

void sampler_free(sampler *s) {
    free(s->probs);
    free(s->order);
    free(s->adjusted);
    free(s->bias);
    free(s->count);
    free(s->seen);
    memset(s, 0, sizeof *s);
}

void sampler_bias(sampler *s, const int *ids, const float *bias, int n) {
    if (!s->bias) s->bias = xcalloc((size_t)(s->vocab > 0 ? s->vocab : 1), sizeof(float));
    if (!s->adjusted) s->adjusted = xmalloc(sizeof(float) * (size_t)(s->vocab > 0 ? s->vocab : 1));
    for (int j = 0; j < n; j++)
        if (ids[j] >= 0 && ids[j] < s->vocab) s->bias[ids[j]] += bias[j];
}

void sampler_note(sampler *s, const int *ids, int n, int output) {
    for (int j = 0; j < n; j++) {
        if (ids[j] < 0 || ids[j] >= s->vocab) continue;
        if (s->seen) s->seen[ids[j]] = 1;
        if (s->count && output) s->count[ids[j]]++;
    }
}

/* The logits with bias and penalties applied (sampler.h), or the logits themselves when none is on. */
static const float *adjust(sampler *s, const float *logits) {
    if (!s->adjusted) return logits;
    float rep = s->p.repetition_penalty, pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
    for (int i = 0; i < s->vocab; i++) {
        float l = logits[i];
        if (s->bias) l += s->bias[i];
        if (s->seen && s->seen[i]) l = l > 0 ? l / rep : l * rep;
        if (s->count && s->count[i]) l -= pres + freq * (float)s->count[i];
        s->adjusted[i] = l;
    }
    return s->adjusted;
}

int sampler_argmax(const float *logits, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (isfinite(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
    return best < 0 ? 0 : best;
}

static int by_prob_desc(const void *a, const void *b, void *ctx) {
    const float *probs = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    if (probs[x] != probs[y]) return probs[x] > probs[y] ? -1 : 1;
    return (x > y) - (x < y);
}

/* Fills s->probs with exp((logit - max) / T) (unnormalised, so the most likely id weighs 1;
 * 0 for non-finite logits) and returns their sum. */
static double tempered_weights(sampler *s, const float *logits, float max) {
    double sum = 0;
    float inv_t = 1.0f / s->p.temperature;
    for (int i = 0; i < s->vocab; i++) {
        float w = isfinite(logits[i]) ? expf((logits[i] - max) * inv_t) : 0.0f;
        s->probs[i] = w;
        sum += w;
    }
    return sum;
}

/* The kept ids are those ordered at or before (w, id): weight above w, or equal and id <= id. */
typedef struct { float w; int id; } cut;

static const cut KEEP_ALL = {0, INT_MAX};

static int before_cut(float w, int id, cut c) { return w > c.w || (w == c.w && id <= c.id); }

#define NBUCKETS 2048   /* positive float bits >> 20: 8 exponent + 3 mantissa bits */

static int bucket_of(float w) {
    uint32_t u;
    memcpy(&u, &w, sizeof u);
    return (int)(u >> 20);
}

/* The end of the shortest prefix holding at least `count` ids or at least `mass` weight. */
static cut select_prefix(sampler *s, int count, double mass) {
    int cnt[NBUCKETS] = {0};
    double bmass[NBUCKETS] = {0};
    for (int i = 0; i < s->vocab; i++)
        if (s->probs[i] > 0) {
            int b = bucket_of(s->probs[i]);
            cnt[b]++;
            bmass[b] += s->probs[i];
        }
    int b = NBUCKETS - 1, c = 0;
    double acc = 0;
    for (; b >= 0; b--) {
        if (c + cnt[b] >= count || acc + bmass[b] >= mass) break;
        c += cnt[b];
        acc += bmass[b];
    }
    if (b < 0) return KEEP_ALL;
    int n = 0;
    for (int i = 0; i < s->vocab; i++)
        if (s->probs[i] > 0 && bucket_of(s->probs[i]) == b) s->order[n++] = i;
    qsort_r(s->order, (size_t)n, sizeof(int), by_prob_desc, s->probs);
    for (int j = 0; j < n; j++) {
        int id = s->order[j];
        if (++c >= count || (acc += s->probs[id]) >= mass || j == n - 1) return (cut){s->probs[id], id};
    }
    return KEEP_ALL;
}

static double kept_mass(const sampler *s, cut c, float floor) {
    double m = 0;
    for (int i = 0; i < s->vocab; i++)
        if (s->probs[i] > 0 && s->probs[i] >= floor && before_cut(s->probs[i], i, c)) m += s->probs[i];
    return m;
}

/* The tightest cut of top-k and top-p (both are prefixes of the same order). */
static cut filter_cut(sampler *s, double sum) {
    cut c = KEEP_ALL;
    double kmass = sum;
    if (s->p.top_k > 0) {
        c = select_prefix(s, s->p.top_k, INFINITY);
        kmass = kept_mass(s, c, 0);
    }
    if (s->p.top_p < 1) {
        cut p = select_prefix(s, INT_MAX, (double)s->p.top_p * kmass);
        if (before_cut(p.w, p.id, c)) c = p;
    }
    return c;
}

int sampler_pick(sampler *s, const float *raw) {
    if (s->vocab <= 0) return 0;
    const float *logits = adjust(s, raw);
    int best = sampler_argmax(logits, s->vocab);
    if (s->p.temperature <= 0 || !isfinite(logits[best])) return best;
    double sum = tempered_weights(s, logits, logits[best]);
    cut c = filter_cut(s, sum);
    float floor = s->p.min_p > 0 ? s->p.min_p : 0;   /* the most likely id weighs 1 */
    double r = rng_uniform(&s->rng) * kept_mass(s, c, floor);
    int last = best;
    for (int i = 0; i < s->vocab; i++) {
        float w = s->probs[i];
        if (w <= 0 || w < floor || !before_cut(w, i, c)) continue;
        last = i;
        r -= w;
        if (r < 0) return i;
    }
    return last;
}

void sampler_dist(sampler *s, const float *raw, float *probs) {
    if (s->vocab <= 0) return;
    const float *logits = adjust(s, raw);
    int best = sampler_argmax(logits, s->vocab);
    memset(probs, 0, sizeof(float) * (size_t)s->vocab);
    if (s->p.temperature <= 0 || !isfinite(logits[best])) {
        probs[best] = 1.0f;
        return;
    }
    double sum = tempered_weights(s, logits, logits[best]);
    cut c = filter_cut(s, sum);
    float floor = s->p.min_p > 0 ? s->p.min_p : 0;
    double mass = kept_mass(s, c, floor);
    for (int i = 0; i < s->vocab; i++) {
        float w = s->probs[i];
        if (w > 0 && w >= floor && before_cut(w, i, c)) probs[i] = (float)(w / mass);
    }
}

double sampler_uniform(sampler *s) { return rng_uniform(&s->rng); }

int sampler_draw(sampler *s, const float *weights) {
    double sum = 0;
    int last = 0;
    for (int i = 0; i < s->vocab; i++) sum += weights[i];
    double r = rng_uniform(&s->rng) * sum;
    for (int i = 0; i < s->vocab; i++) {
        if (weights[i] <= 0) continue;
        last = i;
        r -= weights[i];
        if (r < 0) return i;
    }
    return last;
}

void log_softmax(const float *logits, int n, float *out) {
    double max = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(logits[i]) && logits[i] > max) max = logits[i];
    for (int i = 0; i < n; i++)
        if (isfinite(logits[i])) sum += exp((double)logits[i] - max);
    double lse = max + log(sum);
    for (int i = 0; i < n; i++)
        out[i] = isfinite(logits[i]) ? (float)((double)logits[i] - lse) : -INFINITY;
}

/* Insertion into a k-long sorted list: k is small (OpenAI allows up to 20), n is the vocab. */
void top_logprobs(const float *logprobs, int n, int k, int *ids) {
    int have = 0;
    if (k <= 0) return;
    for (int i = 0; i < n; i++) {
        float v = logprobs[i];
        if (isnan(v)) continue;
        if (have == k && !(v > logprobs[ids[k - 1]])) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && v > logprobs[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    for (int j = have; j < k; j++) ids[j] = -1;
}
