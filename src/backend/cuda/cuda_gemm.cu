/* cuda_gemm.cu - the products of the CUDA backend: matmul (F32, BF16 and FP8
 * block-scaled weights against float32 activations), matmul_many (the products of
 * one input in one launch), matmul_many_normed / matmul_carry (the attention norm and
 * residual folded into them), matmul_t, the per-head products of absorb attention
 * (matmul_heads, matmul_heads_t), the FP8 GEMM path's act_quant, and the cuBLAS forms
 * of the prefill products; also the machine's ceilings for dsv3 bench.
 *
 * Decode (n <= 8 tokens) is bound by the weights' bytes, read once per call:
 *   gemv:  one block of 4 (or 8) warps per 4 weight rows (1 row for short matrices,
 *          4x the blocks), the warps splitting K; each lane reads 16 bytes of each row
 *          at a time (4 F32, 8 BF16 or 16 FP8 weights) and applies them to every
 *          token; rows not a multiple of 16 bytes take a scalar-load form. Blocks of
 *          the first wave load their first weights before the PDL wait.
 *   gemv_mma: 2..8 tokens of BF16 / FP8 weights on the tensor cores (mma.sync), where
 *          the gemvs' activation reads would outgrow the weights'.
 * Prefill (n >= 16): the tensor cores, float32 activations split into bf16 hi + lo
 * (or rounded once, gemm_bf16): BF16 weights by cuBLAS, FP8 ones by cu_dense_fp8_tc
 * (cuda_grouped.cu); 9..15 tokens and the shapes those refuse: the tiled kernel
 * (64 x 64 outputs a block on the CUDA cores). The FP8 GEMM path quantises x by
 * act_quant (1 x 128 blocks, e4m3) and takes the codes to gq / gwq_kernel
 * (cuda_grouped.cu) or to the same gemv / tiled kernels, partial sums scaled by
 * s_x s_w once per 128-block, as the reference's fp8_gemm does.
 * Tested by tests/cuda/test_cuda_ops.c (test_matmul*, test_heads*, test_many_case,
 * test_norm_fold, test_gemv_mma, test_fp8_golden: against the CPU backend and the
 * reference's Triton kernels' outputs). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"

/* Prefill products (n >= BLAS_MIN tokens, exact-dequantisation path) go to
 * the tensor cores: the float32 activations are split into bf16 hi + lo
 * (x - hi), the lo half accumulated onto the hi product (beta = 1), which keeps ~16
 * bits of the activations. gemm_bf16 takes a single bf16 pass (as HF
 * transformers): measured on the tiny golden model it misses the golden tests'
 * bar at prefill (s200: cosine 0.70 on some rows: near-tied expert choices flip
 * and the change spreads through attention), so it is not the default.
 * BF16 weights: cuBLAS. FP8 weights: cu_dense_fp8_tc (cuda_grouped.cu, e4m3
 * exact in bf16, block scales on partial sums) when k % 16 == 0; else, in the
 * bf16 mode, dequantised to bf16 for cuBLAS, in split mode the tiled kernel. */
#define BLAS_MIN 16

#define GEMV_NMAX 8
#define GEMV_WARPS 4
#define GEMV_ROWS 4
#define GEMV_PF_BLOCKS 2048   /* gemv blocks resident at once (16 of 128 threads per SM) */
#define GEMV_SMALL_BLOCKS 264 /* fewer blocks of GEMV_ROWS than 2 per SM: one row per block */
#define TILE_M 64
#define TILE_N 64
#define TILE_K 32

/* ---- act_quant: per 128-block of a row, s = max(amax, 1e-4) / 448, y = e4m3(x / s) */

__device__ float act_scale(float amax, bool ue8m0)
{
    if (!(amax >= 1e-4f)) amax = 1e-4f;
    float s = amax * (1.0f / 448.0f); /* the reciprocal, as Triton folds it (quant.c) */
    if (ue8m0) {
        int e;
        float m = frexpf(s, &e);
        s = m == 0.5f ? s : ldexpf(1.0f, e);
    }
    return s;
}

/* One warp per (row, block). Row i of y and s is row list[i] of x (row i without a
 * list); with total_d, the device's count of rows replaces m (the grid covers m). */
__global__ void act_quant_kernel(const float *__restrict__ x, const int *__restrict__ list,
                                 const int *__restrict__ total_d, int m, int k, uint8_t *__restrict__ y,
                                 float *__restrict__ s, bool ue8m0)
{
    cu_pdl_wait();
    cu_pdl_launch();
    int gw = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    if (total_d) m = min(m, *total_d);
    if (gw >= m * kb) return;
    int i = gw / kb, b = gw % kb, k0 = b * DS_BLOCK, k1 = min(k0 + DS_BLOCK, k);
    const float *xi = x + (size_t)(list ? list[i] : i) * k;
    float amax = 0;
    for (int j = k0 + lane; j < k1; j += 32) amax = fmaxf(amax, fabsf(xi[j]));
    amax = cu_warp_max(amax);
    float sc = act_scale(amax, ue8m0);
    if (lane == 0) s[(size_t)i * kb + b] = sc;
    for (int j = k0 + lane; j < k1; j += 32)
        y[(size_t)i * k + j] = (uint8_t)__nv_cvt_float_to_fp8(xi[j] / sc, __NV_SATFINITE, __NV_E4M3);
}

/* cu_fake_quant's kernel: one warp per (row, block) of x, then of x2; the same
 * scale and rounding as act_quant_kernel. y may alias x: a warp reads its block
 * before writing it. */
__global__ void fake_quant_kernel(float *y, const float *x, int m, int k, float *y2, const float *x2, int m2, int k2,
                                  bool ue8m0)
{
    cu_pdl_wait();
    cu_pdl_launch();
    int gw = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK, kb2 = (k2 + DS_BLOCK - 1) / DS_BLOCK;
    if (gw >= m * kb) { /* the second matrix */
        gw -= m * kb;
        y = y2;
        x = x2;
        k = k2;
        kb = kb2;
        m = m2;
        if (gw >= m * kb) return;
    }
    int i = gw / kb, b = gw % kb, k0 = b * DS_BLOCK, k1 = min(k0 + DS_BLOCK, k);
    const float *xi = x + (size_t)i * k;
    float *yi = y + (size_t)i * k;
    float amax = 0;
    for (int j = k0 + lane; j < k1; j += 32) amax = fmaxf(amax, fabsf(xi[j]));
    amax = cu_warp_max(amax);
    float sc = act_scale(amax, ue8m0);
    for (int j = k0 + lane; j < k1; j += 32)
        yi[j] = cu_e4m3((uint8_t)__nv_cvt_float_to_fp8(xi[j] / sc, __NV_SATFINITE, __NV_E4M3)) * sc;
}

void cu_fake_quant(float *y, const float *x, int m, int k, float *y2, const float *x2, int m2, int k2, bool ue8m0)
{
    size_t warps = (size_t)m * ((k + DS_BLOCK - 1) / DS_BLOCK) + (size_t)m2 * ((k2 + DS_BLOCK - 1) / DS_BLOCK);
    if (warps) cu_launch(fake_quant_kernel, cu_blocks(warps * 32, 256), 256, 0, y, x, m, k, y2, x2, m2, k2, ue8m0);
}

/* ---- gemv: y[i][r] = sum_k x[i][k] W[row0 + r][k] for i < n <= 8 */

/* Activations i .. i+E of a token: float32, or (QA) e4m3 bytes without their scale. */
template <bool QA, bool VEC, int E>
__device__ __forceinline__ void xload(const void *x, size_t i, float *out)
{
    if (QA) {
        const uint8_t *p = (const uint8_t *)x + i;
        if (VEC && E == 16) {
            cu_wload16<DS_W_FP8>(p, 0, out);
        } else {
            #pragma unroll
            for (int e = 0; e < E; e++) out[e] = cu_e4m3(p[e]);
        }
    } else {
        const float *p = (const float *)x + i;
        if (VEC) {
            #pragma unroll
            for (int e = 0; e < E; e += 4) {
                float4 v = *(const float4 *)(p + e);
                out[e] = v.x;
                out[e + 1] = v.y;
                out[e + 2] = v.z;
                out[e + 3] = v.w;
            }
        } else {
            #pragma unroll
            for (int e = 0; e < E; e++) out[e] = p[e];
        }
    }
}

/* The raw 16 bytes (VEC) or one element at element index i of a weight. */
template <int F, bool VEC>
__device__ __forceinline__ uint4 wraw(const void *w, size_t i)
{
    if (VEC) return *(const uint4 *)((const uint8_t *)w + i * cu_wsize<F>::v);
    uint4 u = {0, 0, 0, 0};
    if (F == DS_W_F32) u.x = ((const uint32_t *)w)[i];
    else if (F == DS_W_BF16) u.x = ((const uint16_t *)w)[i];
    else u.x = ((const uint8_t *)w)[i];
    return u;
}

/* The E elements held in raw (see wraw) as float32. */
template <int F, int E>
__device__ __forceinline__ void wdecode(uint4 raw, float *out)
{
    if (E > 1) {
        cu_wload16<F>(&raw, 0, out);
    } else if (F == DS_W_F32) {
        out[0] = __uint_as_float(raw.x);
    } else if (F == DS_W_BF16) {
        out[0] = cu_bf16((uint16_t)raw.x);
    } else {
        out[0] = cu_e4m3((uint8_t)raw.x);
    }
}

/* One block of GEMV_WARPS warps per GEMV_ROWS weight rows, the warps splitting
 * K. Each activation chunk is loaded once and applied to GEMV_ROWS rows, so
 * activation traffic (4 bytes per FP8 weight byte per token) is divided by
 * GEMV_ROWS, and each lane keeps GEMV_ROWS 16-byte weight loads in flight.
 * F: weight format; QA: x is act_quant output (e4m3 bytes + xs scales), F == FP8;
 * VEC: 16-byte loads (K * size(F) % 16 == 0 and x 16-byte aligned).
 * NRM (one token, not XR): x is the residual stream h and the product's input is
 * rmsnorm(h + nr) * ng (eps) as rmsnorm_rows makes it, never stored: each block sums the
 * squares of h + nr over the chunks it loads anyway and scales its sums by the rms at the end.
 * carry (may be NULL): carry[o] += y[o] before y[o] is overwritten (the residual add of y's
 * previous contents, by the thread that owns the element). */
