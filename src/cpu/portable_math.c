/*
 * portable_math.c — the portable elementwise math kernels (kernels.h's
 * bx_math_portable): the math_det.h scalar functions element by element
 * (bx_exp through its fast path for a block first, the same bits).
 */
#include "kernels.h"
#include "math_det.h"

#define EW_LOOP(name, f)                                  \
  static void name(const float *x, float *y, size_t n) { \
    for (size_t i = 0; i < n; i++) y[i] = f(x[i]);        \
  }
EW_LOOP(loop_log, bx_logf_det)
EW_LOOP(loop_sigmoid, bx_sigmoidf_det)
EW_LOOP(loop_silu, bx_siluf_det)
EW_LOOP(loop_rsqrt, bx_rsqrtf_det)
EW_LOOP(loop_sin, bx_sinf_det)
EW_LOOP(loop_cos, bx_cosf_det)
#undef EW_LOOP

/* exp in two passes per block: the branch-free binary64 fast path for
 * every element (clamped so that it is defined; the compiler may
 * vectorise it), then per element the scalar function's own decision:
 * inputs outside the fast path's range or failing the rounding test go to
 * bx_expf_det, the others take the fast value. bx_expf_det computes the
 * same fast value for them, so the bits are the scalar function's. */
#define EW_BLOCK 256
static void loop_exp(const float *x, float *y, size_t n) {
  double fast[EW_BLOCK];
  for (size_t b = 0; b < n; b += EW_BLOCK) {
    size_t len = n - b < EW_BLOCK ? n - b : EW_BLOCK;
    for (size_t i = 0; i < len; i++) {
      float xi = x[b + i];
      float c = xi <= 89.0f && xi >= -104.0f ? xi : 0.0f; /* NaN -> 0 */
      fast[i] = bx_md_exp_fast((double)c);
    }
    for (size_t i = 0; i < len; i++) {
      float xi = x[b + i];
      int in_range = xi <= 89.0f && xi >= -104.0f;
      y[b + i] = in_range && !bx_md_hard(fast[i]) ? (float)fast[i] : bx_expf_det(xi);
    }
  }
}

#include "adamw_body.h"
#include "bf16_body.h"

const bx_math_kernels bx_math_portable = {"portable", loop_exp, loop_log,
                                          loop_sigmoid, loop_silu, loop_rsqrt,
                                          loop_sin, loop_cos, adamw_loop, bf16_round_loop};
