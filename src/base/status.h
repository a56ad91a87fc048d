/* status.h - status codes and the per-thread error message.
 *
 * Library code never exits on bad input: it returns a ds_status and leaves a
 * message naming the file, tensor, field or value and what was expected.
 * ds_errorf() records the message and returns the code, so error paths read
 *     return ds_errorf(DS_ERR_FORMAT, "%s: tensor %s: ...", path, name);
 * The message lives in thread-local storage; ds_last_error() reads it. */
#ifndef DS_STATUS_H
#define DS_STATUS_H

#include "dsv3.h"

#if defined(__GNUC__)
#define DS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DS_PRINTF(a, b)
#endif

/* Records a formatted message and returns code. */
ds_status ds_errorf(ds_status code, const char *fmt, ...) DS_PRINTF(2, 3);

/* Prefixes the current message with "<prefix>: " and returns code. */
ds_status ds_error_prefix(ds_status code, const char *fmt, ...) DS_PRINTF(2, 3);

void ds_error_clear(void);

#endif
