/*
 * test_lr.c — bx_lr_at against MPFR: the formulas of bitexact_train_math.h
 * evaluated with 2400-bit MPFR (mpfr_cosu: exact where the cosine is
 * rational, so ties are ties) and rounded once to double
 * must give the same bits, over random schedules and every step of each
 * (warmup, decay, past the end), plus the edges (no warmup, warmup longer
 * than the run, one-step runs, min_lr = lr) and the argument errors.
 */
#include <math.h>
#include <mpfr.h>
#include <stdint.h>
#include <string.h>

#include "bitexact_train.h"
#include "harness.h"
#include "tests.h"
#include "util.h"

static double ref_lr(bx_lr_schedule kind, double lr, double m, int64_t W, int64_t N, int64_t s) {
  if (kind == BX_LR_CONSTANT) return lr;
  mpfr_t f, t, u;
  mpfr_inits2(2400, f, t, u, (mpfr_ptr)0); /* lr - m exact down to 2^-953 */
  double out;
  if (s < W) {
    mpfr_set_d(f, lr, MPFR_RNDN);
    mpfr_mul_si(f, f, (long)s, MPFR_RNDN);
    mpfr_div_si(f, f, (long)W, MPFR_RNDN);
    out = mpfr_get_d(f, MPFR_RNDN);
  } else if (kind == BX_LR_CONSTANT_WITH_WARMUP) {
    out = lr;
  } else {
    int64_t n = N - W > 1 ? N - W : 1;
    if (kind == BX_LR_LINEAR) {
      mpfr_set_si(f, (long)(N - s > 0 ? N - s : 0), MPFR_RNDN);
      mpfr_div_si(f, f, (long)n, MPFR_RNDN);
    } else { /* (1 + cos(pi (s - W) / n)) / 2 */
      /* cos(2 pi (s - W) / (2n)): exact where the cosine is rational */
      mpfr_set_si(t, (long)(s - W), MPFR_RNDN);
      mpfr_cosu(f, t, (unsigned long)(2 * n), MPFR_RNDN);
      mpfr_add_ui(f, f, 1, MPFR_RNDN);
      mpfr_div_ui(f, f, 2, MPFR_RNDN);
    }
    mpfr_set_d(t, lr, MPFR_RNDN);
    mpfr_set_d(u, m, MPFR_RNDN);
    mpfr_sub(t, t, u, MPFR_RNDN); /* lr - m, exact at 256 bits */
    mpfr_mul(f, f, t, MPFR_RNDN);
    mpfr_add(f, f, u, MPFR_RNDN);
    out = mpfr_get_d(f, MPFR_RNDN);
  }
  mpfr_clears(f, t, u, (mpfr_ptr)0);
  return out;
}

static const char *const names[] = {"constant", "linear", "cosine", "constant_with_warmup"};

