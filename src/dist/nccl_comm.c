/* nccl_comm.c - the ds_comm table over NCCL for device memory, MPI beside it
 * for host memory (built with -DDSV3_CUDA=ON -DDSV3_MPI=ON and NCCL found).
 *
 * Decisions:
 * - One ds_comm, two transports. nccl_attach wraps the tool's MPI
 *   communicator in place: a collective whose buffers are device memory runs
 *   over NCCL, one on host memory (dist_agree, prompts, the logits' gather)
 *   still runs over MPI with MPI's watchdog. Flags (failed, agreed_failure)
 *   and timeout_s stay on the one struct, so dist_fail and dist_finish work
 *   unchanged, and close and abort reach both transports. A mixed call (host
 *   input, device output) is staged through a device buffer.
 * - One process per GPU. The CUDA backend uses its device 0, so the GPU is
 *   chosen before CUDA starts (nccl_bind_device, from dist_init): the local
 *   rank's GPU becomes the only visible one.
 * - Streams: the backend's stream is private (non-blocking), so a collective
 *   drains it (ops->sync), runs on a stream of its own and waits for that
 *   stream before returning. Later backend ops are queued after the return,
 *   hence after the collective. Costs one host wait per collective, which the
 *   MPI path had too; enqueueing on the backend's stream (no wait) needs an
 *   accessor for it in cuda_backend.h.
 * - Watchdog: the communicator is non-blocking (config.blocking = 0), so no
 *   NCCL call waits for a peer on the host; the wait polls
 *   ncclCommGetAsyncError and the stream until DSV3_COMM_TIMEOUT (as MPI).
 *   On a timeout or an asynchronous error the communicator is aborted
 *   (ncclCommAbort, so the GPU stops spinning) and the call returns
 *   DS_ERR_COMM; dist_fail then ends the job through MPI_Abort. A rank that
 *   dies is seen by mpirun, which kills the others, as under MPI alone.
 * - Fault injection (tests): DSV3_NCCL_FAULT_HANG=K makes the K-th device
 *   collective of this process look as if it never completes, to test the
 *   watchdog on a single GPU. */
#ifdef DSV3_NCCL
#include "base/clock.h"
#include "dist/nccl_comm.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/dist.h"

typedef struct {
    ds_comm *host;       /* the wrapped communicator (MPI): host memory, close, abort */
    const ds_ops *ops;   /* the CUDA backend, drained before each collective */
    ncclComm_t nccl;
    cudaStream_t stream; /* where the NCCL collectives run */
    bool aborted;        /* ncclCommAbort was called: only abort/close remain */
    long n_calls, hang_at; /* fault injection: the hang_at-th device collective never completes */
} nccl_ctx;

