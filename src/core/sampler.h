/* sampler.h — next-token choice from logits: greedy, temperature, top-k, top-p, min-p, seed,
 * and the logit adjustments the APIs offer (logit bias, repetition / presence / frequency
 * penalties), applied in that order to a copy of the logits before anything else:
 *   bias:        l[id] += bias[id]
 *   repetition:  for an id seen in the prompt or the output, l > 0 ? l / r : l * r  (CTRL, as in
 *                Hugging Face and vLLM)
 *   presence / frequency: l[id] -= presence * (count > 0) + frequency * count, with count the id's
 *                occurrences in the output so far (OpenAI's definition)
 * so the model's own logits (and logprobs computed from them) are never changed.
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
    float repetition_penalty;   /* 0 or 1 = off */
    float presence_penalty;     /* 0 = off */
    float frequency_penalty;    /* 0 = off */
} sampler_params;

typedef struct sampler {
    sampler_params p;
    uint64_t rng;
    int vocab;
    float *probs;        /* scratch [vocab] */
    int *order;          /* scratch [vocab] */
    float *adjusted;     /* [vocab] when any adjustment is on, else NULL */
    float *bias;         /* [vocab] once sampler_bias was called, else NULL */
    int *count;          /* [vocab] output occurrences, with a penalty on */
    unsigned char *seen; /* [vocab] in prompt or output, with a repetition penalty */
} sampler;

void sampler_init(sampler *s, const sampler_params *p, int vocab);
void sampler_free(sampler *s);
int sampler_pick(sampler *s, const float *logits);
/* Greedy's choice: the argmax over finite logits, ties to the lower id (0 if none is finite). */
int sampler_argmax(const float *logits, int n);
/* The distribution sampler_pick draws from, normalised into probs[vocab]: greedy is one-hot at
 * the argmax; otherwise the tempered weights of the ids top-k/top-p/min-p keep (after bias and
 * penalties, as they stand). No rng use. */
void sampler_dist(sampler *s, const float *logits, float *probs);
/* One draw from weights[vocab] (>= 0, any positive sum; id order, as sampler_pick walks) and one
 * uniform in [0, 1), both from the sampler's rng: speculative sampling's accept/resample steps. */
int sampler_draw(sampler *s, const float *weights);
double sampler_uniform(sampler *s);
/* Add bias[j] to the logit of ids[j] (ids outside the vocabulary are ignored). */
void sampler_bias(sampler *s, const int *ids, const float *bias, int n);
/* Note tokens for the penalties: the prompt's (output = 0) and each sampled one (output = 1). */
void sampler_note(sampler *s, const int *ids, int n, int output);

/* log-softmax of logits into out[vocab] (f64 accumulation); used for logprobs. */
void log_softmax(const float *logits, int n, float *out);
/* The k most likely ids of logprobs (descending, ties to lower id). */
void top_logprobs(const float *logprobs, int n, int k, int *ids);

#endif
