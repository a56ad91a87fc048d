/* cuda_attn_decode.cu - attention of decode steps (1..8 tokens, each at its own
 * position): ds_ops.attention's decode forms and ds_ops.mla_attend.
 *
 * ds_ops.attention, split over positions (flash-decoding: a split's running max, sum
 * and unnormalised output, merged by attn_combine_kernel) so that a few tokens still
 * fill the GPU; the splits depend on the shapes only, so a captured graph stays valid
 * as positions advance:
 *   attn_tc_kernel: the absorb form on the tensor cores (TF32 in three passes, ~22
 *     bits), 16 heads a block share each cache row; the default where shapes fit.
 *   attn_hg_kernel: the absorb form on the CUDA cores, 4 heads a block share each row.
 *   attn_kernel: any form (the naive one's per-head keys and values), a head a block.
 * mla_attend (the absorb form whole: q_c = q_nope W_k, attention, o_c W_v^T):
 *   short contexts (positions below the tuning's attend_max_pos): one cluster launch
 *     per step (mla_attend_kernel), a cluster of 8 blocks per (token, head);
 *   deeper: q_c by heads_t, attn_tc_kernel's splits, one cluster launch merging them
 *     and applying W_v (attend_merge_kernel).
 * Tested by tests/cuda/test_cuda_ops.c (test_attention*, test_attn_hg, test_mla_attend,
 * test_attend_long: against the CPU backend's attention and per-head products, at the
 * cache's ends, with empty splits, tc_tiles and attend_cluster varied) and by
 * test_cuda_golden (its "attend-long" run takes every decode step in the long form). */
#include <math.h>
#include <stdlib.h>

#include <cooperative_groups.h>

#include "cuda_internal.cuh"

namespace cg = cooperative_groups;

/* ---- attention */

#define ATTN_WARPS 4

typedef struct {
    const float *q1, *q2;          /* per (t, h): q1 + (t*H + h) * q1s, dims d1 and d2 */
    long long q1s, q2s;
    int d1, d2, dv;
    const float *k1, *k2, *v;      /* caches: + seq * _seq + pos * _pos + head * _head */
    long long k1_seq, k1_pos, k1_head, k2_seq, k2_pos, k2_head, v_seq, v_pos, v_head;
    const int *seq, *pos;
    int heads;
    float scale;
    float *out;                    /* + (t*H + h) * outs */
    long long outs;
    /* split over positions (flash-decoding): block z covers positions
     * [z * chunk, (z + 1) * chunk) and writes its running max, sum and
     * unnormalised outputs to pm, pl, po [(t*H + h) * splits + z] (po: dv each);
     * attn_combine_kernel merges them. splits == 1: out directly. A split
     * with no positions (j0 > pos[t]) writes pm = -inf, pl = 0 and no po row;
     * the merges never read po where pm == -inf. */
    int splits, chunk;
    float *pm, *pl, *po;
    bool direct; /* attn_hg_kernel, attn_tc_kernel: a token with pos < chunk is written by split 0, not merged */
    bool early;  /* attn_tc_kernel: one token, whose cache rows before pos were written by earlier
                  * passes: its first tile's loads go out before the PDL wait */
} attn_p;

#define COMBINE_ZG 4 /* split groups summed separately, then in order (attn_combine_kernel) */

/* PER value columns per lane: the block covers 32 * PER columns from blockIdx.y * 32 * PER.
 * Warp w takes positions j = w, w + ATTN_WARPS, ... (two or four positions a warp step,
 * their loads and reductions independent, measured slower: BF16 depth 4096 4.79 ms against
 * 5.78 and 5.37). */
template <int PER>
__global__ void __launch_bounds__(ATTN_WARPS * 32) attn_kernel(attn_p p)
{
    cu_pdl_wait();
    cu_pdl_launch();
    extern __shared__ float sm[];
    float *sq = sm;                               /* d1 + d2 */
    float *wm = sq + p.d1 + p.d2;                 /* per warp: max, sum */
    float *wl = wm + ATTN_WARPS;
    float *wo = wl + ATTN_WARPS;                  /* per warp: 32 * PER outputs */
    int th = blockIdx.x, t = th / p.heads, h = th % p.heads;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, c0 = blockIdx.y * 32 * PER;
    const float *q1 = p.q1 + (size_t)th * p.q1s, *q2 = p.q2 ? p.q2 + (size_t)th * p.q2s : nullptr;
    for (int c = threadIdx.x; c < p.d1; c += blockDim.x) sq[c] = q1[c];
    for (int c = threadIdx.x; c < p.d2; c += blockDim.x) sq[p.d1 + c] = q2[c];
    __syncthreads();
    int s = p.seq[t], len = p.pos[t] + 1, j0 = 0;
    if (p.splits > 1) {
        j0 = blockIdx.z * p.chunk;
        len = min(len, j0 + p.chunk);
    }
    const float *k1 = p.k1 + s * p.k1_seq + h * p.k1_head;
    const float *k2 = p.k2 ? p.k2 + s * p.k2_seq + h * p.k2_head : nullptr;
    const float *v = p.v + s * p.v_seq + h * p.v_head;
    float m = -INFINITY, l = 0, o[PER];
    #pragma unroll
    for (int u = 0; u < PER; u++) o[u] = 0;
    for (int j = j0 + warp; j < len; j += ATTN_WARPS) {
        const float *kq = k1 + j * p.k1_pos, *pq = k2 ? k2 + j * p.k2_pos : nullptr, *vq = v + j * p.v_pos;
        float d = 0;
        for (int c = lane; c < p.d1; c += 32) d += sq[c] * kq[c];
        if (k2)
            for (int c = lane; c < p.d2; c += 32) d += sq[p.d1 + c] * pq[c];
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
        d *= p.scale;
        float mn = fmaxf(m, d), corr = expf(m - mn), e = expf(d - mn);
        l = l * corr + e;
        #pragma unroll
        for (int u = 0; u < PER; u++) {
            int c = c0 + lane + 32 * u;
            o[u] = o[u] * corr + (c < p.dv ? e * vq[c] : 0.0f);
        }
        m = mn;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    #pragma unroll
    for (int u = 0; u < PER; u++) wo[warp * 32 * PER + lane + 32 * u] = o[u];
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < ATTN_WARPS; w++) mx = fmaxf(mx, wm[w]);
    float sum = 0;
    for (int w = 0; w < ATTN_WARPS; w++) sum += wl[w] * expf(wm[w] - mx);
    if (p.splits > 1) { /* partial result; an empty split has mx = -inf and contributes nothing */
        size_t ps = (size_t)th * p.splits + blockIdx.z;
        if (threadIdx.x == 0 && blockIdx.y == 0) {
            p.pm[ps] = mx;
            p.pl[ps] = mx == -INFINITY ? 0.0f : sum;
        }
        if (j0 < len) /* empty: no po row (its pm = -inf keeps the merges off it) */
            for (int c = threadIdx.x; c < 32 * PER; c += blockDim.x) {
                if (c0 + c >= p.dv) continue;
                float acc = 0;
                if (mx != -INFINITY)
                    for (int w = 0; w < ATTN_WARPS; w++) acc += wo[w * 32 * PER + c] * expf(wm[w] - mx);
                p.po[ps * p.dv + c0 + c] = acc;
            }
        return;
    }
    float *out = p.out + (size_t)th * p.outs;
    for (int c = threadIdx.x; c < 32 * PER; c += blockDim.x) {
        if (c0 + c >= p.dv) continue;
        float acc = 0;
        for (int w = 0; w < ATTN_WARPS; w++) acc += wo[w * 32 * PER + c] * expf(wm[w] - mx);
        out[c0 + c] = acc / sum;
    }
}

