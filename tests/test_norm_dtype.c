/*
 * test_norm_dtype.c — the norm rounded once into a chosen format
 * (bx_norm_opts.norm_dtype, bx_acc_norm) against MPFR, torch's promotion
 * for BX_NORM_GRADS, and per-group state that scales with the work: many
 * groups give every group's own bits on any thread count.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "harness.h"
#include "sim_comm.h"
#include "tests.h"
#include "util.h"

static const bx_norm_dtype ND_OF[REF_NDT] = {BX_NORM_F16, BX_NORM_BF16, BX_NORM_F32, BX_NORM_F64};

/* The exact sum of squares (p = 2) or |x| (p = 1) of every tensor. */
static void exact_of(ref_sum *s, bxt_tensor *xs, size_t n, int p) {
  ref_sum_init(s);
  for (size_t k = 0; k < n; k++) (p == 2 ? bxt_ref_squares : bxt_ref_abs)(s, &xs[k]);
}

static double want_in(const ref_sum *s, int p, int dt) {
  return p == 2 ? ref_sqrt_fmt(s->sum, REF_FMT[dt]) : ref_round_fmt(s->sum, REF_FMT[dt]);
}

void test_norm_dtype_vs_mpfr(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int set = 0; set < 24 && bxt_failures() < 5; set++) {
    bxt_tensor xs[3];
    size_t n = 0;
    if (set < 4) {
      /* double-rounding traps: a 16-bit midpoint plus something far
       * smaller than fp64's ulp of it (p = 1: the sum rounded to fp64
       * first lands on the midpoint, then ties to even, possibly down) */
      int dt = set % 2 ? REF_BF16 : REF_F16;
      bxt_tensor_alloc(&xs[0], REF_F32, 1);
      bxt_tensor_alloc(&xs[1], REF_F64, 1);
      int frac = dt == REF_F16 ? 10 : 7;
      double base = 1.0 + (double)(2 * bxt_below(&r, 1u << (frac - 1))) / (double)(1u << frac);
      bxt_set(&xs[0], 0, base + ldexp(1.0, -frac - 1)); /* the midpoint above an even value */
      bxt_set(&xs[1], 0, set < 2 ? 0x1p-80 : 0.0);
      n = 2;
    } else {
      n = 3;
      for (size_t k = 0; k < 3; k++) {
        bxt_tensor_alloc(&xs[k], (int)bxt_below(&r, REF_NDT), 1 + bxt_below(&r, 20000));
        bxt_fill_mixed(&r, &xs[k]);
      }
    }
    DLTensor dl[3];
    for (size_t k = 0; k < n; k++) dl[k] = xs[k].t;
    bx_group g = {dl, n};
    for (int p = 1; p <= 2; p++) {
      ref_sum exact;
      exact_of(&exact, xs, n, p);
      for (int dt = 0; dt < REF_NDT; dt++) {
        bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
        o.norm_type = p;
        o.norm_dtype = ND_OF[dt];
        o.num_threads = 1 + set % 3;
        double got = -1, gn = -1;
        CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &got, &gn), BX_OK, "set %d p=%d %s", set, p,
                     bxt_dt_name(dt));
        double want = want_in(&exact, p, dt);
        CHECK_BITS_D(got, want, "set %d: p=%d norm in %s, rounded once", set, p, bxt_dt_name(dt));
        CHECK_BITS_D(gn, want, "set %d: p=%d group norm in %s", set, p, bxt_dt_name(dt));
        /* the same through an accumulator */
        bx_acc acc;
        bx_acc_init(&acc);
        for (size_t k = 0; k < n; k++)
          CHECK_STATUS(p == 2 ? bx_acc_add_squares(&acc, &dl[k]) : bx_acc_add_abs(&acc, &dl[k]),
                       BX_OK, "acc");
        uint64_t bits = 0;
        CHECK_STATUS(bx_acc_norm(&acc, p, bxt_dl_dtype(dt), &bits), BX_OK, "bx_acc_norm");
        CHECK(bits == ref_encode(dt, want), "set %d: bx_acc_norm p=%d in %s: 0x%llx want 0x%llx",
              set, p, bxt_dt_name(dt), (unsigned long long)bits,
              (unsigned long long)ref_encode(dt, want));
      }
      ref_sum_clear(&exact);
    }
    for (size_t k = 0; k < n; k++) bxt_tensor_free(&xs[k]);
  }
}

