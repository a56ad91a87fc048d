/* bench_matvec.c - napkin-math benchmark of the decode matvec kernel (one
 * token, y = W x) on a large weight: anonymous memory versus a file-backed
 * mapping (a checkpoint shard, its bytes read as weights), each beside the
 * read bandwidth measured in the same run. For FP8 the values matter: a
 * 128-code chunk that holds a zero or subnormal code takes the kernel's
 * second pass, so the run also times anonymous memory with such a code in 5%
 * of the chunks, and counts the shard's share (its BF16 and float32 tensors,
 * read as codes, hold such bytes in many chunks).
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
#include "base/clock.h"

/* Best GB/s of weights over reps passes of a decode kernel over all of w at n
 * tokens (x: n rows; y: room for n rows of w->rows). */
static double time_decode(void (*f)(float *, const float *, int, const ds_weight *, int, int), const ds_weight *w,
                          const float *x, int n, float *y, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = ds_now();
        f(y, x, n, w, 0, w->rows);
        t = ds_now() - t;
        if (t < best) best = t;
    }
    size_t esz = w->fmt == DS_W_FP8 ? 1 : 2;
    return (double)w->rows * w->cols * esz / best / 1e9;
}

static void avx2_decode(float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    avx2_matmul(y, x, n, w, row0, rows, DS_GEMM_BF16, false);
}

/* The widest kernels the CPU has: AVX-512 where present, else AVX2. */
static bool has512;

static double time_matvec(const ds_weight *w, const float *x, float *y, int reps)
{
    return time_decode(has512 ? avx512_matmul_decode : avx2_decode, w, x, 1, y, reps);
}

static void matmul_many(const ds_matmul_job *jobs, int n)
{
    if (has512)
        avx512_matmul_many(jobs, n, DS_GEMM_BF16, false);
    else
        avx2_matmul_many(jobs, n, DS_GEMM_BF16, false);
}

/* The kernels' arithmetic on one thread: 128 rows held in L2, at 1, 2, 4 and 8
 * tokens, as cycles per 128 weights of a row for all the tokens, at the clock
 * that the one-thread FMA peak gives if one 512-bit FMA issues a cycle (Zen 4;
 * a core that issues two, as Zen 5, shows half its cycles), or two 256-bit ones
 * where there is no AVX-512 (Zen 3). */
