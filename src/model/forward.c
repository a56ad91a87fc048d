/* forward.c - the transformer's forward pass, read beside the reference's
 * model.py: Transformer.forward -> Block -> MLA / MLP / MoE.
 *
 * Shapes: n tokens in flight; h (n, dim) is the residual stream. All
 * arithmetic goes through m->ops; only routing decisions (top-k) and the
 * gathering of tokens per expert run here, on the host. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/numeric.h"
#include "model/model.h"
#include "model/sampler.h"

#define EPS 1e-6f

/* A forward pass's tokens; the arrays live in ops->alloc memory (device
 * memory on a GPU), uploaded once per pass. row[i] = seq[i] * ctx + pos[i] is
 * the token's KV-cache row. */
typedef struct {
    int n;
    const int *seq, *pos, *row;
    bool contiguous; /* token i is sequence seq0 at position pos0 + i */
    int seq0, pos0;
    int pos_bound; /* every pos[i] is below it (ds_attn_args.pos_bound) */
} batch;

/* A pass's scratch: every element is written before it is read. */
static void *scratch_bytes(const ds_model *m, size_t bytes)
{
    return m->ops->alloc_scratch ? m->ops->alloc_scratch(bytes) : m->ops->alloc(bytes);
}

static float *scratch(const ds_model *m, size_t nfloats)
{
    return scratch_bytes(m, nfloats * sizeof(float));
}

static ds_status all_reduce(ds_model *m, float *buf, size_t n)
{
    if (m->world_size == 1) return DS_OK;
    return m->opt.comm->all_reduce(m->opt.comm, buf, n);
}

/* ParallelEmbedding: rows of this rank's vocabulary slice; others are zero
 * and filled in by the all-reduce. tok is in ops->alloc memory. */
static ds_status embed(ds_model *m, float *h, int n, const int32_t *tok)
{
    m->ops->embed(h, &m->embed, tok, n, m->vocab0);
    return all_reduce(m, h, (size_t)n * m->cfg.dim);
}

static void linear(const ds_model *m, float *y, const float *x, int n, const ds_weight *w)
{
    m->ops->matmul(y, x, n, w, 0, w->rows, m->opt.gemm, m->cfg.scale_ue8m0);
}

/* Copies column block [off, off+len) of each row of a (n, stride) matrix. */
static void gather_cols(const ds_ops *ops, float *dst, const float *src, int n, int stride, int off, int len)
{
    ops->copy_rows(dst, len, NULL, src + off, stride, NULL, n, len);
}

static void scatter_cols(const ds_ops *ops, float *dst, const float *src, int n, int stride, int off, int len)
{
    ops->copy_rows(dst + off, stride, NULL, src, len, NULL, n, len);
}

/* q_pe (n, H, rope) from q: the (token, head) pairs as n*H rows of qk floats,
 * rotated on the way (rot) or already rotated in q. */
static void absorb_qp(const ds_model *m, int n, const float *q, float *qp, const batch *rot)
{
    const ds_ops *ops = m->ops;
    int H = m->n_local_heads, nope = m->cfg.qk_nope_head_dim, rope = m->cfg.qk_rope_head_dim, qk = m->qk_head_dim;
    if (rot) ops->rope_copy(qp, rope, NULL, q + nope, qk, n, H, rope, rot->pos, m->cos_tab, m->sin_tab);
    else ops->copy_rows(qp, rope, NULL, q + nope, qk, NULL, n * H, rope);
}

/* Absorb attention's products with wkv_b, per head h (wkv_b rows h*(nope+vd) ..):
 * q_c[t, h] = q_nope[t, h] @ wkv_b[h, :nope]  (n, H, R); q_pe[t, h] = q[t, h, nope:]. */
static void absorb_q(const ds_model *m, const ds_layer *l, int n, const float *q, float *qc, float *qp, float *t1,
                     float *t2, const batch *rot, bool qp_done)
{
    const ds_ops *ops = m->ops;
    int H = m->n_local_heads, nope = m->cfg.qk_nope_head_dim;
    int qk = m->qk_head_dim, vd = m->cfg.v_head_dim, R = m->cfg.kv_lora_rank;
    if (!qp_done) absorb_qp(m, n, q, qp, rot); /* qp_done: mla_prologue wrote it */
    if (ops->matmul_heads_t) {
        ops->matmul_heads_t(qc, R, q, qk, n, H, &l->wkv_b, 0, nope + vd, nope);
        return;
    }
    for (int h = 0; h < H; h++) {
        gather_cols(ops, t1, q, n, H * qk, h * qk, nope);
        ops->matmul_t(t2, t1, n, &l->wkv_b, h * (nope + vd), nope);
        scatter_cols(ops, qc, t2, n, H * R, h * R, R);
    }
}

