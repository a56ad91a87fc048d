/* comm.h - the collectives that tensor parallelism needs, as a table.
 *
 * The model code calls these when world_size > 1: all_reduce (sum) after
 * row-parallel projections, the embedding and the MoE; all_gather to join the
 * vocabulary slices of the logits. An MPI implementation lives in mpi_comm.c
 * (built with -DDSV3_MPI=ON); an NCCL one can fill the same table. */
#ifndef DS_COMM_H
#define DS_COMM_H

#include <stddef.h>

#include "base/status.h"

typedef struct ds_comm {
    int rank, world_size;
    void *ctx;
    /* buf[i] = sum over ranks of buf[i] */
    ds_status (*all_reduce)(struct ds_comm *c, float *buf, size_t n);
    /* out[r*n .. (r+1)*n) = in of rank r */
    ds_status (*all_gather)(struct ds_comm *c, const float *in, size_t n, float *out);
    /* root's buf to every rank */
    ds_status (*broadcast)(struct ds_comm *c, void *buf, size_t bytes, int root);
    void (*close)(struct ds_comm *c);
} ds_comm;

#endif
