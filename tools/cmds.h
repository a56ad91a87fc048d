/* cmds.h - the subcommands of the dsv3 tool. Each lives in tools/cmd_<name>.c,
 * parses its flags with args.h and calls the library; none does real work itself. */
#ifndef DS_CMDS_H
#define DS_CMDS_H

int cmd_convert(int argc, char **argv);
int cmd_cast_bf16(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_spec(int argc, char **argv); /* bench --spec (bench_spec.c) */
int cmd_perplexity(int argc, char **argv);

#endif
