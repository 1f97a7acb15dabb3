/*
 * avx2_half.c — exact sum of squares of bf16 and fp16 tensors, AVX2 + F16C.
 * Scheme and proofs: exact_grid.h. Blocks of 1024 (k = 64 per lane).
 */
#include <string.h>

#include "avx2_util.h"

/* ======================================================================
 * bf16: 16 elements a vector; widened to fp32 by interleaving with zeros
 * (lane order is irrelevant to a sum), then to fp64.
 * ====================================================================== */

static void bf16_stats(const uint16_t *x, size_t len, uint32_t *amax, uint32_t *aminnz) {
  const __m256i absm = _mm256_set1_epi16(0x7FFF), one = _mm256_set1_epi16(1);
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi16(-1);
  for (size_t i = 0; i < len; i += 16) {
    uint16_t buf[16] = {0};
    const uint16_t *p = x + i;
    if (len - i < 16) {
      memcpy(buf, p, (len - i) * sizeof *x);
      p = buf;
    }
    __m256i a = _mm256_and_si256(_mm256_loadu_si256((const void *)p), absm);
    mx = _mm256_max_epu16(mx, a);
    mn = _mm256_min_epu16(mn, _mm256_sub_epi16(a, one));
  }
  __m256i z = _mm256_setzero_si256();
  *amax = hmax_epu32(_mm256_max_epu32(_mm256_unpacklo_epi16(mx, z), _mm256_unpackhi_epi16(mx, z)));
  *aminnz = (hmin_epu32(_mm256_min_epu32(_mm256_unpacklo_epi16(mn, z), _mm256_unpackhi_epi16(mn, z))) + 1u) & 0xFFFF;
}

/* 16 bf16 at p (or fewer, zero-padded) as two vectors of 8 fp32 bits */
static inline void bf16_widen(const uint16_t *x, size_t left, __m256i *a, __m256i *b) {
  uint16_t buf[16] = {0};
  if (left < 16) {
    memcpy(buf, x, left * sizeof *x);
    x = buf;
  }
  __m256i v = _mm256_loadu_si256((const void *)x);
  *a = _mm256_unpacklo_epi16(_mm256_setzero_si256(), v);
  *b = _mm256_unpackhi_epi16(_mm256_setzero_si256(), v);
}

static inline __m256d cvt_lo(__m256i f) { return _mm256_cvtps_pd(_mm256_castps256_ps128(_mm256_castsi256_ps(f))); }
static inline __m256d cvt_hi(__m256i f) { return _mm256_cvtps_pd(_mm256_extractf128_ps(_mm256_castsi256_ps(f), 1)); }

/* One-level: every non-zero x^2 a multiple of 2^G; fma(x,x,hi) is exact. */
static bx_i128 bf16_window1_all(const uint16_t *x, size_t len, int g) {
  const __m256d ah = anchor4(g);
  __m256d h0 = ah, h1 = ah, h2 = ah, h3 = ah;
  for (size_t i = 0; i < len; i += 16) {
    __m256i a, b;
    bf16_widen(x + i, len - i, &a, &b);
    __m256d d0 = cvt_lo(a), d1 = cvt_hi(a), d2 = cvt_lo(b), d3 = cvt_hi(b);
    h0 = _mm256_fmadd_pd(d0, d0, h0);
    h1 = _mm256_fmadd_pd(d1, d1, h1);
    h2 = _mm256_fmadd_pd(d2, d2, h2);
    h3 = _mm256_fmadd_pd(d3, d3, h3);
  }
  return bx_combine(lanes_sum(h0, h1, h2, h3, g), 0, 45);
}

/* Windows without conversions, for blocks without subnormals. A 64-bit
 * lane holds 4 bf16 words; word j shifted to bits 45..60 and masked to
 * bits 45..59 lines its exponent and mantissa fields up with a double's:
 * y = |x| 2^-896 exactly. y' = y with bits 61, 62 set has exponent field e
 * + 1536: |x| 2^640 for normal x (x = 0 gives y = 0, so y*y' = 0 whatever
 * y' is). The fma sees y*y' = x^2 2^-256 exactly: the window of G moved by
 * -256 (every grid stays normal: G - 256 - 90 >= -640). */
