/* exec.c - runs forward passes (model.h's model_forward and model_forward_pick)
 * around the model's math in forward.c: checks a batch and uploads its arrays
 * once, replays recorded decode steps where the backend records graphs, and
 * delivers the logits (gathered across ranks) or only the picked tokens (on the
 * device where the backend picks). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/sampler.h"

/* ColumnParallel head: each rank holds a vocabulary slice; gather the slices
 * (rank, n_out, vocab_local) and interleave them into rows of the full vocabulary. */
static ds_status gather_logits(ds_model *m, const float *part, int n_out, float *logits)
{
    size_t vl = (size_t)m->vocab_local, per = (size_t)n_out * vl;
    /* part and logits are host memory (downloaded), so the gather is too */
    float *all = malloc(sizeof(float) * per * m->world_size);
    if (!all) return ds_errorf(DS_ERR_NOMEM, "out of memory gathering logits");
    ds_status s = m->opt.comm->all_gather(m->opt.comm, part, per, all);
    for (int r = 0; !s && r < m->world_size; r++)
        for (int i = 0; i < n_out; i++)
            memcpy(logits + (size_t)i * vl * m->world_size + r * vl, all + r * per + i * vl, sizeof(float) * vl);
    free(all);
    return s;
}

static ds_status check_batch(const ds_model *m, const ds_kvcache *kv, int n, const int32_t *tok, const int *seq,
                             const int *pos)
{
    for (int i = 0; i < n; i++) {
        if (tok[i] < 0 || tok[i] >= m->cfg.vocab_size)
            return ds_errorf(DS_ERR_RANGE, "token id %d is outside the vocabulary [0, %d)", tok[i], m->cfg.vocab_size);
        if (seq[i] < 0 || seq[i] >= kv->n_seq)
            return ds_errorf(DS_ERR_RANGE, "sequence %d is outside the KV cache's %d sequences", seq[i], kv->n_seq);
        if (pos[i] < 0 || pos[i] >= kv->ctx)
            return ds_errorf(DS_ERR_RANGE, "position %d is beyond the context of %d tokens%s", pos[i], kv->ctx,
                             kv->ctx == m->cfg.max_seq_len ? " (max_seq_len)" : "");
    }
    return DS_OK;
}

/* The batch of the n tokens whose arrays ids_d [tok | seq | pos | cache row |
 * wanted rows] are in ops->alloc memory. contig (NULL: not known to be): the tokens
 * are one sequence's consecutive positions, from sequence contig[0] position contig[1]. */
static fwd_batch batch_of(const int32_t *ids_d, int n, int n_out, const int *contig, int pos_bound)
{
    return (fwd_batch){n, n_out, ids_d, ids_d + n, ids_d + 2 * n, ids_d + 3 * n, ids_d + 4 * n, contig != NULL,
                      contig ? contig[0] : 0, contig ? contig[1] : 0, pos_bound, NULL};
}

/* sampler_pick_u for a host row with p's settings (NULL: greedy), after p's penalty
 * (on row). */
static int32_t pick_host(float *row, int V, const ds_pick *p)
{
    if (p && p->n_hist > 0) sampler_penalise(row, p->hist, p->n_hist, p->penalty);
    if (!p || !(p->temperature > 0)) return sampler_argmax(row, V);
    if (!(p->top_k > 0 || p->top_p < 1)) {
        float *scratch = malloc(sizeof(float) * (size_t)V);
        int32_t k = scratch ? sampler_draw(row, V, p->temperature, p->u, scratch) : sampler_argmax(row, V);
        free(scratch);
        return k;
    }
    ds_sampler s;
    ds_sampling set = {p->temperature, p->top_k, p->top_p, 1.0f};
    if (sampler_init(&s, &set, 0, V)) return sampler_argmax(row, V); /* out of memory */
    int32_t k = sampler_pick_u(&s, row, p->u);
    sampler_free(&s);
    return k;
}

/* what a pass hands back: logits rows, or when next is set only the picks */
typedef struct {
    float *logits;
    const ds_pick *pick;
    int32_t *next;
} fwd_out;

/* DS_ERR_RANGE when a logit of the n rows of V is NaN or infinite: a pass gives
 * finite logits unless the weights or the config overflow float32, and nothing
 * may be sampled from them. One pass over the rows, cheap beside the pass. */
