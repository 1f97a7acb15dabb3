/*
 * fixed_bits.c — the result bits of every public numerical call on one
 * fixed data set, one line per result, for comparing builds byte for byte
 * (x86-64 with each kernel table, aarch64 under qemu or natively):
 *
 *   fixed_bits > out.txt        (exit status non-zero if a call failed or
 *                                a result changed with the thread count)
 *
 * Public API only (bitexact.h, bitexact_train.h; the layer kernels' part
 * is in fixed_bits_moe.h, fixed_bits_layers.h and fixed_bits_nan.h,
 * included below). The
 * data come from a counter-based generator of its own (splitmix64 of
 * (seed, tensor, index)) that builds each element from integer bit fields
 * — no rand(), no libm, no floating-point arithmetic — so the data are
 * the same bits on every platform: fp64/fp32/bf16/fp16 with signed zeros,
 * subnormals, values near the top of each format and gradient-like
 * values; and NaN-producing data (fixed_bits_nan.h: NaN payloads of both
 * signs, Inf - Inf, 0 * Inf), whose NaNs are the same bytes everywhere
 * only because the library stores one canonical NaN. The output holds no
 * addresses, times or ISA names: two correct builds print the same bytes.
 * Options are always made with the BX_*_OPTS_DEFAULT macros and then set
 * field by field, so new option fields do not break this file.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <bitexact.h>
#include <bitexact_train.h>

#include "../dl_view.h" /* public API only */

/* ---- the generator and the data --------------------------------------- */

