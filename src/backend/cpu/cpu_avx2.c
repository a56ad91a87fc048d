/* cpu_avx2.c - AVX2 (+FMA, F16C) kernels for CPUs without AVX-512: matmul
 * (decode and GEMM), the per-head and transposed products, absorb attention.
 *
 * Decode (few tokens): cpu_decode_many's work units, as on AVX-512, one row at
 * a time against up to four tokens in float32: e4m3 widened through bf16 (the
 * block scale and 2^64 folded into the activations, the sums times 2^56), BF16
 * by a shift or a mask, weights prefetched into L2 ahead of the loop, long
 * rows in column pieces. Many tokens: a register-tiled float32 GEMM on panels widened once
 * (avx2_gemm); no bf16 dot-product instructions exist here. cpu_tuning.isa
 * CPU_ISA_AVX2 selects these kernels on a CPU with AVX-512 too. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
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

AVX2 static void gemv8_f32(int R, int T, const ds_weight *w, int r0, const float *xs, size_t ldx, float *y, size_t ldy)
{
    GEMV8_CASES(DS_W_F32)
}

/* ---- decode ---------------------------------------------------------------
 * Rows prefetched PREFETCH_BYTES ahead into L2 (as the AVX-512 kernels do: see
 * cpu_avx512.c for the Zen 4 figures); rows whose activations pass GEMV_X_BYTES
 * go in column pieces, each prefetching the same piece of a later row. BF16 rows
 * too, where the AVX-512 kernel leaves them to the hardware prefetchers: on Zen 3
 * (no AVX-512; BF16 8-layer model, `dsv3 bench -p 0 -n 32`, three settings
 * rotated five rounds) decode read 70.3% of the bandwidth beside it
 * with none, 72.2% with 4 KiB ahead and 78.1% with 12 KiB (75-80% in each
 * round). */
#define PREFETCH_BYTES 12288
#define GEMV_X_BYTES 16384

/* 16 e4m3 codes -> their values times 2^-8, as two vectors of 8. */
AVX2 INLINE void fp8x16_to_f32(const uint8_t *p, __m256 *lo, __m256 *hi)
{
    __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xBF80));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* 16 e4m3 codes as floats times 2^-120, exact (subnormal codes become float32
 * subnormals): through bf16 (the sign-extended code shifted left 4 and masked,
 * as cpu_avx512.c's fp8x64_to_bf16 does), widened by interleaving with zeros. The
 * interleave works within 128-bit lanes: lo holds codes 0-3 and 8-11, hi 4-7
 * and 12-15 (prep_fp8_acts8 orders the activations to match). Five operations
 * for 16 codes, where the fp16 route (fp8x16_to_f32) takes seven. */
AVX2 INLINE void fp8x16_to_f32_bf(const uint8_t *p, __m256 *lo, __m256 *hi)
{
    __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    h = _mm256_and_si256(_mm256_slli_epi16(h, 4), _mm256_set1_epi16((short)0x87F0));
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), h));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), h));
}

/* 32 e4m3 codes as four vectors of 8 floats, values times 2^-120 as above,
 * without a shuffle: each code's bf16 made in its 16-bit lane (the
 * even-numbered code first moved up a byte, as cpu_avx512.c's fp8x64_to_bf16),
 * then widened in its 32-bit lane by a shift or a mask. w[0] holds codes 0, 4,
 * .., 28, w[1] 2, 6, .., 30, w[2] 1, 5, .., 29 and w[3] 3, 7, .., 31
 * (prep_fp8_acts8 orders the activations to match). Nine operations for 32
 * codes, five of them shifts and none a shuffle, where fp8x16_to_f32_bf takes
 * ten, eight of them shifts, widenings and unpacks: the operations that only
 * some of a core's vector pipes run (one on Intel's big cores, where the FMAs
 * take two others; two on Zen 4, one of which the FMAs share). */
AVX2 INLINE void fp8x32_to_f32_bf(const uint8_t *p, __m256 w[4])
{
    const __m256i m = _mm256_set1_epi16((short)0x87F0), hm = _mm256_set1_epi32((int)0xFFFF0000);
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    __m256i e = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4), m);
    __m256i o = _mm256_and_si256(_mm256_srai_epi16(v, 4), m);
    w[0] = _mm256_castsi256_ps(_mm256_slli_epi32(e, 16));
    w[1] = _mm256_castsi256_ps(_mm256_and_si256(e, hm));
    w[2] = _mm256_castsi256_ps(_mm256_slli_epi32(o, 16));
    w[3] = _mm256_castsi256_ps(_mm256_and_si256(o, hm));
}

/* 16 bf16 weights as floats: those of even number (shifted), then the odd
 * ones (masked); prep_bf16_acts8 orders the activations to match. */
AVX2 INLINE void bf16x16_to_f32(const uint16_t *p, __m256 *even, __m256 *odd)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000)));
}

/* xp[t]: per 16 columns, the 8 of even number, then the 8 odd ones; the
 * columns past the last multiple of 16 as they are. */
static void prep_bf16_acts8(float *xp, const float *x, int n, int K)
{
    int K16 = K / 16 * 16;
    for (int t = 0; t < n; t++) {
        const float *xi = x + (size_t)t * K;
        float *o = xp + (size_t)t * K;
        for (int k = 0; k < K16; k += 16)
            for (int i = 0; i < 8; i++) {
                o[k + i] = xi[k + 2 * i];
                o[k + 8 + i] = xi[k + 2 * i + 1];
            }
        for (int k = K16; k < K; k++) o[k] = xi[k];
    }
}

/* Columns [0, K) of one BF16 row (row and xs already at the piece's first
 * column) against T <= 4 tokens; U chunks of 16 a step, two chains each per
 * token (FMA latency x throughput: 8 at one token). pf: prefetch distance, 0
 * for none; add: onto y. */
AVX2 INLINE void dec_tile(int T, int U, const uint16_t *row, int K, size_t pf, const float *xs, size_t ldx, float *y,
                          size_t ldy, bool add)
{
    int K16 = K / 16 * 16;
    __m256 acc[4][2][4];
    #pragma GCC unroll 16
    for (int u = 0; u < U; u++)
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[u][0][t] = acc[u][1][t] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 * U <= K16; k += 16 * U) {
        if (pf)
            for (int o = 0; o < 32 * U; o += 64) _mm_prefetch((const char *)(row + k) + pf + o, _MM_HINT_T2);
        #pragma GCC unroll 16
        for (int u = 0; u < U; u++) {
            __m256 a, b;
            bf16x16_to_f32(row + k + 16 * u, &a, &b);
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++) {
                const float *xt = xs + t * ldx + k + 16 * u;
                acc[u][0][t] = _mm256_fmadd_ps(a, _mm256_loadu_ps(xt), acc[u][0][t]);
                acc[u][1][t] = _mm256_fmadd_ps(b, _mm256_loadu_ps(xt + 8), acc[u][1][t]);
            }
        }
    }
    for (; k < K16; k += 16) {
        __m256 a, b;
        bf16x16_to_f32(row + k, &a, &b);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            acc[0][0][t] = _mm256_fmadd_ps(a, _mm256_loadu_ps(xs + t * ldx + k), acc[0][0][t]);
            acc[0][1][t] = _mm256_fmadd_ps(b, _mm256_loadu_ps(xs + t * ldx + k + 8), acc[0][1][t]);
        }
    }
    for (; k < K; k += 8) { /* the tail, in column order */
        int m = MIN(8, K - k);
        __m256 wv = load_w8(DS_W_BF16, row, k, m);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[0][0][t] = _mm256_fmadd_ps(wv, load_x8(xs + t * ldx, k, m), acc[0][0][t]);
    }
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        __m256 sum = _mm256_add_ps(acc[0][0][t], acc[0][1][t]);
        #pragma GCC unroll 16
        for (int u = 1; u < U; u++) sum = _mm256_add_ps(sum, _mm256_add_ps(acc[u][0][t], acc[u][1][t]));
        float v = hsum8(sum);
        y[t * ldy] = add ? y[t * ldy] + v : v;
    }
}

/* dec_tile for FP8 rows, 32 codes a chunk (fp8x32_to_f32_bf), U chunks a
 * step; NA sums a token. A last chunk of 16 goes through fp8x16_to_f32_bf, the
 * columns past it through float32.
 *   Four sums at one token, not the eight that FMA latency x throughput asks
 * for: on Zen 3 the widening's shifts and the FMAs share two pipes (a standalone
 * mix of 2 FMAs to 1 shift issues 1.7 a cycle), and the one-token loop took
 * 19.3-19.5 cycles per 128 codes from L1 with 8 sums against 16.5-17.2 with 4
 * (18-20 against 23-23.5 from L2; standalone copies of the loop). */
