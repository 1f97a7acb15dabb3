/*
 * test_moe.c — the MoE router and token dispatch (bitexact_train.h, "MoE
 * router and token dispatch"): the router's discrete choices against a
 * direct transcription of transformers' route_tokens_to_experts (sorts,
 * masks, ties to the lower id), its weights and gradients bit for bit
 * against a scalar re-implementation of the documented order and within a
 * stated bound of an fp64 reference (whose gradient is checked by central
 * finite differences), batch invariance, thread counts, the chunk counts,
 * the bias update, the dispatch plan against a sort, the order invariant
 * to a split over simulated ranks, the gathers against transformers'
 * expert loop, and bad input (named errors, nothing written).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "dl_view.h"
#include "harness.h"
#include "tests.h"
#include "util.h"

/* ---- small owned tensors -------------------------------------------------- */

typedef struct tens {
  DLTensor t;
  int64_t shape[2];
  void *buf;
  size_t n, es;
} tens;

static void tens_make(tens *x, DLDataTypeCode code, int bits, int ndim, int64_t d0, int64_t d1) {
  memset(x, 0, sizeof *x);
  x->shape[0] = d0;
  x->shape[1] = d1;
  x->n = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
  x->es = (size_t)bits / 8;
  x->buf = calloc(x->n + 1, x->es);
  x->t = bxt_view(x->buf, code, bits, ndim, x->shape);
}
static void f32_2(tens *x, int64_t a, int64_t b) { tens_make(x, kDLFloat, 32, 2, a, b); }
static void f32_1(tens *x, int64_t a) { tens_make(x, kDLFloat, 32, 1, a, 1); }
static void i64_2(tens *x, int64_t a, int64_t b) { tens_make(x, kDLInt, 64, 2, a, b); }
static void i64_1(tens *x, int64_t a) { tens_make(x, kDLInt, 64, 1, a, 1); }
static void i32_2(tens *x, int64_t a, int64_t b) { tens_make(x, kDLInt, 32, 2, a, b); }
static void tens_free(tens *x) { free(x->buf); }
static float *F(tens *x) { return x->buf; }
static int64_t *L(tens *x) { return x->buf; }
static int64_t id_at(const tens *x, size_t i) {
  return x->es == 4 ? ((const int32_t *)x->buf)[i] : ((const int64_t *)x->buf)[i];
}
/* A view of rows [r0, r0 + n) of a 2-D tensor (shares the buffer). */
static DLTensor rows_view(tens *x, int64_t r0, int64_t n, int64_t *shape) {
  DLTensor v = x->t;
  shape[0] = n;
  shape[1] = x->shape[1];
  v.shape = shape;
  v.byte_offset = (uint64_t)r0 * (uint64_t)x->shape[1] * x->es;
  return v;
}

/* ---- the transcription of transformers' routing (discrete choices) -------- */