static uint64_t fb_hash(uint64_t seed, uint64_t index) {
  uint64_t z = seed ^ (index * 0xD1B54A32D192ED03ull);
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

enum { FB_F16, FB_BF16, FB_F32, FB_F64, FB_NDT };
static const char *const FB_DT_NAME[FB_NDT] = {"f16", "bf16", "f32", "f64"};
static const int FB_EBITS[FB_NDT] = {5, 8, 8, 11};
static const int FB_MBITS[FB_NDT] = {10, 7, 23, 52};
static const size_t FB_SIZE[FB_NDT] = {2, 2, 4, 8};

/* How a tensor's elements are drawn: per 256, how many are zeros,
 * subnormals, huge (exponent field in [huge_lo, huge_hi]); the rest are
 * normal with exponent field in [norm_lo, norm_hi] (both clamped to the
 * format's finite range). */
typedef struct fb_mix {
  unsigned zeros, subnormals, huge;
  int norm_lo, norm_hi; /* unbiased exponents */
  int huge_lo, huge_hi; /* unbiased exponents */
} fb_mix;

typedef struct fb_tensor {
  const char *name;
  int dt;
  size_t n;
  fb_mix mix;
  void *buf, *orig; /* data, and a pristine copy for re-scaling */
  int64_t shape[1];
  DLTensor t;
} fb_tensor;

static uint64_t fb_element_bits(int dt, const fb_mix *m, uint64_t seed, uint64_t i) {
  uint64_t h = fb_hash(seed, i), g = fb_hash(seed ^ 0x5bd1e995u, i);
  int eb = FB_EBITS[dt], mb = FB_MBITS[dt];
  int bias = (1 << (eb - 1)) - 1, emax_field = (1 << eb) - 2; /* largest finite field */
  uint64_t sign = (h >> 63) & 1, frac = g & ((1ull << mb) - 1);
  unsigned cls = (unsigned)(h & 255);
  int64_t field;
  if (cls < m->zeros) {
    field = 0;
    frac = 0;
  } else if (cls < m->zeros + m->subnormals) {
    field = 0;
    if (frac == 0) frac = 1;
  } else {
    int lo, hi;
    if (cls < m->zeros + m->subnormals + m->huge)
      lo = m->huge_lo, hi = m->huge_hi;
    else
      lo = m->norm_lo, hi = m->norm_hi;
    uint64_t span = (uint64_t)(hi - lo + 1);
    field = (int64_t)lo + (int64_t)((h >> 8) % span) + bias;
    if (field < 1) field = 1;
    if (field > emax_field) field = emax_field;
  }
  return (sign << (eb + mb)) | ((uint64_t)field << mb) | frac;
}

static void fb_store(void *buf, int dt, size_t i, uint64_t bits) {
  switch (FB_SIZE[dt]) {
    case 2: {
      uint16_t v = (uint16_t)bits;
      memcpy((char *)buf + 2 * i, &v, 2);
      break;
    }
    case 4: {
      uint32_t v = (uint32_t)bits;
      memcpy((char *)buf + 4 * i, &v, 4);
      break;
    }
    default: memcpy((char *)buf + 8 * i, &bits, 8); break;
  }
}

static int fb_make(fb_tensor *x, uint64_t seed, int first_is_neg_max) {
  size_t bytes = x->n * FB_SIZE[x->dt];
  x->buf = malloc(bytes ? bytes : 1);
  x->orig = malloc(bytes ? bytes : 1);
  if (!x->buf || !x->orig) return 0;
  for (size_t i = 0; i < x->n; i++) fb_store(x->buf, x->dt, i, fb_element_bits(x->dt, &x->mix, seed, i));
  if (first_is_neg_max && x->n) { /* -(largest finite) of the format */
    int eb = FB_EBITS[x->dt], mb = FB_MBITS[x->dt];
    fb_store(x->buf, x->dt, 0, (1ull << (eb + mb)) | ((((1ull << eb) - 2) << mb) | ((1ull << mb) - 1)));
  }
  memcpy(x->orig, x->buf, bytes);
  static const DLDataType dts[FB_NDT] = {{kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 32, 1},
                                         {kDLFloat, 64, 1}};
  x->shape[0] = (int64_t)x->n;
  memset(&x->t, 0, sizeof x->t);
  x->t.data = x->buf;
  x->t.device.device_type = kDLCPU;
  x->t.device.device_id = 0;
  x->t.ndim = 1;
  x->t.dtype = dts[x->dt];
  x->t.shape = x->shape;
  x->t.strides = NULL;
  x->t.byte_offset = 0;
  return 1;
}

static void fb_reset(fb_tensor *x) { memcpy(x->buf, x->orig, x->n * FB_SIZE[x->dt]); }

/* 64-bit FNV-1a over bytes: integer arithmetic only. */
static uint64_t fb_fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
#define FB_FNV_INIT 1469598103934665603ull

/* ---- output ------------------------------------------------------------ */

static int g_errors;

static uint64_t fb_dbits(double v) {
  uint64_t b;
  memcpy(&b, &v, 8);
  return b;
}

static void out_d(const char *what, double v) {
  printf("%s 0x%016" PRIx64 " %a\n", what, fb_dbits(v), v);
}

static void out_f(const char *what, float v) {
  uint32_t b;
  memcpy(&b, &v, 4);
  printf("%s 0x%08" PRIx32 " %a\n", what, b, (double)v);
}

static void out_status(const char *what, bx_status st) {
  printf("%s status %d %s\n", what, (int)st, bx_status_str(st));
}

static int expect_ok(const char *what, bx_status st) {
  if (st == BX_OK) return 1;
  fprintf(stderr, "fixed_bits: %s: %s: %s\n", what, bx_status_str(st), bx_last_error());
  out_status(what, st);
  g_errors++;
  return 0;
}

/* ---- the data set ------------------------------------------------------ */

#define NT 13
static fb_tensor T[NT] = {
    /* gradient-like with a sprinkle of everything */
    {"f32.a", FB_F32, 20011, {4, 4, 1, -30, 3, 60, 100}, 0, 0, {0}, {0}},
    {"bf16.a", FB_BF16, 16001, {4, 4, 1, -30, 3, 60, 100}, 0, 0, {0}, {0}},
    {"f16.a", FB_F16, 12007, {4, 4, 2, -14, 3, 13, 15}, 0, 0, {0}, {0}},
    {"f64.a", FB_F64, 9001, {4, 4, 1, -30, 3, 400, 500}, 0, 0, {0}, {0}},
    /* subnormal-heavy */
    {"f32.sub", FB_F32, 5003, {16, 160, 0, -140, -110, 0, 0}, 0, 0, {0}, {0}},
    {"f16.sub", FB_F16, 3001, {16, 160, 0, -14, -10, 0, 0}, 0, 0, {0}, {0}},
    {"f64.sub", FB_F64, 2003, {16, 160, 0, -1060, -1000, 0, 0}, 0, 0, {0}, {0}},
    /* wide exponents, huge values near each format's top */
    {"bf16.wide", FB_BF16, 8009, {8, 8, 24, -126, 127, 120, 127}, 0, 0, {0}, {0}},
    {"f32.wide", FB_F32, 7001, {8, 8, 24, -126, 127, 120, 127}, 0, 0, {0}, {0}},
    {"f16.huge", FB_F16, 1009, {8, 8, 128, -14, 15, 14, 15}, 0, 0, {0}, {0}},
    /* fp64 at the top: element 0 is set to -DBL_MAX (main), the rest so
     * small beside it that the norm still rounds to DBL_MAX */
    {"f64.huge", FB_F64, 8, {0, 0, 0, 960, 995, 0, 0}, 0, 0, {0}, {0}},
    /* large: cut into several pieces, so that threads split one tensor */
    {"bf16.big", FB_BF16, 600011, {2, 2, 0, -20, 2, 0, 0}, 0, 0, {0}, {0}},
    {"f32.big", FB_F32, 300007, {2, 2, 0, -20, 2, 0, 0}, 0, 0, {0}, {0}},
};

/* groups: tensor indices (-1 ends); group 3 is empty. The last group
 * (the large tensors) is left out for other p, whose power function is
 * slow under an emulator. */
#define NG 6
#define NG_POW 5
static const int GROUP_MEMBERS[NG][5] = {
    {0, 1, -1}, {2, 3, -1}, {4, 5, 6, -1}, {-1}, {7, 8, 9, 10, -1}, {11, 12, -1},
};
static DLTensor GROUP_DL[NG][4];
static bx_group G[NG];

static void fb_groups(void) {
  for (int g = 0; g < NG; g++) {
    size_t c = 0;
    for (int k = 0; GROUP_MEMBERS[g][k] >= 0; k++) GROUP_DL[g][c++] = T[GROUP_MEMBERS[g][k]].t;
    G[g].tensors = GROUP_DL[g];
    G[g].count = c;
  }
}

static void fb_reset_all(void) {
  for (int i = 0; i < NT; i++) fb_reset(&T[i]);
}

static uint64_t fb_hash_group(int g) {
  uint64_t h = FB_FNV_INIT;
  for (int k = 0; GROUP_MEMBERS[g][k] >= 0; k++) {
    const fb_tensor *x = &T[GROUP_MEMBERS[g][k]];
    h = fb_fnv(h, x->buf, x->n * FB_SIZE[x->dt]);
  }
  return h;
}

static const int THREADS[] = {1, 2, 5};
#define NTHREADS (sizeof THREADS / sizeof THREADS[0])
static const char *const NORM_DT_NAME[5] = {"f64", "grads", "f32", "bf16", "f16"};

/* results of the first thread count, to check the others against */
#define MAXR 64
typedef struct fb_results {
  uint64_t w[MAXR];
  int n;
} fb_results;

static void fb_same(const char *what, const fb_results *ref, const fb_results *got, int threads) {
  if (ref->n != got->n || memcmp(ref->w, got->w, (size_t)ref->n * sizeof ref->w[0]) != 0) {
    printf("MISMATCH %s: %d threads differ from %d\n", what, threads, THREADS[0]);
    g_errors++;
  }
}

/* ---- bx_total_norm ---------------------------------------------------- */

static void fb_norms(void) {
  static const double ps[] = {2.0, 1.0, 0.0, INFINITY, -INFINITY, 3.0, 0.5};
  static const char *const pn[] = {"2", "1", "0", "inf", "-inf", "3", "0.5"};
  for (size_t pi = 0; pi <= sizeof ps / sizeof ps[0]; pi++) {
    int megatron = pi == sizeof ps / sizeof ps[0];
    int other_p = !megatron && pi >= 5; /* 3, 0.5 */
    size_t ngroups = other_p ? NG_POW : NG;
    for (int nd = 0; nd < 5; nd++) {
      fb_results ref = {{0}, 0};
      /* every thread count for the fp64 norm; the other formats on 1 */
      for (size_t ti = 0; ti < (nd == 0 ? NTHREADS : 1); ti++) {
        bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
        o.norm_type = megatron ? 2.0 : ps[pi];
        o.flavor = megatron ? BX_MEGATRON_FP32 : BX_EXACT;
        o.norm_dtype = (bx_norm_dtype)nd;
        o.num_threads = THREADS[ti];
        double total = 0, gn[NG];
        char what[160];
        snprintf(what, sizeof what, "norm p=%s flavor=%s norm_dtype=%s", megatron ? "2" : pn[pi],
                 megatron ? "megatron_fp32" : "exact", NORM_DT_NAME[nd]);
        fb_results got = {{0}, 0};
        bx_status st = bx_total_norm(G, ngroups, NULL, &o, &total, gn);
        if (!expect_ok(what, st)) continue;
        got.w[got.n++] = fb_dbits(total);
        for (size_t g = 0; g < ngroups; g++) got.w[got.n++] = fb_dbits(gn[g]);
        if (ti == 0) {
          ref = got;
          char line[200];
          snprintf(line, sizeof line, "%s total", what);
          out_d(line, total);
          for (size_t g = 0; g < ngroups; g++) {
            snprintf(line, sizeof line, "%s group%zu", what, g);
            out_d(line, gn[g]);
          }
        } else {
          fb_same(what, &ref, &got, THREADS[ti]);
        }
      }
    }
  }
}

/* Non-finite elements: one Inf (then one NaN) added to group 0, every p. */
static void fb_nonfinite(void) {
  static const double ps[] = {2.0, 1.0, 0.0, INFINITY, -INFINITY, 3.0};
  static const char *const pn[] = {"2", "1", "0", "inf", "-inf", "3"};
  float special[2][3] = {{1.5f, 0, -2.0f}, {1.5f, 0, -2.0f}};
  uint32_t inf = 0xFF800000u, nan = 0x7FC00000u; /* -Inf, a quiet NaN */
  memcpy(&special[0][1], &inf, 4);
  memcpy(&special[1][1], &nan, 4);
  for (int k = 0; k < 2; k++) {
    int64_t shape[1] = {3};
    DLTensor dl[3] = {T[0].t, T[2].t, T[0].t};
    dl[2].data = special[k];
    dl[2].shape = shape;
    bx_group g[2] = {{dl, 3}, {dl + 1, 1}};
    for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
      bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
      o.norm_type = ps[pi];
      double total = 0, gn[2];
      char what[160];
      snprintf(what, sizeof what, "nonfinite %s p=%s", k ? "nan" : "inf", pn[pi]);
      if (!expect_ok(what, bx_total_norm(g, 2, NULL, &o, &total, gn))) continue;
      char line[200];
      snprintf(line, sizeof line, "%s total", what);
      out_d(line, total);
      snprintf(line, sizeof line, "%s group0", what);
      out_d(line, gn[0]);
      /* error_if_nonfinite: BX_ENONFINITE exactly when the total is NaN/Inf */
      o.error_if_nonfinite = 1;
      total = 0;
      snprintf(line, sizeof line, "%s error_if_nonfinite", what);
      out_status(line, bx_total_norm(g, 2, NULL, &o, &total, gn));
    }
    /* the clip: a NaN/Inf total gives a NaN or 0 coefficient, as torch */
    bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
    double coef = -1;
    char what[96];
    snprintf(what, sizeof what, "nonfinite %s clip_coef", k ? "nan" : "inf");
    if (expect_ok(what, bx_clip_coef(k ? NAN : INFINITY, 1.0, &co, &coef))) out_d(what, coef);
  }
}

