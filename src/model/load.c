/* load.c - binds a checkpoint's tensors to the model's weights.
 *
 * Names follow the converted layout (the reference's model.py names:
 * layers.L.attn.wq_a.weight, .scale, layers.L.ffn.experts.E.w1.weight, ...);
 * a Hugging Face directory is read through the inverse of convert's renaming.
 * Every tensor is checked for presence, dtype and the shape the config implies
 * for this rank, so a config that does not match the checkpoint is reported
 * before any compute, naming the tensor. Weights are not copied: they point
 * into the mapped files. Norm vectors and the gate bias are small and are
 * converted to float32 once.
 *
 * Every size formed from config fields or caller arguments (a dimension that
 * is a product or sum of fields, the bytes of a copy, a table or the KV cache)
 * goes through base/checked.h, so a value past what the code can index is an
 * error naming the field or tensor, never a wrapped size. config_validate's
 * ranges make most of these unreachable from a config file; the checks keep
 * each size safe on its own, whatever the ranges become. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

#include "base/checked.h"
#include "base/numeric.h"
#include "dist/dist.h"
#include "model/model.h"

/* Inverse of convert's renaming, one dotted segment at a time. */
static const struct { const char *ref, *hf; } k_segments[] = {
    {"attn", "self_attn"}, {"ffn", "mlp"}, {"wq", "q_proj"}, {"wq_a", "q_a_proj"},
    {"q_norm", "q_a_layernorm"}, {"wq_b", "q_b_proj"}, {"wkv_a", "kv_a_proj_with_mqa"},
    {"kv_norm", "kv_a_layernorm"}, {"wkv_b", "kv_b_proj"}, {"wo", "o_proj"}, {"w1", "gate_proj"},
    {"w2", "down_proj"}, {"w3", "up_proj"}, {"attn_norm", "input_layernorm"},
    {"ffn_norm", "post_attention_layernorm"}, {"scale", "weight_scale_inv"},
    {"bias", "e_score_correction_bias"}, {"embed", "embed_tokens"},
};

static void hf_name(const char *ref, char *out, size_t cap)
{
    size_t n = 0;
    if (!strncmp(ref, "head.", 5)) {
        snprintf(out, cap, "lm_head.%s", ref + 5);
        return;
    }
    n += (size_t)snprintf(out, cap, "model");
    const char *p = ref;
    while (*p && n < cap) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        const char *seg = NULL;
        for (size_t i = 0; i < sizeof k_segments / sizeof *k_segments; i++)
            if (strlen(k_segments[i].ref) == len && !strncmp(k_segments[i].ref, p, len)) seg = k_segments[i].hf;
        if (seg) n += (size_t)snprintf(out + n, cap - n, ".%s", seg);
        else n += (size_t)snprintf(out + n, cap - n, ".%.*s", (int)len, p);
        p += len + (dot != NULL);
    }
}

static const st_tensor *find(const ds_model *m, const char *ref)
{
    if (!m->hf_names) return ckpt_find(m->ckpt, ref);
    char hf[512];
    hf_name(ref, hf, sizeof hf);
    return ckpt_find(m->ckpt, hf);
}

static ds_status missing(const ds_model *m, const char *ref)
{
    char hf[512];
    if (m->hf_names) hf_name(ref, hf, sizeof hf);
    return ds_errorf(DS_ERR_FORMAT, "%s: checkpoint has no tensor '%s'%s%s%s (does the config match the checkpoint?)",
                     m->ckpt->dir, m->hf_names ? hf : ref, m->hf_names ? " (" : "", m->hf_names ? ref : "",
                     m->hf_names ? ")" : "");
}

static ds_status bad_shape(const ds_model *m, const char *ref, const st_tensor *t, int r, int c)
{
    char sh[128];
    if (c > 0)
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s' has shape %s but the config implies [%d, %d] for "
                         "this rank (world size %d)", m->ckpt->dir, t->name, st_shape_str(t, sh, sizeof sh), r, c,
                         m->world_size);
    return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s' has shape %s but the config implies [%d]", m->ckpt->dir,
                     t->name, st_shape_str(t, sh, sizeof sh), r);
}

/* *n = a*b + c as a tensor dimension (an int), or an error naming the
 * dimension (`what`: the tensor and the fields it is made of). */
