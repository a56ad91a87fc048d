/* test_variants.c - the model on `dsv3 synth` checkpoints of every shape the
 * reference's configs use, scaled down: q_lora_rank 0 (16B), softmax gates
 * with group-limited routing and no bias (236B), sigmoid + bias + groups
 * (671B), ue8m0 scales (V3.1); BF16 and FP8 weights; dimensions that leave
 * partial 128-blocks; YaRN on and off.
 *
 * With no reference logits for these shapes, each case checks independent
 * formulations against each other: absorb vs naive attention (different
 * algebra), the fast kernels vs the scalar reference, one prefill vs one
 * token at a time, and a batch of different-length sequences in one pass vs
 * each sequence alone. */
#include <string.h>

#include "model/generate.h"
#include "model/model.h"
#include "backend/cpu/cpu_backend.h"
#include "test.h"

typedef struct {
    const char *name, *json, *dtype;
} variant;

static const variant k_variants[] = {
    {"16B-like: q_lora 0, softmax, no groups, bf16, partial blocks",
     "{\"vocab_size\":500,\"dim\":200,\"inter_dim\":300,\"moe_inter_dim\":72,\"n_layers\":3,\"n_dense_layers\":1,"
     "\"n_heads\":4,\"n_routed_experts\":8,\"n_shared_experts\":2,\"n_activated_experts\":3,\"route_scale\":1.0,"
     "\"q_lora_rank\":0,\"kv_lora_rank\":96,\"qk_nope_head_dim\":24,\"qk_rope_head_dim\":16,\"v_head_dim\":20,"
     "\"mscale\":0.707,\"max_seq_len\":64,\"original_seq_len\":32}", "bf16"},
    {"236B-like: softmax, 4 groups / 2 chosen, no bias, fp8",
     "{\"vocab_size\":384,\"dim\":256,\"inter_dim\":384,\"moe_inter_dim\":136,\"n_layers\":3,\"n_dense_layers\":1,"
     "\"n_heads\":4,\"n_routed_experts\":16,\"n_shared_experts\":2,\"n_activated_experts\":4,\"n_expert_groups\":4,"
     "\"n_limited_groups\":2,\"route_scale\":16.0,\"q_lora_rank\":160,\"kv_lora_rank\":128,\"qk_nope_head_dim\":32,"
     "\"qk_rope_head_dim\":16,\"v_head_dim\":32,\"max_seq_len\":48}", "fp8"},
    {"671B-like: sigmoid, bias, groups, fp8, YaRN",
     "{\"vocab_size\":512,\"dim\":256,\"inter_dim\":512,\"moe_inter_dim\":128,\"n_layers\":4,\"n_dense_layers\":2,"
     "\"n_heads\":4,\"n_routed_experts\":16,\"n_shared_experts\":1,\"n_activated_experts\":4,\"n_expert_groups\":8,"
     "\"n_limited_groups\":4,\"route_scale\":2.5,\"score_func\":\"sigmoid\",\"q_lora_rank\":192,\"kv_lora_rank\":128,"
     "\"qk_nope_head_dim\":32,\"qk_rope_head_dim\":32,\"v_head_dim\":32,\"dtype\":\"fp8\",\"max_seq_len\":64,"
     "\"original_seq_len\":16}", "fp8"},
    {"V3.1-like: ue8m0, sigmoid, bias, groups, bf16 weights",
     "{\"vocab_size\":320,\"dim\":192,\"inter_dim\":256,\"moe_inter_dim\":64,\"n_layers\":2,\"n_dense_layers\":1,"
     "\"n_heads\":2,\"n_routed_experts\":8,\"n_shared_experts\":1,\"n_activated_experts\":2,\"n_expert_groups\":4,"
     "\"n_limited_groups\":2,\"route_scale\":2.5,\"score_func\":\"sigmoid\",\"q_lora_rank\":96,\"kv_lora_rank\":64,"
     "\"qk_nope_head_dim\":16,\"qk_rope_head_dim\":16,\"v_head_dim\":16,\"dtype\":\"fp8\",\"scale_fmt\":\"ue8m0\","
     "\"max_seq_len\":40}", "bf16"},
};

#define T 19 /* tokens per sequence */

static float max_rel(const float *a, const float *b, size_t n)
{
    float mx = 0, err = 0;
    for (size_t i = 0; i < n; i++) {
        mx = fmaxf(mx, fabsf(b[i]));
        err = fmaxf(err, fabsf(a[i] - b[i]));
    }
    return err / mx;
}

