/* test_tok_diff.c - differential test of the encoder against
 * @huggingface/tokenizers (node/oracle.mjs) on a multilingual corpus (lines,
 * paragraphs and the whole file: English, Chinese, Japanese, Korean, Arabic,
 * Hindi, emoji, code, numbers, whitespace runs, special-token strings),
 * seeded random Unicode strings and random byte strings (invalid UTF-8 is
 * U+FFFD-replaced on both sides: TextDecoder there, utf8_sanitize here).
 * Also checks that decode(encode(x)) == x for valid text, and that the
 * streaming decoder agrees with decode. */
#include <jansson.h>
#include <stdbool.h>
#include <string.h>

#include "test.h"
#include "tok/tokenizer.h"
#include "tokdir.h"

static size_t n_texts, n_bytes, n_fail_print;

static void check(const tok_tokenizer *t, const char *s, size_t len, json_t *want, const char *what, size_t k,
                  bool roundtrip)
{
    int32_t *ids;
    size_t n;
    CHECK_OK(tok_encode(t, s, len, TOK_PARSE_SPECIAL, &ids, &n));
    bool ok = n == json_array_size(want);
    for (size_t i = 0; ok && i < n; i++) ok = ids[i] == json_integer_value(json_array_get(want, i));
    CHECK_MSG(ok, "%s %zu: ids differ from @huggingface/tokenizers (%zu vs %zu ids)", what, k, n,
              json_array_size(want));
    if (!ok && n_fail_print++ < 5) {
        fprintf(stderr, "  text: \"%.*s\"\n  got :", (int)(len > 200 ? 200 : len), s);
        for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
        char *w = json_dumps(want, JSON_COMPACT);
        fprintf(stderr, "\n  want: %.400s\n", w);
        free(w);
    }
    char *dec;
    size_t dl;
    CHECK_OK(tok_decode(t, ids, n, 0, &dec, &dl));
    if (roundtrip) CHECK_MSG(dl == len && !memcmp(dec, s, len), "%s %zu: decode(encode(x)) != x", what, k);
    tok_decoder *d;
    CHECK_OK(tok_decoder_new(t, 0, &d));
    char *acc = malloc(dl + 16);
    size_t al = 0;
    bool fits = true;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t pl;
        if (i < n) CHECK_OK(tok_decoder_push(d, ids[i], &p, &pl));
        else CHECK_OK(tok_decoder_finish(d, &p, &pl));
        if (al + pl > dl) fits = false;
        else memcpy(acc + al, p, pl);
        al += pl;
    }
    CHECK_MSG(fits && al == dl && !memcmp(acc, dec, dl), "%s %zu: streaming decode differs", what, k);
    free(acc);
    tok_decoder_free(d);
    free(dec);
    free(ids);
}

static int hexval(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

int main(void)
{
    tok_tokenizer *t = NULL;
    const char *dir = tok_test_dir();
    CHECK_OK(tok_load(&t, dir));
    const char *tests = getenv("DSV3_TESTS") ? getenv("DSV3_TESTS") : "tests";
    const char *tmp = t_tmpdir("tokdiff");
    char out[4200];
    snprintf(out, sizeof out, "%s/oracle.json", tmp);
    int rc = t_system("node '%s/tok/node/oracle.mjs' tok '%s' '%s/tok/corpus.txt' '%s'", tests, dir, tests, out);
    CHECK_MSG(rc == 0, "node oracle failed (needs nodejs and `npm ci --prefix tests/tok/node`)");
    json_error_t e;
    json_t *o = rc == 0 ? json_load_file(out, JSON_ALLOW_NUL, &e) : NULL;
    CHECK_MSG(rc != 0 || o, "%s: %s", out, e.text);
    if (!t || !o) return t_done("test_tok_diff");
    size_t i, bytes = 0;
    json_t *c;
    json_array_foreach(json_object_get(o, "texts"), i, c) {
        json_t *jt = json_object_get(c, "text");
        check(t, json_string_value(jt), json_string_length(jt), json_object_get(c, "ids"), "text", i, true);
        n_texts++;
        bytes += json_string_length(jt);
    }
    json_array_foreach(json_object_get(o, "bytes"), i, c) {
        const char *hex = json_string_value(json_object_get(c, "hex"));
        size_t n = strlen(hex) / 2;
        char *b = malloc(n + 1);
        for (size_t k = 0; k < n; k++) b[k] = (char)(hexval(hex[2 * k]) << 4 | hexval(hex[2 * k + 1]));
        check(t, b, n, json_object_get(c, "ids"), "bytes", i, false);
        free(b);
        n_bytes += n;
    }
    printf("compared %zu strings (%zu bytes) and %zu random byte strings (%zu bytes)\n", n_texts, bytes,
           json_array_size(json_object_get(o, "bytes")), n_bytes);
    json_decref(o);
    t_system("rm -rf '%s'", tmp);
    tok_free(t);
    return t_done("test_tok_diff");
}
