/*
 * exact_window.h — the exact per-thread reduction of the CUDA kernels,
 * written once for the device and for the host: tests/test_cuda_sim.c runs
 * this very code on the CPU (a simulated grid) and compares the words with
 * the CPU backend, so the GPU's arithmetic is checked on every CI run even
 * though CI has no GPU.
 *
 * Scheme. An element x = m * 2^k (m its integer significand) adds v = m^2
 * (or m, for p = 1) at bit position q = 2k - BX_ACC_LSB_EXP (or k - LSB) of
 * the accumulator. Each thread keeps a private integer window: an
 * unsigned integer of W bits (64, 128 or 192) whose bit 0 sits at position
 * `base`. An element whose shifted value fits (q - base in [0, smax]) is
 * added with one shift and one wide add; smax leaves BX_CU_HEADROOM bits
 * of headroom for the at most BX_CU_PER_THREAD + 3 elements a thread adds
 * per chunk.
 * Anything else takes the slow path: an element below the window goes
 * straight into the block's digits (integer atomics), one above it flushes
 * the window and re-centres it. Every step is integer arithmetic on exact
 * values, so the sum cannot depend on which thread took which element, on
 * the order of the atomics, or on the window positions.
 *
 * The block's digits (a "sink": shared memory on the GPU, one copy per
 * warp so that fewer threads contend for one word) hold 32-bit pieces in
 * int64 words; at the end of a chunk the copies are added and each word is
 * split into its low 32 bits and the rest, added to the global digits
 * (bx_flush_word), so every global add is below 2^32 and a group's words
 * cannot overflow before 2^40 elements per call.
 */
#ifndef BX_EXACT_WINDOW_H
#define BX_EXACT_WINDOW_H

#include <math.h>
#include <stdint.h>

#include "bitexact.h"
#include "hd.h"
#include "pow_det.h"
#include "scale_round.h"

#define BX_CU_BLOCK 256                       /* threads per block */
#define BX_CU_WARPS (BX_CU_BLOCK / 32)        /* a copy of the block digits each */
#define BX_CU_CHUNK ((uint32_t)1 << 14)       /* elements per chunk: a block's unit */
#define BX_CU_PER_THREAD (BX_CU_CHUNK / BX_CU_BLOCK) /* 2^6 elements per thread per chunk */
/* A thread adds at most BX_CU_PER_THREAD + 3 elements per chunk (whole
 * 16-byte vectors, then at most 3 tail elements): below 2^BX_CU_HEADROOM. */
#define BX_CU_HEADROOM 7
#ifdef __cplusplus
static_assert(BX_CU_PER_THREAD + 3 < (1 << BX_CU_HEADROOM), "window headroom");
#else
_Static_assert(BX_CU_PER_THREAD + 3 < (1 << BX_CU_HEADROOM), "window headroom");
#endif
#define BX_CU_NO_BASE (-(1 << 29))            /* a window not placed yet */

/* Where a block's exact pieces go: digits (BX_ACC_DIGITS words) and the
 * NaN/Inf counters. Atomic adds on the GPU, plain adds on the host. */
typedef struct bx_sink {
  int64_t *digits;
  int64_t *nan;
  int64_t *inf;
} bx_sink;

static inline BX_HD void bx_sink_add(int64_t *w, int64_t v) {
#ifdef __CUDA_ARCH__
  atomicAdd((unsigned long long *)w, (unsigned long long)v);
#else
  *w += v;
#endif
}

/* One 32-bit piece into digit d (the top digit takes whatever lies above). */
static inline BX_HD void bx_sink_piece(const bx_sink *s, int d, uint64_t piece) {
  if (piece == 0) return;
  if (d >= BX_ACC_DIGITS - 1) {
    /* unreachable for finite squares/values (they end below digit 133);
     * kept exact anyway: piece * 2^(32*(d-133)) into the top digit */
    int64_t v = (int64_t)piece;
    for (int k = BX_ACC_DIGITS - 1; k < d; k++) v <<= 32;
    bx_sink_add(&s->digits[BX_ACC_DIGITS - 1], v);
    return;
  }
  bx_sink_add(&s->digits[d], (int64_t)piece);
}

/* v * 2^pos into the sink, exactly: pos >= 0 is the bit position of v's bit
 * 0 in the accumulator (weight 2^(pos + BX_ACC_LSB_EXP)). */
static inline BX_HD void bx_sink_deposit_u128(const bx_sink *s, bx_u128 v, int pos) {
  int d = pos >> 5, sh = pos & 31;
  bx_u128 lo = v << sh;
  uint64_t top = sh ? (uint64_t)(v >> (128 - sh)) : 0;
  bx_sink_piece(s, d, (uint64_t)(uint32_t)lo);
  bx_sink_piece(s, d + 1, (uint64_t)(uint32_t)(lo >> 32));
  bx_sink_piece(s, d + 2, (uint64_t)(uint32_t)(lo >> 64));
  bx_sink_piece(s, d + 3, (uint64_t)(uint32_t)(lo >> 96));
  bx_sink_piece(s, d + 4, top);
}

/* A block word w (any int64 made of 32-bit pieces) into the global digits:
 * low 32 bits at digit i, the rest at i + 1 (the top digit takes it all). */
