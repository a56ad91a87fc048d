/* cuda_grouped.cu - products of a prefill on the tensor cores that cuBLAS does
 * not cover well: the routed experts (one grouped launch per weight kind over
 * the tokens gathered in expert order) and FP8 weights with block scales.
 *
 * Tiles: GG_BM = 64 tokens of one expert x BN weight rows per block of 8 warps
 * (2 x 4 warps, bf16 WMMA 16x16x16 with float32 accumulation). A tile list
 * (expert, first token, end token) made on the host from the routing counts
 * tells each block its expert, so one launch covers every expert whatever its
 * token count; 16-row fragments wholly past an expert's last token skip their
 * products.
 *   up:   B rows 0 .. BN/2-1 are rows r0.. of w1, the rest the same rows of w3;
 *         the epilogue writes h = silu(w1 x) * (w3 x) as bf16 (hi + lo halves).
 *   down: B rows are BN rows of w2; the epilogue writes float32 y rows.
 * Activations: bf16 hi + lo halves (x = hi + lo to ~16 bits, two products per
 * fragment; the default), or bf16 once with DSV3_CUDA_GEMM=bf16.
 *   BF16 weights: ga_kernel, BN = 256 (warp: 32 tokens x 64 rows), cp.async
 *     with GA_ST stages of GA_BK = 32.
 *   FP8 weights: gg_kernel, BN = 128 (warp: 32 x 32), GG_BK = 64 with the next
 *     step's loads held in registers; e4m3 values are exact in bf16, and each
 *     warp's 32 columns lie in one 128-row scale block, so its partial sums
 *     over each 128-k block are scaled by that block's scale (as the
 *     reference's fp8_gemm does). cu_dense_fp8_tc uses the down form for an
 *     ordinary FP8 matmul (one "expert", every token).
 * Needs K % 16 == 0 for both products and 16-byte aligned weights. */
#include <cuda_bf16.h>
#include <mma.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"

using namespace nvcuda;

#define GG_BM 64
#define GG_BN 128
#define GG_BK 64
#define GG_LD (GG_BK + 8) /* shared row stride in bf16: 144 bytes, 16-byte aligned rows */
#define GG_CLD (GG_BN + 4)
#define GG_THREADS 256

struct gg_smem_pipe { /* bf16 bits; a[1] (the lo halves) only in split mode */
    uint16_t a[2][2][GG_BM][GG_LD]; /* [stage][hi, lo] */
    uint16_t b[2][GG_BN][GG_LD];
};
union gg_smem {
    gg_smem_pipe p;
    float c[GG_BM][GG_CLD];
};

__device__ __forceinline__ uint32_t gg_pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* x (n, k) float32 rows list[i] (row i without a list) -> xh (total, k) bf16 and, when xl is not NULL,
 * xl = bf16(x - xh) (the hi + lo split keeps ~16 bits of x) */
__global__ void gg_gather_kernel(__nv_bfloat16 *__restrict__ xh, __nv_bfloat16 *__restrict__ xl,
                                 const float *__restrict__ x, const int *__restrict__ list, int total, int k,
                                 const int *__restrict__ total_d = NULL)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, k4 = (size_t)k / 4;
    if (total_d) total = *total_d; /* the grid covers the bound, the device holds the count */
    if (i >= (size_t)total * k4) return;
    size_t r = i / k4, c = (i % k4) * 4;
    float4 v = *(const float4 *)(x + (size_t)(list ? list[r] : (int)r) * k + c);
    uint2 o = {gg_pack(v.x, v.y), gg_pack(v.z, v.w)};
    *(uint2 *)(xh + r * k + c) = o;
    if (xl) {
        __nv_bfloat162 a = *(__nv_bfloat162 *)&o.x, b = *(__nv_bfloat162 *)&o.y;
        float2 fa = __bfloat1622float2(a), fb = __bfloat1622float2(b);
        uint2 l = {gg_pack(v.x - fa.x, v.y - fa.y), gg_pack(v.z - fb.x, v.w - fb.y)};
        *(uint2 *)(xl + r * k + c) = l;
    }
}

