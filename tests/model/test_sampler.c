/* test_sampler.c - the sampler against an oracle written from sampler.h's
 * definition in double precision: the argmax, the repetition penalty, the set
 * of tokens top-k and top-p keep, and the frequencies of many draws (a
 * chi-square bound) at small and full vocabulary sizes. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "model/sampler.h"
#include "test.h"

static uint64_t g_seed = 12345;

static double urand(void)
{
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_seed >> 11) / 9007199254740992.0;
}

static float nrand(void) /* roughly N(0, 1) */
{
    double u = 0;
    for (int i = 0; i < 12; i++) u += urand();
    return (float)(u - 6);
}

/* ---- the oracle ----------------------------------------------------------- */

typedef struct {
    int id;
    double p;
} tp;

static int by_p_desc(const void *a, const void *b)
{
    const tp *x = a, *y = b;
    return x->p < y->p ? 1 : x->p > y->p ? -1 : x->id - y->id;
}

/* The penalised logits (each distinct history token once, CTRL's rule). */
static void oracle_penalise(float *l, int V, const int32_t *hist, int nh, float pen)
{
    char *seen = calloc((size_t)V, 1);
    for (int i = 0; i < nh; i++)
        if (hist[i] >= 0 && hist[i] < V && !seen[hist[i]]) {
            seen[hist[i]] = 1;
            l[hist[i]] = l[hist[i]] > 0 ? l[hist[i]] / pen : l[hist[i]] * pen;
        }
    free(seen);
}

/* The kept tokens in order and their renormalised probabilities; returns n.
 * *lo..n: the counts top-p could give when the cumulative sum passes top_p
 * within 1e-6 of it (float rounding may decide either way). */
static int oracle_kept(const float *l, int V, const ds_sampling *p, tp *out, int *lo)
{
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < V; i++) sum += exp(((double)l[i] - mx) / p->temperature);
    for (int i = 0; i < V; i++) out[i] = (tp){i, exp(((double)l[i] - mx) / p->temperature) / sum};
    qsort(out, (size_t)V, sizeof(tp), by_p_desc);
    int n = V;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    *lo = n;
    if (p->top_p < 1) {
        double acc = 0;
        for (int i = 0; i < n; i++) {
            acc += out[i].p;
            if (acc >= p->top_p - 1e-6 && *lo == n) *lo = i + 1;
            if (acc >= p->top_p + 1e-6) {
                n = i + 1;
                break;
            }
        }
    }
    double kept = 0;
    for (int i = 0; i < n; i++) kept += out[i].p;
    for (int i = 0; i < n; i++) out[i].p /= kept;
    return n;
}

/* ---- checks ---------------------------------------------------------------- */

static void check_argmax(void)
{
    float x[9] = {1, 3, -2, 3, 0, 2.5f, 3, -7, 1};
    CHECK(sampler_argmax(x, 9) == 1); /* the first of three equal maxima */
    CHECK(sampler_argmax(x, 1) == 0);
    x[1] = NAN;
    CHECK(sampler_argmax(x, 9) == 3); /* a NaN never wins */
    x[0] = NAN;
    CHECK(sampler_argmax(x, 9) == 0); /* ... but stands in x[0] */
    float y[5] = {-INFINITY, NAN, -INFINITY, NAN, -INFINITY};
    CHECK(sampler_argmax(y, 5) == 0);
    y[3] = -FLT_MAX;
    CHECK(sampler_argmax(y, 5) == 3);
    y[4] = INFINITY;
    CHECK(sampler_argmax(y, 5) == 4);
    for (int rep = 0; rep < 50; rep++) {
        int n = 1 + (int)(urand() * 3000), want = 0;
        float *v = malloc(sizeof(float) * (size_t)n);
        for (int i = 0; i < n; i++) {
            v[i] = (float)(int)(urand() * 40); /* many ties */
            if (v[i] > v[want]) want = i;
        }
        CHECK_MSG(sampler_argmax(v, n) == want, "n %d: %d, want %d", n, sampler_argmax(v, n), want);
        free(v);
    }
}

