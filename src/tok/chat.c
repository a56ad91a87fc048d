/* chat.c - renders a chat template over a JSON message list and encodes the
 * result with the special-token safety rule (see tokenizer.h): added tokens
 * are matched only in bytes that came from the template itself. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tok/jinja.h"
#include "tok/tokenizer.h"

static ds_status render(const tok_tokenizer *t, const char *messages_json, const tok_chat_opts *o, char **text,
                        uint8_t **mask, size_t *len)
{
    tok_chat_opts def = {0};
    if (!o) o = &def;
    const char *tmpl = o->template_text ? o->template_text : tok_chat_template(t);
    if (!tmpl) return ds_errorf(DS_ERR_ARG, "tokenizer_config.json has no chat_template (and none was given)");
    if (!messages_json) return ds_errorf(DS_ERR_ARG, "chat: no messages");
    json_error_t e;
    json_t *msgs = json_loads(messages_json, 0, &e);
    if (!msgs) return ds_errorf(DS_ERR_ARG, "chat messages: invalid JSON at line %d column %d: %s", e.line, e.column, e.text);
    if (!json_is_array(msgs)) {
        json_decref(msgs);
        return ds_errorf(DS_ERR_ARG, "chat messages: expected a JSON array of message objects");
    }
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
            json_decref(msgs);
            return ds_errorf(DS_ERR_ARG, "chat messages[%zu]: expected an object with a string \"role\"", i);
        }
    }
    json_t *data = NULL;
    if (o->extra_vars_json) {
        data = json_loads(o->extra_vars_json, 0, &e);
        if (!data || !json_is_object(data)) {
            json_decref(msgs);
            json_decref(data);
            return ds_errorf(DS_ERR_ARG, "chat extra variables: expected a JSON object (%s)", data ? "not an object" : e.text);
        }
    } else {
        data = json_object();
    }
    json_object_set_new(data, "messages", msgs);
    json_t *markup = json_pack("{s:s, s:s, s:b}", "bos_token", tok_bos_token(t), "eos_token", tok_eos_token(t),
                               "add_generation_prompt", o->add_generation_prompt != 0);
    jinja_limits lim = {o->max_output, o->max_iterations, o->max_depth, 0};
    ds_status s = markup ? jinja_render(tmpl, data, markup, &lim, text, mask, len)
                         : ds_errorf(DS_ERR_NOMEM, "chat: out of memory");
    json_decref(data);
    json_decref(markup);
    return s;
}

ds_status tok_render_chat(const tok_tokenizer *t, const char *messages_json, const tok_chat_opts *opts,
                          char **out_text)
{
    return render(t, messages_json, opts, out_text, NULL, NULL);
}

ds_status tok_encode_chat(const tok_tokenizer *t, const char *messages_json, const tok_chat_opts *opts,
                          int32_t **ids, size_t *n, char **out_text)
{
    *ids = NULL;
    *n = 0;
    if (out_text) *out_text = NULL;
    char *text;
    uint8_t *mask;
    size_t len;
    ds_status s = render(t, messages_json, opts, &text, &mask, &len);
    if (s) return s;
    s = tok_encode_masked(t, text, len, opts && opts->parse_all ? NULL : mask, ids, n);
    free(mask);
    if (s || !out_text) free(text);
    else *out_text = text;
    return s;
}
