/*
 * test_fpenv.c — the promise holds whatever floating-point environment the
 * caller set: with DAZ/FTZ (torch.set_flush_denormal(True)), each rounding
 * mode, unmasked exceptions and sticky flags already raised, every public
 * call gives the bits it gives in the default environment — every p, both
 * flavours, both scale modes, the clip, the accumulator calls, on 1, 2 and
 * 4 threads and every ISA — and gives the caller's control word back
 * unchanged (control and flags: the MXCSR on x86-64, FPCR and FPSR on
 * aarch64, tests/fpword.h). A communicator callback runs in the caller's
 * environment.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels.h"
#include "tests.h"
#include "util.h"

#include "fpword.h"

#ifdef BXT_HAVE_FPWORD

/* The caller's word (fpword.h: the MXCSR on x86-64, FPCR:FPSR on aarch64). */
#define CSR_DEFAULT BXT_FPW_DEFAULT
#define CSR_FLUSH BXT_FPW_FLUSH /* x86 DAZ|FTZ, aarch64 FZ|FZ16 */
#define CSR_RD BXT_FPW_RD
#define CSR_RU BXT_FPW_RU
#define CSR_RZ BXT_FPW_RZ
#define CSR_FLAGS BXT_FPW_FLAGS

static bxt_fpword csr_get(void) { return bxt_fpword_get(); }
static bxt_fpword csr_set(bxt_fpword c) { return bxt_fpword_set(c); }

typedef struct env_case {
  const char *name;
  bxt_fpword csr;
} env_case;

/* Hostile environments. The trapping ones trap on any floating-point
 * exception the library would raise outside its own environment (where
 * the hardware implements traps); flags preset must come back set. */
static const env_case ENVS[] = {
    {"flush to zero", CSR_DEFAULT | CSR_FLUSH},
    {"round up", CSR_DEFAULT | CSR_RU},
    {"round down", CSR_DEFAULT | CSR_RD},
    {"toward zero", CSR_DEFAULT | CSR_RZ},
    {"flush to zero, toward zero, flags set", CSR_DEFAULT | CSR_FLUSH | CSR_RZ | CSR_FLAGS},
    {"every exception trapping", BXT_FPW_TRAPS(CSR_DEFAULT)},
    {"trapping, flush to zero, round up, flags set",
     BXT_FPW_TRAPS(CSR_DEFAULT | CSR_FLUSH | CSR_RU) | BXT_FPW_INVALID_INEXACT},
#if defined(__aarch64__)
    {"AH, FIZ, NEP, DN, AHP, flush to zero, round down", BXT_FPW_EXTRA | CSR_FLUSH | CSR_RD},
#endif
};
#define NENVS (sizeof ENVS / sizeof ENVS[0])

/* What a scenario computes: every output as bytes. */
#define OUT_MAX 64
typedef struct outs {
  double d[OUT_MAX];
  int64_t i[OUT_MAX];
  int nd, ni;
  bxt_fpword csr_in_callback;
} outs;

typedef void (*scenario_fn)(void *ctx, outs *o);

/* Run fn with the caller's word = csr (nothing else between the switch
 * and the call); the word in effect (what the hardware kept of csr) in
 * *before, the word the call gave back in *after. */
static __attribute__((noinline)) void run_in(bxt_fpword csr, scenario_fn fn, void *ctx, outs *o,
                                              bxt_fpword *before, bxt_fpword *after) {
  *before = csr_set(csr);
  fn(ctx, o);
  *after = csr_get();
  csr_set(CSR_DEFAULT);
  CHECK((*before & BXT_FPW_IMPLEMENTED) == (csr & BXT_FPW_IMPLEMENTED),
        "the caller's " BXT_FPW_NAME " 0x%llx was set as 0x%llx: the test did not run in it", csr, *before);
}