/* One thread's share of a stage (GG_BK = 64): A: 64 rows x 8 chunks of 8 bf16
 * = 512 chunks, two per thread (and two of lo); B: 128 rows x 64 k, BF16: 1024
 * chunks of 8, four per thread (row tid / 2, 32 consecutive k); FP8: the same
 * 32 k from two 16-byte loads, dequantised into four chunks of 8 bf16. */
struct gg_regs {
    uint4 a[2][2]; /* [hi, lo][chunk] */
    uint4 b[4];
};

template <int F, bool UP, bool SPLIT>
__device__ __forceinline__ void gg_load(gg_regs &g, const __nv_bfloat16 *__restrict__ xh,
                                        const __nv_bfloat16 *__restrict__ xl, int t0, int t1, const cu_weight &wa,
                                        const cu_weight &wb, int r0, int rows, int k, int k0, int row0)
{
    int tid = threadIdx.x;
    #pragma unroll
    for (int j = 0; j < 2; j++) {
        int q = tid + j * GG_THREADS, m = q / 8, c = (q % 8) * 8, t = t0 + m, kk = k0 + c;
        bool in = t < t1 && kk < k;
        g.a[0][j] = in ? *(const uint4 *)(xh + (size_t)t * k + kk) : make_uint4(0, 0, 0, 0);
        if (SPLIT) g.a[1][j] = in ? *(const uint4 *)(xl + (size_t)t * k + kk) : make_uint4(0, 0, 0, 0);
    }
    int n = tid / 2, c = (tid % 2) * 32, kk = k0 + c;
    const cu_weight &w = UP && n >= GG_BN / 2 ? wb : wa;
    int r = UP ? r0 + n % (GG_BN / 2) : r0 + n;
    bool in = r < rows;
    r += row0;
    if (F == DS_W_BF16) {
        const uint4 *p = (const uint4 *)((const __nv_bfloat16 *)w.data + (size_t)r * k + kk);
        #pragma unroll
        for (int j = 0; j < 4; j++) g.b[j] = in && kk + 8 * j < k ? p[j] : make_uint4(0, 0, 0, 0);
    } else {
        const uint4 *p = (const uint4 *)((const uint8_t *)w.data + (size_t)r * k + kk);
        const float s = 1.0f; /* e4m3 values are exact in bf16; the block scales are applied to partial sums */
        #pragma unroll
        for (int h = 0; h < 2; h++) {
            uint4 u = in && kk + 16 * h < k ? p[h] : make_uint4(0, 0, 0, 0);
            uint32_t v[4] = {u.x, u.y, u.z, u.w}, o[8];
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                o[2 * e] = gg_pack(cu_e4m3_bits(v[e]) * s, cu_e4m3_bits(v[e] >> 8) * s);
                o[2 * e + 1] = gg_pack(cu_e4m3_bits(v[e] >> 16) * s, cu_e4m3_bits(v[e] >> 24) * s);
            }
            g.b[2 * h] = make_uint4(o[0], o[1], o[2], o[3]);
            g.b[2 * h + 1] = make_uint4(o[4], o[5], o[6], o[7]);
        }
    }
}

template <bool SPLIT>
__device__ __forceinline__ void gg_store(const gg_regs &g, gg_smem_pipe &s, int buf)
{
    int tid = threadIdx.x;
    #pragma unroll
    for (int j = 0; j < 2; j++) {
        int q = tid + j * GG_THREADS, m = q / 8, c = (q % 8) * 8;
        *(uint4 *)&s.a[buf][0][m][c] = g.a[0][j];
        if (SPLIT) *(uint4 *)&s.a[buf][1][m][c] = g.a[1][j];
    }
    int n = tid / 2, c = (tid % 2) * 32;
    #pragma unroll
    for (int j = 0; j < 4; j++) *(uint4 *)&s.b[buf][n][c + 8 * j] = g.b[j];
}

