/*
 * test_layers_rope.c — RoPE and SwiGLU of bitexact_train.h ("Layers"), as
 * test_layers.c does RMSNorm: the documented order bit for bit, an fp64
 * reference within a stated bound, the fp64 gradients against central
 * finite differences, batch invariance, bad input; and the thread / ISA
 * sweep of all three layers.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "harness.h"
#include "pow_det.h"
#include "test_layers.h"
#include "tests.h"
#include "util.h"

/* ==== RoPE ================================================================ */

/* the documented table: inv[i] = fl(1 / fl(b^fl(2i / rd))) */
static void ref_inv(size_t rd, double theta, float *inv) {
  float b = (float)theta;
  for (size_t i = 0; i < rd / 2; i++) {
    float ex = (float)(2 * i) / (float)rd;
    inv[i] = 1.0f / (float)bx_pow_det((double)b, (double)ex);
  }
}

/* one token, the documented rotation (back: the transposed one) */
static void ref_rope(const float *x, float *y, int64_t pos, size_t heads, size_t hd, size_t rd,
                     const float *inv, int back) {
  size_t half = rd / 2;
  for (size_t h = 0; h < heads; h++) {
    const float *xh = x + h * hd;
    float *yh = y + h * hd;
    for (size_t i = 0; i < half; i++) {
      float ang = (float)pos * inv[i];
      float c = bx_cos_f32(ang), s = bx_sin_f32(ang), a = xh[i], b = xh[i + half];
      yh[i] = back ? a * c + b * s : a * c - b * s;
      yh[i + half] = back ? b * c - a * s : b * c + a * s;
    }
    for (size_t i = rd; i < hd; i++) yh[i] = xh[i];
  }
}

typedef struct rope_case {
  size_t t, heads, hd, rd;
  double theta;
} rope_case;

