/* bench_matvec.c - napkin-math benchmark of the decode matvec kernel (one
 * token, y = W x) on a large weight: anonymous memory versus a file-backed
 * mapping (a checkpoint shard, its bytes read as weights; the values do not
 * matter for the timing), each beside the read bandwidth measured in the same
 * run. Also times the raw streaming sum of the same mapping, which isolates
 * the cost of the page-cache mapping from the kernel's own arithmetic.
 *   bench_matvec [FILE|- [fp8|bf16 [K]]]   (see bench/matvec.sh; K: the row
 *   length, 2048 unless given; -: no file) */
#include <fcntl.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/cpu_peak.h"
#include "backend/cpu/cpu_simd.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best GB/s of reps passes of the decode kernel over all of w. */
static double time_matvec(const ds_weight *w, const float *x, float *y, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now();
        avx512_matmul_decode(y, x, 1, w, 0, w->rows);
        t = now() - t;
        if (t < best) best = t;
    }
    size_t esz = w->fmt == DS_W_FP8 ? 1 : 2;
    return (double)w->rows * w->cols * esz / best / 1e9;
}

/* The MoE decode pattern on the weights at base: 6 of up to 64 experts (w1,
 * w2, w3 of 1408 x 2048 each, laid out expert after expert as in a
 * checkpoint) per token; w1 and w3 of all six in one matmul_many, then their
 * w2s. Prints GB/s beside bw. */
static void time_moe(const char *what, ds_wfmt fmt, const uint8_t *base, size_t bytes, const float *x, float *scale,
                     double bw)
{
    const int I = 1408, D = 2048, KE = 6, toks = 200;
    size_t esz = fmt == DS_W_FP8 ? 1 : 2, mat = (size_t)I * D * esz;
    int E = (int)(bytes / (3 * mat));
    if (E > 64) E = 64;
    float *xi = malloc(sizeof(float) * (size_t)KE * I), *yo = malloc(sizeof(float) * (size_t)KE * 2 * I);
    float *s2 = malloc(sizeof(float) * (size_t)((D + 127) / 128) * ((I + 127) / 128));
    if (!xi || !yo || !s2) exit(1);
    for (int i = 0; i < (D + 127) / 128 * ((I + 127) / 128); i++) s2[i] = 1e-3f;
    for (int i = 0; i < KE * I; i++) xi[i] = 0.5f;
    ds_weight ew[64][3];
    for (int e = 0; e < E; e++) {
        ew[e][0] = (ds_weight){fmt, I, D, base + (3 * e + 0) * mat, scale, NULL};
        ew[e][1] = (ds_weight){fmt, D, I, base + (3 * e + 1) * mat, s2, NULL};
        ew[e][2] = (ds_weight){fmt, I, D, base + (3 * e + 2) * mat, scale, NULL};
    }
    ds_matmul_job jobs[2 * KE];
    unsigned seed = 1;
    double t = now(), moved = 0;
    for (int tk = 0; tk < toks; tk++) {
        int chosen[KE];
        for (int k = 0; k < KE; k++) {
            seed = seed * 1103515245u + 12345u;
            chosen[k] = (int)(seed >> 16) % E;
            jobs[2 * k] = (ds_matmul_job){yo + (size_t)k * 2 * I, x, 1, &ew[chosen[k]][0], 0, I};
            jobs[2 * k + 1] = (ds_matmul_job){yo + (size_t)k * 2 * I + I, x, 1, &ew[chosen[k]][2], 0, I};
        }
        avx512_matmul_many(jobs, 2 * KE, DS_GEMM_BF16, false);
        for (int k = 0; k < KE; k++)
            jobs[k] = (ds_matmul_job){yo + (size_t)k * D, xi + (size_t)k * I, 1, &ew[chosen[k]][1], 0, D};
        avx512_matmul_many(jobs, KE, DS_GEMM_BF16, false);
        moved += 3.0 * KE * mat;
    }
    t = now() - t;
    printf("MoE pattern on %s (6 of %d experts, 1408 x 2048, %d tokens): %.1f GB/s (%.1f%%), %.0f us per token\n",
           what, E, toks, moved / t / 1e9, 100 * moved / t / 1e9 / bw, 1e6 * t / toks);
    free(xi);
    free(yo);
    free(s2);
}

