/* cpu_avx512.c - AVX-512 kernels: matmul (decode and batched GEMM), the
 * transpose matmul of absorb attention, absorb attention, silu.
 *
 * Weight widening, in registers:
 *   BF16 -> f32: zero-extend to 32 bits and shift left 16.
 *   e4m3 -> f32: the 7 exponent+mantissa bits shifted into an fp16's (bias 15
 *     instead of 7) and converted with vcvtph2ps. That gives the value times
 *     2^-8 exactly, subnormals included, and 2^8 is folded into the block
 *     scale. NaN codes (0x7f/0xff) become finite values; they never occur in
 *     valid weights.
 *
 * Decode (few tokens): bandwidth bound. One row at a time, read sequentially
 * with software prefetch, widened once per four tokens; rows split statically
 * over threads. float32 arithmetic throughout; FP8 block scales are folded
 * into the activations: for the 128 rows of one scale block,
 * xs[k] = x[k] * s[rb][k/128] * 2^8, so the inner loops are plain dot products.
 * Prefill (many tokens): compute bound. vdpbf16ps on weights packed once per
 * matmul into k-pair panels (FP8 is exact in bf16), activations broadcast
 * as bf16 pairs, rounded or split hi+lo, or as bf16 hi plus an int8 lo
 * against an int8 copy of the panel (see cpu_gemm_precision); where AMX is
 * used (cpu_gemm_amx), tdpbf16ps on weight rows as A tiles and activations
 * as B tiles. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/numeric.h"
#include "cpu_amx.h"
#include "cpu_ref.h"
#include "cpu_simd.h"
#include "quant.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,avx512vbmi,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))
#define MIN(a, b) ((a) < (b) ? (a) : (b))

cpu_gemm_prec cpu_gemm_precision = CPU_GEMM_HILO8;
_Thread_local bool cpu_gemm_amx;
int cpu_gemm_min_tokens = 16;

/* ---- widening loads ---------------------------------------------------- */

/* 16 e4m3 codes -> their values times 2^-8. */
AVX512 INLINE __m512 fp8x16_to_f32(__m128i b)
{
    __m256i h = _mm256_cvtepi8_epi16(b); /* sign copied into bits 8..15 */
    h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(h);
}

/* 32 e4m3 codes at once (16-bit shifts on a whole zmm: fewer ops per weight). */
AVX512 INLINE void fp8x32_to_f32(__m256i b, __m512 *lo, __m512 *hi)
{
    __m512i h = _mm512_cvtepi8_epi16(b);
    h = _mm512_and_si512(_mm512_slli_epi16(h, 7), _mm512_set1_epi16((short)0xBF80));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

AVX512 INLINE __m512 bf16x16_to_f32(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Elements k..k+15 of a weight row (mask m selects the valid ones). */
AVX512 INLINE __m512 load_w(ds_wfmt f, const void *row, int k, __mmask16 m)
{
    if (f == DS_W_FP8) return fp8x16_to_f32(_mm_maskz_loadu_epi8(m, (const uint8_t *)row + k));
    if (f == DS_W_BF16) return bf16x16_to_f32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k));
    return _mm512_maskz_loadu_ps(m, (const float *)row + k);
}

static const void *w_row(const ds_weight *w, int r)
{
    size_t esz = w->fmt == DS_W_FP8 ? 1 : w->fmt == DS_W_BF16 ? 2 : 4;
    return (const uint8_t *)w->data + (size_t)r * w->cols * esz;
}

static __mmask16 mask16(int n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

/* exp(x) for a vector: Cephes' expf polynomial after x = n ln2 + r, |r| <= ln2/2;
 * about 1 ulp. Large negative x gives 0, large positive +inf. */
AVX512 INLINE __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* ---- decode: y[t][r] = W[r] . xs[t], one row, T <= 4 tokens -------------
 * One row at a time, so the weight is read strictly sequentially (the rows of
 * a matrix are contiguous) with software prefetch 12 KiB ahead into L2
 * (prefetcht2): where the checkpoint is mapped with 4 KiB pages the hardware
 * prefetchers stop at every page boundary, and even with 2 MiB pages they run
 * too little ahead of a loop that also computes. Four chunks of 16 in flight
 * per token hide FMA latency.
 *   Why 12 KiB into L2 (Zen 4 EPYC, 2 threads, bench/matvec.sh's 1 GiB
 * matvec beside a 61-65 GB/s read, alternated builds): FP8 into L1
 * (prefetcht0) 6 KiB ahead 26-28 GB/s, no prefetch 17; into L2 8 / 12 / 16 /
 * 24 KiB ahead 51-52 / 53-56 / 54-57 / 54-56, the kernel's ceiling from L2
 * being ~56. BF16 42-43 against 22-23 into L1. Model decode (8-layer bench,
 * FP8) 38-40 tok/s against 24-25. Prefetches into L1 hold the core's few L1
 * miss buffers; L2 has many more. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 12288
#endif
#define PREFETCH_HINT _MM_HINT_T2
/* Activation bytes of one column piece of a long row (see gemv_rows). */
#ifndef GEMV_X_BYTES
#define GEMV_X_BYTES 16384
#endif

AVX512 INLINE void gemv_tile(ds_wfmt f, int T, const ds_weight *w, int r, const float *xs, size_t ldx, float *y,
                             size_t ldy)
{
    int K = w->cols, esz = f == DS_W_FP8 ? 1 : f == DS_W_BF16 ? 2 : 4;
    const char *row = w_row(w, r);
    __m512 acc[4][4];
    for (int u = 0; u < 4; u++)
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[u][t] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 64 <= K; k += 64) {
        #pragma GCC unroll 16
        for (int c = 0; c < esz; c++) _mm_prefetch(row + (size_t)k * esz + PREFETCH_BYTES + 64 * c, PREFETCH_HINT);
        __m512 wv[4];
        #pragma GCC unroll 16
        for (int u = 0; u < 4; u++) wv[u] = load_w(f, row, k + 16 * u, 0xFFFF);
        #pragma GCC unroll 16
        for (int u = 0; u < 4; u++)
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++)
                acc[u][t] = _mm512_fmadd_ps(wv[u], _mm512_loadu_ps(xs + t * ldx + k + 16 * u), acc[u][t]);
    }
    for (; k < K; k += 16) {
        __mmask16 m = mask16(K - k);
        __m512 wv = load_w(f, row, k, m);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[0][t] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, xs + t * ldx + k), acc[0][t]);
    }
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++)
        y[t * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]),
                                                        _mm512_add_ps(acc[2][t], acc[3][t])));
}

#define GEMV_CASES(F)                                                              \
    switch (T) {                                                                   \
    case 4: gemv_tile(F, 4, w, r, xs, ldx, y, ldy); break;                         \
    case 3: gemv_tile(F, 3, w, r, xs, ldx, y, ldy); break;                         \
    case 2: gemv_tile(F, 2, w, r, xs, ldx, y, ldy); break;                         \
    default: gemv_tile(F, 1, w, r, xs, ldx, y, ldy); break;                        \
    }

/* ---- decode, BF16 weights ------------------------------------------------
 * 32 weights per 512-bit load: the even-numbered ones are the 32-bit lanes
 * shifted left 16, the odd-numbered ones the lanes masked to their high half,
 * each a float32 exactly. The activations come permuted to match
 * (prep_bf16_acts), so one load and two operations widen 32 weights, where
 * bf16x16_to_f32 takes a 256-bit load and two operations for 16. No software
 * prefetch: the hardware prefetchers keep up with this loop.
 *   Measured (Zen 4, 2 threads, 1 GiB on 2 MiB pages, alternated builds):
 * this loop without prefetch 53-58 GB/s beside a read of 54-57; with
 * prefetcht2 12 or 24 KiB ahead 45-46; the bf16x16_to_f32 form 42-46 either way. */

/* xp[t]: per 32 columns, the 16 of even number, then the 16 odd ones; the
 * columns past the last multiple of 32 as they are. */
AVX512 static void prep_bf16_acts(float *xp, const float *x, int n, int K)
{
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    int K32 = K / 32 * 32;
    for (int t = 0; t < n; t++) {
        const float *xi = x + (size_t)t * K;
        float *o = xp + (size_t)t * K;
        for (int k = 0; k < K32; k += 32) {
            __m512 a = _mm512_loadu_ps(xi + k), b = _mm512_loadu_ps(xi + k + 16);
            _mm512_storeu_ps(o + k, _mm512_permutex2var_ps(a, ev, b));
            _mm512_storeu_ps(o + k + 16, _mm512_permutex2var_ps(a, od, b));
        }
        for (int k = K32; k < K; k++) o[k] = xi[k];
    }
}

/* Row r against T <= 4 tokens of prep_bf16_acts' activations. shifted: row
 * starts off a 64-byte line, at a multiple of 4 bytes (a safetensors file's
 * data need only be 8-byte aligned, and a tensor's rows then all start at the
 * same place in a line). The loop then loads whole lines and moves the row's
 * 32 weights into place with one vpermt2d from two of them: a 64-byte load
 * across two lines costs this loop a third of its speed (Zen 5, 2 threads,
 * 1 GiB at 8 bytes past a line: 30-34 GB/s against 45-49 aligned, beside a
 * read of 55-68; bench/matvec.sh). */
AVX512 INLINE void gemv_bf16_tile(int T, bool shifted, const uint16_t *row, int K, size_t pf, const float *xp,
                                  size_t ldx, float *y, size_t ldy, bool add)
{
    int K64 = K / 64 * 64, K32 = K / 32 * 32;
    const __m512i hm = _mm512_set1_epi32((int)0xFFFF0000);
    __m512 acc[4][4];
    #pragma GCC unroll 16
    for (int u = 0; u < 4; u++)
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[u][t] = _mm512_setzero_ps();
    /* shifted: line[k / 2 + sh + i] is row's 32-bit word k / 2 + i */
    const uint32_t *line = (const uint32_t *)((uintptr_t)row & ~(uintptr_t)63);
    const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32((int)((const uint32_t *)row - line)));
    /* the first and the last line are loaded masked to the row's own words:
     * the reads never leave the tensor (what sanitizers check) */
    int sh = (int)((const uint32_t *)row - line), tail = K / 2 + sh - K64 / 2;
    __mmask16 last = tail >= 16 ? (__mmask16)0xFFFF : tail <= 0 ? 0 : (__mmask16)((1u << tail) - 1);
    __m512i l0 = shifted ? _mm512_maskz_load_epi32((__mmask16)(0xFFFFu << sh), line) : _mm512_setzero_si512();
    int k = 0;
    for (; k < K64; k += 64) {
        if (pf) {
            _mm_prefetch((const char *)(row + k) + pf, PREFETCH_HINT);
            _mm_prefetch((const char *)(row + k) + pf + 64, PREFETCH_HINT);
        }
        __m512i v0, v1;
        if (shifted) {
            __m512i l1 = _mm512_load_si512(line + k / 2 + 16);
            __m512i l2 = k + 64 < K64 ? _mm512_load_si512(line + k / 2 + 32)
                                      : _mm512_maskz_load_epi32(last, line + k / 2 + 32);
            v0 = _mm512_permutex2var_epi32(l0, idx, l1);
            v1 = _mm512_permutex2var_epi32(l1, idx, l2);
            l0 = l2;
        } else {
            v0 = _mm512_loadu_si512(row + k);
            v1 = _mm512_loadu_si512(row + k + 32);
        }
        __m512 wv[4] = {_mm512_castsi512_ps(_mm512_slli_epi32(v0, 16)), _mm512_castsi512_ps(_mm512_and_si512(v0, hm)),
                        _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16)), _mm512_castsi512_ps(_mm512_and_si512(v1, hm))};
        #pragma GCC unroll 16
        for (int u = 0; u < 4; u++)
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++)
                acc[u][t] = _mm512_fmadd_ps(wv[u], _mm512_loadu_ps(xp + t * ldx + k + 16 * u), acc[u][t]);
    }
    if (k < K32) {
        __m512i v0 = _mm512_loadu_si512(row + k);
        __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v0, 16)), wo = _mm512_castsi512_ps(_mm512_and_si512(v0, hm));
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            acc[0][t] = _mm512_fmadd_ps(we, _mm512_loadu_ps(xp + t * ldx + k), acc[0][t]);
            acc[1][t] = _mm512_fmadd_ps(wo, _mm512_loadu_ps(xp + t * ldx + k + 16), acc[1][t]);
        }
        k += 32;
    }
    for (; k < K; k += 16) {
        __mmask16 m = mask16(K - k);
        __m512 wv = load_w(DS_W_BF16, row, k, m);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[0][t] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, xp + t * ldx + k), acc[0][t]);
    }
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        float v = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]), _mm512_add_ps(acc[2][t], acc[3][t])));
        y[t * ldy] = add ? y[t * ldy] + v : v;
    }
}

/* Columns [k0, k0 + K) of row r (k0 a multiple of 32); add: onto y. */
AVX512 static void gemv_bf16(int T, const ds_weight *w, int r, int k0, int K, size_t pf, const float *xp, size_t ldx,
                             float *y, size_t ldy, bool add)
{
    const uint16_t *row = (const uint16_t *)w_row(w, r) + k0;
    xp += k0;
    uintptr_t at = (uintptr_t)row & 63;
    bool shifted = at && !(at & 3);
    switch (T * 2 + shifted) {
    case 9: gemv_bf16_tile(4, true, row, K, pf, xp, ldx, y, ldy, add); break;
    case 8: gemv_bf16_tile(4, false, row, K, pf, xp, ldx, y, ldy, add); break;
    case 7: gemv_bf16_tile(3, true, row, K, pf, xp, ldx, y, ldy, add); break;
    case 6: gemv_bf16_tile(3, false, row, K, pf, xp, ldx, y, ldy, add); break;
    case 5: gemv_bf16_tile(2, true, row, K, pf, xp, ldx, y, ldy, add); break;
    case 4: gemv_bf16_tile(2, false, row, K, pf, xp, ldx, y, ldy, add); break;
    case 3: gemv_bf16_tile(1, true, row, K, pf, xp, ldx, y, ldy, add); break;
    default: gemv_bf16_tile(1, false, row, K, pf, xp, ldx, y, ldy, add); break;
    }
}
AVX512 static void gemv_f32(int T, const ds_weight *w, int r, const float *xs, size_t ldx, float *y, size_t ldy)
{
    GEMV_CASES(DS_W_F32)
}

/* ---- decode, FP8 weights: vdpbf16ps -------------------------------------
 * Widening e4m3 to f32 costs more instructions than the FMA itself, and on a
 * two-core machine that is what limits an FP8 matvec. Widening to bf16 is
 * cheaper: the sign-extended code shifted left 4 and masked (0x87F0) is a bf16
 * of the value times 2^-120, exact for every normal e4m3 (exponent field
 * 1..15). vdpbf16ps multiplies 32 of those by 32 bf16 activations at once.
 * The activations are x * s * 2^56 split into a bf16 high part and a bf16
 * low part (x - hi), so that the products keep ~16 bits more than bf16 and the
 * error stays near float32's (two vdpbf16ps per 32 weights). Subnormal e4m3
 * (exponent field 0) would become bf16 subnormals, which vdpbf16ps reads as
 * zero: they are rare in real weights (|w| < 2^-6 of the block's unit), so a
 * chunk of 128 codes that holds one (found by one test of the raw bytes per
 * 64) takes a second pass for just those codes: a subnormal code is m 2^-9
 * (m its 3 mantissa bits), and bf16(m) from a table against the same bf16
 * activations sums into sub (fp8x64_sub_bf16). Columns past the last multiple
 * of 64 go through float32.
 *   acc  (vdpbf16ps) sums w x s 2^-64;  sub (vdpbf16ps) sums w x s 2^65;
 *   corr (float32) sums w x s 2^48. */

#define DP_XSHIFT 72057594037927936.0f /* 2^56 */

/* xs[t][k] = x[t][k] * s[rb][k/128] * 2^56 and, for k < K rounded down to 64,
 * xq[t]: per 64 columns, those of even number (32 bf16 highs, then 32 lows),
 * then those of odd number (the same), in fp8x64_to_bf16's order. */
