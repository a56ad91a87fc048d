/* engine.c - ds_engine: load a checkpoint onto a device, the sequences (KV
 * slots) with fork and truncate, batched evaluation, and ds_generate.
 *
 * A slot's KV rows are only ever read at positions below the slot's length
 * (each token attends to positions 0..pos of its own sequence), so truncating
 * is bookkeeping, and rows past the length written by a failed pass are
 * overwritten before anything reads them. Fork copies rows with the backend's
 * copy_rows, so the copy stays in device memory. */
#include "api/api.h"

#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "dist/dist.h"
#include "dist/nccl_comm.h"

bool api_ops_on_host(const ds_ops *ops) { return !strncmp(ops->name, "cpu", 3); }

void api_model_info(const ds_config *c, const char *dir, ds_model_info *info, char *name, size_t name_cap)
{
    size_t n = dir ? strlen(dir) : 0;
    while (dir && n > 1 && dir[n - 1] == '/') n--; /* "m/" names m */
    const char *base = dir;
    for (size_t i = 0; dir && i + 1 < n; i++)
        if (dir[i] == '/') base = dir + i + 1;
    snprintf(name, name_cap, "%.*s", dir ? (int)(n - (size_t)(base - dir)) : 0, dir ? base : "");
    *info = (ds_model_info){.name = name,
                            .n_vocab = c->vocab_size,
                            .max_seq_len = c->max_seq_len,
                            .max_batch_size = c->max_batch_size,
                            .n_layers = c->n_layers,
                            .n_dense_layers = c->n_dense_layers,
                            .dim = c->dim,
                            .n_heads = c->n_heads,
                            .n_routed_experts = c->n_routed_experts,
                            .n_activated_experts = c->n_activated_experts,
                            .n_shared_experts = c->n_shared_experts,
                            .kv_lora_rank = c->kv_lora_rank,
                            .qk_nope_head_dim = c->qk_nope_head_dim,
                            .qk_rope_head_dim = c->qk_rope_head_dim,
                            .v_head_dim = c->v_head_dim,
                            .fp8 = c->dtype == DS_DTYPE_FP8};
}

ds_status api_config_load(ds_config *cfg, const char *dir, const char *path)
{
    if (path) return config_load(cfg, path);
    if (!dir) return ds_errorf(DS_ERR_ARG, "no checkpoint directory and no config given");
    size_t n = strlen(dir) + sizeof "/config.json";
    char *p = malloc(n);
    if (!p) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    snprintf(p, n, "%s/config.json", dir);
    ds_status s = config_load(cfg, p);
    free(p);
    return s;
}

ds_status ds_read_model_info(const char *ckpt_dir, const char *config_path, ds_model_info_buf *out)
{
    ds_config cfg;
    ds_status s = api_config_load(&cfg, ckpt_dir, config_path);
    if (s) return s;
    api_model_info(&cfg, ckpt_dir, &out->info, out->name_buf, sizeof out->name_buf);
    return DS_OK;
}

ds_engine_params ds_engine_default_params(void)
{
    return (ds_engine_params){.device = "auto", .attention = DS_ATTENTION_ABSORB, .matmul = DS_MATMUL_BF16};
}

/* More threads than any machine has cores only cost stacks, and OpenMP cannot
 * report a failure to create them: -t 100000 ended in a segmentation fault. */
#define ENGINE_MAX_THREADS 1024

