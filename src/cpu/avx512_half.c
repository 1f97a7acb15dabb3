/*
 * avx512_half.c — exact sum of squares of bf16 and fp16 tensors, AVX-512.
 * Scheme and proofs: exact_grid.h. Blocks of 2048 (k = 64 per lane).
 */
#include <string.h>

#include "avx512_util.h"

#define F32_BLOCK BX_AVX512_BLOCK
#define F16_BLOCK BX_AVX512_BLOCK

/* ======================================================================
 * bf16: widened to fp32 by a 16-bit shift (interleaving with zeros; the
 * lane order does not matter to a sum), then to fp64.
 * ====================================================================== */

static void bf16_stats(const uint16_t *x, size_t len, uint32_t *amax, uint32_t *aminnz) {
  const __m512i absm = _mm512_set1_epi16(0x7FFF), one = _mm512_set1_epi16(1);
  __m512i mx = _mm512_setzero_si512(), mn = _mm512_set1_epi16(-1);
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m512i a = _mm512_and_si512(_mm512_loadu_si512(x + i), absm);
    mx = _mm512_max_epu16(mx, a);
    mn = _mm512_min_epu16(mn, _mm512_sub_epi16(a, one));
  }
  if (i < len) {
    __m512i a = _mm512_and_si512(_mm512_maskz_loadu_epi16(tail_mask32(len - i), x + i), absm);
    mx = _mm512_max_epu16(mx, a);
    mn = _mm512_min_epu16(mn, _mm512_sub_epi16(a, one));
  }
  /* widen to 32-bit lanes for the reductions */
  __m512i mx32 = _mm512_max_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(mx)),
                                  _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(mx, 1)));
  __m512i mn32 = _mm512_min_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(mn)),
                                  _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(mn, 1)));
  *amax = _mm512_reduce_max_epu32(mx32);
  *aminnz = (_mm512_reduce_min_epu32(mn32) + 1u) & 0xFFFF;
}

/* 32 bf16 → two vectors of 16 fp32 (bit patterns), in some lane order. */
static inline void bf16_widen(__m512i v, __m512i *lo, __m512i *hi) {
  *lo = _mm512_unpacklo_epi16(_mm512_setzero_si512(), v);
  *hi = _mm512_unpackhi_epi16(_mm512_setzero_si512(), v);
}

static inline __m512d cvt_lo(__m512i f) {
  return _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_castsi512_ps(f)));
}
static inline __m512d cvt_hi(__m512i f) {
  return _mm512_cvtps_pd(_mm512_extractf32x8_ps(_mm512_castsi512_ps(f), 1));
}

/* One-level: every non-zero x^2 a multiple of 2^G; fma(x,x,hi) is exact. */
static bx_i128 bf16_window1_all(const uint16_t *x, size_t len, int g) {
  const __m512d ah = anchor_pd(g);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah;
  for (size_t i = 0; i < len; i += 32) {
    __m512i v = len - i >= 32 ? _mm512_loadu_si512(x + i)
                              : _mm512_maskz_loadu_epi16(tail_mask32(len - i), x + i);
    __m512i a, b;
    bf16_widen(v, &a, &b);
    __m512d d0 = cvt_lo(a), d1 = cvt_hi(a), d2 = cvt_lo(b), d3 = cvt_hi(b);
    h0 = _mm512_fmadd_pd(d0, d0, h0);
    h1 = _mm512_fmadd_pd(d1, d1, h1);
    h2 = _mm512_fmadd_pd(d2, d2, h2);
    h3 = _mm512_fmadd_pd(d3, d3, h3);
  }
  return combine45(lanes_sum(h0, h1, h2, h3, g), 0);
}

/* Windows without conversions, for blocks without subnormals. A 64-bit
 * lane holds 4 bf16 words; word j shifted to bits 45..60 and masked to
 * bits 45..59 lines its exponent and mantissa fields up with a double's:
 * y = |x| 2^-896 exactly. y' = y with bits 61, 62 set has exponent field e
 * + 1536: |x| 2^640 for normal x (x = 0 gives y = 0, so y*y' = 0 whatever
 * y' is). The fma sees y*y' = x^2 2^-256 exactly: the window of G moved by
 * -256 (all grids stay normal: G - 256 - 45 >= -595). */
