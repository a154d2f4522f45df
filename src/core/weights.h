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
 *   U8 + `<name>.qs` F32              colibri int8 / int4 per row / int4-g64 (told by byte counts)
 *
 * INVARIANTS
 *  - Matrices are views into the mapping, never copied. F32 scales are checked finite and in
 *    range at load: a bad one would poison every output of its matrix.
 *  - Errors name the tensor and its file. *count grows by the tensors checked (weight + scales).
 */
#ifndef CAIRN_WEIGHTS_H
#define CAIRN_WEIGHTS_H

#include <stddef.h>

#include "kernels.h"
#include "safetensors.h"

/* Matrix [rows, cols] from tensor `name`: 0 and *out, or -1 with err. */
int weights_matrix(const st_file *f, const char *name, int rows, int cols, qmat *out, int *count, char *err,
                   size_t errlen);

#endif