/* BX_NORM_GRADS: torch's promotion of the gradients' dtypes. */
void test_norm_dtype_grads(void) {
  static const struct {
    int dts[3];
    int n;
    int want; /* the dtype of the result */
  } cases[] = {
      {{REF_BF16}, 1, REF_BF16},
      {{REF_F16}, 1, REF_F16},
      {{REF_F32}, 1, REF_F32},
      {{REF_F64}, 1, REF_F64},
      {{REF_F16, REF_BF16}, 2, REF_F32},
      {{REF_BF16, REF_F32}, 2, REF_F32},
      {{REF_BF16, REF_F16, REF_F64}, 3, REF_F64},
      {{REF_BF16, REF_BF16}, 2, REF_BF16},
  };
  bxt_rng r;
  bxt_rng_init(&r);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    bxt_tensor xs[3];
    DLTensor dl[3];
    for (int k = 0; k < cases[c].n; k++) {
      bxt_tensor_alloc(&xs[k], cases[c].dts[k], 3000);
      bxt_fill_gradient(&r, &xs[k], 3.0);
      dl[k] = xs[k].t;
    }
    bx_group g = {dl, (size_t)cases[c].n};
    bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
    o.norm_dtype = BX_NORM_GRADS;
    double got = -1, want = -2;
    CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &got, NULL), BX_OK, "case %zu", c);
    o.norm_dtype = ND_OF[cases[c].want];
    CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &want, NULL), BX_OK, "case %zu explicit", c);
    CHECK_BITS_D(got, want, "case %zu: the gradients' promoted dtype is %s", c,
                 bxt_dt_name(cases[c].want));
    for (int k = 0; k < cases[c].n; k++) bxt_tensor_free(&xs[k]);
  }
  /* no tensor at all: 0 */
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.norm_dtype = BX_NORM_GRADS;
  double v = -1;
  CHECK_STATUS(bx_total_norm(NULL, 0, NULL, &o, &v, NULL), BX_OK, "no groups");
  CHECK_BITS_D(v, 0.0, "no groups: 0");
  o.norm_dtype = (bx_norm_dtype)9;
  CHECK_STATUS(bx_total_norm(NULL, 0, NULL, &o, &v, NULL), BX_EINVAL, "unknown norm_dtype");
}

void test_acc_norm_rules(void) {
  bxt_tensor x;
  bxt_tensor_alloc(&x, REF_F32, 100);
  for (size_t i = 0; i < x.n; i++) bxt_set(&x, i, 0.5 + (double)i);
  bx_acc acc;
  bx_acc_init(&acc);
  CHECK_STATUS(bx_acc_add_squares(&acc, &x.t), BX_OK, "add");
  DLDataType f64 = {kDLFloat, 64, 1}, i32 = {kDLInt, 32, 1}, f32x2 = {kDLFloat, 32, 2};
  double v = -7.0;
  CHECK_STATUS(bx_acc_norm(&acc, 3.0, f64, &v), BX_EINVAL, "norm_type 3");
  CHECK_STATUS(bx_acc_norm(&acc, 2.0, i32, &v), BX_EDTYPE, "int32");
  CHECK_STATUS(bx_acc_norm(&acc, 2.0, f32x2, &v), BX_EDTYPE, "2 lanes");
  CHECK_STATUS(bx_acc_norm(NULL, 2.0, f64, &v), BX_EINVAL, "NULL acc");
  CHECK_STATUS(bx_acc_norm(&acc, 2.0, f64, NULL), BX_EINVAL, "NULL out");
  bx_acc wrong = acc;
  wrong.version += 1;
  CHECK_STATUS(bx_acc_norm(&wrong, 2.0, f64, &v), BX_EMISMATCH, "version");
  CHECK_BITS_D(v, -7.0, "out untouched on every error");
  CHECK_STATUS(bx_acc_norm(&acc, 2.0, f64, &v), BX_OK, "ok");
  CHECK_BITS_D(v, bx_acc_sqrt(&acc), "fp64: bx_acc_sqrt's bits");
  /* the words after an all-reduce of two ranks' accumulators: un-normalised */
  bx_acc sum = acc;
  for (int w = 0; w < BX_ACC_WORDS; w++) ((int64_t *)&sum)[w] += ((int64_t *)&acc)[w];
  double v2;
  CHECK_STATUS(bx_acc_norm(&sum, 2.0, f64, &v2), BX_OK, "summed words");
  CHECK_BITS_D(v2 * v2, 2.0 * v * v, "twice the squares (exact here: small integers)");
  /* NaN / Inf rules */
  acc.inf_count = 1;
  CHECK_STATUS(bx_acc_norm(&acc, 2.0, f64, &v), BX_OK, "inf");
  CHECK_BITS_D(v, INFINITY, "an Inf counted: +Inf");
  acc.nan_count = 1;
  CHECK_STATUS(bx_acc_norm(&acc, 1.0, f64, &v), BX_OK, "nan");
  CHECK(isnan(v), "a NaN counted: NaN (%g)", v);
  uint16_t h = 0;
  CHECK_STATUS(bx_acc_norm(&acc, 2.0, bxt_dl_dtype(REF_BF16), &h), BX_OK, "bf16 NaN");
  CHECK((h & 0x7F80) == 0x7F80 && (h & 0x7F), "bf16 NaN: 0x%04x", h);
  bxt_tensor_free(&x);
}

