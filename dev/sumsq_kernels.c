/*
 * dev/sumsq_kernels.c — self-checking harness for the exact sum-of-squares
 * (and sum-|x|) kernels: reference, versions, checker, benchmark.
 *
 *   build/dev/sumsq_kernels [check [SEED]]  every kernel of every ISA
 *                                  against the reference (about a minute)
 *   build/dev/sumsq_kernels quick [SEED]    the CI subset (well under a
 *                                  minute on 2 cores; `make dev-check`)
 *   build/dev/sumsq_kernels bench [S]       ns/element and GB/s, N = 2^20,
 *                                  2^24 (only the "dtype dist isa" labels
 *                                  containing S, if given)
 *
 * reference  bx_kernels_portable (per-exponent integer bins, no floating
 *            point at all), normalised and compared digit for digit
 *            (memcmp) together with the NaN/Inf/element counters; the
 *            portable table itself is compared with simple_kernels (one
 *            deposit per element, no tuning) on lengths up to 100003.
 * versions   every table dispatch.c registers that this CPU runs (avx2,
 *            avx512): the block drivers with each ISA's micro-kernels.
 * checker    adversarial data for every dtype: gradient-like, spiky (0.1%
 *            huge among tiny), wide (40 binades, the whole range), random
 *            bit patterns, subnormals, zeros, extremes (FLT_MAX, DBL_MAX,
 *            65504, 1e+-300), repeated worst-case values, NaN/Inf sprinkled;
 *            short lengths at element offsets 0..3 and an odd byte offset,
 *            block-boundary and large lengths; data that make the verified
 *            and guessed windows' guesses fail (rare tiny elements,
 *            drifting and jumping scales, rare spikes/NaN/Inf/subnormals).
 *            Then every kernel of every ISA again through the public entry
 *            (bx_force_isa, bx_acc_add_squares / bx_acc_add_abs, which
 *            enter the library's floating-point environment) under hostile
 *            caller MXCSRs: DAZ|FTZ with each rounding mode, all flags
 *            raised; and DAZ|FTZ with every exception unmasked (a trap is
 *            a crash: a failure too). The caller's MXCSR, mode and flags,
 *            must come back unchanged. A failure prints the case and its
 *            seed; the exit status is non-zero.
 *
 * Kernels called directly (not through the public entry) run inside the
 * library's environment too (bx_fpenv_enter, as the drivers do).
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fpenv.h"
#include "kernels.h"
#include "rng.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" /* the benchmark's baselines: two used */
#include "../bench/baselines.h"
#pragma GCC diagnostic pop

/* ---- random numbers: the one generator (rng.h) ------------------------- */
static bx_rng rng;
static void reseed(uint64_t seed) { bx_rng_seed(&rng, seed); }
static uint64_t rnd(void) { return bx_rng_next(&rng); }
static uint64_t below(uint64_t n) { return bx_rng_below(&rng, n); }
static double unif(void) { return bx_rng_uniform(&rng); }
static double gauss(void) { return bx_rng_normal(&rng); }

/* ---- dtypes ------------------------------------------------------------ */
static const char *dt_name[BX_DT_COUNT] = {"f16", "bf16", "f32", "f64"};
static const size_t dt_size[BX_DT_COUNT] = {2, 2, 4, 8};

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
static uint16_t to_f16(float f) { return _cvtss_sh(f, 0); }

/* Store value v into element i of buffer p of dtype dt (rounded). */
static void put(void *p, int dt, size_t i, double v) {
  switch (dt) {
    case BX_DT_F16: { uint16_t h = to_f16((float)v); memcpy((char *)p + 2 * i, &h, 2); break; }
    case BX_DT_BF16: { uint16_t h = to_bf16((float)v); memcpy((char *)p + 2 * i, &h, 2); break; }
    case BX_DT_F32: { float f = (float)v; memcpy((char *)p + 4 * i, &f, 4); break; }
    default: memcpy((char *)p + 8 * i, &v, 8);
  }
}
/* Store a raw bit pattern. */
static void put_bits(void *p, int dt, size_t i, uint64_t b) {
  memcpy((char *)p + dt_size[dt] * i, &b, dt_size[dt]); /* little-endian */
}

