/* safetensors.c - validated, zero-copy reading and streamed, atomic writing.
 *
 * Validation order: length prefix, header bounds, JSON object, each entry's
 * dtype/shape/offsets, then the offsets as a whole (sorted, contiguous from 0,
 * ending exactly at the end of the file). Every error names the file and, where
 * there is one, the tensor. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checked.h"
#include "base/file.h"
#include "base/strmap.h"

static const struct { const char *name; size_t size; } k_dtypes[ST_N_DTYPES] = {
    [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1}, [ST_I8] = {"I8", 1},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_I16] = {"I16", 2}, [ST_U16] = {"U16", 2}, [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2}, [ST_I32] = {"I32", 4}, [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4}, [ST_I64] = {"I64", 8}, [ST_U64] = {"U64", 8},
    [ST_F64] = {"F64", 8},
};

const char *st_dtype_name(st_dtype t) { return t < ST_N_DTYPES ? k_dtypes[t].name : "?"; }
size_t st_dtype_size(st_dtype t) { return t < ST_N_DTYPES ? k_dtypes[t].size : 0; }

st_dtype st_dtype_parse(const char *s)
{
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (!strcmp(s, k_dtypes[i].name)) return (st_dtype)i;
    return ST_N_DTYPES;
}

typedef struct {
    strmap index;
    char *strings;   /* names and metadata, one allocation */
    int fd;
    int owns_map;
} st_priv;

const char *st_shape_str(const st_tensor *t, char *buf, size_t cap)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

static int cmp_offset(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

/* Parses one entry of the header into t (name already set). */
static ds_status parse_entry(st_tensor *t, json_t *v, const char *label)
{
    const char *name = t->name;
    if (!json_is_object(v))
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': header entry is not a JSON object", label, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': missing or non-string \"dtype\"", label, name);
    t->dtype = st_dtype_parse(json_string_value(jd));
    if (t->dtype == ST_N_DTYPES)
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s' (expected one of F64 F32 "
                         "F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U64 U32 U16 U8 BOOL)",
                         label, name, json_string_value(jd));
    if (!json_is_array(js))
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': missing or non-array \"shape\"", label, name);
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': %zu dimensions, at most %d supported",
                         label, name, nd, ST_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                             label, name, i);
        uint64_t x = (uint64_t)json_integer_value(d);
        t->shape[i] = (int64_t)x;
        if (x && numel > UINT64_MAX / x)
            return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': shape product overflows 64 bits", label, name);
        numel *= x;
    }
    t->numel = numel;
    size_t es = st_dtype_size(t->dtype);
    if (numel > UINT64_MAX / es)
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': byte size overflows 64 bits", label, name);
    uint64_t want = numel * es;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" must be [begin, end] integers",
                         label, name);
    json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b)
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] are not 0 <= begin <= end",
                         label, name, (long long)b, (long long)e);
    t->offset = (uint64_t)b;
    t->nbytes = (uint64_t)(e - b);
    if (t->nbytes != want) {
        char sh[128];
        return ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': data_offsets span %llu bytes but %s shape %s "
                         "needs %llu", label, name, (unsigned long long)t->nbytes,
                         st_dtype_name(t->dtype), st_shape_str(t, sh, sizeof sh), (unsigned long long)want);
    }
    return DS_OK;
}

static ds_status parse_meta(st_file *f, json_t *v, const char *label, char **sp)
{
    if (!json_is_object(v))
        return ds_errorf(DS_ERR_FORMAT, "%s: \"__metadata__\" is not a JSON object", label);
    size_t n = json_object_size(v);
    f->meta_keys = calloc(n ? n : 1, sizeof(char *));
    f->meta_vals = calloc(n ? n : 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_vals) return ds_errorf(DS_ERR_NOMEM, "%s: out of memory", label);
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (!json_is_string(x))
            return ds_errorf(DS_ERR_FORMAT, "%s: __metadata__ value for '%s' is not a string", label, k);
        size_t kl = strlen(k) + 1, vl = strlen(json_string_value(x)) + 1;
        f->meta_keys[f->n_meta] = memcpy(*sp, k, kl);
        *sp += kl;
        f->meta_vals[f->n_meta] = memcpy(*sp, json_string_value(x), vl);
        *sp += vl;
        f->n_meta++;
    }
    return DS_OK;
}

/* Bytes needed to copy all keys and string values of the header object. */
static size_t strings_size(json_t *root)
{
    size_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        n += strlen(k) + 1;
        if (!strcmp(k, "__metadata__") && json_is_object(v)) {
            const char *k2;
            json_t *v2;
            json_object_foreach(v, k2, v2) {
                n += strlen(k2) + 1;
                if (json_is_string(v2)) n += strlen(json_string_value(v2)) + 1;
            }
        }
    }
    return n;
}

