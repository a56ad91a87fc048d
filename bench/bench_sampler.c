/* bench_sampler.c - microseconds per sampler_pick at DeepSeek-V3's vocabulary
 * (129280 tokens) for greedy, the default temperature, top-k, top-p and a
 * repetition penalty over a long history, on two kinds of logits: N(0, 3^2)
 * (peaked, as a trained model's) and uniform in [-10, 10] (flat: large top-p
 * sets). Beside each figure: the time to read the logits once at the read
 * bandwidth measured in the same run, the floor of any sampler.
 *   bench_sampler   (see bench/sampler.sh) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_peak.h"
#include "base/clock.h"
#include "model/sampler.h"

static uint64_t g_seed = 1;

static double urand(void)
{
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_seed >> 11) / 9007199254740992.0;
}

int main(void)
{
    const int V = 129280, NH = 4096, reps = 30;
    double bw = cpu_read_bandwidth((size_t)1 << 30, 5), floor_us = 1e6 * sizeof(float) * V / (bw * 1e9);
    printf("vocabulary %d; read bandwidth %.1f GB/s: reading the logits once takes %.1f us\n", V, bw, floor_us);
    float *l = malloc(sizeof(float) * V), *w = malloc(sizeof(float) * V);
    int32_t *hist = malloc(sizeof(int32_t) * NH);
    if (!l || !w || !hist) return 1;
    for (int i = 0; i < NH; i++) hist[i] = (int32_t)(urand() * V);
    struct {
        const char *what;
        ds_sampling p;
        int nh;
    } cases[] = {
        {"greedy", {0, 0, 1, 1}, 0},
        {"temperature 0.2 (generate's default)", {0.2f, 0, 1, 1}, 0},
        {"temperature 0.7, top-k 40", {0.7f, 40, 1, 1}, 0},
        {"temperature 0.7, top-p 0.9", {0.7f, 0, 0.9f, 1}, 0},
        {"temperature 0.2, penalty 1.1, 4096 history", {0.2f, 0, 1, 1.1f}, NH},
    };
    for (int kind = 0; kind < 2; kind++) {
        printf("logits %s:\n", kind ? "uniform in [-10, 10]" : "N(0, 3^2)");
        for (int i = 0; i < V; i++) {
            double u = 0;
            for (int k = 0; k < 12; k++) u += urand();
            l[i] = kind ? (float)(20 * urand() - 10) : (float)(3 * (u - 6));
        }
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            ds_sampler s;
            if (sampler_init(&s, &cases[c].p, 1, V)) return 1;
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                memcpy(w, l, sizeof(float) * V);
                double t = ds_now();
                sampler_pick(&s, w, hist, cases[c].nh);
                t = ds_now() - t;
                if (t < best) best = t;
            }
            sampler_free(&s);
            printf("  %-44s %8.1f us a pick (best of %d), %6.1fx the read\n", cases[c].what, 1e6 * best, reps,
                   1e6 * best / floor_us);
        }
    }
    free(l);
    free(w);
    free(hist);
    return 0;
}
