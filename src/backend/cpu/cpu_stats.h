/* cpu_stats.h - where a CPU decode step's time goes, for `dsv3 bench
 * --profile`: the decode products (cpu_decode_many, every AVX-512 and AVX2
 * product of a few tokens) by weight bytes a call, the decode attention
 * (cpu_attention_run), the per-head transposed products of the absorb form
 * (matmul_heads_t), and the distinct routed experts each MoE layer ran (what a
 * batch of tokens reads of the experts). Off unless turned on; meant for one forward pass at a
 * time (the bench), not for concurrent ones. */
#ifndef DS_CPU_STATS_H
#define DS_CPU_STATS_H

#include <stdbool.h>

typedef struct {
    long calls;
    double bytes;   /* weight bytes the calls read (products), 0 for the attention */
    double seconds; /* wall time */
} cpu_stat;

/* products[k]: calls of more than 2^(k-1) and at most 2^k weight bytes */
#define CPU_STAT_SIZES 48

typedef struct {
    cpu_stat products[CPU_STAT_SIZES];
    cpu_stat attention, heads_t;
    long moe_calls;  /* routed-expert calls (one a MoE layer and pass) */
    double experts;  /* distinct routed experts those calls ran, summed */
} cpu_stats;

typedef enum { CPU_STAT_PRODUCT, CPU_STAT_ATTENTION, CPU_STAT_HEADS_T } cpu_stat_kind;

/* Turns counting on (from zero) or off. */
void cpu_stats_enable(bool on);
/* What has been counted since counting was last turned on. */
void cpu_stats_read(cpu_stats *out);

/* For the kernels' drivers: whether counting is on, and a call that started
 * at t0 (ds_now(); bytes: the weight bytes it read; 0 for the attention). */
bool cpu_stats_on(void);
void cpu_stats_note(cpu_stat_kind kind, double bytes, double t0);
/* A routed-expert call that ran `experts` distinct experts. */
void cpu_stats_note_experts(int experts);

#endif
