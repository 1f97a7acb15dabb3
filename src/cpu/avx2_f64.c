/*
 * avx2_f64.c — the AVX2 + FMA fp64 micro-kernels (micro.h; the driver is
 * drive_f64.c). Scheme and proofs: exact_grid.h. 2 sets of 4 lanes,
 * blocks of 256 (k = 32 per lane, K = 5). Every window pass is masked.
 */
#include <string.h>

#include "avx2_util.h"

/* ======================================================================
 * fp64: scaled so the window max is in [1,2); p = x'^2 rounded, r its
 * exact error; both through the add-form two-level grid. Lanes hold |x|
 * bits below 2^63, so signed 64-bit compares order them.
 * ====================================================================== */

/* micro.h: max. Max |x| bits, and the bitmap of 32-binade buckets. */
static uint64_t f64_max(const double *x, size_t len, uint64_t *buckets) {
  const __m256i absm = _mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll), one = _mm256_set1_epi64x(1);
  __m256i mx = _mm256_setzero_si256(), bk = mx;
  for (size_t i = 0; i < len; i += 4) {
    if ((i & 7) == 0) bx_prefetch_line(x + i);
    double buf[4] = {0, 0, 0, 0};
    const double *p = x + i;
    if (len - i < 4) {
      memcpy(buf, p, (len - i) * sizeof *x);
      p = buf;
    }
    __m256i a = _mm256_and_si256(_mm256_loadu_si256((const void *)p), absm);
    mx = max_epi64(mx, a);
    bk = _mm256_or_si256(bk, _mm256_sllv_epi64(one, _mm256_srli_epi64(a, 57)));
  }
  __m128i o = _mm_or_si128(_mm256_castsi256_si128(bk), _mm256_extracti128_si256(bk, 1));
  *buckets = (uint64_t)(_mm_cvtsi128_si64(o) | _mm_extract_epi64(o, 1));
  return (uint64_t)hmax_epi64(mx);
}

typedef struct f64_acc {
  __m256d hp, lp, hr, lr;
} f64_acc;

/* 4 elements: those with |x| bits in [thr, upper) scaled by s1*s2 (both
 * exact: powers of two, the results normal) and squared exactly. */
static inline void f64_step(__m256i b, __m256i thr, __m256i upper, __m256d s1, __m256d s2,
                            __m256i *rest, f64_acc *s) {
  __m256i a = _mm256_and_si256(b, _mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll));
  __m256i below = _mm256_cmpgt_epi64(thr, a);
  __m256i in = _mm256_andnot_si256(below, _mm256_cmpgt_epi64(upper, a));
  *rest = max_epi64(*rest, _mm256_and_si256(below, a));
  __m256d xs = _mm256_mul_pd(_mm256_mul_pd(_mm256_castsi256_pd(_mm256_and_si256(b, in)), s1), s2);
  __m256d p = _mm256_mul_pd(xs, xs);
  __m256d r = _mm256_fmsub_pd(xs, xs, p); /* exact: x'^2 - p */
  add2(p, &s->hp, &s->lp);
  add2(r, &s->hr, &s->lr);
}

/* 2^k as a double, k in [-1074, 1023] (exact, maybe subnormal). */
static inline double pow2(int k) {
  uint64_t bits = k >= -1022 ? (uint64_t)(k + 1023) << 52 : 1ull << (k + 1074);
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

/* micro.h: window. Elements with |x| bits in [thr, upper), scaled so the
 * window max is in [1,2). */
static void f64_window(const double *x, size_t len, int sc, uint64_t thr, uint64_t upper,
                       uint64_t *restmax, bx_i128 *vp, bx_i128 *vr) {
  const __m256i vt = _mm256_set1_epi64x((int64_t)thr), vu = _mm256_set1_epi64x((int64_t)upper);
  /* sc in [-1023, 1074]: one factor, or 2^1023 first then the rest (the
   * tiny x are subnormal; times 2^1023 they are normal and exact) */
  const __m256d s1 = _mm256_set1_pd(pow2(sc < 1023 ? sc : 1023));
  const __m256d s2 = _mm256_set1_pd(pow2(sc < 1023 ? 0 : sc - 1023));
  f64_acc s[2];
  for (int k = 0; k < 2; k++) {
    s[k].hp = anchor4(-43);
    s[k].lp = anchor4(-89);
    s[k].hr = anchor4(-97);
    s[k].lr = anchor4(-143);
  }
  __m256i r = _mm256_setzero_si256();
  for (size_t i = 0; i < len; i += 8) {
    bx_prefetch_line(x + i);
    double buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const double *p = x + i;
    if (len - i < 8) {
      memcpy(buf, p, (len - i) * sizeof *x);
      p = buf;
    }
    f64_step(_mm256_loadu_si256((const void *)p), vt, vu, s1, s2, &r, &s[0]);
    f64_step(_mm256_loadu_si256((const void *)(p + 4)), vt, vu, s1, s2, &r, &s[1]);
  }
  *restmax = (uint64_t)hmax_epi64(r);
  /* two sets: lanes_sum over (set0, set1, anchor, anchor) */
  __m256d ap = anchor4(-43), alp = anchor4(-89), ar = anchor4(-97), alr = anchor4(-143);
  *vp = bx_combine(lanes_sum(s[0].hp, s[1].hp, ap, ap, -43), lanes_sum(s[0].lp, s[1].lp, alp, alp, -89), 46);
  *vr = bx_combine(lanes_sum(s[0].hr, s[1].hr, ar, ar, -97), lanes_sum(s[0].lr, s[1].lr, alr, alr, -143), 46);
}

const bx_f64_micro bx_micro_f64_avx2 = {256, f64_max, f64_window};
