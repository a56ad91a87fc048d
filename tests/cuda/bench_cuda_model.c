/* bench_cuda_model.c - the whole model on the CUDA backend: batch-1 and
 * batch-8 decode, decode at a 4k-token depth, and prefills of 512 and 4096
 * tokens, each beside its ceiling measured in the same run (device-to-device
 * copy bandwidth for decode; for prefill the cuBLAS bf16 GEMM rate, and with
 * FP8 weights the cuBLASLt e4m3 GEMM rate for the FP8 GEMM path).
 *
 *   bench_cuda_model CKPT_DIR CONFIG [reps]
 *
 * Roofline for decode: every byte a step must read / copy bandwidth. Weights:
 * attention, dense and shared MLPs, the head, and the routed experts the step's
 * tokens chose, each distinct expert once (counted from the routing of eager
 * steps of the same shape: 6 a layer at batch 1, fewer than 8 x 6 at batch 8);
 * at depth d, each sequence's KV-cache rows 0..d of every layer too. The 4k
 * depth fills rows 0..4095 of the KV cache with random values (attention costs
 * the same whatever the values). Decode steps replay a recorded graph after two
 * warm-up steps (tune.no_graphs: every step eager); batch 1 is also timed
 * eagerly, and with every step's logits downloaded (the rest pick the next tokens on
 * the device, as generation does), and the logits of a recorded step are compared with
 * the eager ones.
 * Prefill FLOPs count two per active weight and token (attention's own not
 * counted). BENCH_AB (below) adds rows per tuning; BENCH_AB_ONLY=1 prints those
 * rows alone. BENCH_GEMM=fp8 runs the model with the reference's gemm_impl fp8;
 * with FP8 weights the prefills are timed in both gemm modes. Not a test:
 * prints figures. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_backend.h"
#include "base/clock.h"
#include "model/model.h"

/* Bytes of a weight as stored (codes and scales); with g_count_elems, its element count. */
static bool g_count_elems;

static size_t wbytes(const ds_weight *w)
{
    if (!w->data) return 0;
    if (g_count_elems) return (size_t)w->rows * w->cols;
    size_t n = (size_t)w->rows * w->cols, e = w->fmt == DS_W_FP8 ? 1 : w->fmt == DS_W_BF16 ? 2 : 4;
    return n * e + (w->fmt == DS_W_FP8 ? (size_t)((w->rows + 127) / 128) * ((w->cols + 127) / 128) * 4 : 0);
}

static double token_bytes(const ds_model *m, double experts)
{
    double s = wbytes(&m->head) + (g_count_elems ? 0 : (double)m->cfg.dim * (m->embed.fmt == DS_W_BF16 ? 2 : 4));
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const ds_layer *l = &m->layers[i];
        s += wbytes(&l->wq) + wbytes(&l->wq_a) + wbytes(&l->wq_b) + wbytes(&l->wkv_a) + wbytes(&l->wkv_b) + wbytes(&l->wo);
        if (!l->moe) {
            s += wbytes(&l->w1) + wbytes(&l->w2) + wbytes(&l->w3);
            continue;
        }
        s += wbytes(&l->gate) + wbytes(&l->sw1) + wbytes(&l->sw2) + wbytes(&l->sw3);
        s += experts * (double)(wbytes(&l->ew1[0]) + wbytes(&l->ew2[0]) + wbytes(&l->ew3[0]));
    }
    return s;
}

/* Distinct routed experts per MoE layer that n tokens choosing K of E each touch, expected
 * for uniform routing: E (1 - (1 - K/E)^n). Printed beside the count from the routing. */
static double distinct_experts(const ds_config *c, int n)
{
    double e = c->n_routed_experts, k = c->n_activated_experts;
    return e * (1 - pow(1 - k / e, n));
}

/* Bytes of KV cache a decode step of bs sequences at position depth reads: rows 0..depth
 * of each sequence in every layer (the compressed kv and the rope keys, float32). */
static double kv_bytes(const ds_config *c, int bs, int depth)
{
    return (double)bs * c->n_layers * (depth + 1.0) * (c->kv_lora_rank + c->qk_rope_head_dim) * sizeof(float);
}

