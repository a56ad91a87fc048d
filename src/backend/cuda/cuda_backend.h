/* cuda_backend.h - the CUDA backend (built with -DDSV3_CUDA=ON).
 *
 * First stage, correctness first: activations live in CUDA managed memory so
 * that the model code's host-side loops (embedding rows, column gathers, KV
 * cache row writes, MoE routing) work unchanged, and every op ends with a
 * device synchronisation so the host may read its output at once. Weights are
 * copied to device memory on first use and cached by their host data pointer.
 * Pointers an op receives may be managed, device, or plain host memory: host
 * arguments (norm weights, rotary tables, positions, a caller's logits buffer)
 * are staged through device memory for the call.
 *
 * Not thread-safe: one thread at a time may call the ops of this backend. */
#ifndef DS_CUDA_BACKEND_H
#define DS_CUDA_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

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
