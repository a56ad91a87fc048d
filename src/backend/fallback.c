/* fallback.c - completes a backend's ops table into the model's handle
 * (ds_backend): every optional op a backend leaves NULL, or declines, gets a
 * generic version made of the required ops, so the model has one path.
 *
 * The generic versions run the same sequence of ops the model would run
 * unfused (a backend's fused op must match it within rounding), and read no
 * activation on the host except where said (moe_experts' routing lists), so
 * they work on device memory too. They are tested against the CPU reference's
 * direct ops in tests/backend/test_fallback.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

/* Records the first failure of a generic op for status (ops return void). */
static void fail(ds_backend *b, const char *what, size_t bytes)
{
    if (b->err) return;
    b->err = DS_ERR_NOMEM;
    snprintf(b->err_msg, sizeof b->err_msg, "out of memory: %.1f MiB for %s", bytes / 1048576.0, what);
}

static float *scratch(ds_backend *b, size_t nfloats, const char *what)
{
    float *p = b->alloc_scratch(b, sizeof(float) * nfloats);
    if (!p) fail(b, what, sizeof(float) * nfloats);
    return p;
}

/* ---- the backend's own ops, reached through the handle */

static void *dev_alloc(ds_backend *b, size_t bytes) { return b->dev->alloc(bytes); }
static void *dev_alloc_scratch(ds_backend *b, size_t bytes) { return b->dev->alloc_scratch(bytes); }
static void dev_free(ds_backend *b, void *p) { b->dev->free(p); }
static void dev_upload(ds_backend *b, void *d, const void *s, size_t n) { b->dev->upload(d, s, n); }
static void dev_download(ds_backend *b, void *d, const void *s, size_t n) { b->dev->download(d, s, n); }
static void dev_sync(ds_backend *b) { b->dev->sync(); }
static void dev_zero(ds_backend *b, void *p, size_t n) { b->dev->zero(p, n); }

static void dev_copy_rows(ds_backend *b, float *dst, int dst_stride, const int *di, const float *src, int src_stride,
                          const int *si, int n, int len)
{
    b->dev->copy_rows(dst, dst_stride, di, src, src_stride, si, n, len);
}

static void dev_matmul(ds_backend *b, float *y, const float *x, int n, const ds_weight *w, int row0, int rows,
                       ds_gemm_impl gemm, bool ue8m0)
{
    b->dev->matmul(y, x, n, w, row0, rows, gemm, ue8m0);
}

static void dev_matmul_t(ds_backend *b, float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    b->dev->matmul_t(y, x, n, w, row0, rows);
}

static void dev_rmsnorm(ds_backend *b, float *y, const float *x, const float *w, int n, int dim, float eps)
{
    b->dev->rmsnorm(y, x, w, n, dim, eps);
}

static void dev_rope(ds_backend *b, float *x, int n, int nvec, int stride, int off, int rope, const int *pos,
                     const float *cos_tab, const float *sin_tab)
{
    b->dev->rope(x, n, nvec, stride, off, rope, pos, cos_tab, sin_tab);
}

static void dev_attention(ds_backend *b, const ds_attn_args *a, ds_attn_impl impl) { b->dev->attention(a, impl); }
static void dev_silu_mul(ds_backend *b, float *a, const float *x, size_t n) { b->dev->silu_mul(a, x, n); }
static void dev_add(ds_backend *b, float *y, const float *x, size_t n) { b->dev->add(y, x, n); }

static void dev_add_rows_scaled(ds_backend *b, float *y, const int *idx, const float *x, const float *w, int n, int dim)
{
    b->dev->add_rows_scaled(y, idx, x, w, n, dim);
}

static void dev_embed(ds_backend *b, float *h, const ds_weight *emb, const int32_t *tok, int n, int row0)
{
    b->dev->embed(h, emb, tok, n, row0);
}

static void dev_moe_route(ds_backend *b, int *idx, float *wt, float *sc, const float *bias, int n, int E, int K,
                          int groups, int limited_groups, bool sigmoid, float route_scale)
{
    b->dev->moe_route(idx, wt, sc, bias, n, E, K, groups, limited_groups, sigmoid, route_scale);
}

