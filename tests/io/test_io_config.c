/* test_io_config.c - config loading: the reference configs and the golden HF
 * config load, the HF names map to the reference's values, bad keys, types and
 * values are errors that name the key, and synth's HF config round-trips. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "io/config.h"
#include "io/synth.h"
#include "test.h"

static const char *configs_dir(void)
{
    static char buf[4096];
    const char *t = getenv("DSV3_TESTS");
    snprintf(buf, sizeof buf, "%s/../configs", t ? t : "tests");
    return buf;
}

/* Model fields equal (max_batch_size is a runtime setting, not in HF configs). */
static int same_model(const ds_config *a, const ds_config *b)
{
    ds_config x = *a, y = *b;
    x.max_batch_size = y.max_batch_size = 0;
    return x.dtype == y.dtype && x.scale_ue8m0 == y.scale_ue8m0 && x.vocab_size == y.vocab_size &&
           x.dim == y.dim && x.inter_dim == y.inter_dim && x.moe_inter_dim == y.moe_inter_dim &&
           x.n_layers == y.n_layers && x.n_dense_layers == y.n_dense_layers && x.n_heads == y.n_heads &&
           x.n_routed_experts == y.n_routed_experts && x.n_shared_experts == y.n_shared_experts &&
           x.n_activated_experts == y.n_activated_experts && x.n_expert_groups == y.n_expert_groups &&
           x.n_limited_groups == y.n_limited_groups && x.score_func == y.score_func &&
           x.route_scale == y.route_scale && x.q_lora_rank == y.q_lora_rank && x.kv_lora_rank == y.kv_lora_rank &&
           x.qk_nope_head_dim == y.qk_nope_head_dim && x.qk_rope_head_dim == y.qk_rope_head_dim &&
           x.v_head_dim == y.v_head_dim && x.max_seq_len == y.max_seq_len &&
           x.original_seq_len == y.original_seq_len && x.rope_theta == y.rope_theta &&
           x.rope_factor == y.rope_factor && x.beta_fast == y.beta_fast && x.beta_slow == y.beta_slow &&
           x.mscale == y.mscale;
}

static void test_shipped(void)
{
    DIR *d = opendir(configs_dir());
    CHECK_MSG(d, "%s", configs_dir());
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strstr(e->d_name, ".json")) continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", configs_dir(), e->d_name);
        ds_config c;
        CHECK_OK(config_load(&c, p));
        /* synth's HF form of it maps back to the same values */
        char *hf = synth_hf_config(&c);
        ds_config r;
        CHECK_OK(config_parse(&r, hf, e->d_name));
        if (c.original_seq_len >= c.max_seq_len) r.original_seq_len = c.original_seq_len; /* YaRN off either way */
        CHECK_MSG(same_model(&c, &r), "%s: HF round trip differs", e->d_name);
        free(hf);
        n++;
    }
    if (d) closedir(d);
    CHECK_MSG(n >= 5, "found %d configs", n);
}

static void test_hf_tiny(void)
{
    ds_config hf, ref;
    CHECK_OK(config_load(&hf, t_golden("tiny_hf/config.json")));
    CHECK_OK(config_load(&ref, t_golden("config_tiny.json")));
    CHECK(same_model(&hf, &ref));
    CHECK(hf.dtype == DS_DTYPE_FP8 && hf.score_func == DS_SCORE_SIGMOID && hf.q_lora_rank == 128 &&
          hf.n_expert_groups == 4 && hf.n_limited_groups == 2 && hf.route_scale == 2.5);
}

/* The parse fails with FORMAT and the message names `key`. */
static void bad(const char *json, const char *key)
{
    ds_config c;
    ds_status s = config_parse(&c, json, "cfg.json");
    CHECK_MSG(s == DS_ERR_FORMAT, "%s: status %d", json, s);
    CHECK_MSG(strstr(ds_last_error(), key) && strstr(ds_last_error(), "cfg.json"), "%s: message '%s' lacks %s",
              json, ds_last_error(), key);
}

