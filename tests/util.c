/*
 * util.c — test-side tensors and data generators (see util.h).
 */
#include "util.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t bxt_dt_size(int dt) {
  static const size_t sz[REF_NDT] = {2, 2, 4, 8};
  return sz[dt];
}

const char *bxt_dt_name(int dt) {
  static const char *names[REF_NDT] = {"fp16", "bf16", "fp32", "fp64"};
  return names[dt];
}

DLDataType bxt_dl_dtype(int dt) {
  DLDataType d;
  d.code = dt == REF_BF16 ? kDLBfloat : kDLFloat;
  d.bits = (uint8_t)(8 * bxt_dt_size(dt));
  d.lanes = 1;
  return d;
}

void bxt_tensor_alloc(bxt_tensor *x, int dt, size_t n) {
  memset(x, 0, sizeof *x);
  size_t bytes = (n * bxt_dt_size(dt) + 63) / 64 * 64 + 64;
  x->buf = aligned_alloc(64, bytes);
  if (!x->buf) {
    fprintf(stderr, "bx_tests: out of memory (%zu bytes)\n", bytes);
    abort();
  }
  memset(x->buf, 0, bytes);
  x->n = n;
  x->dt = dt;
  x->shape[0] = (int64_t)n;
  x->t.data = x->buf;
  x->t.device.device_type = kDLCPU;
  x->t.device.device_id = 0;
  x->t.ndim = 1;
  x->t.dtype = bxt_dl_dtype(dt);
  x->t.shape = x->shape;
  x->t.strides = NULL;
  x->t.byte_offset = 0;
}

void bxt_tensor_free(bxt_tensor *x) {
  free(x->buf);
  memset(x, 0, sizeof *x);
}

void bxt_tensor_clone(bxt_tensor *dst, const bxt_tensor *src) {
  bxt_tensor_alloc(dst, src->dt, src->n);
  memcpy(dst->buf, src->buf, src->n * bxt_dt_size(src->dt));
  memcpy(dst->shape, src->shape, sizeof dst->shape);
  memcpy(dst->strides, src->strides, sizeof dst->strides);
  dst->t.ndim = src->t.ndim;
  dst->t.strides = src->t.strides ? dst->strides : NULL;
}

uint64_t bxt_get_bits(const bxt_tensor *x, size_t i) {
  const char *p = (const char *)x->buf + i * bxt_dt_size(x->dt);
  switch (bxt_dt_size(x->dt)) {
  case 2: {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
  }
  case 4: {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
  }
  default: {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
  }
  }
}

void bxt_set_bits(bxt_tensor *x, size_t i, uint64_t bits) {
  char *p = (char *)x->buf + i * bxt_dt_size(x->dt);
  switch (bxt_dt_size(x->dt)) {
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
  default:
    memcpy(p, &bits, 8);
  }
}

double bxt_get(const bxt_tensor *x, size_t i) {
  return ref_elem(x->dt, x->buf, i);
}

uint64_t bxt_dbits(double d) {
  uint64_t u;
  memcpy(&u, &d, 8);
  return u;
}

uint32_t bxt_fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

uint16_t bxt_f32_to_bf16(float f) {
  uint32_t u = bxt_fbits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u); /* nearest even on the low 16 bits */
  return (uint16_t)(u >> 16);
}

float bxt_bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* fp16 from float, nearest even, by integer steps on the float's bits. */
uint16_t bxt_f32_to_f16(float f) {
  uint32_t u = bxt_fbits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t e = (u >> 23) & 0xFF, m = u & 0x7FFFFFu;
  if (e == 0xFF) return (uint16_t)(sign | 0x7C00u | (m ? 0x200u | (m >> 13) : 0));
  if (e == 0) return sign; /* fp32 subnormals are far below fp16's range */
  int exp = (int)e - 127;    /* value = 1.m * 2^exp */
  uint32_t sig = m | 0x800000u; /* 24 bits */
  /* result ulp exponent: max(exp - 10, -24) */
  int ulp = exp - 10 < -24 ? -24 : exp - 10;
  int shift = ulp - (exp - 23); /* bits to drop from sig */
  if (shift > 25) return sign;  /* below half the smallest subnormal */
  uint32_t q = sig >> shift, rem = sig & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  /* q * 2^ulp; encode */
  if (ulp == -24) { /* subnormal range: q < 2^11 possibly = 1024 (normal) */
    return (uint16_t)(sign | q); /* q = 1024 encodes 2^-14 correctly */
  }
  if (q >> 11) { /* carried into the next binade */
    q >>= 1;
    ulp++;
  }
  int biased = ulp + 10 + 15;
  if (biased >= 31) return (uint16_t)(sign | 0x7C00u);
  return (uint16_t)(sign | ((uint32_t)biased << 10) | (q & 0x3FFu));
}

