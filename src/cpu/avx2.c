/*
 * avx2.c — exact sum-of-squares kernels for AVX2 + FMA + F16C: the fp32
 * kernel and the table. bf16/fp16 are in avx2_half.c, fp64 in avx2_f64.c.
 *
 * The same scheme, windows and proofs as the AVX-512 kernels (see
 * exact_grid.h), with 256-bit vectors: 4 accumulator pairs of 4 fp64
 * lanes = 16 lanes, so a block of 1024 elements keeps k = 64 per lane
 * (K = 6) and every window constant is the one proven there; three levels
 * use 2 sets over half blocks. AVX2 has no masks: out-of-window lanes are
 * zeroed with AND, tails are copied into a zero-padded buffer (a zero
 * changes no max, no min-non-zero, no sum).
 *
 * sumabs uses the scalar kernels (p = 1 is not on the hot path).
 */
#include <string.h>

#include "avx2_util.h"

/* ======================================================================
 * fp32
 * ====================================================================== */

/* max and min-non-zero of |x| bits over 16 elements at p */
static inline void f32_stats16(const float *p, __m256i *mx, __m256i *mn) {
  const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), one = _mm256_set1_epi32(1);
  __m256i a0 = _mm256_and_si256(_mm256_loadu_si256((const void *)p), absm);
  __m256i a1 = _mm256_and_si256(_mm256_loadu_si256((const void *)(p + 8)), absm);
  *mx = _mm256_max_epu32(*mx, _mm256_max_epu32(a0, a1));
  *mn = _mm256_min_epu32(*mn, _mm256_min_epu32(_mm256_sub_epi32(a0, one), _mm256_sub_epi32(a1, one)));
}

static void f32_stats(const float *x, size_t len, uint32_t *amax, uint32_t *aminnz) {
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi32(-1);
  size_t i = 0;
  for (; i + 16 <= len; i += 16) f32_stats16(x + i, &mx, &mn);
  if (i < len) {
    float buf[16] = {0};
    memcpy(buf, x + i, (len - i) * sizeof *x);
    f32_stats16(buf, &mx, &mn);
  }
  *amax = hmax_epu32(mx);
  *aminnz = hmin_epu32(mn) + 1u;
}

static inline __m256d f32_ld(const float *p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }

static inline void f32_all16(const float *p, __m256d h[4], __m256d l[4]) {
  sq2(f32_ld(p), &h[0], &l[0]);
  sq2(f32_ld(p + 4), &h[1], &l[1]);
  sq2(f32_ld(p + 8), &h[2], &l[2]);
  sq2(f32_ld(p + 12), &h[3], &l[3]);
}

/* Pass 1 of the next block, fused into a window's loop (software
 * pipelining: the next block streams in while this one is squared). */
typedef struct f32_next {
  const float *y; /* BLOCK elements, or NULL */
  uint32_t amax, aminnz;
} f32_next;

static inline void f32_next16(const f32_next *nx, size_t i, __m256i *mx, __m256i *mn) {
  _mm_prefetch((const char *)(nx->y + 4 * BLOCK + i), _MM_HINT_T1); /* never faults */
  f32_stats16(nx->y + i, mx, mn);
}

static inline void f32_next_done(f32_next *nx, __m256i mx, __m256i mn) {
  nx->amax = hmax_epu32(mx);
  nx->aminnz = hmin_epu32(mn) + 1u;
}

/* Two-level sum of x^2 over x[0..len), len <= BLOCK, every non-zero
 * element inside the window of G; in units of 2^(G-45). With nx (then len
 * == BLOCK) the next block's pass 1 runs in the same loop. */
static bx_i128 f32_window_all(const float *x, size_t len, int g, f32_next *nx) {
  const __m256d ah = anchor4(g), al = anchor4(g - 45);
  __m256d h[4] = {ah, ah, ah, ah}, l[4] = {al, al, al, al};
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi32(-1);
  size_t i = 0;
  for (; i + 16 <= len; i += 16) {
    if (nx) f32_next16(nx, i, &mx, &mn);
    f32_all16(x + i, h, l);
  }
  if (i < len) {
    float buf[16] = {0};
    memcpy(buf, x + i, (len - i) * sizeof *x);
    f32_all16(buf, h, l);
  }
  if (nx) f32_next_done(nx, mx, mn);
  return bx_combine(lanes_sum(h[0], h[1], h[2], h[3], g), lanes_sum(l[0], l[1], l[2], l[3], g - 45), 45);
}

