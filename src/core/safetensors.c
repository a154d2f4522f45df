/* safetensors.c — mmap a checkpoint directory and validate every tensor entry before use.
 *
 * A shard is: 8-byte little-endian header length N, N bytes of JSON, then the data section.
 * Each JSON entry names dtype, shape and data_offsets relative to the data section. We trust
 * none of it: every number is range-checked before it becomes a pointer, so a hostile or
 * truncated file yields an error naming the tensor and file instead of an out-of-bounds read.
 */
#include "safetensors.h"

#include "util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A header is metadata only; even 69k tensors need a few MB. Anything past this is corrupt. */
#define ST_MAX_HEADER (100u << 20)
/* cJSON numbers are doubles: integers above 2^53 are not exact, so they are rejected. */
#define ST_MAX_EXACT_INT 9007199254740992.0

typedef struct {
    char *path;
    const unsigned char *map;   /* whole file, read-only */
    size_t size;
    size_t header_len;          /* JSON bytes after the 8-byte length */
} st_shard;

struct st_file {
    char *dir;
    st_shard *shards;
    int nshards;
    st_tensor *tensors;
    int ntensors, cap;
    int *slots;                 /* open-addressing table of tensor indices, -1 = empty */
    size_t nslots;              /* power of two, at least twice ntensors */
    uint64_t fingerprint;
};

static const char *dtype_names[DT_COUNT] = {
    [DT_BF16] = "BF16", [DT_F16] = "F16", [DT_F32] = "F32", [DT_F8_E4M3] = "F8_E4M3",
    [DT_F8_E8M0] = "F8_E8M0", [DT_I8] = "I8", [DT_U8] = "U8", [DT_I32] = "I32", [DT_I64] = "I64",
};
static const size_t dtype_sizes[DT_COUNT] = {
    [DT_BF16] = 2, [DT_F16] = 2, [DT_F32] = 4, [DT_F8_E4M3] = 1, [DT_F8_E8M0] = 1,
    [DT_I8] = 1, [DT_U8] = 1, [DT_I32] = 4, [DT_I64] = 8,
};

const char *dtype_name(dtype t) { return (unsigned)t < DT_COUNT ? dtype_names[t] : "?"; }
size_t dtype_size(dtype t) { return (unsigned)t < DT_COUNT ? dtype_sizes[t] : 0; }

static int dtype_parse(const char *s, dtype *out) {
    for (int t = 0; t < DT_COUNT; t++)
        if (strcmp(s, dtype_names[t]) == 0) { *out = (dtype)t; return 0; }
    return -1;
}

/* ---- progress bar ------------------------------------------------------------------------ */

static int progress_wanted(int progress) {
    if (!progress) return 0;
    const char *env = getenv("CAIRN_PROGRESS");
    return isatty(STDERR_FILENO) || (env && strcmp(env, "1") == 0);
}

static void progress_draw(int done, int total) {
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    int fill = total ? (int)((long)done * WIDTH / total) : WIDTH;
    for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '=' : ' ';
    bar[WIDTH] = 0;
    fprintf(stderr, "\rloading %d/%d shards [%s]", done, total, bar);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

/* ---- name lookup ------------------------------------------------------------------------- */

static uint64_t name_hash(const char *name) { return fnv64(FNV64_INIT, name, strlen(name)); }

/* Builds the table over all tensors; a second tensor of the same name is an error naming both files. */
static int index_build(st_file *f, char *err, size_t errlen) {
    f->nslots = 16;
    while (f->nslots < 2 * (size_t)f->ntensors) f->nslots *= 2;
    f->slots = xmalloc(f->nslots * sizeof *f->slots);
    for (size_t i = 0; i < f->nslots; i++) f->slots[i] = -1;
    for (int i = 0; i < f->ntensors; i++) {
        const st_tensor *t = &f->tensors[i];
        size_t s = name_hash(t->name) & (f->nslots - 1);
        for (; f->slots[s] >= 0; s = (s + 1) & (f->nslots - 1)) {
            const st_tensor *o = &f->tensors[f->slots[s]];
            if (strcmp(o->name, t->name) == 0)
                return errf(err, errlen, "duplicate tensor %s: in %s and in %s", t->name, o->file, t->file);
        }
        f->slots[s] = i;
    }
    return 0;
}

const st_tensor *st_find(const st_file *f, const char *name) {
    if (!f->slots) return NULL;
    for (size_t s = name_hash(name) & (f->nslots - 1); f->slots[s] >= 0; s = (s + 1) & (f->nslots - 1))
        if (strcmp(f->tensors[f->slots[s]].name, name) == 0) return &f->tensors[f->slots[s]];
    return NULL;
}

/* ---- header entries ---------------------------------------------------------------------- */

/* A JSON number that is an exact non-negative integer below 2^53. */
static int json_uint(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0) || d > ST_MAX_EXACT_INT || d != floor(d)) return -1;
    *out = (int64_t)d;
    return 0;
}

