/*
 * avx2_half.c — the AVX2 + F16C bf16 and fp16 micro-kernels (micro.h;
 * the driver is drive_half.c). Scheme and proofs: exact_grid.h. Blocks of
 * 1024 (k <= 64 per lane). Loops read 32 elements (one 64-byte line) an
 * iteration, as two halves of 16; a half past the end reads as zeros.
 */
#include <string.h>

#include "avx2_util.h"

/* elements of x[i..len) left, 0 past the end */
static inline size_t left_of(size_t len, size_t i) { return len > i ? len - i : 0; }

/* 16 bf16/fp16 words at x, the ones past left (< 16) read as zeros */
static inline __m256i ld16(const uint16_t *x, size_t left) {
  if (left >= 16) return _mm256_loadu_si256((const void *)x);
  uint16_t buf[16] = {0};
  memcpy(buf, x, left * sizeof *x);
  return _mm256_loadu_si256((const void *)buf);
}

/* ======================================================================
 * bf16: 16 elements a vector; widened to fp32 by interleaving with zeros
 * (lane order is irrelevant to a sum), then to fp64.
 * ====================================================================== */

/* 16-bit lanes of max / min-minus-one into 32 bits, reduced */
static inline uint32_t bf16_max_done(__m256i mx) {
  __m256i z = _mm256_setzero_si256();
  return hmax_epu32(_mm256_max_epu32(_mm256_unpacklo_epi16(mx, z), _mm256_unpackhi_epi16(mx, z)));
}
static inline uint32_t bf16_min_done(__m256i mn) { /* 0: no non-zero element */
  __m256i z = _mm256_setzero_si256();
  return (hmin_epu32(_mm256_min_epu32(_mm256_unpacklo_epi16(mn, z), _mm256_unpackhi_epi16(mn, z))) + 1u) & 0xFFFF;
}

/* min over v's 16 words of (|x| bits - 1), zeros wrapping to 0xFFFF */
static inline __m256i bf16_min16(__m256i v, __m256i mn) {
  __m256i a = _mm256_and_si256(v, _mm256_set1_epi16(0x7FFF));
  return _mm256_min_epu16(mn, _mm256_sub_epi16(a, _mm256_set1_epi16(1)));
}

/* micro.h: stats */
static void bf16_stats(const uint16_t *x, size_t len, uint32_t *amax, uint32_t *aminnz) {
  const __m256i absm = _mm256_set1_epi16(0x7FFF);
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi16(-1);
  for (size_t i = 0; i < len; i += 32) {
    bx_prefetch_line(x + i);
    __m256i a = ld16(x + i, len - i), b = ld16(x + i + 16, left_of(len, i + 16));
    mx = _mm256_max_epu16(mx, _mm256_max_epu16(_mm256_and_si256(a, absm), _mm256_and_si256(b, absm)));
    mn = bf16_min16(b, bf16_min16(a, mn));
  }
  *amax = bf16_max_done(mx);
  *aminnz = bf16_min_done(mn);
}

static inline __m256d cvt_lo(__m256i f) { return _mm256_cvtps_pd(_mm256_castps256_ps128(_mm256_castsi256_ps(f))); }
static inline __m256d cvt_hi(__m256i f) { return _mm256_cvtps_pd(_mm256_extractf128_ps(_mm256_castsi256_ps(f), 1)); }

/* 16 bf16 words as two vectors of 8 fp32 bit patterns */
static inline void bf16_widen(__m256i v, __m256i *a, __m256i *b) {
  *a = _mm256_unpacklo_epi16(_mm256_setzero_si256(), v);
  *b = _mm256_unpackhi_epi16(_mm256_setzero_si256(), v);
}

static inline void bf16_one16(__m256i v, __m256d h[4]) {
  __m256i a, b;
  bf16_widen(v, &a, &b);
  __m256d d0 = cvt_lo(a), d1 = cvt_hi(a), d2 = cvt_lo(b), d3 = cvt_hi(b);
  h[0] = _mm256_fmadd_pd(d0, d0, h[0]);
  h[1] = _mm256_fmadd_pd(d1, d1, h[1]);
  h[2] = _mm256_fmadd_pd(d2, d2, h[2]);
  h[3] = _mm256_fmadd_pd(d3, d3, h[3]);
}

