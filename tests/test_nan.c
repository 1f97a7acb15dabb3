/*
 * test_nan.c — every NaN the library computes and stores is the canonical
 * pattern of its format (src/common/nan_canon.h, docs/design.md "NaN"):
 * fp32 0x7FC00000, fp64 0x7FF8000000000000, bf16 0x7FC0, fp16 0x7E00.
 *
 * Each kernel gets NaN-producing inputs: NaNs of both signs with payloads,
 * quiet and signalling (x86-64 keeps an operand's payload, aarch64 too but
 * the operand chosen can differ, and the compiler may swap the operands
 * of a commutative operation), and finite or infinite data whose
 * arithmetic makes a NaN with no NaN operand (Inf - Inf, 0 * Inf, overflow
 * to Inf then Inf - Inf: x86-64's default NaN is the negative 0xFFC00000,
 * aarch64's the positive 0x7FC00000). Every output element is scanned: a
 * NaN must be canonical, and each kernel must have produced NaNs at all
 * (else the test would prove nothing). Under every kernel table the CPU
 * runs (bx_force_isa) and at 1 and 3 threads. Copies (a permutation's
 * rows, an embedding lookup) keep the input's bits, NaN included.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact.h"
#include "bitexact_train.h"
#include "dl_view.h"
#include "harness.h"
#include "tests.h"

/* ---- data --------------------------------------------------------------- */

/* NaNs of every kind: quiet and signalling, both signs, with payloads */
static const uint32_t NAN32[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u,
                                 0x7fffffffu, 0xffffffffu, 0x7fa00000u, 0xffd0beefu};
#define NNAN32 (sizeof NAN32 / sizeof NAN32[0])


static float f32_of(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}
static uint32_t bits_of(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

/* finite values of both signs in [2^lo, 2^(lo + nb)); with specials, about
 * one element in 16 a NaN of NAN32 and one in 32 a +-Inf */
static void fill(float *x, size_t n, uint64_t seed, int lo, int nb, int specials) {
  for (size_t i = 0; i < n; i++) {
    uint64_t h = bx_rng_hash64(seed, i);
    uint32_t e = (uint32_t)(127 + lo + (int)(h % (uint64_t)nb));
    uint32_t b = (uint32_t)((h >> 32) & 0x80000000u) | (e << 23) | (uint32_t)((h >> 8) & 0x7fffffu);
    unsigned cls = (unsigned)((h >> 40) & 31);
    if (specials && cls < 2) b = NAN32[(h >> 48) % NNAN32];
    else if (specials && cls == 2) b = (uint32_t)((h >> 32) & 0x80000000u) | 0x7f800000u;
    memcpy(&x[i], &b, 4);
  }
}

/* ---- scans -------------------------------------------------------------- */

/* The NaNs among x[0..n): each must be 0x7FC00000. Returns their count. */
static size_t scan_f32(const char *what, const float *x, size_t n) {
  size_t nans = 0, bad = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t b = bits_of(x[i]);
    if ((b & 0x7fffffffu) <= 0x7f800000u) continue;
    nans++;
    if (b != 0x7fc00000u && bad++ == 0) first = i;
  }
  CHECK(bad == 0, "%s [%s]: %zu of %zu NaNs not canonical (first: element %zu = 0x%08x)", what,
        bx_isa_name(), bad, nans, first, bad ? bits_of(x[first]) : 0u);
  return nans;
}

static size_t scan_u16(const char *what, const uint16_t *x, size_t n, uint16_t inf, uint16_t canon) {
  size_t nans = 0, bad = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    if ((uint16_t)(x[i] & 0x7fffu) <= inf) continue;
    nans++;
    if (x[i] != canon && bad++ == 0) first = i;
  }
  CHECK(bad == 0, "%s [%s]: %zu of %zu NaNs not canonical (first: element %zu = 0x%04x)", what,
        bx_isa_name(), bad, nans, first, bad ? x[first] : 0u);
  return nans;
}

static size_t scan_f64(const char *what, const double *x, size_t n) {
  size_t nans = 0, bad = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t b;
    memcpy(&b, &x[i], 8);
    if ((b & 0x7fffffffffffffffull) <= 0x7ff0000000000000ull) continue;
    nans++;
    if (b != 0x7ff8000000000000ull && bad++ == 0) first = i;
  }
  CHECK(bad == 0, "%s [%s]: %zu of %zu NaNs not canonical (first: element %zu)", what, bx_isa_name(),
        bad, nans, first);
  return nans;
}

/* scan, and the kernel must have made NaNs at all */
static void expect_nans_f32(const char *what, const float *x, size_t n) {
  size_t k = scan_f32(what, x, n);
  CHECK(k > 0, "%s [%s]: no NaN produced: the data do not test anything", what, bx_isa_name());
}

static double f64_nan_neg(void) { /* a negative NaN with a payload */
  uint64_t b = 0xfff8000000000123ull;
  double d;
  memcpy(&d, &b, 8);
  return d;
}

static const int THREADS[2] = {1, 3};

/* ---- elementwise math, bf16 rounding, AdamW --------------------------------- */