/* The routed experts a step touches, counted from its routing: the model runs on a copy
 * of the CUDA table whose moe_experts, while g_count_on, downloads the chosen expert ids
 * (eager steps only: a download cannot be recorded) and counts the distinct local ones. */
static const ds_ops *g_dev;
static ds_ops g_counting;
static bool g_count_on;
static double g_count_sum; /* distinct experts, summed over the counted MoE calls */
static long g_count_calls;

static void counting_moe_experts(float *y, const float *x, int n, int K, const int *idx, const float *wt,
                                 const ds_weight *ew1, const ds_weight *ew2, const ds_weight *ew3, int e0, int ne,
                                 const ds_mlp_w *shared, ds_gemm_impl gemm, bool ue8m0)
{
    int h[64 * 16];
    if (g_count_on && n * K <= 64 * 16) {
        g_dev->download(h, idx, sizeof(int) * (size_t)n * K);
        int d = 0;
        for (int i = 0; i < n * K; i++) {
            int j = 0;
            while (j < i && h[j] != h[i]) j++;
            d += j == i && h[i] >= e0 && h[i] < e0 + ne;
        }
        g_count_sum += d;
        g_count_calls++;
    }
    g_dev->moe_experts(y, x, n, K, idx, wt, ew1, ew2, ew3, e0, ne, shared, gemm, ue8m0);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds of `reps` decode steps of `bs` sequences at positions depth, depth+1, ...
 * (after two more), each as generation runs it: the next tokens picked on the device
 * (greedy) and only they downloaded; with g_host_logits, every step's logits downloaded
 * instead (model_forward). */
static bool g_host_logits;

static double decode(ds_model *m, ds_kvcache *kv, int bs, int depth, int reps, float *logits)
{
    int32_t tok[64];
    int seq[64], pos[64];
    bool want[64];
    double t[256];
    for (int r = 0; r < reps + 2; r++) {
        for (int i = 0; i < bs; i++) {
            tok[i] = (int32_t)((r * 7919 + i * 104729) % m->cfg.vocab_size);
            seq[i] = i;
            pos[i] = depth + r;
            want[i] = true;
        }
        int32_t next[64];
        double t0 = ds_now();
        if (g_host_logits ? model_forward(m, kv, bs, tok, seq, pos, want, logits)
                          : model_forward_pick(m, kv, bs, tok, seq, pos, NULL, next))
            return -1;
        if (r >= 2) t[r - 2] = ds_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp);
    return t[reps / 2];
}

/* Prefills of main: positions 0..np-1 of sequence 0, logits of the last token. */
static int32_t *g_tok;
static int *g_seq, *g_pos;
static bool *g_want;

/* Median seconds of 3 prefills of np tokens after one warm-up. */
static double prefill(ds_model *m, ds_kvcache *kv, int np, float *logits)
{
    double t[3];
    for (int i = 0; i < np; i++) g_want[i] = i == np - 1;
    for (int r = 0; r < 4; r++) {
        double t0 = ds_now();
        if (model_forward(m, kv, np, g_tok, g_seq, g_pos, g_want, logits)) return -1;
        if (r >= 1) t[r - 1] = ds_now() - t0;
    }
    qsort(t, 3, sizeof *t, cmp);
    return t[1];
}

/* Mean distinct routed experts a MoE layer of a decode step of bs sequences touched, over
 * four eager steps of decode's tokens, counted from the routing. */
static double touched_experts(ds_model *m, ds_kvcache *kv, int bs, float *logits)
{
    bool ng = m->opt.tune.no_graphs;
    m->opt.tune.no_graphs = true;
    g_count_sum = 0, g_count_calls = 0, g_count_on = true;
    double t = decode(m, kv, bs, 0, 2, logits);
    g_count_on = false;
    m->opt.tune.no_graphs = ng;
    return t < 0 || g_count_calls == 0 ? -1 : g_count_sum / g_count_calls;
}

/* Max |graph - eager| / max |eager| over the logits of decode step 4 of one sequence. */
static double graph_vs_eager(ds_model *m, float *a, float *b)
{
    float *out[2] = {a, b};
    for (int mode = 0; mode < 2; mode++) {
        ds_kvcache *kv = NULL;
        m->opt.tune.no_graphs = mode;
        if (kvcache_new(&kv, m, 1, 8)) return -1;
        for (int i = 0; i < 8; i++) {
            int32_t tok = (int32_t)((i * 7919 + 11) % m->cfg.vocab_size);
            int seq = 0, pos = i;
            bool want = true;
            if (model_forward(m, kv, 1, &tok, &seq, &pos, &want, out[mode])) return -1;
        }
        kvcache_free(kv);
    }
    m->opt.tune.no_graphs = false;
    double err = 0, mx = 0;
    for (int i = 0; i < m->cfg.vocab_size; i++) {
        double d = a[i] - b[i];
        err = d > err ? d : -d > err ? -d : err;
        mx = b[i] > mx ? b[i] : -b[i] > mx ? -b[i] : mx;
    }
    return err / mx;
}

static void fill_cache(const ds_model *m, ds_kvcache *kv, int rows)
{
    size_t R = (size_t)m->cfg.kv_lora_rank, rp = (size_t)m->cfg.qk_rope_head_dim, n = (size_t)rows * (R > rp ? R : rp);
    float *h = malloc(sizeof(float) * n);
    uint64_t s = 42;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)(s >> 40) / 8388608.0f - 1.0f;
    }
    for (int li = 0; li < kv->n_layers; li++) {
        m->ops->upload(kv->kv[li], h, sizeof(float) * rows * R);
        m->ops->upload(kv->pe[li], h, sizeof(float) * rows * rp);
    }
    m->ops->sync();
    free(h);
}

