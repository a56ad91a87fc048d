/* request.c - an OpenAI request body to an srv_request, checked field by field.
 *
 * Everything here comes from a socket: every type, range and length is checked
 * and a failure names the field ("messages[2].role") in a 400, so that nothing
 * a client sends reaches the engine unchecked. Unknown fields are ignored, as
 * OpenAI's API does. No HTTP and no engine here: tests/serve/fuzz_request.c
 * links this file alone. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

bool sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool sb_adds(sbuf *b, const char *s) { return sb_add(b, s, strlen(s)); }

void sb_clear(sbuf *b)
{
    b->n = 0;
    if (b->p) b->p[0] = 0;
}

void sb_free(sbuf *b)
{
    free(b->p);
    *b = (sbuf){0};
}

srv_limits srv_default_limits(void)
{
    return (srv_limits){.max_tokens = 32768, .max_n = 8, .max_messages = 1024, .max_stop = 16, .max_stop_len = 256,
                        .max_prompt_bytes = 4u << 20, .max_top_logprobs = 20};
}

void srv_err(srv_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

/* A 400 naming field; returns -1. */
static int badf(srv_error *err, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int badf(srv_error *err, const char *field, const char *fmt, ...)
{
    char msg[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_err(err, 400, "invalid_request_error", "invalid_value", field, "%s", msg);
    return -1;
}
#define BAD(field, ...) badf(err, field, __VA_ARGS__)

void req_free(srv_request *r)
{
    free(r->model);
    free(r->messages_json);
    free(r->prompt);
    free(r->prompt_ids);
    free(r->tools_json);
    free(r->template_vars);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    *r = (srv_request){0};
}

/* A number field in [lo, hi]: absent or null leaves *v. */
static int get_num(json_t *o, const char *key, double lo, double hi, double *v, srv_error *err)
{
    json_t *x = json_object_get(o, key);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_number(x)) return BAD(key, "'%s' must be a number", key);
    double d = json_number_value(x);
    if (!(d >= lo && d <= hi)) return BAD(key, "'%s' is %g; it must be in [%g, %g]", key, d, lo, hi);
    *v = d;
    return 0;
}

static int get_int(json_t *o, const char *key, long long lo, long long hi, int *v, srv_error *err)
{
    json_t *x = json_object_get(o, key);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_integer(x)) return BAD(key, "'%s' must be an integer", key);
    long long d = json_integer_value(x);
    if (d < lo || d > hi) return BAD(key, "'%s' is %lld; it must be in [%lld, %lld]", key, d, lo, hi);
    *v = (int)d;
    return 0;
}

static int get_bool(json_t *o, const char *key, bool *v, srv_error *err)
{
    json_t *x = json_object_get(o, key);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_boolean(x)) return BAD(key, "'%s' must be true or false", key);
    *v = json_is_true(x);
    return 0;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static int nomem(srv_error *err)
{
    srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

/* A message's content: a string, or an array of {type: "text", text} parts
 * (joined). Sets *out to a new string, or NULL for null/absent content. */
static int content_text(json_t *c, const char *field, char **out, srv_error *err)
{
    *out = NULL;
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) {
        if (strlen(json_string_value(c)) != json_string_length(c)) return BAD(field, "%s contains a NUL character", field);
        return (*out = dup_n(json_string_value(c), json_string_length(c))) ? 0 : nomem(err);
    }
    if (!json_is_array(c)) return BAD(field, "%s must be a string or an array of text parts", field);
    sbuf b = {0};
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
            !json_is_string(text)) {
            sb_free(&b);
            return BAD(field, "%s[%zu] must be {\"type\": \"text\", \"text\": string} (only text is supported)", field, i);
        }
        if (strlen(json_string_value(text)) != json_string_length(text)) {
            sb_free(&b);
            return BAD(field, "%s[%zu].text contains a NUL character", field, i);
        }
        if (!sb_add(&b, json_string_value(text), json_string_length(text))) {
            sb_free(&b);
            return nomem(err);
        }
    }
    *out = b.p ? b.p : dup_n("", 0);
    return *out ? 0 : nomem(err);
}

