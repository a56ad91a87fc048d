/* bench_serve.c - the in-process figures bench/serve.sh compares `dsv3 serve`
 * with, measured through the public API as the CLI runs: time to first token
 * of a short chat prompt (the prompt's forward pass and the pick, on an idle
 * engine), and greedy decode of B sequences in lockstep (one ds_decode_pick of
 * B tokens per step, eos ignored), in tokens per second.
 *   bench_serve CKPT PROMPT [B=8] [TOKENS=128] [THREADS=0] [DEVICE=auto] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv3.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int fail(void)
{
    fprintf(stderr, "bench_serve: %s\n", ds_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_serve CKPT PROMPT [B=8] [TOKENS=128] [THREADS=0] [DEVICE=auto]\n");
        return 2;
    }
    int B = argc > 3 ? atoi(argv[3]) : 8, N = argc > 4 ? atoi(argv[4]) : 128;
    ds_engine_params p = ds_engine_default_params();
    p.n_seq = B;
    p.n_ctx = 512;
    p.n_threads = argc > 5 ? atoi(argv[5]) : 0;
    p.device = argc > 6 ? argv[6] : "auto";
    ds_engine *e;
    if (ds_engine_load(argv[1], &p, &e)) return fail();
    ds_chat_message m = {.role = "user", .content = argv[2]};
    ds_chat_params cp = ds_chat_default_params();
    cp.add_generation_prompt = true;
    int32_t *ids;
    size_t n;
    if (ds_chat_apply(ds_engine_tokenizer(e), &m, 1, &cp, NULL, &ids, &n)) return fail();
    /* time to first token: the prompt from an empty slot, then the pick (median of 7) */
    double ttft[7];
    int32_t first = 0;
    for (int r = 0; r < 7; r++) {
        ds_seq_truncate(e, 0, 0);
        double t0 = now();
        ds_batch b = {.n_tokens = (int)n, .token = ids};
        if (ds_decode(e, &b)) return fail();
        first = ds_argmax(ds_logits(e, 0), ds_engine_n_vocab(e));
        ttft[r] = now() - t0;
    }
    if (getenv("BENCH_VERBOSE"))
        for (int r = 0; r < 7; r++) fprintf(stderr, "ttft[%d] %.2f ms\n", r, ttft[r] * 1e3);
    qsort(ttft, 7, sizeof *ttft, cmp);
    /* B sequences holding the prompt, decoded in lockstep */
    for (int q = 1; q < B; q++)
        if (ds_seq_fork(e, q, 0, (int)n)) return fail();
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B), *next = malloc(sizeof(int32_t) * (size_t)B);
    int *seq = malloc(sizeof(int) * (size_t)B);
    for (int q = 0; q < B; q++) tok[q] = first, seq[q] = q;
    ds_batch b = {.n_tokens = B, .token = tok, .seq = seq};
    double t0 = now();
    for (int s = 0; s < N; s++) {
        if (ds_decode_pick(e, &b, NULL, next)) return fail();
        memcpy(tok, next, sizeof(int32_t) * (size_t)B);
    }
    double dt = now() - t0;
    printf("prompt_tokens %zu\nttft_ms %.2f\ndecode_batch %d\ndecode_tokens_per_s %.1f\n", n, ttft[3] * 1e3, B,
           (double)B * N / dt);
    free(tok);
    free(next);
    free(seq);
    ds_free(ids);
    ds_engine_free(e);
    return 0;
}
