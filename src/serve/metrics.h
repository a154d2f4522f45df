/* metrics.h — counters the server exports at GET /metrics in the Prometheus text format:
 * requests by endpoint and status, prompt/completion tokens, prompt tokens reused from the
 * engine's state vs prefilled and the engine time that prefill took, time-to-first-token
 * histogram, engine restarts, connections cut for slow headers.
 *
 * INVARIANT: every counter only grows; all updates and the rendering take one lock, so a scrape
 * sees a consistent set (reused + prefilled == prompt tokens of finished requests). */
#ifndef CAIRN_METRICS_H
#define CAIRN_METRICS_H

#include "http.h"

typedef struct metrics metrics;

metrics *metrics_new(void);
void metrics_free(metrics *m);
/* One finished HTTP request on endpoint (e.g. "/v1/chat/completions") with its status. */
void metrics_request(metrics *m, const char *endpoint, int status);
/* One engine generation that ended: its prompt size, the part reused, tokens generated, and the
 * engine's seconds prefilling the rest. prefilled tokens / prefill seconds over all generations
 * is the engine's measured prefill rate, which the chat page turns into a cold-prefill estimate. */
void metrics_generation(metrics *m, int prompt_tokens, int reused, int completion_tokens, double prefill_s);
void metrics_ttft(metrics *m, double seconds);
/* A connection cut because its request headers missed --header-timeout (header_deadline.h). */
void metrics_header_timeout(metrics *m);
/* Render everything; gauges are passed in by the caller (they live elsewhere). */
void metrics_render(metrics *m, sbuf *out, int slots_busy, int slots_total, int queue_waiting,
                    long queue_rejected, int engine_up, int engine_restarts);

#endif
