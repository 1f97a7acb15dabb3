/*
 * test_scale.c — bx_scale bit for bit: BX_SCALE_TORCH against the formula
 * the header documents, BX_SCALE_EXACT against MPFR (see
 * bxt_check_scaled in checks.c); ties, subnormal results, special
 * coefficients, signed zeros, thread counts and dtype mixes.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "harness.h"
#include "tests.h"
#include "util.h"

static int g_strict_zero_sign = 0; /* see bxt_check_scaled */

static int check_scaled(const char *what, const bxt_tensor *before, const bxt_tensor *after,
                        double coef, bx_scale_mode mode) {
  return bxt_check_scaled(what, before, after, coef, mode, g_strict_zero_sign);
}

static int is_nan_bits(int dt, uint64_t b) { return isnan(ref_elem(dt, &b, 0)); }

/* Scales a copy of x with one bx_scale call under every ISA (the scaling
 * kernels follow bx_force_isa) and checks each. */
static void scale_and_check(const char *what, const bxt_tensor *x, double coef,
                            bx_scale_mode mode, int threads) {
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    bxt_force(isa);
    bxt_tensor y;
    bxt_tensor_clone(&y, x);
    bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
    o.mode = mode;
    o.num_threads = threads;
    char label[160];
    snprintf(label, sizeof label, "%s, isa %s", what, bxt_isa(isa));
    CHECK_STATUS(bx_scale(&y.t, 1, coef, &o), BX_OK, "%s: coef %a", label, coef);
    check_scaled(label, x, &y, coef, mode);
    bxt_tensor_free(&y);
  }
  bxt_force(-1);
}

static double random_coef(bxt_rng *r) {
  switch (bxt_below(r, 6)) {
  case 0:
    return bxt_uniform(r); /* a clip coefficient in [0, 1) */
  case 1:
    return exp(log(1e-12) + bxt_uniform(r) * (log(1e12) - log(1e-12)));
  case 2: { /* an fp32 value plus half an fp32 ulp: c32 ties */
    float f = (float)(0.01 + bxt_uniform(r));
    int e;
    frexp(f, &e);
    return (double)f + ldexp(1.0, e - 25);
  }
  case 3:
    return -(0.5 + bxt_uniform(r));
  case 4:
    return 1.0 + ldexp((double)(bxt_next(r) >> 11), -53 - (int)bxt_below(r, 30));
  default:
    return ldexp(1.0 + bxt_uniform(r), -140 + (int)bxt_below(r, 280)); /* under/overflow */
  }
}

static void random_scale_test(bx_scale_mode mode) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 120 && bxt_failures() < 10; rep++) {
    bxt_tensor x;
    bxt_tensor_alloc(&x, rep % REF_NDT, 1 + bxt_below(&r, 3000));
    if (rep % 4 == 3)
      bxt_fill_bits(&r, &x, 1); /* NaN, Inf, subnormals, everything */
    else
      bxt_fill_mixed(&r, &x);
    double coef = random_coef(&r);
    char what[64];
    snprintf(what, sizeof what, "rep %d", rep);
    scale_and_check(what, &x, coef, mode, 1 + (int)bxt_below(&r, 4));
    bxt_tensor_free(&x);
  }
}

void test_scale_torch_formula(void) {
  random_scale_test(BX_SCALE_TORCH);
  /* every fp16 and bf16 pattern at a few coefficients */
  static const double coefs[] = {0.5, 0.1, 0.3333333333333333, 0.999999, 1e-5, 0x1.000001p0};
  for (int dt = REF_F16; dt <= REF_BF16; dt++) {
    bxt_tensor x;
    bxt_tensor_alloc(&x, dt, 65536);
    for (uint32_t b = 0; b < 65536; b++) bxt_set_bits(&x, b, b);
    for (size_t c = 0; c < sizeof coefs / sizeof coefs[0]; c++)
      scale_and_check("all 16-bit patterns", &x, coefs[c], BX_SCALE_TORCH, 2);
    bxt_tensor_free(&x);
  }
}

