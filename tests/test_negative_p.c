/*
 * test_negative_p.c — norm_type p < 0 other than -inf (DESIGN §2, torch's
 * definition): (sum |x|^p)^(1/p), each |x|^p by bx_pow_det in fp64, the
 * sum exact, its fp64 rounding raised to the fp64 1/p by bx_pow_det.
 *
 * Accuracy (against MPFR, 256 bits, the same definition with the exact
 * terms and sum; 1/p as the fp64 value 1.0 / p, which the definition
 * uses): bx_pow_det is faithful (error below 1 ulp, so relative 2^-52),
 * the sum of the rounded terms is exact and rounded once (2^-53): the sum
 * carries a relative error e <= 1.5 2^-52; raising to r = 1/p scales it
 * by |r| ((1+e)^r ~ 1 + r e), and the last bx_pow_det adds 2^-52. The
 * bound checked: (1.5 |r| + 1) 2^-52, times 1.01 for the second-order
 * terms. Values are kept where every term is a normal fp64 number.
 *
 * Special values (torch's): a zero element makes |0|^p = +Inf, the sum
 * +Inf and the norm +Inf^(1/p) = 0; an Inf element adds 0; NaN gives NaN;
 * every element Inf gives 0^(1/p) = +Inf; no element gives 0.
 * error_if_nonfinite fails only for a NaN or Inf total.
 * Then bit-identical results over orders, partitions, threads, ISAs and
 * simulated ranks.
 */
#include <math.h>
#include <mpfr.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "checks.h"
#include "harness.h"
#include "sim_comm.h"
#include "tests.h"
#include "util.h"

#define SENTINEL -999.0

static const double NEG_P[] = {-0.1, -0.5, -1.0, -2.0, -3.0, -1.5};
#define NNEG (sizeof NEG_P / sizeof NEG_P[0])

/* Non-zero values |x| in [2^-14, 2^14] (normal in every dtype; every
 * |x|^p of NEG_P a normal fp64 number), random signs. */
static void fill_moderate(bxt_rng *r, bxt_tensor *x) {
  for (size_t i = 0; i < x->n; i++) {
    double v = ldexp(1.0 + bxt_uniform(r), (int)bxt_below(r, 28) - 14);
    bxt_set(x, i, bxt_below(r, 2) ? -v : v);
  }
}

/* MPFR: (sum |x|^p)^(1.0 / p) over xs, rounded to fp64. */
static double mpfr_negative_norm(bxt_tensor *const *xs, size_t n, double p) {
  mpfr_t s, t, a;
  mpfr_inits2(256, s, t, a, (mpfr_ptr)0);
  mpfr_set_zero(s, 1);
  for (size_t k = 0; k < n; k++)
    for (size_t i = 0; i < xs[k]->n; i++) {
      mpfr_set_d(a, fabs(bxt_get(xs[k], i)), MPFR_RNDN); /* exact */
      mpfr_set_d(t, p, MPFR_RNDN);
      mpfr_pow(t, a, t, MPFR_RNDN);
      mpfr_add(s, s, t, MPFR_RNDN);
    }
  mpfr_set_d(t, 1.0 / p, MPFR_RNDN);
  mpfr_pow(s, s, t, MPFR_RNDN);
  double v = mpfr_get_d(s, MPFR_RNDN);
  mpfr_clears(s, t, a, (mpfr_ptr)0);
  return v;
}

static double norm_of(bxt_tensor *const *xs, size_t n, double p, bx_norm_dtype nd) {
  DLTensor dl[16];
  for (size_t k = 0; k < n; k++) dl[k] = xs[k]->t;
  bx_group g = {dl, n};
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.norm_type = p;
  o.norm_dtype = nd;
  double v = SENTINEL;
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &v, NULL), BX_OK, "p = %g", p);
  return v;
}

