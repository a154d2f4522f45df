/* weights.h — one loader for the weight matrices of an official checkpoint, shared by every
 * family: a matrix is accepted in every format the kernels run (kernels.h), whichever family
 * asks, so no family refuses a layout its checkpoints may ship (e.g. FP8 with F32 block scales).
 *
 * FORMATS, decided by the tensor's dtype and its companion scale tensor (stem = name without a
 * trailing ".weight"):
 *   BF16, F32                        plain
 *   F8_E4M3 + 128x128 block scales   `<name>_scale_inv` (HF, DeepSeek-V3, GLM-5-FP8) or
 *                                    `<stem>.scale` (DeepSeek V4), F8_E8M0 or F32
 *   I8/U8 [rows, cols/2] + `<stem>.scale` F8_E8M0 [rows, cols/32]   packed FP4 (E2M1); for a
 *                                    `<stem>.weight_packed` the scales are `<stem>.weight_scale`
 *                                    (compressed-tensors MXFP4), F8_E8M0 or U8
 *   U8 [rows, cols/2] + `<base>_scale` F8_E4M3 [rows, cols/16]   NVFP4 (E2M1, E4M3 per 16 inputs),
 *                                    with `<base>_global_scale` F32 (compressed-tensors
 *                                    nvfp4-pack-quantized: W = code * scale / global) or
 *                                    `<base>_scale_2` F32 (ModelOpt: W = code * scale * scale_2);
 *                                    <base> is the name without "_packed"
 * A tensor `<name>` that is absent may be stored as `<name>_packed` (compressed-tensors' name for
 * the packed codes): every BF16 row of a family's table thereby accepts that layout.
 *   U8 + `<name>.qs` F32              colibri int8 / int4 per row / int4-g64 (told by byte counts)
 *
 * INVARIANTS
 *  - Matrices are views into the mapping, never copied. F32 scales are checked finite and in
 *    range at load: a bad one would poison every output of its matrix. NVFP4's E4M3 block
 *    scales are a ninth of the checkpoint and are not scanned (that would read them all at
 *    start-up); an E4M3 NaN code (0x7f / 0xff, which no quantizer writes) makes its row's
 *    outputs NaN. Its global scales are checked finite and positive.
 *  - Errors name the tensor and its file. *count grows by the tensors checked (weight + scales).
 */
#ifndef CAIRN_WEIGHTS_H
#define CAIRN_WEIGHTS_H

#include <stddef.h>

#include "kernels.h"
#include "safetensors.h"

/* Tensor `name`, else `<name>_packed`; NULL if neither exists. */
const st_tensor *weights_tensor(const st_file *f, const char *name);

/* Matrix [rows, cols] from tensor `name` (or `<name>_packed`): 0 and *out, or -1 with err. */
int weights_matrix(const st_file *f, const char *name, int rows, int cols, qmat *out, int *count, char *err,
                   size_t errlen);

/* n matrices [rows, cols] stacked in one packed NVFP4 tensor t (U8 [n, rows, cols/2]) with
 * `<base>_scale` F8_E4M3 [n, rows, cols/16] and a global scale per matrix ([n]): out[n]. */
int weights_nvfp4_stack(const st_file *f, const st_tensor *t, int n, int rows, int cols, qmat *out, int *count,
                        char *err, size_t errlen);

#endif
