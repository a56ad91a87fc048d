/* fuzz_tokenizer_json.c - fuzz target for tokenizer.json loading: the input
 * is written as the tokenizer.json of a scratch directory and loaded; a
 * tokenizer that loads must then encode and decode a short text with its
 * ids in range. (tok_load reads a directory, so the input goes through a
 * file: a few thousand inputs a second, enough for small seeds.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "tok/tokenizer.h"

static char g_dir[256], g_file[300];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/dsv3-fuzz-tok-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_file, sizeof g_file, "%s/tokenizer.json", g_dir);
    return 0;
}

static void cleanup(void)
{
    unlink(g_file);
    rmdir(g_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_dir[0]) {
        LLVMFuzzerInitialize(NULL, NULL);
        atexit(cleanup);
    }
    FILE *f = fopen(g_file, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f)) abort();
    tok_tokenizer *t = NULL;
    ds_status s = tok_load(&t, g_dir);
    if (s) {
        if (t || !strstr(ds_last_error(), "tokenizer")) abort();
        return 0;
    }
    static const char text[] = "Hello, world! 123 中文 <|x|>\n\t  end";
    int32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode(t, text, sizeof text - 1, TOK_PARSE_SPECIAL, &ids, &n) == DS_OK) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= tok_vocab_size(t)) abort();
        char *out = NULL;
        size_t len;
        if (tok_decode(t, ids, n, 0, &out, &len) == DS_OK) free(out);
    }
    free(ids);
    for (int32_t id = 0; id < tok_vocab_size(t) && id < 64; id++) (void)tok_id_to_piece(t, id);
    tok_free(t);
    return 0;
}
