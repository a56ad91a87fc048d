/* dsv3.h - public C API of libdsv3, a C engine for DeepSeek-V3-family models.
 *
 * The one header a program includes. It loads a checkpoint onto a device
 * (ds_engine), tokenizes and renders chats (ds_tokenizer), evaluates batches
 * of tokens of several sequences that own KV-cache slots (fork and truncate
 * them for chat turns, prefix reuse and speculative decoding), samples
 * (ds_token_sampler) and generates with a per-token callback and a cancel
 * hook. A short program is in examples/simple.c.
 *
 * Conventions:
 *   - Every fallible call returns a ds_status; on failure ds_last_error() gives
 *     a message naming what was wrong and what was expected. The library never
 *     exits and never prints.
 *   - Every object has a params struct filled by its *_default_params()
 *     function; set the fields you need and leave the rest, so that fields
 *     added later never break a caller.
 *   - Memory the library returns for the caller to own (token arrays, text) is
 *     released with ds_free().
 *   - Token ids are int32_t; a sequence is a KV-cache slot index in
 *     [0, ds_engine_n_seq()).
 *
 * Thread-safety: a ds_tokenizer is read-only once loaded, and any number of
 * threads may use it at once. A ds_engine, its sequences and a
 * ds_token_sampler are used by one thread at a time (the caller serialises).
 * Engines share process-wide state (the OpenMP thread count, the GPU backend),
 * so a process runs one engine at a time. ds_last_error() is per thread.
 *
 * Several processes (MPI tensor parallelism, `mpirun -np N`): every rank
 * calls the same functions in the same order with the same arguments; rank 0
 * alone reads input and writes output (ds_dist_*). */
#ifndef DSV3_H
#define DSV3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define DS_API
#elif defined(__GNUC__)
#define DS_API __attribute__((visibility("default")))
#else
#define DS_API
#endif

/* The API's version: raised when a function, type or field is added or
 * changed (callers may test it with #if). */
#define DSV3_API_VERSION 7
#define DSV3_VERSION "0.1.0"

/* ------------------------------------------------------------------ status */

typedef enum {
    DS_OK = 0,
    DS_ERR_IO,          /* a file could not be read or written */
    DS_ERR_FORMAT,      /* a file's contents are malformed */
    DS_ERR_ARG,         /* a flag, option or argument is invalid */
    DS_ERR_NOMEM,       /* an allocation failed */
    DS_ERR_RANGE,       /* a value is outside what is allowed (token id, length) */
    DS_ERR_UNSUPPORTED, /* valid but not supported by this build */
    DS_ERR_COMM,        /* a peer process failed or a collective timed out */
    DS_ERR_INTERNAL     /* a bug: an invariant did not hold */
} ds_status;

/* The message recorded by the last failing call on this thread ("" if none). */
DS_API const char *ds_last_error(void);

/* A short name for a status ("io error", "format error", ...). */
DS_API const char *ds_status_name(ds_status s);

#if defined(__GNUC__)
#define DS_API_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DS_API_PRINTF(a, b)
#endif
/* Records a formatted message as this thread's last error and returns code,
 * for callers that report through the same channel (callbacks, tools). */
DS_API ds_status ds_errorf(ds_status code, const char *fmt, ...) DS_API_PRINTF(2, 3);
/* Prefixes the last error's message with "<prefix>: " and returns code. */
DS_API ds_status ds_error_prefix(ds_status code, const char *fmt, ...) DS_API_PRINTF(2, 3);

/* The library's version string (DSV3_VERSION of the build) and API version. */
DS_API const char *ds_version(void);
DS_API int ds_api_version(void);

/* Releases memory the library returned for the caller to own (NULL is fine). */
DS_API void ds_free(void *p);

/* ------------------------------------------------------- processes (MPI) */

/* A process group for tensor parallelism; NULL stands for "this process alone"
 * everywhere a ds_dist * is taken. */
typedef struct ds_comm ds_dist;

