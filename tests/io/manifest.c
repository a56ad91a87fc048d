/* manifest.c - golden manifest comparison for the conversion tests. */
#include "manifest.h"

#include <jansson.h>
#include <string.h>

#include "io/ckpt.h"
#include "io/safetensors.h"
#include "sha256.h"
#include "test.h"

int sha256_file(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n > 0 ? (size_t)n : 1);
    int ok = b && fread(b, 1, (size_t)n, f) == (size_t)n;
    fclose(f);
    if (ok) sha256_hex(b, (size_t)n, hex);
    free(b);
    return ok ? 0 : -1;
}

static void check_file(const char *fname, json_t *want, const char *path)
{
    st_file *f = NULL;
    CHECK_OK(st_open(&f, path));
    if (!f) return;
    CHECK_MSG(f->n_tensors == json_object_size(want), "%s: %zu tensors, manifest has %zu", fname, f->n_tensors,
              json_object_size(want));
    const char *name;
    json_t *w;
    json_object_foreach(want, name, w) {
        const st_tensor *t = st_find(f, name);
        CHECK_MSG(t, "%s: tensor %s missing", fname, name);
        if (!t) continue;
        CHECK_MSG(!strcmp(st_dtype_name(t->dtype), json_string_value(json_object_get(w, "dtype"))),
                  "%s: %s dtype %s", fname, name, st_dtype_name(t->dtype));
        json_t *shape = json_object_get(w, "shape");
        int same = (size_t)t->ndim == json_array_size(shape);
        for (int d = 0; same && d < t->ndim; d++)
            same = t->shape[d] == json_integer_value(json_array_get(shape, (size_t)d));
        CHECK_MSG(same, "%s: %s shape differs", fname, name);
        char hex[65];
        sha256_hex(t->data, t->nbytes, hex);
        CHECK_MSG(!strcmp(hex, json_string_value(json_object_get(w, "sha256"))), "%s: %s bytes differ", fname, name);
    }
    st_close(f);
}

void check_manifest(const char *manifest_path, const char *dir)
{
    json_error_t e;
    json_t *m = json_load_file(manifest_path, 0, &e);
    CHECK_MSG(json_is_object(m), "%s: %s", manifest_path, e.text);
    if (!m) return;
    const char *fname;
    json_t *v;
    json_object_foreach(m, fname, v) {
        char *path = ckpt_join(dir, fname);
        json_t *tensors = json_object_get(v, "tensors");
        if (tensors) {
            check_file(fname, tensors, path);
        } else {
            char hex[65] = "";
            CHECK_MSG(sha256_file(path, hex) == 0, "%s: cannot read", path);
            CHECK_MSG(!strcmp(hex, json_string_value(json_object_get(v, "sha256"))), "%s: bytes differ", path);
        }
        free(path);
    }
    json_decref(m);
}
