/* http.c - the HTTP side of `dsv3 serve` on libmicrohttpd.
 *
 * Two I/O threads (MHD's internal polling with a pool, epoll) serve every
 * connection; a handler never blocks. A generation request is checked
 * (API key in constant time, body size, JSON, fields, prompt length), queued
 * for the scheduler (bounded: 503 with Retry-After) and its connection
 * suspended until there is output: the scheduler resumes it after each step
 * that produced some, so that a step wakes one or two threads rather than one
 * per stream. A suspended connection is watched by the watcher thread (every
 * 50 ms): a client that went away cancels its job (the scheduler frees the
 * slots at its next step boundary), a deadline past cancels it too, and a
 * stream that has been silent for 5 s gets an SSE comment. The engine is
 * loaded after the socket listens, so /health says 503 until it is ready. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <microhttpd.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "server.h"

#if MHD_VERSION < 0x00097002
typedef int mhd_result;
#else
typedef enum MHD_Result mhd_result;
#endif

srv_options srv_default_options(void)
{
    return (srv_options){.host = "127.0.0.1", .port = 8080, .parallel = 4, .device = "auto", .queue = 64,
                         .timeout_s = 600, .prefill_chunk = 256, .max_body = 8u << 20, .limits = srv_default_limits()};
}

/* ---- jobs */

/* The I/O threads: few, so that a step's output wakes few threads; two, so
 * that one request's template and tokenizer work (a long prompt) does not
 * hold up every stream. */
#define IO_THREADS 2

static void job_free(job *j)
{
    for (int i = 0; j->ch && i < j->req.n; i++) {
        choice *c = &j->ch[i];
        ds_sampler_free(c->smp);
        ds_text_stream_free(c->ts);
        stop_free(&c->stop);
        outp_free(&c->parser);
        sb_free(&c->content);
        sb_free(&c->reasoning);
        json_decref(c->logprobs);
        json_decref(c->tool_calls);
    }
    free(j->ch);
    req_free(&j->req);
    ds_free(j->prompt);
    ds_free(j->prompt_text);
    sb_free(&j->out);
    sb_free(&j->stage);
    sb_free(&j->chunk_head);
    free(j);
}

void *job_unsuspend_locked(job *j)
{
    if (!j->suspended) return NULL;
    j->suspended = false;
    return j->conn;
}

void srv_resume(void *conn) { MHD_resume_connection(conn); }

void job_unref_locked(job *j)
{
    if (--j->refs == 0) job_free(j);
}

void sse_append(sbuf *out, json_t *obj)
{
    char *d = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!d) return;
    sb_adds(out, "data: ");
    sb_adds(out, d);
    sb_adds(out, "\n\n");
    free(d);
}

void job_sse_locked(job *j, json_t *obj) { sse_append(&j->out, obj); }

/* ---- connections */

typedef struct {
    srv *s;
    struct MHD_Connection *conn;
    sbuf body;
    bool too_big, started;
    int status;       /* for the log line */
    job *j;           /* a generation request */
    double t0;
    int prompt_tokens, completion_tokens;
    char method[8], path[64];
} conn_ctx;

