/* bench_grammar.c — `cairn bench grammar -m DIR`: what constrained decoding costs per sampling
 * step, as a fraction of the decode step it rides on, on this model's vocabulary.
 *
 * For each constraint (a free JSON object, a nested JSON Schema, and the family's forced tool
 * call when it has a tool-call syntax) one sequence decodes --steps tokens at temperature 1 with
 * the grammar on: each step times the forward pass (the decode step, wall clock) and, separately,
 * the grammar work the engine adds (mask the logits, then advance the matcher past the sampled
 * token; the sampling between them is not counted) in the calling thread's CPU time — that work is single-threaded, and CPU time leaves
 * out the milliseconds another process holds the core on a loaded machine, which the wall clock
 * of a 50 µs window would count as grammar cost. Each step's grammar time is divided by the
 * median decode step (a preempted forward pass would flatter one step's ratio); reported per
 * constraint: mean, p99 and max of those ratios, the worst step (index, cache miss or hit), how
 * often the mask came from the per-state cache, and the one-off cost of compiling the constraint
 * (schema -> GBNF -> matcher) over one decode step. A finished sentence starts a fresh matcher
 * (a new request) on the same sequence. The weights are paged in by an untimed pass first.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "cli.h"
#include "core/grammar.h"
#include "core/json_schema.h"
#include "core/sampler.h"
#include "core/threads.h"
#include "core/tokmask.h"
#include "core/util.h"
#include "models/model.h"

typedef struct {
    const char *model_dir;
    int json;
    long steps, threads;
} grammar_opts;

typedef struct {
    const char *name;
    double mean, p99, max, compile_s, decode_s;   /* ratios to the median decode step; its seconds */
    long worst_step, steps, hits, sentences;
    int worst_missed;             /* the worst step computed its mask (no cache hit) */
} constraint_result;

static double thread_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Mean, p99 and max of the grammar seconds g[0..n) over the median of the decode seconds d. */
static void summarize(constraint_result *r, const double *g, double *d, long n) {
    r->decode_s = bench_median(d, n);
    double *sorted = xmalloc((size_t)n * sizeof *sorted), sum = 0;
    for (long i = 0; i < n; i++) {
        sum += g[i];
        sorted[i] = g[i];
        if (g[i] > g[r->worst_step]) r->worst_step = i;
    }
    bench_sort(sorted, n);
    long p = (long)(0.99 * (double)(n - 1) + 0.5);
    r->mean = sum / (double)n / r->decode_s;
    r->p99 = sorted[p] / r->decode_s;
    r->max = sorted[n - 1] / r->decode_s;
    free(sorted);
}

static const char NESTED_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
    "\"name\":{\"type\":\"string\",\"maxLength\":40},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\"]},\"maxItems\":5},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\","
    "\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"city\",\"zip\"]},\"score\":{\"type\":\"number\"}},"
    "\"required\":[\"id\",\"name\",\"age\",\"address\"]}";

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"query\":{\"type\":\"string\"},\"limit\":{\"type\":\"integer\"}},\"required\":[\"query\"]}}}]";

static void usage(FILE *f) {
    fprintf(f,
            "usage: cairn bench grammar -m DIR [--steps N] [--threads N] [--json]\n"
            "\n"
            "Constrained-decoding cost on this model's vocabulary: for a JSON object, a nested JSON\n"
            "Schema and the family's forced tool call, N decode steps (default 64) at temperature 1\n"
            "with the grammar on; prints grammar time per step / decode step time, the worst step,\n"
            "the mask cache hit rate, and compile time / decode step.\n");
}

