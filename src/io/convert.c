/* convert.c - HF checkpoint -> model{rank}-mp{mp}.safetensors, as convert.py does.
 *
 * Two passes. The plan pass walks every tensor of every shard (in file and
 * offset order, so reading is sequential), maps its name, decides which ranks
 * get it and with what shape, and checks divisibility and expert indices: all
 * errors surface before any byte is written. The data pass keeps the mp
 * writers open (each declared the full tensor list up front, as the header
 * needs) and streams each source tensor's slices straight from the mapping.
 *
 * Differences from convert.py, all deliberate: MTP layers are dropped by index
 * (>= num_hidden_layers of config.json) instead of the fixed "model.layers.61",
 * and --keep-mtp keeps them, names mapped as the rest;
 * an expert index outside [0, n_experts) or n_experts % mp != 0 is an error
 * instead of silently dropping tensors; config.json is copied too. */
#include "convert.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/progress.h"
#include "base/strmap.h"
#include "io/ckpt.h"

/* ---- file helpers ---- */

ds_status convert_write_file(out_txn *t, const char *name, const char *data, size_t len)
{
    char *path = txn_path(t, name);
    ds_status s = path ? txn_write_file(path, data, len) : ds_errorf(DS_ERR_NOMEM, "out of memory");
    free(path);
    return s;
}

ds_status convert_copy_file(out_txn *t, const char *src, const char *name)
{
    char *path = txn_path(t, name);
    ds_status s = path ? txn_copy_file(src, path) : ds_errorf(DS_ERR_NOMEM, "out of memory");
    free(path);
    return s;
}

ds_status convert_copy_tokenizer(out_txn *t, const char *src_dir)
{
    DIR *d = opendir(src_dir);
    if (!d) return ds_errorf(DS_ERR_IO, "%s: cannot open directory: %s", src_dir, strerror(errno));
    struct dirent *e;
    ds_status s = DS_OK;
    while (!s && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !strstr(e->d_name, "token")) continue;
        char *src = ckpt_join(src_dir, e->d_name);
        struct stat sb;
        /* links are followed (Hugging Face snapshots link into a blob store);
         * directories are skipped; a FIFO or device is an error, not a hang */
        if (!src) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
        else if (stat(src, &sb) == 0 && S_ISREG(sb.st_mode)) s = convert_copy_file(t, src, e->d_name);
        else if (stat(src, &sb) == 0 && !S_ISDIR(sb.st_mode))
            s = ds_errorf(DS_ERR_IO, "%s: tokenizer file is %s, not a regular file", src, file_kind(sb.st_mode));
        free(src);
    }
    closedir(d);
    return s;
}

