/* bench_gemm.c - the prefill products of the 16B shapes (bench/config_16B_8L.json)
 * on the CPU's widest kernels, each beside the FMA peak measured with the same
 * threads in the same run: a MoE layer's experts (tokens x 6 of 64 routed
 * experts, 1408 x 2048, plus 2 shared ones, through moe_experts: routing
 * order, the gather, the GEMMs, silu and the weighted sum), the dense layer's
 * MLP (10944 x 2048) and the attention's projections (wq, wkv_a, wkv_b, wo).
 * GFLOP/s counts two per weight a token multiplies, as `dsv3 bench` does.
 * Each figure is the best of the repetitions (a shared machine takes cores
 * away for a while); the peak is measured before every case, the best kept.
 * Where AMX runs (cpu_has_amx) every case runs twice, on the AVX-512 GEMM and
 * then on AMX tiles, the latter also beside the AMX tile peak.
 * "% per CPU": the FLOPs per CPU second the process used against one thread's
 * peak, what the kernels reach while they run; with OMP_WAIT_POLICY=passive
 * (bench/gemm.sh sets it) waiting threads sleep and do not count, so a loaded
 * machine disturbs this less than the wall clock.
 *   bench_gemm [fp8|bf16 [TOKENS [REPS [CASES]]]]   (see bench/gemm.sh; CASES: any of
 *   e, d, a for experts, dense, attention; all three unless given) */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/cpu/cpu_amx.h"
#include "backend/cpu/cpu_peak.h"
#include "backend/cpu/cpu_simd.h"

enum { DIM = 2048, INTER = 10944, MOE_I = 1408, NE = 64, TOPK = 6, NSH = 2, HEADS = 16, QK = 192, KVR = 512, ROPE = 64, VH = 128 };