static void dev_matmul_many(ds_backend *b, const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0)
{
    b->dev->matmul_many(jobs, n_jobs, gemm, ue8m0);
}

static void dev_matmul_heads(ds_backend *b, float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w,
                             int row0, int hstride, int rows)
{
    b->dev->matmul_heads(y, ys, x, xs, n, H, w, row0, hstride, rows);
}

static void dev_matmul_heads_t(ds_backend *b, float *y, int ys, const float *x, int xs, int n, int H,
                               const ds_weight *w, int row0, int hstride, int rows)
{
    b->dev->matmul_heads_t(y, ys, x, xs, n, H, w, row0, hstride, rows);
}

static void dev_moe_gate(ds_backend *b, int *idx, float *wt, float *sc, const float *x, const ds_weight *gate,
                         const float *bias, int n, int K, int groups, int limited_groups, bool sigmoid,
                         float route_scale)
{
    b->dev->moe_gate(idx, wt, sc, x, gate, bias, n, K, groups, limited_groups, sigmoid, route_scale);
}

static void dev_moe_experts(ds_backend *b, float *y, const float *x, int n, int K, const int *idx, const float *wt,
                            const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int e0, int ne,
                            const ds_mlp_w *shared, ds_gemm_impl gemm, bool ue8m0)
{
    b->dev->moe_experts(y, x, n, K, idx, wt, ew1, ew2, ew3, e0, ne, shared, gemm, ue8m0);
}

static void dev_rmsnorm_rows(ds_backend *b, float *y, int ys, const int *di, float *x, int xs, const float *r,
                             const float *w, int n, int dim, float eps)
{
    b->dev->rmsnorm_rows(y, ys, di, x, xs, r, w, n, dim, eps);
}

static void dev_rope_copy(ds_backend *b, float *dst, int ds, const int *di, const float *src, int ss, int n, int nvec,
                          int rope, const int *pos, const float *cos_tab, const float *sin_tab)
{
    b->dev->rope_copy(dst, ds, di, src, ss, n, nvec, rope, pos, cos_tab, sin_tab);
}

static void dev_mla_prologue(ds_backend *b, float *kv, float *pe, const int *row, const float *kvx,
                             const float *norm_w, float eps, float *qp, const float *q, int n, int H, int qk, int nope,
                             int R, int rope, const int *pos, const float *cos_tab, const float *sin_tab)
{
    b->dev->mla_prologue(kv, pe, row, kvx, norm_w, eps, qp, q, n, H, qk, nope, R, rope, pos, cos_tab, sin_tab);
}

/* ---- generic versions */

static void *gen_alloc_scratch(ds_backend *b, size_t bytes) { return b->dev->alloc(bytes); }

static void gen_matmul_many(ds_backend *b, const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0)
{
    for (int j = 0; j < n_jobs; j++)
        b->matmul(b, jobs[j].y, jobs[j].x, jobs[j].n, jobs[j].w, jobs[j].row0, jobs[j].rows, gemm, ue8m0);
}

/* Per head: its x columns gathered, the product with its rows of w (exact), the
 * result scattered into its y columns. */
static void gen_matmul_heads(ds_backend *b, float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w,
                             int row0, int hstride, int rows)
{
    int k = w->cols;
    float *t1 = scratch(b, (size_t)n * k, "matmul_heads"), *t2 = scratch(b, (size_t)n * rows, "matmul_heads");
    for (int h = 0; t1 && t2 && h < H; h++) {
        b->copy_rows(b, t1, k, NULL, x + (size_t)h * xs, H * xs, NULL, n, k);
        b->matmul(b, t2, t1, n, w, row0 + h * hstride, rows, DS_GEMM_BF16, false);
        b->copy_rows(b, y + (size_t)h * ys, H * ys, NULL, t2, rows, NULL, n, rows);
    }
    b->free(b, t1);
    b->free(b, t2);
}

