/* sampler.h — next-token choice from logits: greedy, temperature, top-k, top-p, min-p, seed.
 *
 * INVARIANT: the result is a pure function of (logits, parameters, rng state); the rng is an
 * explicit xorshift64* state seeded from `seed`, so identical seeds give identical output.
 * temperature <= 0 is greedy (argmax, ties to the lower id). Non-finite logits are ignored;
 * if none is finite the result is argmax over raw bits order (id 0 fallback).
 */
#ifndef CAIRN_SAMPLER_H
#define CAIRN_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temperature;   /* <= 0: greedy */
    float top_p;         /* 1 = off */
    int top_k;           /* 0 = off */
    float min_p;         /* 0 = off */
    uint64_t seed;
} sampler_params;

typedef struct sampler {
    sampler_params p;
    uint64_t rng;
    int vocab;
    float *probs;        /* scratch [vocab] */
    int *order;          /* scratch [vocab] */
} sampler;

void sampler_init(sampler *s, const sampler_params *p, int vocab);
void sampler_free(sampler *s);
int sampler_pick(sampler *s, const float *logits);
/* Greedy's choice: the argmax over finite logits, ties to the lower id (0 if none is finite). */
int sampler_argmax(const float *logits, int n);
/* The distribution sampler_pick draws from, normalised into probs[vocab]: greedy is one-hot at
 * the argmax; otherwise the tempered weights of the ids top-k/top-p/min-p keep. No rng use. */
void sampler_dist(sampler *s, const float *logits, float *probs);
/* One draw from weights[vocab] (>= 0, any positive sum; id order, as sampler_pick walks) and one
 * uniform in [0, 1), both from the sampler's rng: speculative sampling's accept/resample steps. */
int sampler_draw(sampler *s, const float *weights);
double sampler_uniform(sampler *s);

/* log-softmax of logits into out[vocab] (f64 accumulation); used for logprobs. */
void log_softmax(const float *logits, int n, float *out);
/* The k most likely ids of logprobs (descending, ties to lower id). */
void top_logprobs(const float *logprobs, int n, int k, int *ids);

#endif