void test_nan_math_adamw(void) {
  enum { N = 3000 };
  static float x[N], y[N], p[N], g[N], m[N], v[N];
  static uint16_t h[N];
  int64_t sh[1] = {N};
  DLTensor tx = bxt_f32_view(x, 1, sh), ty = bxt_f32_view(y, 1, sh), th = bxt_view(h, kDLBfloat, 16, 1, sh);
  typedef bx_status (*fn_t)(const DLTensor *, DLTensor *, const bx_math_opts *);
  static const fn_t fns[] = {bx_exp, bx_log, bx_sigmoid, bx_silu, bx_rsqrt, bx_sin, bx_cos};
  static const char *const names[] = {"exp", "log", "sigmoid", "silu", "rsqrt", "sin", "cos"};
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    for (int f = 0; f < 7; f++) {
      fill(x, N, 0x1100 + (uint64_t)f, -4, 10, 1); /* negative x: log, rsqrt NaN; Inf: sin, cos */
      for (int ti = 0; ti < 2; ti++) {
        bx_math_opts o = BX_MATH_OPTS_DEFAULT;
        o.num_threads = THREADS[ti];
        memset(y, 0xA5, sizeof y);
        CHECK(fns[f](&tx, &ty, &o) == BX_OK, "bx_%s", names[f]);
        expect_nans_f32(names[f], y, N);
      }
      /* the scalar entries: the same canonical NaN for every NaN input */
      float (*const sc[])(float) = {bx_exp_f32, bx_log_f32, bx_sigmoid_f32, bx_silu_f32,
                                    bx_rsqrt_f32, bx_sin_f32, bx_cos_f32};
      for (size_t k = 0; k < NNAN32; k++) {
        float r = sc[f](f32_of(NAN32[k]));
        CHECK(bits_of(r) == 0x7fc00000u, "bx_%s_f32(0x%08x) = 0x%08x, want 0x7fc00000", names[f], NAN32[k],
              bits_of(r));
      }
    }
    /* fp32 -> bf16: every NaN 0x7FC0 */
    fill(x, N, 0x1200, -4, 10, 1);
    memset(h, 0xA5, sizeof h);
    CHECK(bx_round_bf16(&tx, &th, NULL) == BX_OK, "bx_round_bf16");
    CHECK(scan_u16("round_bf16", h, N, 0x7f80u, 0x7fc0u) > 0, "round_bf16: no NaN");
    /* AdamW: NaN and Inf gradients (Inf^2 = Inf in v, then Inf / Inf in
     * the update), NaN parameters and moments, on several steps */
    for (int ti = 0; ti < 2; ti++) {
      fill(p, N, 0x1300, -6, 6, 1);
      fill(m, N, 0x1301, -12, 4, 1);
      fill(v, N, 0x1302, -20, 4, 0);
      for (int i = 0; i < N; i++) v[i] = fabsf(v[i]);
      bx_adamw_opts ao = BX_ADAMW_OPTS_DEFAULT;
      ao.num_threads = THREADS[ti];
      int64_t sp[1] = {N};
      DLTensor tp = bxt_f32_view(p, 1, sp), tg = bxt_f32_view(g, 1, sp), tm = bxt_f32_view(m, 1, sp),
               tv = bxt_f32_view(v, 1, sp);
      for (int64_t step = 1; step <= 2; step++) {
        fill(g, N, 0x1310 + (uint64_t)step, -10, 8, 1);
        CHECK(bx_adamw_step(&tp, &tg, &tm, &tv, step, &ao) == BX_OK, "bx_adamw_step");
      }
      expect_nans_f32("adamw param", p, N);
      expect_nans_f32("adamw exp_avg", m, N);
      expect_nans_f32("adamw exp_avg_sq", v, N);
    }
  }
  bxt_force(-1);
}

/* ---- norm, clip coefficient, scaling ------------------------------------ */

