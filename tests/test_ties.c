/*
 * test_ties.c — sums landing exactly on a rounding tie, and one smallest
 * step either side: ties of the double and the float rounding of the sum
 * (both parities, normal and subnormal results, up to DBL_MAX + half an
 * ulp), ties of the square root (S = T^2 with T one bit longer than the
 * format), and ties of sums of |x|. Built from powers of two whose squares
 * add up to any chosen binary number (bxt_pow2_square_terms), in every
 * dtype whose range allows it, checked under every ISA.
 */
#include <math.h>
#include <stdio.h>

#include "checks.h"
#include "harness.h"
#include "tests.h"
#include "util.h"

/* Sums of squares landing exactly on a tie of the double (and float)
 * rounding, both parities, and one smallest step either side. */
void test_acc_ties_value(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  int pos[256];
  double v[512];
  for (int rep = 0; rep < 80 && bxt_failures() < 10; rep++) {
    int fmt_p = rep % 2 ? 24 : 53; /* a tie of the float or of the double rounding */
    int emin = fmt_p == 53 ? -1074 : -149, qmax = fmt_p == 53 ? 1024 - 53 : 128 - 24;
    static const int dts[4] = {REF_F64, REF_F32, REF_BF16, REF_F16};
    int dt = dts[(rep / 2) % 4];
    int lowest = dt == REF_F64 ? -2148 : dt == REF_F32 ? -298 : dt == REF_BF16 ? -266 : -48;
    int hi = dt == REF_F64 ? 2046 : dt == REF_F16 ? 30 : 254; /* largest square position */
    int subnormal = (rep / 8) % 3 == 2;                        /* result below the normal range */
    int qlo = emin > lowest + 45 ? emin : lowest + 45, qhi = qmax < hi - fmt_p - 1 ? qmax : hi - fmt_p - 1;
    if (subnormal) qlo = qhi = emin;
    if (qlo > qhi || qlo < lowest + 45) continue; /* this dtype cannot reach that tie */
    int q = qlo + (int)bxt_below(&r, (uint64_t)(qhi - qlo + 1)); /* S = M 2^q + 2^(q-1) */
    unsigned __int128 M = ((unsigned __int128)1 << (fmt_p - 1)) | (bxt_next(&r) >> (65 - fmt_p));
    if (subnormal) M = bxt_next(&r) >> (65 - fmt_p); /* M < 2^(p-1): a subnormal result */
    if (rep % 4 < 2) M |= 1; else M &= ~(unsigned __int128)1; /* both parities */
    unsigned __int128 T = M * 2 + 1;
    for (int side = -1; side <= 1; side++) {
      size_t npos = bxt_bit_positions(T, q - 1, pos);
      if (side == 1) pos[npos++] = lowest; /* tie + smallest square */
      if (side == -1) {                    /* tie - 2^(q-41): clear the tie bit, fill below */
        npos = bxt_bit_positions(T - 1, q - 1, pos); /* T-1 even: bit q-1 cleared */
        for (int b = q - 41 < lowest ? lowest : q - 41; b < q - 1; b++) pos[npos++] = b;
      }
      size_t n = bxt_pow2_square_terms(pos, npos, v);
      bxt_shuffle(&r, v, n, sizeof v[0]);
      char what[128];
      snprintf(what, sizeof what, "tie of p=%d at 2^%d (%s M, side %d) in %s", fmt_p, q,
               (M & 1) ? "odd" : "even", side, bxt_dt_name(dt));
      bxt_check_values(what, dt, v, n);
    }
  }
  /* the smallest: S = 2^-1075 (0 by ties-to-even) and 3 * 2^-1075 (2^-1073) */
  int p1[1] = {-1075};
  size_t n = bxt_pow2_square_terms(p1, 1, v);
  bxt_check_values("S = 2^-1075", REF_F64, v, n);
  int p3[2] = {-1075, -1074};
  n = bxt_pow2_square_terms(p3, 2, v);
  bxt_check_values("S = 3 * 2^-1075", REF_F64, v, n);
  /* the largest: DBL_MAX + half an ulp (ties to even -> Inf) and below */
  unsigned __int128 mx = ((unsigned __int128)1 << 54) - 1; /* (2^53-1) * 2 + 1 */
  size_t npos = bxt_bit_positions(mx, 970, pos);
  n = bxt_pow2_square_terms(pos, npos, v);
  bxt_check_values("S = DBL_MAX + half ulp", REF_F64, v, n);
  npos = bxt_bit_positions(mx - 1, 970, pos);
  n = bxt_pow2_square_terms(pos, npos, v);
  bxt_check_values("S = DBL_MAX", REF_F64, v, n);
}

