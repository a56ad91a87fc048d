/* dist_single.c - the single-process build (no -DDSV3_MPI): no communicator. */
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
    if (!c) return;
    if (c->failed && c->abort) c->abort(c, 1);
    if (c->close) c->close(c);
}
#endif
