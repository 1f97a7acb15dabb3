/*
 * test_norm.c — bx_total_norm against the reference: p = 2 and 1 exact
 * (correctly rounded), p = inf / -inf / 0 exact, other p deterministic and
 * close to the exact value; per-group norms; the NaN/Inf rules;
 * error_if_nonfinite naming the first offending tensor and writing
 * nothing; the Megatron-LM fp32 flavour against its definition; empty
 * inputs; NULL options; comm.
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

#define SENTINEL -12345.678

static bx_norm_opts opts_p(double p, int threads) {
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.norm_type = p;
  o.num_threads = threads;
  return o;
}

static size_t elements(bxt_tensor *const *xs, size_t n) {
  size_t e = 0;
  for (size_t k = 0; k < n; k++) e += xs[k]->n;
  return e;
}

/* Total and per-group norms of a layout against the reference. */
static void check_layout_norms(const char *what, bxt_layout *l, double p, int threads) {
  bx_norm_opts o = opts_p(p, threads);
  double total = SENTINEL, gn[BXT_MAX_GROUPS];
  for (size_t g = 0; g < BXT_MAX_GROUPS; g++) gn[g] = SENTINEL;
  bx_status st = bx_total_norm(l->groups, l->ngroups, NULL, &o, &total, gn);
  if (!CHECK_STATUS(st, BX_OK, "%s: p=%g", what, p)) return;
  /* p = -inf over no elements at all is left unspecified by the header
   * (min of an empty set): not compared */
  if (p != -INFINITY || elements(l->src, l->n))
    CHECK_BITS_D(total, bxt_ref_norm(l->src, l->n, p), "%s: total, p=%g, %d threads", what, p,
                 threads);
  for (size_t g = 0; g < l->ngroups; g++) {
    size_t first = bxt_layout_first(l, g);
    if (p == -INFINITY && !elements(l->src + first, l->groups[g].count)) continue;
    double want = bxt_ref_norm(l->src + first, l->groups[g].count, p);
    CHECK_BITS_D(gn[g], want, "%s: group %zu of %zu (%zu tensors), p=%g", what, g, l->ngroups,
                 l->groups[g].count, p);
  }
  CHECK_BITS_D(gn[l->ngroups], SENTINEL, "%s: nothing written past group_norms[ngroups]", what);
}

static void exact_p_test(double p, int reps) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < reps && bxt_failures() < 10; rep++) {
    bxt_tensor xs[16];
    size_t n = 1 + bxt_below(&r, 16);
    bxt_tensors_random(&r, xs, n, 20000);
    bxt_layout l;
    bxt_layout_random(&r, &l, xs, n, 1 + bxt_below(&r, 5), p == -INFINITY);
    char what[64];
    snprintf(what, sizeof what, "rep %d (%zu tensors, %zu groups)", rep, n, l.ngroups);
    check_layout_norms(what, &l, p, (int)bxt_below(&r, 5));
    bxt_tensors_free(xs, n);
  }
}

void test_norm_p2_groups(void) { exact_p_test(2.0, 25); }
void test_norm_p1(void) { exact_p_test(1.0, 25); }

void test_norm_pinf_and_neginf(void) {
  exact_p_test(INFINITY, 15);
  exact_p_test(-INFINITY, 15);
  /* hand-made: max and min of |x| across dtypes, signed zeros, subnormals */
  double a[] = {-3.5, 0x1p-1074, 2.0, -0.0};
  float b[] = {-7.0f, 0x1p-149f, 1.0f};
  bxt_tensor xs[2];
  bxt_tensor_from(&xs[0], REF_F64, a, 4);
  bxt_tensor_from(&xs[1], REF_F32, (double[]){b[0], b[1], b[2]}, 3);
  bx_group g = {NULL, 2};
  DLTensor dl[2] = {xs[0].t, xs[1].t};
  g.tensors = dl;
  bx_norm_opts o = opts_p(INFINITY, 1);
  double v = SENTINEL;
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &v, NULL), BX_OK, "p=inf");
  CHECK_BITS_D(v, 7.0, "max |x|");
  o.norm_type = -INFINITY;
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &v, NULL), BX_OK, "p=-inf");
  CHECK_BITS_D(v, 0.0, "min |x| is |-0| = +0");
  bxt_set_bits(&xs[0], 3, ref_encode(REF_F64, 5.0));
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &v, NULL), BX_OK, "p=-inf");
  CHECK_BITS_D(v, 0x1p-1074, "min |x| is the fp64 subnormal");
  bxt_tensors_free(xs, 2);
}

