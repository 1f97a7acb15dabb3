/*
 * test_adamw.c — bx_adamw_step bit for bit against a slow scalar
 * implementation of the formula in bitexact_train.h (the bias corrections
 * with glibc's pow, the fused steps with libm's fmaf: independent of
 * bx_pow_det and of the library's code), over many steps and option sets,
 * thread counts and ISAs; argument errors are named and write nothing.
 * (torch itself: dev/adamw_vs_torch.py, docs/train_math.md.)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "harness.h"
#include "tests.h"
#include "util.h"

/* A NaN stored is the canonical 0x7fc00000 (docs/design.md, "NaN"). */
static float ref_canon(float x) {
  uint32_t b = 0x7fc00000u;
  if (x == x) return x;
  memcpy(&x, &b, 4);
  return x;
}

static void ref_step(float *p, const float *g, float *m, float *v, size_t n, int64_t step,
                     const bx_adamw_opts *o) {
  double bc1 = 1.0 - pow(o->beta1, (double)step);
  double bc2 = 1.0 - pow(o->beta2, (double)step);
  float step_size = (float)(-(o->lr / bc1));
  float bc2s = (float)sqrt(bc2);
  float w = (float)(1.0 - o->beta1);
  for (size_t i = 0; i < n; i++) {
    float pi = p[i];
    if (o->weight_decay != 0.0) pi = pi * (float)(1.0 - o->lr * o->weight_decay);
    float d = g[i] - m[i];
    m[i] = fabsf(w) < 0.5f ? fmaf(w, d, m[i]) : fmaf(w - 1.0f, d, g[i]);
    float vb = v[i] * (float)o->beta2;
    float cg = (float)(1.0 - o->beta2) * g[i];
    v[i] = fmaf(cg, g[i], vb);
    float denom = sqrtf(v[i]) / bc2s + (float)o->eps;
    p[i] = ref_canon(pi + (step_size * m[i]) / denom);
    m[i] = ref_canon(m[i]);
    v[i] = ref_canon(v[i]);
  }
}

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static long count_diff(const float *a, const float *b, size_t n) {
  long d = 0;
  for (size_t i = 0; i < n; i++)
    if (fbits(a[i]) != fbits(b[i])) d++;
  return d;
}

void test_adamw_vs_reference(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const bx_adamw_opts cases[] = {
      BX_ADAMW_OPTS_DEFAULT,
      {sizeof(bx_adamw_opts), 3e-4, 0.8, 0.95, 1e-6, 0.1, 0},
      {sizeof(bx_adamw_opts), 1e-2, 0.3, 0.5, 0.0, 0.0, 0}, /* lerp weight >= 0.5 */
      {sizeof(bx_adamw_opts), 1.0, 0.0, 0.0, 1e-3, 0.5, 0},
  };
  const size_t n = 40009;
  bxt_tensor P, G, M, V;
  bxt_tensor_alloc(&P, REF_F32, n);
  bxt_tensor_alloc(&G, REF_F32, n);
  bxt_tensor_alloc(&M, REF_F32, n);
  bxt_tensor_alloc(&V, REF_F32, n);
  float *rp = malloc(n * 4), *rm = malloc(n * 4), *rv = malloc(n * 4);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    bxt_fill_gradient(&r, &P, 1.0);
    memcpy(rp, P.buf, n * 4);
    memset(M.buf, 0, n * 4);
    memset(V.buf, 0, n * 4);
    memset(rm, 0, n * 4);
    memset(rv, 0, n * 4);
    for (int64_t t = 1; t <= 12; t++) {
      bxt_fill_gradient(&r, &G, ldexp(1.0, (int)bxt_below(&r, 30) - 20));
      if (t == 5) ((float *)G.buf)[7] = 0.0f;
      bx_adamw_opts o = cases[c];
      o.num_threads = 1 + (int)(t % 3);
      CHECK_STATUS(bx_adamw_step(&P.t, &G.t, &M.t, &V.t, t, &o), BX_OK, "case %zu step %lld", c,
                   (long long)t);
      ref_step(rp, G.buf, rm, rv, n, t, &o);
      long dp = count_diff(P.buf, rp, n), dm = count_diff(M.buf, rm, n),
           dv = count_diff(V.buf, rv, n);
      CHECK(dp == 0 && dm == 0 && dv == 0,
            "case %zu step %lld: %ld param, %ld exp_avg, %ld exp_avg_sq elements differ", c,
            (long long)t, dp, dm, dv);
    }
  }
  free(rp);
  free(rm);
  free(rv);
  bxt_tensor_free(&P);
  bxt_tensor_free(&G);
  bxt_tensor_free(&M);
  bxt_tensor_free(&V);
}

