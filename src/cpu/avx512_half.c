/*
 * avx512_half.c — exact sum of squares of bf16 and fp16 tensors, AVX-512.
 * Scheme and proofs: exact_grid.h. Blocks of 2048 (k <= 64 per lane).
 * bf16: checked blocks, then guessed windows (no pass 1) while they hold;
 * wide blocks to the integer bins with vector preprocessing. fp16: one
 * fixed two-level window for everything finite.
 */
#include <string.h>

#include "avx512_util.h"
#include "bins.h"

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


/* A checked block: pass 1 (into *amax, *aminnz), then the narrowest
 * window that takes it. Returns 1 if it is for the bins (NaN/Inf, or
 * spread wider than one window). */
static int bf16_block(const uint16_t *x, size_t len, bx_acc *acc, bx_pending *p1, bx_pending *p2,
                      uint32_t *amax_out, uint32_t *aminnz_out) {
  uint32_t amax, aminnz;
  bf16_stats(x, len, &amax, &aminnz);
  *amax_out = amax;
  *aminnz_out = aminnz;
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
  if (aminnz >= bx_bf16_thr(ebtop, 37)) { /* subnormals among them */
    uint32_t rest;
    bx_pend_add(p1, acc, bf16_window2_masked(x, len, g, 0, 0x8000u, &rest), g - 45);
    return 0;
  }
  return 1; /* a cascade of masked windows would cost more than the bins */
}

/* ---- guessed windows (exact_grid.h, GUESSED WINDOWS) -------------------
 * G comes from the lane sums of the block before; the least non-zero |x|
 * of the block, found in the same loop, says whether the window's level
 * admitted every element; the binades of the final lanes say whether hi
 * held. No pass 1, no flags: a block that fails is redone. */
#define BF16_G_MAX 203 /* a NaN/Inf product (>= 1) overflows hi's binade */

/* min over v's 32 words of (|x| bits - 1), zeros wrapping to 0xFFFF */
static inline __m512i bf16_min32(__m512i v, __m512i mn) {
  __m512i a = _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF));
  return _mm512_min_epu16(mn, _mm512_sub_epi16(a, _mm512_set1_epi16(1)));
}
static inline uint32_t bf16_min_done(__m512i mn) {
  __m512i m32 = _mm512_min_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(mn)),
                                 _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(mn, 1)));
  return (_mm512_reduce_min_epu32(m32) + 1u) & 0xFFFF; /* 0: no non-zero element */
}

/* Lane bits minus the anchor; *bad collects lanes outside its binade. */
static inline __m512i bf16_diff(__m512d a, __m512i an, __m512i *bad) {
  __m512i d = _mm512_sub_epi64(_mm512_castpd_si512(a), an);
  *bad = _mm512_or_si512(*bad, _mm512_add_epi64(d, _mm512_set1_epi64((int64_t)1 << 51)));
  return d;
}
static inline int bf16_bad(__m512i bad) {
  return _mm512_test_epi64_mask(bad, _mm512_set1_epi64(-((int64_t)1 << 52))) != 0;
}

/* A block whose least non-zero |x| bits are minnz fits the window of G:
 * one level needs 2e - 268 >= G for its exponent field e, two levels
 * 2e - 268 >= G - 45; both need it normal (the y' of a subnormal is not
 * |x| 2^640). */
static int bf16_fits(uint32_t minnz, int g, int levels) {
  if (minnz == 0) return 1;
  int e = (int)(minnz >> 7);
  return e >= 1 && 2 * e - 268 >= (levels == 1 ? g : g - 45);
}

/* One level, 8 accumulators (k = 32 a lane), over a full block. Returns
 * 0 if a lane left its binade; else *v in units of 2^(G-45), *hmax = the
 * largest lane in units of 2^G; *minnz = the least non-zero |x| bits
 * (the caller checks bf16_fits before using *v). */
