/* cpu_attn.c - the decode attention's split over threads, whatever the
 * instruction set: many tokens take one thread each; a few split each token's
 * positions over the threads, and one thread merges the parts. The kernels
 * (cpu_avx512.c, cpu_avx2.c) supply the part: one token over a range of
 * positions, as a running max, sum and unnormalised output per head. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "cpu_ref.h"
#include "cpu_simd.h"
#include "cpu_stats.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* Combines nparts partial results (mx, l, o) of one token into out[h][R],
 * heads [h0, h1). */
static void att_merge(int h0, int h1, int R, int nparts, float *const *mx, float *const *l, float *const *o, float *out)
{
    for (int h = h0; h < h1; h++) {
        float m = -INFINITY, sum = 0;
        for (int p = 0; p < nparts; p++) m = fmaxf(m, mx[p][h]);
        float *oh = out + (size_t)h * R;
        memset(oh, 0, sizeof(float) * (size_t)R);
        /* omp simd: the parts are other buffers than out (the compiler cannot
         * know it, and left these loops scalar: at a few positions the merge
         * was most of the attention's time) */
        for (int p = 0; p < nparts; p++) {
            if (mx[p][h] == -INFINITY) continue;
            float f = expf(mx[p][h] - m);
            const float *op = o[p] + (size_t)h * R;
            sum += l[p][h] * f;
            #pragma omp simd
            for (int c = 0; c < R; c++) oh[c] += op[c] * f;
        }
        #pragma omp simd
        for (int c = 0; c < R; c++) oh[c] /= sum;
    }
}

void cpu_attention_run(const ds_attn_args *a, int jb, cpu_att_part_fn part)
{
    double t0 = cpu_stats_on() ? ds_now() : 0;
    int H = a->n_heads, R = a->kv_rank - a->val_off, nth = omp_get_max_threads(); /* R: output row */
    bool by_token = a->n_tokens >= nth;
    float **mx = malloc(sizeof(float *) * (size_t)nth * 3), **l = mx + nth, **o = mx + 2 * nth;
    if (!mx) {
        cpu_fail_oom("attention state", sizeof(float *) * (size_t)nth * 3);
        return;
    }
    /* mx, l, o, the scores of jb positions, and room for the kernel's queries
     * transposed (H x (kv_rank + rope)) */
    size_t scratch = sizeof(float) * ((size_t)H * (2 + (size_t)jb + R + (size_t)a->kv_rank + a->rope));
    int failed = 0;
    #pragma omp parallel num_threads(nth)
    {
        int me = omp_get_thread_num(), parts = omp_get_num_threads();
        float *buf = cpu_scratch(2, scratch);
        if (!buf) {
            cpu_fail_oom("attention scratch", scratch);
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        int stop;
        #pragma omp atomic read
        stop = failed;
        /* every thread takes the same branch: the work below has barriers */
        if (!stop) {
            mx[me] = buf;
            l[me] = buf + H;
            o[me] = buf + 2 * H;
            float *sc = buf + 2 * H + (size_t)H * R;
            if (by_token) {
                #pragma omp for schedule(dynamic, 1)
                for (int t = 0; t < a->n_tokens; t++) {
                    part(a, t, 0, a->pos[t] + 1, mx[me], l[me], o[me], sc);
                    att_merge(0, H, R, 1, &mx[me], &l[me], &o[me], a->out + (size_t)t * H * R);
                }
            } else {
                for (int t = 0; t < a->n_tokens; t++) {
                    int len = a->pos[t] + 1, per = (len + parts - 1) / parts;
                    int j0 = MIN(len, me * per), j1 = MIN(len, j0 + per);
                    part(a, t, j0, j1, mx[me], l[me], o[me], sc);
                    #pragma omp barrier
                    /* a head a thread: one thread merging every head's parts (16 x 16
                     * rows of 512 with 16 threads) would keep the others waiting */
                    #pragma omp for schedule(static)
                    for (int h = 0; h < H; h++) att_merge(h, h + 1, R, parts, mx, l, o, a->out + (size_t)t * H * R);
                }
            }
        }
    }
    free(mx);
    if (cpu_stats_on()) cpu_stats_note(CPU_STAT_ATTENTION, 0, t0);
}
