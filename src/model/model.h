/* model.h - the DeepSeek-V3 transformer (the reference's model.py) on top of
 * the backend operation table.
 *
 * A forward pass takes any set of tokens, each with its sequence (a row of the
 * KV cache) and position: a prefill is one sequence's prompt, a decode step is
 * one token per sequence, and a batch may mix sequences of different lengths.
 * Each token attends to positions 0..pos of its own sequence. Logits are
 * produced for the tokens the caller marks. */
#ifndef DS_MODEL_H
#define DS_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "dist/comm.h"
#include "io/ckpt.h"
#include "io/config.h"

typedef struct {
    ds_weight wq, wq_a, wq_b, wkv_a, wkv_b, wo;  /* wq: (H*qk, dim) or wq_a (q_lora, dim) + wq_b (H*qk, q_lora) */
    float *q_norm, *kv_norm;                     /* (q_lora), (kv_lora_rank) */
    float *attn_norm, *ffn_norm;                 /* (dim) */
    bool moe;
    ds_weight w1, w2, w3;                        /* dense MLP: (inter, dim), (dim, inter), (inter, dim) */
    ds_weight gate;                              /* (n_routed_experts, dim) */
    float *gate_bias;                            /* (n_routed_experts) or NULL */
    ds_weight *ew1, *ew2, *ew3;                  /* local routed experts: (moe_inter, dim), (dim, moe_inter), ... */
    ds_weight sw1, sw2, sw3;                     /* shared experts: (n_shared*moe_inter, dim), ... */
} ds_layer;

/* How the engine runs the model; results do not depend on these beyond
 * rounding. The zero value of every field is its default. */
typedef struct {
    /* Prompt tokens per forward pass. Larger passes let each routed expert reuse
     * its weights across more tokens; attention costs the same in any chunking.
     * 0: the backend's choice (ds_ops.prefill_tokens), else 1024. */
    int prefill_chunk;
    /* Prefill passes of at least this many tokens run attention in the expanded
     * (MHA) form where the backend supports it (ds_ops.attn_head_last; fallback.c).
     * 0: 384. */
    int expand_min;
    /* Run every decode step eagerly instead of replaying a recorded backend graph. */
    bool no_graphs;
} ds_tuning;

typedef struct {
    ds_attn_impl attn;
    ds_gemm_impl gemm;
    const ds_ops *ops;     /* NULL: the CPU backend with fast kernels */
    ds_comm *comm;         /* NULL: a single process */
    ds_tuning tune;
    /* Load the multi-token-prediction module (layer index n_layers of the
     * checkpoint: DeepSeek-V3's embed_tokens, enorm, hnorm, eh_proj, one decoder
     * block, shared_head) and give the KV cache a layer for its block. Off: the
     * module is ignored. One process only. */
    bool mtp;
    /* After every layer, stop at the first non-finite value of the residual
     * stream and name the layer (downloads the stream each layer: for finding
     * where NaNs start, not for speed). The logits are checked always. */
    bool check_numerics;
} ds_model_opts;

/* The MTP module: at position i, h' = eh_proj([enorm(embed(t[i+1])); hnorm(h[i])])
 * with h[i] the main model's final-normed hidden state, then the block
 * (layers[n_layers]), then head(norm(.)) predicts t[i+2]. */
typedef struct {
    ds_weight embed, head;      /* (vocab, dim) */
    ds_weight eh_proj;          /* (dim, 2 dim) */
    float *enorm, *hnorm, *norm;/* (dim): enorm, hnorm, shared_head.norm */
} ds_mtp;

typedef struct {
    ds_config cfg;
    ds_model_opts opt;
    const ds_ops *ops;       /* the backend's own table: its capabilities (graphs, picks, uploads) */
    ds_backend be;           /* ops completed with the generic fallbacks: what the forward pass calls */
    int rank, world_size;
    int n_local_heads, n_local_experts, expert0, vocab_local, vocab0;
    int qk_head_dim;
    float softmax_scale;
    ds_ckpt *ckpt;
    bool hf_names;
    ds_weight embed, head;   /* (vocab_local, dim) */
    float *norm;             /* (dim) */
    ds_layer *layers;        /* n_blocks: the n_layers of the model, then the MTP module's block */
    int n_blocks;            /* n_layers, + 1 with the MTP module */
    ds_mtp *mtp;             /* NULL: not loaded */
    float *cos_tab, *sin_tab;/* (max_seq_len, rope/2) */
    bool dev_vectors;        /* norms, gate bias and rotary tables are in ops->alloc memory */
} ds_model;