typedef struct vi {
  float v;
  int64_t i;
} vi;
/* descending value, ties the lower index */
static int vi_cmp(const void *a, const void *b) {
  const vi *x = a, *y = b;
  if (x->v > y->v) return -1;
  if (x->v < y->v) return 1;
  return x->i < y->i ? -1 : x->i > y->i;
}
static int i64_cmp(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

typedef struct rcfg {
  int64_t E, G, kg, k;
  int norm;
  double rsf;
} rcfg;

/* scores (fp32, bx_sigmoid_f32: the elementwise kernel checked against
 * MPFR in test_math) -> ids ascending. Step by step as the Python:
 * group_scores = topk(2).sum, group_idx = topk(topk_group), mask,
 * masked_fill(-inf), topk(top_k); every topk a full sort here. */
static void ref_choose(const rcfg *c, const float *logit, const float *bias, int64_t *ids) {
  int64_t S = c->E / c->G;
  float *s = malloc(sizeof(float) * (size_t)c->E), *ch = malloc(sizeof(float) * (size_t)c->E);
  vi *tmp = malloc(sizeof(vi) * (size_t)c->E);
  vi *gsc = malloc(sizeof(vi) * (size_t)c->G);
  for (int64_t e = 0; e < c->E; e++) {
    s[e] = bx_sigmoid_f32(logit[e]);
    ch[e] = s[e] + bias[e];
  }
  for (int64_t g = 0; g < c->G; g++) {
    for (int64_t i = 0; i < S; i++) tmp[i] = (vi){ch[g * S + i], i};
    qsort(tmp, (size_t)S, sizeof(vi), vi_cmp);
    gsc[g] = (vi){tmp[0].v + tmp[1].v, g};
  }
  qsort(gsc, (size_t)c->G, sizeof(vi), vi_cmp);
  unsigned char *mask = calloc((size_t)c->G, 1);
  for (int64_t r = 0; r < c->kg; r++) mask[gsc[r].i] = 1;
  for (int64_t e = 0; e < c->E; e++) tmp[e] = (vi){mask[e / S] ? ch[e] : -INFINITY, e};
  qsort(tmp, (size_t)c->E, sizeof(vi), vi_cmp);
  for (int64_t j = 0; j < c->k; j++) ids[j] = tmp[j].i;
  qsort(ids, (size_t)c->k, sizeof(int64_t), i64_cmp);
  free(mask);
  free(gsc);
  free(tmp);
  free(ch);
  free(s);
}

/* The documented roundings (bitexact_train.h), written out again. */
static void doc_weights(const rcfg *c, const float *logit, const int64_t *ids, float *w) {
  float rsf = (float)c->rsf;
  double D = 0.0;
  for (int64_t j = 0; j < c->k; j++) D = D + (double)bx_sigmoid_f32(logit[ids[j]]);
  D = D + 1e-20;
  for (int64_t j = 0; j < c->k; j++) {
    float s = bx_sigmoid_f32(logit[ids[j]]);
    float q = c->norm ? (float)((double)s / D) : s;
    w[j] = q * rsf;
  }
}

static void doc_backward(const rcfg *c, const float *logit, const int64_t *ids, const float *dw,
                         float *dl) {
  double r = (double)(float)c->rsf, D = 0.0, P = 0.0, g[64], s[64], m[64];
  for (int64_t e = 0; e < c->E; e++) dl[e] = 0.0f;
  for (int64_t j = 0; j < c->k; j++) {
    s[j] = (double)bx_sigmoid_f32(logit[ids[j]]);
    m[j] = (double)bx_sigmoid_f32(-logit[ids[j]]);
    g[j] = (double)dw[j] * r;
  }
  for (int64_t j = 0; j < c->k; j++) D = D + s[j];
  D = D + 1e-20;
  for (int64_t j = 0; j < c->k; j++) P = P + g[j] * s[j];
  for (int64_t j = 0; j < c->k; j++) {
    double d = c->norm ? (g[j] - P / D) / D : g[j];
    dl[ids[j]] = (float)(d * (s[j] * m[j]));
  }
}

/* fp64 reference: out_j(l) = rsf * sig(l_j) / (sum sig + 1e-20) (or rsf * sig). */
static double sig64(double x) { return 1.0 / (1.0 + exp(-x)); }
static void ref64_weights(const rcfg *c, const double *l, const int64_t *ids, double *w) {
  double D = 1e-20;
  for (int64_t j = 0; j < c->k; j++) D += sig64(l[ids[j]]);
  for (int64_t j = 0; j < c->k; j++)
    w[j] = c->rsf * (c->norm ? sig64(l[ids[j]]) / D : sig64(l[ids[j]]));
}
/* its gradient from the Jacobian: d out_j / d l_i = rsf (delta_ij / D - s_j / D^2) s_i (1 - s_i) */
static void ref64_backward(const rcfg *c, const double *l, const int64_t *ids, const double *dw,
                           double *dl, double *scale) {
  double D = 1e-20, s[64];
  for (int64_t j = 0; j < c->k; j++) D += (s[j] = sig64(l[ids[j]]));
  for (int64_t i = 0; i < c->k; i++) {
    double acc = 0.0, mag = 0.0;
    for (int64_t j = 0; j < c->k; j++) {
      double jac = c->norm ? c->rsf * ((i == j) / D - s[j] / (D * D)) : c->rsf * (i == j);
      acc += dw[j] * jac;
      mag += fabs(dw[j]) * fabs(c->rsf) * ((i == j) / D + s[j] / (D * D));
    }
    double ds = s[i] * (1.0 - s[i]);
    dl[i] = acc * ds;
    scale[i] = (c->norm ? mag : fabs(dw[i] * c->rsf)) * ds;
  }
}

static void fill_logits(bxt_rng *r, float *l, size_t n, double spread) {
  for (size_t i = 0; i < n; i++) l[i] = (float)(spread * bxt_normal(r));
}

static const rcfg CONFIGS[] = {
    {16, 4, 2, 4, 1, 2.5},  /* GLM-4.5 like, small */
    {8, 1, 1, 2, 1, 1.0},   /* one group */
    {12, 3, 3, 5, 0, 1.5},  /* every group kept, no normalisation */
    {32, 8, 3, 8, 1, 2.5},  /* GLM-4.5's n_group 1 is common; DeepSeek-V3 style */
    {6, 3, 1, 2, 1, 0.75},  /* groups of 2 */
};
#define NCONF (sizeof CONFIGS / sizeof CONFIGS[0])

static bx_moe_router_opts ropts(const rcfg *c, int threads) {
  bx_moe_router_opts o = BX_MOE_ROUTER_OPTS_DEFAULT;
  o.num_threads = threads;
  o.n_group = c->G;
  o.topk_group = c->kg;
  o.norm_topk_prob = c->norm;
  o.routed_scaling_factor = c->rsf;
  return o;
}

/* ---- router tests ---------------------------------------------------------- */

void test_moe_router_vs_reference(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (size_t ci = 0; ci < NCONF; ci++) {
    const rcfg *c = &CONFIGS[ci];
    int64_t T = 200, E = c->E, k = c->k;
    tens lg, bias, ids, w, ids32, w2;
    f32_2(&lg, T, E);
    f32_1(&bias, E);
    i64_2(&ids, T, k);
    i32_2(&ids32, T, k);
    f32_2(&w, T, k);
    f32_2(&w2, T, k);
    fill_logits(&r, F(&lg), lg.n, 3.0);
    for (int64_t e = 0; e < E; e++) F(&bias)[e] = (float)(0.3 * bxt_normal(&r));
    /* a few rows with coarse values: ties in scores and group scores */
    for (int64_t t = 0; t < 40; t++)
      for (int64_t e = 0; e < E; e++) F(&lg)[t * E + e] = (float)((int)bxt_below(&r, 3) - 1);
    for (int64_t t = 40; t < 50; t++)
      for (int64_t e = 0; e < E; e++) F(&lg)[t * E + e] = -30.0f; /* all choices ~ bias */
    /* special values (bits only): +-Inf, huge, subnormal, all -Inf (D = 1e-20) */
    static const float SPECIAL[] = {INFINITY, -INFINITY, 1e30f, -1e30f, 0x1p-149f, -0x1p-149f,
                                    -100.0f, 100.0f, -0.0f, 88.0f};
    for (int64_t t = 50; t < 60; t++)
      for (int64_t e = 0; e < E; e++)
        F(&lg)[t * E + e] = t == 59 ? -INFINITY : SPECIAL[bxt_below(&r, 10)];
    bx_moe_router_opts o = ropts(c, 0);
    CHECK_STATUS(bx_moe_router_forward(&lg.t, &bias.t, &ids.t, &w.t, 7, NULL, &o), BX_OK, "cfg %zu", ci);
    CHECK_STATUS(bx_moe_router_forward(&lg.t, &bias.t, &ids32.t, &w2.t, 7, NULL, &o), BX_OK, "cfg %zu int32", ci);
    for (int64_t t = 0; t < T && bxt_failures() < 10; t++) {
      int64_t want[64];
      float wb[64];
      ref_choose(c, F(&lg) + t * E, F(&bias), want);
      doc_weights(c, F(&lg) + t * E, want, wb);
      double l64[64], w64[64];
      for (int64_t e = 0; e < E; e++) l64[e] = F(&lg)[t * E + e];
      ref64_weights(c, l64, want, w64);
      for (int64_t j = 0; j < k; j++) {
        CHECK(L(&ids)[t * k + j] == want[j], "cfg %zu token %lld slot %lld: id %lld, want %lld", ci,
              (long long)t, (long long)j, (long long)L(&ids)[t * k + j], (long long)want[j]);
        CHECK(id_at(&ids32, (size_t)(t * k + j)) == want[j], "int32 ids differ");
        CHECK_BITS_F(F(&w)[t * k + j], wb[j], "cfg %zu token %lld slot %lld weight", ci, (long long)t,
                     (long long)j);
        CHECK_BITS_F(F(&w2)[t * k + j], wb[j], "int32 run weight");
        /* fp64 bound: sigmoid, q and the product each 1/2 ulp, rsf's fp32
         * rounding 1/2 ulp, D's inputs 1/2 ulp each: 6 * 2^-24 relative
         * (scores here are normal numbers) */
        double err = fabs((double)F(&w)[t * k + j] - w64[j]);
        if (t >= 50 && t < 60) continue; /* special values: bits only */
        CHECK(err <= 6.0 * 0x1p-24 * fabs(w64[j]), "cfg %zu token %lld weight %a vs fp64 %a", ci,
              (long long)t, (double)F(&w)[t * k + j], w64[j]);
      }
    }
    tens_free(&lg); tens_free(&bias); tens_free(&ids); tens_free(&ids32); tens_free(&w); tens_free(&w2);
  }
}

void test_moe_router_ties(void) {
  /* E 16, 4 groups of 4, keep 2 groups, k 4 */
  rcfg c = {16, 4, 2, 4, 1, 1.0};
  bx_moe_router_opts o = ropts(&c, 1);
  tens lg, bias, ids, w;
  f32_2(&lg, 3, 16);
  f32_1(&bias, 16);
  i64_2(&ids, 3, 4);
  f32_2(&w, 3, 4);
  /* token 0: all equal: groups 0 and 1, experts 0..3 */
  /* token 1: group 3 and 2 best (tie in group score), experts 12 and 13
   * tie with 8: lower ids first */
  for (int e = 0; e < 16; e++) F(&lg)[16 + e] = e >= 8 ? 1.0f : -1.0f;
  /* token 2: every choice negative (bias -2): groups 0,1 kept (all tie);
   * the masked experts score -Inf and never win (transformers 5.24; its
   * 4.x/5.0 masked_fill(0.0) chose the masked experts 8..11 here): the
   * best four of c' are experts 0..3 */
  for (int e = 0; e < 16; e++) F(&lg)[32 + e] = 0.0f;
  CHECK_STATUS(bx_moe_router_forward(&lg.t, &bias.t, &ids.t, &w.t, 1, NULL, &o), BX_OK, "ties");
  int64_t w0[4] = {0, 1, 2, 3}, w1[4] = {8, 9, 10, 11};
  for (int j = 0; j < 4; j++) CHECK(L(&ids)[j] == w0[j], "token 0 slot %d: %lld", j, (long long)L(&ids)[j]);
  for (int j = 0; j < 4; j++) CHECK(L(&ids)[4 + j] == w1[j], "token 1 slot %d: %lld", j, (long long)L(&ids)[4 + j]);
  CHECK_BITS_F(F(&w)[0], 0.25f, "equal weights normalise to 1/4");
  for (int e = 0; e < 16; e++) F(&bias)[e] = -2.0f;
  CHECK_STATUS(bx_moe_router_forward(&lg.t, &bias.t, &ids.t, &w.t, 1, NULL, &o), BX_OK, "ties");
  for (int j = 0; j < 4; j++) CHECK(L(&ids)[8 + j] == w0[j], "token 2 (masked lose) slot %d: %lld", j,
                                    (long long)L(&ids)[8 + j]);
  int64_t ref[4];
  ref_choose(&c, F(&lg) + 32, F(&bias), ref);
  for (int j = 0; j < 4; j++) CHECK(ref[j] == w0[j], "transcription agrees: masked experts lose");
  tens_free(&lg); tens_free(&bias); tens_free(&ids); tens_free(&w);
}

void test_moe_router_backward(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (size_t ci = 0; ci < NCONF; ci++) {
    const rcfg *c = &CONFIGS[ci];
    int64_t T = 64, E = c->E, k = c->k;
    tens lg, bias, ids, w, dw, dl;
    f32_2(&lg, T, E); f32_1(&bias, E); i64_2(&ids, T, k); f32_2(&w, T, k);
    f32_2(&dw, T, k); f32_2(&dl, T, E);
    fill_logits(&r, F(&lg), lg.n, 2.0);
    fill_logits(&r, F(&dw), dw.n, 1.0);
    bx_moe_router_opts o = ropts(c, 0);
    CHECK_STATUS(bx_moe_router_forward(&lg.t, &bias.t, &ids.t, &w.t, 64, NULL, &o), BX_OK, "fwd");
    CHECK_STATUS(bx_moe_router_backward(&lg.t, &ids.t, &dw.t, &dl.t, &o), BX_OK, "bwd");
    for (int64_t t = 0; t < T && bxt_failures() < 10; t++) {
      float want[64];
      const int64_t *id = L(&ids) + t * k;
      doc_backward(c, F(&lg) + t * E, id, F(&dw) + t * k, want);
      for (int64_t e = 0; e < E; e++)
        CHECK_BITS_F(F(&dl)[t * E + e], want[e], "cfg %zu token %lld expert %lld dlogit", ci,
                     (long long)t, (long long)e);
      double l64[64], dw64[64], g64[64], sc[64];
      for (int64_t e = 0; e < E; e++) l64[e] = F(&lg)[t * E + e];
      for (int64_t j = 0; j < k; j++) dw64[j] = F(&dw)[t * k + j];
      ref64_backward(c, l64, id, dw64, g64, sc);
      for (int64_t j = 0; j < k; j++) {
        /* fp32 inputs perturbed by <= 2^-24 relative (the sigmoid's
         * rounding, rsf's) move each term by a few 2^-24 of its size: the
         * bound is 8 * 2^-24 of the sum of magnitudes, plus the final
         * fp32 rounding */
        double got = F(&dl)[t * E + id[j]];
        CHECK(fabs(got - g64[j]) <= 8.0 * 0x1p-24 * sc[j] + 0x1p-24 * fabs(g64[j]) + 0x1p-140,
              "cfg %zu token %lld slot %lld: %a vs fp64 %a (scale %a)", ci, (long long)t,
              (long long)j, got, g64[j], sc[j]);
        /* central finite difference of the fp64 forward */
        double h = 1e-5, lp[64], lm[64], wp[64], wm[64];
        memcpy(lp, l64, sizeof lp);
        memcpy(lm, l64, sizeof lm);
        lp[id[j]] += h;
        lm[id[j]] -= h;
        ref64_weights(c, lp, id, wp);
        ref64_weights(c, lm, id, wm);
        double fd = 0.0;
        for (int64_t a = 0; a < k; a++) fd += dw64[a] * (wp[a] - wm[a]) / (2.0 * h);
        CHECK(fabs(fd - g64[j]) <= 1e-7 * (1.0 + sc[j]), "cfg %zu token %lld: fd %a vs analytic %a",
              ci, (long long)t, fd, g64[j]);
      }
    }
    tens_free(&lg); tens_free(&bias); tens_free(&ids); tens_free(&w); tens_free(&dw); tens_free(&dl);
  }
}

void test_moe_router_invariance(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const rcfg *c = &CONFIGS[3];
  int64_t T = 301, E = c->E, k = c->k, C = 16;
  int64_t nch = (T + C - 1) / C;
  tens lg, bias, ids[4], w[4], cn[4], dw, dl[4];
  f32_2(&lg, T, E); f32_1(&bias, E); f32_2(&dw, T, k);
  fill_logits(&r, F(&lg), lg.n, 2.0);
  fill_logits(&r, F(&bias), bias.n, 0.1);
  fill_logits(&r, F(&dw), dw.n, 1.0);
  static const int threads[4] = {1, 2, 3, 8};
  for (int i = 0; i < 4; i++) {
    i64_2(&ids[i], T, k); f32_2(&w[i], T, k); i64_2(&cn[i], nch, E); f32_2(&dl[i], T, E);
    bx_moe_router_opts o = ropts(c, threads[i]);
    CHECK_STATUS(bx_moe_router_forward(&lg.t, &bias.t, &ids[i].t, &w[i].t, C, &cn[i].t, &o), BX_OK, "fwd");
    CHECK_STATUS(bx_moe_router_backward(&lg.t, &ids[i].t, &dw.t, &dl[i].t, &o), BX_OK, "bwd");
    if (i) {
      CHECK(!memcmp(ids[i].buf, ids[0].buf, ids[0].n * 8), "ids differ at %d threads", threads[i]);
      CHECK(!memcmp(w[i].buf, w[0].buf, w[0].n * 4), "weights differ at %d threads", threads[i]);
      CHECK(!memcmp(cn[i].buf, cn[0].buf, cn[0].n * 8), "counts differ at %d threads", threads[i]);
      CHECK(!memcmp(dl[i].buf, dl[0].buf, dl[0].n * 4), "dlogits differ at %d threads", threads[i]);
    }
  }
  /* counts: direct */
  for (int64_t ch = 0; ch < nch; ch++)
    for (int64_t e = 0; e < E; e++) {
      int64_t n = 0;
      for (int64_t t = ch * C; t < T && t < (ch + 1) * C; t++)
        for (int64_t j = 0; j < k; j++) n += L(&ids[0])[t * k + j] == e;
      CHECK(L(&cn[0])[ch * E + e] == n, "chunk %lld expert %lld count", (long long)ch, (long long)e);
    }
  /* batch invariance: rows [a, a+m) alone give the same bits */
  for (int rep = 0; rep < 40; rep++) {
    int64_t a = (int64_t)bxt_below(&r, (uint64_t)T), m = 1 + (int64_t)bxt_below(&r, (uint64_t)(T - a));
    if (rep < 5) { a = 0; m = rep + 1; }
    int64_t s0[2], s1[2], s2[2], s3[2];
    DLTensor vl = rows_view(&lg, a, m, s0), vdw = rows_view(&dw, a, m, s3);
    tens i1, w1, d1;
    i64_2(&i1, m, k); f32_2(&w1, m, k); f32_2(&d1, m, E);
    bx_moe_router_opts o = ropts(c, 2);
    CHECK_STATUS(bx_moe_router_forward(&vl, &bias.t, &i1.t, &w1.t, C, NULL, &o), BX_OK, "sub");
    CHECK_STATUS(bx_moe_router_backward(&vl, &i1.t, &vdw, &d1.t, &o), BX_OK, "sub bwd");
    CHECK(!memcmp(i1.buf, L(&ids[0]) + a * k, i1.n * 8), "ids of rows [%lld, +%lld) alone", (long long)a, (long long)m);
    CHECK(!memcmp(w1.buf, F(&w[0]) + a * k, w1.n * 4), "weights of rows [%lld, +%lld) alone", (long long)a, (long long)m);
    CHECK(!memcmp(d1.buf, F(&dl[0]) + a * E, d1.n * 4), "dlogits of rows [%lld, +%lld) alone", (long long)a, (long long)m);
    (void)s1; (void)s2;
    tens_free(&i1); tens_free(&w1); tens_free(&d1);
  }
  for (int i = 0; i < 4; i++) { tens_free(&ids[i]); tens_free(&w[i]); tens_free(&cn[i]); tens_free(&dl[i]); }
  tens_free(&lg); tens_free(&bias); tens_free(&dw);
}

void test_moe_bias_update(void) {
  tens b, c, c2;
  f32_1(&b, 3);
  i64_1(&c, 3);
  F(&b)[0] = 0.5f; F(&b)[1] = -0.0f; F(&b)[2] = 1.0f;
  L(&c)[0] = 3; L(&c)[1] = 1; L(&c)[2] = 2; /* mean 2 */
  CHECK_STATUS(bx_moe_bias_update(&b.t, &c.t, 1e-3), BX_OK, "update");
  CHECK_BITS_F(F(&b)[0], 0.5f - 1e-3f, "over-loaded expert: bias down");
  CHECK_BITS_F(F(&b)[1], -0.0f + 1e-3f, "under-loaded expert: bias up");
  CHECK_BITS_F(F(&b)[2], 1.0f, "at the mean: unchanged");
  /* 2-D: rows summed; mean 7/3 not an integer: no division needed */
  i64_2(&c2, 2, 3);
  int64_t v[6] = {1, 0, 3, 1, 2, 0}; /* sums 2, 2, 3: total 7 */
  memcpy(c2.buf, v, sizeof v);
  float before[3];
  memcpy(before, b.buf, sizeof before);
  CHECK_STATUS(bx_moe_bias_update(&b.t, &c2.t, 0.25), BX_OK, "2-D");
  CHECK_BITS_F(F(&b)[0], before[0] + 0.25f, "2 < 7/3");
  CHECK_BITS_F(F(&b)[2], before[2] - 0.25f, "3 > 7/3");
  /* errors: nothing written */
  memcpy(before, b.buf, sizeof before);
  L(&c)[1] = -1;
  CHECK_STATUS(bx_moe_bias_update(&b.t, &c.t, 1e-3), BX_EINVAL, "negative count");
  CHECK(strstr(bx_last_error(), "counts") != NULL, "names counts: %s", bx_last_error());
  L(&c)[1] = 1;
  CHECK_STATUS(bx_moe_bias_update(&b.t, &c.t, -1.0), BX_EINVAL, "negative rate");
  CHECK_STATUS(bx_moe_bias_update(&b.t, &c.t, NAN), BX_EINVAL, "NaN rate");
  CHECK_STATUS(bx_moe_bias_update(&b.t, NULL, 1e-3), BX_EINVAL, "NULL counts");
  CHECK_STATUS(bx_moe_bias_update(&b.t, &b.t, 1e-3), BX_EDTYPE, "fp32 counts");
  L(&c)[0] = INT64_MAX / 2;
  L(&c)[2] = INT64_MAX / 2;
  CHECK_STATUS(bx_moe_bias_update(&b.t, &c.t, 1e-3), BX_EINVAL, "sum overflow");
  CHECK(!memcmp(before, b.buf, sizeof before), "bias unchanged on error");
  tens_free(&b); tens_free(&c); tens_free(&c2);
}

void test_moe_router_bad_input(void) {
  rcfg c = {16, 4, 2, 4, 1, 2.5};
  int64_t T = 5, E = 16, k = 4;
  tens lg, bias, ids, w, cn, dw, dl, lgd;
  f32_2(&lg, T, E); f32_1(&bias, E); i64_2(&ids, T, k); f32_2(&w, T, k); i64_2(&cn, 3, E);
  f32_2(&dw, T, k); f32_2(&dl, T, E); tens_make(&lgd, kDLFloat, 64, 2, T, E);
  bx_moe_router_opts o = ropts(&c, 0);
  CHECK_STATUS(bx_moe_router_forward(&lg.t, &bias.t, &ids.t, &w.t, 2, &cn.t, &o), BX_OK, "valid");
  CHECK_STATUS(bx_moe_router_backward(&lg.t, &ids.t, &dw.t, &dl.t, &o), BX_OK, "valid bwd");
  memset(ids.buf, 0x5a, ids.n * 8);
  memset(w.buf, 0x5a, w.n * 4);
  memset(cn.buf, 0x5a, cn.n * 8);
  memset(dl.buf, 0x5a, dl.n * 4);
  tens s_ids, s_w, s_cn, s_dl;
  i64_2(&s_ids, T, k); f32_2(&s_w, T, k); i64_2(&s_cn, 3, E); f32_2(&s_dl, T, E);
  memcpy(s_ids.buf, ids.buf, ids.n * 8); memcpy(s_w.buf, w.buf, w.n * 4);
  memcpy(s_cn.buf, cn.buf, cn.n * 8); memcpy(s_dl.buf, dl.buf, dl.n * 4);
#define FWD(o_, lgp, cnp, C_, st_, word)                                                         \
  do {                                                                                           \
    CHECK_STATUS(bx_moe_router_forward(lgp, &bias.t, &ids.t, &w.t, C_, cnp, o_), st_, "%s", word); \
    CHECK(strstr(bx_last_error(), "bx_moe_router_forward") && strstr(bx_last_error(), word),     \
          "message names %s: %s", word, bx_last_error());                                        \
  } while (0)
  bx_moe_router_opts b = o;
  b.struct_size = 3;
  FWD(&b, &lg.t, &cn.t, 2, BX_EINVAL, "struct_size");
  b = o; b.n_group = 5;
  FWD(&b, &lg.t, &cn.t, 2, BX_EINVAL, "not divisible by n_group");
  b = o; b.topk_group = 5;
  FWD(&b, &lg.t, &cn.t, 2, BX_EINVAL, "topk_group");
  b = o; b.n_group = 16; b.topk_group = 1;
  FWD(&b, &lg.t, &cn.t, 2, BX_EINVAL, "experts per group");
  b = o; b.topk_group = 1; /* 4 experts available, k = 4: fine; k = 5 is not */
  FWD(&b, &lg.t, &cn.t, 2, BX_OK, "bx_moe_router_forward");
  memcpy(ids.buf, s_ids.buf, ids.n * 8); memcpy(w.buf, s_w.buf, w.n * 4); memcpy(cn.buf, s_cn.buf, cn.n * 8);
  tens ids5, w5;
  i64_2(&ids5, T, 5); f32_2(&w5, T, 5);
  CHECK_STATUS(bx_moe_router_forward(&lg.t, &bias.t, &ids5.t, &w5.t, 2, NULL, &b), BX_EINVAL, "k > available");
  CHECK(strstr(bx_last_error(), "k = 5") != NULL, "k named: %s", bx_last_error());
  b = o; b.routed_scaling_factor = INFINITY;
  FWD(&b, &lg.t, &cn.t, 2, BX_EINVAL, "routed_scaling_factor");
  b = o; b.num_threads = -1;
  FWD(&b, &lg.t, &cn.t, 2, BX_EINVAL, "num_threads");
  FWD(&o, NULL, &cn.t, 2, BX_EINVAL, "tensor 0 (logits)");
  FWD(&o, &lgd.t, &cn.t, 2, BX_EDTYPE, "tensor 0 (logits)");
  FWD(&o, &lg.t, &cn.t, 0, BX_EINVAL, "chunk_tokens");
  FWD(&o, &lg.t, &cn.t, 3, BX_EINVAL, "tensor 5 (counts)"); /* ceil(5/3) = 2 rows, not 3 */
  lg.t.device.device_type = kDLCUDA;
  FWD(&o, &lg.t, &cn.t, 2, BX_EDEVICE, "tensor 0 (logits)");
  lg.t.device.device_type = kDLCPU;
  int64_t st2[2] = {1, 1};
  lg.t.strides = st2;
  FWD(&o, &lg.t, &cn.t, 2, BX_ELAYOUT, "tensor 0 (logits)");
  lg.t.strides = NULL;
  F(&lg)[7] = NAN;
  FWD(&o, &lg.t, &cn.t, 2, BX_ENONFINITE, "tensor 0 (logits)");
  F(&lg)[7] = 0.0f;
  F(&bias)[3] = INFINITY;
  FWD(&o, &lg.t, &cn.t, 2, BX_ENONFINITE, "tensor 1 (bias)");
  F(&bias)[3] = 0.0f;
  /* overlap: weights inside the counts buffer */
  DLTensor wo = w.t;
  wo.data = cn.buf;
  CHECK_STATUS(bx_moe_router_forward(&lg.t, &bias.t, &ids.t, &wo, 2, &cn.t, &o), BX_ELAYOUT, "overlap");
  CHECK(strstr(bx_last_error(), "overlaps") != NULL, "overlap named: %s", bx_last_error());
  CHECK(!memcmp(ids.buf, s_ids.buf, ids.n * 8) && !memcmp(w.buf, s_w.buf, w.n * 4) &&
            !memcmp(cn.buf, s_cn.buf, cn.n * 8),
        "nothing written by a failing forward");
  /* backward: ids out of range, duplicate */
  L(&ids)[0] = 0; L(&ids)[1] = 1; L(&ids)[2] = 2; L(&ids)[3] = 16;
  for (size_t i = 4; i < ids.n; i++) L(&ids)[i] = (int64_t)(i % 4);
  CHECK_STATUS(bx_moe_router_backward(&lg.t, &ids.t, &dw.t, &dl.t, &o), BX_EINVAL, "id 16");
  CHECK(strstr(bx_last_error(), "tensor 1 (topk_ids)") && strstr(bx_last_error(), "outside"),
        "%s", bx_last_error());
  L(&ids)[3] = 1;
  CHECK_STATUS(bx_moe_router_backward(&lg.t, &ids.t, &dw.t, &dl.t, &o), BX_EINVAL, "duplicate");
  CHECK(strstr(bx_last_error(), "chosen twice") != NULL, "%s", bx_last_error());
  L(&ids)[3] = 3;
  CHECK_STATUS(bx_moe_router_backward(&lg.t, &ids.t, &w5.t, &dl.t, &o), BX_EINVAL, "dweights shape");
  CHECK(strstr(bx_last_error(), "tensor 2 (dweights)") != NULL, "%s", bx_last_error());
  CHECK_STATUS(bx_moe_router_backward(&lg.t, &ids.t, &dw.t, &dw.t, &o), BX_EINVAL, "dlogits shape");
  b = o; b.struct_size = 0;
  CHECK_STATUS(bx_moe_router_backward(&lg.t, &ids.t, &dw.t, &dl.t, &b), BX_EINVAL, "struct_size");
  CHECK(!memcmp(dl.buf, s_dl.buf, dl.n * 4), "nothing written by a failing backward");
#undef FWD
  tens_free(&lg); tens_free(&bias); tens_free(&ids); tens_free(&w); tens_free(&cn); tens_free(&dw);
  tens_free(&dl); tens_free(&lgd); tens_free(&ids5); tens_free(&w5);
  tens_free(&s_ids); tens_free(&s_w); tens_free(&s_cn); tens_free(&s_dl);
}

/* ---- dispatch ------------------------------------------------------------- */

/* Random routing: k distinct experts per token, ascending. */
static void random_ids(bxt_rng *r, int64_t *ids, int64_t T, int64_t E, int64_t k) {
  int64_t perm[256];
  for (int64_t t = 0; t < T; t++) {
    for (int64_t e = 0; e < E; e++) perm[e] = e;
    for (int64_t j = 0; j < k; j++) {
      int64_t x = j + (int64_t)bxt_below(r, (uint64_t)(E - j));
      int64_t tmp = perm[j]; perm[j] = perm[x]; perm[x] = tmp;
    }
    qsort(perm, (size_t)k, sizeof(int64_t), i64_cmp);
    memcpy(ids + t * k, perm, (size_t)k * sizeof(int64_t));
  }
}

typedef struct plan {
  tens off, rm, pos;
} plan;
static bx_status make_plan(plan *p, tens *ids, tens *gid, int64_t E, int threads) {
  int64_t T = ids->shape[0], k = ids->shape[1];
  i64_1(&p->off, E + 1); i64_2(&p->rm, T * k, 2); i64_2(&p->pos, T, k);
  bx_moe_dispatch_opts o = BX_MOE_DISPATCH_OPTS_DEFAULT;
  o.num_threads = threads;
  return bx_moe_dispatch_plan(&ids->t, gid ? &gid->t : NULL, &p->off.t, &p->rm.t, &p->pos.t, &o);
}
static void plan_free(plan *p) { tens_free(&p->off); tens_free(&p->rm); tens_free(&p->pos); }

typedef struct key {
  int64_t e, g, t, j;
} key;
static int key_cmp(const void *a, const void *b) {
  const key *x = a, *y = b;
  if (x->e != y->e) return x->e < y->e ? -1 : 1;
  return x->g < y->g ? -1 : x->g > y->g;
}

void test_moe_dispatch_plan(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 20; rep++) {
    int64_t E = 2 + (int64_t)bxt_below(&r, 30), k = 1 + (int64_t)bxt_below(&r, (uint64_t)(E < 8 ? E : 8));
    int64_t T = (int64_t)bxt_below(&r, 100);
    tens ids, gid;
    i64_2(&ids, T, k); i64_1(&gid, T);
    random_ids(&r, L(&ids), T, E, k);
    int64_t g = (int64_t)bxt_below(&r, 5);
    for (int64_t t = 0; t < T; t++) L(&gid)[t] = (g += 1 + (int64_t)bxt_below(&r, 4));
    plan p;
    CHECK_STATUS(make_plan(&p, &ids, &gid, E, 0), BX_OK, "plan rep %d", rep);
    key *ks = malloc(sizeof(key) * (size_t)(T * k + 1));
    for (int64_t t = 0; t < T; t++)
      for (int64_t j = 0; j < k; j++) ks[t * k + j] = (key){L(&ids)[t * k + j], L(&gid)[t], t, j};
    qsort(ks, (size_t)(T * k), sizeof(key), key_cmp);
    for (int64_t i = 0; i < T * k; i++) {
      CHECK(L(&p.rm)[2 * i] == ks[i].t && L(&p.rm)[2 * i + 1] == ks[i].j, "rep %d row %lld", rep, (long long)i);
      CHECK(L(&p.pos)[ks[i].t * k + ks[i].j] == i, "pos inverse");
    }
    for (int64_t e = 0; e <= E; e++) {
      int64_t n = 0;
      for (int64_t i = 0; i < T * k; i++) n += ks[i].e < e;
      CHECK(L(&p.off)[e] == n, "offsets[%lld]", (long long)e);
    }
    /* int32 ids and NULL token ids give the same plan */
    tens i32;
    i32_2(&i32, T, k);
    for (size_t i = 0; i < i32.n; i++) ((int32_t *)i32.buf)[i] = (int32_t)L(&ids)[i];
    plan q;
    CHECK_STATUS(make_plan(&q, &i32, NULL, E, 3), BX_OK, "int32 plan");
    CHECK(!memcmp(q.rm.buf, p.rm.buf, p.rm.n * 8) && !memcmp(q.off.buf, p.off.buf, p.off.n * 8),
          "int32 ids, NULL token ids: same plan");
    plan_free(&q); tens_free(&i32);
    free(ks);
    plan_free(&p); tens_free(&ids); tens_free(&gid);
  }
}

