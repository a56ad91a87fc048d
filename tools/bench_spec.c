/* bench_spec.c - `dsv3 bench --spec mtp`: speculative decoding with the MTP
 * module beside plain decoding, in the same run.
 *
 * Each repetition generates -n tokens greedily from the same prompt (the
 * checkpoint's tokenizer on --prompt, or 16 fixed random ids without one),
 * once plainly and once per draft length, in turn, so that a slow moment of a
 * shared machine hits every variant alike. Decode is timed from the first
 * token to the last (the steps after the prompt's), in wall time and in the
 * process's user CPU time; the medians are printed, with the acceptance rate
 * and tokens per main pass (step).
 *
 * Decode is bounded by the bytes a step reads. On the CPU backend the weight
 * bytes are measured (the products' profile over one extra run of each
 * variant: the experts the tokens really chose); elsewhere they are counted
 * with uniform routing (n tokens touch E (1 - (1 - K/E)^n) of E experts). A
 * plain step reads the main model's weights for one token's experts and the
 * KV cache; a speculative step reads the experts all its checked tokens touch,
 * the MTP module once per draft (its first pass for the rows of the tokens
 * accepted last step too) and the KV cache of the main model and the module.
 * The bar for the speed-up is 0.85 x tokens/step x bytes_plain / bytes_spec.
 *
 * Where a model is not bound by its bytes (one that fits in the caches, or a
 * GPU step bound by its launches) a pass of k tokens costs more or less than
 * its bytes say. So the decode loop's time is split (ds_engine_stats) into the
 * MTP passes, the checking main passes and the rest (picks, rollback, copies),
 * each beside the weight bytes it reads (counted with uniform routing) and the
 * rate that makes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "args.h"
#include "base/clock.h"
#include "cmds.h"
#include "dsv3.h"

#define USAGE "--ckpt-path DIR --spec mtp [--draft 1,2,3] [-n 64] [-r 3] [-t N] [--prompt TEXT] [--config FILE] " \
              "[--device cpu|cuda|auto] [--gemm-impl bf16|fp8]"
#define MAX_VARIANTS 9
#define MAX_REPS 64

static double cpu_now(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return (double)r.ru_utime.tv_sec + 1e-6 * (double)r.ru_utime.tv_usec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
    double s[MAX_REPS];
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* What one generation measured between its first token and its last. */
typedef struct {
    int n, seen;          /* tokens asked for; seen so far */
    bool profile;         /* count the products' bytes over the interval */
    double w0, w1, c0, c1;
    double bytes;         /* weight bytes the products read (profile) */
} timing;

static int on_token(void *user, int index, int32_t token)
{
    (void)index;
    (void)token;
    timing *t = user;
    if (++t->seen == 1) {
        t->w0 = ds_now();
        t->c0 = cpu_now();
        if (t->profile) ds_profile_enable(true);
    } else if (t->seen == t->n) {
        t->w1 = ds_now();
        t->c1 = cpu_now();
        if (t->profile) {
            ds_profile p;
            ds_profile_read(&p);
            ds_profile_enable(false);
            for (int k = 0; k < DS_PROFILE_SIZES; k++) t->bytes += p.products[k].bytes;
        }
    }
    return 0;
}

typedef struct {
    int draft;
    double wall[MAX_REPS], cpu[MAX_REPS];
    long steps, drafted, accepted, tokens;
    long dec_tokens;
    double dec_s, draft_s, check_s; /* the decode loops' seconds; in MTP passes; in checking main passes */
    double bytes_tok;     /* measured weight bytes per token (0: not measured) */
} variant;

