/* test_fallback.c - the generic ops of backend_complete (fallback.c) against the
 * CPU reference's direct ops on random inputs: a table of the reference's
 * required ops only, completed, beside the reference's own optional ops (or,
 * where the reference has none, the sequence of its ops the generic version
 * stands for). Sentinels past every output catch overruns. Also: a backend op
 * that declines a call gets the generic form, one that takes the normed
 * products leaves h += r due for matmul_carry, and a generic op that cannot get
 * its scratch reports it once through status. */
#include <string.h>

#include "backend/cpu/cpu_ref.h"
#include "base/numeric.h"
#include "tdata.h"
#include "test.h"

/* max |got - ref| / max |ref| */
static double rel_err(const float *got, const float *ref, size_t n)
{
    double worst = 0, mag = 1e-30;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)got[i] - ref[i]));
        mag = fmax(mag, fabs((double)ref[i]));
    }
    return worst / mag;
}

static void check_close(const char *what, const float *got, const float *ref, size_t n, double tol)
{
    double e = rel_err(got, ref, n);
    CHECK_MSG(e <= tol, "%s: error %.3g (bound %.1g)", what, e, tol);
    CHECK_MSG(sentinels_ok(got, n), "%s: written past the end", what);
}

/* The reference's required ops: every optional member NULL. */
static ds_ops required_only(void)
{
    ds_ops t = cpu_ref_ops;
    t.name = "cpu-required";
    t.alloc_scratch = NULL;
    t.matmul_many = NULL;
    t.matmul_heads = NULL;
    t.matmul_heads_t = NULL;
    t.moe_gate = NULL;
    t.moe_experts = NULL;
    t.rmsnorm_rows = NULL;
    t.rope_copy = NULL;
    t.mla_prologue = NULL;
    t.mla_attend = NULL;
    t.matmul_many_normed = NULL;
    t.matmul_carry = NULL;
    t.attn_head_last = false;
    return t;
}

static ds_ops g_bare;
static ds_backend G; /* the generic ops */

static void check_matmul_many(void)
{
    static const ds_wfmt fmts[] = {DS_W_BF16, DS_W_FP8, DS_W_F32};
    int n = 7, k = 200;
    tweight w[3];
    float *x = rand_vec((size_t)n * k), *got[3], *ref[3];
    ds_matmul_job jobs[3];
    for (int j = 0; j < 3; j++) {
        w[j] = make_weight(fmts[j], 150 + 30 * j, k);
        int rows = 90 + j;
        got[j] = out_buf((size_t)n * rows, NULL);
        ref[j] = out_buf((size_t)n * rows, NULL);
        jobs[j] = (ds_matmul_job){got[j], x, n, &w[j].w, 17 * j, rows};
        cpu_ref_ops.matmul(ref[j], x, n, &w[j].w, 17 * j, rows, DS_GEMM_FP8, false);
    }
    G.matmul_many(&G, jobs, 3, DS_GEMM_FP8, false);
    for (int j = 0; j < 3; j++) {
        check_close("matmul_many", got[j], ref[j], (size_t)n * jobs[j].rows, 0);
        free(got[j]);
        free(ref[j]);
        free_weight(&w[j]);
    }
    free(x);
}

static void check_heads(void)
{
    static const ds_wfmt fmts[] = {DS_W_F32, DS_W_BF16, DS_W_FP8};
    int H = 3, nope = 24, vd = 20, R = 160, hs = nope + vd;
    for (int fi = 0; fi < 3; fi++)
        for (int n = 1; n <= 9; n += 8) {
            tweight w = make_weight(fmts[fi], H * hs, R);
            int xs = nope + 8, ys = R + 3, oxs = R + 5, oys = vd + 2;
            float *x = rand_vec((size_t)n * H * xs), *ref = out_buf((size_t)n * H * ys, NULL);
            float *got = out_buf((size_t)n * H * ys, NULL);
            memcpy(got, ref, sizeof(float) * (size_t)n * H * ys); /* the gaps between heads stay as they were */
            cpu_ref_ops.matmul_heads_t(ref, ys, x, xs, n, H, &w.w, 0, hs, nope);
            G.matmul_heads_t(&G, got, ys, x, xs, n, H, &w.w, 0, hs, nope);
            check_close("matmul_heads_t", got, ref, (size_t)n * H * ys, 1e-6);
            free(x);
            free(ref);
            free(got);
            x = rand_vec((size_t)n * H * oxs);
            ref = out_buf((size_t)n * H * oys, NULL);
            got = out_buf((size_t)n * H * oys, NULL);
            cpu_ref_ops.matmul_heads(ref, oys, x, oxs, n, H, &w.w, nope, hs, vd);
            G.matmul_heads(&G, got, oys, x, oxs, n, H, &w.w, nope, hs, vd);
            check_close("matmul_heads", got, ref, (size_t)n * H * oys, 1e-6);
            free(x);
            free(ref);
            free(got);
            free_weight(&w);
        }
}

