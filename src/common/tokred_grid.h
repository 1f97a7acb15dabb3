/*
 * tokred_grid.h — the numerics of the token reduction's grid
 * (bitexact_train.h, "Token reduction"), host/device shareable: the
 * exponent bound of an fp32 value, the grid exponent of a tensor, rounding
 * an addend onto the grid, and the one final rounding of Q * 2^e / D into
 * fp32 or fp64. Pure functions; no allocation, no errors.
 *
 * Assumes IEEE binary32/binary64 and round to nearest even (the library's
 * floating-point environment) for bx_tokred_q.
 */
#ifndef BX_TOKRED_GRID_H
#define BX_TOKRED_GRID_H

#include <stdint.h>

#include "hd.h"

/* Exponent bound of "every addend is 0". */
#define BX_TOKRED_EMIN (-149)
#define BX_TOKRED_EMAX 128
/* Most grid steps of one rounded addend: |q| <= 2^BX_TOKRED_PMAX. 51 keeps
 * a / 2^e + 1.5 * 2^52 inside [2^52, 2^53), where the bits of the double
 * are the integer (bx_tokred_q). */
#define BX_TOKRED_PMAX 51

/* |x| < 2^E for the fp32 whose |bits| (sign cleared) is ab, finite:
 * E = frexp exponent (floor(log2|x|) + 1); BX_TOKRED_EMIN for 0. */
static inline BX_HD int bx_tokred_exp_of_abs(uint32_t ab) {
  if (ab == 0) return BX_TOKRED_EMIN;
  int be = (int)(ab >> 23);
  if (be > 0) return be - 126;
  /* subnormal: |x| = m * 2^-149, floor(log2 m) = 31 - clz(m) */
  return -149 + (32 - (int)(bx_clz64((uint64_t)ab) - 32));
}

/* The |bits| of 2^E as fp32 (E in [-149, 128]; 2^128 -> 0x7f800000, the
 * first non-finite pattern): a finite |x| < 2^E iff |bits| < this. */
static inline BX_HD uint32_t bx_tokred_abs_limit(int E) {
  if (E >= 128) return 0x7f800000u;
  if (E >= -126) return (uint32_t)(E + 127) << 23;
  return 1u << (E + 149);
}

/* ceil(log2 n), n >= 1 */
static inline BX_HD int bx_tokred_ceil_log2(int64_t n) {
  if (n <= 1) return 0;
  return 64 - bx_clz64((uint64_t)(n - 1));
}

/* P = min(51, 62 - L): the grid steps below the bound. */
static inline BX_HD int bx_tokred_precision(int64_t nchunks) {
  int p = 62 - bx_tokred_ceil_log2(nchunks);
  return p < BX_TOKRED_PMAX ? p : BX_TOKRED_PMAX;
}

/* The grid exponent e = E - P. */
static inline BX_HD int bx_tokred_grid_exponent(int E, int64_t nchunks) {
  return E - bx_tokred_precision(nchunks);
}

/* 2^k as a double, -1022 <= k <= 1023. */
static inline BX_HD double bx_tokred_pow2(int k) {
  return bx_f64_from_bits((uint64_t)(k + 1023) << 52);
}

/* q = round_nearest_even(a * inv_step) for a finite fp32 a with
 * |a * inv_step| <= 2^51, inv_step = 2^-e: the product is exact in double,
 * adding 1.5 * 2^52 rounds it to an integer (nearest even) and leaves it in
 * the low mantissa bits. */
static inline BX_HD int64_t bx_tokred_q(float a, double inv_step) {
  const double magic = 6755399441055744.0; /* 1.5 * 2^52 */
  double r = (double)a * inv_step + magic;  /* two roundings: exact, then RNE */
  return (int64_t)(bx_f64_bits(r) - bx_f64_bits(magic));
}

/* The bits of the value (-1)^neg * (m + s) * 2^x rounded once, nearest
 * even, to the binary format with prec significand bits and largest
 * exponent emax (fp32: 24, 127; fp64: 53, 1023), where 0 <= s < 1 is only
 * known as sticky (s != 0). m < 2^127. */
