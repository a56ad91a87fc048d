/* forward.c - the transformer's forward pass, read beside the reference's
 * model.py: Transformer.forward -> Block.forward -> MLA.forward, then
 * MLP.forward or MoE.forward -> Gate.forward, one function each, in the
 * reference's names.
 *
 * Shapes: n tokens in flight (a batch may mix sequences), H = n_local_heads,
 * qk = qk_nope_head_dim + qk_rope_head_dim. All arithmetic goes through the
 * backend handle m->be, whose every op is present (backend/fallback.c supplies
 * what a backend leaves out), so each step has one path; activations live in
 * backend memory and no host code reads them.
 *
 * The residual stream is h + d, d being the last sublayer's output not yet
 * added: the op that next reads the sum adds it (rmsnorm_rows, or MLA's normed
 * products and wo's carry), so that a backend can fuse the residual add with
 * the norm after it. */
#include <math.h>
#include <stdlib.h>

#include "model/forward.h"

#define EPS 1e-6f /* RMSNorm's eps in every norm, as the reference's */

typedef struct {
    float *h, *d; /* (n, dim) each */
    bool due;     /* d is still to be added to h */
} stream;

/* k scratch buffers, *p[i] of sz[i] floats (NULL where sz[i] is 0): all or none (DS_ERR_NOMEM). */
static ds_status take(ds_model *m, const char *what, int n, int k, float **p[], const size_t sz[])
{
    for (int i = 0; i < k; i++) *p[i] = NULL;
    for (int i = 0; i < k; i++)
        if (sz[i] && !(*p[i] = m->be.alloc_scratch(&m->be, sizeof(float) * sz[i]))) {
            for (int j = 0; j < i; j++) m->be.free(&m->be, *p[j]);
            return ds_errorf(DS_ERR_NOMEM, "out of memory for the %s of %d tokens", what, n);
        }
    return DS_OK;
}

static void give(ds_model *m, int k, float *p[])
{
    for (int i = 0; i < k; i++) m->be.free(&m->be, p[i]);
}

/* dist.all_reduce: the sum over ranks of a RowParallelLinear's partial products */
static ds_status all_reduce(ds_model *m, float *buf, size_t n)
{
    return m->world_size == 1 ? DS_OK : m->opt.comm->all_reduce(m->opt.comm, buf, n);
}

static void linear(ds_model *m, float *y, const float *x, int n, const ds_weight *w)
{
    m->be.matmul(&m->be, y, x, n, w, 0, w->rows, m->opt.gemm, m->cfg.scale_ue8m0);
}

/* Absorb form: the caches hold kv_norm(kv) (kv_lora_rank) and the rotated k_pe
 * (qk_rope_head_dim) per position; wkv_b is folded into the query and the output,
 * so attention runs in the latent space. q (n, H, qk), kv (n, kv_lora_rank +
 * qk_rope_head_dim) -> o (n, H, v_head_dim). */
static ds_status attend_absorb(ds_model *m, ds_kvcache *kv, int li, const fwd_batch *b, const float *q,
                               const float *kvx, float *o)
{
    const ds_config *c = &m->cfg;
    const ds_layer *l = &m->layers[li];
    int n = b->n, H = m->n_local_heads, qk = m->qk_head_dim, nope = c->qk_nope_head_dim;
    int rope = c->qk_rope_head_dim, R = c->kv_lora_rank;
    float *q_pe;
    ds_status s = take(m, "attention", n, 1, (float **[]){&q_pe}, (size_t[]){(size_t)n * H * rope});
    if (s) return s;
    /* kv_cache[row] = kv_norm(kv); pe_cache[row] = rope(k_pe); q_pe = rope(q[..., nope:])  (n, H, rope) */
    ds_mla_pro pro = {
        .kv = kv->kv[li], .pe = kv->pe[li], .row = b->row, .kvx = kvx, .norm_w = l->kv_norm, .eps = EPS, .qp = q_pe,
        .q = q, .n = n, .H = H, .qk = qk, .nope = nope, .R = R, .rope = rope, .pos = b->pos, .cos_tab = m->cos_tab,
        .sin_tab = m->sin_tab,
    };
    /* then scores = ((q_nope wkv_b[h, :nope]) . kv_cache + q_pe . pe_cache) * softmax_scale, causal per sequence
     * o = (softmax(scores) kv_cache) wkv_b[h, nope:]^T                               (n, H, v_head_dim) */
    ds_attn_args a = {
        .n_tokens = n, .seq = b->seq, .pos = b->pos, .n_heads = H, .nope = nope, .rope = rope,
        .vdim = c->v_head_dim, .kv_rank = R, .softmax_scale = m->softmax_scale, .q_pe = q_pe,
        .kv_cache = kv->kv[li], .pe_cache = kv->pe[li], .ctx = kv->ctx, .out = o, .contiguous = b->contiguous,
        .seq0 = b->seq0, .pos0 = b->pos0, .pos_bound = b->pos_bound,
    };
    m->be.mla_prologue_attend(&m->be, &pro, &a, &l->wkv_b);
    give(m, 1, &q_pe);
    return DS_OK;
}

