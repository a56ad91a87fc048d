/* spec.c - speculative decoding with the MTP module (ds_generate's spec_draft
 * N): the module drafts N tokens, chained on its own output as SGLang and
 * TensorRT-LLM chain it, one batched pass of the main model checks them, and
 * each sequence keeps the accepted prefix and one token of the main model's.
 *
 * Per sequence, at the top of a step: the slot holds positions 0..c-1, t (the
 * token for position c) is chosen but not in the slot, the last main pass holds
 * the hidden state of position c-1 at batch index hl, and the MTP rows of
 * 0..c-2 are written but for the pending ones (accepted drafts whose main
 * hidden state the last pass computed). A step:
 *   MTP pass 1: the pending rows and (c-1, t) -> d1 for c+1; pass j (2..N): the
 *   row (c+j-2, d[j-1]) from pass j-1's output state -> dj for c+j; those rows
 *   are rewritten from the main model's states once their drafts are accepted;
 *   main pass: [t, d1..dN] at c..c+N, every row's logits;
 *   accept: greedy, while dj is the main model's pick after d[j-1]; sampling,
 *   dj with probability min(1, p(dj) / q(dj)), p the main model's and q the
 *   draft's distribution after the same penalties, temperature, top-k and top-p,
 *   and on a rejection a token from norm(max(0, p - q)), which leaves the output
 *   distributed as plain sampling's (Leviathan et al. 2023, Chen et al. 2023);
 *   after a drafts accepted, the slot is cut back to c+a+1 (ds_seq_truncate: the
 *   main and MTP rows past it are never read) and the main model's pick at
 *   c+a+1 is the next t.
 * Greedy, every token is the argmax of the main model's logits after the same
 * prefix as in plain decoding, so the output is the same up to the rounding of
 * a k-token pass against a 1-token one. Sequences step together: one MTP pass
 * per draft depth and one main pass for all. */
#include "api/api.h"
#include "base/clock.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    ds_sampler *sm;
    bool sample;          /* temperature > 0: the acceptance rule; else greedy picks */
    bool live, drafts;    /* still generating; its MTP rows are complete (it may draft) */
    bool fresh;           /* before its first step (no hidden state to draft from yet) */
    int32_t t;            /* the token for position c = the slot's length */
    int hl;               /* batch index of position c-1 in the last main pass */
    int n_pend;           /* MTP rows to write before drafting: batch index, next token */
    int pend_idx[DS_SPEC_MAX_DRAFT + 1];
    int32_t pend_tok[DS_SPEC_MAX_DRAFT + 1];
    int nd, off, hrow;    /* this step: drafts, first index in the main pass, row in the MTP state */
    int32_t d[DS_SPEC_MAX_DRAFT];
    float *q;             /* (N, vocab) the drafts' distributions (sampling) */
} spec_seq;

typedef struct {
    ds_engine *e;
    int n, N, V;
    const int *rows;
    const gen_opts *o;
    bool argmax;          /* every sequence greedy without penalties: the passes hand back argmaxes alone */
    spec_seq *sq;
    int32_t **out;
    int *n_out;
    gen_finish *why;
    int32_t *hist;        /* a sequence's tokens so far, for the penalties (ctx + N + 1) */
    float *p, *lg;        /* (vocab) scratch; (n, vocab) MTP logits */
    float *hstate;        /* (n (N + 1), dim) the MTP rows' output states, ops->alloc memory */
    int *mi, *ms, *mp;    /* (n (N + 1)) MTP rows: hidden row, sequence, position */
    int32_t *mt;
    bool *mw;
    int32_t *vt;          /* (n (N + 1)) the main pass's tokens, sequences, wanted rows */
    int *vs;
    bool *vw;
    int32_t *vnext, *mnext; /* (n (N + 1)) argmax: the main pass's picks; the MTP pass's */
} spec_run;

/* The prompt but its last token into slot r from position 0, in passes of the
 * engine's prefill length, with the MTP rows of all those positions (their next
 * tokens are the prompt's). */
static ds_status spec_prefill(ds_engine *e, int r, const int32_t *p, int n)
{
    ds_status s = ds_seq_truncate(e, r, 0);
    int chunk = e->g->prefill_chunk > 0 ? e->g->prefill_chunk : 512;
    int *seq = malloc(sizeof(int) * (size_t)chunk), *idx = malloc(sizeof(int) * (size_t)chunk);
    if (!seq || !idx) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (int i = 0; !s && i < chunk; i++) seq[i] = r;
    for (int off = 0; !s && off < n - 1; off += chunk) {
        int k = n - 1 - off < chunk ? n - 1 - off : chunk;
        ds_batch b = {k, p + off, seq, NULL};
        if ((s = ds_decode(e, &b))) break;
        for (int i = 0; i < k; i++) idx[i] = i;
        ds_mtp_batch mb = {k, idx, p + off + 1};
        s = ds_decode_mtp(e, &mb);
    }
    free(seq);
    free(idx);
    return s;
}

