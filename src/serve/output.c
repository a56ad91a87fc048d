/* output.c - from generated text to what a reply carries.
 *
 * Text arrives a token at a time, so a stop string or a marker may be split
 * over tokens. Both the stop matcher and the reply parser keep the invariant:
 * what they have sent never contains the start of a match that later text
 * could complete; they hold back the longest tail of the text that is a
 * proper prefix of a stop string (or marker) and send the rest. A held tail
 * always starts at the first byte of a UTF-8 stop string, so what is sent
 * never ends inside a character that was whole in the input.
 *
 * DeepSeek's formats: R1 and V3.1-thinking reason inside <think>...</think>
 * (the template may open <think> itself); V3 calls tools as
 *   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
 * and V3.1 as
 *   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...<｜tool▁calls▁end｜> */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define CALLS_END "<｜tool▁calls▁end｜>"
#define CALL_BEGIN "<｜tool▁call▁begin｜>"
#define CALL_END "<｜tool▁call▁end｜>"
#define CALL_SEP "<｜tool▁sep｜>"

/* The earliest occurrence of any of pats[0..n) in s[0..len): its offset and
 * index, or -1. */
static long find_first(const char *s, size_t len, const char *const *pats, int n, int *which)
{
    long best = -1;
    for (int k = 0; k < n; k++) {
        size_t pl = strlen(pats[k]);
        for (size_t i = 0; pl && i + pl <= len && (best < 0 || (long)i < best); i++)
            if (!memcmp(s + i, pats[k], pl)) {
                best = (long)i;
                *which = k;
                break;
            }
    }
    return best;
}

/* The length of the longest tail of s[0..len) that is a proper prefix of one of pats. */
static size_t partial_tail(const char *s, size_t len, const char *const *pats, int n)
{
    size_t best = 0;
    for (int k = 0; k < n; k++) {
        size_t pl = strlen(pats[k]);
        for (size_t t = pl - 1 < len ? pl - 1 : len; t > best; t--)
            if (!memcmp(s + len - t, pats[k], t)) {
                best = t;
                break;
            }
    }
    return best;
}

/* ---- stop strings */

void stop_init(stop_matcher *m, char **stop, int n_stop)
{
    *m = (stop_matcher){.stop = stop, .n_stop = n_stop};
}

bool stop_push(stop_matcher *m, const char *text, size_t n, sbuf *out)
{
    if (!m->n_stop) return sb_add(out, text, n), false;
    sb_add(&m->held, text, n);
    int which;
    long at = find_first(m->held.p, m->held.n, (const char *const *)m->stop, m->n_stop, &which);
    if (at >= 0) {
        sb_add(out, m->held.p, (size_t)at);
        sb_clear(&m->held);
        return true;
    }
    size_t keep = partial_tail(m->held.p, m->held.n, (const char *const *)m->stop, m->n_stop);
    sb_add(out, m->held.p, m->held.n - keep);
    memmove(m->held.p, m->held.p + m->held.n - keep, keep);
    m->held.n = keep;
    return false;
}

void stop_flush(stop_matcher *m, sbuf *out)
{
    sb_add(out, m->held.p ? m->held.p : "", m->held.n);
    sb_clear(&m->held);
}

void stop_free(stop_matcher *m) { sb_free(&m->held); }

/* ---- reasoning and tool calls */

void outp_init(out_parser *p, bool in_reasoning)
{
    *p = (out_parser){.state = in_reasoning ? OUT_REASONING : OUT_CONTENT};
}

static bool all_space(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\n' && s[i] != '\r' && s[i] != '\t') return false;
    return true;
}

