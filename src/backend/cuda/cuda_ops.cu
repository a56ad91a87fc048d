/* cuda_ops.cu - the CUDA backend's table, and its ops other than the
 * products (cuda_gemm.cu): rmsnorm, rope, attention, silu_mul, add.
 *
 * Attention is one block of four warps per (token, head, 512-wide slice of
 * the value dimension). Each warp walks positions j = warp, warp + 4, ...
 * of the token's sequence up to pos[t], computing the score with a warp
 * reduction and keeping an online softmax (running max m, sum l, output o
 * rescaled by exp(m_old - m_new)); the four warps' states are merged at the
 * end. Absorb and naive are the same kernel with different strides:
 *   absorb: score = q_c . kv[j] + q_pe . pe[j], value kv[j]   (MQA over the latent)
 *   naive:  score = q . k[j][h],                 value v[j][h]
 * No split over positions yet, so a single decode token uses n_heads blocks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <climits>

#include <cooperative_groups.h>

#include "cuda_internal.cuh"

extern "C" {
#include "base/status.h"
}

namespace cg = cooperative_groups;


extern "C" cuda_tuning cuda_tuning_default(void)
{
    cuda_tuning t = {};
    t.gemm_bf16 = false;
    t.grouped_wgmma = true;
    t.fp8_mma = true;
    t.fp8_wgmma = true;
    t.attn_tc = true;
    t.tc_tiles = 0;
    t.attend_max_pos = 1024;
    t.attend_max_tokens = 1;
    t.attend_long = 1;
    t.attend_cluster = 8;
    t.expand_min = 16;
    t.flash = 3;
    t.flash_kc = 4;
    t.dense_chunk = 0;
    t.scratch_fill = 0;
    t.alloc_max_mib = 0;
    return t;
}

cuda_tuning cu_tune = cuda_tuning_default();

extern "C" cuda_tuning cuda_backend_tuning(void) { return cu_tune; }

extern "C" void cuda_backend_set_tuning(const cuda_tuning *t)
{
    cu_tune = *t;
    if (cu_tune.attend_cluster != 2 && cu_tune.attend_cluster != 4) cu_tune.attend_cluster = 8;
    if (cu_tune.attend_long > 8) cu_tune.attend_long = 8;
    if (cu_tune.flash < 0) cu_tune.flash = 0;
    if (cu_tune.flash > 3) cu_tune.flash = 3;
    if (cu_tune.flash_kc < 1) cu_tune.flash_kc = 4;
    if (cu_tune.tc_tiles < 0) cu_tune.tc_tiles = 0;
    if (cu_tune.dense_chunk < 0) cu_tune.dense_chunk = 0;
    if (cu_tune.alloc_max_mib < 0) cu_tune.alloc_max_mib = 0;
}

/* ---- rmsnorm: one block per row; y may alias x (each thread rewrites what it read).
 * The general form (rmsnorm_rows) scatters row i to row di[i] of y (stride ys) and, with r,
 * first adds the residual r into x (h += y; x = norm(h) in one pass of the decode layer). */

__global__ void rmsnorm_kernel(float *y, int ys, const int *__restrict__ di, float *x, int xs,
                               const float *__restrict__ r, const float *__restrict__ w, int dim, float eps)
{
    cu_pdl_wait();
    cu_pdl_launch();
    __shared__ float part[32];
    float *xi = x + (size_t)blockIdx.x * xs;
    float *yi = y + (size_t)(di ? di[blockIdx.x] : (int)blockIdx.x) * ys;
    float ss = 0;
    if (r) {
        const float *ri = r + (size_t)blockIdx.x * dim;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            float v = xi[j] + ri[j];
            xi[j] = v;
            ss += v * v;
        }
    } else {
        for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += xi[j] * xi[j];
    }
    float rs = rsqrtf(cu_block_sum(ss, part) / dim + eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) yi[j] = xi[j] * rs * w[j];
}

/* one block per row, up to 1024 threads (a decode row of 2048 took 6.7 us with 256) */
static unsigned norm_threads(int dim) { return dim >= 4096 ? 1024 : dim >= 1024 ? 512 : 256; }

static void cu_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps)
{
    if (n <= 0 || dim <= 0) return;
    size_t bytes = sizeof(float) * (size_t)n * dim;
    cu_io io = {};
    const float *dw = (const float *)cu_in(&io, w, sizeof(float) * (size_t)dim);
    const float *dx;
    float *dy;
    if (y == x) {
        dy = (float *)cu_out(&io, y, bytes, true);
        dx = dy;
    } else {
        dx = (const float *)cu_in(&io, x, bytes);
        dy = (float *)cu_out(&io, y, bytes, false);
    }
    if (dw && dx && dy)
        cu_launch(rmsnorm_kernel, (unsigned)n, norm_threads(dim), 0, dy, dim, NULL, (float *)dx, dim, NULL, dw, dim,
                                                                   eps);
    cu_end(&io, "rmsnorm");
}

/* rmsnorm_rows with the row held in registers (stage 8, DSV3_CUDA_NORM4): thread i owns
 * the V float4s at columns 4 (i + j blockDim.x), loads x (and r) once, and writes y from
 * registers after the block sum (rmsnorm_kernel reads the row again). dim % 4 == 0,
 * 16-byte aligned rows. The weight w is loaded before waiting for the previous kernel. */
template <int V>
__global__ void rmsnorm4_kernel(float *y, int ys, const int *__restrict__ di, float *x, int xs,
                                const float *__restrict__ r, const float *__restrict__ w, int dim, float eps)
{
    __shared__ float part[32];
    int n4 = dim / 4;
    float4 wv[V], v[V];
    #pragma unroll
    for (int j = 0; j < V; j++) {
        int i = threadIdx.x + j * blockDim.x;
        wv[j] = i < n4 ? ((const float4 *)w)[i] : make_float4(0, 0, 0, 0);
    }
    cu_pdl_wait();
    cu_pdl_launch();
    float4 *xi = (float4 *)(x + (size_t)blockIdx.x * xs);
    float4 *yi = (float4 *)(y + (size_t)(di ? di[blockIdx.x] : (int)blockIdx.x) * ys);
    const float4 *ri = r ? (const float4 *)(r + (size_t)blockIdx.x * dim) : nullptr;
    float ss = 0;
    #pragma unroll
    for (int j = 0; j < V; j++) {
        int i = threadIdx.x + j * blockDim.x;
        v[j] = make_float4(0, 0, 0, 0);
        if (i >= n4) continue;
        v[j] = xi[i];
        if (ri) {
            float4 a = ri[i];
            v[j].x += a.x, v[j].y += a.y, v[j].z += a.z, v[j].w += a.w;
            xi[i] = v[j];
        }
        ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    float rs = rsqrtf(cu_block_sum(ss, part) / dim + eps);
    #pragma unroll
    for (int j = 0; j < V; j++) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < n4)
            yi[i] = make_float4(v[j].x * rs * wv[j].x, v[j].y * rs * wv[j].y, v[j].z * rs * wv[j].z,
                                v[j].w * rs * wv[j].w);
    }
}

