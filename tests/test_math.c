/*
 * test_math.c — the elementwise functions of math_det.h and their tensor
 * and scalar entries (bitexact_train.h) against MPFR: every result must be
 * the correctly rounded one, bit for bit (they are for all 2^32 inputs:
 * dev/math_exhaustive.c; here a sample that runs in the suite). Inputs:
 * special values, subnormals, the overflow / underflow / saturation
 * thresholds and their neighbours, large RoPE angles, random bit patterns
 * and random values in each function's interesting range. The tensor
 * calls must equal the scalar function under every ISA and thread count,
 * in place or not; bad arguments give named errors and write nothing.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpfr.h>
#include "bitexact_train.h"
#include "harness.h"
#include "kernels.h"
#include "math_det.h"
#include "math_ref.h"
#include "mpfr_ref.h"
#include "tests.h"
#include "util.h"

enum {
  F_EXP = MREF_EXP, F_LOG = MREF_LOG, F_SIGMOID = MREF_SIGMOID, F_SILU = MREF_SILU,
  F_RSQRT = MREF_RSQRT, F_SIN = MREF_SIN, F_COS = MREF_COS, NFUNC = MREF_NFUNC
};
#define NAMES MREF_NAMES

static float pub_scalar(int f, float x) {
  switch (f) {
  case F_EXP: return bx_exp_f32(x);
  case F_LOG: return bx_log_f32(x);
  case F_SIGMOID: return bx_sigmoid_f32(x);
  case F_SILU: return bx_silu_f32(x);
  case F_RSQRT: return bx_rsqrt_f32(x);
  case F_SIN: return bx_sin_f32(x);
  default: return bx_cos_f32(x);
  }
}

typedef bx_status (*tensor_fn)(const DLTensor *, DLTensor *, const bx_math_opts *);
static const tensor_fn TENSOR_FNS[NFUNC] = {bx_exp, bx_log, bx_sigmoid, bx_silu,
                                            bx_rsqrt, bx_sin, bx_cos};

static uint32_t fb(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The correctly rounded f(x): tests/math_ref.h (MPFR, math_det.h's rules
 * for the special values), the reference dev/math_exhaustive.c uses too. */
static float reference(int f, float x) { return math_ref(f, x, NULL); }

static const float SPECIAL[] = {
    0.0f, -0.0f, INFINITY, -INFINITY, 1.0f, -1.0f, 0.5f, 2.0f, 0x1p-149f, -0x1p-149f,
    0x1p-126f, 0x1.fffffcp-127f, FLT_MAX, -FLT_MAX, 0x1p-12f, 0x1.fffffep-13f, 0x1p-60f,
    -0x1p-60f, 0x1.fffffep-61f, 88.72283935546875f, 88.7228469848632812f, 89.0f, 89.0000076f,
    -103.972084f, -103.97208f, -104.0f, -87.3365402f, -87.3365478f, 40.0f, 39.9999962f,
    -110.0f, -109.999992f, 17.3286800f, 16.6355324f, 0x1p28f, 0x1.fffffep27f, -0x1.fffffep27f,
    1.5707963f, 3.14159274f, 6.28318548f, 1e6f, 1048576.0f, 131071.0f, 12582912.0f,
    0x1.921fb6p+0f, 0x1.921fb6p+1f, 0x1.fe0000p-1f, 0x1.000002p0f, 0x1.6a09e6p+0f,
    0x1.6a09e8p+0f, 0x1.6a09e6p-1f, 4.0f, 0.25f, 0x1p-148f, 0x1p127f, 1e-30f, -1e-30f};
#define NSPECIAL (sizeof SPECIAL / sizeof SPECIAL[0])

typedef struct stats {
  long n, ok;
} stats;

static void check_one(int f, float x, stats *st) {
  float got = mref_det(f, x), want = reference(f, x);
  st->n++;
  if (fb(got) == fb(want)) {
    st->ok++;
    return;
  }
  if (bxt_failures() < 20)
    CHECK(0, "%s(%a = 0x%08x): got %a (0x%08x), correctly rounded %a (0x%08x)", NAMES[f],
          (double)x, fb(x), (double)got, fb(got), (double)want, fb(want));
  else
    bxt_check(0, __FILE__, __LINE__, "fb(got) == fb(want)", "further mismatch");
}