static int parse(int argc, char **argv, grammar_opts *o) {
    *o = (grammar_opts){NULL, 0, 64, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); exit(0); }
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!v) { fprintf(stderr, "cairn bench grammar: %s needs a value (or unknown flag)\n", a); return -1; }
        i++;
        if (!strcmp(a, "-m")) o->model_dir = v;
        else if (!strcmp(a, "--steps")) { if (cli_int("bench grammar", a, v, 1, 1 << 16, &o->steps)) return -1; }
        else if (!strcmp(a, "--threads")) { if (cli_int("bench grammar", a, v, 1, 1024, &o->threads)) return -1; }
        else { fprintf(stderr, "cairn bench grammar: unknown flag '%s' (see --help)\n", a); return -1; }
    }
    if (!o->model_dir) { fprintf(stderr, "cairn bench grammar: -m DIR is required\n"); return -1; }
    return 0;
}

/* GBNF of constraint k (0 object, 1 nested schema, 2 tool call); 1 when the model has none. */
static int constraint_gbnf(const model *m, int k, sbuf *g, const char **name, char *err, size_t errlen) {
    static const char *names[] = {"json_object", "json_schema", "tool_call"};
    *name = names[k];
    if (k == 2) {
        const chat_template *t = m->ops->chat;
        if (!t || !t->tools) return 1;
        cJSON *tools = cJSON_Parse(TOOLS);
        int rc = chat_tool_grammar(t, tools, "required", 1, 0, NULL, g, err, errlen);
        cJSON_Delete(tools);
        return rc;
    }
    const char *schema = k == 0 ? "{\"type\":\"object\"}" : NESTED_SCHEMA;
    return json_schema_grammar(schema, strlen(schema), g, err, errlen);
}

/* The compile a request pays once: constraint text -> GBNF -> grammar -> matcher. */
static grammar *compile(const model *m, int k, const tokvocab *v, tokmask *km, const char **name, char *err,
                        size_t errlen) {
    sbuf g = {0};
    int rc = constraint_gbnf(m, k, &g, name, err, errlen);
    grammar *gr = rc ? NULL : grammar_parse(g.p, g.len, err, errlen);
    sbuf_free(&g);
    if (gr) tokmask_init(km, v, gr);
    else if (rc > 0) err[0] = 0;
    return gr;
}

static int run_constraint(model *m, const tokvocab *v, const grammar_opts *o, int k, constraint_result *r, char *err,
                          size_t errlen) {
    tokmask km;
    double t0 = now_seconds();
    grammar *g = compile(m, k, v, &km, &r->name, err, errlen);
    r->compile_s = now_seconds() - t0;
    if (!g) return err[0] ? -1 : 1;
    int *prompt = bench_prompt(8, m->vocab_size, 7);
    seq *s = seq_new(m, (int)o->steps + 16, err, errlen);
    float *logits = xmalloc(sizeof(float) * (size_t)m->vocab_size);
    sampler smp;
    sampler_init(&smp, &(sampler_params){.temperature = 1, .top_p = 1, .seed = 42 + (uint64_t)k}, m->vocab_size);
    int rc = s ? seq_feed(s, prompt, 8, logits, err, errlen) : -1;
    double *gs = xcalloc((size_t)o->steps, sizeof *gs), *ds = xcalloc((size_t)o->steps, sizeof *ds);
    int *missed = xcalloc((size_t)o->steps, sizeof *missed);
    long n = 0;
    for (; !rc && n < o->steps; n++) {
        long hits = km.cache_hits;
        double a = thread_seconds();
        if (tokmask_apply(&km, logits) == 0) { rc = errf(err, errlen, "%s: the grammar has no continuation", r->name); break; }
        double b = thread_seconds();
        int t = sampler_pick(&smp, logits);     /* sampling is not the grammar's cost */
        int eos = model_is_eos(m, t);
        double c = thread_seconds();
        if (!eos) tokmask_feed(&km, t);
        gs[n] = (b - a) + (thread_seconds() - c);
        missed[n] = km.cache_hits == hits;
        if (eos || (tokmask_complete(&km) && !gm_can_continue(km.m, gm_state(km.m)))) {
            r->sentences++;
            r->steps += km.steps;
            r->hits += km.cache_hits;
            tokmask_free(&km);
            tokmask_init(&km, v, g);      /* the next request on this sequence */
        }
        double f = now_seconds();
        rc = seq_feed(s, &t, 1, logits, err, errlen);
        ds[n] = now_seconds() - f;
    }
    if (!rc) {
        summarize(r, gs, ds, n);
        r->worst_missed = missed[r->worst_step];
    }
    free(gs);
    free(ds);
    free(missed);
    r->steps += km.steps;
    r->hits += km.cache_hits;
    tokmask_free(&km);
    grammar_free(g);
    sampler_free(&smp);
    free(logits);
    free(prompt);
    seq_free(s);
    return rc;
}