void test_adamw_threads_and_isa(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const size_t n = 70001;
  bxt_tensor P0, G, P, M, V;
  bxt_tensor_alloc(&P0, REF_F32, n);
  bxt_tensor_alloc(&G, REF_F32, n);
  bxt_tensor_alloc(&P, REF_F32, n);
  bxt_tensor_alloc(&M, REF_F32, n);
  bxt_tensor_alloc(&V, REF_F32, n);
  bxt_fill_gradient(&r, &P0, 1.0);
  bxt_fill_gradient(&r, &G, 1e-3);
  /* special values among them (the vector loops see them in every lane position) */
  const uint32_t special[] = {0x7fc00000u, 0xff812345u, 0x7f800000u, 0xff800000u, 0x80000000u,
                              0x00000001u, 0x807fffffu, 0x7f7fffffu};
  for (size_t i = 0; i < 64; i++) {
    uint32_t b = special[i % 8];
    memcpy(&((float *)G.buf)[1000 + 37 * i + i % 5], &b, 4);
    memcpy(&((float *)P0.buf)[3000 + 41 * i + i % 7], &b, 4);
  }
  float *want[2][3] = {{malloc(n * 4), malloc(n * 4), malloc(n * 4)},
                       {malloc(n * 4), malloc(n * 4), malloc(n * 4)}};
  int first[2] = {1, 1};
  const int threads[] = {1, 2, 5};
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    bxt_force(isa);
    for (size_t ti = 0; ti < 6; ti++) {
      int cfg = (int)(ti % 2); /* 1: no weight decay (the mul skipped), lerp weight >= 0.5 */
      memcpy(P.buf, P0.buf, n * 4);
      memset(M.buf, 0, n * 4);
      memset(V.buf, 0, n * 4);
      bx_adamw_opts o = BX_ADAMW_OPTS_DEFAULT;
      o.num_threads = threads[ti / 2];
      if (cfg) {
        o.weight_decay = 0.0;
        o.beta1 = 0.3;
      }
      for (int64_t t = 1; t <= 3; t++)
        CHECK_STATUS(bx_adamw_step(&P.t, &G.t, &M.t, &V.t, t, &o), BX_OK, "step");
      float *got[3] = {P.buf, M.buf, V.buf};
      for (int k = 0; k < 3; k++) {
        if (first[cfg]) memcpy(want[cfg][k], got[k], n * 4);
        else
          CHECK(count_diff(got[k], want[cfg][k], n) == 0,
                "isa %s, %d threads, options %d: tensor %d differs", bxt_isa(isa),
                threads[ti / 2], cfg, k);
      }
      first[cfg] = 0;
    }
  }
  bxt_force(-1);
  for (int c = 0; c < 2; c++)
    for (int k = 0; k < 3; k++) free(want[c][k]);
  bxt_tensor_free(&P0);
  bxt_tensor_free(&G);
  bxt_tensor_free(&P);
  bxt_tensor_free(&M);
  bxt_tensor_free(&V);
}

