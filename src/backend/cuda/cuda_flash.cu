/* Prefill attention of the expanded (MHA) form in one launch per pass (session 23,
 * DSV3_CUDA_FLASH): for each head and 64-query tile, the scores against 32-key tiles,
 * the causal mask, a running (online) softmax and the value products, all on the
 * tensor cores (mma.m16n8k16, bf16 operands, float32 sums), without writing the
 * scores. cu_mla_expanded's chunk loop wrote every score (float32), read them back for
 * the softmax, wrote the probabilities as bf16 parts and read them again for the
 * values: two cuBLAS products and a softmax launch per chunk of tokens, each over the
 * whole square, masked half included.
 *
 * The operands are cu_mla_expanded's packs: with split activations (the default) each
 * is a bf16 hi part and a lo part (x - hi rounded again), and every product is
 * hi.hi + hi.lo + lo.hi, as the packed segments make cuBLAS sum them; the
 * probabilities are split the same way before the value products. Queries: row
 * t * H + h, KD = 3 D elements [hi | hi | lo]; keys of head h: row h * P + i,
 * [hi | lo | hi]; values of head h: segments (h * 3 + s) * P + i of DV elements, s = 0
 * hi, 1 lo. Without the split, one segment of each. */
#include "cuda_internal.cuh"

#define FL_BM 64 /* query rows a block: four warps of 16 */
#define FL_BN 32 /* keys a tile */
#define FL_THREADS 128

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
    for (int i = threadIdx.x; i < ROWS * CH; i += FL_THREADS) {
        int r = i / CH, c = i % CH * 8;
        bool in = r < valid;
        cu_cp16(&dst[r][c], in ? src + r * stride + c : src, in);
    }
}

__device__ __forceinline__ void fl_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
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

/* bf16 pair of (a, b), a in the low half; *lo gets the pair of what rounding left */
__device__ __forceinline__ uint32_t fl_split(float a, float b, uint32_t *lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    float2 f = __bfloat1622float2(h);
    __nv_bfloat162 l = __floats2bfloat162_rn(a - f.x, b - f.y);
    *lo = *(uint32_t *)&l;
    return *(uint32_t *)&h;
}

/* Key tiles of query tile qt (those up to its last query's position). */
__host__ __device__ static inline int fl_tiles(int qt, int n, int pos0)
{
    int last = min(n, (qt + 1) * FL_BM) - 1;
    return (pos0 + last) / FL_BN + 1;
}

/* Block (x, h): chunk x % mc of query tile nqt - 1 - x / mc (the longest first) of head h,
 * key tiles kc x % mc .. (mc chunks at most; blocks past a tile's chunks return). A tile
 * of one chunk writes its rows of out; the chunks of a longer one write their unscaled
 * sums (part) and each row's maximum and sum (ml) for flash_merge_kernel, so that the
 * long tiles of a causal pass do not keep a few SMs busy after the rest are done.
 * Warp w owns the tile's rows 16 w .. 16 w + 15; a thread the rows g and g + 8 of them
 * (g = lane / 4) and, of each 8-column tile of scores or outputs, columns 2 q and 2 q + 1
 * (q = lane % 4). scale2: the softmax scale times log2(e). */
