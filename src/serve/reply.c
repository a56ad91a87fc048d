/* reply.c - the JSON objects of OpenAI's API: chat.completion and
 * text_completion replies, their streamed chunks, usage with DeepSeek's cache
 * fields, log-probabilities and errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

json_t *reply_usage(const job *j)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", j->n_prompt, "completion_tokens",
                     j->completion_tokens, "total_tokens", j->n_prompt + j->completion_tokens,
                     "prompt_cache_hit_tokens", j->cached, "prompt_cache_miss_tokens", j->n_prompt - j->cached,
                     "prompt_tokens_details", "cached_tokens", j->cached);
}

/* The length of the valid UTF-8 sequence at s[0..n) (1 to 4), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t k = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3
             : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
    if (!k || k > n) return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (k == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0))) return 0; /* overlong, surrogate */
    if (k == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))) return 0; /* overlong, > U+10FFFF */
    return k;
}

bool sb_json_string(sbuf *b, const char *text, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *s = (const unsigned char *)text;
    bool ok = sb_add(b, "\"", 1);
    size_t run = 0; /* bytes of s copied as they are, pending */
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k = c >= 0x20 && c != '"' && c != '\\' ? utf8_len(s + i, n - i) : 0;
        if (k) {
            i += k, run += k;
            continue;
        }
        ok &= sb_add(b, (const char *)s + i - run, run);
        run = 0;
        char e[8] = {'\\', (char)c, 0};
        if (c == '"' || c == '\\') ok &= sb_add(b, e, 2);
        else if (c == '\n') ok &= sb_add(b, "\\n", 2);
        else if (c == '\r') ok &= sb_add(b, "\\r", 2);
        else if (c == '\t') ok &= sb_add(b, "\\t", 2);
        else if (c == '\b') ok &= sb_add(b, "\\b", 2);
        else if (c == '\f') ok &= sb_add(b, "\\f", 2);
        else if (c < 0x20) {
            char u[7] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15], 0};
            ok &= sb_add(b, u, 6);
        } else {
            ok &= sb_add(b, "\xef\xbf\xbd", 3); /* not UTF-8: U+FFFD, as a decoder would show it */
        }
        i++;
    }
    ok &= sb_add(b, (const char *)s + n - run, run);
    return ok && sb_add(b, "\"", 1);
}