void test_rope_vs_reference(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const rope_case cases[] = {{7, 2, 16, 8, 10000.0},  {20, 4, 128, 64, 1e6}, {5, 3, 8, 8, 1e4},
                             {9, 1, 6, 2, 500000.0}, {12, 2, 10, 6, 1.0},   {30, 96, 128, 64, 1e4}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    rope_case k = cases[ci];
    size_t w = k.heads * k.hd, half = k.rd / 2;
    lt x, y, dx, pos, cs, sn;
    lt_make(&x, 0, 2, (int64_t)k.t, (int64_t)w, 0);
    lt_make(&y, 0, 2, (int64_t)k.t, (int64_t)w, 0);
    lt_make(&dx, 0, 2, (int64_t)k.t, (int64_t)w, 0);
    lt_make(&pos, 1, 1, (int64_t)k.t, 0, 0);
    lt_make(&cs, 0, 2, (int64_t)k.t, (int64_t)half, 0);
    lt_make(&sn, 0, 2, (int64_t)k.t, (int64_t)half, 0);
    fill_normal(&r, &x, 1.0);
    const int64_t big[] = {0, 1, 16777216, 16777215, 123457, 4095};
    for (size_t t = 0; t < k.t; t++)
      I(&pos)[t] = t < 6 ? big[t] : (int64_t)bxt_below(&r, 5000);
    CHECK_STATUS(bx_rope_forward(&x.t, &pos.t, (int64_t)k.hd, (int64_t)k.rd, k.theta, &y.t, NULL),
                 BX_OK, "case %zu", ci);
    CHECK_STATUS(bx_rope_backward(&x.t, &pos.t, (int64_t)k.hd, (int64_t)k.rd, k.theta, &dx.t,
                                  NULL), BX_OK, "case %zu backward", ci);
    CHECK_STATUS(bx_rope_cos_sin(&pos.t, (int64_t)k.rd, k.theta, &cs.t, &sn.t, NULL), BX_OK,
                 "case %zu table", ci);
    float *inv = malloc(half * 4), *ry = malloc(w * 4), *rdx = malloc(w * 4);
    ref_inv(k.rd, k.theta, inv);
    /* bx_pow_det against glibc's pow, both rounded to fp32 (independent) */
    size_t pow_diff = 0;
    for (size_t i = 0; i < half; i++) {
      float b = (float)k.theta, ex = (float)(2 * i) / (float)k.rd;
      pow_diff += fb((float)bx_pow_det(b, ex)) != fb((float)pow(b, ex));
    }
    CHECK(pow_diff == 0, "case %zu: %zu fp32 powers differ from glibc's", ci, pow_diff);
    size_t bad_bits = 0, bad_ref = 0;
    double b32 = (double)(float)k.theta;
    for (size_t t = 0; t < k.t; t++) {
      int64_t p = I(&pos)[t];
      const float *xr = F(&x) + t * w;
      ref_rope(xr, ry, p, k.heads, k.hd, k.rd, inv, 0);
      ref_rope(xr, rdx, p, k.heads, k.hd, k.rd, inv, 1);
      bad_bits += ndiff(ry, F(&y) + t * w, w, NULL) + ndiff(rdx, F(&dx) + t * w, w, NULL);
      for (size_t i = 0; i < half; i++) {
        float ang = (float)p * inv[i];
        bad_bits += fb(bx_cos_f32(ang)) != fb(F(&cs)[t * half + i]);
        bad_bits += fb(bx_sin_f32(ang)) != fb(F(&sn)[t * half + i]);
      }
      /* fp64 (u = 2^-24 bounds one rounding's relative error): the exact
       * angle p b^(-2i/rd); the fp32 angle is within ang (ln(b) + 3) u of
       * it (the exponent's rounding scaled by ex ln b <= ln b, the power,
       * the reciprocal, the product); cos and sin add u, the two products
       * and the sum 3u of |a| + |b| */
      for (size_t h = 0; h < k.heads; h++)
        for (size_t i = 0; i < half; i++) {
          double ang = (double)p * pow(b32, -(double)(2 * i) / (double)k.rd);
          double c = cos(ang), s = sin(ang), a = xr[h * k.hd + i], b = xr[h * k.hd + i + half];
          double bound = (fabs(a) + fabs(b)) * (ang * (log(b32) + 3.01) * U + 4.01 * U);
          double y1 = a * c - b * s, y2 = b * c + a * s, d1 = a * c + b * s, d2 = b * c - a * s;
          const float *yt = F(&y) + t * w + h * k.hd, *dt = F(&dx) + t * w + h * k.hd;
          bad_ref += fabs(yt[i] - y1) > bound;
          bad_ref += fabs(yt[i + half] - y2) > bound;
          bad_ref += fabs(dt[i] - d1) > bound;
          bad_ref += fabs(dt[i + half] - d2) > bound;
        }
    }
    CHECK(bad_bits == 0, "case %zu: %zu elements differ from the documented order", ci, bad_bits);
    CHECK(bad_ref == 0, "case %zu: %zu elements outside the fp64 bound", ci, bad_ref);
    /* in place equals out of place */
    CHECK_STATUS(bx_rope_forward(&x.t, &pos.t, (int64_t)k.hd, (int64_t)k.rd, k.theta, &x.t, NULL),
                 BX_OK, "in place");
    CHECK(ndiff(F(&x), F(&y), k.t * w, NULL) == 0, "case %zu: in place differs", ci);
    free(inv);
    free(ry);
    free(rdx);
    lt_free(&x);
    lt_free(&y);
    lt_free(&dx);
    lt_free(&pos);
    lt_free(&cs);
    lt_free(&sn);
  }
  /* the fp64 backward (the transposed rotation) against central
   * differences of L = sum dy . rope(x) (linear: exact up to rounding) */
  {
    double x[8], dy[8], worst = 0;
    const size_t hd = 8, rd = 6, half = 3;
    const double p = 37, th = 10000;
    for (size_t j = 0; j < hd; j++) {
      x[j] = bxt_normal(&r);
      dy[j] = bxt_normal(&r);
    }
    for (size_t j = 0; j < hd; j++) {
      double l[2];
      for (int sg = 0; sg < 2; sg++) {
        double xs[8], yv[8];
        memcpy(xs, x, sizeof xs);
        xs[j] += sg ? 1e-6 : -1e-6;
        for (size_t i = 0; i < half; i++) {
          double ang = p * pow(th, -(double)(2 * i) / rd), c = cos(ang), s = sin(ang);
          yv[i] = xs[i] * c - xs[i + half] * s;
          yv[i + half] = xs[i + half] * c + xs[i] * s;
        }
        for (size_t i = rd; i < hd; i++) yv[i] = xs[i];
        l[sg] = 0;
        for (size_t i = 0; i < hd; i++) l[sg] += dy[i] * yv[i];
      }
      double fd = (l[1] - l[0]) / 2e-6, g;
      size_t i = j < half ? j : j - half;
      double ang = p * pow(th, -(double)(2 * i) / rd), c = cos(ang), s = sin(ang);
      if (j >= rd) g = dy[j];
      else if (j < half) g = dy[j] * c + dy[j + half] * s;
      else g = dy[j] * c - dy[j - half] * s;
      if (fabs(fd - g) > worst) worst = fabs(fd - g);
    }
    CHECK(worst < 1e-8, "fp64 RoPE dx vs finite differences: %g", worst);
  }
}

