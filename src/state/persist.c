/* persist.c — append-only slot files for --kv-dir (format and invariants in persist.h). */
#include "persist.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/util.h"

#define ROWS_MAGIC "CAIRNRW\0"
#define TAIL_MAGIC "CAIRNTL\0"
#define PERSIST_VERSION 1u

/* Both files open with it. Integers are in host byte order: the files are a local cache. */
typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t pad;
    uint64_t fingerprint;   /* model checkpoint (st_fingerprint) */
    uint64_t layout;        /* state_layout_hash */
} file_ident;

/* The last thing a save writes to the rows file. */
typedef struct {
    uint64_t count;         /* records committed */
    uint64_t chain;         /* chain value of record count-1; the seed when count = 0 */
} rows_commit;

typedef struct {
    file_ident ident;
    uint64_t len;           /* positions the tail belongs to */
    uint64_t chain;         /* rows chain value at len-1 */
    uint64_t bytes;         /* payload that follows */
    uint64_t checksum;      /* fnv64 of the fields above, then of the payload */
} tail_head;

#define COMMIT_AT ((off_t)sizeof(file_ident))
#define ROWS_HEAD ((off_t)(sizeof(file_ident) + sizeof(rows_commit)))
#define RECORD_FIXED ((off_t)(sizeof(int32_t) + sizeof(uint64_t)))

/* ---- where things are ------------------------------------------------------------------ */

/* Rows of ROWS part p completed by positions 0..pos-1 (rows past capacity are never kept). */
static int rows_done(const state_part *p, int pos) { return MIN(pos / p->span, p->rows); }

static off_t record_offset(const state *s, int pos) {
    off_t off = ROWS_HEAD + (off_t)pos * RECORD_FIXED;
    for (int i = 0; i < s->nparts; i++)
        if (s->parts[i].kind == PART_ROWS) off += (off_t)rows_done(&s->parts[i], pos) * (off_t)s->parts[i].row_bytes;
    return off;
}

/* The row of p that position pos completes, NULL if it completes none. */
static unsigned char *row_completed_at(const state_part *p, int pos) {
    if (p->kind != PART_ROWS || (pos + 1) % p->span) return NULL;
    int r = (pos + 1) / p->span - 1;
    return r < p->rows ? p->buf + (size_t)r * p->row_bytes : NULL;
}

/* Bytes of p that no record holds at length len: the partly filled row of a span-r part, the
 * ring slots written so far, a recurrent summary. */
static size_t tail_part_bytes(const state_part *p, int len) {
    switch (p->kind) {
    case PART_ROWS: return len % p->span && len / p->span < p->rows ? p->row_bytes : 0;
    case PART_RING: return (size_t)MIN(len, p->rows) * p->row_bytes;
    case PART_RECUR: return p->row_bytes;
    }
    return 0;
}

static unsigned char *tail_part_data(const state_part *p, int len) {
    return p->kind == PART_ROWS ? p->buf + (size_t)(len / p->span) * p->row_bytes : p->buf;
}

static size_t tail_bytes(const state *s, int len) {
    size_t b = 0;
    for (int i = 0; i < s->nparts; i++) b += tail_part_bytes(&s->parts[i], len);
    return b;
}

static file_ident ident_of(const char *magic, uint64_t fingerprint, uint64_t layout) {
    file_ident id = {.version = PERSIST_VERSION, .fingerprint = fingerprint, .layout = layout};
    memcpy(id.magic, magic, sizeof id.magic);
    return id;
}

static int check_ident(const file_ident *got, const file_ident *want, char *why, size_t n) {
    if (memcmp(got->magic, want->magic, sizeof got->magic)) return errf(why, n, "not a cairn slot file (bad magic)");
    if (got->version != want->version) return errf(why, n, "format version %u, expected %u", got->version, want->version);
    if (got->fingerprint != want->fingerprint) return errf(why, n, "written by another model (fingerprint differs)");
    if (got->layout != want->layout) return errf(why, n, "written for another state shape (context size or layout)");
    if (memcmp(got, want, sizeof *got)) return errf(why, n, "header is corrupt");
    return 0;
}

