/* jinja.c - lexer, parser and tree-walking evaluator for chat templates.
 *
 * Everything one render allocates (tokens, tree, values) comes from one arena
 * that is freed at the end; values are immutable except namespaces. Python
 * semantics are followed where Jinja2 defers to Python (str(None) is "None",
 * string indexing is by code point, a missing key is undefined, 'a' + none is
 * an error). Limits on output size, memory, loop iterations and depth turn a
 * runaway template into an error instead of a hang or a crash. */
#include "tok/jinja.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/utf8.h"

/* ---- arena ---- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

typedef struct {
    chunk *head;
    size_t total, limit;
} arena;

static void *arena_alloc(arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->used + n > a->head->cap) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->total + cap > a->limit) return NULL;
        chunk *c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
        a->total += cap;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void arena_free(arena *a)
{
    while (a->head) {
        chunk *c = a->head;
        a->head = c->next;
        free(c);
    }
}

/* ---- values ---- */

typedef struct {
    const char *p;
    size_t n;
    const uint8_t *m; /* per-byte markup flag, or NULL: all bytes are u */
    uint8_t u;
} str;

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_FUNC } vkind;

typedef struct list list;
typedef struct dict dict;

typedef struct {
    vkind k;
    union {
        bool b;
        long long i;
        double f;
        str s;
        list *l;
        dict *d;
        int fn;
    };
} value;

struct list {
    value *v;
    size_t n;
};

struct dict {
    str *key;
    value *val;
    size_t n, cap;
};

enum { FN_NAMESPACE, FN_RAISE, FN_RANGE, FN_DICT };

/* ---- lexer ---- */

typedef enum { T_TEXT, T_BLOCK, T_BEND, T_VAR, T_VEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF } tkind;

typedef struct {
    tkind k;
    const char *p; /* T_TEXT/T_NAME/T_OP: source; T_STR: decoded */
    size_t n;
    long long i;
    double f;
    int line;
} token;

typedef struct {
    arena *a;
    jinja_limits lim;
    /* lexer/parser */
    const char *src;
    const char *line_p; /* line_of() cache */
    int line_n;
    token *tk;
    size_t ntk, cap, pos;
    /* evaluator */
    dict **scope;
    size_t nscope, scope_cap;
    char *out;
    uint8_t *outm;
    size_t outn, outcap;
    size_t iters;
    int depth;
    int brk; /* 1 break, 2 continue */
} ctx;

/* Line of p; the lexer asks in increasing order, so count on from the last answer. */
static int line_of(ctx *c, const char *p)
{
    if (p < c->line_p) {
        c->line_p = c->src;
        c->line_n = 1;
    }
    for (const char *q = c->line_p; q < p; q++) c->line_n += *q == '\n';
    c->line_p = p;
    return c->line_n;
}

static ds_status nomem(void) { return ds_errorf(DS_ERR_NOMEM, "template: out of memory (or over the memory limit)"); }

static ds_status push_tok(ctx *c, token t)
{
    if (c->ntk == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        token *n = arena_alloc(c->a, cap * sizeof *n);
        if (!n) return nomem();
        if (c->ntk) memcpy(n, c->tk, c->ntk * sizeof *n);
        c->tk = n;
        c->cap = cap;
    }
    c->tk[c->ntk++] = t;
    return DS_OK;
}

/* Decodes a Python-style string literal body. */
static ds_status lex_string(ctx *c, const char **pp, int line)
{
    const char *p = *pp;
    char q = *p++;
    const char *start = p;
    while (*p && *p != q) p += (*p == '\\' && p[1]) ? 2 : 1;
    if (!*p) return ds_errorf(DS_ERR_FORMAT, "template: line %d: unterminated string literal", line);
    char *o = arena_alloc(c->a, (size_t)(p - start) + 1);
    if (!o) return nomem();
    size_t n = 0;
    for (const char *s = start; s < p; s++) {
        if (*s != '\\') {
            o[n++] = *s;
            continue;
        }
        s++;
        switch (*s) {
        case 'n': o[n++] = '\n'; break;
        case 't': o[n++] = '\t'; break;
        case 'r': o[n++] = '\r'; break;
        case '0': o[n++] = '\0'; break;
        case '\\': case '\'': case '"': o[n++] = *s; break;
        case 'x': case 'u': case 'U': {
            int digits = *s == 'x' ? 2 : *s == 'u' ? 4 : 8;
            uint32_t cp = 0;
            int d = 0;
            for (; d < digits && s + 1 < p; d++) {
                char h = s[1];
                int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (v < 0) break;
                cp = cp * 16 + (uint32_t)v;
                s++;
            }
            if (d != digits || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
                return ds_errorf(DS_ERR_FORMAT, "template: line %d: bad \\%c escape", line, *s);
            n += utf8_put(cp, o + n);
            break;
        }
        default: o[n++] = '\\'; o[n++] = *s; break;
        }
    }
    *pp = p + 1;
    return push_tok(c, (token){T_STR, o, n, 0, 0, line});
}

/* Tokenizes the inside of a tag up to its closing delimiter. */
static ds_status lex_tag(ctx *c, const char **pp, const char *close, bool *strip_after)
{
    const char *p = *pp;
    int line = line_of(c, p);
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
            if (*p == '\n') line++;
            p++;
        }
        if (!*p) return ds_errorf(DS_ERR_FORMAT, "template: line %d: missing \"%s\"", line, close);
        if ((*p == '-' || *p == '+') && !strncmp(p + 1, close, 2)) {
            *strip_after = *p == '-';
            *pp = p + 3;
            return DS_OK;
        }
        if (!strncmp(p, close, 2)) {
            *strip_after = false;
            *pp = p + 2;
            return DS_OK;
        }
        ds_status s;
        if (*p == '\'' || *p == '"') {
            s = lex_string(c, &p, line);
        } else if ((*p >= '0' && *p <= '9')) {
            char *end;
            errno = 0;
            long long iv = strtoll(p, &end, 10);
            int range_err = errno == ERANGE;
            if (*end == '.' && end[1] >= '0' && end[1] <= '9') {
                double f = strtod(p, &end);
                s = push_tok(c, (token){T_FLOAT, p, (size_t)(end - p), 0, f, line});
            } else if (range_err) {
                return ds_errorf(DS_ERR_FORMAT, "template: line %d: integer literal %.*s is outside the 64-bit range",
                                 line, (int)(end - p > 40 ? 40 : end - p), p);
            } else {
                s = push_tok(c, (token){T_INT, p, (size_t)(end - p), iv, 0, line});
            }
            p = end;
        } else if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_') {
            const char *st = p;
            while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || (*p >= '0' && *p <= '9')) p++;
            s = push_tok(c, (token){T_NAME, st, (size_t)(p - st), 0, 0, line});
        } else {
            static const char *ops2[] = {"==", "!=", "<=", ">=", "//", "**"};
            size_t n = 1;
            for (size_t i = 0; i < 6; i++)
                if (!strncmp(p, ops2[i], 2)) n = 2;
            if (n == 1 && !strchr("+-*/%~<>=()[]{}.,:|!", *p))
                return ds_errorf(DS_ERR_FORMAT, "template: line %d: unexpected character '%c'", line, *p);
            s = push_tok(c, (token){T_OP, p, n, 0, 0, line});
            p += n;
        }
        if (s) return s;
    }
}

static ds_status lex(ctx *c)
{
    const char *p = c->src;
    bool lstrip_next = false; /* a "-%}" asked to strip the next text's leading space */
    bool trim_nl = false;     /* trim_blocks: drop one newline after a block tag */
    for (;;) {
        const char *t = p;
        while (*t && !(t[0] == '{' && (t[1] == '{' || t[1] == '%' || t[1] == '#'))) t++;
        const char *ts = p, *te = t;
        if (lstrip_next)
            while (ts < te && strchr(" \t\n\r", *ts)) ts++;
        else if (trim_nl) {
            if (ts < te && *ts == '\n') ts++;
            else if (te - ts >= 2 && ts[0] == '\r' && ts[1] == '\n') ts += 2;
        }
        if (*t) {
            char mod = t[2];
            if (mod == '-') {
                while (te > ts && strchr(" \t\n\r", te[-1])) te--;
            } else if (t[1] != '{' && mod != '+') {
                /* lstrip_blocks: spaces between a line start and a block tag go */
                const char *q = te;
                while (q > ts && (q[-1] == ' ' || q[-1] == '\t')) q--;
                if (q == c->src || (q > c->src && q[-1] == '\n')) te = q;
                else if (q == ts && ts != p) te = q; /* the text was all stripped space */
            }
        }
        if (te > ts) {
            ds_status s = push_tok(c, (token){T_TEXT, ts, (size_t)(te - ts), 0, 0, line_of(c, ts)});
            if (s) return s;
        }
        if (!*t) break;
        p = t + 2;
        if (*p == '-' || *p == '+') p++;
        bool strip_after = false;
        if (t[1] == '#') {
            const char *e = strstr(p, "#}");
            if (!e) return ds_errorf(DS_ERR_FORMAT, "template: line %d: unterminated comment", line_of(c, t));
            strip_after = e > p && e[-1] == '-';
            p = e + 2;
            lstrip_next = strip_after;
            trim_nl = !strip_after;
            continue;
        }
        bool block = t[1] == '%';
        ds_status s = push_tok(c, (token){block ? T_BLOCK : T_VAR, t, 2, 0, 0, line_of(c, t)});
        if (!s) s = lex_tag(c, &p, block ? "%}" : "}}", &strip_after);
        if (!s) s = push_tok(c, (token){block ? T_BEND : T_VEND, p, 0, 0, 0, 0});
        if (s) return s;
        /* {% raw %}: copy everything up to {% endraw %} as text */
        if (block && c->ntk >= 3 && c->tk[c->ntk - 2].k == T_NAME && c->tk[c->ntk - 2].n == 3 &&
            !memcmp(c->tk[c->ntk - 2].p, "raw", 3)) {
            c->ntk -= 3;
            const char *e = strstr(p, "endraw");
            const char *open = e;
            while (open && open > p && open[-1] != '{') open--;
            if (!e || open <= p) return ds_errorf(DS_ERR_FORMAT, "template: line %d: {%% raw %%} without {%% endraw %%}", line_of(c, t));
            const char *tend = open - 1;
            if (tend > p) {
                s = push_tok(c, (token){T_TEXT, p, (size_t)(tend - p), 0, 0, line_of(c, p)});
                if (s) return s;
            }
            const char *close = strstr(e, "%}");
            if (!close) return ds_errorf(DS_ERR_FORMAT, "template: unterminated {%% endraw %%}");
            p = close + 2;
        }
        lstrip_next = strip_after;
        trim_nl = block && !strip_after;
    }
    return push_tok(c, (token){T_EOF, p, 0, 0, 0, line_of(c, p)});
}

/* ---- syntax tree ---- */

typedef enum {
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_BREAK, S_CONTINUE, S_BODY,
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS, E_NOT,
    E_AND, E_OR, E_BIN, E_COND, E_LIST, E_DICT
} nkind;

typedef struct node node;
struct node {
    nkind k;
    int line;
    char op[3];   /* E_BIN operator, or "in"/"ni" (not in) */
    bool neg;     /* E_TEST: "is not" */
    str name;     /* E_NAME/E_ATTR/E_FILTER/E_TEST/S_SET/S_FOR names */
    str name2;    /* S_SET attribute; S_FOR second target */
    value lit;
    node *a, *b, *c, *d; /* operands / cond, then, else / iter, body, else, filter */
    node **kids;  /* S_BODY statements; E_CALL/E_FILTER/E_TEST args; E_LIST items; E_DICT k,v pairs */
    size_t nkids;
    str *kwname;  /* keyword arguments */
    node **kwval;
    size_t nkw;
};

static node *mk(ctx *c, nkind k, int line)
{
    node *n = arena_alloc(c->a, sizeof *n);
    if (n) {
        memset(n, 0, sizeof *n);
        n->k = k;
        n->line = line;
    }
    return n;
}

static token *peek(ctx *c) { return &c->tk[c->pos]; }
static bool is_op(token *t, const char *op) { return t->k == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n); }
static bool is_name(token *t, const char *nm) { return t->k == T_NAME && t->n == strlen(nm) && !memcmp(t->p, nm, t->n); }
static str mkstr(const char *p, size_t n, uint8_t u) { return (str){p, n, NULL, u}; }

