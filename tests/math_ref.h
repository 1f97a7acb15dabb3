/*
 * math_ref.h — the one correctly rounded reference of the elementwise math
 * (src/common/math_det.h's bx_expf_det ... bx_cosf_det), shared by the C
 * suite (tests/test_math.c) and the exhaustive check (dev/math_exhaustive.c).
 * Written independently of src/: the special values by math_det.h's stated
 * rules, every other value by MPFR at 200 bits, rounded once to fp32 (with
 * subnormals) by mpfr_ref.c's integer rounding (ref_round_f). Needs MPFR
 * and tests/mpfr_ref.c.
 *
 * Rules (math_det.h): a NaN input gives the canonical NaN 0x7fc00000;
 * invalid operations give 0x7fc00000 (log of x < 0, rsqrt of x < 0, sin/cos
 * outside |x| < 2^28, Inf included); log(+-0) = -Inf, log(+Inf) = +Inf,
 * rsqrt(+-0) = +-Inf, rsqrt(+Inf) = +0, exp(+-Inf) = +Inf / +0,
 * sigmoid(+-Inf) = 1 / +0, silu(+Inf) = +Inf, silu(-Inf) = -0 (the limit),
 * silu(+-0) = +-0, sin(+-0) = +-0.
 */
#ifndef BX_TEST_MATH_REF_H
#define BX_TEST_MATH_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <mpfr.h>

#include "math_det.h"
#include "mpfr_ref.h"

enum { MREF_EXP, MREF_LOG, MREF_SIGMOID, MREF_SILU, MREF_RSQRT, MREF_SIN, MREF_COS, MREF_NFUNC };

static const char *const MREF_NAMES[MREF_NFUNC] = {"exp",   "log", "sigmoid", "silu",
                                                   "rsqrt", "sin", "cos"};

#define MREF_TRIG_MAX 268435456.0f /* 2^28 */

/* The function under test by number: bitexact's scalar definition
 * (src/common/math_det.h), which the vector kernels must equal. */
static inline float mref_det(int f, float x) {
  switch (f) {
  case MREF_EXP: return bx_expf_det(x);
  case MREF_LOG: return bx_logf_det(x);
  case MREF_SIGMOID: return bx_sigmoidf_det(x);
  case MREF_SILU: return bx_siluf_det(x);
  case MREF_RSQRT: return bx_rsqrtf_det(x);
  case MREF_SIN: return bx_sinf_det(x);
  default: return bx_cosf_det(x);
  }
}

static inline uint32_t mref_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float mref_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* 1 and *out when f(x) is fixed by the rules above (no MPFR needed). */
static inline int math_ref_special(int f, float x, float *out) {
  const float qnan = mref_float(0x7fc00000u);
  if (x != x) {
    *out = qnan; /* any sign and payload: the canonical NaN (nan_canon.h) */
    return 1;
  }
  if ((f == MREF_SIN || f == MREF_COS) && !(fabsf(x) < MREF_TRIG_MAX)) {
    *out = qnan;
    return 1;
  }
  switch (f) {
  case MREF_LOG:
    if (x == 0.0f) return *out = -INFINITY, 1;
    if (x < 0.0f) return *out = qnan, 1;
    if (isinf(x)) return *out = x, 1;
    return 0;
  case MREF_RSQRT:
    if (x == 0.0f) return *out = signbit(x) ? -INFINITY : INFINITY, 1;
    if (x < 0.0f) return *out = qnan, 1;
    if (isinf(x)) return *out = 0.0f, 1;
    return 0;
  case MREF_EXP:
    if (isinf(x)) return *out = x > 0 ? x : 0.0f, 1;
    return 0;
  case MREF_SIGMOID:
    if (isinf(x)) return *out = x > 0 ? 1.0f : 0.0f, 1;
    return 0;
  case MREF_SILU:
    if (isinf(x)) return *out = x > 0 ? x : -0.0f, 1;
    if (x == 0.0f) return *out = x, 1;
    return 0;
  case MREF_SIN:
    if (x == 0.0f) return *out = x, 1;
    return 0;
  default:
    return 0;
  }
}

/* f(x) into y (initialised by the caller, 200 bits) for a non-special x,
 * rounded to nearest at y's precision. */
static inline void math_ref_value(int f, float x, mpfr_t y) {
  mpfr_t X, T;
  mpfr_init2(X, 24);
  mpfr_init2(T, mpfr_get_prec(y));
  mpfr_set_flt(X, x, MPFR_RNDN); /* exact */
  switch (f) {
  case MREF_EXP: mpfr_exp(y, X, MPFR_RNDN); break;
  case MREF_LOG: mpfr_log(y, X, MPFR_RNDN); break;
  case MREF_SIGMOID:
  case MREF_SILU:
    mpfr_neg(T, X, MPFR_RNDN);
    mpfr_exp(T, T, MPFR_RNDN);
    mpfr_add_ui(T, T, 1, MPFR_RNDN);
    mpfr_ui_div(y, 1, T, MPFR_RNDN);
    if (f == MREF_SILU) mpfr_mul(y, y, X, MPFR_RNDN);
    break;
  case MREF_RSQRT: mpfr_rec_sqrt(y, X, MPFR_RNDN); break;
  case MREF_SIN: mpfr_sin(y, X, MPFR_RNDN); break;
  default: mpfr_cos(y, X, MPFR_RNDN); break;
  }
  mpfr_clear(X);
  mpfr_clear(T);
}

/* f(x) correctly rounded to fp32 (the special values by the rules);
 * *exact, if not NULL, gets the 200-bit value rounded to double (0 for
 * special values). */
static inline float math_ref(int f, float x, double *exact) {
  float r;
  if (exact) *exact = 0.0;
  if (math_ref_special(f, x, &r)) return r;
  mpfr_t y;
  mpfr_init2(y, 200);
  math_ref_value(f, x, y);
  r = ref_round_f(y);
  if (exact) *exact = mpfr_get_d(y, MPFR_RNDN);
  mpfr_clear(y);
  return r;
}

#endif /* BX_TEST_MATH_REF_H */
