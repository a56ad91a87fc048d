/* cuda_moe.cu - the MoE layer: the gate and routing (moe_gate, moe_route) and the
 * routed and shared experts (moe_experts).
 *
 * Decode (n <= MOE_GROUPED_MAX tokens): two launches read the routing choice (idx, wt;
 * n x K) on the device, so the layer never waits for the host and the step can be
 * captured in a CUDA graph. moe_up_warp_kernel computes h = silu(w1 x) * (w3 x) for
 * every (token, k) pair's expert rows and the shared experts' rows, warps walking 4-row
 * tiles with the next step's loads in flight; moe_down_pipe_kernel sums over k the w2
 * rows of each chosen expert against h, weighted by wt, plus the shared experts' w2,
 * one block per (token, 4 rows of dim), its (expert, chunk) items one or two ahead, in
 * a fixed order (deterministic, no atomics). At 2..8 tokens the pairs (up) and tokens
 * (down) vary fastest, so an expert chosen by several tokens is read from DRAM about
 * once (L2 serves the others). The routed experts' weights are loaded evict-first, so
 * that streaming them leaves the L2 lines of what other kernels started early. Experts
 * outside [e0, e0 + ne) (another rank's) are skipped. The experts' device addresses sit
 * in a per-layer table on the device, re-uploaded only when a weight moved.
 * Prefill: the routing is grouped per local expert on the device (moe_count_kernel,
 * moe_place_kernel: no download), the experts run as two grouped tensor-core launches
 * (cuda_grouped.cu), the shared experts merged into them as pseudo-experts where their
 * shapes allow, and one combine sums each token's rows in k order. Otherwise (weights
 * the grouped kernels refuse) the routing is downloaded and the experts run by grouped
 * cuBLAS (BF16) or one expert at a time.
 * The gate: one launch for gate product and routing at 1..8 tokens (a cluster of 8
 * blocks, or the last block routing), gate_tile_kernel for small gates past 8 tokens,
 * else a matmul and moe_route.
 * Tested by tests/cuda/test_cuda_ops.c (test_moe*, test_gates: every path against the
 * CPU backend's moe_experts, moe_gate and moe_route) and, in the model, by
 * test_cuda_golden. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <cooperative_groups.h>

#include "cuda_internal.cuh"

namespace cg = cooperative_groups;

#define MOE_GROUPED_MAX 8
#define MOE_RW 4      /* weight rows per block */
#define MOE_THREADS 128

/* ---- per-layer tables of expert weights (device addresses) */

typedef struct {
    const ds_weight *key; /* the layer's ew1 array */
    int ne;
    cu_weight *host;      /* [3][ne]: w1, w3, w2 */
    cu_weight *dev;
} moe_table;

static moe_table *g_tab;
static int g_ntab, g_captab;

/* Columns c0 .. of a weight with rows of `cols` columns (FP8: c0 a whole scale block). */
static cu_weight moe_weight_cols(cu_weight w, ds_wfmt f, int c0)
{
    w.data = (const uint8_t *)w.data + (size_t)c0 * (f == DS_W_FP8 ? 1 : 2);
    if (w.scale) w.scale += c0 / DS_BLOCK;
    return w;
}

/* Rows r0 .. of the same (FP8: r0 a whole scale block). */
static cu_weight moe_weight_rows(cu_weight w, ds_wfmt f, int r0, int cols)
{
    w.data = (const uint8_t *)w.data + (size_t)r0 * cols * (f == DS_W_FP8 ? 1 : 2);
    if (w.scale) w.scale += (size_t)(r0 / DS_BLOCK) * ((cols + DS_BLOCK - 1) / DS_BLOCK);
    return w;
}

/* The device table [3][ne + np] (w1, w3, w2) of experts ew1/ew3/ew2[0 .. ne), then, with
 * sh, the np pseudo-experts of the shared experts (np * inter rows of w1 and w3, as many
 * columns of w2; inter the routed experts' width) that moe_experts_dev runs among them:
 * pseudo-expert j is rows j * inter .. of sh's w1 and w3 and those columns of its w2.
 * NULL (error recorded) on failure. */
static const cu_weight *moe_table_get(const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int ne,
                                      const ds_mlp_w *sh, int np)
{
    int nt = ne + np;
    size_t bytes = sizeof(cu_weight) * 3 * (size_t)nt;
    cu_weight *now = (cu_weight *)malloc(bytes), s1, s3, s2;
    if (!now) return NULL;
    for (int e = 0; e < ne; e++)
        if (!cu_weight_get(&ew1[e], &now[e]) || !cu_weight_get(&ew3[e], &now[nt + e]) ||
            !cu_weight_get(&ew2[e], &now[2 * nt + e])) {
            free(now);
            return NULL;
        }
    if (np && !(cu_weight_get(sh->w1, &s1) && cu_weight_get(sh->w3, &s3) && cu_weight_get(sh->w2, &s2))) {
        free(now);
        return NULL;
    }
    for (int j = 0; j < np; j++) {
        int inter = ew1[0].rows, dim = ew1[0].cols;
        ds_wfmt f = ew1[0].fmt;
        now[ne + j] = moe_weight_rows(s1, f, j * inter, dim);
        now[nt + ne + j] = moe_weight_rows(s3, f, j * inter, dim);
        now[2 * nt + ne + j] = moe_weight_cols(s2, f, j * inter);
    }
    ne = nt;
    moe_table *t = NULL;
    for (int i = 0; i < g_ntab; i++)
        if (g_tab[i].key == ew1 && g_tab[i].ne == ne) t = &g_tab[i];
    if (t && !memcmp(t->host, now, bytes)) {
        free(now);
        return t->dev;
    }
    if (!t) {
        if (g_ntab == g_captab) {
            int cap = g_captab ? 2 * g_captab : 64;
            moe_table *nt = (moe_table *)realloc(g_tab, sizeof(moe_table) * (size_t)cap);
            if (!nt) {
                free(now);
                return NULL;
            }
            g_tab = nt;
            g_captab = cap;
        }
        t = &g_tab[g_ntab++];
        memset(t, 0, sizeof *t);
        t->key = ew1;
        t->ne = ne;
        if (!cu_check(cudaMalloc((void **)&t->dev, bytes), "moe_experts: expert table")) {
            t->dev = NULL;
            g_ntab--;
            free(now);
            return NULL;
        }
    }
    free(t->host);
    t->host = now;
    /* a synchronous copy: the host table may change before the stream reaches it */
    if (!cu_check(cudaMemcpy(t->dev, now, bytes, cudaMemcpyHostToDevice), "moe_experts: expert table")) return NULL;
    return t->dev;
}

void cu_moe_forget(void)
{
    for (int i = 0; i < g_ntab; i++) {
        cudaFree(g_tab[i].dev);
        free(g_tab[i].host);
    }
    free(g_tab);
    g_tab = NULL;
    g_ntab = g_captab = 0;
}

/* ---- grouped kernels */

/* acc[rr] += x[c .. c+E) . W[row rr][c .. c+E) for one 16-byte chunk of each of
 * MOE_RW rows (base[rr] = row * k), FP8 block scales applied per 16 elements. */
template <int F>
__device__ __forceinline__ void moe_dot_chunk(float *acc, const float *xv, const void *w, const float *ws,
                                              const size_t *base, const int *row, int k, int c, bool evf = false)
{
    constexpr int E = 16 / cu_wsize<F>::v;
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    uint4 raw[MOE_RW];
    #pragma unroll
    for (int rr = 0; rr < MOE_RW; rr++) {
        const uint4 *a = (const uint4 *)((const uint8_t *)w + (base[rr] + c) * cu_wsize<F>::v);
        raw[rr] = evf ? __ldcs(a) : *a; /* evf: streamed once, evict first */
    }
    #pragma unroll
    for (int rr = 0; rr < MOE_RW; rr++) {
        float wv[E];
        cu_wload16<F>(&raw[rr], 0, wv);
        float part = 0;
        #pragma unroll
        for (int e = 0; e < E; e++) part += xv[e] * wv[e];
        acc[rr] += F == DS_W_FP8 ? part * ws[(size_t)(row[rr] / DS_BLOCK) * kb + c / DS_BLOCK] : part;
    }
}

template <int E>
__device__ __forceinline__ void moe_xload(const float *x, float *xv)
{
    #pragma unroll
    for (int e = 0; e < E; e += 4) {
        float4 v = *(const float4 *)(x + e);
        xv[e] = v.x;
        xv[e + 1] = v.y;
        xv[e + 2] = v.z;
        xv[e + 3] = v.w;
    }
}

/* Sums NV per-thread values over a block of NW warps; thread rr < NV gets value rr. */
template <int NV, int NW = MOE_THREADS / 32>
__device__ __forceinline__ float moe_block_sum(const float *v, float (*red)[NV])
{
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    #pragma unroll
    for (int i = 0; i < NV; i++) {
        float s = cu_warp_sum(v[i]);
        if (lane == 0) red[warp][i] = s;
    }
    __syncthreads();
    float s = 0;
    if (threadIdx.x < NV)
        for (int w = 0; w < NW; w++) s += red[w][threadIdx.x];
    return s;
}

/* The shared experts of a decode step inside the grouped launches: their w1 / w3 rows as more blocks of moe_up, one "pair"
 * per token, and their w2 rows as more items of each moe_down block, weight 1.
 * Their weights do not depend on the routing, so those blocks start them towards
 * L2 before waiting for the previous kernel (PDL). inter == 0: none. */
typedef struct {
    cu_weight w1, w3, w2;
    int inter;
    float *h; /* [n][inter] */
} moe_shared_p;

/* out[r0 + rr] = silu(w1[r] . xr) * (w3[r] . xr) for the MOE_RW rows r = r0 + rr < rows. */
template <int F>
__device__ __forceinline__ void moe_up_tile(float *out, const float *xr, const cu_weight &w1, const cu_weight &w3,
                                            int k, int rows, int r0, bool evf)
{
    constexpr int E = 16 / cu_wsize<F>::v;
    __shared__ float red[MOE_THREADS / 32][2 * MOE_RW];
    size_t base[MOE_RW];
    int row[MOE_RW];
    #pragma unroll
    for (int rr = 0; rr < MOE_RW; rr++) {
        row[rr] = min(r0 + rr, rows - 1);
        base[rr] = (size_t)row[rr] * k;
    }
    float acc[2 * MOE_RW] = {};
    for (int c = threadIdx.x * E; c < k; c += MOE_THREADS * E) {
        float xv[E];
        moe_xload<E>(xr + c, xv);
        moe_dot_chunk<F>(acc, xv, w1.data, w1.scale, base, row, k, c, evf);
        moe_dot_chunk<F>(acc + MOE_RW, xv, w3.data, w3.scale, base, row, k, c, evf);
    }
    float s = moe_block_sum<2 * MOE_RW>(acc, red);
    __syncthreads();
    float *sh = &red[0][0];
    if (threadIdx.x < 2 * MOE_RW) sh[threadIdx.x] = s; /* red[0] is free again */
    __syncthreads();
    if (threadIdx.x < MOE_RW && r0 + threadIdx.x < rows) {
        float a = sh[threadIdx.x], g = sh[MOE_RW + threadIdx.x];
        out[r0 + threadIdx.x] = a / (1.0f + expf(-a)) * g;
    }
}