AVX512 static void prep_fp8_acts(float *xs, uint16_t *xq, const float *x, int n, const ds_weight *w, int rb)
{
    int K = w->cols, kb = (K + DS_BLOCK - 1) / DS_BLOCK, K64 = K / 64 * 64;
    const float *srow = w->scale + (size_t)rb * kb;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    for (int t = 0; t < n; t++) {
        const float *xi = x + (size_t)t * K;
        float *o = xs + (size_t)t * K;
        uint16_t *q = xq + (size_t)t * K64 * 2;
        for (int k = 0; k < K64; k += 64) {
            __m512 sv = _mm512_set1_ps(srow[k / DS_BLOCK] * DP_XSHIFT);
            __m512 f[4];
            #pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                f[i] = _mm512_mul_ps(_mm512_loadu_ps(xi + k + 16 * i), sv);
                _mm512_storeu_ps(o + k + 16 * i, f[i]);
            }
            /* the even-numbered columns of the 64, then the odd ones (fp8x64_to_bf16's order) */
            __m512 part[2][2] = {{_mm512_permutex2var_ps(f[0], ev, f[1]), _mm512_permutex2var_ps(f[2], ev, f[3])},
                                 {_mm512_permutex2var_ps(f[0], od, f[1]), _mm512_permutex2var_ps(f[2], od, f[3])}};
            for (int h = 0; h < 2; h++) {
                __m512 a = part[h][0], b = part[h][1];
                __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(b, a);
                __m512 ah = bf16x16_to_f32(_mm512_castsi512_si256(hi)), bh = bf16x16_to_f32(_mm512_extracti64x4_epi64(hi, 1));
                __m512i lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, bh), _mm512_sub_ps(a, ah));
                _mm512_storeu_si512(q + 2 * k + 64 * h, hi);
                _mm512_storeu_si512(q + 2 * k + 64 * h + 32, lo);
            }
        }
        for (int k = K64; k < K; k += 16) { /* the float32 tail */
            __mmask16 m = mask16(K - k);
            __m512 sv = _mm512_set1_ps(srow[k / DS_BLOCK] * DP_XSHIFT);
            _mm512_mask_storeu_ps(o + k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xi + k), sv));
        }
    }
}

/* The 64 codes of v as two bf16 vectors (value * 2^-120; subnormal and zero
 * codes give 0): the even-numbered codes, then the odd ones. A 16-bit lane holds
 * an even code in its low byte and an odd one in its high byte; shifted
 * arithmetically right by 4 (the even one first moved up by 8), a code's 7 low
 * bits land on bits 4..10 with its sign on bit 15, and the mask keeps just those.
 * No lane-crossing widening, as fp8x32_to_f32 needs. */
AVX512 INLINE void fp8x64_to_bf16(__m512i v, __m512i *even, __m512i *odd)
{
    const __m512i m = _mm512_set1_epi16((short)0x87F0);
    *even = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(v, 8), 4), m);
    *odd = _mm512_and_si512(_mm512_srai_epi16(v, 4), m);
}

/* The subnormal codes of v (fp8x64_to_bf16's halves and order) as bf16 of m and
 * sign, m the code's mantissa (its value is m 2^-9); every other code gives +-0.
 * Done instead with float32 FMAs, this pass made a chunk that holds a subnormal
 * cost ~8 times a plain one (a 1 GiB FP8 matvec over a shard's raw bytes, where
 * 39% of the chunks do: 14.5 GB/s against 55.6 with those codes made normal). */
AVX512 INLINE void fp8x64_sub_bf16(__m512i v, __m512i *even, __m512i *odd)
{
    /* bf16 of 0..7 at index m (a subnormal code's low 5 bits) */
    const __m512i tab = _mm512_setr_epi32(0x3F800000, 0x40404000, 0x40A04080, 0x40E040C0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                          0, 0, 0);
    const __m512i sign = _mm512_set1_epi16((short)0x8000);
    __mmask32 ze = _mm512_testn_epi16_mask(v, _mm512_set1_epi16(0x0078));
    __mmask32 zo = _mm512_testn_epi16_mask(v, _mm512_set1_epi16(0x7800));
    __m512i e = _mm512_maskz_permutexvar_epi16(ze, v, tab);
    __m512i o = _mm512_maskz_permutexvar_epi16(zo, _mm512_srli_epi16(v, 8), tab);
    *even = _mm512_ternarylogic_epi32(e, _mm512_slli_epi16(v, 8), sign, 0xF8); /* e | (v << 8 & sign) */
    *odd = _mm512_ternarylogic_epi32(o, v, sign, 0xF8);
}

/* Codes p[0..31] (converted: X) against token t's bf16 activations q (32 highs,
 * then 32 lows), into chains c and c + 1. */
#define DP32(X, q, c)                                                                                        \
    do {                                                                                                     \
        acc[(c) % C][t] = _mm512_dpbf16_ps(acc[(c) % C][t], (__m512bh)(X), (__m512bh)_mm512_loadu_si512(q)); \
        acc[((c) + 1) % C][t] =                                                                              \
            _mm512_dpbf16_ps(acc[((c) + 1) % C][t], (__m512bh)(X), (__m512bh)_mm512_loadu_si512((q) + 32));  \
    } while (0)

/* sub[t] += the subnormal codes of the 64 in v against token t's bf16 activations q
 * (prep_fp8_acts' order: even highs, even lows, odd highs, odd lows) */
AVX512 INLINE void fp8_sub(__m512 *sub, int T, __m512i v, const uint16_t *q, size_t ldq)
{
    __m512i e, o;
    fp8x64_sub_bf16(v, &e, &o);
    for (int t = 0; t < T; t++) {
        const uint16_t *qt = q + t * ldq;
        sub[t] = _mm512_dpbf16_ps(sub[t], (__m512bh)e, (__m512bh)_mm512_loadu_si512(qt));
        sub[t] = _mm512_dpbf16_ps(sub[t], (__m512bh)e, (__m512bh)_mm512_loadu_si512(qt + 32));
        sub[t] = _mm512_dpbf16_ps(sub[t], (__m512bh)o, (__m512bh)_mm512_loadu_si512(qt + 64));
        sub[t] = _mm512_dpbf16_ps(sub[t], (__m512bh)o, (__m512bh)_mm512_loadu_si512(qt + 96));
    }
}

/* Alternatives measured slower (model decode on the 8-layer bench): BF16
 * weights through this tile (no widening at all) were 20-30% faster from L2,
 * level from 1 GiB of memory, and ~10% slower in the model than gemv_tile's
 * float32 FMAs. Two rows per tile at one token: see gemv_dp_pair.
 * Where the arithmetic stands (Zen 5 cores at ~3.4 GHz): vdpbf16ps and
 * float32 FMA both issue twice a cycle, with latencies of 6 and 4. A standalone copy of
 * the one-token loop takes 8.8 cycles per 128 codes from L1, and 16 chains instead of 8
 * did not shorten it (from L2: ~41 GB/s a core either way), so the 8 vdpbf16ps share
 * the vector pipes with the widening and the subnormal test rather than wait on their
 * latency. At two tokens 8 chains a token are ~10% faster from L2 than 4. The same
 * codes widened to float32 (vcvtph2ps, FMA) take 14.8 cycles. On Zen 4 (512-bit
 * operations in two halves, 3.65 GHz) the one-token loop takes ~14.4 cycles per
 * 128 codes from L2 (~32 GB/s a core); without the widening ~12.7, without the
 * activation loads or the subnormal test no shorter, two rows sharing the activation
 * loads ~13, the widening by GFNI affine maps and byte unpacks ~15.7. */
AVX512 INLINE void gemv_dp_tile(int T, bool shifted, const uint8_t *row, int K, size_t pf, const float *xs,
                                size_t ldx, const uint16_t *xq, size_t ldq, float *y, size_t ldy, bool add)
{
    int K64 = K / 64 * 64, K128 = K / 128 * 128;
    const __m512i e8 = _mm512_set1_epi8(0x78);
    /* shifted (gemv_bf16_tile's scheme): row starts sh 32-bit words into a line;
     * whole lines loaded, the row's 64 codes moved into place by one vpermt2d
     * from two of them; the first and the last line masked to the row's own words.
     * Loads across two lines cost this loop 10-15% from memory (Zen 5, 2 threads,
     * 1 GiB at K 2048 8 or 24 bytes past a line: 48 GB/s against 54-57 shifted) */
    const uint32_t *line = (const uint32_t *)((uintptr_t)row & ~(uintptr_t)63);
    int sh = (int)((const uint32_t *)row - line), tail = (K - K64) / 4 + sh;
    const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(sh));
    __mmask16 last = tail >= 16 ? (__mmask16)0xFFFF : tail <= 0 ? 0 : (__mmask16)((1u << tail) - 1);
    __m512i l0 = shifted ? _mm512_maskz_load_epi32((__mmask16)(0xFFFFu << sh), line) : _mm512_setzero_si512();
    /* line l of the row (l >= 1): whole, or masked if it is the one at K64 (a
     * masked load on every line instead measured 45.9 against 55.0 GB/s, 1 GiB
     * at K 2048 8 bytes past a line, read 66-72 GB/s, alternated) */
    #define DP_LINE(l) (16 * (l) < K64 / 4 ? _mm512_load_si512(line + 16 * (l)) \
                                            : _mm512_maskz_load_epi32(last, line + 16 * (l)))
    /* vdpbf16ps issues twice a cycle with a latency of 6: 8 independent chains
     * a token at one or two tokens (one token measured no faster with 16), 4 a
     * token beyond */
    enum { NC = 8 };
    const int C = T <= 2 ? 8 : 4;
    __m512 acc[NC][4], corr[4], sub[4];
    bool fixed = false, subbed = false; /* corr, sub hold something: skip their sums when not */
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        corr[t] = sub[t] = _mm512_setzero_ps();
        #pragma GCC unroll 16
        for (int c = 0; c < C; c++) acc[c][t] = _mm512_setzero_ps();
    }
    int k = 0;
    for (; k < K128; k += 128) {
        _mm_prefetch((const char *)row + k + pf, PREFETCH_HINT);
        _mm_prefetch((const char *)row + k + pf + 64, PREFETCH_HINT);
        /* an exponent field of 0 (a subnormal or zero code) on the raw bytes:
         * one test per 64 codes, a branch per 128 */
        __m512i V0, V1;
        if (shifted) {
            __m512i l1 = _mm512_load_si512(line + k / 4 + 16), l2 = DP_LINE(k / 64 + 2);
            V0 = _mm512_permutex2var_epi32(l0, idx, l1);
            V1 = _mm512_permutex2var_epi32(l1, idx, l2);
            l0 = l2;
        } else {
            V0 = _mm512_loadu_si512(row + k);
            V1 = _mm512_loadu_si512(row + k + 64);
        }
        __mmask64 z0 = _mm512_testn_epi8_mask(V0, e8), z1 = _mm512_testn_epi8_mask(V1, e8);
        if (__builtin_expect(!_kortestz_mask64_u8(z0, z1), 0)) {
            fp8_sub(sub, T, V0, xq + 2 * k, ldq);
            fp8_sub(sub, T, V1, xq + 2 * k + 128, ldq);
            subbed = true;
        }
        __m512i A, B, D, E;
        fp8x64_to_bf16(V0, &A, &B);
        fp8x64_to_bf16(V1, &D, &E);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            const uint16_t *q = xq + t * ldq + 2 * k;
            DP32(A, q, 0);
            DP32(B, q + 64, 2);
            DP32(D, q + 128, 4);
            DP32(E, q + 192, 6);
        }
    }
    if (k < K64) { /* one chunk of 64 */
        __m512i V0 = shifted ? _mm512_permutex2var_epi32(l0, idx, DP_LINE(k / 64 + 1)) : _mm512_loadu_si512(row + k), A, B;
        if (_mm512_testn_epi8_mask(V0, e8)) {
            fp8_sub(sub, T, V0, xq + 2 * k, ldq);
            subbed = true;
        }
        fp8x64_to_bf16(V0, &A, &B);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            const uint16_t *q = xq + t * ldq + 2 * k;
            DP32(A, q, 0);
            DP32(B, q + 64, 2);
        }
        k += 64;
    }
    for (; k < K; k += 16) {
        __mmask16 m = mask16(K - k);
        __m512 wv = fp8x16_to_f32(_mm_maskz_loadu_epi8(m, row + k));
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) corr[t] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, xs + t * ldx + k), corr[t]);
        fixed = true;
    }
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        __m512 s = acc[0][t];
        #pragma GCC unroll 16
        for (int c = 1; c < C; c++) s = _mm512_add_ps(s, acc[c][t]);
        float v = _mm512_reduce_add_ps(s) * 18446744073709551616.0f; /* 2^64 */
        if (subbed) v += _mm512_reduce_add_ps(sub[t]) * 2.7105054312137611e-20f; /* 2^-65 */
        if (fixed) v += _mm512_reduce_add_ps(corr[t]) * 3.5527136788005009e-15f; /* 2^-48 */
        y[t * ldy] = add ? y[t * ldy] + v : v;
    }
}
#undef DP_LINE
#undef DP32

/* ---- decode, FP8 weights, 2..8 tokens: two rows at a time ---------------
 * At one token gemv_dp_tile reads one row at a time: one stream per thread.
 * Two rows a tile sharing each activation load (gemv_dp_tile's 8 chains a
 * row) ran faster from L2 but slower from memory, the two rows being two
 * streams per thread for the prefetchers (Zen 5, 2 threads, 1 GiB at K 2048,
 * alternated in one process, read 58.7-64.0 GB/s): 47.2 GB/s against 55.4,
 * the MoE pattern of 6 of 64 experts 38.3 against 43.7; the same two-row
 * loop reading only (no arithmetic) 45 against a read of 57. Where the read
 * is much faster (82-84 GB/s, the same machine at another hour) the pair's
 * higher ceiling from L2 (78 against 68 GB/s) wins back a little: the 8-layer
 * FP8 model's tg32 52.5-52.7 tok/s one row at a time (with gemv_dp_tile's
 * whole-line loads) against 55.0-55.7 in pairs with loads across lines (at
 * 58-63 GB/s: 43.9-46.3 against 34.1-39.7). From 2 tokens up the tile is
 * compute-bound and the pair wins (below). */

/* dp2_sub for T tokens: sub[t] row 0's, sub[T + t] row 1's. */
AVX512 static __attribute__((noinline)) void dp2_subT(int T, float sub[16][16], __m512i V0, __m512i V1,
                                                      const uint16_t *q, size_t ldq)
{
    for (int t = 0; t < T; t++) {
        __m512 s0 = _mm512_loadu_ps(sub[t]), s1 = _mm512_loadu_ps(sub[T + t]);
        fp8_sub(&s0, 1, V0, q + t * ldq, 0);
        fp8_sub(&s1, 1, V1, q + t * ldq, 0);
        _mm512_storeu_ps(sub[t], s0);
        _mm512_storeu_ps(sub[T + t], s1);
    }
}

/* Two rows (row and row + ldr) at once for T = 2..8 tokens (token t's
 * activations at xq + t ldq, its outputs at y + t ldy): NC chains a row and
 * token, at most 16 sums. At one token the one-row tile is faster from
 * memory (two streams a thread follow worse). At several
 * tokens the one-row tile loads 8 T activation vectors per 128 codes for 8 T
 * vdpbf16ps; here two rows share them, and past 4 tokens each row's codes are
 * widened once for all 8 (gemv_dp_tile takes 4 tokens a tile). Cycles per 128
 * codes of a row for all tokens (bench/matvec.sh fp8's one-thread lines), here
 * against gemv_dp_tile: 2 tokens 21.2-21.7 / 24.2-24.5, 4 40.1-40.7 /
 * 45.3-46.5, 8 79.8 / 102.6 (two tiles of 4 pairs: ~83). */