/* ---- bx_clip_grad_norm ------------------------------------------------ */

static void fb_clip(void) {
  static const double max_norms[] = {0.25, 1e30, 0.0};
  for (int mode = 0; mode < 2; mode++)
    for (int f = 0; f < 2; f++)
      for (size_t mi = 0; mi < sizeof max_norms / sizeof max_norms[0]; mi++)
        for (int variant = 0; variant < 2; variant++) {
          fb_results ref = {{0}, 0};
          for (size_t ti = 0; ti < NTHREADS; ti++) {
            fb_reset_all();
            bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
            co.scale.mode = mode ? BX_SCALE_EXACT : BX_SCALE_TORCH;
            co.formula = f ? BX_COEF_MAX : BX_COEF_TORCH;
            co.norm.num_threads = THREADS[ti];
            co.scale.num_threads = THREADS[ti];
            if (variant == 1) { /* the Megatron flavour, the norm in the grads' dtype */
              co.norm.flavor = BX_MEGATRON_FP32;
              co.norm.norm_dtype = BX_NORM_GRADS;
            }
            double total = 0, coef = 0;
            char what[160];
            snprintf(what, sizeof what, "clip mode=%s formula=%s max_norm=%a norm=%s", mode ? "exact" : "torch",
                     f ? "max" : "torch", max_norms[mi], variant ? "megatron_fp32/grads" : "exact/f64");
            if (!expect_ok(what, bx_clip_grad_norm(G, NG, NULL, max_norms[mi], &co, &total, &coef))) continue;
            fb_results got = {{0}, 0};
            got.w[got.n++] = fb_dbits(total);
            got.w[got.n++] = fb_dbits(coef);
            for (int g = 0; g < NG; g++) got.w[got.n++] = fb_hash_group(g);
            if (ti == 0) {
              ref = got;
              char line[220];
              snprintf(line, sizeof line, "%s total", what);
              out_d(line, total);
              snprintf(line, sizeof line, "%s coef", what);
              out_d(line, coef);
              for (int g = 0; g < NG; g++)
                printf("%s group%d fnv1a 0x%016" PRIx64 "\n", what, g, got.w[2 + g]);
            } else {
              fb_same(what, &ref, &got, THREADS[ti]);
            }
          }
        }
  fb_reset_all();
}

