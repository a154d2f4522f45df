/* state.c — the generic sequence state: parts, record, truncate rules and snapshots.
 * See state.h for the model of parts and the invariants this file keeps. */
#include "state.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"

/* ---- lifecycle ------------------------------------------------------------------------ */

int state_init(state *s, int cap) {
    memset(s, 0, sizeof *s);
    s->cap = cap;
    s->ids = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *s->ids);
    s->record_ok = s->ids != NULL;
    return s->record_ok ? STATE_OK : STATE_ENOMEM;
}

void state_deinit(state *s) {
    state_capture_disarm(s);
    for (int i = 0; i < s->nparts; i++) free(s->parts[i].buf);
    free(s->parts);
    free(s->ids);
    memset(s, 0, sizeof *s);
}

static size_t part_capacity_bytes(const state_part *p) {
    return p->kind == PART_RECUR ? p->row_bytes : p->row_bytes * (size_t)p->rows;
}

static void recur_fill(state_part *p) {
    if (p->fill == 0.0f) { memset(p->buf, 0, p->row_bytes); return; }
    float *f = (float *)p->buf;
    for (size_t i = 0; i < p->row_bytes / sizeof(float); i++) f[i] = p->fill;
}

void *state_add_part(state *s, part_kind kind, const char *name, size_t row_bytes, int rows, int span,
                     float fill) {
    if (kind == PART_RECUR) rows = 1;
    if (rows <= 0 || row_bytes == 0 || span <= 0) return NULL;
    if (row_bytes > SIZE_MAX / (size_t)rows) return NULL;
    state_part p = {.kind = kind, .row_bytes = row_bytes, .rows = rows, .span = span, .fill = fill};
    snprintf(p.name, sizeof p.name, "%s", name);
    if (!(p.buf = calloc(1, part_capacity_bytes(&p)))) return NULL;
    if (kind == PART_RECUR) recur_fill(&p);
    state_part *grown = realloc(s->parts, (size_t)(s->nparts + 1) * sizeof *grown);
    if (!grown) { free(p.buf); return NULL; }
    s->parts = grown;
    s->parts[s->nparts++] = p;
    return p.buf;
}

/* ---- record and taint ----------------------------------------------------------------- */

void state_reset(state *s) {
    state_capture_disarm(s);
    s->len = 0;
    s->tainted = 0;
    for (int i = 0; i < s->nparts; i++)
        if (s->parts[i].kind == PART_RECUR) recur_fill(&s->parts[i]);
}

/* len doubles as the position the next feed starts at, so it advances even when the ids cannot be
 * kept (no record memory, or an out-of-order write): the family stays consistent, reuse is off. */
void state_record(state *s, const int *ids, int pos0, int n) {
    if (n <= 0) return;
    if (pos0 != s->len || pos0 + n > s->cap) {
        s->tainted = 1;
        s->len = MIN(pos0 + n, s->cap);
        return;
    }
    if (s->record_ok) memcpy(s->ids + pos0, ids, (size_t)n * sizeof *ids);
    s->len = pos0 + n;
}

void state_taint(state *s) { s->tainted = 1; }

int state_usable(const state *s) { return s->record_ok && !s->tainted; }

int state_common_prefix(const state *s, const int *ids, int n) {
    if (!state_usable(s)) return 0;
    int k = 0, lim = MIN(s->len, n);
    while (k < lim && s->ids[k] == ids[k]) k++;
    return k;
}

/* ---- truncation ----------------------------------------------------------------------- */

/* ROWS drop rows freely (rows past the record are never read). A RING can give back positions
 * only while no slot was overwritten, i.e. len <= window; after a wrap the slots of the positions
 * just before p hold later positions. A RECUR summary cannot forget tokens at all. */
static int part_can_truncate(const state_part *p, int len, int to) {
    if (to == len) return 1;
    switch (p->kind) {
    case PART_ROWS: return 1;
    case PART_RING: return len <= p->rows;
    case PART_RECUR: return 0;
    }
    return 0;
}

int state_can_truncate(const state *s, int p) {
    if (p < 0 || p > s->len || !state_usable(s)) return 0;
    for (int i = 0; i < s->nparts; i++)
        if (!part_can_truncate(&s->parts[i], s->len, p)) return 0;
    return 1;
}

