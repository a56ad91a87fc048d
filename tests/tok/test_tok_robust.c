/* test_tok_robust.c - speed and robustness: BPE on 1 MiB of one repeated
 * character must take well under a second (O(n log n) merges); random bytes
 * through the encoder, random mutations of the V3 template through the
 * template engine, and random ids through both decoders must never crash
 * (run under the sanitizer build to make that a real check); bad tokenizer
 * directories give errors that name the file. */
#include <jansson.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "test.h"
#include "tok/jinja.h"
#include "tok/tokenizer.h"
#include "tokdir.h"

static uint32_t g_seed = 99;
static uint32_t rnd(uint32_t n)
{
    g_seed = g_seed * 1664525u + 1013904223u;
    return (g_seed >> 8) % n;
}

/* Encoding 1 MiB of one repeated unit must not be quadratic. The times are
 * printed, not asserted: a timed test would fail on a busy machine. (Quiet
 * machine: 0.3-0.4 s per MiB, linear between 256 KiB and 1 MiB.) */
static void check_speed(const tok_tokenizer *t)
{
    static const char *const units[] = {"a", " ", "1", "\n", "中", "!", "ab ", "😀"};
    size_t n = 1 << 20;
    char *s = malloc(n + 8);
    for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
        size_t l = strlen(units[u]), k = 0;
        while (k + l <= n) {
            memcpy(s + k, units[u], l);
            k += l;
        }
        double t0 = ds_now();
        int32_t *ids;
        size_t m;
        CHECK_OK(tok_encode(t, s, k, TOK_PARSE_SPECIAL, &ids, &m));
        double dt = ds_now() - t0;
        printf("1 MiB of \"%s\": %zu ids in %.3f s\n", units[u][0] == '\n' ? "\\n" : units[u], m, dt);
        char *d;
        size_t dl;
        CHECK_OK(tok_decode(t, ids, m, 0, &d, &dl));
        CHECK(dl == k && !memcmp(d, s, k));
        free(d);
        free(ids);
    }
    free(s);
}

static void fuzz_encode(const tok_tokenizer *t)
{
    char buf[512];
    for (int it = 0; it < 3000; it++) {
        size_t n = rnd(sizeof buf);
        for (size_t i = 0; i < n; i++) buf[i] = rnd(4) ? (char)rnd(256) : "<｜User▁ \n\t"[rnd(12)];
        int32_t *ids;
        size_t m;
        CHECK_OK(tok_encode(t, buf, n, rnd(2) ? TOK_PARSE_SPECIAL : 0, &ids, &m));
        char *d;
        size_t dl;
        CHECK_OK(tok_decode(t, ids, m, rnd(2) ? TOK_SKIP_SPECIAL : 0, &d, &dl));
        free(d);
        free(ids);
    }
    /* random ids, including ones without a token, and out-of-range ones */
    int32_t ids[64];
    for (int it = 0; it < 500; it++) {
        for (int i = 0; i < 64; i++) ids[i] = (int32_t)rnd((uint32_t)tok_vocab_size(t));
        char *d;
        size_t dl;
        CHECK_OK(tok_decode(t, ids, 64, 0, &d, &dl));
        free(d);
    }
    int32_t bad[2] = {5, tok_vocab_size(t)};
    char *d;
    size_t dl;
    CHECK(tok_decode(t, bad, 2, 0, &d, &dl) == DS_ERR_RANGE);
    bad[1] = -1;
    CHECK(tok_decode(t, bad, 2, 0, &d, &dl) == DS_ERR_RANGE);
}

static void fuzz_template(const tok_tokenizer *t)
{
    const char *base = tok_chat_template(t);
    size_t n = strlen(base);
    char *m = malloc(n + 64);
    const char *msgs = "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"u\"},"
                       "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\","
                       "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"content\":\"r\"}]";
    static const char *const frag[] = {"{%", "%}", "{{", "}}", "-", "'", "(", ")", "[", "]", " if ", " for ",
                                       "endif", "endfor", " not ", ".", "|", "~", "+", "\\"};
    int failed = 0;
    for (int it = 0; it < 1500; it++) {
        memcpy(m, base, n + 1);
        size_t len = n;
        for (int k = 1 + (int)rnd(3); k > 0; k--) {
            size_t pos = rnd((uint32_t)len);
            if (rnd(2)) { /* delete a few bytes */
                size_t dl = 1 + rnd(8);
                if (pos + dl > len) dl = len - pos;
                memmove(m + pos, m + pos + dl, len - pos - dl + 1);
                len -= dl;
            } else { /* insert a fragment */
                const char *f = frag[rnd(sizeof frag / sizeof *frag)];
                size_t fl = strlen(f);
                memmove(m + pos + fl, m + pos, len - pos + 1);
                memcpy(m + pos, f, fl);
                len += fl;
            }
        }
        tok_chat_opts o = {.template_text = m, .add_generation_prompt = 1};
        char *out = NULL;
        int32_t *ids = NULL;
        size_t ni;
        failed += tok_encode_chat(t, msgs, &o, &ids, &ni, &out) != DS_OK;
        free(out);
        free(ids);
    }
    printf("mutated templates: %d of 1500 rejected with an error, none crashed\n", failed);
    CHECK(failed > 0);
    free(m);
}

