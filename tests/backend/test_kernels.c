/* test_kernels.c - every vectorised CPU kernel against the scalar reference
 * (cpu_ref.c) on random inputs: odd sizes, partial 128-blocks, row offsets,
 * every weight format, FP8 subnormals; sentinels past the end of every output
 * catch overruns. Error is normalised by sum |x_k w_k| (the size of the terms),
 * so the bound does not depend on cancellation. */
#include <string.h>

#include "backend/cpu/cpu_amx.h"
#include "backend/cpu/cpu_ref.h"
#include "backend/cpu/cpu_simd.h"
#include "backend/cpu/quant.h"
#include "base/numeric.h"
#include "tdata.h"
#include "test.h"

/* max over outputs of |got - ref| / sum_k |x_k w_k| for y = x W[row0..]^T */
static double matmul_err(const float *got, const float *ref, const float *x, int n, const ds_weight *w, int row0,
                         int rows)
{
    float *row = malloc(sizeof(float) * (size_t)w->cols);
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        cpu_dequant_row(w, row0 + r, row);
        for (int t = 0; t < n; t++) {
            double mag = 1e-30;
            for (int k = 0; k < w->cols; k++) mag += fabs((double)x[(size_t)t * w->cols + k] * row[k]);
            double e = fabs((double)got[(size_t)t * rows + r] - ref[(size_t)t * rows + r]) / mag;
            if (!(e <= worst)) worst = e; /* NaN counts as worst */
        }
    }
    free(row);
    return worst;
}

typedef void (*matmul_fn)(float *, const float *, int, const ds_weight *, int, int);

static void avx2_mm(float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    avx2_matmul(y, x, n, w, row0, rows, DS_GEMM_BF16, false);
}

/* tol_fp8: the bound for FP8 weights (see main). */
static void check_matmul(const char *label, matmul_fn f, double tol_all, double tol_fp8)
{
    static const int shapes[][4] = {
        /* rows, cols, row0, used rows */
        {1, 1, 0, 1}, {5, 17, 1, 3}, {37, 130, 0, 37}, {130, 257, 2, 127}, {300, 129, 100, 190},
        {256, 512, 128, 128}, {70, 2048, 0, 70}, {129, 33, 64, 65}, {150, 1157, 5, 140},
        /* rows long enough that even one token's activations go in column pieces */
        {20, 4500, 3, 17}, {9, 8256, 0, 9},
    };
    /* from 16 (cpu_gemm_min_tokens) the GEMMs: token groups of 4-6 (AVX2), or
     * 16 + 3 and 16 + 5 (AVX-512) */
    static const int ns[] = {1, 2, 3, 4, 5, 7, 13, 16, 17, 19, 21, 23, 50};
    static const ds_wfmt fmts[] = {DS_W_F32, DS_W_BF16, DS_W_FP8, DS_W_FP8}; /* the last: normal codes only */
    for (size_t fi = 0; fi < 4; fi++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int rows = shapes[si][0], cols = shapes[si][1], row0 = shapes[si][2], nr = shapes[si][3], n = ns[ni];
                double tol = fmts[fi] == DS_W_FP8 ? tol_fp8 : tol_all;
                fp8_normal_only = fi == 3;
                tweight w = make_weight(fmts[fi], rows, cols);
                fp8_normal_only = false;
                float *x = rand_vec((size_t)n * cols);
                float *ref = out_buf((size_t)n * nr, NULL), *got = out_buf((size_t)n * nr, NULL);
                cpu_ref_ops.matmul(ref, x, n, &w.w, row0, nr, DS_GEMM_BF16, false);
                f(got, x, n, &w.w, row0, nr);
                double e = matmul_err(got, ref, x, n, &w.w, row0, nr);
                CHECK_MSG(e <= tol, "%s fmt %d %dx%d rows [%d,+%d) n %d: error %.3g > %.3g", label, (int)fmts[fi], rows,
                          cols, row0, nr, n, e, tol);
                CHECK_MSG(sentinels_ok(got, (size_t)n * nr), "%s fmt %d %dx%d n %d: wrote past the end", label,
                          (int)fmts[fi], rows, cols, n);
                free(x);
                free(ref);
                free(got);
                free_weight(&w);
            }
}

/* FP8 weights whose block scales reach past 2^7 (and below 2^-100), with
 * all codes: the AVX2 GEMM widens codes to floats times 2^-120 and so scales
 * them in two steps there. Against the reference at GEMM token counts. */
static void check_fp8_scale_range(const char *label, matmul_fn f)
{
    static const float scales[] = {1e-3f, 100.0f, 200.0f, 3e4f, 1e-31f};
    int rows = 150, cols = 300, n = 19;
    tweight w = make_weight(DS_W_FP8, rows, cols);
    for (int i = 0; i < 2 * 3; i++) w.scale[i] = scales[i % 5];
    float *x = rand_vec((size_t)n * cols);
    float *ref = out_buf((size_t)n * rows, NULL), *got = out_buf((size_t)n * rows, NULL);
    cpu_ref_ops.matmul(ref, x, n, &w.w, 0, rows, DS_GEMM_BF16, false);
    f(got, x, n, &w.w, 0, rows);
    double e = matmul_err(got, ref, x, n, &w.w, 0, rows);
    CHECK_MSG(e <= 1e-6, "%s fp8 scales 1e-31 to 3e4: error %.3g", label, e);
    CHECK(sentinels_ok(got, (size_t)n * rows));
    free(x);
    free(ref);
    free(got);
    free_weight(&w);
}