/* tool_calls of an assistant message: [{id, type: "function", function: {name, arguments}}]. */
static int check_tool_calls(json_t *tc, const char *field, srv_error *err)
{
    if (!json_is_array(tc)) return BAD(field, "%s must be an array", field);
    size_t i;
    json_t *c;
    json_array_foreach(tc, i, c) {
        json_t *f = json_object_get(c, "function");
        json_t *type = json_object_get(c, "type");
        if (!json_is_object(c) || !json_is_object(f) || !json_is_string(json_object_get(f, "name")) ||
            !json_is_string(json_object_get(f, "arguments")) || (type && !json_is_string(type)))
            return BAD(field, "%s[%zu] must be {\"type\": \"function\", \"function\": {\"name\": string, "
                       "\"arguments\": string}}", field, i);
    }
    return 0;
}

/* messages -> the JSON array ds_chat_apply_json takes: string contents, roles checked. */
static int parse_messages(json_t *msgs, const srv_limits *lim, srv_request *r, srv_error *err)
{
    if (!msgs) return BAD("messages", "'messages' is required");
    if (!json_is_array(msgs)) return BAD("messages", "'messages' must be an array");
    size_t n = json_array_size(msgs);
    if (n == 0) return BAD("messages", "'messages' must not be empty");
    if (n > (size_t)lim->max_messages) return BAD("messages", "'messages' has %zu messages; at most %d are allowed", n, lim->max_messages);
    json_t *out = json_array();
    if (!out) return nomem(err);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i), *o = NULL;
        char field[64], *text = NULL;
        snprintf(field, sizeof field, "messages[%zu]", i);
        if (!json_is_object(m)) {
            json_decref(out);
            return BAD(field, "%s must be an object", field);
        }
        json_t *role = json_object_get(m, "role");
        const char *rs = json_is_string(role) ? json_string_value(role) : NULL;
        static const char *roles[] = {"system", "user", "assistant", "tool", "developer"};
        int known = -1;
        for (int k = 0; rs && k < 5; k++)
            if (!strcmp(rs, roles[k])) known = k;
        snprintf(field, sizeof field, "messages[%zu].role", i);
        if (known < 0) {
            json_decref(out);
            return BAD(field, "%s must be one of system, user, assistant, tool, developer", field);
        }
        snprintf(field, sizeof field, "messages[%zu].content", i);
        if (content_text(json_object_get(m, "content"), field, &text, err)) {
            json_decref(out);
            return -1;
        }
        json_t *tc = json_object_get(m, "tool_calls");
        if (tc && json_is_null(tc)) tc = NULL;
        if (!text && !(known == 2 && tc)) {
            json_decref(out);
            return BAD(field, "%s is required", field);
        }
        total += text ? strlen(text) : 0;
        o = json_object();
        int bad = !o || json_array_append_new(out, o) ||
                  json_object_set_new(o, "role", json_string(known == 4 ? "system" : rs)) ||
                  json_object_set_new(o, "content", text ? json_string(text) : json_null());
        free(text);
        if (bad) {
            json_decref(out);
            return nomem(err);
        }
        if (tc) {
            snprintf(field, sizeof field, "messages[%zu].tool_calls", i);
            if (known != 2 || check_tool_calls(tc, field, err)) {
                json_decref(out);
                return known != 2 ? BAD(field, "%s is allowed on assistant messages only", field) : -1;
            }
            json_object_set(o, "tool_calls", tc);
        }
        static const char *keep[] = {"tool_call_id", "reasoning_content", "name"};
        for (int k = 0; k < 3; k++) {
            json_t *v = json_object_get(m, keep[k]);
            if (v && json_is_null(v)) continue;
            snprintf(field, sizeof field, "messages[%zu].%s", i, keep[k]);
            if (v && (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))) {
                json_decref(out);
                return BAD(field, "%s must be a string", field);
            }
            if (v) json_object_set(o, keep[k], v);
        }
    }
    if (total > lim->max_prompt_bytes) {
        json_decref(out);
        return BAD("messages", "the messages hold %zu bytes; at most %zu are allowed", total, lim->max_prompt_bytes);
    }
    r->messages_json = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    return r->messages_json ? 0 : nomem(err);
}

