/*
 * test_pow_det.c — bx_pow_det (src/common/pow_det.h), the power function
 * the CPU and GPU share, against MPFR's pow: every result within 1 ulp of
 * the exact a^p (faithful), bit for bit equal to the correctly rounded
 * one whenever a^p is a representable double, the special values exact.
 * Inputs: random a over the whole double range (subnormals included) and
 * a chosen so a^p lands anywhere in range, for fixed and random p; powers
 * of two; a near 1 (also with huge p); results at the overflow, subnormal
 * and zero thresholds; the 1/p roots the norms take. Each test prints its
 * largest error in ulps and the share of correctly rounded results.
 * Subnormal inputs and results must not change under flush-to-zero and
 * denormals-are-zero (set by e.g. torch.set_flush_denormal).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <mpfr.h>
#include "fpword.h" /* the caller's flush-to-zero bits: MXCSR FTZ|DAZ, FPCR FZ|FZ16 */
#include "harness.h"
#include "mpfr_ref.h"
#include "pow_det.h"
#include "tests.h"
#include "util.h"

#define REF_PREC 256 /* bits of the MPFR value of a^p */

static const double FIXED_P[] = {3.0, 0.5, 1.5, 4.0, 0.25, 2.5, 1.0 / 3.0, 7.0, 0.1, 10.0};
#define NFIXED (sizeof FIXED_P / sizeof FIXED_P[0])

/* bx_pow_det called through a volatile pointer: never folded at compile
 * time, and never moved across the MXCSR writes of the FTZ test. */
static double pow_det_call(double a, double p) { return bx_pow_det(a, p); }
static double (*volatile pow_det)(double, double) = pow_det_call;

typedef struct pow_stats {
  long count, correct; /* results checked; equal to the correctly rounded one */
  double max_ulp;      /* largest |got - exact| / ulp(exact) */
  double worst_a, worst_p;
  double max_excess;   /* largest error minus the correctly rounded one's */
} pow_stats;

static void stats_print(const char *what, const pow_stats *st) {
  printf("  %s: %ld results, max error %.6f ulp (a = %a, p = %a), %.5f%% correctly rounded"
         " (the others at most %.2g ulp worse)\n",
         what, st->count, st->max_ulp, st->worst_a, st->worst_p,
         st->count ? 100.0 * (double)st->correct / (double)st->count : 100.0, st->max_excess);
}

/* out = |v - X| in ulps of X's binade (2^-1074 below 2^-1022; overflow
 * counts as 2^1024, one ulp 2^971 past DBL_MAX; +Inf for NaN or v < 0,
 * 0 for v = +Inf when X rounds to +Inf). X > 0, or 0 / +Inf when MPFR's
 * exponent range was exceeded. */
static void ulps_off(mpfr_t out, double v, const mpfr_t X) {
  if (isinf(v) && v > 0 && isinf(ref_round_d(X))) {
    mpfr_set_zero(out, 1);
    return;
  }
  if (isnan(v) || v < 0) {
    mpfr_set_inf(out, 1);
    return;
  }
  if (mpfr_inf_p(X)) { /* past MPFR's own range (p ~ 2^63): only +Inf is right */
    if (isinf(v)) mpfr_set_zero(out, 1);
    else mpfr_set_inf(out, 1);
    return;
  }
  /* X in [2^(E-1), 2^E); 0 when a^p is below MPFR's range */
  long ue = mpfr_zero_p(X) ? -1074 : (long)mpfr_get_exp(X) - 53;
  if (ue < -1074) ue = -1074;
  if (ue > 971) ue = 971;
  if (isinf(v)) mpfr_set_ui_2exp(out, 1, 1024, MPFR_RNDN);
  else mpfr_set_d(out, v, MPFR_RNDN);
  mpfr_sub(out, out, X, MPFR_RNDN);
  mpfr_abs(out, out, MPFR_RNDN);
  mpfr_mul_2si(out, out, -ue, MPFR_RNDN);
}

/* Checks bx_pow_det(a, p) for finite a > 0 and finite p > 0 against the
 * exact value; returns 1 if it passed. */
