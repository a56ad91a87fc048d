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
 * measured f32 FMA and bf16 dot-product peaks. With --device cuda the limits
 * are the GPU's, measured by the CUDA backend: device copy bandwidth (bytes
 * read plus written) and the bf16 tensor-core rate. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "dist/dist.h"
#include "dist/nccl_comm.h"
#include "backend/cpu/cpu_peak.h"
#include "backend/cpu/cpu_stats.h"
#include "cmds.h"
#include "device.h"
#include "model/model.h"
#include "model/sampler.h"
#ifdef DSV3_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#define USAGE "--ckpt-path DIR --config FILE [-p 64,512] [-n 32,128] [-d 0,1024,4096] [-t N] [-r REPS] [--json] [--profile] " \
              "[--device cpu|cuda|auto] [--ref-kernels] [--attn-impl absorb|naive] [--gemm-impl bf16|fp8]"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t wbytes(const ds_weight *w)
{
    if (!w->data) return 0;
    size_t n = (size_t)w->rows * w->cols, esz = w->fmt == DS_W_FP8 ? 1 : w->fmt == DS_W_BF16 ? 2 : 4;
    size_t s = w->fmt == DS_W_FP8 ? (size_t)((w->rows + 127) / 128) * ((w->cols + 127) / 128) * 4 : 0;
    return n * esz + s;
}

static size_t welems(const ds_weight *w) { return w->data ? (size_t)w->rows * w->cols : 0; }

/* Weight bytes (or elements) one forward pass reads when each MoE layer
 * touches `experts` routed experts; the head is counted `head` times. */
static double pass_weights(const ds_model *m, double experts, int head, size_t (*f)(const ds_weight *))
{
    double sum = 0;
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const ds_layer *l = &m->layers[i];
        sum += (double)(f(&l->wq) + f(&l->wq_a) + f(&l->wq_b) + f(&l->wkv_a) + f(&l->wkv_b) + f(&l->wo));
        if (!l->moe) {
            sum += (double)(f(&l->w1) + f(&l->w2) + f(&l->w3));
            continue;
        }
        sum += (double)(f(&l->gate) + f(&l->sw1) + f(&l->sw2) + f(&l->sw3));
        sum += experts * (double)(f(&l->ew1[0]) + f(&l->ew2[0]) + f(&l->ew3[0]));
    }
    return sum + head * (double)f(&m->head);
}

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

/* Reads one byte of every page of every shard, so timing sees no page faults. */
static void touch_checkpoint(const ds_ckpt *c, size_t *bytes)
{
    volatile uint8_t sink = 0;
    *bytes = 0;
    for (size_t f = 0; f < c->n_files; f++) {
        const st_file *sf = c->files[f];
        *bytes += sf->size;
        for (size_t i = 0; i < sf->n_tensors; i++) {
            const uint8_t *p = sf->tensors[i].data;
            size_t len = sf->tensors[i].nbytes;
            for (size_t o = 0; p && o < len; o += 4096) sink += p[o];
        }
    }
    (void)sink;
}

static uint32_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/* Rows [0, d) of sequence 0 get uniform values in [-1, 1]. */
static int fill_cache(const ds_model *m, ds_kvcache *kv, int d)
{
    uint64_t s = 42;
    const ds_config *c = &m->cfg;
    size_t na = kv->attn == DS_ATTN_ABSORB ? (size_t)c->kv_lora_rank : (size_t)m->n_local_heads * m->qk_head_dim;
    size_t nb = kv->attn == DS_ATTN_ABSORB ? (size_t)c->qk_rope_head_dim : (size_t)m->n_local_heads * c->v_head_dim;
    size_t most = (size_t)d * (na > nb ? na : nb);
    float *h = most ? malloc(sizeof(float) * most) : NULL; /* the cache may be device memory: uploaded */
    if (most && !h) {
        fprintf(stderr, "dsv3 bench: out of memory for a KV cache of depth %d\n", d);
        return -1;
    }
    for (int li = 0; li < kv->n_layers && most; li++)
        for (int part = 0; part < 2; part++) {
            size_t cnt = (size_t)d * (part ? nb : na);
            for (size_t i = 0; i < cnt; i++) h[i] = (float)lcg(&s) / 2147483648.0f - 1.0f;
            float *dst = kv->attn == DS_ATTN_ABSORB ? (part ? kv->pe[li] : kv->kv[li]) : (part ? kv->v[li] : kv->k[li]);
            m->ops->upload(dst, h, sizeof(float) * cnt);
        }
    free(h);
    return 0;
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
    ds_model *m;
    ds_kvcache *kv;
    int32_t *tok;
    int *seq, *pos;
    bool *want;
    float *logits;
} bench_ctx;

