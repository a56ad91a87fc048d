/* registry.c - the table of backends: name, availability, entry points. */
#include "backend/registry.h"

#include <stddef.h>
#include <string.h>

#include "backend/cpu/cpu_peak.h"
#ifdef DSV3_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

typedef struct {
    const char *name;
    int (*available)(void);                         /* devices present (NULL: always) */
    const ds_ops *(*open)(const ds_backend_opts *o); /* NULL with ds_last_error() set when it cannot run */
    void (*release)(void);                          /* NULL: nothing cached */
    ds_status (*status)(void);                      /* NULL: its ops cannot fail asynchronously */
    void (*measure)(backend_limits *out);           /* NULL: nothing to measure */
} backend_entry;

static const ds_ops *cpu_open(const ds_backend_opts *o) { return cpu_backend_tuned(&o->cpu); }

static void cpu_measure(backend_limits *out)
{
    out->bandwidth_gbps = cpu_read_bandwidth((size_t)1 << 30, 10);
    out->fma_gflops = cpu_fma_peak();
    out->bf16_gflops = cpu_bf16_peak();
    out->amx_gflops = cpu_amx_peak();
}

#ifdef DSV3_CUDA
static const ds_ops *cuda_open(const ds_backend_opts *o) { return cuda_backend(); }

static void cuda_measure(backend_limits *out)
{
    out->bandwidth_gbps = cuda_measure_copy_bandwidth();
    out->bf16_gflops = 1000 * cuda_measure_bf16_tc_peak(); /* TFLOP/s to GFLOP/s */
}
#endif

/* In order of preference for device "auto". */
static const backend_entry k_backends[] = {
#ifdef DSV3_CUDA
    {"cuda", cuda_device_count, cuda_open, cuda_forget_weights, cuda_backend_status, cuda_measure},
#endif
    {"cpu", NULL, cpu_open, NULL, NULL, cpu_measure},
};
#define N_BACKENDS (sizeof k_backends / sizeof *k_backends)

ds_backend_opts backend_default_opts(void)
{
    return (ds_backend_opts){.device = "auto", .cpu = cpu_tuning_default()};
}

static const backend_entry *find(const char *name)
{
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (!strcmp(k_backends[i].name, name)) return &k_backends[i];
    return NULL;
}

ds_status backend_open(const ds_backend_opts *o, const ds_ops **out)
{
    ds_backend_opts d = backend_default_opts();
    if (!o) o = &d;
    const char *dev = o->device ? o->device : "auto";
    bool scalar = o->cpu.isa == CPU_ISA_SCALAR; /* the reference kernels are CPU code */
    if (!strcmp(dev, "auto")) {
        for (size_t i = 0; i < N_BACKENDS; i++) {
            const backend_entry *b = &k_backends[i];
            if ((scalar && strcmp(b->name, "cpu")) || (b->available && b->available() <= 0)) continue;
            if ((*out = b->open(o))) return DS_OK;
        }
        return ds_errorf(DS_ERR_UNSUPPORTED, "no backend can run here");
    }
    const backend_entry *b = find(dev);
    if (!b) {
        if (!strcmp(dev, "cuda"))
            return ds_errorf(DS_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend (configure with -DDSV3_CUDA=ON)");
        return ds_errorf(DS_ERR_ARG, "device must be cpu, cuda or auto, not '%s'", dev);
    }
    if (scalar && strcmp(b->name, "cpu"))
        return ds_errorf(DS_ERR_UNSUPPORTED, "the reference kernels run on the CPU only, not on device %s", dev);
    if (b->available && b->available() <= 0)
        return ds_errorf(DS_ERR_UNSUPPORTED, "device %s: no %s device found", dev, dev);
    if (!(*out = b->open(o))) return ds_last_error()[0] ? DS_ERR_UNSUPPORTED
                                                        : ds_errorf(DS_ERR_UNSUPPORTED, "device %s cannot run here", dev);
    return DS_OK;
}

/* The entry whose open gave ops. Each backend's tables carry its name as their
 * prefix ("cpu-avx512" is the CPU backend's). */
static const backend_entry *owner(const ds_ops *ops)
{
    for (size_t i = 0; ops && i < N_BACKENDS; i++) {
        size_t n = strlen(k_backends[i].name);
        if (!strncmp(ops->name, k_backends[i].name, n) && (ops->name[n] == 0 || ops->name[n] == '-'))
            return &k_backends[i];
    }
    return NULL;
}

void backend_release(const ds_ops *ops)
{
    const backend_entry *b = owner(ops);
    if (b && b->release) b->release();
}

ds_status backend_status(const ds_ops *ops)
{
    const backend_entry *b = owner(ops);
    return b && b->status ? b->status() : DS_OK;
}

void backend_measure(const ds_ops *ops, backend_limits *out)
{
    *out = (backend_limits){0};
    const backend_entry *b = owner(ops);
    if (b && b->measure) b->measure(out);
}