AVX2 INLINE void dec_tile_fp8(int T, int U, const uint8_t *row, int K, size_t pf, const float *xs, size_t ldx,
                              float *y, size_t ldy, bool add)
{
    const int NA = T <= 2 ? 4 : 2;
    int K32 = K / 32 * 32, K16 = K / 16 * 16;
    __m256 acc[8][4];
    #pragma GCC unroll 16
    for (int c = 0; c < NA; c++)
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[c][t] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 32 * U <= K32; k += 32 * U) {
        if (pf && (32 * U >= 64 || k % 64 == 0))
            for (int o = 0; o < 32 * U; o += 64) _mm_prefetch((const char *)row + k + pf + o, _MM_HINT_T2);
        #pragma GCC unroll 16
        for (int u = 0; u < U; u++) {
            __m256 w[4];
            fp8x32_to_f32_bf(row + k + 32 * u, w);
            #pragma GCC unroll 16
            for (int i = 0; i < 4; i++)
                #pragma GCC unroll 16
                for (int t = 0; t < T; t++)
                    acc[(4 * u + i) % NA][t] =
                        _mm256_fmadd_ps(w[i], _mm256_loadu_ps(xs + t * ldx + k + 32 * u + 8 * i), acc[(4 * u + i) % NA][t]);
        }
    }
    for (; k < K32; k += 32) {
        __m256 w[4];
        fp8x32_to_f32_bf(row + k, w);
        #pragma GCC unroll 16
        for (int i = 0; i < 4; i++)
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++)
                acc[i % NA][t] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(xs + t * ldx + k + 8 * i), acc[i % NA][t]);
    }
    if (k < K16) {
        __m256 a, b;
        fp8x16_to_f32_bf(row + k, &a, &b);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            acc[0][t] = _mm256_fmadd_ps(a, _mm256_loadu_ps(xs + t * ldx + k), acc[0][t]);
            acc[1][t] = _mm256_fmadd_ps(b, _mm256_loadu_ps(xs + t * ldx + k + 8), acc[1][t]);
        }
        k += 16;
    }
    for (; k < K; k += 8) { /* the tail, in column order */
        int m = MIN(8, K - k);
        __m256 wv = _mm256_mul_ps(load_w8(DS_W_FP8, row, k, m), _mm256_set1_ps(0x1p-112f)); /* value * 2^-120 */
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[0][t] = _mm256_fmadd_ps(wv, load_x8(xs + t * ldx, k, m), acc[0][t]);
    }
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        __m256 sum = acc[0][t];
        #pragma GCC unroll 16
        for (int c = 1; c < NA; c++) sum = _mm256_add_ps(sum, acc[c][t]);
        float v = hsum8(sum) * 0x1p56f;
        y[t * ldy] = add ? y[t * ldy] + v : v;
    }
}

/* One row (FP8: dec_tile_fp8, BF16: dec_tile) against T <= 4 tokens. */
AVX2 static void dec_row(bool fp8, int T, const void *row, int K, size_t pf, const float *xs, size_t ldx, float *y,
                         size_t ldy, bool add)
{
    const uint8_t *r8 = row;
    const uint16_t *r16 = row;
    switch (T) {
    case 4:
        if (fp8) dec_tile_fp8(4, 1, r8, K, pf, xs, ldx, y, ldy, add);
        else dec_tile(4, 1, r16, K, pf, xs, ldx, y, ldy, add);
        break;
    case 3:
        if (fp8) dec_tile_fp8(3, 1, r8, K, pf, xs, ldx, y, ldy, add);
        else dec_tile(3, 1, r16, K, pf, xs, ldx, y, ldy, add);
        break;
    case 2:
        if (fp8) dec_tile_fp8(2, 1, r8, K, pf, xs, ldx, y, ldy, add);
        else dec_tile(2, 2, r16, K, pf, xs, ldx, y, ldy, add);
        break;
    default:
        if (fp8) dec_tile_fp8(1, 2, r8, K, pf, xs, ldx, y, ldy, add);
        else dec_tile(1, 4, r16, K, pf, xs, ldx, y, ldy, add);
        break;
    }
}

AVX2 static void prep_fp8_acts8(float *xs, const float *x, int n, const ds_weight *w, int rb);

/* Rows [a, b) of job j (a cpu_decode_rows_fn): FP8 activations scaled per
 * scale block, BF16 permuted once per job, float32 weights through gemv8. */
AVX2 static void decode_rows8(const ds_matmul_job *j, int a, int b, float *xs, cpu_decode_state *st)
{
    const ds_weight *w = j->w;
    int K = w->cols, n = j->n;
    size_t ldx = (size_t)K;
    if (w->fmt == DS_W_F32) {
        for (int r = a; r < b; r++)
            for (int t0 = 0; t0 < n; t0 += 4)
                gemv8_f32(1, MIN(4, n - t0), w, j->row0 + r, j->x + (size_t)t0 * ldx, ldx, j->y + (size_t)t0 * j->rows + r,
                          (size_t)j->rows);
        return;
    }
    bool fp8 = w->fmt == DS_W_FP8;
    if (!fp8 && st->job != j) prep_bf16_acts8(xs, j->x, n, K);
    if (!fp8) st->job = j;
    int kc;
    size_t row_pf;
    cpu_decode_pieces(K, n, fp8 ? 1 : 2, GEMV_X_BYTES, PREFETCH_BYTES, &kc, &row_pf);
    size_t pf = row_pf ? row_pf : PREFETCH_BYTES;
    while (a < b) {
        int e = b;
        if (fp8) {
            int rb = (j->row0 + a) / DS_BLOCK;
            e = MIN(b, (rb + 1) * DS_BLOCK - j->row0);
            if (rb != st->rb || j != st->job) prep_fp8_acts8(xs, j->x, n, w, st->rb = rb);
            st->job = j;
        }
        for (int k0 = 0; k0 < K; k0 += kc) {
            int len = MIN(kc, K - k0);
            for (int r = a; r < e; r++) {
                const uint8_t *row = (const uint8_t *)w_row(w, j->row0 + r) + (size_t)k0 * (fp8 ? 1 : 2);
                for (int t0 = 0; t0 < n; t0 += 4)
                    dec_row(fp8, MIN(4, n - t0), row, len, pf, xs + (size_t)t0 * ldx + k0, ldx,
                            j->y + (size_t)t0 * j->rows + r, (size_t)j->rows, k0 > 0);
            }
        }
        a = e;
    }
}

/* xs[t][k] = x[t][k] * s[rb][k/128] * 2^64 (FP8 weights, row block rb: the
 * products with codes times 2^-120 come out times 2^-56, in float's normal
 * range), per 32 columns in fp8x32_to_f32_bf's order (0, 4, .., 28, then 2,
 * 6, .., 30, 1, 5, .., 29 and 3, 7, .., 31); a last 16 in fp8x16_to_f32_bf's
 * (0-3, 8-11, 4-7, 12-15); the columns past those as they are. */
AVX2 static void prep_fp8_acts8(float *xs, const float *x, int n, const ds_weight *w, int rb)
{
    static const int ord16[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
    const __m256i il = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int K = w->cols, kb = (K + DS_BLOCK - 1) / DS_BLOCK, K32 = K / 32 * 32, K16 = K / 16 * 16;
    const float *sr = w->scale + (size_t)rb * kb;
    for (int t = 0; t < n; t++) {
        const float *xi = x + (size_t)t * K;
        float *o = xs + (size_t)t * K;
        for (int k = 0; k < K32; k += 32) {
            /* a 4x4 transpose in each 128-bit lane makes r[m] = columns m + {0, 8, 16,
             * 24} (low lane) and m + {4, 12, 20, 28} (high lane); il puts them in order */
            __m256 sv = _mm256_set1_ps(sr[k / DS_BLOCK] * 0x1p64f);
            __m256 a0 = _mm256_loadu_ps(xi + k), a1 = _mm256_loadu_ps(xi + k + 8);
            __m256 a2 = _mm256_loadu_ps(xi + k + 16), a3 = _mm256_loadu_ps(xi + k + 24);
            __m256d t0 = _mm256_castps_pd(_mm256_unpacklo_ps(a0, a1)), t1 = _mm256_castps_pd(_mm256_unpackhi_ps(a0, a1));
            __m256d t2 = _mm256_castps_pd(_mm256_unpacklo_ps(a2, a3)), t3 = _mm256_castps_pd(_mm256_unpackhi_ps(a2, a3));
            /* fp8x32_to_f32_bf's w[0..3]: columns 0, 2, 1 and 3 mod 4 */
            __m256 r0 = _mm256_castpd_ps(_mm256_unpacklo_pd(t0, t2)), r1 = _mm256_castpd_ps(_mm256_unpackhi_pd(t0, t2));
            __m256 r2 = _mm256_castpd_ps(_mm256_unpacklo_pd(t1, t3)), r3 = _mm256_castpd_ps(_mm256_unpackhi_pd(t1, t3));
            _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_permutevar8x32_ps(r0, il), sv));
            _mm256_storeu_ps(o + k + 8, _mm256_mul_ps(_mm256_permutevar8x32_ps(r2, il), sv));
            _mm256_storeu_ps(o + k + 16, _mm256_mul_ps(_mm256_permutevar8x32_ps(r1, il), sv));
            _mm256_storeu_ps(o + k + 24, _mm256_mul_ps(_mm256_permutevar8x32_ps(r3, il), sv));
        }
        for (int k = K32; k < K16; k += 16) {
            float sv = sr[k / DS_BLOCK] * 0x1p64f;
            for (int i = 0; i < 16; i++) o[k + i] = xi[k + ord16[i]] * sv;
        }
        for (int k = K16; k < K; k++) o[k] = xi[k] * (sr[k / DS_BLOCK] * 0x1p64f);
    }
}

