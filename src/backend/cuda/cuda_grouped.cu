/* cuda_grouped.cu - products of a prefill on the tensor cores that cuBLAS does
 * not cover well: the routed experts (one grouped launch per weight kind over
 * the tokens gathered in expert order), FP8 weights with block scales, and the
 * FP8 GEMM path (gemm_impl fp8: act_quant codes against the weights' codes).
 *
 * Tiles: GG_BM = 64 tokens of one expert x BN weight rows per block of 8 warps
 * (float32 sums on the tensor cores). A tile list (expert, first token, end token),
 * made on the device or the host from the routing counts, tells each block its
 * expert, so one launch covers every expert whatever its token count; 16-row
 * fragments wholly past an expert's last token skip their products.
 *   up:   B rows 0 .. BN/2-1 are rows r0.. of w1, the rest the same rows of w3;
 *         the epilogue writes h = silu(w1 x) * (w3 x) in the A form of down.
 *   down: B rows are BN rows of w2; the epilogue writes float32 y rows.
 * Activations are split into high + low parts (two products per fragment; the
 * default), or rounded once with the tuning's gemm_bf16.
 * Kernels: gr_kernel on warpgroup MMA where the device runs this build's sm_90a image
 * (its wgmma's N the tile's 16-token fragments, since an expert's tile is rarely full;
 * with FP8 weights the activations' lo parts e4m3, their products on the FP8 tensor
 * cores), else gf_kernel on mma.sync. 16B prefill 512 on the H200: gf_kernel FP8 32.8,
 * BF16 26.9 ms; gr_kernel 26.4 and 23.5, with e4m3 lo parts FP8 24.6. (WMMA kernels
 * with e4m3 widened in registers took 54.4 ms FP8, 33.3 BF16.) The FP8 GEMM path:
 * gwq_kernel (wgmma, e4m3 as it is) on sm_90a, else gq_kernel (mma.sync).
 * cu_dense_fp8_tc uses the down form for an ordinary FP8 matmul (one "expert", every
 * token).
 * Needs K % 16 == 0 for both products and 16-byte aligned weights.
 * Tested by tests/cuda/test_cuda_ops.c (test_prefill_products, test_shared_merge,
 * test_fp8mma: against the CPU backend's matmul and moe_experts, both gemm_bf16 modes,
 * grouped_wgmma on and off, fp8_mma / fp8_wgmma on and off; test_fp8_golden against the
 * reference's Triton kernels' outputs). */
#include <cuda_bf16.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"

#define GG_BM 64
#define GG_THREADS 256

/* ---- gf_kernel: mma.m16n8k16 with raw fragments, cp.async of GF_BK
 * columns per stage.
 * FP8 weights: the e4m3 codes go into shared memory as bytes and become f16
 * pairs by the hardware conversion (exact) as each fragment is read; the
 * activations are f16 high (+ low) parts of x 2^s, one power of two s per
 * (token, 64-column chunk) bringing the chunk's largest |x| under 2^15, so
 * nothing overflows f16 and hi + lo keep ~22 bits. Each k step is one chunk:
 * its partial sums are scaled by the chunk's 2^-s and the weight block's scale
 * and added to the float32 sums (the reference's fp8_gemm scales per-block
 * partial sums the same way).
 * BF16 weights: bf16 operands, x as bf16 hi (+ lo) of x 2^s (the same chunks;
 * the scale is exact and keeps one code path).
 * Fragments: lane (g = lane / 4, q = lane % 4) takes elements 4q .. 4q + 3 of
 * each 16-k slice of a weight row (FP8: one ldmatrix of b16 pairs of codes;
 * BF16: one 8-byte read) as the mma's k slots 2q, 2q + 1, 2q + 8, 2q + 9, and
 * the same four activation columns with one 8-byte read per row (k order
 * inside an mma is free). */
#define GF_BN 128
#define GF_BK 64
#define GF_ALD (GF_BK + 16) /* f16: 160-byte rows, the 8-byte reads of a half warp hit distinct banks */
/* weight row bytes in shared memory: FP8 80 (conflict-free ldmatrix), BF16 160 (as A) */
#define GF_BLD(F) ((F) == DS_W_FP8 ? GF_BK + 16 : 2 * GF_ALD)
/* stages: 3 for FP8 (90 KB, two blocks per SM); BF16 stages are 40 KB, so 2 keep two
 * blocks per SM (3 with one block: prefill 512 33.6 against 29.3 ms on the H200) */
#define GF_ST(F) ((F) == DS_W_FP8 ? 3 : GF_ST_BF16)
#ifndef GF_ST_BF16
#define GF_ST_BF16 2
#endif
#define GF_CLD (GF_BN + 4)

template <int F>
struct gf_stage {
    uint16_t a[2][GG_BM][GF_ALD]; /* f16 (FP8) or bf16 (BF16) bits: hi, lo (split mode) */
    uint8_t b[GF_BN][GF_BLD(F)];
};
template <int F>
union gf_smem {
    gf_stage<F> s[GF_ST(F)];
    float c[GG_BM][GF_CLD];
};

/* 2^(15 - e) for the e with amax < 2^e (1 for 0 and non-finite amax), *inv = its
 * inverse; e is held at -100 or more so both stay normal floats. */
__device__ __forceinline__ float gf_scale(float amax, float *inv)
{
    uint32_t b = __float_as_uint(amax) >> 23;
    if (!(amax > 0.0f) || b >= 255) {
        *inv = 1.0f;
        return 1.0f;
    }
    int e = max((int)b - 126, -100);
    *inv = __uint_as_float((uint32_t)(127 + e - 15) << 23);
    return __uint_as_float((uint32_t)(127 + 15 - e) << 23);
}

/* the bits of the f16 (bf16 when BF) pair of a, b; *f their values */
template <bool BF>
__device__ __forceinline__ uint32_t gs_pair(float a, float b, float2 *f)
{
    if (BF) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        *f = __bfloat1622float2(h);
        return *(uint32_t *)&h;
    }
    __half2 h = __floats2half2_rn(a, b);
    *f = __half22float2(h);
    return *(uint32_t *)&h;
}

/* gr_kernel's FP8 form with e4m3 lo parts (LO8 below) loads a thread's weight codes of a
 * step, bytes 16 q .. 16 q + 15 of its rows g and g + 8 (q = lane % 4, g = lane / 4), with
 * one 16-byte load a row, and hands them to wgmma as they are: code 4 i + 2 h + e of the
 * 16 (e < 2) becomes A's k 16 i + 2 q + 8 h + e of the f16 products. Sums do not care
 * about the order of k, so the activations that meet those codes are stored in the same
 * order: within each 64-column chunk, column c of hi at gr_perm_hi(c) (and of lo at
 * gr_perm_lo(c), now the natural order).
 * Needs every product's k a multiple of 64 (gr_lo8). Loading 2 bytes a fragment register
 * took 24 shared-memory loads a step where this takes 2. */
__device__ __forceinline__ size_t gr_perm_hi(size_t i)
{
    unsigned c = (unsigned)i & 63; /* 16 q + 4 s + 2 h + e -> 16 s + 2 q + 8 h + e */
    return (i & ~(size_t)63) | (c >> 2 & 3) << 4 | (c >> 4) << 1 | (c >> 1 & 1) << 3 | (c & 1);
}
/* lo in the natural order: the e4m3 products take their weights (A) from the stage's raw
 * rows by descriptor (faster than from the f16 products' registers) */
__device__ __forceinline__ size_t gr_perm_lo(size_t i) { return i; }

/* The parts of a, b, c, d (a, b only when !FOUR) at element i: hi in xh, the remainders
 * in xl (none when xl is NULL): f16 (bf16 when BF), or e4m3 bytes when LO8 (then hi is
 * f16 and |a| .. |d| < 2^15: the remainders are at most 8, and e4m3 keeps them to 2^-4
 * of themselves down to 2^-6, i.e. to 2^-15 of a value from 2^-10 of the chunk's
 * largest on). */
template <bool BF, bool LO8, bool FOUR>
__device__ __forceinline__ void gs_put(uint16_t *__restrict__ xh, uint16_t *__restrict__ xl, size_t i, float a,
                                       float b, float c, float d)
{
    float2 f, g;
    uint32_t h0 = gs_pair<BF>(a, b, &f), h1 = FOUR ? gs_pair<BF>(c, d, &g) : 0;
    if (LO8) { /* in gr_kernel's order (gr_perm_hi, gr_perm_lo): i is even, a multiple of 4 when FOUR */
        size_t ih = gr_perm_hi(i), il = gr_perm_lo(i);
        *(uint32_t *)(xh + ih) = h0;
        if (FOUR) *(uint32_t *)(xh + ih + 8) = h1;
        uint32_t l0 = __nv_cvt_float2_to_fp8x2(make_float2(a - f.x, b - f.y), __NV_SATFINITE, __NV_E4M3);
        uint32_t l1 = FOUR ? __nv_cvt_float2_to_fp8x2(make_float2(c - g.x, d - g.y), __NV_SATFINITE, __NV_E4M3) : 0;
        if (FOUR) *(uint32_t *)((uint8_t *)xl + il) = l0 | l1 << 16;
        else *(uint16_t *)((uint8_t *)xl + il) = (uint16_t)l0;
        return;
    }
    if (FOUR) *(uint2 *)(xh + i) = make_uint2(h0, h1);
    else *(uint32_t *)(xh + i) = h0;
    if (xl) {
        float2 u;
        uint32_t l0 = gs_pair<BF>(a - f.x, b - f.y, &u), l1 = FOUR ? gs_pair<BF>(c - g.x, d - g.y, &u) : 0;
        if (FOUR) *(uint2 *)(xl + i) = make_uint2(l0, l1);
        else *(uint32_t *)(xl + i) = l0;
    }
}

/* x (n, k) float32 rows list[i] (row i without a list) -> xh (+ xl) f16 (bf16 when
 * BF) of x 2^s and xs (n, ceil(k / 64)) = 2^-s per 64-column chunk; one warp per chunk.
 * LO8: xl holds the remainders as e4m3 bytes, both parts in gr_kernel's order (LO_E4M3). */
template <bool BF, bool LO8 = false>
__global__ void gf_gather_kernel(uint16_t *__restrict__ xh, uint16_t *__restrict__ xl, float *__restrict__ xs,
                                 const float *__restrict__ x, const int *__restrict__ list, int total, int k,
                                 const int *__restrict__ total_d)
{
    if (total_d) total = *total_d; /* the grid covers the bound, the device holds the count */
    int kc = (k + GF_BK - 1) / GF_BK, lane = threadIdx.x % 32;
    size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (w >= (size_t)total * kc) return; /* the whole warp */
    size_t r = w / kc;
    int c = (int)(w % kc) * GF_BK + 2 * lane;
    float2 v = c < k ? *(const float2 *)(x + (size_t)(list ? list[r] : (int)r) * k + c) : make_float2(0, 0);
    float m = fmaxf(fabsf(v.x), fabsf(v.y));
    #pragma unroll
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(~0u, m, o));
    float inv, s = gf_scale(m, &inv);
    if (c < k) gs_put<BF, LO8, false>(xh, xl, r * k + c, v.x * s, v.y * s, 0.0f, 0.0f);
    if (lane == 0) xs[w] = inv;
}

/* The same with one scale per row (xs (n)), as gr_kernel's RS form takes it: one warp
 * per row, each lane holding up to GS_V vectors of VW floats in registers (the rest of
 * a longer row is read twice), so that a row's loads are all in flight at once; the
 * parts go out 4 (or 2) elements a store (a warp looping over its row twice in float2
 * steps, a chain of dependent loads, took 2-5.6 us a product at prefill 512 of the 16B
 * model). Rows: the listed rows up to *total_d, then x's rows again idrep
 * times (row total + j idn + t is token t). */
#define GS_T 128 /* threads a block: 4 rows */
#define GS_V 16
template <int VW>
struct gs_vec;
template <>
struct gs_vec<4> {
    typedef float4 t;
};
template <>
struct gs_vec<2> {
    typedef float2 t;
};
__device__ __forceinline__ float gs_amax(float4 v) { return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))); }
__device__ __forceinline__ float gs_amax(float2 v) { return fmaxf(fabsf(v.x), fabsf(v.y)); }

template <bool BF, bool LO8>
__device__ __forceinline__ void gs_put(uint16_t *__restrict__ xh, uint16_t *__restrict__ xl, size_t i, float4 v, float s)
{
    gs_put<BF, LO8, true>(xh, xl, i, v.x * s, v.y * s, v.z * s, v.w * s);
}
template <bool BF, bool LO8>
__device__ __forceinline__ void gs_put(uint16_t *__restrict__ xh, uint16_t *__restrict__ xl, size_t i, float2 v, float s)
{
    gs_put<BF, LO8, false>(xh, xl, i, v.x * s, v.y * s, 0.0f, 0.0f);
}

