/*
 * avx2_util.h — the AVX2 helpers the avx2*.c micro-kernel files share
 * (anchors, the two- and three-level steps, the exact fold, the binade
 * test). Included only by src/cpu/avx2*.c, which are compiled with the
 * AVX2/FMA/F16C flags.
 */
#ifndef BX_AVX2_UTIL_H
#define BX_AVX2_UTIL_H

#include <immintrin.h>

#include "micro.h"
#include "prefetch.h"

#define BLOCK 1024 /* fp32/bf16/fp16 elements a block: 16 lanes x 64 */

static inline __m256d anchor4(int g) {
  return _mm256_castsi256_pd(_mm256_set1_epi64x(bx_anchor_bits(g)));
}

/* hi += x^2 with the rounding error into lo (fma form, x^2 exact). */
static inline void sq2(__m256d x, __m256d *hi, __m256d *lo) {
  __m256d t = _mm256_fmadd_pd(x, x, *hi);
  __m256d d = _mm256_sub_pd(*hi, t);
  *lo = _mm256_add_pd(*lo, _mm256_fmadd_pd(x, x, d));
  *hi = t;
}

/* hi += v with the rounding error into lo (add form). */
static inline void add2(__m256d v, __m256d *hi, __m256d *lo) {
  __m256d t = _mm256_add_pd(*hi, v);
  __m256d d = _mm256_sub_pd(*hi, t);
  *lo = _mm256_add_pd(*lo, _mm256_add_pd(v, d));
  *hi = t;
}

static inline int64_t hsum64(__m256i v) {
  __m128i s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return _mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1);
}

/* Sum over the lanes of 4 vectors of (bits - anchor bits): exact. */
static inline int64_t lanes_sum(__m256d a, __m256d b, __m256d c, __m256d d, int g) {
  __m256i an = _mm256_set1_epi64x(bx_anchor_bits(g));
  __m256i s = _mm256_add_epi64(_mm256_sub_epi64(_mm256_castpd_si256(a), an),
                               _mm256_sub_epi64(_mm256_castpd_si256(b), an));
  s = _mm256_add_epi64(s, _mm256_sub_epi64(_mm256_castpd_si256(c), an));
  s = _mm256_add_epi64(s, _mm256_sub_epi64(_mm256_castpd_si256(d), an));
  return hsum64(s);
}

/* signed 64-bit max (|x| bits and lane differences fit) */
static inline __m256i max_epi64(__m256i a, __m256i b) {
  return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a));
}

static inline __m256i min_epi64(__m256i a, __m256i b) {
  return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b));
}

static inline int64_t hmin_epi64(__m256i v) {
  __m128i m = _mm256_castsi256_si128(v), h = _mm256_extracti128_si256(v, 1);
  m = _mm_blendv_epi8(m, h, _mm_cmpgt_epi64(m, h));
  int64_t a = _mm_cvtsi128_si64(m), b = _mm_extract_epi64(m, 1);
  return a < b ? a : b;
}

static inline int64_t hmax_epi64(__m256i v) {
  __m128i m = _mm256_castsi256_si128(v), h = _mm256_extracti128_si256(v, 1);
  m = _mm_blendv_epi8(m, h, _mm_cmpgt_epi64(h, m));
  int64_t a = _mm_cvtsi128_si64(m), b = _mm_extract_epi64(m, 1);
  return a > b ? a : b;
}

static inline uint32_t hmax_epu32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return (uint32_t)_mm_cvtsi128_si32(m);
}

static inline uint32_t hmin_epu32(__m256i v) {
  __m128i m = _mm_min_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_min_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_min_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return (uint32_t)_mm_cvtsi128_si32(m);
}

/* hi += x^2, its error e into mid, mid's error into lo (three levels). */
static inline void sq3(__m256d x, __m256d *hi, __m256d *mi, __m256d *lo) {
  const __m256d one = _mm256_set1_pd(1.0); /* u - v as fnmadd(v,1,u): the FMA pipes */
  __m256d t = _mm256_fmadd_pd(x, x, *hi);
  __m256d e = _mm256_fmadd_pd(x, x, _mm256_fnmadd_pd(t, one, *hi));
  __m256d t2 = _mm256_add_pd(*mi, e);
  *lo = _mm256_add_pd(*lo, _mm256_add_pd(e, _mm256_fnmadd_pd(t2, one, *mi)));
  *hi = t;
  *mi = t2;
}

/* Three levels use 2 sets (8 lanes), so a block is done in halves of 512
 * (64 elements a lane). */
typedef struct bx_sets3 {
  __m256d h0, m0, l0, h1, m1, l1;
} bx_sets3;

static inline void sets3_init(bx_sets3 *s, int g) {
  s->h0 = s->h1 = anchor4(g);
  s->m0 = s->m1 = anchor4(g - 45);
  s->l0 = s->l1 = anchor4(g - 90);
}

/* fold: *v1 += H 2^45 + Mid (units 2^(G-45)), *v2 += Lo (units 2^(G-90)) */
static inline void sets3_fold(const bx_sets3 *s, int g, bx_i128 *v1, bx_i128 *v2) {
  __m256d ah = anchor4(g), am = anchor4(g - 45), al = anchor4(g - 90);
  *v1 += bx_combine(lanes_sum(s->h0, s->h1, ah, ah, g), lanes_sum(s->m0, s->m1, am, am, g - 45), 45);
  *v2 += lanes_sum(s->l0, s->l1, al, al, g - 90);
}

/* Lanes minus the anchor an; *bad gets lanes outside [anchor - 2^51,
 * anchor + 2^51), i.e. outside the anchor's binade (non-finite included). */
static inline __m256i lanes_diff(__m256d a, __m256i an, __m256i *bad) {
  __m256i d = _mm256_sub_epi64(_mm256_castpd_si256(a), an);
  *bad = _mm256_or_si256(*bad, _mm256_add_epi64(d, _mm256_set1_epi64x((int64_t)1 << 51)));
  return d;
}
static inline int lanes_bad(__m256i bad) {
  return !_mm256_testz_si256(bad, _mm256_set1_epi64x(-((int64_t)1 << 52)));
}

#endif /* BX_AVX2_UTIL_H */