template <int F, bool QA, bool VEC, int NT, int RW, bool XR, int WP, bool NRM = false>
__device__ __forceinline__ void gemv_tile(float *__restrict__ y, const void *__restrict__ x,
                                          const float *__restrict__ xs, int n, const void *__restrict__ w,
                                          const float *__restrict__ ws, int k, int row0, int rows, int tile, bool pf,
                                          const float *__restrict__ nr = nullptr, const float *__restrict__ ng = nullptr,
                                          float eps = 0, float *carry = nullptr)
{
    static_assert(!NRM || (NT == 1 && !XR && !QA && VEC), "gemv_tile: the fused norm takes one token, float32 x");
    float ss = 0; /* NRM: this thread's share of the sum of squares */
    constexpr int E = VEC ? 16 / cu_wsize<F>::v : 1;
    __shared__ float red[WP][RW][NT];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int r0 = tile * RW, kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    size_t base[RW];
    const float *srow[RW];
    #pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        int gr = row0 + min(r0 + rr, rows - 1); /* past the end: repeat the last row, never written */
        base[rr] = (size_t)gr * k;
        srow[rr] = F == DS_W_FP8 ? ws + (size_t)(gr / DS_BLOCK) * kb : nullptr;
    }
    /* the weights do not depend on the previous kernel (pf: the launch fits in one wave):
     * a thread's first step into registers and the rest of rows longer than one pass
     * towards L2 while it drains (PDL); then wait for its outputs */
    uint4 raw[RW];
    float s[RW];
    bool pre = pf && threadIdx.x * E < k;
    if (pre)
        #pragma unroll
        for (int rr = 0; rr < RW; rr++) {
            raw[rr] = wraw<F, VEC>(w, base[rr] + threadIdx.x * E);
            s[rr] = F == DS_W_FP8 ? srow[rr][threadIdx.x * E / DS_BLOCK] : 1.0f;
        }
    if (pf && k > WP * 32 * E)
        cu_prefetch_l2((const uint8_t *)w + base[0] * cu_wsize<F>::v, (size_t)min(RW, rows - r0) * k * cu_wsize<F>::v);
    cu_pdl_wait();
    cu_pdl_launch();
    float acc[RW][NT];
    #pragma unroll
    for (int rr = 0; rr < RW; rr++)
        #pragma unroll
        for (int i = 0; i < NT; i++) acc[rr][i] = 0;
    for (int c = threadIdx.x * E; c < k; c += WP * 32 * E) {
        if (!pre || c != threadIdx.x * E)
            #pragma unroll
            for (int rr = 0; rr < RW; rr++) {
                raw[rr] = wraw<F, VEC>(w, base[rr] + c);
                s[rr] = F == DS_W_FP8 ? srow[rr][c / DS_BLOCK] : 1.0f;
            }
        if (XR) { /* every token's chunk in registers, each weight row decoded once */
            float xv[NT][E];
            #pragma unroll
            for (int i = 0; i < NT; i++)
                if (i < n) xload<QA, VEC, E>(x, (size_t)i * k + c, xv[i]);
            #pragma unroll
            for (int rr = 0; rr < RW; rr++) {
                float wv[E];
                wdecode<F, E>(raw[rr], wv);
                #pragma unroll
                for (int i = 0; i < NT; i++) {
                    if (i >= n) break;
                    float part = 0;
                    #pragma unroll
                    for (int e = 0; e < E; e++) part += xv[i][e] * wv[e];
                    acc[rr][i] += part;
                }
            }
        } else {
            float wv[RW][E]; /* each row decoded once, then applied to every token's chunk */
            #pragma unroll
            for (int rr = 0; rr < RW; rr++) wdecode<F, E>(raw[rr], wv[rr]);
            #pragma unroll
            for (int i = 0; i < NT; i++) {
                if (i >= n) break;
                float xv[E];
                xload<QA, VEC, E>(x, (size_t)i * k + c, xv);
                if (NRM) { /* (h + r) * g, and its squares */
                    float rv[E], gv[E];
                    xload<false, true, E>(nr, c, rv);
                    xload<false, true, E>(ng, c, gv);
                    #pragma unroll
                    for (int e = 0; e < E; e++) {
                        float v = xv[e] + rv[e];
                        ss += v * v;
                        xv[e] = v * gv[e];
                    }
                }
                float xsc = QA ? xs[(size_t)i * kb + c / DS_BLOCK] : 1.0f;
                #pragma unroll
                for (int rr = 0; rr < RW; rr++) {
                    float part = 0;
                    #pragma unroll
                    for (int e = 0; e < E; e++) part += xv[e] * wv[rr][e];
                    if (QA) part *= xsc;
                    acc[rr][i] += F == DS_W_FP8 ? part * s[rr] : part;
                }
            }
        }
    }
    #pragma unroll
    for (int rr = 0; rr < RW; rr++)
        #pragma unroll
        for (int i = 0; i < NT; i++) {
            if (i >= n) break;
            float v = cu_warp_sum(acc[rr][i]);
            if (lane == 0) red[warp][rr][i] = v;
        }
    __shared__ float red_ss[NRM ? WP : 1];
    if (NRM) {
        float v = cu_warp_sum(ss);
        if (lane == 0) red_ss[warp] = v;
    }
    __syncthreads();
    float rs = 1.0f;
    if (NRM) {
        float t = 0;
        #pragma unroll
        for (int wi = 0; wi < WP; wi++) t += red_ss[wi];
        rs = rsqrtf(t / k + eps);
    }
    for (int o = threadIdx.x; o < RW * n; o += blockDim.x) {
        int rr = o % RW, i = o / RW;
        if (r0 + rr >= rows) continue;
        float v = 0;
        #pragma unroll
        for (int wi = 0; wi < WP; wi++) v += red[wi][rr][i];
        size_t at = (size_t)i * rows + r0 + rr;
        if (carry) carry[at] += y[at];
        y[at] = NRM ? v * rs : v;
    }
}

/* One product: block b computes rows b * RW .. + RW of it. */
template <int F, bool QA, bool VEC, int NT, int RW, bool XR, int WP = GEMV_WARPS>
__global__ void __launch_bounds__(WP * 32)
gemv_kernel(float *__restrict__ y, const void *__restrict__ x, const float *__restrict__ xs, int n,
            const void *__restrict__ w, const float *__restrict__ ws, int k, int row0, int rows, bool pf, float *carry)
{
    gemv_tile<F, QA, VEC, NT, RW, XR, WP>(y, x, xs, n, w, ws, k, row0, rows, blockIdx.x, pf, nullptr, nullptr, 0, carry);
}

/* Up to GEMV_JOBS products of the same weight format and token count (float32
 * activations, 16-byte loads) in one launch (matmul_many): job j takes blocks
 * b0[j] .. b0[j + 1] - 1, each of RW rows of its own product. */
#define GEMV_JOBS 4

struct gemv_jobs {
    float *y[GEMV_JOBS];
    const void *x[GEMV_JOBS];
    const void *w[GEMV_JOBS];
    const float *ws[GEMV_JOBS]; /* FP8 block scales, else NULL */
    int k[GEMV_JOBS], row0[GEMV_JOBS], rows[GEMV_JOBS];
    int b0[GEMV_JOBS + 1]; /* first block of each job; b0[nj]: the grid */
    int nj;
    const float *nr, *ng; /* the fused norm (gemv_many_kernel's NRM): x[j] is h */
    float eps;
};

template <int F, int NT, int RW, bool XR, int WP = GEMV_WARPS, bool NRM = false>
__global__ void __launch_bounds__(WP * 32) gemv_many_kernel(const gemv_jobs t, int n, bool pf)
{
    int j = 0, b = (int)blockIdx.x;
    while (j + 1 < t.nj && b >= t.b0[j + 1]) j++;
    gemv_tile<F, false, true, NT, RW, XR, WP, NRM>(t.y[j], t.x[j], nullptr, n, t.w[j], t.ws[j], t.k[j], t.row0[j],
                                                   t.rows[j], b - t.b0[j], pf, t.nr, t.ng, t.eps);
}

/* ---- 2..8 tokens on the tensor cores (gemv_mma_kernel): at 8 tokens the
 * gemvs above do 8 FMAs per weight and their activation reads outgrow the weights' (FP8
 * wq + wkv_a ran at 346 GB/s, the BF16 head at 1060). Here mma.m16n8k16 takes 16 weight
 * rows (A) against the 8 token columns (B): a block of GM_WARPS warps takes a 16-row tile,
 * its warps interleaving steps of k. In a step, lane (g = lane / 4, c = lane % 4) loads
 * 16 bytes of rows g and g + 8 at k0 + c E (E values per 16 bytes), the same four k
 * values of each row feed A's slots 2c, 2c + 1, 2c + 8, 2c + 9 of one mma (k order inside
 * an mma is free), and B's token-g column takes x[g] at those k.
 * FP8: codes to f16 by the hardware pair conversion (exact); x as f16 high + low parts
 * of x 2^e, e per (token, step) from the step's largest |x| (so nothing overflows f16),
 * 22 bits in all; each step's sum is scaled by the rows' block scales and 2^-e.
 * BF16: x as three bf16 parts (24 bits). Sums of a step go to float32 registers. */
#define GM_WARPS 4
#define GM_AHEAD 2 /* steps loaded ahead of the one in use, per warp */

__device__ __forceinline__ uint32_t gm_bf16x2(float a, float b)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* One step's products of a lane: wa, wb its 16 bytes of rows g and g + 8, xv its token's
 * E values of x at the same k; d the step's sums (rows g, g + 8; tokens 2c, 2c + 1). */
template <int F>
__device__ __forceinline__ void gm_step(float *d, uint4 wa, uint4 wb, const float *xv, float *inv)
{
    uint32_t ua[4] = {wa.x, wa.y, wa.z, wa.w}, ub[4] = {wb.x, wb.y, wb.z, wb.w};
    if (F == DS_W_FP8) {
        float m = 0;
        #pragma unroll
        for (int e = 0; e < 16; e++) m = fmaxf(m, fabsf(xv[e]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        /* 2^sh with m 2^sh in [2^14, 2^15): f16 holds it, and its low part keeps 11 more bits */
        int ex = m > 0 ? (int)((__float_as_uint(m) >> 23) & 0xff) - 127 : 0, sh = min(max(14 - ex, -100), 100);
        float sc = __uint_as_float((uint32_t)(127 + sh) << 23);
        *inv = __uint_as_float((uint32_t)(127 - sh) << 23);
        #pragma unroll
        for (int j = 0; j < 4; j++) {
            float v[4], lo[4];
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                v[e] = xv[4 * j + e] * sc;
                lo[e] = v[e] - __half2float(__float2half_rn(v[e]));
            }
            uint32_t a0 = cu_e4m3x2(ua[j], 0), a2 = cu_e4m3x2(ua[j], 1);
            uint32_t a1 = cu_e4m3x2(ub[j], 0), a3 = cu_e4m3x2(ub[j], 1);
            cu_mma<false>(d, a0, a1, a2, a3, cu_f16x2(v[0], v[1]), cu_f16x2(v[2], v[3]));
            cu_mma<false>(d, a0, a1, a2, a3, cu_f16x2(lo[0], lo[1]), cu_f16x2(lo[2], lo[3]));
        }
    } else {
        *inv = 1.0f;
        #pragma unroll
        for (int j = 0; j < 2; j++) {
            float hi[4], mid[4], lo[4];
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = xv[4 * j + e];
                hi[e] = __bfloat162float(__float2bfloat16_rn(x));
                mid[e] = __bfloat162float(__float2bfloat16_rn(x - hi[e]));
                lo[e] = x - hi[e] - mid[e];
            }
            uint32_t a0 = ua[2 * j], a2 = ua[2 * j + 1], a1 = ub[2 * j], a3 = ub[2 * j + 1];
            cu_mma<true>(d, a0, a1, a2, a3, gm_bf16x2(hi[0], hi[1]), gm_bf16x2(hi[2], hi[3]));
            cu_mma<true>(d, a0, a1, a2, a3, gm_bf16x2(mid[0], mid[1]), gm_bf16x2(mid[2], mid[3]));
            cu_mma<true>(d, a0, a1, a2, a3, gm_bf16x2(lo[0], lo[1]), gm_bf16x2(lo[2], lo[3]));
        }
    }
}

/* Rows tile * 16 .. + 16 of one product for n <= 8 tokens (k % (4 E) == 0, 16-byte
 * aligned rows and x). */