/* out[th][c] = sum_z po[th][z][c] e^(pm_z - M) / sum_z pl_z e^(pm_z - M), M = max_z pm_z;
 * block (t*H + h, 64-column slice), the per-split factors computed once into shared memory,
 * COMBINE_ZG groups of 64 threads each summing every COMBINE_ZG-th split, then added in a
 * fixed order (at depth 4096 one 64-thread group walked 65 splits serially, 13.6 us per
 * layer in ncu; depth 4096 decode 4.79 -> 4.71 ms BF16, 4.67 -> 4.58 FP8 with four) */
#define COMBINE_COLS 64
__global__ void __launch_bounds__(COMBINE_COLS * COMBINE_ZG) attn_combine_kernel(attn_p p)
{
    cu_pdl_wait();
    cu_pdl_launch();
    if (p.direct && p.pos[blockIdx.x / p.heads] < p.chunk) return; /* attn_hg_kernel wrote it */
    extern __shared__ float fz[];
    __shared__ float red[2];
    __shared__ float part[COMBINE_ZG][COMBINE_COLS];
    int th = blockIdx.x;
    cu_split_factors(fz, red, p.pm + (size_t)th * p.splits, p.pl + (size_t)th * p.splits, p.splits);
    int cl = threadIdx.x % COMBINE_COLS, zg = threadIdx.x / COMBINE_COLS, c = blockIdx.y * COMBINE_COLS + cl;
    float acc = 0;
    if (c < p.dv) {
        const float *po = p.po + (size_t)th * p.splits * p.dv + c;
        #pragma unroll 4
        for (int z = zg; z < p.splits; z += COMBINE_ZG)
            if (fz[z] != 0.0f) acc += po[(size_t)z * p.dv] * fz[z];
    }
    part[zg][cl] = acc;
    __syncthreads();
    if (zg == 0 && c < p.dv) {
        float s = part[0][cl];
        #pragma unroll
        for (int g = 1; g < COMBINE_ZG; g++) s += part[g][cl];
        p.out[(size_t)th * p.outs + c] = s;
    }
}

/* Decode attention in the absorb form, HG heads per block (attn_hg_kernel; the CUDA-core
 * form where attn_tc_kernel does not take the shapes, or the tuning's attn_tc is off):
 * every head reads the same cache rows, and a latent row is both the key (with its rope
 * part) and the value. So each warp loads a position's row once into registers (lane
 * holds columns lane + 32u, u < PER, dv = 32 * PER) and applies it to the HG heads'
 * queries (shared memory): scores, online softmax and value sums per head. attn_kernel
 * walks the rows per head and reads each twice (16 heads: 32 passes through L2 per layer).
 * Grid (tokens * ceil(H / HG), 1, splits); partials in attn_kernel's layout (pm, pl, po
 * per (t*H + h, split)), merged by the same combine kernels. */
#define ATTN_HG 4
#define HG_QB 8    /* attn_hg_kernel: query loads in flight per thread */
#define HG_DEPTH 2 /* attn_hg_kernel: cache rows a warp loads ahead of the one in use */
/* An attention kernel of ATTN_WARPS warps per block, its dynamic shared memory above the
 * 48 KB default allowed first. */
static void launch_smem(void (*kernel)(attn_p), dim3 grid, size_t smem, const attn_p &p)
{
    if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cu_launch(kernel, grid, ATTN_WARPS * 32, smem, p);
}

/* The combine of a split attention launch (nothing when p->splits is 1). */
static void launch_combine(const attn_p *p, int tokens)
{
    dim3 gc((unsigned)tokens * p->heads, cu_blocks((size_t)p->dv, COMBINE_COLS));
    if (p->splits > 1)
        cu_launch(attn_combine_kernel, gc, COMBINE_COLS * COMBINE_ZG, sizeof(float) * (size_t)p->splits, *p);
}

/* A lane's part of cache row j (when j < len): PER latent values and its one or two
 * rope values (r0, r1: lanes that hold them), else zeros for the rope part. */
template <int PER>
__device__ __forceinline__ void hg_row(float *r, float *e0, float *e1, const float *kv, const float *pe, int j, int len,
                                       const attn_p &p, int lane, bool r0, bool r1)
{
    *e0 = *e1 = 0;
    if (j >= len) return;
    const float *row = kv + j * p.k1_pos;
    #pragma unroll
    for (int u = 0; u < PER; u++) r[u] = row[lane + 32 * u];
    if (r0) *e0 = pe[j * p.k2_pos + lane];
    if (r1) *e1 = pe[j * p.k2_pos + lane + 32];
}