/* ---- many tokens: a register-tiled GEMM ------------------------------------
 * A panel of up to 16 rows x G_KC columns is widened once into float32, 16 rows
 * per column (FP8 codes times their block scale, rounded to float32: 2^-24
 * relative), and every group of up to G_NT tokens runs over it with 12
 * accumulators: per column 2 weight loads, 6 broadcasts, 12 FMAs. */
#define G_KC 256
#define G_NT 6
/* Panels a work unit: a group's activations (G_KC x G_NT floats, 6 KB) stay in
 * L1 across them, the panels (64 KB) in L2. */
#define G_PB 4

/* Token group g of n: ceil(n / G_NT) groups whose sizes differ by at most one
 * (first token *t0, *T tokens), so that from 12 tokens on every group has 4 to 6,
 * the counts at which g_tile keeps the FMA pipes full: 6 + 6 + 1 for 13 tokens
 * left a 1-token tile at half that rate, where 5 + 4 + 4 has none. A routed
 * expert's share of a prefill (near 48 tokens, any remainder mod 6) ended in a
 * group of 1 to 3 tokens half the time. */
static inline void g_group(int n, int g, int *t0, int *T)
{
    int ng = (n + G_NT - 1) / G_NT, base = n / ng, extra = n % ng;
    *t0 = g * base + MIN(g, extra);
    *T = base + (g < extra);
}

/* Under four tokens a set of 2T sums is a chain shorter than FMA latency x
 * throughput (8): S sets take columns k = s mod S and are added at the end.
 * One thread, panels from L2, GFLOP/s with one set: 27 at 1 token, 50 at 2, 73
 * at 3, 97 at 4 to 6 (Zen 3). */
AVX2 INLINE void g_tile(int T, const float *wp, int kc, const float *xp, float *y, size_t ldy, int nr, bool add)
{
    enum { S_MAX = 4 };
    const int S = T == 1 ? 4 : T <= 3 ? 2 : 1;
    __m256 acc[S_MAX][2][G_NT];
    #pragma GCC unroll 8
    for (int s = 0; s < S; s++)
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[s][0][t] = acc[s][1][t] = _mm256_setzero_ps();
    int k = 0;
    for (; k + S <= kc; k += S)
        #pragma GCC unroll 4
        for (int s = 0; s < S; s++) {
            __m256 w0 = _mm256_load_ps(wp + 16 * (k + s)), w1 = _mm256_load_ps(wp + 16 * (k + s) + 8);
            #pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m256 xb = _mm256_broadcast_ss(xp + G_NT * (k + s) + t);
                acc[s][0][t] = _mm256_fmadd_ps(w0, xb, acc[s][0][t]);
                acc[s][1][t] = _mm256_fmadd_ps(w1, xb, acc[s][1][t]);
            }
        }
    for (; k < kc; k++) {
        __m256 w0 = _mm256_load_ps(wp + 16 * k), w1 = _mm256_load_ps(wp + 16 * k + 8);
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m256 xb = _mm256_broadcast_ss(xp + G_NT * k + t);
            acc[0][0][t] = _mm256_fmadd_ps(w0, xb, acc[0][0][t]);
            acc[0][1][t] = _mm256_fmadd_ps(w1, xb, acc[0][1][t]);
        }
    }
    #pragma GCC unroll 4
    for (int s = 1; s < S; s++)
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            acc[0][0][t] = _mm256_add_ps(acc[0][0][t], acc[s][0][t]);
            acc[0][1][t] = _mm256_add_ps(acc[0][1][t], acc[s][1][t]);
        }
    #pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        float *o = y + t * ldy;
        if (nr == 16) {
            _mm256_storeu_ps(o, add ? _mm256_add_ps(_mm256_loadu_ps(o), acc[0][0][t]) : acc[0][0][t]);
            _mm256_storeu_ps(o + 8, add ? _mm256_add_ps(_mm256_loadu_ps(o + 8), acc[0][1][t]) : acc[0][1][t]);
            continue;
        }
        float v[16];
        _mm256_storeu_ps(v, acc[0][0][t]);
        _mm256_storeu_ps(v + 8, acc[0][1][t]);
        for (int i = 0; i < nr; i++) o[i] = add ? o[i] + v[i] : v[i];
    }
}

AVX2 static void g_tiles(int T, const float *wp, int kc, const float *xp, float *y, size_t ldy, int nr, bool add)
{
    switch (T) {
    case 6: g_tile(6, wp, kc, xp, y, ldy, nr, add); break;
    case 5: g_tile(5, wp, kc, xp, y, ldy, nr, add); break;
    case 4: g_tile(4, wp, kc, xp, y, ldy, nr, add); break;
    case 3: g_tile(3, wp, kc, xp, y, ldy, nr, add); break;
    case 2: g_tile(2, wp, kc, xp, y, ldy, nr, add); break;
    default: g_tile(1, wp, kc, xp, y, ldy, nr, add); break;
    }
}

/* In-register transpose of an 8x8 matrix of floats. */
AVX2 INLINE void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}

/* wp[k][0..16) = 16 rows' FP8 codes at column k (rows ld bytes apart from p)
 * times sv (the block scale times 2^120; big: times 2^60 more, for scales past
 * 2^7), for k < 32, without widening through fp16 or transposing bytes: the
 * 16-bit pairs of columns of rows i and i + 8 interleaved, then two dword
 * transposes (transpose8) leave each register with one column pair of all 16
 * rows, a dword a row i = [col c row i, col c+1 row i, col c row i+8, col c+1
 * row i+8]; fp8x32_to_f32_bf's shifts and masks then make each code's float
 * (times 2^-120, exact) in its own lane: rows 0-7 of column c, rows 8-15, and
 * the same of column c+1. 64 shuffles and 144 shifts and masks per 512 codes
 * where byte transposes and fp16 conversions took 80 shuffles, 64 widenings
 * and 64 two-op conversions (packing was a fifth of a 48-token FP8 product on
 * Zen 3, whose shuffles and shifts share pipes with the FMAs). */
AVX2 INLINE void g_pack_fp8_16x32(float *wp, const uint8_t *p, size_t ld, __m256 sv, bool big)
{
    const __m256i m = _mm256_set1_epi16((short)0x87F0), hm = _mm256_set1_epi32((int)0xFFFF0000);
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) { /* h = 0: column pairs 0-3 and 8-11; 1: 4-7 and 12-15 */
        __m256 u[8];
        #pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(p + (size_t)i * ld));
            __m256i b = _mm256_loadu_si256((const __m256i *)(p + (size_t)(i + 8) * ld));
            u[i] = _mm256_castsi256_ps(h ? _mm256_unpackhi_epi16(a, b) : _mm256_unpacklo_epi16(a, b));
        }
        transpose8(u); /* u[j]: column pair 4h + j (j < 4) or 8 + 4h + j - 4 (j >= 4), all 16 rows */
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256i v = _mm256_castps_si256(u[j]);
            __m256i e = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4), m);
            __m256i o = _mm256_and_si256(_mm256_srai_epi16(v, 4), m);
            __m256 w0 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(e, 16)), sv);
            __m256 w1 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(e, hm)), sv);
            __m256 w2 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(o, 16)), sv);
            __m256 w3 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(o, hm)), sv);
            if (big) {
                const __m256 b60 = _mm256_set1_ps(0x1p60f);
                w0 = _mm256_mul_ps(w0, b60);
                w1 = _mm256_mul_ps(w1, b60);
                w2 = _mm256_mul_ps(w2, b60);
                w3 = _mm256_mul_ps(w3, b60);
            }
            float *o16 = wp + 32 * (j < 4 ? 4 * h + j : 4 + 4 * h + j);
            _mm256_store_ps(o16, w0);
            _mm256_store_ps(o16 + 8, w1);
            _mm256_store_ps(o16 + 16, w2);
            _mm256_store_ps(o16 + 24, w3);
        }
    }
}

