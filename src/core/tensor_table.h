/* tensor_table.h — one tensor list per family drives loading, validation, weight bytes per token
 * and FLOPs (in the spirit of gemma.cpp's one tensor table).
 *
 * A family describes its checkpoint as static tables of tt_spec rows — name pattern, kind (which
 * fixes the dtypes accepted), shape in terms of the family's dimensions, multiplicity (per expert)
 * and role — and walks them with tt_load once per group of tensors (the head, one layer's
 * attention, one layer's MoE, ...). Which groups a layer has is the family's code; everything a
 * row says is done here, once for every family:
 *   - lookup by name, validation of dtype and shape, an error naming the tensor, expected vs found;
 *   - the destination filled in (a qmat view, an owned f32 / raw copy, an in-place view, or an
 *     array of one qmat per expert);
 *   - one record entry per tensor (tt_entry: role, layer, expert, bytes, FLOPs), from which
 *     tt_decode_bytes and tt_matmul_flops follow, and which the expert cache walks to find an
 *     expert's matrices (tt_expert).
 *
 * ROWS (tt_spec):
 *   name[v]  appended to the group's prefix; name[1] is the alternative checkpoint layout's name
 *            (group.variant 1; NULL: same as name[0]). A TT_ROUTED TT_MAT row's name holds one %d,
 *            the expert index: it stands for group.experts tensors.
 *   kind     TT_MAT   a weight matrix [d0, d1] in any format the kernels run (weights.h) -> qmat
 *            TT_STACK BF16/F32 [d0, d1, d2]: d0 matrices [d1, d2] in one tensor -> qmat[d0]
 *            TT_F32   BF16/F32 of the shape, copied once to owned f32 -> float *
 *            TT_COPY  exactly `type`, copied once (aligned) -> void *
 *            TT_VIEW  exactly `type`, used in place -> const void *
 *   role     what a decode step reads of it: TT_DENSE all of it; TT_SHARED all of it (a shared
 *            expert: never evicted by an expert cache); TT_ROUTED one of group.experts experts,
 *            of which group.active are read per token; TT_LOOKUP one row per token (embedding,
 *            hash table); TT_IDLE nothing (validated only: an MTP layer no drafting runs, a
 *            media tower).
 *   dim[]    indices into the dims vector handed to tt_load (TT_ONE: the literal 1).
 *   dst      offsetof the destination in group.dst. TT_ROUTED TT_MAT and TT_STACK rows write a
 *            `qmat *` to an array the table owns.
 *   flags    TT_OPTIONAL (absent is fine: destination left zero, no entry), TT_ROW (a vector
 *            [n] may be stored [1, n]), TT_AT_LEAST (dim 0 may be longer: the first d0 are used).
 *
 * ACCOUNTING (the record; each tensor is one entry, a stacked tensor one entry per matrix):
 *   bytes   as stored and read by the kernels (codes + block scales for a quantized matrix)
 *   decode  DENSE + SHARED bytes, LOOKUP bytes / rows, and per group the routed bytes times
 *           active / experts (integer division of the group's sum); IDLE nothing
 *   flops   2 * rows * cols per matrix a token passes through (routed: the same active share),
 *           no FLOPs for vectors, lookups and idle tensors. Attention over the context and other
 *           position-dependent work is the family's (family_ops.extra_flops).
 *   draft   a group loaded with group.draft (an MTP layer, read only by speculative decoding):
 *           its rows keep their roles and are accounted by the same rules, but into draft_bytes /
 *           draft_flops (what one MTP step over one token reads and computes), not decode.
 *
 * INVARIANTS
 *  - After the first failure every tt_load returns -1 at once; err keeps the first message.
 *  - count grows by every tensor looked up and checked, block scales included.
 *  - Views point into the checkpoint mapping and live as long as it; copies and expert arrays
 *    live until tt_free.
 */
#ifndef CAIRN_TENSOR_TABLE_H
#define CAIRN_TENSOR_TABLE_H

#include <stddef.h>

#include "kernels.h"
#include "safetensors.h"

#define TT_MAX_DIMS 3
#define TT_VARIANTS 2
#define TT_ONE (-1)

typedef enum { TT_MAT, TT_STACK, TT_F32, TT_COPY, TT_VIEW } tt_kind;
typedef enum { TT_DENSE, TT_SHARED, TT_ROUTED, TT_LOOKUP, TT_IDLE } tt_role;
enum { TT_OPTIONAL = 1, TT_ROW = 2, TT_AT_LEAST = 4 };

typedef struct {
    const char *name[TT_VARIANTS];
    tt_kind kind;
    tt_role role;
    dtype type;                /* TT_COPY / TT_VIEW */
    int ndim;
    int dim[TT_MAX_DIMS];
    size_t dst;
    unsigned flags;
} tt_spec;

/* One call's context: where names start, where destinations are, the dimensions. */
typedef struct {
    const char *prefix;
    void *dst;
    const int *dims;
    int variant;               /* name[variant] */
    int layer;                 /* for the record; -1 outside the layers */
    int experts, active;       /* TT_ROUTED rows: multiplicity, and experts read per token */
    int idle;                  /* every row of the call counts as TT_IDLE (validated only) */
    int draft;                 /* the call's rows are read only when drafting (see ACCOUNTING) */
} tt_group;

typedef struct {
    const st_tensor *t;        /* the tensor (name, file) */
    qmat *mat;                 /* the matrix view, NULL for vectors */
    tt_role role;
    int layer, expert;         /* expert -1 unless routed */
    int draft;                 /* loaded with group.draft */
    size_t bytes;
    double flops;
} tt_entry;

typedef struct {
    const st_file *f;
    char *err;
    size_t errlen;
    int failed;
    int count;                 /* tensors validated */
    tt_entry *list;            /* the record, in load order */
    int n, cap;
    size_t decode_bytes, draft_bytes;
    double flops, draft_flops;
    void **owned;
    int n_owned, cap_owned;
} tt_table;

void tt_init(tt_table *w, const st_file *f, char *err, size_t errlen);
void tt_free(tt_table *w);
/* Loads the n rows of specs for group g: 0, or -1 with w->err naming the tensor. */
int tt_load(tt_table *w, const tt_spec *specs, int n, const tt_group *g);
/* Weight bytes one decode step reads, and its matrix FLOPs (see ACCOUNTING). */
size_t tt_decode_bytes(const tt_table *w);
double tt_matmul_flops(const tt_table *w);
/* The same of the draft groups alone: one MTP step over one token (0 without drafting weights). */
size_t tt_draft_bytes(const tt_table *w);
double tt_draft_flops(const tt_table *w);
/* The entries of routed expert e of layer l, in table order, into out[max]: how many there are. */
int tt_expert(const tt_table *w, int layer, int expert, const tt_entry **out, int max);
/* A family's own check of loaded data (e.g. a hash table's entries) fails through the table. */
int tt_fail(tt_table *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
