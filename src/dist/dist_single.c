/* dist_single.c - the single-process build: no communicator. */
#include "dist/dist.h"

#include <stddef.h>

#ifndef DSV3_MPI
ds_status dist_init(int *argc, char ***argv, ds_comm **out)
{
    (void)argc;
    (void)argv;
    *out = NULL;
    return DS_OK;
}

void dist_finish(ds_comm *c)
{
    if (c && c->close) c->close(c);
}
#endif

int dist_rank(const ds_comm *c) { return c ? c->rank : 0; }
