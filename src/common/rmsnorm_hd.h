/*
 * rmsnorm_hd.h — the arithmetic of bx_rmsnorm_forward/_backward
 * (src/train/rmsnorm.c; bitexact_train.h states it), once for the CPU and
 * the GPU (BX_HD). Per row: the sum of squares is one sequential bx_fmaf
 * chain over the features (j ascending), divided by H, then
 * bx_rsqrtf_det(mean + eps); y = w * (x * rstd). Backward per row: one
 * bx_fmaf chain of g * xhat (g = dy * w), divided by H, then
 * dx = rstd * fma(-xhat, m, g). The weight gradient's chunk partial of a
 * column is one bx_fmaf chain over the chunk's rows (ascending) from +0.
 * Every value stored is NaN-canonical (nan_canon.h).
 *
 * The row functions read a row with a stride (1 on the CPU); the step
 * functions are what a vectorised CPU loop or a transposed device loop
 * calls element by element, in the same order.
 */
#ifndef BX_RMSNORM_HD_H
#define BX_RMSNORM_HD_H

#include <stdint.h>

#include "fp_hd.h"
#include "hd.h"
#include "math_det.h"
#include "nan_canon.h"

/* ---- forward ---------------------------------------------------------------- */

/* One step of the sum of squares. */
static inline BX_HD float bx_rmsnorm_sq_step_f32(float acc, float x) { return bx_fmaf(x, x, acc); }

/* rstd from the finished sum of squares of h features (h <= 2^24: exact). */
static inline BX_HD float bx_rmsnorm_rstd_finish_f32(float acc, uint64_t h, float eps) {
  float mean = acc / (float)h;
  return bx_rsqrtf_det(mean + eps);
}

/* The rstd of a row of h values x[j * stride] (not canonicalised: the
 * outputs computed from it are). */
static inline BX_HD float bx_rmsnorm_rstd_f32(const float *x, uint64_t stride, uint64_t h,
                                              float eps) {
  float acc = 0.0f;
  for (uint64_t j = 0; j < h; j++) acc = bx_rmsnorm_sq_step_f32(acc, x[j * stride]);
  return bx_rmsnorm_rstd_finish_f32(acc, h, eps);
}

/* One output y = w * (x * rstd). */
static inline BX_HD float bx_rmsnorm_y_f32(float x, float w, float rstd) {
  float xhat = x * rstd;
  return bx_canon_f32(w * xhat);
}

/* ---- backward --------------------------------------------------------------- */

/* One step of the backward's chain: acc + (dy * w) * (x * rstd). */
static inline BX_HD float bx_rmsnorm_gx_step_f32(float acc, float x, float w, float dy,
                                                 float rstd) {
  float g = dy * w;
  float xhat = x * rstd;
  return bx_fmaf(g, xhat, acc);
}

/* m = (sum of g * xhat) / H of a row (values at j * stride). */
static inline BX_HD float bx_rmsnorm_bwd_mean_f32(const float *x, const float *w, const float *dy,
                                                  uint64_t stride, uint64_t h, float rstd) {
  float acc = 0.0f;
  for (uint64_t j = 0; j < h; j++)
    acc = bx_rmsnorm_gx_step_f32(acc, x[j * stride], w[j], dy[j * stride], rstd);
  return acc / (float)h;
}

/* One dx = rstd * (g - xhat * m), with one fma. */
static inline BX_HD float bx_rmsnorm_dx_f32(float x, float w, float dy, float rstd, float m) {
  float g = dy * w;
  float xhat = x * rstd;
  return bx_canon_f32(rstd * bx_fmaf(-xhat, m, g));
}

/* One step of a column's weight-gradient partial: p + dy * (x * rstd). */
static inline BX_HD float bx_rmsnorm_wpart_step_f32(float p, float dy, float x, float rstd) {
  return bx_fmaf(dy, x * rstd, p);
}

/* The partial of column k over rows [t0, t1) (row stride h), canonical. */
static inline BX_HD float bx_rmsnorm_wpart_f32(const float *x, const float *dy, const float *rstd,
                                               uint64_t h, uint64_t k, uint64_t t0, uint64_t t1) {
  float p = 0.0f;
  for (uint64_t t = t0; t < t1; t++)
    p = bx_rmsnorm_wpart_step_f32(p, dy[t * h + k], x[t * h + k], rstd[t]);
  return bx_canon_f32(p);
}

#endif /* BX_RMSNORM_HD_H */
