/* quant.c - scalar FP8 activation quantisation, block-scaled GEMM and weight
 * dequantisation, matching the reference's Triton kernels bit for bit where
 * the arithmetic is exact (quantisation, dequantisation). */
#include "quant.h"

#include <math.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "base/numeric.h"
#include "cpu_ref.h"

float act_quant_scale(float amax, bool ue8m0)
{
    if (!(amax >= 1e-4f)) amax = 1e-4f;
    /* Triton folds the division by the constant into a multiplication by its
     * reciprocal; doing the same keeps the scales bit-identical. */
    float s = amax * (1.0f / 448.0f);
    if (ue8m0) {
        /* 2^ceil(log2(s)), computed exactly: s = m * 2^e with m in [0.5, 1). */
        int e;
        float m = frexpf(s, &e);
        s = m == 0.5f ? s : ldexpf(1.0f, e);
    }
    return s;
}

void act_quant_ref(const float *x, int m, int k, uint8_t *y, float *s, bool ue8m0)
{
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    for (int i = 0; i < m; i++) {
        for (int b = 0; b < kb; b++) {
            int k0 = b * DS_BLOCK, k1 = k0 + DS_BLOCK < k ? k0 + DS_BLOCK : k;
            float amax = 0;
            for (int j = k0; j < k1; j++) amax = fmaxf(amax, fabsf(x[(size_t)i * k + j]));
            float sc = act_quant_scale(amax, ue8m0);
            s[(size_t)i * kb + b] = sc;
            for (int j = k0; j < k1; j++) y[(size_t)i * k + j] = f32_to_fp8_e4m3(x[(size_t)i * k + j] / sc);
        }
    }
}

void act_fake_quant(const float *x, int m, int k, float *y, bool ue8m0)
{
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    #pragma omp parallel for schedule(static) if ((size_t)m * k >= 65536)
    for (int i = 0; i < m; i++)
        for (int b = 0; b < kb; b++) {
            const float *xi = x + (size_t)i * k;
            float *yi = y + (size_t)i * k;
            int k0 = b * DS_BLOCK, k1 = k0 + DS_BLOCK < k ? k0 + DS_BLOCK : k;
            float amax = 0;
            for (int j = k0; j < k1; j++) amax = fmaxf(amax, fabsf(xi[j]));
            float sc = act_quant_scale(amax, ue8m0);
            for (int j = k0; j < k1; j++) yi[j] = f32_round_fp8_e4m3(xi[j] / sc) * sc;
        }
}

float *act_fake_quant_copy(const float *x, int m, int k, bool ue8m0, act_fake_quant_fn fq)
{
    size_t bytes = sizeof(float) * (size_t)m * k;
    float *y = malloc(bytes ? bytes : 1);
    if (!y) {
        cpu_fail_oom("FP8 GEMM activations", bytes);
        return NULL;
    }
    fq(x, m, k, y, ue8m0);
    return y;
}

void fp8_gemm_ref(const uint8_t *y, const float *s, const uint8_t *w, const float *ws, int m, int n, int k,
                  float *out)
{
    const float *t = fp8_e4m3_table();
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    for (int i = 0; i < m; i++)
        for (int o = 0; o < n; o++) {
            float acc = 0;
            for (int b = 0; b < kb; b++) {
                int k0 = b * DS_BLOCK, k1 = k0 + DS_BLOCK < k ? k0 + DS_BLOCK : k;
                float part = 0;
                for (int j = k0; j < k1; j++) part += t[y[(size_t)i * k + j]] * t[w[(size_t)o * k + j]];
                acc += part * s[(size_t)i * kb + b] * ws[(size_t)(o / DS_BLOCK) * kb + b];
            }
            out[(size_t)i * n + o] = acc;
        }
}

void weight_dequant_ref(const uint8_t *w, const float *s, int rows, int cols, float *out)
{
    const float *t = fp8_e4m3_table();
    int cb = (cols + DS_BLOCK - 1) / DS_BLOCK;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            out[(size_t)r * cols + c] = t[w[(size_t)r * cols + c]] * s[(size_t)(r / DS_BLOCK) * cb + c / DS_BLOCK];
}
