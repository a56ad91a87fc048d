/* convert.h - Hugging Face checkpoint -> the reference's model-parallel shards.
 *
 * Reproduces DeepSeek's convert.py tensor for tensor: HF names are renamed to
 * the reference's (embed, attn.wq_a, ffn.w1, ...), tensors with a shard
 * dimension are cut into mp contiguous slices along it (FP8 scales along the
 * same dimension, in 128-block units), routed experts go whole to rank
 * expert / (n_experts / mp), everything else is copied to every rank. Output:
 * model{rank}-mp{mp}.safetensors plus the tokenizer files and config.json.
 *
 * Also home to the small file helpers the other checkpoint writers (cast.c,
 * synth.c) share. Every writer puts its files into an output transaction
 * (txn.h), so the destination is either as it was or the complete output. */
#ifndef DS_CONVERT_H
#define DS_CONVERT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "io/safetensors.h"
#include "io/txn.h"

typedef struct {
    const char *hf_dir;   /* input: HF checkpoint directory */
    const char *save_dir; /* output directory (created if absent) */
    int n_experts;        /* routed experts per MoE layer */
    int mp;               /* model-parallel degree (number of output files) */
    bool keep_mtp;        /* keep layers >= config.json's num_hidden_layers */
    bool in_place;        /* allow save_dir to be hf_dir (its config/tokenizer replaced at the end) */
    bool progress;        /* progress bar on stderr if it is a terminal */
} convert_opts;

/* Converts a checkpoint. Checks everything it can before writing anything
 * (divisibility, names, expert indices); writes into a transaction (txn.h),
 * so save_dir is either untouched or holds the whole output. Memory:
 * one small plan entry per tensor; data streams from the mapping to the files
 * (source pages are released after each tensor). */
ds_status convert_checkpoint(const convert_opts *o);

/* The reference's name for an HF tensor name ("model.layers.0.self_attn.q_a_proj.weight"
 * -> "layers.0.attn.wq_a.weight") and its shard dimension (-1 for none).
 * Returns a new string in *out, or DS_ERR_FORMAT naming hf if the key is unknown. */
ds_status convert_name(const char *hf, char **out, int *shard_dim);

/* ---- file helpers for the checkpoint writers (all write into a txn) ---- */

/* Writes len bytes as file `name` of the transaction's output. */
ds_status convert_write_file(out_txn *t, const char *name, const char *data, size_t len);
/* Copies the regular file src as file `name` of the output. */
ds_status convert_copy_file(out_txn *t, const char *src, const char *name);
/* Copies every regular, non-hidden file of src_dir whose name contains "token"
 * (the reference's glob "*token*") into the output. */
ds_status convert_copy_tokenizer(out_txn *t, const char *src_dir);

/* Drops the pages of [p, p+n) inside f's mapping from this process's resident
 * set (they stay in the page cache), so streaming a checkpoint keeps RSS flat. */
void convert_release(const st_file *f, const void *p, size_t n);

/* Bytes streamed between releases: resident source pages stay below this
 * however large a tensor is (an embedding alone can be 1.8 GB). */
#define CONVERT_RELEASE_BYTES (32u << 20)

/* Appends [p, p+n) of f's mapping to each of the n_w writers, CONVERT_RELEASE_BYTES
 * at a time, releasing each piece once every writer has it. */
ds_status convert_stream(st_writer *const *w, int n_w, const st_file *f, const void *p, uint64_t n);

#endif