static ds_status check_params(const ds_engine_params *p)
{
    if (p->n_threads < 0 || p->n_threads > ENGINE_MAX_THREADS)
        return ds_errorf(DS_ERR_ARG, "n_threads must be in [0, %d] (0: the default), got %d", ENGINE_MAX_THREADS,
                         p->n_threads);
    if (!p->n_threads && omp_get_max_threads() > ENGINE_MAX_THREADS)
        return ds_errorf(DS_ERR_ARG, "OpenMP's default of %d threads (OMP_NUM_THREADS) is over the limit of %d",
                         omp_get_max_threads(), ENGINE_MAX_THREADS);
    if (p->n_ctx < 0) return ds_errorf(DS_ERR_ARG, "n_ctx must be >= 0 (0: the default), got %d", p->n_ctx);
    if (p->n_seq < 0) return ds_errorf(DS_ERR_ARG, "n_seq must be >= 0 (0: one sequence), got %d", p->n_seq);
    if (p->prefill_chunk < 0) return ds_errorf(DS_ERR_ARG, "prefill_chunk must be >= 1 (0: the backend's choice)");
    if (p->expand_min < 0) return ds_errorf(DS_ERR_ARG, "expand_min must be >= 0");
    if (p->attention != DS_ATTENTION_ABSORB && p->attention != DS_ATTENTION_NAIVE)
        return ds_errorf(DS_ERR_ARG, "attention must be DS_ATTENTION_ABSORB or DS_ATTENTION_NAIVE");
    if (p->matmul != DS_MATMUL_BF16 && p->matmul != DS_MATMUL_FP8)
        return ds_errorf(DS_ERR_ARG, "matmul must be DS_MATMUL_BF16 or DS_MATMUL_FP8");
    return DS_OK;
}

