/* test_serve_unit.c - the server's pieces without a socket: request parsing
 * and validation, the stop-string matcher and the reply parser (reasoning and
 * DeepSeek tool-call formats), each fed split at every byte so that matches
 * across token boundaries are checked against a plain search of the whole;
 * the streamed chunks written directly against the same built with jansson. */
#include <string.h>

#include "serve/server.h"
#include "test.h"

static int parse(const char *body, req_kind k, srv_request *r, srv_error *e)
{
    srv_limits lim = srv_default_limits();
    lim.max_n = 4;
    lim.max_messages = 8;
    return req_parse(body, strlen(body), k, &lim, r, e);
}

/* The body must be refused with a 400 naming field. */
static void expect_bad(const char *body, req_kind k, const char *field)
{
    srv_request r;
    srv_error e;
    int rc = parse(body, k, &r, &e);
    CHECK_MSG(rc == -1, "accepted: %s", body);
    if (rc == 0) {
        req_free(&r);
        return;
    }
    CHECK_MSG(e.status == 400 && e.type && e.message[0], "%s: status %d", body, e.status);
    CHECK_MSG(!field || !strcmp(e.param, field), "%s: param '%s', expected '%s' (%s)", body, e.param, field, e.message);
}

static void test_requests(void)
{
    srv_request r;
    srv_error e;
    CHECK(parse("{\"model\":\"x\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],"
                "\"max_tokens\":7,\"temperature\":0,\"top_p\":0.5,\"top_k\":3,\"stop\":\"xy\",\"n\":2,\"seed\":5,"
                "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":2}",
                REQ_CHAT, &r, &e) == 0);
    CHECK(r.max_tokens == 7 && r.temperature == 0 && r.top_p == 0.5 && r.top_k == 3 && r.n == 2 && r.has_seed &&
          r.seed == 5 && r.stream && r.include_usage && r.logprobs && r.top_logprobs == 2);
    CHECK(r.n_stop == 1 && !strcmp(r.stop[0], "xy"));
    CHECK(r.messages_json && strstr(r.messages_json, "\"content\":\"ab\""));
    req_free(&r);

    CHECK(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":null,"
                "\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                "{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"42\"}],\"tools\":[{\"type\":\"function\","
                "\"function\":{\"name\":\"f\"}}],\"thinking\":{\"type\":\"enabled\"}}",
                REQ_CHAT, &r, &e) == 0);
    CHECK(r.tools_json && r.thinking && strstr(r.messages_json, "tool_call_id"));
    req_free(&r);
    CHECK(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"chat_template_kwargs\":{\"thinking\":true,\"x\":1}}",
                REQ_CHAT, &r, &e) == 0);
    CHECK(r.thinking && r.template_vars && !strstr(r.template_vars, "thinking"));
    req_free(&r);
    CHECK(parse("{\"prompt\":[1,2,3],\"logprobs\":3,\"echo\":true}", REQ_COMPLETION, &r, &e) == 0);
    CHECK(r.n_prompt_ids == 3 && r.prompt_ids[2] == 3 && r.logprobs && r.top_logprobs == 3 && r.echo);
    req_free(&r);
    CHECK(parse("{\"prompt\":\"hi\",\"max_completion_tokens\":4,\"max_tokens\":9}", REQ_COMPLETION, &r, &e) == 0);
    CHECK(r.prompt && !strcmp(r.prompt, "hi") && r.max_tokens == 4 && r.temperature == 1 && r.n == 1);
    req_free(&r);

    srv_request q;
    CHECK(parse("{\"messages\":", REQ_CHAT, &q, &e) == -1 && e.status == 400 && !strcmp(e.code, "invalid_json"));
    expect_bad("[1,2]", REQ_CHAT, "");
    expect_bad("{}", REQ_CHAT, "messages");
    expect_bad("{\"messages\":[]}", REQ_CHAT, "messages");
    expect_bad("{\"messages\":\"hi\"}", REQ_CHAT, "messages");
    expect_bad("{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", REQ_CHAT, "messages[0].role");
    expect_bad("{\"messages\":[{\"content\":\"x\"}]}", REQ_CHAT, "messages[0].role");
    expect_bad("{\"messages\":[{\"role\":\"user\"}]}", REQ_CHAT, "messages[0].content");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":5}]}", REQ_CHAT, "messages[0].content");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", REQ_CHAT, "messages[0].content");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", REQ_CHAT, "temperature");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":3}", REQ_CHAT, "temperature");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", REQ_CHAT, "max_tokens");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1e9}", REQ_CHAT, "max_tokens");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":5}", REQ_CHAT, "n");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[1]}", REQ_CHAT, "stop");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\"]}", REQ_CHAT, "stop");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":1}", REQ_CHAT, "stream");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", REQ_CHAT, "top_logprobs");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", REQ_CHAT, "tools");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"maybe\"}}", REQ_CHAT, "thinking");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", REQ_CHAT, "messages[0].tool_calls");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":7}", REQ_CHAT, "model");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":\"x\"},"
               "{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":\"x\"},"
               "{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":\"x\"},"
               "{\"role\":\"user\",\"content\":\"x\"}]}", REQ_CHAT, "messages");
    expect_bad("{\"prompt\":{}}", REQ_COMPLETION, "prompt");
    expect_bad("{\"prompt\":[1,-2]}", REQ_COMPLETION, "prompt");
    expect_bad("{\"prompt\":\"x\",\"logprobs\":true}", REQ_COMPLETION, "logprobs");
    expect_bad("{\"prompt\":\"x\",\"a\":1,\"a\":2}", REQ_COMPLETION, NULL); /* duplicate keys */
}

