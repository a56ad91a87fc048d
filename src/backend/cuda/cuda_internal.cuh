/* cuda_internal.cuh - what the CUDA backend's files share: error recording,
 * the staging of op arguments between host and device, the weight cache, the
 * element decoders (e4m3, bf16), warp and block reductions, PDL and cluster
 * launches, the tuning in force, and each file's entry points (cuda_backend.cu
 * lists the files). */
#ifndef DS_CUDA_INTERNAL_CUH
#define DS_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
}

/* ---- errors: ops return void, so a failure is recorded (sticky) and printed once */

/* Records e if it is an error, naming what failed; returns true on success. */
bool cu_check(cudaError_t e, const char *what);

/* ---- staging: every pointer an op touches goes through a cu_io for the call */

#define CU_IO_MAX 16

typedef struct {
    struct {
        void *dev, *host;
        size_t bytes;
        bool back;   /* copy dev -> host at cu_end */
        bool owned;  /* a cudaMalloc of its own (the arena was full) */
    } b[CU_IO_MAX];
    int n;
    bool failed;
    bool host_io; /* a host argument was staged: the op must wait at cu_end */
} cu_io;

/* The stream every op is queued on. */
extern cudaStream_t cu_s;

/* A device-readable view of bytes at p: p itself when the device can read it
 * (managed, device or mapped pinned memory), else a staged copy. */
const void *cu_in(cu_io *io, const void *p, size_t bytes);
/* A device-writable view of p; copy_in when the op also reads it. Staged
 * copies are written back to p by cu_end. */
void *cu_out(cu_io *io, void *p, size_t bytes, bool copy_in);
/* Device scratch valid until cu_end (256-byte aligned, not zeroed). */
void *cu_tmp(cu_io *io, size_t bytes);
/* Checks the launches, synchronises the device, copies staged outputs back
 * and releases the call's scratch. op names the op in error messages. */
void cu_end(cu_io *io, const char *op);

/* cuda_op_times' accounting of one entry of the ops table (cuda_backend.cu wraps every
 * entry): cu_op_enter returns whether this call is counted (timing on, no capture), and
 * then cu_op_leave(name) must follow when the entry returns; only the outermost entry of
 * a nest is timed. */
bool cu_op_enter(void);
void cu_op_leave(const char *op);

/* True when the device can dereference p directly. */
bool cu_device_readable(const void *p);

/* ---- weights */

typedef struct {
    const void *data;   /* device copy of w->data (full matrix) */
    const float *scale; /* device copy of w->scale (FP8), else NULL */
} cu_weight;

/* The device copy of w, uploaded on first use; false (error recorded) if it
 * could not be made. */
bool cu_weight_get(const ds_weight *w, cu_weight *out);

/* ---- element decoders */

/* e4m3fn -> float32 by moving the bits: sign to bit 31, the 4 exponent and 3
 * mantissa bits to bits 23..29, then * 2^(127-7) to rebias the exponent. Exact
 * for every finite code, subnormals included (f32 subnormal * 2^120 is exact);
 * the NaN codes 0x7f/0xff decode to +-480 (weights and act_quant outputs never
 * hold them). Integer ops and one multiply: the hardware cvt from e4m3 has a
 * low throughput on sm_90 and made the FP8 GEMV compute-bound. */
__device__ __forceinline__ float cu_e4m3_bits(uint32_t b)
{
    return __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) * 0x1p120f;
}

__device__ __forceinline__ float cu_e4m3(uint8_t b) { return cu_e4m3_bits(b); }

__device__ __forceinline__ float cu_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* The four e4m3 codes in the bytes of p (lowest first) as float32, exact for every finite
 * code (the NaN codes give NaN). sm_89 and later: the hardware converts each pair to an
 * f16x2 in one instruction (FP8 batch 1 1.483 ms against 1.597 by the per-code
 * conversion, batch 8 6.45 against 7.51 on the H200). Older devices: each pair into an f16x2 by integer ops (a code's 7 low bits shifted left 7 with
 * its sign at bit 15 is the f16 of its value times 2^-8, subnormals included), times 2^8
 * (exact in f16); the NaN codes then give +-480. Then widened on the FP pipe. */