void test_norm_p0(void) {
  exact_p_test(0.0, 15);
  /* zeros of both signs are zero; subnormals and Inf are non-zero */
  double a[] = {0.0, -0.0, 0x1p-1074, -INFINITY, 1.0, 0.0};
  bxt_tensor x;
  bxt_tensor_from(&x, REF_F64, a, 6);
  bx_group g = {&x.t, 1};
  bx_norm_opts o = opts_p(0.0, 1);
  double v = SENTINEL;
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &v, NULL), BX_OK, "p=0");
  CHECK_BITS_D(v, 3.0, "non-zeros: subnormal, -Inf, 1");
  bxt_tensor_free(&x);
}

/* Other p: |x|^p in fp64 then an exact sum, "deterministic on a platform,
 * not exact". Checked two ways: (1) the same bits for every thread count,
 * ISA, tensor order and grouping (bitwise); (2) close to the exact p-norm:
 * each |x|^p is within ~1 ulp (glibc pow), the sum is exact, then one
 * rounding and a p-th root (a few ulps), so the relative error is a few
 * 1e-16 times (1 + 1/p); 1e-12 leaves a wide margin while still catching a
 * wrong formula. Data stay in [1e-6, 1e3] so no |x|^p underflows. */
void test_norm_other_p(void) {
  static const double ps[] = {3.0, 0.5, 1.5, 4.0, 0.25, 2.5, 7.0};
  bxt_rng r;
  bxt_rng_init(&r);
  mpfr_t acc, t, e;
  mpfr_init2(acc, 256);
  mpfr_init2(t, 256);
  mpfr_init2(e, 256);
  for (size_t pi = 0; pi < sizeof ps / sizeof ps[0] && bxt_failures() < 10; pi++) {
    double p = ps[pi];
    bxt_tensor xs[8];
    size_t n = 2 + bxt_below(&r, 7);
    for (size_t k = 0; k < n; k++) {
      bxt_tensor_alloc(&xs[k], (int)bxt_below(&r, REF_NDT), 1 + bxt_below(&r, 9000));
      for (size_t i = 0; i < xs[k].n; i++) {
        double v = exp(log(1e-6) + bxt_uniform(&r) * (log(1e3) - log(1e-6)));
        bxt_set(&xs[k], i, (bxt_next(&r) & 1) ? -v : v);
      }
    }
    bxt_layout l;
    bxt_layout_single(&l, xs, n);
    bx_norm_opts o = opts_p(p, 1);
    double base = SENTINEL;
    bxt_force(0);
    CHECK_STATUS(bx_total_norm(l.groups, 1, NULL, &o, &base, NULL), BX_OK, "p=%g", p);
    static const int threads[] = {1, 2, 3, 8};
    for (int v = 0; v < 12; v++) {
      bxt_layout lv;
      bxt_layout_random(&r, &lv, xs, n, 1 + bxt_below(&r, 4), 0);
      int isa = (int)bxt_below(&r, (uint64_t)bxt_isa_count());
      bxt_force(isa);
      o.num_threads = threads[v % 4];
      double got = SENTINEL;
      CHECK_STATUS(bx_total_norm(lv.groups, lv.ngroups, NULL, &o, &got, NULL), BX_OK, "p=%g", p);
      CHECK_BITS_D(got, base, "p=%g: variant %d (isa %s, %d threads, %zu groups) differs", p, v,
                   bxt_isa(isa), o.num_threads, lv.ngroups);
    }
    bxt_force(-1);
    /* accuracy against (sum |x|^p)^(1/p) in 256-bit MPFR */
    mpfr_set_zero(acc, 1);
    for (size_t k = 0; k < n; k++)
      for (size_t i = 0; i < xs[k].n; i++) {
        mpfr_set_d(t, fabs(bxt_get(&xs[k], i)), MPFR_RNDN);
        mpfr_set_d(e, p, MPFR_RNDN);
        mpfr_pow(t, t, e, MPFR_RNDN);
        mpfr_add(acc, acc, t, MPFR_RNDN);
      }
    mpfr_set_d(e, p, MPFR_RNDN);
    mpfr_ui_div(e, 1, e, MPFR_RNDN);
    mpfr_pow(acc, acc, e, MPFR_RNDN);
    double exact = mpfr_get_d(acc, MPFR_RNDN);
    CHECK(fabs(base - exact) <= 1e-12 * exact, "p=%g: %.17g vs exact %.17g (rel %.3g)", p, base,
          exact, fabs(base - exact) / exact);
    bxt_tensors_free(xs, n);
  }
  mpfr_clear(acc);
  mpfr_clear(t);
  mpfr_clear(e);
}