/* One timed prefill of n tokens at depth d; returns seconds or < 0 on error. */
static double run_pp(bench_ctx *b, int n, int d)
{
    for (int i = 0; i < n; i++) {
        b->pos[i] = d + i;
        b->want[i] = i == n - 1;
    }
    double t0 = now();
    if (model_forward(b->m, b->kv, n, b->tok, b->seq, b->pos, b->want, b->logits)) return -1;
    return now() - t0;
}

/* n decode steps at positions d..d+n-1, each token the argmax of the last. */
static double run_tg(bench_ctx *b, int n, int d)
{
    int V = b->m->cfg.vocab_size;
    int32_t t = b->tok[0];
    bool want = true;
    double t0 = now();
    for (int i = 0; i < n; i++) {
        int pos = d + i, seq = 0;
        if (model_forward(b->m, b->kv, 1, &t, &seq, &pos, &want, b->logits)) return -1;
        t = sampler_argmax(b->logits, V);
    }
    return now() - t0;
}

typedef struct {
    bool json;
    int threads;
    double bw, fma, bf16;
    const char *kernels, *dtype, *bw_what; /* what bw measures */
} report;

/* beside: for decode on the CPU, the median over repetitions of GB/s over
 * the bandwidth measured beside that repetition, and the median of those
 * bandwidths (0: not measured). */
static void print_row(const report *r, const char *test, int np, int ng, int d, spread s, double bytes_tok,
                      double flop_tok, double beside_frac, double beside_bw)
{
    double gbps = bytes_tok * s.med / 1e9, gflops = flop_tok * s.med / 1e9;
    double lim = r->bf16 > 0 ? r->bf16 : r->fma;
    if (r->json) {
        printf("{\"test\": \"%s\", \"n_prompt\": %d, \"n_gen\": %d, \"depth\": %d, \"threads\": %d, "
               "\"kernels\": \"%s\", \"weights\": \"%s\", \"tok_s\": %.3f, \"tok_s_min\": %.3f, \"tok_s_max\": %.3f, "
               "\"bytes_per_token\": %.0f, \"gbps\": %.3f, \"bw_gbps\": %.3f, \"bw_frac\": %.4f, "
               "\"gflops\": %.2f, \"fma_peak_gflops\": %.2f, \"bf16_peak_gflops\": %.2f, "
               "\"bw_beside_gbps\": %.3f, \"bw_beside_frac\": %.4f}\n",
               test, np, ng, d, r->threads, r->kernels, r->dtype, s.med, s.min, s.max, bytes_tok, gbps, r->bw,
               r->bw > 0 ? gbps / r->bw : 0, gflops, r->fma, r->bf16, beside_bw, beside_frac);
    } else if (!(r->bw > 0 && lim > 0)) { /* a device whose limits could not be measured */
        printf("%s%-5d %6d %9.2f  [%7.2f, %7.2f] %9.1f MB %7.2f GB/s %6.1f GFLOP/s  (limit unmeasured)\n", test,
               !strcmp(test, "tg") ? ng : np, d, s.med, s.min, s.max, bytes_tok / 1e6, gbps, gflops);
    } else if (!strcmp(test, "tg")) {
        printf("tg%-5d %6d %9.2f  [%7.2f, %7.2f] %9.1f MB %7.2f GB/s  %5.1f%% of %5.1f GB/s %s", ng, d, s.med, s.min,
               s.max, bytes_tok / 1e6, gbps, 100 * gbps / r->bw, r->bw, r->bw_what);
        if (beside_bw > 0) printf("; %5.1f%% of %5.1f beside", 100 * beside_frac, beside_bw);
        printf("\n");
    } else {
        /* the widest dot product the device has: bf16 (AVX512_BF16, tensor cores), else f32 FMA (AVX2) */
        printf("pp%-5d %6d %9.2f  [%7.2f, %7.2f] %6.1f GFLOP/s  %5.1f%% of %5.1f %s peak", np, d, s.med, s.min,
               s.max, gflops, 100 * gflops / lim, lim, r->bf16 > 0 ? "bf16" : "f32 FMA");
        if (r->fma > 0 && r->bf16 > 0) printf(" (%5.1f f32 FMA)", r->fma); /* the CPU's; a GPU's is its tensor cores' */
        printf("\n");
    }
    fflush(stdout);
}