/* Whether the peer of socket fd has closed it or reset it (no blocking). */
static bool client_gone(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
    char b;
    return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static mhd_result send_text(conn_ctx *cc, int status, const char *type, const char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    if (status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    mhd_result rc = MHD_queue_response(cc->conn, (unsigned)status, r);
    MHD_destroy_response(r);
    cc->status = status;
    return rc;
}

static mhd_result send_json(conn_ctx *cc, int status, json_t *o)
{
    char *d = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!d) return send_text(cc, 500, "application/json", "{}", 2);
    mhd_result rc = send_text(cc, status, "application/json", d, strlen(d));
    free(d);
    return rc;
}

static mhd_result send_error(conn_ctx *cc, const srv_error *e) { return send_json(cc, e->status, reply_error(e)); }

static mhd_result send_errorf(conn_ctx *cc, int status, const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static mhd_result send_errorf(conn_ctx *cc, int status, const char *type, const char *code, const char *fmt, ...)
{
    srv_error e = {.status = status, .type = type, .code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return send_error(cc, &e);
}

/* Bearer key check over the whole key whatever the input (no early exit). */
static bool key_ok(const srv *s, struct MHD_Connection *conn, const char *key)
{
    if (!key) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    const char *given = h && !strncmp(h, "Bearer ", 7) ? h + 7 : "";
    size_t kl = strlen(key), gl = strlen(given);
    unsigned char diff = kl != gl;
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)(key[i] ^ given[i < gl ? i : 0]);
    (void)s;
    return diff == 0;
}

/* ---- generation */

/* Tokenizes the request's prompt into j (chat: through the template). */
static int make_prompt(srv *s, job *j, srv_error *err)
{
    srv_request *r = &j->req;
    ds_status st;
    if (r->kind == REQ_CHAT) {
        ds_chat_params p = ds_chat_default_params();
        p.add_generation_prompt = true;
        p.thinking = r->thinking;
        p.tools = r->tools_json;
        p.extra_vars = r->template_vars;
        char *text = NULL;
        int32_t *ids = NULL;
        size_t n = 0;
        st = ds_chat_apply_json(s->tok, r->messages_json, &p, &text, &ids, &n);
        if (st) {
            srv_err(err, 400, "invalid_request_error", "invalid_value", "messages", "%s", ds_last_error());
            return -1;
        }
        j->in_reasoning = prompt_opens_think(text, strlen(text));
        ds_free(text);
        j->prompt = ids;
        j->n_prompt = (int)n;
    } else if (r->prompt) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (ds_tokenize(s->tok, r->prompt, strlen(r->prompt), 0, &ids, &n)) {
            srv_err(err, 400, "invalid_request_error", "invalid_value", "prompt", "%s", ds_last_error());
            return -1;
        }
        int32_t bos = ds_engine_bos(s->e);
        int32_t *all = malloc(sizeof(int32_t) * (n + 1));
        if (!all) {
            ds_free(ids);
            srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
            return -1;
        }
        size_t k = 0;
        if (bos >= 0) all[k++] = bos; /* as the chat template starts: a completion continues a document */
        memcpy(all + k, ids, sizeof(int32_t) * n);
        ds_free(ids);
        j->prompt = all;
        j->n_prompt = (int)(n + k);
        j->prompt_text = strdup(r->prompt);
    } else {
        for (int i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] >= ds_engine_n_vocab(s->e)) {
                srv_err(err, 400, "invalid_request_error", "invalid_value", "prompt", "prompt[%d] is %d; token ids are below %d",
                        i, r->prompt_ids[i], ds_engine_n_vocab(s->e));
                return -1;
            }
        j->prompt = malloc(sizeof(int32_t) * (size_t)r->n_prompt_ids);
        if (!j->prompt) {
            srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
            return -1;
        }
        memcpy(j->prompt, r->prompt_ids, sizeof(int32_t) * (size_t)r->n_prompt_ids);
        j->n_prompt = r->n_prompt_ids;
    }
    const char *field = r->kind == REQ_CHAT ? "messages" : "prompt";
    if (j->n_prompt < 1) {
        srv_err(err, 400, "invalid_request_error", "invalid_value", field, "'%s' gives an empty prompt", field);
        return -1;
    }
    if (j->n_prompt >= s->n_ctx) {
        srv_err(err, 400, "invalid_request_error", "context_length_exceeded", field,
                "the prompt has %d tokens; this server's context holds %d (--ctx-size), room for at least one more is needed",
                j->n_prompt, s->n_ctx);
        return -1;
    }
    if (r->n > s->o.parallel) {
        srv_err(err, 400, "invalid_request_error", "invalid_value", "n", "'n' is %d; this server runs %d sequences (--parallel)",
                r->n, s->o.parallel);
        return -1;
    }
    return 0;
}