static void f32_window3_all(const float *x, size_t len, int g, f32_next *nx, bx_i128 *v1,
                            bx_i128 *v2) {
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi32(-1);
  *v1 = *v2 = 0;
  for (size_t h = 0; h < len; h += BLOCK / 2) {
    size_t end = len - h < BLOCK / 2 ? len : h + BLOCK / 2, i = h;
    bx_sets3 s;
    sets3_init(&s, g);
    for (; i + 16 <= end; i += 16) {
      if (nx) f32_next16(nx, i, &mx, &mn);
      sq3(f32_ld(x + i), &s.h0, &s.m0, &s.l0);
      sq3(f32_ld(x + i + 4), &s.h1, &s.m1, &s.l1);
      sq3(f32_ld(x + i + 8), &s.h0, &s.m0, &s.l0);
      sq3(f32_ld(x + i + 12), &s.h1, &s.m1, &s.l1);
    }
    for (; i < end; i += 4) {
      float buf[4] = {0, 0, 0, 0};
      memcpy(buf, x + i, (end - i < 4 ? end - i : 4) * sizeof *x);
      sq3(f32_ld(buf), &s.h0, &s.m0, &s.l0);
    }
    sets3_fold(&s, g, v1, v2);
  }
  if (nx) f32_next_done(nx, mx, mn);
}

/* Three-level window over the elements with |x| bits in [thr, upper). */
static void f32_window3(const float *x, size_t len, int g, uint32_t thr, uint32_t upper,
                        uint32_t *restmax, bx_i128 *v1, bx_i128 *v2) {
  const __m256i vt = _mm256_set1_epi32((int)thr), vu = _mm256_set1_epi32((int)upper);
  __m256i r = _mm256_setzero_si256();
  *v1 = *v2 = 0;
  for (size_t h = 0; h < len; h += BLOCK / 2) {
    size_t end = len - h < BLOCK / 2 ? len : h + BLOCK / 2;
    bx_sets3 s;
    sets3_init(&s, g);
    for (size_t i = h; i < end; i += 8) {
      float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const float *p = x + i;
      if (end - i < 8) {
        memcpy(buf, p, (end - i) * sizeof *x);
        p = buf;
      }
      __m256 xs = f32_window_mask8(_mm256_loadu_si256((const void *)p), vt, vu, &r);
      sq3(_mm256_cvtps_pd(_mm256_castps256_ps128(xs)), &s.h0, &s.m0, &s.l0);
      sq3(_mm256_cvtps_pd(_mm256_extractf128_ps(xs, 1)), &s.h1, &s.m1, &s.l1);
    }
    sets3_fold(&s, g, v1, v2);
  }
  *restmax = hmax_epu32(r);
}

/* Spiky blocks: the few elements with |x| bits >= thr (at most F32_SPIKES)
 * go to top[], x is copied to rest[] with them zeroed (rest holds len
 * rounded up to 8). Returns how many moved, or -1 if more; *restmax = max
 * |x| bits of the others. */
#define F32_SPIKES 32
static int f32_split(const float *x, size_t len, uint32_t thr, float *top, float *rest,
                     uint32_t *restmax) {
  const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), vt = _mm256_set1_epi32((int)thr - 1);
  __m256i r = _mm256_setzero_si256();
  int cnt = 0;
  for (size_t i = 0; i < len; i += 8) {
    if (len - i < 8) {
      memset(rest + i, 0, 8 * sizeof *rest);
      memcpy(rest + i, x + i, (len - i) * sizeof *x);
    } else {
      _mm256_storeu_ps(rest + i, _mm256_loadu_ps(x + i));
    }
    __m256i a = _mm256_and_si256(_mm256_loadu_si256((const void *)(rest + i)), absm);
    __m256i k = _mm256_cmpgt_epi32(a, vt); /* a >= thr */
    r = _mm256_max_epu32(r, _mm256_andnot_si256(k, a));
    unsigned km = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(k));
    if (km) { /* rare */
      if (cnt + __builtin_popcount(km) > F32_SPIKES) return -1;
      for (; km; km &= km - 1) {
        unsigned j = (unsigned)__builtin_ctz(km);
        top[cnt++] = rest[i + j];
        rest[i + j] = 0.0f;
      }
    }
  }
  *restmax = hmax_epu32(r);
  return cnt;
}

/* A finite block with max |x| bits top, min non-zero minnz: into pa (units
 * 2^(G-45)) and pb (units 2^(G-90)). split: spikes may be set apart. nx:
 * the next block's pass 1, done here (returns 1) when the last pass over
 * this block can carry it. */
