/* cuda_attend.cu - absorb attention whole in one launch (ds_ops.mla_attend, stage 12).
 *
 * At decode, absorb attention was four launches per layer: heads_t (q_c = q_nope W_k),
 * attn_hg, the split combine, and heads_vec (out = o_c W_v^T). Each waits for the one
 * before, and at short depth each is a few dependent L2 round trips. Here a thread
 * block cluster of AT_C blocks takes one (token, head). Block r of the cluster:
 *   1. multiplies its slice of the head's nope rows of wkv_b by q_nope, a partial q_c
 *      (R floats), and writes it into every block's shared memory;
 *   2. sums the cluster's partials into the whole q_c, then walks positions r,
 *      r + AT_C, ... <= pos[t] with an online softmax, one position per warp at a time,
 *      and writes its partial (max, sum, unnormalised o_c) into every block;
 *   3. merges the cluster's partials into o_c;
 *   4. multiplies o_c by its slice of the head's vdim rows of wkv_b.
 * Every sum runs in a fixed order, so every block of a cluster holds the same q_c and
 * o_c and the result does not depend on timing. The weights of steps 1 and 4 come into
 * shared memory before the PDL wait. Each head reads the whole cache, so this is for
 * short contexts: the launcher takes a problem only when a->pos_bound says so.
 * Session 12 (NOTES.md stage 18): the partials pushed to every block instead of each
 * block reading the others' (a round trip per read), the weights by cp.async instead of
 * registers (spilled), q_pe asked for with q_nope: 9.2 -> 6.8 us a kernel, FP8 batch 1
 * 1.43-1.47 -> 1.40-1.41 ms. */
#include <cooperative_groups.h>
#include <math.h>

#include "backend/cuda/cuda_internal.cuh"

namespace cg = cooperative_groups;

#define AT_C 8 /* blocks per (token, head) */
#define AT_WARPS 8
#define AT_THREADS (AT_WARPS * 32)
#define AT_RMAX 512  /* kv_rank: 128, 256 or 512 (PER = R / 32 latent values per lane) */
#define AT_ROPE 64   /* rope part at most (two values per lane) */
#define AT_PRE 4     /* 16-byte weight chunks per thread in registers before the wait, per step */

typedef struct {
    const float *q;            /* [n][H][qk]: q_nope is each head's first nope */
    const float *qp;           /* [n][H][rope], rotated */
    const float *kv, *pe;      /* caches [seq][ctx][R], [seq][ctx][rope] */
    const int *seq, *pos;
    const void *w;             /* wkv_b: H * (nope + vd) rows of R columns */
    const float *ws;           /* its FP8 block scales, else NULL */
    float *out;                /* [n][H][vd] */
    int H, qk, nope, rope, vd, R, ctx;
    float scale;
} at_p;

struct at_smem {
    float xq[AT_C][AT_RMAX];           /* step 1: each block's partial q_c (pushed by that block) */
    float bo[AT_C][AT_RMAX];           /* step 2: each block's unnormalised o_c (pushed) */
    float bm[AT_C], bl[AT_C];          /* step 2: each block's max and sum (pushed) */
    float qc[AT_RMAX];                 /* q_c, then o_c */
    float qpe[AT_ROPE];
    float wm[AT_WARPS], wl[AT_WARPS];  /* step 2: per-warp max and sum (then merge factors) */
    union {
        uint4 w1[AT_PRE][AT_THREADS];  /* step 1's weight chunks, each thread's own */
        float red[AT_WARPS * AT_RMAX]; /* step 1: partials per row group; step 2: per-warp o_c */
    };
    uint4 w4[AT_PRE][AT_THREADS];      /* step 4's weight chunks, each thread's own */
};

/* The FP8 scale of weight row wr at column c (1 for other formats). */
template <int F>
__device__ __forceinline__ float at_scale(const at_p &p, int wr, int c)
{
    if (F != DS_W_FP8) return 1.0f;
    int kb = (p.R + DS_BLOCK - 1) / DS_BLOCK;
    return p.ws[(size_t)(wr / DS_BLOCK) * kb + c / DS_BLOCK];
}

template <int F>
__device__ __forceinline__ const uint4 &at_chunk(const at_p &p, int wr, int c)
{
    return *(const uint4 *)((const uint8_t *)p.w + ((size_t)wr * p.R + c) * cu_wsize<F>::v);
}