/* The sequence's tokens 0..c-1 of the slot, then t and the first j drafts: the
 * history of the pick for position c + j + 1 (R->hist; returns its length). */
static int history(spec_run *R, int k, int c, int j)
{
    memcpy(R->hist, R->e->g->cached[R->rows[k]], sizeof(int32_t) * (size_t)c);
    R->hist[c] = R->sq[k].t;
    memcpy(R->hist + c + 1, R->sq[k].d, sizeof(int32_t) * (size_t)j);
    return c + 1 + j;
}

/* The inverse CDF of probs at u, ids ascending (the last token of non-zero
 * probability if rounding leaves u past the end). */
static int32_t draw(const float *probs, int V, double u)
{
    double c = 0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (probs[i] <= 0) continue;
        c += probs[i];
        last = i;
        if (u < c) return i;
    }
    return last;
}

/* Draft j (1-based) of sequence k from its MTP logits row (argmax: its w-th
 * pick of the pass). */
static void draft(spec_run *R, int k, int j, float *row, int w)
{
    spec_seq *q = &R->sq[k];
    if (R->argmax) {
        q->d[j - 1] = R->mnext[w];
        return;
    }
    int nh = history(R, k, R->e->g->n_cached[R->rows[k]], j - 1);
    if (!q->sample) {
        q->d[j - 1] = sampler_pick(q->sm, row, R->hist, nh);
        return;
    }
    float *qj = q->q + (size_t)(j - 1) * R->V;
    sampler_probs(q->sm, row, R->hist, nh, qj);
    q->d[j - 1] = draw(qj, R->V, rng_uniform(&q->sm->rng));
}

/* The MTP passes of a step: every live sequence's nd drafts. */
static ds_status spec_draft(spec_run *R)
{
    ds_engine *e = R->e;
    const gen_opts *o = R->o;
    ds_status s = DS_OK;
    for (int j = 1; !s && j <= R->N; j++) {
        int m = 0;
        for (int k = 0; k < R->n; k++) {
            spec_seq *q = &R->sq[k];
            if (!q->live || q->nd < j) continue;
            if (j == 1) { /* the pending rows, then (c - 1, t), from the main pass's states */
                for (int i = 0; i <= q->n_pend; i++, m++) {
                    int b = i < q->n_pend ? q->pend_idx[i] : q->hl;
                    R->mi[m] = b;
                    R->ms[m] = e->last_seq[b];
                    R->mp[m] = e->last_pos[b];
                    R->mt[m] = i < q->n_pend ? q->pend_tok[i] : q->t;
                    R->mw[m] = i == q->n_pend;
                }
                q->n_pend = 0;
            } else { /* (c + j - 2, d[j - 1]) from the last MTP pass's state */
                R->mi[m] = q->hrow;
                R->ms[m] = R->rows[k];
                R->mp[m] = e->g->n_cached[R->rows[k]] + j - 2;
                R->mt[m] = q->d[j - 2];
                R->mw[m++] = true;
            }
            q->hrow = m - 1;
        }
        if (!m) break;
        if (o->cancel && o->cancel(o->cancel_ud)) return DS_OK; /* the caller sees it too */
        s = model_mtp_rows(e->m, e->g->kv, m, R->mt, R->ms, R->mp, j == 1 ? e->hidden : R->hstate, R->mi, R->mw,
                           R->lg, R->hstate, R->argmax ? R->mnext : NULL);
        for (int k = 0, w = 0; !s && k < R->n; k++)
            if (R->sq[k].live && R->sq[k].nd >= j) {
                draft(R, k, j, R->lg + (size_t)w * R->V, w);
                w++;
            }
    }
    return s;
}

/* Emits tok at position pos of sequence k; false when the sequence ends there
 * (its slot then holds the positions before pos). */
static bool emit(spec_run *R, int k, int32_t tok, int pos)
{
    const gen_opts *o = R->o;
    ds_gen *g = R->e->g;
    gen_finish w = GEN_CANCELLED;
    if (tok == o->eos_id) {
        w = GEN_EOS;
    } else {
        R->out[k][R->n_out[k]++] = tok;
        g->decode_tokens++;
        w = o->on_token && o->on_token(o->ud, k, tok) ? GEN_STOPPED
            : R->n_out[k] >= o->max_new              ? GEN_LENGTH
            : pos >= g->ctx                          ? GEN_CONTEXT
                                                     : GEN_CANCELLED;
    }
    if (w == GEN_CANCELLED) return true;
    R->why[k] = w;
    R->sq[k].live = false;
    ds_seq_truncate(R->e, R->rows[k], pos);
    return false;
}

