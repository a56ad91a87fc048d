/* sampler.c - greedy, temperature, top-k, top-p and repetition penalty. */
#include "sampler.h"

#include <limits.h>
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
    rng_init(&s->rng, seed, SAMPLER_STREAM);
    s->probs = malloc(sizeof(float) * (size_t)vocab);
    s->order = malloc(sizeof(int) * (size_t)vocab);
    s->cand = malloc(sizeof(int) * (size_t)vocab);
    s->stamp = calloc((size_t)vocab, sizeof(uint32_t));
    s->hcount = malloc(sizeof(int) * SAMPLER_BUCKETS);
    s->hmass = malloc(sizeof(double) * SAMPLER_BUCKETS);
    if (!s->probs || !s->order || !s->cand || !s->stamp || !s->hcount || !s->hmass) {
        sampler_free(s);
        return ds_errorf(DS_ERR_NOMEM, "out of memory for a sampler over %d tokens", vocab);
    }
    return DS_OK;
}

ds_status sampler_set_counts(ds_sampler *s, float presence, float frequency)
{
    if (!isfinite(presence) || !isfinite(frequency))
        return ds_errorf(DS_ERR_ARG, "presence and frequency penalties must be finite numbers");
    if ((presence != 0 || frequency != 0) && !s->count && !(s->count = calloc((size_t)s->vocab, sizeof(int))))
        return ds_errorf(DS_ERR_NOMEM, "out of memory for a sampler over %d tokens", s->vocab);
    s->presence = presence;
    s->frequency = frequency;
    return DS_OK;
}

void sampler_free(ds_sampler *s)
{
    free(s->probs);
    free(s->order);
    free(s->cand);
    free(s->stamp);
    free(s->hcount);
    free(s->hmass);
    free(s->count);
    s->count = NULL;
    s->probs = NULL;
    s->order = NULL;
    s->cand = NULL;
    s->stamp = NULL;
    s->hcount = NULL;
    s->hmass = NULL;
}

/* The largest value, NaNs skipped unless x[0] is one. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static float max_value(const float *x, int n)
{
    float m = x[0];
    #pragma omp simd reduction(max : m)
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

int sampler_argmax(const float *x, int n)
{
    if (x[0] != x[0]) return 0; /* a NaN in x[0] stands */
    float m = max_value(x, n);
    for (int i = 0; i < n; i++)
        if (x[i] == m) return i;
    return 0; /* not reached: m is one of x */
}

/* qsort has no context argument: the key is per thread, so that samplers of
 * different threads (several engines, or a caller's own threads) never mix. */
static _Thread_local const float *g_sort_key;

static int by_prob_desc(const void *a, const void *b)
{
    float x = g_sort_key[*(const int *)a], y = g_sort_key[*(const int *)b];
    return x < y ? 1 : x > y ? -1 : (*(const int *)a - *(const int *)b);
}

int sampler_distinct(ds_sampler *s, const int32_t *history, int n_history, int32_t *out)
{
    if (++s->epoch == 0) { /* wrapped: old stamps could match */
        memset(s->stamp, 0, sizeof(uint32_t) * (size_t)s->vocab);
        s->epoch = 1;
    }
    int n = 0;
    for (int i = 0; i < n_history; i++) {
        int t = history[i];
        if (t < 0 || t >= s->vocab || s->stamp[t] == s->epoch) continue;
        s->stamp[t] = s->epoch;
        out[n++] = t;
    }
    return n;
}

void sampler_penalise(float *logits, const int32_t *ids, int n, float penalty)
{
    for (int i = 0; i < n; i++) {
        float *l = &logits[ids[i]];
        *l = *l > 0 ? *l / penalty : *l * penalty;
    }
}

/* Each distinct token of the history once, CTRL's rule (s->order as the list). */
static void penalise(ds_sampler *s, float *logits, const int32_t *history, int n_history)
{
    int n = sampler_distinct(s, history, n_history, s->order); /* at most vocab */
    sampler_penalise(logits, s->order, n, s->p.repetition_penalty);
}

/* e^z for z in [-87, 0]: z = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial
 * in r (relative error ~2e-7) times 2^n built in the exponent bits. Branch-free
 * and without library calls, so that the loop below vectorises. */