static inline BX_HD void bx_flush_word(int64_t *global_digits, int i, int64_t w) {
  if (w == 0) return;
  if (i == BX_ACC_DIGITS - 1) {
    bx_sink_add(&global_digits[i], w);
    return;
  }
  int64_t lo = (int64_t)((uint64_t)w & 0xFFFFFFFFull);
  int64_t hi = (w - lo) / ((int64_t)1 << 32); /* exact: w - lo is a multiple */
  if (lo) bx_sink_add(&global_digits[i], lo);
  if (hi) bx_sink_add(&global_digits[i + 1], hi);
}

/* ---- windows ------------------------------------------------------------
 * add(v, q): q - base in [0, smax] → in the window; else the slow path.
 * Callers never pass NaN/Inf; zeros are either skipped or passed with
 * q = base (then they cost nothing). low: how far below a new element the window starts when it is
 * (re)placed; smax - low bits stay above it for larger elements. */

typedef struct bx_win64 {
  uint64_t acc;
  int base;
} bx_win64;

typedef struct bx_win128 {
  bx_u128 acc;
  int base;
} bx_win128;

typedef struct bx_win192 { /* acc = hi * 2^128 + lo */
  bx_u128 lo;
  uint64_t hi;
  int base;
} bx_win192;

static inline BX_HD int bx_win_place(int q, int low) { return q > low ? q - low : 0; }

static inline BX_HD void bx_win64_init(bx_win64 *w) {
  w->acc = 0;
  w->base = BX_CU_NO_BASE;
}
static inline BX_HD void bx_win64_flush(bx_win64 *w, const bx_sink *s) {
  if (w->acc) bx_sink_deposit_u128(s, (bx_u128)w->acc, w->base);
  w->acc = 0;
}
static inline BX_HD void bx_win64_slow(bx_win64 *w, uint64_t v, int q, int low,
                                       const bx_sink *s) {
  if (q < w->base) { /* below the window: straight into the block's digits */
    bx_sink_deposit_u128(s, (bx_u128)v, q);
    return;
  }
  bx_win64_flush(w, s); /* above it (or not placed yet): re-centre */
  w->base = bx_win_place(q, low);
  w->acc = v << (q - w->base);
}
static inline BX_HD void bx_win64_add(bx_win64 *w, uint64_t v, int q, int smax, int low,
                                      const bx_sink *s) {
  unsigned sft = (unsigned)(q - w->base);
  if (sft <= (unsigned)smax) w->acc += v << sft;
  else bx_win64_slow(w, v, q, low, s);
}

static inline BX_HD void bx_win128_init(bx_win128 *w) {
  w->acc = 0;
  w->base = BX_CU_NO_BASE;
}
static inline BX_HD void bx_win128_flush(bx_win128 *w, const bx_sink *s) {
  if (w->acc) bx_sink_deposit_u128(s, w->acc, w->base);
  w->acc = 0;
}
static inline BX_HD void bx_win128_slow(bx_win128 *w, uint64_t v, int q, int low,
                                        const bx_sink *s) {
  if (q < w->base) {
    bx_sink_deposit_u128(s, (bx_u128)v, q);
    return;
  }
  bx_win128_flush(w, s);
  w->base = bx_win_place(q, low);
  w->acc = (bx_u128)v << (q - w->base);
}
static inline BX_HD void bx_win128_add(bx_win128 *w, uint64_t v, int q, int smax, int low,
                                       const bx_sink *s) {
  unsigned sft = (unsigned)(q - w->base);
  if (sft <= (unsigned)smax) w->acc += (bx_u128)v << sft;
  else bx_win128_slow(w, v, q, low, s);
}

static inline BX_HD void bx_win192_init(bx_win192 *w) {
  w->lo = 0;
  w->hi = 0;
  w->base = BX_CU_NO_BASE;
}
static inline BX_HD void bx_win192_flush(bx_win192 *w, const bx_sink *s) {
  if (w->lo) bx_sink_deposit_u128(s, w->lo, w->base);
  if (w->hi) bx_sink_deposit_u128(s, (bx_u128)w->hi, w->base + 128);
  w->lo = 0;
  w->hi = 0;
}
/* acc += v * 2^sft, v < 2^106, sft <= 78 (so v * 2^sft < 2^184) */
static inline BX_HD void bx_win192_put(bx_win192 *w, bx_u128 v, unsigned sft) {
  bx_u128 lo = v << sft;
  uint64_t top = sft ? (uint64_t)(v >> (128 - sft)) : 0;
  w->lo += lo;
  w->hi += top + (w->lo < lo); /* carry out of the low 128 bits */
}
static inline BX_HD void bx_win192_slow(bx_win192 *w, bx_u128 v, int q, int low,
                                        const bx_sink *s) {
  if (q < w->base) {
    bx_sink_deposit_u128(s, v, q);
    return;
  }
  bx_win192_flush(w, s);
  w->base = bx_win_place(q, low);
  bx_win192_put(w, v, (unsigned)(q - w->base));
}
static inline BX_HD void bx_win192_add(bx_win192 *w, bx_u128 v, int q, int smax, int low,
                                       const bx_sink *s) {
  unsigned sft = (unsigned)(q - w->base);
  if (sft <= (unsigned)smax) bx_win192_put(w, v, sft);
  else bx_win192_slow(w, v, q, low, s);
}