/* Tokens of a global batch spread over P simulated ranks (any subset per
 * rank, ascending within it); each rank plans locally; the rows of expert
 * e reach its owner from every rank, in a random rank order; the owner's
 * bx_moe_dispatch_order gives the single-rank order, and the chunk ranges
 * are those of the global plan. */
void test_moe_dispatch_ranks(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  int64_t T = 157, E = 12, k = 3, H = 5, C = 10;
  tens ids, x, gid;
  i64_2(&ids, T, k); f32_2(&x, T, H); i64_1(&gid, T);
  random_ids(&r, L(&ids), T, E, k);
  fill_logits(&r, F(&x), x.n, 1.0);
  for (int64_t t = 0; t < T; t++) L(&gid)[t] = t;
  plan gp;
  CHECK_STATUS(make_plan(&gp, &ids, &gid, E, 0), BX_OK, "global plan");
  tens gx;
  f32_2(&gx, T * k, H);
  CHECK_STATUS(bx_moe_permute(&x.t, &gp.rm.t, &gx.t, NULL), BX_OK, "global permute");
  for (int rep = 0; rep < 6; rep++) {
    int P = 1 + (int)bxt_below(&r, 5);
    int *rank_of = malloc(sizeof(int) * (size_t)T);
    for (int64_t t = 0; t < T; t++) rank_of[t] = rep == 0 ? (int)(t * P / T) : (int)bxt_below(&r, (uint64_t)P);
    /* received rows: (expert, global id, the row's activations) */
    int64_t n = T * k, got = 0;
    tens re, rg;
    i64_1(&re, n); i64_1(&rg, n);
    float *rx = malloc(sizeof(float) * (size_t)(n * H));
    int order_of_ranks[8];
    for (int q = 0; q < P; q++) order_of_ranks[q] = q;
    bxt_shuffle(&r, order_of_ranks, (size_t)P, sizeof(int));
    for (int qi = 0; qi < P; qi++) {
      int q = order_of_ranks[qi];
      int64_t Tq = 0;
      for (int64_t t = 0; t < T; t++) Tq += rank_of[t] == q;
      tens li, lx, lg;
      i64_2(&li, Tq, k); f32_2(&lx, Tq, H); i64_1(&lg, Tq);
      int64_t u = 0;
      for (int64_t t = 0; t < T; t++)
        if (rank_of[t] == q) {
          memcpy(L(&li) + u * k, L(&ids) + t * k, (size_t)k * 8);
          memcpy(F(&lx) + u * H, F(&x) + t * H, (size_t)H * 4);
          L(&lg)[u++] = t;
        }
      plan lp;
      CHECK_STATUS(make_plan(&lp, &li, &lg, E, 2), BX_OK, "rank %d plan", q);
      tens lxp;
      f32_2(&lxp, Tq * k, H);
      CHECK_STATUS(bx_moe_permute(&lx.t, &lp.rm.t, &lxp.t, NULL), BX_OK, "rank permute");
      /* send each expert's segment (contiguous) */
      for (int64_t i = 0; i < Tq * k; i++) {
        int64_t t = L(&lp.rm)[2 * i], j = L(&lp.rm)[2 * i + 1];
        L(&re)[got] = L(&li)[t * k + j];
        L(&rg)[got] = L(&lg)[t];
        memcpy(rx + got * H, F(&lxp) + i * H, (size_t)H * 4);
        got++;
      }
      plan_free(&lp); tens_free(&li); tens_free(&lx); tens_free(&lg); tens_free(&lxp);
    }
    CHECK(got == n, "all rows received");
    tens off, ord;
    i64_1(&off, E + 1); i64_1(&ord, n);
    CHECK_STATUS(bx_moe_dispatch_order(&re.t, &rg.t, &off.t, &ord.t), BX_OK, "order");
    CHECK(!memcmp(off.buf, gp.off.buf, off.n * 8), "rep %d (P %d): offsets as one rank's", rep, P);
    for (int64_t i = 0; i < n && bxt_failures() < 10; i++) {
      int64_t src = L(&ord)[i];
      int64_t t = L(&gp.rm)[2 * i];
      CHECK(L(&rg)[src] == t && L(&re)[src] == L(&ids)[t * k + L(&gp.rm)[2 * i + 1]],
            "rep %d row %lld: the global order", rep, (long long)i);
      CHECK(!memcmp(rx + src * H, F(&gx) + i * H, (size_t)H * 4), "row %lld activations", (long long)i);
    }
    /* chunk ranges of each expert's rows: contiguous, as counted directly */
    int64_t nch = (T + C - 1) / C;
    for (int64_t e = 0; e < E; e++) {
      int64_t b0 = L(&off)[e], m = L(&off)[e + 1] - b0;
      tens eg, bd;
      i64_1(&eg, m); i64_1(&bd, nch + 1);
      for (int64_t i = 0; i < m; i++) L(&eg)[i] = L(&rg)[L(&ord)[b0 + i]];
      CHECK_STATUS(bx_moe_expert_chunks(&eg.t, C, 0, &bd.t), BX_OK, "chunks of expert %lld", (long long)e);
      for (int64_t c = 0; c < nch; c++)
        for (int64_t i = L(&bd)[c]; i < L(&bd)[c + 1]; i++)
          CHECK(L(&eg)[i] / C == c, "expert %lld row %lld in chunk %lld", (long long)e, (long long)i, (long long)c);
      CHECK(L(&bd)[0] == 0 && L(&bd)[nch] == m, "ranges cover the rows");
      tens_free(&eg); tens_free(&bd);
    }
    /* duplicate (expert, token) refused, nothing written */
    if (n > 1) {
      int64_t save = L(&rg)[1], se = L(&re)[1];
      L(&rg)[1] = L(&rg)[0];
      L(&re)[1] = L(&re)[0];
      memset(ord.buf, 0x77, ord.n * 8);
      CHECK_STATUS(bx_moe_dispatch_order(&re.t, &rg.t, &off.t, &ord.t), BX_EINVAL, "duplicate row");
      CHECK(strstr(bx_last_error(), "twice") != NULL, "%s", bx_last_error());
      CHECK(L(&ord)[0] == 0x7777777777777777LL, "order not written");
      L(&rg)[1] = save;
      L(&re)[1] = se;
    }
    tens_free(&off); tens_free(&ord); tens_free(&re); tens_free(&rg); free(rx); free(rank_of);
  }
  plan_free(&gp); tens_free(&ids); tens_free(&x); tens_free(&gid); tens_free(&gx);
}

