/* header_deadline.h — a total deadline for a request's headers (the slow-loris guard).
 *
 * libmicrohttpd's connection timeout (--read-timeout) is an idle timeout: every byte that
 * arrives resets it, so a client trickling one header byte a second would hold its connection,
 * and under thread-per-connection a thread, until --max-header ran out. libmicrohttpd has no
 * option for a total header time, and the access handler is first called only once the headers
 * are complete, so the guard sits beside the daemon:
 *
 *   - a connection is armed when it opens, and again when a request on it completes (the next
 *     request of a keep-alive connection gets the same bound, idle time included);
 *   - the access handler's first call for a request (its headers are complete) disarms it;
 *   - a watchdog thread shuts down (shutdown(2), both directions) the socket of a connection
 *     still armed past its deadline. libmicrohttpd then reads EOF and closes the connection
 *     through its ordinary path, so nothing of its bookkeeping is bypassed.
 *
 * INVARIANTS
 *  - shutdown() is applied only to a socket libmicrohttpd has not closed yet: an entry leaves
 *    the list in the NOTIFY_CLOSED callback, which libmicrohttpd calls before it closes the
 *    socket (daemon.c, 0.9.75), under the mutex the watchdog holds while it cuts.
 *  - A connection whose request headers are complete is never cut here, however long its
 *    body or its reply (a long stream) takes: those are bounded by --read-timeout, --max-body.
 *  - Each cut is counted once in /metrics (cairn_header_timeouts_total) and logged once.
 */
#ifndef CAIRN_HEADER_DEADLINE_H
#define CAIRN_HEADER_DEADLINE_H

#include <microhttpd.h>

#include "metrics.h"

typedef struct header_deadline header_deadline;

/* Starts the watchdog (NULL if its thread cannot start); seconds > 0. Cuts are counted in mx. */
header_deadline *hd_new(double seconds, metrics *mx);
/* Stops the watchdog (after the daemon has stopped: no connection is left). */
void hd_free(header_deadline *hd);

/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback, with hd as its closure. */
void hd_notify(void *hd, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code);
/* The request's headers are complete: the connection may no longer be cut. */
void hd_headers_done(header_deadline *hd, struct MHD_Connection *c);
/* A request on the connection completed: the next request's headers are due within the bound. */
void hd_rearm(header_deadline *hd, struct MHD_Connection *c);

#endif
