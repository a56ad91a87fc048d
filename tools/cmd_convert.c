/* cmd_convert.c - `dsv3 convert`: HF checkpoint -> model{rank}-mp{mp}.safetensors. */
#include "args.h"
#include "cmds.h"
#include "io/convert.h"

int cmd_convert(int argc, char **argv)
{
    convert_opts o = {.progress = true};
    const arg_spec specs[] = {
        {"--hf-ckpt-path", ARG_STR, &o.hf_dir, true, "DIR  Hugging Face checkpoint directory"},
        {"--save-path", ARG_STR, &o.save_dir, true, "DIR  output directory (created if absent)"},
        {"--n-experts", ARG_INT, &o.n_experts, true, "N    routed experts per MoE layer"},
        {"--model-parallel", ARG_INT, &o.mp, true, "MP   number of model-parallel shards"},
        {"--keep-mtp", ARG_BOOL, &o.keep_mtp, false, "     keep layers >= num_hidden_layers (MTP)"},
        {"--in-place", ARG_BOOL, &o.in_place, false, "     allow --save-path to be the input directory"},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof *specs,
                        "--hf-ckpt-path DIR --save-path DIR --n-experts N --model-parallel MP [--keep-mtp] [--in-place]");
    if (rc) return rc == 1 ? 0 : rc;
    return convert_checkpoint(&o) ? args_fail(argv[0]) : 0;
}
