/*
 * test_clip.c — bx_clip_coef and bx_clip_grad_norm: the total norm as the
 * reference computes it, the coefficient per formula (written here:
 * BX_COEF_TORCH = min(1, max_norm / (total + eps)) in double, NaN staying
 * NaN as torch's clamp keeps it; BX_COEF_MAX = max_norm / max(total,
 * max_norm)), every gradient scaled as bx_scale's formula says, max_norm 0
 * disabling, bad max_norm refused, non-finite totals handled as torch
 * does, thread counts irrelevant, all-or-nothing on errors.
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

#define SENTINEL -777.25

static double coef_torch(double total, double max_norm, double eps) {
  double c = max_norm / (total + eps);
  return c > 1.0 ? 1.0 : c; /* NaN stays NaN, like torch.clamp(max=1) */
}

static double coef_max(double total, double max_norm) {
  return max_norm / (total > max_norm ? total : max_norm);
}

void test_clip_coef_formulas(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const double epss[] = {1e-6, 0.0, 1e-3, 0.5};
  for (int rep = 0; rep < 2000 && bxt_failures() < 10; rep++) {
    double total = exp(log(1e-8) + bxt_uniform(&r) * (log(1e8) - log(1e-8)));
    double max_norm = rep % 3 ? total * (0.25 + 1.5 * bxt_uniform(&r)) : exp(bxt_normal(&r));
    if (rep % 17 == 0) max_norm = total; /* exactly at the threshold */
    if (rep % 19 == 0) total = 0.0;
    bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
    o.eps = epss[rep % 4];
    o.formula = BX_COEF_TORCH;
    double c = SENTINEL;
    CHECK_STATUS(bx_clip_coef(total, max_norm, &o, &c), BX_OK, "torch formula");
    CHECK_BITS_D(c, coef_torch(total, max_norm, o.eps), "torch: total %a max_norm %a eps %g",
                 total, max_norm, o.eps);
    o.formula = BX_COEF_MAX;
    CHECK_STATUS(bx_clip_coef(total, max_norm, &o, &c), BX_OK, "max formula");
    CHECK_BITS_D(c, coef_max(total, max_norm), "max: total %a max_norm %a", total, max_norm);
    if (total <= max_norm) CHECK(c == 1.0, "max formula: exactly 1 when no clipping is needed");
  }
  double c = SENTINEL;
  CHECK_STATUS(bx_clip_coef(3.0, 1.0, NULL, &c), BX_OK, "NULL opts");
  CHECK_BITS_D(c, coef_torch(3.0, 1.0, 1e-6), "NULL opts: torch formula, eps 1e-6");
  CHECK_STATUS(bx_clip_coef(3.0, 0.0, NULL, &c), BX_OK, "max_norm 0");
  CHECK_BITS_D(c, 1.0, "max_norm 0: coef 1");
  CHECK_STATUS(bx_clip_coef(NAN, 1.0, NULL, &c), BX_OK, "NaN total");
  CHECK(isnan(c), "NaN total: NaN coefficient (torch), got %a", c);
  CHECK_STATUS(bx_clip_coef(INFINITY, 1.0, NULL, &c), BX_OK, "Inf total");
  CHECK_BITS_D(c, 0.0, "Inf total: coefficient 0 (torch)");
  CHECK_STATUS(bx_clip_coef(2.0, INFINITY, NULL, &c), BX_OK, "Inf max_norm");
  CHECK_BITS_D(c, 1.0, "Inf max_norm: no clipping");
  static const double bad[] = {-1.0, -1e-300, NAN, -INFINITY};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    c = SENTINEL;
    CHECK_STATUS(bx_clip_coef(1.0, bad[i], NULL, &c), BX_EINVAL, "max_norm %g", bad[i]);
    CHECK_BITS_D(c, SENTINEL, "coef untouched on error (max_norm %g)", bad[i]);
    CHECK(bx_last_error()[0] != '\0', "a message for max_norm %g", bad[i]);
  }
  CHECK_STATUS(bx_clip_coef(1.0, 1.0, NULL, NULL), BX_EINVAL, "NULL coef out");
}

/* Snapshot of every tensor of a layout (to compare after a call). */
typedef struct snapshot {
  bxt_tensor copy[BXT_MAX_TENSORS];
  size_t n;
} snapshot;

static void snap(snapshot *s, const bxt_layout *l) {
  s->n = l->n;
  for (size_t i = 0; i < l->n; i++) bxt_tensor_clone(&s->copy[i], l->src[i]);
}

