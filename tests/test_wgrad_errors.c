/*
 * test_wgrad_errors.c — the weight-gradient calls' bad input (named
 * errors, nothing written; a bound violation in a later chunk undoes the
 * earlier chunks exactly) and the token reduction's grid kernels of every
 * ISA against the scalar rule of tokred_grid.h (random bits, exact halves
 * -> even, subnormals, the bound edge, NaN/Inf, every tail length, values
 * outside the grid's range), the maximum kernels likewise, and through
 * bx_tokred_add under every ISA.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "dl_view.h"
#include "harness.h"
#include "kernels.h"
#include "tests.h"
#include "tokred_grid.h"
#include "util.h"

static void fill(bxt_rng *r, float *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (float)bxt_normal(r);
}

static int mentions(const char *word) { return strstr(bx_last_error(), word) != NULL; }

/* words snapshot */
static int64_t *snap(bx_tokred *s, size_t *n) {
  int64_t *w;
  if (bx_tokred_words(s, &w, n) != BX_OK) return NULL;
  int64_t *c = malloc(*n * sizeof *c + 8);
  memcpy(c, w, *n * sizeof *c);
  return c;
}

static int unchanged(bx_tokred *s, const int64_t *before, size_t n) {
  int64_t *w;
  size_t m;
  return bx_tokred_words(s, &w, &m) == BX_OK && m == n && memcmp(w, before, n * sizeof *w) == 0;
}

