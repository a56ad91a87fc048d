/* test_tok_golden.c - the tokenizer against tests/golden/tokenizer_cases.json:
 * ids from HF `tokenizers` (Rust) for tricky strings, the decoded text, and the
 * chat template's rendered text and ids (Jinja2 through transformers). */
#include <jansson.h>
#include <string.h>

#include "test.h"
#include "tok/tokenizer.h"
#include "tokdir.h"

static int ids_equal(const int32_t *ids, size_t n, json_t *want)
{
    if (n != json_array_size(want)) return 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] != json_integer_value(json_array_get(want, i))) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

static void check_encode(const tok_tokenizer *t, json_t *c, size_t k)
{
    json_t *jt = json_object_get(c, "text");
    const char *text = json_string_value(jt);
    size_t len = json_string_length(jt);
    int32_t *ids;
    size_t n;
    CHECK_OK(tok_encode(t, text, len, TOK_PARSE_SPECIAL, &ids, &n));
    int ok = ids_equal(ids, n, json_object_get(c, "ids"));
    CHECK_MSG(ok, "encode case %zu \"%.60s\"", k, text);
    if (!ok) {
        print_ids("got ", ids, n);
        json_t *w = json_object_get(c, "ids");
        fprintf(stderr, "  want: %s\n", json_dumps(w, JSON_COMPACT));
    }
    char *dec;
    size_t dl;
    CHECK_OK(tok_decode(t, ids, n, 0, &dec, &dl));
    const char *want = json_string_value(json_object_get(c, "decoded"));
    CHECK_MSG(dec && dl == strlen(want) && !memcmp(dec, want, dl), "decode case %zu: got \"%s\"", k, dec);
    /* the streaming decoder gives the same text */
    tok_decoder *d;
    CHECK_OK(tok_decoder_new(t, 0, &d));
    size_t sl = 0;
    char *acc = malloc(dl + 64);
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t pl;
        CHECK_OK(tok_decoder_push(d, ids[i], &p, &pl));
        if (sl + pl <= dl + 60) memcpy(acc + sl, p, pl);
        sl += pl;
    }
    const char *p;
    size_t pl;
    CHECK_OK(tok_decoder_finish(d, &p, &pl));
    if (sl + pl <= dl + 60) memcpy(acc + sl, p, pl);
    sl += pl;
    CHECK_MSG(sl == dl && !memcmp(acc, dec, dl), "stream decode case %zu", k);
    free(acc);
    tok_decoder_free(d);
    free(dec);
    free(ids);
}

static void check_chat(const tok_tokenizer *t, json_t *c, size_t k)
{
    char *msgs = json_dumps(json_object_get(c, "messages"), JSON_COMPACT);
    tok_chat_opts o = {0};
    o.add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt"));
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(tok_encode_chat(t, msgs, &o, &ids, &n, &text));
    const char *want = json_string_value(json_object_get(c, "text"));
    CHECK_MSG(text && !strcmp(text, want), "chat case %zu: text \"%s\", want \"%s\"", k, text, want);
    int ok = ids_equal(ids, n, json_object_get(c, "ids"));
    CHECK_MSG(ok, "chat case %zu ids", k);
    if (!ok) print_ids("got ", ids, n);
    free(ids);
    free(text);
    /* reference mode gives the same ids here (no special strings in content) */
    o.parse_all = 1;
    CHECK_OK(tok_encode_chat(t, msgs, &o, &ids, &n, NULL));
    CHECK_MSG(ids_equal(ids, n, json_object_get(c, "ids")), "chat case %zu ids (parse_all)", k);
    free(ids);
    free(msgs);
}

int main(void)
{
    tok_tokenizer *t = NULL;
    CHECK_OK(tok_load(&t, tok_test_dir()));
    if (!t) return t_done("test_tok_golden");
    json_error_t e;
    json_t *g = json_load_file(t_golden("tokenizer_cases.json"), 0, &e);
    CHECK_MSG(g != NULL, "%s: %s", t_golden("tokenizer_cases.json"), e.text);
    if (!g) return t_done("test_tok_golden");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(g, "encode"), i, c) check_encode(t, c, i);
    json_array_foreach(json_object_get(g, "chat"), i, c) check_chat(t, c, i);
    CHECK(tok_bos_id(t) == 0);
    CHECK(tok_eos_id(t) == 1);
    json_decref(g);
    tok_free(t);
    return t_done("test_tok_golden");
}