/* h[t*K + k][r] = silu(w1_e[r] . x[t]) * (w3_e[r] . x[t]), e = idx[t*K + k] - e0, and
 * sp.h[t][r] likewise for the shared experts. 1-D grid: n*K*tu routed blocks (tu row
 * tiles; pair fastest when swap, else tile fastest), then n*tus shared blocks. */
template <int F>
__global__ void __launch_bounds__(MOE_THREADS)
moe_up_kernel(float *__restrict__ h, const float *__restrict__ x, int n, int K, const int *__restrict__ idx, int e0,
              int ne, const cu_weight *__restrict__ tab, int k, int inter, bool swap, moe_shared_p sp, bool evf)
{
    unsigned b = blockIdx.x, nk = (unsigned)(n * K), tu = (unsigned)(inter + MOE_RW - 1) / MOE_RW;
    unsigned tus = (unsigned)(sp.inter + MOE_RW - 1) / MOE_RW;
    if (b >= nk * tu) { /* shared experts */
        b -= nk * tu;
        int t = (int)(swap ? b % n : b / tus), r0 = (int)(swap ? b / n : b % tus) * MOE_RW;
        cu_prefetch_l2((const uint8_t *)sp.w1.data + (size_t)r0 * k * cu_wsize<F>::v,
                       (size_t)min(MOE_RW, sp.inter - r0) * k * cu_wsize<F>::v);
        cu_prefetch_l2((const uint8_t *)sp.w3.data + (size_t)r0 * k * cu_wsize<F>::v,
                       (size_t)min(MOE_RW, sp.inter - r0) * k * cu_wsize<F>::v);
        cu_pdl_wait();
        cu_pdl_launch();
        moe_up_tile<F>(sp.h + (size_t)t * sp.inter, x + (size_t)t * k, sp.w1, sp.w3, k, sp.inter, r0, false);
        return;
    }
    cu_pdl_wait();
    cu_pdl_launch();
    int p = (int)(swap ? b % nk : b / tu), r0 = (int)(swap ? b / nk : b % tu) * MOE_RW, e = idx[p] - e0;
    if (e < 0 || e >= ne) return;
    moe_up_tile<F>(h + (size_t)p * inter, x + (size_t)(p / K) * k, tab[e], tab[ne + e], k, inter, r0, evf);
}

/* ---- the decode MoE kernels with their loads in flight ahead of the arithmetic. A
 * block of moe_up_kernel (above) does one 4-row tile and ends: for 16 KB of FP8 weights
 * it pays the routing lookups, a DRAM round trip and two block barriers, and at 80
 * registers 6 blocks fit an SM; a thread walking its (expert, chunk) items one dependent
 * load chain at a time streamed the FP8 MoE at ~1.8 TB/s, no faster than BF16 with twice
 * the bytes.
 *   moe_up_warp_kernel: a grid that fits on the GPU at once; each warp walks 4-row tiles
 *   (w1 and w3, so each chunk of x serves 8 weight chunks) in steps of one 16-byte chunk
 *   per lane and row, loading the next step (or the next tile's first) before computing
 *   the current one; a tile ends in warp sums, no block barrier.
 *   moe_down_pipe_kernel: moe_down's grid, each thread D items ahead; the shared
 *   expert's chunks come first, so a thread's first loads go out before the PDL wait. */
#define MW_THREADS 128

/* up: item i < n * tiles of the shared rows (token fastest), then the routed (row tile,
 * pair) items, pair fastest; a tile is MW_RW rows of w1 and the same rows of w3, so that
 * each chunk of x read serves 2 * MW_RW weight chunks. */
#define MW_RW 4
typedef struct {
    const uint8_t *w1, *w3; /* the matrices; NULL: another rank's expert (nothing to do) */
    const float *s1, *s3;   /* FP8 block scales */
    const float *x;
    float *out;             /* h row of the item's pair / token */
    int r0, rows;
} mw_up_item;

template <int RW = MW_RW>
__device__ __forceinline__ mw_up_item mw_up_at(int i, int nsh, const float *x, float *h, int n, int K,
                                               const int *idx, int e0, int ne, const cu_weight *tab, int k,
                                               int inter, const moe_shared_p &sp)
{
    mw_up_item m = {};
    const cu_weight *w1, *w3;
    if (i < nsh) {
        int t = (int)(i % n);
        m.r0 = (int)(i / n) * RW;
        m.rows = sp.inter;
        w1 = &sp.w1;
        w3 = &sp.w3;
        m.x = x + (size_t)t * k;
        m.out = sp.h + (size_t)t * sp.inter;
    } else {
        int j = i - nsh, nk = n * K;
        int p = (int)(j % nk), e = idx[p] - e0;
        m.r0 = (int)(j / nk) * RW;
        if (e < 0 || e >= ne) return m;
        m.rows = inter;
        w1 = &tab[e];
        w3 = &tab[ne + e];
        m.x = x + (size_t)(p / K) * k;
        m.out = h + (size_t)p * inter;
    }
    m.w1 = (const uint8_t *)w1->data;
    m.w3 = (const uint8_t *)w3->data;
    m.s1 = w1->scale;
    m.s3 = w3->scale;
    return m;
}

/* One lane's chunk j of the tile's rows: raw bytes of w1 and w3 (zero past the row's end)
 * and, for FP8, their block scales. */
template <int F>
__device__ __forceinline__ void mw_up_load(uint4 *r1, uint4 *r3, float *c1, float *c3, const mw_up_item &m, int j,
                                           int nch, int k, bool evf)
{
    constexpr int E = 16 / cu_wsize<F>::v;
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    #pragma unroll
    for (int rr = 0; rr < MW_RW; rr++) {
        int row = min(m.r0 + rr, m.rows - 1);
        r1[rr] = r3[rr] = make_uint4(0, 0, 0, 0);
        c1[rr] = c3[rr] = 0;
        if (j < nch) {
            size_t off = (size_t)row * k * cu_wsize<F>::v + (size_t)j * 16;
            const uint4 *a1 = (const uint4 *)(m.w1 + off), *a3 = (const uint4 *)(m.w3 + off);
            r1[rr] = evf ? __ldcs(a1) : *a1;
            r3[rr] = evf ? __ldcs(a3) : *a3;
            if (F == DS_W_FP8) {
                size_t si = (size_t)(row / DS_BLOCK) * kb + j * E / DS_BLOCK;
                c1[rr] = m.s1[si];
                c3[rr] = m.s3[si];
            }
        }
    }
}

/* A warp's walk over items it, it + W, ... < end of moe_up_warp_kernel, in steps of one
 * 16-byte chunk per lane and row, loading the next step (or the next item's first)
 * before computing the current. */
template <int F>
__device__ __forceinline__ void mw_up_walk(int it, int end, int W, int nsh, float *h, const float *x,
                                           int n, int K, const int *idx, int e0, int ne, const cu_weight *tab, int k,
                                           int inter, const moe_shared_p &sp, bool evf)
{
    constexpr int E = 16 / cu_wsize<F>::v;
    int lane = threadIdx.x % 32, nch = k / E, steps = (nch + 31) / 32;
    uint4 r1[MW_RW], r3[MW_RW], n1[MW_RW], n3[MW_RW];
    float c1[MW_RW], c3[MW_RW], d1[MW_RW], d3[MW_RW];
    mw_up_item cur = {}, nxt;
    if (it < end) {
        cur = mw_up_at(it, nsh, x, h, n, K, idx, e0, ne, tab, k, inter, sp);
        if (cur.w1) mw_up_load<F>(r1, r3, c1, c3, cur, lane, nch, k, evf && it >= nsh);
    }
    float a1[MW_RW] = {}, a3[MW_RW] = {};
    for (int step = 0; it < end;) {
        int nit = it;
        int nstep = step + 1;
        if (nstep == steps) {
            nit += W;
            nstep = 0;
        }
        nxt = cur;
        if (nit < end) {
            if (nstep == 0) nxt = mw_up_at(nit, nsh, x, h, n, K, idx, e0, ne, tab, k, inter, sp);
            if (nxt.w1) mw_up_load<F>(n1, n3, d1, d3, nxt, nstep * 32 + lane, nch, k, evf && nit >= nsh);
        }
        int j = step * 32 + lane;
        if (cur.w1 && j < nch) {
            float xv[E];
            moe_xload<E>(cur.x + (size_t)j * E, xv);
            #pragma unroll
            for (int rr = 0; rr < MW_RW; rr++) {
                float wv[E], s1 = 0, s3 = 0;
                cu_wload16<F>(&r1[rr], 0, wv);
                #pragma unroll
                for (int e = 0; e < E; e++) s1 += xv[e] * wv[e];
                cu_wload16<F>(&r3[rr], 0, wv);
                #pragma unroll
                for (int e = 0; e < E; e++) s3 += xv[e] * wv[e];
                a1[rr] += F == DS_W_FP8 ? s1 * c1[rr] : s1;
                a3[rr] += F == DS_W_FP8 ? s3 * c3[rr] : s3;
            }
        }
        if (step == steps - 1) {
            #pragma unroll
            for (int rr = 0; rr < MW_RW; rr++) {
                float g1 = cu_warp_sum(a1[rr]), g3 = cu_warp_sum(a3[rr]);
                if (lane == rr && cur.w1 && cur.r0 + rr < cur.rows) cur.out[cur.r0 + rr] = g1 / (1.0f + expf(-g1)) * g3;
                a1[rr] = a3[rr] = 0;
            }
        }
        it = nit;
        step = nstep;
        cur = nxt;
        #pragma unroll
        for (int rr = 0; rr < MW_RW; rr++) {
            r1[rr] = n1[rr];
            r3[rr] = n3[rr];
            c1[rr] = d1[rr];
            c3[rr] = d3[rr];
        }
    }
}

/* h as moe_up_kernel: silu(w1 x) * (w3 x) for every routed pair's rows and the shared rows.
 * early: the shared tiles depend on nothing that the routing
 * kernels write (x is the norm's, three launches back, complete once the routing kernel
 * has passed its own wait and let this one start), so they are computed whole before the
 * PDL wait, spread over every warp, while the routing runs; the routed tiles after it,
 * spread again (BF16 batch 1 2.173 -> 2.122 ms). Else (x written by the launch just
 * before) every tile waits. Letting the routing kernel release this one before its own
 * wait, so that the shared tiles overlap the gate product too, measured no better. */