void test_scale_exact_vs_mpfr(void) {
  random_scale_test(BX_SCALE_EXACT);
  static const double coefs[] = {0.5, 0.1, 0.3333333333333333, 0.999999, 1e-5, 0x1.000001p0,
                                 0x1.0000010000001p0};
  for (int dt = REF_F16; dt <= REF_BF16; dt++) {
    bxt_tensor x;
    bxt_tensor_alloc(&x, dt, 65536);
    for (uint32_t b = 0; b < 65536; b++) bxt_set_bits(&x, b, b);
    for (size_t c = 0; c < sizeof coefs / sizeof coefs[0]; c++)
      scale_and_check("all 16-bit patterns", &x, coefs[c], BX_SCALE_EXACT, 2);
    bxt_tensor_free(&x);
  }
  /* where exact-once and double rounding differ for fp32: g * coef just
   * above an fp32 tie, by less than fp64 can hold */
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor x;
  bxt_tensor_alloc(&x, REF_F32, 2000);
  for (int rep = 0; rep < 20; rep++) {
    float g = (float)(1.0 + bxt_uniform(&r));
    double target = (double)g * 0.75; /* then nudge to an fp32 midpoint */
    int e;
    frexp(target, &e);
    double tie = ldexp(floor(ldexp(target, 24 - e)) + 0.5, e - 24);
    double coef = tie / (double)g; /* g * coef = tie * (1 + d), |d| < 2^-53 */
    for (size_t i = 0; i < x.n; i++) bxt_set(&x, i, (i & 1 ? -1.0 : 1.0) * (double)g);
    scale_and_check("fp32 near-ties", &x, coef, BX_SCALE_EXACT, 1);
  }
  bxt_tensor_free(&x);
}

static uint64_t odd_mantissa(bxt_rng *r, int p) {
  /* odd, p bits, below 2^(p+1)/3 so that 3 M has exactly p + 1 bits */
  uint64_t lo = 1ull << (p - 1), hi = ((1ull << (p + 1)) - 1) / 3;
  return (lo + bxt_below(r, hi - lo)) | 1;
}

/* Exact ties: g = M 2^e with M odd and coef = 3 2^s, or g = 2^e and
 * coef = T 2^s with T odd of p + 1 bits: the product is exactly halfway
 * between two neighbours. Checked against MPFR and against the even
 * neighbour spelled out here. */
void test_scale_exact_ties(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int dt = 0; dt < REF_NDT; dt++) {
    int p = REF_FMT[dt].p;
    for (int rep = 0; rep < 200 && bxt_failures() < 10; rep++) {
      int construction = rep % 2;
      uint64_t M, T;
      int eg = (int)bxt_below(&r, 8) - 4 - (p - 1); /* g around 1 */
      int s = (int)bxt_below(&r, 6) - 3;
      double g, coef;
      if (construction == 0) {
        M = odd_mantissa(&r, p);
        g = ldexp((double)M, eg);
        coef = ldexp(3.0, s);
        T = 3 * M;
      } else {
        if (p + 1 > 53) continue; /* T would not fit a double coef */
        M = 1;
        g = ldexp(1.0, eg + p - 1);
        T = (1ull << p) | (bxt_next(&r) >> (64 - p)) | 1;
        coef = ldexp((double)T, s - p);
      }
      if (bxt_next(&r) & 1) g = -g;
      /* product = T 2^k: neighbours (T-1)/2 and (T+1)/2 at 2^(k+1); the even one */
      uint64_t lo = (T - 1) / 2, pick = (lo % 2 == 0) ? lo : lo + 1;
      double prod_k = construction == 0 ? eg + s : eg + p - 1 + s - p;
      double want = ldexp((double)pick, (int)prod_k + 1);
      if (g < 0) want = -want;
      bxt_tensor x;
      bxt_tensor_from(&x, dt, &g, 1);
      bxt_tensor y;
      for (int isa = 0; isa < bxt_isa_count(); isa++) {
        bxt_force(isa);
        bxt_tensor_clone(&y, &x);
        bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
        o.mode = BX_SCALE_EXACT;
        o.num_threads = 1;
        CHECK_STATUS(bx_scale(&y.t, 1, coef, &o), BX_OK, "tie");
        double got = bxt_get(&y, 0);
        CHECK_BITS_D(got, want, "%s tie: g=%a coef=%a (construction %d), isa %s",
                     bxt_dt_name(dt), g, coef, construction, bxt_isa(isa));
        bxt_tensor_free(&y);
      }
      bxt_force(-1);
      CHECK_BITS_D(want, ref_mul_round(g, coef, dt), "the reference agrees on the tie");
      /* one step either side of the tie in coef: rounds away from it */
      double up = nextafter(coef, INFINITY), down = nextafter(coef, 0.0);
      scale_and_check("just above a tie", &x, up, BX_SCALE_EXACT, 1);
      scale_and_check("just below a tie", &x, down, BX_SCALE_EXACT, 1);
      bxt_tensor_free(&x);
    }
  }
}