AVX512 INLINE void gemv_dp_pair(int T, bool shifted, const uint8_t *row, size_t ldr, int K, size_t pf,
                                const uint16_t *xq, size_t ldq, float *y, size_t ldy, bool add)
{
    const int NC = T == 2 ? 4 : T <= 4 ? 2 : 1;
    const uint8_t *row1 = row + ldr;
    /* shifted: both rows sh 32-bit words into a line (gemv_dp_tile's scheme) */
    const uint32_t *la = (const uint32_t *)((uintptr_t)row & ~(uintptr_t)63);
    const uint32_t *lb = (const uint32_t *)((uintptr_t)row1 & ~(uintptr_t)63);
    int sh = (int)((const uint32_t *)row - la);
    const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(sh));
    const __mmask16 last = (__mmask16)((1u << sh) - 1);
    __m512i l0a = shifted ? _mm512_maskz_load_epi32((__mmask16)(0xFFFFu << sh), la) : _mm512_setzero_si512();
    __m512i l0b = shifted ? _mm512_maskz_load_epi32((__mmask16)(0xFFFFu << sh), lb) : _mm512_setzero_si512();
    const __m512i e8 = _mm512_set1_epi8(0x78);
    __m512 acc[2][4][8];
    float sub[16][16]; /* zeroed when first used */
    bool subbed = false;
    #pragma GCC unroll 4
    for (int c = 0; c < NC; c++)
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[0][c][t] = acc[1][c][t] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 64) {
        if (k % 128 == 0) {
            _mm_prefetch((const char *)row + k + pf, PREFETCH_HINT);
            _mm_prefetch((const char *)row + k + pf + 64, PREFETCH_HINT);
            _mm_prefetch((const char *)row1 + k + pf, PREFETCH_HINT);
            _mm_prefetch((const char *)row1 + k + pf + 64, PREFETCH_HINT);
        }
        __m512i V0, V1;
        if (shifted) {
            __mmask16 m = k + 64 < K ? (__mmask16)0xFFFF : last;
            __m512i l1a = _mm512_maskz_load_epi32(m, la + k / 4 + 16), l1b = _mm512_maskz_load_epi32(m, lb + k / 4 + 16);
            V0 = _mm512_permutex2var_epi32(l0a, idx, l1a);
            V1 = _mm512_permutex2var_epi32(l0b, idx, l1b);
            l0a = l1a;
            l0b = l1b;
        } else {
            V0 = _mm512_loadu_si512(row + k);
            V1 = _mm512_loadu_si512(row1 + k);
        }
        __mmask64 z0 = _mm512_testn_epi8_mask(V0, e8), z1 = _mm512_testn_epi8_mask(V1, e8);
        if (__builtin_expect(!_kortestz_mask64_u8(z0, z1), 0)) {
            if (!subbed) memset(sub, 0, sizeof sub);
            dp2_subT(T, sub, V0, V1, xq + 2 * k, ldq);
            subbed = true;
        }
        __m512i A, B, D, E;
        fp8x64_to_bf16(V0, &A, &B);
        fp8x64_to_bf16(V1, &D, &E);
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const uint16_t *q = xq + t * ldq + 2 * k;
            __m512bh h = (__m512bh)_mm512_loadu_si512(q), l = (__m512bh)_mm512_loadu_si512(q + 32);
            acc[0][0][t] = _mm512_dpbf16_ps(acc[0][0][t], (__m512bh)A, h);
            acc[0][1 % NC][t] = _mm512_dpbf16_ps(acc[0][1 % NC][t], (__m512bh)A, l);
            acc[1][0][t] = _mm512_dpbf16_ps(acc[1][0][t], (__m512bh)D, h);
            acc[1][1 % NC][t] = _mm512_dpbf16_ps(acc[1][1 % NC][t], (__m512bh)D, l);
            h = (__m512bh)_mm512_loadu_si512(q + 64);
            l = (__m512bh)_mm512_loadu_si512(q + 96);
            acc[0][2 % NC][t] = _mm512_dpbf16_ps(acc[0][2 % NC][t], (__m512bh)B, h);
            acc[0][3 % NC][t] = _mm512_dpbf16_ps(acc[0][3 % NC][t], (__m512bh)B, l);
            acc[1][2 % NC][t] = _mm512_dpbf16_ps(acc[1][2 % NC][t], (__m512bh)E, h);
            acc[1][3 % NC][t] = _mm512_dpbf16_ps(acc[1][3 % NC][t], (__m512bh)E, l);
        }
    }
    #pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512 s = acc[r][0][t];
            #pragma GCC unroll 4
            for (int c = 1; c < NC; c++) s = _mm512_add_ps(s, acc[r][c][t]);
            float v = _mm512_reduce_add_ps(s) * 18446744073709551616.0f; /* 2^64 */
            if (subbed) v += _mm512_reduce_add_ps(_mm512_loadu_ps(sub[r * T + t])) * 2.7105054312137611e-20f;
            float *o = y + t * ldy + r;
            *o = add ? *o + v : v;
        }
}

AVX512 static void gemv_dp_pairs(int T, const uint8_t *row, size_t ldr, int K, size_t pf, const uint16_t *xq,
                                 size_t ldq, float *y, size_t ldy, bool add)
{
    /* whole lines (gemv_dp_tile's scheme) up to 4 tokens; from 5 the loop is
     * compute-bound and the permutes cost more than the loads across lines
     * save (Zen 5, 2 threads, 1 GiB at K 2048 8 bytes past a line, read 78-80
     * GB/s, alternated: 2 tokens 57.4 against 41.3 GB/s, 4 30.4 against 29.6,
     * 8 17.2 against 18.5) */
    uintptr_t at = (uintptr_t)row & 63;
    bool shifted = T <= 4 && at && !(at & 3) && ldr % 64 == 0;
    #define PAIR(n)                                                                                         \
        (shifted ? gemv_dp_pair(n, true, row, ldr, K, pf, xq, ldq, y, ldy, add)                             \
                 : gemv_dp_pair(n, false, row, ldr, K, pf, xq, ldq, y, ldy, add))
    switch (T) {
    case 8: PAIR(8); break;
    case 7: PAIR(7); break;
    case 6: PAIR(6); break;
    case 5: PAIR(5); break;
    case 4: PAIR(4); break;
    case 3: PAIR(3); break;
    case 2: PAIR(2); break;
    default: PAIR(1); break; /* the 9th of 9 tokens */
    }
    #undef PAIR
}

/* Columns [k0, k0 + K) of row r (k0 a multiple of 128); pf: how far ahead of
 * what it reads the tile prefetches; add: onto y. */
AVX512 static void gemv_fp8_dp(int T, const ds_weight *w, int r, int k0, int K, size_t pf, const float *xs, size_t ldx,
                               const uint16_t *xq, size_t ldq, float *y, size_t ldy, bool add)
{
    const uint8_t *row = (const uint8_t *)w_row(w, r) + k0;
    xs += k0;
    xq += 2 * (size_t)k0;
    uintptr_t at = (uintptr_t)row & 63;
    bool shifted = at && !(at & 3) && K >= 64 && K % 4 == 0;
    switch (T * 2 + shifted) {
    case 9: gemv_dp_tile(4, true, row, K, pf, xs, ldx, xq, ldq, y, ldy, add); break;
    case 8: gemv_dp_tile(4, false, row, K, pf, xs, ldx, xq, ldq, y, ldy, add); break;
    case 7: gemv_dp_tile(3, true, row, K, pf, xs, ldx, xq, ldq, y, ldy, add); break;
    case 6: gemv_dp_tile(3, false, row, K, pf, xs, ldx, xq, ldq, y, ldy, add); break;
    case 5: gemv_dp_tile(2, true, row, K, pf, xs, ldx, xq, ldq, y, ldy, add); break;
    case 4: gemv_dp_tile(2, false, row, K, pf, xs, ldx, xq, ldq, y, ldy, add); break;
    case 3: gemv_dp_tile(1, true, row, K, pf, xs, ldx, xq, ldq, y, ldy, add); break;
    default: gemv_dp_tile(1, false, row, K, pf, xs, ldx, xq, ldq, y, ldy, add); break;
    }
}

/* Rows [a, b) (relative to row0, one FP8 scale block) for all n tokens; xq:
 * prep_fp8_acts' bf16 activations for FP8 weights. */
AVX512 static void gemv_rows(float *y, const float *xs, const uint16_t *xq, int n, const ds_weight *w, int row0,
                             int rows, int a, int b)
{
    int K = w->cols;
    size_t ldx = (size_t)K, ldq = (size_t)K / 64 * 128;
    if (w->fmt == DS_W_F32) {
        for (int r = a; r < b; r++)
            for (int t0 = 0; t0 < n; t0 += 4)
                gemv_f32(MIN(4, n - t0), w, row0 + r, xs + (size_t)t0 * ldx, ldx, y + (size_t)t0 * rows + r,
                         (size_t)rows);
        return;
    }
    /* Long rows go in column pieces of GEMV_X_BYTES of activations, every row
     * of [a, b) for one piece before the next, so that the piece stays in L1
     * while the weights stream past it. The weights are then read in runs of
     * a piece with a stride of a row, so both tiles prefetch the same piece of
     * a later row into L2 (whole rows ahead, ~PREFETCH_BYTES of reading).
     *   In pieces against whole rows (Zen 4, 2 threads, bench/matvec.sh's
     * 1 GiB matvec at long K, alternated builds, read 36-67 GB/s): FP8 at K 7168
     * (28 KB of hi + lo) 28-42 against 20-21 GB/s, K 16384 31-39 against 17;
     * BF16 at K 18432 33-44 against 24.5 (21.5 in pieces without the prefetch:
     * the hardware's does not follow the stride). K 4096 (16 KB) stays whole:
     * in two pieces it ran at 39 against 50. */
    bool fp8 = w->fmt == DS_W_FP8;
    int kc;
    size_t row_pf; /* whole rows ahead when in pieces, else 0 (activations: FP8 bf16 hi + lo, BF16 float32) */
    cpu_decode_pieces(K, n, fp8 ? 1 : 2, GEMV_X_BYTES, PREFETCH_BYTES, &kc, &row_pf);
    size_t fp8_pf = row_pf ? row_pf : PREFETCH_BYTES; /* BF16 whole rows: the hardware prefetches */

    for (int k0 = 0; k0 < K; k0 += kc) {
        int len = MIN(kc, K - k0), r = a;
        if (fp8 && n >= 2 && len % 64 == 0) { /* rows in pairs (gemv_dp_pair) */
            size_t ldr = (size_t)((const uint8_t *)w_row(w, row0 + 1) - (const uint8_t *)w_row(w, row0));
            for (; r + 2 <= b; r += 2)
                for (int t0 = 0; t0 < n; t0 += 8)
                    gemv_dp_pairs(MIN(8, n - t0), (const uint8_t *)w_row(w, row0 + r) + k0, ldr, len, fp8_pf,
                                  xq + (size_t)t0 * ldq + 2 * (size_t)k0, ldq, y + (size_t)t0 * rows + r, (size_t)rows,
                                  k0 > 0);
        }
        for (; r < b; r++)
            for (int t0 = 0; t0 < n; t0 += 4) {
                int T = MIN(4, n - t0);
                float *yo = y + (size_t)t0 * rows + r;
                const float *xo = xs + (size_t)t0 * ldx;
                if (fp8) gemv_fp8_dp(T, w, row0 + r, k0, len, fp8_pf, xo, ldx, xq + (size_t)t0 * ldq, ldq, yo, (size_t)rows, k0 > 0);
                else gemv_bf16(T, w, row0 + r, k0, len, row_pf, xo, ldx, yo, (size_t)rows, k0 > 0);
            }
    }
}

/* Rows [a, b) of job j on the calling thread (a cpu_decode_rows_fn). xs: this
 * thread's scratch for the prepared activations; st: what it holds. */
AVX512 static void decode_rows(const ds_matmul_job *j, int a, int b, float *xs, cpu_decode_state *st)
{
    const ds_matmul_job **cj = &st->job;
    int *crb = &st->rb;
    const ds_weight *w = j->w;
    bool fp8 = w->fmt == DS_W_FP8, bf16 = w->fmt == DS_W_BF16;
    uint16_t *xq = (uint16_t *)(xs + (size_t)j->n * w->cols);
    if (bf16 && j != *cj) prep_bf16_acts(xs, j->x, j->n, w->cols);
    if (bf16) *cj = j;
    while (a < b) {
        int e = b;
        if (fp8) {
            int rb = (j->row0 + a) / DS_BLOCK;
            e = MIN(b, (rb + 1) * DS_BLOCK - j->row0);
            if (rb != *crb || j != *cj) prep_fp8_acts(xs, xq, j->x, j->n, w, *crb = rb);
            *cj = j;
        }
        gemv_rows(j->y, fp8 || bf16 ? xs : j->x, xq, j->n, w, j->row0, j->rows, a, e);
        a = e;
    }
}

/* decode_many's per-unit work (cpu_decode.c) on these kernels: activations
 * FP8 f32 then bf16 hi + lo, BF16 f32 permuted, 2 floats a column and token. */
static void decode_many(const ds_matmul_job *jobs, int nj) { cpu_decode_many(jobs, nj, 2, decode_rows); }

AVX512 void avx512_matmul_decode(float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    ds_matmul_job j = {y, x, n, w, row0, rows};
    decode_many(&j, 1);
}

/* The FP8 GEMM path (gemm_impl fp8): the reference quantises a product's input
 * (act_quant) and runs its block-scaled fp8_gemm. Here the input is rounded as
 * act_quant rounds it (act_fake_quant) and the usual kernels follow: they compute
 * sum_b s_w sum_k (q_x s_x) q_w, the reference's sum_b s_x s_w sum_k q_x q_w but for
 * float rounding. */
static bool fp8q(ds_gemm_impl gemm, const ds_weight *w) { return gemm == DS_GEMM_FP8 && w->fmt == DS_W_FP8; }

/* f32_round_fp8_e4m3 on 16 lanes: the step 2^(ue-3) from the exponent (vgetexpps, at
 * least -6; -inf for 0), a / step rounded to nearest even, saturated at 448, the sign
 * put back; NaN lanes stay NaN. */
AVX512 INLINE __m512 round_e4m3(__m512 v)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 a = _mm512_andnot_ps(sign, v);
    __m512 e = _mm512_max_ps(_mm512_getexp_ps(a), _mm512_set1_ps(-6.0f));
    __m512 q = _mm512_roundscale_ps(_mm512_scalef_ps(a, _mm512_sub_ps(_mm512_set1_ps(3.0f), e)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_min_ps(_mm512_scalef_ps(q, _mm512_sub_ps(e, _mm512_set1_ps(3.0f))), _mm512_set1_ps(448.0f));
    r = _mm512_or_ps(r, _mm512_and_ps(v, sign));
    return _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
}

AVX512 void avx512_act_fake_quant(const float *x, int m, int k, float *y, bool ue8m0)
{
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    #pragma omp parallel for schedule(static) if ((size_t)m * k >= 65536)
    for (int i = 0; i < m; i++)
        for (int b = 0; b < kb; b++) {
            const float *xi = x + (size_t)i * k;
            float *yi = y + (size_t)i * k;
            int k0 = b * DS_BLOCK, k1 = MIN(k0 + DS_BLOCK, k);
            __m512 mx = _mm512_setzero_ps();
            for (int j = k0; j < k1; j += 16) {
                __mmask16 msk = mask16(k1 - j);
                /* vmaxps gives its second operand when either is NaN: NaN in x is skipped,
                 * as fmaxf skips it in the scalar amax */
                mx = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(msk, xi + j)), mx);
            }
            __m512 sv = _mm512_set1_ps(act_quant_scale(_mm512_reduce_max_ps(mx), ue8m0));
            for (int j = k0; j < k1; j += 16) {
                __mmask16 msk = mask16(k1 - j);
                __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(msk, xi + j), sv);
                _mm512_mask_storeu_ps(yi + j, msk, _mm512_mul_ps(round_e4m3(v), sv));
            }
        }
}

#define GEMM_MAX_JOBS 32 /* GEMMs in one parallel region (matmul_many) */
AVX512 static void gemm_jobs(const ds_matmul_job *jobs, int nj);
static bool gemm_job(const ds_matmul_job *j);

AVX512 void avx512_matmul_many(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0)
{
    bool each = false, q = false;
    for (int i = 0; i < n_jobs; i++) {
        each |= jobs[i].n >= cpu_gemm_min_tokens;
        q |= fp8q(gemm, jobs[i].w);
    }
    if (!each && !q) {
        decode_many(jobs, n_jobs);
        return;
    }
    if (q) { /* the FP8-weight jobs' inputs rounded, once per distinct input */
        ds_matmul_job *qj = malloc(sizeof(ds_matmul_job) * (size_t)n_jobs);
        float **own = calloc((size_t)n_jobs, sizeof(float *));
        bool ok = qj && own;
        if (!ok) cpu_fail_oom("FP8 GEMM jobs", sizeof(ds_matmul_job) * (size_t)n_jobs);
        for (int i = 0; ok && i < n_jobs; i++) {
            qj[i] = jobs[i];
            if (!fp8q(gemm, jobs[i].w)) continue;
            for (int p = 0; p < i && !own[i]; p++)
                if (own[p] && jobs[p].x == jobs[i].x && jobs[p].n == jobs[i].n && jobs[p].w->cols == jobs[i].w->cols)
                    qj[i].x = qj[p].x;
            if (qj[i].x == jobs[i].x) {
                ok = (own[i] = act_fake_quant_copy(jobs[i].x, jobs[i].n, jobs[i].w->cols, ue8m0, avx512_act_fake_quant)) != NULL;
                qj[i].x = own[i];
            }
        }
        if (ok && !each) decode_many(qj, n_jobs);
        for (int i = 0; ok && each && i < n_jobs; i++) /* inputs rounded above: the exact-dequantisation path */
            avx512_matmul(qj[i].y, qj[i].x, qj[i].n, qj[i].w, qj[i].row0, qj[i].rows,
                          fp8q(gemm, qj[i].w) ? DS_GEMM_BF16 : gemm, ue8m0);
        for (int i = 0; own && i < n_jobs; i++) free(own[i]);
        free(own);
        free(qj);
        return;
    }
    /* the GEMM jobs in regions of up to GEMM_MAX_JOBS, the rest on the decode kernel */
    ds_matmul_job g[GEMM_MAX_JOBS];
    int ng = 0;
    for (int i = 0; i < n_jobs; i++) {
        if (!gemm_job(&jobs[i])) {
            avx512_matmul(jobs[i].y, jobs[i].x, jobs[i].n, jobs[i].w, jobs[i].row0, jobs[i].rows, gemm, ue8m0);
            continue;
        }
        g[ng++] = jobs[i];
        if (ng == GEMM_MAX_JOBS) {
            gemm_jobs(g, ng);
            ng = 0;
        }
    }
    if (ng) gemm_jobs(g, ng);
}

