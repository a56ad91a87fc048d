/* bench_cuda_sync.cu - what one dependent step of a decode chain costs on this
 * GPU: a kernel boundary in a captured graph (plain, or with programmatic
 * dependent launch as the decode kernels use it) against a grid-wide barrier
 * inside one persistent kernel. Each step has the data dependency of a real
 * chain: every block reads values that other blocks wrote in the step before.
 * Figures, not a test (the question is whether a persistent layer kernel could
 * beat the launch boundaries; docs/cuda.md).
 *   bench_cuda_sync [steps]                                                    */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 256
#define READS 8 /* values of other blocks a block reads each step */

#define CHECK(x)                                                                      \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "bench_cuda_sync: %s: %s\n", #x, cudaGetErrorString(e_)); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* one step: block b sums READS values of step s - 1 (other blocks') and writes
 * its own for step s; the buffers alternate by step */
__device__ __forceinline__ void chain_step(float *buf, int nb, int s)
{
    const float *in = buf + (size_t)(s & 1) * nb;
    float *out = buf + (size_t)((s + 1) & 1) * nb;
    int b = blockIdx.x;
    if (threadIdx.x < 32) {
        float v = threadIdx.x < READS ? in[(b * 37 + (int)threadIdx.x * 11 + s) % nb] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) out[b] = v * 0.125f + 1.0f;
    }
}

__global__ void step_plain(float *buf, int nb, int s) { chain_step(buf, nb, s); }

__global__ void step_pdl(float *buf, int nb, int s)
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    chain_step(buf, nb, s);
}

/* every block adds one to *count and waits until it reaches target */
__device__ __forceinline__ void grid_barrier(unsigned *count, unsigned target)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned one = 1, seen;
        asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(count), "r"(one) : "memory");
        do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
        while (seen < target);
    }
    __syncthreads();
}

__global__ void steps_persistent(float *buf, int nb, int steps, unsigned *count, unsigned base)
{
    for (int s = 0; s < steps; s++) {
        chain_step(buf, nb, s);
        grid_barrier(count, base + (unsigned)(s + 1) * (unsigned)nb);
    }
}

static float time_graph(cudaGraphExec_t ge, cudaStream_t st, int reps)
{
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaGraphLaunch(ge, st)); /* warm */
    CHECK(cudaStreamSynchronize(st));
    CHECK(cudaEventRecord(a, st));
    for (int r = 0; r < reps; r++) CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaEventRecord(b, st));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / (float)reps;
}

/* a graph of steps launches, one step a kernel (pdl: with the attribute) */
static float chain_us(float *buf, int nb, int steps, bool pdl, cudaStream_t st)
{
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int s = 0; s < steps; s++) {
        cudaLaunchAttribute at;
        at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t c = {};
        c.gridDim = dim3((unsigned)nb);
        c.blockDim = dim3(THREADS);
        c.stream = st;
        c.attrs = &at;
        c.numAttrs = pdl ? 1 : 0;
        CHECK(cudaLaunchKernelEx(&c, pdl ? step_pdl : step_plain, buf, nb, s));
    }
    CHECK(cudaStreamEndCapture(st, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    float ms = time_graph(ge, st, 20);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return ms * 1000.0f / (float)steps;
}

static float persistent_us(float *buf, int nb, int steps, cudaStream_t st)
{
    unsigned *count;
    CHECK(cudaMalloc(&count, sizeof(unsigned)));
    CHECK(cudaMemset(count, 0, sizeof(unsigned)));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    int reps = 20;
    unsigned base = 0;
    steps_persistent<<<nb, THREADS, 0, st>>>(buf, nb, steps, count, base); /* warm */
    base += (unsigned)steps * (unsigned)nb;
    CHECK(cudaEventRecord(a, st));
    for (int r = 0; r < reps; r++, base += (unsigned)steps * (unsigned)nb)
        steps_persistent<<<nb, THREADS, 0, st>>>(buf, nb, steps, count, base);
    CHECK(cudaEventRecord(b, st));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaFree(count);
    return ms * 1000.0f / (float)(reps * steps);
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 256;
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
        printf("skipped: no GPU\n");
        return 0;
    }
    if (steps < 1 || steps > 100000) {
        fprintf(stderr, "bench_cuda_sync: steps must be 1..100000, got %s\n", argv[1]);
        return 2;
    }
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    printf("%s, %d SMs; %d dependent steps a run, us a step\n", p.name, p.multiProcessorCount, steps);
    printf("%8s %12s %12s %12s\n", "blocks", "graph", "graph+PDL", "persistent");
    int sms = p.multiProcessorCount;
    int counts[] = {1, 8, sms, 2 * sms};
    for (int i = 0; i < 4; i++) {
        int nb = counts[i];
        float *buf;
        CHECK(cudaMalloc(&buf, sizeof(float) * 2 * (size_t)nb));
        CHECK(cudaMemset(buf, 0, sizeof(float) * 2 * (size_t)nb));
        float g = chain_us(buf, nb, steps, false, st), gp = chain_us(buf, nb, steps, true, st);
        float pe = persistent_us(buf, nb, steps, st);
        printf("%8d %12.3f %12.3f %12.3f\n", nb, g, gp, pe);
        cudaFree(buf);
    }
    cudaStreamDestroy(st);
    return 0;
}
