/*
 * test_ref.c — the MPFR reference checks itself where the hardware gives an
 * independent correctly rounded answer (IEEE conversions, +, *, sqrt), and
 * the test-side fp16/bf16 conversions against the reference. Every other
 * test trusts these two pieces.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "harness.h"
#include "mpfr_ref.h"
#include "tests.h"
#include "util.h"

void test_ref_decode_16bit(void) {
  /* bf16 is the top half of an fp32 */
  for (uint32_t b = 0; b < 65536; b++) {
    float f = bxt_bf16_to_f32((uint16_t)b);
    double d = ref_bf16_to_double((uint16_t)b);
    if (isnan(f)) {
      CHECK(isnan(d), "bf16 0x%04x should decode to NaN", b);
    } else if (!CHECK_BITS_D(d, (double)f, "bf16 0x%04x", b)) {
      break;
    }
    if (!isnan(d))
      CHECK(ref_encode(REF_BF16, d) == b, "bf16 0x%04x round trip", b);
  }
  /* fp16: known points, then strict monotonicity with the right spacing */
  static const struct {
    uint16_t b;
    double v;
  } known[] = {{0x0000, 0.0},          {0x8000, -0.0},       {0x0001, 0x1p-24},
               {0x03FF, 1023 * 0x1p-24}, {0x0400, 0x1p-14},    {0x3C00, 1.0},
               {0x3C01, 1 + 0x1p-10},   {0xC000, -2.0},       {0x7BFF, 65504.0},
               {0x7C00, INFINITY},      {0xFC00, -INFINITY},  {0x3555, 0x1.554p-2}};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    CHECK_BITS_D(ref_f16_to_double(known[i].b), known[i].v, "fp16 0x%04x", known[i].b);
  for (uint32_t b = 0; b < 0x7BFF; b++) {
    double lo = ref_f16_to_double((uint16_t)b), hi = ref_f16_to_double((uint16_t)(b + 1));
    double ulp = b < 0x0400 ? 0x1p-24 : ldexp(1.0, (int)(b >> 10) - 25);
    if (!CHECK(hi - lo == ulp, "fp16 spacing at 0x%04x: %a", b, hi - lo)) break;
  }
  for (uint32_t b = 0; b < 65536; b++) {
    double d = ref_f16_to_double((uint16_t)b);
    if (((b >> 10) & 31) == 31 && (b & 1023)) {
      CHECK(isnan(d), "fp16 0x%04x is NaN", b);
      continue;
    }
    CHECK(ref_encode(REF_F16, d) == b, "fp16 0x%04x round trip", b);
#ifdef __FLT16_MANT_DIG__
    _Float16 h;
    uint16_t hb = (uint16_t)b;
    memcpy(&h, &hb, 2);
    CHECK_BITS_D(d, (double)h, "fp16 0x%04x vs the compiler's _Float16", b);
#endif
  }
}

static double random_double(bxt_rng *r) {
  double d;
  uint64_t u;
  do {
    u = bxt_next(r);
    memcpy(&d, &u, 8);
  } while (!isfinite(d));
  return d;
}

/* A double with a random mantissa and an exponent in [lo, hi]. */
static double random_double_exp(bxt_rng *r, int lo, int hi) {
  double m = 1.0 + bxt_uniform(r);
  double d = ldexp(m, lo + (int)bxt_below(r, (uint64_t)(hi - lo + 1)));
  return (bxt_next(r) & 1) ? -d : d;
}

