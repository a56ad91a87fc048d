/* clock.h - seconds on the monotonic clock, for intervals (timings, deadlines,
 * rates): it never steps back when the wall clock is set. */
#ifndef DS_CLOCK_H
#define DS_CLOCK_H

#include <time.h>

static inline double ds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