void test_nan_norm_scale(void) {
  enum { N = 1000 };
  static float f[N];
  static double d[N];
  static uint16_t b[N], hf[N];
  int64_t sh[1] = {N};
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    for (int mode = 0; mode < 2; mode++)
      for (int kind = 0; kind < 2; kind++) {
        /* kind 0: NaN payloads times a coefficient; kind 1: no NaN, +-Inf
         * times 0 (what a clip by an infinite norm does) */
        double coef = kind ? 0.0 : 0.75;
        fill(f, N, 0x2100 + (uint64_t)kind, -8, 16, 1);
        for (int i = 0; i < N; i++) {
          if (kind && f[i] != f[i]) f[i] = (i & 1) ? INFINITY : -INFINITY;
          uint32_t u = bits_of(f[i]);
          b[i] = (uint16_t)(u >> 16); /* bf16: NaN payloads kept in the top bits */
          uint32_t a = u & 0x7fffffffu;
          hf[i] = (uint16_t)(((u >> 16) & 0x8000u) | (a > 0x7f800000u ? 0x7c00u | ((u >> 13) & 0x3ffu) | 1u
                                                      : a == 0x7f800000u ? 0x7c00u : ((u >> 13) & 0x3ffu) | 0x3800u));
          uint64_t w = (uint64_t)u << 32; /* fp64: sign, and a payload in the high fraction bits */
          if (a > 0x7f800000u) w = ((uint64_t)(u & 0x80000000u) << 32) | 0x7ff0000000000000ull | ((uint64_t)a << 20) | 1u;
          else if (a == 0x7f800000u) w = ((uint64_t)(u & 0x80000000u) << 32) | 0x7ff0000000000000ull;
          else w = ((uint64_t)(u & 0x80000000u) << 32) | 0x3ff0000000000000ull | (w & 0xfffffffffull);
          memcpy(&d[i], &w, 8);
        }
        DLTensor ts[4] = {bxt_f32_view(f, 1, sh), bxt_view(d, kDLFloat, 64, 1, sh),
                          bxt_view(b, kDLBfloat, 16, 1, sh), bxt_view(hf, kDLFloat, 16, 1, sh)};
        bx_scale_opts so = BX_SCALE_OPTS_DEFAULT;
        so.mode = mode ? BX_SCALE_EXACT : BX_SCALE_TORCH;
        so.num_threads = 3;
        CHECK(bx_scale(ts, 4, coef, &so) == BX_OK, "bx_scale");
        char what[64];
        snprintf(what, sizeof what, "scale %s coef %g fp32", mode ? "exact" : "torch", coef);
        expect_nans_f32(what, f, N);
        CHECK(scan_f64("scale fp64", d, N) > 0, "scale fp64: no NaN");
        CHECK(scan_u16("scale bf16", b, N, 0x7f80u, 0x7fc0u) > 0, "scale bf16: no NaN");
        CHECK(scan_u16("scale fp16", hf, N, 0x7c00u, 0x7e00u) > 0, "scale fp16: no NaN");
      }
    /* the clip: an Inf gradient gives coefficient 0, and Inf * 0 in the
     * scaling; a NaN gradient a NaN norm and coefficient */
    for (int kind = 0; kind < 2; kind++) {
      fill(f, N, 0x2200, -8, 8, 0);
      f[17] = kind ? f32_of(0xff812345u) : -INFINITY;
      f[400] = INFINITY;
      DLTensor t = bxt_f32_view(f, 1, sh);
      bx_group gr = {&t, 1};
      double total = 0, coef = 0;
      CHECK(bx_clip_grad_norm(&gr, 1, NULL, 1.0, NULL, &total, &coef) == BX_OK, "bx_clip_grad_norm");
      expect_nans_f32(kind ? "clip (NaN norm)" : "clip (Inf norm, coef 0)", f, N);
      CHECK(scan_f64("clip total/coef", &total, 1) == (size_t)kind, "total norm NaN iff a NaN gradient");
      CHECK(scan_f64("clip coef", &coef, 1) == (size_t)kind, "coefficient NaN iff a NaN gradient");
    }
  }
  bxt_force(-1);
  /* the norm of NaN data in every format and flavour, every p */
  fill(f, N, 0x2300, -8, 8, 1);
  DLTensor t = bxt_f32_view(f, 1, sh);
  bx_group gr = {&t, 1};
  static const double ps[] = {2.0, 1.0, INFINITY, -INFINITY, 3.0, -1.0};
  for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++)
    for (int nd = 0; nd < 5; nd++) {
      bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
      o.norm_type = ps[pi];
      o.norm_dtype = (bx_norm_dtype)nd;
      double total = 0, g1 = 0;
      CHECK(bx_total_norm(&gr, 1, NULL, &o, &total, &g1) == BX_OK, "bx_total_norm p=%g", ps[pi]);
      CHECK(scan_f64("norm total", &total, 1) == 1 && scan_f64("norm group", &g1, 1) == 1,
            "p=%g norm_dtype %d: a NaN element gives the canonical NaN", ps[pi], nd);
    }
  {
    bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
    o.flavor = BX_MEGATRON_FP32;
    double total = 0;
    CHECK(bx_total_norm(&gr, 1, NULL, &o, &total, NULL) == BX_OK, "megatron norm");
    CHECK(scan_f64("megatron norm", &total, 1) == 1, "megatron: canonical NaN");
  }
  /* the accumulator's reads and bx_acc_norm into each dtype */
  bx_acc acc;
  bx_acc_init(&acc);
  CHECK(bx_acc_add_squares(&acc, &t) == BX_OK, "bx_acc_add_squares");
  double v[2] = {bx_acc_value(&acc), bx_acc_sqrt(&acc)};
  CHECK(scan_f64("acc value/sqrt", v, 2) == 2, "acc reads: canonical NaN");
  float vf[2] = {bx_acc_valuef(&acc), bx_acc_sqrtf(&acc)};
  CHECK(scan_f32("acc valuef/sqrtf", vf, 2) == 2, "acc float reads: canonical NaN");
  static const DLDataType dts[4] = {{kDLFloat, 64, 1}, {kDLFloat, 32, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 16, 1}};
  static const uint64_t want[4] = {0x7ff8000000000000ull, 0x7fc00000u, 0x7fc0u, 0x7e00u};
  for (int k = 0; k < 4; k++) {
    unsigned char out[8];
    memset(out, 0xA5, sizeof out);
    CHECK(bx_acc_norm(&acc, 2.0, dts[k], out) == BX_OK, "bx_acc_norm");
    uint64_t got = 0;
    for (int i = 0; i < dts[k].bits / 8; i++) got |= (uint64_t)out[i] << (8 * i);
    CHECK(got == want[k], "bx_acc_norm dtype %d bits: 0x%llx, want 0x%llx", k, (unsigned long long)got,
          (unsigned long long)want[k]);
  }
  double coef = 0;
  bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
  for (int formula = 0; formula < 2; formula++) {
    co.formula = formula ? BX_COEF_MAX : BX_COEF_TORCH;
    CHECK(bx_clip_coef(f64_nan_neg(), 1.0, &co, &coef) == BX_OK, "bx_clip_coef");
    CHECK(scan_f64("clip_coef(NaN)", &coef, 1) == 1, "clip_coef of a negative NaN: canonical");
  }
}