/* NaN anywhere -> NaN; otherwise any ±Inf -> +Inf for p > 0; p = 0 counts
 * NaN and Inf as non-zero (a finite count, as torch); p = -inf takes min
 * |x| with Inf as a value. Per group
 * too: a group without non-finite elements keeps its finite norm. */
void test_norm_nan_inf_rules(void) {
  static const double ps[] = {2.0, 1.0, INFINITY, 3.0, 0.5, 0.0, -INFINITY};
  bxt_rng r;
  bxt_rng_init(&r);
  for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
    double p = ps[pi];
    for (int kind = 0; kind < 4; kind++) { /* NaN, +Inf, -Inf, NaN and Inf */
      bxt_tensor xs[6];
      for (size_t k = 0; k < 6; k++) {
        bxt_tensor_alloc(&xs[k], (int)(k % REF_NDT), 50 + 100 * k);
        bxt_fill_gradient(&r, &xs[k], 1.0);
      }
      /* tensors 0-2 in group 0, 3-5 in group 1: the bad values go in group 1 */
      bxt_tensor *bad = &xs[4];
      size_t i = bxt_below(&r, bad->n);
      double v = kind == 0 ? NAN : kind == 2 ? -INFINITY : INFINITY;
      bxt_set_bits(bad, i, ref_encode(bad->dt, v));
      if (kind == 3) bxt_set_bits(&xs[5], 3, ref_encode(xs[5].dt, NAN));
      DLTensor dl[6];
      for (size_t k = 0; k < 6; k++) dl[k] = xs[k].t;
      bx_group g[2] = {{dl, 3}, {dl + 3, 3}};
      bx_norm_opts o = opts_p(p, 2);
      double total = SENTINEL, gn[2] = {SENTINEL, SENTINEL};
      CHECK_STATUS(bx_total_norm(g, 2, NULL, &o, &total, gn), BX_OK, "p=%g kind %d", p, kind);
      bxt_tensor *ptrs[6] = {&xs[0], &xs[1], &xs[2], &xs[3], &xs[4], &xs[5]};
      double want_total = bxt_ref_norm(ptrs, 6, p), want_g0 = bxt_ref_norm(ptrs, 3, p),
             want_g1 = bxt_ref_norm(ptrs + 3, 3, p);
      /* spell the rules out (independently of bxt_ref_norm's code) */
      if (p == 0)
        CHECK(isfinite(total) && isfinite(gn[1]) && gn[1] >= 1,
              "p=0: NaN and Inf count as non-zero, the count stays finite (%g, %g)", total, gn[1]);
      else if (kind == 0 || kind == 3)
        CHECK(isnan(total) && isnan(gn[1]), "p=%g: NaN gives NaN (%g, %g)", p, total, gn[1]);
      else if (p > 0)
        CHECK(total == INFINITY && gn[1] == INFINITY, "p=%g: Inf gives +Inf (%g, %g)", p, total,
              gn[1]);
      CHECK(isfinite(gn[0]), "p=%g: group 0 has no non-finite values: %g", p, gn[0]);
      if (isnan(want_total))
        CHECK(isnan(total), "p=%g kind %d: total %g want NaN", p, kind, total);
      else
        CHECK_BITS_D(total, want_total, "p=%g kind %d: total", p, kind);
      if (p == 2 || p == 1 || p == 0 || isinf(p)) CHECK_BITS_D(gn[0], want_g0, "p=%g: group 0", p);
      if (isnan(want_g1))
        CHECK(isnan(gn[1]), "p=%g kind %d: group 1 %g want NaN", p, kind, gn[1]);
      else
        CHECK_BITS_D(gn[1], want_g1, "p=%g kind %d: group 1", p, kind);
      bxt_tensors_free(xs, 6);
    }
  }
}

