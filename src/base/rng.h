/* rng.h - xoshiro256** pseudo-random numbers with independent, addressable streams.
 *
 * A stream is named by (seed, stream id): rng_init() runs both through
 * splitmix64 to fill the 256-bit state, so streams for neighbouring ids are
 * uncorrelated. Synthetic weights use one stream per (tensor, chunk) so that
 * any thread can generate any chunk and the output does not depend on the
 * thread count. xoshiro256** passes BigCrush and costs ~1 ns per 64 bits. */
#ifndef DS_RNG_H
#define DS_RNG_H

#include <stdint.h>

typedef struct { uint64_t s[4]; } rng_state;

/* splitmix64 step: advances *x and returns a well-mixed 64-bit value. */
static inline uint64_t rng_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rng_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(rng_state *r)
{
    uint64_t *s = r->s;
    uint64_t out = rng_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rng_rotl(s[3], 45);
    return out;
}

/* Uniform in [-1, 1) on a grid of 2^-23, from the top 24 bits of bits. */
static inline float rng_sym24(uint32_t bits) { return ((float)(bits >> 8) - 8388608.0f) * 0x1p-23f; }

/* Uniform in [0, 1) with 53 random bits. */
static inline double rng_uniform(rng_state *r) { return (double)(rng_next(r) >> 11) * 0x1p-53; }

/* Seeds the stream (seed, stream). */
void rng_init(rng_state *r, uint64_t seed, uint64_t stream);

/* A 64-bit hash of a string mixed with seed (to name a stream by a tensor name). */
uint64_t rng_hash_str(uint64_t seed, const char *s);

/* A standard normal variate (Box-Muller; one of the pair is discarded). */
double rng_normal(rng_state *r);

#endif
