/*
 * avx512_half.c — the AVX-512 bf16 and fp16 micro-kernels (micro.h; the
 * driver is drive_half.c). Scheme and proofs: exact_grid.h. Blocks of
 * 2048 (k <= 64 per lane). Every loop reads 32 elements (one 64-byte
 * line) an iteration, or 64 (two).
 */
#include "avx512_util.h"

#define BF16_BLOCK BX_AVX512_BLOCK
#define F16_BLOCK BX_AVX512_BLOCK

/* ======================================================================
 * bf16: widened to fp32 by a 16-bit shift (interleaving with zeros; the
 * lane order does not matter to a sum), then to fp64.
 * ====================================================================== */

/* 32 bf16 at x, the ones past left (< 32) read as zeros */
static inline __m512i bf16_ld32(const uint16_t *x, size_t left) {
  return left >= 32 ? _mm512_loadu_si512(x) : _mm512_maskz_loadu_epi16(tail_mask32(left), x);
}

/* 32 x 16-bit lanes of max / min into 32-bit lanes, reduced */
static inline uint32_t bf16_max_done(__m512i mx) {
  return _mm512_reduce_max_epu32(_mm512_max_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(mx)),
                                                  _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(mx, 1))));
}
static inline uint32_t bf16_min_done(__m512i mn) { /* of (|x| bits - 1): 0 if no non-zero */
  __m512i m32 = _mm512_min_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(mn)),
                                 _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(mn, 1)));
  return (_mm512_reduce_min_epu32(m32) + 1u) & 0xFFFF;
}

/* min over v's 32 words of (|x| bits - 1), zeros wrapping to 0xFFFF */
static inline __m512i bf16_min32(__m512i v, __m512i mn) {
  __m512i a = _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF));
  return _mm512_min_epu16(mn, _mm512_sub_epi16(a, _mm512_set1_epi16(1)));
}

/* micro.h: stats */
static void bf16_stats(const uint16_t *x, size_t len, uint32_t *amax, uint32_t *aminnz) {
  __m512i mx = _mm512_setzero_si512(), mn = _mm512_set1_epi16(-1);
  for (size_t i = 0; i < len; i += 32) {
    bx_prefetch_line(x + i);
    __m512i v = bf16_ld32(x + i, len - i);
    mx = _mm512_max_epu16(mx, _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF)));
    mn = bf16_min32(v, mn);
  }
  *amax = bf16_max_done(mx);
  *aminnz = bf16_min_done(mn);
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

/* micro.h: window1 (converted). Every non-zero x^2 a multiple of 2^G:
 * fma(x,x,hi) is exact. */
static bx_i128 bf16_window1(const uint16_t *x, size_t len, int g) {
  const __m512d ah = anchor_pd(g);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah;
  for (size_t i = 0; i < len; i += 32) {
    bx_prefetch_line(x + i);
    __m512i a, b;
    bf16_widen(bf16_ld32(x + i, len - i), &a, &b);
    __m512d d0 = cvt_lo(a), d1 = cvt_hi(a), d2 = cvt_lo(b), d3 = cvt_hi(b);
    h0 = _mm512_fmadd_pd(d0, d0, h0);
    h1 = _mm512_fmadd_pd(d1, d1, h1);
    h2 = _mm512_fmadd_pd(d2, d2, h2);
    h3 = _mm512_fmadd_pd(d3, d3, h3);
  }
  return combine45(lanes_sum(h0, h1, h2, h3, g), 0);
}

/* micro.h: window2 (converted; subnormals within two levels) */
static bx_i128 bf16_window2(const uint16_t *x, size_t len, int g) {
  const __m512d ah = anchor_pd(g), al = anchor_pd(g - 45);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  for (size_t i = 0; i < len; i += 32) {
    bx_prefetch_line(x + i);
    __m512i a, b;
    bf16_widen(bf16_ld32(x + i, len - i), &a, &b);
    sq2(cvt_lo(a), &h0, &l0);
    sq2(cvt_hi(a), &h1, &l1);
    sq2(cvt_lo(b), &h2, &l2);
    sq2(cvt_hi(b), &h3, &l3);
  }
  return combine45(lanes_sum(h0, h1, h2, h3, g), lanes_sum(l0, l1, l2, l3, g - 45));
}