float bxt_f16_to_f32(uint16_t b) { return (float)ref_f16_to_double(b); }

void bxt_set(bxt_tensor *x, size_t i, double v) {
  switch (x->dt) {
  case REF_F16: /* via fp32: double rounding is harmless for data; exact
                  cases use bxt_set_bits */
    bxt_set_bits(x, i, bxt_f32_to_f16((float)v));
    break;
  case REF_BF16:
    bxt_set_bits(x, i, bxt_f32_to_bf16((float)v));
    break;
  case REF_F32: {
    float f = (float)v;
    bxt_set_bits(x, i, bxt_fbits(f));
    break;
  }
  default:
    bxt_set_bits(x, i, bxt_dbits(v));
  }
}

void bxt_fill_gradient(bxt_rng *r, bxt_tensor *x, double sigma) {
  for (size_t i = 0; i < x->n; i++) {
    uint64_t u = bxt_below(r, 1000);
    double v;
    if (u < 10)
      v = 0.0;
    else if (u == 10)
      v = 1000.0 * sigma * bxt_normal(r);
    else
      v = sigma * bxt_normal(r);
    bxt_set(x, i, v);
  }
}

static int bits_finite(int dt, uint64_t b) {
  switch (dt) {
  case REF_F16:
    return ((b >> 10) & 31) != 31;
  case REF_BF16:
    return ((b >> 7) & 255) != 255;
  case REF_F32:
    return ((b >> 23) & 255) != 255;
  default:
    return ((b >> 52) & 2047) != 2047;
  }
}

void bxt_fill_bits(bxt_rng *r, bxt_tensor *x, int keep_nonfinite) {
  int bits = (int)(8 * bxt_dt_size(x->dt));
  uint64_t mask = bits == 64 ? ~0ull : ((1ull << bits) - 1);
  for (size_t i = 0; i < x->n; i++) {
    uint64_t b;
    do
      b = bxt_next(r) & mask;
    while (!keep_nonfinite && !bits_finite(x->dt, b));
    bxt_set_bits(x, i, b);
  }
}

void bxt_fill_wide(bxt_rng *r, bxt_tensor *x) {
  /* exponent field uniform over [0, max finite]: subnormals included */
  static const int ebits[REF_NDT] = {5, 8, 8, 11};
  static const int mbits[REF_NDT] = {10, 7, 23, 52};
  int eb = ebits[x->dt], mb = mbits[x->dt];
  uint64_t emax = (1ull << eb) - 1; /* all-ones: non-finite, excluded */
  for (size_t i = 0; i < x->n; i++) {
    uint64_t e = bxt_below(r, emax);
    uint64_t m = bxt_next(r) & ((1ull << mb) - 1);
    uint64_t s = bxt_next(r) & 1;
    bxt_set_bits(x, i, (s << (eb + mb)) | (e << mb) | m);
  }
}

void bxt_fill_mixed(bxt_rng *r, bxt_tensor *x) {
  switch (bxt_below(r, 4)) {
  case 0:
  case 1: {
    double sigma = pow(10.0, -8.0 + 9.0 * bxt_uniform(r));
    bxt_fill_gradient(r, x, sigma);
    break;
  }
  case 2:
    bxt_fill_wide(r, x);
    break;
  default:
    bxt_fill_bits(r, x, 0);
  }
}

void bxt_ref_squares(ref_sum *s, const bxt_tensor *x) {
  ref_add_squares(s, x->dt, x->buf, x->n);
}

void bxt_ref_abs(ref_sum *s, const bxt_tensor *x) {
  ref_add_abs(s, x->dt, x->buf, x->n);
}

int bxt_mentions(const char *msg, const char *word, long index) {
  char pat[64];
  snprintf(pat, sizeof pat, "%s %ld", word, index);
  size_t len = strlen(pat);
  for (const char *p = msg; (p = strstr(p, pat)) != NULL; p++)
    if (!isdigit((unsigned char)p[len])) return 1;
  return 0;
}
