/*
 * test_layers.c — the layer kernels of bitexact_train.h (RMSNorm, RoPE,
 * SwiGLU): each forward and backward bit for bit against a scalar
 * re-implementation of the documented order written here (fmaf from libm,
 * the public scalar functions bx_rsqrt_f32 / bx_silu_f32 / bx_sigmoid_f32 /
 * bx_sin_f32 / bx_cos_f32 and bx_pow_det, which their own tests check
 * against MPFR), against an fp64 reference within a stated bound, the fp64
 * reference's gradients against central finite differences, batch
 * invariance (a prefix of the tokens gives the prefix of the outputs),
 * thread counts 1/2/3/8 and every ISA, and bad input (named errors,
 * nothing written).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "harness.h"
#include "test_layers.h"
#include "tests.h"
#include "util.h"

/* ==== RMSNorm ============================================================ */

/* the documented order, one row */
static void ref_rms_fwd(const float *x, const float *w, size_t h, float eps, float *y, float *rs) {
  float acc = 0.0f;
  for (size_t j = 0; j < h; j++) acc = fmaf(x[j], x[j], acc);
  float r = bx_rsqrt_f32(acc / (float)h + eps);
  for (size_t j = 0; j < h; j++) y[j] = w[j] * (x[j] * r);
  *rs = r;
}
static void ref_rms_dx(const float *x, const float *w, const float *dy, float r, size_t h,
                       float *dx) {
  float acc = 0.0f;
  for (size_t j = 0; j < h; j++) acc = fmaf(dy[j] * w[j], x[j] * r, acc);
  float m = acc / (float)h;
  for (size_t j = 0; j < h; j++) dx[j] = r * fmaf(-(x[j] * r), m, dy[j] * w[j]);
}

/* fp64: y, rstd, dx, dweight (over rows [t0, t1)) */
static double d_rstd(const float *x, size_t h, double eps) {
  double s = 0;
  for (size_t j = 0; j < h; j++) s += (double)x[j] * x[j];
  return 1.0 / sqrt(s / (double)h + eps);
}
static void d_rms_dx(const float *x, const float *w, const float *dy, size_t h, double eps,
                     double *dx, double *scale) {
  double r = d_rstd(x, h, eps), s = 0, sa = 0;
  for (size_t j = 0; j < h; j++) {
    s += (double)dy[j] * w[j] * x[j] * r;
    sa += fabs((double)dy[j] * w[j] * x[j] * r);
  }
  for (size_t j = 0; j < h; j++) {
    double xh = x[j] * r, g = (double)dy[j] * w[j];
    dx[j] = r * (g - xh * s / (double)h);
    if (scale) scale[j] = r * (fabs(g) + fabs(xh) * sa / (double)h);
  }
}

typedef struct rms_case {
  size_t t, h, chunk;
  double eps;
} rms_case;

