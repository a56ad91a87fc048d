/* cpu.c - picks the CPU backend's operations: the scalar reference, or the
 * fast kernels where they exist and the CPU supports them.
 *
 * The fast table starts as a copy of the reference and overrides the members
 * that have vectorised versions (matmul, matmul_t, attention, silu_mul and
 * the batched matmul_many, matmul_heads(_t), moe_experts on AVX-512; matmul
 * on AVX2), and runs the reference's row-wise ops on all threads. The choice
 * is made at run time with __builtin_cpu_supports, so one binary runs on any
 * x86-64; cpu_tuning (cpu_backend.h) may ask for a narrower set and selects
 * the precision of the prefill GEMM's activations. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend.h"
#include "base/clock.h"
#include "cpu_amx.h"
#include "cpu_backend.h"
#include "cpu_ref.h"
#include "cpu_simd.h"
#include "cpu_stats.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* Activation buffers: the model allocates and frees the same sizes every
 * layer and every call. Freed blocks are kept (up to CACHE_BYTES in all) and
 * handed out again, so a forward pass does not pay for fresh zeroed pages
 * (without the cache, page faults are a quarter of prefill time). A block carries its capacity
 * in a 64-byte header. alloc zeroes what it hands out; alloc_scratch (a
 * pass's scratch, written before it is read) does not. */
#define CACHE_SLOTS 32
#define CACHE_BYTES ((size_t)128 << 20)

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char *g_cache[CACHE_SLOTS];
static size_t g_cached;

static size_t block_cap(const char *p) { return *(const size_t *)(p - 64); }

/* Blocks of this many bytes or more (a layer's KV cache at a long context, a
 * long prefill's activations) are rounded up to whole 2 MiB pages and asked to
 * be backed by them: the decode attention walks a long cache two rows to a 4 KiB
 * page, and those pages' TLB misses cost it 3-11% (Zen 3: one
 * thread over eight 4096-position caches, both kinds of pages alternated in one
 * process, four rounds). */
#define HUGE_BLOCK ((size_t)4 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

/* A cached or new block of at least bytes, contents as left. */
static void *take_block(size_t bytes)
{
    char *p = NULL;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < CACHE_SLOTS; i++)
        if (g_cache[i] && block_cap(g_cache[i]) >= bytes && block_cap(g_cache[i]) <= 2 * bytes + 65536) {
            p = g_cache[i];
            g_cache[i] = NULL;
            g_cached -= block_cap(p);
            break;
        }
    pthread_mutex_unlock(&g_mu);
    if (!p) {
        size_t page = bytes >= HUGE_BLOCK ? HUGE_PAGE : 4096;
        size_t cap = (bytes + page - 1) & ~(page - 1);
        char *raw = NULL;
        if (cap < bytes || posix_memalign((void **)&raw, page == HUGE_PAGE ? HUGE_PAGE : 64, cap + 64)) return NULL;
        if (page == HUGE_PAGE) madvise(raw, cap, MADV_HUGEPAGE); /* advice: failure leaves 4 KiB pages */
        *(size_t *)raw = cap;
        p = raw + 64;
    }
    return p;
}

