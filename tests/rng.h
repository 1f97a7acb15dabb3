/*
 * rng.h — the tests' deterministic random numbers (xoshiro256**, seeded by
 * splitmix64), shared by the C suite (tests/main.c: bxt_*) and the GPU
 * runner (tests/cuda/harness.c: ct_*). A generator is seeded from the run's
 * seed and the test's name, so a failure replays with the same seed.
 */
#ifndef BX_TEST_RNG_H
#define BX_TEST_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct bx_test_rng {
  uint64_t s[4];
} bx_test_rng;

static inline uint64_t bx_test_splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline void bx_test_rng_seed(bx_test_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = bx_test_splitmix64(&seed);
}

/* Seed from the run's seed and a test name (FNV-1a). */
static inline void bx_test_rng_named(bx_test_rng *r, uint64_t seed, const char *name) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = name ? name : ""; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  bx_test_rng_seed(r, seed ^ h);
}

static inline uint64_t bx_test_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t bx_test_next(bx_test_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = bx_test_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = bx_test_rotl(s[3], 45);
  return result;
}

/* Uniform in [0, n), n >= 1 (rejection: no modulo bias). */
static inline uint64_t bx_test_below(bx_test_rng *r, uint64_t n) {
  if (n <= 1) return 0;
  uint64_t lim = UINT64_MAX - UINT64_MAX % n, x;
  do
    x = bx_test_next(r);
  while (x >= lim);
  return x % n;
}

static inline double bx_test_uniform(bx_test_rng *r) {
  return (double)(bx_test_next(r) >> 11) * 0x1p-53;
}

/* Standard normal (Box-Muller). */
static inline double bx_test_normal(bx_test_rng *r) {
  double u = bx_test_uniform(r), v = bx_test_uniform(r);
  if (u < 0x1p-60) u = 0x1p-60;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

#endif /* BX_TEST_RNG_H */