static int entry_shape(const cJSON *shape, st_tensor *t, int64_t *numel, char *err, size_t errlen) {
    if (!cJSON_IsArray(shape))
        return errf(err, errlen, "tensor %s in %s: shape is not an array", t->name, t->file);
    int n = cJSON_GetArraySize(shape);
    if (n > ST_MAX_DIMS)
        return errf(err, errlen, "tensor %s in %s: too many dims (%d > %d)", t->name, t->file, n, ST_MAX_DIMS);
    t->ndim = n;
    *numel = 1;
    int i = 0;
    for (const cJSON *d = shape->child; d; d = d->next, i++) {
        int64_t v;
        if (json_uint(d, &v))
            return errf(err, errlen, "tensor %s in %s: dim %d is not a non-negative integer", t->name, t->file, i);
        if (v && *numel > INT64_MAX / v)
            return errf(err, errlen, "tensor %s in %s: numel overflows", t->name, t->file);
        t->shape[i] = v;
        *numel *= v;
    }
    return 0;
}

static int entry_offsets(const cJSON *offs, int64_t *begin, int64_t *end, const st_tensor *t, char *err,
                         size_t errlen) {
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || json_uint(offs->child, begin) ||
        json_uint(offs->child->next, end))
        return errf(err, errlen, "tensor %s in %s: data_offsets must be 2 non-negative integers", t->name, t->file);
    if (*begin > *end)
        return errf(err, errlen, "tensor %s in %s: data_offsets begin %lld > end %lld", t->name, t->file,
                    (long long)*begin, (long long)*end);
    return 0;
}

/* Parses one header entry into t (name already set), checking it against the shard's data section. */
static int entry_parse(const cJSON *e, const st_shard *sh, st_tensor *t, char *err, size_t errlen) {
    if (!cJSON_IsObject(e)) return errf(err, errlen, "tensor %s in %s: entry is not an object", t->name, t->file);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!dt) return errf(err, errlen, "tensor %s in %s: missing dtype", t->name, t->file);
    if (!shape) return errf(err, errlen, "tensor %s in %s: missing shape", t->name, t->file);
    if (!offs) return errf(err, errlen, "tensor %s in %s: missing data_offsets", t->name, t->file);
    if (!cJSON_IsString(dt)) return errf(err, errlen, "tensor %s in %s: dtype is not a string", t->name, t->file);
    if (dtype_parse(dt->valuestring, &t->type))
        return errf(err, errlen, "tensor %s in %s: unknown dtype '%s'", t->name, t->file, dt->valuestring);
    int64_t numel = 0, begin = 0, end = 0;
    if (entry_shape(shape, t, &numel, err, errlen)) return -1;
    if (entry_offsets(offs, &begin, &end, t, err, errlen)) return -1;
    size_t data_len = sh->size - 8 - sh->header_len;
    if ((uint64_t)end > data_len)
        return errf(err, errlen, "tensor %s in %s: data_offsets end %lld beyond data section (%zu bytes)",
                    t->name, t->file, (long long)end, data_len);
    size_t esize = dtype_sizes[t->type];
    if ((uint64_t)numel > SIZE_MAX / esize || (uint64_t)(end - begin) != (uint64_t)numel * esize)
        return errf(err, errlen, "tensor %s in %s: %lld bytes stored but shape x %s needs %lld x %zu",
                    t->name, t->file, (long long)(end - begin), dtype_names[t->type], (long long)numel, esize);
    t->data = sh->map + 8 + sh->header_len + begin;
    t->nbytes = (size_t)(end - begin);
    return 0;
}