template <int F, int MINB>
__global__ void __launch_bounds__(MW_THREADS, MINB)
moe_up_warp_kernel(float *__restrict__ h, const float *__restrict__ x, int n, int K, const int *__restrict__ idx,
                   int e0, int ne, const cu_weight *__restrict__ tab, int k, int inter, moe_shared_p sp, bool evf,
                   bool early, bool xsm)
{
    extern __shared__ float4 mw_xs[]; /* xsm: x (n x k) copied once per block */
    /* item counts are ints (moe_warp checks): 64-bit ones cost registers, and the FP8
     * kernel spills at its 128 */
    int tus = (sp.inter + MW_RW - 1) / MW_RW, tu = (inter + MW_RW - 1) / MW_RW;
    int nsh = n * tus, items = nsh + n * K * tu;
    int W = gridDim.x * (MW_THREADS / 32), it = blockIdx.x * (MW_THREADS / 32) + threadIdx.x / 32;
    /* phase 0 (early): the shared tiles; phase 1: the rest (every item when not early) */
    #pragma unroll 1
    for (int ph = early ? 0 : 1; ph < 2; ph++) {
        if (ph == 1) {
            cu_pdl_wait();
            cu_pdl_launch();
        }
        if (xsm && ph == (early ? 0 : 1)) { /* before the wait when x may be read there */
            const float4 *x4 = (const float4 *)x;
            for (int i = threadIdx.x; i < n * k / 4; i += MW_THREADS) mw_xs[i] = x4[i];
            __syncthreads();
            x = (const float *)mw_xs;
        }
        mw_up_walk<F>(ph == 0 || !early ? it : nsh + it, ph == 0 ? nsh : items, W, nsh, h, x, n, K, idx, e0, ne, tab, k,
                      inter, sp, evf);
    }
}

/* down with the old grid (a block per 4 rows of dim and token), but each thread loads
 * its next (expert, chunk) item before computing the current one, and the shared
 * expert's chunks come first, so that a thread's first load goes out before the wait. */
template <int F>
__device__ __forceinline__ bool mp_down_at(int it, int ns, int nch, int t, int K, const int *idx, int e0, int ne,
                                           const cu_weight *tab, const float *h, const float *wt, int inter,
                                           const moe_shared_p &sp, const int *row, bool evf, uint4 *raw, float *sc,
                                           const float **xp, float *wk)
{
    constexpr int E = 16 / cu_wsize<F>::v;
    cu_weight w;
    int c, k;
    if (it < ns) {
        c = it * E;
        w = sp.w2;
        k = sp.inter;
        *xp = sp.h + (size_t)t * sp.inter + c;
        *wk = 1.0f;
        evf = false;
    } else {
        int q = it - ns, kk = q / nch, p = t * K + kk, e = idx[p] - e0;
        if (e < 0 || e >= ne) return false;
        c = (q % nch) * E;
        w = tab[2 * ne + e];
        k = inter;
        *xp = h + (size_t)p * inter + c;
        *wk = wt[p];
    }
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    #pragma unroll
    for (int rr = 0; rr < MOE_RW; rr++) {
        const uint4 *a = (const uint4 *)((const uint8_t *)w.data + ((size_t)row[rr] * k + c) * cu_wsize<F>::v);
        raw[rr] = evf ? __ldcs(a) : *a;
        sc[rr] = F == DS_W_FP8 ? w.scale[(size_t)(row[rr] / DS_BLOCK) * kb + c / DS_BLOCK] : 1.0f;
    }
    return true;
}

template <int F, int D, int TH>
__global__ void __launch_bounds__(TH)
moe_down_pipe_kernel(float *__restrict__ y, const float *__restrict__ h, int K, const int *__restrict__ idx,
                     const float *__restrict__ wt, int e0, int ne, const cu_weight *__restrict__ tab, int inter,
                     int dim, bool swap, moe_shared_p sp, bool evf)
{
    constexpr int E = 16 / cu_wsize<F>::v;
    __shared__ float red[TH / 32][MOE_RW];
    int t = swap ? blockIdx.x : blockIdx.y, r0 = (swap ? blockIdx.y : blockIdx.x) * MOE_RW, nch = inter / E;
    int ns = sp.inter / E, total = ns + K * nch;
    int row[MOE_RW];
    #pragma unroll
    for (int rr = 0; rr < MOE_RW; rr++) row[rr] = min(r0 + rr, dim - 1);
    /* stage d holds item it + d * TH: D items in flight ahead of the one computed */
    uint4 raw[D + 1][MOE_RW];
    float sc[D + 1][MOE_RW], wk[D + 1];
    const float *xp[D + 1];
    bool v[D + 1];
    int it = threadIdx.x;
    #pragma unroll
    for (int d = 0; d < D; d++) {
        int i = it + d * TH;
        v[d] = i < ns && mp_down_at<F>(i, ns, nch, t, K, idx, e0, ne, tab, h, wt, inter, sp, row, evf, raw[d], sc[d],
                                       &xp[d], &wk[d]);
    }
    cu_pdl_wait();
    cu_pdl_launch();
    #pragma unroll
    for (int d = 0; d < D; d++) {
        int i = it + d * TH;
        if (i >= ns && i < total)
            v[d] = mp_down_at<F>(i, ns, nch, t, K, idx, e0, ne, tab, h, wt, inter, sp, row, evf, raw[d], sc[d], &xp[d],
                                 &wk[d]);
    }
    float acc[MOE_RW] = {};
    for (; it < total; it += TH) {
        int nit = it + D * TH;
        v[D] = nit < total && mp_down_at<F>(nit, ns, nch, t, K, idx, e0, ne, tab, h, wt, inter, sp, row, evf, raw[D],
                                            sc[D], &xp[D], &wk[D]);
        if (v[0]) {
            float xv[E];
            moe_xload<E>(xp[0], xv);
            #pragma unroll
            for (int rr = 0; rr < MOE_RW; rr++) {
                float wv[E], part = 0;
                cu_wload16<F>(&raw[0][rr], 0, wv);
                #pragma unroll
                for (int e = 0; e < E; e++) part += xv[e] * wv[e];
                acc[rr] += wk[0] * (part * sc[0][rr]);
            }
        }
        #pragma unroll
        for (int d = 0; d < D; d++) {
            v[d] = v[d + 1];
            xp[d] = xp[d + 1];
            wk[d] = wk[d + 1];
            #pragma unroll
            for (int rr = 0; rr < MOE_RW; rr++) {
                raw[d][rr] = raw[d + 1][rr];
                sc[d][rr] = sc[d + 1][rr];
            }
        }
    }
    float out = moe_block_sum<MOE_RW, TH / 32>(acc, red);
    if (threadIdx.x < MOE_RW && r0 + threadIdx.x < dim) y[(size_t)t * dim + r0 + threadIdx.x] = out;
}

/* The FP8 GEMM path (gemm_impl fp8) in the decode kernels: their inputs rounded as the
 * reference's act_quant would quantise them (cu_fake_quant): x before the up kernel, h
 * (and the shared experts' h) between up and down. */
typedef struct {
    bool on, ue8m0;
} moe_fq;

static void moe_fq_h(const moe_fq &q, float *h, int nk, int inter, const moe_shared_p &sp, int n)
{
    if (q.on) cu_fake_quant(h, h, nk, inter, sp.h, sp.h, sp.inter ? n : 0, sp.inter, q.ue8m0);
}

/* Blocks of a grid that fits on the device at once (per kernel, asked once), at most need. */
template <typename KF>
static unsigned mw_grid(KF kernel, int *cached, long need, size_t smem = 0)
{
    if (!*cached) {
        int dev = 0, sms = 0, per = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, MW_THREADS, smem);
        *cached = sms > 0 && per > 0 ? sms * per : 132;
    }
    return (unsigned)(need < *cached ? (need > 0 ? need : 1) : *cached);
}

template <int F>
static void moe_warp(float *y, const float *x, int n, int K, const int *idx, const float *wt, int e0, int ne,
                     const cu_weight *tab, int dim, int inter, float *h, const moe_shared_p &sp, moe_fq q)
{
    static int gu_max[MOE_GROUPED_MAX + 1]; /* [0]: x from L2; [n]: x in shared memory */
    const int wpb = MW_THREADS / 32;
    long up_items = (long)n * cu_blocks((size_t)sp.inter, MW_RW) + (long)n * K * cu_blocks((size_t)inter, MW_RW);
    /* x in shared memory (each block copies it once; 16-byte rows, 227 KB at most) for one
     * token with FP8 weights: FP8 batch 1 1.410 / 1.406 -> 1.402 / 1.395 ms; not BF16 (1.806 /
     * 1.806 -> 1.822 / 1.819) nor 8 tokens (64 KB a block, 3 blocks per SM instead of 4: FP8
     * 5.43 / 5.49 -> 5.80 / 5.70) */
    size_t xs_bytes = sizeof(float) * (size_t)n * dim;
    int xs_max = F == DS_W_FP8 ? 1 : 0;
    bool xsm = n <= xs_max && n <= MOE_GROUPED_MAX && dim % 4 == 0 && (uintptr_t)x % 16 == 0 &&
               xs_bytes <= 227 * 1024;
    if (xsm && xs_bytes > 48 * 1024) {
        static size_t allowed;
        if (xs_bytes > allowed) {
            if (!cu_check(cudaFuncSetAttribute(moe_up_warp_kernel<F, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)xs_bytes),
                          "moe_up: shared memory"))
                return;
            allowed = xs_bytes;
        }
    }
    unsigned gu = mw_grid(moe_up_warp_kernel<F, 4>, &gu_max[xsm ? n : 0], (up_items + wpb - 1) / wpb,
                          xsm ? xs_bytes : 0);
    const bool evf = true;
    unsigned tu = cu_blocks((size_t)inter, MOE_RW), td = cu_blocks((size_t)dim, MOE_RW);
    /* v bits: 1 moe_up by warps (moe_up_kernel, one 4-row tile a block, where its item
     * counts would pass an int), 2 moe_down one item ahead, 4 two ahead: two ahead at one
     * token only (it costs registers, and with them resident blocks, when the grid is n times
     * larger: FP8 batch 8 7.95 -> 8.15 ms). moe_up keeps 4 blocks per SM: the FP8 kernel
     * spills 20 bytes at that, but 3 blocks with the registers to spare measured slower (FP8
     * batch 1 1.885 -> 1.91 ms) */
    int v = 1 | (n == 1 ? 4 : 2);
    if (up_items + (long)gu * wpb > INT_MAX) v &= ~1;
    /* early reads x before its wait: not when the launch just before wrote it (q) */
    if (v & 1)
        cu_launch(moe_up_warp_kernel<F, 4>, dim3(gu), MW_THREADS, xsm ? xs_bytes : 0, h, x, n, K, idx, e0, ne, tab, dim,
                  inter, sp, evf, !q.on, xsm);
    else
        cu_launch(moe_up_kernel<F>, dim3((unsigned)(n * K) * tu + (unsigned)n * cu_blocks((size_t)sp.inter, MOE_RW)),
                  MOE_THREADS, 0, h, x, n, K, idx, e0, ne, tab, dim, inter, n > 1, sp, evf);
    moe_fq_h(q, h, n * K, inter, sp, n);
    dim3 gdb = n > 1 ? dim3((unsigned)n, td) : dim3(td, (unsigned)n);
    /* 128 threads a block for every format: BF16 batch 1 2.364 / 2.365 ms with 256 against
     * 2.323 / 2.324 with 128 */
    if (v & 4)
        cu_launch(moe_down_pipe_kernel<F, 2, MOE_THREADS>, gdb, MOE_THREADS, 0, y, h, K, idx, wt, e0, ne, tab, inter,
                  dim, n > 1, sp, evf);
    else
        cu_launch(moe_down_pipe_kernel<F, 1, MOE_THREADS>, gdb, MOE_THREADS, 0, y, h, K, idx, wt, e0, ne, tab, inter,
                  dim, n > 1, sp, evf);
}