static void gen_matmul_heads_t(ds_backend *b, float *y, int ys, const float *x, int xs, int n, int H,
                               const ds_weight *w, int row0, int hstride, int rows)
{
    int c = w->cols;
    float *t1 = scratch(b, (size_t)n * rows, "matmul_heads_t"), *t2 = scratch(b, (size_t)n * c, "matmul_heads_t");
    for (int h = 0; t1 && t2 && h < H; h++) {
        b->copy_rows(b, t1, rows, NULL, x + (size_t)h * xs, H * xs, NULL, n, rows);
        b->matmul_t(b, t2, t1, n, w, row0 + h * hstride, rows);
        b->copy_rows(b, y + (size_t)h * ys, H * ys, NULL, t2, c, NULL, n, c);
    }
    b->free(b, t1);
    b->free(b, t2);
}

static void gen_moe_gate(ds_backend *b, int *idx, float *wt, float *sc, const float *x, const ds_weight *gate,
                         const float *bias, int n, int K, int groups, int limited_groups, bool sigmoid,
                         float route_scale)
{
    b->matmul(b, sc, x, n, gate, 0, gate->rows, DS_GEMM_BF16, false);
    b->moe_route(b, idx, wt, sc, bias, n, gate->rows, K, groups, limited_groups, sigmoid, route_scale);
}

/* ys = w2(silu(w1 x) * w3 x) for n rows; a and g hold n * w1->rows floats. */
static void mlp(ds_backend *b, float *ys, const float *x, int n, const ds_weight *w1, const ds_weight *w2,
                const ds_weight *w3, float *a, float *g, ds_gemm_impl gemm, bool ue8m0)
{
    int inter = w1->rows;
    ds_matmul_job jobs[2] = {{a, x, n, w1, 0, inter}, {g, x, n, w3, 0, inter}};
    b->matmul_many(b, jobs, 2, gemm, ue8m0);
    b->silu_mul(b, a, g, (size_t)n * inter);
    b->matmul(b, ys, a, n, w2, 0, w2->rows, gemm, ue8m0);
}

/* The routing read on the host: for each local expert, in expert order, the list
 * of its tokens and their weights (uploaded once); per expert the tokens' rows are
 * gathered, run through it and added back scaled. */
static void gen_moe_experts(ds_backend *b, float *y, const float *x, int n, int K, const int *idx, const float *wt,
                            const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int e0, int ne,
                            const ds_mlp_w *shared, ds_gemm_impl gemm, bool ue8m0)
{
    const ds_weight *w1 = ne > 0 ? &ew1[0] : shared ? shared->w1 : NULL;
    if (!w1) return;
    int dim = w1->cols, inter = ne > 0 ? w1->rows : 0;
    if (shared && shared->w1->rows > inter) inter = shared->w1->rows;
    size_t nk = (size_t)n * K;
    int *hidx = malloc(sizeof(int) * nk), *list = malloc(sizeof(int) * nk), *start = malloc(sizeof(int) * (ne + 1));
    float *hwt = malloc(sizeof(float) * nk), *lw = malloc(sizeof(float) * nk);
    int *dlist = b->alloc(b, sizeof(int) * nk);
    float *dlw = b->alloc(b, sizeof(float) * nk), *xs = scratch(b, (size_t)n * dim, "expert activations");
    float *ys = scratch(b, (size_t)n * dim, "expert activations");
    float *a = scratch(b, (size_t)n * inter, "expert activations");
    float *g = scratch(b, (size_t)n * inter, "expert activations");
    if (!hidx || !list || !start || !hwt || !lw || !dlist || !dlw || !xs || !ys || !a || !g) {
        fail(b, "expert routing lists", sizeof(int) * nk * 4);
        goto done;
    }
    b->download(b, hidx, idx, sizeof(int) * nk);
    b->download(b, hwt, wt, sizeof(float) * nk);
    int cnt = 0;
    for (int e = 0; e < ne; e++) {
        start[e] = cnt;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (hidx[(size_t)t * K + k] == e0 + e) {
                    list[cnt] = t;
                    lw[cnt++] = hwt[(size_t)t * K + k];
                }
    }
    start[ne] = cnt;
    b->upload(b, dlist, list, sizeof(int) * (size_t)cnt);
    b->upload(b, dlw, lw, sizeof(float) * (size_t)cnt);
    b->zero(b, y, sizeof(float) * (size_t)n * dim);
    for (int e = 0; e < ne; e++) {
        int c = start[e + 1] - start[e];
        if (!c) continue;
        b->copy_rows(b, xs, dim, NULL, x, dim, dlist + start[e], c, dim);
        mlp(b, ys, xs, c, &ew1[e], &ew2[e], &ew3[e], a, g, gemm, ue8m0);
        b->add_rows_scaled(b, y, dlist + start[e], ys, dlw + start[e], c, dim);
    }
    if (shared) {
        mlp(b, ys, x, n, shared->w1, shared->w2, shared->w3, a, g, gemm, ue8m0);
        b->add(b, y, ys, (size_t)n * dim);
    }
    b->sync(b); /* the host lists were read by the uploads before they are freed */
done:
    free(hidx);
    free(list);
    free(start);
    free(hwt);
    free(lw);
    b->free(b, dlist);
    b->free(b, dlw);
    b->free(b, xs);
    b->free(b, ys);
    b->free(b, a);
    b->free(b, g);
}