/* ---- prefill GEMM with vdpbf16ps ----------------------------------------
 * y[t][r] = sum_k x[t][k] w[r][k] in register tiles of 64 rows (4 zmm of 16
 * rows) x up to GEMM_GT tokens. A zmm of weights holds one k-pair
 * (w[r][2p], w[r][2p+1]) of 16 rows; each token's pair of activations is
 * broadcast (vpbroadcastd) and vdpbf16ps accumulates in place, so there are
 * no horizontal sums. Weights are widened to bf16 (exact for FP8 and BF16)
 * and packed into that layout once per matmul, a panel of 64 rows x GEMM_KC
 * columns at a time (16x16 transposes of pairs, about 1/8 op per weight);
 * FP8 block scales (times 2^8) multiply the accumulators after each
 * 128-column block. Activations are converted once per matmul: per token and
 * pair the bf16 hi pair and, in SPLIT precision, the lo pair (x - hi, rounded)
 * beside it: two vdpbf16ps per pair against the same weight register. */

#define GEMM_PANEL 64  /* rows per packed panel: 4 vectors of 16 */
#define GEMM_KC 1024   /* columns per packed chunk (multiple of 128): 128 KiB packed */
#define GEMM_GT 6      /* tokens per register tile: 24 accumulators */

static __mmask32 mask32(int n) { return n >= 32 ? 0xFFFFFFFFu : n <= 0 ? 0 : (__mmask32)((1u << n) - 1); }

/* Activation pairs of token t: xa[t][p] = bf16 (x[2p], x[2p+1]) or, split,
 * xa[t][2p] that hi pair and xa[t][2p+1] the lo pair; rows of ldx uint32.
 * x[K] (odd K) counts as 0. */
AVX512 static void gemm_acts(uint32_t *xa, size_t ldx, const float *x, int K, int t, bool split)
{
    int KP = (K + 1) / 2;
    const __m512i i0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(8));
    const float *xi = x + (size_t)t * K;
    uint32_t *o = xa + (size_t)t * ldx;
    for (int k = 0; k < K; k += 32) {
        __m512 a = _mm512_maskz_loadu_ps(mask16(K - k), xi + k);
        __m512 b = _mm512_maskz_loadu_ps(K - k > 16 ? mask16(K - k - 16) : 0, xi + k + 16);
        __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(b, a);
        int np = MIN(16, KP - k / 2); /* pairs in this block */
        if (!split) {
            _mm512_mask_storeu_epi32(o + k / 2, mask16(np), hi);
            continue;
        }
        __m512 ra = _mm512_sub_ps(a, bf16x16_to_f32(_mm512_castsi512_si256(hi)));
        __m512 rb = _mm512_sub_ps(b, bf16x16_to_f32(_mm512_extracti64x4_epi64(hi, 1)));
        __m512i lo = (__m512i)_mm512_cvtne2ps_pbh(rb, ra);
        _mm512_mask_storeu_epi32(o + k, mask16(2 * np), _mm512_permutex2var_epi32(hi, i0, lo));
        if (np > 8) _mm512_mask_storeu_epi32(o + k + 16, mask16(2 * np - 16), _mm512_permutex2var_epi32(hi, i1, lo));
    }
}

/* Weights k..k+31 of a row as 16 bf16 pairs; only the first nk are read. */
AVX512 INLINE __m512i load_pairs(ds_wfmt f, const void *row, int k, int nk)
{
    if (f == DS_W_BF16) return _mm512_maskz_loadu_epi16(mask32(nk), (const uint16_t *)row + k);
    __m512 lo, hi;
    fp8x32_to_f32(_mm256_maskz_loadu_epi8(mask32(nk), (const uint8_t *)row + k), &lo, &hi);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); /* exact: e4m3 fits in bf16 */
}

/* In-register transpose of a 16x16 matrix of 32-bit elements: 4x4 transposes
 * within 128-bit lanes, then a 4x4 transpose of the lanes. */
AVX512 INLINE void transpose16(__m512i r[16])
{
    __m512i t[16];
    #pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        __m512i t0 = _mm512_unpacklo_epi32(r[4 * g], r[4 * g + 1]), t1 = _mm512_unpackhi_epi32(r[4 * g], r[4 * g + 1]);
        __m512i t2 = _mm512_unpacklo_epi32(r[4 * g + 2], r[4 * g + 3]);
        __m512i t3 = _mm512_unpackhi_epi32(r[4 * g + 2], r[4 * g + 3]);
        t[4 * g] = _mm512_unpacklo_epi64(t0, t2);
        t[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);
        t[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
        t[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    /* t[4g + j], lane L: column 4L + j of rows 4g..4g+3 */
    #pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512i v0 = _mm512_shuffle_i32x4(t[j], t[4 + j], 0x44), v1 = _mm512_shuffle_i32x4(t[j], t[4 + j], 0xEE);
        __m512i v2 = _mm512_shuffle_i32x4(t[8 + j], t[12 + j], 0x44);
        __m512i v3 = _mm512_shuffle_i32x4(t[8 + j], t[12 + j], 0xEE);
        r[j] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        r[4 + j] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
        r[8 + j] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
}

/* The largest magnitude over columns [k, k+128) of a BF16 row (past K: 0),
 * as its bits without the sign (which order as the magnitudes). */
AVX512 static uint16_t bf16_block_max(const uint16_t *row, int k, int K)
{
    int nk = MIN(DS_BLOCK, K - k);
    const uint16_t *c = row + k;
    __m512i m = _mm512_setzero_si512();
    for (int j = 0; j < nk; j += 32)
        m = _mm512_max_epu16(m, _mm512_and_si512(_mm512_maskz_loadu_epi16(mask32(nk - j), c + j), _mm512_set1_epi16(0x7fff)));
    __m256i h = _mm256_max_epu16(_mm512_castsi512_si256(m), _mm512_extracti64x4_epi64(m, 1));
    __m128i q = _mm_max_epu16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    q = _mm_max_epu16(q, _mm_srli_si128(q, 8));
    q = _mm_max_epu16(q, _mm_srli_si128(q, 4));
    q = _mm_max_epu16(q, _mm_srli_si128(q, 2));
    return (uint16_t)(_mm_cvtsi128_si32(q) & 0xffff);
}

/* FP8 panels are packed by table look-up (vpermi2b picks a byte of a
 * 128-byte table by a code's low 7 bits): fp8_bf16[0][c] and [1][c] are the
 * low and high bytes of the bf16 of magnitude code c's value times 2^-8 (as
 * fp8x16_to_f32 widens it; the sign is the code's bit 7, bf16's bit 15), and
 * for HILO8 fp8_q8[m][c] is gemm_pack's int8 of magnitude c (+ 128) in a
 * block whose largest magnitude code is m. Both come from the arithmetic of
 * the BF16 weights' packing (widen, scale by 127 / max, round), so the panels
 * are those that arithmetic gives. Per 64 weights of a row that is 9
 * operations where the widening through fp16 and float32 took 27.
 *   Measured (Zen 5, one thread, a 64 x 2048 FP8 panel held in L2, HILO8):
 * 15.0 us a panel widened through float32, 13.0 by table, 10.6 with the
 * block maxima of 16 rows reduced together (fp8_block_max16) and the rows'
 * addresses and prefetches worked out once a step; 48 tokens' tiles against
 * the panel are 295 k dot-product instructions, ~45 us at 2 a cycle. */
static uint8_t fp8_bf16[2][128] __attribute__((aligned(64)));
static uint8_t fp8_q8[128][128] __attribute__((aligned(64)));
static pthread_once_t fp8_tables_once = PTHREAD_ONCE_INIT;

AVX512 static void fp8_tables_init(void)
{
    for (int c0 = 0; c0 < 128; c0 += 16) {
        __m512 f = fp8x16_to_f32(_mm_add_epi8(_mm_set1_epi8((char)c0), _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)));
        __m256i h = (__m256i)_mm512_cvtneps_pbh(f);
        _mm_storeu_si128((__m128i *)&fp8_bf16[0][c0], _mm256_cvtepi16_epi8(_mm256_and_si256(h, _mm256_set1_epi16(0xff))));
        _mm_storeu_si128((__m128i *)&fp8_bf16[1][c0], _mm256_cvtepi16_epi8(_mm256_srli_epi16(h, 8)));
    }
    for (int m = 0; m < 128; m++) {
        __m512 mw = fp8x16_to_f32(_mm_set1_epi8((char)m));
        __mmask16 ok = _mm512_cmp_ps_mask(mw, _mm512_setzero_ps(), _CMP_GT_OQ); /* as gemm_pack's scales */
        __m512 s = _mm512_maskz_div_ps(ok, _mm512_set1_ps(127.0f), mw);
        for (int c0 = 0; c0 < 128; c0 += 16) {
            __m512 f = fp8x16_to_f32(_mm_add_epi8(_mm_set1_epi8((char)c0), _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)));
            __m128i q = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(f, s))); /* saturated as vpackss* */
            _mm_storeu_si128((__m128i *)&fp8_q8[m][c0], _mm_xor_si128(q, _mm_set1_epi8((char)0x80)));
        }
    }
}

/* 64 FP8 codes c (columns 0..63 of a row) as 32 bf16 pairs each of
 * columns 0..31 (*p0) and 32..63 (*p1), in column order; with q8 (the
 * fp8_q8 row of the block's largest magnitude) also their int8 copy (+ 128),
 * a byte per column in column order (else *u = 0). */
AVX512 INLINE void fp8x64_lut(__m512i c, __m512i *p0, __m512i *p1, const uint8_t *q8, __m512i *u)
{
    /* in each 128-bit lane l: columns 8l..8l+7, then 32+8l..32+8l+7, so that
     * the byte interleaves (within lanes) give columns 0..31 and 32..63 */
    const __m512i ord = _mm512_set_epi8(63, 62, 61, 60, 59, 58, 57, 56, 31, 30, 29, 28, 27, 26, 25, 24,
                                        55, 54, 53, 52, 51, 50, 49, 48, 23, 22, 21, 20, 19, 18, 17, 16,
                                        47, 46, 45, 44, 43, 42, 41, 40, 15, 14, 13, 12, 11, 10, 9, 8,
                                        39, 38, 37, 36, 35, 34, 33, 32, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512i co = _mm512_permutexvar_epi8(ord, c);
    __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(&fp8_bf16[0][0]), co, _mm512_load_si512(&fp8_bf16[0][64]));
    __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(&fp8_bf16[1][0]), co, _mm512_load_si512(&fp8_bf16[1][64]));
    hi = _mm512_ternarylogic_epi32(hi, co, _mm512_set1_epi8((char)0x80), 0xF8); /* hi | (co & 0x80) */
    *p0 = _mm512_unpacklo_epi8(lo, hi);
    *p1 = _mm512_unpackhi_epi8(lo, hi);
    if (!q8) {
        *u = _mm512_setzero_si512();
        return;
    }
    __m512i v = _mm512_permutex2var_epi8(_mm512_load_si512(q8), c, _mm512_load_si512(q8 + 64));
    *u = _mm512_mask_sub_epi8(v, _mm512_movepi8_mask(c), _mm512_setzero_si512(), v); /* 128 - q = -(128 + q) mod 256 */
}

/* gemm_pack reads 16 rows at a time in short strided streams; ahead of row
 * 16 v + i at column k it prefetches every 64-byte line 256 columns on (BF16:
 * two lines, where one per 64 columns left every other line cold), and past
 * the chunk's end the same row of the next vector, then of the next chunk's
 * first, then of the thread's next panel, so no vector starts cold.
 *   Measured (Zen 4, 2 threads, BF16 8-layer pp512, perf): with one line per
 * 64 columns and nothing past the chunk, bf16_block_max's first load had 12.5% of
 * gemm_panel's samples; 3.7% with every line and the next vector and chunk,
 * 1.9% with the next panel too, and pp512 143.9 against 137.0 tok/s on
 * average (alternated binaries, 4 pairs, the machine noisy). 512 and 768
 * columns ahead instead of 256, three alternated rounds of BF16 pp512: 146.3
 * and 144.5 tok/s on average against 150.9. */
typedef struct { /* a panel's rows: [r, r + nr) of w */
    const ds_weight *w;
    int r, nr;
} gemm_rows;

typedef struct { /* where one step of gemm_pack prefetches: row i < n at p + i * ld, lines a row */
    const char *p;
    size_t ld;
    int n, lines;
} pack_pf;

/* The prefetches of gemm_pack's step (vector v, column k), once for its 16 rows. */
AVX512 INLINE pack_pf pack_prefetch_at(const gemm_rows *pn, const gemm_rows *next, int k0, int kc, int v, int k)
{
    pack_pf f = {NULL, 0, 0, 0};
    int ka = k + 256;
    if (ka >= kc) {
        ka -= kc;
        if (16 * (v + 1) < pn->nr) v++;
        else if (k0 + kc < pn->w->cols) {
            k0 += kc;
            v = 0;
        } else if (next) {
            pn = next;
            k0 = v = 0;
        } else return f;
        if (k0 + ka >= pn->w->cols) return f;
    }
    int esz = pn->w->fmt == DS_W_FP8 ? 1 : 2;
    f.p = (const char *)w_row(pn->w, pn->r + 16 * v) + (size_t)(k0 + ka) * esz;
    f.ld = (size_t)pn->w->cols * esz;
    f.n = MIN(16, pn->nr - 16 * v);
    f.lines = esz;
    return f;
}

static __mmask64 mask64(int n) { return n >= 64 ? ~(__mmask64)0 : n <= 0 ? 0 : ((__mmask64)1 << n) - 1; }

/* The largest magnitude code (the e4m3 code without its sign, which orders
 * as the magnitudes) over columns [k, k+128) (past K: 0) of the FP8 rows
 * row + i ld, i < n <= 16, in lane i (0 past n): the rows' byte maxima
 * transposed so that one reduction serves all 16. */
AVX512 INLINE __m512i fp8_block_max16(const char *row, size_t ld, int n, int k, int K)
{
    int nk = MIN(DS_BLOCK, K - k);
    __mmask64 m0 = mask64(nk), m1 = mask64(nk - 64);
    const __m512i mag = _mm512_set1_epi8(0x7f);
    __m512i a[16];
    #pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        const char *c = row + i * ld + k;
        a[i] = i < n ? _mm512_max_epu8(_mm512_and_si512(_mm512_maskz_loadu_epi8(m0, c), mag),
                                       _mm512_and_si512(_mm512_maskz_loadu_epi8(m1, c + 64), mag))
                     : _mm512_setzero_si512();
    }
    transpose16(a); /* a[j] lane i: bytes 4j .. 4j+3 of row i's maxima */
    __m512i m = a[0];
    #pragma GCC unroll 16
    for (int j = 1; j < 16; j++) m = _mm512_max_epu8(m, a[j]);
    m = _mm512_max_epu8(m, _mm512_srli_epi32(m, 16));
    m = _mm512_max_epu8(m, _mm512_srli_epi32(m, 8));
    return _mm512_and_si512(m, _mm512_set1_epi32(0xff));
}

/* Rows [r, r+nr), nr <= 64, columns [k0, k0+kc) packed as wp[p][v][16]: the
 * pair p of rows r+16v.. r+16v+15. Rows past nr, columns past K are zero.
 * With wq (HILO8) also the int8 panel (see gemm_tile8): wq[q][v][16] the quad
 * q (columns k0+4q .. +3, one 32-bit lane a row) of the same rows, stored +128
 * (unsigned), and per block b and row i sw[b][i], the int8 scale in widened
 * units (the FP8 block scale is applied with the pairs'). FP8 rows are
 * widened by table (fp8x64_lut), BF16 rows' int8 values come from the same
 * widened registers as the pairs. */
