/*
 * avx2_util.h — the AVX2 helpers the avx2*.c kernel files share (anchors,
 * the two- and three-level steps, masks, the exact fold) and the entry
 * points they export to avx2.c's table. Included only by src/cpu/avx2*.c,
 * which are compiled with the AVX2/FMA/F16C flags.
 */
#ifndef BX_AVX2_UTIL_H
#define BX_AVX2_UTIL_H

#include <immintrin.h>

#include "exact_grid.h"

#define BLOCK 1024 /* fp32/bf16/fp16 elements a block: 16 lanes x 64 */

/* sum x^2 entry points of avx2_half.c and avx2_f64.c */
void bx_avx2_sumsq_bf16(const void *x, size_t n, bx_acc *acc);
void bx_avx2_sumsq_f16(const void *x, size_t n, bx_acc *acc);
void bx_avx2_sumsq_f64(const void *x, size_t n, bx_acc *acc);

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

/* 8 elements (fp32 bits b) whose |x| bits lie in [thr, upper): zeroed
 * outside; the max of those below thr goes to *rest. All |x| bits are
 * below 2^31, so signed compares order them. */
static inline __m256 f32_window_mask8(__m256i b, __m256i thr, __m256i upper, __m256i *rest) {
  __m256i a = _mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF));
  __m256i below = _mm256_cmpgt_epi32(thr, a);
  __m256i in = _mm256_andnot_si256(below, _mm256_cmpgt_epi32(upper, a));
  *rest = _mm256_max_epu32(*rest, _mm256_and_si256(below, a));
  return _mm256_castsi256_ps(_mm256_and_si256(b, in));
}

/* Two-level masked step for bf16 windows: 8 widened elements into two
 * accumulator pairs. */
static inline void f32_masked8(__m256i b, __m256i thr, __m256i upper, __m256i *rest, __m256d *ha,
                               __m256d *la, __m256d *hb, __m256d *lb) {
  __m256 xs = f32_window_mask8(b, thr, upper, rest);
  sq2(_mm256_cvtps_pd(_mm256_castps256_ps128(xs)), ha, la);
  sq2(_mm256_cvtps_pd(_mm256_extractf128_ps(xs, 1)), hb, lb);
}

#endif /* BX_AVX2_UTIL_H */
