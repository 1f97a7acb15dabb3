/*
 * test_wgrad.c — weight gradients over tokens (bitexact_train.h, "Weight
 * gradients over tokens") and the token reduction's grid kernels:
 *   - bias partials bit for bit against the documented chain written here,
 *     against the TN GEMM with a column of ones, and within γ_M Σ|dy| of
 *     fp64; every ISA and thread count;
 *   - the a-priori bound: edge cases, exact powers of two, soundness on
 *     adversarial chunks (same signs, maxima everywhere), not too loose;
 *   - bx_linear_wgrad: the words of bx_gemm(TN) views + bx_tokred_add, for
 *     any split into calls, thread count and ISA, in grid and ordinary mode;
 *     the one-pass flow within the documented accuracy of fp64;
 * Bad input and the grid kernels: tests/test_wgrad_errors.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "dl_view.h"
#include "gemm_internal.h"
#include "harness.h"
#include "kernels.h"
#include "tests.h"
#include "tokred_grid.h"
#include "util.h"

/* ---- a small fp32/bf16 matrix ------------------------------------------------ */

typedef struct mx {
  int bf16;
  size_t rows, cols;
  float *v;   /* values (bf16 ones exact) */
  void *data; /* storage */
  int64_t shape[2];
  DLTensor t;
} mx;

static void mx_make(mx *m, int bf16, size_t rows, size_t cols) {
  memset(m, 0, sizeof *m);
  m->bf16 = bf16;
  m->rows = rows;
  m->cols = cols;
  m->v = calloc(rows * cols + 1, sizeof(float));
  m->data = calloc(rows * cols + 16, 4);
  m->shape[0] = (int64_t)rows;
  m->shape[1] = (int64_t)cols;
  m->t = bxt_view(m->data, bf16 ? kDLBfloat : kDLFloat, bf16 ? 16 : 32, 2, m->shape);
}

static void mx_store(mx *m) {
  for (size_t i = 0; i < m->rows * m->cols; i++) {
    if (m->bf16) {
      uint16_t h = bxt_f32_to_bf16(m->v[i]);
      m->v[i] = bxt_bf16_to_f32(h);
      ((uint16_t *)m->data)[i] = h;
    } else {
      ((float *)m->data)[i] = m->v[i];
    }
  }
}

static void mx_fill(bxt_rng *r, mx *m, int spread) {
  for (size_t i = 0; i < m->rows * m->cols; i++) {
    double v = bxt_normal(r);
    if (spread) v = ldexp(v, (int)bxt_below(r, (uint64_t)spread + 1) - spread / 2);
    if (bxt_below(r, 50) == 0) v = 0.0;
    m->v[i] = (float)v;
  }
  mx_store(m);
}

static void mx_free(mx *m) {
  free(m->v);
  free(m->data);
}

static float outf(const mx *m, size_t i) { return ((const float *)m->data)[i]; }

/* a row view [r0, r1) of m */
static DLTensor rows_view(const mx *m, size_t r0, size_t r1, int64_t *shp) {
  DLTensor v = m->t;
  shp[0] = (int64_t)(r1 - r0);
  shp[1] = (int64_t)m->cols;
  v.shape = shp;
  v.byte_offset = r0 * m->cols * (m->bf16 ? 2 : 4);
  return v;
}

/* ---- the chunked TN product (the engine of bx_linear_wgrad) ---------------- */

/* The chunked product (gemm_internal.h, blocking.chunk) with an epilogue:
 * every chunk's blocks equal bx_gemm TN over that chunk's rows alone. */
typedef struct seg_ctx {
  size_t n, k, chunk, nchunks;
  float *got; /* [nchunks][n][k] */
  int calls;
} seg_ctx;