static void cu_rmsnorm_rows(float *y, int ys, const int *di, float *x, int xs, const float *r, const float *w, int n,
                            int dim, float eps)
{
    if (n <= 0 || dim <= 0) return;
    if (!cu_device_readable(y) || !cu_device_readable(x) || !cu_device_readable(di) || !cu_device_readable(r)) {
        cu_check(cudaErrorInvalidValue, "rmsnorm_rows: arguments must be device memory");
        return;
    }
    cu_io io = {};
    const float *dw = (const float *)cu_in(&io, w, sizeof(float) * (size_t)dim);
    bool vec = dim % 4 == 0 && dim <= 8192 && xs % 4 == 0 && ys % 4 == 0 && (uintptr_t)x % 16 == 0 &&
               (uintptr_t)y % 16 == 0 && (uintptr_t)dw % 16 == 0 && (!r || (uintptr_t)r % 16 == 0);
    unsigned th = (unsigned)(dim / 4 + 31) / 32 * 32; /* a float4 per thread up to 1024 threads, then two */
    if (dw && vec && th <= 1024)
        cu_launch(rmsnorm4_kernel<1>, (unsigned)n, th, 0, y, ys, di, x, xs, r, dw, dim, eps);
    else if (dw && vec)
        cu_launch(rmsnorm4_kernel<2>, (unsigned)n, (th / 2 + 31) / 32 * 32, 0, y, ys, di, x, xs, r, dw, dim, eps);
    else if (dw)
        cu_launch(rmsnorm_kernel, (unsigned)n, norm_threads(dim), 0, y, ys, di, x, xs, r, dw, dim, eps);
    cu_end(&io, "rmsnorm_rows");
}

/* ---- rope: one thread per rotated pair; c, s are rows idx[t] of the tables */

__global__ void rope_kernel(float *x, int n, int nvec, int stride, int off, int half, const int *__restrict__ idx,
                            const float *__restrict__ c, const float *__restrict__ s)
{
    cu_pdl_wait();
    cu_pdl_launch();
    size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (g >= (size_t)n * nvec * half) return;
    int i = (int)(g % half);
    size_t tv = g / half;
    int t = (int)(tv / nvec);
    float *p = x + tv * stride + off + 2 * i;
    float cv = c[(size_t)idx[t] * half + i], sv = s[(size_t)idx[t] * half + i];
    float a = p[0], b = p[1];
    p[0] = a * cv - b * sv;
    p[1] = a * sv + b * cv;
}

static void cu_rope(float *x, int n, int nvec, int stride, int off, int rope, const int *pos, const float *cos_tab,
                    const float *sin_tab)
{
    int half = rope / 2;
    if (n <= 0 || nvec <= 0 || half <= 0) return;
    bool dev_tabs = cu_device_readable(cos_tab) && cu_device_readable(sin_tab);
    /* host tables: stage just the n rows needed ([cos rows][sin rows]), indexed by token */
    int *rows = NULL;
    float *g = NULL;
    if (!dev_tabs) {
        rows = (int *)malloc(sizeof(int) * (size_t)n);
        g = (float *)malloc(sizeof(float) * 2 * (size_t)n * half);
        if (!rows || !g) {
            free(rows);
            free(g);
            cu_check(cudaErrorMemoryAllocation, "rope: host scratch");
            return;
        }
        for (int t = 0; t < n; t++) {
            memcpy(g + (size_t)t * half, cos_tab + (size_t)pos[t] * half, sizeof(float) * (size_t)half);
            memcpy(g + ((size_t)n + t) * half, sin_tab + (size_t)pos[t] * half, sizeof(float) * (size_t)half);
            rows[t] = t;
        }
    }
    cu_io io = {};
    float *dx = (float *)cu_out(&io, x, sizeof(float) * (size_t)n * nvec * stride, true);
    const float *dc, *ds;
    const int *didx;
    if (dev_tabs) {
        dc = cos_tab;
        ds = sin_tab;
        didx = (const int *)cu_in(&io, pos, sizeof(int) * (size_t)n);
    } else {
        dc = (const float *)cu_in(&io, g, sizeof(float) * 2 * (size_t)n * half);
        ds = dc ? dc + (size_t)n * half : NULL;
        didx = (const int *)cu_in(&io, rows, sizeof(int) * (size_t)n);
    }
    size_t total = (size_t)n * nvec * half;
    if (dx && dc && ds && didx)
        cu_launch(rope_kernel, cu_blocks(total, 256), 256, 0, dx, n, nvec, stride, off, half, didx, dc, ds);
    cu_end(&io, "rope");
    free(rows);
    free(g);
}

/* rope_copy: one thread per rotated pair, read from src and written to row di[t] of dst */
__global__ void rope_copy_kernel(float *__restrict__ dst, int dstride, const int *__restrict__ di,
                                 const float *__restrict__ src, int ss, int n, int nvec, int half,
                                 const int *__restrict__ pos, const float *__restrict__ c, const float *__restrict__ s)
{
    cu_pdl_wait();
    cu_pdl_launch();
    size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (g >= (size_t)n * nvec * half) return;
    int i = (int)(g % half);
    size_t tv = g / half;
    int t = (int)(tv / nvec), v = (int)(tv % nvec);
    const float *p = src + tv * ss + 2 * i;
    float *d = dst + ((size_t)(di ? di[t] : t) * nvec + v) * dstride + 2 * i;
    float cv = c[(size_t)pos[t] * half + i], sv = s[(size_t)pos[t] * half + i];
    float a = p[0], b = p[1];
    d[0] = a * cv - b * sv;
    d[1] = a * sv + b * cv;
}

static void cu_rope_copy(float *dst, int ds, const int *di, const float *src, int ss, int n, int nvec, int rope,
                         const int *pos, const float *cos_tab, const float *sin_tab)
{
    int half = rope / 2;
    if (n <= 0 || nvec <= 0 || half <= 0) return;
    if (!cu_device_readable(dst) || !cu_device_readable(src) || !cu_device_readable(di) || !cu_device_readable(pos) ||
        !cu_device_readable(cos_tab) || !cu_device_readable(sin_tab)) {
        cu_check(cudaErrorInvalidValue, "rope_copy: arguments must be device memory");
        return;
    }
    cu_io io = {};
    size_t total = (size_t)n * nvec * half;
    cu_launch(rope_copy_kernel, cu_blocks(total, 128), 128, 0, dst, ds, di, src, ss, n, nvec, half, pos, cos_tab,
                                                              sin_tab);
    cu_end(&io, "rope_copy");
}

