/*
 * tokred_ref.h — the MPFR reference of the token reduction's grid for one
 * element, shared by tests/test_tokred.c and fuzz/fuzz_tokred.c: the
 * addends part[c * stride] (c = 0 .. N-1), each rounded to the nearest
 * multiple of 2^e (ties to even) and summed exactly; the exact sum of the
 * addends; and the documented bound |Q - exact| <= N * 2^(e-1).
 */
#ifndef BX_TEST_TOKRED_REF_H
#define BX_TEST_TOKRED_REF_H

#include <mpfr.h>
#include <stddef.h>
#include <stdint.h>

/* Q (>= 600 bits, set here) = the grid sum; returns 1 when the error
 * against the exact sum is within the bound, else 0. */
static inline int bxt_tokred_ref_element(const float *part, size_t stride, int64_t N, int e,
                                         mpfr_ptr Q) {
  mpfr_t q, exact, err, bound;
  mpfr_inits2(600, q, exact, err, bound, (mpfr_ptr)0);
  mpfr_set_zero(Q, 1);
  mpfr_set_zero(exact, 1);
  for (int64_t c = 0; c < N; c++) {
    mpfr_set_flt(q, part[(size_t)c * stride], MPFR_RNDN);
    mpfr_add(exact, exact, q, MPFR_RNDN);
    mpfr_mul_2si(q, q, -e, MPFR_RNDN);
    mpfr_rint(q, q, MPFR_RNDN);
    mpfr_add(Q, Q, q, MPFR_RNDN);
  }
  mpfr_mul_2si(Q, Q, e, MPFR_RNDN);
  mpfr_sub(err, Q, exact, MPFR_RNDN);
  mpfr_abs(err, err, MPFR_RNDN);
  mpfr_set_si(bound, (long)N, MPFR_RNDN);
  mpfr_mul_2si(bound, bound, e - 1, MPFR_RNDN);
  int ok = mpfr_cmp(err, bound) <= 0;
  mpfr_clears(q, exact, err, bound, (mpfr_ptr)0);
  return ok;
}

#endif /* BX_TEST_TOKRED_REF_H */