/* Starts the process group from the program's arguments (MPI may consume some).
 * *out is NULL when the process runs alone: a build without MPI, a program not
 * started by an MPI launcher, or a launch of one rank. */
DS_API ds_status ds_dist_init(int *argc, char ***argv, ds_dist **out);

/* Ends the group after a run (NULL is fine). If a collective failed, ends the
 * whole job instead of waiting for peers that may be stuck. */
DS_API void ds_dist_finish(ds_dist *d);

/* This process's rank and the number of ranks (0 and 1 when alone). */
DS_API int ds_dist_rank(const ds_dist *d);
DS_API int ds_dist_world_size(const ds_dist *d);

/* Collective: rank 0's *line (a NUL-terminated string, or NULL for "no more
 * input") replaces *line on every other rank (the old one freed with free(),
 * the new one malloc'ed). Waits without a deadline (rank 0 may be waiting for
 * a person). DS_OK at once when alone. */
DS_API ds_status ds_dist_broadcast_line(ds_dist *d, char **line);

/* Collective: DS_OK if every rank passes DS_OK, else every rank gets the
 * lowest failing rank's status and message ("rank R: ..."), and the failure
 * counts as agreed. Returns local when alone. */
DS_API ds_status ds_dist_agree(ds_dist *d, ds_status local);

/* Whether the last failure is known to every rank (through ds_dist_agree or a
 * collective inside the engine), so that every rank may exit normally. A
 * program's error path: when it is false, report and ds_dist_abort(). True
 * when alone. */
DS_API bool ds_dist_failure_agreed(const ds_dist *d);

/* Ends every process of the job with exit code code; does not return. When
 * alone, returns without doing anything. */
DS_API void ds_dist_abort(ds_dist *d, int code);

/* ------------------------------------------------------------ tokenizer */

typedef struct ds_tokenizer ds_tokenizer;

/* Loads dir/tokenizer.json and dir/tokenizer_config.json (bos, eos and the
 * chat template; may be absent: no template, bos and eos -1). The ids are
 * those of Hugging Face tokenizers on the same files. ~0.3 s for V3. */
DS_API ds_status ds_tokenizer_load(const char *dir, ds_tokenizer **out);
DS_API void ds_tokenizer_free(ds_tokenizer *t);

/* Ids below ds_tokenizer_n_vocab(); bos/eos are -1 when the files name none. */
DS_API int32_t ds_tokenizer_n_vocab(const ds_tokenizer *t);
DS_API int32_t ds_tokenizer_bos(const ds_tokenizer *t);
DS_API int32_t ds_tokenizer_eos(const ds_tokenizer *t);
/* The token's string as tokenizer.json stores it (byte-level form, "Ġworld"),
 * or NULL for an id without a token. */
DS_API const char *ds_token_piece(const ds_tokenizer *t, int32_t id);
/* Whether id is an added token marked special (what DS_DETOKENIZE_SKIP_SPECIAL skips). */
DS_API bool ds_token_is_special(const ds_tokenizer *t, int32_t id);
/* The id of an exact token string, or -1. */
DS_API int32_t ds_token_from_piece(const ds_tokenizer *t, const char *piece, size_t len);

/* ds_tokenize flag: special-token strings in the text become their ids (HF's
 * default); without it every byte is plain text (safe for user input). */
#define DS_TOKENIZE_PARSE_SPECIAL 1

/* Encodes len bytes of UTF-8 text; invalid UTF-8 becomes U+FFFD first (as HF).
 * Never adds bos/eos. *ids (ds_free) may be NULL when *n is 0. */
DS_API ds_status ds_tokenize(const ds_tokenizer *t, const char *text, size_t len, int flags, int32_t **ids,
                             size_t *n);

/* ds_detokenize and ds_text_stream flag: leave out special tokens. */
#define DS_DETOKENIZE_SKIP_SPECIAL 1

/* Decodes ids to NUL-terminated UTF-8 (ds_free; *len excludes the NUL). Bytes
 * that are not valid UTF-8 become U+FFFD. An id outside [0, n_vocab) is
 * DS_ERR_RANGE. */