void outp_push(out_parser *p, const char *text, size_t n, sbuf *content, sbuf *reasoning)
{
    if (p->state == OUT_TOOLS) { /* the rest is the tool-call section */
        sb_add(&p->tools, text, n);
        return;
    }
    sb_add(&p->held, text, n);
    for (;;) {
        /* <think> opens reasoning only before any content (R1 without the template's <think>) */
        const char *pats[2];
        int np = 0;
        if (p->state == OUT_REASONING) pats[np++] = THINK_CLOSE;
        else {
            pats[np++] = CALLS_BEGIN;
            if (!p->any_content) pats[np++] = THINK_OPEN;
        }
        sbuf *dst = p->state == OUT_REASONING ? reasoning : content;
        int which = 0;
        long at = find_first(p->held.p, p->held.n, pats, np, &which);
        size_t emit = at >= 0 ? (size_t)at : p->held.n - partial_tail(p->held.p, p->held.n, pats, np);
        if (p->state == OUT_CONTENT && at >= 0 && !strcmp(pats[which], THINK_OPEN) && !all_space(p->held.p, emit))
            at = -1, emit = p->held.n - partial_tail(p->held.p, p->held.n, pats, 1);
        /* the white space between </think> and the answer is dropped, as DeepSeek's API does */
        size_t lead = 0;
        if (dst == content && p->after_think && !p->any_content)
            while (lead < emit && all_space(p->held.p + lead, 1)) lead++;
        sb_add(dst, p->held.p + lead, emit - lead);
        if (dst == content && !all_space(p->held.p, emit)) p->any_content = true;
        size_t skip = emit + (at >= 0 ? strlen(pats[which]) : 0);
        memmove(p->held.p, p->held.p + skip, p->held.n - skip);
        p->held.n -= skip;
        if (at < 0) break;
        if (!strcmp(pats[which], THINK_CLOSE)) {
            p->state = OUT_CONTENT;
            p->after_think = true;
        } else if (!strcmp(pats[which], THINK_OPEN)) {
            p->state = OUT_REASONING;
        } else {
            p->state = OUT_TOOLS;
            sb_add(&p->tools, p->held.p ? p->held.p : "", p->held.n);
            p->held.n = 0;
            break;
        }
    }
}

void outp_finish(out_parser *p, sbuf *content, sbuf *reasoning)
{
    if (p->state == OUT_TOOLS) return;
    sb_add(p->state == OUT_REASONING ? reasoning : content, p->held.p ? p->held.p : "", p->held.n);
    p->held.n = 0;
}

static char *strip_dup(const char *s, size_t n)
{
    while (n && (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == '\t')) n--;
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static const char *find_at(const char *s, size_t n, size_t from, const char *pat)
{
    size_t pl = strlen(pat);
    for (size_t i = from; i + pl <= n; i++)
        if (!memcmp(s + i, pat, pl)) return s + i;
    return NULL;
}

static void call_id(char *id, size_t cap, int index, uint64_t salt)
{
    snprintf(id, cap, "call_%d_%08llx", index, (unsigned long long)(salt & 0xffffffffu));
}

/* The function's name in the first n bytes of a call's text (malloc'd), or
 * NULL while more text may still change it (whole: no more will come). */
static char *call_name(const char *s, size_t n, bool whole)
{
    const char *sep = find_at(s, n, 0, CALL_SEP);
    if (!sep) return NULL;
    char *name = strip_dup(s, (size_t)(sep - s));
    if (!name || strcmp(name, "function")) return name;
    free(name); /* V3: type<sep>NAME\n... */
    const char *rest = sep + strlen(CALL_SEP), *nl = memchr(rest, '\n', n - (size_t)(rest - s));
    if (!nl && !whole) return NULL;
    return strip_dup(rest, nl ? (size_t)(nl - rest) : n - (size_t)(rest - s));
}

/* One call's text between CALL_BEGIN and CALL_END -> {id, type, function: {name, arguments}}. */
static json_t *parse_call(const char *s, size_t n, int index, uint64_t salt)
{
    const char *sep = NULL;
    size_t sl = strlen(CALL_SEP);
    for (size_t i = 0; i + sl <= n; i++)
        if (!memcmp(s + i, CALL_SEP, sl)) {
            sep = s + i;
            break;
        }
    if (!sep) return NULL;
    char *name = strip_dup(s, (size_t)(sep - s)), *args = NULL;
    const char *rest = sep + sl;
    size_t rn = n - (size_t)(rest - s);
    if (name && !strcmp(name, "function")) { /* V3: type<sep>NAME\n```json\nARGS\n``` */
        free(name);
        const char *nl = memchr(rest, '\n', rn);
        size_t name_len = nl ? (size_t)(nl - rest) : rn;
        name = strip_dup(rest, name_len);
        const char *a = nl ? nl + 1 : rest + rn;
        size_t an = rn - (size_t)(a - rest);
        if (an >= 7 && !memcmp(a, "```json", 7)) a += 7, an -= 7;
        while (an && (a[an - 1] == '\n' || a[an - 1] == ' ')) an--;
        if (an >= 3 && !memcmp(a + an - 3, "```", 3)) an -= 3;
        args = strip_dup(a, an);
    } else {
        args = strip_dup(rest, rn);
    }
    json_t *call = NULL;
    if (name && args && name[0]) {
        char id[48];
        call_id(id, sizeof id, index, salt);
        call = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name", name,
                         "arguments", args);
    }
    free(name);
    free(args);
    return call;
}