/* out_v[t, h] = o_c[t, h] @ wkv_b[h, nope:]^T  (n, H, vd) */
static void absorb_out(const ds_model *m, const ds_layer *l, int n, const float *o, float *ov, float *t1, float *t2)
{
    const ds_ops *ops = m->ops;
    int H = m->n_local_heads, nope = m->cfg.qk_nope_head_dim, vd = m->cfg.v_head_dim, R = m->cfg.kv_lora_rank;
    if (ops->matmul_heads) {
        ops->matmul_heads(ov, vd, o, R, n, H, &l->wkv_b, nope, nope + vd, vd);
        return;
    }
    for (int h = 0; h < H; h++) {
        gather_cols(ops, t1, o, n, H * R, h * R, R);
        ops->matmul(t2, t1, n, &l->wkv_b, h * (nope + vd) + nope, vd, DS_GEMM_BF16, false);
        scatter_cols(ops, ov, t2, n, H * vd, h * vd, vd);
    }
}

/* Absorb attention of a long prefill pass in the expanded (MHA) form, where
 * the backend's attention takes per-head limits (ds_ops.attn_head_last). Per
 * head: [k_nope | v] of every position of the pass's sequence so far
 * (0 .. pos0 + n - 1) from the latent cache with wkv_b, then the absorb kernel
 * with the pass's tokens as its heads: scores of q_nope against the rows'
 * k_nope columns plus the shared rotated k_pe, token i limited to position
 * pos0 + i, and the output from the rows' v columns. Per token, position and
 * head that is nope + rope + vd products (320 at V3's shapes) where the absorb
 * form takes 2 kv_rank + rope (1088), plus kv_rank x (nope + vd) a position
 * and head to expand once a pass. qp: the rotated q_pe, (n, H, rope).
 *   The expansion costs about what the products save on a pass of ~256 tokens
 * (8-layer 16B shapes, Zen 4, pp at depth 4096, expanded / absorb: 64 tokens
 * 44 / 58 tok/s, 128 55 / 69, 256 75-76 / 74-79, 512 102 / 82), hence the
 * default of ds_tuning.expand_min. wkv_b is dequantised exactly, as in the
 * absorb form (no act_quant of the latent under --gemm-impl fp8). */
#define EXPAND_MIN 384    /* tokens in a pass from which it pays (above) */
#define EXPAND_TOKENS 64  /* tokens a kernel call takes as its heads */
#define EXPAND_BYTES ((size_t)64 << 20) /* the expanded rows of a group of heads */

static int expand_min(const ds_model *m)
{
    return m->opt.tune.expand_min > 0 ? m->opt.tune.expand_min : EXPAND_MIN;
}