template <int D, int DV, bool SPLIT>
__global__ void __launch_bounds__(FL_THREADS, 2)
flash_kernel(float *__restrict__ out, float *__restrict__ part, float2 *__restrict__ ml,
             const __nv_bfloat16 *__restrict__ Q, const __nv_bfloat16 *__restrict__ Kp,
             const __nv_bfloat16 *__restrict__ V, int n, int H, int P, int pos0, float scale2, int kc, int mc)
{
    constexpr int KD = (SPLIT ? 3 : 1) * D, NSEG = SPLIT ? 3 : 1;
    extern __shared__ __align__(16) unsigned char fl_raw[];
    fl_smem<D, DV, SPLIT> &sm = *(fl_smem<D, DV, SPLIT> *)fl_raw;
    const int nqt = (n + FL_BM - 1) / FL_BM, qt = nqt - 1 - (int)blockIdx.x / mc, c = (int)blockIdx.x % mc;
    const int tiles = fl_tiles(qt, n, pos0), chunks = (tiles + kc - 1) / kc;
    if (c >= chunks) return;
    const int kt0 = c * kc, kt1 = min(tiles, kt0 + kc);
    const int h = blockIdx.y, t0 = qt * FL_BM, nq = min(FL_BM, n - t0);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const __nv_bfloat16 *qb = Q + ((size_t)t0 * H + h) * KD;
    fl_load<D, FL_BM>(sm.q[0], qb, (size_t)H * KD, nq);
    if (SPLIT) fl_load<D, FL_BM>(sm.q[SPLIT ? 1 : 0], qb + 2 * D, (size_t)H * KD, nq);
    const __nv_bfloat16 *kb = Kp + (size_t)h * P * KD, *vb = V + (size_t)h * NSEG * P * DV;
    auto load_k = [&](int kt) {
        int j0 = kt * FL_BN, valid = min(FL_BN, P - j0);
        fl_load<D, FL_BN>(sm.k[0], kb + (size_t)j0 * KD, KD, valid);
        if (SPLIT) fl_load<D, FL_BN>(sm.k[SPLIT ? 1 : 0], kb + (size_t)j0 * KD + D, KD, valid);
        fl_commit();
    };
    auto load_v = [&](int kt) {
        int j0 = kt * FL_BN, valid = min(FL_BN, P - j0);
        fl_load<DV, FL_BN>(sm.v[0], vb + (size_t)j0 * DV, DV, valid);
        if (SPLIT) fl_load<DV, FL_BN>(sm.v[SPLIT ? 1 : 0], vb + ((size_t)P + j0) * DV, DV, valid);
        fl_commit();
    };
    load_k(kt0); /* with the queries: group 0 */
    load_v(kt0);
    float o[DV / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    #pragma unroll
    for (int j = 0; j < DV / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    const int w0 = pos0 + t0 + 16 * warp, pr[2] = {w0 + g, w0 + g + 8}; /* the warp's first row, the thread's rows */
    for (int kt = kt0; kt < kt1; kt++) {
        fl_wait<1>(); /* this tile's keys (the values may still be on their way) */
        __syncthreads();
        const int j0 = kt * FL_BN;
        const bool active = j0 <= w0 + 15; /* a key of the tile that a row of the warp sees */
        float s[FL_BN / 8][4];
        if (active) {
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
                    cu_mma<true>(s[j], ah[0], ah[1], ah[2], ah[3], bh[0], bh[1]);
                    cu_mma<true>(s[j + 1], ah[0], ah[1], ah[2], ah[3], bh[2], bh[3]);
                    if (SPLIT) {
                        fl_ldm4<false>(bl, &sm.k[SPLIT ? 1 : 0][key][col]);
                        cu_mma<true>(s[j], ah[0], ah[1], ah[2], ah[3], bl[0], bl[1]);
                        cu_mma<true>(s[j + 1], ah[0], ah[1], ah[2], ah[3], bl[2], bl[3]);
                        cu_mma<true>(s[j], al[0], al[1], al[2], al[3], bh[0], bh[1]);
                        cu_mma<true>(s[j + 1], al[0], al[1], al[2], al[3], bh[2], bh[3]);
                    }
                }
            }
        }
        __syncthreads(); /* every warp is done with the keys */
        const bool more = kt + 1 < kt1;
        if (more) load_k(kt + 1);
        if (active) {
            /* scaled scores, the mask past each row's position, the running maximum */
            const bool mask = j0 + FL_BN - 1 > w0;
            float mx[2] = {m[0], m[1]};
            #pragma unroll
            for (int j = 0; j < FL_BN / 8; j++)
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
            /* a row that has seen no key yet (a later chunk) keeps -inf and zeros */
            float ref[2] = {mx[0] == -INFINITY ? 0.0f : mx[0], mx[1] == -INFINITY ? 0.0f : mx[1]};
            float corr[2] = {exp2f(m[0] - ref[0]), exp2f(m[1] - ref[1])}, ls[2] = {0.0f, 0.0f};
            m[0] = mx[0], m[1] = mx[1];
            #pragma unroll
            for (int j = 0; j < FL_BN / 8; j++)
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(s[j][e] - ref[e / 2]);
                    s[j][e] = p;
                    ls[e / 2] += p;
                }
            l[0] = l[0] * corr[0] + ls[0], l[1] = l[1] * corr[1] + ls[1]; /* the thread's columns */
            #pragma unroll
            for (int j = 0; j < DV / 8; j++) o[j][0] *= corr[0], o[j][1] *= corr[0], o[j][2] *= corr[1], o[j][3] *= corr[1];
        }
        if (more) fl_wait<1>(); /* this tile's values (the next keys may still be on their way) */
        else fl_wait<0>();
        __syncthreads();
        if (active) {
            #pragma unroll
            for (int ks = 0; ks < FL_BN / 16; ks++) {
                /* the probabilities as the A operand: keys 16 ks .. of the score tiles 2 ks, 2 ks + 1 */
                uint32_t ph[4], pl[4];
                ph[0] = fl_split(s[2 * ks][0], s[2 * ks][1], &pl[0]);
                ph[1] = fl_split(s[2 * ks][2], s[2 * ks][3], &pl[1]);
                ph[2] = fl_split(s[2 * ks + 1][0], s[2 * ks + 1][1], &pl[2]);
                ph[3] = fl_split(s[2 * ks + 1][2], s[2 * ks + 1][3], &pl[3]);
                #pragma unroll
                for (int j = 0; j < DV / 8; j += 2) {
                    uint32_t vh[4], vl[4];
                    const int key = 16 * ks + lane % 8 + lane / 8 % 2 * 8, col = 8 * j + lane / 16 * 8;
                    fl_ldm4<true>(vh, &sm.v[0][key][col]);
                    cu_mma<true>(o[j], ph[0], ph[1], ph[2], ph[3], vh[0], vh[1]);
                    cu_mma<true>(o[j + 1], ph[0], ph[1], ph[2], ph[3], vh[2], vh[3]);
                    if (SPLIT) {
                        fl_ldm4<true>(vl, &sm.v[SPLIT ? 1 : 0][key][col]);
                        cu_mma<true>(o[j], ph[0], ph[1], ph[2], ph[3], vl[0], vl[1]);
                        cu_mma<true>(o[j + 1], ph[0], ph[1], ph[2], ph[3], vl[2], vl[3]);
                        cu_mma<true>(o[j], pl[0], pl[1], pl[2], pl[3], vh[0], vh[1]);
                        cu_mma<true>(o[j + 1], pl[0], pl[1], pl[2], pl[3], vh[2], vh[3]);
                    }
                }
            }
        }
        __syncthreads(); /* every warp is done with the values */
        if (more) load_v(kt + 1);
    }
    #pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(~0u, l[i], 1);
        l[i] += __shfl_xor_sync(~0u, l[i], 2);
    }
    const int ra = 16 * warp + g, rb = ra + 8, ta = t0 + ra, tb = t0 + rb;
    if (chunks > 1) { /* the chunk's sums for flash_merge_kernel */
        const size_t at = (((size_t)h * nqt + qt) * mc + c) * FL_BM;
        if (q == 0) ml[at + ra] = make_float2(m[0], l[0]), ml[at + rb] = make_float2(m[1], l[1]);
        #pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            const int col = 8 * j + 2 * q;
            *(float2 *)(part + (at + ra) * DV + col) = make_float2(o[j][0], o[j][1]);
            *(float2 *)(part + (at + rb) * DV + col) = make_float2(o[j][2], o[j][3]);
        }
        return;
    }
    l[0] = 1.0f / l[0], l[1] = 1.0f / l[1];
    #pragma unroll
    for (int j = 0; j < DV / 8; j++) {
        const int col = 8 * j + 2 * q;
        if (ta < n) *(float2 *)(out + ((size_t)ta * H + h) * DV + col) = make_float2(o[j][0] * l[0], o[j][1] * l[0]);
        if (tb < n) *(float2 *)(out + ((size_t)tb * H + h) * DV + col) = make_float2(o[j][2] * l[1], o[j][3] * l[1]);
    }
}

