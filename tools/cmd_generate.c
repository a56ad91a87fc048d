/* cmd_generate.c - `dsv3 generate`: the reference's generate.py, one-shot
 * (--prompt: one answer on stdout), interactive (the chat REPL of
 * tools/repl.c, KV cache reused across turns) or batch (--input-file: one
 * prompt per line, Prompt:/Completion: per line, in batches of
 * max_batch_size). Replies stream; R1/V3.1 thinking (<think>...</think>) is
 * shown apart from the answer, dimmed on a terminal, or hidden; tokens/s go to
 * stderr. A client of dsv3.h like any other. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "base/clock.h"
#include "cmds.h"
#include "dsv3.h"
#include "generate.h"
#include "think.h"

#define USAGE "--ckpt-path DIR [--config FILE] (--prompt TEXT | --interactive | --input-file FILE|-) [flags]"

/* Streams decoded text of the one sequence to stdout (rank 0). */
typedef struct {
    gen_ctx *c;
    ds_text_stream *dec;
    think_filter th;
} stream_state;

static int print_token(void *ud, int index, int32_t t)
{
    stream_state *st = ud;
    (void)index;
    if (ds_dist_rank(st->c->dist) != 0 || t >= ds_tokenizer_n_vocab(st->c->tok)) return 0;
    const char *text;
    size_t len;
    if (ds_text_stream_push(st->dec, t, &text, &len) == DS_OK && len) {
        think_push(&st->th, text, len);
        fflush(stdout);
    }
    return 0;
}

void gen_report_speed(const ds_engine *e)
{
    ds_engine_stats g;
    ds_engine_get_stats(e, &g);
    fprintf(stderr, "prefill: %ld tokens in %.2f s (%.1f tokens/s); decode: %ld tokens in %.2f s (%.1f tokens/s)\n",
            g.prefill_tokens, g.prefill_seconds, g.prefill_seconds > 0 ? g.prefill_tokens / g.prefill_seconds : 0.0,
            g.decode_tokens, g.decode_seconds, g.decode_seconds > 0 ? g.decode_tokens / g.decode_seconds : 0.0);
    if (g.spec_steps)
        fprintf(stderr, "speculative: %ld steps, %.1f%% of %ld drafts accepted, %.2f tokens/step\n", g.spec_steps,
                100.0 * g.spec_accepted / (g.spec_drafted ? g.spec_drafted : 1), g.spec_drafted,
                (double)(g.spec_steps + g.spec_accepted) / g.spec_steps);
    if (g.prefill_shortened)
        fprintf(stderr, "prefill: out of memory %d time%s, passes shortened to %d tokens (--prefill-chunk sets them)\n",
                g.prefill_shortened, g.prefill_shortened > 1 ? "s" : "", g.prefill_chunk);
}

void chat_clear(chat *h)
{
    for (size_t i = 0; i < h->n; i++) free((char *)h->m[i].content);
    h->n = 0;
}

void chat_drop_last(chat *h)
{
    if (h->n) free((char *)h->m[--h->n].content);
}

ds_status chat_add(chat *h, const char *role, const char *content)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 8;
        ds_chat_message *m = realloc(h->m, sizeof *m * cap);
        if (!m) return ds_errorf(DS_ERR_NOMEM, "out of memory");
        h->m = m;
        h->cap = cap;
    }
    char *c = strdup(content);
    if (!c) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    /* roles are kept as the template's own literals */
    const char *r = !strcmp(role, "system") ? "system" : !strcmp(role, "assistant") ? "assistant" : "user";
    h->m[h->n++] = (ds_chat_message){.role = r, .content = c};
    return DS_OK;
}

ds_status chat_start(const gen_ctx *c, chat *h)
{
    chat_clear(h);
    return c->system_prompt ? chat_add(h, "system", c->system_prompt) : DS_OK;
}

/* Removes messages [i, i+k). */
static void chat_remove(chat *h, size_t i, size_t k)
{
    for (size_t j = i; j < i + k; j++) free((char *)h->m[j].content);
    memmove(h->m + i, h->m + i + k, sizeof *h->m * (h->n - i - k));
    h->n -= k;
}

