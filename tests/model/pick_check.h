/* pick_check.h - model_forward_pick against the host sampler, for any backend. */
#ifndef DS_PICK_CHECK_H
#define DS_PICK_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

/* Feeds tok[0..n-1) (n >= 2) to a fresh cache of m, takes the logits of token n-1
 * from model_forward, then picks it again with model_forward_pick at the same
 * position under each of several settings (greedy, temperature, top-k, top-p, the
 * repetition penalty over tok, and mixes; a few uniforms each, several calls per
 * setting, so that a backend's recorded step replays too). Each pick must be
 * sampler_pick_u's on those logits (after the penalty); with exact false, or that
 * for a uniform within 1e-4 (a device's sums differ in rounding). */
void check_forward_pick(ds_model *m, const int32_t *tok, int n, bool exact);

#endif