/* ---- what this process knows about each slot's rows file -------------------------------- */

typedef struct {
    char path[4096];        /* the rows file */
    uint64_t fingerprint, layout;
    uint64_t seed;          /* chain value before record 0: hash of the file's ident */
    dev_t dev;              /* the file as this module last left it */
    ino_t ino;
    off_t size;
    int count;              /* records committed */
    int alloc;
    int32_t *ids;           /* ids[0..count) of the records */
    uint64_t *chain;        /* chain values stored in them */
    int tail_len;           /* length of the tail file on disk; -1: none, or not known to match */
    uint64_t tail_chain;
} slot_file;

static slot_file **known;
static int nknown;

static void slot_file_free(slot_file *sf) {
    if (!sf) return;
    free(sf->ids);
    free(sf->chain);
    free(sf);
}

static slot_file *slot_file_new(const char *path, uint64_t fingerprint, uint64_t layout) {
    slot_file *sf = calloc(1, sizeof *sf);
    if (!sf) return NULL;
    snprintf(sf->path, sizeof sf->path, "%s", path);
    sf->fingerprint = fingerprint;
    sf->layout = layout;
    file_ident id = ident_of(ROWS_MAGIC, fingerprint, layout);
    sf->seed = fnv64(FNV64_INIT, &id, sizeof id);
    sf->tail_len = -1;
    return sf;
}

static int slot_file_reserve(slot_file *sf, int n) {
    if (n <= sf->alloc) return 0;
    int32_t *ids = realloc(sf->ids, (size_t)n * sizeof *ids);
    if (ids) sf->ids = ids;
    uint64_t *chain = ids ? realloc(sf->chain, (size_t)n * sizeof *chain) : NULL;
    if (!chain) return -1;
    sf->chain = chain;
    sf->alloc = n;
    return 0;
}

static void slot_file_note(slot_file *sf, int fd) {
    struct stat st;
    if (fstat(fd, &st)) { sf->ino = 0; sf->size = -1; return; }
    sf->dev = st.st_dev;
    sf->ino = st.st_ino;
    sf->size = st.st_size;
}

/* Replace slot's entry (NULL forgets it). -1 if the table cannot grow; sf is then not taken. */
static int slot_set(int slot, slot_file *sf) {
    if (slot >= nknown) {
        if (!sf) return 0;
        slot_file **grown = realloc(known, (size_t)(slot + 1) * sizeof *grown);
        if (!grown) return -1;
        memset(grown + nknown, 0, (size_t)(slot + 1 - nknown) * sizeof *grown);
        known = grown;
        nknown = slot + 1;
    }
    slot_file_free(known[slot]);
    known[slot] = sf;
    return 0;
}

/* slot's entry if it describes exactly the file open on fd, else NULL. */
static slot_file *slot_trusted(int slot, const char *path, uint64_t fingerprint, uint64_t layout, int fd) {
    slot_file *sf = slot < nknown ? known[slot] : NULL;
    struct stat st;
    if (!sf || strcmp(sf->path, path) || sf->fingerprint != fingerprint || sf->layout != layout || fstat(fd, &st))
        return NULL;
    return st.st_dev == sf->dev && st.st_ino == sf->ino && st.st_size == sf->size ? sf : NULL;
}

void persist_forget(void) {
    for (int i = 0; i < nknown; i++) slot_file_free(known[i]);
    free(known);
    known = NULL;
    nknown = 0;
}

/* ---- saving ----------------------------------------------------------------------------- */

static void slot_paths(const char *dir, int slot, char *rows, char *tail, size_t cap) {
    snprintf(rows, cap, "%s/slot-%d.cairnkv", dir, slot);
    snprintf(tail, cap, "%s/slot-%d.cairnkv.tail", dir, slot);
}

/* A renamed or created entry is durable once its directory is synced. Best effort: a lost entry
 * only costs warmth, which load already copes with. */
