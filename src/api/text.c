/* text.c - the public tokenizer: encode, decode, streaming decode and the chat
 * template (tok/tokenizer.h underneath). Messages given as structs are turned
 * into the JSON the template interpreter reads with every jansson result
 * checked, so a message that is not UTF-8 is an error naming it, never a
 * message silently left out. */
#include "api/api.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

ds_status ds_tokenizer_load(const char *dir, ds_tokenizer **out)
{
    *out = NULL;
    if (!dir) return ds_errorf(DS_ERR_ARG, "no tokenizer directory given");
    ds_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    ds_status s = tok_load(&t->tok, dir);
    if (s) {
        free(t);
        return s;
    }
    *out = t;
    return DS_OK;
}

void ds_tokenizer_free(ds_tokenizer *t)
{
    if (!t) return;
    tok_free(t->tok);
    free(t);
}

int32_t ds_tokenizer_n_vocab(const ds_tokenizer *t) { return tok_vocab_size(t->tok); }
int32_t ds_tokenizer_bos(const ds_tokenizer *t) { return tok_bos_id(t->tok); }
int32_t ds_tokenizer_eos(const ds_tokenizer *t) { return tok_eos_id(t->tok); }
const char *ds_token_piece(const ds_tokenizer *t, int32_t id) { return tok_id_to_piece(t->tok, id); }
bool ds_token_is_special(const ds_tokenizer *t, int32_t id) { return tok_is_special(t->tok, id) != 0; }
int32_t ds_token_from_piece(const ds_tokenizer *t, const char *piece, size_t len)
{
    return tok_piece_to_id(t->tok, piece, len);
}

ds_status ds_tokenize(const ds_tokenizer *t, const char *text, size_t len, int flags, int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!text && len) return ds_errorf(DS_ERR_ARG, "ds_tokenize: no text");
    return tok_encode(t->tok, text ? text : "", len,
                      flags & DS_TOKENIZE_PARSE_SPECIAL ? TOK_PARSE_SPECIAL : 0, ids, n);
}

ds_status ds_detokenize(const ds_tokenizer *t, const int32_t *ids, size_t n, int flags, char **text, size_t *len)
{
    size_t l;
    ds_status s = tok_decode(t->tok, ids, n, flags & DS_DETOKENIZE_SKIP_SPECIAL ? TOK_SKIP_SPECIAL : 0, text, &l);
    if (len) *len = s ? 0 : l;
    return s;
}

ds_status ds_text_stream_new(const ds_tokenizer *t, int flags, ds_text_stream **out)
{
    *out = NULL;
    ds_text_stream *s = calloc(1, sizeof *s);
    if (!s) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    s->tok = t->tok;
    s->flags = flags & DS_DETOKENIZE_SKIP_SPECIAL ? TOK_SKIP_SPECIAL : 0;
    ds_status st = tok_decoder_new(s->tok, s->flags, &s->dec);
    if (st) {
        free(s);
        return st;
    }
    *out = s;
    return DS_OK;
}

ds_status ds_text_stream_push(ds_text_stream *s, int32_t id, const char **text, size_t *len)
{
    return tok_decoder_push(s->dec, id, text, len);
}

ds_status ds_text_stream_finish(ds_text_stream *s, const char **text, size_t *len)
{
    return tok_decoder_finish(s->dec, text, len);
}

void ds_text_stream_free(ds_text_stream *s)
{
    if (!s) return;
    tok_decoder_free(s->dec);
    free(s);
}

/* ---- chat */

ds_chat_params ds_chat_default_params(void) { return (ds_chat_params){.add_generation_prompt = true}; }

/* o[key] = a JSON string of s; DS_ERR_ARG naming message i and the field
 * when s is not UTF-8. */
static ds_status set_string(json_t *o, const char *key, const char *s, size_t i)
{
    json_t *v = json_string(s);
    if (!v) return ds_errorf(DS_ERR_ARG, "message %zu: %s is not valid UTF-8", i + 1, key);
    if (json_object_set_new(o, key, v)) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    return DS_OK;
}

