/* bench_matvec.c - napkin-math benchmark of the decode matvec kernel (one
 * token, y = W x) on a large weight: anonymous memory versus a file-backed
 * mapping (a checkpoint shard, its bytes read as weights; the values do not
 * matter for the timing), each beside the read bandwidth measured in the same
 * run. Also times the raw streaming sum of the same mapping, which isolates
 * the cost of the page-cache mapping from the kernel's own arithmetic.
 *   bench_matvec [FILE [fp8|bf16]]   (see bench/matvec.sh) */
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

int main(int argc, char **argv)
{
    const char *file = argc > 1 ? argv[1] : NULL;
    ds_wfmt fmt = argc > 2 && !strcmp(argv[2], "bf16") ? DS_W_BF16 : DS_W_FP8;
    if (!cpu_has_avx512()) {
        printf("no AVX-512: nothing to measure\n");
        return 0;
    }
    const int K = 2048, reps = 10;
    size_t esz = fmt == DS_W_FP8 ? 1 : 2, bytes = (size_t)1 << 30;
    int rows = (int)(bytes / ((size_t)K * esz));
    float *x = malloc(sizeof(float) * K), *y = malloc(sizeof(float) * (size_t)rows);
    float *scale = malloc(sizeof(float) * (size_t)((rows + 127) / 128) * (K / 128));
    uint8_t *anon = NULL;
    if (!x || !y || !scale || posix_memalign((void **)&anon, 4096, bytes)) return 1;
    for (int i = 0; i < K; i++) x[i] = (float)(i % 7) - 3.0f;
    for (size_t i = 0; i < (size_t)((rows + 127) / 128) * (K / 128); i++) scale[i] = 1e-3f;
    for (size_t i = 0; i < bytes; i++) anon[i] = (uint8_t)(i * 2654435761u >> 24) & 0x77; /* finite codes */
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
        munmap(map, bytes);
        close(fd);
    }
    free(anon);
    free(x);
    free(y);
    free(scale);
    return 0;
}