/* ---- bx_scale --------------------------------------------------------- */

static void fb_scale(void) {
  /* ties and subnormal products, an exact power of two, overflow of the
   * 16-bit formats, underflow, a negative coefficient, zero */
  static const double coefs[] = {0x1.3456789abcdefp-3, 0.5, 3.0, 0x1p+20, 0x1p-30, -0x1.8000000000001p+0, 0.0};
  for (int mode = 0; mode < 2; mode++)
    for (size_t ci = 0; ci < sizeof coefs / sizeof coefs[0]; ci++) {
      fb_results ref = {{0}, 0};
      for (size_t ti = 0; ti < NTHREADS; ti++) {
        fb_reset_all();
        DLTensor all[NT];
        for (int i = 0; i < NT; i++) all[i] = T[i].t;
        bx_scale_opts so = BX_SCALE_OPTS_DEFAULT;
        so.mode = mode ? BX_SCALE_EXACT : BX_SCALE_TORCH;
        so.num_threads = THREADS[ti];
        char what[128];
        snprintf(what, sizeof what, "scale mode=%s coef=%a", mode ? "exact" : "torch", coefs[ci]);
        if (!expect_ok(what, bx_scale(all, NT, coefs[ci], &so))) continue;
        fb_results got = {{0}, 0};
        for (int i = 0; i < NT; i++) got.w[got.n++] = fb_fnv(FB_FNV_INIT, T[i].buf, T[i].n * FB_SIZE[T[i].dt]);
        if (ti == 0) {
          ref = got;
          for (int i = 0; i < NT; i++) printf("%s %s fnv1a 0x%016" PRIx64 "\n", what, T[i].name, got.w[i]);
        } else {
          fb_same(what, &ref, &got, THREADS[ti]);
        }
      }
    }
  fb_reset_all();
}

