/* dist_check.c - helper program for the tensor-parallel tests (tests/dist/dist_test.sh).
 *
 *   dist_check cmp A.safetensors NAME_A B.safetensors NAME_B [ROWS]
 *       Compares two (rows, vocab) F32 logit tensors, B being the reference:
 *       per row max |a - b| <= 1e-3 max |b| and the same argmax. With ROWS,
 *       only the first ROWS rows of each. Exit 0 when all rows pass.
 *
 *   [mpirun -np N] dist_check greedy --ckpt-path DIR --config FILE --prompt 1,2,3
 *                  --steps K [--out FILE] [--repeat R] [--pid-dir DIR] [--ready FILE]
 *       Greedy decoding through model_forward, as `dsv3 generate` will do it:
 *       prefill the prompt, then K steps of one token, each the argmax of the
 *       gathered logits chosen by rank 0 and broadcast. Rank 0 writes the
 *       generated ids (one line, comma-separated) to --out and prints the
 *       decode time per token. --repeat runs the whole thing R times (a long
 *       run for the failure tests); --pid-dir makes each rank write
 *       rank<r>.pid; --ready is created by rank 0 once decoding has started.
 *
 *   mpirun -np N dist_check comm
 *       The collectives, dist_agree, dist_check_same and dist_broadcast_untimed
 *       against values known in advance, with and without a deadline (run it
 *       with DSV3_COMM_TIMEOUT=0 too, for the blocking calls). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "dist/dist.h"
#include "io/safetensors.h"
#include "model/model.h"

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static const st_tensor *logit_tensor(st_file **f, const char *path, const char *name)
{
    if (st_open(f, path)) {
        fprintf(stderr, "dist_check: %s\n", ds_last_error());
        return NULL;
    }
    const st_tensor *t = st_find(*f, name);
    if (!t || t->dtype != ST_F32 || t->ndim != 2) {
        fprintf(stderr, "dist_check: %s: no 2-D F32 tensor '%s'\n", path, name);
        return NULL;
    }
    return t;
}

static int cmd_cmp(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: dist_check cmp A NAME_A B NAME_B [ROWS]\n");
        return 2;
    }
    st_file *fa = NULL, *fb = NULL;
    const st_tensor *a = logit_tensor(&fa, argv[1], argv[2]), *b = a ? logit_tensor(&fb, argv[3], argv[4]) : NULL;
    if (!a || !b) return 2;
    int64_t rows = argc > 5 ? atoll(argv[5]) : a->shape[0], V = a->shape[1];
    if (V != b->shape[1] || rows > a->shape[0] || rows > b->shape[0] || rows < 1) {
        fprintf(stderr, "dist_check: shapes [%lld, %lld] and [%lld, %lld] do not match (%lld rows wanted)\n",
                (long long)a->shape[0], (long long)V, (long long)b->shape[0], (long long)b->shape[1],
                (long long)rows);
        return 1;
    }
    int bad = 0, bad_arg = 0;
    double worst = 0, worst_abs = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = (const float *)a->data + r * V, *y = (const float *)b->data + r * V;
        float mx = 0, err = 0;
        for (int64_t i = 0; i < V; i++) {
            mx = fmaxf(mx, fabsf(y[i]));
            err = fmaxf(err, fabsf(x[i] - y[i]));
        }
        if (err / mx > worst) worst = err / mx;
        if (err > worst_abs) worst_abs = err;
        bad += !(err <= 1e-3f * mx);
        bad_arg += argmax(x, (int)V) != argmax(y, (int)V);
    }
    printf("cmp %s[%s] vs %s[%s]: %lld rows, max |diff| %.3g, max rel %.3g, rows over 1e-3 %d, argmax "
           "mismatches %d\n", argv[1], argv[2], argv[3], argv[4], (long long)rows, worst_abs, worst, bad, bad_arg);
    st_close(fa);
    st_close(fb);
    return bad || bad_arg ? 1 : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    const char *ckpt, *config, *prompt, *out, *pid_dir, *ready;
    int steps, repeat;
} greedy_args;

static int parse_greedy(int argc, char **argv, greedy_args *g)
{
    *g = (greedy_args){.steps = 8, .repeat = 1};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return fprintf(stderr, "dist_check greedy: %s needs a value\n", k), 2;
        if (!strcmp(k, "--ckpt-path")) g->ckpt = v;
        else if (!strcmp(k, "--config")) g->config = v;
        else if (!strcmp(k, "--prompt")) g->prompt = v;
        else if (!strcmp(k, "--out")) g->out = v;
        else if (!strcmp(k, "--pid-dir")) g->pid_dir = v;
        else if (!strcmp(k, "--ready")) g->ready = v;
        else if (!strcmp(k, "--steps")) g->steps = atoi(v);
        else if (!strcmp(k, "--repeat")) g->repeat = atoi(v);
        else return fprintf(stderr, "dist_check greedy: unknown flag %s\n", k), 2;
        i++;
    }
    if (!g->ckpt || !g->config || !g->prompt || g->steps < 1 || g->repeat < 1)
        return fprintf(stderr, "dist_check greedy: needs --ckpt-path, --config, --prompt, --steps >= 1\n"), 2;
    return 0;
}

static void touch(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* One prefill of the prompt and steps decode steps; tokens gets the output ids. */
static ds_status generate(ds_model *m, ds_kvcache *kv, ds_comm *comm, const int32_t *prompt, int np, int steps,
                          int32_t *tokens, double *step_s, float *logits)
{
    int n = np;
    int *seq = calloc((size_t)n, sizeof(int)), *pos = malloc(sizeof(int) * (size_t)n);
    bool *want = calloc((size_t)n, 1);
    if (!seq || !pos || !want) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) pos[i] = i;
    want[n - 1] = true;
    ds_status s = model_forward(m, kv, n, prompt, seq, pos, want, logits);
    int32_t t = 0;
    for (int k = 0; !s && k < steps; k++) {
        t = argmax(logits, m->cfg.vocab_size);
        /* rank 0 decides, as a sampler would; the others follow its choice */
        if (comm && (s = comm->broadcast(comm, &t, sizeof t, 0))) break;
        tokens[k] = t;
        if (k == steps - 1) break;
        int p = np + k;
        bool w = true;
        double t0 = ds_now();
        s = model_forward(m, kv, 1, &t, seq, &p, &w, logits);
        step_s[k] = ds_now() - t0;
    }
    free(seq);
    free(pos);
    free(want);
    return s;
}

