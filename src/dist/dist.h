/* dist.h - process-group start-up, agreement and shutdown for tensor parallelism.
 *
 * A program run over N ranks (mpirun -np N dsv3 ...) reads the same flags on
 * every rank; each rank loads its shard model{rank}-mp{N}.safetensors, and
 * only rank 0 reads stdin and writes output. The pattern in a tool:
 *
 *     if (dist_init(&argc, &argv, &comm)) goto fail;
 *     ... model_load() agrees on success across ranks before any compute ...
 *     if (dist_rank(comm) == 0) read the prompt;  dist_broadcast_untimed(...) it
 *     ...
 *     rc = 0; goto done;
 * fail:
 *     rc = dist_fail(comm, "logits");   prints; ends the job unless agreed
 * done:
 *     dist_finish(comm);
 *
 * so that an error on one rank never leaves the others waiting in a
 * collective. */
#ifndef DS_DIST_H
#define DS_DIST_H

#include <stdint.h>

#include "dist/comm.h"

/* Starts the process group. *out is NULL when the process runs alone (a build
 * without MPI, a program not started by an MPI launcher, or an MPI launch of
 * one rank); otherwise a communicator whose rank and world_size select the
 * checkpoint shard. Under MPI, unless OMP_NUM_THREADS is set, the OpenMP
 * thread count becomes this rank's share of the cores of its machine. Reads
 * DSV3_COMM_TIMEOUT (seconds, default 60, 0 = none). */
ds_status dist_init(int *argc, char ***argv, ds_comm **out);

/* Tears the communicator down after a run (NULL is fine). If a collective
 * failed, ends the job instead of waiting for peers that may be stuck. */
void dist_finish(ds_comm *c);

/* Rank of this process and number of ranks (0 and 1 when alone). */
int dist_rank(const ds_comm *c);
int dist_world_size(const ds_comm *c);

/* Collective: every rank passes its local status and gets DS_OK if all
 * succeeded; otherwise every rank gets the status and message of the lowest
 * failing rank ("rank R: <message>"), and c->agreed_failure is set so that
 * the ranks may exit normally. Returns local when alone. */
ds_status dist_agree(ds_comm *c, ds_status local);

/* Collective: compares len bytes with rank 0's (by a 64-bit hash). Returns a
 * DS_ERR_ARG naming what on the ranks whose bytes differ, DS_OK on the others;
 * follow it with dist_agree. */
ds_status dist_check_same(ds_comm *c, const void *data, size_t len, const char *what);

/* comm->broadcast without the watchdog's deadline, for a wait on a person
 * (the other ranks wait while rank 0 reads the next prompt); the waiting
 * ranks sleep rather than spin. DS_OK when alone. */
ds_status dist_broadcast_untimed(ds_comm *c, void *buf, size_t bytes, int root);

/* The error path of a program: prints "dsv3 <cmd>: <message>" (once, from
 * rank 0, for an agreed failure; with this rank's number otherwise) and, unless
 * the failure was agreed by every rank, ends the whole job with exit code 1 so
 * that no peer waits in a collective. Returns 1 (the exit code) otherwise. */
int dist_fail(ds_comm *c, const char *cmd);

#endif