static ds_status mla_expanded(ds_model *m, ds_kvcache *kv, int li, const batch *b, const float *q, const float *qp,
                              float *ov)
{
    const ds_config *c = &m->cfg;
    const ds_layer *l = &m->layers[li];
    const ds_ops *ops = m->ops;
    int n = b->n, H = m->n_local_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim, vd = c->v_head_dim;
    int qk = m->qk_head_dim, R = c->kv_lora_rank, W = nope + vd, P = b->pos0 + n;
    size_t per_head = sizeof(float) * (size_t)P * W;
    int G = EXPAND_BYTES / per_head < 1 ? 1 : (int)(EXPAND_BYTES / per_head);
    if (G > H) G = H;
    if (G > 16) G = 16;
    float *e = scratch(m, (size_t)G * P * W), *qv = scratch(m, (size_t)n * W), *qpv = scratch(m, (size_t)n * rope);
    float *o = scratch(m, (size_t)EXPAND_TOKENS * vd);
    int *last = malloc(sizeof(int) * (size_t)n);
    ds_status s = DS_OK;
    if (!e || !qv || !qpv || !o || !last) {
        s = ds_errorf(DS_ERR_NOMEM, "out of memory for the expanded attention of %d tokens at %d positions", n, P);
        goto done;
    }
    const float *lat = kv->kv[li] + (size_t)b->seq0 * kv->ctx * R;
    const float *pe = kv->pe[li] + (size_t)b->seq0 * kv->ctx * rope;
    for (int i = 0; i < n; i++) last[i] = b->pos0 + i;
    for (int h0 = 0; h0 < H; h0 += G) {
        int g = H - h0 < G ? H - h0 : G;
        ds_matmul_job jobs[16];
        for (int k = 0; k < g; k++) jobs[k] = (ds_matmul_job){e + (size_t)k * P * W, lat, P, &l->wkv_b, (h0 + k) * W, W};
        if (ops->matmul_many) ops->matmul_many(jobs, g, DS_GEMM_BF16, false);
        else
            for (int k = 0; k < g; k++) ops->matmul(jobs[k].y, lat, P, &l->wkv_b, jobs[k].row0, W, DS_GEMM_BF16, false);
        for (int k = 0; k < g; k++) {
            int h = h0 + k;
            for (int i = 0; i < n; i++) { /* q rows as long as the cache rows; the kernel reads their nope */
                memcpy(qv + (size_t)i * W, q + ((size_t)i * H + h) * qk, sizeof(float) * (size_t)nope);
                memset(qv + (size_t)i * W + nope, 0, sizeof(float) * (size_t)vd);
                memcpy(qpv + (size_t)i * rope, qp + ((size_t)i * H + h) * rope, sizeof(float) * (size_t)rope);
            }
            for (int t0 = 0; t0 < n; t0 += EXPAND_TOKENS) {
                int T = n - t0 < EXPAND_TOKENS ? n - t0 : EXPAND_TOKENS, zero = 0, pmax = b->pos0 + t0 + T - 1;
                ds_attn_args a = {
                    .n_tokens = 1, .seq = &zero, .pos = &pmax, .n_heads = T, .nope = nope, .rope = rope, .vdim = vd,
                    .kv_rank = W, .softmax_scale = m->softmax_scale, .q_c = qv + (size_t)t0 * W,
                    .q_pe = qpv + (size_t)t0 * rope, .kv_cache = e + (size_t)k * P * W, .pe_cache = pe, .ctx = P,
                    .out = o, .head_last = last + t0, .key_dims = nope, .val_off = nope,
                };
                ops->attention(&a, DS_ATTN_ABSORB);
                for (int i = 0; i < T; i++)
                    memcpy(ov + ((size_t)(t0 + i) * H + h) * vd, o + (size_t)i * vd, sizeof(float) * (size_t)vd);
            }
        }
    }
done:
    ops->free(e);
    ops->free(qv);
    ops->free(qpv);
    ops->free(o);
    free(last);
    return s;
}

/* MLA.forward: x (n, dim) -> out (n, dim). pend (may be NULL): x is not made yet; it is
 * attn_norm(pend + out), pend the residual stream and out the previous block's output,
 * and pend += out is due as well. The products fold both in where the backend can
 * (matmul_many_normed, then matmul_carry for wo); else rmsnorm_rows makes x first. */
