/*
 * avx512_tokred.c — the AVX-512 kernel of the token reduction's grid add
 * (kernels.h, bx_tokred_grid_fn), 16 elements a step: non-finite lanes
 * masked to +0 and counted (popcount of the mask), each half widened
 * exactly to fp64 (vcvtps2pd), multiplied by the power of two 2^-e
 * (exact), 1.5 * 2^52 added (one rounding to nearest even: the integer
 * lands in the low mantissa bits), the magic's bits subtracted as int64 and
 * the result added to the words (vpaddq). The same IEEE operations as the
 * scalar rule (tokred_grid.h's bx_tokred_q) element for element, so the
 * words are identical to the portable kernel's for every input. The tail
 * uses masked loads and stores.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"

static inline void add8(int64_t *w, __m256 v, __m512d inv, __m512d magic, __m512i mbits,
                        __mmask8 k) {
  __m512d r = _mm512_add_pd(_mm512_mul_pd(_mm512_cvtps_pd(v), inv), magic);
  __m512i q = _mm512_sub_epi64(_mm512_castpd_si512(r), mbits);
  __m512i old = _mm512_maskz_loadu_epi64(k, w);
  _mm512_mask_storeu_epi64(w, k, _mm512_add_epi64(old, q));
}

static uint32_t avx512_grid_add(int64_t *w, const float *a, size_t n, double inv_step,
                                int64_t *nonfinite) {
  const double magic_d = 6755399441055744.0; /* 1.5 * 2^52 */
  int64_t mb;
  memcpy(&mb, &magic_d, sizeof mb);
  const __m512d inv = _mm512_set1_pd(inv_step), magic = _mm512_set1_pd(magic_d);
  const __m512i mbits = _mm512_set1_epi64(mb);
  const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  __m512i mx = _mm512_setzero_si512();
  int64_t fin_count = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i x = _mm512_loadu_si512((const void *)(a + i));
    __m512i ab = _mm512_and_si512(x, absm);
    __mmask16 fin = _mm512_cmplt_epi32_mask(ab, inf);
    fin_count += __builtin_popcount((unsigned)fin);
    mx = _mm512_mask_max_epi32(mx, fin, mx, ab);
    __m512 v = _mm512_castsi512_ps(_mm512_maskz_mov_epi32(fin, x));
    add8(w + i, _mm512_castps512_ps256(v), inv, magic, mbits, 0xff);
    add8(w + i + 8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)), inv, magic,
         mbits, 0xff);
  }
  if (i < n) {
    size_t rem = n - i;
    __mmask16 k = (__mmask16)((1u << rem) - 1);
    __m512i x = _mm512_maskz_loadu_epi32(k, a + i);
    __m512i ab = _mm512_and_si512(x, absm);
    __mmask16 fin = _mm512_mask_cmplt_epi32_mask(k, ab, inf);
    fin_count += __builtin_popcount((unsigned)fin);
    mx = _mm512_mask_max_epi32(mx, fin, mx, ab);
    __m512 v = _mm512_castsi512_ps(_mm512_maskz_mov_epi32(fin, x));
    add8(w + i, _mm512_castps512_ps256(v), inv, magic, mbits, (__mmask8)(k & 0xff));
    if (rem > 8)
      add8(w + i + 8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)), inv,
           magic, mbits, (__mmask8)(k >> 8));
  }
  *nonfinite = (int64_t)n - fin_count;
  return (uint32_t)_mm512_reduce_max_epi32(mx);
}

/* four independent maxima of 16 lanes (64 elements a step), then one */
static uint32_t avx512_max_abs(const float *a, size_t n) {
  const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
  size_t i = 0;
#define STEP(m, off)                                                            \
  do {                                                                          \
    __m512i ab = _mm512_and_si512(_mm512_loadu_si512((const void *)(a + i + (off))), absm); \
    m = _mm512_mask_max_epi32(m, _mm512_cmplt_epi32_mask(ab, inf), m, ab);      \
  } while (0)
  for (; i + 64 <= n; i += 64) {
    STEP(m0, 0);
    STEP(m1, 16);
    STEP(m2, 32);
    STEP(m3, 48);
  }
  for (; i + 16 <= n; i += 16) STEP(m0, 0);
#undef STEP
  if (i < n) {
    __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
    __m512i ab = _mm512_and_si512(_mm512_maskz_loadu_epi32(k, a + i), absm);
    m1 = _mm512_mask_max_epi32(m1, _mm512_mask_cmplt_epi32_mask(k, ab, inf), m1, ab);
  }
  m0 = _mm512_max_epi32(_mm512_max_epi32(m0, m1), _mm512_max_epi32(m2, m3));
  return (uint32_t)_mm512_reduce_max_epi32(m0);
}

const bx_tokred_kernels bx_tokred_avx512 = {"avx512", avx512_grid_add, avx512_max_abs};