DS_API ds_status ds_detokenize(const ds_tokenizer *t, const int32_t *ids, size_t n, int flags, char **text,
                               size_t *len);

/* Streaming decode: push ids one at a time and get the text they complete.
 * Bytes of a UTF-8 character split over tokens are held back until it is whole
 * (or U+FFFD once it cannot be), so the pieces concatenated equal
 * ds_detokenize() of all the ids. One stream per sequence. */
typedef struct ds_text_stream ds_text_stream;
DS_API ds_status ds_text_stream_new(const ds_tokenizer *t, int flags, ds_text_stream **out);
/* *text (owned by the stream, valid until the next call) receives *len bytes, maybe 0. */
DS_API ds_status ds_text_stream_push(ds_text_stream *s, int32_t id, const char **text, size_t *len);
/* The held-back bytes (each incomplete character as U+FFFD); the stream starts afresh. */
DS_API ds_status ds_text_stream_finish(ds_text_stream *s, const char **text, size_t *len);
DS_API void ds_text_stream_free(ds_text_stream *s);

/* ---------------------------------------------------------- chat template */

/* One message. role is "system", "user", "assistant" or "tool"; content is
 * UTF-8 (anything else is DS_ERR_ARG naming the message). The optional fields
 * are NULL when absent. */
typedef struct {
    const char *role;
    const char *content;
    const char *reasoning_content; /* an assistant's thinking (R1, V3.1) */
    const char *tool_calls;        /* an assistant's tool calls: a JSON array as OpenAI sends it */
    const char *tool_call_id;      /* a tool result's call id */
} ds_chat_message;

typedef struct {
    bool add_generation_prompt; /* end with the assistant's turn opening */
    bool thinking;              /* the template's `thinking` variable (V3.1's thinking mode) */
    const char *tools;          /* JSON array of tool definitions (the template's `tools`), or NULL */
    const char *extra_vars;     /* JSON object of more template variables, or NULL */
    const char *template_text;  /* a template instead of tokenizer_config.json's, or NULL */
    /* Special-token strings inside messages act as control tokens (the
     * reference's encode(render(...)) behaviour). Off: only the template's own
     * markup yields special tokens, so user text cannot forge a turn. */
    bool parse_special;
} ds_chat_params;

DS_API ds_chat_params ds_chat_default_params(void);

/* Renders messages with the chat template into *text (ds_free) and, when ids
 * is not NULL, encodes it (*ids ds_free, *n_ids). text may be NULL when only
 * the ids are wanted. A tokenizer without a template is DS_ERR_ARG. */
DS_API ds_status ds_chat_apply(const ds_tokenizer *t, const ds_chat_message *msgs, size_t n_msgs,
                               const ds_chat_params *p, char **text, int32_t **ids, size_t *n_ids);

/* The same from a JSON array of message objects ({"role", "content",
 * "tool_calls", "reasoning_content", ...}, as OpenAI's API takes them). */
DS_API ds_status ds_chat_apply_json(const ds_tokenizer *t, const char *messages_json, const ds_chat_params *p,
                                    char **text, int32_t **ids, size_t *n_ids);

/* ------------------------------------------------------------------ engine */

/* A model loaded onto a device with a KV cache of n_seq sequences. */
typedef struct ds_engine ds_engine;

typedef enum { DS_ATTENTION_ABSORB, DS_ATTENTION_NAIVE } ds_attention_impl;
typedef enum { DS_MATMUL_BF16, DS_MATMUL_FP8 } ds_matmul_impl;

