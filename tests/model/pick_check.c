/* pick_check.c - see pick_check.h. */
#include "pick_check.h"

#include <stdlib.h>
#include <string.h>

#include "model/sampler.h"
#include "test.h"

/* sampler_pick_u on a copy of logits after pk's penalty */
static int host_pick(const float *logits, int V, const ds_pick *pk, double u)
{
    ds_sampler s;
    ds_sampling set = {pk->temperature, pk->top_k, pk->top_p, 1.0f};
    float *w = malloc(sizeof(float) * (size_t)V);
    CHECK_OK(sampler_init(&s, &set, 0, V));
    memcpy(w, logits, sizeof(float) * (size_t)V);
    sampler_penalise(w, pk->hist, pk->n_hist, pk->penalty);
    int k = sampler_pick_u(&s, w, u);
    sampler_free(&s);
    free(w);
    return k;
}

void check_forward_pick(ds_model *m, const int32_t *tok, int n, bool exact)
{
    static const struct {
        float t;
        int k;
        float p, pen;
    } sets[] = {{0, 0, 1, 1},      {0.7f, 0, 1, 1},    {1, 5, 1, 1},       {1, 0, 0.8f, 1},
                {2, 30, 0.95f, 1}, {0, 0, 1, 1.5f},    {1, 0, 1, 1.5f},    {0.8f, 10, 0.9f, 0.6f}};
    static const double us[] = {0.05, 0.5, 0.93};
    int V = m->cfg.vocab_size;
    ds_kvcache *kv = NULL;
    int *seq = calloc((size_t)n, sizeof(int)), *pos = malloc(sizeof(int) * (size_t)n);
    bool *want = calloc((size_t)n, 1);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)n);
    ds_sampler dist;
    CHECK_OK(sampler_init(&dist, &(ds_sampling){1, 0, 1, 1}, 0, V));
    CHECK_OK(kvcache_new(&kv, m, 1, n));
    for (int i = 0; i < n; i++) pos[i] = i;
    CHECK_OK(model_forward(m, kv, n - 1, tok, seq, pos, want, NULL));
    want[0] = true;
    CHECK_OK(model_forward(m, kv, 1, tok + n - 1, seq, pos + n - 1, want, logits));
    int n_hist = sampler_distinct(&dist, tok, n, hist), bad = 0, calls = 0;
    for (size_t k = 0; k < sizeof sets / sizeof *sets && !t_failures; k++)
        for (size_t ui = 0; ui < sizeof us / sizeof *us; ui++) {
            ds_pick pk = {sets[k].t, sets[k].k, sets[k].p, us[ui], sets[k].pen, 0, NULL};
            if (sets[k].pen != 1) {
                pk.n_hist = n_hist;
                pk.hist = hist;
            }
            int32_t got = -1;
            CHECK_OK(model_forward_pick(m, kv, 1, tok + n - 1, seq, pos + n - 1, &pk, &got));
            calls++;
            int want_tok = host_pick(logits, V, &pk, pk.u);
            if (got == want_tok) continue;
            int lo = host_pick(logits, V, &pk, pk.u - 1e-4), hi = host_pick(logits, V, &pk, pk.u + 1e-4);
            if (!exact && got >= lo && got <= hi) continue;
            bad++;
            fprintf(stderr, "  T %g top-k %d top-p %g penalty %g u %g: picked %d, the host %d (%d .. %d)\n",
                    pk.temperature, pk.top_k, pk.top_p, pk.penalty, pk.u, got, want_tok, lo, hi);
        }
    CHECK_MSG(bad == 0, "model_forward_pick: %d of %d picks differ from the host sampler's", bad, calls);
    printf("model_forward_pick: %d picks (greedy, temperature, top-k, top-p, penalty) as the host sampler's\n", calls);
    sampler_free(&dist);
    kvcache_free(kv);
    free(seq);
    free(pos);
    free(want);
    free(logits);
    free(hist);
}