/* Weights whose rows start at every place in a 64-byte line (a safetensors
 * file's tensors need only be 8-byte aligned; the AVX-512 decode kernels load
 * whole lines and shift them into place where a row starts 4 bytes in or
 * more): the same bits as the line-aligned copy, and within tol of the
 * reference. BF16 at every 2 bytes, FP8 (every code but NaN, so subnormal
 * chunks too) at every byte. Whole rows and column pieces (BF16 4500, FP8
 * 8256 columns), FP8 rows a multiple of 64 (the two-row tile from 2 tokens)
 * or not; 1 to 9 tokens (the two-row tile takes 8 at a time). */
static void check_line_offsets(const char *label, matmul_fn f, ds_wfmt fmt, double tol)
{
    static const int bf16_shapes[][2] = {{70, 2048}, {9, 4500}, {33, 96}};
    static const int fp8_shapes[][2] = {{70, 2048}, {5, 8256}, {33, 200}, {17, 64}};
    static const int bf16_n[] = {1, 3, 5}, fp8_n[] = {1, 2, 3, 4, 8, 9};
    bool fp8 = fmt == DS_W_FP8;
    const int (*shapes)[2] = fp8 ? fp8_shapes : bf16_shapes;
    size_t nshapes = fp8 ? sizeof fp8_shapes / sizeof *fp8_shapes : sizeof bf16_shapes / sizeof *bf16_shapes;
    const int *ns = fp8 ? fp8_n : bf16_n;
    size_t nn = fp8 ? sizeof fp8_n / sizeof *fp8_n : sizeof bf16_n / sizeof *bf16_n;
    int esz = fp8 ? 1 : 2;
    for (size_t si = 0; si < nshapes; si++)
        for (size_t ni = 0; ni < nn; ni++) {
            int rows = shapes[si][0], cols = shapes[si][1], n = ns[ni];
            size_t bytes = (size_t)rows * cols * esz;
            tweight w = make_weight(fmt, rows, cols);
            uint8_t *buf = NULL;
            if (posix_memalign((void **)&buf, 64, bytes + 64)) abort();
            float *x = rand_vec((size_t)n * cols);
            float *ref = out_buf((size_t)n * rows, NULL), *got = out_buf((size_t)n * rows, NULL),
                  *al = out_buf((size_t)n * rows, NULL);
            cpu_ref_ops.matmul(ref, x, n, &w.w, 0, rows, DS_GEMM_BF16, false);
            ds_weight v = w.w;
            for (int at = 0; at < 64; at += esz) {
                memcpy(buf + at, w.data, bytes);
                v.data = buf + at;
                f(at ? got : al, x, n, &v, 0, rows);
                if (!at) continue;
                double e = matmul_err(got, ref, x, n, &v, 0, rows);
                CHECK_MSG(e <= tol && !memcmp(got, al, sizeof(float) * (size_t)n * rows),
                          "%s %s %dx%d rows %d bytes into a line, n %d: error %.3g, %s the aligned copy", label,
                          fp8 ? "fp8" : "bf16", rows, cols, at, n, e,
                          memcmp(got, al, sizeof(float) * (size_t)n * rows) ? "not" : "as");
                CHECK(sentinels_ok(got, (size_t)n * rows));
            }
            free(buf);
            free(x);
            free(ref);
            free(got);
            free(al);
            free_weight(&w);
        }
}

static void gemm_split(float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    cpu_gemm_precision = CPU_GEMM_SPLIT;
    avx512_matmul_gemm(y, x, n, w, row0, rows);
}

static void gemm_hilo8(float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    cpu_gemm_prec keep = cpu_gemm_precision;
    cpu_gemm_precision = CPU_GEMM_HILO8;
    avx512_matmul_gemm(y, x, n, w, row0, rows);
    cpu_gemm_precision = keep;
}

static void gemm_bf16(float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    cpu_gemm_prec keep = cpu_gemm_precision;
    cpu_gemm_precision = CPU_GEMM_BF16;
    avx512_matmul_gemm(y, x, n, w, row0, rows);
    cpu_gemm_precision = keep;
}

/* The HILO8 GEMM against its error bound (cpu_simd.h): per 128-column block
 * b, lo_k = x_k - bf16(x_k) is rounded to a multiple of sl = max |lo| / 127
 * and w_k to one of sw = max |w| / 127, so
 *   |got - sum x_k w_k| <= sum_b (sl_b / 2 sum |w_k| + sw_b / 2 sum |lo_k|
 *                                  + sl_b sw_b / 4 x 128)
 * plus float32 rounding (1e-6 of sum |x_k w_k|). A wrong scale or a saturated
 * code breaks the bound; a mere float32 tolerance cannot tell. Every e4m3
 * code is in the FP8 weights, odd sizes, several 1024-column chunks. */