static void test_errors(void)
{
    bad("{\"dimm\": 2048}", "dimm");
    bad("{\"dim\": \"2048\"}", "dim");
    bad("{\"dim\": 2048.5}", "dim");
    bad("{\"dim\": 0}", "dim");
    bad("{\"dim\": -5}", "dim");
    bad("{\"dim\": 1e30}", "dim");
    bad("{\"n_layers\": null}", "n_layers");
    bad("{\"route_scale\": \"x\"}", "route_scale");
    bad("{\"dtype\": \"fp16\"}", "dtype");
    bad("{\"score_func\": 1}", "score_func");
    bad("{\"scale_fmt\": \"e8\"}", "scale_fmt");
    bad("{\"n_activated_experts\": 65}", "n_activated_experts");
    bad("{\"n_expert_groups\": 5}", "n_expert_groups");
    bad("{\"n_limited_groups\": 2}", "n_limited_groups");
    bad("{\"n_dense_layers\": 28}", "n_dense_layers");
    bad("{\"qk_rope_head_dim\": 63}", "qk_rope_head_dim");
    bad("{\"rope_theta\": 0.5}", "rope_theta");
    bad("{\"q_lora_rank\": -1}", "q_lora_rank");
    bad("{\"dim\": 1, \"dim\": 2}", "cfg.json"); /* duplicate key */
    bad("[1, 2]", "cfg.json");
    bad("{\"dim\": ", "cfg.json");
    /* HF form: wrong types name the HF key */
    bad("{\"model_type\": \"deepseek_v3\", \"hidden_size\": \"x\"}", "hidden_size");
    bad("{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 0}", "n_layers");
    bad("{\"model_type\": \"deepseek_v3\", \"scoring_func\": \"relu\"}", "score_func");
    /* every field is range-checked; the message names the field, the value and the range */
    static const char *hostile[][2] = {
        {"{\"n_layers\": 2147483647}", "\"n_layers\" is 2147483647 but must be in [1, 1024]"},
        {"{\"vocab_size\": 2147483647}", "vocab_size"}, {"{\"dim\": 2147483647}", "dim"},
        {"{\"inter_dim\": 1073741824}", "inter_dim"}, {"{\"moe_inter_dim\": 2000000}", "moe_inter_dim"},
        {"{\"n_heads\": 1048576}", "n_heads"}, {"{\"max_seq_len\": 2147483647}", "max_seq_len"},
        {"{\"max_batch_size\": 2147483647}", "max_batch_size"}, {"{\"n_routed_experts\": 1000000}", "n_routed_experts"},
        {"{\"n_shared_experts\": 2000000}", "n_shared_experts"}, {"{\"kv_lora_rank\": 1000000}", "kv_lora_rank"},
        {"{\"q_lora_rank\": 1000000}", "q_lora_rank"}, {"{\"qk_nope_head_dim\": 100000}", "qk_nope_head_dim"},
        {"{\"v_head_dim\": -1}", "v_head_dim"}, {"{\"original_seq_len\": 0}", "original_seq_len"},
        {"{\"beta_fast\": 2147483647}", "beta_fast"},
        {"{\"mscale\": 1e308}", "\"mscale\" is 1e+308 but must be in [0, 100]"},
        {"{\"route_scale\": 1e308}", "route_scale"}, {"{\"rope_factor\": 1e308}", "rope_factor"},
        {"{\"rope_theta\": 1e300}", "rope_theta"}, {"{\"mscale\": -1}", "mscale"},
        {"{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 2147483647}", "n_layers"},
        {"{\"n_layers\": 1024, \"max_batch_size\": 65536, \"max_seq_len\": 16777216, \"kv_lora_rank\": 65536}",
         "KV cache"},
        {"{\"model_type\": \"deepseek_v3\", \"rope_scaling\": {\"mscale\": 1e308}}", "mscale"},
    };
    for (size_t i = 0; i < sizeof hostile / sizeof *hostile; i++) bad(hostile[i][0], hostile[i][1]);
    ds_config c;
    CHECK(config_load(&c, "/nonexistent/config.json") == DS_ERR_IO);
    CHECK(strstr(ds_last_error(), "/nonexistent/config.json"));
}

static void test_parallel(void)
{
    ds_config c;
    config_defaults(&c);
    CHECK_OK(config_check_parallel(&c, 8));
    CHECK(config_check_parallel(&c, 3) == DS_ERR_ARG && strstr(ds_last_error(), "3"));
    CHECK(config_check_parallel(&c, 0) == DS_ERR_ARG);
}

int main(void)
{
    test_shipped();
    test_hf_tiny();
    test_errors();
    test_parallel();
    return t_done("io_config");
}