/* The SSE stream's body: what j has produced since the last call; with
 * nothing yet, the connection is suspended until the scheduler (or the
 * watcher) has more. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    conn_ctx *cc = cls;
    job *j = cc->j;
    srv *s = cc->s;
    (void)pos;
    pthread_mutex_lock(&s->mu);
    size_t n = j->out.n - j->sent < max ? j->out.n - j->sent : max;
    if (n) memcpy(buf, j->out.p + j->sent, n);
    j->sent += n;
    bool end = n == 0 && j->finished;
    if (!n && !end) {
        j->suspended = true;
        MHD_suspend_connection(cc->conn);
    }
    pthread_mutex_unlock(&s->mu);
    return end ? MHD_CONTENT_READER_END_OF_STREAM : (ssize_t)n;
}

/* The reply of a finished non-streamed job (or 504 past its deadline; no
 * reply when its client left). */
static mhd_result respond(conn_ctx *cc)
{
    srv *s = cc->s;
    job *j = cc->j;
    pthread_mutex_lock(&s->mu);
    bool cancelled = j->cancelled, late = j->deadline > 0 && ds_now() > j->deadline;
    int status = j->status;
    char *body = j->out.n ? strndup(j->out.p, j->out.n) : NULL;
    size_t len = j->out.n;
    cc->completion_tokens = j->completion_tokens;
    pthread_mutex_unlock(&s->mu);
    mhd_result rc;
    if (cancelled && late)
        rc = send_errorf(cc, 504, "server_error", "timeout", "the request ran past %d s (--timeout)", s->o.timeout_s);
    else if (cancelled) {
        cc->status = 499;
        rc = MHD_NO;
    } else {
        rc = send_text(cc, status, "application/json", body ? body : "{}", body ? len : 2);
    }
    free(body);
    return rc;
}

static mhd_result generate(conn_ctx *cc, req_kind kind)
{
    srv *s = cc->s;
    srv_error err;
    job *j = calloc(1, sizeof *j);
    if (!j) return send_errorf(cc, 500, "server_error", NULL, "out of memory");
    j->refs = 1;
    j->conn = cc->conn;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(cc->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->s = s;
    j->status = 200;
    if (req_parse(cc->body.p ? cc->body.p : "", cc->body.n, kind, &s->o.limits, &j->req, &err) ||
        make_prompt(s, j, &err)) {
        job_free(j);
        return send_error(cc, &err);
    }
    pthread_mutex_lock(&s->mu);
    snprintf(j->id, sizeof j->id, "%s-%016llx", kind == REQ_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)s->salt++ * 0x9e3779b97f4a7c15ull);
    pthread_mutex_unlock(&s->mu);
    j->created = (long)time(NULL);
    j->t_start = ds_now();
    j->deadline = s->o.timeout_s > 0 ? j->t_start + s->o.timeout_s : 0;
    cc->prompt_tokens = j->n_prompt;
    if (j->req.stream && kind == REQ_CHAT) /* the role comes first, one chunk per choice */
        for (int i = 0; i < j->req.n; i++) job_sse_locked(j, reply_chunk(j, i, "assistant", NULL, NULL, NULL, NULL, NULL));
    j->last_out = ds_now();
    if (!sched_submit(s, j)) {
        job_free(j);
        return send_errorf(cc, 503, "server_error", "overloaded", "the server is busy (%d requests queued); retry later",
                           s->o.queue);
    }
    cc->j = j;
    pthread_mutex_lock(&s->mu); /* watched from now until on_completed */
    j->live_next = s->live;
    if (s->live) s->live->live_prev = j;
    s->live = j;
    pthread_mutex_unlock(&s->mu);
    if (j->req.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, cc, NULL);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
        mhd_result rc = MHD_queue_response(cc->conn, 200, r);
        MHD_destroy_response(r);
        cc->status = 200;
        return rc;
    }
    /* the whole reply: called again once the job is finished */
    pthread_mutex_lock(&s->mu);
    bool done = j->finished;
    if (!done) {
        j->suspended = true;
        MHD_suspend_connection(cc->conn);
    }
    pthread_mutex_unlock(&s->mu);
    return done ? respond(cc) : MHD_YES;
}

/* ---- the other endpoints */

