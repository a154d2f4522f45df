/* bench_concurrency.c — `cairn bench concurrency -m DIR`: what decoding several conversations
 * in one forward call per step (seq_feed_step, as the engine does) buys over one conversation.
 *
 * For k = 1, 2, 4, 8 conversations (distinct prompts, each prefilled untimed), D greedy decode
 * steps are timed; aggregate tok/s = k * D / time, and the report is aggregate / the k = 1
 * figure of the same run. Batching reads the dense, attention and shared-expert weights once per
 * step for all k (routed experts only where tokens pick different ones), so a memory-bound decode
 * approaches k x. Every conversation's tokens are checked against running it alone, so a ratio
 * bought with wrong answers fails the run. The fastest single step of each k gives a second ratio,
 * k x best step of one / best step of k (best_step_ratio_k): on a shared machine a phase's total
 * time carries whatever else ran meanwhile, while its fastest step is the one least disturbed.
 *
 * WHERE THE STEPS' TIME GOES, for 1 and 4 conversations: the dense weights' bytes per second of
 * the dense products (kernels_dense_seconds), the routed experts' bytes per second of the MoE
 * layers' expert calls (experts_stats.seconds: gathering, the experts' products on every thread
 * at once, scattering), and the share of the steps' time in neither (attention, norms, routing,
 * hand-offs, and this bench's argmax over each conversation's logits). Against the machine's
 * read bandwidth (`cairn bench kernels`) they say which part of a decode step is short of it.
 *
 * WHILE ANOTHER PREFILLS: two conversations decode while a third prefills a MIX_LONG-token prompt,
 * timed from the first step until that prefill ends, both ways in the same run: joined (the
 * engine's joint step: each step is ONE call carrying the two tokens and a prefill chunk of
 * seq_join_rows rows) and not joined (the engine before it: the chunk in its own call of the
 * sequence's chunk size, then the decode call). It prints the decoding conversations' tok/s and
 * the prefill's tok/s each way; their tokens must equal running them alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"
#include "core/experts.h"
#include "core/kernels.h"
#include "core/threads.h"
#include "core/util.h"
#include "models/model.h"

#define MAX_CONV 8
#define MIX_CONV 2       /* conversations decoding while another prefills */
#define MIX_LONG 512     /* the prefilling conversation's prompt */
#define MIX_STEPS 64     /* at most this many decode steps are timed in the mix */

static void usage(FILE *f) {
    fprintf(f,
            "usage: cairn bench concurrency -m DIR [--json] [--prompt N] [--decode N] [--threads N]\n"
            "                               [--numerics exact|qat]\n"
            "\n"
            "Decodes 1, 2, 4 and 8 conversations (N-token prompts, default 16, prefilled untimed) for\n"
            "N greedy steps (default 16), all of them in one forward call per step as the engine does,\n"
            "and prints aggregate tok/s and its ratio to one conversation measured in the same run.\n"
            "Each conversation's tokens must equal running it alone, else the run fails.\n"
            "Then 2 conversations decode while a third prefills a 512-token prompt, with the prefill\n"
            "chunks joined to the decode steps' calls (as the engine does) and in calls of their own,\n"
            "and it prints both ways' decode and prefill tok/s.\n"
            "--json prints {concurrency_ratio_2, concurrency_ratio_4, concurrency_ratio_8,\n"
            "best_step_ratio_2, best_step_ratio_4, best_step_ratio_8 (k x fastest step of one /\n"
            "fastest step of k: less disturbed by other load), experts_per_call_k (distinct routed\n"
            "experts per MoE layer call), experts_spread_share_4, dense_gbs_k, experts_gbs_k and\n"
            "other_share_k for k = 1, 4 (dense weight bytes per second of the dense products, routed\n"
            "expert bytes per second of the MoE layers' expert calls, the steps' time in neither),\n"
            "mix_decode_tok_s_joined, mix_decode_tok_s_apart, mix_prefill_tok_s_joined, ...}.\n");
}

/* Conversations first..first+k-1 in sequences of ctx positions, each prompt (seed i + 1)
 * prefilled, logits[i] its last logits: 1, or 0 with err (close_conversations frees either way). */