static inline BX_HD uint64_t bx_tokred_round_bits(int neg, bx_u128 m, int sticky, int x, int prec,
                                                  int emax) {
  int total = prec == 24 ? 32 : 64;
  uint64_t sign = (uint64_t)(neg ? 1 : 0) << (total - 1);
  if (m == 0) return sticky ? sign : 0; /* (0, 1) * 2^x with x tiny never occurs */
  int hi = (uint64_t)(m >> 64) != 0 ? 127 - bx_clz64((uint64_t)(m >> 64)) : 63 - bx_clz64((uint64_t)m);
  int emin = 1 - emax;
  int top = hi + x; /* floor(log2 |value|) */
  int lsb = (top >= emin ? top : emin) - (prec - 1);
  int shift = lsb - x;
  bx_u128 keep;
  if (shift > 0) {
    bx_u128 rest;
    if (shift >= 128) {
      keep = 0;
      rest = m;
    } else {
      keep = m >> shift;
      rest = m & (((bx_u128)1 << shift) - 1);
    }
    int up;
    if (shift > 128) up = 0; /* below half an ulp */
    else {
      bx_u128 half = (bx_u128)1 << (shift - 1);
      up = rest > half || (rest == half && (sticky || (keep & 1)));
    }
    keep += (bx_u128)(up ? 1 : 0);
    if (keep >> prec) { /* rounded up to the next binade */
      keep >>= 1;
      lsb++;
    }
  } else {
    keep = m << -shift; /* exact; the sticky part is below half an ulp */
  }
  uint64_t k = (uint64_t)keep;
  uint64_t frac_mask = ((uint64_t)1 << (prec - 1)) - 1;
  if (k >> (prec - 1)) { /* normal */
    int64_t biased = (int64_t)lsb + (prec - 1) + emax;
    if (biased >= 2 * (int64_t)emax + 1) return sign | ((uint64_t)(2 * emax + 1) << (prec - 1));
    return sign | ((uint64_t)biased << (prec - 1)) | (k & frac_mask);
  }
  return sign | k; /* subnormal (or zero) */
}

/* Q * 2^e / d (d >= 1) rounded once to fp32 (prec 24) or fp64 (prec 53):
 * its bits. */
static inline BX_HD uint64_t bx_tokred_finish_bits(int64_t Q, int e, int64_t d, int prec) {
  int emax = prec == 24 ? 127 : 1023;
  int neg = Q < 0;
  uint64_t mag = neg ? 0 - (uint64_t)Q : (uint64_t)Q;
  if (mag == 0) return 0;
  if (d == 1) return bx_tokred_round_bits(neg, mag, 0, e, prec, emax);
  /* |Q| << s has its top bit at 126; the quotient then has >= 63 bits,
   * more than prec + 1, and the remainder is the sticky bit. */
  int s = 126 - (63 - bx_clz64(mag));
  bx_u128 n = (bx_u128)mag << s;
  bx_u128 q = n / (uint64_t)d;
  int sticky = n % (uint64_t)d != 0;
  return bx_tokred_round_bits(neg, q, sticky, e - s, prec, emax);
}

/* The same as a value, with a fast path: for |Q|, d < 2^53 the IEEE
 * quotient (double)Q / d is correctly rounded to double and the scaling by
 * step = 2^e is exact (the result stays far above fp64's subnormals:
 * e >= -200). fp64: that is the answer. fp32: rounding that double again
 * gives the correct fp32 unless it is exactly a midpoint between two fp32
 * numbers (every midpoint is a double, and rounding to double is
 * monotonic, so the exact value lies on the same side of every other
 * midpoint); midpoints, fp32 subnormal and overflow ranges take the exact
 * path. */
static inline BX_HD double bx_tokred_finish_f64(int64_t Q, int e, int64_t d, double step) {
  const int64_t lim = (int64_t)1 << 53;
  if (Q > -lim && Q < lim && d < lim) return (double)Q / (double)d * step;
  return bx_f64_from_bits(bx_tokred_finish_bits(Q, e, d, 53));
}

static inline BX_HD float bx_tokred_finish_f32(int64_t Q, int e, int64_t d, double step) {
  const int64_t lim = (int64_t)1 << 53;
  if (Q > -lim && Q < lim && d < lim) {
    double v = (double)Q / (double)d * step;
    uint64_t b = bx_f64_bits(v);
    uint64_t be = (b >> 52) & 0x7ff; /* fp32 normal range: 2^-126 <= |v| < 2^127 */
    if (v == 0.0 || (be >= 1023 - 126 && be < 1023 + 127 && (b & 0x1fffffffu) != 0x10000000u))
      return (float)v;
  }
  return bx_f32_from_bits((uint32_t)bx_tokred_finish_bits(Q, e, d, 24));
}

#endif /* BX_TOKRED_GRID_H */
