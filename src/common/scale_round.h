/*
 * scale_round.h — the per-element scaling arithmetic of bx_scale_mode,
 * written once for the CPU kernels (src/cpu/portable_scale.c) and the CUDA
 * kernel (src/cuda/scale.cu). Bit-exact conversions written out, so
 * nothing depends on compiler half types; no FMA (callers compile with
 * -ffp-contract=off / nvcc --fmad=false).
 */
#ifndef BX_SCALE_ROUND_H
#define BX_SCALE_ROUND_H

#include <float.h>
#include <math.h>

#include "hd.h"
#include "nan_canon.h"

static inline BX_HD float bx_bf16_to_f32(uint16_t b) { return bx_f32_from_bits((uint32_t)b << 16); }

/* fp32 -> bf16, nearest-even; every NaN -> 0x7FC0 (as c10 does; nan_canon.h). */
static inline BX_HD uint16_t bx_f32_to_bf16(float f) {
  uint32_t u = bx_f32_bits(f);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return BX_BF16_CANON_NAN;
  u += 0x7FFF + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static inline BX_HD float bx_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  int e = (h >> 10) & 0x1F;
  uint32_t m = h & 0x3FF;
  if (e == 0x1F) return bx_f32_from_bits(sign | 0x7F800000 | (m << 13));
  if (e == 0) { /* subnormal: m * 2^-24, exact in fp32 */
    float v = (float)m * 5.9604644775390625e-08f; /* 2^-24 */
    return sign ? -v : v;
  }
  return bx_f32_from_bits(sign | ((uint32_t)(e + 112) << 23) | (m << 13));
}

/* fp32 -> fp16, nearest-even, subnormals and overflow to Inf; every NaN ->
 * the canonical 0x7E00 (nan_canon.h). */
static inline BX_HD uint16_t bx_f32_to_f16(float f) {
  uint32_t u = bx_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t a = u & 0x7FFFFFFF;
  if (a > 0x7F800000) return BX_F16_CANON_NAN;
  if (a >= 0x477FF000) return sign | 0x7C00; /* >= 65520: rounds to Inf */
  if (a < 0x38800000) { /* below 2^-14: fp16 subnormal or zero */
    if (a < 0x33000000) return sign; /* <= 2^-25 (half the smallest): 0 */
    int e = (int)(a >> 23);             /* biased fp32 exponent, 102..112 */
    uint32_t m = (a & 0x7FFFFF) | 0x800000;
    int shift = 126 - e;                /* value = m * 2^(e-150); want units of 2^-24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return sign | (uint16_t)q;
  }
  uint32_t q = a >> 13, rem = a & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
  return sign | (uint16_t)(q - (112u << 10));
}

/* The coefficient split so that a * hi and a * lo are exact in double for
 * any a with at most 24 significant bits (fp32, bf16, fp16 values):
 * hi keeps 29 significant bits, lo = c - hi the remaining <= 24. */
typedef struct bx_split_coef {
  double c, hi, lo;
} bx_split_coef;

static inline BX_HD bx_split_coef bx_split(double c) {
  bx_split_coef s = {c, c, 0.0};
  if (!isfinite(c)) return s;
  s.hi = bx_f64_from_bits(bx_f64_bits(c) & ~((1ull << 24) - 1));
  s.lo = copysign(c - s.hi, c); /* exact; signed like c so that 0 * c keeps its sign */
  return s;
}

/* Round-to-odd of the exact product a*c into a double: the correct input
 * to a second rounding at <= 51 bits (Boldo & Melquiond). p1 = a*hi and
 * p2 = a*lo are exact, |p2| < 2^-28 |p1|, so Fast2Sum gives p + err ==
 * a*c exactly. Products below 2^-151 in magnitude are returned as rounded
 * (they round to zero in fp32, bf16 and fp16 alike). No FMA needed, so the
 * loop vectorises in the portable build. */
static inline BX_HD double bx_mul_round_odd(double a, const bx_split_coef *k) {
  double p1 = a * k->hi, p2 = a * k->lo;
  double p = p1 + p2;
  double err = p2 - (p - p1);
  uint64_t b = bx_f64_bits(p);
  /* branch-free so that the loops vectorise */
  int fix = (err != 0.0) & !(b & 1) & (fabs(p) >= 0x1p-151) & (fabs(p) <= DBL_MAX);
  uint64_t step = ((err > 0) == (p > 0)) ? 1 : (uint64_t)-1; /* one ulp toward a*c */
  b += fix ? step : 0;
  p = bx_f64_from_bits(b);
  return fabs(p) <= DBL_MAX ? p : a * k->c; /* Inf/NaN: the plain product */
}

/* double -> float by round-to-odd (for a later rounding to bf16/fp16). */
static inline BX_HD float bx_f64_to_f32_odd(double d) {
  float f = (float)d;
  if (!isfinite(f) || (double)f == d) return f;
  uint32_t u = bx_f32_bits(f);
  if (u & 1) return f;
  u += (fabs(d) > fabs((double)f)) ? 1 : (uint32_t)-1;
  return bx_f32_from_bits(u);
}

/* ---- one element, per dtype and mode (bx_scale_mode in bitexact.h) ---- */
/* A NaN product (a NaN g, Inf * 0) is stored as the canonical NaN
 * (nan_canon.h); the 16-bit conversions above give it already. */
static inline BX_HD float bx_scale_f32_torch_one(float x, float c32) { return bx_canon_f32(x * c32); }
static inline BX_HD float bx_scale_f32_exact_one(float x, const bx_split_coef *k) {
  return bx_canon_f32((float)bx_mul_round_odd((double)x, k));
}
static inline BX_HD double bx_scale_f64_one(double x, double c) { return bx_canon_f64(x * c); }
static inline BX_HD uint16_t bx_scale_bf16_torch_one(uint16_t x, float c32) {
  return bx_f32_to_bf16(bx_bf16_to_f32(x) * c32);
}
static inline BX_HD uint16_t bx_scale_bf16_exact_one(uint16_t x, const bx_split_coef *k) {
  return bx_f32_to_bf16(bx_f64_to_f32_odd(bx_mul_round_odd((double)bx_bf16_to_f32(x), k)));
}
static inline BX_HD uint16_t bx_scale_f16_torch_one(uint16_t x, float c32) {
  return bx_f32_to_f16(bx_f16_to_f32(x) * c32);
}
static inline BX_HD uint16_t bx_scale_f16_exact_one(uint16_t x, const bx_split_coef *k) {
  return bx_f32_to_f16(bx_f64_to_f32_odd(bx_mul_round_odd((double)bx_f16_to_f32(x), k)));
}

#endif /* BX_SCALE_ROUND_H */
