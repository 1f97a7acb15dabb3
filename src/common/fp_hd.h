/*
 * fp_hd.h — the IEEE operations the training kernels' per-thread
 * arithmetic (the src/common _hd.h headers) uses beyond + - * /, one spelling for the
 * host and the device (BX_HD):
 *
 *   bx_fmaf(a, b, c)   a*b + c with one rounding: C99 fmaf on the host
 *                      (an instruction with -mfma, libm's correctly rounded
 *                      one otherwise), __fmaf_rn on the device;
 *   bx_sqrtf(x)        correctly rounded: sqrtf on the host
 *                      (-fno-math-errno: the instruction), __fsqrt_rn on the
 *                      device (never sqrt.approx, whatever -prec-sqrt says);
 *   bx_max_sel_f32 /
 *   bx_min_sel_f32     compare-select, never fmaxf/fminf (whose NaN and
 *                      signed-zero rules differ between libm, x86 maxss and
 *                      PTX max.f32): the first operand unless the second
 *                      compares strictly greater (smaller), so a NaN second
 *                      operand is never taken and -0/+0 keep the first.
 *
 * Every other fused multiply-add is forbidden: the host compiles with
 * -ffp-contract=off and the device with --fmad=false, so the count of
 * fma.rn.f32 in a kernel's PTX is the count of bx_fmaf calls in its inlined
 * code (scripts/ptx_lint.py checks it against src/cuda/train/fma_manifest.json).
 */
#ifndef BX_FP_HD_H
#define BX_FP_HD_H

#include "hd.h"

#ifndef __CUDA_ARCH__
#include <math.h>
#endif

static inline BX_HD float bx_fmaf(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return fmaf(a, b, c);
#endif
}

static inline BX_HD float bx_sqrtf(float x) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(x);
#else
  return sqrtf(x);
#endif
}

/* a, unless b > a (then b). */
static inline BX_HD float bx_max_sel_f32(float a, float b) { return b > a ? b : a; }
/* a, unless b < a (then b). */
static inline BX_HD float bx_min_sel_f32(float a, float b) { return b < a ? b : a; }

/* -Inf and +Inf without <math.h>'s INFINITY (not a device constant everywhere). */
static inline BX_HD float bx_neg_inf_f32(void) { return bx_f32_from_bits(0xFF800000u); }
static inline BX_HD float bx_pos_inf_f32(void) { return bx_f32_from_bits(0x7F800000u); }

#endif /* BX_FP_HD_H */
