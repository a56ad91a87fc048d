/* cpu_backend.h - the CPU backend's entry point and its tuning.
 *
 * One binary runs on any x86-64: the kernels are chosen at run time from what
 * the CPU supports (__builtin_cpu_supports), unless the tuning asks for a
 * narrower set. Every fast kernel is tested against the scalar reference. */
#ifndef DS_CPU_BACKEND_H
#define DS_CPU_BACKEND_H

#include <stdbool.h>

#include "backend/backend.h"

typedef enum {
    CPU_ISA_AUTO,   /* the widest kernels the CPU has: AVX-512 (with BF16), else AVX2, else scalar */
    CPU_ISA_AVX2,   /* the AVX2 kernels even where AVX-512 exists: what CPUs without it run */
    CPU_ISA_SCALAR  /* the scalar reference kernels everywhere */
} cpu_isa;

/* Precision of the AVX-512 prefill GEMM's activations (cpu_simd.h has the math). */
typedef enum { CPU_GEMM_BF16, CPU_GEMM_SPLIT, CPU_GEMM_HILO8 } cpu_gemm_prec;

typedef struct {
    cpu_isa isa;
    /* CPU_GEMM_HILO8 (the default) keeps the golden tests' accuracy; CPU_GEMM_BF16 is
     * about twice as fast but beyond their 1e-3 tolerance on the tiny golden model. */
    cpu_gemm_prec gemm_precision;
    /* Scratch comes filled with NaN bytes, so that a test shows whether any reader
     * relies on what it did not write (the fast backend hands scratch out unfilled). */
    bool poison_scratch;
    /* The AVX-512 kernels without AMX even where the CPU has it (where it is
     * used, the prefill GEMM runs on AMX tiles and the table's name is
     * "cpu-avx512-amx"). */
    bool no_amx;
} cpu_tuning;

/* The defaults: CPU_ISA_AUTO, CPU_GEMM_HILO8, no poisoning, AMX where the CPU has it. */
cpu_tuning cpu_tuning_default(void);

/* The CPU ops table for t (NULL: the defaults). The tables are immutable once
 * built; gemm_precision and poison_scratch are process-wide, and the last call
 * sets them. */
const ds_ops *cpu_backend_tuned(const cpu_tuning *t);

#endif