static mhd_result models(conn_ctx *cc)
{
    srv *s = cc->s;
    return send_json(cc, 200, json_pack("{s:s, s:[{s:s, s:s, s:i, s:s}]}", "object", "list", "data", "id", s->model_name,
                                        "object", "model", "created", 0, "owned_by", "dsv3"));
}

static mhd_result tokenize(conn_ctx *cc)
{
    srv *s = cc->s;
    json_t *o = json_loadb(cc->body.p ? cc->body.p : "", cc->body.n, 0, NULL);
    json_t *c = json_object_get(o, "content");
    if (!c) c = json_object_get(o, "prompt");
    json_t *msgs = json_object_get(o, "messages");
    int32_t *ids = NULL;
    size_t n = 0;
    ds_status st = DS_OK;
    if (json_is_string(c)) {
        bool special = json_is_true(json_object_get(o, "parse_special"));
        st = ds_tokenize(s->tok, json_string_value(c), json_string_length(c), special ? DS_TOKENIZE_PARSE_SPECIAL : 0,
                         &ids, &n);
    } else if (json_is_array(msgs)) {
        srv_request r;
        srv_error err;
        srv_err(&err, 500, "server_error", NULL, NULL, "out of memory");
        char *d = json_dumps(o, JSON_COMPACT);
        int bad = !d || req_parse(d, strlen(d), REQ_CHAT, &s->o.limits, &r, &err);
        free(d);
        if (bad) {
            json_decref(o);
            return send_error(cc, &err);
        }
        ds_chat_params p = ds_chat_default_params();
        p.add_generation_prompt = !json_is_false(json_object_get(o, "add_generation_prompt"));
        p.thinking = r.thinking;
        p.tools = r.tools_json;
        p.extra_vars = r.template_vars;
        st = ds_chat_apply_json(s->tok, r.messages_json, &p, NULL, &ids, &n);
        req_free(&r);
    } else {
        json_decref(o);
        return send_errorf(cc, 400, "invalid_request_error", "invalid_value",
                           "the body must be {\"content\": string} or {\"messages\": [...]}");
    }
    json_decref(o);
    if (st) return send_errorf(cc, 400, "invalid_request_error", "invalid_value", "%s", ds_last_error());
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    ds_free(ids);
    return send_json(cc, 200, json_pack("{s:o}", "tokens", a));
}

static mhd_result detokenize(conn_ctx *cc)
{
    srv *s = cc->s;
    json_t *o = json_loadb(cc->body.p ? cc->body.p : "", cc->body.n, 0, NULL);
    json_t *t = json_object_get(o, "tokens");
    size_t n = json_array_size(t);
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    bool ok = json_is_array(t) && ids;
    for (size_t i = 0; ok && i < n; i++) {
        json_t *x = json_array_get(t, i);
        ok = json_is_integer(x) && json_integer_value(x) >= 0 && json_integer_value(x) < ds_tokenizer_n_vocab(s->tok);
        if (ok) ids[i] = (int32_t)json_integer_value(x);
    }
    json_decref(o);
    char *text = NULL;
    size_t len = 0;
    if (!ok || ds_detokenize(s->tok, ids, n, 0, &text, &len)) {
        free(ids);
        return send_errorf(cc, 400, "invalid_request_error", "invalid_value",
                           "the body must be {\"tokens\": [ids below %d]}", ds_tokenizer_n_vocab(s->tok));
    }
    free(ids);
    json_t *r = json_pack("{s:s%}", "content", text, len);
    ds_free(text);
    return send_json(cc, 200, r);
}

static void hist(sbuf *b, const char *name, const char *help, const long *bk, double sum, long count)
{
    static const char *le[11] = {"0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10"};
    char line[256];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    sb_adds(b, line);
    long acc = 0;
    for (int i = 0; i < 12; i++) {
        acc += bk[i];
        snprintf(line, sizeof line, "%s_bucket{le=\"%s\"} %ld\n", name, i < 11 ? le[i] : "+Inf", acc);
        sb_adds(b, line);
    }
    snprintf(line, sizeof line, "%s_sum %.6f\n%s_count %ld\n", name, sum, name, count);
    sb_adds(b, line);
}