/* prompt: a string, an array of one string, or an array of token ids. */
static int parse_prompt(json_t *p, const srv_limits *lim, srv_request *r, srv_error *err)
{
    if (!p) return BAD("prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (strlen(json_string_value(p)) != json_string_length(p)) return BAD("prompt", "'prompt' contains a NUL character");
        if (json_string_length(p) > lim->max_prompt_bytes)
            return BAD("prompt", "'prompt' has %zu bytes; at most %zu are allowed", json_string_length(p), lim->max_prompt_bytes);
        return (r->prompt = dup_n(json_string_value(p), json_string_length(p))) ? 0 : nomem(err);
    }
    if (!json_is_array(p) || json_array_size(p) == 0)
        return BAD("prompt", "'prompt' must be a string, an array of one string or a non-empty array of token ids");
    size_t n = json_array_size(p);
    if (n > lim->max_prompt_bytes / 4) return BAD("prompt", "'prompt' has %zu tokens; too many", n);
    if (!(r->prompt_ids = malloc(sizeof(int32_t) * n))) return nomem(err);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(p, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
            return BAD("prompt", "prompt[%zu] must be a token id (a non-negative integer)", i);
        r->prompt_ids[i] = (int32_t)json_integer_value(x);
    }
    r->n_prompt_ids = (int)n;
    return 0;
}

static int parse_stop(json_t *s, const srv_limits *lim, srv_request *r, srv_error *err)
{
    if (!s || json_is_null(s)) return 0;
    size_t n = json_is_string(s) ? 1 : json_is_array(s) ? json_array_size(s) : 0;
    if (!json_is_string(s) && !json_is_array(s)) return BAD("stop", "'stop' must be a string or an array of strings");
    if (n > (size_t)lim->max_stop) return BAD("stop", "'stop' has %zu strings; at most %d are allowed", n, lim->max_stop);
    if (!(r->stop = calloc(n ? n : 1, sizeof(char *)))) return nomem(err);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_string(s) ? s : json_array_get(s, i);
        if (!json_is_string(x)) return BAD("stop", "stop[%zu] must be a string", i);
        size_t len = json_string_length(x);
        if (len == 0 || len > (size_t)lim->max_stop_len || strlen(json_string_value(x)) != len)
            return BAD("stop", "stop[%zu] must have 1 to %d bytes and no NUL", i, lim->max_stop_len);
        if (!(r->stop[r->n_stop] = dup_n(json_string_value(x), len))) return nomem(err);
        r->n_stop++;
    }
    return 0;
}

/* tools, tool_choice, chat_template_kwargs and DeepSeek's thinking switch. */
static int parse_chat_extras(json_t *o, srv_request *r, srv_error *err)
{
    json_t *tools = json_object_get(o, "tools"), *choice = json_object_get(o, "tool_choice");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return BAD("tools", "'tools' must be an array");
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            json_t *f = json_object_get(t, "function");
            if (!json_is_object(t) || !json_is_object(f) || !json_is_string(json_object_get(f, "name")))
                return BAD("tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": string, ...}}", i);
        }
        bool none = json_is_string(choice) && !strcmp(json_string_value(choice), "none");
        if (choice && !json_is_null(choice) && !json_is_string(choice) && !json_is_object(choice))
            return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or an object");
        if (json_array_size(tools) && !none && !(r->tools_json = json_dumps(tools, JSON_COMPACT))) return nomem(err);
    }
    json_t *kw = json_object_get(o, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw)) return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
        json_t *th = json_object_get(kw, "thinking");
        if (th && !json_is_boolean(th)) return BAD("chat_template_kwargs", "chat_template_kwargs.thinking must be true or false");
        r->thinking = json_is_true(th);
        json_t *rest = json_deep_copy(kw);
        if (!rest) return nomem(err);
        json_object_del(rest, "thinking");
        json_object_del(rest, "messages");
        json_object_del(rest, "add_generation_prompt");
        if (json_object_size(rest)) r->template_vars = json_dumps(rest, JSON_COMPACT);
        json_decref(rest);
    }
    json_t *th = json_object_get(o, "thinking");
    if (th && !json_is_null(th)) {
        json_t *type = json_object_get(th, "type");
        const char *t = json_is_string(type) ? json_string_value(type) : "";
        if (!json_is_object(th) || (strcmp(t, "enabled") && strcmp(t, "disabled")))
            return BAD("thinking", "'thinking' must be {\"type\": \"enabled\"} or {\"type\": \"disabled\"}");
        r->thinking = !strcmp(t, "enabled");
    }
    return 0;
}