void test_negative_p_vs_mpfr(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int round = 0; round < 16; round++) {
    bxt_tensor xs[4];
    bxt_tensor *ptr[4];
    size_t n = 1 + (size_t)bxt_below(&r, 4);
    for (size_t k = 0; k < n; k++) {
      bxt_tensor_alloc(&xs[k], (int)bxt_below(&r, REF_NDT), 1 + (size_t)bxt_below(&r, 1500));
      fill_moderate(&r, &xs[k]);
      ptr[k] = &xs[k];
    }
    for (size_t pi = 0; pi < NNEG; pi++) {
      double p = NEG_P[pi], rinv = fabs(1.0 / p);
      double want = mpfr_negative_norm(ptr, n, p), got = norm_of(ptr, n, p, BX_NORM_F64);
      double bound = (1.5 * rinv + 1.0) * 0x1p-52 * 1.01;
      CHECK(want > 0 && isfinite(want) && fabs(got - want) <= bound * want,
            "round %d, p = %g: %.17g vs MPFR %.17g: relative error %.3g > bound %.3g", round, p,
            got, want, fabs(got - want) / want, bound);
      /* in fp32: the fp64 norm rounded once more (bitexact.h) */
      double got32 = norm_of(ptr, n, p, BX_NORM_F32);
      CHECK_BITS_D(got32, (double)(float)got, "round %d, p = %g: fp32 = fp64 rounded", round, p);
    }
    for (size_t k = 0; k < n; k++) bxt_tensor_free(&xs[k]);
  }
}