/* x drawn for function f: half random bit patterns, half values in the
 * range where its result is neither saturated nor trivially x. */
static float draw(bxt_rng *r, int f) {
  uint64_t u = bxt_next(r);
  if (u & 1) return bf((uint32_t)(u >> 32));
  double t = bxt_uniform(r);
  double s = (u & 2) ? -1.0 : 1.0;
  switch (f) {
  case F_EXP: return (float)(-104.0 + 193.0 * t);
  case F_LOG:
  case F_RSQRT: return bf((uint32_t)(bxt_below(r, 0x7f800000u)));
  case F_SIGMOID:
  case F_SILU:
    if (u & 4) return (float)(-110.0 + 150.0 * t);
    return (float)(s * ldexp(1.0, -(int)bxt_below(r, 149)) * (1 + t));
  default: /* RoPE angles: position times an inverse frequency, up to 2^28 */
    return (float)(s * ldexp(1.0 + t, (int)bxt_below(r, 40) - 12));
  }
}

void test_math_vs_mpfr(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int f = 0; f < NFUNC; f++) {
    stats st = {0, 0};
    for (size_t i = 0; i < NSPECIAL; i++) {
      check_one(f, SPECIAL[i], &st);
      /* neighbours of each special value */
      check_one(f, bf(fb(SPECIAL[i]) + 1u), &st);
      check_one(f, bf(fb(SPECIAL[i]) - 1u), &st);
    }
    /* NaN payloads, signalling and quiet, both signs */
    const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fffffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) check_one(f, bf(nans[i]), &st);
    /* every subnormal exponent, and the first 2^12 subnormals */
    for (uint32_t k = 0; k < 4096; k++) check_one(f, bf(k * 1021u + 1u), &st);
    for (int i = 0; i < 40000; i++) check_one(f, draw(&r, f), &st);
    printf("  %-8s %ld inputs, %ld correctly rounded\n", NAMES[f], st.n, st.ok);
  }
}

/* The tensor calls and the scalar entries equal math_det.h bit for bit,
 * under every ISA and thread count, in place and not, with a strided
 * (transposed, dense) layout. */
void test_math_tensor_invariance(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const size_t n = 100003; /* several pieces of 2^14 and a tail */
  bxt_tensor x, y, z;
  bxt_tensor_alloc(&x, REF_F32, n);
  bxt_tensor_alloc(&y, REF_F32, n);
  bxt_tensor_alloc(&z, REF_F32, n);
  float *xs = x.buf, *ys = y.buf, *zs = z.buf;
  for (int f = 0; f < NFUNC; f++) {
    for (size_t i = 0; i < n; i++) xs[i] = draw(&r, f);
    long bad = 0;
    for (size_t i = 0; i < n; i++)
      if (fb(pub_scalar(f, xs[i])) != fb(mref_det(f, xs[i]))) bad++;
    CHECK(bad == 0, "%s: bx_%s_f32 differs from the inline function on %ld inputs", NAMES[f],
          NAMES[f], bad);
    const int threads[] = {1, 2, 3, 7};
    for (int isa = 0; isa < bxt_isa_count(); isa++) {
      bxt_force(isa);
      for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
        bx_math_opts o = BX_MATH_OPTS_DEFAULT;
        o.num_threads = threads[ti];
        memset(ys, 0xa5, n * 4);
        CHECK_STATUS(TENSOR_FNS[f](&x.t, &y.t, &o), BX_OK, "bx_%s", NAMES[f]);
        bad = 0;
        for (size_t i = 0; i < n; i++)
          if (fb(ys[i]) != fb(mref_det(f, xs[i]))) bad++;
        CHECK(bad == 0, "bx_%s, isa %s, %d threads: %ld elements differ", NAMES[f],
              bxt_isa(isa), threads[ti], bad);
      }
      /* in place */
      memcpy(zs, xs, n * 4);
      CHECK_STATUS(TENSOR_FNS[f](&z.t, &z.t, NULL), BX_OK, "bx_%s in place", NAMES[f]);
      CHECK(memcmp(zs, ys, n * 4) == 0, "bx_%s in place differs (isa %s)", NAMES[f],
            bxt_isa(isa));
    }
    bxt_force(-1);
  }
  /* a transposed dense 2-D view: shape (7, 9), strides (1, 7), both x and y */
  int64_t shape[2] = {7, 9}, strides[2] = {1, 7};
  DLTensor xt = x.t, yt = y.t;
  xt.ndim = yt.ndim = 2;
  xt.shape = yt.shape = shape;
  xt.strides = yt.strides = strides;
  memset(ys, 0, 63 * 4);
  CHECK_STATUS(bx_exp(&xt, &yt, NULL), BX_OK, "bx_exp transposed");
  long bad = 0;
  for (size_t i = 0; i < 63; i++)
    if (fb(ys[i]) != fb(bx_expf_det(xs[i]))) bad++;
  CHECK(bad == 0, "bx_exp transposed: %ld differ", bad);
  bxt_tensor_free(&x);
  bxt_tensor_free(&y);
  bxt_tensor_free(&z);
}

