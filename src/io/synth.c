/* synth.c - random-weight HF checkpoints: tensor list, shard plan, generators.
 *
 * The tensor list is built once from the config (weights and, for FP8, their
 * weight_scale_inv right after them), then cut into shards of about
 * shard_bytes (a weight and its scale stay together). Each tensor is generated
 * in chunks of CHUNK_ELEMS values; chunk k of tensor "name" always comes from
 * stream (hash(seed, name), k), so chunks are filled in parallel into a 64 MiB
 * buffer that is then written out. */
#include "synth.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/checked.h"
#include "base/numeric.h"
#include "base/progress.h"
#include "base/rng.h"
#include "io/ckpt.h"
#include "io/convert.h"
#include "io/safetensors.h"

#define CHUNK_ELEMS (1u << 16)
#define SYNTH_MAX_TENSORS (4u << 20) /* the tensor list then takes at most ~0.8 GB */
#define BUF_BYTES (64u << 20)
#define FP8_UNIFORM_STD 258.6437f /* std of uniform(-448, 448): 448/sqrt(3) */

typedef enum { G_UNIFORM, G_NORM, G_FP8, G_SCALE } gen_kind;

typedef struct {
    char name[160];
    st_dtype dt;
    int ndim;
    int64_t shape[2];
    gen_kind kind;
    float amp;        /* uniform half-width (G_UNIFORM), or the target std (G_SCALE) */
    uint64_t nbytes;
    int shard;
} syn_tensor;

typedef struct {
    syn_tensor *v;
    size_t n, cap;
    bool fp8;
} syn_list;

static ds_status add(syn_list *l, const char *name, st_dtype dt, int ndim, int64_t d0, int64_t d1,
                     gen_kind k, float amp)
{
    if (l->n == SYNTH_MAX_TENSORS)
        return ds_errorf(DS_ERR_RANGE, "the config has over %u tensors (DeepSeek-V3 has 91k): refusing to synthesise it",
                         SYNTH_MAX_TENSORS);
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        syn_tensor *v = realloc(l->v, cap * sizeof *v);
        if (!v) return ds_errorf(DS_ERR_NOMEM, "out of memory listing tensors");
        l->v = v;
        l->cap = cap;
    }
    syn_tensor *t = &l->v[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dt = dt;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->kind = k;
    t->amp = amp;
    size_t nb;
    if (!ck_mul3(&nb, d0, ndim > 1 ? d1 : 1, (int64_t)st_dtype_size(dt)))
        return ds_errorf(DS_ERR_RANGE, "tensor '%s': size %lld x %lld overflows", name, (long long)d0, (long long)d1);
    t->nbytes = nb;
    return DS_OK;
}

/* A projection (out x in): BF16 uniform with std 1/sqrt(in), or FP8 plus its scale. */
static ds_status add_linear(syn_list *l, const char *prefix, const char *what, int64_t out, int64_t in)
{
    char n[160];
    float std = 1.0f / sqrtf((float)in);
    snprintf(n, sizeof n, "%s%s.weight", prefix, what);
    if (!l->fp8) return add(l, n, ST_BF16, 2, out, in, G_UNIFORM, std * sqrtf(3.0f));
    ds_status s = add(l, n, ST_F8_E4M3, 2, out, in, G_FP8, 0);
    snprintf(n, sizeof n, "%s%s.weight_scale_inv", prefix, what);
    return s ? s : add(l, n, ST_F32, 2, (out + 127) / 128, (in + 127) / 128, G_SCALE, std);
}

static ds_status add_norm(syn_list *l, const char *prefix, const char *what, int64_t d)
{
    char n[160];
    snprintf(n, sizeof n, "%s%s.weight", prefix, what);
    return add(l, n, ST_BF16, 1, d, 0, G_NORM, 0);
}

static ds_status add_mlp(syn_list *l, const char *prefix, int64_t dim, int64_t inter)
{
    ds_status s = add_linear(l, prefix, "gate_proj", inter, dim);
    if (!s) s = add_linear(l, prefix, "up_proj", inter, dim);
    if (!s) s = add_linear(l, prefix, "down_proj", dim, inter);
    return s;
}