__device__ __forceinline__ void cu_e4m3x4(uint32_t p, float *out)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    #pragma unroll
    for (int h = 0; h < 2; h++) {
        __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(p >> (16 * h)), __NV_E4M3);
        float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&r));
        out[2 * h] = f.x;
        out[2 * h + 1] = f.y;
    }
#else
    #pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t w = __byte_perm(p, 0, h ? 0x3424 : 0x1404); /* codes 2h, 2h + 1 to bits 8.., 24.. */
        uint32_t v = (w & 0x80008000u) | ((w >> 1) & 0x3f803f80u);
        __half2 x = *reinterpret_cast<const __half2 *>(&v);
        float2 f = __half22float2(__hmul2(x, __float2half2_rn(256.0f)));
        out[2 * h] = f.x;
        out[2 * h + 1] = f.y;
    }
#endif
}

/* Codes 2h, 2h + 1 of the word p as an f16x2 (exact; sm_89 and later). */
__device__ __forceinline__ uint32_t cu_e4m3x2(uint32_t p, int h)
{
    __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(p >> (16 * h)), __NV_E4M3);
    return *reinterpret_cast<uint32_t *>(&r);
}

__device__ __forceinline__ uint32_t cu_f16x2(float a, float b)
{
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* bf16 hi of a, b as one bf16x2 word, *lo (when lo) their remainders' the same way */
__device__ __forceinline__ uint32_t bf16x2_split(float a, float b, uint32_t *lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    if (lo) {
        float2 f = __bfloat1622float2(h);
        __nv_bfloat162 l = __floats2bfloat162_rn(a - f.x, b - f.y);
        *lo = *(uint32_t *)&l;
    }
    return *(uint32_t *)&h;
}

/* d += A (16 x 16, row major: a0..a3) . B (16 x 8, column major: b0, b1) on the
 * tensor cores, bf16 (BF) or f16 operands, float32 sums (mma.m16n8k16). Registers
 * only, so not volatile: the compiler may move it among the fragment loads. */
template <bool BF>
__device__ __forceinline__ void cu_mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1)
{
    if (BF)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* d (+)= A (16 x 32, row major: a[0..3], 4 codes each) . B (32 x 8, column major:
 * b0, b1) on e4m3 codes, float32 sums (mma.m16n8k32, sm_89 and later); ZERO: d =
 * A . B, no sums in. */
template <bool ZERO>
__device__ __forceinline__ void cu_mma_e4m3(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    if (ZERO) {
        const float z = 0.0f;
        asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %10, %10, %10};"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
    } else {
        asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

/* d = A . B (cu_mma with zero sums in: no registers to clear first) */
template <bool BF>
__device__ __forceinline__ void cu_mma0(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1)
{
    const float z = 0.0f;
    if (BF)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%10, %10, %10, %10};"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(z));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%10, %10, %10, %10};"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(z));
}

/* d += A (16 x 8, row major: a0..a3) . B (8 x 8, column major: b0, b1), TF32
 * operands (the low 13 bits of each float32 are not used), float32 sums
 * (mma.m16n8k8). */
__device__ __forceinline__ void cu_mma_tf32(float *d, const uint32_t *a, const uint32_t *b)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* x as a TF32 high part (x with its low 13 bits cleared: exact) and the rest, whose
 * own TF32 carries the next ~11 bits: big + small holds ~22 bits of x. */
__device__ __forceinline__ void cu_tf32_split(float x, uint32_t *big, uint32_t *small)
{
    uint32_t b = __float_as_uint(x) & 0xffffe000u;
    *big = b;
    *small = __float_as_uint(x - __uint_as_float(b));
}

/* The four float32 of an m16n8k8 A fragment split as cu_tf32_split does. */
__device__ __forceinline__ void cu_tf32_split4(const float *a, uint32_t *big, uint32_t *small)
{
    #pragma unroll
    for (int i = 0; i < 4; i++) cu_tf32_split(a[i], &big[i], &small[i]);
}