/* Many groups: every group's own bits, on any thread count; groups that
 * span the drivers' task boundaries (a big tensor among tiny ones) too. */
void test_norm_many_groups_state(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  enum { NG = 3000 };
  bxt_tensor *xs = calloc(NG, sizeof *xs);
  DLTensor *dl = calloc(NG, sizeof *dl);
  bx_group *g = calloc(NG, sizeof *g);
  double *alone = calloc(NG, sizeof *alone), *gn = calloc(NG, sizeof *gn);
  for (size_t k = 0; k < NG; k++) {
    size_t n = k % 500 == 7 ? 700000 : 1 + bxt_below(&r, 200);
    bxt_tensor_alloc(&xs[k], (int)(k % 4), n);
    bxt_fill_mixed(&r, &xs[k]);
    dl[k] = xs[k].t;
  }
  /* groups of 1 tensor, except a few of several (spanning tasks) */
  size_t ngroups = 0;
  for (size_t k = 0; k < NG;) {
    size_t c = k % 97 == 3 && k + 4 < NG ? 4 : 1;
    g[ngroups++] = (bx_group){&dl[k], c};
    k += c;
  }
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.num_threads = 1;
  for (size_t i = 0; i < ngroups; i++)
    CHECK_STATUS(bx_total_norm(&g[i], 1, NULL, &o, &alone[i], NULL), BX_OK, "group %zu alone", i);
  static const int threads[] = {1, 2, 3, 16};
  double first = -1;
  for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
    o.num_threads = threads[t];
    double total = -1;
    CHECK_STATUS(bx_total_norm(g, ngroups, NULL, &o, &total, gn), BX_OK, "%d threads", threads[t]);
    if (t == 0) first = total;
    else CHECK_BITS_D(total, first, "%d threads: the total", threads[t]);
    int bad = 0;
    for (size_t i = 0; i < ngroups && bad < 3; i++)
      if (memcmp(&gn[i], &alone[i], 8) != 0)
        bad += !CHECK_BITS_D(gn[i], alone[i], "%d threads: group %zu's own norm", threads[t], i);
  }
  for (size_t k = 0; k < NG; k++) bxt_tensor_free(&xs[k]);
  free(xs);
  free(dl);
  free(g);
  free(alone);
  free(gn);
}

/* ---- bx_total_norm_info over simulated ranks --------------------------- */

typedef struct info_job {
  bxt_rank_ctx ctx;
  bx_comm comm;
  bx_group g;
  bx_norm_opts o;
  bx_norm_info info;
  double total;
  bx_status st;
  char err[512];
} info_job;

static void *info_rank(void *arg) {
  info_job *j = arg;
  j->total = -1;
  j->st = bx_total_norm_info(&j->g, 1, &j->comm, &j->o, &j->total, NULL, &j->info);
  snprintf(j->err, sizeof j->err, "%s", j->st == BX_OK ? "" : bx_last_error());
  return NULL;
}

/* Two jobs with the default options, no tensor, an info struct of the
 * right size. */
static void info_jobs_init(info_job *jobs) {
  for (int k = 0; k < 2; k++) {
    memset(&jobs[k], 0, sizeof jobs[k]);
    jobs[k].o = (bx_norm_opts)BX_NORM_OPTS_DEFAULT;
    jobs[k].info = (bx_norm_info)BX_NORM_INFO_DEFAULT;
  }
}