AVX2 static void g_pack_fp8_16x32_n(float *wp, const uint8_t *p, size_t ld, __m256 sv)
{
    g_pack_fp8_16x32(wp, p, ld, sv, false);
}

AVX2 static void g_pack_fp8_16x32_big(float *wp, const uint8_t *p, size_t ld, __m256 sv)
{
    g_pack_fp8_16x32(wp, p, ld, sv, true);
}

/* wp[k][0..16) = 16 rows' BF16 weights at column k (rows ld bytes apart from p),
 * as floats, for k < 16: as g_pack_fp8_16x32, rows i and i + 8 interleaved by
 * 16 bits and two dword transposes, so that each register holds one column of
 * all 16 rows, a dword a row i = [row i, row i + 8]; a shift and a mask give
 * rows 0-7 and 8-15 as floats. 64 shuffles per 256 weights, where three
 * rounds of 16-bit transposes, unpacks against zero and lane permutes took 112. */
AVX2 INLINE void g_pack_bf16_16x16(float *wp, const uint8_t *p, size_t ld)
{
    const __m256i hm = _mm256_set1_epi32((int)0xFFFF0000);
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) { /* h = 0: columns 0-3 and 8-11; 1: 4-7 and 12-15 */
        __m256 u[8];
        #pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(p + (size_t)i * ld));
            __m256i b = _mm256_loadu_si256((const __m256i *)(p + (size_t)(i + 8) * ld));
            u[i] = _mm256_castsi256_ps(h ? _mm256_unpackhi_epi16(a, b) : _mm256_unpacklo_epi16(a, b));
        }
        transpose8(u); /* u[j]: column 4h + j (j < 4) or 4 + 4h + j (j >= 4), all 16 rows */
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256i v = _mm256_castps_si256(u[j]);
            float *o = wp + 16 * (j < 4 ? 4 * h + j : 4 + 4 * h + j);
            _mm256_store_si256((__m256i *)o, _mm256_slli_epi32(v, 16));
            _mm256_store_si256((__m256i *)(o + 8), _mm256_and_si256(v, hm));
        }
    }
}

/* wp[k][16] = W[r + i][k0 + k] (FP8: times its block scale; the panel's rows
 * share one scale block), i < nr; rows past nr are zero. Whole panels of FP8 or
 * BF16 rows go 16 x 32 or 16 x 16 at a time through the transposes above; the
 * rest in 8 x 8 blocks through transpose8, columns past kc, up to a multiple of
 * 8, written as zeros. Prefetches rows [pr, pr + pnr) from column pk0 on, as
 * far as it packs. */
AVX2 static void g_pack(float *wp, const ds_weight *w, int r, int nr, int k0, int kc, int pr, int pnr, int pk0)
{
    int cb = (w->cols + DS_BLOCK - 1) / DS_BLOCK, kf = 0; /* columns the whole-block paths took */
    size_t esz = cpu_row_bytes(w) / (size_t)w->cols;
    if (w->fmt == DS_W_FP8 && nr == 16) /* whole 16 x 32 blocks (inside one scale block: k0 is a multiple of G_KC) */
        for (; kf + 32 <= kc; kf += 32) {
            /* rows 0-7's next line at an even block, 8-15's at an odd one: 8 prefetches
             * a block where 16 every other block took ~3% longer at 48 tokens an expert
             * (Zen 3, one process, five runs: -1.4% to +7.3%) */
            if (pk0 + kf < w->cols)
                for (int i = 8 * (kf / 32 % 2); i < MIN(pnr, 8 * (kf / 32 % 2) + 8); i++)
                    _mm_prefetch((const char *)w_row(w, pr + i) + pk0 + kf / 64 * 64, _MM_HINT_T0);
            float sc = w->scale[(size_t)(r / DS_BLOCK) * cb + (k0 + kf) / DS_BLOCK];
            bool big = !(fabsf(sc) < 0x1p7f); /* sc 2^120 would overflow */
            __m256 sv = _mm256_set1_ps(big ? sc * 0x1p60f : sc * 0x1p120f);
            (big ? g_pack_fp8_16x32_big : g_pack_fp8_16x32_n)(wp + 16 * kf, (const uint8_t *)w_row(w, r) + k0 + kf,
                                                             cpu_row_bytes(w), sv);
        }
    if (w->fmt == DS_W_BF16 && nr == 16) /* whole 16 x 16 blocks */
        for (; kf + 16 <= kc; kf += 16) {
            if (kf % 32 == 0 && pk0 + kf < w->cols)
                for (int i = 0; i < pnr; i++) _mm_prefetch((const char *)w_row(w, pr + i) + 2 * (size_t)(pk0 + kf), _MM_HINT_T0);
            g_pack_bf16_16x16(wp + 16 * kf, (const uint8_t *)w_row(w, r) + 2 * (size_t)(k0 + kf), cpu_row_bytes(w));
        }
    for (int g = 0; g < 2; g++)
        for (int k = kf; k < kc; k += 8) {
            int m = MIN(8, kc - k);
            if ((size_t)k * esz % 64 == 0 && pk0 + k < w->cols)
                for (int i = 8 * g; i < MIN(pnr, 8 * g + 8); i++)
                    _mm_prefetch((const char *)w_row(w, pr + i) + (size_t)(pk0 + k) * esz, _MM_HINT_T0);
            __m256 v[8];
            for (int i = 0; i < 8; i++)
                v[i] = 8 * g + i < nr ? load_w8(w->fmt, w_row(w, r + 8 * g + i), k0 + k, m) : _mm256_setzero_ps();
            if (w->fmt == DS_W_FP8) { /* 8 columns are inside one 128-column block */
                __m256 sv = _mm256_set1_ps(w->scale[(size_t)(r / DS_BLOCK) * cb + (k0 + k) / DS_BLOCK] * 256.0f);
                for (int i = 0; i < 8; i++) v[i] = _mm256_mul_ps(v[i], sv);
            }
            transpose8(v);
            for (int j = 0; j < 8; j++) _mm256_store_ps(wp + 16 * (k + j) + 8 * g, v[j]);
        }
}

/* xp[k][t] = x[t0 + t][k], t < G_NT, for token group g (g_group; zero past its T): a
 * tile's activations in the order it reads them, 8 columns at a time through
 * transpose8 (each store writes 8 floats where 6 belong; the next overwrites
 * the two extra, and a group's room in xp has 8 floats past its end for the
 * last). */
AVX2 static void g_pack_x(float *xp, const float *x, size_t ldx, int n, int K, int g)
{
    int t0, T, K8 = K / 8 * 8;
    g_group(n, g, &t0, &T);
    for (int k = 0; k < K8; k += 8) {
        __m256 r[8];
        for (int t = 0; t < 8; t++) r[t] = t < T ? _mm256_loadu_ps(x + (size_t)(t0 + t) * ldx + k) : _mm256_setzero_ps();
        transpose8(r);
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(xp + (size_t)G_NT * (k + j), r[j]);
    }
    for (int k = K8; k < K; k++)
        for (int t = 0; t < G_NT; t++) xp[(size_t)G_NT * k + t] = t < T ? x[(size_t)(t0 + t) * ldx + k] : 0.0f;
}

/* Share i of m of the lines of a group's packed activations for kc columns
 * (G_NT x kc floats from xg), asked for towards L1. A block's groups together
 * hold G_NT x kc floats a token group (516 KB at 512 tokens), more than L2
 * keeps beside the panels and y, so each group's came from L3 as its first
 * tile ran; asked for one group ahead, 512-token GEMMs (8 jobs of 1408 x 2048,
 * FP8 and BF16, one and two threads, alternated in one process) ran 9-20%
 * faster (Zen 3); at 48 tokens, where all groups stay in L2, level. */
AVX2 INLINE void g_prefetch_x(const float *xg, int kc, int i, int m)
{
    int lines = (G_NT * kc * (int)sizeof(float) + 63) / 64;
    for (int l = lines * i / m; l < lines * (i + 1) / m; l++) _mm_prefetch((const char *)xg + 64 * l, _MM_HINT_T0);
}

