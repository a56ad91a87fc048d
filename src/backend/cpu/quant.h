/* quant.h - the reference's FP8 kernels (kernel.py), scalar.
 *
 * act_quant: per 128-element block of a row, amax = max(|x|, 1e-4),
 * s = amax / 448 (ue8m0: rounded up to a power of two), y = e4m3(x / s).
 * fp8_gemm: out[m][n] = sum over K-blocks of (sum_k y[m][k] w[n][k]) * s_a[m][kb] * s_w[n/128][kb].
 * weight_dequant: float32(w) * s for each 128x128 block. */
#ifndef DS_QUANT_H
#define DS_QUANT_H

#include <stdbool.h>
#include <stdint.h>

/* x [m][k] -> y [m][k] e4m3 bytes, s [m][ceil(k/128)]. */
void act_quant_ref(const float *x, int m, int k, uint8_t *y, float *s, bool ue8m0);

/* x [m][k] -> y [m][k]: each value as act_quant_ref rounds it, its code times its
 * block's scale (y may be x). The exact-dequantisation kernels on y compute fp8_gemm's
 * sum_b s_x s_w sum_k q_x q_w as sum_b s_w sum_k (q_x s_x) q_w: the same but for float
 * rounding. Rows split over threads when there are many. */
void act_fake_quant(const float *x, int m, int k, float *y, bool ue8m0);

/* fq (act_fake_quant, or a faster version of it) of x into a new buffer (free it);
 * NULL, with the failure recorded, when out of memory. */
typedef void (*act_fake_quant_fn)(const float *x, int m, int k, float *y, bool ue8m0);
float *act_fake_quant_copy(const float *x, int m, int k, bool ue8m0, act_fake_quant_fn fq);

/* The scale for one block's amax, as act_quant computes it. */
float act_quant_scale(float amax, bool ue8m0);

/* y [m][k] e4m3 with s [m][kb]; w [n][k] e4m3 with ws [ceil(n/128)][kb] -> out [m][n] f32. */
void fp8_gemm_ref(const uint8_t *y, const float *s, const uint8_t *w, const float *ws, int m, int n, int k,
                  float *out);

/* w [rows][cols] e4m3 with s [ceil(rows/128)][ceil(cols/128)] -> out f32. */
void weight_dequant_ref(const uint8_t *w, const float *s, int rows, int cols, float *out);

#endif