/* micro.h: window1 (converted). Every non-zero x^2 a multiple of 2^G:
 * fma(x,x,hi) is exact. */
static bx_i128 bf16_window1(const uint16_t *x, size_t len, int g) {
  const __m256d ah = anchor4(g);
  __m256d h[4] = {ah, ah, ah, ah};
  for (size_t i = 0; i < len; i += 32) {
    bx_prefetch_line(x + i);
    bf16_one16(ld16(x + i, len - i), h);
    bf16_one16(ld16(x + i + 16, left_of(len, i + 16)), h);
  }
  return bx_combine(lanes_sum(h[0], h[1], h[2], h[3], g), 0, 45);
}

static inline void bf16_two16(__m256i v, __m256d h[4], __m256d l[4]) {
  __m256i a, b;
  bf16_widen(v, &a, &b);
  sq2(cvt_lo(a), &h[0], &l[0]);
  sq2(cvt_hi(a), &h[1], &l[1]);
  sq2(cvt_lo(b), &h[2], &l[2]);
  sq2(cvt_hi(b), &h[3], &l[3]);
}

/* micro.h: window2 (converted; subnormals within two levels) */
static bx_i128 bf16_window2(const uint16_t *x, size_t len, int g) {
  const __m256d ah = anchor4(g), al = anchor4(g - 45);
  __m256d h[4] = {ah, ah, ah, ah}, l[4] = {al, al, al, al};
  for (size_t i = 0; i < len; i += 32) {
    bx_prefetch_line(x + i);
    bf16_two16(ld16(x + i, len - i), h, l);
    bf16_two16(ld16(x + i + 16, left_of(len, i + 16)), h, l);
  }
  return bx_combine(lanes_sum(h[0], h[1], h[2], h[3], g), lanes_sum(l[0], l[1], l[2], l[3], g - 45), 45);
}

/* Windows without conversions, for blocks without subnormals. A 64-bit
 * lane holds 4 bf16 words; word j shifted to bits 45..60 and masked to
 * bits 45..59 lines its exponent and mantissa fields up with a double's:
 * y = |x| 2^-896 exactly. y' = y with bits 61, 62 set has exponent field e
 * + 1536: |x| 2^640 for normal x (x = 0 gives y = 0, so y*y' = 0 whatever
 * y' is). The fma sees y*y' = x^2 2^-256 exactly: the window of G moved by
 * -256 (every grid stays normal: G - 256 - 90 >= -640). */
static inline void bf16_split4(__m256i v, __m256i w[4]) {
  w[0] = _mm256_slli_epi64(v, 45);
  w[1] = _mm256_slli_epi64(v, 29);
  w[2] = _mm256_slli_epi64(v, 13);
  w[3] = _mm256_srli_epi64(v, 3);
}
static inline __m256d bf16_y(__m256i w) {
  return _mm256_castsi256_pd(_mm256_and_si256(w, _mm256_set1_epi64x(0x0FFFE00000000000ll)));
}
static inline __m256d bf16_yp(__m256d y) {
  return _mm256_or_pd(y, _mm256_castsi256_pd(_mm256_set1_epi64x(0x6000000000000000ll)));
}

static inline __m256d bf16_sq1(__m256i w, __m256d h) {
  __m256d y = bf16_y(w);
  return _mm256_fmadd_pd(y, bf16_yp(y), h);
}

static inline void bf16_fast1_16(__m256i v, __m256d h[4]) {
  __m256i w[4];
  bf16_split4(v, w);
  /* spelled out: -O2 keeps an unrolled array in registers, a loop in memory */
  h[0] = bf16_sq1(w[0], h[0]);
  h[1] = bf16_sq1(w[1], h[1]);
  h[2] = bf16_sq1(w[2], h[2]);
  h[3] = bf16_sq1(w[3], h[3]);
}

/* micro.h: window1_fast */
static bx_i128 bf16_window1_fast(const uint16_t *x, size_t len, int g) {
  const __m256d ah = anchor4(g - 256);
  __m256d h[4] = {ah, ah, ah, ah};
  for (size_t i = 0; i < len; i += 32) {
    bx_prefetch_line(x + i);
    bf16_fast1_16(ld16(x + i, len - i), h);
    bf16_fast1_16(ld16(x + i + 16, left_of(len, i + 16)), h);
  }
  return bx_combine(lanes_sum(h[0], h[1], h[2], h[3], g - 256), 0, 45);
}