static ds_status mla(ds_model *m, ds_kvcache *kv, int li, const batch *b, float *x, float *out, float *pend)
{
    const ds_config *c = &m->cfg;
    const ds_layer *l = &m->layers[li];
    const ds_ops *ops = m->ops;
    int n = b->n, H = m->n_local_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int qk = m->qk_head_dim, vd = c->v_head_dim, R = c->kv_lora_rank, kva = R + rope;
    ds_status s = DS_OK;

    /* q = wq(x) or wq_b(q_norm(wq_a(x))): (n, H, qk) */
    float *q = scratch(m, (size_t)n * H * qk), *qa = NULL;
    float *kvx = scratch(m, (size_t)n * kva), *lat = scratch(m, (size_t)n * R);
    float *o = scratch(m, (size_t)n * H * (R > vd ? R : vd)), *ov = scratch(m, (size_t)n * H * vd);
    float *t1 = scratch(m, (size_t)n * (R > qk ? R : qk)), *t2 = scratch(m, (size_t)n * (R > qk ? R : qk));
    if (c->q_lora_rank) qa = scratch(m, (size_t)n * c->q_lora_rank);
    if (!q || !kvx || !lat || !o || !ov || !t1 || !t2 || (c->q_lora_rank && !qa)) {
        s = ds_errorf(DS_ERR_NOMEM, "out of memory for attention activations of %d tokens", n);
        goto done;
    }
    /* wq (or wq_a) and wkv_a read the same x: one matmul_many for both when the backend has it */
    float *qx = c->q_lora_rank ? qa : q;
    const ds_weight *wqx = c->q_lora_rank ? &l->wq_a : &l->wq;
    bool folded = false; /* pend's norm went into the products: wo does its residual add */
    if (ops->matmul_many) {
        ds_matmul_job jobs[2] = {{qx, x, n, wqx, 0, wqx->rows}, {kvx, x, n, &l->wkv_a, 0, l->wkv_a.rows}};
        if (pend)
            folded = ops->matmul_many_normed &&
                     ops->matmul_many_normed(jobs, 2, m->opt.gemm, c->scale_ue8m0, pend, out, l->attn_norm, EPS);
        if (pend && !folded) ops->rmsnorm_rows(x, c->dim, NULL, pend, c->dim, out, l->attn_norm, n, c->dim, EPS);
        if (!folded) ops->matmul_many(jobs, 2, m->opt.gemm, c->scale_ue8m0);
    } else {
        if (pend) ops->rmsnorm_rows(x, c->dim, NULL, pend, c->dim, out, l->attn_norm, n, c->dim, EPS);
        linear(m, qx, x, n, wqx);
    }
    if (c->q_lora_rank) {
        ops->rmsnorm(qa, qa, l->q_norm, n, c->q_lora_rank, EPS);
        linear(m, q, qa, n, &l->wq_b);
    }
    /* absorb with the fused ops: the rotary parts are rotated as they are copied into
     * q_pe and the pe cache, and kv_norm writes the latent straight into its cache rows */
    bool fused = kv->attn == DS_ATTN_ABSORB && ops->rope_copy && ops->rmsnorm_rows;
    if (!fused) ops->rope(q, n, H, qk, nope, rope, b->pos, m->cos_tab, m->sin_tab);

    /* kv = wkv_a(x): latent (n, R) and k_pe (n, rope), rotary on k_pe */
    if (!ops->matmul_many) linear(m, kvx, x, n, &l->wkv_a);
    if (!fused) {
        ops->rope(kvx, n, 1, kva, R, rope, b->pos, m->cos_tab, m->sin_tab);
        gather_cols(ops, lat, kvx, n, kva, 0, R);
        ops->rmsnorm(lat, lat, l->kv_norm, n, R, EPS);
    }

    ds_attn_args a = {
        .n_tokens = n, .seq = b->seq, .pos = b->pos, .n_heads = H, .nope = nope, .rope = rope,
        .vdim = vd, .kv_rank = R, .softmax_scale = m->softmax_scale, .ctx = kv->ctx, .out = o,
        .contiguous = b->contiguous, .seq0 = b->seq0, .pos0 = b->pos0, .pos_bound = b->pos_bound,
    };
    if (kv->attn == DS_ATTN_ABSORB) {
        float *kc = kv->kv[li], *pc = kv->pe[li];
        float *qc = scratch(m, (size_t)n * H * R), *qp = scratch(m, (size_t)n * H * rope);
        if (!qc || !qp) {
            ops->free(qc);
            ops->free(qp);
            s = ds_errorf(DS_ERR_NOMEM, "out of memory for attention activations of %d tokens", n);
            goto done;
        }
        bool pro = fused && ops->mla_prologue; /* the three steps below in one op */
        if (pro) {
            ops->mla_prologue(kc, pc, b->row, kvx, l->kv_norm, EPS, qp, q, n, H, qk, nope, R, rope, b->pos,
                              m->cos_tab, m->sin_tab);
        } else if (fused) {
            ops->rmsnorm_rows(kc, R, b->row, kvx, kva, NULL, l->kv_norm, n, R, EPS);
            ops->rope_copy(pc, rope, b->row, kvx + R, kva, n, 1, rope, b->pos, m->cos_tab, m->sin_tab);
        } else {
            ops->copy_rows(kc, R, b->row, lat, R, NULL, n, R);
            ops->copy_rows(pc, rope, b->row, kvx + R, kva, NULL, n, rope);
        }
        a.q_pe = qp;
        a.kv_cache = kc;
        a.pe_cache = pc;
        ds_attn_args whole = a; /* the backend's one-op form, when it takes the problem */
        whole.out = ov;
        bool expand = ops->attn_head_last && b->contiguous && n >= expand_min(m);
        if (expand) {
            if (!pro) absorb_qp(m, n, q, qp, fused ? b : NULL);
            s = mla_expanded(m, kv, li, b, q, qp, ov);
        } else if (!pro || !ops->mla_attend || !ops->mla_attend(&whole, &l->wkv_b, q, qk)) {
            absorb_q(m, l, n, q, qc, qp, t1, t2, fused ? b : NULL, pro);
            a.q_c = qc;
            ops->attention(&a, DS_ATTN_ABSORB);
            absorb_out(m, l, n, o, ov, t1, t2);
        }
        ops->free(qc);
        ops->free(qp);
        if (s) goto done;
    } else {
        /* naive: k = [k_nope, k_pe], v from wkv_b(kv_norm(latent)); cache full K and V */
        float *kvb = scratch(m, (size_t)n * H * (nope + vd));
        if (!kvb) {
            s = ds_errorf(DS_ERR_NOMEM, "out of memory for attention activations of %d tokens", n);
            goto done;
        }
        linear(m, kvb, lat, n, &l->wkv_b);
        /* cache rows [row][h][qk] and [row][h][vd], head by head */
        float *kc = kv->k[li], *vc = kv->v[li];
        for (int h = 0; h < H; h++) {
            const float *src = kvb + (size_t)h * (nope + vd);
            ops->copy_rows(kc + (size_t)h * qk, H * qk, b->row, src, H * (nope + vd), NULL, n, nope);
            ops->copy_rows(kc + (size_t)h * qk + nope, H * qk, b->row, kvx + R, kva, NULL, n, rope);
            ops->copy_rows(vc + (size_t)h * vd, H * vd, b->row, src + nope, H * (nope + vd), NULL, n, vd);
        }
        ops->free(kvb);
        a.q = q;
        a.k_cache = kc;
        a.v_cache = vc;
        a.out = ov;
        ops->attention(&a, DS_ATTN_NAIVE);
    }
    /* wo: RowParallelLinear, summed over ranks */
    if (folded && !(ops->matmul_carry &&
                    ops->matmul_carry(out, ov, n, &l->wo, m->opt.gemm, c->scale_ue8m0, pend))) {
        ops->add(pend, out, (size_t)n * c->dim);
        folded = false;
    }
    if (!folded) linear(m, out, ov, n, &l->wo);
    s = all_reduce(m, out, (size_t)n * c->dim);
done:
    ops->free(q);
    ops->free(qa);
    ops->free(kvx);
    ops->free(lat);
    ops->free(o);
    ops->free(ov);
    ops->free(t1);
    ops->free(t2);
    return s;
}