/* Read bandwidth of the checkpoint's own mapping (its largest shard, up to
 * 1 GiB; resident, since touch_checkpoint read it), best of reps passes: the
 * limit measured right beside each decode repetition, on a machine whose
 * bandwidth drifts while it runs. 0 on a GPU, with several ranks, or when
 * the shard is under 256 MiB (the caches would hold too much of it). */
/* --profile, after a decode row: a step's time split between the decode
 * products, the attention and the rest, per token over all repetitions
 * (secs: their wall time, ntok: their tokens), the products' GB/s beside the
 * read bandwidth, and the products by weight bytes a call. */
static void print_profile(const report *r, int ng, int d, double secs, int ntok)
{
    cpu_stats st;
    cpu_stats_read(&st);
    double step = secs / ntok, pb = 0, ps = 0, att = st.attention.seconds / ntok, ht = st.heads_t.seconds / ntok;
    for (int k = 0; k < CPU_STAT_SIZES; k++) {
        pb += st.products[k].bytes;
        ps += st.products[k].seconds;
    }
    double prod = ps / ntok, other = step - prod - att - ht, gbps = ps > 0 ? pb / ps / 1e9 : 0;
    double ht_gbps = st.heads_t.seconds > 0 ? st.heads_t.bytes / st.heads_t.seconds / 1e9 : 0;
    if (r->json) {
        printf("{\"test\": \"profile\", \"n_gen\": %d, \"depth\": %d, \"step_ms\": %.4f, \"products_ms\": %.4f, "
               "\"products_gbps\": %.3f, \"bw_gbps\": %.3f, \"attention_ms\": %.4f, \"heads_t_ms\": %.4f, \"heads_t_gbps\": %.3f, \"other_ms\": %.4f, "
               "\"sizes\": [",
               ng, d, 1e3 * step, 1e3 * prod, gbps, r->bw, 1e3 * att, 1e3 * ht, ht_gbps, 1e3 * other);
        const char *sep = "";
        for (int k = 0; k < CPU_STAT_SIZES; k++) {
            const cpu_stat *c = &st.products[k];
            if (!c->calls) continue;
            printf("%s{\"bytes_per_call\": %.0f, \"calls_per_token\": %.3f, \"gbps\": %.3f}", sep, c->bytes / c->calls,
                   (double)c->calls / ntok, c->bytes / c->seconds / 1e9);
            sep = ", ";
        }
        printf("]}\n");
        return;
    }
    if (ps == 0 && st.attention.calls == 0 && st.heads_t.calls == 0) {
        printf("  a step of tg%d at depth %d: %.2f ms; --profile counts the vectorised kernels, and none ran\n", ng, d,
               1e3 * step);
        return;
    }
    printf("  a step of tg%d at depth %d: %.2f ms = decode products %.2f ms (%.1f%%", ng, d, 1e3 * step, 1e3 * prod,
           100 * prod / step);
    if (ps > 0) printf("; %.2f GB/s, %.1f%% of %.1f GB/s %s", gbps, 100 * gbps / r->bw, r->bw, r->bw_what);
    printf(") + attention %.2f ms (%.1f%%) + per-head products %.2f ms (%.1f%%; %.2f GB/s) + the rest %.2f ms "
           "(%.1f%%)\n", 1e3 * att, 100 * att / step, 1e3 * ht, 100 * ht / step, ht_gbps, 1e3 * other, 100 * other / step);
    for (int k = 0; k < CPU_STAT_SIZES; k++) {
        const cpu_stat *c = &st.products[k];
        if (c->calls)
            printf("    products of %8.3f MB: %5.2f a step, %6.2f GB/s (%5.1f%% of the time)\n", c->bytes / c->calls / 1e6,
                   (double)c->calls / ntok, c->bytes / c->seconds / 1e9, 100 * c->seconds / secs);
    }
}

