/*
 * math_det.h — fp32 elementwise math (exp, log, sigmoid, SiLU, rsqrt,
 * sin, cos) built only from IEEE-754 basic operations (+, -, *, /, sqrt,
 * conversions), written once for the CPU and the GPU (BX_HD) so that every
 * ISA and device gives the same bits (DESIGN §9.3). No libm, no fma, no
 * long double; every constant is an exact hex literal.
 *
 * Assumptions: as pow_det.h (IEEE binary32/64, round to nearest even, no
 * contraction: -ffp-contract=off / --fmad=false, no x87 excess precision,
 * no -ffast-math) and, in addition, no flush-to-zero / denormals-are-zero:
 * a float subnormal is converted to double as it is. The library's calls
 * run in that environment (core/fpenv.h: MXCSR 0x1F80); a direct caller of
 * these inline functions must not set FTZ/DAZ (CUDA: no -ftz=true).
 *
 * Method, the same for every function: a fast evaluation in binary64 whose
 * relative error is below 2^-49 (bound derived per function below), then a
 * rounding test: if y(1 - 2^-45) and y(1 + 2^-45) round to the same float,
 * so does the exact value, and that float is returned (correctly rounded).
 * Otherwise (probability ~2^-20 per input) a slow evaluation in
 * double-double (relative error below 2^-70, pow_det.h's arithmetic) is
 * rounded once, through round-to-odd, to float. So every result is
 * correctly rounded unless the exact value lies within 2^-70 (relative) of
 * a float midpoint; dev/math_exhaustive.c checks all 2^32 inputs against
 * MPFR and found no such input (figures at each function; measured with
 * `build/dev/math_exhaustive -t 2` on an Intel Xeon (Emerald Rapids), GCC
 * 12, glibc 2.36, MPFR 4.2: docs/train_math.md).
 *
 * Every NaN returned is the canonical 0x7fc00000 (nan_canon.h): for a NaN
 * input of any sign and payload, and for invalid operations (log of x < 0,
 * sin/cos of Inf or outside their domain).
 */
#ifndef BX_MATH_DET_H
#define BX_MATH_DET_H

#include <stdint.h>

#include "hd.h"
#include "nan_canon.h"
#include "pow_det.h"

#define BX_MD_QNAN BX_F32_CANON_NAN

/* ---- helpers ------------------------------------------------------------ */

/* The result for a NaN input x: the canonical NaN, whatever x's sign and
 * payload. */
static inline BX_HD float bx_md_nan(float x) {
  (void)x;
  return bx_f32_from_bits(BX_F32_CANON_NAN);
}

/* 2^k for -1022 <= k <= 1023, exactly. */
static inline BX_HD double bx_md_pow2(int k) {
  return bx_f64_from_bits((uint64_t)(k + 1023) << 52);
}

/* Nearest integer of |t| < 2^51 (ties to even), as a double. */
static inline BX_HD double bx_md_nearest(double t) {
  const double magic = 0x1.8p52;
  return (t + magic) - magic;
}

/* The rounding test: 1 when the float nearest to every value within
 * 2^-45 (relative) of y is not one and the same. y(1 -+ 2^-45) are formed
 * with one rounding each (2^-53 relative), so the interval tested contains
 * [y(1 - 2^-45 + 2^-52), y(1 + 2^-45 - 2^-52)] and any exact value within
 * 2^-46 of y. Monotonic rounding does the rest. y finite, |y| >= 2^-200. */
static inline BX_HD int bx_md_hard(double y) {
  double d = y * 0x1p-45;
  return (float)(y - d) != (float)(y + d);
}

/* hi + lo to float with one rounding: round to odd in double (53 >= 24 + 2
 * bits), then to nearest float. */
static inline BX_HD float bx_md_dd_to_f32(bx_pd_dd v) {
  return (float)bx_pd_add_odd(v.hi, v.lo);
}

/* a + b for double-doubles (error ~2^-104 (|a| + |b|)). */
static inline BX_HD bx_pd_dd bx_md_dd_add(bx_pd_dd a, bx_pd_dd b) {
  bx_pd_dd s = bx_pd_two_sum(a.hi, b.hi);
  return bx_pd_fast_two_sum(s.hi, s.lo + (a.lo + b.lo));
}