template <int F>
__device__ __forceinline__ void gm_tile(float *__restrict__ y, const float *__restrict__ x, int n,
                                        const void *__restrict__ w, const float *__restrict__ ws, int k, int row0,
                                        int rows, int tile)
{
    constexpr int E = 16 / cu_wsize<F>::v, SK = 4 * E;
    __shared__ float red[GM_WARPS][16][8];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4, r0 = tile * 16;
    int ra = row0 + min(r0 + g, rows - 1), rb = row0 + min(r0 + g + 8, rows - 1), steps = k / SK;
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    const uint8_t *pa = (const uint8_t *)w + ((size_t)ra * k + c * E) * cu_wsize<F>::v;
    const uint8_t *pb = (const uint8_t *)w + ((size_t)rb * k + c * E) * cu_wsize<F>::v;
    const size_t sb = (size_t)SK * cu_wsize<F>::v; /* bytes per step */
    /* the first steps' weights before the PDL wait: they depend on no kernel */
    uint4 qa[GM_AHEAD + 1], qb[GM_AHEAD + 1];
    #pragma unroll
    for (int i = 0; i < GM_AHEAD; i++) {
        int s = warp + i * GM_WARPS;
        qa[i] = qb[i] = make_uint4(0, 0, 0, 0);
        if (s < steps) {
            qa[i] = *(const uint4 *)(pa + s * sb);
            qb[i] = *(const uint4 *)(pb + s * sb);
        }
    }
    cu_pdl_wait();
    cu_pdl_launch();
    const float *xg = x + (size_t)min(g, n - 1) * k + c * E;
    float tot[4] = {0, 0, 0, 0};
    for (int s = warp; s < steps; s += GM_WARPS) {
        int sn = s + GM_AHEAD * GM_WARPS;
        qa[GM_AHEAD] = qb[GM_AHEAD] = make_uint4(0, 0, 0, 0);
        if (sn < steps) {
            qa[GM_AHEAD] = *(const uint4 *)(pa + sn * sb);
            qb[GM_AHEAD] = *(const uint4 *)(pb + sn * sb);
        }
        float xv[E];
        #pragma unroll
        for (int e = 0; e < E; e += 4) {
            float4 v = g < n ? *(const float4 *)(xg + (size_t)s * SK + e) : make_float4(0, 0, 0, 0);
            xv[e] = v.x, xv[e + 1] = v.y, xv[e + 2] = v.z, xv[e + 3] = v.w;
        }
        float d[4] = {0, 0, 0, 0}, inv;
        gm_step<F>(d, qa[0], qb[0], xv, &inv);
        if (F == DS_W_FP8) { /* the rows' block scales; tokens 2c, 2c + 1's 2^-e */
            float i0 = __shfl_sync(0xffffffffu, inv, 8 * c), i1 = __shfl_sync(0xffffffffu, inv, 8 * c + 4);
            float fa = ws[(size_t)(ra / DS_BLOCK) * kb + s * SK / DS_BLOCK];
            float fb = ws[(size_t)(rb / DS_BLOCK) * kb + s * SK / DS_BLOCK];
            tot[0] += d[0] * fa * i0;
            tot[1] += d[1] * fa * i1;
            tot[2] += d[2] * fb * i0;
            tot[3] += d[3] * fb * i1;
        } else {
            #pragma unroll
            for (int i = 0; i < 4; i++) tot[i] += d[i];
        }
        #pragma unroll
        for (int i = 0; i < GM_AHEAD; i++) {
            qa[i] = qa[i + 1];
            qb[i] = qb[i + 1];
        }
    }
    red[warp][g][2 * c] = tot[0];
    red[warp][g][2 * c + 1] = tot[1];
    red[warp][g + 8][2 * c] = tot[2];
    red[warp][g + 8][2 * c + 1] = tot[3];
    __syncthreads();
    for (int o = threadIdx.x; o < 16 * 8; o += blockDim.x) {
        int rr = o / 8, t = o % 8;
        if (t >= n || r0 + rr >= rows) continue;
        float v = 0;
        #pragma unroll
        for (int wi = 0; wi < GM_WARPS; wi++) v += red[wi][rr][t];
        y[(size_t)t * rows + r0 + rr] = v;
    }
}

/* The products of t in one launch, a 16-row tile per block (b0: tiles). */
template <int F>
__global__ void __launch_bounds__(GM_WARPS * 32) gemv_mma_kernel(const gemv_jobs t, int n)
{
    int j = 0, b = (int)blockIdx.x;
    while (j + 1 < t.nj && b >= t.b0[j + 1]) j++;
    gm_tile<F>(t.y[j], (const float *)t.x[j], n, t.w[j], t.ws[j], t.k[j], t.row0[j], t.rows[j], b - t.b0[j]);
}

/* True when gemv_mma_kernel takes the jobs of t (filled up to b0) at n tokens: FP8 or BF16
 * weights, 2..8 tokens, k a multiple of a step, 16-byte aligned rows and activations. */
static bool gemv_mma_ok(int fmt, const gemv_jobs *t, int n)
{
    if (n < 2 || n > 8 || (fmt != DS_W_FP8 && fmt != DS_W_BF16)) return false;
    int sk = fmt == DS_W_FP8 ? 64 : 32, sz = fmt == DS_W_FP8 ? 1 : 2;
    for (int j = 0; j < t->nj; j++)
        if (t->k[j] % sk || (size_t)t->k[j] * sz % 16 || (uintptr_t)t->x[j] % 16 || (uintptr_t)t->w[j] % 16)
            return false;
    return true;
}

static void launch_gemv_mma(int fmt, gemv_jobs *t, int n)
{
    t->b0[0] = 0;
    for (int j = 0; j < t->nj; j++) t->b0[j + 1] = t->b0[j] + (int)cu_blocks((size_t)t->rows[j], 16);
    dim3 grid((unsigned)t->b0[t->nj]);
    if (fmt == DS_W_FP8) cu_launch(gemv_mma_kernel<DS_W_FP8>, grid, GM_WARPS * 32, 0, *t, n);
    else cu_launch(gemv_mma_kernel<DS_W_BF16>, grid, GM_WARPS * 32, 0, *t, n);
}

/* ---- tiled: the same product for n > 8, 64 x 64 outputs per block of 256 threads */

template <int F, bool QA>
__global__ void __launch_bounds__(256)
tiled_kernel(float *__restrict__ y, const void *__restrict__ x, const float *__restrict__ xs, int n,
             const void *__restrict__ w, const float *__restrict__ ws, int k, int row0, int rows)
{
    __shared__ float as[TILE_K][TILE_M + 4]; /* x tile, transposed: as[k][token] */
    __shared__ float bs[TILE_K][TILE_N + 4]; /* weight tile, transposed: bs[k][row] */
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    int i0 = blockIdx.y * TILE_M, r0 = blockIdx.x * TILE_N, kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    float acc[4][4], part[4][4];
    #pragma unroll
    for (int a = 0; a < 4; a++)
        #pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b] = part[a][b] = 0;
    for (int k0 = 0; k0 < k; k0 += TILE_K) {
        for (int e = threadIdx.x; e < TILE_M * TILE_K; e += blockDim.x) {
            int i = e / TILE_K, kk = e % TILE_K, gi = i0 + i, gk = k0 + kk;
            float v = 0;
            if (gi < n && gk < k)
                v = QA ? cu_e4m3(((const uint8_t *)x)[(size_t)gi * k + gk]) : ((const float *)x)[(size_t)gi * k + gk];
            as[kk][i] = v;
        }
        for (int e = threadIdx.x; e < TILE_N * TILE_K; e += blockDim.x) {
            int r = e / TILE_K, kk = e % TILE_K, gr = r0 + r, gk = k0 + kk;
            float v = 0;
            if (gr < rows && gk < k) {
                v = cu_wload<F>(w, (size_t)(row0 + gr) * k + gk);
                /* bf16 path: exact dequantisation, as cpu_dequant_row */
                if (F == DS_W_FP8 && !QA) v *= ws[(size_t)((row0 + gr) / DS_BLOCK) * kb + gk / DS_BLOCK];
            }
            bs[kk][r] = v;
        }
        __syncthreads();
        #pragma unroll 8
        for (int kk = 0; kk < TILE_K; kk++) {
            float av[4], bv[4];
            #pragma unroll
            for (int a = 0; a < 4; a++) av[a] = as[kk][ty * 4 + a];
            #pragma unroll
            for (int b = 0; b < 4; b++) bv[b] = bs[kk][tx * 4 + b];
            #pragma unroll
            for (int a = 0; a < 4; a++)
                #pragma unroll
                for (int b = 0; b < 4; b++) part[a][b] += av[a] * bv[b];
        }
        __syncthreads();
        /* FP8 path: close the 128-block with both scales */
        if (QA && ((k0 + TILE_K) % DS_BLOCK == 0 || k0 + TILE_K >= k)) {
            int b0 = k0 / DS_BLOCK;
            #pragma unroll
            for (int a = 0; a < 4; a++)
                #pragma unroll
                for (int b = 0; b < 4; b++) {
                    int gi = i0 + ty * 4 + a, gr = r0 + tx * 4 + b;
                    if (gi < n && gr < rows)
                        acc[a][b] += part[a][b] * xs[(size_t)gi * kb + b0] * ws[(size_t)((row0 + gr) / DS_BLOCK) * kb + b0];
                    part[a][b] = 0;
                }
        }
    }
    #pragma unroll
    for (int a = 0; a < 4; a++)
        #pragma unroll
        for (int b = 0; b < 4; b++) {
            int gi = i0 + ty * 4 + a, gr = r0 + tx * 4 + b;
            if (gi < n && gr < rows) y[(size_t)gi * rows + gr] = QA ? acc[a][b] : part[a][b];
        }
}

/* ---- launchers */

/* NT: tokens the kernel is compiled for (n rounded up), so registers match the
 * batch; RW rows per block: 4 shares each activation load among 4 rows.
 * XR (BF16 / F32 weights, 3..8 tokens): every token's activation chunk held in
 * registers (NT x 8 floats at most) and each row decoded once, 4 rows per block
 * (one row per block at n = 8 ran the dense gemvs at ~550 GB/s).
 * FP8 weights at 3..8 tokens: the 4 rows' 16 codes widened once and held, each
 * token's chunk loaded in turn (one row per block read the activations once per
 * row). Only act_quant inputs (QA) at 3..8 tokens keep one row per block. */
template <int F, bool QA, int NT>
struct gemv_cfg {
    static constexpr bool XR = NT > 2 && F != DS_W_FP8 && !QA;
    static constexpr int RW = NT <= 2 || XR || (F == DS_W_FP8 && !QA) ? GEMV_ROWS : 1;
};

enum gemv_form { GEMV_ONE_ROW, GEMV_8_WARPS, GEMV_4_WARPS };


/* The kernel shape for a grid of nb blocks of RW rows (all the products of the
 * launch together); *pf: what of the rows to load before the PDL wait (gemv_tile). */
static gemv_form gemv_choose(int F, int NT, int RW, bool vec, unsigned nb, bool *pf)
{
    /* short matrices (the 64-row gate, 576-row wkv_a: 16 and 144 blocks of 4 rows) take
     * one row per block, 4x the blocks; every block loads its rows before waiting for the
     * previous kernel (PDL) */
    if (RW > 1 && nb < GEMV_SMALL_BLOCKS) {
        *pf = true;
        return GEMV_ONE_ROW;
    }
    *pf = nb <= GEMV_PF_BLOCKS; /* later waves start after the wait: nothing to overlap */
    /* 8 warps per block at 1..2 tokens with BF16 / F32 weights, so a row of <= 2048 BF16
     * weights is one pass of 16-byte loads per thread (4 warps: two passes). Measured: BF16
     * batch 1 3.70 -> 3.66 ms; FP8 batch 1 3.56 -> 3.67 and the 8-token (XR) kernels 9.0
     * -> 11.1 ms at batch 8, so neither takes it */
    return vec && NT <= 2 && F != DS_W_FP8 ? GEMV_8_WARPS : GEMV_4_WARPS;
}

template <int F, bool QA, int NT>
static void launch_gemv(float *y, const void *x, const float *xs, int n, const cu_weight *w, int k, int row0,
                        int rows, float *carry = nullptr)
{
    constexpr bool XR = gemv_cfg<F, QA, NT>::XR;
    constexpr int RW = gemv_cfg<F, QA, NT>::RW;
    bool vec = (size_t)k * cu_wsize<F>::v % 16 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)w->data % 16 == 0;
    bool pf;
    gemv_form f = gemv_choose(F, NT, RW, vec, cu_blocks((size_t)rows, RW), &pf);
    dim3 grid(cu_blocks((size_t)rows, f == GEMV_ONE_ROW ? 1 : RW));
    if (f == GEMV_ONE_ROW) {
        if (vec) cu_launch(gemv_kernel<F, QA, true, NT, 1, XR>, grid, GEMV_WARPS * 32, 0, y, x, xs, n, w->data, w->scale, k, row0, rows, pf, carry);
        else cu_launch(gemv_kernel<F, QA, false, NT, 1, XR>, grid, GEMV_WARPS * 32, 0, y, x, xs, n, w->data, w->scale, k, row0, rows, pf, carry);
    } else if (f == GEMV_8_WARPS) {
        cu_launch(gemv_kernel<F, QA, true, NT, RW, XR, 8>, grid, 8 * 32, 0, y, x, xs, n, w->data, w->scale, k, row0, rows, pf, carry);
    } else if (vec) {
        cu_launch(gemv_kernel<F, QA, true, NT, RW, XR>, grid, GEMV_WARPS * 32, 0, y, x, xs, n, w->data, w->scale, k, row0, rows, pf, carry);
    } else {
        cu_launch(gemv_kernel<F, QA, false, NT, RW, XR>, grid, GEMV_WARPS * 32, 0, y, x, xs, n, w->data, w->scale, k, row0, rows, pf, carry);
    }
}

