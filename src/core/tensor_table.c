/* tensor_table.c — the one walker of every family's tensor table (see tensor_table.h). */
#include "tensor_table.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "util.h"
#include "weights.h"

enum { NAME_LEN = 256 };

void tt_init(tt_table *w, const st_file *f, char *err, size_t errlen) {
    *w = (tt_table){.f = f, .err = err, .errlen = errlen};
}

void tt_free(tt_table *w) {
    for (int i = 0; i < w->n_owned; i++) free(w->owned[i]);
    free(w->owned);
    free(w->list);
    *w = (tt_table){0};
}

int tt_fail(tt_table *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (w->err && w->errlen) vsnprintf(w->err, w->errlen, fmt, ap);
    va_end(ap);
    w->failed = 1;
    return -1;
}

static void *own(tt_table *w, void *p) {
    if (w->n_owned == w->cap_owned) {
        w->cap_owned = w->cap_owned ? 2 * w->cap_owned : 64;
        w->owned = xrealloc(w->owned, (size_t)w->cap_owned * sizeof *w->owned);
    }
    return w->owned[w->n_owned++] = p;
}

static void record(tt_table *w, const tt_entry *e) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 256;
        w->list = xrealloc(w->list, (size_t)w->cap * sizeof *w->list);
    }
    w->list[w->n++] = *e;
}

/* The shape a row asks for, resolved against the group's dimensions. */
static void want_shape(const tt_spec *s, const tt_group *g, int64_t *shape) {
    for (int i = 0; i < s->ndim; i++) shape[i] = s->dim[i] == TT_ONE ? 1 : g->dims[s->dim[i]];
}

static int64_t numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

static int shape_ok(const st_tensor *t, const tt_spec *s, const int64_t *want) {
    if (s->flags & TT_ROW && s->ndim == 1 && t->ndim == 2 && t->shape[0] == 1 && t->shape[1] == want[0]) return 1;
    if (t->ndim != s->ndim) return 0;
    for (int i = 0; i < s->ndim; i++)
        if (t->shape[i] != want[i] && !(i == 0 && s->flags & TT_AT_LEAST && t->shape[i] > want[i])) return 0;
    return 1;
}

/* Dtype and shape of a non-matrix row; the error says expected vs found. */
static int check(tt_table *w, const st_tensor *t, const tt_spec *s, const int64_t *want) {
    int floats = s->kind == TT_STACK || s->kind == TT_F32;
    int type_ok = floats ? t->type == DT_BF16 || t->type == DT_F32 : t->type == s->type;
    if (type_ok && shape_ok(t, s, want)) {
        w->count++;
        return 0;
    }
    char ws[96], hs[96];
    return tt_fail(w, "tensor %s in %s: expected %s %s%s, found %s %s", t->name, t->file,
                   floats ? "BF16 or F32" : dtype_name(s->type), st_shape_str(s->ndim, want, ws, sizeof ws),
                   s->flags & TT_AT_LEAST ? " (or longer)" : "", dtype_name(t->type),
                   st_shape_str(t->ndim, t->shape, hs, sizeof hs));
}

static float *to_f32(tt_table *w, const st_tensor *t, size_t n) {
    float *v = own(w, xmalloc((n ? n : 1) * sizeof *v));
    for (size_t i = 0; i < n; i++)
        v[i] = t->type == DT_F32 ? ((const float *)t->data)[i] : bf16_to_f32(((const uint16_t *)t->data)[i]);
    return v;
}

/* Accumulates what a decode step (a draft step, for draft entries) reads of one entry; routed
 * entries are summed per group. */
static void account(tt_table *w, const tt_entry *e, int64_t rows, size_t *routed_bytes, double *routed_flops) {
    size_t *bytes = e->draft ? &w->draft_bytes : &w->decode_bytes;
    double *flops = e->draft ? &w->draft_flops : &w->flops;
    switch (e->role) {
    case TT_DENSE: case TT_SHARED: *bytes += e->bytes; *flops += e->flops; break;
    case TT_ROUTED: *routed_bytes += e->bytes; *routed_flops += e->flops; break;
    case TT_LOOKUP: *bytes += e->bytes / (size_t)(rows > 0 ? rows : 1); break;
    case TT_IDLE: break;
    }
}

static double mat_flops(tt_role role, const qmat *q) {
    return role == TT_LOOKUP || role == TT_IDLE ? 0 : 2.0 * q->rows * q->cols;
}

