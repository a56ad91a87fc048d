/* generate.c - prefill with prefix reuse, batched decode, the generation loop. */
#include "generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"

/* Prompt tokens per forward pass. Larger passes give each routed expert more
 * tokens to reuse its weights across; the attention work of a prompt is the
 * same in any chunking. Prefill of one pass of the 16B shapes (dsv3 bench -p):
 * CPU (8 layers, Zen 4) 256 tokens 113-133 tok/s, 512 135-141, 1024 136-138.
 * A backend may ask for another length (ds_ops.prefill_tokens: CUDA one pass
 * of up to 8192); ds_tuning.prefill_chunk overrides both. */
#define PREFILL_CHUNK 1024

static int prefill_chunk(const ds_model *m)
{
    if (m->opt.tune.prefill_chunk > 0) return m->opt.tune.prefill_chunk;
    return m->ops->prefill_tokens > 0 ? m->ops->prefill_tokens : PREFILL_CHUNK;
}

ds_status gen_new(ds_gen **out, ds_model *m, int n_seq, int ctx)
{
    ds_gen *g = calloc(1, sizeof *g);
    if (!g) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    g->m = m;
    g->n_seq = n_seq;
    g->ctx = ctx;
    g->prefill_chunk = prefill_chunk(m);
    g->vocab = m->cfg.vocab_size;
    ds_status s = kvcache_new(&g->kv, m, n_seq, ctx);
    if (s) {
        free(g);
        return s;
    }
    g->cached = calloc((size_t)n_seq, sizeof *g->cached);
    g->n_cached = calloc((size_t)n_seq, sizeof *g->n_cached);
    g->logits = malloc(sizeof(float) * (size_t)n_seq * g->vocab);
    g->next = calloc((size_t)n_seq, sizeof *g->next);
    g->next_ok = calloc((size_t)n_seq, sizeof *g->next_ok);
    for (int i = 0; g->cached && i < n_seq; i++)
        if (!(g->cached[i] = malloc(sizeof(int32_t) * (size_t)ctx))) break;
    if (!g->cached || !g->n_cached || !g->logits || !g->next || !g->next_ok || !g->cached[n_seq - 1]) {
        gen_free(g);
        return ds_errorf(DS_ERR_NOMEM, "out of memory for %d sequences of %d tokens", n_seq, ctx);
    }
    *out = g;
    return DS_OK;
}

void gen_free(ds_gen *g)
{
    if (!g) return;
    for (int i = 0; g->cached && i < g->n_seq; i++) free(g->cached[i]);
    free(g->cached);
    free(g->n_cached);
    free(g->logits);
    free(g->next);
    free(g->next_ok);
    kvcache_free(g->kv);
    free(g);
}