static ds_status parse_header(st_file *f, const uint8_t *buf, size_t len, const char *label)
{
    if (len < 8)
        return ds_errorf(DS_ERR_FORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length",
                         label, len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | buf[i];
    if (n > ST_MAX_HEADER)
        return ds_errorf(DS_ERR_FORMAT, "%s: header length %llu exceeds the %u-byte limit of the format",
                         label, (unsigned long long)n, ST_MAX_HEADER);
    if (n > len - 8)
        return ds_errorf(DS_ERR_FORMAT, "%s: header length %llu runs past the end of the %zu-byte file "
                         "(truncated?)", label, (unsigned long long)n, len);
    if (n < 2)
        return ds_errorf(DS_ERR_FORMAT, "%s: header length %llu is too short for a JSON object",
                         label, (unsigned long long)n);
    f->header_len = n;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ds_errorf(DS_ERR_FORMAT, "%s: header is not valid JSON: %s (at byte %d)", label, jerr.text,
                         jerr.position);
    ds_status s = DS_OK;
    st_priv *p = f->priv;
    if (!json_is_object(root)) {
        s = ds_errorf(DS_ERR_FORMAT, "%s: header is JSON but not an object", label);
        goto out;
    }
    size_t cap = json_object_size(root);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    p->strings = malloc(strings_size(root) + 1);
    if (!f->tensors || !p->strings) {
        s = ds_errorf(DS_ERR_NOMEM, "%s: out of memory for %zu header entries", label, cap);
        goto out;
    }
    char *sp = p->strings;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if ((s = parse_meta(f, val, label, &sp))) goto out;
            continue;
        }
        st_tensor *t = &f->tensors[f->n_tensors];
        size_t kl = strlen(key) + 1;
        t->name = memcpy(sp, key, kl);
        sp += kl;
        if ((s = parse_entry(t, val, label))) goto out;
        f->n_tensors++;
    }
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, cmp_offset);
    uint64_t pos = 0, data_len = len - 8 - n;
    for (size_t i = 0; i < f->n_tensors; i++) {
        st_tensor *t = &f->tensors[i];
        if (t->offset != pos) {
            s = ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': data starts at byte %llu but the previous "
                          "tensor ends at %llu (%s)", label, t->name, (unsigned long long)t->offset,
                          (unsigned long long)pos, t->offset < pos ? "overlap" : "gap");
            goto out;
        }
        if (t->nbytes > data_len - pos) {
            s = ds_errorf(DS_ERR_FORMAT, "%s: tensor '%s': data [%llu, %llu) runs past the end of the "
                          "%llu-byte data section (truncated?)", label, t->name,
                          (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes),
                          (unsigned long long)data_len);
            goto out;
        }
        pos += t->nbytes;
        t->data = buf + 8 + n + t->offset;
        if (strmap_put(&p->index, t->name, t)) {
            s = ds_errorf(DS_ERR_NOMEM, "%s: out of memory indexing tensors", label);
            goto out;
        }
    }
    if (pos != data_len)
        s = ds_errorf(DS_ERR_FORMAT, "%s: tensors cover %llu bytes of data but the file holds %llu "
                      "(trailing bytes)", label, (unsigned long long)pos, (unsigned long long)data_len);
out:
    json_decref(root);
    return s;
}

static ds_status new_file(st_file **out, const char *label)
{
    st_file *f = calloc(1, sizeof *f);
    st_priv *p = calloc(1, sizeof *p);
    if (!f || !p || !(f->path = strdup(label))) {
        free(f);
        free(p);
        return ds_errorf(DS_ERR_NOMEM, "%s: out of memory", label);
    }
    p->fd = -1;
    f->priv = p;
    *out = f;
    return DS_OK;
}

ds_status st_parse(st_file **out, const uint8_t *buf, size_t len, const char *label)
{
    st_file *f;
    ds_status s = new_file(&f, label);
    if (s) return s;
    f->map = (void *)buf;
    f->size = len;
    if ((s = parse_header(f, buf, len, label))) {
        st_close(f);
        return s;
    }
    *out = f;
    return DS_OK;
}

