/*
 * test_gemm.c — bx_gemm (bitexact_train.h) bit for bit against a slow
 * reference that follows the documented order (per element: acc = +0 or
 * C, then acc = fmaf(a[k], b[k], acc) for k = 0..K-1), against an fp64 dot
 * product for an error bound, and for invariance: batch size (row i of C
 * alone or in any batch), thread count, blocking, ISA, alignment. Bad
 * input: named errors, nothing written.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "dl_view.h"
#include "gemm_internal.h"
#include "harness.h"
#include "tests.h"
#include "util.h"

/* ---- the test's own matrices: values as fp32 plus their storage -------- */

typedef struct mat {
  int bf16;     /* storage dtype: 0 fp32, 1 bf16 */
  size_t rows, cols;
  float *v;     /* the values (bf16 ones are exact in fp32) */
  void *raw;    /* malloc'd storage, with slack for misalignment */
  char *data;   /* first element inside raw (offset by shift bytes) */
  int64_t shape[3];
  DLTensor t;
} mat;

static void mat_make(mat *x, int bf16, size_t rows, size_t cols, size_t shift) {
  memset(x, 0, sizeof *x);
  x->bf16 = bf16;
  x->rows = rows;
  x->cols = cols;
  size_t n = rows * cols, es = bf16 ? 2 : 4;
  x->v = calloc(n + 1, sizeof(float));
  x->raw = calloc(n * es + 128, 1);
  x->data = (char *)x->raw + 64 + shift;
  x->shape[0] = (int64_t)rows;
  x->shape[1] = (int64_t)cols;
  x->t = bxt_view(x->data, bf16 ? kDLBfloat : kDLFloat, bf16 ? 16 : 32, 2, x->shape);
}

static void mat_free(mat *x) {
  free(x->v);
  free(x->raw);
}

static void mat_store(mat *x) {
  size_t n = x->rows * x->cols;
  for (size_t i = 0; i < n; i++) {
    if (x->bf16) {
      uint16_t h = bxt_f32_to_bf16(x->v[i]);
      x->v[i] = bxt_bf16_to_f32(h);
      memcpy(x->data + 2 * i, &h, 2);
    } else {
      memcpy(x->data + 4 * i, &x->v[i], 4);
    }
  }
}

static float mat_out(const mat *x, size_t i) {
  float f;
  memcpy(&f, x->data + 4 * i, 4);
  return f;
}

/* Gradient-like values, with a few exact zeros, ties and wide exponents. */
static void mat_fill(bxt_rng *r, mat *x, int wide) {
  size_t n = x->rows * x->cols;
  for (size_t i = 0; i < n; i++) {
    double v = bxt_normal(r);
    uint64_t u = bxt_below(r, 100);
    if (u == 0) v = 0.0;
    else if (u == 1) v = -0.0;
    else if (wide && u < 10) v = ldexp(v, (int)bxt_below(r, 120) - 60);
    x->v[i] = (float)v;
  }
  mat_store(x);
}

/* ---- references ----------------------------------------------------------- */

/* b's element (k, j) in the layout (NN and TN: b is [K,N], resp. [T,K]) */
static float bval(const mat *b, bx_gemm_layout layout, size_t k, size_t j) {
  return layout == BX_GEMM_NT ? b->v[j * b->cols + k] : b->v[k * b->cols + j];
}

/* the product's A element (i, p): TN reads a [T,N] transposed */
static float aval(const mat *a, bx_gemm_layout layout, size_t i, size_t p) {
  return layout == BX_GEMM_TN ? a->v[p * a->cols + i] : a->v[i * a->cols + p];
}

/* The documented chain, element by element. init: C's values, or NULL for +0. */
static float chain_elem(const mat *a, const mat *b, bx_gemm_layout layout, size_t i, size_t j,
                      size_t k, float init) {
  float acc = init;
  for (size_t p = 0; p < k; p++) acc = fmaf(aval(a, layout, i, p), bval(b, layout, p, j), acc);
  return acc;
}

static size_t bn_of(const mat *b, bx_gemm_layout layout) { return layout == BX_GEMM_NT ? b->rows : b->cols; }
/* rows of C and the chain's length */
static size_t m_of(const mat *a, bx_gemm_layout layout) { return layout == BX_GEMM_TN ? a->cols : a->rows; }
static size_t k_of(const mat *a, bx_gemm_layout layout) { return layout == BX_GEMM_TN ? a->rows : a->cols; }

