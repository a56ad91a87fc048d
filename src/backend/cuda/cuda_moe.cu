/* cuda_moe.cu - the routed experts of an MoE layer (moe_experts).
 *
 * The routing choice (idx, wt; n x K) is downloaded once per layer (the
 * layer's one synchronisation), the tokens are grouped per local expert on
 * the host, the groups uploaded in one copy, and each expert with tokens runs
 * gather -> w1, w3 -> silu * -> w2 -> weighted scatter-add on the device, in
 * expert order (the order of the CPU reference's sum).
 * Not yet: a grouped product over all selected experts in one launch, which
 * would remove the synchronisation and most launches at decode. */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"

void cu_moe_experts(float *y, const float *x, int n, int K, const int *idx, const float *wt, const ds_weight *ew1,
                    const ds_weight *ew2, const ds_weight *ew3, int e0, int ne, ds_gemm_impl gemm, bool ue8m0)
{
    if (n <= 0) return;
    int dim = ew1[0].cols, inter = ew1[0].rows, nk = n * K;
    int *hidx = (int *)malloc(sizeof(int) * (size_t)nk), *cnt = (int *)calloc((size_t)ne + 1, sizeof(int));
    float *hwt = (float *)malloc(sizeof(float) * (size_t)nk);
    int *hl = (int *)malloc(sizeof(int) * 2 * (size_t)nk); /* [token list | weights as float bits] */
    int *dl = (int *)cu_alloc(sizeof(int) * 2 * (size_t)nk);
    float *xs = (float *)cu_alloc(sizeof(float) * (size_t)n * dim), *ys = (float *)cu_alloc(sizeof(float) * (size_t)n * dim);
    float *a = (float *)cu_alloc(sizeof(float) * (size_t)n * inter), *g = (float *)cu_alloc(sizeof(float) * (size_t)n * inter);
    if (!hidx || !cnt || !hwt || !hl || !dl || !xs || !ys || !a || !g) {
        cu_check(cudaErrorMemoryAllocation, "moe_experts: scratch");
        goto done;
    }
    cu_download(hidx, idx, sizeof(int) * (size_t)nk);
    cu_download(hwt, wt, sizeof(float) * (size_t)nk);
    for (int i = 0; i < nk; i++)
        if (hidx[i] >= e0 && hidx[i] < e0 + ne) cnt[hidx[i] - e0 + 1]++;
    for (int e = 0; e < ne; e++) cnt[e + 1] += cnt[e];
    {
        int *fill = (int *)calloc((size_t)ne, sizeof(int));
        if (!fill) goto done;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++) {
                int e = hidx[(size_t)t * K + k] - e0;
                if (e < 0 || e >= ne) continue;
                int at = cnt[e] + fill[e]++;
                hl[at] = t;
                memcpy(&hl[nk + at], &hwt[(size_t)t * K + k], sizeof(float));
            }
        free(fill);
    }
    cu_upload(dl, hl, sizeof(int) * 2 * (size_t)nk);
    cu_zero(y, sizeof(float) * (size_t)n * dim);
    for (int e = 0; e < ne; e++) {
        int c = cnt[e + 1] - cnt[e];
        if (!c) continue;
        const int *list = dl + cnt[e];
        const float *lw = (const float *)(dl + nk + cnt[e]);
        cu_copy_rows(xs, dim, NULL, x, dim, list, c, dim);
        cu_matmul(a, xs, c, &ew1[e], 0, inter, gemm, ue8m0);
        cu_matmul(g, xs, c, &ew3[e], 0, inter, gemm, ue8m0);
        cu_silu_mul(a, g, (size_t)c * inter);
        cu_matmul(ys, a, c, &ew2[e], 0, dim, gemm, ue8m0);
        cu_add_rows_scaled(y, list, ys, lw, c, dim);
    }
done:
    free(hidx);
    free(cnt);
    free(hwt);
    free(hl);
    cu_free(dl);
    cu_free(xs);
    cu_free(ys);
    cu_free(a);
    cu_free(g);
}
