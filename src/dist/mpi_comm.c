/* mpi_comm.c - the ds_comm table over MPI (Open MPI or MPICH), built with
 * -DDSV3_MPI=ON.
 *
 * Decisions:
 * - MPI starts only when a launcher started us (mpirun sets OMPI_COMM_WORLD_SIZE,
 *   PMI_SIZE or PMIX_RANK), so the MPI build run by hand behaves like the
 *   single-process one and never spawns a singleton daemon.
 * - Collectives run on a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so
 *   an MPI error becomes a DS_ERR_COMM with a message instead of an abort
 *   without one.
 * - Watchdog: with a timeout (DSV3_COMM_TIMEOUT seconds, default 60) each
 *   collective is the non-blocking form polled until a deadline; a peer that
 *   hangs turns into an error on the others rather than a silent wait. The
 *   poll yields the CPU (ranks may share cores) and, after a few ms, sleeps
 *   with a growing interval of at most 1 ms, so a rank waiting for rank 0's
 *   user costs almost nothing (dist_broadcast_untimed: polled, no deadline).
 *   DSV3_COMM_TIMEOUT=0 uses the blocking calls (which spin while waiting).
 * - A rank that dies is handled by the launcher: Open MPI's mpirun kills the
 *   job when a rank exits without MPI_Finalize. Error paths call MPI_Abort
 *   (dist_fail), and dist_finish aborts instead of finalizing after a failed
 *   collective, since MPI_Finalize would wait for the stuck peers.
 * - Threads: unless OMP_NUM_THREADS is set, each rank takes
 *   min(cores it may run on, online cores / ranks on this machine). */
#include "dist/dist.h"
#include "dist/nccl_comm.h"

#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_S 60.0
/* largest element count passed to one MPI call (counts are int) */
#define CHUNK ((size_t)1 << 30)

typedef struct {
    MPI_Comm comm;
    bool blocking; /* DSV3_COMM_TIMEOUT=0: the blocking calls, no watchdog */
} mpi_ctx;

static MPI_Comm comm_of(ds_comm *c) { return ((mpi_ctx *)c->ctx)->comm; }

static bool polled(ds_comm *c) { return !((mpi_ctx *)c->ctx)->blocking; }

static const char *unit(const char *op) { return strcmp(op, "broadcast") ? "floats" : "bytes"; }

static ds_status mpi_fail(ds_comm *c, int rc, const char *op, size_t n)
{
    char err[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, err, &len);
    c->failed = true;
    return ds_errorf(DS_ERR_COMM, "%s of %zu %s failed: %s (a peer rank has probably died)", op, n, unit(op), err);
}

static void nap(long ns)
{
    struct timespec ts = {0, ns};
    while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

/* Completes req, or fails once c->timeout_s has passed (never if it is 0). */
static ds_status wait_req(ds_comm *c, MPI_Request *req, const char *op, size_t n)
{
    double t0 = MPI_Wtime();
    long sleep_ns = 20000;
    for (;;) {
        int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, op, n);
        if (done) return DS_OK;
        double waited = MPI_Wtime() - t0;
        if (c->timeout_s > 0 && waited > c->timeout_s) {
            c->failed = true;
            return ds_errorf(DS_ERR_COMM, "%s of %zu %s did not complete within %g s (DSV3_COMM_TIMEOUT): "
                             "a peer rank is hung, has died or is far behind", op, n, unit(op), c->timeout_s);
        }
        if (waited < 0.005) {
            sched_yield();
        } else {
            nap(sleep_ns);
            if (sleep_ns < 1000000) sleep_ns *= 2;
        }
    }
}

static ds_status mpi_all_reduce(ds_comm *c, float *buf, size_t n)
{
    for (size_t off = 0; off < n; off += CHUNK) {
        int cnt = (int)(n - off < CHUNK ? n - off : CHUNK), rc;
        if (polled(c)) {
            MPI_Request req;
            rc = MPI_Iallreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, MPI_SUM, comm_of(c), &req);
            if (rc == MPI_SUCCESS) {
                ds_status s = wait_req(c, &req, "all-reduce", n);
                if (s) return s;
            }
        } else {
            rc = MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, MPI_SUM, comm_of(c));
        }
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "all-reduce", n);
    }
    return DS_OK;
}

static ds_status mpi_all_gather(ds_comm *c, const float *in, size_t n, float *out)
{
    if (n > (size_t)INT_MAX) {
        c->failed = true;
        return ds_errorf(DS_ERR_RANGE, "all-gather of %zu floats per rank exceeds MPI's int count", n);
    }
    int rc;
    if (polled(c)) {
        MPI_Request req;
        rc = MPI_Iallgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, comm_of(c), &req);
        if (rc == MPI_SUCCESS) return wait_req(c, &req, "all-gather", n);
    } else {
        rc = MPI_Allgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, comm_of(c));
    }
    return rc == MPI_SUCCESS ? DS_OK : mpi_fail(c, rc, "all-gather", n);
}

