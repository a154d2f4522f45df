/* experts.c — routed experts from the mapping or through the expert cache (see experts.h).
 *
 * One mutex guards every entry's state, the LRU, the read queue and the counters; reads happen
 * with it released. An entry is ABSENT, QUEUED (for the reader), LOADING (a pread in flight,
 * its bytes already counted against the budget) or READY. READY entries that are not pinned sit
 * in the LRU, least recently used first. `want == gen` marks an expert the current call has yet
 * to run: eviction spares it while anything else can go.
 *
 * Across ranks, rank 0 packs one request per other rank and layer call:
 *   int32 n, layer, din, dout, has_weight; int32 (expert, rows) x n; float in[rows][din] by
 *   expert; float weight[rows] by expert when has_weight
 * and the owner answers with float out[rows][dout] in the same order. A failed message is fatal:
 * a cluster that lost a rank cannot produce the exact result, and MPI cannot carry on anyway. */
#include "experts.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster.h"
#include "threads.h"
#include "util.h"

enum { ABSENT, QUEUED, LOADING, READY };

typedef struct {
    int shard;
    uint64_t off;                /* file offset of the span */
    size_t len, at;              /* bytes, and where they start in the entry's buffer */
} span;

typedef struct entry {
    qmat mapped[EXPERT_MATS], cached[EXPERT_MATS];
    size_t data_at[EXPERT_MATS], scale_at[EXPERT_MATS];  /* buffer offsets of each matrix's pieces */
    int nm;
    span spans[2 * EXPERT_MATS];
    int nspans;
    size_t bytes;                /* buffer size */
    unsigned char *buf;
    int state, pinned, busy, ahead;
    uint64_t want, uses;
    struct entry *prev, *next;   /* LRU links */
} entry;

typedef struct {
    entry **at;                  /* [n] by expert id, NULL where not registered */
    int n, next;                 /* next layer with experts, -1 for the last */
    int *last, nlast;            /* experts chosen at this layer's previous call */
} layer_set;

struct experts {
    const st_file *st;
    layer_set *layers;
    int nlayers, count;
    int *slots, *start;          /* experts_run's grouping: slots by expert, and where each starts */
    size_t slots_cap, start_cap;
    int *chosen, *fill;          /* this call's chosen experts, ascending; the next free slot of each */
    size_t chosen_cap, fill_cap;
    int *mine, nmine;            /* ... of those, the ones this rank runs */
    size_t mine_cap;
    int *heavy, nheavy;          /* ... of those, split by work (split_by_work) */
    int *light, nlight;
    size_t heavy_cap, light_cap;
    expert_fn fn;                /* experts_bind */
    expert_scratch_fn scratch;
    void *ctx;
    arena sc;                    /* gathered rows and the expert function's scratch, grown on demand */
    arena *task_sc;              /* [task_sc_cap] the same per pool thread when a call spreads them */
    int task_sc_cap;
    int rank, ranks;             /* cluster.h, read at experts_new */
    void **msg;                  /* [ranks] request / reply buffers, and their capacities */
    size_t *msg_cap;
    int *rows_of;                /* [ranks] rows of this call's request to each rank */
    /* the cache */
    int cached;
    size_t budget, used, largest;
    int *fds, nfds;
    char *usage_path;
    uint64_t fingerprint;
    pthread_t reader;
    int reader_on, stop;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    entry **queue;
    int qhead, qlen, qcap;
    entry lru;                   /* sentinel: lru.next least recently used */
    uint64_t gen;
    experts_stats s;
};

experts *experts_new(const st_file *st) {
    experts *x = xcalloc(1, sizeof *x);
    x->st = st;
    x->lru.next = x->lru.prev = &x->lru;
    x->rank = cluster_rank();
    x->ranks = cluster_size();
    x->msg = xcalloc((size_t)x->ranks, sizeof *x->msg);
    x->msg_cap = xcalloc((size_t)x->ranks, sizeof *x->msg_cap);
    x->rows_of = xcalloc((size_t)x->ranks, sizeof *x->rows_of);
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->work, NULL);
    pthread_cond_init(&x->done, NULL);
    return x;
}

int experts_count(const experts *x) { return x ? x->count : 0; }

void experts_bind(experts *x, expert_fn fn, expert_scratch_fn scratch, void *ctx) {
    x->fn = fn;
    x->scratch = scratch;
    x->ctx = ctx;
}
int experts_cached(const experts *x) { return x && x->cached; }

/* ---- registration: where an expert's bytes are ---------------------------------------------- */

typedef struct {
    int shard, mat, is_scale;
    uint64_t off;
    size_t len;
} piece;

static int by_place(const void *a, const void *b) {
    const piece *p = a, *q = b;
    if (p->shard != q->shard) return p->shard < q->shard ? -1 : 1;
    return p->off < q->off ? -1 : p->off > q->off;
}

static const void *scale_ptr(const qmat *w) { return w->scale_f32 ? (const void *)w->scale_f32 : w->scale; }

/* Sort the pieces by file place, merge neighbours into spans, lay the spans out in the buffer
 * (each at its file offset's alignment mod 64) and note where every matrix's pieces land. */
