/*
 * avx2_tokred.c — the AVX2 kernel of the token reduction's grid add
 * (kernels.h, bx_tokred_grid_fn), 8 elements a step: non-finite lanes
 * masked to +0 and counted, each half widened exactly to fp64
 * (vcvtps2pd), multiplied by 2^-e (exact), 1.5 * 2^52 added (one rounding
 * to nearest even), the magic's bits subtracted as int64 and the result
 * added to the words. AVX2 has no fp64 -> int64 conversion; the magic
 * constant is that conversion, and it is the scalar rule itself
 * (tokred_grid.h's bx_tokred_q), so the words are identical to the
 * portable and AVX-512 kernels' for every input. The tail (< 8 elements)
 * runs the same rule in scalar code.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"

static inline void add4(int64_t *w, __m128 v, __m256d inv, __m256d magic, __m256i mbits) {
  __m256d r = _mm256_add_pd(_mm256_mul_pd(_mm256_cvtps_pd(v), inv), magic);
  __m256i q = _mm256_sub_epi64(_mm256_castpd_si256(r), mbits);
  __m256i old = _mm256_loadu_si256((const __m256i *)(const void *)w);
  _mm256_storeu_si256((__m256i *)(void *)w, _mm256_add_epi64(old, q));
}

static uint32_t avx2_grid_add(int64_t *w, const float *a, size_t n, double inv_step,
                              int64_t *nonfinite) {
  const double magic_d = 6755399441055744.0; /* 1.5 * 2^52 */
  int64_t mb;
  memcpy(&mb, &magic_d, sizeof mb);
  const __m256d inv = _mm256_set1_pd(inv_step), magic = _mm256_set1_pd(magic_d);
  const __m256i mbits = _mm256_set1_epi64x(mb);
  const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  __m256i mx = _mm256_setzero_si256();
  int64_t fin_count = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a + i));
    __m256i ab = _mm256_and_si256(x, absm);
    __m256i fin = _mm256_cmpgt_epi32(inf, ab); /* all ones when finite */
    fin_count += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(fin)));
    mx = _mm256_max_epi32(mx, _mm256_and_si256(ab, fin));
    __m256 v = _mm256_castsi256_ps(_mm256_and_si256(x, fin));
    add4(w + i, _mm256_castps256_ps128(v), inv, magic, mbits);
    add4(w + i + 4, _mm256_extractf128_ps(v, 1), inv, magic, mbits);
  }
  __m128i m4 = _mm_max_epi32(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
  m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0x4e));
  m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0xb1));
  int32_t m = _mm_cvtsi128_si32(m4);
  for (; i < n; i++) {
    int32_t b;
    memcpy(&b, &a[i], sizeof b);
    int32_t ab = b & 0x7fffffff;
    if (ab >= 0x7f800000) continue;
    fin_count++;
    m = ab > m ? ab : m;
    double r = (double)a[i] * inv_step + magic_d;
    int64_t rb;
    memcpy(&rb, &r, sizeof rb);
    w[i] = (int64_t)((uint64_t)w[i] + ((uint64_t)rb - (uint64_t)mb)); /* modulo 2^64 */
  }
  *nonfinite = (int64_t)n - fin_count;
  return (uint32_t)m;
}

static uint32_t avx2_max_abs(const float *a, size_t n) {
  const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i x0 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(a + i)), absm);
    __m256i x1 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(a + i + 8)), absm);
    m0 = _mm256_max_epi32(m0, _mm256_and_si256(x0, _mm256_cmpgt_epi32(inf, x0)));
    m1 = _mm256_max_epi32(m1, _mm256_and_si256(x1, _mm256_cmpgt_epi32(inf, x1)));
  }
  m0 = _mm256_max_epi32(m0, m1);
  __m128i m4 = _mm_max_epi32(_mm256_castsi256_si128(m0), _mm256_extracti128_si256(m0, 1));
  m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0x4e));
  m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0xb1));
  int32_t m = _mm_cvtsi128_si32(m4);
  for (; i < n; i++) {
    int32_t b;
    memcpy(&b, &a[i], sizeof b);
    int32_t ab = b & 0x7fffffff;
    if (ab < 0x7f800000 && ab > m) m = ab;
  }
  return (uint32_t)m;
}

const bx_tokred_kernels bx_tokred_avx2 = {"avx2", avx2_grid_add, avx2_max_abs};
