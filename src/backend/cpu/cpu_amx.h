/* cpu_amx.h - AMX tile instructions for the CPU backend's prefill GEMM and
 * its peak probe.
 *
 * The tiles are written as inline asm with a "memory" clobber: GCC 12's
 * <immintrin.h> tile macros tell the compiler neither what tileloadd reads
 * nor what tilestored writes, and its _tile_loadconfig claims to read 8 of
 * the config's 64 bytes, so stores into either could be reordered or dropped.
 * Every tile here is 16 rows of 64 bytes: A a tile of 16 tokens x 16 bf16
 * pairs, B 16 pairs x 16 weight rows (the VNNI layout of the packed panels),
 * C 16 tokens x 16 rows of float32. A thread configures its tiles
 * (cpu_amx_tiles_on) before its first tile instruction and releases them
 * after its last; cpu_has_amx() must have returned true first (it asks Linux
 * for the tile state). */
#ifndef DS_CPU_AMX_H
#define DS_CPU_AMX_H

#include <stdbool.h>

/* AMX-TILE and AMX-BF16 in cpuid and in /proc/cpuinfo, the AVX-512 kernels
 * (cpu_has_avx512, which pack the tiles' operands), and Linux's permission to
 * use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM), asked once; cached. */
bool cpu_has_amx(void);

/* Loads the tile configuration above on the calling thread / releases it. */
void cpu_amx_tiles_on(void);
void cpu_amx_tiles_off(void);

#define AMX_TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::: "memory")
#define AMX_TILE_LOAD(t, p, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(p)), "r"((long)(stride)) : "memory")
#define AMX_TILE_STORE(t, p, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"((void *)(p)), "r"((long)(stride)) : "memory")
/* C += A B: c[m][n] += sum over pairs p of a[m][p] . b[p][n] (float32 sums) */
#define AMX_DPBF16(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")

#endif