AVX512 static void gemm_pack(uint32_t *wp, uint32_t *wq, float (*sw)[GEMM_PANEL], const ds_weight *w, int r, int nr,
                             int k0, int kc, const gemm_rows *next)
{
    int K = w->cols;
    bool fp8 = w->fmt == DS_W_FP8;
    gemm_rows pn = {w, r, nr};
    float inv[GEMM_PANEL];
    uint16_t mc[16]; /* this block's largest magnitude code (BF16: bits) per row of the vector */
    size_t ld = (size_t)K * (fp8 ? 1 : 2);
    if (fp8) pthread_once(&fp8_tables_once, fp8_tables_init);
    for (int v = 0; v < 4 && 16 * v < nr; v++) {
        const char *rows = (const char *)w_row(w, r + 16 * v);
        for (int k = 0; k < kc; k += 64) {
            if (wq && k % DS_BLOCK == 0) { /* this block's int8 scales, 16 rows at once */
                if (fp8)
                    _mm256_storeu_si256((__m256i *)mc, _mm512_cvtepi32_epi16(fp8_block_max16(rows, ld, nr - 16 * v, k0 + k, K)));
                else
                    for (int i = 0; i < 16; i++) mc[i] = 16 * v + i < nr ? bf16_block_max((const uint16_t *)(rows + i * ld), k0 + k, K) : 0;
                __m256i c = _mm256_loadu_si256((const __m256i *)mc);
                __m512 mw = fp8 ? fp8x16_to_f32(_mm256_cvtepi16_epi8(c)) : bf16x16_to_f32(c);
                __mmask16 ok = _mm512_cmp_ps_mask(mw, _mm512_setzero_ps(), _CMP_GT_OQ); /* not 0, not NaN */
                _mm512_storeu_ps(inv + 16 * v, _mm512_maskz_div_ps(ok, _mm512_set1_ps(127.0f), mw));
                _mm512_storeu_ps(sw[k / DS_BLOCK] + 16 * v, _mm512_maskz_mul_ps(ok, mw, _mm512_set1_ps(1.0f / 127.0f)));
            }
            __m512i m[2][16], q8[16];
            pack_pf pf = pack_prefetch_at(&pn, next, k0, kc, v, k);
            #pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                if (16 * v + i >= nr) {
                    m[0][i] = m[1][i] = q8[i] = _mm512_setzero_si512();
                    continue;
                }
                const char *row = rows + i * ld;
                for (int c = 0; i < pf.n && c < pf.lines; c++) _mm_prefetch(pf.p + i * pf.ld + 64 * c, _MM_HINT_T0);
                int kk = k0 + k, nk = K - kk;
                if (fp8) {
                    __m512i c = _mm512_maskz_loadu_epi8(mask64(nk), row + kk);
                    fp8x64_lut(c, &m[0][i], &m[1][i], wq ? fp8_q8[mc[i]] : NULL, &q8[i]);
                    continue;
                }
                __m512 f[4];
                #pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    m[h][i] = _mm512_maskz_loadu_epi16(mask32(nk - 32 * h), (const uint16_t *)row + kk + 32 * h);
                    f[2 * h] = bf16x16_to_f32(_mm512_castsi512_si256(m[h][i]));
                    f[2 * h + 1] = bf16x16_to_f32(_mm512_extracti64x4_epi64(m[h][i], 1));
                }
                if (wq) { /* 128-bit lane l, dword j: columns 16 j + 4 l .. + 3 (packs work per lane) */
                    __m512 s = _mm512_set1_ps(inv[16 * v + i]);
                    __m512i d[4];
                    #pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) d[j] = _mm512_cvtps_epi32(_mm512_mul_ps(f[j], s));
                    __m512i u = _mm512_packs_epi16(_mm512_packs_epi32(d[0], d[1]), _mm512_packs_epi32(d[2], d[3]));
                    q8[i] = _mm512_xor_si512(u, _mm512_set1_epi8((char)0x80));
                }
            }
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                transpose16(m[h]);
                #pragma GCC unroll 16
                for (int q = 0; q < 16; q++)
                    _mm512_store_si512(wp + ((size_t)(k / 2 + 16 * h + q) * 4 + v) * 16, m[h][q]);
            }
            if (wq) {
                transpose16(q8);
                #pragma GCC unroll 16
                for (int q = 0; q < 16; q++) /* BF16: q8[4 l + j] is the quad 4 j + l */
                    _mm512_store_si512(wq + ((size_t)(k / 4 + (fp8 ? q : 4 * (q % 4) + q / 4)) * 4 + v) * 16, q8[q]);
            }
        }
    }
    for (int v = (nr + 15) / 16; v < 4; v++) { /* vectors wholly past nr */
        for (int p = 0; p < (kc + 63) / 64 * 32; p++) _mm512_store_si512(wp + ((size_t)p * 4 + v) * 16, _mm512_setzero_si512());
        for (int q = 0; wq && q < (kc + 63) / 64 * 16; q++)
            _mm512_store_si512(wq + ((size_t)q * 4 + v) * 16, _mm512_setzero_si512());
    }
}

/* acc[v][t] += the sum over pairs [p0, p1) of wp and xa[t] (split: the hi and
 * lo pairs side by side), t < T. The pair broadcast inside each
 * vdpbf16ps (a {1to16} memory operand, 24 loads a pair instead of 6
 * vpbroadcastd) measured level (FP8 pp512, five alternated pairs: 134.7-147.1
 * against 140.3-151.9 tok/s). */
AVX512 INLINE void tile_pairs(int T, bool split, __m512 acc[4][GEMM_GT], const uint32_t *wp, const uint32_t *xa,
                              size_t ldx, int p0, int p1)
{
    int e = split ? 2 : 1;
    for (int p = p0; p < p1; p++) {
        const uint32_t *wq = wp + (size_t)p * 64;
        __m512bh wv[4];
        #pragma GCC unroll 16
        for (int v = 0; v < 4; v++) wv[v] = (__m512bh)_mm512_load_si512(wq + 16 * v);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            const uint32_t *xt = xa + t * ldx + (size_t)p * e;
            __m512bh h = (__m512bh)_mm512_set1_epi32((int)xt[0]);
            #pragma GCC unroll 16
            for (int v = 0; v < 4; v++) acc[v][t] = _mm512_dpbf16_ps(acc[v][t], wv[v], h);
            if (split) {
                __m512bh l = (__m512bh)_mm512_set1_epi32((int)xt[1]);
                #pragma GCC unroll 16
                for (int v = 0; v < 4; v++) acc[v][t] = _mm512_dpbf16_ps(acc[v][t], wv[v], l);
            }
        }
    }
}

/* y[t][0..64) (+)= s * acc[.][t], t < T; s per row (sv, or 1 when NULL), rows
 * masked by rm. */
AVX512 INLINE void tile_store(int T, __m512 acc[4][GEMM_GT], float *y, size_t ldy, const float *sv,
                              const __mmask16 *rm, bool add)
{
    #pragma GCC unroll 16
    for (int v = 0; v < 4; v++) {
        __m512 s = sv ? _mm512_loadu_ps(sv + 16 * v) : _mm512_set1_ps(1.0f);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            float *o = y + t * ldy + 16 * v;
            __m512 r = add ? _mm512_fmadd_ps(acc[v][t], s, _mm512_maskz_loadu_ps(rm[v], o)) : _mm512_mul_ps(acc[v][t], s);
            _mm512_mask_storeu_ps(o, rm[v], r);
        }
    }
}

/* y[t][0..64) (+)= s * sum over pairs [p0, p1) of wp and xa[t], t < T; s per
 * row (sv, or 1 when NULL), rows masked by rm. */
AVX512 INLINE void gemm_tile(int T, bool split, const uint32_t *wp, const uint32_t *xa, size_t ldx, int p0, int p1,
                             float *y, size_t ldy, const float *sv, const __mmask16 *rm, bool add)
{
    __m512 acc[4][GEMM_GT];
    #pragma GCC unroll 16
    for (int v = 0; v < 4; v++)
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[v][t] = _mm512_setzero_ps();
    tile_pairs(T, split, acc, wp, xa, ldx, p0, p1);
    tile_store(T, acc, y, ldy, sv, rm, add);
}

/* ---- HILO8: the lo part on int8 (cpu_gemm_precision CPU_GEMM_HILO8) -----
 * The hi products are the BF16 mode's. lo = x - hi is at most 2^-9 |x|, so
 * its product needs only ~8 bits on each side: lo goes to int8 per token and
 * 128-column block (q = round(lo * 127 / max |lo|)), the weights to int8 per
 * row and block (round(w * 127 / max |w|), stored + 128 as vpdpbusd's
 * unsigned operand) while the panel is packed, so one vpdpbusd does 64
 * products where vdpbf16ps does 32. The + 128 adds 128 x the sum of the
 * token's q over the block, which the sums start without. Each block's int32
 * sums are scaled by the two scales into the float outputs. Per product the
 * error is at most (max |lo| |w| + |lo| max |w|) / 254 plus float32 rounding:
 * about 2^-16 of max |x| max |w|, where SPLIT's is 2^-17 |x w|. */

/* Token t's lo bytes xl[t][0 .. nb*128) (signed; columns past K are 0), their
 * scales sl[t][b] and -128 x their sums so[t][b]. */
AVX512 static void gemm_acts8(int8_t *xl, size_t ldl, float *sl, int32_t *so, size_t lds, const float *x, int K, int t)
{
    const float *xi = x + (size_t)t * K;
    int8_t *o = xl + (size_t)t * ldl;
    for (int b = 0; b * DS_BLOCK < K; b++) {
        __m512 r[DS_BLOCK / 16], mx = _mm512_setzero_ps();
        #pragma GCC unroll 8
        for (int i = 0; i < DS_BLOCK / 16; i++) {
            int k = b * DS_BLOCK + 16 * i;
            __m512 a = _mm512_maskz_loadu_ps(k < K ? mask16(K - k) : 0, xi + k);
            __m512 h = bf16x16_to_f32((__m256i)_mm512_cvtneps_pbh(a));
            r[i] = _mm512_sub_ps(a, h);
            mx = _mm512_max_ps(mx, _mm512_abs_ps(r[i]));
        }
        float m = _mm512_reduce_max_ps(mx);
        __m512 inv = _mm512_set1_ps(m > 0 ? 127.0f / m : 0.0f); /* 0 also for NaN */
        __m512i sum = _mm512_setzero_si512();
        #pragma GCC unroll 8
        for (int i = 0; i < DS_BLOCK / 16; i++) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(r[i], inv));
            q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
            sum = _mm512_add_epi32(sum, q);
            _mm_storeu_si128((__m128i *)(o + b * DS_BLOCK + 16 * i), _mm512_cvtepi32_epi8(q));
        }
        sl[(size_t)t * lds + b] = m > 0 ? m / 127.0f : 0.0f;
        so[(size_t)t * lds + b] = -128 * _mm512_reduce_add_epi32(sum);
    }
}

/* acc + the four-byte dot products of a (unsigned) and b (signed) per lane.
 * In asm: GCC 12's _mm512_dpbusd_epi32 made it copy and spill every
 * accumulator of the tile below on each step. */
AVX512 INLINE __m512i dpbusd(__m512i acc, __m512i a, __m512i b)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

typedef int32_t ua32 __attribute__((may_alias, aligned(1)));

/* One block of a HILO8 tile: y[t][0..64) (+)= s * (hi + lo), t < T, where
 * hi is the sum over pairs [p0, p1) of wp and xa[t] (as gemm_tile) and lo =
 * sw * sl[t] * (so[t] + the sum over the block's 32 quads of wq and xl[t]);
 * s per row (sv, or 1 when NULL), rows masked by rm. lo is summed first, in
 * int32, and its float value starts the hi sums, so each block reads and
 * writes y once. xl: the block's first byte of token 0, rows ldl bytes apart;
 * sl, so: token 0's of the block, lds apart. */
AVX512 INLINE void gemm_tile8(int T, const uint32_t *wp, const uint32_t *xa, size_t ldx, int p0, int p1,
                              const uint32_t *wq, const int8_t *xl, size_t ldl, const float *sw, const float *sl,
                              const int32_t *so, size_t lds, float *y, size_t ldy, const float *sv, const __mmask16 *rm,
                              bool add)
{
    __m512 acc[4][GEMM_GT];
    {
        __m512i ai[4][GEMM_GT];
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++)
            #pragma GCC unroll 16
            for (int v = 0; v < 4; v++) ai[v][t] = _mm512_set1_epi32(so[t * lds]);
        for (int q = 0; q < DS_BLOCK / 4; q++) {
            const uint32_t *wv = wq + (size_t)q * 64;
            __m512i b[4];
            #pragma GCC unroll 16
            for (int v = 0; v < 4; v++) b[v] = _mm512_load_si512(wv + 16 * v);
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++) {
                __m512i a = _mm512_set1_epi32(*(const ua32 *)(xl + t * ldl + 4 * q));
                #pragma GCC unroll 16
                for (int v = 0; v < 4; v++) ai[v][t] = dpbusd(ai[v][t], b[v], a);
            }
        }
        #pragma GCC unroll 16
        for (int v = 0; v < 4; v++) {
            __m512 s = _mm512_loadu_ps(sw + 16 * v);
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++)
                acc[v][t] = _mm512_mul_ps(_mm512_cvtepi32_ps(ai[v][t]), _mm512_mul_ps(s, _mm512_set1_ps(sl[t * lds])));
        }
    }
    tile_pairs(T, false, acc, wp, xa, ldx, p0, p1);
    tile_store(T, acc, y, ldy, sv, rm, add);
}

#define GEMM_T8(N)                                                                                                \
    gemm_tile8(N, wp, xa, ldx, p0, p1, wq, xl, ldl, sw, sl, so, lds, y, ldy, sv, rm, add)

AVX512 static void gemm_tiles8(int T, const uint32_t *wp, const uint32_t *xa, size_t ldx, int p0, int p1,
                               const uint32_t *wq, const int8_t *xl, size_t ldl, const float *sw, const float *sl,
                               const int32_t *so, size_t lds, float *y, size_t ldy, const float *sv,
                               const __mmask16 *rm, bool add)
{
    switch (T) {
    case 6: GEMM_T8(6); break;
    case 5: GEMM_T8(5); break;
    case 4: GEMM_T8(4); break;
    case 3: GEMM_T8(3); break;
    case 2: GEMM_T8(2); break;
    default: GEMM_T8(1); break;
    }
}
#undef GEMM_T8

#define GEMM_T_CASES(S)                                                                            \
    switch (T) {                                                                                   \
    case 6: gemm_tile(6, S, wp, xa, ldx, p0, p1, y, ldy, sv, rm, add); break;                      \
    case 5: gemm_tile(5, S, wp, xa, ldx, p0, p1, y, ldy, sv, rm, add); break;                      \
    case 4: gemm_tile(4, S, wp, xa, ldx, p0, p1, y, ldy, sv, rm, add); break;                      \
    case 3: gemm_tile(3, S, wp, xa, ldx, p0, p1, y, ldy, sv, rm, add); break;                      \
    case 2: gemm_tile(2, S, wp, xa, ldx, p0, p1, y, ldy, sv, rm, add); break;                      \
    default: gemm_tile(1, S, wp, xa, ldx, p0, p1, y, ldy, sv, rm, add); break;                     \
    }

AVX512 static void gemm_tiles(int T, bool split, const uint32_t *wp, const uint32_t *xa, size_t ldx, int p0, int p1,
                              float *y, size_t ldy, const float *sv, const __mmask16 *rm, bool add)
{
    if (split) GEMM_T_CASES(true)
    else GEMM_T_CASES(false)
}

/* The activations of one GEMM: xa the bf16 pairs (split: hi, lo) per token,
 * ldx uint32 apart; HILO8 also the lo bytes xl, ldl apart, and their scales
 * sl and offsets so, lds apart (gemm_acts8). On AMX xa holds the B tiles of
 * the hi pairs and xb (NULL in BF16 precision) those of the lo pairs, ldx
 * pairs a tile of tokens (amx_acts). */
typedef struct {
    const uint32_t *xa, *xb;
    size_t ldx;
    const int8_t *xl;
    size_t ldl;
    const float *sl;
    const int32_t *so;
    size_t lds;
} gemm_x;

/* FP8: sc[b][i] = the block scale of panel row i (of nr from row r0) at
 * column block k0 / 128 + b, times 2^8 (the widening's 2^-8); 0 past nr. */