/* exponent field width, mantissa width */
static void dt_fmt(int dt, int *ebits, int *mbits) {
  static const int e[4] = {5, 8, 8, 11}, m[4] = {10, 7, 23, 52};
  *ebits = e[dt];
  *mbits = m[dt];
}

/* Random finite value with biased exponent field uniform in [elo, ehi]
 * (0 = subnormal), random mantissa and sign. */
static uint64_t rand_bits_exp(int dt, int elo, int ehi) {
  int eb, mb;
  dt_fmt(dt, &eb, &mb);
  int e = elo + (int)below((uint64_t)(ehi - elo + 1));
  uint64_t m = rnd() & ((1ull << mb) - 1);
  uint64_t s = rnd() & 1;
  return (s << (eb + mb)) | ((uint64_t)e << mb) | m;
}

enum {
  D_GRAD, D_SPIKY, D_WIDE40, D_WIDEALL, D_BITS, D_SUBN, D_ZEROS, D_EXTREME,
  D_REPEAT, D_GRAD_NAN, D_WIDE_INF, D_TINYHUGE, D_WIDE120, D_GRAD_TINY, D_GRAD_DRIFT,
  D_GRAD_JUMP, D_GRAD_RARE, D_COUNT
};
static const char *dist_name[D_COUNT] = {
    "gradient", "spiky", "wide40", "wide-all", "random-bits", "subnormal", "zeros",
    "extreme", "repeat-worst", "gradient+nan", "wide+inf", "1e+-300", "wide120",
    "gradient+tiny", "gradient-drift", "gradient-jump", "gradient+rare"};

/* Fill n elements of dtype dt with distribution d. */
static void fill(void *p, int dt, size_t n, int d) {
  int eb, mb;
  dt_fmt(dt, &eb, &mb);
  int emax = (1 << eb) - 2; /* largest finite exponent field */
  double big = dt == BX_DT_F64 ? DBL_MAX : dt == BX_DT_F16 ? 65504.0 : FLT_MAX;
  double scale = dt == BX_DT_F16 ? 1e-2 : 1e-3;
  int rep_e = 1 + (int)below((uint64_t)emax);
  uint64_t rep = ((uint64_t)rep_e << mb) | ((1ull << mb) - 1 - (rnd() & 3));
  int w_lo = 1 + (int)below((uint64_t)(emax > 41 ? emax - 40 : 1));
  int w_lo2 = 1 + (int)below((uint64_t)(emax > 121 ? emax - 120 : 1));
  for (size_t i = 0; i < n; i++) {
    switch (d) {
      case D_GRAD: put(p, dt, i, below(100) == 0 ? 0.0 : gauss() * scale); break;
      case D_SPIKY:
        put(p, dt, i, below(1000) == 0 ? gauss() * (dt == BX_DT_F16 ? 1e3 : 1e4)
                                       : gauss() * (dt == BX_DT_F16 ? 1e-4 : 1e-6));
        break;
      case D_WIDE40: put_bits(p, dt, i, rand_bits_exp(dt, w_lo, w_lo + (emax > 40 ? 39 : emax - 1))); break;
      case D_WIDEALL: put_bits(p, dt, i, rand_bits_exp(dt, 0, emax)); break;
      case D_BITS: put_bits(p, dt, i, rnd()); break; /* NaN/Inf included */
      case D_SUBN:
        put_bits(p, dt, i, below(8) ? rand_bits_exp(dt, 0, 0) : rand_bits_exp(dt, 1, 3));
        break;
      case D_ZEROS: put_bits(p, dt, i, below(2) ? (1ull << (eb + mb)) : 0); break;
      case D_EXTREME: {
        uint64_t r = below(4);
        double v = r == 0 ? big : r == 1 ? -big : r == 2 ? big * (1 - unif() * 1e-3) : 0.0;
        put(p, dt, i, v);
        if (below(3) == 0) put_bits(p, dt, i, rand_bits_exp(dt, 0, 1));
        break;
      }
      case D_REPEAT: put_bits(p, dt, i, rep | ((rnd() & 1) << (eb + mb))); break;
      case D_GRAD_NAN:
        put(p, dt, i, gauss() * scale);
        if (below(500) == 0) put(p, dt, i, NAN);
        break;
      case D_WIDE_INF:
        put_bits(p, dt, i, rand_bits_exp(dt, w_lo, w_lo + (emax > 40 ? 39 : emax - 1)));
        if (below(700) == 0) put(p, dt, i, rnd() & 1 ? INFINITY : -INFINITY);
        break;
      case D_WIDE120: /* ~7 fp64 windows in <= 5 buckets; 3 fp32 windows */
        put_bits(p, dt, i, rand_bits_exp(dt, emax > 121 ? w_lo2 : 0, emax > 121 ? w_lo2 + 119 : emax));
        break;
      /* The verified and guessed windows (exact_grid.h) guess each block's
       * window from the blocks before it: data that make the guess fail. */
      case D_GRAD_TINY: /* rare elements far below the bulk: inexact flag */
        put(p, dt, i, below(5000) == 0 ? ldexp(gauss(), -(int)below(40) - 8) * scale : gauss() * scale);
        break;
      case D_GRAD_DRIFT: /* the scale wanders over +-12 binades */
        put(p, dt, i, gauss() * scale * exp2(12.0 * sin((double)i * 1e-4 + (double)rep_e)));
        break;
      case D_GRAD_JUMP: /* the scale jumps every 3000 elements */
        put(p, dt, i, gauss() * ldexp(scale, (int)(((i / 3000) * 7919u + (unsigned)rep_e) % 41) - 20));
        break;
      case D_GRAD_RARE: { /* one element of 20000 a spike, NaN, Inf or subnormal */
        uint64_t r = below(80000);
        double v = gauss() * scale;
        if (r == 0) v = gauss() * big * 1e-3;
        if (r == 1) v = NAN;
        if (r == 2) v = rnd() & 1 ? INFINITY : -INFINITY;
        put(p, dt, i, v);
        if (r == 3) put_bits(p, dt, i, rand_bits_exp(dt, 0, 0));
        break;
      }
      case D_TINYHUGE: {
        double v = gauss();
        if (dt == BX_DT_F64) v *= rnd() & 1 ? 1e300 : 1e-300;
        else v = rnd() & 1 ? v * big * 0.1 : ldexp(v, dt == BX_DT_F16 ? -20 : -140);
        put(p, dt, i, v);
        break;
      }
    }
  }
}

