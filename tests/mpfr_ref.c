/*
 * mpfr_ref.c — exact reference sums, squares, products and correct
 * rounding, with MPFR. See mpfr_ref.h. Independent of src/ on purpose:
 * it must not share a bug with the library.
 */
#include "mpfr_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const ref_fmt REF_FMT[REF_NDT] = {
    {11, -24, 16},     /* fp16 */
    {8, -133, 128},    /* bf16 */
    {24, -149, 128},   /* fp32 */
    {53, -1074, 1024}, /* fp64 */
};

long ref_inexact_events;

static void must_be_exact(int ternary) {
  if (ternary != 0) ref_inexact_events++;
}

double ref_f16_to_double(uint16_t b) {
  int e = (b >> 10) & 31, m = b & 1023;
  double v;
  if (e == 31)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp((double)m, -24);
  else
    v = ldexp((double)(1024 + m), e - 25);
  return (b & 0x8000) ? -v : v;
}

double ref_bf16_to_double(uint16_t b) {
  int e = (b >> 7) & 255, m = b & 127;
  double v;
  if (e == 255)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp((double)m, -133);
  else
    v = ldexp((double)(128 + m), e - 134);
  return (b & 0x8000) ? -v : v;
}

double ref_elem(int dtype, const void *data, size_t i) {
  switch (dtype) {
  case REF_F16: {
    uint16_t b;
    memcpy(&b, (const char *)data + 2 * i, 2);
    return ref_f16_to_double(b);
  }
  case REF_BF16: {
    uint16_t b;
    memcpy(&b, (const char *)data + 2 * i, 2);
    return ref_bf16_to_double(b);
  }
  case REF_F32: {
    float f;
    memcpy(&f, (const char *)data + 4 * i, 4);
    return (double)f;
  }
  default: {
    double d;
    memcpy(&d, (const char *)data + 8 * i, 8);
    return d;
  }
  }
}

static uint16_t encode_f16(double v) {
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  if (isnan(v)) return 0x7E00;
  if (isinf(v)) return sign | 0x7C00;
  if (a == 0) return sign;
  int e;
  (void)frexp(a, &e); /* a in [2^(e-1), 2^e) */
  if (e - 1 > 15) {
    ref_inexact_events++;
    return sign | 0x7C00;
  }
  if (e - 1 >= -14) {
    double m = ldexp(a, 11 - e) - 1024; /* (a / 2^(e-1) - 1) * 1024 */
    if (m != floor(m)) ref_inexact_events++;
    return (uint16_t)(sign | ((e - 1 + 15) << 10) | (int)m);
  }
  double m = ldexp(a, 24);
  if (m != floor(m) || m >= 1024) ref_inexact_events++;
  return (uint16_t)(sign | (int)m);
}

uint64_t ref_encode(int dtype, double v) {
  switch (dtype) {
  case REF_F16:
    return encode_f16(v);
  case REF_BF16: {
    float f = (float)v;
    uint32_t u;
    if (isnan(v)) return 0x7FC0;
    memcpy(&u, &f, 4);
    if ((double)f != v || (u & 0xFFFF)) ref_inexact_events++;
    return u >> 16;
  }
  case REF_F32: {
    float f = (float)v;
    uint32_t u;
    if (isnan(v)) return 0x7FC00000u;
    if ((double)f != v) ref_inexact_events++;
    memcpy(&u, &f, 4);
    return u;
  }
  default: {
    uint64_t u;
    memcpy(&u, &v, 8);
    return u;
  }
  }
}

void ref_sum_init(ref_sum *s) {
  mpfr_init2(s->sum, REF_SUM_PREC);
  mpfr_set_zero(s->sum, 1);
  s->nan_count = s->inf_count = s->count = 0;
}

void ref_sum_clear(ref_sum *s) { mpfr_clear(s->sum); }

void ref_add_double(ref_sum *s, double v) {
  mpfr_t t;
  mpfr_init2(t, 64);
  must_be_exact(mpfr_set_d(t, v, MPFR_RNDN));
  must_be_exact(mpfr_add(s->sum, s->sum, t, MPFR_RNDN));
  mpfr_clear(t);
}

/* Working precision of a partial sum per dtype: enough for 2^64 terms of
 * the largest square (or |x|) down to the smallest one's last bit. */
static mpfr_prec_t part_prec(int dtype, int squares) {
  static const mpfr_prec_t sq[REF_NDT] = {200, 640, 640, REF_SUM_PREC};
  static const mpfr_prec_t ab[REF_NDT] = {160, 400, 400, REF_SUM_PREC};
  return squares ? sq[dtype] : ab[dtype];
}