void test_rmsnorm_vs_reference(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const rms_case cases[] = {{1, 1, 1, 1e-5},   {5, 7, 2, 1e-6},   {33, 128, 8, 1e-5},
                            {19, 1000, 19, 0}, {40, 96, 64, 1e-5}, {64, 3, 5, 0.5}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    rms_case k = cases[ci];
    size_t nch = (k.t + k.chunk - 1) / k.chunk;
    lt x, w, y, rs, dy, dx, dw;
    lt_make(&x, 0, 2, (int64_t)k.t, (int64_t)k.h, 0);
    lt_make(&y, 0, 2, (int64_t)k.t, (int64_t)k.h, 0);
    lt_make(&dy, 0, 2, (int64_t)k.t, (int64_t)k.h, 0);
    lt_make(&dx, 0, 2, (int64_t)k.t, (int64_t)k.h, 0);
    lt_make(&w, 0, 1, (int64_t)k.h, 0, 0);
    lt_make(&rs, 0, 1, (int64_t)k.t, 0, 0);
    lt_make(&dw, 0, 2, (int64_t)nch, (int64_t)k.h, 0);
    fill_normal(&r, &x, ldexp(1.0, (int)bxt_below(&r, 20) - 10));
    fill_normal(&r, &dy, 1.0);
    for (size_t j = 0; j < k.h; j++) F(&w)[j] = (float)(1.0 + 0.25 * bxt_normal(&r));
    CHECK_STATUS(bx_rmsnorm_forward(&x.t, &w.t, k.eps, &y.t, &rs.t, NULL), BX_OK, "case %zu", ci);
    CHECK_STATUS(bx_rmsnorm_backward(&x.t, &w.t, &dy.t, &rs.t, (int64_t)k.chunk, &dx.t, &dw.t,
                                     NULL), BX_OK, "case %zu backward", ci);
    float *ry = malloc(k.h * 4), *rdx = malloc(k.h * 4);
    double *ddx = malloc(k.h * 8), *sc = malloc(k.h * 8);
    float eps32 = (float)k.eps;
    size_t bad_bits = 0, bad_ref = 0;
    for (size_t t = 0; t < k.t; t++) {
      const float *xr = F(&x) + t * k.h, *dyr = F(&dy) + t * k.h;
      float rr;
      ref_rms_fwd(xr, F(&w), k.h, eps32, ry, &rr);
      ref_rms_dx(xr, F(&w), dyr, rr, k.h, rdx);
      bad_bits += ndiff(ry, F(&y) + t * k.h, k.h, NULL) + ndiff(rdx, F(&dx) + t * k.h, k.h, NULL) +
                  (fb(rr) != fb(F(&rs)[t]));
      /* fp64: y within (H/2 + 4) u relative (H u from the fmaf chain of
       * positive terms, 2u mean and + eps, halved by the square root, then
       * rsqrt, xhat, y one rounding each); dx within (2H + 16) u of the
       * scale r (|g| + |xhat| sum|g xhat| / H): the roundings of g, xhat,
       * the chain, m, the fmaf and rstd, each relative to those terms */
      double dr = d_rstd(xr, k.h, (double)eps32);
      d_rms_dx(xr, F(&w), dyr, k.h, (double)eps32, ddx, sc);
      for (size_t j = 0; j < k.h; j++) {
        double yref = (double)F(&w)[j] * xr[j] * dr;
        if (fabs(F(&y)[t * k.h + j] - yref) > (k.h / 2.0 + 4) * U * fabs(yref) + 0x1p-140) bad_ref++;
        if (fabs(F(&dx)[t * k.h + j] - ddx[j]) > (2.0 * k.h + 16) * U * sc[j] + 0x1p-140) bad_ref++;
      }
    }
    /* partials: bits of the chunk's fmaf chain, and fp64 within
     * (C + H/2 + 6) u of sum |dy xhat| */
    for (size_t c = 0; c < nch; c++)
      for (size_t j = 0; j < k.h; j++) {
        float acc = 0.0f;
        double ds = 0, da = 0;
        for (size_t t = c * k.chunk; t < k.t && t < (c + 1) * k.chunk; t++) {
          float xh = F(&x)[t * k.h + j] * F(&rs)[t];
          acc = fmaf(F(&dy)[t * k.h + j], xh, acc);
          double dxh = F(&x)[t * k.h + j] * d_rstd(F(&x) + t * k.h, k.h, (double)eps32);
          ds += F(&dy)[t * k.h + j] * dxh;
          da += fabs(F(&dy)[t * k.h + j] * dxh);
        }
        float got = F(&dw)[c * k.h + j];
        bad_bits += fb(acc) != fb(got);
        if (fabs(got - ds) > (k.chunk + k.h / 2.0 + 6) * U * da + 0x1p-140) bad_ref++;
      }
    CHECK(bad_bits == 0, "case %zu (T %zu, H %zu): %zu elements differ from the documented order",
          ci, k.t, k.h, bad_bits);
    CHECK(bad_ref == 0, "case %zu: %zu elements outside the fp64 bound", ci, bad_ref);
    free(ry);
    free(rdx);
    free(ddx);
    free(sc);
    lt_free(&x);
    lt_free(&y);
    lt_free(&dy);
    lt_free(&dx);
    lt_free(&w);
    lt_free(&rs);
    lt_free(&dw);
  }
  /* the fp64 gradient formula against central differences of
   * L = sum dy . y (fp64 in every step; h = 1e-6: error ~1e-10) */
  {
    const size_t h = 9;
    float x[9], w[9], dy[9];
    for (size_t j = 0; j < h; j++) {
      x[j] = (float)bxt_normal(&r);
      w[j] = (float)(1 + 0.3 * bxt_normal(&r));
      dy[j] = (float)bxt_normal(&r);
    }
    double dxr[9], eps = 1e-3, worst = 0;
    d_rms_dx(x, w, dy, h, eps, dxr, NULL);
    for (size_t j = 0; j < h; j++) {
      double xs[9], lp = 0, lm = 0, st = 1e-6;
      for (int sgn = -1; sgn <= 1; sgn += 2) {
        double s = 0, l = 0;
        for (size_t k = 0; k < h; k++) xs[k] = x[k] + (k == j ? sgn * st : 0.0);
        for (size_t k = 0; k < h; k++) s += xs[k] * xs[k];
        double rr = 1.0 / sqrt(s / h + eps);
        for (size_t k = 0; k < h; k++) l += dy[k] * w[k] * xs[k] * rr;
        if (sgn < 0) lm = l;
        else lp = l;
      }
      double fd = (lp - lm) / (2 * st);
      if (fabs(fd - dxr[j]) > worst) worst = fabs(fd - dxr[j]);
    }
    CHECK(worst < 1e-6, "fp64 RMSNorm dx vs finite differences: %g", worst);
  }
}