static ds_status add_layer(syn_list *l, const ds_config *c, int L)
{
    char p[96], q[128];
    int64_t dim = c->dim, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    snprintf(p, sizeof p, "model.layers.%d.", L);
    ds_status s = add_norm(l, p, "input_layernorm", dim);
    snprintf(q, sizeof q, "%sself_attn.", p);
    if (!s && c->q_lora_rank == 0) s = add_linear(l, q, "q_proj", (int64_t)c->n_heads * qk, dim);
    if (!s && c->q_lora_rank > 0) {
        s = add_linear(l, q, "q_a_proj", c->q_lora_rank, dim);
        if (!s) s = add_norm(l, q, "q_a_layernorm", c->q_lora_rank);
        if (!s) s = add_linear(l, q, "q_b_proj", (int64_t)c->n_heads * qk, c->q_lora_rank);
    }
    if (!s) s = add_linear(l, q, "kv_a_proj_with_mqa", c->kv_lora_rank + c->qk_rope_head_dim, dim);
    if (!s) s = add_norm(l, q, "kv_a_layernorm", c->kv_lora_rank);
    if (!s) s = add_linear(l, q, "kv_b_proj", (int64_t)c->n_heads * (c->qk_nope_head_dim + c->v_head_dim),
                           c->kv_lora_rank);
    if (!s) s = add_linear(l, q, "o_proj", dim, (int64_t)c->n_heads * c->v_head_dim);
    if (!s) s = add_norm(l, p, "post_attention_layernorm", dim);
    if (s) return s;
    if (L < c->n_dense_layers) {
        snprintf(q, sizeof q, "%smlp.", p);
        return add_mlp(l, q, dim, c->inter_dim);
    }
    snprintf(q, sizeof q, "%smlp.gate.weight", p);
    s = add(l, q, ST_BF16, 2, c->n_routed_experts, dim, G_UNIFORM, sqrtf(3.0f / (float)dim));
    if (!s && c->score_func == DS_SCORE_SIGMOID) {
        snprintf(q, sizeof q, "%smlp.gate.e_score_correction_bias", p);
        s = add(l, q, ST_F32, 1, c->n_routed_experts, 0, G_UNIFORM, 0.01f);
    }
    for (int e = 0; !s && e < c->n_routed_experts; e++) {
        snprintf(q, sizeof q, "%smlp.experts.%d.", p, e);
        s = add_mlp(l, q, dim, c->moe_inter_dim);
    }
    if (!s && c->n_shared_experts > 0) {
        snprintf(q, sizeof q, "%smlp.shared_experts.", p);
        s = add_mlp(l, q, dim, (int64_t)c->n_shared_experts * c->moe_inter_dim);
    }
    return s;
}

/* DeepSeek-V3's MTP module as layer n_layers: a MoE block and embed_tokens,
 * enorm, hnorm, eh_proj (BF16, as V3's), shared_head.{norm, head}. */
static ds_status add_mtp(syn_list *l, const ds_config *c)
{
    char p[96], q[128];
    int L = c->n_layers;
    snprintf(p, sizeof p, "model.layers.%d.", L);
    snprintf(q, sizeof q, "%sembed_tokens.weight", p);
    ds_status s = add(l, q, ST_BF16, 2, c->vocab_size, c->dim, G_UNIFORM, sqrtf(3.0f));
    if (!s) s = add_norm(l, p, "enorm", c->dim);
    if (!s) s = add_norm(l, p, "hnorm", c->dim);
    snprintf(q, sizeof q, "%seh_proj.weight", p);
    if (!s) s = add(l, q, ST_BF16, 2, c->dim, 2 * (int64_t)c->dim, G_UNIFORM, sqrtf(3.0f / (2.0f * (float)c->dim)));
    if (!s) s = add_layer(l, c, L);
    if (!s) s = add_norm(l, p, "shared_head.norm", c->dim);
    snprintf(q, sizeof q, "%sshared_head.head.weight", p);
    if (!s) s = add(l, q, ST_BF16, 2, c->vocab_size, c->dim, G_UNIFORM, sqrtf(3.0f / (float)c->dim));
    return s;
}

static ds_status build_list(const ds_config *c, bool mtp, syn_list *l)
{
    l->fp8 = c->dtype == DS_DTYPE_FP8;
    ds_status s = add(l, "model.embed_tokens.weight", ST_BF16, 2, c->vocab_size, c->dim, G_UNIFORM, sqrtf(3.0f));
    for (int L = 0; !s && L < c->n_layers; L++) s = add_layer(l, c, L);
    if (!s) s = add_norm(l, "model.", "norm", c->dim);
    if (!s) s = add(l, "lm_head.weight", ST_BF16, 2, c->vocab_size, c->dim, G_UNIFORM, sqrtf(3.0f / (float)c->dim));
    if (!s && mtp) s = add_mtp(l, c);
    return s;
}