static inline float exp_neg(float z)
{
    z = z < -87.0f ? -87.0f : z;
    float t = z * 1.44269504f + 12582912.0f; /* 1.5 * 2^23: rounds z / ln2 to an integer */
    float n = t - 12582912.0f;
    float r = (z - n * 0.693359375f) + n * 2.12194440e-4f; /* ln2 in two parts */
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* e[i] = exp((l[i] - mx) / t), or 0 where (l[i] - mx) / t < SAMPLER_CUT (a NaN
 * included); returns the sum. One clone per instruction set, picked at load. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static float exp_all(float *e, const float *l, int n,
                                                                                   float mx, float inv_t)
{
    float sum = 0;
    #pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) {
        float z = (l[i] - mx) * inv_t;
        float v = z >= SAMPLER_CUT ? exp_neg(z) : 0.0f;
        e[i] = v;
        sum += v;
    }
    return sum;
}

/* p's bucket: its float bits (p in (0, 1], so the sign is 0) without the 19 low
 * mantissa bits. Larger p, same or larger bucket. */
static inline int bucket(float p)
{
    uint32_t b;
    memcpy(&b, &p, sizeof b);
    return (int)(b >> 19);
}

/* The last token top-k and top-p keep, in the order probability descending then
 * id: every token before it is kept. The tokens are the nc candidates' ids
 * (probabilities p); a histogram of buckets finds the one where the count or
 * the mass passes the limit, and only that bucket's tokens are sorted. -1 if
 * neither limit is met within the candidates (all of them would be kept). */
static int last_kept(ds_sampler *s, const float *p, const int *cand, int nc)
{
    int *cnt = s->hcount;
    double *mass = s->hmass;
    memset(cnt, 0, sizeof(int) * SAMPLER_BUCKETS);
    memset(mass, 0, sizeof(double) * SAMPLER_BUCKETS);
    for (int i = 0; i < nc; i++) {
        int k = bucket(p[cand[i]]);
        cnt[k]++;
        mass[k] += p[cand[i]];
    }
    long k_left = s->p.top_k > 0 ? s->p.top_k : LONG_MAX; /* tokens still to keep */
    double p_left = s->p.top_p < 1 ? s->p.top_p : 2;      /* mass still to reach */
    int B = SAMPLER_BUCKETS - 1;
    for (; B >= 0; B--) {
        if (!cnt[B]) continue;
        if (cnt[B] >= k_left || mass[B] >= p_left) break;
        k_left -= cnt[B];
        p_left -= mass[B];
    }
    if (B < 0) return -1;
    int m = 0;
    for (int i = 0; i < nc; i++)
        if (bucket(p[cand[i]]) == B) s->order[m++] = cand[i];
    g_sort_key = p;
    qsort(s->order, (size_t)m, sizeof(int), by_prob_desc);
    int q = 0;
    double acc = 0;
    while (q < m - 1 && q + 1 < k_left && (acc += p[s->order[q]]) < p_left) q++;
    return s->order[q];
}

/* The ids ascending of the tokens with p[i] >= lim (> 0 if lim is 0), without
 * branches: a flat distribution would mispredict every other one. */
static int candidates(int *cand, const float *p, int V, float lim)
{
    int nc = 0;
    for (int i = 0; i < V; i++) {
        cand[nc] = i;
        nc += lim > 0 ? p[i] >= lim : p[i] > 0;
    }
    return nc;
}

/* The inverse CDF at u of the weights e (sum: theirs), ids ascending (a cut
 * token's 0 moves nothing); best if rounding leaves u past the end. */
static int draw_weights(const float *e, int V, float sum, double u, int best)
{
    double t = u * sum, c = 0;
    int last = best;
    for (int i = 0; i < V; i++) {
        c += e[i];
        last = e[i] > 0 ? i : last;
        if (t < c) return i;
    }
    return last;
}

int sampler_draw(const float *logits, int V, float temperature, double u, float *scratch)
{
    int best = sampler_argmax(logits, V);
    if (!(temperature > 0)) return best;
    float sum = exp_all(scratch, logits, V, logits[best], 1.0f / temperature);
    if (!(sum >= 1 && sum < INFINITY)) return best; /* a NaN or an infinite logit */
    return draw_weights(scratch, V, sum, u, best);
}