static void check_greedy_penalty(void)
{
    ds_sampler s;
    ds_sampling g = {0, 0, 1, 2.0f};
    CHECK_OK(sampler_init(&s, &g, 1, 4));
    float l[4] = {5, 2.4f, -1, -1.5f};
    int32_t h[4] = {0, 0, 0, 2};
    /* once per distinct token: 5 / 2 = 2.5 still beats 2.4 (three times would not) */
    CHECK(sampler_pick(&s, l, h, 4) == 0);
    CHECK(l[0] == 2.5f && l[1] == 2.4f && l[2] == -2 && l[3] == -1.5f);
    float l2[4] = {-1, -1.2f, -3, -9};
    int32_t h2[2] = {0, 7}; /* an id outside the vocabulary is skipped */
    CHECK(sampler_pick(&s, l2, h2, 2) == 1); /* -1 * 2 = -2 falls below -1.2 */
    sampler_free(&s);
    /* greedy is the argmax whatever top-k and top-p say */
    ds_sampling g2 = {-1, 3, 0.5f, 1};
    CHECK_OK(sampler_init(&s, &g2, 1, 4));
    float l3[4] = {0, 7, 7, 1};
    CHECK(sampler_pick(&s, l3, NULL, 0) == 1);
    sampler_free(&s);
}

/* draws of one setting against the oracle: every draw kept, and the
 * frequencies within a chi-square bound (df + 6 sqrt(2 df) + 10: far in the
 * tail for a correct sampler, and a wrong kept set or weighting lands far
 * beyond it with these counts). */
static void check_draws(const char *what, const float *logits, int V, const ds_sampling *p, const int32_t *hist,
                        int nh, int draws)
{
    float *l = malloc(sizeof(float) * (size_t)V), *w = malloc(sizeof(float) * (size_t)V);
    tp *kept = malloc(sizeof(tp) * (size_t)V);
    int *rank = malloc(sizeof(int) * (size_t)V);
    long *count = calloc((size_t)V, sizeof(long));
    memcpy(l, logits, sizeof(float) * (size_t)V);
    oracle_penalise(l, V, hist, nh, p->repetition_penalty);
    int lo, n = oracle_kept(l, V, p, kept, &lo);
    for (int i = 0; i < V; i++) rank[i] = V;
    for (int i = 0; i < V; i++) rank[kept[i].id] = i; /* kept[] holds every token, sorted */
    ds_sampler s;
    CHECK_OK(sampler_init(&s, p, 99, V));
    int outside = 0;
    for (int d = 0; d < draws; d++) {
        memcpy(w, logits, sizeof(float) * (size_t)V);
        int t = sampler_pick(&s, w, hist, nh);
        if (t < 0 || t >= V || rank[t] >= n) {
            outside++;
            continue;
        }
        count[rank[t]]++;
    }
    sampler_free(&s);
    CHECK_MSG(outside == 0, "%s: %d of %d draws outside the %d kept tokens", what, outside, draws, n);
    /* chi-square over the kept tokens expected >= 5 times; the rest pooled */
    double chi = 0, pool_e = 0, pool_o = 0;
    int df = 0;
    for (int i = 0; i < n; i++) {
        double e = kept[i].p * draws;
        if (e >= 5 && i < lo) {
            chi += (count[i] - e) * (count[i] - e) / e;
            df++;
        } else {
            pool_e += e;
            pool_o += (double)count[i];
        }
    }
    if (pool_e >= 5) {
        chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        df++;
    }
    df = df > 1 ? df - 1 : 1;
    double bound = df + 6 * sqrt(2.0 * df) + 10;
    CHECK_MSG(chi <= bound, "%s: chi-square %.1f over %d degrees of freedom (bound %.1f)", what, chi, df, bound);
    free(l);
    free(w);
    free(kept);
    free(rank);
    free(count);
}

/* Each pick against the oracle's inverse CDF for the same uniform (the
 * sampler's stream, replayed), walking the kept tokens ids ascending, with a
 * window of 1e-5 around the uniform for the float sums. This checks the
 * probabilities themselves to ~1e-5, which counting draws could not. */
static int by_id(const void *a, const void *b) { return ((const tp *)a)->id - ((const tp *)b)->id; }

/* The kept set's n tokens (the first n of sorted[]) ids ascending, renormalised. */
static void walk_list(const tp *sorted, int n, tp *out, int *pos, int V)
{
    double kept = 0;
    for (int i = 0; i < n; i++) kept += sorted[i].p;
    for (int i = 0; i < n; i++) out[i] = (tp){sorted[i].id, sorted[i].p / kept};
    qsort(out, (size_t)n, sizeof(tp), by_id);
    for (int i = 0; i < V; i++) pos[i] = -1;
    for (int i = 0; i < n; i++) pos[out[i].id] = i;
}

/* Whether t is what walking list (n tokens) gives for u, within 1e-5 of u. */
static bool walk_matches(const tp *list, const int *pos, int n, double u, int t)
{
    int at[2] = {n - 1, n - 1}; /* positions for u - 1e-5 and u + 1e-5 */
    for (int k = 0; k < 2; k++) {
        double c = 0, uk = u + (k ? 1e-5 : -1e-5);
        for (int i = 0; i < n; i++)
            if (uk < (c += list[i].p)) {
                at[k] = i;
                break;
            }
    }
    return pos[t] >= at[0] && pos[t] <= at[1];
}