typedef struct {
    const char *config_path;   /* reference-format JSON or HF config.json; NULL: <checkpoint>/config.json */
    const char *tokenizer_dir; /* NULL: the checkpoint directory */
    bool no_tokenizer;         /* load none (ds_engine_tokenizer() is NULL) */
    const char *device;        /* "cpu", "cuda" or "auto" (NULL: auto, CUDA when built in and present) */
    bool ref_kernels;          /* the scalar reference kernels (CPU only): slow, for checking */
    int n_threads;             /* CPU threads, process-wide, at most 1024 (0: OpenMP's default) */
    int n_ctx;                 /* positions per sequence (0: min(max_seq_len, 4096)) */
    int n_seq;                 /* sequences (KV-cache slots) (0: 1) */
    ds_attention_impl attention; /* absorb (the reference's default) or naive (full K and V cached) */
    ds_matmul_impl matmul;     /* FP8 weights: exact bf16 products, or the reference's FP8 act_quant path */
    /* Tuning: results do not depend on these beyond rounding. */
    int prefill_chunk;         /* prompt tokens per forward pass (0: the backend's choice) */
    int expand_min;            /* prefill passes of at least this many tokens use expanded attention (0: 384) */
    bool no_graphs;            /* run decode steps eagerly instead of replaying recorded ones */
    bool mtp;                  /* load the multi-token-prediction module (ds_decode_mtp; one process only;
                                * API version 2) */
    /* Logits that are NaN or infinite are always an error (DS_ERR_RANGE). With
     * check_numerics every layer's output is checked too, and the error names the
     * first layer that is not finite (slow: for finding where NaNs start; API 3). */
    bool check_numerics;
    ds_dist *dist;             /* the process group (NULL: alone); each rank loads its shard */
    /* CPU: the AVX-512 prefill GEMM even where AMX tiles could run it (the kernels
     * are then named "cpu-avx512", not "cpu-avx512-amx"; API 7) */
    bool no_amx;
} ds_engine_params;

DS_API ds_engine_params ds_engine_default_params(void);

/* A model's shape and names, from its config (and tokenizer when loaded). */
typedef struct {
    const char *name;     /* the checkpoint directory's name */
    int n_vocab, max_seq_len, max_batch_size;
    int n_layers, n_dense_layers, dim, n_heads;
    int n_routed_experts, n_activated_experts, n_shared_experts;
    int kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    bool fp8;             /* the config's dtype is fp8 */
} ds_model_info;

/* The shape a checkpoint's config gives, without loading anything else
 * (config_path NULL: <ckpt_dir>/config.json). name points into *out's own storage. */
typedef struct {
    ds_model_info info;
    char name_buf[64];
} ds_model_info_buf;
DS_API ds_status ds_read_model_info(const char *ckpt_dir, const char *config_path, ds_model_info_buf *out);

/* Loads the checkpoint in dir: model{rank}-mp{world}.safetensors as `dsv3
 * convert` writes them, or (one process) a Hugging Face directory; every
 * tensor's dtype and shape is checked against the config. Opens the device,
 * the tokenizer (unless no_tokenizer) and the KV cache. Under several
 * processes every rank calls it, and all fail or all succeed. */
DS_API ds_status ds_engine_load(const char *dir, const ds_engine_params *p, ds_engine **out);
DS_API void ds_engine_free(ds_engine *e);

DS_API const ds_model_info *ds_engine_info(const ds_engine *e);
DS_API int ds_engine_n_ctx(const ds_engine *e);
DS_API int ds_engine_n_seq(const ds_engine *e);
DS_API int ds_engine_n_vocab(const ds_engine *e);      /* the model's vocab_size (logit row length) */
DS_API int32_t ds_engine_eos(const ds_engine *e);      /* the tokenizer's, -1 without one */
DS_API int32_t ds_engine_bos(const ds_engine *e);
/* The kernels that run ("cpu-avx512", "cpu-ref", "cuda", ...). */
DS_API const char *ds_engine_device_name(const ds_engine *e);
/* Whether the model runs in host memory (the CPU) rather than a device's. */
DS_API bool ds_engine_on_host(const ds_engine *e);
/* The loaded tokenizer (owned by the engine), or NULL. */
DS_API const ds_tokenizer *ds_engine_tokenizer(const ds_engine *e);
/* The engine's process group (NULL: alone). */
DS_API ds_dist *ds_engine_dist(const ds_engine *e);
/* The first error a device recorded while running queued work since the last
 * call (DS_OK if none); ds_decode() reports its own errors already. */
