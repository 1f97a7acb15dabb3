/*
 * train_cuda_sim.h — the harness of the training kernels' CUDA simulation
 * (issue 30, S2; tests/test_train_cuda_sim*.c): a simulated grid that runs
 * a train_grid header's thread bodies with blocks and threads shuffled,
 * values with every kind of special, and the bitwise comparison.
 */
#ifndef BXT_TRAIN_CUDA_SIM_H
#define BXT_TRAIN_CUDA_SIM_H

#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "train_elementwise.h"
#include "train_grid.h"

/* ---- the simulated grid ----------------------------------------------------------- */

typedef void (*sim_body)(const void *ctx, uint64_t i);

static inline void shuffle_u32(bxt_rng *r, uint32_t *v, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) v[i] = i;
  for (uint32_t i = n; i > 1; i--) {
    uint32_t j = (uint32_t)bxt_below(r, i), t = v[i - 1];
    v[i - 1] = v[j];
    v[j] = t;
  }
}

/* A grid-stride kernel over items: the launcher's block count or (half the
 * time) a random smaller one; blocks, and threads inside a block, in random
 * order; each thread's indices in its own ascending order. */
static inline void sim_grid(bxt_rng *r, uint64_t items, sim_body f, const void *ctx) {
  uint32_t blocks = bx_tg_blocks(items);
  if (bxt_below(r, 2)) blocks = 1 + (uint32_t)bxt_below(r, blocks);
  uint32_t *bo = malloc(blocks * sizeof *bo), to[BX_TG_BLOCK];
  shuffle_u32(r, bo, blocks);
  uint64_t stride = (uint64_t)blocks * BX_TG_BLOCK;
  for (uint32_t b = 0; b < blocks; b++) {
    shuffle_u32(r, to, BX_TG_BLOCK);
    for (uint32_t t = 0; t < BX_TG_BLOCK; t++)
      for (uint64_t i = (uint64_t)bo[b] * BX_TG_BLOCK + to[t]; i < items; i += stride) f(ctx, i);
  }
  free(bo);
}

/* ---- values --------------------------------------------------------------------------- */

/* Mostly ordinary values of scale ~1, with every kind of special. */
static inline float sim_value(bxt_rng *r) {
  static const uint32_t specials[] = {
      0x00000000u, 0x80000000u,             /* +-0 */
      0x00000001u, 0x807FFFFFu, 0x00400000u, /* subnormals */
      0x7F800000u, 0xFF800000u,             /* +-Inf */
      0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFA5A5A5u, 0x7FC12345u, /* NaNs */
      0x7F7FFFFFu, 0x00800000u, 0x3F800000u, 0xBF800000u};
  uint64_t k = bxt_below(r, 64);
  if (k < 4) return bx_f32_from_bits(specials[bxt_below(r, sizeof specials / 4)]);
  if (k < 8) return (float)(int)bxt_below(r, 9) - 4.0f; /* small integers: ties, exact zeros */
  if (k < 12) return bx_bf16_to_f32((uint16_t)(bx_f32_bits((float)bxt_normal(r)) >> 16));
  return (float)bxt_normal(r);
}

/* Values without the specials (where a NaN would only make every output NaN). */
static inline float sim_plain(bxt_rng *r) {
  return bxt_below(r, 8) ? (float)bxt_normal(r) : (float)(int)bxt_below(r, 5) - 2.0f;
}

static inline float *sim_fill(bxt_rng *r, size_t n, int specials) {
  float *x = malloc((n ? n : 1) * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = specials ? sim_value(r) : sim_plain(r);
  return x;
}

static inline float *sim_copy(const float *x, size_t n) {
  float *y = malloc((n ? n : 1) * sizeof *y);
  memcpy(y, x, n * sizeof *y);
  return y;
}

/* The first differing element of two float arrays (bits), or -1. */
static inline long sim_diff(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (bx_f32_bits(a[i]) != bx_f32_bits(b[i])) return (long)i;
  return -1;
}

#define CHECK_SAME(got, want, n, what, ...)                                              \
  do {                                                                                   \
    long d_ = sim_diff((got), (want), (n));                                              \
    CHECK(d_ < 0, what ": element %ld: sim 0x%08x, CPU 0x%08x", __VA_ARGS__, d_,          \
          d_ < 0 ? 0u : bx_f32_bits((got)[d_]), d_ < 0 ? 0u : bx_f32_bits((want)[d_]));   \
  } while (0)

#endif /* BXT_TRAIN_CUDA_SIM_H */