void test_norm_error_if_nonfinite(void) {
  static const double ps[] = {2.0, 1.0, INFINITY, -INFINITY, 0.0, 3.0};
  bxt_rng r;
  bxt_rng_init(&r);
  for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++)
    for (int kind = 0; kind < 3; kind++) {
      /* groups: {0,1,2}, {3,4,5,6}, {7}; first offender: group 1, tensor 2
       * (dl[5]); later ones in group 1 tensor 3 and group 2 tensor 0 */
      bxt_tensor xs[8];
      for (size_t k = 0; k < 8; k++) {
        bxt_tensor_alloc(&xs[k], (int)((k + pi) % REF_NDT), 3000 + 7 * k);
        bxt_fill_gradient(&r, &xs[k], 0.1);
      }
      double v = kind == 0 ? NAN : kind == 1 ? INFINITY : -INFINITY;
      bxt_set_bits(&xs[5], 2999, ref_encode(xs[5].dt, v)); /* the last element */
      bxt_set_bits(&xs[6], 0, ref_encode(xs[6].dt, NAN));
      bxt_set_bits(&xs[7], 10, ref_encode(xs[7].dt, INFINITY));
      DLTensor dl[8];
      for (size_t k = 0; k < 8; k++) dl[k] = xs[k].t;
      bx_group g[3] = {{dl, 3}, {dl + 3, 4}, {dl + 7, 1}};
      bx_norm_opts o = opts_p(ps[pi], 3);
      o.error_if_nonfinite = 1;
      double total = SENTINEL, gn[3] = {SENTINEL, SENTINEL, SENTINEL};
      if (ps[pi] == 0.0) {
        /* torch's rule: the call fails exactly when the total is non-finite,
         * and a count of non-zeros (NaN and Inf included) never is */
        CHECK_STATUS(bx_total_norm(g, 3, NULL, &o, &total, gn), BX_OK, "p=0 kind %d", kind);
        bxt_tensor *ptrs[8];
        for (size_t k = 0; k < 8; k++) ptrs[k] = &xs[k];
        CHECK_BITS_D(total, bxt_ref_norm(ptrs, 8, 0.0), "p=0 kind %d: the count", kind);
        bxt_tensors_free(xs, 8);
        continue;
      }
      CHECK_STATUS(bx_total_norm(g, 3, NULL, &o, &total, gn), BX_ENONFINITE, "p=%g kind %d",
                   ps[pi], kind);
      const char *msg = bx_last_error();
      CHECK(bxt_mentions(msg, "group", 1) && bxt_mentions(msg, "tensor", 2),
            "p=%g: the message names group 1, tensor 2: \"%s\"", ps[pi], msg);
      CHECK_BITS_D(total, SENTINEL, "total_norm untouched on error");
      for (int k = 0; k < 3; k++) CHECK_BITS_D(gn[k], SENTINEL, "group_norms[%d] untouched", k);
      /* without the offenders it succeeds */
      bxt_set_bits(&xs[5], 2999, ref_encode(xs[5].dt, 1.0));
      bxt_set_bits(&xs[6], 0, ref_encode(xs[6].dt, 1.0));
      bxt_set_bits(&xs[7], 10, ref_encode(xs[7].dt, 1.0));
      CHECK_STATUS(bx_total_norm(g, 3, NULL, &o, &total, gn), BX_OK, "all finite");
      bxt_tensors_free(xs, 8);
    }
}