static void sync_dir(const char *dir) {
    fault_point();
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return;
    (void)fsync(fd);
    close(fd);
}

static int remove_file(const char *path, char *err, size_t errlen) {
    fault_point();
    if (unlink(path) && errno != ENOENT) return errf(err, errlen, "cannot remove %s: %s", path, strerror(errno));
    return 0;
}

static int write_at(int fd, const void *data, size_t n, off_t off) {
    fault_point();
    return pwrite(fd, data, n, off) == (ssize_t)n ? 0 : -1;
}

/* Point the commit at `count` records, which must already be durable. */
static int commit_rows(FILE *f, slot_file *sf, int count, char *err, size_t errlen) {
    rows_commit c = {.count = (uint64_t)count, .chain = count ? sf->chain[count - 1] : sf->seed};
    if (write_at(fileno(f), &c, sizeof c, COMMIT_AT) || (fault_point(), fdatasync(fileno(f))))
        return errf(err, errlen, "%s: cannot write the commit: %s", sf->path, strerror(errno));
    sf->count = count;
    return 0;
}

/* Empty the rows file to a header with nothing committed. */
static int start_rows(FILE *f, slot_file *sf, char *err, size_t errlen) {
    file_ident id = ident_of(ROWS_MAGIC, sf->fingerprint, sf->layout);
    if ((fault_point(), ftruncate(fileno(f), 0)) || write_at(fileno(f), &id, sizeof id, 0))
        return errf(err, errlen, "%s: cannot write the header: %s", sf->path, strerror(errno));
    return commit_rows(f, sf, 0, err, errlen);
}

static int append_records(FILE *f, slot_file *sf, const state *s, int from, char *err, size_t errlen) {
    if (slot_file_reserve(sf, s->len)) return errf(err, errlen, "out of memory for the record of %s", sf->path);
    if (fseeko(f, record_offset(s, from), SEEK_SET)) return errf(err, errlen, "%s: cannot seek: %s", sf->path, strerror(errno));
    uint64_t chain = from ? sf->chain[from - 1] : sf->seed;
    for (int pos = from; pos < s->len; pos++) {
        int32_t id = s->ids[pos];
        chain = fnv64(chain, &id, sizeof id);
        int ok = fwrite(&id, sizeof id, 1, f) == 1;
        for (int i = 0; i < s->nparts && ok; i++) {
            const unsigned char *row = row_completed_at(&s->parts[i], pos);
            if (!row) continue;
            chain = fnv64(chain, row, s->parts[i].row_bytes);
            ok = fwrite(row, s->parts[i].row_bytes, 1, f) == 1;
        }
        if (!ok || fwrite(&chain, sizeof chain, 1, f) != 1)
            return errf(err, errlen, "%s: short write at position %d: %s", sf->path, pos, strerror(errno));
        sf->ids[pos] = id;
        sf->chain[pos] = chain;
        if (pos == from + (s->len - from) / 2) {   /* cut with half the records flushed */
            fault_point();
            if (fflush(f)) return errf(err, errlen, "%s: cannot flush records: %s", sf->path, strerror(errno));
        }
    }
    if ((fault_point(), fflush(f)) || (fault_point(), fdatasync(fileno(f)))) return errf(err, errlen, "%s: cannot flush records: %s", sf->path, strerror(errno));
    return commit_rows(f, sf, s->len, err, errlen);
}

/* Bring the rows file from sf's count records to s's record: drop the commit to the common
 * prefix first (durably, so no overwritten record is ever covered by a commit), cut anything
 * past it, append the rest. */
static int update_rows(FILE *f, slot_file *sf, const state *s, char *err, size_t errlen) {
    int k = 0, lim = MIN(sf->count, s->len);
    while (k < lim && sf->ids[k] == s->ids[k]) k++;
    if (k < sf->count && commit_rows(f, sf, k, err, errlen)) return -1;
    off_t end = record_offset(s, k);
    if (sf->size != end && (fault_point(), ftruncate(fileno(f), end))) return errf(err, errlen, "%s: cannot truncate: %s", sf->path, strerror(errno));
    sf->size = end;
    return k < s->len ? append_records(f, sf, s, k, err, errlen) : 0;
}