/* The block's outputs from the float32 tile c (GG_BM x BN, row stride CLD): UP:
 * h = silu(c[:, j]) * c[:, BN/2 + j] as bf16 (hi into oh, lo into ol in split
 * mode); else y = c as float32. */
template <bool UP, bool SPLIT, int BN, int CLD>
__device__ __forceinline__ void gg_epilogue(const float (*c)[CLD], float *__restrict__ oy,
                                            __nv_bfloat16 *__restrict__ oh, __nv_bfloat16 *__restrict__ ol, int t0,
                                            int t1, int r0, int rows)
{
    if (UP) {
        for (int o = threadIdx.x; o < GG_BM * BN / 2; o += GG_THREADS) {
            int m = o / (BN / 2), j = o % (BN / 2), t = t0 + m, r = r0 + j;
            if (t >= t1 || r >= rows) continue;
            float a = c[m][j], v = a / (1.0f + expf(-a)) * c[m][BN / 2 + j];
            __nv_bfloat16 hi = __float2bfloat16_rn(v);
            oh[(size_t)t * rows + r] = hi;
            if (SPLIT) ol[(size_t)t * rows + r] = __float2bfloat16_rn(v - __bfloat162float(hi));
        }
    } else {
        for (int o = threadIdx.x; o < GG_BM * BN; o += GG_THREADS) {
            int m = o / BN, j = o % BN, t = t0 + m, r = r0 + j;
            if (t < t1 && r < rows) oy[(size_t)t * rows + r] = c[m][j];
        }
    }
}

/* ---- BF16 weights: tiles of GG_BM tokens x GA_BN = 256 weight rows fed by
 * cp.async, GA_ST stages of GA_BK; each warp 32 tokens x 64 rows (2 x 4
 * fragments: twice the products per fragment load of the 128-row tiles, and
 * half the re-reads of the activations). Stage 6, first version: 128-row tiles,
 * 4 stages (UP 627 us per layer at the 16B config, split mode). */

#define GA_BN 256
#define GA_BK 32
#define GA_LD (GA_BK + 8)
#define GA_ST 3
#define GA_CLD (GA_BN + 4)

struct ga_stage { /* bf16 bits */
    uint16_t a[2][GG_BM][GA_LD]; /* hi, lo (split mode) */
    uint16_t b[GA_BN][GA_LD];
};
union ga_smem {
    ga_stage s[GA_ST];
    float c[GG_BM][GA_CLD];
};

/* 16 bytes global -> shared, asynchronously; zeros when !p (g must still be a valid address) */
__device__ __forceinline__ void ga_cp16(void *sp, const void *g, bool p)
{
    unsigned sa = (unsigned)__cvta_generic_to_shared(sp);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(g), "r"(p ? 16 : 0));
}

template <bool UP, bool SPLIT>
__device__ __forceinline__ void ga_issue(ga_stage &st, const __nv_bfloat16 *__restrict__ xh,
                                         const __nv_bfloat16 *__restrict__ xl, int t0, int t1, const cu_weight &wa,
                                         const cu_weight &wb, int r0, int rows, int k, int k0, int row0)
{
    int tid = threadIdx.x;
    {
        int m = tid / 4, c = (tid % 4) * 8, t = t0 + m, kk = k0 + c;
        bool in = t < t1 && kk < k;
        size_t off = in ? (size_t)t * k + kk : 0;
        ga_cp16(&st.a[0][m][c], xh + off, in);
        if (SPLIT) ga_cp16(&st.a[1][m][c], xl + off, in);
    }
    #pragma unroll
    for (int j = 0; j < GA_BN * 4 / GG_THREADS; j++) {
        int q = tid + j * GG_THREADS, n = q / 4, c = (q % 4) * 8, kk = k0 + c;
        const cu_weight &w = UP && n >= GA_BN / 2 ? wb : wa;
        int r = UP ? r0 + n % (GA_BN / 2) : r0 + n;
        bool in = r < rows && kk < k;
        size_t off = in ? (size_t)(row0 + r) * k + kk : 0;
        ga_cp16(&st.b[n][c], (const __nv_bfloat16 *)w.data + off, in);
    }
}

