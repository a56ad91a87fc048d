/* progress.c - the stderr progress bar: percent, bytes, rate and time left. */
#include "progress.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

static void draw(progress *p, double t)
{
    double frac = p->total ? (double)p->done / (double)p->total : 1.0, dt = t - p->t0;
    double rate = dt > 0 ? (double)p->done / dt : 0;
    double eta = rate > 0 ? (double)(p->total - p->done) / rate : 0;
    char bar[31];
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    fprintf(stderr, "\r%s [%s] %5.1f%% %.2f/%.2f GB %6.1f MB/s eta %4.0fs ", p->label, bar, 100 * frac,
            (double)p->done / 1e9, (double)p->total / 1e9, rate / 1e6, eta);
    fflush(stderr);
    p->last_draw = t;
}

void progress_init(progress *p, const char *label, uint64_t total, bool want)
{
    *p = (progress){.label = label, .total = total, .on = want && isatty(STDERR_FILENO)};
    p->t0 = p->last_draw = ds_now();
}

void progress_add(progress *p, uint64_t n)
{
    p->done += n;
    if (p->done > p->total) p->done = p->total;
    if (!p->on) return;
    double t = ds_now();
    if (t - p->last_draw >= 0.1) draw(p, t);
}

void progress_done(progress *p)
{
    if (!p->on) return;
    p->done = p->total;
    draw(p, ds_now());
    fputc('\n', stderr);
    p->on = false;
}