/* Rows of the tiles that flash_kernel took in more than one chunk: out = sum over the
 * chunks of 2^(m_c - M) o_c / sum of 2^(m_c - M) l_c, M the rows' largest m_c. One
 * thread per row, head and four columns. */
__global__ void flash_merge_kernel(float *__restrict__ out, const float *__restrict__ part,
                                   const float2 *__restrict__ ml, int n, int H, int DV, int pos0, int kc, int mc)
{
    const int nqt = (n + FL_BM - 1) / FL_BM, q4 = DV / 4;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * H * q4) return;
    const int col = (int)(i % q4) * 4, h = (int)(i / q4 % H), t = (int)(i / q4 / H), qt = t / FL_BM, r = t % FL_BM;
    const int chunks = (fl_tiles(qt, n, pos0) + kc - 1) / kc;
    if (chunks < 2) return; /* written by flash_kernel */
    const size_t at = ((size_t)h * nqt + qt) * mc * FL_BM + r;
    float M = -INFINITY;
    for (int c = 0; c < chunks; c++) M = fmaxf(M, ml[at + (size_t)c * FL_BM].x);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float L = 0.0f;
    for (int c = 0; c < chunks; c++) {
        const float2 v = ml[at + (size_t)c * FL_BM];
        const float f = exp2f(v.x - M); /* 0 for a chunk the row saw nothing of */
        const float4 o = *(const float4 *)(part + (at + (size_t)c * FL_BM) * DV + col);
        L += f * v.y;
        acc.x += f * o.x, acc.y += f * o.y, acc.z += f * o.z, acc.w += f * o.w;
    }
    const float inv = 1.0f / L;
    *(float4 *)(out + ((size_t)t * H + h) * DV + col) = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}

