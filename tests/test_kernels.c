/*
 * test_kernels.c — the block drivers and their micro-kernels (src/cpu/
 * micro.h), bit for bit against MPFR under every ISA: data made to walk
 * each path of each driver (verified and guessed windows that hold and
 * that fail, spikes set apart, NaN/Inf split off or binned, wide blocks
 * and the runs that skip pass 1, three-level blocks, fp64 cascades and
 * the 128-bit bins across blocks and flushes); every kernel under hostile
 * caller floating-point environments through the public entry (the
 * caller's word must come back unchanged); the dispatcher's reason; the
 * micro-kernel tables' shape.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../src/cpu/micro.h"
#include "checks.h"
#include "fpword.h"
#include "harness.h"
#include "kernels.h"
#include "tests.h"
#include "util.h"


/* ---- data for each driver path ------------------------------------------ */

typedef enum kt_kind {
  KT_GRAD,          /* gradient-like: verified / guessed windows engage */
  KT_GRAD_TINY,     /* + rare elements 2^-40 below: the guesses fail, blocks redone */
  KT_GRAD_SPIKES,   /* + rare spikes 2^50 above: split apart (<= 32 a block) */
  KT_SPIKES_MANY,   /* every 20th element 2^60 above: no window, the bins */
  KT_NAN_FEW,       /* + a NaN every 3001, an Inf every 4999 */
  KT_NAN_MANY,      /* a NaN every 16th element in the middle third */
  KT_NAN_RARE,      /* an Inf or NaN every 20011 elements: long clean runs between */
  KT_WIDE_THEN_GRAD,/* whole-range exponents, then gradient-like */
  KT_DRIFT,         /* the scale jumps by up to 2^+-12 every 2500 elements */
  KT_SUBNORMAL,     /* gradient-like around the dtype's subnormals */
  KT_SUBNORMAL_MIX, /* gradient-like 20 binades above, a subnormal every 97th */
  KT_SPREAD30,      /* exponents uniform over 30 binades: three levels (fp32) */
  KT_CASCADE120,    /* exponents over 120 binades inside 4 buckets (fp64: > 6 windows) */
  KT_HUGE,          /* gradient-like near the dtype's largest values */
  KT_BIG80,         /* gradient-like at 2^80, some at 2^60 (bf16: past the fp32 lanes) */
  KT_COUNT
} kt_kind;

static const char *kt_name[KT_COUNT] = {"gradient", "gradient+tiny", "gradient+spikes",
                                        "spikes-many", "nan-few", "nan-many", "nan-rare",
                                        "wide-then-gradient", "drift", "subnormal", "subnormal-mix",
                                        "spread30", "cascade120", "huge", "big80"};

/* exponent field width and mantissa width of a dtype */
static void kt_fmt(int dt, int *eb, int *mb) {
  static const int e[4] = {5, 8, 8, 11}, m[4] = {10, 7, 23, 52};
  *eb = e[dt];
  *mb = m[dt];
}

/* a finite value with biased exponent in [elo, ehi], random sign and mantissa */
static uint64_t kt_bits(bxt_rng *r, int dt, int elo, int ehi) {
  int eb, mb;
  kt_fmt(dt, &eb, &mb);
  uint64_t e = (uint64_t)elo + bxt_below(r, (uint64_t)(ehi - elo + 1));
  return ((bxt_next(r) & 1) << (eb + mb)) | (e << mb) | (bxt_next(r) & ((1ull << mb) - 1));
}