static void report(const grammar_opts *o, const model *m, const constraint_result *r, int n) {
    if (o->json) {
        printf("{\"vocab\":%d,\"steps\":%ld,\"threads\":%d,\"constraints\":[", m->vocab_size, o->steps, pool_threads());
        for (int i = 0; i < n; i++)
            printf("%s{\"name\":\"%s\",\"step_ratio\":%.6f,\"p99_step_ratio\":%.6f,\"worst_step_ratio\":%.6f,"
                   "\"worst_step\":%ld,\"worst_step_missed\":%s,\"decode_step_s\":%.6f,\"compile_ratio\":%.6f,"
                   "\"cache_hit_rate\":%.4f,\"sentences\":%ld}",
                   i ? "," : "", r[i].name, r[i].mean, r[i].p99, r[i].max, r[i].worst_step, r[i].worst_missed ? "true" : "false",
                   r[i].decode_s, r[i].compile_s / r[i].decode_s, (double)r[i].hits / r[i].steps, r[i].sentences);
        printf("]}\n");
        return;
    }
    printf("vocabulary %d tokens, %ld decode steps per constraint, %d threads; grammar work per step (thread CPU\n"
           "time) / median decode step:\n", m->vocab_size, o->steps, pool_threads());
    for (int i = 0; i < n; i++)
        printf("%-12s mean %6.2f %%  p99 %6.2f %%  max %6.2f %% (step %ld, %s)  mask cache hits %5.1f %%  "
               "compile %6.2f decode steps  (decode step %.2f ms, %ld sentences)\n",
               r[i].name, 100 * r[i].mean, 100 * r[i].p99, 100 * r[i].max, r[i].worst_step,
               r[i].worst_missed ? "mask computed" : "cached mask", 100.0 * r[i].hits / r[i].steps,
               r[i].compile_s / r[i].decode_s, 1e3 * r[i].decode_s, r[i].sentences);
}

int bench_grammar(int argc, char **argv) {
    grammar_opts o;
    if (parse(argc, argv, &o)) return 2;
    if (o.threads) pool_set_threads((int)o.threads);
    char err[512] = "";
    model *m = model_open(o.model_dir, NUMERICS_QAT, 0, err, sizeof err);
    if (!m) { fprintf(stderr, "cairn bench grammar: %s\n", err); return 1; }
    if (!m->tok) {
        fprintf(stderr, "cairn bench grammar: %s has no usable tokenizer.json\n", o.model_dir);
        model_close(m);
        return 1;
    }
    if (o.steps + 16 > m->max_ctx) o.steps = m->max_ctx - 16;
    tokvocab *v = tokvocab_new(m->tok, m->vocab_size, m->eos_ids, m->n_eos);
    constraint_result res[3], warm = {0};
    int n = 0, rc = 0;
    grammar_opts page_in = o;
    page_in.steps = 2;
    rc = run_constraint(m, v, &page_in, 0, &warm, err, sizeof err);   /* untimed: pages the weights in */
    for (int k = 0; k < 3 && rc >= 0; k++) {
        memset(&res[n], 0, sizeof res[n]);
        rc = run_constraint(m, v, &o, k, &res[n], err, sizeof err);
        if (rc == 0) n++;
    }
    if (rc < 0) fprintf(stderr, "cairn bench grammar: %s\n", err);
    else report(&o, m, res, n);
    tokvocab_free(v);
    model_close(m);
    return rc < 0 ? 1 : 0;
}
