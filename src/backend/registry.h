/* registry.h - the backends by name: which one runs a model, and its settings.
 *
 * Every backend is one line of the table in registry.c; adding a backend
 * touches only its folder and that line. Callers above the backend layer
 * (the model, the public API) choose a backend through here and never test
 * which one they got. */
#ifndef DS_BACKEND_REGISTRY_H
#define DS_BACKEND_REGISTRY_H

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

typedef struct {
    const char *device; /* "cpu", "cuda" or "auto" (NULL: auto: CUDA when built in and a device is present) */
    cpu_tuning cpu;     /* the CPU backend's settings (isa CPU_ISA_SCALAR: the reference kernels, CPU only) */
} ds_backend_opts;

/* The defaults: device auto, cpu_tuning_default(). */
ds_backend_opts backend_default_opts(void);

/* The ops table for o (NULL: the defaults). DS_ERR_ARG names an unknown device;
 * DS_ERR_UNSUPPORTED says why a named device cannot run here. */
ds_status backend_open(const ds_backend_opts *o, const ds_ops **out);

/* Releases what the backend of ops cached for a model that is being freed
 * (device copies of weights whose host addresses may be reused). */
void backend_release(const ds_ops *ops);

/* The first error the backend of ops recorded asynchronously since the last
 * call, then cleared (DS_OK if none). */
ds_status backend_status(const ds_ops *ops);

/* The limits of the hardware a backend runs on, measured (0: not measured). */
typedef struct {
    double bandwidth_gbps; /* memory bandwidth: CPU reads of a 1 GiB buffer; GPU device-to-device copies */
    double fma_gflops;     /* float32 FMA peak (CPU only) */
    double bf16_gflops;    /* bf16 dot-product peak: the CPU's vdpbf16ps (0 without it), a GPU's tensor cores */
    double amx_gflops;     /* the CPU's AMX bf16 tile peak (0 where AMX does not run) */
} backend_limits;

/* Measures the limits of the hardware of ops' backend (seconds of work: the
 * CPU's over all OpenMP threads, a GPU's on the current device). */
void backend_measure(const ds_ops *ops, backend_limits *out);

#endif
