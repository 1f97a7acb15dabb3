/*
 * swiglu_hd.h — the per-element arithmetic of bx_swiglu_forward/_backward
 * (src/train/swiglu.c; bitexact_train.h states the formulas), once for the
 * CPU and the GPU (BX_HD). Each output element depends on the same element
 * of the inputs only.
 *
 * The CPU computes SiLU and sigmoid of a block of gates with the active
 * ISA's vector loops (the bits of bx_siluf_det / bx_sigmoidf_det on every
 * input), then combines with the *_combine functions; the device (one
 * thread per element) calls bx_swiglu_fwd_f32 / bx_swiglu_bwd_f32, which
 * are the same combine after the scalar functions. Every value stored is
 * NaN-canonical (nan_canon.h).
 */
#ifndef BX_SWIGLU_HD_H
#define BX_SWIGLU_HD_H

#include "fp_hd.h"
#include "hd.h"
#include "math_det.h"
#include "nan_canon.h"

/* h = SiLU(g) * u, given silu_g = bx_siluf_det(g). */
static inline BX_HD float bx_swiglu_fwd_combine_f32(float silu_g, float u) {
  return bx_canon_f32(silu_g * u);
}

/* dg and du of one element, given sig = bx_sigmoidf_det(x) and
 * silu = bx_siluf_det(x): torch's order, whose FMA build contracts
 * 1 + x (1 - s) into one fma (one bx_fmaf here). */
static inline BX_HD void bx_swiglu_bwd_combine_f32(float x, float up, float d, float sig,
                                                   float silu, float *dg, float *du) {
  float dsilu = d * up;
  *dg = bx_canon_f32((dsilu * sig) * bx_fmaf(x, 1.0f - sig, 1.0f));
  *du = bx_canon_f32(d * silu);
}

/* The whole element (the device's thread; the simulation's reference). */
static inline BX_HD float bx_swiglu_fwd_f32(float g, float u) {
  return bx_swiglu_fwd_combine_f32(bx_siluf_det(g), u);
}
static inline BX_HD void bx_swiglu_bwd_f32(float g, float u, float dh, float *dg, float *du) {
  bx_swiglu_bwd_combine_f32(g, u, dh, bx_sigmoidf_det(g), bx_siluf_det(g), dg, du);
}

#endif /* BX_SWIGLU_HD_H */
