/* fuzz_safetensors.c - fuzz target for the safetensors header parser (st_parse).
 *
 * Built two ways:
 *  - with -DDSV3_LIBFUZZER (clang, -fsanitize=fuzzer,address,undefined; see
 *    tests/fuzz/tests.cmake): a libFuzzer target,
 *      CC=clang cmake -B build-fuzz -DDSV3_FUZZ=ON && cmake --build build-fuzz --target fuzz_safetensors
 *      build-fuzz/tests/fuzz_safetensors -max_total_time=60 CORPUS_DIR
 *    (`--write-seeds DIR` is not available there; make seeds with the plain driver);
 *  - otherwise a plain driver for the normal test suite:
 *      fuzz_safetensors [--corpus DIR] [--mutations N] [--seed S] [--write-seeds DIR]
 *    replays every file of DIR, then parses N random mutations (bit flips,
 *    interesting bytes, insertions, deletions, truncations, length-prefix and
 *    number edits) of built-in valid and corrupted files.
 * Either way every input must give DS_OK or a clean error; a parsed file's
 * tensors are read end to end, so a wrong bound shows up under ASan. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "io/safetensors.h"

static volatile uint8_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_file *f = NULL;
    ds_status s = st_parse(&f, data, size, "fuzz.safetensors");
    if (s == DS_OK) {
        uint8_t x = 0;
        for (size_t i = 0; i < f->n_tensors; i++) {
            const st_tensor *t = &f->tensors[i];
            if (st_find(f, t->name) != t) abort(); /* the index must find every tensor */
            const uint8_t *p = t->data;
            for (uint64_t j = 0; j < t->nbytes; j++) x ^= p[j];
        }
        for (size_t i = 0; i < f->n_meta; i++) x ^= (uint8_t)f->meta_vals[i][0];
        g_sink = x;
        st_close(f);
    } else if (s != DS_ERR_FORMAT && s != DS_ERR_NOMEM) {
        abort(); /* a parse of bytes can only be well formed or malformed */
    } else if (!strstr(ds_last_error(), "fuzz.safetensors")) {
        abort(); /* every message names the file */
    }
    return 0;
}

#ifndef DSV3_LIBFUZZER

static const char *k_seeds[] = {
    "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]},"
    "\"c\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[22,24]}}",
    "{\"w\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]},\"e\":{\"dtype\":\"I64\",\"shape\":[0,9],"
    "\"data_offsets\":[1,1]}}",
    "{\"x\":{\"dtype\":\"F64\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,8]}}",
    "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],"
    "\"data_offsets\":[2,6]}}",
    "{\"t\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,1]}}",
    "{}",
};

/* A seed file image: length prefix, header, `data` bytes. Caller frees. */
static uint8_t *make_seed(const char *h, size_t data, size_t *len)
{
    size_t n = strlen(h);
    uint8_t *b = malloc(8 + n + data + 1);
    if (!b) abort();
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(b + 8, h, n);
    for (size_t i = 0; i < data; i++) b[8 + n + i] = (uint8_t)(i * 37);
    *len = 8 + n + data;
    return b;
}

static const uint8_t k_interesting[] = {0, 1, 0x7f, 0x80, 0xff, '"', ',', ':', '[', ']', '{', '}', '-', '9', '.', 'e'};

/* One random edit of buf (length *n, capacity cap). */
static void mutate(rng_state *r, uint8_t *buf, size_t *n, size_t cap)
{
    uint64_t x = rng_next(r);
    size_t pos = *n ? (size_t)((x >> 8) % *n) : 0;
    switch (x & 7) {
    case 0: if (*n) buf[pos] ^= (uint8_t)(1u << ((x >> 40) & 7)); break;
    case 1: if (*n) buf[pos] = k_interesting[(x >> 40) % sizeof k_interesting]; break;
    case 2: /* insert a byte */
        if (*n < cap) {
            memmove(buf + pos + 1, buf + pos, *n - pos);
            buf[pos] = k_interesting[(x >> 40) % sizeof k_interesting];
            (*n)++;
        }
        break;
    case 3: /* delete a run */
        if (*n) {
            size_t k = 1 + (size_t)((x >> 40) % 8);
            if (k > *n - pos) k = *n - pos;
            memmove(buf + pos, buf + pos + k, *n - pos - k);
            *n -= k;
        }
        break;
    case 4: *n = pos; break; /* truncate */
    case 5: /* rewrite the length prefix */
        if (*n >= 8) {
            uint64_t v = (x >> 40) & 1 ? rng_next(r) : (uint64_t)(*n - 8) + ((x >> 41) % 5) - 2;
            for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(v >> (8 * i));
        }
        break;
    case 6: /* a digit run -> a large or negative number */
        if (*n) {
            static const char *nums[] = {"-1", "18446744073709551616", "9223372036854775807", "0", "1e99", "4294967296"};
            const char *s = nums[(x >> 40) % 6];
            size_t k = strlen(s);
            if (pos + k <= *n) memcpy(buf + pos, s, k);
        }
        break;
    default: /* append junk */
        if (*n < cap) buf[(*n)++] = (uint8_t)(x >> 48);
        break;
    }
}

static int replay_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "fuzz_safetensors: cannot open %s\n", dir);
        return -1;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        FILE *f = fopen(p, "rb");
        if (!f) continue;
        static uint8_t buf[1 << 20];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, len);
        n++;
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv)
{
    const char *corpus = NULL, *seeds_out = NULL;
    long mutations = 20000;
    uint64_t seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--corpus")) corpus = argv[i + 1];
        else if (!strcmp(argv[i], "--mutations")) mutations = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--write-seeds")) seeds_out = argv[i + 1];
        else {
            fprintf(stderr, "usage: fuzz_safetensors [--corpus DIR] [--mutations N] [--seed S] [--write-seeds DIR]\n");
            return 2;
        }
    }
    size_t n_seeds = sizeof k_seeds / sizeof *k_seeds;
    static const size_t data_len[] = {24, 1, 8, 6, 1, 0};
    if (seeds_out) {
        for (size_t i = 0; i < n_seeds; i++) {
            size_t len;
            uint8_t *b = make_seed(k_seeds[i], data_len[i], &len);
            char p[4096];
            snprintf(p, sizeof p, "%s/seed%zu.safetensors", seeds_out, i);
            FILE *f = fopen(p, "wb");
            if (f) {
                fwrite(b, 1, len, f);
                fclose(f);
            }
            free(b);
        }
    }
    int replayed = corpus ? replay_dir(corpus) : 0;
    if (replayed < 0) return 1;
    rng_state r;
    rng_init(&r, seed, 0);
    enum { CAP = 4096 };
    uint8_t *buf = malloc(CAP);
    if (!buf) return 1;
    for (long m = 0; m < mutations; m++) {
        size_t len, k = (size_t)(rng_next(&r) % n_seeds);
        uint8_t *b = make_seed(k_seeds[k], data_len[k], &len);
        memcpy(buf, b, len);
        free(b);
        int edits = 1 + (int)(rng_next(&r) % 4);
        for (int e = 0; e < edits; e++) mutate(&r, buf, &len, CAP);
        /* parse from an exact-size heap copy so ASan sees any read past the end */
        uint8_t *exact = malloc(len ? len : 1);
        if (!exact) return 1;
        memcpy(exact, buf, len);
        LLVMFuzzerTestOneInput(exact, len);
        free(exact);
    }
    free(buf);
    printf("fuzz_safetensors: %d corpus files, %ld mutations, no crash\n", replayed, mutations);
    return 0;
}
#endif