static inline void bf16_sq2(__m256i w, __m256d *hi, __m256d *lo) {
  __m256d y = bf16_y(w), yp = bf16_yp(y);
  __m256d t = _mm256_fmadd_pd(y, yp, *hi);
  *lo = _mm256_add_pd(*lo, _mm256_fmadd_pd(y, yp, _mm256_sub_pd(*hi, t)));
  *hi = t;
}

static inline void bf16_fast2_16(__m256i v, __m256d h[4], __m256d l[4]) {
  __m256i w[4];
  bf16_split4(v, w);
  bf16_sq2(w[0], &h[0], &l[0]);
  bf16_sq2(w[1], &h[1], &l[1]);
  bf16_sq2(w[2], &h[2], &l[2]);
  bf16_sq2(w[3], &h[3], &l[3]);
}

/* micro.h: window2_fast */
static bx_i128 bf16_window2_fast(const uint16_t *x, size_t len, int g) {
  const __m256d ah = anchor4(g - 256), al = anchor4(g - 301);
  __m256d h[4] = {ah, ah, ah, ah}, l[4] = {al, al, al, al};
  for (size_t i = 0; i < len; i += 32) {
    bx_prefetch_line(x + i);
    bf16_fast2_16(ld16(x + i, len - i), h, l);
    bf16_fast2_16(ld16(x + i + 16, left_of(len, i + 16)), h, l);
  }
  return bx_combine(lanes_sum(h[0], h[1], h[2], h[3], g - 256), lanes_sum(l[0], l[1], l[2], l[3], g - 301), 45);
}

static inline void bf16_sq3(__m256i w, __m256d *hi, __m256d *mi, __m256d *lo) {
  __m256d y = bf16_y(w), yp = bf16_yp(y);
  const __m256d one = _mm256_set1_pd(1.0);
  __m256d t = _mm256_fmadd_pd(y, yp, *hi);
  __m256d e = _mm256_fmadd_pd(y, yp, _mm256_fnmadd_pd(t, one, *hi));
  __m256d t2 = _mm256_add_pd(*mi, e);
  *lo = _mm256_add_pd(*lo, _mm256_add_pd(e, _mm256_fnmadd_pd(t2, one, *mi)));
  *hi = t;
  *mi = t2;
}

static inline void bf16_fast3_16(__m256i v, bx_sets3 *s) {
  __m256i w[4];
  bf16_split4(v, w);
  bf16_sq3(w[0], &s->h0, &s->m0, &s->l0);
  bf16_sq3(w[1], &s->h1, &s->m1, &s->l1);
  bf16_sq3(w[2], &s->h0, &s->m0, &s->l0);
  bf16_sq3(w[3], &s->h1, &s->m1, &s->l1);
}

/* micro.h: window3_fast. 2 sets (8 lanes) over halves of 512: 64
 * elements a lane. */
static bx_i128 bf16_window3_fast(const uint16_t *x, size_t len, int g, bx_i128 *v2) {
  bx_i128 v1 = 0;
  *v2 = 0;
  for (size_t h = 0; h < len; h += BLOCK / 2) {
    size_t end = len - h < BLOCK / 2 ? len : h + BLOCK / 2;
    bx_sets3 s;
    sets3_init(&s, g - 256);
    for (size_t i = h; i < end; i += 32) {
      bx_prefetch_line(x + i);
      bf16_fast3_16(ld16(x + i, end - i), &s);
      bf16_fast3_16(ld16(x + i + 16, left_of(end, i + 16)), &s);
    }
    sets3_fold(&s, g - 256, &v1, v2);
  }
  return v1;
}

/* ---- guessed windows (exact_grid.h, GUESSED WINDOWS) ------------------- */

/* the words with 0 < |x| bits < thr (thr <= 0x7F80: signed compares
 * order the 15-bit values) as all-ones 16-bit lanes */
static inline __m256i bf16_tiny16(__m256i v, __m256i vt) {
  __m256i a = _mm256_and_si256(v, _mm256_set1_epi16(0x7FFF));
  return _mm256_andnot_si256(_mm256_cmpeq_epi16(a, _mm256_setzero_si256()), _mm256_cmpgt_epi16(vt, a));
}