/* ---- the accumulator calls -------------------------------------------- */

static void out_acc(const char *what, const bx_acc *a, int squares) {
  char line[160];
  snprintf(line, sizeof line, "%s value", what);
  out_d(line, bx_acc_value(a));
  snprintf(line, sizeof line, "%s valuef", what);
  out_f(line, bx_acc_valuef(a));
  snprintf(line, sizeof line, "%s sqrt", what);
  out_d(line, bx_acc_sqrt(a));
  snprintf(line, sizeof line, "%s sqrtf", what);
  out_f(line, bx_acc_sqrtf(a));
  static const DLDataType dts[4] = {{kDLFloat, 64, 1}, {kDLFloat, 32, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 16, 1}};
  static const char *const dn[4] = {"f64", "f32", "bf16", "f16"};
  for (int k = 0; k < 4; k++) {
    unsigned char out[8] = {0};
    snprintf(line, sizeof line, "%s acc_norm p=%d %s", what, squares ? 2 : 1, dn[k]);
    if (!expect_ok(line, bx_acc_norm(a, squares ? 2.0 : 1.0, dts[k], out))) continue;
    uint64_t bits = 0;
    size_t bytes = dts[k].bits / 8u;
    for (size_t b = 0; b < bytes; b++) bits |= (uint64_t)out[b] << (8 * b); /* little-endian store */
    printf("%s 0x%0*" PRIx64 "\n", line, (int)(2 * bytes), bits);
  }
  /* the words are the wire format: the same on every platform */
  printf("%s words fnv1a 0x%016" PRIx64 " count %" PRId64 " nan %" PRId64 " inf %" PRId64 "\n", what,
         fb_fnv(FB_FNV_INIT, a, sizeof *a), a->count, a->nan_count, a->inf_count);
}