static void seg_epi(void *ctx, int worker, float *c, size_t ldc, size_t k0, size_t row0,
                    size_t col0, size_t rows, size_t cols) {
  (void)worker;
  seg_ctx *s = ctx;
  float *dst = s->got + (k0 / s->chunk) * s->n * s->k;
  for (size_t i = 0; i < rows; i++) memcpy(dst + (row0 + i) * s->k + col0, c + i * ldc, cols * 4);
}

void test_gemm_tn_segments(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  size_t t = 610, n = 53, k = 71;
  static const bx_gemm_blocking blks[] = {{0, 0, 0, 100, 1024}, {0, 0, 32, 256, 0}, {13, 7, 33, 64, 200},
                                          {24, 300, 64, 300, 1024}, {0, 0, 0, 1, 64}, {96, 0, 0, 256, 1024},
                                          {0, 0, 0, 128, 0}};
  mx a, b;
  mx_make(&a, 1, t, n);
  mx_make(&b, 0, t, k);
  mx_fill(&r, &a, 0);
  mx_fill(&r, &b, 0);
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    for (size_t q = 0; q < sizeof blks / sizeof blks[0]; q++) {
      size_t ch = blks[q].chunk, nch = (t + ch - 1) / ch;
      seg_ctx s = {n, k, ch, nch, calloc(nch * n * k, 4), 0};
      mx c, v;
      mx_make(&c, 0, n, k);
      mx_make(&v, 0, n, k);
      bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
      o.num_threads = 1 + (int)(q % 3);
      CHECK_STATUS(bx_gemm_fused("bx_gemm", &a.t, &b.t, BX_GEMM_TN, &c.t, &o, &blks[q], seg_epi, &s),
                   BX_OK, "segments");
      for (size_t j = 0; j < nch; j++) {
        size_t r0 = j * ch, r1 = r0 + ch < t ? r0 + ch : t;
        int64_t sa[2] = {(int64_t)(r1 - r0), (int64_t)n}, sb[2] = {(int64_t)(r1 - r0), (int64_t)k};
        DLTensor va = a.t, vb = b.t;
        va.shape = sa;
        va.byte_offset = r0 * n * 2;
        vb.shape = sb;
        vb.byte_offset = r0 * k * 4;
        CHECK_STATUS(bx_gemm(&va, &vb, BX_GEMM_TN, &v.t, NULL), BX_OK, "view");
        if (!CHECK(memcmp(v.data, s.got + j * n * k, n * k * 4) == 0,
                   "isa %s blocking %zu/%zu/%zu chunk %zu group %zu: segment %zu differs from TN "
                   "on its rows", bxt_isa(isa), blks[q].mc, blks[q].kc, blks[q].nc, ch,
                   blks[q].group_tokens, j))
          break;
      }
      free(s.got);
      mx_free(&c);
      mx_free(&v);
    }
  }
  bxt_force(-1);
  mx_free(&a);
  mx_free(&b);
}

/* ---- bias partials ---------------------------------------------------------------- */