static void nap(long ns)
{
    struct timespec ts = {0, ns};
    while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

static void abort_nccl(nccl_ctx *x)
{
    if (x->nccl && !x->aborted) ncclCommAbort(x->nccl);
    x->aborted = true;
}

/* ---- choosing the GPU */

/* The n-th comma-separated entry of list into out (false when there is none). */
static bool nth_entry(const char *list, int n, char *out, size_t cap)
{
    for (int i = 0; list; i++) {
        const char *end = strchr(list, ',');
        size_t len = end ? (size_t)(end - list) : strlen(list);
        if (i == n) {
            if (len == 0 || len >= cap) return false;
            memcpy(out, list, len);
            out[len] = '\0';
            return true;
        }
        list = end ? end + 1 : NULL;
    }
    return false;
}

void nccl_bind_device(void)
{
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    const char *bind = getenv("DSV3_GPU_BIND");
    if (bind && !strcmp(bind, "0")) return;
    static const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
                                 "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
    const char *lr = NULL;
    for (size_t i = 0; !lr && i < sizeof vars / sizeof *vars; i++) lr = getenv(vars[i]);
    if (!lr || !*lr) return;
    char *end;
    long local = strtol(lr, &end, 10);
    if (*end || local < 0 || local > 4096) return;
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    char dev[256];
    if (!vis) {
        snprintf(dev, sizeof dev, "%ld", local);
    } else {
        if (!strchr(vis, ',')) return; /* one GPU (or none) already chosen for this rank */
        /* more ranks than listed GPUs: leave it; NCCL then reports the shared GPU */
        if (!nth_entry(vis, (int)local, dev, sizeof dev)) return;
    }
    setenv("CUDA_VISIBLE_DEVICES", dev, 1);
}

/* ---- the collectives */

static ds_status nccl_fail(ds_comm *c, ncclResult_t r, const char *op, size_t n, const char *unit)
{
    nccl_ctx *x = c->ctx;
    const char *detail = x->nccl ? ncclGetLastError(x->nccl) : NULL;
    char msg[512];
    snprintf(msg, sizeof msg, "%s%s%s", ncclGetErrorString(r), detail && *detail ? ": " : "", detail ? detail : "");
    abort_nccl(x);
    c->failed = true;
    return ds_errorf(DS_ERR_COMM, "NCCL %s of %zu %s failed: %s (a peer rank has probably died)", op, n, unit, msg);
}

static ds_status cuda_fail(ds_comm *c, cudaError_t e, const char *op, size_t n, const char *unit)
{
    abort_nccl(c->ctx);
    c->failed = true;
    return ds_errorf(DS_ERR_COMM, "NCCL %s of %zu %s: CUDA error: %s", op, n, unit, cudaGetErrorString(e));
}

/* Waits until the communicator has enqueued the last call and the stream has
 * run it, or fails once c->timeout_s has passed (never when it is 0). Polls:
 * yields the CPU for the first ms, then sleeps up to 1 ms at a time. */
static ds_status nccl_wait(ds_comm *c, const char *op, size_t n, const char *unit)
{
    nccl_ctx *x = c->ctx;
    bool hang = ++x->n_calls == x->hang_at;
    double t0 = ds_now();
    long sleep_ns = 20000;
    for (;;) {
        ncclResult_t a = ncclSuccess, r = ncclCommGetAsyncError(x->nccl, &a);
        if (r != ncclSuccess) a = r;
        if (a != ncclSuccess && a != ncclInProgress) return nccl_fail(c, a, op, n, unit);
        if (a == ncclSuccess && !hang) {
            cudaError_t e = cudaStreamQuery(x->stream);
            if (e == cudaSuccess) return DS_OK;
            if (e != cudaErrorNotReady) return cuda_fail(c, e, op, n, unit);
        }
        double waited = ds_now() - t0;
        if (c->timeout_s > 0 && waited > c->timeout_s) {
            abort_nccl(x);
            c->failed = true;
            return ds_errorf(DS_ERR_COMM, "NCCL %s of %zu %s did not complete within %g s (DSV3_COMM_TIMEOUT): "
                             "a peer rank is hung, has died or is far behind", op, n, unit, c->timeout_s);
        }
        if (waited < 0.001) {
            sched_yield();
        } else {
            nap(sleep_ns);
            if (sleep_ns < 1000000) sleep_ns *= 2;
        }
    }
}

/* True for memory the GPU can address as device memory (cudaMalloc or managed). */
static bool on_device(const void *p)
{
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* older runtimes fail on plain host pointers */
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* The wrapped (host) communicator, given this one's deadline for one call;
 * host_done restores it and keeps the call's failure visible here. */
static ds_comm *host_of(ds_comm *c, double *saved)
{
    ds_comm *h = ((nccl_ctx *)c->ctx)->host;
    *saved = h->timeout_s;
    h->timeout_s = c->timeout_s;
    return h;
}

static ds_status host_done(ds_comm *c, double saved, ds_status s)
{
    ds_comm *h = ((nccl_ctx *)c->ctx)->host;
    h->timeout_s = saved;
    if (h->failed) c->failed = true;
    return s;
}

/* The checks every device collective starts with: a usable communicator and
 * the backend's writes to the buffers finished. */
static ds_status nccl_begin(ds_comm *c, const char *op)
{
    nccl_ctx *x = c->ctx;
    if (x->aborted) {
        c->failed = true;
        return ds_errorf(DS_ERR_COMM, "NCCL %s after the communicator was aborted", op);
    }
    x->ops->sync();
    return DS_OK;
}

static ds_status nccl_all_reduce(ds_comm *c, float *buf, size_t n)
{
    nccl_ctx *x = c->ctx;
    double t;
    if (n == 0 || !on_device(buf)) {
        ds_comm *h = host_of(c, &t);
        return host_done(c, t, h->all_reduce(h, buf, n));
    }
    ds_status s = nccl_begin(c, "all-reduce");
    if (s) return s;
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, x->nccl, x->stream);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(c, r, "all-reduce", n, "floats");
    return nccl_wait(c, "all-reduce", n, "floats");
}

/* A device buffer for a mixed call (released by the caller with cudaFree). */
static ds_status staging(ds_comm *c, void **p, size_t bytes, const void *src)
{
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaSuccess && src) e = cudaMemcpy(*p, src, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        c->failed = true; /* the peers are in the collective already */
        return ds_errorf(DS_ERR_NOMEM, "NCCL all-gather: staging %zu bytes on the GPU: %s", bytes,
                         cudaGetErrorString(e));
    }
    return DS_OK;
}