/* ---- GEMM ------------------------------------------------------------------ */

/* C = A . B in the three layouts, fp32 and bf16 operands, with and without
 * accumulate: NaN operands, and rows of +-Inf against columns of both
 * signs (Inf - Inf along the chain, no NaN operand) */
void test_nan_gemm(void) {
  enum { M = 37, K = 300, N = 29 }; /* K > BX_GEMM_KC: the chain crosses k blocks */
  static float a[M * K], bm[K * N], c[M * N > K * N ? M * N : K * N];
  static uint16_t a16[M * K], b16[K * N];
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    for (int kind = 0; kind < 2; kind++) {
      fill(a, M * K, 0x3100 + (uint64_t)kind, -4, 8, !kind);
      fill(bm, K * N, 0x3200 + (uint64_t)kind, -4, 8, !kind);
      if (kind) /* no NaN operand: Inf in rows of A and columns of B of both signs */
        for (int i = 0; i < M; i += 3) a[i * K + (i % K)] = (i & 2) ? INFINITY : -INFINITY, a[i * K + (i + 1) % K] = INFINITY;
      if (kind)
        for (int j = 0; j < K * N; j += 7) bm[j] = (j & 8) ? 0x1p127f : -0x1p127f;
      for (int i = 0; i < M * K; i++) a16[i] = (uint16_t)(bits_of(a[i]) >> 16);
      for (int i = 0; i < K * N; i++) b16[i] = (uint16_t)(bits_of(bm[i]) >> 16);
      for (int layout = 0; layout < 3; layout++)
        for (int bf = 0; bf < 2; bf++)
          for (int ti = 0; ti < 2; ti++) {
            /* NT: A [M,K], B [N,K]; NN: A [M,K], B [K,N]; TN: A [K,M] (dY),
             * B [K,N] (X), C [M,N] */
            int64_t sa[2], sb[2], sc[2] = {M, N};
            bx_gemm_layout l = layout == 0 ? BX_GEMM_NT : layout == 1 ? BX_GEMM_NN : BX_GEMM_TN;
            if (layout == 2) sa[0] = K, sa[1] = M;
            else sa[0] = M, sa[1] = K;
            if (layout == 0) sb[0] = N, sb[1] = K;
            else sb[0] = K, sb[1] = N;
            DLTensor ta = bf ? bxt_view(a16, kDLBfloat, 16, 2, sa) : bxt_f32_view(a, 2, sa);
            DLTensor tb = bf ? bxt_view(b16, kDLBfloat, 16, 2, sb) : bxt_f32_view(bm, 2, sb);
            DLTensor tc = bxt_f32_view(c, 2, sc);
            bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
            o.num_threads = THREADS[ti];
            o.accumulate = ti; /* from C's NaN-free start, or from +0 */
            for (int i = 0; i < M * N; i++) c[i] = (float)(i % 5) - 2.0f;
            char what[80];
            snprintf(what, sizeof what, "gemm %s %s%s, %s", layout == 0 ? "NT" : layout == 1 ? "NN" : "TN",
                     bf ? "bf16" : "fp32", ti ? " accumulate" : "", kind ? "Inf - Inf" : "NaN operands");
            CHECK(bx_gemm(&ta, &tb, l, &tc, &o) == BX_OK, "%s", what);
            expect_nans_f32(what, c, M * N);
          }
    }
  }
  bxt_force(-1);
}

/* ---- the layers ------------------------------------------------------------- */

