/* cuda_attn_prefill.cu - attention of a prefill pass (several consecutive tokens of
 * one sequence), on the tensor cores.
 *
 * Absorb form (cu_attention_dense, ds_ops.attention with n >= 16 contiguous tokens):
 * S = q_c KV^T + q_pe PE^T for all heads at once, causal softmax, out = P KV, as
 * cuBLAS products over chunks of tokens. Expanded form (cu_mla_expanded, reached
 * through ds_ops.mla_attend where it counts fewer multiply-adds: long passes near the
 * start of the cache): the cached latents expanded once with wkv_b into per-head keys
 * and values, then MHA, by flash_kernel (scores, softmax and values in one launch, on
 * warpgroup MMA on Hopper, mma.sync elsewhere) where its head sizes are compiled in,
 * else by cuBLAS products and a softmax launch per chunk. Float32 operands are split
 * into bf16 hi + lo (three products hi.hi + hi.lo + lo.hi, ~16 bits) unless the
 * tuning's gemm_bf16 rounds them once.
 * Tested by tests/cuda/test_cuda_ops.c (test_attention_dense, test_expanded: against
 * the CPU backend's attention and matmul steps, every flash form, both gemm_bf16
 * modes, chunks of 1 and 2 key tiles) and by test_cuda_golden (its "expanded" run
 * takes every pass of the golden sequences in the expanded form). */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>

#include "cuda_internal.cuh"

/* The cuBLAS handle and the activations' split mode of the op in progress (attn_blas). */
static cublasHandle_t g_blas;
static bool g_split;

/* Takes the backend's cuBLAS handle and the tuning's split mode for this op; false when
 * cuBLAS cannot start. */
static bool attn_blas(void)
{
    g_blas = cu_blas();
    g_split = cu_gemm_split();
    return g_blas != NULL;
}

/* ---- dense absorb attention for a prefill (one sequence's consecutive
 * positions): per chunk of tokens, S = q_c KV^T + q_pe PE^T over the cache rows
 * 0 .. L-1 (all heads of a token share them: one product for all heads),
 * causal softmax of S * scale, out = P KV, on the tensor cores. Both operands
 * of each product are float32 activations: in split mode (the default) each is
 * split into bf16 hi + lo and the three terms hi.hi + hi.lo + lo.hi are one
 * GEMM over a K three times as long ([Qh | Qh | Ql] . [Kh | Kl | Kh]); the
 * dropped lo.lo term is ~2^-16 relative. gemm_bf16: one term. */

#define DENSE_ATTN_MIN 16
#define DENSE_ATTN_BYTES ((size_t)256 << 20) /* score matrix per chunk */

/* dst[s * seg + i * ld + c] for s < nseg = bf16 hi of x (or its lo remainder when
 * bit s of lo_mask is set), x = row i of [src1 (d1 columns) | src2 (d2 columns)]. */
__global__ void attn_pack_kernel(__nv_bfloat16 *__restrict__ dst, long long seg, int ld, int nseg, unsigned lo_mask,
                                 const float *__restrict__ s1, int ss1, int d1, const float *__restrict__ s2, int ss2,
                                 int d2)
{
    size_t i = blockIdx.x;
    for (int c = threadIdx.x; c < d1 + d2; c += blockDim.x) {
        float v = c < d1 ? s1[i * ss1 + c] : s2[i * ss2 + c - d1];
        __nv_bfloat16 h = __float2bfloat16_rn(v), l = __float2bfloat16_rn(v - __bfloat162float(h));
        for (int k = 0; k < nseg; k++) dst[k * seg + i * ld + c] = (lo_mask >> k & 1) ? l : h;
    }
}

/* attn_pack_kernel four columns a thread: d1, d2, ss1, ss2, ld and seg
 * multiples of 4, sources 16-byte and dst 8-byte aligned */
__global__ void attn_pack4_kernel(__nv_bfloat16 *__restrict__ dst, long long seg, int ld, int nseg, unsigned lo_mask,
                                  const float *__restrict__ s1, int ss1, int d1, const float *__restrict__ s2, int ss2,
                                  int d2)
{
    size_t i = blockIdx.x;
    for (int c = 4 * threadIdx.x; c < d1 + d2; c += 4 * blockDim.x) {
        float4 v = c < d1 ? *(const float4 *)(s1 + i * ss1 + c) : *(const float4 *)(s2 + i * ss2 + c - d1);
        uint2 h, l;
        h.x = bf16x2_split(v.x, v.y, &l.x);
        h.y = bf16x2_split(v.z, v.w, &l.y);
        for (int k = 0; k < nseg; k++) *(uint2 *)(dst + k * seg + i * ld + c) = (lo_mask >> k & 1) ? l : h;
    }
}

static void launch_attn_pack(unsigned rows, __nv_bfloat16 *dst, long long seg, int ld, int nseg, unsigned lo_mask,
                             const float *s1, int ss1, int d1, const float *s2, int ss2, int d2)
{
    if (d1 % 4 == 0 && d2 % 4 == 0 && ss1 % 4 == 0 && ss2 % 4 == 0 && ld % 4 == 0 && seg % 4 == 0 &&
        (uintptr_t)s1 % 16 == 0 && (uintptr_t)s2 % 16 == 0 && (uintptr_t)dst % 8 == 0)
        attn_pack4_kernel<<<rows, 128, 0, cu_s>>>(dst, seg, ld, nseg, lo_mask, s1, ss1, d1, s2, ss2, d2);
    else
        attn_pack_kernel<<<rows, 256, 0, cu_s>>>(dst, seg, ld, nseg, lo_mask, s1, ss1, d1, s2, ss2, d2);
}

/* Row i = token t * H + head: softmax over keys j <= pos0 + t of s[i][j] * scale,
 * zeros beyond, written as bf16 to p[i][k * L + j] for k < nseg (hi, or lo for bit k of lo_mask). */
__global__ void causal_softmax_kernel(const float *__restrict__ s, __nv_bfloat16 *__restrict__ p, int L, int H,
                                      int pos0, float scale, int nseg, unsigned lo_mask)
{
    __shared__ float red[32];
    int i = blockIdx.x, len = min(L, pos0 + i / H + 1), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int nw = blockDim.x / 32;
    const float *row = s + (size_t)i * L;
    __nv_bfloat16 *prow = p + (size_t)i * L * nseg;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < len; j += blockDim.x) mx = fmaxf(mx, row[j] * scale);
    mx = cu_warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int w = 0; w < nw; w++) mx = fmaxf(mx, red[w]);
    __syncthreads();
    float sum = 0;
    for (int j = threadIdx.x; j < len; j += blockDim.x) sum += expf(row[j] * scale - mx);
    sum = cu_warp_sum(sum);
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    sum = 0;
    for (int w = 0; w < nw; w++) sum += red[w];
    float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < L; j += blockDim.x) {
        float v = j < len ? expf(row[j] * scale - mx) * inv : 0.0f;
        __nv_bfloat16 h = __float2bfloat16_rn(v), l = __float2bfloat16_rn(v - __bfloat162float(h));
        for (int k = 0; k < nseg; k++) prow[(size_t)k * L + j] = (lo_mask >> k & 1) ? l : h;
    }
}

/* causal_softmax_kernel with the row in registers: thread k holds the V
 * float4s at 4 (k + 256 u), L <= 1024 V, L % 4 == 0; one read of the row, one exp per
 * score, 8-byte stores of the bf16 parts */
template <int V>
__global__ void __launch_bounds__(256) causal_softmax4_kernel(const float *__restrict__ s, __nv_bfloat16 *__restrict__ p,
                                                              int L, int H, int pos0, float scale, int nseg,
                                                              unsigned lo_mask)
{
    __shared__ float red[8];
    int i = blockIdx.x, len = min(L, pos0 + i / H + 1), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float4 *row = (const float4 *)(s + (size_t)i * L);
    __nv_bfloat16 *prow = p + (size_t)i * L * nseg;
    float v[V][4], mx = -INFINITY;
    #pragma unroll
    for (int u = 0; u < V; u++) {
        int j = 4 * (threadIdx.x + 256 * u);
        float4 f = j < L ? row[j / 4] : make_float4(0, 0, 0, 0);
        v[u][0] = f.x * scale, v[u][1] = f.y * scale, v[u][2] = f.z * scale, v[u][3] = f.w * scale;
        #pragma unroll
        for (int e = 0; e < 4; e++)
            if (j + e < len) mx = fmaxf(mx, v[u][e]);
    }
    mx = cu_warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    #pragma unroll
    for (int w = 1; w < 8; w++) mx = fmaxf(mx, red[w]);
    __syncthreads();
    float sum = 0;
    #pragma unroll
    for (int u = 0; u < V; u++) {
        int j = 4 * (threadIdx.x + 256 * u);
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            v[u][e] = j + e < len ? expf(v[u][e] - mx) : 0.0f;
            sum += v[u][e];
        }
    }
    sum = cu_warp_sum(sum);
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    sum = 0;
    #pragma unroll
    for (int w = 0; w < 8; w++) sum += red[w];
    float inv = 1.0f / sum;
    #pragma unroll
    for (int u = 0; u < V; u++) {
        int j = 4 * (threadIdx.x + 256 * u);
        if (j >= L) continue;
        uint2 h, l;
        h.x = bf16x2_split(v[u][0] * inv, v[u][1] * inv, &l.x);
        h.y = bf16x2_split(v[u][2] * inv, v[u][3] * inv, &l.y);
        for (int k = 0; k < nseg; k++) *(uint2 *)(prow + (size_t)k * L + j) = (lo_mask >> k & 1) ? l : h;
    }
}