ds_status ds_engine_load(const char *dir, const ds_engine_params *pp, ds_engine **out)
{
    ds_engine_params p = pp ? *pp : ds_engine_default_params();
    *out = NULL;
    if (!dir) return ds_errorf(DS_ERR_ARG, "no checkpoint directory given");
    ds_status s = check_params(&p);
    if (s) return s;
    ds_engine *e = calloc(1, sizeof *e);
    if (!e) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    e->comm = p.dist;
    ds_backend_opts bo = backend_default_opts();
    bo.device = p.device;
    if (p.ref_kernels) bo.cpu.isa = CPU_ISA_SCALAR;
    bo.cpu.no_amx = p.no_amx;
    if ((s = backend_open(&bo, &e->ops)) || (s = dist_attach_device(e->comm, e->ops)) ||
        (s = api_config_load(&e->cfg, dir, p.config_path)))
        goto fail;
    if (!p.no_tokenizer) {
        if (!(e->tok = calloc(1, sizeof *e->tok))) {
            s = ds_errorf(DS_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if ((s = tok_load(&e->tok->tok, p.tokenizer_dir ? p.tokenizer_dir : dir))) goto fail;
        if (tok_vocab_size(e->tok->tok) > e->cfg.vocab_size) {
            s = ds_errorf(DS_ERR_FORMAT, "the tokenizer has %d tokens but the model's vocab_size is %d",
                          tok_vocab_size(e->tok->tok), e->cfg.vocab_size);
            goto fail;
        }
    }
    int ctx = p.n_ctx ? p.n_ctx : e->cfg.max_seq_len < 4096 ? e->cfg.max_seq_len : 4096;
    if (ctx > e->cfg.max_seq_len) {
        s = ds_errorf(DS_ERR_RANGE, "a context of %d positions exceeds max_seq_len %d", ctx, e->cfg.max_seq_len);
        goto fail;
    }
    if (p.n_threads) omp_set_num_threads(p.n_threads);
    ds_model_opts mo = {.attn = p.attention == DS_ATTENTION_NAIVE ? DS_ATTN_NAIVE : DS_ATTN_ABSORB,
                        .gemm = p.matmul == DS_MATMUL_FP8 ? DS_GEMM_FP8 : DS_GEMM_BF16,
                        .ops = e->ops,
                        .comm = e->comm,
                        .tune = {.prefill_chunk = p.prefill_chunk, .expand_min = p.expand_min, .no_graphs = p.no_graphs},
                        .mtp = p.mtp, .check_numerics = p.check_numerics};
    if ((s = model_load(&e->m, dir, &e->cfg, &mo)) || (s = gen_new(&e->g, e->m, p.n_seq ? p.n_seq : 1, ctx))) goto fail;
    api_model_info(&e->cfg, dir, &e->info, e->name, sizeof e->name);
    *out = e;
    return DS_OK;
fail:
    ds_engine_free(e);
    return s;
}

void ds_engine_free(ds_engine *e)
{
    if (!e) return;
    gen_free(e->g);
    model_free(e->m);
    if (e->ops) backend_release(e->ops);
    ds_tokenizer_free(e->tok);
    free(e->logits);
    if (e->ops) e->ops->free(e->hidden);
    if (e->ops) e->ops->free(e->mtp_state);
    free(e->mtp_seq);
    free(e->mtp_pos);
    free(e->last_seq);
    free(e->last_pos);
    free(e->last_tok);
    free(e->mtp_logits);
    free(e);
}

const ds_model_info *ds_engine_info(const ds_engine *e) { return &e->info; }
int ds_engine_n_ctx(const ds_engine *e) { return e->g->ctx; }
int ds_engine_n_seq(const ds_engine *e) { return e->g->n_seq; }
int ds_engine_n_vocab(const ds_engine *e) { return e->cfg.vocab_size; }
int32_t ds_engine_eos(const ds_engine *e) { return e->tok ? tok_eos_id(e->tok->tok) : -1; }
int32_t ds_engine_bos(const ds_engine *e) { return e->tok ? tok_bos_id(e->tok->tok) : -1; }
const char *ds_engine_device_name(const ds_engine *e) { return e->ops->name; }
bool ds_engine_on_host(const ds_engine *e) { return api_ops_on_host(e->ops); }
const ds_tokenizer *ds_engine_tokenizer(const ds_engine *e) { return e->tok; }
ds_dist *ds_engine_dist(const ds_engine *e) { return e->comm; }
ds_status ds_engine_check(ds_engine *e) { return backend_status(e->ops); }

void ds_engine_get_stats(const ds_engine *e, ds_engine_stats *out)
{
    const ds_gen *g = e->g;
    *out = (ds_engine_stats){g->prefill_tokens, g->decode_tokens, g->prefill_s, g->decode_s, g->prefill_shortened,
                             g->prefill_chunk, e->spec_drafted, e->spec_accepted, e->spec_steps, {0},
                             e->spec_draft_s, e->spec_check_s};
    memcpy(out->spec_accept_len, e->spec_accept_len, sizeof out->spec_accept_len);
}

/* ---- sequences */

static ds_status check_seq(const ds_engine *e, int seq, const char *what)
{
    if (seq < 0 || seq >= e->g->n_seq)
        return ds_errorf(DS_ERR_RANGE, "%s: sequence %d is outside [0, %d)", what, seq, e->g->n_seq);
    return DS_OK;
}

int ds_seq_len(const ds_engine *e, int seq) { return check_seq(e, seq, "ds_seq_len") ? -1 : e->g->n_cached[seq]; }

const int32_t *ds_seq_tokens(const ds_engine *e, int seq)
{
    return check_seq(e, seq, "ds_seq_tokens") ? NULL : e->g->cached[seq];
}

ds_status ds_seq_truncate(ds_engine *e, int seq, int len)
{
    ds_status s = check_seq(e, seq, "ds_seq_truncate");
    if (s) return s;
    if (len < 0 || len > e->g->n_cached[seq])
        return ds_errorf(DS_ERR_RANGE, "ds_seq_truncate: length %d is outside [0, %d] (sequence %d)", len,
                         e->g->n_cached[seq], seq);
    e->g->n_cached[seq] = len;
    e->g->next_ok[seq] = false;
    return DS_OK;
}

int ds_seq_common_prefix(const ds_engine *e, int seq, const int32_t *toks, int n)
{
    if (check_seq(e, seq, "ds_seq_common_prefix")) return 0;
    int k = 0, have = e->g->n_cached[seq];
    while (k < have && k < n && e->g->cached[seq][k] == toks[k]) k++;
    return k;
}

/* The float rows of one position in each of a layer's two caches. */
static void kv_row_sizes(const ds_engine *e, size_t *a, size_t *b)
{
    const ds_kvcache *kv = e->g->kv;
    const ds_model *m = e->m;
    *a = kv->attn == DS_ATTN_ABSORB ? (size_t)e->cfg.kv_lora_rank : (size_t)m->n_local_heads * m->qk_head_dim;
    *b = kv->attn == DS_ATTN_ABSORB ? (size_t)e->cfg.qk_rope_head_dim : (size_t)m->n_local_heads * e->cfg.v_head_dim;
}

static float *kv_part(const ds_kvcache *kv, int li, int part)
{
    return kv->attn == DS_ATTN_ABSORB ? (part ? kv->pe[li] : kv->kv[li]) : (part ? kv->v[li] : kv->k[li]);
}

ds_status ds_seq_fork(ds_engine *e, int dst, int src, int len)
{
    ds_status s;
    if ((s = check_seq(e, dst, "ds_seq_fork")) || (s = check_seq(e, src, "ds_seq_fork"))) return s;
    ds_gen *g = e->g;
    if (len < 0 || len > g->n_cached[src])
        return ds_errorf(DS_ERR_RANGE, "ds_seq_fork: length %d is outside [0, %d] (sequence %d)", len,
                         g->n_cached[src], src);
    if (dst != src && len > 0) {
        const ds_kvcache *kv = g->kv;
        size_t w[2];
        kv_row_sizes(e, &w[0], &w[1]);
        for (int li = 0; li < kv->n_layers; li++)
            for (int part = 0; part < 2; part++) {
                float *base = kv_part(kv, li, part);
                size_t slot = (size_t)kv->ctx * w[part];
                e->ops->copy_rows(base + (size_t)dst * slot, (int)w[part], NULL, base + (size_t)src * slot, (int)w[part],
                                  NULL, len, (int)w[part]);
            }
        if ((s = backend_status(e->ops))) return ds_error_prefix(s, "ds_seq_fork");
        memcpy(g->cached[dst], g->cached[src], sizeof(int32_t) * (size_t)len);
    }
    g->n_cached[dst] = len;
    g->next_ok[dst] = false;
    return DS_OK;
}

/* xorshift64*: uniform floats in [-1, 1) */
static float rnd(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return (float)((*x * 2685821657736338717ull) >> 40) / 8388608.0f - 1.0f;
}

ds_status ds_seq_fill_random(ds_engine *e, int seq, int len, uint64_t seed)
{
    ds_status s = check_seq(e, seq, "ds_seq_fill_random");
    if (s) return s;
    ds_gen *g = e->g;
    if (len < 0 || len > g->ctx)
        return ds_errorf(DS_ERR_RANGE, "ds_seq_fill_random: length %d is outside [0, %d]", len, g->ctx);
    size_t w[2];
    kv_row_sizes(e, &w[0], &w[1]);
    size_t most = (size_t)len * (w[0] > w[1] ? w[0] : w[1]);
    float *h = most ? malloc(sizeof(float) * most) : NULL; /* the cache may be device memory: uploaded */
    if (most && !h) return ds_errorf(DS_ERR_NOMEM, "out of memory for %d positions of KV rows", len);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    const ds_kvcache *kv = g->kv;
    for (int li = 0; li < kv->n_layers && most; li++)
        for (int part = 0; part < 2; part++) {
            size_t cnt = (size_t)len * w[part];
            for (size_t i = 0; i < cnt; i++) h[i] = rnd(&x);
            e->ops->upload(kv_part(kv, li, part) + (size_t)seq * kv->ctx * w[part], h, sizeof(float) * cnt);
        }
    free(h);
    for (int i = 0; i < len; i++) g->cached[seq][i] = -1;
    g->n_cached[seq] = len;
    g->next_ok[seq] = false;
    return DS_OK;
}

/* ---- batches */

/* Each token's sequence and position (appended in order) into sq and pos;
 * checks the sequences, the ids and the room left in each slot. */
ds_status api_place_batch(const ds_engine *e, const ds_batch *b, int *sq, int *pos)
{
    const ds_gen *g = e->g;
    if (!b || b->n_tokens < 1 || !b->token) return ds_errorf(DS_ERR_ARG, "a batch needs at least one token");
    int *len = malloc(sizeof(int) * (size_t)g->n_seq);
    if (!len) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    memcpy(len, g->n_cached, sizeof(int) * (size_t)g->n_seq);
    ds_status s = DS_OK;
    for (int i = 0; !s && i < b->n_tokens; i++) {
        int q = b->seq ? b->seq[i] : 0;
        if (q < 0 || q >= g->n_seq)
            s = ds_errorf(DS_ERR_RANGE, "batch token %d: sequence %d is outside [0, %d)", i, q, g->n_seq);
        else if (b->token[i] < 0 || b->token[i] >= e->cfg.vocab_size)
            s = ds_errorf(DS_ERR_RANGE, "token id %d is outside the vocabulary [0, %d)", b->token[i], e->cfg.vocab_size);
        else if (len[q] >= g->ctx)
            s = ds_errorf(DS_ERR_RANGE, "batch token %d: sequence %d is full (%d positions)", i, q, g->ctx);
        else {
            sq[i] = q;
            pos[i] = len[q]++;
        }
    }
    free(len);
    return s;
}

/* The batch's tokens become part of their slots. */
void api_commit_batch(ds_engine *e, const ds_batch *b, const int *sq, const int *pos)
{
    ds_gen *g = e->g;
    for (int i = 0; i < b->n_tokens; i++) {
        g->cached[sq[i]][pos[i]] = b->token[i];
        g->n_cached[sq[i]] = pos[i] + 1;
        g->next_ok[sq[i]] = false;
    }
}

/* Room for n tokens' hidden states and records (MTP). */
static ds_status mtp_room(ds_engine *e, int n)
{
    if (n <= e->cap_last) return DS_OK;
    e->ops->free(e->hidden);
    e->hidden = e->ops->alloc(sizeof(float) * (size_t)n * e->cfg.dim);
    int *a = realloc(e->last_seq, sizeof(int) * (size_t)n), *b = a ? realloc(e->last_pos, sizeof(int) * (size_t)n) : NULL;
    if (a) e->last_seq = a;
    if (b) e->last_pos = b;
    int32_t *t = b ? realloc(e->last_tok, sizeof(int32_t) * (size_t)n) : NULL;
    if (t) e->last_tok = t;
    if (!e->hidden || !t) {
        e->cap_last = 0;
        return ds_errorf(DS_ERR_NOMEM, "out of memory for the hidden states of %d tokens (MTP)", n);
    }
    e->cap_last = n;
    return DS_OK;
}

/* ds_decode, or with next set api_decode_argmax. */
static ds_status decode_run(ds_engine *e, const ds_batch *b, int32_t *next)
{
    int n = b ? b->n_tokens : 0;
    e->n_logits = 0;
    int *sq = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1)), *pos = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    bool *want = malloc((size_t)(n > 0 ? n : 1));
    ds_status s = sq && pos && want ? api_place_batch(e, b, sq, pos) : ds_errorf(DS_ERR_NOMEM, "out of memory");
    int rows = 0;
    for (int i = 0; !s && i < n; i++) rows += want[i] = next || (b->logits ? b->logits[i] : i == n - 1);
    if (!s && !next && rows > e->cap_logits) {
        float *l = realloc(e->logits, sizeof(float) * (size_t)rows * e->cfg.vocab_size);
        if (!l) s = ds_errorf(DS_ERR_NOMEM, "out of memory for %d rows of logits", rows);
        else {
            e->logits = l;
            e->cap_logits = rows;
        }
    }
    e->n_last = 0;
    if (!s && e->m->mtp) s = mtp_room(e, n);
    float *hidden = e->m->mtp ? e->hidden : NULL;
    if (!s && next) s = model_forward_pick_hidden(e->m, e->g->kv, n, b->token, sq, pos, NULL, next, hidden);
    else if (!s) s = model_forward_hidden(e->m, e->g->kv, n, b->token, sq, pos, want, e->logits, hidden);
    if (!s) {
        api_commit_batch(e, b, sq, pos);
        e->n_logits = next ? 0 : rows;
        if (e->m->mtp) {
            memcpy(e->last_seq, sq, sizeof(int) * (size_t)n);
            memcpy(e->last_pos, pos, sizeof(int) * (size_t)n);
            memcpy(e->last_tok, b->token, sizeof(int32_t) * (size_t)n);
            e->n_last = n;
        }
    }
    free(sq);
    free(pos);
    free(want);
    return s;
}

