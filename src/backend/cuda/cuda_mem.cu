/* cuda_mem.cu - memory for the CUDA backend: activation buffers, the staging
 * of host arguments, the weights, and error recording.
 *
 * Every op is queued on one stream (cu_s) and returns without waiting;
 * download and sync wait. Activations come from cudaMalloc through a pool of
 * freed blocks (the model frees and allocates the same sizes every layer, and
 * cudaFree would synchronise); their ranges are kept sorted so an op can tell
 * a device pointer from a host one without asking the driver. In test mode
 * (cuda_set_test_mode) activations are managed memory and every op
 * synchronises, so a test may read and write them from the host. Arguments
 * that are plain host memory are copied through a reusable device arena for
 * the duration of one op (that op then synchronises). Weights are copied once
 * at load by upload_weight (w->dev); weights without one (tests; host mmap'd
 * checkpoint data) are copied to cudaMalloc'd memory on first use, whole, one byte per FP8 weight plus its
 * scales, and found again by their host data pointer in an open-addressing
 * table. A cached copy is checked against a signature of the host bytes on
 * every use (the first and last 256 bytes and the first scales) so that a
 * pointer reused by a later mmap of different data is caught and re-uploaded;
 * cuda_forget_weights() drops everything. A decode step can be captured as a CUDA
 * graph (graph_* ops): scratch taken during a capture stays the graph's.
 * Tested by tests/cuda/test_cuda_ops.c (host and device arguments, moved weights,
 * guards past every output) and test_cuda_golden (graphs against eager steps; its
 * "nan-scratch" run fills new scratch with NaN bytes). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "cuda_internal.cuh"
#include <cuda_profiler_api.h>

extern "C" {
#include "base/status.h"
}

/* ---- errors */

cudaStream_t cu_s;
static bool g_test_mode;
static ds_status g_status = DS_OK;
static bool g_capturing; /* a graph capture is in progress (cu_graph_begin) */
static char g_msg[512];

bool cu_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return true;
    if (g_status == DS_OK) {
        g_status = e == cudaErrorMemoryAllocation ? DS_ERR_NOMEM : DS_ERR_INTERNAL;
        snprintf(g_msg, sizeof g_msg, "cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
        if (!g_capturing) fprintf(stderr, "dsv3 %s\n", g_msg); /* a failed capture is undone and rerun */
    }
    return false;
}

extern "C" ds_status cuda_backend_status(void)
{
    ds_status s = g_status;
    if (s == DS_OK) return DS_OK;
    g_status = DS_OK;
    return ds_errorf(s, "%s", g_msg);
}

extern "C" int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

extern "C" void cuda_set_test_mode(bool on) { g_test_mode = on; }

/* ---- activation buffers: a pool of device blocks, ranges sorted by address */

typedef struct {
    char *p;
    size_t cap;
    bool free;
    bool graph; /* handed out during a graph capture: scratch of a recorded graph */
} blk;

static blk *g_blk;
static size_t g_nblk, g_capblk, g_pool_free_bytes;
#define POOL_KEEP ((size_t)8 << 30) /* freed bytes kept for reuse; beyond that, cudaFree */

/* Graphs (cu_graph_*): a recorded graph keeps the addresses its ops had at
 * capture, so while any graph exists no pool block and no staging arena is
 * given back to the driver, and blocks handed out during a capture are only
 * ever reused by later captures (graphs run one at a time on the stream), so
 * that no buffer living outside a graph aliases a graph's scratch. */
static int g_graphs;
static ds_status g_status_before_capture;

/* Index of the block holding p, or -1. */
static long blk_find(const void *p)
{
    size_t lo = 0, hi = g_nblk;
    const char *c = (const char *)p;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < g_blk[mid].p) hi = mid;
        else if (c >= g_blk[mid].p + g_blk[mid].cap) lo = mid + 1;
        else return (long)mid;
    }
    return -1;
}

static bool blk_insert(char *p, size_t cap)
{
    if (g_nblk == g_capblk) {
        size_t nc = g_capblk ? 2 * g_capblk : 256;
        blk *t = (blk *)realloc(g_blk, nc * sizeof *t);
        if (!t) return false;
        g_blk = t;
        g_capblk = nc;
    }
    size_t i = g_nblk;
    while (i > 0 && g_blk[i - 1].p > p) {
        g_blk[i] = g_blk[i - 1];
        i--;
    }
    g_blk[i].p = p;
    g_blk[i].cap = cap;
    g_blk[i].free = false;
    g_blk[i].graph = false;
    g_nblk++;
    return true;
}