/* The products of t (each vec, see launch_gemv; t.k .. t.rows filled) in one launch of
 * gemv_many_kernel; the blocks per job and the kernel shape as launch_gemv picks them
 * for the rows of all the jobs together. */
template <int F, int NT, bool NRM = false>
static void launch_gemv_many(gemv_jobs *t, int n)
{
    constexpr bool XR = gemv_cfg<F, false, NT>::XR;
    constexpr int RW = gemv_cfg<F, false, NT>::RW;
    unsigned nb = 0;
    for (int j = 0; j < t->nj; j++) nb += cu_blocks((size_t)t->rows[j], RW);
    bool pf;
    gemv_form f = gemv_choose(F, NT, RW, true, nb, &pf);
    int rw = f == GEMV_ONE_ROW ? 1 : RW;
    t->b0[0] = 0;
    for (int j = 0; j < t->nj; j++) t->b0[j + 1] = t->b0[j] + (int)cu_blocks((size_t)t->rows[j], rw);
    dim3 grid((unsigned)t->b0[t->nj]);
    if (f == GEMV_ONE_ROW) cu_launch(gemv_many_kernel<F, NT, 1, XR, GEMV_WARPS, NRM>, grid, GEMV_WARPS * 32, 0, *t, n, pf);
    else if (f == GEMV_8_WARPS) cu_launch(gemv_many_kernel<F, NT, RW, XR, 8, NRM>, grid, 8 * 32, 0, *t, n, pf);
    else cu_launch(gemv_many_kernel<F, NT, RW, XR, GEMV_WARPS, NRM>, grid, GEMV_WARPS * 32, 0, *t, n, pf);
}

template <int F, bool QA>
static void launch_product(float *y, const void *x, const float *xs, int n, const cu_weight *w, int k, int row0,
                           int rows)
{
    if (!QA && n >= 2 && n <= 8) { /* the tensor cores when they take it */
        gemv_jobs t = {};
        t.y[0] = y;
        t.x[0] = x;
        t.w[0] = w->data;
        t.ws[0] = w->scale;
        t.k[0] = k;
        t.row0[0] = row0;
        t.rows[0] = rows;
        t.nj = 1;
        if (gemv_mma_ok(F, &t, n)) {
            launch_gemv_mma(F, &t, n);
            return;
        }
    }
    if (n == 1) {
        launch_gemv<F, QA, 1>(y, x, xs, n, w, k, row0, rows);
    } else if (n == 2) {
        launch_gemv<F, QA, 2>(y, x, xs, n, w, k, row0, rows);
    } else if (n <= 4) {
        launch_gemv<F, QA, 4>(y, x, xs, n, w, k, row0, rows);
    } else if (n <= GEMV_NMAX) {
        launch_gemv<F, QA, GEMV_NMAX>(y, x, xs, n, w, k, row0, rows);
    } else {
        dim3 grid(cu_blocks((size_t)rows, TILE_N), cu_blocks((size_t)n, TILE_M));
        tiled_kernel<F, QA><<<grid, 256, 0, cu_s>>>(y, x, xs, n, w->data, w->scale, k, row0, rows);
    }
}

/* x (device) -> y e4m3 [m][k] and s [m][kb], both device. */
void cu_act_quant_rows(const float *x, const int *list, const int *total_d, int m, int k, uint8_t *y, float *s,
                       bool ue8m0)
{
    size_t warps = (size_t)m * ((k + DS_BLOCK - 1) / DS_BLOCK);
    cu_launch(act_quant_kernel, cu_blocks(warps * 32, 256), 256, 0, x, list, total_d, m, k, y, s, ue8m0);
}

static void launch_act_quant(const float *x, int m, int k, uint8_t *y, float *s, bool ue8m0)
{
    cu_act_quant_rows(x, NULL, NULL, m, k, y, s, ue8m0);
}

static cublasHandle_t g_blas;
static int g_split = -1;

__global__ void split_bf16_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *__restrict__ x, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
    hi[i] = h;
    if (lo) lo[i] = __float2bfloat16_rn(x[i] - __bfloat162float(h));
}

/* split_bf16_kernel four elements a thread: n4 float4s of x */
__global__ void split_bf16x4_kernel(uint2 *hi, uint2 *lo, const float4 *__restrict__ x, size_t n4)
{
    cu_pdl_wait();
    cu_pdl_launch();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 v = x[i];
    uint2 h, l;
    h.x = bf16x2_split(v.x, v.y, lo ? &l.x : NULL);
    h.y = bf16x2_split(v.z, v.w, lo ? &l.y : NULL);
    hi[i] = h;
    if (lo) lo[i] = l;
}

/* x (n floats) -> bf16 hi (and lo, the remainders, when lo), four a thread where sizes
 * and alignment allow */
static void launch_split_bf16(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *x, size_t n)
{
    if (n % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)hi % 8 == 0 && (uintptr_t)lo % 8 == 0)
        cu_launch(split_bf16x4_kernel, cu_blocks(n / 4, 256), 256, 0, (uint2 *)hi, (uint2 *)lo, (const float4 *)x, n / 4);
    else
        split_bf16_kernel<<<cu_blocks(n, 256), 256, 0, cu_s>>>(hi, lo, x, n);
}

__global__ void dequant_bf16_kernel(__nv_bfloat16 *out, const uint8_t *__restrict__ w, const float *__restrict__ s,
                                    int row0, int rows, int cols)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols) return;
    int r = row0 + (int)(i / cols), c = (int)(i % cols), cb = (cols + DS_BLOCK - 1) / DS_BLOCK;
    out[i] = __float2bfloat16_rn(cu_e4m3(w[(size_t)r * cols + c]) * s[(size_t)(r / DS_BLOCK) * cb + c / DS_BLOCK]);
}

__global__ void sum_halves_kernel(float *y, const float *__restrict__ y2, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = y2[i] + y2[n + i];
}

static bool blas_ready(void)
{
    if (!g_blas) {
        if (cublasCreate(&g_blas) != CUBLAS_STATUS_SUCCESS) return false;
        cublasSetStream(g_blas, cu_s);
    }
    g_split = cu_gemm_split(); /* read each time: the tuning may change between ops */
    return true;
}

cublasHandle_t cu_blas(void) { return blas_ready() ? g_blas : NULL; }

static int g_force_split; /* cu_gemm_force_split's nesting */

bool cu_gemm_split(void)
{
    return g_force_split > 0 || !cu_tune.gemm_bf16;
}

void cu_gemm_force_split(bool on) { g_force_split += on ? 1 : -1; }

/* ---- the FP8 tensor cores' rate for the machine's ceilings (cuda_measure_fp8_tc_peak):
 * cuBLASLt's e4m3 x e4m3 product, bf16 out, per-tensor scales, the sums kept in the tensor
 * cores (fast accumulation: the FP8 units' own rate). cuBLASLt 13's block-scaled form
 * (1 x 128 and 128 x 128 float scales) did not run at 8192^3 on the H200, with either
 * operand as the weights and bf16 or float32 out. */

#define LT_WS_BYTES ((size_t)32 << 20)

/* One product's descriptors and the heuristic's algorithm, made before any timing. */
typedef struct {
    cublasLtHandle_t lt;
    void *ws;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} lt_fp8;

static void lt_fp8_free(lt_fp8 *e)
{
    if (e->d) cublasLtMatrixLayoutDestroy(e->d);
    if (e->b) cublasLtMatrixLayoutDestroy(e->b);
    if (e->a) cublasLtMatrixLayoutDestroy(e->a);
    if (e->op) cublasLtMatmulDescDestroy(e->op);
    if (e->lt) cublasLtDestroy(e->lt);
    cudaFree(e->ws);
    *e = lt_fp8{};
}

/* d (m x n, bf16) = a^T b for e4m3 a (k x m) and b (k x n), both K-major; false (e freed)
 * where cuBLASLt has no algorithm for it. */
static bool lt_fp8_make(lt_fp8 *e, int m, int n, int k)
{
    *e = lt_fp8{};
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int8_t fast = 1;
    size_t wsb = LT_WS_BYTES;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t h = {};
    int found = 0;
    bool ok = cublasLtCreate(&e->lt) == CUBLAS_STATUS_SUCCESS && cudaMalloc(&e->ws, LT_WS_BYTES) == cudaSuccess &&
              cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast) ==
                  CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&e->a, CUDA_R_8F_E4M3, k, m, k) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&e->b, CUDA_R_8F_E4M3, k, n, k) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&e->d, CUDA_R_16BF, m, n, m) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb) ==
                  CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulAlgoGetHeuristic(e->lt, e->op, e->a, e->b, e->d, e->d, pref, 1, &h, &found) ==
                  CUBLAS_STATUS_SUCCESS &&
              found > 0;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ok) e->algo = h.algo;
    else {
        cudaGetLastError();
        lt_fp8_free(e);
    }
    return ok;
}

static bool lt_fp8_run(lt_fp8 *e, void *d, const uint8_t *a, const uint8_t *b)
{
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(e->lt, e->op, &one, a, e->a, b, e->b, &zero, d, e->d, d, e->d, &e->algo, e->ws, LT_WS_BYTES,
                          cu_s) == CUBLAS_STATUS_SUCCESS;
}

/* y (n, rows) = x (n, k) @ W[row0 : row0 + rows]^T through cuBLAS; false if it cannot (caller falls back). */
static bool blas_product(cu_io *io, float *y, const float *x, int n, const ds_weight *w, const cu_weight *dw, int k,
                         int row0, int rows)
{
    if (!blas_ready()) return false;
    size_t nx = (size_t)n * k;
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cu_tmp(io, sizeof(__nv_bfloat16) * nx * (g_split ? 2 : 1));
    const __nv_bfloat16 *wb;
    if (w->fmt == DS_W_BF16) {
        wb = (const __nv_bfloat16 *)dw->data + (size_t)row0 * k;
    } else {
        __nv_bfloat16 *t = (__nv_bfloat16 *)cu_tmp(io, sizeof(__nv_bfloat16) * (size_t)rows * k);
        if (!t) return false;
        dequant_bf16_kernel<<<cu_blocks((size_t)rows * k, 256), 256, 0, cu_s>>>(t, (const uint8_t *)dw->data, dw->scale,
                                                                                row0, rows, k);
        wb = t;
    }
    if (!xb) return false;
    launch_split_bf16(xb, g_split ? xb + nx : NULL, x, nx);
    const float one = 1.0f, zero = 0.0f;
    /* column-major: Y^T (rows x n) = W (k x rows)^T X^T (k x n), hi then (split) += the lo half */
    for (int half = 0; half < (g_split ? 2 : 1); half++) {
        cublasStatus_t st = cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, k, &one, wb, CUDA_R_16BF, k,
                                         xb + half * nx, CUDA_R_16BF, k, half ? &one : &zero, y, CUDA_R_32F, rows,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            cu_check(cudaErrorUnknown, "cublasGemmEx");
            return true;
        }
    }
    return true;
}

void cu_matmul(float *y, const float *x, int n, const ds_weight *w, int row0, int rows, ds_gemm_impl gemm,
               bool ue8m0)
{
    if (n <= 0 || rows <= 0) return;
    int k = w->cols, kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    cu_io io = {};
    cu_weight dw;
    const float *dx = (const float *)cu_in(&io, x, sizeof(float) * (size_t)n * k);
    float *dy = (float *)cu_out(&io, y, sizeof(float) * (size_t)n * rows, false);
    if (dx && dy && cu_weight_get(w, &dw)) {
        if (gemm == DS_GEMM_FP8 && w->fmt == DS_W_FP8) {
            uint8_t *xq = (uint8_t *)cu_tmp(&io, (size_t)n * k);
            float *xs = (float *)cu_tmp(&io, sizeof(float) * (size_t)n * kb);
            if (xq && xs) {
                launch_act_quant(dx, n, k, xq, xs, ue8m0);
                /* fp8_mma: the FP8 tensor cores on the codes (cuda_grouped.cu) */
                if (!(cu_tune.fp8_mma && n >= BLAS_MIN && k % 16 == 0 && row0 % 32 == 0 && (uintptr_t)dw.data % 16 == 0 &&
                      cu_dense_fp8q(dy, xq, xs, n, &dw, k, row0, rows)))
                    launch_product<DS_W_FP8, true>(dy, xq, xs, n, &dw, k, row0, rows);
            }
        } else if (n >= BLAS_MIN && w->fmt == DS_W_FP8 && k % 16 == 0 && row0 % 32 == 0 && (uintptr_t)dw.data % 16 == 0 &&
                   cu_device_readable(dx) && cu_device_readable(dy) && cu_dense_fp8_tc(dy, dx, n, &dw, k, row0, rows)) {
            /* tensor cores, exact e4m3 */
        } else if (n >= BLAS_MIN && blas_ready() && (w->fmt == DS_W_BF16 || (w->fmt == DS_W_FP8 && !g_split)) &&
                   blas_product(&io, dy, dx, n, w, &dw, k, row0, rows)) {
            /* tensor cores */
        } else if (w->fmt == DS_W_FP8) {
            launch_product<DS_W_FP8, false>(dy, dx, NULL, n, &dw, k, row0, rows);
        } else if (w->fmt == DS_W_BF16) {
            launch_product<DS_W_BF16, false>(dy, dx, NULL, n, &dw, k, row0, rows);
        } else {
            launch_product<DS_W_F32, false>(dy, dx, NULL, n, &dw, k, row0, rows);
        }
    }
    cu_end(&io, "matmul");
}

