/* dist.c - what every transport shares: rank queries, the agreement on a
 * status before compute, the same-bytes check, and the error path.
 *
 * These are written on top of the ds_comm table, so an NCCL table inherits
 * them. The agreement costs one all-reduce of world_size floats (status codes
 * are small integers, exact in float) and, on failure, one broadcast of the
 * failing rank's message. */
#include "dist/dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MSG_CAP 1536

int dist_rank(const ds_comm *c) { return c ? c->rank : 0; }

int dist_world_size(const ds_comm *c) { return c ? c->world_size : 1; }

ds_status dist_agree(ds_comm *c, ds_status local)
{
    if (!c || c->world_size == 1) return local;
    int ws = c->world_size;
    char msg[MSG_CAP];
    c->agreed_failure = false;
    snprintf(msg, sizeof msg, "%s", local ? ds_last_error() : "");
    float *st = calloc((size_t)ws, sizeof(float));
    if (!st) {
        /* cannot take part: the peers would wait in the all-reduce */
        c->failed = true;
        return ds_errorf(DS_ERR_NOMEM, "out of memory agreeing on a status");
    }
    st[c->rank] = (float)local;
    ds_status s = c->all_reduce(c, st, (size_t)ws);
    if (s) {
        free(st);
        return ds_error_prefix(s, "agreeing on a status across ranks");
    }
    int first = -1, n_failed = 0;
    for (int r = 0; r < ws; r++)
        if (st[r] != 0) {
            if (first < 0) first = r;
            n_failed++;
        }
    ds_status code = first < 0 ? DS_OK : (ds_status)(int)st[first];
    free(st);
    if (first < 0) return DS_OK;
    if ((s = c->broadcast(c, msg, sizeof msg, first))) return ds_error_prefix(s, "sharing rank %d's error", first);
    msg[sizeof msg - 1] = '\0';
    c->agreed_failure = true;
    if (n_failed > 1)
        return ds_errorf(code, "rank %d: %s (and %d other rank%s failed)", first, msg, n_failed - 1,
                         n_failed > 2 ? "s" : "");
    return ds_errorf(code, "rank %d: %s", first, msg);
}

/* FNV-1a, 64 bits: enough to tell two configs apart, not a security measure. */
static uint64_t fnv1a(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

ds_status dist_check_same(ds_comm *c, const void *data, size_t len, const char *what)
{
    if (!c || c->world_size == 1) return DS_OK;
    uint64_t mine = fnv1a(data, len), root = mine;
    ds_status s = c->broadcast(c, &root, sizeof root, 0);
    if (s) return ds_error_prefix(s, "comparing %s with rank 0", what);
    if (root != mine)
        return ds_errorf(DS_ERR_ARG, "%s differs from rank 0's (every rank must be given the same one)", what);
    return DS_OK;
}

ds_status dist_broadcast_untimed(ds_comm *c, void *buf, size_t bytes, int root)
{
    if (!c || c->world_size == 1) return DS_OK;
    double t = c->timeout_s;
    c->timeout_s = 0;
    ds_status s = c->broadcast(c, buf, bytes, root);
    c->timeout_s = t;
    return s;
}

int dist_fail(ds_comm *c, const char *cmd)
{
    if (!c || c->world_size == 1) {
        fprintf(stderr, "dsv3 %s: %s\n", cmd, ds_last_error());
        return 1;
    }
    if (c->agreed_failure && !c->failed) {
        if (c->rank == 0) fprintf(stderr, "dsv3 %s: %s\n", cmd, ds_last_error());
        return 1;
    }
    fprintf(stderr, "dsv3 %s: rank %d of %d: %s; stopping all ranks\n", cmd, c->rank, c->world_size,
            ds_last_error());
    fflush(stderr);
    fflush(stdout);
    c->abort(c, 1);
    return 1;
}