static int check_pow(pow_stats *st, double a, double p, const char *what) {
  double got = pow_det(a, p);
  mpfr_t A, P, X, D, W;
  mpfr_inits2(REF_PREC, A, P, X, D, W, (mpfr_ptr)0);
  mpfr_set_d(A, a, MPFR_RNDN); /* exact */
  mpfr_set_d(P, p, MPFR_RNDN);
  int inexact = mpfr_pow(X, A, P, MPFR_RNDN);
  double want = ref_round_d(X); /* correctly rounded, subnormals and Inf included */
  int representable = inexact == 0 && isfinite(want) && mpfr_cmp_d(X, want) == 0;
  ulps_off(D, got, X);
  ulps_off(W, want, X);
  double err = mpfr_get_d(D, MPFR_RNDU);
  mpfr_sub(W, D, W, MPFR_RNDN); /* how much worse than correct rounding */
  double excess = mpfr_get_d(W, MPFR_RNDU);
  mpfr_clears(A, P, X, D, W, (mpfr_ptr)0);

  st->count++;
  if (memcmp(&got, &want, sizeof got) == 0) st->correct++;
  else if (excess > st->max_excess) st->max_excess = excess;
  if (err > st->max_ulp) {
    st->max_ulp = err;
    st->worst_a = a;
    st->worst_p = p;
  }
  int ok = CHECK(err < 1.0, "%s: bx_pow_det(%a, %a) = %a, correctly rounded %a: %.3g ulp off",
                 what, a, p, got, want, err);
  if (representable)
    ok &= CHECK_BITS_D(got, want, "%s: a^p = %a is a double: bx_pow_det(%a, %a) must be exact",
                       what, want, a, p);
  return ok;
}

/* Finite a > 0 with uniform random bits (any binade, subnormals ~1/2000). */
static double random_positive(bxt_rng *r) {
  for (;;) {
    double a;
    uint64_t b = bxt_next(r) >> 1; /* sign 0 */
    memcpy(&a, &b, 8);
    if (a > 0 && a < INFINITY) return a;
  }
}

/* a with random mantissa such that a^p is near 2^ey. */
static double positive_for_result(bxt_rng *r, double p, double ey) {
  double a = exp2(ey / p) * (1.0 + 0.5 * (bxt_uniform(r) - 0.5) * fmin(1.0, p));
  return a > 0 && a < INFINITY ? a : 1.5;
}

/* A random p in (0, 16). */
static double random_p(bxt_rng *r) {
  double p;
  do
    p = 16.0 * bxt_uniform(r);
  while (p == 0.0);
  return p;
}

void test_pow_det_special(void) {
  const double inf = INFINITY, nan = NAN;
  double qnan; /* the one NaN bx_pow_det returns */
  const uint64_t qnan_bits = 0x7ff8000000000000ull;
  memcpy(&qnan, &qnan_bits, 8);
  const double ps[] = {3.0, 0.5, 1.5, 1.0 / 3.0, 0x1p-60, 1e300, 16.0, 0.1};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
    double p = ps[i];
    CHECK_BITS_D(pow_det(nan, p), qnan, "NaN^%a", p);
    CHECK_BITS_D(pow_det(-nan, p), qnan, "-NaN^%a", p);
    CHECK_BITS_D(pow_det(inf, p), inf, "Inf^%a", p);
    CHECK_BITS_D(pow_det(0.0, p), 0.0, "0^%a", p);
    CHECK_BITS_D(pow_det(-0.0, p), 0.0, "(-0)^%a", p);
    CHECK_BITS_D(pow_det(1.0, p), 1.0, "1^%a", p);
    CHECK_BITS_D(pow_det(inf, -p), 0.0, "Inf^-%a", p);
    CHECK_BITS_D(pow_det(0.0, -p), inf, "0^-%a", p);
    CHECK_BITS_D(pow_det(-2.0, p), qnan, "(-2)^%a", p);
  }
  CHECK_BITS_D(pow_det(2.0, nan), qnan, "2^NaN");
  CHECK_BITS_D(pow_det(1.0, nan), 1.0, "1^NaN");
  CHECK_BITS_D(pow_det(nan, 0.0), 1.0, "NaN^0");
  CHECK_BITS_D(pow_det(2.0, 0.0), 1.0, "2^0");
  CHECK_BITS_D(pow_det(2.0, inf), inf, "2^Inf");
  CHECK_BITS_D(pow_det(0.5, inf), 0.0, "0.5^Inf");
  CHECK_BITS_D(pow_det(2.0, -inf), 0.0, "2^-Inf");
  CHECK_BITS_D(pow_det(0.5, -inf), inf, "0.5^-Inf");
  CHECK_BITS_D(pow_det(DBL_MAX, 2.0), inf, "DBL_MAX^2");
  CHECK_BITS_D(pow_det(DBL_MAX, 1.0), DBL_MAX, "DBL_MAX^1");
  CHECK_BITS_D(pow_det(0x1p-1074, 1.0), 0x1p-1074, "2^-1074 ^ 1");
  CHECK_BITS_D(pow_det(0x1p-1074, 2.0), 0.0, "2^-1074 ^ 2");
  CHECK_BITS_D(pow_det(0x1p-537, 2.0), 0x1p-1074, "2^-537 ^ 2");
  CHECK_BITS_D(pow_det(0x1p-1074, 0.5), 0x1p-537, "sqrt(2^-1074)");
  CHECK_BITS_D(pow_det(0x1p-1000, 1e-300), 1.0, "tiny p");

  /* exactly representable results with small integers: exact */
  static const double exact[][3] = {
      {3.0, 3.0, 27.0},         {4.0, 0.5, 2.0},         {2.0, 10.0, 1024.0},
      {9.0, 0.5, 3.0},          {16.0, 0.25, 2.0},       {81.0, 0.25, 3.0},
      {1.5, 4.0, 5.0625},       {10.0, 3.0, 1000.0},     {7.0, 7.0, 823543.0},
      {0.5, 10.0, 0x1p-10},     {0.25, 1.5, 0.125},      {6.25, 1.5, 15.625},
      {1e10, 0.5, 1e5},         {11.0, 4.0, 14641.0},    {2.25, 2.5, 7.59375},
      {3.0, 33.0, 5559060566555523.0}, /* 3^33 < 2^53 */
      {0x1p-1000, 0.5, 0x1p-500},      {0x1p-1072, 0.5, 0x1p-536},
      {0x1.8p-500, 2.0, 0x1.2p-999},  {0x1p-358, 3.0, 0x1p-1074},
      {0x1.8p-530, 2.0, 0x1.2p-1059},  /* subnormal, exact */
  };
  for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
    double a = exact[i][0], p = exact[i][1], want = exact[i][2];
    pow_stats st = {0};
    check_pow(&st, a, p, "exact table");
    CHECK_BITS_D(pow_det(a, p), want, "%a ^ %a", a, p);
  }
  /* a^p half-way between two doubles (54-bit odd integers): within 1 ulp
   * (the tie is not guaranteed to go to even) */
  pow_stats ties = {0};
  check_pow(&ties, 262143.0, 3.0, "(2^18 - 1)^3");
  check_pow(&ties, 134217727.0, 2.0, "(2^27 - 1)^2");
  check_pow(&ties, 3.0, 34.0, "3^34");
  check_pow(&ties, 0x1.8p-540, 2.0, "2.25 * 2^-1080 (rounds to 0)");
}

