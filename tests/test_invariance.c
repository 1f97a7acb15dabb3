/*
 * test_invariance.c — the norm is a pure function of the multiset of
 * values: the same bits for every tensor order, split into tensors and
 * groups, thread count (1, 2, 3, 8) and forced ISA; for every p and the
 * Megatron flavour; concurrent callers get the same answers.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "harness.h"
#include "tests.h"
#include "util.h"

static const int THREADS[] = {1, 2, 3, 8};

/* A data set with everything that stresses the kernels: long tensors
 * (many blocks), wide exponents, spikes, subnormals, every dtype. */
static size_t make_data(bxt_rng *r, bxt_tensor *xs, int nonfinite) {
  size_t n = 12;
  for (size_t k = 0; k < n; k++) {
    int dt = (int)(k % REF_NDT);
    size_t len = k < 4 ? 60000 + bxt_below(r, 40000) : 1 + bxt_below(r, 5000);
    bxt_tensor_alloc(&xs[k], dt, len);
    if (k % 3 == 0)
      bxt_fill_wide(r, &xs[k]);
    else
      bxt_fill_gradient(r, &xs[k], pow(10.0, -7.0 + 6.0 * bxt_uniform(r)));
  }
  if (nonfinite) bxt_set_bits(&xs[5], 0, ref_encode(xs[5].dt, INFINITY));
  return n;
}

/* One norm under a configuration; returns BX_OK or the status. */
static bx_status norm_of(bxt_layout *l, bx_norm_opts o, double *total, double *gn) {
  return bx_total_norm(l->groups, l->ngroups, NULL, &o, total, gn);
}

/* Baseline (portable, 1 thread, original order, one group) against random
 * variants; total bitwise equal; per-group norms against a recomputation
 * of that group alone. */
static void invariance_for(double p, bx_norm_flavor flavor, int nonfinite, int variants) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor xs[12];
  size_t n = make_data(&r, xs, nonfinite);
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.norm_type = p;
  o.flavor = flavor;
  o.num_threads = 1;
  bxt_layout l;
  bxt_layout_single(&l, xs, n);
  double base = -1;
  bxt_force(0);
  CHECK_STATUS(norm_of(&l, o, &base, NULL), BX_OK, "baseline p=%g", p);
  if (flavor == BX_EXACT && (p == 2 || p == 1 || p == 0 || isinf(p)))
    CHECK_BITS_D(base, bxt_ref_norm(l.src, l.n, p), "baseline p=%g against the reference", p);
  for (int v = 0; v < variants && bxt_failures() < 10; v++) {
    int isa = v % bxt_isa_count();
    bxt_force(isa);
    o.num_threads = THREADS[bxt_below(&r, 4)];
    bxt_layout_random(&r, &l, xs, n, 1 + bxt_below(&r, BXT_MAX_GROUPS), 0);
    double total = -1, gn[BXT_MAX_GROUPS];
    CHECK_STATUS(norm_of(&l, o, &total, gn), BX_OK, "variant %d", v);
    CHECK_BITS_D(total, base, "p=%g flavour %d variant %d: isa %s, %d threads, %zu groups", p,
                 (int)flavor, v, bxt_isa(isa), o.num_threads, l.ngroups);
    /* each group's norm equals that group computed alone on 1 thread */
    for (size_t g = 0; g < l.ngroups; g++) {
      bx_norm_opts o1 = o;
      o1.num_threads = 1;
      double alone = -1;
      bx_status st = bx_total_norm(&l.groups[g], 1, NULL, &o1, &alone, NULL);
      CHECK_STATUS(st, BX_OK, "group %zu alone", g);
      if (p == -INFINITY && l.groups[g].count == 0) continue;
      CHECK_BITS_D(gn[g], alone, "p=%g variant %d: group %zu vs the same group alone", p, v, g);
    }
  }
  bxt_force(-1);
  bxt_tensors_free(xs, n);
}

void test_invariance_p2(void) {
  invariance_for(2.0, BX_EXACT, 0, 24);
  invariance_for(2.0, BX_EXACT, 1, 6);
}

void test_invariance_all_p(void) {
  static const double ps[] = {1.0, INFINITY, -INFINITY, 0.0, 3.0, 0.5, 1.5};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) invariance_for(ps[i], BX_EXACT, 0, 8);
  invariance_for(2.0, BX_MEGATRON_FP32, 0, 12);
}

/* One buffer per dtype cut at random points into views (byte_offset into
 * the same memory): the same norm as the whole buffer. */