/* The words of x[0..16) flagged in k (all-ones lanes) into tiny[] (at
 * most BX_BF16_TINY in all); 0 if there are more. Rare: scalar. */
static int bf16_set_apart(const uint16_t *x, __m256i k, uint16_t *tiny, int *nt) {
  unsigned m = _pext_u32((unsigned)_mm256_movemask_epi8(k), 0x55555555u); /* one bit a word */
  if (*nt + __builtin_popcount(m) > BX_BF16_TINY) return 0;
  for (; m; m &= m - 1) tiny[(*nt)++] = x[__builtin_ctz(m)];
  return 1;
}

/* 32 words x[0..32) loaded as *a, *b: those with 0 < |x| bits < thr
 * (vt) set apart into tiny[] and zeroed; 0 if there are too many. */
static inline int set_apart32(const uint16_t *x, __m256i *a, __m256i *b, __m256i vt, uint16_t *tiny, int *nt) {
  __m256i ka = bf16_tiny16(*a, vt), kb = bf16_tiny16(*b, vt), k = _mm256_or_si256(ka, kb);
  if (_mm256_testz_si256(k, k)) return 1;
  if (!bf16_set_apart(x, ka, tiny, nt) || !bf16_set_apart(x + 16, kb, tiny, nt)) return 0; /* rare */
  *a = _mm256_andnot_si256(ka, *a);
  *b = _mm256_andnot_si256(kb, *b);
  return 1;
}

/* The 8 one-level accumulators anchored at an: 0 if a lane left its
 * binade, else *sum of the lanes and *hmax, the largest (units of G). */
static inline int lanes8_fold(const __m256d h[8], __m256i an, int64_t *sum, int64_t *hmax) {
  __m256i bad = _mm256_setzero_si256(), d[8];
  for (int k = 0; k < 8; k++) d[k] = lanes_diff(h[k], an, &bad);
  if (lanes_bad(bad)) return 0;
  __m256i s = d[0], m = d[0];
  for (int k = 1; k < 8; k++) {
    s = _mm256_add_epi64(s, d[k]);
    m = max_epi64(m, d[k]);
  }
  *hmax = hmax_epi64(m);
  *sum = hsum64(s);
  return 1;
}

/* micro.h: guess1. One level, 8 accumulators (32 lanes, k = 32); the
 * words with 0 < |x| bits < thr are set apart and zeroed. */
static int bf16_guess1(const uint16_t *x, int g, uint32_t thr, uint16_t *tiny, int *ntiny, bx_i128 *v,
                       int64_t *hmax) {
  const __m256d ah = anchor4(g - 256);
  const __m256i vt = _mm256_set1_epi16((short)thr);
  __m256d h[8] = {ah, ah, ah, ah, ah, ah, ah, ah};
  *ntiny = 0;
  for (size_t i = 0; i < BLOCK; i += 32) {
    bx_prefetch_line(x + i);
    __m256i a = _mm256_loadu_si256((const void *)(x + i));
    __m256i b = _mm256_loadu_si256((const void *)(x + i + 16));
    if (!set_apart32(x + i, &a, &b, vt, tiny, ntiny)) return 0;
    bf16_fast1_16(a, h);
    bf16_fast1_16(b, h + 4);
  }
  int64_t sum;
  if (!lanes8_fold(h, _mm256_castpd_si256(ah), &sum, hmax)) return 0;
  *v = bx_combine(sum, 0, 45);
  return 1;
}

/* micro.h: guess2. Two levels, 4 pairs (16 lanes, k = 64). */
static int bf16_guess2(const uint16_t *x, int g, uint32_t *minnz, bx_i128 *v, int64_t *hmax) {
  const __m256d ah = anchor4(g - 256), al = anchor4(g - 301);
  __m256d h[4] = {ah, ah, ah, ah}, l[4] = {al, al, al, al};
  __m256i mn = _mm256_set1_epi16(-1);
  for (size_t i = 0; i < BLOCK; i += 32) {
    bx_prefetch_line(x + i);
    __m256i a = _mm256_loadu_si256((const void *)(x + i));
    __m256i b = _mm256_loadu_si256((const void *)(x + i + 16));
    mn = bf16_min16(b, bf16_min16(a, mn));
    bf16_fast2_16(a, h, l);
    bf16_fast2_16(b, h, l);
  }
  *minnz = bf16_min_done(mn);
  const __m256i an = _mm256_castpd_si256(ah), aln = _mm256_castpd_si256(al);
  __m256i bad = _mm256_setzero_si256(), a[4], b[4];
  for (int k = 0; k < 4; k++) {
    a[k] = lanes_diff(h[k], an, &bad);
    b[k] = lanes_diff(l[k], aln, &bad);
  }
  if (lanes_bad(bad)) return 0;
  __m256i hs = _mm256_add_epi64(_mm256_add_epi64(a[0], a[1]), _mm256_add_epi64(a[2], a[3]));
  __m256i ls = _mm256_add_epi64(_mm256_add_epi64(b[0], b[1]), _mm256_add_epi64(b[2], b[3]));
  *hmax = hmax_epi64(max_epi64(max_epi64(a[0], a[1]), max_epi64(a[2], a[3])));
  *v = bx_combine(hsum64(hs), hsum64(ls), 45);
  return 1;
}