void test_rope_batch_invariance(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const size_t t = 29, heads = 4, hd = 32, rd = 16, w = heads * hd;
  lt x, y, y2, pos, x3, y3;
  lt_make(&x, 0, 2, (int64_t)t, (int64_t)w, 0);
  lt_make(&y, 0, 2, (int64_t)t, (int64_t)w, 0);
  lt_make(&y2, 0, 2, (int64_t)t, (int64_t)w, 0);
  lt_make(&pos, 1, 1, (int64_t)t, 0, 0);
  fill_normal(&r, &x, 2.0);
  for (size_t i = 0; i < t; i++) I(&pos)[i] = (int64_t)bxt_below(&r, 100000);
  CHECK_STATUS(bx_rope_forward(&x.t, &pos.t, (int64_t)hd, (int64_t)rd, 1e6, &y.t, NULL), BX_OK,
               "full");
  for (int back = 0; back < 2; back++) {
    if (back)
      CHECK_STATUS(bx_rope_backward(&x.t, &pos.t, (int64_t)hd, (int64_t)rd, 1e6, &y.t, NULL),
                   BX_OK, "full backward");
    for (size_t k = 1; k <= t; k++) {
      int64_t s0[3], s1[3], s2[3];
      DLTensor xv = rows_view(&x, (int64_t)k, s0), yv = rows_view(&y2, (int64_t)k, s1);
      DLTensor pv = rows_view(&pos, (int64_t)k, s2);
      bx_status st = back ? bx_rope_backward(&xv, &pv, (int64_t)hd, (int64_t)rd, 1e6, &yv, NULL)
                          : bx_rope_forward(&xv, &pv, (int64_t)hd, (int64_t)rd, 1e6, &yv, NULL);
      CHECK_STATUS(st, BX_OK, "prefix %zu", k);
      CHECK(ndiff(F(&y2), F(&y), k * w, NULL) == 0, "%s: prefix of %zu tokens differs",
            back ? "backward" : "forward", k);
    }
  }
  /* [T, heads, head_dim] and [B, L, heads*head_dim] views: the same bits */
  lt_make(&x3, 0, 3, (int64_t)t, (int64_t)heads, (int64_t)hd);
  lt_make(&y3, 0, 3, (int64_t)t, (int64_t)heads, (int64_t)hd);
  memcpy(x3.buf, x.buf, t * w * 4);
  CHECK_STATUS(bx_rope_backward(&x3.t, &pos.t, (int64_t)hd, (int64_t)rd, 1e6, &y3.t, NULL), BX_OK,
               "[T, heads, hd]");
  CHECK(ndiff(F(&y3), F(&y), t * w, NULL) == 0, "[T, heads, hd] differs from [T, heads*hd]");
  lt_free(&x3);
  lt_free(&y3);
  lt_free(&x);
  lt_free(&y);
  lt_free(&y2);
  lt_free(&pos);
}