void synth_totals(const ds_config *c, uint64_t *n_tensors, uint64_t *bytes)
{
    syn_list l = {0};
    *n_tensors = *bytes = 0;
    if (build_list(c, false, &l) == DS_OK) {
        *n_tensors = l.n;
        for (size_t i = 0; i < l.n; i++) *bytes += l.v[i].nbytes;
    }
    free(l.v);
}

/* ---- generation ---- */

/* e4m3 magnitude codes for 2^15 equal bins of [0, 448]: a 15-bit uniform
 * index gives the rounding of a uniform value, one lookup per weight. */
static uint8_t g_fp8_mag[1u << 15];
static pthread_once_t g_fp8_once = PTHREAD_ONCE_INIT;

static void init_fp8_mag(void)
{
    for (uint32_t k = 0; k < (1u << 15); k++)
        g_fp8_mag[k] = f32_to_fp8_e4m3(((float)k + 0.5f) * (448.0f / 32768.0f));
}

/* Fills elements [e0, e1) of t (e0 a multiple of CHUNK_ELEMS) into out. */
static void gen_chunk(const syn_tensor *t, uint64_t tseed, uint64_t e0, uint64_t e1, void *out)
{
    rng_state r;
    rng_init(&r, tseed, e0 / CHUNK_ELEMS);
    uint64_t n = e1 - e0;
    if (t->kind == G_FP8) {
        uint8_t *o = out;
        for (uint64_t i = 0; i < n; i += 4) {
            uint64_t x = rng_next(&r);
            for (uint64_t j = 0; j < 4 && i + j < n; j++, x >>= 16)
                o[i + j] = g_fp8_mag[x & 0x7fff] | (uint8_t)((x >> 8) & 0x80);
        }
        return;
    }
    for (uint64_t i = 0; i < n; i += 2) {
        uint64_t x = rng_next(&r);
        for (uint64_t j = 0; j < 2 && i + j < n; j++, x >>= 32) {
            float u = rng_sym24((uint32_t)x), v;
            switch (t->kind) {
            case G_NORM: v = 1.0f + 0.05f * u; break;
            /* block scale: std/FP8_UNIFORM_STD, varied by up to 2^+-0.5 per block */
            case G_SCALE: v = t->amp / FP8_UNIFORM_STD * exp2f(0.5f * u); break;
            default: v = t->amp * u; break;
            }
            if (t->dt == ST_BF16) ((uint16_t *)out)[i + j] = f32_to_bf16(v);
            else ((float *)out)[i + j] = v;
        }
    }
}

/* Generates t and appends it to w, BUF_BYTES at a time. */
static ds_status write_tensor(st_writer *w, const syn_tensor *t, uint64_t seed, uint8_t *buf, progress *pb)
{
    size_t es = st_dtype_size(t->dt);
    uint64_t numel = t->nbytes / es, per_buf = BUF_BYTES / es, tseed = rng_hash_str(seed, t->name);
    for (uint64_t b0 = 0; b0 < numel; b0 += per_buf) {
        uint64_t b1 = b0 + per_buf < numel ? b0 + per_buf : numel;
        int64_t nchunks = (int64_t)((b1 - b0 + CHUNK_ELEMS - 1) / CHUNK_ELEMS);
        #pragma omp parallel for schedule(dynamic, 4) if (nchunks > 1)
        for (int64_t k = 0; k < nchunks; k++) {
            uint64_t e0 = b0 + (uint64_t)k * CHUNK_ELEMS, e1 = e0 + CHUNK_ELEMS < b1 ? e0 + CHUNK_ELEMS : b1;
            gen_chunk(t, tseed, e0, e1, buf + (e0 - b0) * es);
        }
        ds_status s = st_writer_write(w, buf, (size_t)((b1 - b0) * es));
        if (s) return s;
        progress_add(pb, (b1 - b0) * es);
    }
    return DS_OK;
}

/* ---- files ---- */

