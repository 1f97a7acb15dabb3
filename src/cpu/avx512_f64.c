/*
 * avx512_f64.c — the AVX-512 fp64 micro-kernels (micro.h; the driver is
 * drive_f64.c). Scheme and proofs: exact_grid.h. 4 sets of 8 lanes,
 * blocks of 1024 (k = 32 per lane, K = 5). Every window pass is masked.
 */
#include "avx512_util.h"

/* ======================================================================
 * fp64: scaled so the block max is in [1,2); p = x'^2 rounded, r its exact
 * error; both summed with the add-form two-level grid.
 * ====================================================================== */

/* pass-1 step over 8 lanes of |x| bits a */
static inline void f64_stats8(__m512i a, __m512i *mx, __m512i *mn, __m512i *bk) {
  *mx = _mm512_max_epu64(*mx, a);
  *mn = _mm512_min_epu64(*mn, _mm512_sub_epi64(a, _mm512_set1_epi64(1))); /* zeros wrap */
  *bk = _mm512_or_si512(*bk, _mm512_sllv_epi64(_mm512_set1_epi64(1), _mm512_srli_epi64(a, 57)));
}

static inline void f64_stats_done(__m512i mx, __m512i mn, __m512i bk, bx_f64_stats *st) {
  st->amax = _mm512_reduce_max_epu64(mx);
  st->aminnz = _mm512_reduce_min_epu64(mn) + 1u; /* 0: no non-zero element */
  st->buckets = (uint64_t)_mm512_reduce_or_epi64(bk);
}

static inline __m512i f64_abs(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi64(0x7FFFFFFFFFFFFFFFll)); }

/* micro.h: stats */
static void f64_stats(const double *x, size_t len, bx_f64_stats *st) {
  __m512i mx = _mm512_setzero_si512(), mn = _mm512_set1_epi64(-1), bk = mx;
  for (size_t i = 0; i < len; i += 8) {
    bx_prefetch_line(x + i);
    __m512i v = len - i >= 8 ? _mm512_loadu_si512(x + i)
                             : _mm512_maskz_loadu_epi64((__mmask8)((1u << (len - i)) - 1), x + i);
    f64_stats8(f64_abs(v), &mx, &mn, &bk); /* masked-off lanes: zeros, which change nothing */
  }
  f64_stats_done(mx, mn, bk, st);
}

typedef struct f64_acc {
  __m512d hp, lp, hr, lr;
} f64_acc;

static inline void f64_step(__m512i b, __m512i thr, __m512i upper, __m512d sc, __m512i *rest,
                            f64_acc *s) {
  __m512i a = f64_abs(b);
  __mmask8 below = _mm512_cmplt_epu64_mask(a, thr);
  __mmask8 in = _mm512_mask_cmplt_epu64_mask((__mmask8)~below, a, upper);
  *rest = _mm512_mask_max_epu64(*rest, below, *rest, a);
  __m512d xs = _mm512_maskz_scalef_pd(in, _mm512_castsi512_pd(b), sc); /* x 2^sc, exact */
  __m512d p = _mm512_mul_pd(xs, xs);
  __m512d r = _mm512_fmsub_pd(xs, xs, p); /* exact: x'^2 - p */
  add2(p, &s->hp, &s->lp);
  add2(r, &s->hr, &s->lr);
}

/* 8 elements, all inside the window: no masks */
static inline void f64_step_all(__m512i b, __m512d sc, f64_acc *s) {
  __m512d xs = _mm512_scalef_pd(_mm512_castsi512_pd(b), sc); /* x 2^sc, exact */
  __m512d p = _mm512_mul_pd(xs, xs);
  __m512d r = _mm512_fmsub_pd(xs, xs, p); /* exact: x'^2 - p */
  add2(p, &s->hp, &s->lp);
  add2(r, &s->hr, &s->lr);
}

static inline int64_t f64_lanes(const f64_acc *s, int which, int g) {
  if (which == 0) return lanes_sum(s[0].hp, s[1].hp, s[2].hp, s[3].hp, g);
  if (which == 1) return lanes_sum(s[0].lp, s[1].lp, s[2].lp, s[3].lp, g);
  if (which == 2) return lanes_sum(s[0].hr, s[1].hr, s[2].hr, s[3].hr, g);
  return lanes_sum(s[0].lr, s[1].lr, s[2].lr, s[3].lr, g);
}

