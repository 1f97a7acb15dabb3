/*
 * data.c — the GPU tests' data: dtypes, data sets (bit patterns chosen per
 * dtype), and tensor sets living in one CUDA buffer and one host buffer at
 * the same offsets (see ct.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ct.h"

/* ---- dtypes ----------------------------------------------------------- */
static const struct {
  const char *name;
  size_t size;
  int ebits, mbits; /* exponent and mantissa field widths */
  DLDataType dl;
} DT[CT_NDT] = {
    {"fp32", 4, 8, 23, {kDLFloat, 32, 1}},
    {"bf16", 2, 8, 7, {kDLBfloat, 16, 1}},
    {"fp16", 2, 5, 10, {kDLFloat, 16, 1}},
    {"fp64", 8, 11, 52, {kDLFloat, 64, 1}},
};

size_t ct_dt_size(int dt) { return DT[dt].size; }
const char *ct_dt_name(int dt) { return DT[dt].name; }
DLDataType ct_dl_dtype(int dt) { return DT[dt].dl; }

static const char *DATA_NAMES[CT_NDATA] = {"gauss", "wide", "spiky", "subnormal", "zeros", "max",
                                           "tiny",  "huge", "nan",   "inf",       "nan+inf"};
const char *ct_data_name(int data) { return DATA_NAMES[data]; }
int ct_data_nonfinite(int data) { return data == CT_NAN || data == CT_INF || data == CT_NANINF; }

/* ---- element bits ----------------------------------------------------- */
static uint64_t f64_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, 8);
  return u;
}
static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* float -> fp16 by truncation (the data only need to be some fp16 values
 * distributed like v, not its correct rounding). */
static uint16_t f32_to_f16_trunc(float f) {
  uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000, man = u & 0x7FFFFF;
  int exp = (int)((u >> 23) & 0xFF);
  if (exp == 0xFF) return (uint16_t)(sign | 0x7C00 | (man ? 0x200 : 0));
  int e = exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7BFF);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    return (uint16_t)(sign | ((man | 0x800000) >> (14 - e)));
  }
  return (uint16_t)(sign | ((uint32_t)e << 10) | (man >> 13));
}

/* Bits of the dtype near the value v. */
static uint64_t bits_of(int dt, double v) {
  switch (dt) {
    case CT_F64: return f64_bits(v);
    case CT_F32: return f32_bits((float)v);
    case CT_BF16: return f32_bits((float)v) >> 16;
    default: return f32_to_f16_trunc((float)v);
  }
}

/* sign | exponent field e | mantissa m */
static uint64_t compose(int dt, int sign, uint64_t e, uint64_t m) {
  int eb = DT[dt].ebits, mb = DT[dt].mbits;
  return ((uint64_t)sign << (eb + mb)) | (e << mb) | (m & ((1ull << mb) - 1));
}

static uint64_t emax_field(int dt) { return (1ull << DT[dt].ebits) - 2; } /* largest finite */

/* Approximately N(0, 1) from one random word (Irwin-Hall of 4 uniforms):
 * cheap enough for the large sets; the norms do not care about the tails. */
static double gauss_like(uint64_t m) {
  double s = 0;
  for (int k = 0; k < 4; k++) s += (double)((m >> (16 * k)) & 0xFFFF) * 0x1p-16;
  return (s - 2.0) * 1.7320508075688772;
}

static uint64_t gen_bits(int dt, int data, ct_rng *r) {
  int sign = (int)(ct_next(r) & 1);
  uint64_t m = ct_next(r), em = emax_field(dt);
  switch (data) {
    case CT_WIDE: return compose(dt, sign, ct_below(r, em + 1), m);
    case CT_SPIKY:
      if (ct_below(r, 10000) == 0) return compose(dt, sign, em - ct_below(r, 3), m);
      return bits_of(dt, gauss_like(m) * 1e-6);
    case CT_SUBNORMAL: {
      uint64_t mm = m & ((1ull << DT[dt].mbits) - 1);
      return compose(dt, sign, 0, mm ? mm : 1);
    }
    case CT_ZEROS: return compose(dt, sign, 0, 0);
    case CT_MAXVAL: return compose(dt, sign, em, ~0ull);
    case CT_TINY:
      if (dt == CT_F64 && (m >> 63)) return compose(dt, sign, 20 + ct_below(r, 11), m); /* ~1e-300 */
      return compose(dt, sign, 1 + ct_below(r, 4), m);
    case CT_HUGE:
      if (dt == CT_F64 && (m >> 63)) return compose(dt, sign, 2015 + ct_below(r, 11), m); /* ~1e300 */
      return compose(dt, sign, em - ct_below(r, 4), m);
    default: return bits_of(dt, gauss_like(m) * 1e-2);
  }
}

