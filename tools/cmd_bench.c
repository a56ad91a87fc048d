/* cmd_bench.c - `dsv3 bench`: prefill (pp) and decode (tg) speed, in the style
 * of llama-bench, with every figure next to the limit that bounds it.
 *
 * For each context depth d the KV cache rows 0..d-1 are filled with random
 * values (attention costs the same whatever the values), then each test runs
 * -r times: ppN is one forward pass over N prompt tokens at positions d..,
 * tgN is N single-token forward passes. Load time and page faults are
 * excluded: every page of the checkpoint is touched before timing.
 *
 * Decode is bounded by memory bandwidth: bytes_per_token counts the weights one
 * token reads (attention, dense and shared MLPs, the routed experts it selects,
 * the head, block scales included); GB/s = bytes_per_token * tok/s, printed
 * beside the read bandwidth measured in the same run. Prefill is bounded by
 * arithmetic: GFLOP/s = 2 * active weights per token * tok/s, beside the
 * measured f32 FMA and bf16 dot-product peaks, and the AMX tile peak where
 * the prefill GEMM runs on AMX (kernels "cpu-avx512-amx"; --no-amx keeps it on
 * AVX-512). With --device cuda the limits
 * are the GPU's, measured by the CUDA backend: device copy bandwidth (bytes
 * read plus written) and the bf16 tensor-core rate.
 *
 * -o md (default) prints the table; -o csv, json and jsonl print the same runs
 * built with jansson, each row with llama-bench's fields (avg_ts, stddev_ts,
 * samples_ns, n_threads, n_depth, build_commit, cpu_info, ...) and what ran:
 * checkpoint, config, dtype, build options and the date. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "base/clock.h"
#include "cmds.h"
#include "commit.h" /* DSV3_COMMIT */
#include "dsv3.h"

#define USAGE "--ckpt-path DIR [--config FILE] [-p 64,512] [-n 32,128] [-d 0,1024,4096] [--seqs 1,8] [-t 1,2,4] [-r REPS] " \
              "[-o md|csv|json|jsonl] [--profile] " \
              "[--device cpu|cuda|auto] [--ref-kernels] [--no-amx] [--attn-impl absorb|naive] [--gemm-impl bf16|fp8]\n" \
              "       dsv3 bench --spec mtp [--draft LIST] ... (speculative decoding beside plain: dsv3 bench --spec mtp --help)"
#define MAX_THREADS 1024
#define MAX_SEQS 256

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    double med, min, max;
} spread;

static spread summarise(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    spread s = {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v[0], v[n - 1]};
    return s;
}

static uint32_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

static long peak_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kb;
}

typedef struct {
    ds_engine *e;
    int32_t *tok;
    bool *want;
    int *seq; /* 0, 1, 2, ...: a decode batch's sequences */
} bench_ctx;

/* One timed prefill of n tokens at depth d; returns seconds or < 0 on error. */
static double run_pp(bench_ctx *b, int n, int d)
{
    for (int i = 0; i < n; i++) b->want[i] = i == n - 1;
    ds_batch batch = {.n_tokens = n, .token = b->tok, .logits = b->want};
    if (ds_seq_truncate(b->e, 0, d)) return -1;
    double t0 = ds_now();
    if (ds_decode(b->e, &batch)) return -1;
    return ds_now() - t0;
}

/* n decode steps of sequences 0..B-1 together, at positions d..d+n-1 (each
 * sequence holds d random positions first), each sequence's token the argmax
 * of its last; returns seconds or < 0 on error. */
static double run_tg(bench_ctx *b, int n, int d, int B)
{
    int V = ds_engine_n_vocab(b->e);
    int32_t t[MAX_SEQS];
    for (int s = 0; s < B; s++) {
        t[s] = b->tok[s];
        b->want[s] = true;
        if (ds_seq_truncate(b->e, s, d)) return -1;
    }
    double t0 = ds_now();
    for (int i = 0; i < n; i++) {
        ds_batch batch = {.n_tokens = B, .token = t, .seq = b->seq, .logits = b->want};
        if (ds_decode(b->e, &batch)) return -1;
        for (int s = 0; s < B; s++) t[s] = ds_argmax(ds_logits(b->e, s), V);
    }
    return ds_now() - t0;
}

typedef enum { OUT_MD, OUT_CSV, OUT_JSON, OUT_JSONL } out_format;

typedef struct {
    bool json;         /* a machine format (-o csv|json|jsonl) rather than the table */
    out_format fmt;
    int threads;
    double bw, fma, bf16, amx; /* amx: the tile peak, 0 unless the kernels use AMX */
    const char *kernels, *dtype, *bw_what; /* what bw measures */
    json_t *common;    /* the fields every row carries: model, build, machine, date */
    json_t *rows;      /* -o json and csv: printed at the end */
} report;