static int untouched(const float *y, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (fb(y[i]) != 0x12345678u) return 0;
  return 1;
}

void test_math_errors(void) {
  const size_t n = 64;
  bxt_tensor x, y, d;
  bxt_tensor_alloc(&x, REF_F32, n + 8);
  bxt_tensor_alloc(&y, REF_F32, n);
  bxt_tensor_alloc(&d, REF_F64, n);
  for (size_t i = 0; i < n + 8; i++) ((float *)x.buf)[i] = (float)i;
  float *ys = y.buf;
#define RESET() for (size_t i = 0; i < n; i++) ys[i] = bf(0x12345678u)
  x.shape[0] = (int64_t)n;
  for (int f = 0; f < NFUNC; f++) {
    tensor_fn fn = TENSOR_FNS[f];
    RESET();
    CHECK_STATUS(fn(NULL, &y.t, NULL), BX_EINVAL, "bx_%s: NULL x", NAMES[f]);
    CHECK_STATUS(fn(&x.t, NULL, NULL), BX_EINVAL, "bx_%s: NULL y", NAMES[f]);
    CHECK_STATUS(fn(&d.t, &y.t, NULL), BX_EDTYPE, "bx_%s: fp64 x", NAMES[f]);
    CHECK(strstr(bx_last_error(), "tensor 0") != NULL, "names tensor 0: %s", bx_last_error());
    CHECK_STATUS(fn(&x.t, &d.t, NULL), BX_EDTYPE, "bx_%s: fp64 y", NAMES[f]);
    CHECK(strstr(bx_last_error(), "tensor 1") != NULL, "names tensor 1: %s", bx_last_error());
    y.shape[0] = (int64_t)n - 1;
    CHECK_STATUS(fn(&x.t, &y.t, NULL), BX_EINVAL, "bx_%s: shape", NAMES[f]);
    CHECK(strstr(bx_last_error(), "shape") != NULL, "says shape: %s", bx_last_error());
    y.shape[0] = (int64_t)n;
    /* y overlapping x partly: x's view shifted by 4 elements */
    DLTensor xs = x.t;
    xs.byte_offset = 16;
    CHECK_STATUS(fn(&xs, &x.t, NULL), BX_ELAYOUT, "bx_%s: partial overlap", NAMES[f]);
    CHECK(strstr(bx_last_error(), "overlaps") != NULL, "says overlaps: %s", bx_last_error());
    DLDevice cuda = {kDLCUDA, 0};
    DLTensor yc = y.t;
    yc.device = cuda;
    CHECK(fn(&x.t, &yc, NULL) != BX_OK, "bx_%s: CUDA y refused", NAMES[f]);
    bx_math_opts o = BX_MATH_OPTS_DEFAULT;
    o.num_threads = -1;
    CHECK_STATUS(fn(&x.t, &y.t, &o), BX_EINVAL, "bx_%s: negative threads", NAMES[f]);
    o = (bx_math_opts)BX_MATH_OPTS_DEFAULT;
    o.struct_size = sizeof o - 1;
    CHECK_STATUS(fn(&x.t, &y.t, &o), BX_EINVAL, "bx_%s: struct_size", NAMES[f]);
    CHECK(strstr(bx_last_error(), "struct_size") != NULL, "names struct_size: %s",
          bx_last_error());
    CHECK(untouched(ys, n), "bx_%s: y written by a failing call", NAMES[f]);
    /* and a good call still works after all that */
    CHECK_STATUS(fn(&x.t, &y.t, NULL), BX_OK, "bx_%s after errors", NAMES[f]);
    CHECK(fb(ys[3]) == fb(mref_det(f, 3.0f)), "bx_%s(3)", NAMES[f]);
  }
#undef RESET
  bxt_tensor_free(&x);
  bxt_tensor_free(&y);
  bxt_tensor_free(&d);
}

