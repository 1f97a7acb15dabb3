/*
 * adamw_hd.h — the per-element update of bx_adamw_step (src/train/adamw.c
 * forms the fp32 scalars once per call, as torch's Python code does; the
 * header bitexact_train.h states the formula), once for the CPU and the
 * GPU (BX_HD). Every operation is one IEEE rounding: bx_fmaf (fused, one
 * rounding on every ISA and device), bx_sqrtf, division, multiplication,
 * addition; -ffp-contract=off / --fmad=false add no fusion. So the CPU's
 * vector loops (src/cpu/adamw_body.h, run by every ISA table) and the
 * device's one thread per element give the same bits.
 */
#ifndef BX_ADAMW_HD_H
#define BX_ADAMW_HD_H

#include "fp_hd.h"
#include "hd.h"
#include "nan_canon.h"

/* The fp32 scalars of one step (adamw.c). */
typedef struct bx_adamw_scalars {
  float decay;     /* f32(1 - lr*wd); unused unless do_decay (torch skips the mul) */
  int do_decay;
  float w;         /* f32(1 - beta1): lerp weight */
  float beta2;     /* f32(beta2) */
  float one_m_b2;  /* f32(1 - beta2) */
  float bc2_sqrt;  /* f32(sqrt(1 - beta2^t)) */
  float eps;       /* f32(eps) */
  float neg_step;  /* f32(-(lr / (1 - beta1^t))) */
} bx_adamw_scalars;

/* What the loop hoists out of the scalars. */
typedef struct bx_adamw_prep {
  float dec;  /* the decay factor, or 1 (p * 1 = p: the skipped mul's bits) */
  float wl;   /* torch's lerp weight: w below 0.5, else w - 1 */
  int near0;  /* |w| < 0.5 */
} bx_adamw_prep;

static inline BX_HD bx_adamw_prep bx_adamw_prepare(const bx_adamw_scalars *s) {
  bx_adamw_prep q;
  q.dec = s->do_decay ? s->decay : 1.0f;
  q.near0 = s->w < 0.5f && s->w > -0.5f;
  q.wl = q.near0 ? s->w : s->w - 1.0f;
  return q;
}

/* One element: *p, *m, *v updated from g (the values stored are
 * NaN-canonical). Scalars by value, so that a vectorising compiler keeps
 * them in registers. */
static inline BX_HD void bx_adamw_elem_f32(float *p, float g, float *m, float *v, float dec,
                                           float wl, int near0, float one_m_b2, float beta2,
                                           float bc2_sqrt, float eps, float neg_step) {
  float pi = *p * dec, mi = *m;
  float d = g - mi;
  /* torch's vectorised lerp: fmadd(weight, end - start, start), or for
   * weights >= 0.5 fmadd(weight - 1, end - start, end) */
  mi = bx_fmaf(wl, d, near0 ? mi : g);
  /* torch's addcmul_ after mul_: fmadd(value * t1, t2, self) */
  float vi = bx_fmaf(one_m_b2 * g, g, *v * beta2);
  float denom = bx_sqrtf(vi) / bc2_sqrt + eps;
  *p = bx_canon_f32(pi + (neg_step * mi) / denom);
  *m = bx_canon_f32(mi);
  *v = bx_canon_f32(vi);
}

#endif /* BX_ADAMW_HD_H */