void convert_release(const st_file *f, const void *p, size_t n)
{
    if (!f->map || !n) return;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), base = (uintptr_t)f->map, end = base + f->size;
    uintptr_t a = (uintptr_t)p & ~(pg - 1), b = ((uintptr_t)p + n + pg - 1) & ~(pg - 1);
    if (a < base) a = base; /* mmap returns page-aligned memory: base is aligned */
    if (b > end) b = (end + pg - 1) & ~(pg - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

ds_status convert_stream(st_writer *const *w, int n_w, const st_file *f, const void *p, uint64_t n)
{
    const uint8_t *b = p;
    for (uint64_t off = 0; off < n; off += CONVERT_RELEASE_BYTES) {
        size_t len = (size_t)(n - off < CONVERT_RELEASE_BYTES ? n - off : CONVERT_RELEASE_BYTES);
        for (int i = 0; i < n_w; i++) {
            ds_status s = st_writer_write(w[i], b + off, len);
            if (s) return s;
        }
        convert_release(f, b + off, len);
    }
    return DS_OK;
}

/* ---- names ---- */

static const struct { const char *key, *new_key; int dim; } k_mapping[] = {
    {"embed_tokens", "embed", 0}, {"input_layernorm", "attn_norm", -1},
    {"post_attention_layernorm", "ffn_norm", -1}, {"q_proj", "wq", 0}, {"q_a_proj", "wq_a", -1},
    {"q_a_layernorm", "q_norm", -1}, {"q_b_proj", "wq_b", 0}, {"kv_a_proj_with_mqa", "wkv_a", -1},
    {"kv_a_layernorm", "kv_norm", -1}, {"kv_b_proj", "wkv_b", 0}, {"o_proj", "wo", 1},
    {"gate", "gate", -1}, {"gate_proj", "w1", 0}, {"down_proj", "w2", 1}, {"up_proj", "w3", 0},
    {"norm", "norm", -1}, {"lm_head", "head", 0}, {"scale", "scale", -1},
    /* the MTP module (--keep-mtp; convert.py drops it): enorm, hnorm and eh_proj whole
     * on every rank, shared_head.head split by vocabulary as the output head is;
     * shared_head.norm and embed_tokens take the entries above */
    {"enorm", "enorm", -1}, {"hnorm", "hnorm", -1}, {"eh_proj", "eh_proj", -1}, {"head", "head", 0},
};

/* Python's s.replace(from, to): every non-overlapping occurrence, left to right. Frees s. */
static char *replace_all(char *s, const char *from, const char *to)
{
    if (!s) return NULL;
    size_t fl = strlen(from), tl = strlen(to), cnt = 0;
    for (const char *p = s; (p = strstr(p, from)); p += fl) cnt++;
    if (!cnt) return s;
    char *r = malloc(strlen(s) + cnt * tl - cnt * fl + 1), *w = r;
    if (r) {
        const char *p = s, *q;
        while ((q = strstr(p, from))) {
            memcpy(w, p, (size_t)(q - p));
            w += q - p;
            memcpy(w, to, tl);
            w += tl;
            p = q + fl;
        }
        strcpy(w, p);
    }
    free(s);
    return r;
}

ds_status convert_name(const char *hf, char **out, int *shard_dim)
{
    char *n = strdup(strncmp(hf, "model.", 6) ? hf : hf + 6);
    n = replace_all(n, "self_attn", "attn");
    n = replace_all(n, "mlp", "ffn");
    n = replace_all(n, "weight_scale_inv", "scale");
    n = replace_all(n, "e_score_correction_bias", "bias");
    if (!n) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    /* key = name.split(".")[-2] */
    const char *last = strrchr(n, '.');
    if (!last) {
        free(n);
        return ds_errorf(DS_ERR_FORMAT, "tensor '%s': name has no '.', so no parameter key", hf);
    }
    const char *kb = last;
    while (kb > n && kb[-1] != '.') kb--;
    char key[128];
    size_t kl = (size_t)(last - kb);
    if (kl >= sizeof key) kl = sizeof key - 1;
    memcpy(key, kb, kl);
    key[kl] = 0;
    for (size_t i = 0; i < sizeof k_mapping / sizeof *k_mapping; i++) {
        if (strcmp(key, k_mapping[i].key)) continue;
        *shard_dim = k_mapping[i].dim;
        if (!(*out = replace_all(n, key, k_mapping[i].new_key))) return ds_errorf(DS_ERR_NOMEM, "out of memory");
        return DS_OK;
    }
    free(n);
    return ds_errorf(DS_ERR_FORMAT, "tensor '%s': parameter key '%s' is not one the reference model knows "
                     "(convert.py's mapping)", hf, key);
}

/* ---- plan ---- */

typedef struct {
    const st_tensor *t;
    const st_file *f;
    char *name;  /* reference name */
    int dim;     /* shard dimension, -1 for a whole tensor */
    int rank;    /* the only rank holding it (routed expert), or -1 for all */
} plan_item;

typedef struct {
    plan_item *items;
    size_t n;
    uint64_t out_bytes; /* summed over ranks, for the progress bar */
} plan;

static void plan_free(plan *p)
{
    for (size_t i = 0; i < p->n; i++) free(p->items[i].name);
    free(p->items);
}

/* num_hidden_layers and n_routed_experts of dir/config.json; -1 where absent. */
static ds_status read_hf_config(const char *dir, int *n_layers, int *n_routed)
{
    *n_layers = *n_routed = -1;
    char *path = ckpt_join(dir, "config.json");
    if (!path) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    struct stat sb;
    ds_status s = DS_OK;
    if (stat(path, &sb) == 0) {
        json_t *root = NULL;
        s = ckpt_load_json(path, FILE_MAX_CONFIG, "config", 0, &root);
        if (!s && !json_is_object(root)) {
            s = ds_errorf(DS_ERR_FORMAT, "%s: not a JSON object", path);
        } else if (!s) {
            json_t *l = json_object_get(root, "num_hidden_layers"), *x = json_object_get(root, "n_routed_experts");
            if (l && (!json_is_integer(l) || json_integer_value(l) < 0 || json_integer_value(l) > 1000000))
                s = ds_errorf(DS_ERR_FORMAT, "%s: \"num_hidden_layers\" must be a non-negative integer", path);
            else if (x && !json_is_null(x) &&
                     (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 1000000))
                s = ds_errorf(DS_ERR_FORMAT, "%s: \"n_routed_experts\" must be a non-negative integer", path);
            if (!s && l) *n_layers = (int)json_integer_value(l);
            if (!s && json_is_integer(x)) *n_routed = (int)json_integer_value(x);
        }
        json_decref(root);
    }
    free(path);
    return s;
}

/* Parses a non-negative decimal integer occupying [p, end). */
static int parse_index(const char *p, const char *end, long *v)
{
    if (p == end || end - p > 9) return 0;
    long x = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9') return 0;
        x = x * 10 + (*p - '0');
    }
    *v = x;
    return 1;
}

