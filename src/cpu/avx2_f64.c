/*
 * avx2_f64.c — the AVX2 + FMA fp64 micro-kernels (micro.h; the driver is
 * drive_f64.c). Scheme and proofs: exact_grid.h. 2 sets of 4 lanes,
 * blocks of 256 (k = 32 per lane, K = 5).
 */
#include <string.h>

#include "avx2_util.h"

/* ======================================================================
 * fp64: scaled so the window max is in [1,2); p = x'^2 rounded, r its
 * exact error; both through the add-form two-level grid. Lanes hold |x|
 * bits below 2^63, so signed 64-bit compares order them.
 * ====================================================================== */

/* pass-1 step over 4 lanes of |x| bits a (zeros count as INT64_MAX for
 * the min non-zero) */
static inline void f64_stats4(__m256i a, __m256i *mx, __m256i *mn, __m256i *bk) {
  __m256i z = _mm256_srli_epi64(_mm256_cmpeq_epi64(a, _mm256_setzero_si256()), 1);
  *mx = max_epi64(*mx, a);
  *mn = min_epi64(*mn, _mm256_or_si256(a, z));
  *bk = _mm256_or_si256(*bk, _mm256_sllv_epi64(_mm256_set1_epi64x(1), _mm256_srli_epi64(a, 57)));
}

static inline void f64_stats_done(__m256i mx, __m256i mn, __m256i bk, bx_f64_stats *st) {
  __m128i o = _mm_or_si128(_mm256_castsi256_si128(bk), _mm256_extracti128_si256(bk, 1));
  st->buckets = (uint64_t)(_mm_cvtsi128_si64(o) | _mm_extract_epi64(o, 1));
  st->amax = (uint64_t)hmax_epi64(mx);
  int64_t m = hmin_epi64(mn);
  st->aminnz = m == INT64_MAX ? 0 : (uint64_t)m;
}

static inline __m256i f64_abs(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll)); }

/* micro.h: stats */
static void f64_stats(const double *x, size_t len, bx_f64_stats *st) {
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi64x(INT64_MAX), bk = mx;
  for (size_t i = 0; i < len; i += 4) {
    if ((i & 7) == 0) bx_prefetch_line(x + i);
    double buf[4] = {0, 0, 0, 0};
    const double *p = x + i;
    if (len - i < 4) {
      memcpy(buf, p, (len - i) * sizeof *x);
      p = buf;
    }
    f64_stats4(f64_abs(_mm256_loadu_si256((const void *)p)), &mx, &mn, &bk);
  }
  f64_stats_done(mx, mn, bk, st);
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
/* 4 elements, all inside the window: no masks */
static inline void f64_step_all(__m256i b, __m256d s1, __m256d s2, f64_acc *s) {
  __m256d xs = _mm256_mul_pd(_mm256_mul_pd(_mm256_castsi256_pd(b), s1), s2);
  __m256d p = _mm256_mul_pd(xs, xs);
  __m256d r = _mm256_fmsub_pd(xs, xs, p); /* exact: x'^2 - p */
  add2(p, &s->hp, &s->lp);
  add2(r, &s->hr, &s->lr);
}

static inline void f64_acc_init(f64_acc s[2]) {
  for (int k = 0; k < 2; k++) {
    s[k].hp = anchor4(-43);
    s[k].lp = anchor4(-89);
    s[k].hr = anchor4(-97);
    s[k].lr = anchor4(-143);
  }
}

/* the two sets' lane sums: lanes_sum over (set0, set1, anchor, anchor) */
static inline void f64_fold(const f64_acc s[2], bx_i128 *vp, bx_i128 *vr) {
  __m256d ap = anchor4(-43), alp = anchor4(-89), ar = anchor4(-97), alr = anchor4(-143);
  *vp = bx_combine(lanes_sum(s[0].hp, s[1].hp, ap, ap, -43), lanes_sum(s[0].lp, s[1].lp, alp, alp, -89), 46);
  *vr = bx_combine(lanes_sum(s[0].hr, s[1].hr, ar, ar, -97), lanes_sum(s[0].lr, s[1].lr, alr, alr, -143), 46);
}

/* sc in [-1023, 1074]: one factor, or 2^1023 first then the rest (the tiny
 * x are subnormal; times 2^1023 they are normal and exact) */
static inline void f64_scales(int sc, __m256d *s1, __m256d *s2) {
  *s1 = _mm256_set1_pd(pow2(sc < 1023 ? sc : 1023));
  *s2 = _mm256_set1_pd(pow2(sc < 1023 ? 0 : sc - 1023));
}

/* micro.h: window_all. The stream read for the first time is the next
 * block when it is fused (this one was read by its pass 1), else this one. */
static void f64_window_all(const double *x, size_t len, int sc, bx_f64_next *nx, bx_i128 *vp, bx_i128 *vr) {
  __m256d s1, s2;
  f64_scales(sc, &s1, &s2);
  f64_acc s[2];
  f64_acc_init(s);
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi64x(INT64_MAX), bk = mx;
  const double *pf = nx ? nx->y : x;
  for (size_t i = 0; i < len; i += 8) {
    bx_prefetch_line(pf + i);
    if (nx) {
      f64_stats4(f64_abs(_mm256_loadu_si256((const void *)(nx->y + i))), &mx, &mn, &bk);
      f64_stats4(f64_abs(_mm256_loadu_si256((const void *)(nx->y + i + 4))), &mx, &mn, &bk);
    }
    double buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const double *p = x + i;
    if (len - i < 8) {
      memcpy(buf, p, (len - i) * sizeof *x);
      p = buf;
    }
    f64_step_all(_mm256_loadu_si256((const void *)p), s1, s2, &s[0]);
    f64_step_all(_mm256_loadu_si256((const void *)(p + 4)), s1, s2, &s[1]);
  }
  if (nx) f64_stats_done(mx, mn, bk, &nx->st);
  f64_fold(s, vp, vr);
}

static void f64_window(const double *x, size_t len, int sc, uint64_t thr, uint64_t upper,
                       uint64_t *restmax, bx_i128 *vp, bx_i128 *vr) {
  const __m256i vt = _mm256_set1_epi64x((int64_t)thr), vu = _mm256_set1_epi64x((int64_t)upper);
  __m256d s1, s2;
  f64_scales(sc, &s1, &s2);
  f64_acc s[2];
  f64_acc_init(s);
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
  f64_fold(s, vp, vr);
}

const bx_f64_micro bx_micro_f64_avx2 = {256, f64_stats, f64_window_all, f64_window, NULL};