static int f32_finite(const float *x, size_t len, uint32_t top, uint32_t minnz, int split,
                      f32_next *nx, bx_acc *acc, bx_pending *pa, bx_pending *pb) {
  if (top == 0) return 0;
  int ebtop = top >> 23 ? (int)(top >> 23) : 1, g = bx_f32_g(ebtop);
  f32_next *fuse = nx && nx->y && len == BLOCK ? nx : NULL;
  bx_i128 v1, v2;
  if (minnz >= bx_f32_thr(ebtop)) { /* two levels */
    bx_pend_add(pa, acc, f32_window_all(x, len, g, fuse), g - 45);
    return fuse != NULL;
  }
  if (minnz >= bx_f32_thr3(ebtop)) { /* three levels, one pass */
    f32_window3_all(x, len, g, fuse, &v1, &v2);
    bx_pend_add(pa, acc, v1, g - 45);
    bx_pend_add(pb, acc, v2, g - 90);
    return fuse != NULL;
  }
  uint32_t upper = 0x7F800000u, rest; /* every |x| of a finite block is below */
  if (split) { /* a few spikes above the bulk: each part in its own window */
    float spikes[F32_SPIKES], bulk[BLOCK + 8];
    int c = f32_split(x, len, bx_f32_thr(ebtop), spikes, bulk, &rest);
    if (c >= 0) {
      bx_pend_add(pa, acc, f32_window_all(spikes, (size_t)c, g, NULL), g - 45);
      return f32_finite(bulk, len, rest, minnz, 0, nx, acc, pa, pb);
    }
  }
  for (;;) { /* cascade of three-level windows */
    uint32_t thr = bx_f32_thr3(ebtop);
    f32_window3(x, len, g, thr, upper, &rest, &v1, &v2);
    bx_pend_add(pa, acc, v1, g - 45);
    bx_pend_add(pb, acc, v2, g - 90);
    if (rest == 0) return 0; /* nothing non-zero below thr */
    upper = thr;
    ebtop = rest >> 23 ? (int)(rest >> 23) : 1;
    g = bx_f32_g(ebtop);
  }
}

/* One block whose pass-1 results are in nx; nx->y is the next block (BLOCK
 * elements) or NULL, whose pass-1 results nx holds on return. Returns 1 if
 * the block is for the scalar kernel. */
static int f32_block(const float *x, size_t len, f32_next *nx, bx_acc *acc, bx_pending *pa,
                     bx_pending *pb) {
  int scalar = 0, fused = 0;
  if (nx->amax >= 0x7F800000u || bx_f32_too_wide(nx->amax, nx->aminnz)) {
    scalar = 1; /* NaN/Inf, or spread too wide: the caller's scalar run */
  } else {
    fused = f32_finite(x, len, nx->amax, nx->aminnz, 1, nx, acc, pa, pb);
  }
  if (nx->y && !fused) f32_stats(nx->y, BLOCK, &nx->amax, &nx->aminnz);
  return scalar;
}

static void sumsq_f32(const void *xv, size_t n, bx_acc *acc) {
  const float *x = xv;
  bx_pending pa = {0, 0, 0}, pb = {0, 0, 0};
  size_t scalar_n = 0, i = 0, len = BLOCK, run = 0, run_at = 0; /* run: blocks for the scalar kernel */
  if (((uintptr_t)x & 3) == 0) len -= ((uintptr_t)x >> 2) & 7; /* later blocks 32-byte aligned */
  if (len > n) len = n;
  f32_next nx;
  f32_stats(x, len, &nx.amax, &nx.aminnz);
  while (i < n) {
    size_t nlen = n - (i + len) < BLOCK ? n - (i + len) : BLOCK;
    nx.y = nlen == BLOCK ? x + i + len : NULL;
    if (f32_block(x + i, len, &nx, acc, &pa, &pb)) {
      if (!run) run_at = i;
      run += len;
    } else if (run) {
      bx_sumsq_f32_scalar(x + run_at, run, acc); /* counts them */
      scalar_n += run;
      run = 0;
    }
    i += len;
    len = nlen;
    if (!nx.y && len) f32_stats(x + i, len, &nx.amax, &nx.aminnz);
  }
  if (run) {
    bx_sumsq_f32_scalar(x + run_at, run, acc);
    scalar_n += run;
  }
  bx_pend_flush(&pa, acc);
  bx_pend_flush(&pb, acc);
  acc->count += (int64_t)(n - scalar_n);
}

/* ---- sum |x|: the scalar kernels --------------------------------------- */

static void sumabs_f16(const void *x, size_t n, bx_acc *a) { bx_sumabs_f16_scalar(x, n, a); }
static void sumabs_bf16(const void *x, size_t n, bx_acc *a) { bx_sumabs_bf16_scalar(x, n, a); }
static void sumabs_f32(const void *x, size_t n, bx_acc *a) { bx_sumabs_f32_scalar(x, n, a); }
static void sumabs_f64(const void *x, size_t n, bx_acc *a) { bx_sumabs_f64_scalar(x, n, a); }

const bx_kernels bx_kernels_avx2 = {
    "avx2",
    {bx_avx2_sumsq_f16, bx_avx2_sumsq_bf16, sumsq_f32, bx_avx2_sumsq_f64},
    {sumabs_f16, sumabs_bf16, sumabs_f32, sumabs_f64},
};