/* mla_prologue in one launch (stage 8): block (t, 0) writes token t's normalised latent
 * and rotated k_pe into their cache rows; blocks (t, 1..) rotate q_pe, MLA_PRO_THREADS
 * pairs each. Was three launches (rmsnorm_rows, rope_copy twice). */
#define MLA_PRO_THREADS 256
#define MLA_PRO_PER 4 /* latent values per thread held in registers (R <= 1024) */
__global__ void __launch_bounds__(MLA_PRO_THREADS)
mla_prologue_kernel(float *kv, float *pe, const int *__restrict__ row, const float *__restrict__ kvx,
                    const float *__restrict__ nw, float eps, float *qp, const float *__restrict__ q, int H, int qk,
                    int nope, int R, int half, const int *__restrict__ pos, const float *__restrict__ c,
                    const float *__restrict__ sn)
{
    /* pos and the tables are the pass's inputs and nw a weight, never a kernel's output:
     * read before the wait (stage 11), with the latent row held in registers across the
     * block sum when it fits (MLA_PRO_PER per thread) */
    __shared__ float part[32];
    int t = blockIdx.x, p = pos[t];
    const float *cv = c + (size_t)p * half, *sv = sn + (size_t)p * half;
    if (blockIdx.y > 0) {
        int g = (blockIdx.y - 1) * MLA_PRO_THREADS + threadIdx.x, h = g / half, i = g % half;
        float cs = h < H ? cv[i] : 0.0f, ss = h < H ? sv[i] : 0.0f;
        cu_pdl_wait();
        cu_pdl_launch();
        if (h >= H) return;
        const float *a = q + ((size_t)t * H + h) * qk + nope + 2 * i;
        float *d = qp + ((size_t)t * H + h) * 2 * half + 2 * i;
        float x0 = a[0], x1 = a[1];
        d[0] = x0 * cs - x1 * ss;
        d[1] = x0 * ss + x1 * cs;
        return;
    }
    bool held = R <= MLA_PRO_PER * MLA_PRO_THREADS;
    float wv[MLA_PRO_PER], xv[MLA_PRO_PER];
    #pragma unroll
    for (int u = 0; u < MLA_PRO_PER; u++) {
        int j = threadIdx.x + u * MLA_PRO_THREADS;
        wv[u] = held && j < R ? nw[j] : 0.0f;
    }
    float cs = threadIdx.x < half ? cv[threadIdx.x] : 0.0f, ss0 = threadIdx.x < half ? sv[threadIdx.x] : 0.0f;
    cu_pdl_wait();
    cu_pdl_launch();
    const float *xi = kvx + (size_t)t * (R + 2 * half);
    size_t r = (size_t)row[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float x0 = xi[R + 2 * i], x1 = xi[R + 2 * i + 1];
        float ci = i == threadIdx.x ? cs : cv[i], si = i == threadIdx.x ? ss0 : sv[i];
        pe[r * 2 * half + 2 * i] = x0 * ci - x1 * si;
        pe[r * 2 * half + 2 * i + 1] = x0 * si + x1 * ci;
    }
    float ss = 0;
    if (held) {
        #pragma unroll
        for (int u = 0; u < MLA_PRO_PER; u++) {
            int j = threadIdx.x + u * MLA_PRO_THREADS;
            xv[u] = j < R ? xi[j] : 0.0f;
            ss += xv[u] * xv[u];
        }
    } else {
        for (int j = threadIdx.x; j < R; j += blockDim.x) ss += xi[j] * xi[j];
    }
    float rs = rsqrtf(cu_block_sum(ss, part) / R + eps);
    if (held) {
        #pragma unroll
        for (int u = 0; u < MLA_PRO_PER; u++) {
            int j = threadIdx.x + u * MLA_PRO_THREADS;
            if (j < R) kv[r * R + j] = xv[u] * rs * wv[u];
        }
    } else {
        for (int j = threadIdx.x; j < R; j += blockDim.x) kv[r * R + j] = xi[j] * rs * nw[j];
    }
}

static void cu_mla_prologue(float *kv, float *pe, const int *row, const float *kvx, const float *norm_w, float eps,
                            float *qp, const float *q, int n, int H, int qk, int nope, int R, int rope, const int *pos,
                            const float *cos_tab, const float *sin_tab)
{
    int half = rope / 2;
    if (n <= 0) return;
    if (half <= 0) { /* no rope part: the norm and copies as three launches */
        cu_rmsnorm_rows(kv, R, row, (float *)kvx, R + rope, NULL, norm_w, n, R, eps);
        cu_rope_copy(pe, rope, row, kvx + R, R + rope, n, 1, rope, pos, cos_tab, sin_tab);
        cu_rope_copy(qp, rope, NULL, q + nope, qk, n, H, rope, pos, cos_tab, sin_tab);
        return;
    }
    const void *ptrs[] = {kv, pe, row, kvx, norm_w, qp, q, pos, cos_tab, sin_tab};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++)
        if (!cu_device_readable(ptrs[i])) {
            cu_check(cudaErrorInvalidValue, "mla_prologue: arguments must be device memory");
            return;
        }
    dim3 grid((unsigned)n, 1 + cu_blocks((size_t)H * half, MLA_PRO_THREADS));
    cu_launch(mla_prologue_kernel, grid, MLA_PRO_THREADS, 0, kv, pe, row, kvx, norm_w, eps, qp, q, H, qk, nope, R, half,
              pos, cos_tab, sin_tab);
    cu_check(cudaGetLastError(), "mla_prologue");
}

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
#define ATTN_FILL 1056 /* 8 blocks of 4 warps per SM (was 264: 144 us per layer at depth 4096) */
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

static void cu_attention(const ds_attn_args *a, ds_attn_impl impl)
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

/* ---- elementwise */