int state_always_truncatable(const state *s) {
    for (int i = 0; i < s->nparts; i++) {
        const state_part *pt = &s->parts[i];
        /* a ring as long as the context never wraps, so it truncates like rows */
        if (pt->kind == PART_RECUR || (pt->kind == PART_RING && pt->rows < s->cap)) return 0;
    }
    return 1;
}

int state_truncate(state *s, int p) {
    if (!state_can_truncate(s, p)) return STATE_EUNSUPPORTED;
    state_capture_disarm(s);
    s->len = p;
    return STATE_OK;
}

/* ---- snapshots -------------------------------------------------------------------------
 * One malloc'ed blob, so a snapshot can be stored, copied and written as bytes:
 *   head | ids[len] (padded to 8) | part_bytes[nparts] (uint64) | part data, in part order.
 * A part left out (ROWS in a light snapshot) has part_bytes 0. The layout hash names the
 * shape of every part, so a blob from another model or context size is refused on restore. */

typedef struct {
    uint64_t layout;       /* layout_hash of the state it came from */
    uint64_t bytes;        /* whole blob */
    int32_t len;           /* positions covered = record length */
    int32_t nparts;
    int32_t with_rows;
    int32_t pad;
} snap_head;

struct snapshot {
    snap_head h;
};

static uint64_t layout_hash(const state *s) {
    uint64_t h = fnv64(FNV64_INIT, &s->nparts, sizeof s->nparts);
    for (int i = 0; i < s->nparts; i++) {
        const state_part *p = &s->parts[i];
        int32_t kind = p->kind, rows = p->rows, span = p->span;
        uint64_t rb = p->row_bytes;
        h = fnv64(h, &kind, sizeof kind);
        h = fnv64(h, p->name, strnlen(p->name, sizeof p->name));
        h = fnv64(h, &rb, sizeof rb);
        h = fnv64(h, &rows, sizeof rows);
        h = fnv64(h, &span, sizeof span);
    }
    return h;
}

uint64_t state_layout_hash(const state *s) { return layout_hash(s); }

/* Bytes of part p a snapshot of `len` positions carries. ROWS keep the rows that positions
 * 0..len-1 touch (a partially filled compressed row included); a RING keeps the slots written so
 * far (all of them once wrapped); RECUR keeps its whole summary. */
static size_t part_snap_bytes(const state_part *p, int len, int with_rows) {
    switch (p->kind) {
    case PART_ROWS:
        if (!with_rows) return 0;
        return (size_t)MIN((len + p->span - 1) / p->span, p->rows) * p->row_bytes;
    case PART_RING: return (size_t)MIN(len, p->rows) * p->row_bytes;
    case PART_RECUR: return p->row_bytes;
    }
    return 0;
}

static size_t ids_area(int len) { return ((size_t)len * sizeof(int32_t) + 7) & ~(size_t)7; }

static int32_t *blob_ids(const snapshot *snap) { return (int32_t *)((char *)snap + sizeof(snap_head)); }

static uint64_t *blob_table(const snapshot *snap) {
    return (uint64_t *)((char *)blob_ids(snap) + ids_area(snap->h.len));
}

static unsigned char *blob_data(const snapshot *snap) {
    return (unsigned char *)(blob_table(snap) + snap->h.nparts);
}

/* A blob for `len` positions with its head and part table filled in; ids and data left zero. */
static snapshot *blob_alloc(const state *s, int len, int with_rows) {
    size_t bytes = sizeof(snap_head) + ids_area(len) + (size_t)s->nparts * sizeof(uint64_t);
    for (int i = 0; i < s->nparts; i++) bytes += part_snap_bytes(&s->parts[i], len, with_rows);
    snapshot *snap = calloc(1, bytes);
    if (!snap) return NULL;
    snap->h = (snap_head){.layout = layout_hash(s), .bytes = bytes, .len = len, .nparts = s->nparts,
                          .with_rows = with_rows ? 1 : 0};
    uint64_t *table = blob_table(snap);
    for (int i = 0; i < s->nparts; i++) table[i] = part_snap_bytes(&s->parts[i], len, with_rows);
    return snap;
}

/* Where part i's bytes start in the blob. */
static unsigned char *blob_part(const snapshot *snap, int i) {
    const uint64_t *table = blob_table(snap);
    unsigned char *d = blob_data(snap);
    for (int j = 0; j < i; j++) d += table[j];
    return d;
}