/* The fields of cuda_tuning that a BENCH_AB spec may set, by name. */
#define TUNE_FIELD(f, b) {#f, offsetof(cuda_tuning, f), b}
static const struct {
    const char *name;
    size_t off;
    bool is_bool;
} k_fields[] = {
    TUNE_FIELD(gemm_bf16, true),       TUNE_FIELD(grouped_wgmma, true),   TUNE_FIELD(fp8_mma, true),
    TUNE_FIELD(fp8_wgmma, true),       TUNE_FIELD(attn_tc, true),         TUNE_FIELD(tc_tiles, false),
    TUNE_FIELD(attend_max_pos, false), TUNE_FIELD(attend_max_tokens, false), TUNE_FIELD(attend_long, false),
    TUNE_FIELD(attend_cluster, false), TUNE_FIELD(expand_min, false),    TUNE_FIELD(flash, false),
    TUNE_FIELD(flash_kc, false),       TUNE_FIELD(dense_chunk, false),   TUNE_FIELD(scratch_fill, false),
    TUNE_FIELD(attend_pro, true),
};

/* t with spec's "field=value,field=value" applied (cuda_tuning's field names); false on a
 * name it does not know. */
static bool tuning_parse(cuda_tuning *t, const char *spec)
{
    char sb[256];
    snprintf(sb, sizeof sb, "%s", spec);
    for (char *s2 = NULL, *kv = strtok_r(sb, ",", &s2); kv; kv = strtok_r(NULL, ",", &s2)) {
        char *eq = strchr(kv, '=');
        if (!eq) return false;
        *eq = 0;
        size_t i = 0, n = sizeof k_fields / sizeof *k_fields;
        while (i < n && strcmp(k_fields[i].name, kv)) i++;
        if (i == n) return false;
        char *at = (char *)t + k_fields[i].off;
        if (k_fields[i].is_bool) *(bool *)at = atoi(eq + 1) != 0;
        else *(int *)at = atoi(eq + 1);
    }
    return true;
}

/* BENCH_AB="spec;spec;...": the decode figures again for each tuning of the CUDA backend
 * in this one process (a spec: "default", or field=value,... of cuda_tuning, the other
 * fields at their defaults), each on a new KV cache (so new graphs), with its graph vs
 * eager logits check. */