static double mean_of(const double *v, int n, double *sd)
{
    double m = 0, q = 0;
    for (int i = 0; i < n; i++) m += v[i] / n;
    for (int i = 0; i < n; i++) q += (v[i] - m) * (v[i] - m);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
    return m;
}

/* A row of a machine format: the common fields, then the row's; printed now
 * (jsonl) or kept for the end. Returns non-zero when out of memory. */
static int emit_row(report *r, json_t *row)
{
    if (!row || json_object_update(row, r->common)) {
        json_decref(row);
        return -1;
    }
    if (r->fmt == OUT_JSONL) {
        char *t = json_dumps(row, JSON_PRESERVE_ORDER);
        json_decref(row);
        if (!t) return -1;
        printf("%s\n", t);
        free(t);
        return 0;
    }
    return json_array_append_new(r->rows, row);
}

/* The llama-bench fields of a run of reps repetitions, as tok/s samples. */
static json_t *row_new(const char *test, int np, int ng, int d, int seqs, int threads, const double *tps, int reps)
{
    json_t *row = json_object(), *ts = json_array(), *ns = json_array();
    int bad = !row || !ts || !ns;
    for (int i = 0; !bad && i < reps; i++)
        bad |= json_array_append_new(ts, json_real(tps[i])) ||
               json_array_append_new(ns, json_integer((json_int_t)(1e9 * (np + ng * seqs) / tps[i])));
    double sd_ts, sd_ns, ns_v[64];
    int k = reps < 64 ? reps : 64;
    for (int i = 0; i < k; i++) ns_v[i] = 1e9 * (np + ng * seqs) / tps[i];
    double avg_ts = mean_of(tps, reps, &sd_ts), avg_ns = mean_of(ns_v, k, &sd_ns);
    bad = bad || json_object_set_new(row, "test", json_string(test)) ||
          json_object_set_new(row, "n_prompt", json_integer(np)) || json_object_set_new(row, "n_gen", json_integer(ng)) ||
          json_object_set_new(row, "depth", json_integer(d)) || json_object_set_new(row, "n_depth", json_integer(d)) ||
          json_object_set_new(row, "n_seqs", json_integer(seqs)) ||
          json_object_set_new(row, "threads", json_integer(threads)) ||
          json_object_set_new(row, "n_threads", json_integer(threads)) ||
          json_object_set_new(row, "avg_ts", json_real(avg_ts)) ||
          json_object_set_new(row, "stddev_ts", json_real(sd_ts)) ||
          json_object_set_new(row, "avg_ns", json_integer((json_int_t)avg_ns)) ||
          json_object_set_new(row, "stddev_ns", json_integer((json_int_t)sd_ns)) ||
          json_object_set_new(row, "samples_ts", ts) || json_object_set_new(row, "samples_ns", ns);
    if (bad) {
        json_decref(row);
        return NULL;
    }
    return row;
}

/* What a decode row's bytes are made of: seqs sequences decoding together,
 * the routed experts a MoE layer ran (distinct over the batch, averaged over
 * layers and steps), the KV cache bytes a token read; beside: on the CPU, the
 * median over repetitions of GB/s over the bandwidth measured beside that
 * repetition, and the median of those bandwidths (0: not measured). */
typedef struct {
    int seqs;
    double experts, kv_tok, beside_frac, beside_bw;
} decode_extra;