static void nan_rmsnorm_rope_swiglu(int ti) {
  enum { T = 300, H = 40, C = 64, NC = (T + C - 1) / C, HD = 8 };
  static float x[T * H], w[H], dy[T * H], y[T * H], rs[T], dx[T * H], dwp[NC * H];
  static float g[T * H], u[T * H], hh[T * H], dg[T * H], du[T * H], gu[T * 2 * H], dgu[T * 2 * H];
  static int64_t pos[T];
  fill(x, T * H, 0x4100, -4, 8, 1);
  /* no NaN operand: an Inf in the row, its square Inf, rstd 0, Inf * 0 */
  for (int j = 0; j < H; j++) x[5 * H + j] = (j & 1) ? 0x1p127f : -0x1p127f;
  x[5 * H + 3] = -INFINITY;
  fill(w, H, 0x4101, -2, 3, 0);
  fill(dy, T * H, 0x4102, -10, 8, 1);
  int64_t sx[2] = {T, H}, sw[1] = {H}, sr[1] = {T}, sp[2] = {NC, H};
  DLTensor tx = bxt_f32_view(x, 2, sx), tw = bxt_f32_view(w, 1, sw), tdy = bxt_f32_view(dy, 2, sx),
           ty = bxt_f32_view(y, 2, sx), trs = bxt_f32_view(rs, 1, sr), tdx = bxt_f32_view(dx, 2, sx),
           tdwp = bxt_f32_view(dwp, 2, sp);
  bx_rmsnorm_opts ro = BX_RMSNORM_OPTS_DEFAULT;
  ro.num_threads = THREADS[ti];
  CHECK(bx_rmsnorm_forward(&tx, &tw, 1e-5, &ty, &trs, &ro) == BX_OK, "rmsnorm forward");
  CHECK(bx_rmsnorm_backward(&tx, &tw, &tdy, &trs, C, &tdx, &tdwp, &ro) == BX_OK, "rmsnorm backward");
  expect_nans_f32("rmsnorm y", y, T * H);
  { /* the overflowing row alone: no NaN operand */
    size_t k = scan_f32("rmsnorm y (overflow row)", y + 5 * H, H);
    CHECK(k > 0, "rmsnorm: the overflowing row makes NaNs (Inf * 0)");
  }
  expect_nans_f32("rmsnorm rstd", rs, T);
  expect_nans_f32("rmsnorm dx", dx, T * H);
  expect_nans_f32("rmsnorm dweight_partials", dwp, NC * H);
  /* RoPE over the whole head (rotary_dim = head_dim: every output computed) */
  for (int t = 0; t < T; t++) pos[t] = t * 37 % 4096;
  int64_t spp[1] = {T};
  DLTensor tp = bxt_view(pos, kDLInt, 64, 1, spp);
  bx_rope_opts po = BX_ROPE_OPTS_DEFAULT;
  po.num_threads = THREADS[ti];
  CHECK(bx_rope_forward(&tx, &tp, HD, HD, 10000.0, &ty, &po) == BX_OK, "rope forward");
  expect_nans_f32("rope forward", y, T * H);
  CHECK(bx_rope_backward(&tdy, &tp, HD, HD, 10000.0, &tdx, &po) == BX_OK, "rope backward");
  expect_nans_f32("rope backward", dx, T * H);
  /* SwiGLU, two tensors and fused: NaN gates and ups, Inf * 0 (silu(-Inf) = -0 times Inf) */
  fill(g, T * H, 0x4200, -4, 8, 1);
  fill(u, T * H, 0x4201, -4, 8, 1);
  for (int t = 0; t < T; t++) {
    memcpy(gu + t * 2 * H, g + t * H, H * 4);
    memcpy(gu + t * 2 * H + H, u + t * H, H * 4);
  }
  int64_t s2[2] = {T, 2 * H};
  DLTensor tg = bxt_f32_view(g, 2, sx), tu = bxt_f32_view(u, 2, sx), th = bxt_f32_view(hh, 2, sx),
           tdg = bxt_f32_view(dg, 2, sx), tdu = bxt_f32_view(du, 2, sx), tgu = bxt_f32_view(gu, 2, s2),
           tdgu = bxt_f32_view(dgu, 2, s2);
  bx_swiglu_opts so = BX_SWIGLU_OPTS_DEFAULT;
  so.num_threads = THREADS[ti];
  CHECK(bx_swiglu_forward(&tg, &tu, &th, &so) == BX_OK, "swiglu forward");
  expect_nans_f32("swiglu h", hh, T * H);
  CHECK(bx_swiglu_forward_fused(&tgu, &th, &so) == BX_OK, "swiglu forward fused");
  expect_nans_f32("swiglu fused h", hh, T * H);
  CHECK(bx_swiglu_backward(&tg, &tu, &tdy, &tdg, &tdu, &so) == BX_OK, "swiglu backward");
  expect_nans_f32("swiglu dgate", dg, T * H);
  expect_nans_f32("swiglu dup", du, T * H);
  CHECK(bx_swiglu_backward_fused(&tgu, &tdy, &tdgu, &so) == BX_OK, "swiglu backward fused");
  expect_nans_f32("swiglu fused dgate_up", dgu, T * 2 * H);
}