/* a / d for a double-double a and a double d (relative error ~2^-104). */
static inline BX_HD bx_pd_dd bx_md_dd_div_d(bx_pd_dd a, double d) {
  double q = a.hi / d;
  bx_pd_dd p = bx_pd_two_prod(q, d);
  double r = (((a.hi - p.hi) - p.lo) + a.lo) / d;
  return bx_pd_fast_two_sum(q, r);
}

/* n / d for a double n and a double-double d (relative error ~2^-100). */
static inline BX_HD bx_pd_dd bx_md_div_dd(double n, bx_pd_dd d) {
  double q = n / d.hi;
  bx_pd_dd p = bx_pd_two_prod(q, d.hi);
  double r = (((n - p.hi) - p.lo) - q * d.lo) / d.hi; /* n - p.hi exact */
  return bx_pd_fast_two_sum(q, r);
}

/* ---- exp ------------------------------------------------------------------ */

/* exp(x) for a double |x| <= 160 with 24 significant bits or fewer (an
 * fp32 value or its negation), relative error < 2^-50:
 * k = nearest(x / ln2), r = x - k ln2 with ln2 = H + L, H = fdlibm's
 * 32-bit ln2_hi: k H is exact (8 + 32 bits), x - k H exact (both are
 * multiples of 2^-32 when k != 0, and |x - k H| < 1), the subtraction of
 * k L adds < 2^-55 (absolute, hence relative in exp), the truncation of
 * ln2 < 2^-77. exp(r), |r| <= 0.3467: Taylor to r^13 (remainder < 2^-57),
 * Horner in double (< 3 2^-53). Then an exact scaling by 2^k. */
static inline BX_HD double bx_md_exp_fast(double x) {
  const double inv_ln2 = 0x1.71547652b82fep+0;
  const double ln2_hi = 0x1.62e42fee00000p-1, ln2_lo = 0x1.a39ef35793c76p-33;
  double k = bx_md_nearest(x * inv_ln2);
  double r = (x - k * ln2_hi) - k * ln2_lo;
  double p = 0x1.6124613a86d09p-33; /* 1/13! */
  p = 0x1.1eed8eff8d898p-29 + r * p;
  p = 0x1.ae64567f544e4p-26 + r * p;
  p = 0x1.27e4fb7789f5cp-22 + r * p;
  p = 0x1.71de3a556c734p-19 + r * p;
  p = 0x1.a01a01a01a01ap-16 + r * p;
  p = 0x1.a01a01a01a01ap-13 + r * p;
  p = 0x1.6c16c16c16c17p-10 + r * p;
  p = 0x1.1111111111111p-7 + r * p;
  p = 0x1.5555555555555p-5 + r * p;
  p = 0x1.5555555555555p-3 + r * p;
  p = 0.5 + r * p;
  p = 1.0 + r * p;
  p = 1.0 + r * p;
  return p * bx_md_pow2((int)k);
}

/* exp(x) for a double |x| <= 160 as a double-double, relative error
 * ~2^-71: 2^(x log2 e) with x log2 e in double-double (pow_det.h's 2^f). */
static inline BX_HD bx_pd_dd bx_md_exp_dd(double x) {
  const bx_pd_dd log2e = {0x1.71547652b82fep+0, 0x1.777d0ffda0d24p-56};
  bx_pd_dd t = bx_pd_two_prod(x, log2e.hi);
  t = bx_pd_fast_two_sum(t.hi, t.lo + x * log2e.lo);
  double n = bx_md_nearest(t.hi);
  bx_pd_dd f = bx_pd_fast_two_sum(t.hi - n, t.lo); /* t.hi - n exact */
  bx_pd_dd e = bx_pd_exp2_reduced(f);
  double s = bx_md_pow2((int)n);
  return bx_pd_make(e.hi * s, e.lo * s);
}

/* bx_expf_det: e^x correctly rounded to fp32.
 * Special values: exp(-Inf) = +0, exp(+Inf) = +Inf, NaN canonical; x > 89
 * overflows to +Inf, x < -104 gives +0 (as the correctly rounded value).
 * Exhaustive (all 2^32 inputs, dev/math_exhaustive.c vs MPFR): max error
 * 0.5 ulp, 0 results not correctly rounded (worst input -0x1.d2259ap+3). */