static int ab_variants(ds_model *m, const char *list, int depth, int ctx, int reps, float *logits, double roof,
                       double roof8)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    printf("A/B (BENCH_AB): ms per step, median of %d (pf512: of 3)\n%-40s %8s %8s %8s %8s %8s %8s %9s %9s %9s\n",
           reps, "variant", "b1", "b1 eager", "b8", "d4096", "b8 d4096", "pf512", "b1 roof", "b8 roof", "g-e diff");
    for (char *save = NULL, *spec = strtok_r(buf, ";", &save); spec; spec = strtok_r(NULL, ";", &save)) {
        cuda_tuning t = cuda_tuning_default();
        if (strcmp(spec, "default") && !tuning_parse(&t, spec)) {
            fprintf(stderr, "BENCH_AB: %s: not field=value of cuda_tuning\n", spec);
            return -1;
        }
        cuda_backend_set_tuning(&t);
        ds_kvcache *kv = NULL;
        if (kvcache_new(&kv, m, 8, ctx)) return -1;
        double t1 = decode(m, kv, 1, 0, reps, logits);
        m->opt.tune.no_graphs = true;
        double t1e = decode(m, kv, 1, 0, reps, logits);
        m->opt.tune.no_graphs = false;
        double t8 = decode(m, kv, 8, 0, reps, logits);
        fill_cache(m, kv, depth);
        double t4k = decode(m, kv, 1, depth, reps, logits);
        double t84k = decode(m, kv, 8, depth, reps, logits); /* sequences 1..7: zeroed caches */
        double tpf = prefill(m, kv, 512, logits);
        kvcache_free(kv);
        double gerr = graph_vs_eager(m, logits, logits + m->cfg.vocab_size);
        if (cuda_backend_status() || t1 < 0 || t1e < 0 || t8 < 0 || t4k < 0 || t84k < 0 || tpf < 0 || gerr < 0)
            return -1;
        printf("%-40s %8.3f %8.3f %8.3f %8.3f %8.3f %8.2f %8.1f%% %8.1f%% %9.2e\n", spec, t1 * 1e3, t1e * 1e3,
               t8 * 1e3, t4k * 1e3, t84k * 1e3, tpf * 1e3, 100 * roof / t1, 100 * roof8 / t8, gerr);
    }
    cuda_tuning t = cuda_tuning_default();
    cuda_backend_set_tuning(&t);
    return 0;
}

/* One prefill of np tokens with every op synchronised: each op's wall time, its own
 * launches and kernels (cuda_op_times). */
static int op_times(ds_model *m, ds_kvcache *kv, int np, float *logits)
{
    for (int i = 0; i < np; i++) g_want[i] = i == np - 1;
    cuda_op_times(true);
    double t = ds_now();
    if (model_forward(m, kv, np, g_tok, g_seq, g_pos, g_want, logits)) return -1;
    t = ds_now() - t;
    cuda_op_times(false);
    printf("prefill %d (gemm %s) with every op synchronised: %.3f ms\n", np,
           m->opt.gemm == DS_GEMM_FP8 ? "fp8" : "bf16", t * 1e3);
    cuda_op_times_print(stdout);
    return 0;
}