int32_t sampler_pick_u(ds_sampler *s, const float *logits, double u)
{
    int V = s->vocab;
    if (!(s->p.top_k > 0 || s->p.top_p < 1)) return sampler_draw(logits, V, s->p.temperature, u, s->probs);
    int best = sampler_argmax(logits, V);
    if (!(s->p.temperature > 0)) return best;
    float *e = s->probs, sum = exp_all(e, logits, V, logits[best], 1.0f / s->p.temperature);
    if (!(sum >= 1 && sum < INFINITY)) return best; /* a NaN or an infinite logit */
    /* as probabilities. The boundary is looked for among the tokens within 2^-20
     * of the best first (few, for a peaked distribution), else among all: the
     * tokens left out come after every one taken in the order. */
    float inv = 1.0f / sum;
    for (int i = 0; i < V; i++) e[i] *= inv;
    int *cand = s->cand, nc = candidates(cand, e, V, e[best] * 0x1p-20f);
    int it = last_kept(s, e, cand, nc);
    if (it < 0) {
        nc = candidates(cand, e, V, 0);
        it = last_kept(s, e, cand, nc);
        if (it < 0) { /* neither limit met: all kept, up to the least likely */
            it = cand[nc - 1];
            for (int i = 0; i < nc; i++)
                if (e[cand[i]] < e[it] || (e[cand[i]] == e[it] && cand[i] > it)) it = cand[i];
        }
    }
    /* the kept tokens (up to it in the order), ids ascending: all among cand */
    float pt = e[it];
    double kept = 0;
    for (int i = 0; i < nc; i++) {
        float pi = e[cand[i]];
        kept += pi > pt || (pi == pt && cand[i] <= it) ? pi : 0.0f;
    }
    double t = u * kept, c = 0;
    int last = it;
    for (int i = 0; i < nc; i++) {
        float pi = e[cand[i]];
        bool in = pi > pt || (pi == pt && cand[i] <= it);
        c += in ? pi : 0.0f;
        last = in ? cand[i] : last;
        if (in && t < c) return cand[i];
    }
    return last;
}

/* The last token sampler_pick_u keeps (top-k, top-p) of the normalised e, in
 * the order probability descending then id, as it finds it. */
static int kept_last(ds_sampler *s, float *e, int V, int best)
{
    int *cand = s->cand, nc = candidates(cand, e, V, e[best] * 0x1p-20f);
    int it = last_kept(s, e, cand, nc);
    if (it >= 0) return it;
    nc = candidates(cand, e, V, 0);
    it = last_kept(s, e, cand, nc);
    if (it >= 0) return it;
    it = cand[nc - 1]; /* neither limit met: all kept, up to the least likely */
    for (int i = 0; i < nc; i++)
        if (e[cand[i]] < e[it] || (e[cand[i]] == e[it] && cand[i] > it)) it = cand[i];
    return it;
}

/* logit[t] -= presence + frequency * count(t) for each distinct valid t of the
 * history (s->cand lists them; s->count is zero again afterwards). */
static void penalise_counts(ds_sampler *s, float *logits, const int32_t *history, int n_history)
{
    int n = 0;
    for (int i = 0; i < n_history; i++) {
        int t = history[i];
        if (t < 0 || t >= s->vocab) continue;
        if (s->count[t]++ == 0) s->cand[n++] = t;
    }
    for (int i = 0; i < n; i++) {
        int t = s->cand[i];
        logits[t] -= s->presence + s->frequency * (float)s->count[t];
        s->count[t] = 0;
    }
}

int32_t sampler_pick(ds_sampler *s, float *logits, const int32_t *history, int n_history)
{
    if (s->p.repetition_penalty != 1.0f) penalise(s, logits, history, n_history);
    if (s->presence != 0 || s->frequency != 0) penalise_counts(s, logits, history, n_history);
    return sampler_pick_u(s, logits, s->p.temperature > 0 ? rng_uniform(&s->rng) : 0.0);
}

void sampler_probs(ds_sampler *s, float *logits, const int32_t *history, int n_history, float *probs)
{
    int V = s->vocab;
    if (s->p.repetition_penalty != 1.0f) penalise(s, logits, history, n_history);
    if (s->presence != 0 || s->frequency != 0) penalise_counts(s, logits, history, n_history);
    int best = sampler_argmax(logits, V);
    float sum = s->p.temperature > 0 ? exp_all(probs, logits, V, logits[best], 1.0f / s->p.temperature) : 0;
    if (!(sum >= 1 && sum < INFINITY)) { /* greedy, or a NaN or an infinite logit: the argmax */
        memset(probs, 0, sizeof(float) * (size_t)V);
        probs[best] = 1;
        return;
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < V; i++) probs[i] *= inv;
    if (!(s->p.top_k > 0 || s->p.top_p < 1)) return;
    int it = kept_last(s, probs, V, best);
    float pt = probs[it];
    double kept = 0;
    for (int i = 0; i < V; i++) {
        bool in = probs[i] > pt || (probs[i] == pt && i <= it);
        probs[i] = in ? probs[i] : 0.0f;
        kept += probs[i];
    }
    float k = (float)(1.0 / kept);
    for (int i = 0; i < V; i++) probs[i] *= k;
}