static inline void bf16_split4(const uint16_t *x, size_t left, __m256i w[4]) {
  uint16_t buf[16] = {0};
  if (left < 16) {
    memcpy(buf, x, left * sizeof *x);
    x = buf;
  }
  __m256i v = _mm256_loadu_si256((const void *)x);
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

static bx_i128 bf16_window1_fast(const uint16_t *x, size_t len, int g) {
  const __m256d ah = anchor4(g - 256);
  __m256d h0 = ah, h1 = ah, h2 = ah, h3 = ah;
  for (size_t i = 0; i < len; i += 16) {
    __m256i w[4];
    bf16_split4(x + i, len - i, w);
    h0 = bf16_sq1(w[0], h0);
    h1 = bf16_sq1(w[1], h1);
    h2 = bf16_sq1(w[2], h2);
    h3 = bf16_sq1(w[3], h3);
  }
  return bx_combine(lanes_sum(h0, h1, h2, h3, g - 256), 0, 45);
}

static inline void bf16_sq2(__m256i w, __m256d *hi, __m256d *lo) {
  __m256d y = bf16_y(w), yp = bf16_yp(y);
  __m256d t = _mm256_fmadd_pd(y, yp, *hi);
  *lo = _mm256_add_pd(*lo, _mm256_fmadd_pd(y, yp, _mm256_sub_pd(*hi, t)));
  *hi = t;
}

/* Every non-zero element inside the two-level window of G. */
static bx_i128 bf16_window2_fast(const uint16_t *x, size_t len, int g) {
  const __m256d ah = anchor4(g - 256), al = anchor4(g - 301);
  __m256d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  for (size_t i = 0; i < len; i += 16) {
    __m256i w[4];
    bf16_split4(x + i, len - i, w);
    bf16_sq2(w[0], &h0, &l0);
    bf16_sq2(w[1], &h1, &l1);
    bf16_sq2(w[2], &h2, &l2);
    bf16_sq2(w[3], &h3, &l3);
  }
  return bx_combine(lanes_sum(h0, h1, h2, h3, g - 256), lanes_sum(l0, l1, l2, l3, g - 301), 45);
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

/* Three levels, 2 sets (8 lanes) over halves of 512: 64 elements a lane. */
static bx_i128 bf16_window3_fast(const uint16_t *x, size_t len, int g, bx_i128 *v2) {
  bx_i128 v1 = 0;
  *v2 = 0;
  for (size_t h = 0; h < len; h += BLOCK / 2) {
    size_t end = len - h < BLOCK / 2 ? len : h + BLOCK / 2;
    bx_sets3 s;
    sets3_init(&s, g - 256);
    for (size_t i = h; i < end; i += 16) {
      __m256i w[4];
      bf16_split4(x + i, end - i, w);
      bf16_sq3(w[0], &s.h0, &s.m0, &s.l0);
      bf16_sq3(w[1], &s.h1, &s.m1, &s.l1);
      bf16_sq3(w[2], &s.h0, &s.m0, &s.l0);
      bf16_sq3(w[3], &s.h1, &s.m1, &s.l1);
    }
    sets3_fold(&s, g - 256, &v1, v2);
  }
  return v1;
}

/* Two-level window with masks; thr/upper are bf16 |x| bits. */
static bx_i128 bf16_window2_masked(const uint16_t *x, size_t len, int g, uint32_t thr,
                                   uint32_t upper, uint32_t *restmax) {
  const __m256d ah = anchor4(g), al = anchor4(g - 45);
  const __m256i vt = _mm256_set1_epi32((int)(thr << 16)), vu = _mm256_set1_epi32((int)(upper << 16));
  __m256d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  __m256i r = _mm256_setzero_si256();
  for (size_t i = 0; i < len; i += 16) {
    __m256i a, b;
    bf16_widen(x + i, len - i, &a, &b);
    f32_masked8(a, vt, vu, &r, &h0, &l0, &h1, &l1);
    f32_masked8(b, vt, vu, &r, &h2, &l2, &h3, &l3);
  }
  *restmax = hmax_epu32(r) >> 16;
  return bx_combine(lanes_sum(h0, h1, h2, h3, g), lanes_sum(l0, l1, l2, l3, g - 45), 45);
}

static int bf16_block(const uint16_t *x, size_t len, bx_acc *acc, bx_pending *p1, bx_pending *p2) {
  uint32_t amax, aminnz;
  bf16_stats(x, len, &amax, &aminnz);
  if (amax >= 0x7F80u || bx_bf16_too_wide(amax, aminnz)) {
    return 1; /* NaN/Inf, or spread too wide: the caller's scalar run */
  }
  if (amax == 0) return 0;
  int ebtop = amax >> 7 ? (int)(amax >> 7) : 1, g = bx_f32_g(ebtop);
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
  uint32_t thr = bx_bf16_thr(ebtop, 37), upper = 0x7F80u;
  for (;;) {
    uint32_t rest;
    bx_pend_add(p1, acc, bf16_window2_masked(x, len, g, thr, upper, &rest), g - 45);
    if (rest == 0) return 0;
    upper = thr;
    ebtop = rest >> 7 ? (int)(rest >> 7) : 1;
    g = bx_f32_g(ebtop);
    thr = bx_bf16_thr(ebtop, 37);
  }
}

void bx_avx2_sumsq_bf16(const void *xv, size_t n, bx_acc *acc) {
  unsigned csr = bx_csr_enter(); /* exact_grid.h: no DAZ, flags our own */
  const uint16_t *x = xv;
  bx_pending p1 = {0, 0, 0}, p2 = {0, 0, 0};
  size_t scalar_n = 0, i = 0, len = BLOCK, run = 0, run_at = 0; /* run: for the scalar kernel */
  if (((uintptr_t)x & 1) == 0) len -= ((uintptr_t)x >> 1) & 15;
  while (i < n) {
    if (len > n - i) len = n - i;
    int scalar = bf16_block(x + i, len, acc, &p1, &p2);
    if (scalar) {
      if (!run) run_at = i;
      run += len;
    }
    if (run && (!scalar || run >= BX_SCALAR_RUN_MAX)) { /* the run still in L2 */
      bx_sumsq_bf16_scalar(x + run_at, run, acc); /* counts them */
      scalar_n += run;
      run = 0;
    }
    i += len;
    len = BLOCK;
  }
  if (run) {
    bx_sumsq_bf16_scalar(x + run_at, run, acc);
    scalar_n += run;
  }
  bx_pend_flush(&p1, acc);
  bx_pend_flush(&p2, acc);
  acc->count += (int64_t)(n - scalar_n);
  bx_csr_leave(csr);
}

/* ======================================================================
 * fp16: one fixed window (G = -12, L = -57), no pass 1; F16C widening.
 * ====================================================================== */

static inline void f16_step16(const uint16_t *p, __m256d h[4], __m256d l[4]) {
  __m256 f0 = _mm256_cvtph_ps(_mm_loadu_si128((const void *)p));
  __m256 f1 = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(p + 8)));
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

void bx_avx2_sumsq_f16(const void *xv, size_t n, bx_acc *acc) {
  unsigned csr = bx_csr_enter(); /* exact_grid.h: no DAZ, flags our own */
  const uint16_t *x = xv;
  const __m256d ah = anchor4(-12), al = anchor4(-57);
  bx_pending p = {0, 0, 0};
  size_t scalar_n = 0, i = 0, len = BLOCK, run = 0, run_at = 0; /* run: for the scalar kernel */
  if (((uintptr_t)x & 1) == 0) len -= ((uintptr_t)x >> 1) & 15;
  while (i < n) {
    if (len > n - i) len = n - i;
    const uint16_t *b = x + i;
    __m256d h[4] = {ah, ah, ah, ah}, l[4] = {al, al, al, al};
    size_t j = 0;
    for (; j + 16 <= len; j += 16) f16_step16(b + j, h, l);
    if (j < len) {
      uint16_t buf[16] = {0};
      memcpy(buf, b + j, (len - j) * sizeof *b);
      f16_step16(buf, h, l);
    }
    if (f16_finite(h)) {
      bx_pend_add(&p, acc, bx_combine(lanes_sum(h[0], h[1], h[2], h[3], -12), lanes_sum(l[0], l[1], l[2], l[3], -57), 45), -57);
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
    len = BLOCK;
  }
  if (run) {
    bx_sumsq_f16_scalar(x + run_at, run, acc);
    scalar_n += run;
  }
  bx_pend_flush(&p, acc);
  acc->count += (int64_t)(n - scalar_n);
  bx_csr_leave(csr);
}
