/* dsv3.c - the command-line tool: dispatches to one subcommand per file. */
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "dsv3.h"

/* Subcommands are weak so that a build without a subsystem still links; the
 * table says which exist. */
#pragma weak cmd_convert
#pragma weak cmd_cast_bf16
#pragma weak cmd_synth
#pragma weak cmd_info
#pragma weak cmd_logits
#pragma weak cmd_generate
#pragma weak cmd_tokenize
#pragma weak cmd_bench

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} k_cmds[] = {
    {"generate", cmd_generate, "chat interactively or complete a file of prompts"},
    {"logits", cmd_logits, "write the model's logits for a token sequence"},
    {"tokenize", cmd_tokenize, "print the token ids of a text or a chat"},
    {"bench", cmd_bench, "measure prefill and decode speed against the hardware limits"},
    {"convert", cmd_convert, "shard a Hugging Face checkpoint for model parallelism"},
    {"cast-bf16", cmd_cast_bf16, "dequantise an FP8 checkpoint to BF16"},
    {"synth", cmd_synth, "write a random-weight checkpoint for any config"},
    {"info", cmd_info, "list the tensors of a checkpoint or safetensors file"},
};

static void usage(FILE *out)
{
    fprintf(out, "dsv3 %s - DeepSeek-V3-family inference in C\n\nusage: dsv3 <command> [flags]\n\ncommands:\n",
            DSV3_VERSION);
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        if (k_cmds[i].fn) fprintf(out, "  %-10s %s\n", k_cmds[i].name, k_cmds[i].help);
    fprintf(out, "\n'dsv3 <command> --help' lists a command's flags.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("dsv3 %s\n", DSV3_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        if (!strcmp(argv[1], k_cmds[i].name) && k_cmds[i].fn) return k_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dsv3: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
