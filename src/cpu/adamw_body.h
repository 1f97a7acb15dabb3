/*
 * adamw_body.h — the per-element update of bx_adamw_step (src/train/adamw.c
 * states the formula and forms the scalars), written once and included by
 * portable_math.c (fmaf a libm call) and, through vmath_body.h, by
 * avx2_math.c / avx512_math.c (built with -mfma: the compiler vectorises
 * the loop with fma instructions). Every operation is one IEEE rounding:
 * fmaf (fused, one rounding on every ISA), sqrtf (-fno-math-errno: the
 * instruction), division, multiplication, addition; -ffp-contract=off
 * adds no fusion. So every table gives the same bits. Not a header of its
 * own: it defines one static function.
 */
#include <math.h>
#include <stddef.h>

#include "kernels.h"
#include "nan_canon.h"

/* GCC's -O2 cost model declines the loop; ask for it. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#endif
static void adamw_loop(float *restrict p, const float *restrict g, float *restrict m,
                       float *restrict v, size_t n, const bx_adamw_scalars *sc) {
  const bx_adamw_scalars s = *sc;
  const float dec = s.do_decay ? s.decay : 1.0f; /* p * 1 = p: the skipped mul's bits */
  const int near0 = s.w < 0.5f && s.w > -0.5f;
  const float wl = near0 ? s.w : s.w - 1.0f;
  for (size_t i = 0; i < n; i++) {
    float pi = p[i] * dec, gi = g[i], mi = m[i];
    float d = gi - mi;
    /* torch's vectorised lerp: fmadd(weight, end - start, start), or for
     * weights >= 0.5 fmadd(weight - 1, end - start, end) */
    mi = fmaf(wl, d, near0 ? mi : gi);
    /* torch's addcmul_ after mul_: fmadd(value * t1, t2, self) */
    float vi = fmaf(s.one_m_b2 * gi, gi, v[i] * s.beta2);
    float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
    /* a NaN stored is the canonical one (nan_canon.h): a compare and a
     * select per value, in the vectorised loop */
    p[i] = bx_canon_f32(pi + (s.neg_step * mi) / denom);
    m[i] = bx_canon_f32(mi);
    v[i] = bx_canon_f32(vi);
  }
}