/* micro.h: bins_prep. 16 elements a vector: exponent fields, significands
 * with the hidden bit and their squares (< 2^16: vpmullw) in 16-bit lanes. */
static size_t bf16_bins_prep(const uint16_t *x, size_t m, uint16_t *idx, uint16_t *val, bx_bins_span *sp) {
  const __m256i ff = _mm256_set1_epi16(0xFF), frac = _mm256_set1_epi16(0x7F), zero = _mm256_setzero_si256();
  __m256i emx = zero, emn = _mm256_set1_epi16(0xFF);
  size_t mr = (m + 15) & ~(size_t)15; /* the rest of the last 16 reads as zeros */
  for (size_t j = 0; j < mr; j += 16) {
    if ((j & 31) == 0) bx_prefetch_line(x + j);
    __m256i v = ld16(x + j, m - j);
    __m256i e = _mm256_and_si256(_mm256_srli_epi16(v, 7), ff);
    __m256i f = _mm256_and_si256(v, frac);
    __m256i spec = _mm256_cmpeq_epi16(e, ff);
    if (!_mm256_testz_si256(spec, spec)) { /* NaN/Inf: counted; bin 255 is never deposited */
      __m256i nan = _mm256_andnot_si256(_mm256_cmpeq_epi16(f, zero), spec);
      int ns = __builtin_popcount((unsigned)_mm256_movemask_epi8(spec)) / 2;
      int nn = __builtin_popcount((unsigned)_mm256_movemask_epi8(nan)) / 2;
      sp->nan += nn;
      sp->inf += ns - nn;
    }
    __m256i mm = _mm256_or_si256(f, _mm256_andnot_si256(_mm256_cmpeq_epi16(e, zero), _mm256_set1_epi16(0x80)));
    emx = _mm256_max_epu16(emx, _mm256_andnot_si256(spec, e));
    __m256i isz = _mm256_cmpeq_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7FFF)), zero);
    emn = _mm256_min_epu16(emn, _mm256_or_si256(e, _mm256_and_si256(isz, ff)));
    _mm256_store_si256((void *)(idx + j), e);
    _mm256_store_si256((void *)(val + j), _mm256_mullo_epi16(mm, mm));
  }
  uint32_t hi = bf16_max_done(emx);
  uint32_t lo = hmin_epu32(_mm256_min_epu32(_mm256_unpacklo_epi16(emn, zero), _mm256_unpackhi_epi16(emn, zero)));
  sp->emax = hi > sp->emax ? hi : sp->emax;
  sp->eminnz = lo < sp->eminnz ? lo : sp->eminnz;
  return mr;
}

const bx_bf16_micro bx_micro_bf16_avx2 = {
    BLOCK,             bf16_stats,        bf16_window1,   bf16_window2, bf16_window1_fast,
    bf16_window2_fast, bf16_window3_fast, bf16_bins_prep, bf16_guess1,  bf16_guess2,
    NULL, /* no verified window: no per-instruction exception suppression */
};

/* ======================================================================
 * fp16: one fixed window (G = -12, L = -57), no pass 1; F16C widening.
 * ====================================================================== */

