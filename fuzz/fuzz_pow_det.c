/*
 * fuzz_pow_det.c — bx_pow_det (src/common/pow_det.h), the power function of
 * the other-p norms on the CPU and the GPU, against MPFR: every result is
 * one of the two doubles around the exact a^p (faithful), special cases
 * follow C's pow for a >= 0, and a result that is exactly a double is that
 * double. Input: 16 bytes = a (its sign cleared) and p (taken as |p|, NaN
 * and Inf skipped; half the inputs use 1/p, the root the norm takes).
 */
#include "fuzz_common.h"

#include "pow_det.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 16) return 0;
  double a, p;
  memcpy(&a, data, 8);
  memcpy(&p, data + 8, 8);
  a = fabs(a);
  p = fabs(p);
  if (p != p || p == INFINITY || p == 0.0 || a != a) return 0;
  if (size > 16 && (data[16] & 1)) p = 1.0 / p;
  if (p == INFINITY || p == 0.0) return 0;
  double got = bx_pow_det(a, p);
  if (a == 0.0) {
    if (got != 0.0 || signbit(got)) FZ_FAIL("pow(0, %a) = %a", p, got);
    return 0;
  }
  if (a == INFINITY) {
    if (got != INFINITY) FZ_FAIL("pow(inf, %a) = %a", p, got);
    return 0;
  }
  mpfr_t x, y, r;
  mpfr_inits2(256, x, y, r, (mpfr_ptr)0);
  mpfr_set_d(x, a, MPFR_RNDN);
  mpfr_set_d(y, p, MPFR_RNDN);
  int exact = mpfr_pow(r, x, y, MPFR_RNDN) == 0;
  mpfr_set_emin(-1073); /* double's range, subnormals included */
  mpfr_set_emax(1024);
  mpfr_t lo, hi;
  mpfr_inits2(53, lo, hi, (mpfr_ptr)0);
  int tl = mpfr_set(lo, r, MPFR_RNDD); /* then into double's range, subnormals rounded */
  tl = mpfr_check_range(lo, tl, MPFR_RNDD);
  mpfr_subnormalize(lo, tl, MPFR_RNDD);
  int th = mpfr_set(hi, r, MPFR_RNDU);
  th = mpfr_check_range(hi, th, MPFR_RNDU);
  mpfr_subnormalize(hi, th, MPFR_RNDU);
  double dlo = mpfr_get_d(lo, MPFR_RNDD), dhi = mpfr_get_d(hi, MPFR_RNDU);
  mpfr_set_emin(mpfr_get_emin_min());
  mpfr_set_emax(mpfr_get_emax_max());
  if (!(got == dlo || got == dhi))
    FZ_FAIL("bx_pow_det(%a, %a) = %a, not between %a and %a", a, p, got, dlo, dhi);
  if (exact && dlo == dhi && got != dlo)
    FZ_FAIL("bx_pow_det(%a, %a) = %a, exact result %a", a, p, got, dlo);
  mpfr_clears(x, y, r, lo, hi, (mpfr_ptr)0);
  return 0;
}