void test_rmsnorm_batch_invariance(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const size_t t = 37, h = 96, C = 5, nch = (t + C - 1) / C;
  lt x, w, y, rs, dy, dx, dw, y2, rs2, dx2, dw2;
  lt_make(&x, 0, 2, (int64_t)t, (int64_t)h, 0);
  lt_make(&dy, 0, 2, (int64_t)t, (int64_t)h, 0);
  lt_make(&y, 0, 2, (int64_t)t, (int64_t)h, 0);
  lt_make(&dx, 0, 2, (int64_t)t, (int64_t)h, 0);
  lt_make(&y2, 0, 2, (int64_t)t, (int64_t)h, 0);
  lt_make(&dx2, 0, 2, (int64_t)t, (int64_t)h, 0);
  lt_make(&w, 0, 1, (int64_t)h, 0, 0);
  lt_make(&rs, 0, 1, (int64_t)t, 0, 0);
  lt_make(&rs2, 0, 1, (int64_t)t, 0, 0);
  lt_make(&dw, 0, 2, (int64_t)nch, (int64_t)h, 0);
  lt_make(&dw2, 0, 2, (int64_t)nch, (int64_t)h, 0);
  fill_normal(&r, &x, 3.0);
  fill_normal(&r, &dy, 1.0);
  fill_normal(&r, &w, 1.0);
  CHECK_STATUS(bx_rmsnorm_forward(&x.t, &w.t, 1e-5, &y.t, &rs.t, NULL), BX_OK, "full");
  CHECK_STATUS(bx_rmsnorm_backward(&x.t, &w.t, &dy.t, &rs.t, (int64_t)C, &dx.t, &dw.t, NULL),
               BX_OK, "full backward");
  for (size_t k = 1; k <= t; k++) {
    int64_t s0[3], s1[3], s2[3], s3[3], s4[3], s5[3];
    DLTensor xv = rows_view(&x, (int64_t)k, s0), yv = rows_view(&y2, (int64_t)k, s1);
    DLTensor rv = rows_view(&rs2, (int64_t)k, s2), dyv = rows_view(&dy, (int64_t)k, s3);
    DLTensor dxv = rows_view(&dx2, (int64_t)k, s4);
    size_t nk = (k + C - 1) / C;
    DLTensor dwv = rows_view(&dw2, (int64_t)nk, s5);
    CHECK_STATUS(bx_rmsnorm_forward(&xv, &w.t, 1e-5, &yv, &rv, NULL), BX_OK, "prefix %zu", k);
    CHECK_STATUS(bx_rmsnorm_backward(&xv, &w.t, &dyv, &rv, (int64_t)C, &dxv, &dwv, NULL), BX_OK,
                 "prefix %zu backward", k);
    size_t d = ndiff(F(&y2), F(&y), k * h, NULL) + ndiff(F(&rs2), F(&rs), k, NULL) +
               ndiff(F(&dx2), F(&dx), k * h, NULL) + ndiff(F(&dw2), F(&dw), (k / C) * h, NULL);
    CHECK(d == 0, "prefix of %zu tokens: %zu elements differ from the full batch's", k, d);
  }
  /* 3-D [B, L, H] and the QK-norm view [T, heads, head_dim] = rows */
  {
    lt x3, y3, q, qy, w16, qy2;
    lt_make(&x3, 0, 3, 3, 4, (int64_t)h);
    lt_make(&y3, 0, 3, 3, 4, (int64_t)h);
    memcpy(x3.buf, x.buf, 12 * h * 4);
    CHECK_STATUS(bx_rmsnorm_forward(&x3.t, &w.t, 1e-5, &y3.t, NULL, NULL), BX_OK, "3-D");
    CHECK(ndiff(F(&y3), F(&y), 12 * h, NULL) == 0, "[3, 4, H] differs from [12, H]");
    lt_make(&q, 0, 3, 5, 6, 16);
    lt_make(&qy, 0, 3, 5, 6, 16);
    lt_make(&qy2, 0, 2, 30, 16, 0);
    lt_make(&w16, 0, 1, 16, 0, 0);
    fill_normal(&r, &q, 1.0);
    fill_normal(&r, &w16, 1.0);
    CHECK_STATUS(bx_rmsnorm_forward(&q.t, &w16.t, 1e-5, &qy.t, NULL, NULL), BX_OK, "qk view");
    DLTensor q2 = qy2.t;
    q2.data = q.buf;
    CHECK_STATUS(bx_rmsnorm_forward(&q2, &w16.t, 1e-5, &qy2.t, NULL, NULL), BX_OK, "qk rows");
    CHECK(ndiff(F(&qy), F(&qy2), 480, NULL) == 0, "[T, heads, hd] differs from [T*heads, hd]");
    /* in place: y = x, dx = dy */
    lt xi, dyi;
    lt_make(&xi, 0, 2, (int64_t)t, (int64_t)h, 0);
    lt_make(&dyi, 0, 2, (int64_t)t, (int64_t)h, 0);
    memcpy(xi.buf, x.buf, t * h * 4);
    memcpy(dyi.buf, dy.buf, t * h * 4);
    CHECK_STATUS(bx_rmsnorm_backward(&x.t, &w.t, &dyi.t, &rs.t, (int64_t)C, &dyi.t, &dw2.t, NULL),
                 BX_OK, "dx in place");
    CHECK(ndiff(F(&dyi), F(&dx), t * h, NULL) == 0 && ndiff(F(&dw2), F(&dw), nch * h, NULL) == 0,
          "in-place backward differs");
    CHECK_STATUS(bx_rmsnorm_forward(&xi.t, &w.t, 1e-5, &xi.t, NULL, NULL), BX_OK, "y in place");
    CHECK(ndiff(F(&xi), F(&y), t * h, NULL) == 0, "in-place forward differs");
    lt_free(&xi);
    lt_free(&dyi);
    lt_free(&x3);
    lt_free(&y3);
    lt_free(&q);
    lt_free(&qy);
    lt_free(&qy2);
    lt_free(&w16);
  }
  lt *all[] = {&x, &w, &y, &rs, &dy, &dx, &dw, &y2, &rs2, &dx2, &dw2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lt_free(all[i]);
}

void test_rmsnorm_bad_input(void) {
  const size_t t = 6, h = 8;
  lt x, w, y, rs, dy, dx, dw, d64;
  lt_make(&x, 0, 2, (int64_t)t, (int64_t)h, 0);
  lt_make(&y, 0, 2, (int64_t)t, (int64_t)h, 0);
  lt_make(&dy, 0, 2, (int64_t)t, (int64_t)h, 0);
  lt_make(&dx, 0, 2, (int64_t)t, (int64_t)h, 0);
  lt_make(&w, 0, 1, (int64_t)h, 0, 0);
  lt_make(&rs, 0, 1, (int64_t)t, 0, 0);
  lt_make(&dw, 0, 2, 2, (int64_t)h, 0);
  lt_make(&d64, 1, 2, (int64_t)t, (int64_t)h, 0);
  for (size_t i = 0; i < t * h; i++) F(&x)[i] = F(&dy)[i] = (float)i;
  for (size_t i = 0; i < h; i++) F(&w)[i] = 1.0f;
  for (size_t i = 0; i < t; i++) F(&rs)[i] = 0.5f;
  float sy[48], sdx[48], sdw[16];
  memset(F(&y), 0x55, t * h * 4);
  memset(F(&dx), 0x55, t * h * 4);
  memset(F(&dw), 0x55, 2 * h * 4);
  memcpy(sy, y.buf, sizeof sy);
  memcpy(sdx, dx.buf, sizeof sdx);
  memcpy(sdw, dw.buf, sizeof sdw);
  float srs[6];
  memcpy(srs, rs.buf, sizeof srs);
  const char *fw = "bx_rmsnorm_forward", *bw = "bx_rmsnorm_backward";
  (void)fw;
  EXPECT_FAIL(bx_rmsnorm_forward(NULL, &w.t, 1e-5, &y.t, &rs.t, NULL), BX_EINVAL,
              "bx_rmsnorm_forward: tensor 0 (x) is NULL", "NULL x");
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &w.t, -1.0, &y.t, &rs.t, NULL), BX_EINVAL, "eps",
              "negative eps");
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &w.t, NAN, &y.t, &rs.t, NULL), BX_EINVAL, "eps", "NaN eps");
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &w.t, 1e300, &y.t, &rs.t, NULL), BX_EINVAL, "eps",
              "eps beyond fp32");
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &dx.t, 1e-5, &y.t, &rs.t, NULL), BX_EINVAL,
              "tensor 1 (weight)", "2-D weight");
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &rs.t, 1e-5, &y.t, &rs.t, NULL), BX_EINVAL,
              "tensor 1 (weight) must be 1-D [8]", "weight [6]");
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &w.t, 1e-5, &dw.t, &rs.t, NULL), BX_EINVAL,
              "tensor 2 (y)", "y [2, 8]");
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &w.t, 1e-5, &y.t, &w.t, NULL), BX_EINVAL,
              "tensor 3 (rstd) has 8 elements", "rstd [8]");
  EXPECT_FAIL(bx_rmsnorm_forward(&d64.t, &w.t, 1e-5, &y.t, &rs.t, NULL), BX_EDTYPE,
              "tensor 0 (x) has dtype", "int64 x");
  DLTensor bad = x.t;
  bad.device.device_type = kDLCUDA;
  EXPECT_FAIL(bx_rmsnorm_forward(&bad, &w.t, 1e-5, &y.t, &rs.t, NULL), BX_EDEVICE,
              "tensor 0 (x) is on device", "CUDA x");
  int64_t tstr[2] = {1, 6};
  bad = y.t;
  bad.strides = tstr;
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &w.t, 1e-5, &bad, &rs.t, NULL), BX_ELAYOUT,
              "tensor 2 (y) is not row-major", "transposed y");
  bad = y.t;
  bad.byte_offset = 2;
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &w.t, 1e-5, &bad, &rs.t, NULL), BX_ELAYOUT, "aligned",
              "misaligned y");
  DLTensor rsv = rs.t;
  rsv.data = y.buf; /* rstd inside y */
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &w.t, 1e-5, &y.t, &rsv, NULL), BX_ELAYOUT,
              "tensor 2 (y) overlaps tensor 3 (rstd)", "rstd overlapping y");
  DLTensor yo = y.t;
  yo.data = x.buf;
  yo.byte_offset = 4; /* shifted by one element: not exactly in place */
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &w.t, 1e-5, &yo, &rs.t, NULL), BX_ELAYOUT,
              "only exactly in place", "y shifted over x");
  bx_rmsnorm_opts o = BX_RMSNORM_OPTS_DEFAULT;
  o.struct_size = 4;
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &w.t, 1e-5, &y.t, &rs.t, &o), BX_EINVAL, "struct_size",
              "bad struct_size");
  o = (bx_rmsnorm_opts)BX_RMSNORM_OPTS_DEFAULT;
  o.num_threads = -1;
  EXPECT_FAIL(bx_rmsnorm_forward(&x.t, &w.t, 1e-5, &y.t, &rs.t, &o), BX_EINVAL, "num_threads",
              "negative threads");
  lt z;
  lt_make(&z, 0, 2, (int64_t)t, 0, 0);
  EXPECT_FAIL(bx_rmsnorm_forward(&z.t, &w.t, 1e-5, &z.t, &rs.t, NULL), BX_EINVAL, "features",
              "H = 0");
  lt_free(&z);
  /* backward */
  EXPECT_FAIL(bx_rmsnorm_backward(&x.t, &w.t, NULL, &rs.t, 4, &dx.t, &dw.t, NULL), BX_EINVAL,
              "bx_rmsnorm_backward: tensor 2 (dy) is NULL", "NULL dy");
  EXPECT_FAIL(bx_rmsnorm_backward(&x.t, &w.t, &dy.t, &rs.t, 0, &dx.t, &dw.t, NULL), BX_EINVAL,
              "chunk_tokens", "chunk 0");
  EXPECT_FAIL(bx_rmsnorm_backward(&x.t, &w.t, &dy.t, &rs.t, 2, &dx.t, &dw.t, NULL), BX_EINVAL,
              "tensor 5 (dweight_partials) is [2, 8]", "partials for chunk 2 want [3, 8]");
  EXPECT_FAIL(bx_rmsnorm_backward(&x.t, &w.t, &dy.t, &w.t, 4, &dx.t, &dw.t, NULL), BX_EINVAL,
              "tensor 3 (rstd)", "rstd [8]");
  EXPECT_FAIL(bx_rmsnorm_backward(&x.t, &w.t, &dw.t, &rs.t, 4, &dx.t, &dw.t, NULL), BX_EINVAL,
              "tensor 2 (dy)", "dy [2, 8]");
  EXPECT_FAIL(bx_rmsnorm_backward(&x.t, &w.t, &dy.t, &rs.t, 4, &x.t, &dw.t, NULL), BX_ELAYOUT,
              "tensor 4 (dx) overlaps tensor 0 (x)", "dx is x");
  DLTensor dwo = dw.t;
  dwo.data = dx.buf;
  EXPECT_FAIL(bx_rmsnorm_backward(&x.t, &w.t, &dy.t, &rs.t, 4, &dx.t, &dwo, NULL), BX_ELAYOUT,
              "overlaps", "partials overlapping dx");
  bad = dy.t;
  bad.dtype.bits = 64;
  EXPECT_FAIL(bx_rmsnorm_backward(&x.t, &w.t, &bad, &rs.t, 4, &dx.t, &dw.t, NULL), BX_EDTYPE,
              "tensor 2 (dy)", "fp64 dy");
  o = (bx_rmsnorm_opts)BX_RMSNORM_OPTS_DEFAULT;
  o.struct_size = 0;
  EXPECT_FAIL(bx_rmsnorm_backward(&x.t, &w.t, &dy.t, &rs.t, 4, &dx.t, &dw.t, &o), BX_EINVAL,
              "struct_size", "struct_size 0");
  CHECK(memcmp(sy, y.buf, sizeof sy) == 0 && memcmp(sdx, dx.buf, sizeof sdx) == 0 &&
            memcmp(sdw, dw.buf, sizeof sdw) == 0 && memcmp(srs, rs.buf, sizeof srs) == 0,
        "a failing call wrote an output");
  CHECK_STATUS(bx_rmsnorm_backward(&x.t, &w.t, &dy.t, &rs.t, 3, &dx.t, &dw.t, NULL), BX_OK, "%s",
               bw);
  CHECK(memcmp(sdw, dw.buf, sizeof sdw) != 0, "a good call writes the partials");
  lt *all[] = {&x, &w, &y, &rs, &dy, &dx, &dw, &d64};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lt_free(all[i]);
}