static void check_inverse_cdf(const char *what, const float *logits, int V, const ds_sampling *p, int picks)
{
    tp *sorted = malloc(sizeof(tp) * (size_t)V), *list[2];
    float *w = malloc(sizeof(float) * (size_t)V);
    int *pos[2];
    int lo, n = oracle_kept(logits, V, p, sorted, &lo);
    /* the kept set with n tokens, and with lo where top-p's boundary is within rounding */
    for (int k = 0; k < 2; k++) {
        list[k] = malloc(sizeof(tp) * (size_t)V);
        pos[k] = malloc(sizeof(int) * (size_t)V);
    }
    /* oracle_kept renormalised sorted[0..n): undo that for the lo-token list */
    walk_list(sorted, n, list[0], pos[0], V);
    walk_list(sorted, lo, list[1], pos[1], V);
    ds_sampler s;
    CHECK_OK(sampler_init(&s, p, 5, V));
    rng_state r;
    rng_init(&r, 5, SAMPLER_STREAM);
    int bad = 0;
    for (int d = 0; d < picks; d++) {
        double u = rng_uniform(&r);
        memcpy(w, logits, sizeof(float) * (size_t)V);
        int t = sampler_pick(&s, w, NULL, 0);
        bool ok = t >= 0 && t < V &&
                  (walk_matches(list[0], pos[0], n, u, t) || (lo < n && walk_matches(list[1], pos[1], lo, u, t)));
        bad += !ok;
    }
    CHECK_MSG(bad == 0, "%s: %d of %d picks off the oracle's inverse CDF", what, bad, picks);
    sampler_free(&s);
    for (int k = 0; k < 2; k++) {
        free(list[k]);
        free(pos[k]);
    }
    free(sorted);
    free(w);
}