/* Assigns shards; a scale stays with its weight. Returns the shard count. */
static int assign_shards(syn_list *l, uint64_t limit)
{
    int shard = 0;
    uint64_t cur = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (l->v[i].kind != G_SCALE && cur > 0 && cur + l->v[i].nbytes > limit) {
            shard++;
            cur = 0;
        }
        l->v[i].shard = shard;
        cur += l->v[i].nbytes;
    }
    return shard + 1;
}

static void shard_name(char *buf, size_t cap, int i, int n)
{
    snprintf(buf, cap, "model-%05d-of-%05d.safetensors", i + 1, n);
}

static ds_status write_shard(const synth_opts *o, const syn_list *l, int sh, int n_sh, uint8_t *buf,
                             progress *pb, out_txn *t)
{
    char fn[64];
    shard_name(fn, sizeof fn, sh, n_sh);
    char *path = txn_path(t, fn);
    if (!path) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    st_writer *w;
    ds_status s = st_writer_open(&w, path);
    if (!s) {
        s = st_writer_meta(w, "format", "pt");
        for (size_t i = 0; !s && i < l->n; i++)
            if (l->v[i].shard == sh) s = st_writer_add(w, l->v[i].name, l->v[i].dt, l->v[i].ndim, l->v[i].shape);
        if (!s) s = st_writer_begin(w);
        for (size_t i = 0; !s && i < l->n; i++)
            if (l->v[i].shard == sh) s = write_tensor(w, &l->v[i], o->seed, buf, pb);
        if (s) st_writer_abort(w);
        else s = st_writer_finish(w);
    }
    free(path);
    return s;
}

static ds_status write_index(const syn_list *l, int n_sh, out_txn *t)
{
    json_t *root = json_object(), *meta = json_object(), *wm = json_object();
    uint64_t total = 0;
    char fn[64];
    for (size_t i = 0; i < l->n; i++) {
        total += l->v[i].nbytes;
        shard_name(fn, sizeof fn, l->v[i].shard, n_sh);
        json_object_set_new(wm, l->v[i].name, json_string(fn));
    }
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "weight_map", wm);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    ds_status s = text ? convert_write_file(t, "model.safetensors.index.json", text, strlen(text))
                       : ds_errorf(DS_ERR_NOMEM, "out of memory");
    free(text);
    json_decref(root);
    return s;
}