/* Gate and experts: 12 experts in 4 groups, 3 chosen, this "rank" holding [2, 9). */
static void check_moe(void)
{
    int E = 12, K = 3, e0 = 2, ne = 7, dim = 130, inter = 70, inter_s = 150;
    tweight gw = make_weight(DS_W_BF16, E, dim);
    float *bias = rand_vec((size_t)E);
    tweight s[3] = {make_weight(DS_W_FP8, inter_s, dim), make_weight(DS_W_FP8, dim, inter_s),
                    make_weight(DS_W_FP8, inter_s, dim)};
    ds_mlp_w shared = {&s[0].w, &s[1].w, &s[2].w};
    tweight w[3][7];
    ds_weight ew[3][7];
    for (int e = 0; e < ne; e++)
        for (int j = 0; j < 3; j++) {
            w[j][e] = make_weight(DS_W_FP8, j == 1 ? dim : inter, j == 1 ? inter : dim);
            ew[j][e] = w[j][e].w;
        }
    for (int n = 1; n <= 40; n += 39)
        for (int sig = 0; sig < 2; sig++) {
            float *x = rand_vec((size_t)n * dim);
            float *sc = out_buf((size_t)n * E, NULL), *scr = out_buf((size_t)n * E, NULL);
            int *idx = malloc(sizeof(int) * (size_t)n * K), *idr = malloc(sizeof(int) * (size_t)n * K);
            float *wt = out_buf((size_t)n * K, NULL), *wtr = out_buf((size_t)n * K, NULL);
            const float *b = sig ? bias : NULL;
            cpu_ref_ops.matmul(scr, x, n, &gw.w, 0, E, DS_GEMM_BF16, false);
            cpu_ref_ops.moe_route(idr, wtr, scr, b, n, E, K, 4, 2, sig, 2.5f);
            G.moe_gate(&G, idx, wt, sc, x, &gw.w, b, n, K, 4, 2, sig, 2.5f);
            CHECK_MSG(!memcmp(idx, idr, sizeof(int) * (size_t)n * K), "moe_gate n %d sigmoid %d: other experts", n,
                      sig);
            check_close("moe_gate weights", wt, wtr, (size_t)n * K, 0);
            for (int sh = 0; sh < 2; sh++) {
                float *ref = out_buf((size_t)n * dim, NULL), *got = out_buf((size_t)n * dim, NULL);
                const ds_mlp_w *sp = sh ? &shared : NULL;
                cpu_ref_ops.moe_experts(ref, x, n, K, idx, wt, ew[0], ew[1], ew[2], e0, ne, sp, DS_GEMM_BF16, false);
                G.moe_experts(&G, got, x, n, K, idx, wt, ew[0], ew[1], ew[2], e0, ne, sp, DS_GEMM_BF16, false);
                check_close("moe_experts", got, ref, (size_t)n * dim, 1e-6);
                free(ref);
                free(got);
            }
            free(x);
            free(sc);
            free(scr);
            free(idx);
            free(idr);
            free(wt);
            free(wtr);
        }
    for (int e = 0; e < ne; e++)
        for (int j = 0; j < 3; j++) free_weight(&w[j][e]);
    for (int j = 0; j < 3; j++) free_weight(&s[j]);
    free_weight(&gw);
    free(bias);
}