/* Naive form: the caches hold whole keys [k_nope | k_pe] (n_seq, ctx, H, qk) and
 * values (n_seq, ctx, H, v_head_dim). q and kv are rotated in place. */
static ds_status attend_naive(ds_model *m, ds_kvcache *kv, int li, const fwd_batch *b, float *q, float *kvx, float *o)
{
    const ds_config *c = &m->cfg;
    const ds_layer *l = &m->layers[li];
    ds_backend *be = &m->be;
    int n = b->n, H = m->n_local_heads, qk = m->qk_head_dim, nope = c->qk_nope_head_dim;
    int rope = c->qk_rope_head_dim, R = c->kv_lora_rank, kva = R + rope, vd = c->v_head_dim;
    float *lat, *kvb;
    ds_status s = take(m, "attention", n, 2, (float **[]){&lat, &kvb},
                       (size_t[]){(size_t)n * R, (size_t)n * H * (nope + vd)});
    if (s) return s;
    be->rope(be, q, n, H, qk, nope, rope, b->pos, m->cos_tab, m->sin_tab);  /* q_pe = rope(q_pe)  */
    be->rope(be, kvx, n, 1, kva, R, rope, b->pos, m->cos_tab, m->sin_tab);  /* k_pe = rope(k_pe) */
    be->copy_rows(be, lat, R, NULL, kvx, kva, NULL, n, R);
    be->rmsnorm(be, lat, lat, l->kv_norm, n, R, EPS);                       /* kv_norm(kv)  (n, R) */
    linear(m, kvb, lat, n, &l->wkv_b);                                      /* (n, H, nope + vd) */
    /* k_cache[row][h] = [k_nope | k_pe], v_cache[row][h] = v */
    for (int h = 0; h < H; h++) {
        const float *src = kvb + (size_t)h * (nope + vd);
        be->copy_rows(be, kv->k[li] + (size_t)h * qk, H * qk, b->row, src, H * (nope + vd), NULL, n, nope);
        be->copy_rows(be, kv->k[li] + (size_t)h * qk + nope, H * qk, b->row, kvx + R, kva, NULL, n, rope);
        be->copy_rows(be, kv->v[li] + (size_t)h * vd, H * vd, b->row, src + nope, H * (nope + vd), NULL, n, vd);
    }
    /* o = softmax(q . k_cache * softmax_scale, causal) v_cache  (n, H, v_head_dim) */
    ds_attn_args a = {
        .n_tokens = n, .seq = b->seq, .pos = b->pos, .n_heads = H, .nope = nope, .rope = rope, .vdim = vd,
        .kv_rank = R, .softmax_scale = m->softmax_scale, .q = q, .k_cache = kv->k[li], .v_cache = kv->v[li],
        .ctx = kv->ctx, .out = o, .contiguous = b->contiguous, .seq0 = b->seq0, .pos0 = b->pos0,
        .pos_bound = b->pos_bound,
    };
    be->attention(be, &a, DS_ATTN_NAIVE);
    give(m, 2, (float *[]){lat, kvb});
    return DS_OK;
}