/* ---- an independent reference -------------------------------------------
 * The simplest exact kernels: one bin per exponent field, a branch per
 * special case, the accumulator's own deposits. The portable table (the
 * reference the vector tables are compared with) is tuned code; this
 * checks it. x = m 2^(e - bias_shift) with the field widths of dt. */
static void simple_kernel(int dt, int abs, const void *x, size_t n, bx_acc *acc) {
  int eb, mb;
  dt_fmt(dt, &eb, &mb);
  int emax = (1 << eb) - 1, bias_shift = (1 << (eb - 1)) - 1 + mb;
  for (size_t i = 0; i < n; i++) {
    uint64_t b = 0;
    memcpy(&b, (const char *)x + dt_size[dt] * i, dt_size[dt]);
    int e = (int)((b >> mb) & (uint64_t)emax);
    uint64_t m = b & ((1ull << mb) - 1);
    acc->count++;
    if (e == emax) {
      if (m) acc->nan_count++;
      else acc->inf_count++;
      continue;
    }
    if (e) m |= 1ull << mb;
    else e = 1;
    if (!m) continue;
    int x_exp = e - bias_shift;
    if (abs) {
      bx_acc_deposit_u64(acc, m, x_exp);
    } else { /* m^2 < 2^106: two words */
      unsigned __int128 sq = (unsigned __int128)m * m;
      bx_acc_deposit_u64(acc, (uint64_t)sq, 2 * x_exp);
      bx_acc_deposit_u64(acc, (uint64_t)(sq >> 64), 2 * x_exp + 64);
    }
    if ((i & 0xFFFFF) == 0xFFFFF) bx_acc_normalize(acc); /* 2^21 deposits at most */
  }
}