static void check_hilo8(void)
{
    static const int shapes[][4] = {
        {1, 1, 0, 1}, {5, 17, 1, 3}, {37, 130, 0, 37}, {130, 257, 2, 127}, {300, 129, 100, 190},
        {70, 2048, 0, 70}, {150, 1157, 5, 140}, {65, 2100, 0, 65}, {20, 4500, 3, 17},
    };
    static const int ns[] = {1, 5, 6, 7, 13, 50};
    static const ds_wfmt fmts[] = {DS_W_BF16, DS_W_FP8};
    int worst_i = -1;
    double worst = 0;
    for (size_t fi = 0; fi < 2; fi++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int rows = shapes[si][0], K = shapes[si][1], row0 = shapes[si][2], nr = shapes[si][3], n = ns[ni];
                tweight w = make_weight(fmts[fi], rows, K);
                float *x = rand_vec((size_t)n * K), *got = out_buf((size_t)n * nr, NULL);
                if (si % 2) /* a column of outliers */
                    for (int t = 0; t < n; t++) x[(size_t)t * K + K / 2] *= 1000.0f;
                gemm_hilo8(got, x, n, &w.w, row0, nr);
                float *row = malloc(sizeof(float) * (size_t)K);
                int bad = 0;
                for (int r = 0; r < nr; r++) {
                    cpu_dequant_row(&w.w, row0 + r, row);
                    for (int t = 0; t < n; t++) {
                        const float *xt = x + (size_t)t * K;
                        double exact = 0, mag = 0, bound = 0;
                        for (int k0 = 0; k0 < K; k0 += 128) {
                            double ml = 0, mw = 0, sw_ = 0, sl_ = 0;
                            for (int k = k0; k < K && k < k0 + 128; k++) {
                                double lo = (double)xt[k] - bf16_to_f32(f32_to_bf16(xt[k]));
                                exact += (double)xt[k] * row[k];
                                mag += fabs((double)xt[k] * row[k]);
                                ml = fmax(ml, fabs(lo));
                                mw = fmax(mw, fabs((double)row[k]));
                                sw_ += fabs((double)row[k]);
                                sl_ += fabs(lo);
                            }
                            bound += ml / 254 * sw_ + mw / 254 * sl_ + ml * mw / (127.0 * 127 * 4) * 128;
                        }
                        double e = fabs(got[(size_t)t * nr + r] - exact), lim = 1.01 * bound + 1e-6 * mag;
                        bad += !(e <= lim);
                        if (e / lim > worst) worst = e / lim, worst_i = (int)(fi * 100 + si);
                    }
                }
                CHECK_MSG(bad == 0, "avx512 gemm hilo8 fmt %d %dx%d rows [%d,+%d) n %d: %d outputs past the bound",
                          (int)fmts[fi], rows, K, row0, nr, n, bad);
                CHECK(sentinels_ok(got, (size_t)n * nr));
                free(row);
                free(x);
                free(got);
                free_weight(&w);
            }
    printf("avx512 gemm hilo8: worst error %.2f of its bound (case %d)\n", worst, worst_i);
}

static void gemm_amx(float *y, const float *x, int n, const ds_weight *w, int row0, int rows)
{
    cpu_gemm_amx = true;
    avx512_matmul_gemm(y, x, n, w, row0, rows);
    cpu_gemm_amx = false;
}

/* Every non-NaN e4m3 code, through the decode kernel: a (256, 1) weight of
 * codes 0..255 with scale 1 times x = 1 gives the code's value exactly. */
static void check_e4m3_codes(void)
{
    uint8_t codes[256];
    float scale[2] = {1, 1}, x = 1, y[256 + PAD];
    for (int i = 0; i < 256; i++) codes[i] = (uint8_t)i;
    ds_weight w = {.fmt = DS_W_FP8, .rows = 256, .cols = 1, .data = codes, .scale = scale};
    for (int i = 0; i < 256 + PAD; i++) y[i] = SENTINEL;
    avx512_matmul_decode(y, &x, 1, &w, 0, 256);
    int bad = 0;
    for (int i = 0; i < 256; i++) {
        if ((i & 0x7f) == 0x7f) continue; /* NaN codes: only must not crash */
        bad += y[i] != fp8_e4m3_to_f32((uint8_t)i);
    }
    CHECK_MSG(bad == 0, "%d e4m3 codes widened wrongly", bad);
    CHECK(sentinels_ok(y, 256));
}

typedef void (*matmul_t_fn)(float *y, const float *x, int n, const ds_weight *w, int row0, int rows);

static void check_matmul_t(const char *label, matmul_t_fn mt)
{
    static const int shapes[][4] = {{256, 512, 128, 128}, {37, 130, 0, 37}, {300, 129, 130, 33}, {5, 17, 0, 5}};
    static const int ns[] = {1, 2, 3, 4, 7};
    static const ds_wfmt fmts[] = {DS_W_F32, DS_W_BF16, DS_W_FP8};
    for (size_t fi = 0; fi < 3; fi++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int rows = shapes[si][0], cols = shapes[si][1], row0 = shapes[si][2], nr = shapes[si][3], n = ns[ni];
                tweight w = make_weight(fmts[fi], rows, cols);
                float *x = rand_vec((size_t)n * nr), *ref = out_buf((size_t)n * cols, NULL), *got = out_buf((size_t)n * cols, NULL);
                cpu_ref_ops.matmul_t(ref, x, n, &w.w, row0, nr);
                mt(got, x, n, &w.w, row0, nr);
                double worst = 0, mag = 0;
                for (size_t i = 0; i < (size_t)n * cols; i++) {
                    worst = fmax(worst, fabs((double)got[i] - ref[i]));
                    mag = fmax(mag, fabs((double)ref[i]));
                }
                CHECK_MSG(worst <= 1e-5 * mag, "%s fmt %d %dx%d n %d: error %.3g of %.3g", label, (int)fmts[fi], rows,
                          cols, n, worst, mag);
                CHECK(sentinels_ok(got, (size_t)n * cols));
                free(x);
                free(ref);
                free(got);
                free_weight(&w);
            }
}

typedef void (*attn_fn)(const ds_attn_args *a, ds_attn_impl impl);