char *synth_hf_config(const ds_config *c)
{
    json_t *o = json_object(), *arch = json_array();
    json_array_append_new(arch, json_string("DeepseekV3ForCausalLM"));
    json_object_set_new(o, "architectures", arch);
    json_object_set_new(o, "model_type", json_string("deepseek_v3"));
#define SETI(k, v) json_object_set_new(o, k, json_integer(v))
    SETI("bos_token_id", 0);
    SETI("eos_token_id", 1);
    SETI("first_k_dense_replace", c->n_dense_layers);
    json_object_set_new(o, "hidden_act", json_string("silu"));
    SETI("hidden_size", c->dim);
    SETI("intermediate_size", c->inter_dim);
    SETI("kv_lora_rank", c->kv_lora_rank);
    SETI("max_position_embeddings", c->max_seq_len);
    SETI("moe_intermediate_size", c->moe_inter_dim);
    SETI("moe_layer_freq", 1);
    SETI("n_group", c->n_expert_groups);
    SETI("n_routed_experts", c->n_routed_experts);
    SETI("n_shared_experts", c->n_shared_experts);
    json_object_set_new(o, "norm_topk_prob", json_boolean(c->score_func == DS_SCORE_SIGMOID));
    SETI("num_attention_heads", c->n_heads);
    SETI("num_experts_per_tok", c->n_activated_experts);
    SETI("num_hidden_layers", c->n_layers);
    SETI("num_key_value_heads", c->n_heads);
    SETI("num_nextn_predict_layers", 0);
    json_object_set_new(o, "q_lora_rank", c->q_lora_rank ? json_integer(c->q_lora_rank) : json_null());
    SETI("qk_nope_head_dim", c->qk_nope_head_dim);
    SETI("qk_rope_head_dim", c->qk_rope_head_dim);
    if (c->dtype == DS_DTYPE_FP8) {
        json_t *q = json_object(), *bs = json_array();
        json_object_set_new(q, "activation_scheme", json_string("dynamic"));
        json_object_set_new(q, "fmt", json_string("e4m3"));
        json_object_set_new(q, "quant_method", json_string("fp8"));
        json_array_append_new(bs, json_integer(128));
        json_array_append_new(bs, json_integer(128));
        json_object_set_new(q, "weight_block_size", bs);
        if (c->scale_ue8m0) json_object_set_new(q, "scale_fmt", json_string("ue8m0"));
        json_object_set_new(o, "quantization_config", q);
    }
    json_object_set_new(o, "rms_norm_eps", json_real(1e-6));
    json_t *rs = json_object();
    json_object_set_new(rs, "beta_fast", json_integer(c->beta_fast));
    json_object_set_new(rs, "beta_slow", json_integer(c->beta_slow));
    json_object_set_new(rs, "factor", json_real(c->rope_factor));
    json_object_set_new(rs, "mscale", json_real(c->mscale));
    json_object_set_new(rs, "mscale_all_dim", json_real(c->mscale));
    json_object_set_new(rs, "original_max_position_embeddings", json_integer(c->original_seq_len));
    json_object_set_new(rs, "type", json_string("yarn"));
    json_object_set_new(o, "rope_scaling", rs);
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(o, "routed_scaling_factor", json_real(c->route_scale));
    json_object_set_new(o, "scoring_func", json_string(c->score_func == DS_SCORE_SIGMOID ? "sigmoid" : "softmax"));
    json_object_set_new(o, "tie_word_embeddings", json_false());
    SETI("topk_group", c->n_limited_groups);
    json_object_set_new(o, "topk_method", json_string(c->score_func == DS_SCORE_SIGMOID ? "noaux_tc" : "greedy"));
    json_object_set_new(o, "torch_dtype", json_string("bfloat16"));
    SETI("v_head_dim", c->v_head_dim);
    SETI("vocab_size", c->vocab_size);
#undef SETI
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

static ds_status copy_tokenizer(const synth_opts *o, out_txn *t)
{
    static const char *names[] = {"tokenizer.json", "tokenizer_config.json"};
    ds_status s = DS_OK;
    for (int i = 0; !s && i < 2; i++) {
        char *src = ckpt_join(o->tokenizer_dir, names[i]);
        struct stat sb;
        if (!src) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
        else if (stat(src, &sb) == 0) s = convert_copy_file(t, src, names[i]);
        else if (i == 0) s = ds_errorf(DS_ERR_IO, "%s: no tokenizer.json in --tokenizer directory", o->tokenizer_dir);
        free(src);
    }
    return s;
}

ds_status synth_checkpoint(const synth_opts *o)
{
    ds_config c;
    ds_status s = config_load(&c, o->config_path);
    if (s) return s;
    if (o->dtype >= 0) c.dtype = (ds_wdtype)o->dtype;
    syn_list l = {0};
    if ((s = build_list(&c, o->mtp, &l))) {
        free(l.v);
        return s;
    }
    pthread_once(&g_fp8_once, init_fp8_mag);
    int n_sh = assign_shards(&l, o->shard_bytes ? o->shard_bytes : (4ull << 30));
    uint64_t total = 0;
    for (size_t i = 0; !s && i < l.n; i++)
        if (!ck_add_u64(&total, total, l.v[i].nbytes)) s = ds_errorf(DS_ERR_RANGE, "the checkpoint's size overflows");
    out_txn *t = NULL;
    uint8_t *buf = malloc(BUF_BYTES);
    if (!buf) s = ds_errorf(DS_ERR_NOMEM, "out of memory for the %u MiB generation buffer", BUF_BYTES >> 20);
    if (!s) s = txn_begin(&t, o->out_dir, "--out");
    progress pb;
    progress_init(&pb, "synth", total, o->progress);
    for (int sh = 0; !s && sh < n_sh; sh++) s = write_shard(o, &l, sh, n_sh, buf, &pb, t);
    progress_done(&pb);
    if (!s) s = write_index(&l, n_sh, t);
    if (!s) {
        char *text = synth_hf_config(&c);
        const char *key = "\"num_nextn_predict_layers\": 0", *at = text && o->mtp ? strstr(text, key) : NULL;
        if (at) text[at - text + strlen(key) - 1] = '1'; /* the MTP layer written */
        s = text ? convert_write_file(t, "config.json", text, strlen(text)) : ds_errorf(DS_ERR_NOMEM, "out of memory");
        free(text);
    }
    if (!s && o->tokenizer_dir) s = copy_tokenizer(o, t);
    if (!s) s = txn_commit(t);
    else txn_abort(t);
    free(buf);
    free(l.v);
    return s;
}
