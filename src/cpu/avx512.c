/*
 * avx512.c — exact sum-of-squares kernels for AVX-512 (F, DQ, BW, VL): the
 * fp32 kernel and the table. bf16/fp16 are in avx512_half.c, fp64 in
 * avx512_f64.c; the scheme and the proofs of exactness in exact_grid.h.
 *
 * 4 accumulator pairs (or triples) of 8 fp64 lanes = 32 lanes, so blocks
 * of 2048 keep k = 64 elements per lane (K = 6). Tails use masked loads
 * (masked-off lanes read as zero: no max, min-non-zero or sum changes).
 * The common case is software-pipelined: the next block's pass 1 runs in
 * the loop that squares this one, so the memory stream never stops.
 *
 * sumabs uses the scalar kernels (p = 1 is not on the hot path).
 */
#include <string.h>

#include "avx512_util.h"

#define F32_BLOCK BX_AVX512_BLOCK

/* ======================================================================
 * fp32
 * ====================================================================== */

/* Max |x| bits and min non-zero |x| bits (0 if none) of x[0..len). */
static void f32_stats(const float *x, size_t len, uint32_t *amax, uint32_t *aminnz) {
  const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
  __m512i mx0 = _mm512_setzero_si512(), mx1 = mx0;
  __m512i mn0 = _mm512_set1_epi32(-1), mn1 = mn0;
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m512i a0 = _mm512_and_si512(_mm512_loadu_si512(x + i), absm);
    __m512i a1 = _mm512_and_si512(_mm512_loadu_si512(x + i + 16), absm);
    mx0 = _mm512_max_epu32(mx0, a0);
    mx1 = _mm512_max_epu32(mx1, a1);
    mn0 = _mm512_min_epu32(mn0, _mm512_sub_epi32(a0, one));
    mn1 = _mm512_min_epu32(mn1, _mm512_sub_epi32(a1, one));
  }
  if (i < len) { /* zeros from the masked load change neither */
    uint32_t m = tail_mask32(len - i);
    __m512i a0 = _mm512_and_si512(_mm512_maskz_loadu_epi32((__mmask16)m, x + i), absm);
    __m512i a1 = _mm512_and_si512(_mm512_maskz_loadu_epi32((__mmask16)(m >> 16), x + i + 16), absm);
    mx0 = _mm512_max_epu32(mx0, a0);
    mx1 = _mm512_max_epu32(mx1, a1);
    mn0 = _mm512_min_epu32(mn0, _mm512_sub_epi32(a0, one));
    mn1 = _mm512_min_epu32(mn1, _mm512_sub_epi32(a1, one));
  }
  *amax = _mm512_reduce_max_epu32(_mm512_max_epu32(mx0, mx1));
  *aminnz = _mm512_reduce_min_epu32(_mm512_min_epu32(mn0, mn1)) + 1u;
}

static inline __m512d f32_ld(const float *p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }

static inline __m512d f32_ldm(const float *p, uint32_t m) {
  return _mm512_cvtps_pd(_mm256_maskz_loadu_ps((__mmask8)m, p));
}

/* Pass 1 of the next block, fused into a window's loop (software
 * pipelining: the next block streams in while this one is squared). */
typedef struct f32_next {
  const float *y; /* F32_BLOCK elements, or NULL */
  uint32_t amax, aminnz;
} f32_next;

static inline void f32_stats32(const float *y, __m512i *mx, __m512i *mn) {
  const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
  _mm_prefetch((const char *)(y + 4 * F32_BLOCK), _MM_HINT_T1); /* never faults */
  _mm_prefetch((const char *)(y + 4 * F32_BLOCK + 16), _MM_HINT_T1);
  __m512i a0 = _mm512_and_si512(_mm512_loadu_si512(y), absm);
  __m512i a1 = _mm512_and_si512(_mm512_loadu_si512(y + 16), absm);
  *mx = _mm512_max_epu32(*mx, _mm512_max_epu32(a0, a1));
  *mn = _mm512_min_epu32(*mn, _mm512_min_epu32(_mm512_sub_epi32(a0, one), _mm512_sub_epi32(a1, one)));
}

static inline void f32_stats_done(f32_next *nx, __m512i mx, __m512i mn) {
  nx->amax = _mm512_reduce_max_epu32(mx);
  nx->aminnz = _mm512_reduce_min_epu32(mn) + 1u;
}

/* Two-level sum of x^2 over all of x[0..len), len <= F32_BLOCK, every
 * non-zero element inside the window of G; in units of 2^(G-45). With nx
 * (then len == F32_BLOCK), the next block's pass 1 runs in the same loop. */