/* One GEMM job's place in avx2_gemm_many's lists. */
typedef struct {
    size_t xoff, gstride; /* its packed activations in xp: groups gstride floats apart */
    int np, b0;           /* its panels; its first block in the list of all jobs' blocks */
    int gbeg, gend;       /* the groups it packs in the list of all groups (none when it
                           * shares the job before's x) */
} g_job;

/* y (n, rows) = x (n, K) @ W[row0, row0 + rows)^T for many tokens, for every job
 * in one parallel region: the blocks of all jobs (a routed-expert chunk's w1 and
 * w3, or its w2s) in one schedule, so that threads wait once at the end instead
 * of at the end of every expert. Panels of 16 rows never cross an FP8 scale
 * block (128 rows). The activations are packed first, a group of G_NT tokens'
 * columns together (once for jobs that share x): read in place, a tile's six
 * rows of x sat K floats apart, six streams through L2 (at 512 tokens, 4 MB of x
 * for each panel), and a tile from L1 at the full FMA rate ran at ~60% of it. */
AVX2 static void avx2_gemm_many(const ds_matmul_job *jobs, int nj)
{
    g_job *gj = malloc(sizeof(g_job) * (size_t)(nj + 1));
    if (!gj) {
        cpu_fail_oom("GEMM job list", sizeof(g_job) * (size_t)(nj + 1));
        return;
    }
    size_t xfloats = 0;
    int nb = 0, ngt = 0;
    for (int i = 0; i < nj; i++) {
        const ds_matmul_job *j = &jobs[i];
        int K = j->w->cols, np = 0, ng = (j->n + G_NT - 1) / G_NT;
        for (int a = 0; a < j->rows; np++) a += MIN(16, MIN(j->rows - a, DS_BLOCK - (j->row0 + a) % DS_BLOCK));
        gj[i].np = np;
        gj[i].b0 = nb;
        nb += (np + G_PB - 1) / G_PB;
        gj[i].gstride = (size_t)G_NT * K + 8; /* g_pack_x's room */
        if (i > 0 && j->x == jobs[i - 1].x && j->n == jobs[i - 1].n && K == jobs[i - 1].w->cols) {
            gj[i].xoff = gj[i - 1].xoff;
            gj[i].gbeg = gj[i].gend = ngt;
        } else {
            gj[i].xoff = xfloats;
            xfloats += gj[i].gstride * (size_t)ng;
            gj[i].gbeg = ngt;
            gj[i].gend = ngt += ng;
        }
    }
    gj[nj].b0 = nb;
    float *xp = cpu_scratch(3, sizeof(float) * xfloats); /* the calling thread's, shared below */
    if (!xp) {
        cpu_fail_oom("packed GEMM activations", sizeof(float) * xfloats);
        free(gj);
        return;
    }
    #pragma omp parallel
    {
        int cj = 0; /* each thread's groups and blocks come in increasing order */
        #pragma omp for schedule(static)
        for (int u = 0; u < ngt; u++) {
            while (u >= gj[cj].gend) cj++;
            const ds_matmul_job *j = &jobs[cj];
            int g = u - gj[cj].gbeg;
            g_pack_x(xp + gj[cj].xoff + (size_t)g * gj[cj].gstride, j->x, (size_t)j->w->cols, j->n, j->w->cols, g);
        }
        float *wp = cpu_scratch(1, sizeof(float) * G_PB * 16 * G_KC);
        if (!wp) cpu_fail_oom("packed weight panels", sizeof(float) * G_PB * 16 * G_KC);
        int pi = 0, a = 0; /* in job cj, panel pi starts at row a */
        cj = -1;
        /* Blocks a thread takes at a time: 4 where there are many (a prefill's routed
         * experts), so that the next block, whose first rows g_pack asks for, is
         * mostly the same thread's (one by one it is the other's half the time); 64
         * experts of 1408 x 2048 at 48 tokens, two threads, alternated in one
         * process, mean GFLOP/s FP8 +4-12%, BF16 +4-10% over one at a time (Zen 3,
         * six rounds). With few blocks, one at a time keeps the threads' shares even. */
        const int chunk = nb >= 32 * omp_get_num_threads() ? 4 : 1;
        #pragma omp for schedule(dynamic, chunk)
        for (int b = 0; b < nb; b++) {
            while (cj < 0 || b >= gj[cj + 1].b0) cj++, pi = 0, a = 0;
            const ds_matmul_job *j = &jobs[cj];
            const ds_weight *w = j->w;
            int K = w->cols, n = j->n, rows = j->rows, row0 = j->row0, lb = b - gj[cj].b0;
            int pa[G_PB], pn[G_PB], m = 0; /* the block's panels: first rows, row counts */
            for (; pi < gj[cj].np && pi < G_PB * (lb + 1); pi++) {
                int nr = MIN(16, MIN(rows - a, DS_BLOCK - (row0 + a) % DS_BLOCK));
                if (pi >= G_PB * lb) pa[m] = a, pn[m++] = nr;
                a += nr;
            }
            if (!wp) continue;
            const float *xj = xp + gj[cj].xoff;
            for (int k0 = 0; k0 < K; k0 += G_KC) {
                int kc = MIN(G_KC, K - k0);
                /* prefetched while packing: the next chunk of these rows, or the first
                 * of the job's next block's (which the other thread may take) */
                for (int i = 0; i < m; i++) {
                    if (k0 + kc < K) g_pack(wp + i * 16 * G_KC, w, row0 + pa[i], pn[i], k0, kc, row0 + pa[i], pn[i], k0 + kc);
                    else g_pack(wp + i * 16 * G_KC, w, row0 + pa[i], pn[i], k0, kc, row0 + a + 16 * i, MIN(16, rows - a - 16 * i), 0);
                }
                for (int g = 0, ng = (n + G_NT - 1) / G_NT; g < ng; g++) {
                    int t0, T;
                    g_group(n, g, &t0, &T);
                    for (int i = 0; i < m; i++) {
                        if (g + 1 < ng) /* the next group's activations, a share a panel */
                            g_prefetch_x(xj + (size_t)(g + 1) * gj[cj].gstride + (size_t)G_NT * k0, kc, i, m);
                        g_tiles(T, wp + i * 16 * G_KC, kc, xj + (size_t)g * gj[cj].gstride + (size_t)G_NT * k0,
                                j->y + (size_t)t0 * rows + pa[i], (size_t)rows, pn[i], k0 > 0);
                    }
                }
            }
        }
    }
    free(gj);
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
    ds_matmul_job j = {y, x, n, w, row0, rows};
    if (n < cpu_gemm_min_tokens) cpu_decode_many(&j, 1, 1, decode_rows8);
    else avx2_gemm_many(&j, 1);
}

void avx2_matmul_many(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0)
{
    bool each = false;
    for (int i = 0; i < n_jobs; i++) each |= jobs[i].n >= cpu_gemm_min_tokens || (gemm == DS_GEMM_FP8 && jobs[i].w->fmt == DS_W_FP8);
    if (!each) {
        cpu_decode_many(jobs, n_jobs, 1, decode_rows8);
        return;
    }
    /* the jobs for the GEMM together, the others one by one */
    ds_matmul_job *g = malloc(sizeof(ds_matmul_job) * (size_t)n_jobs);
    int ng = 0;
    for (int i = 0; i < n_jobs; i++) {
        bool direct = jobs[i].n >= cpu_gemm_min_tokens && !(gemm == DS_GEMM_FP8 && jobs[i].w->fmt == DS_W_FP8);
        if (direct && g) g[ng++] = jobs[i];
        else avx2_matmul(jobs[i].y, jobs[i].x, jobs[i].n, jobs[i].w, jobs[i].row0, jobs[i].rows, gemm, ue8m0);
    }
    if (ng) avx2_gemm_many(g, ng);
    free(g);
}

/* ---- transposed and per-head products (absorb attention) ----------------- */

/* y[c0..c0+cw) = sum_r x[r * xstride] W[row0 + r][c0..), cw <= 64: one column
 * block of one head and token, FP8 block scales per (row, 128 columns). */