ds_status ds_decode(ds_engine *e, const ds_batch *b) { return decode_run(e, b, NULL); }

ds_status api_decode_argmax(ds_engine *e, const ds_batch *b, int32_t *next) { return decode_run(e, b, next); }

const float *ds_logits(const ds_engine *e, int i)
{
    return i >= 0 && i < e->n_logits ? e->logits + (size_t)i * e->cfg.vocab_size : NULL;
}

int ds_n_logits(const ds_engine *e) { return e->n_logits; }

int32_t ds_argmax(const float *x, int n) { return n >= 1 ? sampler_argmax(x, n) : -1; }

/* ---- multi-token prediction */

bool ds_engine_has_mtp(const ds_engine *e) { return e->m->mtp != NULL; }

/* Room for n MTP rows: their logits, output states, sequences and positions. */
static ds_status mtp_rows_room(ds_engine *e, int n)
{
    if (n > e->cap_mtp) {
        float *l = realloc(e->mtp_logits, sizeof(float) * (size_t)n * e->cfg.vocab_size);
        if (!l) return ds_errorf(DS_ERR_NOMEM, "out of memory for %d rows of MTP logits", n);
        e->mtp_logits = l;
        e->cap_mtp = n;
    }
    if (n <= e->cap_state) return DS_OK;
    /* only ds_decode_mtp grows it (a chained pass has at most the last pass's
     * rows), so the old states need not be kept */
    e->ops->free(e->mtp_state);
    e->mtp_state = NULL;
    e->cap_state = 0;
    float *st = e->ops->alloc(sizeof(float) * (size_t)n * e->cfg.dim);
    int *a = realloc(e->mtp_seq, sizeof(int) * (size_t)n), *b = a ? realloc(e->mtp_pos, sizeof(int) * (size_t)n) : NULL;
    if (a) e->mtp_seq = a;
    if (b) e->mtp_pos = b;
    if (!st || !b) {
        e->ops->free(st);
        return ds_errorf(DS_ERR_NOMEM, "out of memory for the states of %d MTP rows", n);
    }
    e->mtp_state = st;
    e->cap_state = n;
    return DS_OK;
}

