/*
 * pow_det.h — a^p built only from IEEE-754 basic operations (+, -, *, /),
 * written once for the CPU and the GPU (BX_HD), so the two give the same
 * bits. libm's pow differs between glibc and CUDA in the last bit; the
 * "other p" norms raise every element to p and take the 1/p root of the
 * exact sum, so they use this instead.
 *
 * Assumptions: IEEE binary64, round to nearest even, no contraction of
 * a*b+c into an fma (-ffp-contract=off on the host, --fmad=false on the
 * device: with contraction the bits change), no x87 excess precision, no
 * -ffast-math. Nothing here calls libm, fma or long double; every constant
 * is an exact hex literal. Subnormal inputs and results are handled with
 * integer operations, so flush-to-zero / denormals-are-zero modes (e.g.
 * torch.set_flush_denormal) do not change the result.
 *
 * Domain: a >= 0 (the callers pass |x|), NaN or +Inf; p > 0 finite (an
 * exponent or the reciprocal of one). NaN^p = NaN, Inf^p = Inf, 0^p = 0;
 * overflow gives +Inf, underflow a correctly rounded subnormal or 0.
 * Outside the domain: p = 0 or a = 1 gives 1 (as C's pow, even with a
 * NaN), a < 0 gives NaN (C's pow differs for integer p), -0 is taken as
 * +0 (C gives -0 for odd integer p), p < 0 and p = +-Inf follow C's pow.
 * Every NaN returned is the quiet NaN 0x7ff8000000000000.
 *
 * Accuracy: faithful (below 1 ulp) everywhere and in practice correctly
 * rounded: before its final rounding the result is within ~2^-70 of a^p
 * (relative; ~2^-73 for p <= 16), so it is rounded correctly unless a^p
 * lies within ~2^-18 ulp of a midpoint between two doubles (exact ties,
 * a^p with 54 significant bits such as 3^34, go either way). Exact
 * whenever a^p is a double (3^3 = 27, 4^0.5 = 2, 2^10 = 1024, ...).
 *
 * Method: a = m 2^e with m in [sqrt(1/2), sqrt(2)];
 *   log2(a) = e + (2/ln2) atanh(s),  s = (m-1)/(m+1), |s| <= 0.1716,
 * s and s^2 in double-double, the series' first five terms in
 * double-double, the rest (below 2^-28 of the sum) in double: relative
 * error ~2^-80. y = p log2(a) in double-double (Dekker products with
 * Veltkamp splitting, no fma); n = nearest integer to y, f = y - n in
 * [-1/2, 1/2] exactly; 2^f = sum (f ln2)^k / k!, seven terms in
 * double-double, ten more in double: ~2^-73. The result is 2^f 2^n: an
 * exact scaling for normal results; subnormal ones are rounded once, on
 * their own grid, with the low part kept as a sticky bit (round to odd).
 */
#ifndef BX_POW_DET_H
#define BX_POW_DET_H

#include <stdint.h>

#include "hd.h"

/* bx_pd_*: the double-double arithmetic of bx_pow_det.
 * A double-double: the unevaluated sum hi + lo, |lo| <= ulp(hi)/2. */
typedef struct bx_pd_dd {
  double hi, lo;
} bx_pd_dd;

static inline BX_HD bx_pd_dd bx_pd_make(double hi, double lo) {
  bx_pd_dd r;
  r.hi = hi;
  r.lo = lo;
  return r;
}

/* a + b exactly (Knuth's two-sum: any magnitudes). */
static inline BX_HD bx_pd_dd bx_pd_two_sum(double a, double b) {
  double s = a + b, bb = s - a;
  return bx_pd_make(s, (a - (s - bb)) + (b - bb));
}

/* a + b exactly when |a| >= |b| (or a == 0). */
static inline BX_HD bx_pd_dd bx_pd_fast_two_sum(double a, double b) {
  double s = a + b;
  return bx_pd_make(s, b - (s - a));
}

/* a * b exactly (Dekker: Veltkamp splitting into 26-bit halves, no fma);
 * |a|, |b| < 2^995 and no underflow in the low part. */
static inline BX_HD bx_pd_dd bx_pd_two_prod(double a, double b) {
  const double split = 0x1.0000002p+27; /* 2^27 + 1 */
  double ta = split * a, ah = ta - (ta - a), al = a - ah;
  double tb = split * b, bh = tb - (tb - b), bl = b - bh;
  double p = a * b;
  return bx_pd_make(p, ((ah * bh - p) + ah * bl + al * bh) + al * bl);
}