template <bool BF, bool LO8, int VW>
__global__ void __launch_bounds__(GS_T) gf_gather_rows_kernel(uint16_t *__restrict__ xh, uint16_t *__restrict__ xl,
                                                               float *__restrict__ xs, const float *__restrict__ x,
                                                               const int *__restrict__ list, int total, int k,
                                                               const int *__restrict__ total_d, int idn, int idrep)
{
    typedef typename gs_vec<VW>::t vec;
    cu_pdl_wait();
    cu_pdl_launch();
    size_t r = ((size_t)blockIdx.x * GS_T + threadIdx.x) / 32;
    int lane = threadIdx.x % 32, src;
    if (r < (size_t)total) { /* a listed row, up to *total_d of them */
        if (total_d && r >= (size_t)*total_d) return; /* the whole warp */
        src = list ? list[r] : (int)r;
    } else if (r < (size_t)total + (size_t)idn * idrep) { /* x's rows again, idrep times */
        src = (int)((r - total) % idn);
    } else {
        return;
    }
    const vec *row = (const vec *)(x + (size_t)src * k);
    int kv = k / VW;
    vec v[GS_V];
    float m = 0.0f;
    #pragma unroll
    for (int j = 0; j < GS_V; j++) {
        int i = lane + 32 * j;
        if (i < kv) {
            v[j] = row[i];
            m = fmaxf(m, gs_amax(v[j]));
        }
    }
    for (int i = lane + 32 * GS_V; i < kv; i += 32) m = fmaxf(m, gs_amax(row[i]));
    m = cu_warp_max(m);
    float inv, s = gf_scale(m, &inv);
    #pragma unroll
    for (int j = 0; j < GS_V; j++) {
        int i = lane + 32 * j;
        if (i < kv) gs_put<BF, LO8>(xh, xl, r * k + (size_t)i * VW, v[j], s);
    }
    for (int i = lane + 32 * GS_V; i < kv; i += 32) gs_put<BF, LO8>(xh, xl, r * k + (size_t)i * VW, row[i], s);
    if (lane == 0) xs[r] = inv;
}

/* gf_gather_rows_kernel over total + idn idrep rows (k even): float4 loads and stores
 * where x's rows allow them */
template <bool BF, bool LO8>
static void gf_gather_rows(uint16_t *xh, uint16_t *xl, float *xs, const float *x, const int *list, int total, int k,
                           const int *total_d, int idn, int idrep)
{
    unsigned g = cu_blocks(((size_t)total + (size_t)idn * idrep) * 32, GS_T);
    if (!g) return;
    if (k % 4 == 0 && (uintptr_t)x % 16 == 0)
        cu_launch(gf_gather_rows_kernel<BF, LO8, 4>, g, GS_T, 0, xh, xl, xs, x, list, total, k, total_d, idn, idrep);
    else cu_launch(gf_gather_rows_kernel<BF, LO8, 2>, g, GS_T, 0, xh, xl, xs, x, list, total, k, total_d, idn, idrep);
}

/* A stage's GF_BN weight rows, GF_BK columns from k0 (UP: rows r0.. of wa, then the
 * same rows of wb), zeros past the rows' and k's ends. */
template <int F, bool UP>
__device__ __forceinline__ void gf_issue_b(uint8_t (*b)[GF_BLD(F)], const cu_weight &wa, const cu_weight &wb, int r0,
                                           int rows, int k, int k0, int row0)
{
    const int es = F == DS_W_FP8 ? 1 : 2, per = GF_BK * es / 16; /* element bytes, 16-byte chunks per row */
    #pragma unroll
    for (int j = 0; j < GF_BN * per / GG_THREADS; j++) {
        int q = threadIdx.x + j * GG_THREADS, n = q / per, c = (q % per) * 16, kk = k0 + c / es;
        const cu_weight &w = UP && n >= GF_BN / 2 ? wb : wa;
        int r = UP ? r0 + n % (GF_BN / 2) : r0 + n;
        bool in = r < rows && kk < k;
        size_t off = in ? ((size_t)(row0 + r) * k + kk) * es : 0;
        cu_cp16(&b[n][c], (const uint8_t *)w.data + off, in);
    }
}

template <int F, bool UP, bool SPLIT>
__device__ __forceinline__ void gf_issue(gf_stage<F> &st, const uint16_t *__restrict__ xh, const uint16_t *__restrict__ xl,
                                         int t0, int t1, const cu_weight &wa, const cu_weight &wb, int r0, int rows,
                                         int k, int k0, int row0)
{
    int tid = threadIdx.x;
    #pragma unroll
    for (int j = 0; j < GG_BM * GF_BK / 8 / GG_THREADS; j++) {
        int q = tid + j * GG_THREADS, m = q / 8, c = (q % 8) * 8, t = t0 + m, kk = k0 + c;
        bool in = t < t1 && kk < k;
        size_t off = in ? (size_t)t * k + kk : 0;
        cu_cp16(&st.a[0][m][c], xh + off, in);
        if (SPLIT) cu_cp16(&st.a[1][m][c], xl + off, in);
    }
    gf_issue_b<F, UP>(st.b, wa, wb, r0, rows, k, k0, row0);
}

/* A block's outputs from its float32 tile c (GG_BM tokens x GF_BN columns): UP: h =
 * silu(c[:, j]) * c[:, GF_BN / 2 + j] for this block's 64 columns (one chunk) of each
 * token, as the A operand of down (oh, ol) with the chunk's scale (os); else y rows. */
template <bool BF, bool UP, bool SPLIT, bool LO8 = false>
__device__ __forceinline__ void gf_out(const float (*c)[GF_CLD], float *__restrict__ oy, uint16_t *__restrict__ oh,
                                       uint16_t *__restrict__ ol, float *__restrict__ os, int t0, int t1, int r0,
                                       int rows)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (!UP) {
        for (int o = threadIdx.x; o < GG_BM * GF_BN; o += GG_THREADS) {
            int m = o / GF_BN, j = o % GF_BN, t = t0 + m, r = r0 + j;
            if (t < t1 && r < rows) oy[(size_t)t * rows + r] = c[m][j];
        }
        return;
    }
    /* h for this block's 64 columns (one chunk) of each token: a warp per token */
    int hc = (rows + GF_BK - 1) / GF_BK;
    for (int m = warp; m < GG_BM && t0 + m < t1; m += GG_THREADS / 32) {
        size_t t = (size_t)t0 + m;
        float v[2], mx = 0.0f;
        #pragma unroll
        for (int h = 0; h < 2; h++) {
            int j = lane + 32 * h;
            float a = c[m][j];
            v[h] = r0 + j < rows ? a / (1.0f + expf(-a)) * c[m][GF_BN / 2 + j] : 0.0f;
            mx = fmaxf(mx, fabsf(v[h]));
        }
        #pragma unroll
        for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, o));
        float inv, s = gf_scale(mx, &inv);
        #pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = r0 + lane + 32 * h;
            if (r >= rows) continue;
            float hv = v[h] * s, hr;
            uint16_t hb;
            if (BF) {
                __nv_bfloat16 x = __float2bfloat16_rn(hv);
                hb = __bfloat16_as_ushort(x), hr = hv - __bfloat162float(x);
            } else {
                __half x = __float2half_rn(hv);
                hb = __half_as_ushort(x), hr = hv - __half2float(x);
            }
            if (LO8) { /* gr_kernel's order: r0 starts a chunk, rows is whole chunks (gr_lo8) */
                oh[gr_perm_hi(t * rows + r)] = hb;
                ((__nv_fp8_storage_t *)ol)[gr_perm_lo(t * rows + r)] = __nv_cvt_float_to_fp8(hr, __NV_SATFINITE, __NV_E4M3);
                continue;
            }
            oh[t * rows + r] = hb;
            if (SPLIT) ol[t * rows + r] = BF ? __bfloat16_as_ushort(__float2bfloat16_rn(hr)) : __half_as_ushort(__float2half_rn(hr));
        }
        if (lane == 0) os[t * hc + r0 / GF_BK] = inv;
    }
}

/* This lane's token rows of the activation scales xs (stride floats each): token
 * t0 + wm * 32 + 16 i + g + 8 h, NULL past t1. */
__device__ __forceinline__ void gf_xs_rows(const float *xsr[2][2], const float *xs, int stride, int t0, int t1, int wm,
                                           int g)
{
    #pragma unroll
    for (int i = 0; i < 2; i++)
        #pragma unroll
        for (int h = 0; h < 2; h++) {
            int t = t0 + wm * 32 + 16 * i + g + 8 * h;
            xsr[i][h] = t < t1 ? xs + (size_t)t * stride : NULL;
        }
}

/* acc += each step's partial sums times the scales fx of their token rows (rows g
 * and g + 8 of each 16-token fragment i), for the fragments with tokens (live). */
__device__ __forceinline__ void gf_fold(float (*acc)[4][4], const float (*part)[4][4], const float (*fx)[2],
                                        const bool *live)
{
    #pragma unroll
    for (int i = 0; i < 2; i++) {
        if (!live[i]) continue;
        #pragma unroll
        for (int j = 0; j < 4; j++) {
            acc[i][j][0] += fx[i][0] * part[i][j][0];
            acc[i][j][1] += fx[i][0] * part[i][j][1];
            acc[i][j][2] += fx[i][1] * part[i][j][2];
            acc[i][j][3] += fx[i][1] * part[i][j][3];
        }
    }
}

/* A warp's (wm, wn) sums into the block's float32 tile c. */
__device__ __forceinline__ void gf_store_tile(float (*c)[GF_CLD], const float (*acc)[4][4], int wm, int wn, int lane)
{
    #pragma unroll
    for (int i = 0; i < 2; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++) {
            int m = wm * 32 + 16 * i + lane / 4, n = wn * 32 + 8 * j + 2 * (lane % 4);
            c[m][n] = acc[i][j][0];
            c[m][n + 1] = acc[i][j][1];
            c[m + 8][n] = acc[i][j][2];
            c[m + 8][n + 1] = acc[i][j][3];
        }
}

/* A block's tile (expert, first row, end row, w2 row length): entry blockIdx.y of the
 * list, or without one (a dense product: nd tokens, the weight wd passed by value, no
 * table to upload) rows 64 blockIdx.y .. of expert 0. */
__device__ __forceinline__ int4 gk_tile(const int4 *__restrict__ tiles, int nd)
{
    if (tiles) return tiles[blockIdx.y];
    return make_int4(0, (int)blockIdx.y * GG_BM, min((int)(blockIdx.y + 1) * GG_BM, nd), 0);
}

/* tiles[blockIdx.y] (gk_tile) = (expert e, first token, end token); blockIdx.x: GF_BN rows
 * (UP: GF_BN / 2 rows of w1 and the same rows of w3). A: xh (+ xl) (total, k)
 * with xs (total, ceil(k / 64)). UP writes h = silu(w1 x) * (w3 x) the same way:
 * oh (+ ol) f16 (total, rows) and os (total, ceil(rows / 64)), one chunk per
 * block; else float32 y (total, rows) into oy. Warps: 2 x 4, each 32 tokens x 32
 * rows, which lie in one 128-row scale block (r0 + row0 a multiple of 32).
 * Split k (down only): block z takes k steps z * ksteps .. and writes its partial
 * y at oy + z * ystride. */
