/* cast.c - the FP8 -> BF16 checkpoint cast.
 *
 * Shards are processed one at a time in name order (as the reference does).
 * For each shard the output header is declared from the input's tensor list
 * (FP8 weights become BF16 of the same shape, scales are dropped), then each
 * tensor streams: copies go straight from the mapping, FP8 weights are
 * dequantised in chunks of whole rows into one reusable buffer, rows in
 * parallel. A weight's scale may live in another shard (the index says where;
 * ckpt_find looks it up). */
#include "cast.h"

#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/numeric.h"
#include "base/progress.h"
#include "io/ckpt.h"
#include "io/convert.h"

#define CHUNK_BYTES (16u << 20) /* output bytes per parallel chunk */
#define CAST_MAX_THREADS 1024   /* more threads than any machine's cores only costs stacks */

void cast_dequant_rows(const uint8_t *w, const float *s, uint16_t *out, int64_t rows, int64_t cols,
                       int64_t r0, int64_t r1)
{
    const float *lut = fp8_e4m3_table();
    int64_t sc = (cols + 127) / 128;
    (void)rows;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * cols;
        const float *sr = s + (r / 128) * sc;
        uint16_t *o = out + (r - r0) * cols;
        for (int64_t c = 0; c < cols; c++) o[c] = f32_to_bf16(lut[wr[c]] * sr[c / 128]);
    }
}

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

/* The scale for FP8 weight t, checked; *sc = NULL if there is none. */
static ds_status find_scale(const ds_ckpt *c, const st_tensor *t, const cast_opts *o, const st_tensor **sc)
{
    char name[1024];
    *sc = NULL;
    if (snprintf(name, sizeof name, "%s_scale_inv", t->name) >= (int)sizeof name)
        return ds_errorf(DS_ERR_FORMAT, "tensor '%s': name too long", t->name);
    const st_tensor *s = ckpt_find(c, name);
    if (!s) {
        if (o->allow_missing_scale) return DS_OK;
        return ds_errorf(DS_ERR_FORMAT, "tensor '%s' is F8_E4M3 but the checkpoint has no '%s' "
                         "(--allow-missing-scale copies such weights through as FP8)", t->name, name);
    }
    char sh[128], ss[128];
    if (t->ndim != 2)
        return ds_errorf(DS_ERR_FORMAT, "tensor '%s': an FP8 weight must be 2-D, shape is %s", t->name,
                         st_shape_str(t, sh, sizeof sh));
    if (s->dtype != ST_F32 || s->ndim != 2 || s->shape[0] != (t->shape[0] + 127) / 128 ||
        s->shape[1] != (t->shape[1] + 127) / 128)
        return ds_errorf(DS_ERR_FORMAT, "tensor '%s': %s scale %s, expected F32 [%lld, %lld] for weight %s",
                         name, st_dtype_name(s->dtype), st_shape_str(s, ss, sizeof ss),
                         (long long)(t->shape[0] + 127) / 128, (long long)(t->shape[1] + 127) / 128,
                         st_shape_str(t, sh, sizeof sh));
    *sc = s;
    return DS_OK;
}

/* Dequantises t with scale s into w, chunk by chunk. The scales are copied
 * out first: safetensors data offsets need not be 4-aligned, so the mapping
 * cannot be read as float directly. */
static ds_status write_dequant(st_writer *w, const st_file *f, const st_tensor *t, const st_tensor *s,
                               uint16_t *buf, int64_t chunk_rows)
{
    float *sc = malloc(s->nbytes ? s->nbytes : 1);
    if (!sc) return ds_errorf(DS_ERR_NOMEM, "out of memory for the %llu-byte scale of '%s'",
                              (unsigned long long)s->nbytes, t->name);
    memcpy(sc, s->data, s->nbytes);
    int64_t rows = t->shape[0], cols = t->shape[1];
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
        int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
        #pragma omp parallel for schedule(static) if ((r1 - r0) * cols >= (1 << 18))
        for (int64_t r = r0; r < r1; r++)
            cast_dequant_rows(t->data, sc, buf + (r - r0) * cols, rows, cols, r, r + 1);
        ds_status st = st_writer_write(w, buf, (size_t)((r1 - r0) * cols) * 2);
        if (st) {
            free(sc);
            return st;
        }
        convert_release(f, (const uint8_t *)t->data + r0 * cols, (size_t)((r1 - r0) * cols));
    }
    free(sc);
    return DS_OK;
}

