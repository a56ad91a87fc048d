/* test_mtp.c - the engine's multi-token-prediction module (ds_decode_mtp) on
 * the trained checkpoint models/dsv3-mini against the PyTorch model's MTP
 * logits that tools/train/train.py saved (ref_logits.safetensors NAME/mtp_rows,
 * NAME/mtp_logits: float64, FP8 weights dequantised as the engine reads them;
 * models/dsv3-mini/ref/README.md).
 *
 * bf16 GEMM path (float32 activations): per row max |engine - ref| <= 1e-3
 * max |ref| and the same argmax, for
 *  - prefill: the sequence in one ds_decode, then one MTP batch of positions
 *    0..n-2 (absorb and naive attention; the HF directory and `convert
 *    --keep-mtp` output);
 *  - stepwise: one token per ds_decode, each followed by the MTP row of that
 *    position, so the MTP block reads its KV-cache layer across calls;
 *  - rollback: after a prefill, the slot forked into a second one at length k
 *    and truncated to k, then positions k.. of both decoded again in one
 *    batch: the MTP rows below k must survive truncate and fork.
 * FP8 GEMM path: mean cosine >= 0.99 per sequence; the figures are printed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv3.h"
#include "io/convert.h"
#include "io/safetensors.h"
#include "test.h"

#ifndef DSV3_TRAINED_DIR
#define DSV3_TRAINED_DIR "models/dsv3-mini"
#endif

enum { PREFILL, STEPWISE, ROLLBACK };
static const char *const k_how[] = {"prefill", "stepwise", "rollback"};

static double cosine(const float *a, const float *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

/* Copies the last ds_decode_mtp's k rows into out at the rows' positions pos0... */
static void take_rows(const ds_engine *e, int k, const int *pos, float *out, int V)
{
    for (int i = 0; i < k; i++) {
        const float *r = ds_mtp_logits(e, i);
        CHECK(r != NULL);
        if (r) memcpy(out + (size_t)pos[i] * V, r, sizeof(float) * (size_t)V);
    }
}

/* MTP logits of every position 0..n-2 of tok (n x V, row i predicting tok[i+2]),
 * as `how` says; for ROLLBACK, out2 receives the forked slot's rows. */
static void run(ds_engine *e, const int32_t *tok, int n, int how, float *out, float *out2)
{
    int V = ds_engine_n_vocab(e);
    int *idx = malloc(sizeof(int) * (size_t)n * 2), *pos = malloc(sizeof(int) * (size_t)n * 2);
    int32_t *nx = malloc(sizeof(int32_t) * (size_t)n * 2), *bt = malloc(sizeof(int32_t) * (size_t)n * 2);
    int *bs = malloc(sizeof(int) * (size_t)n * 2);
    if (!idx || !pos || !nx || !bt || !bs) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (int q = 0; q < ds_engine_n_seq(e); q++) CHECK_OK(ds_seq_truncate(e, q, 0));
    if (how == STEPWISE) {
        for (int i = 0; i < n - 1; i++) {
            ds_batch b = {1, tok + i, NULL, NULL};
            CHECK_OK(ds_decode(e, &b));
            int zero = 0;
            ds_mtp_batch mb = {1, &zero, tok + i + 1};
            CHECK_OK(ds_decode_mtp(e, &mb));
            take_rows(e, 1, &i, out, V);
        }
    } else {
        ds_batch b = {n, tok, NULL, NULL};
        CHECK_OK(ds_decode(e, &b));
        for (int i = 0; i < n - 1; i++) idx[i] = pos[i] = i;
        ds_mtp_batch mb = {n - 1, idx, tok + 1};
        CHECK_OK(ds_decode_mtp(e, &mb));
        take_rows(e, n - 1, pos, out, V);
    }
    if (how == ROLLBACK) {
        /* slot 1 = slot 0's first k positions (main and MTP rows), slot 0 cut to k;
         * then positions k..n-1 of both in one batch, the MTP rows of k..n-2 */
        int k = n / 2, m = n - k;
        CHECK_OK(ds_seq_fork(e, 1, 0, k));
        CHECK_OK(ds_seq_truncate(e, 0, k));
        for (int i = 0; i < m; i++) {
            bt[2 * i] = bt[2 * i + 1] = tok[k + i];
            bs[2 * i] = 0;
            bs[2 * i + 1] = 1;
        }
        ds_batch b = {2 * m, bt, bs, NULL};
        CHECK_OK(ds_decode(e, &b));
        memset(out + (size_t)k * V, 0, sizeof(float) * (size_t)(n - k) * V);
        for (int r = 0; r < 2; r++) {
            for (int i = 0; i < m - 1; i++) {
                idx[i] = 2 * i + r;
                nx[i] = tok[k + i + 1];
                pos[i] = k + i;
            }
            ds_mtp_batch mb = {m - 1, idx, nx};
            CHECK_OK(ds_decode_mtp(e, &mb));
            take_rows(e, m - 1, pos, r ? out2 : out, V);
        }
        memcpy(out2, out, sizeof(float) * (size_t)k * V); /* below k: what slot 1 was forked from */
    }
    free(idx);
    free(pos);
    free(nx);
    free(bt);
    free(bs);
}