void test_adamw_errors(void) {
  const size_t n = 100;
  bxt_tensor P, G, M, V, D;
  bxt_tensor_alloc(&P, REF_F32, n);
  bxt_tensor_alloc(&G, REF_F32, n);
  bxt_tensor_alloc(&M, REF_F32, n);
  bxt_tensor_alloc(&V, REF_F32, n);
  bxt_tensor_alloc(&D, REF_F64, n);
  for (size_t i = 0; i < n; i++) {
    ((float *)P.buf)[i] = 1.0f + (float)i;
    ((float *)G.buf)[i] = 0.5f;
    ((float *)M.buf)[i] = 0.25f;
    ((float *)V.buf)[i] = 0.125f;
  }
  float copy[4][100];
  bxt_tensor *all[4] = {&P, &G, &M, &V};
  for (int k = 0; k < 4; k++) memcpy(copy[k], all[k]->buf, n * 4);
  bx_adamw_opts o;
#define NOTHING_WRITTEN(what)                                                  \
  for (int k = 0; k < 4; k++)                                                  \
    CHECK(memcmp(copy[k], all[k]->buf, n * 4) == 0, "%s: tensor %d written", what, k)
  CHECK_STATUS(bx_adamw_step(&P.t, &G.t, &P.t, &V.t, 1, NULL), BX_ELAYOUT, "exp_avg is param");
  CHECK(strstr(bx_last_error(), "overlaps") != NULL, "%s", bx_last_error());
  CHECK_STATUS(bx_adamw_step(&P.t, &G.t, &M.t, &D.t, 1, NULL), BX_EDTYPE, "fp64 exp_avg_sq");
  CHECK(strstr(bx_last_error(), "tensor 3") != NULL, "%s", bx_last_error());
  CHECK_STATUS(bx_adamw_step(&P.t, NULL, &M.t, &V.t, 1, NULL), BX_EINVAL, "NULL grad");
  CHECK_STATUS(bx_adamw_step(&P.t, &G.t, &M.t, &V.t, 0, NULL), BX_EINVAL, "step 0");
  CHECK(strstr(bx_last_error(), "step") != NULL, "%s", bx_last_error());
  G.shape[0] = 99;
  CHECK_STATUS(bx_adamw_step(&P.t, &G.t, &M.t, &V.t, 1, NULL), BX_EINVAL, "shape");
  G.shape[0] = 100;
  o = (bx_adamw_opts)BX_ADAMW_OPTS_DEFAULT;
  o.lr = NAN;
  CHECK_STATUS(bx_adamw_step(&P.t, &G.t, &M.t, &V.t, 1, &o), BX_EINVAL, "lr NaN");
  CHECK(strstr(bx_last_error(), "lr") != NULL, "%s", bx_last_error());
  o = (bx_adamw_opts)BX_ADAMW_OPTS_DEFAULT;
  o.beta2 = 1.0;
  CHECK_STATUS(bx_adamw_step(&P.t, &G.t, &M.t, &V.t, 1, &o), BX_EINVAL, "beta2 1");
  CHECK(strstr(bx_last_error(), "beta2") != NULL, "%s", bx_last_error());
  o = (bx_adamw_opts)BX_ADAMW_OPTS_DEFAULT;
  o.eps = -1.0;
  CHECK_STATUS(bx_adamw_step(&P.t, &G.t, &M.t, &V.t, 1, &o), BX_EINVAL, "eps < 0");
  o = (bx_adamw_opts)BX_ADAMW_OPTS_DEFAULT;
  o.weight_decay = INFINITY;
  CHECK_STATUS(bx_adamw_step(&P.t, &G.t, &M.t, &V.t, 1, &o), BX_EINVAL, "wd Inf");
  o = (bx_adamw_opts)BX_ADAMW_OPTS_DEFAULT;
  o.struct_size = 8;
  CHECK_STATUS(bx_adamw_step(&P.t, &G.t, &M.t, &V.t, 1, &o), BX_EINVAL, "struct_size");
  CHECK(strstr(bx_last_error(), "struct_size") != NULL, "%s", bx_last_error());
  NOTHING_WRITTEN("failing calls");
  CHECK_STATUS(bx_adamw_step(&P.t, &G.t, &M.t, &V.t, 1, NULL), BX_OK, "good call");
  CHECK(memcmp(copy[0], P.buf, n * 4) != 0, "a good call changes param");
#undef NOTHING_WRITTEN
  bxt_tensor_free(&P);
  bxt_tensor_free(&G);
  bxt_tensor_free(&M);
  bxt_tensor_free(&V);
  bxt_tensor_free(&D);
}
