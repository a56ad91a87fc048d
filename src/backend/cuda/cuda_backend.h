/* cuda_backend.h - the CUDA backend (built with -DDSV3_CUDA=ON).
 *
 * Activations, the KV cache and the weights live in device memory (cudaMalloc);
 * every op is queued on one stream and returns without waiting, so the host
 * never touches activations: it uploads the per-pass token arrays and
 * downloads the logits (and, per MoE layer of a prefill, the routing choice;
 * decode reads it on the device). A decode step can be recorded as a CUDA
 * graph and replayed (ops graph_*; model_forward does it). Weights are
 * copied once at load (upload_weight); a weight without a device copy is
 * copied on first use and cached by its host data pointer. Pointers an op
 * receives may also be managed or plain host memory (tests): host arguments
 * are staged through device memory, and that op waits before it returns.
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

/* Per-op wall-time accounting: while on, every op synchronises at its end and
 * the time since the previous op's end is charged to its name (so host work and
 * waits count too). on = true clears the table. Print: a table, largest first. */
void cuda_op_times(bool on);
void cuda_op_times_print(FILE *f);

/* Re-reads the switches of stage 7's decode changes from the environment
 * (DSV3_CUDA_PDL, _GEMV2, _GEMV8W, _HEADS2, _MOE_SWAP, _COMBINE2: on unless set
 * to 0; DSV3_CUDA_MOE_DEDUP: off unless 1; DSV3_CUDA_ATTN2: positions per
 * warp step, 1 unless 2 or 4; cuda_backend() reads them first; cuda_internal.cuh
 * says what each does). Graphs recorded before keep
 * the kernels they were recorded with (bench A/B: a new KV cache per variant). */
void cuda_reload_variants(void);

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