/* term = x^2 or |x|, exactly. */
static void term_of(mpfr_t term, mpfr_t tmp, double x, int squares) {
  must_be_exact(mpfr_set_d(tmp, x, MPFR_RNDN));
  if (squares)
    must_be_exact(mpfr_sqr(term, tmp, MPFR_RNDN));
  else
    must_be_exact(mpfr_abs(term, tmp, MPFR_RNDN));
}

static void add_elems(ref_sum *s, int dtype, const void *data, size_t n,
                      int squares) {
  mpfr_t part, term, tmp;
  mpfr_init2(part, part_prec(dtype, squares));
  mpfr_init2(term, 128);
  mpfr_init2(tmp, 64);
  mpfr_set_zero(part, 1);
  s->count += (int64_t)n;
  if ((dtype == REF_F16 || dtype == REF_BF16) && n >= 4096) {
    /* histogram of the 2^16 bit patterns: count * x^2 is exact in 128 bits */
    uint64_t *hist = calloc(65536, sizeof *hist);
    for (size_t i = 0; i < n; i++) {
      uint16_t b;
      memcpy(&b, (const char *)data + 2 * i, 2);
      hist[b]++;
    }
    for (unsigned b = 0; b < 65536; b++) {
      if (!hist[b]) continue;
      double x = dtype == REF_F16 ? ref_f16_to_double((uint16_t)b)
                                  : ref_bf16_to_double((uint16_t)b);
      if (isnan(x)) {
        s->nan_count += (int64_t)hist[b];
        continue;
      }
      if (isinf(x)) {
        s->inf_count += (int64_t)hist[b];
        continue;
      }
      term_of(term, tmp, x, squares);
      must_be_exact(mpfr_mul_ui(term, term, (unsigned long)hist[b], MPFR_RNDN));
      must_be_exact(mpfr_add(part, part, term, MPFR_RNDN));
    }
    free(hist);
  } else {
    for (size_t i = 0; i < n; i++) {
      double x = ref_elem(dtype, data, i);
      if (isnan(x)) {
        s->nan_count++;
        continue;
      }
      if (isinf(x)) {
        s->inf_count++;
        continue;
      }
      if (x == 0) continue;
      term_of(term, tmp, x, squares);
      must_be_exact(mpfr_add(part, part, term, MPFR_RNDN));
    }
  }
  must_be_exact(mpfr_add(s->sum, s->sum, part, MPFR_RNDN));
  mpfr_clear(part);
  mpfr_clear(term);
  mpfr_clear(tmp);
}

void ref_add_squares(ref_sum *s, int dtype, const void *data, size_t n) {
  add_elems(s, dtype, data, n, 1);
}

void ref_add_abs(ref_sum *s, int dtype, const void *data, size_t n) {
  add_elems(s, dtype, data, n, 0);
}

/* The integer q = nearest-even integer to z (exact, z >= 0, z < 2^60).
 * Returned as a double (exact: callers keep q <= 2^54). */
static double round_int_even(const mpfr_t z) {
  mpfr_t n, frac;
  mpfr_init2(n, 128);
  mpfr_init2(frac, mpfr_get_prec(z) + 8);
  mpfr_floor(n, z); /* floor(z) < 2^60 fits: exact */
  must_be_exact(mpfr_sub(frac, z, n, MPFR_RNDN));
  int cmp = mpfr_cmp_d(frac, 0.5);
  double q = mpfr_get_d(n, MPFR_RNDN); /* exact, < 2^60 */
  if (cmp > 0 || (cmp == 0 && fmod(q, 2.0) != 0)) q += 1;
  mpfr_clear(n);
  mpfr_clear(frac);
  return q;
}

/* q * 2^ulp in the format, or Inf when it reaches 2^emax. */
static double assemble(double q, long ulp, ref_fmt f, int negative) {
  double r;
  if (q == 0) {
    r = 0.0;
  } else {
    int e;
    (void)frexp(q, &e); /* q in [2^(e-1), 2^e) */
    r = (ulp + e > f.emax) ? INFINITY : ldexp(q, (int)ulp);
  }
  return negative ? -r : r;
}

