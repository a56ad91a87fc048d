/* bench_serve.c - `dsv3 serve`'s own overhead, against the same work done in
 * this process through the public API (as the CLI does it), in alternating
 * rounds so that both sides see the same minute of a shared machine.
 *
 * Each round measures:
 *   decode  in process: B sequences holding the prompt, decoded in lockstep
 *           (one ds_decode_pick of B tokens per step, greedy), tok/s and CPU
 *           seconds per token. Server: B streamed chat requests at once
 *           (greedy, eos ignored, N tokens each) over B sockets read by one
 *           thread; each stream's rate is (N-1) over the time from its first
 *           token to its last, the aggregate is their sum. The server's CPU
 *           per token: its CPU time (/proc/PID/stat) for a wave of N tokens
 *           less that of a wave of 1, over B*(N-1).
 *   ttft    a short chat prompt, new to the server except for the template's
 *           head, sent as a non-streamed request of max_tokens 1: from connect
 *           to the whole reply. In process: template and tokenizer, then the
 *           same prompt tokens the server computed (those it did not take
 *           from its prefix cache, as its usage reports; the cached ones are
 *           copied from a slot, as the server copies them) and the pick.
 *   floor   GET /health on the same server: connect, one HTTP exchange, close
 *           (what no server can avoid on loopback, model or not).
 * Medians of 7 for the latencies; every round printed, then the medians of
 * the rounds' ratios. TOKENS 0: TTFT only (a model whose tokens the
 * tokenizer cannot spell streams no text to count).
 *   bench_serve CKPT PORT PID [B=8] [TOKENS=256] [ROUNDS=5] [THREADS=0] [DEVICE=auto] */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "dsv3.h"

static double cpu_self(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds process pid has used, its ended threads included (the
 * connections' threads end with their requests): utime + stime of
 * /proc/PID/stat, in clock ticks. */
static double cpu_of(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command may hold spaces */
    unsigned long long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int fail(void)
{
    fprintf(stderr, "bench_serve: %s\n", ds_last_error());
    return 1;
}

static int g_port;

/* Sends an HTTP/1.0 request (the server closes after the reply: no chunked
 * encoding) on a fresh connection; returns the socket, or -1. */
static int http_send(const char *method, const char *path, const char *body)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        perror("bench_serve: connect");
        if (fd >= 0) close(fd);
        return -1;
    }
    char head[256];
    size_t bl = body ? strlen(body) : 0;
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, bl);
    char *msg = malloc((size_t)hl + bl);
    memcpy(msg, head, (size_t)hl);
    if (bl) memcpy(msg + hl, body, bl);
    size_t off = 0, len = (size_t)hl + bl;
    while (off < len) {
        ssize_t w = send(fd, msg + off, len - off, 0);
        if (w <= 0) {
            perror("bench_serve: send");
            free(msg);
            close(fd);
            return -1;
        }
        off += (size_t)w;
    }
    free(msg);
    return fd;
}

/* A whole exchange: the reply (headers and body, malloc'd) or NULL. */
static char *http(const char *method, const char *path, const char *body)
{
    int fd = http_send(method, path, body);
    if (fd < 0) return NULL;
    size_t n = 0, cap = 4096;
    char *r = malloc(cap);
    ssize_t k;
    while ((k = recv(fd, r + n, cap - n - 1, 0)) > 0)
        if ((n += (size_t)k) + 1 == cap) r = realloc(r, cap *= 2);
    close(fd);
    r[n] = 0;
    return r;
}

static void chat_body(char *out, size_t cap, const char *prompt, int max_tokens, bool stream)
{
    snprintf(out, cap,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true,\"stream\":%s}",
             prompt, max_tokens, stream ? "true" : "false");
}

/* B streamed requests of n tokens at once: the aggregate decode rate (sum of
 * each stream's (n-1) tokens over its first-to-last token time); *wall the
 * whole wave. Returns -1 on failure. */
