/* test_spec_sample.c - speculative sampling with the MTP module keeps the
 * output distribution of plain sampling, on models/dsv3-mini.
 *
 * For one prompt (a prefix of the reference sequence s24), the first three
 * tokens are sampled S times with ds_generate plainly and S times with
 * spec_draft 2 (independent seeds, eight sequences a call; the fourth token is
 * sampled so that the step after the first can draft two), under two settings:
 * temperature 1, and temperature 0.8 with top-k 20, top-p 0.9 and a repetition
 * penalty of 1.3 (the processing applied to the draft's and the model's
 * distributions alike). A two-sample chi-square test compares the two samples'
 * counts of each of the four tokens and of the pair (token 1, token 2), tokens
 * seen fewer than 10 times in both together pooled into one class; each
 * p-value must exceed 0.001. The seeds are fixed, so the outcome is too. The
 * test's power is checked on the same sizes: plain sampling at temperature
 * 0.8 against plain sampling at 1 must be told apart (p < 0.001) by every
 * statistic after the first token's. Steps that
 * accepted 0, 1 and 2 drafts must all occur (the rule's three branches). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv3.h"
#include "io/safetensors.h"
#include "test.h"

#ifndef DSV3_TRAINED_DIR
#define DSV3_TRAINED_DIR "models/dsv3-mini"
#endif

#define S 2000      /* samples per variant */
#define BATCH 8     /* sequences a ds_generate call */
#define LEN 4       /* tokens sampled per sample (the second step can draft 2) */
#define MIN_CLASS 10

/* S samples of LEN tokens into out (S, LEN): seeds seed0 + i. */
static void sample(ds_engine *e, const ds_sampler_params *sp, uint64_t seed0, int draft, const int32_t *prompt,
                   int len, int32_t *out)
{
    ds_generate_params gp = ds_generate_default_params();
    gp.max_new_tokens = LEN;
    gp.eos = -1;
    gp.spec_draft = draft;
    for (int i = 0; i < S && !t_failures; i += BATCH) {
        ds_token_sampler *sm[BATCH] = {0};
        const int32_t *pr[BATCH];
        int lens[BATCH];
        ds_completion c[BATCH];
        for (int k = 0; k < BATCH; k++) {
            ds_sampler_params p = *sp;
            p.seed = seed0 + (uint64_t)(i + k);
            CHECK_OK(ds_sampler_new(&p, ds_engine_n_vocab(e), &sm[k]));
            pr[k] = prompt;
            lens[k] = len;
        }
        CHECK_OK(ds_generate(e, BATCH, NULL, pr, lens, sm, &gp, c));
        for (int k = 0; k < BATCH; k++) {
            if (!t_failures) {
                CHECK(c[k].n_tokens == LEN);
                memcpy(out + (size_t)(i + k) * LEN, c[k].tokens, sizeof(int32_t) * LEN);
            }
            ds_free(c[k].tokens);
            ds_sampler_free(sm[k]);
        }
    }
}

