/* config.c - ModelArgs from reference or Hugging Face JSON, strictly validated. */
#include "config.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/file.h"

void config_defaults(ds_config *c)
{
    *c = (ds_config){
        .max_batch_size = 8, .max_seq_len = 4096 * 4, .dtype = DS_DTYPE_BF16, .scale_ue8m0 = false,
        .vocab_size = 102400, .dim = 2048, .inter_dim = 10944, .moe_inter_dim = 1408, .n_layers = 27,
        .n_dense_layers = 1, .n_heads = 16, .n_routed_experts = 64, .n_shared_experts = 2,
        .n_activated_experts = 6, .n_expert_groups = 1, .n_limited_groups = 1,
        .score_func = DS_SCORE_SOFTMAX, .route_scale = 1.0, .q_lora_rank = 0, .kv_lora_rank = 512,
        .qk_nope_head_dim = 128, .qk_rope_head_dim = 64, .v_head_dim = 128, .original_seq_len = 4096,
        .rope_theta = 10000.0, .rope_factor = 40, .beta_fast = 32, .beta_slow = 1, .mscale = 1.0,
    };
}

typedef enum { F_INT, F_FLOAT } field_kind;
typedef struct { const char *name; field_kind kind; size_t off; } field;

#define FI(n) {#n, F_INT, offsetof(ds_config, n)}
#define FF(n) {#n, F_FLOAT, offsetof(ds_config, n)}
static const field k_fields[] = {
    FI(max_batch_size), FI(max_seq_len), FI(vocab_size), FI(dim), FI(inter_dim), FI(moe_inter_dim),
    FI(n_layers), FI(n_dense_layers), FI(n_heads), FI(n_routed_experts), FI(n_shared_experts),
    FI(n_activated_experts), FI(n_expert_groups), FI(n_limited_groups), FF(route_scale),
    FI(q_lora_rank), FI(kv_lora_rank), FI(qk_nope_head_dim), FI(qk_rope_head_dim), FI(v_head_dim),
    FI(original_seq_len), FF(rope_theta), FF(rope_factor), FI(beta_fast), FI(beta_slow), FF(mscale),
};
#undef FI
#undef FF

static ds_status set_field(ds_config *c, const field *f, json_t *v, const char *label, const char *key)
{
    if (f->kind == F_INT) {
        double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : NAN;
        if (!json_is_integer(v) && !(json_is_real(v) && d == floor(d)))
            return ds_errorf(DS_ERR_FORMAT, "%s: \"%s\" must be an integer", label, key);
        if (d < -2147483647.0 || d > 2147483647.0)
            return ds_errorf(DS_ERR_FORMAT, "%s: \"%s\" = %.0f is out of range", label, key, d);
        *(int *)((char *)c + f->off) = (int)d;
    } else {
        if (!json_is_number(v)) return ds_errorf(DS_ERR_FORMAT, "%s: \"%s\" must be a number", label, key);
        *(double *)((char *)c + f->off) = json_number_value(v);
    }
    return DS_OK;
}

static ds_status set_by_name(ds_config *c, const char *name, json_t *v, const char *label, const char *key)
{
    for (size_t i = 0; i < sizeof k_fields / sizeof *k_fields; i++)
        if (!strcmp(k_fields[i].name, name)) return set_field(c, &k_fields[i], v, label, key);
    return ds_errorf(DS_ERR_INTERNAL, "no field %s", name);
}

static ds_status set_enum(ds_config *c, const char *key, json_t *v, const char *label)
{
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    if (!strcmp(key, "dtype")) {
        if (s && !strcmp(s, "bf16")) c->dtype = DS_DTYPE_BF16;
        else if (s && !strcmp(s, "fp8")) c->dtype = DS_DTYPE_FP8;
        else return ds_errorf(DS_ERR_FORMAT, "%s: \"dtype\" must be \"bf16\" or \"fp8\"", label);
    } else if (!strcmp(key, "score_func")) {
        if (s && !strcmp(s, "softmax")) c->score_func = DS_SCORE_SOFTMAX;
        else if (s && !strcmp(s, "sigmoid")) c->score_func = DS_SCORE_SIGMOID;
        else return ds_errorf(DS_ERR_FORMAT, "%s: \"score_func\" must be \"softmax\" or \"sigmoid\"", label);
    } else if (!strcmp(key, "scale_fmt")) {
        if (json_is_null(v)) c->scale_ue8m0 = false;
        else if (s && !strcmp(s, "ue8m0")) c->scale_ue8m0 = true;
        else return ds_errorf(DS_ERR_FORMAT, "%s: \"scale_fmt\" must be null or \"ue8m0\"", label);
    } else {
        return DS_ERR_ARG;
    }
    return DS_OK;
}