/* True when the grouped kernels apply: few tokens, rows of whole 16-byte chunks
 * (on the FP8 GEMM path too, through moe_fq). */
static bool moe_grouped_ok(int n, const ds_weight *ew1, int ne)
{
    if (n > MOE_GROUPED_MAX || ne <= 0) return false;
    ds_wfmt f = ew1[0].fmt;
    int sz = f == DS_W_FP8 ? 1 : f == DS_W_BF16 ? 2 : 4;
    return (size_t)ew1[0].cols * sz % 16 == 0 && (size_t)ew1[0].rows * sz % 16 == 0 && ew1[0].cols % 4 == 0 &&
           ew1[0].rows % 4 == 0;
}

/* True when the shared experts can join the grouped kernels: the experts' format,
 * the same input width, rows of whole 16-byte chunks. */
static bool moe_shared_ok(const ds_mlp_w *sh, const ds_weight *ew1)
{
    const ds_weight *w1 = sh->w1, *w2 = sh->w2, *w3 = sh->w3;
    ds_wfmt f = ew1[0].fmt;
    int sz = f == DS_W_FP8 ? 1 : f == DS_W_BF16 ? 2 : 4;
    return w1->fmt == f && w2->fmt == f && w3->fmt == f &&
           w1->cols == ew1[0].cols && w3->cols == w1->cols && w3->rows == w1->rows && w2->cols == w1->rows &&
           w2->rows == w1->cols && (size_t)w1->rows * sz % 16 == 0 && w1->rows % 4 == 0;
}

/* The routed experts of n <= MOE_GROUPED_MAX tokens and, when sh is not NULL, the
 * shared experts, in the two grouped launches; false (nothing queued) when a weight
 * table could not be made. */
static bool moe_experts_grouped(float *y, const float *x, int n, int K, const int *idx, const float *wt,
                                const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int e0, int ne,
                                const ds_mlp_w *sh, moe_fq q)
{
    int dim = ew1[0].cols, inter = ew1[0].rows, nk = n * K;
    const cu_weight *tab = moe_table_get(ew1, ew2, ew3, ne, NULL, 0);
    if (!tab) return false;
    moe_shared_p sp = {};
    if (sh && !(cu_weight_get(sh->w1, &sp.w1) && cu_weight_get(sh->w3, &sp.w3) && cu_weight_get(sh->w2, &sp.w2)))
        return false;
    sp.inter = sh ? sh->w1->rows : 0;
    cu_io io = {};
    const float *dx = (const float *)cu_in(&io, x, sizeof(float) * (size_t)n * dim);
    const int *di = (const int *)cu_in(&io, idx, sizeof(int) * (size_t)nk);
    const float *dw = (const float *)cu_in(&io, wt, sizeof(float) * (size_t)nk);
    float *dy = (float *)cu_out(&io, y, sizeof(float) * (size_t)n * dim, false);
    float *h = (float *)cu_alloc(sizeof(float) * ((size_t)nk * inter + (size_t)n * sp.inter));
    float *fx = q.on ? (float *)cu_alloc(sizeof(float) * (size_t)n * dim) : NULL;
    if (dx && di && dw && dy && h && (fx || !q.on)) {
        sp.h = h + (size_t)nk * inter;
        if (q.on) { /* x as act_quant rounds it; the gate took it as it is */
            cu_fake_quant(fx, dx, n, dim, NULL, NULL, 0, 0, q.ue8m0);
            dx = fx;
        }
        if (ew1[0].fmt == DS_W_FP8) moe_warp<DS_W_FP8>(dy, dx, n, K, di, dw, e0, ne, tab, dim, inter, h, sp, q);
        else if (ew1[0].fmt == DS_W_BF16) moe_warp<DS_W_BF16>(dy, dx, n, K, di, dw, e0, ne, tab, dim, inter, h, sp, q);
        else moe_warp<DS_W_F32>(dy, dx, n, K, di, dw, e0, ne, tab, dim, inter, h, sp, q);
    }
    cu_free(h);
    cu_free(fx);
    cu_end(&io, "moe_experts");
    return true;
}

/* y += w2(silu(w1 x) * w3 x) for n rows (the shared experts where the grouped decode
 * kernels do not take them): at 16 tokens or more (a prefill, outside the FP8 GEMM
 * path) with FP8 weights on the grouped prefill kernels (BF16 ones by cuBLAS, which
 * runs their products faster), else one op at a time. */
static void moe_shared_add(float *y, const float *x, int n, const ds_mlp_w *sh, ds_gemm_impl gemm, bool ue8m0)
{
    int dim = sh->w1->cols, inter = sh->w1->rows;
    cu_weight c1, c3, c2;
    bool gr = sh->w1->fmt == DS_W_FP8;
    if (gr && n >= 16 && gemm == DS_GEMM_BF16 && cu_grouped_ok(sh->w1, sh->w2) && sh->w3->fmt == sh->w1->fmt &&
        sh->w3->rows == inter && sh->w3->cols == dim && cu_device_readable(x) && cu_device_readable(y) &&
        cu_weight_get(sh->w1, &c1) && cu_weight_get(sh->w3, &c3) && cu_weight_get(sh->w2, &c2)) {
        float *ys = (float *)cu_alloc(sizeof(float) * (size_t)n * dim);
        bool ok = ys && cu_grouped_mlp(ys, x, n, &c1, &c3, &c2, sh->w1->fmt, dim, inter);
        if (ok) cu_add(y, ys, (size_t)n * dim);
        cu_free(ys);
        if (ok) return;
    }
    float *a = (float *)cu_alloc(sizeof(float) * (size_t)n * inter), *g = (float *)cu_alloc(sizeof(float) * (size_t)n * inter);
    float *ys = (float *)cu_alloc(sizeof(float) * (size_t)n * dim);
    if (a && g && ys) {
        cu_matmul(a, x, n, sh->w1, 0, inter, gemm, ue8m0);
        cu_matmul(g, x, n, sh->w3, 0, inter, gemm, ue8m0);
        cu_silu_mul(a, g, (size_t)n * inter);
        cu_matmul(ys, a, n, sh->w2, 0, dim, gemm, ue8m0);
        cu_add(y, ys, (size_t)n * dim);
    } else {
        cu_check(cudaErrorMemoryAllocation, "moe_experts: shared expert scratch");
    }
    cu_free(a);
    cu_free(g);
    cu_free(ys);
}

/* acc += w v and acc += v, elementwise, for float and float4 */
__device__ __forceinline__ void mc_axpy(float &acc, float w, float v) { acc += w * v; }
__device__ __forceinline__ void mc_axpy(float4 &acc, float w, float4 v)
{
    acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
}
__device__ __forceinline__ void mc_add(float &acc, float v) { acc += v; }
__device__ __forceinline__ void mc_add(float4 &acc, float4 v) { acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w; }

/* y[t][j] = sum_k wt[t*K + k] * ys[at[t*K + k]][j] over the pairs with at >= 0 (local experts), in k order;
 * then, with np pseudo-experts of the shared experts (rows sh + (i n + t) * dim, i < np), plus their sum.
 * V: float, or float4 for four columns a thread (dim counted in V). Each round of MC_ROUND pairs
 * loads all its rows before the sums (one column a thread with one load in flight reached ~50%
 * of HBM's rate at 4096 tokens; four columns with the round 3.1 TB/s). */
#define MC_ROUND 8
template <typename V>
__global__ void moe_combine_kernel(V *__restrict__ y, const V *__restrict__ ys, const int *__restrict__ at,
                                   const float *__restrict__ wt, int K, int dim, const V *__restrict__ sh, int n,
                                   int np)
{
    cu_pdl_wait();
    cu_pdl_launch();
    int t = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= dim) return;
    V acc = {};
    for (int k0 = 0; k0 < K; k0 += MC_ROUND) {
        V v[MC_ROUND];
        float w[MC_ROUND];
        bool on[MC_ROUND];
        #pragma unroll
        for (int u = 0; u < MC_ROUND; u++) {
            int k = k0 + u, i = k < K ? at[t * K + k] : -1;
            on[u] = i >= 0;
            w[u] = on[u] ? wt[t * K + k] : 0.0f;
            v[u] = on[u] ? ys[(size_t)i * dim + j] : V{};
        }
        #pragma unroll
        for (int u = 0; u < MC_ROUND; u++)
            if (on[u]) mc_axpy(acc, w[u], v[u]);
    }
    if (np) {
        V z = sh[(size_t)t * dim + j];
        for (int i = 1; i < np; i++) mc_add(z, sh[((size_t)i * n + t) * dim + j]);
        mc_add(acc, z);
    }
    y[(size_t)t * dim + j] = acc;
}

/* moe_combine_kernel's sum of n tokens, four columns a thread where the rows allow it. */
static void moe_combine(float *y, const float *ys, const int *at, const float *wt, int K, int dim, const float *sh,
                        int n, int np)
{
    if (dim % 4 == 0 && (uintptr_t)y % 16 == 0 && (uintptr_t)ys % 16 == 0 &&
        (!sh || (uintptr_t)sh % 16 == 0))
        cu_launch(moe_combine_kernel<float4>, dim3(cu_blocks((size_t)dim / 4, 256), (unsigned)n), 256, 0, (float4 *)y,
                  (const float4 *)ys, at, wt, K, dim / 4, (const float4 *)sh, n, np);
    else
        cu_launch(moe_combine_kernel<float>, dim3(cu_blocks((size_t)dim, 256), (unsigned)n), 256, 0, y, ys, at, wt, K,
                  dim, sh, n, np);
}

