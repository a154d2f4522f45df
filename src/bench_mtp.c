/* bench_mtp.c — `cairn bench mtp -m DIR`: what MTP speculative decoding costs and gains on one
 * model, every figure a ratio measured in this run.
 *
 *   step      one plain greedy decode step (a sequence without MTP rows);
 *   measured  greedy decoding with and without speculation (seq_spec_steps, k drafts per step):
 *             tok/s of each and the acceptance rate seen (drafts kept / drafts offered);
 *   verify    the mean verify call of those speculative steps: k + 1 tokens in one forward with
 *             every row's logits, the MTP layer running too, as a multiple of step
 *             (mtp_verify_cost_ratio);
 *   draft     their mean MTP draft step, as a multiple of step; what a speculative step spends
 *             beyond its drafts and verify (acceptance, truncation) is printed as well.
 *             The costs are timed inside the decode they explain, on the tokens it decodes: a
 *             verify timed on repeated tokens routes them to the same experts, which then stay in
 *             the cache, and underestimates what decoding pays on a MoE model;
 *   projected the speedup these measured costs give at acceptance 0.8: with each draft kept
 *             independently with probability a, a step emits (1 - a^(k+1)) / (1 - a) tokens for
 *             k drafts + 1 verify. Random bench weights keep acceptance near 0, so the measured
 *             speedup is below 1 there; the projection is labelled as one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"
#include "core/kernels.h"
#include "core/sampler.h"
#include "core/threads.h"
#include "core/util.h"

#define PROJECT_AT 0.8

static void usage(FILE *f) {
    fprintf(f,
            "usage: cairn bench mtp -m DIR [--json] [--draft K] [--prompt N] [--decode N] [--threads N]\n"
            "                      [--numerics exact|qat]\n"
            "\n"
            "MTP speculative decoding on a model whose checkpoint has an MTP layer: greedy decode of N\n"
            "tokens (default 32) after an N-token prompt (default 64) with and without speculation (tok/s,\n"
            "acceptance rate seen, K drafts per step, default 2); the cost of its verify calls of K+1 tokens,\n"
            "of its draft steps and of the rest of its steps, each timed inside that decode as a multiple of\n"
            "one plain decode step; and the speedup those measured costs give at acceptance 0.8, stated as\n"
            "a projection. --json prints {mtp_verify_cost_ratio, mtp_draft_cost_ratio, mtp_other_cost_ratio,\n"
            "mtp_acceptance, decode_tok_s, spec_tok_s, spec_speedup, projected_speedup_at_0_8, ...}.\n");
}

typedef struct {
    double step_s, verify_s, draft_s, other_s, plain_tok_s, spec_tok_s, acceptance;
} mtp_result;

/* A sequence with the prompt fed (untimed: it also pages the weights in) and its last logits. */
static seq *primed(model *m, int spec, int ctx, const int *ids, int n, float *logits, char *err, size_t errlen) {
    m->spec_mtp = spec;
    seq *s = seq_new(m, ctx, err, errlen);
    if (!s) return NULL;
    s->chunk = n;
    if (seq_feed(s, ids, n, logits, err, errlen)) {
        seq_free(s);
        return NULL;
    }
    return s;
}

/* Plain greedy decode of o->decode tokens on a sequence without MTP rows: the step time. */
static int plain_decode(model *m, const bench_opts *o, const int *ids, int ctx, mtp_result *r, char *err,
                        size_t errlen) {
    float *logits = xmalloc(sizeof(float) * (size_t)m->vocab_size);
    seq *s = primed(m, 0, ctx, ids, (int)o->prompt, logits, err, errlen);
    int rc = s ? 0 : -1;
    double t0 = now_seconds();
    for (long i = 0; !rc && i < o->decode; i++) {
        int id = sampler_argmax(logits, m->vocab_size);
        rc = seq_feed(s, &id, 1, logits, err, errlen);
    }
    r->step_s = (now_seconds() - t0) / (double)o->decode;
    r->plain_tok_s = 1.0 / r->step_s;
    seq_free(s);
    free(logits);
    return rc;
}

/* Greedy speculative decode of o->decode tokens on a sequence keeping MTP rows, timing each
 * step's drafts and verify call. */