/* The most bytes of text one token stands for: its piece's length (a
 * byte-level piece spends one or two bytes per byte of text). */
static size_t max_token_bytes(const ds_tokenizer *t)
{
    size_t most = 1;
    for (int32_t id = 0; id < ds_tokenizer_n_vocab(t); id++) {
        const char *p = ds_token_piece(t, id);
        size_t l = p ? strlen(p) : 0;
        most = l > most ? l : most;
    }
    return most;
}

static ds_status encode_chat(const gen_ctx *c, const chat *h, int32_t **ids, size_t *n)
{
    /* A new message of more bytes than the context's tokens can stand for
     * cannot fit: refused before the tokenizer spends minutes on it. */
    size_t last = h->n ? strlen(h->m[h->n - 1].content) : 0, n_ctx = (size_t)ds_engine_n_ctx(c->e);
    if (last > n_ctx && last / max_token_bytes(c->tok) > n_ctx)
        return ds_errorf(DS_ERR_RANGE, "the message is %zu bytes, more than the context of %zu positions can hold "
                         "(--ctx-size)", last, n_ctx);
    ds_chat_params p = ds_chat_default_params();
    p.add_generation_prompt = true;
    p.parse_special = c->parse_special;
    return ds_chat_apply(c->tok, h->m, h->n, &p, NULL, ids, n);
}

ds_status gen_new_sampler(const gen_ctx *c, uint64_t seed, ds_token_sampler **out)
{
    ds_sampler_params p = ds_sampler_default_params();
    p.temperature = (float)c->temperature;
    p.top_k = c->top_k;
    p.top_p = (float)c->top_p;
    p.repetition_penalty = (float)c->rep_penalty;
    p.seed = seed;
    return ds_sampler_new(&p, ds_engine_n_vocab(c->e), out);
}

/* The completion's text without ids past the tokenizer's and without special tokens. */
static ds_status completion_text(const gen_ctx *c, const ds_completion *o, char **text)
{
    int32_t *kept = malloc(sizeof(int32_t) * (size_t)(o->n_tokens + 1));
    if (!kept) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int j = 0; j < o->n_tokens; j++)
        if (o->tokens[j] < ds_tokenizer_n_vocab(c->tok)) kept[k++] = o->tokens[j];
    size_t len;
    ds_status s = ds_detokenize(c->tok, kept, (size_t)k, DS_DETOKENIZE_SKIP_SPECIAL, text, &len);
    free(kept);
    return s;
}

/* Encodes h, first dropping its oldest turns (after the system message) while
 * the prompt leaves less than `reserve` positions of the context for the reply. */
static ds_status encode_fitting(const gen_ctx *c, chat *h, int32_t **ids, size_t *n)
{
    int n_ctx = ds_engine_n_ctx(c->e);
    int reserve = c->max_new > 0 ? (c->max_new < n_ctx / 2 ? c->max_new : n_ctx / 2) : n_ctx / 4;
    if (reserve < 1) reserve = 1;
    size_t dropped = 0;
    for (;;) {
        ds_status s = encode_chat(c, h, ids, n);
        if (s) return s;
        if (*n + (size_t)reserve <= (size_t)n_ctx) break;
        size_t first = h->n && !strcmp(h->m[0].role, "system");
        if (first + 1 >= h->n) { /* only the new message is left */
            if (*n + 1 < (size_t)n_ctx) break; /* room for a reply, if short */
            ds_free(*ids);
            *ids = NULL;
            return ds_errorf(DS_ERR_RANGE,
                             "the message is %zu tokens with the template: with a reply it exceeds the context of %d "
                             "positions (--ctx-size)",
                             *n, n_ctx);
        }
        size_t k = first + 1 < h->n - 1 && !strcmp(h->m[first + 1].role, "assistant") ? 2 : 1;
        chat_remove(h, first, k);
        dropped += k;
        ds_free(*ids);
        *ids = NULL;
    }
    if (dropped && ds_dist_rank(c->dist) == 0)
        fprintf(stderr, "[context full (%d positions): dropped the %zu oldest message%s]\n", n_ctx, dropped,
                dropped > 1 ? "s" : "");
    return DS_OK;
}