static void blob_copy_part(snapshot *snap, const state *s, int i) {
    memcpy(blob_part(snap, i), s->parts[i].buf, blob_table(snap)[i]);
}

snapshot *state_snapshot(const state *s, int with_rows) {
    if (!state_usable(s)) return NULL;
    snapshot *snap = blob_alloc(s, s->len, with_rows);
    if (!snap) return NULL;
    int32_t *ids = blob_ids(snap);
    for (int i = 0; i < s->len; i++) ids[i] = s->ids[i];
    for (int i = 0; i < s->nparts; i++) blob_copy_part(snap, s, i);
    return snap;
}

/* Does snap fit s exactly: same part layout, each part's byte count what this shape implies? */
static int snapshot_fits(const state *s, const snapshot *snap) {
    if (snap->h.layout != layout_hash(s) || snap->h.nparts != s->nparts) return 0;
    if (snap->h.len < 0 || snap->h.len > s->cap) return 0;
    const uint64_t *table = blob_table(snap);
    for (int i = 0; i < s->nparts; i++)
        if (table[i] != part_snap_bytes(&s->parts[i], snap->h.len, snap->h.with_rows)) return 0;
    return 1;
}

/* A light snapshot has no rows of its own: they must already be in s, which holds exactly when
 * s's record starts with the snapshot's ids (rows are a function of the ids before them). */
static int record_holds(const state *s, const snapshot *snap) {
    if (!state_usable(s) || s->len < snap->h.len) return 0;
    const int32_t *ids = blob_ids(snap);
    for (int i = 0; i < snap->h.len; i++)
        if (s->ids[i] != ids[i]) return 0;
    return 1;
}

int state_restore(state *s, const snapshot *snap) {
    if (!snapshot_fits(s, snap)) return STATE_EMISMATCH;
    if (!snap->h.with_rows && !record_holds(s, snap)) return STATE_EMISMATCH;
    if (!s->record_ok) return STATE_ENOMEM;
    const int32_t *ids = blob_ids(snap);
    for (int i = 0; i < snap->h.len; i++) s->ids[i] = ids[i];
    const uint64_t *table = blob_table(snap);
    const unsigned char *d = blob_data(snap);
    for (int i = 0; i < s->nparts; i++) {
        memcpy(s->parts[i].buf, d, table[i]);
        d += table[i];
    }
    state_capture_disarm(s);
    s->len = snap->h.len;
    s->tainted = 0;
    return STATE_OK;
}

void snapshot_free(snapshot *snap) { free(snap); }
int snapshot_len(const snapshot *snap) { return snap->h.len; }
const int *snapshot_ids(const snapshot *snap) { return (const int *)blob_ids(snap); }
int snapshot_has_rows(const snapshot *snap) { return snap->h.with_rows; }
size_t snapshot_bytes(const snapshot *snap) { return snap->h.bytes; }

/* ---- captures ------------------------------------------------------------------------
 * An armed capture owns a light blob for its position from the start; the hook fills one part at
 * a time, at the moment that part still holds the state of exactly `pos` tokens. */

static void capture_free(state_capture_slot *c) {
    snapshot_free(c->snap);
    free(c->done);
}

/* Remove capture k, keeping the others packed at the front. */
static void capture_remove(state *s, int k) {
    s->captures[k] = s->captures[--s->ncaptures];
}

static int capture_find(const state *s, int p) {
    for (int k = 0; k < s->ncaptures; k++)
        if (s->captures[k].pos == p) return k;
    return -1;
}

int state_capture_arm(state *s, int p) {
    if (capture_find(s, p) >= 0) return STATE_OK;
    if (!state_usable(s) || p < s->len || p > s->cap || s->ncaptures == STATE_MAX_CAPTURES)
        return STATE_EUNSUPPORTED;
    state_capture_slot c = {.pos = p, .snap = blob_alloc(s, p, 0), .done = malloc((size_t)MAX(s->nparts, 1))};
    if (!c.snap || !c.done) {
        capture_free(&c);
        return STATE_ENOMEM;
    }
    for (int i = 0; i < s->nparts; i++) {
        c.done[i] = s->parts[i].kind == PART_ROWS;
        c.missing += !c.done[i];
    }
    s->captures[s->ncaptures++] = c;
    return STATE_OK;
}

