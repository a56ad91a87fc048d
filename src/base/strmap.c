/* strmap.c - FNV-1a hashed, linearly probed string map; grows at 50% load. */
#include "strmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return h;
}

static ds_status grow(strmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    const char **keys = calloc(cap, sizeof *keys);
    void **vals = calloc(cap, sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return ds_errorf(DS_ERR_NOMEM, "out of memory growing a name table to %zu entries", cap);
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = hash_str(m->keys[i]) & (cap - 1);
        while (keys[j]) j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    return DS_OK;
}

ds_status strmap_put(strmap *m, const char *key, void *val)
{
    if ((m->count + 1) * 2 > m->cap) {
        ds_status s = grow(m);
        if (s) return s;
    }
    size_t j = hash_str(key) & (m->cap - 1);
    while (m->keys[j]) {
        if (!strcmp(m->keys[j], key)) return DS_ERR_ARG;
        j = (j + 1) & (m->cap - 1);
    }
    m->keys[j] = key;
    m->vals[j] = val;
    m->count++;
    return DS_OK;
}

void *strmap_get(const strmap *m, const char *key)
{
    if (!m->cap) return NULL;
    size_t j = hash_str(key) & (m->cap - 1);
    while (m->keys[j]) {
        if (!strcmp(m->keys[j], key)) return m->vals[j];
        j = (j + 1) & (m->cap - 1);
    }
    return NULL;
}

void strmap_free(strmap *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}