static double wave(int B, int n, const char *prompt, double *wall)
{
    char body[512];
    chat_body(body, sizeof body, prompt, n, true);
    struct pollfd *p = calloc((size_t)B, sizeof *p);
    double *t_first = calloc((size_t)B, sizeof(double)), *t_last = calloc((size_t)B, sizeof(double));
    int *events = calloc((size_t)B, sizeof(int));
    char **tail = calloc((size_t)B, sizeof(char *)); /* an event split over reads */
    double t0 = ds_now();
    for (int i = 0; i < B; i++) {
        p[i].fd = http_send("POST", "/v1/chat/completions", body);
        p[i].events = POLLIN;
        tail[i] = calloc(1, 1 << 16);
        if (p[i].fd < 0) return -1;
    }
    int open = B;
    char buf[1 << 16];
    while (open) {
        if (poll(p, (nfds_t)B, 10000) <= 0) {
            fprintf(stderr, "bench_serve: the server stopped answering\n");
            return -1;
        }
        /* a step's events reach the B sockets within a fraction of a
         * millisecond: read them in one wake-up, so that this client, which
         * shares the machine's cores with the server, wakes once a step */
        struct timespec gap = {0, 300000};
        nanosleep(&gap, NULL);
        poll(p, (nfds_t)B, 0);
        double t = ds_now();
        for (int i = 0; i < B; i++) {
            if (p[i].fd < 0 || !p[i].revents) continue;
            ssize_t k = recv(p[i].fd, buf, sizeof buf - 1, 0);
            if (k <= 0) {
                close(p[i].fd);
                p[i].fd = -1;
                open--;
                continue;
            }
            buf[k] = 0;
            /* token events carry a content delta; the role chunk does not */
            size_t tl = strlen(tail[i]);
            if (tl + (size_t)k >= (1 << 16)) tl = 0;
            memcpy(tail[i] + tl, buf, (size_t)k + 1);
            char *s = tail[i], *e;
            while ((e = strstr(s, "\n\n"))) {
                *e = 0;
                if (strstr(s, "\"content\":\"") && !strstr(s, "\"role\"")) {
                    if (!events[i]++) t_first[i] = t;
                    t_last[i] = t;
                }
                s = e + 2;
            }
            memmove(tail[i], s, strlen(s) + 1);
        }
    }
    *wall = ds_now() - t0;
    double rate = 0;
    for (int i = 0; i < B; i++) {
        free(tail[i]);
        if (n == 1) continue;
        if (events[i] < 2) {
            fprintf(stderr, "bench_serve: stream %d gave %d token events\n", i, events[i]);
            return -1;
        }
        rate += (events[i] - 1) / (t_last[i] - t_first[i]);
    }
    free(p);
    free(t_first);
    free(t_last);
    free(events);
    free(tail);
    return rate;
}

/* The value of a line of /metrics that starts with name, or 0. */
static double metric(const char *text, const char *name)
{
    const char *p = text;
    size_t n = strlen(name);
    while (p && (p = strstr(p, name)))
        if ((p == text || p[-1] == '\n') && p[n] == ' ') return strtod(p + n + 1, NULL);
        else p += n;
    return 0;
}

/* The scheduler's own and engine time and its steps, from /metrics. */
static void sched_times(double *own, double *engine, double *steps)
{
    char *m = http("GET", "/metrics", NULL);
    *own = metric(m, "dsv3_scheduler_busy_seconds_total{part=\"server\"}");
    *engine = metric(m, "dsv3_scheduler_busy_seconds_total{part=\"engine\"}");
    *steps = metric(m, "dsv3_scheduler_steps_total");
    free(m);
}

/* The integer after "key": in s, or -1. */
static long json_int(const char *s, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = s ? strstr(s, k) : NULL;
    return p ? strtol(p + strlen(k), NULL, 10) : -1;
}

/* A non-streamed request of max_tokens 1 for a chat of one message: seconds
 * from connect to the whole reply; *hit and *prompt from its usage. */
static double ttft_server(const char *text, long *hit, long *prompt)
{
    char body[512];
    chat_body(body, sizeof body, text, 1, false);
    double t0 = ds_now();
    char *reply = http("POST", "/v1/chat/completions", body);
    double t = ds_now() - t0;
    *hit = json_int(reply, "prompt_cache_hit_tokens");
    *prompt = json_int(reply, "prompt_tokens");
    if (*hit < 0 || *prompt < 1) {
        fprintf(stderr, "bench_serve: no usage in the reply: %.300s\n", reply ? reply : "(none)");
        t = -1;
    }
    free(reply);
    return t;
}

/* The same in process. The first `hit` tokens are what the server took from
 * its prefix cache: they are copied, untimed, from slot pre, where they were
 * computed once (as the server copies them from a slot, without a forward
 * pass just before the timed one, which would warm the caches for it). Then
 * timed: the template and tokenizer, the rest of the prompt, the pick.
 * -1 on failure. */
