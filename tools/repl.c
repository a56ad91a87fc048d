/* repl.c - the chat REPL of `dsv3 generate --interactive`.
 *
 * Rank 0 reads a message and broadcasts it; every rank then acts on it, so
 * that under mpirun all ranks run the same turns. Lines come through libedit
 * (editing, history, arrow keys) when stdin and stdout are a terminal and the
 * build has it, as plain reads otherwise. A line ending in '\' continues on
 * the next. SIGINT only sets a flag (one process): during a reply the engine's
 * cancel hook sees it and the reply stops where it is, kept in the chat; at the
 * prompt a first Ctrl-C says how to leave and a second one in a row, or
 * Ctrl-D, ends the REPL. Under several ranks SIGINT keeps its default meaning,
 * since a reply stopped on rank 0 alone would leave the others waiting. */
#include <errno.h>
#include <jansson.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

#ifdef DSV3_LIBEDIT
#include <histedit.h>
#endif

#include "args.h"
#include "base/file.h"
#include "generate.h"

static volatile sig_atomic_t g_sigint;

static void on_sigint(int sig)
{
    (void)sig;
    g_sigint = 1;
}

static int cancel_reply(void *user)
{
    (void)user;
    return g_sigint != 0;
}

typedef struct {
    const char *prompt;
    char *buf;
    size_t cap;
#ifdef DSV3_LIBEDIT
    EditLine *el;
    History *hist;
#endif
} line_in;

#ifdef DSV3_LIBEDIT
static char *edit_prompt(EditLine *el)
{
    line_in *in = NULL;
    el_get(el, EL_CLIENTDATA, &in);
    return (char *)in->prompt;
}

/* libedit's character source: read(2), whose EINTR after our SIGINT ends the
 * line (libedit's own would retry it). */
static int edit_getc(EditLine *el, wchar_t *wc)
{
    (void)el;
    mbstate_t st;
    memset(&st, 0, sizeof st);
    for (;;) {
        char ch;
        ssize_t r = read(0, &ch, 1);
        if (r < 0 && errno == EINTR && !g_sigint) continue;
        if (r <= 0) return r < 0 ? -1 : 0;
        size_t k = mbrtowc(wc, &ch, 1, &st);
        if (k == (size_t)-2) continue; /* more bytes of the character to come */
        if (k == (size_t)-1) {
            memset(&st, 0, sizeof st);
            *wc = 0xFFFD;
        }
        return 1;
    }
}

static void edit_open(line_in *in)
{
    /* libedit edits wide characters: a UTF-8 locale keeps non-ASCII input whole */
    setlocale(LC_CTYPE, "");
    if (MB_CUR_MAX == 1) setlocale(LC_CTYPE, "C.UTF-8");
    in->el = el_init("dsv3", stdin, stdout, stderr);
    in->hist = history_init();
    if (!in->el || !in->hist) {
        if (in->el) el_end(in->el);
        if (in->hist) history_end(in->hist);
        in->el = NULL;
        in->hist = NULL;
        return;
    }
    HistEvent ev;
    history(in->hist, &ev, H_SETSIZE, 1000);
    el_set(in->el, EL_EDITOR, "emacs");
    el_set(in->el, EL_SIGNAL, 0);
    el_set(in->el, EL_CLIENTDATA, in);
    el_set(in->el, EL_PROMPT, edit_prompt);
    el_set(in->el, EL_GETCFN, edit_getc);
    el_set(in->el, EL_HIST, history, in->hist);
}
#endif

static void line_close(line_in *in)
{
    free(in->buf);
#ifdef DSV3_LIBEDIT
    if (in->el) el_end(in->el);
    if (in->hist) history_end(in->hist);
#endif
}

/* One line without its newline into *out (malloc'd). Returns 1, 0 at the end
 * of input, -1 when SIGINT came. */
static int read_line(line_in *in, const char *prompt, char **out)
{
    *out = NULL;
#ifdef DSV3_LIBEDIT
    if (in->el) {
        int cnt = 0;
        in->prompt = prompt;
        const char *l = el_gets(in->el, &cnt);
        if (cnt < 0 || g_sigint) return g_sigint ? -1 : 0;
        if (!l || cnt == 0) return 0;
        size_t n = strlen(l);
        while (n && (l[n - 1] == '\n' || l[n - 1] == '\r')) n--;
        *out = strndup(l, n);
        return *out ? 1 : 0;
    }
#endif
    fputs(prompt, stdout);
    fflush(stdout);
    ssize_t r = getline(&in->buf, &in->cap, stdin);
    if (r < 0) {
        if (g_sigint) {
            clearerr(stdin);
            return -1;
        }
        printf("\n");
        return 0;
    }
    while (r > 0 && (in->buf[r - 1] == '\n' || in->buf[r - 1] == '\r')) in->buf[--r] = 0;
    *out = strdup(in->buf);
    return *out ? 1 : 0;
}