/* Windows without conversions, for blocks without subnormals. A 64-bit
 * lane holds 4 bf16 words; word j shifted to bits 45..60 and masked to
 * bits 45..59 lines its exponent and mantissa fields up with a double's:
 * y = |x| 2^-896 exactly. y' = y with bits 61, 62 set has exponent field e
 * + 1536: |x| 2^640 for normal x (x = 0 gives y = 0, so y*y' = 0 whatever
 * y' is). The fma sees y*y' = x^2 2^-256 exactly: the window of G moved by
 * -256 (all grids stay normal: G - 256 - 90 >= -640). */
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

static inline __m512d bf16_sq1(__m512i w, __m512d h) {
  return _mm512_fmadd_pd(bf16_y(w), bf16_yp(w), h);
}

/* micro.h: window1_fast */
static bx_i128 bf16_window1_fast(const uint16_t *x, size_t len, int g) {
  const __m512d ah = anchor_pd(g - 256);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah;
  for (size_t i = 0; i < len; i += 32) {
    bx_prefetch_line(x + i);
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

/* micro.h: window2_fast */
static bx_i128 bf16_window2_fast(const uint16_t *x, size_t len, int g) {
  const __m512d ah = anchor_pd(g - 256), al = anchor_pd(g - 301);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  for (size_t i = 0; i < len; i += 32) {
    bx_prefetch_line(x + i);
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

/* micro.h: window3_fast */
static bx_i128 bf16_window3_fast(const uint16_t *x, size_t len, int g, bx_i128 *v2) {
  const __m512d ah = anchor_pd(g - 256), am = anchor_pd(g - 301), al = anchor_pd(g - 346);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, m0 = am, m1 = am, m2 = am, m3 = am;
  __m512d l0 = al, l1 = al, l2 = al, l3 = al;
  for (size_t i = 0; i < len; i += 32) {
    bx_prefetch_line(x + i);
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

/* ---- guessed windows (exact_grid.h, GUESSED WINDOWS) ------------------- */

/* The words of x[0..32) flagged in k into tiny[] (at most BX_BF16_TINY
 * in all); 0 if there are more. Rare: a branch, not vector code. */
static int bf16_set_apart(const uint16_t *x, __mmask32 k, uint16_t *tiny, int *nt) {
  if (*nt + __builtin_popcount((unsigned)k) > BX_BF16_TINY) return 0;
  for (unsigned kk = k; kk; kk &= kk - 1) tiny[(*nt)++] = x[__builtin_ctz(kk)];
  return 1;
}

/* 64 words x[0..64) loaded as *a, *b: those with 0 < |x| bits < thr set
 * apart into tiny[] and zeroed (vt = thr - 1; 0 for thr 0: none); 0 if
 * there are too many. */
static inline int set_apart64(const uint16_t *x, __m512i *a, __m512i *b, __m512i vt, uint16_t *tiny, int *nt) {
  const __m512i absm = _mm512_set1_epi16(0x7FFF), one = _mm512_set1_epi16(1);
  /* 0 < |x| bits < thr: |x| bits - 1 < thr - 1, zeros wrapping above */
  __mmask32 ka = _mm512_cmplt_epu16_mask(_mm512_sub_epi16(_mm512_and_si512(*a, absm), one), vt);
  __mmask32 kb = _mm512_cmplt_epu16_mask(_mm512_sub_epi16(_mm512_and_si512(*b, absm), one), vt);
  if (!(ka | kb)) return 1;
  if (!bf16_set_apart(x, ka, tiny, nt) || !bf16_set_apart(x + 32, kb, tiny, nt)) return 0; /* rare */
  *a = _mm512_maskz_mov_epi16(~ka, *a);
  *b = _mm512_maskz_mov_epi16(~kb, *b);
  return 1;
}

/* The 8 one-level accumulators anchored at an: 0 if a lane left its
 * binade, else *sum of the lanes and *hmax, the largest (units of G). */
static inline int lanes8_fold(const __m512d h[8], __m512i an, int64_t *sum, int64_t *hmax) {
  __m512i bad = _mm512_setzero_si512(), d[8];
  for (int k = 0; k < 8; k++) d[k] = lanes_diff(h[k], an, &bad);
  if (lanes_bad(bad)) return 0;
  __m512i s = d[0], m = d[0];
  for (int k = 1; k < 8; k++) {
    s = _mm512_add_epi64(s, d[k]);
    m = _mm512_max_epi64(m, d[k]);
  }
  *hmax = _mm512_reduce_max_epi64(m);
  *sum = _mm512_reduce_add_epi64(s);
  return 1;
}

/* micro.h: guess1. One level, 8 accumulators (k = 32 a lane); the words
 * with 0 < |x| bits < thr are set apart and zeroed. */
static int bf16_guess1(const uint16_t *x, int g, uint32_t thr, uint16_t *tiny, int *ntiny, bx_i128 *v,
                       int64_t *hmax) {
  const __m512d ah = anchor_pd(g - 256);
  const __m512i vt = _mm512_set1_epi16((short)(thr - 1)); /* thr >= 0x80 */
  __m512d h[8] = {ah, ah, ah, ah, ah, ah, ah, ah};
  *ntiny = 0;
  for (size_t i = 0; i < BF16_BLOCK; i += 64) {
    bx_prefetch_line(x + i);
    bx_prefetch_line(x + i + 32);
    __m512i w[4], u[4], a = _mm512_loadu_si512(x + i), b = _mm512_loadu_si512(x + i + 32);
    if (!set_apart64(x + i, &a, &b, vt, tiny, ntiny)) return 0;
    bf16_split4(a, w);
    bf16_split4(b, u);
    /* spelled out: -O2 keeps an unrolled array in registers, a loop in memory */
    h[0] = bf16_sq1(w[0], h[0]);
    h[1] = bf16_sq1(w[1], h[1]);
    h[2] = bf16_sq1(w[2], h[2]);
    h[3] = bf16_sq1(w[3], h[3]);
    h[4] = bf16_sq1(u[0], h[4]);
    h[5] = bf16_sq1(u[1], h[5]);
    h[6] = bf16_sq1(u[2], h[6]);
    h[7] = bf16_sq1(u[3], h[7]);
  }
  int64_t sum;
  if (!lanes8_fold(h, _mm512_castpd_si512(ah), &sum, hmax)) return 0;
  *v = combine45(sum, 0);
  return 1;
}

/* ---- the verified window in fp32 lanes (exact_grid.h, VERIFIED WINDOWS,
 * bf16): a bf16 word in the top half of a dword is its fp32 value. 4
 * pairs of 16 lanes take 512 elements, 8 a lane, and are folded; 4 such
 * sub-blocks make a block. */
#define BF16_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline void sqv32(__m512i w, __m512 *hi, __m512 *lo) {
  __m512 x = _mm512_castsi512_ps(w);
  __m512 t = _mm512_fmadd_round_ps(x, x, *hi, BF16_RN);
  *lo = _mm512_add_ps(*lo, _mm512_fmadd_ps(x, x, _mm512_sub_ps(*hi, t)));
  *hi = t;
}

/* fp32 lanes minus the anchor an; *bad gets lanes outside its binade */
static inline __m512i lanes_diff32(__m512 a, __m512i an, __m512i *bad) {
  __m512i d = _mm512_sub_epi32(_mm512_castps_si512(a), an);
  *bad = _mm512_or_si512(*bad, _mm512_add_epi32(d, _mm512_set1_epi32(1 << 22)));
  return d;
}

/* micro.h: verified (bf16) */
static int bf16_verified(const uint16_t *x, int g, uint32_t thr, uint16_t *tiny, int *ntiny, bx_i128 *v,
                         int64_t *hmax) {
  const __m512i ahi = _mm512_set1_epi32(bx_anchor_bits32(g)), ali = _mm512_set1_epi32(bx_anchor_bits32(g - 19));
  const __m512 ah = _mm512_castsi512_ps(ahi), al = _mm512_castsi512_ps(ali);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i vt = _mm512_set1_epi16((short)(thr - 1)); /* thr >= 0x80 */
  __m512i bad = zero, mx = zero;
  int64_t sum = 0;
  *ntiny = 0;
  *v = 0;
  *hmax = 0;
  for (size_t c = 0; c < BF16_BLOCK; c += 512) {
    __m512 h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
    for (size_t i = c; i < c + 512; i += 64) {
      bx_prefetch_line(x + i);
      bx_prefetch_line(x + i + 32);
      __m512i a = _mm512_loadu_si512(x + i), b = _mm512_loadu_si512(x + i + 32);
      if (!set_apart64(x + i, &a, &b, vt, tiny, ntiny)) return 0;
      sqv32(_mm512_unpacklo_epi16(zero, a), &h0, &l0);
      sqv32(_mm512_unpackhi_epi16(zero, a), &h1, &l1);
      sqv32(_mm512_unpacklo_epi16(zero, b), &h2, &l2);
      sqv32(_mm512_unpackhi_epi16(zero, b), &h3, &l3);
    }
    __m512i d0 = lanes_diff32(h0, ahi, &bad), d1 = lanes_diff32(h1, ahi, &bad);
    __m512i d2 = lanes_diff32(h2, ahi, &bad), d3 = lanes_diff32(h3, ahi, &bad);
    __m512i hs = _mm512_add_epi32(_mm512_add_epi32(d0, d1), _mm512_add_epi32(d2, d3));
    __m512i ls = _mm512_add_epi32(_mm512_add_epi32(lanes_diff32(l0, ali, &bad), lanes_diff32(l1, ali, &bad)),
                                  _mm512_add_epi32(lanes_diff32(l2, ali, &bad), lanes_diff32(l3, ali, &bad)));
    mx = _mm512_max_epi32(mx, _mm512_max_epi32(_mm512_max_epi32(d0, d1), _mm512_max_epi32(d2, d3)));
    if (_mm512_test_epi32_mask(bad, _mm512_set1_epi32((int)0xFF800000u))) return 0;
    /* 64 lanes in their binades, each below 2^22 in size: no int32 sum wraps */
    sum += ((int64_t)_mm512_reduce_add_epi32(hs) << 19) + _mm512_reduce_add_epi32(ls);
  }
  *hmax = _mm512_reduce_max_epi32(mx);
  *v = sum;
  return 1;
}

/* micro.h: guess2. Two levels, 4 pairs (k = 64 a lane). */
static int bf16_guess2(const uint16_t *x, int g, uint32_t *minnz, bx_i128 *v, int64_t *hmax) {
  const __m512d ah = anchor_pd(g - 256), al = anchor_pd(g - 301);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  __m512i mn = _mm512_set1_epi16(-1);
  for (size_t i = 0; i < BF16_BLOCK; i += 32) {
    bx_prefetch_line(x + i);
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
  __m512i a0 = lanes_diff(h0, an, &bad), a1 = lanes_diff(h1, an, &bad);
  __m512i a2 = lanes_diff(h2, an, &bad), a3 = lanes_diff(h3, an, &bad);
  __m512i b0 = lanes_diff(l0, al_i, &bad), b1 = lanes_diff(l1, al_i, &bad);
  __m512i b2 = lanes_diff(l2, al_i, &bad), b3 = lanes_diff(l3, al_i, &bad);
  if (lanes_bad(bad)) return 0;
  *hmax = _mm512_reduce_max_epi64(_mm512_max_epi64(_mm512_max_epi64(a0, a1), _mm512_max_epi64(a2, a3)));
  int64_t hs = _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  int64_t ls = _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(b0, b1), _mm512_add_epi64(b2, b3)));
  *v = combine45(hs, ls);
  return 1;
}

/* micro.h: bins_prep. 32 elements a vector: exponent fields, significands
 * with the hidden bit and their squares (< 2^16: vpmullw) in 16-bit lanes. */
static size_t bf16_bins_prep(const uint16_t *x, size_t m, uint16_t *idx, uint16_t *val, bx_bins_span *sp) {
  const __m512i ff = _mm512_set1_epi16(0xFF), frac = _mm512_set1_epi16(0x7F);
  __m512i emx = _mm512_setzero_si512(), emn = _mm512_set1_epi16(0xFF);
  size_t mr = (m + 31) & ~(size_t)31; /* the rest of the last 32 reads as zeros */
  for (size_t j = 0; j < mr; j += 32) {
    bx_prefetch_line(x + j);
    __m512i v = bf16_ld32(x + j, m - j);
    __m512i e = _mm512_and_si512(_mm512_srli_epi16(v, 7), ff);
    __m512i f = _mm512_and_si512(v, frac);
    __mmask32 spec = _mm512_cmpeq_epi16_mask(e, ff);
    if (spec) { /* NaN/Inf: counted; bin 255 is never deposited */
      __mmask32 nan = _mm512_mask_test_epi16_mask(spec, f, f);
      sp->nan += __builtin_popcount(nan);
      sp->inf += __builtin_popcount((unsigned)(spec & ~nan));
    }
    __m512i mm = _mm512_mask_mov_epi16(f, _mm512_test_epi16_mask(e, e), _mm512_or_si512(f, _mm512_set1_epi16(0x80)));
    emx = _mm512_mask_max_epu16(emx, (__mmask32)~spec, emx, e);
    emn = _mm512_mask_min_epu16(emn, _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7FFF)), emn, e);
    _mm512_store_si512(idx + j, e);
    _mm512_store_si512(val + j, _mm512_mullo_epi16(mm, mm));
  }
  uint32_t hi = bf16_max_done(emx);
  uint32_t lo = _mm512_reduce_min_epu32(_mm512_min_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(emn)),
                                                         _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(emn, 1))));
  sp->emax = hi > sp->emax ? hi : sp->emax;
  sp->eminnz = lo < sp->eminnz ? lo : sp->eminnz;
  return mr;
}