/* Prefill with BF16 experts: all local experts' products in three grouped
 * cuBLAS calls over the tokens gathered in expert order (list: cnt[ne]
 * tokens, expert e's at cnt[e] ..), then one combine. False when cuBLAS
 * refuses (nothing written to y). */
static bool moe_experts_blas(float *y, const float *x, int n, int K, const float *wt, const ds_weight *ew1,
                             const ds_weight *ew2, const ds_weight *ew3, int ne, const int *cnt, const int *list,
                             const int *at)
{
    int dim = ew1[0].cols, inter = ew1[0].rows, total = cnt[ne], np = 0;
    if (total == 0) {
        cu_zero(y, sizeof(float) * (size_t)n * dim);
        return true;
    }
    int *off = (int *)malloc(sizeof(int) * 2 * (size_t)ne), *c = off ? off + ne : NULL;
    cu_weight *w = (cu_weight *)malloc(sizeof(cu_weight) * 3 * (size_t)ne);
    float *xs = (float *)cu_alloc(sizeof(float) * (size_t)total * dim), *ys = (float *)cu_alloc(sizeof(float) * (size_t)total * dim);
    float *a = (float *)cu_alloc(sizeof(float) * (size_t)total * inter), *g = (float *)cu_alloc(sizeof(float) * (size_t)total * inter);
    bool ok = off && w && xs && ys && a && g;
    for (int e = 0; ok && e < ne; e++) {
        if (cnt[e + 1] == cnt[e]) continue;
        off[np] = cnt[e];
        c[np] = cnt[e + 1] - cnt[e];
        ok = cu_weight_get(&ew1[e], &w[np]) && cu_weight_get(&ew3[e], &w[ne + np]) && cu_weight_get(&ew2[e], &w[2 * ne + np]);
        np++;
    }
    if (ok) {
        cu_copy_rows(xs, dim, NULL, x, dim, list, total, dim);
        ok = cu_blas_grouped(a, xs, total, off, c, w, np, dim, inter) &&
             cu_blas_grouped(g, xs, total, off, c, w + ne, np, dim, inter);
        if (ok) {
            cu_silu_mul(a, g, (size_t)total * inter);
            ok = cu_blas_grouped(ys, a, total, off, c, w + 2 * ne, np, inter, dim);
        }
        if (ok)
            moe_combine(y, ys, at, wt, K, dim, NULL, n, 0);
    }
    free(off);
    free(w);
    cu_free(xs);
    cu_free(ys);
    cu_free(a);
    cu_free(g);
    return ok;
}

/* ---- prefill's routing grouped per expert on the device:
 * what moe_experts_host builds on the host after downloading the routing, without the
 * download (the GPU idled while the host waited for it and built the lists, once per MoE
 * layer). Two launches over chunks of SORT_CHUNK pairs: moe_count_kernel counts each
 * chunk's pairs per local expert; moe_place_kernel then gives every chunk the sorted rows
 * from (the rows of earlier experts) + (this expert's rows in earlier chunks) on, and
 * each pair takes the next one of its expert; its block 0 also writes the tiles
 * (expert, first, end) of at most bm sorted rows (then empty ones up to mt). The order of
 * an expert's rows inside a chunk varies from run to run, but no result depends on it:
 * each sorted row's products are its own, and the combine sums each token's K rows in k
 * order. (Placing the pairs stably with one warp, 32 at a time, took 42-55 us per MoE
 * layer at 3072 pairs, a chain through shared memory; one block of 1024 threads 12.5 us
 * at 3072 pairs, 62 us at 24576.) list: [token of sorted row |
 * its weight (float bits) | sorted row of pair p, or -1 when p's expert is another
 * rank's]; *total: sorted rows. With np > 0 the tiles start with the shared experts' np
 * pseudo-experts (moe_experts_dev): ne + i over rows nk + i n .. of n tokens, w = ld,
 * their w2's row length. */
#define SORT_THREADS 256
#define SORT_CHUNK 1024

/* hist[c * ne + e]: the pairs of chunk c (the block) whose expert is local expert e */
__global__ void __launch_bounds__(SORT_THREADS) moe_count_kernel(int *__restrict__ hist, const int *__restrict__ idx,
                                                                 int nk, int e0, int ne)
{
    extern __shared__ int cnt[]; /* [ne] */
    cu_pdl_wait();
    cu_pdl_launch();
    for (int e = threadIdx.x; e < ne; e += SORT_THREADS) cnt[e] = 0;
    __syncthreads();
    int p1 = min((blockIdx.x + 1) * SORT_CHUNK, nk);
    for (int p = blockIdx.x * SORT_CHUNK + threadIdx.x; p < p1; p += SORT_THREADS) {
        int e = idx[p] - e0;
        if (e >= 0 && e < ne) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ne; e += SORT_THREADS) hist[(size_t)blockIdx.x * ne + e] = cnt[e];
}

/* v[0 .. m) -> its exclusive prefix sums, by one warp (each lane a run of m / 32);
 * returns the sum to every lane */
__device__ int sort_warp_scan(int *v, int m)
{
    int lane = threadIdx.x % 32, per = (m + 31) / 32, a = min(lane * per, m), z = min(a + per, m), s = 0;
    for (int i = a; i < z; i++) s += v[i];
    int inc = s;
    #pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(~0u, inc, o);
        if (lane >= o) inc += y;
    }
    for (int i = a, run = inc - s; i < z; i++) {
        int c = v[i];
        v[i] = run;
        run += c;
    }
    return __shfl_sync(~0u, inc, 31);
}

__global__ void __launch_bounds__(SORT_THREADS) moe_place_kernel(int *list, int4 *tiles, int *total,
                                                                 const int *__restrict__ hist, int nc,
                                                                 const int *__restrict__ idx,
                                                                 const float *__restrict__ wt, int nk, int K, int e0,
                                                                 int ne, int mt, int bm, int n, int np, int ld)
{
    extern __shared__ int sh[];
    int *off = sh, *first = sh + ne, *nt = sh + 2 * ne + 1; /* [ne], [ne + 1], [ne + 1] */
    cu_pdl_wait();
    cu_pdl_launch();
    int tid = threadIdx.x, c = blockIdx.x;
    for (int e = tid; e < ne; e += SORT_THREADS) {
        int sum = 0, before = 0;
        for (int j = 0; j < nc; j++) {
            if (j == c) before = sum;
            sum += hist[(size_t)j * ne + e];
        }
        off[e] = before;
        first[e] = sum;
    }
    __syncthreads();
    if (tid < 32) {
        int rows = sort_warp_scan(first, ne); /* first[e]: expert e's first sorted row */
        if (tid == 0) first[ne] = rows;
    }
    __syncthreads();
    for (int e = tid; e < ne; e += SORT_THREADS) off[e] += first[e];
    __syncthreads();
    int p1 = min((c + 1) * SORT_CHUNK, nk);
    for (int p = c * SORT_CHUNK + tid; p < p1; p += SORT_THREADS) {
        int e = idx[p] - e0, at = -1;
        if (e >= 0 && e < ne) {
            at = atomicAdd(&off[e], 1);
            list[at] = p / K;
            list[nk + at] = __float_as_int(wt[p]);
        }
        list[2 * nk + p] = at;
    }
    if (c) return;
    /* the tiles: the shared experts' pseudo-experts first (whole tiles, the longest):
     * expert ne + i, rows nk + i n .. of every token, w2 rows of ld */
    int pt = (n + bm - 1) / bm, ps = np * pt;
    for (int p = tid; p < ps; p += SORT_THREADS) {
        int i = p / pt, t = nk + i * n + p % pt * bm;
        tiles[p] = make_int4(ne + i, t, min(t + bm, nk + (i + 1) * n), ld);
    }
    tiles += ps;
    mt -= ps;
    for (int e = tid; e < ne; e += SORT_THREADS) nt[e] = (first[e + 1] - first[e] + bm - 1) / bm;
    __syncthreads();
    if (tid < 32) {
        int all = sort_warp_scan(nt, ne);
        if (tid == 0) {
            nt[ne] = all;
            *total = first[ne];
        }
    }
    __syncthreads();
    for (int e = tid; e < ne; e += SORT_THREADS)
        for (int t = first[e], i = nt[e]; t < first[e + 1]; t += bm) tiles[i++] = make_int4(e, t, min(t + bm, first[e + 1]), 0);
    for (int t = nt[ne] + tid; t < mt; t += SORT_THREADS) tiles[t] = make_int4(0, 0, 0, 0);
}

/* BF16 shared experts merge by default in passes of at most this many tokens. One H200,
 * 16B BF16, dsv3 bench tok/s apart / merged (two rounds): pp256 17.6k / 18.9k,
 * pp512 27.6k / 29.0k, pp1024 34.8k / 35.0-35.5k, pp2048 36.2-36.6k / 35.9-36.0k, pp3072
 * 35.6-35.8k / 35.1-35.3k, pp4096 34.9-35.0k / 34.4-34.5k. */
#define SHARED_MERGE_BF16_MAX 1024

/* How many pseudo-experts of the routed experts' width the shared experts sh of a
 * prefill of n tokens make in moe_experts_dev's launches (FP8 always, BF16 up to
 * SHARED_MERGE_BF16_MAX tokens); 0: they run apart. */
static int moe_shared_parts(const ds_mlp_w *sh, const ds_weight *ew1, bool q, int n)
{
    if (!sh || q || !cu_grouped_ld_ok()) return 0;
    const ds_weight *w1 = sh->w1, *w2 = sh->w2, *w3 = sh->w3;
    ds_wfmt f = ew1[0].fmt;
    int dim = ew1[0].cols, inter = ew1[0].rows, es = f == DS_W_FP8 ? 1 : 2;
    if (f != DS_W_FP8 && n > SHARED_MERGE_BF16_MAX) return 0;
    if (w1->fmt != f || w2->fmt != f || w3->fmt != f || w1->cols != dim || w3->cols != dim ||
        w3->rows != w1->rows || w2->rows != dim || w2->cols != w1->rows || w1->rows % inter != 0 ||
        (size_t)w2->cols * es % 16 != 0 || (f == DS_W_FP8 && inter % DS_BLOCK != 0))
        return 0;
    return w1->rows / inter;
}

/* The routed experts of a prefill on the tensor cores with the grouping done on the
 * device, and with them the shared experts sh where moe_shared_parts takes them
 * (*sh_done then true: y holds both); false (nothing queued) when the path does not
 * apply or scratch is short. */