/* Whether the prompt's last token is <think> (V3.1's thinking mode): the reply starts inside the thinking. */
static bool prompt_opens_thinking(const gen_ctx *c, const int32_t *ids, size_t n)
{
    char *t = NULL;
    size_t len = 0;
    bool yes = n && ds_detokenize(c->tok, ids + n - 1, 1, 0, &t, &len) == DS_OK && len >= 7 &&
               !memcmp(t + len - 7, "<think>", 7);
    ds_free(t);
    return yes;
}

ds_status gen_turn(gen_ctx *c, chat *h, ds_token_sampler *smp, ds_cancel_fn cancel, bool *cancelled)
{
    int rank = ds_dist_rank(c->dist);
    int32_t *ids = NULL;
    size_t n = 0;
    ds_completion out = {0};
    stream_state st = {c, NULL, {.out = stdout, .hide = c->hide_thinking, .tty = c->tty}};
    *cancelled = false;
    ds_status s = encode_fitting(c, h, &ids, &n);
    if (!s) s = ds_text_stream_new(c->tok, DS_DETOKENIZE_SKIP_SPECIAL, &st.dec);
    if (!s) {
        if (prompt_opens_thinking(c, ids, n) && rank == 0) think_toggle(&st.th);
        const int32_t *p = ids;
        int len = (int)n;
        ds_generate_params gp = ds_generate_default_params();
        gp.max_new_tokens = c->max_new;
        gp.spec_draft = c->spec ? c->draft : 0;
        gp.spec_draft = c->spec ? c->draft : 0;
        gp.on_token = print_token;
        gp.on_token_user = &st;
        gp.cancel = cancel;
        s = ds_generate(c->e, 1, NULL, &p, &len, &smp, &gp, &out);
    }
    if (!s) {
        const char *tail;
        size_t tl;
        if (rank == 0) {
            if (ds_text_stream_finish(st.dec, &tail, &tl) == DS_OK && tl) think_push(&st.th, tail, tl);
            think_finish(&st.th);
            printf("\n");
            fflush(stdout);
        }
        *cancelled = out.finish == DS_FINISH_CANCELLED;
        if (out.finish == DS_FINISH_CONTEXT && rank == 0)
            fprintf(stderr, "[the reply reached the end of the context (%d positions); the next turn drops the oldest "
                            "messages]\n",
                    ds_engine_n_ctx(c->e));
        char *text = NULL;
        s = completion_text(c, &out, &text);
        if (!s) s = chat_add(h, "assistant", text);
        ds_free(text);
    }
    ds_free(ids);
    ds_free(out.tokens);
    ds_text_stream_free(st.dec);
    return s;
}

/* --prompt: one answer on stdout. */
static int one_shot(gen_ctx *c)
{
    chat h = {0};
    ds_token_sampler *smp = NULL;
    bool cancelled;
    ds_status s = chat_start(c, &h);
    if (!s) s = chat_add(&h, "user", c->prompt);
    if (!s) s = gen_new_sampler(c, c->seed, &smp);
    if (!s) s = gen_turn(c, &h, smp, NULL, &cancelled);
    if (s) ds_error_prefix(s, "--prompt");
    int rc = s ? args_fail_dist(c->dist, "generate") : 0;
    if (!s && ds_dist_rank(c->dist) == 0) gen_report_speed(c->e);
    chat_clear(&h);
    free(h.m);
    ds_sampler_free(smp);
    return rc;
}