static inline void bf16_split4(__m512i v, __m512i w[4]) {
  w[0] = _mm512_slli_epi64(v, 45);
  w[1] = _mm512_slli_epi64(v, 29);
  w[2] = _mm512_slli_epi64(v, 13);
  w[3] = _mm512_srli_epi64(v, 3);
}
static inline __m512d bf16_y(__m512i w) {
  return _mm512_castsi512_pd(_mm512_and_si512(w, _mm512_set1_epi64(0x0FFFE00000000000ll)));
}
static inline __m512d bf16_yp(__m512i w) { /* (w & fields) | bits 61,62 */
  return _mm512_castsi512_pd(_mm512_ternarylogic_epi64(w, _mm512_set1_epi64(0x0FFFE00000000000ll),
                                                       _mm512_set1_epi64(0x6000000000000000ll), 0xEA));
}
static inline __m512i bf16_ld32(const uint16_t *x, size_t left) {
  return left >= 32 ? _mm512_loadu_si512(x) : _mm512_maskz_loadu_epi16(tail_mask32(left), x);
}

static inline __m512d bf16_sq1(__m512i w, __m512d h) {
  return _mm512_fmadd_pd(bf16_y(w), bf16_yp(w), h);
}

static bx_i128 bf16_window1_fast(const uint16_t *x, size_t len, int g) {
  const __m512d ah = anchor_pd(g - 256);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah;
  for (size_t i = 0; i < len; i += 32) {
    __m512i w[4];
    bf16_split4(bf16_ld32(x + i, len - i), w);
    h0 = bf16_sq1(w[0], h0);
    h1 = bf16_sq1(w[1], h1);
    h2 = bf16_sq1(w[2], h2);
    h3 = bf16_sq1(w[3], h3);
  }
  return combine45(lanes_sum(h0, h1, h2, h3, g - 256), 0);
}

/* Two levels (fma form on the exact product y*y'). */
static inline void bf16_sq2(__m512i w, __m512d *hi, __m512d *lo) {
  __m512d y = bf16_y(w), yp = bf16_yp(w);
  __m512d t = _mm512_fmadd_pd(y, yp, *hi);
  *lo = _mm512_add_pd(*lo, _mm512_fmadd_pd(y, yp, _mm512_sub_pd(*hi, t)));
  *hi = t;
}

/* Every non-zero element inside the two-level window of G. */
static bx_i128 bf16_window2_fast(const uint16_t *x, size_t len, int g) {
  const __m512d ah = anchor_pd(g - 256), al = anchor_pd(g - 301);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  for (size_t i = 0; i < len; i += 32) {
    __m512i w[4];
    bf16_split4(bf16_ld32(x + i, len - i), w);
    bf16_sq2(w[0], &h0, &l0);
    bf16_sq2(w[1], &h1, &l1);
    bf16_sq2(w[2], &h2, &l2);
    bf16_sq2(w[3], &h3, &l3);
  }
  return combine45(lanes_sum(h0, h1, h2, h3, g - 256), lanes_sum(l0, l1, l2, l3, g - 301));
}

/* Three levels (spikes, wide blocks), same product. */
static inline void bf16_sq3(__m512i w, __m512d *hi, __m512d *mi, __m512d *lo) {
  const __m512d one = _mm512_set1_pd(1.0); /* u - v as fnmadd(v,1,u): the FMA pipes */
  __m512d y = bf16_y(w), yp = bf16_yp(w);
  __m512d t = _mm512_fmadd_pd(y, yp, *hi);
  __m512d e = _mm512_fmadd_pd(y, yp, _mm512_fnmadd_pd(t, one, *hi));
  __m512d t2 = _mm512_add_pd(*mi, e);
  *lo = _mm512_add_pd(*lo, _mm512_add_pd(e, _mm512_fnmadd_pd(t2, one, *mi)));
  *hi = t;
  *mi = t2;
}

static bx_i128 bf16_window3_fast(const uint16_t *x, size_t len, int g, bx_i128 *v2) {
  const __m512d ah = anchor_pd(g - 256), am = anchor_pd(g - 301), al = anchor_pd(g - 346);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, m0 = am, m1 = am, m2 = am, m3 = am;
  __m512d l0 = al, l1 = al, l2 = al, l3 = al;
  for (size_t i = 0; i < len; i += 32) {
    __m512i w[4];
    bf16_split4(bf16_ld32(x + i, len - i), w);
    bf16_sq3(w[0], &h0, &m0, &l0);
    bf16_sq3(w[1], &h1, &m1, &l1);
    bf16_sq3(w[2], &h2, &m2, &l2);
    bf16_sq3(w[3], &h3, &m3, &l3);
  }
  *v2 = lanes_sum(l0, l1, l2, l3, g - 346);
  return combine45(lanes_sum(h0, h1, h2, h3, g - 256), lanes_sum(m0, m1, m2, m3, g - 301));
}