static inline void f16_step16(__m256i v, __m256d h[4], __m256d l[4]) {
  __m256 f0 = _mm256_cvtph_ps(_mm256_castsi256_si128(v));
  __m256 f1 = _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1));
  sq2(_mm256_cvtps_pd(_mm256_castps256_ps128(f0)), &h[0], &l[0]);
  sq2(_mm256_cvtps_pd(_mm256_extractf128_ps(f0, 1)), &h[1], &l[1]);
  sq2(_mm256_cvtps_pd(_mm256_castps256_ps128(f1)), &h[2], &l[2]);
  sq2(_mm256_cvtps_pd(_mm256_extractf128_ps(f1, 1)), &h[3], &l[3]);
}

/* 1 if every hi lane still has the anchor's exponent field (finite). */
static inline int f16_finite(const __m256d h[4]) {
  __m256i e = _mm256_set1_epi64x(bx_anchor_bits(-12) >> 52), ok = _mm256_set1_epi64x(-1);
  for (int k = 0; k < 4; k++)
    ok = _mm256_and_si256(ok, _mm256_cmpeq_epi64(_mm256_srli_epi64(_mm256_castpd_si256(h[k]), 52), e));
  return _mm256_movemask_epi8(ok) == -1;
}

/* micro.h: the fp16 window. A lane takes one element per 16: at most 64
 * a block, the zero-padded tail included. */
static int f16_window(const uint16_t *b, size_t len, bx_i128 *v, int64_t *hmax) {
  const __m256d ah = anchor4(-12), al = anchor4(-57);
  __m256d h[4] = {ah, ah, ah, ah}, l[4] = {al, al, al, al};
  size_t j = 0;
  for (; j + 32 <= len; j += 32) {
    bx_prefetch_line(b + j);
    f16_step16(_mm256_loadu_si256((const void *)(b + j)), h, l);
    f16_step16(_mm256_loadu_si256((const void *)(b + j + 16)), h, l);
  }
  for (; j < len; j += 16) f16_step16(ld16(b + j, len - j), h, l);
  if (!f16_finite(h)) return 0;
  const __m256i an = _mm256_castpd_si256(ah);
  __m256i bad = _mm256_setzero_si256();
  *hmax = hmax_epi64(max_epi64(max_epi64(lanes_diff(h[0], an, &bad), lanes_diff(h[1], an, &bad)),
                               max_epi64(lanes_diff(h[2], an, &bad), lanes_diff(h[3], an, &bad))));
  *v = bx_combine(lanes_sum(h[0], h[1], h[2], h[3], -12), lanes_sum(l[0], l[1], l[2], l[3], -57), 45);
  return 1;
}

/* 16 fp16 words squared into 4 accumulators of 4 lanes (one level) */
static inline void f16_one16(__m256i v, __m256d h[4]) {
  __m256 f0 = _mm256_cvtph_ps(_mm256_castsi256_si128(v));
  __m256 f1 = _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1));
  __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(f0)), d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(f0, 1));
  __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(f1)), d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(f1, 1));
  h[0] = _mm256_fmadd_pd(d0, d0, h[0]);
  h[1] = _mm256_fmadd_pd(d1, d1, h[1]);
  h[2] = _mm256_fmadd_pd(d2, d2, h[2]);
  h[3] = _mm256_fmadd_pd(d3, d3, h[3]);
}

/* micro.h: guess (fp16). One level, 8 accumulators (32 lanes, k = 32);
 * the words with 0 < |x| bits < thr are set apart and zeroed. */
static int f16_guess(const uint16_t *x, int g, uint32_t thr, uint16_t *tiny, int *ntiny, bx_i128 *v,
                     int64_t *hmax) {
  const __m256d ah = anchor4(g);
  const __m256i vt = _mm256_set1_epi16((short)thr);
  __m256d h[8] = {ah, ah, ah, ah, ah, ah, ah, ah};
  *ntiny = 0;
  for (size_t i = 0; i < BLOCK; i += 32) {
    bx_prefetch_line(x + i);
    __m256i a = _mm256_loadu_si256((const void *)(x + i));
    __m256i b = _mm256_loadu_si256((const void *)(x + i + 16));
    if (!set_apart32(x + i, &a, &b, vt, tiny, ntiny)) return 0;
    f16_one16(a, h);
    f16_one16(b, h + 4);
  }
  int64_t sum;
  if (!lanes8_fold(h, _mm256_castpd_si256(ah), &sum, hmax)) return 0;
  *v = sum;
  return 1;
}

const bx_f16_micro bx_micro_f16_avx2 = {BLOCK, f16_window, f16_guess};