/* d += A . B for float32 A (split: ab + as, m16n8k8 layout) and B (b[2]) in three
 * TF32 products, the small terms first: small.big + big.small + big.big. The
 * dropped small.small term is ~2^-22 of a product, so the sums are float32-like. */
__device__ __forceinline__ void cu_mma_tf32x3(float *d, const uint32_t *ab, const uint32_t *as, const float *b)
{
    uint32_t bb[2], bs[2];
    cu_tf32_split(b[0], &bb[0], &bs[0]);
    cu_tf32_split(b[1], &bb[1], &bs[1]);
    cu_mma_tf32(d, as, bb);
    cu_mma_tf32(d, ab, bs);
    cu_mma_tf32(d, ab, bb);
}

/* 16 bytes global -> shared, asynchronously (cp.async); zeros when !p (g must still
 * be a valid address) */
__device__ __forceinline__ void cu_cp16(void *sp, const void *g, bool p)
{
    unsigned sa = (unsigned)__cvta_generic_to_shared(sp);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(g), "r"(p ? 16 : 0));
}

/* Element i of a weight matrix stored as F (ds_wfmt), without its FP8 scale. */
template <int F>
__device__ __forceinline__ float cu_wload(const void *w, size_t i)
{
    if (F == DS_W_F32) return ((const float *)w)[i];
    if (F == DS_W_BF16) return cu_bf16(((const uint16_t *)w)[i]);
    return cu_e4m3(((const uint8_t *)w)[i]);
}

/* Bytes per element of format F. */
template <int F>
struct cu_wsize {
    static constexpr int v = F == DS_W_F32 ? 4 : F == DS_W_BF16 ? 2 : 1;
};

/* Elements i .. i + 16/size of a matrix in format F from one 16-byte load
 * (i must be a multiple of 16/size and the row 16-byte aligned). */
template <int F>
__device__ __forceinline__ void cu_wload16(const void *w, size_t i, float *out)
{
    constexpr int E = 16 / cu_wsize<F>::v;
    uint4 u = *(const uint4 *)((const uint8_t *)w + i * cu_wsize<F>::v);
    uint32_t p[4] = {u.x, u.y, u.z, u.w};
    if (F == DS_W_F32) {
        #pragma unroll
        for (int e = 0; e < 4; e++) out[e] = __uint_as_float(p[e]);
    } else if (F == DS_W_BF16) {
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            out[2 * e] = __uint_as_float(p[e] << 16);
            out[2 * e + 1] = __uint_as_float(p[e] & 0xffff0000u);
        }
    } else {
        #pragma unroll
        for (int e = 0; e < 4; e++) cu_e4m3x4(p[e], out + 4 * e);
    }
    (void)E;
}