/* ---- the same on warpgroup MMA (DSV3_CUDA_FLASH=2, the default where the build has an
 * sm_90a image; D and DV multiples of 64). The block's four warps are one warpgroup. The
 * queries stay the A operand from registers (ldmatrix, as above); the key and value tiles
 * are B operands by descriptor, in wgmma's 128-byte swizzle (GR_SW's layout: 32 rows of
 * 64 columns a sub-tile, a row's 16-byte chunk c at c ^ (row % 8)). The keys are K-major
 * (the scores' k runs along a key's row); the values are read MN-major (imm-trans-b: the
 * products' k runs down the keys), so both tiles land by the same cp.async pattern. Every
 * warp takes every tile (wgmma is warpgroup-wide), the masked ones included. */
#define FW_SW(r, c) ((r) * 64 + ((((c) >> 3) ^ ((r) & 7)) << 3) + ((c) & 7))

template <int D, int DV, bool SPLIT>
struct fw_smem {
    uint16_t k[SPLIT ? 2 : 1][D / 64][FL_BN * 64];  /* key tile, sub-tiles of 64 columns (4 KB) */
    uint16_t v[SPLIT ? 2 : 1][DV / 64][FL_BN * 64]; /* value tile, the same */
    __nv_bfloat16 q[SPLIT ? 2 : 1][FL_BM][D + 8];
};

/* ROWS rows of COLS bf16 from src (rows `stride` apart) into sub-tiles of 64 columns in
 * FW_SW's layout, zeros from row `valid` on. */
template <int COLS, int ROWS>
__device__ __forceinline__ void fw_load(uint16_t (*dst)[ROWS * 64], const __nv_bfloat16 *src, size_t stride, int valid)
{
    constexpr int CH = COLS / 8;
    for (int i = threadIdx.x; i < ROWS * CH; i += FL_THREADS) {
        int r = i / CH, c = i % CH * 8;
        bool in = r < valid;
        cu_cp16(&dst[c / 64][FW_SW(r, c % 64)], in ? src + r * stride + c : src, in);
    }
}

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