/* The residual add (row by row where x is strided), then the norm; through a
 * contiguous copy where y is strided or scattered. */
static void gen_rmsnorm_rows(ds_backend *b, float *y, int ys, const int *di, float *x, int xs, const float *r,
                             const float *w, int n, int dim, float eps)
{
    if (r && xs == dim) b->add(b, x, r, (size_t)n * dim);
    for (int i = 0; r && xs != dim && i < n; i++) b->add(b, x + (size_t)i * xs, r + (size_t)i * dim, (size_t)dim);
    if (!di && ys == dim && xs == dim) {
        b->rmsnorm(b, y, x, w, n, dim, eps);
        return;
    }
    float *t = scratch(b, (size_t)n * dim, "rmsnorm_rows");
    if (!t) return;
    b->copy_rows(b, t, dim, NULL, x, xs, NULL, n, dim);
    b->rmsnorm(b, t, t, w, n, dim, eps);
    b->copy_rows(b, y, ys, di, t, dim, NULL, n, dim);
    b->free(b, t);
}

/* The blocks copied into a contiguous (n, nvec, rope) buffer, rotated there, and
 * copied to their rows (one copy per vector where the rows are scattered). */
static void gen_rope_copy(ds_backend *b, float *dst, int ds, const int *di, const float *src, int ss, int n, int nvec,
                          int rope, const int *pos, const float *cos_tab, const float *sin_tab)
{
    int nv = n * nvec;
    float *t = scratch(b, (size_t)nv * rope, "rope_copy");
    if (!t) return;
    b->copy_rows(b, t, rope, NULL, src, ss, NULL, nv, rope);
    b->rope(b, t, n, nvec, rope, 0, rope, pos, cos_tab, sin_tab);
    if (!di) b->copy_rows(b, dst, ds, NULL, t, rope, NULL, nv, rope);
    for (int v = 0; di && v < nvec; v++)
        b->copy_rows(b, dst + (size_t)v * ds, nvec * ds, di, t + (size_t)v * rope, nvec * rope, NULL, n, rope);
    b->free(b, t);
}

static void gen_mla_prologue(ds_backend *b, float *kv, float *pe, const int *row, const float *kvx,
                             const float *norm_w, float eps, float *qp, const float *q, int n, int H, int qk, int nope,
                             int R, int rope, const int *pos, const float *cos_tab, const float *sin_tab)
{
    b->rmsnorm_rows(b, kv, R, row, (float *)kvx, R + rope, NULL, norm_w, n, R, eps); /* x is written only with r */
    b->rope_copy(b, pe, rope, row, kvx + R, R + rope, n, 1, rope, pos, cos_tab, sin_tab);
    b->rope_copy(b, qp, rope, NULL, q + nope, qk, n, H, rope, pos, cos_tab, sin_tab);
}