void test_wgrad_bad_input(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  enum { T = 40, N = 6, K = 5, C = 10 };
  float dy[T * N], x[T * K], part[4 * N], before[4 * N];
  fill(&r, dy, T * N);
  fill(&r, x, T * K);
  int64_t sdy[2] = {T, N}, sx[2] = {T, K}, sp[2] = {4, N}, sw[2] = {N, K}, sb[1] = {N};
  DLTensor tdy = bxt_f32_view(dy, 2, sdy), tx = bxt_f32_view(x, 2, sx), tp = bxt_f32_view(part, 2, sp);
  /* bias partials */
  for (int i = 0; i < 4 * N; i++) part[i] = before[i] = -7.0f;
#define BIAS_FAIL(call, want, word, what)                                                     \
  do {                                                                                        \
    CHECK_STATUS(call, want, "%s", what);                                                     \
    CHECK(mentions("bx_bias_grad_partials") && mentions(word), "%s: message '%s' lacks '%s'", \
          what, bx_last_error(), word);                                                       \
    CHECK(memcmp(part, before, sizeof part) == 0, "%s: partials written", what);              \
  } while (0)
  BIAS_FAIL(bx_bias_grad_partials(NULL, C, &tp, NULL), BX_EINVAL, "dy", "NULL dy");
  BIAS_FAIL(bx_bias_grad_partials(&tdy, 0, &tp, NULL), BX_EINVAL, "chunk_tokens", "C = 0");
  BIAS_FAIL(bx_bias_grad_partials(&tdy, 7, &tp, NULL), BX_EINVAL, "nchunks", "wrong chunk count");
  DLTensor bad = tdy;
  bad.dtype.bits = 64;
  BIAS_FAIL(bx_bias_grad_partials(&bad, C, &tp, NULL), BX_EDTYPE, "dy", "fp64 dy");
  bad = tp;
  bad.dtype.code = kDLBfloat;
  bad.dtype.bits = 16;
  BIAS_FAIL(bx_bias_grad_partials(&tdy, C, &bad, NULL), BX_EDTYPE, "partials", "bf16 partials");
  bad = tdy;
  bad.device.device_type = kDLCUDA;
  BIAS_FAIL(bx_bias_grad_partials(&bad, C, &tp, NULL), BX_EDEVICE, "dy", "CUDA dy");
  int64_t gap[2] = {N + 1, 1};
  bad = tdy;
  bad.strides = gap;
  BIAS_FAIL(bx_bias_grad_partials(&bad, C, &tp, NULL), BX_ELAYOUT, "row-major", "strided dy");
  DLTensor ov = tp;
  ov.data = dy; /* partials inside dy */
  float keep[4 * N];
  memcpy(keep, dy, sizeof keep);
  CHECK_STATUS(bx_bias_grad_partials(&tdy, C, &ov, NULL), BX_ELAYOUT, "overlap");
  CHECK(mentions("overlaps") && memcmp(keep, dy, sizeof keep) == 0, "overlap: '%s'", bx_last_error());
  bx_wgrad_opts o = BX_WGRAD_OPTS_DEFAULT;
  o.struct_size = 3;
  BIAS_FAIL(bx_bias_grad_partials(&tdy, C, &tp, &o), BX_EINVAL, "struct_size", "struct_size");
  o = (bx_wgrad_opts)BX_WGRAD_OPTS_DEFAULT;
  o.num_threads = -2;
  BIAS_FAIL(bx_bias_grad_partials(&tdy, C, &tp, &o), BX_EINVAL, "num_threads", "threads");
  CHECK_STATUS(bx_bias_grad_partials(&tdy, C, &tp, NULL), BX_OK, "good call after errors");

  /* the state calls */
  DLTensor grads[2] = {bxt_f32_view(NULL, 2, sw), bxt_f32_view(NULL, 1, sb)};
  bx_tokred *s = NULL;
  CHECK_STATUS(bx_tokred_create(grads, 2, C, T, NULL, &s), BX_OK, "create");
  CHECK_STATUS(bx_linear_wgrad(s, 0, 1, &tdy, &tx, 0, NULL), BX_EINVAL, "before agree");
  CHECK(mentions("bx_linear_wgrad") && mentions("agreed"), "'%s'", bx_last_error());
  int64_t s30[2] = {30, N}, s30x[2] = {30, K};
  DLTensor dy30 = tdy, x30 = tx;
  dy30.shape = s30;
  x30.shape = s30x;
  CHECK_STATUS(bx_linear_wgrad_bound(s, 0, 1, &dy30, &x30, 5, NULL), BX_ELAYOUT, "misaligned rows");
  CHECK(mentions("bx_linear_wgrad_bound") && mentions("whole chunks"), "'%s'", bx_last_error());
  CHECK_STATUS(bx_linear_wgrad_bound(s, 0, 1, &tdy, &x30, 0, NULL), BX_EINVAL, "x rows differ");
  CHECK(mentions("rows"), "'%s'", bx_last_error());
  CHECK_STATUS(bx_linear_wgrad_bound(s, 1, 0, &tdy, &tx, 0, NULL), BX_ELAYOUT, "swapped tensors");
  CHECK(mentions("tensor 1") && mentions("[N = 6, K = 5]"), "'%s'", bx_last_error());
  CHECK_STATUS(bx_linear_wgrad_bound(s, 0, 0, &tdy, &tx, 0, NULL), BX_EINVAL, "same index");
  CHECK_STATUS(bx_linear_wgrad_bound(s, BX_WGRAD_NONE, BX_WGRAD_NONE, &tdy, &tx, 0, NULL), BX_EINVAL, "none");
  CHECK_STATUS(bx_linear_wgrad_bound(s, 2, 1, &tdy, &tx, 0, NULL), BX_EINVAL, "index 2");
  CHECK(mentions("does not exist"), "'%s'", bx_last_error());
  CHECK_STATUS(bx_linear_wgrad_bound(s, 0, 1, &tdy, NULL, 0, NULL), BX_EINVAL, "NULL x");
  CHECK_STATUS(bx_linear_wgrad_bound(s, BX_WGRAD_NONE, 1, &tdy, NULL, 0, NULL), BX_OK, "bias only, x NULL");
  /* a stated bound too small for chunk 2 only: chunks 0 and 1 are added,
   * chunk 2 fails, and the words come back as they were */
  for (int i = 2 * C * N; i < 3 * C * N; i++) dy[i] *= 1024.0f;
  int e01 = -149;
  for (int c = 0; c < 2; c++) {
    float ma = 0, mb = 0;
    for (int i = c * C * N; i < (c + 1) * C * N; i++) ma = fabsf(dy[i]) > ma ? fabsf(dy[i]) : ma;
    for (int i = c * C * K; i < (c + 1) * C * K; i++) mb = fabsf(x[i]) > mb ? fabsf(x[i]) : mb;
    int e = bx_wgrad_bound_exp(C, ma, mb);
    e01 = e > e01 ? e : e01;
  }
  CHECK_STATUS(bx_tokred_bound_exp(s, 0, e01), BX_OK, "stated bound");
  CHECK_STATUS(bx_tokred_bound_exp(s, 1, 40), BX_OK, "stated bound");
  CHECK_STATUS(bx_tokred_agree(s, NULL), BX_OK, "agree");
  CHECK_STATUS(bx_linear_wgrad_bound(s, 0, 1, &tdy, &tx, 0, NULL), BX_EINVAL, "bound after agree");
  CHECK(mentions("already agreed"), "'%s'", bx_last_error());
  size_t nw;
  int64_t *w0 = snap(s, &nw);
  CHECK_STATUS(bx_linear_wgrad(s, 0, 1, &tdy, &tx, 0, NULL), BX_EINVAL, "chunk 2 above the bound");
  CHECK(mentions("tensor 0") && mentions("chunk 2") && mentions("bound"), "'%s'", bx_last_error());
  CHECK(unchanged(s, w0, nw), "the words changed after a failed bx_linear_wgrad");
  bx_tokred_destroy(s);
  free(w0);
  /* the bias over its bound, in chunk 3, after the weights of chunks 0..3 */
  CHECK_STATUS(bx_tokred_create(grads, 2, C, T, NULL, &s), BX_OK, "create");
  float mb3 = 0;
  for (int i = 0; i < 3 * C * N; i++) mb3 = fabsf(dy[i]) > mb3 ? fabsf(dy[i]) : mb3;
  for (int i = 3 * C * N; i < T * N; i++) dy[i] = 4.0f * mb3;
  CHECK_STATUS(bx_linear_wgrad_bound(s, 0, BX_WGRAD_NONE, &tdy, &tx, 0, NULL), BX_OK, "bound");
  CHECK_STATUS(bx_tokred_bound_exp(s, 1, bx_wgrad_bound_exp(C, mb3, 1.0f)), BX_OK, "bias bound");
  bx_tokred_agree(s, NULL);
  w0 = snap(s, &nw);
  CHECK_STATUS(bx_linear_wgrad(s, 0, 1, &tdy, &tx, 0, NULL), BX_EINVAL, "bias chunk 3 above the bound");
  CHECK(mentions("tensor 1") && mentions("chunk 3"), "'%s'", bx_last_error());
  CHECK(unchanged(s, w0, nw), "the words changed after a failed bx_linear_wgrad (bias)");
  o = (bx_wgrad_opts)BX_WGRAD_OPTS_DEFAULT;
  o.struct_size = 0;
  CHECK_STATUS(bx_linear_wgrad(s, 0, 1, &tdy, &tx, 0, &o), BX_EINVAL, "struct_size");
  CHECK(mentions("struct_size") && unchanged(s, w0, nw), "'%s'", bx_last_error());
  bx_tokred_destroy(s);
  free(w0);
}