void test_wgrad_bias_partials(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const int threads[] = {1, 2, 3, 8};
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    for (int rep = 0; rep < 8; rep++) {
      size_t t = 1 + bxt_below(&r, 300), n = 1 + bxt_below(&r, rep == 0 ? 2100 : 90);
      int64_t c = rep % 4 == 0 ? (int64_t)t : 1 + (int64_t)bxt_below(&r, 70);
      int bf = rep % 3 == 2;
      size_t nch = (t + (size_t)c - 1) / (size_t)c;
      mx dy, p, ones, col;
      mx_make(&dy, bf, t, n);
      mx_fill(&r, &dy, rep % 2 ? 60 : 0);
      mx_make(&p, 0, nch, n);
      mx_make(&ones, 0, t, 1);
      for (size_t i = 0; i < t; i++) ones.v[i] = 1.0f;
      mx_store(&ones);
      mx_make(&col, 0, n, 1);
      bx_wgrad_opts o = BX_WGRAD_OPTS_DEFAULT;
      o.num_threads = threads[rep % 4];
      CHECK_STATUS(bx_bias_grad_partials(&dy.t, c, &p.t, &o), BX_OK, "bias partials");
      int bad = 0;
      for (size_t j = 0; j < nch && bad < 4; j++) {
        size_t r0 = j * (size_t)c, r1 = r0 + (size_t)c < t ? r0 + (size_t)c : t;
        /* the TN GEMM with a column of ones over the same rows */
        int64_t s1[2], s2[2];
        DLTensor va = rows_view(&dy, r0, r1, s1), vb = rows_view(&ones, r0, r1, s2);
        CHECK_STATUS(bx_gemm(&va, &vb, BX_GEMM_TN, &col.t, NULL), BX_OK, "TN with ones");
        for (size_t i = 0; i < n && bad < 4; i++) {
          float acc = 0.0f;
          double exact = 0.0, mag = 0.0;
          for (size_t q = r0; q < r1; q++) {
            acc = acc + dy.v[q * n + i];
            exact += dy.v[q * n + i];
            mag += fabs((double)dy.v[q * n + i]);
          }
          float got = outf(&p, j * n + i);
          if (!CHECK_BITS_F(got, acc, "isa %s rep %d: chunk %zu column %zu (T %zu C %lld N %zu)",
                            bxt_isa(isa), rep, j, i, t, (long long)c, n))
            bad++;
          if (!CHECK_BITS_F(outf(&col, i), got, "isa %s rep %d: chunk %zu column %zu: TN with "
                            "ones differs", bxt_isa(isa), rep, j, i))
            bad++;
          double m = (double)(r1 - r0), u = 0x1p-24, g = m * u / (1 - m * u);
          if (!CHECK(fabs((double)got - exact) <= g * mag + m * 0x1p-150,
                     "isa %s: chunk %zu column %zu: %a vs fp64 %a", bxt_isa(isa), j, i,
                     (double)got, exact))
            bad++;
        }
      }
      mx_free(&dy);
      mx_free(&p);
      mx_free(&ones);
      mx_free(&col);
    }
  }
  bxt_force(-1);
}

/* ---- the bound ---------------------------------------------------------------------- */

static int exp_of(double v) { /* frexp exponent: |v| < 2^e */
  int e;
  frexp(v, &e);
  return e;
}