static int cmd_greedy(int argc, char **argv)
{
    greedy_args g;
    int rc = parse_greedy(argc, argv, &g);
    if (rc) return rc;
    ds_comm *comm = NULL;
    ds_config cfg;
    ds_model *m = NULL;
    ds_kvcache *kv = NULL;
    int *ids = NULL, np = 0;
    int32_t *prompt = NULL, *tokens = NULL;
    float *logits = NULL;
    double *step_s = NULL;
    rc = 1;
    if (dist_init(&argc, &argv, &comm)) goto fail;
    int rank = dist_rank(comm);
    if (g.pid_dir) {
        char path[4096], pid[32];
        snprintf(path, sizeof path, "%s/rank%d.pid", g.pid_dir, rank);
        snprintf(pid, sizeof pid, "%d\n", (int)getpid());
        touch(path, pid);
    }
    for (const char *p = g.prompt; *p; p++) np += *p == ',';
    np++;
    ids = malloc(sizeof(int) * (size_t)np);
    prompt = malloc(sizeof(int32_t) * (size_t)np);
    tokens = malloc(sizeof(int32_t) * (size_t)g.steps);
    step_s = calloc((size_t)g.steps, sizeof(double));
    if (!ids || !prompt || !tokens || !step_s) {
        ds_errorf(DS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    char *end = (char *)g.prompt;
    for (int i = 0; i < np; i++) prompt[i] = (int32_t)strtol(end + (i > 0), &end, 10);
    if (config_load(&cfg, g.config)) goto fail;
    ds_model_opts o = {.attn = DS_ATTN_ABSORB, .gemm = DS_GEMM_BF16, .ops = cpu_backend(true), .comm = comm};
    if (model_load(&m, g.ckpt, &cfg, &o)) goto fail;
    if (kvcache_new(&kv, m, 1, np + g.steps)) goto fail;
    if (!(logits = malloc(sizeof(float) * (size_t)cfg.vocab_size))) {
        ds_errorf(DS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int r = 0; r < g.repeat; r++) {
        if (generate(m, kv, comm, prompt, np, g.steps, tokens, step_s, logits)) goto fail;
        if (r == 0 && g.ready && rank == 0) touch(g.ready, "decoding\n");
    }
    if (rank == 0) {
        if (g.out) {
            FILE *f = fopen(g.out, "w");
            if (!f) {
                ds_errorf(DS_ERR_IO, "%s: cannot write", g.out);
                goto fail;
            }
            for (int k = 0; k < g.steps; k++) fprintf(f, "%s%d", k ? "," : "", tokens[k]);
            fputc('\n', f);
            fclose(f);
        }
        if (g.steps > 1) {
            int n = g.steps - 1;
            double sum = 0;
            for (int k = 0; k < n; k++) sum += step_s[k];
            qsort(step_s, (size_t)n, sizeof(double), cmp_double);
            printf("greedy: ranks %d x %d threads, prompt %d, %d decode steps: mean %.3f ms/token, median %.3f "
                   "ms/token\n", dist_world_size(comm), omp_get_max_threads(), np, n, 1e3 * sum / n,
                   1e3 * step_s[n / 2]);
        }
    }
    rc = 0;
    goto done;
fail:
    rc = dist_fail(comm, "dist_check greedy");
done:
    kvcache_free(kv);
    model_free(m);
    dist_finish(comm);
    free(ids);
    free(prompt);
    free(tokens);
    free(step_s);
    free(logits);
    return rc;
}

/* The collectives against values computed here independently: every rank's
 * contribution is a small integer, so sums are exact in float. */
static int cmd_comm(void)
{
    ds_comm *c = NULL;
    int bad = 0;
#define EXPECT(cond, ...) do { if (!(cond)) { bad++; fprintf(stderr, "rank %d: %s:%d: ", dist_rank(c), __FILE__, \
    __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
    if (dist_init(NULL, NULL, &c)) return dist_fail(c, "dist_check comm");
    if (!c) {
        fprintf(stderr, "dist_check comm: needs mpirun -np 2 or more\n");
        return 2;
    }
    int r = c->rank, ws = c->world_size;
    static const size_t sizes[] = {1, 7, 1000, 3 << 20};
    for (int forever = 0; forever < 2; forever++) {
        c->timeout_s = forever ? 0 : 60;
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            size_t n = sizes[k];
            float *buf = malloc(sizeof(float) * n), *all = malloc(sizeof(float) * n * ws);
            for (size_t i = 0; i < n; i++) buf[i] = (float)((r + 1) * (int)(i % 1000));
            EXPECT(!c->all_reduce(c, buf, n), "all_reduce: %s", ds_last_error());
            size_t wrong = 0;
            for (size_t i = 0; i < n; i++) wrong += buf[i] != (float)(ws * (ws + 1) / 2 * (int)(i % 1000));
            EXPECT(!wrong, "all_reduce of %zu: %zu wrong sums", n, wrong);
            for (size_t i = 0; i < n; i++) buf[i] = (float)(r * 1000 + (int)(i % 1000));
            EXPECT(!c->all_gather(c, buf, n, all), "all_gather: %s", ds_last_error());
            wrong = 0;
            for (int q = 0; q < ws; q++)
                for (size_t i = 0; i < n; i++) wrong += all[q * n + i] != (float)(q * 1000 + (int)(i % 1000));
            EXPECT(!wrong, "all_gather of %zu: %zu wrong values", n, wrong);
            for (int root = 0; root < ws; root++) {
                unsigned char *b = (unsigned char *)all;
                for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(r == root ? (i * 7 + root) & 255 : 0);
                EXPECT(!c->broadcast(c, b, n, root), "broadcast: %s", ds_last_error());
                wrong = 0;
                for (size_t i = 0; i < n; i++) wrong += b[i] != (unsigned char)((i * 7 + root) & 255);
                EXPECT(!wrong, "broadcast of %zu bytes from %d: %zu wrong", n, root, wrong);
            }
            free(buf);
            free(all);
        }
    }
    /* a wait longer than the watchdog's deadline, as for a person typing a prompt */
    c->timeout_s = 0.5;
    int32_t word = r == 0 ? 0x5eed : 0;
    if (r == 0) usleep(1500000);
    EXPECT(!dist_broadcast_untimed(c, &word, sizeof word, 0) && word == 0x5eed, "untimed broadcast: %s",
           ds_last_error());
    EXPECT(c->timeout_s == 0.5 && !c->failed, "untimed broadcast left timeout_s %g", c->timeout_s);
    c->timeout_s = 60;
    EXPECT(dist_agree(c, DS_OK) == DS_OK && !c->agreed_failure, "agree on success");
    ds_status s = r == ws - 1 ? ds_errorf(DS_ERR_IO, "boom") : DS_OK;
    s = dist_agree(c, s);
    char want[64];
    snprintf(want, sizeof want, "rank %d: boom", ws - 1);
    EXPECT(s == DS_ERR_IO && c->agreed_failure && !strcmp(ds_last_error(), want), "agree on rank %d's failure: "
           "got %d '%s'", ws - 1, (int)s, ds_last_error());
    s = dist_agree(c, r ? ds_errorf(DS_ERR_FORMAT, "bad %d", r) : DS_OK);
    EXPECT(s == DS_ERR_FORMAT && strstr(ds_last_error(), "rank 1: bad 1") &&
           (ws == 2 || strstr(ds_last_error(), " other rank")), "agree on several: '%s'", ds_last_error());
    EXPECT(dist_agree(c, DS_OK) == DS_OK && !c->agreed_failure, "agree on success again");
    s = dist_check_same(c, "same", 4, "the thing");
    EXPECT(s == DS_OK, "check_same on equal bytes: %s", ds_last_error());
    s = dist_check_same(c, r == 1 ? "diff" : "same", 4, "the thing");
    EXPECT((s != DS_OK) == (r == 1), "check_same with rank 1 different: %d", (int)s);
    s = dist_agree(c, s);
    EXPECT(s == DS_ERR_ARG && strstr(ds_last_error(), "rank 1: the thing differs from rank 0"), "'%s'",
           ds_last_error());
    int total = bad;
    float fb = (float)bad;
    c->all_reduce(c, &fb, 1);
    if (r == 0) printf("dist_check comm: %d ranks, %s\n", ws, fb == 0 ? "all checks passed" : "FAILED");
    dist_finish(c);
#undef EXPECT
    return total || fb ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "comm")) return cmd_comm();
    if (argc >= 2 && !strcmp(argv[1], "cmp")) return cmd_cmp(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "greedy")) return cmd_greedy(argc - 1, argv + 1);
    fprintf(stderr, "usage: dist_check cmp|greedy ... (see tests/dist/dist_check.c)\n");
    return 2;
}
