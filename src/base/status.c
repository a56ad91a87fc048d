/* status.c - the per-thread error message behind ds_errorf(). */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[2048];

ds_status ds_errorf(ds_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return code;
}

ds_status ds_error_prefix(ds_status code, const char *fmt, ...)
{
    char prefix[512], old[sizeof g_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof g_msg - 3) n = sizeof g_msg - 3;
    memcpy(g_msg, prefix, n);
    memcpy(g_msg + n, ": ", 2);
    size_t rest = sizeof g_msg - n - 3;
    size_t ol = strnlen(old, rest);
    memcpy(g_msg + n + 2, old, ol);
    g_msg[n + 2 + ol] = '\0';
    return code;
}

void ds_error_clear(void) { g_msg[0] = '\0'; }

const char *ds_last_error(void) { return g_msg; }

const char *ds_status_name(ds_status s)
{
    switch (s) {
    case DS_OK: return "ok";
    case DS_ERR_IO: return "i/o error";
    case DS_ERR_FORMAT: return "format error";
    case DS_ERR_ARG: return "invalid argument";
    case DS_ERR_NOMEM: return "out of memory";
    case DS_ERR_RANGE: return "out of range";
    case DS_ERR_UNSUPPORTED: return "unsupported";
    case DS_ERR_COMM: return "communication error";
    case DS_ERR_INTERNAL: return "internal error";
    }
    return "unknown error";
}