/* Window widths: smax = W - (bits of v) - BX_CU_HEADROOM. low: the new
 * element sits low bits above the window's bottom, (smax - low) / 2
 * binades of larger squares fit above it. */
#define BX_SQ_F32_SMAX 73   /* 128 - 48 - 7 */
#define BX_SQ_F32_LOW 61
#define BX_SQ_BF16_SMAX 41  /* 64 - 16 - 7 */
#define BX_SQ_BF16_LOW 31
#define BX_SQ_F16_SMAX 35   /* 64 - 22 - 7 */
#define BX_SQ_F16_LOW 25
#define BX_SQ_F64_SMAX 79   /* 192 - 106 - 7 */
#define BX_SQ_F64_LOW 65
#define BX_ABS_SMAX 68      /* 128 - 53 - 7: |x| of any dtype (and fp64 terms) */
#define BX_ABS_LOW 60

/* ---- per-dtype element decoding -----------------------------------------
 * The bit position of x's ulp in the accumulator's units for |x| (qa) and
 * for x^2 (2 * qa' where qa' counts from 0: see each function). Subnormals
 * use the smallest normal exponent with no hidden bit. */

/* fp32: x = m * 2^(E - 150), E = max(field, 1). */
static inline BX_HD int bx_dec_f32(uint32_t b, uint64_t *m, int *e_ulp) {
  uint32_t ef = (b >> 23) & 0xFF;
  *m = (b & 0x7FFFFF) | (ef ? 0x800000u : 0u);
  *e_ulp = (int)(ef ? ef : 1) - 150;
  return ef == 0xFF; /* NaN or Inf */
}
/* bf16: x = m * 2^(E - 134). */
static inline BX_HD int bx_dec_bf16(uint16_t b, uint64_t *m, int *e_ulp) {
  uint32_t ef = (b >> 7) & 0xFF;
  *m = (b & 0x7F) | (ef ? 0x80u : 0u);
  *e_ulp = (int)(ef ? ef : 1) - 134;
  return ef == 0xFF;
}
/* fp16: x = m * 2^(E - 25). */
static inline BX_HD int bx_dec_f16(uint16_t b, uint64_t *m, int *e_ulp) {
  uint32_t ef = (b >> 10) & 0x1F;
  *m = (b & 0x3FF) | (ef ? 0x400u : 0u);
  *e_ulp = (int)(ef ? ef : 1) - 25;
  return ef == 0x1F;
}
/* fp64: x = m * 2^(E - 1075). */
static inline BX_HD int bx_dec_f64(uint64_t b, uint64_t *m, int *e_ulp) {
  uint32_t ef = (uint32_t)(b >> 52) & 0x7FF;
  *m = (b & 0xFFFFFFFFFFFFFull) | (ef ? (1ull << 52) : 0ull);
  *e_ulp = (int)(ef ? ef : 1) - 1075;
  return ef == 0x7FF;
}

/* A NaN/Inf element: counted, never summed. mantissa_bits: the fraction
 * field (non-zero means NaN). */
static inline BX_HD void bx_count_special(const bx_sink *s, int is_nan) {
  bx_sink_add(is_nan ? s->nan : s->inf, 1);
}

/* ---- one element into a window, per dtype (squares) --------------------
 * Normal numbers take the short path (no subnormal or zero selects); zeros,
 * subnormals and NaN/Inf the general one. */

static inline BX_HD void bx_sq_f32_rare(bx_win128 *w, uint32_t b, const bx_sink *s) {
  uint64_t m;
  int e;
  if (bx_dec_f32(b, &m, &e)) {
    bx_count_special(s, (b & 0x7FFFFF) != 0);
    return;
  }
  if (m) bx_win128_add(w, m * m, 2 * e - BX_ACC_LSB_EXP, BX_SQ_F32_SMAX, BX_SQ_F32_LOW, s);
}
static inline BX_HD void bx_sq_f32_one(bx_win128 *w, uint32_t b, const bx_sink *s) {
  uint32_t ef = (b >> 23) & 0xFF;
  if (ef - 1u < 254u) {
    uint64_t m = (b & 0x7FFFFF) | 0x800000;
    bx_win128_add(w, m * m, 2 * ((int)ef - 150) - BX_ACC_LSB_EXP, BX_SQ_F32_SMAX, BX_SQ_F32_LOW,
                  s);
  } else {
    bx_sq_f32_rare(w, b, s);
  }
}

static inline BX_HD void bx_sq_bf16_rare(bx_win64 *w, uint16_t b, const bx_sink *s) {
  uint64_t m;
  int e;
  if (bx_dec_bf16(b, &m, &e)) {
    bx_count_special(s, (b & 0x7F) != 0);
    return;
  }
  if (m) bx_win64_add(w, m * m, 2 * e - BX_ACC_LSB_EXP, BX_SQ_BF16_SMAX, BX_SQ_BF16_LOW, s);
}
static inline BX_HD void bx_sq_bf16_one(bx_win64 *w, uint16_t b, const bx_sink *s) {
  uint32_t ef = (b >> 7) & 0xFF;
  if (ef - 1u < 254u) {
    uint64_t m = (b & 0x7F) | 0x80;
    bx_win64_add(w, m * m, 2 * ((int)ef - 134) - BX_ACC_LSB_EXP, BX_SQ_BF16_SMAX,
                 BX_SQ_BF16_LOW, s);
  } else {
    bx_sq_bf16_rare(w, b, s);
  }
}