/* S = T^2 with T = (2m+1) 2^(q-1) one bit longer than the format: the
 * square root is exactly halfway between two neighbours. */
void test_acc_ties_sqrt(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  int pos[300];
  double v[600];
  for (int rep = 0; rep < 60 && bxt_failures() < 10; rep++) {
    int fmt_p = rep % 2 ? 24 : 53;
    int dt = rep % 3 == 0 ? REF_F64 : rep % 3 == 1 ? REF_F32 : REF_BF16;
    if (fmt_p == 53 && dt != REF_F64) dt = REF_F64; /* 108-bit squares need fp64's range */
    /* odd T with fmt_p + 1 bits */
    unsigned __int128 T = ((unsigned __int128)1 << fmt_p) |
                          ((bxt_next(&r) >> (64 - fmt_p)) & (((unsigned __int128)1 << fmt_p) - 1)) | 1;
    unsigned __int128 S = T * T; /* < 2^108 */
    int lowest = dt == REF_F64 ? -2148 : dt == REF_F32 ? -298 : -266;
    int hi = dt == REF_F64 ? 2046 : 254;
    int width = 2 * fmt_p + 2;
    /* sqrt(S 2^shift) = T 2^(shift/2) must be a normal, finite result */
    int fmin_s = fmt_p == 53 ? -2150 : -300, fmax_s = fmt_p == 53 ? 1940 : 206;
    int lo_s = lowest + 61 > fmin_s ? lowest + 61 : fmin_s;
    int hi_s = hi - width < fmax_s ? hi - width : fmax_s;
    if (lo_s > hi_s) continue;
    int shift = lo_s + (int)bxt_below(&r, (uint64_t)(hi_s - lo_s + 1));
    shift &= ~1; /* even: the square root is T 2^(shift/2) */
    if (shift < lo_s) shift += 2;
    for (int side = -1; side <= 1; side++) {
      size_t npos = bxt_bit_positions(S, shift, pos);
      if (side == 1) pos[npos++] = shift - 60; /* just above the tie */
      if (side == -1) {                        /* just below: S - 2^(shift-60) */
        npos = bxt_bit_positions(S - 1, shift, pos);
        for (int b = shift - 60; b < shift; b++) pos[npos++] = b;
      }
      size_t n = bxt_pow2_square_terms(pos, npos, v);
      bxt_shuffle(&r, v, n, sizeof v[0]);
      char what[128];
      snprintf(what, sizeof what, "sqrt tie p=%d, S shift %d, side %d, %s", fmt_p, shift, side,
               bxt_dt_name(dt));
      bxt_check_values(what, dt, v, n);
    }
  }
}

/* Sums of |x| on ties: {1, 2^-53} is exactly halfway between 1 and 1+2^-52. */
void test_acc_ties_abs(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  double v[64];
  v[0] = 1.0;
  v[1] = 0x1p-53;
  bxt_check_values("1 + 2^-53 (tie, even below)", REF_F64, v, 2);
  v[0] = 0x1.0000000000001p0;
  bxt_check_values("1+2^-52 + 2^-53 (tie, even above)", REF_F64, v, 2);
  v[2] = 0x1p-1074;
  bxt_check_values("tie + smallest subnormal", REF_F64, v, 3);
  v[0] = 1.0;
  v[1] = 0x1p-24;
  bxt_check_values("fp32 tie 1 + 2^-24", REF_F32, v, 2);
  v[0] = 0x1.000002p0;
  bxt_check_values("fp32 tie 1+2^-23 + 2^-24", REF_F32, v, 2);
  /* random ties: x + y with y half an ulp of x (the double rounding) */
  for (int rep = 0; rep < 200 && bxt_failures() < 10; rep++) {
    int e = -1000 + (int)bxt_below(&r, 2000);
    double x = ldexp(1.0 + bxt_uniform(&r), e);
    v[0] = x;
    v[1] = ldexp(1.0, e - 53);
    v[2] = ldexp(1.0, e - 53 - 1 - (int)bxt_below(&r, 20)); /* sometimes: tie + tiny */
    bxt_check_values("random |x| tie", REF_F64, v, 2 + (rep & 1));
  }
}