static const st_tensor *need(const st_file *ref, const char *seq, const char *what, st_dtype dt)
{
    char key[128];
    snprintf(key, sizeof key, "%s/%s", seq, what);
    const st_tensor *t = st_find(ref, key);
    CHECK_MSG(t && t->dtype == dt, "%s missing from the reference file or not %s", key, st_dtype_name(dt));
    return t && t->dtype == dt ? t : NULL;
}

/* Compares the rows of got (n x V, by position) with the reference; returns the mean cosine. */
static double compare(const char *label, const float *got, const st_tensor *rt, const st_tensor *mt, int n, int V,
                      bool fp8)
{
    int rows = (int)rt->numel, bad = 0, bad_arg = 0;
    const int32_t *row = rt->data;
    const float *want = mt->data;
    double worst = 0, cos_sum = 0, cos_min = 1;
    for (int r = 0; r < rows; r++) {
        CHECK(row[r] >= 0 && row[r] <= n - 2);
        if (row[r] < 0 || row[r] > n - 2) continue;
        const float *g = got + (size_t)row[r] * V, *e = want + (size_t)r * V;
        float mx = 0, err = 0;
        for (int i = 0; i < V; i++) {
            mx = fmaxf(mx, fabsf(e[i]));
            err = fmaxf(err, fabsf(g[i] - e[i]));
        }
        worst = fmax(worst, err / mx);
        bad += !(err <= 1e-3f * mx);
        bad_arg += ds_argmax(g, V) != ds_argmax(e, V);
        double c = cosine(g, e, V);
        cos_sum += c;
        cos_min = fmin(cos_min, c);
    }
    printf("%-36s rows %3d  max rel err %.2e  mean cosine %.6f (min %.6f)  argmax mismatches %d\n", label, rows,
           worst, cos_sum / rows, cos_min, bad_arg);
    if (fp8) {
        CHECK_MSG(cos_sum / rows >= 0.99, "%s: mean cosine %.6f < 0.99", label, cos_sum / rows);
    } else {
        CHECK_MSG(bad == 0, "%s: %d rows exceed 1e-3 relative error (worst %.3g)", label, bad, worst);
        CHECK_MSG(bad_arg == 0, "%s: %d rows with a different argmax", label, bad_arg);
    }
    return cos_sum / rows;
}

/* ds_decode_mtp_chain: a pass continues the last MTP pass's rows one position
 * on; sources out of range, given twice, a token outside the vocabulary or a
 * position past the context are refused, and a refused call leaves nothing to
 * chain from. */
static void chain_errors(ds_engine *e)
{
    int32_t t[4] = {1, 5, 9, 13};
    int idx[3] = {0, 1, 2}, V = ds_engine_n_vocab(e);
    ds_batch b = {4, t, NULL, NULL};
    CHECK_OK(ds_seq_truncate(e, 0, 0));
    CHECK_OK(ds_decode(e, &b));
    ds_mtp_batch mb = {3, idx, t + 1};
    CHECK_OK(ds_decode_mtp(e, &mb));
    int from[2] = {2, 0};
    int32_t next[2] = {17, 21};
    CHECK_OK(ds_decode_mtp_chain(e, 2, from, next));
    CHECK(ds_n_mtp_logits(e) == 2 && ds_mtp_logits(e, 1) && !ds_mtp_logits(e, 2));
    int bad_from[2] = {0, 2}; /* the last pass had 2 rows */
    CHECK(ds_decode_mtp_chain(e, 2, bad_from, next) == DS_ERR_RANGE && strstr(ds_last_error(), "source 2"));
    CHECK(ds_n_mtp_logits(e) == 0);
    CHECK_OK(ds_decode_mtp(e, &mb));
    int twice[2] = {1, 1};
    CHECK(ds_decode_mtp_chain(e, 2, twice, next) == DS_ERR_ARG && strstr(ds_last_error(), "twice"));
    CHECK_OK(ds_decode_mtp(e, &mb));
    int32_t far[1] = {V};
    CHECK(ds_decode_mtp_chain(e, 1, from, far) == DS_ERR_RANGE && strstr(ds_last_error(), "vocabulary"));
    CHECK(ds_decode_mtp_chain(e, 0, from, next) == DS_ERR_ARG);
    /* chained up to the context's end: the next position is refused */
    CHECK_OK(ds_decode_mtp(e, &mb));
    int zero = 0, n_ctx = ds_engine_n_ctx(e);
    ds_status s = DS_OK;
    int done = 0;
    while (done <= n_ctx && !(s = ds_decode_mtp_chain(e, 1, &zero, next))) done++;
    CHECK(s == DS_ERR_RANGE && strstr(ds_last_error(), "past the context"));
    CHECK_MSG(done == n_ctx - 1, "%d chained rows", done); /* from position 0: rows 1 .. n_ctx - 1 */
    CHECK_OK(ds_seq_truncate(e, 0, 0));
}

