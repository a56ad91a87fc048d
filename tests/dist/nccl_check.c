/* nccl_check.c - the NCCL communicator against values known in advance
 * (tests/dist/nccl_single.sh; built with DSV3_NCCL).
 *
 *   [mpirun -np N] nccl_check comm
 *       Attaches NCCL to the job's communicator (or, alone or with one rank,
 *       to a one-rank host communicator made here) with the CUDA backend, then
 *       checks all_reduce, all_gather (device/device, host/device,
 *       device/host, host/host) and broadcast from every root on buffers from
 *       ops->alloc written by ops->upload (queued, not yet run: the
 *       collective must wait for it), sizes 1 to 12 MB, with and without a
 *       deadline; and dist_agree through the wrapper. One rank per GPU.
 *
 *   DSV3_COMM_TIMEOUT=2 DSV3_NCCL_FAULT_HANG=1 [mpirun -np N] nccl_check hang
 *       The first device all-reduce never completes (fault injection): the
 *       watchdog must fail it with DS_ERR_COMM naming the timeout, and the
 *       error path (dist_fail) must end the job with exit code 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "dist/dist.h"
#include "dist/nccl_comm.h"

/* ---- a host communicator of one rank, for a run without a launcher */

static ds_status self_all_reduce(ds_comm *c, float *buf, size_t n) { return DS_OK; }

static ds_status self_all_gather(ds_comm *c, const float *in, size_t n, float *out)
{
    memmove(out, in, sizeof(float) * n);
    return DS_OK;
}

static ds_status self_broadcast(ds_comm *c, void *buf, size_t bytes, int root) { return DS_OK; }

static void self_abort(ds_comm *c, int code)
{
    fflush(stdout);
    fflush(stderr);
    _exit(code);
}

static void self_close(ds_comm *c) { free(c); }

static ds_comm *self_comm(void)
{
    ds_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    const char *t = getenv("DSV3_COMM_TIMEOUT");
    *c = (ds_comm){.rank = 0, .world_size = 1, .local_size = 1, .timeout_s = t && *t ? atof(t) : 60,
                   .all_reduce = self_all_reduce, .all_gather = self_all_gather, .broadcast = self_broadcast,
                   .abort = self_abort, .close = self_close};
    return c;
}

/* The job's communicator with NCCL attached; *self tells whether it is the local one. */
static ds_comm *open_comm(const ds_ops **ops, bool *self)
{
    ds_comm *c = NULL;
    if (dist_init(NULL, NULL, &c)) return NULL;
    *self = !c;
    if (!c && !(c = self_comm())) return NULL;
    if (!(*ops = cuda_backend()) || nccl_attach(c, *ops)) {
        fprintf(stderr, "nccl_check: rank %d: %s\n", c->rank, ds_last_error());
        if (!*self) dist_fail(c, "nccl_check");
        return NULL;
    }
    return c;
}

static void close_comm(ds_comm *c, bool self)
{
    if (self) {
        c->close(c);
        dist_finish(NULL);
    } else {
        dist_finish(c);
    }
}

static int bad;
#define EXPECT(c, cond, ...)                                                                      \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            bad++;                                                                                \
            fprintf(stderr, "rank %d: %s:%d: ", (c)->rank, __FILE__, __LINE__);                   \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fputc('\n', stderr);                                                                  \
        }                                                                                         \
    } while (0)

/* counts of h[i] != want(i) */
static size_t wrong_sums(const float *h, size_t n, int ws)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++) w += h[i] != (float)(ws * (ws + 1) / 2 * (int)(i % 1000));
    return w;
}

static size_t wrong_gather(const float *h, size_t n, int ws)
{
    size_t w = 0;
    for (int q = 0; q < ws; q++)
        for (size_t i = 0; i < n; i++) w += h[q * n + i] != (float)(q * 1000 + (int)(i % 1000));
    return w;
}

/* all_gather with in and out on the device (d) or the host (h) as named */
static void check_gather(ds_comm *c, const ds_ops *ops, size_t n, bool din, bool dout, float *h, float *d_in,
                         float *d_out, float *h_out)
{
    int r = c->rank, ws = c->world_size;
    for (size_t i = 0; i < n; i++) h[i] = (float)(r * 1000 + (int)(i % 1000));
    if (din) ops->upload(d_in, h, sizeof(float) * n);
    ds_status s = c->all_gather(c, din ? d_in : h, n, dout ? d_out : h_out);
    EXPECT(c, !s, "all_gather %s->%s of %zu: %s", din ? "dev" : "host", dout ? "dev" : "host", n, ds_last_error());
    if (dout) ops->download(h_out, d_out, sizeof(float) * n * ws);
    size_t w = wrong_gather(h_out, n, ws);
    EXPECT(c, !w, "all_gather %s->%s of %zu: %zu wrong", din ? "dev" : "host", dout ? "dev" : "host", n, w);
    memset(h_out, 0, sizeof(float) * n * ws);
}

