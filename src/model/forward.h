/* forward.h - between the execution layer (exec.c: batches, graphs, logits
 * delivery) and the model's math (forward.c). */
#ifndef DS_FORWARD_H
#define DS_FORWARD_H

#include "model/model.h"

/* A forward pass's tokens. The arrays are in ops->alloc memory (device memory
 * on a GPU), uploaded once per pass. */
typedef struct {
    int n, n_out;                /* tokens; rows whose logits are wanted */
    const int32_t *tok;          /* (n) token ids */
    const int *seq, *pos, *row;  /* (n) sequence, position, KV-cache row seq * ctx + pos */
    const int *out;              /* (n_out) the wanted rows, ascending */
    bool contiguous;             /* token i is sequence seq0 at position pos0 + i (a prefill) */
    int seq0, pos0;
    int pos_bound;               /* every pos[i] is below it (ds_attn_args.pos_bound; 0: unknown) */
    float *hidden;               /* NULL, or (n, dim): receives norm(h) of every token */
} fwd_batch;

/* Transformer.forward: queues the pass of b and writes the logits of its wanted
 * rows into logits (n_out, vocab_local: this rank's slice of the vocabulary,
 * ops->alloc memory). Nothing waits for the device at world size 1, so that a
 * backend graph may record the pass. */
ds_status transformer_forward(ds_model *m, ds_kvcache *kv, const fwd_batch *b, float *logits);

/* The MTP module's pass on b (b->tok: the next tokens t[i+1]) with hidden (n, dim)
 * the final-normed states the rows start from: logits of the wanted rows (n_out,
 * vocab_local); hout (NULL: none) receives every row's shared_head.norm(h') (n,
 * dim), the state a chained draft starts from. */
ds_status mtp_forward(ds_model *m, ds_kvcache *kv, const fwd_batch *b, const float *hidden, float *logits,
                      float *hout);

#endif