static ds_status finite_rows(const float *x, int n, int V)
{
    for (size_t i = 0; i < (size_t)n * V; i++)
        if (!isfinite(x[i]))
            return ds_errorf(DS_ERR_RANGE, "the logits of wanted token %zu are not finite (%s at id %zu): the weights "
                             "or the config overflow float32 (check_numerics names the first such layer)",
                             i / (size_t)V, isnan(x[i]) ? "NaN" : "inf", i % (size_t)V);
    return DS_OK;
}

/* The n rows of logits in device (alloc'd) memory d to the caller: into o->logits,
 * or when o->next is set only the picks (see ds_ops.pick_rows), on the device
 * when the backend can (o->logits then unused; else the host's scratch).
 * World size 1: the rows are the whole vocabulary. */
static ds_status deliver(ds_model *m, float *d, int n, const fwd_out *o)
{
    int V = m->vocab_local;
    if (o->next && m->ops->pick_rows && !m->opt.check_numerics) {
        m->ops->pick_rows(o->next, d, n, V, o->pick);
        return DS_OK;
    }
    m->be.download(&m->be, o->logits, d, sizeof(float) * (size_t)n * V);
    ds_status s = finite_rows(o->logits, n, V);
    for (int i = 0; !s && o->next && i < n; i++)
        o->next[i] = pick_host(o->logits + (size_t)i * V, V, o->pick ? o->pick + i : NULL);
    return s;
}

/* Each of the n rows of logits in alloc'd memory d: its argmax into next[i],
 * on the device where the backend picks (ops->pick_rows), else on the host. */
static ds_status argmax_rows(ds_model *m, float *d, int n, int32_t *next)
{
    int V = m->vocab_local;
    if (m->ops->pick_rows && m->world_size == 1) {
        m->ops->pick_rows(next, d, n, V, NULL);
        return DS_OK;
    }
    float *h = malloc(sizeof(float) * (size_t)n * V);
    if (!h) return ds_errorf(DS_ERR_NOMEM, "out of memory for %d rows of logits", n);
    m->be.download(&m->be, h, d, sizeof(float) * (size_t)n * V);
    for (int i = 0; i < n; i++) next[i] = sampler_argmax(h + (size_t)i * V, V);
    free(h);
    return DS_OK;
}

/* The graph slot (of slots: kv->dec, kv->dech or kv->mtp) for a pass of n
 * tokens whose positions are at most pos_max, and its class in *cls; NULL when
 * the pass runs eagerly: no graph support, n > DS_GRAPH_NMAX, several ranks,
 * tune.no_graphs, a recording that failed, or the first pass of its n (the
 * warm-up: weights, tables and buffers settle; the second is recorded). */
static ds_graph_slot *graph_slot(ds_model *m, ds_graph_slot (*slots)[DS_GRAPH_NMAX + 1], int n, int pos_max, int *cls)
{
    const ds_ops *ops = m->ops;
    if (!ops->graph_begin || n > DS_GRAPH_NMAX || m->world_size != 1 || m->opt.tune.no_graphs ||
        m->opt.check_numerics)
        return NULL;
    /* class 0 (short contexts) only where a backend op can use the bound */
    *cls = ops->mla_attend && pos_max < DS_GRAPH_SHORT ? 0 : 1;
    ds_graph_slot *d = &slots[*cls][n];
    return d->failed || (!d->graph && d->runs++ < 1) ? NULL : d;
}

/* A decode step of n <= DS_GRAPH_NMAX tokens, all wanted, on one rank, through
 * the backend's recorded graph for n (graph_slot): every step after the
 * recording uploads its token arrays to the recording's fixed buffer and
 * replays it. hidden (NULL: none): receives the states of transformer_forward's
 * b->hidden, from the recording's own buffer. Returns false when the step must
 * run eagerly instead. */
