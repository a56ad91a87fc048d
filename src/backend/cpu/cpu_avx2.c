/* cpu_avx2.c - AVX2 (+FMA, F16C) matmul for CPUs without AVX-512.
 *
 * The decode strategy of cpu_avx512.c at 8 lanes: four rows at a time widened
 * in registers (e4m3 through fp16 with the 2^8 folded into the activations,
 * BF16 by a shift), dotted with up to four tokens in float32. Used for any
 * number of tokens; no bf16 dot-product instructions exist here. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ref.h"
#include "cpu_simd.h"
#include "quant.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))
#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* 8 e4m3 codes -> their values times 2^-8 (see cpu_avx512.c). */
AVX2 INLINE __m256 fp8x8_to_f32(__m128i b)
{
    __m128i h = _mm_cvtepi8_epi16(b);
    h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16((short)0xBF80));
    return _mm256_cvtph_ps(h);
}

/* Elements k..k+7 of a row; n < 8 reads only the first n (the rest are 0). */
AVX2 INLINE __m256 load_w8(ds_wfmt f, const void *row, int k, int n)
{
    if (n < 8) {
        float tmp[8] = {0};
        uint8_t raw[32] = {0};
        size_t esz = f == DS_W_FP8 ? 1 : f == DS_W_BF16 ? 2 : 4;
        memcpy(raw, (const uint8_t *)row + (size_t)k * esz, (size_t)n * esz);
        if (f == DS_W_FP8) return fp8x8_to_f32(_mm_loadl_epi64((const __m128i *)raw));
        if (f == DS_W_BF16) {
            const uint16_t *p = (const uint16_t *)raw;
            for (int i = 0; i < n; i++) {
                uint32_t u = (uint32_t)p[i] << 16;
                memcpy(&tmp[i], &u, 4);
            }
            return _mm256_loadu_ps(tmp);
        }
        return _mm256_loadu_ps((const float *)raw);
    }
    if (f == DS_W_FP8) return fp8x8_to_f32(_mm_loadl_epi64((const __m128i *)((const uint8_t *)row + k)));
    if (f == DS_W_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k))), 16));
    return _mm256_loadu_ps((const float *)row + k);
}

AVX2 INLINE __m256 load_x8(const float *x, int k, int n)
{
    if (n >= 8) return _mm256_loadu_ps(x + k);
    float tmp[8] = {0};
    memcpy(tmp, x + k, sizeof(float) * (size_t)n);
    return _mm256_loadu_ps(tmp);
}

AVX2 INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static const void *w_row(const ds_weight *w, int r)
{
    size_t esz = w->fmt == DS_W_FP8 ? 1 : w->fmt == DS_W_BF16 ? 2 : 4;
    return (const uint8_t *)w->data + (size_t)r * w->cols * esz;
}

/* y[t][r] = W[r0 + r] . xs[t] for R <= 4 rows, T <= 4 tokens. */
AVX2 INLINE void gemv8(ds_wfmt f, int R, int T, const ds_weight *w, int r0, const float *xs, size_t ldx, float *y,
                       size_t ldy)
{
    int K = w->cols;
    const void *row[4];
    __m256 acc[4][4];
    #pragma GCC unroll 16
    for (int r = 0; r < R; r++) row[r] = w_row(w, r0 + r);
    #pragma GCC unroll 16
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int k = 0; k < K; k += 8) {
        int n = MIN(8, K - k);
        __m256 wv[4];
        #pragma GCC unroll 16
        for (int r = 0; r < R; r++) wv[r] = load_w8(f, row[r], k, n);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            __m256 xv = load_x8(xs + t * ldx, k, n);
            #pragma GCC unroll 16
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) y[t * ldy + r] = hsum8(acc[r][t]);
}

#define GEMV8_CASES(F)                                                             \
    if (R == 4 && T == 4) gemv8(F, 4, 4, w, r0, xs, ldx, y, ldy);                  \
    else if (R == 4 && T == 1) gemv8(F, 4, 1, w, r0, xs, ldx, y, ldy);             \
    else                                                                           \
        for (int r = 0; r < R; r++)                                                \
            for (int t = 0; t < T; t++) gemv8(F, 1, 1, w, r0 + r, xs + t * ldx, ldx, y + t * ldy + r, ldy);

AVX2 static void gemv8_fp8(int R, int T, const ds_weight *w, int r0, const float *xs, size_t ldx, float *y, size_t ldy)
{
    GEMV8_CASES(DS_W_FP8)
}
AVX2 static void gemv8_bf16(int R, int T, const ds_weight *w, int r0, const float *xs, size_t ldx, float *y,
                            size_t ldy)
{
    GEMV8_CASES(DS_W_BF16)
}
AVX2 static void gemv8_f32(int R, int T, const ds_weight *w, int r0, const float *xs, size_t ldx, float *y, size_t ldy)
{
    GEMV8_CASES(DS_W_F32)
}

/* xs[t][k] = x[t][k] * s[rb][k/128] * 2^8 (FP8 weights, row block rb). */
static void scale_acts8(float *xs, const float *x, int n, const ds_weight *w, int rb)
{
    int K = w->cols, kb = (K + DS_BLOCK - 1) / DS_BLOCK;
    for (int t = 0; t < n; t++)
        for (int k = 0; k < K; k++)
            xs[(size_t)t * K + k] = x[(size_t)t * K + k] * (w->scale[(size_t)rb * kb + k / DS_BLOCK] * 256.0f);
}

AVX2 void avx2_matmul(float *y, const float *x, int n, const ds_weight *w, int row0, int rows, ds_gemm_impl gemm,
                      bool ue8m0)
{
    if (gemm == DS_GEMM_FP8 && w->fmt == DS_W_FP8) { /* as avx512_matmul: the input rounded as act_quant does */
        float *xq = act_fake_quant_copy(x, n, w->cols, ue8m0, act_fake_quant);
        if (xq) avx2_matmul(y, xq, n, w, row0, rows, DS_GEMM_BF16, ue8m0);
        free(xq);
        return;
    }
    int K = w->cols, ngroups = (rows + 3) / 4;
    bool fp8 = w->fmt == DS_W_FP8;
    #pragma omp parallel
    {
        float *xs = fp8 ? malloc(sizeof(float) * (size_t)n * K) : NULL;
        int cur_rb = -1;
        if (fp8 && !xs) cpu_fail_oom("matmul activations", sizeof(float) * (size_t)n * K);
        #pragma omp for schedule(static)
        for (int g = 0; g < ngroups; g++) {
            if (fp8 && !xs) continue;
            int a = g * 4, b = MIN(a + 4, rows);
            while (a < b) {
                int e = b;
                if (fp8) {
                    int rb = (row0 + a) / DS_BLOCK;
                    e = MIN(b, (rb + 1) * DS_BLOCK - row0);
                    if (rb != cur_rb) scale_acts8(xs, x, n, w, cur_rb = rb);
                }
                const float *xv = fp8 ? xs : x;
                for (int t0 = 0; t0 < n; t0 += 4) {
                    int T = MIN(4, n - t0);
                    float *yo = y + (size_t)t0 * rows + a;
                    const float *xo = xv + (size_t)t0 * K;
                    if (fp8) gemv8_fp8(e - a, T, w, row0 + a, xo, (size_t)K, yo, (size_t)rows);
                    else if (w->fmt == DS_W_BF16) gemv8_bf16(e - a, T, w, row0 + a, xo, (size_t)K, yo, (size_t)rows);
                    else gemv8_f32(e - a, T, w, row0 + a, xo, (size_t)K, yo, (size_t)rows);
                }
                a = e;
            }
        }
        free(xs);
    }
}