static inline BX_HD void bx_sq_f16_rare(bx_win64 *w, uint16_t b, const bx_sink *s) {
  uint64_t m;
  int e;
  if (bx_dec_f16(b, &m, &e)) {
    bx_count_special(s, (b & 0x3FF) != 0);
    return;
  }
  if (m) bx_win64_add(w, m * m, 2 * e - BX_ACC_LSB_EXP, BX_SQ_F16_SMAX, BX_SQ_F16_LOW, s);
}
static inline BX_HD void bx_sq_f16_one(bx_win64 *w, uint16_t b, const bx_sink *s) {
  uint32_t ef = (b >> 10) & 0x1F;
  if (ef - 1u < 30u) {
    uint64_t m = (b & 0x3FF) | 0x400;
    bx_win64_add(w, m * m, 2 * ((int)ef - 25) - BX_ACC_LSB_EXP, BX_SQ_F16_SMAX, BX_SQ_F16_LOW,
                 s);
  } else {
    bx_sq_f16_rare(w, b, s);
  }
}

static inline BX_HD void bx_sq_f64_rare(bx_win192 *w, uint64_t b, const bx_sink *s) {
  uint64_t m;
  int e;
  if (bx_dec_f64(b, &m, &e)) {
    bx_count_special(s, (b & 0xFFFFFFFFFFFFFull) != 0);
    return;
  }
  if (m) bx_win192_add(w, (bx_u128)m * m, 2 * e - BX_ACC_LSB_EXP, BX_SQ_F64_SMAX, BX_SQ_F64_LOW, s);
}
static inline BX_HD void bx_sq_f64_one(bx_win192 *w, uint64_t b, const bx_sink *s) {
  uint32_t ef = (uint32_t)(b >> 52) & 0x7FF;
  if (ef - 1u < 2046u) {
    uint64_t m = (b & 0xFFFFFFFFFFFFFull) | (1ull << 52);
    bx_win192_add(w, (bx_u128)m * m, 2 * ((int)ef - 1075) - BX_ACC_LSB_EXP, BX_SQ_F64_SMAX,
                  BX_SQ_F64_LOW, s);
  } else {
    bx_sq_f64_rare(w, b, s);
  }
}

/* ---- 16-byte loads ---------------------------------------------------------
 * The square loops read whole 16-byte vectors when the chunk is 16-byte
 * aligned (one load instruction per 4 fp32 / 8 bf16 on the GPU, two in
 * flight per thread), then the < 16-byte tail element by element. */
typedef struct bx_vec16 {
  uint32_t w[4];
} bx_vec16;

static inline BX_HD int bx_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static inline BX_HD bx_vec16 bx_load16(const void *p) {
  bx_vec16 v;
#ifdef __CUDA_ARCH__
  uint4 u = __ldg((const uint4 *)p);
  v.w[0] = u.x;
  v.w[1] = u.y;
  v.w[2] = u.z;
  v.w[3] = u.w;
#else
  __builtin_memcpy(&v, p, 16);
#endif
  return v;
}

/* The doubles of a vector (little-endian element order). */
static inline BX_HD uint64_t bx_vec_u64(const bx_vec16 *v, int k) {
  return (uint64_t)v->w[2 * k] | ((uint64_t)v->w[2 * k + 1] << 32);
}

/* One vector's elements into a window, written out (no loop: the vector
 * must stay in registers; a loop over its lanes may be left rolled and put
 * it in local memory). */
static inline BX_HD void bx_sq_f32_vec(bx_win128 *w, const bx_vec16 *v, const bx_sink *s) {
  bx_sq_f32_one(w, v->w[0], s);
  bx_sq_f32_one(w, v->w[1], s);
  bx_sq_f32_one(w, v->w[2], s);
  bx_sq_f32_one(w, v->w[3], s);
}
static inline BX_HD void bx_sq_bf16_vec(bx_win64 *w, const bx_vec16 *v, const bx_sink *s) {
  bx_sq_bf16_one(w, (uint16_t)v->w[0], s);
  bx_sq_bf16_one(w, (uint16_t)(v->w[0] >> 16), s);
  bx_sq_bf16_one(w, (uint16_t)v->w[1], s);
  bx_sq_bf16_one(w, (uint16_t)(v->w[1] >> 16), s);
  bx_sq_bf16_one(w, (uint16_t)v->w[2], s);
  bx_sq_bf16_one(w, (uint16_t)(v->w[2] >> 16), s);
  bx_sq_bf16_one(w, (uint16_t)v->w[3], s);
  bx_sq_bf16_one(w, (uint16_t)(v->w[3] >> 16), s);
}
static inline BX_HD void bx_sq_f16_vec(bx_win64 *w, const bx_vec16 *v, const bx_sink *s) {
  bx_sq_f16_one(w, (uint16_t)v->w[0], s);
  bx_sq_f16_one(w, (uint16_t)(v->w[0] >> 16), s);
  bx_sq_f16_one(w, (uint16_t)v->w[1], s);
  bx_sq_f16_one(w, (uint16_t)(v->w[1] >> 16), s);
  bx_sq_f16_one(w, (uint16_t)v->w[2], s);
  bx_sq_f16_one(w, (uint16_t)(v->w[2] >> 16), s);
  bx_sq_f16_one(w, (uint16_t)v->w[3], s);
  bx_sq_f16_one(w, (uint16_t)(v->w[3] >> 16), s);
}
static inline BX_HD void bx_sq_f64_vec(bx_win192 *w, const bx_vec16 *v, const bx_sink *s) {
  bx_sq_f64_one(w, bx_vec_u64(v, 0), s);
  bx_sq_f64_one(w, bx_vec_u64(v, 1), s);
}

