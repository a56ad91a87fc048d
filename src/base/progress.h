/* progress.h - a one-line progress bar on stderr for long file operations.
 *
 * Draws only when stderr is a terminal (so logs and pipes stay clean) and at
 * most ten times a second. Not thread-safe: update it from one thread. */
#ifndef DS_PROGRESS_H
#define DS_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *label;
    uint64_t total, done;
    double t0, last_draw;
    bool on;
} progress;

/* Starts a bar for `total` units (bytes); enabled only if `want` and stderr is a tty. */
void progress_init(progress *p, const char *label, uint64_t total, bool want);
/* Adds n units and redraws if due. */
void progress_add(progress *p, uint64_t n);
/* Draws the final state and ends the line. */
void progress_done(progress *p);

#endif
