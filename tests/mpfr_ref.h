/*
 * mpfr_ref.h — the exact reference the tests (and fuzz/) compare against.
 *
 * Written only here, independently of src/: elements are decoded from their
 * bits by hand (fp16, bf16) or by the C type (fp32, fp64), squares and sums
 * are formed in MPFR at a precision wide enough that every operation is
 * exact (each mpfr_add/mpfr_sqr is checked to return a zero ternary), and
 * the final rounding to a binary format is done with integer steps on the
 * exact value: scale by the format's ulp, floor, compare with the midpoint,
 * ties to even. Subnormal results use the fixed ulp 2^emin; results at or
 * past 2^emax become Inf. Nothing here uses the FPU to round.
 *
 * Dtype numbers: REF_F16 0, REF_BF16 1, REF_F32 2, REF_F64 3.
 */
#ifndef BX_TEST_MPFR_REF_H
#define BX_TEST_MPFR_REF_H

#include <stddef.h>
#include <stdint.h>

#include <mpfr.h>

enum { REF_F16 = 0, REF_BF16 = 1, REF_F32 = 2, REF_F64 = 3, REF_NDT = 4 };

/* A binary floating-point format: p significand bits (hidden bit
 * included), emin the exponent of the smallest subnormal (its ulp), finite
 * values are < 2^emax. */
typedef struct ref_fmt {
  int p, emin, emax;
} ref_fmt;

extern const ref_fmt REF_FMT[REF_NDT]; /* indexed by dtype */

/* Precision of every exact sum: covers 2^-2148 (square of the smallest fp64
 * subnormal) up to 2^(2048+128) (2^128 squares of DBL_MAX), with margin. */
#define REF_SUM_PREC 4480

/* Number of MPFR operations that should have been exact and were not (a
 * bug in the reference itself; tests check it stays 0). */
extern long ref_inexact_events;

/* Element i of a raw array of the given dtype, as a double (exact for every
 * dtype; NaN/Inf preserved, sign of zero preserved). */
double ref_elem(int dtype, const void *data, size_t i);
double ref_f16_to_double(uint16_t bits);
double ref_bf16_to_double(uint16_t bits);

/* Bits of v in the dtype; v must be exactly representable there (else
 * ref_inexact_events is bumped). NaN becomes the canonical quiet NaN. */
uint64_t ref_encode(int dtype, double v);

/* An exact running sum with the element counters of a bx_acc. */
typedef struct ref_sum {
  mpfr_t sum;        /* exact, REF_SUM_PREC bits */
  int64_t nan_count; /* NaN elements seen (not summed) */
  int64_t inf_count; /* ±Inf elements seen (not summed) */
  int64_t count;     /* all elements seen */
} ref_sum;

void ref_sum_init(ref_sum *s);
void ref_sum_clear(ref_sum *s);
/* s += x^2 (or |x|) over n elements of data (dtype). */
void ref_add_squares(ref_sum *s, int dtype, const void *data, size_t n);
void ref_add_abs(ref_sum *s, int dtype, const void *data, size_t n);
/* s += v exactly (v finite double, any sign). */
void ref_add_double(ref_sum *s, double v);

/* Correct rounding (nearest, ties to even) of an exact MPFR value (any sign,
 * any precision) to a format; the result is returned as a double (every
 * format embeds in double exactly). ±Inf past the format's range. */
double ref_round_fmt(const mpfr_t x, ref_fmt f);
/* Correctly rounded sqrt of an exact value x >= 0 (NaN for x < 0). */
double ref_sqrt_fmt(const mpfr_t x, ref_fmt f);

double ref_round_d(const mpfr_t x);
float ref_round_f(const mpfr_t x);
double ref_sqrt_d(const mpfr_t x);
float ref_sqrt_f(const mpfr_t x);

/* The exact product a*b (finite doubles) rounded once to the dtype, as a
 * double; IEEE rules for Inf/NaN operands (0*Inf = NaN). */
double ref_mul_round(double a, double b, int dtype);

/* Round a double to the dtype (nearest even; ±Inf on overflow). */
double ref_double_to(int dtype, double v);

/* The exact value held by raw accumulator words laid out as the header
 * documents (digit i weighs 2^(32 i + lsb_exp), words signed, possibly
 * un-normalised): out = sum of digit[i] * 2^(32 i + lsb_exp). out must have
 * REF_SUM_PREC + 64 bits or more. */
void ref_acc_words_value(mpfr_t out, const int64_t *digit, int ndigits,
                         int lsb_exp);

#endif /* BX_TEST_MPFR_REF_H */