bool reply_chunk_sse(sbuf *out, job *j, int index, const sbuf *content, const sbuf *reasoning)
{
    bool chat = j->req.kind == REQ_CHAT, ok = true;
    if (!j->chunk_head.n) { /* what every chunk of the job starts with */
        char num[64];
        ok &= sb_adds(&j->chunk_head, "data: {\"id\":");
        ok &= sb_json_string(&j->chunk_head, j->id, strlen(j->id));
        ok &= sb_adds(&j->chunk_head, chat ? ",\"object\":\"chat.completion.chunk\",\"created\":"
                                           : ",\"object\":\"text_completion\",\"created\":");
        snprintf(num, sizeof num, "%ld", j->created);
        ok &= sb_adds(&j->chunk_head, num);
        ok &= sb_adds(&j->chunk_head, ",\"model\":");
        ok &= sb_json_string(&j->chunk_head, j->s->model_name, strlen(j->s->model_name));
        ok &= sb_adds(&j->chunk_head, ",\"choices\":[{\"index\":");
        if (!ok) return false;
    }
    char idx[16];
    snprintf(idx, sizeof idx, "%d", index);
    ok &= sb_add(out, j->chunk_head.p, j->chunk_head.n);
    ok &= sb_adds(out, idx);
    if (chat) {
        ok &= sb_adds(out, ",\"delta\":{");
        if (content->n) {
            ok &= sb_adds(out, "\"content\":");
            ok &= sb_json_string(out, content->p, content->n);
        }
        if (reasoning->n) {
            ok &= sb_adds(out, content->n ? ",\"reasoning_content\":" : "\"reasoning_content\":");
            ok &= sb_json_string(out, reasoning->p, reasoning->n);
        }
        ok &= sb_adds(out, "}");
    } else {
        ok &= sb_adds(out, ",\"text\":");
        ok &= sb_json_string(out, content->p ? content->p : "", content->n);
    }
    return ok && sb_adds(out, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
}

static json_t *str_n(const sbuf *b) { return json_stringn(b && b->p ? b->p : "", b ? b->n : 0); }

json_t *reply_chunk(const job *j, int index, const char *role, const sbuf *content, const sbuf *reasoning,
                    json_t *tool_calls, const char *finish, json_t *logprobs)
{
    bool chat = j->req.kind == REQ_CHAT;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", j->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)j->created,
                          "model", j->s->model_name, "choices");
    if (!o) {
        json_decref(tool_calls);
        json_decref(logprobs);
        return NULL;
    }
    if (index < 0) { /* the usage chunk: no choices */
        json_object_set_new(o, "usage", reply_usage(j));
        json_decref(tool_calls);
        json_decref(logprobs);
        return o;
    }
    json_t *c = json_pack("{s:i}", "index", index);
    if (chat) {
        json_t *d = json_object();
        if (role) json_object_set_new(d, "role", json_string(role));
        if (content && content->n) json_object_set_new(d, "content", str_n(content));
        if (reasoning && reasoning->n) json_object_set_new(d, "reasoning_content", str_n(reasoning));
        if (tool_calls) json_object_set_new(d, "tool_calls", tool_calls);
        json_object_set_new(c, "delta", d);
    } else {
        json_decref(tool_calls);
        json_object_set_new(c, "text", str_n(content));
    }
    json_object_set_new(c, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    json_array_append_new(json_object_get(o, "choices"), c);
    return o;
}

json_t *reply_final(const job *j)
{
    bool chat = j->req.kind == REQ_CHAT;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", j->id, "object", chat ? "chat.completion" : "text_completion",
                          "created", (json_int_t)j->created, "model", j->s->model_name, "choices");
    if (!o) return NULL;
    for (int i = 0; i < j->req.n; i++) {
        const choice *ch = &j->ch[i];
        json_t *c = json_pack("{s:i, s:s}", "index", i, "finish_reason", ch->finish ? ch->finish : "length");
        if (chat) {
            json_t *m = json_pack("{s:s}", "role", "assistant");
            json_object_set_new(m, "content", ch->tool_calls && !ch->content.n ? json_null() : str_n(&ch->content));
            if (ch->reasoning.n) json_object_set_new(m, "reasoning_content", str_n(&ch->reasoning));
            if (ch->tool_calls) json_object_set(m, "tool_calls", ch->tool_calls);
            json_object_set_new(c, "message", m);
        } else {
            sbuf t = {0};
            if (j->req.echo && j->prompt_text) sb_adds(&t, j->prompt_text);
            sb_add(&t, ch->content.p ? ch->content.p : "", ch->content.n);
            json_object_set_new(c, "text", str_n(&t));
            sb_free(&t);
        }
        json_object_set(c, "logprobs", ch->logprobs ? ch->logprobs : json_null());
        json_array_append_new(json_object_get(o, "choices"), c);
    }
    json_object_set_new(o, "usage", reply_usage(j));
    return o;
}

json_t *reply_error(const srv_error *e)
{
    json_t *in = json_pack("{s:s, s:s}", "message", e->message, "type", e->type ? e->type : "server_error");
    if (in) {
        json_object_set_new(in, "param", e->param[0] ? json_string(e->param) : json_null());
        json_object_set_new(in, "code", e->code ? json_string(e->code) : json_null());
    }
    return json_pack("{s:o}", "error", in);
}

/* {token, logprob, bytes} of token id given log Z. */
static json_t *lp_item(const ds_tokenizer *t, int32_t id, double lp)
{
    char *text = NULL;
    size_t len = 0;
    if (ds_detokenize(t, &id, 1, 0, &text, &len) != DS_OK) len = 0;
    json_t *bytes = json_array();
    for (size_t i = 0; i < len; i++) json_array_append_new(bytes, json_integer((unsigned char)text[i]));
    json_t *o = json_pack("{s:s%, s:f, s:o}", "token", text ? text : "", len, "logprob", lp, "bytes", bytes);
    ds_free(text);
    return o;
}

json_t *reply_logprob_entry(const ds_tokenizer *t, int32_t id, const float *logits, int n_vocab, int top)
{
    float mx = -INFINITY;
    for (int i = 0; i < n_vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double z = 0;
    for (int i = 0; i < n_vocab; i++) z += exp((double)logits[i] - mx);
    double lz = mx + log(z);
    int nt = ds_tokenizer_n_vocab(t);
    json_t *o = lp_item(t, id < nt ? id : 0, (double)logits[id] - lz);
    json_t *alts = json_array();
    /* the top alternatives by repeated selection (top <= 20) */
    int picked[32];
    for (int k = 0; k < top && k < 32; k++) {
        int best = -1;
        for (int i = 0; i < n_vocab && i < nt; i++) {
            bool seen = false;
            for (int q = 0; q < k; q++) seen |= picked[q] == i;
            if (!seen && (best < 0 || logits[i] > logits[best])) best = i;
        }
        if (best < 0) break;
        picked[k] = best;
        json_array_append_new(alts, lp_item(t, best, (double)logits[best] - lz));
    }
    json_object_set_new(o, "top_logprobs", alts);
    return o;
}