static void kt_fill(bxt_rng *r, bxt_tensor *x, kt_kind k) {
  int dt = x->dt, eb, mb;
  kt_fmt(dt, &eb, &mb);
  int emax = (1 << eb) - 2, bias = (1 << (eb - 1)) - 1;
  double sigma = dt == REF_F16 ? 1e-2 : 1e-3;
  double huge = dt == REF_F64 ? 1e300 : dt == REF_F16 ? 8e3 : 1e37;
  double subn = dt == REF_F64 ? 1e-310 : dt == REF_F16 ? 3e-6 : 1e-39;
  size_t n = x->n;
  for (size_t i = 0; i < n; i++) {
    double g = bxt_normal(r);
    switch (k) {
      case KT_GRAD: bxt_set(x, i, g * sigma); break;
      case KT_GRAD_TINY: bxt_set(x, i, i % 7001 == 7000 ? ldexp(g * sigma, dt == REF_F16 ? -12 : -40) : g * sigma); break;
      case KT_GRAD_SPIKES: bxt_set(x, i, i % 5003 == 5002 ? ldexp(g * sigma, dt == REF_F16 ? 8 : 50) : g * sigma); break;
      case KT_SPIKES_MANY:
        if (dt == REF_F16) bxt_set(x, i, i % 20 == 19 ? g * 1e3 : g * 1e-6);
        else bxt_set(x, i, i % 20 == 19 ? ldexp(g * sigma, 60) : g * sigma);
        break;
      case KT_NAN_FEW:
        bxt_set(x, i, i % 3001 == 3000 ? NAN : i % 4999 == 4998 ? (i & 1 ? INFINITY : -INFINITY) : g * sigma);
        break;
      case KT_NAN_MANY: bxt_set(x, i, i > n / 3 && i < 2 * n / 3 && i % 16 == 0 ? NAN : g * sigma); break;
      case KT_NAN_RARE: bxt_set(x, i, i % 20011 == 20010 ? (i / 20011 % 3 ? INFINITY : NAN) : g * sigma); break;
      case KT_WIDE_THEN_GRAD:
        if (i < n / 2) bxt_set_bits(x, i, kt_bits(r, dt, 0, emax));
        else bxt_set(x, i, g * sigma);
        break;
      case KT_DRIFT: bxt_set(x, i, ldexp(g * sigma, (int)((i / 2500 * 7919) % 25) - 12)); break;
      case KT_SUBNORMAL: bxt_set(x, i, g * subn); break;
      case KT_SUBNORMAL_MIX: bxt_set(x, i, i % 97 == 0 ? g * subn : ldexp(g * subn, 20)); break;
      case KT_SPREAD30: {
        int lo = bias - 20 > 1 ? bias - 20 : 1;
        bxt_set_bits(x, i, kt_bits(r, dt, lo, lo + (emax - lo < 29 ? emax - lo : 29)));
        break;
      }
      case KT_CASCADE120: { /* fp64: |x| bits >> 57 in 4 buckets = 128 binades from 1024 */
        if (dt == REF_F64) bxt_set_bits(x, i, kt_bits(r, dt, 1024 + 2, 1024 + 121));
        else bxt_set_bits(x, i, kt_bits(r, dt, 0, emax));
        break;
      }
      case KT_HUGE: bxt_set(x, i, g * huge); break;
      case KT_BIG80: /* + every 3001st 2^20 lower: two levels */
        bxt_set(x, i, ldexp(g * sigma, dt == REF_F16 ? 5 : i % 3001 == 7 ? 60 : 80));
        break;
      case KT_COUNT: break;
    }
  }
}

/* Every ISA's normalised words must be the same (bxt_check_acc checks the
 * values against MPFR; this the words themselves). */
static void kt_same_words(const char *what, bxt_tensor *x) {
  bx_acc first;
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    bx_acc acc;
    bx_acc_init(&acc);
    CHECK_STATUS(bx_acc_add_squares(&acc, &x->t), BX_OK, "%s, isa %s", what, bxt_isa(isa));
    if (isa == 0) first = acc;
    else
      CHECK(memcmp(&acc, &first, sizeof acc) == 0, "%s: the words of isa %s differ from isa %s", what,
            bxt_isa(isa), bxt_isa(0));
  }
  bxt_force(-1);
}