/* ---- the grid kernels ------------------------------------------------------------ */

/* the scalar rule of tokred_grid.h */
static uint32_t ref_grid_add(int64_t *w, const float *a, size_t n, double inv, int64_t *nf) {
  uint32_t mx = 0;
  *nf = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t ab = bxt_fbits(a[i]) & 0x7fffffffu;
    if (ab >= 0x7f800000u) {
      (*nf)++;
      continue;
    }
    mx = ab > mx ? ab : mx;
    w[i] = (int64_t)((uint64_t)w[i] + (uint64_t)bx_tokred_q(a[i], inv)); /* modulo 2^64 */
  }
  return mx;
}

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

void test_wgrad_grid_kernels(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  enum { MAXN = 300 };
  float a[MAXN];
  int64_t w0[MAXN], wref[MAXN], wk[MAXN];
  for (int rep = 0; rep < 3000; rep++) {
    size_t n = rep < 100 ? (size_t)rep : bxt_below(&r, MAXN + 1);
    int E = (int)bxt_below(&r, 200) - 120, P = 51 - (int)bxt_below(&r, 12);
    double inv = bx_tokred_pow2(P - E); /* the grid 2^(E - P) */
    int kind = rep % 6;
    for (size_t i = 0; i < n; i++) {
      uint32_t u;
      switch (kind) {
      case 0: u = (uint32_t)bxt_next(&r); break; /* any bits: NaN, Inf, subnormals, big */
      case 1: /* exact halves of the grid step: ties to even */
        a[i] = (float)ldexp((double)((int64_t)bxt_below(&r, 1u << 20) - (1 << 19)) + 0.5, E - P);
        u = bxt_fbits(a[i]);
        break;
      case 2: u = (uint32_t)bxt_below(&r, 1u << 24) | ((uint32_t)bxt_below(&r, 2) << 31); break; /* subnormal, tiny */
      case 3: { /* the bound edge: just below, at and above 2^E */
        uint32_t lim = bx_tokred_abs_limit(E < -149 ? -149 : E);
        u = lim - 2 + (uint32_t)bxt_below(&r, 4);
        if (bxt_below(&r, 2)) u |= 0x80000000u;
        break;
      }
      case 4: u = bxt_fbits((float)ldexp(bxt_normal(&r), E - 3)); break;
      default: {
        static const uint32_t sp[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
                                      0x80000000u, 0, 1, 0x80000001u, 0x00800000u, 0x7f7fffffu};
        u = bxt_below(&r, 3) ? sp[bxt_below(&r, sizeof sp / sizeof sp[0])] : (uint32_t)bxt_next(&r);
      }
      }
      a[i] = from_bits(u);
      w0[i] = (int64_t)(bxt_next(&r) >> 2) - ((int64_t)1 << 61);
    }
    memcpy(wref, w0, n * sizeof *w0);
    int64_t nfr, nfk;
    uint32_t mref = ref_grid_add(wref, a, n, inv, &nfr);
    for (int isa = 0; isa < bxt_isa_count(); isa++) {
      if (!bxt_force(isa)) continue;
      memcpy(wk, w0, n * sizeof *w0);
      nfk = -1;
      uint32_t mk = bx_tokred_kernels_active()->grid_add(wk, a, n, inv, &nfk);
      uint32_t mm = bx_tokred_kernels_active()->max_abs(a, n);
      CHECK(mm == mref, "rep %d n %zu isa %s: max_abs %#x, want %#x", rep, n, bxt_isa(isa), mm, mref);
      if (!CHECK(mk == mref && nfk == nfr && memcmp(wk, wref, n * sizeof *wk) == 0,
                 "rep %d kind %d n %zu isa %s (table %s): max %#x vs %#x, non-finite %lld vs %lld, "
                 "words %s", rep, kind, n, bxt_isa(isa), bx_tokred_kernels_active()->name, mk, mref,
                 (long long)nfk, (long long)nfr,
                 memcmp(wk, wref, n * sizeof *wk) ? "differ" : "equal"))
        break;
    }
    if (bxt_failures()) break;
  }
  /* ties: q(0.5 step) = 0, q(1.5 step) = 2, q(2.5 step) = 2, q(-2.5 step) = -2 */
  float ties[4] = {0x1p-11f, 0x3p-11f, 0x5p-11f, -0x5p-11f};
  int64_t want[4] = {0, 2, 2, -2};
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    int64_t tw[4] = {0, 0, 0, 0}, nf;
    bx_tokred_kernels_active()->grid_add(tw, ties, 4, 0x1p10, &nf);
    CHECK(memcmp(tw, want, sizeof tw) == 0, "isa %s: halves %lld %lld %lld %lld, want 0 2 2 -2",
          bxt_isa(isa), (long long)tw[0], (long long)tw[1], (long long)tw[2], (long long)tw[3]);
  }
  /* through the public call: one state's words equal under every ISA */
  int64_t sh[1] = {1000};
  DLTensor g = bxt_f32_view(NULL, 1, sh);
  float *p = malloc(1000 * sizeof(float));
  for (int i = 0; i < 1000; i++) p[i] = (float)ldexp(bxt_normal(&r), (int)bxt_below(&r, 40) - 20);
  p[7] = NAN;
  p[8] = -INFINITY;
  DLTensor tp = bxt_f32_view(p, 1, sh);
  int64_t *first = NULL;
  size_t nfirst = 0;
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    bx_tokred *s = NULL;
    bx_tokred_create(&g, 1, 1, 3, NULL, &s);
    for (int c = 0; c < 3; c++) bx_tokred_bound(s, 0, c, &tp);
    bx_tokred_agree(s, NULL);
    for (int c = 0; c < 3; c++) CHECK_STATUS(bx_tokred_add(s, 0, c, &tp), BX_OK, "add");
    int64_t *w;
    size_t nw;
    bx_tokred_words(s, &w, &nw);
    CHECK(w[1000] == 6, "isa %s: non-finite word %lld, want 6", bxt_isa(isa), (long long)w[1000]);
    if (!first) {
      first = malloc(nw * sizeof *w);
      memcpy(first, w, nw * sizeof *w);
      nfirst = nw;
    } else {
      CHECK(nw == nfirst && memcmp(first, w, nw * sizeof *w) == 0, "isa %s: bx_tokred_add's words "
            "differ from isa %s's", bxt_isa(isa), bxt_isa(0));
    }
    bx_tokred_destroy(s);
  }
  bxt_force(-1);
  free(first);
  free(p);
}
