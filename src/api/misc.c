/* misc.c - the API's process-level calls: version, memory, the MPI process
 * group (dist/dist.h), the thread count, the measured hardware limits and the
 * per-op profile for `dsv3 bench`, the weight-byte counts, and a safetensors
 * writer for logits. */
#include "api/api.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_peak.h"
#include "backend/cpu/cpu_stats.h"
#include "backend/registry.h"
#include "dist/dist.h"
#include "io/safetensors.h"

const char *ds_version(void) { return DSV3_VERSION; }
int ds_api_version(void) { return DSV3_API_VERSION; }
void ds_free(void *p) { free(p); }

/* ---- processes */

ds_status ds_dist_init(int *argc, char ***argv, ds_dist **out) { return dist_init(argc, argv, out); }
void ds_dist_finish(ds_dist *d) { dist_finish(d); }
int ds_dist_rank(const ds_dist *d) { return dist_rank(d); }
int ds_dist_world_size(const ds_dist *d) { return dist_world_size(d); }
ds_status ds_dist_agree(ds_dist *d, ds_status local) { return dist_agree(d, local); }
bool ds_dist_failure_agreed(const ds_dist *d) { return !d || d->world_size == 1 || (d->agreed_failure && !d->failed); }

void ds_dist_abort(ds_dist *d, int code)
{
    if (d && d->world_size > 1) d->abort(d, code);
}

ds_status ds_dist_broadcast_line(ds_dist *d, char **line)
{
    if (!d) return DS_OK;
    long long n = *line ? (long long)strlen(*line) : -1;
    /* rank 0 may wait for a person here: no watchdog deadline, the others sleep */
    ds_status s = dist_broadcast_untimed(d, &n, sizeof n, 0);
    if (s) return s;
    if (dist_rank(d) != 0) {
        free(*line);
        *line = NULL;
        if (n < 0) return DS_OK;
        if (!(*line = calloc((size_t)n + 1, 1))) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    }
    return n > 0 ? d->broadcast(d, *line, (size_t)n, 0) : DS_OK;
}

/* ---- threads and limits */

void ds_set_threads(int n)
{
    if (n >= 1) omp_set_num_threads(n);
}

int ds_threads(void) { return omp_get_max_threads(); }

ds_status ds_measure_limits(const char *device, bool ref_kernels, ds_dist *d, ds_limits *out)
{
    memset(out, 0, sizeof *out);
    ds_backend_opts bo = backend_default_opts();
    bo.device = device;
    if (ref_kernels) bo.cpu.isa = CPU_ISA_SCALAR;
    const ds_ops *ops;
    ds_status s = backend_open(&bo, &ops);
    if (s) return s;
    out->gpu = !api_ops_on_host(ops);
    backend_limits l = {0};
    if (!out->gpu && dist_rank(d) == 0) {
        /* with several ranks on one machine, rank 0 measures while the others wait */
        int t = omp_get_max_threads();
        if (d && d->local_size > 1) omp_set_num_threads(t * d->local_size);
        backend_measure(ops, &l);
        omp_set_num_threads(t);
    }
    out->bandwidth_gbps = l.bandwidth_gbps;
    out->fma_gflops = l.fma_gflops;
    out->bf16_gflops = l.bf16_gflops;
    out->amx_gflops = l.amx_gflops;
    if (d && (s = dist_agree(d, DS_OK))) return s;
    if (out->gpu) {
        backend_measure(ops, &l);
        out->bandwidth_gbps = l.bandwidth_gbps;
        out->bf16_gflops = l.bf16_gflops;
    }
    return DS_OK;
}

void ds_engine_touch_weights(const ds_engine *e, size_t *bytes)
{
    const ds_ckpt *c = e->m->ckpt;
    volatile uint8_t sink = 0;
    *bytes = 0;
    for (size_t f = 0; f < c->n_files; f++) {
        const st_file *sf = c->files[f];
        *bytes += sf->size;
        for (size_t i = 0; i < sf->n_tensors; i++) {
            const uint8_t *p = sf->tensors[i].data;
            size_t len = sf->tensors[i].nbytes;
            for (size_t o = 0; p && o < len; o += 4096) sink += p[o];
        }
    }
    (void)sink;
}

