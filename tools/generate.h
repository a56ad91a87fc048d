/* generate.h - what `dsv3 generate`'s files share: the run's settings, a
 * conversation, and one streamed chat turn (tools/cmd_generate.c), used by the
 * one-shot --prompt mode there and by the REPL (tools/repl.c). */
#ifndef DS_GENERATE_H
#define DS_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsv3.h"

typedef struct {
    const char *ckpt, *config, *input_file, *prompt, *tokenizer_dir, *system_prompt, *attn, *gemm, *device;
    bool interactive, print_ids, parse_special, ref_kernels, hide_thinking;
    int max_new, top_k, ctx, prefill_chunk, threads;
    const char *spec; /* "mtp": speculative decoding with the MTP module, draft tokens a step */
    int draft;
    double temperature, top_p, rep_penalty;
    uint64_t seed;
    bool tty;         /* rank 0's stdout is a terminal: thinking is dimmed */
    ds_dist *dist;
    const ds_tokenizer *tok;
    ds_engine *e;
    const char *model_name;
} gen_ctx;

/* A conversation: messages whose strings it owns. */
typedef struct {
    ds_chat_message *m;
    size_t n, cap;
} chat;

void chat_clear(chat *h);
void chat_drop_last(chat *h);
ds_status chat_add(chat *h, const char *role, const char *content);
/* Empties h and puts the system prompt, if any, first. */
ds_status chat_start(const gen_ctx *c, chat *h);

ds_status gen_new_sampler(const gen_ctx *c, uint64_t seed, ds_token_sampler **out);

/* One turn: the reply to h (which ends with the user's message) streamed to
 * stdout on rank 0, thinking shown apart, then appended to h as the assistant's
 * message. cancel (may be NULL) stops the reply early; what was made is kept.
 * When the chat no longer fits the context with room for the reply, the oldest
 * turns are dropped first, said on stderr. *cancelled tells whether it stopped. */
ds_status gen_turn(gen_ctx *c, chat *h, ds_token_sampler *smp, ds_cancel_fn cancel, bool *cancelled);

void gen_report_speed(const ds_engine *e);

/* The chat REPL (tools/repl.c); returns the exit code. */
int gen_interactive(gen_ctx *c);

#endif
