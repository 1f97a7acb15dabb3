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
#include "adamw_hd.h"

/* GCC's -O2 cost model declines the loop; ask for it. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#endif
static void adamw_loop(float *restrict p, const float *restrict g, float *restrict m,
                       float *restrict v, size_t n, const bx_adamw_scalars *sc) {
  const bx_adamw_scalars s = *sc;
  const bx_adamw_prep q = bx_adamw_prepare(&s);
  const float dec = q.dec, wl = q.wl;
  const int near0 = q.near0;
  for (size_t i = 0; i < n; i++)
    bx_adamw_elem_f32(&p[i], g[i], &m[i], &v[i], dec, wl, near0, s.one_m_b2, s.beta2, s.bc2_sqrt,
                      s.eps, s.neg_step);
}