/* All-position logits of seq for a single sequence, prefill or stepwise. */
static void run_one(ds_model *m, const int32_t *tok, int n, bool stepwise, float *out)
{
    ds_kvcache *kv;
    CHECK_OK(kvcache_new(&kv, m, 1, n));
    int seq[T] = {0}, pos[T];
    bool want[T];
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        want[i] = true;
    }
    size_t V = (size_t)m->cfg.vocab_size;
    if (stepwise)
        for (int i = 0; i < n; i++) CHECK_OK(model_forward(m, kv, 1, tok + i, seq, pos + i, want, out + i * V));
    else
        CHECK_OK(model_forward(m, kv, n, tok, seq, pos, want, out));
    kvcache_free(kv);
}

static void check_close(const char *what, const char *name, const float *a, const float *b, size_t n)
{
    float e = max_rel(a, b, n);
    CHECK_MSG(e <= 1e-3f, "%s: %s differs by %.3g of max |logit|", name, what, e);
}

/* The fast CPU backend whose scratch allocations above g_scratch_limit bytes (0: none)
 * fail, as a GPU's do when its memory runs out; g_scratch_max: the largest asked for. */
static ds_ops g_tight;
static size_t g_scratch_limit, g_scratch_max;

static void *tight_alloc_scratch(size_t bytes)
{
    const ds_ops *c = cpu_backend(true);
    if (bytes > g_scratch_max) g_scratch_max = bytes;
    if (g_scratch_limit && bytes > g_scratch_limit) return NULL;
    return c->alloc_scratch ? c->alloc_scratch(bytes) : c->alloc(bytes);
}

/* generate's prefill of n tokens in passes of `pass` (the backend's choice); the last
 * token's logits into out (V floats); *chunk, *shortened: what gen_prefill made of it. */
static ds_status prefill_with(ds_model *m, const int32_t *tok, int n, int pass, float *out, int *chunk, int *shortened)
{
    ds_gen *g;
    g_tight.prefill_tokens = pass;
    ds_status s = gen_new(&g, m, 1, n);
    if (s) return s;
    s = gen_prefill(g, 0, tok, n);
    if (!s) memcpy(out, g->logits, sizeof(float) * (size_t)g->vocab);
    *chunk = g->prefill_chunk;
    *shortened = g->prefill_shortened;
    gen_free(g);
    return s;
}

/* A prefill pass that runs out of memory is run again in shorter passes, with the
 * same logits as passes of that length from the start; when even one token does not
 * fit, the error comes back. */
static void check_prefill_retry(const char *name, const char *hf, const ds_config *cfg, const int32_t *tok, int n)
{
    g_tight = *cpu_backend(true);
    g_tight.alloc_scratch = tight_alloc_scratch;
    ds_model *m;
    ds_model_opts o = {.attn = DS_ATTN_ABSORB, .ops = &g_tight};
    CHECK_OK(model_load(&m, hf, cfg, &o));
    if (t_failures) return;
    size_t V = (size_t)cfg->vocab_size;
    float *ref = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V);
    int chunk, shortened;
    g_scratch_limit = g_scratch_max = 0;
    CHECK_OK(prefill_with(m, tok, n, 4, ref, &chunk, &shortened));
    size_t max4 = g_scratch_max; /* passes of 16 ask for more than passes of 4 did */
    g_scratch_limit = max4;
    CHECK_OK(prefill_with(m, tok, n, 16, got, &chunk, &shortened));
    CHECK_MSG(chunk == 4 && shortened == 2, "%s: out of memory: passes of %d after %d retries, want 4 after 2", name,
              chunk, shortened);
    CHECK_MSG(!memcmp(got, ref, sizeof(float) * V), "%s: logits after shortened passes differ from passes of 4", name);
    g_scratch_limit = 1; /* not even one token */
    ds_status s = prefill_with(m, tok, n, 16, got, &chunk, &shortened);
    CHECK_MSG(s == DS_ERR_NOMEM && chunk == 1, "%s: no memory at all: status %d, passes of %d", name, (int)s, chunk);
    g_scratch_limit = 0;
    model_free(m);
    free(ref);
    free(got);
}