static ds_status syntax(token *t, const char *what)
{
    return ds_errorf(DS_ERR_FORMAT, "template: line %d: expected %s, found \"%.*s\"", t->line, what,
                     t->k == T_EOF ? 11 : (int)(t->n > 40 ? 40 : t->n), t->k == T_EOF ? "end of text" : t->p);
}

static ds_status expect_op(ctx *c, const char *op)
{
    if (!is_op(peek(c), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        return syntax(peek(c), w);
    }
    c->pos++;
    return DS_OK;
}

/* A growable array of node pointers in the arena. */
typedef struct {
    node **v;
    size_t n, cap;
} nvec;

static bool nvec_push(ctx *c, nvec *v, node *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        node **nv = arena_alloc(c->a, cap * sizeof *nv);
        if (!nv) return false;
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return true;
}

static ds_status parse_expr(ctx *c, node **out);
static ds_status parse_or(ctx *c, node **out);

#define DEPTH_IN(c, t) do { if (++(c)->depth > (c)->lim.max_depth) { (c)->depth--; \
    return ds_errorf(DS_ERR_RANGE, "template: line %d: nesting deeper than %d", (t)->line, (c)->lim.max_depth); } } while (0)

/* (args, kw=val) after the '(' */
static ds_status parse_args(ctx *c, node *n)
{
    nvec args = {0}, kw = {0};
    str *names = NULL;
    size_t nn = 0, ncap = 0;
    while (!is_op(peek(c), ")")) {
        token *t = peek(c);
        node *v;
        if (t->k == T_NAME && is_op(&c->tk[c->pos + 1], "=")) {
            c->pos += 2;
            ds_status s = parse_expr(c, &v);
            if (s) return s;
            if (nn == ncap) {
                ncap = ncap ? ncap * 2 : 4;
                str *nv = arena_alloc(c->a, ncap * sizeof *nv);
                if (!nv) return nomem();
                if (nn) memcpy(nv, names, nn * sizeof *nv);
                names = nv;
            }
            names[nn++] = mkstr(t->p, t->n, 1);
            if (!nvec_push(c, &kw, v)) return nomem();
        } else {
            ds_status s = parse_expr(c, &v);
            if (s) return s;
            if (!nvec_push(c, &args, v)) return nomem();
        }
        if (!is_op(peek(c), ",")) break;
        c->pos++;
    }
    ds_status s = expect_op(c, ")");
    if (s) return s;
    n->kids = args.v;
    n->nkids = args.n;
    n->kwname = names;
    n->kwval = kw.v;
    n->nkw = kw.n;
    return DS_OK;
}

static ds_status parse_primary(ctx *c, node **out)
{
    token *t = peek(c);
    node *n = NULL;
    ds_status s = DS_OK;
    if (t->k == T_STR || t->k == T_INT || t->k == T_FLOAT) {
        c->pos++;
        if (!(n = mk(c, E_LIT, t->line))) return nomem();
        if (t->k == T_STR) {
            n->lit.k = V_STR;
            n->lit.s = mkstr(t->p, t->n, 1);
            /* adjacent string literals concatenate */
            while (peek(c)->k == T_STR) {
                token *u = &c->tk[c->pos++];
                char *j = arena_alloc(c->a, n->lit.s.n + u->n + 1);
                if (!j) return nomem();
                memcpy(j, n->lit.s.p, n->lit.s.n);
                memcpy(j + n->lit.s.n, u->p, u->n);
                n->lit.s = mkstr(j, n->lit.s.n + u->n, 1);
            }
        } else if (t->k == T_INT) {
            n->lit.k = V_INT;
            n->lit.i = t->i;
        } else {
            n->lit.k = V_FLOAT;
            n->lit.f = t->f;
        }
    } else if (t->k == T_NAME) {
        c->pos++;
        if (!(n = mk(c, E_LIT, t->line))) return nomem();
        if (is_name(t, "true") || is_name(t, "True")) n->lit = (value){.k = V_BOOL, .b = true};
        else if (is_name(t, "false") || is_name(t, "False")) n->lit = (value){.k = V_BOOL, .b = false};
        else if (is_name(t, "none") || is_name(t, "None")) n->lit.k = V_NONE;
        else {
            n->k = E_NAME;
            n->name = mkstr(t->p, t->n, 1);
        }
    } else if (is_op(t, "(")) {
        c->pos++;
        if ((s = parse_expr(c, &n))) return s;
        if (is_op(peek(c), ",")) { /* a tuple: kept as a list */
            nvec items = {0};
            if (!nvec_push(c, &items, n)) return nomem();
            while (is_op(peek(c), ",")) {
                c->pos++;
                if (is_op(peek(c), ")")) break;
                node *x;
                if ((s = parse_expr(c, &x))) return s;
                if (!nvec_push(c, &items, x)) return nomem();
            }
            if (!(n = mk(c, E_LIST, t->line))) return nomem();
            n->kids = items.v;
            n->nkids = items.n;
        }
        if ((s = expect_op(c, ")"))) return s;
    } else if (is_op(t, "[") || is_op(t, "{")) {
        bool isdict = is_op(t, "{");
        c->pos++;
        if (!(n = mk(c, isdict ? E_DICT : E_LIST, t->line))) return nomem();
        nvec items = {0};
        while (!is_op(peek(c), isdict ? "}" : "]")) {
            node *x;
            if ((s = parse_expr(c, &x))) return s;
            if (!nvec_push(c, &items, x)) return nomem();
            if (isdict) {
                if ((s = expect_op(c, ":"))) return s;
                if ((s = parse_expr(c, &x))) return s;
                if (!nvec_push(c, &items, x)) return nomem();
            }
            if (!is_op(peek(c), ",")) break;
            c->pos++;
        }
        if ((s = expect_op(c, isdict ? "}" : "]"))) return s;
        n->kids = items.v;
        n->nkids = items.n;
    } else {
        return syntax(t, "an expression");
    }
    *out = n;
    return DS_OK;
}

/* primary followed by .attr, [index], [a:b:c], (args), |filter, is test */
static ds_status parse_postfix(ctx *c, node **out)
{
    node *n;
    ds_status s = parse_primary(c, &n);
    if (s) return s;
    for (;;) {
        token *t = peek(c);
        node *m;
        if (is_op(t, ".")) {
            c->pos++;
            token *nm = peek(c);
            if (nm->k != T_NAME) return syntax(nm, "an attribute name");
            c->pos++;
            if (!(m = mk(c, E_ATTR, t->line))) return nomem();
            m->a = n;
            m->name = mkstr(nm->p, nm->n, 1);
        } else if (is_op(t, "[")) {
            c->pos++;
            node *parts[3] = {0};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (!is_op(peek(c), ":") && !is_op(peek(c), "]")) {
                    if ((s = parse_expr(c, &parts[np]))) return s;
                }
                if (is_op(peek(c), ":") && np < 2) {
                    c->pos++;
                    slice = true;
                    np++;
                    continue;
                }
                break;
            }
            if ((s = expect_op(c, "]"))) return s;
            if (!(m = mk(c, slice ? E_SLICE : E_ITEM, t->line))) return nomem();
            m->a = n;
            m->b = parts[0];
            m->c = parts[1];
            m->d = parts[2];
            if (!slice && !parts[0]) return syntax(t, "an index");
        } else if (is_op(t, "(")) {
            c->pos++;
            if (!(m = mk(c, E_CALL, t->line))) return nomem();
            m->a = n;
            if ((s = parse_args(c, m))) return s;
        } else if (is_op(t, "|")) {
            c->pos++;
            token *nm = peek(c);
            if (nm->k != T_NAME) return syntax(nm, "a filter name");
            c->pos++;
            if (!(m = mk(c, E_FILTER, t->line))) return nomem();
            m->a = n;
            m->name = mkstr(nm->p, nm->n, 1);
            if (is_op(peek(c), "(")) {
                c->pos++;
                if ((s = parse_args(c, m))) return s;
            }
        } else if (is_name(t, "is")) {
            c->pos++;
            if (!(m = mk(c, E_TEST, t->line))) return nomem();
            if (is_name(peek(c), "not")) {
                c->pos++;
                m->neg = true;
            }
            token *nm = peek(c);
            if (nm->k != T_NAME) return syntax(nm, "a test name");
            c->pos++;
            m->a = n;
            m->name = mkstr(nm->p, nm->n, 1);
            if (is_op(peek(c), "(")) {
                c->pos++;
                if ((s = parse_args(c, m))) return s;
            } else if (peek(c)->k == T_STR || peek(c)->k == T_INT || peek(c)->k == T_FLOAT ||
                       (peek(c)->k == T_NAME && !is_name(peek(c), "and") && !is_name(peek(c), "or") &&
                        !is_name(peek(c), "else") && !is_name(peek(c), "if") && !is_name(peek(c), "in") &&
                        !is_name(peek(c), "not") && !is_name(peek(c), "is"))) {
                node *arg; /* "is divisibleby 3", "is sameas none" */
                if ((s = parse_primary(c, &arg))) return s;
                m->kids = arena_alloc(c->a, sizeof *m->kids);
                if (!m->kids) return nomem();
                m->kids[0] = arg;
                m->nkids = 1;
            }
        } else {
            break;
        }
        n = m;
    }
    *out = n;
    return DS_OK;
}

static ds_status parse_unary(ctx *c, node **out)
{
    token *t = peek(c);
    if (is_op(t, "-") || is_op(t, "+")) {
        c->pos++;
        DEPTH_IN(c, t);
        node *n = mk(c, is_op(t, "-") ? E_NEG : E_POS, t->line);
        if (!n) return nomem();
        ds_status s = parse_unary(c, &n->a);
        c->depth--;
        *out = n;
        return s;
    }
    return parse_postfix(c, out);
}

/* Binary levels, loosest first: ~ is between + - and * / as in Jinja2. */
static const char *const levels[][5] = {
    {"+", "-", NULL},
    {"~", NULL},
    {"*", "/", "//", "%", NULL},
    {"**", NULL},
};

static ds_status parse_level(ctx *c, int lv, node **out)
{
    if (lv == 4) return parse_unary(c, out);
    node *l;
    ds_status s = parse_level(c, lv + 1, &l);
    if (s) return s;
    for (;;) {
        token *t = peek(c);
        const char *op = NULL;
        for (int i = 0; levels[lv][i]; i++)
            if (is_op(t, levels[lv][i])) op = levels[lv][i];
        if (!op) break;
        c->pos++;
        DEPTH_IN(c, t);
        node *n = mk(c, E_BIN, t->line);
        if (!n) return nomem();
        strcpy(n->op, op);
        n->a = l;
        s = parse_level(c, lv + 1, &n->b);
        c->depth--;
        if (s) return s;
        l = n;
    }
    *out = l;
    return DS_OK;
}

static ds_status parse_compare(ctx *c, node **out)
{
    node *l;
    ds_status s = parse_level(c, 0, &l);
    if (s) return s;
    for (;;) {
        token *t = peek(c);
        const char *op = NULL;
        static const char *cmp[] = {"==", "!=", "<=", ">=", "<", ">"};
        for (int i = 0; i < 6; i++)
            if (is_op(t, cmp[i])) op = cmp[i];
        if (!op && is_name(t, "in")) op = "in";
        if (!op && is_name(t, "not") && is_name(&c->tk[c->pos + 1], "in")) {
            op = "ni";
            c->pos++;
        }
        if (!op) break;
        c->pos++;
        node *n = mk(c, E_BIN, t->line);
        if (!n) return nomem();
        strcpy(n->op, op);
        n->a = l;
        if ((s = parse_level(c, 0, &n->b))) return s;
        l = n;
    }
    *out = l;
    return DS_OK;
}

static ds_status parse_not(ctx *c, node **out)
{
    token *t = peek(c);
    if (is_name(t, "not")) {
        c->pos++;
        DEPTH_IN(c, t);
        node *n = mk(c, E_NOT, t->line);
        if (!n) return nomem();
        ds_status s = parse_not(c, &n->a);
        c->depth--;
        *out = n;
        return s;
    }
    return parse_compare(c, out);
}