template <int F>
static void launch_many_fmt(gemv_jobs *t, int n)
{
    if (gemv_mma_ok(F, t, n)) {
        launch_gemv_mma(F, t, n);
        return;
    }
    if (n == 1) launch_gemv_many<F, 1>(t, n);
    else if (n == 2) launch_gemv_many<F, 2>(t, n);
    else if (n <= 4) launch_gemv_many<F, 4>(t, n);
    else launch_gemv_many<F, GEMV_NMAX>(t, n);
}

/* True when jobs can share one gemv launch: 1..GEMV_JOBS jobs of the same
 * 1..GEMV_NMAX tokens and weight format (on the FP8 GEMM path, their inputs
 * fake-quantised first). */
static bool many_fits(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm)
{
    if (n_jobs < 1 || n_jobs > GEMV_JOBS) return false;
    int n = jobs[0].n;
    ds_wfmt fmt = jobs[0].w->fmt;
    if (n < 1 || n > GEMV_NMAX) return false;
    for (int j = 1; j < n_jobs; j++)
        if (jobs[j].n != n || jobs[j].w->fmt != fmt) return false;
    return true;
}

void cu_matmul_many(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0)
{
    if (!many_fits(jobs, n_jobs, gemm)) {
        for (int j = 0; j < n_jobs; j++)
            cu_matmul(jobs[j].y, jobs[j].x, jobs[j].n, jobs[j].w, jobs[j].row0, jobs[j].rows, gemm, ue8m0);
        return;
    }
    int n = jobs[0].n;
    ds_wfmt fmt = jobs[0].w->fmt;
    size_t wsz = fmt == DS_W_F32 ? 4 : fmt == DS_W_BF16 ? 2 : 1;
    cu_io io = {};
    gemv_jobs t = {};
    cu_weight dw[GEMV_JOBS];
    const void *jobs_x[GEMV_JOBS]; /* the callers' inputs of the jobs taken */
    bool ok = true, vec = true;
    for (int j = 0; j < n_jobs && ok; j++) {
        const ds_matmul_job *jb = &jobs[j];
        if (jb->rows <= 0) continue; /* nothing to do, as cu_matmul */
        int k = jb->w->cols, i = t.nj;
        const void *dx = cu_in(&io, jb->x, sizeof(float) * (size_t)n * k);
        float *dy = (float *)cu_out(&io, jb->y, sizeof(float) * (size_t)n * jb->rows, false);
        ok = dx && dy && cu_weight_get(jb->w, &dw[i]);
        if (!ok) break;
        if (gemm == DS_GEMM_FP8 && fmt == DS_W_FP8) { /* act_quant's rounding, once per input */
            int same = -1;
            for (int p = 0; p < i && same < 0; p++)
                if (jobs_x[p] == jb->x && t.k[p] == k) same = p;
            jobs_x[i] = jb->x;
            if (same >= 0) {
                dx = t.x[same];
            } else {
                float *fx = (float *)cu_tmp(&io, sizeof(float) * (size_t)n * k);
                if (!(ok = fx != NULL)) break;
                cu_fake_quant(fx, (const float *)dx, n, k, NULL, NULL, 0, 0, ue8m0);
                dx = fx;
            }
        }
        /* launch_gemv's condition for 16-byte loads, on the device pointers */
        vec = vec && (size_t)k * wsz % 16 == 0 && (uintptr_t)dx % 16 == 0 && (uintptr_t)dw[i].data % 16 == 0;
        t.y[i] = dy;
        t.x[i] = dx;
        t.w[i] = dw[i].data;
        t.ws[i] = dw[i].scale;
        t.k[i] = k;
        t.row0[i] = jb->row0;
        t.rows[i] = jb->rows;
        t.nj++;
    }
    if (ok && vec && t.nj) {
        if (fmt == DS_W_FP8) launch_many_fmt<DS_W_FP8>(&t, n);
        else if (fmt == DS_W_BF16) launch_many_fmt<DS_W_BF16>(&t, n);
        else launch_many_fmt<DS_W_F32>(&t, n);
    } else if (ok) { /* scalar loads somewhere: one gemv per job, as cu_matmul at n <= 8 */
        for (int i = 0; i < t.nj; i++) {
            const float *dx = (const float *)t.x[i];
            if (fmt == DS_W_FP8) launch_product<DS_W_FP8, false>(t.y[i], dx, NULL, n, &dw[i], t.k[i], t.row0[i], t.rows[i]);
            else if (fmt == DS_W_BF16) launch_product<DS_W_BF16, false>(t.y[i], dx, NULL, n, &dw[i], t.k[i], t.row0[i], t.rows[i]);
            else launch_product<DS_W_F32, false>(t.y[i], dx, NULL, n, &dw[i], t.k[i], t.row0[i], t.rows[i]);
        }
    }
    cu_end(&io, "matmul_many");
}

/* ---- the attention norm folded into its products: at one token the q / kv_a products
 * read h and r and make rmsnorm(h + r) * g themselves (gemv_tile's NRM), and wo adds r to
 * h as it overwrites it (carry), so the step has one rmsnorm launch fewer a layer. Both
 * take device memory only. The norm fold takes BF16 weights only: BF16 batch 1 1.815 /
 * 1.808 -> 1.782 / 1.784 ms; FP8 1.400 / 1.401 -> 1.442 / 1.442 (in the trace the norm's
 * 2.4 us a layer went, but the q / kv_a launch, now started while moe_down still holds
 * the SMs, moved the step's end 3.4 us later). */
bool cu_matmul_many_normed(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0, const float *h,
                           const float *r, const float *g, float eps)
{
    (void)ue8m0;
    if (!many_fits(jobs, n_jobs, gemm) || jobs[0].n != 1) return false;
    ds_wfmt fmt = jobs[0].w->fmt;
    int k = jobs[0].w->cols;
    if (fmt != DS_W_BF16 || k * 2 % 16 ||
        !cu_device_readable(h) || !cu_device_readable(r) || !cu_device_readable(g) || (uintptr_t)h % 16 ||
        (uintptr_t)r % 16 || (uintptr_t)g % 16)
        return false;
    gemv_jobs t = {};
    for (int j = 0; j < n_jobs; j++) {
        const ds_matmul_job *jb = &jobs[j];
        cu_weight dw;
        if (jb->w->cols != k || !cu_device_readable(jb->y) || !cu_weight_get(jb->w, &dw) || (uintptr_t)dw.data % 16)
            return false;
        if (jb->rows <= 0) continue;
        int i = t.nj++;
        t.y[i] = jb->y;
        t.x[i] = h;
        t.w[i] = dw.data;
        t.ws[i] = dw.scale;
        t.k[i] = k;
        t.row0[i] = jb->row0;
        t.rows[i] = jb->rows;
    }
    t.nr = r;
    t.ng = g;
    t.eps = eps;
    if (!t.nj) return true;
    launch_gemv_many<DS_W_BF16, 1, true>(&t, 1);
    return cu_check(cudaGetLastError(), "matmul_many_normed");
}

bool cu_matmul_carry(float *y, const float *x, int n, const ds_weight *w, ds_gemm_impl gemm, bool ue8m0, float *h)
{
    (void)ue8m0;
    cu_weight dw;
    if (n != 1 || (w->fmt != DS_W_FP8 && w->fmt != DS_W_BF16) ||
        (gemm == DS_GEMM_FP8 && w->fmt == DS_W_FP8) || !cu_device_readable(y) || !cu_device_readable(x) ||
        !cu_device_readable(h) || !cu_weight_get(w, &dw))
        return false;
    if (w->fmt == DS_W_FP8) launch_gemv<DS_W_FP8, false, 1>(y, x, NULL, 1, &dw, w->cols, 0, w->rows, h);
    else launch_gemv<DS_W_BF16, false, 1>(y, x, NULL, 1, &dw, w->cols, 0, w->rows, h);
    return cu_check(cudaGetLastError(), "matmul_carry");
}

/* ---- matmul_t: y[i][c] = sum_r x[i][r] W[row0 + r][c]; one thread per output,
 * consecutive threads on consecutive columns so each weight row is read coalesced. */

template <int F>
__global__ void matmul_t_kernel(float *__restrict__ y, const float *__restrict__ x, int n,
                                const void *__restrict__ w, const float *__restrict__ ws, int cols, int row0,
                                int rows)
{
    cu_pdl_wait();
    cu_pdl_launch();
    int c = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (c >= cols) return;
    int cb = (cols + DS_BLOCK - 1) / DS_BLOCK;
    const float *xi = x + (size_t)i * rows;
    float acc = 0;
    for (int r = 0; r < rows; r++) {
        int gr = row0 + r;
        float v = cu_wload<F>(w, (size_t)gr * cols + c);
        if (F == DS_W_FP8) v *= ws[(size_t)(gr / DS_BLOCK) * cb + c / DS_BLOCK];
        acc += xi[r] * v;
    }
    y[(size_t)i * cols + c] = acc;
}

void cu_matmul_t(float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    if (n <= 0) return;
    int cols = w->cols;
    cu_io io = {};
    cu_weight dw;
    const float *dx = (const float *)cu_in(&io, x, sizeof(float) * (size_t)n * rows);
    float *dy = (float *)cu_out(&io, y, sizeof(float) * (size_t)n * cols, false);
    if (dy && (dx || rows == 0) && cu_weight_get(w, &dw)) {
        dim3 grid(cu_blocks((size_t)cols, 128), (unsigned)n);
        if (w->fmt == DS_W_FP8) cu_launch(matmul_t_kernel<DS_W_FP8>, grid, 128, 0, dy, dx, n, dw.data, dw.scale, cols, row0, rows);
        else if (w->fmt == DS_W_BF16) cu_launch(matmul_t_kernel<DS_W_BF16>, grid, 128, 0, dy, dx, n, dw.data, NULL, cols, row0, rows);
        else cu_launch(matmul_t_kernel<DS_W_F32>, grid, 128, 0, dy, dx, n, dw.data, NULL, cols, row0, rows);
    }
    cu_end(&io, "matmul_t");
}

/* ---- per-head products (absorb attention); TB tokens per pass share each weight load */

#define HEADS_TB 4

/* One warp per (head, row r): y[t][h*ys + r] = x[t][h*xs : + k] . W[row0 + h*hstride + r] */
template <int F>
__global__ void heads_kernel(float *__restrict__ y, int ys, const float *__restrict__ x, int xs, int n, int H,
                             const void *__restrict__ w, const float *__restrict__ ws, int k, int row0, int hstride,
                             int rows, bool /* pf: heads_vec_kernel's */)
{
    cu_pdl_wait();
    cu_pdl_launch();
    int g = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (g >= H * rows) return;
    int h = g / rows, r = g % rows, wr = row0 + h * hstride + r, kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    for (int t0 = 0; t0 < n; t0 += HEADS_TB) {
        float acc[HEADS_TB] = {};
        for (int c = lane; c < k; c += 32) {
            float wv = cu_wload<F>(w, (size_t)wr * k + c);
            if (F == DS_W_FP8) wv *= ws[(size_t)(wr / DS_BLOCK) * kb + c / DS_BLOCK];
            #pragma unroll
            for (int j = 0; j < HEADS_TB; j++)
                if (t0 + j < n) acc[j] += wv * x[((size_t)(t0 + j) * H + h) * xs + c];
        }
        #pragma unroll
        for (int j = 0; j < HEADS_TB; j++) {
            float v = cu_warp_sum(acc[j]);
            if (lane == 0 && t0 + j < n) y[((size_t)(t0 + j) * H + h) * ys + r] = v;
        }
    }
}

