/* fuzz_driver.c - runs a fuzz target without libFuzzer, for the test suite.
 *
 *   fuzz_<target> [--mutations N] [--seed S] [--max-len L] PATH...
 * replays every file of each PATH (a file or a directory: seeds, and the
 * crashers kept as regression tests), then feeds N random mutations of those
 * files (bit flips, interesting bytes and tokens, insertions, deletions,
 * duplications, splices of two inputs, truncations). Every input is passed in
 * an exact-size heap buffer so that a read past its end shows under ASan.
 * Coverage-guided search is libFuzzer's job (tests/fuzz/run.sh); this is the
 * quick regression check the suite runs under the sanitizers. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/rng.h"
#include "fuzz.h"

#pragma weak LLVMFuzzerInitialize

typedef struct { uint8_t *p; size_t n; } blob;
static blob *g_in;
static size_t g_n, g_cap;

static void add_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return;
    blob b = {NULL, 0};
    size_t cap = 0;
    for (;;) {
        if (b.n == cap && !(b.p = realloc(b.p, cap = cap * 2 + 4096))) abort();
        size_t r = fread(b.p + b.n, 1, cap - b.n, f);
        if (!r) break;
        b.n += r;
    }
    fclose(f);
    if (g_n == g_cap && !(g_in = realloc(g_in, (g_cap = g_cap * 2 + 16) * sizeof *g_in))) abort();
    g_in[g_n++] = b;
}

static void add_path(const char *path)
{
    struct stat sb;
    if (stat(path, &sb)) {
        fprintf(stderr, "fuzz driver: %s: no such file or directory\n", path);
        exit(2);
    }
    if (!S_ISDIR(sb.st_mode)) {
        add_file(path);
        return;
    }
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        add_path(p);
    }
    if (d) closedir(d);
}

static void run_one(const uint8_t *p, size_t n)
{
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) abort();
    memcpy(exact, p, n);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
}

static const char *const k_tokens[] = {
    "0", "-1", "9223372036854775807", "-9223372036854775808", "18446744073709551616", "1e308", "-0", "2147483648",
    "null", "true", "\"\"", "[]", "{}", "{{", "}}", "{%", "%}", "{#", "\\u0000", "\xff", "\xf0\x9f\x98\x80", "\xe4\xb8\xad",
    "<｜User｜>", "endfor", "endif", "loop.index", " ** ", " // ", "|length", "[::-1]", "\\\\", "\n", "  ",
};

static void mutate(rng_state *r, uint8_t *buf, size_t *n, size_t cap)
{
    uint64_t x = rng_next(r);
    size_t pos = *n ? (size_t)((x >> 8) % (*n + 1)) : 0, at = pos < *n ? pos : (*n ? *n - 1 : 0);
    switch (x % 9) {
    case 0: if (*n) buf[at] ^= (uint8_t)(1u << ((x >> 40) & 7)); break;
    case 1: if (*n) buf[at] = (uint8_t)(x >> 48); break;
    case 2: case 3: { /* insert a token */
        const char *t = k_tokens[(x >> 40) % (sizeof k_tokens / sizeof *k_tokens)];
        size_t k = strlen(t);
        if (*n + k <= cap) {
            memmove(buf + pos + k, buf + pos, *n - pos);
            memcpy(buf + pos, t, k);
            *n += k;
        }
        break;
    }
    case 4: { /* delete a run */
        size_t k = 1 + (size_t)((x >> 40) % 16);
        if (k > *n - pos) k = *n - pos;
        memmove(buf + pos, buf + pos + k, *n - pos - k);
        *n -= k;
        break;
    }
    case 5: { /* duplicate a run */
        size_t k = 1 + (size_t)((x >> 40) % 64);
        if (k > *n - pos) k = *n - pos;
        if (*n + k <= cap) {
            memmove(buf + pos + k, buf + pos, *n - pos);
            *n += k;
        }
        break;
    }
    case 6: { /* splice in a piece of another input */
        const blob *o = &g_in[(x >> 32) % g_n];
        if (!o->n) break;
        size_t from = (size_t)(rng_next(r) % o->n), k = 1 + (size_t)((x >> 40) % 128);
        if (k > o->n - from) k = o->n - from;
        if (*n + k <= cap) {
            memmove(buf + pos + k, buf + pos, *n - pos);
            memcpy(buf + pos, o->p + from, k);
            *n += k;
        }
        break;
    }
    case 7: if ((x >> 40) % 4 == 0) *n = pos; break; /* truncate */
    default: /* swap two bytes */
        if (*n > 1) {
            size_t b = (size_t)(rng_next(r) % *n);
            uint8_t t = buf[at];
            buf[at] = buf[b];
            buf[b] = t;
        }
        break;
    }
}

int main(int argc, char **argv)
{
    long mutations = 2000;
    uint64_t seed = 1;
    size_t max_len = 1 << 16;
    int i = 1;
    for (; i + 1 < argc && !strncmp(argv[i], "--", 2); i += 2) {
        if (!strcmp(argv[i], "--mutations")) mutations = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--max-len")) max_len = (size_t)strtoull(argv[i + 1], NULL, 10);
        else break;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    for (; i < argc; i++) add_path(argv[i]);
    if (!g_n) {
        fprintf(stderr, "usage: %s [--mutations N] [--seed S] [--max-len L] FILE_OR_DIR...\n", argv[0]);
        return 2;
    }
    for (size_t k = 0; k < g_n; k++) run_one(g_in[k].p, g_in[k].n);
    rng_state r;
    rng_init(&r, seed, 0);
    uint8_t *buf = malloc(max_len);
    if (!buf) abort();
    for (long m = 0; m < mutations; m++) {
        const blob *b = &g_in[rng_next(&r) % g_n];
        size_t n = b->n < max_len ? b->n : max_len;
        memcpy(buf, b->p, n);
        int edits = 1 + (int)(rng_next(&r) % 8);
        for (int e = 0; e < edits; e++) mutate(&r, buf, &n, max_len);
        run_one(buf, n);
    }
    free(buf);
    printf("%s: %zu inputs replayed, %ld mutations, no crash\n", argv[0], g_n, mutations);
    return 0;
}
