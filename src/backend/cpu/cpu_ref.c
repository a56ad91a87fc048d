/* cpu_ref.c - the CPU backend's scalar reference operations.
 *
 * Plain loops in float32, parallel over independent outputs with OpenMP. These
 * are the definition every faster kernel (and every other backend) is tested
 * against; they favour clarity, with just enough blocking to be usable. */
#include "cpu_ref.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/quant.h"
#include "base/numeric.h"

static pthread_mutex_t g_fail_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_failed;
static char g_fail_msg[256];

void cpu_fail_oom(const char *what, size_t bytes)
{
    pthread_mutex_lock(&g_fail_mu);
    if (!g_failed)
        snprintf(g_fail_msg, sizeof g_fail_msg, "out of memory: the CPU backend could not allocate %.1f MiB for %s",
                 bytes / 1048576.0, what);
    g_failed = 1;
    pthread_mutex_unlock(&g_fail_mu);
}

ds_status cpu_status(void)
{
    pthread_mutex_lock(&g_fail_mu);
    ds_status s = g_failed ? ds_errorf(DS_ERR_NOMEM, "%s", g_fail_msg) : DS_OK;
    g_failed = 0;
    pthread_mutex_unlock(&g_fail_mu);
    return s;
}

void *cpu_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) return NULL;
    memset(p, 0, bytes);
    return p;
}

void cpu_free(void *p) { free(p); }

void cpu_dequant_row(const ds_weight *w, int r, float *out)
{
    size_t off = (size_t)r * w->cols;
    switch (w->fmt) {
    case DS_W_F32:
        memcpy(out, (const float *)w->data + off, sizeof(float) * (size_t)w->cols);
        break;
    case DS_W_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + off;
        for (int c = 0; c < w->cols; c++) out[c] = bf16_to_f32(p[c]);
        break;
    }
    case DS_W_FP8: {
        const uint8_t *p = (const uint8_t *)w->data + off;
        const float *t = fp8_e4m3_table();
        int cb = (w->cols + DS_BLOCK - 1) / DS_BLOCK;
        const float *s = w->scale + (size_t)(r / DS_BLOCK) * cb;
        for (int c = 0; c < w->cols; c++) out[c] = t[p[c]] * s[c / DS_BLOCK];
        break;
    }
    }
}

static float dot_ref(const float *a, const float *b, int n)
{
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (; i < n; i++) s += a[i] * b[i];
    return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* FP8 GEMM path: activations quantised per 128-block, products per block. */
static void matmul_fp8_ref(float *y, const float *x, int n, const ds_weight *w, int row0, int rows, bool ue8m0)
{
    int k = w->cols, kb = (k + DS_BLOCK - 1) / DS_BLOCK;
    uint8_t *xq = malloc((size_t)n * k);
    float *xs = malloc(sizeof(float) * (size_t)n * kb);
    float *xf = malloc(sizeof(float) * (size_t)n * k);
    if (!xq || !xs || !xf) {
        cpu_fail_oom("FP8 GEMM activations", (size_t)n * k * 5);
        free(xq);
        free(xs);
        free(xf);
        return;
    }
    act_quant_ref(x, n, k, xq, xs, ue8m0);
    const float *t = fp8_e4m3_table();
    for (size_t i = 0; i < (size_t)n * k; i++) xf[i] = t[xq[i]];
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)(row0 + r) * k;
        const float *ws = w->scale + (size_t)((row0 + r) / DS_BLOCK) * kb;
        float wf[DS_BLOCK];
        for (int i = 0; i < n; i++) {
            float acc = 0;
            for (int b = 0; b < kb; b++) {
                int k0 = b * DS_BLOCK, len = k - k0 < DS_BLOCK ? k - k0 : DS_BLOCK;
                for (int j = 0; j < len; j++) wf[j] = t[wr[k0 + j]];
                acc += dot_ref(xf + (size_t)i * k + k0, wf, len) * xs[(size_t)i * kb + b] * ws[b];
            }
            y[(size_t)i * rows + r] = acc;
        }
    }
    free(xq);
    free(xs);
    free(xf);
}