static int open_conversations(model *m, const bench_opts *o, int first, int k, int ctx, seq **seqs, float **logits,
                              char *err, size_t errlen) {
    int ok = 1;
    for (int i = 0; i < k && ok; i++) {
        logits[i] = xmalloc(sizeof(float) * m->vocab_size);
        int *prompt = bench_prompt((int)o->prompt, m->vocab_size, (uint64_t)(first + i) + 1);
        ok = (seqs[i] = seq_new(m, ctx, err, errlen)) &&
             !seq_feed(seqs[i], prompt, (int)o->prompt, logits[i], err, errlen);
        free(prompt);
    }
    return ok;
}

static void close_conversations(seq **seqs, float **logits, int k) {
    for (int i = 0; i < k; i++) {
        seq_free(seqs[i]);
        free(logits[i]);
    }
}

/* Conversations first..first+k-1 (conversation i has prompt seed i + 1): prefill (untimed),
 * then `decode` batched greedy steps; tokens[i - first][step] gets conversation i's choices.
 * Returns seconds of the decode steps, < 0 on failure; *f (NULL: not wanted) gets what the steps did. */
typedef struct {
    double best;          /* the fastest step's seconds */
    double chosen;        /* distinct routed experts per MoE layer call */
    double spread;        /* share of those calls that spread their experts over the pool */
    double dense_gbs;     /* dense weight bytes / seconds in dense products */
    double experts_gbs;   /* routed expert bytes / seconds in the MoE layers' expert calls (0: none) */
    double other_share;   /* share of the steps' time in neither */
} step_figures;

static double run_batch(model *m, const bench_opts *o, int first, int k, int (*tokens)[64], step_figures *f,
                        char *err, size_t errlen) {
    seq *seqs[MAX_CONV] = {0};
    float *logits[MAX_CONV] = {0};
    int ids[MAX_CONV];
    int ok = open_conversations(m, o, first, k, (int)(o->prompt + o->decode + 1), seqs, logits, err, errlen);
    double t = -1;
    experts_stats x0, x1;
    unsigned long long dense0, routed0, dense1, routed1;
    experts_get_stats(m->experts, &x0);
    kernels_streamed(&dense0, &routed0);
    double dense_s = kernels_dense_seconds(), t0 = now_seconds(), fastest = -1;
    for (long step = 0; ok && step < o->decode; step++) {
        for (int i = 0; i < k; i++) ids[i] = tokens[i][step] = bench_argmax(logits[i], m->vocab_size);
        double s0 = now_seconds();
        ok = !seq_feed_step(seqs, ids, k, logits, err, errlen);
        double st = now_seconds() - s0;
        if (fastest < 0 || st < fastest) fastest = st;
    }
    if (ok) t = now_seconds() - t0;
    dense_s = kernels_dense_seconds() - dense_s;
    experts_get_stats(m->experts, &x1);
    kernels_streamed(&dense1, &routed1);
    if (f) {
        double calls = (double)(x1.layer_calls - x0.layer_calls), experts_s = x1.seconds - x0.seconds;
        f->best = fastest;
        f->chosen = calls > 0 ? (double)(x1.chosen - x0.chosen) / calls : 0;
        f->spread = calls > 0 ? (double)(x1.spread_calls - x0.spread_calls) / calls : 0;
        f->dense_gbs = dense_s > 0 ? (double)(dense1 - dense0) / dense_s * 1e-9 : 0;
        f->experts_gbs = experts_s > 0 ? (double)(routed1 - routed0) / experts_s * 1e-9 : 0;
        f->other_share = t > 0 ? (t - dense_s - experts_s) / t : 0;
    }
    close_conversations(seqs, logits, k);
    return t;
}

/* Conversations 0..MIX_CONV-1 (as run_batch's) decode greedily while a MIX_LONG-token prompt is
 * prefilled, joined into their calls or apart (see the top comment), until the prefill ends or
 * MIX_STEPS steps. tokens[i][step] gets conversation i's choices, *steps the steps, *prefilled
 * the prompt tokens fed. Returns the seconds of those steps, < 0 on failure. */
