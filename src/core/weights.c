/* weights.c — weight matrices in every kernel format (see weights.h). */
#include "weights.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

enum { NAME_MAX_LEN = 256 };

/* Scales are read on every pass; a NaN, an infinity or a value too large for the kernels' scale
 * * 2^8 factor would poison every output of the matrix, so it is refused by name at load. */
static int check_f32_scales(const st_tensor *s, char *err, size_t errlen) {
    for (size_t i = 0; i < s->nbytes / sizeof(float); i++) {
        float v = ((const float *)s->data)[i];
        if (!(fabsf(v) < 0x1p100f))
            return errf(err, errlen, "tensor %s in %s: scale %g at %zu is not finite or out of range", s->name, s->file,
                        v, i);
    }
    return 0;
}

static int ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n > k && !memcmp(s + n - k, suffix, k);
}

/* `<stem>.weight_scale` for `<stem>.weight_packed`, else `<name>_scale_inv`, else `<stem>.scale`;
 * NULL if none exists. */
static const st_tensor *find_scale(const st_file *f, const char *name, char *sname) {
    size_t n = strlen(name), packed = strlen("_packed");
    if (ends_with(name, n, ".weight_packed")) {
        snprintf(sname, NAME_MAX_LEN, "%.*s_scale", (int)(n - packed), name);
        return st_find(f, sname);
    }
    snprintf(sname, NAME_MAX_LEN, "%s_scale_inv", name);
    const st_tensor *s = st_find(f, sname);
    if (s) return s;
    size_t suffix = strlen(".weight");
    if (ends_with(name, n, ".weight")) n -= suffix;
    snprintf(sname, NAME_MAX_LEN, "%.*s.scale", (int)n, name);
    return st_find(f, sname);
}

/* "F16 [2,3]": what a tensor is, for "expected ..., found ..." messages. */
static const char *found(const st_tensor *t, char *buf, size_t n) {
    char shape[80];
    snprintf(buf, n, "%s %s", dtype_name(t->type), st_shape_str(t->ndim, t->shape, shape, sizeof shape));
    return buf;
}

static int shape_is(const st_tensor *t, int64_t d0, int64_t d1) {
    return t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1;
}

/* E4M3 codes with a block scale grid [ceil(rows/128), ceil(cols/128)] of E8M0 or F32. */
static int get_fp8(const st_file *f, const st_tensor *t, qmat *out, int *count, char *err, size_t errlen) {
    char sname[NAME_MAX_LEN];
    int64_t br = (out->rows + 127) / 128, bc = (out->cols + 127) / 128;
    const st_tensor *s = find_scale(f, t->name, sname);
    if (!s) return errf(err, errlen, "tensor %s is F8_E4M3 but its block scales %s_scale_inv / %s are missing", t->name,
                        t->name, sname);
    char have[96];
    if (!shape_is(s, br, bc))
        return errf(err, errlen, "tensor %s in %s: expected shape [%lld,%lld], found %s", s->name, s->file,
                    (long long)br, (long long)bc, found(s, have, sizeof have));
    if (s->type == DT_F8_E8M0) out->scale = s->data;
    else if (s->type == DT_F32 && !check_f32_scales(s, err, errlen)) out->scale_f32 = s->data;
    else if (s->type == DT_F32) return -1;
    else
        return errf(err, errlen, "tensor %s in %s: block scales must be F32 or F8_E8M0, found %s", s->name, s->file,
                    found(s, have, sizeof have));
    out->fmt = WF_FP8;
    *count += 1;
    return 0;
}

/* Packed E2M1 [rows, cols/2] (I8 officially, U8 accepted) with E8M0 scales [rows, cols/32]
 * (F8_E8M0, or U8 holding the same UE8M0 bytes as compressed-tensors MXFP4 stores them). */
