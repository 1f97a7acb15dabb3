/*
 * glm_data.c — the data order and the synthetic corpus (glm_data.h): pure
 * functions of their counters.
 */
#include <math.h>

#include "glm_data.h"

static uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t glm_rand(uint64_t seed, uint64_t domain, uint64_t i) {
  return mix(mix(mix(seed) ^ domain) ^ i);
}

uint64_t glm_rand3(uint64_t seed, uint64_t domain, uint64_t a, uint64_t b) {
  return mix(glm_rand(seed, domain, a) ^ b);
}

uint64_t glm_mulhi(uint64_t x, uint64_t n) {
  return (uint64_t)(((unsigned __int128)x * n) >> 64);
}

void glm_epoch_perm(uint64_t seed, int64_t e, int64_t S, int64_t *perm) {
  for (int64_t i = 0; i < S; i++) perm[i] = i;
  for (int64_t i = S - 1; i >= 1; i--) {
    int64_t j = (int64_t)glm_mulhi(glm_rand3(seed, 4, (uint64_t)e, (uint64_t)i), (uint64_t)i + 1);
    int64_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

static int synth_k(int64_t V) { return V - 1 < 8 ? (int)(V - 1) : 8; }

void glm_synth_tokens(uint64_t seed, int64_t V, int32_t *out, int64_t n) {
  int K = synth_k(V);
  int64_t off[8];
  int m = 0;
  for (uint64_t c = 0; m < K; c++) {
    int64_t o = 1 + (int64_t)glm_mulhi(glm_rand(seed, 1, c), (uint64_t)V - 1);
    int dup = 0;
    for (int j = 0; j < m; j++) dup |= off[j] == o;
    if (!dup) off[m++] = o;
  }
  int64_t tok = (int64_t)glm_mulhi(glm_rand(seed, 2, 0), (uint64_t)V);
  for (int64_t t = 0; t < n; t++) {
    out[t] = (int32_t)tok;
    uint64_t r = glm_rand(seed, 3, (uint64_t)t);
    int k = r ? __builtin_clzll(r) : 64;
    if (k > K - 1) k = K - 1;
    tok = (tok + off[k]) % V;
  }
}

double glm_synth_entropy_bits(int64_t V) {
  int K = synth_k(V);
  double h = 0;
  for (int k = 0; k < K - 1; k++) h += (double)(k + 1) * ldexp(1.0, -(k + 1));
  return h + (double)(K - 1) * ldexp(1.0, -(K - 1));
}