/* Feeds text split into pieces of `step` bytes; returns what was sent and whether a stop was found. */
static bool run_stop(const char *text, char **stops, int n, size_t step, sbuf *out)
{
    stop_matcher m;
    stop_init(&m, stops, n);
    bool hit = false;
    size_t len = strlen(text);
    for (size_t i = 0; i < len && !hit; i += step) hit = stop_push(&m, text + i, len - i < step ? len - i : step, out);
    if (!hit) stop_flush(&m, out);
    stop_free(&m);
    return hit;
}

static void test_stop(void)
{
    static char *stops[] = {"END", "\n\nUser:", "wörld"};
    static const char *texts[] = {"hello wörld and more", "a\n\nUser: b", "no stop at all", "ENDING", "xxEN", "E", "",
                                  "abc\n\nUse", "wör"};
    for (size_t t = 0; t < sizeof texts / sizeof *texts; t++) {
        /* the reference: the earliest occurrence in the whole text */
        const char *txt = texts[t], *first = NULL;
        for (int k = 0; k < 3; k++) {
            const char *f = strstr(txt, stops[k]);
            if (f && (!first || f < first)) first = f;
        }
        for (size_t step = 1; step <= strlen(txt) + 1; step++) {
            sbuf out = {0};
            bool hit = run_stop(txt, stops, 3, step, &out);
            size_t want = first ? (size_t)(first - txt) : strlen(txt);
            CHECK_MSG(hit == (first != NULL) && out.n == want && !memcmp(out.p ? out.p : "", txt, want),
                      "text '%s' step %zu: sent %zu bytes, expected %zu", txt, step, out.n, want);
            sb_free(&out);
        }
    }
}

/* Adds streamed tool-call deltas to the calls they build (an array by index),
 * checking OpenAI's sequence: a call's first delta has its id, type, name and
 * empty arguments, the next ones only arguments; indices go 0, 1, ... */