void test_kernels_driver_paths(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int dt = 0; dt < REF_NDT; dt++)
    for (int k = 0; k < KT_COUNT; k++) {
      /* long enough for runs of verified / guessed blocks, and odd */
      size_t n = k == KT_GRAD || k == KT_GRAD_TINY || k == KT_DRIFT || k == KT_NAN_RARE || k == KT_BIG80 ? 200003
                 : k == KT_NAN_MANY                                           ? 120007
                                                                              : 40009;
      bxt_tensor x;
      bxt_tensor_alloc(&x, dt, n);
      kt_fill(&r, &x, (kt_kind)k);
      char what[96];
      snprintf(what, sizeof what, "%s %s n=%zu", kt_name[k], bxt_dt_name(dt), n);
      bxt_check_acc(what, &x, 1);
      kt_same_words(what, &x);
      /* the same data 3 elements in: a first block shorter than the
       * others, so no block boundary falls where it did */
      bxt_tensor v = x; /* a view: never freed */
      v.t.shape = v.shape;
      v.shape[0] = (int64_t)(n - 3);
      v.t.byte_offset = 3 * bxt_dt_size(dt);
      v.buf = (char *)x.buf + 3 * bxt_dt_size(dt);
      v.n = n - 3;
      snprintf(what, sizeof what, "%s %s n=%zu, 3 elements in", kt_name[k], bxt_dt_name(dt), n - 3);
      bxt_check_acc(what, &v, 1);
      kt_same_words(what, &v);
      bxt_tensor_free(&x);
      if (bxt_failures() > 20) return;
    }
}

/* One special element (a spike, a tiny element, a NaN) at every position
 * near the ends of the first blocks of every ISA's block sizes, with the
 * data starting on a block boundary or 3 elements past one: a pass-1
 * result carried into the next block (fused loops) must cover all of it.
 * The words of every ISA against the portable kernels'. */
void test_kernels_special_near_block_ends(void) {
  static const size_t blocks[] = {256, 1024, 2048}; /* fp64 AVX2; fp64 AVX-512, AVX2; AVX-512 */
  bxt_rng r;
  bxt_rng_init(&r);
  for (int dt = 0; dt < REF_NDT; dt++) {
    size_t n = 3 * 2048 + 64;
    bxt_tensor x;
    bxt_tensor_alloc(&x, dt, n + 3);
    bxt_tensor grad;
    bxt_tensor_alloc(&grad, dt, n + 3);
    kt_fill(&r, &grad, KT_GRAD);
    for (int kind = 0; kind < 3; kind++)
      for (size_t bi = 0; bi < 3; bi++)
        for (size_t k = 1; k <= 2; k++)
          for (size_t off = 0; off <= 3; off += 3)
            for (size_t d = 0; d < 48; d += 3) {
              size_t at = k * blocks[bi] - off - 40 + d; /* in the view */
              memcpy(x.buf, grad.buf, (n + 3) * bxt_dt_size(dt));
              double g = bxt_get(&grad, at + off);
              bxt_set(&x, at + off, kind == 0 ? ldexp(g, dt == REF_F16 ? 6 : 40)
                                    : kind == 1 ? ldexp(g, dt == REF_F16 ? -10 : -40)
                                                : NAN);
              bxt_tensor v = x; /* a view: never freed */
              v.t.shape = v.shape;
              v.shape[0] = (int64_t)n;
              v.t.byte_offset = off * bxt_dt_size(dt);
              char what[96];
              snprintf(what, sizeof what, "%s, %s at %zu of a view %zu in", bxt_dt_name(dt),
                       kind == 0 ? "spike" : kind == 1 ? "tiny" : "NaN", at, off);
              kt_same_words(what, &v);
              if (bxt_failures() > 20) goto done;
            }
  done:
    bxt_tensor_free(&grad);
    bxt_tensor_free(&x);
  }
}