static void blk_remove(size_t i)
{
    memmove(&g_blk[i], &g_blk[i + 1], (g_nblk - i - 1) * sizeof *g_blk);
    g_nblk--;
}

/* Releases every pooled free block (after the queued work that may use them). */
static void pool_trim(void)
{
    if (g_graphs || g_capturing) return;
    cudaStreamSynchronize(cu_s);
    for (size_t i = g_nblk; i-- > 0;)
        if (g_blk[i].free) {
            cudaFree(g_blk[i].p);
            g_pool_free_bytes -= g_blk[i].cap;
            blk_remove(i);
        }
}

void *cu_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = 256;
    if (g_test_mode) {
        if (cudaMallocManaged(&p, bytes, cudaMemAttachGlobal) != cudaSuccess) {
            cudaGetLastError();
            return NULL;
        }
        if (!cu_check(cudaMemset(p, 0, bytes), "alloc: memset") || !cu_check(cudaDeviceSynchronize(), "alloc")) {
            cudaFree(p);
            return NULL;
        }
        return p;
    }
    size_t best = (size_t)-1;
    for (size_t i = 0; i < g_nblk; i++)
        if (g_blk[i].free && g_blk[i].graph == g_capturing && g_blk[i].cap >= bytes && g_blk[i].cap <= 2 * bytes + 65536 &&
            (best == (size_t)-1 || g_blk[i].cap < g_blk[best].cap))
            best = i;
    if (best != (size_t)-1) {
        g_blk[best].free = false;
        g_pool_free_bytes -= g_blk[best].cap;
        p = g_blk[best].p;
    } else {
        size_t cap = (bytes + 4095) & ~(size_t)4095;
        /* alloc_max_mib (tests): a new block over that fails as on a full device */
        bool over = cu_tune.alloc_max_mib > 0 && cap > (size_t)cu_tune.alloc_max_mib << 20;
        if (over || cudaMalloc(&p, cap) != cudaSuccess) {
            cudaGetLastError();
            pool_trim();
            if (over || cudaMalloc(&p, cap) != cudaSuccess) {
                cudaGetLastError();
                size_t fr = 0, tot = 0;
                cudaMemGetInfo(&fr, &tot);
                char what[160];
                snprintf(what, sizeof what, "out of device memory allocating %.1f MiB (%.1f MiB free of %.1f MiB)",
                         cap / 1048576.0, fr / 1048576.0, tot / 1048576.0);
                cu_check(cudaErrorMemoryAllocation, what);
                return NULL;
            }
        }
        if (!blk_insert((char *)p, cap)) {
            cudaFree(p);
            return NULL;
        }
        best = (size_t)blk_find(p);
    }
    g_blk[best].graph = g_capturing;
    /* scratch_fill: 0 (default) left as it is: a memset node between two kernels of a
     * captured step costs more than most kernels and breaks their PDL overlap (batch-1
     * decode 2.97 -> 2.36 ms without them); 1 zeroed; -1 NaN bytes, so that a test shows
     * whether any reader relies on what it did not write */
    int z = cu_tune.scratch_fill;
    if (z && !cu_check(cudaMemsetAsync(p, z > 0 ? 0 : 0xff, bytes, cu_s), "alloc: memset")) return NULL;
    return p;
}

void *cu_alloc_zeroed(size_t bytes)
{
    void *p = cu_alloc(bytes);
    if (p && !g_test_mode && cu_tune.scratch_fill <= 0 &&
        !cu_check(cudaMemsetAsync(p, 0, bytes ? bytes : 256, cu_s), "alloc: memset"))
        return NULL;
    return p;
}

void cu_free(void *p)
{
    if (!p) return;
    long i = blk_find(p);
    if (i < 0 || g_blk[i].p != p) { /* managed (test mode) or foreign */
        cudaStreamSynchronize(cu_s);
        cu_check(cudaFree(p), "free");
        return;
    }
    if (g_pool_free_bytes + g_blk[i].cap > POOL_KEEP && !g_graphs && !g_capturing) {
        cudaStreamSynchronize(cu_s);
        cudaFree(p);
        blk_remove((size_t)i);
        return;
    }
    g_blk[i].free = true; /* reused by later ops on the same stream, after this one's readers */
    if (g_capturing) g_blk[i].graph = true; /* the recording uses it: graph scratch from now on */
    g_pool_free_bytes += g_blk[i].cap;
}