__global__ void silu_mul_kernel(float *a, const float *__restrict__ b, size_t n)
{
    cu_pdl_wait();
    cu_pdl_launch();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

__global__ void add_kernel(float *y, const float *__restrict__ x, size_t n)
{
    cu_pdl_wait();
    cu_pdl_launch();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

void cu_silu_mul(float *a, const float *b, size_t n)
{
    if (n == 0) return;
    cu_io io = {};
    float *da = (float *)cu_out(&io, a, sizeof(float) * n, true);
    const float *db = (const float *)cu_in(&io, b, sizeof(float) * n);
    if (da && db) cu_launch(silu_mul_kernel, cu_blocks(n, 256), 256, 0, da, db, n);
    cu_end(&io, "silu_mul");
}

void cu_add(float *y, const float *x, size_t n)
{
    if (n == 0) return;
    cu_io io = {};
    float *dy = (float *)cu_out(&io, y, sizeof(float) * n, true);
    const float *dx = (const float *)cu_in(&io, x, sizeof(float) * n);
    if (dy && dx) cu_launch(add_kernel, cu_blocks(n, 256), 256, 0, dy, dx, n);
    cu_end(&io, "add");
}

/* ---- data movement: one warp per row, 16-byte accesses when strides allow */

/* Block (row i, 1024-column chunk): the decode calls copy one 2048-float row, which
 * one warp walked serially (6.3 us per call profiled). */
__global__ void copy_rows_kernel(float *dst, int ds, const int *__restrict__ di, const float *src, int ss,
                                 const int *__restrict__ si, int n, int len)
{
    cu_pdl_wait();
    cu_pdl_launch();
    int i = blockIdx.x;
    float *d = dst + (size_t)(di ? di[i] : i) * ds;
    const float *s = src + (size_t)(si ? si[i] : i) * ss;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < len; j += gridDim.y * blockDim.x) d[j] = s[j];
}

void cu_copy_rows(float *dst, int dst_stride, const int *di, const float *src, int src_stride, const int *si, int n,
                  int len)
{
    if (n <= 0 || len <= 0) return;
    cu_io io = {};
    if (!cu_device_readable(dst) || !cu_device_readable(src) || !cu_device_readable(di) || !cu_device_readable(si)) {
        cu_check(cudaErrorInvalidValue, "copy_rows: arguments must be device memory");
        return;
    }
    dim3 grid((unsigned)n, cu_blocks((size_t)len, 256) < 16 ? cu_blocks((size_t)len, 256) : 16);
    cu_launch(copy_rows_kernel, grid, 256, 0, dst, dst_stride, di, src, src_stride, si, n, len);
    cu_end(&io, "copy_rows");
}

__global__ void add_rows_scaled_kernel(float *y, const int *__restrict__ idx, const float *__restrict__ x,
                                       const float *__restrict__ w, int dim)
{
    cu_pdl_wait();
    cu_pdl_launch();
    int i = blockIdx.y;
    float *yi = y + (size_t)idx[i] * dim;
    const float *xi = x + (size_t)i * dim;
    float wi = w[i];
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < dim; j += gridDim.x * blockDim.x) yi[j] += wi * xi[j];
}

void cu_add_rows_scaled(float *y, const int *idx, const float *x, const float *w, int n, int dim)
{
    if (n <= 0 || dim <= 0) return;
    cu_io io = {};
    cu_launch(add_rows_scaled_kernel, dim3(cu_blocks((size_t)dim, 256), (unsigned)n), 256, 0, y, idx, x, w, dim);
    cu_end(&io, "add_rows_scaled");
}

template <int F>
__global__ void embed_kernel(float *h, const void *__restrict__ e, const int32_t *__restrict__ tok, int row0, int rows,
                             int dim)
{
    cu_pdl_wait();
    cu_pdl_launch();
    int i = blockIdx.y, r = tok[i] - row0;
    float *hi = h + (size_t)i * dim;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < dim; j += gridDim.x * blockDim.x)
        hi[j] = r < 0 || r >= rows ? 0.0f : cu_wload<F>(e, (size_t)r * dim + j);
}

static void cu_embed(float *h, const ds_weight *emb, const int32_t *tok, int n, int row0)
{
    if (n <= 0) return;
    cu_io io = {};
    cu_weight dw;
    const int32_t *dt = (const int32_t *)cu_in(&io, tok, sizeof(int32_t) * (size_t)n);
    float *dh = (float *)cu_out(&io, h, sizeof(float) * (size_t)n * emb->cols, false);
    if (dt && dh && cu_weight_get(emb, &dw)) {
        dim3 grid(cu_blocks((size_t)emb->cols, 256), (unsigned)n);
        if (emb->fmt == DS_W_BF16) cu_launch(embed_kernel<DS_W_BF16>, grid, 256, 0, dh, dw.data, dt, row0, emb->rows, emb->cols);
        else cu_launch(embed_kernel<DS_W_F32>, grid, 256, 0, dh, dw.data, dt, row0, emb->rows, emb->cols);
    }
    cu_end(&io, "embed");
}

/* ---- pick_rows: the next token of each row, a cluster of PICK_C blocks of 1024 per
 * row, each block on a slice of it: what sampler.c's sampler_pick_u makes of it.
 * Greedy (temperature <= 0): (value, index) pairs reduce so that the larger value wins
 * and equal ones go to the lower index; NaNs never win, and a NaN in column 0 stands
 * (sampler_argmax's rules).
 * Otherwise the weights are e = exp((x - max) / T), 0 more than SAMPLER_CUT below (a
 * NaN included), and the pick is the inverse CDF at u of the kept tokens' weights, ids
 * ascending (pick_draw).
 * The row is read several times, so every pass loads float4s with several in flight
 * per thread (with one float at a time a single block's pass was latency-bound, ~50 us
 * at V3's vocabulary), and a cluster spreads the passes over PICK_C SMs: the blocks
 * combine their argmaxes, sums and histograms through distributed shared memory.
 * With top-k or top-p the kept tokens are the first ones in the order probability
 * (p = e / total) descending, then id ascending, up to the first where their count
 * reaches k or their mass reaches top_p. That order is the key (p's float bits, then
 * V - 1 - id) descending, and a radix select finds the last kept key: each level
 * histograms the next digit of the keys that share the digits fixed so far (counts and
 * masses) and takes the largest digit at which the limit is met. The first level's
 * digit is the host's bucket (p's bits >> 19: its exponent field e and the top 4 of
 * its 23 fraction bits); when that bucket holds at most PICK_LIST tokens they move to
 * rank 0's shared memory for the later levels, else rank 0 reads the whole row again
 * for each. The draw then weighs the kept tokens by p.
 * Masses add exactly, in any order, with 32-bit shared atomics only (64-bit ones are
 * compare-and-swap loops, which contend): within a bucket every p is its 24-bit
 * significand times 2^(e - 150), so a set's mass there is its count times the bucket's
 * base significand plus the sum of the 19 low bits, kept as two sums (bits 10..18 and
 * 0..9) that cannot overflow. For comparing with top_p a mass becomes a fixed point
 * number, units of 2^-62 (exact where p >= 2^-39). */