/* fp64 spread over the whole range in one kernel call of more than 2^21
 * elements: the driver's 128-bit bins flush for room mid-call. */
void test_kernels_f64_bins_flush(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  size_t n = ((size_t)1 << 21) + 4097;
  bxt_tensor x;
  bxt_tensor_alloc(&x, REF_F64, n);
  for (size_t i = 0; i < n; i++) bxt_set_bits(&x, i, kt_bits(&r, REF_F64, 0, 2000));
  bxt_set(&x, n / 2, NAN); /* a NaN counted across the flush */
  bxt_check_acc("f64 whole range, 2^21 + 4097 elements", &x, 1);
  kt_same_words("f64 whole range, 2^21 + 4097 elements", &x);
  bxt_tensor_free(&x);
}

/* ---- hostile caller environments ---------------------------------------- */
#ifdef BXT_HAVE_FPWORD
/* Flush to zero (x86 DAZ | FTZ, aarch64 FZ | FZ16) with each rounding
 * mode, all flags raised (masked), then the same with every exception
 * trapping and no flag (a library operation run in the caller's mode
 * would trap, where the hardware implements traps). tests/fpword.h. */
#define KT_F BXT_FPW_FLUSH
#define KT_ALL (BXT_FPW_DEFAULT | BXT_FPW_FLAGS)
static const bxt_fpword kt_csr[] = {
    KT_F | KT_ALL, KT_F | BXT_FPW_RD | KT_ALL, KT_F | BXT_FPW_RU | KT_ALL, KT_F | BXT_FPW_RZ | KT_ALL,
    BXT_FPW_TRAPS(BXT_FPW_DEFAULT | KT_F), BXT_FPW_TRAPS(BXT_FPW_DEFAULT | KT_F | BXT_FPW_RD),
    BXT_FPW_TRAPS(BXT_FPW_DEFAULT | KT_F | BXT_FPW_RU), BXT_FPW_TRAPS(BXT_FPW_DEFAULT | KT_F | BXT_FPW_RZ),
#if defined(__aarch64__)
    BXT_FPW_EXTRA | KT_F | KT_ALL,
#endif
};

/* one call under csr, nothing else inside the window; *in: the word in
 * effect (what the hardware kept of csr) */
__attribute__((noinline)) static bxt_fpword kt_under(bxt_fpword csr, int op, bx_acc *acc, const DLTensor *t,
                                                     bx_status *st, bxt_fpword *in) {
  bxt_fpword saved = bxt_fpword_get(), after;
  *in = bxt_fpword_set(csr);
  *st = op == 0 ? bx_acc_add_squares(acc, t) : bx_acc_add_abs(acc, t);
  after = bxt_fpword_get();
  bxt_fpword_set(saved);
  return after;
}

__attribute__((noinline)) static bxt_fpword kt_norm_under(bxt_fpword csr, const bx_group *g,
                                                          const bx_norm_opts *o, double *norm, bx_status *st,
                                                          bxt_fpword *in) {
  bxt_fpword saved = bxt_fpword_get(), after;
  *in = bxt_fpword_set(csr);
  *st = bx_total_norm(g, 1, NULL, o, norm, NULL);
  after = bxt_fpword_get();
  bxt_fpword_set(saved);
  return after;
}
#endif