/* Products that land in (or below) the dtype's subnormal range, ties there
 * included, and the sign of zero results. */
void test_scale_exact_subnormal_results(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int dt = 0; dt < REF_NDT; dt++) {
    int emin = REF_FMT[dt].emin, p = REF_FMT[dt].p;
    bxt_tensor x;
    bxt_tensor_alloc(&x, dt, 4000);
    for (size_t i = 0; i < x.n; i++) {
      double g = ldexp(1.0 + bxt_uniform(&r), (int)bxt_below(&r, 8)); /* g in [1, 512) */
      if (i % 4 == 0) g = ldexp((double)(2 * bxt_below(&r, 1ull << (p - 2)) + 1), -(p - 1)); /* odd M */
      bxt_set(&x, i, (i & 1) ? -g : g);
    }
    for (int k = 0; k < 40; k++) {
      /* coef puts g * coef around 2^(emin + p - 1 - j) for j up to p + 2 */
      int j = (int)bxt_below(&r, (uint64_t)p + 3);
      double coef = ldexp(1.0 + (k % 3 == 0 ? 0.0 : bxt_uniform(&r)), emin + p - 1 - j - 4);
      if (k % 5 == 0) coef = ldexp(1.0, emin - 1 - (int)bxt_below(&r, 9)); /* ties at 2^(emin-1) */
      if (coef == 0) continue;
      char what[64];
      snprintf(what, sizeof what, "%s subnormal results", bxt_dt_name(dt));
      scale_and_check(what, &x, coef, BX_SCALE_EXACT, 2);
      scale_and_check(what, &x, coef, BX_SCALE_TORCH, 2);
    }
    bxt_tensor_free(&x);
  }
  /* exactly half the smallest subnormal: ties to (signed) zero; 3/2: to 2 */
  for (int k = 0; k < REF_NDT * bxt_isa_count(); k++) {
    int dt = k % REF_NDT;
    bxt_force(k / REF_NDT);
    double tiny = ldexp(1.0, REF_FMT[dt].emin);
    double g[4] = {tiny, -tiny, 3 * tiny, -3 * tiny};
    bxt_tensor x;
    bxt_tensor_from(&x, dt, g, 4);
    bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
    o.mode = BX_SCALE_EXACT;
    o.num_threads = 1;
    CHECK_STATUS(bx_scale(&x.t, 1, 0.5, &o), BX_OK, "halving");
    CHECK_BITS_D(bxt_get(&x, 0), 0.0, "%s: tiny/2 ties to +0", bxt_dt_name(dt));
    CHECK_BITS_D(bxt_get(&x, 1), -0.0, "%s: -tiny/2 ties to -0", bxt_dt_name(dt));
    CHECK_BITS_D(bxt_get(&x, 2), 2 * tiny, "%s: 1.5 tiny ties to 2 tiny", bxt_dt_name(dt));
    CHECK_BITS_D(bxt_get(&x, 3), -2 * tiny, "%s: -1.5 tiny ties to -2 tiny", bxt_dt_name(dt));
    bxt_tensor_free(&x);
  }
  bxt_force(-1);
}