/* a and b for C [m,n] with chains of k in the layout: NT a [m,k] b [n,k];
 * NN a [m,k] b [k,n]; TN a [k,m] (dY) b [k,n] (X) */
static void make_ab(mat *a, int abf, mat *b, int bbf, bx_gemm_layout layout, size_t m, size_t n,
                    size_t k, size_t ashift, size_t bshift) {
  if (layout == BX_GEMM_TN) mat_make(a, abf, k, m, ashift);
  else mat_make(a, abf, m, k, ashift);
  if (layout == BX_GEMM_NT) mat_make(b, bbf, n, k, bshift);
  else mat_make(b, bbf, k, n, bshift);
}

/* a [m,k], b in layout; c [m,n] fp32 made by the caller. */
static bx_status run_gemm(const mat *a, const mat *b, bx_gemm_layout layout, mat *c, int threads,
                          int accumulate, const bx_gemm_blocking *blk) {
  bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
  o.num_threads = threads;
  o.accumulate = accumulate;
  return bx_gemm_blocked(&a->t, &b->t, layout, &c->t, &o, blk);
}

static const char *lname(bx_gemm_layout l) { return l == BX_GEMM_NT ? "NT" : l == BX_GEMM_NN ? "NN" : "TN"; }

/* c against the chain (bitwise) and against the fp64 dot (bound) */
static void check_against_ref(const mat *a, const mat *b, bx_gemm_layout layout, const mat *c,
                              const float *init, const char *what) {
  size_t m = m_of(a, layout), k = k_of(a, layout), n = bn_of(b, layout);
  int bad = 0;
  for (size_t i = 0; i < m && bad < 4; i++)
    for (size_t j = 0; j < n && bad < 4; j++) {
      float want = chain_elem(a, b, layout, i, j, k, init ? init[i * n + j] : 0.0f);
      float got = mat_out(c, i * n + j);
      if (!CHECK_BITS_F(got, want, "%s: C[%zu][%zu] (M %zu N %zu K %zu)", what, i, j, m, n, k)) bad++;
      /* |fl(dot) - dot| <= gamma_K * sum |a||b| (+ |init| term), K u < 1 */
      double dot = init ? init[i * n + j] : 0.0, mag = fabs(dot);
      for (size_t p = 0; p < k; p++) {
        double t = (double)aval(a, layout, i, p) * bval(b, layout, p, j);
        dot += t;
        mag += fabs(t);
      }
      double u = ldexp(1.0, -24), g = (double)(k + 1) * u / (1 - (double)(k + 1) * u);
      if (!CHECK(fabs((double)got - dot) <= g * mag + (double)(k + 1) * 0x1p-149, "%s: C[%zu][%zu] = %a, fp64 dot %a, bound %g",
                 what, i, j, (double)got, dot, g * mag))
        bad++;
    }
}

/* ---- tests ------------------------------------------------------------------ */

void test_gemm_vs_reference(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const size_t dims[] = {1, 7, 17, 63, 129};
  int dts[3][2] = {{0, 0}, {1, 1}, {0, 1}};
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    for (int rep = 0; rep < 21; rep++) {
      size_t m = dims[bxt_below(&r, 5)], n = dims[bxt_below(&r, 5)], k = dims[bxt_below(&r, 5)];
      if (rep == 0) m = n = k = 129;
      bx_gemm_layout layout = (bx_gemm_layout)(rep % 3);
      int *dt = dts[rep / 3 % 3];
      int accumulate = rep % 4 == 3;
      mat a, b, c;
      make_ab(&a, dt[0], &b, dt[1], layout, m, n, k, 0, 0);
      mat_make(&c, 0, m, n, 0);
      mat_fill(&r, &a, rep % 5 == 4);
      mat_fill(&r, &b, rep % 5 == 4);
      mat_fill(&r, &c, 0);
      float *init = accumulate ? c.v : NULL;
      char what[128];
      snprintf(what, sizeof what, "isa %s %s a %s b %s%s", bxt_isa(isa), lname(layout),
               dt[0] ? "bf16" : "f32", dt[1] ? "bf16" : "f32", accumulate ? " accumulate" : "");
      CHECK_STATUS(run_gemm(&a, &b, layout, &c, 2, accumulate, NULL), BX_OK, "%s", what);
      check_against_ref(&a, &b, layout, &c, init, what);
      mat_free(&a);
      mat_free(&b);
      mat_free(&c);
      if (bxt_failures()) break;
    }
  }
  bxt_force(-1);
}