static double mapped_bandwidth(const bench_ctx *b, bool cuda, const ds_comm *comm, int reps)
{
    if (cuda || comm) return 0;
    const st_file *big = NULL;
    for (size_t f = 0; f < b->m->ckpt->n_files; f++)
        if (!big || b->m->ckpt->files[f]->size > big->size) big = b->m->ckpt->files[f];
    if (!big || !big->map || big->size < ((size_t)256 << 20)) return 0;
    size_t n = big->size < ((size_t)1 << 30) ? big->size : (size_t)1 << 30;
    return cpu_read_bandwidth_at(big->map, n, reps);
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
    const char *ckpt = NULL, *config = NULL, *ps = "512", *ns = "128", *ds = "0", *attn = "absorb", *gemm = "bf16";
    const char *device = "auto";
    int threads = 0, reps = 3;
    bool json = false, ref = false, profile = false;
    arg_spec specs[] = {
        {"--ckpt-path", ARG_STR, &ckpt, true, "DIR  checkpoint (converted, or Hugging Face layout)"},
        {"--config", ARG_STR, &config, true, "FILE model config"},
        {"-p", ARG_STR, &ps, false, "LIST prompt lengths for prefill tests (default 512; 0 skips)"},
        {"-n", ARG_STR, &ns, false, "LIST generated tokens for decode tests (default 128; 0 skips)"},
        {"-d", ARG_STR, &ds, false, "LIST context depths (default 0)"},
        {"-t", ARG_INT, &threads, false, "N    threads (default: OpenMP's)"},
        {"-r", ARG_INT, &reps, false, "N    repetitions per test (default 3)"},
        {"--json", ARG_BOOL, &json, false, "     one JSON object per line"},
        {"--profile", ARG_BOOL, &profile, false, "     after each decode row, where a step's time goes (CPU)"},
        {"--device", ARG_STR, &device, false, "cpu|cuda|auto (default auto: CUDA when built in and a GPU is present)"},
        {"--ref-kernels", ARG_BOOL, &ref, false, "     use the scalar reference kernels"},
        {"--attn-impl", ARG_STR, &attn, false, "absorb|naive (default absorb)"},
        {"--gemm-impl", ARG_STR, &gemm, false, "bf16|fp8 (default bf16)"},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof *specs, USAGE);
    if (rc) return rc == 1 ? 0 : rc;
    int *pl = NULL, *nl = NULL, *dl = NULL;
    int np = parse_list(ps, &pl, "-p"), nn = parse_list(ns, &nl, "-n"), nd = parse_list(ds, &dl, "-d");
    if (np <= 0 || nn <= 0 || nd <= 0 || reps < 1 || threads < 0) {
        if (reps < 1 || threads < 0) fprintf(stderr, "dsv3 bench: -r must be >= 1 and -t >= 0\n");
        free(pl);
        free(nl);
        free(dl);
        return 2;
    }
    if (threads) omp_set_num_threads(threads);
    ds_model_opts o = {.attn = !strcmp(attn, "naive") ? DS_ATTN_NAIVE : DS_ATTN_ABSORB,
                       .gemm = !strcmp(gemm, "fp8") ? DS_GEMM_FP8 : DS_GEMM_BF16};
    ds_config cfg;
    bench_ctx b = {0};
    ds_comm *comm = NULL;
    double *times = calloc((size_t)reps * 3, sizeof(double)), *beside = times + reps, *beside_bw = times + 2 * reps;
    int maxd = 0, maxn = 1;
    for (int i = 0; i < nd; i++) maxd = dl[i] > maxd ? dl[i] : maxd;
    for (int i = 0; i < np; i++) maxn = pl[i] > maxn ? pl[i] : maxn;
    for (int i = 0; i < nn; i++) maxn = nl[i] > maxn ? nl[i] : maxn;
    rc = 1;
    if (!times || dist_init(&argc, &argv, &comm) || tool_backend(device, ref, &o.ops) ||
        dist_attach_device(comm, o.ops) || config_load(&cfg, config))
        goto fail;
    o.comm = comm;
    /* under mpirun every rank runs the same passes; rank 0 alone reports */
    if (dist_rank(comm) != 0 && !freopen("/dev/null", "w", stdout)) {
        ds_errorf(DS_ERR_IO, "cannot silence stdout on rank %d", dist_rank(comm));
        goto fail;
    }
    if (maxd + maxn > cfg.max_seq_len) {
        ds_errorf(DS_ERR_RANGE, "depth %d + %d tokens exceed max_seq_len %d", maxd, maxn, cfg.max_seq_len);
        goto fail;
    }
    /* the machine's limits first: the 1 GiB buffer is gone before the model
     * is paged in, so it does not count in the peak RSS */
    report r = {.json = json, .threads = omp_get_max_threads(), .bw_what = "read"};
    bool cuda = !strcmp(o.ops->name, "cuda");
    if (profile && cuda) {
        ds_errorf(DS_ERR_ARG, "--profile times the CPU backend's kernels; it does not apply to --device cuda");
        goto fail;
    }
    if (!cuda && dist_rank(comm) == 0) {
        /* with several ranks on one machine, rank 0 measures while the others wait */
        int t = omp_get_max_threads();
        if (comm && comm->local_size > 1) omp_set_num_threads(t * comm->local_size);
        r.bw = cpu_read_bandwidth((size_t)1 << 30, 10);
        r.fma = cpu_fma_peak();
        r.bf16 = cpu_bf16_peak();
        omp_set_num_threads(t);
    }
    if (comm && dist_agree(comm, DS_OK)) goto fail;
#ifdef DSV3_CUDA
    if (cuda) {
        r.bw = cuda_measure_copy_bandwidth();
        r.bf16 = 1000 * cuda_measure_bf16_tc_peak();
        r.bw_what = "copy";
    }
#endif
    double t_load = now();
    if (model_load(&b.m, ckpt, &cfg, &o) || kvcache_new(&b.kv, b.m, 1, maxd + maxn)) goto fail;
    size_t ckpt_bytes;
    touch_checkpoint(b.m->ckpt, &ckpt_bytes);
    t_load = now() - t_load;
    /* the weights' own mapping, when it is large enough (1 GiB of one shard):
     * the limit is the better of the two, fresh memory or the mapped weights */
    double bw_mapped = mapped_bandwidth(&b, cuda, comm, 10);
    if (bw_mapped > r.bw) r.bw = bw_mapped;
    b.tok = malloc(sizeof(int32_t) * (size_t)maxn);
    b.seq = calloc((size_t)maxn, sizeof(int));
    b.pos = malloc(sizeof(int) * (size_t)maxn);
    b.want = malloc((size_t)maxn);
    b.logits = malloc(sizeof(float) * (size_t)cfg.vocab_size);
    if (!b.tok || !b.seq || !b.pos || !b.want || !b.logits) {
        ds_errorf(DS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    uint64_t seed = 1;
    for (int i = 0; i < maxn; i++) b.tok[i] = (int32_t)(lcg(&seed) % (uint32_t)cfg.vocab_size);

    const ds_layer *l0 = &b.m->layers[cfg.n_layers - 1];
    r.kernels = o.ops->name;
    r.dtype = l0->wkv_a.fmt == DS_W_FP8 ? "fp8" : l0->wkv_a.fmt == DS_W_BF16 ? "bf16" : "f32";
    size_t kv_bytes = (size_t)(b.kv->attn == DS_ATTN_ABSORB ? cfg.kv_lora_rank + cfg.qk_rope_head_dim
                                                             : b.m->n_local_heads * (b.m->qk_head_dim + cfg.v_head_dim)) *
                      sizeof(float) * (size_t)b.kv->ctx * cfg.n_layers;
    if (!json) {
        printf("model %s: %d layers, %s weights, checkpoint %.2f GB (loaded and paged in: %.1f s); kernels %s, "
               "%d threads%s\n", ckpt, cfg.n_layers, r.dtype, ckpt_bytes / 1e9, t_load, r.kernels, r.threads,
               comm ? " per rank; weights, bytes and GB/s are rank 0's shard" : "");
        if (comm)
            printf("ranks: %d (tensor parallel); checkpoint figure is rank 0's shard\n", comm->world_size);
        if (cuda) {
            printf("device: copy bandwidth %.1f GB/s (read + written, 1 GiB, best of 10); bf16 tensor-core peak %.1f "
                   "GFLOP/s\n", r.bw, r.bf16);
        } else {
            printf("machine: read bandwidth %.1f GB/s (1 GiB of fresh memory or of the mapped weights, the better, "
                   "best of 10); f32 FMA peak %.1f GFLOP/s", r.bw, r.fma);
            if (r.bf16 > 0) printf("; bf16 dot peak %.1f GFLOP/s\n", r.bf16);
            else printf("; no bf16 dot product (AVX512_BF16) on this CPU\n");
        }
        printf("%-7s %6s %9s  %-18s %s\n", "test", "depth", "tok/s", "[min, max]", "vs limit");
    }
    int E = cfg.n_routed_experts, K = cfg.n_activated_experts;
    for (int di = 0; di < nd; di++) {
        int d = dl[di];
        if (fill_cache(b.m, b.kv, d)) goto fail;
        for (int i = 0; i < np; i++) {
            int n = pl[i];
            if (!n) continue;
            if (run_pp(&b, n, d) < 0) goto fail; /* warm-up */
            for (int k = 0; k < reps; k++)
                if ((times[k] = run_pp(&b, n, d)) < 0) goto fail;
            for (int k = 0; k < reps; k++) times[k] = n / times[k];
            /* experts a batch touches, if routing were uniform: E (1 - (1 - K/E)^n) */
            double touched = E * (1 - pow(1 - (double)K / E, n));
            print_row(&r, "pp", n, 0, d, summarise(times, reps), pass_weights(b.m, touched, 1, wbytes) / n,
                      2 * pass_weights(b.m, K, 0, welems), 0, 0);
        }
        for (int i = 0; i < nn; i++) {
            int n = nl[i];
            if (!n) continue;
            if (run_tg(&b, n < 4 ? n : 4, d) < 0) goto fail; /* warm-up */
            double tok_bytes = pass_weights(b.m, K, 1, wbytes), bw_prev = mapped_bandwidth(&b, cuda, comm, 2), secs = 0;
            cpu_stats_enable(profile);
            for (int k = 0; k < reps; k++) {
                if ((times[k] = run_tg(&b, n, d)) < 0) goto fail;
                secs += times[k];
                double bw_next = mapped_bandwidth(&b, cuda, comm, 2), bw_k = fmax(bw_prev, bw_next);
                beside[k] = bw_k > 0 ? tok_bytes * n / times[k] / 1e9 / bw_k : 0;
                beside_bw[k] = bw_k;
                bw_prev = bw_next;
            }
            for (int k = 0; k < reps; k++) times[k] = n / times[k];
            print_row(&r, "tg", 0, n, d, summarise(times, reps), tok_bytes, 2 * pass_weights(b.m, K, 1, welems),
                      summarise(beside, reps).med, summarise(beside_bw, reps).med);
            if (profile) print_profile(&r, n, d, secs, n * reps);
            cpu_stats_enable(false);
        }
    }
    if (tool_backend_status(o.ops)) goto fail;
    long rss = peak_rss_kb();
    /* on a GPU the KV cache is device memory: not part of the process's resident set */
    double kv_host = cuda ? 0 : (double)kv_bytes;
    if (json)
        printf("{\"test\": \"memory\", \"peak_rss_bytes\": %.0f, \"checkpoint_bytes\": %zu, \"kv_cache_bytes\": %zu, "
               "\"kv_cache_on_device\": %s}\n",
               rss * 1024.0, ckpt_bytes, kv_bytes, cuda ? "true" : "false");
    else if (cuda)
        printf("peak RSS %.2f GB = checkpoint %.2f GB + %.0f MB other; KV cache %.3f GB (ctx %d) in device memory\n",
               rss * 1024.0 / 1e9, ckpt_bytes / 1e9, (rss * 1024.0 - (double)ckpt_bytes) / 1e6, kv_bytes / 1e9,
               b.kv->ctx);
    else
        printf("peak RSS %.2f GB = checkpoint %.2f GB + KV cache %.3f GB (ctx %d) + %.0f MB other\n", rss * 1024.0 / 1e9,
               ckpt_bytes / 1e9, kv_bytes / 1e9, b.kv->ctx, (rss * 1024.0 - (double)ckpt_bytes - kv_host) / 1e6);
    rc = 0;
    goto done;
fail:
    rc = dist_fail(comm, "bench");
done:
    kvcache_free(b.kv);
    model_free(b.m);
    tool_backend_release(o.ops);
    dist_finish(comm);
    free(b.tok);
    free(b.seq);
    free(b.pos);
    free(b.want);
    free(b.logits);
    free(times);
    free(pl);
    free(nl);
    free(dl);
    return rc;
}