/* The layer index of "model.layers.N....", or -1. */
static long layer_of(const char *hf)
{
    if (strncmp(hf, "model.layers.", 13)) return -1;
    const char *p = hf + 13, *e = strchr(p, '.');
    long v;
    return e && parse_index(p, e, &v) ? v : -1;
}

/* The expert index of a routed-expert name (name.split(".")[-3]). */
static ds_status expert_of(const char *hf, const char *name, long *idx)
{
    const char *e = strrchr(name, '.');
    const char *b = e;
    while (b && b > name && b[-1] != '.') b--;
    const char *ie = b && b > name ? b - 1 : NULL, *ib = ie;
    while (ib && ib > name && ib[-1] != '.') ib--;
    if (!ie || !parse_index(ib, ie, idx))
        return ds_errorf(DS_ERR_FORMAT, "tensor '%s': looks like a routed expert but has no expert index "
                         "before its parameter name", hf);
    return DS_OK;
}

static ds_status plan_item_check(const convert_opts *o, plan_item *it, const char *hf)
{
    const st_tensor *t = it->t;
    if (strstr(it->name, "experts") && !strstr(it->name, "shared_experts")) {
        long idx = 0;
        ds_status s = expert_of(hf, it->name, &idx);
        if (s) return s;
        if (idx >= o->n_experts)
            return ds_errorf(DS_ERR_ARG, "tensor '%s': expert %ld, but --n-experts is %d", hf, idx, o->n_experts);
        it->rank = (int)(idx / (o->n_experts / o->mp));
        it->dim = -1;
        return DS_OK;
    }
    if (it->dim < 0) return DS_OK;
    char sh[128];
    if (it->dim >= t->ndim)
        return ds_errorf(DS_ERR_FORMAT, "tensor '%s': shape %s has no dimension %d to shard", hf,
                         st_shape_str(t, sh, sizeof sh), it->dim);
    if (t->shape[it->dim] % o->mp)
        return ds_errorf(DS_ERR_ARG, "tensor '%s': dimension %d of shape %s is not divisible by "
                         "--model-parallel %d", hf, it->dim, st_shape_str(t, sh, sizeof sh), o->mp);
    return DS_OK;
}

