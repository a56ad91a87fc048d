/* sample.c - ds_token_sampler, ds_decode_pick and ds_generate.
 *
 * The public sampler wraps model/sampler.h's and adds the range checks the API
 * promises (a negative temperature is an error here, greedy inside). Picks
 * made on the device (ds_decode_pick, ds_generate) draw the same uniforms from
 * the same stream as ds_sampler_sample would, so both give the same tokens. */
#include "api/api.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

ds_sampler_params ds_sampler_default_params(void)
{
    return (ds_sampler_params){.temperature = 0, .top_k = 0, .top_p = 1, .repetition_penalty = 1, .seed = 965};
}

static ds_status check_sampler(const ds_sampler_params *p)
{
    if (!(p->temperature >= 0) || isinf(p->temperature))
        return ds_errorf(DS_ERR_ARG, "temperature must be a number >= 0 (0: greedy), got %g", p->temperature);
    if (p->top_k < 0) return ds_errorf(DS_ERR_ARG, "top_k must be >= 0 (0: off), got %d", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1)) return ds_errorf(DS_ERR_ARG, "top_p must be in (0, 1] (1: off), got %g", p->top_p);
    if (!(p->repetition_penalty > 0) || isinf(p->repetition_penalty))
        return ds_errorf(DS_ERR_ARG, "repetition_penalty must be > 0 (1: off), got %g", p->repetition_penalty);
    if (!isfinite(p->presence_penalty))
        return ds_errorf(DS_ERR_ARG, "presence_penalty must be a finite number, got %g", p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return ds_errorf(DS_ERR_ARG, "frequency_penalty must be a finite number, got %g", p->frequency_penalty);
    return DS_OK;
}

ds_status ds_sampler_new(const ds_sampler_params *pp, int n_vocab, ds_token_sampler **out)
{
    ds_sampler_params p = pp ? *pp : ds_sampler_default_params();
    *out = NULL;
    ds_status s = check_sampler(&p);
    if (s) return s;
    if (n_vocab < 1) return ds_errorf(DS_ERR_ARG, "a sampler needs n_vocab >= 1, got %d", n_vocab);
    ds_token_sampler *t = calloc(1, sizeof *t);
    if (!t) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    ds_sampling sp = {p.temperature, p.top_k, p.top_p, p.repetition_penalty};
    if ((s = sampler_init(&t->s, &sp, p.seed, n_vocab)) ||
        (s = sampler_set_counts(&t->s, p.presence_penalty, p.frequency_penalty))) {
        sampler_free(&t->s);
        free(t);
        return s;
    }
    t->params = p;
    *out = t;
    return DS_OK;
}

void ds_sampler_free(ds_token_sampler *t)
{
    if (!t) return;
    sampler_free(&t->s);
    free(t);
}

const ds_sampler_params *ds_sampler_params_of(const ds_token_sampler *t) { return &t->params; }

int32_t ds_sampler_sample(ds_token_sampler *t, float *logits, const int32_t *history, int n_history)
{
    return sampler_pick(&t->s, logits, history, n_history);
}

/* ---- picks inside a batch */

/* Whether sampler t (NULL: greedy) can pick from a ds_pick (no presence or
 * frequency penalty: those are the host sampler's). */
static bool device_pickable(const ds_token_sampler *t)
{
    return !t || (t->params.presence_penalty == 0 && t->params.frequency_penalty == 0);
}

