/*
 * portable.c — the reference exact kernels, plain C: per-exponent integer
 * bins. Element x = m * 2^k with an integer significand m; x^2 (or |x|) is
 * added as m^2 (or m) into the bin of x's exponent field, and the bins are
 * deposited into the accumulator before any can overflow. No floating-point
 * arithmetic at all, so the result is exact by construction.
 *
 * These are also the fallback the vector kernels use for blocks they cannot
 * handle in registers (NaN/Inf, exponents spread beyond their windows).
 * The bins, their capacity and the four interleaved tables: bins.h.
 */
#include <string.h>

#include "bins.h"
#include "kernels.h"

/* Hidden bit by exponent field (0 for subnormals and zeros): a load, so
 * the loops below have no data-dependent branch but the NaN/Inf one. */
static const uint32_t hidden_f32[256] = {[1 ... 255] = 0x800000};
static const uint32_t hidden_bf16[256] = {[1 ... 255] = 0x80};
static const uint32_t hidden_f16[32] = {[1 ... 31] = 0x400};

/* A NaN or Inf (exponent field all ones, fraction f): counted; its bin
 * (255 or 31) takes garbage and is never deposited. */
static inline void count_special(uint32_t f, bx_bins *b) {
  if (f) b->nan++;
  else b->inf++;
}

/* ---- fp32: bits seeeeeeeemmm..., x = m * 2^(e - 150), e >= 1 ----------
 * bin e holds m^2 at 2^(2e - 300) (sumsq) or m at 2^(e - 150) (sumabs). */

/* One element into table k (a constant after inlining: -O2 does not
 * unroll the loops, so each loop below spells its four calls out). */
static inline void f32_sq_one(const float *p, bx_bins *b, int k) {
  uint32_t v;
  memcpy(&v, p, 4);
  uint32_t e = (v >> 23) & 0xFF;
  if (__builtin_expect(e == 0xFF, 0)) count_special(v & 0x7FFFFF, b);
  uint64_t m = (v & 0x7FFFFF) | hidden_f32[e];
  b->bin[k][e] += m * m;
}

static inline void f32_abs_one(const float *p, bx_bins *b, int k) {
  uint32_t v;
  memcpy(&v, p, 4);
  uint32_t e = (v >> 23) & 0xFF;
  if (__builtin_expect(e == 0xFF, 0)) count_special(v & 0x7FFFFF, b);
  b->bin[k][e] += (v & 0x7FFFFF) | hidden_f32[e];
}

static void f32_bins_sq(const float *x, size_t n, bx_bins *b) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) { /* one 64-byte line an iteration */
    bx_prefetch_line(x + i);
    for (size_t j = 0; j < 16; j += 4) {
      f32_sq_one(x + i + j, b, 0);
      f32_sq_one(x + i + j + 1, b, 1);
      f32_sq_one(x + i + j + 2, b, 2);
      f32_sq_one(x + i + j + 3, b, 3);
    }
  }
  for (; i < n; i++) f32_sq_one(x + i, b, 0);
}

void bx_sumsq_f32_scalar(const float *x, size_t n, bx_acc *acc) {
  bx_bins b;
  bx_bins_init(&b, BX_BINS_F32_ROOM);
  for (size_t i = 0; i < n; i += BX_BINS_F32_ROOM) {
    size_t m = n - i < BX_BINS_F32_ROOM ? n - i : BX_BINS_F32_ROOM;
    bx_bins_touch(&b, 0, 254);
    f32_bins_sq(x + i, m, &b);
    bx_bins_flush(&b, acc, 2, -300);
  }
  bx_bins_done(&b, acc, 2, -300);
  acc->count += (int64_t)n;
}

void bx_sumabs_f32_scalar(const float *x, size_t n, bx_acc *acc) {
  bx_bins b; /* m < 2^24: 2^22 elements a call cannot overflow */
  bx_bins_init(&b, n);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) { /* one 64-byte line an iteration */
    bx_prefetch_line(x + i);
    for (size_t j = 0; j < 16; j += 4) {
      f32_abs_one(x + i + j, &b, 0);
      f32_abs_one(x + i + j + 1, &b, 1);
      f32_abs_one(x + i + j + 2, &b, 2);
      f32_abs_one(x + i + j + 3, &b, 3);
    }
  }
  for (; i < n; i++) f32_abs_one(x + i, &b, 0);
  bx_bins_touch(&b, 0, 254);
  bx_bins_done(&b, acc, 1, -150);
  acc->count += (int64_t)n;
}

/* ---- bf16: seeeeeeeemmmmmmm, x = m * 2^(e - 134); m^2 < 2^16 ----------
 * 2^22 elements * 2^16 < 2^64: no flush within a call. */

static inline void bf16_one(const uint16_t *p, bx_bins *b, int k, int squares) {
  uint32_t v = *p;
  uint32_t e = (v >> 7) & 0xFF;
  if (__builtin_expect(e == 0xFF, 0)) count_special(v & 0x7F, b);
  uint32_t m = (v & 0x7F) | hidden_bf16[e];
  b->bin[k][e] += squares ? m * m : m;
}