json_t *outp_tool_calls(const out_parser *p, uint64_t salt)
{
    if (p->state != OUT_TOOLS) return NULL;
    json_t *arr = json_array();
    const char *s = p->tools.p ? p->tools.p : "";
    size_t n = p->tools.n, bl = strlen(CALL_BEGIN), el = strlen(CALL_END);
    for (size_t i = 0; arr && i + bl <= n;) {
        if (memcmp(s + i, CALL_BEGIN, bl)) {
            i++;
            continue;
        }
        size_t b = i + bl, e = b;
        while (e + el <= n && memcmp(s + e, CALL_END, el)) e++;
        if (e + el > n) e = n; /* cut short (max_tokens): take what came */
        json_t *c = parse_call(s + b, e - b, (int)json_array_size(arr), salt + json_array_size(arr));
        if (c) json_array_append_new(arr, c);
        i = e + el;
    }
    if (arr && json_array_size(arr) == 0) {
        json_decref(arr);
        arr = NULL;
    }
    return arr;
}

json_t *outp_call_deltas(out_parser *p, bool final, uint64_t salt)
{
    if (p->state != OUT_TOOLS) return NULL;
    json_t *arr = json_array();
    const char *s = p->tools.p ? p->tools.p : "";
    size_t n = p->tools.n, i = 0, bl = strlen(CALL_BEGIN), el = strlen(CALL_END);
    /* past the sections already handed out */
    for (int k = 0; k < p->sections_done; k++) {
        const char *b = find_at(s, n, i, CALL_BEGIN), *e = b ? find_at(s, n, (size_t)(b - s) + bl, CALL_END) : NULL;
        i = e ? (size_t)(e - s) + el : n;
    }
    for (const char *b; arr && (b = find_at(s, n, i, CALL_BEGIN));) {
        size_t from = (size_t)(b - s) + bl;
        const char *e = find_at(s, n, from, CALL_END);
        size_t len = (e ? (size_t)(e - s) : n) - from;
        char id[48];
        call_id(id, sizeof id, p->calls_sent, salt + (uint64_t)p->calls_sent);
        if (!p->named) {
            char *name = call_name(s + from, len, e || final);
            if (name && name[0]) {
                json_array_append_new(arr, json_pack("{s:i, s:s, s:s, s:{s:s, s:s}}", "index", p->calls_sent, "id", id,
                                                     "type", "function", "function", "name", name, "arguments", ""));
                p->named = true;
            }
            free(name);
        }
        if (!e && !final) break;
        json_t *c = parse_call(s + from, len, p->calls_sent, salt + (uint64_t)p->calls_sent);
        if (c && p->named) {
            json_t *args = json_object_get(json_object_get(c, "function"), "arguments");
            json_array_append_new(arr, json_pack("{s:i, s:{s:O}}", "index", p->calls_sent, "function", "arguments", args));
            p->calls_sent++;
        }
        json_decref(c);
        p->named = false;
        p->sections_done++;
        if (!e) break;
        i = (size_t)(e - s) + el;
    }
    if (arr && json_array_size(arr) == 0) {
        json_decref(arr);
        arr = NULL;
    }
    return arr;
}

void outp_free(out_parser *p)
{
    sb_free(&p->held);
    sb_free(&p->tools);
}

bool prompt_opens_think(const char *text, size_t n)
{
    while (n && (text[n - 1] == '\n' || text[n - 1] == ' ')) n--;
    size_t tl = strlen(THINK_OPEN);
    return n >= tl && !memcmp(text + n - tl, THINK_OPEN, tl);
}