/* MLP / Expert: w2(silu(w1(x)) * w3(x)), x (n, dim) -> y (n, dim). */
static ds_status mlp(ds_model *m, const ds_weight *w1, const ds_weight *w2, const ds_weight *w3, const float *x,
                     int n, float *y)
{
    int inter = w1->rows;
    float *a = scratch(m, (size_t)n * inter), *g = scratch(m, (size_t)n * inter);
    ds_status s = DS_OK;
    if (!a || !g) {
        s = ds_errorf(DS_ERR_NOMEM, "out of memory for MLP activations of %d tokens", n);
    } else {
        if (m->ops->matmul_many) { /* same input: one pass over both weights */
            ds_matmul_job jobs[2] = {{a, x, n, w1, 0, inter}, {g, x, n, w3, 0, inter}};
            m->ops->matmul_many(jobs, 2, m->opt.gemm, m->cfg.scale_ue8m0);
        } else {
            linear(m, a, x, n, w1);
            linear(m, g, x, n, w3);
        }
        m->ops->silu_mul(a, g, (size_t)n * inter);
        linear(m, y, a, n, w2);
    }
    m->ops->free(a);
    m->ops->free(g);
    return s;
}

/* MoE.forward: routed experts of this rank (tokens grouped per expert) plus
 * the shared experts; the routed part is summed over ranks. */
static ds_status moe_device(ds_model *m, int li, const float *x, int n, float *y);

