/* cpu_moe.c - the routed experts of a MoE layer (ds_ops.moe_experts) on the
 * AVX-512 or the AVX2 kernels.
 *
 * The (token, expert) assignments of this rank are ordered by expert and cut
 * into chunks of at most MOE_CHUNK rows (one expert with more assignments
 * forms a chunk of its own). Each chunk costs two matmul_many calls: w1 and
 * w3 of all its experts together, then their w2s. A decode step (a few
 * tokens, 6-8 experts each) is one chunk, so all its experts' rows are spread
 * over the threads in one parallel region instead of three regions per
 * expert; in a prefill each call's batched GEMMs share one region too (up to
 * 32 of them: avx512_matmul_many), so larger chunks mean fewer regions and
 * a shorter tail of unequal panels per region: pp512 of the 16B shapes ~1%
 * faster with 256 rows than 64 (2 cores), and on 16 Xeon cores with AMX
 * 1013.8 and 1038.7 tok/s with 512 rows (32 GEMMs a region) against 995.7
 * and 993.5 with 256 (16), alternated in one call. The shared experts ride along
 * in the last chunk's two calls (all tokens, weight 1), added after every
 * routed expert; their jobs come first in each call, so that the threads
 * claim the heavy panels (all n tokens) first and the light ones even out the
 * end. Sums run in expert order, as in the reference's moe_experts.
 *   Everything between the products runs on all threads: the gather of a
 * chunk's rows by row, the weighted sums and the shared add by column blocks
 * (each output element still sums its terms in expert order, then the shared
 * experts', on one thread). On one thread these are ~3% of a prefill pass,
 * which on 16 threads with AMX products was as long as the products. */
#include <stdlib.h>
#include <string.h>

#include "cpu_ref.h"
#include "cpu_simd.h"
#include "cpu_stats.h"

#define MOE_CHUNK 512
#define MOE_COLS 64          /* columns of a block of the weighted sums */
#define MOE_PAR_FLOATS 65536 /* moves this large or larger are split over the threads */

typedef void (*many_fn)(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0);
typedef void (*silu_fn)(float *a, const float *b, size_t n);

typedef struct {
    many_fn many;     /* the kernels: matmul_many and silu_mul */
    silu_fn silu;
    int *tok;         /* assignment -> token, ordered by expert */
    float *w;         /* assignment -> routing weight */
    int *first;       /* expert e's assignments: [first[e], first[e+1]) */
    float *xs, *a, *g, *ys; /* chunk buffers: (rows, dim), (rows, inter) x2, (rows, dim) */
    ds_matmul_job *jobs;
    int n;
    const ds_mlp_w *shared; /* set for the chunk that also runs the shared experts */
    float *sa, *sg, *sy;    /* their buffers: (n, inter_s) x2, (n, dim) */
} moe_bufs;

/* Experts [e_lo, e_hi) as one chunk: assignments [r0, r1), and the shared
 * experts over all n tokens when b->shared is set. */