/* ---- the vector kernels (kernels.h's bx_math_kernels) ----------------------- */

static bx_math_fn table_fn(const bx_math_kernels *k, int f) {
  switch (f) {
  case F_EXP: return k->exp;
  case F_LOG: return k->log;
  case F_SIGMOID: return k->sigmoid;
  case F_SILU: return k->silu;
  case F_RSQRT: return k->rsqrt;
  case F_SIN: return k->sin;
  default: return k->cos;
  }
}

/* Bits where the vector path changes: its range limits (exp -87 / 88.5,
 * sigmoid -87 / 40, SiLU -80 / 40 / 2^-60, rsqrt 2^-149 / FLT_MAX, log
 * 2^-126) and the scalar functions' worst inputs (math_det.h: the
 * closest to a midpoint of all 2^32). */
static const float VEC_EDGES[] = {
    -87.0f, 88.5f, -80.0f, 0x1.3ffffep+5f, 0x1p-149f, 0x1p-126f, FLT_MAX, 0x1p-60f, -0x1p-60f,
    -0x1.d2259ap+3f, 0x1.22d57p-65f, 0x1p-23f, 0x1.7431c6p-125f, 0x1.33333p+13f, 0x1p-12f,
    -0x1.d2259ap+3f, 1.0f, 0x1.fffffep-1f, 0x1.000002p+0f, 2.0f, 0.5f};

/* in[0..n) through the active table's kernel for f: every result must be
 * the scalar function's bits; in place too. Returns the mismatches. */
static long vec_check(int f, const float *in, size_t n, float *out, float *tmp) {
  bx_math_fn fn = table_fn(bx_math_kernels_active(), f);
  long bad = 0;
  fn(in, out, n);
  memcpy(tmp, in, n * 4);
  fn(tmp, tmp, n);
  for (size_t i = 0; i < n; i++) {
    uint32_t want = fb(mref_det(f, in[i]));
    if (fb(out[i]) != want || fb(tmp[i]) != want) {
      if (bad < 5)
        CHECK(0, "%s kernel %s: x = %a (0x%08x): got 0x%08x (in place 0x%08x), scalar 0x%08x",
              NAMES[f], bx_math_kernels_active()->name, (double)in[i], fb(in[i]), fb(out[i]),
              fb(tmp[i]), want);
      bad++;
    }
  }
  return bad;
}

/* Every kernel table this CPU runs (each ISA forced) against the scalar
 * functions, bit for bit: the edge values above and math_vs_mpfr's special
 * values, each with its 8 neighbours either side and both signs; runs of
 * 2^18 consecutive bit patterns from four starting points (they hold
 * near-midpoint inputs that the kernels redo); random bit patterns and
 * random values per function; every length 0..70 at every offset 0..3
 * (the tails, unaligned), in place and not. */