void cu_upload(void *dst, const void *src, size_t bytes)
{
    if (bytes) cu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cu_s), "upload");
    if (g_test_mode) cu_check(cudaStreamSynchronize(cu_s), "upload: synchronize");
}

void cu_download(void *dst, const void *src, size_t bytes)
{
    if (bytes) cu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cu_s), "download");
    cu_check(cudaStreamSynchronize(cu_s), "download: synchronize");
}

void cu_sync(void)
{
    cu_check(cudaGetLastError(), "launch");
    cu_check(cudaStreamSynchronize(cu_s), "synchronize");
}

void cu_zero(void *p, size_t bytes)
{
    if (bytes) cu_check(cudaMemsetAsync(p, 0, bytes, cu_s), "zero");
    if (g_test_mode) cu_check(cudaStreamSynchronize(cu_s), "zero: synchronize");
}

/* ---- staging */

static char *g_arena;
static size_t g_arena_cap, g_arena_used, g_arena_want;

bool cu_device_readable(const void *p)
{
    if (!p || blk_find(p) >= 0) return true;
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    /* cudaMemoryTypeHost (pinned) is left to staging: its device alias may differ. */
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static bool io_push(cu_io *io, void *dev, void *host, size_t bytes, bool back, bool owned)
{
    if (io->n == CU_IO_MAX) {
        cu_check(cudaErrorInvalidValue, "too many staged arguments in one op");
        io->failed = true;
        return false;
    }
    io->b[io->n].dev = dev;
    io->b[io->n].host = host;
    io->b[io->n].bytes = bytes;
    io->b[io->n].back = back;
    io->b[io->n].owned = owned;
    io->n++;
    return true;
}

void *cu_tmp(cu_io *io, size_t bytes)
{
    size_t need = (bytes + 255) & ~(size_t)255;
    if (need == 0) need = 256;
    g_arena_want += need;
    if (g_arena_used + need <= g_arena_cap) {
        void *p = g_arena + g_arena_used;
        g_arena_used += need;
        return p;
    }
    /* The arena is full for this op: a separate allocation now, a larger arena next time. */
    void *p = NULL;
    if (!cu_check(cudaMalloc(&p, need), "staging allocation")) {
        io->failed = true;
        return NULL;
    }
    if (!io_push(io, p, NULL, 0, false, true)) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

const void *cu_in(cu_io *io, const void *p, size_t bytes)
{
    if (!p || bytes == 0 || cu_device_readable(p)) return p;
    void *d = cu_tmp(io, bytes);
    if (!d) return NULL;
    io->host_io = true;
    if (!cu_check(cudaMemcpyAsync(d, p, bytes, cudaMemcpyHostToDevice, cu_s), "staging an argument")) {
        io->failed = true;
        return NULL;
    }
    return d;
}

void *cu_out(cu_io *io, void *p, size_t bytes, bool copy_in)
{
    if (!p || bytes == 0 || cu_device_readable(p)) return p;
    void *d = copy_in ? (void *)cu_in(io, p, bytes) : cu_tmp(io, bytes);
    if (!d) return NULL;
    io->host_io = true;
    if (!io_push(io, d, p, bytes, true, false)) return NULL;
    return d;
}

/* ---- per-op wall time (cuda_op_times). Each entry of the ops table is timed from its
 * call until the work it queued has finished (cuda_backend.cu wraps every entry in a
 * cu_op_scope): the outermost entry synchronises on the way in and on the way out, so
 * an op is charged for its own kernels and launch work only, never for work queued
 * before it, and the host's time between two ops is charged to a row of its own. */

#define OPT_MAX 64
#define OPT_HOST "(host, between ops)"
static bool g_optime;
static int g_opt_depth; /* table entries open now: only the outermost is timed */
static double g_opt_last;
static struct {
    const char *name;
    double s;
    long calls;
} g_opt[OPT_MAX];

/* Charges the time since the last mark to op. */
static void opt_mark(const char *op)
{
    cudaStreamSynchronize(cu_s);
    double t = ds_now();
    int i = 0;
    while (i < OPT_MAX && g_opt[i].name && strcmp(g_opt[i].name, op)) i++;
    if (i < OPT_MAX) {
        g_opt[i].name = op;
        g_opt[i].s += t - g_opt_last;
        g_opt[i].calls++;
    }
    g_opt_last = t;
}

bool cu_op_enter(void)
{
    if (!g_optime || g_capturing) return false;
    if (g_opt_depth++ == 0) opt_mark(OPT_HOST);
    return true;
}

void cu_op_leave(const char *op)
{
    if (--g_opt_depth == 0) opt_mark(op);
}

extern "C" void cuda_op_times(bool on)
{
    cudaStreamSynchronize(cu_s);
    if (on) memset(g_opt, 0, sizeof g_opt);
    g_optime = on;
    g_opt_depth = 0;
    g_opt_last = ds_now();
}

extern "C" void cuda_op_times_print(FILE *f)
{
    double tot = 0;
    for (int i = 0; i < OPT_MAX && g_opt[i].name; i++) tot += g_opt[i].s;
    fprintf(f, "%-24s %6s %9s %6s %9s\n", "op (synchronised)", "calls", "ms", "share", "us each");
    for (;;) {
        int b = -1;
        for (int i = 0; i < OPT_MAX && g_opt[i].name; i++)
            if (g_opt[i].calls > 0 && (b < 0 || g_opt[i].s > g_opt[b].s)) b = i;
        if (b < 0) break;
        fprintf(f, "%-24s %6ld %9.3f %5.1f%% %9.1f\n", g_opt[b].name, g_opt[b].calls, g_opt[b].s * 1e3,
                100 * g_opt[b].s / tot, g_opt[b].s / g_opt[b].calls * 1e6);
        g_opt[b].calls = -g_opt[b].calls;
    }
    for (int i = 0; i < OPT_MAX && g_opt[i].name; i++) g_opt[i].calls = -g_opt[i].calls;
    fprintf(f, "%-24s %6s %9.3f\n", "total", "", tot * 1e3);
}

void cu_end(cu_io *io, const char *op)
{
    char what[96];
    snprintf(what, sizeof what, "%s: launch", op);
    cu_check(cudaGetLastError(), what);
    /* Ops on device memory only are left queued; staged host arguments need the wait. */
    bool grow = g_arena_want > g_arena_cap;
    if (!g_test_mode && !io->host_io && !grow) { /* owned blocks imply grow */
        io->n = 0;
        g_arena_used = 0;
        g_arena_want = 0;
        return;
    }
    snprintf(what, sizeof what, "%s: synchronize", op);
    cu_check(cudaStreamSynchronize(cu_s), what);
    for (int i = 0; i < io->n; i++) {
        if (io->b[i].back && !io->failed) {
            snprintf(what, sizeof what, "%s: copying the result back", op);
            cu_check(cudaMemcpy(io->b[i].host, io->b[i].dev, io->b[i].bytes, cudaMemcpyDeviceToHost), what);
            cudaStreamSynchronize(cu_s);
        }
    }
    for (int i = 0; i < io->n; i++)
        if (io->b[i].owned) cudaFree(io->b[i].dev);
    io->n = 0;
    /* Grow the arena to what this op wanted, so the next op stages without cudaMalloc. */
    if (g_arena_want > g_arena_cap) {
        size_t cap = g_arena_want + g_arena_want / 2;
        if (!g_graphs && !g_capturing) cudaFree(g_arena); /* else a graph may use it: kept */
        g_arena = NULL;
        g_arena_cap = 0;
        if (cudaMalloc((void **)&g_arena, cap) == cudaSuccess) g_arena_cap = cap;
        else cudaGetLastError();
    }
    g_arena_used = 0;
    g_arena_want = 0;
}

/* ---- weight cache */

typedef struct {
    const void *key;          /* host w->data; NULL: empty slot */
    const float *scale_key;
    int fmt, rows, cols;
    uint64_t sig;
    void *data;
    float *scale;
    size_t bytes;
} wentry;

static wentry *g_w;
static size_t g_wcap, g_wcount, g_wbytes;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static size_t wdata_bytes(const ds_weight *w)
{
    size_t e = w->fmt == DS_W_F32 ? 4 : w->fmt == DS_W_BF16 ? 2 : 1;
    return (size_t)w->rows * w->cols * e;
}

static size_t wscale_count(const ds_weight *w)
{
    if (w->fmt != DS_W_FP8) return 0;
    return (size_t)((w->rows + DS_BLOCK - 1) / DS_BLOCK) * ((w->cols + DS_BLOCK - 1) / DS_BLOCK);
}

static uint64_t wsig(const ds_weight *w)
{
    size_t n = wdata_bytes(w), k = n < 256 ? n : 256;
    uint64_t h = fnv(0xcbf29ce484222325ull, w->data, k);
    h = fnv(h, (const uint8_t *)w->data + n - k, k);
    size_t ns = wscale_count(w);
    if (ns) h = fnv(h, w->scale, sizeof(float) * (ns < 16 ? ns : 16));
    return h;
}

static size_t slot_of(const void *key, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)key;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static bool wtable_grow(void)
{
    size_t cap = g_wcap ? g_wcap * 2 : 1024;
    wentry *t = (wentry *)calloc(cap, sizeof *t);
    if (!t) return false;
    for (size_t i = 0; i < g_wcap; i++) {
        if (!g_w[i].key) continue;
        size_t j = slot_of(g_w[i].key, cap);
        while (t[j].key) j = (j + 1) & (cap - 1);
        t[j] = g_w[i];
    }
    free(g_w);
    g_w = t;
    g_wcap = cap;
    return true;
}

static void wentry_release(wentry *e)
{
    cudaFree(e->data);
    cudaFree(e->scale);
    g_wbytes -= e->bytes;
    e->data = NULL;
    e->scale = NULL;
    e->bytes = 0;
}

static bool wentry_upload(wentry *e, const ds_weight *w, uint64_t sig)
{
    size_t nd = wdata_bytes(w), ns = wscale_count(w);
    e->key = w->data;
    e->scale_key = w->scale;
    e->fmt = (int)w->fmt;
    e->rows = w->rows;
    e->cols = w->cols;
    e->sig = sig;
    if (!cu_check(cudaMalloc(&e->data, nd ? nd : 16), "weight upload: allocation") ||
        !cu_check(cudaMemcpyAsync(e->data, w->data, nd, cudaMemcpyDefault, cu_s), "weight upload: copy"))
        return false;
    if (ns && (!cu_check(cudaMalloc((void **)&e->scale, ns * sizeof(float)), "weight upload: scale allocation") ||
               !cu_check(cudaMemcpyAsync(e->scale, w->scale, ns * sizeof(float), cudaMemcpyDefault, cu_s),
                         "weight upload: scale copy")))
        return false;
    e->bytes = nd + ns * sizeof(float);
    g_wbytes += e->bytes;
    return true;
}

bool cu_weight_get(const ds_weight *w, cu_weight *out)
{
    if (w->dev) {
        *out = *(const cu_weight *)w->dev;
        return true;
    }
    /* Weights already in device-readable memory are used in place. */
    if (cu_device_readable(w->data) && (w->fmt != DS_W_FP8 || cu_device_readable(w->scale))) {
        out->data = w->data;
        out->scale = w->fmt == DS_W_FP8 ? w->scale : NULL;
        return true;
    }
    if (g_wcount * 2 >= g_wcap && !wtable_grow()) return cu_check(cudaErrorMemoryAllocation, "weight table");
    uint64_t sig = wsig(w);
    size_t j = slot_of(w->data, g_wcap);
    while (g_w[j].key && g_w[j].key != w->data) j = (j + 1) & (g_wcap - 1);
    wentry *e = &g_w[j];
    if (e->key) {
        if (e->sig == sig && e->scale_key == w->scale && e->fmt == (int)w->fmt && e->rows == w->rows &&
            e->cols == w->cols && e->data) {
            out->data = e->data;
            out->scale = e->scale;
            return true;
        }
        wentry_release(e); /* same address, different weight: upload again */
    } else {
        g_wcount++;
    }
    if (!wentry_upload(e, w, sig)) {
        wentry_release(e);
        return false;
    }
    out->data = e->data;
    out->scale = e->scale;
    return true;
}

/* ---- weights uploaded at load: w->dev points to a cu_dweight */

typedef struct cu_dweight {
    cu_weight w; /* first: w->dev is read as a cu_weight */
    size_t bytes;
    ds_weight *owner;
    struct cu_dweight *next;
} cu_dweight;

static cu_dweight *g_dw;

ds_status cu_upload_weight(ds_weight *w)
{
    if (w->dev) return DS_OK;
    size_t nd = wdata_bytes(w), ns = wscale_count(w), off = (nd + 255) & ~(size_t)255;
    size_t bytes = off + ns * sizeof(float);
    cu_dweight *d = (cu_dweight *)calloc(1, sizeof *d);
    void *p = NULL;
    if (!d) return ds_errorf(DS_ERR_NOMEM, "out of host memory");
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) {
        cudaGetLastError();
        pool_trim();
        if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) {
            cudaGetLastError();
            free(d);
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            return ds_errorf(DS_ERR_NOMEM,
                             "cuda: out of device memory: a %dx%d weight needs %.1f MiB, %.1f MiB free of %.1f MiB "
                             "(%.2f GiB of weights already uploaded)",
                             w->rows, w->cols, bytes / 1048576.0, fr / 1048576.0, tot / 1048576.0,
                             g_wbytes / 1073741824.0);
        }
    }
    d->w.data = p;
    d->w.scale = ns ? (const float *)((char *)p + off) : NULL;
    d->bytes = bytes;
    d->owner = w;
    bool ok = cu_check(cudaMemcpyAsync(p, w->data, nd, cudaMemcpyDefault, cu_s), "weight upload") &&
              (!ns || cu_check(cudaMemcpyAsync((char *)p + off, w->scale, ns * sizeof(float), cudaMemcpyDefault, cu_s),
                               "weight upload: scales"));
    d->next = g_dw;
    g_dw = d;
    g_wbytes += bytes;
    w->dev = d;
    if (!ok) return cuda_backend_status();
    return DS_OK;
}

