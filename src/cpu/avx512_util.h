/*
 * avx512_util.h — the AVX-512 helpers the avx512*.c micro-kernel files
 * share (anchors, the two- and three-level steps, the exact fold, the
 * binade test). Included only by src/cpu/avx512*.c, which are compiled
 * with the AVX-512 flags.
 */
#ifndef BX_AVX512_UTIL_H
#define BX_AVX512_UTIL_H

#include <immintrin.h>

#include "micro.h"
#include "prefetch.h"

#define BX_AVX512_BLOCK 2048 /* fp32/bf16/fp16 elements a block: 32 lanes x 64 */

static inline __m512d anchor_pd(int g) {
  return _mm512_castsi512_pd(_mm512_set1_epi64(bx_anchor_bits(g)));
}

/* hi += x^2 with the rounding error into lo (fma form, x^2 exact). */
static inline void sq2(__m512d x, __m512d *hi, __m512d *lo) {
  __m512d t = _mm512_fmadd_pd(x, x, *hi);
  __m512d d = _mm512_sub_pd(*hi, t);
  *lo = _mm512_add_pd(*lo, _mm512_fmadd_pd(x, x, d));
  *hi = t;
}

/* sq2 with d = hi - t as fnmadd(t, 1, hi) when fma_sub: on Zen 4 the
 * FMA pipes take it, the add pipes keep cvtps2pd and the lo sums. */
static inline void sq2b(__m512d x, __m512d *hi, __m512d *lo, int fma_sub) {
  __m512d t = _mm512_fmadd_pd(x, x, *hi);
  __m512d d = fma_sub ? _mm512_fnmadd_pd(t, _mm512_set1_pd(1.0), *hi) : _mm512_sub_pd(*hi, t);
  *lo = _mm512_add_pd(*lo, _mm512_fmadd_pd(x, x, d));
  *hi = t;
}

/* hi += v with the rounding error into lo (add form, v a double). */
static inline void add2(__m512d v, __m512d *hi, __m512d *lo) {
  __m512d t = _mm512_add_pd(*hi, v);
  __m512d d = _mm512_sub_pd(*hi, t);
  *lo = _mm512_add_pd(*lo, _mm512_add_pd(v, d));
  *hi = t;
}

/* Sum over the lanes of 4 vectors of (bits - anchor bits): exact. */
static inline int64_t lanes_sum(__m512d a, __m512d b, __m512d c, __m512d d, int g) {
  __m512i an = _mm512_set1_epi64(bx_anchor_bits(g));
  __m512i s = _mm512_add_epi64(_mm512_sub_epi64(_mm512_castpd_si512(a), an),
                               _mm512_sub_epi64(_mm512_castpd_si512(b), an));
  s = _mm512_add_epi64(s, _mm512_sub_epi64(_mm512_castpd_si512(c), an));
  s = _mm512_add_epi64(s, _mm512_sub_epi64(_mm512_castpd_si512(d), an));
  return _mm512_reduce_add_epi64(s);
}

/* H * 2^45 + L: a block's sum in units of 2^(G-45); 2^46 for fp64. */
static inline bx_i128 combine45(int64_t h, int64_t l) { return bx_combine(h, l, 45); }
static inline bx_i128 combine46(int64_t h, int64_t l) { return bx_combine(h, l, 46); }

/* Lanes minus the anchor an; *bad gets lanes outside [anchor - 2^51,
 * anchor + 2^51), i.e. outside the anchor's binade (non-finite included). */
static inline __m512i lanes_diff(__m512d a, __m512i an, __m512i *bad) {
  __m512i d = _mm512_sub_epi64(_mm512_castpd_si512(a), an);
  *bad = _mm512_or_si512(*bad, _mm512_add_epi64(d, _mm512_set1_epi64((int64_t)1 << 51)));
  return d;
}
static inline int lanes_bad(__m512i bad) {
  return _mm512_test_epi64_mask(bad, _mm512_set1_epi64(-((int64_t)1 << 52))) != 0;
}

static inline uint32_t tail_mask32(size_t r) { /* r in [1, 31] */
  return (uint32_t)((1ull << r) - 1);
}

/* hi += x^2, its rounding error e into mid, mid's error e2 into lo (the
 * three-level grid of exact_grid.h). */
static inline void sq3(__m512d x, __m512d *hi, __m512d *mi, __m512d *lo) {
  const __m512d one = _mm512_set1_pd(1.0); /* u - v as fnmadd(v,1,u): the FMA pipes */
  __m512d t = _mm512_fmadd_pd(x, x, *hi);
  __m512d e = _mm512_fmadd_pd(x, x, _mm512_fnmadd_pd(t, one, *hi));
  __m512d t2 = _mm512_add_pd(*mi, e);
  *lo = _mm512_add_pd(*lo, _mm512_add_pd(e, _mm512_fnmadd_pd(t2, one, *mi)));
  *hi = t;
  *mi = t2;
}

#endif /* BX_AVX512_UTIL_H */