/* One MTP pass of n rows (hidden: their hidden states by row hrow[i]); keeps
 * every row's logits, output state, sequence and position. */
static ds_status mtp_pass(ds_engine *e, int n, const int32_t *tok, const int *sq, const int *pos, const float *hidden,
                          const int *hrow)
{
    ds_status s = model_mtp_rows(e->m, e->g->kv, n, tok, sq, pos, hidden, hrow, NULL, e->mtp_logits, e->mtp_state, NULL);
    if (s) return s;
    memcpy(e->mtp_seq, sq, sizeof(int) * (size_t)n);
    memcpy(e->mtp_pos, pos, sizeof(int) * (size_t)n);
    e->n_mtp = n;
    return DS_OK;
}

ds_status ds_decode_mtp(ds_engine *e, const ds_mtp_batch *b)
{
    e->n_mtp = 0;
    if (!e->m->mtp) return ds_errorf(DS_ERR_ARG, "ds_decode_mtp: the engine was loaded without the MTP module (mtp)");
    if (!b || b->n_rows < 1 || !b->index || !b->next_token)
        return ds_errorf(DS_ERR_ARG, "ds_decode_mtp: a batch needs at least one row, its indices and next tokens");
    int n = b->n_rows;
    const ds_gen *g = e->g;
    for (int i = 0; i < n; i++) {
        int k = b->index[i];
        if (k < 0 || k >= e->n_last)
            return ds_errorf(DS_ERR_RANGE, "ds_decode_mtp: row %d: index %d is outside the last ds_decode batch's %d "
                             "tokens", i, k, e->n_last);
        int q = e->last_seq[k], p = e->last_pos[k];
        if (p >= g->n_cached[q] || g->cached[q][p] != e->last_tok[k])
            return ds_errorf(DS_ERR_ARG, "ds_decode_mtp: row %d: sequence %d no longer holds the batch's token at "
                             "position %d", i, q, p);
        if (b->next_token[i] < 0 || b->next_token[i] >= e->cfg.vocab_size)
            return ds_errorf(DS_ERR_RANGE, "ds_decode_mtp: row %d: token id %d is outside the vocabulary [0, %d)", i,
                             b->next_token[i], e->cfg.vocab_size);
        for (int j = 0; j < i; j++)
            if (b->index[j] == k) return ds_errorf(DS_ERR_ARG, "ds_decode_mtp: index %d is given twice", k);
    }
    int *sq = malloc(sizeof(int) * (size_t)n), *pos = malloc(sizeof(int) * (size_t)n);
    ds_status s = sq && pos ? mtp_rows_room(e, n) : ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (int i = 0; !s && i < n; i++) {
        sq[i] = e->last_seq[b->index[i]];
        pos[i] = e->last_pos[b->index[i]];
    }
    if (!s) s = mtp_pass(e, n, b->next_token, sq, pos, e->hidden, b->index);
    free(sq);
    free(pos);
    return s;
}