template <int F, bool UP, bool SPLIT>
__global__ void __launch_bounds__(GG_THREADS, 2)
gf_kernel(float *__restrict__ oy, uint16_t *__restrict__ oh, uint16_t *__restrict__ ol, float *__restrict__ os,
          const uint16_t *__restrict__ xh, const uint16_t *__restrict__ xl, const float *__restrict__ xs,
          const int4 *__restrict__ tiles, const cu_weight *__restrict__ wa_tab, const cu_weight *__restrict__ wb_tab,
          int k, int rows, int row0, int ksteps, size_t ystride, const int *__restrict__ xrow, int nd, cu_weight wd)
{
    extern __shared__ __align__(128) unsigned char gf_raw[];
    gf_smem<F> &sm = *(gf_smem<F> *)gf_raw;
    const bool BF = F == DS_W_BF16;
    cu_pdl_wait();
    cu_pdl_launch();
    int4 tl = gk_tile(tiles, nd);
    int e = tl.x, t0 = tl.y, t1 = tl.z;
    if (t0 >= t1) return; /* an empty tile past the device-grouped count */
    int r0 = blockIdx.x * (UP ? GF_BN / 2 : GF_BN);
    cu_weight wa = tiles ? wa_tab[e] : wd, wb = UP ? wb_tab[e] : wa;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wm = warp / 4, wn = warp % 4, g = lane / 4, q = lane % 4;
    const float *srow = NULL; /* FP8 only */
    if (!BF) {
        const cu_weight &w = UP && wn >= 2 ? wb : wa;
        int r = UP ? r0 + (wn % 2) * 32 : r0 + wn * 32;
        r = row0 + min(r, rows - 1);
        srow = w.scale + (size_t)(r / DS_BLOCK) * ((k + DS_BLOCK - 1) / DS_BLOCK);
    }
    int kc = (k + GF_BK - 1) / GF_BK, ks0 = blockIdx.z * ksteps, nks = min(kc - ks0, ksteps);
    if (!UP) oy += blockIdx.z * ystride;
    bool live[2] = {t0 + wm * 32 < t1, t0 + wm * 32 + 16 < t1}; /* fragments wholly past the tile's end do no products */
    const float *xsr[2][2];
    gf_xs_rows(xsr, xs, kc, t0, t1, wm, g);
    float acc[2][4][4], part[2][4][4]; /* part: each step's sums, set by its first products */
    #pragma unroll
    for (int i = 0; i < 2; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++)
            #pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.0f;
    #pragma unroll
    for (int st = 0; st < GF_ST(F) - 1; st++) {
        if (st < nks) gf_issue<F, UP, SPLIT>(sm.s[st], xh, xl, t0, t1, wa, wb, r0, rows, k, (ks0 + st) * GF_BK, row0);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int it = 0; it < nks; it++) {
        int ks = ks0 + it;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(GF_ST(F) - 2));
        __syncthreads();
        int nx = it + GF_ST(F) - 1;
        if (nx < nks)
            gf_issue<F, UP, SPLIT>(sm.s[nx % GF_ST(F)], xh, xl, t0, t1, wa, wb, r0, rows, k, (ks0 + nx) * GF_BK, row0);
        asm volatile("cp.async.commit_group;\n" ::);
        float fx[2][2], sw = BF ? 1.0f : srow[ks * GF_BK / DS_BLOCK];
        #pragma unroll
        for (int i = 0; i < 2; i++)
            #pragma unroll
            for (int h = 0; h < 2; h++) fx[i][h] = xsr[i][h] ? xsr[i][h][ks] * sw : 0.0f;
        const gf_stage<F> &st = sm.s[it % GF_ST(F)];
        #pragma unroll
        for (int kk = 0; kk < GF_BK; kk += 16) {
            uint32_t b[4][2];
            if (BF) {
                #pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint2 v = *(const uint2 *)&st.b[wn * 32 + 8 * j + g][2 * (kk + 4 * q)];
                    b[j][0] = v.x, b[j][1] = v.y;
                }
            } else {
                uint32_t bq[4];
                unsigned ba = (unsigned)__cvta_generic_to_shared(&st.b[wn * 32 + lane][kk]);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(bq[0]), "=r"(bq[1]), "=r"(bq[2]), "=r"(bq[3])
                             : "r"(ba));
                #pragma unroll
                for (int j = 0; j < 4; j++) b[j][0] = cu_e4m3x2(bq[j], 0), b[j][1] = cu_e4m3x2(bq[j], 1);
            }
            #pragma unroll
            for (int hl = 0; hl < (SPLIT ? 2 : 1); hl++)
                #pragma unroll
                for (int i = 0; i < 2; i++) {
                    if (!live[i]) continue;
                    int m = wm * 32 + 16 * i + g;
                    uint2 v0 = *(const uint2 *)&st.a[hl][m][kk + 4 * q];
                    uint2 v1 = *(const uint2 *)&st.a[hl][m + 8][kk + 4 * q];
                    #pragma unroll
                    for (int j = 0; j < 4; j++) {
                        if (kk == 0 && hl == 0) /* a step's first products start its partial sums */
                            cu_mma0<BF>(part[i][j], v0.x, v1.x, v0.y, v1.y, b[j][0], b[j][1]);
                        else
                            cu_mma<BF>(part[i][j], v0.x, v1.x, v0.y, v1.y, b[j][0], b[j][1]);
                    }
                }
        }
        gf_fold(acc, part, fx, live);
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads(); /* the stages are done with: the tile goes where they were */
    gf_store_tile(sm.c, acc, wm, wn, lane);
    __syncthreads();
    gf_out<BF, UP, SPLIT>(sm.c, oy, oh, ol, os, t0, t1, r0, rows);
}

/* Lets the up and down kernels of a pair use smem bytes of dynamic shared memory,
 * once (*done) */
template <typename KF>
static bool gk_smem(bool *done, KF up, KF down, size_t smem)
{
    if (!*done)
        *done = cu_check(cudaFuncSetAttribute(up, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                         "grouped products: shared memory") &&
                cu_check(cudaFuncSetAttribute(down, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                         "grouped products: shared memory");
    return *done;
}

template <int F, bool SPLIT>
static bool gf_ready(void)
{
    static bool done;
    return gk_smem(&done, gf_kernel<F, true, SPLIT>, gf_kernel<F, false, SPLIT>, sizeof(gf_smem<F>));
}

/* ---- helpers of the warpgroup-MMA kernels (gr_kernel, gwq_kernel; sm_90a) */

/* The FP8 weight scales of warpgroup wg's 64 rows, which lie in one 128-row scale
 * block (UP: warpgroup 0 the w1 rows, 1 the w3 rows; kb scale blocks per row). */
template <bool UP>
__device__ __forceinline__ const float *gw_srow(const cu_weight &wa, const cu_weight &wb, int wg, int r0, int row0,
                                                int rows, int kb)
{
    const cu_weight &w = UP && wg ? wb : wa;
    int r = row0 + min(UP ? r0 : r0 + wg * 64, rows - 1);
    return w.scale + (size_t)(r / DS_BLOCK) * kb;
}

/* The activation scale rows (stride floats each) of the thread's tokens 16 w4 + g and
 * + 8 in a warpgroup's tile, NULL past the tile's end t1. */
__device__ __forceinline__ void gw_xs_rows(const float *xsr[2], const float *xs, int stride, int t0, int t1, int w4,
                                           int g)
{
    #pragma unroll
    for (int h = 0; h < 2; h++) {
        int t = t0 + 16 * w4 + g + 8 * h;
        xsr[h] = t < t1 ? xs + (size_t)t * stride : NULL;
    }
}

/* A warpgroup's wgmma m64n64 sums (wg: its 64 columns of the block's 128; w4, lane:
 * the thread's warp in it and lane) into the block's float32 tile c. */
__device__ __forceinline__ void gw_store_tile(float (*c)[GF_CLD], const float *acc, int wg, int w4, int lane)
{
    #pragma unroll
    for (int j = 0; j < 8; j++) {
        int m = 16 * w4 + lane / 4, n = wg * 64 + 8 * j + 2 * (lane % 4);
        c[m][n] = acc[4 * j];
        c[m][n + 1] = acc[4 * j + 1];
        c[m + 8][n] = acc[4 * j + 2];
        c[m + 8][n + 1] = acc[4 * j + 3];
    }
}

__global__ void gw_probe_kernel(int *out)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}


/* Whether the GPU took an sm_90a image of this file (the warpgroup-MMA kernels'
 * bodies; a build whose CMake DSV3_CUDA_ARCH includes 90a), asked once. */
static bool gw_image(void)
{
    static int ok = -1;
    if (ok < 0) {
        ok = 0;
        int *d = NULL, h = 0;
        if (cudaMalloc(&d, sizeof(int)) == cudaSuccess) {
            gw_probe_kernel<<<1, 1, 0, cu_s>>>(d);
            if (cudaMemcpyAsync(&h, d, sizeof(int), cudaMemcpyDeviceToHost, cu_s) == cudaSuccess &&
                cudaStreamSynchronize(cu_s) == cudaSuccess)
                ok = h;
            cudaFree(d);
        }
        cudaGetLastError();
    }
    return ok == 1;
}

/* Which kernel the prefill products take: 2 gr_kernel (warpgroup MMA, asked for by the
 * tuning's grouped_wgmma and run where the device took the sm_90a image), 0 gf_kernel. */
static int gw_ok(void) { return cu_tune.grouped_wgmma && gw_image() ? 2 : 0; }

/* ---- gr_kernel: gf_kernel's tiles on Hopper's warpgroup MMA (wgmma.mma_async, one
 * instruction 64 x N x 16 where mma.sync does 16 x 8 x 16). The weights are wgmma's A
 * operand. For the f16 products of FP8
 * weights it comes from registers: each thread reads its fragment's codes from the
 * raw rows that cp.async landed and converts them in registers (e4m3 pairs to f16
 * pairs, exact), so the step needs no conversion pass through shared memory and one
 * barrier. The e4m3 lo products and BF16 weights take the raw rows by descriptor
 * in wgmma's own swizzle in the stage. The
 * activations are the B operand (N = the tile's 64 tokens), hi and lo in
 * 128-byte swizzled tiles (GR_SW), read by descriptor. Two warpgroups of 64 weight
 * rows each (UP: warpgroup 0 the w1 rows, 1 the w3 rows); a step is 4 x 16 k,
 * hi and lo each, into partial sums that are then scaled per token (the step's
 * activation scales come with its stage) and per weight block into the float32
 * sums, as in gf_kernel. Same grid, tiles, arguments and outputs as gf_kernel. */
/* weight rows in a stage, unpadded, their 16-byte chunks swizzled so that a warp's 8
 * fragment rows (g = 0..7) fall on 8 distinct groups of 4 banks: byte c of row n at
 * GR_WB, chunk c / 16 at (c / 16) ^ GR_WX(F, n) (FP8: 64-byte rows, n / 2 % 4; BF16:
 * 128-byte rows, n % 8). Padding the rows instead (80 / 144 bytes) measured slower. */
#define GR_RAW(F) ((F) == DS_W_FP8 ? GF_BK : 2 * GF_BK)
#define GR_WX(F, n) ((F) == DS_W_FP8 ? ((n) >> 1) & 3 : (n) & 7)
#define GR_WB(F, n, c) ((n) * GR_RAW(F) + ((((c) >> 4) ^ GR_WX(F, n)) << 4) + ((c) & 15))
/* gr_kernel's activations (template argument LO): hi only (gemm_bf16), hi + lo in the
 * same type (f16 / bf16), or, for FP8 weights with k a multiple of 64, f16 hi + e4m3 lo: the lo products then run on the FP8 tensor cores against the weights' own
 * codes (k32 per instruction, half the time of a k16 f16 one) and lo's tiles are half the
 * bytes. x = hi + lo to ~2^-15 of each value (gs_put) instead of ~2^-22. */
#define GR_LO_NONE 0
#define GR_LO_F16 1
#define GR_LO_E4M3 2
/* e4m3 lo tile: 64 tokens x 64 bytes in wgmma's 64-byte swizzle (16-byte chunk c of row r
 * at chunk c ^ (r / 2 % 4)); 512 bytes from one 8-row group to the next */
#define GR_SW8(r, c) ((r) * 64 + ((((c) >> 4) ^ (((r) >> 1) & 3)) << 4) + ((c) & 15))
/* a stage's activation elements (16-bit units): hi, then lo (f16 / bf16: as many; e4m3: half
 * as many) */
#define GR_AN(LO) (GG_BM * GF_BK * ((LO) == GR_LO_F16 ? 2 : 1) + ((LO) == GR_LO_E4M3 ? GG_BM * GF_BK / 2 : 0))
/* stages a block cycles through. FP8 with e4m3 lo parts: 21 KB a stage (27 KB with lo
 * given as many bytes as hi and the weight rows padded to 80 bytes). One H200, 16B FP8,
 * dsv3 bench pp512 / pp4096 tok/s: 27 KB stages x 4 26.5k / 32.6k;
 * 21 KB x 3 26.8-26.9k / 33.0-33.1k, x 4 27.4-27.6k / 33.5-33.6k, x 5 27.0-27.2k /
 * 32.9-33.0k. BF16 with 2 stages instead of 3: pp512 23.0-23.4k against 25.4k. */
#define GR_ST(F) ((F) == DS_W_FP8 ? 4 : 3)

/* Element (r, c) of a 64 x 64 f16 tile in wgmma's 128-byte swizzle (K-major): row r
 * is 128 bytes at r * 128, its 16-byte chunk c / 8 at chunk (c / 8) ^ (r % 8). A
 * warp's cp.async then reads four whole 128-byte lines of x and writes 512 distinct
 * bytes (the core layout, written conflict-free, made it read 8 half lines). The
 * tile must start on 1024 bytes. */
#define GR_SW(r, c) ((r) * 64 + ((((c) >> 3) ^ ((r) & 7)) << 3) + ((c) & 7))

template <int F, int LO>
struct __align__(1024) gr_stage {
    uint16_t a[GR_AN(LO)];        /* activations hi (GR_SW), then lo (GR_SW, or GR_SW8 for e4m3) */
    uint8_t b[GF_BN * GR_RAW(F)]; /* weights: raw rows (GR_WB) */
    float xs[GG_BM];              /* the step's activation scale of each token */
};
template <int F, int LO>
union gr_smem {
    gr_stage<F, LO> s[GR_ST(F)];
    float c[GG_BM][GF_CLD];
};

/* p rounded up to 1024 bytes of the shared window, where the swizzled tiles must start
 * (launches ask for 1 KB more than the tiles) */
__device__ __forceinline__ unsigned char *gr_align(unsigned char *p)
{
    return p + ((1024 - ((unsigned)__cvta_generic_to_shared(p) & 1023)) & 1023);
}

/* a 4-byte cp.async (zeros when !p) */
__device__ __forceinline__ void gr_cp4(void *sp, const void *g, bool p)
{
    unsigned sa = (unsigned)__cvta_generic_to_shared(sp);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sa), "l"(g), "r"(p ? 4 : 0));
}

/* Where a thread's cp.async of a gr_kernel block read from, computed once: its x
 * chunks (hi; lo is xl - xh further on), its weight chunks, its scale row, each
 * with whether it lies inside the tile (bit j of xin / win); a step adds its
 * columns. */