/* ---- the data: subnormals of every dtype, normals, zeros, a spike ------ */
typedef struct data {
  bxt_tensor x[4]; /* f16, bf16, f32, f64 */
  DLTensor dl[4];
  bx_group groups[2];
  bxt_tensor small[4]; /* for other p (the power function is slow) */
  DLTensor sdl[4];
  bx_group sgroups[1];
} data;

static void fill_subnormal_rich(bxt_rng *r, bxt_tensor *x) {
  bxt_fill_gradient(r, x, 1e-2);
  for (size_t i = 0; i < x->n; i++) {
    uint64_t k = bxt_below(r, 8);
    if (k < 3) { /* a subnormal of the dtype: exponent field 0, random fraction */
      uint64_t frac;
      switch (x->dt) {
        case REF_F16: frac = 1 + bxt_below(r, 0x3FF); break;
        case REF_BF16: frac = 1 + bxt_below(r, 0x7F); break;
        case REF_F32: frac = 1 + bxt_below(r, 0x7FFFFF); break;
        default: frac = 1 + bxt_below(r, 0xFFFFFFFFFFFFFull); break;
      }
      int sign_bit = x->dt == REF_F64 ? 63 : x->dt == REF_F32 ? 31 : 15;
      if (bxt_below(r, 2)) frac |= 1ull << sign_bit;
      bxt_set_bits(x, i, frac);
    }
  }
}

static void data_make(data *d, size_t n) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int k = 0; k < 4; k++) {
    bxt_tensor_alloc(&d->x[k], k, n + (size_t)k * 37);
    fill_subnormal_rich(&r, &d->x[k]);
    d->dl[k] = d->x[k].t;
    bxt_tensor_alloc(&d->small[k], k, 2000 + (size_t)k);
    fill_subnormal_rich(&r, &d->small[k]);
    d->sdl[k] = d->small[k].t;
  }
  d->groups[0] = (bx_group){d->dl, 2};
  d->groups[1] = (bx_group){d->dl + 2, 2};
  d->sgroups[0] = (bx_group){d->sdl, 4};
}

static void data_free(data *d) {
  for (int k = 0; k < 4; k++) {
    bxt_tensor_free(&d->x[k]);
    bxt_tensor_free(&d->small[k]);
  }
}

/* ---- scenarios --------------------------------------------------------- */
typedef struct norm_ctx {
  data *d;
  double p;
  bx_norm_flavor flavor;
  int threads;
  bx_norm_dtype norm_dtype;
  int small; /* other p: the small data (decided before the environment changes) */
} norm_ctx;

static void sc_norm(void *vc, outs *o) {
  norm_ctx *c = vc;
  bx_norm_opts opts = BX_NORM_OPTS_DEFAULT;
  opts.norm_type = c->p;
  opts.flavor = c->flavor;
  opts.num_threads = c->threads;
  opts.norm_dtype = c->norm_dtype;
  int small = c->small;
  o->i[o->ni++] = bx_total_norm(small ? c->d->sgroups : c->d->groups, small ? 1 : 2, NULL, &opts,
                                &o->d[0], &o->d[1]);
  o->nd = 3;
}

typedef struct scale_ctx {
  data *d;
  bxt_tensor y[4];
  DLTensor dl[4];
  bx_scale_mode mode;
  int threads;
  double coef;
} scale_ctx;

static void sc_scale(void *vc, outs *o) {
  scale_ctx *c = vc;
  bx_scale_opts so = BX_SCALE_OPTS_DEFAULT;
  so.mode = c->mode;
  so.num_threads = c->threads;
  o->i[o->ni++] = bx_scale(c->dl, 4, c->coef, &so);
}

typedef struct clip_ctx {
  scale_ctx *s;
  bx_coef_formula formula;
  double max_norm;
} clip_ctx;