__device__ __forceinline__ float cu_warp_sum(float v)
{
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v)
{
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The merge factors of S split partials of a softmax (each split's max pm_z and sum
 * pl_z): fz[z] = e^(pm_z - M) / sum_z pl_z e^(pm_z - M), M = max_z pm_z, and 0 where
 * pm_z = -inf (a split past the position: its partial is never read). Warp 0 sums into
 * red[2], every thread of the block fills fz; a block barrier after each. L2: pm and pl
 * read with __ldcg (written by other blocks of the same launch). */
template <bool L2 = false>
__device__ __forceinline__ void cu_split_factors(float *fz, float *red, const float *pm, const float *pl, int S)
{
    auto ld = [](const float *a) { return L2 ? __ldcg(a) : *a; };
    if (threadIdx.x < 32) {
        float mx = -INFINITY, sum = 0;
        for (int z = threadIdx.x; z < S; z += 32) mx = fmaxf(mx, ld(pm + z));
        mx = cu_warp_max(mx);
        for (int z = threadIdx.x; z < S; z += 32) {
            float m = ld(pm + z);
            if (m != -INFINITY) sum += ld(pl + z) * expf(m - mx);
        }
        sum = cu_warp_sum(sum);
        if (threadIdx.x == 0) red[0] = mx, red[1] = sum;
    }
    __syncthreads();
    for (int z = threadIdx.x; z < S; z += blockDim.x) {
        float m = ld(pm + z);
        fz[z] = m == -INFINITY ? 0.0f : expf(m - red[0]) / red[1];
    }
    __syncthreads();
}

/* ---- programmatic dependent launch (PDL): decode kernels are launched with
 * cu_launch, which lets the next kernel of the stream (or of the captured graph)
 * start while this one drains. Every kernel launched so calls cu_pdl_wait()
 * before it reads or writes anything an earlier kernel touches (and before any
 * return), then cu_pdl_launch() to let its own dependent start; work on
 * constant data (weight addresses, L2 prefetch of weights) may come first.
 * Both are no-ops in a kernel launched without the attribute. */
__device__ __forceinline__ void cu_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void cu_pdl_launch(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Prefetches bytes at p into L2, the block's threads taking 128-byte lines. */
__device__ __forceinline__ void cu_prefetch_l2(const void *p, size_t bytes)
{
    const char *c = (const char *)((uintptr_t)p & ~(uintptr_t)127);
    const char *end = (const char *)p + bytes;
    for (c += (size_t)threadIdx.x * 128; c < end; c += (size_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(c));
}

/* The sum of v over the block, returned to every thread (blockDim.x a multiple of 32);
 * part: 32 floats of shared memory. */
__device__ __forceinline__ float cu_block_sum(float v, float *part)
{
    v = cu_warp_sum(v);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0;
        t = cu_warp_sum(t);
        if (threadIdx.x == 0) part[0] = t;
    }
    __syncthreads();
    return part[0];
}

/* The unsigned integer that orders as the float v does (for v not NaN; -0 below +0). */
__device__ __forceinline__ unsigned cu_float_key(float v)
{
    unsigned b = __float_as_uint(v);
    return b ^ ((unsigned)((int)b >> 31) | 0x80000000u);
}

/* Gate.forward for one token by one warp (moe_route's kernel, and the last block of
 * the fused gate kernel): sc (E scores, overwritten with the softmax / sigmoid) -> the
 * K <= 32 experts ix and weights w. biased and probs (E floats each) and gs (G floats)
 * are the warp's shared scratch; bias (E floats or NULL) may be global or shared memory.
 * sc is read once (bypassing L1: other blocks may have written it) into biased, and the
 * chosen probabilities come from probs, not sc: every dependent global round trip is a
 * few hundred cycles of a latency-bound launch.
 * Softmax / sigmoid with warp reductions, group scores one lane per group, then K
 * rounds of a warp argmax over the experts not taken (ties to the lowest index, as the
 * reference's first strict maximum): each lane's best, then the largest key and the
 * lowest index holding it, each one redux instruction (five dependent shuffle steps
 * before: the rounds were most of the routing's time). */
template <bool IN_SMEM = false>
__device__ __forceinline__ void cu_route_warp(int *ix, float *w, float *sc, const float *__restrict__ bias,
                                              float *biased, float *probs, float *gs, int E, int K, int G, int limited,
                                              bool sigmoid, float rscale)
{
    int lane = threadIdx.x % 32;
    if (!IN_SMEM) { /* IN_SMEM: the scores are in biased already (sc is still written) */
        #pragma unroll 8
        for (int e = lane; e < E; e += 32) biased[e] = __ldcg(&sc[e]);
    }
    __syncwarp();
    float mx = 0, den = 1;
    if (!sigmoid) {
        mx = -INFINITY, den = 0;
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, biased[e]);
        mx = cu_warp_max(mx);
        for (int e = lane; e < E; e += 32) den += expf(biased[e] - mx);
        den = cu_warp_sum(den);
    }
    #pragma unroll 8
    for (int e = lane; e < E; e += 32) {
        float v = sigmoid ? 1.0f / (1.0f + expf(-biased[e])) : expf(biased[e] - mx) / den;
        sc[e] = v;
        probs[e] = v;
        biased[e] = bias ? v + bias[e] : v;
    }
    __syncwarp();
    if (G > 1) {
        int per = E / G;
        for (int g = lane; g < G; g += 32) {
            const float *p = biased + g * per;
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int j = 0; j < per; j++) {
                if (p[j] > m1) {
                    m2 = m1;
                    m1 = p[j];
                } else if (p[j] > m2) {
                    m2 = p[j];
                }
            }
            gs[g] = bias ? m1 + m2 : m1;
        }
        __syncwarp();
        if (lane == 0) /* keep the `limited` best groups: mark kept ones with +inf in gs */
            for (int k = 0; k < limited; k++) {
                int best = -1;
                for (int g = 0; g < G; g++)
                    if (gs[g] != INFINITY && (best < 0 || gs[g] > gs[best])) best = g;
                gs[best] = INFINITY;
            }
        __syncwarp();
        for (int e = lane; e < E; e += 32)
            if (gs[e / per] != INFINITY) biased[e] = -INFINITY;
        __syncwarp();
    }
    uint32_t taken = 0;
    int mine = 0; /* lane k: the expert of round k */
    for (int k = 0; k < K; k++) {
        int best = -1;
        float bv = 0;
        for (int e = lane, i = 0; e < E; e += 32, i++)
            if (!(taken >> i & 1) && (best < 0 || biased[e] > bv)) best = e, bv = biased[e];
        /* key 0: no expert left in this lane (every real score's key is above it). The
         * keys order -0 below +0, where floats tie; no biased score is -0 (softmax and
         * sigmoid give +0 at least, masked groups -inf) */
        unsigned key = best < 0 ? 0u : cu_float_key(bv), top = __reduce_max_sync(0xffffffffu, key);
        best = (int)__reduce_min_sync(0xffffffffu, best >= 0 && key == top ? (unsigned)best : 0xffffffffu);
        if (best % 32 == lane) taken |= 1u << (best / 32);
        if (lane == k) mine = best;
    }
    float v = lane < K ? probs[mine] : 0.0f; /* written by this warp before __syncwarp */
    float sum = sigmoid ? cu_warp_sum(v) : 1.0f;
    if (lane < K) {
        ix[lane] = mine;
        w[lane] = v / sum * rscale;
    }
}

