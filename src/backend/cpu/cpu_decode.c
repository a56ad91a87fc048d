/* cpu_decode.c - how the decode products (a few tokens against whole
 * matrices) are split over threads, whatever the instruction set: every job's
 * rows as one list of work units, one contiguous share of weight bytes per
 * thread, one parallel region for any number of matrices. The kernels
 * (cpu_avx512.c, cpu_avx2.c) supply the function that runs a unit's rows. */
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xmmintrin.h>

#include "base/clock.h"
#include "cpu_ref.h"
#include "cpu_simd.h"
#include "cpu_stats.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

static bool g_stats_on;
static cpu_stats g_stats;

void cpu_stats_enable(bool on)
{
    memset(&g_stats, 0, sizeof g_stats);
    g_stats_on = on;
}

void cpu_stats_read(cpu_stats *out) { *out = g_stats; }

bool cpu_stats_on(void) { return g_stats_on; }

void cpu_stats_note(cpu_stat_kind kind, double bytes, double t0)
{
    cpu_stat *s = kind == CPU_STAT_ATTENTION ? &g_stats.attention : &g_stats.heads_t;
    if (kind == CPU_STAT_PRODUCT) {
        int k = 0;
        while (k < CPU_STAT_SIZES - 1 && (double)((size_t)1 << k) < bytes) k++;
        s = &g_stats.products[k];
    }
    s->calls++;
    s->bytes += bytes;
    s->seconds += ds_now() - t0;
}

/* A thread's scratch buffers live in a block found through a pthread key, whose
 * destructor frees them when the thread exits: the server's threads come and
 * go, and a _Thread_local pointer alone would leak its buffers with each. */
typedef struct {
    void *buf[CPU_SCRATCH_SLOTS];
    size_t cap[CPU_SCRATCH_SLOTS];
} scratch_set;

static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static bool g_scratch_keyed;

static void scratch_free(void *p)
{
    scratch_set *s = p;
    for (int i = 0; i < CPU_SCRATCH_SLOTS; i++) free(s->buf[i]);
    free(s);
}

static void scratch_key_init(void) { g_scratch_keyed = pthread_key_create(&g_scratch_key, scratch_free) == 0; }

void cpu_stats_note_experts(int experts)
{
    g_stats.moe_calls++;
    g_stats.experts += experts;
}

void *cpu_scratch(int slot, size_t bytes)
{
    pthread_once(&g_scratch_once, scratch_key_init);
    if (!g_scratch_keyed) return NULL;
    scratch_set *s = pthread_getspecific(g_scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        if (pthread_setspecific(g_scratch_key, s)) {
            free(s);
            return NULL;
        }
    }
    if (bytes > s->cap[slot]) {
        free(s->buf[slot]);
        s->cap[slot] = 0;
        if (posix_memalign(&s->buf[slot], 64, bytes)) return s->buf[slot] = NULL;
        s->cap[slot] = bytes;
    }
    return s->buf[slot];
}

size_t cpu_row_bytes(const ds_weight *w)
{
    return (size_t)w->cols * (w->fmt == DS_W_FP8 ? 1 : w->fmt == DS_W_BF16 ? 2 : 4);
}

void cpu_decode_pieces(int K, int n, int wsz, int x_bytes, size_t prefetch_bytes, int *kc, size_t *row_pf)
{
    /* activation bytes the loops read a column and token: 4 (float32, or
     * bf16 hi + lo) */
    int T4 = MIN(n, 4), c = x_bytes / (4 * T4) / 128 * 128;
    if (c < 128) c = 128;
    if (c >= K) c = K;
    *kc = c;
    *row_pf = c < K ? (size_t)K * (size_t)wsz * ((prefetch_bytes + (size_t)c - 1) / (size_t)c) : 0;
}

/* Below this many weight bytes in all, one thread does the work: waking the
 * others costs more than it saves. */
#define DECODE_SERIAL_BYTES 65536
/* Rows of one work unit: at most UNIT_BYTES of weights, within one FP8 scale
 * block of one job, and small enough that the threads get UNITS_PER_THREAD
 * each (down to MIN_UNIT_BYTES): with 16 threads, units of 512 KiB left all
 * but one or two threads idle on the products of a few hundred KiB that a
 * step has dozens of (the router, the per-head values, the small attention
 * projections: 6-35 GB/s beside 85-90 for the large products, 16 cores of a
 * Xeon). A thread streams its own share of consecutive units, so small units
 * cost only the taking of each. */