void test_pow_det_random(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  pow_stats all = {0}, in_range = {0};
  for (size_t k = 0; k <= NFIXED; k++) {
    for (int i = 0; i < 6000 && bxt_failures() < 20; i++) {
      double p = k < NFIXED ? FIXED_P[k] : random_p(&r);
      check_pow(&all, random_positive(&r), p, "random a");
      double ey = -1080.0 + 2110.0 * bxt_uniform(&r);
      check_pow(&in_range, positive_for_result(&r, p, ey), p, "a for a result in range");
    }
  }
  stats_print("a over the double range", &all);
  stats_print("a^p spread over the double range", &in_range);
}

void test_pow_det_edges(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  pow_stats two = {0}, near1 = {0}, bound = {0};
  /* a = 2^k, every k */
  for (size_t k = 0; k <= NFIXED + 2 && bxt_failures() < 20; k++) {
    double p = k < NFIXED ? FIXED_P[k] : random_p(&r);
    for (int e = -1074; e <= 1023; e++) check_pow(&two, ldexp(1.0, e), p, "power of two");
  }
  /* a near 1: a few ulps off, and 1 +- 2^-j; also huge p */
  const double big_p[] = {0x1p20, 0x1p40, 1e15, 0x1.fffffffffffffp62, 12345.678};
  for (int i = 0; i < 4000 && bxt_failures() < 20; i++) {
    double a;
    switch (i % 4) {
      case 0: a = 1.0 + (double)(1 + bxt_below(&r, 4096)) * 0x1p-52; break;
      case 1: a = 1.0 - (double)(1 + bxt_below(&r, 4096)) * 0x1p-53; break;
      default: {
        double d = ldexp(1.0 + bxt_uniform(&r), -(int)(1 + bxt_below(&r, 52)));
        a = i % 4 == 2 ? 1.0 + d : 1.0 - d * 0.5;
      }
    }
    double p = i % 3 == 0   ? big_p[bxt_below(&r, 5)]
               : i % 3 == 1 ? FIXED_P[i % NFIXED]
                            : random_p(&r);
    check_pow(&near1, a, p, "a near 1");
  }
  /* results at the thresholds: DBL_MAX (overflow), 2^-1022 (subnormal),
   * 2^-1074, 2^-1075 (zero), and half-way points of the subnormal grid */
  static const struct {
    double m;
    long e; /* the target is m * 2^e */
  } targets[] = {{DBL_MAX, 0},   {1.0, 1024},  {1.0, -1022}, {0x1.0000000000001p0, -1022},
                 {1.0, -1074},   {1.0, -1075}, {1.5, -1074}, {1.5, -1073},
                 {0x1.0000000000008p0, -1022}, {1.0, -1060}, {1.25, -1075}};
  mpfr_t T, Q, Ar;
  mpfr_inits2(REF_PREC, T, Q, Ar, (mpfr_ptr)0);
  for (size_t k = 0; k <= NFIXED + 4 && bxt_failures() < 20; k++) {
    double p = k < NFIXED ? FIXED_P[k] : random_p(&r);
    for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
      mpfr_set_d(T, targets[t].m, MPFR_RNDN);
      mpfr_mul_2si(T, T, targets[t].e, MPFR_RNDN);
      mpfr_set_d(Q, p, MPFR_RNDN);
      mpfr_ui_div(Q, 1, Q, MPFR_RNDN);
      mpfr_pow(Ar, T, Q, MPFR_RNDN); /* the a with a^p = target */
      double a0 = mpfr_get_d(Ar, MPFR_RNDN);
      for (int j = -16; j <= 16; j++) {
        double a = a0;
        for (int s = 0; s < (j < 0 ? -j : j); s++) a = nextafter(a, j < 0 ? 0.0 : INFINITY);
        if (a > 0 && a < INFINITY) check_pow(&bound, a, p, "result near a threshold");
      }
    }
  }
  mpfr_clears(T, Q, Ar, (mpfr_ptr)0);
  stats_print("a = 2^k", &two);
  stats_print("a near 1", &near1);
  stats_print("results near overflow / underflow", &bound);
}