static ds_status dim_of(int *n, int64_t a, int64_t b, int64_t c, const char *what)
{
    int64_t r;
    if (a < 0 || b < 0 || c < 0 || !ck_mul_i64(&r, a, b) || !ck_add_i64(&r, r, c) || r > INT_MAX)
        return ds_errorf(DS_ERR_FORMAT, "config: %s is %lld x %lld + %lld, beyond a tensor dimension's limit of %d",
                         what, (long long)a, (long long)b, (long long)c, INT_MAX);
    *n = (int)r;
    return DS_OK;
}

/* *bytes = a*b*c, or an error naming what the buffer is for. */
static ds_status bytes_of(size_t *bytes, int64_t a, int64_t b, int64_t c, const char *what)
{
    if (!ck_mul3(bytes, a, b, c))
        return ds_errorf(DS_ERR_RANGE, "%s: %lld x %lld x %lld bytes overflow a size", what, (long long)a,
                         (long long)b, (long long)c);
    return DS_OK;
}

/* Binds "<base>.weight" (and "<base>.scale" for FP8) as a (rows, cols) matrix. */
static ds_status get_matrix(const ds_model *m, ds_weight *w, int rows, int cols, const char *fmt, ...)
    DS_PRINTF(5, 6);

static ds_status get_matrix(const ds_model *m, ds_weight *w, int rows, int cols, const char *fmt, ...)
{
    char base[256], name[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(base, sizeof base, fmt, ap);
    va_end(ap);
    snprintf(name, sizeof name, "%s.weight", base);
    const st_tensor *t = find(m, name);
    if (!t) return missing(m, name);
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) return bad_shape(m, name, t, rows, cols);
    w->rows = rows;
    w->cols = cols;
    w->data = t->data;
    w->scale = NULL;
    w->dev = NULL;
    switch (t->dtype) {
    case ST_F32: w->fmt = DS_W_F32; return DS_OK;
    case ST_BF16: w->fmt = DS_W_BF16; return DS_OK;
    case ST_F8_E4M3: break;
    default:
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s' has dtype %s; expected BF16, F32 or F8_E4M3",
                         m->ckpt->dir, t->name, st_dtype_name(t->dtype));
    }
    w->fmt = DS_W_FP8;
    snprintf(name, sizeof name, "%s.scale", base);
    const st_tensor *s = find(m, name);
    if (!s) return ds_error_prefix(missing(m, name), "FP8 weight without its block scales");
    int sr = (rows + DS_BLOCK - 1) / DS_BLOCK, sc = (cols + DS_BLOCK - 1) / DS_BLOCK;
    if (s->ndim != 2 || s->shape[0] != sr || s->shape[1] != sc) return bad_shape(m, name, s, sr, sc);
    if (s->dtype != ST_F32)
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s' has dtype %s; expected F32 block scales", m->ckpt->dir,
                         s->name, st_dtype_name(s->dtype));
    if ((uintptr_t)s->data % sizeof(float))
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s' is not 4-byte aligned in its file", m->ckpt->dir, s->name);
    w->scale = s->data;
    return DS_OK;
}

/* A float32 copy of a 1-D tensor of length n (BF16 or F32). */
static ds_status get_vector(const ds_model *m, float **out, int n, const char *fmt, ...) DS_PRINTF(4, 5);

static ds_status get_vector(const ds_model *m, float **out, int n, const char *fmt, ...)
{
    char name[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const st_tensor *t = find(m, name);
    if (!t) return missing(m, name);
    if (t->ndim != 1 || t->shape[0] != n) return bad_shape(m, name, t, n, 0);
    size_t bytes;
    ds_status s = bytes_of(&bytes, n, 1, sizeof(float), name);
    if (s) return s;
    float *v = malloc(bytes);
    if (!v) return ds_errorf(DS_ERR_NOMEM, "out of memory for the float32 copy of %s (%zu bytes)", name, bytes);
    if (t->dtype == ST_BF16) {
        const uint8_t *p = t->data;
        for (int i = 0; i < n; i++) v[i] = bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    } else if (t->dtype == ST_F32) {
        memcpy(v, t->data, bytes);
    } else {
        free(v);
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s' has dtype %s; expected BF16 or F32", m->ckpt->dir,
                         t->name, st_dtype_name(t->dtype));
    }
    *out = v;
    return DS_OK;
}