static int bf16_guess1(const uint16_t *x, int g, uint32_t *minnz, bx_i128 *v, int64_t *hmax) {
  const __m512d ah = anchor_pd(g - 256);
  __m512d h[8] = {ah, ah, ah, ah, ah, ah, ah, ah};
  __m512i mn = _mm512_set1_epi16(-1);
  for (size_t i = 0; i < F32_BLOCK; i += 64) {
    __m512i w[4], u[4], a = _mm512_loadu_si512(x + i), b = _mm512_loadu_si512(x + i + 32);
    mn = bf16_min32(b, bf16_min32(a, mn));
    bf16_split4(a, w);
    bf16_split4(b, u);
    h[0] = bf16_sq1(w[0], h[0]);
    h[1] = bf16_sq1(w[1], h[1]);
    h[2] = bf16_sq1(w[2], h[2]);
    h[3] = bf16_sq1(w[3], h[3]);
    h[4] = bf16_sq1(u[0], h[4]);
    h[5] = bf16_sq1(u[1], h[5]);
    h[6] = bf16_sq1(u[2], h[6]);
    h[7] = bf16_sq1(u[3], h[7]);
  }
  *minnz = bf16_min_done(mn);
  const __m512i an = _mm512_castpd_si512(ah);
  __m512i bad = _mm512_setzero_si512(), d[8];
  for (int k = 0; k < 8; k++) d[k] = bf16_diff(h[k], an, &bad);
  if (bf16_bad(bad)) return 0;
  __m512i s = _mm512_add_epi64(_mm512_add_epi64(_mm512_add_epi64(d[0], d[1]), _mm512_add_epi64(d[2], d[3])),
                               _mm512_add_epi64(_mm512_add_epi64(d[4], d[5]), _mm512_add_epi64(d[6], d[7])));
  __m512i m = _mm512_max_epi64(_mm512_max_epi64(_mm512_max_epi64(d[0], d[1]), _mm512_max_epi64(d[2], d[3])),
                               _mm512_max_epi64(_mm512_max_epi64(d[4], d[5]), _mm512_max_epi64(d[6], d[7])));
  *hmax = _mm512_reduce_max_epi64(m);
  *v = combine45(_mm512_reduce_add_epi64(s), 0);
  return 1;
}

/* Two levels, 4 pairs (k = 64 a lane), as bf16_guess1. */
static int bf16_guess2(const uint16_t *x, int g, uint32_t *minnz, bx_i128 *v, int64_t *hmax) {
  const __m512d ah = anchor_pd(g - 256), al = anchor_pd(g - 301);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  __m512i mn = _mm512_set1_epi16(-1);
  for (size_t i = 0; i < F32_BLOCK; i += 32) {
    __m512i w[4], a = _mm512_loadu_si512(x + i);
    mn = bf16_min32(a, mn);
    bf16_split4(a, w);
    bf16_sq2(w[0], &h0, &l0);
    bf16_sq2(w[1], &h1, &l1);
    bf16_sq2(w[2], &h2, &l2);
    bf16_sq2(w[3], &h3, &l3);
  }
  *minnz = bf16_min_done(mn);
  const __m512i an = _mm512_castpd_si512(ah), al_i = _mm512_castpd_si512(al);
  __m512i bad = _mm512_setzero_si512();
  __m512i a0 = bf16_diff(h0, an, &bad), a1 = bf16_diff(h1, an, &bad);
  __m512i a2 = bf16_diff(h2, an, &bad), a3 = bf16_diff(h3, an, &bad);
  __m512i b0 = bf16_diff(l0, al_i, &bad), b1 = bf16_diff(l1, al_i, &bad);
  __m512i b2 = bf16_diff(l2, al_i, &bad), b3 = bf16_diff(l3, al_i, &bad);
  if (bf16_bad(bad)) return 0;
  *hmax = _mm512_reduce_max_epi64(_mm512_max_epi64(_mm512_max_epi64(a0, a1), _mm512_max_epi64(a2, a3)));
  int64_t hs = _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  int64_t ls = _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(b0, b1), _mm512_add_epi64(b2, b3)));
  *v = combine45(hs, ls);
  return 1;
}

/* The next block's G: its largest hi lane near 2^49 of the 2^51 above
 * the anchor (a guess; the binade check decides). */
static int bf16_adapt(int g, int64_t hmax) {
  int lg = hmax > 0 ? 63 - __builtin_clzll((uint64_t)hmax) : 0;
  if (lg != 49) g += lg - 49;
  return g < -300 ? -300 : g;
}

/* A full block through the guessed windows: one level first (two when
 * the block before needed them); 0 if neither held. */
static int bf16_guessed(const uint16_t *x, int *g, int *levels, bx_acc *acc, bx_pending *p) {
  bx_i128 v;
  int64_t hmax = 0;
  uint32_t minnz;
  if (*levels == 1) {
    if (!bf16_guess1(x, *g, &minnz, &v, &hmax)) return 0;
    if (!bf16_fits(minnz, *g, 1)) {
      if (!bf16_fits(minnz, *g, 2)) return 0;
      *levels = 2;
    }
  }
  if (*levels == 2) {
    if (!bf16_guess2(x, *g, &minnz, &v, &hmax) || !bf16_fits(minnz, *g, 2)) return 0;
    if (bf16_fits(minnz, *g, 1)) *levels = 1;
  }
  bx_pend_add(p, acc, v, *g - 45);
  *g = bf16_adapt(*g, hmax);
  return 1;
}