/* A cluster barrier in two halves: arrive at a kernel's start (relaxed: nothing to
 * publish), wait before the first write into another block's shared memory, which is
 * allowed only once every block of the cluster has started. */
__device__ __forceinline__ void cu_cluster_arrive_relaxed(void)
{
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

__device__ __forceinline__ void cu_cluster_wait(void)
{
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* prefetch.global.L2 of the 128-byte lines over [p, p + bytes): line i by caller t when
 * i % nthr == t (nthr callers sharing the range; 0, 1: one caller takes every line). */
__device__ __forceinline__ void cu_prefetch_lane_l2(const void *p, size_t bytes, int t, int nthr)
{
    const char *c = (const char *)((uintptr_t)p & ~(uintptr_t)127);
    const char *end = (const char *)p + bytes;
    for (c += (size_t)t * 128; c < end; c += (size_t)nthr * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(c));
}

/* The tuning in force (cuda_backend_set_tuning; cuda_backend.h says what each field does). */
extern cuda_tuning cu_tune;

/* kernel<<<g, b, smem, cu_s>>>(args...) with the PDL attribute, in thread block clusters
 * of cx blocks along x when cx > 1 (sm_90). */
template <typename... P, typename... A>
static inline void cu_launch_cluster(void (*kernel)(P...), dim3 g, dim3 b, unsigned cx, size_t smem, A... args)
{
    cudaLaunchAttribute at[2];
    unsigned na = 0;
    if (cx > 1) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = cx;
        at[na].val.clusterDim.y = 1;
        at[na].val.clusterDim.z = 1;
        na++;
    }
    at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[na].val.programmaticStreamSerializationAllowed = 1;
    na++;
    cudaLaunchConfig_t c = {};
    c.gridDim = g;
    c.blockDim = b;
    c.dynamicSmemBytes = smem;
    c.stream = cu_s;
    c.attrs = at;
    c.numAttrs = na;
    cudaLaunchKernelEx(&c, kernel, ((P)args)...);
}

template <typename... P, typename... A>
static inline void cu_launch(void (*kernel)(P...), dim3 g, dim3 b, size_t smem, A... args)
{
    cu_launch_cluster(kernel, g, b, 1, smem, args...);
}

/* The device's multiprocessor count (1 if it cannot be read), asked once. */
static inline int cu_sm_count(void)
{
    static int sms;
    if (!sms) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            sms < 1)
            sms = 1;
    }
    return sms;
}

