#include "header_deadline.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "../core/util.h"

/* One open connection; deadline 0 = disarmed (its request's headers are complete). */
typedef struct conn {
    int fd;
    double deadline;
    struct conn *prev, *next;
} conn;

struct header_deadline {
    double seconds, period;
    metrics *mx;
    pthread_mutex_t mu;
    pthread_cond_t wake;          /* signalled only to stop the watchdog */
    int stop;
    conn *head;
    pthread_t watchdog;
};

static void cut_overdue(header_deadline *hd) {
    double now = now_seconds();
    for (conn *k = hd->head; k; k = k->next) {
        if (!k->deadline || now < k->deadline) continue;
        shutdown(k->fd, SHUT_RDWR);
        k->deadline = 0;
        metrics_header_timeout(hd->mx);
        fprintf(stderr, "cairn serve: closed a connection whose request headers took longer than %g s\n", hd->seconds);
    }
}

static void *watchdog_main(void *arg) {
    header_deadline *hd = arg;
    pthread_mutex_lock(&hd->mu);
    while (!hd->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(hd->period * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&hd->wake, &hd->mu, &ts);
        cut_overdue(hd);
    }
    pthread_mutex_unlock(&hd->mu);
    return NULL;
}

header_deadline *hd_new(double seconds, metrics *mx) {
    header_deadline *hd = xcalloc(1, sizeof *hd);
    hd->seconds = seconds;
    hd->period = MIN(1.0, MAX(0.05, seconds / 8));   /* a cut lands at most 1/8 late */
    hd->mx = mx;
    pthread_mutex_init(&hd->mu, NULL);
    pthread_cond_init(&hd->wake, NULL);
    if (pthread_create(&hd->watchdog, NULL, watchdog_main, hd)) {
        pthread_cond_destroy(&hd->wake);
        pthread_mutex_destroy(&hd->mu);
        free(hd);
        return NULL;
    }
    return hd;
}

void hd_free(header_deadline *hd) {
    if (!hd) return;
    pthread_mutex_lock(&hd->mu);
    hd->stop = 1;
    pthread_cond_signal(&hd->wake);
    pthread_mutex_unlock(&hd->mu);
    pthread_join(hd->watchdog, NULL);
    for (conn *k = hd->head, *next; k; k = next) {
        next = k->next;
        free(k);
    }
    pthread_cond_destroy(&hd->wake);
    pthread_mutex_destroy(&hd->mu);
    free(hd);
}

void hd_notify(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    header_deadline *hd = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!fd) return;
        conn *k = xcalloc(1, sizeof *k);
        k->fd = fd->connect_fd;
        pthread_mutex_lock(&hd->mu);
        k->deadline = now_seconds() + hd->seconds;
        k->next = hd->head;
        if (hd->head) hd->head->prev = k;
        hd->head = k;
        pthread_mutex_unlock(&hd->mu);
        *socket_context = k;
        return;
    }
    conn *k = *socket_context;
    if (!k) return;
    pthread_mutex_lock(&hd->mu);
    if (k->prev) k->prev->next = k->next;
    else hd->head = k->next;
    if (k->next) k->next->prev = k->prev;
    pthread_mutex_unlock(&hd->mu);
    free(k);
    *socket_context = NULL;
}

static void set_deadline(header_deadline *hd, struct MHD_Connection *c, int armed) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn *k = ci ? ci->socket_context : NULL;
    if (!k) return;
    pthread_mutex_lock(&hd->mu);
    k->deadline = armed ? now_seconds() + hd->seconds : 0;
    pthread_mutex_unlock(&hd->mu);
}

void hd_headers_done(header_deadline *hd, struct MHD_Connection *c) { set_deadline(hd, c, 0); }

void hd_rearm(header_deadline *hd, struct MHD_Connection *c) { set_deadline(hd, c, 1); }