double ref_round_fmt(const mpfr_t x, ref_fmt f) {
  if (mpfr_nan_p(x)) return NAN;
  if (mpfr_inf_p(x)) return mpfr_sgn(x) > 0 ? INFINITY : -INFINITY;
  if (mpfr_zero_p(x)) return mpfr_signbit(x) ? -0.0 : 0.0;
  long E = (long)mpfr_get_exp(x); /* |x| in [2^(E-1), 2^E) */
  long ulp = E - f.p;
  if (ulp < f.emin) ulp = f.emin;
  mpfr_t z;
  mpfr_init2(z, mpfr_get_prec(x));
  must_be_exact(mpfr_abs(z, x, MPFR_RNDN));
  must_be_exact(mpfr_mul_2si(z, z, -ulp, MPFR_RNDN)); /* z < 2^p */
  double q = round_int_even(z);
  mpfr_clear(z);
  return assemble(q, ulp, f, mpfr_signbit(x) != 0);
}

double ref_sqrt_fmt(const mpfr_t x, ref_fmt f) {
  if (mpfr_nan_p(x) || mpfr_sgn(x) < 0) return NAN;
  if (mpfr_inf_p(x)) return INFINITY;
  if (mpfr_zero_p(x)) return 0.0;
  mpfr_t s0, y, t, n, mid;
  mpfr_init2(s0, 64);
  mpfr_sqrt(s0, x, MPFR_RNDZ); /* never crosses up into the next binade */
  long E = (long)mpfr_get_exp(s0);
  long ulp = E - f.p;
  if (ulp < f.emin) ulp = f.emin;
  /* y = x / 2^(2 ulp): sqrt(y) = sqrt(x) / 2^ulp < 2^(p+1) */
  mpfr_init2(y, mpfr_get_prec(x));
  must_be_exact(mpfr_mul_2si(y, x, -2 * ulp, MPFR_RNDN));
  mpfr_init2(t, 128);
  mpfr_sqrt(t, y, MPFR_RNDZ); /* integers < 2^128 survive RNDZ */
  mpfr_init2(n, 128);
  mpfr_floor(n, t); /* = floor(sqrt(y)) */
  /* compare y with (n + 1/2)^2 = n^2 + n + 1/4 */
  mpfr_init2(mid, 256);
  must_be_exact(mpfr_sqr(mid, n, MPFR_RNDN));
  must_be_exact(mpfr_add(mid, mid, n, MPFR_RNDN));
  must_be_exact(mpfr_add_d(mid, mid, 0.25, MPFR_RNDN));
  int cmp = mpfr_cmp(y, mid);
  double q = mpfr_get_d(n, MPFR_RNDN);
  if (cmp > 0 || (cmp == 0 && fmod(q, 2.0) != 0)) q += 1;
  mpfr_clear(s0);
  mpfr_clear(y);
  mpfr_clear(t);
  mpfr_clear(n);
  mpfr_clear(mid);
  return assemble(q, ulp, f, 0);
}

double ref_round_d(const mpfr_t x) { return ref_round_fmt(x, REF_FMT[REF_F64]); }
float ref_round_f(const mpfr_t x) {
  return (float)ref_round_fmt(x, REF_FMT[REF_F32]); /* exact conversion */
}
double ref_sqrt_d(const mpfr_t x) { return ref_sqrt_fmt(x, REF_FMT[REF_F64]); }
float ref_sqrt_f(const mpfr_t x) {
  return (float)ref_sqrt_fmt(x, REF_FMT[REF_F32]);
}

double ref_mul_round(double a, double b, int dtype) {
  mpfr_t A, B, P;
  mpfr_init2(A, 53);
  mpfr_init2(B, 53);
  mpfr_init2(P, 106);
  mpfr_set_d(A, a, MPFR_RNDN);
  mpfr_set_d(B, b, MPFR_RNDN);
  mpfr_mul(P, A, B, MPFR_RNDN); /* exact (or NaN/Inf by IEEE rules) */
  double r = ref_round_fmt(P, REF_FMT[dtype]);
  mpfr_clear(A);
  mpfr_clear(B);
  mpfr_clear(P);
  return r;
}

double ref_double_to(int dtype, double v) {
  mpfr_t x;
  mpfr_init2(x, 53);
  mpfr_set_d(x, v, MPFR_RNDN);
  double r = ref_round_fmt(x, REF_FMT[dtype]);
  mpfr_clear(x);
  return r;
}

void ref_acc_words_value(mpfr_t out, const int64_t *digit, int ndigits,
                         int lsb_exp) {
  mpfr_t t;
  mpfr_init2(t, 64);
  mpfr_set_zero(out, 1);
  for (int i = 0; i < ndigits; i++) {
    if (!digit[i]) continue;
    must_be_exact(mpfr_set_si_2exp(t, (long)digit[i], 32 * i + lsb_exp,
                                   MPFR_RNDN));
    must_be_exact(mpfr_add(out, out, t, MPFR_RNDN));
  }
  mpfr_clear(t);
}