/* 16 widened elements (fp32 bits f) under the window mask. */
static inline void bf16_masked16(__m512i f, __m512i thr, __m512i upper, __m512i *rest,
                                 __m512d *ha, __m512d *la, __m512d *hb, __m512d *lb) {
  __mmask16 below = _mm512_cmplt_epu32_mask(_mm512_and_si512(f, _mm512_set1_epi32(0x7FFFFFFF)), thr);
  __mmask16 in = _mm512_mask_cmplt_epu32_mask((__mmask16)~below,
                                              _mm512_and_si512(f, _mm512_set1_epi32(0x7FFFFFFF)), upper);
  *rest = _mm512_mask_max_epu32(*rest, below, *rest, _mm512_and_si512(f, _mm512_set1_epi32(0x7FFFFFFF)));
  __m512 fs = _mm512_castsi512_ps(f);
  sq2(_mm512_maskz_cvtps_pd((__mmask8)in, _mm512_castps512_ps256(fs)), ha, la);
  sq2(_mm512_maskz_cvtps_pd((__mmask8)(in >> 8), _mm512_extractf32x8_ps(fs, 1)), hb, lb);
}

/* Two-level window with masks; thr/upper are bf16 |x| bits. */
static bx_i128 bf16_window2_masked(const uint16_t *x, size_t len, int g, uint32_t thr,
                                uint32_t upper, uint32_t *restmax) {
  const __m512d ah = anchor_pd(g), al = anchor_pd(g - 45);
  const __m512i vt = _mm512_set1_epi32((int)(thr << 16)), vu = _mm512_set1_epi32((int)(upper << 16));
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  __m512i r = _mm512_setzero_si512();
  for (size_t i = 0; i < len; i += 32) {
    __m512i v = len - i >= 32 ? _mm512_loadu_si512(x + i)
                              : _mm512_maskz_loadu_epi16(tail_mask32(len - i), x + i);
    __m512i a, b;
    bf16_widen(v, &a, &b);
    bf16_masked16(a, vt, vu, &r, &h0, &l0, &h1, &l1);
    bf16_masked16(b, vt, vu, &r, &h2, &l2, &h3, &l3);
  }
  *restmax = _mm512_reduce_max_epu32(r) >> 16;
  return combine45(lanes_sum(h0, h1, h2, h3, g), lanes_sum(l0, l1, l2, l3, g - 45));
}


static int bf16_block(const uint16_t *x, size_t len, bx_acc *acc, bx_pending *p1, bx_pending *p2) {
  uint32_t amax, aminnz;
  bf16_stats(x, len, &amax, &aminnz);
  if (amax >= 0x7F80u || bx_bf16_too_wide(amax, aminnz)) {
    return 1; /* NaN/Inf, or spread too wide: the caller's scalar run */
  }
  if (amax == 0) return 0;
  int ebtop = amax >> 7 ? (int)(amax >> 7) : 1;
  int g = bx_f32_g(ebtop);
  if (aminnz >= 0x80 && aminnz >= bx_bf16_thr(ebtop, 15)) { /* no subnormals */
    bx_pend_add(p1, acc, bf16_window1_fast(x, len, g), g - 45);
    return 0;
  }
  if (aminnz >= 0x80 && aminnz >= bx_bf16_thr(ebtop, 37)) {
    bx_pend_add(p1, acc, bf16_window2_fast(x, len, g), g - 45);
    return 0;
  }
  if (aminnz >= 0x80 && aminnz >= bx_bf16_thr(ebtop, 60)) {
    bx_i128 v2, v1 = bf16_window3_fast(x, len, g, &v2);
    bx_pend_add(p1, acc, v1, g - 45);
    bx_pend_add(p2, acc, v2, g - 90);
    return 0;
  }
  if (aminnz >= bx_bf16_thr(ebtop, 15)) {
    bx_pend_add(p1, acc, bf16_window1_all(x, len, g), g - 45);
    return 0;
  }
  uint32_t thr = bx_bf16_thr(ebtop, 37), upper = 0x8000u;
  bx_pending *p = p1;
  for (;;) {
    uint32_t rest;
    bx_pend_add(p, acc, bf16_window2_masked(x, len, g, thr, upper, &rest), g - 45);
    if (rest == 0) return 0;
    upper = thr;
    ebtop = rest >> 7 ? (int)(rest >> 7) : 1;
    g = bx_f32_g(ebtop);
    thr = bx_bf16_thr(ebtop, 37);
  }
}