static mhd_result metrics(conn_ctx *cc)
{
    srv *s = cc->s;
    sbuf b = {0};
    char line[1024];
    pthread_mutex_lock(&s->mu);
    srv_metrics m = s->m;
    pthread_mutex_unlock(&s->mu);
    static const char *cls[6] = {"2xx", "400", "401_404", "413", "503", "5xx"};
    sb_adds(&b, "# HELP dsv3_requests_total HTTP requests answered, by status class.\n# TYPE dsv3_requests_total counter\n");
    for (int i = 0; i < 6; i++) {
        snprintf(line, sizeof line, "dsv3_requests_total{status=\"%s\"} %ld\n", cls[i], m.requests[i]);
        sb_adds(&b, line);
    }
    snprintf(line, sizeof line,
             "# TYPE dsv3_prompt_tokens_total counter\ndsv3_prompt_tokens_total %ld\n"
             "# TYPE dsv3_completion_tokens_total counter\ndsv3_completion_tokens_total %ld\n"
             "# TYPE dsv3_prompt_cache_hit_tokens_total counter\ndsv3_prompt_cache_hit_tokens_total %ld\n"
             "# TYPE dsv3_requests_cancelled_total counter\ndsv3_requests_cancelled_total %ld\n"
             "# TYPE dsv3_queue_depth gauge\ndsv3_queue_depth %d\n"
             "# TYPE dsv3_running_sequences gauge\ndsv3_running_sequences %d\n"
             "# TYPE dsv3_batch_tokens gauge\ndsv3_batch_tokens %d\n"
             "# HELP dsv3_prompt_cache_tokens Tokens whose KV the prefix cache keeps in free slots.\n"
             "# TYPE dsv3_prompt_cache_tokens gauge\ndsv3_prompt_cache_tokens %d\n",
             m.prompt_tokens, m.completion_tokens, m.cache_hit_tokens, m.cancelled, m.queue_depth, m.running,
             m.batch_tokens, m.cache_tokens);
    sb_adds(&b, line);
    snprintf(line, sizeof line,
             "# HELP dsv3_scheduler_busy_seconds_total The scheduler's time in steps: in the engine, and its own "
             "(batching, sampling, detokenizing, formatting replies).\n"
             "# TYPE dsv3_scheduler_busy_seconds_total counter\n"
             "dsv3_scheduler_busy_seconds_total{part=\"engine\"} %.6f\n"
             "dsv3_scheduler_busy_seconds_total{part=\"server\"} %.6f\n"
             "# TYPE dsv3_scheduler_steps_total counter\ndsv3_scheduler_steps_total %ld\n",
             m.sched_engine_s, m.sched_other_s, m.sched_steps);
    sb_adds(&b, line);
    snprintf(line, sizeof line,
             "# HELP dsv3_spec_draft_tokens_total Tokens the MTP module drafted (--spec), and of them those the "
             "model accepted.\n"
             "# TYPE dsv3_spec_draft_tokens_total counter\n"
             "dsv3_spec_draft_tokens_total{outcome=\"drafted\"} %ld\n"
             "dsv3_spec_draft_tokens_total{outcome=\"accepted\"} %ld\n",
             m.spec_drafted, m.spec_accepted);
    sb_adds(&b, line);
    hist(&b, "dsv3_time_to_first_token_seconds", "Time from a request's arrival to its first token.", m.ttft_bucket,
         m.ttft_sum, m.ttft_count);
    hist(&b, "dsv3_decode_step_seconds", "Time of one batched decode step (per-token latency).", m.step_bucket,
         m.step_sum, m.step_count);
    mhd_result rc = send_text(cc, 200, "text/plain; version=0.0.4", b.p, b.n);
    sb_free(&b);
    return rc;
}

/* ---- dispatch */

static bool path_is(const char *url, const char *p) { return !strcmp(url, p); }

