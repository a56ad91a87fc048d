/* test_bad_input.c - a checkpoint missing a tensor, a tensor of the wrong shape
 * or dtype, a config that does not match the checkpoint, a token id outside
 * the vocabulary, a sequence longer than max_seq_len, a KV cache whose size
 * overflows: each is a clear error naming the tensor, field or value, never a
 * crash. */
#include <limits.h>
#include <string.h>

#include "io/ckpt.h"
#include "model/model.h"
#include "test.h"

/* Under AddressSanitizer an allocation that cannot be met returns NULL, as
 * malloc does, rather than ending the test. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

typedef enum { EDIT_DROP, EDIT_RESHAPE, EDIT_DTYPE } edit_kind;

/* Copies golden tiny_hf into a single-file checkpoint with one tensor edited. */
static const char *edited_copy(const char *victim, edit_kind kind)
{
    ds_ckpt *c;
    CHECK_OK(ckpt_open_dir(&c, t_golden("tiny_hf")));
    const char *dir = t_tmpdir("bad");
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_writer *w;
    CHECK_OK(st_writer_open(&w, path));
    for (size_t fi = 0; fi < c->n_files; fi++)
        for (size_t i = 0; i < c->files[fi]->n_tensors; i++) {
            const st_tensor *t = &c->files[fi]->tensors[i];
            int64_t shape[8];
            memcpy(shape, t->shape, sizeof shape);
            st_dtype dt = t->dtype;
            if (!strcmp(t->name, victim)) {
                if (kind == EDIT_DROP) continue;
                if (kind == EDIT_RESHAPE) { shape[0] = t->shape[1]; shape[1] = t->shape[0]; }
                if (kind == EDIT_DTYPE) dt = ST_I16; /* same size as BF16 */
            }
            CHECK_OK(st_writer_add(w, t->name, dt, t->ndim, shape));
        }
    CHECK_OK(st_writer_begin(w));
    for (size_t fi = 0; fi < c->n_files; fi++)
        for (size_t i = 0; i < c->files[fi]->n_tensors; i++) {
            const st_tensor *t = &c->files[fi]->tensors[i];
            if (kind == EDIT_DROP && !strcmp(t->name, victim)) continue;
            CHECK_OK(st_writer_write(w, t->data, t->nbytes));
        }
    CHECK_OK(st_writer_finish(w));
    ckpt_close(c);
    return dir;
}

static void expect_load_error(const char *dir, const ds_config *cfg, const char *needle, const char *label)
{
    ds_model *m = NULL;
    ds_status s = model_load(&m, dir, cfg, NULL);
    CHECK_MSG(s != DS_OK, "%s: load succeeded", label);
    CHECK_MSG(strstr(ds_last_error(), needle) != NULL, "%s: message '%s' does not name '%s'", label, ds_last_error(),
              needle);
    model_free(m);
    if (strstr(dir, "/dsv3-bad-")) t_system("rm -rf %s", dir);
}