static void plan(entry *en, piece *pc, int np) {
    qsort(pc, (size_t)np, sizeof *pc, by_place);
    size_t end = 0;
    for (int i = 0; i < np; i++) {
        span *sp = en->nspans ? &en->spans[en->nspans - 1] : NULL;
        if (!sp || sp->shard != pc[i].shard || pc[i].off > sp->off + sp->len + EXPERTS_MERGE_GAP) {
            sp = &en->spans[en->nspans++];
            *sp = (span){.shard = pc[i].shard, .off = pc[i].off, .len = 0};
            sp->at = (end + 63) / 64 * 64 + sp->off % 64;
        }
        sp->len = MAX(sp->len, (size_t)(pc[i].off + pc[i].len - sp->off));
        end = sp->at + sp->len;
        size_t at = sp->at + (size_t)(pc[i].off - sp->off);
        if (pc[i].is_scale) en->scale_at[pc[i].mat] = at;
        else en->data_at[pc[i].mat] = at;
    }
    en->bytes = end;
}

static layer_set *layer_get(experts *x, int layer, int e) {
    if (layer >= x->nlayers) {
        x->layers = xrealloc(x->layers, (size_t)(layer + 1) * sizeof *x->layers);
        memset(x->layers + x->nlayers, 0, (size_t)(layer + 1 - x->nlayers) * sizeof *x->layers);
        x->nlayers = layer + 1;
    }
    layer_set *l = &x->layers[layer];
    if (e >= l->n) {
        l->at = xrealloc(l->at, (size_t)(e + 1) * sizeof *l->at);
        memset(l->at + l->n, 0, (size_t)(e + 1 - l->n) * sizeof *l->at);
        l->n = e + 1;
    }
    return l;
}

int experts_add(experts *x, int layer, int e, const qmat *mats, int nm, char *err, size_t errlen) {
    if (layer < 0 || e < 0 || nm < 1 || nm > EXPERT_MATS || x->cached)
        return errf(err, errlen, "experts_add: bad registration of layer %d expert %d (%d matrices)", layer, e, nm);
    piece pc[2 * EXPERT_MATS];
    int np = 0;
    for (int i = 0; i < nm; i++) {
        const void *ptr[2] = {mats[i].data, scale_ptr(&mats[i])};
        size_t len[2] = {qmat_data_bytes(&mats[i]), qmat_scale_bytes(&mats[i])};
        for (int k = 0; k < 2; k++) {
            if (!len[k]) continue;
            piece *p = &pc[np++];
            *p = (piece){.mat = i, .is_scale = k, .len = len[k]};
            if ((p->shard = st_locate(x->st, ptr[k], len[k], &p->off)) < 0)
                return errf(err, errlen, "layer %d expert %d: matrix %d is not inside the checkpoint's mapping", layer, e, i);
        }
    }
    layer_set *l = layer_get(x, layer, e);
    if (l->at[e]) return errf(err, errlen, "layer %d expert %d registered twice", layer, e);
    entry *en = xcalloc(1, sizeof *en);
    memcpy(en->mapped, mats, (size_t)nm * sizeof *mats);
    en->nm = nm;
    plan(en, pc, np);
    l->at[e] = en;
    x->count++;
    return 0;
}

/* ---- the cache: LRU, reads, eviction --------------------------------------------------------- */

static void lru_unlink(entry *en) {
    if (!en->next) return;
    en->prev->next = en->next;
    en->next->prev = en->prev;
    en->next = en->prev = NULL;
}

static void lru_push(experts *x, entry *en) {
    lru_unlink(en);
    if (en->pinned) return;
    en->prev = x->lru.prev;
    en->next = &x->lru;
    x->lru.prev->next = en;
    x->lru.prev = en;
}

static void drop(experts *x, entry *en) {
    lru_unlink(en);
    free(en->buf);
    en->buf = NULL;
    en->state = ABSENT;
    x->used -= en->bytes;
    x->s.evictions++;
}

/* Evict least recently used entries until `need` more bytes fit. Experts the current call still
 * needs go last, and never when `spare_wanted`. */
static int make_room(experts *x, size_t need, int spare_wanted) {
    for (int pass = 0; pass < (spare_wanted ? 1 : 2) && x->used + need > x->budget; pass++)
        for (entry *en = x->lru.next, *nx; en != &x->lru && x->used + need > x->budget; en = nx) {
            nx = en->next;
            if (!en->busy && (pass || en->want != x->gen)) drop(x, en);
        }
    return x->used + need <= x->budget ? 0 : -1;
}