static ds_status load_attn(ds_model *m, ds_layer *l, int i)
{
    const ds_config *c = &m->cfg;
    int H = m->n_local_heads, q_rows = 0, kv_a_rows = 0, kv_b_rows = 0, o_cols = 0;
    ds_status s;
    if ((s = dim_of(&q_rows, H, m->qk_head_dim, 0, "the rows of wq/wq_b (heads per rank x qk_head_dim)")) ||
        (s = dim_of(&kv_a_rows, c->kv_lora_rank, 1, c->qk_rope_head_dim,
                    "the rows of wkv_a (kv_lora_rank + qk_rope_head_dim)")) ||
        (s = dim_of(&kv_b_rows, H, (int64_t)c->qk_nope_head_dim + c->v_head_dim, 0,
                    "the rows of wkv_b (heads per rank x (qk_nope_head_dim + v_head_dim))")) ||
        (s = dim_of(&o_cols, H, c->v_head_dim, 0, "the columns of wo (heads per rank x v_head_dim)")))
        return s;
    if (c->q_lora_rank == 0) {
        if ((s = get_matrix(m, &l->wq, q_rows, c->dim, "layers.%d.attn.wq", i))) return s;
    } else {
        if ((s = get_matrix(m, &l->wq_a, c->q_lora_rank, c->dim, "layers.%d.attn.wq_a", i))) return s;
        if ((s = get_vector(m, &l->q_norm, c->q_lora_rank, "layers.%d.attn.q_norm.weight", i))) return s;
        if ((s = get_matrix(m, &l->wq_b, q_rows, c->q_lora_rank, "layers.%d.attn.wq_b", i))) return s;
    }
    if ((s = get_matrix(m, &l->wkv_a, kv_a_rows, c->dim, "layers.%d.attn.wkv_a", i))) return s;
    if ((s = get_vector(m, &l->kv_norm, c->kv_lora_rank, "layers.%d.attn.kv_norm.weight", i))) return s;
    if ((s = get_matrix(m, &l->wkv_b, kv_b_rows, c->kv_lora_rank, "layers.%d.attn.wkv_b", i))) return s;
    if ((s = get_matrix(m, &l->wo, c->dim, o_cols, "layers.%d.attn.wo", i))) return s;
    if ((s = get_vector(m, &l->attn_norm, c->dim, "layers.%d.attn_norm.weight", i))) return s;
    return get_vector(m, &l->ffn_norm, c->dim, "layers.%d.ffn_norm.weight", i);
}

static ds_status load_ffn(ds_model *m, ds_layer *l, int i)
{
    const ds_config *c = &m->cfg;
    int ws = m->world_size;
    ds_status s;
    if (i < c->n_dense_layers) {
        int inter = c->inter_dim / ws;
        if ((s = get_matrix(m, &l->w1, inter, c->dim, "layers.%d.ffn.w1", i))) return s;
        if ((s = get_matrix(m, &l->w2, c->dim, inter, "layers.%d.ffn.w2", i))) return s;
        return get_matrix(m, &l->w3, inter, c->dim, "layers.%d.ffn.w3", i);
    }
    l->moe = true;
    if ((s = get_matrix(m, &l->gate, c->n_routed_experts, c->dim, "layers.%d.ffn.gate", i))) return s;
    char bias[128];
    snprintf(bias, sizeof bias, "layers.%d.ffn.gate.bias", i);
    if (find(m, bias) && (s = get_vector(m, &l->gate_bias, c->n_routed_experts, "%s", bias))) return s;
    int E = m->n_local_experts;
    l->ew1 = calloc((size_t)E, sizeof(ds_weight));
    l->ew2 = calloc((size_t)E, sizeof(ds_weight));
    l->ew3 = calloc((size_t)E, sizeof(ds_weight));
    if (!l->ew1 || !l->ew2 || !l->ew3)
        return ds_errorf(DS_ERR_NOMEM, "out of memory for the tables of layer %d's %d local experts", i, E);
    for (int e = 0; e < E; e++) {
        int g = m->expert0 + e;
        if ((s = get_matrix(m, &l->ew1[e], c->moe_inter_dim, c->dim, "layers.%d.ffn.experts.%d.w1", i, g))) return s;
        if ((s = get_matrix(m, &l->ew2[e], c->dim, c->moe_inter_dim, "layers.%d.ffn.experts.%d.w2", i, g))) return s;
        if ((s = get_matrix(m, &l->ew3[e], c->moe_inter_dim, c->dim, "layers.%d.ffn.experts.%d.w3", i, g))) return s;
    }
    int sh = 0;
    if ((s = dim_of(&sh, c->n_shared_experts, c->moe_inter_dim, 0,
                    "the shared experts' width (n_shared_experts x moe_inter_dim)")))
        return s;
    sh /= ws;
    if (sh == 0) return DS_OK;
    if ((s = get_matrix(m, &l->sw1, sh, c->dim, "layers.%d.ffn.shared_experts.w1", i))) return s;
    if ((s = get_matrix(m, &l->sw2, c->dim, sh, "layers.%d.ffn.shared_experts.w2", i))) return s;
    return get_matrix(m, &l->sw3, sh, c->dim, "layers.%d.ffn.shared_experts.w3", i);
}