/* Sequence k after the main pass (its rows from q->off): the drafts accepted,
 * the main model's next token, the slot cut back. */
static void spec_accept(spec_run *R, int k)
{
    ds_engine *e = R->e;
    spec_seq *q = &R->sq[k];
    int V = R->V, r = R->rows[k], c = e->g->n_cached[r] - q->nd - 1, a = 0;
    int32_t next = -1;
    for (; a < q->nd; a++) {
        if (R->argmax) {
            if (R->vnext[q->off + a] == q->d[a]) continue;
            next = R->vnext[q->off + a];
            break;
        }
        float *row = e->logits + (size_t)(q->off + a) * V;
        int nh = history(R, k, c, a);
        if (!q->sample) {
            int32_t g = sampler_pick(q->sm, row, R->hist, nh);
            if (g == q->d[a]) continue;
            next = g;
            break;
        }
        const float *qa = q->q + (size_t)a * V;
        int32_t x = q->d[a];
        sampler_probs(q->sm, row, R->hist, nh, R->p);
        if (rng_uniform(&q->sm->rng) * qa[x] < R->p[x]) continue;
        double sum = 0; /* rejected: the next token from norm(max(0, p - q)) */
        for (int i = 0; i < V; i++) sum += R->p[i] = R->p[i] > qa[i] ? R->p[i] - qa[i] : 0.0f;
        if (sum > 0)
            for (int i = 0; i < V; i++) R->p[i] = (float)(R->p[i] / sum);
        next = draw(R->p, V, rng_uniform(&q->sm->rng));
        break;
    }
    if (next < 0 && R->argmax) /* every draft accepted: the main model's pick after the last */
        next = R->vnext[q->off + a];
    else if (next < 0)
        next = sampler_pick(q->sm, e->logits + (size_t)(q->off + a) * V, R->hist, history(R, k, c, a));
    if (q->nd) {
        e->spec_steps++;
        e->spec_drafted += q->nd;
        e->spec_accepted += a;
        e->spec_accept_len[a]++;
    }
    for (int j = 0; j < a; j++)
        if (!emit(R, k, q->d[j], c + 1 + j)) return;
    if (!emit(R, k, next, c + a + 1)) return;
    ds_seq_truncate(e, r, c + a + 1);
    for (int j = 0; j < a; j++) { /* the accepted drafts' MTP rows, from the main pass's states */
        q->pend_idx[j] = q->off + j;
        q->pend_tok[j] = q->d[j];
    }
    q->n_pend = a;
    q->hl = q->off + a;
    q->t = next;
}

/* One step of every live sequence: drafts, the main pass, acceptance. */
static ds_status spec_step(spec_run *R)
{
    ds_engine *e = R->e;
    const gen_opts *o = R->o;
    ds_gen *g = e->g;
    for (int k = 0; k < R->n; k++) {
        spec_seq *q = &R->sq[k];
        int c = g->n_cached[R->rows[k]], nd = R->N;
        nd = nd < g->ctx - 1 - c ? nd : g->ctx - 1 - c;
        nd = nd < o->max_new - R->n_out[k] - 1 ? nd : o->max_new - R->n_out[k] - 1;
        if (!q->drafts || nd < 1) nd = 0;
        if (!nd) q->drafts = false; /* the end of the context or of the tokens: for good */
        q->nd = q->live ? nd : 0;
    }
    double t0 = ds_now();
    ds_status s = spec_draft(R);
    double t1 = ds_now();
    e->spec_draft_s += t1 - t0;
    if (s || (o->cancel && o->cancel(o->cancel_ud))) return s;
    int m = 0;
    for (int k = 0; k < R->n; k++) {
        spec_seq *q = &R->sq[k];
        if (!q->live) continue;
        q->off = m;
        for (int j = 0; j <= q->nd; j++, m++) {
            R->vt[m] = j ? q->d[j - 1] : q->t;
            R->vs[m] = R->rows[k];
            R->vw[m] = true;
        }
    }
    ds_batch b = {m, R->vt, R->vs, R->vw};
    s = R->argmax ? api_decode_argmax(e, &b, R->vnext) : ds_decode(e, &b);
    e->spec_check_s += ds_now() - t1;
    if (s) return s;
    for (int k = 0; k < R->n; k++) {
        spec_seq *q = &R->sq[k];
        if (q->live) spec_accept(R, k);
        if (q->fresh) q->drafts = R->N > 0;
        q->fresh = false;
    }
    return DS_OK;
}

