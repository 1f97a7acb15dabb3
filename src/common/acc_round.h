/*
 * acc_round.h — the single correct rounding of an accumulator's digits:
 * normalisation, the magnitude view, round-to-nearest-even into fp64/fp32
 * and the correctly rounded square root. Integer logic only (the one
 * floating-point step, the isqrt estimate, is corrected by integer steps).
 *
 * Shared by src/core/acc.c and the CUDA finishing kernel (src/cuda), so the
 * GPU rounds the same words to the same bits by construction.
 */
#ifndef BX_ACC_ROUND_H
#define BX_ACC_ROUND_H

#include <math.h>

#include "bitexact.h"
#include "hd.h"

#define BX_DIGIT_MASK 0xFFFFFFFFull

/* out = normalised digits of in (in may hold any int64 words; out may be
 * in); *lo_out, *end_out: the lower digits outside [lo, end) are 0 in out
 * (the top digit aside). Only the span of non-zero lower words and the
 * carries out of it are walked (a group's digits occupy a few of the 134
 * words): below the lowest non-zero word, and above the highest once the
 * carry is 0, every digit is 0 already. */
static inline BX_HD void bx_digits_normalize_span(int64_t *out, const int64_t *in, int *lo_out,
                                                  int *end_out) {
  const int top = BX_ACC_DIGITS - 1;
  int lo = 0, hi = top - 1;
  while (lo + 4 <= top && (in[lo] | in[lo + 1] | in[lo + 2] | in[lo + 3]) == 0) lo += 4;
  while (lo < top && in[lo] == 0) lo++;
  while (hi - 3 >= lo && (in[hi] | in[hi - 1] | in[hi - 2] | in[hi - 3]) == 0) hi -= 4;
  while (hi >= lo && in[hi] == 0) hi--;
  if (out != in)
    for (int i = 0; i < lo; i++) out[i] = 0;
  bx_i128 carry = 0;
  int i = lo;
  for (; i < top && (i <= hi || carry != 0); i++) {
    carry += in[i];
    out[i] = (int64_t)(carry & (bx_i128)BX_DIGIT_MASK);
    carry >>= 32; /* arithmetic: floor division, digits stay in [0,2^32) */
  }
  *lo_out = lo;
  *end_out = i;
  if (out != in)
    for (; i < top; i++) out[i] = 0; /* in[i] == 0 here: above hi */
  out[top] = (int64_t)(carry + in[top]);
}

static inline BX_HD void bx_digits_normalize(int64_t *out, const int64_t *in) {
  int lo, end;
  bx_digits_normalize_span(out, in, &lo, &end);
}

/* Magnitude view of a digit vector. */
typedef struct bx_mag {
  int64_t d[BX_ACC_DIGITS]; /* non-negative digits in [0,2^32), top may be larger */
  int negative;
  int top; /* index of the highest non-zero digit, -1 if zero */
} bx_mag;

/* The magnitude view of normalised digits (bx_digits_normalize's output;
 * may alias m->d). */
static inline BX_HD void bx_mag_from_normalized(const int64_t *digits, bx_mag *m);

static inline BX_HD void bx_mag_from_digits(const int64_t *digits, bx_mag *m) {
  bx_digits_normalize(m->d, digits);
  bx_mag_from_normalized(m->d, m);
}

static inline BX_HD void bx_mag_from_normalized(const int64_t *digits, bx_mag *m) {
  if (digits != m->d)
    for (int i = 0; i < BX_ACC_DIGITS; i++) m->d[i] = digits[i];
  m->negative = m->d[BX_ACC_DIGITS - 1] < 0;
  if (m->negative) { /* two's-complement negate over the digit vector */
    bx_i128 carry = 1;
    for (int i = 0; i < BX_ACC_DIGITS - 1; i++) {
      carry += (bx_i128)(~m->d[i] & (int64_t)BX_DIGIT_MASK);
      m->d[i] = (int64_t)(carry & (bx_i128)BX_DIGIT_MASK);
      carry >>= 32;
    }
    m->d[BX_ACC_DIGITS - 1] = (int64_t)(carry - 1 - m->d[BX_ACC_DIGITS - 1]);
  }
  m->top = -1;
  for (int i = BX_ACC_DIGITS - 1; i >= 0; i--)
    if (m->d[i] != 0) {
      m->top = i;
      break;
    }
}

static inline BX_HD int bx_bitlen128(bx_u128 w) {
  uint64_t hi = (uint64_t)(w >> 64);
  if (hi) return 128 - bx_clz64(hi);
  uint64_t lo = (uint64_t)w;
  return lo ? 64 - bx_clz64(lo) : 0;
}

/* Total bit length of the magnitude (position of its top bit + 1). */
static inline BX_HD int bx_mag_bitlen(const bx_mag *m) {
  if (m->top < 0) return 0;
  return 32 * m->top + bx_bitlen128((bx_u128)(uint64_t)m->d[m->top]);
}

/* Bits [lo, lo+127) of the magnitude as an integer, and whether any bit
 * below lo is set. lo may be negative (then the low end is zero-filled). */