/* The reference's precompute_freqs_cis: rotary frequencies with the YaRN
 * correction when max_seq_len > original_seq_len, as cos/sin tables. */
static ds_status rope_bytes(const ds_config *c, size_t *bytes)
{
    return bytes_of(bytes, c->max_seq_len, c->qk_rope_head_dim / 2, sizeof(float),
                    "the rotary tables (max_seq_len x qk_rope_head_dim/2 floats)");
}

static ds_status rope_tables(ds_model *m)
{
    const ds_config *c = &m->cfg;
    int dim = c->qk_rope_head_dim, half = dim / 2;
    size_t bytes;
    ds_status s = rope_bytes(c, &bytes);
    if (s) return s;
    float *freqs = malloc(sizeof(float) * (size_t)half);
    m->cos_tab = malloc(bytes);
    m->sin_tab = malloc(bytes);
    if (!freqs || !m->cos_tab || !m->sin_tab) {
        free(freqs);
        return ds_errorf(DS_ERR_NOMEM, "out of memory for the rotary tables (max_seq_len %d: 2 x %zu bytes)",
                         c->max_seq_len, bytes);
    }
    for (int i = 0; i < half; i++) freqs[i] = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)dim);
    if (c->max_seq_len > c->original_seq_len) {
        double base = c->rope_theta, orig = c->original_seq_len;
        double dlow = dim * log(orig / (c->beta_fast * 2 * M_PI)) / (2 * log(base));
        double dhigh = dim * log(orig / (c->beta_slow * 2 * M_PI)) / (2 * log(base));
        double low = floor(dlow), high = ceil(dhigh);
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            float ramp = (float)(((float)i - (float)low) / (float)(high - low));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float smooth = 1 - ramp;
            freqs[i] = freqs[i] / (float)c->rope_factor * (1 - smooth) + freqs[i] * smooth;
        }
    }
    for (int p = 0; p < c->max_seq_len; p++)
        for (int i = 0; i < half; i++) {
            float a = (float)p * freqs[i];
            m->cos_tab[(size_t)p * half + i] = cosf(a);
            m->sin_tab[(size_t)p * half + i] = sinf(a);
        }
    free(freqs);
    return DS_OK;
}

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The model-parallel degree of a converted checkpoint in dir other than ws
 * (the smallest K with a model0-mpK.safetensors), or 0 if there is none. */
static int converted_for(const char *dir, int ws)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int best = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int k = 0, used = 0;
        if (sscanf(e->d_name, "model0-mp%d.safetensors%n", &k, &used) == 1 && e->d_name[used] == '\0' && k > 0 &&
            k != ws && (!best || k < best))
            best = k;
    }
    closedir(d);
    return best;
}