static void sc_clip(void *vc, outs *o) {
  clip_ctx *c = vc;
  bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
  co.formula = c->formula;
  co.norm.num_threads = co.scale.num_threads = c->s->threads;
  co.scale.mode = c->s->mode;
  bx_group g = {c->s->dl, 4};
  o->i[o->ni++] = bx_clip_grad_norm(&g, 1, NULL, c->max_norm, &co, &o->d[0], &o->d[1]);
  o->i[o->ni++] = bx_clip_coef(0x1.8p-1, 0x1p-3, &co, &o->d[2]);
  o->nd = 3;
}

static void sc_acc(void *vc, outs *o) {
  data *d = vc;
  bx_acc sq, ab;
  bx_acc_init(&sq);
  bx_acc_init(&ab);
  for (int k = 0; k < 4; k++) {
    o->i[o->ni++] = bx_acc_add_squares(&sq, &d->dl[k]);
    o->i[o->ni++] = bx_acc_add_abs(&ab, &d->dl[k]);
  }
  const bx_acc *a[2] = {&sq, &ab};
  for (int k = 0; k < 2; k++) {
    o->d[o->nd++] = bx_acc_value(a[k]);
    o->d[o->nd++] = bx_acc_sqrt(a[k]);
    float f = bx_acc_valuef(a[k]), g = bx_acc_sqrtf(a[k]);
    o->i[o->ni++] = (int64_t)bxt_fbits(f);
    o->i[o->ni++] = (int64_t)bxt_fbits(g);
    for (int dt = 0; dt < 4; dt++) {
      uint64_t bits = 0;
      o->i[o->ni++] = bx_acc_norm(a[k], k == 0 ? 2.0 : 1.0, bxt_dl_dtype(dt), &bits);
      o->i[o->ni++] = (int64_t)bits;
    }
  }
  for (int w = 0; w < BX_ACC_WORDS && o->ni < OUT_MAX; w += 7) o->i[o->ni++] = ((int64_t *)&sq)[w];
}

/* A one-rank communicator whose callback records the MXCSR it runs in. */
static bxt_fpword callback_csr;
static int record_csr_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx) {
  (void)buf, (void)n, (void)op, (void)ctx;
  callback_csr = csr_get() & ~CSR_FLAGS;
  return 0;
}

static void sc_comm(void *vc, outs *o) {
  data *d = vc;
  bx_comm comm = BX_COMM_DEFAULT;
  comm.allreduce_i64 = record_csr_allreduce;
  comm.ctx = NULL;
  comm.rank = 0;
  callback_csr = ~0ull;
  o->i[o->ni++] = bx_total_norm(d->groups, 2, &comm, NULL, &o->d[0], &o->d[1]);
  o->nd = 3;
  o->csr_in_callback = callback_csr;
}

/* ---- the driver -------------------------------------------------------- */

static int outs_equal(const outs *a, const outs *b) {
  return a->nd == b->nd && a->ni == b->ni &&
         memcmp(a->d, b->d, (size_t)a->nd * sizeof(double)) == 0 &&
         memcmp(a->i, b->i, (size_t)a->ni * sizeof(int64_t)) == 0;
}

/* fn in the default environment, then in every hostile one: the same
 * outputs, the caller's word back unchanged. */
static void check_envs(const char *what, scenario_fn fn, void *ctx, void (*reset)(void *)) {
  outs want, got;
  memset(&want, 0, sizeof want);
  bxt_fpword before, after;
  if (reset) reset(ctx);
  run_in(CSR_DEFAULT, fn, ctx, &want, &before, &after);
  CHECK(after == before, "%s: default " BXT_FPW_NAME " 0x%llx came back as 0x%llx", what, before, after);
  for (size_t e = 0; e < NENVS && bxt_failures() < 10; e++) {
    memset(&got, 0, sizeof got);
    if (reset) reset(ctx);
    run_in(ENVS[e].csr, fn, ctx, &got, &before, &after);
    CHECK(after == before, "%s under %s: the caller's " BXT_FPW_NAME " 0x%llx came back as 0x%llx", what,
          ENVS[e].name, before, after);
    CHECK(outs_equal(&got, &want), "%s under %s: outputs differ from the default environment", what,
          ENVS[e].name);
    for (int k = 0; k < got.nd && k < want.nd; k++)
      if (memcmp(&got.d[k], &want.d[k], 8) != 0) {
        CHECK(0, "%s under %s: output %d is %a, default %a", what, ENVS[e].name, k, got.d[k],
              want.d[k]);
        break;
      }
  }
}