static void info_run(bxt_world *w, info_job *jobs) {
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    jobs[r].comm = bxt_sim_comm(w, &jobs[r].ctx, r);
    pthread_create(&th[r], NULL, info_rank, &jobs[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
}

/* BX_NORM_GRADS over ranks (DESIGN §7, issue 24): the format is chosen
 * from every rank's dtypes, so a rank holding no tensor, or other dtypes
 * than the others, gets the same format and bits, and info says which;
 * ranks asking for different formats get a message naming both. */
void test_norm_info_ranks(void) {
  static const struct {
    int dt0, dt1; /* -1: that rank passes no tensor */
    bx_norm_dtype want;
  } cases[] = {
      {REF_BF16, -1, BX_NORM_BF16}, {-1, REF_F16, BX_NORM_F16}, {REF_BF16, REF_F16, BX_NORM_F32},
      {REF_BF16, REF_BF16, BX_NORM_BF16}, {REF_F64, -1, BX_NORM_F64}, {-1, -1, BX_NORM_F32},
  };
  bxt_rng r;
  bxt_rng_init(&r);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    bxt_world w;
    bxt_world_init(&w, 2);
    info_job jobs[2];
    bxt_tensor xs[2];
    DLTensor dl[2];
    int dts[2] = {cases[c].dt0, cases[c].dt1};
    ref_sum s;
    ref_sum_init(&s);
    info_jobs_init(jobs);
    for (int k = 0; k < 2; k++) {
      jobs[k].o.norm_dtype = BX_NORM_GRADS;
      jobs[k].info.norm_dtype = BX_NORM_GRADS; /* overwritten on success */
      if (dts[k] >= 0) {
        bxt_tensor_alloc(&xs[k], dts[k], 2000);
        bxt_fill_gradient(&r, &xs[k], 3.0);
        bxt_ref_squares(&s, &xs[k]);
        dl[k] = xs[k].t;
        jobs[k].g = (bx_group){&dl[k], 1};
      }
    }
    info_run(&w, jobs);
    int want_dt = cases[c].want == BX_NORM_BF16 ? REF_BF16
                  : cases[c].want == BX_NORM_F16 ? REF_F16
                  : cases[c].want == BX_NORM_F64 ? REF_F64
                                                 : REF_F32;
    double want = ref_sqrt_fmt(s.sum, REF_FMT[want_dt]);
    for (int k = 0; k < 2; k++) {
      CHECK_STATUS(jobs[k].st, BX_OK, "case %zu rank %d: %s", c, k, jobs[k].err);
      CHECK(jobs[k].info.norm_dtype == cases[c].want, "case %zu rank %d: info.norm_dtype %d, "
            "want %d", c, k, (int)jobs[k].info.norm_dtype, (int)cases[c].want);
      CHECK_BITS_D(jobs[k].total, want, "case %zu rank %d: the exact norm in %s", c, k,
                   bxt_dt_name(want_dt));
    }
    for (int k = 0; k < 2; k++)
      if (dts[k] >= 0) bxt_tensor_free(&xs[k]);
    ref_sum_clear(&s);
    bxt_world_free(&w);
  }

  /* different explicit formats: BX_EMISMATCH on both, dtypes named */
  {
    bxt_world w;
    bxt_world_init(&w, 2);
    info_job jobs[2];
    info_jobs_init(jobs);
    jobs[0].o.norm_dtype = BX_NORM_F32;
    jobs[1].o.norm_dtype = BX_NORM_BF16;
    info_run(&w, jobs);
    for (int k = 0; k < 2; k++) {
      CHECK_STATUS(jobs[k].st, BX_EMISMATCH, "explicit formats, rank %d", k);
      CHECK(strstr(jobs[k].err, "norm_dtype") && strstr(jobs[k].err, "float32") &&
                strstr(jobs[k].err, "bfloat16") && strstr(jobs[k].err, "BX_NORM_GRADS") &&
                !strstr(jobs[k].err, "smallest"),
            "rank %d: the message names the dtypes and the fix: %s", k, jobs[k].err);
      CHECK(jobs[k].total == -1, "rank %d: no output written", k);
    }
    bxt_world_free(&w);
  }

  /* a wrong info->struct_size on one rank: BX_EINVAL there, the other rank
   * fails in the agreement step instead of waiting */
  {
    bxt_world w;
    bxt_world_init(&w, 2);
    info_job jobs[2];
    info_jobs_init(jobs);
    jobs[1].info.struct_size = 4;
    info_run(&w, jobs);
    CHECK(!w.timed_out, "a bad info struct on rank 1 hangs rank 0");
    CHECK_STATUS(jobs[1].st, BX_EINVAL, "rank 1: bad info size");
    CHECK(strstr(jobs[1].err, "info->struct_size") != NULL, "rank 1: %s", jobs[1].err);
    CHECK_STATUS(jobs[0].st, BX_EINVAL, "rank 0: rank 1's failure, agreed: %s", jobs[0].err);
    bxt_world_free(&w);
  }

  /* alone: a NULL info is refused before anything else */
  double v = -1;
  CHECK_STATUS(bx_total_norm_info(NULL, 0, NULL, NULL, &v, NULL, NULL), BX_EINVAL, "NULL info");
  CHECK(v == -1, "NULL info: nothing written");
}