static ds_status make_plan(const convert_opts *o, const ds_ckpt *c, int n_layers, plan *p)
{
    p->items = calloc(c->n_tensors ? c->n_tensors : 1, sizeof *p->items);
    if (!p->items) return ds_errorf(DS_ERR_NOMEM, "out of memory planning %zu tensors", c->n_tensors);
    for (size_t fi = 0; fi < c->n_files; fi++) {
        const st_file *f = c->files[fi];
        for (size_t ti = 0; ti < f->n_tensors; ti++) {
            const st_tensor *t = &f->tensors[ti];
            long layer = layer_of(t->name);
            if (!o->keep_mtp && n_layers >= 0 && layer >= n_layers) continue;
            plan_item *it = &p->items[p->n];
            *it = (plan_item){.t = t, .f = f, .rank = -1};
            ds_status s = convert_name(t->name, &it->name, &it->dim);
            if (s) return s;
            p->n++;
            if ((s = plan_item_check(o, it, t->name))) return ds_error_prefix(s, "%s", f->path);
            p->out_bytes += it->rank >= 0 || it->dim >= 0 ? t->nbytes : t->nbytes * (uint64_t)o->mp;
        }
    }
    /* Two HF names must not map to one reference name. */
    strmap seen = {0};
    ds_status s = DS_OK;
    for (size_t i = 0; !s && i < p->n; i++) {
        ds_status r = strmap_put(&seen, p->items[i].name, p->items[i].name);
        if (r == DS_ERR_ARG)
            s = ds_errorf(DS_ERR_FORMAT, "tensor '%s': maps to '%s', which another tensor already maps to",
                          p->items[i].t->name, p->items[i].name);
        else if (r) s = r;
    }
    strmap_free(&seen);
    return s;
}

/* ---- data ---- */

static ds_status declare(st_writer **w, int mp, const plan *p)
{
    for (int r = 0; r < mp; r++) {
        ds_status s = st_writer_meta(w[r], "format", "pt");
        for (size_t i = 0; !s && i < p->n; i++) {
            const plan_item *it = &p->items[i];
            if (it->rank >= 0 && it->rank != r) continue;
            int64_t shape[ST_MAX_DIMS];
            memcpy(shape, it->t->shape, sizeof shape);
            if (it->rank < 0 && it->dim >= 0) shape[it->dim] /= mp;
            s = st_writer_add(w[r], it->name, it->t->dtype, it->t->ndim, shape);
        }
        if (!s) s = st_writer_begin(w[r]);
        if (s) return s;
    }
    return DS_OK;
}

/* Writes every rank's slice of t along dim: for each of the `outer` leading
 * index combinations, rank r gets the contiguous run of sub-blocks
 * [r*n/mp, (r+1)*n/mp). Source pages are released as they are passed. */
static ds_status write_slices(st_writer **w, const st_file *f, const st_tensor *t, int dim, int mp)
{
    uint64_t outer = 1, inner = st_dtype_size(t->dtype);
    for (int d = 0; d < dim; d++) outer *= (uint64_t)t->shape[d];
    for (int d = dim + 1; d < t->ndim; d++) inner *= (uint64_t)t->shape[d];
    uint64_t n = (uint64_t)t->shape[dim], sz = n / (uint64_t)mp, row = n * inner, done = 0;
    const uint8_t *src = t->data;
    for (uint64_t o = 0; o < outer; o++) {
        for (int r = 0; r < mp; r++) {
            const uint8_t *piece = src + o * row + (uint64_t)r * sz * inner;
            ds_status s = convert_stream(&w[r], 1, f, piece, sz * inner);
            if (s) return s;
        }
        if ((o + 1) * row - done >= CONVERT_RELEASE_BYTES || o + 1 == outer) {
            convert_release(f, src + done, (size_t)((o + 1) * row - done));
            done = (o + 1) * row;
        }
    }
    return DS_OK;
}