template <int D, int DV, bool SPLIT>
__global__ void __launch_bounds__(FL_THREADS, 2)
flash_wg_kernel(float *__restrict__ out, float *__restrict__ part, float2 *__restrict__ ml,
                const __nv_bfloat16 *__restrict__ Q, const __nv_bfloat16 *__restrict__ Kp,
                const __nv_bfloat16 *__restrict__ V, int n, int H, int P, int pos0, float scale2, int kc, int mc)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int KD = (SPLIT ? 3 : 1) * D, NSEG = SPLIT ? 3 : 1, NP = SPLIT ? 2 : 1;
    extern __shared__ __align__(1024) unsigned char fw_raw[];
    unsigned char *base = fw_raw + ((1024 - ((unsigned)__cvta_generic_to_shared(fw_raw) & 1023)) & 1023);
    fw_smem<D, DV, SPLIT> &sm = *(fw_smem<D, DV, SPLIT> *)base;
    const int nqt = (n + FL_BM - 1) / FL_BM, qt = nqt - 1 - (int)blockIdx.x / mc, c = (int)blockIdx.x % mc;
    const int tiles = fl_tiles(qt, n, pos0), chunks = (tiles + kc - 1) / kc;
    if (c >= chunks) return;
    const int kt0 = c * kc, kt1 = min(tiles, kt0 + kc);
    const int h = blockIdx.y, t0 = qt * FL_BM, nq = min(FL_BM, n - t0);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const __nv_bfloat16 *qb = Q + ((size_t)t0 * H + h) * KD;
    fl_load<D, FL_BM>(sm.q[0], qb, (size_t)H * KD, nq);
    if (SPLIT) fl_load<D, FL_BM>(sm.q[NP - 1], qb + 2 * D, (size_t)H * KD, nq);
    const __nv_bfloat16 *kb = Kp + (size_t)h * P * KD, *vb = V + (size_t)h * NSEG * P * DV;
    auto load_k = [&](int kt) {
        int j0 = kt * FL_BN, valid = min(FL_BN, P - j0);
        fw_load<D, FL_BN>(sm.k[0], kb + (size_t)j0 * KD, KD, valid);
        if (SPLIT) fw_load<D, FL_BN>(sm.k[NP - 1], kb + (size_t)j0 * KD + D, KD, valid);
        fl_commit();
    };
    auto load_v = [&](int kt) {
        int j0 = kt * FL_BN, valid = min(FL_BN, P - j0);
        fw_load<DV, FL_BN>(sm.v[0], vb + (size_t)j0 * DV, DV, valid);
        if (SPLIT) fw_load<DV, FL_BN>(sm.v[NP - 1], vb + ((size_t)P + j0) * DV, DV, valid);
        fl_commit();
    };
    load_k(kt0);
    load_v(kt0);
    float o[DV / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    #pragma unroll
    for (int j = 0; j < DV / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    const int w0 = pos0 + t0 + 16 * warp, pr[2] = {w0 + g, w0 + g + 8};
    uint32_t qa[D / 16][NP][4]; /* the warp's query fragments, hi and lo, for every key tile */
    for (int kt = kt0; kt < kt1; kt++) {
        fl_wait<1>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* cp.async's bytes, seen by wgmma */
        __syncthreads();
        if (kt == kt0)
            #pragma unroll
            for (int i = 0; i < D / 16; i++)
                #pragma unroll
                for (int pt = 0; pt < NP; pt++)
                    fl_ldm4<false>(qa[i][pt], &sm.q[pt][16 * warp + lane % 16][16 * i + lane / 16 * 8]);
        const int j0 = kt * FL_BN;
        float s[FL_BN / 8][4];
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        #pragma unroll
        for (int i = 0; i < D / 16; i++) {
            const int kk = 16 * i;
            const uint64_t dh = fw_desc(&sm.k[0][kk / 64][0]) + (uint64_t)((kk % 64 * 2) >> 4);
            fw_mma32(&s[0][0], qa[i][0], dh, i > 0);
            if (SPLIT) {
                const uint64_t dl = fw_desc(&sm.k[NP - 1][kk / 64][0]) + (uint64_t)((kk % 64 * 2) >> 4);
                fw_mma32(&s[0][0], qa[i][0], dl, 1);
                fw_mma32(&s[0][0], qa[i][NP - 1], dh, 1);
            }
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        __syncthreads(); /* every warp is done with the keys */
        const bool more = kt + 1 < kt1;
        if (more) load_k(kt + 1);
        {
            const bool mask = j0 + FL_BN - 1 > w0;
            float mx[2] = {m[0], m[1]};
            #pragma unroll
            for (int j = 0; j < FL_BN / 8; j++)
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
            for (int j = 0; j < FL_BN / 8; j++)
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
        if (more) fl_wait<1>();
        else fl_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        /* the probabilities as the A operand (all of them before the first product reads them) */
        uint32_t ph[FL_BN / 16][4], pl[FL_BN / 16][4];
        #pragma unroll
        for (int ks = 0; ks < FL_BN / 16; ks++) {
            ph[ks][0] = fl_split(s[2 * ks][0], s[2 * ks][1], &pl[ks][0]);
            ph[ks][1] = fl_split(s[2 * ks][2], s[2 * ks][3], &pl[ks][1]);
            ph[ks][2] = fl_split(s[2 * ks + 1][0], s[2 * ks + 1][1], &pl[ks][2]);
            ph[ks][3] = fl_split(s[2 * ks + 1][2], s[2 * ks + 1][3], &pl[ks][3]);
        }
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        #pragma unroll
        for (int ks = 0; ks < FL_BN / 16; ks++)
            #pragma unroll
            for (int half = 0; half < DV / 64; half++) {
                /* keys 16 ks .. : 16 rows of the tile, two of its 8-row groups */
                const uint64_t vh = fw_desc(&sm.v[0][half][0]) + (uint64_t)(16 * ks * 128 >> 4);
                fw_mma64t(&o[8 * half][0], ph[ks], vh);
                if (SPLIT) {
                    const uint64_t vl = fw_desc(&sm.v[NP - 1][half][0]) + (uint64_t)(16 * ks * 128 >> 4);
                    fw_mma64t(&o[8 * half][0], ph[ks], vl);
                    fw_mma64t(&o[8 * half][0], pl[ks], vh);
                }
            }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        __syncthreads();
        if (more) load_v(kt + 1);
    }
    #pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(~0u, l[i], 1);
        l[i] += __shfl_xor_sync(~0u, l[i], 2);
    }
    const int ra = 16 * warp + g, rb = ra + 8, ta = t0 + ra, tb = t0 + rb;
    if (chunks > 1) {
        const size_t at = (((size_t)h * nqt + qt) * mc + c) * FL_BM;
        if (q == 0) ml[at + ra] = make_float2(m[0], l[0]), ml[at + rb] = make_float2(m[1], l[1]);
        #pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            const int col = 8 * j + 2 * q;
            *(float2 *)(part + (at + ra) * DV + col) = make_float2(o[j][0], o[j][1]);
            *(float2 *)(part + (at + rb) * DV + col) = make_float2(o[j][2], o[j][3]);
        }
        return;
    }
    l[0] = 1.0f / l[0], l[1] = 1.0f / l[1];
    #pragma unroll
    for (int j = 0; j < DV / 8; j++) {
        const int col = 8 * j + 2 * q;
        if (ta < n) *(float2 *)(out + ((size_t)ta * H + h) * DV + col) = make_float2(o[j][0] * l[0], o[j][1] * l[0]);
        if (tb < n) *(float2 *)(out + ((size_t)tb * H + h) * DV + col) = make_float2(o[j][2] * l[1], o[j][3] * l[1]);
    }
#endif
}

/* Whether flash_kernel<D, DV, SPLIT> (and flash_wg_kernel where it is built and the
 * device took an sm_90a image) have their shared memory (asked for once). */
template <int D, int DV, bool SPLIT>
static bool flash_ready(void)
{
    static int ready; /* 1: yes, -1: the device refused */
    if (!ready) {
        cudaError_t e = cudaFuncSetAttribute(flash_kernel<D, DV, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)sizeof(fl_smem<D, DV, SPLIT>));
        ready = e == cudaSuccess ? 1 : -1;
        if (e != cudaSuccess) cudaGetLastError();
    }
    return ready > 0;
}