void test_invariance_split_views(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 12 && bxt_failures() < 10; rep++) {
    int dt = rep % REF_NDT;
    bxt_tensor whole;
    bxt_tensor_alloc(&whole, dt, 50000 + bxt_below(&r, 50000));
    bxt_fill_mixed(&r, &whole);
    double want = -1;
    bx_group g1 = {&whole.t, 1};
    CHECK_STATUS(bx_total_norm(&g1, 1, NULL, NULL, &want, NULL), BX_OK, "whole");
    bxt_layout lw;
    bxt_layout_single(&lw, &whole, 1);
    CHECK_BITS_D(want, bxt_ref_norm(lw.src, 1, 2.0), "rep %d: whole vs reference", rep);
    /* cut points */
    size_t ncut = 1 + bxt_below(&r, 30);
    DLTensor views[32];
    int64_t shapes[32];
    size_t at = 0, nv = 0;
    for (size_t c = 0; c <= ncut && at < whole.n; c++) {
      size_t len = c == ncut ? whole.n - at : bxt_below(&r, (whole.n - at) / 2 + 1);
      views[nv] = whole.t;
      shapes[nv] = (int64_t)len;
      views[nv].byte_offset = at * bxt_dt_size(dt);
      nv++;
      at += len;
    }
    for (size_t k = 0; k < nv; k++) views[k].shape = &shapes[k];
    bxt_shuffle(&r, views, nv, sizeof views[0]);
    /* views[k].shape still points at the right length: shuffle moved the
     * struct, the pointer travels with it */
    bx_group groups[4];
    size_t ng = 1 + bxt_below(&r, 4), start = 0;
    for (size_t gi = 0; gi < ng; gi++) {
      size_t cnt = gi == ng - 1 ? nv - start : bxt_below(&r, nv - start + 1);
      groups[gi].tensors = &views[start];
      groups[gi].count = cnt;
      start += cnt;
    }
    bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
    o.num_threads = THREADS[rep % 4];
    bxt_force(rep % bxt_isa_count());
    double got = -1;
    CHECK_STATUS(bx_total_norm(groups, ng, NULL, &o, &got, NULL), BX_OK, "views");
    CHECK_BITS_D(got, want, "rep %d: %zu views in %zu groups, %d threads, isa %s", rep, nv, ng,
                 o.num_threads, bxt_isa(rep % bxt_isa_count()));
    bxt_force(-1);
    bxt_tensor_free(&whole);
  }
}

/* The accumulator words themselves (normalised: a unique form) are the
 * same for every ISA, as the wire format needs. */
void test_invariance_acc_isa_words(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 24 && bxt_failures() < 10; rep++) {
    bxt_tensor x;
    bxt_tensor_alloc(&x, rep % REF_NDT, 1 + bxt_below(&r, 30000));
    bxt_fill_mixed(&r, &x);
    if (rep % 5 == 4) bxt_set_bits(&x, 0, ref_encode(x.dt, NAN));
    bx_acc first[2];
    for (int isa = 0; isa < bxt_isa_count(); isa++) {
      bxt_force(isa);
      for (int op = 0; op < 2; op++) {
        bx_acc acc;
        bx_acc_init(&acc);
        CHECK_STATUS(op ? bx_acc_add_abs(&acc, &x.t) : bx_acc_add_squares(&acc, &x.t), BX_OK,
                     "add");
        if (isa == 0)
          first[op] = acc;
        else
          CHECK(memcmp(&acc, &first[op], sizeof acc) == 0,
                "rep %d (%s, n=%zu): %s words of isa %s differ from %s's", rep,
                bxt_dt_name(x.dt), x.n, op ? "abs" : "squares", bxt_isa(isa), bxt_isa(0));
      }
    }
    bxt_force(-1);
    bxt_tensor_free(&x);
  }
}

/* Several threads calling the library at once, each with its own worker
 * threads: every call returns what it returns alone. */
typedef struct caller {
  bxt_layout *l;
  double p;
  int threads;
  double results[20];
  bx_status status[20];
} caller;

static void *caller_main(void *arg) {
  caller *c = arg;
  for (int i = 0; i < 20; i++) {
    bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
    o.norm_type = c->p;
    o.num_threads = c->threads;
    c->status[i] = bx_total_norm(c->l->groups, c->l->ngroups, NULL, &o, &c->results[i], NULL);
  }
  return NULL;
}

void test_concurrent_callers(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  enum { NCALLERS = 6 };
  bxt_tensor xs[NCALLERS][4];
  bxt_layout ls[NCALLERS];
  caller cs[NCALLERS];
  double want[NCALLERS];
  for (int c = 0; c < NCALLERS; c++) {
    bxt_tensors_random(&r, xs[c], 4, 40000);
    bxt_layout_random(&r, &ls[c], xs[c], 4, 2, 0);
    cs[c].l = c % 3 == 2 ? &ls[0] : &ls[c]; /* some share data (read-only) */
    cs[c].p = c % 2 ? 1.0 : 2.0;
    cs[c].threads = 1 + c % 3;
    bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
    o.norm_type = cs[c].p;
    o.num_threads = 1;
    want[c] = -1;
    bx_total_norm(cs[c].l->groups, cs[c].l->ngroups, NULL, &o, &want[c], NULL);
  }
  pthread_t th[NCALLERS];
  for (int c = 0; c < NCALLERS; c++) pthread_create(&th[c], NULL, caller_main, &cs[c]);
  for (int c = 0; c < NCALLERS; c++) pthread_join(th[c], NULL);
  for (int c = 0; c < NCALLERS; c++)
    for (int i = 0; i < 20; i++) {
      CHECK_STATUS(cs[c].status[i], BX_OK, "caller %d call %d", c, i);
      CHECK_BITS_D(cs[c].results[i], want[c], "caller %d call %d", c, i);
    }
  for (int c = 0; c < NCALLERS; c++) bxt_tensors_free(xs[c], 4);
}

/* Thread counts the header does not name: far above the number of CPUs
 * (and BX_MAX_THREADS), and negative. Read as: never a crash or a different
 * answer; a negative count may be refused with BX_EINVAL (nothing written). */