static inline void f64_acc_init(f64_acc s[4]) {
  for (int k = 0; k < 4; k++) {
    s[k].hp = anchor_pd(-43);
    s[k].lp = anchor_pd(-89);
    s[k].hr = anchor_pd(-97);
    s[k].lr = anchor_pd(-143);
  }
}

/* micro.h: window_all. The stream read for the first time is the next
 * block when it is fused (this one was read by its pass 1), else this one. */
static void f64_window_all(const double *x, size_t len, int sc, bx_f64_next *nx, bx_i128 *vp, bx_i128 *vr) {
  const __m512d scale = _mm512_set1_pd((double)sc);
  f64_acc s[4];
  f64_acc_init(s);
  __m512i mx = _mm512_setzero_si512(), mn = _mm512_set1_epi64(-1), bk = mx;
  const double *pf = nx ? nx->y : x;
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    bx_prefetch_line(pf + i);
    bx_prefetch_line(pf + i + 8);
    bx_prefetch_line(pf + i + 16);
    bx_prefetch_line(pf + i + 24);
    if (nx) { /* spelled out: -O2 keeps a loop's vectors in memory */
      f64_stats8(f64_abs(_mm512_loadu_si512(nx->y + i)), &mx, &mn, &bk);
      f64_stats8(f64_abs(_mm512_loadu_si512(nx->y + i + 8)), &mx, &mn, &bk);
      f64_stats8(f64_abs(_mm512_loadu_si512(nx->y + i + 16)), &mx, &mn, &bk);
      f64_stats8(f64_abs(_mm512_loadu_si512(nx->y + i + 24)), &mx, &mn, &bk);
    }
    f64_step_all(_mm512_loadu_si512(x + i), scale, &s[0]);
    f64_step_all(_mm512_loadu_si512(x + i + 8), scale, &s[1]);
    f64_step_all(_mm512_loadu_si512(x + i + 16), scale, &s[2]);
    f64_step_all(_mm512_loadu_si512(x + i + 24), scale, &s[3]);
  }
  for (int k = 0; i < len; i += 8, k++) {
    size_t left = len - i;
    __m512i v = left >= 8 ? _mm512_loadu_si512(x + i)
                          : _mm512_maskz_loadu_epi64((__mmask8)((1u << left) - 1), x + i);
    f64_step_all(v, scale, &s[k]);
  }
  if (nx) f64_stats_done(mx, mn, bk, &nx->st);
  *vp = combine46(f64_lanes(s, 0, -43), f64_lanes(s, 1, -89));
  *vr = combine46(f64_lanes(s, 2, -97), f64_lanes(s, 3, -143));
}

/* micro.h: window. Elements with |x| bits in [thr, upper), scaled by 2^sc
 * (the window max in [1,2)). */
static void f64_window(const double *x, size_t len, int sc, uint64_t thr, uint64_t upper,
                       uint64_t *restmax, bx_i128 *vp, bx_i128 *vr) {
  const __m512i vt = _mm512_set1_epi64((int64_t)thr), vu = _mm512_set1_epi64((int64_t)upper);
  const __m512d scale = _mm512_set1_pd((double)sc); /* scalef: x * 2^sc */
  f64_acc s[4];
  f64_acc_init(s);
  __m512i r = _mm512_setzero_si512();
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    bx_prefetch_line(x + i);
    bx_prefetch_line(x + i + 8);
    bx_prefetch_line(x + i + 16);
    bx_prefetch_line(x + i + 24);
    f64_step(_mm512_loadu_si512(x + i), vt, vu, scale, &r, &s[0]);
    f64_step(_mm512_loadu_si512(x + i + 8), vt, vu, scale, &r, &s[1]);
    f64_step(_mm512_loadu_si512(x + i + 16), vt, vu, scale, &r, &s[2]);
    f64_step(_mm512_loadu_si512(x + i + 24), vt, vu, scale, &r, &s[3]);
  }
  for (int k = 0; i < len; i += 8, k++) {
    size_t left = len - i;
    __m512i v = left >= 8 ? _mm512_loadu_si512(x + i)
                          : _mm512_maskz_loadu_epi64((__mmask8)((1u << left) - 1), x + i);
    f64_step(v, vt, vu, scale, &r, &s[k]);
  }
  *restmax = _mm512_reduce_max_epu64(r);
  *vp = combine46(f64_lanes(s, 0, -43), f64_lanes(s, 1, -89));
  *vr = combine46(f64_lanes(s, 2, -97), f64_lanes(s, 3, -143));
}