void test_ref_round_vs_hardware(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  mpfr_t s, a, b;
  mpfr_init2(s, 2200);
  mpfr_init2(a, 53);
  mpfr_init2(b, 53);
  for (int i = 0; i < 20000 && bxt_failures() < 10; i++) {
    /* conversions double -> float (IEEE: correctly rounded, subnormals) */
    double x = i % 2 ? random_double(&r) : random_double_exp(&r, -160, 130);
    CHECK_BITS_D(ref_double_to(REF_F32, x), (double)(float)x, "(float)%a", x);
    /* x + y in double: ties are frequent with close exponents */
    double y = random_double_exp(&r, -1074, 1023);
    if (i % 3 == 0) {
      int e;
      frexp(x, &e);
      y = random_double_exp(&r, e - 4, e + 2);
      if (e - 4 < -1074) y = x;
    }
    if (i % 7 == 0) {
      int e;
      frexp(x, &e);
      y = ldexp(1.0, e - 54); /* exactly half an ulp of x (for normal x) */
    }
    mpfr_set_d(a, x, MPFR_RNDN);
    mpfr_set_d(b, y, MPFR_RNDN);
    mpfr_add(s, a, b, MPFR_RNDN); /* exact at 2200 bits */
    CHECK_BITS_D(ref_round_d(s), x + y, "%a + %a", x, y);
    /* products: double * double, and float * float (exact in double) */
    double p = random_double_exp(&r, -600, 600), q = random_double_exp(&r, -600, 600);
    if (i % 5 == 0) q = random_double_exp(&r, -1074 + 100, -400); /* subnormal products */
    CHECK_BITS_D(ref_mul_round(p, q, REF_F64), p * q, "%a * %a", p, q);
    float fp = (float)random_double_exp(&r, -90, 90), fq = (float)random_double_exp(&r, -90, 90);
    CHECK_BITS_D(ref_mul_round(fp, fq, REF_F32), (double)(fp * fq), "%a * %a in fp32",
                 (double)fp, (double)fq);
    /* sqrt (IEEE: correctly rounded) of doubles and floats */
    double v = fabs(random_double(&r));
    mpfr_set_d(a, v, MPFR_RNDN);
    CHECK_BITS_D(ref_sqrt_d(a), sqrt(v), "sqrt(%a)", v);
    float fv = (float)fabs(random_double_exp(&r, -149, 127));
    mpfr_set_d(a, fv, MPFR_RNDN);
    CHECK_BITS_F(ref_sqrt_f(a), sqrtf(fv), "sqrtf(%a)", (double)fv);
  }
  /* float sums: a+b of two floats is exact in double; (float) rounds once */
  for (int i = 0; i < 20000 && bxt_failures() < 10; i++) {
    float fx = (float)random_double_exp(&r, -149, 127);
    float fy = (float)random_double_exp(&r, -149, 127);
    if (i % 2) {
      int e;
      frexp(fx, &e);
      fy = (float)ldexp(1.0, e - 25); /* half an ulp of fx */
    }
    double exact = (double)fx + (double)fy;
    if (fabs(exact) < 0x1p-125 && exact != (double)fx + (double)fy) continue;
    mpfr_set_d(a, fx, MPFR_RNDN);
    mpfr_set_d(b, fy, MPFR_RNDN);
    mpfr_add(s, a, b, MPFR_RNDN);
    double e2 = mpfr_get_d(s, MPFR_RNDN);
    if (e2 != exact) continue; /* not exact in double: skip this pair */
    CHECK_BITS_F(ref_round_f(s), (float)exact, "(float)(%a + %a)", (double)fx, (double)fy);
  }
  /* overflow edges */
  mpfr_set_d(a, DBL_MAX, MPFR_RNDN);
  mpfr_set_d(b, 0x1p970, MPFR_RNDN); /* DBL_MAX + half ulp: tie -> even -> Inf */
  mpfr_add(s, a, b, MPFR_RNDN);
  CHECK_BITS_D(ref_round_d(s), INFINITY, "DBL_MAX + half ulp rounds to Inf");
  mpfr_nextbelow(s);
  CHECK_BITS_D(ref_round_d(s), DBL_MAX, "just below the tie stays DBL_MAX");
  mpfr_set_ui_2exp(a, 1, -1075, MPFR_RNDN);
  CHECK_BITS_D(ref_round_d(a), 0.0, "2^-1075 ties to 0");
  mpfr_set_ui_2exp(b, 1, -1200, MPFR_RNDN);
  mpfr_add(s, a, b, MPFR_RNDN);
  CHECK_BITS_D(ref_round_d(s), 0x1p-1074, "2^-1075 + tiny rounds up");
  mpfr_set_ui_2exp(a, 3, -1075, MPFR_RNDN);
  CHECK_BITS_D(ref_round_d(a), 0x1p-1073, "1.5 * 2^-1074 ties to 2 * 2^-1074");
  mpfr_clear(s);
  mpfr_clear(a);
  mpfr_clear(b);
}