static void panel_scales(float sc[GEMM_KC / DS_BLOCK][GEMM_PANEL], const ds_weight *w, int r0, int nr, int k0, int kc)
{
    int kb = (w->cols + DS_BLOCK - 1) / DS_BLOCK;
    for (int b = 0; b * DS_BLOCK < kc; b++)
        for (int i = 0; i < GEMM_PANEL; i++)
            sc[b][i] = i < nr ? w->scale[(size_t)((r0 + i) / DS_BLOCK) * kb + k0 / DS_BLOCK + b] * 256.0f : 0.0f;
}

/* One panel: rows [a, a+nr) relative to row0, all n tokens; wp holds the
 * bf16 panel and, for HILO8, the int8 panel after it; next: the rows of the
 * calling thread's next panel (to prefetch), or NULL. */
AVX512 static void gemm_panel(float *y, int n, const ds_weight *w, int row0, int rows, int a, int nr, const gemm_x *gx,
                              uint32_t *wp, cpu_gemm_prec prec, const gemm_rows *next)
{
    int K = w->cols;
    bool split = prec == CPU_GEMM_SPLIT, h8 = prec == CPU_GEMM_HILO8, fp8 = w->fmt == DS_W_FP8;
    int e = split ? 2 : 1;
    size_t ldx = gx->ldx;
    uint32_t *wq = wp + (size_t)GEMM_KC / 2 * GEMM_PANEL;
    __mmask16 rm[4];
    for (int v = 0; v < 4; v++) rm[v] = 16 * v < nr ? mask16(nr - 16 * v) : 0;
    float sc[GEMM_KC / DS_BLOCK][GEMM_PANEL]; /* FP8: scale * 2^8 per block and row */
    float sw[GEMM_KC / DS_BLOCK][GEMM_PANEL];
    for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
        int kc = MIN(GEMM_KC, K - k0), pc = (kc + 1) / 2;
        gemm_pack(wp, h8 ? wq : NULL, sw, w, row0 + a, nr, k0, kc, next);
        if (fp8) panel_scales(sc, w, row0 + a, nr, k0, kc);
        const uint32_t *xc = gx->xa + (size_t)(k0 / 2) * e;
        for (int t = 0; t < n; t += GEMM_GT) {
            int T = MIN(GEMM_GT, n - t);
            float *yt = y + (size_t)t * rows + a;
            const uint32_t *xt = xc + (size_t)t * ldx;
            if (h8) {
                for (int b = 0; b * DS_BLOCK < kc; b++) {
                    size_t sb = (size_t)t * gx->lds + k0 / DS_BLOCK + b;
                    gemm_tiles8(T, wp, xt, ldx, b * DS_BLOCK / 2, MIN(pc, (b + 1) * DS_BLOCK / 2),
                                wq + (size_t)b * DS_BLOCK / 4 * 64, gx->xl + (size_t)t * gx->ldl + k0 + b * DS_BLOCK,
                                gx->ldl, sw[b], gx->sl + sb, gx->so + sb, gx->lds, yt, (size_t)rows, fp8 ? sc[b] : NULL,
                                rm, k0 > 0 || b > 0);
                }
                continue;
            }
            if (!fp8) {
                gemm_tiles(T, split, wp, xt, ldx, 0, pc, yt, (size_t)rows, NULL, rm, k0 > 0);
                continue;
            }
            for (int b = 0; b * DS_BLOCK < kc; b++)
                gemm_tiles(T, split, wp, xt, ldx, b * DS_BLOCK / 2, MIN(pc, (b + 1) * DS_BLOCK / 2), yt, (size_t)rows,
                           sc[b], rm, k0 > 0 || b > 0);
        }
    }
}

/* ---- prefill GEMM on AMX tiles (cpu_gemm_amx) ---------------------------
 * The weights are the A operand of tdpbf16ps and the activations the B
 * operand, so that the weights need no transpose: an A tile is 16 weight
 * rows x 16 pairs, 64 bytes of each row. A chunk of GEMM_KC columns of the
 * panel's rows is copied as bf16 rows (amx_pack; FP8 widened by table as
 * gemm_pack widens it, times 2^-8), also for BF16 weights: tiles read in
 * place from the matrix, 16 rows K x 2 bytes apart, were slower (16-core
 * Xeon, BF16 pp512 at 16 threads, builds alternated three times in one call:
 * 1119-1353 tok/s in place, 1309-1344 copied, 1227-1344 with the weights as
 * the B tiles of packed panels; FP8, copied in both forms, 1193-1369 against
 * 1117-1137 as B tiles). The activations are
 * B tiles of 16 pairs x 16 tokens (amx_acts): per tile of 16 tokens, pair p's
 * 16 tokens in one 64-byte row; the bf16 hi pairs in one matrix, the lo
 * pairs (x - hi, rounded) in another, so every step is one tdpbf16ps for hi
 * and one for lo into the same float32 C tile: the SPLIT precision's
 * arithmetic (cpu_gemm_precision's BF16 drops the lo products; HILO8 runs as
 * SPLIT, which is the more accurate). A block is the panel's 64 rows x 16
 * tokens: C in tiles 0-3 (rows x tokens), B hi in 4, lo in 5, A in 6 and 7.
 * Each C element sums the same exact bf16 products in the same order as with
 * the roles swapped. The C tiles go through memory into a float accumulator
 * per row and token, times the FP8 scales after each 128-column block, in
 * the order in which y itself was summed (first block stored, later ones
 * fused multiply-added); the accumulator goes into y transposed once, after
 * the panel's last chunk. Tokens past n are zero (whole B columns), as are
 * pairs past K. */

#define AMX_M 16              /* tokens per B tile */
#define AMX_LDA (2 * GEMM_KC + 64) /* bytes between packed rows: 16 rows not in one L1 set */

/* The B tiles of token tile tt: hi pairs into xh, lo pairs (xl not NULL)
 * into xl, kp pairs (a multiple of 16) a tile: pair p of token 16 tt + i is
 * uint32 i of row p, at (tt kp + p) 16; tokens past n and pairs past K zero. */
AVX512 static void amx_acts(uint32_t *xh, uint32_t *xl, size_t kp, const float *x, int K, int tt, int n)
{
    for (size_t pb = 0; pb < kp; pb += 16) {
        __m512i rh[16], rl[16];
        int k = (int)pb * 2, left = K - k;
        #pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            int t = AMX_M * tt + i;
            rh[i] = rl[i] = _mm512_setzero_si512();
            if (t >= n || left <= 0) continue;
            const float *xi = x + (size_t)t * K + k;
            __m512 a = _mm512_maskz_loadu_ps(mask16(left), xi);
            __m512 b = _mm512_maskz_loadu_ps(left > 16 ? mask16(left - 16) : 0, left > 16 ? xi + 16 : xi);
            rh[i] = (__m512i)_mm512_cvtne2ps_pbh(b, a);
            if (!xl) continue;
            __m512 ra = _mm512_sub_ps(a, bf16x16_to_f32(_mm512_castsi512_si256(rh[i])));
            __m512 rb = _mm512_sub_ps(b, bf16x16_to_f32(_mm512_extracti64x4_epi64(rh[i], 1)));
            rl[i] = (__m512i)_mm512_cvtne2ps_pbh(rb, ra);
        }
        uint32_t *oh = xh + ((size_t)tt * kp + pb) * 16;
        transpose16(rh);
        #pragma GCC unroll 16
        for (int p = 0; p < 16; p++) _mm512_store_si512(oh + (size_t)p * 16, rh[p]);
        if (!xl) continue;
        uint32_t *ol = xl + ((size_t)tt * kp + pb) * 16;
        transpose16(rl);
        #pragma GCC unroll 16
        for (int p = 0; p < 16; p++) _mm512_store_si512(ol + (size_t)p * 16, rl[p]);
    }
}

/* Rows [r, r+nr) of w, nr <= 64, columns [k0, k0+kc) as bf16 rows of wa,
 * AMX_LDA bytes apart, the pairs rounded up to 16 (rows past nr and columns
 * past K zero). FP8 codes are widened by table (fp8x64_lut: value x 2^-8). */
AVX512 static void amx_pack(uint8_t *wa, const ds_weight *w, int r, int nr, int k0, int kc)
{
    int K = w->cols, kw = (kc + 31) / 32 * 32; /* columns written: whole tile rows */
    bool fp8 = w->fmt == DS_W_FP8;
    if (fp8) pthread_once(&fp8_tables_once, fp8_tables_init);
    for (int i = 0; i < GEMM_PANEL; i++) {
        uint8_t *o = wa + (size_t)i * AMX_LDA;
        if (i >= nr) {
            memset(o, 0, (size_t)kw * 2);
            continue;
        }
        const char *row = (const char *)w_row(w, r + i);
        const char *ahead = i + 4 < nr ? (const char *)w_row(w, r + i + 4) : NULL; /* read 4 rows on */
        for (int k = 0; k < kw; k += 64) {
            int kk = k0 + k, nk = MIN(K - kk, kc - k); /* columns of this row in the chunk */
            __m512i p0, p1, u;
            if (ahead && nk > 0) {
                _mm_prefetch(ahead + (size_t)kk * (fp8 ? 1 : 2), _MM_HINT_T0);
                if (!fp8) _mm_prefetch(ahead + (size_t)kk * 2 + 64, _MM_HINT_T0);
            }
            if (fp8) {
                fp8x64_lut(_mm512_maskz_loadu_epi8(mask64(nk), row + kk), &p0, &p1, NULL, &u);
            } else {
                p0 = _mm512_maskz_loadu_epi16(mask32(nk), (const uint16_t *)row + kk);
                p1 = _mm512_maskz_loadu_epi16(mask32(nk - 32), (const uint16_t *)row + kk + 32);
            }
            _mm512_storeu_si512(o + 2 * k, p0);
            if (k + 32 < kw) _mm512_storeu_si512(o + 2 * k + 64, p1);
        }
    }
}

/* c[v] (+)= s * (the sum over pairs [p0, p1) of the 64 rows of wa (amx_pack's
 * rows, AMX_LDA bytes apart, pair 0 at wa) and the B tiles xh, xl (pair 0 at
 * xh)), per row i of the 64 and token j of 16: c[v][i][j]; s per row (sv, or
 * 1 when NULL). */
AVX512 static void amx_block(const uint8_t *wa, const uint32_t *xh, const uint32_t *xl, int p0, int p1,
                             float c[4][16][AMX_M], const float *sv, bool add)
{
    const size_t lda = AMX_LDA;
    long sa = (long)lda, sb = 64;
    AMX_TILE_ZERO(0);
    AMX_TILE_ZERO(1);
    AMX_TILE_ZERO(2);
    AMX_TILE_ZERO(3);
    for (int p = p0; p < p1; p += 16) {
        const uint8_t *a = wa + (size_t)p * 4;
        AMX_TILE_LOAD(4, xh + (size_t)p * 16, sb);
        AMX_TILE_LOAD(6, a, sa);
        AMX_TILE_LOAD(7, a + 16 * lda, sa);
        AMX_DPBF16(0, 6, 4);
        AMX_DPBF16(1, 7, 4);
        if (xl) {
            AMX_TILE_LOAD(5, xl + (size_t)p * 16, sb);
            AMX_DPBF16(0, 6, 5);
            AMX_DPBF16(1, 7, 5);
        }
        AMX_TILE_LOAD(6, a + 32 * lda, sa);
        AMX_TILE_LOAD(7, a + 48 * lda, sa);
        AMX_DPBF16(2, 6, 4);
        AMX_DPBF16(3, 7, 4);
        if (xl) {
            AMX_DPBF16(2, 6, 5);
            AMX_DPBF16(3, 7, 5);
        }
    }
    float t[4][16][AMX_M] __attribute__((aligned(64)));
    AMX_TILE_STORE(0, t[0], 64);
    AMX_TILE_STORE(1, t[1], 64);
    AMX_TILE_STORE(2, t[2], 64);
    AMX_TILE_STORE(3, t[3], 64);
    for (int v = 0; v < 4; v++)
        for (int i = 0; i < 16; i++) {
            __m512 s = _mm512_set1_ps(sv ? sv[16 * v + i] : 1.0f), a = _mm512_load_ps(t[v][i]);
            _mm512_store_ps(c[v][i], add ? _mm512_fmadd_ps(a, s, _mm512_load_ps(c[v][i])) : _mm512_mul_ps(a, s));
        }
}

/* gemm_panel on AMX tiles: rows [a, a+nr) relative to row0, all n tokens; wa
 * the thread's packed rows, acc its accumulators (64 rows x 16 tokens a token
 * tile); the thread's tiles are configured. */
AVX512 static void amx_panel(float *y, int n, const ds_weight *w, int row0, int rows, int a, int nr, const gemm_x *gx,
                             uint8_t *wa, float (*acc)[4][16][AMX_M])
{
    int K = w->cols, nt = (n + AMX_M - 1) / AMX_M;
    bool fp8 = w->fmt == DS_W_FP8;
    size_t kp = gx->ldx; /* pairs a B tile row group: (K / 2 rounded up to 16) */
    float sc[GEMM_KC / DS_BLOCK][GEMM_PANEL]; /* FP8: scale * 2^8 per block and row */
    for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
        int kc = MIN(GEMM_KC, K - k0), pc = (kc + 1) / 2;
        amx_pack(wa, w, row0 + a, nr, k0, kc);
        if (fp8) panel_scales(sc, w, row0 + a, nr, k0, kc);
        for (int tt = 0; tt < nt; tt++) {
            const uint32_t *xh = gx->xa + ((size_t)tt * kp + k0 / 2) * 16;
            const uint32_t *xl = gx->xb ? gx->xb + ((size_t)tt * kp + k0 / 2) * 16 : NULL;
            if (!fp8) {
                amx_block(wa, xh, xl, 0, pc, acc[tt], NULL, k0 > 0);
                continue;
            }
            for (int b = 0; b * DS_BLOCK < kc; b++)
                amx_block(wa, xh, xl, b * DS_BLOCK / 2, MIN(pc, (b + 1) * DS_BLOCK / 2), acc[tt], sc[b],
                          k0 > 0 || b > 0);
        }
    }
    __mmask16 rm[4];
    for (int v = 0; v < 4; v++) rm[v] = 16 * v < nr ? mask16(nr - 16 * v) : 0;
    for (int tt = 0; tt < nt; tt++) /* acc[tt][v][i][j] -> y[16 tt + j][a + 16 v + i] */
        for (int v = 0; v < 4 && 16 * v < nr; v++) {
            __m512i r[16];
            #pragma GCC unroll 16
            for (int i = 0; i < 16; i++) r[i] = _mm512_load_si512(acc[tt][v][i]);
            transpose16(r);
            for (int j = 0; j < AMX_M && AMX_M * tt + j < n; j++)
                _mm512_mask_storeu_ps(y + (size_t)(AMX_M * tt + j) * rows + a + 16 * v, rm[v], (__m512)r[j]);
        }
}

/* The job of panel u (pfirst: each job's first panel). */
static int panel_job(const int *pfirst, int u)
{
    int j = 0;
    while (u >= pfirst[j + 1]) j++;
    return j;
}

/* GEMM jobs (BF16 or FP8 weights) in one parallel region: the activations of
 * each distinct input packed once (jobs that share x, as w1 and w3 do, share
 * them), then every job's panels in one dynamic loop, so that two threads
 * wait for each other once, not once a job. On AMX the activations are whole
 * B tiles (amx_acts), packed a tile of 16 tokens at a time. */