#define PICK_MAXN 64
#define PICK_CUT (-40.0f)              /* SAMPLER_CUT */
#define PICK_BINS 2048                 /* the first level: p's float bits >> 19, p <= 1 */
#define PICK_LIST 2560                 /* a first-level bucket's tokens in shared memory */
#define PICK_FIX 4611686018427387904.0 /* 2^62: top_p in the masses' fixed point */
#define PICK_C 8                       /* blocks per row: a cluster, each on a slice */

struct pick_args {
    ds_pick p[PICK_MAXN];
    int hoff[PICK_MAXN];  /* row i's penalised tokens: hd[hoff[i]] .. (p[i].n_hist of them) */
    const int32_t *hd;
};

struct pick_smem {
    unsigned cnt[PICK_BINS], shi[PICK_BINS], slo[PICK_BINS]; /* count, sums of bits 10..18 and 0..9 */
    unsigned long long key[PICK_LIST];
    double sd[33];
    float sv[32];
    int si[32];
    int dig;
    unsigned cb;
    unsigned long long vb;
    /* exchanged across the cluster, each written once: this block's argmax, its sums;
     * and in rank 0 the results that every block reads */
    float xbv;
    int xbi;
    double xsum, xpart;
    int best, pick, last, n_list, listed;
    float mx;
    unsigned long long kmin;
};

/* Row r's weights and keys: for a logit v of token j, e = exp((v - mx) / T) with the
 * cut, p = e x inv. A block reads the groups of four tokens [g0, g1) (its slice of the
 * row, ids ascending across the cluster's ranks). */
struct pick_row {
    const float *r;
    float mx, inv_t, inv;
    int V, ib; /* ib: the bits of V - 1 */
    bool al;   /* r is 16-byte aligned: float4 loads */
    int g0, g1;
    __device__ float e(float v) const /* __expf: ~2e-6 relative at z = -40, far inside what a draw resolves */
    {
        float z = (v - mx) * inv_t;
        return z >= PICK_CUT ? __expf(z) : 0.0f;
    }
    __device__ float p(float v) const { return e(v) * inv; }
    __device__ unsigned long long key(float pj, int j) const
    {
        return (unsigned long long)__float_as_uint(pj) << ib | (unsigned)(V - 1 - j);
    }
    /* the logits j .. j + 3, NaN past the end (a NaN never wins and weighs nothing) */
    __device__ float4 load4(int j) const
    {
        if (al && j + 3 < V) return *(const float4 *)(r + j);
        float4 a;
        a.x = j < V ? r[j] : NAN;
        a.y = j + 1 < V ? r[j + 1] : NAN;
        a.z = j + 2 < V ? r[j + 2] : NAN;
        a.w = j + 3 < V ? r[j + 3] : NAN;
        return a;
    }
    /* f(j, v) for every token of the slice, in no particular order: each thread takes
     * every blockDim.x-th group, four groups' loads in flight at a time */
    template <typename F>
    __device__ void each(F f) const
    {
        int g = g0 + (int)threadIdx.x, nt = (int)blockDim.x;
        for (; g + 3 * nt < g1; g += 4 * nt) {
            float4 a[4];
            #pragma unroll
            for (int u = 0; u < 4; u++) a[u] = load4(4 * (g + u * nt));
            #pragma unroll
            for (int u = 0; u < 4; u++) {
                int j = 4 * (g + u * nt);
                f(j, a[u].x);
                f(j + 1, a[u].y);
                f(j + 2, a[u].z);
                f(j + 3, a[u].w);
            }
        }
        for (; g < g1; g += nt) {
            float4 a = load4(4 * g);
            f(4 * g, a.x);
            f(4 * g + 1, a.y);
            f(4 * g + 2, a.z);
            f(4 * g + 3, a.w);
        }
    }
};

__device__ __forceinline__ void argmax_pair(float &bv, int &bi, float ov, int oi)
{
    if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
    }
}

/* The exclusive prefix of v over the block's threads in order; *total: the sum. */
__device__ double pick_scan(double v, pick_smem &s, double *total)
{
    int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = (int)blockDim.x / 32;
    double incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        double t = __shfl_up_sync(~0u, incl, o);
        if (l >= o) incl += t;
    }
    __syncthreads(); /* s.sd free */
    if (l == 31) s.sd[w] = incl;
    __syncthreads();
    if (!w) {
        double t = l < nw ? s.sd[l] : 0, ti = t;
        for (int o = 1; o < 32; o <<= 1) {
            double q = __shfl_up_sync(~0u, ti, o);
            if (l >= o) ti += q;
        }
        s.sd[l] = ti - t;
        if (l == 31) s.sd[32] = ti;
    }
    __syncthreads();
    *total = s.sd[32];
    return s.sd[w] + incl - v;
}

/* The mass of a set of tokens of bucket b whose significands sum to sig, in units of
 * 2^-62 (truncated where p < 2^-39). */
__device__ __forceinline__ unsigned long long pick_fixed(int b, unsigned long long sig)
{
    int sh = (b >> 4) - 88;
    return sh >= 0 ? sig << sh : sig >> min(-sh, 63);
}

/* A radix level's histogram into s: among the keys whose bits above sh + dw equal pre,
 * the digit (key >> sh) & (2^dw - 1), counted with the sums of bits 10..18 and 0..9
 * of p's significand. each(f) calls f(key) for every token of the source with p > 0.
 * Every thread of the block calls. */
template <typename Each>
__device__ void pick_hist(pick_smem &s, Each each, int ib, int sh, int dw, unsigned long long pre)
{
    int nb = 1 << dw;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        s.cnt[b] = 0;
        s.shi[b] = 0;
        s.slo[b] = 0;
    }
    __syncthreads();
    each([&](unsigned long long key) {
        if (key >> (sh + dw) != pre) return;
        int d = (int)(key >> sh) & (nb - 1);
        unsigned r = (unsigned)(key >> ib) & 0x7FFFF;
        atomicAdd(&s.cnt[d], 1u);
        atomicAdd(&s.shi[d], r >> 10);
        atomicAdd(&s.slo[d], r & 1023);
    });
    __syncthreads();
}

/* The largest digit of s's histogram (2^dw bins) whose tokens, with those of the
 * larger digits and those counted before (cb, and mb or sb), reach k or P. bucket < 0:
 * the first level, whose digits are buckets (mb: the fixed point mass before them);
 * else every token is of that bucket (mb: the mass of the buckets above it, sb: the
 * significands before this level in it). Returns it (cb and mb or sb advanced past
 * the larger digits), or -1 where none reaches a limit. Every thread of the block
 * calls. */