/* ---- wide blocks: the integer bins of bins.h ------------------------------
 * 32 elements a vector: exponent fields, significands with the hidden bit,
 * and their squares (< 2^16: vpmullw) in 16-bit lanes; the scalar part is
 * only bin[e] += m^2 (four tables). m^2 < 2^16 and n <= 2^22: no flush. */

#define BF16_BINS_CHUNK 256

/* Exponent fields seen by bf16_bins_add: max over finite elements, min
 * over non-zero ones (255 when none), and whether a NaN/Inf was met. */
typedef struct bf16_span {
  uint32_t emax, eminnz, special;
} bf16_span;

static void bf16_bins_add(bx_bins *b, const uint16_t *x, size_t len, bf16_span *sp) {
  const __m512i ff = _mm512_set1_epi16(0xFF), frac = _mm512_set1_epi16(0x7F);
  __m512i emx = _mm512_setzero_si512(), emn = _mm512_set1_epi16(0xFF);
  uint16_t idx[BF16_BINS_CHUNK] __attribute__((aligned(64)));
  uint16_t sq[BF16_BINS_CHUNK] __attribute__((aligned(64)));
  for (size_t i = 0; i < len; i += BF16_BINS_CHUNK) {
    size_t m = len - i < BF16_BINS_CHUNK ? len - i : BF16_BINS_CHUNK;
    size_t mr = (m + 31) & ~(size_t)31; /* the rest of the last 32 reads as zeros */
    for (size_t j = 0; j < mr; j += 32) {
      __m512i v = bf16_ld32(x + i + j, m - j);
      __m512i e = _mm512_and_si512(_mm512_srli_epi16(v, 7), ff);
      __m512i f = _mm512_and_si512(v, frac);
      __mmask32 spec = _mm512_cmpeq_epi16_mask(e, ff);
      if (spec) { /* NaN/Inf: counted; bin 255 is never deposited */
        __mmask32 nan = _mm512_mask_test_epi16_mask(spec, f, f);
        b->nan += __builtin_popcount(nan);
        b->inf += __builtin_popcount((unsigned)(spec & ~nan));
        sp->special = 1;
      }
      __m512i mm = _mm512_mask_mov_epi16(f, _mm512_test_epi16_mask(e, e), _mm512_or_si512(f, _mm512_set1_epi16(0x80)));
      emx = _mm512_mask_max_epu16(emx, (__mmask32)~spec, emx, e);
      emn = _mm512_mask_min_epu16(emn, _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7FFF)), emn, e);
      _mm512_store_si512(idx + j, e);
      _mm512_store_si512(sq + j, _mm512_mullo_epi16(mm, mm));
    }
    for (size_t j = 0; j < mr; j += 4) {
      b->bin[0][idx[j]] += sq[j];
      b->bin[1][idx[j + 1]] += sq[j + 1];
      b->bin[2][idx[j + 2]] += sq[j + 2];
      b->bin[3][idx[j + 3]] += sq[j + 3];
    }
  }
  __m512i mx32 = _mm512_max_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(emx)),
                                  _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(emx, 1)));
  __m512i mn32 = _mm512_min_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(emn)),
                                  _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(emn, 1)));
  uint32_t hi = _mm512_reduce_max_epu32(mx32), lo = _mm512_reduce_min_epu32(mn32);
  bx_bins_touch(b, 0, hi); /* bin 0 takes the zeros of a partial chunk */
  sp->emax = hi > sp->emax ? hi : sp->emax;
  sp->eminnz = lo < sp->eminnz ? lo : sp->eminnz;
}

#define BF16_WIDE_RUN 8 /* wide blocks in a row between two passes 1 */

/* x[0..len) into the bins (set up at the first); then as f32_wide: after
 * a block spread this wide the next ones skip pass 1 while they stay wider
 * than two levels take. */
static void bf16_wide(bx_bins *b, int *live, int *wide, const uint16_t *x, size_t len) {
  if (!*live) {
    bx_bins_init(b, 0);
    *live = 1;
  }
  bf16_span sp = {0, 255, 0};
  bf16_bins_add(b, x, len, &sp);
  int ebtop = sp.emax ? (int)sp.emax : 1, ebot = sp.eminnz ? (int)sp.eminnz : 1;
  int fits = sp.eminnz == 255 || ebot >= ebtop - 36;
  if (*wide) *wide = sp.special || !fits ? *wide - 1 : 0;
  else *wide = fits ? 0 : BF16_WIDE_RUN; /* a NaN/Inf alone does not make the next wide */
}