/* Special values: NaN/Inf propagate as in the chain, subnormal products and
 * signed zeros are not flushed. */
void test_gemm_special_values(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  size_t m = 9, n = 33, k = 40;
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    for (int layout = 0; layout < 3; layout++) {
      mat a, b, c;
      make_ab(&a, 0, &b, 0, (bx_gemm_layout)layout, m, n, k, 0, 0);
      mat_make(&c, 0, m, n, 0);
      for (size_t i = 0; i < m * k; i++) a.v[i] = (float)ldexp(bxt_normal(&r), -70 - (int)bxt_below(&r, 20));
      for (size_t i = 0; i < k * n; i++) b.v[i] = (float)ldexp(bxt_normal(&r), -60);
      a.v[3] = INFINITY;
      a.v[k + 1] = NAN;
      b.v[5] = -0.0f;
      for (size_t i = 0; i < k; i++) /* a row of -0 (TN: a column of dY): C = +0 */
        a.v[layout == BX_GEMM_TN ? i * m + 2 : 2 * k + i] = -0.0f;
      mat_store(&a);
      mat_store(&b);
      CHECK_STATUS(run_gemm(&a, &b, (bx_gemm_layout)layout, &c, 1, 0, NULL), BX_OK, "special");
      size_t nn = n;
      for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < nn; j++) {
          float want = chain_elem(&a, &b, (bx_gemm_layout)layout, i, j, k, 0.0f);
          float got = mat_out(&c, i * nn + j);
          if (isnan(want) && isnan(got)) continue;
          CHECK_BITS_F(got, want, "isa %s %s special C[%zu][%zu]", bxt_isa(isa), lname((bx_gemm_layout)layout), i, j);
        }
      mat_free(&a);
      mat_free(&b);
      mat_free(&c);
    }
  }
  bxt_force(-1);
}

/* C(A[:p]) == C(A)[:p] bitwise, for many p, any ISA */
void test_gemm_batch_invariance(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  size_t m = 77, n = 70, k = 300; /* k > the default kc: two k blocks */
  static const size_t ps[] = {1, 2, 3, 5, 11, 12, 13, 25, 31, 48, 49, 76};
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    for (int layout = 0; layout < 2; layout++)
      for (int bf = 0; bf < 2; bf++) {
        mat a, b, c;
        mat_make(&a, bf, m, k, 0);
        mat_make(&b, bf, layout == BX_GEMM_NT ? n : k, layout == BX_GEMM_NT ? k : n, 0);
        mat_make(&c, 0, m, n, 0);
        mat_fill(&r, &a, 0);
        mat_fill(&r, &b, 0);
        CHECK_STATUS(run_gemm(&a, &b, (bx_gemm_layout)layout, &c, 3, 0, NULL), BX_OK, "full");
        for (size_t q = 0; q < sizeof ps / sizeof ps[0]; q++) {
          size_t p = ps[q];
          /* rows [off, off+p) of A alone: a batch of p rows starting anywhere */
          size_t off = bxt_below(&r, m - p + 1);
          mat as, cs;
          mat_make(&as, bf, p, k, 0);
          mat_make(&cs, 0, p, n, 0);
          memcpy(as.v, a.v + off * k, p * k * sizeof(float));
          mat_store(&as);
          CHECK_STATUS(run_gemm(&as, &b, (bx_gemm_layout)layout, &cs, 1, 0, NULL), BX_OK, "part");
          CHECK(memcmp(cs.data, c.data + 4 * off * n, p * n * 4) == 0,
                "isa %s %s %s: rows [%zu, %zu) alone differ from the same rows in a batch of %zu",
                bxt_isa(isa), lname((bx_gemm_layout)layout), bf ? "bf16" : "f32", off, off + p, m);
          mat_free(&as);
          mat_free(&cs);
        }
        mat_free(&a);
        mat_free(&b);
        mat_free(&c);
      }
  }
  bxt_force(-1);
}