__device__ int pick_digit(pick_smem &s, int dw, int bucket, unsigned k, unsigned long long P, unsigned &cb,
                          unsigned long long &mb, unsigned long long &sb)
{
    int nb = 1 << dw;
    if (threadIdx.x < 32) { /* lane l: the l-th segment of bins from the top */
        bool first = bucket < 0;
        /* a bin's value: its mass (first level), else its significands' sum */
        auto val = [&](int b) {
            int bk = first ? b : bucket;
            unsigned long long sig = (unsigned long long)s.cnt[b] * ((16 + (bk & 15)) << 19) +
                                     ((unsigned long long)s.shi[b] << 10) + s.slo[b];
            return first ? pick_fixed(bk, sig) : sig;
        };
        int l = threadIdx.x, seg = nb >= 32 ? nb / 32 : 1, top = nb - 1 - l * seg, n = l < nb ? seg : 0;
        unsigned c = 0;
        unsigned long long v = 0;
        for (int i = 0; i < n; i++) {
            c += s.cnt[top - i];
            v += val(top - i);
        }
        unsigned ci = c;
        unsigned long long vi = v;
        for (int o = 1; o < 32; o <<= 1) {
            unsigned tc = __shfl_up_sync(~0u, ci, o);
            unsigned long long tv = __shfl_up_sync(~0u, vi, o);
            if (l >= o) {
                ci += tc;
                vi += tv;
            }
        }
        unsigned ca = cb + (ci - c);
        unsigned long long va = (first ? mb : sb) + (vi - v);
        int found = -1;
        for (int i = 0; i < n; i++) {
            int b = top - i;
            unsigned nc = ca + s.cnt[b];
            unsigned long long nv = va + val(b);
            if (s.cnt[b] && (nc >= k || (first ? nv : mb + pick_fixed(bucket, nv)) >= P)) {
                found = b;
                break;
            }
            ca = nc;
            va = nv;
        }
        unsigned hit = __ballot_sync(~0u, found >= 0);
        if (hit && l == __ffs(hit) - 1) {
            s.dig = found;
            s.cb = ca;
            s.vb = va;
        }
        if (!hit && !l) s.dig = -1;
    }
    __syncthreads();
    int d = s.dig;
    if (d >= 0) {
        cb = s.cb;
        (bucket < 0 ? mb : sb) = s.vb;
    }
    __syncthreads(); /* s.dig read before a later level writes it */
    return d;
}

/* The key of the last token kept (0: all of them, where neither limit is met), in
 * every block of the cluster. Level 1 histograms each block's slice; rank 0 merges
 * them and finds the bucket; the bucket's tokens move to rank 0's list when they fit,
 * and rank 0 runs the later levels on the list, or else on the whole row. Every
 * thread of the cluster calls. */
__device__ unsigned long long pick_select(pick_smem &s, cg::cluster_group &cl, const pick_row &R, int top_k,
                                          float top_p)
{
    int rank = (int)cl.block_rank();
    unsigned k = top_k > 0 ? (unsigned)top_k : UINT_MAX, cb = 0;
    unsigned long long P = top_p < 1 ? (unsigned long long)((double)top_p * PICK_FIX) : ULLONG_MAX, mb = 0, sb = 0;
    auto slice = [&](auto f) {
        R.each([&](int j, float v) {
            float p = R.p(v);
            if (p > 0) f(R.key(p, j));
        });
    };
    int rem = 19 + R.ib; /* the key's bits below the first level's digit */
    pick_hist(s, slice, R.ib, rem, 11, 0);
    cl.sync(); /* every slice's histogram done */
    if (rank == 0) {
        for (int b = threadIdx.x; b < PICK_BINS; b += blockDim.x) {
            unsigned c = 0, hi = 0, lo = 0;
            for (int q = 0; q < PICK_C; q++) {
                c += cl.map_shared_rank(s.cnt, q)[b];
                hi += cl.map_shared_rank(s.shi, q)[b];
                lo += cl.map_shared_rank(s.slo, q)[b];
            }
            s.cnt[b] = c;
            s.shi[b] = hi;
            s.slo[b] = lo;
        }
        __syncthreads();
        int d = pick_digit(s, 11, -1, k, P, cb, mb, sb);
        if (!threadIdx.x) {
            s.n_list = 0;
            s.kmin = 0; /* d < 0: all kept */
            for (int q = 0; q < PICK_C; q++) {
                *cl.map_shared_rank(&s.dig, q) = d;
                *cl.map_shared_rank(&s.listed, q) = d >= 0 && s.cnt[d] <= PICK_LIST;
            }
        }
    }
    cl.sync(); /* the bucket known everywhere; the other ranks' histograms read */
    int b = s.dig;
    bool listed = s.listed;
    unsigned long long pre = (unsigned long long)b;
    if (b >= 0 && listed) {
        int *nl = cl.map_shared_rank(&s.n_list, 0);
        unsigned long long *keys = cl.map_shared_rank(s.key, 0);
        slice([&](unsigned long long key) {
            if (key >> rem == pre) keys[atomicAdd(nl, 1)] = key;
        });
    }
    cl.sync(); /* rank 0's list complete */
    if (rank == 0 && b >= 0) {
        auto list = [&](auto f) {
            for (int i = threadIdx.x; i < s.n_list; i += blockDim.x) f(s.key[i]);
        };
        pick_row W = R; /* the whole row */
        W.g0 = 0;
        W.g1 = (R.V + 3) / 4;
        auto row = [&](auto f) {
            W.each([&](int j, float v) {
                float p = W.p(v);
                if (p > 0) f(W.key(p, j));
            });
        };
        while (rem > 0) {
            int dw = min(8, rem);
            rem -= dw;
            if (listed) pick_hist(s, list, R.ib, rem, dw, pre);
            else pick_hist(s, row, R.ib, rem, dw, pre);
            int d = pick_digit(s, dw, b, k, P, cb, mb, sb);
            /* d >= 0: the prefix's tokens met the limit, and their masses add exactly */
            pre = pre << dw | (unsigned long long)max(d, 0);
        }
        if (!threadIdx.x)
            for (int q = 0; q < PICK_C; q++) *cl.map_shared_rank(&s.kmin, q) = pre;
    }
    cl.sync(); /* the key known everywhere */
    return b >= 0 ? s.kmin : 0;
}

/* The inverse CDF at u of the weights w(j, logit), ids ascending (see above), in rank
 * 0's s.pick; best where the total is not a finite number >= floor. Each block sums
 * its slice, warp w a contiguous range of it, 128 tokens a step (four a lane,
 * coalesced); the cluster's block sums and a block scan of the warps' sums find the
 * block and warp where u x the total falls, and that warp walks its range the same
 * way: a step's lane sums, a warp scan, then the one lane's four tokens. Every thread
 * of the cluster calls. */
