/* cmd_generate.c - `dsv3 generate`: the reference's generate.py, interactive
 * (a >>> prompt with /clear and /exit, multi-turn history through the chat
 * template, KV cache reused across turns) or batch (--input-file: one prompt
 * per line, Prompt:/Completion: per line, in batches of max_batch_size).
 * Completions stream in interactive mode; tokens/s go to stderr. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cmds.h"
#include "device.h"
#include "dist/dist.h"
#include "dist/nccl_comm.h"
#include "model/generate.h"
#include "tok/tokenizer.h"

#define USAGE "--ckpt-path DIR --config FILE (--interactive | --input-file FILE) [flags]"

typedef struct {
    const char *ckpt, *config, *input_file, *tokenizer_dir, *system_prompt, *attn, *gemm, *device;
    bool interactive, print_ids, parse_special, ref_kernels;
    int max_new, top_k, ctx, prefill_chunk;
    double temperature, top_p, rep_penalty;
    uint64_t seed;
    ds_comm *comm;
    tok_tokenizer *tok;
    ds_model *m;
    ds_gen *g;
} gen_ctx;

/* Streams decoded text of sequence 0 to stdout. */
typedef struct {
    gen_ctx *c;
    tok_decoder *dec;
} stream_state;

static int print_token(void *ud, int seq, int32_t t)
{
    stream_state *st = ud;
    (void)seq;
    if (dist_rank(st->c->comm) != 0 || t >= tok_vocab_size(st->c->tok)) return 0;
    const char *text;
    size_t len;
    if (tok_decoder_push(st->dec, t, &text, &len) == DS_OK && len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return 0;
}

static void report_speed(const ds_gen *g)
{
    fprintf(stderr, "prefill: %ld tokens in %.2f s (%.1f tokens/s); decode: %ld tokens in %.2f s (%.1f tokens/s)\n",
            g->prefill_tokens, g->prefill_s, g->prefill_s > 0 ? g->prefill_tokens / g->prefill_s : 0.0,
            g->decode_tokens, g->decode_s, g->decode_s > 0 ? g->decode_tokens / g->decode_s : 0.0);
    if (g->prefill_shortened)
        fprintf(stderr, "prefill: out of memory %d time%s, passes shortened to %d tokens (--prefill-chunk sets them)\n",
                g->prefill_shortened, g->prefill_shortened > 1 ? "s" : "", g->prefill_chunk);
}

/* Rank 0's line to every rank (length first); *line may be NULL for "stop". */
static ds_status share_line(gen_ctx *c, char **line)
{
    if (!c->comm) return DS_OK;
    long long n = *line ? (long long)strlen(*line) : -1;
    /* rank 0 may wait for a person here: no watchdog deadline, the others sleep */
    ds_status s = dist_broadcast_untimed(c->comm, &n, sizeof n, 0);
    if (s) return s;
    if (dist_rank(c->comm) != 0) {
        free(*line);
        *line = NULL;
        if (n < 0) return DS_OK;
        if (!(*line = calloc((size_t)n + 1, 1))) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    }
    return n > 0 ? c->comm->broadcast(c->comm, *line, (size_t)n, 0) : DS_OK;
}

static json_t *new_messages(const gen_ctx *c)
{
    json_t *msgs = json_array();
    if (c->system_prompt) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", c->system_prompt));
    return msgs;
}

static ds_status encode_messages(gen_ctx *c, json_t *msgs, int32_t **ids, size_t *n)
{
    char *js = json_dumps(msgs, JSON_COMPACT);
    if (!js) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    tok_chat_opts o = {.add_generation_prompt = 1, .parse_all = c->parse_special};
    ds_status s = tok_encode_chat(c->tok, js, &o, ids, n, NULL);
    free(js);
    return s;
}

static ds_status init_sampler(gen_ctx *c, ds_sampler *s, uint64_t seed)
{
    ds_sampling p = {(float)c->temperature, c->top_k, (float)c->top_p, (float)c->rep_penalty};
    return sampler_init(s, &p, seed, c->m->cfg.vocab_size);
}

static int interactive(gen_ctx *c)
{
    json_t *msgs = new_messages(c);
    ds_sampler smp;
    if (init_sampler(c, &smp, c->seed)) return dist_fail(c->comm, "generate");
    int rank = dist_rank(c->comm), rc = 0;
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        char *in = NULL;
        if (rank == 0) {
            printf(">>> ");
            fflush(stdout);
            ssize_t r = getline(&line, &cap, stdin);
            if (r < 0) {
                printf("\n");
            } else {
                while (r > 0 && (line[r - 1] == '\n' || line[r - 1] == '\r')) line[--r] = 0;
                in = strdup(line);
            }
        }
        if (share_line(c, &in)) {
            rc = dist_fail(c->comm, "generate");
            break;
        }
        if (!in || !strcmp(in, "/exit")) {
            free(in);
            break;
        }
        if (!strcmp(in, "/clear")) {
            json_decref(msgs);
            msgs = new_messages(c);
            free(in);
            continue;
        }
        if (!in[0]) {
            free(in);
            continue;
        }
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", in));
        free(in);
        int32_t *ids = NULL, *out = NULL;
        size_t n = 0;
        int n_out = 0;
        stream_state st = {c, NULL};
        ds_status s = encode_messages(c, msgs, &ids, &n);
        if (!s) s = tok_decoder_new(c->tok, TOK_SKIP_SPECIAL, &st.dec);
        if (!s) {
            const int32_t *p = ids;
            int len = (int)n;
            s = gen_run(c->g, 1, &p, &len, c->max_new, tok_eos_id(c->tok), &smp, print_token, &st, &out, &n_out);
        }
        if (!s) {
            const char *tail;
            size_t tl;
            if (tok_decoder_finish(st.dec, &tail, &tl) == DS_OK && tl && rank == 0) fwrite(tail, 1, tl, stdout);
            if (rank == 0) printf("\n");
            char *text = NULL;
            size_t text_len;
            int k = 0;
            for (int i = 0; i < n_out; i++)
                if (out[i] < tok_vocab_size(c->tok)) out[k++] = out[i];
            s = tok_decode(c->tok, out, (size_t)k, TOK_SKIP_SPECIAL, &text, &text_len);
            if (!s) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content", text));
            free(text);
        }
        if (s) {
            /* the turn failed: report it, drop the message, and prompt again */
            if (rank == 0) fprintf(stderr, "error: %s\n", ds_last_error());
            json_array_remove(msgs, json_array_size(msgs) - 1);
            if (s == DS_ERR_COMM) {
                rc = 1;
                free(ids);
                free(out);
                tok_decoder_free(st.dec);
                break;
            }
        }
        free(ids);
        free(out);
        tok_decoder_free(st.dec);
    }
    free(line);
    json_decref(msgs);
    sampler_free(&smp);
    if (rank == 0) report_speed(c->g);
    return rc;
}