static inline BX_HD bx_u128 bx_mag_bits(const bx_mag *m, int lo, int *sticky) {
  bx_u128 w = 0;
  *sticky = 0;
  for (int i = 0; i <= m->top; i++) {
    uint64_t dv = (uint64_t)m->d[i];
    int pos = 32 * i - lo; /* where this digit's bit 0 lands in w */
    if (pos >= 0) {
      if (pos < 128) w += (bx_u128)dv << pos;
    } else if (pos > -64) {
      if (dv & ((1ull << -pos) - 1)) *sticky = 1;
      w += (bx_u128)(dv >> -pos);
    } else if (dv) {
      *sticky = 1;
    }
  }
  return w;
}

/* A binary floating-point format: p significand bits, smallest ulp
 * exponent emin (subnormals), values below 2^emax are finite. */
typedef struct bx_fmt {
  int p, emin, emax;
} bx_fmt;
static inline BX_HD bx_fmt bx_fmt_f64(void) {
  bx_fmt f = {53, -1074, 1024};
  return f;
}
static inline BX_HD bx_fmt bx_fmt_f32(void) {
  bx_fmt f = {24, -149, 128};
  return f;
}

/* Round (w + f) * 2^e, 0 <= f < 1 with f > 0 iff sticky, to the format,
 * nearest-even. Returns the integer significand and sets *q (its ulp
 * exponent); *overflow when the result is >= 2^emax. */
static inline BX_HD uint64_t bx_round_to_fmt(bx_u128 w, int sticky, int e, bx_fmt f, int *q,
                                             int *overflow) {
  *overflow = 0;
  int len = bx_bitlen128(w);
  int ulp = e + len - f.p;
  if (ulp < f.emin) ulp = f.emin;
  int s = ulp - e;
  uint64_t mant;
  if (s <= 0) { /* already representable (sticky cannot occur: see callers) */
    mant = (uint64_t)(w << -s);
  } else if (s > len) { /* below half an ulp */
    mant = 0;
  } else {
    bx_u128 keep = s >= 128 ? 0 : w >> s;
    bx_u128 rem = w - (keep << s);
    bx_u128 half = (bx_u128)1 << (s - 1);
    mant = (uint64_t)keep;
    if (rem > half || (rem == half && (sticky || (mant & 1)))) mant++;
  }
  if (mant >> f.p) { /* carried into a new binade: 2^p */
    mant >>= 1;
    ulp++;
  }
  if (mant && ulp + bx_bitlen128(mant) > f.emax) *overflow = 1;
  *q = ulp;
  return mant;
}

/* The magnitude correctly rounded to the format (as a double; exact). */
static inline BX_HD double bx_mag_round(const bx_mag *m, bx_fmt f, int *overflow) {
  int len = bx_mag_bitlen(m);
  *overflow = 0;
  if (len == 0) return 0.0;
  int lo = len > 120 ? len - 120 : 0;
  int sticky;
  bx_u128 w = bx_mag_bits(m, lo, &sticky);
  int q;
  uint64_t mant = bx_round_to_fmt(w, sticky, lo + BX_ACC_LSB_EXP, f, &q, overflow);
  if (*overflow) return INFINITY;
  return ldexp((double)mant, q); /* exact: mant fits the format */
}

/* floor(sqrt(M)) for M < 2^127. */
static inline BX_HD uint64_t bx_isqrt128(bx_u128 M) {
  if (M == 0) return 0;
  /* estimate (error ~2^-52 relative), then exact integer corrections */
  double est = (double)(uint64_t)(M >> 64) * 18446744073709551616.0 + (double)(uint64_t)M;
  uint64_t s = (uint64_t)sqrt(est);
  if (s == 0) s = 1;
  s = (uint64_t)(((bx_u128)s + M / s) / 2); /* one Newton step */
  while ((bx_u128)s * s > M) s--;
  while ((bx_u128)(s + 1) * (s + 1) <= M) s++;
  return s;
}

/* Correctly rounded square root of the magnitude in the format. */
static inline BX_HD double bx_mag_sqrt(const bx_mag *m, bx_fmt f, int *overflow) {
  *overflow = 0;
  int len = bx_mag_bitlen(m);
  if (len == 0) return 0.0;
  /* sum = N * 2^LSB; take M = floor(N / 2^(2k)) with ~120 bits; then
   * floor(sqrt(N) / 2^k) = isqrt(M) exactly and the remainder tells
   * whether anything lies below. */
  int k = len > 120 ? (len - 120 + 1) / 2 : 0;
  int sticky;
  bx_u128 M = bx_mag_bits(m, 2 * k, &sticky);
  uint64_t r = bx_isqrt128(M);
  if ((bx_u128)r * r != M) sticky = 1;
  int q;
  uint64_t mant = bx_round_to_fmt(r, sticky, k + BX_ACC_LSB_EXP / 2, f, &q, overflow);
  if (*overflow) return INFINITY;
  return ldexp((double)mant, q);
}

#endif /* BX_ACC_ROUND_H */