static double now(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* rows x cols of format f with finite values (FP8: normal codes, as nearly all
 * of a checkpoint's; scales near 1e-3), on 2 MiB pages where the kernel gives
 * them, as the engine maps a checkpoint */
static ds_weight make_weight(ds_wfmt f, int rows, int cols)
{
    size_t n = (size_t)rows * cols, esz = f == DS_W_FP8 ? 1 : 2;
    uint8_t *p = NULL;
    if (posix_memalign((void **)&p, (size_t)2 << 20, n * esz)) p = NULL;
    else madvise(p, n * esz, MADV_HUGEPAGE);
    int sb = ((rows + 127) / 128) * ((cols + 127) / 128);
    float *s = f == DS_W_FP8 ? malloc(sizeof(float) * (size_t)sb) : NULL;
    if (!p || (f == DS_W_FP8 && !s)) {
        fprintf(stderr, "bench_gemm: out of memory for a %d x %d weight\n", rows, cols);
        exit(1);
    }
    if (f == DS_W_FP8) {
        for (size_t i = 0; i < n; i++) {
            uint8_t c = (uint8_t)next_u32();
            if (!(c & 0x78)) c |= 0x40;
            p[i] = (c & 0x7f) == 0x7f ? 0x7e : c;
        }
        for (int i = 0; i < sb; i++) s[i] = 1e-3f * (1.0f + (float)(next_u32() % 100) / 100.0f);
    } else {
        uint16_t *q = (uint16_t *)p;
        for (size_t i = 0; i < n; i++) q[i] = (uint16_t)(0x3c00 + (next_u32() & 0x3ff)) ^ (uint16_t)(next_u32() & 0x8000);
    }
    return (ds_weight){f, rows, cols, p, s, NULL};
}

static float *make_acts(size_t n)
{
    float *x = malloc(sizeof(float) * n);
    if (!x) {
        fprintf(stderr, "bench_gemm: out of memory for activations\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) x[i] = (float)(int)(next_u32() % 2001 - 1000) * 1e-3f;
    return x;
}

typedef struct {
    ds_wfmt fmt;
    int n;
    ds_weight ew[3][NE], sh[3], dw[3], aw[4]; /* experts w1 w2 w3; shared; dense; wq wkv_a wkv_b wo */
    int *idx;
    float *wt, *x, *y, *h, *g;
    bool avx512;
} bench;

static void run_moe(bench *b)
{
    ds_mlp_w sh = {&b->sh[0], &b->sh[1], &b->sh[2]};
    (b->avx512 ? avx512_moe_experts : avx2_moe_experts)(b->y, b->x, b->n, TOPK, b->idx, b->wt, b->ew[0], b->ew[1],
                                                        b->ew[2], 0, NE, &sh, DS_GEMM_BF16, false);
}

static void many(bench *b, const ds_matmul_job *j, int nj)
{
    (b->avx512 ? avx512_matmul_many : avx2_matmul_many)(j, nj, DS_GEMM_BF16, false);
}

static void run_dense(bench *b)
{
    ds_matmul_job j[2] = {{b->h, b->x, b->n, &b->dw[0], 0, INTER}, {b->g, b->x, b->n, &b->dw[2], 0, INTER}};
    many(b, j, 2);
    (b->avx512 ? avx512_silu_mul : avx2_silu_mul)(b->h, b->g, (size_t)b->n * INTER);
    ds_matmul_job j2 = {b->y, b->h, b->n, &b->dw[1], 0, DIM};
    many(b, &j2, 1);
}

/* the attention's products in the expanded form: x -> q and the latent; the
 * latent's first KVR columns -> keys and values; the heads' outputs -> y */
static void run_attn(bench *b)
{
    ds_matmul_job j[2] = {{b->h, b->x, b->n, &b->aw[0], 0, HEADS * QK},
                          {b->g, b->x, b->n, &b->aw[1], 0, KVR + ROPE}};
    many(b, j, 2);
    ds_matmul_job j2 = {b->h, b->g, b->n, &b->aw[2], 0, HEADS * (QK - ROPE + VH)};
    ds_matmul_job j3 = {b->y, b->x, b->n, &b->aw[3], 0, DIM};
    /* wkv_b reads the latent rows KVR + ROPE apart: packed here as KVR columns */
    float *lat = malloc(sizeof(float) * (size_t)b->n * KVR);
    for (int t = 0; t < b->n; t++) memcpy(lat + (size_t)t * KVR, b->g + (size_t)t * (KVR + ROPE), sizeof(float) * KVR);
    j2.x = lat;
    many(b, &j2, 1);
    many(b, &j3, 1);
    free(lat);
}

/* the best wall-clock seconds and, separately, the fewest CPU seconds */
static void time_case(bench *b, void (*f)(bench *), int reps, double *wall, double *cpu)
{
    f(b); /* warm: scratch, pages */
    *wall = *cpu = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now(CLOCK_MONOTONIC), c = now(CLOCK_PROCESS_CPUTIME_ID);
        f(b);
        t = now(CLOCK_MONOTONIC) - t;
        c = now(CLOCK_PROCESS_CPUTIME_ID) - c;
        if (t < *wall) *wall = t;
        if (c < *cpu) *cpu = c;
    }
}

int main(int argc, char **argv)
{
    bench b = {0};
    b.fmt = argc > 1 && !strcmp(argv[1], "bf16") ? DS_W_BF16 : DS_W_FP8;
    b.n = argc > 2 ? atoi(argv[2]) : 512;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    const char *which = argc > 4 ? argv[4] : "eda";
    if (b.n < 1 || b.n > 8192 || reps < 1) {
        fprintf(stderr, "bench_gemm: TOKENS must be 1..8192 and REPS positive\n");
        return 2;
    }
    b.avx512 = cpu_has_avx512();
    if (!b.avx512 && !cpu_has_avx2()) {
        printf("neither AVX-512 nor AVX2: nothing to measure\n");
        return 0;
    }
    for (int e = 0; e < NE; e++) {
        b.ew[0][e] = make_weight(b.fmt, MOE_I, DIM);
        b.ew[1][e] = make_weight(b.fmt, DIM, MOE_I);
        b.ew[2][e] = make_weight(b.fmt, MOE_I, DIM);
    }
    b.sh[0] = make_weight(b.fmt, NSH * MOE_I, DIM);
    b.sh[1] = make_weight(b.fmt, DIM, NSH * MOE_I);
    b.sh[2] = make_weight(b.fmt, NSH * MOE_I, DIM);
    b.dw[0] = make_weight(b.fmt, INTER, DIM);
    b.dw[1] = make_weight(b.fmt, DIM, INTER);
    b.dw[2] = make_weight(b.fmt, INTER, DIM);
    b.aw[0] = make_weight(b.fmt, HEADS * QK, DIM);
    b.aw[1] = make_weight(b.fmt, KVR + ROPE, DIM);
    b.aw[2] = make_weight(b.fmt, HEADS * (QK - ROPE + VH), KVR);
    b.aw[3] = make_weight(b.fmt, DIM, HEADS * VH);
    size_t n = (size_t)b.n;
    b.x = make_acts(n * DIM);
    b.y = make_acts(n * DIM);
    b.h = make_acts(n * INTER);
    b.g = make_acts(n * INTER);
    b.idx = malloc(sizeof(int) * n * TOPK);
    b.wt = make_acts(n * TOPK);
    for (size_t t = 0; t < n; t++) /* 6 distinct experts a token, uniformly */
        for (int k = 0; k < TOPK; k++) {
            int e, dup;
            do {
                e = (int)(next_u32() % NE);
                dup = 0;
                for (int i = 0; i < k; i++) dup |= b.idx[t * TOPK + i] == e;
            } while (dup);
            b.idx[t * TOPK + k] = e;
        }
    double flop_moe = 2.0 * n * 3 * MOE_I * DIM * (TOPK + NSH), flop_dense = 2.0 * n * 3 * INTER * DIM;
    double flop_attn = 2.0 * n * ((double)DIM * (HEADS * QK + KVR + ROPE) + (double)KVR * HEADS * (QK - ROPE + VH) +
                                  (double)HEADS * VH * DIM);
    struct {
        const char *name;
        void (*f)(bench *);
        double flop;
    } cases[] = {{"experts (64 x 1408 x 2048, 6 a token, + 2 shared)", run_moe, flop_moe},
                 {"dense MLP (10944 x 2048)", run_dense, flop_dense},
                 {"attention projections", run_attn, flop_attn}};
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    double peak1 = cpu_fma_peak();
    omp_set_num_threads(nt);
    printf("%s kernels, %s weights, %d tokens, %d threads; one thread's FMA peak %.1f GFLOP/s\n",
           b.avx512 ? "avx512" : "avx2", b.fmt == DS_W_FP8 ? "fp8" : "bf16", b.n, nt, peak1);
    int amx = b.avx512 && cpu_has_amx();
    double amx_peak = amx ? cpu_amx_peak() : 0;
    if (amx) printf("AMX bf16 tile peak %.1f GFLOP/s: each case on AVX-512, then on AMX\n", amx_peak);
    printf("%-52s %8s %8s %7s %9s\n", "products", "ms", "GFLOP/s", "% peak", "% per CPU");
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int a = 0; a <= amx; a++) {
            if (!strchr(which, "eda"[c])) continue;
            cpu_gemm_amx = a;
            double peak = cpu_fma_peak(), wall, cpu = 0;
            time_case(&b, cases[c].f, reps, &wall, &cpu);
            double g = cases[c].flop / wall / 1e9;
            printf("%-46s %5s %8.2f %8.1f %6.1f%% %8.1f%%   (peak %.1f", cases[c].name, a ? "amx" : "", 1e3 * wall, g,
                   100 * g / peak, 100 * cases[c].flop / cpu / 1e9 / peak1, peak);
            if (a) printf("; %.1f%% of the AMX peak", 100 * g / amx_peak);
            printf(")\n");
        }
    cpu_gemm_amx = 0;
    return 0;
}