#define UNIT_BYTES 524288
#define MIN_UNIT_BYTES 16384
#define UNITS_PER_THREAD 4

typedef struct {
    int job, a, b; /* rows [a, b) of jobs[job] */
} decode_unit;

/* The units of all jobs in order for nt threads, total weight bytes in all;
 * NULL (and *nu = 0) if out of memory. */
static decode_unit *decode_units(const ds_matmul_job *jobs, int nj, size_t total, int nt, int *nu)
{
    size_t unit = total / ((size_t)nt * UNITS_PER_THREAD), cap = 0;
    unit = unit > UNIT_BYTES ? UNIT_BYTES : unit < MIN_UNIT_BYTES ? MIN_UNIT_BYTES : unit;
    for (int i = 0; i < nj; i++) {
        size_t per = unit / cpu_row_bytes(jobs[i].w);
        cap += (size_t)jobs[i].rows / (per ? per : 1) + (size_t)jobs[i].rows / DS_BLOCK + 2;
    }
    decode_unit *u = cpu_scratch(4, sizeof(decode_unit) * cap);
    if (!u) cpu_fail_oom("decode work list", sizeof(decode_unit) * cap);
    int n = 0;
    for (int i = 0; u && i < nj; i++) {
        int per = (int)(unit / cpu_row_bytes(jobs[i].w));
        if (per < 1) per = 1;
        for (int a = 0, e; a < jobs[i].rows; a = e) {
            e = MIN(jobs[i].rows, a + per);
            if (jobs[i].w->fmt == DS_W_FP8) e = MIN(e, ((jobs[i].row0 + a) / DS_BLOCK + 1) * DS_BLOCK - jobs[i].row0);
            u[n++] = (decode_unit){i, a, e};
        }
    }
    *nu = n;
    return u;
}

/* A thread's share of the units, [front, back), packed in one word so that
 * its owner (taking from the front, streaming forwards) and a thread that has
 * finished its own share (taking from the back) never take the same unit. */