static inline unsigned cu_blocks(size_t n, unsigned per) { return (unsigned)((n + per - 1) / per); }

/* Device memory from the pool: scratch whose contents are undefined (see the tuning's
 * scratch_fill), or zeroed (ds_ops.alloc). */
void *cu_alloc(size_t bytes);
void *cu_alloc_zeroed(size_t bytes);
void cu_free(void *p);
void cu_upload(void *dst, const void *src, size_t bytes);
void cu_download(void *dst, const void *src, size_t bytes);
void cu_sync(void);
void cu_zero(void *p, size_t bytes);
ds_status cu_upload_weight(ds_weight *w);

/* Norms, rope and small ops (cuda_norm.cu). */
void cu_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps);
void cu_rmsnorm_rows(float *y, int ys, const int *di, float *x, int xs, const float *r, const float *w, int n, int dim,
                     float eps);
void cu_rope(float *x, int n, int nvec, int stride, int off, int rope, const int *pos, const float *cos_tab,
             const float *sin_tab);
void cu_rope_copy(float *dst, int ds, const int *di, const float *src, int ss, int n, int nvec, int rope,
                  const int *pos, const float *cos_tab, const float *sin_tab);
void cu_mla_prologue(float *kv, float *pe, const int *row, const float *kvx, const float *norm_w, float eps, float *qp,
                     const float *q, int n, int H, int qk, int nope, int R, int rope, const int *pos,
                     const float *cos_tab, const float *sin_tab);
void cu_embed(float *h, const ds_weight *emb, const int32_t *tok, int n, int row0);
/* Decode attention (cuda_attn_decode.cu) and sampling (cuda_sample.cu). */
void cu_attention(const ds_attn_args *a, ds_attn_impl impl);
void cu_pick_rows(int32_t *host_out, float *x, int n, int V, const ds_pick *p);
/* The backend's cuBLAS handle on its stream (made on first use; cuda_gemm.cu), NULL when
 * cuBLAS cannot start. */
cublasHandle_t cu_blas(void);

/* The products (cuda_gemm.cu). */
void cu_matmul(float *y, const float *x, int n, const ds_weight *w, int row0, int rows, ds_gemm_impl gemm,
               bool ue8m0);
/* The jobs' gemvs in one launch when they fit (1..4 jobs, the same 1..8 tokens and
 * weight format, 16-byte loads, not the FP8 act_quant path);
 * else cu_matmul per job. */
void cu_matmul_many(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0);
/* ds_ops.matmul_many_normed (BF16 weights) and matmul_carry at one token. */
bool cu_matmul_many_normed(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0, const float *h,
                           const float *r, const float *g, float eps);
bool cu_matmul_carry(float *y, const float *x, int n, const ds_weight *w, ds_gemm_impl gemm, bool ue8m0, float *h);
void cu_matmul_t(float *y, const float *x, int n, const ds_weight *w, int row0, int rows);
void cu_matmul_heads(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0, int hstride,
                     int rows);
void cu_matmul_heads_t(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                       int hstride, int rows);
void cu_moe_experts(float *y, const float *x, int n, int K, const int *idx, const float *wt, const ds_weight *ew1,
                    const ds_weight *ew2, const ds_weight *ew3, int e0, int ne, const ds_mlp_w *shared,
                    ds_gemm_impl gemm, bool ue8m0);
/* ds_ops.mla_prologue_attend: one token in mla_attend's one-launch form, which makes the
 * prologue's cache rows and q_pe itself (cuda_attn_decode.cu); false: not taken. */
bool cu_mla_prologue_attend(const ds_mla_pro *p, const ds_attn_args *a, const ds_weight *wkv_b);
void cu_add(float *y, const float *x, size_t n);
void cu_moe_route(int *idx, float *wt, float *sc, const float *bias, int n, int E, int K, int groups,
                  int limited_groups, bool sigmoid, float route_scale);
