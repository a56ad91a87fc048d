/* comm.h - the collectives that tensor parallelism needs, as a table.
 *
 * The model code calls these when world_size > 1: all_reduce (sum) after
 * row-parallel projections, the embedding and the MoE; all_gather to join the
 * vocabulary slices of the logits; broadcast for what rank 0 alone reads (a
 * prompt). An MPI implementation lives in mpi_comm.c (built with
 * -DDSV3_MPI=ON); an NCCL one can fill the same table, keeping MPI (or any
 * launcher) for start-up, dist_agree and abort.
 *
 * Failure contract: a collective returns DS_ERR_COMM, with a message naming
 * the operation, the rank and the cause, when a peer fails or when it does not
 * complete within timeout_s (a hung or dead peer); it then sets failed, and the
 * communicator must not be used again except to abort. */
#ifndef DS_COMM_H
#define DS_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

typedef struct ds_comm {
    int rank, world_size;
    int local_size;        /* ranks on this machine (threads are shared among them) */
    double timeout_s;      /* watchdog per collective; 0 waits forever (see dist_broadcast_untimed) */
    bool failed;           /* a collective failed: peers may be stuck, only abort is safe */
    bool agreed_failure;   /* dist_agree reported a failure to every rank: all may exit cleanly */
    void *ctx;
    /* buf[i] = sum over ranks of buf[i]; every rank must get the same bits, since each rank
     * routes tokens to experts from the result */
    ds_status (*all_reduce)(struct ds_comm *c, float *buf, size_t n);
    /* out[r*n .. (r+1)*n) = in of rank r */
    ds_status (*all_gather)(struct ds_comm *c, const float *in, size_t n, float *out);
    /* root's buf to every rank */
    ds_status (*broadcast)(struct ds_comm *c, void *buf, size_t bytes, int root);
    /* ends every process of the job with exit code code; does not return */
    void (*abort)(struct ds_comm *c, int code);
    /* releases the communicator after a clean run (every rank calls it) */
    void (*close)(struct ds_comm *c);
} ds_comm;

#endif