static ds_status parse_reference(ds_config *c, json_t *root, const char *label)
{
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        ds_status s = set_enum(c, key, v, label);
        if (s == DS_OK) continue;
        if (s != DS_ERR_ARG) return s;
        size_t i, n = sizeof k_fields / sizeof *k_fields;
        for (i = 0; i < n; i++)
            if (!strcmp(k_fields[i].name, key)) break;
        if (i == n)
            return ds_errorf(DS_ERR_FORMAT, "%s: unknown key \"%s\" (not a ModelArgs field; a typo?)", label, key);
        if ((s = set_field(c, &k_fields[i], v, label, key))) return s;
    }
    return DS_OK;
}

/* Hugging Face config.json names -> ModelArgs names. Keys not listed are ignored:
 * HF configs carry many fields that do not affect inference. */
static const struct { const char *hf, *ref; } k_hf_map[] = {
    {"vocab_size", "vocab_size"}, {"hidden_size", "dim"}, {"intermediate_size", "inter_dim"},
    {"moe_intermediate_size", "moe_inter_dim"}, {"num_hidden_layers", "n_layers"},
    {"first_k_dense_replace", "n_dense_layers"}, {"num_attention_heads", "n_heads"},
    {"n_routed_experts", "n_routed_experts"}, {"n_shared_experts", "n_shared_experts"},
    {"num_experts_per_tok", "n_activated_experts"}, {"n_group", "n_expert_groups"},
    {"topk_group", "n_limited_groups"}, {"routed_scaling_factor", "route_scale"},
    {"q_lora_rank", "q_lora_rank"}, {"kv_lora_rank", "kv_lora_rank"},
    {"qk_nope_head_dim", "qk_nope_head_dim"}, {"qk_rope_head_dim", "qk_rope_head_dim"},
    {"v_head_dim", "v_head_dim"}, {"rope_theta", "rope_theta"},
    {"max_position_embeddings", "max_seq_len"},
};

static ds_status parse_hf(ds_config *c, json_t *root, const char *label)
{
    ds_status s;
    for (size_t i = 0; i < sizeof k_hf_map / sizeof *k_hf_map; i++) {
        json_t *v = json_object_get(root, k_hf_map[i].hf);
        if (!v) continue;
        if (json_is_null(v) && !strcmp(k_hf_map[i].hf, "q_lora_rank")) {
            c->q_lora_rank = 0;
            continue;
        }
        if ((s = set_by_name(c, k_hf_map[i].ref, v, label, k_hf_map[i].hf))) return s;
    }
    json_t *v = json_object_get(root, "scoring_func");
    if (v && (s = set_enum(c, "score_func", v, label))) return s;
    json_t *q = json_object_get(root, "quantization_config");
    if (json_is_object(q)) {
        c->dtype = DS_DTYPE_FP8;
        json_t *sf = json_object_get(q, "scale_fmt");
        if (sf && (s = set_enum(c, "scale_fmt", sf, label))) return s;
    }
    json_t *rs = json_object_get(root, "rope_scaling");
    if (json_is_object(rs)) {
        static const struct { const char *hf, *ref; } m[] = {
            {"factor", "rope_factor"}, {"original_max_position_embeddings", "original_seq_len"},
            {"beta_fast", "beta_fast"}, {"beta_slow", "beta_slow"}, {"mscale", "mscale"},
        };
        for (size_t i = 0; i < sizeof m / sizeof *m; i++) {
            json_t *x = json_object_get(rs, m[i].hf);
            if (x && (s = set_by_name(c, m[i].ref, x, label, m[i].hf))) return s;
        }
    } else if (!rs || json_is_null(rs)) {
        /* no YaRN: make max_seq_len <= original_seq_len so it stays off */
        c->original_seq_len = c->max_seq_len;
    }
    return DS_OK;
}

