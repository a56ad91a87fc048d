/* spec.c - greedy speculative decoding with the MTP module (ds_generate's
 * spec_draft 1): the module drafts the token after next, one batched main pass
 * checks the next token and the draft, and the slot keeps the accepted prefix.
 *
 * Per sequence, at the top of each step: the slot holds positions 0..c-1, the
 * last ds_decode batch holds the hidden state of position c-1 at index hl, the
 * MTP rows 0..c-2 are written but for the pending ones, and t is the greedy
 * token for position c. Step: the MTP rows pending and (c-1, t) -> draft d for
 * c+1; main pass [t, d] at c, c+1 -> g1 = argmax at c; d == g1: both kept, the
 * next t is the argmax at c+1 and MTP row (c, d) is pending; else the slot is
 * cut back to c+1 (ds_seq_truncate: the main and MTP rows past it are never
 * read) and t = g1. Every token is the argmax of the main model's logits after
 * the same prefix as in plain greedy decoding, so the output is the same up to
 * the rounding of a 2-token pass against a 1-token one. */
#include "api/api.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The prompt into slot r from position 0, in passes of the engine's prefill
 * length, with the MTP rows of every position but the last; *t = the greedy
 * next token, *hl the last token's index in the last batch. */
static ds_status spec_prefill(ds_engine *e, int r, const int32_t *p, int n, int32_t *t, int *hl)
{
    ds_status s = ds_seq_truncate(e, r, 0);
    int chunk = e->g->prefill_chunk > 0 ? e->g->prefill_chunk : 512;
    int *seq = malloc(sizeof(int) * (size_t)chunk), *idx = malloc(sizeof(int) * (size_t)chunk);
    if (!seq || !idx) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (int i = 0; !s && i < chunk; i++) seq[i] = r;
    for (int off = 0; !s && off < n; off += chunk) {
        int k = n - off < chunk ? n - off : chunk;
        ds_batch b = {k, p + off, seq, NULL};
        if ((s = ds_decode(e, &b))) break;
        int m = off + k < n ? k : k - 1; /* rows whose next token is known */
        for (int i = 0; i < m; i++) idx[i] = i;
        ds_mtp_batch mb = {m, idx, p + off + 1};
        if (m && (s = ds_decode_mtp(e, &mb))) break;
        if (off + k == n) {
            *t = ds_argmax(ds_logits(e, 0), e->cfg.vocab_size);
            *hl = k - 1;
        }
    }
    free(seq);
    free(idx);
    return s;
}

ds_status api_generate_spec(ds_engine *e, int i, int r, const int32_t *prompt, int len, const gen_opts *o,
                            int32_t **out, int *n_out, ds_finish *why)
{
    ds_gen *g = e->g;
    int V = e->cfg.vocab_size, max_new = o->max_new, hl = 0, n_pend = 0, idx[2];
    int32_t t = 0, nx[2], pair[2];
    int sq[2] = {r, r};
    bool want[2] = {true, true};
    *n_out = 0;
    *why = DS_FINISH_CANCELLED;
    if (!(*out = malloc(sizeof(int32_t) * (size_t)(max_new > 0 ? max_new : 1))))
        return ds_errorf(DS_ERR_NOMEM, "out of memory");
    if (o->cancel && o->cancel(o->cancel_ud)) return DS_OK;
    double t0 = now_s();
    ds_status s = spec_prefill(e, r, prompt, len, &t, &hl);
    g->prefill_tokens += len;
    g->prefill_s += now_s() - t0;
    t0 = now_s();
    while (!s && *n_out < max_new) {
        if (t == o->eos_id) {
            *why = DS_FINISH_EOS;
            break;
        }
        (*out)[(*n_out)++] = t;
        int c = g->n_cached[r];
        if (o->on_token && o->on_token(o->ud, i, t)) *why = DS_FINISH_STOPPED;
        else if (*n_out >= max_new) *why = DS_FINISH_LENGTH;
        else if (c >= g->ctx) *why = DS_FINISH_CONTEXT;
        if (*why != DS_FINISH_CANCELLED || (o->cancel && o->cancel(o->cancel_ud))) break;
        if (c + 1 >= g->ctx) { /* room for t alone: a plain step */
            ds_batch b = {1, &t, sq, NULL};
            if ((s = ds_decode(e, &b))) break;
            t = ds_argmax(ds_logits(e, 0), V);
            n_pend = 0;
            continue;
        }
        /* draft d for c + 1 from the MTP rows pending and (c - 1, t) */
        idx[n_pend] = hl;
        nx[n_pend++] = t;
        ds_mtp_batch mb = {n_pend, idx, nx};
        if ((s = ds_decode_mtp(e, &mb))) break;
        int32_t d = ds_argmax(ds_mtp_logits(e, n_pend - 1), V);
        /* verify: [t, d] at c, c + 1 */
        pair[0] = t;
        pair[1] = d;
        ds_batch b = {2, pair, sq, want};
        if ((s = ds_decode(e, &b))) break;
        int32_t g1 = ds_argmax(ds_logits(e, 0), V);
        e->spec_drafted++;
        n_pend = 0;
        if (g1 != d) {
            s = ds_seq_truncate(e, r, c + 1);
            hl = 0;
            t = g1;
            continue;
        }
        e->spec_accepted++;
        /* g1 = d, as plain greedy decoding would emit it after t */
        if (g1 == o->eos_id) {
            *why = DS_FINISH_EOS;
            s = ds_seq_truncate(e, r, c + 1);
            break;
        }
        (*out)[(*n_out)++] = g1;
        if (o->on_token && o->on_token(o->ud, i, g1)) *why = DS_FINISH_STOPPED;
        else if (*n_out >= max_new) *why = DS_FINISH_LENGTH;
        if (*why != DS_FINISH_CANCELLED) {
            s = ds_seq_truncate(e, r, c + 1); /* the last token emitted is not in the slot */
            break;
        }
        t = ds_argmax(ds_logits(e, 1), V);
        hl = 1;
        idx[0] = 0; /* MTP row (c, d) */
        nx[0] = d;
        n_pend = 1;
    }
    if (!s && max_new == 0) *why = DS_FINISH_LENGTH;
    g->decode_tokens += *n_out;
    g->decode_s += now_s() - t0;
    return s;
}
