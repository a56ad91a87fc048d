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
 * synth.c) share: atomic copies, mkdir -p, and an "outputs" list that removes
 * everything a failed run wrote. */
#ifndef DS_CONVERT_H
#define DS_CONVERT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "io/safetensors.h"

typedef struct {
    const char *hf_dir;   /* input: HF checkpoint directory */
    const char *save_dir; /* output directory (created if absent) */
    int n_experts;        /* routed experts per MoE layer */
    int mp;               /* model-parallel degree (number of output files) */
    bool keep_mtp;        /* keep layers >= config.json's num_hidden_layers */
    bool progress;        /* progress bar on stderr if it is a terminal */
} convert_opts;

/* Converts a checkpoint. Checks everything it can before writing anything
 * (divisibility, names, expert indices); on any failure removes every file it
 * created, so save_dir holds either the whole output or nothing new. Memory:
 * one small plan entry per tensor; data streams from the mapping to the files
 * (source pages are released after each tensor). */
ds_status convert_checkpoint(const convert_opts *o);

/* The reference's name for an HF tensor name ("model.layers.0.self_attn.q_a_proj.weight"
 * -> "layers.0.attn.wq_a.weight") and its shard dimension (-1 for none).
 * Returns a new string in *out, or DS_ERR_FORMAT naming hf if the key is unknown. */
ds_status convert_name(const char *hf, char **out, int *shard_dim);

/* ---- file helpers for the checkpoint writers ---- */

/* Files (and possibly a directory) created by a run, removed again on failure. */
typedef struct {
    char **paths;
    size_t n, cap;
    char *created_dir;  /* set when the run made the output directory */
} convert_outs;

/* Creates dir and missing parents; records it in outs if it was created. */
ds_status convert_mkdirs(convert_outs *outs, const char *dir);
/* Records a final path that the rollback must remove. */
ds_status convert_outs_add(convert_outs *outs, const char *path);
/* Removes every recorded file and the created directory (if empty). */
void convert_outs_rollback(convert_outs *outs);
void convert_outs_free(convert_outs *outs);

/* Copies src to dst through a temporary name and a rename; records dst. */
ds_status convert_copy_file(convert_outs *outs, const char *src, const char *dst);
/* Writes len bytes to path atomically (temporary + rename); records path. */
ds_status convert_write_file(convert_outs *outs, const char *path, const char *data, size_t len);
/* Copies every regular, non-hidden file of src_dir whose name contains "token"
 * (the reference's glob "*token*") into dst_dir. */
ds_status convert_copy_tokenizer(convert_outs *outs, const char *src_dir, const char *dst_dir);

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
