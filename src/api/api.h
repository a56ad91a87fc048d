/* api.h - the public API's objects (include/dsv3.h) over the internals.
 *
 * A ds_engine is a loaded model (model/model.h) on a backend chosen through
 * backend/registry.h, with a ds_gen (model/generate.h) that owns the KV cache
 * and remembers which tokens each slot holds: ds_decode and the sequence calls
 * keep that record, so ds_generate's prefix reuse sees what they did. */
#ifndef DS_API_INTERNAL_H
#define DS_API_INTERNAL_H

#include "dsv3.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/sampler.h"
#include "tok/tokenizer.h"

struct ds_tokenizer {
    tok_tokenizer *tok;
};

struct ds_text_stream {
    const tok_tokenizer *tok;
    int flags;
    tok_decoder *dec;
};

struct ds_token_sampler {
    ds_sampler_params params;
    ds_sampler s;
};

struct ds_engine {
    ds_config cfg;
    ds_model_info info;
    char name[64];
    const ds_ops *ops;
    ds_comm *comm;
    ds_model *m;
    ds_gen *g;
    ds_tokenizer *tok;     /* NULL: none loaded */
    float *logits;         /* the last ds_decode's wanted rows (n_logits, vocab) */
    int n_logits, cap_logits;
    /* MTP (e->m->mtp): the last ds_decode batch's final-normed hidden states
     * (n_last, dim) in ops->alloc memory, each token's sequence, position and id,
     * and the last ds_decode_mtp's logits (n_mtp, vocab) */
    float *hidden;
    int n_last, cap_last;
    int *last_seq, *last_pos;
    int32_t *last_tok;
    float *mtp_logits;
    int n_mtp, cap_mtp;
    /* the last MTP pass's rows: each one's output state shared_head.norm(h')
     * ((cap_state, dim) in ops->alloc memory), sequence and position, which a
     * chained pass continues (ds_decode_mtp_chain) */
    float *mtp_state;
    int *mtp_seq, *mtp_pos;
    int cap_state;
    /* speculative drafts made and accepted, main passes that checked drafts, and
     * those passes by drafts accepted (spec.c) */
    long spec_drafted, spec_accepted, spec_steps, spec_accept_len[DS_SPEC_MAX_DRAFT + 1];
    double spec_draft_s, spec_check_s; /* seconds in the drafting MTP passes and the checking main passes */
};

/* Whether ops runs in host memory: the CPU backend's tables are named "cpu-...". */
bool api_ops_on_host(const ds_ops *ops);

/* The model info of cfg, named after the checkpoint directory dir. */
void api_model_info(const ds_config *cfg, const char *dir, ds_model_info *info, char *name, size_t name_cap);

/* Loads the config at path, or dir/config.json when path is NULL. */
ds_status api_config_load(ds_config *cfg, const char *dir, const char *path);

/* Each token of b's sequence and position (appended in order) into sq and pos,
 * after checking the sequences, the ids and the room left in each slot. */
ds_status api_place_batch(const ds_engine *e, const ds_batch *b, int *sq, int *pos);
/* After a successful pass: the batch's tokens become part of their slots. */
void api_commit_batch(ds_engine *e, const ds_batch *b, const int *sq, const int *pos);

/* ds_decode with every token wanted, but only each token's argmax into next
 * (n_tokens; picked on the device where the backend can) and no logits kept. */
ds_status api_decode_argmax(ds_engine *e, const ds_batch *b, int32_t *next);

/* ds_generate's speculative decoding (spec.c): n prompts in slots rows[0..n),
 * each computed from position 0, then steps that draft n_draft tokens with the
 * MTP module and verify them in one main pass; sm[i] picks sequence i's tokens
 * (temperature 0: greedy). As gen_run otherwise: out[i] malloc'ed. */
ds_status api_generate_spec(ds_engine *e, int n, const int *rows, const int32_t *const *prompts, const int *lens,
                            ds_sampler *const *sm, int n_draft, const gen_opts *o, int32_t **out, int *n_out,
                            gen_finish *why);

#endif