ds_status ds_decode_pick(ds_engine *e, const ds_batch *b, ds_token_sampler *const *samplers, int32_t *next)
{
    int n = b ? b->n_tokens : 0;
    bool dev = true;
    for (int i = 0; samplers && i < n; i++) dev &= device_pickable(samplers[i]);
    if (!dev) { /* the logits to the host, the host sampler on each row */
        bool *want = malloc((size_t)(n > 0 ? n : 1));
        if (!want) return ds_errorf(DS_ERR_NOMEM, "out of memory");
        memset(want, 1, (size_t)(n > 0 ? n : 1));
        ds_batch all = *b;
        all.logits = want;
        ds_status s = ds_decode(e, &all);
        free(want);
        if (s) return s;
        /* every token is in its slot now: the history of token i ends with it */
        int *upto = calloc((size_t)e->g->n_seq, sizeof(int));
        if (!upto) return ds_errorf(DS_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n; i++) upto[b->seq ? b->seq[i] : 0]++;
        for (int q = 0; q < e->g->n_seq; q++) upto[q] = e->g->n_cached[q] - upto[q];
        for (int i = 0; i < n; i++) {
            int q = b->seq ? b->seq[i] : 0, h = ++upto[q];
            float *row = e->logits + (size_t)i * e->cfg.vocab_size;
            next[i] = samplers[i] ? sampler_pick(&samplers[i]->s, row, e->g->cached[q], h)
                                  : sampler_argmax(row, e->cfg.vocab_size);
        }
        free(upto);
        e->n_logits = 0;
        return DS_OK;
    }
    int m = n > 0 ? n : 1, hcap = e->g->ctx < e->cfg.vocab_size ? e->g->ctx : e->cfg.vocab_size;
    int *sq = malloc(sizeof(int) * (size_t)m), *pos = malloc(sizeof(int) * (size_t)m);
    ds_pick *pk = malloc(sizeof(ds_pick) * (size_t)m);
    int32_t *hist = NULL, *tmp = NULL;
    e->n_logits = 0;
    e->n_last = 0; /* no hidden states from this pass for ds_decode_mtp */
    ds_status s = sq && pos && pk ? api_place_batch(e, b, sq, pos) : ds_errorf(DS_ERR_NOMEM, "out of memory");
    bool pen = false;
    for (int i = 0; samplers && i < n; i++) pen |= samplers[i] && samplers[i]->params.repetition_penalty != 1.0f;
    if (!s && pen && (!(hist = malloc(sizeof(int32_t) * (size_t)n * hcap)) ||
                      !(tmp = malloc(sizeof(int32_t) * (size_t)e->g->ctx))))
        s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (int i = 0; !s && i < n; i++) {
        ds_token_sampler *t = samplers ? samplers[i] : NULL;
        if (!t) {
            pk[i] = (ds_pick){0, 0, 1, 0.0, 1, 0, NULL};
            continue;
        }
        ds_sampler *sm = &t->s;
        pk[i] = (ds_pick){sm->p.temperature, sm->p.top_k, sm->p.top_p,
                          sm->p.temperature > 0 ? rng_uniform(&sm->rng) : 0.0, sm->p.repetition_penalty, 0, NULL};
        if (sm->p.repetition_penalty != 1.0f) { /* the slot's tokens, then the batch's up to token i */
            int q = sq[i], k = e->g->n_cached[q];
            memcpy(tmp, e->g->cached[q], sizeof(int32_t) * (size_t)k);
            for (int j = 0; j <= i; j++)
                if (sq[j] == q) tmp[k++] = b->token[j];
            pk[i].hist = hist + (size_t)i * hcap;
            pk[i].n_hist = sampler_distinct(sm, tmp, k, hist + (size_t)i * hcap);
        }
    }
    if (!s) s = model_forward_pick(e->m, e->g->kv, n, b->token, sq, pos, pk, next);
    if (!s) api_commit_batch(e, b, sq, pos);
    free(sq);
    free(pos);
    free(pk);
    free(hist);
    free(tmp);
    return s;
}

/* ---- generate */

ds_generate_params ds_generate_default_params(void)
{
    return (ds_generate_params){.max_new_tokens = 200, .eos = -2};
}