static void matmul_ref(float *y, const float *x, int n, const ds_weight *w, int row0, int rows,
                       ds_gemm_impl gemm, bool ue8m0)
{
    if (gemm == DS_GEMM_FP8 && w->fmt == DS_W_FP8) {
        matmul_fp8_ref(y, x, n, w, row0, rows, ue8m0);
        return;
    }
    int k = w->cols;
    #pragma omp parallel
    {
        float *row = malloc(sizeof(float) * (size_t)k);
        if (!row) cpu_fail_oom("a weight row", sizeof(float) * (size_t)k);
        #pragma omp for schedule(static)
        for (int r = 0; r < rows; r++) {
            if (!row) continue;
            cpu_dequant_row(w, row0 + r, row);
            for (int i = 0; i < n; i++) y[(size_t)i * rows + r] = dot_ref(x + (size_t)i * k, row, k);
        }
        free(row);
    }
}

static void matmul_t_ref(float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    int c = w->cols;
    float *row = malloc(sizeof(float) * (size_t)c);
    if (!row) {
        cpu_fail_oom("a weight row", sizeof(float) * (size_t)w->cols);
        return;
    }
    memset(y, 0, sizeof(float) * (size_t)n * c);
    for (int r = 0; r < rows; r++) {
        cpu_dequant_row(w, row0 + r, row);
        for (int i = 0; i < n; i++) {
            float xv = x[(size_t)i * rows + r];
            float *yi = y + (size_t)i * c;
            for (int j = 0; j < c; j++) yi[j] += xv * row[j];
        }
    }
    free(row);
}

static void rmsnorm_ref(float *y, const float *x, const float *w, int n, int dim, float eps)
{
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float *yi = y + (size_t)i * dim;
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / dim + eps));
        for (int j = 0; j < dim; j++) yi[j] = xi[j] * r * w[j];
    }
}

static void rope_ref(float *x, int n, int nvec, int stride, int off, int rope, const int *pos,
                     const float *cos_tab, const float *sin_tab)
{
    int half = rope / 2;
    for (int t = 0; t < n; t++) {
        const float *c = cos_tab + (size_t)pos[t] * half, *s = sin_tab + (size_t)pos[t] * half;
        for (int v = 0; v < nvec; v++) {
            float *p = x + ((size_t)t * nvec + v) * stride + off;
            for (int i = 0; i < half; i++) {
                float a = p[2 * i], b = p[2 * i + 1];
                p[2 * i] = a * c[i] - b * s[i];
                p[2 * i + 1] = a * s[i] + b * c[i];
            }
        }
    }
}

/* softmax over scores[0..len) in place */
static void softmax_ref(float *sc, int len)
{
    float mx = -INFINITY;
    for (int j = 0; j < len; j++) mx = fmaxf(mx, sc[j]);
    float sum = 0;
    for (int j = 0; j < len; j++) sum += (sc[j] = expf(sc[j] - mx));
    for (int j = 0; j < len; j++) sc[j] /= sum;
}

/* Causal attention for each (token, head): token t attends to positions
 * 0..pos[t] of its own sequence's cache. */