static void simple_sq_f16(const void *x, size_t n, bx_acc *a) { simple_kernel(BX_DT_F16, 0, x, n, a); }
static void simple_sq_bf16(const void *x, size_t n, bx_acc *a) { simple_kernel(BX_DT_BF16, 0, x, n, a); }
static void simple_sq_f32(const void *x, size_t n, bx_acc *a) { simple_kernel(BX_DT_F32, 0, x, n, a); }
static void simple_sq_f64(const void *x, size_t n, bx_acc *a) { simple_kernel(BX_DT_F64, 0, x, n, a); }
static void simple_abs_f16(const void *x, size_t n, bx_acc *a) { simple_kernel(BX_DT_F16, 1, x, n, a); }
static void simple_abs_bf16(const void *x, size_t n, bx_acc *a) { simple_kernel(BX_DT_BF16, 1, x, n, a); }
static void simple_abs_f32(const void *x, size_t n, bx_acc *a) { simple_kernel(BX_DT_F32, 1, x, n, a); }
static void simple_abs_f64(const void *x, size_t n, bx_acc *a) { simple_kernel(BX_DT_F64, 1, x, n, a); }

static const bx_kernels simple_kernels = {
    "simple",
    {simple_sq_f16, simple_sq_bf16, simple_sq_f32, simple_sq_f64},
    {simple_abs_f16, simple_abs_bf16, simple_abs_f32, simple_abs_f64},
};

/* ---- the versions ------------------------------------------------------ */

/* Byte offset that misaligns an element. The vector kernels take any
 * address; the portable reference reads uint16_t elements directly, which
 * UBSan reports for odd addresses, so sanitizer builds keep elements
 * aligned (still at every element offset). */
#if defined(__SANITIZE_ADDRESS__)
#define ODD_BYTE 0
#else
#define ODD_BYTE 1
#endif

typedef struct version {
  const char *isa; /* bx_force_isa name */
  const bx_kernels *k;
} version;

static version versions[8];
static int nversions;

/* The tables this CPU runs, as the library's own dispatch decides. */
static void find_versions(void) {
  static const char *names[] = {"portable", "avx2", "avx512", "avx512-pf1"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (bx_force_isa(names[i]) == BX_OK) versions[nversions++] = (version){names[i], bx_kernels_active()};
  bx_force_isa(NULL);
}

static int nfail, npass;

/* Run kernel table k (sumsq or sumabs) over x[0..n) in BX_CHUNK pieces,
 * inside the library's floating-point environment. */
static void run(const bx_kernels *k, int abs, int dt, const void *x, size_t n, bx_acc *acc) {
  bx_fpenv env;
  bx_fpenv_enter(&env);
  bx_acc_init(acc);
  for (size_t i = 0; i < n; i += BX_CHUNK) {
    size_t m = n - i < BX_CHUNK ? n - i : BX_CHUNK;
    const void *p = (const char *)x + i * dt_size[dt];
    if (abs) k->sumabs[dt](p, m, acc);
    else k->sumsq[dt](p, m, acc);
    bx_acc_normalize(acc);
  }
  bx_fpenv_leave(&env);
}

static int same(const bx_acc *a, const bx_acc *b) {
  return memcmp(a->digit, b->digit, sizeof a->digit) == 0 && a->nan_count == b->nan_count &&
         a->inf_count == b->inf_count && a->count == b->count;
}

static void report(const char *isa, int abs, int dt, const char *what, size_t n, size_t off,
                   uint64_t seed, const bx_acc *r, const bx_acc *g, const char *extra) {
  nfail++;
  if (nfail > 20) return;
  printf("FAIL %s %s %s %s n=%zu off=%zu seed=%llu%s: ref %.17g (nan %lld inf %lld n %lld) "
         "got %.17g (nan %lld inf %lld n %lld)\n",
         isa, abs ? "sumabs" : "sumsq", dt_name[dt], what, n, off, (unsigned long long)seed, extra,
         bx_acc_value(r), (long long)r->nan_count, (long long)r->inf_count, (long long)r->count,
         bx_acc_value(g), (long long)g->nan_count, (long long)g->inf_count, (long long)g->count);
}

/* The table the others are compared with: the portable kernels, or (to
 * check those) the simple ones above. */
static const bx_kernels *reference = &bx_kernels_portable;

static void check(const version *v, int dt, const void *x, size_t n, const char *what, uint64_t seed,
                  size_t off) {
  for (int abs = 0; abs < 2; abs++) {
    bx_acc r, g;
    run(reference, abs, dt, x, n, &r);
    run(v->k, abs, dt, x, n, &g);
    if (same(&r, &g)) npass++;
    else report(v->isa, abs, dt, what, n, off, seed, &r, &g, "");
  }
}

/* ---- through the public entry, under a hostile caller MXCSR ------------ */

/* DAZ | FTZ with each rounding mode; first with every flag raised and
 * every exception masked, then with no flag and every exception unmasked
 * (safe: the harness does no floating-point arithmetic between setting
 * the word and the call, nor between the call and reading it back; a
 * library operation run in the caller's mode would trap). */
static const unsigned hostile_csr[] = {
    0x8040u | 0x0000u | 0x1F80u | 0x3Fu, 0x8040u | 0x2000u | 0x1F80u | 0x3Fu,
    0x8040u | 0x4000u | 0x1F80u | 0x3Fu, 0x8040u | 0x6000u | 0x1F80u | 0x3Fu,
    0x8040u | 0x0000u,                   0x8040u | 0x2000u,
    0x8040u | 0x4000u,                   0x8040u | 0x6000u,
};
#define NHOSTILE (sizeof hostile_csr / sizeof hostile_csr[0])

static DLTensor tensor_of(void *data, int dt, int64_t *shape, size_t n) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  *shape = (int64_t)n;
  t.shape = shape;
  t.dtype.code = dt == BX_DT_BF16 ? kDLBfloat : kDLFloat;
  t.dtype.bits = (uint8_t)(8 * dt_size[dt]);
  t.dtype.lanes = 1;
  return t;
}

