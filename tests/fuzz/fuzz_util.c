/* fuzz_util.c - helpers shared by the fuzz targets. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

char *fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}