/* heads_kernel with 16-byte weight and activation loads: a lane takes 16 / size(F)
 * consecutive columns (a 512-column BF16 row in 2 passes, not 16 loads of 2 bytes); k * size(F) % 16 == 0, xs % 4 == 0, w and x 16-byte aligned. */
template <int F>
__global__ void __launch_bounds__(128)
heads_vec_kernel(float *__restrict__ y, int ys, const float *__restrict__ x, int xs, int n, int H,
                 const void *__restrict__ w, const float *__restrict__ ws, int k, int row0, int hstride, int rows,
                 bool pf)
{
    constexpr int E = 16 / cu_wsize<F>::v;
    int g = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    int h = g / rows, r = g % rows, wr = row0 + h * hstride + r, kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    /* the rows do not depend on the previous kernel: a lane's first chunk into registers,
     * the rest of a row longer than one pass towards L2, before the wait */
    bool pre = pf && g < H * rows && lane * E < k;
    uint4 w0 = {};
    float s0 = 1.0f;
    if (pre) {
        w0 = *(const uint4 *)((const uint8_t *)w + ((size_t)wr * k + lane * E) * cu_wsize<F>::v);
        if (F == DS_W_FP8) s0 = ws[(size_t)(wr / DS_BLOCK) * kb + lane * E / DS_BLOCK];
    }
    if (g < H * rows && pf && k > 32 * E)
        cu_prefetch_lane_l2((const uint8_t *)w + (size_t)wr * k * cu_wsize<F>::v, (size_t)k * cu_wsize<F>::v, lane, 32);
    cu_pdl_wait();
    cu_pdl_launch();
    if (g >= H * rows) return;
    for (int t0 = 0; t0 < n; t0 += HEADS_TB) {
        float acc[HEADS_TB] = {};
        for (int c = lane * E; c < k; c += 32 * E) {
            float wv[E], sc = s0;
            if (pre && c == lane * E) {
                cu_wload16<F>(&w0, 0, wv);
            } else {
                cu_wload16<F>(w, (size_t)wr * k + c, wv);
                sc = F == DS_W_FP8 ? ws[(size_t)(wr / DS_BLOCK) * kb + c / DS_BLOCK] : 1.0f;
            }
            #pragma unroll
            for (int j = 0; j < HEADS_TB; j++) {
                if (t0 + j >= n) break;
                const float *xp = x + ((size_t)(t0 + j) * H + h) * xs + c;
                float part = 0;
                #pragma unroll
                for (int e = 0; e < E; e += 4) {
                    float4 v = *(const float4 *)(xp + e);
                    part += v.x * wv[e] + v.y * wv[e + 1] + v.z * wv[e + 2] + v.w * wv[e + 3];
                }
                acc[j] += F == DS_W_FP8 ? part * sc : part;
            }
        }
        #pragma unroll
        for (int j = 0; j < HEADS_TB; j++) {
            float v = cu_warp_sum(acc[j]);
            if (lane == 0 && t0 + j < n) y[((size_t)(t0 + j) * H + h) * ys + r] = v;
        }
    }
}

/* y[t][h*ys + c] = sum_r x[t][h*xs + r] W[row0 + h*hstride + r][c]. Block (64-column slice,
 * head) of HW warps: lane l takes columns c0 + l and c0 + 32 + l (coalesced per row), warp w
 * rows w, w + HW, ..., RB rows' loads in flight, partial sums reduced through shared memory.
 * (One thread per column walking all rows: 64 blocks, 30.7 us per call on the 16B model at
 * decode.) */
template <int F, int HW, int RB>
__global__ void __launch_bounds__(HW * 32)
heads_t_kernel(float *__restrict__ y, int ys, const float *__restrict__ x, int xs, int n, int H,
               const void *__restrict__ w, const float *__restrict__ ws, int cols, int row0, int hstride, int rows)
{
    /* the block's 64-column slice of its head's rows towards L2 before the wait */
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        size_t at = (size_t)(row0 + blockIdx.y * hstride + r) * cols + blockIdx.x * 64;
        cu_prefetch_lane_l2((const uint8_t *)w + at * cu_wsize<F>::v,
                            (size_t)min(64, cols - (int)blockIdx.x * 64) * cu_wsize<F>::v, 0, 1);
    }
    cu_pdl_wait();
    cu_pdl_launch();
    __shared__ float red[HW][HEADS_TB][64];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y, cb = (cols + DS_BLOCK - 1) / DS_BLOCK;
    int c0 = blockIdx.x * 64 + lane, c1 = c0 + 32;
    bool v0 = c0 < cols, v1 = c1 < cols;
    for (int t0 = 0; t0 < n; t0 += HEADS_TB) {
        float a0[HEADS_TB] = {}, a1[HEADS_TB] = {};
        /* RB rows per warp loaded before any is used (one row at a time, a warp's rows
         * were a chain of dependent L2 round trips: 7.9 us per call at batch 1) */
        for (int rb = warp; rb < rows; rb += HW * RB) {
            float w0[RB], w1[RB];
            #pragma unroll
            for (int b = 0; b < RB; b++) {
                int r = rb + b * HW, wr = row0 + h * hstride + r;
                w0[b] = r < rows && v0 ? cu_wload<F>(w, (size_t)wr * cols + c0) : 0.0f;
                w1[b] = r < rows && v1 ? cu_wload<F>(w, (size_t)wr * cols + c1) : 0.0f;
                if (F == DS_W_FP8 && r < rows) {
                    if (v0) w0[b] *= ws[(size_t)(wr / DS_BLOCK) * cb + c0 / DS_BLOCK];
                    if (v1) w1[b] *= ws[(size_t)(wr / DS_BLOCK) * cb + c1 / DS_BLOCK];
                }
            }
            #pragma unroll
            for (int b = 0; b < RB; b++) {
                int r = rb + b * HW;
                #pragma unroll
                for (int j = 0; j < HEADS_TB; j++)
                    if (t0 + j < n && r < rows) {
                        float xv = x[((size_t)(t0 + j) * H + h) * xs + r];
                        a0[j] += xv * w0[b];
                        a1[j] += xv * w1[b];
                    }
            }
        }
        #pragma unroll
        for (int j = 0; j < HEADS_TB; j++) {
            red[warp][j][lane] = a0[j];
            red[warp][j][lane + 32] = a1[j];
        }
        __syncthreads();
        for (int o = threadIdx.x; o < HEADS_TB * 64; o += blockDim.x) {
            int j = o / 64, cc = o % 64, c = blockIdx.x * 64 + cc;
            if (t0 + j >= n || c >= cols) continue;
            float v = 0;
            #pragma unroll
            for (int wi = 0; wi < HW; wi++) v += red[wi][j][cc];
            y[((size_t)(t0 + j) * H + h) * ys + c] = v;
        }
        __syncthreads();
    }
}

/* heads_t for 1..8 tokens and heads of at most 128 rows (heads_t3_kernel):
 * block (64-column slice, head) of 16 warps; lane l takes columns c0 + 2l, c0 + 2l + 1 of
 * warp w's rows w, w + 16, ..., w + 112. Those 8 pairs (FP8: times their block scale) are
 * loaded into registers before the PDL wait, so the weights (the whole product's bytes)
 * arrive while the previous kernels run; after the wait the tokens' x rows go to shared
 * memory once and every token is applied in one pass. heads_t_kernel loaded one element a
 * lane after the wait, FP8 with a scale load per element: at depth 4096 6.1 us a layer
 * (FP8), 2.4 (BF16); at batch 8, two passes over the tokens, 13.3 us. cols even. */
#define HT3_WARPS 16
#define HT3_ROWS 8 /* rows per warp: HT3_WARPS * HT3_ROWS = the most rows a head may have */
template <int F, int NT>
__global__ void __launch_bounds__(HT3_WARPS * 32)
heads_t3_kernel(float *__restrict__ y, int ys, const float *__restrict__ x, int xs, int n, int H,
                const void *__restrict__ w, const float *__restrict__ ws, int cols, int row0, int hstride, int rows)
{
    __shared__ float xsh[NT][HT3_WARPS * HT3_ROWS];
    __shared__ float red[HT3_WARPS][NT][64];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y, cb = (cols + DS_BLOCK - 1) / DS_BLOCK;
    int c = blockIdx.x * 64 + 2 * lane;
    float w0[HT3_ROWS], w1[HT3_ROWS];
    #pragma unroll
    for (int b = 0; b < HT3_ROWS; b++) {
        int r = warp + b * HT3_WARPS;
        w0[b] = w1[b] = 0.0f;
        if (r >= rows || c >= cols) continue;
        size_t at = (size_t)(row0 + h * hstride + r) * cols + c;
        if (F == DS_W_F32) {
            float2 v = *(const float2 *)((const float *)w + at);
            w0[b] = v.x, w1[b] = v.y;
        } else if (F == DS_W_BF16) {
            uint32_t v = *(const uint32_t *)((const uint16_t *)w + at);
            w0[b] = __uint_as_float(v << 16), w1[b] = __uint_as_float(v & 0xffff0000u);
        } else {
            uint16_t v = *(const uint16_t *)((const uint8_t *)w + at);
            float s = ws[(size_t)((row0 + h * hstride + r) / DS_BLOCK) * cb + c / DS_BLOCK];
            w0[b] = cu_e4m3((uint8_t)v) * s, w1[b] = cu_e4m3((uint8_t)(v >> 8)) * s;
        }
    }
    cu_pdl_wait();
    cu_pdl_launch();
    for (int i = threadIdx.x; i < n * rows; i += blockDim.x) {
        int t = i / rows, r = i % rows;
        xsh[t][r] = x[((size_t)t * H + h) * xs + r];
    }
    __syncthreads();
    float a0[NT] = {}, a1[NT] = {};
    #pragma unroll
    for (int b = 0; b < HT3_ROWS; b++) {
        int r = warp + b * HT3_WARPS;
        if (r >= rows) break;
        #pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            float xv = xsh[t][r];
            a0[t] += xv * w0[b];
            a1[t] += xv * w1[b];
        }
    }
    #pragma unroll
    for (int t = 0; t < NT; t++) {
        red[warp][t][2 * lane] = a0[t];
        red[warp][t][2 * lane + 1] = a1[t];
    }
    __syncthreads();
    for (int o = threadIdx.x; o < n * 64; o += blockDim.x) {
        int t = o / 64, cc = o % 64, col = blockIdx.x * 64 + cc;
        if (col >= cols) continue;
        float v = 0;
        #pragma unroll
        for (int wi = 0; wi < HT3_WARPS; wi++) v += red[wi][t][cc];
        y[((size_t)t * H + h) * ys + col] = v;
    }
}

template <int F>
static void launch_heads_t3(dim3 grid, float *y, int ys, const float *x, int xs, int n, int H, const cu_weight *dw,
                            int cols, int row0, int hstride, int rows)
{
    const float *s = F == DS_W_FP8 ? dw->scale : NULL;
    if (n == 1) cu_launch(heads_t3_kernel<F, 1>, grid, HT3_WARPS * 32, 0, y, ys, x, xs, n, H, dw->data, s, cols, row0, hstride, rows);
    else if (n == 2) cu_launch(heads_t3_kernel<F, 2>, grid, HT3_WARPS * 32, 0, y, ys, x, xs, n, H, dw->data, s, cols, row0, hstride, rows);
    else if (n <= 4) cu_launch(heads_t3_kernel<F, 4>, grid, HT3_WARPS * 32, 0, y, ys, x, xs, n, H, dw->data, s, cols, row0, hstride, rows);
    else cu_launch(heads_t3_kernel<F, 8>, grid, HT3_WARPS * 32, 0, y, ys, x, xs, n, H, dw->data, s, cols, row0, hstride, rows);
}