static ds_status parse_andor(ctx *c, bool is_or, node **out)
{
    node *l;
    ds_status s = is_or ? parse_andor(c, false, &l) : parse_not(c, &l);
    if (s) return s;
    while (is_name(peek(c), is_or ? "or" : "and")) {
        token *t = &c->tk[c->pos++];
        node *n = mk(c, is_or ? E_OR : E_AND, t->line);
        if (!n) return nomem();
        n->a = l;
        if ((s = is_or ? parse_andor(c, false, &n->b) : parse_not(c, &n->b))) return s;
        l = n;
    }
    *out = l;
    return DS_OK;
}

static ds_status parse_or(ctx *c, node **out) { return parse_andor(c, true, out); }

static ds_status parse_expr(ctx *c, node **out)
{
    token *t0 = peek(c);
    DEPTH_IN(c, t0);
    node *v;
    ds_status s = parse_or(c, &v);
    if (!s && is_name(peek(c), "if")) { /* v if cond [else other] */
        token *t = &c->tk[c->pos++];
        node *n = mk(c, E_COND, t->line);
        if (!n) s = nomem();
        else {
            n->b = v;
            s = parse_or(c, &n->a);
            if (!s && is_name(peek(c), "else")) {
                c->pos++;
                s = parse_expr(c, &n->c);
            }
            v = n;
        }
    }
    c->depth--;
    *out = v;
    return s;
}

/* Parses statements until a {% name %} in stop (returned in *which). */
static ds_status parse_body(ctx *c, const char *const *stop, node **out, const char **which);

static ds_status expect_bend(ctx *c)
{
    if (peek(c)->k != T_BEND) return syntax(peek(c), "'%}'");
    c->pos++;
    return DS_OK;
}

static ds_status parse_if(ctx *c, token *t, node **out)
{
    static const char *const stop[] = {"elif", "else", "endif", NULL};
    node *n = mk(c, S_IF, t->line);
    if (!n) return nomem();
    ds_status s = parse_expr(c, &n->a);
    if (!s) s = expect_bend(c);
    const char *which = NULL;
    if (!s) s = parse_body(c, stop, &n->b, &which);
    if (s) return s;
    if (!strcmp(which, "elif")) {
        s = parse_if(c, &c->tk[c->pos - 1], &n->c);
    } else if (!strcmp(which, "else")) {
        static const char *const stop2[] = {"endif", NULL};
        s = expect_bend(c);
        if (!s) s = parse_body(c, stop2, &n->c, &which);
        if (!s) s = expect_bend(c);
    } else {
        s = expect_bend(c);
    }
    *out = n;
    return s;
}

static ds_status parse_stmt(ctx *c, node **out, const char *const *stop, const char **which)
{
    token *bt = &c->tk[c->pos++]; /* T_BLOCK */
    token *t = peek(c);
    if (t->k != T_NAME) return syntax(t, "a statement name");
    if (stop)
        for (int i = 0; stop[i]; i++)
            if (is_name(t, stop[i])) {
                c->pos++;
                *which = stop[i];
                *out = NULL;
                return DS_OK;
            }
    c->pos++;
    ds_status s = DS_OK;
    DEPTH_IN(c, t);
    if (is_name(t, "if")) {
        s = parse_if(c, t, out);
    } else if (is_name(t, "for")) {
        static const char *const stop1[] = {"else", "endfor", NULL};
        node *n = mk(c, S_FOR, t->line);
        if (!n) return nomem();
        token *v = peek(c);
        if (v->k != T_NAME) return syntax(v, "a loop variable");
        c->pos++;
        n->name = mkstr(v->p, v->n, 1);
        if (is_op(peek(c), ",")) {
            c->pos++;
            token *v2 = peek(c);
            if (v2->k != T_NAME) return syntax(v2, "a loop variable");
            c->pos++;
            n->name2 = mkstr(v2->p, v2->n, 1);
        }
        if (!is_name(peek(c), "in")) return syntax(peek(c), "'in'");
        c->pos++;
        s = parse_or(c, &n->a);
        if (!s && is_name(peek(c), "if")) {
            c->pos++;
            s = parse_or(c, &n->d);
        }
        if (!s && is_name(peek(c), "recursive"))
            s = ds_errorf(DS_ERR_UNSUPPORTED, "template: line %d: recursive loops are not supported", t->line);
        if (!s) s = expect_bend(c);
        const char *w = NULL;
        if (!s) s = parse_body(c, stop1, &n->b, &w);
        if (!s && !strcmp(w, "else")) {
            static const char *const stop2[] = {"endfor", NULL};
            s = expect_bend(c);
            if (!s) s = parse_body(c, stop2, &n->c, &w);
        }
        if (!s) s = expect_bend(c);
        *out = n;
    } else if (is_name(t, "set")) {
        token *v = peek(c);
        if (v->k != T_NAME) return syntax(v, "a variable name");
        c->pos++;
        node *n = mk(c, S_SET, t->line);
        if (!n) return nomem();
        n->name = mkstr(v->p, v->n, 1);
        if (is_op(peek(c), ".")) {
            c->pos++;
            token *a = peek(c);
            if (a->k != T_NAME) return syntax(a, "an attribute name");
            c->pos++;
            n->name2 = mkstr(a->p, a->n, 1);
        }
        if (is_op(peek(c), "=")) {
            c->pos++;
            s = parse_expr(c, &n->a);
            if (!s) s = expect_bend(c);
        } else {
            static const char *const stop1[] = {"endset", NULL};
            const char *w;
            n->k = S_SETBLOCK;
            s = expect_bend(c);
            if (!s) s = parse_body(c, stop1, &n->b, &w);
            if (!s) s = expect_bend(c);
        }
        *out = n;
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        if (!(*out = mk(c, is_name(t, "break") ? S_BREAK : S_CONTINUE, t->line))) return nomem();
        s = expect_bend(c);
    } else if (is_name(t, "generation") || is_name(t, "endgeneration")) {
        /* transformers' AssistantTracker marks: no output of their own */
        if (!(*out = mk(c, S_BODY, t->line))) return nomem();
        s = expect_bend(c);
    } else {
        s = ds_errorf(DS_ERR_UNSUPPORTED, "template: line %d: {%% %.*s %%} is not supported or is out of place",
                      bt->line, (int)t->n, t->p);
    }
    c->depth--;
    return s;
}

static ds_status parse_body(ctx *c, const char *const *stop, node **out, const char **which)
{
    nvec v = {0};
    node *body = mk(c, S_BODY, peek(c)->line);
    if (!body) return nomem();
    for (;;) {
        token *t = peek(c);
        node *n = NULL;
        if (t->k == T_EOF) {
            if (stop) {
                size_t k = 0;
                while (stop[k + 1]) k++; /* the closing tag is listed last */
                return ds_errorf(DS_ERR_FORMAT, "template: missing {%% %s %%} at the end", stop[k]);
            }
            break;
        }
        if (t->k == T_TEXT) {
            c->pos++;
            if (!(n = mk(c, S_TEXT, t->line))) return nomem();
            n->lit.k = V_STR;
            n->lit.s = mkstr(t->p, t->n, 1);
        } else if (t->k == T_VAR) {
            c->pos++;
            if (!(n = mk(c, S_OUT, t->line))) return nomem();
            ds_status s = parse_expr(c, &n->a);
            if (s) return s;
            if (peek(c)->k != T_VEND) return syntax(peek(c), "'}}'");
            c->pos++;
        } else if (t->k == T_BLOCK) {
            const char *w = NULL;
            ds_status s = parse_stmt(c, &n, stop, &w);
            if (s) return s;
            if (w) {
                *which = w;
                break;
            }
        } else {
            return syntax(t, "text or a tag");
        }
        if (!nvec_push(c, &v, n)) return nomem();
    }
    body->kids = v.v;
    body->nkids = v.n;
    *out = body;
    return DS_OK;
}

/* ---- evaluation helpers ---- */

static ds_status rt_err(node *n, const char *fmt, ...) DS_PRINTF(2, 3);
static ds_status rt_err(node *n, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ds_errorf(DS_ERR_ARG, "template: line %d: %s", n ? n->line : 0, msg);
}

static const char *kind_name(vkind k)
{
    static const char *names[] = {"undefined", "none", "bool", "int", "float", "string", "list", "dict",
                                  "namespace", "function"};
    return names[k];
}

static bool truthy(value v)
{
    switch (v.k) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v.b;
    case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0;
    case V_STR: return v.s.n != 0;
    case V_LIST: return v.l->n != 0;
    case V_DICT: case V_NS: return v.d->n != 0 || v.k == V_NS;
    case V_FUNC: return true;
    }
    return false;
}

static value vstr(str s) { return (value){.k = V_STR, .s = s}; }
static value vint(long long i) { return (value){.k = V_INT, .i = i}; }
static value vbool(bool b) { return (value){.k = V_BOOL, .b = b}; }

static uint8_t mask_at(str s, size_t i) { return s.m ? s.m[i] : s.u; }

static bool str_eq(str a, str b) { return a.n == b.n && !memcmp(a.p, b.p, a.n); }

static str substr(str s, size_t a, size_t b)
{
    return (str){s.p + a, b - a, s.m ? s.m + a : NULL, s.u};
}

/* A string builder with a mask. */
typedef struct {
    ctx *c;
    char *p;
    uint8_t *m;
    size_t n, cap;
    bool uniform;
    uint8_t u;
    bool fail;
} sbuf;

static void sb_init(sbuf *b, ctx *c) { memset(b, 0, sizeof *b), b->c = c, b->uniform = true, b->u = 2; }

static void sb_add(sbuf *b, str s)
{
    if (b->fail || !s.n) return;
    if (b->n + s.n > b->c->lim.max_output) {
        b->fail = true;
        return;
    }
    if (b->n + s.n > b->cap) {
        size_t cap = (b->n + s.n) * 2 + 32;
        char *np = arena_alloc(b->c->a, cap);
        uint8_t *nm = arena_alloc(b->c->a, cap);
        if (!np || !nm) {
            b->fail = true;
            return;
        }
        if (b->n) {
            memcpy(np, b->p, b->n);
            memcpy(nm, b->m, b->n);
        }
        b->p = np;
        b->m = nm;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s.p, s.n);
    if (s.m) memcpy(b->m + b->n, s.m, s.n);
    else memset(b->m + b->n, s.u, s.n);
    for (size_t i = 0; i < s.n && b->uniform; i++) {
        uint8_t m = mask_at(s, i);
        if (b->u == 2) b->u = m;
        else if (m != b->u) b->uniform = false;
    }
    b->n += s.n;
}

static void sb_addc(sbuf *b, const char *p, size_t n, uint8_t u) { sb_add(b, mkstr(p, n, u)); }
static void sb_adds(sbuf *b, const char *p, uint8_t u) { sb_addc(b, p, strlen(p), u); }

static ds_status sb_done(sbuf *b, node *n, str *out)
{
    if (b->fail)
        return b->n + 1 > b->c->lim.max_output
                   ? rt_err(n, "a string is longer than the limit of %zu bytes", b->c->lim.max_output)
                   : rt_err(n, "out of memory (limit %zu bytes)", b->c->lim.max_memory);
    *out = (str){b->p ? b->p : "", b->n, b->uniform ? NULL : b->m, b->uniform && b->u != 2 ? b->u : 1};
    return DS_OK;
}

typedef struct repr_path repr_path;
static void repr(sbuf *b, value v, bool quote, const repr_path *up);

static void json_str(sbuf *b, str s, bool ascii)
{
    sb_addc(b, "\"", 1, 0);
    size_t i = 0;
    while (i < s.n) {
        unsigned char ch = (unsigned char)s.p[i];
        char e[16];
        if (ch == '"' || ch == '\\') {
            e[0] = '\\';
            e[1] = (char)ch;
            sb_addc(b, e, 2, 0);
        } else if (ch < 0x20) {
            const char *sh = ch == '\n' ? "\\n" : ch == '\r' ? "\\r" : ch == '\t' ? "\\t" : ch == '\b' ? "\\b"
                           : ch == '\f' ? "\\f" : NULL;
            if (sh) sb_adds(b, sh, 0);
            else {
                snprintf(e, sizeof e, "\\u%04x", ch);
                sb_adds(b, e, 0);
            }
        } else if (ch >= 0x80 && ascii) {
            uint32_t cp;
            size_t bad;
            int inc;
            size_t l = utf8_next((const uint8_t *)s.p + i, s.n - i, &cp, &bad, &inc);
            if (!l) {
                cp = 0xFFFD;
                l = bad;
            }
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(e, sizeof e, "\\u%04x", cp);
            }
            sb_adds(b, e, 0);
            i += l;
            continue;
        } else {
            sb_add(b, substr(s, i, i + 1));
        }
        i++;
    }
    sb_addc(b, "\"", 1, 0);
}