void state_capture(state *s, int part, int pos) {
    if (!s->ncaptures) return;
    for (int k = 0; k < s->ncaptures; k++) {
        state_capture_slot *c = &s->captures[k];
        if (c->pos != pos || c->done[part]) continue;
        blob_copy_part(c->snap, s, part);
        c->done[part] = 1;
        c->missing--;
    }
}

int state_capture_next(const state *s, int pos) {
    int next = INT_MAX;
    for (int k = 0; k < s->ncaptures; k++)
        if (s->captures[k].pos > pos && s->captures[k].pos < next) next = s->captures[k].pos;
    return next;
}

snapshot *state_capture_take(state *s, int p) {
    int k = capture_find(s, p);
    if (k < 0) return NULL;
    state_capture_slot c = s->captures[k];
    capture_remove(s, k);
    /* len == p: the feed stopped right at p, so the parts not written since hold p's state */
    snapshot *snap = NULL;
    if (state_usable(s) && s->len >= p) {
        for (int i = 0; s->len == p && i < s->nparts; i++) {
            if (c.done[i]) continue;
            blob_copy_part(c.snap, s, i);
            c.missing--;
        }
        if (c.missing == 0) {
            int32_t *ids = blob_ids(c.snap);
            for (int i = 0; i < p; i++) ids[i] = s->ids[i];
            snap = c.snap, c.snap = NULL;
        }
    }
    capture_free(&c);
    return snap;
}

void state_capture_disarm(state *s) {
    s->rewind_n = 0;
    while (s->ncaptures) {
        capture_free(&s->captures[0]);
        capture_remove(s, 0);
    }
}

/* ---- rewinds -------------------------------------------------------------------------- */

static void rewind_drop(state *s, int keep) {
    for (int i = 1; i <= s->rewind_n; i++)
        if (s->rewind_base + i != keep) snapshot_free(state_capture_take(s, s->rewind_base + i));
    s->rewind_n = 0;
}

int state_rewind_arm(state *s, int n) {
    rewind_drop(s, -1);
    if (state_always_truncatable(s)) return n;
    s->rewind_base = s->len;
    while (s->rewind_n < n && state_capture_arm(s, s->len + s->rewind_n + 1) == STATE_OK) s->rewind_n++;
    return s->rewind_n;
}

int state_rewind(state *s, int p) {
    int armed = p > s->rewind_base && p <= s->rewind_base + s->rewind_n;
    rewind_drop(s, armed ? p : -1);
    if (p == s->len || state_truncate(s, p) == STATE_OK) {
        if (armed) snapshot_free(state_capture_take(s, p));
        return STATE_OK;
    }
    snapshot *snap = armed ? state_capture_take(s, p) : NULL;
    int rc = snap ? state_restore(s, snap) : STATE_EUNSUPPORTED;
    snapshot_free(snap);
    return rc;
}

/* ---- persistence -----------------------------------------------------------------------
 * File = file_head followed by the blob. The record length sits at the end of the header and is
 * written last, after the blob is flushed: a write torn anywhere leaves it at LEN_UNSET, which
 * reads as "no snapshot". Integers are stored in host byte order (files are a local cache). */

#define SNAP_MAGIC "CAIRNKV\0"
#define SNAP_VERSION 1u
#define LEN_UNSET 0xffffffffu

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t pad;
    uint64_t fingerprint;   /* model checkpoint (st_fingerprint) */
    uint64_t layout;        /* part layout the blob was taken from */
    uint64_t bytes;         /* blob size */
    uint64_t checksum;      /* fnv64 of the blob */
    uint32_t len;           /* record length; written last */
    uint32_t pad2;
} file_head;