/* FP8 per-head products on the tensor cores (blas_heads): e4m3 -> bf16 (exact) */
__global__ void e4m3_bf16_kernel(__nv_bfloat16 *out, const uint8_t *__restrict__ w, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16_rn(cu_e4m3(w[i]));
}

/* e4m3_bf16_kernel eight codes a thread: n8 groups of 8 */
__global__ void e4m3_bf16x8_kernel(uint4 *out, const uint2 *__restrict__ w, size_t n8)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n8) return;
    uint2 v = w[i];
    uint32_t c[2] = {v.x, v.y}, o[4];
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t b = c[k / 2] >> (16 * (k % 2));
        __nv_bfloat162 h = __floats2bfloat162_rn(cu_e4m3((uint8_t)b), cu_e4m3((uint8_t)(b >> 8)));
        o[k] = *(uint32_t *)&h;
    }
    out[i] = make_uint4(o[0], o[1], o[2], o[3]);
}

/* split_scaled_kernel / scale_heads_out_kernel four elements a thread (rows of
 * xs floats, xs % 4 == 0: the four share a row and a 128-column block) */
__global__ void split_scaled4_kernel(uint2 *hi, uint2 *lo, const float4 *__restrict__ x, size_t n4, int xs, int H,
                                     int cols, const float *__restrict__ s, int kb, int row0, int hstride)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n4) return;
    size_t e = 4 * i;
    int c = (int)(e % xs), h = (int)(e / xs % H);
    float f = c < cols ? s[(size_t)((row0 + h * hstride) / DS_BLOCK) * kb + c / DS_BLOCK] : 1.0f;
    float4 v = x[i];
    uint2 hv, lv;
    hv.x = bf16x2_split(v.x * f, v.y * f, lo ? &lv.x : NULL);
    hv.y = bf16x2_split(v.z * f, v.w * f, lo ? &lv.y : NULL);
    hi[i] = hv;
    if (lo) lo[i] = lv;
}

__global__ void scale_heads_out4_kernel(float4 *y, size_t n4, int ys, int H, const float *__restrict__ s, int kb,
                                        int row0, int hstride)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n4) return;
    size_t e = 4 * i;
    int c = (int)(e % ys), h = (int)(e / ys % H);
    float f = s[(size_t)((row0 + h * hstride) / DS_BLOCK) * kb + c / DS_BLOCK];
    float4 v = y[i];
    y[i] = make_float4(v.x * f, v.y * f, v.z * f, v.w * f);
}

/* x (n*H rows of xs) * the scale of head h's row block at column c, split into bf16 hi (+ lo) */
__global__ void split_scaled_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *__restrict__ x, size_t n,
                                    int xs, int H, int cols, const float *__restrict__ s, int kb, int row0, int hstride)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    int c = (int)(i % xs), h = (int)(i / xs % H);
    float v = x[i] * (c < cols ? s[(size_t)((row0 + h * hstride) / DS_BLOCK) * kb + c / DS_BLOCK] : 1.0f);
    __nv_bfloat16 b = __float2bfloat16_rn(v);
    hi[i] = b;
    if (lo) lo[i] = __float2bfloat16_rn(v - __bfloat162float(b));
}

/* y (n*H rows of ys) *= the scale of head h's row block at column c */
__global__ void scale_heads_out_kernel(float *y, size_t n, int ys, int H, const float *__restrict__ s, int kb, int row0,
                                       int hstride)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    int c = (int)(i % ys), h = (int)(i / ys % H);
    y[i] *= s[(size_t)((row0 + h * hstride) / DS_BLOCK) * kb + c / DS_BLOCK];
}

/* The per-head products of n >= BLAS_MIN tokens with BF16 weights on the
 * tensor cores: one strided-batched GEMM over the heads (batch stride xs in x,
 * ys in y, hstride rows in W), activations split into bf16 hi + lo as in
 * blas_product (the lo half accumulated by a second product, beta = 1).
 * trans: matmul_heads_t (y = x W_h); else matmul_heads (y = x W_h^T).
 * out: columns per head in y (cols for _t, rows otherwise), which must equal
 * ys (y is written whole). False: not taken. */
static bool blas_heads(cu_io *io, bool trans, float *y, int ys, const float *x, int xs, int n, int H,
                       const ds_weight *w, const cu_weight *dw, int row0, int hstride, int rows)
{
    int cols = w->cols, out = trans ? cols : rows, kb = (cols + DS_BLOCK - 1) / DS_BLOCK;
    /* FP8: each head's rows in one 128-row scale block, so the scales vary along the
     * columns only: e4m3 values (exact in bf16) in the product, the scales folded into
     * the activations (matmul_heads: the columns are the contraction) or applied to
     * the outputs (matmul_heads_t: the columns are the outputs) */
    bool fp8 = w->fmt == DS_W_FP8 && row0 % DS_BLOCK == 0 && hstride % DS_BLOCK == 0 && rows <= DS_BLOCK;
    if (n < BLAS_MIN || !(w->fmt == DS_W_BF16 || fp8) || out != ys || !blas_ready()) return false;
    size_t nx = (size_t)n * H * xs;
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cu_tmp(io, sizeof(__nv_bfloat16) * nx * (g_split ? 2 : 1));
    __nv_bfloat16 *w8 = fp8 ? (__nv_bfloat16 *)cu_tmp(io, sizeof(__nv_bfloat16) * (size_t)w->rows * cols) : NULL;
    if (!xb || (fp8 && !w8)) return false;
    if (fp8) {
        size_t nw = (size_t)w->rows * cols;
        if (nw % 8 == 0 && (uintptr_t)dw->data % 8 == 0 && (uintptr_t)w8 % 16 == 0)
            e4m3_bf16x8_kernel<<<cu_blocks(nw / 8, 256), 256, 0, cu_s>>>((uint4 *)w8, (const uint2 *)dw->data, nw / 8);
        else
            e4m3_bf16_kernel<<<cu_blocks(nw, 256), 256, 0, cu_s>>>(w8, (const uint8_t *)dw->data, nw);
        __nv_bfloat16 *xl = g_split ? xb + nx : NULL;
        if (!trans && xs % 4 == 0 && cols % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)xb % 8 == 0 && (uintptr_t)xl % 8 == 0)
            split_scaled4_kernel<<<cu_blocks(nx / 4, 256), 256, 0, cu_s>>>((uint2 *)xb, (uint2 *)xl, (const float4 *)x,
                                                                          nx / 4, xs, H, cols, dw->scale, kb, row0,
                                                                          hstride);
        else if (!trans)
            split_scaled_kernel<<<cu_blocks(nx, 256), 256, 0, cu_s>>>(xb, xl, x, nx, xs, H, cols, dw->scale, kb, row0,
                                                                      hstride);
    }
    if (!fp8 || trans) launch_split_bf16(xb, g_split ? xb + nx : NULL, x, nx);
    const __nv_bfloat16 *wb = (fp8 ? w8 : (const __nv_bfloat16 *)dw->data) + (size_t)row0 * cols;
    const float one = 1.0f, zero = 0.0f;
    for (int half = 0; half < (g_split ? 2 : 1); half++) { /* hi, then (split) += the lo half */
        const float *beta = half ? &one : &zero;
        cublasStatus_t st;
        if (trans) /* column-major per head: Y_h^T (cols x n) = W_h (cols x rows) X_h^T (rows x n) */
            st = cublasGemmStridedBatchedEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_N, cols, n, rows, &one, wb, CUDA_R_16BF, cols,
                                            (long long)hstride * cols, xb + half * nx, CUDA_R_16BF, H * xs, xs, beta, y,
                                            CUDA_R_32F, H * ys, ys, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        else /* Y_h^T (rows x n) = W_h^T' (rows x cols) X_h^T (cols x n) */
            st = cublasGemmStridedBatchedEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, wb, CUDA_R_16BF, cols,
                                            (long long)hstride * cols, xb + half * nx, CUDA_R_16BF, H * xs, xs, beta, y,
                                            CUDA_R_32F, H * ys, ys, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            cu_check(cudaErrorUnknown, "cublasGemmStridedBatchedEx");
            return true;
        }
    }
    size_t ny = (size_t)n * H * ys;
    if (fp8 && trans && ys % 4 == 0 && (uintptr_t)y % 16 == 0)
        scale_heads_out4_kernel<<<cu_blocks(ny / 4, 256), 256, 0, cu_s>>>((float4 *)y, ny / 4, ys, H, dw->scale, kb,
                                                                         row0, hstride);
    else if (fp8 && trans)
        scale_heads_out_kernel<<<cu_blocks(ny, 256), 256, 0, cu_s>>>(y, ny, ys, H, dw->scale, kb, row0, hstride);
    return true;
}
/* heads_t_kernel<F, HW, RB> for the weight's format F. */
template <int HW, int RB>
static void launch_heads_t(dim3 grid, int fmt, float *y, int ys, const float *x, int xs, int n, int H, const cu_weight *dw,
                           int cols, int row0, int hstride, int rows)
{
    if (fmt == DS_W_FP8)
        cu_launch(heads_t_kernel<DS_W_FP8, HW, RB>, grid, HW * 32, 0, y, ys, x, xs, n, H, dw->data, dw->scale, cols, row0, hstride, rows);
    else if (fmt == DS_W_BF16)
        cu_launch(heads_t_kernel<DS_W_BF16, HW, RB>, grid, HW * 32, 0, y, ys, x, xs, n, H, dw->data, (const float *)NULL, cols, row0, hstride, rows);
    else
        cu_launch(heads_t_kernel<DS_W_F32, HW, RB>, grid, HW * 32, 0, y, ys, x, xs, n, H, dw->data, (const float *)NULL, cols, row0, hstride, rows);
}

void cu_matmul_heads(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0, int hstride,
                     int rows)
{
    if (n <= 0 || H <= 0 || rows <= 0) return;
    cu_io io = {};
    cu_weight dw;
    const float *dx = (const float *)cu_in(&io, x, sizeof(float) * (size_t)n * H * xs);
    float *dy = (float *)cu_out(&io, y, sizeof(float) * (size_t)n * H * ys, true);
    if (dx && dy && cu_weight_get(w, &dw) && !blas_heads(&io, false, dy, ys, dx, xs, n, H, w, &dw, row0, hstride, rows)) {
        unsigned grid = cu_blocks((size_t)H * rows, 4);
        const bool pf = true;
        int sz = w->fmt == DS_W_FP8 ? 1 : w->fmt == DS_W_BF16 ? 2 : 4;
        bool vec = (size_t)w->cols * sz % 16 == 0 && xs % 4 == 0 && (uintptr_t)dx % 16 == 0 &&
                   (uintptr_t)dw.data % 16 == 0;
        if (vec && w->fmt == DS_W_FP8) cu_launch(heads_vec_kernel<DS_W_FP8>, grid, 128, 0, dy, ys, dx, xs, n, H, dw.data, dw.scale, w->cols, row0, hstride, rows, pf);
        else if (vec && w->fmt == DS_W_BF16) cu_launch(heads_vec_kernel<DS_W_BF16>, grid, 128, 0, dy, ys, dx, xs, n, H, dw.data, NULL, w->cols, row0, hstride, rows, pf);
        else if (vec) cu_launch(heads_vec_kernel<DS_W_F32>, grid, 128, 0, dy, ys, dx, xs, n, H, dw.data, NULL, w->cols, row0, hstride, rows, pf);
        else if (w->fmt == DS_W_FP8) cu_launch(heads_kernel<DS_W_FP8>, grid, 128, 0, dy, ys, dx, xs, n, H, dw.data, dw.scale, w->cols, row0, hstride, rows, pf);
        else if (w->fmt == DS_W_BF16) cu_launch(heads_kernel<DS_W_BF16>, grid, 128, 0, dy, ys, dx, xs, n, H, dw.data, NULL, w->cols, row0, hstride, rows, pf);
        else cu_launch(heads_kernel<DS_W_F32>, grid, 128, 0, dy, ys, dx, xs, n, H, dw.data, NULL, w->cols, row0, hstride, rows, pf);
    }
    cu_end(&io, "matmul_heads");
}