static void check_attention(const char *label, attn_fn attn)
{
    static const int cases[][5] = {
        /* heads, kv_rank, rope, tokens, first position */
        {16, 512, 64, 1, 300}, {5, 48, 16, 1, 0}, {3, 32, 16, 4, 70}, {8, 128, 32, 9, 0}, {7, 64, 16, 2, 1000},
        {12, 96, 16, 3, 130}, {13, 64, 16, 1, 64}, {9, 160, 32, 2, 77}, /* eight heads at a time, then 4 and 1 */
        {10, 48, 16, 2, 33}, /* R % 32 != 0: four heads at a time */
        {3, 40, 8, 2, 5}, /* not multiples of 16: the reference path (AVX-512), 8 columns past the last 16 (AVX2) */
        {6, 24, 8, 1, 2000}, /* AVX2: an odd position count per thread, 8-column tail */
        /* AVX-512, heads in multiples of 16: scores a head a lane on 16-position tiles, the
         * positions past the last tile of a block by the 4 x 4 tiles */
        {32, 96, 32, 2, 150}, {16, 64, 16, 1, 1000}, {48, 32, 16, 3, 17},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        int H = cases[ci][0], R = cases[ci][1], P = cases[ci][2], n = cases[ci][3], p0 = cases[ci][4];
        int ctx = p0 + n + 3, nseq = 2;
        float *kv = rand_vec((size_t)nseq * ctx * R), *pe = rand_vec((size_t)nseq * ctx * P);
        float *qc = rand_vec((size_t)n * H * R), *qp = rand_vec((size_t)n * H * P);
        float *ref = out_buf((size_t)n * H * R, NULL), *got = out_buf((size_t)n * H * R, NULL);
        int *seq = malloc(sizeof(int) * (size_t)n), *pos = malloc(sizeof(int) * (size_t)n);
        for (int t = 0; t < n; t++) {
            seq[t] = t % 2;
            pos[t] = p0 + t;
        }
        ds_attn_args a = {.n_tokens = n, .seq = seq, .pos = pos, .n_heads = H, .nope = 8, .rope = P, .vdim = 8,
                          .kv_rank = R, .softmax_scale = 0.05f, .q_c = qc, .q_pe = qp, .kv_cache = kv,
                          .pe_cache = pe, .ctx = ctx, .out = ref};
        cpu_ref_ops.attention(&a, DS_ATTN_ABSORB);
        a.out = got;
        attn(&a, DS_ATTN_ABSORB);
        double worst = 0;
        for (size_t i = 0; i < (size_t)n * H * R; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
        CHECK_MSG(worst <= 1e-5, "%s H %d R %d rope %d n %d pos %d: error %.3g", label, H, R, P, n, p0, worst);
        CHECK(sentinels_ok(got, (size_t)n * H * R));
        free(kv);
        free(pe);
        free(qc);
        free(qp);
        free(ref);
        free(got);
        free(seq);
        free(pos);
    }
}

/* Absorb attention with per-head limits, key columns and a value offset (the
 * expanded prefill: forward.c's mla_expanded, the pass's tokens as heads),
 * against the reference. Limits from 0 (a thread's half of the positions all
 * masked for that head) to the token's own position. */
static void check_attention_expanded(const char *label, attn_fn attn)
{
    static const int cases[][6] = {
        /* heads, row, key columns, value offset, rope, position */
        {64, 256, 128, 128, 64, 700}, {13, 64, 32, 32, 32, 130}, {5, 96, 48, 32, 16, 40}, {9, 64, 64, 0, 16, 200},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        int H = cases[ci][0], W = cases[ci][1], Rk = cases[ci][2], vo = cases[ci][3], P = cases[ci][4];
        int pos = cases[ci][5], ctx = pos + 5, Ro = W - vo, seq = 0;
        float *kv = rand_vec((size_t)ctx * W), *pe = rand_vec((size_t)ctx * P);
        float *qc = rand_vec((size_t)H * W), *qp = rand_vec((size_t)H * P);
        float *ref = out_buf((size_t)H * Ro, NULL), *got = out_buf((size_t)H * Ro, NULL);
        int *last = malloc(sizeof(int) * (size_t)H);
        for (int h = 0; h < H; h++) last[h] = h == 0 ? 0 : h == 1 ? pos : (int)(urand() * (pos + 1));
        ds_attn_args a = {.n_tokens = 1, .seq = &seq, .pos = &pos, .n_heads = H, .nope = 8, .rope = P, .vdim = 8,
                          .kv_rank = W, .softmax_scale = 0.05f, .q_c = qc, .q_pe = qp, .kv_cache = kv, .pe_cache = pe,
                          .ctx = ctx, .out = ref, .head_last = last, .key_dims = Rk, .val_off = vo};
        cpu_ref_ops.attention(&a, DS_ATTN_ABSORB);
        a.out = got;
        attn(&a, DS_ATTN_ABSORB);
        double worst = 0;
        for (size_t i = 0; i < (size_t)H * Ro; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
        CHECK_MSG(worst <= 1e-5, "%s H %d row %d key %d value offset %d pos %d: error %.3g", label, H, W, Rk, vo, pos,
                  worst);
        CHECK(sentinels_ok(got, (size_t)H * Ro));
        float *bufs[] = {kv, pe, qc, qp, ref, got};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
        free(last);
    }
}

typedef void (*silu_fn)(float *a, const float *b, size_t n);

static void check_silu(const char *label, silu_fn silu)
{
    static const size_t ns[] = {1, 15, 16, 17, 1000, 70001};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        size_t n = ns[i];
        float *a = rand_vec(n), *b = rand_vec(n), *ref = out_buf(n, NULL), *got = out_buf(n, NULL);
        for (size_t j = 0; j < n; j++) a[j] *= 30; /* both tails of the sigmoid */
        memcpy(ref, a, sizeof(float) * n);
        memcpy(got, a, sizeof(float) * n);
        cpu_ref_ops.silu_mul(ref, b, n);
        silu(got, b, n);
        double worst = 0;
        for (size_t j = 0; j < n; j++) worst = fmax(worst, fabs((double)got[j] - ref[j]) / (fabs(ref[j]) + 1e-6));
        CHECK_MSG(worst <= 1e-5, "%s n %zu: relative error %.3g", label, n, worst);
        CHECK(sentinels_ok(got, n));
        free(a);
        free(b);
        free(ref);
        free(got);
    }
}

/* Several matmuls at once (decode: one region for all; n >= 16: the GEMM each),
 * every job against the reference. */
typedef void (*many_fn)(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0);

static void check_matmul_many(const char *label, many_fn many)
{
    static const int ns[][3] = {{1, 1, 1}, {2, 3, 1}, {4, 1, 20}};
    static const ds_wfmt fmts[] = {DS_W_FP8, DS_W_BF16, DS_W_F32};
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
        tweight w[3];
        float *x[3], *ref[3], *got[3];
        ds_matmul_job jobs[3];
        int shape[3][4] = {{300, 257, 7, 250}, {130, 129, 2, 100}, {37, 64, 0, 37}}; /* rows, cols, row0, used */
        for (int j = 0; j < 3; j++) {
            int n = ns[ni][j], nr = shape[j][3];
            w[j] = make_weight(fmts[j], shape[j][0], shape[j][1]);
            x[j] = rand_vec((size_t)n * shape[j][1]);
            ref[j] = out_buf((size_t)n * nr, NULL);
            got[j] = out_buf((size_t)n * nr, NULL);
            cpu_ref_ops.matmul(ref[j], x[j], n, &w[j].w, shape[j][2], nr, DS_GEMM_BF16, false);
            jobs[j] = (ds_matmul_job){got[j], x[j], n, &w[j].w, shape[j][2], nr};
        }
        many(jobs, 3, DS_GEMM_BF16, false);
        for (int j = 0; j < 3; j++) {
            int n = ns[ni][j], nr = shape[j][3];
            double e = matmul_err(got[j], ref[j], x[j], n, &w[j].w, shape[j][2], nr);
            CHECK_MSG(e <= 1e-5, "%s job %d n %d: error %.3g", label, j, n, e);
            CHECK_MSG(sentinels_ok(got[j], (size_t)n * nr), "%s job %d n %d: wrote past the end", label, j, n);
            free(x[j]);
            free(ref[j]);
            free(got[j]);
            free_weight(&w[j]);
        }
    }
}