static void nan_attention(int ti) {
  enum { B = 2, L = 33, HQ = 4, HKV = 2, D = 12, NT = B * L };
  static float q[NT * HQ * D], k[NT * HKV * D], v[NT * HKV * D], dout[NT * HQ * D];
  static float o[NT * HQ * D], st[NT * HQ * 2], dq[NT * HQ * D], dk[NT * HKV * D], dv[NT * HKV * D];
  for (int kind = 0; kind < 2; kind++) {
    fill(q, NT * HQ * D, 0x5100, -4, 4, 0);
    fill(k, NT * HKV * D, 0x5101, -4, 4, 0);
    fill(v, NT * HKV * D, 0x5102, -4, 6, 0);
    fill(dout, NT * HQ * D, 0x5103, -10, 6, 0);
    if (kind == 0) { /* NaN payloads in q, v and dout */
      q[(3 * HQ + 1) * D + 2] = f32_of(0xff812345u);
      v[(20 * HKV + 1) * D + 5] = f32_of(0x7f800001u);
      dout[(40 * HQ + 2) * D + 7] = f32_of(0xffc00000u);
    } else { /* no NaN: a score of +Inf (m = Inf, s - m = Inf - Inf) and -Inf */
      q[(L + 4) * HQ * D] = 0x1p100f;
      k[(L + 2) * HKV * D] = 0x1p100f;
      q[(L + 9) * HQ * D + 1] = -0x1p100f;
      k[(L + 1) * HKV * D + 1] = 0x1p100f;
    }
    int64_t sq[2] = {NT, HQ * D}, sk[2] = {NT, HKV * D}, ss[3] = {NT, HQ, 2};
    DLTensor tq = bxt_f32_view(q, 2, sq), tk = bxt_f32_view(k, 2, sk), tv = bxt_f32_view(v, 2, sk),
             tdo = bxt_f32_view(dout, 2, sq), to = bxt_f32_view(o, 2, sq), ts = bxt_f32_view(st, 3, ss),
             tdq = bxt_f32_view(dq, 2, sq), tdk = bxt_f32_view(dk, 2, sk), tdv = bxt_f32_view(dv, 2, sk);
    bx_attention_opts ao = BX_ATTENTION_OPTS_DEFAULT;
    ao.num_threads = THREADS[ti];
    CHECK(bx_attention_forward(&tq, &tk, &tv, L, HQ, HKV, D, &to, &ts, &ao) == BX_OK, "attention forward");
    CHECK(bx_attention_backward(&tdo, &tq, &tk, &tv, &ts, L, HQ, HKV, D, &tdq, &tdk, &tdv, &ao) == BX_OK,
          "attention backward");
    const char *kn = kind ? " (Inf scores)" : " (NaN inputs)";
    char what[64];
    snprintf(what, sizeof what, "attention o%s", kn);
    expect_nans_f32(what, o, NT * HQ * D);
    snprintf(what, sizeof what, "attention stats%s", kn);
    scan_f32(what, st, NT * HQ * 2);
    snprintf(what, sizeof what, "attention dq%s", kn);
    expect_nans_f32(what, dq, NT * HQ * D);
    snprintf(what, sizeof what, "attention dk%s", kn);
    expect_nans_f32(what, dk, NT * HKV * D);
    snprintf(what, sizeof what, "attention dv%s", kn);
    expect_nans_f32(what, dv, NT * HKV * D);
  }
}