static ds_status open_ckpt(ds_model *m, const char *dir)
{
    char name[64];
    snprintf(name, sizeof name, "model%d-mp%d.safetensors", m->rank, m->world_size);
    char *path = ckpt_join(dir, name);
    if (!path) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    ds_status s;
    if (file_exists(path)) {
        const char *paths[1] = {path};
        s = ckpt_open_files(&m->ckpt, paths, 1);
        if (!s) {
            free(m->ckpt->dir);
            m->ckpt->dir = path;
            return DS_OK;
        }
        free(path);
        return s;
    }
    free(path);
    char *index = ckpt_join(dir, "model.safetensors.index.json");
    bool hf = m->world_size == 1 && index && file_exists(index);
    free(index);
    int other = hf ? 0 : converted_for(dir, m->world_size);
    if (other)
        return ds_errorf(DS_ERR_ARG, "%s: the checkpoint was converted for %d rank%s (model0-mp%d.safetensors) but "
                         "this run has %d; start %d rank%s (mpirun -np %d) or convert with --model-parallel %d", dir,
                         other, other > 1 ? "s" : "", other, m->world_size, other, other > 1 ? "s" : "", other,
                         m->world_size);
    if (m->world_size > 1)
        return ds_errorf(DS_ERR_IO, "%s: no %s (convert the checkpoint with --model-parallel %d)", dir, name,
                         m->world_size);
    if ((s = ckpt_open_dir(&m->ckpt, dir))) return s;
    if (ckpt_find(m->ckpt, "model.embed_tokens.weight")) m->hf_names = true;
    else if (!ckpt_find(m->ckpt, "embed.weight"))
        return ds_errorf(DS_ERR_FORMAT, "%s: neither a converted checkpoint (model0-mp1.safetensors) nor a "
                         "Hugging Face one (model.embed_tokens.weight)", dir);
    return DS_OK;
}

static ds_status upload_model(ds_model *m);

/* The MTP module at layer index n_layers (DeepSeek-V3's HF layer num_hidden_layers;
 * convert --keep-mtp keeps it as layers.N.{embed, enorm, hnorm, eh_proj,
 * shared_head.*, attn.*, ffn.*}); its block loads as any layer. */
static ds_status load_mtp(ds_model *m)
{
    const ds_config *c = &m->cfg;
    int L = c->n_layers;
    char probe[64];
    snprintf(probe, sizeof probe, "layers.%d.eh_proj.weight", L);
    if (!find(m, probe))
        return ds_error_prefix(missing(m, probe), "the MTP module was asked for (converted without --keep-mtp, or a "
                                                  "checkpoint without num_nextn_predict_layers?)");
    ds_mtp *t = m->mtp = calloc(1, sizeof *m->mtp);
    if (!t) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    int eh_cols = 0;
    ds_status s = dim_of(&eh_cols, 2, c->dim, 0, "the columns of the MTP module's eh_proj (2 x dim)");
    if (s) return s;
    if ((s = get_matrix(m, &t->embed, m->vocab_local, c->dim, "layers.%d.embed", L)) ||
        (s = get_matrix(m, &t->head, m->vocab_local, c->dim, "layers.%d.shared_head.head", L)) ||
        (s = get_matrix(m, &t->eh_proj, c->dim, eh_cols, "layers.%d.eh_proj", L)) ||
        (s = get_vector(m, &t->enorm, c->dim, "layers.%d.enorm.weight", L)) ||
        (s = get_vector(m, &t->hnorm, c->dim, "layers.%d.hnorm.weight", L)) ||
        (s = get_vector(m, &t->norm, c->dim, "layers.%d.shared_head.norm.weight", L)))
        return ds_error_prefix(s, "MTP module");
    if (t->embed.fmt == DS_W_FP8)
        return ds_errorf(DS_ERR_FORMAT, "%s: the MTP module's embedding is FP8; expected BF16 or F32", m->ckpt->dir);
    if ((s = load_attn(m, &m->layers[L], L)) || (s = load_ffn(m, &m->layers[L], L)))
        return ds_error_prefix(s, "MTP module");
    return DS_OK;
}