void test_math_vector_kernels(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const size_t cap = (size_t)1 << 20;
  float *in = malloc(cap * 4), *out = malloc(cap * 4), *tmp = malloc(cap * 4);
  if (!in || !out || !tmp) {
    CHECK(0, "out of memory");
    free(in), free(out), free(tmp);
    return;
  }
  static const uint32_t starts[] = {0x3f800000u, 0xc1200000u, 0x3c000000u, 0x00000001u};
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    for (int f = 0; f < NFUNC; f++) {
      long bad = 0;
      size_t n = 0;
      for (int list = 0; list < 2; list++) {
        const float *v = list ? SPECIAL : VEC_EDGES;
        size_t nv = list ? NSPECIAL : sizeof VEC_EDGES / sizeof VEC_EDGES[0];
        for (size_t i = 0; i < nv; i++)
          for (int d = -8; d <= 8; d++) {
            in[n++] = bf(fb(v[i]) + (uint32_t)d);
            in[n++] = bf((fb(v[i]) + (uint32_t)d) ^ 0x80000000u);
          }
      }
      const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u};
      for (size_t i = 0; i < 4; i++) in[n++] = bf(nans[i]);
      bad += vec_check(f, in, n, out, tmp);
      for (size_t s = 0; s < sizeof starts / sizeof starts[0]; s++) {
        uint32_t b0 = starts[s];
        if (f == F_EXP || f == F_SIGMOID || f == F_SILU) b0 = s == 1 ? 0xc2a00000u : b0; /* -80 */
        if (f == F_SIN || f == F_COS) b0 = s == 1 ? 0x46000000u : b0; /* 8192 */
        for (size_t i = 0; i < cap / 4; i++) in[i] = bf(b0 + (uint32_t)i);
        bad += vec_check(f, in, cap / 4, out, tmp);
      }
      for (size_t i = 0; i < cap / 4; i++) in[i] = draw(&r, f);
      bad += vec_check(f, in, cap / 4, out, tmp);
      for (size_t len = 0; len <= 70; len++)
        for (size_t off = 0; off < 4; off++) {
          for (size_t i = 0; i < len + off; i++) in[i] = draw(&r, f);
          bad += vec_check(f, in + off, len, out + off, tmp + off);
        }
      CHECK(bad == 0, "%s: kernel table %s differs from the scalar function on %ld inputs",
            NAMES[f], bx_math_kernels_active()->name, bad);
      printf("  %-8s %-8s ok\n", bx_math_kernels_active()->name, NAMES[f]);
    }
  }
  bxt_force(-1);
  free(in);
  free(out);
  free(tmp);
}

/* ---- bx_round_bf16 ------------------------------------------------------------ */

/* The reference: x rounded by MPFR to 8 significant bits, nearest even,
 * in bf16's exponent range (normals from 2^-126, subnormals in steps of
 * 2^-133, overflow to Inf from (2 - 2^-9) 2^127), as fp32 bits; every NaN
 * gives the canonical 0x7fc0 (docs/design.md, "NaN"). */
static uint16_t bf16_ref(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)0x7fc0u;
  mpfr_exp_t emin = mpfr_get_emin(), emax = mpfr_get_emax();
  mpfr_set_emin(-132); /* 2^-133 = 0.5 * 2^-132: the smallest subnormal */
  mpfr_set_emax(128);
  mpfr_t m;
  mpfr_init2(m, 8);
  int t = mpfr_set_flt(m, x, MPFR_RNDN);
  t = mpfr_check_range(m, t, MPFR_RNDN);
  mpfr_subnormalize(m, t, MPFR_RNDN);
  float r = mpfr_get_flt(m, MPFR_RNDN); /* exact: 8 bits */
  mpfr_clear(m);
  mpfr_set_emin(emin);
  mpfr_set_emax(emax);
  uint32_t v;
  memcpy(&v, &r, 4);
  return (uint16_t)(v >> 16);
}

/* Every ISA's table against the MPFR reference: specials, ties (odd and
 * even), the overflow edge, subnormals, random bits, every length 0..70 at
 * offsets 0..3; then the tensor call's threads and its errors. */
