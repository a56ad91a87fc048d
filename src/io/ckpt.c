/* ckpt.c - multi-shard checkpoints: the index file, shard listing, name lookup. */
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/strmap.h"

typedef struct {
    strmap by_name;  /* name -> st_tensor* */
    strmap owner;    /* name -> st_file* */
} ckpt_priv;

char *ckpt_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int ckpt_safe_name(const char *name)
{
    return name[0] && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

ds_status ckpt_list_shards(const char *dir, char ***names, size_t *n)
{
    DIR *d = opendir(dir);
    if (!d) return ds_errorf(DS_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    size_t cnt = 0, cap = 16;
    char **v = malloc(cap * sizeof *v);
    struct dirent *e;
    ds_status s = DS_OK;
    while (v && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !has_suffix(e->d_name, ".safetensors")) continue;
        if (cnt == cap) {
            char **nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) break;
            v = nv;
        }
        if (!(v[cnt] = strdup(e->d_name))) break;
        cnt++;
    }
    closedir(d);
    if (!v || e) {
        for (size_t i = 0; v && i < cnt; i++) free(v[i]);
        free(v);
        return ds_errorf(DS_ERR_NOMEM, "%s: out of memory listing shards", dir);
    }
    qsort(v, cnt, sizeof *v, cmp_str);
    *names = v;
    *n = cnt;
    return s;
}

static ds_status ckpt_new(ds_ckpt **out, const char *dir, size_t n_files)
{
    ds_ckpt *c = calloc(1, sizeof *c);
    if (!c || !(c->priv = calloc(1, sizeof(ckpt_priv))) || !(c->dir = strdup(dir)) ||
        !(c->files = calloc(n_files ? n_files : 1, sizeof *c->files))) {
        ckpt_close(c);
        return ds_errorf(DS_ERR_NOMEM, "%s: out of memory", dir);
    }
    *out = c;
    return DS_OK;
}

/* Opens paths[i] as shard i and indexes its tensors. */
static ds_status add_file(ds_ckpt *c, const char *path)
{
    st_file *f;
    ds_status s = st_open(&f, path);
    if (s) return s;
    c->files[c->n_files++] = f;
    ckpt_priv *p = c->priv;
    for (size_t i = 0; i < f->n_tensors; i++) {
        st_tensor *t = &f->tensors[i];
        st_file *prev = strmap_get(&p->owner, t->name);
        if (prev)
            return ds_errorf(DS_ERR_FORMAT, "tensor '%s' appears in both %s and %s", t->name, prev->path,
                             f->path);
        if (strmap_put(&p->by_name, t->name, t) || strmap_put(&p->owner, t->name, f))
            return ds_errorf(DS_ERR_NOMEM, "out of memory indexing %s", path);
        c->n_tensors++;
    }
    return DS_OK;
}

ds_status ckpt_open_files(ds_ckpt **out, const char *const *paths, size_t n)
{
    ds_ckpt *c;
    ds_status s = ckpt_new(&c, n ? paths[0] : ".", n);
    for (size_t i = 0; !s && i < n; i++) s = add_file(c, paths[i]);
    if (s) {
        ckpt_close(c);
        return s;
    }
    *out = c;
    return DS_OK;
}

/* Reads the index's weight_map: the distinct shard names (in first-seen order)
 * and the name -> shard pairs to verify after opening. */