void test_kernels_hostile_fpenv(void) {
#ifdef BXT_HAVE_FPWORD
  bxt_rng r;
  bxt_rng_init(&r);
  for (int dt = 0; dt < REF_NDT; dt++) {
    /* subnormals (DAZ/FTZ would lose them), a long gradient-like stretch
     * (verified / guessed windows, flags), a few NaN */
    bxt_tensor x;
    bxt_tensor_alloc(&x, dt, 90001);
    kt_fill(&r, &x, KT_GRAD_TINY);
    bxt_tensor sub;
    bxt_tensor_alloc(&sub, dt, 5000);
    kt_fill(&r, &sub, KT_SUBNORMAL);
    memcpy(x.buf, sub.buf, sub.n * bxt_dt_size(dt));
    bxt_tensor_free(&sub);
    for (int isa = 0; isa < bxt_isa_count(); isa++) {
      if (!bxt_force(isa)) continue;
      for (int op = 0; op < 2; op++) {
        bx_acc want;
        bx_acc_init(&want);
        CHECK_STATUS(op == 0 ? bx_acc_add_squares(&want, &x.t) : bx_acc_add_abs(&want, &x.t), BX_OK,
                     "reference call");
        for (size_t c = 0; c < sizeof kt_csr / sizeof kt_csr[0]; c++) {
          bx_acc got;
          bx_acc_init(&got);
          bx_status st;
          bxt_fpword in, after = kt_under(kt_csr[c], op, &got, &x.t, &st, &in);
          CHECK_STATUS(st, BX_OK, "%s %s isa %s " BXT_FPW_NAME " 0x%llx", bxt_dt_name(dt),
                       op ? "abs" : "squares", bxt_isa(isa), kt_csr[c]);
          CHECK((in & BXT_FPW_IMPLEMENTED) == (kt_csr[c] & BXT_FPW_IMPLEMENTED),
                BXT_FPW_NAME " 0x%llx was set as 0x%llx", kt_csr[c], in);
          CHECK(after == in, "%s isa %s: the caller's " BXT_FPW_NAME " 0x%llx came back as 0x%llx",
                bxt_dt_name(dt), bxt_isa(isa), in, after);
          CHECK(memcmp(&got, &want, sizeof got) == 0, "%s %s isa %s: words differ under " BXT_FPW_NAME " 0x%llx",
                bxt_dt_name(dt), op ? "abs" : "squares", bxt_isa(isa), kt_csr[c]);
        }
      }
      /* the norm with worker threads: each job enters the environment too */
      bx_group g = {&x.t, 1};
      bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
      o.num_threads = 2;
      double want = 0, got = 0;
      CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &want, NULL), BX_OK, "norm");
      for (size_t c = 0; c < sizeof kt_csr / sizeof kt_csr[0]; c++) {
        bx_status st;
        bxt_fpword in, after = kt_norm_under(kt_csr[c], &g, &o, &got, &st, &in);
        CHECK_STATUS(st, BX_OK, "norm under " BXT_FPW_NAME " 0x%llx", kt_csr[c]);
        CHECK(after == in, "norm: " BXT_FPW_NAME " 0x%llx came back as 0x%llx", in, after);
        CHECK_BITS_D(got, want, "%s isa %s: norm under " BXT_FPW_NAME " 0x%llx", bxt_dt_name(dt), bxt_isa(isa),
                     kt_csr[c]);
      }
    }
    bxt_force(-1);
    bxt_tensor_free(&x);
  }
#else
  bxt_skip("fpword.h: no control word of this architecture");
#endif
}

/* ---- dispatch: why a table was chosen ------------------------------------ */
void test_kernels_dispatch_reason(void) {
  bxt_force(-1);
  const char *name = bx_isa_name(), *why = bx_kernels_reason();
  char auto_why[256];
  snprintf(auto_why, sizeof auto_why, "%s", why ? why : "");
  size_t len = strlen(name);
  CHECK(why && strncmp(why, name, len) == 0 && why[len] == ':',
        "the reason names the table first: '%s' for %s", why ? why : "(null)", name);
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!CHECK(bxt_force(isa), "force %s", bxt_isa(isa))) continue;
    why = bx_kernels_reason();
    CHECK(strcmp(bx_isa_name(), bxt_isa(isa)) == 0 && strncmp(why, bxt_isa(isa), strlen(bxt_isa(isa))) == 0 &&
              strstr(why, "forced") != NULL,
          "forced %s: name %s, reason '%s'", bxt_isa(isa), bx_isa_name(), why);
  }
  bxt_force(-1);
  CHECK(strcmp(bx_kernels_reason(), auto_why) == 0, "back to automatic: '%s' want '%s'", bx_kernels_reason(),
        auto_why);
  CHECK(strcmp(bx_isa_name(), name) == 0, "back to automatic: %s want %s", bx_isa_name(), name);
  CHECK_STATUS(bx_force_isa("no-such-isa"), BX_EINVAL, "unknown name");
  CHECK(strcmp(bx_kernels_reason(), auto_why) == 0, "a refused name keeps the reason");
}