/* This lane's part of oc . weight row wr: its chunks lane + 32 u (u < u4), from
 * registers (w, sc: U4 chunks and their scales) or, with w NULL, from memory. */
template <int F, int U4>
__device__ __forceinline__ float at_row_part(const float *oc, const uint4 *w, const float *sc, const at_p &p, int wr,
                                       int lane, int u4)
{
    constexpr int E = 16 / cu_wsize<F>::v;
    float a = 0;
    #pragma unroll
    for (int u = 0; u < U4; u++) {
        int c = (lane + 32 * u) * E;
        if (u >= u4 || c >= p.R) continue;
        float wv[E], part = 0;
        if (w) cu_wload16<F>(&w[u], 0, wv);
        else cu_wload16<F>(p.w, (size_t)wr * p.R + c, wv);
        #pragma unroll
        for (int e = 0; e < E; e++) part += oc[c + e] * wv[e];
        a += part * (w ? sc[u] : at_scale<F>(p, wr, c));
    }
    return a;
}

/* The end of a block's output rows (mla_attend's step 4, attend_merge_kernel): the warp
 * sums of its NR preloaded rows v0 + warp + W i (a[i]: this lane's parts), then the
 * block's other rows up to v1 from memory; output row jr is oc . weight row vrow + jr. */
template <int F, int U4, int NR, int W>
__device__ __forceinline__ void at_rows_out(const float *a, const float *oc, const at_p &p, int vrow, int v0, int v1,
                                            int warp, int lane, int u4, float *out)
{
    #pragma unroll
    for (int i = 0; i < NR; i++) {
        int jr = v0 + warp + W * i;
        float s = cu_warp_sum(a[i]);
        if (lane == 0 && jr < v1) out[jr] = s;
    }
    for (int jr = v0 + warp + W * NR; jr < v1; jr += W) {
        float b = cu_warp_sum(at_row_part<F, U4>(oc, NULL, NULL, p, vrow + jr, lane, u4));
        if (lane == 0) out[jr] = b;
    }
}

/* Two blocks per SM (registers capped at 128; 66 KB of shared memory each): with one,
 * fewer clusters of 8 fit on the GPU at once than the 16 of a 16-head layer, and FP8
 * batch 1 took 1.725 ms against 1.599 (stage 12). */