static inline BX_HD float bx_expf_det(float x) {
  if (x != x) return bx_md_nan(x);
  if (x > 89.0f) return bx_f32_from_bits(0x7f800000u);
  if (x < -104.0f) return 0.0f;
  double y = bx_md_exp_fast((double)x);
  if (!bx_md_hard(y)) return (float)y;
  return bx_md_dd_to_f32(bx_md_exp_dd((double)x));
}

/* ---- log ------------------------------------------------------------------ */

/* bx_logf_det: ln x correctly rounded to fp32.
 * log(+-0) = -Inf, log(x < 0) = NaN (0x7fc00000), log(+Inf) = +Inf,
 * log(1) = +0, NaN canonical; subnormal x normalised with integer operations.
 * Fast path: x = m 2^e, m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s),
 * s = (m - 1)/(m + 1) (m - 1 exact, one rounded division), |s| <= 0.1716,
 * series to s^23 (remainder < 2^-60), e ln2 with the 32-bit ln2_hi exact;
 * the sum cancels at most a factor 3 (|log x| >= 0.34 when e != 0):
 * relative error < 2^-50. Slow path: pow_det.h's log2 (2^-80) times ln2
 * in double-double.
 * Exhaustive: max error 0.5 ulp, 0 results not correctly rounded
 * (worst input 0x1.22d57p-65). */
static inline BX_HD float bx_logf_det(float x) {
  uint32_t b = bx_f32_bits(x);
  if (x != x) return bx_md_nan(x);
  if (b == 0u || b == 0x80000000u) return bx_f32_from_bits(0xff800000u);
  if (b >> 31) return bx_f32_from_bits(BX_MD_QNAN);
  if (b == 0x7f800000u) return x;
  int e = (int)(b >> 23);
  if (e == 0) { /* subnormal: normalise the integer mantissa */
    int shift = bx_clz64((uint64_t)b) - 40;
    b <<= shift;
    e = 1 - shift;
  }
  e -= 127;
  uint32_t mb = (b & 0x007fffffu) | 0x3f800000u;
  if (mb > 0x3fb504f3u) { /* m > sqrt(2): use m / 2 */
    mb -= 0x00800000u;
    e += 1;
  }
  double m = (double)bx_f32_from_bits(mb);
  double s = (m - 1.0) / (m + 1.0);
  double z = s * s;
  double p = 0x1.642c8590b2164p-4; /* 2/23 */
  p = 0x1.8618618618618p-4 + z * p; /* 2/21 */
  p = 0x1.af286bca1af28p-4 + z * p; /* 2/19 */
  p = 0x1.e1e1e1e1e1e1ep-4 + z * p; /* 2/17 */
  p = 0x1.1111111111111p-3 + z * p; /* 2/15 */
  p = 0x1.3b13b13b13b14p-3 + z * p; /* 2/13 */
  p = 0x1.745d1745d1746p-3 + z * p; /* 2/11 */
  p = 0x1.c71c71c71c71cp-3 + z * p; /* 2/9 */
  p = 0x1.2492492492492p-2 + z * p; /* 2/7 */
  p = 0x1.999999999999ap-2 + z * p; /* 2/5 */
  p = 0x1.5555555555555p-1 + z * p; /* 2/3 */
  double lm = 2.0 * s + s * (z * p);
  const double ln2_hi = 0x1.62e42fee00000p-1, ln2_lo = 0x1.a39ef35793c76p-33;
  double de = (double)e;
  double y = de * ln2_hi + (lm + de * ln2_lo);
  if (y == 0.0) return 0.0f; /* x = 1 exactly */
  if (!bx_md_hard(y)) return (float)y;
  const bx_pd_dd ln2 = {0x1.62e42fefa39efp-1, 0x1.abc9e3b39803fp-56};
  return bx_md_dd_to_f32(bx_pd_mul(bx_pd_log2((double)x), ln2));
}

/* ---- sigmoid, SiLU --------------------------------------------------------- */

/* bx_sigmoidf_det: 1 / (1 + e^-x) correctly rounded to fp32.
 * sigmoid(+Inf) = 1, sigmoid(-Inf) = +0, NaN canonical; x >= 40 gives 1 and
 * x <= -110 gives +0 (the correctly rounded values). Fast path: e^-x
 * (< 2^-50), 1 + e and one division: < 2^-49.5. Slow path: double-double.
 * Exhaustive: max error 0.5 ulp, 0 results not correctly rounded
 * (worst input 0x1p-23). */