void cu_moe_gate(int *idx, float *wt, float *sc, const float *x, const ds_weight *gate, const float *bias, int n,
                 int K, int groups, int limited_groups, bool sigmoid, float route_scale);
void cu_copy_rows(float *dst, int dst_stride, const int *di, const float *src, int src_stride, const int *si, int n,
                  int len);
void cu_add_rows_scaled(float *y, const int *idx, const float *x, const float *w, int n, int dim);
void cu_silu_mul(float *a, const float *b, size_t n);
/* y_p (cnt_p, rows) = x_p (cnt_p, k) @ W_p^T for p < np (x_p = x + off_p * k,
 * y_p = y + off_p * rows; off, cnt host arrays; W_p BF16 (rows, k)) in one
 * grouped cuBLAS product; false when cuBLAS refuses it. */
bool cu_blas_grouped(float *y, const float *x, int total, const int *off, const int *cnt, const cu_weight *w, int np,
                     int k, int rows);
/* True when prefill products split activations into bf16 hi + lo halves (~16
 * bits; the default); the tuning's gemm_bf16: rounded to bf16 once. */
bool cu_gemm_split(void);
/* Products queued between cu_gemm_force_split(true) and (false) split their activations
 * whatever gemm_bf16 says (the gate's, which moe_gate promises exact). */
void cu_gemm_force_split(bool on);
/* The routed experts of a prefill on the tensor cores (cuda_grouped.cu):
 * ys (total, dim) = per expert w2(silu(w1 x) * w3 x) over the rows list[i] of x
 * gathered in expert order (cnt: host prefix counts, ne + 1 entries); tab: the
 * device table [3][ne] of w1, w3, w2. cu_grouped_ok: the weights suit it. */
bool cu_grouped_ok(const ds_weight *ew1, const ds_weight *ew2);
bool cu_grouped_experts(float *ys, const float *x, const int *list, const int *cnt, int ne, const cu_weight *tab,
                        ds_wfmt fmt, int dim, int inter);
/* The same with the grouping on the device (nothing downloaded): moe_place_kernel's list
 * and tiles, mt tiles (the empty ones do nothing), *total (device) rows of at most nk;
 * total NULL: exactly nk rows (cu_grouped_experts, tiles from the host). Rows nk ..
 * nk + idn * idrep - 1 after them are x's rows 0 .. idn - 1, idrep times over (the shared
 * experts' pseudo-experts; their tiles' w field is their w2's row length, which only
 * gr_kernel reads: cu_grouped_ld_ok). */
bool cu_grouped_experts_dev(float *ys, const float *x, const int *list, const int4 *tiles, int mt, const int *total,
                            int nk, int ne, const cu_weight *tab, ds_wfmt fmt, int dim, int inter, int idn, int idrep);
/* True when the grouped kernels take a tile's own weight row length (gr_kernel runs). */
bool cu_grouped_ld_ok(void);
/* True when the device runs this build's sm_90a (warpgroup MMA) code. */
bool cu_grouped_wgmma(void);
/* The same for one MLP over all n rows of x (the shared experts of a prefill, weights
 * that pass cu_grouped_ok): ys (n, dim) = w2(silu(w1 x) * w3 x); false: nothing queued
 * or a launch failed. */
bool cu_grouped_mlp(float *ys, const float *x, int n, const cu_weight *w1, const cu_weight *w3, const cu_weight *w2,
                    ds_wfmt fmt, int dim, int inter);
/* Tokens per tile of the grouped kernels. */
int cu_grouped_tile(void);
/* y (n, rows) = x (n, k) @ W[row0 : row0 + rows]^T, W FP8 (device copy dw), on
 * the tensor cores with exact e4m3 values and block scales on partial sums;
 * k % 16 == 0 and row0 % 32 == 0 (a warp's 32 rows in one scale block); false
 * when it could not run (nothing queued). */