void bx_avx512_sumsq_bf16(const void *xv, size_t n, bx_acc *acc) {
  const uint16_t *x = xv;
  bx_pending p1 = {0, 0, 0}, p2 = {0, 0, 0};
  size_t scalar_n = 0, i = 0, len = F32_BLOCK, run = 0, run_at = 0; /* run: for the scalar kernel */
  if (((uintptr_t)x & 1) == 0) len -= ((uintptr_t)x >> 1) & 31;
  while (i < n) {
    if (len > n - i) len = n - i;
    if (bf16_block(x + i, len, acc, &p1, &p2)) {
      if (!run) run_at = i;
      run += len;
    } else if (run) {
      bx_sumsq_bf16_scalar(x + run_at, run, acc); /* counts them */
      scalar_n += run;
      run = 0;
    }
    i += len;
    len = F32_BLOCK;
  }
  if (run) {
    bx_sumsq_bf16_scalar(x + run_at, run, acc);
    scalar_n += run;
  }
  bx_pend_flush(&p1, acc);
  bx_pend_flush(&p2, acc);
  acc->count += (int64_t)(n - scalar_n);
}

/* ======================================================================
 * fp16: one fixed window, G = -12, L = -57, no pass 1.
 * ====================================================================== */

static inline __m512 f16_ld(const uint16_t *p, size_t left) {
  __m256i h = left >= 16 ? _mm256_loadu_si256((const void *)p)
                         : _mm256_maskz_loadu_epi16((__mmask16)((1u << left) - 1), p);
  return _mm512_cvtph_ps(h);
}

/* 1 if every lane of hi still has the anchor's exponent field (finite). */
static inline int f16_finite(__m512d h0, __m512d h1, __m512d h2, __m512d h3) {
  __m512i e = _mm512_set1_epi64(bx_anchor_bits(-12) >> 52);
  __mmask8 ok = _mm512_cmpeq_epi64_mask(_mm512_srli_epi64(_mm512_castpd_si512(h0), 52), e) &
                _mm512_cmpeq_epi64_mask(_mm512_srli_epi64(_mm512_castpd_si512(h1), 52), e) &
                _mm512_cmpeq_epi64_mask(_mm512_srli_epi64(_mm512_castpd_si512(h2), 52), e) &
                _mm512_cmpeq_epi64_mask(_mm512_srli_epi64(_mm512_castpd_si512(h3), 52), e);
  return ok == 0xFF;
}

void bx_avx512_sumsq_f16(const void *xv, size_t n, bx_acc *acc) {
  const uint16_t *x = xv;
  const __m512d ah = anchor_pd(-12), al = anchor_pd(-57);
  bx_pending p = {0, 0, 0};
  size_t scalar_n = 0, i = 0, len = F16_BLOCK, run = 0, run_at = 0; /* run: for the scalar kernel */
  if (((uintptr_t)x & 1) == 0) len -= ((uintptr_t)x >> 1) & 31;
  while (i < n) {
    if (len > n - i) len = n - i;
    const uint16_t *b = x + i;
    __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
    for (size_t j = 0; j < len; j += 32) {
      __m512 f0 = f16_ld(b + j, len - j);
      __m512 f1 = f16_ld(b + j + 16, len - j > 16 ? len - j - 16 : 0);
      sq2(_mm512_cvtps_pd(_mm512_castps512_ps256(f0)), &h0, &l0);
      sq2(_mm512_cvtps_pd(_mm512_extractf32x8_ps(f0, 1)), &h1, &l1);
      sq2(_mm512_cvtps_pd(_mm512_castps512_ps256(f1)), &h2, &l2);
      sq2(_mm512_cvtps_pd(_mm512_extractf32x8_ps(f1, 1)), &h3, &l3);
    }
    if (f16_finite(h0, h1, h2, h3)) {
      bx_pend_add(&p, acc, combine45(lanes_sum(h0, h1, h2, h3, -12), lanes_sum(l0, l1, l2, l3, -57)), -57);
      if (run) {
        bx_sumsq_f16_scalar(x + run_at, run, acc); /* counts them */
        scalar_n += run;
        run = 0;
      }
    } else { /* a NaN or Inf in the block: the scalar kernel redoes it */
      if (!run) run_at = i;
      run += len;
    }
    i += len;
    len = F16_BLOCK;
  }
  if (run) {
    bx_sumsq_f16_scalar(x + run_at, run, acc);
    scalar_n += run;
  }
  bx_pend_flush(&p, acc);
  acc->count += (int64_t)(n - scalar_n);
}