ds_status ds_generate(ds_engine *e, int n, const int *seqs, const int32_t *const *prompts, const int *lens,
                      ds_token_sampler *const *samplers, const ds_generate_params *pp, ds_completion *out)
{
    ds_generate_params p = pp ? *pp : ds_generate_default_params();
    ds_gen *g = e->g;
    if (n < 1 || n > g->n_seq) return ds_errorf(DS_ERR_ARG, "ds_generate: %d prompts for %d sequences", n, g->n_seq);
    for (int i = 0; i < n; i++) {
        int q = seqs ? seqs[i] : i;
        if (q < 0 || q >= g->n_seq) return ds_errorf(DS_ERR_RANGE, "ds_generate: sequence %d is outside [0, %d)", q, g->n_seq);
        for (int j = 0; seqs && j < i; j++)
            if (seqs[j] == q) return ds_errorf(DS_ERR_ARG, "ds_generate: sequence %d is given twice", q);
        if (!prompts[i] || lens[i] < 1) return ds_errorf(DS_ERR_ARG, "ds_generate: prompt %d is empty", i);
        for (int j = 0; j < lens[i]; j++)
            if (prompts[i][j] < 0 || prompts[i][j] >= e->cfg.vocab_size)
                return ds_errorf(DS_ERR_RANGE, "ds_generate: prompt %d: token %d is %d, outside [0, %d)", i, j,
                                 prompts[i][j], e->cfg.vocab_size);
    }
    if (p.spec_draft < 0 || p.spec_draft > DS_SPEC_MAX_DRAFT)
        return ds_errorf(DS_ERR_ARG, "ds_generate: spec_draft %d: 0 (off) to %d draft tokens", p.spec_draft,
                         DS_SPEC_MAX_DRAFT);
    if (p.spec_draft && !e->m->mtp)
        return ds_errorf(DS_ERR_ARG, "ds_generate: spec_draft needs the MTP module (load the engine with mtp)");
    gen_opts o = {.max_new = p.max_new_tokens < 0 ? g->ctx : p.max_new_tokens,
                  .eos_id = p.eos == -2 ? ds_engine_eos(e) : p.eos,
                  .on_token = p.on_token,
                  .ud = p.on_token_user,
                  .cancel = p.cancel,
                  .cancel_ud = p.cancel_user};
    ds_sampler **sm = calloc((size_t)n, sizeof *sm), *greedy = NULL;
    int32_t **toks = calloc((size_t)n, sizeof *toks);
    int *n_out = calloc((size_t)n, sizeof *n_out);
    gen_finish *why = calloc((size_t)n, sizeof *why);
    ds_status s = sm && toks && n_out && why ? DS_OK : ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (int i = 0; !s && i < n; i++) {
        if (samplers && samplers[i]) {
            sm[i] = &samplers[i]->s;
            continue;
        }
        if (!greedy) { /* greedy draws nothing: one sampler serves every such sequence */
            ds_sampling gp = {0, 0, 1, 1};
            if (!(greedy = calloc(1, sizeof *greedy))) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
            else if ((s = sampler_init(greedy, &gp, 0, e->cfg.vocab_size))) {
                free(greedy);
                greedy = NULL;
            }
        }
        sm[i] = greedy;
    }
    if (!s && p.spec_draft) {
        int *rows = malloc(sizeof(int) * (size_t)n);
        if (!rows) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
        for (int i = 0; rows && i < n; i++) rows[i] = seqs ? seqs[i] : i;
        if (!s) s = api_generate_spec(e, n, rows, prompts, lens, sm, p.spec_draft, &o, toks, n_out, why);
        free(rows);
    } else if (!s) {
        s = gen_run(g, n, seqs, prompts, lens, sm, &o, toks, n_out, why);
    }
    for (int i = 0; i < n; i++) {
        if (!s) {
            out[i] = (ds_completion){toks[i], n_out[i], o.max_new == 0 ? DS_FINISH_LENGTH : (ds_finish)why[i]};
        } else {
            free(toks ? toks[i] : NULL);
            out[i] = (ds_completion){NULL, 0, DS_FINISH_CANCELLED};
        }
    }
    if (greedy) sampler_free(greedy);
    free(greedy);
    free(sm);
    free(toks);
    free(n_out);
    free(why);
    return s;
}