template <int F>
struct gr_src {
    const uint16_t *x[GG_BM * GF_BK / 8 / GG_THREADS];
    const uint8_t *w[GF_BN * (F == DS_W_FP8 ? 1 : 2) * GF_BK / 16 / GG_THREADS];
    const uint8_t *l; /* LO_E4M3: the thread's 16 bytes of lo (GG_BM * GF_BK / 16 == GG_THREADS) */
    const float *xs;
    unsigned xin, win;
    unsigned xuse; /* bit j: x chunk j lies in the tile's 16-token fragments (the rows wgmma reads) */
    bool xsin, lin;
};

template <int F, bool UP>
__device__ __forceinline__ void gr_src_init(gr_src<F> &f, const uint16_t *xh, const uint8_t *xl8, const float *xs, int kc,
                                            int t0, int t1,
                                            const cu_weight &wa, const cu_weight &wb, int r0, int rows, int k, int row0,
                                            int ld, const int *xrow)
{
    int tid = threadIdx.x;
    f.xin = f.win = f.xuse = 0;
    const int nf = (t1 - t0 + 15) / 16 * 16; /* rows past them: no copy at all */
    #pragma unroll
    for (int j = 0; j < GG_BM * GF_BK / 8 / GG_THREADS; j++) {
        int q = tid + j * GG_THREADS, t = t0 + q / 8;
        bool in = t < t1;
        f.x[j] = xh + (in ? (size_t)(xrow ? xrow[t] : t) * k + (q % 8) * 8 : 0);
        f.xin |= (unsigned)in << j;
        f.xuse |= (unsigned)(q / 8 < nf) << j;
    }
    const int es = F == DS_W_FP8 ? 1 : 2, per = GF_BK * es / 16;
    #pragma unroll
    for (int j = 0; j < GF_BN * per / GG_THREADS; j++) {
        int q = tid + j * GG_THREADS, n = q / per, c = (q % per) * 16;
        const cu_weight &w = UP && n >= GF_BN / 2 ? wb : wa;
        int r = UP ? r0 + n % (GF_BN / 2) : r0 + n;
        bool in = r < rows;
        f.w[j] = (const uint8_t *)w.data + (in ? (size_t)(row0 + r) * ld * es + c : 0);
        f.win |= (unsigned)in << j;
    }
    f.xsin = tid < GG_BM && t0 + tid < t1;
    f.xs = xs + (f.xsin ? (size_t)(t0 + tid) * kc : 0);
    f.lin = t0 + tid / 4 < t1;
    int tl = t0 + tid / 4;
    f.l = xl8 && f.lin ? xl8 + (size_t)(xrow ? xrow[tl] : tl) * k + tid % 4 * 16 : xl8; /* xl8 NULL: no lo parts */
}

/* The cp.async of step ks (columns ks * GF_BK ..) into st: x hi, lo (LO_F16: lo
 * elements on from hi; LO_E4M3: from f.l), weights, scales; zeros outside the tile
 * and past k. */