void test_lr_schedule_vs_mpfr(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  int64_t checked = 0, ties = 0;
  for (int trial = 0; trial < 400; trial++) {
    bx_lr_schedule kind = (bx_lr_schedule)(trial % 4);
    int64_t N = (int64_t)bxt_below(&r, trial < 360 ? 300 : 1000000) + (trial % 7 == 0 ? 0 : 1);
    int64_t W = trial % 5 == 0 ? 0 : (int64_t)bxt_below(&r, (uint64_t)N + 3);
    double lr = ldexp(1.0 + bxt_uniform(&r), -(int)bxt_below(&r, 20));
    double m = 0;
    if ((kind == BX_LR_LINEAR || kind == BX_LR_COSINE) && trial % 3 != 0)
      m = trial % 11 == 0 ? lr : lr * bxt_uniform(&r);
    int64_t steps = N + 5 < 400 ? N + 5 : 400;
    for (int64_t k = 0; k < steps; k++) {
      int64_t s = N + 5 < 400 ? k : (int64_t)bxt_below(&r, (uint64_t)N + 5);
      double got = -1;
      CHECK_STATUS(bx_lr_at(kind, lr, m, W, N, s, &got), BX_OK, "%s: %s", names[kind], bx_last_error());
      double want = ref_lr(kind, lr, m, W, N, s);
      CHECK_BITS_D(got, want, "%s lr %a min %a W %lld N %lld step %lld", names[kind], lr, m,
                   (long long)W, (long long)N, (long long)s);
      checked++;
      ties += got == lr;
    }
  }
  CHECK(checked > 20000, "only %lld rates checked", (long long)checked);
  /* the shapes transformers gives: warmup from 0, peak at W, cosine ends
   * at min_lr, linear at min_lr, rises again past N */
  double v;
  CHECK_STATUS(bx_lr_at(BX_LR_COSINE, 1e-3, 0, 10, 100, 0, &v), BX_OK, "cosine 0");
  CHECK_BITS_D(v, 0.0, "cosine step 0 of a warmup");
  CHECK_STATUS(bx_lr_at(BX_LR_COSINE, 1e-3, 0, 10, 100, 10, &v), BX_OK, "cosine W");
  CHECK_BITS_D(v, 1e-3, "cosine at the end of the warmup");
  CHECK_STATUS(bx_lr_at(BX_LR_COSINE, 1e-3, 1e-4, 10, 100, 100, &v), BX_OK, "cosine N");
  CHECK_BITS_D(v, 1e-4, "cosine at N: min_lr");
  CHECK_STATUS(bx_lr_at(BX_LR_COSINE, 1e-3, 0, 10, 100, 55, &v), BX_OK, "cosine middle");
  CHECK_BITS_D(v, 5e-4, "cosine half way: lr / 2");
  CHECK_STATUS(bx_lr_at(BX_LR_LINEAR, 1e-3, 0, 0, 100, 150, &v), BX_OK, "linear past N");
  CHECK_BITS_D(v, 0.0, "linear past N");
  double past;
  CHECK_STATUS(bx_lr_at(BX_LR_COSINE, 1e-3, 0, 0, 100, 150, &past), BX_OK, "cosine past N");
  CHECK_BITS_D(past, 5e-4, "cosine rises again past N");
  /* operands 1800 binades apart: the exact path's widest numerator */
  const double far[][2] = {{0x1p900, 0x1p-900}, {1.0, 0x1.fffffffffffffp-900}, {0x1.8p-900, 0x1p-900}};
  for (int i = 0; i < 3; i++)
    for (int64_t st = 0; st < 7; st++) {
      CHECK_STATUS(bx_lr_at(BX_LR_LINEAR, far[i][0], far[i][1], 2, 7, st, &v), BX_OK, "far %d", i);
      CHECK_BITS_D(v, ref_lr(BX_LR_LINEAR, far[i][0], far[i][1], 2, 7, st), "far %d step %lld", i,
                   (long long)st);
      CHECK_STATUS(bx_lr_at(BX_LR_COSINE, far[i][0], far[i][1], 2, 9, st, &v), BX_OK, "far %d", i);
      CHECK_BITS_D(v, ref_lr(BX_LR_COSINE, far[i][0], far[i][1], 2, 9, st), "far cos %d step %lld",
                   i, (long long)st);
    }
  /* exact ties (lr 3/4 has two bits beyond a double, "10"): to even */
  const double tl = 0x1.9fd41ab6f6f22p-2, tie = 0x1.37df14093935ap-2;
  CHECK_STATUS(bx_lr_at(BX_LR_COSINE, tl, 0, 46, 52, 56, &v), BX_OK, "cosine tie");
  CHECK_BITS_D(v, tie, "cosine (1 + cos(5 pi / 3)) / 2 = 3/4: a tie");
  CHECK_STATUS(bx_lr_at(BX_LR_LINEAR, tl, 0, 12, 16, 13, &v), BX_OK, "linear tie");
  CHECK_BITS_D(v, tie, "linear 3/4: a tie");
  CHECK_STATUS(bx_lr_at(BX_LR_LINEAR, tl, 0, 12, 16, 9, &v), BX_OK, "warmup tie");
  CHECK_BITS_D(v, tie, "warmup 9/12: a tie");
  CHECK_STATUS(bx_lr_at(BX_LR_CONSTANT, 1e-3, 0, 50, 100, 0, &v), BX_OK, "constant");
  CHECK_BITS_D(v, 1e-3, "constant has no warmup");
}

void test_lr_schedule_errors(void) {
  double v = 42.0;
  struct {
    bx_lr_schedule kind;
    double lr, m;
    int64_t W, N, s;
    const char *needle;
  } bad[] = {
      {(bx_lr_schedule)4, 1e-3, 0, 0, 10, 0, "schedule 4"},
      {BX_LR_COSINE, -1e-3, 0, 0, 10, 0, "lr"},
      {BX_LR_COSINE, NAN, 0, 0, 10, 0, "lr"},
      {BX_LR_COSINE, INFINITY, 0, 0, 10, 0, "lr"},
      {BX_LR_COSINE, 1e-3, 2e-3, 0, 10, 0, "min_lr"},
      {BX_LR_COSINE, 1e-3, -1e-9, 0, 10, 0, "min_lr"},
      {BX_LR_CONSTANT, 1e-3, 1e-4, 0, 10, 0, "linear and cosine"},
      {BX_LR_CONSTANT_WITH_WARMUP, 1e-3, 1e-4, 0, 10, 0, "linear and cosine"},
      {BX_LR_LINEAR, 1e-3, 0, -1, 10, 0, "warmup_steps"},
      {BX_LR_LINEAR, 1e-3, 0, 0, -1, 0, "total_steps"},
      {BX_LR_LINEAR, 1e-3, 0, 0, 10, -1, "step"},
      {BX_LR_LINEAR, 1e-3, 0, 0, (int64_t)1 << 53, 0, "total_steps"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_STATUS(bx_lr_at(bad[i].kind, bad[i].lr, bad[i].m, bad[i].W, bad[i].N, bad[i].s, &v),
                 BX_EINVAL, "case %zu", i);
    CHECK(strstr(bx_last_error(), bad[i].needle) != NULL, "case %zu: message '%s' lacks '%s'", i,
          bx_last_error(), bad[i].needle);
    CHECK_BITS_D(v, 42.0, "case %zu wrote *out", i);
  }
  CHECK_STATUS(bx_lr_at(BX_LR_LINEAR, 1e-3, 0, 0, 10, 0, NULL), BX_EINVAL, "out NULL");
}
