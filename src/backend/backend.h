/* backend.h - the operation table between the model code and the hardware.
 *
 * The model code (src/model/) calls every numeric operation through a ds_ops
 * table and never knows which backend runs it. A backend fills the table: the
 * CPU backend (src/backend/cpu/) with a plain scalar reference for every
 * operation and, where the machine allows, faster versions that are tested
 * against it. Activations are float32 buffers obtained from ops->alloc, so a
 * device backend can keep them in its own memory.
 *
 * Weights stay in their checkpoint format (ds_weight): BF16, F32, or FP8
 * e4m3 with one float32 scale per 128x128 block (partial edge blocks allowed),
 * read in place from the mapped checkpoint. */
#ifndef DS_BACKEND_H
#define DS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define DS_BLOCK 128

typedef enum { DS_W_F32, DS_W_BF16, DS_W_FP8 } ds_wfmt;

typedef struct {
    ds_wfmt fmt;
    int rows, cols;       /* out_features, in_features; row-major [rows][cols] */
    const void *data;
    const float *scale;   /* FP8 only: [ceil(rows/128)][ceil(cols/128)] */
    void *dev;            /* backend-private copy (device memory), or NULL */
} ds_weight;

typedef enum { DS_GEMM_BF16, DS_GEMM_FP8 } ds_gemm_impl;
typedef enum { DS_ATTN_ABSORB, DS_ATTN_NAIVE } ds_attn_impl;

/* One MLA layer's attention problem for a set of tokens (see mla.c for the math). */
typedef struct {
    int n_tokens;
    const int *seq, *pos;      /* per token: cache row (sequence) and position */
    int n_heads;               /* local heads */
    int nope, rope, vdim, kv_rank;
    float softmax_scale;
    /* absorb: q_c [n][heads][kv_rank], q_pe [n][heads][rope];
     * cache kv [seq][ctx][kv_rank], pe [seq][ctx][rope]. */
    const float *q_c, *q_pe;
    const float *kv_cache, *pe_cache;
    /* naive: q [n][heads][nope+rope]; k_cache [seq][ctx][heads][nope+rope], v_cache [seq][ctx][heads][vdim] */
    const float *q;
    const float *k_cache, *v_cache;
    int ctx;                   /* cache length per sequence */
    float *out;                /* absorb: [n][heads][kv_rank]; naive: [n][heads][vdim] */
} ds_attn_args;

typedef struct ds_ops {
    const char *name;
    void *(*alloc)(size_t bytes);           /* zeroed; NULL on failure */
    void (*free)(void *p);
    /* y[n][rows] = x[n][w->cols] @ W[row0:row0+rows]^T. gemm FP8 quantises x per
     * 128-block (act_quant) for FP8 weights; otherwise exact dequantisation. */
    void (*matmul)(float *y, const float *x, int n, const ds_weight *w, int row0, int rows,
                   ds_gemm_impl gemm, bool ue8m0);
    /* y[n][cols] = x[n][rows] @ W[row0:row0+rows] (the transpose product, used to
     * fold wkv_b into the query in absorb attention). */
    void (*matmul_t)(float *y, const float *x, int n, const ds_weight *w, int row0, int rows);
    /* y[i] = x[i] / rms(x[i]) * w, rows of length dim; y may alias x. */
    void (*rmsnorm)(float *y, const float *x, const float *w, int n, int dim, float eps);
    /* Rotates interleaved pairs of x[t][v*stride + off .. + rope) for v < nvec
     * by the angles of position pos[t]: (a, b) -> (a cos - b sin, a sin + b cos). */
    void (*rope)(float *x, int n, int nvec, int stride, int off, int rope, const int *pos,
                 const float *cos_tab, const float *sin_tab);
    void (*attention)(const ds_attn_args *a, ds_attn_impl impl);
    /* a[i] = silu(a[i]) * b[i] */
    void (*silu_mul)(float *a, const float *b, size_t n);
    /* y[i] += x[i] */
    void (*add)(float *y, const float *x, size_t n);
} ds_ops;

/* The CPU backend. simd selects the fast kernels where the CPU has them;
 * false gives the scalar reference everywhere. */
const ds_ops *cpu_backend(bool simd);

#endif
