/* test_golden.c - the model against DeepSeek's reference logits
 * (golden/ref_logits.safetensors, made by the reference model.py on the tiny
 * FP8 checkpoint golden/tiny_hf).
 *
 * absorb and naive, bf16 GEMM path: every position of s8, s40, s200, both as
 * one prefill pass (logits at every position) and one token at a time through
 * the KV cache: max |engine - ref| <= 1e-3 max |ref| per row, same argmax.
 * FP8 GEMM path: mean cosine >= 0.9 against the fp8gemm rows (FP8 activation
 * quantisation makes this random network chaotic; see the golden README).
 * On s40 (absorb) also model_forward_pick against the host sampler (pick_check.h).
 * The absorb and naive rows again through the fast backend without its batched
 * ops (host loops) and with its required ops only: the generic ops of
 * backend/fallback.c in the model.
 *
 * Flags (tests/model/tests.cmake runs the variants): --expand-min N (prefill
 * passes from N tokens in the expanded attention form), --cpu-isa avx2 (the
 * AVX2 kernels on an AVX-512 machine), --poison-scratch (scratch filled with
 * NaN bytes). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"

#include "model/golden_run.h"
#include "model/model.h"
#include "test.h"

static void compare_exact(const char *label, const float *got, const float *ref, int rows, int V)
{
    int bad = 0, bad_arg = 0;
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        const float *g = got + (size_t)r * V, *e = ref + (size_t)r * V;
        float mx = 0, err = 0;
        for (int i = 0; i < V; i++) {
            mx = fmaxf(mx, fabsf(e[i]));
            err = fmaxf(err, fabsf(g[i] - e[i]));
        }
        if (err / mx > worst) worst = err / mx;
        bad += err > 1e-3f * mx;
        bad_arg += golden_argmax(g, V) != golden_argmax(e, V);
    }
    printf("%-28s rows %3d  max rel err %.2e  argmax mismatches %d\n", label, rows, worst, bad_arg);
    CHECK_MSG(bad == 0, "%s: %d rows exceed 1e-3 relative error (worst %.3g)", label, bad, worst);
    CHECK_MSG(bad_arg == 0, "%s: %d rows with a different argmax", label, bad_arg);
}

int main(int argc, char **argv)
{
    cpu_tuning ct = cpu_tuning_default();
    ds_tuning tune = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--expand-min") && i + 1 < argc) tune.expand_min = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu-isa") && i + 1 < argc && !strcmp(argv[i + 1], "avx2")) ct.isa = CPU_ISA_AVX2, i++;
        else if (!strcmp(argv[i], "--poison-scratch")) ct.poison_scratch = true;
        else {
            fprintf(stderr, "usage: %s [--expand-min N] [--cpu-isa avx2] [--poison-scratch]\n", argv[0]);
            return 2;
        }
    }
    const ds_ops *base = cpu_backend_tuned(&ct);
    ds_config cfg;
    CHECK_OK(config_load(&cfg, t_golden("config_tiny.json")));
    st_file *ref;
    CHECK_OK(st_open(&ref, t_golden("ref_logits.safetensors")));
    json_error_t je;
    json_t *seqs = json_load_file(t_golden("sequences.json"), 0, &je);
    CHECK(seqs != NULL);
    if (t_failures) return t_done("golden");
    /* host_loops: the fast backend without its batched heads, experts and multi-matrix ops:
     * the generic loops over heads and experts (backend/fallback.c) */
    ds_ops loops = *base;
    loops.matmul_heads = NULL;
    loops.matmul_heads_t = NULL;
    loops.moe_experts = NULL;
    loops.matmul_many = NULL;
    /* required: the fast backend's required ops only; every optional op generic */
    ds_ops required = loops;
    required.alloc_scratch = NULL;
    required.moe_gate = NULL;
    required.rmsnorm_rows = NULL;
    required.rope_copy = NULL;
    required.mla_prologue = NULL;
    required.mla_attend = NULL;
    required.matmul_many_normed = NULL;
    required.matmul_carry = NULL;
    struct { const char *row, *label; ds_attn_impl attn; ds_gemm_impl gemm; bool ue8m0; const ds_ops *ops; } modes[] = {
        {"absorb", "absorb", DS_ATTN_ABSORB, DS_GEMM_BF16, false, base},
        {"naive", "naive", DS_ATTN_NAIVE, DS_GEMM_BF16, false, base},
        {"fp8gemm", "fp8gemm", DS_ATTN_ABSORB, DS_GEMM_FP8, false, base},
        {"fp8gemm_ue8m0", "fp8gemm_ue8m0", DS_ATTN_ABSORB, DS_GEMM_FP8, true, base},
        {"absorb", "absorb (host loops)", DS_ATTN_ABSORB, DS_GEMM_BF16, false, &loops},
        {"absorb", "absorb (required ops)", DS_ATTN_ABSORB, DS_GEMM_BF16, false, &required},
        {"naive", "naive (required ops)", DS_ATTN_NAIVE, DS_GEMM_BF16, false, &required},
    };
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
        ds_model *m;
        ds_model_opts o = {.attn = modes[mi].attn, .gemm = modes[mi].gemm, .ops = modes[mi].ops, .tune = tune};
        ds_config c = cfg;
        c.scale_ue8m0 = modes[mi].ue8m0;
        CHECK_OK(model_load(&m, t_golden("tiny_hf"), &c, &o));
        if (t_failures) break;
        golden_mode md = {modes[mi].row, modes[mi].label, modes[mi].gemm == DS_GEMM_FP8};
        golden_sequences(m, ref, seqs, &md, compare_exact, mi == 0, true, NULL);
        model_free(m);
    }
    json_decref(seqs);
    st_close(ref);
    return t_done("golden");
}
