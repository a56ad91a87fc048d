/* args.c - flag parsing shared by the subcommands. */
#include "args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv3.h"

/* The short forms llama.cpp users type, each standing for a long flag. One
 * applies only in a subcommand that has the long flag and not the short one
 * itself (bench's -p and -n are llama-bench's lists). */
static const struct {
    const char *alias, *name;
} k_alias[] = {
    {"-m", "--ckpt-path"},  {"-c", "--ctx-size"},       {"-s", "--seed"},   {"--temp", "--temperature"},
    {"-t", "--threads"},    {"-n", "--max-new-tokens"}, {"-p", "--prompt"}, {"-f", "--input-file"},
    {"-i", "--interactive"},
};

static int find_spec(const arg_spec *specs, int n_specs, const char *a, size_t nlen)
{
    for (int j = 0; j < n_specs; j++)
        if (strlen(specs[j].name) == nlen && !strncmp(specs[j].name, a, nlen)) return j;
    return -1;
}

static const char *alias_of(const arg_spec *specs, int n_specs, const char *name)
{
    for (size_t i = 0; i < sizeof k_alias / sizeof *k_alias; i++)
        if (!strcmp(k_alias[i].name, name) && find_spec(specs, n_specs, k_alias[i].alias, strlen(k_alias[i].alias)) < 0)
            return k_alias[i].alias;
    return NULL;
}

static void usage_to(FILE *out, const char *cmd, const char *usage_line, const arg_spec *specs, int n_specs)
{
    fprintf(out, "usage: dsv3 %s %s\n", cmd, usage_line);
    for (int i = 0; i < n_specs; i++) {
        const char *al = alias_of(specs, n_specs, specs[i].name);
        char name[64];
        snprintf(name, sizeof name, "%s%s%s", al ? al : "", al ? ", " : "", specs[i].name);
        fprintf(out, "  %-26s %s%s\n", name, specs[i].help ? specs[i].help : "", specs[i].required ? " (required)" : "");
    }
}

void args_usage(const char *cmd, const char *usage_line, const arg_spec *specs, int n_specs)
{
    usage_to(stderr, cmd, usage_line, specs, n_specs);
}

static int parse_value(const arg_spec *s, const char *v, const char *cmd)
{
    char *end = NULL;
    errno = 0;
    switch (s->kind) {
    case ARG_STR:
        *(const char **)s->dst = v;
        return 0;
    case ARG_INT: {
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end || x < -2147483647L || x > 2147483647L) break;
        *(int *)s->dst = (int)x;
        return 0;
    }
    case ARG_U64: {
        if (*v == '-') break;
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end) break;
        *(uint64_t *)s->dst = x;
        return 0;
    }
    case ARG_FLOAT: {
        double x = strtod(v, &end);
        if (errno || end == v || *end || x != x) break;
        *(double *)s->dst = x;
        return 0;
    }
    case ARG_BOOL:
        *(bool *)s->dst = true;
        return 0;
    }
    fprintf(stderr, "dsv3 %s: %s: '%s' is not a valid %s\n", cmd, s->name, v,
            s->kind == ARG_FLOAT ? "number" : "integer");
    return 2;
}

int args_parse(int argc, char **argv, const arg_spec *specs, int n_specs, const char *usage_line)
{
    const char *cmd = argv[0];
    bool seen[128] = {0};
    if (n_specs > 128) return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_to(stdout, cmd, usage_line, specs, n_specs);
            return 1;
        }
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        int k = find_spec(specs, n_specs, a, nlen);
        for (size_t j = 0; k < 0 && j < sizeof k_alias / sizeof *k_alias; j++)
            if (strlen(k_alias[j].alias) == nlen && !strncmp(k_alias[j].alias, a, nlen))
                k = find_spec(specs, n_specs, k_alias[j].name, strlen(k_alias[j].name));
        if (k < 0) {
            fprintf(stderr, "dsv3 %s: unknown flag '%s'\n", cmd, a);
            args_usage(cmd, usage_line, specs, n_specs);
            return 2;
        }
        const char *v;
        if (specs[k].kind == ARG_BOOL) {
            if (eq) {
                fprintf(stderr, "dsv3 %s: %s takes no value\n", cmd, specs[k].name);
                return 2;
            }
            v = "1";
        } else if (eq) {
            v = eq + 1;
        } else {
            if (i + 1 >= argc) {
                fprintf(stderr, "dsv3 %s: %s needs a value\n", cmd, specs[k].name);
                return 2;
            }
            v = argv[++i];
        }
        int rc = parse_value(&specs[k], v, cmd);
        if (rc) return rc;
        seen[k] = true;
    }
    for (int j = 0; j < n_specs; j++)
        if (specs[j].required && !seen[j]) {
            fprintf(stderr, "dsv3 %s: missing required flag %s\n", cmd, specs[j].name);
            args_usage(cmd, usage_line, specs, n_specs);
            return 2;
        }
    return 0;
}

int args_int_list(const char *s, int **out)
{
    int n = 1;
    for (const char *p = s; *p; p++) n += *p == ',';
    int *v = malloc(sizeof(int) * (size_t)n);
    if (!v) return -1;
    const char *p = s;
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || (*end != ',' && *end) || x < -2147483647L || x > 2147483647L) {
            free(v);
            return -1;
        }
        v[i] = (int)x;
        p = end + (*end == ',');
    }
    *out = v;
    return n;
}

int args_fail(const char *cmd)
{
    fprintf(stderr, "dsv3 %s: %s\n", cmd, ds_last_error());
    return 1;
}

int args_fail_dist(ds_dist *d, const char *cmd)
{
    if (ds_dist_world_size(d) == 1) return args_fail(cmd);
    if (ds_dist_failure_agreed(d)) {
        if (ds_dist_rank(d) == 0) fprintf(stderr, "dsv3 %s: %s\n", cmd, ds_last_error());
        return 1;
    }
    fprintf(stderr, "dsv3 %s: rank %d of %d: %s; stopping all ranks\n", cmd, ds_dist_rank(d), ds_dist_world_size(d),
            ds_last_error());
    fflush(stderr);
    fflush(stdout);
    ds_dist_abort(d, 1);
    return 1;
}
