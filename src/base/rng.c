/* rng.c - seeding for xoshiro256** streams and the slower distributions. */
#include "rng.h"

#include <math.h>

void rng_init(rng_state *r, uint64_t seed, uint64_t stream)
{
    /* Mix the stream id through its own splitmix round before combining, so
     * (seed, stream) and (seed + 1, stream - 1) do not collide. */
    uint64_t x = stream;
    uint64_t k = rng_splitmix64(&x) ^ seed;
    for (int i = 0; i < 4; i++) r->s[i] = rng_splitmix64(&k);
    if (!(r->s[0] | r->s[1] | r->s[2] | r->s[3])) r->s[0] = 1; /* the all-zero state is a fixed point */
}

uint64_t rng_hash_str(uint64_t seed, const char *s)
{
    uint64_t h = 1469598103934665603ULL ^ seed; /* FNV-1a, then a splitmix finaliser */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return rng_splitmix64(&h);
}

double rng_normal(rng_state *r)
{
    double u1 = 1.0 - rng_uniform(r); /* (0, 1]: log is finite */
    double u2 = rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