/* Tokens a chunk of a dense attention takes: its scores and probabilities (H rows of L
 * a token, float32 and nseg bf16 parts) within DENSE_ATTN_BYTES, a multiple of 64 so
 * that the chunks' row lengths L keep the pass's alignment (cuBLAS and the four-wide
 * softmax want rows of a multiple of 4 or 8); the tuning's dense_chunk (tests) fewer. */
static int attn_chunk_tokens(int n, int H, int L, int nseg)
{
    size_t per_tok = (sizeof(float) + sizeof(__nv_bfloat16) * nseg) * (size_t)H * L;
    int tc = (int)(DENSE_ATTN_BYTES / per_tok);
    if (tc >= 64) tc = tc / 64 * 64;
    if (cu_tune.dense_chunk > 0 && cu_tune.dense_chunk < tc) tc = cu_tune.dense_chunk;
    if (tc < 1) tc = 1;
    return tc > n ? n : tc;
}

/* causal_softmax_kernel, or its four-wide form where the rows allow */
static void launch_causal_softmax(const float *S, __nv_bfloat16 *P, int rows, int L, int H, int pos0, float scale,
                                  int nseg, unsigned q_lo)
{
    if (L % 4 == 0 && L <= 1024)
        causal_softmax4_kernel<1><<<rows, 256, 0, cu_s>>>(S, P, L, H, pos0, scale, nseg, q_lo);
    else if (L % 4 == 0 && L <= 4096)
        causal_softmax4_kernel<4><<<rows, 256, 0, cu_s>>>(S, P, L, H, pos0, scale, nseg, q_lo);
    else
        causal_softmax_kernel<<<rows, 256, 0, cu_s>>>(S, P, L, H, pos0, scale, nseg, q_lo);
}

bool cu_attention_dense(const ds_attn_args *a)
{
    int n = a->n_tokens, H = a->n_heads, R = a->kv_rank, rp = a->rope;
    if (!a->contiguous || n < DENSE_ATTN_MIN || a->seq0 < 0 || a->pos0 < 0 || a->pos0 + n > a->ctx) return false;
    if (!cu_device_readable(a->q_c) || !cu_device_readable(a->kv_cache) || !cu_device_readable(a->out) ||
        (rp && (!cu_device_readable(a->q_pe) || !cu_device_readable(a->pe_cache))) || !attn_blas())
        return false;
    int nseg = g_split ? 3 : 1, D = R + rp, KD = nseg * D, Lmax = a->pos0 + n, tc = attn_chunk_tokens(n, H, Lmax, nseg);
    /* scores, probabilities [Ph | Ph | Pl], queries [Qh | Qh | Ql], keys [Kh | Kl | Kh], values [Kh; Kl; Kh] */
    float *S = (float *)cu_alloc(sizeof(float) * (size_t)H * Lmax * tc);
    __nv_bfloat16 *P = (__nv_bfloat16 *)cu_alloc(sizeof(__nv_bfloat16) * (size_t)H * Lmax * tc * nseg);
    __nv_bfloat16 *Q = (__nv_bfloat16 *)cu_alloc(sizeof(__nv_bfloat16) * (size_t)n * H * KD);
    __nv_bfloat16 *Kp = (__nv_bfloat16 *)cu_alloc(sizeof(__nv_bfloat16) * (size_t)Lmax * KD);
    __nv_bfloat16 *V = (__nv_bfloat16 *)cu_alloc(sizeof(__nv_bfloat16) * (size_t)Lmax * R * nseg);
    bool ok = S && P && Q && Kp && V;
    const float *kv = a->kv_cache + (size_t)a->seq0 * a->ctx * R;
    const float *pe = rp ? a->pe_cache + (size_t)a->seq0 * a->ctx * rp : NULL;
    const unsigned q_lo = 4u, k_lo = 2u; /* segment 2 of q, segment 1 of k: the lo halves */
    if (ok) {
        launch_attn_pack((unsigned)(n * H), Q, D, KD, nseg, q_lo, a->q_c, R, R, a->q_pe, rp, rp);
        launch_attn_pack((unsigned)Lmax, Kp, D, KD, nseg, k_lo, kv, R, R, pe, rp, rp);
        launch_attn_pack((unsigned)Lmax, V, (long long)Lmax * R, R, nseg, k_lo, kv, R, R, NULL, 0, 0);
    } else { /* no memory for the tensor-core form: the attention kernel */
        cu_free(S);
        cu_free(P);
        cu_free(Q);
        cu_free(Kp);
        cu_free(V);
        cu_check(cudaGetLastError(), "attention: memory");
        return false;
    }
    const float one = 1.0f, zero = 0.0f;
    for (int t0 = 0; t0 < n && ok; t0 += tc) {
        int c = n - t0 < tc ? n - t0 : tc, L = a->pos0 + t0 + c, rows = c * H;
        /* column-major: S^T (L x rows) = Kp (KD x L)^T Q^T (KD x rows), ldc = L */
        ok = cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, L, rows, KD, &one, Kp, CUDA_R_16BF, KD,
                          Q + (size_t)t0 * H * KD, CUDA_R_16BF, KD, &zero, S, CUDA_R_32F, L, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
        if (ok) launch_causal_softmax(S, P, rows, L, H, a->pos0 + t0, a->softmax_scale, nseg, q_lo);
        /* out^T (R x rows) = V' (R x nseg L) P'^T (nseg L x rows): V' segment k at column k * L;
         * the values are laid out with Lmax rows per segment, so one product per segment
         * when L < Lmax (earlier chunks), else one product over all */
        if (ok && L == Lmax)
            ok = cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_N, R, rows, nseg * L, &one, V, CUDA_R_16BF, R, P,
                              CUDA_R_16BF, nseg * L, &zero, a->out + (size_t)t0 * H * R, CUDA_R_32F, R,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
        for (int k = 0; ok && L < Lmax && k < nseg; k++)
            ok = cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_N, R, rows, L, &one, V + (size_t)k * Lmax * R, CUDA_R_16BF,
                              R, P + (size_t)k * L, CUDA_R_16BF, nseg * L, k ? &one : &zero, a->out + (size_t)t0 * H * R,
                              CUDA_R_32F, R, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
    }
    if (!ok) cu_check(cudaErrorUnknown, "attention: cublasGemmEx");
    cu_free(S);
    cu_free(P);
    cu_free(Q);
    cu_free(Kp);
    cu_free(V);
    cu_check(cudaGetLastError(), "attention: launch");
    return true;
}

/* ---- absorb attention of a long prefill in the expanded (MHA) form (ds_ops.mla_attend
 * takes contiguous passes of at least the tuning's expand_min tokens here). The
 * pass's sequence so far (positions 0 .. pos0 + n - 1) is expanded once with wkv_b
 * into per-head rows [k_nope | v] (one product), then, for all heads at once by
 * strided batched GEMMs: S = [q_nope | q_pe] [k_nope | pe]^T, the causal softmax,
 * out = P V. A score is nope + rope products (192 at V3's shapes) where the absorb
 * form's is kv_rank + rope (576), an output row vdim (128) where absorb's is kv_rank
 * (512), and absorb's per-head products with wkv_b (q_c and the output) go; taken
 * where that counts fewer multiply-adds, the expansion included. Operands
 * split into bf16 hi + lo as in cu_attention_dense; wkv_b dequantised exactly (the
 * expansion is a DS_GEMM_BF16 product, as absorb's wkv_b products are). */

/* Head h's rows of the expansion into the score and value operands, one block per
 * position i: Kp[h][i] = nseg segments of [e_nope | pe] (seg k the bf16 lo part when
 * bit k of k_lo is set), V[h][k][i] = segment k of e_v; e = E row i, head h's W =
 * nope + vd columns. */