static bool moe_experts_dev(float *y, const float *x, int n, int K, const int *idx, const float *wt,
                            const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int e0, int ne,
                            const ds_mlp_w *sh, bool *sh_done, ds_gemm_impl gemm, bool ue8m0)
{
    int dim = ew1[0].cols, inter = ew1[0].rows, nk = n * K, bm = cu_grouped_tile();
    /* the FP8 GEMM path (act_quant): on the FP8 tensor cores (the tuning's fp8_mma) */
    bool q = gemm == DS_GEMM_FP8 && ew1[0].fmt == DS_W_FP8;
    *sh_done = false;
    if (!cu_grouped_ok(ew1, ew2) || (q && !cu_tune.fp8_mma) ||
        !cu_device_readable(x) || !cu_device_readable(y) || !cu_device_readable(wt) || !cu_device_readable(idx))
        return false;
    int np = moe_shared_parts(sh, ew1, q, n);
    long mt = nk / bm + (ne < nk ? ne : nk) + 1 + (long)np * ((n + bm - 1) / bm);
    if (mt > 65535 && np) { /* grid.y: the shared experts apart */
        np = 0;
        mt = nk / bm + (ne < nk ? ne : nk) + 1;
    }
    if (mt > 65535) return false;
    const cu_weight *tab = moe_table_get(ew1, ew2, ew3, ne, sh, np);
    if (!tab) return false;
    size_t rows = (size_t)nk + (size_t)np * n; /* the sorted rows, then the pseudo-experts' */
    /* [3 nk: the list | total | the chunks' counts per expert] */
    int *dl = (int *)cu_alloc(sizeof(int) * (3 * (size_t)nk + 1 + (size_t)ne * cu_blocks((size_t)nk, SORT_CHUNK)));
    int4 *dt = (int4 *)cu_alloc(sizeof(int4) * (size_t)mt);
    float *ys = (float *)cu_alloc(sizeof(float) * rows * dim);
    bool ok = dl && dt && ys;
    if (ok) {
        int *total = dl + 3 * (size_t)nk, *hist = total + 1, ld = np ? sh->w2->cols : 0;
        unsigned nc = cu_blocks((size_t)nk, SORT_CHUNK);
        cu_launch(moe_count_kernel, nc, SORT_THREADS, sizeof(int) * (size_t)ne, hist, idx, nk, e0, ne);
        cu_launch(moe_place_kernel, nc, SORT_THREADS, sizeof(int) * (3 * (size_t)ne + 2), dl, dt, total, (const int *)hist,
                  (int)nc, idx, wt, nk, K, e0, ne, (int)mt, bm, n, np, ld);
        ok = cu_check(cudaGetLastError(), "moe_experts: grouping") &&
             (q ? cu_grouped_experts_q(ys, x, dl, dt, (int)mt, total, nk, ne, tab, dim, inter, ue8m0)
                : cu_grouped_experts_dev(ys, x, dl, dt, (int)mt, total, nk, ne + np, tab, ew1[0].fmt, dim, inter, n,
                                         np));
        if (ok)
            moe_combine(y, ys, (const int *)dl + 2 * nk, wt, K, dim, np ? ys + (size_t)nk * dim : NULL, n, np);
        ok = ok && cu_check(cudaGetLastError(), "moe_experts: combine");
        *sh_done = ok && np > 0;
    }
    cu_free(dl);
    cu_free(dt);
    cu_free(ys);
    return ok;
}

/* The routed experts when the grouped decode kernels do not apply: routing
 * downloaded, tokens grouped per expert on the host. */
static void moe_experts_host(float *y, const float *x, int n, int K, const int *idx, const float *wt,
                             const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int e0, int ne,
                             ds_gemm_impl gemm, bool ue8m0)
{
    int dim = ew1[0].cols, inter = ew1[0].rows, nk = n * K;
    int *hidx = (int *)malloc(sizeof(int) * (size_t)nk), *cnt = (int *)calloc((size_t)ne + 1, sizeof(int));
    float *hwt = (float *)malloc(sizeof(float) * (size_t)nk);
    /* [token list | weights as float bits | sorted position of pair (t, k) or -1] */
    int *hl = (int *)malloc(sizeof(int) * 3 * (size_t)nk);
    int *dl = (int *)cu_alloc(sizeof(int) * 3 * (size_t)nk);
    float *xs = (float *)cu_alloc(sizeof(float) * (size_t)n * dim), *ys = (float *)cu_alloc(sizeof(float) * (size_t)n * dim);
    float *a = (float *)cu_alloc(sizeof(float) * (size_t)n * inter), *g = (float *)cu_alloc(sizeof(float) * (size_t)n * inter);
    if (!hidx || !cnt || !hwt || !hl || !dl || !xs || !ys || !a || !g) {
        cu_check(cudaErrorMemoryAllocation, "moe_experts: scratch");
        goto done;
    }
    cu_download(hidx, idx, sizeof(int) * (size_t)nk);
    cu_download(hwt, wt, sizeof(float) * (size_t)nk);
    for (int i = 0; i < nk; i++)
        if (hidx[i] >= e0 && hidx[i] < e0 + ne) cnt[hidx[i] - e0 + 1]++;
    for (int e = 0; e < ne; e++) cnt[e + 1] += cnt[e];
    {
        int *fill = (int *)calloc((size_t)ne, sizeof(int));
        if (!fill) goto done;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++) {
                int e = hidx[(size_t)t * K + k] - e0;
                hl[2 * nk + t * K + k] = -1;
                if (e < 0 || e >= ne) continue;
                int at = cnt[e] + fill[e]++;
                hl[2 * nk + t * K + k] = at;
                hl[at] = t;
                memcpy(&hl[nk + at], &hwt[(size_t)t * K + k], sizeof(float));
            }
        free(fill);
    }
    cu_upload(dl, hl, sizeof(int) * 3 * (size_t)nk);
    if (cu_grouped_ok(ew1, ew2) && (ew1[0].fmt == DS_W_BF16 || gemm == DS_GEMM_BF16) &&
        cu_device_readable(x) && cu_device_readable(y) && cu_device_readable(wt)) {
        /* tensor cores (bf16 hi + lo activations, or bf16 once with gemm_bf16):
         * a gather, two grouped launches, then the combine in k order */
        const cu_weight *tab = moe_table_get(ew1, ew2, ew3, ne, NULL, 0);
        if (cnt[ne] == 0) {
            cu_zero(y, sizeof(float) * (size_t)n * dim);
            goto done;
        }
        float *ys2 = tab ? (float *)cu_alloc(sizeof(float) * (size_t)cnt[ne] * dim) : NULL;
        bool ok = ys2 && cu_grouped_experts(ys2, x, dl, cnt, ne, tab, ew1[0].fmt, dim, inter);
        if (ok)
            moe_combine(y, ys2, (const int *)dl + 2 * nk, wt, K, dim, NULL, n, 0);
        cu_free(ys2);
        if (ok) {
            cu_check(cudaGetLastError(), "moe_experts: combine");
            goto done;
        }
    }
    if (ew1[0].fmt == DS_W_BF16 && cu_device_readable(x) && cu_device_readable(y) && cu_device_readable(wt) &&
        moe_experts_blas(y, x, n, K, wt, ew1, ew2, ew3, ne, cnt, dl, dl + 2 * nk))
        goto done;
    cu_zero(y, sizeof(float) * (size_t)n * dim);
    for (int e = 0; e < ne; e++) {
        int c = cnt[e + 1] - cnt[e];
        if (!c) continue;
        const int *list = dl + cnt[e];
        const float *lw = (const float *)(dl + nk + cnt[e]);
        cu_copy_rows(xs, dim, NULL, x, dim, list, c, dim);
        cu_matmul(a, xs, c, &ew1[e], 0, inter, gemm, ue8m0);
        cu_matmul(g, xs, c, &ew3[e], 0, inter, gemm, ue8m0);
        cu_silu_mul(a, g, (size_t)c * inter);
        cu_matmul(ys, a, c, &ew2[e], 0, dim, gemm, ue8m0);
        cu_add_rows_scaled(y, list, ys, lw, c, dim);
    }
done:
    free(hidx);
    free(cnt);
    free(hwt);
    free(hl);
    cu_free(dl);
    cu_free(xs);
    cu_free(ys);
    cu_free(a);
    cu_free(g);
}

void cu_moe_experts(float *y, const float *x, int n, int K, const int *idx, const float *wt, const ds_weight *ew1,
                    const ds_weight *ew2, const ds_weight *ew3, int e0, int ne, const ds_mlp_w *shared,
                    ds_gemm_impl gemm, bool ue8m0)
{
    if (n <= 0) return;
    if (moe_grouped_ok(n, ew1, ne)) {
        bool fuse = shared && moe_shared_ok(shared, ew1);
        moe_fq q = {gemm == DS_GEMM_FP8 && ew1[0].fmt == DS_W_FP8, ue8m0};
        if (moe_experts_grouped(y, x, n, K, idx, wt, ew1, ew2, ew3, e0, ne, fuse ? shared : NULL, q)) {
            if (shared && !fuse) moe_shared_add(y, x, n, shared, gemm, ue8m0);
            return;
        }
    }
    bool sh_done = false;
    if (!moe_experts_dev(y, x, n, K, idx, wt, ew1, ew2, ew3, e0, ne, shared, &sh_done, gemm, ue8m0))
        moe_experts_host(y, x, n, K, idx, wt, ew1, ew2, ew3, e0, ne, gemm, ue8m0);
    if (shared && !sh_done) moe_shared_add(y, x, n, shared, gemm, ue8m0);
}

/* ---- the gate and the routing in one launch */

#define GATE_THREADS 128
#define GATE_NMAX 8
#define GATE_MAXE 1024 /* moe_route's limit */

/* acc[t] += the EL gate weights wv . columns c .. c + EL of token t's x, t < n (<= NT) */
template <int EL, int NT>
__device__ __forceinline__ void gate_acc(float *acc, const float *wv, const float *__restrict__ x, int n, int k, int c)
{
    #pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= n) break;
        float xv[EL];
        moe_xload<EL>(x + (size_t)t * k + c, xv);
        #pragma unroll
        for (int j = 0; j < EL; j++) acc[t] += xv[j] * wv[j];
    }
}

/* Block e: row e of the gate against every token (4 warps splitting K, 16-byte loads,
 * the row started towards L2 before the wait, as the gemv). The last block to finish
 * (ticket from a device counter, reset by that block) routes the tokens, a warp each. */