static void fb_accs(void) {
  for (int squares = 1; squares >= 0; squares--) {
    bx_acc each[NT], fwd, bwd;
    bx_acc_init(&fwd);
    bx_acc_init(&bwd);
    const char *op = squares ? "acc squares" : "acc abs";
    for (int i = 0; i < NT; i++) {
      bx_acc_init(&each[i]);
      char what[96];
      snprintf(what, sizeof what, "%s %s", op, T[i].name);
      bx_status st = squares ? bx_acc_add_squares(&each[i], &T[i].t) : bx_acc_add_abs(&each[i], &T[i].t);
      if (!expect_ok(what, st)) continue;
      out_acc(what, &each[i], squares);
    }
    for (int i = 0; i < NT; i++) bx_acc_merge(&fwd, &each[i]);
    for (int i = NT - 1; i >= 0; i--) bx_acc_merge(&bwd, &each[i]);
    char what[96];
    snprintf(what, sizeof what, "%s merged", op);
    out_acc(what, &fwd, squares);
    printf("%s merge order: %s\n", op, memcmp(&fwd, &bwd, sizeof fwd) == 0 ? "same words" : "DIFFERENT words");
    if (memcmp(&fwd, &bwd, sizeof fwd) != 0) g_errors++;
  }
}

/* ---- the training kernels (bitexact_train.h) ------------------------------ */

/* fp32 values of both signs in [2^-8, 2^8) (lo_exp..hi_exp binades), from
 * integer bit fields only */
static void fb_f32_fill(float *x, size_t n, uint64_t seed, int lo_exp, int nbinades) {
  for (size_t i = 0; i < n; i++) {
    uint64_t h = fb_hash(seed, i);
    uint32_t e = (uint32_t)(127 + lo_exp + (int)(h % (uint64_t)nbinades));
    uint32_t bits = (uint32_t)((h >> 32) & 0x80000000u) | (e << 23) | (uint32_t)((h >> 8) & 0x7fffffu);
    memcpy(&x[i], &bits, 4);
  }
}

static void out_hash(const char *what, const void *p, size_t bytes) {
  printf("%s fnv1a 0x%016" PRIx64 "\n", what, fb_fnv(FB_FNV_INIT, p, bytes));
}