static ds_status moe(ds_model *m, int li, const float *x, int n, float *y)
{
    if (m->ops->moe_experts) return moe_device(m, li, x, n, y);
    const ds_config *c = &m->cfg;
    const ds_layer *l = &m->layers[li];
    int E = c->n_routed_experts, K = c->n_activated_experts, dim = c->dim;
    ds_status s = DS_OK;
    float *sc = scratch(m, (size_t)n * E);
    int *idx = malloc(sizeof(int) * (size_t)n * K), *list = malloc(sizeof(int) * (size_t)n);
    float *wt = malloc(sizeof(float) * (size_t)n * K), *lw = malloc(sizeof(float) * (size_t)n);
    float *xs = scratch(m, (size_t)n * dim), *ys = scratch(m, (size_t)n * dim);
    if (!sc || !idx || !list || !wt || !lw || !xs || !ys) {
        s = ds_errorf(DS_ERR_NOMEM, "out of memory for MoE activations of %d tokens", n);
        goto done;
    }
    m->ops->matmul(sc, x, n, &l->gate, 0, E, DS_GEMM_BF16, false);
    /* Gate.forward: the bias steers the choice; weights come from the unbiased scores */
    m->ops->moe_route(idx, wt, sc, l->gate_bias, n, E, K, c->n_expert_groups, c->n_limited_groups,
                      c->score_func == DS_SCORE_SIGMOID, (float)c->route_scale);
    memset(y, 0, sizeof(float) * (size_t)n * dim);
    for (int e = 0; e < m->n_local_experts; e++) {
        int g = m->expert0 + e, cnt = 0;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (idx[(size_t)t * K + k] == g) {
                    list[cnt] = t;
                    lw[cnt++] = wt[(size_t)t * K + k];
                }
        if (!cnt) continue;
        for (int i = 0; i < cnt; i++) memcpy(xs + (size_t)i * dim, x + (size_t)list[i] * dim, sizeof(float) * (size_t)dim);
        if ((s = mlp(m, &l->ew1[e], &l->ew2[e], &l->ew3[e], xs, cnt, ys))) goto done;
        for (int i = 0; i < cnt; i++) {
            float *yt = y + (size_t)list[i] * dim;
            const float *yi = ys + (size_t)i * dim;
            for (int j = 0; j < dim; j++) yt[j] += yi[j] * lw[i];
        }
    }
    if ((s = all_reduce(m, y, (size_t)n * dim))) goto done;
    if (l->sw1.data) {
        if ((s = mlp(m, &l->sw1, &l->sw2, &l->sw3, x, n, ys))) goto done;
        if ((s = all_reduce(m, ys, (size_t)n * dim))) goto done;
        m->ops->add(y, ys, (size_t)n * dim);
    }
done:
    m->ops->free(sc);
    m->ops->free(xs);
    m->ops->free(ys);
    free(idx);
    free(list);
    free(wt);
    free(lw);
    return s;
}

/* MoE.forward with routing and the routed experts as backend ops, so that
 * no host code reads the activations (a GPU keeps them on the device). */
static ds_status moe_device(ds_model *m, int li, const float *x, int n, float *y)
{
    const ds_config *c = &m->cfg;
    const ds_layer *l = &m->layers[li];
    const ds_ops *ops = m->ops;
    int E = c->n_routed_experts, K = c->n_activated_experts, dim = c->dim;
    ds_status s = DS_OK;
    float *sc = scratch(m, (size_t)n * E), *wt = scratch(m, (size_t)n * K);
    int *idx = scratch_bytes(m, sizeof(int) * (size_t)n * K);
    /* the shared experts in the same op (a GPU runs them in the routed experts' launches);
     * their slice joins this rank's routed sum before the one all-reduce */
    ds_mlp_w shared = {&l->sw1, &l->sw2, &l->sw3};
    if (!sc || !wt || !idx) {
        s = ds_errorf(DS_ERR_NOMEM, "out of memory for MoE activations of %d tokens", n);
        goto done;
    }
    if (ops->moe_gate) {
        ops->moe_gate(idx, wt, sc, x, &l->gate, l->gate_bias, n, K, c->n_expert_groups, c->n_limited_groups,
                      c->score_func == DS_SCORE_SIGMOID, (float)c->route_scale);
    } else {
        ops->matmul(sc, x, n, &l->gate, 0, E, DS_GEMM_BF16, false);
        ops->moe_route(idx, wt, sc, l->gate_bias, n, E, K, c->n_expert_groups, c->n_limited_groups,
                       c->score_func == DS_SCORE_SIGMOID, (float)c->route_scale);
    }
    ops->moe_experts(y, x, n, K, idx, wt, l->ew1, l->ew2, l->ew3, m->expert0, m->n_local_experts,
                     l->sw1.data ? &shared : NULL, m->opt.gemm, c->scale_ue8m0);
    s = all_reduce(m, y, (size_t)n * dim);
done:
    ops->free(sc);
    ops->free(wt);
    ops->free(idx);
    return s;
}

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

/* Queues the pass of n tokens whose arrays ids_d [tok | seq | pos | cache row |
 * wanted rows] are in ops->alloc memory: embedding, the layers, the final norm
 * and the head of the n_out wanted rows into lg (n_out, vocab_local). Nothing
 * here waits for the device (world size 1), so a backend graph may record it.
 * contig (may be NULL): the tokens are one sequence's consecutive positions,
 * with the sequence and first position (a hint for attention). */
