/* cuda_norm.cu - the small ops: rmsnorm and rmsnorm_rows (with the residual add and a
 * scatter into cache rows), rope and rope_copy, mla_prologue (kv_norm and both rope
 * rotations in one launch), silu_mul, add, copy_rows, add_rows_scaled and embed.
 * Each is a few microseconds at decode, where a launch boundary costs as much as the
 * work: the decode forms load what does not depend on the previous kernel (norm
 * weights, rope tables) before the PDL wait and keep a row in registers.
 * Tested by tests/cuda/test_cuda_ops.c (test_rmsnorm*, test_rope*, test_mla_prologue,
 * test_elementwise, test_moved: against the CPU backend). */
#include <math.h>
#include <stdlib.h>

#include "cuda_internal.cuh"

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

void cu_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps)
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

/* rmsnorm_rows with the row held in registers: thread i owns
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

void cu_rmsnorm_rows(float *y, int ys, const int *di, float *x, int xs, const float *r, const float *w, int n,
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

void cu_rope(float *x, int n, int nvec, int stride, int off, int rope, const int *pos, const float *cos_tab,
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

void cu_rope_copy(float *dst, int ds, const int *di, const float *src, int ss, int n, int nvec, int rope,
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

/* mla_prologue in one launch: block (t, 0) writes token t's normalised latent
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
     * read before the wait, with the latent row held in registers across the
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

void cu_mla_prologue(float *kv, float *pe, const int *row, const float *kvx, const float *norm_w, float eps,
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

void cu_embed(float *h, const ds_weight *emb, const int32_t *tok, int n, int row0)
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