static double megatron_of(bxt_layout *l, int threads, bx_status *st) {
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.flavor = BX_MEGATRON_FP32;
  o.num_threads = threads;
  double v = SENTINEL;
  *st = bx_total_norm(l->groups, l->ngroups, NULL, &o, &v, NULL);
  return v;
}

void test_norm_megatron(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 25 && bxt_failures() < 10; rep++) {
    bxt_tensor xs[10];
    size_t n = 1 + bxt_below(&r, 10);
    for (size_t k = 0; k < n; k++) {
      bxt_tensor_alloc(&xs[k], (int)bxt_below(&r, REF_NDT), bxt_below(&r, 6000));
      double sigma = pow(10.0, -20.0 + 30.0 * bxt_uniform(&r)); /* squares may under/overflow */
      if (rep % 3 == 0) sigma = pow(10.0, -3.0 + 3.0 * bxt_uniform(&r));
      bxt_fill_gradient(&r, &xs[k], sigma);
      if (xs[k].dt == REF_F16 || xs[k].dt == REF_BF16) bxt_fill_mixed(&r, &xs[k]);
    }
    bxt_layout l;
    bxt_layout_random(&r, &l, xs, n, 1 + bxt_below(&r, 3), 0);
    double want = bxt_ref_megatron(l.src, l.n);
    bx_status st;
    for (int isa = 0; isa < bxt_isa_count(); isa++) {
      bxt_force(isa);
      double got = megatron_of(&l, 1 + (int)bxt_below(&r, 4), &st);
      CHECK_STATUS(st, BX_OK, "rep %d", rep);
      if (isnan(want))
        CHECK(isnan(got), "rep %d isa %s: want NaN, got %a", rep, bxt_isa(isa), got);
      else
        CHECK_BITS_D(got, want, "rep %d isa %s: Megatron fp32 norm of %zu tensors", rep,
                     bxt_isa(isa), n);
      CHECK(isnan(got) || (double)(float)got == got, "rep %d: the result is an fp32 value", rep);
    }
    bxt_force(-1);
    bxt_tensors_free(xs, n);
  }
  /* the flavour is defined for p = 2 only */
  bxt_tensor x;
  double one = 1.0;
  bxt_tensor_from(&x, REF_F32, &one, 1);
  bx_group g = {&x.t, 1};
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.flavor = BX_MEGATRON_FP32;
  o.norm_type = 1.0;
  double v = SENTINEL;
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &v, NULL), BX_EINVAL,
               "Megatron flavour with p = 1 (the header: p = 2 only)");
  CHECK_BITS_D(v, SENTINEL, "untouched");
  o.flavor = (bx_norm_flavor)7;
  o.norm_type = 2.0;
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &v, NULL), BX_EINVAL, "unknown flavour 7");
  bxt_tensor_free(&x);
}

/* Where the Megatron flavour differs from the exact norm: fp32 squares that
 * overflow or underflow, fp64 elements outside fp32, an fp32 sum that
 * overflows. */