/* The scaled tensors' bytes, compared across environments by checksum
 * into the outputs (memcmp of whole tensors below). */
typedef struct scale_cmp {
  scale_ctx *s;
  scenario_fn inner;
  void *inner_ctx;
} scale_cmp;

static void sc_scaled_bytes(void *vc, outs *o) {
  scale_cmp *c = vc;
  c->inner(c->inner_ctx, o);
  /* a 64-bit FNV-1a of every scaled byte (integer arithmetic only) */
  for (int k = 0; k < 4; k++) {
    const unsigned char *b = c->s->y[k].buf;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < c->s->y[k].n * bxt_dt_size(k); i++) h = (h ^ b[i]) * 1099511628211ull;
    o->i[o->ni++] = (int64_t)h;
  }
}

static void scale_cmp_reset(void *vc) {
  scale_cmp *c = vc;
  for (int k = 0; k < 4; k++)
    memcpy(c->s->y[k].buf, c->s->d->x[k].buf, c->s->d->x[k].n * bxt_dt_size(k));
}

void test_fpenv_public_api(void) {
  data d;
  data_make(&d, (size_t)1 << 17);
  static const double ps[] = {2.0, 1.0, INFINITY, -INFINITY, 0.0, 3.0, 0.5};
  static const int threads[] = {1, 2, 4};
  for (int isa = 0; isa < bxt_isa_count() && bxt_failures() < 10; isa++) {
    if (!CHECK(bxt_force(isa), "cannot force %s", bxt_isa(isa))) continue;
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
      char what[160];
      for (size_t pi = 0; pi <= sizeof ps / sizeof ps[0]; pi++) {
        norm_ctx c = {&d, pi < sizeof ps / sizeof ps[0] ? ps[pi] : 2.0,
                      pi < sizeof ps / sizeof ps[0] ? BX_EXACT : BX_MEGATRON_FP32, threads[t],
                      (bx_norm_dtype)(pi % 5), 0};
        c.small = c.p != 2 && c.p != 1 && c.p != 0 && !isinf(c.p);
        snprintf(what, sizeof what, "%s, %d threads, norm p=%g%s, norm_dtype %d", bxt_isa(isa),
                 threads[t], c.p, c.flavor == BX_MEGATRON_FP32 ? " megatron" : "", (int)c.norm_dtype);
        check_envs(what, sc_norm, &c, NULL);
      }
      for (int mode = 0; mode < 2; mode++) {
        scale_ctx s;
        s.d = &d;
        s.mode = (bx_scale_mode)mode;
        s.threads = threads[t];
        s.coef = 0x1.3456789abcdefp-3; /* products land on ties and subnormals */
        for (int k = 0; k < 4; k++) {
          bxt_tensor_clone(&s.y[k], &d.x[k]);
          s.dl[k] = s.y[k].t;
        }
        scale_cmp sc = {&s, sc_scale, &s};
        snprintf(what, sizeof what, "%s, %d threads, bx_scale mode %d", bxt_isa(isa), threads[t], mode);
        check_envs(what, sc_scaled_bytes, &sc, scale_cmp_reset);
        for (int f = 0; f < 2; f++) {
          clip_ctx cc = {&s, (bx_coef_formula)f, 1e-3};
          scale_cmp sc2 = {&s, sc_clip, &cc};
          snprintf(what, sizeof what, "%s, %d threads, clip mode %d formula %d", bxt_isa(isa),
                   threads[t], mode, f);
          check_envs(what, sc_scaled_bytes, &sc2, scale_cmp_reset);
        }
        for (int k = 0; k < 4; k++) bxt_tensor_free(&s.y[k]);
      }
    }
    char what[96];
    snprintf(what, sizeof what, "%s, accumulator calls", bxt_isa(isa));
    check_envs(what, sc_acc, &d, NULL);
  }
  bxt_force(-1);
  data_free(&d);
}