static inline BX_HD float bx_sigmoidf_det(float x) {
  if (x != x) return bx_md_nan(x);
  if (x >= 40.0f) return 1.0f;
  if (x <= -110.0f) return 0.0f;
  double e = bx_md_exp_fast(-(double)x);
  double y = 1.0 / (1.0 + e);
  if (!bx_md_hard(y)) return (float)y;
  bx_pd_dd ed = bx_md_exp_dd(-(double)x);
  return bx_md_dd_to_f32(bx_md_div_dd(1.0, bx_md_dd_add(bx_pd_make(1.0, 0.0), ed)));
}

/* bx_siluf_det: SiLU(x) = x sigmoid(x) = x / (1 + e^-x), the exact value
 * rounded once to fp32 (not the product of a rounded sigmoid).
 * silu(+Inf) = +Inf, silu(-Inf) = -0 (the limit; torch's x/(1+exp(-x))
 * gives NaN there), NaN canonical, silu(+-0) = +-0; x >= 40 gives x,
 * x <= -110 gives -0 (the correctly rounded values). |x| < 2^-60:
 * silu(x) = x/2 + x^2/4 - ..., i.e. x/2 (exact in double) plus a positive
 * amount far below its double ulp: x/2 moved one double ulp upwards
 * rounds to the same float as the exact value (x/2 is a float or a float
 * midpoint; the moved value is neither). Otherwise as sigmoid, times x.
 * Exhaustive: max error 0.5 ulp, 0 results not correctly rounded
 * (worst input 0x1p-149). */
static inline BX_HD float bx_siluf_det(float x) {
  if (x != x) return bx_md_nan(x);
  if (x >= 40.0f) return x;
  if (x <= -110.0f) return -0.0f;
  double xd = (double)x;
  if (x == 0.0f) return x;
  if (x < 0x1p-60f && x > -0x1p-60f) {
    double h = xd * 0.5;
    uint64_t hb = bx_f64_bits(h);
    hb = x > 0.0f ? hb + 1u : hb - 1u; /* one double ulp towards +Inf */
    return (float)bx_f64_from_bits(hb);
  }
  double e = bx_md_exp_fast(-xd);
  double y = xd / (1.0 + e);
  if (!bx_md_hard(y)) return (float)y;
  bx_pd_dd ed = bx_md_exp_dd(-xd);
  bx_pd_dd s = bx_md_div_dd(1.0, bx_md_dd_add(bx_pd_make(1.0, 0.0), ed));
  bx_pd_dd p = bx_pd_two_prod(s.hi, xd);
  return bx_md_dd_to_f32(bx_pd_fast_two_sum(p.hi, p.lo + s.lo * xd));
}

/* ---- rsqrt ----------------------------------------------------------------- */

/* 1 when 1/sqrt(x) > mid, exactly (mid > 0 with <= 25 significant bits,
 * x > 0 with <= 24: mid^2 is exact in double, mid^2 x exact as a Dekker
 * product; mid^2 x is within [1/2, 2] around a rounding boundary, so
 * p.hi - 1 is exact). */
static inline BX_HD int bx_md_rsqrt_above(double mid, double x) {
  bx_pd_dd p = bx_pd_two_prod(mid * mid, x);
  double d = p.hi - 1.0;
  return d < -p.lo; /* mid^2 x < 1 */
}

/* bx_rsqrtf_det: 1/sqrt(x) correctly rounded to fp32.
 * rsqrt(+0) = +Inf, rsqrt(-0) = -Inf, rsqrt(+Inf) = +0, rsqrt(x < 0) = NaN
 * (0x7fc00000), NaN canonical. Fast path: sqrt and a division in double
 * (< 2^-52). Slow path exact: the candidate float's two neighbouring
 * midpoints are compared with 1/sqrt(x) in exact arithmetic.
 * Exhaustive: max error 0.5 ulp, 0 results not correctly rounded
 * (worst input 0x1.7431c6p-125). */