ds_status ckpt_load_json(const char *path, size_t max, const char *what, size_t flags, json_t **out)
{
    char *buf;
    size_t n;
    *out = NULL;
    ds_status s = file_read(path, max, what, &buf, &n);
    if (s) return s;
    json_error_t e;
    *out = json_loadb(buf, n, flags, &e);
    free(buf);
    if (!*out) return ds_errorf(DS_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", path, e.text, e.line);
    return DS_OK;
}

static ds_status check_index(json_t *root, const char *path, json_t **map_out);

ds_status ckpt_parse_index(const char *text, size_t len, const char *label, json_t **map_out)
{
    json_error_t e;
    *map_out = NULL;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
    if (!root) return ds_errorf(DS_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", label, e.text, e.line);
    return check_index(root, label, map_out);
}

static ds_status read_index(const char *path, json_t **map_out)
{
    json_t *root;
    ds_status s = ckpt_load_json(path, FILE_MAX_INDEX, "checkpoint index", JSON_REJECT_DUPLICATES, &root);
    return s ? s : check_index(root, path, map_out);
}

/* Takes root; on success *map_out holds a reference to its weight_map. */
static ds_status check_index(json_t *root, const char *path, json_t **map_out)
{
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(root);
        return ds_errorf(DS_ERR_FORMAT, "%s: missing \"weight_map\" object", path);
    }
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
        if (!json_is_string(v)) {
            /* format before the decref: k points into root */
            ds_status s = ds_errorf(DS_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name string", path, k);
            json_decref(root);
            return s;
        }
        if (!ckpt_safe_name(json_string_value(v))) {
            ds_status s = ds_errorf(DS_ERR_FORMAT, "%s: weight_map entry '%s' names '%s', which is not a "
                                    "plain file name inside the checkpoint directory", path, k,
                                    json_string_value(v));
            json_decref(root);
            return s;
        }
    }
    json_incref(wm);
    json_decref(root);
    *map_out = wm;
    return DS_OK;
}

ds_status ckpt_open_dir(ds_ckpt **out, const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) || !S_ISDIR(sb.st_mode))
        return ds_errorf(DS_ERR_IO, "%s: not a directory", dir);
    char *index_path = ckpt_join(dir, "model.safetensors.index.json");
    if (!index_path) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    ds_status s = DS_OK;
    ds_ckpt *c = NULL;
    if (stat(index_path, &sb) == 0) {
        json_t *wm = NULL;
        if ((s = read_index(index_path, &wm))) goto out;
        /* distinct file names, first-seen order */
        size_t n = 0, cap = json_object_size(wm);
        const char **names = calloc(cap ? cap : 1, sizeof *names);
        strmap seen = {0};
        const char *k;
        json_t *v;
        if (!names) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
        json_object_foreach(wm, k, v) {
            const char *fn = json_string_value(v);
            if (s || strmap_get(&seen, fn)) continue;
            if ((s = strmap_put(&seen, fn, (void *)fn))) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
            else names[n++] = fn;
        }
        if (!s) s = ckpt_new(&c, dir, n);
        for (size_t i = 0; !s && i < n; i++) {
            char *p = ckpt_join(dir, names[i]);
            s = p ? add_file(c, p) : ds_errorf(DS_ERR_NOMEM, "out of memory");
            free(p);
        }
        json_object_foreach(wm, k, v) {
            if (s) break;
            const st_file *f = strmap_get(&((ckpt_priv *)c->priv)->owner, k);
            const char *base = f ? strrchr(f->path, '/') : NULL;
            if (!f || strcmp(base ? base + 1 : f->path, json_string_value(v)))
                s = ds_errorf(DS_ERR_FORMAT, "%s: index lists tensor '%s' in %s, but no shard holds it",
                              index_path, k, json_string_value(v));
        }
        strmap_free(&seen);
        free(names);
        json_decref(wm);
    } else {
        char **names;
        size_t n;
        if ((s = ckpt_list_shards(dir, &names, &n))) goto out;
        if (n == 0) s = ds_errorf(DS_ERR_IO, "%s: no *.safetensors files and no model.safetensors.index.json", dir);
        if (!s) s = ckpt_new(&c, dir, n);
        for (size_t i = 0; !s && i < n; i++) {
            char *p = ckpt_join(dir, names[i]);
            s = p ? add_file(c, p) : ds_errorf(DS_ERR_NOMEM, "out of memory");
            free(p);
        }
        for (size_t i = 0; i < n; i++) free(names[i]);
        free(names);
    }
out:
    free(index_path);
    if (s) {
        ckpt_close(c);
        return s;
    }
    *out = c;
    return DS_OK;
}

void ckpt_close(ds_ckpt *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->n_files; i++) st_close(c->files[i]);
    if (c->priv) {
        ckpt_priv *p = c->priv;
        strmap_free(&p->by_name);
        strmap_free(&p->owner);
        free(p);
    }
    free(c->files);
    free(c->dir);
    free(c);
}

const st_tensor *ckpt_find(const ds_ckpt *c, const char *name)
{
    return strmap_get(&((ckpt_priv *)c->priv)->by_name, name);
}

const st_file *ckpt_file_of(const ds_ckpt *c, const st_tensor *t)
{
    return strmap_get(&((ckpt_priv *)c->priv)->owner, t->name);
}
