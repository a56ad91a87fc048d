/* cmd_info.c - `dsv3 info PATH`: list and validate a safetensors file or checkpoint.
 *
 * Opening runs the full validation (header, offsets, index consistency), so a
 * zero exit status means every file is well formed; this doubles as a checker. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "cmds.h"
#include "io/ckpt.h"

static void list_file(const st_file *f, bool summary, uint64_t *bytes, uint64_t *params, uint64_t by_dt[])
{
    char sh[256];
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        if (!summary) printf("%-72s %-8s %s\n", t->name, st_dtype_name(t->dtype), st_shape_str(t, sh, sizeof sh));
        *bytes += t->nbytes;
        *params += t->numel;
        by_dt[t->dtype] += t->numel;
    }
}

int cmd_info(int argc, char **argv)
{
    const char *path = NULL;
    bool summary = false;
    const arg_spec specs[] = {
        {"--summary", ARG_BOOL, &summary, false, "     print only the totals"},
    };
    /* The one positional argument is the path; the rest are flags. */
    char *rest[8] = {argv[0]};
    int nrest = 1;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-' && !path) path = argv[i];
        else if (nrest < 8) rest[nrest++] = argv[i];
    }
    int rc = args_parse(nrest, rest, specs, 1, "PATH [--summary]   (PATH: a .safetensors file or checkpoint directory)");
    if (rc) return rc == 1 ? 0 : rc;
    if (!path) {
        args_usage(argv[0], "PATH [--summary]", specs, 1);
        return 2;
    }
    struct stat sb;
    if (stat(path, &sb)) {
        fprintf(stderr, "dsv3 info: %s: no such file or directory\n", path);
        return 1;
    }
    uint64_t bytes = 0, params = 0, by_dt[ST_N_DTYPES] = {0};
    size_t n_files, n_tensors;
    if (S_ISDIR(sb.st_mode)) {
        ds_ckpt *c;
        if (ckpt_open_dir(&c, path)) return args_fail(argv[0]);
        for (size_t i = 0; i < c->n_files; i++) list_file(c->files[i], summary, &bytes, &params, by_dt);
        n_files = c->n_files;
        n_tensors = c->n_tensors;
        ckpt_close(c);
    } else {
        st_file *f;
        if (st_open(&f, path)) return args_fail(argv[0]);
        list_file(f, summary, &bytes, &params, by_dt);
        n_files = 1;
        n_tensors = f->n_tensors;
        st_close(f);
    }
    printf("%zu file%s, %zu tensors, %llu elements, %.3f GB (%llu bytes)\n", n_files, n_files == 1 ? "" : "s",
           n_tensors, (unsigned long long)params, (double)bytes / 1e9, (unsigned long long)bytes);
    for (int d = 0; d < ST_N_DTYPES; d++)
        if (by_dt[d]) printf("  %-8s %llu elements\n", st_dtype_name((st_dtype)d), (unsigned long long)by_dt[d]);
    return 0;
}