static void attention_ref(const ds_attn_args *a, ds_attn_impl impl)
{
    int H = a->n_heads, total = a->n_tokens * H;
    #pragma omp parallel
    {
        float *sc = malloc(sizeof(float) * (size_t)a->ctx);
        if (!sc) cpu_fail_oom("attention scores", sizeof(float) * (size_t)a->ctx);
        #pragma omp for schedule(dynamic, 1)
        for (int th = 0; th < total; th++) {
            if (!sc) continue;
            int t = th / H, h = th % H, len = a->pos[t] + 1, s = a->seq[t];
            if (impl == DS_ATTN_ABSORB && a->head_last && a->head_last[h] + 1 < len) len = a->head_last[h] + 1;
            if (impl == DS_ATTN_ABSORB) {
                int R = a->kv_rank, Rk = a->key_dims ? a->key_dims : R, Ro = R - a->val_off;
                const float *qc = a->q_c + ((size_t)t * H + h) * R;
                const float *qp = a->q_pe + ((size_t)t * H + h) * a->rope;
                const float *kv = a->kv_cache + (size_t)s * a->ctx * R;
                const float *pe = a->pe_cache + (size_t)s * a->ctx * a->rope;
                for (int j = 0; j < len; j++)
                    sc[j] = (dot_ref(qc, kv + (size_t)j * R, Rk) + dot_ref(qp, pe + (size_t)j * a->rope, a->rope)) *
                            a->softmax_scale;
                softmax_ref(sc, len);
                float *o = a->out + ((size_t)t * H + h) * Ro;
                memset(o, 0, sizeof(float) * (size_t)Ro);
                for (int j = 0; j < len; j++)
                    for (int c = 0; c < Ro; c++) o[c] += sc[j] * kv[(size_t)j * R + a->val_off + c];
            } else {
                int qk = a->nope + a->rope;
                const float *q = a->q + ((size_t)t * H + h) * qk;
                const float *kc = a->k_cache + (size_t)s * a->ctx * H * qk;
                const float *vc = a->v_cache + (size_t)s * a->ctx * H * a->vdim;
                for (int j = 0; j < len; j++)
                    sc[j] = dot_ref(q, kc + ((size_t)j * H + h) * qk, qk) * a->softmax_scale;
                softmax_ref(sc, len);
                float *o = a->out + ((size_t)t * H + h) * a->vdim;
                memset(o, 0, sizeof(float) * (size_t)a->vdim);
                for (int j = 0; j < len; j++)
                    for (int c = 0; c < a->vdim; c++) o[c] += sc[j] * vc[((size_t)j * H + h) * a->vdim + c];
            }
        }
        free(sc);
    }
}