AVX512 static void gemm_jobs(const ds_matmul_job *jobs, int nj)
{
    cpu_gemm_prec prec = cpu_gemm_precision;
    bool amx = cpu_gemm_amx, amx_lo = amx && prec != CPU_GEMM_BF16;
    bool split = !amx && prec == CPU_GEMM_SPLIT, h8 = !amx && prec == CPU_GEMM_HILO8;
    gemm_x gxs[GEMM_MAX_JOBS];
    int set[GEMM_MAX_JOBS], first[GEMM_MAX_JOBS + 1], pfirst[GEMM_MAX_JOBS + 1], ns = 0, maxt = 0;
    size_t off[GEMM_MAX_JOBS], xbytes = 0;
    first[0] = pfirst[0] = 0;
    for (int j = 0; j < nj; j++) {
        const ds_matmul_job *jb = &jobs[j];
        set[j] = -1;
        for (int i = 0; i < j && set[j] < 0; i++)
            if (jobs[i].x == jb->x && jobs[i].n == jb->n && jobs[i].w->cols == jb->w->cols) set[j] = set[i];
        pfirst[j + 1] = pfirst[j] + (jb->rows + GEMM_PANEL - 1) / GEMM_PANEL;
        if (set[j] >= 0) continue;
        int K = jb->w->cols, nb = (K + DS_BLOCK - 1) / DS_BLOCK;
        gemm_x g = {.ldx = ((size_t)(K + 1) / 2 * (split ? 2 : 1) + 15) / 16 * 16};
        if (h8) {
            g.ldl = (size_t)nb * DS_BLOCK;
            g.lds = ((size_t)nb + 15) / 16 * 16;
        }
        int nx = jb->n; /* units of activations: tokens, or on AMX tiles of AMX_M tokens */
        off[ns] = xbytes;
        if (amx) {
            nx = (jb->n + AMX_M - 1) / AMX_M;
            if (nx > maxt) maxt = nx;
            xbytes += sizeof(uint32_t) * g.ldx * AMX_M * (size_t)nx * (amx_lo ? 2 : 1);
        } else
            xbytes += (sizeof(uint32_t) * g.ldx + g.ldl + (sizeof(float) + sizeof(int32_t)) * g.lds) * (size_t)jb->n;
        gxs[ns] = g;
        first[ns + 1] = first[ns] + nx;
        set[j] = ns++;
    }
    uint8_t *xbuf = cpu_scratch(3, xbytes); /* the calling thread's, shared below */
    if (!xbuf) {
        cpu_fail_oom("packed GEMM activations", xbytes);
        return;
    }
    struct { /* a distinct input's packed activations, writable */
        const float *x;
        int K, n;
        uint32_t *xa, *xb;
        float *sl;
        int32_t *so;
        int8_t *xl;
    } in[GEMM_MAX_JOBS];
    for (int j = 0; j < nj; j++) {
        int si = set[j];
        gemm_x *g = &gxs[si];
        size_t n = (size_t)jobs[j].n;
        in[si].x = jobs[j].x;
        in[si].K = jobs[j].w->cols;
        in[si].n = jobs[j].n;
        g->xa = in[si].xa = (uint32_t *)(xbuf + off[si]);
        if (amx) {
            g->xb = in[si].xb = amx_lo ? in[si].xa + g->ldx * AMX_M * (size_t)(first[si + 1] - first[si]) : NULL;
            continue;
        }
        g->sl = in[si].sl = (float *)(in[si].xa + g->ldx * n);
        g->so = in[si].so = (int32_t *)(in[si].sl + g->lds * n);
        g->xl = in[si].xl = (int8_t *)(in[si].so + g->lds * n);
    }
    /* a thread's panel: packed, or on AMX the packed rows and the accumulators */
    size_t wbytes = sizeof(uint32_t) * (size_t)GEMM_KC / 2 * GEMM_PANEL + (h8 ? (size_t)GEMM_KC * GEMM_PANEL : 0);
    if (amx) wbytes = (size_t)AMX_LDA * GEMM_PANEL + sizeof(float[4][16][AMX_M]) * (size_t)maxt;
    int failed = 0, head = 0;
    #pragma omp parallel
    {
        bool tiles = false; /* this thread's AMX tiles configured */
        uint32_t *wp = cpu_scratch(1, wbytes);
        if (!wp) {
            cpu_fail_oom("a packed weight panel", wbytes);
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        int stop;
        #pragma omp atomic read
        stop = failed;
        if (!stop) { /* every thread takes the same branch: the loops below are shared */
            #pragma omp for schedule(static)
            for (int u = 0; u < first[ns]; u++) {
                int si = 0;
                while (u >= first[si + 1]) si++;
                int t = u - first[si];
                if (amx) {
                    amx_acts(in[si].xa, in[si].xb, gxs[si].ldx, in[si].x, in[si].K, t, in[si].n);
                    continue;
                }
                gemm_acts(in[si].xa, gxs[si].ldx, in[si].x, in[si].K, t, split);
                if (h8) gemm_acts8(in[si].xl, gxs[si].ldl, in[si].sl, in[si].so, gxs[si].lds, in[si].x, in[si].K, t);
            }
            /* the panels from a shared counter, each thread one claim ahead,
             * so that it knows which weights to prefetch next */
            int u, next;
            #pragma omp atomic capture
            next = head++;
            while ((u = next) < pfirst[nj]) {
                #pragma omp atomic capture
                next = head++;
                int j = panel_job(pfirst, u), jn = next < pfirst[nj] ? panel_job(pfirst, next) : 0;
                const ds_matmul_job *jb = &jobs[j];
                int a = (u - pfirst[j]) * GEMM_PANEL, an = (next - pfirst[jn]) * GEMM_PANEL;
                gemm_rows np = {jobs[jn].w, jobs[jn].row0 + an, MIN(GEMM_PANEL, jobs[jn].rows - an)};
                if (amx) {
                    if (!tiles) cpu_amx_tiles_on();
                    tiles = true;
                    amx_panel(jb->y, jb->n, jb->w, jb->row0, jb->rows, a, MIN(GEMM_PANEL, jb->rows - a), &gxs[set[j]],
                              (uint8_t *)wp, (float(*)[4][16][AMX_M])((uint8_t *)wp + (size_t)AMX_LDA * GEMM_PANEL));
                    continue;
                }
                gemm_panel(jb->y, jb->n, jb->w, jb->row0, jb->rows, a, MIN(GEMM_PANEL, jb->rows - a), &gxs[set[j]], wp,
                           prec, next < pfirst[nj] ? &np : NULL);
            }
        }
        if (tiles) cpu_amx_tiles_off();
    }
}

/* Whether gemm_jobs takes a job (else the decode kernel does). */
static bool gemm_job(const ds_matmul_job *j)
{
    return j->w->fmt != DS_W_F32 && j->n >= cpu_gemm_min_tokens && j->n > 0 && j->rows > 0;
}

AVX512 void avx512_matmul_gemm(float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    if (w->fmt == DS_W_F32) { /* not exact in bf16 */
        avx512_matmul_decode(y, x, n, w, row0, rows);
        return;
    }
    if (n <= 0 || rows <= 0) return;
    ds_matmul_job j = {y, x, n, w, row0, rows};
    gemm_jobs(&j, 1);
}

AVX512 void avx512_matmul(float *y, const float *x, int n, const ds_weight *w, int row0, int rows, ds_gemm_impl gemm,
                          bool ue8m0)
{
    float *xq = fp8q(gemm, w) ? act_fake_quant_copy(x, n, w->cols, ue8m0, avx512_act_fake_quant) : NULL;
    if (fp8q(gemm, w) && !xq) return; /* the failure is recorded */
    if (n >= cpu_gemm_min_tokens) avx512_matmul_gemm(y, xq ? xq : x, n, w, row0, rows);
    else avx512_matmul_decode(y, xq ? xq : x, n, w, row0, rows);
    free(xq);
}

/* ---- transpose matmul: y[t][c] = sum_r x[t][r] W[row0 + r][c] ----------- */

/* Columns [c0, c0+128) for T <= 3 tokens; token t's x at x + t*ldx, its y at y + t*ldy. */
AVX512 INLINE void gemv_t_tile(int T, float *y, size_t ldy, const float *x, size_t ldx, const ds_weight *w, int row0,
                               int rows, int c0)
{
    int C = w->cols, cb = (C + DS_BLOCK - 1) / DS_BLOCK;
    __mmask16 m[8];
    __m512 acc[3][8];
    #pragma GCC unroll 16
    for (int i = 0; i < 8; i++) m[i] = c0 + 16 * i < C ? mask16(C - c0 - 16 * i) : 0;
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++)
        #pragma GCC unroll 16
        for (int i = 0; i < 8; i++) acc[t][i] = _mm512_setzero_ps();
    size_t esz = w->fmt == DS_W_FP8 ? 1 : w->fmt == DS_W_BF16 ? 2 : 4;
    for (int r = 0; r < rows; r++) {
        const void *row = w_row(w, row0 + r);
        /* 128 columns of a row are a short piece of a long stride: the pass
         * over the first columns fetches whole rows a few rows ahead, so that
         * the passes over the other columns (next, on the same thread) find
         * them in the cache */
        if (c0 == 0 && r + 8 < rows)
            for (size_t o = 0; o < (size_t)C * esz; o += 64)
                _mm_prefetch((const char *)w_row(w, row0 + r + 8) + o, _MM_HINT_T1);
        float s = w->fmt == DS_W_FP8 ? w->scale[(size_t)((row0 + r) / DS_BLOCK) * cb + c0 / DS_BLOCK] * 256.0f : 1.0f;
        __m512 wv[8];
        #pragma GCC unroll 16
        for (int i = 0; i < 8; i++) wv[i] = load_w(w->fmt, row, c0 + 16 * i, m[i]);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            __m512 xb = _mm512_set1_ps(x[(size_t)t * ldx + r] * s);
            #pragma GCC unroll 16
            for (int i = 0; i < 8; i++) acc[t][i] = _mm512_fmadd_ps(wv[i], xb, acc[t][i]);
        }
    }
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++)
        #pragma GCC unroll 16
        for (int i = 0; i < 8; i++) _mm512_mask_storeu_ps(y + (size_t)t * ldy + c0 + 16 * i, m[i], acc[t][i]);
}

/* Tokens [t0, t0+T), T <= 3, columns [c0, c0+128). */
AVX512 static void gemv_t_unit(int T, float *y, size_t ldy, const float *x, size_t ldx, const ds_weight *w, int row0,
                               int rows, int c0)
{
    if (T == 3) gemv_t_tile(3, y, ldy, x, ldx, w, row0, rows, c0);
    else
        for (int t = 0; t < T; t++) gemv_t_tile(1, y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, w, row0, rows, c0);
}

AVX512 void avx512_matmul_t(float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    int C = w->cols, nc = (C + 127) / 128, ng = (n + 2) / 3;
    #pragma omp parallel for schedule(static) if (nc * ng > 1)
    for (int u = 0; u < nc * ng; u++) {
        int c0 = (u % nc) * 128, t0 = (u / nc) * 3, T = MIN(3, n - t0);
        gemv_t_unit(T, y + (size_t)t0 * C, (size_t)C, x + (size_t)t0 * rows, (size_t)rows, w, row0, rows, c0);
    }
}

/* ---- per-head products (absorb attention), all heads in one region ------ */

/* y[c] = sum_r x[r] w[row0 + r][c] for one token, FP8 or BF16 weights, C a
 * multiple of 256: two passes of 256 columns over the head's rows, 16
 * accumulators each, every element widened by one shift or mask of a 32-bit
 * lane. FP8 codes go through fp8x64_to_bf16 first (bf16 of the value times
 * 2^-120, exact as the high half of a float32, subnormal codes included), so
 * x carries the block scale times 2^56 and the sums 2^64 back. Accumulator
 * 4g + k, lane i holds column 64 g + (FP8: 4 i + (0, 2, 1, 3)[k]; BF16:
 * 32 (k / 2) + 2 i + k % 2). The first pass fetches whole rows 8 ahead for
 * the second. */
AVX512 INLINE void heads_t_1(ds_wfmt f, float *y, const float *x, const ds_weight *w, int row0, int rows)
{
    bool fp8 = f == DS_W_FP8;
    int C = w->cols, cb = C / DS_BLOCK, esz = fp8 ? 1 : 2;
    const __m512i hm = _mm512_set1_epi32((int)0xFFFF0000);
    for (int c0 = 0; c0 < C; c0 += 256) {
        __m512 acc[16];
        #pragma GCC unroll 16
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        for (int r = 0; r < rows; r++) {
            const uint8_t *row = (const uint8_t *)w_row(w, row0 + r) + (size_t)c0 * esz;
            if (c0 == 0 && r + 8 < rows)
                for (int o = 0; o < C * esz; o += 64) _mm_prefetch((const char *)w_row(w, row0 + r + 8) + o, _MM_HINT_T0);
            __m512 xb[2];
            if (fp8) {
                const float *sr = w->scale + (size_t)((row0 + r) / DS_BLOCK) * cb + c0 / DS_BLOCK;
                xb[0] = _mm512_set1_ps(x[r] * sr[0] * DP_XSHIFT);
                xb[1] = _mm512_set1_ps(x[r] * sr[1] * DP_XSHIFT);
            } else {
                xb[0] = xb[1] = _mm512_set1_ps(x[r]);
            }
            #pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m512i E, O;
                if (fp8) {
                    fp8x64_to_bf16(_mm512_loadu_si512(row + 64 * g), &E, &O);
                } else {
                    E = _mm512_loadu_si512(row + 128 * g);
                    O = _mm512_loadu_si512(row + 128 * g + 64);
                }
                __m512 b = xb[g / 2];
                acc[4 * g + 0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(E, 16)), b, acc[4 * g + 0]);
                acc[4 * g + 1] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(E, hm)), b, acc[4 * g + 1]);
                acc[4 * g + 2] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(O, 16)), b, acc[4 * g + 2]);
                acc[4 * g + 3] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(O, hm)), b, acc[4 * g + 3]);
            }
        }
        float v[16][16];
        __m512 back = _mm512_set1_ps(fp8 ? 18446744073709551616.0f : 1.0f); /* 2^64 */
        #pragma GCC unroll 16
        for (int i = 0; i < 16; i++) _mm512_storeu_ps(v[i], _mm512_mul_ps(acc[i], back));
        for (int g = 0; g < 4; g++)
            for (int k = 0; k < 4; k++)
                for (int i = 0; i < 16; i++)
                    y[c0 + 64 * g + (fp8 ? 4 * i + (k == 1 ? 2 : k == 2 ? 1 : k) : 32 * (k / 2) + 2 * i + k % 2)] =
                        v[4 * g + k][i];
    }
}

AVX512 static void heads_t_fp8_1(float *y, const float *x, const ds_weight *w, int row0, int rows)
{
    heads_t_1(DS_W_FP8, y, x, w, row0, rows);
}
AVX512 static void heads_t_bf16_1(float *y, const float *x, const ds_weight *w, int row0, int rows)
{
    heads_t_1(DS_W_BF16, y, x, w, row0, rows);
}

AVX512 void avx512_matmul_heads_t(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w,
                                  int row0, int hstride, int rows)
{
    int C = w->cols, nc = (C + 127) / 128, ng = (n + 2) / 3;
    size_t ldx = (size_t)H * xs, ldy = (size_t)H * ys;
    if (n == 1 && (w->fmt == DS_W_FP8 || w->fmt == DS_W_BF16) && C % 256 == 0) {
        #pragma omp parallel for schedule(static) if (H > 1)
        for (int h = 0; h < H; h++) {
            if (w->fmt == DS_W_FP8) heads_t_fp8_1(y + (size_t)h * ys, x + (size_t)h * xs, w, row0 + h * hstride, rows);
            else heads_t_bf16_1(y + (size_t)h * ys, x + (size_t)h * xs, w, row0 + h * hstride, rows);
        }
        return;
    }
    #pragma omp parallel for schedule(static) if (H * nc * ng > 1)
    for (int u = 0; u < H * nc * ng; u++) {
        int h = u / (nc * ng), c0 = (u % nc) * 128, t0 = (u / nc % ng) * 3, T = MIN(3, n - t0);
        gemv_t_unit(T, y + t0 * ldy + (size_t)h * ys, ldy, x + t0 * ldx + (size_t)h * xs, ldx, w,
                    row0 + h * hstride, rows, c0);
    }
}

AVX512 void avx512_matmul_heads(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                                int hstride, int rows)
{
    cpu_matmul_heads(y, ys, x, xs, n, H, w, row0, hstride, rows, avx512_matmul_many, avx512_matmul);
}

/* ---- absorb attention ---------------------------------------------------
 * For one token, all heads, positions [j0, j1): scores s[h][j] = (q_c[h].kv[j]
 * + q_pe[h].pe[j]) * scale, an online softmax (running max mx[h] and sum l[h])
 * and o[h] = sum_j p[h][j] kv[j] (not yet divided by l). Every cache row is
 * read once for all heads. Needs kv_rank and rope to be multiples of 16. */

#define ATT_JB 64
/* The first head group's prefetch of the cache rows: 32 positions ahead, into
 * L2 (prefetcht2). Measured (Zen 4, bench/attention.sh 4096, alternated):
 * into L1 16 or 32 ahead 1.00-1.04 ms a call, into L2 16 / 32 / 64 ahead
 * 0.85-0.86 ms; the 8-layer FP8 bench's decode at depth 4096 +5%. */
#define ATT_PF_ROWS 32

/* The 16 sums of a[0..16) as one vector: r[i] = sum of the lanes of a[i]
 * (pairwise unpack-and-add levels instead of 16 separate reductions). */
AVX512 INLINE __m512 reduce16(const __m512 *a)
{
    __m512 x[8], y[4], z[2];
    #pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        x[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512d u = _mm512_castps_pd(x[2 * i]), v = _mm512_castps_pd(x[2 * i + 1]);
        y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(u, v)), _mm512_castpd_ps(_mm512_unpackhi_pd(u, v)));
    }
    #pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
        z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88), _mm512_shuffle_f32x4(z[0], z[1], 0xDD));
}