/* Absorb attention of a long prefill pass in the expanded (MHA) form, for
 * backends whose attention takes per-head limits (ds_ops.attn_head_last). Per
 * head: [k_nope | v] of every position of the pass's sequence so far
 * (0 .. pos0 + n - 1) from the latent cache with wkv_b, then the absorb kernel
 * with the pass's tokens as its heads: scores of q_nope against the rows'
 * k_nope columns plus the shared rotated k_pe, token i limited to position
 * pos0 + i, and the output from the rows' v columns. Per token, position and
 * head that is nope + rope + vd products (320 at V3's shapes) where the absorb
 * form takes 2 kv_rank + rope (1088), plus kv_rank x (nope + vd) a position
 * and head to expand once a pass.
 *   The expansion costs about what the products save on a pass of ~256 tokens
 * (8-layer 16B shapes, Zen 4, pp at depth 4096, expanded / absorb: 64 tokens
 * 44 / 58 tok/s, 128 55 / 69, 256 75-76 / 74-79, 512 102 / 82), hence
 * EXPAND_MIN. wkv_b is dequantised exactly, as in the absorb form (no act_quant
 * of the latent under --gemm-impl fp8). */
#define EXPAND_MIN 384    /* tokens in a pass from which it pays (above) */
#define EXPAND_TOKENS 64  /* tokens an attention call takes as its heads */
#define EXPAND_BYTES ((size_t)64 << 20) /* the expanded rows of a group of heads */
#define EXPAND_GROUP 16   /* heads expanded at once, at most */

static void mla_expanded(ds_backend *b, const ds_attn_args *a, const ds_weight *wkv_b, const float *q, int qk)
{
    int n = a->n_tokens, H = a->n_heads, nope = a->nope, rope = a->rope, vd = a->vdim, R = a->kv_rank;
    int W = nope + vd, P = a->pos0 + n, chunks = (n + EXPAND_TOKENS - 1) / EXPAND_TOKENS;
    size_t per_head = sizeof(float) * (size_t)P * W;
    int G = EXPAND_BYTES / per_head < 1 ? 1 : (int)(EXPAND_BYTES / per_head);
    if (G > H) G = H;
    if (G > EXPAND_GROUP) G = EXPAND_GROUP;
    /* per chunk: its sequence (0 in the view below) and last position; per token its limit */
    size_t ni = (size_t)(2 * chunks + n);
    int *ints = malloc(sizeof(int) * ni), *dints = b->alloc(b, sizeof(int) * ni);
    float *e = scratch(b, (size_t)G * P * W, "expanded attention");
    float *qv = b->alloc(b, sizeof(float) * (size_t)n * W); /* zeroed: the v columns stay 0 */
    float *qpv = scratch(b, (size_t)n * rope, "expanded attention");
    float *o = scratch(b, (size_t)EXPAND_TOKENS * vd, "expanded attention");
    if (!ints || !dints || !e || !qv || !qpv || !o) {
        fail(b, "expanded attention", sizeof(float) * (size_t)G * P * W);
        goto done;
    }
    for (int c = 0; c < chunks; c++) {
        int t0 = c * EXPAND_TOKENS, T = n - t0 < EXPAND_TOKENS ? n - t0 : EXPAND_TOKENS;
        ints[2 * c] = 0;
        ints[2 * c + 1] = a->pos0 + t0 + T - 1;
    }
    for (int i = 0; i < n; i++) ints[2 * chunks + i] = a->pos0 + i;
    b->upload(b, dints, ints, sizeof(int) * ni);
    const float *lat = a->kv_cache + (size_t)a->seq0 * a->ctx * R;
    const float *pe = a->pe_cache + (size_t)a->seq0 * a->ctx * rope;
    for (int h0 = 0; h0 < H; h0 += G) {
        int g = H - h0 < G ? H - h0 : G;
        ds_matmul_job jobs[EXPAND_GROUP];
        for (int k = 0; k < g; k++) jobs[k] = (ds_matmul_job){e + (size_t)k * P * W, lat, P, wkv_b, (h0 + k) * W, W};
        b->matmul_many(b, jobs, g, DS_GEMM_BF16, false);
        for (int k = 0; k < g; k++) {
            int h = h0 + k;
            /* q rows as long as the cache rows; the kernel reads their nope */
            b->copy_rows(b, qv, W, NULL, q + (size_t)h * qk, H * qk, NULL, n, nope);
            b->copy_rows(b, qpv, rope, NULL, a->q_pe + (size_t)h * rope, H * rope, NULL, n, rope);
            for (int c = 0; c < chunks; c++) {
                int t0 = c * EXPAND_TOKENS, T = n - t0 < EXPAND_TOKENS ? n - t0 : EXPAND_TOKENS;
                ds_attn_args x = {
                    .n_tokens = 1, .seq = dints + 2 * c, .pos = dints + 2 * c + 1, .n_heads = T, .nope = nope,
                    .rope = rope, .vdim = vd, .kv_rank = W, .softmax_scale = a->softmax_scale,
                    .q_c = qv + (size_t)t0 * W, .q_pe = qpv + (size_t)t0 * rope, .kv_cache = e + (size_t)k * P * W,
                    .pe_cache = pe, .ctx = P, .out = o, .head_last = dints + 2 * chunks + t0, .key_dims = nope,
                    .val_off = nope,
                };
                b->attention(b, &x, DS_ATTN_ABSORB);
                b->copy_rows(b, a->out + ((size_t)t0 * H + h) * vd, H * vd, NULL, o, vd, NULL, T, vd);
            }
        }
    }
    b->sync(b); /* the host limits were read by the upload before they are freed */
done:
    free(ints);
    b->free(b, dints);
    b->free(b, e);
    b->free(b, qv);
    b->free(b, qpv);
    b->free(b, o);
}