/* One tensor `name` of row s into *dst (expert e, -1 if not routed). 1 if an optional row is absent. */
static int load_one(tt_table *w, const tt_spec *s, const tt_group *g, tt_role role, const char *name, int e,
                    void *dst, size_t *rb, double *rf) {
    const st_tensor *t = st_find(w->f, name);
    if (!t && s->flags & TT_OPTIONAL) return 1;
    if (!t) return tt_fail(w, "missing tensor %s", name);
    int64_t want[TT_MAX_DIMS];
    want_shape(s, g, want);
    tt_entry en = {.t = t, .role = role, .layer = g->layer, .expert = e, .draft = g->draft};
    if (s->kind == TT_MAT) {
        qmat *q = dst;
        if (weights_matrix(w->f, name, (int)want[0], (int)want[1], q, &w->count, w->err, w->errlen)) {
            w->failed = 1;
            return -1;
        }
        en.mat = q;
        en.bytes = qmat_bytes(q);
        en.flops = mat_flops(role, q);
        record(w, &en);
        account(w, &en, q->rows, rb, rf);
        return 0;
    }
    if (check(w, t, s, want)) return -1;
    if (s->kind == TT_STACK) {
        int64_t count = want[0];
        qmat *qs = own(w, xcalloc((size_t)count, sizeof *qs));
        size_t stride = t->nbytes / (size_t)count;
        for (int64_t i = 0; i < count; i++) {
            qs[i] = (qmat){.fmt = t->type == DT_BF16 ? WF_BF16 : WF_F32, .rows = (int)want[1], .cols = (int)want[2],
                           .data = (const unsigned char *)t->data + (size_t)i * stride};
            tt_entry se = en;
            se.mat = &qs[i];
            se.expert = role == TT_ROUTED ? (int)i : -1;
            se.bytes = stride;
            se.flops = mat_flops(role, &qs[i]);
            record(w, &se);
            account(w, &se, 1, rb, rf);
        }
        *(qmat **)dst = qs;
        return 0;
    }
    en.bytes = t->nbytes;
    if (s->kind == TT_F32) *(float **)dst = to_f32(w, t, (size_t)numel(s->ndim, want));
    else if (s->kind == TT_COPY) *(void **)dst = memcpy(own(w, xmalloc(t->nbytes ? t->nbytes : 1)), t->data, t->nbytes);
    else *(const void **)dst = t->data;
    record(w, &en);
    account(w, &en, t->shape[0], rb, rf);
    return 0;
}

/* A routed matrix row names every expert's tensor through %d: one qmat array for all of them. */
static int load_experts(tt_table *w, const tt_spec *s, const tt_group *g, const char *pattern, void *dst,
                        size_t *rb, double *rf) {
    qmat *qs = own(w, xcalloc((size_t)(g->experts > 0 ? g->experts : 1), sizeof *qs));
    char tail[NAME_LEN], name[NAME_LEN];
    for (int e = 0; e < g->experts; e++) {
        snprintf(tail, sizeof tail, pattern, e);
        snprintf(name, sizeof name, "%s%s", g->prefix, tail);
        if (load_one(w, s, g, g->idle ? TT_IDLE : TT_ROUTED, name, e, &qs[e], rb, rf) < 0) return -1;
    }
    *(qmat **)dst = qs;
    return 0;
}

int tt_load(tt_table *w, const tt_spec *specs, int n, const tt_group *g) {
    if (w->failed) return -1;
    size_t routed_bytes = 0;
    double routed_flops = 0;
    for (int i = 0; i < n; i++) {
        const tt_spec *s = &specs[i];
        const char *pattern = s->name[g->variant] ? s->name[g->variant] : s->name[0];
        void *dst = (char *)g->dst + s->dst;
        tt_role role = g->idle ? TT_IDLE : s->role;
        if (s->role == TT_ROUTED && s->kind == TT_MAT) {
            if (load_experts(w, s, g, pattern, dst, &routed_bytes, &routed_flops)) return -1;
            continue;
        }
        char name[NAME_LEN];
        snprintf(name, sizeof name, "%s%s", g->prefix, pattern);
        if (load_one(w, s, g, role, name, -1, dst, &routed_bytes, &routed_flops) < 0) return -1;
    }
    if (g->experts > 0) {
        *(g->draft ? &w->draft_bytes : &w->decode_bytes) += routed_bytes * (size_t)g->active / (size_t)g->experts;
        *(g->draft ? &w->draft_flops : &w->flops) += routed_flops * g->active / g->experts;
    }
    return 0;
}

size_t tt_decode_bytes(const tt_table *w) { return w->decode_bytes; }

double tt_matmul_flops(const tt_table *w) { return w->flops; }

size_t tt_draft_bytes(const tt_table *w) { return w->draft_bytes; }

double tt_draft_flops(const tt_table *w) { return w->draft_flops; }

int tt_expert(const tt_table *w, int layer, int expert, const tt_entry **out, int max) {
    int k = 0;
    for (int i = 0; i < w->n; i++) {
        const tt_entry *e = &w->list[i];
        if (e->role == TT_ROUTED && e->layer == layer && e->expert == expert) {
            if (k < max) out[k] = e;
            k++;
        }
    }
    return k;
}