static int print_row(report *r, const char *test, int np, int ng, int d, spread s, const double *tps, int reps,
                     double bytes_tok, double flop_tok, const decode_extra *x)
{
    static const decode_extra none = {.seqs = 1};
    if (!x) x = &none;
    double gbps = bytes_tok * s.med / 1e9, gflops = flop_tok * s.med / 1e9;
    double lim = r->bf16 > 0 ? r->bf16 : r->fma;
    double beside_frac = x->beside_frac, beside_bw = x->beside_bw;
    char name[32];
    if (x->seqs > 1) snprintf(name, sizeof name, "%s%dx%d", test, ng, x->seqs);
    else snprintf(name, sizeof name, "%s%d", test, !strcmp(test, "tg") ? ng : np);
    if (r->json) {
        json_t *row = row_new(test, np, ng, d, x->seqs, r->threads, tps, reps);
        if (!row || json_object_set_new(row, "kernels", json_string(r->kernels)) ||
            json_object_set_new(row, "weights", json_string(r->dtype)) ||
            json_object_set_new(row, "tok_s", json_real(s.med)) || json_object_set_new(row, "tok_s_min", json_real(s.min)) ||
            json_object_set_new(row, "tok_s_max", json_real(s.max)) ||
            json_object_set_new(row, "bytes_per_token", json_real(bytes_tok)) ||
            json_object_set_new(row, "gbps", json_real(gbps)) || json_object_set_new(row, "bw_gbps", json_real(r->bw)) ||
            json_object_set_new(row, "bw_frac", json_real(r->bw > 0 ? gbps / r->bw : 0)) ||
            json_object_set_new(row, "gflops", json_real(gflops)) ||
            json_object_set_new(row, "fma_peak_gflops", json_real(r->fma)) ||
            json_object_set_new(row, "bf16_peak_gflops", json_real(r->bf16)) ||
            json_object_set_new(row, "amx_peak_gflops", json_real(r->amx)) ||
            json_object_set_new(row, "bw_beside_gbps", json_real(beside_bw)) ||
            json_object_set_new(row, "bw_beside_frac", json_real(beside_frac)) ||
            json_object_set_new(row, "experts_per_layer", json_real(x->experts)) ||
            json_object_set_new(row, "kv_bytes_per_token", json_real(x->kv_tok))) {
            json_decref(row);
            return -1;
        }
        return emit_row(r, row);
    } else if (!(r->bw > 0 && lim > 0)) { /* a device whose limits could not be measured */
        printf("%-7s %6d %9.2f  [%7.2f, %7.2f] %9.1f MB %7.2f GB/s %6.1f GFLOP/s  (limit unmeasured)\n", name, d,
               s.med, s.min, s.max, bytes_tok / 1e6, gbps, gflops);
    } else if (!strcmp(test, "tg")) {
        printf("%-7s %6d %9.2f  [%7.2f, %7.2f] %9.1f MB %7.2f GB/s  %5.1f%% of %5.1f GB/s %s", name, d, s.med, s.min,
               s.max, bytes_tok / 1e6, gbps, 100 * gbps / r->bw, r->bw, r->bw_what);
        if (beside_bw > 0) printf("; %5.1f%% of %5.1f beside", 100 * beside_frac, beside_bw);
        /* a token's bytes: its share of the weights the step read, and its KV rows */
        printf(" (%.1f experts a layer, KV %.1f MB)\n", x->experts, x->kv_tok / 1e6);
    } else {
        if (r->amx > 0) { /* the prefill GEMM on AMX tiles: bounded by their peak */
            printf("%-7s %6d %9.2f  [%7.2f, %7.2f] %6.1f GFLOP/s  %5.1f%% of %5.1f AMX tile peak (%5.1f bf16 dot, %5.1f "
                   "f32 FMA)\n", name, d, s.med, s.min, s.max, gflops, 100 * gflops / r->amx, r->amx, r->bf16, r->fma);
            fflush(stdout);
            return 0;
        }
        /* the widest dot product the device has: bf16 (AVX512_BF16, tensor cores), else f32 FMA (AVX2) */
        printf("%-7s %6d %9.2f  [%7.2f, %7.2f] %6.1f GFLOP/s  %5.1f%% of %5.1f %s peak", name, d, s.med, s.min,
               s.max, gflops, 100 * gflops / lim, lim, r->bf16 > 0 ? "bf16" : "f32 FMA");
        if (r->fma > 0 && r->bf16 > 0) printf(" (%5.1f f32 FMA)", r->fma); /* the CPU's; a GPU's is its tensor cores' */
        printf("\n");
    }
    fflush(stdout);
    return 0;
}

/* The limits of the rows that follow (the table), with the threads they use. */
static void print_limits(const report *r, bool cuda)
{
    if (cuda) {
        printf("device: copy bandwidth %.1f GB/s (read + written, 1 GiB, best of 10); bf16 tensor-core peak %.1f "
               "GFLOP/s\n", r->bw, r->bf16);
    } else {
        printf("machine, %d threads: read bandwidth %.1f GB/s (1 GiB of fresh memory or of the mapped weights, the "
               "better, best of 10); f32 FMA peak %.1f GFLOP/s", r->threads, r->bw, r->fma);
        if (r->bf16 > 0) printf("; bf16 dot peak %.1f GFLOP/s", r->bf16);
        else printf("; no bf16 dot product (AVX512_BF16) on this CPU");
        if (r->amx > 0) printf("; AMX bf16 tile peak %.1f GFLOP/s (the prefill GEMM runs on AMX)", r->amx);
        printf("\n");
    }
    printf("%-7s %6s %9s  %-18s %s\n", "test", "depth", "tok/s", "[min, max]", "vs limit");
}

/* --profile, after a decode row: a step's time split between the decode
 * products, the attention and the rest, per step over all repetitions
 * (secs: their wall time, ntok: their steps; seqs: sequences a step), the
 * products' GB/s beside the read bandwidth, and the products by weight bytes
 * a call. */