/* ---- the micro-kernel tables' shape (what a new ISA must provide) -------- */
#ifdef BX_HAVE_X86
static void kt_block(const char *what, size_t block, size_t lanes_x64) {
  CHECK(block > 0 && block <= BX_BLOCK_MAX && block % lanes_x64 == 0, "%s: block %zu (lanes x %zu)", what,
        block, lanes_x64);
}
#endif

void test_kernels_micro_tables(void) {
#ifdef BX_HAVE_X86
  const bx_f32_micro *f32[2] = {&bx_micro_f32_avx2, &bx_micro_f32_avx512};
  const bx_bf16_micro *bf16[2] = {&bx_micro_bf16_avx2, &bx_micro_bf16_avx512};
  const bx_f16_micro *f16[2] = {&bx_micro_f16_avx2, &bx_micro_f16_avx512};
  const bx_f64_micro *f64[2] = {&bx_micro_f64_avx2, &bx_micro_f64_avx512};
  for (int i = 0; i < 2; i++) {
    kt_block("f32", f32[i]->block, 64);
    CHECK(f32[i]->stats && f32[i]->window2 && f32[i]->window3 && f32[i]->split && f32[i]->bins_prep,
          "f32 table %d: a required entry is NULL", i);
    kt_block("bf16", bf16[i]->block, 64);
    CHECK(bf16[i]->stats && bf16[i]->window1 && bf16[i]->window2 && bf16[i]->window1_fast &&
              bf16[i]->window2_fast && bf16[i]->window3_fast && bf16[i]->bins_prep &&
              !bf16[i]->guess1 == !bf16[i]->guess2,
          "bf16 table %d: a required entry is NULL, or one guessed window without the other", i);
    kt_block("f16", f16[i]->block, 64);
    CHECK(f16[i]->window != NULL, "f16 table %d", i);
    kt_block("f64", f64[i]->block, 32);
    CHECK(f64[i]->stats && f64[i]->window_all && f64[i]->window, "f64 table %d", i);
  }
  CHECK(bx_micro_f32_avx512.verified != NULL && bx_micro_f64_avx512.verified != NULL,
        "AVX-512 has the verified windows");
  CHECK(bx_micro_f32_avx2.verified == NULL && bx_micro_f64_avx2.verified == NULL &&
            bx_micro_f32_avx2.verified_split == NULL,
        "AVX2 cannot (no exception suppression)");
  CHECK(bx_micro_f32_avx512.verified_split != NULL, "AVX-512 sets fp32 spikes apart in the verified window");
#else
  /* no vector micro-kernels on this architecture: the portable tables are
   * the only ones, complete, and active */
  for (int dt = 0; dt < BX_DT_COUNT; dt++) {
    CHECK(bx_kernels_portable.sumsq[dt] && bx_kernels_portable.sumabs[dt], "portable kernels: dtype %d missing",
          dt);
    CHECK(bx_scale_portable.torch[dt] && bx_scale_portable.exact[dt], "portable scaling: dtype %d missing", dt);
  }
  CHECK(bx_kernels_active() == &bx_kernels_portable && bx_scale_kernels_active() == &bx_scale_portable,
        "the active tables are not the portable ones (%s)", bx_kernels_active()->name);
  CHECK(bxt_isa_count() == 1, "%d kernel tables can be forced, want 1 (portable)", bxt_isa_count());
#endif
}