static bool forward_graph(ds_model *m, ds_kvcache *kv, int n, const int32_t *ids, int pos_max, const fwd_out *o,
                          float *hidden, ds_status *s)
{
    const ds_ops *ops = m->ops;
    ds_backend *be = &m->be;
    int cls, dim = m->cfg.dim;
    ds_graph_slot *d = graph_slot(m, hidden ? kv->dech : kv->dec, n, pos_max, &cls);
    if (!d) return false;
    if (!d->ids) d->ids = be->alloc(be, sizeof(int32_t) * 5 * (size_t)n);
    if (!d->logits) d->logits = be->alloc_scratch(be, sizeof(float) * (size_t)n * m->vocab_local);
    if (hidden && !d->hout) d->hout = be->alloc_scratch(be, sizeof(float) * (size_t)n * dim);
    if (!d->ids || !d->logits || (hidden && !d->hout)) return false;
    be->upload(be, d->ids, ids, sizeof(int32_t) * 5 * (size_t)n);
    if (!d->graph) {
        ops->graph_begin();
        /* positions vary between replays, within the class's bound */
        fwd_batch b = batch_of(d->ids, n, n, NULL, cls ? 0 : DS_GRAPH_SHORT);
        b.hidden = d->hout;
        *s = transformer_forward(m, kv, &b, d->logits);
        d->graph = ops->graph_end();
        if (!d->graph) { /* nothing ran (an op had to wait): this n runs eagerly from now on */
            d->failed = true;
            *s = DS_OK;
            return false;
        }
        if (*s) return true;
    }
    ops->graph_run(d->graph);
    if (hidden) be->copy_rows(be, hidden, dim, NULL, d->hout, dim, NULL, n, dim);
    *s = deliver(m, d->logits, n, o);
    return true;
}

/* model_forward, or with o->next set model_forward_pick (o->logits: the host rows,
 * as scratch where the picks are made on the host). */
static ds_status forward_run(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq, const int *pos,
                             const bool *want, const fwd_out *o, float *hidden)
{
    ds_backend *be = &m->be;
    if (n <= 0) return ds_errorf(DS_ERR_ARG, "forward pass needs at least one token");
    ds_status s = check_batch(m, kv, n, tok, seq, pos);
    if (s) return s;
    int n_out = 0;
    for (int i = 0; i < n; i++) n_out += want[i];
    /* per-token arrays, uploaded once: tok, seq, pos, cache row, wanted rows */
    int32_t *ids = malloc(sizeof(int32_t) * 5 * (size_t)n), *ids_d = NULL;
    float *part = NULL, *lg = NULL;
    if (!ids) return ds_errorf(DS_ERR_NOMEM, "out of memory for %d tokens", n);
    int pos_max = 0;
    for (int i = 0, j = 0; i < n; i++) {
        pos_max = pos[i] > pos_max ? pos[i] : pos_max;
        ids[i] = tok[i];
        ids[n + i] = seq[i];
        ids[2 * n + i] = pos[i];
        ids[3 * n + i] = seq[i] * kv->ctx + pos[i];
        if (want[i]) ids[4 * n + j++] = i;
    }
    if (n_out == n && forward_graph(m, kv, n, ids, pos_max, o, hidden, &s)) goto done;
    size_t nl = (size_t)n_out * m->vocab_local;
    if (!(ids_d = be->alloc(be, sizeof(int32_t) * 5 * (size_t)n)) ||
        (n_out && !(lg = be->alloc_scratch(be, sizeof(float) * nl))) ||
        (n_out && m->world_size > 1 && !(part = malloc(sizeof(float) * nl)))) {
        s = ds_errorf(DS_ERR_NOMEM, "out of memory for %d tokens", n);
        goto done;
    }
    be->upload(be, ids_d, ids, sizeof(int32_t) * 5 * (size_t)n);
    int contig[2] = {seq[0], pos[0]};
    bool one_run = true;
    for (int i = 1; i < n && one_run; i++) one_run = seq[i] == seq[0] && pos[i] == pos[0] + i;
    fwd_batch b = batch_of(ids_d, n, n_out, one_run ? contig : NULL, pos_max + 1);
    b.hidden = hidden;
    if ((s = transformer_forward(m, kv, &b, lg))) goto done;
    if (n_out && m->world_size == 1) {
        s = deliver(m, lg, n_out, o);
    } else if (n_out) {
        be->download(be, part, lg, sizeof(float) * nl);
        s = gather_logits(m, part, n_out, o->logits);
        if (!s) s = finite_rows(o->logits, n_out, m->cfg.vocab_size);
        for (int i = 0; !s && o->next && i < n_out; i++)
            o->next[i] = pick_host(o->logits + (size_t)i * m->cfg.vocab_size, m->cfg.vocab_size,
                                   o->pick ? o->pick + i : NULL);
    } else {
        be->sync(be);
    }
done:;
    ds_status os = be->status(be); /* an op that could not run recorded why */
    if (!s) s = os;
    be->free(be, lg);
    be->free(be, ids_d);
    free(part);
    free(ids);
    return s;
}