int main(int argc, char **argv)
{
    const char *file = argc > 1 && strcmp(argv[1], "-") && argv[1][0] ? argv[1] : NULL; /* "-": none */
    ds_wfmt fmt = argc > 2 && !strcmp(argv[2], "bf16") ? DS_W_BF16 : DS_W_FP8;
    if (!cpu_has_avx512()) {
        printf("no AVX-512: nothing to measure\n");
        return 0;
    }
    const int K = argc > 3 ? atoi(argv[3]) : 2048, reps = 10;
    if (K < 128 || K > (1 << 20) || K % 128) {
        fprintf(stderr, "bench_matvec: K must be a multiple of 128 from 128 to 2^20, got %s\n", argv[3]);
        return 2;
    }
    size_t esz = fmt == DS_W_FP8 ? 1 : 2, bytes = (size_t)1 << 30;
    int rows = (int)(bytes / ((size_t)K * esz));
    float *x = malloc(sizeof(float) * K), *y = malloc(sizeof(float) * (size_t)rows);
    float *scale = malloc(sizeof(float) * (size_t)((rows + 127) / 128) * (K / 128));
    uint8_t *anon = NULL;
    if (!x || !y || !scale || posix_memalign((void **)&anon, (size_t)2 << 20, bytes)) return 1;
    madvise(anon, bytes, MADV_HUGEPAGE); /* as the model's weights (st_settle_pages) */
    for (int i = 0; i < K; i++) x[i] = (float)(i % 7) - 3.0f;
    for (size_t i = 0; i < (size_t)((rows + 127) / 128) * (K / 128); i++) scale[i] = 1e-3f;
    /* finite codes; for FP8, normal ones, as nearly all in real weights (the
     * kernel takes a slower path for 64-code chunks holding a subnormal) */
    for (size_t i = 0; i < bytes; i++) {
        uint8_t c = (uint8_t)(i * 2654435761u >> 24);
        if (!(c & 0x78)) c |= 0x40;
        anon[i] = (c & 0x7f) == 0x7f ? 0x7e : c;
    }
    ds_weight w = {fmt, rows, K, anon, scale, NULL};
    double bw = cpu_read_bandwidth(bytes, 10);
    double ga = time_matvec(&w, x, y, reps);
    printf("%d threads, %s %d x %d (%.2f GB): read bandwidth %.1f GB/s; matvec on anonymous memory %.1f GB/s "
           "(%.1f%%)\n", omp_get_max_threads(), fmt == DS_W_FP8 ? "fp8" : "bf16", rows, K, bytes / 1e9, bw, ga,
           100 * ga / bw);
    /* the kernel's arithmetic ceiling: a weight that stays in L2 (512 KiB per thread) */
    ds_weight hot = w;
    hot.rows = (int)(((size_t)omp_get_max_threads() << 19) / ((size_t)K * esz));
    double best = 1e30;
    for (int r = 0; r < 2000; r++) {
        double t = now();
        avx512_matmul_decode(y, x, 1, &hot, 0, hot.rows);
        t = now() - t;
        if (t < best) best = t;
    }
    printf("matvec on a weight held in L2 (%d rows): %.1f GB/s, the kernel's arithmetic ceiling\n", hot.rows,
           (double)hot.rows * K * esz / best / 1e9);
    time_moe("anonymous memory", fmt, anon, bytes, x, scale, bw);
    if (file) {
        int fd = open(file, O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) || (size_t)st.st_size < bytes + 4096) {
            fprintf(stderr, "bench_matvec: %s: cannot open, or smaller than 1 GiB\n", file);
            return 1;
        }
        uint8_t *map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) return 1;
        volatile uint8_t sink = 0;
        for (size_t o = 0; o < bytes; o += 4096) sink += map[o];
        (void)sink;
        w.data = map;
        double gf = time_matvec(&w, x, y, reps);
        printf("matvec on the file mapping (%s, page cache) %.1f GB/s (%.1f%% of the anonymous read bandwidth)\n", file,
               gf, 100 * gf / bw);
        time_moe("the file mapping", fmt, map, bytes, x, scale, bw);
        munmap(map, bytes);
        close(fd);
    }
    free(anon);
    free(x);
    free(y);
    free(scale);
    return 0;
}