/* Thread counts, blockings, ISAs and alignments: one set of bits. */
void test_gemm_layout_invariance(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  size_t m = 131, n = 97, k = 270;
  static const int threads[] = {1, 2, 3, 8};
  static const bx_gemm_blocking blks[] = {{0, 0, 0, 0, 0}, {1, 1, 1, 0, 0}, {13, 7, 33, 0, 0}, {48, 64, 16, 0, 0}, {200, 300, 128, 0, 0}};
  for (int layout = 0; layout < 3; layout++)
    for (int acc = 0; acc < 2; acc++) {
      mat a, b, c0;
      /* NT with fp32, NN with bf16 A, TN with bf16 dY (acc 0) or fp32 (acc 1) */
      make_ab(&a, layout == 1 || (layout == 2 && !acc), &b, 0, (bx_gemm_layout)layout, m, n, k, 0, 0);
      mat_make(&c0, 0, m, n, 0);
      mat_fill(&r, &a, 0);
      mat_fill(&r, &b, 0);
      mat_fill(&r, &c0, 0);
      float *init = malloc(m * n * sizeof(float));
      memcpy(init, c0.v, m * n * sizeof(float));
      bxt_force(0);
      CHECK_STATUS(run_gemm(&a, &b, (bx_gemm_layout)layout, &c0, 1, acc, NULL), BX_OK, "first");
      check_against_ref(&a, &b, (bx_gemm_layout)layout, &c0, acc ? init : NULL, "layout invariance first");
      for (int isa = 0; isa < bxt_isa_count(); isa++) {
        if (!bxt_force(isa)) continue;
        for (size_t t = 0; t < 4; t++)
          for (size_t q = 0; q < sizeof blks / sizeof blks[0]; q++) {
            size_t shift = (t + q) % 4 * 4; /* 0, 4, 8, 12 bytes off a 64-byte line */
            mat a2, b2, c;
            mat_make(&a2, a.bf16, a.rows, a.cols, shift / (a.bf16 ? 2 : 1) / 2 * 2);
            mat_make(&b2, 0, b.rows, b.cols, shift);
            mat_make(&c, 0, m, n, (shift + 4) % 16);
            memcpy(a2.v, a.v, a.rows * a.cols * sizeof(float));
            memcpy(b2.v, b.v, b.rows * b.cols * sizeof(float));
            memcpy(c.v, init, m * n * sizeof(float));
            mat_store(&a2);
            mat_store(&b2);
            mat_store(&c);
            CHECK_STATUS(run_gemm(&a2, &b2, (bx_gemm_layout)layout, &c, threads[t], acc, &blks[q]), BX_OK, "run");
            CHECK(memcmp(c.data, c0.data, m * n * 4) == 0,
                  "%s acc %d: isa %s, %d threads, blocking %zu/%zu/%zu, shift %zu: bits differ from "
                  "isa %s 1 thread default blocking", lname((bx_gemm_layout)layout), acc, bxt_isa(isa),
                  threads[t], blks[q].mc, blks[q].kc, blks[q].nc, shift, bxt_isa(0));
            mat_free(&a2);
            mat_free(&b2);
            mat_free(&c);
          }
      }
      bxt_force(-1);
      free(init);
      mat_free(&a);
      mat_free(&b);
      mat_free(&c0);
    }
}

/* 3-D batched a and c read as [batch*rows, cols]; public entry bx_gemm. */
void test_gemm_batched_3d(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  size_t bt = 3, s = 5, k = 20, n = 19;
  mat a, b, c;
  mat_make(&a, 1, bt * s, k, 2);
  mat_make(&b, 1, n, k, 0);
  mat_make(&c, 0, bt * s, n, 0);
  mat_fill(&r, &a, 0);
  mat_fill(&r, &b, 0);
  int64_t as[3] = {(int64_t)bt, (int64_t)s, (int64_t)k}, cs[3] = {(int64_t)bt, (int64_t)s, (int64_t)n};
  int64_t astr[3] = {(int64_t)(s * k), (int64_t)k, 1};
  a.t.ndim = 3;
  a.t.shape = as;
  a.t.strides = astr;
  c.t.ndim = 3;
  c.t.shape = cs;
  CHECK_STATUS(bx_gemm(&a.t, &b.t, BX_GEMM_NT, &c.t, NULL), BX_OK, "3-D");
  check_against_ref(&a, &b, BX_GEMM_NT, &c, NULL, "3-D batched");
  mat_free(&a);
  mat_free(&b);
  mat_free(&c);
}

