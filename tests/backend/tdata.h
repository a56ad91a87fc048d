/* tdata.h - random inputs for the backend tests: xorshift numbers, weights in
 * every format, vectors and outputs followed by PAD sentinels that catch writes
 * past the end. Each test file has its own generator state (g_rng). */
#ifndef DS_TEST_TDATA_H
#define DS_TEST_TDATA_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "base/numeric.h"

#define SENTINEL 12345.678f
#define PAD 16

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static inline double urand(void) /* [0, 1) */
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}

static inline float frand(void) { return (float)(2 * urand() - 1); }

typedef struct {
    ds_weight w;
    void *data;
    float *scale;
} tweight;

/* FP8 test weights: every code but NaN, or (when set) normal codes only, as in
 * real checkpoints, where subnormals (|w| < 2^-6 of the block unit) are rare: the
 * AVX-512 decode kernel has a separate path for chunks holding one. */
static bool fp8_normal_only;

/* rows x cols in format f, values in [-1, 1); FP8 with random block scales */
static inline tweight make_weight(ds_wfmt f, int rows, int cols)
{
    tweight t = {0};
    t.w.fmt = f;
    t.w.rows = rows;
    t.w.cols = cols;
    size_t n = (size_t)rows * cols;
    if (f == DS_W_F32) {
        float *p = malloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++) p[i] = frand();
        t.data = p;
    } else if (f == DS_W_BF16) {
        uint16_t *p = malloc(sizeof(uint16_t) * n);
        for (size_t i = 0; i < n; i++) p[i] = f32_to_bf16(frand());
        t.data = p;
    } else {
        uint8_t *p = malloc(n);
        for (size_t i = 0; i < n; i++) {
            uint8_t c;
            do c = (uint8_t)(urand() * 256); while ((c & 0x7f) == 0x7f || (fp8_normal_only && !(c & 0x78)));
            p[i] = c;
        }
        size_t sr = (size_t)(rows + 127) / 128, sc = (size_t)(cols + 127) / 128;
        t.scale = malloc(sizeof(float) * sr * sc);
        for (size_t i = 0; i < sr * sc; i++) t.scale[i] = (float)(0.001 + 0.01 * urand());
        t.data = p;
    }
    t.w.data = t.data;
    t.w.scale = t.scale;
    return t;
}

static inline void free_weight(tweight *t)
{
    free(t->data);
    free(t->scale);
}

/* n values in [-3, 3), then PAD sentinels */
static inline float *rand_vec(size_t n)
{
    float *v = malloc(sizeof(float) * (n + PAD));
    for (size_t i = 0; i < n; i++) v[i] = frand() * 3;
    for (size_t i = n; i < n + PAD; i++) v[i] = SENTINEL;
    return v;
}

/* n floats followed by PAD sentinels; a copy of src when given, else sentinels */
static inline float *out_buf(size_t n, const float *src)
{
    float *v = malloc(sizeof(float) * (n + PAD));
    for (size_t i = 0; i < n + PAD; i++) v[i] = src && i < n ? src[i] : SENTINEL;
    return v;
}

static inline bool sentinels_ok(const float *v, size_t n)
{
    for (size_t i = n; i < n + PAD; i++)
        if (v[i] != SENTINEL) return false;
    return true;
}

#endif
