/* test_io_tools.c - the checkpoint tools end to end through the CLI:
 * convert's error cases exit non-zero and leave nothing behind; synth -> info
 * -> convert works for the tiny (V3) and a 16B-like (no q LoRA, softmax) shape
 * in FP8 and BF16; synth's tensors are those of an HF checkpoint, its values
 * have the intended statistics, and its bytes do not depend on thread count. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "base/numeric.h"
#include "io/ckpt.h"
#include "io/config.h"
#include "test.h"

/* A 16B-like shape (q_lora_rank 0, softmax, one expert group), small enough
 * for a unit test; every FP8 scale dimension that convert shards is even. */
static const char *k_cfg16 =
    "{\"vocab_size\": 1024, \"dim\": 256, \"inter_dim\": 512, \"moe_inter_dim\": 128, \"n_layers\": 3,"
    " \"n_dense_layers\": 1, \"n_heads\": 8, \"n_routed_experts\": 8, \"n_shared_experts\": 2,"
    " \"n_activated_experts\": 2, \"q_lora_rank\": 0, \"kv_lora_rank\": 128, \"qk_nope_head_dim\": 32,"
    " \"qk_rope_head_dim\": 32, \"v_head_dim\": 32, \"score_func\": \"softmax\", \"mscale\": 0.707}";

static char g_tmp[4096];

static int is_empty_dir(const char *d)
{
    return t_system("[ -d '%s' ] && [ -z \"$(ls -A '%s')\" ]", d, d) == 0;
}

