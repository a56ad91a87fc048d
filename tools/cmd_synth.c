/* cmd_synth.c - `dsv3 synth`: write a random-weight HF checkpoint for a config. */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cmds.h"
#include "io/synth.h"

int cmd_synth(int argc, char **argv)
{
    const char *dtype = NULL;
    uint64_t seed = 0, shard_mb = 4096;
    synth_opts o = {.dtype = -1, .progress = true};
    const arg_spec specs[] = {
        {"--config", ARG_STR, &o.config_path, true, "FILE reference or Hugging Face config JSON"},
        {"--out", ARG_STR, &o.out_dir, true, "DIR  output directory (created if absent)"},
        {"--dtype", ARG_STR, &dtype, false, "fp8|bf16  weight format (default: the config's)"},
        {"--seed", ARG_U64, &seed, false, "N    random seed (default 0)"},
        {"--tokenizer", ARG_STR, &o.tokenizer_dir, false, "DIR  copy tokenizer.json and tokenizer_config.json"},
        {"--shard-size-mb", ARG_U64, &shard_mb, false, "N    target shard size in MiB (default 4096)"},
        {"--mtp", ARG_BOOL, &o.mtp, false, "     add the multi-token-prediction module (layer num_hidden_layers)"},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof *specs,
                        "--config FILE --out DIR [--dtype fp8|bf16] [--seed N] [--tokenizer DIR] [--shard-size-mb N] [--mtp]");
    if (rc) return rc == 1 ? 0 : rc;
    if (dtype && !strcmp(dtype, "fp8")) o.dtype = DS_DTYPE_FP8;
    else if (dtype && !strcmp(dtype, "bf16")) o.dtype = DS_DTYPE_BF16;
    else if (dtype) {
        fprintf(stderr, "dsv3 synth: --dtype must be fp8 or bf16, not '%s'\n", dtype);
        return 2;
    }
    if (shard_mb == 0 || shard_mb > (1ull << 30)) {
        fprintf(stderr, "dsv3 synth: --shard-size-mb must be between 1 and 2^30\n");
        return 2;
    }
    o.seed = seed;
    o.shard_bytes = shard_mb << 20;
    return synth_checkpoint(&o) ? args_fail(argv[0]) : 0;
}