ds_status model_forward(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq, const int *pos,
                        const bool *want, float *logits)
{
    fwd_out o = {logits, NULL, NULL};
    return forward_run(m, kv, n, tok, seq, pos, want, &o, NULL);
}

ds_status model_forward_hidden(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq,
                               const int *pos, const bool *want, float *logits, float *hidden)
{
    fwd_out o = {logits, NULL, NULL};
    return forward_run(m, kv, n, tok, seq, pos, want, &o, hidden);
}

ds_status model_mtp(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq, const int *pos,
                    const float *hidden, const int *hrow, float *logits)
{
    return model_mtp_rows(m, kv, n, tok, seq, pos, hidden, hrow, NULL, logits, NULL, NULL);
}

/* model_mtp_rows' pass of n <= DS_GRAPH_NMAX rows (ids: its per-row arrays,
 * n_out rows wanted) through the backend's recorded MTP pass for n, as
 * forward_graph: the rows' input states are gathered into the recording's
 * buffer first, the recording computes every row's logits and state, and the
 * wanted rows and the states are copied out of its buffers. */
static bool mtp_graph(ds_model *m, ds_kvcache *kv, int n, const int32_t *ids, int n_out, int pos_max,
                      const float *hidden, float *logits, float *hout, int32_t *next, ds_status *s)
{
    const ds_ops *ops = m->ops;
    ds_backend *be = &m->be;
    int cls, dim = m->cfg.dim;
    size_t V = (size_t)m->vocab_local;
    ds_graph_slot *d = graph_slot(m, kv->mtp, n, pos_max, &cls);
    if (!d) return false;
    if (!d->ids) d->ids = be->alloc(be, sizeof(int32_t) * 6 * (size_t)n);
    if (!d->logits) d->logits = be->alloc_scratch(be, sizeof(float) * (size_t)n * V);
    if (!d->hin) d->hin = be->alloc_scratch(be, sizeof(float) * (size_t)n * dim);
    if (!d->hout) d->hout = be->alloc_scratch(be, sizeof(float) * (size_t)n * dim);
    if (!d->ids || !d->logits || !d->hin || !d->hout) return false;
    be->upload(be, d->ids, ids, sizeof(int32_t) * 6 * (size_t)n);
    be->copy_rows(be, d->hin, dim, NULL, hidden, dim, d->ids + 5 * n, n, dim); /* the rows' h[i] */
    if (!d->graph) {
        ops->graph_begin();
        fwd_batch b = batch_of(d->ids, n, n, NULL, cls ? 0 : DS_GRAPH_SHORT);
        *s = mtp_forward(m, kv, &b, d->hin, d->logits, d->hout);
        d->graph = ops->graph_end();
        if (!d->graph) {
            d->failed = true;
            *s = DS_OK;
            return false;
        }
        if (*s) return true;
    }
    ops->graph_run(d->graph);
    if (hout) be->copy_rows(be, hout, dim, NULL, d->hout, dim, NULL, n, dim);
    if (next && n_out) { /* every row's pick, then the wanted ones' */
        int32_t all[DS_GRAPH_NMAX];
        *s = argmax_rows(m, d->logits, n, all);
        for (int j = 0; j < n_out; j++) next[j] = all[ids[4 * n + j]];
        return true;
    }
    if (n_out == n) be->download(be, logits, d->logits, sizeof(float) * n * V);
    for (int j = 0; n_out < n && j < n_out; j++) /* ids[4n..]: the wanted rows */
        be->download(be, logits + j * V, d->logits + (size_t)ids[4 * n + j] * V, sizeof(float) * V);
    if (!n_out) be->sync(be);
    return true;
}

