/* checked.h - size arithmetic that reports overflow instead of wrapping.
 *
 * Every product or sum of sizes that comes from a file, a flag or a config
 * goes through these before it reaches malloc, an offset or a loop bound:
 *     size_t n;
 *     if (!ck_mul(&n, rows, cols) || !ck_mul(&n, n, sizeof(float))) return ds_errorf(...);
 * They return true when the exact result fits, false (and leave *r
 * unspecified) when it does not. Negative int64 inputs to the unsigned forms
 * are rejected too, so a negative dimension can never become a huge size. */
#ifndef DS_CHECKED_H
#define DS_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline bool ck_mul(size_t *r, size_t a, size_t b) { return !__builtin_mul_overflow(a, b, r); }
static inline bool ck_add(size_t *r, size_t a, size_t b) { return !__builtin_add_overflow(a, b, r); }
static inline bool ck_mul_u64(uint64_t *r, uint64_t a, uint64_t b) { return !__builtin_mul_overflow(a, b, r); }
static inline bool ck_add_u64(uint64_t *r, uint64_t a, uint64_t b) { return !__builtin_add_overflow(a, b, r); }
static inline bool ck_mul_i64(int64_t *r, int64_t a, int64_t b) { return !__builtin_mul_overflow(a, b, r); }
static inline bool ck_add_i64(int64_t *r, int64_t a, int64_t b) { return !__builtin_add_overflow(a, b, r); }
static inline bool ck_sub_i64(int64_t *r, int64_t a, int64_t b) { return !__builtin_sub_overflow(a, b, r); }

/* The product of n non-negative int64 values (dimensions) as a size_t. */
static inline bool ck_prod_dims(size_t *r, const int64_t *d, int n)
{
    size_t p = 1;
    for (int i = 0; i < n; i++)
        if (d[i] < 0 || (uint64_t)d[i] > SIZE_MAX || !ck_mul(&p, p, (size_t)d[i])) return false;
    *r = p;
    return true;
}

/* a*b*c (non-negative ints, as config fields are) as a size_t. */
static inline bool ck_mul3(size_t *r, int64_t a, int64_t b, int64_t c)
{
    const int64_t d[3] = {a, b, c};
    return ck_prod_dims(r, d, 3);
}

#endif