/* A message: lines joined while one ends in '\'. Same returns as read_line. */
static int read_message(line_in *in, char **out)
{
    char *msg = NULL;
    size_t len = 0;
    int r;
    for (;;) {
        char *l;
        r = read_line(in, msg ? "... " : ">>> ", &l);
        if (r != 1) break;
        size_t n = strlen(l);
        bool more = n && l[n - 1] == '\\';
        char *m = realloc(msg, len + n + 2);
        if (!m) {
            free(l);
            r = 0;
            break;
        }
        msg = m;
        memcpy(msg + len, l, n - more);
        len += n - more;
        if (more) msg[len++] = '\n';
        msg[len] = 0;
        free(l);
        if (!more) break;
    }
    if (r != 1) {
        free(msg);
        return r;
    }
#ifdef DSV3_LIBEDIT
    HistEvent ev;
    if (in->hist && msg[0]) history(in->hist, &ev, H_ENTER, msg);
#endif
    *out = msg;
    return 1;
}

static void print_help(void)
{
    fprintf(stderr, "  /help        this list\n"
                    "  /clear       start a new chat (the system prompt stays)\n"
                    "  /save FILE   write the chat as a JSON array of {role, content} messages\n"
                    "  /load FILE   replace the chat with one written by /save\n"
                    "  /exit        leave (Ctrl-D too)\n"
                    "  A line ending in \\ continues on the next. Ctrl-C stops a reply; twice at the prompt, leaves.\n");
}

static void banner(const gen_ctx *c)
{
    char reply[32];
    if (c->max_new < 0) snprintf(reply, sizeof reply, "until the end");
    else snprintf(reply, sizeof reply, "up to %d tokens", c->max_new);
    fprintf(stderr, "dsv3 %s: %s on %s, context %d tokens, replies %s\n", ds_version(), c->model_name,
            ds_engine_device_name(c->e), ds_engine_n_ctx(c->e), reply);
    fprintf(stderr, "commands: /help /clear /save FILE /load FILE /exit\n");
}

static ds_status save_chat(const chat *h, const char *path)
{
    json_t *a = json_array();
    ds_status s = a ? DS_OK : ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !s && i < h->n; i++) {
        json_t *m = json_pack("{s:s, s:s}", "role", h->m[i].role, "content", h->m[i].content);
        if (!m || json_array_append_new(a, m)) s = ds_errorf(DS_ERR_FORMAT, "message %zu is not valid UTF-8", i + 1);
    }
    if (!s && json_dump_file(a, path, JSON_INDENT(1)))
        s = ds_errorf(DS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    json_decref(a);
    return s;
}