const bx_bf16_micro bx_micro_bf16_avx512 = {
    BF16_BLOCK,        bf16_stats,        bf16_window1,   bf16_window2, bf16_window1_fast,
    bf16_window2_fast, bf16_window3_fast, bf16_bins_prep, bf16_guess1,  bf16_guess2,
    bf16_verified,
};

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

/* micro.h: the fp16 window */
static int f16_window(const uint16_t *b, size_t len, bx_i128 *v, int64_t *hmax) {
  const __m512d ah = anchor_pd(-12), al = anchor_pd(-57);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  size_t j = 0;
  for (; j + 32 <= len; j += 32) {
    bx_prefetch_line(b + j);
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
  if (!f16_finite(h0, h1, h2, h3)) return 0;
  const __m512i an = _mm512_castpd_si512(ah);
  __m512i bad = _mm512_setzero_si512();
  __m512i d = _mm512_max_epi64(_mm512_max_epi64(lanes_diff(h0, an, &bad), lanes_diff(h1, an, &bad)),
                               _mm512_max_epi64(lanes_diff(h2, an, &bad), lanes_diff(h3, an, &bad)));
  *hmax = _mm512_reduce_max_epi64(d);
  *v = combine45(lanes_sum(h0, h1, h2, h3, -12), lanes_sum(l0, l1, l2, l3, -57));
  return 1;
}

/* 16 fp16 words (a ymm half) as two vectors of 8 doubles, exactly */
static inline void f16_cvt16(__m256i h, __m512d *a, __m512d *b) {
  __m512 f = _mm512_cvtph_ps(h);
  *a = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
  *b = _mm512_cvtps_pd(_mm512_extractf32x8_ps(f, 1));
}

/* micro.h: guess (fp16). One level, 8 accumulators (k = 32 a lane); the
 * words with 0 < |x| bits < thr are set apart and zeroed. */
static int f16_guess(const uint16_t *x, int g, uint32_t thr, uint16_t *tiny, int *ntiny, bx_i128 *v,
                     int64_t *hmax) {
  const __m512d ah = anchor_pd(g);
  const __m512i vt = _mm512_set1_epi16((short)(thr ? thr - 1 : 0)); /* thr 0: nothing set apart */
  __m512d h[8] = {ah, ah, ah, ah, ah, ah, ah, ah};
  *ntiny = 0;
  for (size_t i = 0; i < F16_BLOCK; i += 64) {
    bx_prefetch_line(x + i);
    bx_prefetch_line(x + i + 32);
    __m512i a = _mm512_loadu_si512(x + i), b = _mm512_loadu_si512(x + i + 32);
    if (!set_apart64(x + i, &a, &b, vt, tiny, ntiny)) return 0;
    __m512d d0, d1, d2, d3, d4, d5, d6, d7; /* spelled out: a loop's vectors live in memory at -O2 */
    f16_cvt16(_mm512_castsi512_si256(a), &d0, &d1);
    f16_cvt16(_mm512_extracti64x4_epi64(a, 1), &d2, &d3);
    f16_cvt16(_mm512_castsi512_si256(b), &d4, &d5);
    f16_cvt16(_mm512_extracti64x4_epi64(b, 1), &d6, &d7);
    h[0] = _mm512_fmadd_pd(d0, d0, h[0]);
    h[1] = _mm512_fmadd_pd(d1, d1, h[1]);
    h[2] = _mm512_fmadd_pd(d2, d2, h[2]);
    h[3] = _mm512_fmadd_pd(d3, d3, h[3]);
    h[4] = _mm512_fmadd_pd(d4, d4, h[4]);
    h[5] = _mm512_fmadd_pd(d5, d5, h[5]);
    h[6] = _mm512_fmadd_pd(d6, d6, h[6]);
    h[7] = _mm512_fmadd_pd(d7, d7, h[7]);
  }
  int64_t sum;
  if (!lanes8_fold(h, _mm512_castpd_si512(ah), &sum, hmax)) return 0;
  *v = sum;
  return 1;
}

const bx_f16_micro bx_micro_f16_avx512 = {F16_BLOCK, f16_window, f16_guess};
