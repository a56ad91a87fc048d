/* strmap.h - an open-addressing hash map from strings to pointers.
 *
 * Keys are borrowed (the caller keeps them alive). Used to find tensors by name
 * in checkpoints with ~10^5 tensors; lookups are O(1) expected. */
#ifndef DS_STRMAP_H
#define DS_STRMAP_H

#include <stddef.h>

#include "base/status.h"

typedef struct {
    const char **keys;
    void **vals;
    size_t cap;   /* power of two, or 0 */
    size_t count;
} strmap;

/* Inserts key -> val. Returns DS_ERR_ARG (with no message) if the key exists. */
ds_status strmap_put(strmap *m, const char *key, void *val);
/* The value for key, or NULL. */
void *strmap_get(const strmap *m, const char *key);
void strmap_free(strmap *m);

#endif
