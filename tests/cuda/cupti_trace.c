/* cupti_trace.c - a CUDA injection library that records every kernel's start and
 * end on the GPU (CUPTI activity records), graph nodes included, for
 * scripts/trace_summary.py. The Nsight tools' nsys is not on the GPU machine; ncu
 * runs kernels one at a time, so it cannot show how a captured decode step's
 * kernels overlap under programmatic dependent launch. This can:
 *
 *   CUDA_INJECTION64_PATH=build-gpu/libcupti_trace.so CUPTI_TRACE_OUT=trace.txt \
 *       build-gpu/tests/bench_cuda_model CKPT CONFIG
 *
 * One line per kernel: start and end (ns, GPU clock), graph id (0 outside a
 * graph), correlation id, grid size, mangled name. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cupti.h>

#define BUF_BYTES (8u << 20)

static FILE *g_out;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, BUF_BYTES);
    *size = *buffer ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        if (g_out)
            fprintf(g_out, "%llu %llu %u %u %d %s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                    k->graphId, k->correlationId, k->gridX * k->gridY * k->gridZ, k->name ? k->name : "?");
    }
    free(buffer);
}

static void flush_at_exit(void)
{
    cuptiActivityFlushAll(1);
    if (g_out) fclose(g_out);
    g_out = NULL;
}

/* Called by the CUDA driver when it loads this library (CUDA_INJECTION64_PATH). */
int InitializeInjection(void)
{
    const char *path = getenv("CUPTI_TRACE_OUT");
    g_out = fopen(path ? path : "cupti_trace.txt", "w");
    if (!g_out) {
        fprintf(stderr, "cupti_trace: cannot write %s\n", path ? path : "cupti_trace.txt");
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "cupti_trace: CUPTI activity tracing unavailable\n");
        return 0;
    }
    atexit(flush_at_exit);
    return 1;
}
