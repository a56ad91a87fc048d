/* fuzz_tok_encode.c - fuzz target for DeepSeek-V3's tokenizer on arbitrary
 * bytes. The first byte picks the mode (plain, special tokens parsed, masked
 * with a pseudo-random trust mask); the rest is the text. Checks: every id is
 * in the vocabulary; without special-token parsing, decoding gives back the
 * text exactly when it is valid UTF-8 (byte-level BPE loses nothing), else
 * with U+FFFD as utf8_sanitize puts it; the streaming decoder agrees with
 * tok_decode. The tokenizer comes from $DSV3_TOKENIZER or the build's
 * DSV3_FUZZ_TOKENIZER (.cache/tokenizer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "tok/tokenizer.h"
#include "tok/utf8.h"

static tok_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("DSV3_TOKENIZER");
#ifdef DSV3_FUZZ_TOKENIZER
    if (!dir || !*dir) dir = DSV3_FUZZ_TOKENIZER;
#endif
    if (!dir || tok_load(&g_tok, dir)) {
        fprintf(stderr, "fuzz_tok_encode: cannot load the tokenizer from %s: %s\n", dir ? dir : "(unset)",
                ds_last_error());
        exit(2);
    }
    return 0;
}

static void check_decode(const int32_t *ids, size_t n, const char *want, size_t want_n)
{
    char *text = NULL;
    size_t len = 0;
    if (tok_decode(g_tok, ids, n, 0, &text, &len)) abort();
    if (want && (len != want_n || memcmp(text, want, len))) abort();
    tok_decoder *d = NULL;
    if (tok_decoder_new(g_tok, 0, &d)) abort();
    size_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *piece;
        size_t pl;
        if (i < n ? tok_decoder_push(d, ids[i], &piece, &pl) : tok_decoder_finish(d, &piece, &pl)) abort();
        if (at + pl > len || memcmp(text + at, piece, pl)) abort();
        at += pl;
    }
    if (at != len) abort();
    tok_decoder_free(d);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_tok) LLVMFuzzerInitialize(NULL, NULL);
    if (size < 1) return 0;
    int mode = data[0] % 3;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    int32_t *ids = NULL;
    size_t nid = 0;
    ds_status s;
    if (mode == 2) {
        uint8_t *trust = malloc(n ? n : 1);
        if (!trust) abort();
        for (size_t i = 0; i < n; i++) trust[i] = (uint8_t)((i * 2654435761u ^ data[0]) >> 7 & 1);
        s = tok_encode_masked(g_tok, text, n, trust, &ids, &nid);
        free(trust);
    } else {
        s = tok_encode(g_tok, text, n, mode ? TOK_PARSE_SPECIAL : 0, &ids, &nid);
    }
    if (s) {
        free(ids);
        return 0; /* a clean error (invalid input, a limit) */
    }
    for (size_t i = 0; i < nid; i++)
        if (ids[i] < 0 || ids[i] >= tok_vocab_size(g_tok)) abort();
    if (mode == 0) {
        size_t sn = 0;
        char *want = utf8_sanitize(text, n, NULL, &sn, NULL);
        if (!want) abort();
        check_decode(ids, nid, want, sn);
        free(want);
    } else {
        check_decode(ids, nid, NULL, 0);
    }
    free(ids);
    return 0;
}