static void check_bad_dirs(void)
{
    const char *d = t_tmpdir("tokbad");
    tok_tokenizer *t = NULL;
    CHECK(tok_load(&t, d) == DS_ERR_IO && strstr(ds_last_error(), "tokenizer.json"));
    static const char *const bad[] = {
        "{",
        "[]",
        "{\"model\": {\"type\": \"Unigram\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -4}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", "
        "\"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        t_system("printf '%%s' '%s' > '%s/tokenizer.json'", bad[i], d);
        ds_status s = tok_load(&t, d);
        CHECK_MSG(s != DS_OK && t == NULL && strstr(ds_last_error(), "tokenizer.json"), "bad tokenizer.json %zu: %s",
                  i, ds_last_error());
    }
    t_system("rm -rf '%s'", d);
}

/* Integer arithmetic in templates is 64-bit and checked: overflow is an
 * error naming the operator, never SIGFPE or a wrapped value (a checkpoint's
 * own tokenizer_config.json can carry such a template). */
static void check_template_ints(void)
{
    static const struct { const char *tmpl, *want; } cases[] = {
        {"{{ (-9223372036854775807 - 1) // -1 }}", NULL},
        {"{{ (-9223372036854775807 - 1) % -1 }}", "0"},
        {"{{ 9223372036854775807 + 1 }}", NULL},
        {"{{ -9223372036854775807 - 2 }}", NULL},
        {"{{ 9223372036854775807 * 2 }}", NULL},
        {"{{ -(-9223372036854775807 - 1) }}", NULL},
        {"{{ (-9223372036854775807 - 1) | abs }}", NULL},
        {"{{ 2 ** 63 }}", NULL},
        {"{{ 2 ** 62 }}", "4611686018427387904"},
        {"{{ (-1) ** 9223372036854775807 }}", "-1"},
        {"{{ 1 ** 9223372036854775807 }}", "1"},
        {"{{ 0 ** 0 }}", "1"},
        {"{{ 99999999999999999999 }}", NULL},
        {"{{ (10.0 ** 300) | int }}", NULL},
        {"{{ 9223372036854775807 | int }}", "9223372036854775807"},
        {"{{ 'abc'[::9223372036854775807] }}", "a"},
        {"{{ 'abc'[::-9223372036854775807] }}", "c"},
        {"{{ [1, 2, 3][::-9223372036854775807] | length }}", "1"},
        {"{{ 7 // -2 }} {{ 7 % -2 }}", "-4 -1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out = NULL;
        size_t len = 0;
        ds_status s = jinja_render(cases[i].tmpl, NULL, NULL, NULL, &out, NULL, &len);
        if (cases[i].want)
            CHECK_MSG(s == DS_OK && out && !strcmp(out, cases[i].want), "%s: got %s (%s)", cases[i].tmpl,
                      out ? out : "error", s ? ds_last_error() : "");
        else
            CHECK_MSG(s != DS_OK && (strstr(ds_last_error(), "overflow") || strstr(ds_last_error(), "range")),
                      "%s: want an overflow error, got %s", cases[i].tmpl, s ? ds_last_error() : out);
        free(out);
    }
}

/* Values that contain themselves print as Python prints them, and work that
 * produces nothing ('' * k) costs nothing: both were fuzzer findings (a stack
 * overflow and a hang; tests/fuzz/crashers/jinja). */
static void check_template_cycles(void)
{
    static const struct { const char *tmpl, *want; } cases[] = {
        {"{% set ns = namespace(a=1) %}{% set ns.b = ns %}{{ ns }}", "<Namespace {'a': 1, 'b': <Namespace {...}>}>"},
        {"{% set ns = namespace() %}{% set ns.l = [ns, 2] %}{{ ns }}", "<Namespace {'l': [<Namespace {...}>, 2]}>"},
        {"{% set l = [1] %}{{ [l, [l]] }}", "[[1], [[1]]]"},
        {"[{{ '' * 111111111111110 }}]", "[]"},
        {"{% set x %}{% endset %}[{{ x }}]", "[]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out = NULL;
        size_t len = 0;
        ds_status s = jinja_render(cases[i].tmpl, NULL, NULL, NULL, &out, NULL, &len);
        CHECK_MSG(s == DS_OK && out && !strcmp(out, cases[i].want), "%s: got %s (%s)", cases[i].tmpl,
                  out ? out : "error", s ? ds_last_error() : "");
        free(out);
    }
}

int main(void)
{
    check_template_ints();
    check_template_cycles();
    tok_tokenizer *t = NULL;
    CHECK_OK(tok_load(&t, tok_test_dir()));
    if (!t) return t_done("test_tok_robust");
    check_speed(t);
    fuzz_encode(t);
    fuzz_template(t);
    check_bad_dirs();
    tok_free(t);
    return t_done("test_tok_robust");
}