static int unchanged(const snapshot *s, const bxt_layout *l) {
  for (size_t i = 0; i < l->n; i++)
    if (memcmp(s->copy[i].buf, l->src[i]->buf, l->src[i]->n * bxt_dt_size(l->src[i]->dt)))
      return 0;
  return 1;
}

static void snap_free(snapshot *s) {
  for (size_t i = 0; i < s->n; i++) bxt_tensor_free(&s->copy[i]);
}

/* One clip of a random layout, checked end to end. */
static void clip_case(bxt_rng *r, bx_coef_formula formula, bx_scale_mode mode, int rep) {
  bxt_tensor xs[10];
  size_t n = 1 + bxt_below(r, 10);
  bxt_tensors_random(r, xs, n, 20000);
  bxt_layout l;
  bxt_layout_random(r, &l, xs, n, 1 + bxt_below(r, 4), 0);
  double want_total = bxt_ref_norm(l.src, l.n, 2.0);
  /* clip (ratio < 1), do not clip (ratio > 1), or sit on the threshold */
  double ratio = rep % 3 == 0 ? 0.5 : rep % 3 == 1 ? 3.0 : 1.0;
  double max_norm = isfinite(want_total) && want_total > 0 ? want_total * ratio : 1.0;
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  o.formula = formula;
  o.scale.mode = mode;
  o.norm.num_threads = 1 + (int)bxt_below(r, 3);
  o.scale.num_threads = 1 + (int)bxt_below(r, 3);
  double want_coef = formula == BX_COEF_TORCH ? coef_torch(want_total, max_norm, o.eps)
                                              : coef_max(want_total, max_norm);
  snapshot s;
  snap(&s, &l);
  double total = SENTINEL, coef = SENTINEL;
  int isa = rep % bxt_isa_count();
  bxt_force(isa);
  CHECK_STATUS(bx_clip_grad_norm(l.groups, l.ngroups, NULL, max_norm, &o, &total, &coef), BX_OK,
               "rep %d, isa %s", rep, bxt_isa(isa));
  bxt_force(-1);
  CHECK_BITS_D(total, want_total, "rep %d: total norm", rep);
  CHECK_BITS_D(coef, want_coef, "rep %d: coefficient (formula %d, total %a, max_norm %a)", rep,
               (int)formula, want_total, max_norm);
  for (size_t i = 0; i < l.n; i++) {
    char what[64];
    snprintf(what, sizeof what, "rep %d tensor %zu", rep, i);
    bxt_check_scaled(what, &s.copy[i], l.src[i], want_coef, mode, 0);
  }
  if (want_coef == 1.0) CHECK(unchanged(&s, &l), "rep %d: coef 1 leaves every bit", rep);
  snap_free(&s);
  bxt_tensors_free(xs, n);
}

void test_clip_grad_norm_torch(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 24 && bxt_failures() < 10; rep++)
    clip_case(&r, BX_COEF_TORCH, rep % 2 ? BX_SCALE_EXACT : BX_SCALE_TORCH, rep);
}

void test_clip_grad_norm_max_formula(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 24 && bxt_failures() < 10; rep++)
    clip_case(&r, BX_COEF_MAX, rep % 2 ? BX_SCALE_EXACT : BX_SCALE_TORCH, rep);
}

void test_clip_max_norm_zero(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 6; rep++) {
    bxt_tensor xs[5];
    bxt_tensors_random(&r, xs, 5, 5000);
    if (rep == 5) bxt_set_bits(&xs[0], 0, ref_encode(xs[0].dt, NAN));
    bxt_layout l;
    bxt_layout_random(&r, &l, xs, 5, 2, 0);
    snapshot s;
    snap(&s, &l);
    double total = SENTINEL, coef = SENTINEL;
    bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
    o.formula = rep % 2 ? BX_COEF_MAX : BX_COEF_TORCH;
    CHECK_STATUS(bx_clip_grad_norm(l.groups, l.ngroups, NULL, 0.0, &o, &total, &coef), BX_OK,
                 "max_norm 0");
    double want = bxt_ref_norm(l.src, l.n, 2.0);
    if (isnan(want))
      CHECK(isnan(total), "max_norm 0: the NaN norm is still returned (%a)", total);
    else
      CHECK_BITS_D(total, want, "max_norm 0: the norm is still computed");
    CHECK_BITS_D(coef, 1.0, "max_norm 0: coef 1");
    CHECK(unchanged(&s, &l), "max_norm 0: no gradient modified");
    /* coef may be NULL */
    CHECK_STATUS(bx_clip_grad_norm(l.groups, l.ngroups, NULL, 0.0, &o, &total, NULL), BX_OK,
                 "coef NULL");
    snap_free(&s);
    bxt_tensors_free(xs, 5);
  }
}