static void fmt_float(char *buf, size_t n, double f)
{
    if (isnan(f)) snprintf(buf, n, "nan");
    else if (isinf(f)) snprintf(buf, n, f > 0 ? "inf" : "-inf");
    else {
        /* shortest repr that round-trips, like Python */
        for (int p = 1; p <= 17; p++) {
            snprintf(buf, n, "%.*g", p, f);
            if (strtod(buf, NULL) == f) break;
        }
        if (!strpbrk(buf, ".en")) strncat(buf, ".0", n - strlen(buf) - 1);
    }
}

/* tojson as transformers defines it: json.dumps(x, ensure_ascii=False),
 * separators ", " and ": ", keys in insertion order. */
static void to_json(sbuf *b, value v, int indent, int level, bool ascii)
{
    char tmp[64];
    switch (v.k) {
    case V_UNDEF: case V_NONE: sb_adds(b, "null", 0); break;
    case V_BOOL: sb_adds(b, v.b ? "true" : "false", 0); break;
    case V_INT: snprintf(tmp, sizeof tmp, "%lld", v.i); sb_adds(b, tmp, 0); break;
    case V_FLOAT: fmt_float(tmp, sizeof tmp, v.f);
        sb_adds(b, !strcmp(tmp, "nan") ? "NaN" : !strcmp(tmp, "inf") ? "Infinity" : !strcmp(tmp, "-inf") ? "-Infinity" : tmp, 0);
        break;
    case V_STR: json_str(b, v.s, ascii); break;
    case V_FUNC: sb_adds(b, "null", 0); break;
    case V_LIST: case V_DICT: case V_NS: {
        bool isl = v.k == V_LIST;
        size_t n = isl ? v.l->n : v.d->n;
        sb_adds(b, isl ? "[" : "{", 0);
        for (size_t i = 0; i < n; i++) {
            if (i) sb_adds(b, indent >= 0 ? "," : ", ", 0);
            if (indent >= 0) {
                sb_adds(b, "\n", 0);
                for (int k = 0; k < (level + 1) * indent; k++) sb_adds(b, " ", 0);
            }
            if (isl) to_json(b, v.l->v[i], indent, level + 1, ascii);
            else {
                json_str(b, v.d->key[i], ascii);
                sb_adds(b, ": ", 0);
                to_json(b, v.d->val[i], indent, level + 1, ascii);
            }
        }
        if (indent >= 0 && n) {
            sb_adds(b, "\n", 0);
            for (int k = 0; k < level * indent; k++) sb_adds(b, " ", 0);
        }
        sb_adds(b, isl ? "]" : "}", 0);
        break;
    }
    }
}

/* The containers being printed, innermost first: a container met again inside
 * itself prints as Python prints it ("[...]", "{...}", a namespace's dict as
 * "{...}" inside "<Namespace ...>") instead of recursing forever. */
struct repr_path {
    const void *container;
    const repr_path *up;
    int depth;
};

/* Nesting printed in full; deeper levels print as "..." (Python would raise a
 * RecursionError near 1000 levels; the native stack must stay bounded). */
enum { REPR_MAX_DEPTH = 64 };

static bool repr_seen(const repr_path *p, const void *container)
{
    for (; p; p = p->up)
        if (p->container == container) return true;
    return false;
}

/* str(v) as Python prints it; quote: repr() inside containers. */
static void repr(sbuf *b, value v, bool quote, const repr_path *up)
{
    char tmp[64];
    const void *container = v.k == V_LIST ? (const void *)v.l : v.k == V_DICT || v.k == V_NS ? (const void *)v.d : NULL;
    if (container && (repr_seen(up, container) || (up && up->depth >= REPR_MAX_DEPTH))) {
        sb_adds(b, v.k == V_LIST ? "[...]" : v.k == V_NS ? "<Namespace {...}>" : "{...}", 0);
        return;
    }
    repr_path here = {container, up, up ? up->depth + 1 : 1};
    switch (v.k) {
    case V_UNDEF: break;
    case V_NONE: sb_adds(b, "None", 1); break;
    case V_BOOL: sb_adds(b, v.b ? "True" : "False", 1); break;
    case V_INT: snprintf(tmp, sizeof tmp, "%lld", v.i); sb_adds(b, tmp, 1); break;
    case V_FLOAT: fmt_float(tmp, sizeof tmp, v.f); sb_adds(b, tmp, 1); break;
    case V_STR:
        if (quote) {
            bool dq = memchr(v.s.p, '\'', v.s.n) && !memchr(v.s.p, '"', v.s.n);
            sb_adds(b, dq ? "\"" : "'", 0);
            for (size_t i = 0; i < v.s.n; i++) {
                char ch = v.s.p[i];
                if (ch == '\\' || (!dq && ch == '\'')) sb_adds(b, "\\", 0);
                if (ch == '\n') sb_adds(b, "\\n", 0);
                else if (ch == '\t') sb_adds(b, "\\t", 0);
                else if (ch == '\r') sb_adds(b, "\\r", 0);
                else sb_add(b, substr(v.s, i, i + 1));
            }
            sb_adds(b, dq ? "\"" : "'", 0);
        } else {
            sb_add(b, v.s);
        }
        break;
    case V_LIST:
        sb_adds(b, "[", 0);
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) sb_adds(b, ", ", 0);
            repr(b, v.l->v[i], true, &here);
        }
        sb_adds(b, "]", 0);
        break;
    case V_DICT: case V_NS:
        sb_adds(b, v.k == V_NS ? "<Namespace {" : "{", 0);
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) sb_adds(b, ", ", 0);
            repr(b, vstr(v.d->key[i]), true, &here);
            sb_adds(b, ": ", 0);
            repr(b, v.d->val[i], true, &here);
        }
        sb_adds(b, v.k == V_NS ? "}>" : "}", 0);
        break;
    case V_FUNC: sb_adds(b, "<function>", 1); break;
    }
}

static ds_status to_str(ctx *c, node *n, value v, str *out)
{
    if (v.k == V_STR) {
        *out = v.s;
        return DS_OK;
    }
    sbuf b;
    sb_init(&b, c);
    repr(&b, v, false, NULL);
    return sb_done(&b, n, out);
}

static dict *dict_new(ctx *c, size_t cap)
{
    dict *d = arena_alloc(c->a, sizeof *d);
    if (!d) return NULL;
    d->n = 0;
    d->cap = cap < 4 ? 4 : cap;
    d->key = arena_alloc(c->a, d->cap * sizeof *d->key);
    d->val = arena_alloc(c->a, d->cap * sizeof *d->val);
    return d->key && d->val ? d : NULL;
}

static value *dict_find(dict *d, str k)
{
    for (size_t i = d->n; i-- > 0;)
        if (str_eq(d->key[i], k)) return &d->val[i];
    return NULL;
}

static bool dict_set(ctx *c, dict *d, str k, value v)
{
    value *p = dict_find(d, k);
    if (p) {
        *p = v;
        return true;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap * 2;
        str *nk = arena_alloc(c->a, cap * sizeof *nk);
        value *nv = arena_alloc(c->a, cap * sizeof *nv);
        if (!nk || !nv) return false;
        memcpy(nk, d->key, d->n * sizeof *nk);
        memcpy(nv, d->val, d->n * sizeof *nv);
        d->key = nk;
        d->val = nv;
        d->cap = cap;
    }
    d->key[d->n] = k;
    d->val[d->n++] = v;
    return true;
}

static list *list_new(ctx *c, size_t n)
{
    list *l = arena_alloc(c->a, sizeof *l);
    if (!l) return NULL;
    l->n = n;
    l->v = arena_alloc(c->a, (n ? n : 1) * sizeof *l->v);
    return l->v ? l : NULL;
}

static ds_status from_json(ctx *c, json_t *j, uint8_t u, value *out, int depth)
{
    if (depth > c->lim.max_depth) return ds_errorf(DS_ERR_RANGE, "template: variables nested deeper than %d", c->lim.max_depth);
    switch (json_typeof(j)) {
    case JSON_NULL: out->k = V_NONE; return DS_OK;
    case JSON_TRUE: *out = vbool(true); return DS_OK;
    case JSON_FALSE: *out = vbool(false); return DS_OK;
    case JSON_INTEGER: *out = vint((long long)json_integer_value(j)); return DS_OK;
    case JSON_REAL: *out = (value){.k = V_FLOAT, .f = json_real_value(j)}; return DS_OK;
    case JSON_STRING: {
        size_t n = json_string_length(j);
        char *p = arena_alloc(c->a, n + 1);
        if (!p) return nomem();
        memcpy(p, json_string_value(j), n + 1);
        *out = vstr(mkstr(p, n, u));
        return DS_OK;
    }
    case JSON_ARRAY: {
        list *l = list_new(c, json_array_size(j));
        if (!l) return nomem();
        for (size_t i = 0; i < l->n; i++) {
            ds_status s = from_json(c, json_array_get(j, i), u, &l->v[i], depth + 1);
            if (s) return s;
        }
        *out = (value){.k = V_LIST, .l = l};
        return DS_OK;
    }
    case JSON_OBJECT: {
        dict *d = dict_new(c, json_object_size(j));
        if (!d) return nomem();
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) {
            value x;
            ds_status s = from_json(c, v, u, &x, depth + 1);
            if (s) return s;
            size_t kn = strlen(k);
            char *kp = arena_alloc(c->a, kn + 1);
            if (!kp) return nomem();
            memcpy(kp, k, kn + 1);
            d->key[d->n] = mkstr(kp, kn, u);
            d->val[d->n++] = x;
        }
        *out = (value){.k = V_DICT, .d = d};
        return DS_OK;
    }
    }
    return ds_errorf(DS_ERR_INTERNAL, "template: unknown JSON type");
}

/* ---- evaluation ---- */

static ds_status eval(ctx *c, node *n, value *out);
static ds_status exec(ctx *c, node *n);

static value lookup(ctx *c, str name)
{
    for (size_t i = c->nscope; i-- > 0;) {
        value *v = dict_find(c->scope[i], name);
        if (v) return *v;
    }
    static const struct { const char *name; int fn; } fns[] = {
        {"namespace", FN_NAMESPACE}, {"raise_exception", FN_RAISE}, {"range", FN_RANGE}, {"dict", FN_DICT}};
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
        if (name.n == strlen(fns[i].name) && !memcmp(name.p, fns[i].name, name.n))
            return (value){.k = V_FUNC, .fn = fns[i].fn};
    return (value){.k = V_UNDEF};
}

static bool push_scope(ctx *c)
{
    if (c->nscope == c->scope_cap) {
        size_t cap = c->scope_cap * 2 + 8;
        dict **ns = arena_alloc(c->a, cap * sizeof *ns);
        if (!ns) return false;
        if (c->nscope) memcpy(ns, c->scope, c->nscope * sizeof *ns);
        c->scope = ns;
        c->scope_cap = cap;
    }
    return (c->scope[c->nscope++] = dict_new(c, 4)) != NULL;
}

static size_t cp_count(str s)
{
    size_t n = 0;
    for (size_t i = 0; i < s.n; i++) n += ((uint8_t)s.p[i] & 0xC0) != 0x80;
    return n;
}

/* Byte offset of code point index k (clamped to the end). */
static size_t cp_offset(str s, size_t k)
{
    size_t i = 0;
    while (i < s.n && k) {
        i++;
        while (i < s.n && ((uint8_t)s.p[i] & 0xC0) == 0x80) i++;
        k--;
    }
    return i;
}

static bool num(value v, double *d)
{
    if (v.k == V_INT) *d = (double)v.i;
    else if (v.k == V_FLOAT) *d = v.f;
    else if (v.k == V_BOOL) *d = v.b;
    else return false;
    return true;
}