DS_API ds_status ds_engine_check(ds_engine *e);

/* -------------------------------------------------------------- sequences */

/* A sequence (slot seq) holds the KV rows of the tokens fed to it, positions
 * 0 .. ds_seq_len() - 1; the engine remembers those tokens. */
DS_API int ds_seq_len(const ds_engine *e, int seq);
/* The tokens the slot holds (ds_seq_len() of them; -1 for positions filled by
 * ds_seq_fill_random). Valid until the slot next changes. */
DS_API const int32_t *ds_seq_tokens(const ds_engine *e, int seq);
/* Keeps the first len positions (0 empties the slot); the rest are forgotten
 * and overwritten by the next tokens fed. Costs nothing on the device. */
DS_API ds_status ds_seq_truncate(ds_engine *e, int seq, int len);
/* Makes slot dst hold the first len positions of slot src (len <=
 * ds_seq_len(src)): their KV rows are copied on the device. Evaluating dst
 * afterwards gives what recomputing those tokens would (bit for bit). */
DS_API ds_status ds_seq_fork(ds_engine *e, int dst, int src, int len);
/* How many leading tokens of toks the slot already holds. */
DS_API int ds_seq_common_prefix(const ds_engine *e, int seq, const int32_t *toks, int n);
/* For benchmarks: makes the slot hold len positions of random KV rows (no
 * tokens), seeded; attention costs the same whatever the values. */
DS_API ds_status ds_seq_fill_random(ds_engine *e, int seq, int len, uint64_t seed);

/* ---------------------------------------------------------------- batches */

/* n tokens, each appended to its sequence in order: token i goes to position
 * ds_seq_len(seq[i]) as it stands when earlier tokens of the batch are in. A
 * batch may mix sequences and lengths (prefill chunks beside decode steps). */
typedef struct {
    int n_tokens;
    const int32_t *token;
    const int *seq;         /* NULL: all of sequence 0 */
    const bool *logits;     /* which tokens' logits are wanted (NULL: the last token's) */
} ds_batch;

/* Runs the batch through the model (one forward pass). On success the wanted
 * tokens' logits are ds_logits(e, 0..k) in batch order. On failure the slots
 * are as they were. */
DS_API ds_status ds_decode(ds_engine *e, const ds_batch *b);

/* Row i (in batch order among the wanted tokens) of the last ds_decode's
 * logits: ds_engine_n_vocab() floats, owned by the engine, valid until the next
 * ds_decode. NULL when out of range. */
DS_API const float *ds_logits(const ds_engine *e, int i);
DS_API int ds_n_logits(const ds_engine *e);

/* ---- multi-token prediction (API version 2)
 * DeepSeek-V3's MTP module, loaded with the engine param mtp from the
 * checkpoint's layer num_hidden_layers (a Hugging Face directory or `dsv3
 * convert --keep-mtp` output). For the token t[p] of a sequence at position p,
 * given the next token t[p+1], it predicts t[p+2]:
 *   h' = eh_proj([enorm(embed(t[p+1])); hnorm(h[p])]),  h[p] the main model's
 *   final-normed hidden state at p;  h' = block(h');  logits = head(norm(h')).
 * The block attends causally over the sequence's MTP positions through its own
 * KV-cache layer in the slot (ds_seq_truncate and ds_seq_fork cover it): an MTP
 * row at position p reads the rows 0..p that earlier ds_decode_mtp calls wrote
 * for that sequence, so evaluate every position of a sequence, in order or in
 * one batch (as the module was trained), e.g. a prompt's positions 0..n-2 after
 * its ds_decode, then n-1 once t[n] is chosen. */
typedef struct {
    int n_rows;
    const int *index;          /* (n_rows) tokens of the last ds_decode batch, by batch index: their
                                * hidden state, sequence and position p (distinct) */
    const int32_t *next_token; /* (n_rows) the token at position p + 1 of each row's sequence */
} ds_mtp_batch;

