/* test_cuda_golden.c - the model on the CUDA backend against DeepSeek's
 * reference logits (golden/ref_logits.safetensors, tiny FP8 checkpoint
 * golden/tiny_hf), as tests/model/test_golden.c does on the CPU.
 *
 * absorb and naive, bf16 GEMM path, every position of s8, s40, s200, as one
 * prefill and stepwise through the KV cache, against that mode's rows: at
 * every position max |gpu - ref| <= 2e-2 max |ref| and cosine >= 0.999, and
 * the same argmax wherever the reference's top two differ by more than 1e-2.
 * FP8 GEMM path (default and ue8m0 scales): mean cosine >= 0.9 against the
 * fp8gemm rows, as on the CPU (FP8 activations make this random net chaotic).
 * On s40 (absorb) also model_forward_pick, picked on the device, against the host
 * sampler on the same step's logits (pick_check.h).
 *
 *   test_cuda_golden [default | nan-scratch | expanded | attend-long]
 *
 * The argument picks the backend's tuning for the whole run: nan-scratch fills
 * every new scratch buffer with NaN bytes (no reader relies on what it did not
 * write), expanded takes every contiguous pass of 16+ tokens in the expanded
 * attention form, attend-long every decode step of 1..8 tokens in mla_attend's
 * long form (by default only single tokens past position 1024, which the golden
 * sequences never reach). scripts/gpu_check.sh runs all four.
 * Exits 0 with "skipped: no GPU" when there is no CUDA device. */
#include <jansson.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_backend.h"
#include "base/clock.h"
#include "model/golden_run.h"
#include "model/model.h"
#include "test.h"

/* The reference's gap between its largest and second largest logit. */
static float top2_gap(const float *x, int n)
{
    float m1 = -INFINITY, m2 = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] > m1) {
            m2 = m1;
            m1 = x[i];
        } else if (x[i] > m2) {
            m2 = x[i];
        }
    }
    return m1 - m2;
}

static void status_ok(void) { CHECK_OK(cuda_backend_status()); }

static void compare_close(const char *label, const float *got, const float *ref, int rows, int V)
{
    int bad_err = 0, bad_cos = 0, bad_arg = 0, checked_arg = 0;
    double worst = 0, min_cos = 1;
    for (int r = 0; r < rows; r++) {
        const float *g = got + (size_t)r * V, *e = ref + (size_t)r * V;
        float mx = 0, err = 0;
        for (int i = 0; i < V; i++) {
            mx = fmaxf(mx, fabsf(e[i]));
            err = fmaxf(err, fabsf(g[i] - e[i]));
        }
        double c = golden_cosine(g, e, V);
        if (!(err <= 2e-2f * mx)) bad_err++;
        if (!(c >= 0.999)) bad_cos++;
        if (err / mx > worst || err != err) worst = err / mx;
        if (c < min_cos || c != c) min_cos = c;
        if (top2_gap(e, V) > 1e-2f) {
            checked_arg++;
            bad_arg += golden_argmax(g, V) != golden_argmax(e, V);
        }
    }
    printf("%-30s rows %3d  max err/max|ref| %.2e  min cosine %.7f  argmax %d/%d same\n", label, rows, worst,
           min_cos, checked_arg - bad_arg, checked_arg);
    CHECK_MSG(bad_err == 0, "%s: %d rows exceed 2e-2 of the largest logit (worst %.3g)", label, bad_err, worst);
    CHECK_MSG(bad_cos == 0, "%s: %d rows with cosine below 0.999 (min %.6f)", label, bad_cos, min_cos);
    CHECK_MSG(bad_arg == 0, "%s: %d rows with a different argmax", label, bad_arg);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "default";
    cuda_tuning tune = cuda_tuning_default();
    if (!strcmp(mode, "nan-scratch")) {
        tune.scratch_fill = -1;
    } else if (!strcmp(mode, "expanded")) {
        tune.expand_min = -1;
    } else if (!strcmp(mode, "attend-long")) {
        tune.attend_max_pos = 0;
        tune.attend_long = 8;
    } else if (strcmp(mode, "default") != 0) {
        fprintf(stderr, "usage: test_cuda_golden [default | nan-scratch | expanded | attend-long]\n");
        return 2;
    }
    if (cuda_device_count() == 0) {
        printf("test_cuda_golden: skipped: no GPU\n");
        return 0;
    }
    const ds_ops *ops = cuda_backend();
    CHECK_MSG(ops != NULL, "cuda_backend: %s", ds_last_error());
    cuda_backend_set_tuning(&tune);
    printf("tuning: %s\n", mode);
    ds_config cfg;
    CHECK_OK(config_load(&cfg, t_golden("config_tiny.json")));
    st_file *ref = NULL;
    CHECK_OK(st_open(&ref, t_golden("ref_logits.safetensors")));
    json_error_t je;
    json_t *seqs = json_load_file(t_golden("sequences.json"), 0, &je);
    CHECK(seqs != NULL);
    if (t_failures) return t_done("cuda_golden");
    struct { const char *row; ds_attn_impl attn; ds_gemm_impl gemm; bool ue8m0; } modes[] = {
        {"absorb", DS_ATTN_ABSORB, DS_GEMM_BF16, false},
        {"naive", DS_ATTN_NAIVE, DS_GEMM_BF16, false},
        {"fp8gemm", DS_ATTN_ABSORB, DS_GEMM_FP8, false},
        {"fp8gemm_ue8m0", DS_ATTN_ABSORB, DS_GEMM_FP8, true},
    };
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
        ds_model *m = NULL;
        ds_model_opts o = {.attn = modes[mi].attn, .gemm = modes[mi].gemm, .ops = ops};
        ds_config c = cfg;
        c.scale_ue8m0 = modes[mi].ue8m0;
        CHECK_OK(model_load(&m, t_golden("tiny_hf"), &c, &o));
        if (t_failures) break;
        double t0 = ds_now();
        golden_mode md = {modes[mi].row, modes[mi].row, modes[mi].gemm == DS_GEMM_FP8};
        golden_sequences(m, ref, seqs, &md, compare_close, mi == 0, false, status_ok); /* picks on the device */
        printf("%-14s %.2f s on the GPU (s8+s40+s200, prefill and stepwise), %.1f MiB of weights cached\n",
               modes[mi].row, ds_now() - t0, cuda_weight_bytes() / 1048576.0);
        model_free(m);
        cuda_forget_weights();
    }
    json_decref(seqs);
    st_close(ref);
    return t_done("cuda_golden");
}