/* K = 0: C = +0, or unchanged with accumulate; M = 0, N = 0: nothing. */
void test_gemm_empty(void) {
  mat a, b, c;
  mat_make(&a, 0, 4, 0, 0);
  mat_make(&b, 0, 5, 0, 0);
  mat_make(&c, 0, 4, 5, 0);
  for (size_t i = 0; i < 20; i++) c.v[i] = -1.5f;
  mat_store(&c);
  CHECK_STATUS(run_gemm(&a, &b, BX_GEMM_NT, &c, 2, 1, NULL), BX_OK, "K = 0 accumulate");
  for (size_t i = 0; i < 20; i++) CHECK_BITS_F(mat_out(&c, i), -1.5f, "K = 0 accumulate: C[%zu] unchanged", i);
  CHECK_STATUS(run_gemm(&a, &b, BX_GEMM_NT, &c, 2, 0, NULL), BX_OK, "K = 0");
  for (size_t i = 0; i < 20; i++) CHECK_BITS_F(mat_out(&c, i), 0.0f, "K = 0: C[%zu] = +0", i);
  mat_free(&a);
  mat_free(&b);
  mat_free(&c);
  /* M = 0 with NULL data */
  mat_make(&a, 0, 0, 8, 0);
  mat_make(&b, 0, 8, 3, 0);
  mat_make(&c, 0, 0, 3, 0);
  a.t.data = NULL;
  c.t.data = NULL;
  CHECK_STATUS(run_gemm(&a, &b, BX_GEMM_NN, &c, 1, 0, NULL), BX_OK, "M = 0");
  mat_free(&a);
  mat_free(&b);
  mat_free(&c);
}

/* Errors: named, and C untouched. */
static void expect_fail(const DLTensor *a, const DLTensor *b, int layout, mat *c, const bx_gemm_opts *o,
                        bx_status want, const char *word, const char *what) {
  size_t bytes = c->rows * c->cols * (c->bf16 ? 2 : 4);
  unsigned char *before = malloc(bytes + 1);
  memcpy(before, c->data, bytes);
  bx_status st = bx_gemm(a, b, (bx_gemm_layout)layout, &c->t, o);
  CHECK_STATUS(st, want, "%s", what);
  CHECK(strstr(bx_last_error(), "bx_gemm") && strstr(bx_last_error(), word),
        "%s: message '%s' should name bx_gemm and '%s'", what, bx_last_error(), word);
  CHECK(memcmp(before, c->data, bytes) == 0, "%s: c was written", what);
  free(before);
}

