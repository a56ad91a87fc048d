/* generate.h - the generation loop: prompts in, tokens out, streamed.
 *
 * A ds_gen owns the KV cache rows of up to n_seq sequences and remembers which
 * tokens each row holds, so a new prompt that extends a row's tokens (the next
 * turn of a chat) only computes the new suffix. Prefill runs in chunks; decode
 * steps batch one token of every active sequence. */
#ifndef DS_GENERATE_H
#define DS_GENERATE_H

#include "model/model.h"
#include "model/sampler.h"

typedef struct {
    ds_model *m;
    ds_kvcache *kv;
    int n_seq, ctx, vocab;
    int32_t **cached;      /* per sequence: the tokens whose KV is in the cache */
    int *n_cached;
    float *logits;         /* per sequence: logits after its last token (n_seq, vocab) */
    int32_t *next;         /* per sequence, when next_ok: the pick after its last token */
    bool *next_ok;         /* (a greedy step left that instead of the logits) */
    /* prompt tokens per prefill pass: the backend's choice, halved after a pass ran
     * out of memory (one process only: ranks must run the same passes) */
    int prefill_chunk;
    int prefill_shortened; /* passes retried shorter */
    /* asked before every forward pass of gen_prefill and gen_run (NULL: never);
     * non-zero stops them and sets cancelled */
    int (*cancel)(void *ud);
    void *cancel_ud;
    bool cancelled;
    /* statistics for the tokens/s report */
    long prefill_tokens, decode_tokens;
    double prefill_s, decode_s;
} ds_gen;

ds_status gen_new(ds_gen **out, ds_model *m, int n_seq, int ctx);
void gen_free(ds_gen *g);

/* Makes row `seq` hold exactly toks[0..n): keeps the longest common prefix with
 * what it holds and computes the rest, g->prefill_chunk tokens a pass; a pass that
 * runs out of memory is run again in passes of half its length, down to one token.
 * Leaves the last token's logits in g->logits[seq]. A prompt longer than the
 * context is DS_ERR_RANGE. */
ds_status gen_prefill(ds_gen *g, int seq, const int32_t *toks, int n);

/* Appends toks[i] to sequence seqs[i] for i < n, one forward pass. With pick set:
 * leave each sequence's next token, what sampler_pick_u makes of its logits with
 * pick[i]'s settings, in g->next (next_ok set) instead of its logits. */
ds_status gen_step(ds_gen *g, int n, const int *seqs, const int32_t *toks, const ds_pick *pick);

/* Called for each new token of the i-th sequence of gen_run; return non-zero to stop it. */
typedef int (*gen_token_fn)(void *ud, int i, int32_t tok);

/* Why a sequence of gen_run ended (the order of the public ds_finish). */
typedef enum { GEN_EOS, GEN_LENGTH, GEN_CONTEXT, GEN_STOPPED, GEN_CANCELLED } gen_finish;

typedef struct {
    int max_new;            /* tokens per sequence at most (>= 1) */
    int32_t eos_id;         /* -1: none */
    gen_token_fn on_token;  /* NULL: none */
    void *ud;
    int (*cancel)(void *ud); /* asked before every forward pass (NULL: never) */
    void *cancel_ud;
} gen_opts;

/* Generates for n prompts at once in rows seqs[0..n) (distinct; NULL: 0..n-1):
 * prefill each (gen_prefill), then decode in lockstep until every sequence has
 * produced eos_id or max_new tokens, reached the context end, or been stopped
 * by on_token; a cancel stops them all (DS_OK). samplers[i] picks sequence i's
 * tokens. out[i] receives the completion (eos excluded, malloc'ed), n_out[i]
 * its length, why[i] (may be NULL) the reason it ended. */
ds_status gen_run(ds_gen *g, int n, const int *seqs, const int32_t *const *prompts, const int *lens,
                  ds_sampler *const *samplers, const gen_opts *o, int32_t **out, int *n_out, gen_finish *why);

#endif