static inline BX_HD float bx_rsqrtf_det(float x) {
  uint32_t b = bx_f32_bits(x);
  if (x != x) return bx_md_nan(x);
  if (b == 0u) return bx_f32_from_bits(0x7f800000u);
  if (b == 0x80000000u) return bx_f32_from_bits(0xff800000u);
  if (b >> 31) return bx_f32_from_bits(BX_MD_QNAN);
  if (b == 0x7f800000u) return 0.0f;
  double xd = (double)x;
#ifdef __CUDA_ARCH__
  double y = 1.0 / __dsqrt_rn(xd);
#else
  double y = 1.0 / __builtin_sqrt(xd);
#endif
  float f = (float)y;
  if (!bx_md_hard(y)) return f;
  /* 1/sqrt(x) is in (2^-75, 2^75): f and its neighbours are normal */
  uint32_t fb = bx_f32_bits(f);
  double fd = (double)f;
  double lo_mid = 0.5 * (fd + (double)bx_f32_from_bits(fb - 1u));
  double hi_mid = 0.5 * (fd + (double)bx_f32_from_bits(fb + 1u));
  if (bx_md_rsqrt_above(hi_mid, xd)) return bx_f32_from_bits(fb + 1u);
  if (!bx_md_rsqrt_above(lo_mid, xd)) return bx_f32_from_bits(fb - 1u);
  return f;
}

/* ---- sin, cos ----------------------------------------------------------------- */

/* Domain of bx_sinf_det / bx_cosf_det: |x| < 2^28 (RoPE angles: position
 * times inverse frequency; 2^28 = 268M positions at frequency 1). */
#define BX_TRIG_DET_MAX 0x1p28f

/* x = k pi/2 + r for |x| < 2^28: k = nearest(x 2/pi) (|k| < 2^28), pi/2 =
 * P1 + P2 + P3 + P4 with P1..P3 of 25 bits: k Pi exact; x - k P1 exact
 * (multiples of 2^-24, below 16), minus k P2 exact (multiples of 2^-49,
 * below 1), minus k P3 exactly as a two-sum, minus k P4 (~2^-47, error
 * 2^-100): r as a double-double with absolute error < 2^-98 (and
 * |r| <= pi/4 + 2^-20). */
static inline BX_HD bx_pd_dd bx_md_trig_reduce(double x, int *quadrant) {
  const double two_over_pi = 0x1.45f306dc9c883p-1;
  const double p1 = 0x1.921fb5p+0, p2 = 0x1.110b46p-26, p3 = 0x1.1a6263p-54;
  const double p4 = 0x1.8a2e03707344ap-81;
  double k = bx_md_nearest(x * two_over_pi);
  double a = (x - k * p1) - k * p2;
  bx_pd_dd r = bx_pd_two_sum(a, -(k * p3));
  r = bx_pd_fast_two_sum(r.hi, r.lo - k * p4);
  *quadrant = (int)((int64_t)k & 3);
  return r;
}

/* sin r, cos r for |r.hi| <= 0.7855 + 2^-20 in double, relative error
 * < 2^-51: Taylor to r^19 / r^20 (remainders < 2^-58), Horner in r^2;
 * the leading term added last; r.lo folded in to first order
 * (sin(h + l) = sin h + l cos h, cos(h + l) = cos h - l sin h, |l| <=
 * 2^-53 |h|: the dropped terms are < 2^-54 relative). */
static inline BX_HD double bx_md_sin_fast(bx_pd_dd r) {
  double x = r.hi, z = x * x;
  double p = -0x1.2f49b46814157p-57; /* -1/19! */
  p = 0x1.952c77030ad4ap-49 + z * p;  /* 1/17! */
  p = -0x1.ae7f3e733b81fp-41 + z * p; /* -1/15! */
  p = 0x1.6124613a86d09p-33 + z * p;  /* 1/13! */
  p = -0x1.ae64567f544e4p-26 + z * p; /* -1/11! */
  p = 0x1.71de3a556c734p-19 + z * p;  /* 1/9! */
  p = -0x1.a01a01a01a01ap-13 + z * p; /* -1/7! */
  p = 0x1.1111111111111p-7 + z * p;   /* 1/5! */
  p = -0x1.5555555555555p-3 + z * p;  /* -1/3! */
  return x + ((x * z) * p + r.lo);
}
static inline BX_HD double bx_md_cos_fast(bx_pd_dd r) {
  double x = r.hi, z = x * x;
  double p = 0x1.e542ba4020225p-62;   /* 1/20! */
  p = -0x1.6827863b97d97p-53 + z * p; /* -1/18! */
  p = 0x1.ae7f3e733b81fp-45 + z * p;  /* 1/16! */
  p = -0x1.93974a8c07c9dp-37 + z * p; /* -1/14! */
  p = 0x1.1eed8eff8d898p-29 + z * p;  /* 1/12! */
  p = -0x1.27e4fb7789f5cp-22 + z * p; /* -1/10! */
  p = 0x1.a01a01a01a01ap-16 + z * p;  /* 1/8! */
  p = -0x1.6c16c16c16c17p-10 + z * p; /* -1/6! */
  p = 0x1.5555555555555p-5 + z * p;   /* 1/4! */
  p = -0.5 + z * p;
  return 1.0 + (z * p - x * r.lo);
}