template <int PER>
__global__ void __launch_bounds__(ATTN_WARPS * 32) attn_hg_kernel(attn_p p)
{
    constexpr int HG = ATTN_HG, DV = 32 * PER, D = HG_DEPTH;
    extern __shared__ float sm[];
    int d = p.d1 + p.d2;
    float *sq = sm;                              /* [HG][d] queries */
    float *wm = sq + HG * d;                     /* [ATTN_WARPS][HG] running max */
    float *wl = wm + ATTN_WARPS * HG;            /* [ATTN_WARPS][HG] running sum */
    float *wo = wl + ATTN_WARPS * HG;            /* [ATTN_WARPS][HG][DV] outputs */
    int groups = (p.heads + HG - 1) / HG, t = blockIdx.x / groups, h0 = blockIdx.x % groups * HG;
    int nh = min(HG, p.heads - h0), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    /* seq and pos are the pass's inputs, never a kernel's output, and the cache rows
     * before pos[t] were written by earlier passes: the split's rows start towards L2
     * (the coherent level) while the previous kernels run (PDL) */
    int s = p.seq[t], len = p.pos[t] + 1, j0 = 0;
    if (p.splits > 1) {
        j0 = blockIdx.z * p.chunk;
        len = min(len, j0 + p.chunk);
    }
    cu_pdl_wait();
    cu_pdl_launch();
    /* direct: every position of the token lies in split 0 (pos < chunk, short depth), which
     * then writes the output itself and the combine kernels skip the token */
    bool direct = p.direct && p.pos[t] < p.chunk;
    if (p.splits > 1) {
        if (j0 >= len) { /* past the token's position (most splits at short depth): only pm = -inf */
            if (direct) return;
            if (threadIdx.x < nh) {
                size_t ps = ((size_t)t * p.heads + h0 + threadIdx.x) * p.splits + blockIdx.z;
                p.pm[ps] = -INFINITY;
                p.pl[ps] = 0.0f;
            }
            return;
        }
    }
    /* the queries, HG_QB loads in flight per thread (one at a time, the chain of
     * dependent L2 round trips was most of a short-depth launch) */
    for (int i0 = threadIdx.x; i0 < HG * d; i0 += HG_QB * blockDim.x) {
        float qv[HG_QB];
        #pragma unroll
        for (int u = 0; u < HG_QB; u++) {
            int i = i0 + u * blockDim.x, g = i / d, c = i % d;
            size_t th = (size_t)t * p.heads + h0 + g;
            qv[u] = i >= HG * d || g >= nh ? 0.0f : c < p.d1 ? p.q1[th * p.q1s + c] : p.q2[th * p.q2s + c - p.d1];
        }
        #pragma unroll
        for (int u = 0; u < HG_QB; u++)
            if (i0 + u * blockDim.x < HG * d) sq[i0 + u * blockDim.x] = qv[u];
    }
    __syncthreads();
    const float *kv = p.k1 + s * p.k1_seq, *pe = p.k2 ? p.k2 + s * p.k2_seq : nullptr;
    float m[HG], l[HG], o[HG][PER];
    #pragma unroll
    for (int g = 0; g < HG; g++) {
        m[g] = -INFINITY;
        l[g] = 0;
        #pragma unroll
        for (int u = 0; u < PER; u++) o[g][u] = 0;
    }
    bool r0 = pe && lane < p.d2, r1 = pe && lane + 32 < p.d2;
    /* stage i holds position j + i * ATTN_WARPS: D rows loaded ahead of the one used, D + 1
     * in flight per warp (two ahead take the 512-wide kernel to 168 registers, 3 blocks per
     * SM; with splits of 64 positions its grid stays within one wave) */
    float rs[D + 1][PER], es0[D + 1], es1[D + 1];
    #pragma unroll
    for (int i = 0; i < D; i++)
        hg_row<PER>(rs[i], &es0[i], &es1[i], kv, pe, j0 + warp + i * ATTN_WARPS, len, p, lane, r0, r1);
    for (int j = j0 + warp; j < len; j += ATTN_WARPS) {
        hg_row<PER>(rs[D], &es0[D], &es1[D], kv, pe, j + D * ATTN_WARPS, len, p, lane, r0, r1);
        float r[PER], e0 = es0[0], e1 = es1[0];
        #pragma unroll
        for (int u = 0; u < PER; u++) r[u] = rs[0][u];
        #pragma unroll
        for (int i = 0; i < D; i++) {
            es0[i] = es0[i + 1];
            es1[i] = es1[i + 1];
            #pragma unroll
            for (int u = 0; u < PER; u++) rs[i][u] = rs[i + 1][u];
        }
        float dd[HG];
        #pragma unroll
        for (int g = 0; g < HG; g++) {
            const float *q = sq + g * d;
            float a = 0;
            #pragma unroll
            for (int u = 0; u < PER; u++) a += q[lane + 32 * u] * r[u];
            if (r0) a += q[p.d1 + lane] * e0;
            if (r1) a += q[p.d1 + lane + 32] * e1;
            dd[g] = a;
        }
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            #pragma unroll
            for (int g = 0; g < HG; g++) dd[g] += __shfl_xor_sync(0xffffffffu, dd[g], off);
        #pragma unroll
        for (int g = 0; g < HG; g++) {
            float sc = dd[g] * p.scale, mn = fmaxf(m[g], sc), corr = expf(m[g] - mn), e = expf(sc - mn);
            l[g] = l[g] * corr + e;
            #pragma unroll
            for (int u = 0; u < PER; u++) o[g][u] = o[g][u] * corr + e * r[u];
            m[g] = mn;
        }
    }
    #pragma unroll
    for (int g = 0; g < HG; g++) {
        if (lane == 0) {
            wm[warp * HG + g] = m[g];
            wl[warp * HG + g] = l[g];
        }
        #pragma unroll
        for (int u = 0; u < PER; u++) wo[(warp * HG + g) * DV + lane + 32 * u] = o[g][u];
    }
    __syncthreads();
    bool part = p.splits > 1 && !direct;
    if (threadIdx.x < nh) { /* head g's warp factors, once, into wm (over the sum unless partial) */
        int g = threadIdx.x;
        float mx = -INFINITY, sum = 0, f[ATTN_WARPS];
        #pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) mx = fmaxf(mx, wm[w * HG + g]);
        #pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) {
            f[w] = mx == -INFINITY ? 0.0f : expf(wm[w * HG + g] - mx);
            sum += wl[w * HG + g] * f[w];
        }
        #pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) wm[w * HG + g] = part ? f[w] : f[w] / sum;
        if (part) {
            size_t ps = ((size_t)t * p.heads + h0 + g) * p.splits + blockIdx.z;
            p.pm[ps] = mx;
            p.pl[ps] = sum;
        }
    }
    __syncthreads();
    #pragma unroll 4
    for (int i = threadIdx.x; i < nh * DV; i += blockDim.x) {
        int g = i / DV, c = i % DV;
        size_t th = (size_t)t * p.heads + h0 + g;
        float acc = 0;
        #pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) acc += wo[(w * HG + g) * DV + c] * wm[w * HG + g];
        if (part)
            p.po[(th * p.splits + blockIdx.z) * DV + c] = acc;
        else
            p.out[th * p.outs + c] = acc;
    }
}

/* True when attn_hg_kernel takes the problem: the absorb form (one cache for keys and
 * values, no per-head rows), dv of 128, 256 or 512, a rope part of at most 64. */
static bool attn_hg_ok(const attn_p *p)
{
    return p->v == p->k1 && p->k1_head == 0 && p->k2_head == 0 && p->v_head == 0 &&
           p->v_pos == p->k1_pos && p->d1 == p->dv && (p->dv == 128 || p->dv == 256 || p->dv == 512) && p->d2 <= 64 &&
           (p->d2 == 0 || p->k2);
}

template <int PER>
static void launch_attn_hg(const attn_p *p, int tokens)
{
    int groups = (p->heads + ATTN_HG - 1) / ATTN_HG;
    dim3 grid((unsigned)(tokens * groups), 1, (unsigned)p->splits);
    size_t smem = sizeof(float) * ((size_t)ATTN_HG * (p->d1 + p->d2) + 2 * ATTN_WARPS * ATTN_HG +
                                   (size_t)ATTN_WARPS * ATTN_HG * 32 * PER);
    launch_smem(attn_hg_kernel<PER>, grid, smem, *p);
    launch_combine(p, tokens);
}

/* Decode attention in the absorb form on the tensor cores (attn_tc_kernel; the tuning's
 * attn_tc, on by default).
 * A block takes up to TC_HEADS heads of one token (the mma's 16 rows) and a split of
 * positions, in tiles of TC_POS cache rows that cp.async brings into shared memory,
 * one tile ahead. Per tile:
 *   scores S = Q K^T (16 x 32, k = latent + rope columns): warp w 16 positions
 *     (w / TC_KR) over an eighth of the columns (w % TC_KR; each Q fragment split
 *     once for 2 products), the eight partial tiles summed in a fixed order by the
 *     softmax;
 *   online softmax: warp w row w, one lane per position;
 *   O = O corr + P V (16 x dv, k = the tile's positions): warp w dv / 16 columns.
 * 16 warps: with 8, each scheduler had 2 warps and issued every 3.4 cycles.
 * Every product is mma.m16n8k8 on TF32 parts in three passes (cu_mma_tf32x3), so the
 * sums keep ~22 bits, as float32 FMAs would. Each cache row is read once per block
 * (attn_hg_kernel reads it once per 4 heads) and no warp reduces by shuffles per row.
 * Partials, combine and the direct output as attn_hg_kernel. */
