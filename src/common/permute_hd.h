/*
 * permute_hd.h — the per-output arithmetic of the MoE token dispatch's
 * combines (src/train/permute.c; bitexact_train.h, "MoE router and token
 * dispatch" states them), once for the CPU and the GPU (BX_HD). Copies
 * (bx_moe_permute) keep their bits and have no arithmetic. For output
 * element (t, h), with pos[a] the expert row of slot a of token t:
 *
 *   gather sum (bx_moe_permute_backward):  o = +0; o = o + x[pos[a]][h], a ascending
 *   unpermute (bx_moe_unpermute):          o = +0; o = o + fl(w[a] * y[pos[a]][h]),
 *                                          a ascending; then o = o + initial[t][h]
 *   dy_perm (bx_moe_unpermute_backward):   w * dout[t][h]
 *   dweights (bx_moe_unpermute_backward):  one bx_fmaf chain over h of
 *                                          dout[t][h] * y[pos[a]][h], from +0
 *
 * Every value stored is NaN-canonical. The CPU walks a row at a time (the
 * step functions, vectorised over h); the device one thread per output
 * (the *_out functions: the same steps in the same order).
 */
#ifndef BX_PERMUTE_HD_H
#define BX_PERMUTE_HD_H

#include <stdint.h>

#include "fp_hd.h"
#include "hd.h"
#include "nan_canon.h"

/* ---- steps ------------------------------------------------------------------- */

static inline BX_HD float bx_permute_sum_step_f32(float o, float x) { return o + x; }

static inline BX_HD float bx_unpermute_step_f32(float o, float w, float y) {
  float p = w * y;
  return o + p;
}

static inline BX_HD float bx_unpermute_dy_f32(float w, float d) { return bx_canon_f32(w * d); }

static inline BX_HD float bx_unpermute_dw_step_f32(float acc, float d, float y) {
  return bx_fmaf(d, y, acc);
}

/* ---- one output -------------------------------------------------------------- */

/* Element h of the gather sum of token t: x has rows of H, pos[k]. */
static inline BX_HD float bx_permute_sum_out_f32(const float *x, const int64_t *pos, int64_t k,
                                                 int64_t H, int64_t h) {
  float o = 0.0f;
  for (int64_t a = 0; a < k; a++) o = bx_permute_sum_step_f32(o, x[pos[a] * H + h]);
  return bx_canon_f32(o);
}

/* Element h of the unpermute of token t: y has rows of H, pos[k] and w[k]
 * the token's, init the token's initial row or NULL. */
static inline BX_HD float bx_unpermute_out_f32(const float *y, const int64_t *pos, const float *w,
                                               int64_t k, int64_t H, int64_t h, const float *init) {
  float o = 0.0f;
  for (int64_t a = 0; a < k; a++) o = bx_unpermute_step_f32(o, w[a], y[pos[a] * H + h]);
  if (init) o = bx_permute_sum_step_f32(o, init[h]);
  return bx_canon_f32(o);
}

/* The weight gradient of one slot: d = dout's row, yrow = y's row at pos. */
static inline BX_HD float bx_unpermute_dw_out_f32(const float *d, const float *yrow, int64_t H) {
  float acc = 0.0f;
  for (int64_t h = 0; h < H; h++) acc = bx_unpermute_dw_step_f32(acc, d[h], yrow[h]);
  return bx_canon_f32(acc);
}

#endif /* BX_PERMUTE_HD_H */
