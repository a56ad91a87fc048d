/* fuzz_request.c - fuzz target for the server's request parser (req_parse:
 * a JSON body to a validated srv_request), and for the stop matcher and reply
 * parser fed with the same bytes.
 *
 * Built two ways (see tests/serve/tests.cmake):
 *  - with -DDSV3_LIBFUZZER (clang, -fsanitize=fuzzer,address,undefined):
 *      CC=clang cmake -B build-fuzz -DDSV3_FUZZ=ON && cmake --build build-fuzz --target fuzz_request
 *      build-fuzz/tests/fuzz_request -max_total_time=60
 *  - otherwise a plain driver for the test suite: fuzz_request [--mutations N] [--seed S]
 *    parses N random mutations of built-in valid requests.
 * Every input must be accepted or refused with a 4xx and a message; an
 * accepted request's fields must hold their invariants. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_accepted(const srv_request *r, const srv_limits *lim)
{
    if (r->n < 1 || r->n > lim->max_n || r->n_stop < 0 || r->n_stop > lim->max_stop) abort();
    if (r->max_tokens != -1 && (r->max_tokens < 1 || r->max_tokens > lim->max_tokens)) abort();
    if (!(r->temperature >= 0 && r->temperature <= 2) || !(r->top_p > 0 && r->top_p <= 1) || r->top_k < 0) abort();
    if (r->top_logprobs < 0 || r->top_logprobs > lim->max_top_logprobs) abort();
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i][0] || strlen(r->stop[i]) > (size_t)lim->max_stop_len) abort();
    if (r->kind == REQ_CHAT && !r->messages_json) abort();
    if (r->kind == REQ_COMPLETION && !r->prompt && r->n_prompt_ids < 1) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    srv_limits lim = srv_default_limits();
    for (int k = 0; k < 2; k++) {
        srv_request r;
        srv_error e;
        if (req_parse((const char *)data, size, k ? REQ_COMPLETION : REQ_CHAT, &lim, &r, &e) == 0) {
            check_accepted(&r, &lim);
            req_free(&r);
        } else if (e.status < 400 || e.status > 500 || !e.message[0] || !e.type) {
            abort();
        }
    }
    /* the same bytes as generated text, split at every 7th byte */
    static char *stops[] = {"</s>", "\n\n", "ab"};
    stop_matcher m;
    out_parser p;
    sbuf out = {0}, c = {0}, rs = {0};
    stop_init(&m, stops, 3);
    outp_init(&p, size && data[0] & 1);
    bool hit = false;
    for (size_t i = 0; i < size && !hit; i += 7) {
        size_t n = size - i < 7 ? size - i : 7, before = out.n;
        hit = stop_push(&m, (const char *)data + i, n, &out);
        outp_push(&p, out.p + before, out.n - before, &c, &rs);
    }
    if (out.n > size) abort();
    outp_finish(&p, &c, &rs);
    json_decref(outp_tool_calls(&p, 0));
    stop_free(&m);
    outp_free(&p);
    sb_free(&out);
    sb_free(&c);
    sb_free(&rs);
    return 0;
}

#ifndef DSV3_LIBFUZZER
static const char *k_seeds[] = {
    "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
    "\"text\":\"hi\"}]}],\"max_tokens\":16,\"temperature\":0.7,\"top_p\":0.9,\"stop\":[\"a\",\"b\"],\"n\":2,\"seed\":1,"
    "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":3}",
    "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"1\",\"type\":\"function\","
    "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"1\",\"content\":\"x\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"auto\","
    "\"chat_template_kwargs\":{\"thinking\":true},\"thinking\":{\"type\":\"disabled\"}}",
    "{\"prompt\":\"once upon\",\"max_tokens\":3,\"logprobs\":2,\"echo\":true,\"stop\":\"\\n\"}",
    "{\"prompt\":[1,2,3,4],\"frequency_penalty\":1.5,\"presence_penalty\":-1,\"repetition_penalty\":1.1,\"top_k\":40}",
    "<think>a</think>b<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
};

static uint64_t g_rng = 88172645463325252ull;
static uint64_t next_rand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static const char k_interesting[] = "{}[]\",:0-9e.ntfu\\\x00\xff\xc3";

int main(int argc, char **argv)
{
    long mutations = 20000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mutations")) mutations = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) g_rng = strtoull(argv[i + 1], NULL, 10) | 1;
    }
    size_t ns = sizeof k_seeds / sizeof *k_seeds;
    uint8_t buf[4096];
    for (size_t s = 0; s < ns; s++) LLVMFuzzerTestOneInput((const uint8_t *)k_seeds[s], strlen(k_seeds[s]));
    for (long m = 0; m < mutations; m++) {
        const char *seed = k_seeds[m % ns];
        size_t n = strlen(seed);
        memcpy(buf, seed, n);
        int edits = 1 + (int)(next_rand() % 4);
        for (int e = 0; e < edits; e++) {
            uint64_t x = next_rand();
            size_t pos = n ? (size_t)((x >> 8) % n) : 0;
            char c = k_interesting[(x >> 32) % (sizeof k_interesting - 1)];
            switch (x & 3) {
            case 0: if (n) buf[pos] = (uint8_t)c; break;
            case 1: if (n < sizeof buf) { memmove(buf + pos + 1, buf + pos, n - pos); buf[pos] = (uint8_t)c; n++; } break;
            case 2: if (n) { size_t k = 1 + (x >> 40) % 6; if (k > n - pos) k = n - pos; memmove(buf + pos, buf + pos + k, n - pos - k); n -= k; } break;
            default: n = pos; break;
            }
        }
        LLVMFuzzerTestOneInput(buf, n);
    }
    printf("fuzz_request: %ld mutations parsed cleanly\n", mutations);
    return 0;
}
#endif