static ds_status stream_data(st_writer **w, int mp, const plan *p, progress *pb)
{
    for (size_t i = 0; i < p->n; i++) {
        const plan_item *it = &p->items[i];
        const st_tensor *t = it->t;
        ds_status s;
        if (it->rank >= 0) s = convert_stream(&w[it->rank], 1, it->f, t->data, t->nbytes);
        else if (it->dim < 0) s = convert_stream(w, mp, it->f, t->data, t->nbytes);
        else s = write_slices(w, it->f, t, it->dim, mp);
        if (s) return s;
        progress_add(pb, it->rank >= 0 || it->dim >= 0 ? t->nbytes : t->nbytes * (uint64_t)mp);
    }
    return DS_OK;
}

static ds_status check_opts(const convert_opts *o, int n_routed)
{
    /* one open output file per rank; 1024 is the usual descriptor limit */
    if (o->mp < 1 || o->mp > 1024)
        return ds_errorf(DS_ERR_ARG, "--model-parallel is %d but must be in [1, 1024]", o->mp);
    if (o->n_experts < 1 || o->n_experts > (1 << 16))
        return ds_errorf(DS_ERR_ARG, "--n-experts is %d but must be in [1, 65536] (as n_routed_experts)", o->n_experts);
    if (o->n_experts % o->mp)
        return ds_errorf(DS_ERR_ARG, "--n-experts %d is not divisible by --model-parallel %d", o->n_experts, o->mp);
    if (n_routed >= 0 && n_routed != o->n_experts)
        return ds_errorf(DS_ERR_ARG, "--n-experts is %d but %s/config.json has n_routed_experts %d",
                         o->n_experts, o->hf_dir, n_routed);
    return DS_OK;
}

/* Writes all rank files into the transaction's directory. */
static ds_status write_ranks(const convert_opts *o, const plan *p, out_txn *t)
{
    int mp = o->mp;
    st_writer **w = calloc((size_t)mp, sizeof *w);
    if (!w) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    ds_status s = DS_OK;
    for (int r = 0; !s && r < mp; r++) {
        char fn[64];
        snprintf(fn, sizeof fn, "model%d-mp%d.safetensors", r, mp);
        char *path = txn_path(t, fn);
        s = path ? st_writer_open(&w[r], path) : ds_errorf(DS_ERR_NOMEM, "out of memory");
        free(path);
    }
    if (!s) s = declare(w, mp, p);
    progress pb;
    progress_init(&pb, "convert", p->out_bytes, o->progress);
    if (!s) s = stream_data(w, mp, p, &pb);
    progress_done(&pb);
    for (int r = 0; r < mp; r++) {
        if (s) st_writer_abort(w[r]);
        else s = st_writer_finish(w[r]);
    }
    free(w);
    return s;
}

ds_status convert_checkpoint(const convert_opts *o)
{
    int n_layers, n_routed;
    ds_status s = read_hf_config(o->hf_dir, &n_layers, &n_routed);
    if (s || (s = check_opts(o, n_routed))) return s;
    if (!o->in_place && txn_same_file(o->hf_dir, o->save_dir))
        return ds_errorf(DS_ERR_ARG, "--save-path is the input directory %s: pass --in-place to write the "
                         "shards beside the input (its config.json and tokenizer files are then replaced)", o->hf_dir);
    ds_ckpt *c = NULL;
    if ((s = ckpt_open_dir(&c, o->hf_dir))) return s;
    plan p = {0};
    out_txn *t = NULL;
    s = make_plan(o, c, n_layers, &p);
    if (!s) s = txn_begin(&t, o->save_dir, "--save-path");
    if (!s) s = write_ranks(o, &p, t);
    if (!s) s = convert_copy_tokenizer(t, o->hf_dir);
    if (!s) {
        char *src = ckpt_join(o->hf_dir, "config.json");
        struct stat sb;
        if (!src) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
        else if (stat(src, &sb) == 0) s = convert_copy_file(t, src, "config.json");
        free(src);
    }
    if (!s) s = txn_commit(t);
    else txn_abort(t);
    plan_free(&p);
    ckpt_close(c);
    return s;
}