void test_clip_bad_max_norm(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor xs[4];
  bxt_tensors_random(&r, xs, 4, 3000);
  bxt_layout l;
  bxt_layout_random(&r, &l, xs, 4, 2, 0);
  snapshot s;
  snap(&s, &l);
  static const double bad[] = {-1.0, -0x1p-1074, NAN, -NAN, -INFINITY};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    double total = SENTINEL, coef = SENTINEL;
    CHECK_STATUS(bx_clip_grad_norm(l.groups, l.ngroups, NULL, bad[i], NULL, &total, &coef),
                 BX_EINVAL, "max_norm %g", bad[i]);
    CHECK_BITS_D(total, SENTINEL, "total untouched (max_norm %g)", bad[i]);
    CHECK_BITS_D(coef, SENTINEL, "coef untouched (max_norm %g)", bad[i]);
    CHECK(unchanged(&s, &l), "no gradient modified (max_norm %g)", bad[i]);
    CHECK(strstr(bx_last_error(), "max_norm") != NULL, "the message names max_norm: \"%s\"",
          bx_last_error());
  }
  snap_free(&s);
  bxt_tensors_free(xs, 4);
}

/* Without error_if_nonfinite: NaN total -> NaN coefficient, every element
 * scaled by it (NaN); Inf total -> coefficient 0 (torch formula), finite
 * elements become zeros and Inf ones NaN. With it: BX_ENONFINITE and
 * nothing touched. */
void test_clip_nonfinite_total(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int kind = 0; kind < 2; kind++)
    for (int mode = 0; mode < 2; mode++) {
      bxt_tensor xs[4];
      for (int k = 0; k < 4; k++) {
        bxt_tensor_alloc(&xs[k], k, 500);
        bxt_fill_gradient(&r, &xs[k], 1.0);
      }
      bxt_set_bits(&xs[2], 7, ref_encode(xs[2].dt, kind ? INFINITY : NAN));
      bxt_layout l;
      bxt_layout_single(&l, xs, 4);
      snapshot s;
      snap(&s, &l);
      bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
      o.scale.mode = (bx_scale_mode)mode;
      o.norm.error_if_nonfinite = 1;
      double total = SENTINEL, coef = SENTINEL;
      CHECK_STATUS(bx_clip_grad_norm(l.groups, 1, NULL, 1.0, &o, &total, &coef), BX_ENONFINITE,
                   "error_if_nonfinite, kind %d", kind);
      CHECK(bxt_mentions(bx_last_error(), "tensor", 2), "names tensor 2: \"%s\"", bx_last_error());
      CHECK(unchanged(&s, &l) && total == SENTINEL && coef == SENTINEL,
            "nothing written with BX_ENONFINITE");
      o.norm.error_if_nonfinite = 0;
      CHECK_STATUS(bx_clip_grad_norm(l.groups, 1, NULL, 1.0, &o, &total, &coef), BX_OK,
                   "kind %d mode %d", kind, mode);
      double want_coef = coef_torch(kind ? INFINITY : NAN, 1.0, 1e-6);
      if (kind)
        CHECK_BITS_D(total, INFINITY, "Inf element: total +Inf");
      else
        CHECK(isnan(total), "NaN element: total NaN");
      if (kind)
        CHECK_BITS_D(coef, 0.0, "Inf total: coefficient 0");
      else
        CHECK(isnan(coef), "NaN total: NaN coefficient, got %a", coef);
      for (int k = 0; k < 4; k++) {
        char what[64];
        snprintf(what, sizeof what, "kind %d mode %d tensor %d", kind, mode, k);
        bxt_check_scaled(what, &s.copy[k], &xs[k], want_coef, (bx_scale_mode)mode, 0);
      }
      snap_free(&s);
      bxt_tensors_free(xs, 4);
    }
}

/* The same clip with 1, 2, 3 and 8 threads (norm and scale): identical
 * gradients, totals and coefficients. */