void test_wgrad_bound(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  CHECK(bx_wgrad_bound_exp(0, 1.0f, 1.0f) == -149, "rows 0");
  CHECK(bx_wgrad_bound_exp(-3, 1.0f, 1.0f) == -149, "rows < 0");
  CHECK(bx_wgrad_bound_exp(10, 0.0f, 5.0f) == -149, "zero maximum");
  CHECK(bx_wgrad_bound_exp(10, NAN, 5.0f) == 128, "NaN maximum");
  CHECK(bx_wgrad_bound_exp(10, 1.0f, INFINITY) == 128, "Inf maximum");
  CHECK(bx_wgrad_bound_exp(4, 0x1p100f, 0x1p100f) == 128, "beyond 2^128");
  CHECK(bx_wgrad_bound_exp(1, 1.0f, 1.0f) == 1, "1 x 1 x 1: |a| = 1 < 2^1 (got %d)",
        bx_wgrad_bound_exp(1, 1.0f, 1.0f));
  /* four products of 1: the chain is exactly 4 = 2^2, so E must be 3 */
  CHECK(bx_wgrad_bound_exp(4, 1.0f, 1.0f) == 3, "4 x 1 x 1 (got %d)", bx_wgrad_bound_exp(4, 1.0f, 1.0f));
  CHECK(bx_wgrad_bound_exp(4, -1.0f, -1.0f) == 3, "signs ignored");
  CHECK(bx_wgrad_bound_exp(1, 0x1p-149f, 0x1p-149f) == -149, "subnormal products round to 0 or 2^-149");
  CHECK(bx_wgrad_bound_exp(1LL << 40, 1.0f, 1.0f) >= 41, "huge rows");
  /* not looser than 2 binades above M max|a| max|b| (M <= 2^20) */
  for (int i = 0; i < 2000; i++) {
    int64_t m = 1 + (int64_t)bxt_below(&r, 1u << 20);
    float a = (float)ldexp(1 + bxt_uniform(&r), (int)bxt_below(&r, 100) - 50);
    float b = (float)ldexp(1 + bxt_uniform(&r), (int)bxt_below(&r, 100) - 50);
    int e = bx_wgrad_bound_exp(m, a, b), want = exp_of((double)m * a * b);
    CHECK(e >= want && e <= want + 1, "M %lld max %a %a: E %d, M max max has exponent %d",
          (long long)m, (double)a, (double)b, e, want);
    CHECK(bx_wgrad_bound_exp(m + 1, a, b) >= e && bx_wgrad_bound_exp(m, a * 2, b) >= e,
          "monotone");
    if (bxt_failures()) break;
  }
  /* soundness on chunks of the TN GEMM: every element below 2^E, including
   * adversarial ones (all products equal and positive, near powers of two) */
  for (int rep = 0; rep < 60; rep++) {
    size_t t = 1 + bxt_below(&r, 600), n = 1 + bxt_below(&r, 9), k = 1 + bxt_below(&r, 9);
    mx a, b, c;
    mx_make(&a, rep % 5 == 4, t, n);
    mx_make(&b, 0, t, k);
    mx_make(&c, 0, n, k);
    int kind = rep % 3;
    for (size_t i = 0; i < t * n; i++)
      a.v[i] = kind == 0 ? (float)bxt_normal(&r) : kind == 1 ? 1.0f - 0x1p-24f * (float)(i % 3) : 0x1p-75f;
    for (size_t i = 0; i < t * k; i++)
      b.v[i] = kind == 0 ? (float)bxt_normal(&r) : kind == 1 ? 1.0f + 0x1p-23f * (float)(i % 2) : 0x1p-75f;
    mx_store(&a);
    mx_store(&b);
    CHECK_STATUS(bx_gemm(&a.t, &b.t, BX_GEMM_TN, &c.t, NULL), BX_OK, "TN");
    float ma = 0, mb = 0;
    for (size_t i = 0; i < t * n; i++) ma = fabsf(a.v[i]) > ma ? fabsf(a.v[i]) : ma;
    for (size_t i = 0; i < t * k; i++) mb = fabsf(b.v[i]) > mb ? fabsf(b.v[i]) : mb;
    int e = bx_wgrad_bound_exp((int64_t)t, ma, mb);
    for (size_t i = 0; i < n * k; i++)
      if (!CHECK(fabs((double)outf(&c, i)) < ldexp(1.0, e), "rep %d kind %d: |%a| >= 2^%d (T %zu)",
                 rep, kind, (double)outf(&c, i), e, t))
        break;
    mx_free(&a);
    mx_free(&b);
    mx_free(&c);
  }
}

/* ---- bx_linear_wgrad ------------------------------------------------------------------ */

typedef struct wg_case {
  size_t t, n, k;
  int64_t c;
  mx dy, x;
  DLTensor grads[2]; /* W [N,K], b [N] */
  int64_t wshape[2], bshape[1];
} wg_case;

static void case_make(bxt_rng *r, wg_case *w, size_t t, size_t n, size_t k, int64_t c, int bf) {
  w->t = t;
  w->n = n;
  w->k = k;
  w->c = c;
  mx_make(&w->dy, bf, t, n);
  mx_make(&w->x, 0, t, k);
  mx_fill(r, &w->dy, 20);
  mx_fill(r, &w->x, 0);
  w->wshape[0] = (int64_t)n;
  w->wshape[1] = (int64_t)k;
  w->bshape[0] = (int64_t)n;
  w->grads[0] = bxt_f32_view(NULL, 2, w->wshape);
  w->grads[1] = bxt_f32_view(NULL, 1, w->bshape);
}

