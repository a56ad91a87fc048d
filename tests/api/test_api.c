/* test_api.c - the public API (include/dsv3.h) as a program embedding the
 * engine calls it, on the tiny golden checkpoint (tests/golden/tiny_hf):
 *   - fork and truncate give the logits that recomputing the tokens gives
 *     (bit for bit: the same passes run), on both attention forms;
 *   - a batch of several sequences equals the sequences one at a time (within
 *     the rounding of batched products), and ds_decode_pick picks the argmax;
 *   - ds_generate: greedy equals the argmax chain of ds_decode, prefix reuse
 *     computes only the new suffix, the stop and cancel hooks;
 *   - the sampler's range errors and the API's messages for bad arguments;
 *   - the tokenizer and chat calls on DeepSeek-V3's tokenizer (tests/tok/tokdir.h). */
#include <string.h>

#include "dsv3.h"
#include "test.h"
#include "tok/tokdir.h"

#define N 12

static const int32_t k_toks[N] = {1, 17, 300, 4, 905, 62, 7, 512, 88, 2, 640, 33};

static float max_abs(const float *x, int n)
{
    float m = 0;
    for (int i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

static float max_diff(const float *a, const float *b, int n)
{
    float m = 0;
    for (int i = 0; i < n; i++) m = fabsf(a[i] - b[i]) > m ? fabsf(a[i] - b[i]) : m;
    return m;
}

static ds_engine *load(ds_attention_impl attn, int n_seq)
{
    ds_engine_params p = ds_engine_default_params();
    p.config_path = t_golden("config_tiny.json");
    p.no_tokenizer = true;
    p.device = "cpu";
    p.n_ctx = 64;
    p.n_seq = n_seq;
    p.attention = attn;
    ds_engine *e = NULL;
    CHECK_OK(ds_engine_load(t_golden("tiny_hf"), &p, &e));
    return e;
}

/* Feeds toks[0..n) to seq in one pass; the logits of every token into out (n rows). */
static ds_status feed(ds_engine *e, int seq, const int32_t *toks, int n, float *out)
{
    int sq[N];
    bool want[N];
    for (int i = 0; i < n; i++) {
        sq[i] = seq;
        want[i] = true;
    }
    ds_batch b = {n, toks, sq, want};
    ds_status s = ds_decode(e, &b);
    int V = ds_engine_n_vocab(e);
    for (int i = 0; !s && out && i < n; i++) memcpy(out + (size_t)i * V, ds_logits(e, i), sizeof(float) * V);
    return s;
}

static void test_fork_truncate(ds_attention_impl attn)
{
    ds_engine *e = load(attn, 3);
    if (!e) return;
    int V = ds_engine_n_vocab(e), K = 5;
    float *ref = malloc(sizeof(float) * N * V), *got = malloc(sizeof(float) * N * V);
    /* reference: the first K tokens, then the rest, in sequence 0 */
    CHECK_OK(feed(e, 0, k_toks, K, ref));
    CHECK_OK(feed(e, 0, k_toks + K, N - K, ref + (size_t)K * V));
    CHECK(ds_seq_len(e, 0) == N);
    CHECK(ds_seq_common_prefix(e, 0, k_toks, N) == N);
    /* truncate: sequence 1 holds K tokens and junk, cut back to K, then the rest */
    int32_t junk[3] = {5, 6, 7};
    CHECK_OK(feed(e, 1, k_toks, K, NULL));
    CHECK_OK(feed(e, 1, junk, 3, NULL));
    CHECK_OK(ds_seq_truncate(e, 1, K));
    CHECK(ds_seq_len(e, 1) == K);
    CHECK_OK(feed(e, 1, k_toks + K, N - K, got));
    CHECK_MSG(max_diff(got, ref + (size_t)K * V, (N - K) * V) == 0, "truncate: %g", max_diff(got, ref + (size_t)K * V, (N - K) * V));
    /* fork: sequence 2 takes the first K positions of sequence 0 */
    CHECK_OK(ds_seq_fork(e, 2, 0, K));
    CHECK(ds_seq_len(e, 2) == K && ds_seq_tokens(e, 2)[K - 1] == k_toks[K - 1]);
    CHECK_OK(feed(e, 2, k_toks + K, N - K, got));
    CHECK_MSG(max_diff(got, ref + (size_t)K * V, (N - K) * V) == 0, "fork: %g", max_diff(got, ref + (size_t)K * V, (N - K) * V));
    /* a fork of the whole sequence continues as the source would */
    int32_t next = 77;
    CHECK_OK(ds_seq_fork(e, 1, 0, N));
    CHECK_OK(feed(e, 1, &next, 1, got));
    CHECK_OK(feed(e, 0, &next, 1, ref));
    CHECK(max_diff(got, ref, V) == 0);
    /* bad arguments name what was wrong */
    CHECK(ds_seq_fork(e, 3, 0, 1) == DS_ERR_RANGE && strstr(ds_last_error(), "sequence 3"));
    CHECK(ds_seq_fork(e, 1, 0, N + 5) == DS_ERR_RANGE && strstr(ds_last_error(), "length"));
    CHECK(ds_seq_truncate(e, 0, -1) == DS_ERR_RANGE);
    int32_t bad = 5000;
    ds_batch bb = {1, &bad, NULL, NULL};
    CHECK(ds_decode(e, &bb) == DS_ERR_RANGE && strstr(ds_last_error(), "5000"));
    CHECK(ds_seq_len(e, 0) == N + 1); /* a failed pass leaves the slots as they were */
    free(ref);
    free(got);
    ds_engine_free(e);
}

/* Three sequences of different lengths, decode steps batched and one at a time. */
static void test_batch(void)
{
    ds_engine *e = load(DS_ATTENTION_ABSORB, 3);
    if (!e) return;
    int V = ds_engine_n_vocab(e);
    float *one = malloc(sizeof(float) * 3 * V), *all = malloc(sizeof(float) * 3 * V);
    int lens[3] = {3, 7, 5};
    for (int q = 0; q < 3; q++) CHECK_OK(feed(e, q, k_toks + q, lens[q], NULL));
    int32_t step[3] = {11, 12, 13};
    int seqs[3] = {0, 1, 2};
    for (int q = 0; q < 3; q++) CHECK_OK(feed(e, q, &step[q], 1, one + (size_t)q * V));
    for (int q = 0; q < 3; q++) CHECK_OK(ds_seq_truncate(e, q, lens[q]));
    bool want[3] = {true, true, true};
    ds_batch b = {3, step, seqs, want};
    CHECK_OK(ds_decode(e, &b));
    CHECK(ds_n_logits(e) == 3);
    for (int q = 0; q < 3; q++) {
        memcpy(all + (size_t)q * V, ds_logits(e, q), sizeof(float) * V);
        float d = max_diff(all + (size_t)q * V, one + (size_t)q * V, V), m = max_abs(one + (size_t)q * V, V);
        CHECK_MSG(d <= 1e-4f * m + 1e-6f, "sequence %d: batched differs by %g (max %g)", q, d, m);
        CHECK(ds_seq_len(e, q) == lens[q] + 1);
    }
    /* the device pick: the argmax of each row */
    for (int q = 0; q < 3; q++) CHECK_OK(ds_seq_truncate(e, q, lens[q]));
    int32_t next[3];
    CHECK_OK(ds_decode_pick(e, &b, NULL, next));
    for (int q = 0; q < 3; q++) CHECK(next[q] == ds_argmax(all + (size_t)q * V, V));
    /* a sampled pick through ds_decode_pick equals ds_decode + ds_sampler_sample, same seed */
    ds_sampler_params sp = ds_sampler_default_params();
    sp.temperature = 1.0f;
    sp.top_k = 20;
    sp.repetition_penalty = 1.3f;
    sp.seed = 5;
    ds_token_sampler *s1, *s2;
    CHECK_OK(ds_sampler_new(&sp, V, &s1));
    CHECK_OK(ds_sampler_new(&sp, V, &s2));
    ds_token_sampler *ss[3] = {s1, NULL, NULL};
    for (int q = 0; q < 3; q++) CHECK_OK(ds_seq_truncate(e, q, lens[q]));
    CHECK_OK(ds_decode_pick(e, &b, ss, next));
    int32_t hist[16];
    float *row = malloc(sizeof(float) * V); /* ds_sampler_sample changes the row it is given */
    memcpy(hist, ds_seq_tokens(e, 0), sizeof(int32_t) * (size_t)(lens[0] + 1));
    memcpy(row, all, sizeof(float) * V);
    CHECK(next[0] == ds_sampler_sample(s2, row, hist, lens[0] + 1));
    ds_sampler_free(s1);
    ds_sampler_free(s2);
    /* with a presence penalty the picks are the host sampler's: the same again */
    sp.presence_penalty = 2.0f;
    sp.frequency_penalty = 0.5f;
    CHECK_OK(ds_sampler_new(&sp, V, &s1));
    CHECK_OK(ds_sampler_new(&sp, V, &s2));
    ss[0] = s1;
    for (int q = 0; q < 3; q++) CHECK_OK(ds_seq_truncate(e, q, lens[q]));
    CHECK_OK(ds_decode_pick(e, &b, ss, next));
    memcpy(hist, ds_seq_tokens(e, 0), sizeof(int32_t) * (size_t)(lens[0] + 1));
    memcpy(row, all, sizeof(float) * V);
    CHECK(next[0] == ds_sampler_sample(s2, row, hist, lens[0] + 1));
    free(row);
    for (int q = 1; q < 3; q++) CHECK(next[q] == ds_argmax(all + (size_t)q * V, V));
    ds_sampler_free(s1);
    ds_sampler_free(s2);
    /* random KV rows for benchmarks: a length and no tokens */
    CHECK_OK(ds_seq_fill_random(e, 2, 9, 42));
    CHECK(ds_seq_len(e, 2) == 9 && ds_seq_tokens(e, 2)[0] == -1 && ds_seq_common_prefix(e, 2, k_toks, N) == 0);
    CHECK(ds_seq_fill_random(e, 2, 65, 42) == DS_ERR_RANGE);
    free(one);
    free(all);
    ds_engine_free(e);
}

typedef struct {
    int tokens, cancel_after, asked;
} hooks;

static int on_token(void *u, int i, int32_t t)
{
    hooks *h = u;
    (void)i;
    (void)t;
    return ++h->tokens == 3; /* stop after the third */
}

static int cancel(void *u)
{
    hooks *h = u;
    return ++h->asked > h->cancel_after;
}

static void test_generate(void)
{
    ds_engine *e = load(DS_ATTENTION_ABSORB, 2);
    if (!e) return;
    int V = ds_engine_n_vocab(e);
    const int32_t *prompt = k_toks;
    int len = 6;
    ds_generate_params gp = ds_generate_default_params();
    gp.max_new_tokens = 5;
    ds_completion c;
    CHECK_OK(ds_generate(e, 1, NULL, &prompt, &len, NULL, &gp, &c));
    CHECK(c.n_tokens == 5 && c.finish == DS_FINISH_LENGTH);
    /* greedy = the argmax chain of ds_decode in sequence 1 */
    int32_t t[N + 8];
    memcpy(t, k_toks, sizeof(int32_t) * (size_t)len);
    float *lg = malloc(sizeof(float) * N * V);
    CHECK_OK(feed(e, 1, t, len, lg));
    for (int i = 0; i < 5; i++) {
        t[len + i] = ds_argmax(lg + (size_t)(i ? 0 : len - 1) * V, V);
        CHECK_MSG(t[len + i] == c.tokens[i], "token %d: generate %d, decode chain %d", i, c.tokens[i], t[len + i]);
        if (i < 4) CHECK_OK(feed(e, 1, &t[len + i], 1, lg));
    }
    /* the next turn reuses the slot's prefix: only the new tokens are computed */
    ds_engine_stats st0, st1;
    ds_engine_get_stats(e, &st0);
    int32_t turn[N + 8];
    memcpy(turn, k_toks, sizeof(int32_t) * (size_t)len);
    memcpy(turn + len, c.tokens, sizeof(int32_t) * 5);
    turn[len + 5] = 9;
    turn[len + 6] = 10;
    int tl = len + 7;
    const int32_t *tp = turn;
    ds_free(c.tokens);
    CHECK_OK(ds_generate(e, 1, NULL, &tp, &tl, NULL, &gp, &c));
    ds_engine_get_stats(e, &st1);
    /* the slot held prompt + 4 fed tokens (the fifth was never fed): 3 new */
    CHECK_MSG(st1.prefill_tokens - st0.prefill_tokens == 3, "prefill computed %ld tokens",
              st1.prefill_tokens - st0.prefill_tokens);
    ds_free(c.tokens);
    /* the stop hook: three tokens, then stopped */
    hooks h = {0, 1000, 0};
    gp.max_new_tokens = 10;
    gp.on_token = on_token;
    gp.on_token_user = &h;
    int seq1 = 1;
    CHECK_OK(ds_generate(e, 1, &seq1, &prompt, &len, NULL, &gp, &c));
    CHECK(c.n_tokens == 3 && c.finish == DS_FINISH_STOPPED);
    ds_free(c.tokens);
    /* the cancel hook: asked before every pass; after two, everything stops */
    hooks hc = {0, 2, 0};
    gp.on_token = NULL;
    gp.cancel = cancel;
    gp.cancel_user = &hc;
    CHECK_OK(ds_seq_truncate(e, 0, 0));
    CHECK_OK(ds_generate(e, 1, NULL, &prompt, &len, NULL, &gp, &c));
    CHECK_MSG(c.finish == DS_FINISH_CANCELLED && c.n_tokens >= 1 && c.n_tokens < 10, "cancel: %d tokens, finish %d",
              c.n_tokens, c.finish);
    ds_free(c.tokens);
    /* until the context end */
    gp = ds_generate_default_params();
    gp.max_new_tokens = -1;
    CHECK_OK(ds_generate(e, 1, NULL, &prompt, &len, NULL, &gp, &c));
    CHECK_MSG(c.finish == DS_FINISH_CONTEXT && c.n_tokens == ds_engine_n_ctx(e) - len + 1, "%d tokens, finish %d",
              c.n_tokens, c.finish);
    ds_free(c.tokens);
    /* arguments */
    int dup[2] = {1, 1};
    const int32_t *pp[2] = {prompt, prompt};
    int ll[2] = {len, len};
    CHECK(ds_generate(e, 2, dup, pp, ll, NULL, &gp, &c) == DS_ERR_ARG && strstr(ds_last_error(), "twice"));
    int long_len = 100;
    int32_t *lp = calloc(100, sizeof(int32_t));
    const int32_t *lpp = lp;
    CHECK(ds_generate(e, 1, NULL, &lpp, &long_len, NULL, &gp, &c) == DS_ERR_RANGE && strstr(ds_last_error(), "exceeds"));
    free(lp);
    free(lg);
    ds_engine_free(e);
}

static void test_sampler_args(void)
{
    struct {
        float temp, top_p, rep;
        int top_k;
        const char *field;
    } bad[] = {{-0.5f, 1, 1, 0, "temperature"}, {1, 0, 1, 0, "top_p"}, {1, 1.5f, 1, 0, "top_p"},
               {1, 1, 1, -1, "top_k"},          {1, 1, 0, 0, "repetition_penalty"}, {NAN, 1, 1, 0, "temperature"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ds_sampler_params p = ds_sampler_default_params();
        p.temperature = bad[i].temp;
        p.top_p = bad[i].top_p;
        p.repetition_penalty = bad[i].rep;
        p.top_k = bad[i].top_k;
        ds_token_sampler *s = (ds_token_sampler *)1;
        CHECK(ds_sampler_new(&p, 100, &s) == DS_ERR_ARG && s == NULL);
        CHECK_MSG(strstr(ds_last_error(), bad[i].field), "case %zu: '%s'", i, ds_last_error());
    }
    ds_sampler_params p = ds_sampler_default_params();
    p.presence_penalty = INFINITY;
    ds_token_sampler *s;
    CHECK(ds_sampler_new(&p, 100, &s) == DS_ERR_ARG && strstr(ds_last_error(), "presence_penalty"));
    /* presence and frequency: a token seen twice loses presence + 2 frequency */
    p = ds_sampler_default_params();
    p.presence_penalty = 1.0f;
    p.frequency_penalty = 0.75f;
    CHECK_OK(ds_sampler_new(&p, 4, &s));
    float lg[4] = {3.0f, 2.9f, 0.0f, 0.0f};
    int32_t hist[3] = {0, 0, 2};
    CHECK(ds_sampler_sample(s, lg, hist, 3) == 1); /* 3 - 1 - 1.5 = 0.5 < 2.9 */
    CHECK(lg[0] == 0.5f && lg[2] == -1.75f);
    ds_sampler_free(s);
}

static void test_errors(void)
{
    ds_engine_params p = ds_engine_default_params();
    p.no_tokenizer = true;
    ds_engine *e = (ds_engine *)1;
    CHECK(ds_engine_load("/nonexistent/ckpt", &p, &e) != DS_OK && e == NULL);
    CHECK_MSG(strstr(ds_last_error(), "/nonexistent/ckpt"), "'%s'", ds_last_error());
    p.config_path = t_golden("config_tiny.json");
    p.device = "tpu";
    CHECK(ds_engine_load(t_golden("tiny_hf"), &p, &e) == DS_ERR_ARG && strstr(ds_last_error(), "tpu"));
    p.device = "cpu";
    p.n_ctx = 100000;
    CHECK(ds_engine_load(t_golden("tiny_hf"), &p, &e) == DS_ERR_RANGE && strstr(ds_last_error(), "max_seq_len"));
    p.n_ctx = 0;
    p.n_seq = -1;
    CHECK(ds_engine_load(t_golden("tiny_hf"), &p, &e) == DS_ERR_ARG && strstr(ds_last_error(), "n_seq"));
    ds_model_info_buf info;
    CHECK_OK(ds_read_model_info(t_golden("tiny_hf"), t_golden("config_tiny.json"), &info));
    CHECK(info.info.n_layers == 4 && info.info.n_vocab == 1024 && !strcmp(info.info.name, "tiny_hf"));
    CHECK(ds_api_version() == DSV3_API_VERSION && !strcmp(ds_version(), DSV3_VERSION));
}

static void test_tokenizer(void)
{
    const char *dir = tok_test_dir();
    ds_tokenizer *t;
    CHECK_OK(ds_tokenizer_load(dir, &t));
    if (!t) return;
    int32_t *ids;
    size_t n;
    CHECK_OK(ds_tokenize(t, "Hello world", 11, 0, &ids, &n));
    CHECK(n == 2 && ids[0] == 19923 && ids[1] == 2058);
    char *text;
    size_t len;
    CHECK_OK(ds_detokenize(t, ids, n, 0, &text, &len));
    CHECK(len == 11 && !strcmp(text, "Hello world"));
    ds_free(text);
    ds_free(ids);
    /* streaming: a character split over tokens comes out whole */
    CHECK_OK(ds_tokenize(t, "naïve 日本語 ok", strlen("naïve 日本語 ok"), 0, &ids, &n));
    ds_text_stream *s;
    CHECK_OK(ds_text_stream_new(t, 0, &s));
    char buf[64] = "";
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t l;
        CHECK_OK(ds_text_stream_push(s, ids[i], &p, &l));
        strncat(buf, p, l);
    }
    const char *p;
    size_t l;
    CHECK_OK(ds_text_stream_finish(s, &p, &l));
    strncat(buf, p, l);
    CHECK(!strcmp(buf, "naïve 日本語 ok"));
    ds_text_stream_free(s);
    ds_free(ids);
    /* the chat template: structs and JSON give the same ids */
    ds_chat_message m[2] = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Hi!"}};
    ds_chat_params cp = ds_chat_default_params();
    int32_t *a, *b;
    size_t na, nb;
    char *rendered;
    CHECK_OK(ds_chat_apply(t, m, 2, &cp, &rendered, &a, &na));
    CHECK_OK(ds_chat_apply_json(t, "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi!\"}]",
                                &cp, NULL, &b, &nb));
    CHECK(na == nb && na > 0 && !memcmp(a, b, sizeof(int32_t) * na));
    CHECK(strstr(rendered, "Be brief.") && strstr(rendered, "Hi!"));
    ds_free(a);
    ds_free(b);
    ds_free(rendered);
    /* the thinking flag, tools and a tool call reach the template as variables */
    cp.template_text = "{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}"
                       "[{{ m.tool_calls[0].function.name }}]{% endif %};{% endfor %}"
                       "{% if thinking %}T{% endif %}{% if tools %}{{ tools[0].name }}{% endif %}";
    cp.thinking = true;
    cp.tools = "[{\"name\": \"get_weather\"}]";
    ds_chat_message turn[3] = {{.role = "user", .content = "Hi!"},
                               {.role = "assistant", .content = "", .tool_calls = "[{\"function\": {\"name\": \"f\"}}]"},
                               {.role = "tool", .content = "sunny", .tool_call_id = "1"}};
    CHECK_OK(ds_chat_apply(t, turn, 3, &cp, &rendered, NULL, NULL));
    CHECK_MSG(rendered && !strcmp(rendered, "user:Hi!;assistant:[f];tool:sunny;Tget_weather"), "'%s'", rendered);
    ds_free(rendered);
    turn[1].tool_calls = "{not json";
    CHECK(ds_chat_apply(t, turn, 3, &cp, &rendered, NULL, NULL) == DS_ERR_ARG && strstr(ds_last_error(), "message 2"));
    cp = ds_chat_default_params();
    m[1].content = "caf\xe9";
    CHECK(ds_chat_apply(t, m, 2, &cp, NULL, &a, &na) == DS_ERR_ARG && strstr(ds_last_error(), "message 2"));
    m[1].content = "ok";
    m[1].role = "robot";
    CHECK(ds_chat_apply(t, m, 2, &cp, NULL, &a, &na) == DS_ERR_ARG && strstr(ds_last_error(), "robot"));
    ds_tokenizer_free(t);
}

int main(void)
{
    test_fork_truncate(DS_ATTENTION_ABSORB);
    test_fork_truncate(DS_ATTENTION_NAIVE);
    test_batch();
    test_generate();
    test_sampler_args();
    test_errors();
    test_tokenizer();
    return t_done("test_api");
}