/* sin r (odd = 1) or cos r (odd = 0) in double-double, |r| <= 0.79:
 * the Taylor series summed term by term to r^27 / r^26 (remainder
 * < 2^-100), each term from the previous one by one double-double product
 * and one division by an exact integer: relative error ~2^-98. */
static inline BX_HD bx_pd_dd bx_md_sincos_dd(bx_pd_dd r, int odd) {
  bx_pd_dd r2 = bx_pd_mul(r, r);
  bx_pd_dd term = odd ? r : bx_pd_make(1.0, 0.0);
  bx_pd_dd sum = term;
  for (int k = 1; k <= 13; k++) {
    double n = odd ? (double)(2 * k) * (double)(2 * k + 1) : (double)(2 * k - 1) * (double)(2 * k);
    term = bx_md_dd_div_d(bx_pd_mul(term, r2), -n);
    sum = bx_md_dd_add(sum, term);
  }
  return sum;
}

/* sin (want_sin = 1) or cos of x = k pi/2 + r: quadrant q = k mod 4 picks
 * +-sin r or +-cos r. */
static inline BX_HD float bx_md_trig(float x, int want_sin) {
  int q;
  bx_pd_dd r = bx_md_trig_reduce((double)x, &q);
  q = (q + (want_sin ? 0 : 1)) & 3; /* cos x = sin(x + pi/2) */
  int odd = (q & 1) == 0;           /* q 0, 2: sin r; 1, 3: cos r */
  int neg = q >= 2;
  double y = odd ? bx_md_sin_fast(r) : bx_md_cos_fast(r);
  if (neg) y = -y;
  if (!bx_md_hard(y)) return (float)y;
  bx_pd_dd s = bx_md_sincos_dd(r, odd);
  if (neg) s = bx_pd_make(-s.hi, -s.lo);
  return bx_md_dd_to_f32(s);
}

/* bx_sinf_det: sin x correctly rounded to fp32 for |x| < 2^28
 * (BX_TRIG_DET_MAX); +-Inf and finite |x| >= 2^28 give NaN (0x7fc00000),
 * NaN canonical, |x| < 2^-12 gives x (sin(+-0) = +-0).
 * Exhaustive over |x| < 2^28: max error 0.5 ulp, 0 results not correctly
 * rounded (worst input 0x1.33333p+13). */
static inline BX_HD float bx_sinf_det(float x) {
  if (x != x) return bx_md_nan(x);
  if (!(x < BX_TRIG_DET_MAX && x > -BX_TRIG_DET_MAX)) return bx_f32_from_bits(BX_MD_QNAN);
  if (x < 0x1p-12f && x > -0x1p-12f) return x;
  return bx_md_trig(x, 1);
}

/* bx_cosf_det: cos x correctly rounded to fp32 for |x| < 2^28; outside as
 * bx_sinf_det; |x| < 2^-12 gives 1.
 * Exhaustive over |x| < 2^28: max error 0.5 ulp, 0 results not correctly
 * rounded (worst input 0x1p-12). */
static inline BX_HD float bx_cosf_det(float x) {
  if (x != x) return bx_md_nan(x);
  if (!(x < BX_TRIG_DET_MAX && x > -BX_TRIG_DET_MAX)) return bx_f32_from_bits(BX_MD_QNAN);
  if (x < 0x1p-12f && x > -0x1p-12f) return 1.0f;
  return bx_md_trig(x, 0);
}

#endif /* BX_MATH_DET_H */