/* acc = sum of x^2 (or |x|) by the public entry with ISA v forced, called
 * under MXCSR csr; returns the MXCSR the call gave back. noinline: nothing
 * of the caller's arithmetic is scheduled inside the hostile window. */
__attribute__((noinline)) static unsigned public_sum(const version *v, int abs, DLTensor *t, bx_acc *acc,
                                                     unsigned csr, bx_status *st) {
  bx_force_isa(v->isa);
  bx_acc_init(acc);
  unsigned saved = _mm_getcsr(), after;
  _mm_setcsr(csr);
  *st = abs ? bx_acc_add_abs(acc, t) : bx_acc_add_squares(acc, t);
  after = _mm_getcsr();
  _mm_setcsr(saved);
  bx_force_isa(NULL);
  return after;
}

static void check_public(const version *v, int dt, void *x, size_t n, const char *what, uint64_t seed) {
  int64_t shape;
  DLTensor t = tensor_of(x, dt, &shape, n);
  for (int abs = 0; abs < 2; abs++) {
    bx_acc r;
    run(reference, abs, dt, x, n, &r);
    for (size_t c = 0; c < NHOSTILE; c++) {
      bx_acc g;
      bx_status st;
      unsigned after = public_sum(v, abs, &t, &g, hostile_csr[c], &st);
      char extra[96];
      snprintf(extra, sizeof extra, " (caller MXCSR 0x%04x, after 0x%04x, status %d)", hostile_csr[c], after,
               (int)st);
      if (st == BX_OK && same(&r, &g) && after == hostile_csr[c]) npass++;
      else report(v->isa, abs, dt, what, n, 0, seed, &r, &g, extra);
    }
  }
}

/* ---- the checks --------------------------------------------------------- */

typedef struct plan {
  size_t short_max, short_step; /* lengths 0..short_max, every short_step-th past 64 */
  int offsets;                  /* element offsets 0..offsets-1, then one odd byte */
  int reps;                     /* repetitions of each block-boundary length */
  size_t long_max;              /* longest block-boundary length */
  size_t hostile_n;             /* elements a hostile-MXCSR case */
} plan;

static const plan full_plan = {300, 1, 4, 4, ((size_t)1 << 22) + 77, 100003};
static const plan quick_plan = {300, 3, 4, 2, (size_t)1 << 20, 100003};