static void add_deltas(json_t *built, json_t *deltas)
{
    size_t i;
    json_t *d;
    json_array_foreach(deltas, i, d) {
        json_int_t k = json_integer_value(json_object_get(d, "index"));
        json_t *f = json_object_get(d, "function");
        if (json_object_get(d, "id")) {
            CHECK_MSG(k == (json_int_t)json_array_size(built), "a new call's index %lld after %zu calls", (long long)k,
                      json_array_size(built));
            CHECK(!strcmp(json_string_value(json_object_get(d, "type")), "function"));
            CHECK(json_string_value(json_object_get(f, "name")) && !strcmp(json_string_value(json_object_get(f, "arguments")), ""));
            json_t *c = json_deep_copy(d);
            json_object_del(c, "index");
            json_array_append_new(built, c);
        } else {
            CHECK_MSG(k == (json_int_t)json_array_size(built) - 1 && json_object_size(d) == 2 && json_object_size(f) == 1,
                      "an arguments delta for call %lld of %zu", (long long)k, json_array_size(built));
            json_t *c = json_array_get(built, (size_t)k), *cf = json_object_get(c, "function");
            sbuf a = {0};
            sb_adds(&a, json_string_value(json_object_get(cf, "arguments")));
            sb_adds(&a, json_string_value(json_object_get(f, "arguments")));
            json_object_set_new(cf, "arguments", json_string(a.p));
            sb_free(&a);
        }
    }
    json_decref(deltas);
}

/* Runs the parser over text split every `step` bytes; the tool calls streamed
 * must build the calls found at the end. */
static void run_parser(const char *text, bool in_reasoning, size_t step, sbuf *content, sbuf *reasoning, json_t **calls)
{
    out_parser p;
    outp_init(&p, in_reasoning);
    size_t len = strlen(text);
    json_t *built = json_array();
    for (size_t i = 0; i < len; i += step) {
        outp_push(&p, text + i, len - i < step ? len - i : step, content, reasoning);
        add_deltas(built, outp_call_deltas(&p, false, 1));
    }
    outp_finish(&p, content, reasoning);
    add_deltas(built, outp_call_deltas(&p, true, 1));
    *calls = outp_tool_calls(&p, 1);
    CHECK_MSG(*calls ? json_equal(built, *calls) : !json_array_size(built),
              "'%s' step %zu: the streamed calls differ from the whole reply's", text, step);
    json_decref(built);
    outp_free(&p);
}

static void check_parse(const char *text, bool in_reasoning, const char *want_content, const char *want_reasoning,
                        const char *want_names, const char *want_args)
{
    for (size_t step = 1; step <= strlen(text) + 1; step++) {
        sbuf c = {0}, r = {0};
        json_t *calls;
        run_parser(text, in_reasoning, step, &c, &r, &calls);
        CHECK_MSG(!strcmp(c.p ? c.p : "", want_content), "'%s' step %zu: content '%s'", text, step, c.p ? c.p : "");
        CHECK_MSG(!strcmp(r.p ? r.p : "", want_reasoning), "'%s' step %zu: reasoning '%s'", text, step, r.p ? r.p : "");
        sbuf names = {0}, args = {0};
        size_t i;
        json_t *x;
        json_array_foreach(calls, i, x) {
            json_t *f = json_object_get(x, "function");
            sb_adds(&names, json_string_value(json_object_get(f, "name")));
            sb_adds(&names, ";");
            sb_adds(&args, json_string_value(json_object_get(f, "arguments")));
            sb_adds(&args, ";");
            CHECK(!strcmp(json_string_value(json_object_get(x, "type")), "function"));
        }
        CHECK_MSG(!strcmp(names.p ? names.p : "", want_names), "'%s' step %zu: calls '%s'", text, step, names.p ? names.p : "");
        CHECK_MSG(!strcmp(args.p ? args.p : "", want_args), "'%s' step %zu: arguments '%s'", text, step, args.p ? args.p : "");
        json_decref(calls);
        sb_free(&c);
        sb_free(&r);
        sb_free(&names);
        sb_free(&args);
    }
}