template <int F, int LO, bool RS>
__device__ __forceinline__ void gr_issue(gr_stage<F, LO> &st, const gr_src<F> &f, size_t lo, int ks, int k)
{
    int tid = threadIdx.x, k0 = ks * GF_BK;
    /* a step inside k: each chunk's predicate is the tile's alone, and a chunk outside the
     * tile reads nothing from its clamped row (row 0, column k0 < k) */
    if (k0 + GF_BK <= k) {
        #pragma unroll
        for (int j = 0; j < GG_BM * GF_BK / 8 / GG_THREADS; j++) {
            int q = tid + j * GG_THREADS, m = q / 8, c = (q % 8) * 8;
            /* BF16: rows past the fragments are not copied (warp-uniform: a warp's chunks are 4
             * rows of one fragment). H200, 16B, pp512: BF16 30.4k -> 30.9k tok/s, FP8 33.4k ->
             * 32.9k (its registers are at the bound), so FP8 copies them. */
            if (F == DS_W_BF16 && !(f.xuse >> j & 1)) continue;
            cu_cp16(&st.a[GR_SW(m, c)], f.x[j] + k0, f.xin >> j & 1);
            if (LO == GR_LO_F16) cu_cp16(&st.a[GG_BM * GF_BK + GR_SW(m, c)], f.x[j] + k0 + lo, f.xin >> j & 1);
        }
        if (LO == GR_LO_E4M3)
            cu_cp16((uint8_t *)(st.a + GG_BM * GF_BK) + GR_SW8(tid / 4, tid % 4 * 16), f.l + k0, f.lin);
        const int es = F == DS_W_FP8 ? 1 : 2, per = GF_BK * es / 16;
        #pragma unroll
        for (int j = 0; j < GF_BN * per / GG_THREADS; j++) {
            int q = tid + j * GG_THREADS, n = q / per, c = (q % per) * 16;
            cu_cp16(st.b + GR_WB(F, n, c), f.w[j] + (size_t)k0 * es, f.win >> j & 1);
        }
        if (!RS && tid < GG_BM) gr_cp4(&st.xs[tid], f.xs + ks, f.xsin);
        return;
    }
    #pragma unroll
    for (int j = 0; j < GG_BM * GF_BK / 8 / GG_THREADS; j++) {
        int q = tid + j * GG_THREADS, m = q / 8, c = (q % 8) * 8;
        bool in = (f.xin >> j & 1) && k0 + c < k;
        const uint16_t *p = in ? f.x[j] + k0 : f.x[j];
        cu_cp16(&st.a[GR_SW(m, c)], p, in);
        if (LO == GR_LO_F16) cu_cp16(&st.a[GG_BM * GF_BK + GR_SW(m, c)], p + lo, in);
    }
    if (LO == GR_LO_E4M3) {
        int m = tid / 4, c = tid % 4 * 16;
        bool in = f.lin && k0 + c < k;
        cu_cp16((uint8_t *)(st.a + GG_BM * GF_BK) + GR_SW8(m, c), in ? f.l + k0 : f.l, in);
    }
    const int es = F == DS_W_FP8 ? 1 : 2, per = GF_BK * es / 16;
    #pragma unroll
    for (int j = 0; j < GF_BN * per / GG_THREADS; j++) {
        int q = tid + j * GG_THREADS, n = q / per, c = (q % per) * 16;
        bool in = (f.win >> j & 1) && k0 + c / es < k;
        cu_cp16(st.b + GR_WB(F, n, c), in ? f.w[j] + (size_t)k0 * es : f.w[j], in);
    }
    if (!RS && tid < GG_BM) gr_cp4(&st.xs[tid], f.xsin ? f.xs + ks : f.xs, f.xsin);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* wgmma's descriptor of a K-major tile in GR_SW from p (k16 slices 32 bytes apart):
 * 128-byte swizzle, 1024 bytes from one 8-row group to the next */
__device__ __forceinline__ uint64_t gr_desc(const void *p)
{
    uint64_t a = (uint64_t)__cvta_generic_to_shared(p);
    return ((a & 0x3ffff) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

/* the same for an e4m3 lo tile in GR_SW8 (k32 slices 32 bytes apart): 64-byte swizzle,
 * 512 bytes from one 8-row group to the next */
__device__ __forceinline__ uint64_t gr_desc8(const void *p)
{
    uint64_t a = (uint64_t)__cvta_generic_to_shared(p);
    return ((a & 0x3ffff) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(512 >> 4) << 32) | ((uint64_t)2 << 62);
}

/* wgmma m64nNk16 (N = 16 NB tokens), A (the weights) from registers a, B by
 * descriptor db (K-major); acc 0: the sums start from zero. A tile's tokens past its
 * last 16-token fragment cost no tensor work: its N is the fragments it has. */
#define GR_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])
#define GR_Q0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define GR_Q1 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define GR_Q2 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define GR_Q3 ", %24, %25, %26, %27, %28, %29, %30, %31"
/* the operands after NB fragments' sums: A's 4 registers, B's descriptor, scale-d p */
#define GR_TAIL(a, b, c, e, f) "}, {%" #a ", %" #b ", %" #c ", %" #e "}, %" #f ", p, 1, 1"
#define GR_ARGS1 "{" GR_Q0 GR_TAIL(8, 9, 10, 11, 12)
#define GR_ARGS2 "{" GR_Q0 GR_Q1 GR_TAIL(16, 17, 18, 19, 20)
#define GR_ARGS3 "{" GR_Q0 GR_Q1 GR_Q2 GR_TAIL(24, 25, 26, 27, 28)
#define GR_ARGS4 "{" GR_Q0 GR_Q1 GR_Q2 GR_Q3 GR_TAIL(32, 33, 34, 35, 36)
#define GR_PRED(i) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #i ", 0;\n"
#define GR_P1 GR_PRED(13)
#define GR_P2 GR_PRED(21)
#define GR_P3 GR_PRED(29)
#define GR_P4 GR_PRED(37)
#define GR_OUT1 GR_D8(0)
#define GR_OUT2 GR_D8(0), GR_D8(8)
#define GR_OUT3 GR_D8(0), GR_D8(8), GR_D8(16)
#define GR_OUT4 GR_D8(0), GR_D8(8), GR_D8(16), GR_D8(24)
#define GR_MMA(T, NB, N)                                                                                     \
    asm volatile(GR_P##NB "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " " GR_ARGS##NB ", 0;\n}\n" \
                 : GR_OUT##NB                                                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc))
template <bool BF, int NB>
__device__ __forceinline__ void gr_mma(float *d, const uint32_t *a, uint64_t db, int acc)
{
    if (NB == 1) {
        if (BF) GR_MMA("bf16", 1, 16);
        else GR_MMA("f16", 1, 16);
    } else if (NB == 2) {
        if (BF) GR_MMA("bf16", 2, 32);
        else GR_MMA("f16", 2, 32);
    } else if (NB == 3) {
        if (BF) GR_MMA("bf16", 3, 48);
        else GR_MMA("f16", 3, 48);
    } else {
        if (BF) GR_MMA("bf16", 4, 64);
        else GR_MMA("f16", 4, 64);
    }
}
/* wgmma with A (the weights) and B both by descriptor (K-major): m64nNk16 on bf16
 * (its two transpose flags 0) and m64nNk32 on e4m3 codes */
#define GR_TAILS(a, b) "}, %" #a ", %" #b ", p, 1, 1"
#define GR_ARGSS1 "{" GR_Q0 GR_TAILS(8, 9)
#define GR_ARGSS2 "{" GR_Q0 GR_Q1 GR_TAILS(16, 17)
#define GR_ARGSS3 "{" GR_Q0 GR_Q1 GR_Q2 GR_TAILS(24, 25)
#define GR_ARGSS4 "{" GR_Q0 GR_Q1 GR_Q2 GR_Q3 GR_TAILS(32, 33)
#define GR_PS1 GR_PRED(10)
#define GR_PS2 GR_PRED(18)
#define GR_PS3 GR_PRED(26)
#define GR_PS4 GR_PRED(34)
#define GR_MMASS(NB, N, KT, TRANS)                                                                         \
    asm volatile(GR_PS##NB "wgmma.mma_async.sync.aligned.m64n" #N KT " " GR_ARGSS##NB TRANS ";\n}\n"        \
                 : GR_OUT##NB                                                                              \
                 : "l"(da), "l"(db), "r"(acc))
#define GR_BF "k16.f32.bf16.bf16"
#define GR_E4 "k32.f32.e4m3.e4m3"
/* E4: e4m3 codes, else bf16 */
#define GR_MMAD(NB, N)                          \
    do {                                        \
        if (E4) GR_MMASS(NB, N, GR_E4, "");     \
        else GR_MMASS(NB, N, GR_BF, ", 0, 0");  \
    } while (0)
template <bool E4, int NB>
__device__ __forceinline__ void gr_mmad(float *d, uint64_t da, uint64_t db, int acc)
{
    if (NB == 1) GR_MMAD(1, 16);
    else if (NB == 2) GR_MMAD(2, 32);
    else if (NB == 3) GR_MMAD(3, 48);
    else GR_MMAD(4, 64);
}
#undef GR_MMAD
#undef GR_MMASS
#undef GR_BF
#undef GR_E4
#undef GR_TAILS
#undef GR_ARGSS1
#undef GR_ARGSS2
#undef GR_ARGSS3
#undef GR_ARGSS4
#undef GR_PS1
#undef GR_PS2
#undef GR_PS3
#undef GR_PS4
/* wgmma.wait_group 0 taking the NB fragments' sums as operands, so that no arithmetic on
 * them moves above it */
#define GR_WAIT(NB) asm volatile("wgmma.wait_group.sync.aligned 0;\n" : GR_OUT##NB::"memory")
template <int NB>
__device__ __forceinline__ void gr_wait(float *d)
{
    if (NB == 1) GR_WAIT(1);
    else if (NB == 2) GR_WAIT(2);
    else if (NB == 3) GR_WAIT(3);
    else GR_WAIT(4);
}
#undef GR_WAIT
#undef GR_MMA
#undef GR_OUT1
#undef GR_OUT2
#undef GR_OUT3
#undef GR_OUT4
#undef GR_Q0
#undef GR_Q1
#undef GR_Q2
#undef GR_Q3
#undef GR_TAIL
#undef GR_ARGS1
#undef GR_ARGS2
#undef GR_ARGS3
#undef GR_ARGS4
#undef GR_PRED
#undef GR_P1
#undef GR_P2
#undef GR_P3
#undef GR_P4
#undef GR_D8


/* A step's products into part: 4 slices of 16 k, hi and lo each (LO_E4M3: lo as 2
 * slices of 32 k, the weights' raw rows at da8 and the tile at d8; BF16: the weights at
 * da8, no registers), on NB 16-token fragments; the slices by
 * their offsets from d0 (in 16 bytes, within the descriptor's 14 address bits: shared
 * memory is under 256 KB). mid() runs while they do (it must not touch part or a). */
template <bool BF, int LO, int NB, class Mid>
__device__ __forceinline__ void gr_step(float *part, const uint32_t (*a)[4], uint64_t da8, uint64_t d0,
                                        uint64_t d8, bool keep, Mid mid)
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    /* lo first: the FP8 tensor cores keep only ~14 bits of the sums they add to (a probe
     * on the H200: 3e-4 of the largest), so they start from zero and the hi products,
     * whose sums keep float32's bits, go on top */
    if (LO == GR_LO_E4M3)
        #pragma unroll
        for (int s = 0; s < GF_BK / 32; s++)
            gr_mmad<true, NB>(part, da8 + (uint64_t)(s * 32 >> 4), d8 + (uint64_t)(s * 32 >> 4), keep || s);
    #pragma unroll
    for (int s = 0; s < GF_BK / 16; s++)
        #pragma unroll
        for (int hl = 0; hl < (LO == GR_LO_F16 ? 2 : 1); hl++) {
            const uint64_t db = d0 + (uint64_t)((hl * GG_BM * GF_BK * 2 + s * 32) >> 4);
            const int acc = keep || LO == GR_LO_E4M3 || s || hl;
            if (BF) gr_mmad<false, NB>(part, da8 + (uint64_t)(s * 32 >> 4), db, acc);
            else gr_mma<BF, NB>(part, a[s], db, acc);
        }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    mid();
    gr_wait<NB>(part);
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* gr_kernel's k steps on tiles of NB 16-token fragments (wgmma's N = 16 NB), into
 * acc: each step waits for its stage, refills the one the step before used, and
 * folds its products with the scales. ra: the thread's first fragment row.
 * RS (one activation scale per row, applied after the loop): BF16 weights sum every
 * step in acc itself; FP8 ones fold with the weight block's scale alone, each block
 * (two steps) with f16 lo parts, each step with e4m3 ones. */
template <int F, int LO, int NB, bool RS>
__device__ __forceinline__ void gr_loop(float *acc, gr_smem<F, LO> &sm, const gr_src<F> &src, size_t lo, const float *srow,
                                        int ks0, int nks, int k, int ra, int q)
{
    const bool BF = F == DS_W_BF16;
    const int ST = GR_ST(F);
    float part[32];
    #pragma unroll
    for (int i = 0; i < 32; i++) part[i] = 0.0f;
    for (int it = 0; it < nks; it++) {
        int ks = ks0 + it;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(GR_ST(F) - 2));
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads(); /* the step's stage is in, and the stage refilled below is done with */
        /* the refill of the stage the step before used: FP8 issues it under this step's
         * products (H200, 16B FP8: pp512 31.4k -> 33.4k tok/s), BF16 before them (under
         * them it measured 1% slower at pp512) */
        auto issue = [&] {
            int nx = it + ST - 1;
            if (nx < nks) gr_issue<F, LO, RS>(sm.s[nx % ST], src, lo, ks0 + nx, k);
            asm volatile("cp.async.commit_group;\n" ::);
        };
        if (BF) issue();
        auto refill = [&] {
            if (!BF) issue();
        };
        const gr_stage<F, LO> &st = sm.s[it % ST];
        float sw = BF ? 1.0f : srow[ks * GF_BK / DS_BLOCK];
        /* A fragments (mma.m16n8k16's A layout per warp): rows g, g + 8; k 2q, 2q + 1
         * and 2q + 8, 2q + 9 of each 16 */
        uint32_t a[GF_BK / 16][4];
        const uint8_t *w0 = st.b + ra * GR_RAW(F), *w1 = w0 + 8 * GR_RAW(F);
        const int sw0 = GR_WX(F, ra) << 4; /* GR_WB: rows ra and ra + 8 alike */
        /* LO_E4M3: x in gr_kernel's order (gr_perm_hi), so the thread's 16 codes of a row
         * are one load; else the fragments by wgmma's own layout */
        if constexpr (LO == GR_LO_E4M3) {
            const uint4 u0 = *(const uint4 *)(w0 + ((16 * q) ^ sw0)), u1 = *(const uint4 *)(w1 + ((16 * q) ^ sw0));
            const uint32_t r0[4] = {u0.x, u0.y, u0.z, u0.w}, r1[4] = {u1.x, u1.y, u1.z, u1.w};
            #pragma unroll
            for (int s = 0; s < GF_BK / 16; s++) {
                a[s][0] = cu_e4m3x2(r0[s], 0);
                a[s][1] = cu_e4m3x2(r1[s], 0);
                a[s][2] = cu_e4m3x2(r0[s], 1);
                a[s][3] = cu_e4m3x2(r1[s], 1);
            }
            #pragma unroll
            for (int s = 0; s < GF_BK / 16; s++)
                #pragma unroll
                for (int i = 0; i < 4; i++) asm volatile("" : "+r"(a[s][i])::"memory"); /* written before the fence */
        } else {
            /* BF16: none, the weights go to wgmma by descriptor (gr_step) */
            if constexpr (!BF)
                #pragma unroll
                for (int s = 0; s < GF_BK / 16; s++) {
                    int kk = 16 * s + 2 * q;
                    a[s][0] = cu_e4m3x2(*(const uint16_t *)(w0 + (kk ^ sw0)), 0);
                    a[s][1] = cu_e4m3x2(*(const uint16_t *)(w1 + (kk ^ sw0)), 0);
                    a[s][2] = cu_e4m3x2(*(const uint16_t *)(w0 + ((kk + 8) ^ sw0)), 0);
                    a[s][3] = cu_e4m3x2(*(const uint16_t *)(w1 + ((kk + 8) ^ sw0)), 0);
                    #pragma unroll
                    for (int i = 0; i < 4; i++) asm volatile("" : "+r"(a[s][i])::"memory"); /* written before the fence */
                }
        }
        const uint64_t d0 = gr_desc(st.a), d8 = LO == GR_LO_E4M3 ? gr_desc8(st.a + GG_BM * GF_BK) : 0;
        /* LO_E4M3: the warpgroup's 64 raw weight rows (64-byte rows in GR_WB's swizzle, which is
         * wgmma's 64-byte one) as the e4m3 products' A */
        const uint64_t da8 = LO == GR_LO_E4M3 ? gr_desc8(st.b + (ra - ra % 64) * GR_RAW(F))
                             : BF           ? gr_desc(st.b + (ra - ra % 64) * GR_RAW(F)) /* 128-byte rows in GR_SW's swizzle */
                                            : 0;
        if (RS && BF) {
            gr_step<BF, LO, NB>(acc, a, da8, d0, d8, it > 0, refill);
        } else if (RS) {
            /* FP8: the second step of a weight block adds to the first's sums, but not
             * with e4m3 lo parts, whose products start from zero (gr_step) */
            const bool pair = LO != GR_LO_E4M3;
            gr_step<BF, LO, NB>(part, a, da8, d0, d8, pair && ks % 2 == 1 && it > 0, refill);
            if (!pair || ks % 2 == 1 || it == nks - 1)
                #pragma unroll
                for (int i = 0; i < 8 * NB; i++) acc[i] += sw * part[i];
        } else {
            gr_step<BF, LO, NB>(part, a, da8, d0, d8, false, refill);
            /* part[4 j + c]: row g (c < 2) or g + 8, token 8 j + 2 q + c % 2 */
            #pragma unroll
            for (int j = 0; j < 2 * NB; j++) {
                float2 f = *(const float2 *)&st.xs[8 * j + 2 * q];
                f.x *= sw, f.y *= sw;
                acc[4 * j] += f.x * part[4 * j];
                acc[4 * j + 1] += f.y * part[4 * j + 1];
                acc[4 * j + 2] += f.x * part[4 * j + 2];
                acc[4 * j + 3] += f.y * part[4 * j + 3];
            }
        }
    }
}

#endif

template <int F, bool UP, int LO, bool RS>
__global__ void __launch_bounds__(GG_THREADS, 2)
gr_kernel(float *__restrict__ oy, uint16_t *__restrict__ oh, uint16_t *__restrict__ ol, float *__restrict__ os,
          const uint16_t *__restrict__ xh, const uint16_t *__restrict__ xl, const float *__restrict__ xs,
          const int4 *__restrict__ tiles, const cu_weight *__restrict__ wa_tab, const cu_weight *__restrict__ wb_tab,
          int k, int rows, int row0, int ksteps, size_t ystride, const int *__restrict__ xrow, int nd, cu_weight wd)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char gr_raw[];
    gr_smem<F, LO> &sm = *(gr_smem<F, LO> *)gr_align(gr_raw);
    const bool BF = F == DS_W_BF16;
    const int ST = GR_ST(F);
    cu_pdl_wait();
    cu_pdl_launch();
    int4 tl = gk_tile(tiles, nd);
    int e = tl.x, t0 = tl.y, t1 = tl.z;
    if (t0 >= t1) return;
    int r0 = blockIdx.x * (UP ? GF_BN / 2 : GF_BN);
    cu_weight wa = tiles ? wa_tab[e] : wd, wb = UP ? wb_tab[e] : wa;
    const int ld = !UP && tl.w > 0 ? tl.w : k; /* the weight's row length: a pseudo-expert's w2 is a column slice */
    int lane = threadIdx.x % 32, wg = threadIdx.x / 128, w4 = (threadIdx.x / 32) % 4, g = lane / 4, q = lane % 4;
    const float *srow = NULL; /* FP8: this warpgroup's 64 rows lie in one 128-row scale block */
    if (!BF) srow = gw_srow<UP>(wa, wb, wg, r0, row0, rows, (ld + DS_BLOCK - 1) / DS_BLOCK);
    int kc = (k + GF_BK - 1) / GF_BK, ks0 = blockIdx.z * ksteps, nks = min(kc - ks0, ksteps);
    if (!UP) oy += blockIdx.z * ystride;
    float acc[32];
    #pragma unroll
    for (int i = 0; i < 32; i++) acc[i] = 0.0f;
    gr_src<F> src;
    gr_src_init<F, UP>(src, xh, (const uint8_t *)xl, xs, kc, t0, t1, wa, wb, r0, rows, k, row0, ld, xrow);
    const size_t lo = LO == GR_LO_F16 ? (size_t)(xl - xh) : 0;
    #pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < nks) gr_issue<F, LO, RS>(sm.s[s], src, lo, ks0 + s, k);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    /* the thread's fragment rows: 16 w4 + g and + 8 of the warpgroup's 64 */
    const int ra = wg * 64 + 16 * w4 + g;
    switch (min((t1 - t0 + 15) / 16, GG_BM / 16)) { /* the tile's 16-token fragments */
    case 1: gr_loop<F, LO, 1, RS>(acc, sm, src, lo, srow, ks0, nks, k, ra, q); break;
    case 2: gr_loop<F, LO, 2, RS>(acc, sm, src, lo, srow, ks0, nks, k, ra, q); break;
    case 3: gr_loop<F, LO, 3, RS>(acc, sm, src, lo, srow, ks0, nks, k, ra, q); break;
    default: gr_loop<F, LO, 4, RS>(acc, sm, src, lo, srow, ks0, nks, k, ra, q); break;
    }
    if (RS) /* each token's scale */
        #pragma unroll
        for (int j = 0; j < 8; j++) {
            int t = t0 + 8 * j + 2 * q;
            float f0 = t < t1 ? xs[xrow ? xrow[t] : t] : 0.0f, f1 = t + 1 < t1 ? xs[xrow ? xrow[t + 1] : t + 1] : 0.0f;
            acc[4 * j] *= f0, acc[4 * j + 1] *= f1, acc[4 * j + 2] *= f0, acc[4 * j + 3] *= f1;
        }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads(); /* the stages are done with: the tile goes where they were */
    #pragma unroll
    for (int j = 0; j < 8; j++) {
        int t = 8 * j + 2 * q;
        sm.c[t][ra] = acc[4 * j];
        sm.c[t + 1][ra] = acc[4 * j + 1];
        sm.c[t][ra + 8] = acc[4 * j + 2];
        sm.c[t + 1][ra + 8] = acc[4 * j + 3];
    }
    __syncthreads();
    gf_out<F == DS_W_BF16, UP, LO != GR_LO_NONE, LO == GR_LO_E4M3>(sm.c, oy, oh, ol, os, t0, t1, r0, rows);
#endif
}

template <int F, int LO, bool RS>
static bool gr_ready(void)
{
    static bool done;
    return gk_smem(&done, gr_kernel<F, true, LO, RS>, gr_kernel<F, false, LO, RS>, sizeof(gr_smem<F, LO>) + 1024);
}

/* The prefill kernels' common signature, and the one that runs: gw 2 gr_kernel (with
 * e4m3 lo parts where lo8; RS: x scaled per row, gf_gather_rows_kernel's), 0 gf_kernel;
 * NULL if it cannot run here. */
typedef void (*gk_fn)(float *, uint16_t *, uint16_t *, float *, const uint16_t *, const uint16_t *, const float *,
                      const int4 *, const cu_weight *, const cu_weight *, int, int, int, int, size_t, const int *, int,
                      cu_weight);
template <int F, bool UP, bool SPLIT, bool RS>
static gk_fn gk_pick(int gw, bool lo8, size_t *smem)
{
    const int LO = SPLIT ? GR_LO_F16 : GR_LO_NONE;
    if constexpr (F == DS_W_FP8)
        if (gw == 2 && lo8) {
            *smem = sizeof(gr_smem<F, GR_LO_E4M3>) + 1024;
            return gr_ready<F, GR_LO_E4M3, RS>() ? gr_kernel<F, UP, GR_LO_E4M3, RS> : NULL;
        }
    if (gw == 2) {
        *smem = sizeof(gr_smem<F, LO>) + 1024;
        return gr_ready<F, LO, RS>() ? gr_kernel<F, UP, LO, RS> : NULL;
    }
    *smem = sizeof(gf_smem<F>);
    return gf_ready<F, SPLIT>() ? gf_kernel<F, UP, SPLIT> : NULL;
}

/* whether gr_kernel takes e4m3 lo parts: FP8 weights, split activations, whole steps */
static bool gr_lo8(int gw, ds_wfmt f, bool split, int k1, int k2)
{
    return gw == 2 && f == DS_W_FP8 && split && k1 % GF_BK == 0 && k2 % GF_BK == 0; /* gr_perm_hi */
}

/* xrow[r] = the token of row r: list[r] for the listed rows, then the tokens again for
 * each pseudo-expert (rows nk + j idn + t) */
__global__ void gf_rowmap_kernel(int *__restrict__ xrow, const int *__restrict__ list, int nk, int idn, int rows)
{
    cu_pdl_wait();
    cu_pdl_launch();
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) xrow[r] = r < nk ? list[r] : (r - nk) % idn;
}