/* The communicator's callback runs in the caller's environment (its
 * control word; the library's own inside the call otherwise). */
void test_fpenv_callback_sees_caller(void) {
  data d;
  data_make(&d, 4096);
  for (size_t e = 0; e < NENVS; e++) {
    outs o;
    memset(&o, 0, sizeof o);
    bxt_fpword before, after;
    run_in(ENVS[e].csr, sc_comm, &d, &o, &before, &after);
    CHECK(o.i[0] == BX_OK, "%s: status %lld", ENVS[e].name, (long long)o.i[0]);
    CHECK(o.csr_in_callback == (before & ~CSR_FLAGS),
          "%s: the callback ran with " BXT_FPW_NAME " 0x%llx, the caller's is 0x%llx", ENVS[e].name,
          o.csr_in_callback, before & ~CSR_FLAGS);
    CHECK(after == before, "%s: " BXT_FPW_NAME " 0x%llx came back as 0x%llx", ENVS[e].name, before,
          after);
  }
  data_free(&d);
}

/* The case of the report: 2^22 fp32 elements of 1e-40 (subnormal) under
 * DAZ|FTZ: p = 0 counted 0 with 1 thread and 2.36e6 with 2 (correct:
 * 4194304); p = inf read them as 0. */
typedef struct tiny_ctx {
  bx_group *g;
  double p;
  int threads;
} tiny_ctx;

static void sc_tiny(void *vc, outs *o) {
  tiny_ctx *c = vc;
  bx_norm_opts opts = BX_NORM_OPTS_DEFAULT;
  opts.norm_type = c->p;
  opts.num_threads = c->threads;
  o->i[o->ni++] = bx_total_norm(c->g, 1, NULL, &opts, &o->d[0], NULL);
  o->nd = 1;
}

void test_fpenv_subnormal_counts(void) {
  bxt_tensor x;
  size_t n = (size_t)1 << 22;
  bxt_tensor_alloc(&x, REF_F32, n);
  for (size_t i = 0; i < n; i++) bxt_set(&x, i, 1e-40);
  bx_group g = {&x.t, 1};
  float tiny = 1e-40f;
  const double want[3] = {(double)n, (double)tiny, (double)tiny}; /* p = 0, inf, -inf */
  const double ps[3] = {0.0, INFINITY, -INFINITY};
  for (int k = 0; k < 3; k++)
    for (int t = 1; t <= 4; t *= 2) {
      tiny_ctx c = {&g, ps[k], t};
      outs o;
      memset(&o, 0, sizeof o);
      bxt_fpword before, after;
      run_in(CSR_DEFAULT | CSR_FLUSH, sc_tiny, &c, &o, &before, &after);
      CHECK(o.i[0] == BX_OK, "p=%g, %d threads: status %lld", ps[k], t, (long long)o.i[0]);
      CHECK_BITS_D(o.d[0], want[k], "p=%g, %d threads, flush to zero: 2^22 elements of 1e-40", ps[k], t);
      CHECK(after == before, "p=%g, %d threads: " BXT_FPW_NAME " 0x%llx came back as 0x%llx", ps[k], t, before,
            after);
    }
  bxt_tensor_free(&x);
}

#else /* fpword.h knows no control word of this architecture */

void test_fpenv_public_api(void) { bxt_skip("fpword.h: no control word of this architecture"); }
void test_fpenv_callback_sees_caller(void) { bxt_skip("fpword.h: no control word of this architecture"); }
void test_fpenv_subnormal_counts(void) { bxt_skip("fpword.h: no control word of this architecture"); }

#endif