static void moe_chunk(float *y, const float *x, const moe_bufs *b, int e_lo, int e_hi, const ds_weight *ew1,
                      const ds_weight *ew2, const ds_weight *ew3, ds_gemm_impl gemm, bool ue8m0)
{
    int dim = ew1[0].cols, inter = ew1[0].rows, r0 = b->first[e_lo], nj = 0;
    const ds_mlp_w *sh = b->shared;
    int si = sh ? sh->w1->rows : 0, rows = b->first[e_hi] - r0;
    #pragma omp parallel for schedule(static) if ((size_t)rows * dim >= MOE_PAR_FLOATS)
    for (int i = r0; i < r0 + rows; i++)
        memcpy(b->xs + (size_t)(i - r0) * dim, x + (size_t)b->tok[i] * dim, sizeof(float) * (size_t)dim);
    if (sh) {
        b->jobs[nj++] = (ds_matmul_job){b->sa, x, b->n, sh->w1, 0, si};
        b->jobs[nj++] = (ds_matmul_job){b->sg, x, b->n, sh->w3, 0, si};
    }
    for (int e = e_lo; e < e_hi; e++) {
        int o = b->first[e] - r0, cnt = b->first[e + 1] - b->first[e];
        if (!cnt) continue;
        b->jobs[nj++] = (ds_matmul_job){b->a + (size_t)o * inter, b->xs + (size_t)o * dim, cnt, &ew1[e], 0, inter};
        b->jobs[nj++] = (ds_matmul_job){b->g + (size_t)o * inter, b->xs + (size_t)o * dim, cnt, &ew3[e], 0, inter};
    }
    b->many(b->jobs, nj, gemm, ue8m0);
    if (rows) b->silu(b->a, b->g, (size_t)rows * inter);
    if (sh) b->silu(b->sa, b->sg, (size_t)b->n * si);
    nj = 0;
    if (sh) b->jobs[nj++] = (ds_matmul_job){b->sy, b->sa, b->n, sh->w2, 0, dim};
    for (int e = e_lo; e < e_hi; e++) {
        int o = b->first[e] - r0, cnt = b->first[e + 1] - b->first[e];
        if (cnt) b->jobs[nj++] = (ds_matmul_job){b->ys + (size_t)o * dim, b->a + (size_t)o * inter, cnt, &ew2[e], 0, dim};
    }
    b->many(b->jobs, nj, gemm, ue8m0);
    /* y[t] += w * expert(x[t]), in expert order, then the shared experts: a
     * block of columns per step, so that each element's sum is one thread's */
    int nb = (dim + MOE_COLS - 1) / MOE_COLS;
    size_t work = ((size_t)rows + (sh ? (size_t)b->n : 0)) * dim;
    #pragma omp parallel for schedule(static) if (work >= MOE_PAR_FLOATS)
    for (int cb = 0; cb < nb; cb++) {
        int j0 = cb * MOE_COLS, j1 = j0 + MOE_COLS < dim ? j0 + MOE_COLS : dim;
        for (int i = 0; i < rows; i++) {
            float *yt = y + (size_t)b->tok[r0 + i] * dim, wi = b->w[r0 + i];
            const float *yi = b->ys + (size_t)i * dim;
            for (int j = j0; j < j1; j++) yt[j] += wi * yi[j];
        }
        for (int t = 0; sh && t < b->n; t++) {
            float *yt = y + (size_t)t * dim;
            const float *st = b->sy + (size_t)t * dim;
            for (int j = j0; j < j1; j++) yt[j] += st[j];
        }
    }
}

