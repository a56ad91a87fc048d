/* cmd_logits.c - `dsv3 logits`: the model's logits for a token sequence, as an
 * F32 safetensors tensor "logits" of shape (positions, vocab). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cmds.h"
#include "dsv3.h"

#define USAGE "--ckpt-path DIR [--config FILE] --tokens 1,2,3 --out FILE [--all] [--stepwise] " \
              "[--attn-impl absorb|naive] [--gemm-impl bf16|fp8] [--device cpu|cuda|auto] [--ref-kernels]"

int cmd_logits(int argc, char **argv)
{
    const char *ckpt = NULL, *config = NULL, *tokens = NULL, *out = NULL, *attn = "absorb", *gemm = "bf16";
    const char *device = "auto";
    bool all = false, stepwise = false, ref = false, check = false;
    int threads = 0;
    arg_spec specs[] = {
        {"--ckpt-path", ARG_STR, &ckpt, true, "DIR  checkpoint (converted, or Hugging Face layout)"},
        {"--config", ARG_STR, &config, false, "FILE model config (default: DIR/config.json)"},
        {"--threads", ARG_INT, &threads, false, "N    CPU threads (OpenMP's default)"},
        {"--tokens", ARG_STR, &tokens, true, "IDS  comma-separated token ids"},
        {"--out", ARG_STR, &out, true, "FILE output safetensors file"},
        {"--all", ARG_BOOL, &all, false, "     logits at every position (default: the last)"},
        {"--stepwise", ARG_BOOL, &stepwise, false, "     feed one token at a time through the KV cache"},
        {"--attn-impl", ARG_STR, &attn, false, "absorb|naive  attention form (default absorb)"},
        {"--gemm-impl", ARG_STR, &gemm, false, "bf16|fp8  GEMM path for FP8 weights (default bf16)"},
        {"--device", ARG_STR, &device, false, "cpu|cuda|auto  backend (auto: CUDA when built in and a GPU is present)"},
        {"--ref-kernels", ARG_BOOL, &ref, false, "     use the scalar reference kernels (CPU)"},
        {"--check-numerics", ARG_BOOL, &check, false, "     name the first layer whose output is NaN or inf (slow)"},
    };
    ds_dist *dist = NULL;
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof *specs, USAGE);
    if (rc) return rc == 1 ? 0 : rc;
    if (threads < 0) {
        fprintf(stderr, "dsv3 logits: --threads must be >= 1\n");
        return 2;
    }
    ds_engine_params p = ds_engine_default_params();
    p.n_threads = threads;
    if (!strcmp(attn, "absorb")) p.attention = DS_ATTENTION_ABSORB;
    else if (!strcmp(attn, "naive")) p.attention = DS_ATTENTION_NAIVE;
    else {
        fprintf(stderr, "dsv3 logits: --attn-impl must be absorb or naive, not '%s'\n", attn);
        return 2;
    }
    if (!strcmp(gemm, "bf16")) p.matmul = DS_MATMUL_BF16;
    else if (!strcmp(gemm, "fp8")) p.matmul = DS_MATMUL_FP8;
    else {
        fprintf(stderr, "dsv3 logits: --gemm-impl must be bf16 or fp8, not '%s'\n", gemm);
        return 2;
    }
    int *ids = NULL, n = args_int_list(tokens, &ids);
    if (n <= 0) {
        fprintf(stderr, "dsv3 logits: --tokens must be comma-separated integers, got '%s'\n", tokens);
        return 2;
    }
    ds_engine *e = NULL;
    float *logits = NULL;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    bool *want = malloc((size_t)n);
    ds_model_info_buf info;
    rc = 1;
    if (!tok || !want) goto done;
    for (int i = 0; i < n; i++) {
        tok[i] = ids[i];
        want[i] = all || i == n - 1;
    }
    if (ds_dist_init(&argc, &argv, &dist) || ds_read_model_info(ckpt, config, &info)) goto fail;
    if (n > info.info.max_seq_len) {
        ds_errorf(DS_ERR_RANGE, "%d tokens exceed max_seq_len %d", n, info.info.max_seq_len);
        goto fail;
    }
    p.config_path = config;
    p.no_tokenizer = true;
    p.device = device;
    p.ref_kernels = ref;
    p.check_numerics = check;
    p.n_ctx = n;
    p.dist = dist;
    if (ds_engine_load(ckpt, &p, &e)) goto fail;
    int rows = all ? n : 1, V = ds_engine_n_vocab(e);
    if (!(logits = malloc(sizeof(float) * (size_t)rows * V))) {
        ds_errorf(DS_ERR_NOMEM, "out of memory for %d rows of logits", rows);
        goto fail;
    }
    /* one pass over every token, or one pass a token; the wanted rows in order */
    int step = stepwise ? 1 : n;
    for (int i = 0, r = 0; i < n; i += step) {
        ds_batch b = {.n_tokens = step, .token = tok + i, .logits = want + i};
        if (ds_decode(e, &b)) goto fail;
        for (int k = 0; k < ds_n_logits(e); k++, r++) memcpy(logits + (size_t)r * V, ds_logits(e, k), sizeof(float) * V);
    }
    if (ds_engine_check(e)) goto fail;
    if (ds_dist_rank(dist) == 0 && ds_save_f32(out, "logits", logits, rows, V)) goto fail;
    rc = 0;
    goto done;
fail:
    rc = args_fail_dist(dist, "logits");
done:
    ds_engine_free(e);
    ds_dist_finish(dist);
    free(ids);
    free(tok);
    free(want);
    free(logits);
    return rc;
}