int main(void)
{
    ds_config cfg;
    CHECK_OK(config_load(&cfg, t_golden("config_tiny.json")));
    expect_load_error(edited_copy("model.layers.2.mlp.experts.5.up_proj.weight", EDIT_DROP), &cfg,
                      "model.layers.2.mlp.experts.5.up_proj.weight", "missing expert weight");
    expect_load_error(edited_copy("model.layers.1.self_attn.q_b_proj.weight_scale_inv", EDIT_DROP), &cfg,
                      "q_b_proj.weight_scale_inv", "missing FP8 scale");
    expect_load_error(edited_copy("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", EDIT_RESHAPE), &cfg,
                      "model.layers.0.self_attn.kv_a_proj_with_mqa.weight' has shape [256, 160]", "transposed weight");
    expect_load_error(edited_copy("model.layers.3.input_layernorm.weight", EDIT_DTYPE), &cfg,
                      "model.layers.3.input_layernorm.weight' has dtype I16", "wrong dtype");
    /* a config that does not match: one more layer, a wider kv_lora_rank */
    ds_config c2 = cfg;
    c2.n_layers = 5;
    expect_load_error(t_golden("tiny_hf"), &c2, "model.layers.4.", "extra layer in config");
    c2 = cfg;
    c2.kv_lora_rank = 64;
    expect_load_error(t_golden("tiny_hf"), &c2, "kv_a_proj_with_mqa.weight' has shape [160, 256]", "kv_lora_rank");
    c2 = cfg;
    c2.n_routed_experts = 32;
    c2.n_expert_groups = 4;
    expect_load_error(t_golden("tiny_hf"), &c2, "gate.weight' has shape [16, 256]", "n_routed_experts");

    /* token ids and lengths at run time */
    ds_model *m;
    CHECK_OK(model_load(&m, t_golden("tiny_hf"), &cfg, NULL));
    if (t_failures) return t_done("bad_input");
    ds_kvcache *kv;
    CHECK(kvcache_new(&kv, m, 1, cfg.max_seq_len + 1) == DS_ERR_RANGE);
    CHECK(strstr(ds_last_error(), "max_seq_len") != NULL);
    /* a cache whose bytes overflow 64 bits: (2^31 - 1) x 2^24 x (128 + 32) floats x 4 layers */
    m->cfg.max_seq_len = 1 << 24;
    CHECK(kvcache_new(&kv, m, INT_MAX, 1 << 24) == DS_ERR_RANGE);
    CHECK_MSG(strstr(ds_last_error(), "overflows") != NULL, "%s", ds_last_error());
    /* one no machine can hold, 2^57 bytes a layer: out of memory, saying for what and how much */
    CHECK(kvcache_new(&kv, m, 1 << 24, 1 << 24) == DS_ERR_NOMEM);
    CHECK_MSG(strstr(ds_last_error(), "KV cache of 16777216 sequences") && strstr(ds_last_error(), " MiB"), "%s",
              ds_last_error());
    m->cfg.max_seq_len = cfg.max_seq_len;
    CHECK_OK(kvcache_new(&kv, m, 1, 4));
    int32_t tok[2] = {5, 1024};
    int seq[2] = {0, 0}, pos[2] = {0, 1};
    bool want[2] = {false, true};
    float *lg = malloc(sizeof(float) * 1024);
    CHECK(model_forward(m, kv, 2, tok, seq, pos, want, lg) == DS_ERR_RANGE);
    CHECK_MSG(strstr(ds_last_error(), "token id 1024") != NULL, "%s", ds_last_error());
    tok[1] = -3;
    CHECK(model_forward(m, kv, 2, tok, seq, pos, want, lg) == DS_ERR_RANGE);
    tok[1] = 7;
    pos[1] = 4;
    CHECK(model_forward(m, kv, 2, tok, seq, pos, want, lg) == DS_ERR_RANGE);
    CHECK_MSG(strstr(ds_last_error(), "position 4") != NULL, "%s", ds_last_error());
    kvcache_free(kv);
    model_free(m);
    free(lg);

    /* through the CLI: exit codes and messages */
    CHECK(t_system("%s logits --ckpt-path %s --config %s --tokens 1,2,99999 --out /dev/null 2>/dev/null", t_bin(),
                   t_golden("tiny_hf"), t_golden("config_tiny.json")) == 1);
    CHECK(t_system("%s logits --ckpt-path %s --config %s --tokens 1,x --out /dev/null 2>/dev/null", t_bin(),
                   t_golden("tiny_hf"), t_golden("config_tiny.json")) == 2);
    CHECK(t_system("%s logits --ckpt-path /nonexistent --config %s --tokens 1 --out /dev/null 2>/dev/null", t_bin(),
                   t_golden("config_tiny.json")) == 1);
    return t_done("bad_input");
}