static uint64_t tail_checksum(const tail_head *h, const unsigned char *payload) {
    return fnv64(fnv64(FNV64_INIT, h, offsetof(tail_head, checksum)), payload, h->bytes);
}

/* Write path anew through path.tmp (mode 0600): write(f, ctx), flush, fsync, rename over path.
 * The caller syncs the directory. A failure leaves path as it was. */
static int replace_file(const char *path, int (*write)(FILE *f, void *ctx, char *err, size_t errlen), void *ctx,
                        char *err, size_t errlen) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int tfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FILE *f = tfd >= 0 ? fdopen(tfd, "wb") : NULL;
    if (!f && tfd >= 0) close(tfd);
    if (!f) return errf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    int rc = write(f, ctx, err, errlen);
    if (rc == 0 && ((fault_point(), fflush(f)) || (fault_point(), fsync(fileno(f)))))
        rc = errf(err, errlen, "writing %s: %s", tmp, strerror(errno));
    if (fclose(f) && rc == 0) rc = errf(err, errlen, "closing %s: %s", tmp, strerror(errno));
    if (rc == 0 && (fault_point(), rename(tmp, path))) rc = errf(err, errlen, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    return rc;
}

typedef struct {
    const tail_head *h;
    const void *payload;
    size_t bytes;
} tail_job;

static int write_tail(FILE *f, void *ctx, char *err, size_t errlen) {
    const tail_job *j = ctx;
    if (fwrite(j->h, sizeof *j->h, 1, f) != 1 || (fault_point(), fflush(f)) || fwrite(j->payload, j->bytes, 1, f) != 1)
        return errf(err, errlen, "writing a tail file: %s", strerror(errno));
    return 0;
}

/* Rewrite the tail file for s (a temporary file renamed over it), or remove it when the layout
 * needs none at this length. Runs after the rows up to s->len are committed. */
static int save_tail(slot_file *sf, const state *s, const char *dir, const char *path, char *err, size_t errlen) {
    size_t bytes = tail_bytes(s, s->len);
    uint64_t chain = sf->chain[s->len - 1];
    if (bytes == 0) {
        sf->tail_len = -1;
        return remove_file(path, err, errlen);
    }
    if (sf->tail_len == s->len && sf->tail_chain == chain) return 0;
    unsigned char *payload = malloc(bytes);
    if (!payload) return errf(err, errlen, "out of memory for the tail of %s", sf->path);
    size_t at = 0;
    for (int i = 0; i < s->nparts; i++) {
        size_t n = tail_part_bytes(&s->parts[i], s->len);
        if (n) memcpy(payload + at, tail_part_data(&s->parts[i], s->len), n);
        at += n;
    }
    tail_head h = {.ident = ident_of(TAIL_MAGIC, sf->fingerprint, sf->layout), .len = (uint64_t)s->len,
                   .chain = chain, .bytes = bytes};
    h.checksum = tail_checksum(&h, payload);
    tail_job j = {&h, payload, bytes};
    int rc = replace_file(path, write_tail, &j, err, errlen);
    free(payload);
    if (rc) return rc;
    sync_dir(dir);
    sf->tail_len = s->len;
    sf->tail_chain = chain;
    return 0;
}

/* The rows file, opened for update and created if missing (without truncating it). */
static FILE *open_rows(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);   /* conversations: owner only */
    FILE *f = fd >= 0 ? fdopen(fd, "r+b") : NULL;
    if (!f) {
        errf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
    }
    return f;
}

