/* safetensors.h — read-only access to an official checkpoint directory through mmap.
 *
 * A checkpoint is `config.json` plus either one `model.safetensors` or shards listed in
 * `model.safetensors.index.json` (the index's weight_map decides which shard holds which tensor;
 * without an index every `*.safetensors` in the directory is read).
 *
 * INVARIANTS
 *  - After st_open() succeeds, every tensor's [data, data+nbytes) lies inside its mapped file,
 *    nbytes == numel(shape) * dtype size (packed dtypes as stored), and names are unique.
 *    Nothing is ever read outside a mapping, whatever the file says.
 *  - Weights are never copied: `data` points into the read-only mapping, so a checkpoint larger
 *    than RAM still opens, and only the pages a forward pass touches are read from disk.
 *  - Lookups validate dtype and shape and fail with a message naming the tensor and its file.
 *
 * OWNERSHIP: the st_file owns the mappings; tensors and their data live until st_close().
 */
#ifndef CAIRN_SAFETENSORS_H
#define CAIRN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    DT_BF16, DT_F16, DT_F32, DT_F8_E4M3, DT_F8_E8M0, DT_I8, DT_U8, DT_I32, DT_I64, DT_COUNT
} dtype;

#define ST_MAX_DIMS 4

typedef struct {
    const char *name;
    dtype type;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;       /* inside the mmapped file */
    size_t nbytes;
    const char *file;       /* shard path, for messages */
} st_tensor;

typedef struct st_file st_file;

/* Open a checkpoint directory. `progress` (may be 0) prints a progress bar on stderr while
 * shards are mapped and validated. Returns NULL and fills err on any problem. */
st_file *st_open(const char *dir, int progress, char *err, size_t errlen);
void st_close(st_file *f);

const char *dtype_name(dtype t);
size_t dtype_size(dtype t);            /* bytes per element */

int st_count(const st_file *f);
const st_tensor *st_at(const st_file *f, int i);
const st_tensor *st_find(const st_file *f, const char *name);   /* NULL if absent */

/* The shard files (in the order st_locate numbers them), for readers that pread instead of
 * touching the mapping (core/experts.h). */
int st_shard_count(const st_file *f);
const char *st_shard_path(const st_file *f, int i);
/* The shard holding bytes [p, p+len) of a mapping, and their file offset; -1 if p is not inside one. */
int st_locate(const st_file *f, const void *p, size_t len, uint64_t *offset);

/* Find `name` and check it has dtype `type` and the given shape (ndim entries).
 * Returns NULL with err = "tensor X in FILE: expected F8_E4M3 [1024,4096], found ..." or "missing tensor X". */
const st_tensor *st_expect(const st_file *f, const char *name, dtype type, int ndim, const int64_t *shape,
                           char *err, size_t errlen);

/* "[1024,4096]" into buf[n] (returned). */
const char *st_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* A cheap fingerprint of the checkpoint: config.json bytes and every shard's JSON header.
 * Identifies "the same model" for persisted state without reading the weights. */
uint64_t st_fingerprint(const st_file *f);

/* Directory the checkpoint was opened from. */
const char *st_dir(const st_file *f);

#endif