static int parse_sampling(json_t *o, const srv_limits *lim, srv_request *r, srv_error *err)
{
    double top_k = 0;
    if (get_num(o, "temperature", 0, 2, &r->temperature, err) || get_num(o, "top_p", 0, 1, &r->top_p, err) ||
        get_num(o, "top_k", 0, 1e9, &top_k, err) || get_num(o, "presence_penalty", -2, 2, &r->presence_penalty, err) ||
        get_num(o, "frequency_penalty", -2, 2, &r->frequency_penalty, err) ||
        get_num(o, "repetition_penalty", 0.01, 10, &r->repetition_penalty, err))
        return -1;
    if (top_k != floor(top_k)) return BAD("top_k", "'top_k' must be an integer");
    r->top_k = (int)top_k;
    if (r->top_p == 0) r->top_k = 1; /* the smallest set reaching p = 0: the likeliest token */
    if (r->top_p == 0) r->top_p = 1;
    json_t *seed = json_object_get(o, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return BAD("seed", "'seed' must be an integer");
        r->has_seed = true;
        r->seed = (uint64_t)json_integer_value(seed);
    }
    int mt = -1, mct = -1;
    if (get_int(o, "max_tokens", 1, lim->max_tokens, &mt, err) ||
        get_int(o, "max_completion_tokens", 1, lim->max_tokens, &mct, err) || get_int(o, "n", 1, lim->max_n, &r->n, err))
        return -1;
    r->max_tokens = mct > 0 ? mct : mt;
    return 0;
}

static int parse_logprobs(json_t *o, const srv_limits *lim, srv_request *r, srv_error *err)
{
    json_t *lp = json_object_get(o, "logprobs");
    if (r->kind == REQ_CHAT) {
        if (get_bool(o, "logprobs", &r->logprobs, err) ||
            get_int(o, "top_logprobs", 0, lim->max_top_logprobs, &r->top_logprobs, err))
            return -1;
        if (r->top_logprobs && !r->logprobs) return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
        return 0;
    }
    if (lp && !json_is_null(lp)) { /* completions: logprobs is the number of alternatives */
        if (get_int(o, "logprobs", 0, lim->max_top_logprobs, &r->top_logprobs, err)) return -1;
        r->logprobs = true;
    }
    return get_bool(o, "echo", &r->echo, err);
}

int req_parse(const char *body, size_t len, req_kind kind, const srv_limits *lim, srv_request *out, srv_error *err)
{
    *out = (srv_request){.kind = kind, .max_tokens = -1, .n = 1, .temperature = 1, .top_p = 1,
                         .repetition_penalty = 1};
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        srv_err(err, 400, "invalid_request_error", "invalid_json", NULL, "the body is not valid JSON: %s (line %d, column %d)",
                je.text, je.line, je.column);
        return -1;
    }
    int rc = -1;
    json_t *model = json_object_get(o, "model"), *so = json_object_get(o, "stream_options");
    if (!json_is_object(o)) {
        BAD(NULL, "the body must be a JSON object");
        goto done;
    }
    if (model && !json_is_null(model) && !json_is_string(model)) {
        BAD("model", "'model' must be a string");
        goto done;
    }
    if (model && json_is_string(model) && !(out->model = dup_n(json_string_value(model), strlen(json_string_value(model))))) {
        nomem(err);
        goto done;
    }
    if (kind == REQ_CHAT ? parse_messages(json_object_get(o, "messages"), lim, out, err) || parse_chat_extras(o, out, err)
                         : parse_prompt(json_object_get(o, "prompt"), lim, out, err))
        goto done;
    if (parse_sampling(o, lim, out, err) || parse_stop(json_object_get(o, "stop"), lim, out, err) ||
        parse_logprobs(o, lim, out, err) || get_bool(o, "stream", &out->stream, err) ||
        get_bool(o, "ignore_eos", &out->ignore_eos, err))
        goto done;
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            BAD("stream_options", "'stream_options' must be an object");
            goto done;
        }
        if (get_bool(so, "include_usage", &out->include_usage, err)) goto done;
    }
    rc = 0;
done:
    json_decref(o);
    if (rc) req_free(out);
    return rc;
}
