/* safetensors.h - reading and writing the safetensors format.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
 *  "__metadata__": {"k": "v"}}, then the data. The reader mmaps the file and
 * validates everything before any tensor is handed out: header bounds, JSON
 * shape, known dtypes, overflow-checked shape products, byte lengths, offsets
 * contiguous from 0 without gaps or overlaps, and a file length that matches.
 * Tensor data is then accessed in place (zero copy).
 *
 * The writer streams: tensors are declared first (so the header can be
 * written), then their bytes are appended in declaration order. It writes to a
 * temporary name and renames on st_writer_finish(), so a failed or interrupted
 * write never leaves a file under the final name. */
#ifndef DS_SAFETENSORS_H
#define DS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20) /* 100 MiB, the format's own limit */

typedef enum {
    ST_BOOL, ST_U8, ST_I8, ST_F8_E4M3, ST_F8_E5M2, ST_I16, ST_U16, ST_F16, ST_BF16,
    ST_I32, ST_U32, ST_F32, ST_I64, ST_U64, ST_F64, ST_N_DTYPES
} st_dtype;

typedef struct {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    uint64_t offset;     /* from the start of the data section */
    uint64_t nbytes;
    const void *data;    /* into the mapping; NULL for a parsed buffer without data */
} st_tensor;

typedef struct {
    char *path;
    void *map;
    size_t size;
    uint64_t header_len;
    size_t n_tensors;
    st_tensor *tensors;  /* sorted by offset */
    size_t n_meta;
    char **meta_keys, **meta_vals;
    void *priv;          /* name index and string storage */
} st_file;

const char *st_dtype_name(st_dtype t);
size_t st_dtype_size(st_dtype t);
/* Parses "BF16" etc.; returns ST_N_DTYPES for an unknown name. */
st_dtype st_dtype_parse(const char *s);

/* Maps and validates a file. */
ds_status st_open(st_file **out, const char *path);
/* Validates an in-memory file image (the fuzz target's entry); `label` names it in errors.
 * The buffer must outlive the result. */
ds_status st_parse(st_file **out, const uint8_t *buf, size_t len, const char *label);
void st_close(st_file *f);

/* For weights read in place: pages in the whole mapping now (bytes read, so
 * that the first tokens do not wait for the disk) and, where the page cache
 * held the file in small pieces (it was written or read before without
 * huge pages), drops those and reads it again so that the kernel maps it
 * with 2 MiB pages: streaming weights through 4 KiB mappings costs page-table
 * walks that miss the caches (a sixth of decode time measured on an 8-layer
 * 16B model). Skipped for files under 64 MiB or a file larger than half the
 * memory available. Best effort: no error if the kernel lacks a feature. */
void st_settle_pages(st_file *f);

const st_tensor *st_find(const st_file *f, const char *name);
/* Metadata value for key, or NULL. */
const char *st_meta(const st_file *f, const char *key);

/* "[2, 3]" into buf. */
const char *st_shape_str(const st_tensor *t, char *buf, size_t cap);

typedef struct st_writer st_writer;

ds_status st_writer_open(st_writer **out, const char *path);
/* Adds a __metadata__ entry; before st_writer_begin. */
ds_status st_writer_meta(st_writer *w, const char *key, const char *val);
/* Declares the next tensor; all declarations come before st_writer_begin. */
ds_status st_writer_add(st_writer *w, const char *name, st_dtype dt, int ndim, const int64_t *shape);
/* Writes the header; data follows with st_writer_write. */
ds_status st_writer_begin(st_writer *w);
/* Appends data bytes (the tensors' bytes in declaration order, any chunking). */
ds_status st_writer_write(st_writer *w, const void *data, size_t n);
/* Checks every declared byte was written, flushes, renames to the final path, frees w. */
ds_status st_writer_finish(st_writer *w);
/* Removes the temporary file and frees w. Safe on NULL. */
void st_writer_abort(st_writer *w);

#endif
