/* cmd_tokenize.c - `dsv3 tokenize`: print the token ids of a text or of a
 * chat rendered with the tokenizer's chat template. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "base/file.h"
#include "cmds.h"
#include "dsv3.h"

static const char usage[] =
    "--tokenizer DIR (--text S | --chat FILE [--add-generation-prompt]) [--pieces]";

/* The whole of path ("-": standard input), NUL-terminated, or NULL with the
 * reason in ds_last_error(). A named file must be a regular file (a FIFO
 * would block, a directory reads as nothing): pipes come through "-". */
static char *slurp(const char *path, const char *what, size_t *len)
{
    char *b = NULL;
    if (strcmp(path, "-")) return file_read(path, FILE_MAX_TEXT, what, &b, len) ? NULL : b;
    size_t n = 0, cap = 4096;
    b = malloc(cap);
    while (b) {
        n += fread(b + n, 1, cap - n - 1, stdin);
        if (n < cap - 1) break;
        char *nb = cap < FILE_MAX_TEXT ? realloc(b, cap *= 2) : NULL;
        if (!nb) free(b);
        b = nb;
    }
    if (!b) {
        ds_errorf(DS_ERR_NOMEM, "standard input: out of memory, or over 1 GiB");
        return NULL;
    }
    if (ferror(stdin)) {
        free(b);
        ds_errorf(DS_ERR_IO, "standard input: read error");
        return NULL;
    }
    b[n] = '\0';
    *len = n;
    return b;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *dir = NULL, *text = NULL, *chat = NULL, *tmpl_path = NULL, *vars = NULL;
    bool gen = false, pieces = false, plain = false, parse_all = false, render_only = false;
    const arg_spec specs[] = {
        {"--tokenizer", ARG_STR, &dir, true, "DIR  directory with tokenizer.json and tokenizer_config.json"},
        {"--text", ARG_STR, &text, false, "S  text to encode (special-token strings become their ids)"},
        {"--plain", ARG_BOOL, &plain, false, "with --text: special-token strings are plain text"},
        {"--chat", ARG_STR, &chat, false, "FILE  JSON array of messages ('-' for stdin)"},
        {"--add-generation-prompt", ARG_BOOL, &gen, false, "with --chat: end with the assistant prompt"},
        {"--template", ARG_STR, &tmpl_path, false, "FILE  chat template to use instead of tokenizer_config's"},
        {"--vars", ARG_STR, &vars, false, "JSON  extra template variables, e.g. '{\"thinking\": true}'"},
        {"--parse-all", ARG_BOOL, &parse_all, false, "with --chat: parse special tokens in message content too"},
        {"--render", ARG_BOOL, &render_only, false, "with --chat: print the rendered text instead of ids"},
        {"--pieces", ARG_BOOL, &pieces, false, "also print one \"id<TAB>token\" line per token"},
    };
    int n_specs = (int)(sizeof specs / sizeof *specs);
    int rc = args_parse(argc, argv, specs, n_specs, usage);
    if (rc) return rc == 1 ? 0 : rc;
    if (!!text == !!chat) {
        fprintf(stderr, "dsv3 tokenize: give exactly one of --text and --chat\n");
        args_usage(argv[0], usage, specs, n_specs);
        return 2;
    }
    ds_tokenizer *t;
    if (ds_tokenizer_load(dir, &t)) return args_fail(argv[0]);
    int32_t *ids = NULL;
    size_t n = 0;
    ds_status s;
    char *tmpl = NULL;
    if (text) {
        s = ds_tokenize(t, text, strlen(text), plain ? 0 : DS_TOKENIZE_PARSE_SPECIAL, &ids, &n);
    } else {
        size_t len;
        char *msgs = slurp(chat, "chat file", &len);
        if (!msgs) {
            fprintf(stderr, "dsv3 tokenize: --chat: %s\n", ds_last_error());
            ds_tokenizer_free(t);
            return 1;
        }
        if (tmpl_path && !(tmpl = slurp(tmpl_path, "template", &len))) {
            fprintf(stderr, "dsv3 tokenize: --template: %s\n", ds_last_error());
            free(msgs);
            ds_tokenizer_free(t);
            return 1;
        }
        ds_chat_params o = ds_chat_default_params();
        o.add_generation_prompt = gen;
        o.extra_vars = vars;
        o.template_text = tmpl;
        o.parse_special = parse_all;
        char *out = NULL;
        s = ds_chat_apply_json(t, msgs, &o, render_only ? &out : NULL, &ids, &n);
        if (!s && render_only) fputs(out, stdout);
        ds_free(out);
        free(msgs);
        if (!s && render_only) {
            ds_free(ids);
            free(tmpl);
            ds_tokenizer_free(t);
            return 0;
        }
    }
    free(tmpl);
    if (s) {
        rc = args_fail(argv[0]);
        ds_tokenizer_free(t);
        return rc;
    }
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    if (pieces)
        for (size_t i = 0; i < n; i++) printf("%d\t%s\n", ids[i], ds_token_piece(t, ids[i]));
    ds_free(ids);
    ds_tokenizer_free(t);
    return 0;
}