__global__ void expand_pack_kernel(__nv_bfloat16 *__restrict__ Kp, __nv_bfloat16 *__restrict__ V,
                                   const float *__restrict__ E, const float *__restrict__ pe, int P, int H, int nope,
                                   int rp, int vd, int nseg, unsigned k_lo)
{
    size_t i = blockIdx.x, h = blockIdx.y;
    int D = nope + rp, W = nope + vd;
    const float *e = E + (i * H + h) * W;
    __nv_bfloat16 *kr = Kp + (h * P + i) * (size_t)(nseg * D);
    if (nope % 4 == 0 && rp % 4 == 0 && vd % 4 == 0 && (uintptr_t)E % 16 == 0 && (uintptr_t)pe % 16 == 0) {
        /* four columns a thread: 16-byte loads, 8-byte stores */
        for (int c = 4 * threadIdx.x; c < D + vd; c += 4 * blockDim.x) {
            float4 v = *(const float4 *)(c < nope ? e + c : c < D ? pe + i * rp + c - nope : e + nope + c - D);
            uint2 hi, lo;
            hi.x = bf16x2_split(v.x, v.y, &lo.x);
            hi.y = bf16x2_split(v.z, v.w, &lo.y);
            for (int k = 0; k < nseg; k++) {
                uint2 x = (k_lo >> k & 1) ? lo : hi;
                if (c < D) *(uint2 *)(kr + k * D + c) = x;
                else *(uint2 *)(V + ((h * nseg + k) * P + i) * vd + c - D) = x;
            }
        }
        return;
    }
    for (int c = threadIdx.x; c < D + vd; c += blockDim.x) {
        float v = c < nope ? e[c] : c < D ? pe[i * rp + c - nope] : e[nope + c - D];
        __nv_bfloat16 hi = __float2bfloat16_rn(v), lo = __float2bfloat16_rn(v - __bfloat162float(hi));
        for (int k = 0; k < nseg; k++) {
            __nv_bfloat16 x = (k_lo >> k & 1) ? lo : hi;
            if (c < D) kr[k * D + c] = x;
            else V[((h * nseg + k) * P + i) * vd + c - D] = x;
        }
    }
}

/* The strided batched bf16 GEMM of the expanded form (column-major), float32 out */
static bool expand_gemm(cublasOperation_t ta, int m, int nn, int k, const void *A, int lda, long long sa, const void *B,
                        int ldb, long long sb, float beta, float *C, int ldc, long long sc, int batch)
{
    const float one = 1.0f;
    return cublasGemmStridedBatchedEx(g_blas, ta, CUBLAS_OP_N, m, nn, k, &one, A, CUDA_R_16BF, lda, sa, B, CUDA_R_16BF,
                                      ldb, sb, &beta, C, CUDA_R_32F, ldc, sc, batch, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
}

bool cu_mla_expanded(const ds_attn_args *a, const ds_weight *wkv_b, const float *q, int qk)
{
    int n = a->n_tokens, H = a->n_heads, R = a->kv_rank, rp = a->rope, nope = a->nope, vd = a->vdim;
    if (!a->contiguous || n < DENSE_ATTN_MIN || a->seq0 < 0 || a->pos0 < 0 || a->pos0 + n > a->ctx || H <= 0 ||
        nope <= 0 || vd <= 0 || rp < 0 || qk < nope + rp || wkv_b->cols != R || wkv_b->rows < H * (nope + vd))
        return false;
    if (!cu_device_readable(q) || !cu_device_readable(a->kv_cache) || !cu_device_readable(a->out) ||
        (rp && (!cu_device_readable(a->q_pe) || !cu_device_readable(a->pe_cache))) || !attn_blas())
        return false;
    int nseg = g_split ? 3 : 1, D = nope + rp, KD = nseg * D, W = nope + vd, P = a->pos0 + n;
    /* multiply-adds of the two forms: per token, position and head nseg (R + rope + R)
     * against nseg (nope + rope + vd); per token and head absorb's q_c and output products
     * (2 R (nope + vd), x2 for split activations) against, per position, the expansion
     * (H R W, x2), weighted 2: with its packing it costs about that much more a
     * multiply-add (H200, 16B FP8, tok/s expanded / absorb: passes of 16 / 64 / 256 / 1024
     * tokens onto 4096 cached 1038 / 3490 / 10120 / 8659 against 1525 / 4623 / 11053 /
     * 6715; from position 0, 16 .. 256 tokens 1-7% faster expanded). A pass onto a deep
     * cache expands every earlier position for its few tokens: there absorb wins.
     *   With flash_kernel's 128-query blocks (expanded / absorb, onto 4096 cached): 32
     * tokens 2529 / 3322, 64 4752 / 5216, 128 8613 / 8948, 256 13888 / 12587, 512 20023 /
     * 14913; onto 1024: 128 11471 / 11027, 256 18165 / 17090. A weight of 2 (not 2.5)
     * moves 256 onto 4096 to the expanded form: chosen / expanded / absorb onto 4096
     * cached 128 tokens 9068 / 8649 / 9048, 192 11064 / 11114 / 11150, 256 13895 / 13839 /
     * 12791, 384 17236 / 17250 / 14227; onto 2048, 256 16500 / 16453 / 16026.
     * expand_min < 0 (tests): the expanded form always. */
    double pairs = (double)n * P * H, split = g_split ? 2 : 1;
    double absorb = pairs * nseg * (2.0 * R + rp) + (double)n * H * 2.0 * R * W * split;
    double expanded = pairs * nseg * (double)(D + vd) + 2.0 * P * H * R * W * split;
    if (cu_tune.expand_min > 0 && expanded >= absorb) return false;
    bool flash = cu_flash_ok(D, vd, g_split); /* scores, softmax and values in one launch, none stored */
    int tc = flash ? 1 : attn_chunk_tokens(n, H, P, nseg);
    /* the expanded rows grow with the context (V3's 128 heads: 1.5 MB a position): past
     * half the free device memory the absorb form, which needs far less, runs instead of
     * an out-of-memory error */
    size_t need = (sizeof(float) * W + sizeof(__nv_bfloat16) * (KD + nseg * vd)) * (size_t)P * H +
                  sizeof(__nv_bfloat16) * (size_t)n * H * KD, fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess || need > fr / 2) {
        cudaGetLastError();
        return false;
    }
    /* the expansion, scores, probabilities [Ph | Ph | Pl], queries [Qh | Qh | Ql], keys
     * [Kh | Kl | Kh] per head, values [Vh; Vl; Vh] per head */
    float *E = (float *)cu_alloc(sizeof(float) * (size_t)P * H * W);
    float *S = flash ? NULL : (float *)cu_alloc(sizeof(float) * (size_t)H * P * tc);
    __nv_bfloat16 *Pb = flash ? NULL : (__nv_bfloat16 *)cu_alloc(sizeof(__nv_bfloat16) * (size_t)H * P * tc * nseg);
    __nv_bfloat16 *Q = (__nv_bfloat16 *)cu_alloc(sizeof(__nv_bfloat16) * (size_t)n * H * KD);
    __nv_bfloat16 *Kp = (__nv_bfloat16 *)cu_alloc(sizeof(__nv_bfloat16) * (size_t)H * P * KD);
    __nv_bfloat16 *V = (__nv_bfloat16 *)cu_alloc(sizeof(__nv_bfloat16) * (size_t)H * nseg * P * vd);
    bool mem = E && (flash || (S && Pb)) && Q && Kp && V, ok = mem; /* no memory: cu_alloc said so */
    if (mem) {
        const float *kv = a->kv_cache + (size_t)a->seq0 * a->ctx * R;
        const float *pe = rp ? a->pe_cache + (size_t)a->seq0 * a->ctx * rp : NULL;
        const unsigned q_lo = 4u, k_lo = 2u; /* segment 2 of q, segment 1 of k: the lo halves */
        cu_matmul(E, kv, P, wkv_b, 0, H * W, DS_GEMM_BF16, false);
        launch_attn_pack((unsigned)(n * H), Q, D, KD, nseg, q_lo, q, qk, nope, a->q_pe, rp, rp);
        expand_pack_kernel<<<dim3((unsigned)P, (unsigned)H), 64, 0, cu_s>>>(Kp, V, E, pe, P, H, nope, rp, vd, nseg,
                                                                             k_lo);
        if (flash)
            ok = cu_flash_attend(a->out, Q, Kp, V, n, H, P, a->pos0, a->softmax_scale, D, vd, g_split);
        for (int t0 = 0; t0 < n && ok && !flash; t0 += tc) {
            int c = n - t0 < tc ? n - t0 : tc, L = a->pos0 + t0 + c, rows = c * H;
            /* per head h, column-major: S_h^T (L x c) = Kp_h (KD x L)^T Q_h^T (KD x c); row
             * t * H + h of S (ldc H L) as cu_attention_dense lays them out */
            ok = expand_gemm(CUBLAS_OP_T, L, c, KD, Kp, KD, (long long)P * KD, Q + (size_t)t0 * H * KD, H * KD, KD, 0.0f,
                             S, H * L, L, H);
            if (ok) launch_causal_softmax(S, Pb, rows, L, H, a->pos0 + t0, a->softmax_scale, nseg, q_lo);
            /* out_h^T (vd x c) = V_h' (vd x nseg L) P_h'^T: V_h's segments lie P rows apart,
             * so one product over all of them when L == P (the last chunk), else one a segment */
            float *out = a->out + (size_t)t0 * H * vd;
            if (ok && L == P)
                ok = expand_gemm(CUBLAS_OP_N, vd, c, nseg * L, V, vd, (long long)nseg * P * vd, Pb, H * nseg * L,
                                 (long long)nseg * L, 0.0f, out, H * vd, vd, H);
            for (int k = 0; ok && L < P && k < nseg; k++)
                ok = expand_gemm(CUBLAS_OP_N, vd, c, L, V + (size_t)k * P * vd, vd, (long long)nseg * P * vd,
                                 Pb + (size_t)k * L, H * nseg * L, (long long)nseg * L, k ? 1.0f : 0.0f, out, H * vd,
                                 vd, H);
        }
        if (!ok) cu_check(cudaErrorUnknown, "expanded attention: cublasGemmStridedBatchedEx or flash_kernel");
    }
    cu_free(E);
    cu_free(S);
    cu_free(Pb);
    cu_free(Q);
    cu_free(Kp);
    cu_free(V);
    if (mem) cu_check(cudaGetLastError(), "expanded attention: launch");
    return mem;
}