/* The prompts of the input file: one per non-blank line, with their line numbers. */
static ds_status read_prompts(const char *path, char ***out, int **lines, int *n)
{
    bool std_in = !strcmp(path, "-");
    FILE *f = std_in ? stdin : fopen(path, "rb");
    if (!f) return ds_errorf(DS_ERR_IO, "%s: cannot open input file", path);
    char **v = NULL, *line = NULL;
    int *ln = NULL;
    size_t cap = 0;
    ssize_t r;
    int cnt = 0, at = 0;
    ds_status s = DS_OK;
    while ((r = getline(&line, &cap, f)) >= 0) {
        at++;
        if (memchr(line, 0, (size_t)r)) { /* the prompt would end there, the rest dropped unseen */
            s = ds_errorf(DS_ERR_FORMAT, "%s line %d: a NUL byte in the prompt", std_in ? "standard input" : path, at);
            break;
        }
        while (r > 0 && (line[r - 1] == '\n' || line[r - 1] == '\r')) line[--r] = 0;
        if (strspn(line, " \t") == (size_t)r) continue;
        char **nv = realloc(v, sizeof(char *) * (size_t)(cnt + 1));
        if (nv) v = nv;
        int *nl = nv ? realloc(ln, sizeof(int) * (size_t)(cnt + 1)) : NULL;
        if (nl) ln = nl;
        if (!nv || !nl || !(v[cnt] = strdup(line))) {
            s = ds_errorf(DS_ERR_NOMEM, "%s: out of memory reading the prompts", path);
            break;
        }
        ln[cnt++] = at;
    }
    free(line);
    if (!s && ferror(f)) s = ds_errorf(DS_ERR_IO, "%s: read error", std_in ? "standard input" : path);
    if (!std_in) fclose(f);
    if (!s && cnt == 0) s = ds_errorf(DS_ERR_ARG, "%s: the input file has no prompts (one prompt per line expected)", path);
    if (s) {
        for (int i = 0; i < cnt; i++) free(v[i]);
        free(v);
        free(ln);
        return s;
    }
    *out = v;
    *lines = ln;
    *n = cnt;
    return DS_OK;
}

static int batch(gen_ctx *c, char **prompts, const int *lines, int n)
{
    int rank = ds_dist_rank(c->dist);
    int B = ds_engine_n_seq(c->e);
    int32_t **ids = calloc((size_t)B, sizeof *ids);
    int *lens = calloc((size_t)B, sizeof(int));
    ds_completion *out = calloc((size_t)B, sizeof *out);
    ds_token_sampler **smp = calloc((size_t)B, sizeof *smp);
    chat h = {0};
    ds_status s = ids && out && lens && smp ? DS_OK : ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (int b0 = 0; !s && b0 < n; b0 += B) {
        int nb = n - b0 < B ? n - b0 : B;
        for (int i = 0; !s && i < nb; i++) {
            size_t len = 0;
            if (!(s = chat_start(c, &h)) && !(s = chat_add(&h, "user", prompts[b0 + i])))
                s = encode_chat(c, &h, &ids[i], &len);
            lens[i] = (int)len;
            const char *file = strcmp(c->input_file, "-") ? c->input_file : "standard input";
            if (s) ds_error_prefix(s, "%s line %d", file, lines[b0 + i]);
            else s = gen_new_sampler(c, c->seed + (uint64_t)(b0 + i), &smp[i]);
        }
        ds_generate_params gp = ds_generate_default_params();
        gp.max_new_tokens = c->max_new;
        gp.spec_draft = c->spec ? c->draft : 0;
        if (!s) {
            s = ds_generate(c->e, nb, NULL, (const int32_t *const *)ids, lens, smp, &gp, out);
            if (s) ds_error_prefix(s, "prompts %d-%d", b0 + 1, b0 + nb);
        }
        for (int i = 0; !s && i < nb; i++) {
            char *text = NULL;
            s = completion_text(c, &out[i], &text);
            if (!s && rank == 0) {
                printf("Prompt: %s\nCompletion: %s\n", prompts[b0 + i], text);
                if (c->print_ids) {
                    printf("Ids:");
                    for (int j = 0; j < out[i].n_tokens; j++) printf(" %d", out[i].tokens[j]);
                    printf("\n");
                }
                printf("\n");
                fflush(stdout);
            }
            ds_free(text);
        }
        for (int i = 0; i < nb; i++) {
            ds_free(ids[i]);
            ds_free(out[i].tokens);
            ids[i] = NULL;
            out[i].tokens = NULL;
            ds_sampler_free(smp[i]);
            smp[i] = NULL;
        }
    }
    int rc = s ? args_fail_dist(c->dist, "generate") : 0;
    if (!s && rank == 0) gen_report_speed(c->e);
    chat_clear(&h);
    free(h.m);
    free(ids);
    free(out);
    free(lens);
    free(smp);
    return rc;
}