static ds_status forward_queue(ds_model *m, ds_kvcache *kv, int n, int n_out, const int32_t *ids_d, float *lg,
                               const int *contig, int pos_bound)
{
    const ds_config *c = &m->cfg;
    int dim = c->dim;
    ds_status s = DS_OK;
    float *h = scratch(m, (size_t)n * dim), *x = scratch(m, (size_t)n * dim), *y = scratch(m, (size_t)n * dim);
    if (!h || !x || !y) {
        s = ds_errorf(DS_ERR_NOMEM, "out of memory for %d tokens", n);
        goto done;
    }
    batch b = {n, ids_d + n, ids_d + 2 * n, ids_d + 3 * n, contig != NULL, contig ? contig[0] : 0,
               contig ? contig[1] : 0, pos_bound};
    if ((s = embed(m, h, n, ids_d))) goto done;
    /* rr (optional): each residual add fused with the norm that reads its sum */
    void (*rr)(float *, int, const int *, float *, int, const float *, const float *, int, int, float) =
        m->ops->rmsnorm_rows;
    bool normed = false; /* x already holds this layer's attn_norm(h) */
    /* the layer's residual add and attention norm left to mla (h += y; x = attn_norm(h)),
     * so that a backend can fold them into the products */
    bool fold = rr && m->ops->matmul_many && m->ops->matmul_many_normed && m->ops->matmul_carry, pend = false;
    for (int li = 0; li < c->n_layers; li++) {
        const ds_layer *l = &m->layers[li];
        if (!normed && !pend) m->ops->rmsnorm(x, h, l->attn_norm, n, dim, EPS);
        if ((s = mla(m, kv, li, &b, x, y, pend ? h : NULL))) goto done;
        pend = false;
        if (rr) {
            rr(x, dim, NULL, h, dim, y, l->ffn_norm, n, dim, EPS);
        } else {
            m->ops->add(h, y, (size_t)n * dim);
            m->ops->rmsnorm(x, h, l->ffn_norm, n, dim, EPS);
        }
        s = l->moe ? moe(m, li, x, n, y) : mlp(m, &l->w1, &l->w2, &l->w3, x, n, y);
        if (!s && !l->moe) s = all_reduce(m, y, (size_t)n * dim);
        if (s) goto done;
        normed = false;
        if (fold && li + 1 < c->n_layers) {
            pend = true;
        } else if (rr && li + 1 < c->n_layers) {
            rr(x, dim, NULL, h, dim, y, m->layers[li + 1].attn_norm, n, dim, EPS);
            normed = true;
        } else if (rr && n_out == n) { /* every row wanted, in order: the final norm too */
            rr(x, dim, NULL, h, dim, y, m->norm, n, dim, EPS);
            normed = true;
        } else {
            m->ops->add(h, y, (size_t)n * dim);
        }
    }
    if (n_out) {
        if (!normed) {
            m->ops->copy_rows(x, dim, NULL, h, dim, ids_d + 4 * n, n_out, dim);
            m->ops->rmsnorm(x, x, m->norm, n_out, dim, EPS);
        }
        m->ops->matmul(lg, x, n_out, &m->head, 0, m->vocab_local, DS_GEMM_BF16, false);
    }
done:
    m->ops->free(h);
    m->ops->free(x);
    m->ops->free(y);
    return s;
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

/* The n rows of logits in device (alloc'd) memory d to the caller: into logits,
 * or when next is set only the picks (pick: see ds_ops.pick_rows) into next, on
 * the device when the backend can (logits then unused; else the host's scratch).
 * World size 1: the rows are the whole vocabulary. */
static void deliver(const ds_model *m, float *d, int n, float *logits, const ds_pick *pick, int32_t *next)
{
    int V = m->vocab_local;
    if (next && m->ops->pick_rows) {
        m->ops->pick_rows(next, d, n, V, pick);
        return;
    }
    m->ops->download(logits, d, sizeof(float) * (size_t)n * V);
    for (int i = 0; next && i < n; i++) next[i] = pick_host(logits + (size_t)i * V, V, pick ? pick + i : NULL);
}

/* what a pass hands back: logits rows, or when next is set only the picks */
typedef struct {
    float *logits;
    const ds_pick *pick;
    int32_t *next;
} fwd_out;

/* A decode step of n <= DS_GRAPH_NMAX tokens, all wanted, on one rank, through
 * the backend's recorded graph for n: the first step of each n runs eagerly
 * (warm-up: weights, tables and buffers settle), the second is recorded, and
 * every later one uploads its token arrays to the recording's fixed buffer and
 * replays it. Returns false when the step must run eagerly instead (no graph
 * support, the recording failed, tune.no_graphs). */
static bool forward_graph(ds_model *m, ds_kvcache *kv, int n, const int32_t *ids, int pos_max, const fwd_out *o,
                          ds_status *s)
{
    const ds_ops *ops = m->ops;
    if (!ops->graph_begin || n > DS_GRAPH_NMAX || m->world_size != 1 || m->opt.tune.no_graphs) return false;
    /* class 0 (short contexts) only where a backend op can use the bound */
    int cls = ops->mla_attend && pos_max < DS_GRAPH_SHORT ? 0 : 1;
    ds_graph_slot *d = &kv->dec[cls][n];
    if (d->failed || (!d->graph && d->runs++ < 1)) return false;
    size_t nl = (size_t)n * m->vocab_local;
    if (!d->ids) d->ids = ops->alloc(sizeof(int32_t) * 5 * (size_t)n);
    if (!d->logits) d->logits = scratch(m, nl);
    if (!d->ids || !d->logits) return false;
    ops->upload(d->ids, ids, sizeof(int32_t) * 5 * (size_t)n);
    if (!d->graph) {
        ops->graph_begin();
        /* positions vary between replays, within the class's bound */
        *s = forward_queue(m, kv, n, n, d->ids, d->logits, NULL, cls ? 0 : DS_GRAPH_SHORT);
        d->graph = ops->graph_end();
        if (!d->graph) { /* nothing ran (an op had to wait): this n runs eagerly from now on */
            d->failed = true;
            *s = DS_OK;
            return false;
        }
        if (*s) return true;
    }
    ops->graph_run(d->graph);
    deliver(m, d->logits, n, o->logits, o->pick, o->next);
    return true;
}

/* model_forward, or with o->next set model_forward_pick (o->logits: the host rows,
 * as scratch where the picks are made on the host). */
static ds_status forward_run(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq, const int *pos,
                             const bool *want, const fwd_out *o)
{
    float *logits = o->logits;
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
    if (n_out == n && forward_graph(m, kv, n, ids, pos_max, o, &s)) goto done;
    size_t nl = (size_t)n_out * m->vocab_local;
    if (!(ids_d = m->ops->alloc(sizeof(int32_t) * 5 * (size_t)n)) || (n_out && !(lg = scratch(m, nl))) ||
        (n_out && m->world_size > 1 && !(part = malloc(sizeof(float) * nl)))) {
        s = ds_errorf(DS_ERR_NOMEM, "out of memory for %d tokens", n);
        goto done;
    }
    m->ops->upload(ids_d, ids, sizeof(int32_t) * 5 * (size_t)n);
    int contig[2] = {seq[0], pos[0]};
    bool one_run = true;
    for (int i = 1; i < n && one_run; i++) one_run = seq[i] == seq[0] && pos[i] == pos[0] + i;
    if ((s = forward_queue(m, kv, n, n_out, ids_d, lg, one_run ? contig : NULL, pos_max + 1))) goto done;
    if (n_out && m->world_size == 1) {
        deliver(m, lg, n_out, logits, o->pick, o->next);
    } else if (n_out) {
        m->ops->download(part, lg, sizeof(float) * nl);
        s = gather_logits(m, part, n_out, logits);
        for (int i = 0; !s && o->next && i < n_out; i++)
            o->next[i] = pick_host(logits + (size_t)i * m->cfg.vocab_size, m->cfg.vocab_size, o->pick ? o->pick + i : NULL);
    } else {
        m->ops->sync();
    }
done:
    if (m->ops->status) { /* an op that could not run recorded why */
        ds_status os = m->ops->status();
        if (!s) s = os;
    }
    m->ops->free(lg);
    m->ops->free(ids_d);
    free(part);
    free(ids);
    return s;
}

ds_status model_forward(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq, const int *pos,
                        const bool *want, float *logits)
{
    fwd_out o = {logits, NULL, NULL};
    return forward_run(m, kv, n, tok, seq, pos, want, &o);
}

ds_status model_forward_pick(ds_model *m, ds_kvcache *kv, int n, const int32_t *tok, const int *seq, const int *pos,
                             const ds_pick *pick, int32_t *next)
{
    if (n <= 0) return ds_errorf(DS_ERR_ARG, "forward pass needs at least one token");
    bool *want = malloc((size_t)n), host = !m->ops->pick_rows || m->world_size > 1;
    float *logits = NULL;
    if (want) memset(want, 1, (size_t)n);
    /* the rows reach the host only where the backend cannot pick */
    if (host) logits = malloc(sizeof(float) * (size_t)n * m->cfg.vocab_size);
    fwd_out o = {logits, pick, next};
    ds_status s = !want || (host && !logits) ? ds_errorf(DS_ERR_NOMEM, "out of memory for %d tokens' logits", n)
                                             : forward_run(m, kv, n, tok, seq, pos, want, &o);
    free(want);
    free(logits);
    return s;
}