ds_status gen_prefill(ds_gen *g, int seq, const int32_t *toks, int n)
{
    if (n < 1) return ds_errorf(DS_ERR_ARG, "empty prompt");
    if (n > g->ctx)
        return ds_errorf(DS_ERR_RANGE, "prompt of %d tokens exceeds the context of %d tokens%s", n, g->ctx,
                         g->ctx == g->m->cfg.max_seq_len ? " (max_seq_len)" : " (raise --ctx-size)");
    g->next_ok[seq] = false; /* the pick comes from the logits below */
    int keep = 0, have = g->n_cached[seq];
    while (keep < have && keep < n && g->cached[seq][keep] == toks[keep]) keep++;
    if (keep == n) keep = n - 1; /* recompute the last token to get its logits */
    g->n_cached[seq] = keep;
    int chunk = g->prefill_chunk < n ? g->prefill_chunk : n;
    int *sq = malloc(sizeof(int) * (size_t)chunk), *pos = malloc(sizeof(int) * (size_t)chunk);
    bool *want = calloc((size_t)chunk, 1);
    ds_status s = DS_OK;
    if (!sq || !pos || !want) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    double t0 = ds_now();
    for (int i = keep; !s && i < n;) {
        if (g->cancel && g->cancel(g->cancel_ud)) {
            g->cancelled = true;
            break;
        }
        int c = n - i < g->prefill_chunk ? n - i : g->prefill_chunk;
        for (int j = 0; j < c; j++) {
            sq[j] = seq;
            pos[j] = i + j;
            want[j] = i + j == n - 1;
        }
        s = model_forward(g->m, g->kv, c, toks + i, sq, pos, want, g->logits + (size_t)seq * g->vocab);
        if (s == DS_ERR_NOMEM && c > 1 && g->m->world_size == 1) {
            /* the same positions again, shorter: what the failed pass wrote into the cache
             * rows is overwritten before anything reads it */
            g->prefill_chunk = c / 2;
            g->prefill_shortened++;
            s = DS_OK;
            continue;
        }
        if (!s) {
            memcpy(g->cached[seq] + i, toks + i, sizeof(int32_t) * (size_t)c);
            g->n_cached[seq] = i + c;
            i += c;
        }
    }
    g->prefill_s += ds_now() - t0;
    g->prefill_tokens += g->n_cached[seq] - keep;
    free(sq);
    free(pos);
    free(want);
    return s;
}

ds_status gen_step(ds_gen *g, int n, const int *seqs, const int32_t *toks, const ds_pick *pk)
{
    bool pick = pk != NULL;
    int *pos = calloc((size_t)n, sizeof(int));
    bool *want = calloc((size_t)n, 1);
    float *lg = pick ? NULL : malloc(sizeof(float) * (size_t)n * g->vocab);
    int32_t *am = pick ? malloc(sizeof(int32_t) * (size_t)n) : NULL;
    ds_status s = DS_OK;
    if (!pos || !want || (!lg && !am)) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (int i = 0; !s && i < n; i++) {
        pos[i] = g->n_cached[seqs[i]];
        want[i] = true;
        if (pos[i] >= g->ctx) s = ds_errorf(DS_ERR_RANGE, "sequence %d reached the context end (%d tokens)", seqs[i], g->ctx);
    }
    if (!s)
        s = pick ? model_forward_pick(g->m, g->kv, n, toks, seqs, pos, pk, am)
                 : model_forward(g->m, g->kv, n, toks, seqs, pos, want, lg);
    for (int i = 0; !s && i < n; i++) {
        if (pick) g->next[seqs[i]] = am[i];
        else memcpy(g->logits + (size_t)seqs[i] * g->vocab, lg + (size_t)i * g->vocab, sizeof(float) * (size_t)g->vocab);
        g->next_ok[seqs[i]] = pick;
        g->cached[seqs[i]][g->n_cached[seqs[i]]++] = toks[i];
        g->decode_tokens++;
    }
    free(pos);
    free(want);
    free(lg);
    free(am);
    return s;
}

