#include "slots.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/util.h"

typedef struct {
    char *record;
    size_t len;
    int busy;
    unsigned long last_used;      /* tick of the last acquire, for LRU */
    unsigned long long owner;     /* 0 = none (slots.h OWNERS) */
} slot_state;

/* A queued request. Granting happens under the lock in arrival order. */
typedef struct waiter {
    slot_request rq;
    int granted;                  /* slot index + 1 once granted */
    struct waiter *next;
} waiter;

struct slots {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    slot_state *slot;
    int n, max_queue, nwait, closed;
    waiter *head, *tail;
    unsigned long tick;
    long admitted, rejected, timed_out;
};

slots *slots_new(int n, int max_queue) {
    slots *s = xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->slot = xcalloc((size_t)n, sizeof *s->slot);
    s->n = n;
    s->max_queue = max_queue;
    return s;
}

void slots_free(slots *s) {
    for (int i = 0; i < s->n; i++) free(s->slot[i].record);
    free(s->slot);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

static size_t common_prefix(const char *a, size_t na, const char *b, size_t nb) {
    size_t i = 0, n = MIN(na, nb);
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* The routing rules of slots.h over the free slots; -1 if none is free. */
static int pick_free(slots *s, const char *prompt, size_t n) {
    int extend = -1, partial = -1, empty = -1, lru = -1;
    size_t best_extend = 0, best_partial = 0;
    for (int i = 0; i < s->n; i++) {
        slot_state *t = &s->slot[i];
        if (t->busy) continue;
        size_t lcp = common_prefix(t->record, t->len, prompt, n);
        if (t->len > 0 && lcp == t->len && t->len > best_extend) { extend = i; best_extend = t->len; }
        int regenerate = lcp == n && n > 0;  /* the prompt again: a prefix of what the slot holds */
        if (t->len > 0 && (lcp * 2 >= t->len || regenerate) && lcp > best_partial) { partial = i; best_partial = lcp; }
        if (t->len == 0 && empty < 0) empty = i;
        if (lru < 0 || t->last_used < s->slot[lru].last_used) lru = i;
    }
    if (extend >= 0) return extend;
    if (partial >= 0) return partial;
    if (empty >= 0) return empty;
    return lru;
}

static int owned_by(const slots *s, unsigned long long owner) {
    for (int i = 0; owner && i < s->n; i++)
        if (s->slot[i].owner == owner) return i;
    return -1;
}

static int pick_for(slots *s, const slot_request *rq) {
    int mine = rq->pinned >= 0 ? rq->pinned : owned_by(s, rq->owner);
    if (mine >= 0) return s->slot[mine].busy ? -1 : mine;
    return pick_free(s, rq->prompt, rq->n);
}

/* rq's owner now owns slot i, and only it (nobody does, for a request without one). */
static void take(slots *s, int i, const slot_request *rq) {
    int had = owned_by(s, rq->owner);
    if (had >= 0) s->slot[had].owner = 0;   /* only a pinned request can move its owner */
    s->slot[i].owner = rq->owner;
    s->slot[i].busy = 1;
    s->slot[i].last_used = ++s->tick;
    s->admitted++;
}

/* Hand free slots to waiters in arrival order. Called with the lock held. */
static void grant(slots *s) {
    int woke = 0;
    for (waiter *w = s->head; w; w = w->next) {
        if (w->granted) continue;
        int i = pick_for(s, &w->rq);
        if (i < 0) continue;
        take(s, i, &w->rq);
        w->granted = i + 1;
        woke = 1;
    }
    if (woke) pthread_cond_broadcast(&s->cv);
}

static void unlink_waiter(slots *s, waiter *w) {
    waiter **pp = &s->head, *prev = NULL;
    while (*pp && *pp != w) { prev = *pp; pp = &(*pp)->next; }
    if (!*pp) return;
    *pp = w->next;
    if (s->tail == w) s->tail = prev;
    s->nwait--;
}

static void deadline_in(struct timespec *ts, double s) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += (time_t)s;
    ts->tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
    if (ts->tv_nsec >= 1000000000L) { ts->tv_sec++; ts->tv_nsec -= 1000000000L; }
}

int slots_acquire(slots *s, const slot_request *rq, double timeout, int (*gone)(void *), void *gone_arg, int *slot) {
    pthread_mutex_lock(&s->mu);
    if (s->closed) { pthread_mutex_unlock(&s->mu); return SLOTS_CLOSED; }
    waiter w = {.rq = *rq};
    if (!s->head) {
        int i = pick_for(s, rq);
        if (i >= 0) {
            take(s, i, rq);
            pthread_mutex_unlock(&s->mu);
            *slot = i;
            return SLOTS_OK;
        }
    }
    if (s->nwait >= s->max_queue) {
        s->rejected++;
        pthread_mutex_unlock(&s->mu);
        return SLOTS_FULL;
    }
    if (s->tail) s->tail->next = &w;
    else s->head = &w;
    s->tail = &w;
    s->nwait++;
    grant(s);
    double deadline = now_seconds() + timeout;
    int rc = SLOTS_OK;
    while (!w.granted) {
        if (s->closed) { rc = SLOTS_CLOSED; break; }
        if (now_seconds() >= deadline) { rc = SLOTS_TIMEOUT; s->timed_out++; break; }
        if (gone && gone(gone_arg)) { rc = SLOTS_GONE; break; }
        struct timespec ts;
        deadline_in(&ts, 0.1);     /* wake regularly to notice a client that left */
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    unlink_waiter(s, &w);
    if (w.granted && rc != SLOTS_OK) {          /* granted in the same instant we gave up */
        s->slot[w.granted - 1].busy = 0;
        grant(s);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc == SLOTS_OK) *slot = w.granted - 1;
    return rc;
}

/* What slot t is known to hold (NULL or n = 0: nothing known). Called with the lock held. */
static void set_record(slot_state *t, const char *record, size_t n) {
    free(t->record);
    t->record = NULL;
    t->len = 0;
    if (record && n) {
        t->record = malloc(n);          /* no memory = the slot is simply not routed to by prefix */
        if (t->record) { memcpy(t->record, record, n); t->len = n; }
    }
}

void slots_learn(slots *s, int i, const char *record, size_t n) {
    if (i < 0 || i >= s->n) return;
    pthread_mutex_lock(&s->mu);
    set_record(&s->slot[i], record, n);
    pthread_mutex_unlock(&s->mu);
}

void slots_release(slots *s, int i, const char *record, size_t n) {
    pthread_mutex_lock(&s->mu);
    slot_state *t = &s->slot[i];
    set_record(t, record, n);
    t->busy = 0;
    grant(s);
    pthread_mutex_unlock(&s->mu);
}

void slots_forget_all(slots *s) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n; i++) {
        set_record(&s->slot[i], NULL, 0);
        s->slot[i].owner = 0;
    }
    pthread_mutex_unlock(&s->mu);
}

void slots_close(slots *s) {
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void slots_get_stats(slots *s, slots_stats *st) {
    pthread_mutex_lock(&s->mu);
    st->n = s->n;
    st->busy = 0;
    for (int i = 0; i < s->n; i++) st->busy += s->slot[i].busy;
    st->waiting = s->nwait;
    st->max_queue = s->max_queue;
    st->admitted = s->admitted;
    st->rejected = s->rejected;
    st->timed_out = s->timed_out;
    pthread_mutex_unlock(&s->mu);
}

size_t slots_record_len(slots *s, int i) {
    pthread_mutex_lock(&s->mu);
    size_t n = i >= 0 && i < s->n ? s->slot[i].len : 0;
    pthread_mutex_unlock(&s->mu);
    return n;
}

char *slots_record(slots *s, int i, size_t *n) {
    pthread_mutex_lock(&s->mu);
    char *r = NULL;
    *n = 0;
    if (i >= 0 && i < s->n && s->slot[i].len) {
        r = malloc(s->slot[i].len);     /* no memory = released as unknown, like slots_release */
        if (r) {
            memcpy(r, s->slot[i].record, s->slot[i].len);
            *n = s->slot[i].len;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return r;
}