void test_rope_bad_input(void) {
  const size_t t = 4, w = 32;
  lt x, y, pos, pf, cs, sn;
  lt_make(&x, 0, 2, (int64_t)t, (int64_t)w, 0);
  lt_make(&y, 0, 2, (int64_t)t, (int64_t)w, 0);
  lt_make(&pos, 1, 1, (int64_t)t, 0, 0);
  lt_make(&pf, 0, 1, (int64_t)t, 0, 0);
  lt_make(&cs, 0, 2, (int64_t)t, 4, 0);
  lt_make(&sn, 0, 2, (int64_t)t, 4, 0);
  for (size_t i = 0; i < t * w; i++) F(&x)[i] = (float)i;
  for (size_t i = 0; i < t; i++) I(&pos)[i] = (int64_t)i;
  memset(y.buf, 0x77, t * w * 4);
  memset(cs.buf, 0x77, t * 16);
  float sy[128], scs[16];
  memcpy(sy, y.buf, sizeof sy);
  memcpy(scs, cs.buf, sizeof scs);
  EXPECT_FAIL(bx_rope_forward(&x.t, NULL, 16, 8, 1e4, &y.t, NULL), BX_EINVAL,
              "bx_rope_forward: tensor 1 (positions) is NULL", "NULL positions");
  EXPECT_FAIL(bx_rope_forward(&x.t, &pf.t, 16, 8, 1e4, &y.t, NULL), BX_EDTYPE,
              "tensor 1 (positions) has dtype", "fp32 positions");
  EXPECT_FAIL(bx_rope_forward(&x.t, &pos.t, 16, 7, 1e4, &y.t, NULL), BX_EINVAL, "rotary_dim 7",
              "odd rotary_dim");
  EXPECT_FAIL(bx_rope_forward(&x.t, &pos.t, 16, 18, 1e4, &y.t, NULL), BX_EINVAL,
              "exceeds head_dim", "rotary_dim > head_dim");
  EXPECT_FAIL(bx_rope_forward(&x.t, &pos.t, 0, 8, 1e4, &y.t, NULL), BX_EINVAL, "head_dim 0",
              "head_dim 0");
  EXPECT_FAIL(bx_rope_forward(&x.t, &pos.t, 16, 8, 0.5, &y.t, NULL), BX_EINVAL, "theta",
              "theta < 1");
  EXPECT_FAIL(bx_rope_forward(&x.t, &pos.t, 16, 8, NAN, &y.t, NULL), BX_EINVAL, "theta",
              "theta NaN");
  EXPECT_FAIL(bx_rope_forward(&x.t, &pos.t, 12, 8, 1e4, &y.t, NULL), BX_EINVAL,
              "tensor 0 (x) is not 4 tokens", "width not a multiple of head_dim");
  int64_t s3[1] = {3};
  DLTensor p3 = pos.t;
  p3.shape = s3;
  EXPECT_FAIL(bx_rope_forward(&x.t, &p3, 16, 8, 1e4, &y.t, NULL), BX_EINVAL, "tensor 0 (x)",
              "3 positions for 4 tokens");
  EXPECT_FAIL(bx_rope_backward(&x.t, &pos.t, 16, 8, 1e4, &cs.t, NULL), BX_EINVAL,
              "bx_rope_backward: tensor 2 (dx): shape differs", "dx shape");
  I(&pos)[2] = -1;
  EXPECT_FAIL(bx_rope_forward(&x.t, &pos.t, 16, 8, 1e4, &y.t, NULL), BX_EINVAL,
              "tensor 1 (positions): element 2 is -1", "negative position");
  I(&pos)[2] = (1 << 24) + 1;
  EXPECT_FAIL(bx_rope_cos_sin(&pos.t, 8, 1e4, &cs.t, &sn.t, NULL), BX_EINVAL, "outside [0, 2^24]",
              "position 2^24 + 1");
  I(&pos)[2] = 2;
  DLTensor yo = y.t;
  yo.data = x.buf;
  yo.byte_offset = 8;
  EXPECT_FAIL(bx_rope_forward(&x.t, &pos.t, 16, 8, 1e4, &yo, NULL), BX_ELAYOUT,
              "tensor 2 (y) overlaps tensor 0 (x)", "y shifted over x");
  EXPECT_FAIL(bx_rope_cos_sin(&pos.t, 8, 1e4, &cs.t, &cs.t, NULL), BX_ELAYOUT,
              "tensor 1 (cos) overlaps tensor 2 (sin)", "cos is sin");
  EXPECT_FAIL(bx_rope_cos_sin(&pos.t, 10, 1e4, &cs.t, &sn.t, NULL), BX_EINVAL,
              "tensor 1 (cos) is [4, 4]", "table for rotary_dim 10");
  DLTensor bad = x.t;
  bad.device.device_type = kDLVulkan;
  EXPECT_FAIL(bx_rope_forward(&bad, &pos.t, 16, 8, 1e4, &y.t, NULL), BX_EDEVICE,
              "tensor 0 (x) is on device", "Vulkan x");
  int64_t gstr[2] = {40, 1};
  bad = y.t;
  bad.strides = gstr;
  EXPECT_FAIL(bx_rope_forward(&x.t, &pos.t, 16, 8, 1e4, &bad, NULL), BX_ELAYOUT,
              "tensor 2 (y) is not row-major", "y with a row gap");
  bx_rope_opts o = BX_ROPE_OPTS_DEFAULT;
  o.struct_size = sizeof o + 8;
  EXPECT_FAIL(bx_rope_forward(&x.t, &pos.t, 16, 8, 1e4, &y.t, &o), BX_EINVAL, "struct_size",
              "struct_size too large");
  EXPECT_FAIL(bx_rope_cos_sin(&pos.t, 8, 1e4, &cs.t, &sn.t, &o), BX_EINVAL, "struct_size",
              "table struct_size");
  CHECK(memcmp(sy, y.buf, sizeof sy) == 0 && memcmp(scs, cs.buf, sizeof scs) == 0,
        "a failing call wrote an output");
  lt *all[] = {&x, &y, &pos, &pf, &cs, &sn};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lt_free(all[i]);
}

/* ==== SwiGLU ============================================================== */

/* A NaN stored is the canonical 0x7fc00000 (docs/design.md, "NaN"). */
static float ref_canon(float x) {
  uint32_t b = 0x7fc00000u;
  if (x == x) return x;
  memcpy(&x, &b, 4);
  return x;
}