/* MLA.forward on x = attn_norm(h + d): d = wo(attention(x)), and h += d's old value. */
static ds_status mla(ds_model *m, ds_kvcache *kv, int li, const fwd_batch *b, stream *st)
{
    const ds_config *c = &m->cfg;
    const ds_layer *l = &m->layers[li];
    ds_backend *be = &m->be;
    int n = b->n, H = m->n_local_heads, qk = m->qk_head_dim, kva = c->kv_lora_rank + c->qk_rope_head_dim;
    float *q, *qa, *kvx, *o;
    ds_status s = take(m, "attention activations", n, 4, (float **[]){&q, &qa, &kvx, &o},
                       (size_t[]){(size_t)n * H * qk, (size_t)n * c->q_lora_rank, (size_t)n * kva,
                                  (size_t)n * H * c->v_head_dim});
    if (s) return s;
    /* q = wq(x) (n, H, qk), or wq_a(x) (n, q_lora_rank) first; kv = wkv_a(x) (n, kv_lora_rank + qk_rope_head_dim):
     * one batch of products on x = attn_norm(h + d), which a backend may make as it reads h and d */
    const ds_weight *wq = c->q_lora_rank ? &l->wq_a : &l->wq;
    ds_matmul_job jobs[2] = {{c->q_lora_rank ? qa : q, NULL, n, wq, 0, wq->rows},
                             {kvx, NULL, n, &l->wkv_a, 0, l->wkv_a.rows}};
    bool carry = be->matmul_many_normed(be, jobs, 2, m->opt.gemm, c->scale_ue8m0, st->h, st->due ? st->d : NULL,
                                        l->attn_norm, EPS);
    if (c->q_lora_rank) {
        be->rmsnorm(be, qa, qa, l->q_norm, n, c->q_lora_rank, EPS); /* q_norm */
        linear(m, q, qa, n, &l->wq_b);                              /* q = wq_b(q_norm(wq_a(x)))  (n, H, qk) */
    }
    /* o = attention(q, kv)  (n, H, v_head_dim) */
    s = kv->attn == DS_ATTN_ABSORB ? attend_absorb(m, kv, li, b, q, kvx, o) : attend_naive(m, kv, li, b, q, kvx, o);
    if (!s) {
        /* wo, RowParallelLinear: d = wo(o) (n, dim), summed over ranks; h += d first where still due */
        be->matmul_carry(be, st->d, o, n, &l->wo, m->opt.gemm, c->scale_ue8m0, carry ? st->h : NULL);
        st->due = true;
        s = all_reduce(m, st->d, (size_t)n * c->dim);
    }
    give(m, 4, (float *[]){q, qa, kvx, o});
    return s;
}

/* MLP.forward: y = w2(silu(w1(x)) * w3(x)), x (n, dim) -> y (n, dim); w2 is
 * RowParallel, summed over ranks. */
static ds_status mlp(ds_model *m, const ds_layer *l, const float *x, int n, float *y)
{
    ds_backend *be = &m->be;
    int inter = l->w1.rows;
    float *a, *g;
    ds_status s = take(m, "MLP activations", n, 2, (float **[]){&a, &g},
                       (size_t[]){(size_t)n * inter, (size_t)n * inter});
    if (s) return s;
    ds_matmul_job jobs[2] = {{a, x, n, &l->w1, 0, inter}, {g, x, n, &l->w3, 0, inter}};
    be->matmul_many(be, jobs, 2, m->opt.gemm, m->cfg.scale_ue8m0); /* a = w1(x), g = w3(x)  (n, inter) */
    be->silu_mul(be, a, g, (size_t)n * inter);                     /* a = silu(a) * g, silu(a) = a σ(a) */
    linear(m, y, a, n, &l->w2);                                    /* y = w2(a)  (n, dim) */
    give(m, 2, (float *[]){a, g});
    return all_reduce(m, y, (size_t)n * m->cfg.dim);
}

/* Gate.forward: scores = x gate^T (n, n_routed_experts), softmax or sigmoid; the
 * bias (V3) steers which experts are chosen, not their weights; top n_limited_groups
 * of n_expert_groups, then top-k -> idx (n, K) expert ids, wt (n, K) weights * route_scale. */