/* Whether the engine loaded the MTP module. */
DS_API bool ds_engine_has_mtp(const ds_engine *e);

/* Runs the MTP module on rows of the last ds_decode batch (whose hidden states
 * the engine keeps in device memory until the next ds_decode or ds_decode_pick;
 * ds_generate does not keep them). The rows' tokens must still be in their
 * slots. On success row i's logits are ds_mtp_logits(e, i), valid until the
 * next ds_decode_mtp. */
DS_API ds_status ds_decode_mtp(ds_engine *e, const ds_mtp_batch *b);

/* A chained MTP pass (API 6): row i continues row from[i] of the last
 * ds_decode_mtp or ds_decode_mtp_chain call one position further in that
 * row's sequence, with the module's own output state at that row as its hidden
 * state, and next_token[i] the token one position after it: a draft made from
 * a draft (row r at position p predicted t[p+2]; its chained row, given that
 * token, predicts t[p+3]). The MTP block's KV-cache row at that position is
 * written (the sequence's slot may end before it: a drafted position). The
 * rows' logits replace the last call's. */
DS_API ds_status ds_decode_mtp_chain(ds_engine *e, int n_rows, const int *from, const int32_t *next_token);
DS_API const float *ds_mtp_logits(const ds_engine *e, int i);
DS_API int ds_n_mtp_logits(const ds_engine *e);

/* The first index of the largest of x[0..n) (NaNs never win), n >= 1. */
DS_API int32_t ds_argmax(const float *x, int n);

/* ---------------------------------------------------------------- sampler */

typedef struct ds_token_sampler ds_token_sampler;

typedef struct {
    float temperature;        /* 0: greedy (argmax); < 0 is DS_ERR_ARG */
    int top_k;                /* sample among the k most likely (0: off; < 0 is DS_ERR_ARG) */
    float top_p;              /* smallest set reaching probability p, in (0, 1] (1: off) */
    float repetition_penalty; /* > 0; CTRL's rule on tokens already in the sequence (1: off) */
    float presence_penalty;   /* subtracted once from each token already in the sequence (0: off) */
    float frequency_penalty;  /* subtracted per occurrence in the sequence (0: off) */
    uint64_t seed;            /* the draws' stream: the same seed gives the same tokens */
} ds_sampler_params;

/* Greedy; every penalty off; seed 965 (the reference's). */
DS_API ds_sampler_params ds_sampler_default_params(void);

/* A sampler for rows of n_vocab logits. Settings out of range are DS_ERR_ARG
 * naming the field. Order: repetition penalty, presence and frequency
 * penalties, temperature, top-k, top-p, the draw. */
DS_API ds_status ds_sampler_new(const ds_sampler_params *p, int n_vocab, ds_token_sampler **out);
DS_API void ds_sampler_free(ds_token_sampler *s);
DS_API const ds_sampler_params *ds_sampler_params_of(const ds_token_sampler *s);

/* Picks a token from logits (n_vocab floats; modified). history: the
 * sequence's tokens so far, for the penalties (NULL with n 0 when none). */
DS_API int32_t ds_sampler_sample(ds_token_sampler *s, float *logits, const int32_t *history, int n_history);

/* As ds_decode with every token's logits wanted, but each token's next token
 * is picked into next[i] by samplers[i] (samplers NULL, or samplers[i] NULL:
 * greedy) with the sequence's tokens as history, where the backend can on the
 * device, so that the logits are not downloaded. Equal to ds_decode followed by
 * ds_sampler_sample. ds_logits() is not available afterwards. */
DS_API ds_status ds_decode_pick(ds_engine *e, const ds_batch *b, ds_token_sampler *const *samplers, int32_t *next);

/* --------------------------------------------------------------- generate */

/* Called with each new token of sequence seqs[index]; return non-zero to stop
 * that sequence (the token is kept). */
