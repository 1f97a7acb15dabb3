/*
 * xent_hd.h — one token's row of the cross-entropy (src/train/xent.c;
 * bitexact_train.h, "Layers: embedding, cross-entropy" states it), once for
 * the CPU and the GPU (BX_HD): the row maximum (compare-select, a NaN
 * flagged apart), e_v = bx_expf_det(z_v - m), S = the fp64 sum of the e_v
 * in ascending v (sequential: one thread per token on the device; making
 * it an exact fixed-point sum is issue 30's open item), the loss
 * (m - z_y) + ln S in fp64 rounded once, and the gradient
 * (e_v / S) * c, (e_y / S - 1) * c with c = f64(grad_scale / N).
 *
 * The CPU runs the exp over blocks with the active ISA's vector loop (the
 * bits of bx_expf_det) and calls the pieces; bx_xent_row_f32 is the same
 * row with the scalar exp (the device's thread, the simulation's
 * reference).
 */
#ifndef BX_XENT_HD_H
#define BX_XENT_HD_H

#include <stdint.h>

#include "fp_hd.h"
#include "hd.h"
#include "math_det.h"
#include "nan_canon.h"
#include "pow_det.h"

/* The maximum of z[0..V) (compare-select from -Inf); *nan = 1 when some
 * z_v is a NaN (then the maximum is meaningless). */
static inline BX_HD float bx_xent_row_max_f32(const float *z, uint64_t V, int *nan) {
  float m = bx_neg_inf_f32();
  int n = 0;
  for (uint64_t v = 0; v < V; v++) {
    n |= z[v] != z[v];
    m = bx_max_sel_f32(m, z[v]);
  }
  *nan = n;
  return m;
}

/* 1 when the row has no loss but the canonical NaN (a NaN logit, or an
 * infinite maximum). */
static inline BX_HD int bx_xent_row_is_nan(float m, int nan) {
  return nan || m == bx_pos_inf_f32() || m == bx_neg_inf_f32();
}

/* ln S for S >= 1 (finite): the high part of log2(S) * ln 2 in
 * double-double (pow_det.h; relative error ~2^-78 before that rounding). */
static inline BX_HD double bx_xent_ln_sum(double S) {
  const bx_pd_dd ln2 = {0x1.62e42fefa39efp-1, 0x1.abc9e3b39803fp-56};
  return bx_pd_mul(bx_pd_log2(S), ln2).hi;
}

/* The loss of a finite row: (m - z_y) + ln S, in fp64, rounded once. */
static inline BX_HD float bx_xent_loss_f32(float m, float zy, double S) {
  return (float)(((double)m - (double)zy) + bx_xent_ln_sum(S));
}

/* The gradient of a non-target logit from its e_v, and of the target. */
static inline BX_HD float bx_xent_grad_f32(float e, double S, double c) {
  return (float)(((double)e / S) * c);
}
static inline BX_HD float bx_xent_grad_target_f32(float ey, double S, double c) {
  return (float)(((double)ey / S - 1.0) * c);
}

/* The rows that need no exp: y < 0 (ignored: loss 0, gradient 0) and a
 * row whose max is NaN or infinite (loss and gradient the canonical NaN):
 * 1 with loss (may be NULL) and g (may be NULL) written; 0 otherwise, with
 * *m the row's max. Every row form calls it first. */
static inline BX_HD int bx_xent_row_special_f32(const float *z, float *g, uint64_t V, int64_t y,
                                               float *loss, float *m) {
  float q = 0.0f;
  if (y >= 0) {
    int nan;
    *m = bx_xent_row_max_f32(z, V, &nan);
    if (!bx_xent_row_is_nan(*m, nan)) return 0;
    q = bx_f32_from_bits(BX_F32_CANON_NAN);
  }
  if (loss) *loss = q;
  if (g)
    for (uint64_t v = 0; v < V; v++) g[v] = q;
  return 1;
}

/* The whole row with the scalar exp: y < 0 ignored (loss 0, gradient 0);
 * g may be NULL (forward only) or z itself; loss may be NULL. */
static inline BX_HD void bx_xent_row_f32(const float *z, float *g, uint64_t V, int64_t y,
                                         double c, float *loss) {
  float m;
  if (bx_xent_row_special_f32(z, g, V, y, loss, &m)) return;
  float zy = z[y];
  double S = 0.0;
  for (uint64_t v = 0; v < V; v++) {
    float e = bx_expf_det(z[v] - m);
    if (g) g[v] = e;
    S += (double)e;
  }
  if (loss) *loss = bx_xent_loss_f32(m, zy, S);
  if (!g) return;
  float ey = g[y];
  for (uint64_t v = 0; v < V; v++) g[v] = bx_xent_grad_f32(g[v], S, c);
  g[y] = bx_xent_grad_target_f32(ey, S, c);
}

#endif /* BX_XENT_HD_H */