static inline bool take_unit(uint64_t *share, bool from_front, int *unit)
{
    uint64_t cur = __atomic_load_n(share, __ATOMIC_RELAXED);
    for (;;) {
        uint32_t f = (uint32_t)cur, b = (uint32_t)(cur >> 32);
        if (f >= b) return false;
        uint64_t next = from_front ? ((uint64_t)b << 32 | (f + 1)) : ((uint64_t)(b - 1) << 32 | f);
        if (__atomic_compare_exchange_n(share, &cur, next, true, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            *unit = (int)(from_front ? f : b - 1);
            return true;
        }
    }
}

#define MAX_SHARES 256

/* Each thread streams its share front to back; one that finishes early takes
 * units from the back of the others' shares (the machine is shared and a core
 * can be slower for a while). */
void cpu_decode_many(const ds_matmul_job *jobs, int nj, int x_floats, cpu_decode_rows_fn rows)
{
    size_t total = 0, xmax = 0;
    for (int i = 0; i < nj; i++) {
        total += cpu_row_bytes(jobs[i].w) * (size_t)jobs[i].rows;
        if (jobs[i].w->fmt != DS_W_F32 && (size_t)jobs[i].n * jobs[i].w->cols > xmax)
            xmax = (size_t)jobs[i].n * jobs[i].w->cols;
    }
    double t0 = g_stats_on ? ds_now() : 0;
    int nu = 0, team = total > DECODE_SERIAL_BYTES ? omp_get_max_threads() : 1;
    decode_unit *units = decode_units(jobs, nj, total, MIN(team, MAX_SHARES), &nu);
    if (!units) return; /* decode_units recorded the failure */
    /* one cache line each: the owner's and a thief's updates would otherwise
     * move the line between cores on every unit */
    struct {
        _Alignas(64) uint64_t v;
    } shares[MAX_SHARES];
    #pragma omp parallel if (total > DECODE_SERIAL_BYTES)
    {
        int nt = MIN(omp_get_num_threads(), MAX_SHARES), me = omp_get_thread_num();
        size_t xbytes = (size_t)x_floats * sizeof(float) * xmax;
        float *xs = xmax ? cpu_scratch(0, xbytes) : NULL;
        bool ok = !(xmax && !xs);
        if (!ok) cpu_fail_oom("decode activations", xbytes);
        if (me < nt) {
            /* share [lo, hi) of the bytes; a unit belongs to the share its start falls in */
            double lo = (double)total * me / nt, hi = (double)total * (me + 1) / nt, off = 0;
            int f = nu, b = nu;
            for (int i = 0, u = 0; u < nu; u++) {
                while (units[u].job != i) i++;
                if (off >= lo && f == nu) f = u;
                if (off >= hi) {
                    b = u;
                    break;
                }
                off += (double)cpu_row_bytes(jobs[i].w) * (units[u].b - units[u].a);
            }
            shares[me].v = (uint64_t)(uint32_t)b << 32 | (uint32_t)(f < b ? f : b);
            /* the FP8 scale rows of the share (a unit is within one), which would
             * otherwise each cost the activations' preparation a round trip to memory */
            for (int i = f; i < b; i++) {
                const ds_matmul_job *j = &jobs[units[i].job];
                if (j->w->fmt != DS_W_FP8) continue;
                int kb = (j->w->cols + DS_BLOCK - 1) / DS_BLOCK;
                const float *sr = j->w->scale + (size_t)((j->row0 + units[i].a) / DS_BLOCK) * kb;
                for (uintptr_t a = (uintptr_t)sr & ~(uintptr_t)63; a < (uintptr_t)(sr + kb); a += 64)
                    _mm_prefetch((const char *)a, _MM_HINT_T0);
            }
        }
        #pragma omp barrier
        cpu_decode_state st = {NULL, -1};
        int u;
        if (me < nt) {
            while (take_unit(&shares[me].v, true, &u))
                if (ok) rows(&jobs[units[u].job], units[u].a, units[u].b, xs, &st);
            for (int k = 1; k < nt; k++)
                while (take_unit(&shares[(me + k) % nt].v, false, &u))
                    if (ok) rows(&jobs[units[u].job], units[u].a, units[u].b, xs, &st);
        }
    }
    if (g_stats_on) cpu_stats_note(CPU_STAT_PRODUCT, (double)total, t0);
}

void cpu_matmul_heads(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0, int hstride,
                      int rows, cpu_many_fn many, cpu_matmul_fn matmul)
{
    ds_matmul_job *jobs = malloc(sizeof(ds_matmul_job) * (size_t)H);
    if (!jobs) {
        cpu_fail_oom("per-head jobs", sizeof(ds_matmul_job) * (size_t)H);
        return;
    }
    if (n == 1) { /* heads' rows are contiguous per head: one decode region for all */
        for (int h = 0; h < H; h++)
            jobs[h] = (ds_matmul_job){y + (size_t)h * ys, x + (size_t)h * xs, 1, w, row0 + h * hstride, rows};
        many(jobs, H, DS_GEMM_BF16, false);
        free(jobs);
        return;
    }
    int K = w->cols;
    /* a decode batch: every head's tokens gathered, then one decode region for
     * all heads (a region a head cost a batch of 8 a twelfth of its step, 16
     * cores); a prefill: a GEMM a head */
    bool batch = n < cpu_gemm_min_tokens;
    size_t hx = batch ? (size_t)H : 1;
    float *xt = malloc(sizeof(float) * hx * (size_t)n * K), *yt = malloc(sizeof(float) * hx * (size_t)n * rows);
    if (!xt || !yt) {
        cpu_fail_oom("per-head activations", sizeof(float) * hx * (size_t)n * ((size_t)K + rows));
        goto done;
    }
    for (int h0 = 0; h0 < H; h0 += (int)hx) {
        for (int h = h0; h < h0 + (int)hx; h++) {
            float *xh = xt + (size_t)(h - h0) * n * K;
            for (int t = 0; t < n; t++) memcpy(xh + (size_t)t * K, x + ((size_t)t * H + h) * xs, sizeof(float) * (size_t)K);
            jobs[h - h0] = (ds_matmul_job){yt + (size_t)(h - h0) * n * rows, xh, n, w, row0 + h * hstride, rows};
        }
        if (batch) many(jobs, H, DS_GEMM_BF16, false);
        else matmul(yt, xt, n, w, row0 + h0 * hstride, rows, DS_GEMM_BF16, false);
        for (int h = h0; h < h0 + (int)hx; h++)
            for (int t = 0; t < n; t++)
                memcpy(y + ((size_t)t * H + h) * ys, yt + ((size_t)(h - h0) * n + t) * rows, sizeof(float) * (size_t)rows);
    }
done:
    free(jobs);
    free(xt);
    free(yt);
}