/* ---- one thread's share of a chunk: vectors first, first + stride, ... of
 * x[0..n) (two per step), then tail elements. These are the loops of the
 * GPU kernel. --------------------------------------------------------------- */

static inline BX_HD void bx_thread_sumsq_f32(const uint32_t *x, uint32_t n, uint32_t first,
                                             uint32_t stride, const bx_sink *s) {
  bx_win128 w;
  bx_win128_init(&w);
  uint32_t nvec = bx_aligned16(x) ? n / 4 : 0;
  for (uint32_t v = first; v < nvec; v += 2 * stride) {
    int two = v + stride < nvec;
    bx_vec16 a = bx_load16(x + 4 * (size_t)v), b = a;
    if (two) b = bx_load16(x + 4 * (size_t)(v + stride));
    bx_sq_f32_vec(&w, &a, s);
    if (two) bx_sq_f32_vec(&w, &b, s);
  }
  for (uint32_t i = 4 * nvec + first; i < n; i += stride) bx_sq_f32_one(&w, x[i], s);
  bx_win128_flush(&w, s);
}

static inline BX_HD void bx_thread_sumsq_bf16(const uint16_t *x, uint32_t n, uint32_t first,
                                              uint32_t stride, const bx_sink *s) {
  bx_win64 w;
  bx_win64_init(&w);
  uint32_t nvec = bx_aligned16(x) ? n / 8 : 0;
  for (uint32_t v = first; v < nvec; v += 2 * stride) {
    int two = v + stride < nvec;
    bx_vec16 a = bx_load16(x + 8 * (size_t)v), b = a;
    if (two) b = bx_load16(x + 8 * (size_t)(v + stride));
    bx_sq_bf16_vec(&w, &a, s);
    if (two) bx_sq_bf16_vec(&w, &b, s);
  }
  for (uint32_t i = 8 * nvec + first; i < n; i += stride) bx_sq_bf16_one(&w, x[i], s);
  bx_win64_flush(&w, s);
}

static inline BX_HD void bx_thread_sumsq_f16(const uint16_t *x, uint32_t n, uint32_t first,
                                             uint32_t stride, const bx_sink *s) {
  bx_win64 w;
  bx_win64_init(&w);
  uint32_t nvec = bx_aligned16(x) ? n / 8 : 0;
  for (uint32_t v = first; v < nvec; v += 2 * stride) {
    int two = v + stride < nvec;
    bx_vec16 a = bx_load16(x + 8 * (size_t)v), b = a;
    if (two) b = bx_load16(x + 8 * (size_t)(v + stride));
    bx_sq_f16_vec(&w, &a, s);
    if (two) bx_sq_f16_vec(&w, &b, s);
  }
  for (uint32_t i = 8 * nvec + first; i < n; i += stride) bx_sq_f16_one(&w, x[i], s);
  bx_win64_flush(&w, s);
}

static inline BX_HD void bx_thread_sumsq_f64(const uint64_t *x, uint32_t n, uint32_t first,
                                             uint32_t stride, const bx_sink *s) {
  bx_win192 w;
  bx_win192_init(&w);
  uint32_t nvec = bx_aligned16(x) ? n / 2 : 0;
  for (uint32_t v = first; v < nvec; v += 2 * stride) {
    int two = v + stride < nvec;
    bx_vec16 a = bx_load16(x + 2 * (size_t)v), b = a;
    if (two) b = bx_load16(x + 2 * (size_t)(v + stride));
    bx_sq_f64_vec(&w, &a, s);
    if (two) bx_sq_f64_vec(&w, &b, s);
  }
  for (uint32_t i = 2 * nvec + first; i < n; i += stride) bx_sq_f64_one(&w, x[i], s);
  bx_win192_flush(&w, s);
}

/* ---- the fp64 grid: squares of values with <= 24 significant bits --------
 * (fp32, bf16, fp16). The square s = x*x is exact in fp64 (<= 48 bits).
 * Each thread keeps a window [0, 2^E) for its squares and two fp64
 * accumulators on fixed grids (the extraction of Demmel & Nguyen's
 * reproducible summation, here used to stay exact):
 *   q1 = (s + M1) - M1, r1 = s - q1     M1 = 1.5 * 2^(E+K)
 *   q2 = (r1 + M2) - M2, r2 = r1 - q2   M2 = 1.5 * 2^(E+2K-53)
 * With 0 <= s < 2^E <= 2^(E+K-1), fl(s + M1) stays in M1's binade, so q1
 * is s rounded to a multiple of 2^(E+K-52) and q1, r1 are exact (Fast2Sum);
 * |r1| <= 2^(E+K-53) and the same holds one level down. At most 2^K terms
 * (a thread's elements per chunk, BX_CU_HEADROOM = K) keep acc1 below
 * 2^(E+K) on the grid 2^(E+K-52) and acc2 below 2^(E+2K-53) on the grid
 * 2^(E+2K-105): 53 bits each, every addition exact. r2 != 0 (bits of s
 * below 2^(E+2K-105): squares ~2^-44 below the window top) goes to the
 * block's digits exactly. Every operation is an IEEE fp64 add/mul rounded
 * to nearest (no FMA: --fmad=false, -ffp-contract=off), so the CPU runs
 * the same steps with the same results: tests/test_cuda_sim.c. Per element
 * about a dozen fp64 operations instead of ~25 integer ones. */
