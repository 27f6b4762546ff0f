/* rng.c - the engine's random numbers: xoshiro256** seeded through splitmix64. Small, fast,
 * and its whole state (four words) goes into checkpoints so resumed runs draw the same numbers.
 * Not for cryptography. */
#include <math.h>

#include "engine/engine.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void eng_rng_seed(eng_rng_t *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t eng_rng_next(eng_rng_t *r)
{
    uint64_t *s = r->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double eng_rng_uniform(eng_rng_t *r) { return (double)(eng_rng_next(r) >> 11) * 0x1.0p-53; }

double eng_rng_normal(eng_rng_t *r)
{
    /* Box-Muller, one value per call (no cached spare, so the state is just s[]). */
    double u1 = eng_rng_uniform(r), u2 = eng_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

uint64_t eng_rng_below(eng_rng_t *r, uint64_t n)
{
    if (n == 0) return 0;
    /* rejection sampling: unbiased */
    uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = eng_rng_next(r);
    while (x >= lim);
    return x % n;
}