/* The prompts of the input file: one per non-blank line. */
static ds_status read_prompts(const char *path, char ***out, int *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return ds_errorf(DS_ERR_IO, "%s: cannot open input file", path);
    char **v = NULL, *line = NULL;
    size_t cap = 0;
    ssize_t r;
    int cnt = 0;
    while ((r = getline(&line, &cap, f)) >= 0) {
        while (r > 0 && (line[r - 1] == '\n' || line[r - 1] == '\r')) line[--r] = 0;
        if (strspn(line, " \t") == (size_t)r) continue;
        char **nv = realloc(v, sizeof(char *) * (size_t)(cnt + 1));
        if (!nv) break;
        v = nv;
        v[cnt++] = strdup(line);
    }
    free(line);
    fclose(f);
    if (cnt == 0) {
        free(v);
        return ds_errorf(DS_ERR_ARG, "%s: the input file has no prompts (one prompt per line expected)", path);
    }
    *out = v;
    *n = cnt;
    return DS_OK;
}

static int batch(gen_ctx *c)
{
    char **prompts = NULL;
    int n = 0, rc = 1, rank = dist_rank(c->comm);
    if (read_prompts(c->input_file, &prompts, &n)) return dist_fail(c->comm, "generate");
    int B = c->g->n_seq;
    int32_t **ids = calloc((size_t)B, sizeof *ids), **out = calloc((size_t)B, sizeof *out);
    int *lens = calloc((size_t)B, sizeof(int)), *n_out = calloc((size_t)B, sizeof(int));
    ds_sampler *smp = calloc((size_t)B, sizeof *smp);
    ds_status s = ids && out && lens && n_out && smp ? DS_OK : ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (int b0 = 0; !s && b0 < n; b0 += B) {
        int nb = n - b0 < B ? n - b0 : B;
        for (int i = 0; !s && i < nb; i++) {
            json_t *msgs = new_messages(c);
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", prompts[b0 + i]));
            size_t len = 0;
            s = encode_messages(c, msgs, &ids[i], &len);
            lens[i] = (int)len;
            json_decref(msgs);
            if (s) ds_error_prefix(s, "prompt %d", b0 + i + 1);
            else s = init_sampler(c, &smp[i], c->seed + (uint64_t)(b0 + i));
        }
        if (!s) s = gen_run(c->g, nb, (const int32_t *const *)ids, lens, c->max_new, tok_eos_id(c->tok), smp, NULL,
                            NULL, out, n_out);
        if (s) ds_error_prefix(s, "prompts %d-%d", b0 + 1, b0 + nb);
        for (int i = 0; !s && i < nb; i++) {
            char *text = NULL;
            size_t tl;
            int k = 0;
            int32_t *kept = malloc(sizeof(int32_t) * (size_t)(n_out[i] + 1));
            for (int j = 0; kept && j < n_out[i]; j++)
                if (out[i][j] < tok_vocab_size(c->tok)) kept[k++] = out[i][j];
            s = kept ? tok_decode(c->tok, kept, (size_t)k, TOK_SKIP_SPECIAL, &text, &tl) : DS_ERR_NOMEM;
            free(kept);
            if (!s && rank == 0) {
                printf("Prompt: %s\nCompletion: %s\n", prompts[b0 + i], text);
                if (c->print_ids) {
                    printf("Ids:");
                    for (int j = 0; j < n_out[i]; j++) printf(" %d", out[i][j]);
                    printf("\n");
                }
                printf("\n");
                fflush(stdout);
            }
            free(text);
        }
        for (int i = 0; i < nb; i++) {
            free(ids[i]);
            free(out[i]);
            ids[i] = out[i] = NULL;
            sampler_free(&smp[i]);
        }
    }
    if (!s) rc = 0;
    else rc = dist_fail(c->comm, "generate");
    if (!s && rank == 0) report_speed(c->g);
    for (int i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
    free(ids);
    free(out);
    free(lens);
    free(n_out);
    free(smp);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    gen_ctx c = {.attn = "absorb", .gemm = "bf16", .device = "auto", .max_new = 200, .temperature = 0.2, .top_p = 1.0,
                 .rep_penalty = 1.0, .seed = 965};
    arg_spec specs[] = {
        {"--ckpt-path", ARG_STR, &c.ckpt, true, "DIR   checkpoint (converted, or Hugging Face layout)"},
        {"--config", ARG_STR, &c.config, true, "FILE  model config (reference JSON or config.json)"},
        {"--interactive", ARG_BOOL, &c.interactive, false, "      chat at a >>> prompt (/clear, /exit)"},
        {"--input-file", ARG_STR, &c.input_file, false, "FILE  one prompt per line"},
        {"--max-new-tokens", ARG_INT, &c.max_new, false, "N     tokens to generate per reply (200)"},
        {"--temperature", ARG_FLOAT, &c.temperature, false, "T     0 is greedy (0.2)"},
        {"--top-p", ARG_FLOAT, &c.top_p, false, "P     nucleus sampling (1 = off)"},
        {"--top-k", ARG_INT, &c.top_k, false, "K     sample among the K most likely (0 = off)"},
        {"--repetition-penalty", ARG_FLOAT, &c.rep_penalty, false, "R     penalise repeated tokens (1 = off)"},
        {"--seed", ARG_U64, &c.seed, false, "N     sampling seed (965)"},
        {"--system-prompt", ARG_STR, &c.system_prompt, false, "S     a system message before the chat"},
        {"--tokenizer", ARG_STR, &c.tokenizer_dir, false, "DIR   tokenizer files (default: --ckpt-path)"},
        {"--ctx-size", ARG_INT, &c.ctx, false, "N     KV cache positions per sequence (min(max_seq_len, 4096))"},
        {"--prefill-chunk", ARG_INT, &c.prefill_chunk, false, "N     prompt tokens per forward pass (the backend's choice)"},
        {"--attn-impl", ARG_STR, &c.attn, false, "absorb|naive"},
        {"--gemm-impl", ARG_STR, &c.gemm, false, "bf16|fp8"},
        {"--print-ids", ARG_BOOL, &c.print_ids, false, "      batch mode: also print the completion's token ids"},
        {"--parse-special", ARG_BOOL, &c.parse_special, false, "      let special-token text in messages act as control tokens (reference behaviour)"},
        {"--device", ARG_STR, &c.device, false, "cpu|cuda|auto (auto: CUDA when built in and a GPU is present)"},
        {"--ref-kernels", ARG_BOOL, &c.ref_kernels, false, "      use the scalar reference kernels (CPU)"},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof *specs, USAGE);
    if (rc) return rc == 1 ? 0 : rc;
    if (!c.interactive == !c.input_file) {
        fprintf(stderr, "dsv3 generate: give exactly one of --interactive or --input-file\n");
        return 2;
    }
    if (c.prefill_chunk < 0) {
        fprintf(stderr, "dsv3 generate: --prefill-chunk must be >= 1\n");
        return 2;
    }
    if (c.max_new < 1) {
        fprintf(stderr, "dsv3 generate: --max-new-tokens must be >= 1\n");
        return 2;
    }
    ds_model_opts o = {.attn = strcmp(c.attn, "naive") ? DS_ATTN_ABSORB : DS_ATTN_NAIVE,
                       .gemm = strcmp(c.gemm, "fp8") ? DS_GEMM_BF16 : DS_GEMM_FP8,
                       .tune = {.prefill_chunk = c.prefill_chunk}};
    if ((strcmp(c.attn, "absorb") && strcmp(c.attn, "naive")) || (strcmp(c.gemm, "bf16") && strcmp(c.gemm, "fp8"))) {
        fprintf(stderr, "dsv3 generate: --attn-impl is absorb|naive and --gemm-impl is bf16|fp8\n");
        return 2;
    }
    ds_config cfg;
    rc = 1;
    if (dist_init(&argc, &argv, &c.comm) || tool_backend(c.device, c.ref_kernels, &o.ops) || dist_attach_device(c.comm, o.ops) || config_load(&cfg, c.config) ||
        tok_load(&c.tok, c.tokenizer_dir ? c.tokenizer_dir : c.ckpt))
        goto fail;
    o.comm = c.comm;
    if (tok_vocab_size(c.tok) > cfg.vocab_size) {
        ds_errorf(DS_ERR_FORMAT, "the tokenizer has %d tokens but the model's vocab_size is %d", tok_vocab_size(c.tok),
                  cfg.vocab_size);
        goto fail;
    }
    if (!c.ctx) c.ctx = cfg.max_seq_len < 4096 ? cfg.max_seq_len : 4096;
    if (c.ctx < 1 || c.ctx > cfg.max_seq_len) {
        ds_errorf(DS_ERR_ARG, "--ctx-size must be in [1, max_seq_len=%d]", cfg.max_seq_len);
        goto fail;
    }
    int n_seq = 1;
    if (c.input_file) {
        char **p;
        int n;
        if (read_prompts(c.input_file, &p, &n)) goto fail;
        for (int i = 0; i < n; i++) free(p[i]);
        free(p);
        n_seq = n < cfg.max_batch_size ? n : cfg.max_batch_size;
    }
    if (model_load(&c.m, c.ckpt, &cfg, &o) || gen_new(&c.g, c.m, n_seq, c.ctx)) goto fail;
    rc = c.interactive ? interactive(&c) : batch(&c);
    goto done;
fail:
    rc = dist_fail(c.comm, "generate");
done:
    gen_free(c.g);
    model_free(c.m);
    tool_backend_release(o.ops);
    tok_free(c.tok);
    dist_finish(c.comm);
    return rc;
}