template <typename W>
__device__ void pick_draw(pick_smem &s, cg::cluster_group &cl, const pick_row &R, W w, double u, double floor,
                          int best)
{
    int wp = threadIdx.x / 32, l = threadIdx.x % 32, nw = (int)blockDim.x / 32, V = R.V;
    int b0 = min(V, 4 * R.g0), b1 = min(V, 4 * R.g1);
    int per = (b1 - b0 + nw * 128 - 1) / (nw * 128) * 128, j0 = min(b1, b0 + wp * per), j1 = min(b1, j0 + per);
    double part = 0;
    int last = -1;
    for (int jb = j0; jb < j1; jb += 512) { /* four steps' loads in flight */
        float4 a[4];
        #pragma unroll
        for (int q = 0; q < 4; q++) {
            int j = jb + 128 * q + 4 * l;
            a[q] = jb + 128 * q < j1 && j < j1 ? R.load4(j) : make_float4(NAN, NAN, NAN, NAN);
        }
        #pragma unroll
        for (int q = 0; q < 4; q++) {
            int j = jb + 128 * q + 4 * l;
            float e[4] = {w(j, a[q].x), w(j + 1, a[q].y), w(j + 2, a[q].z), w(j + 3, a[q].w)};
            #pragma unroll
            for (int t = 0; t < 4; t++) {
                part += j + t < j1 ? e[t] : 0.0f;
                last = e[t] > 0 && j + t < j1 ? j + t : last;
            }
        }
    }
    for (int o = 16; o; o >>= 1) {
        part += __shfl_xor_sync(~0u, part, o);
        last = max(last, __shfl_xor_sync(~0u, last, o));
    }
    /* the warps' sums, one per warp, scanned in warp order; the block's */
    double btotal, pre = pick_scan(l == 0 ? part : 0.0, s, &btotal);
    pre = __shfl_sync(~0u, pre, 0);
    if (!l) atomicMax(cl.map_shared_rank(&s.last, 0), last);
    if (!threadIdx.x) s.xpart = btotal;
    cl.sync(); /* every block's sum */
    double total = 0, bpre = 0;
    for (int q = 0; q < PICK_C; q++) {
        double t = *cl.map_shared_rank(&s.xpart, q);
        bpre += q < (int)cl.block_rank() ? t : 0.0;
        total += t;
    }
    if (!(total >= floor && total < INFINITY)) { /* a NaN or an infinite logit */
        if (!cl.block_rank() && !threadIdx.x) s.pick = best;
        return;
    }
    double target = u * total;
    pre += bpre;
    if (target >= pre && target < pre + part) { /* this warp's range */
        double c = pre;
        for (int jb = j0; jb < j1; jb += 128) {
            int j = jb + 4 * l;
            float4 a = j < j1 ? R.load4(j) : make_float4(NAN, NAN, NAN, NAN);
            float e[4] = {w(j, a.x), w(j + 1, a.y), w(j + 2, a.z), w(j + 3, a.w)};
            for (int t = 0; t < 4; t++) e[t] = j + t < j1 ? e[t] : 0.0f;
            double ls = (double)e[0] + e[1] + e[2] + e[3], incl = ls;
            for (int o = 1; o < 32; o <<= 1) {
                double t = __shfl_up_sync(~0u, incl, o);
                if (l >= o) incl += t;
            }
            double step = __shfl_sync(~0u, incl, 31);
            if (target < c + step) { /* in this step: the first lane whose sum passes it */
                unsigned in = __ballot_sync(~0u, target < c + incl);
                if (l == __ffs(in) - 1) {
                    double cc = c + incl - ls;
                    int got = -1;
                    for (int t = 0; t < 4 && got < 0; t++) {
                        cc += e[t];
                        got = target < cc ? j + t : got;
                    }
                    for (int t = 3; t >= 0 && got < 0; t--) /* rounding: the lane's last weighted token */
                        got = e[t] > 0 ? j + t : got;
                    atomicMin(cl.map_shared_rank(&s.pick, 0), got);
                }
                break;
            }
            c += step;
        }
    }
}

__global__ void __launch_bounds__(1024) pick_rows_kernel(int32_t *out, float *x, int V, pick_args a)
{
    cu_pdl_wait();
    cu_pdl_launch();
    cg::cluster_group cl = cg::this_cluster();
    int rank = (int)cl.block_rank(), row = (int)blockIdx.x / PICK_C;
    float *r = x + (size_t)row * V; /* not __restrict__: the penalty writes it, the passes read it */
    __shared__ pick_smem s;
    const ds_pick pk = a.p[row];
    int ng = (V + 3) / 4, gs = (ng + PICK_C - 1) / PICK_C;
    pick_row R = {r, 0.0f, 1.0f / pk.temperature, 1.0f, V, V > 1 ? 32 - __clz(V - 1) : 1, ((uintptr_t)r & 15) == 0,
                  min(ng, rank * gs), min(ng, (rank + 1) * gs)};
    if (!threadIdx.x) {
        s.pick = INT_MAX;
        s.last = -1;
    }
    if (pk.n_hist > 0) { /* sampler_penalise on this block's slice: the tokens are distinct */
        const int32_t *h = a.hd + a.hoff[row];
        for (int i = threadIdx.x; i < pk.n_hist; i += blockDim.x) {
            int t = h[i];
            if (t < 4 * R.g0 || t >= 4 * R.g1 || t >= V) continue;
            float v = r[t];
            r[t] = v > 0 ? v / pk.penalty : v * pk.penalty;
        }
        __syncthreads();
    }
    int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = (int)blockDim.x / 32;
    float bv = -INFINITY;
    int bi = INT_MAX;
    R.each([&](int j, float v) { argmax_pair(bv, bi, v, j); });
    for (int o = 16; o; o >>= 1) argmax_pair(bv, bi, __shfl_down_sync(~0u, bv, o), __shfl_down_sync(~0u, bi, o));
    if (!l) {
        s.sv[w] = bv;
        s.si[w] = bi;
    }
    __syncthreads();
    if (!w) {
        bv = l < nw ? s.sv[l] : -INFINITY;
        bi = l < nw ? s.si[l] : INT_MAX;
        for (int o = 16; o; o >>= 1) argmax_pair(bv, bi, __shfl_down_sync(~0u, bv, o), __shfl_down_sync(~0u, bi, o));
        if (!l) {
            s.xbv = bv;
            s.xbi = bi;
        }
    }
    cl.sync(); /* every slice's argmax (and penalty) done */
    if (!threadIdx.x) { /* the row's: NaNs never win, a NaN in column 0 stands */
        float v = -INFINITY;
        int i = INT_MAX;
        for (int q = 0; q < PICK_C; q++) argmax_pair(v, i, *cl.map_shared_rank(&s.xbv, q), *cl.map_shared_rank(&s.xbi, q));
        bool nan0 = r[0] != r[0];
        s.best = nan0 || i == INT_MAX ? 0 : i;
        s.mx = nan0 || i == INT_MAX ? r[0] : v;
    }
    __syncthreads();
    int best = s.best;
    R.mx = s.mx;
    if (!(pk.temperature > 0)) {
        if (!rank && !threadIdx.x) s.pick = best;
    } else if (!(pk.top_k > 0 || pk.top_p < 1)) {
        pick_draw(s, cl, R, [&](int, float v) { return R.e(v); }, pk.u, 1.0, best);
    } else {
        double part = 0, tot;
        R.each([&](int, float v) { part += R.e(v); });
        pick_scan(part, s, &tot);
        if (!threadIdx.x) s.xsum = tot;
        cl.sync(); /* every slice's sum */
        double total = 0;
        for (int q = 0; q < PICK_C; q++) total += *cl.map_shared_rank(&s.xsum, q);
        if (total >= 1 && total < INFINITY) { /* the same in every block */
            R.inv = 1.0f / (float)total;
            unsigned long long kmin = pick_select(s, cl, R, pk.top_k, pk.top_p);
            pick_draw(
                s, cl, R,
                [&](int j, float v) {
                    float p = R.p(v);
                    return p > 0 && R.key(p, j) >= kmin ? p : 0.0f;
                },
                pk.u, 0.0, best);
        } else if (!rank && !threadIdx.x) {
            s.pick = best;
        }
    }
    cl.sync(); /* the picks in rank 0; no block reads another's memory after this */
    /* no step took it (u x total past the end by rounding): the last token with weight */
    if (!rank && !threadIdx.x) out[row] = s.pick != INT_MAX ? s.pick : s.last >= 0 ? s.last : best;
}