static void moe_experts(many_fn many, silu_fn silu, float *y, const float *x, int n, int K, const int *idx,
                        const float *wt, const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int e0, int ne,
                        const ds_mlp_w *shared, ds_gemm_impl gemm, bool ue8m0)
{
    int dim = ew1[0].cols, inter = ew1[0].rows;
    /* its alloc_scratch reuses freed buffers and does not zero them: every
     * buffer below is written before it is read */
    const ds_ops *ops = cpu_backend(true);
    #pragma omp parallel for schedule(static) if ((size_t)n * dim >= MOE_PAR_FLOATS)
    for (int t = 0; t < n; t++) memset(y + (size_t)t * dim, 0, sizeof(float) * (size_t)dim);
    moe_bufs b = {0};
    b.many = many;
    b.silu = silu;
    b.n = n;
    b.first = calloc((size_t)ne + 1, sizeof(int));
    b.tok = malloc(sizeof(int) * ((size_t)n * K + 1));
    b.w = malloc(sizeof(float) * ((size_t)n * K + 1));
    b.jobs = malloc(sizeof(ds_matmul_job) * (2 * (size_t)ne + 2));
    if (!b.first || !b.tok || !b.w || !b.jobs) {
        cpu_fail_oom("expert routing tables", (sizeof(int) + sizeof(float)) * (size_t)n * K);
        goto done;
    }
    if (shared) {
        size_t si = (size_t)shared->w1->rows;
        b.sa = ops->alloc_scratch(sizeof(float) * (size_t)n * si);
        b.sg = ops->alloc_scratch(sizeof(float) * (size_t)n * si);
        b.sy = ops->alloc_scratch(sizeof(float) * (size_t)n * dim);
        if (!b.sa || !b.sg || !b.sy) {
            cpu_fail_oom("shared expert activations", sizeof(float) * (size_t)n * (2 * si + (size_t)dim));
            goto done;
        }
    }
    /* counting sort of the assignments by expert (tokens ascending within one) */
    for (size_t i = 0; i < (size_t)n * K; i++)
        if (idx[i] >= e0 && idx[i] < e0 + ne) b.first[idx[i] - e0 + 1]++;
    int maxcnt = 0;
    for (int e = 0; e < ne; e++) {
        if (b.first[e + 1] > maxcnt) maxcnt = b.first[e + 1];
        b.first[e + 1] += b.first[e];
    }
    int *fill = malloc(sizeof(int) * (size_t)(ne + 1));
    if (!fill) {
        cpu_fail_oom("expert routing tables", sizeof(int) * (size_t)(ne + 1));
        goto done;
    }
    memcpy(fill, b.first, sizeof(int) * (size_t)ne);
    for (size_t i = 0; i < (size_t)n * K; i++)
        if (idx[i] >= e0 && idx[i] < e0 + ne) {
            int j = fill[idx[i] - e0]++;
            b.tok[j] = (int)(i / (size_t)K);
            b.w[j] = wt[i];
        }
    free(fill);
    if (cpu_stats_on()) {
        int touched = 0;
        for (int e = 0; e < ne; e++) touched += b.first[e + 1] > b.first[e];
        cpu_stats_note_experts(touched);
    }
    if (b.first[ne]) {
        size_t cap = (size_t)(maxcnt > MOE_CHUNK ? maxcnt : MOE_CHUNK);
        b.xs = ops->alloc_scratch(sizeof(float) * cap * dim);
        b.ys = ops->alloc_scratch(sizeof(float) * cap * dim);
        b.a = ops->alloc_scratch(sizeof(float) * cap * inter);
        b.g = ops->alloc_scratch(sizeof(float) * cap * inter);
        bool ok = b.xs && b.ys && b.a && b.g; /* (64 + busiest expert) rows */
        if (!ok) cpu_fail_oom("expert activations", sizeof(float) * cap * 2 * ((size_t)dim + inter));
        for (int lo = 0, hi; ok && lo < ne; lo = hi) {
            hi = lo + 1;
            while (hi < ne && b.first[hi + 1] - b.first[lo] <= MOE_CHUNK) hi++;
            b.shared = b.first[hi] == b.first[ne] ? shared : NULL; /* the last chunk with work */
            if (b.first[hi] > b.first[lo]) moe_chunk(y, x, &b, lo, hi, ew1, ew2, ew3, gemm, ue8m0);
        }
        ops->free(b.xs);
        ops->free(b.ys);
        ops->free(b.a);
        ops->free(b.g);
    } else if (shared) { /* no local expert chosen: the shared experts alone */
        b.shared = shared;
        moe_chunk(y, x, &b, 0, 0, ew1, ew2, ew3, gemm, ue8m0);
    }
done:
    ops->free(b.sa);
    ops->free(b.sg);
    ops->free(b.sy);
    free(b.first);
    free(b.tok);
    free(b.w);
    free(b.jobs);
}

void avx512_moe_experts(float *y, const float *x, int n, int K, const int *idx, const float *wt, const ds_weight *ew1,
                        const ds_weight *ew2, const ds_weight *ew3, int e0, int ne, const ds_mlp_w *shared,
                        ds_gemm_impl gemm, bool ue8m0)
{
    moe_experts(avx512_matmul_many, avx512_silu_mul, y, x, n, K, idx, wt, ew1, ew2, ew3, e0, ne, shared, gemm, ue8m0);
}

void avx2_moe_experts(float *y, const float *x, int n, int K, const int *idx, const float *wt, const ds_weight *ew1,
                      const ds_weight *ew2, const ds_weight *ew3, int e0, int ne, const ds_mlp_w *shared,
                      ds_gemm_impl gemm, bool ue8m0)
{
    moe_experts(avx2_matmul_many, avx2_silu_mul, y, x, n, K, idx, wt, ew1, ew2, ew3, e0, ne, shared, gemm,
                ue8m0);
}