AVX2 static void t_block(float *y, const float *x, size_t xstride, const ds_weight *w, int row0, int rows, int c0, int cw)
{
    int C = w->cols, cb = (C + DS_BLOCK - 1) / DS_BLOCK, nv = cw / 8;
    __m256 acc[8];
    #pragma GCC unroll 8
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    float tail[8] = {0};
    for (int r = 0; r < rows; r++) {
        const void *row = w_row(w, row0 + r);
        float xv = x[(size_t)r * xstride];
        if (w->fmt == DS_W_FP8) xv *= w->scale[(size_t)((row0 + r) / DS_BLOCK) * cb + c0 / DS_BLOCK] * 256.0f;
        __m256 xb = _mm256_set1_ps(xv);
        if (nv == 8 && w->fmt == DS_W_FP8) {
            #pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __m256 a, b;
                fp8x16_to_f32((const uint8_t *)row + c0 + 16 * i, &a, &b);
                acc[2 * i] = _mm256_fmadd_ps(a, xb, acc[2 * i]);
                acc[2 * i + 1] = _mm256_fmadd_ps(b, xb, acc[2 * i + 1]);
            }
        } else {
            for (int i = 0; i < nv; i++) acc[i] = _mm256_fmadd_ps(load_w8(w->fmt, row, c0 + 8 * i, 8), xb, acc[i]);
        }
        if (cw % 8) {
            __m256 t = _mm256_mul_ps(load_w8(w->fmt, row, c0 + 8 * nv, cw % 8), xb);
            float v[8];
            _mm256_storeu_ps(v, t);
            for (int i = 0; i < cw % 8; i++) tail[i] += v[i];
        }
    }
    for (int i = 0; i < nv; i++) _mm256_storeu_ps(y + 8 * i, acc[i]);
    for (int i = 0; i < cw % 8; i++) y[8 * nv + i] = tail[i];
}

/* y[c] = sum_r x[r] w[row0 + r][c] for one token and one head, FP8 or BF16
 * weights, C a multiple of 64: one pass down the head's rows (contiguous: 64 KB
 * at the 16B shapes), four rows at a time, with the C sums in a thread's
 * scratch (L1) in the widening's column order, and the rows prefetched
 * PREFETCH_BYTES ahead within the head and on into the thread's next one
 * (next0; first: the thread's first head, whose start is fetched at once).
 * Passes of 64 columns over the rows stream the rows once and re-read them
 * from L2 seven times: 5.0-5.9 GB/s on Zen 3 where the decode products ran at
 * 14.4-17.2 in the same runs; this one pass 9.7-11.6 against 15.0-17.5
 * (`dsv3 bench --profile`). The prefetches are spread over the
 * column chunks: issued a row group's worth at a time (64 lines for BF16) they
 * held BF16 to 7.4-7.9 GB/s against 22.6-23.8 spread (both forms in one
 * process, median of 64 calls over 16 weights; FP8 level). FP8 codes widen through
 * fp8x32_to_f32_bf (values times 2^-120) against x times the block scale times
 * 2^64; BF16 through bf16x16_to_f32. */
AVX2 INLINE void heads_t8_1(ds_wfmt f, float *y, const float *x, const ds_weight *w, int row0, int rows, int next0,
                            bool first)
{
    bool fp8 = f == DS_W_FP8;
    int C = w->cols, cb = (C + DS_BLOCK - 1) / DS_BLOCK, esz = fp8 ? 1 : 2;
    size_t rb = (size_t)C * esz, head = rb * (size_t)rows; /* bytes a row, the head's bytes */
    float *acc = cpu_scratch(1, sizeof(float) * ((size_t)C + 4 * (size_t)cb));
    if (!acc) {
        cpu_fail_oom("per-head sums", sizeof(float) * ((size_t)C + 4 * (size_t)cb));
        return;
    }
    float *xs = acc + C; /* xs[rr][b]: row rr's x times column block b's scale (FP8) */
    memset(acc, 0, sizeof(float) * (size_t)C);
    const uint8_t *base = w_row(w, row0), *next = next0 >= 0 ? w_row(w, next0) : NULL;
    if (first) /* the thread's first head: what the loop below would have fetched ahead */
        for (size_t o = 0; o < MIN(head, (size_t)PREFETCH_BYTES); o += 64) _mm_prefetch((const char *)base + o, _MM_HINT_T2);
    for (int r = 0; r < rows; r += 4) {
        int nr = MIN(4, rows - r);
        size_t at = rb * (size_t)r, step = (size_t)nr * 32 * esz; /* bytes a column chunk reads */
        for (int rr = 0; rr < nr; rr++)
            for (int b = 0; b < cb; b++)
                xs[rr * cb + b] = fp8 ? x[r + rr] * w->scale[(size_t)((row0 + r + rr) / DS_BLOCK) * cb + b] * 0x1p64f
                                      : x[r + rr];
        for (int c0 = 0; c0 < C; c0 += 32) {
            /* as many bytes PREFETCH_BYTES ahead as this chunk reads, spread over the chunks */
            for (size_t t = at + PREFETCH_BYTES + step * (size_t)(c0 / 32), o = 0; o < step; o += 64, t += 64) {
                if (t < head) _mm_prefetch((const char *)base + t, _MM_HINT_T2);
                else if (next && t - head < head) _mm_prefetch((const char *)next + (t - head), _MM_HINT_T2);
            }
            __m256 a[4];
            #pragma GCC unroll 4
            for (int i = 0; i < 4; i++) a[i] = _mm256_load_ps(acc + c0 + 8 * i);
            for (int rr = 0; rr < nr; rr++) {
                const uint8_t *row = base + at + rb * (size_t)rr + (size_t)c0 * esz;
                __m256 wv[4];
                if (fp8) {
                    fp8x32_to_f32_bf(row, wv);
                } else {
                    bf16x16_to_f32((const uint16_t *)row, &wv[0], &wv[1]);
                    bf16x16_to_f32((const uint16_t *)row + 16, &wv[2], &wv[3]);
                }
                __m256 xb = _mm256_broadcast_ss(xs + rr * cb + c0 / DS_BLOCK);
                #pragma GCC unroll 4
                for (int i = 0; i < 4; i++) a[i] = _mm256_fmadd_ps(wv[i], xb, a[i]);
            }
            #pragma GCC unroll 4
            for (int i = 0; i < 4; i++) _mm256_store_ps(acc + c0 + 8 * i, a[i]);
        }
    }
    /* FP8: sum vector k of a 32-column chunk, lane i, holds column 4 i + (0, 2, 1, 3)[k];
     * BF16: column 16 (k / 2) + 2 i + k % 2 */
    float back = fp8 ? 0x1p56f : 1.0f;
    for (int c0 = 0; c0 < C; c0 += 32)
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 8; i++) {
                int col = fp8 ? 4 * i + (k == 1 ? 2 : k == 2 ? 1 : k) : 16 * (k / 2) + 2 * i + k % 2;
                y[c0 + col] = acc[c0 + 8 * k + i] * back;
            }
}

/* next0: the first row of the head the thread takes next (-1: none), whose
 * rows the prefetch runs on into; first: the thread's first head. */
AVX2 static void heads_t8_fp8_1(float *y, const float *x, const ds_weight *w, int row0, int rows, int next0, bool first)
{
    heads_t8_1(DS_W_FP8, y, x, w, row0, rows, next0, first);
}
AVX2 static void heads_t8_bf16_1(float *y, const float *x, const ds_weight *w, int row0, int rows, int next0,
                                 bool first)
{
    heads_t8_1(DS_W_BF16, y, x, w, row0, rows, next0, first);
}

/* avx2_matmul_heads_t for several tokens, C a multiple of 16: per head, its rows
 * widened once (times their block scales) into 16-column panels, wp[c / 16][r][16],
 * and the tokens' x packed by groups of G_NT as the GEMM packs them, so that
 * g_tile's 16 "rows" are 16 output columns and its sum runs over the head's rows.
 * t_block took a token at a time, reading the head's rows again for each (5% of
 * an FP8 prefill of 512 tokens on Zen 3 for 0.1% of its arithmetic). */