static void fb_train(void) {
  enum { M = 33, K = 40, N = 24, NE = 1000, NP = 257, TE = 64, TC = 5 };
  static float a[M * K], bt[N * K], bn[N * K], c[M * K], c3[M * K];
  fb_f32_fill(a, M * K, 0x6a01, -8, 16);
  fb_f32_fill(bt, N * K, 0x6a02, -8, 16);
  fb_f32_fill(bn, N * K, 0x6a03, -8, 16);
  /* GEMM: NT (the forward, B as [N,K]) and NN (the input gradient, B as
   * [K,N] with K = 24 here), 1 and 3 threads */
  for (int layout = 0; layout < 2; layout++) {
    int64_t sa[2] = {M, layout == 0 ? K : N}, sb[2] = {layout == 0 ? N : N, layout == 0 ? K : K},
            sc[2] = {M, layout == 0 ? N : K};
    DLTensor ta = bxt_f32_view(a, 2, sa), tb = bxt_f32_view(layout == 0 ? bt : bn, 2, sb);
    DLTensor tc = bxt_f32_view(c, 2, sc), tc3 = bxt_f32_view(c3, 2, sc);
    bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
    o.num_threads = 1;
    const char *name = layout == 0 ? "gemm NT 33x40 . (24x40)^T" : "gemm NN 33x24 . 24x40";
    bx_gemm_layout l = layout == 0 ? BX_GEMM_NT : BX_GEMM_NN;
    if (!expect_ok(name, bx_gemm(&ta, &tb, l, &tc, &o))) continue;
    o.num_threads = 3;
    if (!expect_ok(name, bx_gemm(&ta, &tb, l, &tc3, &o))) continue;
    size_t bytes = (size_t)sc[0] * (size_t)sc[1] * 4;
    out_hash(name, c, bytes);
    if (memcmp(c, c3, bytes) != 0) {
      printf("%s: 1 and 3 threads DIFFER\n", name);
      g_errors++;
    }
  }
  /* GEMM TN (the weight gradient dYᵀ X: dY = a as [33 tokens, 40], X = bt
   * as [33, 24]), 1 and 3 threads; and bx_linear_wgrad over chunks of 8
   * tokens with the a-priori bound (weight [40,24] and bias [40]) */
  {
    int64_t sa[2] = {M, K}, sb[2] = {M, N}, sc[2] = {K, N};
    DLTensor ta = bxt_f32_view(a, 2, sa), tb = bxt_f32_view(bt, 2, sb);
    DLTensor tc = bxt_f32_view(c, 2, sc), tc3 = bxt_f32_view(c3, 2, sc);
    bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
    o.num_threads = 1;
    const char *name = "gemm TN (33x40)^T . 33x24";
    if (expect_ok(name, bx_gemm(&ta, &tb, BX_GEMM_TN, &tc, &o))) {
      o.num_threads = 3;
      if (expect_ok(name, bx_gemm(&ta, &tb, BX_GEMM_TN, &tc3, &o))) {
        out_hash(name, c, (size_t)K * N * 4);
        if (memcmp(c, c3, (size_t)K * N * 4) != 0) {
          printf("%s: 1 and 3 threads DIFFER\n", name);
          g_errors++;
        }
      }
    }
    int64_t sw[2] = {K, N}, sbias[1] = {K};
    static float wout[K * N], bout[K];
    DLTensor grads[2] = {bxt_f32_view(NULL, 2, sw), bxt_f32_view(NULL, 1, sbias)};
    DLTensor outs[2] = {bxt_f32_view(wout, 2, sw), bxt_f32_view(bout, 1, sbias)};
    bx_tokred *s = NULL;
    if (expect_ok("wgrad create", bx_tokred_create(grads, 2, 8, M, NULL, &s)) &&
        expect_ok("wgrad bound", bx_linear_wgrad_bound(s, 0, 1, &ta, &tb, 0, NULL)) &&
        expect_ok("wgrad agree", bx_tokred_agree(s, NULL)) &&
        expect_ok("wgrad", bx_linear_wgrad(s, 0, 1, &ta, &tb, 0, NULL)) &&
        expect_ok("wgrad finish", bx_tokred_finish(s, outs, 2, 1))) {
      out_hash("linear wgrad 33 tokens, chunks of 8: weight", wout, sizeof wout);
      out_hash("linear wgrad 33 tokens, chunks of 8: bias", bout, sizeof bout);
    }
    bx_tokred_destroy(s);
  }
  /* elementwise math */
  static float x[NE], y[NE];
  int64_t se[1] = {NE};
  DLTensor tx = bxt_f32_view(x, 1, se), ty = bxt_f32_view(y, 1, se);
  typedef bx_status (*fn_t)(const DLTensor *, DLTensor *, const bx_math_opts *);
  static const fn_t fns[] = {bx_exp, bx_log, bx_sigmoid, bx_silu, bx_rsqrt, bx_sin, bx_cos};
  static const char *const names[] = {"exp", "log", "sigmoid", "silu", "rsqrt", "sin", "cos"};
  for (int f = 0; f < 7; f++) {
    fb_f32_fill(x, NE, 0x6b00 + (uint64_t)f, -8, 13);
    if (f == 1 || f == 4)
      for (int i = 0; i < NE; i++) x[i] = fabsf(x[i]);
    char what[64];
    snprintf(what, sizeof what, "math %s x%d", names[f], NE);
    if (expect_ok(what, fns[f](&tx, &ty, NULL))) out_hash(what, y, sizeof y);
  }
  /* AdamW: three steps with torch's defaults and weight decay */
  static float pp[NP], g[NP], m[NP], v[NP];
  fb_f32_fill(pp, NP, 0x6c01, -6, 6);
  memset(m, 0, sizeof m);
  memset(v, 0, sizeof v);
  int64_t sp[1] = {NP};
  DLTensor tp = bxt_f32_view(pp, 1, sp), tg = bxt_f32_view(g, 1, sp), tm = bxt_f32_view(m, 1, sp),
           tv = bxt_f32_view(v, 1, sp);
  bx_adamw_opts ao = BX_ADAMW_OPTS_DEFAULT;
  ao.lr = 1e-2;
  ao.weight_decay = 0.1;
  int ok = 1;
  for (int64_t step = 1; step <= 3 && ok; step++) {
    fb_f32_fill(g, NP, 0x6c10 + (uint64_t)step, -10, 8);
    ok = expect_ok("adamw", bx_adamw_step(&tp, &tg, &tm, &tv, step, &ao));
  }
  if (ok) {
    out_hash("adamw 3 steps param", pp, sizeof pp);
    out_hash("adamw 3 steps exp_avg", m, sizeof m);
    out_hash("adamw 3 steps exp_avg_sq", v, sizeof v);
  }
  /* the token reduction: 5 chunks of 4 tokens (the last one whole), one
   * tensor of 8x8, sum and token mean */
  static float part[TC][TE], sum[TE], mean[TE];
  int64_t st8[2] = {8, 8};
  DLTensor tgrad = bxt_f32_view(NULL, 2, st8), tsum = bxt_f32_view(sum, 2, st8),
           tmean = bxt_f32_view(mean, 2, st8);
  bx_tokred *s = NULL;
  if (!expect_ok("tokred create", bx_tokred_create(&tgrad, 1, 4, 20, NULL, &s))) return;
  ok = 1;
  for (int k = 0; k < TC && ok; k++) {
    fb_f32_fill(part[k], TE, 0x6d00 + (uint64_t)k, -12, 20);
    DLTensor tk = bxt_f32_view(part[k], 2, st8);
    ok = expect_ok("tokred bound", bx_tokred_bound(s, 0, k, &tk));
  }
  if (ok) ok = expect_ok("tokred agree", bx_tokred_agree(s, NULL));
  for (int k = TC - 1; k >= 0 && ok; k--) { /* any order: integer words */
    DLTensor tk = bxt_f32_view(part[k], 2, st8);
    ok = expect_ok("tokred add", bx_tokred_add(s, 0, k, &tk));
  }
  if (ok && expect_ok("tokred finish", bx_tokred_finish(s, &tsum, 1, 1)) &&
      expect_ok("tokred finish mean", bx_tokred_finish(s, &tmean, 1, 20))) {
    out_hash("tokred 5 chunks sum", sum, sizeof sum);
    out_hash("tokred 5 chunks mean", mean, sizeof mean);
    out_f("tokred sum[0]", sum[0]);
  }
  bx_tokred_destroy(s);
}