/* rmsnorm_rows: strided rows, scattered rows, the residual add, in place. */
static void check_rmsnorm_rows(void)
{
    int n = 5, dim = 70, rows = 9, di[5] = {7, 0, 3, 8, 2};
    float *w = rand_vec((size_t)dim), *r = rand_vec((size_t)n * dim);
    for (int c = 0; c < 8; c++) {
        bool scatter = c & 1, resid = c & 2, strided = c & 4;
        int xs = strided ? dim + 9 : dim, ys = strided ? dim + 4 : dim;
        size_t ny = (size_t)(scatter ? rows : n) * ys;
        float *x = rand_vec((size_t)n * xs), *xr = out_buf((size_t)n * xs, x), *xg = out_buf((size_t)n * xs, x);
        float *yr = out_buf(ny, NULL), *yg = out_buf(ny, NULL);
        cpu_ref_ops.rmsnorm_rows(yr, ys, scatter ? di : NULL, xr, xs, resid ? r : NULL, w, n, dim, 1e-6f);
        G.rmsnorm_rows(&G, yg, ys, scatter ? di : NULL, xg, xs, resid ? r : NULL, w, n, dim, 1e-6f);
        check_close("rmsnorm_rows y", yg, yr, ny, 0);
        check_close("rmsnorm_rows x (the residual sum)", xg, xr, (size_t)n * xs, 0);
        if (!scatter && !resid) { /* y aliasing x */
            G.rmsnorm_rows(&G, xg, xs, NULL, xg, xs, NULL, w, n, dim, 1e-6f);
            cpu_ref_ops.rmsnorm_rows(xr, xs, NULL, xr, xs, NULL, w, n, dim, 1e-6f);
            check_close("rmsnorm_rows in place", xg, xr, (size_t)n * xs, 0);
        }
        free(x);
        free(xr);
        free(xg);
        free(yr);
        free(yg);
    }
    free(w);
    free(r);
}

/* Rotary tables for positions < 64 of rope/2 frequencies. */
static void tables(float *ct, float *st, int rope)
{
    for (int p = 0; p < 64; p++)
        for (int i = 0; i < rope / 2; i++) {
            double a = p * pow(10000.0, -2.0 * i / rope);
            ct[p * (rope / 2) + i] = (float)cos(a);
            st[p * (rope / 2) + i] = (float)sin(a);
        }
}

static void check_rope_copy(void)
{
    int n = 4, rope = 16, pos[4] = {3, 0, 41, 63}, di[4] = {5, 1, 2, 0}, rows = 6;
    float ct[64 * 8], st[64 * 8];
    tables(ct, st, rope);
    for (int nvec = 1; nvec <= 3; nvec += 2)
        for (int scatter = 0; scatter < 2; scatter++) {
            int ss = rope + 11, ds = rope + 2;
            size_t nd = (size_t)(scatter ? rows : n) * nvec * ds;
            float *src = rand_vec((size_t)n * nvec * ss), *ref = out_buf(nd, NULL), *got = out_buf(nd, NULL);
            cpu_ref_ops.rope_copy(ref, ds, scatter ? di : NULL, src + 3, ss, n, nvec, rope, pos, ct, st);
            G.rope_copy(&G, got, ds, scatter ? di : NULL, src + 3, ss, n, nvec, rope, pos, ct, st);
            check_close("rope_copy", got, ref, nd, 0);
            free(src);
            free(ref);
            free(got);
        }
}

/* The MLA steps: prologue, then absorb attention whole (generic and expanded)
 * against the reference's ops in sequence. One sequence in a cache of 2 x ctx
 * rows; the pass is positions p0 .. p0 + n - 1 of sequence 1, the rows before
 * p0 already written. */
