/* backend.h - the operation table between the model code and the hardware.
 *
 * A backend fills a ds_ops table: the CPU backend (src/backend/cpu/) with a
 * plain scalar reference for every operation and, where the machine allows,
 * faster versions that are tested against it. The model code (src/model/)
 * calls every numeric operation through a ds_backend handle, the table
 * completed with generic versions of the optional ops (fallback.c), and never
 * knows which backend runs it. Activations are float32 buffers obtained from
 * ops->alloc, so a device backend can keep them in its own memory.
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

/* mla_prologue's arguments (mla_prologue_attend). */
typedef struct {
    float *kv, *pe;
    const int *row;
    const float *kvx, *norm_w;
    float eps;
    float *qp;
    const float *q;
    int n, H, qk, nope, R, rope;
    const int *pos;
    const float *cos_tab, *sin_tab;
} ds_mla_pro;

typedef enum { DS_ATTN_ABSORB, DS_ATTN_NAIVE } ds_attn_impl;

/* One MLA layer's attention problem for a set of tokens (model/forward.c has the math). */
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
     * recorded step keeps its bound for every replay (model/exec.c's graph classes). */
    int pos_bound;
    /* Optional (absorb, backends with attn_head_last): head h attends positions
     * 0 .. min(pos[t], head_last[h]) only. fallback.c's expanded attention uses
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

/* A backend fills this table (one file per backend; registry.c lists them).
 * The model never calls it directly: it calls the ds_backend handle below,
 * which backend_complete builds from it, so that every member marked
 * optional here may be left NULL (or, for the three that return bool, may
 * decline a call by returning false with nothing queued) and a generic
 * version made of the required ops runs instead (fallback.c). A backend adds
 * an optional op only where it is faster. */
typedef struct ds_ops {
    const char *name;

    /* ---- memory and data movement, so that no host code touches activations.
     * Pointers named here come from alloc (index arrays included) unless said
     * otherwise; on the CPU that is host memory, on a device backend device memory. */
    void *(*alloc)(size_t bytes);           /* zeroed; NULL on failure */
    /* Optional (generic: alloc): as alloc but the contents are undefined, for a pass's
     * scratch whose every reader finds it written (no fill to queue: a memset between two
     * kernels of a captured CUDA step costs more than most kernels). */
    void *(*alloc_scratch)(size_t bytes);
    void (*free)(void *p);
    /* Host -> alloc'd memory and back. download waits for the work queued before it. */
    void (*upload)(void *dst, const void *host_src, size_t bytes);
    void (*download)(void *host_dst, const void *src, size_t bytes);
    /* Waits until every queued op has finished. */
    void (*sync)(void);
    void (*zero)(void *p, size_t bytes);
    /* Row copy with optional index lists (NULL: identity), for i < n, j < len:
     * dst[(di ? di[i] : i) * dst_stride + j] = src[(si ? si[i] : i) * src_stride + j].
     * Covers column-block gathers and scatters, KV-cache row writes and MoE token
     * gathers. Destination rows must be distinct. */
    void (*copy_rows)(float *dst, int dst_stride, const int *di, const float *src, int src_stride, const int *si,
                      int n, int len);

    /* ---- the math */
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
    /* y[idx[i]][j] += w[i] * x[i][j] for i < n, j < dim; the idx[i] are distinct. */
    void (*add_rows_scaled)(float *y, const int *idx, const float *x, const float *w, int n, int dim);
    /* h[i] = row tok[i] - row0 of emb (F32 or BF16) as float32, or zeros when that
     * row is outside [0, emb->rows) (another rank's vocabulary slice). */
    void (*embed)(float *h, const ds_weight *emb, const int32_t *tok, int n, int row0);
    /* Gate.forward on scores sc (n, E), overwritten: top-k expert indices idx (n, K)
     * and weights wt (n, K), as the reference's Gate (bias steers the choice only). */
    void (*moe_route)(int *idx, float *wt, float *sc, const float *bias, int n, int E, int K, int groups,
                      int limited_groups, bool sigmoid, float route_scale);

    /* ---- optional batched forms (generic: the required ops, as said) */
    /* Independent matmuls with the contract of matmul, run together so that a backend
     * can spread all their rows over its threads at once (generic: matmul per job). */
    void (*matmul_many)(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0);
    /* Products of each head with its own block of rows of w, heads h < H, tokens t < n
     * (x and y rows of H * xs and H * ys floats):
     *   matmul_heads:   y[t][h*ys + r] = sum_c x[t][h*xs + c] W[row0 + h*hstride + r][c], r < rows, c < w->cols
     *   matmul_heads_t: y[t][h*ys + c] = sum_r x[t][h*xs + r] W[row0 + h*hstride + r][c], r < rows, c < w->cols
     * (absorb attention: q_c = q_nope @ wkv_b[h, :nope] and out = o_c @ wkv_b[h, nope:]^T;
     * generic: per head, gather the columns, matmul (exact) or matmul_t, scatter). */
    void (*matmul_heads)(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                         int hstride, int rows);
    void (*matmul_heads_t)(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                           int hstride, int rows);
    /* sc (n, E) = x @ gate^T (E = gate->rows; the exact product, as matmul with
     * DS_GEMM_BF16), then moe_route on sc (generic: those two ops). */
    void (*moe_gate)(int *idx, float *wt, float *sc, const float *x, const ds_weight *gate, const float *bias, int n,
                     int K, int groups, int limited_groups, bool sigmoid, float route_scale);
    /* y (n, dim) = sum_k wt[t][k] * expert idx[t][k](x[t]) + shared(x[t]), expert e =
     * w2(silu(w1 x) * w3 x) with weights ew*[e - e0] for e0 <= e < e0 + ne; other experts
     * count as zero (another rank's). shared (NULL: none) is the layer's shared experts, the
     * same form, added after the routed sum with weight 1 (at world size > 1 this rank's
     * slice: the all-reduce of y completes it). Generic: the tokens of each local expert
     * gathered on the host's index lists, in expert order. */
    void (*moe_experts)(float *y, const float *x, int n, int K, const int *idx, const float *wt,
                        const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int e0, int ne,
                        const ds_mlp_w *shared, ds_gemm_impl gemm, bool ue8m0);

    /* ---- optional fusions (generic: the unfused sequence) */
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
    /* Absorb attention's steps between the products, for tokens t < n (generic:
     * rmsnorm_rows, then rope_copy twice):
     *   kv[row[t]] = kvx[t][0 .. R) / rms * norm_w (eps); pe[row[t]] = kvx[t][R .. R + rope)
     *   rotated by pos[t]; qp[t*H + h] = q[t][h*qk + nope .. + rope) rotated by pos[t], h < H.
     * kvx rows are R + rope floats; kv, pe and qp rows R, rope and rope. */
    void (*mla_prologue)(float *kv, float *pe, const int *row, const float *kvx, const float *norm_w, float eps,
                         float *qp, const float *q, int n, int H, int qk, int nope, int R, int rope, const int *pos,
                         const float *cos_tab, const float *sin_tab);
    /* Absorb attention whole: for tokens t < a->n_tokens, heads h,
     *   q_c = q[t][h*qk .. + nope) @ wkv_b[h*(nope+vdim) .. + nope)        (kv_rank)
     *   o_c = attention(q_c, a->q_pe, a->kv_cache, a->pe_cache) as ops->attention
     *   a->out[t][h*vdim + j] = o_c . wkv_b[h*(nope+vdim) + nope + j], j < vdim.
     * a->q_c is not read; a->pos_bound lets a backend choose its form by the context.
     * False (nothing queued): the generic form runs (matmul_heads_t, attention and
     * matmul_heads; for long contiguous passes where attention takes head_last, the
     * expanded form of fallback.c). */
    bool (*mla_attend)(const ds_attn_args *a, const ds_weight *wkv_b, const float *q, int qk);
    /* mla_prologue (p) then mla_attend (a, wkv_b, p->q, p->qk) as those ops, a's caches and
     * q_pe being p's; p->qp is scratch the backend may leave unwritten. False (nothing
     * queued): the two ops run. */
    bool (*mla_prologue_attend)(const ds_mla_pro *p, const ds_attn_args *a, const ds_weight *wkv_b);
    /* The residual norm folded into the products that read it: matmul_many_normed is
     * matmul_many with every job's x taken as
     *   rmsnorm(h + r) * w (eps), as rmsnorm_rows computes it, not stored (jobs' x unused);
     * h and r are left as they are. matmul_carry is matmul(y, x, n, w, 0, w->rows, ...)
     * that first adds y's old contents to h (h[i] += y[i]). False (nothing queued): the
     * generic forms run (rmsnorm_rows, which adds r to h, then matmul_many; add, then matmul). */
    bool (*matmul_many_normed)(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0, const float *h,
                               const float *r, const float *w, float eps);
    bool (*matmul_carry)(float *y, const float *x, int n, const ds_weight *w, ds_gemm_impl gemm, bool ue8m0,
                         float *h);

    /* ---- optional capabilities: they change how a pass is run or where its result
     * lands, not what it computes, so they have no generic op; the execution layer
     * (model/exec.c, model/load.c) uses them where present. */
    /* NULL: download the rows and pick on the host. For the rows i < n of x (n, V),
     * host_out[i] = the pick that model/sampler.h's sampler_pick_u makes of row i with
     * p[i]'s settings and uniform after p[i]'s penalty (the argmax for a temperature
     * <= 0); p is a host array, NULL for all greedy. x may be changed (the penalised
     * logits). Waits as download does. */
    void (*pick_rows)(int32_t *host_out, float *x, int n, int V, const ds_pick *p);
    /* Makes the backend's own copy of w (w->dev), once, at load; NULL for backends that read
     * weights in place. DS_ERR_NOMEM names the bytes needed and available. */
    ds_status (*upload_weight)(ds_weight *w);
    /* Ops return void: the first failure any op recorded since the last call
     * (DS_ERR_NOMEM for scratch it could not get, a device error, ...), then
     * cleared; DS_OK if none. NULL: the backend's ops cannot fail. */
    ds_status (*status)(void);
    /* NULL: not supported. Recorded op sequences: the ops queued
     * between graph_begin and graph_end are recorded instead of run and must
     * neither wait nor read host memory (no download, sync, host arguments);
     * graph_end returns the recording, or NULL when it failed (nothing ran:
     * run the ops again). graph_run queues the recorded ops with the pointers
     * and sizes they had, reading whatever the buffers hold then. */
    void (*graph_begin)(void);
    void *(*graph_end)(void);
    void (*graph_run)(void *g);
    void (*graph_free)(void *g);
    /* Prompt tokens per prefill pass that suit the backend (0: the engine's default). */
    int prefill_tokens;
} ds_ops;

/* The model's handle on a backend: its table completed by backend_complete
 * (fallback.c). Every op is present and takes the handle first; each is the
 * backend's own where it has one (and does not decline the call), else the
 * generic version built from the required ops. The contracts are ds_ops's,
 * except where said. The generic ops record a failure of their own (scratch
 * they could not get) for status, as a backend's ops do; one handle serves
 * one thread at a time. */
typedef struct ds_backend ds_backend;
struct ds_backend {
    const ds_ops *dev; /* the backend's own table */
    int expand_min;    /* generic mla_attend: the expanded form from this many tokens */
    ds_status err;     /* the first failure of a generic op since status, and its message */
    char err_msg[192];

    void *(*alloc)(ds_backend *b, size_t bytes);
    void *(*alloc_scratch)(ds_backend *b, size_t bytes);
    void (*free)(ds_backend *b, void *p);
    void (*upload)(ds_backend *b, void *dst, const void *host_src, size_t bytes);
    void (*download)(ds_backend *b, void *host_dst, const void *src, size_t bytes);
    void (*sync)(ds_backend *b);
    void (*zero)(ds_backend *b, void *p, size_t bytes);
    void (*copy_rows)(ds_backend *b, float *dst, int dst_stride, const int *di, const float *src, int src_stride,
                      const int *si, int n, int len);
    void (*matmul)(ds_backend *b, float *y, const float *x, int n, const ds_weight *w, int row0, int rows,
                   ds_gemm_impl gemm, bool ue8m0);
    void (*matmul_t)(ds_backend *b, float *y, const float *x, int n, const ds_weight *w, int row0, int rows);
    void (*rmsnorm)(ds_backend *b, float *y, const float *x, const float *w, int n, int dim, float eps);
    void (*rope)(ds_backend *b, float *x, int n, int nvec, int stride, int off, int rope, const int *pos,
                 const float *cos_tab, const float *sin_tab);
    void (*attention)(ds_backend *b, const ds_attn_args *a, ds_attn_impl impl);
    void (*silu_mul)(ds_backend *b, float *a, const float *x, size_t n);
    void (*add)(ds_backend *b, float *y, const float *x, size_t n);
    void (*add_rows_scaled)(ds_backend *b, float *y, const int *idx, const float *x, const float *w, int n, int dim);
    void (*embed)(ds_backend *b, float *h, const ds_weight *emb, const int32_t *tok, int n, int row0);
    void (*moe_route)(ds_backend *b, int *idx, float *wt, float *sc, const float *bias, int n, int E, int K,
                      int groups, int limited_groups, bool sigmoid, float route_scale);
    void (*matmul_many)(ds_backend *b, const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0);
    void (*matmul_heads)(ds_backend *b, float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w,
                         int row0, int hstride, int rows);
    void (*matmul_heads_t)(ds_backend *b, float *y, int ys, const float *x, int xs, int n, int H,
                           const ds_weight *w, int row0, int hstride, int rows);
    void (*moe_gate)(ds_backend *b, int *idx, float *wt, float *sc, const float *x, const ds_weight *gate,
                     const float *bias, int n, int K, int groups, int limited_groups, bool sigmoid,
                     float route_scale);
    void (*moe_experts)(ds_backend *b, float *y, const float *x, int n, int K, const int *idx, const float *wt,
                        const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int e0, int ne,
                        const ds_mlp_w *shared, ds_gemm_impl gemm, bool ue8m0);
    void (*rmsnorm_rows)(ds_backend *b, float *y, int ys, const int *di, float *x, int xs, const float *r,
                         const float *w, int n, int dim, float eps);
    void (*rope_copy)(ds_backend *b, float *dst, int ds, const int *di, const float *src, int ss, int n, int nvec,
                      int rope, const int *pos, const float *cos_tab, const float *sin_tab);
    void (*mla_prologue)(ds_backend *b, float *kv, float *pe, const int *row, const float *kvx,
                         const float *norm_w, float eps, float *qp, const float *q, int n, int H, int qk, int nope,
                         int R, int rope, const int *pos, const float *cos_tab, const float *sin_tab);
    void (*mla_attend)(ds_backend *b, const ds_attn_args *a, const ds_weight *wkv_b, const float *q, int qk);
    void (*mla_prologue_attend)(ds_backend *b, const ds_mla_pro *p, const ds_attn_args *a, const ds_weight *wkv_b);
    /* r may be NULL (nothing to add). Returns whether h += r is still due: true when
     * the backend folded the norm (h untouched; pass h to matmul_carry), false when
     * the sum was made in h (rmsnorm_rows) or r was NULL. jobs' x is not read. */
    bool (*matmul_many_normed)(ds_backend *b, const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0,
                               const float *h, const float *r, const float *w, float eps);
    /* h NULL: matmul(y, x, n, w, 0, w->rows) alone; else h += y's old contents first. */
    void (*matmul_carry)(ds_backend *b, float *y, const float *x, int n, const ds_weight *w, ds_gemm_impl gemm,
                         bool ue8m0, float *h);
    /* The first failure recorded since the last call, the generic ops' or the
     * backend's, then cleared; DS_OK if none. */
    ds_status (*status)(ds_backend *b);
};

/* Fills b from the backend's table dev (kept, not copied: it must outlive b).
 * expand_min: the tokens from which the generic mla_attend runs a contiguous
 * pass in the expanded form (0: 384). */
void backend_complete(ds_backend *b, const ds_ops *dev, int expand_min);

/* The CPU backend. simd selects the fast kernels where the CPU has them
 * (not AMX: cpu_backend_tuned); false gives the scalar reference everywhere. */
const ds_ops *cpu_backend(bool simd);

#endif
