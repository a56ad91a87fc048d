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

/* An MLP's three weights: y = w2(silu(w1 x) * w3 x) (a MoE layer's shared experts). */
typedef struct {
    const ds_weight *w1, *w2, *w3;
} ds_mlp_w;

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
    /* Optional hint (false: unknown): token i is sequence seq0 at position
     * pos0 + i for every i (a prefill), so a backend may use dense products. */
    bool contiguous;
    int seq0, pos0;
    /* Every pos[t] is below pos_bound, a bound the host knows (0: none known). A
     * recorded step keeps its bound for every replay (forward.c's graph classes). */
    int pos_bound;
    /* Optional (absorb, backends with attn_head_last): head h attends positions
     * 0 .. min(pos[t], head_last[h]) only. forward.c's expanded prefill uses
     * the heads for a pass's tokens, each with its own causal limit. */
    const int *head_last;
    /* Absorb, with head_last: scores use the cache rows' first key_dims columns
     * (0: all kv_rank) and the output is their columns [val_off, kv_rank), rows
     * of kv_rank - val_off (expanded rows [k_nope | v]). */
    int key_dims, val_off;
} ds_attn_args;

/* One product of a batch of matmuls: y[n][rows] = x[n][w->cols] @ W[row0:row0+rows]^T. */
typedef struct {
    float *y;
    const float *x;
    int n;
    const ds_weight *w;
    int row0, rows;
} ds_matmul_job;

/* One row's settings for pick_rows (model/sampler.h's meanings). */
typedef struct {
    float temperature;    /* <= 0: greedy */
    int top_k;            /* 0: off */
    float top_p;          /* 1: off */
    double u;             /* the uniform in [0, 1) of the draw */
    float penalty;        /* the repetition penalty (1: off) on the n_hist tokens of */
    int n_hist;           /* hist (distinct valid ids, host memory; sampler_distinct), */
    const int32_t *hist;  /* applied to the row first (sampler_penalise) */
} ds_pick;