template <int F, int NT>
__global__ void __launch_bounds__(GATE_THREADS)
gate_route_kernel(int *idx, float *wt, float *sc, const float *__restrict__ x, int n, const void *__restrict__ w, int k,
                  int E, const float *__restrict__ bias, int K, int G, int limited, bool sigmoid, float rscale,
                  unsigned *counter)
{
    constexpr int EL = 16 / cu_wsize<F>::v;
    __shared__ float red[GATE_THREADS / 32][NT];
    __shared__ bool last;
    extern __shared__ float sm[];
    int e = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint8_t *row = (const uint8_t *)w + (size_t)e * k * cu_wsize<F>::v;
    cu_prefetch_lane_l2(row, (size_t)k * cu_wsize<F>::v, threadIdx.x, GATE_THREADS);
    cu_pdl_wait();
    cu_pdl_launch();
    float acc[NT] = {};
    for (int c = threadIdx.x * EL; c < k; c += GATE_THREADS * EL) {
        float wv[EL];
        cu_wload16<F>(w, (size_t)e * k + c, wv);
        gate_acc<EL, NT>(acc, wv, x, n, k, c);
    }
    #pragma unroll
    for (int i = 0; i < NT; i++) {
        float v = cu_warp_sum(acc[i]);
        if (lane == 0) red[warp][i] = v;
    }
    __syncthreads();
    if (threadIdx.x < n) {
        float v = 0;
        for (int wi = 0; wi < GATE_THREADS / 32; wi++) v += red[wi][threadIdx.x];
        sc[(size_t)threadIdx.x * E + e] = v;
    }
    __threadfence(); /* the scores before the ticket */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    if (threadIdx.x == 0) *counter = 0; /* ready for the next launch */
    __threadfence();
    for (int t = warp; t < n; t += GATE_THREADS / 32) {
        float *biased = sm + (size_t)warp * (2 * E + G);
        cu_route_warp(idx + (size_t)t * K, wt + (size_t)t * K, sc + (size_t)t * E, bias, biased, biased + E,
                      biased + 2 * E, E, K, G, limited, sigmoid, rscale);
    }
}

/* The gate and the routing in one cluster of GC_BLOCKS blocks (where the gate fits
 * their registers): warp w of block b takes gate row e = b * warps + w, its CH
 * 16-byte chunks per lane loaded into registers before the PDL wait (the gate is
 * constant). After the wait each warp's scores go straight into block 0's shared
 * memory; after the cluster barrier block 0's warps route the tokens from there.
 * gate_route_kernel's last block found itself by a device-wide fence and ticket, then
 * read the scores back from L2: 5.8 us a layer at batch 1 on the 16B model. */
#define GC_BLOCKS 8
#define GC_MAXW 16 /* warps per block at most: E <= GC_BLOCKS * GC_MAXW */
template <int F, int NT, int CH>
__global__ void __launch_bounds__(GC_MAXW * 32)
gate_cluster_kernel(int *idx, float *wt, float *sc, const float *__restrict__ x, int n, const void *__restrict__ w,
                    int k, int E, const float *__restrict__ bias, int K, int G, int limited, bool sigmoid,
                    float rscale)
{
    constexpr int EL = 16 / cu_wsize<F>::v;
    extern __shared__ float sm[]; /* block 0: scores [NT][E], then (E + G) floats per warp */
    cg::cluster_group cl = cg::this_cluster();
    int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int e = (int)blockIdx.x * warps + warp;
    bool has = e < E;
    uint4 wr[CH];
    #pragma unroll
    for (int u = 0; u < CH; u++) {
        int c = (lane + 32 * u) * EL;
        wr[u] = has && c < k ? *(const uint4 *)((const uint8_t *)w + ((size_t)e * k + c) * cu_wsize<F>::v)
                             : make_uint4(0, 0, 0, 0);
    }
    cu_cluster_arrive_relaxed();
    cu_pdl_wait();
    cu_pdl_launch();
    float acc[NT] = {};
    #pragma unroll
    for (int u = 0; u < CH; u++) {
        int c = (lane + 32 * u) * EL;
        if (c >= k) break;
        float wv[EL];
        cu_wload16<F>(&wr[u], 0, wv);
        gate_acc<EL, NT>(acc, wv, x, n, k, c);
    }
    #pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = cu_warp_sum(acc[t]);
    cu_cluster_wait(); /* every block has started: block 0's shared memory may be written */
    if (has && lane < n) {
        float v = 0;
        #pragma unroll
        for (int t = 0; t < NT; t++)
            if (t == lane) v = acc[t];
        cl.map_shared_rank(sm, 0)[lane * E + e] = v;
    }
    cl.sync();
    if (blockIdx.x != 0) return;
    float *scratch = sm + (size_t)NT * E + (size_t)warp * (E + G);
    for (int t = warp; t < n; t += warps)
        cu_route_warp<true>(idx + (size_t)t * K, wt + (size_t)t * K, sc + (size_t)t * E, bias, sm + (size_t)t * E,
                            scratch, scratch + E, E, K, G, limited, sigmoid, rscale);
}

/* gate_cluster_kernel for 1..8 tokens when the gate's rows fit its registers (false: not taken). */
template <int F>
static bool launch_gate_cluster(int *idx, float *wt, float *sc, const float *x, int n, const cu_weight *w, int k,
                                int E, const float *bias, int K, int G, int limited, bool sigmoid, float rscale)
{
    constexpr int EL = 16 / cu_wsize<F>::v;
    int warps = (E + GC_BLOCKS - 1) / GC_BLOCKS, ch = (k + 32 * EL - 1) / (32 * EL);
    if (warps > GC_MAXW || n > 8 || k % EL != 0 || ch > 16) return false;
    int nt = n == 1 ? 1 : n <= 4 ? 4 : 8;
    size_t smem = sizeof(float) * ((size_t)nt * E + (size_t)warps * (E + G));
    dim3 g(GC_BLOCKS), b((unsigned)warps * 32);
#define GC_GO(NT, CH) cu_launch_cluster(gate_cluster_kernel<F, NT, CH>, g, b, GC_BLOCKS, smem, idx, wt, sc, x, n, w->data, k, E, bias, K, G, limited, sigmoid, rscale)
    if (ch <= 8) {
        if (nt == 1) GC_GO(1, 8);
        else if (nt == 4) GC_GO(4, 8);
        else GC_GO(8, 8);
    } else {
        if (nt == 1) GC_GO(1, 16);
        else if (nt == 4) GC_GO(4, 16);
        else GC_GO(8, 16);
    }
#undef GC_GO
    return true;
}

/* Past 8 tokens (a prefill) a small gate on the CUDA cores: block b takes tokens 4 b .. 4 b + 3 against every expert, so
 * it can route them itself, a warp a token. Their x rows are copied to shared memory
 * once, each 32 EL-column chunk permuted so that a warp's 16-byte loads of one token
 * are contiguous (a lane's EL columns c .. c + EL - 1 sit at lane * 4 + q * 128 for
 * their q-th four). Each warp then walks four expert rows at a time, the lanes across
 * k with 16-byte weight loads (the next chunk's issued before the current one's
 * arithmetic), float32 sums. This replaces four launches of about 20 us a layer at
 * 512 tokens on the 16B model (the split of x into bf16 parts, two cuBLAS products,
 * the routing): the gate is 64 x 2048 there, a few us of float32 work. V3's 256 x
 * 7168 gate stays on the tensor cores. */
#define GT_THREADS 512
#define GT_MAXEK 262144 /* E x k at most */
#define GT_MAXSMEM 200704 /* bytes of dynamic shared memory at most */
#define GT_COPY 4 /* float4 of x a thread has in flight while copying */
#define GT_TOKENS 4 /* tokens a block */
/* tokens at most: past them the two cuBLAS launches are faster (FP8 16B, 26 layers:
 * 10.8 us a layer at 512 tokens against 19.7; 65.5 at 4096 against about 42) */
#define GT_MAXN 1024

template <int F>
__global__ void __launch_bounds__(GT_THREADS)
gate_tile_kernel(int *idx, float *wt, float *sc, const float *__restrict__ x, int n, const void *__restrict__ w,
                 int k, int ks, int E, const float *__restrict__ bias, int K, int G, int limited, bool sigmoid,
                 float rscale)
{
    constexpr int EL = 16 / cu_wsize<F>::v, CW = 32 * EL, WARPS = GT_THREADS / 32;
    extern __shared__ float sm[]; /* x [GT_TOKENS][ks] permuted, scores [GT_TOKENS][E], (E + G) a warp */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int t0 = (int)blockIdx.x * GT_TOKENS, nt = min(GT_TOKENS, n - t0);
    float *xs = sm, *ss = sm + (size_t)GT_TOKENS * ks, *scratch = ss + (size_t)GT_TOKENS * E + (size_t)warp * (E + G);
    size_t wbytes = (size_t)E * k * cu_wsize<F>::v, per = (wbytes + gridDim.x - 1) / gridDim.x;
    if ((size_t)blockIdx.x * per < wbytes)
        cu_prefetch_lane_l2((const uint8_t *)w + (size_t)blockIdx.x * per,
                            min(per, wbytes - (size_t)blockIdx.x * per), threadIdx.x, GT_THREADS);
    cu_pdl_wait();
    cu_pdl_launch();
    /* the copy: GT_COPY loads in flight a thread, then their stores */
    int k4 = k / 4;
    for (int i0 = threadIdx.x; i0 < GT_TOKENS * k4; i0 += GT_COPY * GT_THREADS) {
        float4 v[GT_COPY];
        #pragma unroll
        for (int j = 0; j < GT_COPY; j++) {
            int i = i0 + j * GT_THREADS, t = i / k4;
            v[j] = i < GT_TOKENS * k4 && t < nt ? *(const float4 *)(x + (size_t)(t0 + t) * k + (size_t)(i - t * k4) * 4)
                                         : make_float4(0, 0, 0, 0);
        }
        #pragma unroll
        for (int j = 0; j < GT_COPY; j++) {
            int i = i0 + j * GT_THREADS, t = i / k4, c = (i - t * k4) * 4, r = c % CW;
            if (i < GT_TOKENS * k4) *(float4 *)(xs + (size_t)t * ks + (c - r) + (r % EL) / 4 * 128 + r / EL * 4) = v[j];
        }
    }
    __syncthreads();
    for (int e0 = 4 * warp; e0 < E; e0 += 4 * WARPS) {
        float acc[4][GT_TOKENS] = {};
        uint4 raw[4]; /* this chunk's weights of the four rows; the next chunk's load goes out first */
        #pragma unroll
        for (int u = 0; u < 4; u++)
            raw[u] = e0 + u < E && lane * EL < k ? *(const uint4 *)((const uint8_t *)w + ((size_t)(e0 + u) * k + lane * EL) * cu_wsize<F>::v)
                                                 : make_uint4(0, 0, 0, 0);
        for (int c = lane * EL, cs = lane * 4; c < k; c += CW, cs += CW) {
            uint4 next[4];
            #pragma unroll
            for (int u = 0; u < 4; u++)
                next[u] = e0 + u < E && c + CW < k ? *(const uint4 *)((const uint8_t *)w + ((size_t)(e0 + u) * k + c + CW) * cu_wsize<F>::v)
                                                   : make_uint4(0, 0, 0, 0);
            float wv[4][EL];
            #pragma unroll
            for (int u = 0; u < 4; u++) cu_wload16<F>(&raw[u], 0, wv[u]);
            #pragma unroll
            for (int t = 0; t < GT_TOKENS; t++) {
                #pragma unroll
                for (int q = 0; q < EL / 4; q++) {
                    float4 v = *(const float4 *)(xs + (size_t)t * ks + cs + q * 128);
                    #pragma unroll
                    for (int u = 0; u < 4; u++) {
                        acc[u][t] = fmaf(v.x, wv[u][4 * q], acc[u][t]);
                        acc[u][t] = fmaf(v.y, wv[u][4 * q + 1], acc[u][t]);
                        acc[u][t] = fmaf(v.z, wv[u][4 * q + 2], acc[u][t]);
                        acc[u][t] = fmaf(v.w, wv[u][4 * q + 3], acc[u][t]);
                    }
                }
            }
            #pragma unroll
            for (int u = 0; u < 4; u++) raw[u] = next[u];
        }
        #pragma unroll
        for (int u = 0; u < 4; u++) {
            #pragma unroll
            for (int t = 0; t < GT_TOKENS; t++) {
                float v = cu_warp_sum(acc[u][t]);
                if (lane == 0 && e0 + u < E) ss[t * E + e0 + u] = v;
            }
        }
    }
    __syncthreads();
    for (int t = warp; t < nt; t += WARPS)
        cu_route_warp<true>(idx + (size_t)(t0 + t) * K, wt + (size_t)(t0 + t) * K, sc + (size_t)(t0 + t) * E, bias,
                            ss + (size_t)t * E, scratch, scratch + E, E, K, G, limited, sigmoid, rscale);
}