ds_status gen_run(ds_gen *g, int n, const int *seqs, const int32_t *const *prompts, const int *lens,
                  ds_sampler *const *samplers, const gen_opts *o, int32_t **out, int *n_out, gen_finish *why)
{
    ds_status s = DS_OK;
    int max_new = o->max_new;
    int *active = malloc(sizeof(int) * (size_t)n), *row = malloc(sizeof(int) * (size_t)n);
    int32_t *next = malloc(sizeof(int32_t) * (size_t)n);
    if (!active || !row || !next) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        out[i] = malloc(sizeof(int32_t) * (size_t)(max_new > 0 ? max_new : 1));
        n_out[i] = 0;
        if (why) why[i] = GEN_CANCELLED;
        if (!out[i]) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
        if (row) row[i] = seqs ? seqs[i] : i;
    }
    g->cancel = o->cancel;
    g->cancel_ud = o->cancel_ud;
    g->cancelled = false;
    for (int i = 0; !s && !g->cancelled && i < n; i++) s = gen_prefill(g, row[i], prompts[i], lens[i]);
    int n_active = 0;
    for (int i = 0; i < n && !g->cancelled; i++) active[n_active++] = i;
    /* Where the backend picks on the device (one rank), or no sequence has top-k,
     * top-p or a penalty: the steps return the next tokens themselves (no logits
     * downloaded where the backend picks). Each sequence's uniform for its next
     * pick is drawn with the step, from the same stream and in the same order as
     * sampler_pick would; its penalty goes with the step as the distinct tokens of
     * its history, the token fed included. The presence and frequency penalties
     * are the host sampler's alone. */
    bool pick = true, device = g->m->ops->pick_rows && g->m->world_size == 1;
    for (int i = 0; i < n; i++) {
        const ds_sampling *p = &samplers[i]->p;
        pick &= samplers[i]->presence == 0 && samplers[i]->frequency == 0 &&
                (device || (p->top_k == 0 && p->top_p >= 1 && p->repetition_penalty == 1.0f));
    }
    int hcap = g->ctx < g->vocab ? g->ctx : g->vocab; /* distinct tokens of a history */
    ds_pick *pk = pick ? malloc(sizeof(ds_pick) * (size_t)n) : NULL;
    int32_t *hist = pick ? malloc(sizeof(int32_t) * (size_t)n * hcap) : NULL;
    int *rows = malloc(sizeof(int) * (size_t)n);
    if ((pick && (!pk || !hist)) || !rows) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    /* decode time is the loop's wall time: the forward passes, the sampling and
     * the streaming of each token, as a user waits for them */
    double t0 = ds_now();
    for (int step = 0; !s && step < max_new && n_active > 0; step++) {
        int k = 0;
        for (int a = 0; a < n_active; a++) {
            int i = active[a], r = row[i];
            int32_t t = g->next_ok[r] ? g->next[r]
                                      : sampler_pick(samplers[i], g->logits + (size_t)r * g->vocab, g->cached[r],
                                                     g->n_cached[r]);
            if (t == o->eos_id) {
                if (why) why[i] = GEN_EOS;
                continue;
            }
            out[i][n_out[i]++] = t;
            int stop = o->on_token ? o->on_token(o->ud, i, t) : 0;
            gen_finish w = stop ? GEN_STOPPED : n_out[i] >= max_new ? GEN_LENGTH : g->n_cached[r] >= g->ctx ? GEN_CONTEXT
                                                                                                            : GEN_CANCELLED;
            if (w != GEN_CANCELLED) {
                if (why) why[i] = w;
                continue;
            }
            active[k] = i;
            next[k++] = t;
        }
        n_active = k;
        if (n_active && g->cancel && g->cancel(g->cancel_ud)) {
            g->cancelled = true;
            break;
        }
        for (int a = 0; a < n_active; a++) rows[a] = row[active[a]];
        for (int a = 0; pick && a < n_active; a++) {
            int i = active[a], r = rows[a];
            ds_sampler *sm = samplers[i];
            pk[a] = (ds_pick){sm->p.temperature, sm->p.top_k, sm->p.top_p,
                              sm->p.temperature > 0 ? rng_uniform(&sm->rng) : 0.0, sm->p.repetition_penalty, 0, NULL};
            if (sm->p.repetition_penalty != 1.0f) { /* the fed token in its slot (gen_step keeps it there) */
                g->cached[r][g->n_cached[r]] = next[a];
                pk[a].hist = hist + (size_t)a * hcap;
                pk[a].n_hist = sampler_distinct(sm, g->cached[r], g->n_cached[r] + 1, hist + (size_t)a * hcap);
            }
        }
        if (n_active) s = gen_step(g, n_active, rows, next, pk);
    }
    g->decode_s += ds_now() - t0;
    g->cancel = NULL;
    g->cancel_ud = NULL;
    free(pk);
    free(hist);
    free(rows);
    free(row);
    free(active);
    free(next);
    return s;
}