static uint64_t nan_bits(int dt, int kind) {
  uint64_t top = 1ull << (DT[dt].mbits - 1); /* the quiet bit */
  uint64_t e = emax_field(dt) + 1;
  switch (kind % 3) {
    case 0: return compose(dt, 0, e, top);           /* +qNaN */
    case 1: return compose(dt, 1, e, top | 5);       /* -qNaN with a payload */
    default: return compose(dt, 0, e, 1);            /* sNaN */
  }
}

static void put(unsigned char *p, int dt, uint64_t bits) {
  switch (DT[dt].size) {
    case 2: {
      uint16_t v = (uint16_t)bits;
      memcpy(p, &v, 2);
      break;
    }
    case 4: {
      uint32_t v = (uint32_t)bits;
      memcpy(p, &v, 4);
      break;
    }
    default: memcpy(p, &bits, 8);
  }
}

/* ---- sets ------------------------------------------------------------- */
int64_t ct_set_elems(const ct_set *s) {
  int64_t t = 0;
  for (size_t i = 0; i < s->count; i++) t += s->n[i];
  return t;
}

void ct_set_free(ct_set *s) {
  if (s->dev) cudaFree(s->dev);
  free(s->dt);
  free(s->n);
  free(s->off);
  free(s->host);
  free(s->work);
  free(s->cpu);
  free(s->gpu);
  memset(s, 0, sizeof *s);
}

static void make_view(DLTensor *t, void *base, size_t off, int dt, int64_t *n, int use_byte_offset,
                      DLDevice dev) {
  memset(t, 0, sizeof *t);
  size_t lo = use_byte_offset ? off & ~(size_t)255 : off;
  t->data = (unsigned char *)base + lo;
  t->byte_offset = off - lo;
  t->device = dev;
  t->ndim = 1;
  t->dtype = ct_dl_dtype(dt);
  t->shape = n;
  t->strides = NULL;
}

int ct_set_init(ct_set *s, size_t count, const int *dt, const int64_t *n, int misalign,
                ct_rng *r) {
  memset(s, 0, sizeof *s);
  s->count = count;
  size_t k = count ? count : 1;
  s->dt = malloc(k * sizeof *s->dt);
  s->n = malloc(k * sizeof *s->n);
  s->off = malloc(k * sizeof *s->off);
  s->cpu = calloc(k, sizeof *s->cpu);
  s->gpu = calloc(k, sizeof *s->gpu);
  if (!CT_CHECK(s->dt && s->n && s->off && s->cpu && s->gpu, "out of host memory")) goto fail;
  size_t cur = 0;
  for (size_t i = 0; i < count; i++) {
    size_t es = ct_dt_size(dt[i]);
    cur = misalign ? (cur + es - 1) / es * es + es * (size_t)ct_below(r, 8) : (cur + 255) & ~(size_t)255;
    s->dt[i] = dt[i];
    s->n[i] = n[i];
    s->off[i] = cur;
    cur += (size_t)n[i] * es;
  }
  s->bytes = cur;
  size_t cap = (cur + 255) & ~(size_t)255;
  if (!cap) cap = 256;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && cap + (256u << 20) > free_b) {
    ct_skip("set of %zu bytes does not fit the device's %zu free bytes", cap, free_b);
    goto fail;
  }
  s->host = malloc(cap);
  s->work = malloc(cap);
  if (!CT_CHECK(s->host && s->work, "cannot allocate 2 x %zu host bytes", cap)) goto fail;
  memset(s->host, 0, cap);
  if (!CT_CUDA(cudaMalloc(&s->dev, cap))) {
    s->dev = NULL;
    goto fail;
  }
  DLDevice hd = {kDLCPU, 0}, gd = {kDLCUDA, 0};
  cudaGetDevice(&gd.device_id);
  for (size_t i = 0; i < count; i++) {
    int bo = misalign && (i & 1);
    make_view(&s->cpu[i], s->work, s->off[i], s->dt[i], &s->n[i], bo, hd);
    make_view(&s->gpu[i], s->dev, s->off[i], s->dt[i], &s->n[i], bo, gd);
  }
  return 1;
fail:
  ct_set_free(s);
  return 0;
}

int ct_set_random(ct_set *s, size_t count, int64_t maxn, int dt, int misalign, ct_rng *r) {
  memset(s, 0, sizeof *s);
  int *dts = malloc((count ? count : 1) * sizeof *dts);
  int64_t *ns = malloc((count ? count : 1) * sizeof *ns);
  int ok = 0;
  if (CT_CHECK(dts && ns, "out of host memory")) {
    for (size_t i = 0; i < count; i++) {
      dts[i] = dt >= 0 ? dt : (int)ct_below(r, CT_NDT);
      ns[i] = (int64_t)ct_below(r, (uint64_t)maxn + 1);
    }
    ok = ct_set_init(s, count, dts, ns, misalign, r);
  }
  free(dts);
  free(ns);
  return ok;
}

