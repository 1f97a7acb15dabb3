/*
 * portable.c — the reference exact kernels, plain C: per-exponent integer
 * bins. Element x = m * 2^k with an integer significand m; x^2 (or |x|) is
 * added as m^2 (or m) into the bin of x's exponent field, and the bins are
 * deposited into the accumulator before any can overflow. No floating-point
 * arithmetic at all, so the result is exact by construction.
 *
 * These are also the fallback the vector kernels use for blocks they cannot
 * handle in registers (NaN/Inf, exponents spread beyond their windows).
 */
#include <string.h>

#include "internal.h"

typedef unsigned __int128 u128;

/* Elements per bin flush for 64-bit bins: m^2 < 2^48 (fp32) or m < 2^24,
 * so 2^15 additions stay below 2^63. */
#define F32_FLUSH ((size_t)1 << 15)

static void flush_bins_u64(bx_acc *acc, uint64_t *bin, int lo, int hi, int exp_of_0,
                           int exp_step) {
  for (int e = lo; e <= hi; e++)
    if (bin[e]) {
      bx_acc_deposit_u64(acc, bin[e], exp_of_0 + exp_step * e);
      bin[e] = 0;
    }
}

/* ---- fp32: bits seeeeeeeemmm..., x = m * 2^(e - 150), e >= 1 ---------- */

void bx_sumsq_f32_scalar(const float *x, size_t n, bx_acc *acc) {
  uint64_t bin[256] = {0};
  int64_t nan = 0, inf = 0;
  for (size_t i = 0; i < n;) {
    size_t end = n - i > F32_FLUSH ? i + F32_FLUSH : n;
    for (; i < end; i++) {
      uint32_t b;
      memcpy(&b, &x[i], 4);
      uint32_t e = (b >> 23) & 0xFF, m = b & 0x7FFFFF;
      if (e == 0xFF) {
        if (m) nan++; else inf++;
        continue;
      }
      if (e) m |= 0x800000; else e = 1;
      bin[e] += (uint64_t)m * m;
    }
    /* bin e holds m^2 at 2^(2e - 300) */
    flush_bins_u64(acc, bin, 1, 254, -300, 2);
  }
  acc->nan_count += nan;
  acc->inf_count += inf;
  acc->count += (int64_t)n;
}

void bx_sumabs_f32_scalar(const float *x, size_t n, bx_acc *acc) {
  uint64_t bin[256] = {0};
  int64_t nan = 0, inf = 0;
  for (size_t i = 0; i < n;) {
    size_t end = n - i > F32_FLUSH ? i + F32_FLUSH : n;
    for (; i < end; i++) {
      uint32_t b;
      memcpy(&b, &x[i], 4);
      uint32_t e = (b >> 23) & 0xFF, m = b & 0x7FFFFF;
      if (e == 0xFF) {
        if (m) nan++; else inf++;
        continue;
      }
      if (e) m |= 0x800000; else e = 1;
      bin[e] += m;
    }
    flush_bins_u64(acc, bin, 1, 254, -150, 1);
  }
  acc->nan_count += nan;
  acc->inf_count += inf;
  acc->count += (int64_t)n;
}

/* ---- bf16: seeeeeeeemmmmmmm, x = m * 2^(e - 134); m^2 < 2^16 ---------- */

void bx_sumsq_bf16_scalar(const uint16_t *x, size_t n, bx_acc *acc) {
  uint64_t bin[256] = {0}; /* 2^22 elements * 2^16 < 2^64: one flush */
  int64_t nan = 0, inf = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t b = x[i];
    uint32_t e = (b >> 7) & 0xFF, m = b & 0x7F;
    if (e == 0xFF) {
      if (m) nan++; else inf++;
      continue;
    }
    if (e) m |= 0x80; else e = 1;
    bin[e] += m * m;
  }
  flush_bins_u64(acc, bin, 1, 254, -268, 2);
  acc->nan_count += nan;
  acc->inf_count += inf;
  acc->count += (int64_t)n;
}

void bx_sumabs_bf16_scalar(const uint16_t *x, size_t n, bx_acc *acc) {
  uint64_t bin[256] = {0};
  int64_t nan = 0, inf = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t b = x[i];
    uint32_t e = (b >> 7) & 0xFF, m = b & 0x7F;
    if (e == 0xFF) {
      if (m) nan++; else inf++;
      continue;
    }
    if (e) m |= 0x80; else e = 1;
    bin[e] += m;
  }
  flush_bins_u64(acc, bin, 1, 254, -134, 1);
  acc->nan_count += nan;
  acc->inf_count += inf;
  acc->count += (int64_t)n;
}

/* ---- fp16: seeeeemmmmmmmmmm, x = m * 2^(e - 25); m^2 < 2^22 ----------- */

void bx_sumsq_f16_scalar(const uint16_t *x, size_t n, bx_acc *acc) {
  uint64_t bin[32] = {0}; /* 2^22 elements * 2^22 < 2^64: one flush */
  int64_t nan = 0, inf = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t b = x[i];
    uint32_t e = (b >> 10) & 0x1F, m = b & 0x3FF;
    if (e == 0x1F) {
      if (m) nan++; else inf++;
      continue;
    }
    if (e) m |= 0x400; else e = 1;
    bin[e] += (uint64_t)m * m;
  }
  flush_bins_u64(acc, bin, 1, 30, -50, 2);
  acc->nan_count += nan;
  acc->inf_count += inf;
  acc->count += (int64_t)n;
}