#define TC_HEADS 16
#define TC_POS 32
#define TC_WARPS 16
#define TC_KR 8 /* column ranges of the scores */
static_assert(TC_WARPS == TC_HEADS, "attn_tc_kernel's softmax: a warp per row");

/* Shared memory of attn_tc_kernel, in floats, for d = d1 + d2 columns. */
static size_t tc_smem_floats(int d)
{
    size_t ld = (size_t)d + 4;
    return TC_HEADS * ld + 2 * TC_POS * ld + (TC_KR + 1) * TC_HEADS * (TC_POS + 4) + TC_HEADS;
}

/* cp.async of tile rows [r0, r1) (relative to the tile at position jt) into st; rows at
 * or past len become zeros (a zero P times stale shared memory could be NaN). */
template <int DV>
__device__ __forceinline__ void tc_load_rows(float *st, int ld, const float *kv, const float *pe, const attn_p &p, int jt,
                                             int r0, int r1, int len)
{
    /* a thread keeps one 16-byte column of the latent rows and steps down the rows
     * (no division per chunk: the issue loops were a third of the kernel's samples) */
    constexpr int C1 = DV / 4, RS = TC_WARPS * 32 / C1; /* 16-byte chunks of a latent row; rows per step */
    static_assert(TC_WARPS * 32 % C1 == 0, "attn_tc_kernel: whole latent rows per step");
    int c = threadIdx.x % C1;
    for (int r = r0 + (int)threadIdx.x / C1; r < r1; r += RS) {
        int j = jt + r;
        cu_cp16(st + r * ld + 4 * c, kv + (size_t)(j < len ? j : 0) * p.k1_pos + 4 * c, j < len);
    }
    int c2 = p.d2 / 4; /* the rope part: at most a sixteenth of the chunks */
    for (int i = threadIdx.x; i < (r1 - r0) * c2; i += blockDim.x) {
        int r = r0 + i / c2, cc = i % c2, j = jt + r;
        cu_cp16(st + r * ld + DV + 4 * cc, pe + (size_t)(j < len ? j : 0) * p.k2_pos + 4 * cc, j < len);
    }
}