/* transformers' CPU Glm4MoeNaiveMoe combine, transcribed: final = zeros;
 * for each expert ascending, for its tokens (torch.where order: token
 * ascending): final[t] += y * w; then + shared. */
static void ref_combine(const tens *ids, const tens *w, const float *y_of_tj /* [T,k,H] */,
                        const float *shared, int64_t E, int64_t H, float *out) {
  int64_t T = ids->shape[0], k = ids->shape[1];
  memset(out, 0, sizeof(float) * (size_t)(T * H));
  for (int64_t e = 0; e < E; e++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t j = 0; j < k; j++)
        if (id_at(ids, (size_t)(t * k + j)) == e)
          for (int64_t h = 0; h < H; h++) {
            float p = y_of_tj[(t * k + j) * H + h] * ((const float *)w->buf)[t * k + j];
            out[t * H + h] = out[t * H + h] + p;
          }
  if (shared)
    for (int64_t i = 0; i < T * H; i++) out[i] = out[i] + shared[i];
}

void test_moe_permute_roundtrip(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  int64_t T = 77, E = 10, k = 4, H = 33;
  tens ids, x, xp, y, w, sh, out[4], dout, dyp[4], dw[4], dxp, dx[4];
  i64_2(&ids, T, k); f32_2(&x, T, H); f32_2(&xp, T * k, H); f32_2(&y, T * k, H);
  f32_2(&w, T, k); f32_2(&sh, T, H); f32_2(&dout, T, H); f32_2(&dxp, T * k, H);
  random_ids(&r, L(&ids), T, E, k);
  fill_logits(&r, F(&x), x.n, 1.0);
  fill_logits(&r, F(&y), y.n, 1.0);
  fill_logits(&r, F(&w), w.n, 0.5);
  fill_logits(&r, F(&sh), sh.n, 1.0);
  fill_logits(&r, F(&dout), dout.n, 1.0);
  fill_logits(&r, F(&dxp), dxp.n, 1.0);
  plan p;
  CHECK_STATUS(make_plan(&p, &ids, NULL, E, 0), BX_OK, "plan");
  CHECK_STATUS(bx_moe_permute(&x.t, &p.rm.t, &xp.t, NULL), BX_OK, "permute");
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < k; j++)
      CHECK(!memcmp(F(&xp) + L(&p.pos)[t * k + j] * H, F(&x) + t * H, (size_t)H * 4),
            "x_perm[pos[%lld][%lld]] == x[%lld]", (long long)t, (long long)j, (long long)t);
  /* y of (t, j) in token-slot order for the transcription */
  float *ytj = malloc(sizeof(float) * (size_t)(T * k * H)), *want = malloc(sizeof(float) * (size_t)(T * H));
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < k; j++)
      memcpy(ytj + (t * k + j) * H, F(&y) + L(&p.pos)[t * k + j] * H, (size_t)H * 4);
  static const int threads[4] = {1, 2, 3, 8};
  for (int i = 0; i < 4; i++) {
    f32_2(&out[i], T, H); f32_2(&dyp[i], T * k, H); f32_2(&dw[i], T, k); f32_2(&dx[i], T, H);
    bx_moe_dispatch_opts o = BX_MOE_DISPATCH_OPTS_DEFAULT;
    o.num_threads = threads[i];
    CHECK_STATUS(bx_moe_unpermute(&y.t, &w.t, &p.rm.t, &p.pos.t, i & 1 ? NULL : &sh.t, &out[i].t, &o), BX_OK, "unpermute");
    CHECK_STATUS(bx_moe_unpermute_backward(&dout.t, &y.t, &w.t, &p.rm.t, &p.pos.t, &dyp[i].t, &dw[i].t, &o), BX_OK, "unpermute bwd");
    CHECK_STATUS(bx_moe_permute_backward(&dxp.t, &p.rm.t, &p.pos.t, &dx[i].t, &o), BX_OK, "permute bwd");
    ref_combine(&ids, &w, ytj, i & 1 ? NULL : F(&sh), E, H, want);
    CHECK(!memcmp(want, out[i].buf, out[i].n * 4), "%d threads: unpermute = transformers' expert loop%s",
          threads[i], i & 1 ? "" : " + shared");
    if (i >= 2) {
      CHECK(!memcmp(out[i].buf, out[i - 2].buf, out[i].n * 4), "unpermute thread invariance");
      CHECK(!memcmp(dyp[i].buf, dyp[0].buf, dyp[0].n * 4), "dy_perm thread invariance");
      CHECK(!memcmp(dw[i].buf, dw[0].buf, dw[0].n * 4), "dweights thread invariance");
      CHECK(!memcmp(dx[i].buf, dx[0].buf, dx[0].n * 4), "dx thread invariance");
    }
  }
  for (int64_t t = 0; t < T && bxt_failures() < 10; t++) {
    for (int64_t j = 0; j < k; j++) {
      int64_t row = L(&p.pos)[t * k + j];
      float acc = 0.0f;
      double d64 = 0.0, mag = 0.0;
      for (int64_t h = 0; h < H; h++) {
        acc = fmaf(F(&dout)[t * H + h], F(&y)[row * H + h], acc);
        d64 += (double)F(&dout)[t * H + h] * F(&y)[row * H + h];
        mag += fabs((double)F(&dout)[t * H + h] * F(&y)[row * H + h]);
        float dy = F(&w)[t * k + j] * F(&dout)[t * H + h];
        CHECK_BITS_F(F(&dyp[0])[row * H + h], dy, "dy_perm[%lld][%lld]", (long long)row, (long long)h);
      }
      CHECK_BITS_F(F(&dw[0])[t * k + j], acc, "dweights[%lld][%lld]: the fmaf chain", (long long)t, (long long)j);
      /* a chain of H fmas: at most H half-ulps of the running magnitude */
      CHECK(fabs((double)acc - d64) <= (double)H * 0x1p-24 * mag, "dweights vs fp64");
    }
    for (int64_t h = 0; h < H; h++) {
      float s = 0.0f;
      for (int64_t j = 0; j < k; j++) s = s + F(&dxp)[L(&p.pos)[t * k + j] * H + h];
      CHECK_BITS_F(F(&dx[0])[t * H + h], s, "dx[%lld][%lld]", (long long)t, (long long)h);
    }
  }
  /* round trip: k = 1, weight 1: unpermute(permute(x)) == x bitwise; and
   * permute_backward(permute(x)) == x (0 + x: -0 becomes +0) */
  {
    tens i1, w1, xp1, o1;
    i64_2(&i1, T, 1); f32_2(&w1, T, 1); f32_2(&xp1, T, H); f32_2(&o1, T, H);
    random_ids(&r, L(&i1), T, E, 1);
    for (int64_t t = 0; t < T; t++) F(&w1)[t] = 1.0f;
    plan q;
    CHECK_STATUS(make_plan(&q, &i1, NULL, E, 0), BX_OK, "plan k=1");
    CHECK_STATUS(bx_moe_permute(&x.t, &q.rm.t, &xp1.t, NULL), BX_OK, "permute");
    CHECK_STATUS(bx_moe_unpermute(&xp1.t, &w1.t, &q.rm.t, &q.pos.t, NULL, &o1.t, NULL), BX_OK, "unpermute");
    int same = 1;
    for (size_t i = 0; i < o1.n; i++) same &= F(&o1)[i] == F(&x)[i];
    CHECK(same, "unpermute(permute(x)) == x");
    CHECK_STATUS(bx_moe_permute_backward(&xp1.t, &q.rm.t, &q.pos.t, &o1.t, NULL), BX_OK, "pb");
    same = 1;
    for (size_t i = 0; i < o1.n; i++) same &= bxt_fbits(F(&o1)[i] + 0.0f) == bxt_fbits(F(&x)[i] + 0.0f);
    CHECK(same, "permute_backward(permute(x)) == x for k = 1");
    plan_free(&q); tens_free(&i1); tens_free(&w1); tens_free(&xp1); tens_free(&o1);
  }
  free(ytj); free(want);
  for (int i = 0; i < 4; i++) { tens_free(&out[i]); tens_free(&dyp[i]); tens_free(&dw[i]); tens_free(&dx[i]); }
  plan_free(&p);
  tens_free(&ids); tens_free(&x); tens_free(&xp); tens_free(&y); tens_free(&w); tens_free(&sh);
  tens_free(&dout); tens_free(&dxp);
}