static inline void bf16_bins(const uint16_t *x, size_t n, bx_bins *b, int squares) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) { /* one 64-byte line an iteration */
    bx_prefetch_line(x + i);
    for (size_t j = 0; j < 32; j += 4) {
      bf16_one(x + i + j, b, 0, squares);
      bf16_one(x + i + j + 1, b, 1, squares);
      bf16_one(x + i + j + 2, b, 2, squares);
      bf16_one(x + i + j + 3, b, 3, squares);
    }
  }
  for (; i < n; i++) bf16_one(x + i, b, 0, squares);
  bx_bins_touch(b, 0, 254);
}

void bx_sumsq_bf16_scalar(const uint16_t *x, size_t n, bx_acc *acc) {
  bx_bins b;
  bx_bins_init(&b, n);
  bf16_bins(x, n, &b, 1);
  bx_bins_done(&b, acc, 2, -268);
  acc->count += (int64_t)n;
}

void bx_sumabs_bf16_scalar(const uint16_t *x, size_t n, bx_acc *acc) {
  bx_bins b;
  bx_bins_init(&b, n);
  bf16_bins(x, n, &b, 0);
  bx_bins_done(&b, acc, 1, -134);
  acc->count += (int64_t)n;
}

/* ---- fp16: seeeeemmmmmmmmmm, x = m * 2^(e - 25); m^2 < 2^22 -----------
 * 2^22 elements * 2^22 < 2^64: no flush within a call. */

static inline void f16_one(const uint16_t *p, bx_bins *b, int k, int squares) {
  uint32_t v = *p;
  uint32_t e = (v >> 10) & 0x1F;
  if (__builtin_expect(e == 0x1F, 0)) count_special(v & 0x3FF, b);
  uint64_t m = (v & 0x3FF) | hidden_f16[e];
  b->bin[k][e] += squares ? m * m : m;
}

static inline void f16_bins(const uint16_t *x, size_t n, bx_bins *b, int squares) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) { /* one 64-byte line an iteration */
    bx_prefetch_line(x + i);
    for (size_t j = 0; j < 32; j += 4) {
      f16_one(x + i + j, b, 0, squares);
      f16_one(x + i + j + 1, b, 1, squares);
      f16_one(x + i + j + 2, b, 2, squares);
      f16_one(x + i + j + 3, b, 3, squares);
    }
  }
  for (; i < n; i++) f16_one(x + i, b, 0, squares);
  bx_bins_touch(b, 0, 30);
}

void bx_sumsq_f16_scalar(const uint16_t *x, size_t n, bx_acc *acc) {
  bx_bins b;
  bx_bins_init(&b, n);
  f16_bins(x, n, &b, 1);
  bx_bins_done(&b, acc, 2, -50);
  acc->count += (int64_t)n;
}

void bx_sumabs_f16_scalar(const uint16_t *x, size_t n, bx_acc *acc) {
  bx_bins b;
  bx_bins_init(&b, n);
  f16_bins(x, n, &b, 0);
  bx_bins_done(&b, acc, 1, -25);
  acc->count += (int64_t)n;
}

/* ---- fp64: x = m * 2^(e - 1075), m < 2^53: the 128-bit bins of bins.h */

static void sum_f64_bins(const double *x, size_t n, bx_acc *acc, int squares) {
  bx_bins_f64 b;
  bx_bins_f64_init(&b);
  for (size_t i = 0; i < n; i += BX_BINS_F64_ROOM) {
    size_t m = n - i < BX_BINS_F64_ROOM ? n - i : BX_BINS_F64_ROOM;
    bx_bins_f64_add(&b, x + i, m, UINT64_MAX, squares);
    if (squares) bx_bins_f64_flush(&b, acc, -2150, 2);
    else bx_bins_f64_flush(&b, acc, -1075, 1);
  }
  acc->nan_count += b.nan;
  acc->inf_count += b.inf;
  acc->count += (int64_t)n;
}

void bx_sumsq_f64_scalar(const double *x, size_t n, bx_acc *acc) { sum_f64_bins(x, n, acc, 1); }
void bx_sumabs_f64_scalar(const double *x, size_t n, bx_acc *acc) { sum_f64_bins(x, n, acc, 0); }

/* ---- the table: untyped entry points -------------------------------- */

static void sumsq_f16(const void *x, size_t n, bx_acc *a) { bx_sumsq_f16_scalar(x, n, a); }
static void sumsq_bf16(const void *x, size_t n, bx_acc *a) { bx_sumsq_bf16_scalar(x, n, a); }
static void sumsq_f32(const void *x, size_t n, bx_acc *a) { bx_sumsq_f32_scalar(x, n, a); }
static void sumsq_f64(const void *x, size_t n, bx_acc *a) { bx_sumsq_f64_scalar(x, n, a); }
void bx_portable_sumabs_f16(const void *x, size_t n, bx_acc *a) { bx_sumabs_f16_scalar(x, n, a); }
void bx_portable_sumabs_bf16(const void *x, size_t n, bx_acc *a) { bx_sumabs_bf16_scalar(x, n, a); }
void bx_portable_sumabs_f32(const void *x, size_t n, bx_acc *a) { bx_sumabs_f32_scalar(x, n, a); }
void bx_portable_sumabs_f64(const void *x, size_t n, bx_acc *a) { bx_sumabs_f64_scalar(x, n, a); }

const bx_kernels bx_kernels_portable = {
    "portable",
    {sumsq_f16, sumsq_bf16, sumsq_f32, sumsq_f64},
    {bx_portable_sumabs_f16, bx_portable_sumabs_bf16, bx_portable_sumabs_f32, bx_portable_sumabs_f64},
};