static void case_free(wg_case *w) {
  mx_free(&w->dy);
  mx_free(&w->x);
}

static size_t nchunks_of(const wg_case *w) { return (w->t + (size_t)w->c - 1) / (size_t)w->c; }

/* The partials by hand: TN on views and the bias partials. part: nch x n x k, bp: nch x n. */
static void case_partials(const wg_case *w, float *part, float *bp) {
  size_t nch = nchunks_of(w);
  for (size_t j = 0; j < nch; j++) {
    size_t r0 = j * (size_t)w->c, r1 = r0 + (size_t)w->c < w->t ? r0 + (size_t)w->c : w->t;
    int64_t s1[2], s2[2], sc[2] = {(int64_t)w->n, (int64_t)w->k};
    DLTensor va = rows_view(&w->dy, r0, r1, s1), vb = rows_view(&w->x, r0, r1, s2);
    DLTensor vc = bxt_f32_view(part + j * w->n * w->k, 2, sc);
    CHECK_STATUS(bx_gemm(&va, &vb, BX_GEMM_TN, &vc, NULL), BX_OK, "TN partial %zu", j);
  }
  int64_t sp[2] = {(int64_t)nch, (int64_t)w->n};
  DLTensor p = bxt_f32_view(bp, 2, sp);
  CHECK_STATUS(bx_bias_grad_partials(&w->dy.t, w->c, &p, NULL), BX_OK, "bias partials");
}

static bx_tokred *state_of(const wg_case *w, int mode) {
  bx_tokred_opts o = BX_TOKRED_OPTS_DEFAULT;
  o.mode = (bx_tokred_mode)mode;
  bx_tokred *s = NULL;
  CHECK_STATUS(bx_tokred_create(w->grads, 2, w->c, (int64_t)w->t, &o, &s), BX_OK, "create");
  return s;
}

/* the state's words (grid) or its finished sums (both modes), for comparison */
static void finished(bx_tokred *s, const wg_case *w, float *outw, float *outb) {
  DLTensor out[2] = {bxt_f32_view(outw, 2, (int64_t *)w->wshape), bxt_f32_view(outb, 1, (int64_t *)w->bshape)};
  CHECK_STATUS(bx_tokred_finish(s, out, 2, 1), BX_OK, "finish: %s", bx_last_error());
}

static int same_words(bx_tokred *a, bx_tokred *b) {
  int64_t *wa, *wb;
  size_t na, nb;
  if (bx_tokred_words(a, &wa, &na) != BX_OK || bx_tokred_words(b, &wb, &nb) != BX_OK) return 0;
  return na == nb && memcmp(wa, wb, na * sizeof *wa) == 0;
}

/* rows [r0, r1) of the case as views, through bx_linear_wgrad */
static bx_status wgrad_rows(bx_tokred *s, const wg_case *w, size_t r0, size_t r1, int threads) {
  int64_t s1[2], s2[2];
  DLTensor vd = rows_view(&w->dy, r0, r1, s1), vx = rows_view(&w->x, r0, r1, s2);
  bx_wgrad_opts o = BX_WGRAD_OPTS_DEFAULT;
  o.num_threads = threads;
  return bx_linear_wgrad(s, 0, 1, &vd, &vx, (int64_t)r0, &o);
}