static float ref_dg(float g, float u, float dh) {
  float s = bx_sigmoid_f32(g);
  return ((dh * u) * s) * fmaf(g, 1.0f - s, 1.0f);
}

/* gate values: gradient-like, plus the special ones */
static void fill_gate(bxt_rng *r, lt *g) {
  const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 100.0f, -100.0f, 1e30f,
                           -1e30f, 0x1p-140f, -0x1p-140f, 20.0f, -20.0f, 88.7f, -88.7f};
  fill_normal(r, g, 3.0);
  for (size_t i = 0; i < g->n; i++)
    if (bxt_below(r, 20) == 0) F(g)[i] = special[bxt_below(r, sizeof special / sizeof special[0])];
}

void test_swiglu_vs_reference(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const size_t t = 41, f = 77;
  lt g, u, dh, h, dg, du, gu, hf, dgu;
  lt_make(&g, 0, 2, (int64_t)t, (int64_t)f, 0);
  lt_make(&u, 0, 2, (int64_t)t, (int64_t)f, 0);
  lt_make(&dh, 0, 2, (int64_t)t, (int64_t)f, 0);
  lt_make(&h, 0, 2, (int64_t)t, (int64_t)f, 0);
  lt_make(&dg, 0, 2, (int64_t)t, (int64_t)f, 0);
  lt_make(&du, 0, 2, (int64_t)t, (int64_t)f, 0);
  lt_make(&hf, 0, 2, (int64_t)t, (int64_t)f, 0);
  lt_make(&gu, 0, 2, (int64_t)t, (int64_t)(2 * f), 0);
  lt_make(&dgu, 0, 2, (int64_t)t, (int64_t)(2 * f), 0);
  fill_gate(&r, &g);
  fill_normal(&r, &u, 1.0);
  fill_normal(&r, &dh, 1.0);
  for (size_t i = 0; i < t; i++) {
    memcpy(F(&gu) + i * 2 * f, F(&g) + i * f, f * 4);
    memcpy(F(&gu) + i * 2 * f + f, F(&u) + i * f, f * 4);
  }
  CHECK_STATUS(bx_swiglu_forward(&g.t, &u.t, &h.t, NULL), BX_OK, "forward");
  CHECK_STATUS(bx_swiglu_forward_fused(&gu.t, &hf.t, NULL), BX_OK, "fused forward");
  CHECK_STATUS(bx_swiglu_backward(&g.t, &u.t, &dh.t, &dg.t, &du.t, NULL), BX_OK, "backward");
  CHECK_STATUS(bx_swiglu_backward_fused(&gu.t, &dh.t, &dgu.t, NULL), BX_OK, "fused backward");
  size_t bad_bits = 0, bad_ref = 0, checked = 0;
  for (size_t i = 0; i < t * f; i++) {
    float gi = F(&g)[i], ui = F(&u)[i], di = F(&dh)[i];
    float rh = ref_canon(bx_silu_f32(gi) * ui), rdg = ref_canon(ref_dg(gi, ui, di)),
          rdu = ref_canon(di * bx_silu_f32(gi)); /* a NaN stored is the canonical one */
    size_t row = i / f, col = i % f;
    bad_bits += (fb(rh) != fb(F(&h)[i])) + (fb(rh) != fb(F(&hf)[i]));
    bad_bits += (fb(rdg) != fb(F(&dg)[i])) + (fb(rdu) != fb(F(&du)[i]));
    bad_bits += (fb(rdg) != fb(F(&dgu)[row * 2 * f + col])) +
                (fb(rdu) != fb(F(&dgu)[row * 2 * f + f + col]));
    /* Inf, NaN, 1e30, subnormal gates (and sigmoid / SiLU below the
     * normal range at g = -100): bits only, the bounds below are relative */
    if (!(fabsf(gi) <= 80.0f && fabsf(gi) >= 0x1p-100f) && gi != 0.0f) continue;
    /* fp64 (u = 2^-24 bounds one rounding's relative error): h within 2u
     * (SiLU correctly rounded, one product); du within 2u; dg within
     * u |dh up s| (6|d| + 3|g| + 1), d = 1 + g (1 - s): dsilu, s, their
     * product and the last product 4u |d|; s's error enters 1 - s
     * absolutely (u s), its rounding u (1 - s), both scaled by |g|, then
     * g (1 - s) and the sum u |g| + u |d| */
    double gd = gi, s = 1.0 / (1.0 + exp(-gd)), silu = gd * s, d = 1.0 + gd * (1.0 - s);
    double eh = silu * ui, edg = (double)di * ui * s * d, edu = (double)di * silu;
    bad_ref += fabs(F(&h)[i] - eh) > 2.01 * U * fabs(eh) + 0x1p-149;
    bad_ref += fabs(F(&dg)[i] - edg) >
               U * fabs((double)di * ui * s) * (6 * fabs(d) + 3 * fabs(gd) + 1) + 0x1p-147;
    bad_ref += fabs(F(&du)[i] - edu) > 2.01 * U * fabs(edu) + 0x1p-149;
    checked++;
  }
  CHECK(bad_bits == 0, "%zu elements differ from the documented order", bad_bits);
  CHECK(bad_ref == 0, "%zu of %zu elements outside the fp64 bound", bad_ref, checked);
  /* the fp64 gradients against central differences of L = dh silu(g) u */
  double worst = 0;
  for (int k = 0; k < 50; k++) {
    double gd = 6 * bxt_normal(&r), ud = bxt_normal(&r), dd = bxt_normal(&r), st = 1e-6;
    double s = 1.0 / (1.0 + exp(-gd));
    double dgr = dd * ud * s * (1.0 + gd * (1.0 - s)), dur = dd * gd * s;
#define L(G, UU) (dd * (G) / (1.0 + exp(-(G))) * (UU))
    double fdg = (L(gd + st, ud) - L(gd - st, ud)) / (2 * st);
    double fdu = (L(gd, ud + st) - L(gd, ud - st)) / (2 * st);
#undef L
    worst = fmax(worst, fmax(fabs(fdg - dgr), fabs(fdu - dur)));
  }
  CHECK(worst < 1e-7, "fp64 SwiGLU gradients vs finite differences: %g", worst);
  /* in place: h = up, dgate = gate and dup = up, dgate_up = gate_up */
  lt *all[] = {&g, &u, &dh, &h, &dg, &du, &gu, &hf, &dgu};
  CHECK_STATUS(bx_swiglu_backward_fused(&gu.t, &dh.t, &gu.t, NULL), BX_OK, "fused in place");
  CHECK(ndiff(F(&gu), F(&dgu), t * 2 * f, NULL) == 0, "fused in-place backward differs");
  CHECK_STATUS(bx_swiglu_forward(&g.t, &u.t, &u.t, NULL), BX_OK, "h = up");
  CHECK(ndiff(F(&u), F(&h), t * f, NULL) == 0, "forward in place of up differs");
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lt_free(all[i]);
}