static void check_variant(const variant *v)
{
    const char *dir = t_tmpdir("variant");
    char cfgpath[4200];
    snprintf(cfgpath, sizeof cfgpath, "%s/config.ref.json", dir);
    FILE *f = fopen(cfgpath, "w");
    fputs(v->json, f);
    fclose(f);
    int rc = t_system("%s synth --config %s --out %s/hf --dtype %s --seed 11 >/dev/null 2>&1", t_bin(), cfgpath, dir,
                      v->dtype);
    CHECK_MSG(rc == 0, "%s: synth failed (%d)", v->name, rc);
    ds_config cfg;
    CHECK_OK(config_parse(&cfg, v->json, v->name));
    if (rc || t_failures) return;
    char hf[4200];
    snprintf(hf, sizeof hf, "%s/hf", dir);
    size_t V = (size_t)cfg.vocab_size;
    int32_t tok[T];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 7919 + 13) % cfg.vocab_size);

    float *ref = malloc(sizeof(float) * T * V), *got = malloc(sizeof(float) * T * V);
    ds_model *m;
    ds_model_opts o = {.attn = DS_ATTN_ABSORB, .ops = cpu_backend(false)};
    CHECK_OK(model_load(&m, hf, &cfg, &o));
    if (t_failures) return;
    run_one(m, tok, T, false, ref); /* scalar reference, absorb, prefill */
    run_one(m, tok, T, true, got);
    check_close("stepwise vs prefill", v->name, got, ref, T * V);
    model_free(m);

    o.ops = cpu_backend(true);
    CHECK_OK(model_load(&m, hf, &cfg, &o));
    run_one(m, tok, T, false, got);
    check_close("fast kernels vs scalar reference", v->name, got, ref, T * V);

    /* a batch of three sequences of lengths T, 5 and 11 in one pass (the short
     * ones reuse a prefix of tok with an offset), logits at every position */
    int lens[3] = {T, 5, 11}, total = T + 5 + 11;
    int32_t bt[T + 5 + 11];
    int bs[T + 5 + 11], bp[T + 5 + 11];
    bool bw[T + 5 + 11];
    for (int s = 0, k = 0; s < 3; s++)
        for (int i = 0; i < lens[s]; i++, k++) {
            bt[k] = tok[(i + 3 * s) % T];
            bs[k] = s;
            bp[k] = i;
            bw[k] = true;
        }
    float *bl = malloc(sizeof(float) * (size_t)total * V), *one = malloc(sizeof(float) * T * V);
    ds_kvcache *kv;
    CHECK_OK(kvcache_new(&kv, m, 3, T));
    CHECK_OK(model_forward(m, kv, total, bt, bs, bp, bw, bl));
    kvcache_free(kv);
    for (int s = 0, k = 0; s < 3; k += lens[s], s++) {
        run_one(m, bt + k, lens[s], false, one);
        check_close("batched sequence vs alone", v->name, bl + (size_t)k * V, one, (size_t)lens[s] * V);
    }
    /* prefill of 12 then decode of the rest equals all-prefill */
    CHECK_OK(kvcache_new(&kv, m, 1, T));
    int seq[T] = {0}, pos[T];
    bool want[T];
    for (int i = 0; i < T; i++) {
        pos[i] = i;
        want[i] = true;
    }
    CHECK_OK(model_forward(m, kv, 12, tok, seq, pos, want, one));
    for (int i = 12; i < T; i++) CHECK_OK(model_forward(m, kv, 1, tok + i, seq, pos + i, want, one + i * V));
    check_close("prefill 12 + decode vs prefill", v->name, one, ref, T * V);
    kvcache_free(kv);
    model_free(m);

    if (v == k_variants) check_prefill_retry(v->name, hf, &cfg, tok, T);

    o.attn = DS_ATTN_NAIVE;
    CHECK_OK(model_load(&m, hf, &cfg, &o));
    run_one(m, tok, T, true, got);
    check_close("naive vs absorb attention", v->name, got, ref, T * V);
    model_free(m);

    if (!strcmp(v->dtype, "fp8")) {
        /* FP8 GEMM path: quantised activations, so only loosely close */
        o.attn = DS_ATTN_ABSORB;
        o.gemm = DS_GEMM_FP8;
        CHECK_OK(model_load(&m, hf, &cfg, &o));
        run_one(m, tok, T, false, got);
        double ab = 0, aa = 0, bb = 0;
        for (size_t i = 0; i < T * V; i++) {
            ab += (double)got[i] * ref[i];
            aa += (double)got[i] * got[i];
            bb += (double)ref[i] * ref[i];
        }
        CHECK_MSG(ab / sqrt(aa * bb) > 0.9, "%s: fp8 GEMM path cosine %.4f", v->name, ab / sqrt(aa * bb));
        model_free(m);
    }
    printf("ok: %s\n", v->name);
    free(ref);
    free(got);
    free(bl);
    free(one);
    t_system("rm -rf %s", dir);
}

/* --poison-scratch: every scratch buffer filled with NaN bytes (cpu_tuning). */
int main(int argc, char **argv)
{
    cpu_tuning ct = cpu_tuning_default();
    ct.poison_scratch = argc > 1 && !strcmp(argv[1], "--poison-scratch");
    cpu_backend_tuned(&ct); /* poisoning is process-wide: cpu_backend() tables too */
    for (size_t i = 0; i < sizeof k_variants / sizeof *k_variants; i++) check_variant(&k_variants[i]);
    return t_done("variants");
}