/* The dynamic shared memory of flash_wg_kernel: its tiles, and 1 KB to align them. */
template <int D, int DV, bool SPLIT>
static size_t fw_bytes(void)
{
    return sizeof(fw_smem<D, DV, SPLIT>) + 1024;
}

template <int D, int DV, bool SPLIT>
static bool flash_wg_ready(void)
{
    static int ready;
    if (!ready) {
        cudaError_t e = cudaErrorNotSupported;
        if (D % 64 == 0 && DV % 64 == 0 && cu_grouped_wgmma())
            e = cudaFuncSetAttribute(flash_wg_kernel<D, DV, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)fw_bytes<D, DV, SPLIT>());
        ready = e == cudaSuccess ? 1 : -1;
        if (e != cudaSuccess) cudaGetLastError();
    }
    return ready > 0;
}

/* The chunk of key tiles a block takes (DSV3_CUDA_FLASH_KC at least, default 4): about
 * two rounds of blocks on the device's SMs in all, so that a pass of 512 tokens splits
 * its longer tiles and one of 4096 hardly any. *mc: chunks of the longest tile. */
static int flash_chunk(int n, int H, int pos0, int *mc)
{
    int nqt = (n + FL_BM - 1) / FL_BM;
    long total = 0;
    for (int qt = 0; qt < nqt; qt++) total += fl_tiles(qt, n, pos0);
    long slots = 4L * cu_sm_count(); /* two blocks an SM, two rounds */
    int kc = (int)((total * H + slots - 1) / slots), least = cu_v.flash_kc > 0 ? cu_v.flash_kc : 4;
    if (kc < least) kc = least;
    *mc = (fl_tiles(nqt - 1, n, pos0) + kc - 1) / kc;
    return kc;
}