/* The class of sample i: token j, or (j == LEN) the pair of tokens 0 and 1. */
static int64_t key(const int32_t *x, int i, int j)
{
    const int32_t *r = x + (size_t)i * LEN;
    return j < LEN ? r[j] : (int64_t)r[0] * 1000000 + r[1];
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* P(X > x) for X chi-square with df degrees of freedom (Wilson-Hilferty). */
static double chi2_sf(double x, int df)
{
    if (df < 1) return 1;
    double k = df, z = (cbrt(x / k) - (1 - 2 / (9 * k))) / sqrt(2 / (9 * k));
    return 0.5 * erfc(z / sqrt(2));
}

/* The two-sample chi-square p-value of a and b's classes j. */
static double two_sample(const int32_t *a, const int32_t *b, int j, int *classes)
{
    int64_t *k = malloc(sizeof(int64_t) * 2 * S);
    int *ca = malloc(sizeof(int) * 2 * S), *cb = malloc(sizeof(int) * 2 * S);
    for (int i = 0; i < S; i++) {
        k[i] = key(a, i, j);
        k[S + i] = key(b, i, j);
    }
    qsort(k, 2 * S, sizeof *k, cmp_i64);
    int nk = 0;
    for (int i = 0; i < 2 * S; i++)
        if (!i || k[i] != k[i - 1]) k[nk++] = k[i];
    memset(ca, 0, sizeof(int) * (size_t)nk);
    memset(cb, 0, sizeof(int) * (size_t)nk);
    for (int i = 0; i < S; i++) {
        int64_t x = key(a, i, j), y = key(b, i, j);
        ca[(int64_t *)bsearch(&x, k, (size_t)nk, sizeof *k, cmp_i64) - k]++;
        cb[(int64_t *)bsearch(&y, k, (size_t)nk, sizeof *k, cmp_i64) - k]++;
    }
    double x2 = 0;
    int df = -1, pa = 0, pb = 0; /* the pooled class */
    for (int i = 0; i <= nk; i++) {
        int u, v;
        if (i < nk && ca[i] + cb[i] < MIN_CLASS) {
            pa += ca[i];
            pb += cb[i];
            continue;
        }
        u = i < nk ? ca[i] : pa;
        v = i < nk ? cb[i] : pb;
        if (u + v == 0) continue;
        double ex = (u + v) / 2.0; /* equal sample sizes */
        x2 += (u - ex) * (u - ex) / ex + (v - ex) * (v - ex) / ex;
        df++;
    }
    free(k);
    free(ca);
    free(cb);
    *classes = df + 1;
    return chi2_sf(x2, df);
}

static const char *const what[LEN + 1] = {"token 1", "token 2", "token 3", "token 4", "tokens 1-2"};

int main(void)
{
    const char *dir = DSV3_TRAINED_DIR;
    char path[4096];
    st_file *ref = NULL;
    snprintf(path, sizeof path, "%s/ref/ref_logits.safetensors", dir);
    CHECK_OK(st_open(&ref, path));
    const st_tensor *t = ref ? st_find(ref, "s24/tokens") : NULL;
    CHECK(t && t->dtype == ST_I32 && t->numel >= 8);
    if (t_failures) return t_done("train_spec_sample");
    int32_t prompt[8];
    memcpy(prompt, t->data, sizeof prompt);
    ds_engine_params p = ds_engine_default_params();
    p.device = "cpu";
    p.no_tokenizer = true;
    p.n_threads = 1; /* passes of a few tokens: a second thread only waits */
    p.n_seq = BATCH;
    p.n_ctx = 32;
    p.mtp = true;
    ds_engine *e = NULL;
    CHECK_OK(ds_engine_load(dir, &p, &e));
    int32_t *plain = malloc(sizeof(int32_t) * S * LEN), *spec = malloc(sizeof(int32_t) * S * LEN);
    CHECK(e && plain && spec);
    for (int set = 0; set < 2 && !t_failures; set++) {
        ds_sampler_params sp = ds_sampler_default_params();
        sp.temperature = set ? 0.8f : 1.0f;
        if (set) {
            sp.top_k = 20;
            sp.top_p = 0.9f;
            sp.repetition_penalty = 1.3f;
        }
        ds_engine_stats a, b;
        sample(e, &sp, 1000, 0, prompt, 8, plain);
        ds_engine_get_stats(e, &a);
        sample(e, &sp, 900000, 2, prompt, 8, spec);
        ds_engine_get_stats(e, &b);
        long n[3];
        for (int k = 0; k < 3; k++) n[k] = b.spec_accept_len[k] - a.spec_accept_len[k];
        printf("%s: %d samples each; steps that accepted 0, 1, 2 drafts: %ld %ld %ld\n",
               set ? "T 0.8, top-k 20, top-p 0.9, penalty 1.3" : "T 1", S, n[0], n[1], n[2]);
        for (int k = 0; k < 3; k++) CHECK_MSG(n[k] > 0, "no step accepted %d drafts", k);
        for (int j = 0; j <= LEN; j++) {
            int classes;
            double pv = two_sample(plain, spec, j, &classes);
            printf("  %-10s plain vs speculative: %4d classes, p = %.4f\n", what[j], classes, pv);
            CHECK_MSG(pv > 0.001, "%s: the speculative sample's distribution differs from plain's (p = %.2g)", what[j],
                      pv);
        }
        if (set) continue;
        /* power: temperature 0.8 against 1, same sizes */
        sp.temperature = 0.8f;
        sample(e, &sp, 1000 + S, 0, prompt, 8, spec);
        for (int j = 0; j <= LEN; j++) {
            int classes;
            double pv = two_sample(plain, spec, j, &classes);
            printf("  power: %-10s T 0.8 vs T 1 (plain): %4d classes, p = %.2g\n", what[j], classes, pv);
            if (j >= 1) CHECK_MSG(pv < 0.001, "the test cannot tell temperature 0.8 from 1 (%s, p = %.2g)", what[j], pv);
        }
    }
    free(plain);
    free(spec);
    ds_engine_free(e);
    st_close(ref);
    return t_done("train_spec_sample");
}