/* the layer kernels (bitexact_train.h's MoE and layer sections): their
 * own files, to keep this one short */
#include "fixed_bits_moe.h"
#include "fixed_bits_layers.h"
#include "fixed_bits_nan.h"

int main(void) {
  for (int i = 0; i < NT; i++)
    if (!fb_make(&T[i], 0xb17e5ac7ull + (uint64_t)i * 0x100000001b3ull, strcmp(T[i].name, "f64.huge") == 0)) {
      fprintf(stderr, "fixed_bits: out of memory\n");
      return 2;
    }
  setvbuf(stdout, NULL, _IOLBF, 0); /* progress visible under a slow emulator */
  fb_groups();
  printf("fixed_bits: bitexact %u, accumulator format %d, %d tensors in %d groups\n", bx_version(),
         BX_ACC_FORMAT, NT, NG);
  for (int i = 0; i < NT; i++)
    printf("data %s %s n=%zu fnv1a 0x%016" PRIx64 "\n", T[i].name, FB_DT_NAME[T[i].dt], T[i].n,
           fb_fnv(FB_FNV_INIT, T[i].buf, T[i].n * FB_SIZE[T[i].dt]));
  fb_norms();
  fb_nonfinite();
  fb_clip();
  fb_scale();
  fb_accs();
  fb_train();
  fb_layers();
  fb_nan();
  for (int i = 0; i < NT; i++) {
    free(T[i].buf);
    free(T[i].orig);
  }
  fprintf(stderr, "fixed_bits: kernels %s\n", bx_isa_name()); /* not in the compared output */
  printf("fixed_bits: %s\n", g_errors ? "ERRORS (see above)" : "done");
  return g_errors ? 1 : 0;
}