static ds_status nccl_all_gather(ds_comm *c, const float *in, size_t n, float *out)
{
    nccl_ctx *x = c->ctx;
    bool din = on_device(in), dout = on_device(out);
    double t;
    if (n == 0 || (!din && !dout)) {
        ds_comm *h = host_of(c, &t);
        return host_done(c, t, h->all_gather(h, in, n, out));
    }
    size_t all = n * (size_t)c->world_size;
    void *sin = NULL, *sout = NULL;
    ds_status s = nccl_begin(c, "all-gather");
    if (!s && !din) s = staging(c, &sin, sizeof(float) * n, in);
    if (!s && !dout) s = staging(c, &sout, sizeof(float) * all, NULL);
    if (!s) {
        ncclResult_t r = ncclAllGather(din ? in : sin, dout ? out : sout, n, ncclFloat32, x->nccl, x->stream);
        if (r != ncclSuccess && r != ncclInProgress) s = nccl_fail(c, r, "all-gather", n, "floats");
        else s = nccl_wait(c, "all-gather", n, "floats");
    }
    if (!s && !dout) {
        cudaError_t e = cudaMemcpy(out, sout, sizeof(float) * all, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) s = cuda_fail(c, e, "all-gather", n, "floats");
    }
    cudaFree(sin);
    cudaFree(sout);
    return s;
}

static ds_status nccl_broadcast(ds_comm *c, void *buf, size_t bytes, int root)
{
    nccl_ctx *x = c->ctx;
    double t;
    if (bytes == 0 || !on_device(buf)) {
        ds_comm *h = host_of(c, &t);
        return host_done(c, t, h->broadcast(h, buf, bytes, root));
    }
    ds_status s = nccl_begin(c, "broadcast");
    if (s) return s;
    ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, x->nccl, x->stream);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(c, r, "broadcast", bytes, "bytes");
    return nccl_wait(c, "broadcast", bytes, "bytes");
}

static void nccl_abort(ds_comm *c, int code)
{
    nccl_ctx *x = c->ctx;
    abort_nccl(x);
    x->host->abort(x->host, code);
}

/* Finalises the NCCL communicator (flushing its work) within the deadline,
 * else aborts it; then closes the wrapped one. */