/* The backend's op where it takes the call; else the expanded form for a long
 * prefill pass where attention takes head limits; else q_c = q_nope wkv_b[:nope],
 * attention in the latent space, out = o_c wkv_b[nope:]^T. */
static void gen_mla_attend(ds_backend *b, const ds_attn_args *a, const ds_weight *wkv_b, const float *q, int qk)
{
    if (b->dev->mla_attend && b->dev->mla_attend(a, wkv_b, q, qk)) return;
    if (b->dev->attn_head_last && a->contiguous && a->n_tokens >= b->expand_min) {
        mla_expanded(b, a, wkv_b, q, qk);
        return;
    }
    int n = a->n_tokens, H = a->n_heads, R = a->kv_rank, nope = a->nope, vd = a->vdim;
    float *qc = scratch(b, (size_t)n * H * R, "attention"), *oc = scratch(b, (size_t)n * H * R, "attention");
    if (qc && oc) {
        b->matmul_heads_t(b, qc, R, q, qk, n, H, wkv_b, 0, nope + vd, nope);
        ds_attn_args x = *a;
        x.q_c = qc;
        x.out = oc;
        b->attention(b, &x, DS_ATTN_ABSORB);
        b->matmul_heads(b, a->out, vd, oc, R, n, H, wkv_b, nope, nope + vd, vd);
    }
    b->free(b, qc);
    b->free(b, oc);
}

static bool gen_matmul_many_normed(ds_backend *b, const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0,
                                   const float *h, const float *r, const float *w, float eps)
{
    if (r && b->dev->matmul_many_normed && b->dev->matmul_many_normed(jobs, n_jobs, gemm, ue8m0, h, r, w, eps))
        return true;
    int n = jobs[0].n, dim = jobs[0].w->cols;
    float *x = scratch(b, (size_t)n * dim, "the normed products");
    ds_matmul_job *js = malloc(sizeof *js * (size_t)n_jobs);
    if (x && js) {
        if (r) b->rmsnorm_rows(b, x, dim, NULL, (float *)h, dim, r, w, n, dim, eps); /* h += r, as documented */
        else b->rmsnorm(b, x, h, w, n, dim, eps);
        for (int j = 0; j < n_jobs; j++) {
            js[j] = jobs[j];
            js[j].x = x;
        }
        b->matmul_many(b, js, n_jobs, gemm, ue8m0);
    } else if (x) {
        fail(b, "the normed products", sizeof *js * (size_t)n_jobs);
    }
    free(js);
    b->free(b, x);
    return false;
}