typedef int (*ds_token_fn)(void *user, int index, int32_t token);
/* Asked before every forward pass; return non-zero to stop the whole call. */
typedef int (*ds_cancel_fn)(void *user);

typedef struct {
    int max_new_tokens;     /* per sequence (< 0: until eos or the context end); default 200 */
    int32_t eos;            /* the end-of-sequence token (default -2: the tokenizer's; -1: none) */
    ds_token_fn on_token;
    void *on_token_user;
    ds_cancel_fn cancel;
    void *cancel_user;
    /* Speculative decoding with the MTP module (engine param mtp; API 2): 0 off,
     * N in 1..DS_SPEC_MAX_DRAFT (API 4): each step drafts N tokens with the module
     * (chained on its own output) and checks them in one batched pass of the main
     * model beside the next token, so it yields 1 to N + 1 tokens a sequence. The
     * sequences step together, each keeping its own accepted length. Greedy, the
     * output is plain greedy decoding's; sampling (API 4), a draft is kept with
     * probability min(1, p/q) (p the model's, q the draft's distribution, both
     * after the sampler's penalties, temperature, top-k and top-p) and a rejected
     * one replaced from norm(max(0, p - q)), so the tokens are distributed as
     * plain sampling's (not the same draws). Each prompt is computed whole (no
     * prefix reuse). ds_engine_stats counts the steps, drafts and accepted. */
    int spec_draft;
} ds_generate_params;

/* The longest draft of ds_generate_params.spec_draft (API 4). */
#define DS_SPEC_MAX_DRAFT 7

DS_API ds_generate_params ds_generate_default_params(void);

typedef enum {
    DS_FINISH_EOS,       /* the model produced eos (not included in the tokens) */
    DS_FINISH_LENGTH,    /* max_new_tokens reached */
    DS_FINISH_CONTEXT,   /* the sequence reached the context end */
    DS_FINISH_STOPPED,   /* on_token asked to stop */
    DS_FINISH_CANCELLED  /* cancel asked to stop */
} ds_finish;

typedef struct {
    int32_t *tokens;     /* the completion (ds_free), eos excluded */
    int n_tokens;
    ds_finish finish;
} ds_completion;

/* Generates for n prompts at once in slots seqs[0..n) (NULL: 0..n-1; distinct):
 * each slot keeps the longest prefix of its prompt it already holds (the
 * previous turn of a chat) and computes the rest in chunks, then the
 * sequences decode in lockstep, one batched step for all. The slots end up
 * holding prompt + completion. samplers[i] NULL is greedy. out[i] receives
 * sequence i's completion; on a cancel the call returns DS_OK with what was
 * made. A prompt longer than the context is DS_ERR_RANGE. */
DS_API ds_status ds_generate(ds_engine *e, int n, const int *seqs, const int32_t *const *prompts, const int *lens,
                             ds_token_sampler *const *samplers, const ds_generate_params *p, ds_completion *out);

/* Since the engine was loaded: prompt tokens computed and their seconds, decode
 * tokens and the decode loop's seconds (ds_generate); prefill passes that ran
 * out of memory and were retried shorter, and the pass length now used. */
typedef struct {
    long prefill_tokens, decode_tokens;
    double prefill_seconds, decode_seconds;
    int prefill_shortened, prefill_chunk;
    long spec_drafted, spec_accepted; /* speculative drafts (spec_draft) made and accepted (API 2) */
    /* main passes that checked drafts, and of those, how many accepted k drafts
     * (spec_accept_len[k], k <= DS_SPEC_MAX_DRAFT) (API 4) */
    long spec_steps, spec_accept_len[DS_SPEC_MAX_DRAFT + 1];
    /* seconds of the speculative decode loop in the MTP module's passes (the
     * drafts, picks included) and in the main passes that check them (API 5) */
    double spec_draft_seconds, spec_check_seconds;
} ds_engine_stats;
DS_API void ds_engine_get_stats(const ds_engine *e, ds_engine_stats *out);

