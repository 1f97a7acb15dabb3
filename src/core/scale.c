/*
 * scale.c — bx_scale (multi-tensor g *= coef with a documented rounding),
 * bx_clip_coef and bx_clip_grad_norm. Every check runs before the first
 * write, so a failing call leaves all gradients as they were.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define PIECE ((size_t)1 << 16) /* elements per scaling task */

/* ---- conversions (bit-exact, no dependence on compiler half types) ---- */

static float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bf16_to_f32(uint16_t b) { return f32_from_bits((uint32_t)b << 16); }

/* fp32 -> bf16, nearest-even; every NaN -> 0x7FC0 (as c10 does). */
static uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return 0x7FC0;
  u += 0x7FFF + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  int e = (h >> 10) & 0x1F;
  uint32_t m = h & 0x3FF;
  if (e == 0x1F) return f32_from_bits(sign | 0x7F800000 | (m << 13));
  if (e == 0) { /* subnormal: m * 2^-24, exact in fp32 */
    float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((uint32_t)(e + 112) << 23) | (m << 13));
}

/* fp32 -> fp16, nearest-even, subnormals and overflow to Inf; NaN stays NaN
 * (quiet, sign kept). */
static uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t a = u & 0x7FFFFFFF;
  if (a > 0x7F800000) return sign | 0x7E00;
  if (a >= 0x477FF000) return sign | 0x7C00; /* >= 65520: rounds to Inf */
  if (a < 0x38800000) { /* below 2^-14: fp16 subnormal or zero */
    if (a < 0x33000000) return sign; /* <= 2^-25 (half the smallest): 0 */
    int e = (int)(a >> 23);             /* biased fp32 exponent, 102..112 */
    uint32_t m = (a & 0x7FFFFF) | 0x800000;
    int shift = 126 - e;                /* value = m * 2^(e-150); want units of 2^-24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return sign | (uint16_t)q;
  }
  uint32_t q = a >> 13, rem = a & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
  return sign | (uint16_t)(q - (112u << 10));
}

/* Round-to-odd of the exact product a*c into a double: correct input to a
 * second rounding at <= 51 bits (Boldo & Melquiond). Products below 2^-151
 * in magnitude are returned as is (they round to zero in every target). */
static double mul_round_odd(double a, double c) {
  double p = a * c;
  if (!isfinite(p) || fabs(p) < 0x1p-151) return p;
  double e = fma(a, c, -p); /* exact: see the exponent argument in the header */
  if (e == 0.0) return p;
  uint64_t b;
  memcpy(&b, &p, 8);
  if (b & 1) return p;
  b += ((e > 0) == (p > 0)) ? 1 : (uint64_t)-1; /* one ulp toward the true value */
  memcpy(&p, &b, 8);
  return p;
}

/* double -> float by round-to-odd (for a later rounding to bf16/fp16). */
static float f64_to_f32_odd(double d) {
  float f = (float)d;
  if (!isfinite(f) || (double)f == d) return f;
  uint32_t u = f32_bits(f);
  if (u & 1) return f;
  u += (fabs(d) > fabs((double)f)) ? 1 : (uint32_t)-1;
  return f32_from_bits(u);
}

/* ---- per-dtype kernels over one span -------------------------------- */

static void scale_f32_torch(float *x, size_t n, float c) {
  for (size_t i = 0; i < n; i++) x[i] = x[i] * c;
}
static void scale_f32_exact(float *x, size_t n, double c) {
  for (size_t i = 0; i < n; i++) x[i] = (float)mul_round_odd((double)x[i], c);
}
static void scale_f64(double *x, size_t n, double c) {
  for (size_t i = 0; i < n; i++) x[i] = x[i] * c;
}
static void scale_bf16_torch(uint16_t *x, size_t n, float c) {
  for (size_t i = 0; i < n; i++) x[i] = f32_to_bf16(bf16_to_f32(x[i]) * c);
}
static void scale_bf16_exact(uint16_t *x, size_t n, double c) {
  for (size_t i = 0; i < n; i++)
    x[i] = f32_to_bf16(f64_to_f32_odd(mul_round_odd((double)bf16_to_f32(x[i]), c)));
}
static void scale_f16_torch(uint16_t *x, size_t n, float c) {
  for (size_t i = 0; i < n; i++) x[i] = f32_to_f16(f16_to_f32(x[i]) * c);
}
static void scale_f16_exact(uint16_t *x, size_t n, double c) {
  for (size_t i = 0; i < n; i++)
    x[i] = f32_to_f16(f64_to_f32_odd(mul_round_odd((double)f16_to_f32(x[i]), c)));
}

typedef struct scale_item {
  void *data;
  size_t n;
  bx_dtype dt;
} scale_item;

typedef struct scale_job {
  const scale_item *items;
  double coef;
  bx_scale_mode mode;
} scale_job;

static void run_scale(void *ctx, size_t t, int worker) {
  (void)worker;
  const scale_job *j = ctx;
  const scale_item *it = &j->items[t];
  float c32 = (float)j->coef;
  int exact = j->mode == BX_SCALE_EXACT;
  switch (it->dt) {
    case BX_DT_F32:
      if (exact) scale_f32_exact(it->data, it->n, j->coef);
      else scale_f32_torch(it->data, it->n, c32);
      break;
    case BX_DT_F64: scale_f64(it->data, it->n, j->coef); break;
    case BX_DT_BF16:
      if (exact) scale_bf16_exact(it->data, it->n, j->coef);
      else scale_bf16_torch(it->data, it->n, c32);
      break;
    case BX_DT_F16:
      if (exact) scale_f16_exact(it->data, it->n, j->coef);
      else scale_f16_torch(it->data, it->n, c32);
      break;
    default: break;
  }
}

/* ---- validation shared by bx_scale and bx_clip_grad_norm ------------- */

typedef struct interval {
  uintptr_t lo, hi; /* [lo, hi) bytes */
  size_t group, index;
} interval;

static int cmp_interval(const void *a, const void *b) {
  const interval *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void name_of(char *buf, size_t len, size_t group, size_t index) {
  if (group == BX_NO_GROUP) snprintf(buf, len, "tensor %zu", index);
  else snprintf(buf, len, "group %zu, tensor %zu", group, index);
}

/* Tensors to scale, given either as one array (groups == NULL) or as
 * groups; every one is validated, spans must not overlap. On success the
 * workspace holds the scale items and *nitems their number. */
static bx_status prepare_scale(const char *fn, const DLTensor *flat, size_t count,
                               const bx_group *groups, size_t ngroups,
                               scale_item **items_out, size_t *nitems_out) {
  size_t ntensors = 0, nitems = 0;
  size_t ng = groups ? ngroups : 1;
  for (size_t g = 0; g < ng; g++) {
    const DLTensor *ts = groups ? groups[g].tensors : flat;
    size_t cnt = groups ? groups[g].count : count;
    size_t gid = groups ? g : BX_NO_GROUP;
    if (cnt > 0 && !ts)
      return groups ? bx_fail(BX_EINVAL, "%s: group %zu: tensors is NULL with count %zu", fn, g, cnt)
                    : bx_fail(BX_EINVAL, "%s: tensors is NULL with count %zu", fn, cnt);
    for (size_t i = 0; i < cnt; i++) {
      bx_span s;
      bx_status st = bx_tensor_span(&ts[i], fn, gid, i, &s);
      if (st != BX_OK) return st;
      ntensors++;
      nitems += (s.n + PIECE - 1) / PIECE;
    }
  }
  size_t ib = ntensors * sizeof(interval);
  char *ws = bx_workspace(ib + nitems * sizeof(scale_item) + 16);
  if (!ws) return bx_fail(BX_ENOMEM, "%s: cannot allocate workspace", fn);
  interval *iv = (interval *)ws;
  scale_item *items = (scale_item *)(ws + ib);
  size_t k = 0, it = 0;
  for (size_t g = 0; g < ng; g++) {
    const DLTensor *ts = groups ? groups[g].tensors : flat;
    size_t cnt = groups ? groups[g].count : count;
    for (size_t i = 0; i < cnt; i++) {
      bx_span s;
      bx_tensor_span(&ts[i], fn, BX_NO_GROUP, i, &s);
      if (s.n == 0) continue;
      size_t es = bx_dtype_size(s.dtype);
      iv[k].lo = (uintptr_t)s.data;
      iv[k].hi = (uintptr_t)s.data + s.n * es;
      iv[k].group = groups ? g : BX_NO_GROUP;
      iv[k].index = i;
      k++;
      for (size_t off = 0; off < s.n; off += PIECE) {
        items[it].data = (char *)s.data + off * es;
        items[it].n = s.n - off < PIECE ? s.n - off : PIECE;
        items[it].dt = s.dtype;
        it++;
      }
    }
  }
  qsort(iv, k, sizeof *iv, cmp_interval);
  for (size_t i = 1; i < k; i++)
    if (iv[i].lo < iv[i - 1].hi) {
      char a[64], b[64];
      name_of(a, sizeof a, iv[i - 1].group, iv[i - 1].index);
      name_of(b, sizeof b, iv[i].group, iv[i].index);
      return bx_fail(BX_ELAYOUT,
                     "%s: %s and %s share memory (the same tensor twice, or "
                     "overlapping views); each element must be scaled once",
                     fn, a, b);
    }
  *items_out = items;
  *nitems_out = it;
  return BX_OK;
}

static bx_status check_scale_opts(const char *fn, const bx_scale_opts *o) {
  if (o->mode != BX_SCALE_TORCH && o->mode != BX_SCALE_EXACT)
    return bx_fail(BX_EINVAL, "%s: unknown scale mode %d", fn, o->mode);
  if (o->num_threads < 0) return bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o->num_threads);
  return BX_OK;
}

static void run_scale_items(scale_item *items, size_t nitems, double coef,
                            const bx_scale_opts *o) {
  size_t total = nitems * PIECE;
  int nthreads = o->num_threads > 0 ? o->num_threads : bx_default_threads();
  if ((size_t)nthreads > total / (1u << 16) + 1) nthreads = (int)(total / (1u << 16) + 1);
  scale_job j = {items, coef, o->mode};
  bx_parallel_run(nthreads, nitems, run_scale, &j);
}

bx_status bx_scale(DLTensor *tensors, size_t count, double coef, const bx_scale_opts *opts) {
  static const char *fn = "bx_scale";
  bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
  if (opts) o = *opts;
  bx_status st = check_scale_opts(fn, &o);
  if (st != BX_OK) return st;
  if (coef != coef) return bx_fail(BX_EINVAL, "%s: coef is NaN", fn);
  scale_item *items;
  size_t nitems;
  st = prepare_scale(fn, tensors, count, NULL, 0, &items, &nitems);
  if (st != BX_OK) return st;
  run_scale_items(items, nitems, coef, &o);
  return BX_OK;
}

/* ---- clipping ---------------------------------------------------------- */

bx_status bx_clip_coef(double total_norm, double max_norm, const bx_clip_opts *opts,
                       double *coef) {
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  if (opts) o = *opts;
  if (!coef) return bx_fail(BX_EINVAL, "bx_clip_coef: coef is NULL");
  if (!(max_norm >= 0)) return bx_fail(BX_EINVAL, "bx_clip_coef: max_norm %g is negative or NaN", max_norm);
  if (!(o.eps >= 0)) return bx_fail(BX_EINVAL, "bx_clip_coef: eps %g is negative or NaN", o.eps);
  double c;
  if (max_norm == 0.0) c = 1.0;
  else if (o.formula == BX_COEF_TORCH) c = max_norm / (total_norm + o.eps);
  else if (o.formula == BX_COEF_MAX) c = max_norm / (total_norm > max_norm || total_norm != total_norm ? total_norm : max_norm);
  else return bx_fail(BX_EINVAL, "bx_clip_coef: unknown formula %d", o.formula);
  if (c > 1.0) c = 1.0; /* NaN stays NaN, as torch.clamp */
  *coef = c;
  return BX_OK;
}

bx_status bx_clip_grad_norm(const bx_group *groups, size_t ngroups, const bx_comm *comm,
                            double max_norm, const bx_clip_opts *opts, double *total_norm,
                            double *coef) {
  static const char *fn = "bx_clip_grad_norm";
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  if (opts) o = *opts;
  if (!(max_norm >= 0)) return bx_fail(BX_EINVAL, "%s: max_norm %g is negative or NaN", fn, max_norm);
  if (!(o.eps >= 0)) return bx_fail(BX_EINVAL, "%s: eps %g is negative or NaN", fn, o.eps);
  if (o.formula != BX_COEF_TORCH && o.formula != BX_COEF_MAX)
    return bx_fail(BX_EINVAL, "%s: unknown formula %d", fn, o.formula);
  if (!total_norm) return bx_fail(BX_EINVAL, "%s: total_norm is NULL", fn);
  bx_status st = check_scale_opts(fn, &o.scale);
  if (st != BX_OK) return st;
  if (ngroups > 0 && !groups) return bx_fail(BX_EINVAL, "%s: groups is NULL with ngroups %zu", fn, ngroups);
  /* layout checks (overlap) before the expensive norm */
  scale_item *items;
  size_t nitems;
  st = prepare_scale(fn, NULL, 0, groups, ngroups, &items, &nitems);
  if (st != BX_OK) return st;
  double norm, c;
  st = bx_total_norm(groups, ngroups, comm, &o.norm, &norm, NULL);
  if (st != BX_OK) return st;
  bx_clip_coef(norm, max_norm, &o, &c);
  if (c != 1.0) {
    /* the norm call reused the workspace: build the items again */
    st = prepare_scale(fn, NULL, 0, groups, ngroups, &items, &nitems);
    if (st != BX_OK) return st;
    run_scale_items(items, nitems, c, &o.scale);
  }
  *total_norm = norm;
  if (coef) *coef = c;
  return BX_OK;
}
