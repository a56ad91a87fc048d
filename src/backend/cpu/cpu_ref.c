/* cpu_ref.c - the CPU backend's scalar reference operations.
 *
 * Plain loops in float32, parallel over independent outputs with OpenMP. These
 * are the definition every faster kernel (and every other backend) is tested
 * against; they favour clarity, with just enough blocking to be usable. */
#include "cpu_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/quant.h"
#include "base/numeric.h"

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
    if (!xq || !xs || !xf) abort(); /* internal scratch; sizes are bounded by the model */
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
        if (!row) abort();
        #pragma omp for schedule(static)
        for (int r = 0; r < rows; r++) {
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
    if (!row) abort();
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
        if (!sc) abort();
        #pragma omp for schedule(dynamic, 1)
        for (int th = 0; th < total; th++) {
            int t = th / H, h = th % H, len = a->pos[t] + 1, s = a->seq[t];
            if (impl == DS_ATTN_ABSORB) {
                const float *qc = a->q_c + ((size_t)t * H + h) * a->kv_rank;
                const float *qp = a->q_pe + ((size_t)t * H + h) * a->rope;
                const float *kv = a->kv_cache + (size_t)s * a->ctx * a->kv_rank;
                const float *pe = a->pe_cache + (size_t)s * a->ctx * a->rope;
                for (int j = 0; j < len; j++)
                    sc[j] = (dot_ref(qc, kv + (size_t)j * a->kv_rank, a->kv_rank) +
                             dot_ref(qp, pe + (size_t)j * a->rope, a->rope)) * a->softmax_scale;
                softmax_ref(sc, len);
                float *o = a->out + ((size_t)t * H + h) * a->kv_rank;
                memset(o, 0, sizeof(float) * (size_t)a->kv_rank);
                for (int j = 0; j < len; j++)
                    for (int c = 0; c < a->kv_rank; c++) o[c] += sc[j] * kv[(size_t)j * a->kv_rank + c];
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

const ds_ops cpu_ref_ops = {
    .name = "cpu-ref",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .matmul = matmul_ref,
    .matmul_t = matmul_t_ref,
    .rmsnorm = rmsnorm_ref,
    .rope = rope_ref,
    .attention = attention_ref,
    .silu_mul = silu_mul_ref,
    .add = add_ref,
};