/* One greedy generation of n tokens from the prompt in slot 0, computed whole. */
static ds_status run(ds_engine *e, const int32_t *prompt, int len, int n, variant *v, int rep, bool profile)
{
    timing t = {.n = n, .profile = profile};
    ds_generate_params gp = ds_generate_default_params();
    gp.max_new_tokens = n;
    gp.eos = -1;
    gp.spec_draft = v->draft;
    gp.on_token = on_token;
    gp.on_token_user = &t;
    ds_engine_stats a, b;
    ds_completion c;
    ds_status s = ds_seq_truncate(e, 0, 0);
    ds_engine_get_stats(e, &a);
    if (!s) s = ds_generate(e, 1, NULL, &prompt, &len, NULL, &gp, &c);
    if (s) return s;
    ds_engine_get_stats(e, &b);
    ds_free(c.tokens);
    if (t.seen < n) return ds_errorf(DS_ERR_RANGE, "bench --spec: %d tokens generated of %d", t.seen, n);
    if (profile) {
        v->bytes_tok = t.bytes / (n - 1);
        return DS_OK;
    }
    if (rep >= 0) {
        v->wall[rep] = t.w1 - t.w0;
        v->cpu[rep] = t.c1 - t.c0;
        v->steps += b.spec_steps - a.spec_steps;
        v->drafted += b.spec_drafted - a.spec_drafted;
        v->accepted += b.spec_accepted - a.spec_accepted;
        v->tokens += n;
        v->dec_tokens += b.decode_tokens - a.decode_tokens;
        v->dec_s += b.decode_seconds - a.decode_seconds;
        v->draft_s += b.spec_draft_seconds - a.spec_draft_seconds;
        v->check_s += b.spec_check_seconds - a.spec_check_seconds;
    }
    return DS_OK;
}

/* Distinct experts n tokens touch under uniform routing. */
static double touched(const ds_model_info *m, double n)
{
    double E = m->n_routed_experts, K = m->n_activated_experts;
    return E > 0 ? E * (1 - pow(1 - K / E, n)) : 0;
}

static ds_status prompt_ids(ds_engine *e, const char *text, int32_t **ids, int *len)
{
    const ds_tokenizer *tok = ds_engine_tokenizer(e);
    if (!tok) {
        uint64_t x = 1;
        *len = 16;
        if (!(*ids = malloc(sizeof(int32_t) * 16))) return ds_errorf(DS_ERR_NOMEM, "out of memory");
        for (int i = 0; i < 16; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            (*ids)[i] = (int32_t)((x >> 33) % (uint64_t)ds_engine_n_vocab(e));
        }
        return DS_OK;
    }
    size_t n;
    int32_t *t;
    ds_status s = ds_tokenize(tok, text, strlen(text), 0, &t, &n);
    if (s) return s;
    *ids = malloc(sizeof(int32_t) * (n + 1));
    if (!*ids) {
        ds_free(t);
        return ds_errorf(DS_ERR_NOMEM, "out of memory");
    }
    int k = 0;
    if (ds_engine_bos(e) >= 0) (*ids)[k++] = ds_engine_bos(e);
    memcpy(*ids + k, t, sizeof(int32_t) * n);
    *len = k + (int)n;
    ds_free(t);
    return DS_OK;
}