ds_status model_mtp_rows(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq, const int *pos,
                         const float *hidden, const int *hrow, const bool *want, float *logits, float *hout,
                         int32_t *next)
{
    ds_backend *be = &m->be;
    if (!m->mtp) return ds_errorf(DS_ERR_ARG, "the MTP module is not loaded (load the model with mtp on)");
    if (n <= 0) return ds_errorf(DS_ERR_ARG, "an MTP pass needs at least one row");
    if (kv->n_layers != m->n_blocks)
        return ds_errorf(DS_ERR_ARG, "the KV cache has no layer for the MTP block (made before the module was loaded)");
    ds_status s = check_batch(m, kv, n, tok, seq, pos);
    if (s) return s;
    /* per-row arrays, uploaded once: tok, seq, pos, cache row, wanted rows (all), hidden row */
    int32_t *ids = malloc(sizeof(int32_t) * 6 * (size_t)n), *ids_d = NULL;
    float *hd = NULL, *lg = NULL;
    if (!ids) return ds_errorf(DS_ERR_NOMEM, "out of memory for %d MTP rows", n);
    int pos_max = 0, n_out = 0;
    for (int i = 0; i < n; i++) {
        pos_max = pos[i] > pos_max ? pos[i] : pos_max;
        ids[i] = tok[i];
        ids[n + i] = seq[i];
        ids[2 * n + i] = pos[i];
        ids[3 * n + i] = seq[i] * kv->ctx + pos[i];
        if (!want || want[i]) ids[4 * n + n_out++] = i;
        ids[5 * n + i] = hrow[i];
    }
    if (mtp_graph(m, kv, n, ids, n_out, pos_max, hidden, logits, hout, next, &s)) goto done;
    size_t dim = (size_t)m->cfg.dim, nl = (size_t)(n_out ? n_out : 1) * m->vocab_local;
    if (!(ids_d = be->alloc(be, sizeof(int32_t) * 6 * (size_t)n)) ||
        !(hd = be->alloc_scratch(be, sizeof(float) * n * dim)) || !(lg = be->alloc_scratch(be, sizeof(float) * nl))) {
        s = ds_errorf(DS_ERR_NOMEM, "out of memory for %d MTP rows", n);
        goto done;
    }
    be->upload(be, ids_d, ids, sizeof(int32_t) * 6 * (size_t)n);
    be->copy_rows(be, hd, (int)dim, NULL, hidden, (int)dim, ids_d + 5 * n, n, (int)dim); /* the rows' h[i] */
    int contig[2] = {seq[0], pos[0]};
    bool one_run = true;
    for (int i = 1; i < n && one_run; i++) one_run = seq[i] == seq[0] && pos[i] == pos[0] + i;
    fwd_batch b = batch_of(ids_d, n, n_out, one_run ? contig : NULL, pos_max + 1);
    if ((s = mtp_forward(m, kv, &b, hd, lg, hout))) goto done;
    if (n_out && next) s = argmax_rows(m, lg, n_out, next);
    else if (n_out) be->download(be, logits, lg, sizeof(float) * nl);
    else be->sync(be);
done:;
    ds_status os = be->status(be);
    if (!s) s = os;
    be->free(be, lg);
    be->free(be, hd);
    be->free(be, ids_d);
    free(ids);
    return s;
}

ds_status model_forward_pick(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq, const int *pos,
                             const ds_pick *pick, int32_t *next)
{
    return model_forward_pick_hidden(m, kv, n, tok, seq, pos, pick, next, NULL);
}

ds_status model_forward_pick_hidden(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq,
                                    const int *pos, const ds_pick *pick, int32_t *next, float *hidden)
{
    if (n <= 0) return ds_errorf(DS_ERR_ARG, "forward pass needs at least one token");
    bool *want = malloc((size_t)n), host = !m->ops->pick_rows || m->world_size > 1;
    float *logits = NULL;
    if (want) memset(want, 1, (size_t)n);
    /* the rows reach the host only where the backend cannot pick */
    if (host) logits = malloc(sizeof(float) * (size_t)n * m->cfg.vocab_size);
    fwd_out o = {logits, pick, next};
    ds_status s = !want || (host && !logits) ? ds_errorf(DS_ERR_NOMEM, "out of memory for %d tokens' logits", n)
                                             : forward_run(m, kv, n, tok, seq, pos, want, &o, hidden);
    free(want);
    free(logits);
    return s;
}
