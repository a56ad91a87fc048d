/* ckpt.h - a checkpoint as a set of safetensors shards with one name index.
 *
 * Opens a Hugging Face directory through model.safetensors.index.json (every
 * file it names must stay inside the directory and hold the tensors the index
 * says it holds), or, without an index, every *.safetensors in the directory
 * in name order. A tensor name may appear in one shard only. */
#ifndef DS_CKPT_H
#define DS_CKPT_H

#include <jansson.h>

#include "io/safetensors.h"

typedef struct {
    char *dir;
    size_t n_files;
    st_file **files;
    size_t n_tensors;
    void *priv;       /* name -> st_tensor* index, tensor -> file */
} ds_ckpt;

ds_status ckpt_open_dir(ds_ckpt **out, const char *dir);
/* Opens exactly the given files (e.g. model0-mp2.safetensors). */
ds_status ckpt_open_files(ds_ckpt **out, const char *const *paths, size_t n);
void ckpt_close(ds_ckpt *c);

const st_tensor *ckpt_find(const ds_ckpt *c, const char *name);
/* The shard holding t. */
const st_file *ckpt_file_of(const ds_ckpt *c, const st_tensor *t);

/* Lists every "*.safetensors" file name in dir, sorted; names are malloc'd. */
ds_status ckpt_list_shards(const char *dir, char ***names, size_t *n);

/* True if the file name is a plain name inside a directory: no '/', not "." or "..". */
int ckpt_safe_name(const char *name);

/* Loads a JSON file through file_read (regular file, at most max bytes; what
 * names it in messages) with jansson flags. */
ds_status ckpt_load_json(const char *path, size_t max, const char *what, size_t flags, json_t **out);

/* Parses an index's text (label names it in errors): *map_out gets its
 * weight_map (tensor name -> shard file name), each value checked to be a
 * plain file name. Caller json_decref()s it. */
ds_status ckpt_parse_index(const char *text, size_t len, const char *label, json_t **map_out);

/* dir + "/" + name into a new string. */
char *ckpt_join(const char *dir, const char *name);

#endif