#define BX_GRID_K BX_CU_HEADROOM
#define BX_GRID_UP 13 /* the placing square sits 2^-13 below the window top */

typedef struct bx_grid {
  double top;      /* 2^E; 0 while not placed */
  double m1, m2;   /* 1.5 * 2^(E+K), 1.5 * 2^(E+2K-53) */
  double acc1, acc2;
} bx_grid;

/* 2^e for a normal exponent, from its bits. */
static inline BX_HD double bx_pow2(int e) { return bx_f64_from_bits((uint64_t)(e + 1023) << 52); }

/* d (a finite double, any sign) into the sink, exactly. */
static inline BX_HD void bx_sink_deposit_f64(const bx_sink *s, double d) {
  uint64_t b = bx_f64_bits(d);
  int ef = (int)((b >> 52) & 0x7FF);
  uint64_t m = (b & 0xFFFFFFFFFFFFFull) | (ef ? 1ull << 52 : 0);
  if (!m) return;
  int pos = (ef ? ef : 1) - 1075 - BX_ACC_LSB_EXP;
  if (!(b >> 63)) {
    bx_sink_deposit_u128(s, (bx_u128)m, pos);
    return;
  }
  /* negative: the same pieces, subtracted (carry-save words may go below
   * zero; normalisation later settles them) */
  int d32 = pos >> 5, sh = pos & 31;
  bx_u128 v = (bx_u128)m << sh; /* m < 2^53, sh < 32: fits */
  for (int k = 0; k < 3; k++) {
    int64_t piece = (int64_t)(uint32_t)(v >> (32 * k));
    if (piece) bx_sink_add(&s->digits[d32 + k], -piece);
  }
}

static inline BX_HD void bx_grid_init(bx_grid *g) {
  g->top = 0.0;
  g->m1 = g->m2 = 0.0;
  g->acc1 = g->acc2 = 0.0;
}

static inline BX_HD void bx_grid_flush(bx_grid *g, const bx_sink *s) {
  bx_sink_deposit_f64(s, g->acc1);
  bx_sink_deposit_f64(s, g->acc2);
  g->acc1 = g->acc2 = 0.0;
}

/* s (finite, > 0) at or above the window's top, or no window yet:
 * flush and place the window above s. */
static inline BX_HD void bx_grid_place(bx_grid *g, double s, const bx_sink *s_) {
  bx_grid_flush(g, s_);
  int e = (int)((bx_f64_bits(s) >> 52) & 0x7FF) - 1023; /* s is normal: >= 2^-298 */
  int top = e + 1 + BX_GRID_UP;
  g->top = bx_pow2(top);
  g->m1 = 1.5 * bx_pow2(top + BX_GRID_K);
  g->m2 = 1.5 * bx_pow2(top + 2 * BX_GRID_K - 53);
}

static inline BX_HD void bx_grid_add(bx_grid *g, double s, const bx_sink *sink) {
  if (!(s < g->top)) {
    if (s == 0.0) return; /* only before the window is placed */
    bx_grid_place(g, s, sink);
  }
  double q1 = (s + g->m1) - g->m1, r1 = s - q1;
  double q2 = (r1 + g->m2) - g->m2, r2 = r1 - q2;
  g->acc1 += q1;
  g->acc2 += q2;
  if (r2 != 0.0) bx_sink_deposit_f64(sink, r2);
}

/* One element (its exact fp32 value, or the NaN/Inf flag) into the grid. */
static inline BX_HD void bx_grid_f32_one(bx_grid *g, uint32_t b, const bx_sink *s) {
  if (((b >> 23) & 0xFF) == 0xFF) {
    bx_count_special(s, (b & 0x7FFFFF) != 0);
    return;
  }
  double x = (double)bx_f32_from_bits(b);
  bx_grid_add(g, x * x, s);
}
static inline BX_HD void bx_grid_bf16_one(bx_grid *g, uint16_t b, const bx_sink *s) {
  bx_grid_f32_one(g, (uint32_t)b << 16, s); /* bf16 is the top half of an fp32 */
}
static inline BX_HD void bx_grid_f16_one(bx_grid *g, uint16_t b, const bx_sink *s) {
  if (((b >> 10) & 0x1F) == 0x1F) {
    bx_count_special(s, (b & 0x3FF) != 0);
    return;
  }
  double x = (double)bx_f16_to_f32(b); /* exact */
  bx_grid_add(g, x * x, s);
}