static void check_small(void)
{
    /* 12 tokens, two of them tied, one far below the rest */
    float l[12] = {2.0f, 1.5f, 1.5f, 0.3f, -0.4f, 1.0f, -2.0f, 0.9f, -60.0f, 0.0f, 2.2f, -1.0f};
    int32_t hist[3] = {10, 0, 10};
    struct {
        const char *what;
        ds_sampling p;
        int nh;
    } cases[] = {
        {"T 1", {1.0f, 0, 1, 1}, 0},
        {"T 0.5", {0.5f, 0, 1, 1}, 0},
        {"T 2 top-k 5", {2.0f, 5, 1, 1}, 0},
        {"T 1 top-k 3 (a tie at the edge)", {1.0f, 3, 1, 1}, 0},
        {"T 1 top-p 0.7", {1.0f, 0, 0.7f, 1}, 0},
        {"T 1.3 top-k 6 top-p 0.9", {1.3f, 6, 0.9f, 1}, 0},
        {"T 0.8 penalty 1.3", {0.8f, 0, 1, 1.3f}, 3},
        {"T 0.8 top-p 0.5 penalty 1.3", {0.8f, 0, 0.5f, 1.3f}, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        check_draws(cases[i].what, l, 12, &cases[i].p, hist, cases[i].nh, 40000);
        if (!cases[i].nh) check_inverse_cdf(cases[i].what, l, 12, &cases[i].p, 5000);
    }
    /* 5000 tokens */
    int V = 5000;
    float *lv = malloc(sizeof(float) * (size_t)V);
    for (int i = 0; i < V; i++) lv[i] = 2 * nrand();
    ds_sampling big[] = {{0.6f, 0, 1, 1}, {1.0f, 0, 1, 1}, {1.0f, 100, 1, 1}, {0.9f, 0, 0.8f, 1}};
    for (int i = 0; i < 4; i++) check_inverse_cdf("V 5000", lv, V, &big[i], 3000);
    /* flat: the nucleus and the top-k reach far past the tokens near the best */
    for (int i = 0; i < V; i++) lv[i] = (float)(urand() * 30);
    ds_sampling flat[] = {{1.0f, 0, 0.99f, 1}, {1.0f, 4000, 1, 1}, {1.0f, 4990, 0.999f, 1}, {2.0f, 0, 0.999999f, 1}};
    const char *fw[] = {"V 5000 flat top-p 0.99", "V 5000 flat top-k 4000", "V 5000 flat top-k 4990 top-p 0.999", "V 5000 flat T 2 top-p 0.999999"};
    for (int i = 0; i < 4; i++) check_inverse_cdf(fw[i], lv, V, &flat[i], 3000);
    free(lv);
}

static void check_vocab_size(void)
{
    int V = 129280;
    float *l = malloc(sizeof(float) * (size_t)V);
    for (int i = 0; i < V; i++) l[i] = 3 * nrand();
    l[777] = l[778] = 15; /* two clear leaders, tied */
    ds_sampling cases[] = {{0.7f, 0, 1, 1}, {0.7f, 40, 1, 1}, {1.0f, 0, 0.9f, 1}, {0.2f, 0, 1, 1}};
    const char *what[] = {"V 129280 T 0.7", "V 129280 T 0.7 top-k 40", "V 129280 T 1 top-p 0.9", "V 129280 T 0.2"};
    for (int i = 0; i < 4; i++) check_draws(what[i], l, V, &cases[i], NULL, 0, 1500);
    free(l);
}

static void check_seeds_and_bad_logits(void)
{
    int V = 500;
    float *l = malloc(sizeof(float) * V), *w = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) l[i] = nrand();
    ds_sampling p = {1.0f, 0, 0.95f, 1};
    ds_sampler a, b, c;
    CHECK_OK(sampler_init(&a, &p, 7, V));
    CHECK_OK(sampler_init(&b, &p, 7, V));
    CHECK_OK(sampler_init(&c, &p, 8, V));
    int same = 1, differ = 0;
    for (int d = 0; d < 200; d++) {
        memcpy(w, l, sizeof(float) * V);
        int x = sampler_pick(&a, w, NULL, 0);
        memcpy(w, l, sizeof(float) * V);
        int y = sampler_pick(&b, w, NULL, 0);
        memcpy(w, l, sizeof(float) * V);
        int z = sampler_pick(&c, w, NULL, 0);
        same &= x == y;
        differ += x != z;
    }
    CHECK(same);
    CHECK(differ > 100);
    /* a NaN or an infinite logit: a valid id, never a crash */
    memcpy(w, l, sizeof(float) * V);
    w[3] = NAN;
    int t = sampler_pick(&a, w, NULL, 0);
    CHECK(t >= 0 && t < V);
    memcpy(w, l, sizeof(float) * V);
    w[9] = INFINITY;
    CHECK(sampler_pick(&a, w, NULL, 0) == 9);
    sampler_free(&a);
    sampler_free(&b);
    sampler_free(&c);
    /* impossible settings */
    ds_sampler s;
    CHECK(sampler_init(&s, &(ds_sampling){1, 0, 0, 1}, 1, 10) == DS_ERR_ARG);
    CHECK(sampler_init(&s, &(ds_sampling){1, -1, 1, 1}, 1, 10) == DS_ERR_ARG);
    CHECK(sampler_init(&s, &(ds_sampling){1, 0, 1, 0}, 1, 10) == DS_ERR_ARG);
    CHECK(sampler_init(&s, &(ds_sampling){NAN, 0, 1, 1}, 1, 10) == DS_ERR_ARG);
    free(l);
    free(w);
}

/* sampler_pick is sampler_pick_u with one uniform of the sampler's stream drawn
 * first (at temperature > 0; none when greedy), which the device pick relies on:
 * each setting, picks from twin samplers, one through each. */
static void check_pick_u(void)
{
    int V = 3000;
    float *l = malloc(sizeof(float) * V), *w = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) l[i] = 2 * nrand();
    static const ds_sampling sets[] = {{0, 0, 1, 1}, {0.7f, 0, 1, 1}, {0.7f, 40, 1, 1}, {1, 0, 0.9f, 1},
                                       {1.5f, 100, 0.5f, 1}};
    for (size_t k = 0; k < sizeof sets / sizeof *sets; k++) {
        ds_sampler a, b;
        CHECK_OK(sampler_init(&a, &sets[k], 11, V));
        CHECK_OK(sampler_init(&b, &sets[k], 11, V));
        int same = 1;
        for (int d = 0; d < 50; d++) {
            memcpy(w, l, sizeof(float) * V);
            int x = sampler_pick(&a, w, NULL, 0);
            double u = sets[k].temperature > 0 ? rng_uniform(&b.rng) : 0.0;
            same &= x == sampler_pick_u(&b, l, u);
        }
        CHECK_MSG(same, "setting %zu: sampler_pick and sampler_pick_u disagree", k);
        sampler_free(&a);
        sampler_free(&b);
    }
    free(l);
    free(w);
}

int main(void)
{
    check_pick_u();
    check_argmax();
    check_greedy_penalty();
    check_small();
    check_vocab_size();
    check_seeds_and_bad_logits();
    return t_done("model_sampler");
}