static bx_i128 f32_window_all(const float *x, size_t len, int g, f32_next *nx) {
  const __m512d ah = anchor_pd(g), al = anchor_pd(g - 45);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  __m512i mx = _mm512_setzero_si512(), mn = _mm512_set1_epi32(-1);
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    if (nx) f32_stats32(nx->y + i, &mx, &mn);
    sq2(f32_ld(x + i), &h0, &l0);
    sq2(f32_ld(x + i + 8), &h1, &l1);
    sq2(f32_ld(x + i + 16), &h2, &l2);
    sq2(f32_ld(x + i + 24), &h3, &l3);
  }
  if (i < len) {
    uint32_t m = tail_mask32(len - i);
    sq2(f32_ldm(x + i, m), &h0, &l0);
    sq2(f32_ldm(x + i + 8, m >> 8), &h1, &l1);
    sq2(f32_ldm(x + i + 16, m >> 16), &h2, &l2);
    sq2(f32_ldm(x + i + 24, m >> 24), &h3, &l3);
  }
  if (nx) f32_stats_done(nx, mx, mn);
  return combine45(lanes_sum(h0, h1, h2, h3, g), lanes_sum(l0, l1, l2, l3, g - 45));
}

/* One masked step: 8 elements whose |x| bits lie in [thr, upper) are
 * squared into hi/mi/lo; the max |x| bits of those below thr into *rest. */
static inline void f32_masked8(__m256i b, __m256i thr, __m256i upper, __m256i *rest,
                               __m512d *hi, __m512d *mi, __m512d *lo) {
  __m256i a = _mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF));
  __mmask8 below = _mm256_cmplt_epu32_mask(a, thr);
  __mmask8 in = _mm256_mask_cmplt_epu32_mask((__mmask8)~below, a, upper);
  *rest = _mm256_mask_max_epu32(*rest, below, *rest, a);
  sq3(_mm512_maskz_cvtps_pd(in, _mm256_castsi256_ps(b)), hi, mi, lo);
}

/* Three-level window over the elements with |x| bits in [thr, upper):
 * *v1 = H 2^45 + Mid in units of 2^(G-45), *v2 = Lo in units of 2^(G-90);
 * *restmax = max |x| bits below thr. */
static void f32_window3(const float *x, size_t len, int g, uint32_t thr, uint32_t upper,
                        uint32_t *restmax, bx_i128 *v1, bx_i128 *v2) {
  const __m512d ah = anchor_pd(g), am = anchor_pd(g - 45), al = anchor_pd(g - 90);
  const __m256i vt = _mm256_set1_epi32((int)thr), vu = _mm256_set1_epi32((int)upper);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, m0 = am, m1 = am, m2 = am, m3 = am;
  __m512d l0 = al, l1 = al, l2 = al, l3 = al;
  __m256i r0 = _mm256_setzero_si256(), r1 = r0;
  for (size_t i = 0; i < len; i += 32) {
    uint32_t m = len - i >= 32 ? 0xFFFFFFFFu : tail_mask32(len - i); /* off lanes read 0 */
    if (m == 0xFFFFFFFFu) {
      f32_masked8(_mm256_loadu_si256((const void *)(x + i)), vt, vu, &r0, &h0, &m0, &l0);
      f32_masked8(_mm256_loadu_si256((const void *)(x + i + 8)), vt, vu, &r1, &h1, &m1, &l1);
      f32_masked8(_mm256_loadu_si256((const void *)(x + i + 16)), vt, vu, &r0, &h2, &m2, &l2);
      f32_masked8(_mm256_loadu_si256((const void *)(x + i + 24)), vt, vu, &r1, &h3, &m3, &l3);
      continue;
    }
    f32_masked8(_mm256_maskz_loadu_epi32((__mmask8)m, x + i), vt, vu, &r0, &h0, &m0, &l0);
    f32_masked8(_mm256_maskz_loadu_epi32((__mmask8)(m >> 8), x + i + 8), vt, vu, &r1, &h1, &m1, &l1);
    f32_masked8(_mm256_maskz_loadu_epi32((__mmask8)(m >> 16), x + i + 16), vt, vu, &r0, &h2, &m2, &l2);
    f32_masked8(_mm256_maskz_loadu_epi32((__mmask8)(m >> 24), x + i + 24), vt, vu, &r1, &h3, &m3, &l3);
  }
  __m256i r = _mm256_max_epu32(r0, r1);
  r = _mm256_max_epu32(r, _mm256_shuffle_epi32(r, 0x4E));
  r = _mm256_max_epu32(r, _mm256_shuffle_epi32(r, 0xB1));
  r = _mm256_max_epu32(r, _mm256_permute4x64_epi64(r, 0x4E));
  *restmax = (uint32_t)_mm256_cvtsi256_si32(r);
  *v1 = combine45(lanes_sum(h0, h1, h2, h3, g), lanes_sum(m0, m1, m2, m3, g - 45));
  *v2 = lanes_sum(l0, l1, l2, l3, g - 90);
}

/* Three-level window over all of x[0..len) (every non-zero element
 * inside it); results as f32_window3. */