int main(void)
{
    const char *dir = DSV3_TRAINED_DIR;
    char path[4096];
    st_file *ref = NULL;
    snprintf(path, sizeof path, "%s/ref/ref_logits.safetensors", dir);
    CHECK_OK(st_open(&ref, path));
    if (t_failures) return t_done("train_mtp");

    /* convert --keep-mtp output, and one without the module */
    char tmp[4096], conv[4200], plain[4200];
    snprintf(tmp, sizeof tmp, "%s", t_tmpdir("train_mtp"));
    snprintf(conv, sizeof conv, "%s/mtp", tmp);
    snprintf(plain, sizeof plain, "%s/plain", tmp);
    convert_opts co = {.hf_dir = dir, .save_dir = conv, .n_experts = 16, .mp = 1, .keep_mtp = true};
    CHECK_OK(convert_checkpoint(&co));
    co.save_dir = plain;
    co.keep_mtp = false;
    CHECK_OK(convert_checkpoint(&co));

    /* the module is off by default, and asked for where it is not, a clear error */
    ds_engine_params p = ds_engine_default_params();
    p.device = "cpu";
    p.no_tokenizer = true;
    ds_engine *e = NULL;
    CHECK_OK(ds_engine_load(dir, &p, &e));
    if (e) {
        CHECK(!ds_engine_has_mtp(e));
        int32_t t = 1;
        int zero = 0;
        ds_batch b = {1, &t, NULL, NULL};
        CHECK_OK(ds_decode(e, &b));
        ds_mtp_batch mb = {1, &zero, &t};
        CHECK(ds_decode_mtp(e, &mb) == DS_ERR_ARG && strstr(ds_last_error(), "mtp"));
        ds_engine_free(e);
    }
    p.mtp = true;
    CHECK(ds_engine_load(plain, &p, &e) == DS_ERR_FORMAT && e == NULL && strstr(ds_last_error(), "eh_proj"));
    printf("without the module: %s\n", ds_last_error());

    static const char *const seqs[] = {"s24", "s64", "chat160"};
    struct { const char *label, *dir; ds_attention_impl attn; ds_matmul_impl mm; int how; } modes[] = {
        {"absorb", dir, DS_ATTENTION_ABSORB, DS_MATMUL_BF16, PREFILL},
        {"absorb", dir, DS_ATTENTION_ABSORB, DS_MATMUL_BF16, STEPWISE},
        {"absorb", dir, DS_ATTENTION_ABSORB, DS_MATMUL_BF16, ROLLBACK},
        {"naive", dir, DS_ATTENTION_NAIVE, DS_MATMUL_BF16, PREFILL},
        {"converted", conv, DS_ATTENTION_ABSORB, DS_MATMUL_BF16, PREFILL},
        {"fp8gemm", dir, DS_ATTENTION_ABSORB, DS_MATMUL_FP8, PREFILL},
    };
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
        p.attention = modes[mi].attn;
        p.matmul = modes[mi].mm;
        p.n_seq = 2;
        p.n_ctx = 256;
        e = NULL;
        CHECK_OK(ds_engine_load(modes[mi].dir, &p, &e));
        if (!e) break;
        CHECK(ds_engine_has_mtp(e));
        int V = ds_engine_n_vocab(e);
        bool fp8 = modes[mi].mm == DS_MATMUL_FP8;
        for (size_t si = 0; si < sizeof seqs / sizeof *seqs; si++) {
            const st_tensor *tt = need(ref, seqs[si], "tokens", ST_I32), *rt = need(ref, seqs[si], "mtp_rows", ST_I32);
            const st_tensor *mt = need(ref, seqs[si], "mtp_logits", ST_F32);
            if (!tt || !rt || !mt) continue;
            int n = (int)tt->numel;
            CHECK(mt->ndim == 2 && mt->shape[0] == (int64_t)rt->numel && mt->shape[1] == V);
            float *got = calloc((size_t)n * V, sizeof(float)), *got2 = calloc((size_t)n * V, sizeof(float));
            if (!got || !got2) return 2;
            run(e, tt->data, n, modes[mi].how, got, got2);
            char label[96];
            snprintf(label, sizeof label, "%s %s %s", modes[mi].label, seqs[si], k_how[modes[mi].how]);
            compare(label, got, rt, mt, n, V, fp8);
            if (modes[mi].how == ROLLBACK) {
                snprintf(label, sizeof label, "%s %s rollback (fork)", modes[mi].label, seqs[si]);
                compare(label, got2, rt, mt, n, V, fp8);
            }
            free(got);
            free(got2);
        }
        if (modes[mi].how == PREFILL && !fp8 && !strcmp(modes[mi].label, "absorb")) chain_errors(e);
        ds_engine_free(e);
    }
    st_close(ref);
    t_system("rm -rf '%s'", tmp);
    return t_done("train_mtp");
}