extern "C" void cuda_forget_weights(void)
{
    cudaStreamSynchronize(cu_s);
    cu_moe_forget();
    while (g_dw) {
        cu_dweight *d = g_dw;
        g_dw = d->next;
        cudaFree((void *)d->w.data);
        g_wbytes -= d->bytes;
        d->owner->dev = NULL;
        free(d);
    }
    for (size_t i = 0; i < g_wcap; i++)
        if (g_w[i].key) wentry_release(&g_w[i]);
    free(g_w);
    g_w = NULL;
    g_wcap = g_wcount = 0;
}

extern "C" size_t cuda_weight_bytes(void) { return g_wbytes; }

/* ---- graphs: the ops queued between cu_graph_begin and cu_graph_end are
 * recorded (CUDA stream capture) instead of run; cu_graph_run replays them. */

static void cu_graph_begin(void)
{
    g_status_before_capture = g_status;
    if (g_test_mode || g_capturing) return;
    if (cu_check(cudaStreamBeginCapture(cu_s, cudaStreamCaptureModeRelaxed), "graph: begin capture"))
        g_capturing = true;
}

/* The recorded graph, instantiated, or NULL when the capture failed (an op
 * that waits or copies from the host); its errors are then forgotten and the
 * caller runs the ops again without a graph. */