static void check_size(ds_comm *c, const ds_ops *ops, size_t n)
{
    int r = c->rank, ws = c->world_size;
    float *h = malloc(sizeof(float) * n), *h_out = calloc(n * ws, sizeof(float));
    float *d = ops->alloc(sizeof(float) * n), *d_out = ops->alloc(sizeof(float) * n * ws);
    if (!h || !h_out || !d || !d_out) {
        EXPECT(c, 0, "out of memory for %zu floats", n);
        goto done;
    }
    /* device all-reduce of a buffer the backend's stream is still writing */
    for (size_t i = 0; i < n; i++) h[i] = (float)((r + 1) * (int)(i % 1000));
    ops->upload(d, h, sizeof(float) * n);
    EXPECT(c, !c->all_reduce(c, d, n), "all_reduce of %zu: %s", n, ds_last_error());
    ops->download(h, d, sizeof(float) * n);
    size_t w = wrong_sums(h, n, ws);
    EXPECT(c, !w, "device all_reduce of %zu: %zu wrong sums", n, w);
    /* host all-reduce: the MPI path */
    for (size_t i = 0; i < n; i++) h[i] = (float)((r + 1) * (int)(i % 1000));
    EXPECT(c, !c->all_reduce(c, h, n), "host all_reduce of %zu: %s", n, ds_last_error());
    w = wrong_sums(h, n, ws);
    EXPECT(c, !w, "host all_reduce of %zu: %zu wrong sums", n, w);
    for (int k = 0; k < 4; k++) check_gather(c, ops, n, k & 1, k & 2, h, d, d_out, h_out);
    for (int root = 0; root < ws; root++) {
        for (int dev = 0; dev < 2; dev++) {
            unsigned char *b = (unsigned char *)h;
            for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(r == root ? (i * 7 + root) & 255 : 0);
            if (dev) ops->upload(d, b, n);
            EXPECT(c, !c->broadcast(c, dev ? (void *)d : b, n, root), "broadcast: %s", ds_last_error());
            if (dev) ops->download(b, d, n);
            w = 0;
            for (size_t i = 0; i < n; i++) w += b[i] != (unsigned char)((i * 7 + root) & 255);
            EXPECT(c, !w, "%s broadcast of %zu bytes from %d: %zu wrong", dev ? "device" : "host", n, root, w);
        }
    }
done:
    free(h);
    free(h_out);
    ops->free(d);
    ops->free(d_out);
}

static int cmd_comm(void)
{
    const ds_ops *ops = NULL;
    bool self = false;
    ds_comm *c = open_comm(&ops, &self);
    if (!c) return 1;
    static const size_t sizes[] = {1, 7, 1000, 3 << 20};
    for (int forever = 0; forever < 2; forever++) {
        c->timeout_s = forever ? 0 : 60;
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) check_size(c, ops, sizes[k]);
    }
    c->timeout_s = 60;
    EXPECT(c, dist_agree(c, DS_OK) == DS_OK && !c->agreed_failure, "agree on success");
    ds_status s = dist_agree(c, c->rank == c->world_size - 1 ? ds_errorf(DS_ERR_IO, "boom") : DS_OK);
    /* alone, dist_agree returns the local status as it is: nothing to agree on */
    EXPECT(c, s == DS_ERR_IO && (c->agreed_failure || c->world_size == 1) && strstr(ds_last_error(), "boom"),
           "agree on a failure: %d '%s'",
           (int)s, ds_last_error());
    EXPECT(c, dist_agree(c, DS_OK) == DS_OK && !c->failed, "agree on success again");
    EXPECT(c, cuda_backend_status() == DS_OK, "CUDA backend: %s", ds_last_error());
    float fb = (float)bad;
    c->all_reduce(c, &fb, 1);
    if (c->rank == 0)
        printf("nccl_check comm: %d rank%s, %s\n", c->world_size, c->world_size > 1 ? "s" : "",
               fb == 0 ? "all checks passed" : "FAILED");
    int rc = bad || fb ? 1 : 0;
    close_comm(c, self);
    return rc;
}

static int cmd_hang(void)
{
    const ds_ops *ops = NULL;
    bool self = false;
    ds_comm *c = open_comm(&ops, &self);
    if (!c) return 1;
    size_t n = 1000;
    float *d = ops->alloc(sizeof(float) * n);
    ds_status s = d ? c->all_reduce(c, d, n) : DS_ERR_NOMEM;
    printf("nccl_check hang: all_reduce returned %d, failed=%d: %s\n", (int)s, (int)c->failed,
           s ? ds_last_error() : "(no error)");
    fflush(stdout);
    if (s == DS_OK) {
        close_comm(c, self);
        return 0; /* the script reports the missing timeout */
    }
    return dist_fail(c, "nccl_check hang"); /* ends the job: exit 1 */
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "comm")) return cmd_comm();
    if (argc >= 2 && !strcmp(argv[1], "hang")) return cmd_hang();
    fprintf(stderr, "usage: nccl_check comm|hang (see tests/dist/nccl_check.c)\n");
    return 2;
}
