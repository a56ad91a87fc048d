/* sha256.h - a small self-contained SHA-256 (FIPS 180-4) for comparing tensor bytes with manifests. */
#ifndef DS_TEST_SHA256_H
#define DS_TEST_SHA256_H

#include <stddef.h>
#include <stdint.h>

/* Writes the 64-character lowercase hex digest of data[0..n) and a NUL into hex. */
void sha256_hex(const void *data, size_t n, char hex[65]);

#endif
