/* utf8.c - UTF-8 decoding: each maximal invalid subpart becomes one U+FFFD, the
 * rule of Unicode 3.9 (U+FFFD substitution), WHATWG, Python and Rust. */
#include "tok/utf8.h"

#include <stdlib.h>
#include <string.h>

size_t utf8_next(const uint8_t *s, size_t n, uint32_t *cp, size_t *bad, int *incomplete)
{
    *incomplete = 0;
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F; /* <= U+10FFFF */
    } else {
        *bad = 1;
        return 0;
    }
    uint32_t v = c & (0xFF >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if (i >= n) {
            *bad = n;
            *incomplete = 1;
            return 0;
        }
        uint8_t b = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *bad = i;
            return 0;
        }
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return len;
}

size_t utf8_put(uint32_t cp, char *out)
{
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

char *utf8_sanitize(const char *s, size_t n, const uint8_t *mask, size_t *out_n,
                    uint8_t **out_mask)
{
    /* A replacement (3 bytes) stands for at least 1 byte: 3n bounds the size. */
    size_t cap = n * 3 + 1;
    char *o = malloc(cap);
    uint8_t *om = mask ? malloc(cap) : NULL;
    if (!o || (mask && !om)) {
        free(o);
        free(om);
        return NULL;
    }
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, j = 0;
    while (i < n) {
        uint32_t cp;
        size_t bad;
        int inc;
        size_t l = utf8_next(u + i, n - i, &cp, &bad, &inc);
        if (l) {
            memcpy(o + j, s + i, l);
            if (om) memcpy(om + j, mask + i, l);
            i += l;
            j += l;
            continue;
        }
        uint8_t m = 1;
        if (mask)
            for (size_t k = 0; k < bad; k++) m = m && mask[i + k];
        memcpy(o + j, "\xEF\xBF\xBD", 3);
        if (om) memset(om + j, m, 3);
        i += bad;
        j += 3;
    }
    o[j] = '\0';
    *out_n = j;
    if (out_mask) *out_mask = om;
    return o;
}