static void *cu_graph_end(void)
{
    if (!g_capturing) {
        g_status = g_status_before_capture;
        return NULL;
    }
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    cudaError_t e = cudaStreamEndCapture(cu_s, &g);
    g_capturing = false;
    if (e == cudaSuccess && g_status == g_status_before_capture)
        e = cudaGraphInstantiateWithFlags(&x, g, 0);
    else if (e == cudaSuccess)
        e = cudaErrorStreamCaptureInvalidated;
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        g_status = g_status_before_capture;
        if (!g_graphs)
            for (size_t i = 0; i < g_nblk; i++) g_blk[i].graph = false;
        return NULL;
    }
    g_graphs++;
    return x;
}

static void cu_graph_run(void *g)
{
    cu_check(cudaGraphLaunch((cudaGraphExec_t)g, cu_s), "graph: launch");
}

static void cu_graph_free(void *g)
{
    if (!g) return;
    cudaStreamSynchronize(cu_s);
    cudaGraphExecDestroy((cudaGraphExec_t)g);
    if (--g_graphs == 0) /* no recording left: its scratch is ordinary pool again */
        for (size_t i = 0; i < g_nblk; i++) g_blk[i].graph = false;
}

void cu_graph_ops(ds_ops *ops)
{
    ops->graph_begin = cu_graph_begin;
    ops->graph_end = cu_graph_end;
    ops->graph_run = cu_graph_run;
    ops->graph_free = cu_graph_free;
}

extern "C" void cuda_profile_range(bool on)
{
    cudaDeviceSynchronize();
    if (on) cudaProfilerStart();
    else cudaProfilerStop();
}