template <int D, int DV, bool SPLIT>
static bool flash_launch(float *out, const __nv_bfloat16 *Q, const __nv_bfloat16 *Kp, const __nv_bfloat16 *V, int n,
                         int H, int P, int pos0, float scale)
{
    int mc, kc = flash_chunk(n, H, pos0, &mc), nqt = (n + FL_BM - 1) / FL_BM;
    float *part = NULL;
    float2 *ml = NULL;
    if (mc > 1) {
        size_t rows = (size_t)H * nqt * mc * FL_BM;
        part = (float *)cu_alloc(sizeof(float) * rows * DV);
        ml = (float2 *)cu_alloc(sizeof(float2) * rows);
        if (!part || !ml) { /* no room for the chunks' sums: whole tiles */
            cu_free(part);
            cu_free(ml);
            part = NULL, ml = NULL;
            kc = fl_tiles(nqt - 1, n, pos0), mc = 1;
        }
    }
    dim3 grid((unsigned)(nqt * mc), (unsigned)H);
    const float s2 = scale * 1.4426950408889634f;
    if (cu_v.flash == 2 && flash_wg_ready<D, DV, SPLIT>())
        flash_wg_kernel<D, DV, SPLIT><<<grid, FL_THREADS, fw_bytes<D, DV, SPLIT>(), cu_s>>>(out, part, ml, Q, Kp, V, n,
                                                                                          H, P, pos0, s2, kc, mc);
    else
        flash_kernel<D, DV, SPLIT><<<grid, FL_THREADS, sizeof(fl_smem<D, DV, SPLIT>), cu_s>>>(out, part, ml, Q, Kp, V,
                                                                                             n, H, P, pos0, s2, kc, mc);
    if (mc > 1)
        flash_merge_kernel<<<cu_blocks((size_t)n * H * (DV / 4), 256), 256, 0, cu_s>>>(out, part, ml, n, H, DV, pos0, kc,
                                                                                        mc);
    cu_free(part);
    cu_free(ml);
    return cu_check(cudaGetLastError(), "flash attention: launch");
}

/* The head sizes compiled in: V3's, V2-Lite's and the 16B config's (192, 128), the golden
 * model's (64, 32). */
bool cu_flash_ok(int D, int DV, bool split)
{
    if (!cu_v.flash) return false;
    if (D == 192 && DV == 128) return split ? flash_ready<192, 128, true>() : flash_ready<192, 128, false>();
    if (D == 64 && DV == 32) return split ? flash_ready<64, 32, true>() : flash_ready<64, 32, false>();
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
