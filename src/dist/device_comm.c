/* device_comm.c - choosing the transport of the model's collectives from the
 * backend: MPI (host memory) when the ranks run on CPUs, NCCL (device memory)
 * when they run on GPUs. Every rank must make the same choice, or one would
 * wait in MPI while another waits in NCCL; so the choice is agreed first. */
#include <stdio.h>
#include <string.h>

#include "dist/dist.h"
#include "dist/nccl_comm.h"

ds_status dist_attach_device(ds_comm *c, const ds_ops *ops)
{
    if (!c || c->world_size == 1 || !ops) return DS_OK;
    /* the transport depends only on GPU or not (CPU kernel variants may differ) */
    char mine[32], root[32];
    snprintf(mine, sizeof mine, "%s", strcmp(ops->name, "cuda") ? "the CPU" : "cuda");
    memcpy(root, mine, sizeof root);
    ds_status s = c->broadcast(c, root, sizeof root, 0);
    if (s) return ds_error_prefix(s, "comparing the backend with rank 0's");
    root[sizeof root - 1] = '\0';
    if (strcmp(mine, root))
        s = ds_errorf(DS_ERR_ARG, "this rank runs on %s but rank 0 on %s (with --device auto: more ranks on a "
                      "machine than GPUs? pass --device cuda or --device cpu)", mine, root);
    if ((s = dist_agree(c, s))) return s;
    if (strcmp(mine, "cuda")) return DS_OK;
#ifdef DSV3_NCCL
    return nccl_attach(c, ops);
#else
    /* same outcome on every rank: agreed, so rank 0 alone reports it */
    return dist_agree(c, ds_errorf(DS_ERR_UNSUPPORTED, "the CUDA backend over %d ranks needs NCCL, and this "
                                   "build has none (configure with -DDSV3_CUDA=ON -DDSV3_MPI=ON where NCCL is "
                                   "installed)", c->world_size));
#endif
}