template <int F, int PER>
__global__ void __launch_bounds__(AT_THREADS, 2) mla_attend_kernel(at_p p)
{
    constexpr int E = 16 / cu_wsize<F>::v; /* columns per 16-byte chunk */
    extern __shared__ __align__(16) unsigned char at_raw[];
    at_smem &sm = *(at_smem *)at_raw;
    cg::cluster_group cluster = cg::this_cluster();
    cu_cluster_arrive_relaxed();
    const int R = PER * 32, nch = R / E, G = AT_THREADS / nch; /* chunks per row, row groups */
    int r = (int)cluster.block_rank(), h = blockIdx.x / AT_C, t = blockIdx.y;
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, hrow = h * (p.nope + p.vd);

    /* step 1's rows: d0 + g + G k (thread tid: chunk c1 = tid % nch, group g = tid / nch) */
    int ns = (p.nope + AT_C - 1) / AT_C, d0 = r * ns, d1 = min(p.nope, d0 + ns);
    int c1 = tid % nch, g = tid / nch;
    /* step 4's rows: v0 + warp + AT_WARPS k, chunks lane + 32 u */
    int vs = (p.vd + AT_C - 1) / AT_C, v0 = r * vs, v1 = min(p.vd, v0 + vs);
    constexpr int U4 = (AT_RMAX / E + 31) / 32; /* step 4: chunks per lane and row, at most */
    static_assert(AT_PRE % U4 == 0, "step 4 preloads whole rows");
    const int u4 = (nch + 31) / 32;
    /* the weight chunks go to shared memory by cp.async, each into a slot of the thread
     * that reads it (no barrier before use): in registers, the FP8 form spilled them,
     * and the spill stores waited for the loads (1.2 us before the wait) and each step-4
     * row reloaded them (0.8 us a row) */
    float s1[AT_PRE], s4[AT_PRE];
    #pragma unroll
    for (int k = 0; k < AT_PRE; k++) {
        int d = d0 + g + G * k;
        s1[k] = 0;
        if (d < d1) {
            cu_cp16(&sm.w1[k][tid], &at_chunk<F>(p, hrow + d, c1 * E), true);
            s1[k] = at_scale<F>(p, hrow + d, c1 * E);
        }
        int i = warp + AT_WARPS * (k / U4), u = k % U4, j = v0 + i, c = (lane + 32 * u) * E;
        s4[k] = 0;
        if (u < u4 && j < v1 && c < R) {
            cu_cp16(&sm.w4[k][tid], &at_chunk<F>(p, hrow + p.nope + j, c), true);
            s4[k] = at_scale<F>(p, hrow + p.nope + j, c);
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    cu_pdl_wait();
    cu_pdl_launch();

    /* ---- 1. partial q_c over this block's nope rows */
    const float *qn = p.q + ((size_t)t * p.H + h) * p.qk;
    /* q_pe (the prologue's) asked for now, so that its round trip overlaps q_nope's */
    float qpe = tid < p.rope ? p.qp[((size_t)t * p.H + h) * p.rope + tid] : 0.0f;
    float acc[E];
    #pragma unroll
    for (int e = 0; e < E; e++) acc[e] = 0;
    asm volatile("cp.async.wait_all;" ::: "memory");
    #pragma unroll
    for (int k = 0; k < AT_PRE; k++) {
        int d = d0 + g + G * k;
        if (d >= d1) break;
        float wv[E], f = qn[d] * s1[k];
        uint4 wk = sm.w1[k][tid];
        cu_wload16<F>(&wk, 0, wv);
        #pragma unroll
        for (int e = 0; e < E; e++) acc[e] += f * wv[e];
    }
    for (int d = d0 + g + G * AT_PRE; d < d1; d += G) {
        float wv[E], f = qn[d] * at_scale<F>(p, hrow + d, c1 * E);
        cu_wload16<F>(p.w, (size_t)(hrow + d) * R + c1 * E, wv);
        #pragma unroll
        for (int e = 0; e < E; e++) acc[e] += f * wv[e];
    }
    __syncthreads(); /* red overlays the step-1 chunks */
    #pragma unroll
    for (int e = 0; e < E; e++) sm.red[g * R + c1 * E + e] = acc[e];
    if (tid < p.rope) sm.qpe[tid] = qpe;
    __syncthreads();
    /* pushed into every block of the cluster (stores do not wait for an answer; the
     * barrier's release makes them visible): after it each block sums from its own
     * shared memory, where reading the others' took a round trip each */
    cu_cluster_wait();
    for (int i = tid; i < R; i += AT_THREADS) {
        float v = 0;
        for (int gi = 0; gi < G; gi++) v += sm.red[gi * R + i];
        #pragma unroll
        for (int b = 0; b < AT_C; b++) cluster.map_shared_rank(&sm.xq[r][0], b)[i] = v;
    }
    cluster.sync();

    /* ---- 2. the whole q_c, then this block's positions */
    for (int i = tid; i < R; i += AT_THREADS) {
        float v = 0;
        #pragma unroll
        for (int b = 0; b < AT_C; b++) v += sm.xq[b][i];
        sm.qc[i] = v;
    }
    __syncthreads();
    int len = p.pos[t] + 1;
    const float *kv = p.kv + (size_t)p.seq[t] * p.ctx * R, *pe = p.pe + (size_t)p.seq[t] * p.ctx * p.rope;
    bool e0 = lane < p.rope, e1 = lane + 32 < p.rope;
    float q[PER], qe0 = e0 ? sm.qpe[lane] : 0.0f, qe1 = e1 ? sm.qpe[lane + 32] : 0.0f;
    #pragma unroll
    for (int u = 0; u < PER; u++) q[u] = sm.qc[lane + 32 * u];
    float m = -INFINITY, l = 0, o[PER], cur[PER], nxt[PER], ce0 = 0, ce1 = 0, ne0 = 0, ne1 = 0;
    #pragma unroll
    for (int u = 0; u < PER; u++) o[u] = cur[u] = nxt[u] = 0;
    const int step = AT_C * AT_WARPS;
    int j = r + AT_C * warp;
    if (j < len) { /* one row ahead of the one in use */
        #pragma unroll
        for (int u = 0; u < PER; u++) cur[u] = kv[(size_t)j * R + lane + 32 * u];
        if (e0) ce0 = pe[(size_t)j * p.rope + lane];
        if (e1) ce1 = pe[(size_t)j * p.rope + lane + 32];
    }
    for (; j < len; j += step) {
        int jn = j + step;
        if (jn < len) {
            #pragma unroll
            for (int u = 0; u < PER; u++) nxt[u] = kv[(size_t)jn * R + lane + 32 * u];
            if (e0) ne0 = pe[(size_t)jn * p.rope + lane];
            if (e1) ne1 = pe[(size_t)jn * p.rope + lane + 32];
        }
        float a = qe0 * ce0 + qe1 * ce1;
        #pragma unroll
        for (int u = 0; u < PER; u++) a += q[u] * cur[u];
        float sc = cu_warp_sum(a) * p.scale, mn = fmaxf(m, sc), corr = expf(m - mn), ex = expf(sc - mn);
        l = l * corr + ex;
        #pragma unroll
        for (int u = 0; u < PER; u++) {
            o[u] = o[u] * corr + ex * cur[u];
            cur[u] = nxt[u];
        }
        m = mn;
        ce0 = ne0;
        ce1 = ne1;
    }
    #pragma unroll
    for (int u = 0; u < PER; u++) sm.red[warp * R + lane + 32 * u] = o[u];
    if (lane == 0) {
        sm.wm[warp] = m;
        sm.wl[warp] = l;
    }
    __syncthreads();
    if (warp == 0) { /* the block's max and sum; the warps' factors into wm */
        float wmv = lane < AT_WARPS ? sm.wm[lane] : -INFINITY, mx = cu_warp_max(wmv);
        float f = mx == -INFINITY || lane >= AT_WARPS ? 0.0f : expf(wmv - mx);
        float sum = cu_warp_sum(lane < AT_WARPS ? sm.wl[lane] * f : 0.0f);
        __syncwarp();
        if (lane < AT_WARPS) sm.wm[lane] = f;
        if (lane < AT_C) { /* lane b pushes them to block b */
            cluster.map_shared_rank(sm.bm, lane)[r] = mx;
            cluster.map_shared_rank(sm.bl, lane)[r] = sum;
        }
    }
    __syncthreads();
    for (int i = tid; i < R; i += AT_THREADS) {
        float v = 0;
        #pragma unroll
        for (int w = 0; w < AT_WARPS; w++)
            if (sm.wm[w] != 0.0f) v += sm.red[w * R + i] * sm.wm[w];
        #pragma unroll
        for (int b = 0; b < AT_C; b++) cluster.map_shared_rank(&sm.bo[r][0], b)[i] = v;
    }
    cluster.sync();

    /* ---- 3. o_c from the cluster's partials, all in this block's shared memory now
     * (position 0 is block 0's: the max is finite) */
    float f[AT_C], mx = -INFINITY, sum = 0;
    #pragma unroll
    for (int b = 0; b < AT_C; b++) mx = fmaxf(mx, sm.bm[b]);
    #pragma unroll
    for (int b = 0; b < AT_C; b++) {
        f[b] = sm.bm[b] == -INFINITY ? 0.0f : expf(sm.bm[b] - mx);
        sum += sm.bl[b] * f[b];
    }
    for (int i = tid; i < R; i += AT_THREADS) {
        float v = 0;
        #pragma unroll
        for (int b = 0; b < AT_C; b++)
            if (f[b] != 0.0f) v += sm.bo[b][i] * f[b];
        sm.qc[i] = v / sum;
    }
    __syncthreads(); /* no block touches another's shared memory after the second barrier */

    /* ---- 4. this block's rows of the output: the preloaded ones, then the rest */
    float *out = p.out + ((size_t)t * p.H + h) * p.vd;
    constexpr int NR = AT_PRE / U4; /* preloaded rows per warp: their sums side by side */
    float a[NR];
    #pragma unroll
    for (int i = 0; i < NR; i++) {
        int jr = v0 + warp + AT_WARPS * i;
        uint4 wr[U4];
        #pragma unroll
        for (int u = 0; u < U4; u++) wr[u] = sm.w4[i * U4 + u][tid];
        a[i] = jr < v1 ? at_row_part<F, U4>(sm.qc, wr, &s4[i * U4], p, hrow + p.nope + jr, lane, u4) : 0.0f;
    }
    at_rows_out<F, U4, NR, AT_WARPS>(a, sm.qc, p, hrow + p.nope, v0, v1, warp, lane, u4, out);
}

template <int F>
static void launch_attend(dim3 grid, const at_p &p)
{
    static bool ready; /* the shared memory above the 48 KB a launch gets unasked, once */
    const size_t smem = sizeof(at_smem);
    if (!ready)
        ready = cu_check(cudaFuncSetAttribute(mla_attend_kernel<F, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                         "mla_attend: shared memory") &&
                cu_check(cudaFuncSetAttribute(mla_attend_kernel<F, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                         "mla_attend: shared memory") &&
                cu_check(cudaFuncSetAttribute(mla_attend_kernel<F, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                         "mla_attend: shared memory");
    if (!ready) return;
    if (p.R == 128) cu_launch_cluster(mla_attend_kernel<F, 4>, grid, AT_THREADS, AT_C, smem, p);
    else if (p.R == 256) cu_launch_cluster(mla_attend_kernel<F, 8>, grid, AT_THREADS, AT_C, smem, p);
    else cu_launch_cluster(mla_attend_kernel<F, 16>, grid, AT_THREADS, AT_C, smem, p);
}

/* ---- the long form (session 22): deep in the cache the one-launch kernel's clusters
 * would each read the whole cache. There mla_attend runs q_c = q_nope W_k
 * (heads_t), attn_tc_kernel's splits over positions (cu_attention_parts) and then
 * attend_merge_kernel: a cluster of C blocks per (token, head), where block r merges
 * the splits' partials for columns [r R / C, (r + 1) R / C) of o_c (the same sums
 * as attn_combine2_kernel, in groups of splits added in a fixed order), pushes them into
 * every block's shared memory, and after the cluster barrier multiplies the whole o_c by
 * its slice of the head's vdim rows of wkv_b, whose first rows (16 / C each, up to 4) a
 * warp loaded before the PDL wait. That is the combine launch and heads_vec's in one.
 * C is 8, or DSV3_CUDA_ATTEND_C (2, 4 or 8). */
#define AM_WARPS 8
#define AM_THREADS (AM_WARPS * 32)
#define AM_ZPRE 32 /* a thread's first split partials, loaded before the factors are known */
#define AM_BATCH 8 /* then split partials a thread has in flight */

template <int F, int AM_C>
__global__ void __launch_bounds__(AM_THREADS) attend_merge_kernel(at_p p, cu_attn_parts q)
{
    constexpr int AM_PRE = 16 / AM_C < 4 ? 16 / AM_C : 4; /* rows per warp loaded before the wait */
    constexpr int E = 16 / cu_wsize<F>::v;
    constexpr int U4 = (AT_RMAX / E + 31) / 32;
    extern __shared__ float am_fz[]; /* [splits]: each split's factor */
    __shared__ __align__(16) float oc[AT_RMAX];
    __shared__ float part[AM_THREADS], red[2];
    cg::cluster_group cluster = cg::this_cluster();
    cu_cluster_arrive_relaxed();
    const int R = p.R, S = q.splits, nch = R / E, u4 = (nch + 31) / 32;
    int r = (int)cluster.block_rank(), h = blockIdx.x / AM_C, t = blockIdx.y;
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    size_t th = (size_t)t * p.H + h;
    int hrow = h * (p.nope + p.vd) + p.nope, vs = (p.vd + AM_C - 1) / AM_C, v0 = r * vs, v1 = min(p.vd, v0 + vs);
    uint4 w[AM_PRE][U4];
    float sc[AM_PRE][U4];
    #pragma unroll
    for (int i = 0; i < AM_PRE; i++) {
        int jr = v0 + warp + AM_WARPS * i;
        #pragma unroll
        for (int u = 0; u < U4; u++) {
            int c = (lane + 32 * u) * E;
            w[i][u] = make_uint4(0, 0, 0, 0);
            sc[i][u] = 0;
            if (jr < v1 && u < u4 && c < R) {
                w[i][u] = at_chunk<F>(p, hrow + jr, c);
                sc[i][u] = at_scale<F>(p, hrow + jr, c);
            }
        }
    }
    cu_pdl_wait();
    cu_pdl_launch();

    /* this block's columns: thread (zg, cl) sums the splits z = zg mod ZG of column c. Its
     * first AM_ZPRE partials are asked for now, with the maxima and sums below (a split
     * past the position has no partial: what is read there is never used) */
    const int cw = R / AM_C, ZG = AM_THREADS / cw, cl = tid % cw, zg = tid / cw, c = r * cw + cl;
    const float *po = q.po + th * S * R + c;
    float v0s[AM_ZPRE];
    #pragma unroll
    for (int k = 0; k < AM_ZPRE; k++) {
        int z = zg + ZG * k;
        v0s[k] = z < S ? po[(size_t)z * R] : 0.0f;
    }

    /* the splits' factors e^(pm_z - M) / sum_z pl_z e^(pm_z - M), M = max_z pm_z (each
     * block computes the same, in the same order) */
    cu_split_factors(am_fz, red, q.pm + th * S, q.pl + th * S, S);

    float acc = 0;
    #pragma unroll
    for (int k = 0; k < AM_ZPRE; k++) {
        int z = zg + ZG * k;
        float f = z < S ? am_fz[z] : 0.0f;
        if (f != 0.0f) acc += v0s[k] * f;
    }
    for (int z0 = zg + ZG * AM_ZPRE; z0 < S; z0 += ZG * AM_BATCH) {
        float f[AM_BATCH], v[AM_BATCH];
        #pragma unroll
        for (int k = 0; k < AM_BATCH; k++) {
            int z = z0 + ZG * k;
            f[k] = z < S ? am_fz[z] : 0.0f;
            v[k] = f[k] != 0.0f ? po[(size_t)z * R] : 0.0f;
        }
        #pragma unroll
        for (int k = 0; k < AM_BATCH; k++)
            if (f[k] != 0.0f) acc += v[k] * f[k];
    }
    part[tid] = acc;
    __syncthreads();
    cu_cluster_wait(); /* every block of the cluster has started: its shared memory is there */
    if (zg == 0) {
        float v = part[cl];
        for (int g = 1; g < ZG; g++) v += part[g * cw + cl];
        #pragma unroll
        for (int b = 0; b < AM_C; b++) cluster.map_shared_rank(oc, b)[c] = v;
    }
    cluster.sync();

    /* this block's rows of the output */
    float *out = p.out + th * p.vd;
    float a[AM_PRE];
    #pragma unroll
    for (int i = 0; i < AM_PRE; i++) {
        int jr = v0 + warp + AM_WARPS * i;
        a[i] = jr < v1 ? at_row_part<F, U4>(oc, w[i], sc[i], p, hrow + jr, lane, u4) : 0.0f;
    }
    at_rows_out<F, U4, AM_PRE, AM_WARPS>(a, oc, p, hrow, v0, v1, warp, lane, u4, out);
}

template <int F>
static void launch_merge(int n, int H, size_t smem, const at_p &p, const cu_attn_parts &parts)
{
    int c = cu_tune.attend_cluster == 2 || cu_tune.attend_cluster == 4 ? cu_tune.attend_cluster : 8;
    dim3 grid((unsigned)(H * c), (unsigned)n);
    if (c == 2) cu_launch_cluster(attend_merge_kernel<F, 2>, grid, AM_THREADS, 2, smem, p, parts);
    else if (c == 4) cu_launch_cluster(attend_merge_kernel<F, 4>, grid, AM_THREADS, 4, smem, p, parts);
    else cu_launch_cluster(attend_merge_kernel<F, 8>, grid, AM_THREADS, 8, smem, p, parts);
}

/* The long form (above) of a, which cu_mla_attend has checked for shapes; false when it
 * does not apply (nothing queued). */
static bool attend_long(const ds_attn_args *a, const ds_weight *wkv_b, const float *q, int qk)
{
    int n = a->n_tokens, H = a->n_heads, R = a->kv_rank, nope = a->nope, vd = a->vdim;
    if (n > cu_tune.attend_long || n > 8 || !cu_attention_parts_ok(a)) return false;
    size_t th = (size_t)n * H;
    cu_io io = {};
    cu_weight dw;
    at_p p = {};
    float *qc = (float *)cu_alloc(sizeof(float) * th * R);
    p.out = (float *)cu_out(&io, a->out, sizeof(float) * th * vd, false);
    p.H = H;
    p.nope = nope;
    p.vd = vd;
    p.R = R;
    if (!qc || !p.out || !cu_weight_get(wkv_b, &dw)) { /* nothing queued: the model's ops run instead */
        cu_free(qc);
        cu_end(&io, "mla_attend");
        return false;
    }
    p.w = dw.data;
    p.ws = dw.scale;
    cu_matmul_heads_t(qc, R, q, qk, n, H, wkv_b, 0, nope + vd, nope);
    ds_attn_args b = *a;
    b.q_c = qc;
    cu_attn_parts parts = {};
    size_t smem = 0;
    if (!cu_attention_parts(&b, &parts)) cu_check(cudaErrorMemoryAllocation, "mla_attend: split partials");
    else if ((smem = sizeof(float) * (size_t)parts.splits) > 48 * 1024) cu_check(cudaErrorInvalidValue, "mla_attend: too many splits");
    else if (wkv_b->fmt == DS_W_FP8) launch_merge<DS_W_FP8>(n, H, smem, p, parts);
    else if (wkv_b->fmt == DS_W_BF16) launch_merge<DS_W_BF16>(n, H, smem, p, parts);
    else launch_merge<DS_W_F32>(n, H, smem, p, parts);
    cu_free(parts.pm);
    cu_free(qc);
    cu_end(&io, "mla_attend");
    return true;
}

bool cu_mla_attend(const ds_attn_args *a, const ds_weight *wkv_b, const float *q, int qk)
{
    int n = a->n_tokens, H = a->n_heads, R = a->kv_rank, nope = a->nope, vd = a->vdim, rp = a->rope;
    /* a prefill pass: the expanded form where it pays (cuda_gemm.cu) */
    if (a->contiguous && cu_tune.expand_min != 0 && n >= abs(cu_tune.expand_min) && cu_mla_expanded(a, wkv_b, q, qk)) return true;
    /* the shapes the kernels take */
    if (n <= 0 || n > 65535 || H <= 0 || H > 65535 / AT_C || !(R == 128 || R == 256 || R == 512) || rp < 0 ||
        rp > AT_ROPE || nope <= 0 || vd <= 0 || qk < nope || wkv_b->cols != R || wkv_b->rows < H * (nope + vd) ||
        !(wkv_b->fmt == DS_W_FP8 || wkv_b->fmt == DS_W_BF16 || wkv_b->fmt == DS_W_F32))
        return false;
    /* the one-launch kernel at short contexts only (attend_max_pos: the largest pos_bound
     * taken, 0 never) and for few tokens (attend_max_tokens: the most); else the long form */
    bool deep = cu_tune.attend_max_pos <= 0 || a->pos_bound <= 0 || a->pos_bound > cu_tune.attend_max_pos;
    if (deep || n > cu_tune.attend_max_tokens) return deep && attend_long(a, wkv_b, q, qk);
    int nseq = 1; /* sizes the staging of host caches (tests) */
    if (!cu_device_readable(a->seq))
        for (int t = 0; t < n; t++) nseq = a->seq[t] + 1 > nseq ? a->seq[t] + 1 : nseq;
    size_t th = (size_t)n * H, rows = (size_t)nseq * a->ctx;
    cu_io io = {};
    cu_weight dw;
    at_p p = {};
    p.q = (const float *)cu_in(&io, q, sizeof(float) * th * qk);
    p.qp = (const float *)cu_in(&io, a->q_pe, sizeof(float) * th * rp);
    p.kv = (const float *)cu_in(&io, a->kv_cache, sizeof(float) * rows * R);
    p.pe = (const float *)cu_in(&io, a->pe_cache, sizeof(float) * rows * rp);
    p.seq = (const int *)cu_in(&io, a->seq, sizeof(int) * (size_t)n);
    p.pos = (const int *)cu_in(&io, a->pos, sizeof(int) * (size_t)n);
    p.out = (float *)cu_out(&io, a->out, sizeof(float) * th * vd, false);
    p.H = H;
    p.qk = qk;
    p.nope = nope;
    p.rope = rp;
    p.vd = vd;
    p.R = R;
    p.ctx = a->ctx;
    p.scale = a->softmax_scale;
    if (p.q && (p.qp || rp == 0) && p.kv && (p.pe || rp == 0) && p.seq && p.pos && p.out && cu_weight_get(wkv_b, &dw)) {
        p.w = dw.data;
        p.ws = dw.scale;
        dim3 grid((unsigned)(H * AT_C), (unsigned)n);
        if (wkv_b->fmt == DS_W_FP8) launch_attend<DS_W_FP8>(grid, p);
        else if (wkv_b->fmt == DS_W_BF16) launch_attend<DS_W_BF16>(grid, p);
        else launch_attend<DS_W_F32>(grid, p);
    }
    cu_end(&io, "mla_attend");
    return true;
}