static void print_profile(const report *r, int ng, int seqs, int d, double secs, int ntok)
{
    char name[32];
    if (seqs > 1) snprintf(name, sizeof name, "tg%dx%d", ng, seqs);
    else snprintf(name, sizeof name, "tg%d", ng);
    ds_profile st;
    ds_profile_read(&st);
    double step = secs / ntok, pb = 0, ps = 0, att = st.attention.seconds / ntok, ht = st.heads_t.seconds / ntok;
    for (int k = 0; k < DS_PROFILE_SIZES; k++) {
        pb += st.products[k].bytes;
        ps += st.products[k].seconds;
    }
    double prod = ps / ntok, other = step - prod - att - ht, gbps = ps > 0 ? pb / ps / 1e9 : 0;
    double ht_gbps = st.heads_t.seconds > 0 ? st.heads_t.bytes / st.heads_t.seconds / 1e9 : 0;
    if (r->json && r->fmt != OUT_JSONL) return; /* one kind of row per table */
    if (r->json) {
        printf("{\"test\": \"profile\", \"n_gen\": %d, \"n_seqs\": %d, \"depth\": %d, \"step_ms\": %.4f, \"products_ms\": %.4f, "
               "\"products_gbps\": %.3f, \"bw_gbps\": %.3f, \"attention_ms\": %.4f, \"heads_t_ms\": %.4f, \"heads_t_gbps\": %.3f, \"other_ms\": %.4f, "
               "\"sizes\": [",
               ng, seqs, d, 1e3 * step, 1e3 * prod, gbps, r->bw, 1e3 * att, 1e3 * ht, ht_gbps, 1e3 * other);
        const char *sep = "";
        for (int k = 0; k < DS_PROFILE_SIZES; k++) {
            const ds_profile_stat *c = &st.products[k];
            if (!c->calls) continue;
            printf("%s{\"bytes_per_call\": %.0f, \"calls_per_token\": %.3f, \"gbps\": %.3f}", sep, c->bytes / c->calls,
                   (double)c->calls / ntok, c->bytes / c->seconds / 1e9);
            sep = ", ";
        }
        printf("]}\n");
        return;
    }
    if (ps == 0 && st.attention.calls == 0 && st.heads_t.calls == 0) {
        printf("  a step of %s at depth %d: %.2f ms; --profile counts the vectorised kernels, and none ran\n", name, d,
               1e3 * step);
        return;
    }
    printf("  a step of %s at depth %d: %.2f ms = decode products %.2f ms (%.1f%%", name, d, 1e3 * step, 1e3 * prod,
           100 * prod / step);
    if (ps > 0) printf("; %.2f GB/s, %.1f%% of %.1f GB/s %s", gbps, 100 * gbps / r->bw, r->bw, r->bw_what);
    printf(") + attention %.2f ms (%.1f%%) + per-head products %.2f ms (%.1f%%; %.2f GB/s) + the rest %.2f ms "
           "(%.1f%%)\n", 1e3 * att, 100 * att / step, 1e3 * ht, 100 * ht / step, ht_gbps, 1e3 * other, 100 * other / step);
    for (int k = 0; k < DS_PROFILE_SIZES; k++) {
        const ds_profile_stat *c = &st.products[k];
        if (c->calls)
            printf("    products of %8.3f MB: %5.2f a step, %6.2f GB/s (%5.1f%% of the time)\n", c->bytes / c->calls / 1e6,
                   (double)c->calls / ntok, c->bytes / c->seconds / 1e9, 100 * c->seconds / secs);
    }
}

static void cpu_name(char *out, size_t cap)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(out, cap, "unknown");
    while (f && fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (c && (!strncmp(line, "model name", 10) || !strncmp(line, "Model", 5))) {
            c += 1 + (c[1] == ' ');
            c[strcspn(c, "\n")] = 0;
            snprintf(out, cap, "%s", c);
            break;
        }
    }
    if (f) fclose(f);
}

/* The fields of every machine-format row: what ran, where and when. */
static json_t *common_fields(const char *ckpt, const char *config, const char *dtype, const char *kernels, bool cuda,
                             int world, size_t ckpt_bytes, int n_ctx)
{
    char cpu[256], date[32], cfg[4096];
    cpu_name(cpu, sizeof cpu);
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    snprintf(cfg, sizeof cfg, "%s%s", config ? config : ckpt, config ? "" : "/config.json");
    const char *backends =
#ifdef DSV3_CUDA
        "CPU,CUDA";
#else
        "CPU";
#endif
    char build[128];
    snprintf(build, sizeof build, "cuda=%s mpi=%s", 
#ifdef DSV3_CUDA
             "on",
#else
             "off",
#endif
#ifdef DSV3_MPI
             "on"
#else
             "off"
#endif
    );
    const char *slash = strrchr(ckpt, '/');
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:i, s:i, s:s}", "model_filename",
                          ckpt, "model_type", slash && slash[1] ? slash + 1 : ckpt, "config", cfg, "dtype", dtype,
                          "build_commit", DSV3_COMMIT, "build_version", DSV3_VERSION, "build_options", build,
                          "backends", backends, "cpu_info", cpu, "gpu_info", cuda ? kernels : "", "device", kernels,
                          "model_size", (json_int_t)ckpt_bytes, "ranks", world, "n_ctx", n_ctx, "test_time", date);
    return o;
}

