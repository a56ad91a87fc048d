/* synth.h - random-weight checkpoints in Hugging Face layout for any config.
 *
 * Writes exactly the tensors (names, shapes, dtypes) a DeepSeek-V2/V3 HF
 * checkpoint of that shape has, sharded as model-0000i-of-0000n.safetensors
 * with model.safetensors.index.json and an HF config.json, so every loader and
 * tool can be tested at any size without downloading weights.
 *
 * Values keep a random network's activations O(1): linear weights have
 * std 1/sqrt(fan_in) (uniform); FP8 weights are e4m3 codes spread over the
 * whole range (uniform in [-448, 448] rounded) with per-128x128-block F32
 * scales that bring them to that std; norms are near 1; embeddings have std 1.
 * Every value comes from its own position in a per-(tensor, chunk) xoshiro
 * stream: no tile repeats, and the bytes do not depend on the thread count. */
#ifndef DS_SYNTH_H
#define DS_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "io/config.h"

typedef struct {
    const char *config_path;   /* reference or HF config */
    const char *out_dir;
    int dtype;                 /* -1: the config's; else a ds_wdtype */
    uint64_t seed;
    const char *tokenizer_dir; /* copy tokenizer.json / tokenizer_config.json from here, or NULL */
    uint64_t shard_bytes;      /* target shard size; 0 = 4 GiB */
    bool progress;
    bool mtp;                  /* add DeepSeek-V3's MTP module as layer num_hidden_layers */
} synth_opts;

/* Writes the checkpoint. Memory: one 64 MiB generation buffer. On failure
 * removes everything it wrote. */
ds_status synth_checkpoint(const synth_opts *o);

/* The HF config.json text for c (FP8 adds quantization_config); caller frees.
 * config_parse() of it gives back c's model fields. */
char *synth_hf_config(const ds_config *c);

/* Number of tensors and total bytes the checkpoint for c will hold. */
void synth_totals(const ds_config *c, uint64_t *n_tensors, uint64_t *bytes);

#endif