/* The experts on gf_kernel: x gathered, then up and down. gr_kernel's up product reads
 * x's parts by token where the tokens are known (idn: moe_experts_dev's path): x is
 * split once per token and xrow maps each listed
 * row to its token, instead of a split copy of x per listed row. */
template <int F, bool SPLIT>
static bool gf_experts(float *ys, const float *x, const int *list, const int4 *dt, int nt, const int *total, int nk,
                       const cu_weight *tab, int ne, int dim, int inter, int idn, int idrep)
{
    int gw = gw_ok();
    if (idrep && gw != 2) return false; /* the pseudo-experts' w2 row length: gr_kernel only */
    int halves = SPLIT ? 2 : 1, xc = (dim + GF_BK - 1) / GF_BK, hc = (inter + GF_BK - 1) / GF_BK;
    int rows = nk + idn * idrep; /* the listed rows, then x's rows idrep times */
    bool byrow = gw == 2 && list && idn > 0;
    int xn = byrow ? idn : rows; /* rows of x's parts */
    size_t nx = (size_t)xn * dim, nh = (size_t)rows * inter;
    uint16_t *xb = (uint16_t *)cu_alloc(sizeof(uint16_t) * nx * halves);
    uint16_t *hb = (uint16_t *)cu_alloc(sizeof(uint16_t) * nh * halves);
    float *sc = (float *)cu_alloc(sizeof(float) * (size_t)rows * (xc + hc));
    int *xrow = byrow ? (int *)cu_alloc(sizeof(int) * (size_t)rows) : NULL;
    bool lo8 = gr_lo8(gw, (ds_wfmt)F, SPLIT, dim, inter);
    size_t smem = 0;
    /* x gathered with one scale per row for gr_kernel (its RS form), per chunk for the others */
    gk_fn up = gw == 2 ? gk_pick<F, true, SPLIT, true>(gw, lo8, &smem) : gk_pick<F, true, SPLIT, false>(gw, lo8, &smem);
    gk_fn down = gk_pick<F, false, SPLIT, false>(gw, lo8, &smem);
    bool ok = xb && hb && sc && up && down && (xrow || !byrow);
    if (ok) {
        uint16_t *xl = SPLIT ? xb + nx : NULL, *hl = SPLIT ? hb + nh : NULL;
        float *xs = sc, *hs = sc + (size_t)rows * xc;
        unsigned gb = cu_blocks((size_t)nk * xc * 32, 256);
        /* by token: x's rows as they are, once */
        const int *gl = byrow ? NULL : list, *gt = byrow ? NULL : total;
        int gn = byrow ? idn : nk, gdn = byrow ? 0 : idn, grep = byrow ? 0 : idrep;
        if (byrow) cu_launch(gf_rowmap_kernel, cu_blocks((size_t)rows, 256), 256, 0, xrow, list, nk, idn, rows);
        if (gw == 2 && lo8) gf_gather_rows<false, true>(xb, xl, xs, x, gl, gn, dim, gt, gdn, grep);
        else if (gw == 2) gf_gather_rows<F == DS_W_BF16, false>(xb, xl, xs, x, gl, gn, dim, gt, gdn, grep);
        else gf_gather_kernel<F == DS_W_BF16><<<gb, 256, 0, cu_s>>>(xb, xl, xs, x, list, nk, dim, total);
        dim3 gu(cu_blocks((size_t)inter, GF_BN / 2), (unsigned)nt), gd(cu_blocks((size_t)dim, GF_BN), (unsigned)nt);
        const cu_weight none = {NULL, NULL};
        cu_launch(up, gu, GG_THREADS, smem, (float *)NULL, hb, hl, hs, xb, xl, xs, dt, tab, tab + ne, dim, inter, 0, xc,
                  (size_t)0, xrow, 0, none);
        cu_launch(down, gd, GG_THREADS, smem, ys, (uint16_t *)NULL, (uint16_t *)NULL, (float *)NULL, hb, hl, hs, dt,
                  tab + 2 * ne, (const cu_weight *)NULL, inter, dim, 0, hc, (size_t)0, (const int *)NULL, 0, none);
        ok = cu_check(cudaGetLastError(), "grouped experts: launch");
    }
    cu_free(xb);
    cu_free(hb);
    cu_free(sc);
    cu_free(xrow);
    return ok;
}

bool cu_grouped_ok(const ds_weight *ew1, const ds_weight *ew2)
{
    ds_wfmt f = ew1[0].fmt;
    return (f == DS_W_BF16 || f == DS_W_FP8) && ew2[0].fmt == f && ew1[0].cols % 16 == 0 && ew1[0].rows % 16 == 0 &&
           ew2[0].cols == ew1[0].rows && ew2[0].rows == ew1[0].cols;
}

/* The experts' products of a prefill: xs rows list[i] of x gathered in expert
 * order (cnt: host prefix counts, ne + 1), ys (total, dim) = per expert
 * w2(silu(w1 x) * w3 x). tab: device table [3][ne] (w1, w3, w2). */
int cu_grouped_tile(void) { return GG_BM; }

bool cu_grouped_ld_ok(void) { return gw_ok() == 2; }
bool cu_grouped_wgmma(void) { return gw_image(); }

bool cu_grouped_experts_dev(float *ys, const float *x, const int *list, const int4 *tiles, int mt, const int *total,
                            int nk, int ne, const cu_weight *tab, ds_wfmt fmt, int dim, int inter, int idn, int idrep)
{
    bool split = cu_gemm_split();
    if (fmt == DS_W_FP8)
        return split ? gf_experts<DS_W_FP8, true>(ys, x, list, tiles, mt, total, nk, tab, ne, dim, inter, idn, idrep)
                     : gf_experts<DS_W_FP8, false>(ys, x, list, tiles, mt, total, nk, tab, ne, dim, inter, idn, idrep);
    return split ? gf_experts<DS_W_BF16, true>(ys, x, list, tiles, mt, total, nk, tab, ne, dim, inter, idn, idrep)
                 : gf_experts<DS_W_BF16, false>(ys, x, list, tiles, mt, total, nk, tab, ne, dim, inter, idn, idrep);
}

bool cu_grouped_experts(float *ys, const float *x, const int *list, const int *cnt, int ne, const cu_weight *tab,
                        ds_wfmt fmt, int dim, int inter)
{
    int nt = 0;
    for (int e = 0; e < ne; e++) nt += (cnt[e + 1] - cnt[e] + GG_BM - 1) / GG_BM;
    if (nt == 0) return true;
    int4 *ht = (int4 *)malloc(sizeof(int4) * (size_t)nt);
    int4 *dt = (int4 *)cu_alloc(sizeof(int4) * (size_t)nt);
    bool ok = ht && dt;
    if (ok) { /* the tiles from the host's counts; every row of the bound is a sorted row */
        int i = 0;
        for (int e = 0; e < ne; e++)
            for (int t = cnt[e]; t < cnt[e + 1]; t += GG_BM)
                ht[i++] = make_int4(e, t, t + GG_BM < cnt[e + 1] ? t + GG_BM : cnt[e + 1], 0);
        cu_upload(dt, ht, sizeof(int4) * (size_t)nt);
        ok = cu_grouped_experts_dev(ys, x, list, dt, nt, NULL, cnt[ne], ne, tab, fmt, dim, inter, 0, 0);
    }
    free(ht);
    cu_free(dt);
    return ok;
}

/* The shared experts of a prefill as one "expert" of every token: ys (n, dim) =
 * w2(silu(w1 x) * w3 x) with w1 and w3 in one launch and h passed on in the down
 * product's form, where three products, two k-split sums and silu_mul ran before. */
bool cu_grouped_mlp(float *ys, const float *x, int n, const cu_weight *w1, const cu_weight *w3, const cu_weight *w2,
                    ds_wfmt fmt, int dim, int inter)
{
    int nt = (n + GG_BM - 1) / GG_BM;
    size_t tb = sizeof(int4) * (size_t)nt, bytes = tb + 3 * sizeof(cu_weight);
    unsigned char *ht = (unsigned char *)malloc(bytes);
    int4 *dt = (int4 *)cu_alloc(bytes);
    bool ok = ht && dt;
    if (ok) {
        for (int i = 0; i < nt; i++)
            ((int4 *)ht)[i] = make_int4(0, i * GG_BM, (i + 1) * GG_BM < n ? (i + 1) * GG_BM : n, 0);
        cu_weight tab[3] = {*w1, *w3, *w2};
        memcpy(ht + tb, tab, sizeof tab);
        cu_upload(dt, ht, bytes);
        const cu_weight *dtab = (const cu_weight *)((unsigned char *)dt + tb);
        bool split = cu_gemm_split();
        if (fmt == DS_W_FP8)
            ok = split ? gf_experts<DS_W_FP8, true>(ys, x, NULL, dt, nt, NULL, n, dtab, 1, dim, inter, 0, 0)
                       : gf_experts<DS_W_FP8, false>(ys, x, NULL, dt, nt, NULL, n, dtab, 1, dim, inter, 0, 0);
        else
            ok = split ? gf_experts<DS_W_BF16, true>(ys, x, NULL, dt, nt, NULL, n, dtab, 1, dim, inter, 0, 0)
                       : gf_experts<DS_W_BF16, false>(ys, x, NULL, dt, nt, NULL, n, dtab, 1, dim, inter, 0, 0);
    }
    free(ht);
    cu_free(dt);
    return ok;
}

/* y (n, rows) = x (n, k) @ W[row0 : row0 + rows]^T for an FP8 weight on the
 * tensor cores: gf_kernel's down form with one "expert" and every token (exact
 * e4m3, activations as f16 parts of x 2^s, block scales on the partial sums of
 * each chunk). Needs k % 16 == 0 and row0 % 32 == 0. */
