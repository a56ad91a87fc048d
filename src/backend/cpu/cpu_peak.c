/* cpu_peak.c - measured read bandwidth and arithmetic peaks.
 *
 * Bandwidth: each thread sums its contiguous share of a buffer with wide loads
 * (the sum is kept so the loads cannot be dropped); the buffer is written once
 * first so that its pages exist. Peaks: independent chains of FMAs (or
 * vdpbf16ps), more chains than the instruction's latency times its throughput,
 * timed over ~50 ms per thread (AMX: ~8 ms). */
#include "cpu_peak.h"

#include <immintrin.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "base/clock.h"
#include "cpu_amx.h"
#include "cpu_simd.h"

__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint8_t *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v, a0);
    return v[0] + v[1] + v[2] + v[3];
}

static uint64_t sum_scalar(const uint8_t *p, size_t n)
{
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= n / 8; i += 4) {
        a += q[i];
        b += q[i + 1];
        c += q[i + 2];
        d += q[i + 3];
    }
    return a + b + c + d;
}

/* Best of reps passes over buf, each thread summing its contiguous share. */
static double stream(const uint8_t *buf, size_t bytes, int reps, bool first_touch)
{
    bool avx2 = cpu_has_avx2();
    volatile uint64_t sink = 0;
    double best = 0;
    #pragma omp parallel
    {
        int nt = omp_get_num_threads(), me = omp_get_thread_num();
        size_t per = bytes / (size_t)nt / 4096 * 4096;
        const uint8_t *mine = buf + per * (size_t)me;
        if (first_touch) memset((uint8_t *)mine, me + 1, per); /* by the thread that reads it */
        for (int r = 0; r < reps; r++) {
            #pragma omp barrier
            double t0 = ds_now();
            uint64_t s = avx2 ? sum_avx2(mine, per) : sum_scalar(mine, per);
            #pragma omp barrier
            double dt = ds_now() - t0;
            #pragma omp atomic
            sink += s;
            #pragma omp single
            {
                double gbps = (double)per * nt / dt / 1e9;
                if (gbps > best) best = gbps;
            }
        }
    }
    (void)sink;
    return best;
}

double cpu_read_bandwidth(size_t bytes, int reps)
{
    bytes &= ~(size_t)4095;
    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, (size_t)2 << 20, bytes)) return -1;
    /* 2 MiB pages where the kernel gives them, as for the weights (see
     * st_settle_pages): 4 KiB pages read measurably slower here */
    madvise(buf, bytes, MADV_HUGEPAGE);
    double best = stream(buf, bytes, reps, true);
    free(buf);
    return best;
}

double cpu_read_bandwidth_at(const void *p, size_t bytes, int reps)
{
    return stream(p, bytes & ~(size_t)4095, reps, false);
}

/* More independent chains than latency x throughput (4 x 2 for FMA, 6 x 2 for
 * vdpbf16ps), but no more than the registers hold: AVX2 has 16 ymm, and 16
 * chains plus the two operands spilled, which halved the peak measured on Zen 3
 * (55 against 100 GFLOP/s a core with 12). */
#define CHAINS 16
#define CHAINS_AVX2 12

__attribute__((target("avx512f"))) static double fma_avx512(long iters)
{
    __m512 a[CHAINS], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    #pragma GCC unroll 16
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
        #pragma GCC unroll 16
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    float s = 0;
    #pragma GCC unroll 16
    for (int i = 0; i < CHAINS; i++) s += _mm512_reduce_add_ps(a[i]);
    return s;
}

__attribute__((target("avx2,fma"))) static double fma_avx2(long iters)
{
    __m256 a[CHAINS_AVX2], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    #pragma GCC unroll 16
    for (int i = 0; i < CHAINS_AVX2; i++) a[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
        #pragma GCC unroll 16
        for (int i = 0; i < CHAINS_AVX2; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
    float v[8], s = 0;
    #pragma GCC unroll 16
    for (int i = 0; i < CHAINS_AVX2; i++) {
        _mm256_storeu_ps(v, a[i]);
        #pragma GCC unroll 16
        for (int j = 0; j < 8; j++) s += v[j];
    }
    return s;
}

__attribute__((target("avx512f,avx512bf16"))) static double dp_bf16(long iters)
{
    __m512 a[CHAINS];
    __m512i w = _mm512_set1_epi32(0x3f803f80), x = _mm512_set1_epi32(0x33803380);
    #pragma GCC unroll 16
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
        #pragma GCC unroll 16
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)w, (__m512bh)x);
    float s = 0;
    #pragma GCC unroll 16
    for (int i = 0; i < CHAINS; i++) s += _mm512_reduce_add_ps(a[i]);
    return s;
}

/* tdpbf16ps into six C tiles (its latency is a few times its 16-cycle
 * throughput) from one A and one B tile of small values. */
#define AMX_CHAINS 6

static double dp_amx(long iters)
{
    static const uint16_t one = 0x3f80, tiny = 0x3380; /* bf16 1 and 2^-24 */
    uint16_t a[16][32] __attribute__((aligned(64))), b[16][32] __attribute__((aligned(64)));
    float c[16][16] __attribute__((aligned(64)));
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 32; j++) {
            a[i][j] = one;
            b[i][j] = tiny;
        }
    cpu_amx_tiles_on();
    AMX_TILE_ZERO(0);
    AMX_TILE_ZERO(1);
    AMX_TILE_ZERO(2);
    AMX_TILE_ZERO(3);
    AMX_TILE_ZERO(4);
    AMX_TILE_ZERO(5);
    AMX_TILE_LOAD(6, a, 64);
    AMX_TILE_LOAD(7, b, 64);
    for (long it = 0; it < iters; it++) {
        AMX_DPBF16(0, 6, 7);
        AMX_DPBF16(1, 6, 7);
        AMX_DPBF16(2, 6, 7);
        AMX_DPBF16(3, 6, 7);
        AMX_DPBF16(4, 6, 7);
        AMX_DPBF16(5, 6, 7);
    }
    AMX_TILE_STORE(5, c, 64);
    cpu_amx_tiles_off();
    return c[0][0];
}

/* Runs f on every thread; flop per iteration and chain and the chains given;
 * returns GFLOP/s. */
static double peak(double (*f)(long), double flop_per_op, int chains)
{
    long iters = 200000;
    double best = 0;
    volatile double sink = 0;
    for (int rep = 0; rep < 10; rep++) { /* best of 10: a shared core can be taken away for a while */
        double t0 = ds_now(), s = 0;
        int nt = 1;
        #pragma omp parallel reduction(+ : s)
        {
            #pragma omp single
            nt = omp_get_num_threads();
            s += f(iters);
        }
        double dt = ds_now() - t0;
        sink += s;
        double g = (double)iters * chains * flop_per_op * nt / dt / 1e9;
        if (g > best) best = g;
    }
    (void)sink;
    return best;
}

double cpu_fma_peak(void)
{
    if (cpu_has_avx512()) return peak(fma_avx512, 32, CHAINS);
    if (cpu_has_avx2()) return peak(fma_avx2, 16, CHAINS_AVX2);
    return 0;
}

double cpu_bf16_peak(void)
{
    return cpu_has_avx512() ? peak(dp_bf16, 64, CHAINS) : 0;
}

double cpu_amx_peak(void)
{
    return cpu_has_amx() ? peak(dp_amx, 16 * 16 * 32 * 2, AMX_CHAINS) : 0;
}