void test_scale_special_coefs(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const double coefs[] = {1.0,     0.0,    -0.0,     -1.0,    INFINITY, -INFINITY,
                                 1e300,   1e-300, DBL_MAX,  0x1p-1074, 3.4028235677973366e38,
                                 FLT_MAX, 0x1p-149, 0x1.8p-150, 2.0};
  for (int dt = 0; dt < REF_NDT; dt++) {
    bxt_tensor x;
    bxt_tensor_alloc(&x, dt, 700);
    bxt_fill_bits(&r, &x, 1);
    bxt_set_bits(&x, 0, 0);                      /* +0 */
    bxt_set_bits(&x, 1, ref_encode(dt, -0.0));   /* -0 */
    bxt_set_bits(&x, 2, ref_encode(dt, INFINITY));
    bxt_set_bits(&x, 3, ref_encode(dt, NAN));
    for (size_t c = 0; c < sizeof coefs / sizeof coefs[0]; c++) {
      char what[64];
      snprintf(what, sizeof what, "%s, coef %a", bxt_dt_name(dt), coefs[c]);
      scale_and_check(what, &x, coefs[c], BX_SCALE_TORCH, 1);
      scale_and_check(what, &x, coefs[c], BX_SCALE_EXACT, 1);
    }
    /* coef 1 leaves every non-NaN element's bits as they were */
    bxt_tensor y;
    bxt_tensor_clone(&y, &x);
    for (int mode = 0; mode < 2; mode++) {
      bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
      o.mode = (bx_scale_mode)mode;
      o.num_threads = 2;
      CHECK_STATUS(bx_scale(&y.t, 1, 1.0, &o), BX_OK, "coef 1");
      for (size_t i = 0; i < x.n; i++)
        if (!is_nan_bits(dt, bxt_get_bits(&x, i)))
          if (!CHECK(bxt_get_bits(&y, i) == bxt_get_bits(&x, i), "%s coef 1 mode %d element %zu",
                     bxt_dt_name(dt), mode, i))
            break;
    }
    bxt_tensor_free(&y);
    bxt_tensor_free(&x);
  }
}

/* One call over many tensors of every dtype, large enough to be split
 * across threads: the same bits for 1, 2, 3 and 8 threads, both modes,
 * each element as the formula says. */
void test_scale_threads_and_mix(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  enum { N = 9 };
  bxt_tensor xs[N], ys[N];
  for (int k = 0; k < N; k++) {
    size_t len = k < 3 ? 300000 + bxt_below(&r, 300000) : bxt_below(&r, 20000);
    bxt_tensor_alloc(&xs[k], k % REF_NDT, len);
    bxt_fill_mixed(&r, &xs[k]);
  }
  static const int threads[] = {1, 2, 3, 8};
  for (int mode = 0; mode < 2; mode++) {
    double coef = mode ? 0.7310585786300049 : 0.123456789;
    for (int t = 0; t < 4; t++) {
      int isa = (t + mode) % bxt_isa_count();
      bxt_force(isa);
      DLTensor dl[N];
      for (int k = 0; k < N; k++) {
        bxt_tensor_clone(&ys[k], &xs[k]);
        dl[k] = ys[k].t;
      }
      bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
      o.mode = (bx_scale_mode)mode;
      o.num_threads = threads[t];
      CHECK_STATUS(bx_scale(dl, N, coef, &o), BX_OK, "mode %d, %d threads", mode, threads[t]);
      for (int k = 0; k < N; k++) {
        char what[64];
        snprintf(what, sizeof what, "tensor %d, %d threads, isa %s", k, threads[t], bxt_isa(isa));
        check_scaled(what, &xs[k], &ys[k], coef, (bx_scale_mode)mode);
        bxt_tensor_free(&ys[k]);
      }
      if (bxt_failures() > 10) break;
    }
  }
  bxt_force(-1);
  /* NULL options = BX_SCALE_OPTS_DEFAULT = torch mode */
  bxt_tensor y;
  bxt_tensor_clone(&y, &xs[1]);
  CHECK_STATUS(bx_scale(&y.t, 1, 0.3, NULL), BX_OK, "NULL opts");
  check_scaled("NULL opts", &xs[1], &y, 0.3, BX_SCALE_TORCH);
  bxt_tensor_free(&y);
  for (int k = 0; k < N; k++) bxt_tensor_free(&xs[k]);
}