AVX2 static void heads_t_gemm(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                              int hstride, int rows)
{
    int C = w->cols, cb = (C + DS_BLOCK - 1) / DS_BLOCK, ng = (n + G_NT - 1) / G_NT;
    size_t ldx = (size_t)H * xs, ldy = (size_t)H * ys, gstride = (size_t)G_NT * rows + 8;
    size_t wbytes = sizeof(float) * (size_t)C * rows, xbytes = sizeof(float) * gstride * (size_t)ng;
    #pragma omp parallel for schedule(static) if (H > 1)
    for (int h = 0; h < H; h++) {
        float *wp = cpu_scratch(1, wbytes), *xp = cpu_scratch(3, xbytes);
        if (!wp || !xp) {
            cpu_fail_oom("per-head panels", wbytes + xbytes);
            continue;
        }
        for (int r = 0; r < rows; r++) {
            int wr = row0 + h * hstride + r;
            const void *row = w_row(w, wr);
            for (int c = 0; c < C; c += 8) {
                __m256 v = load_w8(w->fmt, row, c, 8);
                if (w->fmt == DS_W_FP8) v = _mm256_mul_ps(v, _mm256_set1_ps(w->scale[(size_t)(wr / DS_BLOCK) * cb + c / DS_BLOCK] * 256.0f));
                _mm256_storeu_ps(wp + ((size_t)(c / 16) * rows + r) * 16 + c % 16, v);
            }
        }
        for (int g = 0; g < ng; g++) g_pack_x(xp + (size_t)g * gstride, x + (size_t)h * xs, ldx, n, rows, g);
        for (int c0 = 0; c0 < C; c0 += 16)
            for (int g = 0; g < ng; g++) {
                int t0, T;
                g_group(n, g, &t0, &T);
                g_tiles(T, wp + (size_t)c0 * rows, rows, xp + (size_t)g * gstride, y + (size_t)t0 * ldy + (size_t)h * ys + c0,
                        ldy, 16, false);
            }
    }
}

/* FP8 scale blocks are 128 columns: a 64-column block never straddles one. */
AVX2 void avx2_matmul_heads_t(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                              int hstride, int rows)
{
    int C = w->cols, nc = (C + 63) / 64;
    size_t ldx = (size_t)H * xs, ldy = (size_t)H * ys;
    if (n == 1 && (w->fmt == DS_W_FP8 || w->fmt == DS_W_BF16) && C % 64 == 0) {
        #pragma omp parallel if (H > 1)
        {
            /* each thread a contiguous range of heads, prefetching from one into the next */
            int nt = omp_get_num_threads(), me = omp_get_thread_num(), h0 = H * me / nt, h1 = H * (me + 1) / nt;
            for (int h = h0; h < h1; h++) {
                int r0 = row0 + h * hstride, next = h + 1 < h1 ? r0 + hstride : -1;
                if (w->fmt == DS_W_FP8)
                    heads_t8_fp8_1(y + (size_t)h * ys, x + (size_t)h * xs, w, r0, rows, next, h == h0);
                else heads_t8_bf16_1(y + (size_t)h * ys, x + (size_t)h * xs, w, r0, rows, next, h == h0);
            }
        }
        return;
    }
    if (n >= 4 && (w->fmt == DS_W_FP8 || w->fmt == DS_W_BF16) && C % 16 == 0) {
        heads_t_gemm(y, ys, x, xs, n, H, w, row0, hstride, rows);
        return;
    }
    long units = (long)H * nc * n;
    #pragma omp parallel for schedule(static) if (units > 1 && cpu_row_bytes(w) * (size_t)rows * H > 65536)
    for (long u = 0; u < units; u++) {
        int c = (int)(u % nc), h = (int)(u / nc % H), t = (int)(u / nc / H), c0 = 64 * c;
        t_block(y + t * ldy + (size_t)h * ys + c0, x + t * ldx + (size_t)h * xs, 1, w, row0 + h * hstride, rows, c0,
                MIN(64, C - c0));
    }
}

AVX2 void avx2_matmul_t(float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    avx2_matmul_heads_t(y, w->cols, x, rows, n, 1, w, row0, 0, rows);
}

AVX2 void avx2_matmul_heads(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                            int hstride, int rows)
{
    cpu_matmul_heads(y, ys, x, xs, n, H, w, row0, hstride, rows, avx2_matmul_many, avx2_matmul);
}

/* ---- absorb attention -----------------------------------------------------
 * cpu_avx512.c's decode attention at 8 lanes: for one token, all heads and
 * positions [j0, j1) in blocks of ATT_JB: scores of 4 heads x 2 positions at a
 * time (every cache row read once per head group), an online softmax, then
 * o[h] += p[h][j] kv[j] four heads x 16 columns at a time. Needs kv_rank and
 * rope to be multiples of 8. */

#define ATT_JB 64
#define ATT_PF_ROWS 32

/* exp(x) on 8 lanes: x = n ln2 + r, |r| <= ln2/2, Cephes' expf polynomial, 2^n
 * by the exponent bits; about 1 ulp. x below -87 gives 0. */
AVX2 INLINE __m256 exp8(__m256 x)
{
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* n in [-126, 127] here: 2^n is a normal float; p < 2 keeps the product finite */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* a[i] = silu(a[i]) * b[i] = a[i] / (1 + exp(-a[i])) * b[i] */
AVX2 void avx2_silu_mul(float *a, const float *b, size_t n)
{
    size_t n8 = n / 8 * 8;
    #pragma omp parallel for schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n8; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i);
        __m256 s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(s, _mm256_loadu_ps(b + i)));
    }
    for (size_t i = n8; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

/* acc[u][v] += q[u] . rows[j + v] over the first C floats (queries and rows
 * ld apart); pf: prefetch the rows ATT_PF_ROWS ahead into L2. */
AVX2 INLINE void att_dot8(int HN, int JN, __m256 acc[4][2], const float *q, const float *rows, int C, int ld, int j,
                          bool pf)
{
    for (int c = 0; c < C; c += 8) {
        __m256 rv[2];
        #pragma GCC unroll 2
        for (int v = 0; v < JN; v++) {
            if (pf && c % 16 == 0) _mm_prefetch((const char *)(rows + (size_t)(j + v + ATT_PF_ROWS) * ld + c), _MM_HINT_T2);
            rv[v] = _mm256_loadu_ps(rows + (size_t)(j + v) * ld + c);
        }
        #pragma GCC unroll 8
        for (int u = 0; u < HN; u++) {
            __m256 qv = _mm256_loadu_ps(q + (size_t)u * ld + c);
            #pragma GCC unroll 2
            for (int v = 0; v < JN; v++) acc[u][v] = _mm256_fmadd_ps(qv, rv[v], acc[u][v]);
        }
    }
}

/* Scores of heads [h, h+HN) at positions [j, j+JN) into sc[h][j - jb]; the
 * first head group (pf) prefetches the cache rows ATT_PF_ROWS ahead into L2. */
AVX2 INLINE void att_scores8(int HN, int JN, const ds_attn_args *a, const float *qc, const float *qp, const float *kv,
                             const float *pe, int h, int j, int jb, float *sc, bool pf)
{
    int R = a->kv_rank, Rk = a->key_dims ? a->key_dims : R, P = a->rope;
    __m256 acc[4][2];
    #pragma GCC unroll 8
    for (int u = 0; u < HN; u++)
        #pragma GCC unroll 2
        for (int v = 0; v < JN; v++) acc[u][v] = _mm256_setzero_ps();
    att_dot8(HN, JN, acc, qc + (size_t)h * R, kv, Rk, R, j, pf);
    att_dot8(HN, JN, acc, qp + (size_t)h * P, pe, P, P, j, pf);
    #pragma GCC unroll 8
    for (int u = 0; u < HN; u++)
        #pragma GCC unroll 2
        for (int v = 0; v < JN; v++) sc[(size_t)(h + u) * ATT_JB + j + v - jb] = hsum8(acc[u][v]) * a->softmax_scale;
}

/* As cpu_avx512.c's att_scores16: with heads in multiples of 16 the
 * scores take a head a lane, two groups of 8 heads at 4 positions (8 sums, 2 query
 * vectors, a broadcast: 11 of the 16 registers), with no sums across lanes.
 * qt[d][h]: the token's queries transposed (the R key columns, then the P rope
 * columns). */
AVX2 static void att_qt8(int H, int R, int Rk, int P, const float *qc, const float *qp, float *qt)
{
    /* in 8 x 8 blocks (H, Rk and P are multiples of 8 here): scalar stores H
     * floats apart took a fifth of a call over 64 positions */
    for (int h = 0; h < H; h += 8)
        for (int d = 0; d < Rk + P; d += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = _mm256_loadu_ps(d < Rk ? qc + (size_t)(h + i) * R + d : qp + (size_t)(h + i) * P + d - Rk);
            transpose8(r);
            for (int j = 0; j < 8; j++) _mm256_storeu_ps(qt + (size_t)(d + j) * H + h, r[j]);
        }
}

/* Scores of heads [g, g+16) at positions [j, j+4) into sc[h][j - jb]; the sums run
 * in blocks of 64 columns added into tot (a chain of roundings 64 long, not R + P);
 * pf: prefetch the rows ATT_PF_ROWS ahead into L2. */
AVX2 INLINE void att_scores16x4(const ds_attn_args *a, const float *qt, const float *kv, const float *pe, int g, int j,
                                int jb, float *sc, bool pf)
{
    int H = a->n_heads, R = a->kv_rank, Rk = a->key_dims ? a->key_dims : R, P = a->rope, D = Rk + P;
    float tot[4][16] __attribute__((aligned(32))) = {{0}};
    for (int d0 = 0; d0 < D; d0 += 64) {
        __m256 acc[2][4];
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[0][v] = acc[1][v] = _mm256_setzero_ps();
        for (int d = d0; d < MIN(D, d0 + 64); d += 8) {
            const float *rows = d < Rk ? kv + (size_t)j * R + d : pe + (size_t)j * P + d - Rk;
            size_t ld = d < Rk ? (size_t)R : (size_t)P;
            if (pf && d % 16 == 0)
                #pragma GCC unroll 4
                for (int v = 0; v < 4; v++) _mm_prefetch((const char *)(rows + (v + ATT_PF_ROWS) * ld), _MM_HINT_T2);
            const float *q = qt + (size_t)d * H + g;
            #pragma GCC unroll 8
            for (int e = 0; e < 8; e++) {
                __m256 q0 = _mm256_loadu_ps(q + (size_t)e * H), q1 = _mm256_loadu_ps(q + (size_t)e * H + 8);
                #pragma GCC unroll 4
                for (int v = 0; v < 4; v++) {
                    __m256 b = _mm256_broadcast_ss(rows + v * ld + e);
                    acc[0][v] = _mm256_fmadd_ps(q0, b, acc[0][v]);
                    acc[1][v] = _mm256_fmadd_ps(q1, b, acc[1][v]);
                }
            }
        }
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            _mm256_store_ps(tot[v], _mm256_add_ps(_mm256_load_ps(tot[v]), acc[0][v]));
            _mm256_store_ps(tot[v] + 8, _mm256_add_ps(_mm256_load_ps(tot[v] + 8), acc[1][v]));
        }
    }
    for (int h = 0; h < 16; h++)
        for (int v = 0; v < 4; v++) sc[(size_t)(g + h) * ATT_JB + j + v - jb] = tot[v][h] * a->softmax_scale;
}