static bool equal(value a, value b)
{
    double x, y;
    if (num(a, &x) && num(b, &y)) {
        if (a.k != V_FLOAT && b.k != V_FLOAT) return (a.k == V_INT ? a.i : a.b) == (b.k == V_INT ? b.i : b.b);
        return x == y;
    }
    if (a.k != b.k) return false;
    switch (a.k) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return str_eq(a.s, b.s);
    case V_LIST:
        if (a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!equal(a.l->v[i], b.l->v[i])) return false;
        return true;
    case V_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            value *o = dict_find(b.d, a.d->key[i]);
            if (!o || !equal(a.d->val[i], *o)) return false;
        }
        return true;
    case V_NS: return a.d == b.d;
    case V_FUNC: return a.fn == b.fn;
    default: return false;
    }
}

static ds_status contains(node *n, value hay, value needle, bool *r)
{
    if (hay.k == V_STR) {
        if (needle.k != V_STR) return rt_err(n, "'in <string>' requires a string, not %s", kind_name(needle.k));
        *r = needle.s.n == 0 || memmem(hay.s.p, hay.s.n, needle.s.p, needle.s.n) != NULL;
    } else if (hay.k == V_LIST) {
        *r = false;
        for (size_t i = 0; i < hay.l->n && !*r; i++) *r = equal(hay.l->v[i], needle);
    } else if (hay.k == V_DICT || hay.k == V_NS) {
        *r = needle.k == V_STR && dict_find(hay.d, needle.s) != NULL;
    } else {
        return rt_err(n, "'in' needs a string, list or dict on the right, not %s", kind_name(hay.k));
    }
    return DS_OK;
}

static ds_status compare(node *n, value a, value b, int *r)
{
    double x, y;
    if (num(a, &x) && num(b, &y)) {
        *r = (x > y) - (x < y);
        return DS_OK;
    }
    if (a.k == V_STR && b.k == V_STR) {
        size_t m = a.s.n < b.s.n ? a.s.n : b.s.n;
        int k = memcmp(a.s.p, b.s.p, m);
        *r = k ? (k > 0) - (k < 0) : (a.s.n > b.s.n) - (a.s.n < b.s.n);
        return DS_OK;
    }
    return rt_err(n, "cannot order %s and %s", kind_name(a.k), kind_name(b.k));
}

static ds_status concat(ctx *c, node *n, str a, str b, value *out)
{
    sbuf sb;
    sb_init(&sb, c);
    sb_add(&sb, a);
    sb_add(&sb, b);
    out->k = V_STR;
    return sb_done(&sb, n, &out->s);
}

static ds_status int_overflow(node *n, const char *op)
{
    return rt_err(n, "integer overflow in '%s': the result is outside the 64-bit range this engine's integers have", op);
}

static ds_status binop(ctx *c, node *n, value a, value b, value *out)
{
    const char *op = n->op;
    ds_status s;
    if (!strcmp(op, "~")) {
        str x, y;
        if ((s = to_str(c, n, a, &x)) || (s = to_str(c, n, b, &y))) return s;
        return concat(c, n, x, y, out);
    }
    if (!strcmp(op, "==") || !strcmp(op, "!=")) {
        *out = vbool(equal(a, b) == (op[0] == '='));
        return DS_OK;
    }
    if (!strcmp(op, "in") || !strcmp(op, "ni")) {
        bool r;
        if ((s = contains(n, b, a, &r))) return s;
        *out = vbool(r == (op[0] == 'i'));
        return DS_OK;
    }
    if (op[0] == '<' || op[0] == '>') {
        int r;
        if ((s = compare(n, a, b, &r))) return s;
        bool v = op[0] == '<' ? (op[1] ? r <= 0 : r < 0) : (op[1] ? r >= 0 : r > 0);
        *out = vbool(v);
        return DS_OK;
    }
    if (!strcmp(op, "+") && a.k == V_STR && b.k == V_STR) return concat(c, n, a.s, b.s, out);
    if (!strcmp(op, "+") && a.k == V_LIST && b.k == V_LIST) {
        list *l = list_new(c, a.l->n + b.l->n);
        if (!l) return nomem();
        memcpy(l->v, a.l->v, a.l->n * sizeof *l->v);
        memcpy(l->v + a.l->n, b.l->v, b.l->n * sizeof *l->v);
        *out = (value){.k = V_LIST, .l = l};
        return DS_OK;
    }
    if (!strcmp(op, "*") && ((a.k == V_STR && b.k == V_INT) || (a.k == V_INT && b.k == V_STR))) {
        str x = a.k == V_STR ? a.s : b.s;
        long long k = a.k == V_INT ? a.i : b.i;
        if (k > 0 && x.n && (unsigned long long)k > c->lim.max_output / x.n)
            return rt_err(n, "string repetition longer than the limit of %zu bytes", c->lim.max_output);
        sbuf sb;
        sb_init(&sb, c);
        for (long long i = 0; x.n && i < k; i++) sb_add(&sb, x); /* '' * k is '' at once */
        out->k = V_STR;
        return sb_done(&sb, n, &out->s);
    }
    double x, y;
    if (!num(a, &x) || !num(b, &y))
        return rt_err(n, "unsupported operand types for %s: %s and %s", op, kind_name(a.k), kind_name(b.k));
    bool ints = a.k != V_FLOAT && b.k != V_FLOAT;
    /* Integers are 64-bit here (Python's are unbounded): a result outside
     * that range is an error, never a wrapped value or a trap. */
    long long i = ints ? (a.k == V_INT ? a.i : (long long)x) : 0, j = ints ? (b.k == V_INT ? b.i : (long long)y) : 0;
    if (!strcmp(op, "/")) {
        if (y == 0) return rt_err(n, "division by zero");
        *out = (value){.k = V_FLOAT, .f = x / y};
    } else if (!strcmp(op, "//") || !strcmp(op, "%")) {
        if (y == 0) return rt_err(n, "division by zero");
        if (ints) {
            if (i == LLONG_MIN && j == -1) {
                if (op[1]) return int_overflow(n, op);
                *out = vint(0);
                return DS_OK;
            }
            long long q = i / j, r = i % j;
            if (r && ((r < 0) != (j < 0))) {
                q--;
                r += j;
            }
            *out = vint(op[1] ? q : r);
        } else {
            double q = floor(x / y);
            *out = (value){.k = V_FLOAT, .f = op[1] ? q : x - q * y};
        }
    } else if (!strcmp(op, "**")) {
        if (ints && j >= 0) {
            /* |i| >= 2 overflows within 63 steps; 0, 1 and -1 are closed forms */
            long long r = i == 0 ? (j == 0) : i == 1 ? 1 : i == -1 ? (j % 2 ? -1 : 1) : 1;
            for (long long k = 0; (i < -1 || i > 1) && k < j; k++)
                if (__builtin_mul_overflow(r, i, &r)) return int_overflow(n, op);
            *out = vint(r);
        } else {
            *out = (value){.k = V_FLOAT, .f = pow(x, y)};
        }
    } else if (ints) {
        long long r;
        bool ovf = op[0] == '+' ? __builtin_add_overflow(i, j, &r)
                   : op[0] == '-' ? __builtin_sub_overflow(i, j, &r) : __builtin_mul_overflow(i, j, &r);
        if (ovf) return int_overflow(n, op);
        *out = vint(r);
    } else {
        *out = (value){.k = V_FLOAT, .f = op[0] == '+' ? x + y : op[0] == '-' ? x - y : x * y};
    }
    return DS_OK;
}

static ds_status getitem(ctx *c, node *n, value obj, value key, value *out)
{
    out->k = V_UNDEF;
    if (obj.k == V_UNDEF) return rt_err(n, "cannot index an undefined value");
    if ((obj.k == V_DICT || obj.k == V_NS) && key.k == V_STR) {
        value *v = dict_find(obj.d, key.s);
        if (v) *out = *v;
        return DS_OK;
    }
    if ((obj.k == V_LIST || obj.k == V_STR) && (key.k == V_INT || key.k == V_BOOL)) {
        long long i = key.k == V_INT ? key.i : key.b;
        long long len = obj.k == V_LIST ? (long long)obj.l->n : (long long)cp_count(obj.s);
        if (i < 0) i += len;
        if (i < 0 || i >= len) return DS_OK; /* Jinja: undefined */
        if (obj.k == V_LIST) *out = obj.l->v[i];
        else *out = vstr(substr(obj.s, cp_offset(obj.s, (size_t)i), cp_offset(obj.s, (size_t)i + 1)));
        return DS_OK;
    }
    return DS_OK; /* none['x'], 'abc'['x'], ...: undefined, as Jinja's getitem */
}

static ds_status slice(ctx *c, node *n, value obj, value *ab, value *out)
{
    if (obj.k != V_LIST && obj.k != V_STR) return rt_err(n, "cannot slice %s", kind_name(obj.k));
    long long len = obj.k == V_LIST ? (long long)obj.l->n : (long long)cp_count(obj.s);
    long long step = ab[2].k == V_INT ? ab[2].i : 1;
    if (step == 0) return rt_err(n, "slice step cannot be zero");
    long long lo, hi;
    for (int k = 0; k < 2; k++) {
        long long def = k == 0 ? (step > 0 ? 0 : len - 1) : (step > 0 ? len : -1);
        long long v = def;
        if (ab[k].k == V_INT) {
            v = ab[k].i;
            if (v < 0) v += len;
            if (step > 0) v = v < 0 ? 0 : v > len ? len : v;
            else v = v < -1 ? -1 : v > len - 1 ? len - 1 : v;
        } else if (ab[k].k != V_NONE && ab[k].k != V_UNDEF) {
            return rt_err(n, "slice indices must be integers");
        }
        if (k == 0) lo = v;
        else hi = v;
    }
    /* lo and hi lie in [-1, len]: the count needs no loop that could step past LLONG_MAX */
    size_t cnt = 0;
    if (step > 0 ? lo < hi : lo > hi) {
        unsigned long long span = step > 0 ? (unsigned long long)(hi - lo) : (unsigned long long)(lo - hi);
        unsigned long long st = step > 0 ? (unsigned long long)step : 0ULL - (unsigned long long)step;
        cnt = (size_t)(span / st + (span % st != 0));
    }
    if (obj.k == V_STR && step == 1) {
        *out = vstr(substr(obj.s, cp_offset(obj.s, (size_t)lo), cp_offset(obj.s, (size_t)(hi > lo ? hi : lo))));
        return DS_OK;
    }
    if (obj.k == V_STR) {
        sbuf sb;
        sb_init(&sb, c);
        for (size_t k = 0; k < cnt; k++) {
            size_t i = (size_t)(lo + (long long)k * step);
            sb_add(&sb, substr(obj.s, cp_offset(obj.s, i), cp_offset(obj.s, i + 1)));
        }
        out->k = V_STR;
        return sb_done(&sb, n, &out->s);
    }
    list *l = list_new(c, cnt);
    if (!l) return nomem();
    for (size_t k = 0; k < cnt; k++) l->v[k] = obj.l->v[lo + (long long)k * step];
    *out = (value){.k = V_LIST, .l = l};
    return DS_OK;
}

/* Evaluated arguments of a call, filter or test. */
typedef struct {
    value *pos;
    size_t npos;
    str *kwname;
    value *kw;
    size_t nkw;
} args;

static ds_status eval_args(ctx *c, node *n, args *a, value *first)
{
    size_t extra = first ? 1 : 0;
    a->npos = n->nkids + extra;
    a->pos = arena_alloc(c->a, (a->npos + 1) * sizeof *a->pos);
    a->kw = arena_alloc(c->a, (n->nkw + 1) * sizeof *a->kw);
    if (!a->pos || !a->kw) return nomem();
    if (first) a->pos[0] = *first;
    for (size_t i = 0; i < n->nkids; i++) {
        ds_status s = eval(c, n->kids[i], &a->pos[i + extra]);
        if (s) return s;
    }
    a->kwname = n->kwname;
    a->nkw = n->nkw;
    for (size_t i = 0; i < n->nkw; i++) {
        ds_status s = eval(c, n->kwval[i], &a->kw[i]);
        if (s) return s;
    }
    return DS_OK;
}

/* Positional argument i, or keyword name, or undefined. */
static value arg(args *a, size_t i, const char *name)
{
    if (i < a->npos) return a->pos[i];
    for (size_t k = 0; name && k < a->nkw; k++)
        if (a->kwname[k].n == strlen(name) && !memcmp(a->kwname[k].p, name, a->kwname[k].n)) return a->kw[k];
    return (value){.k = V_UNDEF};
}

static bool is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'; }