static int read_at(int fd, unsigned char *dst, size_t len, uint64_t off) {
    while (len) {
        ssize_t r = pread(fd, dst, len, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        dst += r, len -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

/* Read en into a new buffer (lock held on entry and exit, released during the reads). */
static int load(experts *x, entry *en, int by_reader) {
    if (make_room(x, en->bytes, by_reader)) return -1;
    en->state = LOADING;
    x->used += en->bytes;
    pthread_mutex_unlock(&x->mu);
    unsigned char *buf = aligned_alloc(64, (en->bytes + 63) / 64 * 64);
    int rc = buf ? 0 : -1;
    for (int i = 0; !rc && i < en->nspans; i++) {
        const span *sp = &en->spans[i];
        rc = read_at(x->fds[sp->shard], buf + sp->at, sp->len, sp->off);
        /* the buffer is the copy: keep the page cache from holding a second one */
        posix_fadvise(x->fds[sp->shard], (off_t)sp->off, (off_t)sp->len, POSIX_FADV_DONTNEED);
    }
    pthread_mutex_lock(&x->mu);
    x->s.reads += (uint64_t)en->nspans;
    if (rc) {
        free(buf);
        x->used -= en->bytes;
        en->state = ABSENT;
        x->s.read_errors++;
        pthread_cond_broadcast(&x->done);
        return -1;
    }
    for (int i = 0; i < en->nspans; i++) x->s.bytes_read += en->spans[i].len;
    en->buf = buf;
    for (int i = 0; i < en->nm; i++) {
        qmat *c = &en->cached[i];
        *c = en->mapped[i];
        c->data = buf + en->data_at[i];
        if (c->scale_f32) c->scale_f32 = (const float *)(buf + en->scale_at[i]);
        else if (c->scale) c->scale = buf + en->scale_at[i];
    }
    en->state = READY;
    lru_push(x, en);
    pthread_cond_broadcast(&x->done);
    return 0;
}

static void *reader_main(void *arg) {
    experts *x = arg;
    pthread_mutex_lock(&x->mu);
    while (!x->stop) {
        if (!x->qlen) {
            pthread_cond_wait(&x->work, &x->mu);
            continue;
        }
        entry *en = x->queue[x->qhead];
        x->qhead = (x->qhead + 1) % x->qcap;
        x->qlen--;
        if (en->state != QUEUED) continue;
        int ahead = en->ahead;
        if (load(x, en, 1)) {
            if (en->state == QUEUED) en->state = ABSENT;   /* no room: its call reads it itself */
            x->s.dropped++;
            pthread_cond_broadcast(&x->done);
        } else {
            x->s.reader_reads++;
            x->s.predicted_reads += (uint64_t)ahead;
        }
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

static void enqueue(experts *x, entry *en, int ahead) {
    if (x->qlen == x->qcap) return;
    en->state = QUEUED;
    en->ahead = ahead;
    x->queue[(x->qhead + x->qlen++) % x->qcap] = en;
}

/* Forget every queued read: a new call decides what is worth reading. */
static void queue_clear(experts *x) {
    for (; x->qlen; x->qlen--, x->qhead = (x->qhead + 1) % x->qcap) {
        entry *en = x->queue[x->qhead];
        if (en->state == QUEUED) en->state = ABSENT;
    }
}

/* ---- usage counts ------------------------------------------------------------------------------ */

static const char USAGE_MAGIC[8] = "CAIRNXU1";

static void usage_load(experts *x) {
    size_t len;
    char err[256];
    unsigned char *b = (unsigned char *)read_file(x->usage_path, &len, err, sizeof err);
    if (!b) return;   /* first run: nothing saved yet */
    size_t at = 8 + 8 + 4, want = at;
    uint64_t fp = 0;
    uint32_t nl = 0;
    if (len >= at) memcpy(&fp, b + 8, 8), memcpy(&nl, b + 16, 4);
    for (int l = 0; l < x->nlayers; l++) want += 4 + 8 * (size_t)x->layers[l].n;
    if (len != want || memcmp(b, USAGE_MAGIC, 8) || fp != x->fingerprint || nl != (uint32_t)x->nlayers) {
        fprintf(stderr, "cairn: expert usage %s is not of this checkpoint; ignored\n", x->usage_path);
        free(b);
        return;
    }
    for (int l = 0; l < x->nlayers; l++) {
        uint32_t n;
        memcpy(&n, b + at, 4);
        at += 4;
        if (n != (uint32_t)x->layers[l].n) break;
        for (int e = 0; e < x->layers[l].n; e++, at += 8)
            if (x->layers[l].at[e]) memcpy(&x->layers[l].at[e]->uses, b + at, 8);
    }
    free(b);
}

static void usage_save(experts *x) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", x->usage_path);
    FILE *f = fopen(tmp, "wb");
    if (!f) { fprintf(stderr, "cairn: cannot write expert usage %s\n", tmp); return; }
    uint32_t nl = (uint32_t)x->nlayers;
    fwrite(USAGE_MAGIC, 1, 8, f);
    fwrite(&x->fingerprint, 8, 1, f);
    fwrite(&nl, 4, 1, f);
    for (int l = 0; l < x->nlayers; l++) {
        uint32_t n = (uint32_t)x->layers[l].n;
        fwrite(&n, 4, 1, f);
        for (int e = 0; e < x->layers[l].n; e++) {
            uint64_t u = x->layers[l].at[e] ? x->layers[l].at[e]->uses : 0;
            fwrite(&u, 8, 1, f);
        }
    }
    if (fclose(f) || rename(tmp, x->usage_path)) fprintf(stderr, "cairn: cannot write expert usage %s\n", x->usage_path);
}

static int by_uses(const void *a, const void *b) {
    const entry *p = *(entry *const *)a, *q = *(entry *const *)b;
    return p->uses > q->uses ? -1 : p->uses < q->uses;
}

/* Pin the most used experts into at most half the budget (leaving two of the largest free). */
static void pin_most_used(experts *x) {
    entry **all = xmalloc((size_t)x->count * sizeof *all);
    int n = 0;
    for (int l = 0; l < x->nlayers; l++)
        for (int e = 0; e < x->layers[l].n; e++)
            if (x->layers[l].at[e] && x->layers[l].at[e]->uses) all[n++] = x->layers[l].at[e];
    qsort(all, (size_t)n, sizeof *all, by_uses);
    size_t room = MIN(x->budget / 2, x->budget - 2 * x->largest), pinned = 0;
    pthread_mutex_lock(&x->mu);
    for (int i = 0; i < n; i++) {
        if (pinned + all[i]->bytes > room) continue;
        all[i]->pinned = 1;
        if (load(x, all[i], 0)) { all[i]->pinned = 0; continue; }
        pinned += all[i]->bytes;
        x->s.pinned++;
    }
    pthread_mutex_unlock(&x->mu);
    free(all);
}

int experts_cache(experts *x, size_t budget, const char *usage_path, uint64_t fingerprint, char *err, size_t errlen) {
    if (x->cached) return errf(err, errlen, "the expert cache is already configured");
    if (!x->count) return errf(err, errlen, "--expert-cache-mb: this model has no routed experts to cache");
    int big_layer = 0;
    for (int l = 0; l < x->nlayers; l++)
        for (int e = 0; e < x->layers[l].n; e++)
            if (x->layers[l].at[e] && x->layers[l].at[e]->bytes > x->largest) {
                x->largest = x->layers[l].at[e]->bytes;
                big_layer = l;
            }
    if (budget < 2 * x->largest)
        return errf(err, errlen, "--expert-cache-mb: a budget of %zu bytes cannot hold two routed experts: the "
                    "largest (layer %d) is %zu bytes, so at least %.4f MiB", budget, big_layer, x->largest,
                    2 * x->largest / 1048576.0 + 0.00005);
    x->nfds = st_shard_count(x->st);
    x->fds = xmalloc((size_t)x->nfds * sizeof *x->fds);
    for (int i = 0; i < x->nfds; i++) {
        if ((x->fds[i] = open(st_shard_path(x->st, i), O_RDONLY | O_CLOEXEC)) < 0) {
            int e = errno;
            while (i--) close(x->fds[i]);
            free(x->fds);
            x->fds = NULL;
            return errf(err, errlen, "expert cache: cannot open %s: %s", st_shard_path(x->st, i + 1), strerror(e));
        }
        posix_fadvise(x->fds[i], 0, 0, POSIX_FADV_RANDOM);
    }
    int next = -1;
    for (int l = x->nlayers - 1; l >= 0; l--) {
        x->layers[l].next = next;
        x->layers[l].last = xcalloc((size_t)x->layers[l].n + 1, sizeof(int));
        if (x->layers[l].n) next = l;
    }
    x->budget = budget;
    x->fingerprint = fingerprint;
    x->usage_path = usage_path ? xstrdup(usage_path) : NULL;
    x->cached = 1;
    x->s.budget = budget;
    int widest = 1;
    for (int l = 0; l < x->nlayers; l++) widest = MAX(widest, x->layers[l].n);
    x->qcap = 2 * widest;
    x->queue = xmalloc((size_t)x->qcap * sizeof *x->queue);
    if (x->usage_path) {
        usage_load(x);
        pin_most_used(x);
    }
    if (pthread_create(&x->reader, NULL, reader_main, x)) return errf(err, errlen, "expert cache: cannot start the reader thread");
    x->reader_on = 1;
    return 0;
}

/* ---- running a layer's experts --------------------------------------------------------------- */

static void grow(int **p, size_t *cap, size_t n) {
    if (n <= *cap) return;
    *p = xrealloc(*p, n * sizeof **p);
    *cap = n;
}

/* Mark what this call needs, count hits, queue the missing reads in the order they are used,
 * then the next layer's likely experts. list: this rank's experts of the call. Lock held. */
static void plan_reads(experts *x, int layer, const int *list, int nchosen) {
    layer_set *l = &x->layers[layer];
    x->gen++;
    queue_clear(x);
    for (int i = 0; i < nchosen; i++) {
        entry *en = l->at[list[i]];
        en->want = x->gen;
        en->uses++;
        x->s.uses++;
        if (en->state == READY) {
            x->s.hits++;
            x->s.pinned_hits += (uint64_t)en->pinned;
            x->s.predicted_hits += (uint64_t)en->ahead;
        } else {
            x->s.misses++;
            if (en->state == ABSENT) enqueue(x, en, 0);
        }
        en->ahead = 0;
    }
    if (l->next >= 0) {
        layer_set *nl = &x->layers[l->next];
        for (int i = 0; i < nl->nlast; i++) {
            entry *en = nl->at[nl->last[i]];
            if (en->state == ABSENT) {
                enqueue(x, en, 1);
                x->s.predicted++;
            }
        }
    }
    memcpy(l->last, list, (size_t)nchosen * sizeof *l->last);
    l->nlast = nchosen;
    pthread_cond_signal(&x->work);
}

/* The matrices of en for this use: resident, or read now; the mapping if a read failed. */
static const qmat *acquire(experts *x, entry *en) {
    if (en->state == QUEUED || en->state == LOADING) x->s.waits++;
    while (en->state == QUEUED || en->state == LOADING) pthread_cond_wait(&x->done, &x->mu);
    if (en->state == ABSENT) load(x, en, 0);
    en->busy = 1;
    return en->state == READY ? en->cached : en->mapped;
}

static void release(experts *x, entry *en) {
    en->busy = 0;
    en->want = 0;
    if (en->state == READY) lru_push(x, en);
}

static void fatal(const char *err) {
    fprintf(stderr, "cairn: expert parallelism: %s\n", err);
    exit(70);
}

static int owner(const experts *x, int e) { return e % x->ranks; }

/* Run each expert of x->mine (ascending) at layer: `one` gets its matrices, resident or read
 * now when cached, the mapping otherwise. */
typedef void (*run_one)(experts *x, void *arg, int layer, int e, const qmat *w, arena *sc);

typedef struct {
    experts *x;
    int layer;
    run_one one;
    void *arg;
} spread_job;

/* Pool task i: the i-th expert of x->light, whole, on this thread with its thread's scratch
 * (the kernels' own pool calls run serially inside a task, over the same row split: the same
 * bits). Scratch per thread, not per expert: a prefill pass spreads every expert of a layer. */
static void spread_task(void *ctx, int i) {
    const spread_job *j = ctx;
    experts *x = j->x;
    int e = x->light[i];
    j->one(x, j->arg, j->layer, e, x->layers[j->layer].at[e]->mapped, &x->task_sc[pool_worker()]);
}

/* One pool job for the experts of x->light (see experts.h). */
static void spread_light(experts *x, int layer, run_one one, void *arg) {
    int threads = pool_threads();
    if (threads > x->task_sc_cap) {
        x->task_sc = xrealloc(x->task_sc, (size_t)threads * sizeof *x->task_sc);
        memset(x->task_sc + x->task_sc_cap, 0, (size_t)(threads - x->task_sc_cap) * sizeof *x->task_sc);
        x->task_sc_cap = threads;
    }
    spread_job j = {x, layer, one, arg};
    pool_run(x->nlight, spread_task, &j);
    x->s.spread_calls++;
    x->s.spread_experts += (uint64_t)x->nlight;
}

/* Split this call's experts by work (rows): x->heavy gets those with more rows than a thread's
 * share of the call's (each runs alone across the pool, ascending), x->light the rest, most rows
 * first (ties ascending), so the pool's claims hand the big ones out first and the small ones
 * even out the end. Returns whether the light ones spread: mapped (the cache hands experts out
 * one at a time under its lock), a pool to spread them over, and at least two of them. */
static int split_by_work(experts *x, const int *start) {
    int threads = pool_threads(), total = 0;
    x->nheavy = x->nlight = 0;
    for (int i = 0; i < x->nmine; i++) total += start[x->mine[i] + 1] - start[x->mine[i]];
    for (int i = 0; i < x->nmine; i++) {
        int e = x->mine[i], rows = start[e + 1] - start[e], at = x->nlight++;
        if ((long)rows * threads > total) {
            x->nlight--;
            x->heavy[x->nheavy++] = e;
            continue;
        }
        while (at > 0 && start[x->light[at - 1] + 1] - start[x->light[at - 1]] < rows) {
            x->light[at] = x->light[at - 1];
            at--;
        }
        x->light[at] = e;
    }
    return !x->cached && threads > 1 && x->nlight > 1;
}

static void run_mine(experts *x, int layer, run_one one, void *arg) {
    layer_set *l = &x->layers[layer];
    if (!x->cached) {
        for (int i = 0; i < x->nmine; i++) one(x, arg, layer, x->mine[i], l->at[x->mine[i]]->mapped, &x->sc);
        return;
    }
    pthread_mutex_lock(&x->mu);
    plan_reads(x, layer, x->mine, x->nmine);
    for (int i = 0; i < x->nmine; i++) {
        entry *en = l->at[x->mine[i]];
        const qmat *w = acquire(x, en);
        pthread_mutex_unlock(&x->mu);
        one(x, arg, layer, x->mine[i], w, &x->sc);
        pthread_mutex_lock(&x->mu);
        release(x, en);
    }
    pthread_mutex_unlock(&x->mu);
}

/* sc made ready for cnt rows of din in, dout out, weights and the expert function's scratch. */
static arena *scratch_for(experts *x, arena *sc, int layer, int cnt, int din, int dout) {
    size_t need = ((size_t)cnt * ((size_t)din + (size_t)dout + 1)) * sizeof(float) + 3 * 64 +
                  x->scratch(x->ctx, layer, cnt);
    if (need > sc->cap) {
        arena_free(sc);
        if (arena_init(sc, need + need / 2)) fatal("cannot allocate the experts' scratch");
    }
    sc->used = 0;
    return sc;
}

typedef struct {
    const experts_io *io;
    const int *slots, *start;
} local_job;

/* Rank 0's own expert: gather its rows, run it, scatter its outputs. */
static void run_local(experts *x, void *arg, int layer, int e, const qmat *w, arena *a) {
    const local_job *j = arg;
    const experts_io *io = j->io;
    const int *slots = j->slots + j->start[e];
    int cnt = j->start[e + 1] - j->start[e];
    arena *sc = scratch_for(x, a, layer, cnt, io->din, io->dout);
    float *in = arena_take(sc, (size_t)cnt * io->din, sizeof(float));
    float *out = arena_take(sc, (size_t)cnt * io->dout, sizeof(float));
    float *wt = io->weight ? arena_take(sc, (size_t)cnt, sizeof(float)) : NULL;
    for (int r = 0; r < cnt; r++) {
        memcpy(in + (size_t)r * io->din, io->x + (size_t)(slots[r] / io->k) * io->din, (size_t)io->din * sizeof *in);
        if (wt) wt[r] = io->weight[slots[r]];
    }
    x->fn(x->ctx, layer, e, w, in, wt, cnt, out, sc);
    for (int r = 0; r < cnt; r++) {
        int s = slots[r];
        memcpy(io->out + ((size_t)(s / io->k) * io->out_k + (size_t)(s % io->k)) * io->dout, out + (size_t)r * io->dout,
               (size_t)io->dout * sizeof *out);
    }
}

enum { REQ_HEAD = 5 };   /* n, layer, din, dout, has_weight */

static void *msg_room(experts *x, int r, size_t len) {
    if (len > x->msg_cap[r]) {
        x->msg[r] = xrealloc(x->msg[r], len);
        x->msg_cap[r] = len;
    }
    return x->msg[r];
}

/* Pack and send rank r's request for this call: its chosen experts, their rows and weights. */
static void send_request(experts *x, int r, int layer, const experts_io *io, const int *slots, const int *start,
                         int nchosen, int *rows_out) {
    int n = 0, rows = 0;
    for (int i = 0; i < nchosen; i++)
        if (owner(x, x->chosen[i]) == r) n++, rows += start[x->chosen[i] + 1] - start[x->chosen[i]];
    *rows_out = rows;
    if (!n) return;
    size_t len = (REQ_HEAD + 2 * (size_t)n) * sizeof(int32_t) +
                 (size_t)rows * ((size_t)io->din + (io->weight != NULL)) * sizeof(float);
    char *m = msg_room(x, r, len);
    int32_t *h = (int32_t *)m, *pair = h + REQ_HEAD;
    h[0] = n, h[1] = layer, h[2] = io->din, h[3] = io->dout, h[4] = io->weight != NULL;
    float *in = (float *)(pair + 2 * n), *wt = in + (size_t)rows * io->din;
    for (int i = 0; i < nchosen; i++) {
        int e = x->chosen[i];
        if (owner(x, e) != r) continue;
        *pair++ = e;
        *pair++ = start[e + 1] - start[e];
        for (int t = start[e]; t < start[e + 1]; t++) {
            memcpy(in, io->x + (size_t)(slots[t] / io->k) * io->din, (size_t)io->din * sizeof *in);
            in += io->din;
            if (io->weight) *wt++ = io->weight[slots[t]];
        }
    }
    char err[256];
    if (cluster_send(r, CLUSTER_EXPERTS, m, len, err, sizeof err)) fatal(err);
    x->s.remote_experts += (uint64_t)n;
    x->s.remote_rows += (uint64_t)rows;
    x->s.bytes_sent += len;
    x->s.messages++;
}

/* Receive rank r's outputs and put each row in its slot. */
static void take_reply(experts *x, int r, const experts_io *io, const int *slots, const int *start, int nchosen,
                       int rows) {
    char err[256];
    int tag;
    long len = cluster_recv(r, &tag, &x->msg[r], &x->msg_cap[r], err, sizeof err);
    if (len < 0) fatal(err);
    if (tag != CLUSTER_OUTPUT || (size_t)len != (size_t)rows * io->dout * sizeof(float)) {
        snprintf(err, sizeof err, "rank %d answered %ld bytes (tag %d) for %d rows of %d", r, len, tag, rows, io->dout);
        fatal(err);
    }
    x->s.bytes_received += (uint64_t)len;
    x->s.messages++;
    const float *y = x->msg[r];
    for (int i = 0; i < nchosen; i++) {
        int e = x->chosen[i];
        if (owner(x, e) != r) continue;
        for (int t = start[e]; t < start[e + 1]; t++, y += io->dout) {
            int s = slots[t];
            memcpy(io->out + ((size_t)(s / io->k) * io->out_k + (size_t)(s % io->k)) * io->dout, y,
                   (size_t)io->dout * sizeof *y);
        }
    }
}

void experts_run(experts *x, int layer, const int *idx, int nk, const experts_io *io) {
    const double t0 = now_seconds();
    layer_set *l = &x->layers[layer];
    int E = l->n;
    grow(&x->slots, &x->slots_cap, (size_t)nk);
    grow(&x->start, &x->start_cap, (size_t)E + 1);
    grow(&x->chosen, &x->chosen_cap, (size_t)E);
    grow(&x->fill, &x->fill_cap, (size_t)E);
    grow(&x->mine, &x->mine_cap, (size_t)E);
    grow(&x->heavy, &x->heavy_cap, (size_t)E);
    grow(&x->light, &x->light_cap, (size_t)E);
    /* counting sort of the slots by expert: ascending experts, ascending slots within each */
    memset(x->start, 0, ((size_t)E + 1) * sizeof *x->start);
    for (int t = 0; t < nk; t++)
        if (idx[t] >= 0 && idx[t] < E && l->at[idx[t]]) x->start[idx[t] + 1]++;
    int nchosen = 0;
    x->nmine = 0;
    for (int e = 0; e < E; e++) {
        if (x->start[e + 1]) {
            x->chosen[nchosen++] = e;
            if (owner(x, e) == 0) x->mine[x->nmine++] = e;
        }
        x->start[e + 1] += x->start[e];
    }
    x->s.layer_calls++;
    x->s.chosen += (uint64_t)nchosen;
    memcpy(x->fill, x->start, (size_t)E * sizeof *x->fill);
    for (int t = 0; t < nk; t++)
        if (idx[t] >= 0 && idx[t] < E && l->at[idx[t]]) x->slots[x->fill[idx[t]]++] = t;
    for (int r = 1; r < x->ranks; r++) send_request(x, r, layer, io, x->slots, x->start, nchosen, &x->rows_of[r]);
    local_job j = {io, x->slots, x->start};
    if (split_by_work(x, x->start)) {
        for (int i = 0; i < x->nheavy; i++)
            run_local(x, &j, layer, x->heavy[i], x->layers[layer].at[x->heavy[i]]->mapped, &x->sc);
        spread_light(x, layer, run_local, &j);
    } else {
        run_mine(x, layer, run_local, &j);
    }
    for (int r = 1; r < x->ranks; r++)
        if (x->rows_of[r]) take_reply(x, r, io, x->slots, x->start, nchosen, x->rows_of[r]);
    x->s.seconds += now_seconds() - t0;
}

/* ---- the other ranks: answering requests ----------------------------------------------------- */

typedef struct {
    const int32_t *pair;
    const float *in, *wt;
    float *out;
    int din, dout, at;    /* at: rows of the request before the current expert */
} serve_job;

/* Experts come in the request's (ascending) order, so each one's rows follow the previous one's. */
static void run_served(experts *x, void *arg, int layer, int e, const qmat *w, arena *a) {
    serve_job *j = arg;
    int cnt = j->pair[1];
    j->pair += 2;
    arena *sc = scratch_for(x, a, layer, cnt, 0, 0);
    x->fn(x->ctx, layer, e, w, j->in + (size_t)j->at * j->din, j->wt ? j->wt + j->at : NULL, cnt,
          j->out + (size_t)j->at * j->dout, sc);
    j->at += cnt;
    x->s.served_experts++;
    x->s.served_rows += (uint64_t)cnt;
}

/* Check a request against this registry and point the job at its parts; the reply's size. */
static long parse_request(experts *x, const char *m, long len, serve_job *j, int *layer, char *err, size_t errlen) {
    if (len < (long)(REQ_HEAD * sizeof(int32_t))) return errf(err, errlen, "a request of %ld bytes has no header", len);
    const int32_t *h = (const int32_t *)m;
    int n = h[0], rows = 0;
    *layer = h[1];
    if (n < 1 || *layer < 0 || *layer >= x->nlayers || h[2] < 1 || h[3] < 1 || (h[4] != 0 && h[4] != 1) ||
        len < (long)((REQ_HEAD + 2 * (size_t)n) * sizeof(int32_t)))
        return errf(err, errlen, "a malformed request (%d experts at layer %d)", n, *layer);
    layer_set *l = &x->layers[*layer];
    const int32_t *pair = h + REQ_HEAD;
    grow(&x->mine, &x->mine_cap, (size_t)n);
    for (int i = 0; i < n; i++) {
        int e = pair[2 * i], cnt = pair[2 * i + 1];
        if (e < 0 || e >= l->n || !l->at[e] || owner(x, e) != x->rank || cnt < 1 || (i && e <= pair[2 * i - 2]))
            return errf(err, errlen, "a request for layer %d expert %d, which this rank does not hold", *layer, e);
        x->mine[i] = e;
        rows += cnt;
    }
    x->nmine = n;
    size_t want = (REQ_HEAD + 2 * (size_t)n) * sizeof(int32_t) + (size_t)rows * ((size_t)h[2] + (size_t)h[4]) * sizeof(float);
    if ((size_t)len != want) return errf(err, errlen, "a request of %ld bytes where its header says %zu", len, want);
    j->pair = pair;
    j->din = h[2];
    j->dout = h[3];
    j->in = (const float *)(pair + 2 * n);
    j->wt = h[4] ? j->in + (size_t)rows * j->din : NULL;
    j->at = 0;
    return (long)((size_t)rows * (size_t)j->dout * sizeof(float));
}

int experts_serve(experts *x, char *err, size_t errlen) {
    void *req = NULL, *reply = NULL;
    size_t req_cap = 0, reply_cap = 0;
    int rc = 0;
    for (;;) {
        int tag, layer = 0;
        long len = cluster_recv(0, &tag, &req, &req_cap, err, errlen);
        if (len < 0 || tag == CLUSTER_STOP) {
            rc = len < 0 ? -1 : 0;
            break;
        }
        serve_job j;
        long out = tag == CLUSTER_EXPERTS ? parse_request(x, req, len, &j, &layer, err, errlen)
                                          : errf(err, errlen, "a message with tag %d", tag);
        if (out < 0) { rc = -1; break; }
        if ((size_t)out > reply_cap) reply = xrealloc(reply, reply_cap = (size_t)out);
        j.out = reply;
        run_mine(x, layer, run_served, &j);
        x->s.served_requests++;
        if (cluster_send(0, CLUSTER_OUTPUT, reply, (size_t)out, err, errlen)) { rc = -1; break; }
    }
    free(req);
    free(reply);
    return rc;
}

/* ---- reports and teardown ------------------------------------------------------------------- */

void experts_get_stats(const experts *x, experts_stats *out) {
    pthread_mutex_lock((pthread_mutex_t *)&x->mu);
    *out = x->s;
    out->resident = x->used;
    pthread_mutex_unlock((pthread_mutex_t *)&x->mu);
}

void experts_stats_line(const experts *x, char *buf, size_t len) {
    experts_stats s;
    experts_get_stats(x, &s);
    snprintf(buf, len,
             "expert-cache: budget_bytes=%zu resident_bytes=%zu uses=%llu hits=%llu hit_rate=%.4f pinned=%llu "
             "pinned_hits=%llu predicted_hits=%llu misses=%llu waits=%llu reader_reads=%llu predicted=%llu "
             "predicted_reads=%llu dropped=%llu evictions=%llu reads=%llu bytes_read=%llu read_errors=%llu",
             s.budget, s.resident, (unsigned long long)s.uses, (unsigned long long)s.hits,
             s.uses ? (double)s.hits / (double)s.uses : 0.0, (unsigned long long)s.pinned,
             (unsigned long long)s.pinned_hits, (unsigned long long)s.predicted_hits, (unsigned long long)s.misses,
             (unsigned long long)s.waits, (unsigned long long)s.reader_reads, (unsigned long long)s.predicted,
             (unsigned long long)s.predicted_reads, (unsigned long long)s.dropped, (unsigned long long)s.evictions,
             (unsigned long long)s.reads, (unsigned long long)s.bytes_read, (unsigned long long)s.read_errors);
}

void experts_parallel_line(const experts *x, char *buf, size_t len) {
    experts_stats s;
    experts_get_stats(x, &s);
    if (x->rank == 0)
        snprintf(buf, len, "expert-parallel: ranks=%d remote_experts=%llu remote_rows=%llu bytes_sent=%llu "
                 "bytes_received=%llu messages=%llu", x->ranks, (unsigned long long)s.remote_experts,
                 (unsigned long long)s.remote_rows, (unsigned long long)s.bytes_sent,
                 (unsigned long long)s.bytes_received, (unsigned long long)s.messages);
    else
        snprintf(buf, len, "expert-parallel: rank=%d of %d served_requests=%llu served_experts=%llu served_rows=%llu",
                 x->rank, x->ranks, (unsigned long long)s.served_requests, (unsigned long long)s.served_experts,
                 (unsigned long long)s.served_rows);
}

void experts_free(experts *x) {
    if (!x) return;
    if (x->reader_on) {
        pthread_mutex_lock(&x->mu);
        x->stop = 1;
        pthread_cond_signal(&x->work);
        pthread_mutex_unlock(&x->mu);
        pthread_join(x->reader, NULL);
    }
    if (x->usage_path) usage_save(x);
    for (int l = 0; l < x->nlayers; l++) {
        for (int e = 0; e < x->layers[l].n; e++)
            if (x->layers[l].at[e]) {
                free(x->layers[l].at[e]->buf);
                free(x->layers[l].at[e]);
            }
        free(x->layers[l].at);
        free(x->layers[l].last);
    }
    for (int i = 0; i < x->nfds; i++) close(x->fds[i]);
    free(x->fds);
    free(x->layers);
    free(x->slots);
    free(x->start);
    free(x->chosen);
    free(x->fill);
    free(x->mine);
    free(x->heavy);
    free(x->light);
    for (int r = 0; r < x->ranks; r++) free(x->msg[r]);
    free(x->msg);
    free(x->msg_cap);
    free(x->rows_of);
    arena_free(&x->sc);
    for (int i = 0; i < x->task_sc_cap; i++) arena_free(&x->task_sc[i]);
    free(x->task_sc);
    free(x->queue);
    free(x->usage_path);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->work);
    pthread_cond_destroy(&x->done);
    free(x);
}
