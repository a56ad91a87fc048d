/* config.h - model hyperparameters: the reference's ModelArgs.
 *
 * Read from a reference config (the reference configs: ModelArgs field
 * names; every absent field takes the reference default) or from a Hugging Face
 * config.json (its own names, mapped). Unlike the reference, an unknown key in
 * a reference config, a wrong type or an impossible value is an error that
 * names the key. */
#ifndef DS_CONFIG_H
#define DS_CONFIG_H

#include <stdbool.h>

#include "base/status.h"

typedef enum { DS_DTYPE_BF16, DS_DTYPE_FP8 } ds_wdtype;
typedef enum { DS_SCORE_SOFTMAX, DS_SCORE_SIGMOID } ds_score_func;

typedef struct {
    int max_batch_size;      /* 8 */
    int max_seq_len;         /* 16384 */
    ds_wdtype dtype;         /* bf16 */
    bool scale_ue8m0;        /* scale_fmt "ue8m0" (else None) */
    int vocab_size;          /* 102400 */
    int dim;                 /* 2048 */
    int inter_dim;           /* 10944 */
    int moe_inter_dim;       /* 1408 */
    int n_layers;            /* 27 */
    int n_dense_layers;      /* 1 */
    int n_heads;             /* 16 */
    int n_routed_experts;    /* 64 */
    int n_shared_experts;    /* 2 */
    int n_activated_experts; /* 6 */
    int n_expert_groups;     /* 1 */
    int n_limited_groups;    /* 1 */
    ds_score_func score_func;/* softmax */
    double route_scale;      /* 1.0 */
    int q_lora_rank;         /* 0 */
    int kv_lora_rank;        /* 512 */
    int qk_nope_head_dim;    /* 128 */
    int qk_rope_head_dim;    /* 64 */
    int v_head_dim;          /* 128 */
    int original_seq_len;    /* 4096 */
    double rope_theta;       /* 10000 */
    double rope_factor;      /* 40 */
    int beta_fast;           /* 32 */
    int beta_slow;           /* 1 */
    double mscale;           /* 1.0 */
} ds_config;

/* The reference ModelArgs defaults (the 16B shape). */
void config_defaults(ds_config *c);

/* Reads a reference config (ModelArgs keys) or, if the JSON looks like a Hugging
 * Face config (has "hidden_size" or "model_type"), a config.json. Validates. */
ds_status config_load(ds_config *c, const char *path);
/* The same from a JSON string; label names it in errors. */
ds_status config_parse(ds_config *c, const char *json, const char *label);

/* Checks the values are possible (positive sizes, top-k <= experts, ...). */
ds_status config_validate(const ds_config *c, const char *label);

/* Checks the shapes split evenly over world_size ranks (vocab, heads, experts,
 * inter dims), naming the first that does not. */
ds_status config_check_parallel(const ds_config *c, int world_size);

/* Writes the config as a reference JSON (all fields). Caller frees. */
char *config_to_json(const ds_config *c);

#endif