static void check_version(const version *v, const plan *pl, uint64_t base_seed, unsigned char *buf) {
  int portable = v->k == &bx_kernels_portable;
  reference = portable ? &simple_kernels : &bx_kernels_portable;
  for (int dt = 0; dt < BX_DT_COUNT; dt++) {
    /* short lengths, element offsets and one odd byte */
    for (int d = 0; d < D_COUNT; d++)
      for (size_t n = 0; n <= pl->short_max; n += n < 64 ? 1 : pl->short_step)
        for (int o = 0; o <= pl->offsets; o++) {
          uint64_t seed = base_seed ^ (((uint64_t)dt << 56) | ((uint64_t)d << 48) | (n << 8) | (uint64_t)o);
          size_t boff = o < pl->offsets ? (size_t)o * dt_size[dt] : ODD_BYTE + 2 * dt_size[dt];
          reseed(seed);
          fill(buf + boff, dt, n, d);
          check(v, dt, buf + boff, n, dist_name[d], seed, boff);
        }
    /* block boundaries and large spans */
    static const size_t lens[] = {511, 1023, 1024, 1025, 2047, 2048, 2049, 4095, 4097,
                                  6150, 32768 + 5, 100003, (size_t)1 << 20, ((size_t)1 << 22) + 77};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
      if (lens[li] > pl->long_max || (portable && lens[li] > 100003)) continue;
      for (int d = 0; d < D_COUNT; d++)
        for (int rep = 0; rep < (lens[li] > 200000 ? 1 : pl->reps); rep++) {
          uint64_t seed = base_seed ^ (0xABCDull << 40) ^ ((uint64_t)dt << 32) ^ (li << 16) ^
                          ((uint64_t)d << 8) ^ (uint64_t)rep;
          reseed(seed);
          size_t boff = below(9) * dt_size[dt] + (rep == 3 ? ODD_BYTE : 0);
          fill(buf + boff, dt, lens[li], d);
          check(v, dt, buf + boff, lens[li], dist_name[d], seed, boff);
        }
    }
    /* a single NaN/Inf at every position of a 70-element span, in a block
     * of otherwise in-window data */
    for (size_t pos = 0; pos < 70; pos++)
      for (int kind = 0; kind < 2; kind++) {
        reseed(base_seed ^ (pos * 7 + (size_t)kind));
        fill(buf + 4 * dt_size[dt], dt, 70, D_GRAD);
        put(buf + 4 * dt_size[dt], dt, pos, kind ? INFINITY : NAN);
        check(v, dt, buf + 4 * dt_size[dt], 70, kind ? "one-inf" : "one-nan", 0, pos);
      }
    /* every distribution through the public entry under hostile MXCSRs
     * (the portable reference itself included: it runs there too) */
    reference = &bx_kernels_portable;
    for (int d = 0; d < D_COUNT; d++) {
      uint64_t seed = base_seed ^ (0xC5Cull << 40) ^ ((uint64_t)dt << 32) ^ (uint64_t)d;
      reseed(seed);
      size_t n = d == D_GRAD || d == D_GRAD_TINY || d == D_GRAD_RARE ? pl->hostile_n : 4099;
      fill(buf, dt, n, d);
      check_public(v, dt, buf, n, dist_name[d], seed);
    }
    reference = portable ? &simple_kernels : &bx_kernels_portable;
  }
}

static int run_checks(uint64_t base_seed, const plan *pl) {
  find_versions();
  size_t cap = pl->long_max + 4096;
  unsigned char *buf = aligned_alloc(64, (cap * 8 + 64 + 63) / 64 * 64);
  if (!buf) return 1;
  for (int t = 0; t < nversions; t++) {
    int f0 = nfail;
    check_version(&versions[t], pl, base_seed, buf);
    printf("%s %s: %s\n", nfail == f0 ? "PASS" : "FAIL", versions[t].isa,
           nfail != f0 ? "mismatches above"
           : versions[t].k == &bx_kernels_portable
               ? "all cases identical to the simple reference, and under hostile MXCSRs"
               : "all cases identical to the portable reference, and under hostile MXCSRs");
  }
  free(buf);
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}

/* ---- benchmark --------------------------------------------------------- */
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static volatile double sink;

typedef struct bench_case {
  const char *name;
  int dt, dist;
} bench_case;

static double best5;
static double median5(double *t) {
  qsort(t, 5, sizeof *t, cmp_dbl);
  best5 = t[0];
  return t[2];
}