static void cu_pick_rows(int32_t *host_out, float *x, int n, int V, const ds_pick *p)
{
    if (n <= 0 || V <= 0) return;
    size_t nh = 0;
    for (int i = 0; p && i < n; i++) nh += p[i].n_hist > 0 ? (size_t)p[i].n_hist : 0;
    int32_t *d = (int32_t *)cu_alloc(sizeof(int32_t) * ((size_t)n + nh)), *hs = nh ? (int32_t *)malloc(sizeof(int32_t) * nh) : NULL;
    if (!d || (nh && !hs)) { /* cu_alloc recorded its failure */
        if (d) cu_check(cudaErrorMemoryAllocation, "pick_rows: host memory for the penalised tokens");
        cu_free(d);
        return;
    }
    cu_zero(d, sizeof(int32_t) * (size_t)n);
    for (int i = 0, o = 0; i < n && nh; i++)
        if (p[i].n_hist > 0) {
            memcpy(hs + o, p[i].hist, sizeof(int32_t) * (size_t)p[i].n_hist);
            o += p[i].n_hist;
        }
    if (nh) cu_upload(d + n, hs, sizeof(int32_t) * nh);
    free(hs);
    int off = 0;
    for (int i0 = 0; i0 < n; i0 += PICK_MAXN) {
        int m = min(PICK_MAXN, n - i0);
        pick_args a = {};
        a.hd = d + n;
        for (int i = 0; i < m; i++) {
            a.p[i] = p ? p[i0 + i] : ds_pick{0.0f, 0, 1.0f, 0.0, 1.0f, 0, NULL};
            a.hoff[i] = off;
            off += a.p[i].n_hist > 0 ? a.p[i].n_hist : 0;
        }
        cu_launch_cluster(pick_rows_kernel, dim3((unsigned)m * PICK_C), dim3(1024), PICK_C, 0, d + i0, x + (size_t)i0 * V, V,
                          a);
    }
    cu_download(host_out, d, sizeof(int32_t) * (size_t)n);
    cu_free(d);
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

/* ---- the table */

static ds_ops g_ops;

extern "C" const ds_ops *cuda_backend(void)
{
    int n = cuda_device_count();
    if (n == 0) {
        ds_errorf(DS_ERR_UNSUPPORTED, "cuda: no CUDA device (or no usable driver)");
        return NULL;
    }
    if (!g_ops.name) {
        cudaError_t e = cudaSetDevice(0);
        if (e != cudaSuccess) {
            ds_errorf(DS_ERR_UNSUPPORTED, "cuda: cannot use device 0: %s", cudaGetErrorString(e));
            return NULL;
        }
        g_ops.alloc = cu_alloc_zeroed;
        g_ops.alloc_scratch = cu_alloc;
        g_ops.free = cu_free;
        g_ops.matmul = cu_matmul;
        g_ops.matmul_many = cu_matmul_many;
        g_ops.matmul_many_normed = cu_matmul_many_normed;
        g_ops.matmul_carry = cu_matmul_carry;
        g_ops.matmul_t = cu_matmul_t;
        g_ops.rmsnorm = cu_rmsnorm;
        g_ops.rope = cu_rope;
        g_ops.attention = cu_attention;
        g_ops.silu_mul = cu_silu_mul;
        g_ops.add = cu_add;
        g_ops.upload = cu_upload;
        g_ops.download = cu_download;
        g_ops.pick_rows = cu_pick_rows;
        g_ops.sync = cu_sync;
        g_ops.zero = cu_zero;
        g_ops.copy_rows = cu_copy_rows;
        g_ops.add_rows_scaled = cu_add_rows_scaled;
        g_ops.embed = cu_embed;
        g_ops.matmul_heads = cu_matmul_heads;
        g_ops.matmul_heads_t = cu_matmul_heads_t;
        g_ops.moe_route = cu_moe_route;
        g_ops.moe_gate = cu_moe_gate;
        g_ops.moe_experts = cu_moe_experts;
        g_ops.upload_weight = cu_upload_weight;
        g_ops.rmsnorm_rows = cu_rmsnorm_rows;
        g_ops.rope_copy = cu_rope_copy;
        g_ops.mla_prologue = cu_mla_prologue;
        g_ops.mla_attend = cu_mla_attend;
        /* one pass up to 8192 tokens: on the H200 (16B, FP8) a 4761-token prompt prefilled
         * at 17.2k tok/s in one pass, 15.0k in passes of 2048, 13.0-13.8k in 1024 (session 22) */
        g_ops.prefill_tokens = 8192;
        cu_graph_ops(&g_ops);
        if (!cu_check(cudaStreamCreateWithFlags(&cu_s, cudaStreamNonBlocking), "creating the stream")) return NULL;
        g_ops.name = "cuda";
    }
    return &g_ops;
}