void test_wgrad_linear(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const int threads[] = {1, 2, 3, 8};
  for (int rep = 0; rep < 8; rep++) {
    wg_case w;
    size_t t = 40 + bxt_below(&r, 700);
    int64_t c = rep == 0 ? (int64_t)t : 16 + (int64_t)bxt_below(&r, 300);
    size_t n = 1 + bxt_below(&r, 70), k = 1 + bxt_below(&r, 90);
    if (rep == 7) { /* a weight of 9 MB of words and partial: the grouped chunks */
      t = 300;
      c = 64;
      n = 1000;
      k = 730;
    }
    case_make(&r, &w, t, n, k, c, rep % 3 == 1);
    size_t nch = nchunks_of(&w);
    float *part = malloc(nch * n * k * sizeof(float) + 4), *bp = malloc(nch * n * sizeof(float) + 4);
    case_partials(&w, part, bp);
    int64_t sw[2] = {(int64_t)n, (int64_t)k}, sb[1] = {(int64_t)n};
    /* reference: bounds from the partials, then bx_tokred_add */
    bx_tokred *ref = state_of(&w, BX_TOKRED_GRID);
    for (size_t j = 0; j < nch; j++) {
      DLTensor pw = bxt_f32_view(part + j * n * k, 2, sw), pb = bxt_f32_view(bp + j * n, 1, sb);
      CHECK_STATUS(bx_tokred_bound(ref, 0, (int64_t)j, &pw), BX_OK, "bound");
      CHECK_STATUS(bx_tokred_bound(ref, 1, (int64_t)j, &pb), BX_OK, "bound");
    }
    CHECK_STATUS(bx_tokred_agree(ref, NULL), BX_OK, "agree");
    for (size_t j = 0; j < nch; j++) {
      DLTensor pw = bxt_f32_view(part + j * n * k, 2, sw), pb = bxt_f32_view(bp + j * n, 1, sb);
      CHECK_STATUS(bx_tokred_add(ref, 0, (int64_t)j, &pw), BX_OK, "add");
      CHECK_STATUS(bx_tokred_add(ref, 1, (int64_t)j, &pb), BX_OK, "add");
    }
    /* bx_linear_wgrad with the same grid, any ISA, threads, split into calls */
    for (int isa = 0; isa < bxt_isa_count(); isa++) {
      if (!bxt_force(isa)) continue;
      bx_tokred *s = state_of(&w, BX_TOKRED_GRID);
      for (size_t j = 0; j < nch; j++) {
        DLTensor pw = bxt_f32_view(part + j * n * k, 2, sw), pb = bxt_f32_view(bp + j * n, 1, sb);
        bx_tokred_bound(s, 0, (int64_t)j, &pw);
        bx_tokred_bound(s, 1, (int64_t)j, &pb);
      }
      CHECK_STATUS(bx_tokred_agree(s, NULL), BX_OK, "agree");
      size_t r0 = 0;
      int th = threads[(rep + isa) % 4];
      while (r0 < t) { /* calls of 1..3 chunks, in this order */
        size_t r1 = r0 + (size_t)c * (1 + bxt_below(&r, 3));
        if (r1 > t) r1 = t;
        CHECK_STATUS(wgrad_rows(s, &w, r0, r1, th), BX_OK, "wgrad [%zu, %zu): %s", r0, r1, bx_last_error());
        r0 = r1;
      }
      CHECK(same_words(s, ref), "rep %d isa %s threads %d: bx_linear_wgrad's words differ from "
            "bx_gemm TN + bx_tokred_add (T %zu C %lld N %zu K %zu)", rep, bxt_isa(isa), th, t,
            (long long)c, n, k);
      bx_tokred_destroy(s);
    }
    bxt_force(-1);
    /* one pass: bound from the inputs, agree, compute and add; equal to the
     * same bound followed by bx_tokred_add of the partials; accurate */
    bx_tokred *one = state_of(&w, BX_TOKRED_GRID), *two = state_of(&w, BX_TOKRED_GRID);
    CHECK_STATUS(bx_linear_wgrad_bound(one, 0, 1, &w.dy.t, &w.x.t, 0, NULL), BX_OK, "bound: %s", bx_last_error());
    CHECK_STATUS(bx_linear_wgrad_bound(two, 0, 1, &w.dy.t, &w.x.t, 0, NULL), BX_OK, "bound");
    CHECK_STATUS(bx_tokred_agree(one, NULL), BX_OK, "agree");
    CHECK_STATUS(bx_tokred_agree(two, NULL), BX_OK, "agree");
    int ge_ref, ge_one;
    bx_tokred_grid_exp(ref, 0, &ge_ref);
    bx_tokred_grid_exp(one, 0, &ge_one);
    CHECK(ge_one >= ge_ref && ge_one <= ge_ref + 16, "rep %d: a-priori grid 2^%d vs 2^%d from the partials",
          rep, ge_one, ge_ref);
    CHECK_STATUS(wgrad_rows(one, &w, 0, t, 0), BX_OK, "one pass: %s", bx_last_error());
    for (size_t j = 0; j < nch; j++) {
      DLTensor pw = bxt_f32_view(part + j * n * k, 2, sw), pb = bxt_f32_view(bp + j * n, 1, sb);
      CHECK_STATUS(bx_tokred_add(two, 0, (int64_t)j, &pw), BX_OK, "add under the a-priori bound");
      CHECK_STATUS(bx_tokred_add(two, 1, (int64_t)j, &pb), BX_OK, "add under the a-priori bound");
    }
    CHECK(same_words(one, two), "rep %d: one-pass words differ from adds under the same bound", rep);
    float *ow = malloc(n * k * sizeof(float)), *ob = malloc(n * sizeof(float));
    finished(one, &w, ow, ob);
    int gb;
    bx_tokred_grid_exp(one, 1, &gb);
    for (size_t i = 0; i < n * k + n; i++) {
      int isb = i >= n * k;
      size_t e = isb ? i - n * k : i;
      double exact = 0.0; /* the sum of the fp32 partials (<= 64 terms, fp64: error ~2^-47 rel) */
      double mag = 0.0;
      for (size_t j = 0; j < nch; j++) {
        double v = isb ? bp[j * n + e] : part[j * n * k + e];
        exact += v;
        mag += fabs(v);
      }
      double got = isb ? ob[e] : ow[e];
      double lim = (double)nch * ldexp(1.0, (isb ? gb : ge_one) - 1) + fabs(got) * 0x1p-24 + mag * 0x1p-50;
      if (!CHECK(fabs(got - exact) <= lim, "rep %d element %zu: %a vs %a", rep, i, got, exact)) break;
    }
    free(ow);
    free(ob);
    /* ordinary mode: the fp32 sums of bx_tokred_add in chunk order */
    bx_tokred *oa = state_of(&w, BX_TOKRED_ORDINARY), *ob2 = state_of(&w, BX_TOKRED_ORDINARY);
    bx_tokred_agree(oa, NULL);
    bx_tokred_agree(ob2, NULL);
    CHECK_STATUS(wgrad_rows(oa, &w, 0, t, 2), BX_OK, "ordinary");
    for (size_t j = 0; j < nch; j++) {
      DLTensor pw = bxt_f32_view(part + j * n * k, 2, sw), pb = bxt_f32_view(bp + j * n, 1, sb);
      bx_tokred_add(ob2, 0, (int64_t)j, &pw);
      bx_tokred_add(ob2, 1, (int64_t)j, &pb);
    }
    float *w1 = malloc(n * k * 4), *w2 = malloc(n * k * 4), *b1 = malloc(n * 4), *b2 = malloc(n * 4);
    finished(oa, &w, w1, b1);
    finished(ob2, &w, w2, b2);
    CHECK(memcmp(w1, w2, n * k * 4) == 0 && memcmp(b1, b2, n * 4) == 0, "rep %d: ordinary mode differs", rep);
    free(w1);
    free(w2);
    free(b1);
    free(b2);
    bx_tokred_destroy(oa);
    bx_tokred_destroy(ob2);
    bx_tokred_destroy(one);
    bx_tokred_destroy(two);
    bx_tokred_destroy(ref);
    free(part);
    free(bp);
    case_free(&w);
    if (bxt_failures()) break;
  }
}
