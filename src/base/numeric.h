/* numeric.h - scalar conversions between float32, bfloat16 and float8 e4m3fn.
 *
 * These are the reference conversions every fast kernel is tested against.
 * bf16 <- f32 rounds to nearest even (as torch's .to(bfloat16)); NaN stays NaN.
 * e4m3fn (OCP FP8: 4 exponent bits, bias 7, 3 mantissa bits, no infinities,
 * 0x7f/0xff are NaN, max finite 448) <- f32 rounds to nearest even and
 * saturates to +-448, as the reference's act_quant cast does on Hopper. */
#ifndef DS_NUMERIC_H
#define DS_NUMERIC_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The 256 e4m3fn values as float32, filled on first use of fp8_table(). */
const float *fp8_e4m3_table(void);

static inline float fp8_e4m3_to_f32(uint8_t b)
{
    return fp8_e4m3_table()[b];
}

/* Round to nearest even, saturating at +-448; NaN -> 0x7f. */
uint8_t f32_to_fp8_e4m3(float f);

/* The value of f32_to_fp8_e4m3(f): f rounded to e4m3 the same way, as a float
 * (NaN stays NaN), without going through the code. */
float f32_round_fp8_e4m3(float f);

#endif