ds_status st_open(st_file **out, const char *path)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; fstat refuses it */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return ds_errorf(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        ds_status s = ds_errorf(DS_ERR_IO, "%s: %s, not a regular file", path, file_kind(sb.st_mode));
        close(fd);
        return s;
    }
    st_file *f;
    ds_status s = new_file(&f, path);
    if (s) {
        close(fd);
        return s;
    }
    st_priv *p = f->priv;
    p->fd = fd;
    f->size = (size_t)sb.st_size;
    if (f->size) {
        f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            st_close(f);
            return ds_errorf(DS_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        }
        p->owns_map = 1;
        /* 2 MiB pages where the kernel can (a no-op elsewhere): page cache
         * filled through this mapping then uses PMD-sized folios, so streaming
         * the weights takes few TLB misses and the hardware prefetchers are
         * not stopped at every 4 KiB boundary. */
        madvise(f->map, f->size, MADV_HUGEPAGE);
    }
    if ((s = parse_header(f, f->map, f->size, path))) {
        st_close(f);
        return s;
    }
    *out = f;
    return DS_OK;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/* Bytes of the mapping that starts at map which the kernel maps with PMDs
 * (2 MiB pages), from /proc/self/smaps; -1 if that cannot be read. */
static long long pmd_mapped_bytes(const void *map)
{
    FILE *fp = fopen("/proc/self/smaps", "re");
    if (!fp) return -1;
    char line[512];
    long long kb = -1;
    bool in = false;
    while (fgets(line, sizeof line, fp)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            if (in) break;
            in = lo == (unsigned long)(uintptr_t)map;
        } else if (in && sscanf(line, "FilePmdMapped: %lld kB", &kb) == 1) {
            break;
        }
    }
    fclose(fp);
    return kb < 0 ? -1 : kb * 1024;
}

static size_t available_memory(void)
{
    FILE *fp = fopen("/proc/meminfo", "re");
    char line[256];
    unsigned long long kb = 0;
    while (fp && fgets(line, sizeof line, fp))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (fp) fclose(fp);
    return (size_t)kb * 1024;
}

void st_settle_pages(st_file *f)
{
    st_priv *p = f->priv;
    if (!f->map || !p->owns_map || f->size < ((size_t)64 << 20) || f->size > available_memory() / 2) return;
    if (madvise(f->map, f->size, MADV_POPULATE_READ)) return; /* before Linux 5.14 */
    long long pmd = pmd_mapped_bytes(f->map);
    if (pmd < 0 || (double)pmd >= 0.9 * (double)f->size) return;
    /* unmap our pages, let the page cache drop them (written back first, if
     * the file was just written; mapped by no one else), then fault the file
     * in again through the huge-page mapping */
    madvise(f->map, f->size, MADV_DONTNEED);
    fdatasync(p->fd);
    posix_fadvise(p->fd, 0, 0, POSIX_FADV_DONTNEED);
    madvise(f->map, f->size, MADV_POPULATE_READ);
}

void st_close(st_file *f)
{
    if (!f) return;
    st_priv *p = f->priv;
    if (p) {
        if (p->owns_map && f->map) munmap(f->map, f->size);
        if (p->fd >= 0) close(p->fd);
        strmap_free(&p->index);
        free(p->strings);
        free(p);
    }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->path);
    free(f);
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    return strmap_get(&((st_priv *)f->priv)->index, name);
}

const char *st_meta(const st_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_vals[i];
    return NULL;
}

/* ---- writer ---- */

struct st_writer {
    char *path, *tmp;
    FILE *fp;
    json_t *header, *meta;
    uint64_t declared, written;
    int begun;
};