/* median of 5, and in brackets the best of 5 (the machine may be shared) */
static void bench_line(const char *what, const char *kern, size_t n, size_t bytes, double sec) {
  printf("  %-16s %-9s N=2^%-2d %7.3f ns/elem %7.2f GB/s  [best %7.3f ns %7.2f GB/s]\n", what,
         kern, (int)round(log2((double)n)), 1e9 * sec / (double)n, (double)bytes / sec * 1e-9,
         1e9 * best5 / (double)n, (double)bytes / best5 * 1e-9);
}

static int run_bench(const char *filter) {
  find_versions();
  static const bench_case cases[] = {
      {"f32 gradient", BX_DT_F32, D_GRAD},   {"f32 spiky", BX_DT_F32, D_SPIKY},
      {"f32 wide40", BX_DT_F32, D_WIDE40},   {"bf16 gradient", BX_DT_BF16, D_GRAD},
      {"f16 gradient", BX_DT_F16, D_GRAD},   {"f64 gradient", BX_DT_F64, D_GRAD},
      {"f32 wide-all", BX_DT_F32, D_WIDEALL}, {"bf16 wide40", BX_DT_BF16, D_WIDE40},
      {"bf16 wide-all", BX_DT_BF16, D_WIDEALL}, {"f64 wide-all", BX_DT_F64, D_WIDEALL},
      {"f64 1e+-300", BX_DT_F64, D_TINYHUGE},   {"f32 wide120", BX_DT_F32, D_WIDE120},
      {"bf16 wide120", BX_DT_BF16, D_WIDE120},  {"f32 grad-drift", BX_DT_F32, D_GRAD_DRIFT},
      {"bf16 grad-drift", BX_DT_BF16, D_GRAD_DRIFT}, {"f32 grad+rare", BX_DT_F32, D_GRAD_RARE},
  };
  const char *read_isa;
  read_fn read = pick_read(&read_isa);
  sumsq_fn naive = pick_naive32(BT_F32, bench_have_avx512());
  size_t maxn = (size_t)1 << 24;
  unsigned char *buf = aligned_alloc(64, maxn * 8);
  if (!buf) return 1;
  printf("single thread; median of 5; bytes = input bytes; %s\n", bx_kernels_reason());
  for (int sz = 20; sz <= 24; sz += 4) {
    size_t n = (size_t)1 << sz;
    printf("N = 2^%d\n", sz);
    reseed(42);
    fill(buf, BX_DT_F32, n, D_GRAD);
    double t[5];
    for (int dt = 1; dt < 4; dt++) { /* 2, 4 and 8 bytes an element */
      size_t bytes = n * dt_size[dt];
      for (int r = 0; r < 5; r++) {
        double t0 = now();
        sink = (double)read(buf, bytes);
        t[r] = now() - t0;
      }
      char what[32];
      snprintf(what, sizeof what, "read %zuB/elem", dt_size[dt]);
      bench_line(what, read_isa, n, bytes, median5(t));
    }
    for (int r = 0; r < 5; r++) {
      double t0 = now();
      sink = naive(buf, n);
      t[r] = now() - t0;
    }
    bench_line("f32 naive fma", "simd", n, n * 4, median5(t));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      reseed(1234 + c);
      fill(buf, cases[c].dt, n, cases[c].dist);
      size_t bytes = n * dt_size[cases[c].dt];
      for (int k = 0; k < nversions; k++) {
        char label[64];
        snprintf(label, sizeof label, "%s %s", cases[c].name, versions[k].isa);
        if (filter && !strstr(label, filter)) continue;
        bx_acc acc;
        for (int r = 0; r < 5; r++) {
          double t0 = now();
          run(versions[k].k, 0, cases[c].dt, buf, n, &acc);
          t[r] = now() - t0;
        }
        sink = bx_acc_value(&acc);
        bench_line(cases[c].name, versions[k].isa, n, bytes, median5(t));
      }
    }
  }
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 1 && strcmp(argv[1], "bench") == 0) return run_bench(argc > 2 ? argv[2] : NULL);
  int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
  if (argc > 1 && !quick && strcmp(argv[1], "check") != 0) {
    fprintf(stderr, "usage: sumsq_kernels [check [SEED] | quick [SEED] | bench [FILTER]]\n");
    return 2;
  }
  uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 20240611;
  printf("seed %llu, %s plan\n", (unsigned long long)seed, quick ? "quick" : "full");
  return run_checks(seed, quick ? &quick_plan : &full_plan);
}