void test_clip_threads(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  enum { N = 6 };
  bxt_tensor xs[N];
  for (int k = 0; k < N; k++) {
    bxt_tensor_alloc(&xs[k], k % REF_NDT, k < 2 ? 400000 : 3000 + bxt_below(&r, 3000));
    bxt_fill_gradient(&r, &xs[k], 0.01);
  }
  static const int threads[] = {1, 2, 3, 8};
  bxt_tensor first[N];
  double first_total = 0, first_coef = 0;
  for (int t = 0; t < 4; t++) {
    bxt_tensor ys[N];
    for (int k = 0; k < N; k++) bxt_tensor_clone(&ys[k], &xs[k]);
    bxt_layout l;
    bxt_layout_single(&l, ys, N);
    l.groups[0].count = 3; /* two groups */
    l.groups[1].tensors = &l.dl[3];
    l.groups[1].count = N - 3;
    l.ngroups = 2;
    bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
    o.norm.num_threads = threads[t];
    o.scale.num_threads = threads[t];
    double total = 0, coef = 0;
    CHECK_STATUS(bx_clip_grad_norm(l.groups, 2, NULL, 0.1, &o, &total, &coef), BX_OK,
                 "%d threads", threads[t]);
    CHECK(coef < 1.0, "the data are clipped (coef %g)", coef);
    if (t == 0) {
      for (int k = 0; k < N; k++) first[k] = ys[k];
      first_total = total;
      first_coef = coef;
      continue;
    }
    CHECK_BITS_D(total, first_total, "%d threads: total", threads[t]);
    CHECK_BITS_D(coef, first_coef, "%d threads: coef", threads[t]);
    for (int k = 0; k < N; k++) {
      CHECK(memcmp(ys[k].buf, first[k].buf, xs[k].n * bxt_dt_size(xs[k].dt)) == 0,
            "%d threads: tensor %d differs from 1 thread", threads[t], k);
      bxt_tensor_free(&ys[k]);
    }
  }
  for (int k = 0; k < N; k++) {
    bxt_tensor_free(&first[k]);
    bxt_tensor_free(&xs[k]);
  }
}

/* Any error leaves every gradient as it was: a bad tensor in the last
 * group, an expanded (stride-0) layout (its elements would be scaled more
 * than once), the same tensor twice (it would be scaled twice), NULL
 * outputs. */
void test_clip_all_or_nothing(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor xs[6];
  for (int k = 0; k < 6; k++) {
    bxt_tensor_alloc(&xs[k], k % REF_NDT, 2000);
    bxt_fill_gradient(&r, &xs[k], 1.0);
  }
  int64_t sh[2] = {10, 10}, st[2] = {0, 1};
  for (int c = 0; c < 5; c++) {
    bxt_layout l;
    bxt_layout_single(&l, xs, 6);
    l.groups[0].count = 3;
    l.groups[1].tensors = &l.dl[3];
    l.groups[1].count = 3;
    l.ngroups = 2;
    bx_status want = BX_EINVAL;
    const char *what = "";
    switch (c) {
    case 0:
      l.dl[5].dtype.code = kDLInt;
      want = BX_EDTYPE;
      what = "int32 tensor in group 1";
      break;
    case 1:
      l.dl[5].ndim = 2;
      l.dl[5].shape = sh;
      l.dl[5].strides = st;
      want = BX_ELAYOUT;
      what = "expanded (stride-0) tensor in group 1";
      break;
    case 2:
      l.dl[5] = l.dl[1]; /* the same gradient twice: it would be scaled twice */
      want = BX_ELAYOUT;
      what = "the same tensor in group 0 and group 1";
      break;
    case 3:
      l.dl[5].device.device_type = kDLCUDA;
      want = BX_EDEVICE;
      what = "a CUDA tensor in group 1";
      break;
    default:
      want = BX_EINVAL;
      what = "NULL total_norm";
    }
    snapshot s;
    snap(&s, &l);
    double total = SENTINEL, coef = SENTINEL;
    bx_status got = bx_clip_grad_norm(l.groups, 2, NULL, 1e-3, NULL, c == 4 ? NULL : &total, &coef);
    CHECK_STATUS(got, want, "%s", what);
    CHECK(unchanged(&s, &l), "%s: no gradient modified", what);
    CHECK(total == SENTINEL && coef == SENTINEL, "%s: outputs untouched", what);
    if (c < 4)
      CHECK(bxt_mentions(bx_last_error(), "group", 1) && bxt_mentions(bx_last_error(), "tensor", 2),
            "%s: names group 1, tensor 2: \"%s\"", what, bx_last_error());
    snap_free(&s);
  }
  bxt_tensors_free(xs, 6);
}