/* Prints one prefill row: np tokens in t seconds against the ceiling tc (TFLOP/s) named what. */
static void prefill_row(const char *label, int np, double t, double flop_tok, double tc, const char *what)
{
    double fl = flop_tok * np / t / 1e12;
    printf("%-22s %10.3f %10.1f %5.1f%% of %s peak (%.1f TFLOP/s on weights)\n", label, t * 1e3, np / t,
           100 * fl / tc, what, fl);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_cuda_model CKPT_DIR CONFIG [reps]\n");
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 20;
    if (reps < 1 || reps > 250) reps = 20;
    if (cuda_device_count() == 0) {
        printf("bench_cuda_model: skipped: no GPU\n");
        return 0;
    }
    const ds_ops *ops = cuda_backend();
    ds_config cfg;
    ds_model *m = NULL;
    ds_kvcache *kv = NULL;
    if (!ops || config_load(&cfg, argv[2])) goto fail;
    g_dev = ops;
    g_counting = *ops;
    g_counting.moe_experts = counting_moe_experts;
    double bw = cuda_measure_copy_bandwidth(), tc = cuda_measure_bf16_tc_peak();
    double tc8 = cuda_measure_fp8_tc_peak();
    printf("ceilings: device-to-device copy %.0f GB/s (read + write), bf16 GEMM %.0f TFLOP/s, fp8 GEMM %.0f TFLOP/s "
           "(cuBLASLt e4m3, sums in the tensor cores)\n", bw, tc, tc8);
    /* BENCH_GEMM=fp8: the reference's gemm_impl fp8 (act_quant on every product's input) */
    const char *bg = getenv("BENCH_GEMM");
    bool fp8gemm = bg && !strcmp(bg, "fp8");
    if (fp8gemm) printf("gemm_impl fp8 (BENCH_GEMM)\n");
    ds_model_opts o = {.attn = DS_ATTN_ABSORB, .gemm = fp8gemm ? DS_GEMM_FP8 : DS_GEMM_BF16, .ops = &g_counting};
    double t0 = ds_now();
    if (model_load(&m, argv[1], &cfg, &o)) goto fail;
    printf("load + upload: %.1f s, %.2f GiB of weights on the device\n", ds_now() - t0, cuda_weight_bytes() / 1073741824.0);
    bool fp8w = m->layers[m->cfg.n_layers - 1].wkv_a.fmt == DS_W_FP8;
    int depth = 4096, ctx = depth + reps + 8;
    if (kvcache_new(&kv, m, 8, ctx)) goto fail;
    printf("KV cache: 8 x %d positions, %.2f GiB\n", ctx,
           8.0 * ctx * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4 * cfg.n_layers / 1073741824.0);
    float *logits = malloc(sizeof(float) * 8 * (size_t)cfg.vocab_size);
    if (!logits) goto fail;
    /* prefills at positions 0..np-1 of sequence 0, logits of the last token */
    int np = 512, npl = 4096;
    g_tok = malloc(sizeof(int32_t) * npl);
    g_seq = calloc((size_t)npl, sizeof(int));
    g_pos = malloc(sizeof(int) * npl);
    g_want = calloc((size_t)npl, 1);
    if (!g_tok || !g_seq || !g_pos || !g_want) goto fail;
    for (int i = 0; i < npl; i++) {
        g_tok[i] = (int32_t)((i * 7919) % cfg.vocab_size);
        g_pos[i] = i;
    }
    g_want[np - 1] = true;
    const char *prof_mode = getenv("BENCH_PROFILE");
    if (prof_mode) {
        /* for ncu --profile-from-start off: one eager batch-1 step at depth 0, one
         * at depth 4096, one batch-8 step (after warm-up steps each), then one
         * prefill of 512 tokens (after a warm-up prefill). BENCH_PROFILE=decode:
         * the decode steps only; =prefill: the prefill only. */
        bool pd = strcmp(prof_mode, "prefill") != 0, pp = strcmp(prof_mode, "decode") != 0;
        /* BENCH_PROFILE_TOKENS: the profiled prefill's length (512; up to 4096) */
        const char *pt = getenv("BENCH_PROFILE_TOKENS");
        if (pt && atoi(pt) >= 1 && atoi(pt) <= npl) {
            g_want[np - 1] = false;
            np = atoi(pt);
            g_want[np - 1] = true;
        }
        m->opt.tune.no_graphs = true;
        if (pd && decode(m, kv, 1, 0, 1, logits) < 0) goto fail;
        int prof[3][2] = {{1, 0}, {1, 4096}, {8, 0}};
        for (int c = 0; c < (pd ? 3 : 0); c++) {
            int bs = prof[c][0], d = prof[c][1];
            if (d) fill_cache(m, kv, depth);
            if (decode(m, kv, bs, d, 1, logits) < 0) goto fail; /* warm-up: 3 steps */
            int32_t tk[8];
            int sq[8], ps[8];
            bool wn[8];
            for (int i = 0; i < bs; i++) tk[i] = 17 + i, sq[i] = i, ps[i] = d + 3, wn[i] = true;
            cuda_profile_range(true);
            if (model_forward(m, kv, bs, tk, sq, ps, wn, logits)) goto fail;
            cuda_profile_range(false);
        }
        if (pp) {
            if (model_forward(m, kv, np, g_tok, g_seq, g_pos, g_want, logits)) goto fail;
            cuda_profile_range(true);
            if (model_forward(m, kv, np, g_tok, g_seq, g_pos, g_want, logits)) goto fail;
            cuda_profile_range(false);
        }
        printf("profile steps done\n");
        return 0;
    }
    if (getenv("BENCH_AB_ONLY") && getenv("BENCH_AB")) { /* the A/B table alone */
        double e1 = touched_experts(m, kv, 1, logits), e8 = touched_experts(m, kv, 8, logits);
        if (e1 < 0 || e8 < 0) goto fail;
        double roof1 = token_bytes(m, e1) / (bw * 1e9), roof8 = token_bytes(m, e8) / (bw * 1e9);
        printf("rooflines: batch 1 %.3f ms (%.1f experts a layer), batch 8 %.3f ms (%.1f)\n", roof1 * 1e3, e1,
               roof8 * 1e3, e8);
        if (ab_variants(m, getenv("BENCH_AB"), depth, ctx, reps, logits, roof1, roof8)) goto fail;
        kvcache_free(kv);
        model_free(m);
        cuda_forget_weights();
        return 0;
    }
    double t1 = decode(m, kv, 1, 0, reps, logits);
    g_host_logits = true;
    double t1h = decode(m, kv, 1, 0, reps, logits);
    g_host_logits = false;
    m->opt.tune.no_graphs = true;
    double t1e = decode(m, kv, 1, 0, reps, logits);
    m->opt.tune.no_graphs = false;
    double gerr = graph_vs_eager(m, logits, logits + cfg.vocab_size);
    double e1 = touched_experts(m, kv, 1, logits), e8 = touched_experts(m, kv, 8, logits);
    double t8 = decode(m, kv, 8, 0, reps, logits);
    fill_cache(m, kv, depth);
    double t4k = decode(m, kv, 1, depth, reps, logits);
    double t84k = decode(m, kv, 8, depth, reps, logits); /* sequences 1..7: zeroed caches, read all the same */
    /* prefills: 512 and 4096 tokens, in both gemm modes where the weights are FP8 */
    ds_gemm_impl gm[2] = {m->opt.gemm, m->opt.gemm == DS_GEMM_FP8 ? DS_GEMM_BF16 : DS_GEMM_FP8};
    double tp[2][2] = {{0}};
    for (int g = 0; g < (fp8w ? 2 : 1); g++) {
        m->opt.gemm = gm[g];
        tp[g][0] = prefill(m, kv, np, logits);
        tp[g][1] = prefill(m, kv, npl, logits);
        if (tp[g][0] < 0 || tp[g][1] < 0) goto fail;
    }
    m->opt.gemm = gm[0];
    /* where a prefill's time goes: 512 tokens, and 4096 on the FP8 GEMM path */
    if (op_times(m, kv, np, logits)) goto fail;
    if (fp8w) {
        m->opt.gemm = DS_GEMM_FP8;
        if (op_times(m, kv, npl, logits)) goto fail;
        m->opt.gemm = gm[0];
    }
    if (cuda_backend_status() || t1 < 0 || t1h < 0 || t1e < 0 || t8 < 0 || t4k < 0 || t84k < 0 || gerr < 0 || e1 < 0 || e8 < 0)
        goto fail;
    g_count_elems = true; /* two FLOPs per active weight and token, whatever the format */
    double flop_tok = 2.0 * token_bytes(m, cfg.n_activated_experts);
    g_count_elems = false;
    double b1 = token_bytes(m, e1), roof = b1 / (bw * 1e9);
    double b8 = token_bytes(m, e8), b4k = b1 + kv_bytes(&cfg, 1, depth), b84k = b8 + kv_bytes(&cfg, 8, depth);
    printf("bytes a decode step reads: batch 1 %.3f GB (%.1f experts a layer); batch 8 %.3f GB (%.1f of %d experts "
           "a layer from the routing, %.1f for uniform routing); KV cache at depth %d: %.3f GB a sequence\n",
           b1 / 1e9, e1, b8 / 1e9, e8, cfg.n_routed_experts, distinct_experts(&cfg, 8), depth,
           kv_bytes(&cfg, 1, depth) / 1e9);
    printf("%-22s %10s %10s %s\n", "test", "ms", "tok/s", "vs limit");
    printf("%-22s %10.3f %10.1f %5.1f%% of roofline (%.3f ms; %.0f GB/s)\n", "decode batch 1", t1 * 1e3, 1 / t1,
           100 * roof / t1, roof * 1e3, b1 / t1 / 1e9);
    printf("%-22s %10.3f %10.1f %5.1f%% of roofline (every step's logits downloaded: model_forward)\n",
           "decode b1 host logits", t1h * 1e3, 1 / t1h, 100 * roof / t1h);
    printf("%-22s %10.3f %10.1f %5.1f%% of roofline; graph vs eager logits: max diff %.2e of max |logit|\n",
           "decode batch 1 eager", t1e * 1e3, 1 / t1e, 100 * roof / t1e, gerr);
    printf("%-22s %10.3f %10.1f %5.1f%% of roofline (%.3f ms); %.2fx batch 1's tok/s\n", "decode batch 8", t8 * 1e3,
           8 / t8, 100 * b8 / (bw * 1e9) / t8, b8 / (bw * 1e9) * 1e3, (8 / t8) / (1 / t1));
    printf("%-22s %10.3f %10.1f %5.1f%% of roofline (%.3f ms, weights and KV cache)\n", "decode depth 4096",
           t4k * 1e3, 1 / t4k, 100 * b4k / (bw * 1e9) / t4k, b4k / (bw * 1e9) * 1e3);
    printf("%-22s %10.3f %10.1f %5.1f%% of roofline (%.3f ms, weights and KV cache)\n", "decode b8 depth 4096",
           t84k * 1e3, 8 / t84k, 100 * b84k / (bw * 1e9) / t84k, b84k / (bw * 1e9) * 1e3);
    for (int g = 0; g < (fp8w ? 2 : 1); g++) {
        bool q = gm[g] == DS_GEMM_FP8 && fp8w;
        char l[2][40];
        snprintf(l[0], sizeof l[0], "prefill 512%s", fp8w ? (q ? " gemm fp8" : " gemm bf16") : "");
        snprintf(l[1], sizeof l[1], "prefill 4096%s", fp8w ? (q ? " gemm fp8" : " gemm bf16") : "");
        for (int j = 0; j < 2; j++)
            prefill_row(l[j], j ? npl : np, tp[g][j], flop_tok, q ? tc8 : tc, q ? "fp8" : "bf16");
    }
    printf("{\"copy_gbs\": %.1f, \"tc_tflops\": %.1f, \"fp8_tflops\": %.1f, "
           "\"bytes_per_token\": %.0f, \"decode1_ms\": %.4f, \"decode1_eager_ms\": %.4f, \"decode8_ms\": %.4f, "
           "\"decode4k_ms\": %.4f, \"decode8_4k_ms\": %.4f, \"prefill512_ms\": %.3f, \"prefill4096_ms\": %.3f, "
           "\"decode1_host_logits_ms\": %.4f}\n",
           bw, tc, tc8, b1, t1 * 1e3, t1e * 1e3, t8 * 1e3, t4k * 1e3, t84k * 1e3, tp[0][0] * 1e3,
           tp[0][1] * 1e3, t1h * 1e3);
    if (getenv("BENCH_AB") && ab_variants(m, getenv("BENCH_AB"), depth, ctx, reps, logits, roof, b8 / (bw * 1e9)))
        goto fail;
    kvcache_free(kv);
    model_free(m);
    cuda_forget_weights();
    return 0;
fail:
    fprintf(stderr, "bench_cuda_model: %s\n", ds_last_error());
    return 1;
}