/* One output shard. */
static ds_status cast_file(const ds_ckpt *c, const st_file *f, const cast_opts *o, const char *out_path,
                           json_t *dropped, progress *pb)
{
    st_writer *w;
    ds_status s = st_writer_open(&w, out_path);
    if (s) return s;
    const st_tensor **scales = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *scales);
    uint16_t *buf = NULL;
    int64_t max_cols = 1;
    if (!scales) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    if (!s) s = st_writer_meta(w, "format", "pt");
    for (size_t i = 0; !s && i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        if (has_suffix(t->name, "_scale_inv")) { /* scales never reach the output */
            json_object_set_new(dropped, t->name, json_true());
            continue;
        }
        st_dtype dt = t->dtype;
        if (dt == ST_F8_E4M3) {
            if ((s = find_scale(c, t, o, &scales[i]))) break;
            if (scales[i]) {
                dt = ST_BF16;
                if (t->shape[1] > max_cols) max_cols = t->shape[1];
            } else {
                fprintf(stderr, "warning: missing scale_inv tensor for %s, copying it as FP8\n", t->name);
            }
        }
        s = st_writer_add(w, t->name, dt, t->ndim, t->shape);
    }
    /* Rows per chunk: enough for ~CHUNK_BYTES of output, at least one. */
    int64_t chunk_rows = (int64_t)(CHUNK_BYTES / 2) / max_cols;
    if (chunk_rows < 1) chunk_rows = 1;
    if (!s && !(buf = malloc((size_t)(chunk_rows * max_cols) * 2)))
        s = ds_errorf(DS_ERR_NOMEM, "out of memory for the %lld-byte dequantisation buffer",
                      (long long)(chunk_rows * max_cols) * 2);
    if (!s) s = st_writer_begin(w);
    for (size_t i = 0; !s && i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        if (has_suffix(t->name, "_scale_inv")) continue;
        if (scales[i]) s = write_dequant(w, f, t, scales[i], buf, chunk_rows);
        else s = convert_stream(&w, 1, f, t->data, t->nbytes);
        if (s) s = ds_error_prefix(s, "tensor '%s'", t->name);
        progress_add(pb, t->nbytes);
    }
    free(buf);
    free(scales);
    if (s) {
        st_writer_abort(w);
        return s;
    }
    return st_writer_finish(w);
}

/* The new index: the source's weight_map (or one built from the shards) in
 * its order, less the dropped scales (all of them: an orphan scale is not in
 * the output either), written as json.dump(indent=2) does. */
