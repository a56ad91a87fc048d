/* cuda_backend.h - the CUDA backend (built with -DDSV3_CUDA=ON).
 *
 * Activations, the KV cache and the weights live in device memory (cudaMalloc);
 * every op is queued on one stream and returns without waiting, so the host
 * never touches activations: it uploads the per-pass token arrays and
 * downloads the logits; the routing is read and grouped on the device (only
 * weights the grouped MoE kernels refuse download it). A decode step can be
 * recorded as a CUDA graph and replayed (ops graph_*). Weights are copied
 * once at load (upload_weight); a weight without a device copy is
 * copied on first use and cached by its host data pointer. Pointers an op
 * receives may also be managed or plain host memory (tests): host arguments
 * are staged through device memory, and that op waits before it returns.
 * docs/cuda.md describes the design; the kernels' choices are steered by
 * cuda_tuning (below), never by the environment.
 *
 * Not thread-safe: one thread at a time may call the ops of this backend. */
#ifndef DS_CUDA_BACKEND_H
#define DS_CUDA_BACKEND_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices, 0 when there is no device or no usable driver. */
int cuda_device_count(void);

/* The CUDA ops table for device 0, or NULL (with ds_last_error() set) when no
 * device can be used. */
const ds_ops *cuda_backend(void);

/* DS_OK, or the first CUDA error any op hit since the last call (ops return
 * void, so they record failures here and print them once to stderr); the
 * error is cleared by reading it. */
ds_status cuda_backend_status(void);

/* Frees every cached device copy of a weight. Call after freeing or
 * unmapping weights whose host addresses may be reused (model_free). */
void cuda_forget_weights(void);

/* Bytes of device memory held by cached weights. */
size_t cuda_weight_bytes(void);

/* Test mode: activations in managed memory and a synchronisation after every
 * op, so a test may read and write op buffers from the host. Off by default:
 * activations are device memory and ops return without waiting. */
void cuda_set_test_mode(bool on);

/* The machine's ceilings: device-to-device copy bandwidth in GB/s (bytes read
 * plus written, 1 GiB, best of 10), and the bf16 tensor-core rate in TFLOP/s
 * (cuBLAS 8192^3 on random data, f32 accumulation, best of 6); 0 on failure. */
double cuda_measure_copy_bandwidth(void);
double cuda_measure_bf16_tc_peak(void);
/* The FP8 tensor-core rate in TFLOP/s: an 8192^3 e4m3 product on cuBLASLt (random codes,
 * bf16 out, per-tensor scales, sums kept in the tensor cores, best of 6); 0 on failure. */
double cuda_measure_fp8_tc_peak(void);

/* Per-op wall-time accounting: while on, every entry of the ops table synchronises
 * when it is called and when it returns, and is charged the time between (its own
 * launches and kernels, nothing queued before it); the host's time between entries
 * is a row of its own. on = true clears the table. Print: a table, largest first. */
void cuda_op_times(bool on);
void cuda_op_times_print(FILE *f);

/* The backend's tuning: which kernel form an op takes where more than one is
 * correct, and the sizes that steer them. cuda_tuning_default() gives the
 * choices measured fastest on an H200 (docs/cuda.md); the other values exist
 * to reach the fallback forms (the ones taken on other devices or shapes) from
 * the tests, or to trade speed for rounding. Nothing here changes what an op
 * computes beyond float rounding. */