static ds_status messages_json(const ds_chat_message *msgs, size_t n, char **out)
{
    json_t *arr = json_array();
    ds_status s = arr ? DS_OK : ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !s && i < n; i++) {
        const ds_chat_message *m = &msgs[i];
        json_t *o = json_object();
        if (!o || json_array_append_new(arr, o)) {
            s = ds_errorf(DS_ERR_NOMEM, "out of memory");
            break;
        }
        if (!m->role || (strcmp(m->role, "system") && strcmp(m->role, "user") && strcmp(m->role, "assistant") &&
                         strcmp(m->role, "tool"))) {
            s = ds_errorf(DS_ERR_ARG, "message %zu: role must be system, user, assistant or tool, not '%s'", i + 1,
                          m->role ? m->role : "(none)");
            break;
        }
        if ((s = set_string(o, "role", m->role, i)) || (s = set_string(o, "content", m->content ? m->content : "", i)))
            break;
        if (m->reasoning_content && (s = set_string(o, "reasoning_content", m->reasoning_content, i))) break;
        if (m->tool_call_id && (s = set_string(o, "tool_call_id", m->tool_call_id, i))) break;
        if (m->tool_calls) {
            json_error_t err;
            json_t *tc = json_loads(m->tool_calls, JSON_DECODE_ANY, &err);
            if (!tc || !json_is_array(tc)) {
                json_decref(tc);
                s = ds_errorf(DS_ERR_ARG, "message %zu: tool_calls is not a JSON array%s%s", i + 1, tc ? "" : ": ",
                              tc ? "" : err.text);
                break;
            }
            if (json_object_set_new(o, "tool_calls", tc)) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
        }
    }
    if (!s && !(*out = json_dumps(arr, JSON_COMPACT))) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    json_decref(arr);
    return s;
}

/* The template's extra variables: extra_vars, then thinking (when set) and tools. */
static ds_status chat_vars(const ds_chat_params *p, char **out)
{
    *out = NULL;
    if (!p->thinking && !p->tools) { /* as given: the template interpreter checks it */
        if (p->extra_vars && !(*out = strdup(p->extra_vars))) return ds_errorf(DS_ERR_NOMEM, "out of memory");
        return DS_OK;
    }
    json_error_t err;
    json_t *vars = p->extra_vars ? json_loads(p->extra_vars, 0, &err) : json_object();
    if (!vars || !json_is_object(vars)) {
        json_decref(vars);
        return ds_errorf(DS_ERR_ARG, "extra_vars is not a JSON object%s%s", vars ? "" : ": ", vars ? "" : err.text);
    }
    ds_status s = DS_OK;
    if (p->thinking && json_object_set_new(vars, "thinking", json_true())) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    if (!s && p->tools) {
        json_t *tools = json_loads(p->tools, JSON_DECODE_ANY, &err);
        if (!tools || !json_is_array(tools)) {
            json_decref(tools);
            s = ds_errorf(DS_ERR_ARG, "tools is not a JSON array%s%s", tools ? "" : ": ", tools ? "" : err.text);
        } else if (json_object_set_new(vars, "tools", tools)) {
            s = ds_errorf(DS_ERR_NOMEM, "out of memory");
        }
    }
    if (!s && !(*out = json_dumps(vars, JSON_COMPACT))) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    json_decref(vars);
    return s;
}

ds_status ds_chat_apply_json(const ds_tokenizer *t, const char *messages_json, const ds_chat_params *pp, char **text,
                             int32_t **ids, size_t *n_ids)
{
    ds_chat_params p = pp ? *pp : ds_chat_default_params();
    if (text) *text = NULL;
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (!messages_json) return ds_errorf(DS_ERR_ARG, "no messages given");
    char *vars;
    ds_status s = chat_vars(&p, &vars);
    if (s) return s;
    tok_chat_opts o = {.add_generation_prompt = p.add_generation_prompt,
                       .extra_vars_json = vars,
                       .template_text = p.template_text,
                       .parse_all = p.parse_special};
    if (ids) s = tok_encode_chat(t->tok, messages_json, &o, ids, n_ids, text);
    else if (text) s = tok_render_chat(t->tok, messages_json, &o, text);
    free(vars);
    return s;
}

ds_status ds_chat_apply(const ds_tokenizer *t, const ds_chat_message *msgs, size_t n_msgs, const ds_chat_params *p,
                        char **text, int32_t **ids, size_t *n_ids)
{
    char *js = NULL;
    ds_status s = messages_json(msgs, n_msgs, &js);
    if (!s) s = ds_chat_apply_json(t, js, p, text, ids, n_ids);
    free(js);
    return s;
}
