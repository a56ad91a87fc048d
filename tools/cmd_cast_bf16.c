/* cmd_cast_bf16.c - `dsv3 cast-bf16`: dequantise an FP8 checkpoint to BF16. */
#include "args.h"
#include "cmds.h"
#include "io/cast.h"

int cmd_cast_bf16(int argc, char **argv)
{
    cast_opts o = {.progress = true};
    const arg_spec specs[] = {
        {"--input-fp8-hf-path", ARG_STR, &o.in_dir, true, "DIR  FP8 Hugging Face checkpoint"},
        {"--output-bf16-hf-path", ARG_STR, &o.out_dir, true, "DIR  output directory (created if absent)"},
        {"--allow-missing-scale", ARG_BOOL, &o.allow_missing_scale, false,
         "     copy FP8 weights without a scale_inv through (warns)"},
        {"--threads", ARG_INT, &o.threads, false, "N    worker threads (default: all cores)"},
        {"--in-place", ARG_BOOL, &o.in_place, false, "     allow the output to be the input directory"},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof *specs,
                        "--input-fp8-hf-path DIR --output-bf16-hf-path DIR [--allow-missing-scale] [--threads N] [--in-place]");
    if (rc) return rc == 1 ? 0 : rc;
    return cast_bf16_checkpoint(&o) ? args_fail(argv[0]) : 0;
}
