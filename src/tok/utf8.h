/* utf8.h - UTF-8 decoding with the "maximal subpart" replacement rule. */
#ifndef DS_TOK_UTF8_H
#define DS_TOK_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 character at s (1..4), or 0 if invalid; then
 * *bad is the length of the maximal invalid subpart (1..3) to replace by one
 * U+FFFD. If the bytes so far form a valid prefix cut off by the end of the
 * buffer, returns 0 with *bad = n and *incomplete = 1. *cp gets the code point. */
size_t utf8_next(const uint8_t *s, size_t n, uint32_t *cp, size_t *bad, int *incomplete);

/* Writes cp as UTF-8 to out (4 bytes room); returns the length. */
size_t utf8_put(uint32_t cp, char *out);

/* Copies s to a fresh buffer with invalid subparts replaced by U+FFFD (EF BF BD).
 * If mask is not NULL, *out_mask gets the mask of the copy (a replacement
 * takes the minimum of the bytes it replaces). Returns NULL on out of memory. */
char *utf8_sanitize(const char *s, size_t n, const uint8_t *mask, size_t *out_n,
                    uint8_t **out_mask);

#endif