static str strip(str s, value chars, bool left, bool right)
{
    size_t a = 0, b = s.n;
    bool def = chars.k != V_STR;
    while (left && a < b && (def ? is_space(s.p[a]) : memchr(chars.s.p, s.p[a], chars.s.n) != NULL)) a++;
    while (right && b > a && (def ? is_space(s.p[b - 1]) : memchr(chars.s.p, s.p[b - 1], chars.s.n) != NULL)) b--;
    return substr(s, a, b);
}

static ds_status split(ctx *c, node *n, str s, value sep, value maxv, bool from_right, value *out)
{
    long long max = maxv.k == V_INT ? maxv.i : -1;
    size_t cap = 8, cnt = 0;
    str *parts = arena_alloc(c->a, cap * sizeof *parts);
    if (!parts) return nomem();
    if (sep.k == V_STR && sep.s.n == 0) return rt_err(n, "split: empty separator");
#define PUSH(x) do { if (cnt == cap) { str *np = arena_alloc(c->a, cap * 2 * sizeof *np); if (!np) return nomem(); \
    memcpy(np, parts, cnt * sizeof *np); parts = np; cap *= 2; } parts[cnt++] = (x); } while (0)
    if (sep.k == V_STR) {
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                const char *f = (max < 0 || (long long)cnt < max) ? memmem(s.p + i, s.n - i, sep.s.p, sep.s.n) : NULL;
                if (!f) {
                    PUSH(substr(s, i, s.n));
                    break;
                }
                size_t j = (size_t)(f - s.p);
                PUSH(substr(s, i, j));
                i = j + sep.s.n;
            }
        } else {
            size_t e = s.n;
            for (;;) {
                const char *f = NULL;
                if (max < 0 || (long long)cnt < max)
                    for (size_t j = e >= sep.s.n ? e - sep.s.n + 1 : 0; j-- > 0;)
                        if (!memcmp(s.p + j, sep.s.p, sep.s.n)) {
                            f = s.p + j;
                            break;
                        }
                if (!f) {
                    PUSH(substr(s, 0, e));
                    break;
                }
                size_t j = (size_t)(f - s.p);
                PUSH(substr(s, j + sep.s.n, e));
                e = j;
            }
            for (size_t i = 0; i < cnt / 2; i++) {
                str t = parts[i];
                parts[i] = parts[cnt - 1 - i];
                parts[cnt - 1 - i] = t;
            }
        }
    } else if (sep.k == V_NONE || sep.k == V_UNDEF) { /* runs of whitespace */
        size_t i = 0;
        for (;;) {
            while (i < s.n && is_space(s.p[i])) i++;
            if (i >= s.n) break;
            if (max >= 0 && (long long)cnt >= max) {
                size_t e = s.n;
                while (e > i && is_space(s.p[e - 1])) e--;
                PUSH(substr(s, i, e));
                break;
            }
            size_t j = i;
            while (j < s.n && !is_space(s.p[j])) j++;
            PUSH(substr(s, i, j));
            i = j;
        }
    } else {
        return rt_err(n, "split: the separator must be a string");
    }
#undef PUSH
    list *l = list_new(c, cnt);
    if (!l) return nomem();
    for (size_t i = 0; i < cnt; i++) l->v[i] = vstr(parts[i]);
    *out = (value){.k = V_LIST, .l = l};
    return DS_OK;
}

static ds_status replace(ctx *c, node *n, str s, value from, value to, value count, value *out)
{
    if (from.k != V_STR || to.k != V_STR) return rt_err(n, "replace: arguments must be strings");
    long long max = count.k == V_INT ? count.i : -1;
    sbuf sb;
    sb_init(&sb, c);
    size_t i = 0;
    long long done = 0;
    if (from.s.n == 0) {
        sb_add(&sb, s);
    } else {
        for (;;) {
            const char *f = (max < 0 || done < max) ? memmem(s.p + i, s.n - i, from.s.p, from.s.n) : NULL;
            if (!f) break;
            size_t j = (size_t)(f - s.p);
            sb_add(&sb, substr(s, i, j));
            sb_add(&sb, to.s);
            i = j + from.s.n;
            done++;
        }
        sb_add(&sb, substr(s, i, s.n));
    }
    out->k = V_STR;
    return sb_done(&sb, n, &out->s);
}

/* upper/lower/title/capitalize (ASCII letters only; other text unchanged) */
static ds_status recase(ctx *c, node *n, str s, char mode, value *out)
{
    char *p = arena_alloc(c->a, s.n + 1);
    if (!p) return nomem();
    bool start = true;
    for (size_t i = 0; i < s.n; i++) {
        char ch = s.p[i];
        bool alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
        bool up = mode == 'u' || ((mode == 't' || mode == 'c') && start);
        if (mode == 'c' && i > 0) up = false;
        if (alpha) ch = up ? (char)(ch & ~0x20) : (char)(ch | 0x20);
        p[i] = ch;
        start = mode == 't' ? !alpha : false;
    }
    *out = vstr((str){p, s.n, s.m, s.u});
    return DS_OK;
}

static ds_status join(ctx *c, node *n, value seq, value sep, value *out)
{
    if (seq.k != V_LIST) return rt_err(n, "join: expected a list, got %s", kind_name(seq.k));
    sbuf sb;
    sb_init(&sb, c);
    for (size_t i = 0; i < seq.l->n; i++) {
        if (i && sep.k == V_STR) sb_add(&sb, sep.s);
        str x;
        ds_status s = to_str(c, n, seq.l->v[i], &x);
        if (s) return s;
        sb_add(&sb, x);
    }
    out->k = V_STR;
    return sb_done(&sb, n, &out->s);
}

static ds_status items_of(ctx *c, value d, int which, value *out)
{
    list *l = list_new(c, d.d->n);
    if (!l) return nomem();
    for (size_t i = 0; i < d.d->n; i++) {
        if (which == 0) l->v[i] = vstr(d.d->key[i]);
        else if (which == 1) l->v[i] = d.d->val[i];
        else {
            list *p = list_new(c, 2);
            if (!p) return nomem();
            p->v[0] = vstr(d.d->key[i]);
            p->v[1] = d.d->val[i];
            l->v[i] = (value){.k = V_LIST, .l = p};
        }
    }
    *out = (value){.k = V_LIST, .l = l};
    return DS_OK;
}

static bool name_is(str s, const char *nm) { return s.n == strlen(nm) && !memcmp(s.p, nm, s.n); }

static ds_status call_method(ctx *c, node *n, value obj, str m, args *a, value *out)
{
    if (obj.k == V_STR) {
        str s = obj.s;
        if (name_is(m, "split")) return split(c, n, s, arg(a, 0, "sep"), arg(a, 1, "maxsplit"), false, out);
        if (name_is(m, "rsplit")) return split(c, n, s, arg(a, 0, "sep"), arg(a, 1, "maxsplit"), true, out);
        if (name_is(m, "strip")) return *out = vstr(strip(s, arg(a, 0, NULL), true, true)), DS_OK;
        if (name_is(m, "lstrip")) return *out = vstr(strip(s, arg(a, 0, NULL), true, false)), DS_OK;
        if (name_is(m, "rstrip")) return *out = vstr(strip(s, arg(a, 0, NULL), false, true)), DS_OK;
        if (name_is(m, "upper")) return recase(c, n, s, 'u', out);
        if (name_is(m, "lower")) return recase(c, n, s, 'l', out);
        if (name_is(m, "title")) return recase(c, n, s, 't', out);
        if (name_is(m, "capitalize")) return recase(c, n, s, 'c', out);
        if (name_is(m, "replace")) return replace(c, n, s, arg(a, 0, NULL), arg(a, 1, NULL), arg(a, 2, "count"), out);
        if (name_is(m, "join")) return join(c, n, arg(a, 0, NULL), obj, out);
        if (name_is(m, "startswith") || name_is(m, "endswith")) {
            value p = arg(a, 0, NULL);
            bool start = m.p[0] == 's', r = false;
            size_t np = p.k == V_LIST ? p.l->n : 1;
            for (size_t i = 0; i < np && !r; i++) {
                value x = p.k == V_LIST ? p.l->v[i] : p;
                if (x.k != V_STR) return rt_err(n, "%.*s: expected a string", (int)m.n, m.p);
                r = x.s.n <= s.n && !memcmp(start ? s.p : s.p + s.n - x.s.n, x.s.p, x.s.n);
            }
            *out = vbool(r);
            return DS_OK;
        }
        if (name_is(m, "find") || name_is(m, "count")) {
            value x = arg(a, 0, NULL);
            if (x.k != V_STR) return rt_err(n, "%.*s: expected a string", (int)m.n, m.p);
            if (m.p[0] == 'f') {
                const char *f = x.s.n ? memmem(s.p, s.n, x.s.p, x.s.n) : s.p;
                *out = vint(f ? (long long)cp_count(substr(s, 0, (size_t)(f - s.p))) : -1);
            } else {
                long long k = 0;
                for (size_t i = 0; x.s.n && i + x.s.n <= s.n;) {
                    const char *f = memmem(s.p + i, s.n - i, x.s.p, x.s.n);
                    if (!f) break;
                    k++;
                    i = (size_t)(f - s.p) + x.s.n;
                }
                *out = vint(x.s.n ? k : (long long)cp_count(s) + 1);
            }
            return DS_OK;
        }
    } else if (obj.k == V_DICT || obj.k == V_NS) {
        if (name_is(m, "items")) return items_of(c, obj, 2, out);
        if (name_is(m, "keys")) return items_of(c, obj, 0, out);
        if (name_is(m, "values")) return items_of(c, obj, 1, out);
        if (name_is(m, "get")) {
            value k = arg(a, 0, NULL), *v = k.k == V_STR ? dict_find(obj.d, k.s) : NULL;
            *out = v ? *v : a->npos > 1 ? a->pos[1] : (value){.k = V_NONE};
            return DS_OK;
        }
    }
    return rt_err(n, "%s has no method '%.*s'", kind_name(obj.k), (int)m.n, m.p);
}

static ds_status call_func(ctx *c, node *n, int fn, args *a, value *out)
{
    if (fn == FN_NAMESPACE || fn == FN_DICT) {
        dict *d = dict_new(c, a->nkw);
        if (!d) return nomem();
        if (a->npos && a->pos[0].k == V_DICT)
            for (size_t i = 0; i < a->pos[0].d->n; i++)
                if (!dict_set(c, d, a->pos[0].d->key[i], a->pos[0].d->val[i])) return nomem();
        for (size_t i = 0; i < a->nkw; i++)
            if (!dict_set(c, d, a->kwname[i], a->kw[i])) return nomem();
        *out = (value){.k = fn == FN_NAMESPACE ? V_NS : V_DICT, .d = d};
        return DS_OK;
    }
    if (fn == FN_RAISE) {
        str msg = {"", 0, NULL, 1};
        if (a->npos) {
            ds_status s = to_str(c, n, a->pos[0], &msg);
            if (s) return s;
        }
        return rt_err(n, "raise_exception: %.*s", (int)(msg.n > 900 ? 900 : msg.n), msg.p);
    }
    /* range */
    long long lo = 0, hi, step = 1;
    for (size_t i = 0; i < a->npos; i++)
        if (a->pos[i].k != V_INT) return rt_err(n, "range: arguments must be integers");
    if (a->npos == 1) hi = a->pos[0].i;
    else if (a->npos >= 2) {
        lo = a->pos[0].i;
        hi = a->pos[1].i;
        if (a->npos == 3) step = a->pos[2].i;
    } else return rt_err(n, "range: needs 1 to 3 arguments");
    if (step == 0) return rt_err(n, "range: step cannot be zero");
    double cnt = ceil(((double)hi - (double)lo) / (double)step);
    if (cnt < 0) cnt = 0;
    if (cnt > (double)c->lim.max_iterations) return rt_err(n, "range of %.0f items is over the iteration limit %zu", cnt, c->lim.max_iterations);
    list *l = list_new(c, (size_t)cnt);
    if (!l) return nomem();
    for (size_t i = 0; i < l->n; i++) l->v[i] = vint(lo + (long long)i * step);
    *out = (value){.k = V_LIST, .l = l};
    return DS_OK;
}

static ds_status apply_test(ctx *c, node *n, value v, args *a, bool *r);