static void *fast_alloc(size_t bytes)
{
    void *p = take_block(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

/* cpu_tuning.poison_scratch: scratch comes filled with NaN bytes. */
static bool g_poison;

static void *fast_alloc_scratch(size_t bytes)
{
    void *p = take_block(bytes);
    if (p && g_poison) memset(p, 0xff, bytes);
    return p;
}

static void fast_free(void *ptr)
{
    char *p = ptr;
    if (!p) return;
    size_t cap = block_cap(p);
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < CACHE_SLOTS && g_cached + cap <= CACHE_BYTES; i++)
        if (!g_cache[i]) {
            g_cache[i] = p;
            g_cached += cap;
            p = NULL;
            break;
        }
    pthread_mutex_unlock(&g_mu);
    if (p) free(p - 64);
}

bool cpu_has_avx512(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx512vbmi") && cpu_has_avx2();
#else
    return false;
#endif
}

bool cpu_has_avx2(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

/* The kernels' matmul_heads_t, timed for cpu_stats (it is the one product of
 * a decode step that cpu_decode_many does not run). */
static void (*g_heads_t)(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                         int hstride, int rows);

static void heads_t_counted(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                            int hstride, int rows)
{
    double t0 = cpu_stats_on() ? ds_now() : 0;
    g_heads_t(y, ys, x, xs, n, H, w, row0, hstride, rows);
    if (cpu_stats_on()) cpu_stats_note(CPU_STAT_HEADS_T, (double)cpu_row_bytes(w) * rows * H, t0);
}

/* ---- row-wise ops on all threads -----------------------------------------
 * The reference's row-wise ops (norms, rope, routing, embedding, add) run on
 * blocks of PAR_ROWS rows, the blocks spread over the threads: every row is
 * the reference's own arithmetic on one thread, so the results are those of
 * the reference bit for bit. Small calls (a decode step's few rows) stay on
 * the calling thread: a parallel region costs more than they do. On one
 * thread these ops are ~1% of a prefill pass of the 16B shapes, which is
 * much of it once 16 threads share the products. */
#define PAR_ROWS 8
#define PAR_FLOATS 32768 /* the least work (floats touched) that gets the threads */

static void par_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps)
{
    #pragma omp parallel for schedule(static) if ((size_t)n * dim >= PAR_FLOATS && n > PAR_ROWS)
    for (int i = 0; i < n; i += PAR_ROWS)
        cpu_ref_ops.rmsnorm(y + (size_t)i * dim, x + (size_t)i * dim, w, MIN(PAR_ROWS, n - i), dim, eps);
}

static void par_rmsnorm_rows(float *y, int ys, const int *di, float *x, int xs, const float *r, const float *w, int n,
                             int dim, float eps)
{
    #pragma omp parallel for schedule(static) if ((size_t)n * dim >= PAR_FLOATS && n > PAR_ROWS)
    for (int i = 0; i < n; i += PAR_ROWS)
        cpu_ref_ops.rmsnorm_rows(di ? y : y + (size_t)i * ys, ys, di ? di + i : NULL, x + (size_t)i * xs, xs,
                                 r ? r + (size_t)i * dim : NULL, w, MIN(PAR_ROWS, n - i), dim, eps);
}

static void par_rope(float *x, int n, int nvec, int stride, int off, int rope, const int *pos, const float *cos_tab,
                     const float *sin_tab)
{
    #pragma omp parallel for schedule(static) if ((size_t)n * nvec * rope >= PAR_FLOATS && n > PAR_ROWS)
    for (int t = 0; t < n; t += PAR_ROWS)
        cpu_ref_ops.rope(x + (size_t)t * nvec * stride, MIN(PAR_ROWS, n - t), nvec, stride, off, rope, pos + t, cos_tab,
                         sin_tab);
}

static void par_rope_copy(float *dst, int ds, const int *di, const float *src, int ss, int n, int nvec, int rope,
                          const int *pos, const float *cos_tab, const float *sin_tab)
{
    #pragma omp parallel for schedule(static) if ((size_t)n * nvec * rope >= PAR_FLOATS && n > PAR_ROWS)
    for (int t = 0; t < n; t += PAR_ROWS)
        cpu_ref_ops.rope_copy(di ? dst : dst + (size_t)t * nvec * ds, ds, di ? di + t : NULL, src + (size_t)t * nvec * ss,
                              ss, MIN(PAR_ROWS, n - t), nvec, rope, pos + t, cos_tab, sin_tab);
}

static void par_add(float *y, const float *x, size_t n)
{
    const size_t blk = 16384;
    #pragma omp parallel for schedule(static) if (n >= 2 * blk)
    for (size_t i = 0; i < n; i += blk) cpu_ref_ops.add(y + i, x + i, MIN(blk, n - i));
}

static void par_embed(float *h, const ds_weight *emb, const int32_t *tok, int n, int row0)
{
    #pragma omp parallel for schedule(static) if ((size_t)n * emb->cols >= PAR_FLOATS && n > PAR_ROWS)
    for (int i = 0; i < n; i += PAR_ROWS)
        cpu_ref_ops.embed(h + (size_t)i * emb->cols, emb, tok + i, MIN(PAR_ROWS, n - i), row0);
}

/* Routing costs ~E^2 K operations a token, whatever the width of the rows. */
static void par_moe_route(int *idx, float *wt, float *sc, const float *bias, int n, int E, int K, int groups,
                          int limited_groups, bool sigmoid, float route_scale)
{
    #pragma omp parallel for schedule(static) if (n > PAR_ROWS)
    for (int t = 0; t < n; t += PAR_ROWS)
        cpu_ref_ops.moe_route(idx + (size_t)t * K, wt + (size_t)t * K, sc + (size_t)t * E, bias, MIN(PAR_ROWS, n - t), E,
                              K, groups, limited_groups, sigmoid, route_scale);
}

/* The reference with the fast allocator and the kernels of one instruction set. */
static void fill_fast(ds_ops *t, cpu_isa isa)
{
    *t = cpu_ref_ops;
    t->alloc = fast_alloc;
    t->alloc_scratch = fast_alloc_scratch;
    t->free = fast_free;
    t->rmsnorm = par_rmsnorm;
    t->rmsnorm_rows = par_rmsnorm_rows;
    t->rope = par_rope;
    t->rope_copy = par_rope_copy;
    t->add = par_add;
    t->embed = par_embed;
    t->moe_route = par_moe_route;
    /* the reference's batched versions of these are scalar; without AVX-512 the
     * generic loops over heads and experts (backend/fallback.c) reach the fast matmuls */
    t->matmul_heads = NULL;
    t->matmul_heads_t = NULL;
    t->moe_experts = NULL;
    if (isa == CPU_ISA_AUTO && cpu_has_avx512()) {
        t->name = "cpu-avx512";
        t->matmul = avx512_matmul;
        t->matmul_t = avx512_matmul_t;
        t->attention = avx512_attention;
        t->silu_mul = avx512_silu_mul;
        t->matmul_many = avx512_matmul_many;
        t->matmul_heads = avx512_matmul_heads;
        t->matmul_heads_t = avx512_matmul_heads_t;
        t->moe_experts = avx512_moe_experts;
    } else if (cpu_has_avx2()) {
        t->name = "cpu-avx2";
        t->attn_head_last = true; /* per-head limits: the expanded prefill runs here */
        t->matmul = avx2_matmul;
        t->matmul_many = avx2_matmul_many;
        t->moe_experts = avx2_moe_experts;
        t->matmul_t = avx2_matmul_t;
        t->matmul_heads = avx2_matmul_heads;
        t->matmul_heads_t = avx2_matmul_heads_t;
        t->attention = avx2_attention;
        t->silu_mul = avx2_silu_mul;
    }
    if ((g_heads_t = t->matmul_heads_t)) t->matmul_heads_t = heads_t_counted;
}

/* The AVX-512 entry points that can reach the batched GEMM, with
 * cpu_gemm_amx set on the calling thread for the call (the GEMM reads it
 * there before it starts its threads). */
static void amx_matmul(float *y, const float *x, int n, const ds_weight *w, int row0, int rows, ds_gemm_impl gemm,
                       bool ue8m0)
{
    bool keep = cpu_gemm_amx;
    cpu_gemm_amx = true;
    avx512_matmul(y, x, n, w, row0, rows, gemm, ue8m0);
    cpu_gemm_amx = keep;
}

static void amx_matmul_many(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0)
{
    bool keep = cpu_gemm_amx;
    cpu_gemm_amx = true;
    avx512_matmul_many(jobs, n_jobs, gemm, ue8m0);
    cpu_gemm_amx = keep;
}

static void amx_matmul_heads(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                             int hstride, int rows)
{
    bool keep = cpu_gemm_amx;
    cpu_gemm_amx = true;
    avx512_matmul_heads(y, ys, x, xs, n, H, w, row0, hstride, rows);
    cpu_gemm_amx = keep;
}

static void amx_moe_experts(float *y, const float *x, int n, int K, const int *idx, const float *wt,
                            const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int e0, int ne,
                            const ds_mlp_w *shared, ds_gemm_impl gemm, bool ue8m0)
{
    bool keep = cpu_gemm_amx;
    cpu_gemm_amx = true;
    avx512_moe_experts(y, x, n, K, idx, wt, ew1, ew2, ew3, e0, ne, shared, gemm, ue8m0);
    cpu_gemm_amx = keep;
}

/* g_amx: the AVX-512 table with its GEMM on AMX tiles (filled only where
 * cpu_has_amx()). */
static ds_ops g_auto, g_avx2, g_amx;
static pthread_once_t g_auto_once = PTHREAD_ONCE_INIT, g_avx2_once = PTHREAD_ONCE_INIT,
                      g_amx_once = PTHREAD_ONCE_INIT;
static void fill_auto(void) { fill_fast(&g_auto, CPU_ISA_AUTO); }
static void fill_avx2(void) { fill_fast(&g_avx2, CPU_ISA_AVX2); }

static void fill_amx(void)
{
    pthread_once(&g_auto_once, fill_auto);
    g_amx = g_auto;
    g_amx.name = "cpu-avx512-amx";
    g_amx.matmul = amx_matmul;
    g_amx.matmul_many = amx_matmul_many;
    g_amx.matmul_heads = amx_matmul_heads;
    g_amx.moe_experts = amx_moe_experts;
}

cpu_tuning cpu_tuning_default(void)
{
    return (cpu_tuning){.isa = CPU_ISA_AUTO, .gemm_precision = CPU_GEMM_HILO8, .poison_scratch = false, .no_amx = false};
}

const ds_ops *cpu_backend_tuned(const cpu_tuning *t)
{
    cpu_tuning d = cpu_tuning_default();
    if (!t) t = &d;
    cpu_gemm_precision = t->gemm_precision;
    g_poison = t->poison_scratch;
    switch (t->isa) {
    case CPU_ISA_SCALAR:
        return &cpu_ref_ops;
    case CPU_ISA_AVX2:
        pthread_once(&g_avx2_once, fill_avx2);
        return &g_avx2;
    default:
        if (!t->no_amx && cpu_has_amx()) {
            pthread_once(&g_amx_once, fill_amx);
            return &g_amx;
        }
        pthread_once(&g_auto_once, fill_auto);
        return &g_auto;
    }
}

const ds_ops *cpu_backend(bool simd)
{
    if (!simd) return &cpu_ref_ops;
    pthread_once(&g_auto_once, fill_auto);
    return &g_auto;
}