static inline BX_HD void bx_grid_f32_vec(bx_grid *g, const bx_vec16 *v, const bx_sink *s) {
  bx_grid_f32_one(g, v->w[0], s);
  bx_grid_f32_one(g, v->w[1], s);
  bx_grid_f32_one(g, v->w[2], s);
  bx_grid_f32_one(g, v->w[3], s);
}
static inline BX_HD void bx_grid_bf16_vec(bx_grid *g, const bx_vec16 *v, const bx_sink *s) {
  bx_grid_bf16_one(g, (uint16_t)v->w[0], s);
  bx_grid_bf16_one(g, (uint16_t)(v->w[0] >> 16), s);
  bx_grid_bf16_one(g, (uint16_t)v->w[1], s);
  bx_grid_bf16_one(g, (uint16_t)(v->w[1] >> 16), s);
  bx_grid_bf16_one(g, (uint16_t)v->w[2], s);
  bx_grid_bf16_one(g, (uint16_t)(v->w[2] >> 16), s);
  bx_grid_bf16_one(g, (uint16_t)v->w[3], s);
  bx_grid_bf16_one(g, (uint16_t)(v->w[3] >> 16), s);
}
static inline BX_HD void bx_grid_f16_vec(bx_grid *g, const bx_vec16 *v, const bx_sink *s) {
  bx_grid_f16_one(g, (uint16_t)v->w[0], s);
  bx_grid_f16_one(g, (uint16_t)(v->w[0] >> 16), s);
  bx_grid_f16_one(g, (uint16_t)v->w[1], s);
  bx_grid_f16_one(g, (uint16_t)(v->w[1] >> 16), s);
  bx_grid_f16_one(g, (uint16_t)v->w[2], s);
  bx_grid_f16_one(g, (uint16_t)(v->w[2] >> 16), s);
  bx_grid_f16_one(g, (uint16_t)v->w[3], s);
  bx_grid_f16_one(g, (uint16_t)(v->w[3] >> 16), s);
}

static inline BX_HD void bx_thread_gridsq_f32(const uint32_t *x, uint32_t n, uint32_t first,
                                              uint32_t stride, const bx_sink *s) {
  bx_grid g;
  bx_grid_init(&g);
  uint32_t nvec = bx_aligned16(x) ? n / 4 : 0;
  for (uint32_t v = first; v < nvec; v += 2 * stride) {
    int two = v + stride < nvec;
    bx_vec16 a = bx_load16(x + 4 * (size_t)v), b = a;
    if (two) b = bx_load16(x + 4 * (size_t)(v + stride));
    bx_grid_f32_vec(&g, &a, s);
    if (two) bx_grid_f32_vec(&g, &b, s);
  }
  for (uint32_t i = 4 * nvec + first; i < n; i += stride) bx_grid_f32_one(&g, x[i], s);
  bx_grid_flush(&g, s);
}

static inline BX_HD void bx_thread_gridsq_bf16(const uint16_t *x, uint32_t n, uint32_t first,
                                               uint32_t stride, const bx_sink *s) {
  bx_grid g;
  bx_grid_init(&g);
  uint32_t nvec = bx_aligned16(x) ? n / 8 : 0;
  for (uint32_t v = first; v < nvec; v += 2 * stride) {
    int two = v + stride < nvec;
    bx_vec16 a = bx_load16(x + 8 * (size_t)v), b = a;
    if (two) b = bx_load16(x + 8 * (size_t)(v + stride));
    bx_grid_bf16_vec(&g, &a, s);
    if (two) bx_grid_bf16_vec(&g, &b, s);
  }
  for (uint32_t i = 8 * nvec + first; i < n; i += stride) bx_grid_bf16_one(&g, x[i], s);
  bx_grid_flush(&g, s);
}

static inline BX_HD void bx_thread_gridsq_f16(const uint16_t *x, uint32_t n, uint32_t first,
                                              uint32_t stride, const bx_sink *s) {
  bx_grid g;
  bx_grid_init(&g);
  uint32_t nvec = bx_aligned16(x) ? n / 8 : 0;
  for (uint32_t v = first; v < nvec; v += 2 * stride) {
    int two = v + stride < nvec;
    bx_vec16 a = bx_load16(x + 8 * (size_t)v), b = a;
    if (two) b = bx_load16(x + 8 * (size_t)(v + stride));
    bx_grid_f16_vec(&g, &a, s);
    if (two) bx_grid_f16_vec(&g, &b, s);
  }
  for (uint32_t i = 8 * nvec + first; i < n; i += stride) bx_grid_f16_one(&g, x[i], s);
  bx_grid_flush(&g, s);
}

/* sum |x| (p = 1): v = m at q = e - LSB, one 128-bit window for all dtypes */
static inline BX_HD void bx_abs_add(bx_win128 *w, uint64_t m, int e, const bx_sink *s) {
  int q = m ? e - BX_ACC_LSB_EXP : w->base;
  bx_win128_add(w, m, q, BX_ABS_SMAX, BX_ABS_LOW, s);
}

/* Element i of a span of dtype dt (BX_DT_* numbering: 0 f16, 1 bf16, 2 f32,
 * 3 f64) decoded: x = m * 2^e; returns 1 for NaN/Inf (*is_nan tells). */