/* Parses len bytes of JSON: a NUL inside is an error, not the end of the text. */
static ds_status parse_buf(ds_config *c, const char *text, size_t len, const char *label)
{
    config_defaults(c);
    json_error_t e;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
    if (!root) return ds_errorf(DS_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", label, e.text, e.line);
    ds_status s;
    if (!json_is_object(root)) s = ds_errorf(DS_ERR_FORMAT, "%s: not a JSON object", label);
    else if (json_object_get(root, "hidden_size") || json_object_get(root, "model_type")) s = parse_hf(c, root, label);
    else s = parse_reference(c, root, label);
    json_decref(root);
    return s ? s : config_validate(c, label);
}

ds_status config_parse(ds_config *c, const char *text, const char *label)
{
    return parse_buf(c, text, strlen(text), label);
}

ds_status config_load(ds_config *c, const char *path)
{
    char *buf;
    size_t n;
    ds_status s = file_read(path, FILE_MAX_CONFIG, "config", &buf, &n);
    if (s) return s;
    s = parse_buf(c, buf, n, path);
    free(buf);
    return s;
}

/* The range of every integer field. The upper bounds are far above any
 * DeepSeek model (V3: vocab 129280, dim 7168, 61 layers, 256 experts, 128
 * heads) and keep every product the loader, synth and the KV cache form of
 * two or three fields well inside 64 bits (vocab*dim <= 2^40 elements;
 * layers*experts*dim*moe_inter_dim <= 2^62), so a hostile config is refused
 * here instead of overflowing a size later. */
typedef struct { const char *name; size_t off; int lo, hi; } int_range;
#define R(f, lo, hi) {#f, offsetof(ds_config, f), lo, hi}
static const int_range k_ranges[] = {
    R(max_batch_size, 1, 1 << 16), R(max_seq_len, 1, 1 << 24), R(vocab_size, 1, 1 << 24),
    R(dim, 1, 1 << 16), R(inter_dim, 1, 1 << 20), R(moe_inter_dim, 1, 1 << 20), R(n_layers, 1, 1024),
    R(n_dense_layers, 0, 1024), R(n_heads, 1, 1024), R(n_routed_experts, 0, 1 << 16),
    R(n_shared_experts, 0, 1024), R(n_activated_experts, 0, 1 << 16), R(n_expert_groups, 1, 1 << 16),
    R(n_limited_groups, 1, 1 << 16), R(q_lora_rank, 0, 1 << 16), R(kv_lora_rank, 1, 1 << 16),
    R(qk_nope_head_dim, 1, 4096), R(qk_rope_head_dim, 1, 4096), R(v_head_dim, 1, 4096),
    R(original_seq_len, 1, 1 << 24), R(beta_fast, 1, 1 << 16), R(beta_slow, 1, 1 << 16),
};
#undef R

/* The range of every float field: finite, and small enough that the
 * attention and routing scales stay finite in float32. */
typedef struct { const char *name; size_t off; double lo, hi; bool lo_open; } float_range;
#define R(f, lo, hi, open) {#f, offsetof(ds_config, f), lo, hi, open}
static const float_range k_franges[] = {
    R(route_scale, 0, 1000, true), R(rope_theta, 1, 1e12, true), R(rope_factor, 0, 1e6, true),
    R(mscale, 0, 100, false),
};
#undef R

ds_status config_validate(const ds_config *c, const char *label)
{
    for (size_t i = 0; i < sizeof k_ranges / sizeof *k_ranges; i++) {
        const int_range *r = &k_ranges[i];
        int v = *(const int *)((const char *)c + r->off);
        if (v < r->lo || v > r->hi)
            return ds_errorf(DS_ERR_FORMAT, "%s: \"%s\" is %d but must be in [%d, %d]", label, r->name, v, r->lo, r->hi);
    }
    for (size_t i = 0; i < sizeof k_franges / sizeof *k_franges; i++) {
        const float_range *r = &k_franges[i];
        double v = *(const double *)((const char *)c + r->off);
        if (!(r->lo_open ? v > r->lo : v >= r->lo) || !(v <= r->hi))
            return ds_errorf(DS_ERR_FORMAT, "%s: \"%s\" is %g but must be in %c%g, %g]", label, r->name, v,
                             r->lo_open ? '(' : '[', r->lo, r->hi);
    }
    if (c->n_dense_layers > c->n_layers)
        return ds_errorf(DS_ERR_FORMAT, "%s: \"n_dense_layers\" is %d but n_layers is %d", label,
                         c->n_dense_layers, c->n_layers);
    if (c->n_dense_layers < c->n_layers) {
        if (c->n_routed_experts < 1 || c->n_activated_experts < 1)
            return ds_errorf(DS_ERR_FORMAT, "%s: \"n_routed_experts\" (%d) and \"n_activated_experts\" (%d) must be "
                             ">= 1 when there are MoE layers", label, c->n_routed_experts, c->n_activated_experts);
        if (c->n_activated_experts > c->n_routed_experts)
            return ds_errorf(DS_ERR_FORMAT, "%s: \"n_activated_experts\" is %d but n_routed_experts is %d",
                             label, c->n_activated_experts, c->n_routed_experts);
        if (c->n_routed_experts % c->n_expert_groups)
            return ds_errorf(DS_ERR_FORMAT, "%s: \"n_expert_groups\" (%d) does not divide n_routed_experts (%d)",
                             label, c->n_expert_groups, c->n_routed_experts);
        if (c->n_limited_groups > c->n_expert_groups)
            return ds_errorf(DS_ERR_FORMAT, "%s: \"n_limited_groups\" is %d but n_expert_groups is %d",
                             label, c->n_limited_groups, c->n_expert_groups);
        int per_group = c->n_routed_experts / c->n_expert_groups;
        if (c->n_activated_experts > c->n_limited_groups * per_group)
            return ds_errorf(DS_ERR_FORMAT, "%s: \"n_activated_experts\" (%d) exceeds the %d experts in "
                             "n_limited_groups (%d) groups", label, c->n_activated_experts,
                             c->n_limited_groups * per_group, c->n_limited_groups);
    }
    if (c->qk_rope_head_dim % 2)
        return ds_errorf(DS_ERR_FORMAT, "%s: \"qk_rope_head_dim\" is %d but must be even (rotary pairs)",
                         label, c->qk_rope_head_dim);
    /* The largest product formed from the fields, the KV cache
     * (layers x batch x seq x (kv_lora_rank + rope) floats, doubled for any
     * per-head layout), can leave 64 bits within the ranges above. */
    size_t kv;
    if (!ck_mul3(&kv, c->n_layers, c->max_batch_size, c->max_seq_len) ||
        !ck_mul3(&kv, (int64_t)kv, (int64_t)c->kv_lora_rank + c->qk_rope_head_dim, 2 * (int64_t)sizeof(float)) ||
        kv > (size_t)INT64_MAX)
        return ds_errorf(DS_ERR_FORMAT, "%s: the KV cache of n_layers (%d) x max_batch_size (%d) x max_seq_len (%d) "
                         "x %d values overflows 64 bits", label, c->n_layers, c->max_batch_size, c->max_seq_len,
                         c->kv_lora_rank + c->qk_rope_head_dim);
    return DS_OK;
}

ds_status config_check_parallel(const ds_config *c, int ws)
{
    static const char *why = "must be divisible by the model-parallel degree";
    if (ws < 1) return ds_errorf(DS_ERR_ARG, "model-parallel degree %d must be >= 1", ws);
    if (c->vocab_size % ws) return ds_errorf(DS_ERR_ARG, "vocab_size %d %s %d", c->vocab_size, why, ws);
    if (c->n_heads % ws) return ds_errorf(DS_ERR_ARG, "n_heads %d %s %d", c->n_heads, why, ws);
    if (c->inter_dim % ws) return ds_errorf(DS_ERR_ARG, "inter_dim %d %s %d", c->inter_dim, why, ws);
    if (c->n_dense_layers < c->n_layers) {
        if (c->n_routed_experts % ws)
            return ds_errorf(DS_ERR_ARG, "n_routed_experts %d %s %d", c->n_routed_experts, why, ws);
        if ((c->n_shared_experts * c->moe_inter_dim) % ws)
            return ds_errorf(DS_ERR_ARG, "n_shared_experts*moe_inter_dim %d %s %d",
                             c->n_shared_experts * c->moe_inter_dim, why, ws);
    }
    return DS_OK;
}

char *config_to_json(const ds_config *c)
{
    json_t *o = json_object();
    for (size_t i = 0; i < sizeof k_fields / sizeof *k_fields; i++) {
        const field *f = &k_fields[i];
        json_t *v = f->kind == F_INT ? json_integer(*(const int *)((const char *)c + f->off))
                                     : json_real(*(const double *)((const char *)c + f->off));
        json_object_set_new(o, f->name, v);
    }
    json_object_set_new(o, "dtype", json_string(c->dtype == DS_DTYPE_FP8 ? "fp8" : "bf16"));
    json_object_set_new(o, "score_func", json_string(c->score_func == DS_SCORE_SIGMOID ? "sigmoid" : "softmax"));
    json_object_set_new(o, "scale_fmt", c->scale_ue8m0 ? json_string("ue8m0") : json_null());
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}