int persist_save(const char *dir, int slot, const state *s, uint64_t fingerprint, char *err, size_t errlen) {
    char rows_path[4096], tail_path[4096];
    if (slot < 0) return errf(err, errlen, "bad slot %d", slot);
    slot_paths(dir, slot, rows_path, tail_path, sizeof rows_path);
    if (!state_usable(s) || s->len == 0) {
        slot_set(slot, NULL);
        if (remove_file(tail_path, err, errlen)) return -1;
        return remove_file(rows_path, err, errlen);
    }
    uint64_t layout = state_layout_hash(s);
    FILE *f = open_rows(rows_path, err, errlen);
    if (!f) return -1;
    slot_file *sf = slot_trusted(slot, rows_path, fingerprint, layout, fileno(f));
    int rc = 0;
    if (!sf) {
        /* a file this process did not leave: rewrite it whole, and never pair it with an old tail */
        sf = slot_file_new(rows_path, fingerprint, layout);
        if (!sf || slot_set(slot, sf)) {
            slot_file_free(sf);
            rc = errf(err, errlen, "out of memory for %s", rows_path);
        } else if ((rc = remove_file(tail_path, err, errlen)) == 0 && (rc = start_rows(f, sf, err, errlen)) == 0) {
            sync_dir(dir);
            sf->size = ROWS_HEAD;
        }
    }
    if (rc == 0) rc = update_rows(f, sf, s, err, errlen);
    if (rc == 0) slot_file_note(sf, fileno(f));
    if (fclose(f) && rc == 0) rc = errf(err, errlen, "closing %s: %s", rows_path, strerror(errno));
    if (rc == 0) rc = save_tail(sf, s, dir, tail_path, err, errlen);
    if (rc) slot_set(slot, NULL);   /* after a failure, what we remember may not be what is on disk */
    return rc;
}

/* ---- loading ---------------------------------------------------------------------------- */

/* Stream the committed records into s's ids and rows (all past s's empty record, so garbage
 * until load commits), checking the chain at every record. sf gets their ids and chain. */
static int read_rows(FILE *f, slot_file *sf, state *s, char *why, size_t n) {
    file_ident got, want = ident_of(ROWS_MAGIC, sf->fingerprint, sf->layout);
    rows_commit c;
    if (fread(&got, sizeof got, 1, f) != 1 || fread(&c, sizeof c, 1, f) != 1) return errf(why, n, "truncated (no header)");
    if (check_ident(&got, &want, why, n)) return -1;
    if (c.count > (uint64_t)s->cap)
        return errf(why, n, "holds %llu positions, more than this context (%d)", (unsigned long long)c.count, s->cap);
    int count = (int)c.count;
    if (slot_file_reserve(sf, count)) return errf(why, n, "out of memory for a %d-position record", count);
    uint64_t chain = sf->seed;
    for (int pos = 0; pos < count; pos++) {
        int32_t id;
        uint64_t stored;
        int ok = fread(&id, sizeof id, 1, f) == 1;
        chain = fnv64(chain, &id, sizeof id);
        for (int i = 0; i < s->nparts && ok; i++) {
            unsigned char *row = row_completed_at(&s->parts[i], pos);
            if (!row) continue;
            ok = fread(row, s->parts[i].row_bytes, 1, f) == 1;
            chain = fnv64(chain, row, s->parts[i].row_bytes);
        }
        if (!ok || fread(&stored, sizeof stored, 1, f) != 1)
            return errf(why, n, "truncated (%d positions committed, the file ends in record %d)", count, pos);
        if (stored != chain) return errf(why, n, "checksum mismatch at position %d (corrupt)", pos);
        if (id < 0) return errf(why, n, "token id %d at position %d is out of range (corrupt)", id, pos);
        s->ids[pos] = id;
        sf->ids[pos] = id;
        sf->chain[pos] = chain;
    }
    if (chain != c.chain) return errf(why, n, "commit checksum does not match its last record (corrupt)");
    sf->count = count;
    return 0;
}

typedef struct {
    int len;
    uint64_t chain;
    unsigned char *payload;
} tail;