static mhd_result route(conn_ctx *cc, const char *method, const char *url)
{
    srv *s = cc->s;
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(method, "OPTIONS")) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        mhd_result rc = MHD_queue_response(cc->conn, 204, r);
        MHD_destroy_response(r);
        cc->status = 204;
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    bool ready = s->ready;
    pthread_mutex_unlock(&s->mu);
    if (get && path_is(url, "/health"))
        return ready ? send_text(cc, 200, "application/json", "{\"status\":\"ok\"}", 15)
                     : send_text(cc, 503, "application/json", "{\"status\":\"loading\"}", 20);
    if (get && (path_is(url, "/") || path_is(url, "/index.html")))
        return send_text(cc, 200, "text/html; charset=utf-8", srv_page_html, strlen(srv_page_html));
    if (!key_ok(s, cc->conn, s->o.api_key_file ? s->o.api_key_file : NULL))
        return send_errorf(cc, 401, "invalid_request_error", "invalid_api_key", "a valid API key is required (Authorization: Bearer KEY)");
    if (cc->too_big)
        return send_errorf(cc, 413, "invalid_request_error", "request_too_large", "the request body is over %zu bytes",
                           s->o.max_body);
    if (!ready) return send_errorf(cc, 503, "server_error", "loading", "the model is loading");
    if (get && path_is(url, "/metrics")) return metrics(cc);
    if (get && (path_is(url, "/v1/models") || path_is(url, "/models"))) return models(cc);
    if (post && (path_is(url, "/v1/chat/completions") || path_is(url, "/chat/completions"))) return generate(cc, REQ_CHAT);
    if (post && (path_is(url, "/v1/completions") || path_is(url, "/completions"))) return generate(cc, REQ_COMPLETION);
    if (post && path_is(url, "/tokenize")) return tokenize(cc);
    if (post && path_is(url, "/detokenize")) return detokenize(cc);
    bool known = path_is(url, "/v1/chat/completions") || path_is(url, "/chat/completions") ||
                 path_is(url, "/v1/completions") || path_is(url, "/completions") || path_is(url, "/tokenize") ||
                 path_is(url, "/detokenize") || path_is(url, "/metrics") || path_is(url, "/v1/models");
    if (known) return send_errorf(cc, 405, "invalid_request_error", "method_not_allowed", "%s is not allowed on %s", method, url);
    return send_errorf(cc, 404, "invalid_request_error", "not_found", "no such endpoint: %s", url);
}

static mhd_result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                             const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    srv *s = cls;
    (void)version;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        cc->s = s;
        cc->conn = conn;
        cc->t0 = ds_now();
        snprintf(cc->method, sizeof cc->method, "%s", method);
        snprintf(cc->path, sizeof cc->path, "%s", url);
        *con_cls = cc;
        pthread_mutex_lock(&s->mu);
        s->n_conns++;
        pthread_mutex_unlock(&s->mu);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body) cc->too_big = true;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cc->too_big && cc->body.n + *upload_size > s->o.max_body) cc->too_big = true;
        if (!cc->too_big && !sb_add(&cc->body, upload, *upload_size)) cc->too_big = true;
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->started) /* resumed: a whole reply is ready */
        return cc->j && !cc->j->req.stream ? respond(cc) : MHD_YES;
    cc->started = true;
    return route(cc, method, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    srv *s = cls;
    conn_ctx *cc = *con_cls;
    (void)conn;
    if (!cc) return;
    pthread_mutex_lock(&s->mu);
    if (cc->j) {
        job *j = cc->j;
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !j->finished) {
            j->cancelled = true;
            pthread_cond_signal(&s->wake);
        }
        if (!cc->completion_tokens) cc->completion_tokens = j->completion_tokens;
        if (!j->finished) cc->status = 499;
        if (j->live_prev) j->live_prev->live_next = j->live_next;
        else s->live = j->live_next;
        if (j->live_next) j->live_next->live_prev = j->live_prev;
        j->suspended = false; /* the connection is gone: nobody resumes it */
        job_unref_locked(j);
    }
    int st = cc->status;
    int k = st >= 200 && st < 300 ? 0 : st == 400 ? 1 : st == 401 || st == 404 || st == 405 ? 2 : st == 413 ? 3
            : st == 503 ? 4 : st >= 500 ? 5 : -1;
    if (k >= 0) s->m.requests[k]++;
    s->n_conns--;
    pthread_mutex_unlock(&s->mu);
    fprintf(stderr, "%s %s %d prompt=%d completion=%d %.0f ms\n", cc->method, cc->path, st, cc->prompt_tokens,
            cc->completion_tokens, (ds_now() - cc->t0) * 1e3);
    sb_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