/* ---- flash_kernel: the expanded form's attention in one launch per pass (the tuning's
 * flash): for each head and 64-query tile, the scores against 32-key tiles, the causal
 * mask, a running (online) softmax and the value products, all on the tensor cores (bf16
 * operands, float32 sums: warpgroup MMA on Hopper, mma.m16n8k16 elsewhere), without
 * writing the scores. cu_mla_expanded's chunk loop (flash 0) writes every score (float32),
 * reads them back for the softmax, writes the probabilities as bf16 parts and reads them
 * again for the values: two cuBLAS products and a softmax launch per chunk of tokens,
 * each over the whole square, masked half included.
 *
 * The operands are cu_mla_expanded's packs: with split activations (the default) each
 * is a bf16 hi part and a lo part (x - hi rounded again), and every product is
 * hi.hi + hi.lo + lo.hi, as the packed segments make cuBLAS sum them; the
 * probabilities are split the same way before the value products. Queries: row
 * t * H + h, KD = 3 D elements [hi | hi | lo]; keys of head h: row h * P + i,
 * [hi | lo | hi]; values of head h: segments (h * 3 + s) * P + i of DV elements, s = 0
 * hi, 1 lo. Without the split, one segment of each. */

#define FL_BM 64 /* query rows a warpgroup: four warps of 16 */
#define FL_BN 32 /* keys a tile (64 in blocks of two warpgroups: FL_BN_OF) */
#define FL_BN_OF(NW) ((NW) == 2 ? 64 : FL_BN)
#define FL_THREADS 128 /* a warpgroup */

/* Shared memory: the query tile and one key and one value tile, hi (and lo) parts; rows
 * padded by 16 bytes so that ldmatrix's eight row addresses fall in distinct banks. */
template <int D, int DV, bool SPLIT>
struct fl_smem {
    __nv_bfloat16 q[SPLIT ? 2 : 1][FL_BM][D + 8];
    __nv_bfloat16 k[SPLIT ? 2 : 1][FL_BN][D + 8];
    __nv_bfloat16 v[SPLIT ? 2 : 1][FL_BN][DV + 8];
};

/* ROWS rows of COLS bf16 from src (rows `stride` elements apart) into dst by cp.async,
 * zeros from row `valid` on. */
template <int COLS, int ROWS, int LD>
__device__ __forceinline__ void fl_load(__nv_bfloat16 (*dst)[LD], const __nv_bfloat16 *src, size_t stride, int valid)
{
    constexpr int CH = COLS / 8; /* 16-byte chunks a row */
    for (int i = threadIdx.x; i < ROWS * CH; i += blockDim.x) {
        int r = i / CH, c = i % CH * 8;
        bool in = r < valid;
        cu_cp16(&dst[r][c], in ? src + r * stride + c : src, in);
    }
}

#define FW_SW(r, c) ((r) * 64 + ((((c) >> 3) ^ ((r) & 7)) << 3) + ((c) & 7))

/* ROWS rows of COLS bf16 from src (rows `stride` apart) into sub-tiles of 64 columns in
 * FW_SW's layout, zeros from row `valid` on. */
template <int COLS, int ROWS>
__device__ __forceinline__ void fl_load(uint16_t (*dst)[ROWS * 64], const __nv_bfloat16 *src, size_t stride, int valid)
{
    constexpr int CH = COLS / 8;
    for (int i = threadIdx.x; i < ROWS * CH; i += blockDim.x) {
        int r = i / CH, c = i % CH * 8;
        bool in = r < valid;
        cu_cp16(&dst[c / 64][FW_SW(r, c % 64)], in ? src + r * stride + c : src, in);
    }
}

__device__ __forceinline__ void fl_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }

/* Named barrier `id` (not 0, __syncthreads's) of a two-warpgroup block: one warpgroup
 * arrives, the other waits for it. */
__device__ __forceinline__ void fl_bar_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void fl_bar_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
template <int N>
__device__ __forceinline__ void fl_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* four 8 x 8 b16 matrices (ldmatrix.x4; .trans: each transposed); lane l addresses a row of matrix l / 8 */
template <bool TRANS>
__device__ __forceinline__ void fl_ldm4(uint32_t *r, const void *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
}

/* Key tiles of bn keys of query tile qt of bm rows (those up to its last query's position). */
__host__ __device__ static inline int fl_tiles(int qt, int n, int pos0, int bm, int bn)
{
    int last = min(n, (qt + 1) * bm) - 1;
    return (pos0 + last) / bn + 1;
}

/* The block's query tile (rows t0 .. t0 + BM - 1 of head h, zeros from row nq on), hi and
 * lo parts, into q by cp.async. */
template <int D, bool SPLIT, int BM>
__device__ __forceinline__ void fl_load_q(__nv_bfloat16 (*q)[BM][D + 8], const __nv_bfloat16 *Q, int t0, int H, int h,
                                          int nq)
{
    constexpr int KD = (SPLIT ? 3 : 1) * D;
    const __nv_bfloat16 *qb = Q + ((size_t)t0 * H + h) * KD;
    fl_load<D, BM>(q[0], qb, (size_t)H * KD, nq);
    if (SPLIT) fl_load<D, BM>(q[SPLIT ? 1 : 0], qb + 2 * D, (size_t)H * KD, nq);
}

/* Key (or value) tile kt of a head, rows `stride` apart from `base`, the lo part `lo`
 * elements after the hi one, into t[0] (and t[1]) by cp.async, as one group. */
template <int COLS, bool SPLIT, int BN, typename T>
__device__ __forceinline__ void fl_load_kv(T *t, const __nv_bfloat16 *base, size_t stride, size_t lo, int kt, int P)
{
    const int j0 = kt * BN, valid = min(BN, P - j0);
    fl_load<COLS, BN>(t[0], base + (size_t)j0 * stride, stride, valid);
    if (SPLIT) fl_load<COLS, BN>(t[SPLIT ? 1 : 0], base + (size_t)j0 * stride + lo, stride, valid);
    fl_commit();
}

/* Two 8-column tiles d0, d1 (+)= A . B on mma.m16n8k16: A's 16 x 16 fragment ah (lo part
 * al), B's two 16 x 8 fragments bh[0, 1] and bh[2, 3] (lo parts bl); with SPLIT the
 * products hi.hi + hi.lo + lo.hi, else hi.hi. */