template <int DV>
__global__ void __launch_bounds__(TC_WARPS * 32, 1) attn_tc_kernel(attn_p p)
{
    constexpr int NT = DV / (8 * TC_WARPS), NQ = TC_POS / 8 / (TC_WARPS / TC_KR); /* 8-column tiles of O, of S */
    constexpr int LS = TC_POS + 4;
    extern __shared__ float sm[];
    const int d = p.d1 + p.d2, ld = d + 4, k8 = d / 8;
    float *sq = sm;                          /* [TC_HEADS][ld] queries */
    float *skv = sq + TC_HEADS * ld;         /* [2][TC_POS][ld] cache tiles */
    float *ss = skv + 2 * TC_POS * ld;       /* [TC_KR][TC_HEADS][LS] scores, one per column range */
    float *sp = ss + TC_KR * TC_HEADS * LS;  /* [TC_HEADS][LS] probabilities */
    float *scorr = sp + TC_HEADS * LS;       /* [TC_HEADS] the tile's rescale of O, then 1 / l or l */
    int tiles = (p.heads + TC_HEADS - 1) / TC_HEADS, t = blockIdx.x / tiles, h0 = blockIdx.x % tiles * TC_HEADS;
    int nh = min(TC_HEADS, p.heads - h0), warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    int s = p.seq[t], pos = p.pos[t], len = pos + 1, j0 = 0;
    if (p.splits > 1) {
        j0 = blockIdx.z * p.chunk;
        len = min(len, j0 + p.chunk);
    }
    const float *kv = p.k1 + s * p.k1_seq, *pe = p.k2 ? p.k2 + s * p.k2_seq : nullptr;
    bool any = j0 < len;
    /* the first tile's rows before pos came from earlier passes: they load during the
     * previous kernels (one token only; see attn_p.early) */
    int pre = p.early && any ? min(TC_POS, max(0, min(len, pos) - j0)) : 0;
    if (pre) tc_load_rows<DV>(skv, ld, kv, pe, p, j0, 0, pre, len);
    cu_pdl_wait();
    cu_pdl_launch();
    bool direct = p.direct && pos < p.chunk;
    if (!any) { /* past the token's position: only pm = -inf */
        if (!direct && threadIdx.x < nh) {
            size_t ps = ((size_t)t * p.heads + h0 + threadIdx.x) * p.splits + blockIdx.z;
            p.pm[ps] = -INFINITY;
            p.pl[ps] = 0.0f;
        }
        return;
    }
    tc_load_rows<DV>(skv, ld, kv, pe, p, j0, pre, TC_POS, len);
    /* the queries by cp.async too (zeros past the last head): plain loads stored to shared
     * memory went out one at a time, ~11 us of round trips per block */
    {
        constexpr int C1 = DV / 4, RS = TC_WARPS * 32 / C1;
        int c = threadIdx.x % C1, c2 = p.d2 / 4;
        for (int h = (int)threadIdx.x / C1; h < TC_HEADS; h += RS) {
            size_t th = (size_t)t * p.heads + h0 + min(h, nh - 1);
            cu_cp16(sq + h * ld + 4 * c, p.q1 + th * p.q1s + 4 * c, h < nh);
        }
        for (int i = threadIdx.x; i < TC_HEADS * c2; i += blockDim.x) {
            int h = i / c2, k = i % c2 * 4;
            size_t th = (size_t)t * p.heads + h0 + min(h, nh - 1);
            cu_cp16(sq + h * ld + DV + k, p.q2 + th * p.q2s + k, h < nh);
        }
    }
    asm volatile("cp.async.commit_group;\n" ::);
    float o[NT][4], m = -INFINITY, l = 0; /* m, l: row warp of the softmax (lane 0) */
    #pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0;
    const int kr = warp % TC_KR, ka = kr * k8 / TC_KR, kb = (kr + 1) * k8 / TC_KR, q0 = warp / TC_KR * NQ,
              col0 = warp * (DV / TC_WARPS);
    for (int jt = j0, it = 0; jt < len; jt += TC_POS, it++) {
        float *cur = skv + (it & 1) * TC_POS * ld, *nxt = skv + ((it + 1) & 1) * TC_POS * ld;
        /* the next tile's loads (the buffer's last reader finished before this tile's barrier) */
        __syncthreads();
        if (jt + TC_POS < len) tc_load_rows<DV>(nxt, ld, kv, pe, p, jt + TC_POS, 0, TC_POS, len);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group 1;\n" ::);
        __syncthreads();
        /* partial scores over this warp's columns: rows g, g + 8; positions (q0 + n) * 8 + 2c, + 1 */
        float acc[NQ][4] = {};
        for (int kk = ka; kk < kb; kk++) {
            int k = kk * 8 + c;
            float a[4] = {sq[g * ld + k], sq[(g + 8) * ld + k], sq[g * ld + k + 4], sq[(g + 8) * ld + k + 4]};
            uint32_t ab[4], as[4];
            cu_tf32_split4(a, ab, as);
            #pragma unroll
            for (int n = 0; n < NQ; n++) {
                const float *krow = cur + ((q0 + n) * 8 + g) * ld;
                float b[2] = {krow[k], krow[k + 4]};
                cu_mma_tf32x3(acc[n], ab, as, b);
            }
        }
        float *sh = ss + kr * TC_HEADS * LS + q0 * 8;
        #pragma unroll
        for (int n = 0; n < NQ; n++) {
            sh[g * LS + n * 8 + 2 * c] = acc[n][0];
            sh[g * LS + n * 8 + 2 * c + 1] = acc[n][1];
            sh[(g + 8) * LS + n * 8 + 2 * c] = acc[n][2];
            sh[(g + 8) * LS + n * 8 + 2 * c + 1] = acc[n][3];
        }
        __syncthreads();
        /* softmax: warp w row w (lane: position); every lane keeps the row's m and l */
        {
            int r = warp;
            float sc = 0;
            #pragma unroll
            for (int w = 0; w < TC_KR; w++) sc += ss[(w * TC_HEADS + r) * LS + lane];
            sc *= p.scale;
            if (jt + lane >= len) sc = -INFINITY;
            float mn = fmaxf(m, cu_warp_max(sc)), e = expf(sc - mn), corr = expf(m - mn);
            float sum = cu_warp_sum(e);
            sp[r * LS + lane] = e;
            m = mn;
            l = l * corr + sum;
            if (lane == 0) scorr[r] = corr;
        }
        __syncthreads();
        /* O = O corr + P V: rows g, g + 8; columns col0 + n * 8 + 2c, + 1 */
        float c0 = scorr[g], c1 = scorr[g + 8];
        #pragma unroll
        for (int n = 0; n < NT; n++) {
            o[n][0] *= c0;
            o[n][1] *= c0;
            o[n][2] *= c1;
            o[n][3] *= c1;
        }
        #pragma unroll
        for (int ks = 0; ks < TC_POS / 8; ks++) {
            int k = ks * 8 + c;
            float a[4] = {sp[g * LS + k], sp[(g + 8) * LS + k], sp[g * LS + k + 4], sp[(g + 8) * LS + k + 4]};
            uint32_t ab[4], as[4];
            cu_tf32_split4(a, ab, as);
            const float *vr = cur + k * ld + col0 + g;
            #pragma unroll
            for (int n = 0; n < NT; n++) {
                float b[2] = {vr[n * 8], vr[4 * ld + n * 8]};
                cu_mma_tf32x3(o[n], ab, as, b);
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    bool part = p.splits > 1 && !direct;
    __syncthreads();
    if (lane == 0) {
        int r = warp;
        scorr[r] = part ? 1.0f : 1.0f / l;
        if (part && r < nh) {
            size_t ps = ((size_t)t * p.heads + h0 + r) * p.splits + blockIdx.z;
            p.pm[ps] = m;
            p.pl[ps] = l;
        }
    }
    __syncthreads();
    #pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        int r = g + 8 * hh;
        if (r >= nh) continue;
        float f = scorr[r];
        size_t th = (size_t)t * p.heads + h0 + r;
        float *dst = part ? p.po + (th * p.splits + blockIdx.z) * DV : p.out + th * p.outs;
        #pragma unroll
        for (int n = 0; n < NT; n++) /* columns 2c, 2c + 1 together (8-byte aligned: dv and outs are even) */
            *reinterpret_cast<float2 *>(dst + col0 + n * 8 + 2 * c) = make_float2(o[n][2 * hh] * f, o[n][2 * hh + 1] * f);
    }
}

/* True when attn_tc_kernel takes the problem: the absorb form, dv of 128, 256 or 512
 * (a multiple of 64: 8-column tiles per warp), a rope part of a multiple of 8 up to 64,
 * cache rows and queries 16-byte aligned (cp.async), outputs 8-byte aligned (pairs). */
static bool attn_tc_ok(const attn_p *p)
{
    return cu_tune.attn_tc && p->v == p->k1 && p->k1_head == 0 && p->k2_head == 0 && p->v_head == 0 &&
           p->v_pos == p->k1_pos && p->d1 == p->dv && (p->dv == 128 || p->dv == 256 || p->dv == 512) &&
           p->d2 % 8 == 0 && p->d2 <= 64 && (p->d2 == 0 || (p->k2 && p->q2)) && (uintptr_t)p->k1 % 16 == 0 &&
           (uintptr_t)p->k2 % 16 == 0 && p->k1_pos % 4 == 0 && p->k2_pos % 4 == 0 && p->k1_seq % 4 == 0 &&
           p->k2_seq % 4 == 0 && (uintptr_t)p->q1 % 16 == 0 && (uintptr_t)p->q2 % 16 == 0 && p->q1s % 4 == 0 &&
           p->q2s % 4 == 0 && (uintptr_t)p->out % 8 == 0 && p->outs % 2 == 0;
}

/* attn_tc_kernel's splits: about one block per SM over tokens x head tiles x splits, in
 * whole tiles, and at least TC_MIN_TILES tiles each (the tuning's tc_tiles: tiles per split
 * instead); shapes only. A block's fixed costs (queries, first loads) are near a tile's,
 * and the combine's grows with the splits: FP8 16B depth 4096 2.040 ms with one tile per
 * split (129 splits), 1.964 with two, 2.040 with three. */
#define TC_MIN_TILES 2

static void attn_tc_split(attn_p *p, int n, int ctx, int min_tiles = TC_MIN_TILES)
{
    long long units = (long long)n * ((p->heads + TC_HEADS - 1) / TC_HEADS), tiles = (ctx + TC_POS - 1) / TC_POS;
    long long per = cu_tune.tc_tiles > 0 ? cu_tune.tc_tiles : (tiles * units + cu_sm_count() - 1) / cu_sm_count();
    if (cu_tune.tc_tiles <= 0 && per < min_tiles) per = min_tiles;
    if (per < 1) per = 1;
    p->chunk = (int)(per * TC_POS);
    p->splits = (int)((ctx + p->chunk - 1) / p->chunk);
}

template <int DV>
static void launch_attn_tc(const attn_p *p, int tokens, bool combine = true)
{
    dim3 grid((unsigned)(tokens * ((p->heads + TC_HEADS - 1) / TC_HEADS)), 1, (unsigned)p->splits);
    size_t smem = sizeof(float) * tc_smem_floats(p->d1 + p->d2);
    static size_t allowed;
    if (smem > allowed) {
        if (!cu_check(cudaFuncSetAttribute(attn_tc_kernel<DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                      "attention: shared memory"))
            return;
        allowed = smem;
    }
    cu_launch(attn_tc_kernel<DV>, grid, TC_WARPS * 32, smem, *p);
    if (combine) launch_combine(p, tokens);
}

template <int PER>
static void launch_attn(const attn_p *p, int tokens)
{
    dim3 grid((unsigned)tokens * p->heads, cu_blocks((size_t)p->dv, 32 * PER), (unsigned)p->splits);
    size_t smem = sizeof(float) * ((size_t)p->d1 + p->d2 + 2 * ATTN_WARPS + (size_t)ATTN_WARPS * 32 * PER);
    launch_smem(attn_kernel<PER>, grid, smem, *p);
    launch_combine(p, tokens);
}

/* Splits over positions: enough blocks to fill the device (ATTN_FILL) when
 * tokens x heads alone do not, each split at least ATTN_MIN_CHUNK positions.
 * Depends only on the shapes (n, H, ctx), never on positions, so a captured
 * graph stays valid as the positions advance. */
#define ATTN_FILL 1056 /* 8 blocks of 4 warps per SM (2 per SM: 144 us per layer at depth 4096) */
#define ATTN_MIN_CHUNK 64

static void attn_split(attn_p *p, int n, int ctx)
{
    long long th = (long long)n * p->heads, want = (ATTN_FILL + th - 1) / th;
    long long most = (ctx + ATTN_MIN_CHUNK - 1) / ATTN_MIN_CHUNK;
    p->splits = (int)(want < most ? want : most);
    if (p->splits < 1) p->splits = 1;
    p->chunk = (ctx + p->splits - 1) / p->splits;
}

/* attn_hg_kernel's splits: about HG_FILL blocks of ATTN_HG heads, at least HG_MIN_CHUNK
 * positions each; shapes only, as attn_split. 64 positions keep the 512-wide kernel's
 * grid within one wave at 3 blocks per SM (FP8 depth 4096 2.76 -> 2.67 ms; 2.90 with 32). */
#define HG_MIN_CHUNK 64
#define HG_FILL 528 /* 4 blocks of 4 warps per SM at 64 positions a split */

static void attn_hg_split(attn_p *p, int n, int ctx)
{
    long long tg = (long long)n * ((p->heads + ATTN_HG - 1) / ATTN_HG);
    long long want = (HG_FILL + tg - 1) / tg, most = (ctx + HG_MIN_CHUNK - 1) / HG_MIN_CHUNK;
    p->splits = (int)(want < most ? want : most);
    if (p->splits < 1) p->splits = 1;
    p->chunk = (ctx + p->splits - 1) / p->splits;
}

/* The absorb form's attn_p of a: q_c, q_pe, the caches, seq and pos through io (device
 * pointers pass through, host ones are staged), or as they are when io is NULL (shapes
 * and alignment only, nothing queued). False when a staging failed. */
static bool absorb_params(const ds_attn_args *a, cu_io *io, attn_p *p)
{
    int n = a->n_tokens, R = a->kv_rank, rp = a->rope, nseq = 1;
    /* nseq only sizes the staging of host caches (tests), which come with host seq */
    if (io && !cu_device_readable(a->seq))
        for (int t = 0; t < n; t++) nseq = a->seq[t] + 1 > nseq ? a->seq[t] + 1 : nseq;
    size_t th = (size_t)n * a->n_heads, rows = (size_t)nseq * a->ctx;
    p->heads = a->n_heads;
    p->scale = a->softmax_scale;
    p->seq = (const int *)(io ? cu_in(io, a->seq, sizeof(int) * (size_t)n) : a->seq);
    p->pos = (const int *)(io ? cu_in(io, a->pos, sizeof(int) * (size_t)n) : a->pos);
    p->q1 = (const float *)(io && a->q_c ? cu_in(io, a->q_c, sizeof(float) * th * R) : a->q_c);
    p->q2 = (const float *)(io ? cu_in(io, a->q_pe, sizeof(float) * th * rp) : a->q_pe);
    p->q1s = R;
    p->q2s = rp;
    p->d1 = R;
    p->d2 = rp;
    p->dv = R;
    p->k1 = p->v = (const float *)(io ? cu_in(io, a->kv_cache, sizeof(float) * rows * R) : a->kv_cache);
    p->k2 = (const float *)(io ? cu_in(io, a->pe_cache, sizeof(float) * rows * rp) : a->pe_cache);
    p->k1_seq = p->v_seq = (long long)a->ctx * R;
    p->k1_pos = p->v_pos = R;
    p->k2_seq = (long long)a->ctx * rp;
    p->k2_pos = rp;
    p->outs = R;
    bool ok = p->seq && p->pos && (p->q1 || !a->q_c) && (p->q2 || rp == 0) && p->k1 && (p->k2 || rp == 0);
    if (rp == 0) p->q2 = p->k2 = NULL;
    return ok;
}

/* attn_tc_kernel's least tiles per split for cu_attention_parts, whose merge launch
 * handles many splits better than the combine (FP8 16B depth 4096, one process: 1.811 ms
 * with one tile, 1.865 / 1.881 with two; the combine 1.909 with one, 1.848 / 1.834 with
 * two). */
#define TC_PARTS_TILES 1

/* True when cu_attention_parts takes a: attn_tc_kernel in more than one split (shapes
 * and alignment only; a->q_c may be NULL, it comes from pool memory). */
bool cu_attention_parts_ok(const ds_attn_args *a)
{
    attn_p p = {};
    if (a->n_tokens <= 0 || a->n_heads <= 0 || !absorb_params(a, NULL, &p) || !attn_tc_ok(&p))
        return false;
    attn_tc_split(&p, a->n_tokens, a->ctx, TC_PARTS_TILES);
    return p.splits > 1;
}

/* Absorb attention's split partials only (no combine): attn_tc_kernel over a's splits,
 * each split's (max, sum, unnormalised o_c) into pool memory for the caller to merge
 * (cu_mla_attend's long form). False, nothing queued, when cu_attention_parts_ok is. */
bool cu_attention_parts(const ds_attn_args *a, cu_attn_parts *out)
{
    if (!cu_attention_parts_ok(a)) return false;
    int n = a->n_tokens;
    cu_io io = {};
    attn_p p = {};
    bool ok = absorb_params(a, &io, &p) && p.q1;
    attn_tc_split(&p, n, a->ctx, TC_PARTS_TILES);
    p.early = n == 1;
    size_t np = (size_t)n * a->n_heads * p.splits;
    p.pm = ok ? (float *)cu_alloc(sizeof(float) * (2 * np + np * (size_t)p.dv)) : NULL;
    p.pl = p.pm ? p.pm + np : NULL;
    p.po = p.pm ? p.pm + 2 * np : NULL;
    if (p.pm) {
        if (p.dv == 128) launch_attn_tc<128>(&p, n, false);
        else if (p.dv == 256) launch_attn_tc<256>(&p, n, false);
        else launch_attn_tc<512>(&p, n, false);
    }
    out->pm = p.pm;
    out->pl = p.pl;
    out->po = p.po;
    out->splits = p.splits;
    cu_end(&io, "attention");
    return p.pm != NULL;
}

void cu_attention(const ds_attn_args *a, ds_attn_impl impl)
{
    int n = a->n_tokens, H = a->n_heads;
    if (n <= 0 || H <= 0) return;
    if (impl == DS_ATTN_ABSORB && cu_attention_dense(a)) return;
    size_t th = (size_t)n * H;
    cu_io io = {};
    attn_p p = {};
    bool ok;
    if (impl == DS_ATTN_ABSORB) {
        ok = absorb_params(a, &io, &p) && p.q1;
        p.out = (float *)cu_out(&io, a->out, sizeof(float) * th * a->kv_rank, false);
        ok = ok && p.out;
    } else {
        int nseq = 1; /* only sizes the staging of host caches (tests), which come with host seq */
        if (!cu_device_readable(a->seq))
            for (int t = 0; t < n; t++) nseq = a->seq[t] + 1 > nseq ? a->seq[t] + 1 : nseq;
        size_t rows = (size_t)nseq * a->ctx;
        int qk = a->nope + a->rope, vd = a->vdim;
        p.heads = H;
        p.scale = a->softmax_scale;
        p.seq = (const int *)cu_in(&io, a->seq, sizeof(int) * (size_t)n);
        p.pos = (const int *)cu_in(&io, a->pos, sizeof(int) * (size_t)n);
        p.q1 = (const float *)cu_in(&io, a->q, sizeof(float) * th * qk);
        p.q1s = qk;
        p.d1 = qk;
        p.dv = vd;
        p.k1 = (const float *)cu_in(&io, a->k_cache, sizeof(float) * rows * H * qk);
        p.v = (const float *)cu_in(&io, a->v_cache, sizeof(float) * rows * H * vd);
        p.k1_seq = (long long)a->ctx * H * qk;
        p.k1_pos = (long long)H * qk;
        p.k1_head = qk;
        p.v_seq = (long long)a->ctx * H * vd;
        p.v_pos = (long long)H * vd;
        p.v_head = vd;
        p.out = (float *)cu_out(&io, a->out, sizeof(float) * th * vd, false);
        p.outs = vd;
        ok = p.q1 && p.k1 && p.v && p.out;
    }
    p.splits = 1;
    bool tc = ok && attn_tc_ok(&p), hg = ok && !tc && attn_hg_ok(&p);
    p.direct = hg || tc;
    p.early = tc && n == 1;
    if (ok) {
        if (tc) attn_tc_split(&p, n, a->ctx);
        else if (hg) attn_hg_split(&p, n, a->ctx);
        else attn_split(&p, n, a->ctx);
    }
    if (ok && p.splits > 1) {
        size_t np = th * p.splits;
        p.pm = (float *)cu_alloc(sizeof(float) * (2 * np + np * (size_t)p.dv)); /* pool: stays valid in a graph */
        p.pl = p.pm ? p.pm + np : NULL;
        p.po = p.pm ? p.pm + 2 * np : NULL;
        ok = p.pm != NULL;
    }
    if (ok && p.seq && p.pos) {
        if (tc) {
            if (p.dv == 128) launch_attn_tc<128>(&p, n);
            else if (p.dv == 256) launch_attn_tc<256>(&p, n);
            else launch_attn_tc<512>(&p, n);
        } else if (hg) {
            if (p.dv == 128) launch_attn_hg<4>(&p, n);
            else if (p.dv == 256) launch_attn_hg<8>(&p, n);
            else launch_attn_hg<16>(&p, n);
        } else if (p.dv <= 32) launch_attn<1>(&p, n);
        else if (p.dv <= 64) launch_attn<2>(&p, n);
        else if (p.dv <= 128) launch_attn<4>(&p, n);
        else if (p.dv <= 256) launch_attn<8>(&p, n);
        else launch_attn<16>(&p, n); /* slices of 512 columns */
    }
    cu_free(p.pm);
    cu_end(&io, "attention");
}

/* ---- mla_attend: absorb attention whole in one launch.
 *
 * Absorb attention by the ops is four launches per layer: heads_t (q_c = q_nope W_k),
 * the attention, its split combine, and heads_vec (out = o_c W_v^T). Each waits for the
 * one before, and at short depth each is a few dependent L2 round trips. Here a thread
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
 * The partials are pushed to every block (reading the others' cost a round trip per
 * read), the weights come by cp.async (in registers they spilled), and q_pe is asked for
 * with q_nope: 6.8 us a kernel against 9.2, FP8 batch 1 1.40-1.41 ms against 1.43-1.47. */

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
    /* mla_prologue folded in (one token; kvx NULL: none, qp is read): q_pe rotated from q by
     * every block; the position's cache rows kv_norm(kvx[0 .. R)) * nw and rope(kvx[R ..))
     * made in shared memory by the block that walks that position, and written to rows
     * row[0] of kvw, pew by head 0's. cs, sn: the rope tables. */
    const float *kvx, *nw, *cs, *sn;
    const int *row;
    float *kvw, *pew;
    float eps;
} at_p;

struct at_smem {
    float xq[AT_C][AT_RMAX];           /* step 1: each block's partial q_c (pushed by that block) */
    float bo[AT_C][AT_RMAX];           /* step 2: each block's unnormalised o_c (pushed) */
    float bm[AT_C], bl[AT_C];          /* step 2: each block's max and sum (pushed) */
    float qc[AT_RMAX];                 /* q_c, then o_c */
    float qpe[AT_ROPE];
    float kvc[AT_RMAX], pec[AT_ROPE];  /* the folded prologue: the position's cache rows */
    float part[32];                    /* its norm's block sum */
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
 * batch 1 took 1.725 ms against 1.599. */
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
    /* the folded prologue (p.kvx): the position's angles (pass inputs, as pos) before the
     * wait; this block makes the position's cache rows when its warps walk that position */
    const bool pro = p.kvx != nullptr;
    const int half = p.rope / 2, ppos = pro ? p.pos[t] : 0;
    const bool mine = pro && r == ppos % AT_C;
    float ca = pro && tid < half ? p.cs[(size_t)ppos * half + tid] : 0.0f;
    float sa = pro && tid < half ? p.sn[(size_t)ppos * half + tid] : 0.0f;
    cu_pdl_wait();
    cu_pdl_launch();

    /* ---- 1. partial q_c over this block's nope rows */
    const float *qn = p.q + ((size_t)t * p.H + h) * p.qk;
    /* q_pe (the prologue's) asked for now, so that its round trip overlaps q_nope's */
    float qpe = !pro && tid < p.rope ? p.qp[((size_t)t * p.H + h) * p.rope + tid] : 0.0f;
    /* folded: q_pe's pair tid, and this block's share of the position's kvx row (the
     * prologue's MLA_PRO_PER values a thread of 256, as mla_prologue_kernel holds them) */
    float qx0 = 0, qx1 = 0, kx0 = 0, kx1 = 0, xv[4] = {0, 0, 0, 0}, nwv[4] = {0, 0, 0, 0};
    static_assert(AT_THREADS == 256 && 4 * AT_THREADS >= AT_RMAX, "the folded norm sums as mla_prologue_kernel");
    if (pro && tid < half) {
        qx0 = qn[p.nope + 2 * tid];
        qx1 = qn[p.nope + 2 * tid + 1];
    }
    if (mine) {
        const float *xi = p.kvx + (size_t)t * (R + 2 * half);
        #pragma unroll
        for (int u = 0; u < 4; u++) {
            int j = tid + AT_THREADS * u;
            xv[u] = j < R ? xi[j] : 0.0f;
            nwv[u] = j < R ? p.nw[j] : 0.0f;
        }
        if (tid < half) {
            kx0 = xi[R + 2 * tid];
            kx1 = xi[R + 2 * tid + 1];
        }
    }
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
    if (mine) { /* the position's cache rows: kv_norm and k_pe's rotation, as mla_prologue_kernel */
        float ss = 0;
        #pragma unroll
        for (int u = 0; u < 4; u++) ss += xv[u] * xv[u];
        float rs = rsqrtf(cu_block_sum(ss, sm.part) / R + p.eps);
        size_t rw = (size_t)p.row[t];
        #pragma unroll
        for (int u = 0; u < 4; u++) {
            int j = tid + AT_THREADS * u;
            if (j >= R) break;
            float v = xv[u] * rs * nwv[u];
            sm.kvc[j] = v;
            if (h == 0) p.kvw[rw * R + j] = v;
        }
        if (tid < half) {
            float a0 = kx0 * ca - kx1 * sa, a1 = kx0 * sa + kx1 * ca;
            sm.pec[2 * tid] = a0;
            sm.pec[2 * tid + 1] = a1;
            if (h == 0) {
                p.pew[rw * 2 * half + 2 * tid] = a0;
                p.pew[rw * 2 * half + 2 * tid + 1] = a1;
            }
        }
    }
    __syncthreads(); /* red overlays the step-1 chunks */
    #pragma unroll
    for (int e = 0; e < E; e++) sm.red[g * R + c1 * E + e] = acc[e];
    if (!pro && tid < p.rope) sm.qpe[tid] = qpe;
    if (pro && tid < half) {
        sm.qpe[2 * tid] = qx0 * ca - qx1 * sa;
        sm.qpe[2 * tid + 1] = qx0 * sa + qx1 * ca;
    }
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
    const int step = AT_C * AT_WARPS, jc = pro ? len - 1 : -1; /* jc: the position made here */
    int j = r + AT_C * warp;
    if (j < len) { /* one row ahead of the one in use */
        const float *kr = j == jc ? sm.kvc : kv + (size_t)j * R, *pr = j == jc ? sm.pec : pe + (size_t)j * p.rope;
        #pragma unroll
        for (int u = 0; u < PER; u++) cur[u] = kr[lane + 32 * u];
        if (e0) ce0 = pr[lane];
        if (e1) ce1 = pr[lane + 32];
    }
    for (; j < len; j += step) {
        int jn = j + step;
        if (jn < len) {
            const float *kr = jn == jc ? sm.kvc : kv + (size_t)jn * R;
            const float *pr = jn == jc ? sm.pec : pe + (size_t)jn * p.rope;
            #pragma unroll
            for (int u = 0; u < PER; u++) nxt[u] = kr[lane + 32 * u];
            if (e0) ne0 = pr[lane];
            if (e1) ne1 = pr[lane + 32];
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

/* ---- the long form: deep in the cache the one-launch kernel's clusters
 * would each read the whole cache. There mla_attend runs q_c = q_nope W_k
 * (heads_t), attn_tc_kernel's splits over positions (cu_attention_parts) and then
 * attend_merge_kernel: a cluster of C blocks per (token, head), where block r merges
 * the splits' partials for columns [r R / C, (r + 1) R / C) of o_c (the same sums
 * as attn_combine_kernel, in groups of splits added in a fixed order), pushes them into
 * every block's shared memory, and after the cluster barrier multiplies the whole o_c by
 * its slice of the head's vdim rows of wkv_b, whose first rows (16 / C each, up to 4) a
 * warp loaded before the PDL wait. That is the combine launch and heads_vec's in one.
 * C is the tuning's attend_cluster (2, 4 or 8, the default). */
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

/* The one-launch kernel on a (pro: with mla_prologue folded in, one token, device memory). */
static void attend_short(const ds_attn_args *a, const ds_weight *wkv_b, const float *q, int qk, const ds_mla_pro *pro);

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
    attend_short(a, wkv_b, q, qk, NULL);
    return true;
}

/* mla_prologue_attend: taken where mla_attend takes the one-launch kernel at one token
 * with rope pairs, everything in device memory. The prologue's launch goes: every block
 * rotates its head's q_pe itself, and the block that walks the step's position makes that
 * row from kvx (the same floats mla_prologue_kernel makes) instead of reading the cache. */
bool cu_mla_prologue_attend(const ds_mla_pro *pro, const ds_attn_args *a, const ds_weight *wkv_b)
{
    int H = a->n_heads, R = a->kv_rank, nope = a->nope, vd = a->vdim, rp = a->rope;
    if (!cu_tune.attend_pro || pro->n != 1 || a->n_tokens != 1 || cu_tune.attend_max_tokens < 1 || rp <= 0 ||
        rp % 2 || rp > AT_ROPE || pro->rope != rp || pro->R != R || pro->H != H || pro->nope != nope ||
        pro->kv != a->kv_cache || pro->pe != a->pe_cache || pro->qp != a->q_pe || H <= 0 || H > 65535 / AT_C ||
        !(R == 128 || R == 256 || R == 512) || vd <= 0 || nope <= 0 || pro->qk < nope + rp ||
        wkv_b->cols != R || wkv_b->rows < H * (nope + vd) ||
        !(wkv_b->fmt == DS_W_FP8 || wkv_b->fmt == DS_W_BF16 || wkv_b->fmt == DS_W_F32) ||
        cu_tune.attend_max_pos <= 0 || a->pos_bound <= 0 || a->pos_bound > cu_tune.attend_max_pos ||
        (a->contiguous && cu_tune.expand_min != 0 && abs(cu_tune.expand_min) <= 1))
        return false;
    const void *dev[] = {pro->kv, pro->pe, pro->row, pro->kvx, pro->norm_w, pro->q, pro->pos, pro->cos_tab,
                         pro->sin_tab, a->seq, a->pos, a->out};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (!cu_device_readable(dev[i])) return false;
    attend_short(a, wkv_b, pro->q, pro->qk, pro);
    return true;
}

static void attend_short(const ds_attn_args *a, const ds_weight *wkv_b, const float *q, int qk, const ds_mla_pro *pro)
{
    int n = a->n_tokens, H = a->n_heads, R = a->kv_rank, nope = a->nope, vd = a->vdim, rp = a->rope;
    int nseq = 1; /* sizes the staging of host caches (tests) */
    if (!cu_device_readable(a->seq))
        for (int t = 0; t < n; t++) nseq = a->seq[t] + 1 > nseq ? a->seq[t] + 1 : nseq;
    size_t th = (size_t)n * H, rows = (size_t)nseq * a->ctx;
    cu_io io = {};
    cu_weight dw;
    at_p p = {};
    p.q = (const float *)cu_in(&io, q, sizeof(float) * th * qk);
    p.qp = pro ? NULL : (const float *)cu_in(&io, a->q_pe, sizeof(float) * th * rp);
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
    if (pro) {
        p.kvx = pro->kvx;
        p.nw = pro->norm_w;
        p.cs = pro->cos_tab;
        p.sn = pro->sin_tab;
        p.row = pro->row;
        p.kvw = pro->kv;
        p.pew = pro->pe;
        p.eps = pro->eps;
    }
    if (p.q && (p.qp || rp == 0 || pro) && p.kv && (p.pe || rp == 0) && p.seq && p.pos && p.out && cu_weight_get(wkv_b, &dw)) {
        p.w = dw.data;
        p.ws = dw.scale;
        dim3 grid((unsigned)(H * AT_C), (unsigned)n);
        if (wkv_b->fmt == DS_W_FP8) launch_attend<DS_W_FP8>(grid, p);
        else if (wkv_b->fmt == DS_W_BF16) launch_attend<DS_W_BF16>(grid, p);
        else launch_attend<DS_W_F32>(grid, p);
    }
    cu_end(&io, "mla_attend");
}