/* A usage error (exit code 2) when a sampling flag is out of range. */
static int check_sampling(const gen_ctx *c)
{
    const char *bad = !(c->temperature >= 0)                 ? "--temperature must be >= 0 (0 is greedy)"
                      : c->top_k < 0                         ? "--top-k must be >= 0 (0 is off)"
                      : !(c->top_p > 0 && c->top_p <= 1)     ? "--top-p must be in (0, 1] (1 is off)"
                      : !(c->rep_penalty > 0)                ? "--repetition-penalty must be > 0 (1 is off)"
                      : c->prefill_chunk < 0                 ? "--prefill-chunk must be >= 1"
                      : c->max_new < 1 && c->max_new != -1   ? "--max-new-tokens must be >= 1, or -1 (until the end)"
                      : c->threads < 0                       ? "--threads must be >= 1"
                                                             : NULL;
    if (bad) fprintf(stderr, "dsv3 generate: %s\n", bad);
    return bad ? 2 : 0;
}

/* The load progress line: a thread that, once the load has taken a second,
 * says what is loading and for how long (updated in place on a terminal). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done, shown, tty;
    const char *name;
} load_watch;

static void *load_watch_run(void *arg)
{
    load_watch *w = arg;
    double t0 = ds_now();
    pthread_mutex_lock(&w->mu);
    for (int sec = 1; !w->done; sec++) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 1;
        while (!w->done && pthread_cond_timedwait(&w->cv, &w->mu, &dl) == 0) {}
        if (w->done) break;
        if (w->tty) fprintf(stderr, "\rloading %s ... %.0f s", w->name, ds_now() - t0);
        else if (!w->shown) fprintf(stderr, "loading %s ...\n", w->name);
        w->shown = true;
        (void)sec;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ds_engine_load with the progress line on rank 0's stderr. */
static ds_status gen_load(gen_ctx *c, const ds_engine_params *p)
{
    load_watch w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false, isatty(2), c->model_name};
    pthread_t th;
    double t0 = ds_now();
    bool watching = ds_dist_rank(c->dist) == 0 && pthread_create(&th, NULL, load_watch_run, &w) == 0;
    ds_status s = ds_engine_load(c->ckpt, p, &c->e);
    if (watching) {
        pthread_mutex_lock(&w.mu);
        w.done = true;
        pthread_cond_signal(&w.cv);
        pthread_mutex_unlock(&w.mu);
        pthread_join(th, NULL);
        if (w.shown) fprintf(stderr, "%sloaded %s in %.1f s\n", w.tty ? "\r" : "", c->model_name, ds_now() - t0);
    }
    return s;
}