int ct_h2d(void *dev, const void *host, size_t n) {
  return CT_CUDA(cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice)) && CT_CUDA(cudaDeviceSynchronize());
}

int ct_upload(ct_set *s) {
  memcpy(s->work, s->host, s->bytes);
  return ct_h2d(s->dev, s->host, s->bytes);
}

int ct_download(const ct_set *s, void *out) {
  return CT_CUDA(cudaMemcpy(out, s->dev, s->bytes, cudaMemcpyDeviceToHost));
}

void ct_fill(ct_set *s, int data, ct_rng *r) {
  int64_t total = ct_set_elems(s), idx = 0;
  int base = ct_data_nonfinite(data) ? CT_GAUSS : data;
  int64_t place[3] = {0, total / 2, total - 1};
  int spiked = 0;
  for (size_t i = 0; i < s->count; i++) {
    size_t es = ct_dt_size(s->dt[i]);
    unsigned char *p = s->host + s->off[i];
    for (int64_t j = 0; j < s->n[i]; j++, idx++) {
      uint64_t b = gen_bits(s->dt[i], base, r);
      if (data == CT_SPIKY && !spiked && idx >= total / 3) { /* at least one spike */
        b = compose(s->dt[i], 1, emax_field(s->dt[i]), ct_next(r));
        spiked = 1;
      }
      for (int k = 0; k < 3; k++) {
        if (idx != place[k]) continue;
        uint64_t inf = compose(s->dt[i], k & 1, emax_field(s->dt[i]) + 1, 0);
        if (data == CT_NAN) b = nan_bits(s->dt[i], k);
        if (data == CT_INF) b = inf;
        if (data == CT_NANINF) b = k == 1 ? nan_bits(s->dt[i], 2) : inf;
      }
      put(p + (size_t)j * es, s->dt[i], b);
    }
  }
  ct_upload(s);
}

void ct_groups(const ct_set *s, size_t ngroups, bx_group *g_cpu, bx_group *g_gpu) {
  size_t start = 0;
  for (size_t g = 0; g < ngroups; g++) {
    size_t end = (g + 1 == ngroups) ? s->count : s->count * (g + 1) / ngroups;
    if (ngroups >= 3 && g == 0) end = 0; /* an empty group */
    if (end < start) end = start;
    g_cpu[g].tensors = s->cpu + start;
    g_gpu[g].tensors = s->gpu + start;
    g_cpu[g].count = g_gpu[g].count = end - start;
    start = end;
  }
}

static int is_nan(int dt, const unsigned char *p) {
  uint64_t b = 0;
  memcpy(&b, p, ct_dt_size(dt)); /* little-endian */
  int eb = DT[dt].ebits, mb = DT[dt].mbits;
  uint64_t e = (b >> mb) & ((1ull << eb) - 1), m = b & ((1ull << mb) - 1);
  return e == (1ull << eb) - 1 && m != 0;
}

size_t ct_compare_grads(const ct_set *s, const void *got, const void *want, const char *what) {
  static int strict = -1;
  if (strict < 0) {
    const char *e = getenv("BX_CUDA_STRICT_NAN");
    strict = e && *e == '1';
  }
  const unsigned char *g = got, *w = want;
  size_t bad = 0, payload = 0;
  for (size_t i = 0; i < s->count; i++) {
    size_t es = ct_dt_size(s->dt[i]), off = s->off[i], len = (size_t)s->n[i] * es;
    if (memcmp(g + off, w + off, len) == 0) continue;
    for (size_t j = 0; j < (size_t)s->n[i]; j++) {
      const unsigned char *a = g + off + j * es, *b = w + off + j * es;
      if (memcmp(a, b, es) == 0) continue;
      if (is_nan(s->dt[i], a) && is_nan(s->dt[i], b) && !strict) {
        payload++;
        continue;
      }
      uint64_t ga = 0, wb = 0;
      memcpy(&ga, a, es);
      memcpy(&wb, b, es);
      if (bad++ < 3)
        CT_CHECK(0, "%s: tensor %zu (%s) element %zu: GPU bits 0x%llx, CPU bits 0x%llx", what, i,
                 ct_dt_name(s->dt[i]), j, (unsigned long long)ga, (unsigned long long)wb);
    }
  }
  if (bad > 3) CT_CHECK(0, "%s: %zu differing elements in all", what, bad);
  if (payload) ct_note("%s: %zu NaN elements with another payload (allowed; BX_CUDA_STRICT_NAN=1 "
                       "to fail on them)", what, payload);
  return bad;
}
