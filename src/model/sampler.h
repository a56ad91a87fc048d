/* sampler.h - choosing the next token from logits.
 *
 * temperature <= 0 is greedy (argmax, as the reference). Otherwise, in order:
 * repetition penalty on tokens already in the sequence (CTRL's rule: a
 * positive logit is divided by the penalty, a negative one multiplied),
 * division by the temperature, top-k, top-p (the smallest set of tokens whose
 * probability reaches p), then a draw from the renormalised distribution. The
 * reference's draw (softmax, then argmax of p / Exp(1)) is the same
 * distribution; --seed makes the draws reproducible.
 *
 * Tokens more than SAMPLER_CUT below the best after the temperature (a
 * probability under e^-40 of the best one's, 4e-18) count as 0: all of them
 * together weigh less than float's rounding of the sum, and top-k, top-p and
 * the draw then skip them. Ties in probability keep the lower token id
 * first. */
#ifndef DS_SAMPLER_H
#define DS_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/rng.h"
#include "base/status.h"

#define SAMPLER_CUT (-40.0f)
/* A pick at temperature > 0 takes one rng_uniform() of the stream (seed,
 * SAMPLER_STREAM), drawn before anything else, and walks the kept tokens, ids
 * ascending, until their running sum passes it. */
#define SAMPLER_STREAM 0x5a3b1e
#define SAMPLER_BUCKETS 2048 /* probabilities in (0, 1] by their float bits >> 19 */

typedef struct {
    float temperature;        /* 0: greedy */
    int top_k;                /* 0: off */
    float top_p;              /* 1: off */
    float repetition_penalty; /* 1: off */
} ds_sampling;

typedef struct {
    ds_sampling p;
    rng_state rng;
    int vocab;
    float *probs;             /* scratch (vocab) */
    int *order, *cand;        /* scratch (vocab) */
    uint32_t *stamp, epoch;   /* repetition penalty: stamp[t] == epoch once t is done */
    /* OpenAI's penalties, after the repetition penalty: logit[t] -= presence
     * (once) + frequency * (occurrences of t in the history); 0: off
     * (sampler_set_counts). Host only: a device pick (ds_pick) carries neither. */
    float presence, frequency;
    int *count;               /* occurrences (vocab), zero between picks; NULL while both are off */
    int *hcount;              /* top-k / top-p histogram (SAMPLER_BUCKETS) */
    double *hmass;
} ds_sampler;

/* Returns DS_ERR_ARG for impossible settings (negative temperature is allowed
 * and means greedy; top_p outside (0, 1]; top_k < 0; penalty <= 0). */
ds_status sampler_init(ds_sampler *s, const ds_sampling *p, uint64_t seed, int vocab);
void sampler_free(ds_sampler *s);

/* Sets the presence and frequency penalties (finite; 0: off). */
ds_status sampler_set_counts(ds_sampler *s, float presence, float frequency);

/* Picks a token. logits (vocab) may be modified. history: tokens seen so far
 * in this sequence (for the penalties). */
int32_t sampler_pick(ds_sampler *s, float *logits, const int32_t *history, int n_history);

/* The distinct ids of history that are valid tokens (0 <= id < vocab), in the
 * order they first appear, into out (min(n_history, vocab) ids at most);
 * returns their count. */
int sampler_distinct(ds_sampler *s, const int32_t *history, int n_history, int32_t *out);

/* The repetition penalty on logits[ids[i]] for i < n (ids distinct): a positive
 * logit divided by penalty, a negative one multiplied (CTRL's rule). */
void sampler_penalise(float *logits, const int32_t *ids, int n, float penalty);

/* sampler_pick after the penalty, with the uniform u in [0, 1) given (the
 * stream untouched): temperature, top-k, top-p and the draw. */
int32_t sampler_pick_u(ds_sampler *s, const float *logits, double u);

/* The distribution sampler_pick draws from for these logits and history: the
 * penalties, temperature, top-k and top-p applied, into probs (vocab floats,
 * summing to 1, 0 for every token left out); greedy (temperature 0), 1 at the
 * argmax. logits is modified. Draws nothing from the stream. */
void sampler_probs(ds_sampler *s, float *logits, const int32_t *history, int n_history, float *probs);

/* The first index of the largest of x[0..n), n >= 1 (NaNs never win; a NaN in
 * x[0] stands). */
int sampler_argmax(const float *x, int n);

/* A pick at temperature T without top-k, top-p or penalty, for the uniform u in
 * [0, 1): what sampler_pick does with that u (greedy for T <= 0). scratch: V
 * floats. */
int sampler_draw(const float *logits, int V, float temperature, double u, float *scratch);

#endif