template <bool SPLIT>
__device__ __forceinline__ void fl_mma2(float *d0, float *d1, const uint32_t *ah, const uint32_t *al,
                                        const uint32_t *bh, const uint32_t *bl)
{
    cu_mma<true>(d0, ah[0], ah[1], ah[2], ah[3], bh[0], bh[1]);
    cu_mma<true>(d1, ah[0], ah[1], ah[2], ah[3], bh[2], bh[3]);
    if (SPLIT) {
        cu_mma<true>(d0, ah[0], ah[1], ah[2], ah[3], bl[0], bl[1]);
        cu_mma<true>(d1, ah[0], ah[1], ah[2], ah[3], bl[2], bl[3]);
        cu_mma<true>(d0, al[0], al[1], al[2], al[3], bh[0], bh[1]);
        cu_mma<true>(d1, al[0], al[1], al[2], al[3], bh[2], bh[3]);
    }
}

/* Where block (h, y) works: chunk c of query tile qt (the longest tiles first), key tiles
 * kt0 .. kt1 - 1 of `tiles`; `chunks` of that tile in all (blocks past them return). */
struct fl_work {
    int nqt, qt, c, tiles, chunks, kt0, kt1, h, t0, nq;
};

__device__ __forceinline__ fl_work fl_where(int n, int pos0, int kc, int mc, int bm, int bn)
{
    fl_work w;
    w.nqt = (n + bm - 1) / bm, w.qt = w.nqt - 1 - (int)blockIdx.y / mc, w.c = (int)blockIdx.y % mc;
    w.tiles = fl_tiles(w.qt, n, pos0, bm, bn), w.chunks = (w.tiles + kc - 1) / kc;
    w.kt0 = w.c * kc, w.kt1 = min(w.tiles, w.kt0 + kc);
    w.h = blockIdx.x, w.t0 = w.qt * bm, w.nq = min(bm, n - w.t0);
    return w;
}

/* One key tile's step of the running softmax on the thread's scores s (keys j0 ..; rows at
 * positions pr, the warp's first w0): scaled, masked past each row's position, the
 * maximum m and the thread's share of the sum l carried, the sums o rescaled; s becomes
 * the tile's unnormalised probabilities. A row that has seen no key yet (a later chunk)
 * keeps -inf and zeros. */
template <int DV, int BN>
__device__ __forceinline__ void fl_softmax(float (*s)[4], float *m, float *l, float (*o)[4], int j0, int w0,
                                           const int *pr, int q, float scale2)
{
    const bool mask = j0 + BN - 1 > w0;
    float mx[2] = {m[0], m[1]};
    #pragma unroll
    for (int j = 0; j < BN / 8; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            float v = s[j][e] * scale2;
            if (mask && j0 + 8 * j + 2 * q + (e & 1) > pr[e / 2]) v = -INFINITY;
            s[j][e] = v;
            mx[e / 2] = fmaxf(mx[e / 2], v);
        }
    #pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(~0u, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(~0u, mx[i], 2));
    }
    float ref[2] = {mx[0] == -INFINITY ? 0.0f : mx[0], mx[1] == -INFINITY ? 0.0f : mx[1]};
    float corr[2] = {exp2f(m[0] - ref[0]), exp2f(m[1] - ref[1])}, ls[2] = {0.0f, 0.0f};
    m[0] = mx[0], m[1] = mx[1];
    #pragma unroll
    for (int j = 0; j < BN / 8; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            float p = exp2f(s[j][e] - ref[e / 2]);
            s[j][e] = p;
            ls[e / 2] += p;
        }
    l[0] = l[0] * corr[0] + ls[0], l[1] = l[1] * corr[1] + ls[1];
    #pragma unroll
    for (int j = 0; j < DV / 8; j++) o[j][0] *= corr[0], o[j][1] *= corr[0], o[j][2] *= corr[1], o[j][3] *= corr[1];
}

/* The probabilities of keys 16 ks .. 16 ks + 15 (score tiles 2 ks, 2 ks + 1) as an A
 * operand, bf16 hi parts into ph and lo parts into pl. */
__device__ __forceinline__ void fl_pfrag(const float (*s)[4], int ks, uint32_t *ph, uint32_t *pl)
{
    ph[0] = bf16x2_split(s[2 * ks][0], s[2 * ks][1], &pl[0]);
    ph[1] = bf16x2_split(s[2 * ks][2], s[2 * ks][3], &pl[1]);
    ph[2] = bf16x2_split(s[2 * ks + 1][0], s[2 * ks + 1][1], &pl[2]);
    ph[3] = bf16x2_split(s[2 * ks + 1][2], s[2 * ks + 1][3], &pl[3]);
}

/* The block's end: a tile of one chunk writes its rows (< n) of out, each chunk of a
 * longer one its unscaled sums and each row's (max, sum) for flash_merge_kernel. */
template <int DV, int BM>
__device__ __forceinline__ void fl_store(const fl_work &w, float (*o)[4], const float *m, float *l, float *out,
                                         float *part, float2 *ml, int n, int H, int mc, int warp, int g, int q)
{
    #pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(~0u, l[i], 1);
        l[i] += __shfl_xor_sync(~0u, l[i], 2);
    }
    const int ra = 16 * warp + g, rb = ra + 8, ta = w.t0 + ra, tb = w.t0 + rb;
    if (w.chunks > 1) {
        const size_t at = (((size_t)w.h * w.nqt + w.qt) * mc + w.c) * BM;
        if (q == 0) ml[at + ra] = make_float2(m[0], l[0]), ml[at + rb] = make_float2(m[1], l[1]);
        #pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            const int col = 8 * j + 2 * q;
            *(float2 *)(part + (at + ra) * DV + col) = make_float2(o[j][0], o[j][1]);
            *(float2 *)(part + (at + rb) * DV + col) = make_float2(o[j][2], o[j][3]);
        }
        return;
    }
    const float ia = 1.0f / l[0], ib = 1.0f / l[1];
    #pragma unroll
    for (int j = 0; j < DV / 8; j++) {
        const int col = 8 * j + 2 * q;
        if (ta < n) *(float2 *)(out + ((size_t)ta * H + w.h) * DV + col) = make_float2(o[j][0] * ia, o[j][1] * ia);
        if (tb < n) *(float2 *)(out + ((size_t)tb * H + w.h) * DV + col) = make_float2(o[j][2] * ib, o[j][3] * ib);
    }
}

/* ---- the products on warpgroup MMA (WG: the tuning's flash >= 2, where the device runs
 * the build's sm_90a code; D and DV multiples of 64). The block's four warps are one
 * warpgroup. The queries are the A operand from registers, loaded once for every key
 * tile; the key and value tiles are B operands by descriptor, in wgmma's 128-byte swizzle
 * (FW_SW: sub-tiles of 32 rows of 64 columns, a row's 16-byte chunk c at c ^ (row % 8)).
 * The keys are K-major (the scores' k runs along a key's row); the values are read
 * MN-major (imm-trans-b: the products' k runs down the keys), so both tiles land by the
 * same cp.async pattern. Every warp takes every tile (wgmma is warpgroup-wide), the
 * masked ones included. */
template <int D, int DV, bool SPLIT, int BM, int BN>
struct fw_smem {
    uint16_t k[SPLIT ? 2 : 1][D / 64][BN * 64];  /* key tile, sub-tiles of 64 columns (BN x 128 bytes) */
    uint16_t v[SPLIT ? 2 : 1][DV / 64][BN * 64]; /* value tile, the same */
    __nv_bfloat16 q[SPLIT ? 2 : 1][BM][D + 8];
};

/* Two warpgroups (NW 2): a key and a value tile in each of two stages, so that a tile's
 * loads run under the tile before (one barrier a tile); the query tile is staged where
 * the second stage goes, until the warps have their fragments. */
