#include "metrics.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"

static const double ttft_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
#define TTFT_NB (sizeof ttft_bounds / sizeof ttft_bounds[0])
#define MAX_SERIES 64

typedef struct {
    char endpoint[48];
    int status;
    long count;
} req_series;

struct metrics {
    pthread_mutex_t mu;
    req_series req[MAX_SERIES];
    int nreq;
    long prompt_tokens, reused_tokens, completion_tokens, generations;
    double prefill_s;
    long ttft_counts[TTFT_NB + 1];     /* per bucket (not cumulative); last = +Inf */
    double ttft_sum;
    long ttft_n;
    long header_timeouts;
};

metrics *metrics_new(void) {
    metrics *m = xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

void metrics_free(metrics *m) {
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void metrics_request(metrics *m, const char *endpoint, int status) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->nreq && (m->req[i].status != status || strcmp(m->req[i].endpoint, endpoint))) i++;
    if (i == m->nreq && m->nreq < MAX_SERIES) {
        snprintf(m->req[i].endpoint, sizeof m->req[i].endpoint, "%s", endpoint);
        m->req[i].status = status;
        m->nreq++;
    }
    if (i < m->nreq) m->req[i].count++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_generation(metrics *m, int prompt_tokens, int reused, int completion_tokens, double prefill_s) {
    pthread_mutex_lock(&m->mu);
    m->generations++;
    m->prompt_tokens += prompt_tokens;
    m->reused_tokens += MIN(reused, prompt_tokens);
    m->completion_tokens += completion_tokens;
    m->prefill_s += prefill_s;
    pthread_mutex_unlock(&m->mu);
}

void metrics_ttft(metrics *m, double seconds) {
    pthread_mutex_lock(&m->mu);
    size_t b = 0;
    while (b < TTFT_NB && seconds > ttft_bounds[b]) b++;
    m->ttft_counts[b]++;
    m->ttft_sum += seconds;
    m->ttft_n++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_header_timeout(metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->header_timeouts++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_render(metrics *m, sbuf *o, int slots_busy, int slots_total, int queue_waiting,
                    long queue_rejected, int engine_up, int engine_restarts) {
    pthread_mutex_lock(&m->mu);
    sbuf_puts(o, "# HELP cairn_requests_total HTTP requests by endpoint and status.\n"
                 "# TYPE cairn_requests_total counter\n");
    for (int i = 0; i < m->nreq; i++)
        sbuf_printf(o, "cairn_requests_total{endpoint=\"%s\",status=\"%d\"} %ld\n", m->req[i].endpoint,
                    m->req[i].status, m->req[i].count);
    sbuf_printf(o, "# HELP cairn_generations_total Engine generations that finished.\n"
                   "# TYPE cairn_generations_total counter\ncairn_generations_total %ld\n", m->generations);
    sbuf_printf(o, "# HELP cairn_prompt_tokens_total Prompt tokens of finished generations.\n"
                   "# TYPE cairn_prompt_tokens_total counter\ncairn_prompt_tokens_total %ld\n", m->prompt_tokens);
    sbuf_printf(o, "# HELP cairn_prompt_tokens_reused_total Prompt tokens reused from the engine's state.\n"
                   "# TYPE cairn_prompt_tokens_reused_total counter\ncairn_prompt_tokens_reused_total %ld\n",
                m->reused_tokens);
    sbuf_printf(o, "# HELP cairn_prompt_tokens_prefilled_total Prompt tokens the engine had to prefill.\n"
                   "# TYPE cairn_prompt_tokens_prefilled_total counter\ncairn_prompt_tokens_prefilled_total %ld\n",
                m->prompt_tokens - m->reused_tokens);
    sbuf_printf(o, "# HELP cairn_prefill_seconds_total Engine time spent prefilling those tokens.\n"
                   "# TYPE cairn_prefill_seconds_total counter\ncairn_prefill_seconds_total %.6f\n", m->prefill_s);
    sbuf_printf(o, "# HELP cairn_completion_tokens_total Generated tokens.\n"
                   "# TYPE cairn_completion_tokens_total counter\ncairn_completion_tokens_total %ld\n",
                m->completion_tokens);
    sbuf_puts(o, "# HELP cairn_ttft_seconds Time from request arrival to the first generated token.\n"
                 "# TYPE cairn_ttft_seconds histogram\n");
    long cum = 0;
    for (size_t b = 0; b < TTFT_NB; b++) {
        cum += m->ttft_counts[b];
        sbuf_printf(o, "cairn_ttft_seconds_bucket{le=\"%g\"} %ld\n", ttft_bounds[b], cum);
    }
    cum += m->ttft_counts[TTFT_NB];
    sbuf_printf(o, "cairn_ttft_seconds_bucket{le=\"+Inf\"} %ld\ncairn_ttft_seconds_sum %.6f\ncairn_ttft_seconds_count %ld\n",
                cum, m->ttft_sum, m->ttft_n);
    sbuf_printf(o, "# HELP cairn_header_timeouts_total Connections closed because their request headers took too long.\n"
                   "# TYPE cairn_header_timeouts_total counter\ncairn_header_timeouts_total %ld\n", m->header_timeouts);
    pthread_mutex_unlock(&m->mu);
    sbuf_printf(o, "# TYPE cairn_slots_busy gauge\ncairn_slots_busy %d\n", slots_busy);
    sbuf_printf(o, "# TYPE cairn_slots gauge\ncairn_slots %d\n", slots_total);
    sbuf_printf(o, "# TYPE cairn_queue_waiting gauge\ncairn_queue_waiting %d\n", queue_waiting);
    sbuf_printf(o, "# TYPE cairn_queue_rejected_total counter\ncairn_queue_rejected_total %ld\n", queue_rejected);
    sbuf_printf(o, "# TYPE cairn_engine_up gauge\ncairn_engine_up %d\n", engine_up);
    sbuf_printf(o, "# TYPE cairn_engine_restarts_total counter\ncairn_engine_restarts_total %d\n", engine_restarts);
}