template <bool UP, bool SPLIT>
__global__ void __launch_bounds__(GG_THREADS, 2)
ga_kernel(float *__restrict__ oy, __nv_bfloat16 *__restrict__ oh, __nv_bfloat16 *__restrict__ ol,
          const __nv_bfloat16 *__restrict__ xh, const __nv_bfloat16 *__restrict__ xl, const int4 *__restrict__ tiles,
          const cu_weight *__restrict__ wa_tab, const cu_weight *__restrict__ wb_tab, int k, int rows, int row0)
{
    extern __shared__ __align__(128) unsigned char ga_raw[];
    ga_smem &sm = *(ga_smem *)ga_raw;
    int4 tl = tiles[blockIdx.y];
    int e = tl.x, t0 = tl.y, t1 = tl.z;
    if (t0 >= t1) return; /* an empty tile past the device-grouped count */
    int r0 = blockIdx.x * (UP ? GA_BN / 2 : GA_BN);
    cu_weight wa = wa_tab[e], wb = UP ? wb_tab[e] : wa;
    int warp = threadIdx.x / 32, wm = warp / 4, wn = warp % 4;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][4];
    #pragma unroll
    for (int i = 0; i < 2; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    /* fragments whose 16 token rows are all past the tile's end do no products
     * (an expert's last tile is often part-filled) */
    bool live[2] = {t0 + wm * 32 < t1, t0 + wm * 32 + 16 < t1};
    int nk = (k + GA_BK - 1) / GA_BK;
    #pragma unroll
    for (int st = 0; st < GA_ST - 1; st++) {
        if (st < nk) ga_issue<UP, SPLIT>(sm.s[st], xh, xl, t0, t1, wa, wb, r0, rows, k, st * GA_BK, row0);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int ks = 0; ks < nk; ks++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(GA_ST - 2));
        __syncthreads();
        int nx = ks + GA_ST - 1;
        if (nx < nk) ga_issue<UP, SPLIT>(sm.s[nx % GA_ST], xh, xl, t0, t1, wa, wb, r0, rows, k, nx * GA_BK, row0);
        asm volatile("cp.async.commit_group;\n" ::);
        const ga_stage &st = sm.s[ks % GA_ST];
        #pragma unroll
        for (int kk = 0; kk < GA_BK; kk += 16) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[4];
            #pragma unroll
            for (int j = 0; j < 4; j++)
                wmma::load_matrix_sync(fb[j], (const __nv_bfloat16 *)&st.b[wn * 64 + j * 16][kk], GA_LD);
            #pragma unroll
            for (int hl = 0; hl < (SPLIT ? 2 : 1); hl++) {
                #pragma unroll
                for (int i = 0; i < 2; i++) {
                    if (!live[i]) continue;
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
                    wmma::load_matrix_sync(fa, (const __nv_bfloat16 *)&st.a[hl][wm * 32 + i * 16][kk], GA_LD);
                    #pragma unroll
                    for (int j = 0; j < 4; j++) wmma::mma_sync(acc[i][j], fa, fb[j], acc[i][j]);
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    #pragma unroll
    for (int i = 0; i < 2; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++)
            wmma::store_matrix_sync(&sm.c[wm * 32 + i * 16][wn * 64 + j * 16], acc[i][j], GA_CLD, wmma::mem_row_major);
    __syncthreads();
    gg_epilogue<UP, SPLIT, GA_BN, GA_CLD>(sm.c, oy, oh, ol, t0, t1, r0, rows);
}

/* tiles[blockIdx.y] = (expert e, first token, end token); blockIdx.x: GG_BN rows
 * (UP: GG_BN / 2 rows of w1 and the same of w3). A: xh (+ xl) bf16 (total, k).
 * UP writes h = silu(w1 x) * (w3 x) as bf16 into oh (and the remainder into ol
 * in split mode), (total, rows); else float32 y (total, rows) into oy. */
template <int F, bool UP, bool SPLIT>
__global__ void __launch_bounds__(GG_THREADS, 2)
gg_kernel(float *__restrict__ oy, __nv_bfloat16 *__restrict__ oh, __nv_bfloat16 *__restrict__ ol,
          const __nv_bfloat16 *__restrict__ xh, const __nv_bfloat16 *__restrict__ xl, const int4 *__restrict__ tiles,
          const cu_weight *__restrict__ wa_tab, const cu_weight *__restrict__ wb_tab, int k, int rows, int row0)
{
    extern __shared__ __align__(128) unsigned char gg_raw[];
    gg_smem &sm = *(gg_smem *)gg_raw;
    int4 tl = tiles[blockIdx.y];
    int e = tl.x, t0 = tl.y, t1 = tl.z;
    if (t0 >= t1) return; /* an empty tile past the device-grouped count */
    int r0 = blockIdx.x * (UP ? GG_BN / 2 : GG_BN);
    cu_weight wa = wa_tab[e], wb = UP ? wb_tab[e] : wa;
    int warp = threadIdx.x / 32, wm = warp / 4, wn = warp % 4;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
    #pragma unroll
    for (int i = 0; i < 2; i++)
        #pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    /* FP8: this warp's 32 columns lie in one 128-row block of one weight (UP: wn < 2
     * w1, else w3; r0 is a multiple of 64): partial sums over each 128-k block are
     * scaled by that block's scale, as the reference's fp8_gemm does */
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> part[2][2];
    const float *srow = NULL;
    if (F == DS_W_FP8) {
        const cu_weight &w = UP && wn >= 2 ? wb : wa;
        int r = UP ? r0 + (wn % 2) * 32 : r0 + wn * 32;
        r = row0 + min(r, rows - 1);
        srow = w.scale + (size_t)(r / DS_BLOCK) * ((k + DS_BLOCK - 1) / DS_BLOCK);
        #pragma unroll
        for (int i = 0; i < 2; i++)
            #pragma unroll
            for (int j = 0; j < 2; j++) wmma::fill_fragment(part[i][j], 0.0f);
    }
    bool live[2] = {t0 + wm * 32 < t1, t0 + wm * 32 + 16 < t1}; /* see ga_kernel */
    gg_regs g;
    gg_load<F, UP, SPLIT>(g, xh, xl, t0, t1, wa, wb, r0, rows, k, 0, row0);
    gg_store<SPLIT>(g, sm.p, 0);
    __syncthreads();
    int nk = (k + GG_BK - 1) / GG_BK;
    for (int ks = 0; ks < nk; ks++) {
        int buf = ks & 1;
        if (ks + 1 < nk) gg_load<F, UP, SPLIT>(g, xh, xl, t0, t1, wa, wb, r0, rows, k, (ks + 1) * GG_BK, row0);
        #pragma unroll
        for (int kk = 0; kk < GG_BK; kk += 16) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
            #pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::load_matrix_sync(fb[j], (const __nv_bfloat16 *)&sm.p.b[buf][wn * 32 + j * 16][kk], GG_LD);
            #pragma unroll
            for (int hl = 0; hl < (SPLIT ? 2 : 1); hl++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
                #pragma unroll
                for (int i = 0; i < 2; i++)
                    if (live[i]) wmma::load_matrix_sync(fa[i], (const __nv_bfloat16 *)&sm.p.a[buf][hl][wm * 32 + i * 16][kk], GG_LD);
                #pragma unroll
                for (int i = 0; i < 2; i++)
                    #pragma unroll
                    for (int j = 0; j < 2; j++) {
                        if (!live[i]) continue;
                        if (F == DS_W_FP8) wmma::mma_sync(part[i][j], fa[i], fb[j], part[i][j]);
                        else wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
                    }
            }
        }
        if (F == DS_W_FP8 && (((ks + 1) * GG_BK) % DS_BLOCK == 0 || ks + 1 == nk)) {
            float sc = srow[ks * GG_BK / DS_BLOCK];
            #pragma unroll
            for (int i = 0; i < 2; i++)
                #pragma unroll
                for (int j = 0; j < 2; j++) {
                    #pragma unroll
                    for (int q = 0; q < acc[i][j].num_elements; q++) acc[i][j].x[q] += sc * part[i][j].x[q];
                    wmma::fill_fragment(part[i][j], 0.0f);
                }
        }
        if (ks + 1 < nk) gg_store<SPLIT>(g, sm.p, buf ^ 1);
        __syncthreads();
    }
    #pragma unroll
    for (int i = 0; i < 2; i++)
        #pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&sm.c[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], GG_CLD, wmma::mem_row_major);
    __syncthreads();
    gg_epilogue<UP, SPLIT, GG_BN, GG_CLD>(sm.c, oy, oh, ol, t0, t1, r0, rows);
}

