/* cpu_peak.h - the machine's own limits, measured: streaming read bandwidth
 * and arithmetic peak, so that benchmarks can print every figure next to the
 * limit it is bounded by. */
#ifndef DS_CPU_PEAK_H
#define DS_CPU_PEAK_H

#include <stddef.h>

/* Best of reps multithreaded (OpenMP) passes reading a fresh buffer of bytes
 * (much larger than the caches), in GB/s (1e9 bytes/s); < 0 if out of memory. */
double cpu_read_bandwidth(size_t bytes, int reps);

/* The same passes over memory that is already there and resident (a mapped
 * checkpoint, say; p 4096-aligned), without writing it. */
double cpu_read_bandwidth_at(const void *p, size_t bytes, int reps);

/* Peak float32 FMA rate over all OpenMP threads, in GFLOP/s (2 per FMA), with
 * the widest vectors this CPU has. */
double cpu_fma_peak(void);

/* Peak rate of the bf16 dot-product instruction (vdpbf16ps, 2 FLOP per pair)
 * in GFLOP/s; 0 where the CPU lacks it. */
double cpu_bf16_peak(void);

/* Peak rate of AMX's bf16 tile product (tdpbf16ps: 16 x 16 x 32 products,
 * 16384 FLOP) over all threads in GFLOP/s; 0 where AMX does not run
 * (cpu_has_amx). */
double cpu_amx_peak(void);

#endif
