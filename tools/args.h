/* args.h - flag parsing for the dsv3 subcommands.
 *
 * A subcommand describes its flags in a table and calls args_parse(); unknown
 * flags, missing values, malformed numbers and missing required flags are
 * reported with the subcommand's usage and a non-zero exit code. The short
 * forms llama.cpp users type (-m, -c, -s, --temp, -t, -n, -p, -f, -i) stand
 * for the long flags wherever a subcommand has those. */
#ifndef DS_ARGS_H
#define DS_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "dsv3.h"

typedef enum { ARG_STR, ARG_INT, ARG_FLOAT, ARG_BOOL, ARG_U64 } arg_kind;

typedef struct {
    const char *name;  /* "--ckpt-path" */
    arg_kind kind;
    void *dst;         /* const char **, int *, double *, bool *, uint64_t * */
    bool required;
    const char *help;  /* "DIR  checkpoint directory" */
} arg_spec;

/* Parses argv[1..] (argv[0] is the subcommand name). Returns 0 on success,
 * 1 after printing usage on stdout for --help, 2 after printing an error. */
int args_parse(int argc, char **argv, const arg_spec *specs, int n_specs,
               const char *usage_line);

/* Prints the usage block for a subcommand on stderr. */
void args_usage(const char *cmd, const char *usage_line, const arg_spec *specs, int n_specs);

/* Parses "1,2,3" into a freshly allocated int array; returns the count, -1 on error. */
int args_int_list(const char *s, int **out);

/* Reports a failed library call: "dsv3 <cmd>: <message>" to stderr; returns exit code 1. */
int args_fail(const char *cmd);

/* The error path of a command that may run over several processes (d NULL:
 * alone): prints "dsv3 <cmd>: <message>" (once, from rank 0, for a failure
 * every rank knows of; with this rank's number otherwise) and, unless the
 * failure was agreed, ends the whole job with exit code 1 so that no peer waits
 * in a collective. Returns 1 (the exit code) otherwise. */
int args_fail_dist(ds_dist *d, const char *cmd);

#endif