void test_round_bf16(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  enum { CAP = 1 << 16 };
  static float x[CAP];
  static uint16_t y[CAP], want[CAP];
  size_t n = 0;
  static const uint32_t edge[] = {0x00000000u, 0x00000001u, 0x00007fffu, 0x00008000u, 0x00008001u,
                                  0x00018000u, 0x007fffffu, 0x00800000u, 0x3f800000u, 0x3f808000u,
                                  0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x7f7f7fffu, 0x7f7f8000u,
                                  0x7f7fffffu, 0x7f800000u, 0x7f800001u, 0x7fbfffffu, 0x7fc00000u,
                                  0x7fffffffu, 0x7f80ffffu};
  for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
    for (int d = -3; d <= 3; d++)
      for (int s = 0; s < 2; s++) {
        uint32_t b = (edge[i] + (uint32_t)d) ^ (s ? 0x80000000u : 0);
        memcpy(&x[n++], &b, 4);
      }
  while (n < CAP) {
    uint32_t b = (uint32_t)bxt_next(&r);
    if (n % 3 == 0) b = (b & 0xffff0000u) | 0x8000u; /* an exact tie */
    memcpy(&x[n++], &b, 4);
  }
  for (size_t i = 0; i < n; i++) want[i] = bf16_ref(x[i]);
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    const bx_math_kernels *k = bx_math_kernels_active();
    memset(y, 0, sizeof y);
    k->bf16_round(x, y, n);
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
      if (y[i] != want[i]) {
        bad++;
        if (first == n) first = i;
      }
    CHECK(bad == 0, "%s: %zu of %zu differ from MPFR (first: x %08x -> %04x, want %04x)", k->name,
          bad, n, bad ? (unsigned)((uint32_t *)(void *)x)[first] : 0u, bad ? y[first] : 0,
          bad ? want[first] : 0);
    for (size_t len = 0; len <= 70; len++)
      for (size_t off = 0; off < 4; off++) {
        memset(y, 0xab, 160 * sizeof *y);
        k->bf16_round(x + off, y + off, len);
        int ok = 1;
        for (size_t i = 0; i < 160; i++)
          ok &= (i >= off && i < off + len) ? y[i] == want[i] : y[i] == 0xabab;
        CHECK(ok, "%s: length %zu at offset %zu: wrong or written outside", k->name, len, off);
      }
  }
  bxt_force(-1);
  /* the tensor call: 1 and 2 threads, the same bits; errors name the tensor, nothing written */
  int64_t shape[2] = {256, 256};
  DLTensor tx, ty;
  memset(&tx, 0, sizeof tx);
  tx.data = x;
  tx.device.device_type = kDLCPU;
  tx.ndim = 2;
  tx.shape = shape;
  tx.dtype.code = kDLFloat;
  tx.dtype.bits = 32;
  tx.dtype.lanes = 1;
  ty = tx;
  ty.data = y;
  ty.dtype.code = kDLBfloat;
  ty.dtype.bits = 16;
  for (int th = 1; th <= 2; th++) {
    bx_math_opts o = BX_MATH_OPTS_DEFAULT;
    o.num_threads = th;
    memset(y, 0, sizeof y);
    CHECK_STATUS(bx_round_bf16(&tx, &ty, &o), BX_OK, "threads %d: %s", th, bx_last_error());
    CHECK(!memcmp(y, want, 65536 * sizeof *y), "threads %d: the tensor call's bits", th);
  }
  memset(y, 0x5a, sizeof y);
  DLTensor bad = ty;
  bad.dtype.code = kDLFloat;
  CHECK_STATUS(bx_round_bf16(&tx, &bad, NULL), BX_EDTYPE, "y fp16-sized float");
  CHECK(strstr(bx_last_error(), "tensor 1") != NULL, "message: %s", bx_last_error());
  CHECK_STATUS(bx_round_bf16(&ty, &ty, NULL), BX_EDTYPE, "x bf16");
  int64_t other[2] = {256, 255};
  bad = ty;
  bad.shape = other;
  CHECK_STATUS(bx_round_bf16(&tx, &bad, NULL), BX_EINVAL, "shapes differ");
  int64_t st[2] = {1, 256};
  bad = ty;
  bad.strides = st;
  CHECK_STATUS(bx_round_bf16(&tx, &bad, NULL), BX_ELAYOUT, "column-major y");
  bad = ty;
  bad.data = (char *)x + 2;
  CHECK_STATUS(bx_round_bf16(&tx, &bad, NULL), BX_ELAYOUT, "y overlaps x");
  bx_math_opts neg = BX_MATH_OPTS_DEFAULT;
  neg.num_threads = -1;
  CHECK_STATUS(bx_round_bf16(&tx, &ty, &neg), BX_EINVAL, "negative threads");
  int untouched = 1;
  for (size_t i = 0; i < 65536; i++) untouched &= y[i] == 0x5a5a;
  CHECK(untouched, "a failed call wrote");
}