void test_ref_float_to_half_conversions(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int i = 0; i < 60000 && bxt_failures() < 10; i++) {
    uint32_t u;
    switch (i % 4) {
    case 0: /* any float */
      u = (uint32_t)bxt_next(&r);
      break;
    case 1: /* fp16's range, around its subnormals and overflow */
      u = (uint32_t)((bxt_below(&r, 50) + 127 - 27) << 23 | (bxt_next(&r) & 0x7FFFFF));
      break;
    case 2: /* exact fp16 ties: the 13 dropped bits are 1000...0 */
      u = (uint32_t)((bxt_below(&r, 45) + 127 - 26) << 23 | (bxt_next(&r) & 0x7FE000) | 0x1000);
      break;
    default: /* bf16 ties: the 16 dropped bits are 0x8000 */
      u = (uint32_t)((bxt_next(&r) & 0xFFFF0000u) | 0x8000u);
    }
    if (bxt_next(&r) & 1) u |= 0x80000000u;
    float f;
    memcpy(&f, &u, 4);
    if (isnan(f)) {
      CHECK(isnan(ref_f16_to_double(bxt_f32_to_f16(f))), "f16(NaN)");
      CHECK(isnan(ref_bf16_to_double(bxt_f32_to_bf16(f))), "bf16(NaN)");
      continue;
    }
    CHECK(bxt_f32_to_f16(f) == ref_encode(REF_F16, ref_double_to(REF_F16, f)),
          "fp16(%a): got 0x%04x", (double)f, bxt_f32_to_f16(f));
    CHECK(bxt_f32_to_bf16(f) == ref_encode(REF_BF16, ref_double_to(REF_BF16, f)),
          "bf16(%a): got 0x%04x", (double)f, bxt_f32_to_bf16(f));
  }
  CHECK(bxt_f32_to_f16(65520.0f) == 0x7C00, "65520 ties up to Inf in fp16");
  CHECK(bxt_f32_to_f16(65519.996f) == 0x7BFF, "just below stays 65504");
  CHECK(bxt_f32_to_f16(0x1p-25f) == 0x0000, "2^-25 ties to 0");
  CHECK(bxt_f32_to_f16(0x1.8p-24f) == 0x0002, "1.5 ulp ties to 2 ulp");
}

void test_ref_exactness(void) {
  ref_sum s;
  ref_sum_init(&s);
  double big[3] = {DBL_MAX, -DBL_MAX, 0x1p-1074};
  ref_add_squares(&s, REF_F64, big, 3);
  CHECK(s.count == 3 && s.nan_count == 0 && s.inf_count == 0, "counters");
  CHECK_BITS_D(ref_round_d(s.sum), INFINITY, "2 DBL_MAX^2 as a double");
  CHECK_BITS_D(ref_sqrt_d(s.sum), INFINITY, "sqrt(2) DBL_MAX overflows");
  ref_sum_clear(&s);
  ref_sum_init(&s);
  ref_add_squares(&s, REF_F64, big, 1);
  ref_add_squares(&s, REF_F64, big + 2, 1);
  CHECK_BITS_D(ref_sqrt_d(s.sum), DBL_MAX, "sqrt(DBL_MAX^2 + 2^-2148)");
  ref_sum_clear(&s);
  ref_sum_init(&s);
  ref_add_squares(&s, REF_F64, big + 2, 1);
  CHECK_BITS_D(ref_round_d(s.sum), 0.0, "2^-2148 as a double");
  CHECK_BITS_D(ref_sqrt_d(s.sum), 0x1p-1074, "sqrt(2^-2148)");
  CHECK_BITS_F(ref_sqrt_f(s.sum), 0.0f, "sqrtf(2^-2148)");
  ref_sum_clear(&s);
  /* sqrt ties: 2 (1+2^-52)... a tie of sqrt needs (2m+1)^2 2^(2q-2) */
  mpfr_t x;
  mpfr_init2(x, 200);
  mpfr_set_ui(x, (1ul << 24) + 1, MPFR_RNDN); /* 25 bits: a tie for p = 24 */
  mpfr_sqr(x, x, MPFR_RNDN);
  CHECK_BITS_F(ref_sqrt_f(x), 0x1p24f, "sqrtf tie at 2^24+1 -> 2^24 (even)");
  mpfr_set_ui(x, (1ul << 24) + 3, MPFR_RNDN);
  mpfr_sqr(x, x, MPFR_RNDN);
  CHECK_BITS_F(ref_sqrt_f(x), 0x1p24f + 4.0f, "sqrtf tie at 2^24+3 -> 2^24+4 (even)");
  mpfr_nextabove(x);
  CHECK_BITS_F(ref_sqrt_f(x), 0x1p24f + 4.0f, "just above the tie rounds up");
  mpfr_set_ui(x, (1ul << 24) + 1, MPFR_RNDN);
  mpfr_sqr(x, x, MPFR_RNDN);
  mpfr_nextabove(x);
  CHECK_BITS_F(ref_sqrt_f(x), 0x1p24f + 2.0f, "just above the even tie rounds up");
  mpfr_clear(x);
  CHECK(ref_inexact_events == 0, "the reference lost exactness %ld times",
        ref_inexact_events);
}