/* gate_tile_kernel for GATE_NMAX + 1 .. GT_MAXN tokens (false: not taken: too many
 * tokens, too large a gate, or its shared memory refused by the device). */
template <int F>
static bool launch_gate_tile(int *idx, float *wt, float *sc, const float *x, int n, const cu_weight *w, int k, int E,
                             const float *bias, int K, int G, int limited, bool sigmoid, float rscale)
{
    constexpr int EL = 16 / cu_wsize<F>::v, CW = 32 * EL;
    static size_t granted = 48 * 1024; /* shared memory a launch may ask */
    if (n <= GATE_NMAX || n > GT_MAXN || (size_t)E * k > GT_MAXEK || k % EL != 0) return false;
    int ks = (k + CW - 1) / CW * CW;
    size_t smem = sizeof(float) * ((size_t)GT_TOKENS * ks + (size_t)GT_TOKENS * E + (size_t)(GT_THREADS / 32) * (E + G));
    if (smem > GT_MAXSMEM) return false;
    if (smem > granted) {
        if (cudaFuncSetAttribute(gate_tile_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess) {
            cudaGetLastError(); /* a smaller GPU: the tensor-core path stays */
            return false;
        }
        granted = smem;
    }
    cu_launch(gate_tile_kernel<F>, dim3((unsigned)((n + GT_TOKENS - 1) / GT_TOKENS)), GT_THREADS, smem, idx, wt, sc, x,
              n, w->data, k, ks, E, bias, K, G, limited, sigmoid, rscale);
    return true;
}

/* One counter for every gate launch (they run one after another on the stream and each
 * leaves it at 0), made on the first call outside a stream capture; NULL until then. */
static unsigned *gate_counter(void)
{
    static unsigned *c;
    static bool failed;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (c || failed || cudaStreamIsCapturing(cu_s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return c;
    if (cudaMalloc((void **)&c, sizeof(unsigned)) != cudaSuccess || cudaMemset(c, 0, sizeof(unsigned)) != cudaSuccess) {
        cudaGetLastError(); /* not fatal: the two-launch path stays */
        cudaFree(c);
        c = NULL;
        failed = true;
    }
    return c;
}

template <int F>
static void launch_gate(int *idx, float *wt, float *sc, const float *x, int n, const cu_weight *w, int k, int E,
                        const float *bias, int K, int G, int limited, bool sigmoid, float rscale, unsigned *counter)
{
    size_t smem = sizeof(float) * (GATE_THREADS / 32) * (2 * (size_t)E + G);
    if (n == 1) cu_launch(gate_route_kernel<F, 1>, dim3((unsigned)E), GATE_THREADS, smem, idx, wt, sc, x, n, w->data, k, E, bias, K, G, limited, sigmoid, rscale, counter);
    else if (n <= 4) cu_launch(gate_route_kernel<F, 4>, dim3((unsigned)E), GATE_THREADS, smem, idx, wt, sc, x, n, w->data, k, E, bias, K, G, limited, sigmoid, rscale, counter);
    else cu_launch(gate_route_kernel<F, GATE_NMAX>, dim3((unsigned)E), GATE_THREADS, smem, idx, wt, sc, x, n, w->data, k, E, bias, K, G, limited, sigmoid, rscale, counter);
}

void cu_moe_gate(int *idx, float *wt, float *sc, const float *x, const ds_weight *gate, const float *bias, int n,
                 int K, int groups, int limited_groups, bool sigmoid, float route_scale)
{
    int E = gate->rows, k = gate->cols, sz = gate->fmt == DS_W_BF16 ? 2 : 4;
    bool one = n >= 1 && gate->fmt != DS_W_FP8 && (size_t)k * sz % 16 == 0 && E <= GATE_MAXE &&
               K <= 32 && K <= E && cu_device_readable(x) && cu_device_readable(sc) && cu_device_readable(idx) &&
               cu_device_readable(wt) && (!bias || cu_device_readable(bias)) && (uintptr_t)x % 16 == 0;
    bool fits = one && n <= GATE_NMAX;
    cu_weight dw;
    if (one && n > GATE_NMAX && cu_weight_get(gate, &dw) && (uintptr_t)dw.data % 16 == 0 &&
        (gate->fmt == DS_W_BF16
             ? launch_gate_tile<DS_W_BF16>(idx, wt, sc, x, n, &dw, k, E, bias, K, groups, limited_groups, sigmoid, route_scale)
             : launch_gate_tile<DS_W_F32>(idx, wt, sc, x, n, &dw, k, E, bias, K, groups, limited_groups, sigmoid, route_scale))) {
        cu_check(cudaGetLastError(), "moe_gate");
        return;
    }
    if (fits && cu_weight_get(gate, &dw) && (uintptr_t)dw.data % 16 == 0 &&
        (gate->fmt == DS_W_BF16
             ? launch_gate_cluster<DS_W_BF16>(idx, wt, sc, x, n, &dw, k, E, bias, K, groups, limited_groups, sigmoid, route_scale)
             : launch_gate_cluster<DS_W_F32>(idx, wt, sc, x, n, &dw, k, E, bias, K, groups, limited_groups, sigmoid, route_scale))) {
        cu_check(cudaGetLastError(), "moe_gate");
        return;
    }
    unsigned *counter = fits ? gate_counter() : NULL;
    if (counter && cu_weight_get(gate, &dw) && (uintptr_t)dw.data % 16 == 0) {
        if (gate->fmt == DS_W_BF16)
            launch_gate<DS_W_BF16>(idx, wt, sc, x, n, &dw, k, E, bias, K, groups, limited_groups, sigmoid, route_scale, counter);
        else
            launch_gate<DS_W_F32>(idx, wt, sc, x, n, &dw, k, E, bias, K, groups, limited_groups, sigmoid, route_scale, counter);
        cu_check(cudaGetLastError(), "moe_gate");
        return;
    }
    /* exact with gemm_bf16 too: on bf16 inputs near-tied experts swap (test_cuda_ops'
     * 20-token gate cases fail in that mode without it) */
    cu_gemm_force_split(true);
    cu_matmul(sc, x, n, gate, 0, E, DS_GEMM_BF16, false);
    cu_gemm_force_split(false);
    cu_moe_route(idx, wt, sc, bias, n, E, K, groups, limited_groups, sigmoid, route_scale);
}

/* ---- moe_route: one warp per token (profiled at 65 us per call with one thread doing
 * the top-k; now the lanes hold experts lane, lane + 32, ...). Softmax / sigmoid with warp
 * reductions, group scores one lane per group, then K rounds of a warp argmax over the
 * experts not taken (ties to the lowest index, as the reference's first strict maximum). */

#define ROUTE_MAXE 1024 /* 32 per lane: the taken set is one 32-bit mask per lane */

__global__ void __launch_bounds__(32) moe_route_kernel(int *idx, float *wt, float *sc_all, const float *__restrict__ bias,
                                                       int E, int K, int G, int limited, bool sigmoid, float rscale)
{
    extern __shared__ float sm[]; /* [E] biased scores, [E] probabilities, [G] group scores, [E] the bias */
    float *bs = bias ? sm + 2 * E + G : nullptr;
    if (bias) /* a weight: read before the wait, while the gate product drains */
        for (int e = threadIdx.x; e < E; e += 32) bs[e] = bias[e];
    cu_pdl_wait();
    cu_pdl_launch();
    __syncwarp();
    int t = blockIdx.x;
    cu_route_warp(idx + (size_t)t * K, wt + (size_t)t * K, sc_all + (size_t)t * E, bs, sm, sm + E, sm + 2 * E, E, K,
                  G, limited, sigmoid, rscale);
}

void cu_moe_route(int *idx, float *wt, float *sc, const float *bias, int n, int E, int K, int groups,
                         int limited_groups, bool sigmoid, float route_scale)
{
    if (n <= 0) return;
    cu_io io = {};
    float *dsc = (float *)cu_out(&io, sc, sizeof(float) * (size_t)n * E, true);
    int *di = (int *)cu_out(&io, idx, sizeof(int) * (size_t)n * K, false);
    float *dw = (float *)cu_out(&io, wt, sizeof(float) * (size_t)n * K, false);
    const float *db = (const float *)cu_in(&io, bias, sizeof(float) * (size_t)E);
    size_t smem = sizeof(float) * (2 * (size_t)E + groups + (bias ? E : 0));
    if (E > ROUTE_MAXE || K > 32 || K > E)
        cu_check(cudaErrorInvalidValue, "moe_route: more than 1024 experts, or more than 32 (or E) chosen");
    else if (dsc && di && dw && (db || !bias))
        cu_launch(moe_route_kernel, (unsigned)n, 32, smem, di, dw, dsc, db, E, K, groups, limited_groups, sigmoid,
                  route_scale);
    cu_end(&io, "moe_route");
}