static void time_kernels(const ds_weight *big, int K)
{
    ds_weight w = *big;
    w.rows = 128;
    float *x = malloc(sizeof(float) * 8 * (size_t)K), *y = malloc(sizeof(float) * 8 * 128);
    if (!x || !y) exit(1);
    for (int i = 0; i < 8 * K; i++) x[i] = (float)(i % 7) - 3.0f;
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    double ghz = cpu_fma_peak() / 32, esz = w.fmt == DS_W_FP8 ? 1.0 : 2.0;
    printf("one thread, %d x %d held in L2, cycles per 128 weights of a row for all tokens (at %.2f GHz from the "
           "FMA peak):\n", w.rows, K, ghz);
    static const int ns[] = {1, 2, 4, 8};
    for (int isa = has512 ? 0 : 1; isa < 2; isa++) {
        printf("  %-8s", isa ? "avx2" : "avx512");
        for (int i = 0; i < 4; i++) {
            double g = time_decode(isa ? avx2_decode : avx512_matmul_decode, &w, x, ns[i], y, 4000);
            printf("  %d token%s %6.1f", ns[i], ns[i] > 1 ? "s" : " ", 128 * esz / g * ghz);
        }
        printf("\n");
    }
    omp_set_num_threads(nt);
    free(x);
    free(y);
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
    double t = ds_now(), moved = 0;
    for (int tk = 0; tk < toks; tk++) {
        int chosen[KE];
        for (int k = 0; k < KE; k++) {
            seed = seed * 1103515245u + 12345u;
            chosen[k] = (int)(seed >> 16) % E;
            jobs[2 * k] = (ds_matmul_job){yo + (size_t)k * 2 * I, x, 1, &ew[chosen[k]][0], 0, I};
            jobs[2 * k + 1] = (ds_matmul_job){yo + (size_t)k * 2 * I + I, x, 1, &ew[chosen[k]][2], 0, I};
        }
        matmul_many(jobs, 2 * KE);
        for (int k = 0; k < KE; k++)
            jobs[k] = (ds_matmul_job){yo + (size_t)k * D, xi + (size_t)k * I, 1, &ew[chosen[k]][1], 0, D};
        matmul_many(jobs, KE);
        moved += 3.0 * KE * mat;
    }
    t = ds_now() - t;
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
    has512 = cpu_has_avx512();
    if (!has512 && !cpu_has_avx2()) {
        printf("neither AVX-512 nor AVX2: nothing to measure\n");
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
    printf("%s kernels, %d threads, %s %d x %d (%.2f GB): read bandwidth %.1f GB/s; matvec on anonymous memory %.1f GB/s "
           "(%.1f%%)\n", has512 ? "avx512" : "avx2", omp_get_max_threads(), fmt == DS_W_FP8 ? "fp8" : "bf16", rows, K, bytes / 1e9, bw, ga,
           100 * ga / bw);
    /* the kernel's arithmetic ceiling: a weight that stays in L2 (512 KiB per thread) */
    ds_weight hot = w;
    hot.rows = (int)(((size_t)omp_get_max_threads() << 19) / ((size_t)K * esz));
    printf("matvec on a weight held in L2 (%d rows): %.1f GB/s, the kernel's arithmetic ceiling\n", hot.rows,
           time_matvec(&hot, x, y, 2000));
    time_kernels(&w, K);
    time_moe("anonymous memory", fmt, anon, bytes, x, scale, bw);
    if (fmt == DS_W_FP8) {
        size_t n = bytes / 128, marked = 0;
        for (size_t c = 0; c < n; c++)
            if ((c * 2654435761u >> 7) % 100 < 5) {
                anon[c * 128 + c % 128] = 0x03; /* 3 x 2^-9 */
                marked++;
            }
        double gs = time_matvec(&w, x, y, reps);
        printf("matvec on anonymous memory with a subnormal code in %.1f%% of the 128-code chunks: %.1f GB/s (%.1f%%); "
               "held in L2: %.1f GB/s\n",
               100.0 * (double)marked / (double)n, gs, 100 * gs / bw, time_matvec(&hot, x, y, 2000));
    }
    if (file) {
        int fd = open(file, O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) || (size_t)st.st_size < bytes + 4096) {
            fprintf(stderr, "bench_matvec: %s: cannot open, or smaller than 1 GiB\n", file);
            return 1;
        }
        /* twice: mapped as it comes (4 KiB page-table entries unless the system maps
         * files with huge pages by default), then with MADV_HUGEPAGE as the model maps
         * its checkpoint (safetensors.c) */
        for (int huge = 0; huge < 2; huge++) {
            uint8_t *map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
            if (map == MAP_FAILED) return 1;
            if (huge) madvise(map, bytes, MADV_HUGEPAGE);
            volatile uint8_t sink = 0;
            for (size_t o = 0; o < bytes; o += 4096) sink += map[o];
            (void)sink;
            w.data = map;
            double gf = time_matvec(&w, x, y, reps);
            const char *how = huge ? "the file mapping, MADV_HUGEPAGE" : "the file mapping";
            printf("matvec on %s (%s, page cache) %.1f GB/s (%.1f%% of the anonymous read bandwidth)\n", how, file,
                   gf, 100 * gf / bw);
            if (fmt == DS_W_FP8 && !huge) {
                /* the file's bytes as e4m3 codes: a 128-code chunk holding a zero or
                 * subnormal code (exponent field 0) takes the kernel's float32 fix-up
                 * pass, so for FP8 the bytes' values matter (a shard's BF16 and float32
                 * tensors read as codes hold such bytes in nearly every chunk) */
                size_t slow = 0, n = bytes / 128;
                for (size_t c = 0; c < n; c++)
                    for (int i = 0; i < 128; i++)
                        if (!(map[c * 128 + i] & 0x78)) {
                            slow++;
                            break;
                        }
                printf("  %.1f%% of its 128-code chunks hold a zero or subnormal e4m3 code (the fix-up path)\n",
                       100.0 * (double)slow / (double)n);
            }
            time_moe(how, fmt, map, bytes, x, scale, bw);
            munmap(map, bytes);
        }
        close(fd);
    }
    free(anon);
    free(x);
    free(y);
    free(scale);
    return 0;
}