#define DS_GRAPH_NMAX 8
/* Decode steps whose positions are all below DS_GRAPH_SHORT are recorded apart from the
 * others (when the backend has ops->mla_attend), so that their recording may take the
 * short-context form of attention (ds_attn_args.pos_bound). */
#define DS_GRAPH_SHORT 1024

/* A recorded pass, and its token arrays, logits and hidden states at the fixed
 * addresses the recording uses. */
typedef struct {
    void *graph;
    int32_t *ids;
    float *logits;
    float *hin, *hout; /* (n, dim) the MTP pass's input states; the states a pass hands back (NULL: none) */
    int runs;    /* eager steps of this n so far (the first is the warm-up) */
    bool failed; /* recording failed: eager from now on */
} ds_graph_slot;

typedef struct {
    int n_seq, ctx;          /* sequences (rows) and positions per sequence */
    ds_attn_impl attn;
    float **kv, **pe;        /* absorb, per layer: (n_seq, ctx, kv_rank), (n_seq, ctx, rope) */
    float **k, **v;          /* naive, per layer: (n_seq, ctx, H, qk), (n_seq, ctx, H, vdim) */
    int n_layers;
    const ds_ops *ops;
    /* Passes of n <= DS_GRAPH_NMAX tokens recorded as backend graphs (ops->graph_*;
     * exec.c), indexed by class (0: positions below DS_GRAPH_SHORT, 1: any) and n:
     * decode steps; decode steps that hand back the hidden states (the MTP
     * module's input: speculative decoding's checks); the MTP module's passes. */
    ds_graph_slot dec[2][DS_GRAPH_NMAX + 1], dech[2][DS_GRAPH_NMAX + 1], mtp[2][DS_GRAPH_NMAX + 1];
} ds_kvcache;

/* Loads the weights for this rank from dir: model{rank}-mp{ws}.safetensors as
 * written by `dsv3 convert`, or (one process) a Hugging Face checkpoint
 * directory. Every tensor's presence, dtype and shape is checked against cfg. */
ds_status model_load(ds_model **out, const char *dir, const ds_config *cfg, const ds_model_opts *opt);
void model_free(ds_model *m);

/* A cache for n_seq sequences of up to ctx positions (ctx <= max_seq_len), with
 * a layer for each of m's n_blocks (the MTP block's last). */
ds_status kvcache_new(ds_kvcache **out, const ds_model *m, int n_seq, int ctx);
void kvcache_free(ds_kvcache *kv);

/* Runs n tokens. want[i] marks tokens whose logits are wanted; logits receives
 * one row of vocab_size floats per marked token, in order. */
ds_status model_forward(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq,
                        const int *pos, const bool *want, float *logits);

/* model_forward that also writes every token's final-normed hidden state
 * norm(h) into hidden: (n, dim) floats of ops->alloc memory (NULL: as model_forward). */
ds_status model_forward_hidden(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq,
                               const int *pos, const bool *want, float *logits, float *hidden);

/* The MTP module (m->mtp) on n rows: row i is token tok[i] = t[pos[i] + 1] of
 * sequence seq[i] at position pos[i], with the main model's final-normed hidden
 * state at that position, hidden + hrow[i] * dim (hidden: ops->alloc memory,
 * hrow: host). Writes the MTP block's KV-cache row (seq[i], pos[i]) and attends
 * to that sequence's rows 0..pos[i], which earlier MTP passes must have written.
 * logits: n rows of vocab_size floats (host), predicting t[pos[i] + 2]. */
ds_status model_mtp(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq, const int *pos,
                    const float *hidden, const int *hrow, float *logits);

/* model_mtp with the logits of the rows marked in want alone (NULL: all), one
 * row each in order, and with every row's shared_head.norm(h') into hout ((n,
 * dim) of ops->alloc memory; NULL: none): a chained draft's hidden state, as
 * hidden for the next pass (hidden may be hout itself). next (NULL: none):
 * instead of the logits, each wanted row's argmax, picked on the device where
 * the backend can (logits unused). */
ds_status model_mtp_rows(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq, const int *pos,
                         const float *hidden, const int *hrow, const bool *want, float *logits, float *hout,
                         int32_t *next);

/* As model_forward with every token wanted, but only each token's next token
 * into next: what sampler_pick_u makes of its logits with pick[i]'s settings
 * (model/sampler.h; pick NULL: all greedy). On the device where the backend can
 * (ops->pick_rows, one rank), so that the logits need not be downloaded. */
ds_status model_forward_pick(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq,
                             const int *pos, const ds_pick *pick, int32_t *next);
/* model_forward_pick that also writes the hidden states as model_forward_hidden. */
ds_status model_forward_pick_hidden(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq,
                                    const int *pos, const ds_pick *pick, int32_t *next, float *hidden);

#endif