static void silu_mul_ref(float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

static void add_ref(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

/* ---- data movement: on the CPU, alloc'd memory is host memory */

static void upload_ref(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void download_ref(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void sync_ref(void) {}
static void zero_ref(void *p, size_t bytes) { memset(p, 0, bytes); }

static void copy_rows_ref(float *dst, int dst_stride, const int *di, const float *src, int src_stride, const int *si,
                          int n, int len)
{
    for (int i = 0; i < n; i++)
        memmove(dst + (size_t)(di ? di[i] : i) * dst_stride, src + (size_t)(si ? si[i] : i) * src_stride,
                sizeof(float) * (size_t)len);
}

static void add_rows_scaled_ref(float *y, const int *idx, const float *x, const float *w, int n, int dim)
{
    for (int i = 0; i < n; i++) {
        float *yi = y + (size_t)idx[i] * dim;
        const float *xi = x + (size_t)i * dim;
        for (int j = 0; j < dim; j++) yi[j] += w[i] * xi[j];
    }
}

static void embed_ref(float *h, const ds_weight *emb, const int32_t *tok, int n, int row0)
{
    for (int i = 0; i < n; i++) {
        int r = tok[i] - row0;
        float *hi = h + (size_t)i * emb->cols;
        if (r < 0 || r >= emb->rows) memset(hi, 0, sizeof(float) * (size_t)emb->cols);
        else cpu_dequant_row(emb, r, hi);
    }
}

static void matmul_heads_ref(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                             int hstride, int rows)
{
    int k = w->cols;
    float *row = malloc(sizeof(float) * (size_t)k);
    if (!row) {
        cpu_fail_oom("a weight row", sizeof(float) * (size_t)w->cols);
        return;
    }
    for (int h = 0; h < H; h++)
        for (int r = 0; r < rows; r++) {
            cpu_dequant_row(w, row0 + h * hstride + r, row);
            for (int t = 0; t < n; t++)
                y[((size_t)t * H + h) * ys + r] = dot_ref(x + ((size_t)t * H + h) * xs, row, k);
        }
    free(row);
}

static void matmul_heads_t_ref(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                               int hstride, int rows)
{
    int c = w->cols;
    float *row = malloc(sizeof(float) * (size_t)c);
    if (!row) {
        cpu_fail_oom("a weight row", sizeof(float) * (size_t)w->cols);
        return;
    }
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++) memset(y + ((size_t)t * H + h) * ys, 0, sizeof(float) * (size_t)c);
    for (int h = 0; h < H; h++)
        for (int r = 0; r < rows; r++) {
            cpu_dequant_row(w, row0 + h * hstride + r, row);
            for (int t = 0; t < n; t++) {
                float xv = x[((size_t)t * H + h) * xs + r], *yo = y + ((size_t)t * H + h) * ys;
                for (int j = 0; j < c; j++) yo[j] += xv * row[j];
            }
        }
    free(row);
}

/* Gate.forward for one token (see the op's contract in backend.h). */
static void route_one(float *sc, const float *bias, int E, int K, int G, int limited, bool sigmoid, float rscale,
                      int *idx, float *wt)
{
    int per = E / G;
    float *biased = malloc(sizeof(float) * (size_t)E);
    float *gs = malloc(sizeof(float) * (size_t)G);
    bool *keep = malloc((size_t)G);
    if (!biased || !gs || !keep) {
        /* valid expert ids with zero weight keep the callers' indexing safe */
        cpu_fail_oom("expert routing", sizeof(float) * (size_t)E);
        for (int k = 0; k < K; k++) {
            idx[k] = k;
            wt[k] = 0;
        }
        free(biased);
        free(gs);
        free(keep);
        return;
    }
    if (!sigmoid) {
        float mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = fmaxf(mx, sc[e]);
        for (int e = 0; e < E; e++) sum += (sc[e] = expf(sc[e] - mx));
        for (int e = 0; e < E; e++) sc[e] /= sum;
    } else {
        for (int e = 0; e < E; e++) sc[e] = 1.0f / (1.0f + expf(-sc[e]));
    }
    for (int e = 0; e < E; e++) biased[e] = bias ? sc[e] + bias[e] : sc[e];
    if (G > 1) {
        /* group score: max without bias, sum of the top two with bias */
        for (int g = 0; g < G; g++) {
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
            keep[g] = false;
        }
        for (int k = 0; k < limited; k++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
            keep[best] = true;
        }
        for (int g = 0; g < G; g++)
            if (!keep[g])
                for (int j = 0; j < per; j++) biased[g * per + j] = -INFINITY;
    }
    float sum = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= idx[j] == e;
            if (!taken && (best < 0 || biased[e] > biased[best])) best = e;
        }
        idx[k] = best;
        wt[k] = sc[best];
        sum += wt[k];
    }
    for (int k = 0; k < K; k++) {
        if (sigmoid) wt[k] /= sum;
        wt[k] *= rscale;
    }
    free(biased);
    free(gs);
    free(keep);
}

static void moe_route_ref(int *idx, float *wt, float *sc, const float *bias, int n, int E, int K, int groups,
                          int limited_groups, bool sigmoid, float route_scale)
{
    for (int t = 0; t < n; t++)
        route_one(sc + (size_t)t * E, bias, E, K, groups, limited_groups, sigmoid, route_scale, idx + (size_t)t * K,
                  wt + (size_t)t * K);
}

/* ys = w2(silu(w1 x) * w3 x) for n rows of x; a, g: n rows of w1->rows floats of scratch. */
static void mlp_ref(float *ys, const float *x, int n, const ds_weight *w1, const ds_weight *w2, const ds_weight *w3,
                    float *a, float *g, ds_gemm_impl gemm, bool ue8m0)
{
    int inter = w1->rows;
    matmul_ref(a, x, n, w1, 0, inter, gemm, ue8m0);
    matmul_ref(g, x, n, w3, 0, inter, gemm, ue8m0);
    for (size_t i = 0; i < (size_t)n * inter; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * g[i];
    matmul_ref(ys, a, n, w2, 0, w2->rows, gemm, ue8m0);
}

/* y += the shared experts' MLP of x, n rows. */
static void mlp_add_ref(float *y, const float *x, int n, const ds_mlp_w *w, ds_gemm_impl gemm, bool ue8m0)
{
    int dim = w->w1->cols, inter = w->w1->rows;
    float *a = malloc(sizeof(float) * (size_t)n * inter), *g = malloc(sizeof(float) * (size_t)n * inter);
    float *ys = malloc(sizeof(float) * (size_t)n * dim);
    if (!a || !g || !ys) {
        cpu_fail_oom("shared expert activations", sizeof(float) * (size_t)n * (2 * (size_t)inter + dim));
    } else {
        mlp_ref(ys, x, n, w->w1, w->w2, w->w3, a, g, gemm, ue8m0);
        for (size_t i = 0; i < (size_t)n * dim; i++) y[i] += ys[i];
    }
    free(a);
    free(g);
    free(ys);
}

/* Tokens grouped per local expert, in expert order, as fallback.c's generic version does;
 * then the shared experts, if any. */
static void moe_experts_ref(float *y, const float *x, int n, int K, const int *idx, const float *wt,
                            const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int e0, int ne,
                            const ds_mlp_w *shared, ds_gemm_impl gemm, bool ue8m0)
{
    int dim = ew1[0].cols, inter = ew1[0].rows;
    int *list = malloc(sizeof(int) * (size_t)n);
    float *lw = malloc(sizeof(float) * (size_t)n), *xs = malloc(sizeof(float) * (size_t)n * dim);
    float *a = malloc(sizeof(float) * (size_t)n * inter), *g = malloc(sizeof(float) * (size_t)n * inter);
    float *ys = malloc(sizeof(float) * (size_t)n * dim);
    if (!list || !lw || !xs || !a || !g || !ys) {
        cpu_fail_oom("expert activations", sizeof(float) * (size_t)n * (2 * dim + 2 * inter));
        free(list);
        free(lw);
        free(xs);
        free(a);
        free(g);
        free(ys);
        return;
    }
    memset(y, 0, sizeof(float) * (size_t)n * dim);
    for (int e = 0; e < ne; e++) {
        int cnt = 0;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (idx[(size_t)t * K + k] == e0 + e) {
                    list[cnt] = t;
                    lw[cnt++] = wt[(size_t)t * K + k];
                }
        if (!cnt) continue;
        copy_rows_ref(xs, dim, NULL, x, dim, list, cnt, dim);
        mlp_ref(ys, xs, cnt, &ew1[e], &ew2[e], &ew3[e], a, g, gemm, ue8m0);
        add_rows_scaled_ref(y, list, ys, lw, cnt, dim);
    }
    if (shared) mlp_add_ref(y, x, n, shared, gemm, ue8m0);
    free(list);
    free(lw);
    free(xs);
    free(a);
    free(g);
    free(ys);
}

static void rmsnorm_rows_ref(float *y, int ys, const int *di, float *x, int xs, const float *r, const float *w,
                             int n, int dim, float eps)
{
    for (int i = 0; i < n; i++) {
        float *xi = x + (size_t)i * xs;
        float *yi = y + (size_t)(di ? di[i] : i) * ys;
        if (r)
            for (int j = 0; j < dim; j++) xi[j] += r[(size_t)i * dim + j];
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float rs = (float)(1.0 / sqrt(ss / dim + eps));
        for (int j = 0; j < dim; j++) yi[j] = xi[j] * rs * w[j];
    }
}

static void rope_copy_ref(float *dst, int ds, const int *di, const float *src, int ss, int n, int nvec, int rope,
                          const int *pos, const float *cos_tab, const float *sin_tab)
{
    int half = rope / 2;
    for (int t = 0; t < n; t++) {
        const float *c = cos_tab + (size_t)pos[t] * half, *s = sin_tab + (size_t)pos[t] * half;
        for (int v = 0; v < nvec; v++) {
            const float *p = src + ((size_t)t * nvec + v) * ss;
            float *d = dst + ((size_t)(di ? di[t] : t) * nvec + v) * ds;
            for (int i = 0; i < half; i++) {
                float a = p[2 * i], b = p[2 * i + 1];
                d[2 * i] = a * c[i] - b * s[i];
                d[2 * i + 1] = a * s[i] + b * c[i];
            }
        }
    }
}

const ds_ops cpu_ref_ops = {
    .name = "cpu-ref",
    .attn_head_last = true,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .matmul = matmul_ref,
    .matmul_t = matmul_t_ref,
    .rmsnorm = rmsnorm_ref,
    .rope = rope_ref,
    .attention = attention_ref,
    .silu_mul = silu_mul_ref,
    .add = add_ref,
    .status = cpu_status,
    .upload = upload_ref,
    .download = download_ref,
    .sync = sync_ref,
    .zero = zero_ref,
    .copy_rows = copy_rows_ref,
    .add_rows_scaled = add_rows_scaled_ref,
    .embed = embed_ref,
    .matmul_heads = matmul_heads_ref,
    .matmul_heads_t = matmul_heads_t_ref,
    .moe_route = moe_route_ref,
    .moe_experts = moe_experts_ref,
    .rmsnorm_rows = rmsnorm_rows_ref,
    .rope_copy = rope_copy_ref,
};