/* x * y, relative error ~2^-104. */
static inline BX_HD bx_pd_dd bx_pd_mul(bx_pd_dd x, bx_pd_dd y) {
  bx_pd_dd p = bx_pd_two_prod(x.hi, y.hi);
  return bx_pd_fast_two_sum(p.hi, p.lo + (x.hi * y.lo + x.lo * y.hi));
}

/* c + x y, renormalised once (error ~2^-104 (|c| + |x y|); for sums
 * without cancellation: in every use here |c + x y| >= (|c| + |x y|) / 3). */
static inline BX_HD bx_pd_dd bx_pd_mul_add(bx_pd_dd c, bx_pd_dd x, bx_pd_dd y) {
  bx_pd_dd p = bx_pd_two_prod(x.hi, y.hi);
  bx_pd_dd s = bx_pd_two_sum(c.hi, p.hi);
  return bx_pd_fast_two_sum(s.hi, s.lo + (p.lo + (c.lo + (x.hi * y.lo + x.lo * y.hi))));
}

/* c + x y for a double y. */
static inline BX_HD bx_pd_dd bx_pd_mul_add_d(bx_pd_dd c, bx_pd_dd x, double y) {
  bx_pd_dd p = bx_pd_two_prod(x.hi, y);
  bx_pd_dd s = bx_pd_two_sum(c.hi, p.hi);
  return bx_pd_fast_two_sum(s.hi, s.lo + (p.lo + (c.lo + x.lo * y)));
}

/* x + y rounded to odd: x + y if it is a double, else whichever of its two
 * neighbours has an odd last bit. For |x + y| <= ulp(h), as in both uses,
 * h + that rounded to nearest is h + x + y rounded correctly: the sticky
 * bit survives (a midpoint of h's grid is never a rounded-to-odd value
 * unless exact). */
static inline BX_HD double bx_pd_add_odd(double x, double y) {
  bx_pd_dd s = bx_pd_two_sum(x, y);
  uint64_t b = bx_f64_bits(s.hi);
  if (s.lo != 0.0 && (b & 1u) == 0) b = (s.lo > 0.0) == (s.hi > 0.0) ? b + 1u : b - 1u;
  return bx_f64_from_bits(b);
}