static double rel_err(const float *got, const float *ref, size_t n)
{
    double worst = 0, mag = 1e-30;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)got[i] - ref[i]));
        mag = fmax(mag, fabs((double)ref[i]));
    }
    return worst / mag;
}

/* Per-head products of absorb attention: wkv_b-like (H*(nope+vd), R) weights. */
typedef void (*heads_fn)(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                         int hstride, int rows);

static void check_heads(const char *label, heads_fn heads, heads_fn heads_t)
{
    static const int ns[] = {1, 2, 5, 13, 20};
    static const ds_wfmt fmts[] = {DS_W_F32, DS_W_BF16, DS_W_FP8};
    /* H, nope, vd, R: the second and third take the one-token FP8 form of heads_t
     * (R a multiple of 256), with heads that start inside scale blocks */
    static const int shapes[][4] = {{5, 24, 40, 160}, {3, 137, 40, 512}, {4, 9, 7, 256}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
    for (size_t fi = 0; fi < 3; fi++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            int H = shapes[si][0], nope = shapes[si][1], vd = shapes[si][2], R = shapes[si][3], hs = nope + vd;
            int n = ns[ni], xs = nope + 8, ys = R + 3;
            tweight w = make_weight(fmts[fi], H * hs, R);
            /* heads_t: q_c[t][h] (R) = q_nope[t][h] (nope) @ W[h*hs .. + nope] */
            float *x = rand_vec((size_t)n * H * xs), *ref = out_buf((size_t)n * H * ys, NULL), *got = out_buf((size_t)n * H * ys, NULL);
            memcpy(got, ref, sizeof(float) * (size_t)n * H * ys); /* the gaps between heads stay as they were */
            cpu_ref_ops.matmul_heads_t(ref, ys, x, xs, n, H, &w.w, 0, hs, nope);
            heads_t(got, ys, x, xs, n, H, &w.w, 0, hs, nope);
            double e = rel_err(got, ref, (size_t)n * H * ys);
            CHECK_MSG(e <= 1e-5, "%s heads_t fmt %d n %d R %d: error %.3g", label, (int)fmts[fi], n, R, e);
            CHECK(sentinels_ok(got, (size_t)n * H * ys));
            free(x);
            free(ref);
            free(got);
            /* heads: out[t][h] (vd) = o[t][h] (R) @ W[h*hs + nope .. + vd]^T */
            int oxs = R + 5, oys = vd + 2;
            x = rand_vec((size_t)n * H * oxs);
            ref = out_buf((size_t)n * H * oys, NULL);
            got = out_buf((size_t)n * H * oys, NULL);
            memcpy(got, ref, sizeof(float) * (size_t)n * H * oys);
            cpu_ref_ops.matmul_heads(ref, oys, x, oxs, n, H, &w.w, nope, hs, vd);
            heads(got, oys, x, oxs, n, H, &w.w, nope, hs, vd);
            e = rel_err(got, ref, (size_t)n * H * oys);
            CHECK_MSG(e <= 1e-5, "%s heads fmt %d n %d R %d: error %.3g", label, (int)fmts[fi], n, R, e);
            CHECK(sentinels_ok(got, (size_t)n * H * oys));
            free(x);
            free(ref);
            free(got);
            free_weight(&w);
        }
}

/* Routed experts: 10 experts of which this "rank" holds [2, 8); decode sizes
 * (one chunk) and a prefill with more assignments than one chunk; with and
 * without shared experts (inter 150), once with no local expert chosen. */
/* gemm FP8: the FP8 GEMM path (FP8 weights only). Its h is quantised again before
 * w2, so the last bits of h (float sums in another order than the reference's) can
 * move a code of h by one e4m3 step, about 1/16 of it, now and then: the bar is then
 * FP8Q_MOE_TOL of the largest output. A wrong routing or scale gives errors of order 1. */
#define FP8Q_MOE_TOL 2e-2
typedef void (*moe_fn)(float *y, const float *x, int n, int K, const int *idx, const float *wt, const ds_weight *ew1,
                       const ds_weight *ew2, const ds_weight *ew3, int e0, int ne, const ds_mlp_w *shared,
                       ds_gemm_impl gemm, bool ue8m0);

static void check_moe_gemm(const char *label, moe_fn moe, ds_gemm_impl gemm)
{
    static const int ns[] = {1, 3, 40, 100, 300}; /* 300: several of cpu_moe.c's chunks */
    static const ds_wfmt fmts[] = {DS_W_FP8, DS_W_BF16};
    int E = 10, K = 3, e0 = 2, ne = 6, dim = 130, inter = 70, inter_s = 150;
    for (int sh = 0; sh < 2; sh++)
        for (size_t fi = 0; fi < (gemm == DS_GEMM_FP8 ? 1 : 2); fi++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int n = ns[ni];
                tweight s1 = make_weight(fmts[fi], inter_s, dim), s2 = make_weight(fmts[fi], dim, inter_s),
                        s3 = make_weight(fmts[fi], inter_s, dim);
                ds_mlp_w shared = {&s1.w, &s2.w, &s3.w};
                tweight w1[6], w2[6], w3[6];
                ds_weight ew1[6], ew2[6], ew3[6];
                for (int e = 0; e < ne; e++) {
                    w1[e] = make_weight(fmts[fi], inter, dim);
                    w2[e] = make_weight(fmts[fi], dim, inter);
                    w3[e] = make_weight(fmts[fi], inter, dim);
                    ew1[e] = w1[e].w;
                    ew2[e] = w2[e].w;
                    ew3[e] = w3[e].w;
                }
                int *idx = malloc(sizeof(int) * (size_t)n * K);
                float *wt = malloc(sizeof(float) * (size_t)n * K), *x = rand_vec((size_t)n * dim);
                for (int t = 0; t < n; t++)
                    for (int k = 0; k < K; k++) {
                        int e;
                        bool dup;
                        do {
                            e = (int)(urand() * E);
                            dup = false;
                            for (int j = 0; j < k; j++) dup |= idx[t * K + j] == e;
                        } while (dup);
                        idx[t * K + k] = e;
                        wt[t * K + k] = (float)urand();
                    }
                if (sh && n == 1) /* another rank's experts only: the shared ones alone */
                    for (int k = 0; k < K; k++) idx[k] = k < 2 ? k : E - 1;
                float *ref = out_buf((size_t)n * dim, NULL), *got = out_buf((size_t)n * dim, NULL);
                const ds_mlp_w *sp = sh ? &shared : NULL;
                cpu_ref_ops.moe_experts(ref, x, n, K, idx, wt, ew1, ew2, ew3, e0, ne, sp, gemm, false);
                moe(got, x, n, K, idx, wt, ew1, ew2, ew3, e0, ne, sp, gemm, false);
                double e = rel_err(got, ref, (size_t)n * dim), tol = gemm == DS_GEMM_FP8 ? FP8Q_MOE_TOL : 1e-4;
                if (gemm == DS_GEMM_FP8) printf("%s fp8 gemm path n %d shared %d: error %.3g\n", label, n, sh, e);
                CHECK_MSG(e <= tol, "%s fmt %d gemm %d n %d shared %d: error %.3g", label, (int)fmts[fi], (int)gemm,
                          n, sh, e);
                CHECK(sentinels_ok(got, (size_t)n * dim));
                free_weight(&s1);
                free_weight(&s2);
                free_weight(&s3);
                for (int j = 0; j < ne; j++) {
                    free_weight(&w1[j]);
                    free_weight(&w2[j]);
                    free_weight(&w3[j]);
                }
                free(idx);
                free(wt);
                free(x);
                free(ref);
                free(got);
            }
}

/* The FP8 GEMM path (gemm_impl fp8) against the reference's act_quant + fp8_gemm
 * (cpu_ref_ops): the input rounded as act_quant rounds it, then the decode kernel
 * (n < cpu_gemm_min_tokens), the split GEMM, or AVX2; matmul_many with FP8-weight
 * jobs sharing an input beside a BF16 one (not quantised, as the reference's linear);
 * default and ue8m0 scales. */
static void check_fp8q(void)
{
    static const int shapes[][4] = {{37, 130, 0, 37}, {130, 257, 2, 127}, {256, 512, 128, 128}, {150, 1157, 5, 140}};
    static const int ns[] = {1, 3, 8, 50};
    for (int u = 0; u < 2; u++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int rows = shapes[si][0], cols = shapes[si][1], row0 = shapes[si][2], nr = shapes[si][3], n = ns[ni];
                tweight w = make_weight(DS_W_FP8, rows, cols);
                float *x = rand_vec((size_t)n * cols);
                float *ref = out_buf((size_t)n * nr, NULL), *got = out_buf((size_t)n * nr, NULL);
                cpu_ref_ops.matmul(ref, x, n, &w.w, row0, nr, DS_GEMM_FP8, u);
                for (int path = 0; path < 2; path++) {
                    if (path == 0) avx512_matmul(got, x, n, &w.w, row0, nr, DS_GEMM_FP8, u);
                    else if (cpu_has_avx2()) avx2_matmul(got, x, n, &w.w, row0, nr, DS_GEMM_FP8, u);
                    else continue;
                    double e = matmul_err(got, ref, x, n, &w.w, row0, nr);
                    CHECK_MSG(e <= 1e-5, "fp8 gemm path (%s%s) %dx%d rows [%d,+%d) n %d: error %.3g",
                              path ? "avx2" : "avx512", u ? ", ue8m0" : "", rows, cols, row0, nr, n, e);
                    CHECK(sentinels_ok(got, (size_t)n * nr));
                }
                free(x);
                free(ref);
                free(got);
                free_weight(&w);
            }
    /* matmul_many: jobs 0 and 1 share an input, job 2 (BF16) is not quantised; 20
     * tokens take the GEMM path */
    static const int many_ns[] = {1, 4, 20};
    for (size_t mi = 0; mi < sizeof many_ns / sizeof *many_ns; mi++) {
        int n = many_ns[mi];
        int shape[3][4] = {{300, 256, 7, 250}, {130, 256, 0, 130}, {64, 256, 0, 64}};
        tweight w[3] = {make_weight(DS_W_FP8, 300, 256), make_weight(DS_W_FP8, 130, 256), make_weight(DS_W_BF16, 64, 256)};
        float *x = rand_vec((size_t)n * 256), *ref[3], *got[3];
        ds_matmul_job jobs[3];
        for (int j = 0; j < 3; j++) {
            int nr = shape[j][3];
            ref[j] = out_buf((size_t)n * nr, NULL);
            got[j] = out_buf((size_t)n * nr, NULL);
            cpu_ref_ops.matmul(ref[j], x, n, &w[j].w, shape[j][2], nr, DS_GEMM_FP8, false);
            jobs[j] = (ds_matmul_job){got[j], x, n, &w[j].w, shape[j][2], nr};
        }
        avx512_matmul_many(jobs, 3, DS_GEMM_FP8, false);
        for (int j = 0; j < 3; j++) {
            double e = matmul_err(got[j], ref[j], x, n, &w[j].w, shape[j][2], shape[j][3]);
            CHECK_MSG(e <= 1e-5, "fp8 gemm path matmul_many job %d n %d: error %.3g", j, n, e);
            CHECK(sentinels_ok(got[j], (size_t)n * shape[j][3]));
            free(ref[j]);
            free(got[j]);
            free_weight(&w[j]);
        }
        free(x);
    }
}

/* avx512_act_fake_quant = act_fake_quant, bit for bit: rows of random values over many
 * magnitudes, a partial last block, and zeros, -0, float32 subnormals, 448 and beyond,
 * infinities and NaN among them; default and ue8m0 scales. */
static void check_fake_quant(void)
{
    int m = 9, k = 1157;
    float *x = rand_vec((size_t)m * k), *want = malloc(sizeof(float) * (size_t)m * k),
          *got = malloc(sizeof(float) * (size_t)m * k);
    for (int i = 0; i < m * k; i++) x[i] *= ldexpf(1.0f, (int)(urand() * 60) - 30);
    const float special[] = {0.0f, -0.0f, 1e-40f, -3e-39f, 448.0f, -449.0f, 470.0f, 1e30f, INFINITY, -INFINITY, NAN};
    for (int i = 0; i < (int)(sizeof special / sizeof *special); i++) x[(size_t)(i % m) * k + 37 * i + 5] = special[i];
    for (int i = 0; i < k; i++) x[(size_t)7 * k + i] = (float)(i % 11) * 1e-3f; /* a row of ties and steps */
    for (int u = 0; u < 2; u++) {
        act_fake_quant(x, m, k, want, u);
        avx512_act_fake_quant(x, m, k, got, u);
        int bad = 0;
        for (int i = 0; i < m * k; i++) bad += !(memcmp(&want[i], &got[i], 4) == 0 || (isnan(want[i]) && isnan(got[i])));
        CHECK_MSG(bad == 0, "avx512_act_fake_quant%s: %d of %d values differ from the scalar", u ? " (ue8m0)" : "", bad,
                  m * k);
    }
    free(x);
    free(want);
    free(got);
}

/* Every e4m3 code through the decode kernel's vdpbf16ps path: row i of a
 * (256, 200) weight holds code i in column (5 i) % 200 and zeros elsewhere;
 * scale 1, x = 1: y[i] is the code's value exactly (the 128-column steps, the
 * one 64-column chunk, the float32 second pass for subnormal and zero codes,
 * and the float32 tail past column 192). */
static void check_e4m3_codes_wide(void)
{
    enum { R = 256, C = 200 };
    uint8_t *codes = calloc((size_t)R * C, 1);
    float scale[2 * 2] = {1, 1, 1, 1}, x[C], y[R + PAD];
    for (int i = 0; i < R; i++) codes[(size_t)i * C + (5 * i) % C] = (uint8_t)i;
    for (int k = 0; k < C; k++) x[k] = 1;
    for (int i = 0; i < R + PAD; i++) y[i] = SENTINEL;
    ds_weight w = {.fmt = DS_W_FP8, .rows = R, .cols = C, .data = codes, .scale = scale};
    avx512_matmul_decode(y, x, 1, &w, 0, R);
    int bad = 0;
    for (int i = 0; i < R; i++) {
        if ((i & 0x7f) == 0x7f) continue;
        bad += y[i] != fp8_e4m3_to_f32((uint8_t)i);
    }
    CHECK_MSG(bad == 0, "%d e4m3 codes wrong through the wide decode path", bad);
    CHECK(sentinels_ok(y, R));
    free(codes);
}

/* The GEMM on AMX tiles against the reference: the hi + lo products (the
 * default precision, HILO8, runs as SPLIT there) within SPLIT's tolerance,
 * BF16 precision within its own; whole matmul_many, per-head and MoE calls;
 * and the 16B model's shapes (K = 2048, whose 4 KiB rows of pairs the A
 * tiles' padding is for; partial token groups). Skipped where AMX cannot run. */
static void check_amx(void)
{
    if (!cpu_has_amx()) {
        printf("amx gemm: SKIPPED, no AMX here (cpuid, /proc/cpuinfo amx_bf16 or Linux's arch_prctl permission)\n");
        return;
    }
    int before = t_failures, checks = t_checks;
    cpu_gemm_prec keep = cpu_gemm_precision;
    cpu_gemm_precision = CPU_GEMM_HILO8;
    check_matmul("amx gemm", gemm_amx, 1e-5, 1e-5);
    cpu_gemm_precision = CPU_GEMM_SPLIT;
    check_matmul("amx gemm split", gemm_amx, 1e-5, 1e-5);
    cpu_gemm_precision = CPU_GEMM_BF16;
    check_matmul("amx gemm bf16", gemm_amx, 2.0 / 512, 2.0 / 512);
    cpu_gemm_precision = CPU_GEMM_HILO8;
    static const int big[][4] = {{192, 2048, 0, 192}, {1408, 2048, 64, 200}, {2048, 1408, 0, 130}};
    static const int bn[] = {16, 130, 512};
    for (int fi = 0; fi < 2; fi++)
        for (int si = 0; si < 3; si++) {
            int rows = big[si][0], K = big[si][1], row0 = big[si][2], nr = big[si][3], n = bn[si];
            tweight w = make_weight(fi ? DS_W_BF16 : DS_W_FP8, rows, K);
            float *x = rand_vec((size_t)n * K), *ref = out_buf((size_t)n * nr, NULL), *got = out_buf((size_t)n * nr, NULL);
            cpu_ref_ops.matmul(ref, x, n, &w.w, row0, nr, DS_GEMM_BF16, false);
            gemm_amx(got, x, n, &w.w, row0, nr);
            double e = matmul_err(got, ref, x, n, &w.w, row0, nr);
            CHECK_MSG(e <= 1e-5 && sentinels_ok(got, (size_t)n * nr), "amx gemm %s %dx%d rows [%d,+%d) n %d: error %.3g",
                      fi ? "bf16" : "fp8", rows, K, row0, nr, n, e);
            free(x);
            free(ref);
            free(got);
            free_weight(&w);
        }
    cpu_gemm_amx = true;
    check_matmul_many("amx matmul_many", avx512_matmul_many);
    check_heads("amx", avx512_matmul_heads, avx512_matmul_heads_t);
    check_moe_gemm("amx moe_experts", avx512_moe_experts, DS_GEMM_BF16);
    check_moe_gemm("amx moe_experts", avx512_moe_experts, DS_GEMM_FP8);
    cpu_gemm_amx = false;
    cpu_gemm_precision = keep;
    printf("amx gemm: %d checks against the reference, %d failed\n", t_checks - checks, t_failures - before);
}

int main(void)
{
    g_rng = 88172645463325252ull; /* a stream of inputs apart from test_fallback's */
    if (cpu_has_avx2()) {
        /* the decode path below cpu_gemm_min_tokens tokens, gemv8 from there */
        check_matmul("avx2 matmul", avx2_mm, 1e-6, 1e-6);
        check_fp8_scale_range("avx2 matmul", avx2_mm);
        check_matmul_many("avx2 matmul_many", avx2_matmul_many);
        check_moe_gemm("avx2 moe_experts", avx2_moe_experts, DS_GEMM_BF16);
        check_matmul_t("avx2 matmul_t", avx2_matmul_t);
        check_heads("avx2", avx2_matmul_heads, avx2_matmul_heads_t);
        check_attention("avx2 attention", avx2_attention);
        check_attention_expanded("avx2 attention expanded", avx2_attention);
        check_silu("avx2 silu_mul", avx2_silu_mul);
    }
    if (!cpu_has_avx512()) {
        printf("no AVX-512 (F/BW/VL/DQ/BF16): AVX-512 kernels not tested\n");
        return t_done("backend_kernels");
    }
    check_e4m3_codes();
    check_e4m3_codes_wide();
    /* FP8 decode and the split GEMM: activations as bf16 high + low parts,
     * x - hi - lo <= 2^-18 |x|, plus float32 sums: 1e-5 */
    check_matmul("avx512 decode", avx512_matmul_decode, 1e-6, 1e-5);
    check_line_offsets("avx512 decode", avx512_matmul_decode, DS_W_BF16, 1e-6);
    check_line_offsets("avx512 decode", avx512_matmul_decode, DS_W_FP8, 1e-5);
    check_matmul("avx512 gemm split", gemm_split, 1e-5, 1e-5);
    check_hilo8();
    /* bf16 activations: each x_k rounded by at most 2^-9 relative */
    check_matmul("avx512 gemm bf16", gemm_bf16, 2.0 / 512, 2.0 / 512);
    check_matmul_t("avx512 matmul_t", avx512_matmul_t);
    check_attention("avx512 attention", avx512_attention);
    check_attention_expanded("avx512 attention", avx512_attention);
    check_silu("avx512 silu_mul", avx512_silu_mul);
    check_matmul_many("avx512 matmul_many", avx512_matmul_many);
    check_heads("avx512", avx512_matmul_heads, avx512_matmul_heads_t);
    check_moe_gemm("avx512 moe_experts", avx512_moe_experts, DS_GEMM_BF16);
    check_moe_gemm("avx512 moe_experts", avx512_moe_experts, DS_GEMM_FP8);
    check_fake_quant();
    check_fp8q();
    check_amx();
    return t_done("backend_kernels");
}