template <int D, int DV, bool SPLIT, int BN>
struct fw_stage {
    uint16_t k[SPLIT ? 2 : 1][D / 64][BN * 64];
    uint16_t v[SPLIT ? 2 : 1][DV / 64][BN * 64];
};
template <int D, int DV, bool SPLIT, int BM, int BN>
struct fw_smem2 {
    fw_stage<D, DV, SPLIT, BN> s0;
    union {
        fw_stage<D, DV, SPLIT, BN> s1;
        __nv_bfloat16 q[SPLIT ? 2 : 1][BM][D + 8];
    } u;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* wgmma's descriptor of a 128-byte-swizzled tile from p: 1024 bytes from one 8-row group to the next */
__device__ __forceinline__ uint64_t fw_desc(const void *p)
{
    uint64_t a = (uint64_t)__cvta_generic_to_shared(p);
    return ((a & 0x3ffff) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

#define FW_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])
/* d (16 sums) (+)= A (registers) . B (K-major tile at db), m64n32k16 bf16; acc 0: from zero */
__device__ __forceinline__ void fw_mma32(float *d, const uint32_t *a, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
                 "%10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
                 : FW_D8(0), FW_D8(8)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* d (32 sums) (+)= A (registers) . B (K-major tile at db), m64n64k16 bf16; acc 0: from zero */
__device__ __forceinline__ void fw_mma64(float *d, const uint32_t *a, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
                 "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, "
                 "%29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : FW_D8(0), FW_D8(8), FW_D8(16), FW_D8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* d (32 sums) += A (registers) . B (MN-major tile at db), m64n64k16 bf16 */
__device__ __forceinline__ void fw_mma64t(float *d, const uint32_t *a, uint64_t db)
{
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
                 "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, "
                 "%29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 : FW_D8(0), FW_D8(8), FW_D8(16), FW_D8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
#undef FW_D8
#endif


/* The scores of key tile sm.k into s on mma.sync: each warp's 16 rows (queries from
 * shared memory) against the tile's 32 keys. */
template <int D, bool SPLIT, typename SM>
__device__ __forceinline__ void fl_scores(float (*s)[4], SM &sm, int warp, int lane)
{
    #pragma unroll
    for (int j = 0; j < FL_BN / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    #pragma unroll 4
    for (int kk = 0; kk < D; kk += 16) {
        uint32_t ah[4], al[4];
        fl_ldm4<false>(ah, &sm.q[0][16 * warp + lane % 16][kk + lane / 16 * 8]);
        if (SPLIT) fl_ldm4<false>(al, &sm.q[SPLIT ? 1 : 0][16 * warp + lane % 16][kk + lane / 16 * 8]);
        #pragma unroll
        for (int j = 0; j < FL_BN / 8; j += 2) {
            uint32_t bh[4], bl[4];
            const int key = 8 * j + lane % 8 + lane / 16 * 8, col = kk + lane / 8 % 2 * 8;
            fl_ldm4<false>(bh, &sm.k[0][key][col]);
            if (SPLIT) fl_ldm4<false>(bl, &sm.k[SPLIT ? 1 : 0][key][col]);
            fl_mma2<SPLIT>(s[j], s[j + 1], ah, al, bh, bl);
        }
    }
}

/* o += the probabilities s . value tile sm.v on mma.sync */
template <int DV, bool SPLIT, typename SM>
__device__ __forceinline__ void fl_values(float (*o)[4], const float (*s)[4], SM &sm, int lane)
{
    #pragma unroll
    for (int ks = 0; ks < FL_BN / 16; ks++) {
        uint32_t ph[4], pl[4];
        fl_pfrag(s, ks, ph, pl);
        #pragma unroll
        for (int j = 0; j < DV / 8; j += 2) {
            uint32_t vh[4], vl[4];
            const int key = 16 * ks + lane % 8 + lane / 8 % 2 * 8, col = 8 * j + lane / 16 * 8;
            fl_ldm4<true>(vh, &sm.v[0][key][col]);
            if (SPLIT) fl_ldm4<true>(vl, &sm.v[SPLIT ? 1 : 0][key][col]);
            fl_mma2<SPLIT>(o[j], o[j + 1], ph, pl, vh, vl);
        }
    }
}

/* The same two on warpgroup MMA: the scores from the query fragments qa (hi, lo) against
 * the key tile, m64n32k16 per 16 columns; the values per 64-column half, m64n64k16 per 16
 * keys. Each waits for its own products. (Empty where the build's code is not sm_90a:
 * flash_launch runs them only on a device that takes that code.) */
template <int BN>
__device__ __forceinline__ void fw_mma_s(float *d, const uint32_t *a, uint64_t db, int acc)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (BN == 64) fw_mma64(d, a, db, acc);
    else fw_mma32(d, a, db, acc);
#endif
}

template <int D, bool SPLIT, int BN, typename SM>
__device__ __forceinline__ void fw_scores(float (*s)[4], const uint32_t (*qa)[SPLIT ? 2 : 1][4], SM &sm)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    #pragma unroll
    for (int i = 0; i < D / 16; i++) {
        const uint64_t dh = fw_desc(&sm.k[0][i / 4][0]) + (uint64_t)(i % 4 * 32 >> 4);
        fw_mma_s<BN>(&s[0][0], qa[i][0], dh, i > 0);
        if (SPLIT) {
            const uint64_t dl = fw_desc(&sm.k[SPLIT ? 1 : 0][i / 4][0]) + (uint64_t)(i % 4 * 32 >> 4);
            fw_mma_s<BN>(&s[0][0], qa[i][0], dl, 1);
            fw_mma_s<BN>(&s[0][0], qa[i][SPLIT ? 1 : 0], dh, 1);
        }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

template <int DV, bool SPLIT, int BN, typename SM>
__device__ __forceinline__ void fw_values(float (*o)[4], const float (*s)[4], SM &sm)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    uint32_t ph[BN / 16][4], pl[BN / 16][4]; /* all of them before the first product reads them */
    #pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) fl_pfrag(s, ks, ph[ks], pl[ks]);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    #pragma unroll
    for (int ks = 0; ks < BN / 16; ks++)
        #pragma unroll
        for (int half = 0; half < DV / 64; half++) {
            /* keys 16 ks .. : 16 rows of the tile, two of its 8-row groups */
            const uint64_t vh = fw_desc(&sm.v[0][half][0]) + (uint64_t)(16 * ks * 128 >> 4);
            fw_mma64t(&o[8 * half][0], ph[ks], vh);
            if (SPLIT) {
                const uint64_t vl = fw_desc(&sm.v[SPLIT ? 1 : 0][half][0]) + (uint64_t)(16 * ks * 128 >> 4);
                fw_mma64t(&o[8 * half][0], ph[ks], vl);
                fw_mma64t(&o[8 * half][0], pl[ks], vh);
            }
        }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

/* The tiles' shared memory of either form, aligned to 1024 bytes in the launch's (which
 * asks for 1 KB more). */
template <int D, int DV, bool SPLIT, bool WG, int NW>
struct fl_smem_of {
    typedef fl_smem<D, DV, SPLIT> type;
};
template <int D, int DV, bool SPLIT>
struct fl_smem_of<D, DV, SPLIT, true, 1> {
    typedef fw_smem<D, DV, SPLIT, FL_BM, FL_BN> type;
};
template <int D, int DV, bool SPLIT>
struct fl_smem_of<D, DV, SPLIT, true, 2> {
    typedef fw_smem2<D, DV, SPLIT, 2 * FL_BM, FL_BN_OF(2)> type;
};

/* A block's state through its key tiles: its work, its rows' sums (o), maxima and sums
 * of the softmax (m, l), the warp's query fragments (WG) and where the thread sits. */
template <int DV, int NQ>
struct fl_rows {
    fl_work w;
    float o[DV / 8][4], m[2], l[2];
    uint32_t qa[NQ][4];
    int warp, lane, g, q, w0, pr[2];
};

/* flash_kernel's key tiles with one warpgroup (WG) or four warps on mma.sync: one key and
 * one value tile in shared memory, the next keys loading under the softmax and values,
 * the next values under the next scores. */
template <int D, int DV, bool SPLIT, bool WG, typename SM, typename R>
__device__ __forceinline__ void fl_tiles1(R &r, SM &sm, const __nv_bfloat16 *Q, const __nv_bfloat16 *kb,
                                          const __nv_bfloat16 *vb, int H, int P, float scale2)
{
    constexpr int KD = (SPLIT ? 3 : 1) * D, NP = SPLIT ? 2 : 1, BN = FL_BN;
    const fl_work &w = r.w;
    uint32_t (*qa)[NP][4] = (uint32_t (*)[NP][4])r.qa;
    fl_load_q<D, SPLIT, FL_BM>(sm.q, Q, w.t0, H, w.h, w.nq);
    fl_load_kv<D, SPLIT, BN>(sm.k, kb, KD, D, w.kt0, P); /* with the queries: group 0 */
    fl_load_kv<DV, SPLIT, BN>(sm.v, vb, DV, (size_t)P * DV, w.kt0, P);
    for (int kt = w.kt0; kt < w.kt1; kt++) {
        fl_wait<1>(); /* this tile's keys (the values may still be on their way) */
        if (WG) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* cp.async's bytes, seen by wgmma */
        __syncthreads();
        const int j0 = kt * BN;
        const bool active = WG || j0 <= r.w0 + 15; /* mma.sync: a key of the tile that a row of the warp sees */
        float s[BN / 8][4];
        if constexpr (WG) {
            if (kt == w.kt0)
                #pragma unroll
                for (int i = 0; i < D / 16; i++)
                    #pragma unroll
                    for (int pt = 0; pt < NP; pt++)
                        fl_ldm4<false>(qa[i][pt], &sm.q[pt][16 * r.warp + r.lane % 16][16 * i + r.lane / 16 * 8]);
            fw_scores<D, SPLIT, BN>(s, qa, sm);
        } else if (active) {
            fl_scores<D, SPLIT>(s, sm, r.warp, r.lane);
        }
        __syncthreads(); /* every warp is done with the keys */
        const bool more = kt + 1 < w.kt1;
        if (more) fl_load_kv<D, SPLIT, BN>(sm.k, kb, KD, D, kt + 1, P);
        if (active) fl_softmax<DV, BN>(s, r.m, r.l, r.o, j0, r.w0, r.pr, r.q, scale2);
        if (more) fl_wait<1>(); /* this tile's values (the next keys may still be on their way) */
        else fl_wait<0>();
        if (WG) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (active) {
            if constexpr (WG) fw_values<DV, SPLIT, BN>(r.o, s, sm);
            else fl_values<DV, SPLIT>(r.o, s, sm, r.lane);
        }
        __syncthreads(); /* every warp is done with the values */
        if (more) fl_load_kv<DV, SPLIT, BN>(sm.v, vb, DV, (size_t)P * DV, kt + 1, P);
    }
}

/* flash_kernel's key tiles with two warpgroups (128 queries, 64-key tiles, fw_smem2): two
 * stages, one barrier a tile (each tile's wait and barrier also mean that every warp is
 * done with the other stage, which the next tile's loads then refill). Ping-pong: warpgroup
 * 1's scores after 0's, 0's values after 1's scores (named barriers 1 and 2), so that
 * each one's softmax runs under the other's products. */
template <int D, int DV, bool SPLIT, typename SM, typename R>
__device__ __forceinline__ void fl_tiles2(R &r, SM &sm, const __nv_bfloat16 *Q, const __nv_bfloat16 *kb,
                                          const __nv_bfloat16 *vb, int H, int P, float scale2, int pos0)
{
    constexpr int KD = (SPLIT ? 3 : 1) * D, NP = SPLIT ? 2 : 1, BN = FL_BN_OF(2);
    const fl_work &w = r.w;
    uint32_t (*qa)[NP][4] = (uint32_t (*)[NP][4])r.qa;
    const int wg_last = pos0 + w.t0 + FL_BM * (r.warp / 4) + FL_BM - 1; /* the warpgroup's last row's position */
    fl_load_q<D, SPLIT, 2 * FL_BM>(sm.u.q, Q, w.t0, H, w.h, w.nq);
    fl_load_kv<D, SPLIT, BN>(sm.s0.k, kb, KD, D, w.kt0, P);
    fl_load_kv<DV, SPLIT, BN>(sm.s0.v, vb, DV, (size_t)P * DV, w.kt0, P);
    for (int kt = w.kt0; kt < w.kt1; kt++) {
        const int it = kt - w.kt0;
        auto &cur = it % 2 ? sm.u.s1 : sm.s0;
        auto &nxt = it % 2 ? sm.s0 : sm.u.s1;
        fl_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* cp.async's bytes, seen by wgmma */
        __syncthreads();
        if (it == 0) {
            #pragma unroll
            for (int i = 0; i < D / 16; i++)
                #pragma unroll
                for (int pt = 0; pt < NP; pt++)
                    fl_ldm4<false>(qa[i][pt], &sm.u.q[pt][16 * r.warp + r.lane % 16][16 * i + r.lane / 16 * 8]);
            __syncthreads(); /* the query tile's room is the second stage's */
        }
        if (kt + 1 < w.kt1) {
            fl_load_kv<D, SPLIT, BN>(nxt.k, kb, KD, D, kt + 1, P);
            fl_load_kv<DV, SPLIT, BN>(nxt.v, vb, DV, (size_t)P * DV, kt + 1, P);
        }
        const int j0 = kt * BN;
        const bool on = j0 <= wg_last; /* a key of the tile that a row of the warpgroup sees */
        float s[BN / 8][4];
        if (r.warp >= 4) fl_bar_sync(1);
        if (on) fw_scores<D, SPLIT, BN>(s, qa, cur);
        fl_bar_arrive(r.warp < 4 ? 1 : 2);
        if (on) fl_softmax<DV, BN>(s, r.m, r.l, r.o, j0, r.w0, r.pr, r.q, scale2);
        if (r.warp < 4) fl_bar_sync(2);
        if (on) fw_values<DV, SPLIT, BN>(r.o, s, cur);
    }
}

/* Block (h, y): chunk y % mc of query tile nqt - 1 - y / mc (the longest first) of head h,
 * key tiles kc x % mc .. (mc chunks at most; blocks past a tile's chunks return). A tile
 * of one chunk writes its rows of out; the chunks of a longer one write their unscaled
 * sums (part) and each row's maximum and sum (ml) for flash_merge_kernel, so that the
 * long tiles of a causal pass do not keep a few SMs busy after the rest are done.
 * Warp w owns the tile's rows 16 w .. 16 w + 15; a thread the rows g and g + 8 of them
 * (g = lane / 4) and, of each 8-column tile of scores or outputs, columns 2 q and 2 q + 1
 * (q = lane % 4). scale2: the softmax scale times log2(e). WG: the products on warpgroup
 * MMA, else mma.sync (where a warp skips a tile that none of its rows sees). NW (WG only):
 * warpgroups a block, each 64 query rows against the same key and value tiles; with two,
 * the tiles are 64 keys (the scores m64n64k16), each is read from L2 once for 128 queries,
 * and a warpgroup skips a tile past its last row.
 *   Measured (H200, FP8 16B, `dsv3 bench --device cuda -p 512,1024,2048,4096 -n 0 -r 3`,
 * alternated): NW 2 with 64-key tiles against NW 1: pp512 29.6k -> 30.0k tok/s, pp1024
 * 35.2k -> 35.5k, pp2048 37.2k -> 37.8k, pp4096 34.96k -> 35.9-36.1k; two stages (one
 * barrier a tile, not four): pp4096 35.4-35.6k -> 35.8k, pp8192 31.6k -> 31.9k; the heads
 * fastest in the grid (every head's longest tiles dispatched first; ncu had the SMs
 * active 77% of the launch): pp4096 35.7k -> 36.5k, pp8192 32.0k -> 32.7k; ping-pong
 * (warpgroup 1's scores wait for 0's, 0's values for 1's scores, so that each softmax
 * runs under the other warpgroup's products): pp4096 36.5k -> 36.6k, pp8192 32.2-32.3k
 * -> 32.55-32.6k. */
template <int D, int DV, bool SPLIT, bool WG, int NW>
__global__ void __launch_bounds__(FL_THREADS * NW, 2 / NW)
flash_kernel(float *__restrict__ out, float *__restrict__ part, float2 *__restrict__ ml,
             const __nv_bfloat16 *__restrict__ Q, const __nv_bfloat16 *__restrict__ Kp,
             const __nv_bfloat16 *__restrict__ V, int n, int H, int P, int pos0, float scale2, int kc, int mc)
{
    static_assert(NW == 1 || (WG && NW == 2), "flash_kernel: two warpgroups on warpgroup MMA only");
    typedef typename fl_smem_of<D, DV, SPLIT, WG, NW>::type SM;
    constexpr int KD = (SPLIT ? 3 : 1) * D, NSEG = SPLIT ? 3 : 1, NP = SPLIT ? 2 : 1, BM = FL_BM * NW;
    extern __shared__ __align__(1024) unsigned char fl_raw[];
    SM &sm = *(SM *)(fl_raw + ((1024 - ((unsigned)__cvta_generic_to_shared(fl_raw) & 1023)) & 1023));
    fl_rows<DV, WG ? D / 16 * NP : 1> r;
    r.w = fl_where(n, pos0, kc, mc, BM, FL_BN_OF(NW));
    if (r.w.c >= r.w.chunks) return;
    r.warp = threadIdx.x / 32, r.lane = threadIdx.x % 32, r.g = r.lane / 4, r.q = r.lane % 4;
    r.m[0] = r.m[1] = -INFINITY, r.l[0] = r.l[1] = 0.0f;
    #pragma unroll
    for (int j = 0; j < DV / 8; j++) r.o[j][0] = r.o[j][1] = r.o[j][2] = r.o[j][3] = 0.0f;
    r.w0 = pos0 + r.w.t0 + 16 * r.warp, r.pr[0] = r.w0 + r.g, r.pr[1] = r.w0 + r.g + 8; /* the warp's first row, the thread's rows */
    const __nv_bfloat16 *kb = Kp + (size_t)r.w.h * P * KD, *vb = V + (size_t)r.w.h * NSEG * P * DV;
    if constexpr (NW == 2) fl_tiles2<D, DV, SPLIT>(r, sm, Q, kb, vb, H, P, scale2, pos0);
    else fl_tiles1<D, DV, SPLIT, WG>(r, sm, Q, kb, vb, H, P, scale2);
    fl_store<DV, BM>(r.w, r.o, r.m, r.l, out, part, ml, n, H, mc, r.warp, r.g, r.q);
}

/* Rows of the tiles that flash_kernel took in more than one chunk: out = sum over the
 * chunks of 2^(m_c - M) o_c / sum of 2^(m_c - M) l_c, M the rows' largest m_c. One
 * thread per row, head and four columns. */
__global__ void flash_merge_kernel(float *__restrict__ out, const float *__restrict__ part,
                                   const float2 *__restrict__ ml, int n, int H, int DV, int pos0, int kc, int mc,
                                   int bm, int bn)
{
    cu_pdl_wait();
    cu_pdl_launch();
    const int nqt = (n + bm - 1) / bm, q4 = DV / 4;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * H * q4) return;
    const int col = (int)(i % q4) * 4, h = (int)(i / q4 % H), t = (int)(i / q4 / H), qt = t / bm, r = t % bm;
    const int chunks = (fl_tiles(qt, n, pos0, bm, bn) + kc - 1) / kc;
    if (chunks < 2) return; /* written by flash_kernel */
    const size_t at = ((size_t)h * nqt + qt) * mc * bm + r;
    float M = -INFINITY;
    for (int c = 0; c < chunks; c++) M = fmaxf(M, ml[at + (size_t)c * bm].x);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float L = 0.0f;
    for (int c = 0; c < chunks; c++) {
        const float2 v = ml[at + (size_t)c * bm];
        const float f = exp2f(v.x - M); /* 0 for a chunk the row saw nothing of */
        const float4 o = *(const float4 *)(part + (at + (size_t)c * bm) * DV + col);
        L += f * v.y;
        acc.x += f * o.x, acc.y += f * o.y, acc.z += f * o.z, acc.w += f * o.w;
    }
    const float inv = 1.0f / L;
    *(float4 *)(out + ((size_t)t * H + h) * DV + col) = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}

/* The dynamic shared memory of flash_kernel<.., WG, NW>: its tiles, and 1 KB to align them. */
template <int D, int DV, bool SPLIT, bool WG, int NW>
static size_t fl_bytes(void)
{
    return sizeof(typename fl_smem_of<D, DV, SPLIT, WG, NW>::type) + 1024;
}

/* Whether flash_kernel<D, DV, SPLIT, WG, NW> can run here, its shared memory granted
 * (asked for once): WG needs the device to run this build's sm_90a code. */
template <int D, int DV, bool SPLIT, bool WG, int NW>
static bool flash_ready(void)
{
    static int ready; /* 1: yes, -1: no */
    if (!ready) {
        cudaError_t e = cudaErrorNotSupported;
        if (!WG || cu_grouped_wgmma())
            e = cudaFuncSetAttribute(flash_kernel<D, DV, SPLIT, WG, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)fl_bytes<D, DV, SPLIT, WG, NW>());
        ready = e == cudaSuccess ? 1 : -1;
        if (e != cudaSuccess) cudaGetLastError();
    }
    return ready > 0;
}

/* The chunk of key tiles a block of bm query rows takes (tuning flash_kc at least): about two rounds of blocks (per_sm on an SM) on the device's SMs in all, so
 * that a pass of 512 tokens splits its longer tiles and one of 4096 hardly any. *mc:
 * chunks of the longest tile. */
static int flash_chunk(int n, int H, int pos0, int bm, int bn, int per_sm, int *mc)
{
    int nqt = (n + bm - 1) / bm;
    long total = 0;
    for (int qt = 0; qt < nqt; qt++) total += fl_tiles(qt, n, pos0, bm, bn);
    long slots = 2L * per_sm * cu_sm_count(); /* two rounds */
    int kc = (int)((total * H + slots - 1) / slots), least = cu_tune.flash_kc;
    if (kc < least) kc = least;
    *mc = (fl_tiles(nqt - 1, n, pos0, bm, bn) + kc - 1) / kc;
    return kc;
}


template <int D, int DV, bool SPLIT, bool WG, int NW>
static void flash_run(dim3 grid, float *out, float *part, float2 *ml, const __nv_bfloat16 *Q, const __nv_bfloat16 *Kp,
                      const __nv_bfloat16 *V, int n, int H, int P, int pos0, float s2, int kc, int mc)
{
    flash_kernel<D, DV, SPLIT, WG, NW><<<grid, FL_THREADS * NW, fl_bytes<D, DV, SPLIT, WG, NW>(), cu_s>>>(
        out, part, ml, Q, Kp, V, n, H, P, pos0, s2, kc, mc);
}

template <int D, int DV, bool SPLIT>
static bool flash_launch(float *out, const __nv_bfloat16 *Q, const __nv_bfloat16 *Kp, const __nv_bfloat16 *V, int n,
                         int H, int P, int pos0, float scale)
{
    bool wg = false;
    int nw = 1;
    if constexpr (D % 64 == 0 && DV % 64 == 0) { /* the warpgroup form's tiles are 64 columns wide */
        wg = cu_tune.flash >= 2 && flash_ready<D, DV, SPLIT, true, 1>();
        if (wg && cu_tune.flash == 3 && flash_ready<D, DV, SPLIT, true, 2>()) nw = 2;
    }
    const int bm = FL_BM * nw, bn = FL_BN_OF(nw), nqt = (n + bm - 1) / bm;
    int mc, kc = flash_chunk(n, H, pos0, bm, bn, 2 / nw, &mc);
    float *part = NULL;
    float2 *ml = NULL;
    if (mc > 1) {
        size_t rows = (size_t)H * nqt * mc * bm;
        part = (float *)cu_alloc(sizeof(float) * rows * DV);
        ml = (float2 *)cu_alloc(sizeof(float2) * rows);
        if (!part || !ml) { /* no room for the chunks' sums: whole tiles */
            cu_free(part);
            cu_free(ml);
            part = NULL, ml = NULL;
            kc = fl_tiles(nqt - 1, n, pos0, bm, bn), mc = 1;
        }
    }
    dim3 grid((unsigned)H, (unsigned)(nqt * mc)); /* the heads fastest: every head's longest tiles first */
    const float s2 = scale * 1.4426950408889634f;
    if constexpr (D % 64 == 0 && DV % 64 == 0) {
        if (wg && nw == 2) flash_run<D, DV, SPLIT, true, 2>(grid, out, part, ml, Q, Kp, V, n, H, P, pos0, s2, kc, mc);
        else if (wg) flash_run<D, DV, SPLIT, true, 1>(grid, out, part, ml, Q, Kp, V, n, H, P, pos0, s2, kc, mc);
    }
    if (!wg) flash_run<D, DV, SPLIT, false, 1>(grid, out, part, ml, Q, Kp, V, n, H, P, pos0, s2, kc, mc);
    if (mc > 1)
        cu_launch(flash_merge_kernel, cu_blocks((size_t)n * H * (DV / 4), 256), 256, 0, out, (const float *)part,
                  (const float2 *)ml, n, H, DV, pos0, kc, mc, bm, bn);
    cu_free(part);
    cu_free(ml);
    return cu_check(cudaGetLastError(), "flash attention: launch");
}

/* The head sizes compiled in: V3's, V2-Lite's and the 16B config's (192, 128), the golden
 * model's (64, 32). */
bool cu_flash_ok(int D, int DV, bool split)
{
    if (!cu_tune.flash) return false;
    if (D == 192 && DV == 128)
        return split ? flash_ready<192, 128, true, false, 1>() : flash_ready<192, 128, false, false, 1>();
    if (D == 64 && DV == 32) return split ? flash_ready<64, 32, true, false, 1>() : flash_ready<64, 32, false, false, 1>();
    return false;
}

bool cu_flash_attend(float *out, const void *Q, const void *Kp, const void *V, int n, int H, int P, int pos0,
                     float scale, int D, int DV, bool split)
{
    const __nv_bfloat16 *q = (const __nv_bfloat16 *)Q, *k = (const __nv_bfloat16 *)Kp, *v = (const __nv_bfloat16 *)V;
    if (D == 192 && DV == 128)
        return split ? flash_launch<192, 128, true>(out, q, k, v, n, H, P, pos0, scale)
                     : flash_launch<192, 128, false>(out, q, k, v, n, H, P, pos0, scale);
    if (D == 64 && DV == 32)
        return split ? flash_launch<64, 32, true>(out, q, k, v, n, H, P, pos0, scale)
                     : flash_launch<64, 32, false>(out, q, k, v, n, H, P, pos0, scale);
    return false;
}