static void nan_moe(int ti) {
  enum { T = 90, E = 8, K = 2, H = 11, R = T * K, C = 8 };
  static float logits[T * E], bias[E], w[T * K], dw[T * K], dl[T * E];
  static float x[T * H], xp[R * H], dxp[R * H], dx[T * H], yp[R * H], init[T * H], out[T * H],
      dout[T * H], dyp[R * H], dwt[T * K];
  static int64_t ids[T * K], off[E + 1], map[R * 2], pos[T * K], cnt[((T + C - 1) / C) * E];
  fill(logits, T * E, 0x6100, -4, 4, 0);
  logits[3 * E + 1] = INFINITY;
  logits[4 * E + 2] = -INFINITY;
  fill(bias, E, 0x6101, -12, 3, 0);
  int64_t sl[2] = {T, E}, sb[1] = {E}, sk[2] = {T, K}, sc[2] = {(T + C - 1) / C, E};
  DLTensor tl = bxt_f32_view(logits, 2, sl), tb = bxt_f32_view(bias, 1, sb), tid = bxt_view(ids, kDLInt, 64, 2, sk),
           tw = bxt_f32_view(w, 2, sk), tc = bxt_view(cnt, kDLInt, 64, 2, sc);
  bx_moe_router_opts ro = BX_MOE_ROUTER_OPTS_DEFAULT;
  ro.num_threads = THREADS[ti];
  CHECK(bx_moe_router_forward(&tl, &tb, &tid, &tw, C, &tc, &ro) == BX_OK, "router forward");
  scan_f32("router topk_weights", w, T * K);
  fill(dw, T * K, 0x6102, -8, 6, 1);
  DLTensor tdw = bxt_f32_view(dw, 2, sk), tdl = bxt_f32_view(dl, 2, sl);
  CHECK(bx_moe_router_backward(&tl, &tid, &tdw, &tdl, &ro) == BX_OK, "router backward");
  expect_nans_f32("router dlogits", dl, T * E);
  { /* the bias update on a NaN bias */
    float bb[E];
    memcpy(bb, bias, sizeof bb);
    bb[1] = f32_of(0xff812345u);
    DLTensor tbb = bxt_f32_view(bb, 1, sb);
    CHECK(bx_moe_bias_update(&tbb, &tc, 1e-3) == BX_OK, "bias update");
    expect_nans_f32("moe bias_update", bb, E);
  }
  int64_t so[1] = {E + 1}, sm[2] = {R, 2};
  DLTensor to = bxt_view(off, kDLInt, 64, 1, so), tm = bxt_view(map, kDLInt, 64, 2, sm), tp = bxt_view(pos, kDLInt, 64, 2, sk);
  bx_moe_dispatch_opts d = BX_MOE_DISPATCH_OPTS_DEFAULT;
  d.num_threads = THREADS[ti];
  CHECK(bx_moe_dispatch_plan(&tid, NULL, &to, &tm, &tp, &d) == BX_OK, "dispatch plan");
  int64_t sx[2] = {T, H}, sp[2] = {R, H};
  fill(x, T * H, 0x6200, -4, 8, 1);
  DLTensor tx = bxt_f32_view(x, 2, sx), txp = bxt_f32_view(xp, 2, sp);
  CHECK(bx_moe_permute(&tx, &tm, &txp, &d) == BX_OK, "permute");
  { /* a copy: every row keeps its bits, NaN payloads included */
    int same = 1;
    for (int r = 0; r < R; r++) same = same && !memcmp(xp + r * H, x + map[2 * r] * H, H * 4);
    CHECK(same, "permute: rows are bit copies of x's (NaN payloads kept)");
  }
  fill(dxp, R * H, 0x6201, -8, 8, 1);
  fill(yp, R * H, 0x6202, -4, 8, 1);
  fill(init, T * H, 0x6203, -4, 8, 1);
  fill(dout, T * H, 0x6204, -8, 8, 1);
  float wi[T * K];
  memcpy(wi, w, sizeof wi);
  wi[5] = INFINITY; /* Inf * 0 in the unpermute */
  DLTensor tdxp = bxt_f32_view(dxp, 2, sp), tdx = bxt_f32_view(dx, 2, sx), typ = bxt_f32_view(yp, 2, sp),
           tin = bxt_f32_view(init, 2, sx), tout = bxt_f32_view(out, 2, sx), tdo = bxt_f32_view(dout, 2, sx),
           tdyp = bxt_f32_view(dyp, 2, sp), tdwt = bxt_f32_view(dwt, 2, sk), twi = bxt_f32_view(wi, 2, sk);
  CHECK(bx_moe_permute_backward(&tdxp, &tm, &tp, &tdx, &d) == BX_OK, "permute backward");
  expect_nans_f32("moe permute_backward dx", dx, T * H);
  CHECK(bx_moe_unpermute(&typ, &twi, &tm, &tp, NULL, &tout, &d) == BX_OK, "unpermute");
  expect_nans_f32("moe unpermute out", out, T * H);
  CHECK(bx_moe_unpermute(&typ, &twi, &tm, &tp, &tin, &tout, &d) == BX_OK, "unpermute initial");
  expect_nans_f32("moe unpermute out (initial)", out, T * H);
  CHECK(bx_moe_unpermute_backward(&tdo, &typ, &twi, &tm, &tp, &tdyp, &tdwt, &d) == BX_OK, "unpermute backward");
  expect_nans_f32("moe unpermute_backward dy_perm", dyp, R * H);
  expect_nans_f32("moe unpermute_backward dweights", dwt, T * K);
}

