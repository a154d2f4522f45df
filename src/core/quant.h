/* quant.h — number formats of the official checkpoints and the activation rounding they expect.
 *
 * Formats (deepseek_v4.md §7):
 *  - BF16: upper half of an IEEE f32; rounding to BF16 is round-to-nearest-even.
 *  - F8 E4M3 (finite, max 448, no infinities; 0x7f/0xff are NaN) for dense weights, with one
 *    F8 E8M0 scale (2^(b-127)) per 128x128 block.
 *  - MXFP4 E2M1 for routed experts: codes {0,.5,1,1.5,2,3,4,6} with sign bit 8, two codes per byte,
 *    LOW NIBBLE = EVEN COLUMN, stored as I8/U8 [out, in/2]; one E8M0 scale per row per 32 inputs.
 *
 * Activation quantize-dequantize (QDQ), as the quantization-aware-trained checkpoints expect:
 *  - act_qdq_e4m3(x, n, block): per `block` contiguous values, scale = 2^ceil(log2(max(amax,1e-4)/448)),
 *    x <- e4m3_round(x/scale)*scale (round half to even, saturate at 448).
 *  - act_qdq_fp4(x, n, 32): scale = 2^ceil(log2(max(amax,tiny)/6)), x <- e2m1_round(x/scale)*scale.
 *
 * INVARIANT: every function here is a pure per-element (or per-block) function: results never
 * depend on how a vector is split into calls, which prefix reuse's bit-exactness relies on.
 */
#ifndef CAIRN_QUANT_H
#define CAIRN_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {      /* round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
float e4m3_to_f32(uint8_t b);
uint8_t f32_to_e4m3(float f);          /* round half to even, saturating at +-448 */
float e4m3_round(float f);             /* f32 -> nearest E4M3 value (as f32) */
float e8m0_to_f32(uint8_t b);          /* 2^(b-127); 255 = NaN */
float e2m1_to_f32(uint8_t code);       /* low 4 bits used */
float e2m1_round(float f);             /* nearest E2M1 value, half to even, saturating at 6 */

void bf16_round_vec(float *x, size_t n);
/* bf16_round_vec over n rows of `width` floats, one pool index per row: a projection's output
 * rounded on every thread (the same bits, each element rounds alone). */
void bf16_round_rows(float *x, int n, size_t width);
void act_qdq_e4m3(float *x, size_t n, size_t block);
void act_qdq_fp4(float *x, size_t n, size_t block);

#endif
