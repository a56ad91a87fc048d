/* dist.h - process-group start-up for tensor parallelism.
 *
 * dist_init() returns NULL in *out when the process runs alone (a build
 * without MPI, or an MPI launch of one rank); otherwise a communicator whose
 * rank and world_size select the checkpoint shard model{rank}-mp{world}. */
#ifndef DS_DIST_H
#define DS_DIST_H

#include "dist/comm.h"

ds_status dist_init(int *argc, char ***argv, ds_comm **out);
/* Tears the communicator down (NULL is fine). */
void dist_finish(ds_comm *c);
/* Rank of this process (0 when alone). */
int dist_rank(const ds_comm *c);

#endif