static ds_status attr_of(ctx *c, node *n, value v, value attr, value *out)
{
    if (attr.k == V_UNDEF) {
        *out = v;
        return DS_OK;
    }
    if (attr.k != V_STR) return rt_err(n, "attribute must be a string");
    /* "a.b" paths, as Jinja's attribute= */
    str p = attr.s;
    *out = v;
    while (p.n) {
        const char *dot = memchr(p.p, '.', p.n);
        size_t k = dot ? (size_t)(dot - p.p) : p.n;
        value cur = *out;
        if (cur.k == V_UNDEF) return DS_OK;
        ds_status s = getitem(c, n, cur, vstr(substr(p, 0, k)), out);
        if (s) return s;
        p = dot ? substr(p, k + 1, p.n) : substr(p, p.n, p.n);
    }
    return DS_OK;
}

static ds_status apply_filter(ctx *c, node *n, value v, args *a, value *out)
{
    str f = n->name;
    ds_status s;
    if (name_is(f, "length") || name_is(f, "count")) {
        if (v.k == V_STR) *out = vint((long long)cp_count(v.s));
        else if (v.k == V_LIST) *out = vint((long long)v.l->n);
        else if (v.k == V_DICT || v.k == V_NS) *out = vint((long long)v.d->n);
        else if (v.k == V_UNDEF) *out = vint(0);
        else return rt_err(n, "length of %s", kind_name(v.k));
        return DS_OK;
    }
    if (name_is(f, "tojson")) {
        value ind = arg(a, 1, "indent"), asc = arg(a, 99, "ensure_ascii");
        sbuf sb;
        sb_init(&sb, c);
        to_json(&sb, v, ind.k == V_INT ? (int)ind.i : -1, 0, asc.k == V_BOOL && asc.b);
        out->k = V_STR;
        return sb_done(&sb, n, &out->s);
    }
    if (name_is(f, "string")) {
        out->k = V_STR;
        return to_str(c, n, v, &out->s);
    }
    if (name_is(f, "safe") || name_is(f, "e") || name_is(f, "escape") || name_is(f, "forceescape")) {
        *out = v; /* autoescape is off in chat templates: escaping does nothing there */
        return DS_OK;
    }
    if (name_is(f, "default") || name_is(f, "d")) {
        value b = arg(a, 2, "boolean");
        bool use = v.k == V_UNDEF || (b.k == V_BOOL && b.b && !truthy(v));
        *out = use ? (a->npos > 1 ? a->pos[1] : vstr(mkstr("", 0, 1))) : v;
        return DS_OK;
    }
    if (name_is(f, "trim") || name_is(f, "upper") || name_is(f, "lower") || name_is(f, "capitalize") ||
        name_is(f, "title")) {
        str x;
        if ((s = to_str(c, n, v, &x))) return s;
        if (f.p[0] == 't' && f.p[1] == 'r') return *out = vstr(strip(x, arg(a, 1, "chars"), true, true)), DS_OK;
        return recase(c, n, x, f.p[0] == 'u' ? 'u' : f.p[0] == 'l' ? 'l' : f.p[0] == 't' ? 't' : 'c', out);
    }
    if (name_is(f, "replace")) {
        str x;
        if ((s = to_str(c, n, v, &x))) return s;
        return replace(c, n, x, arg(a, 1, NULL), arg(a, 2, NULL), arg(a, 3, "count"), out);
    }
    if (name_is(f, "join")) return join(c, n, v, arg(a, 1, "d"), out);
    if (name_is(f, "first") || name_is(f, "last")) {
        bool first = f.p[0] == 'f';
        if (v.k == V_LIST) *out = v.l->n ? v.l->v[first ? 0 : v.l->n - 1] : (value){.k = V_UNDEF};
        else if (v.k == V_STR) return getitem(c, n, v, vint(first ? 0 : -1), out);
        else return rt_err(n, "%.*s of %s", (int)f.n, f.p, kind_name(v.k));
        return DS_OK;
    }
    if (name_is(f, "list")) {
        if (v.k == V_LIST) *out = v;
        else if (v.k == V_DICT) return items_of(c, v, 0, out);
        else if (v.k == V_STR) {
            size_t k = cp_count(v.s);
            list *l = list_new(c, k);
            if (!l) return nomem();
            for (size_t i = 0; i < k; i++)
                l->v[i] = vstr(substr(v.s, cp_offset(v.s, i), cp_offset(v.s, i + 1)));
            *out = (value){.k = V_LIST, .l = l};
        } else return rt_err(n, "list of %s", kind_name(v.k));
        return DS_OK;
    }
    if (name_is(f, "items") || name_is(f, "dictsort")) {
        if (v.k != V_DICT) return rt_err(n, "items of %s", kind_name(v.k));
        return items_of(c, v, 2, out);
    }
    if (name_is(f, "int") || name_is(f, "float") || name_is(f, "abs")) {
        double d;
        if (v.k == V_STR) {
            char tmp[64];
            size_t k = v.s.n < 63 ? v.s.n : 63;
            memcpy(tmp, v.s.p, k);
            tmp[k] = 0;
            char *end;
            d = strtod(tmp, &end);
            if (end == tmp) d = 0;
        } else if (!num(v, &d)) {
            d = 0;
        }
        if (f.p[0] == 'i' && v.k == V_INT) *out = v;
        else if (f.p[0] == 'i' && !(d > -9223372036854775808.0 && d < 9223372036854775808.0))
            return d != d ? (*out = vint(0), DS_OK) : int_overflow(n, "int");
        else if (f.p[0] == 'i') *out = vint((long long)d);
        else if (f.p[0] == 'f') *out = (value){.k = V_FLOAT, .f = d};
        else if (v.k == V_INT && v.i == LLONG_MIN) return int_overflow(n, "abs");
        else *out = v.k == V_INT ? vint(v.i < 0 ? -v.i : v.i) : (value){.k = V_FLOAT, .f = fabs(d)};
        return DS_OK;
    }
    if (name_is(f, "map") || name_is(f, "selectattr") || name_is(f, "rejectattr") || name_is(f, "select") ||
        name_is(f, "reject")) {
        if (v.k != V_LIST) return rt_err(n, "%.*s of %s", (int)f.n, f.p, kind_name(v.k));
        list *l = list_new(c, v.l->n);
        if (!l) return nomem();
        size_t k = 0;
        bool is_map = f.p[0] == 'm', attr = f.n > 6;
        bool keep_true = f.p[0] == 's';
        for (size_t i = 0; i < v.l->n; i++) {
            value x;
            if (is_map) {
                if ((s = attr_of(c, n, v.l->v[i], arg(a, 99, "attribute"), &x))) return s;
                l->v[k++] = x;
                continue;
            }
            if ((s = attr_of(c, n, v.l->v[i], attr ? arg(a, 1, NULL) : (value){.k = V_UNDEF}, &x))) return s;
            value tname = arg(a, attr ? 2 : 1, NULL);
            bool r;
            if (tname.k == V_UNDEF) r = truthy(x);
            else {
                if (tname.k != V_STR) return rt_err(n, "%.*s: test name must be a string", (int)f.n, f.p);
                node tn = *n;
                tn.name = tname.s;
                args ta = {a->pos + (attr ? 2 : 1), a->npos > (attr ? 2u : 1u) ? a->npos - (attr ? 2 : 1) : 0,
                           NULL, NULL, 0};
                ta.pos[0] = x; /* slot of the test name: the value under test */
                if ((s = apply_test(c, &tn, x, &ta, &r))) return s;
                ta.pos[0] = tname;
            }
            if (r == keep_true) l->v[k++] = v.l->v[i];
        }
        l->n = k;
        *out = (value){.k = V_LIST, .l = l};
        return DS_OK;
    }
    return rt_err(n, "unknown filter '%.*s'", (int)f.n, f.p);
}

/* a->pos[0] is the value under test; a->pos[1..] the test's arguments. */
static ds_status apply_test(ctx *c, node *n, value v, args *a, bool *r)
{
    str t = n->name;
    value x = arg(a, 1, NULL);
    if (name_is(t, "defined")) *r = v.k != V_UNDEF;
    else if (name_is(t, "undefined")) *r = v.k == V_UNDEF;
    else if (name_is(t, "none")) *r = v.k == V_NONE;
    else if (name_is(t, "string")) *r = v.k == V_STR;
    else if (name_is(t, "number")) *r = v.k == V_INT || v.k == V_FLOAT;
    else if (name_is(t, "integer")) *r = v.k == V_INT;
    else if (name_is(t, "float")) *r = v.k == V_FLOAT;
    else if (name_is(t, "boolean")) *r = v.k == V_BOOL;
    else if (name_is(t, "true")) *r = v.k == V_BOOL && v.b;
    else if (name_is(t, "false")) *r = v.k == V_BOOL && !v.b;
    else if (name_is(t, "mapping")) *r = v.k == V_DICT || v.k == V_NS;
    else if (name_is(t, "sequence") || name_is(t, "iterable")) *r = v.k == V_LIST || v.k == V_STR || v.k == V_DICT;
    else if (name_is(t, "callable")) *r = v.k == V_FUNC;
    else if (name_is(t, "odd") || name_is(t, "even")) {
        if (v.k != V_INT) return rt_err(n, "test '%.*s' needs an integer", (int)t.n, t.p);
        *r = (v.i % 2 != 0) == (t.p[0] == 'o');
    } else if (name_is(t, "divisibleby")) {
        if (v.k != V_INT || x.k != V_INT || x.i == 0) return rt_err(n, "divisibleby needs non-zero integers");
        *r = v.i % x.i == 0;
    } else if (name_is(t, "eq") || name_is(t, "equalto") || name_is(t, "sameas") || name_is(t, "==")) *r = equal(v, x);
    else if (name_is(t, "ne") || name_is(t, "!=")) *r = !equal(v, x);
    else if (name_is(t, "in")) return contains(n, x, v, r);
    else if (name_is(t, "lt") || name_is(t, "gt") || name_is(t, "le") || name_is(t, "ge")) {
        int k;
        ds_status s = compare(n, v, x, &k);
        if (s) return s;
        *r = t.p[0] == 'l' ? (t.p[1] == 't' ? k < 0 : k <= 0) : (t.p[1] == 't' ? k > 0 : k >= 0);
    } else return rt_err(n, "unknown test '%.*s'", (int)t.n, t.p);
    return DS_OK;
}