/* The 1/p roots bx_total_norm takes of the exact sums (1.0 / p rounded). */
void test_pow_det_roots(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  pow_stats st = {0};
  for (size_t k = 0; k <= NFIXED + 3; k++) {
    for (int i = 0; i < 5000 && bxt_failures() < 20; i++) {
      double q = k < NFIXED ? FIXED_P[k] : random_p(&r);
      double a;
      switch (i % 3) {
        case 0: a = random_positive(&r); break;
        case 1: a = ldexp(1.0 + bxt_uniform(&r), (int)bxt_below(&r, 200) - 100); break;
        default: a = floor(1.0 + 1000.0 * bxt_uniform(&r)); /* integer sums: perfect powers */
      }
      check_pow(&st, a, 1.0 / q, "1/p root");
    }
  }
  /* perfect powers under a rounded 1/p: k^q with q a small integer */
  for (int q = 2; q <= 8; q++)
    for (int b = 2; b <= 40; b++) {
      double bq = 1.0; /* exact: below 2^53 */
      for (int j = 0; j < q; j++) bq *= (double)b;
      check_pow(&st, bq, 1.0 / (double)q, "root of b^q");
    }
  stats_print("1/p roots", &st);
}

/* Subnormal inputs and results, with flush to zero set (x86 FTZ and DAZ,
 * aarch64 FZ and FZ16), give the same bits. */
void test_pow_det_flush_to_zero(void) {
#ifdef BXT_HAVE_FPWORD
  enum { N = 20000 };
  static double a[N], p[N], want[N];
  bxt_rng r;
  bxt_rng_init(&r);
  for (int i = 0; i < N; i++) {
    p[i] = i % 2 ? FIXED_P[i % NFIXED] : random_p(&r);
    if (i % 3 == 0) { /* a subnormal a */
      uint64_t b = 1 + bxt_below(&r, (1ull << 52) - 1);
      memcpy(&a[i], &b, 8);
    } else if (i % 3 == 1) { /* a subnormal result */
      a[i] = positive_for_result(&r, p[i], -1076.0 + 55.0 * bxt_uniform(&r));
    } else { /* a small p (the smallest near 2^-1074) */
      a[i] = random_positive(&r);
      p[i] = ldexp(1.0 + bxt_uniform(&r), -(int)bxt_below(&r, 1075));
    }
    want[i] = pow_det(a[i], p[i]);
  }
  bxt_fpword csr = bxt_fpword_get();
  bxt_fpword in = bxt_fpword_set(csr | BXT_FPW_FLUSH);
  static double got[N];
  for (int i = 0; i < N; i++) got[i] = pow_det(a[i], p[i]);
  bxt_fpword_set(csr);
  CHECK((in & BXT_FPW_IMPLEMENTED) == ((csr | BXT_FPW_FLUSH) & BXT_FPW_IMPLEMENTED),
        "flush to zero was not set: " BXT_FPW_NAME " 0x%llx", in);
  for (int i = 0; i < N && bxt_failures() < 20; i++)
    CHECK_BITS_D(got[i], want[i], "bx_pow_det(%a, %a) under FTZ/DAZ", a[i], p[i]);
#else
  bxt_skip("fpword.h: no control word of this architecture");
#endif
}