/* -o csv: a header from the first row's keys, then one line a row; an array
 * field is its elements joined by ';'; strings are quoted. */
static void print_csv(json_t *rows)
{
    json_t *first = json_array_get(rows, 0);
    if (!first) return;
    const char *key;
    json_t *v;
    const char *sep = "";
    json_object_foreach(first, key, v) {
        printf("%s%s", sep, key);
        sep = ",";
    }
    printf("\n");
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        sep = "";
        json_object_foreach(first, key, v) {
            json_t *x = json_object_get(row, key);
            printf("%s", sep);
            sep = ",";
            if (json_is_string(x)) {
                putchar('"');
                for (const char *c = json_string_value(x); *c; c++) {
                    if (*c == '"') putchar('"');
                    putchar(*c);
                }
                putchar('"');
            } else if (json_is_array(x)) {
                size_t j;
                json_t *e;
                putchar('"');
                json_array_foreach(x, j, e) printf("%s%.17g", j ? ";" : "", json_number_value(e));
                putchar('"');
            } else if (json_is_integer(x)) {
                printf("%lld", (long long)json_integer_value(x));
            } else if (json_is_number(x)) {
                printf("%.17g", json_number_value(x));
            } else if (json_is_boolean(x)) {
                printf("%s", json_is_true(x) ? "true" : "false");
            }
        }
        printf("\n");
    }
}

static int parse_list(const char *s, int **out, const char *flag)
{
    int n = args_int_list(s, out);
    for (int i = 0; i < n; i++)
        if ((*out)[i] < 0) n = -1;
    if (n <= 0) fprintf(stderr, "dsv3 bench: %s must be comma-separated non-negative integers, got '%s'\n", flag, s);
    return n;
}