/* ---- the verified window (exact_grid.h, VERIFIED WINDOWS) --------------
 * The two roundings the scheme wants (p = x'^2 and t = hi + v) round to
 * nearest with exceptions suppressed ({rn-sae}); every other operation
 * must be exact, which the inexact flag (read by the driver) and the
 * binades of the final lanes confirm. */
#define F64_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline void add2v(__m512d v, __m512d *hi, __m512d *lo) {
  __m512d t = _mm512_add_round_pd(*hi, v, F64_RN);
  __m512d d = _mm512_sub_pd(*hi, t);
  *lo = _mm512_add_pd(*lo, _mm512_add_pd(v, d));
  *hi = t;
}

static inline void f64_stepv(__m512d x, __m512d sc, f64_acc *s) {
  __m512d xs = _mm512_scalef_pd(x, sc); /* exact, or the flag says not */
  __m512d p = _mm512_mul_round_pd(xs, xs, F64_RN);
  __m512d r = _mm512_fmsub_pd(xs, xs, p); /* x'^2 - p: exact, or the flag says not */
  add2v(p, &s->hp, &s->lp);
  add2v(r, &s->hr, &s->lr);
}

/* micro.h: verified */
static int f64_verified(const double *x, int sc, bx_i128 *vp, bx_i128 *vr, int64_t *hmax) {
  const __m512d scale = _mm512_set1_pd((double)sc);
  f64_acc s[4];
  f64_acc_init(s);
  for (size_t i = 0; i < 1024; i += 32) {
    bx_prefetch_line(x + i);
    bx_prefetch_line(x + i + 8);
    bx_prefetch_line(x + i + 16);
    bx_prefetch_line(x + i + 24);
    f64_stepv(_mm512_loadu_pd(x + i), scale, &s[0]);
    f64_stepv(_mm512_loadu_pd(x + i + 8), scale, &s[1]);
    f64_stepv(_mm512_loadu_pd(x + i + 16), scale, &s[2]);
    f64_stepv(_mm512_loadu_pd(x + i + 24), scale, &s[3]);
  }
  const __m512i ahp = _mm512_set1_epi64(bx_anchor_bits(-43)), alp = _mm512_set1_epi64(bx_anchor_bits(-89));
  const __m512i ahr = _mm512_set1_epi64(bx_anchor_bits(-97)), alr = _mm512_set1_epi64(bx_anchor_bits(-143));
  __m512i bad = _mm512_setzero_si512(), mx = _mm512_setzero_si512();
  __m512i shp = mx, slp = mx, shr = mx, slr = mx;
  for (int k = 0; k < 4; k++) {
    __m512i a = lanes_diff(s[k].hp, ahp, &bad);
    mx = _mm512_max_epi64(mx, a);
    shp = _mm512_add_epi64(shp, a);
    slp = _mm512_add_epi64(slp, lanes_diff(s[k].lp, alp, &bad));
    shr = _mm512_add_epi64(shr, lanes_diff(s[k].hr, ahr, &bad));
    slr = _mm512_add_epi64(slr, lanes_diff(s[k].lr, alr, &bad));
  }
  *vp = *vr = 0;
  *hmax = 0;
  if (lanes_bad(bad)) return 0;
  *hmax = _mm512_reduce_max_epi64(mx);
  *vp = combine46(_mm512_reduce_add_epi64(shp), _mm512_reduce_add_epi64(slp));
  *vr = combine46(_mm512_reduce_add_epi64(shr), _mm512_reduce_add_epi64(slr));
  return 1;
}

const bx_f64_micro bx_micro_f64_avx512 = {1024, f64_stats, f64_window_all, f64_window, f64_verified};