void test_norm_megatron_overflow(void) {
  struct {
    int dt;
    double v;
    size_t n;
    const char *what;
  } cases[] = {
      {REF_F32, 1e20, 3, "fp32 1e20: square overflows fp32"},
      {REF_F64, 1e300, 1, "fp64 1e300: Inf as fp32"},
      {REF_F64, 3.5e38, 1, "fp64 3.5e38 rounds to fp32 Inf"},
      {REF_F32, 1.5e19, 4096, "sum of finite fp32 squares overflows fp32"},
      {REF_F32, 1e-30, 100, "squares underflow to 0 in fp32"},
      {REF_F32, 1e-23, 1000, "squares land in fp32 subnormals"},
      {REF_F64, 1e-23, 1000, "fp64 -> fp32, squares subnormal"},
      {REF_F64, 1e-50, 10, "fp64 below fp32: 0"},
      {REF_BF16, 0x1p-70, 5000, "bf16 2^-70: squares 2^-140 subnormal fp32"},
      {REF_F16, 65504.0, 100000, "fp16 max: exact fp32 squares, big sum"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    bxt_tensor x;
    bxt_tensor_alloc(&x, cases[c].dt, cases[c].n);
    for (size_t i = 0; i < x.n; i++)
      bxt_set(&x, i, (i & 1 ? -1 : 1) * cases[c].v * (1.0 + (double)(i % 13) / 64));
    bxt_layout l;
    bxt_layout_single(&l, &x, 1);
    bx_status st;
    double got = megatron_of(&l, 2, &st), want = bxt_ref_megatron(l.src, 1);
    CHECK_STATUS(st, BX_OK, "%s", cases[c].what);
    CHECK_BITS_D(got, want, "%s", cases[c].what);
    bxt_tensor_free(&x);
  }
}

void test_norm_empty_inputs(void) {
  static const double ps[] = {2.0, 1.0, INFINITY, 0.0, 3.0};
  for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
    bx_norm_opts o = opts_p(ps[pi], 0);
    double v = SENTINEL;
    CHECK_STATUS(bx_total_norm(NULL, 0, NULL, &o, &v, NULL), BX_OK, "ngroups 0, groups NULL");
    CHECK_BITS_D(v, 0.0, "p=%g: no groups: norm 0", ps[pi]);
    bx_group empty[3] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
    double gn[3] = {SENTINEL, SENTINEL, SENTINEL};
    v = SENTINEL;
    CHECK_STATUS(bx_total_norm(empty, 3, NULL, &o, &v, gn), BX_OK, "three empty groups");
    CHECK_BITS_D(v, 0.0, "p=%g: empty groups: 0", ps[pi]);
    for (int g = 0; g < 3; g++) CHECK_BITS_D(gn[g], 0.0, "p=%g: empty group %d: 0", ps[pi], g);
    /* zero-length tensors next to a real one */
    bxt_tensor xs[3];
    bxt_tensor_alloc(&xs[0], REF_F32, 0);
    bxt_tensor_alloc(&xs[1], REF_BF16, 0);
    double three = -3.0;
    bxt_tensor_from(&xs[2], REF_F64, &three, 1);
    DLTensor dl[3] = {xs[0].t, xs[1].t, xs[2].t};
    bx_group g2[2] = {{dl, 2}, {dl + 2, 1}};
    CHECK_STATUS(bx_total_norm(g2, 2, NULL, &o, &v, gn), BX_OK, "zero-length tensors");
    double want = ps[pi] == 0 ? 1.0 : 3.0;
    CHECK_BITS_D(v, want, "p=%g: zero-length tensors add nothing", ps[pi]);
    CHECK_BITS_D(gn[0], 0.0, "p=%g: group of zero-length tensors", ps[pi]);
    CHECK_BITS_D(gn[1], want, "p=%g: group with -3", ps[pi]);
    bxt_tensors_free(xs, 3);
  }
}

void test_norm_null_opts_and_defaults(void) {
  bx_norm_opts d = BX_NORM_OPTS_DEFAULT;
  CHECK(d.norm_type == 2.0 && d.error_if_nonfinite == 0 && d.num_threads == 0 &&
            d.flavor == BX_EXACT,
        "BX_NORM_OPTS_DEFAULT is {2, 0, 0, BX_EXACT}");
  bx_clip_opts c = BX_CLIP_OPTS_DEFAULT;
  CHECK(c.eps == 1e-6 && c.formula == BX_COEF_TORCH && c.scale.mode == BX_SCALE_TORCH &&
            c.norm.norm_type == 2.0,
        "BX_CLIP_OPTS_DEFAULT");
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor xs[5];
  bxt_tensors_random(&r, xs, 5, 5000);
  bxt_layout l;
  bxt_layout_random(&r, &l, xs, 5, 2, 0);
  double a = SENTINEL, b = SENTINEL;
  CHECK_STATUS(bx_total_norm(l.groups, l.ngroups, NULL, NULL, &a, NULL), BX_OK, "NULL opts");
  CHECK_STATUS(bx_total_norm(l.groups, l.ngroups, NULL, &d, &b, NULL), BX_OK, "default opts");
  CHECK_BITS_D(a, b, "NULL opts means the defaults");
  CHECK_BITS_D(a, bxt_ref_norm(l.src, l.n, 2.0), "default is the exact L2 norm");
  bxt_tensors_free(xs, 5);
}