static void check_mla(void)
{
    int H = 3, nope = 24, rope = 16, vd = 20, R = 64, qk = nope + rope, ctx = 48, p0 = 9, n = 30;
    float ct[64 * 8], st[64 * 8];
    tables(ct, st, rope);
    tweight wkv_b = make_weight(DS_W_FP8, H * (nope + vd), R);
    float *norm_w = rand_vec((size_t)R), *kvx = rand_vec((size_t)n * (R + rope)), *q = rand_vec((size_t)n * H * qk);
    float *kv = rand_vec((size_t)2 * ctx * R), *pe = rand_vec((size_t)2 * ctx * rope);
    float *kvg = out_buf((size_t)2 * ctx * R, kv), *peg = out_buf((size_t)2 * ctx * rope, pe);
    float *qp = out_buf((size_t)n * H * rope, NULL), *qpg = out_buf((size_t)n * H * rope, NULL);
    int seq[30], pos[30], row[30];
    for (int t = 0; t < n; t++) {
        seq[t] = 1;
        pos[t] = p0 + t;
        row[t] = ctx + p0 + t;
    }
    cpu_ref_ops.rmsnorm_rows(kv, R, row, kvx, R + rope, NULL, norm_w, n, R, 1e-6f);
    cpu_ref_ops.rope_copy(pe, rope, row, kvx + R, R + rope, n, 1, rope, pos, ct, st);
    cpu_ref_ops.rope_copy(qp, rope, NULL, q + nope, qk, n, H, rope, pos, ct, st);
    G.mla_prologue(&G, kvg, peg, row, kvx, norm_w, 1e-6f, qpg, q, n, H, qk, nope, R, rope, pos, ct, st);
    check_close("mla_prologue kv", kvg, kv, (size_t)2 * ctx * R, 0);
    check_close("mla_prologue pe", peg, pe, (size_t)2 * ctx * rope, 0);
    check_close("mla_prologue q_pe", qpg, qp, (size_t)n * H * rope, 0);

    float *qc = malloc(sizeof(float) * (size_t)n * H * R), *oc = malloc(sizeof(float) * (size_t)n * H * R);
    float *ref = out_buf((size_t)n * H * vd, NULL), *got = out_buf((size_t)n * H * vd, NULL);
    ds_attn_args a = {
        .n_tokens = n, .seq = seq, .pos = pos, .n_heads = H, .nope = nope, .rope = rope, .vdim = vd, .kv_rank = R,
        .softmax_scale = 0.17f, .q_c = qc, .q_pe = qp, .kv_cache = kv, .pe_cache = pe, .ctx = ctx, .out = oc,
        .contiguous = true, .seq0 = 1, .pos0 = p0, .pos_bound = p0 + n,
    };
    cpu_ref_ops.matmul_heads_t(qc, R, q, qk, n, H, &wkv_b.w, 0, nope + vd, nope);
    cpu_ref_ops.attention(&a, DS_ATTN_ABSORB);
    cpu_ref_ops.matmul_heads(ref, vd, oc, R, n, H, &wkv_b.w, nope, nope + vd, vd);
    a.q_c = NULL;
    a.out = got;
    G.mla_attend(&G, &a, &wkv_b.w, q, qk);
    check_close("mla_attend (absorb)", got, ref, (size_t)n * H * vd, 1e-5);
    /* the expanded form: other algebra, the same attention */
    ds_ops expand = g_bare;
    expand.attn_head_last = true;
    ds_backend X;
    backend_complete(&X, &expand, 1);
    for (int i = 0; i < n * H * vd + PAD; i++) got[i] = SENTINEL;
    X.mla_attend(&X, &a, &wkv_b.w, q, qk);
    check_close("mla_attend (expanded)", got, ref, (size_t)n * H * vd, 1e-4);
    CHECK_OK(X.status(&X));
    free_weight(&wkv_b);
    free(norm_w);
    free(kvx);
    free(q);
    free(kv);
    free(pe);
    free(kvg);
    free(peg);
    free(qp);
    free(qpg);
    free(qc);
    free(oc);
    free(ref);
    free(got);
}

/* A backend whose fused ops decline every call, and one whose normed products take it. */
static bool decline_attend(const ds_attn_args *a, const ds_weight *w, const float *q, int qk)
{
    (void)a, (void)w, (void)q, (void)qk;
    return false;
}

static bool decline_normed(const ds_matmul_job *j, int nj, ds_gemm_impl g, bool u, const float *h, const float *r,
                           const float *w, float eps)
{
    (void)j, (void)nj, (void)g, (void)u, (void)h, (void)r, (void)w, (void)eps;
    return false;
}

static bool decline_carry(float *y, const float *x, int n, const ds_weight *w, ds_gemm_impl g, bool u, float *h)
{
    (void)y, (void)x, (void)n, (void)w, (void)g, (void)u, (void)h;
    return false;
}

static bool take_normed(const ds_matmul_job *jobs, int nj, ds_gemm_impl g, bool u, const float *h, const float *r,
                        const float *w, float eps)
{
    int n = jobs[0].n, dim = jobs[0].w->cols;
    float *x = malloc(sizeof(float) * (size_t)n * dim), *hs = malloc(sizeof(float) * (size_t)n * dim);
    memcpy(hs, h, sizeof(float) * (size_t)n * dim);
    cpu_ref_ops.rmsnorm_rows(x, dim, NULL, hs, dim, r, w, n, dim, eps);
    for (int j = 0; j < nj; j++) cpu_ref_ops.matmul(jobs[j].y, x, n, jobs[j].w, jobs[j].row0, jobs[j].rows, g, u);
    free(x);
    free(hs);
    return true;
}