void test_negative_p_special_values(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor a, b;
  bxt_tensor_alloc(&a, REF_F32, 100);
  bxt_tensor_alloc(&b, REF_BF16, 50);
  fill_moderate(&r, &a);
  fill_moderate(&r, &b);
  bxt_tensor *both[2] = {&a, &b};
  for (size_t pi = 0; pi < NNEG; pi++) {
    double p = NEG_P[pi];
    double base = norm_of(both, 2, p, BX_NORM_F64);
    CHECK(base > 0 && isfinite(base), "p = %g: a finite positive norm", p);
    bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
    o.norm_type = p;
    o.error_if_nonfinite = 1;
    DLTensor dl[2] = {a.t, b.t};
    bx_group g[2] = {{dl, 1}, {dl + 1, 1}};
    double total = SENTINEL, gn[2] = {SENTINEL, SENTINEL};
    /* a zero: |0|^p = +Inf, the norm 0, finite: no error */
    double keep = bxt_get(&b, 7);
    bxt_set(&b, 7, bxt_below(&r, 2) ? 0.0 : -0.0);
    CHECK_STATUS(bx_total_norm(g, 2, NULL, &o, &total, gn), BX_OK, "p = %g: a zero", p);
    CHECK_BITS_D(total, 0.0, "p = %g: a zero gives 0", p);
    CHECK_BITS_D(gn[1], 0.0, "p = %g: its group's norm 0", p);
    CHECK(gn[0] > 0 && isfinite(gn[0]), "p = %g: the other group's norm stays", p);
    bxt_set(&b, 7, keep);
    /* an Inf element adds 0: the norm of the others */
    bxt_tensor a2;
    bxt_tensor_alloc(&a2, REF_F32, 99);
    memcpy(a2.buf, (float *)a.buf + 1, 99 * 4);
    bxt_tensor *rest[2] = {&a2, &b};
    double without = norm_of(rest, 2, p, BX_NORM_F64);
    keep = bxt_get(&a, 0);
    bxt_set(&a, 0, bxt_below(&r, 2) ? INFINITY : -INFINITY);
    CHECK_STATUS(bx_total_norm(g, 2, NULL, &o, &total, gn), BX_OK, "p = %g: an Inf", p);
    CHECK_BITS_D(total, without, "p = %g: an Inf element adds nothing", p);
    /* a NaN: NaN, and error_if_nonfinite names it */
    bxt_set(&b, 3, NAN);
    total = SENTINEL;
    CHECK_STATUS(bx_total_norm(g, 2, NULL, &o, &total, gn), BX_ENONFINITE, "p = %g: NaN", p);
    CHECK(total == SENTINEL, "p = %g: nothing written", p);
    CHECK(bx_last_error_location()->group == 1 && bx_last_error_location()->tensor == 0 &&
              strstr(bx_last_error(), "NaN"),
          "p = %g: group 1, tensor 0 (the NaN, not the Inf before it) named: %s", p,
          bx_last_error());
    o.error_if_nonfinite = 0;
    CHECK_STATUS(bx_total_norm(g, 2, NULL, &o, &total, gn), BX_OK, "p = %g: NaN", p);
    CHECK(isnan(total) && isnan(gn[1]), "p = %g: NaN gives NaN", p);
    bxt_set(&b, 7, 0.0); /* NaN and a zero: NaN */
    CHECK_STATUS(bx_total_norm(g, 2, NULL, &o, &total, gn), BX_OK, "p = %g", p);
    CHECK(isnan(total), "p = %g: NaN beats a zero", p);
    bxt_set(&b, 3, 1.0);
    bxt_set(&b, 7, keep);
    bxt_set(&a, 0, keep);
    bxt_tensor_free(&a2);
    /* every element Inf: sum 0, 0^(1/p) = +Inf; error_if_nonfinite fails */
    bxt_tensor inf;
    bxt_tensor_alloc(&inf, REF_F16, 5);
    for (size_t i = 0; i < 5; i++) bxt_set(&inf, i, i % 2 ? INFINITY : -INFINITY);
    bx_group gi = {&inf.t, 1};
    CHECK_STATUS(bx_total_norm(&gi, 1, NULL, &o, &total, NULL), BX_OK, "p = %g: all Inf", p);
    CHECK(total == INFINITY, "p = %g: all Inf gives +Inf (%g)", p, total);
    o.error_if_nonfinite = 1;
    total = SENTINEL;
    CHECK_STATUS(bx_total_norm(&gi, 1, NULL, &o, &total, NULL), BX_ENONFINITE,
                 "p = %g: all Inf with error_if_nonfinite", p);
    CHECK(total == SENTINEL, "p = %g: nothing written", p);
    bxt_tensor_free(&inf);
    /* nothing at all: 0 */
    o.error_if_nonfinite = 0;
    bxt_tensor empty;
    bxt_tensor_alloc(&empty, REF_F32, 0);
    bx_group ge = {&empty.t, 1};
    CHECK_STATUS(bx_total_norm(&ge, 1, NULL, &o, &total, gn), BX_OK, "p = %g: empty", p);
    CHECK_BITS_D(total, 0.0, "p = %g: no element gives 0", p);
    CHECK_STATUS(bx_total_norm(NULL, 0, NULL, &o, &total, NULL), BX_OK, "p = %g: no group", p);
    CHECK_BITS_D(total, 0.0, "p = %g: no group gives 0", p);
    bxt_tensor_free(&empty);
    /* a clip with a zero: norm 0, coefficient 1, nothing changes */
    bxt_set(&b, 7, 0.0);
    bxt_tensor before;
    bxt_tensor_clone(&before, &b);
    bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
    co.norm.norm_type = p;
    double coef = SENTINEL;
    CHECK_STATUS(bx_clip_grad_norm(g, 2, NULL, 1e-3, &co, &total, &coef), BX_OK, "p = %g: clip", p);
    CHECK(total == 0.0 && coef == 1.0 && memcmp(before.buf, b.buf, 100) == 0,
          "p = %g: clip of a zero norm: coefficient 1, unchanged", p);
    bxt_set(&b, 7, keep);
    bxt_tensor_free(&before);
  }
  /* a term past fp64's range (2^-600)^-2 = 2^1200: +Inf, so the norm is 0
   * (the fp64 definition; torch's fp64 gives 0 too) */
  bxt_tensor tiny;
  bxt_tensor_alloc(&tiny, REF_F64, 3);
  bxt_set(&tiny, 0, 0x1p-600);
  bxt_set(&tiny, 1, 1.0);
  bxt_set(&tiny, 2, 2.0);
  bxt_tensor *tp[1] = {&tiny};
  CHECK_BITS_D(norm_of(tp, 1, -2.0, BX_NORM_F64), 0.0, "an overflowing term gives 0");
  bxt_tensor_free(&tiny);
  bxt_tensor_free(&a);
  bxt_tensor_free(&b);
}

void test_negative_p_invariance(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor xs[12];
  bxt_tensors_random(&r, xs, 12, 5000);
  static const int threads[] = {1, 2, 3, 8};
  for (size_t pi = 0; pi < NNEG; pi++) {
    double p = NEG_P[pi];
    bxt_layout l;
    bxt_layout_single(&l, xs, 12);
    bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
    o.norm_type = p;
    double want = SENTINEL;
    CHECK_STATUS(bx_total_norm(l.groups, l.ngroups, NULL, &o, &want, NULL), BX_OK, "p = %g", p);
    for (int trial = 0; trial < 12; trial++) {
      bxt_layout_random(&r, &l, xs, 12, 1 + (size_t)bxt_below(&r, 6), 0);
      o.num_threads = threads[trial % 4];
      int isa = trial % bxt_isa_count();
      bxt_force(isa);
      double got = SENTINEL;
      CHECK_STATUS(bx_total_norm(l.groups, l.ngroups, NULL, &o, &got, NULL), BX_OK, "p = %g", p);
      CHECK_BITS_D(got, want, "p = %g: order, %zu groups, %d threads, %s", p, l.ngroups,
                   o.num_threads, bxt_isa(isa));
    }
    bxt_force(-1);
  }
  bxt_tensors_free(xs, 12);
}