void test_gemm_bad_input(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  mat a, b, c, bt;
  mat_make(&a, 0, 6, 10, 0);
  mat_make(&b, 0, 8, 10, 0);  /* NT: [N=8, K=10] */
  mat_make(&bt, 0, 10, 8, 0); /* NN */
  mat_make(&c, 0, 6, 8, 0);
  mat_fill(&r, &a, 0);
  mat_fill(&r, &b, 0);
  mat_fill(&r, &c, 0);
  expect_fail(&a.t, &bt.t, BX_GEMM_NT, &c, NULL, BX_EINVAL, "K differs", "NT with a [K,N] b");
  expect_fail(&a.t, &b.t, BX_GEMM_NN, &c, NULL, BX_EINVAL, "K differs", "NN with a [N,K] b");
  expect_fail(&a.t, &b.t, 7, &c, NULL, BX_EINVAL, "layout", "unknown layout");
  expect_fail(NULL, &b.t, BX_GEMM_NT, &c, NULL, BX_EINVAL, "tensor a", "NULL a");
  mat c2;
  mat_make(&c2, 0, 6, 7, 0);
  mat_fill(&r, &c2, 0);
  expect_fail(&a.t, &b.t, BX_GEMM_NT, &c2, NULL, BX_EINVAL, "c's shape", "c [6,7]");
  mat_free(&c2);
  /* dtypes */
  DLTensor bad = a.t;
  bad.dtype.bits = 64;
  expect_fail(&bad, &b.t, BX_GEMM_NT, &c, NULL, BX_EDTYPE, "tensor a", "fp64 a");
  bad = b.t;
  bad.dtype.code = kDLInt;
  expect_fail(&a.t, &bad, BX_GEMM_NT, &c, NULL, BX_EDTYPE, "tensor b", "int b");
  mat cb;
  mat_make(&cb, 1, 6, 8, 0);
  expect_fail(&a.t, &b.t, BX_GEMM_NT, &cb, NULL, BX_EDTYPE, "tensor c", "bf16 c");
  mat_free(&cb);
  /* strides: a transposed view, a gap */
  int64_t tstr[2] = {1, 6}, gstr[2] = {12, 1};
  bad = a.t;
  bad.strides = tstr;
  expect_fail(&bad, &b.t, BX_GEMM_NT, &c, NULL, BX_ELAYOUT, "row-major", "a transposed strides");
  bad = c.t;
  bad.strides = gstr;
  mat cv = c;
  cv.t = bad;
  expect_fail(&a.t, &b.t, BX_GEMM_NT, &cv, NULL, BX_ELAYOUT, "tensor c", "c with a row gap");
  /* overlap: c inside a's memory */
  mat big;
  mat_make(&big, 0, 1, 6 * 10 + 6 * 8, 0);
  mat_fill(&r, &big, 0);
  DLTensor ao = a.t, co = c.t;
  ao.data = big.data;
  co.data = big.data;
  co.byte_offset = 6 * 10 * 4 - 4; /* last element of a is c's first */
  mat cw = c;
  cw.t = co;
  cw.data = big.data + co.byte_offset;
  expect_fail(&ao, &b.t, BX_GEMM_NT, &cw, NULL, BX_ELAYOUT, "overlaps a", "c overlapping a");
  DLTensor bo = b.t;
  bo.data = cw.data;
  expect_fail(&a.t, &bo, BX_GEMM_NT, &cw, NULL, BX_ELAYOUT, "overlaps b", "c overlapping b");
  mat_free(&big);
  /* misaligned fp32, device, ndim, options */
  bad = a.t;
  bad.byte_offset = 2;
  expect_fail(&bad, &b.t, BX_GEMM_NT, &c, NULL, BX_ELAYOUT, "aligned", "a at 2 bytes");
  bad = b.t;
  bad.device.device_type = kDLCUDA;
  expect_fail(&a.t, &bad, BX_GEMM_NT, &c, NULL, BX_EDEVICE, "tensor b", "CUDA b");
  bad = b.t;
  bad.ndim = 1;
  expect_fail(&a.t, &bad, BX_GEMM_NT, &c, NULL, BX_EINVAL, "dimensions", "1-D b");
  bad = a.t;
  bad.data = NULL;
  expect_fail(&bad, &b.t, BX_GEMM_NT, &c, NULL, BX_EINVAL, "NULL", "a with NULL data");
  bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
  o.num_threads = -1;
  expect_fail(&a.t, &b.t, BX_GEMM_NT, &c, &o, BX_EINVAL, "num_threads", "negative threads");
  o = (bx_gemm_opts)BX_GEMM_OPTS_DEFAULT;
  o.struct_size = 0;
  expect_fail(&a.t, &b.t, BX_GEMM_NT, &c, &o, BX_EINVAL, "struct_size", "struct_size 0");
  /* and a good call still works after all that */
  CHECK_STATUS(bx_gemm(&a.t, &b.t, BX_GEMM_NT, &c.t, NULL), BX_OK, "good call");
  check_against_ref(&a, &b, BX_GEMM_NT, &c, NULL, "after errors");
  mat_free(&a);
  mat_free(&b);
  mat_free(&bt);
  mat_free(&c);
}

/* TN (weight gradient): a chunk partial is bx_gemm TN on row views (same
 * data, byte_offset advanced): equal to the chain over exactly those rows,
 * for chunk edges off every blocking; 3-D a and b read as [batch*rows, .]. */