static int read_tail(const char *path, const slot_file *sf, const state *s, tail *t, char *why, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return errf(why, n, "no tail file for its ring/recurrent parts");
        return errf(why, n, "cannot open %s: %s", path, strerror(errno));
    }
    tail_head h;
    file_ident want = ident_of(TAIL_MAGIC, sf->fingerprint, sf->layout);
    char bad[200];
    int rc = 0;
    if (fread(&h, sizeof h, 1, f) != 1) rc = errf(why, n, "tail file truncated (no header)");
    else if (check_ident(&h.ident, &want, bad, sizeof bad)) rc = errf(why, n, "tail file %s", bad);
    else if (h.len == 0 || h.len > (uint64_t)s->cap || h.bytes != tail_bytes(s, (int)h.len))
        rc = errf(why, n, "tail file header is inconsistent (corrupt)");
    else if (!(t->payload = malloc(h.bytes))) rc = errf(why, n, "out of memory for a %llu-byte tail", (unsigned long long)h.bytes);
    else if (fread(t->payload, h.bytes, 1, f) != 1) rc = errf(why, n, "tail file truncated");
    else if (fgetc(f) != EOF) rc = errf(why, n, "tail file has trailing bytes (corrupt)");
    else if (tail_checksum(&h, t->payload) != h.checksum) rc = errf(why, n, "tail file checksum mismatch (corrupt)");
    fclose(f);
    if (rc == 0) {
        t->len = (int)h.len;
        t->chain = h.chain;
    }
    return rc;
}

/* The length s resumes at: all of the rows when the layout needs no tail there, else the tail's
 * length, if the tail belongs to these rows. -1 with a reason otherwise. */
static int resume_length(const char *tail_path, const slot_file *sf, const state *s, tail *t, char *why, size_t n) {
    if (tail_bytes(s, sf->count) == 0) return sf->count;
    if (read_tail(tail_path, sf, s, t, why, n)) return -1;
    if (t->len > sf->count || sf->chain[t->len - 1] != t->chain)
        return errf(why, n, "tail file belongs to another history of this slot (tail %d positions, rows %d)", t->len,
                    sf->count);
    return t->len;
}

static void apply_tail(state *s, const tail *t) {
    size_t at = 0;
    for (int i = 0; i < s->nparts; i++) {
        size_t n = tail_part_bytes(&s->parts[i], t->len);
        if (n) memcpy(tail_part_data(&s->parts[i], t->len), t->payload + at, n);
        at += n;
    }
}

int persist_load(const char *dir, int slot, state *s, uint64_t fingerprint, char *err, size_t errlen) {
    char rows_path[4096], tail_path[4096];
    if (slot < 0) return errf(err, errlen, "bad slot %d", slot);
    slot_paths(dir, slot, rows_path, tail_path, sizeof rows_path);
    FILE *f = fopen(rows_path, "rb");
    if (!f) {
        if (errno == ENOENT) return 0;
        return errf(err, errlen, "cannot open %s: %s", rows_path, strerror(errno));
    }
    char why[256];
    tail t = {.len = 0};
    slot_file *sf = slot_file_new(rows_path, fingerprint, state_layout_hash(s));
    int len = -1;
    if (!sf) errf(why, sizeof why, "out of memory");
    else if (s->len != 0 || !s->record_ok) errf(why, sizeof why, "the slot's state is not empty (or has no record)");
    else if (read_rows(f, sf, s, why, sizeof why) == 0)
        len = sf->count ? resume_length(tail_path, sf, s, &t, why, sizeof why) : 0;
    if (len > 0) {
        if (t.payload) apply_tail(s, &t);
        s->len = len;
        s->tainted = 0;
        sf->tail_len = t.payload ? t.len : -1;
        sf->tail_chain = t.chain;
        slot_file_note(sf, fileno(f));
        if (slot_set(slot, sf)) slot_file_free(sf);   /* loaded, just not remembered: the next save rewrites */
    } else {
        slot_file_free(sf);
    }
    free(t.payload);
    fclose(f);
    if (len < 0) return errf(err, errlen, "%s: %s", rows_path, why);
    return len > 0;
}