static int by_data(const void *a, const void *b) {
    const st_tensor *x = a, *y = b;
    const char *p = x->data, *q = y->data;
    return p < q ? -1 : p > q;
}

/* Tensors of one shard must not share bytes. Sorting a copy by start makes this one linear pass. */
static int check_overlap(const st_tensor *ts, int n, char *err, size_t errlen) {
    if (n < 2) return 0;
    st_tensor *sorted = xmalloc((size_t)n * sizeof *sorted);
    memcpy(sorted, ts, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, by_data);
    int rc = 0;
    for (int i = 1; i < n && !rc; i++) {
        const st_tensor *a = &sorted[i - 1], *b = &sorted[i];
        if (a->nbytes && b->nbytes && (const char *)a->data + a->nbytes > (const char *)b->data)
            rc = errf(err, errlen, "tensors %s and %s in %s overlap", a->name, b->name, a->file);
    }
    free(sorted);
    return rc;
}

/* ---- shards ------------------------------------------------------------------------------ */

static int shard_map(st_shard *sh, char *err, size_t errlen) {
    int fd = open(sh->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errf(err, errlen, "cannot open %s: %s", sh->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return errf(err, errlen, "%s is not a regular file", sh->path);
    }
    if (st.st_size < 8) {
        close(fd);
        return errf(err, errlen, "%s: file shorter than 8 bytes (%lld)", sh->path, (long long)st.st_size);
    }
    sh->size = (size_t)st.st_size;
    void *m = mmap(NULL, sh->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return errf(err, errlen, "cannot mmap %s: %s", sh->path, strerror(errno));
    sh->map = m;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | sh->map[i];
    if (hlen > ST_MAX_HEADER)
        return errf(err, errlen, "%s: header length %llu is absurd (limit %u)", sh->path, (unsigned long long)hlen,
                    ST_MAX_HEADER);
    if (hlen > sh->size - 8)
        return errf(err, errlen, "%s: header length %llu exceeds file size %zu", sh->path,
                    (unsigned long long)hlen, sh->size);
    sh->header_len = (size_t)hlen;
    return 0;
}

static st_tensor *tensor_push(st_file *f) {
    if (f->ntensors == f->cap) {
        f->cap = f->cap ? f->cap * 2 : 1024;
        f->tensors = xrealloc(f->tensors, (size_t)f->cap * sizeof *f->tensors);
    }
    st_tensor *t = &f->tensors[f->ntensors++];
    memset(t, 0, sizeof *t);
    return t;
}

/* Maps the shard, parses its header and appends its tensors to f. */
static int shard_load(st_file *f, st_shard *sh, char *err, size_t errlen) {
    if (shard_map(sh, err, errlen)) return -1;
    const char *json = (const char *)sh->map + 8;
    cJSON *hdr = cJSON_ParseWithLength(json, sh->header_len);
    if (!hdr) return errf(err, errlen, "%s: header is not valid JSON", sh->path);
    if (!cJSON_IsObject(hdr)) {
        cJSON_Delete(hdr);
        return errf(err, errlen, "%s: header is not a JSON object", sh->path);
    }
    int first = f->ntensors, rc = 0;
    for (const cJSON *e = hdr->child; e && !rc; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        st_tensor *t = tensor_push(f);
        t->name = xstrdup(e->string);
        t->file = sh->path;
        rc = entry_parse(e, sh, t, err, errlen);
    }
    cJSON_Delete(hdr);
    if (rc) return -1;
    if (f->ntensors == first) return 0;     /* no tensors (f->tensors may still be NULL) */
    return check_overlap(f->tensors + first, f->ntensors - first, err, errlen);
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int add_shard(st_file *f, const char *name) {
    f->shards = xrealloc(f->shards, (size_t)(f->nshards + 1) * sizeof *f->shards);
    st_shard *sh = &f->shards[f->nshards++];
    memset(sh, 0, sizeof *sh);
    sh->path = path_join(f->dir, name);
    return f->nshards - 1;
}

static int shard_find(const st_file *f, const char *name) {
    size_t dl = strlen(f->dir);
    for (int i = 0; i < f->nshards; i++)
        if (strcmp(f->shards[i].path + dl + 1, name) == 0) return i;
    return -1;
}

static int is_shard_name(const char *s) {
    size_t n = strlen(s), k = strlen(".safetensors");
    return n > k && strcmp(s + n - k, ".safetensors") == 0 && s[0] != '.';
}

static int by_string(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* No index: every *.safetensors in the directory, in name order so the fingerprint is stable. */
static int list_dir_shards(st_file *f, char *err, size_t errlen) {
    DIR *d = opendir(f->dir);
    if (!d) return errf(err, errlen, "cannot open directory %s: %s", f->dir, strerror(errno));
    char **names = NULL;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (!is_shard_name(de->d_name)) continue;
        names = xrealloc(names, (size_t)(n + 1) * sizeof *names);
        names[n++] = xstrdup(de->d_name);
    }
    closedir(d);
    if (n) qsort(names, (size_t)n, sizeof *names, by_string);
    for (int i = 0; i < n; i++) { add_shard(f, names[i]); free(names[i]); }
    free(names);
    if (!n) return errf(err, errlen, "%s: no model.safetensors, index or *.safetensors files", f->dir);
    return 0;
}

/* The index's weight_map names the shards; after loading, each entry must match where the tensor is. */
static cJSON *read_index(st_file *f, const char *path, char *err, size_t errlen) {
    size_t len;
    char *text = read_file(path, &len, err, errlen);
    if (!text) return NULL;
    cJSON *idx = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *wm = idx ? cJSON_GetObjectItemCaseSensitive(idx, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(idx);
        errf(err, errlen, "%s: not JSON with a weight_map object", path);
        return NULL;
    }
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
            errf(err, errlen, "%s: weight_map entry %s is not a shard file name", path, e->string);
            cJSON_Delete(idx);
            return NULL;
        }
        if (shard_find(f, e->valuestring) < 0) add_shard(f, e->valuestring);
    }
    return idx;
}

static int check_weight_map(const st_file *f, const cJSON *idx, char *err, size_t errlen) {
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    for (const cJSON *e = wm->child; e; e = e->next) {
        const st_tensor *t = st_find(f, e->string);
        const st_shard *sh = &f->shards[shard_find(f, e->valuestring)];
        if (!t || t->file != sh->path)
            return errf(err, errlen, "index maps tensor %s to %s, which does not contain it", e->string, sh->path);
    }
    return 0;
}

/* Config and headers alone do not tell a fine-tune (or a re-seeded test model) from its base: same
 * names, same shapes. So the fingerprint also hashes the bytes of every small tensor — norms, biases,
 * sinks, block-scale grids, which training changes — up to a fixed budget. That reads a few hundred
 * pages, not the weights, so it stays cheap even for a 1.5 TB checkpoint. */
#define FINGERPRINT_SMALL_TENSOR (64 * 1024)
#define FINGERPRINT_BUDGET (32u << 20)

static uint64_t fingerprint(const st_file *f) {
    uint64_t h = FNV64_INIT;
    char *cfg_path = path_join(f->dir, "config.json");
    size_t len = 0;
    char *cfg = read_file(cfg_path, &len, NULL, 0);
    free(cfg_path);
    if (cfg) h = fnv64(h, cfg, len);
    free(cfg);
    for (int i = 0; i < f->nshards; i++) h = fnv64(h, f->shards[i].map + 8, f->shards[i].header_len);
    size_t budget = FINGERPRINT_BUDGET;
    for (int i = 0; i < f->ntensors; i++) {
        const st_tensor *t = &f->tensors[i];
        if (t->nbytes > FINGERPRINT_SMALL_TENSOR || t->nbytes > budget) continue;
        h = fnv64(h, t->data, t->nbytes);
        budget -= t->nbytes;
    }
    return h;
}

static int open_all(st_file *f, int progress, char *err, size_t errlen) {
    char *index_path = path_join(f->dir, "model.safetensors.index.json");
    cJSON *idx = NULL;
    int rc;
    if (access(index_path, F_OK) == 0) {
        idx = read_index(f, index_path, err, errlen);
        rc = idx ? 0 : -1;
        if (idx && !f->nshards) rc = errf(err, errlen, "%s: weight_map is empty", index_path);
    } else {
        rc = list_dir_shards(f, err, errlen);
    }
    free(index_path);
    int show = progress_wanted(progress) && f->nshards > 0;
    if (show && !rc) progress_draw(0, f->nshards);
    for (int i = 0; i < f->nshards && !rc; i++) {
        if (idx && access(f->shards[i].path, F_OK) != 0)
            rc = errf(err, errlen, "index names shard %s, which is missing", f->shards[i].path);
        else
            rc = shard_load(f, &f->shards[i], err, errlen);
        if (show && !rc) progress_draw(i + 1, f->nshards);
    }
    if (rc && show) fputc('\n', stderr);   /* end the partial bar before the caller prints the error */
    if (!rc) rc = index_build(f, err, errlen);
    if (!rc && idx) rc = check_weight_map(f, idx, err, errlen);
    cJSON_Delete(idx);
    return rc;
}

st_file *st_open(const char *dir, int progress, char *err, size_t errlen) {
    st_file *f = xcalloc(1, sizeof *f);
    f->dir = xstrdup(dir);
    size_t dl = strlen(f->dir);
    while (dl > 1 && f->dir[dl - 1] == '/') f->dir[--dl] = 0;
    if (open_all(f, progress, err, errlen)) {
        st_close(f);
        return NULL;
    }
    f->fingerprint = fingerprint(f);
    return f;
}

void st_close(st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->ntensors; i++) free((char *)f->tensors[i].name);
    for (int i = 0; i < f->nshards; i++) {
        if (f->shards[i].map) munmap((void *)f->shards[i].map, f->shards[i].size);
        free(f->shards[i].path);
    }
    free(f->tensors);
    free(f->shards);
    free(f->slots);
    free(f->dir);
    free(f);
}

