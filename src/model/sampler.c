/* sampler.c - greedy, temperature, top-k, top-p and repetition penalty. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

ds_status sampler_init(ds_sampler *s, const ds_sampling *p, uint64_t seed, int vocab)
{
    memset(s, 0, sizeof *s);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return ds_errorf(DS_ERR_ARG, "top-p must be in (0, 1], got %g", p->top_p);
    if (p->top_k < 0) return ds_errorf(DS_ERR_ARG, "top-k must be >= 0, got %d", p->top_k);
    if (!(p->repetition_penalty > 0))
        return ds_errorf(DS_ERR_ARG, "repetition penalty must be > 0, got %g", p->repetition_penalty);
    if (isnan(p->temperature)) return ds_errorf(DS_ERR_ARG, "temperature is not a number");
    s->p = *p;
    s->vocab = vocab;
    rng_init(&s->rng, seed, 0x5a3b1e);
    s->probs = malloc(sizeof(float) * (size_t)vocab);
    s->order = malloc(sizeof(int) * (size_t)vocab);
    if (!s->probs || !s->order) {
        sampler_free(s);
        return ds_errorf(DS_ERR_NOMEM, "out of memory for a sampler over %d tokens", vocab);
    }
    return DS_OK;
}

void sampler_free(ds_sampler *s)
{
    free(s->probs);
    free(s->order);
    s->probs = NULL;
    s->order = NULL;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static const float *g_sort_key;

static int by_prob_desc(const void *a, const void *b)
{
    float x = g_sort_key[*(const int *)a], y = g_sort_key[*(const int *)b];
    return x < y ? 1 : x > y ? -1 : (*(const int *)a - *(const int *)b);
}

int32_t sampler_pick(ds_sampler *s, float *logits, const int32_t *history, int n_history)
{
    int V = s->vocab;
    if (s->p.repetition_penalty != 1.0f)
        for (int i = 0; i < n_history; i++) {
            int t = history[i];
            if (t < 0 || t >= V) continue;
            float *l = &logits[t];
            /* applied once per distinct token: mark by comparing to a sentinel pass */
            bool seen = false;
            for (int j = 0; j < i && !seen; j++) seen = history[j] == t;
            if (!seen) *l = *l > 0 ? *l / s->p.repetition_penalty : *l * s->p.repetition_penalty;
        }
    if (!(s->p.temperature > 0)) return argmax(logits, V);
    float mx = logits[argmax(logits, V)], sum = 0;
    for (int i = 0; i < V; i++) sum += (s->probs[i] = expf((logits[i] - mx) / s->p.temperature));
    for (int i = 0; i < V; i++) s->probs[i] /= sum;
    int n = V;
    if (s->p.top_k > 0 || s->p.top_p < 1) {
        for (int i = 0; i < V; i++) s->order[i] = i;
        g_sort_key = s->probs;
        qsort(s->order, (size_t)V, sizeof(int), by_prob_desc);
        if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
        if (s->p.top_p < 1) {
            float acc = 0;
            for (int i = 0; i < n; i++) {
                acc += s->probs[s->order[i]];
                if (acc >= s->p.top_p) {
                    n = i + 1;
                    break;
                }
            }
        }
        float kept = 0;
        for (int i = 0; i < n; i++) kept += s->probs[s->order[i]];
        double u = rng_uniform(&s->rng) * kept, c = 0;
        for (int i = 0; i < n; i++) {
            c += s->probs[s->order[i]];
            if (u < c) return s->order[i];
        }
        return s->order[n - 1];
    }
    double u = rng_uniform(&s->rng), c = 0;
    for (int i = 0; i < V; i++) {
        c += s->probs[i];
        if (u < c) return i;
    }
    return argmax(logits, V);
}
