/* file.h - reading a small input file whole, checked first.
 *
 * Configs, indexes, tokenizers and templates are read through file_read:
 * the file is opened without blocking (a FIFO would otherwise hang the open),
 * must be a regular file (a directory, FIFO, socket or device is refused with
 * a message naming what it is), and must not exceed a cap chosen per kind of
 * file, checked from fstat before anything is allocated. */
#ifndef DS_FILE_H
#define DS_FILE_H

#include <stddef.h>

#include "base/status.h"

/* Caps by kind of file, each well above the largest real one (in brackets). */
#define FILE_MAX_CONFIG (16u << 20)      /* config.json [a few KiB] */
#define FILE_MAX_INDEX (256u << 20)      /* model.safetensors.index.json [V3: 9 MiB] */
#define FILE_MAX_TOKENIZER (256u << 20)  /* tokenizer.json [V3: 7.5 MiB; the largest public ones ~35 MiB] */
#define FILE_MAX_TOK_CONFIG (16u << 20)  /* tokenizer_config.json with its template [V3: 0.2 MiB] */
#define FILE_MAX_TEXT (1u << 30)        /* perplexity's text [wikitext-2 test: 1.3 MiB; -103 train: 0.5 GiB] */

/* Reads path (at most max bytes; `what` names the kind in messages) into a
 * new NUL-terminated buffer *buf of *len bytes. */
ds_status file_read(const char *path, size_t max, const char *what, char **buf, size_t *len);

/* What st_mode is, for messages ("a directory", "a FIFO", ...). */
const char *file_kind(unsigned mode);

#endif