static double run_mix(model *m, const bench_opts *o, int joined, int (*tokens)[64], int *steps, int *prefilled,
                      char *err, size_t errlen) {
    seq *seqs[MIX_CONV] = {0}, *lng = NULL;
    float *logits[MIX_CONV] = {0};
    int done = 0, ctx = MAX((int)o->prompt + MIX_STEPS + 1, MIX_LONG);    /* one call: one context size */
    int ok = open_conversations(m, o, 0, MIX_CONV, ctx, seqs, logits, err, errlen);
    int *prompt = bench_prompt(MIX_LONG, m->vocab_size, 99);
    ok = ok && (lng = seq_new(m, ctx, err, errlen));
    double t0 = now_seconds(), t = -1;
    for (*steps = 0; ok && done < MIX_LONG && *steps < MIX_STEPS; ++*steps) {
        int ids[MIX_CONV];
        spec_job jobs[MIX_CONV];
        for (int i = 0; i < MIX_CONV; i++) {
            ids[i] = tokens[i][*steps] = bench_argmax(logits[i], m->vocab_size);
            jobs[i] = (spec_job){.s = seqs[i], .next = ids[i], .rows = logits[i]};
        }
        int n = MIN(joined ? seq_join_rows(m, MIX_CONV) : lng->chunk, MIX_LONG - done);
        if (joined) {
            feed_job f = {lng, prompt + done, n, NULL};
            ok = !seq_spec_steps(jobs, MIX_CONV, &f, 1, err, errlen);
        } else {
            ok = !seq_feed(lng, prompt + done, n, NULL, err, errlen) &&
                 !seq_feed_step(seqs, ids, MIX_CONV, logits, err, errlen);
        }
        done += n;
    }
    if (ok) t = now_seconds() - t0;
    *prefilled = done;
    free(prompt);
    seq_free(lng);
    close_conversations(seqs, logits, MIX_CONV);
    return t;
}

/* Both ways of the mix; each decoding conversation's tokens are checked against it alone.
 * out: decode tok/s joined, apart, prefill tok/s joined, apart. */
static int mix_figures(model *m, const bench_opts *o, double out[4], char *err, size_t errlen) {
    static int mixed[MIX_CONV][64], alone[64];
    for (int joined = 1; joined >= 0; joined--) {
        int steps, fed;
        double t = run_mix(m, o, joined, mixed, &steps, &fed, err, errlen);
        if (t < 0) return -1;
        out[1 - joined] = MIX_CONV * steps / t;
        out[3 - joined] = fed / t;
        bench_opts lone = *o;
        lone.decode = steps;
        for (int i = 0; i < MIX_CONV; i++) {
            if (run_batch(m, &lone, i, 1, &alone, NULL, err, errlen) < 0) return -1;
            if (memcmp(mixed[i], alone, sizeof(int) * (size_t)steps))
                return errf(err, errlen, "conversation %d decoded beside a prefill (%s) differs from running it alone", i,
                            joined ? "joined" : "apart");
        }
    }
    return 0;
}