static int get_fp4(const st_tensor *t, const st_tensor *s, qmat *out, int *count, char *err, size_t errlen) {
    char have[96];
    if (out->cols % 32 || !shape_is(t, out->rows, out->cols / 2))
        return errf(err, errlen, "tensor %s in %s: expected packed FP4 [%d,%d] (32 | cols), found %s", t->name,
                    t->file, out->rows, out->cols / 2, found(t, have, sizeof have));
    if ((s->type != DT_F8_E8M0 && s->type != DT_U8) || !shape_is(s, out->rows, out->cols / 32))
        return errf(err, errlen, "tensor %s in %s: expected F8_E8M0 [%d,%d], found %s", s->name, s->file, out->rows,
                    out->cols / 32, found(s, have, sizeof have));
    out->fmt = WF_FP4;
    out->scale = s->data;
    *count += 1;
    return 0;
}

/* colibri's quantized container (QT formats 1, 2, 4): U8 codes plus F32 scales `<name>.qs`. The
 * file carries no format tag; as in colibri, the byte and scale counts decide. When a row is at
 * most one group (cols <= 64) int4 per row and int4-g64 are the same layout and numbers: per row. */
static int get_container(const st_tensor *t, const st_tensor *s, qmat *out, int *count, char *err, size_t errlen) {
    if (s->type != DT_F32)
        return errf(err, errlen, "tensor %s in %s: scales must be F32, found %s", s->name, s->file, dtype_name(s->type));
    size_t rows = (size_t)out->rows, cols = (size_t)out->cols, nibbles = rows * ((cols + 1) / 2);
    size_t groups = rows * ((cols + 63) / 64), n_scales = s->nbytes / sizeof(float);
    if (t->nbytes == rows * cols && n_scales == rows) out->fmt = WF_I8_ROW;
    else if (t->nbytes == nibbles && n_scales == rows) out->fmt = WF_I4_ROW;
    else if (t->nbytes == nibbles && n_scales == groups) out->fmt = WF_I4_G64;
    else
        return errf(err, errlen, "tensor %s in %s: %zu code bytes and %zu scales in %s match no quantized layout of "
                    "[%zu,%zu] (int8 per row: %zu + %zu; int4 per row: %zu + %zu; int4-g64: %zu + %zu)", t->name,
                    t->file, t->nbytes, n_scales, s->name, rows, cols, rows * cols, rows, nibbles, rows, nibbles, groups);
    if (check_f32_scales(s, err, errlen)) return -1;
    out->scale_f32 = s->data;
    *count += 1;
    return 0;
}

int weights_matrix(const st_file *f, const char *name, int rows, int cols, qmat *out, int *count, char *err,
                   size_t errlen) {
    *out = (qmat){.rows = rows, .cols = cols};
    const st_tensor *t = st_find(f, name);
    if (!t) return errf(err, errlen, "missing tensor %s", name);
    out->data = t->data;
    char sname[NAME_MAX_LEN], have[96];
    int rc;
    if (t->type == DT_U8 || t->type == DT_I8) {
        snprintf(sname, sizeof sname, "%s.qs", name);
        const st_tensor *qs = t->type == DT_U8 ? st_find(f, sname) : NULL, *s = qs ? NULL : find_scale(f, name, sname);
        if (!qs && !s)
            return errf(err, errlen, "tensor %s in %s is %s but its scales are missing (%s.qs for an int "
                        "container, %s for packed FP4)", name, t->file, dtype_name(t->type), name, sname);
        rc = qs ? get_container(t, qs, out, count, err, errlen) : get_fp4(t, s, out, count, err, errlen);
    } else if (!shape_is(t, rows, cols)) {
        return errf(err, errlen, "tensor %s in %s: expected [%d,%d], found %s", name, t->file, rows, cols,
                    found(t, have, sizeof have));
    } else if (t->type == DT_BF16 || t->type == DT_F32) {
        out->fmt = t->type == DT_BF16 ? WF_BF16 : WF_F32;
        rc = 0;
    } else if (t->type == DT_F8_E4M3) {
        rc = get_fp8(f, t, out, count, err, errlen);
    } else {
        return errf(err, errlen, "tensor %s in %s: expected a weight format (BF16, F32, F8_E4M3 + scales, packed "
                    "FP4, or U8 with .qs scales), found %s", name, t->file, found(t, have, sizeof have));
    }
    if (rc) return -1;
    *count += 1;
    return 0;
}