typedef struct cuda_tuning {
    /* ---- products */
    bool gemm_bf16;     /* false (default): prefill products on the tensor cores split float32
                         * activations into bf16 hi + lo (~16 bits, close to float32); true:
                         * rounded to bf16 once, as Hugging Face transformers in bf16 */
    bool grouped_wgmma; /* true (default): a prefill's grouped experts and dense FP8 products on
                         * warpgroup MMA (gr_kernel) where the device runs this build's sm_90a
                         * code; false: mma.sync (gf_kernel), the form on every other device */
    bool fp8_mma;       /* true (default): with gemm_impl fp8 and FP8 weights, products of 16 or
                         * more tokens on the FP8 tensor cores; false: the CUDA-core kernels
                         * that take the shapes the tensor-core kernels refuse */
    bool fp8_wgmma;     /* true (default): those FP8 products on wgmma (gwq_kernel) where the
                         * device runs sm_90a code; false: mma.sync (gq_kernel) */
    /* ---- decode attention */
    bool attn_tc;          /* true (default): the absorb form on the tensor cores
                            * (attn_tc_kernel) where its shapes fit; false: attn_hg_kernel
                            * on the CUDA cores, the fallback, everywhere */
    int tc_tiles;          /* 32-position tiles per attn_tc_kernel split; 0 (default): about
                            * one block per SM, two tiles at least */
    int attend_max_pos;    /* mla_attend's one-launch kernel (q_c, attention and W_v) takes
                            * decode steps whose positions all lie below this; 0 never.
                            * Default 1024 */
    int attend_max_tokens; /* ... and of at most this many tokens. Default 1: a cluster per
                            * token and head re-reads the weights */
    int attend_long;       /* deeper steps of up to this many tokens (8 at most; 0 never) take
                            * the long form: q_c, attn_tc_kernel's splits, one cluster launch
                            * merging them and applying W_v. Default 1 */
    int attend_cluster;    /* blocks per cluster of that merge: 2, 4 or 8 (default) */
    bool attend_pro;       /* true (default): the one-launch kernel of one token also makes
                            * mla_prologue's outputs itself (ds_ops.mla_prologue_attend), one
                            * launch fewer a layer; false: mla_prologue's launch first */
    /* ---- prefill attention */
    int expand_min;  /* mla_attend takes contiguous passes of at least this many tokens (and
                      * 16) in the expanded (MHA) form where it counts fewer multiply-adds;
                      * -N: from N tokens always; 0 never. Default 16 */
    int flash;       /* the expanded form's scores, softmax and values in one launch
                      * (flash_kernel) where its head sizes are compiled in: 3 (default) on
                      * warpgroup MMA with two warpgroups a block where the device runs
                      * sm_90a code and the sizes are multiples of 64, 2 one warpgroup a
                      * block, 1 mma.sync always; 0 cuBLAS products and a softmax launch
                      * per chunk. Each form falls back to the next where it cannot run */
    int flash_kc;    /* flash_kernel's chunks of key tiles hold at least this many (default 4) */
    int dense_chunk; /* at most this many tokens per chunk of the cuBLAS attention forms
                      * (tests: several chunks on small shapes); 0 (default): as many as a
                      * 256 MiB score matrix holds */
    /* ---- memory */
    int scratch_fill;  /* what new scratch memory holds: 0 (default) whatever was there (a
                        * memset node in a captured step costs more than most kernels); 1
                        * zeros; -1 NaN bytes, so that a test shows whether a reader relies
                        * on what it did not write */
    int alloc_max_mib; /* a new pool block of more than this many MiB fails as on a full
                        * device (tests of the out-of-memory paths); 0 (default) no limit */
} cuda_tuning;

/* The default tuning (above). */
cuda_tuning cuda_tuning_default(void);

/* The tuning in force, and a new one for the ops queued from now on. Graphs
 * recorded before keep the kernels they were recorded with (a benchmark A/B
 * takes a new KV cache per tuning). Out-of-range values are taken as the
 * nearest meaningful one. */
cuda_tuning cuda_backend_tuning(void);
void cuda_backend_set_tuning(const cuda_tuning *t);

/* Marks a region for a profiler started with --profile-from-start off (ncu):
 * cudaProfilerStart (on) or cudaProfilerStop (off), after a device sync. */
void cuda_profile_range(bool on);

/* The FP8 kernels on their own, for tests against the reference's Triton
 * kernels (quant.h has the definitions). Host pointers in and out. */
ds_status cuda_act_quant(const float *x, int m, int k, uint8_t *y, float *s, bool ue8m0);
ds_status cuda_fp8_gemm(const uint8_t *y, const float *s, const uint8_t *w, const float *ws, int m, int n, int k,
                        float *out);
ds_status cuda_weight_dequant(const uint8_t *w, const float *s, int rows, int cols, float *out);

#ifdef __cplusplus
}
#endif
#endif
