/*
 * attention_prob.h — one attention problem for the tests (test_attention.c,
 * test_attention_tiles.c; included by each): its inputs and outputs with
 * their DLTensor views, the two calls, and the check of the outputs
 * against both references of attention_ref.h (bits of the documented
 * order, the fp64 bound).
 */
#ifndef BX_TEST_ATTENTION_PROB_H
#define BX_TEST_ATTENTION_PROB_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_ref.h"
#include "bitexact_train.h"
#include "dl_view.h"
#include "harness.h"
#include "util.h"

/* ---- one problem: inputs, outputs and their DLTensor views ------------------ */

typedef struct aprob {
  ashape s;
  size_t T, nq, nk, nst;
  float *q, *k, *v, *dout;          /* inputs */
  float *o, *stats, *dq, *dk, *dv;  /* outputs */
  int64_t shq[2], shk[2], shs[3];
  DLTensor tq, tk, tv, tdo, to, tst, tdq, tdk, tdv;
} aprob;

static void view(DLTensor *t, float *data, int ndim, int64_t *shape) {
  *t = bxt_f32_view(data, ndim, shape);
}

static void ap_make(aprob *a, size_t B, size_t L, size_t Hq, size_t Hkv, size_t D) {
  memset(a, 0, sizeof *a);
  a->s = (ashape){B, L, Hq, Hkv, D};
  a->T = B * L;
  a->nq = a->T * Hq * D;
  a->nk = a->T * Hkv * D;
  a->nst = a->T * Hq * 2;
  float **bufs[9] = {&a->q, &a->k, &a->v, &a->dout, &a->o, &a->stats, &a->dq, &a->dk, &a->dv};
  size_t ns[9] = {a->nq, a->nk, a->nk, a->nq, a->nq, a->nst, a->nq, a->nk, a->nk};
  for (int i = 0; i < 9; i++) *bufs[i] = calloc(ns[i] + 1, sizeof(float));
  a->shq[0] = a->shk[0] = a->shs[0] = (int64_t)a->T;
  a->shq[1] = (int64_t)(Hq * D);
  a->shk[1] = (int64_t)(Hkv * D);
  a->shs[1] = (int64_t)Hq;
  a->shs[2] = 2;
  view(&a->tq, a->q, 2, a->shq);
  view(&a->tk, a->k, 2, a->shk);
  view(&a->tv, a->v, 2, a->shk);
  view(&a->tdo, a->dout, 2, a->shq);
  view(&a->to, a->o, 2, a->shq);
  view(&a->tst, a->stats, 3, a->shs);
  view(&a->tdq, a->dq, 2, a->shq);
  view(&a->tdk, a->dk, 2, a->shk);
  view(&a->tdv, a->dv, 2, a->shk);
}

static void ap_free(aprob *a) {
  float *bufs[9] = {a->q, a->k, a->v, a->dout, a->o, a->stats, a->dq, a->dk, a->dv};
  for (int i = 0; i < 9; i++) free(bufs[i]);
}

static void fill(bxt_rng *r, float *x, size_t n, double sigma) {
  for (size_t i = 0; i < n; i++) x[i] = (float)(sigma * bxt_normal(r));
}

static void ap_fill(bxt_rng *r, aprob *a, double sq) {
  fill(r, a->q, a->nq, sq);
  fill(r, a->k, a->nk, 1.0);
  fill(r, a->v, a->nk, 1.0);
  fill(r, a->dout, a->nq, 1.0);
}

static bx_status ap_fwd(aprob *a, int threads) {
  bx_attention_opts o = BX_ATTENTION_OPTS_DEFAULT;
  o.num_threads = threads;
  return bx_attention_forward(&a->tq, &a->tk, &a->tv, (int64_t)a->s.L, (int64_t)a->s.Hq,
                              (int64_t)a->s.Hkv, (int64_t)a->s.D, &a->to, &a->tst, &o);
}