int st_count(const st_file *f) { return f->ntensors; }

int st_shard_count(const st_file *f) { return f->nshards; }

const char *st_shard_path(const st_file *f, int i) { return i >= 0 && i < f->nshards ? f->shards[i].path : NULL; }

int st_locate(const st_file *f, const void *p, size_t len, uint64_t *offset) {
    const unsigned char *b = p;
    for (int i = 0; i < f->nshards; i++) {
        const st_shard *sh = &f->shards[i];
        if (sh->map && b >= sh->map && (size_t)(b - sh->map) <= sh->size && len <= sh->size - (size_t)(b - sh->map)) {
            *offset = (uint64_t)(b - sh->map);
            return i;
        }
    }
    return -1;
}

const st_tensor *st_at(const st_file *f, int i) { return i >= 0 && i < f->ntensors ? &f->tensors[i] : NULL; }

uint64_t st_fingerprint(const st_file *f) { return f->fingerprint; }

const char *st_dir(const st_file *f) { return f->dir; }

const char *st_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t off = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, "]");
    return buf;
}

const st_tensor *st_expect(const st_file *f, const char *name, dtype type, int ndim, const int64_t *shape,
                           char *err, size_t errlen) {
    const st_tensor *t = st_find(f, name);
    if (!t) {
        errf(err, errlen, "missing tensor %s in %s", name, f->dir);
        return NULL;
    }
    int same = t->type == type && t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (same) return t;
    char want[96], have[96];
    errf(err, errlen, "tensor %s in %s: expected %s %s, found %s %s", name, t->file, dtype_name(type),
         st_shape_str(ndim, shape, want, sizeof want), dtype_name(t->type),
         st_shape_str(t->ndim, t->shape, have, sizeof have));
    return NULL;
}