void test_moe_dispatch_bad_input(void) {
  int64_t T = 6, E = 5, k = 2, H = 3;
  tens ids, gid, x, xp, w, out, dout, dyp, dw;
  i64_2(&ids, T, k); i64_1(&gid, T); f32_2(&x, T, H); f32_2(&xp, T * k, H); f32_2(&w, T, k);
  f32_2(&out, T, H); f32_2(&dout, T, H); f32_2(&dyp, T * k, H); f32_2(&dw, T, k);
  for (int64_t t = 0; t < T; t++) {
    L(&ids)[t * k] = t % E;
    L(&ids)[t * k + 1] = (t + 1) % E;
    L(&gid)[t] = 10 * t;
  }
  plan p;
  CHECK_STATUS(make_plan(&p, &ids, &gid, E, 0), BX_OK, "valid");
  unsigned char snap[3][512];
  memcpy(snap[0], p.off.buf, p.off.n * 8); memcpy(snap[1], p.rm.buf, p.rm.n * 8);
  memcpy(snap[2], p.pos.buf, p.pos.n * 8);
  bx_moe_dispatch_opts o = BX_MOE_DISPATCH_OPTS_DEFAULT;
#define PLAN(st_, word)                                                                          \
  do {                                                                                           \
    CHECK_STATUS(bx_moe_dispatch_plan(&ids.t, &gid.t, &p.off.t, &p.rm.t, &p.pos.t, &o), st_,       \
                 "%s", word);                                                                    \
    CHECK(strstr(bx_last_error(), "bx_moe_dispatch_plan") && strstr(bx_last_error(), word),      \
          "message names %s: %s", word, bx_last_error());                                        \
  } while (0)
  L(&ids)[3] = E;
  PLAN(BX_EINVAL, "tensor 0 (topk_ids)");
  L(&ids)[3] = L(&ids)[2];
  PLAN(BX_EINVAL, "chosen twice");
  L(&ids)[3] = -1;
  PLAN(BX_EINVAL, "outside");
  L(&ids)[3] = (L(&ids)[2] + 1) % E;
  L(&gid)[3] = L(&gid)[2];
  PLAN(BX_EINVAL, "a duplicate");
  L(&gid)[3] = L(&gid)[2] - 1;
  PLAN(BX_EINVAL, "not ascending");
  L(&gid)[3] = 30;
  o.struct_size = 1;
  PLAN(BX_EINVAL, "struct_size");
  o.struct_size = sizeof o;
  p.pos.t.dtype.bits = 32;
  PLAN(BX_EDTYPE, "tensor 4 (pos)");
  p.pos.t.dtype.bits = 64;
  p.rm.shape[0] = 3;
  PLAN(BX_EINVAL, "tensor 3 (row_map)");
  p.rm.shape[0] = T * k;
  DLTensor alias = p.pos.t;
  alias.data = p.rm.buf;
  CHECK_STATUS(bx_moe_dispatch_plan(&ids.t, &gid.t, &p.off.t, &p.rm.t, &alias, &o), BX_ELAYOUT, "overlap");
  CHECK(!memcmp(snap[0], p.off.buf, p.off.n * 8) && !memcmp(snap[1], p.rm.buf, p.rm.n * 8) &&
            !memcmp(snap[2], p.pos.buf, p.pos.n * 8),
        "nothing written by a failing plan");
#undef PLAN
  /* a broken plan is refused by the gathers, nothing written */
  memset(out.buf, 0x33, out.n * 4);
  memcpy(snap[0], out.buf, out.n * 4);
  int64_t save = L(&p.pos)[5];
  L(&p.pos)[5] = L(&p.pos)[4];
  CHECK_STATUS(bx_moe_unpermute(&xp.t, &w.t, &p.rm.t, &p.pos.t, NULL, &out.t, NULL), BX_EINVAL, "bad plan");
  CHECK(strstr(bx_last_error(), "bx_moe_unpermute: tensor 3 (pos)") != NULL, "%s", bx_last_error());
  CHECK_STATUS(bx_moe_permute_backward(&xp.t, &p.rm.t, &p.pos.t, &out.t, NULL), BX_EINVAL, "bad plan");
  CHECK_STATUS(bx_moe_unpermute_backward(&dout.t, &xp.t, &w.t, &p.rm.t, &p.pos.t, NULL, &dw.t, NULL), BX_EINVAL, "bad plan");
  L(&p.pos)[5] = save;
  CHECK_STATUS(bx_moe_unpermute_backward(&dout.t, &xp.t, &w.t, &p.rm.t, &p.pos.t, NULL, NULL, NULL), BX_EINVAL, "both NULL");
  CHECK_STATUS(bx_moe_unpermute(&xp.t, &w.t, &p.rm.t, &p.pos.t, &out.t, &out.t, NULL), BX_ELAYOUT, "in place");
  CHECK(strstr(bx_last_error(), "overlaps") != NULL, "%s", bx_last_error());
  CHECK_STATUS(bx_moe_unpermute(&xp.t, &w.t, &p.rm.t, &p.pos.t, NULL, &dw.t, NULL), BX_EINVAL, "out shape");
  CHECK(strstr(bx_last_error(), "tensor 5 (out)") != NULL, "%s", bx_last_error());
  CHECK_STATUS(bx_moe_unpermute(NULL, &w.t, &p.rm.t, &p.pos.t, NULL, &out.t, NULL), BX_EINVAL, "NULL");
  CHECK(strstr(bx_last_error(), "tensor 0 (y_perm) is NULL") != NULL, "%s", bx_last_error());
  CHECK(!memcmp(snap[0], out.buf, out.n * 4), "out not written on error");
  L(&p.rm)[0] = T;
  memset(xp.buf, 0x44, xp.n * 4);
  memcpy(snap[1], xp.buf, xp.n * 4);
  CHECK_STATUS(bx_moe_permute(&x.t, &p.rm.t, &xp.t, NULL), BX_EINVAL, "row_map out of range");
  CHECK(strstr(bx_last_error(), "tensor 1 (row_map)") != NULL, "%s", bx_last_error());
  CHECK(!memcmp(snap[1], xp.buf, xp.n * 4), "x_perm not written on error");
  L(&p.rm)[0] = 0;
  /* expert chunks */
  tens eg, bd;
  i64_1(&eg, 3); i64_1(&bd, 3);
  L(&eg)[0] = 2; L(&eg)[1] = 5; L(&eg)[2] = 9;
  CHECK_STATUS(bx_moe_expert_chunks(&eg.t, 5, 0, &bd.t), BX_OK, "chunks");
  CHECK(L(&bd)[0] == 0 && L(&bd)[1] == 1 && L(&bd)[2] == 3, "bounds %lld %lld %lld",
        (long long)L(&bd)[0], (long long)L(&bd)[1], (long long)L(&bd)[2]);
  CHECK_STATUS(bx_moe_expert_chunks(&eg.t, 5, 1, &bd.t), BX_EINVAL, "id below first_chunk");
  CHECK_STATUS(bx_moe_expert_chunks(&eg.t, 0, 0, &bd.t), BX_EINVAL, "C = 0");
  L(&eg)[1] = 2;
  CHECK_STATUS(bx_moe_expert_chunks(&eg.t, 5, 0, &bd.t), BX_EINVAL, "duplicate");
  tens_free(&eg); tens_free(&bd);
  plan_free(&p);
  tens_free(&ids); tens_free(&gid); tens_free(&x); tens_free(&xp); tens_free(&w); tens_free(&out);
  tens_free(&dout); tens_free(&dyp); tens_free(&dw);
}