int cmd_bench_spec(int argc, char **argv)
{
    const char *ckpt = NULL, *config = NULL, *spec = NULL, *drafts = "1,2,3", *device = "auto", *gemm = "bf16";
    const char *text = "The jury said it did find that the city's election was conducted";
    int n = 64, reps = 3, threads = 0;
    arg_spec specs[] = {
        {"--ckpt-path", ARG_STR, &ckpt, true, "DIR  checkpoint with the MTP module (HF, or convert --keep-mtp)"},
        {"--spec", ARG_STR, &spec, true, "mtp  speculative decoding with the MTP module"},
        {"--draft", ARG_STR, &drafts, false, "LIST draft lengths to measure (default 1,2,3)"},
        {"-n", ARG_INT, &n, false, "N    tokens generated per run (default 64)"},
        {"-r", ARG_INT, &reps, false, "N    repetitions (default 3)"},
        {"-t", ARG_INT, &threads, false, "N    threads (default: OpenMP's)"},
        {"--prompt", ARG_STR, &text, false, "TEXT prompt (with a tokenizer; else 16 fixed random ids)"},
        {"--config", ARG_STR, &config, false, "FILE model config (default: DIR/config.json)"},
        {"--device", ARG_STR, &device, false, "cpu|cuda|auto (default auto)"},
        {"--gemm-impl", ARG_STR, &gemm, false, "bf16|fp8 (default bf16)"},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof *specs, USAGE);
    if (rc) return rc == 1 ? 0 : rc;
    int *dl = NULL, nd = args_int_list(drafts, &dl);
    bool bad = nd < 1 || nd > MAX_VARIANTS - 1;
    for (int i = 0; !bad && i < nd; i++) bad = dl[i] < 1 || dl[i] > DS_SPEC_MAX_DRAFT;
    if (strcmp(spec, "mtp") || bad || n < 2 || reps < 1 || reps > MAX_REPS || threads < 0) {
        if (strcmp(spec, "mtp")) fprintf(stderr, "dsv3 bench: --spec must be mtp, not '%s'\n", spec);
        if (bad) fprintf(stderr, "dsv3 bench: --draft must list 1 to %d lengths in 1..%d\n", MAX_VARIANTS - 1,
                         DS_SPEC_MAX_DRAFT);
        if (n < 2) fprintf(stderr, "dsv3 bench: -n must be >= 2 with --spec\n");
        if (reps < 1 || reps > MAX_REPS) fprintf(stderr, "dsv3 bench: -r must be in 1..%d\n", MAX_REPS);
        if (threads < 0) fprintf(stderr, "dsv3 bench: -t must be >= 1\n");
        free(dl);
        return 2;
    }
    if (threads) ds_set_threads(threads);
    ds_engine_params ep = ds_engine_default_params();
    ep.config_path = config;
    ep.device = device;
    ep.mtp = true;
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", ckpt);
    FILE *tf = fopen(tok_path, "rb");
    ep.no_tokenizer = !tf; /* a synthetic checkpoint: random prompt ids */
    if (tf) fclose(tf);
    ep.matmul = !strcmp(gemm, "fp8") ? DS_MATMUL_FP8 : DS_MATMUL_BF16;
    ds_engine *e = NULL;
    int32_t *prompt = NULL;
    int len = 0;
    variant *v = calloc(MAX_VARIANTS, sizeof *v);
    ds_limits lim;
    rc = 1;
    if (!v || ds_measure_limits(device, false, NULL, &lim)) goto done;
    if (ds_engine_load(ckpt, &ep, &e)) goto done;
    size_t ckpt_bytes;
    ds_engine_touch_weights(e, &ckpt_bytes);
    if (prompt_ids(e, text, &prompt, &len)) goto done;
    if (len + n + DS_SPEC_MAX_DRAFT + 1 > ds_engine_n_ctx(e)) {
        ds_errorf(DS_ERR_RANGE, "prompt of %d tokens + %d exceeds the context of %d", len, n, ds_engine_n_ctx(e));
        goto done;
    }
    int nv = nd + 1;
    for (int i = 0; i < nd; i++) v[i + 1].draft = dl[i];
    const ds_model_info *mi = ds_engine_info(e);
    printf("model %s: %d layers + MTP, %s weights, %.2f GB; kernels %s, %d threads; prompt %d tokens, %d generated, "
           "greedy, %d reps\n", ckpt, mi->n_layers, ds_engine_weight_dtype(e), ckpt_bytes / 1e9,
           ds_engine_device_name(e), ds_threads(), len, n, reps);
    if (run(e, prompt, len, n < 8 ? n : 8, &v[0], -1, false) || run(e, prompt, len, n < 8 ? n : 8, &v[1], -1, false))
        goto done; /* warm-up */
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < nv; i++)
            if (run(e, prompt, len, n, &v[i], r, false)) goto done;
    bool on_host = ds_engine_on_host(e);
    for (int i = 0; on_host && i < nv; i++)
        if (run(e, prompt, len, n, &v[i], -1, true)) goto done;
    /* KV bytes a pass reads per layer, at the mean position of the decode */
    int n_blocks = mi->n_layers + 1;
    double kv_row = (double)ds_engine_kv_bytes(e) / ds_engine_n_ctx(e) / n_blocks, pos = len + n / 2.0;
    double kv_layer = kv_row * pos, K = mi->n_activated_experts;
    printf("limit: %s %.1f GB/s; weight bytes %s\n", lim.gpu ? "device copy bandwidth" : "read bandwidth",
           lim.bandwidth_gbps, on_host ? "measured (the products' profile)" : "counted with uniform routing");
    printf("%-8s %9s %9s %8s %8s %8s %11s %12s %7s\n", "variant", "tok/s", "cpu tok/s", "speedup", "cpu", "accept",
           "tokens/step", "MB/step", "bar");
    double plain_tps = 0, plain_cpu = 0, plain_bytes = 0;
    for (int i = 0; i < nv; i++) {
        variant *x = &v[i];
        double tps[MAX_REPS], cps[MAX_REPS];
        for (int r = 0; r < reps; r++) {
            tps[r] = (n - 1) / x->wall[r];
            cps[r] = (n - 1) / x->cpu[r];
        }
        double w = median(tps, reps), c = median(cps, reps);
        double acc = x->drafted ? (double)x->accepted / x->drafted : 0;
        double tpstep = x->draft ? (double)(x->steps + x->accepted) / (x->steps ? x->steps : 1) : 1;
        double a = x->draft ? (double)x->accepted / (x->steps ? x->steps : 1) : 0; /* drafts accepted a step */
        double step;
        if (!x->draft) {
            step = (x->bytes_tok > 0 ? x->bytes_tok : ds_engine_pass_bytes(e, K, 1)) + kv_layer * mi->n_layers;
            plain_tps = w;
            plain_cpu = c;
            plain_bytes = step;
        } else {
            step = x->bytes_tok > 0 ? x->bytes_tok * tpstep
                                    : ds_engine_pass_bytes(e, touched(mi, x->draft + 1), 1) +
                                          ds_engine_mtp_bytes(e, touched(mi, 1 + a)) +
                                          (x->draft - 1) * ds_engine_mtp_bytes(e, K);
            step += kv_layer * (mi->n_layers + x->draft);
        }
        char name[16];
        snprintf(name, sizeof name, x->draft ? "draft %d" : "plain", x->draft);
        printf("%-8s %9.1f %9.1f %7.2fx %7.2fx", name, w, c, w / plain_tps, c / plain_cpu);
        if (x->draft)
            printf(" %7.1f%% %11.2f %12.1f %6.2fx\n", 100 * acc, tpstep, step / 1e6, 0.85 * tpstep * plain_bytes / step);
        else
            printf(" %8s %11.2f %12.1f %7s  (%.1f GB/s, %.0f%% of the limit)\n", "-", 1.0, step / 1e6, "-",
                   step * w / 1e9, 100 * step * w / 1e9 / lim.bandwidth_gbps);
    }
    printf("where the time goes (the decode loops' wall time; weight MB counted with uniform routing, and GB/s):\n");
    for (int i = 0; i < nv; i++) {
        variant *x = &v[i];
        if (!x->draft) {
            double t = x->dec_s / (x->dec_tokens ? x->dec_tokens : 1), b = ds_engine_pass_bytes(e, K, 1);
            printf("%-8s %6.0f us a token (%.1f MB: %.1f GB/s)\n", "plain", 1e6 * t, b / 1e6, b / t / 1e9);
            continue;
        }
        double st = x->steps ? (double)x->steps : 1, a = x->accepted / st;
        double td = x->draft_s / st, tc = x->check_s / st, bc = ds_engine_pass_bytes(e, touched(mi, x->draft + 1), 1);
        double bd = ds_engine_mtp_bytes(e, touched(mi, 1 + a)) + (x->draft - 1) * ds_engine_mtp_bytes(e, K);
        printf("draft %-2d %6.0f us a step = MTP %.0f (%.1f MB: %.1f GB/s) + check %.0f (%.1f MB: %.1f GB/s) + rest %.0f\n",
               x->draft, 1e6 * x->dec_s / st, 1e6 * td, bd / 1e6, bd / td / 1e9, 1e6 * tc, bc / 1e6, bc / tc / 1e9,
               1e6 * (x->dec_s / st - td - tc));
    }
    printf("speedup: tokens/s over plain's (wall, and user CPU time); bar: 0.85 x tokens/step x bytes of a plain "
           "step / bytes of a speculative step\n");
    rc = 0;
done:
    if (rc) rc = args_fail("bench");
    ds_engine_free(e);
    free(prompt);
    free(v);
    free(dl);
    return rc;
}
