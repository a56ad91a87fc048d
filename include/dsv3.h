/* dsv3.h - public C API of libdsv3, a C engine for DeepSeek-V3-family models.
 *
 * Every fallible call returns a ds_status; on failure ds_last_error() gives a
 * message that names what was wrong and what was expected. */
#ifndef DSV3_H
#define DSV3_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DS_OK = 0,
    DS_ERR_IO,          /* a file could not be read or written */
    DS_ERR_FORMAT,      /* a file's contents are malformed */
    DS_ERR_ARG,         /* a flag, option or argument is invalid */
    DS_ERR_NOMEM,       /* an allocation failed */
    DS_ERR_RANGE,       /* a value is outside what is allowed (token id, length) */
    DS_ERR_UNSUPPORTED, /* valid but not supported by this build */
    DS_ERR_COMM,        /* a peer process failed or a collective timed out */
    DS_ERR_INTERNAL     /* a bug: an invariant did not hold */
} ds_status;

/* The message recorded by the last failing call on this thread ("" if none). */
const char *ds_last_error(void);

/* A short name for a status ("io error", "format error", ...). */
const char *ds_status_name(ds_status s);

#define DSV3_VERSION "0.1.0"

#ifdef __cplusplus
}
#endif
#endif