int cmd_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--spec")) return cmd_bench_spec(argc, argv);
    const char *ckpt = NULL, *config = NULL, *ps = "512", *ns = "128", *ds = "0", *ss = "1", *attn = "absorb";
    const char *gemm = "bf16";
    const char *device = "auto";
    int reps = 3;
    const char *ts = NULL;
    bool json = false, ref = false, profile = false, no_amx = false;
    const char *fmt = "md";
    arg_spec specs[] = {
        {"--ckpt-path", ARG_STR, &ckpt, true, "DIR  checkpoint (converted, or Hugging Face layout)"},
        {"--config", ARG_STR, &config, false, "FILE model config (default: DIR/config.json)"},
        {"-p", ARG_STR, &ps, false, "LIST prompt lengths for prefill tests (default 512; 0 skips)"},
        {"-n", ARG_STR, &ns, false, "LIST generated tokens for decode tests (default 128; 0 skips)"},
        {"-d", ARG_STR, &ds, false, "LIST context depths (default 0)"},
        {"--seqs", ARG_STR, &ss, false, "LIST sequences decoding together, a token each a step (default 1)"},
        {"-t", ARG_STR, &ts, false, "LIST threads, 1 to 1024 each (default: OpenMP's); the limits are measured for each"},
        {"-r", ARG_INT, &reps, false, "N    repetitions per test (default 3)"},
        {"-o", ARG_STR, &fmt, false, "FMT  md (the table, default), csv, json (an array) or jsonl (an object a line)"},
        {"--json", ARG_BOOL, &json, false, "     the same as -o jsonl"},
        {"--profile", ARG_BOOL, &profile, false, "     after each decode row, where a step's time goes (CPU)"},
        {"--device", ARG_STR, &device, false, "cpu|cuda|auto (default auto: CUDA when built in and a GPU is present)"},
        {"--ref-kernels", ARG_BOOL, &ref, false, "     use the scalar reference kernels"},
        {"--no-amx", ARG_BOOL, &no_amx, false, "     CPU: the AVX-512 prefill GEMM even where AMX could run it"},
        {"--attn-impl", ARG_STR, &attn, false, "absorb|naive (default absorb)"},
        {"--gemm-impl", ARG_STR, &gemm, false, "bf16|fp8 (default bf16)"},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof *specs, USAGE);
    if (rc) return rc == 1 ? 0 : rc;
    out_format of = !strcmp(fmt, "md") ? OUT_MD : !strcmp(fmt, "csv") ? OUT_CSV : !strcmp(fmt, "json") ? OUT_JSON
                   : !strcmp(fmt, "jsonl")                                     ? OUT_JSONL
                                                                               : (out_format)-1;
    if ((int)of < 0) {
        fprintf(stderr, "dsv3 bench: -o must be md, csv, json or jsonl, not '%s'\n", fmt);
        return 2;
    }
    if (json) of = OUT_JSONL;
    json = of != OUT_MD;
    int *pl = NULL, *nl = NULL, *dl = NULL, *sl = NULL, *tl = NULL;
    int np = parse_list(ps, &pl, "-p"), nn = parse_list(ns, &nl, "-n"), nd = parse_list(ds, &dl, "-d");
    int nsq = parse_list(ss, &sl, "--seqs"), maxs = 1;
    for (int i = 0; i < nsq; i++) maxs = sl[i] > maxs ? sl[i] : maxs;
    int ntl = ts ? parse_list(ts, &tl, "-t") : 0;
    bool bad_t = ts && ntl <= 0, bad_s = false;
    for (int i = 0; i < ntl; i++) bad_t |= tl[i] < 1 || tl[i] > MAX_THREADS;
    for (int i = 0; i < nsq; i++) bad_s |= sl[i] < 1 || sl[i] > MAX_SEQS;
    if (bad_s) fprintf(stderr, "dsv3 bench: --seqs must be in 1..%d, got '%s'\n", MAX_SEQS, ss);
    if (np <= 0 || nn <= 0 || nd <= 0 || nsq <= 0 || bad_s || reps < 1 || bad_t) {
        if (reps < 1) fprintf(stderr, "dsv3 bench: -r must be >= 1\n");
        if (bad_t) fprintf(stderr, "dsv3 bench: -t must be in 1..%d (absent: OpenMP's default)\n", MAX_THREADS);
        free(pl);
        free(nl);
        free(dl);
        free(sl);
        free(tl);
        return 2;
    }
    if (ntl) ds_set_threads(tl[0]);
    ds_engine_params ep = ds_engine_default_params();
    ep.config_path = config;
    ep.no_tokenizer = true;
    ep.device = device;
    ep.ref_kernels = ref;
    ep.no_amx = no_amx;
    ep.attention = !strcmp(attn, "naive") ? DS_ATTENTION_NAIVE : DS_ATTENTION_ABSORB;
    ep.matmul = !strcmp(gemm, "fp8") ? DS_MATMUL_FP8 : DS_MATMUL_BF16;
    ds_model_info_buf info;
    bench_ctx b = {0};
    report r = {0};
    ds_dist *dist = NULL;
    double *times = calloc((size_t)reps * 3, sizeof(double)), *beside = times + reps, *beside_bw = times + 2 * reps;
    int maxd = 0, maxn = 1;
    for (int i = 0; i < nd; i++) maxd = dl[i] > maxd ? dl[i] : maxd;
    for (int i = 0; i < np; i++) maxn = pl[i] > maxn ? pl[i] : maxn;
    for (int i = 0; i < nn; i++) maxn = nl[i] > maxn ? nl[i] : maxn;
    rc = 1;
    if (!times || ds_dist_init(&argc, &argv, &dist) || ds_read_model_info(ckpt, config, &info)) goto fail;
    ep.dist = dist;
    int world = ds_dist_world_size(dist);
    /* under mpirun every rank runs the same passes; rank 0 alone reports */
    if (ds_dist_rank(dist) != 0 && !freopen("/dev/null", "w", stdout)) {
        ds_errorf(DS_ERR_IO, "cannot silence stdout on rank %d", ds_dist_rank(dist));
        goto fail;
    }
    const ds_model_info *cfg = &info.info;
    if (maxd + maxn > cfg->max_seq_len) {
        ds_errorf(DS_ERR_RANGE, "depth %d + %d tokens exceed max_seq_len %d", maxd, maxn, cfg->max_seq_len);
        goto fail;
    }
    /* the machine's limits first: the 1 GiB buffer is gone before the model
     * is paged in, so it does not count in the peak RSS */
    r = (report){.json = json, .fmt = of, .threads = ds_threads(), .bw_what = "read"};
    ds_limits lim;
    if (ds_measure_limits(device, ref, dist, &lim)) goto fail;
    bool cuda = lim.gpu;
    if (profile && cuda) {
        ds_errorf(DS_ERR_ARG, "--profile times the CPU backend's kernels; it does not apply to --device cuda");
        goto fail;
    }
    r.bw = lim.bandwidth_gbps;
    r.fma = lim.fma_gflops;
    r.bf16 = lim.bf16_gflops;
    if (cuda) r.bw_what = "copy";
    double t_load = ds_now();
    ep.n_ctx = maxd + maxn;
    ep.n_seq = maxs;
    if (ds_engine_load(ckpt, &ep, &b.e)) goto fail;
    size_t ckpt_bytes;
    ds_engine_touch_weights(b.e, &ckpt_bytes);
    t_load = ds_now() - t_load;
    /* the weights' own mapping, when it is large enough (1 GiB of one shard):
     * the limit is the better of the two, fresh memory or the mapped weights */
    double bw_mapped = ds_engine_weights_bandwidth(b.e, 10);
    if (bw_mapped > r.bw) r.bw = bw_mapped;
    int maxtok = maxn > maxs ? maxn : maxs;
    b.tok = malloc(sizeof(int32_t) * (size_t)maxtok);
    b.want = malloc((size_t)maxtok);
    b.seq = malloc(sizeof(int) * (size_t)maxs);
    if (!b.tok || !b.want || !b.seq) {
        ds_errorf(DS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    uint64_t seed = 1;
    for (int i = 0; i < maxtok; i++) b.tok[i] = (int32_t)(lcg(&seed) % (uint32_t)cfg->n_vocab);
    for (int s = 0; s < maxs; s++) b.seq[s] = s;

    r.kernels = ds_engine_device_name(b.e);
    bool amx = strstr(r.kernels, "-amx") != NULL; /* the tile peak bounds the prefill GEMM */
    r.amx = amx ? lim.amx_gflops : 0;
    r.dtype = ds_engine_weight_dtype(b.e);
    double kv_pos = (double)ds_engine_kv_bytes(b.e) / ds_engine_n_ctx(b.e); /* a position's rows, all layers */
    size_t kv_bytes = ds_engine_kv_bytes(b.e) * (size_t)maxs;               /* every sequence's cache */
    if (json) {
        r.common = common_fields(ckpt, config, r.dtype, r.kernels, cuda, world, ckpt_bytes, ds_engine_n_ctx(b.e));
        r.rows = json_array();
        if (!r.common || !r.rows) {
            ds_errorf(DS_ERR_NOMEM, "out of memory building the report");
            goto fail;
        }
    }
    if (!json) {
        printf("model %s: %d layers, %s weights, checkpoint %.2f GB (loaded and paged in: %.1f s); kernels %s, "
               "%d threads%s\n", ckpt, cfg->n_layers, r.dtype, ckpt_bytes / 1e9, t_load, r.kernels, r.threads,
               dist ? " per rank; weights, bytes and GB/s are rank 0's shard" : "");
        if (dist)
            printf("ranks: %d (tensor parallel); checkpoint figure is rank 0's shard\n", world);
    }
    int E = cfg->n_routed_experts, K = cfg->n_activated_experts;
    for (int ti = 0; ti < (ntl ? ntl : 1); ti++) {
        if (ti > 0) { /* the limits again, with this many threads */
            ds_set_threads(tl[ti]);
            r.threads = ds_threads();
            if (ds_measure_limits(device, ref, dist, &lim)) goto fail;
            r.bw = fmax(lim.bandwidth_gbps, ds_engine_weights_bandwidth(b.e, 10));
            r.fma = lim.fma_gflops;
            r.bf16 = lim.bf16_gflops;
            r.amx = amx ? lim.amx_gflops : 0;
        }
        if (!json) print_limits(&r, cuda);
        for (int di = 0; di < nd; di++) {
            int d = dl[di];
            for (int s = 0; s < maxs; s++)
                if (ds_seq_fill_random(b.e, s, d, 42 + (uint64_t)s)) goto fail;
            for (int i = 0; i < np; i++) {
                int n = pl[i];
                if (!n) continue;
                if (run_pp(&b, n, d) < 0) goto fail; /* warm-up */
                for (int k = 0; k < reps; k++)
                    if ((times[k] = run_pp(&b, n, d)) < 0) goto fail;
                for (int k = 0; k < reps; k++) times[k] = n / times[k];
                /* experts a batch touches, if routing were uniform: E (1 - (1 - K/E)^n) */
                double touched = E * (1 - pow(1 - (double)K / E, n));
                spread sp = summarise(times, reps);
                if (print_row(&r, "pp", n, 0, d, sp, times, reps, ds_engine_pass_bytes(b.e, touched, 1) / n,
                              2 * ds_engine_pass_params(b.e, K, 0), NULL))
                    goto nomem;
            }
            for (int i = 0; i < nn * nsq; i++) {
                int n = nl[i / nsq], B = sl[i % nsq];
                if (!n) continue;
                if (run_tg(&b, n < 4 ? n : 4, d, B) < 0) goto fail; /* warm-up */
                double bw_prev = ds_engine_weights_bandwidth(b.e, 2), secs = 0;
                ds_profile_enable(true); /* the experts the steps ran, and --profile's split */
                for (int k = 0; k < reps; k++) {
                    if ((times[k] = run_tg(&b, n, d, B)) < 0) goto fail;
                    secs += times[k];
                    double bw_next = ds_engine_weights_bandwidth(b.e, 2);
                    beside_bw[k] = fmax(bw_prev, bw_next);
                    bw_prev = bw_next;
                }
                /* the bytes a step must read: the weights, each MoE layer's routed
                 * experts once however many of the batch chose them (as counted by the
                 * CPU kernels; elsewhere: K for one token, else the uniform-routing
                 * expectation E (1 - (1 - K/E)^B)), and each sequence's KV rows,
                 * positions d+1 .. d+n over the n steps */
                ds_profile pr;
                ds_profile_read(&pr);
                decode_extra x = {.seqs = B};
                x.experts = pr.moe_calls ? pr.experts / pr.moe_calls : B == 1 ? K : E * (1 - pow(1 - (double)K / E, B));
                x.kv_tok = kv_pos * (d + 0.5 * (n + 1));
                double tok_bytes = ds_engine_pass_bytes(b.e, x.experts, 1) / B + x.kv_tok;
                for (int k = 0; k < reps; k++) {
                    beside[k] = beside_bw[k] > 0 ? tok_bytes * B * n / times[k] / 1e9 / beside_bw[k] : 0;
                    times[k] = B * n / times[k];
                }
                x.beside_frac = summarise(beside, reps).med;
                x.beside_bw = summarise(beside_bw, reps).med;
                spread sp = summarise(times, reps);
                if (print_row(&r, "tg", 0, n, d, sp, times, reps, tok_bytes, 2 * ds_engine_pass_params(b.e, x.experts, 1) / B,
                              &x))
                    goto nomem;
                if (profile) print_profile(&r, n, B, d, secs, n * reps);
                ds_profile_enable(false);
            }
        }
    }
    if (ds_engine_check(b.e)) goto fail;
    long rss = peak_rss_kb();
    /* on a GPU the KV cache is device memory: not part of the process's resident set */
    double kv_host = cuda ? 0 : (double)kv_bytes;
    int ctx = ds_engine_n_ctx(b.e);
    char seqs[32] = "";
    if (maxs > 1) snprintf(seqs, sizeof seqs, " x %d sequences", maxs);
    if (json) {
        json_t *mem = json_pack("{s:s, s:f, s:I, s:I, s:b}", "test", "memory", "peak_rss_bytes", rss * 1024.0,
                                "checkpoint_bytes", (json_int_t)ckpt_bytes, "kv_cache_bytes", (json_int_t)kv_bytes,
                                "kv_cache_on_device", cuda);
        if (of == OUT_CSV) {
            json_decref(mem); /* a table of runs: the memory figures have other columns */
        } else if (!mem || (of == OUT_JSONL ? emit_row(&r, mem) : json_array_append_new(r.rows, mem))) {
            goto nomem;
        }
        if (of == OUT_JSON) {
            if (json_dumpf(r.rows, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) goto nomem;
            printf("\n");
        } else if (of == OUT_CSV) {
            print_csv(r.rows);
        }
    } else if (cuda)
        printf("peak RSS %.2f GB = checkpoint %.2f GB + %.0f MB other; KV cache %.3f GB (ctx %d%s) in device memory\n",
               rss * 1024.0 / 1e9, ckpt_bytes / 1e9, (rss * 1024.0 - (double)ckpt_bytes) / 1e6, kv_bytes / 1e9, ctx, seqs);
    else
        printf("peak RSS %.2f GB = checkpoint %.2f GB + KV cache %.3f GB (ctx %d%s) + %.0f MB other\n", rss * 1024.0 / 1e9,
               ckpt_bytes / 1e9, kv_bytes / 1e9, ctx, seqs, (rss * 1024.0 - (double)ckpt_bytes - kv_host) / 1e6);
    rc = 0;
    goto done;
nomem:
    ds_errorf(DS_ERR_NOMEM, "out of memory building the report");
fail:
    rc = args_fail_dist(dist, "bench");
done:
    json_decref(r.common);
    json_decref(r.rows);
    ds_engine_free(b.e);
    ds_dist_finish(dist);
    free(b.tok);
    free(b.want);
    free(b.seq);
    free(times);
    free(pl);
    free(nl);
    free(dl);
    free(sl);
    free(tl);
    return rc;
}