static inline BX_HD int bx_dec_elem(const void *x, int dt, uint32_t i, uint64_t *m, int *e,
                                    int *is_nan) {
  int special;
  switch (dt) {
    case 0: {
      uint16_t b = ((const uint16_t *)x)[i];
      special = bx_dec_f16(b, m, e);
      *is_nan = (b & 0x3FF) != 0;
      break;
    }
    case 1: {
      uint16_t b = ((const uint16_t *)x)[i];
      special = bx_dec_bf16(b, m, e);
      *is_nan = (b & 0x7F) != 0;
      break;
    }
    case 2: {
      uint32_t b = ((const uint32_t *)x)[i];
      special = bx_dec_f32(b, m, e);
      *is_nan = (b & 0x7FFFFF) != 0;
      break;
    }
    default: {
      uint64_t b = ((const uint64_t *)x)[i];
      special = bx_dec_f64(b, m, e);
      *is_nan = (b & 0xFFFFFFFFFFFFFull) != 0;
      break;
    }
  }
  return special;
}

/* sum |x| (p = 1), any dtype: the dtype switch is uniform across a block
 * (one chunk, one dtype), and p = 1 is not the hot path. */
static inline BX_HD void bx_thread_sumabs(const void *x, int dt, uint32_t n, uint32_t first,
                                          uint32_t stride, const bx_sink *s) {
  bx_win128 w;
  bx_win128_init(&w);
  for (uint32_t i = first; i < n; i += stride) {
    uint64_t m;
    int e, is_nan;
    if (bx_dec_elem(x, dt, i, &m, &e, &is_nan)) bx_count_special(s, is_nan);
    else bx_abs_add(&w, m, e, s);
  }
  bx_win128_flush(&w, s);
}

/* Element i of a span of dtype dt (BX_DT_* of dtype.h: 0 f16, 1 bf16,
 * 2 f32, 3 f64) widened to double, exactly. */
static inline BX_HD double bx_elem_as_double(const void *x, int dt, uint32_t i) {
  switch (dt) {
    case 0: { /* fp16 */
      uint16_t h = ((const uint16_t *)x)[i];
      int e = (h >> 10) & 0x1F, m = h & 0x3FF;
      double v;
      if (e == 0x1F) v = m ? bx_f64_from_bits(0x7FF8000000000000ull)
                           : bx_f64_from_bits(0x7FF0000000000000ull);
      else if (e == 0) v = (double)m * 5.9604644775390625e-08; /* 2^-24 */
      else v = (double)(m | 0x400) * bx_f64_from_bits((uint64_t)(e - 25 + 1023) << 52);
      return (h & 0x8000) ? -v : v;
    }
    case 1: /* bf16 */
      return (double)bx_f32_from_bits((uint32_t)((const uint16_t *)x)[i] << 16);
    case 2:
      return (double)bx_f32_from_bits(((const uint32_t *)x)[i]);
    default:
      return bx_f64_from_bits(((const uint64_t *)x)[i]);
  }
}

/* BX_MEGATRON_FP32: fl32(fl32(x)^2), summed exactly like |.| of fp32. */
static inline BX_HD void bx_thread_megatron(const void *x, int dt, uint32_t n, uint32_t first,
                                            uint32_t stride, const bx_sink *s) {
  bx_win128 w;
  bx_win128_init(&w);
  for (uint32_t i = first; i < n; i += stride) {
    float f = (float)bx_elem_as_double(x, dt, i);
    float sq = f * f; /* one fp32 rounding (no contraction: -ffp-contract=off, --fmad=false) */
    uint32_t b = bx_f32_bits(sq);
    uint64_t m;
    int e;
    if (bx_dec_f32(b, &m, &e)) bx_count_special(s, (b & 0x7FFFFF) != 0);
    else bx_abs_add(&w, m, e, s);
  }
  bx_win128_flush(&w, s);
}

/* p = ±inf and p = 0: one thread's max |x|, min |x| (non-NaN), NaN count and
 * non-zero count. |x| as double bits: non-negative doubles order like their
 * bit patterns, so integer max/min (atomicMax/atomicMin) are exact. */
typedef struct bx_extremes {
  uint64_t maxbits, minbits; /* minbits starts at +Inf */
  int64_t nan, nonzero;
} bx_extremes;

static inline BX_HD void bx_thread_extremes(const void *x, int dt, uint32_t n, uint32_t first,
                                            uint32_t stride, bx_extremes *r) {
  for (uint32_t i = first; i < n; i += stride) {
    double a = fabs(bx_elem_as_double(x, dt, i));
    if (a != a) {
      r->nan++;
      continue;
    }
    uint64_t b = bx_f64_bits(a);
    if (b > r->maxbits) r->maxbits = b;
    if (b < r->minbits) r->minbits = b;
    r->nonzero += b != 0;
  }
}

/* other p > 0: |x|^p per element (bx_pow_det: the CPU's bits too),
 * each term summed exactly like |.| of fp64. */
static inline BX_HD void bx_thread_pow(const void *x, int dt, uint32_t n, uint32_t first,
                                       uint32_t stride, double p, const bx_sink *s) {
  bx_win128 w;
  bx_win128_init(&w);
  for (uint32_t i = first; i < n; i += stride) {
    uint64_t b = bx_f64_bits(bx_pow_det(fabs(bx_elem_as_double(x, dt, i)), p));
    uint64_t m;
    int e;
    if (bx_dec_f64(b, &m, &e)) bx_count_special(s, (b & 0xFFFFFFFFFFFFFull) != 0);
    else bx_abs_add(&w, m, e, s);
  }
  bx_win128_flush(&w, s);
}

#endif /* BX_EXACT_WINDOW_H */