/* ---- the server's life */

static volatile sig_atomic_t g_stop;
static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* Every 50 ms until SIGINT/SIGTERM: cancels the jobs whose suspended
 * connection's client went away or whose deadline passed, and sends an SSE
 * comment on streams silent for 5 s; then tells the scheduler to stop. */
static void *watch(void *arg)
{
    srv *s = arg;
    while (!g_stop) {
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
        void *wake[64];
        int n_wake = 0;
        double now = ds_now();
        pthread_mutex_lock(&s->mu);
        for (job *j = s->live; j; j = j->live_next) {
            if (!j->suspended || j->finished) continue;
            bool late = j->deadline > 0 && now > j->deadline;
            if (!j->cancelled && (late || (j->fd >= 0 && client_gone(j->fd)))) {
                j->cancelled = true; /* the scheduler ends it, which resumes the connection */
                pthread_cond_signal(&s->wake);
            } else if (j->req.stream && now - j->last_out > 5.0 && n_wake < 64) {
                sb_adds(&j->out, ": keep-alive\n\n");
                j->last_out = now;
                wake[n_wake++] = job_unsuspend_locked(j);
            }
        }
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < n_wake; i++) srv_resume(wake[i]);
    }
    fprintf(stderr, "dsv3 serve: stopping\n");
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static char *read_key(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
    return n ? strdup(buf) : NULL;
}

