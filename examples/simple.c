/* simple.c - the public API in brief: load a checkpoint, render a chat with
 * its template, and stream a sampled reply to stdout.
 *
 *   cc simple.c $(pkg-config --cflags --libs dsv3) -o simple
 *   ./simple models/dsv3-mini "Tell me about the sea." */
#include <stdio.h>

#include "dsv3.h"

/* ds_generate calls this with every new token: print the text it completes. */
static int print_token(void *stream, int index, int32_t token)
{
    const char *text;
    size_t len;
    (void)index;
    if (ds_text_stream_push(stream, token, &text, &len) == DS_OK) fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* non-zero would stop the reply here */
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CHECKPOINT_DIR [PROMPT]\n", argv[0]);
        return 2;
    }
    ds_chat_message msg = {.role = "user", .content = argc > 2 ? argv[2] : "Tell me about the sea."};
    ds_engine_params ep = ds_engine_default_params(); /* config.json and the tokenizer from the directory */
    ep.n_ctx = 512;
    ds_sampler_params sp = ds_sampler_default_params();
    sp.temperature = 0.7f;
    sp.top_p = 0.95f;
    ds_engine *e = NULL;
    ds_text_stream *stream = NULL;
    ds_token_sampler *sampler = NULL;
    ds_completion reply = {0};
    int32_t *prompt = NULL;
    size_t n = 0;

    ds_status s = ds_engine_load(argv[1], &ep, &e);
    const ds_tokenizer *tok = s ? NULL : ds_engine_tokenizer(e);
    if (!s) s = ds_chat_apply(tok, &msg, 1, NULL, NULL, &prompt, &n);
    if (!s) s = ds_text_stream_new(tok, DS_DETOKENIZE_SKIP_SPECIAL, &stream);
    if (!s) s = ds_sampler_new(&sp, ds_engine_n_vocab(e), &sampler);
    if (!s) {
        ds_generate_params gp = ds_generate_default_params(); /* stops at the tokenizer's eos */
        gp.max_new_tokens = 60;
        gp.on_token = print_token;
        gp.on_token_user = stream;
        const int32_t *prompts[1] = {prompt};
        int lens[1] = {(int)n};
        s = ds_generate(e, 1, NULL, prompts, lens, &sampler, &gp, &reply);
    }
    const char *tail;
    size_t len;
    if (!s && ds_text_stream_finish(stream, &tail, &len) == DS_OK) printf("%.*s\n", (int)len, tail);
    if (s) fprintf(stderr, "simple: %s\n", ds_last_error());
    ds_free(reply.tokens);
    ds_free(prompt);
    ds_sampler_free(sampler);
    ds_text_stream_free(stream);
    ds_engine_free(e);
    return s ? 1 : 0;
}
