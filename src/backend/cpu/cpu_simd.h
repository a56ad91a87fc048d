/* cpu_simd.h - the CPU backend's vectorised kernels (AVX-512, AVX2).
 *
 * Each kernel computes exactly what its cpu_ref.c counterpart defines, up to
 * float rounding, and is tested against it in tests/backend/. The kernels are
 * compiled with per-function target attributes, so the build stays portable:
 * cpu_backend() calls them only after __builtin_cpu_supports() says the CPU
 * has the instructions.
 *
 * Weights are read in place (FP8 e4m3 with 128x128 block scales, BF16, F32)
 * and widened in registers; no dequantised copy of a weight is ever kept. */
#ifndef DS_CPU_SIMD_H
#define DS_CPU_SIMD_H

#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "cpu_backend.h"

/* Which instruction sets this CPU offers (cached after the first call). */
bool cpu_has_avx512(void);  /* F, BW, VL, DQ, BF16 (vdpbf16ps), VNNI (vpdpbusd) and VBMI (vpermi2b) */
bool cpu_has_avx2(void);    /* AVX2, FMA and F16C */

/* Precision of the batched (prefill) GEMM's activations on the AVX-512 path:
 *   CPU_GEMM_BF16:  x rounded to bf16 once, one vdpbf16ps per pair of k;
 *   CPU_GEMM_SPLIT: x = hi + lo (two bf16), w exact in bf16, twice the work,
 *                   about float32 accuracy;
 *   CPU_GEMM_HILO8: x = hi + lo, hi in bf16 against the exact weights, lo
 *                   (x - hi, at most 2^-9 |x|) as int8 per token and 128
 *                   columns against an int8 copy of the weight panel made
 *                   while packing (per row and 128 columns) with vpdpbusd,
 *                   which does 64 products an instruction: 3/4 of SPLIT's
 *                   work; error about 2^-16 of max |x| max |w| a product.
 * In every mode the hi products use the exact weights (BF16, or FP8 which is
 * exact in bf16). */
extern cpu_gemm_prec cpu_gemm_precision;
/* The batched GEMM on AMX tiles (cpu_amx.h; set only where cpu_has_amx()),
 * for the calls the setting thread makes: the same packed weights and
 * float32 sums, activations as hi + lo unless cpu_gemm_precision is
 * CPU_GEMM_BF16. The AMX table (cpu_backend_tuned) sets it for its calls. */
extern _Thread_local bool cpu_gemm_amx;
/* Token counts from which matmul uses the batched GEMM (below: the decode kernel). */
extern int cpu_gemm_min_tokens;

/* AVX-512 kernels (same contracts as the ds_ops members of the same name). */
void avx512_matmul(float *y, const float *x, int n, const ds_weight *w, int row0, int rows, ds_gemm_impl gemm,
                   bool ue8m0);
void avx512_matmul_t(float *y, const float *x, int n, const ds_weight *w, int row0, int rows);
void avx512_attention(const ds_attn_args *a, ds_attn_impl impl);
void avx512_silu_mul(float *a, const float *b, size_t n);
void avx512_matmul_many(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0);
/* act_fake_quant (quant.h) on AVX-512, the same values bit for bit. */
void avx512_act_fake_quant(const float *x, int m, int k, float *y, bool ue8m0);
void avx512_matmul_heads(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                         int hstride, int rows);
void avx512_matmul_heads_t(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                           int hstride, int rows);
void avx512_moe_experts(float *y, const float *x, int n, int K, const int *idx, const float *wt, const ds_weight *ew1,
                        const ds_weight *ew2, const ds_weight *ew3, int e0, int ne, const ds_mlp_w *shared,
                        ds_gemm_impl gemm, bool ue8m0);
/* The two matmul strategies, exposed so tests can reach both at any n. */
void avx512_matmul_decode(float *y, const float *x, int n, const ds_weight *w, int row0, int rows);
void avx512_matmul_gemm(float *y, const float *x, int n, const ds_weight *w, int row0, int rows);

/* The decode products' split over threads (cpu_decode.c). A unit's rows
 * [a, b) of job j run through a cpu_decode_rows_fn on one thread, with that
 * thread's scratch xs (x_floats floats per token and column of the widest
 * job) and a state that says what xs holds (job, FP8 scale block; starts
 * {NULL, -1}). */