static void nccl_close(ds_comm *c)
{
    nccl_ctx *x = c->ctx;
    if (!x->aborted && ncclCommFinalize(x->nccl) != ncclSuccess) abort_nccl(x);
    for (double t0 = ds_now(); !x->aborted;) {
        ncclResult_t a = ncclSuccess;
        if (ncclCommGetAsyncError(x->nccl, &a) != ncclSuccess || (a != ncclSuccess && a != ncclInProgress) ||
            (c->timeout_s > 0 && ds_now() - t0 > c->timeout_s)) {
            abort_nccl(x);
            break;
        }
        if (a == ncclSuccess) {
            ncclCommDestroy(x->nccl);
            break;
        }
        nap(100000);
    }
    cudaStreamDestroy(x->stream);
    ds_comm *h = x->host;
    free(x);
    free(c);
    h->close(h);
}

/* ---- start-up */

static ds_status init_nccl(ds_comm *c, nccl_ctx *x)
{
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ds_status s = DS_OK;
    ncclResult_t r = ncclSuccess;
    if (c->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess)
        s = ds_errorf(DS_ERR_COMM, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    if ((s = dist_agree(c, s))) return s;
    if (c->world_size > 1 && (s = c->broadcast(c, &id, sizeof id, 0))) return s;
    cudaError_t e = cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) return dist_agree(c, ds_errorf(DS_ERR_COMM, "NCCL: creating a stream: %s",
                                                         cudaGetErrorString(e)));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    r = ncclCommInitRankConfig(&x->nccl, c->world_size, id, c->rank, &cfg);
    for (double t0 = ds_now(); r == ncclInProgress;) {
        if (ncclCommGetAsyncError(x->nccl, &r) != ncclSuccess) r = ncclInternalError;
        if (r == ncclInProgress && c->timeout_s > 0 && ds_now() - t0 > c->timeout_s) {
            s = ds_errorf(DS_ERR_COMM, "NCCL start-up did not complete within %g s (DSV3_COMM_TIMEOUT): a peer "
                          "rank is hung or has died", c->timeout_s);
            break;
        }
        nap(1000000);
    }
    if (!s && r != ncclSuccess) {
        const char *detail = x->nccl ? ncclGetLastError(x->nccl) : "";
        s = ds_errorf(DS_ERR_COMM, "NCCL start-up (rank %d of %d): %s%s%s", c->rank, c->world_size,
                      ncclGetErrorString(r), detail && *detail ? ": " : "", detail ? detail : "");
    }
    return dist_agree(c, s);
}

ds_status nccl_attach(ds_comm *c, const ds_ops *ops)
{
    if (!ops || !ops->name || strcmp(ops->name, "cuda"))
        return dist_agree(c, ds_errorf(DS_ERR_ARG, "NCCL needs the CUDA backend, not %s", ops ? ops->name : "none"));
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    nccl_ctx *x = calloc(1, sizeof *x);
    ds_comm *h = malloc(sizeof *h);
    ds_status s = x && h ? DS_OK : ds_errorf(DS_ERR_NOMEM, "out of memory");
    if ((s = dist_agree(c, s))) {
        free(x);
        free(h);
        return s;
    }
    /* until init succeeds c stays the plain host communicator; x is only scratch */
    x->ops = ops;
    const char *hang = getenv("DSV3_NCCL_FAULT_HANG");
    x->hang_at = hang ? atol(hang) : 0;
    if ((s = init_nccl(c, x))) {
        if (x->nccl) ncclCommAbort(x->nccl);
        if (x->stream) cudaStreamDestroy(x->stream);
        free(x);
        free(h);
        return s;
    }
    /* h takes over c's host transport; c becomes the wrapper (the tool's pointer stays valid) */
    *h = *c;
    x->host = h;
    c->ctx = x;
    c->all_reduce = nccl_all_reduce;
    c->all_gather = nccl_all_gather;
    c->broadcast = nccl_broadcast;
    c->abort = nccl_abort;
    c->close = nccl_close;
    return DS_OK;
}
#endif