void test_swiglu_batch_invariance(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const size_t t = 23, f = 50;
  lt gu, dh, h, dgu, h2, dgu2;
  lt_make(&gu, 0, 2, (int64_t)t, (int64_t)(2 * f), 0);
  lt_make(&dgu, 0, 2, (int64_t)t, (int64_t)(2 * f), 0);
  lt_make(&dgu2, 0, 2, (int64_t)t, (int64_t)(2 * f), 0);
  lt_make(&dh, 0, 2, (int64_t)t, (int64_t)f, 0);
  lt_make(&h, 0, 2, (int64_t)t, (int64_t)f, 0);
  lt_make(&h2, 0, 2, (int64_t)t, (int64_t)f, 0);
  fill_gate(&r, &gu);
  fill_normal(&r, &dh, 1.0);
  CHECK_STATUS(bx_swiglu_forward_fused(&gu.t, &h.t, NULL), BX_OK, "full");
  CHECK_STATUS(bx_swiglu_backward_fused(&gu.t, &dh.t, &dgu.t, NULL), BX_OK, "full backward");
  for (size_t k = 1; k <= t; k++) {
    int64_t s0[3], s1[3], s2[3], s3[3];
    DLTensor gv = rows_view(&gu, (int64_t)k, s0), hv = rows_view(&h2, (int64_t)k, s1);
    DLTensor dhv = rows_view(&dh, (int64_t)k, s2), dv = rows_view(&dgu2, (int64_t)k, s3);
    CHECK_STATUS(bx_swiglu_forward_fused(&gv, &hv, NULL), BX_OK, "prefix %zu", k);
    CHECK_STATUS(bx_swiglu_backward_fused(&gv, &dhv, &dv, NULL), BX_OK, "prefix %zu", k);
    CHECK(ndiff(F(&h2), F(&h), k * f, NULL) == 0 &&
              ndiff(F(&dgu2), F(&dgu), k * 2 * f, NULL) == 0,
          "prefix of %zu tokens differs", k);
  }
  lt *all[] = {&gu, &dh, &h, &dgu, &h2, &dgu2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lt_free(all[i]);
}

void test_swiglu_bad_input(void) {
  lt g, u, h, dh, dg, du, gu, odd, g7;
  lt_make(&g, 0, 2, 4, 6, 0);
  lt_make(&u, 0, 2, 4, 6, 0);
  lt_make(&h, 0, 2, 4, 6, 0);
  lt_make(&dh, 0, 2, 4, 6, 0);
  lt_make(&dg, 0, 2, 4, 6, 0);
  lt_make(&du, 0, 2, 4, 6, 0);
  lt_make(&gu, 0, 2, 4, 12, 0);
  lt_make(&odd, 0, 2, 4, 11, 0);
  lt_make(&g7, 0, 2, 4, 7, 0);
  memset(h.buf, 0x33, 96);
  memset(dg.buf, 0x33, 96);
  memset(du.buf, 0x33, 96);
  float sh[24], sdg[24], sdu[24];
  memcpy(sh, h.buf, 96);
  memcpy(sdg, dg.buf, 96);
  memcpy(sdu, du.buf, 96);
  EXPECT_FAIL(bx_swiglu_forward(&g.t, NULL, &h.t, NULL), BX_EINVAL,
              "bx_swiglu_forward: tensor 1 (up) is NULL", "NULL up");
  EXPECT_FAIL(bx_swiglu_forward(&g.t, &g7.t, &h.t, NULL), BX_EINVAL, "tensor 1 (up) is [4, 7]",
              "up [4, 7]");
  EXPECT_FAIL(bx_swiglu_forward_fused(&odd.t, &h.t, NULL), BX_EINVAL,
              "tensor 0 (gate_up) has 11 columns", "odd fused width");
  EXPECT_FAIL(bx_swiglu_forward_fused(&gu.t, &g7.t, NULL), BX_EINVAL, "tensor 1 (h)", "h [4, 7]");
  EXPECT_FAIL(bx_swiglu_backward(&g.t, &u.t, &dh.t, &dg.t, &dg.t, NULL), BX_ELAYOUT,
              "tensor 3 (dgate) overlaps tensor 4 (dup)", "dgate is dup");
  EXPECT_FAIL(bx_swiglu_backward(&g.t, &u.t, &dh.t, &dh.t, &du.t, NULL), BX_ELAYOUT,
              "tensor 3 (dgate) overlaps tensor 2 (dh)", "dgate is dh");
  DLTensor bad = dh.t;
  bad.dtype.code = kDLBfloat;
  bad.dtype.bits = 16;
  EXPECT_FAIL(bx_swiglu_backward(&g.t, &u.t, &bad, &dg.t, &du.t, NULL), BX_EDTYPE,
              "tensor 2 (dh) has dtype", "bf16 dh");
  bad = du.t;
  bad.device.device_type = kDLCUDA;
  EXPECT_FAIL(bx_swiglu_backward(&g.t, &u.t, &dh.t, &dg.t, &bad, NULL), BX_EDEVICE,
              "tensor 4 (dup) is on device", "CUDA dup");
  int64_t tstr[2] = {1, 4};
  bad = dg.t;
  bad.strides = tstr;
  EXPECT_FAIL(bx_swiglu_backward(&g.t, &u.t, &dh.t, &bad, &du.t, NULL), BX_ELAYOUT,
              "tensor 3 (dgate) is not row-major", "transposed dgate");
  DLTensor dgo = dg.t;
  dgo.data = gu.buf;
  dgo.byte_offset = 4;
  EXPECT_FAIL(bx_swiglu_backward_fused(&gu.t, &dh.t, &dgo, NULL), BX_EINVAL, "tensor 2 (dgate_up)",
              "dgate_up [4, 6]");
  bx_swiglu_opts o = BX_SWIGLU_OPTS_DEFAULT;
  o.num_threads = -3;
  EXPECT_FAIL(bx_swiglu_forward(&g.t, &u.t, &h.t, &o), BX_EINVAL, "num_threads", "threads -3");
  o.struct_size = 1;
  EXPECT_FAIL(bx_swiglu_backward(&g.t, &u.t, &dh.t, &dg.t, &du.t, &o), BX_EINVAL, "struct_size",
              "struct_size 1");
  CHECK(memcmp(sh, h.buf, 96) == 0 && memcmp(sdg, dg.buf, 96) == 0 && memcmp(sdu, du.buf, 96) == 0,
        "a failing call wrote an output");
  lt *all[] = {&g, &u, &h, &dh, &dg, &du, &gu, &odd, &g7};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lt_free(all[i]);
}

/* ==== threads and ISAs: all three layers ==================================== */

void test_layers_threads_and_isa(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const size_t t = 300, hh = 1100, heads = 8, hd = 64, f = 700;
  lt x, w, dy, y, rs, dx, dw, q, pos, qy, qdx, gu, dh, hf, dgu;
  lt_make(&x, 0, 2, (int64_t)t, (int64_t)hh, 0);
  lt_make(&dy, 0, 2, (int64_t)t, (int64_t)hh, 0);
  lt_make(&y, 0, 2, (int64_t)t, (int64_t)hh, 0);
  lt_make(&dx, 0, 2, (int64_t)t, (int64_t)hh, 0);
  lt_make(&w, 0, 1, (int64_t)hh, 0, 0);
  lt_make(&rs, 0, 1, (int64_t)t, 0, 0);
  lt_make(&dw, 0, 2, 19, (int64_t)hh, 0); /* chunks of 16 */
  lt_make(&q, 0, 2, 2 * (int64_t)t, (int64_t)(heads * hd), 0);
  lt_make(&qy, 0, 2, 2 * (int64_t)t, (int64_t)(heads * hd), 0);
  lt_make(&qdx, 0, 2, 2 * (int64_t)t, (int64_t)(heads * hd), 0);
  lt_make(&pos, 1, 1, 2 * (int64_t)t, 0, 0);
  lt_make(&gu, 0, 2, (int64_t)t, (int64_t)(2 * f), 0);
  lt_make(&dgu, 0, 2, (int64_t)t, (int64_t)(2 * f), 0);
  lt_make(&dh, 0, 2, (int64_t)t, (int64_t)f, 0);
  lt_make(&hf, 0, 2, (int64_t)t, (int64_t)f, 0);
  fill_normal(&r, &x, 1.0);
  fill_normal(&r, &dy, 1.0);
  fill_normal(&r, &w, 1.0);
  fill_normal(&r, &q, 1.0);
  fill_gate(&r, &gu);
  fill_normal(&r, &dh, 1.0);
  for (size_t i = 0; i < 2 * t; i++) I(&pos)[i] = (int64_t)(i % 4096);
  lt *outs[] = {&y, &rs, &dx, &dw, &qy, &qdx, &hf, &dgu};
  const size_t nout = sizeof outs / sizeof outs[0];
  float *want[8];
  for (size_t k = 0; k < nout; k++) want[k] = malloc(outs[k]->n * 4);
  const int threads[] = {1, 2, 3, 8};
  int first = 1;
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    CHECK(bxt_force(isa), "force %s", bxt_isa(isa));
    for (size_t ti = 0; ti < 4; ti++) {
      bx_rmsnorm_opts ro = BX_RMSNORM_OPTS_DEFAULT;
      bx_rope_opts po = BX_ROPE_OPTS_DEFAULT;
      bx_swiglu_opts so = BX_SWIGLU_OPTS_DEFAULT;
      ro.num_threads = po.num_threads = so.num_threads = threads[ti];
      for (size_t k = 0; k < nout; k++) memset(outs[k]->buf, 0xee, outs[k]->n * 4);
      CHECK_STATUS(bx_rmsnorm_forward(&x.t, &w.t, 1e-5, &y.t, &rs.t, &ro), BX_OK, "rmsnorm");
      CHECK_STATUS(bx_rmsnorm_backward(&x.t, &w.t, &dy.t, &rs.t, 16, &dx.t, &dw.t, &ro), BX_OK,
                   "rmsnorm backward");
      CHECK_STATUS(bx_rope_forward(&q.t, &pos.t, (int64_t)hd, 32, 1e6, &qy.t, &po), BX_OK,
                   "rope");
      CHECK_STATUS(bx_rope_backward(&q.t, &pos.t, (int64_t)hd, 32, 1e6, &qdx.t, &po), BX_OK,
                   "rope backward");
      CHECK_STATUS(bx_swiglu_forward_fused(&gu.t, &hf.t, &so), BX_OK, "swiglu");
      CHECK_STATUS(bx_swiglu_backward_fused(&gu.t, &dh.t, &dgu.t, &so), BX_OK, "swiglu backward");
      for (size_t k = 0; k < nout; k++) {
        if (first) {
          memcpy(want[k], outs[k]->buf, outs[k]->n * 4);
          continue;
        }
        size_t at = 0, d = ndiff(F(outs[k]), want[k], outs[k]->n, &at);
        CHECK(d == 0, "isa %s, %d threads: output %zu: %zu elements differ (first %zu)",
              bxt_isa(isa), threads[ti], k, d, at);
      }
      first = 0;
    }
  }
  bxt_force(-1);
  for (size_t k = 0; k < nout; k++) free(want[k]);
  lt *all[] = {&x, &w, &dy, &y, &rs, &dx, &dw, &q, &pos, &qy, &qdx, &gu, &dh, &hf, &dgu};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lt_free(all[i]);
}