double ds_engine_weights_bandwidth(const ds_engine *e, int reps)
{
    if (!api_ops_on_host(e->ops) || e->comm) return 0;
    const st_file *big = NULL;
    for (size_t f = 0; f < e->m->ckpt->n_files; f++)
        if (!big || e->m->ckpt->files[f]->size > big->size) big = e->m->ckpt->files[f];
    if (!big || !big->map || big->size < ((size_t)256 << 20)) return 0;
    size_t n = big->size < ((size_t)1 << 30) ? big->size : (size_t)1 << 30;
    return cpu_read_bandwidth_at(big->map, n, reps);
}

static size_t wbytes(const ds_weight *w)
{
    if (!w->data) return 0;
    size_t n = (size_t)w->rows * w->cols, esz = w->fmt == DS_W_FP8 ? 1 : w->fmt == DS_W_BF16 ? 2 : 4;
    size_t s = w->fmt == DS_W_FP8 ? (size_t)((w->rows + 127) / 128) * ((w->cols + 127) / 128) * 4 : 0;
    return n * esz + s;
}

static size_t welems(const ds_weight *w) { return w->data ? (size_t)w->rows * w->cols : 0; }

static double pass_weights(const ds_model *m, double experts, int head, size_t (*f)(const ds_weight *))
{
    double sum = 0;
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const ds_layer *l = &m->layers[i];
        sum += (double)(f(&l->wq) + f(&l->wq_a) + f(&l->wq_b) + f(&l->wkv_a) + f(&l->wkv_b) + f(&l->wo));
        if (!l->moe) {
            sum += (double)(f(&l->w1) + f(&l->w2) + f(&l->w3));
            continue;
        }
        sum += (double)(f(&l->gate) + f(&l->sw1) + f(&l->sw2) + f(&l->sw3));
        sum += experts * (double)(f(&l->ew1[0]) + f(&l->ew2[0]) + f(&l->ew3[0]));
    }
    return sum + head * (double)f(&m->head);
}

double ds_engine_pass_bytes(const ds_engine *e, double experts, int head) { return pass_weights(e->m, experts, head, wbytes); }
double ds_engine_pass_params(const ds_engine *e, double experts, int head)
{
    return pass_weights(e->m, experts, head, welems);
}

const char *ds_engine_weight_dtype(const ds_engine *e)
{
    const ds_layer *l = &e->m->layers[e->cfg.n_layers - 1];
    return l->wkv_a.fmt == DS_W_FP8 ? "fp8" : l->wkv_a.fmt == DS_W_BF16 ? "bf16" : "f32";
}

size_t ds_engine_kv_bytes(const ds_engine *e)
{
    const ds_kvcache *kv = e->g->kv;
    const ds_model *m = e->m;
    return (size_t)(kv->attn == DS_ATTN_ABSORB ? e->cfg.kv_lora_rank + e->cfg.qk_rope_head_dim
                                                : m->n_local_heads * (m->qk_head_dim + e->cfg.v_head_dim)) *
           sizeof(float) * (size_t)kv->ctx * kv->n_layers;
}

/* ---- profile */

_Static_assert(DS_PROFILE_SIZES == CPU_STAT_SIZES, "the public profile has the CPU counters' size classes");

void ds_profile_enable(bool on) { cpu_stats_enable(on); }

static ds_profile_stat stat_of(const cpu_stat *c) { return (ds_profile_stat){c->calls, c->bytes, c->seconds}; }

void ds_profile_read(ds_profile *out)
{
    cpu_stats st;
    cpu_stats_read(&st);
    for (int k = 0; k < CPU_STAT_SIZES; k++) out->products[k] = stat_of(&st.products[k]);
    out->attention = stat_of(&st.attention);
    out->heads_t = stat_of(&st.heads_t);
    out->moe_calls = st.moe_calls;
    out->experts = st.experts;
}

/* ---- files */

ds_status ds_save_f32(const char *path, const char *name, const float *x, int64_t rows, int64_t cols)
{
    st_writer *w;
    int64_t shape[2] = {rows, cols};
    if (rows < 0 || cols < 0) return ds_errorf(DS_ERR_ARG, "%s: a tensor of (%lld, %lld)", path, (long long)rows, (long long)cols);
    ds_status s = st_writer_open(&w, path);
    if (s) return s;
    if ((s = st_writer_add(w, name, ST_F32, 2, shape)) || (s = st_writer_begin(w)) ||
        (s = st_writer_write(w, x, sizeof(float) * (size_t)rows * (size_t)cols))) {
        st_writer_abort(w);
        return s;
    }
    return st_writer_finish(w);
}
