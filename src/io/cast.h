/* cast.h - FP8 (block-scaled e4m3) Hugging Face checkpoint -> BF16, as fp8_cast_bf16.py.
 *
 * Every F8_E4M3 weight W (out x in) with an F32 `<name>_scale_inv` S of shape
 * (ceil(out/128), ceil(in/128)) becomes bf16(float32(W[i][j]) * S[i/128][j/128])
 * (round to nearest even; edge blocks are partial). The *_scale_inv tensors are
 * dropped, every other tensor is copied as it is, shard file names are kept and
 * a new model.safetensors.index.json lists what remains. */
#ifndef DS_CAST_H
#define DS_CAST_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    const char *in_dir, *out_dir;
    bool allow_missing_scale; /* copy an FP8 weight with no scale through (and warn) */
    bool in_place;            /* allow out_dir to be in_dir (inputs replaced at the final rename) */
    int threads;              /* OpenMP threads; 0 = the runtime's default */
    bool progress;
} cast_opts;

/* Casts a checkpoint. Memory: one chunk of one output tensor (a few MiB)
 * plus the mapping's pages of the tensor being read, which are released after
 * use. On failure every file written so far is removed. */
ds_status cast_bf16_checkpoint(const cast_opts *o);

/* The dequantisation of one row range: rows [r0, r1) of the (rows x cols)
 * e4m3 matrix w with block scales s (ceil(rows/128) x ceil(cols/128)) into
 * out (row r0 first). The scalar reference; cast_bf16_checkpoint runs it in
 * parallel over rows. */
void cast_dequant_rows(const uint8_t *w, const float *s, uint16_t *out, int64_t rows, int64_t cols,
                       int64_t r0, int64_t r1);

#endif
