/* numeric.c - the e4m3fn decode table and the f32 -> e4m3fn rounding. */
#include "numeric.h"

#include <math.h>
#include <pthread.h>

static float g_e4m3[256];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static float decode_e4m3(uint8_t b)
{
    int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
    float v;
    if (exp == 15 && man == 7) return NAN;
    if (exp == 0) v = ldexpf((float)man, -9);           /* subnormal: man/8 * 2^-6 */
    else v = ldexpf((float)(8 + man), exp - 10);         /* (1 + man/8) * 2^(exp-7) */
    return sign ? -v : v;
}

static void init_table(void)
{
    for (int i = 0; i < 256; i++) g_e4m3[i] = decode_e4m3((uint8_t)i);
}

const float *fp8_e4m3_table(void)
{
    pthread_once(&g_once, init_table);
    return g_e4m3;
}

uint8_t f32_to_fp8_e4m3(float f)
{
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e;
    /* Step between representable values: 2^-9 below 2^-6 (subnormals), else
     * 2^(e-3) for a in [2^e, 2^(e+1)). Round a/step to nearest even integer. */
    int e;
    frexpf(a, &e);                 /* a = m * 2^e, m in [0.5, 1) -> a in [2^(e-1), 2^e) */
    int ue = e - 1;                /* a in [2^ue, 2^(ue+1)) */
    if (ue < -6) ue = -6;
    float step = ldexpf(1.0f, ue - 3);
    float q = nearbyintf(a / step); /* default rounding mode: nearest even */
    float r = q * step;
    if (r >= 448.0f) return sign | 0x7e;
    if (r == 0.0f) return sign;
    int re;
    frexpf(r, &re);
    int rue = re - 1;
    if (rue < -6) return sign | (uint8_t)(r / ldexpf(1.0f, -9));        /* subnormal */
    int man = (int)(r / ldexpf(1.0f, rue - 3)) - 8;
    return sign | (uint8_t)((rue + 7) << 3) | (uint8_t)man;
}

float f32_round_fp8_e4m3(float f)
{
    if (isnan(f)) return f;
    float a = fabsf(f);
    if (a >= 448.0f) return copysignf(448.0f, f);
    /* the step between e4m3 values around a: 2^(ue-3), ue = the exponent of a, at
     * least -6 (the subnormals' step 2^-9); a / step < 16 is rounded to the nearest
     * even integer by adding and taking away 2^23 (both exact in float32) */
    uint32_t u;
    memcpy(&u, &a, 4);
    int ue = (int)(u >> 23) - 127;
    if (ue < -6) ue = -6;
    uint32_t up = (uint32_t)(127 + 3 - ue) << 23, down = (uint32_t)(127 + ue - 3) << 23;
    float fu, fd;
    memcpy(&fu, &up, 4);
    memcpy(&fd, &down, 4);
    const float big = 8388608.0f; /* 2^23 */
    float q = (a * fu + big) - big, r = q * fd;
    return copysignf(r > 448.0f ? 448.0f : r, f);
}

