/* serve.h - `dsv3 serve`, an OpenAI-compatible HTTP server on the public API.
 *
 * Pieces, one file each:
 *   request.c  JSON body -> srv_request, validated, with OpenAI-style errors
 *              (no HTTP, no engine: the fuzz target links it alone)
 *   output.c   what turns sampled text into a reply: the stop-string matcher
 *              (across token boundaries) and the parser that splits
 *              <think> reasoning and DeepSeek tool-call sections
 *   sched.c    the scheduler thread: the only user of the ds_engine;
 *              continuous batching, chunked prefill, the prefix cache
 *   reply.c    OpenAI JSON objects: completions, chunks, usage, errors
 *   http.c     libmicrohttpd handlers, SSE, auth, limits, metrics
 *   page.c     the chat page served at GET /
 */
#ifndef DS_SERVE_H
#define DS_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "dsv3.h"

/* ---- a growable byte buffer */
typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

bool sb_add(sbuf *b, const char *s, size_t n);
bool sb_adds(sbuf *b, const char *s);
void sb_clear(sbuf *b);
void sb_free(sbuf *b);

/* ---- requests */

typedef enum { REQ_CHAT, REQ_COMPLETION } req_kind;

/* Limits a request is checked against (a 400 naming the field past one). */
typedef struct {
    int max_tokens;   /* per choice */
    int max_n;        /* choices per request */
    int max_messages;
    int max_stop;     /* stop strings */
    int max_stop_len; /* bytes of one stop string */
    size_t max_prompt_bytes;
    int max_top_logprobs;
} srv_limits;

srv_limits srv_default_limits(void);

/* An OpenAI-style error: HTTP status, type, code and the field at fault. */
typedef struct {
    int status;
    const char *type; /* "invalid_request_error", "server_error", ... */
    const char *code; /* NULL or "invalid_value", ... */
    char param[64];
    char message[512];
} srv_error;

void srv_err(srv_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

typedef struct {
    req_kind kind;
    char *model;
    char *messages_json;   /* chat: the messages normalised for ds_chat_apply_json */
    char *prompt;          /* completion: text prompt, or NULL */
    int32_t *prompt_ids;   /* completion: a prompt given as token ids */
    int n_prompt_ids;
    char *tools_json;      /* tools (a JSON array) unless tool_choice is "none" */
    char *template_vars;   /* chat_template_kwargs without thinking, or NULL */
    bool thinking;         /* V3.1's thinking switch */
    int max_tokens;        /* -1: until eos or the context end */
    int n;
    double temperature, top_p, presence_penalty, frequency_penalty, repetition_penalty;
    int top_k;
    bool has_seed;
    uint64_t seed;
    char **stop;
    int n_stop;
    bool stream, include_usage;
    bool logprobs;
    int top_logprobs;
    bool echo;             /* completion: the prompt before the text */
    bool ignore_eos;       /* generate max_tokens whatever (benchmarks; vLLM's field) */
} srv_request;

/* Parses and validates body (len bytes, not NUL-terminated) as a request of
 * kind. Returns 0 and fills *out (req_free), or -1 with *err set (4xx). */
int req_parse(const char *body, size_t len, req_kind kind, const srv_limits *lim, srv_request *out, srv_error *err);
void req_free(srv_request *r);

/* ---- output text: stop strings and the reply parser */

/* Holds back the tail of the text that may begin a stop string, so that a stop
 * split over tokens is found and never sent. */
typedef struct {
    char **stop;
    int n_stop;
    sbuf held;
} stop_matcher;

void stop_init(stop_matcher *m, char **stop, int n_stop);
/* Appends to out the text that can no longer be part of a stop string. Returns
 * true when a stop string is complete: out ends just before it. */
bool stop_push(stop_matcher *m, const char *text, size_t n, sbuf *out);
/* The held-back text at the end of generation. */
void stop_flush(stop_matcher *m, sbuf *out);
void stop_free(stop_matcher *m);

/* Splits the generated text into reasoning (inside <think>...</think>),
 * content, and a DeepSeek tool-call section (<｜tool▁calls▁begin｜>...),
 * holding back the text that may begin a marker. */
typedef enum { OUT_CONTENT, OUT_REASONING, OUT_TOOLS } out_state;
typedef struct {
    out_state state;
    bool any_content;  /* content other than white space has been sent */
    bool after_think;  /* a </think> was seen */
    sbuf held, tools;
    /* streaming the tool calls (outp_call_deltas) */
    int sections_done; /* call sections (<｜tool▁call▁begin｜>...) handed out */
    int calls_sent;    /* of them, calls (the index of the next one) */
    bool named;        /* the current section's first delta is out */
} out_parser;

/* in_reasoning: the prompt ended inside <think> (the template opened it). */
void outp_init(out_parser *p, bool in_reasoning);
void outp_push(out_parser *p, const char *text, size_t n, sbuf *content, sbuf *reasoning);
void outp_finish(out_parser *p, sbuf *content, sbuf *reasoning);
/* The tool calls found, as an OpenAI tool_calls array (new reference), or NULL.
 * Ids are "call_<index>_<salt>". */
json_t *outp_tool_calls(const out_parser *p, uint64_t salt);
/* The tool calls as OpenAI streams them: for each call a first delta
 * {index, id, type, function: {name, arguments: ""}} as soon as its name is
 * complete, then {index, function: {arguments}} when the call is (final: the
 * text ended, a call cut short is taken as it is). Returns an array of the
 * deltas new since the last call (new reference), or NULL. Indices and ids
 * are outp_tool_calls' for the same text and salt. */
json_t *outp_call_deltas(out_parser *p, bool final, uint64_t salt);
void outp_free(out_parser *p);

/* Whether prompt text (the rendered chat) leaves the model inside <think>. */
bool prompt_opens_think(const char *text, size_t n);

/* ---- the server */

typedef struct {
    const char *ckpt, *config, *host, *api_key_file, *device, *model_name;
    int port, parallel, ctx, threads, queue, timeout_s, prefill_chunk;
    int spec_draft;   /* speculative decoding with the MTP module: tokens drafted a step (0: off) */
    size_t max_body;
    size_t cache_mem; /* bytes of KV-cache slots kept for the prefix cache beyond --parallel */
    srv_limits limits;
} srv_options;

srv_options srv_default_options(void);

/* Runs the server until SIGINT/SIGTERM; prints its URL once it listens.
 * Returns 0 on a clean stop, 1 after printing why it could not run. */
int srv_run(const srv_options *o);

/* The chat page (NUL-terminated HTML). */
extern const char srv_page_html[];

#endif