static void gen_matmul_carry(ds_backend *b, float *y, const float *x, int n, const ds_weight *w, ds_gemm_impl gemm,
                             bool ue8m0, float *h)
{
    if (h && b->dev->matmul_carry && b->dev->matmul_carry(y, x, n, w, gemm, ue8m0, h)) return;
    if (h) b->add(b, h, y, (size_t)n * w->rows);
    b->matmul(b, y, x, n, w, 0, w->rows, gemm, ue8m0);
}

static void gen_mla_prologue_attend(ds_backend *b, const ds_mla_pro *p, const ds_attn_args *a,
                                    const ds_weight *wkv_b)
{
    if (b->dev->mla_prologue_attend && b->dev->mla_prologue_attend(p, a, wkv_b)) return;
    b->mla_prologue(b, p->kv, p->pe, p->row, p->kvx, p->norm_w, p->eps, p->qp, p->q, p->n, p->H, p->qk, p->nope,
                    p->R, p->rope, p->pos, p->cos_tab, p->sin_tab);
    b->mla_attend(b, a, wkv_b, p->q, p->qk);
}

static ds_status gen_status(ds_backend *b)
{
    ds_status d = b->dev->status ? b->dev->status() : DS_OK, s = b->err;
    b->err = DS_OK;
    return s ? ds_errorf(s, "%s", b->err_msg) : d;
}

void backend_complete(ds_backend *b, const ds_ops *dev, int expand_min)
{
    *b = (ds_backend){
        .dev = dev,
        .expand_min = expand_min > 0 ? expand_min : EXPAND_MIN,
        .alloc = dev_alloc,
        .alloc_scratch = dev->alloc_scratch ? dev_alloc_scratch : gen_alloc_scratch,
        .free = dev_free,
        .upload = dev_upload,
        .download = dev_download,
        .sync = dev_sync,
        .zero = dev_zero,
        .copy_rows = dev_copy_rows,
        .matmul = dev_matmul,
        .matmul_t = dev_matmul_t,
        .rmsnorm = dev_rmsnorm,
        .rope = dev_rope,
        .attention = dev_attention,
        .silu_mul = dev_silu_mul,
        .add = dev_add,
        .add_rows_scaled = dev_add_rows_scaled,
        .embed = dev_embed,
        .moe_route = dev_moe_route,
        .matmul_many = dev->matmul_many ? dev_matmul_many : gen_matmul_many,
        .matmul_heads = dev->matmul_heads ? dev_matmul_heads : gen_matmul_heads,
        .matmul_heads_t = dev->matmul_heads_t ? dev_matmul_heads_t : gen_matmul_heads_t,
        .moe_gate = dev->moe_gate ? dev_moe_gate : gen_moe_gate,
        .moe_experts = dev->moe_experts ? dev_moe_experts : gen_moe_experts,
        .rmsnorm_rows = dev->rmsnorm_rows ? dev_rmsnorm_rows : gen_rmsnorm_rows,
        .rope_copy = dev->rope_copy ? dev_rope_copy : gen_rope_copy,
        .mla_prologue = dev->mla_prologue ? dev_mla_prologue : gen_mla_prologue,
        /* the four a backend may decline call it first */
        .mla_attend = gen_mla_attend,
        .matmul_many_normed = gen_matmul_many_normed,
        .matmul_carry = gen_matmul_carry,
        .mla_prologue_attend = gen_mla_prologue_attend,
        .status = gen_status,
    };
}