/* ---- simulated ranks -------------------------------------------------- */
typedef struct rank_call {
  bxt_rank_ctx ctx;
  bx_comm comm;
  DLTensor dl[12];
  bx_group g;
  double p, total;
  bx_status st;
} rank_call;

static void *rank_main(void *arg) {
  rank_call *c = arg;
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.norm_type = c->p;
  c->total = SENTINEL;
  c->st = bx_total_norm(&c->g, 1, &c->comm, &o, &c->total, NULL);
  return NULL;
}

/* The norm of xs[0..n) split over nranks simulated ranks (tensor k on rank
 * owner[k]): every rank must agree; returns rank 0's value. */
static double ranks_norm(bxt_tensor *xs, size_t n, const int *owner, int nranks, double p) {
  bxt_world w;
  bxt_world_init(&w, nranks);
  rank_call c[BXT_SIM_MAX_RANKS];
  pthread_t th[BXT_SIM_MAX_RANKS];
  for (int q = 0; q < nranks; q++) {
    memset(&c[q], 0, sizeof c[q]);
    size_t m = 0;
    for (size_t k = 0; k < n; k++)
      if (owner[k] == q) c[q].dl[m++] = xs[k].t;
    c[q].g = (bx_group){c[q].dl, m};
    c[q].p = p;
    c[q].comm = bxt_sim_comm(&w, &c[q].ctx, q);
  }
  for (int q = 0; q < nranks; q++) pthread_create(&th[q], NULL, rank_main, &c[q]);
  for (int q = 0; q < nranks; q++) pthread_join(th[q], NULL);
  for (int q = 0; q < nranks; q++) {
    CHECK_STATUS(c[q].st, BX_OK, "rank %d of %d, p = %g", q, nranks, p);
    CHECK_BITS_D(c[q].total, c[0].total, "rank %d of %d agrees, p = %g", q, nranks, p);
  }
  bxt_world_free(&w);
  return c[0].total;
}

void test_negative_p_ranks(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor xs[12];
  for (size_t k = 0; k < 12; k++) {
    bxt_tensor_alloc(&xs[k], (int)bxt_below(&r, REF_NDT), 1 + (size_t)bxt_below(&r, 3000));
    fill_moderate(&r, &xs[k]);
  }
  int owner[12];
  for (int special = 0; special < 4; special++) {
    /* 0: plain; 1: a zero on one rank; 2: a NaN; 3: every element Inf */
    if (special == 1) bxt_set(&xs[5], 0, 0.0);
    if (special == 2) bxt_set(&xs[9], 0, NAN);
    if (special == 3)
      for (size_t k = 0; k < 12; k++)
        for (size_t i = 0; i < xs[k].n; i++) bxt_set(&xs[k], i, INFINITY);
    for (size_t pi = 0; pi < NNEG; pi += 2) {
      double p = NEG_P[pi];
      bxt_tensor *ptr[12];
      for (size_t k = 0; k < 12; k++) ptr[k] = &xs[k];
      DLTensor dl[12];
      for (size_t k = 0; k < 12; k++) dl[k] = ptr[k]->t;
      bx_group g = {dl, 12};
      bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
      o.norm_type = p;
      double want = SENTINEL;
      CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &want, NULL), BX_OK, "one process");
      if (special == 1) CHECK_BITS_D(want, 0.0, "a zero gives 0");
      if (special == 2) CHECK(isnan(want), "NaN");
      if (special == 3) CHECK(want == INFINITY, "all Inf gives +Inf");
      for (int nranks = 1; nranks <= 4; nranks++) {
        for (size_t k = 0; k < 12; k++) owner[k] = (int)bxt_below(&r, (uint64_t)nranks);
        double got = ranks_norm(xs, 12, owner, nranks, p);
        CHECK_BITS_D(got, want, "special %d, p = %g, %d ranks: the one-process bits", special, p,
                     nranks);
      }
    }
  }
  bxt_tensors_free(xs, 12);
}