int snapshot_write(const snapshot *snap, uint64_t model_fingerprint, FILE *f, char *err, size_t errlen) {
    long start = ftell(f);
    if (start < 0) return errf(err, errlen, "snapshot file is not seekable");
    file_head fh = {.version = SNAP_VERSION, .fingerprint = model_fingerprint, .layout = snap->h.layout,
                    .bytes = snap->h.bytes, .checksum = fnv64(FNV64_INIT, snap, snap->h.bytes), .len = LEN_UNSET};
    memcpy(fh.magic, SNAP_MAGIC, sizeof fh.magic);
    uint32_t len = (uint32_t)snap->h.len;
    if (fwrite(&fh, sizeof fh, 1, f) != 1 || fwrite(snap, snap->h.bytes, 1, f) != 1 || fflush(f))
        return errf(err, errlen, "writing snapshot: short write");
    if (fseek(f, start + (long)offsetof(file_head, len), SEEK_SET) || fwrite(&len, sizeof len, 1, f) != 1 ||
        fflush(f) || fseek(f, 0, SEEK_END))
        return errf(err, errlen, "writing snapshot: cannot write the record length");
    return 0;
}

/* Structural check of a blob read from disk, before anything indexes into it. */
static int blob_consistent(const snapshot *snap, uint64_t bytes) {
    const snap_head *h = &snap->h;
    if (h->bytes != bytes || h->len < 0 || h->nparts < 0 || h->nparts > 4096) return 0;
    uint64_t fixed = sizeof(snap_head) + ids_area(h->len) + (uint64_t)h->nparts * sizeof(uint64_t);
    if (fixed > bytes) return 0;
    uint64_t sum = fixed;
    const uint64_t *table = blob_table(snap);
    for (int i = 0; i < h->nparts; i++) {
        if (table[i] > bytes) return 0;
        sum += table[i];
    }
    return sum == bytes;
}

static long remaining_bytes(FILE *f) {
    long here = ftell(f);
    if (here < 0 || fseek(f, 0, SEEK_END)) return -1;
    long end = ftell(f);
    if (fseek(f, here, SEEK_SET)) return -1;
    return end - here;
}

snapshot *snapshot_read(FILE *f, uint64_t model_fingerprint, char *err, size_t errlen) {
    file_head fh;
    if (fread(&fh, sizeof fh, 1, f) != 1) { errf(err, errlen, "snapshot file truncated (no header)"); return NULL; }
    if (memcmp(fh.magic, SNAP_MAGIC, sizeof fh.magic)) { errf(err, errlen, "not a cairn snapshot (bad magic)"); return NULL; }
    if (fh.version != SNAP_VERSION) { errf(err, errlen, "snapshot version %u, expected %u", fh.version, SNAP_VERSION); return NULL; }
    if (fh.fingerprint != model_fingerprint) { errf(err, errlen, "snapshot is from another model (fingerprint differs)"); return NULL; }
    if (fh.len == LEN_UNSET) { errf(err, errlen, "snapshot write was never completed (no record length)"); return NULL; }
    long left = remaining_bytes(f);
    if (left < 0 || fh.bytes < sizeof(snap_head) || fh.bytes > (uint64_t)left) {
        errf(err, errlen, "snapshot file truncated (%llu payload bytes announced, %ld present)",
             (unsigned long long)fh.bytes, left);
        return NULL;
    }
    snapshot *snap = malloc(fh.bytes);
    if (!snap) { errf(err, errlen, "out of memory reading a %llu-byte snapshot", (unsigned long long)fh.bytes); return NULL; }
    const char *why = NULL;
    if (fread(snap, fh.bytes, 1, f) != 1) why = "snapshot file truncated (short payload)";
    else if (fnv64(FNV64_INIT, snap, fh.bytes) != fh.checksum) why = "snapshot payload checksum mismatch (corrupt)";
    else if (!blob_consistent(snap, fh.bytes) || snap->h.layout != fh.layout || (uint32_t)snap->h.len != fh.len)
        why = "snapshot payload is inconsistent with its header (corrupt)";
    if (why) {
        errf(err, errlen, "%s", why);
        free(snap);
        return NULL;
    }
    return snap;
}

/* ---- sizes ---------------------------------------------------------------------------- */

size_t state_bytes_per_token(const state *s) {
    size_t b = 0;
    for (int i = 0; i < s->nparts; i++)
        if (s->parts[i].kind == PART_ROWS) b += s->parts[i].row_bytes / (size_t)s->parts[i].span;
    return b;
}

size_t state_fixed_bytes(const state *s) {
    size_t b = 0;
    for (int i = 0; i < s->nparts; i++)
        if (s->parts[i].kind != PART_ROWS) b += part_capacity_bytes(&s->parts[i]);
    return b;
}
