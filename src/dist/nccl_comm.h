/* nccl_comm.h - collectives on GPU memory over NCCL, beside MPI.
 *
 * One process per GPU. MPI (or any launcher with a ds_comm) starts the job,
 * carries the NCCL unique id and keeps every collective on host memory
 * (dist_agree, prompts, the logits' gather); NCCL runs the collectives on
 * device memory (the model's all-reduces under the CUDA backend). Both live
 * in one ds_comm, so a tool keeps a single communicator: see
 * dist_attach_device. Built only with -DDSV3_CUDA=ON -DDSV3_MPI=ON and NCCL
 * found (DSV3_NCCL); dist_attach_device exists in every build. */
#ifndef DS_NCCL_COMM_H
#define DS_NCCL_COMM_H

#include "backend/backend.h"
#include "dist/comm.h"

/* Collective over c (NULL or one rank: DS_OK, nothing to do). When ops is
 * the CUDA backend on every rank, c's collectives on device buffers run over
 * NCCL from then on; host buffers still take c's own (MPI) path. When every
 * rank runs on the CPU, c is left as it is. Ranks on different backends (a
 * rank that found no GPU under --device auto) are an agreed DS_ERR_ARG, as is
 * CUDA in a build without NCCL. Call it after the backend is chosen and before
 * model_load. */
ds_status dist_attach_device(ds_comm *c, const ds_ops *ops);

#ifdef DSV3_NCCL
/* Before MPI_Init and before any CUDA call: makes this process's GPU (the
 * local rank's entry of CUDA_VISIBLE_DEVICES, or GPU <local rank> when it is
 * unset) its only visible one, so that the CUDA backend's device 0 is a
 * different GPU on every rank of a machine. Reads the local rank that the
 * launcher exports (Open MPI, MPICH/Hydra, Slurm); does nothing without one,
 * when CUDA_VISIBLE_DEVICES already names a single GPU (the launcher bound
 * it), or with DSV3_GPU_BIND=0. Also sets NCCL_NVLS_ENABLE=0 (NVLink
 * multicast off) unless it is set. */
void nccl_bind_device(void);

/* Wraps c (any world size, 1 included: the tests) so that its collectives on
 * device memory run over NCCL on the current CUDA device. Collective over c;
 * the outcome is agreed across ranks. ops must be the CUDA backend: its
 * stream is drained (ops->sync) before each NCCL collective, which then runs
 * on a stream of its own and is waited for under the watchdog (c->timeout_s). */
ds_status nccl_attach(ds_comm *c, const ds_ops *ops);
#endif

#endif