void cu_matmul_heads_t(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                       int hstride, int rows)
{
    if (n <= 0 || H <= 0) return;
    cu_io io = {};
    cu_weight dw;
    const float *dx = (const float *)cu_in(&io, x, sizeof(float) * (size_t)n * H * xs);
    float *dy = (float *)cu_out(&io, y, sizeof(float) * (size_t)n * H * ys, true);
    if (dx && dy && cu_weight_get(w, &dw) && !blas_heads(&io, true, dy, ys, dx, xs, n, H, w, &dw, row0, hstride, rows)) {
        dim3 grid(cu_blocks((size_t)w->cols, 64), (unsigned)H);
        int sz = w->fmt == DS_W_FP8 ? 1 : w->fmt == DS_W_BF16 ? 2 : 4;
        bool t3 = n <= 8 && rows <= HT3_WARPS * HT3_ROWS && w->cols % 2 == 0 &&
                  (uintptr_t)dw.data % (2 * sz) == 0;
        if (t3 && w->fmt == DS_W_FP8) launch_heads_t3<DS_W_FP8>(grid, dy, ys, dx, xs, n, H, &dw, w->cols, row0, hstride, rows);
        else if (t3 && w->fmt == DS_W_BF16) launch_heads_t3<DS_W_BF16>(grid, dy, ys, dx, xs, n, H, &dw, w->cols, row0, hstride, rows);
        else if (t3) launch_heads_t3<DS_W_F32>(grid, dy, ys, dx, xs, n, H, &dw, w->cols, row0, hstride, rows);
        /* 16 warps splitting a head's rows (8 rows each for 128-row heads); eight rows per
         * warp in flight for one pass over the tokens, else one: FP8 batch 8 measured 7.75
         * -> 8.07 ms with eight at two passes (batch 1 1.955 -> 1.914, BF16 2.138 -> 2.089) */
        else if (n <= HEADS_TB) launch_heads_t<16, 8>(grid, w->fmt, dy, ys, dx, xs, n, H, &dw, w->cols, row0, hstride, rows);
        else launch_heads_t<16, 1>(grid, w->fmt, dy, ys, dx, xs, n, H, &dw, w->cols, row0, hstride, rows);
    }
    cu_end(&io, "matmul_heads_t");
}

/* ---- grouped products (the experts of a prefill): y_p (cnt_p, rows) =
 * x_p (cnt_p, k) @ W_p^T for p < np, x_p = x + off_p * k, y_p = y + off_p * rows,
 * W_p BF16 (rows, k): one cublasGemmGroupedBatchedEx of 2 np problems (bf16 hi
 * and lo activations, as blas_product), then the halves summed. */
bool cu_blas_grouped(float *y, const float *x, int total, const int *off, const int *cnt, const cu_weight *w, int np,
                     int k, int rows)
{
    static bool refused; /* this cuBLAS does not take the types: per-expert products from then on */
    if (refused || !blas_ready() || np <= 0) return false;
    int halves = g_split ? 2 : 1, ng = halves * np;
    size_t nx = (size_t)total * k, ny = (size_t)total * rows;
    cu_io io = {};
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cu_tmp(&io, sizeof(__nv_bfloat16) * nx * halves);
    float *y2 = g_split ? (float *)cu_tmp(&io, sizeof(float) * ny * 2) : y;
    const void **ptr = (const void **)cu_tmp(&io, sizeof(void *) * 3 * (size_t)ng);
    const void **hp = (const void **)malloc(sizeof(void *) * 3 * (size_t)ng);
    int *ia = (int *)malloc(sizeof(int) * 6 * (size_t)ng);
    cublasOperation_t *op = (cublasOperation_t *)malloc(sizeof(cublasOperation_t) * 2 * (size_t)ng);
    float *ab = (float *)malloc(sizeof(float) * 2 * (size_t)ng);
    bool ok = xb && y2 && ptr && hp && ia && op && ab;
    if (ok) {
        int *m = ia, *nn = ia + ng, *kk = ia + 2 * ng, *ld_a = ia + 3 * ng, *ld_c = ia + 4 * ng, *size = ia + 5 * ng;
        for (int g = 0; g < ng; g++) {
            int p = g % np, half = g / np;
            op[g] = CUBLAS_OP_T;
            op[ng + g] = CUBLAS_OP_N;
            m[g] = rows;
            nn[g] = cnt[p];
            kk[g] = ld_a[g] = k;
            ld_c[g] = rows;
            size[g] = 1;
            ab[g] = 1.0f;
            ab[ng + g] = 0.0f;
            hp[g] = w[p].data;                                       /* A: W_p, k x rows column-major */
            hp[ng + g] = xb + (size_t)half * nx + (size_t)off[p] * k; /* B: x_p^T, k x cnt_p */
            hp[2 * ng + g] = y2 + (size_t)half * ny + (size_t)off[p] * rows;
        }
        launch_split_bf16(xb, g_split ? xb + nx : NULL, x, nx);
        ok = cu_check(cudaMemcpyAsync(ptr, hp, sizeof(void *) * 3 * (size_t)ng, cudaMemcpyHostToDevice, cu_s),
                      "grouped product: pointers");
        /* column-major per problem: Y_p^T (rows x cnt_p) = W_p^T' (rows x k) X_p^T (k x cnt_p) */
        if (ok)
            ok = cublasGemmGroupedBatchedEx(g_blas, op, op + ng, m, nn, kk, ab, ptr, CUDA_R_16BF, ld_a, ptr + ng,
                                            CUDA_R_16BF, kk, ab + ng, (void *const *)(ptr + 2 * ng), CUDA_R_32F, ld_c,
                                            ng, size, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_SUCCESS;
        refused = !ok;
        if (ok && g_split) sum_halves_kernel<<<cu_blocks(ny, 256), 256, 0, cu_s>>>(y, y2, ny);
    }
    /* the host arrays are read when the call is queued; the pointer copy waits for its source */
    cu_end(&io, "grouped product");
    free(hp);
    free(ia);
    free(op);
    free(ab);
    return ok;
}

/* ---- the machine's ceilings (dsv3 bench): device-to-device copy and bf16 GEMM */

extern "C" double cuda_measure_copy_bandwidth(void)
{
    size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(a);
        return 0;
    }
    cudaMemsetAsync(a, 1, bytes, cu_s);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int i = 0; i < 12; i++) {
        cudaEventRecord(e0, cu_s);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, cu_s);
        cudaEventRecord(e1, cu_s);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i >= 2 && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * bytes / (best * 1e-3) / 1e9; /* read + write */
}

__global__ void fill_bf16_kernel(__nv_bfloat16 *p, size_t n, uint32_t seed)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16_rn((float)(h & 0xffff) / 32768.0f - 1.0f);
}

extern "C" double cuda_measure_bf16_tc_peak(void)
{
    const int N = 8192;
    size_t ne = (size_t)N * N;
    __nv_bfloat16 *a = NULL, *b = NULL;
    float *c = NULL;
    if (!blas_ready() || cudaMalloc(&a, ne * 2) != cudaSuccess || cudaMalloc(&b, ne * 2) != cudaSuccess ||
        cudaMalloc(&c, ne * 4) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(a);
        cudaFree(b);
        return 0;
    }
    fill_bf16_kernel<<<cu_blocks(ne, 256), 256, 0, cu_s>>>(a, ne, 1);
    fill_bf16_kernel<<<cu_blocks(ne, 256), 256, 0, cu_s>>>(b, ne, 2);
    const float one = 1.0f, zero = 0.0f;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int i = 0; i < 8; i++) {
        cudaEventRecord(e0, cu_s);
        cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, a, CUDA_R_16BF, N, b, CUDA_R_16BF, N, &zero, c,
                     CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cudaEventRecord(e1, cu_s);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i >= 2 && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return 2.0 * N * (double)N * N / (best * 1e-3) / 1e12;
}

__global__ void fill_e4m3_kernel(uint8_t *p, size_t n, uint32_t seed)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = (uint8_t)(h & 0xbf); /* both signs, exponents up to 7: |v| < 2, never NaN */
}

extern "C" double cuda_measure_fp8_tc_peak(void)
{
    const int N = 8192;
    size_t ne = (size_t)N * N;
    uint8_t *a = NULL, *b = NULL;
    void *d = NULL;
    lt_fp8 e;
    if (!lt_fp8_make(&e, N, N, N)) return 0;
    if (cudaMalloc(&a, ne) != cudaSuccess || cudaMalloc(&b, ne) != cudaSuccess || cudaMalloc(&d, ne * 2) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(a);
        cudaFree(b);
        lt_fp8_free(&e);
        return 0;
    }
    fill_e4m3_kernel<<<cu_blocks(ne, 256), 256, 0, cu_s>>>(a, ne, 1);
    fill_e4m3_kernel<<<cu_blocks(ne, 256), 256, 0, cu_s>>>(b, ne, 2);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    bool ok = true;
    for (int i = 0; i < 8 && ok; i++) {
        cudaEventRecord(e0, cu_s);
        ok = lt_fp8_run(&e, d, a, b);
        cudaEventRecord(e1, cu_s);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i >= 2 && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
    lt_fp8_free(&e);
    return ok && cudaGetLastError() == cudaSuccess ? 2.0 * N * (double)N * N / (best * 1e-3) / 1e12 : 0;
}

/* ---- the FP8 kernels on their own (tests) */

extern "C" ds_status cuda_act_quant(const float *x, int m, int k, uint8_t *y, float *s, bool ue8m0)
{
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    cu_io io = {};
    const float *dx = (const float *)cu_in(&io, x, sizeof(float) * (size_t)m * k);
    uint8_t *dy = (uint8_t *)cu_out(&io, y, (size_t)m * k, false);
    float *ds = (float *)cu_out(&io, s, sizeof(float) * (size_t)m * kb, false);
    if (dx && dy && ds) launch_act_quant(dx, m, k, dy, ds, ue8m0);
    cu_end(&io, "act_quant");
    return cuda_backend_status();
}

extern "C" ds_status cuda_fp8_gemm(const uint8_t *y, const float *s, const uint8_t *w, const float *ws, int m, int n,
                                   int k, float *out)
{
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    cu_io io = {};
    cu_weight dw;
    const void *dy = cu_in(&io, y, (size_t)m * k);
    const float *ds = (const float *)cu_in(&io, s, sizeof(float) * (size_t)m * kb);
    dw.data = cu_in(&io, w, (size_t)n * k);
    dw.scale = (const float *)cu_in(&io, ws, sizeof(float) * (size_t)((n + DS_BLOCK - 1) / DS_BLOCK) * kb);
    float *dout = (float *)cu_out(&io, out, sizeof(float) * (size_t)m * n, false);
    if (dy && ds && dw.data && dw.scale && dout &&
        !(cu_tune.fp8_mma && m >= BLAS_MIN && k % 16 == 0 && (uintptr_t)dw.data % 16 == 0 &&
          (uintptr_t)dy % 16 == 0 && cu_dense_fp8q(dout, (const uint8_t *)dy, ds, m, &dw, k, 0, n)))
        launch_product<DS_W_FP8, true>(dout, dy, ds, m, &dw, k, 0, n);
    cu_end(&io, "fp8_gemm");
    return cuda_backend_status();
}

__global__ void weight_dequant_kernel(const uint8_t *__restrict__ w, const float *__restrict__ s, int rows, int cols,
                                      float *__restrict__ out)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols) return;
    int r = (int)(i / cols), c = (int)(i % cols), cb = (cols + DS_BLOCK - 1) / DS_BLOCK;
    out[i] = cu_e4m3(w[i]) * s[(size_t)(r / DS_BLOCK) * cb + c / DS_BLOCK];
}

extern "C" ds_status cuda_weight_dequant(const uint8_t *w, const float *s, int rows, int cols, float *out)
{
    size_t ns = (size_t)((rows + DS_BLOCK - 1) / DS_BLOCK) * ((cols + DS_BLOCK - 1) / DS_BLOCK);
    cu_io io = {};
    const uint8_t *dw = (const uint8_t *)cu_in(&io, w, (size_t)rows * cols);
    const float *ds = (const float *)cu_in(&io, s, sizeof(float) * ns);
    float *dout = (float *)cu_out(&io, out, sizeof(float) * (size_t)rows * cols, false);
    if (dw && ds && dout) weight_dequant_kernel<<<cu_blocks((size_t)rows * cols, 256), 256, 0, cu_s>>>(dw, ds, rows, cols, dout);
    cu_end(&io, "weight_dequant");
    return cuda_backend_status();
}