static void gate(ds_model *m, const ds_layer *l, const float *x, int n, int *idx, float *wt, float *scores)
{
    const ds_config *c = &m->cfg;
    m->be.moe_gate(&m->be, idx, wt, scores, x, &l->gate, l->gate_bias, n, c->n_activated_experts,
                   c->n_expert_groups, c->n_limited_groups, c->score_func == DS_SCORE_SIGMOID, (float)c->route_scale);
}

/* MoE.forward: y = sum_k wt[k] experts[idx[k]](x) + shared_experts(x), x (n, dim) -> y (n, dim).
 * A rank runs its own experts and its slice of the shared ones: one all-reduce sums both. */
static ds_status moe(ds_model *m, const ds_layer *l, const float *x, int n, float *y)
{
    const ds_config *c = &m->cfg;
    int K = c->n_activated_experts;
    float *scores, *wt, *idx;
    ds_status s = take(m, "MoE activations", n, 3, (float **[]){&scores, &wt, &idx},
                       (size_t[]){(size_t)n * c->n_routed_experts, (size_t)n * K, (size_t)n * K});
    if (s) return s;
    _Static_assert(sizeof(int) == sizeof(float), "idx: (n, K) ints in a buffer of as many floats");
    gate(m, l, x, n, (int *)idx, wt, scores);
    ds_mlp_w shared = {&l->sw1, &l->sw2, &l->sw3};
    m->be.moe_experts(&m->be, y, x, n, K, (int *)idx, wt, l->ew1, l->ew2, l->ew3, m->expert0, m->n_local_experts,
                      l->sw1.data ? &shared : NULL, m->opt.gemm, c->scale_ue8m0);
    give(m, 3, (float *[]){scores, wt, idx});
    return all_reduce(m, y, (size_t)n * c->dim);
}

/* Block.forward:  x = x + attn(attn_norm(x));  x = x + ffn(ffn_norm(x)),
 * on the stream h + d; x (n, dim) is the ffn's input. */
static ds_status block(ds_model *m, ds_kvcache *kv, int li, const fwd_batch *b, stream *st, float *x)
{
    const ds_layer *l = &m->layers[li];
    int n = b->n, dim = m->cfg.dim;
    ds_status s = mla(m, kv, li, b, st);                                                  /* d = attn(...) */
    if (s) return s;
    m->be.rmsnorm_rows(&m->be, x, dim, NULL, st->h, dim, st->d, l->ffn_norm, n, dim, EPS); /* h += d; x = ffn_norm(h) */
    return l->moe ? moe(m, l, x, n, st->d) : mlp(m, l, x, n, st->d);                      /* d = ffn(x) */
}

/* check_numerics: the first non-finite value of the stream h + d after layer li. */
static ds_status check_layer(ds_model *m, const stream *st, int n, int li)
{
    size_t nd = (size_t)n * m->cfg.dim;
    float *h = malloc(sizeof(float) * nd), *d = malloc(sizeof(float) * nd);
    ds_status s = h && d ? DS_OK : ds_errorf(DS_ERR_NOMEM, "out of memory checking layer %d's output", li);
    if (!s) {
        m->be.download(&m->be, h, st->h, sizeof(float) * nd);
        m->be.download(&m->be, d, st->d, sizeof(float) * nd);
    }
    for (size_t i = 0; !s && i < nd; i++)
        if (!isfinite(h[i] + (st->due ? d[i] : 0.0f)))
            s = ds_errorf(DS_ERR_RANGE, "layer %d's output is not finite (token %zu of the pass, column %zu)", li,
                          i / (size_t)m->cfg.dim, i % (size_t)m->cfg.dim);
    free(h);
    free(d);
    return s;
}

/* Transformer.forward: h = embed(tokens); h = layer(h) for every layer;
 * logits = head(norm(h)) of the wanted rows. */