/* IEEE sign rules for zero results: the sign of an exact zero product is
 * the XOR of the operands' signs, and a negative product that rounds to
 * zero is -0. Both modes, every dtype. */
void test_scale_signed_zeros(void) {
  static const double gs[] = {0.0, -0.0, 5.0, -5.0, 1.0, -1.0};
  static const double coefs[] = {-1.0, 1.0, -0.0, 0.0, 1e-300, -1e-300, 0.5, -0.5};
  g_strict_zero_sign = 1;
  for (int dt = 0; dt < REF_NDT; dt++) {
    double g[8];
    memcpy(g, gs, sizeof gs);
    g[6] = ldexp(1.0, REF_FMT[dt].emin);  /* halved: ties to +0 */
    g[7] = -ldexp(1.0, REF_FMT[dt].emin); /* halved: ties to -0 */
    bxt_tensor x;
    bxt_tensor_from(&x, dt, g, 8);
    for (size_t c = 0; c < sizeof coefs / sizeof coefs[0]; c++)
      for (int mode = 0; mode < 2; mode++) {
        char what[64];
        snprintf(what, sizeof what, "%s coef %a", bxt_dt_name(dt), coefs[c]);
        scale_and_check(what, &x, coefs[c], (bx_scale_mode)mode, 1);
      }
    bxt_tensor_free(&x);
  }
  g_strict_zero_sign = 0;
}

/* Near-ties: coef = fl64(T / g) for a midpoint T of the dtype, so that the
 * exact product g * coef is within 2^-53 relative of T. Rounding the
 * product to fp64 first (double rounding) lands exactly on T and picks the
 * even neighbour, where the exact-once result must follow the side the
 * exact product lies on. Normal and subnormal results, every dtype. */
void test_scale_exact_near_ties(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int dt = 0; dt < REF_NDT; dt++) {
    ref_fmt f = REF_FMT[dt];
    bxt_tensor x;
    bxt_tensor_alloc(&x, dt, 64);
    for (int rep = 0; rep < 120 && bxt_failures() < 10; rep++) {
      /* the ulp exponent of the result: from the subnormal range up */
      int sub = rep % 3 == 0;
      int ulp = sub ? f.emin : f.emin + (int)bxt_below(&r, (uint64_t)(f.emax - f.p - f.emin));
      /* k: p bits for a normal result; for a subnormal one any length
       * below p - 1, short ones included (results of a few ulps) */
      uint64_t k = sub ? bxt_below(&r, 1ull << bxt_below(&r, (uint64_t)f.p))
                       : (1ull << (f.p - 1)) + bxt_below(&r, 1ull << (f.p - 1));
      double tie = ldexp((double)k + 0.5, ulp); /* exact in double */
      /* g: a value of the dtype near 1 (so coef stays finite) */
      for (size_t i = 0; i < x.n; i++) {
        double g = ldexp(1.0 + bxt_uniform(&r), (int)bxt_below(&r, 4) - 2);
        g = ref_double_to(dt, g);
        double coef = tie / g;
        if (!isfinite(coef) || coef == 0) continue;
        bxt_set_bits(&x, i, ref_encode(dt, (i & 1) ? -g : g));
      }
      /* one coef per tensor: use the first element's */
      double g0 = fabs(bxt_get(&x, 0)), coef = tie / g0;
      if (!isfinite(coef) || coef == 0) continue;
      char what[96];
      snprintf(what, sizeof what, "%s near-tie at ulp 2^%d", bxt_dt_name(dt), ulp);
      scale_and_check(what, &x, coef, BX_SCALE_EXACT, 1);
      scale_and_check(what, &x, nextafter(coef, 0.0), BX_SCALE_EXACT, 1);
      scale_and_check(what, &x, nextafter(coef, INFINITY), BX_SCALE_EXACT, 1);
    }
    bxt_tensor_free(&x);
  }
}
