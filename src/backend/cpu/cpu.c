/* cpu.c - picks the CPU backend's operations: the scalar reference, or the
 * fast kernels where they exist and the CPU supports them.
 *
 * The fast table starts as a copy of the reference and overrides the members
 * that have vectorised versions (matmul, matmul_t, attention, silu_mul and
 * the batched matmul_many, matmul_heads(_t), moe_experts on AVX-512; matmul
 * on AVX2). The choice is made at run time with
 * __builtin_cpu_supports, so one binary runs on any x86-64.
 * DSV3_CPU_GEMM=bf16|split|hilo8 in the environment selects the precision of
 * the prefill GEMM's activations (see cpu_simd.h); the default, hilo8, keeps
 * the golden tests' accuracy. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend.h"
#include "cpu_ref.h"
#include "cpu_simd.h"
#include "cpu_stats.h"

static ds_ops g_fast;

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

/* DSV3_SCRATCH_POISON=1: scratch comes filled with NaN bytes, so that a test shows
 * whether any reader relies on what it did not write (read once). */
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
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

bool cpu_has_avx512(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni") && cpu_has_avx2();
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
    double t0 = cpu_stats_on() ? cpu_stats_clock() : 0;
    g_heads_t(y, ys, x, xs, n, H, w, row0, hstride, rows);
    if (cpu_stats_on()) cpu_stats_note(CPU_STAT_HEADS_T, (double)cpu_row_bytes(w) * rows * H, t0);
}

static void fill_fast(void)
{
    g_fast = cpu_ref_ops;
    g_fast.alloc = fast_alloc;
    g_fast.alloc_scratch = fast_alloc_scratch;
    g_fast.free = fast_free;
    const char *poison = getenv("DSV3_SCRATCH_POISON");
    g_poison = poison && !strcmp(poison, "1");
    /* the reference's batched versions of these are scalar; without AVX-512
     * the model's host loops over heads and experts reach the fast matmuls */
    g_fast.matmul_heads = NULL;
    g_fast.matmul_heads_t = NULL;
    g_fast.moe_experts = NULL;
    /* DSV3_CPU_ISA=avx2: the AVX2 kernels on a CPU that also has AVX-512 (to
     * test and measure what machines without it run) */
    const char *isa = getenv("DSV3_CPU_ISA");
    bool avx2_only = isa && !strcmp(isa, "avx2");
    if (cpu_has_avx512() && !avx2_only) {
        g_fast.name = "cpu-avx512";
        g_fast.matmul = avx512_matmul;
        g_fast.matmul_t = avx512_matmul_t;
        g_fast.attention = avx512_attention;
        g_fast.silu_mul = avx512_silu_mul;
        g_fast.matmul_many = avx512_matmul_many;
        g_fast.matmul_heads = avx512_matmul_heads;
        g_fast.matmul_heads_t = avx512_matmul_heads_t;
        g_fast.moe_experts = avx512_moe_experts;
        /* bf16-rounded prefill activations: twice the speed, but beyond the
         * golden tests' 1e-3 tolerance on the (chaotic) tiny model; opt-in */
        const char *prec = getenv("DSV3_CPU_GEMM");
        if (prec && !strcmp(prec, "bf16")) cpu_gemm_precision = CPU_GEMM_BF16;
        if (prec && !strcmp(prec, "split")) cpu_gemm_precision = CPU_GEMM_SPLIT;
        if (prec && !strcmp(prec, "hilo8")) cpu_gemm_precision = CPU_GEMM_HILO8;
    } else if (cpu_has_avx2()) {
        g_fast.name = "cpu-avx2";
        g_fast.attn_head_last = true; /* per-head limits: the expanded prefill runs here */
        g_fast.matmul = avx2_matmul;
        g_fast.matmul_many = avx2_matmul_many;
        g_fast.moe_experts = avx2_moe_experts;
        g_fast.matmul_t = avx2_matmul_t;
        g_fast.matmul_heads = avx2_matmul_heads;
        g_fast.matmul_heads_t = avx2_matmul_heads_t;
        g_fast.attention = avx2_attention;
        g_fast.silu_mul = avx2_silu_mul;
    }
    if ((g_heads_t = g_fast.matmul_heads_t)) g_fast.matmul_heads_t = heads_t_counted;
}

const ds_ops *cpu_backend(bool simd)
{
    if (!simd) return &cpu_ref_ops;
    pthread_once(&g_once, fill_fast);
    return &g_fast;
}