static ds_status load_rank(ds_model **out, const char *dir, const ds_config *cfg, const ds_model_opts *opt)
{
    ds_model *m = calloc(1, sizeof *m);
    if (!m) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    m->cfg = *cfg;
    if (opt) m->opt = *opt;
    m->ops = m->opt.ops ? m->opt.ops : cpu_backend(true);
    backend_complete(&m->be, m->ops, m->opt.tune.expand_min);
    m->rank = m->opt.comm ? m->opt.comm->rank : 0;
    m->world_size = m->opt.comm ? m->opt.comm->world_size : 1;
    ds_status s = config_validate(cfg, "config");
    if (!s) s = config_check_parallel(cfg, m->world_size);
    if (s) goto fail;
    const ds_config *c = &m->cfg;
    m->n_local_heads = c->n_heads / m->world_size;
    m->n_local_experts = c->n_routed_experts / m->world_size;
    m->expert0 = m->rank * m->n_local_experts;
    m->vocab_local = c->vocab_size / m->world_size;
    m->vocab0 = m->rank * m->vocab_local;
    if ((s = dim_of(&m->qk_head_dim, c->qk_nope_head_dim, 1, c->qk_rope_head_dim,
                    "qk_head_dim (qk_nope_head_dim + qk_rope_head_dim)")))
        goto fail;
    m->softmax_scale = 1.0f / sqrtf((float)m->qk_head_dim);
    if (c->max_seq_len > c->original_seq_len) {
        float ms = (float)(0.1 * c->mscale * log(c->rope_factor) + 1.0);
        m->softmax_scale *= ms * ms;
    }
    if ((s = open_ckpt(m, dir))) goto fail;
    if ((s = get_matrix(m, &m->embed, m->vocab_local, c->dim, "embed"))) goto fail;
    if (m->embed.fmt == DS_W_FP8) {
        s = ds_errorf(DS_ERR_FORMAT, "%s: embed.weight is FP8; expected BF16 or F32", dir);
        goto fail;
    }
    if ((s = get_matrix(m, &m->head, m->vocab_local, c->dim, "head"))) goto fail;
    if ((s = get_vector(m, &m->norm, c->dim, "norm.weight"))) goto fail;
    if (m->opt.mtp && m->world_size > 1) {
        s = ds_errorf(DS_ERR_ARG, "the MTP module runs in one process only (this run has %d ranks)", m->world_size);
        goto fail;
    }
    m->n_blocks = c->n_layers + (m->opt.mtp ? 1 : 0);
    if (!(m->layers = calloc((size_t)m->n_blocks, sizeof *m->layers))) {
        s = ds_errorf(DS_ERR_NOMEM, "out of memory for the tables of %d layers", m->n_blocks);
        goto fail;
    }
    for (int i = 0; i < c->n_layers; i++) {
        if ((s = load_attn(m, &m->layers[i], i))) goto fail;
        if ((s = load_ffn(m, &m->layers[i], i))) goto fail;
    }
    if (m->opt.mtp && (s = load_mtp(m))) goto fail;
    if ((s = rope_tables(m))) goto fail;
    if (m->ops->upload_weight && (s = upload_model(m))) goto fail;
    if (!m->ops->upload_weight) /* weights read in place from the mapping */
        for (size_t f = 0; f < m->ckpt->n_files; f++) st_settle_pages(m->ckpt->files[f]);
    *out = m;
    return DS_OK;
fail:
    model_free(m);
    return s;
}

/* Calls f on every weight matrix of the model. */
static ds_status each_weight(ds_model *m, ds_status (*f)(ds_model *, ds_weight *, void *), void *arg)
{
    ds_status s;
    if ((s = f(m, &m->embed, arg)) || (s = f(m, &m->head, arg))) return s;
    if (m->mtp && ((s = f(m, &m->mtp->embed, arg)) || (s = f(m, &m->mtp->head, arg)) ||
                   (s = f(m, &m->mtp->eh_proj, arg))))
        return s;
    for (int i = 0; i < m->n_blocks; i++) {
        ds_layer *l = &m->layers[i];
        ds_weight *ws[] = {&l->wq, &l->wq_a, &l->wq_b, &l->wkv_a, &l->wkv_b, &l->wo, &l->w1, &l->w2, &l->w3,
                           &l->gate, &l->sw1, &l->sw2, &l->sw3};
        for (size_t j = 0; j < sizeof ws / sizeof *ws; j++)
            if (ws[j]->data && (s = f(m, ws[j], arg))) return s;
        for (int e = 0; l->moe && e < m->n_local_experts; e++)
            if ((s = f(m, &l->ew1[e], arg)) || (s = f(m, &l->ew2[e], arg)) || (s = f(m, &l->ew3[e], arg))) return s;
    }
    return DS_OK;
}

/* Adds w's bytes (elements and FP8 block scales) to *(size_t *)arg. */
static ds_status count_bytes(ds_model *m, ds_weight *w, void *arg)
{
    (void)m;
    size_t e = w->fmt == DS_W_FP8 ? 1 : w->fmt == DS_W_BF16 ? 2 : 4, b, sb = 0;
    int64_t sr = ((int64_t)w->rows + DS_BLOCK - 1) / DS_BLOCK, sc = ((int64_t)w->cols + DS_BLOCK - 1) / DS_BLOCK;
    ds_status s = bytes_of(&b, w->rows, w->cols, (int64_t)e, "a weight matrix");
    if (!s && w->fmt == DS_W_FP8) s = bytes_of(&sb, sr, sc, sizeof(float), "a weight's block scales");
    if (!s && (!ck_add(&b, b, sb) || !ck_add((size_t *)arg, *(size_t *)arg, b)))
        s = ds_errorf(DS_ERR_RANGE, "the model's weight bytes overflow a size");
    return s;
}