/* log2(a) for finite a > 0, as a double-double (relative error ~2^-80). */
static inline BX_HD bx_pd_dd bx_pd_log2(double a) {
  uint64_t bits = bx_f64_bits(a);
  int e = (int)(bits >> 52);
  if (e == 0) { /* subnormal: normalise the integer mantissa (immune to DAZ) */
    int shift = bx_clz64(bits) - 11;
    bits <<= shift;
    e = 1 - shift;
  }
  e -= 1023;
  double m = bx_f64_from_bits((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
  if (m > 0x1.6a09e667f3bcdp+0) { /* sqrt(2) rounded: keep m in [0.707, 1.415] */
    m *= 0.5;
    e += 1;
  }
  /* s = (m - 1) / (m + 1), |s| <= 0.1716: m - 1 is exact (Sterbenz), m + 1
   * a two-sum; one division, the residual num - s den formed exactly */
  double num = m - 1.0;
  bx_pd_dd den = bx_pd_two_sum(m, 1.0);
  double inv = 1.0 / den.hi;
  double sh = num * inv;
  bx_pd_dd q = bx_pd_two_prod(sh, den.hi);
  double sl = (((num - q.hi) - q.lo) - sh * den.lo) * inv; /* num - q.hi is exact */
  bx_pd_dd s = bx_pd_fast_two_sum(sh, sl);
  bx_pd_dd t = bx_pd_two_prod(s.hi, s.hi); /* t = s^2 <= 2^-5.08 */
  t = bx_pd_fast_two_sum(t.hi, t.lo + 2.0 * s.hi * s.lo);
  /* log2(m) = (2/ln2) atanh(s) = s sum_{k>=0} c_k t^k, c_k = (2/ln2)/(2k+1).
   * c_5 t^5 on (below 2^-28 of the sum) in double, by Estrin's scheme;
   * truncated after c_14 t^14 (the next term is < 2^-81 of the sum). */
  double th = t.hi, t2 = th * th, t4 = t2 * t2, t8 = t4 * t4;
  double e01 = 0x1.0c9a84994022dp-2 + 0x1.c68f568d31760p-3 * th; /* c_5, c_6 */
  double e23 = 0x1.89f3b1694cffep-3 + 0x1.5b9ac9b743f0dp-3 * th; /* c_7, c_8 */
  double e45 = 0x1.3703c1f4d0ffep-3 + 0x1.1964ec6fc9491p-3 * th; /* c_9, c_10 */
  double e67 = 0x1.00ecd7e080215p-3 + 0x1.d8be0817f5ffep-4 * th; /* c_11, c_12 */
  double e89 = 0x1.b5b96fca558e1p-4 + 0x1.9789566cee8d2p-4 * th; /* c_13, c_14 */
  double tail = (e01 + e23 * t2) + (e45 + e67 * t2) * t4 + e89 * t8;
  /* c_0 .. c_4 in double-double, in parallel: b0 + t^2 (b1 + t^2 b2) */
  const bx_pd_dd c0 = {0x1.71547652b82fep+1, 0x1.777d0ffda0d24p-55}; /* 2/ln2 */
  const bx_pd_dd c1 = {0x1.ec709dc3a03fdp-1, 0x1.d27f05548af0cp-55};
  const bx_pd_dd c2 = {0x1.2776c50ef9bfep-1, 0x1.e4b29ccc535d4p-55};
  const bx_pd_dd c3 = {0x1.a61762a7aded9p-2, 0x1.fb22e490ee2f0p-57};
  const bx_pd_dd c4 = {0x1.484b13d7c02a9p-2, -0x1.e55fc724e0a2cp-60};
  bx_pd_dd tt = bx_pd_mul(t, t);
  bx_pd_dd b2 = bx_pd_mul_add_d(c4, t, tail);
  bx_pd_dd b1 = bx_pd_mul_add(c2, t, c3);
  bx_pd_dd b0 = bx_pd_mul_add(c0, t, c1);
  bx_pd_dd c = bx_pd_mul_add(b0, tt, bx_pd_mul_add(b1, tt, b2));
  return bx_pd_mul_add(bx_pd_make((double)e, 0.0), s, c); /* e + log2(m), e exact */
}

/* 2^f for a double-double |f| <= 1/2 + 2^-40, as a double-double in
 * [0.707, 1.415] (relative error ~2^-72) whose hi is its value rounded to
 * nearest, correctly (lo is the exact remainder). */
static inline BX_HD bx_pd_dd bx_pd_exp2_reduced(bx_pd_dd f) {
  /* 2^f = exp(f ln2) = 1 + f (c_1 + f (c_2 + ...)), c_k = ln2^k / k!;
   * c_7 f^7 on (below 2^-23) in double, by Estrin's scheme; truncated
   * after c_16 f^16 (the next term is < 2^-74) */
  double fh = f.hi, f2 = fh * fh, f4 = f2 * f2, f8 = f4 * f4;
  double e01 = 0x1.ffcbfc588b0c7p-17 + 0x1.62c0223a5c824p-20 * fh; /* c_7, c_8 */
  double e23 = 0x1.b5253d395e7c4p-24 + 0x1.e4cf5158b8ecap-28 * fh; /* c_9, c_10 */
  double e45 = 0x1.e8cac7351bb25p-32 + 0x1.c3bd650fc2986p-36 * fh; /* c_11, c_12 */
  double e67 = 0x1.816193166d0f9p-40 + 0x1.314964d5878a9p-44 * fh; /* c_13, c_14 */
  double e89 = 0x1.c36e843b04022p-49 + 0x1.38e89ae79f8b4p-53 * fh; /* c_15, c_16 */
  double tail = (e01 + e23 * f2) + (e45 + e67 * f2) * f4 + e89 * f8;
  /* c_1 .. c_6 in double-double, in parallel: a0 + f^2 (a1 + f^2 a2) */
  const bx_pd_dd c1 = {0x1.62e42fefa39efp-1, 0x1.abc9e3b39803fp-56}; /* ln2 */
  const bx_pd_dd c2 = {0x1.ebfbdff82c58fp-3, -0x1.5e43a53e44da3p-57};
  const bx_pd_dd c3 = {0x1.c6b08d704a0c0p-5, -0x1.d331627513351p-59};
  const bx_pd_dd c4 = {0x1.3b2ab6fba4e77p-7, 0x1.4e65df05a9f75p-62};
  const bx_pd_dd c5 = {0x1.5d87fe78a6731p-10, 0x1.0717f69a514bfp-66};
  const bx_pd_dd c6 = {0x1.430912f86c787p-13, 0x1.bd2c2a261ac8dp-67};
  bx_pd_dd ff = bx_pd_mul(f, f);
  bx_pd_dd a2 = bx_pd_mul_add(c5, f, bx_pd_mul_add_d(c6, f, tail));
  bx_pd_dd a1 = bx_pd_mul_add(c3, f, c4);
  bx_pd_dd a0 = bx_pd_mul_add(c1, f, c2);
  bx_pd_dd c = bx_pd_mul_add(a0, ff, bx_pd_mul_add(a1, ff, a2));
  /* 1 + f c, rounded once: the low parts summed to odd keep the sticky bit */
  bx_pd_dd p = bx_pd_two_prod(f.hi, c.hi);
  bx_pd_dd s = bx_pd_two_sum(1.0, p.hi);
  double rest = p.lo + (f.hi * c.lo + f.lo * c.hi);
  return bx_pd_fast_two_sum(s.hi, bx_pd_add_odd(s.lo, rest));
}

/* a^p: see the top of this file for the domain, special values and
 * accuracy. Pure function, thread-safe, host and device. */
static inline BX_HD double bx_pow_det(double a, double p) {
  const double inf = bx_f64_from_bits(0x7ff0000000000000ull);
  const double nan = bx_f64_from_bits(0x7ff8000000000000ull); /* one NaN everywhere */
  /* a's class from its bits (a subnormal a is not zero even under DAZ) */
  uint64_t ab = bx_f64_bits(a), mag = ab & 0x7fffffffffffffffull;
  if (p == 0.0 || a == 1.0) return 1.0;
  if (mag > 0x7ff0000000000000ull || p != p) return nan;
  if (mag == 0) return p > 0.0 ? 0.0 : inf; /* +-0 */
  if (ab >> 63) return nan;                 /* a < 0 */
  if (mag == 0x7ff0000000000000ull) return p > 0.0 ? inf : 0.0;

  bx_pd_dd L = bx_pd_log2(a); /* != 0 since a != 1 */
  /* every finite non-zero result has |y| < 1075; checking the rounded
   * product first also keeps p small enough for the exact product */
  double y0 = p * L.hi;
  if (y0 > 1100.0) return inf;
  if (y0 < -1100.0) return 0.0;
  bx_pd_dd y = bx_pd_two_prod(p, L.hi);
  y = bx_pd_fast_two_sum(y.hi, y.lo + p * L.lo);
  /* n = nearest integer to y (the 1.5 * 2^52 shift), f = y - n exactly */
  double nd = (y.hi + 0x1.8p52) - 0x1.8p52;
  int n = (int)nd;
  bx_pd_dd f = bx_pd_two_sum(y.hi - nd, y.lo); /* y.hi - nd is exact */
  bx_pd_dd E = bx_pd_exp2_reduced(f);        /* E.hi = E rounded once */

  if (n > -1022 || (n == -1022 && E.hi >= 1.0)) { /* normal result, or overflow */
    if (n <= 1023) return E.hi * bx_f64_from_bits((uint64_t)(n + 1023) << 52); /* exact */
    if (n > 1024) return inf;
    return (E.hi * 2.0) * 0x1p1023; /* n = 1024: finite iff E.hi < 1 */
  }
  /* Subnormal (or zero) result: E 2^n rounded once to a multiple of
   * 2^-1074, i.e. E to a multiple of 2^(j-52), j = -1022 - n: the ulp of
   * B = 2^j > E. Add B, round (the sticky bit kept by rounding to odd),
   * subtract B (exact); the multiple, as an integer, is the subnormal's
   * bit pattern (2^52 gives 2^-1022). No subnormal is formed on the FPU,
   * so flush-to-zero modes do not change the result. */
  if (n < -1080) return 0.0; /* E 2^n < 2^-1075.5 */
  int j = -1022 - n;         /* 0 .. 58 */
  double B = bx_f64_from_bits((uint64_t)(1023 + j) << 52);
  double h = B + E.hi;
  double d = bx_pd_add_odd((B - h) + E.hi, E.lo); /* (B - h) + E.hi: h's exact error */
  double z = (h + d) - B;                         /* exact, in [0, B] */
  return bx_f64_from_bits((uint64_t)(z * bx_f64_from_bits((uint64_t)(1023 + 52 - j) << 52)));
}

#endif /* BX_POW_DET_H */