/* ---------------------------------------------------- measurement (bench) */

/* The CPU threads (OpenMP, process-wide): set (n >= 1) and read. */
DS_API void ds_set_threads(int n);
DS_API int ds_threads(void);

/* The limits a run is bounded by, measured on this machine now. */
typedef struct {
    bool gpu;              /* measured on a GPU (copy bandwidth, tensor cores) */
    double bandwidth_gbps; /* CPU: read bandwidth of 1 GiB of fresh memory, best of 10;
                              GPU: device copy bandwidth, bytes read plus written */
    double fma_gflops;     /* CPU: f32 FMA peak over all threads (0 on a GPU) */
    double bf16_gflops;    /* CPU: bf16 dot-product peak (0 without AVX512_BF16); GPU: bf16 tensor cores */
    double amx_gflops;     /* CPU: AMX bf16 tile peak (0 where AMX does not run; API 7) */
} ds_limits;

/* Measures the limits of device ("cpu", "cuda", "auto"; ref_kernels picks the
 * CPU as the engine would). Under several processes on one machine rank 0
 * measures with every rank's threads while the others wait (a collective). */
DS_API ds_status ds_measure_limits(const char *device, bool ref_kernels, ds_dist *d, ds_limits *out);

/* Reads a byte of every page of the engine's weights so that later timing sees
 * no page faults; *bytes: the checkpoint's size (this rank's shards). */
DS_API void ds_engine_touch_weights(const ds_engine *e, size_t *bytes);

/* Read bandwidth over the engine's own mapped weights (its largest shard, up
 * to 1 GiB), best of reps passes, in GB/s; 0 where it does not apply (a GPU,
 * several processes, a shard under 256 MiB). */
DS_API double ds_engine_weights_bandwidth(const ds_engine *e, int reps);

/* Weight bytes one forward pass reads (FP8 block scales included), or the
 * weight elements it multiplies, when each MoE layer touches `experts` routed
 * experts and the output head is counted `head` times. This rank's shard. */
DS_API double ds_engine_pass_bytes(const ds_engine *e, double experts, int head);
DS_API double ds_engine_pass_params(const ds_engine *e, double experts, int head);
/* Weight bytes one pass of the MTP module reads when its MoE layer touches
 * `experts` routed experts: eh_proj, the block and the head (0 without the
 * module; API 4). */
DS_API double ds_engine_mtp_bytes(const ds_engine *e, double experts);
/* The weights' format: "fp8", "bf16" or "f32". */
DS_API const char *ds_engine_weight_dtype(const ds_engine *e);
/* Bytes of the KV cache of one sequence of n_ctx positions (this rank's heads). */
DS_API size_t ds_engine_kv_bytes(const ds_engine *e);

/* Where a CPU decode step's time goes (dsv3 bench --profile): the decode
 * products by weight bytes a call, the attention, the per-head transposed
 * products and the routed experts the MoE layers ran. Counting is process-wide and meant for one pass at a time. */
typedef struct {
    long calls;
    double bytes;   /* weight bytes the calls read (0 for the attention) */
    double seconds;
} ds_profile_stat;
#define DS_PROFILE_SIZES 48 /* products[k]: calls of more than 2^(k-1), at most 2^k bytes */
typedef struct {
    ds_profile_stat products[DS_PROFILE_SIZES];
    ds_profile_stat attention, heads_t;
    long moe_calls;   /* MoE layers run (a layer a pass), by the CPU kernels */
    double experts;   /* the distinct routed experts they ran, summed */
} ds_profile;
/* Turns counting on (from zero) or off. */
DS_API void ds_profile_enable(bool on);
DS_API void ds_profile_read(ds_profile *out);

/* ---------------------------------------------------------------- files */

/* Writes a safetensors file holding one F32 tensor `name` of (rows, cols),
 * written aside and renamed into place. */
DS_API ds_status ds_save_f32(const char *path, const char *name, const float *data, int64_t rows, int64_t cols);

#ifdef __cplusplus
}
#endif
#endif