/* Checked blocks until one fits a one- or two-level window without
 * subnormals; then guessed windows, G from the lanes before. A block
 * they do not take (or whose hi overflowed) is redone checked, and its
 * pass 1 restarts the guess. Blocks no window takes go to the bins at
 * once (their data in L1), and while they keep coming the next ones skip
 * pass 1. */
void bx_avx512_sumsq_bf16(const void *xv, size_t n, bx_acc *acc) {
  unsigned csr = bx_csr_enter(); /* exact_grid.h: no DAZ, flags our own */
  const uint16_t *x = xv;
  bx_pending p1 = {0, 0, 0}, p2 = {0, 0, 0};
  bx_bins bins;
  size_t i = 0, len = F32_BLOCK;
  if (((uintptr_t)x & 1) == 0) len -= ((uintptr_t)x >> 1) & 31;
  int g = 0, levels = 1, guessed = 0, live = 0, wide = 0;
  while (i < n) {
    if (len > n - i) len = n - i;
    int done = 0;
    if (wide) {
      bf16_wide(&bins, &live, &wide, x + i, len);
      done = 1;
    }
    if (!done && guessed && len == F32_BLOCK && g <= BF16_G_MAX)
      done = bf16_guessed(x + i, &g, &levels, acc, &p1);
    if (!done) { /* checked */
      uint32_t amax, aminnz;
      int scalar = bf16_block(x + i, len, acc, &p1, &p2, &amax, &aminnz);
      int ebtop = amax >> 7 ? (int)(amax >> 7) : 1;
      guessed = !scalar && amax != 0 && aminnz >= 0x80 && aminnz >= bx_bf16_thr(ebtop, 37);
      g = bx_f32_g(ebtop);
      levels = aminnz >= bx_bf16_thr(ebtop, 15) ? 1 : 2;
      if (scalar) bf16_wide(&bins, &live, &wide, x + i, len);
    }
    i += len;
    len = F32_BLOCK;
  }
  if (live) bx_bins_done(&bins, acc, 2, -268);
  bx_pend_flush(&p1, acc);
  bx_pend_flush(&p2, acc);
  acc->count += (int64_t)n;
  bx_csr_leave(csr);
}

/* ======================================================================
 * fp16: one fixed window, G = -12, L = -57, no pass 1.
 * ====================================================================== */

/* 8 fp16 (fewer at the end: masked, zeros) as 8 doubles: 128-bit loads
 * and cvtph2ps ymm, no 512-bit extracts. */
static inline __m512d f16_ld8(const uint16_t *p, size_t left) {
  __m128i h = left >= 8 ? _mm_loadu_si128((const void *)p)
                        : _mm_maskz_loadu_epi16((__mmask8)((1u << left) - 1), p);
  return _mm512_cvtps_pd(_mm256_cvtph_ps(h));
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
  unsigned csr = bx_csr_enter(); /* exact_grid.h: no DAZ, flags our own */
  const uint16_t *x = xv;
  const __m512d ah = anchor_pd(-12), al = anchor_pd(-57);
  bx_pending p = {0, 0, 0};
  size_t scalar_n = 0, i = 0, len = F16_BLOCK, run = 0, run_at = 0; /* run: for the scalar kernel */
  if (((uintptr_t)x & 1) == 0) len -= ((uintptr_t)x >> 1) & 31;
  while (i < n) {
    if (len > n - i) len = n - i;
    const uint16_t *b = x + i;
    __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
    size_t j = 0;
    for (; j + 32 <= len; j += 32) {
      sq2b(f16_ld8(b + j, 8), &h0, &l0, 0);
      sq2b(f16_ld8(b + j + 8, 8), &h1, &l1, 1);
      sq2b(f16_ld8(b + j + 16, 8), &h2, &l2, 0);
      sq2b(f16_ld8(b + j + 24, 8), &h3, &l3, 1);
    }
    if (j < len) { /* the tail as one more round: a lane still takes <= 64 */
      size_t r = len - j;
      sq2b(f16_ld8(b + j, r), &h0, &l0, 0);
      sq2b(f16_ld8(b + j + 8, r > 8 ? r - 8 : 0), &h1, &l1, 1);
      sq2b(f16_ld8(b + j + 16, r > 16 ? r - 16 : 0), &h2, &l2, 0);
      sq2b(f16_ld8(b + j + 24, r > 24 ? r - 24 : 0), &h3, &l3, 1);
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
      if (run >= BX_SCALAR_RUN_MAX) { /* the run still in L2 */
        bx_sumsq_f16_scalar(x + run_at, run, acc);
        scalar_n += run;
        run = 0;
      }
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
  bx_csr_leave(csr);
}