int srv_run(const srv_options *opt)
{
    srv *s = calloc(1, sizeof *s);
    if (!s) return 1;
    s->o = *opt;
    s->salt = (uint64_t)time(NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    char *key = NULL;
    if (opt->api_key_file && !(key = read_key(opt->api_key_file))) {
        fprintf(stderr, "dsv3 serve: %s: cannot read an API key from it\n", opt->api_key_file);
        free(s);
        return 1;
    }
    s->o.api_key_file = key; /* from here on: the key itself */
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)opt->port)};
    const char *host = strcmp(opt->host, "localhost") ? opt->host : "127.0.0.1";
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        fprintf(stderr, "dsv3 serve: --host %s is not an IPv4 address\n", opt->host);
        free(key);
        free(s);
        return 1;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG,
        (uint16_t)opt->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, s, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)IO_THREADS, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)(opt->queue + 64), MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "dsv3 serve: cannot listen on %s:%d: %s\n", opt->host, opt->port, strerror(errno));
        free(key);
        free(s);
        return 1;
    }
    int port = opt->port;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (di && di->port) port = di->port;
    fprintf(stderr, "dsv3 serve: listening on http://%s:%d/ (loading %s)\n", opt->host, port, opt->ckpt);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    ds_engine_params p = ds_engine_default_params();
    p.config_path = opt->config;
    p.device = opt->device;
    p.n_threads = opt->threads;
    p.n_ctx = opt->ctx;
    /* the prefix cache's own slots: as many whole slots as --cache-mem holds */
    int extra = 0;
    ds_model_info_buf mi;
    if (opt->cache_mem && ds_read_model_info(opt->ckpt, opt->config, &mi) == DS_OK) {
        const ds_model_info *m = &mi.info;
        int ctx = opt->ctx ? opt->ctx : m->max_seq_len < 4096 ? m->max_seq_len : 4096;
        size_t slot = (size_t)ctx * (size_t)m->n_layers * (size_t)(m->kv_lora_rank + m->qk_rope_head_dim) * sizeof(float);
        extra = slot ? (int)(opt->cache_mem / slot < 4096 ? opt->cache_mem / slot : 4096) : 0;
    }
    p.n_seq = opt->parallel + extra;
    p.mtp = opt->spec_draft > 0;
    int rc = 0;
    if (ds_engine_load(opt->ckpt, &p, &s->e)) {
        fprintf(stderr, "dsv3 serve: %s\n", ds_last_error());
        rc = 1;
    } else if (opt->spec_draft > 0 && !ds_engine_has_mtp(s->e)) {
        fprintf(stderr, "dsv3 serve: --spec mtp: %s has no MTP module\n", opt->ckpt);
        rc = 1;
    } else if (!(s->tok = ds_engine_tokenizer(s->e))) {
        fprintf(stderr, "dsv3 serve: %s has no tokenizer\n", opt->ckpt);
        rc = 1;
    }
    if (!rc) {
        s->n_ctx = ds_engine_n_ctx(s->e);
        const char *name = opt->model_name;
        if (!name) { /* the checkpoint directory's name */
            const char *c = opt->ckpt;
            size_t n = strlen(c);
            while (n > 1 && c[n - 1] == '/') n--;
            size_t b = n;
            while (b && c[b - 1] != '/') b--;
            snprintf(s->model_name, sizeof s->model_name, "%.*s", (int)(n - b), c + b);
        } else {
            snprintf(s->model_name, sizeof s->model_name, "%s", name);
        }
        /* the scheduler runs on this thread, which loaded the engine: the
         * CPU backend's per-thread buffers live as long as the process */
        if (pthread_create(&s->sched, NULL, watch, s)) {
            fprintf(stderr, "dsv3 serve: cannot start a thread\n");
            rc = 1;
        }
    }
    if (!rc) {
        pthread_mutex_lock(&s->mu);
        s->ready = 1;
        pthread_mutex_unlock(&s->mu);
        int n_seq = ds_engine_n_seq(s->e);
        fprintf(stderr, "dsv3 serve: ready: %s on %s, %d sequences of %d tokens, http://%s:%d/v1\n", s->model_name,
                ds_engine_device_name(s->e), opt->parallel, s->n_ctx, opt->host, port);
        if (n_seq > opt->parallel)
            fprintf(stderr, "dsv3 serve: prefix cache: %d more slots, %.1f MiB of KV cache (--cache-mem %zu MiB)\n",
                    n_seq - opt->parallel, (double)ds_engine_kv_bytes(s->e) * (n_seq - opt->parallel) / (1 << 20),
                    opt->cache_mem >> 20);
        if (!sched_main(s)) {
            rc = 1;
            g_stop = 1; /* the watcher ends */
        }
        pthread_join(s->sched, NULL);
    }
    pthread_mutex_lock(&s->mu);
    void *wake[256];
    int n_wake = 0;
    for (job *j = s->q_head; j; j = j->next) { /* answered now, so that their connections end */
        sb_clear(&j->out);
        j->sent = 0;
        sb_adds(&j->out, j->req.stream ? "data: [DONE]\n\n" : "{\"error\":{\"message\":\"the server is stopping\","
                                                                "\"type\":\"server_error\",\"param\":null,\"code\":null}}");
        j->status = 503;
        j->finished = true;
        void *c = job_unsuspend_locked(j);
        if (c && n_wake < 256) wake[n_wake++] = c;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n_wake; i++) srv_resume(wake[i]);
    /* every job has its last bytes now: let the connections send them (up to 3 s) */
    for (int i = 0; i < 300; i++) {
        pthread_mutex_lock(&s->mu);
        int open = s->n_conns;
        pthread_mutex_unlock(&s->mu);
        if (!open) break;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(d);
    /* jobs still queued after the daemon stopped: nobody waits for them */
    for (job *j = s->q_head, *n; j; j = n) {
        n = j->next;
        pthread_mutex_lock(&s->mu);
        job_unref_locked(j);
        pthread_mutex_unlock(&s->mu);
    }
    ds_engine_free(s->e);
    free(key);
    free(s);
    return rc;
}