static void check_residual(void)
{
    int n = 3, dim = 100, rows = 60;
    size_t nd = (size_t)n * dim, nr = (size_t)n * rows;
    tweight w = make_weight(DS_W_BF16, rows, dim), wo = make_weight(DS_W_BF16, dim, rows);
    float *nw = rand_vec((size_t)dim), *h = rand_vec(nd), *r = rand_vec(nd), *o = rand_vec(nr);
    /* the reference: h1 = h + r; y = (rmsnorm(h1) * nw) W^T; d = wo(o); y0 = (rmsnorm(h1) * nw) W^T
     * again, from h1 with nothing to add */
    float *h1 = out_buf(nd, h), *x = malloc(sizeof(float) * nd), *yr = out_buf(nr, NULL), *dr = out_buf(nd, NULL);
    cpu_ref_ops.rmsnorm_rows(x, dim, NULL, h1, dim, r, nw, n, dim, 1e-6f);
    cpu_ref_ops.matmul(yr, x, n, &w.w, 0, rows, DS_GEMM_BF16, false);
    cpu_ref_ops.matmul(dr, o, n, &wo.w, 0, dim, DS_GEMM_BF16, false);
    for (int mode = 0; mode < 3; mode++) { /* generic, declined, taken */
        ds_ops t = g_bare;
        if (mode == 1) {
            t.mla_attend = decline_attend;
            t.matmul_many_normed = decline_normed;
            t.matmul_carry = decline_carry;
        } else if (mode == 2) {
            t.matmul_many_normed = take_normed;
        }
        ds_backend B;
        backend_complete(&B, &t, 0);
        float *hg = out_buf(nd, h), *d = out_buf(nd, r), *y = out_buf(nr, NULL);
        ds_matmul_job job = {y, NULL, n, &w.w, 0, rows};
        bool due = B.matmul_many_normed(&B, &job, 1, DS_GEMM_BF16, false, hg, d, nw, 1e-6f);
        CHECK_MSG(due == (mode == 2), "matmul_many_normed mode %d: due %d", mode, (int)due);
        check_close("matmul_many_normed", y, yr, nr, 0);
        check_close(due ? "h while the add is due" : "h after the add", hg, due ? h : h1, nd, 0);
        B.matmul_carry(&B, d, o, n, &wo.w, DS_GEMM_BF16, false, due ? hg : NULL);
        check_close("matmul_carry h", hg, h1, nd, 0);
        check_close("matmul_carry y", d, dr, nd, 0);
        /* nothing to add: rmsnorm(h) */
        float *y0 = out_buf(nr, NULL);
        cpu_ref_ops.rmsnorm(x, h1, nw, n, dim, 1e-6f);
        cpu_ref_ops.matmul(y0, x, n, &w.w, 0, rows, DS_GEMM_BF16, false);
        job.y = y;
        CHECK(!B.matmul_many_normed(&B, &job, 1, DS_GEMM_BF16, false, hg, NULL, nw, 1e-6f));
        check_close("matmul_many_normed without r", y, y0, nr, 0);
        check_close("h without r", hg, h1, nd, 0);
        CHECK_OK(B.status(&B));
        free(y0);
        free(hg);
        free(d);
        free(y);
    }
    free_weight(&w);
    free_weight(&wo);
    free(nw);
    free(h);
    free(r);
    free(o);
    free(h1);
    free(x);
    free(yr);
    free(dr);
}

static void *no_scratch(size_t bytes)
{
    (void)bytes;
    return NULL;
}

/* A generic op without scratch: nothing written, the failure reported once. */
static void check_status(void)
{
    ds_ops t = g_bare;
    t.alloc_scratch = no_scratch;
    ds_backend B;
    backend_complete(&B, &t, 0);
    tweight w = make_weight(DS_W_F32, 40, 30);
    float *x = rand_vec(2 * 30), *y = out_buf(2 * 40, NULL);
    B.matmul_heads(&B, y, 20, x, 15, 2, 2, &w.w, 0, 20, 20);
    CHECK(y[0] == SENTINEL && sentinels_ok(y, 2 * 40));
    CHECK(B.status(&B) == DS_ERR_NOMEM);
    CHECK_MSG(strstr(ds_last_error(), "matmul_heads") != NULL, "message: %s", ds_last_error());
    CHECK_OK(B.status(&B));
    free_weight(&w);
    free(x);
    free(y);
}

int main(void)
{
    g_bare = required_only();
    backend_complete(&G, &g_bare, 0);
    check_matmul_many();
    check_heads();
    check_moe();
    check_rmsnorm_rows();
    check_rope_copy();
    check_mla();
    check_residual();
    check_status();
    CHECK_OK(G.status(&G));
    return t_done("fallback");
}