static ds_status eval(ctx *c, node *n, value *out)
{
    ds_status s = DS_OK;
    if (++c->depth > c->lim.max_depth) {
        c->depth--;
        return rt_err(n, "evaluation nested deeper than %d", c->lim.max_depth);
    }
    value a, b;
    switch (n->k) {
    case E_LIT: *out = n->lit; break;
    case E_NAME: *out = lookup(c, n->name); break;
    case E_ATTR:
        if ((s = eval(c, n->a, &a))) break;
        if (a.k == V_UNDEF) {
            s = rt_err(n, "'%.*s' of an undefined value", (int)n->name.n, n->name.p);
            break;
        }
        s = getitem(c, n, a, vstr(n->name), out);
        break;
    case E_ITEM:
        if ((s = eval(c, n->a, &a)) || (s = eval(c, n->b, &b))) break;
        s = getitem(c, n, a, b, out);
        break;
    case E_SLICE: {
        value ab[3] = {{.k = V_NONE}, {.k = V_NONE}, {.k = V_NONE}};
        if ((s = eval(c, n->a, &a))) break;
        node *parts[3] = {n->b, n->c, n->d};
        for (int i = 0; i < 3 && !s; i++)
            if (parts[i]) s = eval(c, parts[i], &ab[i]);
        if (!s) s = slice(c, n, a, ab, out);
        break;
    }
    case E_CALL: {
        args av;
        if (n->a->k == E_ATTR) { /* method call */
            if ((s = eval(c, n->a->a, &a))) break;
            if (a.k == V_UNDEF) {
                s = rt_err(n, "'%.*s' of an undefined value", (int)n->a->name.n, n->a->name.p);
                break;
            }
            if ((a.k == V_DICT || a.k == V_NS) && dict_find(a.d, n->a->name) &&
                dict_find(a.d, n->a->name)->k == V_FUNC) {
                b = *dict_find(a.d, n->a->name);
                if (!(s = eval_args(c, n, &av, NULL))) s = call_func(c, n, b.fn, &av, out);
                break;
            }
            if (!(s = eval_args(c, n, &av, NULL))) s = call_method(c, n, a, n->a->name, &av, out);
            break;
        }
        if ((s = eval(c, n->a, &a))) break;
        if (a.k != V_FUNC) {
            s = rt_err(n, "%s is not callable", a.k == V_UNDEF && n->a->k == E_NAME ? "an undefined name" : kind_name(a.k));
            break;
        }
        if (!(s = eval_args(c, n, &av, NULL))) s = call_func(c, n, a.fn, &av, out);
        break;
    }
    case E_FILTER: {
        args av;
        if ((s = eval(c, n->a, &a)) || (s = eval_args(c, n, &av, &a))) break;
        s = apply_filter(c, n, a, &av, out);
        break;
    }
    case E_TEST: {
        args av;
        bool r = false;
        if ((s = eval(c, n->a, &a)) || (s = eval_args(c, n, &av, &a))) break;
        if (!(s = apply_test(c, n, a, &av, &r))) *out = vbool(r != n->neg);
        break;
    }
    case E_NEG: case E_POS:
        if ((s = eval(c, n->a, &a))) break;
        if (a.k == V_INT && n->k == E_NEG && a.i == LLONG_MIN) s = int_overflow(n, "-");
        else if (a.k == V_INT) *out = vint(n->k == E_NEG ? -a.i : a.i);
        else if (a.k == V_FLOAT) *out = (value){.k = V_FLOAT, .f = n->k == E_NEG ? -a.f : a.f};
        else s = rt_err(n, "bad operand type for unary %c: %s", n->k == E_NEG ? '-' : '+', kind_name(a.k));
        break;
    case E_NOT:
        if (!(s = eval(c, n->a, &a))) *out = vbool(!truthy(a));
        break;
    case E_AND: case E_OR: /* Python semantics: the deciding operand is the value */
        if ((s = eval(c, n->a, &a))) break;
        if (truthy(a) == (n->k == E_OR)) *out = a;
        else s = eval(c, n->b, out);
        break;
    case E_BIN:
        if ((s = eval(c, n->a, &a)) || (s = eval(c, n->b, &b))) break;
        s = binop(c, n, a, b, out);
        break;
    case E_COND:
        if ((s = eval(c, n->a, &a))) break;
        if (truthy(a)) s = eval(c, n->b, out);
        else if (n->c) s = eval(c, n->c, out);
        else out->k = V_UNDEF;
        break;
    case E_LIST: {
        list *l = list_new(c, n->nkids);
        if (!l) {
            s = nomem();
            break;
        }
        for (size_t i = 0; i < n->nkids && !s; i++) s = eval(c, n->kids[i], &l->v[i]);
        *out = (value){.k = V_LIST, .l = l};
        break;
    }
    case E_DICT: {
        dict *d = dict_new(c, n->nkids / 2);
        if (!d) {
            s = nomem();
            break;
        }
        for (size_t i = 0; i + 1 < n->nkids && !s; i += 2) {
            if ((s = eval(c, n->kids[i], &a)) || (s = eval(c, n->kids[i + 1], &b))) break;
            if (a.k != V_STR) {
                s = rt_err(n, "dict keys must be strings");
                break;
            }
            if (!dict_set(c, d, a.s, b)) s = nomem();
        }
        *out = (value){.k = V_DICT, .d = d};
        break;
    }
    default: s = ds_errorf(DS_ERR_INTERNAL, "template: bad expression node %d", n->k);
    }
    c->depth--;
    return s;
}

static ds_status emit(ctx *c, node *n, str s)
{
    if (c->outn + s.n > c->lim.max_output)
        return rt_err(n, "output longer than the limit of %zu bytes", c->lim.max_output);
    if (c->outn + s.n + 1 > c->outcap) {
        size_t cap = (c->outn + s.n + 1) * 2;
        char *no = realloc(c->out, cap);
        if (no) c->out = no;
        uint8_t *nm = realloc(c->outm, cap);
        if (nm) c->outm = nm;
        if (!no || !nm) return nomem();
        c->outcap = cap;
    }
    memcpy(c->out + c->outn, s.p, s.n);
    if (s.m) memcpy(c->outm + c->outn, s.m, s.n);
    else memset(c->outm + c->outn, s.u, s.n);
    c->outn += s.n;
    return DS_OK;
}

static ds_status exec_for(ctx *c, node *n)
{
    value it;
    ds_status s = eval(c, n->a, &it);
    if (s) return s;
    list *items = NULL;
    if (it.k == V_UNDEF) items = NULL; /* iterating undefined gives nothing, as Jinja */
    else if (it.k == V_LIST) items = it.l;
    else if (it.k == V_DICT || it.k == V_NS) {
        value keys;
        if ((s = items_of(c, it, 0, &keys))) return s;
        items = keys.l;
    } else if (it.k == V_STR) {
        value chars;
        node fake = *n;
        fake.name = mkstr("list", 4, 1);
        if ((s = apply_filter(c, &fake, it, &(args){0}, &chars))) return s;
        items = chars.l;
    } else {
        return rt_err(n, "cannot loop over %s", kind_name(it.k));
    }
    size_t total = items ? items->n : 0;
    /* with a filter, loop.length counts the kept items: filter first */
    list *kept = items;
    if (n->d && items) {
        kept = list_new(c, items->n);
        if (!kept) return nomem();
        size_t k = 0;
        for (size_t i = 0; i < items->n; i++) {
            if (!push_scope(c)) return nomem();
            if (!dict_set(c, c->scope[c->nscope - 1], n->name, items->v[i])) return nomem();
            value cond;
            s = eval(c, n->d, &cond);
            c->nscope--;
            if (s) return s;
            if (truthy(cond)) kept->v[k++] = items->v[i];
        }
        kept->n = k;
        total = k;
    }
    if (total == 0) return n->c ? exec(c, n->c) : DS_OK;
    for (size_t i = 0; i < total; i++) {
        if (++c->iters > c->lim.max_iterations)
            return rt_err(n, "more than %zu loop iterations", c->lim.max_iterations);
        if (!push_scope(c)) return nomem();
        dict *sc = c->scope[c->nscope - 1];
        value x = kept->v[i];
        bool ok = true;
        if (n->name2.n) {
            if (x.k != V_LIST || x.l->n != 2) {
                c->nscope--;
                return rt_err(n, "cannot unpack %s into two loop variables", kind_name(x.k));
            }
            ok = dict_set(c, sc, n->name, x.l->v[0]) && dict_set(c, sc, n->name2, x.l->v[1]);
        } else {
            ok = dict_set(c, sc, n->name, x);
        }
        dict *loop = dict_new(c, 10);
        if (!ok || !loop) return nomem();
        long long len = (long long)total, k = (long long)i;
        static const char *const keys[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length"};
        value vals[] = {vint(k + 1), vint(k), vint(len - k), vint(len - k - 1), vbool(k == 0), vbool(k == len - 1),
                        vint(len)};
        for (int j = 0; j < 7; j++)
            if (!dict_set(c, loop, mkstr(keys[j], strlen(keys[j]), 1), vals[j])) return nomem();
        if (!dict_set(c, loop, mkstr("previtem", 8, 1), i ? kept->v[i - 1] : (value){.k = V_UNDEF}) ||
            !dict_set(c, loop, mkstr("nextitem", 8, 1), i + 1 < total ? kept->v[i + 1] : (value){.k = V_UNDEF}) ||
            !dict_set(c, sc, mkstr("loop", 4, 1), (value){.k = V_DICT, .d = loop}))
            return nomem();
        s = exec(c, n->b);
        c->nscope--;
        if (s) return s;
        if (c->brk == 1) {
            c->brk = 0;
            break;
        }
        c->brk = 0;
    }
    return DS_OK;
}

static ds_status exec(ctx *c, node *n)
{
    ds_status s = DS_OK;
    if (++c->depth > c->lim.max_depth) {
        c->depth--;
        return rt_err(n, "blocks nested deeper than %d", c->lim.max_depth);
    }
    value v;
    switch (n->k) {
    case S_BODY:
        for (size_t i = 0; i < n->nkids && !s && !c->brk; i++) s = exec(c, n->kids[i]);
        break;
    case S_TEXT: s = emit(c, n, n->lit.s); break;
    case S_OUT: {
        str x;
        if (!(s = eval(c, n->a, &v)) && !(s = to_str(c, n, v, &x))) s = emit(c, n, x);
        break;
    }
    case S_IF:
        if ((s = eval(c, n->a, &v))) break;
        if (truthy(v)) s = exec(c, n->b);
        else if (n->c) s = exec(c, n->c);
        break;
    case S_FOR: s = exec_for(c, n); break;
    case S_SET: case S_SETBLOCK:
        if (n->k == S_SET) s = eval(c, n->a, &v);
        else { /* capture the block's output */
            size_t mark = c->outn;
            if (!(s = exec(c, n->b))) {
                sbuf sb;
                sb_init(&sb, c);
                if (c->outn > mark) /* (nothing written yet: c->out may be NULL) */
                    sb_add(&sb, (str){c->out + mark, c->outn - mark, c->outm + mark, 1});
                v.k = V_STR;
                s = sb_done(&sb, n, &v.s);
                c->outn = mark;
            }
        }
        if (s) break;
        if (n->name2.n) {
            value ns = lookup(c, n->name);
            if (ns.k != V_NS) {
                s = rt_err(n, "cannot set '%.*s.%.*s': '%.*s' is not a namespace", (int)n->name.n, n->name.p,
                           (int)n->name2.n, n->name2.p, (int)n->name.n, n->name.p);
                break;
            }
            if (!dict_set(c, ns.d, n->name2, v)) s = nomem();
        } else if (!dict_set(c, c->scope[c->nscope - 1], n->name, v)) {
            s = nomem();
        }
        break;
    case S_BREAK: case S_CONTINUE:
        c->brk = n->k == S_BREAK ? 1 : 2;
        break;
    default: s = ds_errorf(DS_ERR_INTERNAL, "template: bad statement node %d", n->k);
    }
    c->depth--;
    return s;
}

static ds_status bind_vars(ctx *c, json_t *vars, uint8_t u)
{
    if (!vars) return DS_OK;
    if (!json_is_object(vars)) return ds_errorf(DS_ERR_ARG, "template: variables must be a JSON object");
    const char *k;
    json_t *j;
    json_object_foreach(vars, k, j) {
        value v;
        ds_status s = from_json(c, j, u, &v, 0);
        if (s) return s;
        size_t kn = strlen(k);
        char *kp = arena_alloc(c->a, kn + 1);
        if (!kp) return nomem();
        memcpy(kp, k, kn + 1);
        if (!dict_set(c, c->scope[0], mkstr(kp, kn, 1), v)) return nomem();
    }
    return DS_OK;
}

ds_status jinja_render(const char *tmpl, json_t *data, json_t *markup, const jinja_limits *lim, char **out,
                       uint8_t **mask, size_t *len)
{
    *out = NULL;
    if (mask) *mask = NULL;
    if (len) *len = 0;
    if (!tmpl) return ds_errorf(DS_ERR_ARG, "template: no template text");
    arena a = {0};
    ctx c = {.a = &a, .src = tmpl, .line_p = tmpl, .line_n = 1};
    c.lim.max_output = lim && lim->max_output ? lim->max_output : (size_t)64 << 20;
    c.lim.max_iterations = lim && lim->max_iterations ? lim->max_iterations : 1000000;
    c.lim.max_depth = lim && lim->max_depth ? lim->max_depth : 256;
    c.lim.max_memory = lim && lim->max_memory ? lim->max_memory : (size_t)1 << 30;
    a.limit = c.lim.max_memory;
    node *root = NULL;
    const char *which;
    ds_status s = lex(&c);
    if (!s) s = parse_body(&c, NULL, &root, &which);
    if (!s && !push_scope(&c)) s = nomem();
    if (!s) s = bind_vars(&c, data, 0);
    if (!s) s = bind_vars(&c, markup, 1);
    if (!s) s = exec(&c, root);
    if (!s && !c.out && !(c.out = malloc(1))) s = nomem();
    if (!s && !c.outm && !(c.outm = malloc(1))) s = nomem();
    arena_free(&a);
    if (s) {
        free(c.out);
        free(c.outm);
        return s;
    }
    c.out[c.outn] = '\0';
    *out = c.out;
    if (mask) *mask = c.outm;
    else free(c.outm);
    if (len) *len = c.outn;
    return DS_OK;
}