/* Parses a /save file's text into h (replaced only when all of it is good). */
static ds_status load_chat(chat *h, const char *text, const char *path)
{
    json_error_t err;
    json_t *a = json_loads(text, 0, &err);
    if (!a || !json_is_array(a)) {
        json_decref(a);
        return ds_errorf(DS_ERR_FORMAT, "%s: not a JSON array of messages (%s)", path, a ? "not an array" : err.text);
    }
    chat t = {0};
    ds_status s = DS_OK;
    for (size_t i = 0; !s && i < json_array_size(a); i++) {
        const char *role = NULL, *content = NULL;
        json_t *m = json_array_get(a, i);
        if (json_unpack(m, "{s:s, s:s}", "role", &role, "content", &content) ||
            (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")))
            s = ds_errorf(DS_ERR_FORMAT, "%s: message %zu needs a role (system, user or assistant) and a content string",
                          path, i + 1);
        else s = chat_add(&t, role, content);
    }
    json_decref(a);
    if (s) {
        chat_clear(&t);
        free(t.m);
        return s;
    }
    chat_clear(h);
    free(h->m);
    *h = t;
    return DS_OK;
}

/* /load: rank 0 reads the file (a regular file: a FIFO would block the
 * REPL) and broadcasts its text ("" when unreadable; rank 0 names why). */
static ds_status command_load(gen_ctx *c, chat *h, const char *path)
{
    char *text = NULL, why[512];
    size_t len;
    snprintf(why, sizeof why, "%s: cannot read it, or it is empty", path);
    if (ds_dist_rank(c->dist) == 0 && file_read(path, FILE_MAX_TEXT, "chat file", &text, &len)) {
        snprintf(why, sizeof why, "%s", ds_last_error());
        text = strdup("");
    }
    ds_status s = ds_dist_broadcast_line(c->dist, &text);
    if (!s && (!text || !text[0])) s = ds_errorf(DS_ERR_IO, "%s", why);
    if (!s) s = load_chat(h, text, path);
    free(text);
    if (!s && ds_dist_rank(c->dist) == 0) fprintf(stderr, "[loaded %zu messages from %s]\n", h->n, path);
    return s;
}

/* A /command: 1 when the REPL ends, 0 otherwise; *s the outcome. */
static int command(gen_ctx *c, chat *h, const char *in, ds_status *s)
{
    int rank = ds_dist_rank(c->dist);
    *s = DS_OK;
    if (!strcmp(in, "/exit") || !strcmp(in, "/quit")) return 1;
    if (!strcmp(in, "/help") || !strcmp(in, "/?")) {
        if (rank == 0) print_help();
    } else if (!strcmp(in, "/clear")) {
        *s = chat_start(c, h);
    } else if (!strncmp(in, "/save ", 6) && in[6]) {
        if (rank == 0 && !(*s = save_chat(h, in + 6))) fprintf(stderr, "[saved %zu messages to %s]\n", h->n, in + 6);
    } else if (!strncmp(in, "/load ", 6) && in[6]) {
        *s = command_load(c, h, in + 6);
    } else {
        *s = ds_errorf(DS_ERR_ARG, "unknown command '%s' (/help lists them; //text sends /text)", in);
    }
    return 0;
}

int gen_interactive(gen_ctx *c)
{
    chat h = {0};
    ds_token_sampler *smp = NULL;
    if (chat_start(c, &h) || gen_new_sampler(c, c->seed, &smp)) {
        chat_clear(&h);
        free(h.m);
        return args_fail_dist(c->dist, "generate");
    }
    int rank = ds_dist_rank(c->dist), rc = 0;
    bool alone = ds_dist_world_size(c->dist) == 1;
    struct sigaction old_int;
    if (alone) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigint; /* no SA_RESTART: a read at the prompt returns */
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, &old_int);
    }
    line_in li = {0};
    if (rank == 0) {
#ifdef DSV3_LIBEDIT
        if (isatty(0) && isatty(1)) edit_open(&li);
#endif
        banner(c);
    }
    bool interrupted = false; /* the last thing at the prompt was a Ctrl-C */
    for (;;) {
        char *in = NULL;
        if (rank == 0) {
            g_sigint = 0;
            int r = read_message(&li, &in);
            if (r == -1 && !interrupted) {
                fprintf(stderr, "\n(Ctrl-C again or Ctrl-D to leave; /help lists the commands)\n");
                in = strdup("");
            }
            if (r == -1 && interrupted) printf("\n");
            interrupted = r == -1;
        }
        if (ds_dist_broadcast_line(c->dist, &in)) {
            rc = args_fail_dist(c->dist, "generate");
            break;
        }
        if (!in) break;
        ds_status s = DS_OK;
        const char *msg = in[0] == '/' && in[1] == '/' ? in + 1 : in;
        if (in[0] == '/' && msg == in) {
            int end = command(c, &h, in, &s);
            free(in);
            if (end) break;
            if (s && rank == 0) fprintf(stderr, "error: %s\n", ds_last_error());
            if (s == DS_ERR_COMM || s == DS_ERR_NOMEM) {
                rc = 1;
                break;
            }
            continue;
        }
        if (!msg[0]) {
            free(in);
            continue;
        }
        s = chat_add(&h, "user", msg);
        free(in);
        bool cancelled = false;
        size_t before = h.n;
        if (!s) s = gen_turn(c, &h, smp, alone ? cancel_reply : NULL, &cancelled);
        if (s) {
            /* the turn failed: report it, drop the user's message, and prompt again */
            if (rank == 0) fprintf(stderr, "error: %s\n", ds_last_error());
            if (h.n && h.n <= before && !strcmp(h.m[h.n - 1].role, "user")) chat_drop_last(&h);
            if (s == DS_ERR_COMM) {
                rc = 1;
                break;
            }
        }
        if (cancelled && rank == 0) fprintf(stderr, "[stopped]\n");
    }
    line_close(&li);
    if (alone) sigaction(SIGINT, &old_int, NULL);
    chat_clear(&h);
    free(h.m);
    ds_sampler_free(smp);
    if (rank == 0) gen_report_speed(c->e);
    return rc;
}