static void test_parser(void)
{
    check_parse("plain answer", false, "plain answer", "", "", "");
    check_parse("<think>hmm, 2+2</think>\n\nIt is 4.", false, "It is 4.", "hmm, 2+2", "", "");
    check_parse("weighing it</think>Four.", true, "Four.", "weighing it", "", "");
    check_parse("a <think> in the middle", false, "a <think> in the middle", "", "", "");
    check_parse("unfinished thought", true, "", "unfinished thought", "", "");
    /* V3: type<sep>name, then the arguments in a json block */
    check_parse("Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>time\n```json\n{}\n```"
                "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                false, "Let me look.", "", "get_weather;time;", "{\"city\": \"Paris\"};{};");
    /* V3.1: name<sep>arguments */
    check_parse("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\":\"Oslo\"}<｜tool▁call▁end｜>"
                "<｜tool▁calls▁end｜>",
                false, "", "", "get_weather;", "{\"city\":\"Oslo\"};");
    check_parse("think first</think>ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
                true, "ok", "think first", "f;", "{};");
    /* cut short: the call is taken as it came */
    check_parse("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\":", false, "", "", "get_weather;",
                "{\"city\":;");
    /* a section without a name is no call; the next one is call 0 */
    check_parse("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜><｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>[]"
                "<｜tool▁call▁end｜>",
                false, "", "", "g;", "[];");
    const char *open = "<｜Assistant｜><think>\n", *closed = "<｜Assistant｜></think>";
    CHECK(prompt_opens_think(open, strlen(open)));
    CHECK(!prompt_opens_think(closed, strlen(closed)));
}

/* The per-token SSE chunk equals reply_chunk's through jansson; text that is
 * not UTF-8 still gives JSON. */
static void test_chunks(void)
{
    srv s = {0};
    snprintf(s.model_name, sizeof s.model_name, "m\"odel/\x01");
    const char *texts[] = {"", "The", " a \"quoted\" \\ back\n\r\t\b\f\x01\x1f\x7f", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
                           "<｜tool▁sep｜> / </script>"};
    for (int kind = 0; kind < 2; kind++)
        for (size_t a = 0; a < sizeof texts / sizeof *texts; a++)
            for (size_t b = 0; b < sizeof texts / sizeof *texts; b++) {
                job j = {.s = &s, .created = 1796208413};
                j.req.kind = kind ? REQ_COMPLETION : REQ_CHAT;
                snprintf(j.id, sizeof j.id, "chatcmpl-%zu", a);
                if (!*texts[a] && (kind || !*texts[b])) continue; /* no chunk carries nothing */
                sbuf c = {0}, r = {0}, fast = {0}, slow = {0};
                sb_adds(&c, texts[a]);
                if (!kind) sb_adds(&r, texts[b]);
                CHECK(reply_chunk_sse(&fast, &j, (int)b, &c, &r));
                sse_append(&slow, reply_chunk(&j, (int)b, NULL, &c, &r, NULL, NULL, NULL));
                CHECK_MSG(fast.n == slow.n && !memcmp(fast.p, slow.p, fast.n), "chunk:\n%s\nwant:\n%s", fast.p, slow.p);
                sb_free(&c);
                sb_free(&r);
                sb_free(&fast);
                sb_free(&slow);
                sb_free(&j.chunk_head);
            }
    sbuf o = {0};
    CHECK(sb_json_string(&o, "a\xff\xc3(\xed\xa0\x80\xe2\x82", 9));
    json_t *v = json_loads(o.p, JSON_DECODE_ANY, NULL);
    CHECK_MSG(v && !strcmp(json_string_value(v), "a\xef\xbf\xbd\xef\xbf\xbd(\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"),
              "not UTF-8 gave %s", o.p);
    json_decref(v);
    sb_free(&o);
}

int main(void)
{
    test_chunks();
    test_requests();
    test_stop();
    test_parser();
    return t_done("test_serve_unit");
}
