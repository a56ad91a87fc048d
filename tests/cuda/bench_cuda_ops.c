/* bench_cuda_ops.c - wall time per call of the CUDA ops at DeepSeek-V3 shapes
 * (one GPU holding whole matrices), with the napkin math beside it: bytes a
 * call must move at least, and the rate that implies. Not a test: it prints
 * figures (scripts/gpu_check.sh runs it) and always exits 0 on success.
 *
 * Each op call includes this stage's fixed costs (pointer queries, staging,
 * one launch, a device synchronisation); the "add n=1" row measures them. The
 * floor at 4.3 TB/s (a device-to-device copy measured on an H200 here) is the
 * HBM roofline a decode product should approach. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_backend.h"
#include "base/clock.h"
#include "base/numeric.h"

#define HBM_GBS 4300.0

static const ds_ops *G;
static uint64_t g_rng = 0x243f6a8885a308d3ull;

static float frand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (2.0 / 16777216.0) - 1.0);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef void (*bench_fn)(void *ctx);

/* Median seconds per call over reps calls, after 3 warm-up calls. */
static double median_time(bench_fn f, void *ctx, int reps)
{
    double t[64];
    if (reps > 64) reps = 64;
    for (int i = 0; i < 3; i++) f(ctx);
    for (int i = 0; i < reps; i++) {
        double t0 = ds_now();
        f(ctx);
        t[i] = ds_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    return t[reps / 2];
}

static void report(const char *label, double sec, double bytes, double flops)
{
    printf("%-46s %9.1f us  %8.1f GB/s  %5.1f%% of HBM  %8.2f TFLOP/s\n", label, sec * 1e6, bytes / sec / 1e9,
           100.0 * bytes / sec / 1e9 / HBM_GBS, flops / sec / 1e12);
}

/* ---- matmul */

typedef struct {
    ds_weight w;
    float *x, *y;
    int n;
    ds_gemm_impl gemm;
} mm_ctx;

static void mm_call(void *p)
{
    mm_ctx *c = p;
    G->matmul(c->y, c->x, c->n, &c->w, 0, c->w.rows, c->gemm, false);
}

static void bench_matmul(ds_wfmt fmt, int rows, int cols, int n, ds_gemm_impl gemm)
{
    mm_ctx c = {.w = {.fmt = fmt, .rows = rows, .cols = cols}, .n = n, .gemm = gemm};
    size_t nw = (size_t)rows * cols, es = fmt == DS_W_F32 ? 4 : fmt == DS_W_BF16 ? 2 : 1;
    uint8_t *d = malloc(nw * es);
    for (size_t i = 0; i < nw * es; i++) { /* & 0x37: finite whether read as e4m3, bf16 or f32 */
        frand();
        d[i] = (uint8_t)(g_rng >> 56) & 0x37;
    }
    c.w.data = d;
    float *s = NULL;
    if (fmt == DS_W_FP8) {
        size_t ns = (size_t)((rows + 127) / 128) * ((cols + 127) / 128);
        s = malloc(sizeof(float) * ns);
        for (size_t i = 0; i < ns; i++) s[i] = 1e-3f;
        c.w.scale = s;
    }
    c.x = G->alloc(sizeof(float) * (size_t)n * cols);
    c.y = G->alloc(sizeof(float) * (size_t)n * rows);
    for (size_t i = 0; i < (size_t)n * cols; i++) c.x[i] = frand();
    double t = median_time(mm_call, &c, 20);
    char label[96];
    snprintf(label, sizeof label, "matmul %s%s %dx%d n=%d", fmt == DS_W_FP8 ? "fp8" : fmt == DS_W_BF16 ? "bf16" : "f32",
             gemm == DS_GEMM_FP8 && fmt == DS_W_FP8 ? "/fp8gemm" : "", rows, cols, n);
    double bytes = (double)nw * es + 4.0 * n * ((double)cols + rows);
    report(label, t, bytes, 2.0 * n * nw);
    G->free(c.x);
    G->free(c.y);
    free(d);
    free(s);
    cuda_forget_weights();
}

/* ---- attention (absorb, decode: one token per sequence at the last position) */

typedef struct {
    ds_attn_args a;
} at_ctx;

static void at_call(void *p)
{
    at_ctx *c = p;
    G->attention(&c->a, DS_ATTN_ABSORB);
}

static void bench_attention(int nseq, int H, int ctx)
{
    int R = 512, rope = 64;
    at_ctx c = {.a = {.n_tokens = nseq, .n_heads = H, .rope = rope, .kv_rank = R, .softmax_scale = 0.05f, .ctx = ctx}};
    int *seq = malloc(sizeof(int) * (size_t)nseq), *pos = malloc(sizeof(int) * (size_t)nseq);
    for (int i = 0; i < nseq; i++) {
        seq[i] = i;
        pos[i] = ctx - 1;
    }
    c.a.seq = seq;
    c.a.pos = pos;
    size_t rows = (size_t)nseq * ctx, th = (size_t)nseq * H;
    float *qc = G->alloc(sizeof(float) * th * R), *qp = G->alloc(sizeof(float) * th * rope);
    float *kv = G->alloc(sizeof(float) * rows * R), *pe = G->alloc(sizeof(float) * rows * rope);
    float *out = G->alloc(sizeof(float) * th * R);
    for (size_t i = 0; i < th * R; i++) qc[i] = frand();
    for (size_t i = 0; i < rows * R; i++) kv[i] = frand();
    c.a.q_c = qc;
    c.a.q_pe = qp;
    c.a.kv_cache = kv;
    c.a.pe_cache = pe;
    c.a.out = out;
    double t = median_time(at_call, &c, 10);
    char label[96];
    snprintf(label, sizeof label, "attention absorb seqs=%d H=%d ctx=%d", nseq, H, ctx);
    double bytes = 4.0 * rows * (R + rope), flops = 4.0 * th * ctx * (R + rope);
    report(label, t, bytes, flops);
    G->free(qc);
    G->free(qp);
    G->free(kv);
    G->free(pe);
    G->free(out);
    free(seq);
    free(pos);
}

/* ---- pick_rows: the next token at V3's vocabulary */

typedef struct {
    float *x;
    int n;
    ds_pick pk[8];
} pick_ctx;

static void pick_call(void *p)
{
    pick_ctx *c = p;
    int32_t out[8];
    G->pick_rows(out, c->x, c->n, 129280, c->pk);
}

/* Rows of normal logits times sd (a Box-Muller pair per two), or one token 20 above. */
static void bench_pick(int n, float sd, bool peaked, ds_pick pk)
{
    enum { V = 129280 };
    size_t nv = (size_t)n * V;
    float *h = malloc(sizeof(float) * nv);
    for (size_t i = 0; i < nv; i += 2) {
        double u1 = (frand() + 1.0) / 2 + 1e-12, u2 = frand() * 3.14159265358979;
        double r = sqrt(-2 * log(u1));
        h[i] = (float)(r * cos(u2) * sd);
        if (i + 1 < nv) h[i + 1] = (float)(r * sin(u2) * sd);
    }
    for (int i = 0; peaked && i < n; i++) h[(size_t)i * V + 777] = 20.0f;
    /* device memory from the pool, as in a decode step (test mode's managed buffers
     * would make each call's small output buffer a cudaMallocManaged and a cudaFree) */
    cuda_set_test_mode(false);
    pick_ctx c = {G->alloc(sizeof(float) * nv), n, {{0, 0, 1, 0, 1, 0, NULL}}};
    G->upload(c.x, h, sizeof(float) * nv);
    free(h);
    for (int i = 0; i < n; i++) {
        c.pk[i] = pk;
        c.pk[i].u = (frand() + 1.0) / 2;
    }
    char label[96];
    snprintf(label, sizeof label, "pick n=%d %s T %.1f top-k %d top-p %.2f", n, peaked ? "peaked" : sd > 2 ? "N(0,3)" : "N(0,1)",
             pk.temperature, pk.top_k, pk.top_p);
    report(label, median_time(pick_call, &c, 30), 4.0 * n * V, 0);
    G->free(c.x);
    cuda_set_test_mode(true);
}

/* ---- fixed cost of one op */

typedef struct {
    float *a, *b;
} add_ctx;

static void add_call(void *p)
{
    add_ctx *c = p;
    G->add(c->a, c->b, 1);
}

int main(void)
{
    if (cuda_device_count() == 0) {
        printf("bench_cuda_ops: skipped: no GPU\n");
        return 0;
    }
    cuda_set_test_mode(true); /* managed buffers filled from the host; each op waits (the per-op cost it measured) */
    if (!(G = cuda_backend())) {
        fprintf(stderr, "bench_cuda_ops: %s\n", ds_last_error());
        return 1;
    }
    add_ctx ac = {G->alloc(64), G->alloc(64)};
    report("add n=1 (fixed cost per op)", median_time(add_call, &ac, 50), 8, 1);
    G->free(ac.a);
    G->free(ac.b);
    /* V3 decode shapes: dense w1/w3 (18432x7168), wq_b (24576x1536), an expert's
     * w1 (2048x7168), wkv_a (576x7168); a 32768-row bf16 slice of the head. */
    bench_matmul(DS_W_FP8, 18432, 7168, 1, DS_GEMM_BF16);
    bench_matmul(DS_W_FP8, 18432, 7168, 1, DS_GEMM_FP8);
    bench_matmul(DS_W_FP8, 18432, 7168, 8, DS_GEMM_BF16);
    bench_matmul(DS_W_FP8, 24576, 1536, 1, DS_GEMM_BF16);
    bench_matmul(DS_W_FP8, 2048, 7168, 1, DS_GEMM_BF16);
    bench_matmul(DS_W_FP8, 576, 7168, 1, DS_GEMM_BF16);
    bench_matmul(DS_W_BF16, 32768, 7168, 1, DS_GEMM_BF16);
    bench_matmul(DS_W_F32, 8192, 7168, 1, DS_GEMM_BF16);
    /* prefill: the tiled kernel (CUDA cores, float32) */
    bench_matmul(DS_W_FP8, 2048, 7168, 512, DS_GEMM_BF16);
    bench_matmul(DS_W_FP8, 2048, 7168, 512, DS_GEMM_FP8);
    /* prefill on the FP8 GEMM path at 4096 tokens: the 16B experts' up (w1 | w3) and down
     * shapes as dense products, and V3's dense w1 */
    bench_matmul(DS_W_FP8, 2816, 2048, 4096, DS_GEMM_FP8);
    bench_matmul(DS_W_FP8, 2048, 1408, 4096, DS_GEMM_FP8);
    bench_matmul(DS_W_FP8, 18432, 7168, 4096, DS_GEMM_FP8);
    bench_attention(1, 128, 4096);
    bench_attention(8, 128, 4096);
    static const ds_pick picks[] = {
        {0, 0, 1, 0, 1, 0, NULL},    {0.7f, 0, 1, 0, 1, 0, NULL},    {0.7f, 40, 1, 0, 1, 0, NULL},
        {0.7f, 0, 0.9f, 0, 1, 0, NULL}, {0.7f, 40, 0.9f, 0, 1, 0, NULL}, {2.0f, 0, 0.9f, 0, 1, 0, NULL},
    };
    for (size_t i = 0; i < sizeof picks / sizeof *picks; i++) {
        bench_pick(1, 1.0f, false, picks[i]);
        bench_pick(1, 3.0f, false, picks[i]);
        bench_pick(1, 1.0f, true, picks[i]);
    }
    bench_pick(8, 1.0f, false, picks[3]);
    ds_status s = cuda_backend_status();
    if (s) fprintf(stderr, "bench_cuda_ops: %s\n", ds_last_error());
    return s ? 1 : 0;
}