static int exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void test_convert_errors(void)
{
    const char *bin = t_bin(), *hf = t_golden("tiny_hf");
    char out[4200], log[4200];
    snprintf(out, sizeof out, "%s/conv-out", g_tmp);
    snprintf(log, sizeof log, "%s/log.txt", g_tmp);
    struct { const char *args, *msg; } cases[] = {
        {"--n-experts 16 --model-parallel 3", "divisible"},              /* experts % mp */
        {"--n-experts 16 --model-parallel 4", "divisible"},              /* a scale dim % mp */
        {"--n-experts 8 --model-parallel 1", "n_routed_experts"},        /* vs config.json */
        {"--n-experts 16 --model-parallel 0", "model-parallel"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = t_system("'%s' convert --hf-ckpt-path '%s' --save-path '%s' %s 2>'%s'", bin, hf, out, cases[i].args, log);
        CHECK_MSG(rc >= 1 && rc < 128, "convert %s: exit %d", cases[i].args, rc);
        CHECK_MSG(!exists(out), "convert %s left %s behind", cases[i].args, out);
        CHECK_MSG(t_system("grep -q '%s' '%s'", cases[i].msg, log) == 0, "convert %s: message lacks %s",
                  cases[i].args, cases[i].msg);
    }
    /* missing input directory */
    int rc = t_system("'%s' convert --hf-ckpt-path '%s/nope' --save-path '%s' --n-experts 16 --model-parallel 1 2>/dev/null",
                      bin, g_tmp, out);
    CHECK(rc >= 1 && rc < 128 && !exists(out));
    /* an unknown parameter key names the tensor */
    char in[4200], p[4300];
    snprintf(in, sizeof in, "%s/unknown-key", g_tmp);
    t_system("mkdir -p '%s'", in);
    snprintf(p, sizeof p, "%s/model.safetensors", in);
    st_writer *w;
    int64_t shape[1] = {4};
    CHECK_OK(st_writer_open(&w, p));
    CHECK_OK(st_writer_add(w, "model.norm.weight", ST_U8, 1, shape));
    CHECK_OK(st_writer_add(w, "model.layers.0.self_attn.foo_proj.weight", ST_U8, 1, shape));
    CHECK_OK(st_writer_begin(w));
    CHECK_OK(st_writer_write(w, "abcdefgh", 8));
    CHECK_OK(st_writer_finish(w));
    rc = t_system("'%s' convert --hf-ckpt-path '%s' --save-path '%s' --n-experts 1 --model-parallel 1 2>'%s'", bin, in,
                  out, log);
    CHECK(rc >= 1 && rc < 128 && !exists(out));
    CHECK(t_system("grep -q 'foo_proj' '%s'", log) == 0);
    /* a failure while finishing (rank 1's final name is a directory): rank 0's
     * finished file and all temporaries are removed, the pre-existing dir kept */
    t_system("mkdir -p '%s/model1-mp2.safetensors'", out);
    rc = t_system("'%s' convert --hf-ckpt-path '%s' --save-path '%s' --n-experts 16 --model-parallel 2 2>/dev/null", bin,
                  hf, out);
    CHECK(rc >= 1 && rc < 128);
    CHECK_MSG(t_system("[ \"$(ls -A '%s')\" = model1-mp2.safetensors ]", out) == 0, "rollback left files in %s", out);
    t_system("rmdir '%s/model1-mp2.safetensors'", out);
    CHECK(is_empty_dir(out));
    t_system("rm -rf '%s'", out);
}

/* Sample mean and std of a weight as float32 (FP8 dequantised with its scale). */
static void stats(const ds_ckpt *c, const char *name, double *mean, double *std)
{
    const st_tensor *t = ckpt_find(c, name);
    *mean = *std = NAN;
    CHECK_MSG(t, "no %s", name);
    if (!t) return;
    char sn[256];
    snprintf(sn, sizeof sn, "%s_scale_inv", name);
    const st_tensor *s = t->dtype == ST_F8_E4M3 ? ckpt_find(c, sn) : NULL;
    double sum = 0, sq = 0;
    int64_t cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    for (uint64_t i = 0; i < t->numel; i++) {
        double v;
        if (t->dtype == ST_BF16) v = bf16_to_f32(((const uint16_t *)t->data)[i]);
        else if (t->dtype == ST_F32) v = ((const float *)t->data)[i];
        else v = fp8_e4m3_to_f32(((const uint8_t *)t->data)[i]) *
                 ((const float *)s->data)[(int64_t)(i / (uint64_t)cols) / 128 * ((cols + 127) / 128) +
                                          (int64_t)(i % (uint64_t)cols) / 128];
        sum += v;
        sq += v * v;
    }
    *mean = sum / (double)t->numel;
    *std = sqrt(sq / (double)t->numel - *mean * *mean);
}

/* Expected tensor count of an HF checkpoint for c, computed independently. */
static size_t expected_tensors(const ds_config *c, int fp8)
{
    int lin = fp8 ? 2 : 1;
    size_t attn = (size_t)(c->q_lora_rank ? 2 * lin + 1 : lin) + 2 * (size_t)lin + 1 + (size_t)lin;
    size_t n = 3; /* embed, norm, head */
    for (int L = 0; L < c->n_layers; L++) {
        n += 2 + attn;
        if (L < c->n_dense_layers) n += 3 * (size_t)lin;
        else n += 1 + (c->score_func == DS_SCORE_SIGMOID) + 3 * (size_t)lin * (size_t)(c->n_routed_experts + (c->n_shared_experts > 0));
    }
    return n;
}

static void synth_case(const char *cfg_path, const char *dtype, int n_experts)
{
    const char *bin = t_bin();
    char hf[4200], conv[4200];
    snprintf(hf, sizeof hf, "%s/synth-%s", g_tmp, dtype);
    snprintf(conv, sizeof conv, "%s/conv-%s", g_tmp, dtype);
    int rc = t_system("'%s' synth --config '%s' --out '%s' --dtype %s --seed 7 --shard-size-mb 2", bin, cfg_path, hf, dtype);
    CHECK_MSG(rc == 0, "synth %s %s: exit %d", cfg_path, dtype, rc);
    CHECK_MSG(t_system("'%s' info '%s' --summary >/dev/null", bin, hf) == 0, "info %s", hf);
    ds_config c;
    CHECK_OK(config_load(&c, cfg_path));
    ds_ckpt *ck = NULL;
    CHECK_OK(ckpt_open_dir(&ck, hf));
    if (ck) {
        int fp8 = !strcmp(dtype, "fp8");
        CHECK_MSG(ck->n_tensors == expected_tensors(&c, fp8), "%s %s: %zu tensors, expected %zu", cfg_path, dtype,
                  ck->n_tensors, expected_tensors(&c, fp8));
        CHECK(ck->n_files >= 2); /* --shard-size-mb 2 splits even the tiny model */
        int qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
        const st_tensor *t = ckpt_find(ck, "model.embed_tokens.weight");
        CHECK(t && t->dtype == ST_BF16 && t->shape[0] == c.vocab_size && t->shape[1] == c.dim);
        t = ckpt_find(ck, c.q_lora_rank ? "model.layers.0.self_attn.q_b_proj.weight" : "model.layers.0.self_attn.q_proj.weight");
        CHECK(t && t->dtype == (fp8 ? ST_F8_E4M3 : ST_BF16) && t->shape[0] == c.n_heads * qk);
        t = ckpt_find(ck, "model.layers.1.self_attn.kv_a_proj_with_mqa.weight_scale_inv");
        CHECK(fp8 ? t && t->dtype == ST_F32 && t->shape[0] == (c.kv_lora_rank + c.qk_rope_head_dim + 127) / 128 : !t);
        t = ckpt_find(ck, "model.layers.1.mlp.shared_experts.down_proj.weight");
        CHECK(t && t->shape[1] == c.n_shared_experts * c.moe_inter_dim);
        t = ckpt_find(ck, "model.layers.1.mlp.gate.e_score_correction_bias");
        CHECK(c.score_func == DS_SCORE_SIGMOID ? t && t->dtype == ST_F32 : !t);
        t = ckpt_find(ck, "model.layers.1.mlp.gate.weight");
        CHECK(t && t->dtype == ST_BF16 && t->shape[0] == c.n_routed_experts);
        CHECK(!ckpt_find(ck, "model.layers.0.mlp.gate.weight")); /* layer 0 is dense */
        /* statistics: weights std ~ 1/sqrt(fan_in) (so activations stay O(1)), norms ~ 1 */
        double m, s;
        stats(ck, "model.layers.1.self_attn.o_proj.weight", &m, &s);
        double want = 1 / sqrt((double)(c.n_heads * c.v_head_dim));
        CHECK_MSG(fabs(m) < 0.1 * want && fabs(s / want - 1) < (fp8 ? 0.35 : 0.05), "o_proj mean %g std %g want %g", m, s, want);
        stats(ck, "model.layers.1.mlp.experts.0.down_proj.weight", &m, &s);
        want = 1 / sqrt((double)c.moe_inter_dim);
        CHECK_MSG(fabs(s / want - 1) < (fp8 ? 0.35 : 0.05), "expert std %g want %g", s, want);
        stats(ck, "model.norm.weight", &m, &s);
        CHECK(fabs(m - 1) < 0.01 && s < 0.05);
        /* no repeated tiles: two experts and two chunks of one tensor differ */
        const st_tensor *e0 = ckpt_find(ck, "model.layers.1.mlp.experts.0.up_proj.weight"),
                        *e1 = ckpt_find(ck, "model.layers.1.mlp.experts.1.up_proj.weight");
        CHECK(e0 && e1 && memcmp(e0->data, e1->data, 256) && memcmp(e0->data, (const char *)e0->data + e0->nbytes / 2, 256));
        ckpt_close(ck);
    }
    rc = t_system("'%s' convert --hf-ckpt-path '%s' --save-path '%s' --n-experts %d --model-parallel 2", bin, hf, conv,
                  n_experts);
    CHECK_MSG(rc == 0, "convert of synth %s %s: exit %d", cfg_path, dtype, rc);
    CHECK(t_system("'%s' info '%s/model0-mp2.safetensors' --summary >/dev/null && '%s' info '%s/model1-mp2.safetensors' "
                   "--summary >/dev/null", bin, conv, bin, conv) == 0);
    if (!strcmp(dtype, "fp8")) {
        char cast[4200];
        snprintf(cast, sizeof cast, "%s/cast", g_tmp);
        CHECK(t_system("'%s' cast-bf16 --input-fp8-hf-path '%s' --output-bf16-hf-path '%s'", bin, hf, cast) == 0);
        CHECK(t_system("'%s' info '%s' | grep -q F8_E4M3", bin, cast) != 0);
        t_system("rm -rf '%s'", cast);
    }
    t_system("rm -rf '%s' '%s'", hf, conv);
}

/* The same seed gives the same bytes with 1 or 2 threads; another seed does not. */
static void test_synth_determinism(void)
{
    const char *bin = t_bin(), *cfg = t_golden("config_tiny.json");
    CHECK(t_system("OMP_NUM_THREADS=1 '%s' synth --config '%s' --out '%s/d1' --seed 3", bin, cfg, g_tmp) == 0);
    CHECK(t_system("OMP_NUM_THREADS=2 '%s' synth --config '%s' --out '%s/d2' --seed 3", bin, cfg, g_tmp) == 0);
    CHECK(t_system("'%s' synth --config '%s' --out '%s/d3' --seed 4", bin, cfg, g_tmp) == 0);
    CHECK(t_system("diff -r '%s/d1' '%s/d2' >/dev/null", g_tmp, g_tmp) == 0);
    CHECK(t_system("cmp -s '%s/d1/model-00001-of-00001.safetensors' '%s/d3/model-00001-of-00001.safetensors'", g_tmp,
                   g_tmp) != 0);
    CHECK(t_system("'%s' synth --config '%s' --out '%s/d4' --dtype fp16 2>/dev/null", bin, cfg, g_tmp) == 2);
    CHECK(!exists("d4"));
    t_system("rm -rf '%s/d1' '%s/d2' '%s/d3'", g_tmp, g_tmp, g_tmp);
}

/* synth from the golden HF config gives the golden checkpoint's exact layout. */
static void test_synth_hf_layout(void)
{
    char out[4200];
    snprintf(out, sizeof out, "%s/synth-hf", g_tmp);
    CHECK(t_system("'%s' synth --config '%s' --out '%s'", t_bin(), t_golden("tiny_hf/config.json"), out) == 0);
    ds_ckpt *a = NULL, *b = NULL;
    CHECK_OK(ckpt_open_dir(&a, t_golden("tiny_hf")));
    CHECK_OK(ckpt_open_dir(&b, out));
    if (a && b) {
        CHECK(a->n_tensors == b->n_tensors);
        for (size_t fi = 0; fi < a->n_files; fi++)
            for (size_t ti = 0; ti < a->files[fi]->n_tensors; ti++) {
                const st_tensor *x = &a->files[fi]->tensors[ti], *y = ckpt_find(b, x->name);
                CHECK_MSG(y && y->dtype == x->dtype && y->ndim == x->ndim &&
                          !memcmp(y->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim), "synth %s", x->name);
            }
    }
    ckpt_close(a);
    ckpt_close(b);
    t_system("rm -rf '%s'", out);
}

/* An FP8 weight without its scale: an error naming it (and no output) unless
 * --allow-missing-scale, which copies it through as FP8. */
static void test_cast_missing_scale(void)
{
    char in[4200], out[4200], p[4300];
    snprintf(in, sizeof in, "%s/noscale", g_tmp);
    snprintf(out, sizeof out, "%s/noscale-out", g_tmp);
    t_system("mkdir -p '%s'", in);
    snprintf(p, sizeof p, "%s/model.safetensors", in);
    st_writer *w;
    int64_t shape[2] = {2, 4};
    CHECK_OK(st_writer_open(&w, p));
    CHECK_OK(st_writer_add(w, "model.layers.0.mlp.up_proj.weight", ST_F8_E4M3, 2, shape));
    CHECK_OK(st_writer_begin(w));
    CHECK_OK(st_writer_write(w, "\x38\x38\x38\x38\x38\x38\x38\x38", 8));
    CHECK_OK(st_writer_finish(w));
    int rc = t_system("'%s' cast-bf16 --input-fp8-hf-path '%s' --output-bf16-hf-path '%s' 2>'%s/log'", t_bin(), in,
                      out, g_tmp);
    CHECK(rc >= 1 && rc < 128 && !exists(out));
    CHECK(t_system("grep -q 'up_proj.weight' '%s/log'", g_tmp) == 0);
    rc = t_system("'%s' cast-bf16 --input-fp8-hf-path '%s' --output-bf16-hf-path '%s' --allow-missing-scale "
                  "--threads 1 2>'%s/log'", t_bin(), in, out, g_tmp);
    CHECK(rc == 0 && t_system("grep -q warning '%s/log'", g_tmp) == 0);
    CHECK(t_system("'%s' info '%s' | grep -q F8_E4M3", t_bin(), out) == 0);
    t_system("rm -rf '%s' '%s'", in, out);
}

int main(void)
{
    snprintf(g_tmp, sizeof g_tmp, "%s", t_tmpdir("tools"));
    test_convert_errors();
    synth_case(t_golden("config_tiny.json"), "fp8", 16);
    synth_case(t_golden("config_tiny.json"), "bf16", 16);
    char p[4200];
    snprintf(p, sizeof p, "%s/cfg16.json", g_tmp);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(k_cfg16, f);
        fclose(f);
    }
    synth_case(p, "fp8", 8);
    synth_case(p, "bf16", 8);
    test_synth_determinism();
    test_synth_hf_layout();
    test_cast_missing_scale();
    t_system("rm -rf '%s'", g_tmp);
    return t_done("io_tools");
}