ds_status api_generate_spec(ds_engine *e, int n, const int *rows, const int32_t *const *prompts, const int *lens,
                            ds_sampler *const *sm, int n_draft, const gen_opts *o, int32_t **out, int *n_out,
                            gen_finish *why)
{
    ds_gen *g = e->g;
    int V = e->cfg.vocab_size, N = n_draft, M = n * (N + 1);
    spec_run R = {e, n, N, V, rows, o, true, calloc((size_t)n, sizeof(spec_seq)), out, n_out, why,
                  malloc(sizeof(int32_t) * (size_t)(g->ctx + N + 1)), malloc(sizeof(float) * (size_t)V),
                  malloc(sizeof(float) * (size_t)n * V), e->ops->alloc(sizeof(float) * (size_t)M * e->cfg.dim),
                  malloc(sizeof(int) * (size_t)M), malloc(sizeof(int) * (size_t)M), malloc(sizeof(int) * (size_t)M),
                  malloc(sizeof(int32_t) * (size_t)M), malloc((size_t)M), malloc(sizeof(int32_t) * (size_t)M),
                  malloc(sizeof(int) * (size_t)M), malloc((size_t)M), malloc(sizeof(int32_t) * (size_t)M),
                  malloc(sizeof(int32_t) * (size_t)M)};
    ds_status s = R.sq && R.hist && R.p && R.lg && R.hstate && R.mi && R.ms && R.mp && R.mt && R.mw && R.vt && R.vs &&
                          R.vw && R.vnext && R.mnext
                      ? DS_OK
                      : ds_errorf(DS_ERR_NOMEM, "out of memory for speculative decoding of %d sequences", n);
    for (int k = 0; !s && k < n; k++) {
        spec_seq *q = &R.sq[k];
        *q = (spec_seq){.sm = sm[k], .sample = sm[k]->p.temperature > 0, .live = true, .fresh = true,
                       .t = prompts[k][lens[k] - 1]};
        n_out[k] = 0;
        why[k] = GEN_CANCELLED;
        /* a greedy pick without penalties is the argmax, which the backend may pick on the device */
        R.argmax &= !q->sample && sm[k]->p.repetition_penalty == 1.0f && sm[k]->presence == 0 && sm[k]->frequency == 0;
        if (!(out[k] = malloc(sizeof(int32_t) * (size_t)(o->max_new > 0 ? o->max_new : 1))) ||
            (q->sample && !(q->q = malloc(sizeof(float) * (size_t)(N ? N : 1) * V))))
            s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    }
    double t0 = ds_now();
    for (int k = 0; !s && k < n; k++) {
        if (o->cancel && o->cancel(o->cancel_ud)) goto done;
        s = spec_prefill(e, rows[k], prompts[k], lens[k]);
        g->prefill_tokens += lens[k];
    }
    g->prefill_s += ds_now() - t0;
    t0 = ds_now();
    /* the first step feeds each prompt's last token and drafts nothing: it makes
     * the hidden states the first drafts start from */
    bool any = o->max_new > 0;
    while (!s && any) {
        if (o->cancel && o->cancel(o->cancel_ud)) break;
        s = spec_step(&R);
        any = false;
        for (int k = 0; k < n; k++) any |= R.sq[k].live;
    }
    g->decode_s += ds_now() - t0;
done:
    for (int k = 0; R.sq && k < n; k++) free(R.sq[k].q);
    free(R.sq);
    free(R.hist);
    free(R.p);
    free(R.lg);
    e->ops->free(R.hstate);
    free(R.mi);
    free(R.ms);
    free(R.mp);
    free(R.mt);
    free(R.mw);
    free(R.vt);
    free(R.vs);
    free(R.vw);
    free(R.vnext);
    free(R.mnext);
    return s;
}

static double weight_bytes(const ds_weight *w)
{
    if (!w->data) return 0;
    double n = (double)w->rows * w->cols, esz = w->fmt == DS_W_FP8 ? 1 : w->fmt == DS_W_BF16 ? 2 : 4;
    double s = w->fmt == DS_W_FP8 ? (double)((w->rows + 127) / 128) * ((w->cols + 127) / 128) * 4 : 0;
    return n * esz + s;
}

double ds_engine_mtp_bytes(const ds_engine *e, double experts)
{
    const ds_model *m = e->m;
    if (!m->mtp) return 0;
    const ds_layer *l = &m->layers[m->cfg.n_layers];
    double b = weight_bytes(&l->wq) + weight_bytes(&l->wq_a) + weight_bytes(&l->wq_b) + weight_bytes(&l->wkv_a) +
               weight_bytes(&l->wkv_b) + weight_bytes(&l->wo);
    if (l->moe)
        b += weight_bytes(&l->gate) + weight_bytes(&l->sw1) + weight_bytes(&l->sw2) + weight_bytes(&l->sw3) +
             experts * (weight_bytes(&l->ew1[0]) + weight_bytes(&l->ew2[0]) + weight_bytes(&l->ew3[0]));
    else
        b += weight_bytes(&l->w1) + weight_bytes(&l->w2) + weight_bytes(&l->w3);
    return b + weight_bytes(&m->mtp->eh_proj) + weight_bytes(&m->mtp->head);
}