static double ttft_local(ds_engine *e, int pre, const ds_chat_params *cp, const char *text, long hit)
{
    const ds_tokenizer *tk = ds_engine_tokenizer(e);
    ds_chat_message m = {.role = "user", .content = text};
    int32_t *ids;
    size_t n;
    if (ds_chat_apply(tk, &m, 1, cp, NULL, &ids, &n)) return -1;
    bool bad = (size_t)hit >= n;
    if (!bad && hit && (ds_seq_len(e, pre) < hit || ds_seq_common_prefix(e, pre, ids, (int)hit) < hit)) {
        int *seqs = malloc(sizeof(int) * (size_t)hit);
        for (long i = 0; seqs && i < hit; i++) seqs[i] = pre;
        ds_batch hb = {.n_tokens = (int)hit, .token = ids, .seq = seqs};
        bad = !seqs || ds_seq_truncate(e, pre, 0) || ds_decode(e, &hb);
        free(seqs);
    }
    bad = bad || ds_seq_fork(e, 0, pre, (int)hit);
    ds_free(ids);
    if (bad) return -1;
    double t0 = ds_now();
    if (ds_chat_apply(tk, &m, 1, cp, NULL, &ids, &n)) return -1;
    ds_batch rb = {.n_tokens = (int)(n - (size_t)hit), .token = ids + hit};
    bad = ds_decode(e, &rb) != DS_OK;
    if (!bad) (void)ds_argmax(ds_logits(e, 0), ds_engine_n_vocab(e));
    double t = ds_now() - t0;
    ds_free(ids);
    return bad ? -1 : t;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bench_serve CKPT PORT PID [B=8] [TOKENS=256] [ROUNDS=5] [THREADS=0] [DEVICE=auto]\n");
        return 2;
    }
    g_port = atoi(argv[2]);
    int pid = atoi(argv[3]);
    int B = argc > 4 ? atoi(argv[4]) : 8, N = argc > 5 ? atoi(argv[5]) : 256, R = argc > 6 ? atoi(argv[6]) : 5;
    ds_engine_params p = ds_engine_default_params();
    p.n_seq = B + 1; /* slot B: the prefix the TTFT prompts share with the server's cache */
    p.n_ctx = 512;
    p.n_threads = argc > 7 ? atoi(argv[7]) : 0;
    p.device = argc > 8 ? argv[8] : "auto";
    ds_engine *e;
    if (ds_engine_load(argv[1], &p, &e)) return fail();
    const ds_tokenizer *tk = ds_engine_tokenizer(e);
    const int nv = ds_engine_n_vocab(e);
    const char *prompt = "Tell me about the city.";
    ds_chat_params cp = ds_chat_default_params();
    cp.add_generation_prompt = true;
    ds_chat_message m = {.role = "user", .content = prompt};
    int32_t *ids;
    size_t n;
    if (ds_chat_apply(tk, &m, 1, &cp, NULL, &ids, &n)) return fail();
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B), *next = malloc(sizeof(int32_t) * (size_t)B);
    int *seq = malloc(sizeof(int) * (size_t)B);
    double *r_dec = calloc((size_t)R, sizeof(double)), *r_cpu = calloc((size_t)R, sizeof(double)),
           *r_ttft = calloc((size_t)R, sizeof(double)), *r_over = calloc((size_t)R, sizeof(double)),
           *r_own = calloc((size_t)R, sizeof(double)), *r_eng = calloc((size_t)R, sizeof(double)),
           *r_cli = calloc((size_t)R, sizeof(double)), *r_srv = calloc((size_t)R, sizeof(double)),
           *r_tc = calloc((size_t)R, sizeof(double)), *r_ts = calloc((size_t)R, sizeof(double)),
           *r_th = calloc((size_t)R, sizeof(double));
    char text[128];
    int uniq = 0;
    double w;
    if (N > 0 && wave(B, 4, prompt, &w) < 0) return 1; /* warm-up: threads, caches, pages */
    printf("round  in-process tok/s  server tok/s  ratio   CPU us/tok in-process  server  ratio   "
           "TTFT ms in-process  server  /health  server-in-process\n");
    for (int r = 0; r < R; r++) {
        double cli_tps = 0, srv_tps = 0, cli_cpu = 0, srv_cpu = 0, t0;
        if (N > 0) { /* N 0: TTFT only */
            /* ---- decode, in process */
            ds_seq_truncate(e, 0, 0);
            ds_batch pb = {.n_tokens = (int)n, .token = ids};
            if (ds_decode(e, &pb)) return fail();
            int32_t first = ds_argmax(ds_logits(e, 0), nv);
            for (int q = 1; q < B; q++)
                if (ds_seq_fork(e, q, 0, (int)n)) return fail();
            for (int q = 0; q < B; q++) tok[q] = first, seq[q] = q;
            ds_batch b = {.n_tokens = B, .token = tok, .seq = seq};
            double c0 = cpu_self();
            t0 = ds_now();
            for (int s = 0; s < N; s++) {
                if (ds_decode_pick(e, &b, NULL, next)) return fail();
                memcpy(tok, next, sizeof(int32_t) * (size_t)B);
            }
            double cli_dt = ds_now() - t0;
            cli_cpu = (cpu_self() - c0) / ((double)B * N);
            cli_tps = (double)B * N / cli_dt;
            /* ---- decode, the server */
            double s0 = cpu_of(pid);
            if (wave(B, 1, prompt, &w) < 0) return 1;
            double s1 = cpu_of(pid), own0, eng0, st0, own1, eng1, st1;
            sched_times(&own0, &eng0, &st0);
            srv_tps = wave(B, N, prompt, &w);
            if (srv_tps < 0) return 1;
            srv_cpu = ((cpu_of(pid) - s1) - (s1 - s0)) / ((double)B * (N - 1));
            sched_times(&own1, &eng1, &st1);
            r_own[r] = (own1 - own0) / (st1 - st0);
            r_eng[r] = (eng1 - eng0) / (st1 - st0);
        }
        /* ---- time to first token, alternating, and the loopback floor */
        double tc[7], ts[7], th[7];
        int cached = -1, computed = -1;
        /* the side that runs first may meet a colder page cache (weights
         * evicted by the machine's other work): the order alternates */
        long hit = -1;
        for (int k = 0; k < 7; k++) {
            snprintf(text, sizeof text, "%d tells of a city by the sea.", 1000 + uniq++);
            bool local_first = k % 2 && hit >= 0;
            long guess = hit, pt = 0;
            if (local_first && (tc[k] = ttft_local(e, B, &cp, text, hit)) < 0) return fail();
            if ((ts[k] = ttft_server(text, &hit, &pt)) < 0) return 1;
            if ((!local_first || hit != guess) && (tc[k] = ttft_local(e, B, &cp, text, hit)) < 0) return fail();
            cached = (int)hit;
            computed = (int)(pt - hit);
            t0 = ds_now();
            char *reply = http("GET", "/health", NULL);
            th[k] = ds_now() - t0;
            free(reply);
        }
        double mc = median(tc, 7), ms = median(ts, 7), mh = median(th, 7);
        r_dec[r] = srv_tps / cli_tps;
        r_cli[r] = cli_tps;
        r_srv[r] = srv_tps;
        r_cpu[r] = srv_cpu / cli_cpu;
        r_ttft[r] = ms / mc;
        r_over[r] = ms - mc;
        r_tc[r] = mc;
        r_ts[r] = ms;
        r_th[r] = mh;
        if (N > 0)
            printf("%5d  %16.1f  %12.1f  %5.3f   %21.1f  %6.1f  %5.3f   %18.2f  %6.2f  %7.2f  %6.2f\n", r, cli_tps, srv_tps,
               r_dec[r], cli_cpu * 1e6, srv_cpu * 1e6, r_cpu[r], mc * 1e3, ms * 1e3, mh * 1e3, (ms - mc) * 1e3);
        else
            printf("%5d  %16s  %12s  %5s   %21s  %6s  %5s   %18.2f  %6.2f  %7.2f  %6.2f\n", r, "-", "-", "-", "-", "-", "-",
                   mc * 1e3, ms * 1e3, mh * 1e3, (ms - mc) * 1e3);
        if (r == 0) printf("       (TTFT prompts: %d tokens, %d of them from the server's prefix cache, %d computed)\n",
                           cached + computed, cached, computed);
        fflush(stdout);
    }
    double own = median(r_own, R), eng = median(r_eng, R), best_cli = 0, best_srv = 0;
    for (int r = 0; r < R; r++) best_cli = r_cli[r] > best_cli ? r_cli[r] : best_cli, best_srv = r_srv[r] > best_srv ? r_srv[r] : best_srv;
    if (N > 0) {
        printf("median of %d rounds: decode %.3f of in-process (best against best %.3f); server CPU per token %.3fx\n", R,
               median(r_dec, R), best_srv / best_cli, median(r_cpu, R));
        printf("  the scheduler's own time per step %.1f us beside %.1f us in the engine (%.1f%%)\n", own * 1e6,
               eng * 1e6, 100 * own / eng);
    }
    double tc = median(r_tc, R), ts = median(r_ts, R), th = median(r_th, R);
    printf("TTFT (medians of the rounds): server %.2f ms, in process %.2f ms, ratio %.3f (median of the rounds' %.3f);\n"
           "  server - in process = %.2f ms, of which %.2f ms is GET /health's loopback round trip; the rest %.2f ms "
           "(%.1f%% of in process)\n",
           ts * 1e3, tc * 1e3, ts / tc, median(r_ttft, R), (ts - tc) * 1e3, th * 1e3, (ts - tc - th) * 1e3,
           100 * (ts - tc - th) / tc);
    free(tok);
    free(next);
    free(seq);
    free(r_dec);
    free(r_cpu);
    free(r_ttft);
    free(r_over);
    free(r_own);
    free(r_eng);
    free(r_cli);
    free(r_srv);
    free(r_tc);
    free(r_ts);
    free(r_th);
    ds_free(ids);
    ds_engine_free(e);
    return 0;
}