/* ---- checkpoints beside a slot -------------------------------------------------------------- */

static const char CKPT_MAGIC[8] = "CAIRNCK1";

static void ckpt_path(const char *dir, int slot, char *path, size_t cap) {
    snprintf(path, cap, "%s/slot-%d.cairnkv.ckpt", dir, slot);
}

typedef struct {
    const snapshot **snaps;
    int n;
    uint64_t fingerprint;
} ckpt_job;

static int write_ckpts(FILE *f, void *ctx, char *err, size_t errlen) {
    const ckpt_job *j = ctx;
    uint32_t n = (uint32_t)j->n;
    if (fwrite(CKPT_MAGIC, sizeof CKPT_MAGIC, 1, f) != 1 || fwrite(&n, sizeof n, 1, f) != 1)
        return errf(err, errlen, "writing a checkpoint file: %s", strerror(errno));
    for (int i = 0; i < j->n; i++) {
        fault_point();
        if (snapshot_write(j->snaps[i], j->fingerprint, f, err, errlen)) return -1;
    }
    return 0;
}

int persist_save_checkpoints(const char *dir, int slot, const store *cs, const state *s, uint64_t fingerprint,
                             char *err, size_t errlen) {
    char path[4096];
    if (slot < 0) return errf(err, errlen, "bad slot %d", slot);
    ckpt_path(dir, slot, path, sizeof path);
    const snapshot *snaps[PERSIST_CHECKPOINTS];
    int n = cs && state_usable(s) ? store_owned(cs, slot, s, snaps, PERSIST_CHECKPOINTS) : 0;
    if (!n) return remove_file(path, err, errlen);
    ckpt_job j = {snaps, n, fingerprint};
    if (replace_file(path, write_ckpts, &j, err, errlen)) return -1;
    sync_dir(dir);
    return 0;
}

int persist_load_checkpoints(const char *dir, int slot, store *cs, const state *s, uint64_t fingerprint, char *err,
                             size_t errlen) {
    char path[4096];
    if (slot < 0) return errf(err, errlen, "bad slot %d", slot);
    ckpt_path(dir, slot, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT ? 0 : errf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    char magic[sizeof CKPT_MAGIC], why[256] = "";
    uint32_t n = 0;
    snapshot *snaps[PERSIST_CHECKPOINTS];
    int got = 0;
    if (fread(magic, sizeof magic, 1, f) != 1 || fread(&n, sizeof n, 1, f) != 1 || memcmp(magic, CKPT_MAGIC, sizeof magic))
        errf(why, sizeof why, "not a checkpoint file (bad magic or truncated)");
    else if (n < 1 || n > PERSIST_CHECKPOINTS)
        errf(why, sizeof why, "announces %u checkpoints (1..%d)", n, PERSIST_CHECKPOINTS);
    /* every checkpoint is checked by snapshot_read (fingerprint, layout, checksum) and must be one
     * the resumed record holds; one bad one refuses the file, so nothing of a mix is kept */
    while (!why[0] && got < (int)n) {
        char e2[200];
        snapshot *snap = snapshot_read(f, fingerprint, e2, sizeof e2);
        if (!snap) errf(why, sizeof why, "checkpoint %d: %s", got, e2);
        else if (snapshot_has_rows(snap) || snapshot_len(snap) > s->len ||
                 memcmp(snapshot_ids(snap), s->ids, (size_t)snapshot_len(snap) * sizeof(int))) {
            snapshot_free(snap);
            errf(why, sizeof why, "checkpoint %d is not of the resumed record", got);
        } else {
            snaps[got++] = snap;
        }
    }
    if (!why[0] && fgetc(f) != EOF) errf(why, sizeof why, "trailing bytes after %u checkpoints", n);
    fclose(f);
    if (why[0]) {
        while (got--) snapshot_free(snaps[got]);
        return errf(err, errlen, "%s: %s", path, why);
    }
    int kept = 0;
    for (int i = 0; i < got; i++) kept += store_put(cs, snaps[i], slot);
    return kept;
}