ds_status transformer_forward(ds_model *m, ds_kvcache *kv, const fwd_batch *b, float *logits)
{
    ds_backend *be = &m->be;
    int n = b->n, dim = m->cfg.dim;
    float *h, *d, *x;
    ds_status s = take(m, "residual stream", n, 3, (float **[]){&h, &d, &x},
                       (size_t[]){(size_t)n * dim, (size_t)n * dim, (size_t)n * dim});
    if (s) return s;
    /* h = embed(tokens): ParallelEmbedding, this rank's vocabulary rows (others zero) summed over ranks */
    be->embed(be, h, &m->embed, b->tok, n, m->vocab0);
    s = all_reduce(m, h, (size_t)n * dim);
    stream st = {h, d, false};
    for (int li = 0; !s && li < m->cfg.n_layers; li++) {
        s = block(m, kv, li, b, &st, x);
        if (!s && m->opt.check_numerics) s = check_layer(m, &st, n, li);
    }
    if (!s && b->hidden) { /* hidden = norm(h), every row (the MTP module's input) */
        be->rmsnorm_rows(be, b->hidden, dim, NULL, h, dim, st.due ? d : NULL, m->norm, n, dim, EPS);
        st.due = false;
    }
    if (!s && b->n_out) {
        /* logits = head(norm(h)) of the wanted rows  (n_out, vocab_local); the head's product is exact */
        if (b->n_out == n) {
            be->rmsnorm_rows(be, x, dim, NULL, h, dim, st.due ? d : NULL, m->norm, n, dim, EPS);
        } else {
            if (st.due) be->add(be, h, d, (size_t)n * dim);
            be->copy_rows(be, x, dim, NULL, h, dim, b->out, b->n_out, dim);
            be->rmsnorm(be, x, x, m->norm, b->n_out, dim, EPS);
        }
        be->matmul(be, logits, x, b->n_out, &m->head, 0, m->vocab_local, DS_GEMM_BF16, false);
    }
    give(m, 3, (float *[]){h, d, x});
    return s;
}

/* The MTP module (DeepSeek-V3 report, section 2.2), at each row i:
 * h' = eh_proj([enorm(embed(t[i+1])); hnorm(h[i])]); h' = block(h') with its own
 * KV-cache layer (layers[n_layers]) at the main model's positions;
 * logits = shared_head.head(shared_head.norm(h')) of the wanted rows. */
ds_status mtp_forward(ds_model *m, ds_kvcache *kv, const fwd_batch *b, const float *hidden, float *logits, float *hout)
{
    ds_backend *be = &m->be;
    const ds_mtp *t = m->mtp;
    int n = b->n, dim = m->cfg.dim;
    float *h, *d, *x, *cat;
    ds_status s = take(m, "MTP activations", n, 4, (float **[]){&h, &d, &x, &cat},
                       (size_t[]){(size_t)n * dim, (size_t)n * dim, (size_t)n * dim, (size_t)n * 2 * dim});
    if (s) return s;
    /* cat = [enorm(embed(t[i+1])); hnorm(h[i])]  (n, 2 dim) */
    be->embed(be, x, &t->embed, b->tok, n, m->vocab0);
    be->rmsnorm(be, h, x, t->enorm, n, dim, EPS);
    be->copy_rows(be, cat, 2 * dim, NULL, h, dim, NULL, n, dim);
    be->rmsnorm(be, h, hidden, t->hnorm, n, dim, EPS);
    be->copy_rows(be, cat + dim, 2 * dim, NULL, h, dim, NULL, n, dim);
    linear(m, h, cat, n, &t->eh_proj); /* h = eh_proj(cat)  (n, dim) */
    stream st = {h, d, false};
    s = block(m, kv, m->cfg.n_layers, b, &st, x);
    if (!s) {
        /* x = shared_head.norm(h'), every row: the hidden state a chained draft
         * feeds back (hout); logits = head(x) of the wanted rows  (n_out, vocab_local) */
        be->rmsnorm_rows(be, x, dim, NULL, h, dim, st.due ? d : NULL, t->norm, n, dim, EPS);
        if (hout) be->copy_rows(be, hout, dim, NULL, x, dim, NULL, n, dim);
        if (b->n_out && b->n_out < n) be->copy_rows(be, h, dim, NULL, x, dim, b->out, b->n_out, dim);
        if (b->n_out)
            be->matmul(be, logits, b->n_out < n ? h : x, b->n_out, &t->head, 0, m->vocab_local, DS_GEMM_BF16, false);
    }
    give(m, 4, (float *[]){h, d, x, cat});
    return s;
}