bool cu_dense_fp8_tc(float *y, const float *x, int n, const cu_weight *dw, int k, int row0, int rows);
/* act_quant (the reference's 1 x 128 e4m3 quantisation) of rows list[i] of x (i < m,
 * or < *total_d when given; row i without a list) into y (m, k) codes and s (m,
 * ceil(k / 128)) scales, queued on the backend's stream (cuda_gemm.cu). */
void cu_act_quant_rows(const float *x, const int *list, const int *total_d, int m, int k, uint8_t *y, float *s,
                       bool ue8m0);
/* The FP8 GEMM path at decode: y (m, k) = x rounded to act_quant's codes times their
 * scales (y may be x), and the same for y2 / x2 (m2, k2; none when m2 is 0), in one
 * launch. The exact-dequantisation gemv kernels on y then give the reference's fp8_gemm,
 * sum_b s_x s_w sum_k q_x q_w, as sum_b s_w sum_k (q_x s_x) q_w: equal but for float
 * rounding (cuda_gemm.cu). */
void cu_fake_quant(float *y, const float *x, int m, int k, float *y2, const float *x2, int m2, int k2, bool ue8m0);
/* The reference's fp8_gemm on the FP8 tensor cores (gq_kernel / gwq_kernel,
 * cuda_grouped.cu): y (n, rows) from act_quant's codes xq (n, k) and scales xs and
 * the FP8 weight rows row0..; k % 16 == 0, row0 % 32 == 0. False: nothing queued. */
bool cu_dense_fp8q(float *y, const uint8_t *xq, const float *xs, int n, const cu_weight *dw, int k, int row0, int rows);
/* The experts of a prefill the same way: cu_grouped_experts_dev's arguments (FP8
 * weights), x rows quantised by act_quant, h = silu(w1 x) * (w3 x) quantised again
 * before w2, as the reference's Expert with gemm_impl fp8. */
bool cu_grouped_experts_q(float *ys, const float *x, const int *list, const int4 *tiles, int mt, const int *total,
                          int nk, int ne, const cu_weight *tab, int dim, int inter, bool ue8m0);
/* Absorb attention of a prefill (a->contiguous, n >= 16 tokens, device
 * buffers) as float32 GEMMs; false when it does not apply (nothing queued). */
bool cu_attention_dense(const ds_attn_args *a);
/* Split partials of a decode attention in the absorb form (cuda_attn_decode.cu): per (t*H + h)
 * and split z, the running max pm, sum pl and unnormalised o_c po (kv_rank floats) at
 * index (t*H + h) * splits + z; a split past the token's position has pm = -inf and no
 * po. pm heads one pool allocation (cu_free(pm) frees all). */
typedef struct {
    float *pm, *pl, *po;
    int splits;
} cu_attn_parts;
/* True when cu_attention_parts takes a (attn_tc_kernel in more than one split; shapes
 * and alignment only, a->q_c may still be NULL). */
bool cu_attention_parts_ok(const ds_attn_args *a);
/* Queues the split attention of a without its merge; false (nothing queued) where
 * cu_attention_parts_ok is. */
bool cu_attention_parts(const ds_attn_args *a, cu_attn_parts *out);
bool cu_mla_attend(const ds_attn_args *a, const ds_weight *wkv_b, const float *q, int qk);
bool cu_mla_expanded(const ds_attn_args *a, const ds_weight *wkv_b, const float *q, int qk);
/* Whether flash_kernel takes score rows of D and value rows of DV, with split (hi + lo)
 * operands or not (the tuning's flash not 0, its shared memory granted). */
bool cu_flash_ok(int D, int DV, bool split);
/* The expanded form's attention of n queries (positions pos0 ..) of H heads over P keys
 * from cu_mla_expanded's bf16 packs (split: hi and lo parts), into out (n H rows of DV)
 * in one launch (cuda_attn_prefill.cu); false when nothing was queued. */
bool cu_flash_attend(float *out, const void *Q, const void *Kp, const void *V, int n, int H, int P, int pos0,
                     float scale, int D, int DV, bool split);
/* Fills the graph entries of the ops table (cuda_mem.cu). */
void cu_graph_ops(ds_ops *ops);
/* Frees the MoE layers' expert tables (cuda_forget_weights). */
void cu_moe_forget(void);

#endif