static ds_status upload_one(ds_model *m, ds_weight *w, void *arg)
{
    (void)arg;
    return m->ops->upload_weight(w);
}

/* A copy of host vector *v (n floats) in ops->alloc memory, replacing it. */
static ds_status upload_vector(ds_model *m, float **v, size_t n)
{
    if (!*v) return DS_OK;
    size_t bytes;
    ds_status s = bytes_of(&bytes, (int64_t)n, 1, sizeof(float), "a device vector");
    if (s) return s;
    float *d = m->ops->alloc(bytes);
    if (!d) return ds_errorf(DS_ERR_NOMEM, "out of device memory for a vector of %zu floats", n);
    m->ops->upload(d, *v, bytes);
    free(*v);
    *v = d;
    return DS_OK;
}

/* Device backends: every weight and vector is copied to the device once, here,
 * so a forward pass reads nothing from host memory. */
static ds_status upload_model(ds_model *m)
{
    const ds_config *c = &m->cfg;
    size_t total = 0, rt;
    ds_status s = each_weight(m, count_bytes, &total);
    if (s || (s = rope_bytes(c, &rt))) return s;
    rt /= sizeof(float);
    s = each_weight(m, upload_one, NULL);
    if (s) return ds_error_prefix(s, "uploading the weights (%.2f GiB in all)", (double)total / (1u << 30));
    m->dev_vectors = true;
    if (m->mtp && ((s = upload_vector(m, &m->mtp->enorm, (size_t)c->dim)) ||
                   (s = upload_vector(m, &m->mtp->hnorm, (size_t)c->dim)) ||
                   (s = upload_vector(m, &m->mtp->norm, (size_t)c->dim))))
        return s;
    for (int i = 0; i < m->n_blocks; i++) {
        ds_layer *l = &m->layers[i];
        if ((s = upload_vector(m, &l->q_norm, (size_t)c->q_lora_rank)) ||
            (s = upload_vector(m, &l->kv_norm, (size_t)c->kv_lora_rank)) ||
            (s = upload_vector(m, &l->attn_norm, (size_t)c->dim)) || (s = upload_vector(m, &l->ffn_norm, (size_t)c->dim)) ||
            (s = upload_vector(m, &l->gate_bias, (size_t)c->n_routed_experts)))
            return s;
    }
    if ((s = upload_vector(m, &m->norm, (size_t)c->dim)) || (s = upload_vector(m, &m->cos_tab, rt)) ||
        (s = upload_vector(m, &m->sin_tab, rt)))
        return s;
    m->ops->sync();
    return DS_OK;
}

/* With several ranks, every rank must know before any compute whether all of
 * them loaded their shard with the same config; otherwise the ranks that did
 * would wait forever in the first all-reduce for those that did not. */
ds_status model_load(ds_model **out, const char *dir, const ds_config *cfg, const ds_model_opts *opt)
{
    *out = NULL;
    ds_model *m = NULL;
    ds_status s = load_rank(&m, dir, cfg, opt);
    ds_comm *comm = opt ? opt->comm : NULL;
    if (!comm || comm->world_size == 1) {
        if (!s) *out = m;
        return s;
    }
    /* a config that differs between ranks is the likelier root cause of a failed load, so it wins */
    char *json = config_to_json(cfg);
    ds_status same = dist_check_same(comm, json ? json : "", json ? strlen(json) : 0, "the model config");
    if (!json && !same) same = ds_errorf(DS_ERR_NOMEM, "out of memory comparing the config across ranks");
    free(json);
    if (same) s = same;
    if (comm->failed) {
        model_free(m);
        return s;
    }
    if ((s = dist_agree(comm, s))) {
        model_free(m);
        return s;
    }
    *out = m;
    return DS_OK;
}