int bench_concurrency(int argc, char **argv) {
    bench_opts o = {.prompt = 16, .decode = 16, .num = NUMERICS_QAT};
    if (bench_parse("bench concurrency", argc, argv, usage, &o)) return 2;
    if (o.decode > 64) { fprintf(stderr, "cairn bench concurrency: --decode is at most 64\n"); return 2; }
    if (o.threads) pool_set_threads((int)o.threads);
    model *m = bench_open("bench concurrency", &o, NULL);
    if (!m) return 1;
    char err[512] = "";
    static const int ks[] = {1, 2, 4, 8};
    static int alone[MAX_CONV][64], together[MAX_CONV][64];
    double tok_s[4] = {0}, mix[4] = {0};
    step_figures fig[4] = {0};
    int rc = run_batch(m, &o, 0, 1, alone, NULL, err, sizeof err) < 0;      /* untimed: pages the weights in */
    for (int i = 0; i < MAX_CONV && !rc; i++) rc = run_batch(m, &o, i, 1, alone + i, NULL, err, sizeof err) < 0;
    for (int r = 0; r < 4 && !rc; r++) {
        double t = run_batch(m, &o, 0, ks[r], together, &fig[r], err, sizeof err);
        rc = t < 0;
        for (int i = 0; i < ks[r] && !rc; i++)
            if (memcmp(together[i], alone[i], sizeof(int) * (size_t)o.decode)) {
                rc = errf(err, sizeof err, "conversation %d of %d decoded together differs from running it alone", i,
                          ks[r]) != 0;
            }
        if (!rc) tok_s[r] = ks[r] * o.decode / t;
    }
    double best_ratio[4];
    for (int r = 0; r < 4; r++) best_ratio[r] = ks[r] * fig[0].best / fig[r].best;
    if (!rc) rc = mix_figures(m, &o, mix, err, sizeof err) != 0;
    model_close(m);
    if (rc) { fprintf(stderr, "cairn bench concurrency: %s\n", err); return 1; }
    if (o.json) {
        printf("{\"tok_s_1\":%.3f,\"tok_s_2\":%.3f,\"tok_s_4\":%.3f,\"tok_s_8\":%.3f,\"concurrency_ratio_2\":%.3f,"
               "\"concurrency_ratio_4\":%.3f,\"concurrency_ratio_8\":%.3f,\"prompt\":%ld,\"decode\":%ld,"
               "\"mix_decode_tok_s_joined\":%.3f,\"mix_decode_tok_s_apart\":%.3f,\"mix_prefill_tok_s_joined\":%.3f,"
               "\"mix_prefill_tok_s_apart\":%.3f,\"mix_long_prompt\":%d,\"best_step_ratio_2\":%.3f,"
               "\"best_step_ratio_4\":%.3f,\"best_step_ratio_8\":%.3f,\"experts_per_call_1\":%.2f,"
               "\"experts_per_call_4\":%.2f,\"experts_per_call_8\":%.2f,\"experts_spread_share_4\":%.3f,"
               "\"dense_gbs_1\":%.2f,\"experts_gbs_1\":%.2f,\"other_share_1\":%.3f,\"dense_gbs_4\":%.2f,"
               "\"experts_gbs_4\":%.2f,\"other_share_4\":%.3f,\"threads\":%d,\"simd\":\"%s\"}\n",
               tok_s[0], tok_s[1], tok_s[2], tok_s[3], tok_s[1] / tok_s[0], tok_s[2] / tok_s[0], tok_s[3] / tok_s[0],
               o.prompt, o.decode, mix[0], mix[1], mix[2], mix[3], MIX_LONG, best_ratio[1], best_ratio[2],
               best_ratio[3], fig[0].chosen, fig[2].chosen, fig[3].chosen, fig[2].spread, fig[0].dense_gbs,
               fig[0].experts_gbs, fig[0].other_share, fig[2].dense_gbs, fig[2].experts_gbs, fig[2].other_share,
               pool_threads(), kernels_simd_name());
        return 0;
    }
    printf("conversations  aggregate tok/s  / one conversation  fastest step ratio  experts/MoE call  spread"
           "  dense GB/s  experts GB/s  other\n");
    for (int r = 0; r < 4; r++)
        printf("%13d  %15.2f  %18.2f  %18.2f  %16.2f  %5.0f%%  %10.2f  %12.2f  %4.0f%%\n", ks[r], tok_s[r],
               tok_s[r] / tok_s[0], best_ratio[r], fig[r].chosen, 100 * fig[r].spread, fig[r].dense_gbs,
               fig[r].experts_gbs, 100 * fig[r].other_share);
    printf("(one forward call per step; %d threads, %s; spread: MoE calls whose experts ran one per pool task;\n"
           " dense / experts GB/s: their weight bytes per second of their products / of the MoE expert calls;\n"
           " other: the steps' time in neither)\n",
           pool_threads(), kernels_simd_name());
    printf("%d conversations decoding while another prefills %d tokens:\n"
           "  prefill joined to the decode calls  decode %8.2f tok/s  prefill %8.2f tok/s\n"
           "  prefill in calls of its own         decode %8.2f tok/s  prefill %8.2f tok/s   (joined / apart: decode x%.2f)\n",
           MIX_CONV, MIX_LONG, mix[0], mix[2], mix[1], mix[3], mix[0] / mix[1]);
    printf("every conversation's tokens equal running it alone\n");
    return 0;
}