int cmd_generate(int argc, char **argv)
{
    gen_ctx c = {.attn = "absorb", .gemm = "bf16", .device = "auto", .max_new = 200, .temperature = 0.2, .top_p = 1.0,
                 .rep_penalty = 1.0, .seed = 965, .draft = 1};
    arg_spec specs[] = {
        {"--ckpt-path", ARG_STR, &c.ckpt, true, "DIR   checkpoint (converted, or Hugging Face layout)"},
        {"--config", ARG_STR, &c.config, false, "FILE  model config (default: DIR/config.json)"},
        {"--prompt", ARG_STR, &c.prompt, false, "TEXT  answer one prompt on stdout and exit"},
        {"--interactive", ARG_BOOL, &c.interactive, false, "      chat at a >>> prompt (/help lists its commands)"},
        {"--input-file", ARG_STR, &c.input_file, false, "FILE  one prompt per line (- reads standard input)"},
        {"--max-new-tokens", ARG_INT, &c.max_new, false, "N     tokens per reply (200; -1: until the end of sequence or context)"},
        {"--spec", ARG_STR, &c.spec, false, "mtp   speculative decoding with the checkpoint's MTP module (default off: "
                                            "slower than plain on the models measured, docs/performance.md)"},
        {"--draft", ARG_INT, &c.draft, false, "N     tokens the MTP module drafts a step, 1 to 7 (1: measured fastest)"},
        {"--threads", ARG_INT, &c.threads, false, "N     CPU threads (OpenMP's default)"},
        {"--hide-thinking", ARG_BOOL, &c.hide_thinking, false, "      leave out R1/V3.1 thinking (<think>...</think>)"},
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
    if ((c.interactive != 0) + (c.input_file != NULL) + (c.prompt != NULL) != 1) {
        fprintf(stderr, "dsv3 generate: give exactly one of --prompt, --interactive or --input-file\n");
        return 2;
    }
    if ((rc = check_sampling(&c))) return rc;
    if (c.spec && !strcmp(c.spec, "off")) c.spec = NULL;
    if ((c.spec && strcmp(c.spec, "mtp")) || c.draft < 1 || c.draft > DS_SPEC_MAX_DRAFT) {
        fprintf(stderr, "dsv3 generate: --spec is mtp or off, --draft 1 to %d\n", DS_SPEC_MAX_DRAFT);
        return 2;
    }
    if ((strcmp(c.attn, "absorb") && strcmp(c.attn, "naive")) || (strcmp(c.gemm, "bf16") && strcmp(c.gemm, "fp8"))) {
        fprintf(stderr, "dsv3 generate: --attn-impl is absorb|naive and --gemm-impl is bf16|fp8\n");
        return 2;
    }
    ds_engine_params p = ds_engine_default_params();
    p.config_path = c.config;
    p.tokenizer_dir = c.tokenizer_dir;
    p.device = c.device;
    p.ref_kernels = c.ref_kernels;
    p.attention = strcmp(c.attn, "naive") ? DS_ATTENTION_ABSORB : DS_ATTENTION_NAIVE;
    p.matmul = strcmp(c.gemm, "fp8") ? DS_MATMUL_BF16 : DS_MATMUL_FP8;
    p.prefill_chunk = c.prefill_chunk;
    p.n_threads = c.threads;
    p.mtp = c.spec != NULL;
    char **prompts = NULL;
    int *lines = NULL, n = 0;
    ds_model_info_buf info;
    rc = 1;
    if (ds_dist_init(&argc, &argv, &c.dist) || ds_read_model_info(c.ckpt, c.config, &info)) goto fail;
    p.dist = c.dist;
    if (c.ctx < 0 || c.ctx > info.info.max_seq_len) {
        ds_errorf(DS_ERR_ARG, "--ctx-size must be in [1, max_seq_len=%d]", info.info.max_seq_len);
        goto fail;
    }
    p.n_ctx = c.ctx;
    p.n_seq = 1;
    if (c.input_file) {
        if (read_prompts(c.input_file, &prompts, &lines, &n)) goto fail;
        p.n_seq = n < info.info.max_batch_size ? n : info.info.max_batch_size;
    }
    c.model_name = info.info.name;
    c.tty = ds_dist_rank(c.dist) == 0 && isatty(1);
    if (gen_load(&c, &p)) goto fail;
    c.tok = ds_engine_tokenizer(c.e);
    rc = c.interactive ? gen_interactive(&c) : c.prompt ? one_shot(&c) : batch(&c, prompts, lines, n);
    goto done;
fail:
    rc = args_fail_dist(c.dist, "generate");
done:
    for (int i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
    free(lines);
    ds_engine_free(c.e);
    ds_dist_finish(c.dist);
    return rc;
}