ds_status st_writer_open(st_writer **out, const char *path)
{
    st_writer *w = calloc(1, sizeof *w);
    if (!w) return ds_errorf(DS_ERR_NOMEM, "%s: out of memory", path);
    size_t n = strlen(path) + 32;
    w->path = strdup(path);
    w->tmp = malloc(n);
    w->header = json_object();
    if (!w->path || !w->tmp || !w->header) {
        st_writer_abort(w);
        return ds_errorf(DS_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(w->tmp, n, "%s.tmp%ld", path, (long)getpid());
    w->fp = fopen(w->tmp, "wb");
    if (!w->fp) {
        ds_status s = ds_errorf(DS_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
        free(w->tmp);
        w->tmp = NULL;
        st_writer_abort(w);
        return s;
    }
    setvbuf(w->fp, NULL, _IOFBF, 1 << 22);
    *out = w;
    return DS_OK;
}

ds_status st_writer_meta(st_writer *w, const char *key, const char *val)
{
    if (!w->meta) w->meta = json_object();
    if (!w->meta || json_object_set_new(w->meta, key, json_string(val)))
        return ds_errorf(DS_ERR_ARG, "%s: cannot add metadata '%s'", w->path, key);
    return DS_OK;
}

ds_status st_writer_add(st_writer *w, const char *name, st_dtype dt, int ndim, const int64_t *shape)
{
    if (w->begun) return ds_errorf(DS_ERR_INTERNAL, "%s: tensor '%s' declared after data began", w->path, name);
    if (!strcmp(name, "__metadata__") || json_object_get(w->header, name))
        return ds_errorf(DS_ERR_ARG, "%s: duplicate or reserved tensor name '%s'", w->path, name);
    uint64_t numel = 1, nb, end;
    if (ndim < 0 || ndim > ST_MAX_DIMS) return ds_errorf(DS_ERR_ARG, "%s: tensor '%s' has %d dimensions", w->path, name, ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || !ck_mul_u64(&numel, numel, (uint64_t)shape[i]))
            return ds_errorf(DS_ERR_ARG, "%s: tensor '%s': shape is negative or its size overflows", w->path, name);
    if (!ck_mul_u64(&nb, numel, st_dtype_size(dt)) || !ck_add_u64(&end, w->declared, nb) || end > (uint64_t)INT64_MAX)
        return ds_errorf(DS_ERR_ARG, "%s: tensor '%s': byte size overflows", w->path, name);
    json_t *js = json_array();
    for (int i = 0; i < ndim; i++) json_array_append_new(js, json_integer(shape[i]));
    json_t *e = json_object(), *jo = json_array();
    json_object_set_new(e, "dtype", json_string(st_dtype_name(dt)));
    json_object_set_new(e, "shape", js);
    json_array_append_new(jo, json_integer((json_int_t)w->declared));
    json_array_append_new(jo, json_integer((json_int_t)(w->declared + nb)));
    json_object_set_new(e, "data_offsets", jo);
    if (json_object_set_new(w->header, name, e))
        return ds_errorf(DS_ERR_NOMEM, "%s: out of memory declaring '%s'", w->path, name);
    w->declared += nb;
    return DS_OK;
}

ds_status st_writer_begin(st_writer *w)
{
    if (w->meta) json_object_set(w->header, "__metadata__", w->meta);
    char *js = json_dumps(w->header, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!js) return ds_errorf(DS_ERR_NOMEM, "%s: cannot serialise header", w->path);
    size_t n = strlen(js), padded = (n + 7) & ~(size_t)7;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, w->fp) == 8 && fwrite(js, 1, n, w->fp) == n;
    for (size_t i = n; ok && i < padded; i++) ok = fputc(' ', w->fp) != EOF;
    free(js);
    w->begun = 1;
    if (!ok) return ds_errorf(DS_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    return DS_OK;
}

ds_status st_writer_write(st_writer *w, const void *data, size_t n)
{
    if (!w->begun) return ds_errorf(DS_ERR_INTERNAL, "%s: data written before the header", w->path);
    if (n > w->declared - w->written)
        return ds_errorf(DS_ERR_INTERNAL, "%s: %zu bytes written past the declared %llu", w->path, n,
                         (unsigned long long)w->declared);
    if (fwrite(data, 1, n, w->fp) != n) {
        /* EFAULT: the bytes come from a mapping whose file shrank under us */
        if (errno == EFAULT)
            return ds_errorf(DS_ERR_IO, "%s: the input data could not be read: the file it is mapped from "
                             "changed while in use", w->path);
        return ds_errorf(DS_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    }
    w->written += n;
    return DS_OK;
}

ds_status st_writer_finish(st_writer *w)
{
    ds_status s = DS_OK;
    if (!w->begun && (s = st_writer_begin(w))) goto fail;
    if (w->written != w->declared) {
        s = ds_errorf(DS_ERR_INTERNAL, "%s: %llu of %llu declared bytes written", w->path,
                      (unsigned long long)w->written, (unsigned long long)w->declared);
        goto fail;
    }
    /* durable before anything renames it into a published place */
    int rc = fflush(w->fp);
    rc |= fsync(fileno(w->fp));
    rc |= fclose(w->fp);
    w->fp = NULL;
    if (rc) {
        s = ds_errorf(DS_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
        goto fail;
    }
    if (rename(w->tmp, w->path)) {
        s = ds_errorf(DS_ERR_IO, "%s: cannot rename into place: %s", w->path, strerror(errno));
        goto fail;
    }
    free(w->tmp);
    w->tmp = NULL;
    st_writer_abort(w);
    return DS_OK;
fail:
    st_writer_abort(w);
    return s;
}

void st_writer_abort(st_writer *w)
{
    if (!w) return;
    if (w->fp) fclose(w->fp);
    if (w->tmp) unlink(w->tmp);
    json_decref(w->header);
    json_decref(w->meta);
    free(w->tmp);
    free(w->path);
    free(w);
}