static int spec_decode(model *m, const bench_opts *o, int k, const int *ids, int ctx, mtp_result *r, char *err,
                       size_t errlen) {
    float *logits = xmalloc(sizeof(float) * (size_t)m->vocab_size);
    seq *s = primed(m, 1, ctx, ids, (int)o->prompt, logits, err, errlen);
    int rc = s ? 0 : -1;
    long got = 0, steps = 0, kept = 0;
    double draft_s = 0, verify_s = 0;
    spec_job j = {.s = s, .next = sampler_argmax(logits, m->vocab_size), .k = k};
    double t0 = now_seconds();
    while (!rc && got < o->decode) {
        rc = seq_spec_steps(&j, 1, NULL, 0, err, errlen);
        got += j.n_out;
        steps++;
        kept += j.accepted;
        draft_s += j.draft_s;
        verify_s += j.verify_s;
        j.next = j.pending;
    }
    double total = now_seconds() - t0;
    r->spec_tok_s = got / total;
    r->acceptance = steps ? (double)kept / (double)(steps * k) : 0;
    r->draft_s = steps ? draft_s / (double)(steps * k) : 0;
    r->verify_s = steps ? verify_s / (double)steps : 0;
    r->other_s = steps ? (total - draft_s - verify_s) / (double)steps : 0;
    seq_free(s);
    free(logits);
    return rc;
}

static void report(const bench_opts *o, int k, const mtp_result *r) {
    double verify = r->verify_s / r->step_s, draft = r->draft_s / r->step_s, other = r->other_s / r->step_s;
    double a = PROJECT_AT, tokens = (1 - pow(a, k + 1)) / (1 - a), projected = tokens / (k * draft + verify + other);
    if (o->json) {
        printf("{\"mtp_verify_cost_ratio\":%.3f,\"mtp_draft_cost_ratio\":%.3f,\"mtp_other_cost_ratio\":%.3f,"
               "\"mtp_acceptance\":%.4f,"
               "\"decode_tok_s\":%.3f,\"spec_tok_s\":%.3f,\"spec_speedup\":%.3f,\"projected_speedup_at_0_8\":%.3f,"
               "\"draft\":%d,\"prompt\":%ld,\"decode\":%ld,\"threads\":%d,\"simd\":\"%s\"}\n",
               verify, draft, other, r->acceptance, r->plain_tok_s, r->spec_tok_s, r->spec_tok_s / r->plain_tok_s, projected,
               k, o->prompt, o->decode, pool_threads(), kernels_simd_name());
        return;
    }
    printf("verify %d tokens         %8.2f  decode steps (mtp_verify_cost_ratio)\n", k + 1, verify);
    printf("one MTP draft step       %8.2f  decode steps\n", draft);
    printf("rest of a spec step      %8.2f  decode steps (acceptance, truncation)\n", other);
    printf("acceptance seen          %8.3f  (%d drafts per step, greedy)\n", r->acceptance, k);
    printf("decode                   %8.2f  tok/s without speculation\n", r->plain_tok_s);
    printf("decode, speculative      %8.2f  tok/s (x%.2f)\n", r->spec_tok_s, r->spec_tok_s / r->plain_tok_s);
    printf("projection at 0.8        %8.2f  x decode speed, from the costs measured above (not measured)\n",
           projected);
}

int bench_mtp(int argc, char **argv) {
    bench_opts o = {.prompt = 64, .decode = 32, .num = NUMERICS_QAT};
    long k = 2;
    char **rest = xmalloc(sizeof(char *) * (size_t)(argc + 1));
    int nrest = 0;
    for (int i = 0; i < argc; i++) {       /* --draft is this bench's own; the rest are shared */
        if (!strcmp(argv[i], "--draft") && i + 1 < argc) {
            if (cli_int("bench mtp", "--draft", argv[++i], 1, SPEC_MAX_DRAFT, &k)) { free(rest); return 2; }
        } else rest[nrest++] = argv[i];
    }
    int bad = bench_parse("bench mtp", nrest, rest, usage, &o);
    free(rest);
    if (bad) return 2;
    if (o.threads) pool_set_threads((int)o.threads);
    model *m = bench_open("bench mtp", &o, NULL);
    if (!m) return 1;
    char err[512] = "";
    int ctx = (int)(o.prompt + o.decode + k + 2);
    if (!m->draft_layers || !m->ops->draft) {
        fprintf(stderr, "cairn bench mtp: %s has no MTP layer this engine can draft with\n", o.model_dir);
        model_close(m);
        return 1;
    }
    if (o.prompt < k + 1 || ctx > m->max_ctx) {
        fprintf(stderr, "cairn bench mtp: --prompt must be >= --draft + 1 and --prompt + --decode within the model's %d positions\n", m->max_ctx);
        model_close(m);
        return 2;
    }
    int *ids = bench_prompt((int)o.prompt, m->vocab_size, 0);
    mtp_result r = {0};
    int rc = plain_decode(m, &o, ids, ctx, &r, err, sizeof err);
    if (!rc) rc = spec_decode(m, &o, (int)k, ids, ctx, &r, err, sizeof err);
    if (!rc) report(&o, (int)k, &r);
    else fprintf(stderr, "cairn bench mtp: %s\n", err);
    free(ids);
    model_close(m);
    return rc ? 1 : 0;
}