__device__ __forceinline__ float gf_add(float a, float b) { return a + b; }
__device__ __forceinline__ float4 gf_add(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

/* y[i] = sum of the s partial products at p + j * n, j = 0 .. s - 1, in that order;
 * T float, or float4 for four outputs a thread (16-byte loads, the same sums) */
template <typename T>
__global__ void gf_sum_kernel(T *__restrict__ y, const T *__restrict__ p, size_t n, int s)
{
    cu_pdl_wait();
    cu_pdl_launch();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    T v = p[i];
    for (int j = 1; j < s; j++) v = gf_add(v, p[i + j * n]);
    y[i] = v;
}

/* y = the sum of the s partials of ny floats each in p (part buffers from cu_alloc) */
static void gf_sum(float *y, const float *p, size_t ny, int s)
{
    if (ny % 4 == 0 && (uintptr_t)y % 16 == 0 && (uintptr_t)p % 16 == 0)
        cu_launch(gf_sum_kernel<float4>, cu_blocks(ny / 4, 256), 256, 0, (float4 *)y, (const float4 *)p, ny / 4, s);
    else
        cu_launch(gf_sum_kernel<float>, cu_blocks(ny, 256), 256, 0, y, p, ny, s);
}

/* k splits of a dense product of `blocks` tiles, kc k steps each, on gf_kernel or
 * gq_kernel (two blocks per SM). Each split writes its partial y (ny floats) for
 * gf_sum_kernel. The splits give the SMs about two blocks each (one block per SM left
 * each scheduler two warps: ncu, FP8 wo at prefill 512, 128 blocks, issue slots 39%
 * busy), each split four k steps at least, and the count is chosen by whole waves: the time is about waves x (steps per split + 2, the
 * block's prologue and epilogue), in units of one wave's k step (~2.5 us at prefill
 * 512), plus each extra split's partials written and read back (8 bytes per output at
 * ~3.5 TB/s), among the splits that give the SMs about two blocks each. So 176 tiles of
 * 32 steps split 3 ways (2 waves of 13) rather than 2 (2 waves of 18). */
static int gf_ksplit(int blocks, int kc, size_t ny)
{
    int slots = 2 * cu_sm_count(), most = kc / 4 < 1 ? 1 : kc / 4;
    double pen = (double)ny * 8 / 3.5e12 / 2.5e-6, best_cost = 1e300;
    int best = 1;
    for (int s = 1; s <= most; s++) {
        long b = (long)blocks * s;
        if (b * 10 < (long)slots * 9 && s < most) continue; /* short of a wave: SMs with one block or none */
        double cost = (double)((b + slots - 1) / slots) * ((kc + s - 1) / s + 2) + (s - 1) * pen;
        if (cost < best_cost) best = s, best_cost = cost;
    }
    return best;
}

/* A dense product as one "expert" of every token, its tiles of GG_BM tokens worked out
 * by each block (gk_tile) and the weight passed by value. */
template <bool SPLIT>
static bool gf_dense(float *y, const float *x, int n, const cu_weight *dw, int k, int row0, int rows)
{
    int kc = (k + GF_BK - 1) / GF_BK;
    dim3 grid(cu_blocks((size_t)rows, GF_BN), cu_blocks((size_t)n, GG_BM));
    int gw = row0 % 64 == 0 ? gw_ok() : 0; /* a warpgroup's 64 rows in one scale block */
    int ns = gf_ksplit((int)(grid.x * grid.y), kc, (size_t)n * rows), per = (kc + ns - 1) / ns;
    if (gw == 2) per += per & 1; /* gr_kernel's RS form folds whole 128-column weight blocks */
    ns = (kc + per - 1) / per; /* no empty split */
    grid.z = (unsigned)ns;
    size_t nx = (size_t)n * k, ny = (size_t)n * rows;
    uint16_t *xb = (uint16_t *)cu_alloc(sizeof(uint16_t) * nx * (SPLIT ? 2 : 1));
    float *xs = (float *)cu_alloc(sizeof(float) * (size_t)n * kc);
    float *part = ns > 1 ? (float *)cu_alloc(sizeof(float) * ny * ns) : y;
    bool lo8 = gr_lo8(gw, DS_W_FP8, SPLIT, k, k);
    size_t smem = 0;
    gk_fn fn = gw == 2 ? gk_pick<DS_W_FP8, false, SPLIT, true>(gw, lo8, &smem)
                       : gk_pick<DS_W_FP8, false, SPLIT, false>(gw, lo8, &smem);
    bool ok = xb && xs && part && fn;
    if (ok) {
        uint16_t *xl = SPLIT ? xb + nx : NULL;
        unsigned gb = cu_blocks((size_t)n * kc * 32, 256);
        if (gw == 2 && lo8) gf_gather_rows<false, true>(xb, xl, xs, x, NULL, n, k, NULL, 0, 0);
        else if (gw == 2) gf_gather_rows<false, false>(xb, xl, xs, x, NULL, n, k, NULL, 0, 0);
        else gf_gather_kernel<false><<<gb, 256, 0, cu_s>>>(xb, xl, xs, x, NULL, n, k, NULL);
        cu_launch(fn, grid, GG_THREADS, smem, part, (uint16_t *)NULL, (uint16_t *)NULL, (float *)NULL, xb, xl, xs,
                  (const int4 *)NULL, (const cu_weight *)NULL, (const cu_weight *)NULL, k, rows, row0, per, ny,
                  (const int *)NULL, n, *dw);
        if (ns > 1) gf_sum(y, part, ny, ns);
        ok = cu_check(cudaGetLastError(), "fp8 product: launch");
    }
    cu_free(xb);
    cu_free(xs);
    if (part != y) cu_free(part);
    return ok;
}

/* A dense product as one "expert" for the FP8 GEMM path's kernels: the device tiles of
 * every token (GG_BM each, *nt of them) followed by the one-entry weight table; NULL if
 * out of memory. */
static int4 *dense_tiles(int n, const cu_weight *dw, int *nt)
{
    *nt = (n + GG_BM - 1) / GG_BM;
    int4 *ht = (int4 *)malloc(sizeof(int4) * (size_t)*nt + sizeof(cu_weight));
    int4 *dt = (int4 *)cu_alloc(sizeof(int4) * (size_t)*nt + sizeof(cu_weight));
    if (ht && dt) {
        for (int i = 0; i < *nt; i++) ht[i] = make_int4(0, i * GG_BM, (i + 1) * GG_BM < n ? (i + 1) * GG_BM : n, 0);
        memcpy(ht + *nt, dw, sizeof(cu_weight));
        cu_upload(dt, ht, sizeof(int4) * (size_t)*nt + sizeof(cu_weight));
    } else {
        cu_free(dt);
        dt = NULL;
    }
    free(ht);
    return dt;
}

bool cu_dense_fp8_tc(float *y, const float *x, int n, const cu_weight *dw, int k, int row0, int rows)
{
    return cu_gemm_split() ? gf_dense<true>(y, x, n, dw, k, row0, rows) : gf_dense<false>(y, x, n, dw, k, row0, rows);
}

/* ---- gq_kernel: the reference's fp8_gemm on the FP8
 * tensor cores, for gemm_impl fp8 with FP8 weights. The activations come quantised by
 * act_quant (e4m3 codes, a scale per token and 128 columns) and both operands are
 * codes: mma.m16n8k32 e4m3 x e4m3, float32 sums, each 64-column step's sums times
 * the token's activation scale and the rows' weight scale (constant over the step, as
 * over the reference's 128-column blocks) added to the float32 results. gf_kernel's
 * tiles, warps, B loads and epilogue; A is codes too, in rows of 80 bytes (ldmatrix
 * without bank conflicts). UP writes h = silu(w1 x) * (w3 x) in float32, for
 * act_quant again before w2, as the reference's Expert does. On sm_90 mma.sync on e4m3
 * is emulated (the codes widened to f16): the form of devices without the sm_90a image. */
#define GQ_ST 4

struct gq_stage {
    uint8_t a[GG_BM][GF_BLD(DS_W_FP8)];
    uint8_t b[GF_BN][GF_BLD(DS_W_FP8)];
};
union gq_smem {
    gq_stage s[GQ_ST];
    float c[GG_BM][GF_CLD];
};

template <bool UP>
__device__ __forceinline__ void gq_issue(gq_stage &st, const uint8_t *__restrict__ xq, int t0, int t1,
                                         const cu_weight &wa, const cu_weight &wb, int r0, int rows, int k, int k0,
                                         int row0)
{
    constexpr int per = GF_BK / 16; /* 16-byte chunks of a token's codes per step */
    #pragma unroll
    for (int j = 0; j < GG_BM * per / GG_THREADS; j++) {
        int q = threadIdx.x + j * GG_THREADS, m = q / per, c = (q % per) * 16, t = t0 + m, kk = k0 + c;
        bool in = t < t1 && kk < k;
        cu_cp16(&st.a[m][c], xq + (in ? (size_t)t * k + kk : 0), in);
    }
    gf_issue_b<DS_W_FP8, UP>(st.b, wa, wb, r0, rows, k, k0, row0);
}

/* Four 8 x 8 b16 matrices from shared memory (ldmatrix.x4): lane l gives the row
 * address of matrix l / 8. */
__device__ __forceinline__ void gq_ldm4(uint32_t *r, const void *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* gq_kernel's and gwq_kernel's output from the block's float32 tile c: UP, h =
 * silu(w1 x) * (w3 x) (columns 0..63 the w1 rows, 64..127 the w3 rows); else y. */
template <bool UP>
__device__ __forceinline__ void gq_out(const float (*c)[GF_CLD], float *oy, int t0, int t1, int r0, int rows)
{
    if (UP) {
        for (int o = threadIdx.x; o < GG_BM * GF_BN / 2; o += GG_THREADS) {
            int m = o / (GF_BN / 2), j = o % (GF_BN / 2), t = t0 + m, r = r0 + j;
            float a = c[m][j];
            if (t < t1 && r < rows) oy[(size_t)t * rows + r] = a / (1.0f + expf(-a)) * c[m][GF_BN / 2 + j];
        }
    } else {
        gf_out<false, false, false>(c, oy, NULL, NULL, NULL, t0, t1, r0, rows);
    }
}

/* gf_kernel's grid and arguments, A as act_quant's codes xq (total, k) and scales xs
 * (total, ceil(k / 128)); oy: float32 y (total, rows), or UP h (total, rows). */
template <bool UP>
__global__ void __launch_bounds__(GG_THREADS, 2)
gq_kernel(float *__restrict__ oy, const uint8_t *__restrict__ xq, const float *__restrict__ xs,
          const int4 *__restrict__ tiles, const cu_weight *__restrict__ wa_tab, const cu_weight *__restrict__ wb_tab,
          int k, int rows, int row0, int ksteps, size_t ystride)
{
    extern __shared__ __align__(128) unsigned char gq_raw[];
    gq_smem &sm = *(gq_smem *)gq_raw;
    int4 tl = tiles[blockIdx.y];
    int e = tl.x, t0 = tl.y, t1 = tl.z;
    if (t0 >= t1) return; /* an empty tile past the device-grouped count */
    int r0 = blockIdx.x * (UP ? GF_BN / 2 : GF_BN);
    cu_weight wa = wa_tab[e], wb = UP ? wb_tab[e] : wa;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wm = warp / 4, wn = warp % 4, g = lane / 4;
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    const float *srow;
    {
        const cu_weight &w = UP && wn >= 2 ? wb : wa;
        int r = UP ? r0 + (wn % 2) * 32 : r0 + wn * 32;
        srow = w.scale + (size_t)((row0 + min(r, rows - 1)) / DS_BLOCK) * kb;
    }
    int kc = (k + GF_BK - 1) / GF_BK, ks0 = blockIdx.z * ksteps, nks = min(kc - ks0, ksteps);
    if (!UP) oy += blockIdx.z * ystride;
    bool live[2] = {t0 + wm * 32 < t1, t0 + wm * 32 + 16 < t1};
    const float *xsr[2][2];
    gf_xs_rows(xsr, xs, kb, t0, t1, wm, g);
    float acc[2][4][4] = {}, part[2][4][4];
    #pragma unroll
    for (int st = 0; st < GQ_ST - 1; st++) {
        if (st < nks) gq_issue<UP>(sm.s[st], xq, t0, t1, wa, wb, r0, rows, k, (ks0 + st) * GF_BK, row0);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int it = 0; it < nks; it++) {
        int ks = ks0 + it, b = ks * GF_BK / DS_BLOCK;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(GQ_ST - 2));
        __syncthreads();
        int nx = it + GQ_ST - 1;
        if (nx < nks) gq_issue<UP>(sm.s[nx % GQ_ST], xq, t0, t1, wa, wb, r0, rows, k, (ks0 + nx) * GF_BK, row0);
        asm volatile("cp.async.commit_group;\n" ::);
        float fx[2][2], sw = srow[b];
        #pragma unroll
        for (int i = 0; i < 2; i++)
            #pragma unroll
            for (int h = 0; h < 2; h++) fx[i][h] = xsr[i][h] ? xsr[i][h][b] * sw : 0.0f;
        const gq_stage &st = sm.s[it % GQ_ST];
        #pragma unroll
        for (int kk = 0; kk < GF_BK; kk += 32) {
            uint32_t b0[4], b1[4]; /* n-tile j: k 4q.. and 16 + 4q.. of rows wn * 32 + 8j + g */
            gq_ldm4(b0, &st.b[wn * 32 + lane][kk]);
            gq_ldm4(b1, &st.b[wn * 32 + lane][kk + 16]);
            #pragma unroll
            for (int i = 0; i < 2; i++) {
                if (!live[i]) continue;
                uint32_t a[4]; /* rows g, g + 8 of the 16; k 4q.. then 16 + 4q.. */
                gq_ldm4(a, &st.a[wm * 32 + 16 * i + lane % 16][kk + lane / 16 * 16]);
                #pragma unroll
                for (int j = 0; j < 4; j++) {
                    if (kk == 0) /* a step's first products start its partial sums */
                        cu_mma_e4m3<true>(part[i][j], a, b0[j], b1[j]);
                    else
                        cu_mma_e4m3<false>(part[i][j], a, b0[j], b1[j]);
                }
            }
        }
        gf_fold(acc, part, fx, live);
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads(); /* the stages are done with: the tile goes where they were */
    gf_store_tile(sm.c, acc, wm, wn, lane);
    __syncthreads();
    gq_out<UP>(sm.c, oy, t0, t1, r0, rows);
}

/* ---- gwq_kernel: gq_kernel on Hopper's native FP8 path (the tuning's fp8_wgmma).
 * On sm_90 mma.sync on e4m3 is emulated (the codes widened to f16 and run on the f16
 * tensor cores: gq_kernel issued ~29 instructions per mma, ALU the busiest pipe);
 * wgmma takes e4m3 as it is, at twice the f16 rate. Same grid, tiles and arguments
 * as gq_kernel; steps of 128 codes, one scale block, so each step's sums are scaled
 * once. Two warpgroups: each takes the 64 tokens against 64 of the block's 128
 * weight rows (UP: warpgroup 0 the w1 rows, 1 the w3 rows), four wgmma m64n64k32 a
 * step. Both operands are codes in shared memory, a step's 128 codes of a row in
 * one 128-byte swizzled row (gr_kernel's GR_SW and gr_desc, a 16-bit element being
 * a pair of codes; the no-swizzle core layout's cp.async read half lines of each row).
 * cp.async stages GWQ_ST deep; every
 * step waits for its own wgmmas, two blocks per SM overlap one another's waits.
 * Needs row0 % 64 == 0 (a warpgroup's rows in one scale block). sm_90a only.
 * Precision: the FP8 tensor cores keep fewer bits than float32 in their own sums
 * (DeepSeek-V3's report: about 14), so each instruction's 32-code sums are added to the
 * float32 sums on their own: 4.1e-5 RMS relative against float32 sums, 4.2e-5 / 5.3e-5 of
 * the largest output on the golden fp8_gemm (bar 1e-4). Once per 128-code step, as the
 * reference's Triton fp8_gemm does on Hopper, was ~3% faster (16B prefill, gemm_impl fp8:
 * 26.7 against 27.45 ms) but 1.1e-4 and 1.3e-4 / 2.2e-4, over the bar. */
#define GWQ_BK 128 /* codes (bytes) of k per step */
#define GWQ_ST 4

struct __align__(1024) gwq_stage {
    uint16_t a[GG_BM * GWQ_BK / 2]; /* GR_SW layout, as 16-bit pairs of codes */
    uint16_t b[GF_BN * GWQ_BK / 2];
};
union gwq_smem {
    gwq_stage s[GWQ_ST];
    float c[GG_BM][GF_CLD];
};

template <bool UP>
__device__ __forceinline__ void gwq_issue(gwq_stage &st, const uint8_t *__restrict__ xq, int t0, int t1,
                                          const cu_weight &wa, const cu_weight &wb, int r0, int rows, int k, int k0,
                                          int row0)
{
    #pragma unroll
    for (int j = 0; j < GG_BM * GWQ_BK / 16 / GG_THREADS; j++) {
        int q = threadIdx.x + j * GG_THREADS, m = q / 8, c = (q % 8) * 8, t = t0 + m, kk = k0 + 2 * c;
        bool in = t < t1 && kk < k;
        cu_cp16(&st.a[GR_SW(m, c)], xq + (in ? (size_t)t * k + kk : 0), in);
    }
    #pragma unroll
    for (int j = 0; j < GF_BN * GWQ_BK / 16 / GG_THREADS; j++) {
        int q = threadIdx.x + j * GG_THREADS, n = q / 8, c = (q % 8) * 8, kk = k0 + 2 * c;
        const cu_weight &w = UP && n >= GF_BN / 2 ? wb : wa;
        int r = UP ? r0 + n % (GF_BN / 2) : r0 + n;
        bool in = r < rows && kk < k;
        cu_cp16(&st.b[GR_SW(n, c)], (const uint8_t *)w.data + (in ? (size_t)(row0 + r) * k + kk : 0), in);
    }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GWQ_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                  "+f"(d[i + 6]), "+f"(d[i + 7])
/* wgmma m64n64k32 on e4m3 codes, the 32 sums in d (acc 0: they start from zero) */
__device__ __forceinline__ void gwq_mma(float *d, uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1;\n}\n"
                 : GWQ_D8(0), GWQ_D8(8), GWQ_D8(16), GWQ_D8(24)
                 : "l"(da), "l"(db), "r"(acc));
}
#undef GWQ_D8
#endif

template <bool UP>
__global__ void __launch_bounds__(GG_THREADS, 2)
gwq_kernel(float *__restrict__ oy, const uint8_t *__restrict__ xq, const float *__restrict__ xs,
           const int4 *__restrict__ tiles, const cu_weight *__restrict__ wa_tab, const cu_weight *__restrict__ wb_tab,
           int k, int rows, int row0, int ksteps, size_t ystride)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char gwq_raw[];
    gwq_smem &sm = *(gwq_smem *)gr_align(gwq_raw);
    int4 tl = tiles[blockIdx.y];
    int e = tl.x, t0 = tl.y, t1 = tl.z;
    if (t0 >= t1) return; /* an empty tile past the device-grouped count */
    int r0 = blockIdx.x * (UP ? GF_BN / 2 : GF_BN);
    cu_weight wa = wa_tab[e], wb = UP ? wb_tab[e] : wa;
    int lane = threadIdx.x % 32, wg = threadIdx.x / 128, w4 = (threadIdx.x / 32) % 4, g = lane / 4;
    int kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    const float *srow = gw_srow<UP>(wa, wb, wg, r0, row0, rows, kb);
    int kc = (k + GWQ_BK - 1) / GWQ_BK, ks0 = blockIdx.z * ksteps, nks = min(kc - ks0, ksteps);
    if (!UP) oy += blockIdx.z * ystride;
    const float *xsr[2];
    gw_xs_rows(xsr, xs, kb, t0, t1, w4, g);
    float acc[32], part[32];
    #pragma unroll
    for (int i = 0; i < 32; i++) acc[i] = part[i] = 0.0f;
    #pragma unroll
    for (int st = 0; st < GWQ_ST - 1; st++) {
        if (st < nks) gwq_issue<UP>(sm.s[st], xq, t0, t1, wa, wb, r0, rows, k, (ks0 + st) * GWQ_BK, row0);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    /* the step's scales, loaded a step ahead: waiting on them before the wgmmas cost a
     * round trip a step */
    float sn = nks > 0 ? srow[ks0] : 0.0f, xn[2];
    #pragma unroll
    for (int h = 0; h < 2; h++) xn[h] = xsr[h] && nks > 0 ? xsr[h][ks0] : 0.0f;
    for (int it = 0; it < nks; it++) {
        int ks = ks0 + it;
        float fx[2];
        #pragma unroll
        for (int h = 0; h < 2; h++) fx[h] = xn[h] * sn;
        if (it + 1 < nks) {
            sn = srow[ks + 1];
            #pragma unroll
            for (int h = 0; h < 2; h++) xn[h] = xsr[h] ? xsr[h][ks + 1] : 0.0f;
        }
        asm volatile("cp.async.wait_group %0;\n" ::"n"(GWQ_ST - 2));
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads(); /* the step's codes are in, and every wgmma of the slot refilled below is done */
        int nx = it + GWQ_ST - 1;
        if (nx < nks) gwq_issue<UP>(sm.s[nx % GWQ_ST], xq, t0, t1, wa, wb, r0, rows, k, (ks0 + nx) * GWQ_BK, row0);
        asm volatile("cp.async.commit_group;\n" ::);
        const gwq_stage &st = sm.s[it % GWQ_ST];
        /* each 32-code product (16 pairs an instruction) into the float32 sums on its own */
        #pragma unroll
        for (int kk = 0; kk < GWQ_BK / 2; kk += 16) {
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
            gwq_mma(part, gr_desc(&st.a[kk]), gr_desc(&st.b[wg * 64 * GWQ_BK / 2 + kk]), 0);
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            #pragma unroll
            for (int i = 0; i < 32; i++) acc[i] += fx[(i / 2) % 2] * part[i];
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads(); /* the stages are done with: the tile goes where they were */
    gw_store_tile(sm.c, acc, wg, w4, lane);
    __syncthreads();
    gq_out<UP>(sm.c, oy, t0, t1, r0, rows);
#endif
}

/* Whether gwq_kernel is asked for (tuning fp8_wgmma) and can run here (an sm_90a
 * image; gw_probe_kernel), with its shared memory granted. */
static bool gwq_ready(void)
{
    static bool done;
    return cu_tune.fp8_wgmma && gw_image() && gk_smem(&done, gwq_kernel<true>, gwq_kernel<false>, sizeof(gwq_smem) + 1024);
}

static bool gq_ready(void)
{
    static bool done;
    return gk_smem(&done, gq_kernel<true>, gq_kernel<false>, sizeof(gq_smem));
}

bool cu_dense_fp8q(float *y, const uint8_t *xq, const float *xs, int n, const cu_weight *dw, int k, int row0, int rows)
{
    bool wq = row0 % 64 == 0 && gwq_ready();
    if (!wq && !gq_ready()) return false;
    int nt;
    int4 *dt = dense_tiles(n, dw, &nt);
    if (!dt) return false;
    const cu_weight *tab = (const cu_weight *)(dt + nt);
    int bk = wq ? GWQ_BK : GF_BK, kc = (k + bk - 1) / bk;
    dim3 grid(cu_blocks((size_t)rows, GF_BN), (unsigned)nt);
    int ns = gf_ksplit((int)(grid.x * grid.y), kc, (size_t)n * rows), per = (kc + ns - 1) / ns;
    ns = (kc + per - 1) / per; /* no empty split */
    grid.z = (unsigned)ns;
    size_t ny = (size_t)n * rows;
    float *part = ns > 1 ? (float *)cu_alloc(sizeof(float) * ny * ns) : y;
    bool ok = part != NULL;
    if (ok) {
        if (wq)
            gwq_kernel<false><<<grid, GG_THREADS, sizeof(gwq_smem) + 1024, cu_s>>>(part, xq, xs, dt, tab, NULL, k, rows, row0, per,
                                                                           ny);
        else
            gq_kernel<false><<<grid, GG_THREADS, sizeof(gq_smem), cu_s>>>(part, xq, xs, dt, tab, NULL, k, rows, row0, per,
                                                                         ny);
        if (ns > 1) gf_sum(y, part, ny, ns);
        ok = cu_check(cudaGetLastError(), "fp8 product: launch");
    }
    if (part != y) cu_free(part);
    cu_free(dt);
    return ok;
}

bool cu_grouped_experts_q(float *ys, const float *x, const int *list, const int4 *tiles, int mt, const int *total,
                          int nk, int ne, const cu_weight *tab, int dim, int inter, bool ue8m0)
{
    bool wq = gwq_ready();
    if (!wq && !gq_ready()) return false;
    int kbd = (dim + DS_BLOCK - 1) / DS_BLOCK, kbi = (inter + DS_BLOCK - 1) / DS_BLOCK;
    uint8_t *xq = (uint8_t *)cu_alloc((size_t)nk * dim), *hq = (uint8_t *)cu_alloc((size_t)nk * inter);
    float *sc = (float *)cu_alloc(sizeof(float) * (size_t)nk * (kbd + kbi));
    float *h = (float *)cu_alloc(sizeof(float) * (size_t)nk * inter);
    bool ok = xq && hq && sc && h;
    if (ok) {
        float *xs = sc, *hs = sc + (size_t)nk * kbd;
        dim3 gu(cu_blocks((size_t)inter, GF_BN / 2), (unsigned)mt), gd(cu_blocks((size_t)dim, GF_BN), (unsigned)mt);
        cu_act_quant_rows(x, list, total, nk, dim, xq, xs, ue8m0);
        if (wq)
            gwq_kernel<true><<<gu, GG_THREADS, sizeof(gwq_smem) + 1024, cu_s>>>(h, xq, xs, tiles, tab, tab + ne, dim, inter, 0,
                                                                         (dim + GWQ_BK - 1) / GWQ_BK, 0);
        else
            gq_kernel<true><<<gu, GG_THREADS, sizeof(gq_smem), cu_s>>>(h, xq, xs, tiles, tab, tab + ne, dim, inter, 0,
                                                                       (dim + GF_BK - 1) / GF_BK, 0);
        cu_act_quant_rows(h, NULL, total, nk, inter, hq, hs, ue8m0);
        if (wq)
            gwq_kernel<false><<<gd, GG_THREADS, sizeof(gwq_smem) + 1024, cu_s>>>(ys, hq, hs, tiles, tab + 2 * ne, NULL, inter,
                                                                          dim, 0, (inter + GWQ_BK - 1) / GWQ_BK, 0);
        else
            gq_kernel<false><<<gd, GG_THREADS, sizeof(gq_smem), cu_s>>>(ys, hq, hs, tiles, tab + 2 * ne, NULL, inter,
                                                                        dim, 0, (inter + GF_BK - 1) / GF_BK, 0);
        ok = cu_check(cudaGetLastError(), "grouped experts (fp8): launch");
    }
    cu_free(xq);
    cu_free(hq);
    cu_free(sc);
    cu_free(h);
    return ok;
}