void test_gemm_tn_chunk_views(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  size_t t = 700, n = 45, k = 67;
  static const size_t cuts[][2] = {{0, 1}, {0, 256}, {256, 512}, {511, 700}, {3, 300}, {0, 700}};
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    for (int bf = 0; bf < 2; bf++) {
      mat a, b;
      mat_make(&a, bf, t, n, 0);
      mat_make(&b, 0, t, k, 0);
      mat_fill(&r, &a, 0);
      mat_fill(&r, &b, 0);
      for (size_t q = 0; q < sizeof cuts / sizeof cuts[0]; q++) {
        size_t r0 = cuts[q][0], r1 = cuts[q][1];
        int64_t sa[2] = {(int64_t)(r1 - r0), (int64_t)n}, sb[2] = {(int64_t)(r1 - r0), (int64_t)k};
        DLTensor va = a.t, vb = b.t;
        va.shape = sa;
        va.byte_offset = r0 * n * (bf ? 2 : 4);
        vb.shape = sb;
        vb.byte_offset = r0 * k * 4;
        mat c;
        mat_make(&c, 0, n, k, 0);
        bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
        o.num_threads = 1 + (int)(q % 3);
        CHECK_STATUS(bx_gemm(&va, &vb, BX_GEMM_TN, &c.t, &o), BX_OK, "view");
        int bad = 0;
        for (size_t i = 0; i < n && bad < 4; i++)
          for (size_t j = 0; j < k && bad < 4; j++) {
            float acc = 0.0f;
            for (size_t p = r0; p < r1; p++) acc = fmaf(a.v[p * n + i], b.v[p * k + j], acc);
            if (!CHECK_BITS_F(mat_out(&c, i * k + j), acc, "isa %s %s TN rows [%zu, %zu): C[%zu][%zu]",
                              bxt_isa(isa), bf ? "bf16" : "f32", r0, r1, i, j))
              bad++;
          }
        mat_free(&c);
      }
      /* 3-D: [5, 140, .] is the same as [700, .] */
      mat c2, c3;
      mat_make(&c2, 0, n, k, 0);
      mat_make(&c3, 0, n, k, 0);
      CHECK_STATUS(bx_gemm(&a.t, &b.t, BX_GEMM_TN, &c2.t, NULL), BX_OK, "2-D");
      int64_t s3a[3] = {5, 140, (int64_t)n}, s3b[3] = {5, 140, (int64_t)k};
      DLTensor a3 = a.t, b3 = b.t;
      a3.ndim = 3;
      a3.shape = s3a;
      b3.ndim = 3;
      b3.shape = s3b;
      CHECK_STATUS(bx_gemm(&a3, &b3, BX_GEMM_TN, &c3.t, NULL), BX_OK, "3-D");
      CHECK(memcmp(c2.data, c3.data, n * k * 4) == 0, "isa %s TN: 3-D differs from 2-D", bxt_isa(isa));
      mat_free(&c2);
      mat_free(&c3);
      mat_free(&a);
      mat_free(&b);
    }
  }
  bxt_force(-1);
}

void test_gemm_tn_bad_input(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  mat a, b, c, b2, c2;
  mat_make(&a, 0, 9, 6, 0); /* dY [T=9, N=6] */
  mat_make(&b, 0, 9, 5, 0); /* X [T=9, K=5] */
  mat_make(&b2, 0, 8, 5, 0);
  mat_make(&c, 0, 6, 5, 0);
  mat_make(&c2, 0, 5, 6, 0);
  mat_fill(&r, &a, 0);
  mat_fill(&r, &b, 0);
  mat_fill(&r, &c, 0);
  mat_fill(&r, &c2, 0);
  expect_fail(&a.t, &b2.t, BX_GEMM_TN, &c, NULL, BX_EINVAL, "rows", "TN b with 8 rows");
  expect_fail(&a.t, &b.t, BX_GEMM_TN, &c2, NULL, BX_EINVAL, "c's shape", "TN c [K,N]");
  int64_t s3[3] = {1, 6, 5};
  mat c3 = c;
  c3.t.ndim = 3;
  c3.t.shape = s3;
  expect_fail(&a.t, &b.t, BX_GEMM_TN, &c3, NULL, BX_EINVAL, "dimensions", "TN 3-D c");
  DLTensor bad = b.t;
  bad.dtype.bits = 64;
  expect_fail(&a.t, &bad, BX_GEMM_TN, &c, NULL, BX_EDTYPE, "tensor b", "TN fp64 b");
  mat big;
  mat_make(&big, 0, 1, 9 * 6 + 6 * 5, 0);
  DLTensor ao = a.t, co = c.t;
  ao.data = big.data;
  co.data = big.data;
  co.byte_offset = 9 * 6 * 4 - 4;
  mat cw = c;
  cw.t = co;
  cw.data = big.data + co.byte_offset;
  expect_fail(&ao, &b.t, BX_GEMM_TN, &cw, NULL, BX_ELAYOUT, "overlaps a", "TN c overlapping a");
  mat_free(&big);
  CHECK_STATUS(bx_gemm(&a.t, &b.t, BX_GEMM_TN, &c.t, NULL), BX_OK, "good TN call");
  check_against_ref(&a, &b, BX_GEMM_TN, &c, NULL, "TN after errors");
  mat_free(&a);
  mat_free(&b);
  mat_free(&b2);
  mat_free(&c);
  mat_free(&c2);
}