/* Scores of heads [h, h+HN) at positions [j, j+JN) into sc[h][j - jb]. The
 * first head group (pf) prefetches the cache rows ATT_PF_ROWS positions ahead:
 * they come from memory, four short streams that the hardware prefetcher picks
 * up late. */
AVX512 INLINE void att_scores(int HN, int JN, const ds_attn_args *a, const float *qc, const float *qp,
                              const float *kv, const float *pe, int h, int j, int jb, float *sc, bool pf)
{
    int R = a->kv_rank, Rk = a->key_dims ? a->key_dims : R, P = a->rope;
    __m512 acc[4][4];
    #pragma GCC unroll 16
    for (int u = 0; u < HN; u++)
        #pragma GCC unroll 16
        for (int v = 0; v < JN; v++) acc[u][v] = _mm512_setzero_ps();
    for (int c = 0; c < Rk; c += 16) {
        __m512 kvv[4];
        if (pf)
            #pragma GCC unroll 16
            for (int v = 0; v < JN; v++) _mm_prefetch((const char *)(kv + (size_t)(j + v + ATT_PF_ROWS) * R + c), _MM_HINT_T2);
        #pragma GCC unroll 16
        for (int v = 0; v < JN; v++) kvv[v] = _mm512_loadu_ps(kv + (size_t)(j + v) * R + c);
        #pragma GCC unroll 16
        for (int u = 0; u < HN; u++) {
            __m512 q = _mm512_loadu_ps(qc + (size_t)(h + u) * R + c);
            #pragma GCC unroll 16
            for (int v = 0; v < JN; v++) acc[u][v] = _mm512_fmadd_ps(q, kvv[v], acc[u][v]);
        }
    }
    for (int c = 0; c < P; c += 16) {
        if (pf)
            #pragma GCC unroll 16
            for (int v = 0; v < JN; v++) _mm_prefetch((const char *)(pe + (size_t)(j + v + ATT_PF_ROWS) * P + c), _MM_HINT_T2);
        #pragma GCC unroll 16
        for (int u = 0; u < HN; u++) {
            __m512 q = _mm512_loadu_ps(qp + (size_t)(h + u) * P + c);
            #pragma GCC unroll 16
            for (int v = 0; v < JN; v++)
                acc[u][v] = _mm512_fmadd_ps(q, _mm512_loadu_ps(pe + (size_t)(j + v) * P + c), acc[u][v]);
        }
    }
    if (HN == 4 && JN == 4) {
        __m512 sum = _mm512_mul_ps(reduce16(&acc[0][0]), _mm512_set1_ps(a->softmax_scale)); /* lane 4u + v */
        _mm_storeu_ps(sc + (size_t)h * ATT_JB + j - jb, _mm512_castps512_ps128(sum));
        _mm_storeu_ps(sc + (size_t)(h + 1) * ATT_JB + j - jb, _mm512_extractf32x4_ps(sum, 1));
        _mm_storeu_ps(sc + (size_t)(h + 2) * ATT_JB + j - jb, _mm512_extractf32x4_ps(sum, 2));
        _mm_storeu_ps(sc + (size_t)(h + 3) * ATT_JB + j - jb, _mm512_extractf32x4_ps(sum, 3));
        return;
    }
    #pragma GCC unroll 16
    for (int u = 0; u < HN; u++)
        #pragma GCC unroll 16
        for (int v = 0; v < JN; v++)
            sc[(size_t)(h + u) * ATT_JB + j + v - jb] = _mm512_reduce_add_ps(acc[u][v]) * a->softmax_scale;
}

/* With heads in multiples of 16 the scores take a head a lane, which
 * needs no sums across lanes and reads each cache row once for 16 heads from a
 * copy in L1. qt[d][h] (d over the Rk key columns, then the P rope columns) holds
 * the token's queries transposed, made once a call. */
AVX512 static void att_qt(int H, int R, int Rk, int P, const float *qc, const float *qp, float *qt)
{
    for (int h = 0; h < H; h += 16)
        for (int d = 0; d < Rk + P; d += 16) {
            __m512i r[16];
            #pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = _mm512_loadu_si512(d < Rk ? qc + (size_t)(h + i) * R + d : qp + (size_t)(h + i) * P + d - Rk);
            transpose16(r);
            #pragma GCC unroll 16
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(qt + (size_t)(d + i) * H + h, r[i]);
        }
}

/* Scores of heads [g, g+16) at positions [j, j+16) into sc[h][j - jb]: for each key
 * column, the 16 heads' queries (a row of qt) times each position's value, broadcast
 * from a copy of the 16 rows' current 16 columns (made one chunk ahead, so that the
 * broadcasts read settled lines). pf: prefetch the rows ATT_PF_ROWS positions on. */
AVX512 INLINE void att_scores16(const ds_attn_args *a, const float *qt, const float *kv, const float *pe, int g, int j,
                                int jb, float *sc, bool pf)
{
    int H = a->n_heads, R = a->kv_rank, Rk = a->key_dims ? a->key_dims : R, P = a->rope, D = Rk + P;
    float tile[2][16][16] __attribute__((aligned(64)));
    __m512 acc[16];
    #pragma GCC unroll 16
    for (int v = 0; v < 16; v++) acc[v] = _mm512_setzero_ps();
    /* the 16 rows' columns [d, d + 16) into tile[b] */
    #define ATT_COPY(b, d)                                                                                          \
        do {                                                                                                        \
            int d_ = (d);                                                                                           \
            const float *src_ = d_ < Rk ? kv + (size_t)j * R + d_ : pe + (size_t)j * P + d_ - Rk;                   \
            size_t ld_ = d_ < Rk ? (size_t)R : (size_t)P;                                                           \
            _Pragma("GCC unroll 16") for (int v = 0; v < 16; v++)                                                   \
            {                                                                                                       \
                if (pf) _mm_prefetch((const char *)(src_ + (v + ATT_PF_ROWS) * ld_), _MM_HINT_T2);                  \
                _mm512_store_ps(tile[b][v], _mm512_loadu_ps(src_ + v * ld_));                                       \
            }                                                                                                       \
        } while (0)
    ATT_COPY(0, 0);
    /* the sums run in blocks of ATT_DB columns added into tot, so that a chain of
     * roundings is ATT_DB long, not D (576 at 16B: 1.3e-5 off the reference's
     * eight-lane sums on bench-like inputs; test_kernels' bar is 1e-5) */
    enum { ATT_DB = 64 };
    __m512 tot[16];
    #pragma GCC unroll 16
    for (int v = 0; v < 16; v++) tot[v] = _mm512_setzero_ps();
    for (int d0 = 0; d0 < D; d0 += ATT_DB) {
        for (int d = d0; d < MIN(D, d0 + ATT_DB); d += 16) {
            int b = (d >> 4) & 1;
            if (d + 16 < D) ATT_COPY(b ^ 1, d + 16);
            const float *q = qt + (size_t)d * H + g;
            #pragma GCC unroll 16
            for (int e = 0; e < 16; e++) {
                __m512 qv = _mm512_loadu_ps(q + (size_t)e * H);
                #pragma GCC unroll 16
                for (int v = 0; v < 16; v++) acc[v] = _mm512_fmadd_ps(qv, _mm512_set1_ps(tile[b][v][e]), acc[v]);
            }
        }
        #pragma GCC unroll 16
        for (int v = 0; v < 16; v++) {
            tot[v] = _mm512_add_ps(tot[v], acc[v]);
            acc[v] = _mm512_setzero_ps();
        }
    }
    #undef ATT_COPY
    transpose16((__m512i *)tot); /* tot[h]: head g + h at the 16 positions */
    __m512 sv = _mm512_set1_ps(a->softmax_scale);
    #pragma GCC unroll 16
    for (int h = 0; h < 16; h++) _mm512_storeu_ps(sc + (size_t)(g + h) * ATT_JB + j - jb, _mm512_mul_ps(tot[h], sv));
}

/* o[h][c..c+16 NV) += sum_j p[h][j] kv[j][c..c+16 NV) for heads [h, h+HN), HN * NV <= 16
 * accumulators. Eight heads x 2 vectors (each cache row chunk loaded from L2 once for
 * eight heads) ran the values pass ~9% faster at 16 heads than 4 x 4; 4 x 4 and 1 x 4
 * take the heads past the last multiple of eight. p broadcast inside each
 * FMA (a {1to16} operand, 16 loads a position where there were 8 vbroadcastss) measured
 * slower, bench/attention.sh 4096, six alternated rounds: medians 0.785-0.933 ms against
 * 0.769-0.894. */
AVX512 INLINE void att_values(int HN, int NV, int R, int ld, const float *kv, int jb, int nj, const float *p, int h,
                              int c, float *o)
{
    __m512 acc[8][4];
    #pragma GCC unroll 16
    for (int u = 0; u < HN; u++)
        #pragma GCC unroll 16
        for (int i = 0; i < NV; i++) acc[u][i] = _mm512_loadu_ps(o + (size_t)(h + u) * R + c + 16 * i);
    for (int j = 0; j < nj; j++) {
        const float *kr = kv + (size_t)(jb + j) * ld + c;
        __m512 kvv[4];
        #pragma GCC unroll 16
        for (int i = 0; i < NV; i++) kvv[i] = _mm512_loadu_ps(kr + 16 * i);
        #pragma GCC unroll 16
        for (int u = 0; u < HN; u++) {
            __m512 pb = _mm512_set1_ps(p[(size_t)(h + u) * ATT_JB + j]);
            #pragma GCC unroll 16
            for (int i = 0; i < NV; i++) acc[u][i] = _mm512_fmadd_ps(pb, kvv[i], acc[u][i]);
        }
    }
    #pragma GCC unroll 16
    for (int u = 0; u < HN; u++)
        #pragma GCC unroll 16
        for (int i = 0; i < NV; i++) _mm512_storeu_ps(o + (size_t)(h + u) * R + c + 16 * i, acc[u][i]);
}

/* Where the time goes at 4096 positions (Zen 5, bench/attention.sh, 4 x 4 score
 * tiles, 0.53-0.55 ms a call):
 * the values pass ~0.17 ms (~92% of the FMA peak), the scores and the softmax ~0.38,
 * of which the first head group, the one that brings the cache rows in from memory,
 * takes about three times what each of the other three does. Measured slower:
 * each head group prefetching a quarter of the next block's rows (T1 or T0) so that
 * the memory traffic runs under the arithmetic, 0.61-0.65 ms; the positions outer
 * and the head groups inner (each row read from memory once and used four times from
 * L1 at once, q from L2), 0.63-0.65 ms. On Zen 4 (bench/attention.sh 4096, 200 calls,
 * alternated): score tiles of 8 heads x 2 positions (each row read twice from L2
 * instead of four times, but 10 loads per 16 FMAs instead of 8) 0.96-1.08 ms against
 * 0.85-0.92 with 4 x 4; blocks of 128 positions level with 64. A bf16 cache (the
 * reference's own format, which bf16 dot products could read at twice the rate) moved
 * the golden logits by up to 0.72 of the largest (s200; bar 1e-3), so it stays float32.
 * Heads in multiples of 16 take their scores a head a lane (att_scores16):
 * on Zen 4, bench/attention.sh 4096, 1000 calls, three alternated rounds, median
 * 0.78-0.81 ms against 0.83-0.88 with 4 x 4 tiles (75-78% against 69-73% of the
 * FMA peak); perf puts 53% of att_part in the scores and 41% in the values pass, both near the same
 * rate. */
AVX512 static void att_part(const ds_attn_args *a, int t, int j0, int j1, float *mx, float *l, float *o, float *sc)
{
    /* ld: a cache row; R: the output's columns (ld - val_off), from val_off on */
    int H = a->n_heads, ld = a->kv_rank, R = ld - a->val_off, s = a->seq[t];
    const float *qc = a->q_c + (size_t)t * H * ld, *qp = a->q_pe + (size_t)t * H * a->rope;
    const float *kv = a->kv_cache + (size_t)s * a->ctx * ld, *pe = a->pe_cache + (size_t)s * a->ctx * a->rope;
    const float *kvo = kv + a->val_off; /* the values' columns */
    int H8 = R % 32 ? 0 : H / 8 * 8; /* heads the values pass takes eight at a time */
    bool t16 = H % 16 == 0;          /* the scores a head a lane (att_scores16) */
    float *qt = sc + (size_t)H * ATT_JB; /* cpu_attention_run's scratch has room for it */
    if (t16) att_qt(H, ld, a->key_dims ? a->key_dims : ld, a->rope, qc, qp, qt);
    for (int h = 0; h < H; h++) {
        mx[h] = -INFINITY;
        l[h] = 0;
    }
    memset(o, 0, sizeof(float) * (size_t)H * R);
    for (int jb = j0; jb < j1; jb += ATT_JB) {
        int nj = MIN(ATT_JB, j1 - jb), h = 0, j16 = jb; /* j16: where the 16-position tiles end */
        if (t16)
            for (; j16 + 16 <= jb + nj; j16 += 16)
                for (int g = 0; g < H; g += 16) att_scores16(a, qt, kv, pe, g, j16, jb, sc, g == 0);
        for (; h + 4 <= H; h += 4) {
            int j = j16;
            for (; j + 4 <= jb + nj; j += 4) att_scores(4, 4, a, qc, qp, kv, pe, h, j, jb, sc, h == 0);
            for (; j < jb + nj; j++) att_scores(4, 1, a, qc, qp, kv, pe, h, j, jb, sc, false);
        }
        for (; h < H; h++)
            for (int j = j16; j < jb + nj; j++) att_scores(1, 1, a, qc, qp, kv, pe, h, j, jb, sc, false);
        /* online softmax: rescale what was accumulated under the old maximum */
        for (h = 0; h < H; h++) {
            float *sh = sc + (size_t)h * ATT_JB, m = mx[h];
            if (cpu_att_past_head(a, h, jb, nj, sh, m)) continue;
            for (int j = 0; j < nj; j += 16) {
                __mmask16 k = mask16(nj - j);
                m = fmaxf(m, _mm512_mask_reduce_max_ps(k, _mm512_maskz_loadu_ps(k, sh + j)));
            }
            float corr = expf(mx[h] - m), sum = 0;
            __m512 mv = _mm512_set1_ps(m);
            for (int j = 0; j < nj; j += 16) {
                __mmask16 k = mask16(nj - j);
                __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sh + j), mv));
                _mm512_mask_storeu_ps(sh + j, k, e);
                sum += _mm512_mask_reduce_add_ps(k, e);
            }
            l[h] = l[h] * corr + sum;
            mx[h] = m;
            if (corr != 1.0f) {
                __m512 cv = _mm512_set1_ps(corr);
                for (int c = 0; c < R; c += 16)
                    _mm512_storeu_ps(o + (size_t)h * R + c, _mm512_mul_ps(_mm512_loadu_ps(o + (size_t)h * R + c), cv));
            }
        }
        for (int c = 0; c < R; c += 32)
            for (h = 0; h + 8 <= H8; h += 8) att_values(8, 2, R, ld, kvo, jb, nj, sc, h, c, o);
        for (int c = 0; c < R; c += 64) {
            h = H8;
            if (R - c >= 64) {
                for (; h + 4 <= H; h += 4) att_values(4, 4, R, ld, kvo, jb, nj, sc, h, c, o);
                for (; h < H; h++) att_values(1, 4, R, ld, kvo, jb, nj, sc, h, c, o);
            } else {
                for (; h < H; h++)
                    for (int j = 0; j < nj; j++) {
                        float p = sc[(size_t)h * ATT_JB + j];
                        for (int cc = c; cc < R; cc++) o[(size_t)h * R + cc] += p * kvo[(size_t)(jb + j) * ld + cc];
                    }
            }
        }
    }
}

AVX512 void avx512_attention(const ds_attn_args *a, ds_attn_impl impl)
{
    if (impl != DS_ATTN_ABSORB || a->kv_rank % 16 || a->rope % 16 || a->key_dims % 16 || a->val_off % 16) {
        cpu_ref_ops.attention(a, impl);
        return;
    }
    cpu_attention_run(a, ATT_JB, att_part);
}

/* ---- silu ---------------------------------------------------------------- */

AVX512 void avx512_silu_mul(float *a, const float *b, size_t n)
{
    /* silu(x) = x * sigmoid(x) = x / (1 + exp(-x)) */
    #pragma omp parallel for schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = mask16((int)MIN(16, n - i));
        __m512 x = _mm512_maskz_loadu_ps(m, a + i);
        __m512 s = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        _mm512_mask_storeu_ps(a + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, b + i)));
    }
}