typedef struct ds_ops {
    const char *name;
    void *(*alloc)(size_t bytes);           /* zeroed; NULL on failure */
    /* Optional (NULL: alloc): as alloc but the contents are undefined, for a pass's
     * scratch whose every reader finds it written (no fill to queue: a memset between two
     * kernels of a captured CUDA step costs more than most kernels). */
    void *(*alloc_scratch)(size_t bytes);
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
    bool attn_head_last; /* attention honours ds_attn_args.head_last (absorb) */
    /* a[i] = silu(a[i]) * b[i] */
    void (*silu_mul)(float *a, const float *b, size_t n);
    /* y[i] += x[i] */
    void (*add)(float *y, const float *x, size_t n);
    /* Optional (NULL: call matmul per job): independent matmuls with the
     * contract of matmul, run together so that a backend can spread all their
     * rows over its threads at once (the experts of a decode step). */
    void (*matmul_many)(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0);

    /* ---- data movement, so that no host code touches activations. Pointers
     * named here come from alloc (index arrays included) unless said otherwise;
     * on the CPU that is host memory, on a device backend device memory. */
    /* Host -> alloc'd memory and back. download waits for the work queued before it. */
    void (*upload)(void *dst, const void *host_src, size_t bytes);
    void (*download)(void *host_dst, const void *src, size_t bytes);
    /* Optional (NULL: download the rows and pick on the host): for the rows i < n of
     * x (n, V), host_out[i] = the pick that model/sampler.h's sampler_pick_u makes of
     * row i with p[i]'s settings and uniform after p[i]'s penalty (the argmax for a
     * temperature <= 0); p is a host array, NULL for all greedy. x may be changed
     * (the penalised logits). Waits as download does. */
    void (*pick_rows)(int32_t *host_out, float *x, int n, int V, const ds_pick *p);
    /* Waits until every queued op has finished. */
    void (*sync)(void);
    void (*zero)(void *p, size_t bytes);
    /* Row copy with optional index lists (NULL: identity), for i < n, j < len:
     * dst[(di ? di[i] : i) * dst_stride + j] = src[(si ? si[i] : i) * src_stride + j].
     * Covers column-block gathers and scatters, KV-cache row writes and MoE token
     * gathers. Destination rows must be distinct. */
    void (*copy_rows)(float *dst, int dst_stride, const int *di, const float *src, int src_stride, const int *si,
                      int n, int len);
    /* y[idx[i]][j] += w[i] * x[i][j] for i < n, j < dim; the idx[i] are distinct. */
    void (*add_rows_scaled)(float *y, const int *idx, const float *x, const float *w, int n, int dim);
    /* h[i] = row tok[i] - row0 of emb (F32 or BF16) as float32, or zeros when that
     * row is outside [0, emb->rows) (another rank's vocabulary slice). */
    void (*embed)(float *h, const ds_weight *emb, const int32_t *tok, int n, int row0);
    /* Products of each head with its own block of rows of w, heads h < H, tokens t < n
     * (x and y rows of H * xs and H * ys floats):
     *   matmul_heads:   y[t][h*ys + r] = sum_c x[t][h*xs + c] W[row0 + h*hstride + r][c], r < rows, c < w->cols
     *   matmul_heads_t: y[t][h*ys + c] = sum_r x[t][h*xs + r] W[row0 + h*hstride + r][c], r < rows, c < w->cols
     * (absorb attention: q_c = q_nope @ wkv_b[h, :nope] and out = o_c @ wkv_b[h, nope:]^T).
     * May be NULL: the model then loops over heads with matmul / matmul_t. */
    void (*matmul_heads)(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                         int hstride, int rows);
    void (*matmul_heads_t)(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                           int hstride, int rows);
    /* Gate.forward on scores sc (n, E), overwritten: top-k expert indices idx (n, K)
     * and weights wt (n, K), as the reference's Gate (bias steers the choice only). */
    void (*moe_route)(int *idx, float *wt, float *sc, const float *bias, int n, int E, int K, int groups,
                      int limited_groups, bool sigmoid, float route_scale);
    /* Optional (NULL: the model calls matmul, then moe_route): sc (n, E) = x @ gate^T (E =
     * gate->rows; the exact product, as matmul with DS_GEMM_BF16), then moe_route on sc. */
    void (*moe_gate)(int *idx, float *wt, float *sc, const float *x, const ds_weight *gate, const float *bias, int n,
                     int K, int groups, int limited_groups, bool sigmoid, float route_scale);
    /* y (n, dim) = sum_k wt[t][k] * expert idx[t][k](x[t]) + shared(x[t]), expert e =
     * w2(silu(w1 x) * w3 x) with weights ew*[e - e0] for e0 <= e < e0 + ne; other experts
     * count as zero (another rank's). shared (NULL: none) is the layer's shared experts, the
     * same form, added after the routed sum with weight 1 (at world size > 1 this rank's
     * slice: the all-reduce of y completes it). May be NULL: the model then groups tokens per
     * expert on the host. */
    void (*moe_experts)(float *y, const float *x, int n, int K, const int *idx, const float *wt,
                        const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int e0, int ne,
                        const ds_mlp_w *shared, ds_gemm_impl gemm, bool ue8m0);
    /* Makes the backend's own copy of w (w->dev), once, at load; NULL for backends that read
     * weights in place. DS_ERR_NOMEM names the bytes needed and available. */
    ds_status (*upload_weight)(ds_weight *w);
    /* Ops return void: the first failure any op recorded since the last call
     * (DS_ERR_NOMEM for scratch it could not get, a device error, ...), then
     * cleared; DS_OK if none. NULL: the backend's ops cannot fail. */
    ds_status (*status)(void);
    /* Optional (NULL: not supported): recorded op sequences. The ops queued
     * between graph_begin and graph_end are recorded instead of run and must
     * neither wait nor read host memory (no download, sync, host arguments);
     * graph_end returns the recording, or NULL when it failed (nothing ran:
     * run the ops again). graph_run queues the recorded ops with the pointers
     * and sizes they had, reading whatever the buffers hold then. */
    void (*graph_begin)(void);
    void *(*graph_end)(void);
    void (*graph_run)(void *g);
    void (*graph_free)(void *g);

    /* ---- Optional fusions (NULL: the model runs the unfused sequence). */
    /* For i < n: when r is not NULL, first x[i*xs + j] += r[i*dim + j] (the residual add,
     * x updated in place; y must not alias x then); then
     *   y[(di ? di[i] : i) * ys + j] = x[i*xs + j] / rms(x[i*xs + 0..dim)) * w[j], j < dim
     * (di: distinct rows, e.g. KV-cache rows). With r NULL, y may alias x when ys == xs and di is NULL. */
    void (*rmsnorm_rows)(float *y, int ys, const int *di, float *x, int xs, const float *r, const float *w, int n,
                         int dim, float eps);
    /* For t < n, v < nvec: dst[((di ? di[t] : t) * nvec + v) * ds + j], j < rope, is
     * src[(t * nvec + v) * ss + j] rotated by the angles of position pos[t] as in rope
     * (interleaved pairs); src is not changed. */
    void (*rope_copy)(float *dst, int ds, const int *di, const float *src, int ss, int n, int nvec, int rope,
                      const int *pos, const float *cos_tab, const float *sin_tab);
    /* Absorb attention's steps between the products, for tokens t < n (NULL: rmsnorm_rows
     * and rope_copy twice):
     *   kv[row[t]] = kvx[t][0 .. R) / rms * norm_w (eps); pe[row[t]] = kvx[t][R .. R + rope)
     *   rotated by pos[t]; qp[t*H + h] = q[t][h*qk + nope .. + rope) rotated by pos[t], h < H.
     * kvx rows are R + rope floats; kv, pe and qp rows R, rope and rope. */
    void (*mla_prologue)(float *kv, float *pe, const int *row, const float *kvx, const float *norm_w, float eps,
                         float *qp, const float *q, int n, int H, int qk, int nope, int R, int rope, const int *pos,
                         const float *cos_tab, const float *sin_tab);
    /* Absorb attention whole (NULL, or false returned with nothing queued: the model runs
     * matmul_heads_t, attention and matmul_heads): for tokens t < a->n_tokens, heads h,
     *   q_c = q[t][h*qk .. + nope) @ wkv_b[h*(nope+vdim) .. + nope)        (kv_rank)
     *   o_c = attention(q_c, a->q_pe, a->kv_cache, a->pe_cache) as ops->attention
     *   a->out[t][h*vdim + j] = o_c . wkv_b[h*(nope+vdim) + nope + j], j < vdim.
     * a->q_c is not read; a->pos_bound lets a backend choose its form by the context. */
    bool (*mla_attend)(const ds_attn_args *a, const ds_weight *wkv_b, const float *q, int qk);
    /* The residual norm folded into the products that read it (NULL, or false returned
     * with nothing queued: the model runs rmsnorm_rows, then matmul_many and matmul):
     * matmul_many_normed is matmul_many with every job's x taken as
     *   rmsnorm(h + r) * w (eps), as rmsnorm_rows computes it, not stored (jobs' x unused);
     * h and r are left as they are. matmul_carry is matmul(y, x, n, w, 0, w->rows, ...)
     * that first adds y's old contents to h (h[i] += y[i]). */
    bool (*matmul_many_normed)(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0, const float *h,
                               const float *r, const float *w, float eps);
    bool (*matmul_carry)(float *y, const float *x, int n, const ds_weight *w, ds_gemm_impl gemm, bool ue8m0,
                         float *h);
    /* Prompt tokens per prefill pass that suit the backend (0: the engine's default). */
    int prefill_tokens;
} ds_ops;

/* The CPU backend. simd selects the fast kernels where the CPU has them;
 * false gives the scalar reference everywhere. */
const ds_ops *cpu_backend(bool simd);

#endif
