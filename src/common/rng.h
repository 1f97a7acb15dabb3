/*
 * rng.h — the one generator of deterministic random numbers for all C code
 * outside the library's numerics: tests (tests/main.c: bxt_*, the GPU
 * runner's ct_*, the MPI tests), benchmarks, the dev harnesses and the
 * `bitexact demo` data. xoshiro256** seeded by splitmix64; bx_rng_hash64
 * is the counter-based form (one value from an index: what a GPU thread
 * uses to fill element i). A generator seeded from a run's seed and a
 * test's name replays a failure with the same seed. Header only, BX_HD:
 * compiled for the host and, where nvcc includes it, the device.
 */
#ifndef BX_RNG_H
#define BX_RNG_H

#include <math.h>
#include <stdint.h>

#include "hd.h"

typedef struct bx_rng {
  uint64_t s[4];
} bx_rng;

static inline BX_HD uint64_t bx_rng_splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Counter-based: a well-mixed 64-bit value of (seed, index) alone. */
static inline BX_HD uint64_t bx_rng_hash64(uint64_t seed, uint64_t index) {
  uint64_t x = seed ^ (index * 0xD1B54A32D192ED03ull);
  return bx_rng_splitmix64(&x);
}

static inline void bx_rng_seed(bx_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = bx_rng_splitmix64(&seed);
}

/* Seed from the run's seed and a test name (FNV-1a). */
static inline void bx_rng_named(bx_rng *r, uint64_t seed, const char *name) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = name ? name : ""; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  bx_rng_seed(r, seed ^ h);
}

static inline uint64_t bx_rng_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t bx_rng_next(bx_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = bx_rng_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = bx_rng_rotl(s[3], 45);
  return result;
}

/* Uniform in [0, n), n >= 1 (rejection: no modulo bias). */
static inline uint64_t bx_rng_below(bx_rng *r, uint64_t n) {
  if (n <= 1) return 0;
  uint64_t lim = UINT64_MAX - UINT64_MAX % n, x;
  do
    x = bx_rng_next(r);
  while (x >= lim);
  return x % n;
}

static inline double bx_rng_uniform(bx_rng *r) {
  return (double)(bx_rng_next(r) >> 11) * 0x1p-53;
}

/* Standard normal (Box-Muller). */
static inline double bx_rng_normal(bx_rng *r) {
  double u = bx_rng_uniform(r), v = bx_rng_uniform(r);
  if (u < 0x1p-60) u = 0x1p-60;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

#endif /* BX_RNG_H */
