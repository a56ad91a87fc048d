/* cuda_backend.cu - the CUDA backend's ops table (cuda_backend()) and its tuning
 * (cuda_tuning: defaults, get, set; cuda_backend.h documents each field).
 *
 * Files by op family: cuda_gemm.cu (matmul and the per-head products), cuda_grouped.cu
 * (a prefill's products on the tensor cores: grouped experts, FP8), cuda_moe.cu (gate,
 * routing, experts), cuda_attn_decode.cu and cuda_attn_prefill.cu (attention),
 * cuda_norm.cu (norms, rope, small ops), cuda_sample.cu (pick_rows), cuda_mem.cu
 * (memory, argument staging, the weight cache, graphs); cuda_internal.cuh holds what
 * they share. docs/cuda.md: the design and how to test and measure it on a GPU.
 * Tested through every op by tests/cuda/test_cuda_ops.c and the model by
 * tests/cuda/test_cuda_golden.c. */
#include "cuda_internal.cuh"

extern "C" {
#include "base/status.h"
}

extern "C" cuda_tuning cuda_tuning_default(void)
{
    cuda_tuning t = {};
    t.gemm_bf16 = false;
    t.grouped_wgmma = true;
    t.fp8_mma = true;
    t.fp8_wgmma = true;
    t.attn_tc = true;
    t.tc_tiles = 0;
    t.attend_max_pos = 1024;
    t.attend_max_tokens = 1;
    t.attend_long = 1;
    t.attend_cluster = 8;
    t.attend_pro = true;
    t.expand_min = 16;
    t.flash = 3;
    t.flash_kc = 4;
    t.dense_chunk = 0;
    t.scratch_fill = 0;
    t.alloc_max_mib = 0;
    return t;
}

cuda_tuning cu_tune = cuda_tuning_default();

extern "C" cuda_tuning cuda_backend_tuning(void) { return cu_tune; }

extern "C" void cuda_backend_set_tuning(const cuda_tuning *t)
{
    cu_tune = *t;
    if (cu_tune.attend_cluster != 2 && cu_tune.attend_cluster != 4) cu_tune.attend_cluster = 8;
    if (cu_tune.attend_long > 8) cu_tune.attend_long = 8;
    if (cu_tune.flash < 0) cu_tune.flash = 0;
    if (cu_tune.flash > 3) cu_tune.flash = 3;
    if (cu_tune.flash_kc < 1) cu_tune.flash_kc = 4;
    if (cu_tune.tc_tiles < 0) cu_tune.tc_tiles = 0;
    if (cu_tune.dense_chunk < 0) cu_tune.dense_chunk = 0;
    if (cu_tune.alloc_max_mib < 0) cu_tune.alloc_max_mib = 0;
}

/* ---- the table */

static ds_ops g_ops;

/* Every entry of the table goes through timed<fn>::call, which brackets fn with
 * cuda_op_times' accounting (cu_op_enter / cu_op_leave: one test of a flag when the
 * accounting is off) under the entry's name. */
template <typename F, F *fn> struct timed;
template <typename R, typename... A, R (*fn)(A...)> struct timed<R(A...), fn> {
    static const char *name;
    struct scope {
        bool on = cu_op_enter();
        ~scope()
        {
            if (on) cu_op_leave(name);
        }
    };
    static R call(A... a)
    {
        scope s;
        return fn(a...);
    }
};
template <typename R, typename... A, R (*fn)(A...)> const char *timed<R(A...), fn>::name;

#define OP(field, fn) (timed<decltype(fn), fn>::name = #field, g_ops.field = timed<decltype(fn), fn>::call)

extern "C" const ds_ops *cuda_backend(void)
{
    int n = cuda_device_count();
    if (n == 0) {
        ds_errorf(DS_ERR_UNSUPPORTED, "cuda: no CUDA device (or no usable driver)");
        return NULL;
    }
    if (!g_ops.name) {
        cudaError_t e = cudaSetDevice(0);
        if (e != cudaSuccess) {
            ds_errorf(DS_ERR_UNSUPPORTED, "cuda: cannot use device 0: %s", cudaGetErrorString(e));
            return NULL;
        }
        OP(alloc, cu_alloc_zeroed);
        OP(alloc_scratch, cu_alloc);
        OP(free, cu_free);
        OP(matmul, cu_matmul);
        OP(matmul_many, cu_matmul_many);
        OP(matmul_many_normed, cu_matmul_many_normed);
        OP(matmul_carry, cu_matmul_carry);
        OP(matmul_t, cu_matmul_t);
        OP(rmsnorm, cu_rmsnorm);
        OP(rope, cu_rope);
        OP(attention, cu_attention);
        OP(silu_mul, cu_silu_mul);
        OP(add, cu_add);
        OP(upload, cu_upload);
        OP(download, cu_download);
        OP(pick_rows, cu_pick_rows);
        OP(sync, cu_sync);
        OP(zero, cu_zero);
        OP(copy_rows, cu_copy_rows);
        OP(add_rows_scaled, cu_add_rows_scaled);
        OP(embed, cu_embed);
        OP(matmul_heads, cu_matmul_heads);
        OP(matmul_heads_t, cu_matmul_heads_t);
        OP(moe_route, cu_moe_route);
        OP(moe_gate, cu_moe_gate);
        OP(moe_experts, cu_moe_experts);
        OP(upload_weight, cu_upload_weight);
        OP(rmsnorm_rows, cu_rmsnorm_rows);
        OP(rope_copy, cu_rope_copy);
        OP(mla_prologue, cu_mla_prologue);
        OP(mla_attend, cu_mla_attend);
        OP(mla_prologue_attend, cu_mla_prologue_attend);
        /* one pass up to 8192 tokens: on the H200 (16B, FP8) a 4761-token prompt prefilled
         * at 17.2k tok/s in one pass, 15.0k in passes of 2048, 13.0-13.8k in 1024 */
        g_ops.prefill_tokens = 8192;
        cu_graph_ops(&g_ops);
        if (!cu_check(cudaStreamCreateWithFlags(&cu_s, cudaStreamNonBlocking), "creating the stream")) return NULL;
        g_ops.name = "cuda";
    }
    return &g_ops;
}