static void nan_embedding_xent(int ti) {
  enum { V = 17, H = 9, T = 200, C = 32, NC = (T + C - 1) / C, VX = 300, TX = 40 };
  static float wt[V * H], dy[T * H], y[T * H], rows[T * H];
  static int64_t ids[T], rid[T], off[NC + 1];
  for (int t = 0; t < T; t++) ids[t] = (int64_t)(bx_rng_hash64(0x7100, (uint64_t)t) % V);
  fill(wt, V * H, 0x7101, -4, 8, 1);
  fill(dy, T * H, 0x7102, -8, 8, 1);
  dy[0] = INFINITY; /* two tokens of one id: Inf + -Inf in a row's sum */
  ids[1] = ids[0];
  dy[H] = -INFINITY;
  int64_t st[1] = {T}, sw[2] = {V, H}, sy[2] = {T, H}, so[1] = {NC + 1};
  DLTensor tw = bxt_f32_view(wt, 2, sw), tids = bxt_view(ids, kDLInt, 64, 1, st), tdy = bxt_f32_view(dy, 2, sy),
           ty = bxt_f32_view(y, 2, sy), tr = bxt_f32_view(rows, 2, sy), trid = bxt_view(rid, kDLInt, 64, 1, st),
           to = bxt_view(off, kDLInt, 64, 1, so);
  bx_embedding_opts eo = BX_EMBEDDING_OPTS_DEFAULT;
  eo.num_threads = THREADS[ti];
  CHECK(bx_embedding_forward(&tw, &tids, &ty, &eo) == BX_OK, "embedding forward");
  { /* a lookup: bits kept */
    int same = 1;
    for (int t = 0; t < T; t++) same = same && !memcmp(y + t * H, wt + ids[t] * H, H * 4);
    CHECK(same, "embedding forward: rows are bit copies (NaN payloads kept)");
  }
  memset(rows, 0, sizeof rows);
  CHECK(bx_embedding_backward(&tids, &tdy, V, C, &trid, &tr, &to, &eo) == BX_OK, "embedding backward");
  expect_nans_f32("embedding backward rows", rows, T * H);
  { /* chunk 0's row of ids[0] holds Inf + -Inf in column 0 */
    int found = 0;
    for (int64_t r = off[0]; r < off[1]; r++)
      if (rid[r] == ids[0]) found = 1, CHECK(rows[r * H] != rows[r * H], "embedding backward: Inf + -Inf is NaN");
    CHECK(found, "embedding backward: the row of ids[0] in chunk 0");
  }
  /* cross-entropy: NaN logits, m = +Inf */
  static float z[TX * VX], loss[TX], lp[(TX + 7) / 8], dz[TX * VX];
  static int64_t tg[TX], cn[(TX + 7) / 8];
  fill(z, TX * VX, 0x7200, -4, 6, 0);
  z[3 * VX + 5] = f32_of(0xff812345u);
  z[7 * VX + 9] = INFINITY;
  for (int t = 0; t < TX; t++) tg[t] = (int64_t)(bx_rng_hash64(0x7201, (uint64_t)t) % VX);
  int64_t sz[2] = {TX, VX}, stt[1] = {TX}, sc[1] = {(TX + 7) / 8};
  DLTensor tz = bxt_f32_view(z, 2, sz), ttg = bxt_view(tg, kDLInt, 64, 1, stt), tl = bxt_f32_view(loss, 1, stt),
           tlp = bxt_f32_view(lp, 1, sc), tcn = bxt_view(cn, kDLInt, 64, 1, sc), tdz = bxt_f32_view(dz, 2, sz);
  bx_xent_opts xo = BX_XENT_OPTS_DEFAULT;
  xo.num_threads = THREADS[ti];
  CHECK(bx_xent_forward_backward(&tz, &ttg, TX, 8, &tl, &tlp, &tcn, &tdz, &xo) == BX_OK, "xent");
  expect_nans_f32("xent losses", loss, TX);
  expect_nans_f32("xent loss_partials", lp, (TX + 7) / 8);
  expect_nans_f32("xent dlogits", dz, TX * VX);
}

/* the weight gradient refuses non-finite data (BX_ENONFINITE, nothing
 * written): no NaN can reach its outputs */
static void nan_wgrad(int ti) {
  enum { T = 24, N = 10, KK = 6 };
  static float dy[T * N], x[T * KK], wout[N * KK], bout[N];
  fill(dy, T * N, 0x8100, -6, 6, 0);
  fill(x, T * KK, 0x8101, -6, 6, 0);
  x[7] = f32_of(0xff812345u);
  int64_t sdy[2] = {T, N}, sx[2] = {T, KK}, sw[2] = {N, KK}, sb[1] = {N};
  DLTensor tdy = bxt_f32_view(dy, 2, sdy), tx = bxt_f32_view(x, 2, sx);
  DLTensor grads[2] = {bxt_f32_view(NULL, 2, sw), bxt_f32_view(NULL, 1, sb)};
  DLTensor outs[2] = {bxt_f32_view(wout, 2, sw), bxt_f32_view(bout, 1, sb)};
  bx_wgrad_opts wo = BX_WGRAD_OPTS_DEFAULT;
  wo.num_threads = THREADS[ti];
  bx_tokred *s = NULL;
  memset(wout, 0, sizeof wout);
  memset(bout, 0, sizeof bout);
  bx_status st = bx_tokred_create(grads, 2, 8, T, NULL, &s);
  CHECK(st == BX_OK, "tokred create");
  if (st == BX_OK) st = bx_linear_wgrad_bound(s, 0, 1, &tdy, &tx, 0, &wo);
  if (st == BX_OK) st = bx_tokred_agree(s, NULL);
  if (st == BX_OK) st = bx_linear_wgrad(s, 0, 1, &tdy, &tx, 0, &wo);
  if (st == BX_OK) st = bx_tokred_finish(s, outs, 2, 1);
  CHECK(st == BX_ENONFINITE, "linear wgrad with a NaN input: BX_ENONFINITE, got %d", (int)st);
  scan_f32("wgrad weight", wout, N * KK);
  scan_f32("wgrad bias", bout, N);
  bx_tokred_destroy(s);
}

void test_nan_layers(void) {
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    for (int ti = 0; ti < 2; ti++) {
      nan_rmsnorm_rope_swiglu(ti);
      nan_attention(ti);
      nan_moe(ti);
      nan_embedding_xent(ti);
      nan_wgrad(ti);
    }
  }
  bxt_force(-1);
}
