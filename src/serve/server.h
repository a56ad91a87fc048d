/* server.h - what the HTTP threads and the scheduler thread share.
 *
 * One mutex (srv.mu) guards the queue, every job's output buffer and flags,
 * and the metrics. The engine, the slots and the per-choice decoding state are
 * the scheduler thread's alone. A job is owned by two references, the HTTP
 * connection's and the scheduler's; the last to let go frees it.
 *
 * A connection with nothing to send is suspended (MHD), with job.suspended
 * set under srv.mu; whoever gives it something to send clears the flag under
 * srv.mu and resumes it (srv_resume) after unlocking. A suspended connection
 * is not closed by MHD, so its job and socket stay valid until then. */
#ifndef DS_SERVE_SERVER_H
#define DS_SERVE_SERVER_H

#include <pthread.h>

#include "serve.h"

typedef struct srv srv;

/* One of a request's n choices: a sequence being decoded in a slot. */
typedef struct {
    int slot;                /* -1 before admission and after release */
    ds_token_sampler *smp;
    ds_text_stream *ts;
    stop_matcher stop;
    out_parser parser;
    int32_t pending;         /* the token fed at the next step */
    int n_gen;
    const char *finish;      /* NULL while running */
    sbuf content, reasoning; /* the whole reply (not streamed) */
    json_t *logprobs;        /* chat: content entries; completion: the legacy object */
    json_t *tool_calls;      /* parsed at the end (not streamed) */
    int calls_sent;          /* tool calls streamed so far */
    bool role_sent;
    /* speculative decoding (--spec): whether this choice drafts (greedy, n 1);
     * the row of the last main pass that holds its last fed position (-1: none
     * of its own yet), and the rows before it whose drafts were accepted, the
     * MTP module's rows to write before the next drafts; this step's drafts and
     * where its rows start in the main pass */
    bool spec;
    int hl, n_pend, nd, off;
    int pend_idx[DS_SPEC_MAX_DRAFT];
    int32_t pend_tok[DS_SPEC_MAX_DRAFT], d[DS_SPEC_MAX_DRAFT];
} choice;

typedef enum { JOB_QUEUED, JOB_PREFILL, JOB_DECODE, JOB_DONE } job_state;

typedef struct job {
    struct job *next;
    srv *s;
    srv_request req;
    int32_t *prompt;
    int n_prompt;
    char *prompt_text;       /* completion echo */
    bool in_reasoning;       /* the rendered prompt opened <think> */
    char id[48];
    long created;
    double t_start, t_first, deadline;
    /* scheduler-only */
    job_state state;
    int n_fed;               /* prompt tokens in choice 0's slot */
    int cached;              /* of them, taken from the prefix cache */
    int max_new;
    choice *ch;
    int completion_tokens;
    sbuf stage;              /* SSE events of this step, published under srv.mu at its end */
    sbuf chunk_head;         /* what each streamed chunk starts with, up to the choice index */
    /* under srv.mu */
    sbuf out;                /* SSE events, or the whole body when finished */
    size_t sent;             /* bytes of out handed to the connection */
    int status;              /* HTTP status of a non-streamed reply */
    bool finished, cancelled;
    int refs;
    void *conn;              /* its MHD connection */
    int fd;                  /* the connection's socket (-1: unknown) */
    bool suspended;          /* the connection waits for output */
    double last_out;         /* when out last grew */
    struct job *live_prev, *live_next; /* srv.live: jobs whose connection is open */
} job;

typedef struct {
    long requests[6];        /* by class: 2xx, 400, 401/403/404/405, 413, 503, 5xx */
    long prompt_tokens, completion_tokens, cache_hit_tokens, cancelled;
    int queue_depth, running, batch_tokens, cache_tokens;
    long ttft_bucket[12], step_bucket[12];
    double ttft_sum, step_sum;
    double sched_engine_s, sched_other_s; /* the scheduler's busy time: in the engine, its own */
    long sched_steps;
    long ttft_count, step_count;
    long spec_drafted, spec_accepted; /* speculative drafts made and accepted (--spec) */
} srv_metrics;

struct srv {
    srv_options o;
    ds_engine *e;
    const ds_tokenizer *tok;
    char model_name[128];
    int ready;               /* 0 loading, 1 serving (under mu) */
    int n_ctx;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    job *q_head, *q_tail;
    job *live;               /* jobs with an open connection (watched for disconnects) */
    int n_queued;
    int n_conns;             /* requests between their first call and on_completed */
    bool stopping;
    srv_metrics m;
    pthread_t sched;         /* the watcher: signals, disconnects, deadlines, keep-alives
                              * (the scheduler runs on the main thread) */
    uint64_t salt;
};

/* Takes j's connection off suspension if it is on it (the caller holds
 * s->mu); returns the connection to pass to srv_resume after unlocking, or NULL. */
void *job_unsuspend_locked(job *j);
/* Resumes a connection job_unsuspend_locked returned (s->mu not held). */
void srv_resume(void *conn);
/* Drops one reference (the caller holds s->mu); frees the job at zero. */
void job_unref_locked(job *j);
/* Appends an SSE event "data: <json>\n\n" to out (and frees obj). */
void sse_append(sbuf *out, json_t *obj);
/* The same to j->out (the caller holds s->mu). */
void job_sse_locked(job *j, json_t *obj);

/* The scheduler: runs on the calling thread until s->stopping; false when it
 * could not start (out of memory). */
bool sched_main(srv *s);
/* Queues j (the scheduler takes a reference). Returns false when the queue is full. */
bool sched_submit(srv *s, job *j);

/* ---- reply objects (reply.c) */
json_t *reply_usage(const job *j);
/* A streamed chunk for choice index (any of the parts may be NULL; it takes
 * tool_calls, deltas that carry their index, and logprobs). */
json_t *reply_chunk(const job *j, int index, const char *role, const sbuf *content, const sbuf *reasoning,
                    json_t *tool_calls, const char *finish, json_t *logprobs);
/* The whole reply of a finished job. */
json_t *reply_final(const job *j);
json_t *reply_error(const srv_error *e);
/* Appends text (n bytes) as a JSON string literal; bytes that are not UTF-8
 * become U+FFFD. */
bool sb_json_string(sbuf *b, const char *text, size_t n);
/* Appends the SSE event of a streamed chunk that carries only text (content,
 * reasoning, either may be empty) for choice index: the same JSON as
 * reply_chunk's, written directly (the per-token path). */
bool reply_chunk_sse(sbuf *out, job *j, int index, const sbuf *content, const sbuf *reasoning);
/* The token's text and log-probability entry ({token, logprob, bytes, top_logprobs}). */
json_t *reply_logprob_entry(const ds_tokenizer *t, int32_t id, const float *logits, int n_vocab, int top);

#endif
