/* golden_run.h - what the golden-logit tests of every backend share: running the
 * reference's token sequences through a model and comparing with its rows. */
#ifndef DS_GOLDEN_RUN_H
#define DS_GOLDEN_RUN_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "io/safetensors.h"
#include "model/model.h"

int golden_argmax(const float *x, int n);
double golden_cosine(const float *a, const float *b, int n);
/* The mean over rows of V logits of each row's cosine. */
double golden_mean_cosine(const float *got, const float *ref, int rows, int V);

/* n tokens of one sequence through a fresh cache of m as one prefill (logits at
 * every position) or stepwise, n x V logits (the caller frees them); after, when
 * not NULL, runs once the forward passes are queued (a backend's status check). */
float *golden_run(ds_model *m, const int32_t *tok, int n, bool stepwise, void (*after)(void));

/* Compares n rows of V logits with the reference's (a test's own bar). */
typedef void golden_compare_fn(const char *label, const float *got, const float *ref, int rows, int V);

typedef struct {
    const char *row;   /* the reference's rows: "absorb", "naive", "fp8gemm", "fp8gemm_ue8m0" */
    const char *label; /* printed and in failures */
    bool fp8;          /* FP8 GEMM path: mean cosine >= 0.9 instead of cmp */
} golden_mode;

/* s8, s40 and s200 of seqs through m, each as one prefill and stepwise, against
 * ref's rows of md: cmp on every row (and the prefill's last row against
 * prefill_last), or on the FP8 GEMM path mean cosines >= 0.9 (FP8 activation
 * quantisation makes the random network chaotic). pick: on s40 also
 * check_forward_pick (pick_exact as given). */
void golden_sequences(ds_model *m, st_file *ref, json_t *seqs, const golden_mode *md, golden_compare_fn *cmp,
                      bool pick, bool pick_exact, void (*after)(void));

#endif
