/* test_trained.c - the engine on the trained checkpoint models/dsv3-mini against
 * the PyTorch model's logits that tools/train/train.py saved with it
 * (models/dsv3-mini/ref/ref_logits.safetensors: float64 logits of the exported
 * weights, FP8 dequantised exactly as the engine reads them, at chosen positions
 * of three held-out sequences; models/dsv3-mini/ref/README.md).
 *
 * bf16 GEMM path (float32 activations), absorb and naive attention, each
 * sequence as one prefill and one token at a time through the KV cache: per
 * row max |engine - ref| <= 1e-3 max |ref| and the same argmax. FP8 GEMM path
 * (activations quantised per 128-block to e4m3): mean cosine >= 0.99 per
 * sequence; the argmax agreement is printed. The MTP module's reference rows
 * are only checked for presence: the engine does not run MTP. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "model/model.h"
#include "test.h"

#ifndef DSV3_TRAINED_DIR
#define DSV3_TRAINED_DIR "models/dsv3-mini"
#endif

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

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

/* n tokens through a fresh cache as one prefill or one at a time; n x V logits. */
static float *run(ds_model *m, const int32_t *tok, int n, bool stepwise)
{
    int V = m->cfg.vocab_size;
    float *out = calloc((size_t)n * V, sizeof(float));
    int *seq = calloc((size_t)n, sizeof(int)), *pos = malloc(sizeof(int) * (size_t)n);
    bool *want = malloc((size_t)n);
    ds_kvcache *kv = NULL;
    if (!out || !seq || !pos || !want) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        want[i] = true;
    }
    CHECK_OK(kvcache_new(&kv, m, 1, n));
    if (kv && stepwise) {
        for (int i = 0; i < n; i++) CHECK_OK(model_forward(m, kv, 1, tok + i, seq, pos + i, want, out + (size_t)i * V));
    } else if (kv) {
        CHECK_OK(model_forward(m, kv, n, tok, seq, pos, want, out));
    }
    kvcache_free(kv);
    free(seq);
    free(pos);
    free(want);
    return out;
}

static const st_tensor *need(const st_file *ref, const char *seq, const char *what, st_dtype dt)
{
    char key[128];
    snprintf(key, sizeof key, "%s/%s", seq, what);
    const st_tensor *t = st_find(ref, key);
    CHECK_MSG(t && t->dtype == dt, "%s missing from the reference file or not %s", key, st_dtype_name(dt));
    return t && t->dtype == dt ? t : NULL;
}

int main(void)
{
    const char *dir = DSV3_TRAINED_DIR;
    char path[4096];
    ds_config cfg;
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK_OK(config_load(&cfg, path));
    st_file *ref = NULL;
    snprintf(path, sizeof path, "%s/ref/ref_logits.safetensors", dir);
    CHECK_OK(st_open(&ref, path));
    if (t_failures) return t_done("train_trained");
    const int V = cfg.vocab_size;
    static const char *const seqs[] = {"s24", "s64", "chat160"};
    struct { const char *label; ds_attn_impl attn; ds_gemm_impl gemm; } modes[] = {
        {"absorb", DS_ATTN_ABSORB, DS_GEMM_BF16},
        {"naive", DS_ATTN_NAIVE, DS_GEMM_BF16},
        {"fp8gemm", DS_ATTN_ABSORB, DS_GEMM_FP8},
    };
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
        ds_model *m = NULL;
        ds_model_opts o = {.attn = modes[mi].attn, .gemm = modes[mi].gemm};
        CHECK_OK(model_load(&m, dir, &cfg, &o));
        if (!m) break;
        bool fp8 = modes[mi].gemm == DS_GEMM_FP8;
        for (size_t si = 0; si < sizeof seqs / sizeof *seqs; si++) {
            const st_tensor *tt = need(ref, seqs[si], "tokens", ST_I32), *rt = need(ref, seqs[si], "rows", ST_I32);
            const st_tensor *lt = need(ref, seqs[si], "logits", ST_F32);
            const st_tensor *mt = need(ref, seqs[si], "mtp_logits", ST_F32);
            if (!tt || !rt || !lt || !mt) continue;
            int n = (int)tt->numel, rows = (int)rt->numel;
            CHECK(lt->ndim == 2 && lt->shape[0] == rows && lt->shape[1] == V);
            CHECK(mt->ndim == 2 && mt->shape[1] == V);
            const int32_t *tok = tt->data, *row = rt->data;
            const float *want = lt->data;
            for (int stepwise = 0; stepwise < 2; stepwise++) {
                float *got = run(m, tok, n, stepwise);
                int bad = 0, bad_arg = 0;
                double worst = 0, cos_sum = 0, cos_min = 1;
                for (int r = 0; r < rows; r++) {
                    CHECK(row[r] >= 0 && row[r] < n);
                    if (row[r] < 0 || row[r] >= n) continue;
                    const float *g = got + (size_t)row[r] * V, *e = want + (size_t)r * V;
                    float mx = 0, err = 0;
                    for (int i = 0; i < V; i++) {
                        mx = fmaxf(mx, fabsf(e[i]));
                        err = fmaxf(err, fabsf(g[i] - e[i]));
                    }
                    worst = fmax(worst, err / mx);
                    bad += err > 1e-3f * mx;
                    bad_arg += argmax(g, V) != argmax(e, V);
                    double c = cosine(g, e, V);
                    cos_sum += c;
                    cos_min = fmin(cos_min, c);
                }
                char label[64];
                snprintf(label, sizeof label, "%s %s %s", modes[mi].label, seqs[si], stepwise ? "stepwise" : "prefill");
                printf("%-30s rows %3d  max rel err %.2e  mean cosine %.6f (min %.6f)  argmax mismatches %d\n", label,
                       rows, worst, cos_sum / rows, cos_min, bad_arg);
                if (fp8) {
                    CHECK_MSG(cos_sum / rows >= 0.99, "%s: mean cosine %.6f < 0.99", label, cos_sum / rows);
                } else {
                    CHECK_MSG(bad == 0, "%s: %d rows exceed 1e-3 relative error (worst %.3g)", label, bad, worst);
                    CHECK_MSG(bad_arg == 0, "%s: %d rows with a different argmax", label, bad_arg);
                }
                free(got);
            }
        }
        model_free(m);
    }
    st_close(ref);
    return t_done("train_trained");
}
