/* bench_concurrency.c — `cairn bench concurrency -m DIR`: what decoding several conversations
 * in one forward call per step (seq_feed_step, as the engine does) buys over one conversation.
 *
 * For k = 1, 2, 4, 8 conversations (distinct prompts, each prefilled untimed), D greedy decode
 * steps are timed; aggregate tok/s = k * D / time, and the report is aggregate / the k = 1
 * figure of the same run. Batching reads the dense, attention and shared-expert weights once per
 * step for all k (routed experts only where tokens pick different ones), so a memory-bound decode
 * approaches k x. Every conversation's tokens are checked against running it alone, so a ratio
 * bought with wrong answers fails the run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"
#include "core/kernels.h"
#include "core/threads.h"
#include "core/util.h"
#include "models/model.h"

#define MAX_CONV 8

static void usage(FILE *f) {
    fprintf(f,
            "usage: cairn bench concurrency -m DIR [--json] [--prompt N] [--decode N] [--threads N]\n"
            "                               [--numerics exact|qat]\n"
            "\n"
            "Decodes 1, 2, 4 and 8 conversations (N-token prompts, default 16, prefilled untimed) for\n"
            "N greedy steps (default 16), all of them in one forward call per step as the engine does,\n"
            "and prints aggregate tok/s and its ratio to one conversation measured in the same run.\n"
            "Each conversation's tokens must equal running it alone, else the run fails.\n"
            "--json prints {concurrency_ratio_2, concurrency_ratio_4, concurrency_ratio_8, ...}.\n");
}

/* Conversations first..first+k-1 (conversation i has prompt seed i + 1): prefill (untimed),
 * then `decode` batched greedy steps; tokens[i - first][step] gets conversation i's choices.
 * Returns seconds of the decode steps, < 0 on failure. */
static double run_batch(model *m, const bench_opts *o, int first, int k, int (*tokens)[64], char *err, size_t errlen) {
    seq *seqs[MAX_CONV] = {0};
    float *logits[MAX_CONV] = {0};
    int ids[MAX_CONV], ok = 1;
    double t = -1;
    for (int i = 0; i < k && ok; i++) {
        logits[i] = xmalloc(sizeof(float) * m->vocab_size);
        int *prompt = bench_prompt((int)o->prompt, m->vocab_size, (uint64_t)(first + i) + 1);
        ok = (seqs[i] = seq_new(m, (int)(o->prompt + o->decode + 1), err, errlen)) &&
             !seq_feed(seqs[i], prompt, (int)o->prompt, logits[i], err, errlen);
        free(prompt);
    }
    double t0 = now_seconds();
    for (long step = 0; ok && step < o->decode; step++) {
        for (int i = 0; i < k; i++) ids[i] = tokens[i][step] = bench_argmax(logits[i], m->vocab_size);
        ok = !seq_feed_step(seqs, ids, k, logits, err, errlen);
    }
    if (ok) t = now_seconds() - t0;
    for (int i = 0; i < k; i++) {
        seq_free(seqs[i]);
        free(logits[i]);
    }
    return t;
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
    double tok_s[4] = {0};
    int rc = run_batch(m, &o, 0, 1, alone, err, sizeof err) < 0;      /* untimed: pages the weights in */
    for (int i = 0; i < MAX_CONV && !rc; i++) rc = run_batch(m, &o, i, 1, alone + i, err, sizeof err) < 0;
    for (int r = 0; r < 4 && !rc; r++) {
        double t = run_batch(m, &o, 0, ks[r], together, err, sizeof err);
        rc = t < 0;
        for (int i = 0; i < ks[r] && !rc; i++)
            if (memcmp(together[i], alone[i], sizeof(int) * (size_t)o.decode)) {
                rc = errf(err, sizeof err, "conversation %d of %d decoded together differs from running it alone", i,
                          ks[r]) != 0;
            }
        if (!rc) tok_s[r] = ks[r] * o.decode / t;
    }
    model_close(m);
    if (rc) { fprintf(stderr, "cairn bench concurrency: %s\n", err); return 1; }
    if (o.json) {
        printf("{\"tok_s_1\":%.3f,\"tok_s_2\":%.3f,\"tok_s_4\":%.3f,\"tok_s_8\":%.3f,\"concurrency_ratio_2\":%.3f,"
               "\"concurrency_ratio_4\":%.3f,\"concurrency_ratio_8\":%.3f,\"prompt\":%ld,\"decode\":%ld,"
               "\"threads\":%d,\"simd\":\"%s\"}\n",
               tok_s[0], tok_s[1], tok_s[2], tok_s[3], tok_s[1] / tok_s[0], tok_s[2] / tok_s[0], tok_s[3] / tok_s[0],
               o.prompt, o.decode, pool_threads(), kernels_simd_name());
        return 0;
    }
    printf("conversations  aggregate tok/s  / one conversation   (one forward call per step; %d threads, %s)\n",
           pool_threads(), kernels_simd_name());
    for (int r = 0; r < 4; r++) printf("%13d  %15.2f  %18.2f\n", ks[r], tok_s[r], tok_s[r] / tok_s[0]);
    printf("every conversation's tokens equal running it alone\n");
    return 0;
}