void bx_sumabs_f16_scalar(const uint16_t *x, size_t n, bx_acc *acc) {
  uint64_t bin[32] = {0};
  int64_t nan = 0, inf = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t b = x[i];
    uint32_t e = (b >> 10) & 0x1F, m = b & 0x3FF;
    if (e == 0x1F) {
      if (m) nan++; else inf++;
      continue;
    }
    if (e) m |= 0x400; else e = 1;
    bin[e] += m;
  }
  flush_bins_u64(acc, bin, 1, 30, -25, 1);
  acc->nan_count += nan;
  acc->inf_count += inf;
  acc->count += (int64_t)n;
}

/* ---- fp64: x = m * 2^(e - 1075), m < 2^53; 128-bit bins --------------
 * m^2 < 2^106: 2^21 additions stay below 2^127. Only the range of bins
 * touched is cleared and flushed (2048 bins would cost 32 KiB a call). */
#define F64_FLUSH ((size_t)1 << 21)

typedef struct bins128 {
  u128 bin[2048];
  int lo, hi; /* touched range; lo > hi when empty */
} bins128;

static void bins128_touch(bins128 *b, int e) {
  if (b->lo > b->hi) {
    b->bin[e] = 0;
    b->lo = b->hi = e;
  } else if (e < b->lo) {
    memset(&b->bin[e], 0, (size_t)(b->lo - e) * sizeof(u128));
    b->lo = e;
  } else if (e > b->hi) {
    memset(&b->bin[b->hi + 1], 0, (size_t)(e - b->hi) * sizeof(u128));
    b->hi = e;
  }
}

static void bins128_flush(bins128 *b, bx_acc *acc, int exp_of_0, int exp_step) {
  for (int e = b->lo; e <= b->hi; e++)
    if (b->bin[e]) {
      int exp = exp_of_0 + exp_step * e;
      bx_acc_deposit_u64(acc, (uint64_t)b->bin[e], exp);
      bx_acc_deposit_u64(acc, (uint64_t)(b->bin[e] >> 64), exp + 64);
    }
  b->lo = 1;
  b->hi = 0;
}

static void sum_f64_bins(const double *x, size_t n, bx_acc *acc, int squares) {
  bins128 b;
  b.lo = 1;
  b.hi = 0;
  int64_t nan = 0, inf = 0;
  for (size_t i = 0; i < n;) {
    size_t end = n - i > F64_FLUSH ? i + F64_FLUSH : n;
    for (; i < end; i++) {
      uint64_t bits;
      memcpy(&bits, &x[i], 8);
      int e = (int)((bits >> 52) & 0x7FF);
      uint64_t m = bits & ((1ull << 52) - 1);
      if (e == 0x7FF) {
        if (m) nan++; else inf++;
        continue;
      }
      if (e) m |= 1ull << 52; else e = 1;
      if (!m) continue;
      if (e < b.lo || e > b.hi) bins128_touch(&b, e);
      b.bin[e] += squares ? (u128)m * m : (u128)m;
    }
    if (squares) bins128_flush(&b, acc, -2150, 2);
    else bins128_flush(&b, acc, -1075, 1);
  }
  acc->nan_count += nan;
  acc->inf_count += inf;
  acc->count += (int64_t)n;
}

void bx_sumsq_f64_scalar(const double *x, size_t n, bx_acc *acc) { sum_f64_bins(x, n, acc, 1); }
void bx_sumabs_f64_scalar(const double *x, size_t n, bx_acc *acc) { sum_f64_bins(x, n, acc, 0); }

/* ---- the table: untyped entry points -------------------------------- */

static void sumsq_f16(const void *x, size_t n, bx_acc *a) { bx_sumsq_f16_scalar(x, n, a); }
static void sumsq_bf16(const void *x, size_t n, bx_acc *a) { bx_sumsq_bf16_scalar(x, n, a); }
static void sumsq_f32(const void *x, size_t n, bx_acc *a) { bx_sumsq_f32_scalar(x, n, a); }
static void sumsq_f64(const void *x, size_t n, bx_acc *a) { bx_sumsq_f64_scalar(x, n, a); }
static void sumabs_f16(const void *x, size_t n, bx_acc *a) { bx_sumabs_f16_scalar(x, n, a); }
static void sumabs_bf16(const void *x, size_t n, bx_acc *a) { bx_sumabs_bf16_scalar(x, n, a); }
static void sumabs_f32(const void *x, size_t n, bx_acc *a) { bx_sumabs_f32_scalar(x, n, a); }
static void sumabs_f64(const void *x, size_t n, bx_acc *a) { bx_sumabs_f64_scalar(x, n, a); }

const bx_kernels bx_kernels_portable = {
    "portable",
    {sumsq_f16, sumsq_bf16, sumsq_f32, sumsq_f64},
    {sumabs_f16, sumabs_bf16, sumabs_f32, sumabs_f64},
};