static ds_status mpi_broadcast(ds_comm *c, void *buf, size_t bytes, int root)
{
    for (size_t off = 0; off < bytes || off == 0; off += CHUNK) {
        int cnt = (int)(bytes - off < CHUNK ? bytes - off : CHUNK), rc;
        if (polled(c)) {
            MPI_Request req;
            rc = MPI_Ibcast((char *)buf + off, cnt, MPI_BYTE, root, comm_of(c), &req);
            if (rc == MPI_SUCCESS) {
                ds_status s = wait_req(c, &req, "broadcast", bytes);
                if (s) return s;
            }
        } else {
            rc = MPI_Bcast((char *)buf + off, cnt, MPI_BYTE, root, comm_of(c));
        }
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "broadcast", bytes);
        if (bytes == 0) break;
    }
    return DS_OK;
}

static void mpi_abort(ds_comm *c, int code)
{
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(c ? comm_of(c) : MPI_COMM_WORLD, code);
    _exit(code); /* MPI_Abort should not return */
}

static void mpi_close(ds_comm *c)
{
    mpi_ctx *x = c->ctx;
    MPI_Comm_free(&x->comm);
    free(x);
    free(c);
}

/* True when an MPI launcher (mpirun, mpiexec, srun) started this process. */
static int launched_by_mpi(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

static ds_status parse_timeout(double *out)
{
    const char *e = getenv("DSV3_COMM_TIMEOUT");
    *out = DEFAULT_TIMEOUT_S;
    if (!e || !*e) return DS_OK;
    char *end;
    errno = 0;
    double v = strtod(e, &end);
    if (errno || *end || v < 0 || v != v)
        return ds_errorf(DS_ERR_ARG, "DSV3_COMM_TIMEOUT is '%s'; expected seconds >= 0 (0 = no watchdog)", e);
    *out = v;
    return DS_OK;
}

/* This rank's share of the machine's cores: the cores it may run on, but no
 * more than the machine's cores divided among the ranks placed on it. */
static void set_threads(int local_size, int rank)
{
    if (getenv("OMP_NUM_THREADS")) return;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int allowed = (int)(online > 0 ? online : 1);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) allowed = CPU_COUNT(&set);
    int share = (int)(online / (local_size > 0 ? local_size : 1));
    int n = allowed < share ? allowed : share;
    if (n < 1) n = 1;
    omp_set_num_threads(n);
    if (rank == 0 && allowed < share)
        fprintf(stderr, "dsv3: note: the launcher bound each rank to %d core%s of %d available per rank; "
                "pass --bind-to none (or --map-by ...:PE=N) to mpirun to use them all\n",
                allowed, allowed == 1 ? "" : "s", share);
}

ds_status dist_init(int *argc, char ***argv, ds_comm **out)
{
    *out = NULL;
    if (!launched_by_mpi()) return DS_OK;
#ifdef DSV3_NCCL
    nccl_bind_device(); /* one GPU per rank, chosen before MPI_Init (which may start CUDA) */
#endif
    double timeout;
    ds_status s = parse_timeout(&timeout);
    if (s) return s;
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return ds_errorf(DS_ERR_COMM, "MPI_Init failed");
    int rank = 0, ws = 1, local = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ws);
    if (ws == 1) return DS_OK;
    MPI_Comm shm;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm) == MPI_SUCCESS) {
        MPI_Comm_size(shm, &local);
        MPI_Comm_free(&shm);
    }
    set_threads(local, rank);
    ds_comm *c = calloc(1, sizeof *c);
    mpi_ctx *x = calloc(1, sizeof *x);
    if (!c || !x || MPI_Comm_dup(MPI_COMM_WORLD, &x->comm) != MPI_SUCCESS) {
        free(c);
        free(x);
        /* the peers are about to wait for us in their first collective */
        fprintf(stderr, "dsv3: rank %d: cannot set up the communicator; stopping all ranks\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
        return ds_errorf(DS_ERR_NOMEM, "out of memory");
    }
    MPI_Comm_set_errhandler(x->comm, MPI_ERRORS_RETURN);
    c->rank = rank;
    c->world_size = ws;
    c->local_size = local;
    c->timeout_s = timeout;
    x->blocking = timeout == 0;
    c->ctx = x;
    c->all_reduce = mpi_all_reduce;
    c->all_gather = mpi_all_gather;
    c->broadcast = mpi_broadcast;
    c->abort = mpi_abort;
    c->close = mpi_close;
    *out = c;
    return DS_OK;
}

void dist_finish(ds_comm *c)
{
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (c && c->failed) {
        fflush(stdout);
        fflush(stderr);
        c->abort(c, 1);
    }
    if (c) c->close(c);
    if (inited && !finalized) MPI_Finalize();
}
