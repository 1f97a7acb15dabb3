/*
 * portable_misc.c — kernels for the rarer norms, plain C: max/min |x|
 * (p = ±inf), non-zero count (p = 0), sum |x|^p for other p, and the
 * Megatron-LM fp32 flavour (fp32-rounded squares summed exactly).
 * Each works on one contiguous span of one dtype.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "pow_det.h"

/* Element i of a span widened to double (exact for every dtype). */
static double f16_to_double(uint16_t h) {
  int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v;
  if (e == 0x1F) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexp((double)m, -24);
  else v = ldexp((double)(m | 0x400), e - 25);
  return (h & 0x8000) ? -v : v;
}

static double bf16_to_double(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return (double)f;
}

double bx_load_as_double(const void *data, bx_dtype dt, size_t i) {
  switch (dt) {
    case BX_DT_F16: return f16_to_double(((const uint16_t *)data)[i]);
    case BX_DT_BF16: return bf16_to_double(((const uint16_t *)data)[i]);
    case BX_DT_F32: return (double)((const float *)data)[i];
    default: return ((const double *)data)[i];
  }
}

/* |x| as a double for ordering, with NaN reported separately. */
void bx_extreme_abs(const void *data, bx_dtype dt, size_t n, double *maxabs,
                    double *minabs, int64_t *nan_count, int64_t *nonzero) {
  double mx = *maxabs, mn = *minabs;
  int64_t nan = 0, nz = 0;
  for (size_t i = 0; i < n; i++) {
    double a = fabs(bx_load_as_double(data, dt, i));
    if (a != a) {
      nan++;
      continue;
    }
    if (a > mx) mx = a;
    if (a < mn) mn = a;
    nz += a != 0.0;
  }
  *maxabs = mx;
  *minabs = mn;
  *nan_count += nan;
  *nonzero += nz;
}

/* acc += sum |x|^p (each term rounded by pow; the sum exact). */
void bx_sum_pow(const void *data, bx_dtype dt, size_t n, double p, bx_acc *acc) {
  double buf[512];
  for (size_t i = 0; i < n;) {
    size_t k = 0;
    for (; k < 512 && i < n; i++, k++) buf[k] = bx_pow_det(fabs(bx_load_as_double(data, dt, i)), p);
    bx_sumabs_f64_scalar(buf, k, acc); /* counts NaN/Inf terms too */
  }
}

/* acc += sum fl32(fl32(x)^2), exactly: the Megatron-LM flavour. */
void bx_sum_megatron_sq(const void *data, bx_dtype dt, size_t n, bx_acc *acc) {
  float buf[1024];
  for (size_t i = 0; i < n;) {
    size_t k = 0;
    for (; k < 1024 && i < n; i++, k++) {
      float f = (float)bx_load_as_double(data, dt, i);
      buf[k] = f * f; /* one fp32 rounding; no contraction (-ffp-contract=off) */
    }
    bx_sumabs_f32_scalar(buf, k, acc);
  }
}
