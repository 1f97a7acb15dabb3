/*
 * grid_math.h — the thread bodies of the last training entries on the
 * device (issue 30): the elementwise math (bx_exp ... bx_cos,
 * bx_round_bf16; math.cu), RoPE's cos/sin table (bx_rope_cos_sin;
 * rope.cu) and the bias-gradient chunk partials (bx_bias_grad_partials;
 * tokred.cu's neighbour bias_partials.cu). Plain C with BX_HD, as
 * train_grid.h: the CPU suite (tests/test_train_cuda_sim_math.c) and the
 * host simulation (src/hostsim/train_sim.c) run the very same bodies.
 * The arithmetic is the CPU's own: math_det.h's scalar functions (the
 * CPU's vector loops give their bits, dev/math_exhaustive.c --vector),
 * scale_round.h's bx_f32_to_bf16 (bf16_body.h's integer rule), rope_hd.h,
 * and grid_tokred.h's bias partial (wgrad.c's colsum order).
 */
#ifndef BX_GRID_MATH_H
#define BX_GRID_MATH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "grid_tokred.h"
#include "hd.h"
#include "math_det.h"
#include "rope_hd.h"
#include "scale_round.h"
#include "train_device.h"

/* ---- elementwise math: one thread per element ------------------------------------ */

typedef struct bx_tgm_math {
  const float *x;
  void *y;    /* float, or uint16_t (bf16) for BX_TDEV_ROUND_BF16 */
  uint64_t n;
  int op;     /* a bx_tdev_math_op (train_device.h) */
} bx_tgm_math;

/* The fp32 result of op on x (ops other than BX_TDEV_ROUND_BF16). */
static inline BX_HD float bx_tgm_math_f32(int op, float x) {
  switch (op) {
  case BX_TDEV_EXP: return bx_expf_det(x);
  case BX_TDEV_LOG: return bx_logf_det(x);
  case BX_TDEV_SIGMOID: return bx_sigmoidf_det(x);
  case BX_TDEV_SILU: return bx_siluf_det(x);
  case BX_TDEV_RSQRT: return bx_rsqrtf_det(x);
  case BX_TDEV_SIN: return bx_sinf_det(x);
  default: return bx_cosf_det(x);
  }
}

/* Element i: y[i] = op(x[i]) (x is read before y is written: y may be x). */
static inline BX_HD void bx_tgm_math_elem(const bx_tgm_math *a, uint64_t i) {
  if (a->op == BX_TDEV_ROUND_BF16)
    ((uint16_t *)a->y)[i] = bx_f32_to_bf16(a->x[i]);
  else
    ((float *)a->y)[i] = bx_tgm_math_f32(a->op, a->x[i]);
}

/* ---- bx_rope_cos_sin: one thread per (token, slot) ---------------------------------- */

typedef struct bx_tgm_rope_table {
  const int64_t *pos; /* [tokens], checked in [0, 2^24] */
  float *cos, *sin;   /* [tokens, half] */
  uint64_t tokens, half, rotary_dim;
  float theta;
} bx_tgm_rope_table;

/* Item i = token t * half + slot s: the inverse frequency of s (the host's
 * bits, formed per thread as rope.cu does), the angle, cos and sin. */
static inline BX_HD void bx_tgm_rope_table_item(const bx_tgm_rope_table *a, uint64_t i) {
  uint64_t t = i / a->half, s = i % a->half;
  float inv = bx_rope_inv_freq_f32(s, a->rotary_dim, a->theta);
  bx_rope_cos_sin_f32(bx_rope_angle_f32(a->pos[t], inv), 1.0f, &a->cos[i], &a->sin[i]);
}

/* ---- bx_bias_grad_partials: one thread per (chunk, column) -------------------------- */

/* Item i = chunk c * n + column j of w (dy, dy_bf16, t, n, chunk,
 * nchunks set; the rest unused): out[i] = grid_tokred.h's bias partial. */
static inline BX_HD void bx_tgm_bias_item(const bx_tgt_wgrad *w, float *out, uint64_t i) {
  out[i] = bx_canon_f32(bx_tgt_bias_partial(w, i / w->n, i % w->n)); /* the canonical NaN */
}

/* The bias partials' launch arguments (math.cu, and the host simulation):
 * dy [t, n] (bf16 when dy_bf16) in chunks of chunk rows. Host code. */
static inline bx_tgt_wgrad bx_tgm_bias_args(const void *dy, int dy_bf16, size_t t, size_t n,
                                            size_t chunk, size_t nchunks) {
  bx_tgt_wgrad w;
  memset(&w, 0, sizeof w);
  w.dy = dy;
  w.dy_bf16 = dy_bf16;
  w.t = t;
  w.n = n;
  w.chunk = chunk;
  w.nchunks = nchunks;
  return w;
}

#endif /* BX_GRID_MATH_H */