/* o[h][c..c+16) += sum_j p[h][j] kv[jb + j][c..c+16) for heads [h, h+HN), HN <= 6
 * (o's rows R apart, the cache's ld). */
AVX2 INLINE void att_values8(int HN, int R, int ld, const float *kv, int jb, int nj, const float *p, int h, int c,
                             float *o)
{
    __m256 acc[6][2];
    #pragma GCC unroll 8
    for (int u = 0; u < HN; u++) {
        acc[u][0] = _mm256_loadu_ps(o + (size_t)(h + u) * R + c);
        acc[u][1] = _mm256_loadu_ps(o + (size_t)(h + u) * R + c + 8);
    }
    for (int j = 0; j < nj; j++) {
        const float *kr = kv + (size_t)(jb + j) * ld + c;
        __m256 k0 = _mm256_loadu_ps(kr), k1 = _mm256_loadu_ps(kr + 8);
        #pragma GCC unroll 8
        for (int u = 0; u < HN; u++) {
            __m256 pb = _mm256_broadcast_ss(p + (size_t)(h + u) * ATT_JB + j);
            acc[u][0] = _mm256_fmadd_ps(pb, k0, acc[u][0]);
            acc[u][1] = _mm256_fmadd_ps(pb, k1, acc[u][1]);
        }
    }
    #pragma GCC unroll 8
    for (int u = 0; u < HN; u++) {
        _mm256_storeu_ps(o + (size_t)(h + u) * R + c, acc[u][0]);
        _mm256_storeu_ps(o + (size_t)(h + u) * R + c + 8, acc[u][1]);
    }
}

/* Token t, positions [j0, j1): running max mx[h], sum l[h] and o[h] (not yet
 * divided by l). sc: H x ATT_JB scores. */
AVX2 static void att_part8(const ds_attn_args *a, int t, int j0, int j1, float *mx, float *l, float *o, float *sc)
{
    /* ld: a cache row; R: the output's columns (ld - val_off), from val_off on */
    int H = a->n_heads, ld = a->kv_rank, R = ld - a->val_off, s = a->seq[t];
    const float *qc = a->q_c + (size_t)t * H * ld, *qp = a->q_pe + (size_t)t * H * a->rope;
    const float *kv = a->kv_cache + (size_t)s * a->ctx * ld, *pe = a->pe_cache + (size_t)s * a->ctx * a->rope;
    const float *kvo = kv + a->val_off; /* the values' columns */
    for (int h = 0; h < H; h++) {
        mx[h] = -INFINITY;
        l[h] = 0;
    }
    memset(o, 0, sizeof(float) * (size_t)H * R);
    bool t16 = H % 16 == 0;              /* the scores a head a lane (att_scores16x4) */
    float *qt = sc + (size_t)H * ATT_JB; /* cpu_attention_run's scratch has room for it */
    if (t16) att_qt8(H, ld, a->key_dims ? a->key_dims : ld, a->rope, qc, qp, qt);
    for (int jb = j0; jb < j1; jb += ATT_JB) {
        int nj = MIN(ATT_JB, j1 - jb), h = 0, j4 = jb; /* j4: where the 4-position tiles end */
        if (t16)
            for (; j4 + 4 <= jb + nj; j4 += 4)
                for (int g = 0; g < H; g += 16) att_scores16x4(a, qt, kv, pe, g, j4, jb, sc, g == 0);
        for (; h + 4 <= H; h += 4) {
            int j = j4;
            for (; j + 2 <= jb + nj; j += 2) att_scores8(4, 2, a, qc, qp, kv, pe, h, j, jb, sc, h == 0);
            for (; j < jb + nj; j++) att_scores8(4, 1, a, qc, qp, kv, pe, h, j, jb, sc, false);
        }
        for (; h < H; h++)
            for (int j = j4; j < jb + nj; j++) att_scores8(1, 1, a, qc, qp, kv, pe, h, j, jb, sc, false);
        /* online softmax: rescale what was accumulated under the old maximum */
        for (h = 0; h < H; h++) {
            float *sh = sc + (size_t)h * ATT_JB, m = mx[h];
            if (cpu_att_past_head(a, h, jb, nj, sh, m)) continue;
            int j8 = nj / 8 * 8;
            if (j8) { /* fmaxf is a library call: 4% of the attention at 4096 positions */
                __m256 mv = _mm256_loadu_ps(sh);
                for (int j = 8; j < j8; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(sh + j));
                __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
                m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
                m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
                m = fmaxf(m, _mm_cvtss_f32(m4));
            }
            for (int j = j8; j < nj; j++) m = fmaxf(m, sh[j]);
            float corr = expf(mx[h] - m), sum = 0;
            __m256 mv = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
            int j = 0;
            for (; j + 8 <= nj; j += 8) {
                __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sh + j), mv));
                _mm256_storeu_ps(sh + j, e);
                acc = _mm256_add_ps(acc, e);
            }
            sum = hsum8(acc);
            for (; j < nj; j++) sum += sh[j] = expf(sh[j] - m);
            l[h] = l[h] * corr + sum;
            mx[h] = m;
            if (corr != 1.0f) /* R is a multiple of 8 here */
                for (int c = 0; c < R; c += 8)
                    _mm256_storeu_ps(o + (size_t)h * R + c, _mm256_mul_ps(_mm256_loadu_ps(o + (size_t)h * R + c), _mm256_set1_ps(corr)));
        }
        for (int c = 0; c < R; c += 16) {
            if (R - c < 16) { /* the last 8 columns */
                for (h = 0; h < H; h++)
                    for (int j = 0; j < nj; j++) {
                        float p = sc[(size_t)h * ATT_JB + j];
                        for (int cc = c; cc < R; cc++) o[(size_t)h * R + cc] += p * kvo[(size_t)(jb + j) * ld + cc];
                    }
                break;
            }
            for (h = 0; h + 6 <= H; h += 6) att_values8(6, R, ld, kvo, jb, nj, sc, h, c, o);
            for (; h + 4 <= H; h += 4) att_values8(4, R, ld, kvo, jb, nj, sc, h, c, o);
            for (; h < H; h++) att_values8(1, R, ld, kvo, jb, nj, sc, h, c, o);
        }
    }
}

AVX2 void avx2_attention(const ds_attn_args *a, ds_attn_impl impl)
{
    if (impl != DS_ATTN_ABSORB || a->kv_rank % 8 || a->rope % 8 || a->key_dims % 8 || a->val_off % 8) {
        cpu_ref_ops.attention(a, impl);
        return;
    }
    cpu_attention_run(a, ATT_JB, att_part8);
}