ds_status ds_decode_mtp_chain(ds_engine *e, int n, const int *from, const int32_t *next_token)
{
    int last = e->n_mtp;
    e->n_mtp = 0;
    if (!e->m->mtp)
        return ds_errorf(DS_ERR_ARG, "ds_decode_mtp_chain: the engine was loaded without the MTP module (mtp)");
    if (n < 1 || !from || !next_token)
        return ds_errorf(DS_ERR_ARG, "ds_decode_mtp_chain: a pass needs at least one row, its sources and next tokens");
    for (int i = 0; i < n; i++) {
        int k = from[i];
        if (k < 0 || k >= last)
            return ds_errorf(DS_ERR_RANGE, "ds_decode_mtp_chain: row %d: source %d is outside the last MTP pass's %d rows",
                             i, k, last);
        if (e->mtp_pos[k] + 1 >= e->g->ctx)
            return ds_errorf(DS_ERR_RANGE, "ds_decode_mtp_chain: row %d: position %d is past the context (%d)", i,
                             e->mtp_pos[k] + 1, e->g->ctx);
        if (next_token[i] < 0 || next_token[i] >= e->cfg.vocab_size)
            return ds_errorf(DS_ERR_RANGE, "ds_decode_mtp_chain: row %d: token id %d is outside the vocabulary [0, %d)", i,
                             next_token[i], e->cfg.vocab_size);
        for (int j = 0; j < i; j++)
            if (from[j] == k) return ds_errorf(DS_ERR_ARG, "ds_decode_mtp_chain: source %d is given twice", k);
    }
    int *sq = malloc(sizeof(int) * (size_t)n), *pos = malloc(sizeof(int) * (size_t)n);
    ds_status s = sq && pos ? mtp_rows_room(e, n) : ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (int i = 0; !s && i < n; i++) {
        sq[i] = e->mtp_seq[from[i]];
        pos[i] = e->mtp_pos[from[i]] + 1;
    }
    /* the pass reads every source state before it writes the new ones */
    if (!s) s = mtp_pass(e, n, next_token, sq, pos, e->mtp_state, from);
    free(sq);
    free(pos);
    return s;
}

const float *ds_mtp_logits(const ds_engine *e, int i)
{
    return i >= 0 && i < e->n_mtp ? e->mtp_logits + (size_t)i * e->cfg.vocab_size : NULL;
}

int ds_n_mtp_logits(const ds_engine *e) { return e->n_mtp; }