template <int F, bool SPLIT>
static bool gg_launch(float *ys, __nv_bfloat16 *xh, __nv_bfloat16 *xl, __nv_bfloat16 *hh, __nv_bfloat16 *hl,
                      const int4 *dt, int nt, const cu_weight *tab, int ne, int dim, int inter)
{
    static bool attr;
    size_t smem = F == DS_W_BF16 ? sizeof(ga_smem) : sizeof(gg_smem);
    if (!attr) {
        if (F == DS_W_BF16)
            attr = cu_check(cudaFuncSetAttribute(ga_kernel<true, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                            "grouped experts: shared memory") &&
                   cu_check(cudaFuncSetAttribute(ga_kernel<false, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                            "grouped experts: shared memory");
        else
            attr = cu_check(cudaFuncSetAttribute(gg_kernel<F, true, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                            "grouped experts: shared memory") &&
                   cu_check(cudaFuncSetAttribute(gg_kernel<F, false, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                            "grouped experts: shared memory");
        if (!attr) return false;
    }
    dim3 gu(cu_blocks((size_t)inter, GG_BN / 2), (unsigned)nt), gd(cu_blocks((size_t)dim, GG_BN), (unsigned)nt);
    if (F == DS_W_BF16) {
        gu.x = cu_blocks((size_t)inter, GA_BN / 2);
        gd.x = cu_blocks((size_t)dim, GA_BN);
        ga_kernel<true, SPLIT><<<gu, GG_THREADS, smem, cu_s>>>(NULL, hh, hl, xh, xl, dt, tab, tab + ne, dim, inter, 0);
        ga_kernel<false, SPLIT><<<gd, GG_THREADS, smem, cu_s>>>(ys, NULL, NULL, hh, hl, dt, tab + 2 * ne, NULL, inter, dim, 0);
    } else {
        gg_kernel<F, true, SPLIT><<<gu, GG_THREADS, smem, cu_s>>>(NULL, hh, hl, xh, xl, dt, tab, tab + ne, dim, inter, 0);
        gg_kernel<F, false, SPLIT><<<gd, GG_THREADS, smem, cu_s>>>(ys, NULL, NULL, hh, hl, dt, tab + 2 * ne, NULL, inter, dim, 0);
    }
    return cu_check(cudaGetLastError(), "grouped experts: launch");
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

bool cu_grouped_experts_dev(float *ys, const float *x, const int *list, const int4 *tiles, int mt, const int *total,
                            int nk, int ne, const cu_weight *tab, ds_wfmt fmt, int dim, int inter)
{
    bool split = cu_gemm_split();
    int halves = split ? 2 : 1;
    size_t nx = (size_t)nk * dim, nh = (size_t)nk * inter;
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cu_alloc(sizeof(__nv_bfloat16) * nx * halves);
    __nv_bfloat16 *hb = (__nv_bfloat16 *)cu_alloc(sizeof(__nv_bfloat16) * nh * halves);
    bool ok = xb && hb;
    if (ok) {
        __nv_bfloat16 *xl = split ? xb + nx : NULL, *hl = split ? hb + nh : NULL;
        gg_gather_kernel<<<cu_blocks(nx / 4, 256), 256, 0, cu_s>>>(xb, xl, x, list, nk, dim, total);
        if (fmt == DS_W_FP8)
            ok = split ? gg_launch<DS_W_FP8, true>(ys, xb, xl, hb, hl, tiles, mt, tab, ne, dim, inter)
                       : gg_launch<DS_W_FP8, false>(ys, xb, xl, hb, hl, tiles, mt, tab, ne, dim, inter);
        else
            ok = split ? gg_launch<DS_W_BF16, true>(ys, xb, xl, hb, hl, tiles, mt, tab, ne, dim, inter)
                       : gg_launch<DS_W_BF16, false>(ys, xb, xl, hb, hl, tiles, mt, tab, ne, dim, inter);
    }
    cu_free(xb);
    cu_free(hb);
    return ok;
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
        ok = cu_grouped_experts_dev(ys, x, list, dt, nt, NULL, cnt[ne], ne, tab, fmt, dim, inter);
    }
    free(ht);
    cu_free(dt);
    return ok;
}

/* y (n, rows) = x (n, k) @ W[row0 : row0 + rows]^T for an FP8 weight on the
 * tensor cores (the down kernel with one "expert" and every token): e4m3
 * values exact in bf16, block scales on the partial sums of each 128-k block,
 * activations bf16 (hi + lo in split mode). Needs k % 16 == 0. */
bool cu_dense_fp8_tc(float *y, const float *x, int n, const cu_weight *dw, int k, int row0, int rows)
{
    bool split = cu_gemm_split();
    int nt = (n + GG_BM - 1) / GG_BM, halves = split ? 2 : 1;
    size_t nx = (size_t)n * k;
    int4 *ht = (int4 *)malloc(sizeof(int4) * (size_t)nt + sizeof(cu_weight));
    int4 *dt = (int4 *)cu_alloc(sizeof(int4) * (size_t)nt + sizeof(cu_weight));
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cu_alloc(sizeof(__nv_bfloat16) * nx * halves);
    bool ok = ht && dt && xb;
    if (ok) {
        for (int i = 0; i < nt; i++) ht[i] = make_int4(0, i * GG_BM, (i + 1) * GG_BM < n ? (i + 1) * GG_BM : n, 0);
        memcpy(ht + nt, dw, sizeof(cu_weight));
        cu_upload(dt, ht, sizeof(int4) * (size_t)nt + sizeof(cu_weight));
        const cu_weight *tab = (const cu_weight *)(dt + nt);
        __nv_bfloat16 *xl = split ? xb + nx : NULL;
        gg_gather_kernel<<<cu_blocks(nx / 4, 256), 256, 0, cu_s>>>(xb, xl, x, NULL, n, k);
        static bool attr[2];
        size_t smem = sizeof(gg_smem);
        dim3 grid(cu_blocks((size_t)rows, GG_BN), (unsigned)nt);
        if (split) {
            if (!attr[1])
                attr[1] = cu_check(cudaFuncSetAttribute(gg_kernel<DS_W_FP8, false, true>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                                   "fp8 product: shared memory");
            if (attr[1])
                gg_kernel<DS_W_FP8, false, true><<<grid, GG_THREADS, smem, cu_s>>>(y, NULL, NULL, xb, xl, dt, tab, NULL,
                                                                                 k, rows, row0);
            ok = attr[1];
        } else {
            if (!attr[0])
                attr[0] = cu_check(cudaFuncSetAttribute(gg_kernel<DS_W_FP8, false, false>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                                   "fp8 product: shared memory");
            if (attr[0])
                gg_kernel<DS_W_FP8, false, false><<<grid, GG_THREADS, smem, cu_s>>>(y, NULL, NULL, xb, xl, dt, tab, NULL,
                                                                                  k, rows, row0);
            ok = attr[0];
        }
        ok = ok && cu_check(cudaGetLastError(), "fp8 product: launch");
    }
    free(ht);
    cu_free(dt);
    cu_free(xb);
    return ok;
}