static ds_status write_index(const ds_ckpt *c, const cast_opts *o, json_t *dropped, out_txn *t)
{
    char *ip = ckpt_join(o->in_dir, "model.safetensors.index.json");
    const char *op = "model.safetensors.index.json";
    json_t *wm = NULL, *root = NULL;
    ds_status s = DS_OK;
    struct stat sb;
    if (!ip) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    else if (stat(ip, &sb) == 0) {
        s = ckpt_load_json(ip, FILE_MAX_INDEX, "checkpoint index", JSON_REJECT_DUPLICATES, &root);
        wm = json_object_get(root, "weight_map");
        if (!s && !json_is_object(wm)) s = ds_errorf(DS_ERR_FORMAT, "%s: no \"weight_map\" object", ip);
        wm = s ? NULL : json_deep_copy(wm);
    } else {
        wm = json_object();
        for (size_t fi = 0; wm && fi < c->n_files; fi++) {
            const char *base = strrchr(c->files[fi]->path, '/');
            base = base ? base + 1 : c->files[fi]->path;
            for (size_t ti = 0; ti < c->files[fi]->n_tensors; ti++)
                json_object_set_new(wm, c->files[fi]->tensors[ti].name, json_string(base));
        }
    }
    if (!s) {
        const char *k;
        json_t *v;
        json_object_foreach(dropped, k, v) json_object_del(wm, k);
        json_t *out = json_object();
        json_object_set_new(out, "metadata", json_object());
        json_object_set(out, "weight_map", wm);
        char *text = json_dumps(out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(out);
        s = text ? convert_write_file(t, op, text, strlen(text)) : ds_errorf(DS_ERR_NOMEM, "out of memory");
        free(text);
    }
    json_decref(wm);
    json_decref(root);
    free(ip);
    return s;
}

/* config.json without quantization_config: the output is not FP8. */
static ds_status write_config(const cast_opts *o, out_txn *t)
{
    char *ip = ckpt_join(o->in_dir, "config.json");
    ds_status s = DS_OK;
    struct stat sb;
    if (!ip) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    else if (stat(ip, &sb) == 0) {
        json_t *root = NULL;
        s = ckpt_load_json(ip, FILE_MAX_CONFIG, "config", 0, &root);
        if (!s && !json_is_object(root)) s = ds_errorf(DS_ERR_FORMAT, "%s: not a JSON object", ip);
        else if (!s) {
            json_object_del(root, "quantization_config");
            char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            s = text ? convert_write_file(t, "config.json", text, strlen(text))
                     : ds_errorf(DS_ERR_NOMEM, "out of memory");
            free(text);
        }
        json_decref(root);
    }
    free(ip);
    return s;
}

static int cmp_path(const void *a, const void *b)
{
    return strcmp((*(st_file *const *)a)->path, (*(st_file *const *)b)->path);
}

ds_status cast_bf16_checkpoint(const cast_opts *o)
{
    if (o->threads < 0 || o->threads > CAST_MAX_THREADS)
        return ds_errorf(DS_ERR_ARG, "--threads is %d but must be in [0, %d] (0: one per core)", o->threads,
                         CAST_MAX_THREADS);
    if (o->threads > 0) omp_set_num_threads(o->threads);
    if (!o->in_place && txn_same_file(o->in_dir, o->out_dir))
        return ds_errorf(DS_ERR_ARG, "--output-bf16-hf-path is the input directory %s: pass --in-place to "
                         "replace the input shards (only once the whole output is written)", o->in_dir);
    ds_ckpt *c;
    ds_status s = ckpt_open_dir(&c, o->in_dir);
    if (s) return s;
    st_file **files = malloc(c->n_files * sizeof *files + 1);
    out_txn *t = NULL;
    json_t *dropped = json_object();
    if (!files || !dropped) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
    uint64_t total = 0;
    for (size_t i = 0; !s && i < c->n_files; i++) {
        files[i] = c->files[i];
        total += files[i]->size;
    }
    if (!s) qsort(files, c->n_files, sizeof *files, cmp_path);
    if (!s) s = txn_begin(&t, o->out_dir, "--output-bf16-hf-path");
    progress pb;
    progress_init(&pb, "cast-bf16", total, o->progress);
    for (size_t i = 0; !s && i < c->n_files; i++) {
        const char *base = strrchr(files[i]->path, '/');
        char *op = txn_path(t, base ? base + 1 : files[i]->path);
        s = op ? cast_file(c, files[i], o, op, dropped, &pb) : ds_errorf(DS_ERR_NOMEM, "out of memory");
        free(op);
    }
    progress_done(&pb);
    if (!s) s = write_index(c, o, dropped, t);
    if (!s) s = write_config(o, t);
    if (!s) s = convert_copy_tokenizer(t, o->in_dir);
    if (!s) s = txn_commit(t);
    else txn_abort(t);
    json_decref(dropped);
    free(files);
    ckpt_close(c);
    return s;
}