/* A one-rank communicator: the all-reduce of one rank is the identity. */
static int fake_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx) {
  (void)buf;
  (void)n;
  (void)op;
  ++*(int *)ctx;
  return 0;
}

static int failing_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx) {
  (void)buf;
  (void)n;
  (void)op;
  (void)ctx;
  return 1;
}

/* A one-rank communicator gives exactly the NULL-comm answer; a failing
 * all-reduce gives BX_ECOMM with nothing written. */
void test_norm_comm(void) {
  bxt_tensor x;
  double v1[3] = {2.0, -3.0, 0x1p-140};
  bxt_tensor_from(&x, REF_F32, v1, 3);
  bx_group g = {&x.t, 1};
  int calls = 0;
  bx_comm comm = BX_COMM_DEFAULT;
  comm.allreduce_i64 = fake_allreduce;
  comm.ctx = &calls;
  double want = SENTINEL, v = SENTINEL;
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, NULL, &want, NULL), BX_OK, "NULL comm");
  CHECK_STATUS(bx_total_norm(&g, 1, &comm, NULL, &v, NULL), BX_OK, "one-rank comm");
  CHECK_BITS_D(v, want, "one-rank comm: the NULL-comm norm");
  CHECK(calls == 2, "one agreement and one norm collective (%d calls)", calls);
  bx_comm bad = BX_COMM_DEFAULT;
  bad.allreduce_i64 = failing_allreduce;
  bad.ctx = NULL;
  v = SENTINEL;
  CHECK_STATUS(bx_total_norm(&g, 1, &bad, NULL, &v, NULL), BX_ECOMM, "failing all-reduce");
  CHECK_BITS_D(v, SENTINEL, "failing all-reduce: output untouched");
  bxt_tensor_free(&x);
}

/* Many groups (more than any fixed-size table would hold): every group's
 * norm against the reference of its own tensors. */
void test_norm_many_groups(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  enum { NG = 300 };
  static bxt_tensor xs[NG];
  static DLTensor dl[NG];
  static bx_group g[NG];
  static double gn[NG + 1];
  for (int k = 0; k < NG; k++) {
    bxt_tensor_alloc(&xs[k], k % REF_NDT, bxt_below(&r, 50));
    bxt_fill_mixed(&r, &xs[k]);
    dl[k] = xs[k].t;
    g[k].tensors = &dl[k];
    g[k].count = 1;
    gn[k] = SENTINEL;
  }
  gn[NG] = SENTINEL;
  static const double ps[] = {2.0, 1.0, INFINITY, 0.0};
  for (size_t pi = 0; pi < 4; pi++) {
    bx_norm_opts o = opts_p(ps[pi], 3);
    double total = SENTINEL;
    CHECK_STATUS(bx_total_norm(g, NG, NULL, &o, &total, gn), BX_OK, "%d groups", NG);
    bxt_tensor *ptrs[NG];
    for (int k = 0; k < NG; k++) ptrs[k] = &xs[k];
    CHECK_BITS_D(total, bxt_ref_norm(ptrs, NG, ps[pi]), "p=%g: total of %d groups", ps[pi], NG);
    for (int k = 0; k < NG; k++)
      if (!CHECK_BITS_D(gn[k], bxt_ref_norm(&ptrs[k], 1, ps[pi]), "p=%g: group %d", ps[pi], k))
        break;
    CHECK_BITS_D(gn[NG], SENTINEL, "nothing written past group_norms[ngroups]");
  }
  bxt_tensors_free(xs, NG);
}