static void f32_window3_all(const float *x, size_t len, int g, f32_next *nx, bx_i128 *v1,
                            bx_i128 *v2) {
  const __m512d ah = anchor_pd(g), am = anchor_pd(g - 45), al = anchor_pd(g - 90);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, m0 = am, m1 = am, m2 = am, m3 = am;
  __m512d l0 = al, l1 = al, l2 = al, l3 = al;
  __m512i mx = _mm512_setzero_si512(), mn = _mm512_set1_epi32(-1);
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    if (nx) f32_stats32(nx->y + i, &mx, &mn);
    sq3(f32_ld(x + i), &h0, &m0, &l0);
    sq3(f32_ld(x + i + 8), &h1, &m1, &l1);
    sq3(f32_ld(x + i + 16), &h2, &m2, &l2);
    sq3(f32_ld(x + i + 24), &h3, &m3, &l3);
  }
  if (i < len) {
    uint32_t m = tail_mask32(len - i);
    sq3(f32_ldm(x + i, m), &h0, &m0, &l0);
    sq3(f32_ldm(x + i + 8, m >> 8), &h1, &m1, &l1);
    sq3(f32_ldm(x + i + 16, m >> 16), &h2, &m2, &l2);
    sq3(f32_ldm(x + i + 24, m >> 24), &h3, &m3, &l3);
  }
  if (nx) f32_stats_done(nx, mx, mn);
  *v1 = combine45(lanes_sum(h0, h1, h2, h3, g), lanes_sum(m0, m1, m2, m3, g - 45));
  *v2 = lanes_sum(l0, l1, l2, l3, g - 90);
}

/* Spiky blocks: the few elements with |x| bits >= thr (at most F32_SPIKES)
 * are moved to top[] and x is copied to rest[] with them zeroed (rest
 * holds len rounded up to 16). Returns how many moved, or -1 if there are
 * more. *restmax = max |x| bits of the others. */
#define F32_SPIKES 32
static int f32_split(const float *x, size_t len, uint32_t thr, float *top, float *rest,
                     uint32_t *restmax) {
  const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), vt = _mm512_set1_epi32((int)thr);
  __m512i r = _mm512_setzero_si512();
  int cnt = 0;
  for (size_t i = 0; i < len; i += 16) {
    __m512i b = len - i >= 16 ? _mm512_loadu_si512(x + i)
                              : _mm512_maskz_loadu_epi32((__mmask16)tail_mask32(len - i), x + i);
    __m512i a = _mm512_and_si512(b, absm);
    __mmask16 k = _mm512_cmpge_epu32_mask(a, vt);
    r = _mm512_mask_max_epu32(r, (__mmask16)~k, r, a);
    _mm512_storeu_si512(rest + i, b);
    if (k) { /* rare */
      if (cnt + __builtin_popcount(k) > F32_SPIKES) return -1;
      for (unsigned kk = k; kk; kk &= kk - 1) {
        unsigned j = (unsigned)__builtin_ctz(kk);
        top[cnt++] = rest[i + j];
        rest[i + j] = 0.0f;
      }
    }
  }
  *restmax = _mm512_reduce_max_epu32(r);
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
  f32_next *fuse = nx && nx->y && len == F32_BLOCK ? nx : NULL;
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
  uint32_t upper = 0x80000000u, rest;
  if (split) { /* a few spikes above the bulk: each part in its own window */
    float spikes[F32_SPIKES], bulk[F32_BLOCK + 16];
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

/* One block whose pass-1 results are nx->amax/aminnz; nx->y is the next
 * block (F32_BLOCK elements) or NULL. On return nx holds the next block's
 * pass-1 results. Returns 1 if the block is for the scalar kernel. */
static int f32_block(const float *x, size_t len, f32_next *nx, bx_acc *acc, bx_pending *pa,
                     bx_pending *pb) {
  uint32_t top = nx->amax, minnz = nx->aminnz;
  int scalar = 0, fused = 0;
  if (top >= 0x7F800000u || bx_f32_too_wide(top, minnz)) {
    scalar = 1; /* NaN/Inf, or spread too wide: the caller's scalar run */
  } else {
    fused = f32_finite(x, len, top, minnz, 1, nx, acc, pa, pb);
  }
  if (nx->y && !fused) f32_stats(nx->y, F32_BLOCK, &nx->amax, &nx->aminnz);
  return scalar;
}

static void sumsq_f32(const void *xv, size_t n, bx_acc *acc) {
  const float *x = xv;
  bx_pending pa = {0, 0, 0}, pb = {0, 0, 0};
  size_t scalar_n = 0, i = 0, run = 0, run_at = 0; /* run: blocks for the scalar kernel */
  /* first block ends on a 64-byte boundary when x is 4-byte aligned */
  size_t len = F32_BLOCK;
  if (((uintptr_t)x & 3) == 0) len -= ((uintptr_t)x >> 2) & 15;
  if (len > n) len = n;
  f32_next nx;
  f32_stats(x, len, &nx.amax, &nx.aminnz);
  while (i < n) {
    size_t nlen = n - (i + len) < F32_BLOCK ? n - (i + len) : F32_BLOCK;
    nx.y = nlen == F32_BLOCK ? x + i + len : NULL;
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

const bx_kernels bx_kernels_avx512 = {
    "avx512",
    {bx_avx512_sumsq_f16, bx_avx512_sumsq_bf16, sumsq_f32, bx_avx512_sumsq_f64},
    {sumabs_f16, sumabs_bf16, sumabs_f32, sumabs_f64},
};