static bx_status ap_bwd(aprob *a, int threads) {
  bx_attention_opts o = BX_ATTENTION_OPTS_DEFAULT;
  o.num_threads = threads;
  return bx_attention_backward(&a->tdo, &a->tq, &a->tk, &a->tv, &a->tst, (int64_t)a->s.L,
                               (int64_t)a->s.Hq, (int64_t)a->s.Hkv, (int64_t)a->s.D, &a->tdq,
                               &a->tdk, &a->tdv, &o);
}

/* bitwise equality of n floats; reports the first difference */
static int same_bits(const float *got, const float *want, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (bxt_fbits(got[i]) != bxt_fbits(want[i])) {
      CHECK(0, "%s: element %zu is %a (0x%08x), want %a (0x%08x)", what, i, (double)got[i],
            (unsigned)bxt_fbits(got[i]), (double)want[i], (unsigned)bxt_fbits(want[i]));
      return 0;
    }
  return 1;
}

static double *to_double(const float *x, size_t n) {
  double *d = malloc((n + 1) * sizeof(double));
  for (size_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

/* the kernel's outputs against the chain (bits) and the fp64 reference (bound) */
static void check_problem(aprob *a, const char *what) {
  char w[224];
  /* chain */
  float *o = malloc((a->nq + 1) * 4), *st = malloc((a->nst + 1) * 4), *dq = malloc((a->nq + 1) * 4),
        *dk = malloc((a->nk + 1) * 4), *dv = malloc((a->nk + 1) * 4);
  achain_forward(&a->s, a->q, a->k, a->v, o, st);
  snprintf(w, sizeof w, "%s: o vs the documented order", what);
  same_bits(a->o, o, a->nq, w);
  snprintf(w, sizeof w, "%s: stats vs the documented order", what);
  same_bits(a->stats, st, a->nst, w);
  achain_backward(&a->s, a->dout, a->q, a->k, a->v, a->stats, dq, dk, dv);
  snprintf(w, sizeof w, "%s: dq vs the documented order", what);
  same_bits(a->dq, dq, a->nq, w);
  snprintf(w, sizeof w, "%s: dk vs the documented order", what);
  same_bits(a->dk, dk, a->nk, w);
  snprintf(w, sizeof w, "%s: dv vs the documented order", what);
  same_bits(a->dv, dv, a->nk, w);
  free(o);
  free(st);
  free(dq);
  free(dk);
  free(dv);
  /* fp64 */
  double *q = to_double(a->q, a->nq), *k = to_double(a->k, a->nk), *v = to_double(a->v, a->nk),
         *d = to_double(a->dout, a->nq);
  double *buf = malloc((4 * a->nq + 4 * a->nk + 8) * sizeof(double));
  aref_out r = {buf, buf + a->nq, buf + 2 * a->nq, buf + 2 * a->nq + a->nk,
                buf + 2 * a->nq + 2 * a->nk, buf + 3 * a->nq + 2 * a->nk,
                buf + 4 * a->nq + 2 * a->nk, buf + 4 * a->nq + 3 * a->nk};
  aref_run(&a->s, q, k, v, d, &r);
  const float *got[4] = {a->o, a->dq, a->dk, a->dv};
  const double *want[4] = {r.o, r.dq, r.dk, r.dv}, *bound[4] = {r.bo, r.bdq, r.bdk, r.bdv};
  size_t n[4] = {a->nq, a->nq, a->nk, a->nk};
  static const char *nm[4] = {"o", "dq", "dk", "dv"};
  for (int t = 0; t < 4; t++) {
    double worst = 0;
    for (size_t i = 0; i < n[t]; i++) {
      double err = fabs((double)got[t][i] - want[t][i]);
      if (!CHECK(err <= bound[t][i], "%s: %s[%zu] = %.9g, fp64 %.17g, error %.3g > bound %.3g",
                 what, nm[t], i, (double)got[t][i], want[t][i], err, bound[t][i]))
        break;
      if (bound[t][i] > 0 && err / bound[t][i] > worst) worst = err / bound[t][i];
    }
    if (getenv("BXT_ATTN_RATIO")) printf("  %s %s worst err/bound %.3g\n", what, nm[t], worst);
  }
  free(q);
  free(k);
  free(v);
  free(d);
  free(buf);
}

#endif /* BX_TEST_ATTENTION_PROB_H */