void model_free(ds_model *m)
{
    if (!m) return;
    void (*vfree)(void *) = m->dev_vectors ? m->ops->free : free;
    for (int i = 0; m->layers && i < m->n_blocks; i++) {
        ds_layer *l = &m->layers[i];
        vfree(l->q_norm);
        vfree(l->kv_norm);
        vfree(l->attn_norm);
        vfree(l->ffn_norm);
        vfree(l->gate_bias);
        free(l->ew1);
        free(l->ew2);
        free(l->ew3);
    }
    free(m->layers);
    if (m->mtp) {
        vfree(m->mtp->enorm);
        vfree(m->mtp->hnorm);
        vfree(m->mtp->norm);
        free(m->mtp);
    }
    vfree(m->norm);
    vfree(m->cos_tab);
    vfree(m->sin_tab);
    ckpt_close(m->ckpt);
    free(m);
}

ds_status kvcache_new(ds_kvcache **out, const ds_model *m, int n_seq, int ctx)
{
    const ds_config *c = &m->cfg;
    if (n_seq < 1 || ctx < 1)
        return ds_errorf(DS_ERR_ARG, "KV cache needs at least one sequence and one position (got %d, %d)", n_seq, ctx);
    if (ctx > c->max_seq_len)
        return ds_errorf(DS_ERR_RANGE, "context of %d positions exceeds max_seq_len %d", ctx, c->max_seq_len);
    ds_kvcache *kv = calloc(1, sizeof *kv);
    if (!kv) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    kv->n_seq = n_seq;
    kv->ctx = ctx;
    kv->attn = m->opt.attn;
    kv->n_layers = m->n_blocks;
    kv->ops = m->ops;
    bool absorb = kv->attn == DS_ATTN_ABSORB;
    float ***a = absorb ? &kv->kv : &kv->k;
    float ***b = absorb ? &kv->pe : &kv->v;
    /* per layer, (n_seq, ctx, width) floats: absorb caches the latent and its
     * rotary part, naive the per-head keys and values */
    int64_t H = m->n_local_heads;
    int64_t wa = absorb ? c->kv_lora_rank : H * m->qk_head_dim, wb = absorb ? c->qk_rope_head_dim : H * c->v_head_dim;
    size_t na, nb, all;
    if (!ck_mul3(&na, n_seq, ctx, wa) || !ck_mul(&na, na, sizeof(float)) || !ck_mul3(&nb, n_seq, ctx, wb) ||
        !ck_mul(&nb, nb, sizeof(float)) || !ck_add(&all, na, nb) || !ck_mul(&all, all, (size_t)kv->n_layers)) {
        free(kv);
        return ds_errorf(DS_ERR_RANGE, "a KV cache of %d sequences x %d positions x %d layers x (%lld + %lld) floats "
                         "overflows a size", n_seq, ctx, m->n_blocks, (long long)wa, (long long)wb);
    }
    *a = calloc((size_t)kv->n_layers, sizeof(float *));
    *b = calloc((size_t)kv->n_layers, sizeof(float *));
    if (!*a || !*b) goto oom;
    for (int i = 0; i < kv->n_layers; i++) {
        (*a)[i] = m->ops->alloc(na);
        (*b)[i] = m->ops->alloc(nb);
        if (!(*a)[i] || !(*b)[i]) goto oom;
    }
    *out = kv;
    return DS_OK;
oom:
    kvcache_free(kv);
    return ds_errorf(DS_ERR_NOMEM, "out of memory for a KV cache of %d sequences x %d positions (%.1f MiB)", n_seq,
                     ctx, (double)all / 1048576.0);
}

void kvcache_free(ds_kvcache *kv)
{
    if (!kv) return;
    ds_graph_slot(*slots[3])[DS_GRAPH_NMAX + 1] = {kv->dec, kv->dech, kv->mtp};
    for (int k = 0; k < 3; k++)
        for (int c = 0; c < 2; c++)
            for (int n = 0; n <= DS_GRAPH_NMAX; n++) {
                ds_graph_slot *d = &slots[k][c][n];
                if (d->graph) kv->ops->graph_free(d->graph);
                kv->ops->free(d->ids);
                kv->ops->free(d->logits);
                kv->ops->free(d->hin);
                kv->ops->free(d->hout);
            }
    float **bufs[4] = {kv->kv, kv->pe, kv->k, kv->v};
    for (int j = 0; j < 4; j++) {
        for (int i = 0; bufs[j] && i < kv->n_layers; i++) kv->ops->free(bufs[j][i]);
        free(bufs[j]);
    }
    free(kv);
}