typedef struct {
    const ds_matmul_job *job;
    int rb;
} cpu_decode_state;
typedef void (*cpu_decode_rows_fn)(const ds_matmul_job *j, int a, int b, float *xs, cpu_decode_state *st);
void cpu_decode_many(const ds_matmul_job *jobs, int nj, int x_floats, cpu_decode_rows_fn rows);
size_t cpu_row_bytes(const ds_weight *w);
/* Rows of K columns against n tokens whose activations take 4 bytes a column
 * and token: *kc the columns of a piece (K when whole rows fit in x_bytes of
 * activations); *row_pf, when in pieces, how far ahead (whole rows, at least
 * prefetch_bytes of reading) to prefetch the same piece of a later row, else 0.
 * wsz: weight bytes per element. */
void cpu_decode_pieces(int K, int n, int wsz, int x_bytes, size_t prefetch_bytes, int *kc, size_t *row_pf);
/* matmul_heads (ds_ops) on a kernel set's matmul_many and matmul: one token's
 * heads as one batch of jobs, more tokens head by head (cpu_decode.c). */
typedef void (*cpu_many_fn)(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0);
typedef void (*cpu_matmul_fn)(float *y, const float *x, int n, const ds_weight *w, int row0, int rows,
                              ds_gemm_impl gemm, bool ue8m0);
void cpu_matmul_heads(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0, int hstride,
                      int rows, cpu_many_fn many, cpu_matmul_fn matmul);
/* The decode attention's split over threads (cpu_attn.c): part computes token
 * t over positions [j0, j1) into a running max mx[h], sum l[h] and o[h][kv_rank]
 * (not divided by l), with sc a scratch of n_heads x jb scores. */
typedef void (*cpu_att_part_fn)(const ds_attn_args *a, int t, int j0, int j1, float *mx, float *l, float *o,
                                float *sc);
void cpu_attention_run(const ds_attn_args *a, int jb, cpu_att_part_fn part);
/* For a part: the scores sh of head h at positions jb .. jb + nj - 1 past the
 * head's own last position (a->head_last) become -inf. True when the whole block
 * lies past it and the head has seen nothing yet (its running max m is -inf): the
 * block adds nothing to it, and sh is zeroed for the values pass. */
static inline bool cpu_att_past_head(const ds_attn_args *a, int h, int jb, int nj, float *sh, float m)
{
    if (!a->head_last || a->head_last[h] >= jb + nj - 1) return false;
    for (int j = a->head_last[h] + 1 - jb > 0 ? a->head_last[h] + 1 - jb : 0; j < nj; j++) sh[j] = -INFINITY;
    if (a->head_last[h] < jb && m == -INFINITY) {
        memset(sh, 0, sizeof(float) * (size_t)nj);
        return true;
    }
    return false;
}
/* Per-thread scratch that persists across calls (OpenMP keeps its threads), so
 * that no call pays for fresh pages; grows as needed, never shrinks; NULL if
 * out of memory. Slots: 0 decode activations, 1 packed GEMM panel, 2 attention,
 * 3 GEMM activations, 4 decode work list. */
#define CPU_SCRATCH_SLOTS 5
void *cpu_scratch(int slot, size_t bytes);

/* AVX2 kernels. */
void avx2_matmul(float *y, const float *x, int n, const ds_weight *w, int row0, int rows, ds_gemm_impl gemm,
                 bool ue8m0);
void avx2_matmul_many(const ds_matmul_job *jobs, int n_jobs, ds_gemm_impl gemm, bool ue8m0);
void avx2_matmul_t(float *y, const float *x, int n, const ds_weight *w, int row0, int rows);
void avx2_attention(const ds_attn_args *a, ds_attn_impl impl);
void avx2_silu_mul(float *a, const float *b, size_t n);
void avx2_matmul_heads(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                       int hstride, int rows);
void avx2_matmul_heads_t(float *y, int ys, const float *x, int xs, int n, int H, const ds_weight *w, int row0,
                         int hstride, int rows);
void avx2_moe_experts(float *y, const float *x, int n, int K, const int *idx, const float *wt, const ds_weight *ew1,
                      const ds_weight *ew2, const ds_weight *ew3, int e0, int ne, const ds_mlp_w *shared,
                      ds_gemm_impl gemm, bool ue8m0);

#endif
