/* cmd_logits.c - `dsv3 logits`: the model's logits for a token sequence, as an
 * F32 safetensors tensor "logits" of shape (positions, vocab). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cmds.h"
#include "device.h"
#include "dist/dist.h"
#include "dist/nccl_comm.h"
#include "io/safetensors.h"
#include "model/model.h"

#define USAGE "--ckpt-path DIR --config FILE --tokens 1,2,3 --out FILE [--all] [--stepwise] " \
              "[--attn-impl absorb|naive] [--gemm-impl bf16|fp8] [--device cpu|cuda|auto] [--ref-kernels]"

static ds_status write_logits(const char *path, const float *x, int rows, int vocab)
{
    st_writer *w;
    int64_t shape[2] = {rows, vocab};
    ds_status s = st_writer_open(&w, path);
    if (s) return s;
    if ((s = st_writer_add(w, "logits", ST_F32, 2, shape)) || (s = st_writer_begin(w)) ||
        (s = st_writer_write(w, x, sizeof(float) * (size_t)rows * vocab))) {
        st_writer_abort(w);
        return s;
    }
    return st_writer_finish(w);
}

int cmd_logits(int argc, char **argv)
{
    const char *ckpt = NULL, *config = NULL, *tokens = NULL, *out = NULL, *attn = "absorb", *gemm = "bf16";
    const char *device = "auto";
    bool all = false, stepwise = false, ref = false;
    arg_spec specs[] = {
        {"--ckpt-path", ARG_STR, &ckpt, true, "DIR  checkpoint (converted, or Hugging Face layout)"},
        {"--config", ARG_STR, &config, true, "FILE model config (reference JSON or config.json)"},
        {"--tokens", ARG_STR, &tokens, true, "IDS  comma-separated token ids"},
        {"--out", ARG_STR, &out, true, "FILE output safetensors file"},
        {"--all", ARG_BOOL, &all, false, "     logits at every position (default: the last)"},
        {"--stepwise", ARG_BOOL, &stepwise, false, "     feed one token at a time through the KV cache"},
        {"--attn-impl", ARG_STR, &attn, false, "absorb|naive  attention form (default absorb)"},
        {"--gemm-impl", ARG_STR, &gemm, false, "bf16|fp8  GEMM path for FP8 weights (default bf16)"},
        {"--device", ARG_STR, &device, false, "cpu|cuda|auto  backend (auto: CUDA when built in and a GPU is present)"},
        {"--ref-kernels", ARG_BOOL, &ref, false, "     use the scalar reference kernels (CPU)"},
    };
    ds_comm *comm = NULL;
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof *specs, USAGE);
    if (rc) return rc == 1 ? 0 : rc;
    ds_model_opts o = {0};
    if (!strcmp(attn, "absorb")) o.attn = DS_ATTN_ABSORB;
    else if (!strcmp(attn, "naive")) o.attn = DS_ATTN_NAIVE;
    else {
        fprintf(stderr, "dsv3 logits: --attn-impl must be absorb or naive, not '%s'\n", attn);
        return 2;
    }
    if (!strcmp(gemm, "bf16")) o.gemm = DS_GEMM_BF16;
    else if (!strcmp(gemm, "fp8")) o.gemm = DS_GEMM_FP8;
    else {
        fprintf(stderr, "dsv3 logits: --gemm-impl must be bf16 or fp8, not '%s'\n", gemm);
        return 2;
    }
    int32_t *tok = NULL;
    int *ids = NULL, n = args_int_list(tokens, &ids);
    if (n <= 0) {
        fprintf(stderr, "dsv3 logits: --tokens must be comma-separated integers, got '%s'\n", tokens);
        return 2;
    }
    ds_config cfg;
    ds_model *m = NULL;
    ds_kvcache *kv = NULL;
    float *logits = NULL;
    int *seq = calloc((size_t)n, sizeof(int)), *pos = malloc(sizeof(int) * (size_t)n);
    bool *want = malloc((size_t)n);
    tok = malloc(sizeof(int32_t) * (size_t)n);
    rc = 1;
    if (!seq || !pos || !want || !tok) goto done;
    for (int i = 0; i < n; i++) {
        tok[i] = ids[i];
        pos[i] = i;
        want[i] = all || i == n - 1;
    }
    if (dist_init(&argc, &argv, &comm) || tool_backend(device, ref, &o.ops) || dist_attach_device(comm, o.ops) || config_load(&cfg, config)) goto fail;
    o.comm = comm;
    if (n > cfg.max_seq_len) {
        ds_errorf(DS_ERR_RANGE, "%d tokens exceed max_seq_len %d", n, cfg.max_seq_len);
        goto fail;
    }
    if (model_load(&m, ckpt, &cfg, &o) || kvcache_new(&kv, m, 1, n)) goto fail;
    int rows = all ? n : 1;
    if (!(logits = malloc(sizeof(float) * (size_t)rows * cfg.vocab_size))) {
        ds_errorf(DS_ERR_NOMEM, "out of memory for %d rows of logits", rows);
        goto fail;
    }
    if (stepwise) {
        for (int i = 0, r = 0; i < n; i++) {
            if (model_forward(m, kv, 1, tok + i, seq, pos + i, want + i, logits + (size_t)r * cfg.vocab_size)) goto fail;
            r += want[i];
        }
    } else if (model_forward(m, kv, n, tok, seq, pos, want, logits)) {
        goto fail;
    }
    if (tool_backend_status(o.ops)) goto fail;
    if (dist_rank(comm) == 0 && write_logits(out, logits, rows, cfg.vocab_size)) goto fail;
    rc = 0;
    goto done;
fail:
    rc = dist_fail(comm, "logits");
done:
    kvcache_free(kv);
    model_free(m);
    tool_backend_release(o.ops);
    dist_finish(comm);
    free(ids);
    free(tok);
    free(seq);
    free(pos);
    free(want);
    free(logits);
    return rc;
}
