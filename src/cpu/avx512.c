/*
 * avx512.c — the AVX-512 (F, DQ, BW, VL) fp32 micro-kernels and the
 * AVX-512 kernel table. bf16/fp16 micro-kernels are in avx512_half.c,
 * fp64 in avx512_f64.c; the drivers in drive_*.c (micro.h); the scheme
 * and the proofs of exactness in exact_grid.h.
 *
 * 4 accumulator pairs (or triples) of 8 fp64 lanes = 32 lanes, so blocks
 * of 2048 keep k = 64 elements per lane (K = 6). Tails use masked loads
 * (masked-off lanes read as zero: no max, min-non-zero or sum changes).
 * The verified window (exceptions suppressed on the rounding fma: about 5
 * vector operations an 8 elements, no pass 1) is AVX-512's alone.
 *
 * sumabs uses the scalar kernels (p = 1 is not on the hot path).
 */
#include "avx512_util.h"

#define F32_BLOCK BX_AVX512_BLOCK

/* the pass-1 step over 32 elements at y, the loads masked by m (masked-off
 * lanes read as zero: they change neither the max nor the min non-zero) */
static inline void f32_stats32(const float *y, uint32_t m, __m512i *mx, __m512i *mn) {
  const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
  __m512i a0 = _mm512_and_si512(_mm512_maskz_loadu_epi32((__mmask16)m, y), absm);
  __m512i a1 = _mm512_and_si512(_mm512_maskz_loadu_epi32((__mmask16)(m >> 16), y + 16), absm);
  *mx = _mm512_max_epu32(*mx, _mm512_max_epu32(a0, a1));
  *mn = _mm512_min_epu32(*mn, _mm512_min_epu32(_mm512_sub_epi32(a0, one), _mm512_sub_epi32(a1, one)));
}

/* the same over 32 elements of a full block (plain loads) */
static inline void f32_next32(const float *y, __m512i *mx, __m512i *mn) {
  const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
  __m512i a0 = _mm512_and_si512(_mm512_loadu_si512(y), absm);
  __m512i a1 = _mm512_and_si512(_mm512_loadu_si512(y + 16), absm);
  *mx = _mm512_max_epu32(*mx, _mm512_max_epu32(a0, a1));
  *mn = _mm512_min_epu32(*mn, _mm512_min_epu32(_mm512_sub_epi32(a0, one), _mm512_sub_epi32(a1, one)));
}

static inline void f32_next_done(bx_f32_next *nx, __m512i mx, __m512i mn) {
  nx->amax = _mm512_reduce_max_epu32(mx);
  nx->aminnz = _mm512_reduce_min_epu32(mn) + 1u; /* 0: no non-zero element */
}

/* micro.h: stats */
static void f32_stats(const float *x, size_t len, uint32_t *amax, uint32_t *aminnz) {
  __m512i mx0 = _mm512_setzero_si512(), mx1 = mx0, mn0 = _mm512_set1_epi32(-1), mn1 = mn0;
  size_t i = 0;
  for (; i + 64 <= len; i += 64) { /* two chains: a min/max's latency each */
    bx_prefetch_line(x + i);
    bx_prefetch_line(x + i + 16);
    bx_prefetch_line(x + i + 32);
    bx_prefetch_line(x + i + 48);
    f32_next32(x + i, &mx0, &mn0);
    f32_next32(x + i + 32, &mx1, &mn1);
  }
  for (; i < len; i += 32) {
    bx_prefetch_line(x + i);
    bx_prefetch_line(x + i + 16);
    f32_stats32(x + i, len - i >= 32 ? 0xFFFFFFFFu : tail_mask32(len - i), &mx0, &mn0);
  }
  bx_f32_next r;
  f32_next_done(&r, _mm512_max_epu32(mx0, mx1), _mm512_min_epu32(mn0, mn1));
  *amax = r.amax;
  *aminnz = r.aminnz;
}

static inline __m512d f32_ld(const float *p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }

static inline __m512d f32_ldm(const float *p, uint32_t m) {
  return _mm512_cvtps_pd(_mm256_maskz_loadu_ps((__mmask8)m, p));
}

/* micro.h: window2. The stream read for the first time is the next block
 * when it is fused (this one was read by its pass 1), else this one. */
static bx_i128 f32_window2(const float *x, size_t len, int g, bx_f32_next *nx) {
  const __m512d ah = anchor_pd(g), al = anchor_pd(g - 45);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  __m512i mx = _mm512_setzero_si512(), mn = _mm512_set1_epi32(-1);
  const float *pf = nx ? nx->y : x;
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    bx_prefetch_line(pf + i);
    bx_prefetch_line(pf + i + 16);
    if (nx) f32_next32(nx->y + i, &mx, &mn);
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
  if (nx) f32_next_done(nx, mx, mn);
  return combine45(lanes_sum(h0, h1, h2, h3, g), lanes_sum(l0, l1, l2, l3, g - 45));
}

/* micro.h: window3 */
static void f32_window3(const float *x, size_t len, int g, bx_f32_next *nx, bx_i128 *v1, bx_i128 *v2) {
  const __m512d ah = anchor_pd(g), am = anchor_pd(g - 45), al = anchor_pd(g - 90);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, m0 = am, m1 = am, m2 = am, m3 = am;
  __m512d l0 = al, l1 = al, l2 = al, l3 = al;
  __m512i mx = _mm512_setzero_si512(), mn = _mm512_set1_epi32(-1);
  const float *pf = nx ? nx->y : x;
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    bx_prefetch_line(pf + i);
    bx_prefetch_line(pf + i + 16);
    if (nx) f32_next32(nx->y + i, &mx, &mn);
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
  if (nx) f32_next_done(nx, mx, mn);
  *v1 = combine45(lanes_sum(h0, h1, h2, h3, g), lanes_sum(m0, m1, m2, m3, g - 45));
  *v2 = lanes_sum(l0, l1, l2, l3, g - 90);
}

/* micro.h: split (rest holds len rounded up to 16) */
static int f32_split(const float *x, size_t len, uint32_t thr, float *top, float *rest, uint32_t *restmax) {
  const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), vt = _mm512_set1_epi32((int)thr);
  __m512i r = _mm512_setzero_si512();
  int cnt = 0;
  for (size_t i = 0; i < len; i += 16) {
    bx_prefetch_line(x + i);
    __m512i b = len - i >= 16 ? _mm512_loadu_si512(x + i)
                              : _mm512_maskz_loadu_epi32((__mmask16)tail_mask32(len - i), x + i);
    __m512i a = _mm512_and_si512(b, absm);
    __mmask16 k = _mm512_cmpge_epu32_mask(a, vt);
    r = _mm512_mask_max_epu32(r, (__mmask16)~k, r, a);
    _mm512_storeu_si512(rest + i, b);
    if (k) { /* rare */
      if (cnt + __builtin_popcount(k) > BX_F32_SPIKES) return -1;
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

/* micro.h: bins_prep. Significands, squares and exponent fields 16 at a
 * time; products come out as even|odd dword pairs, the fields follow them. */
static size_t f32_bins_prep(const float *x, size_t m, uint32_t *idx, uint64_t *val, bx_bins_span *sp) {
  const __m512i ff = _mm512_set1_epi32(0xFF), frac = _mm512_set1_epi32(0x7FFFFF);
  const __m512i hid = _mm512_set1_epi32(0x800000), absm = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i perm = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  __m512i emx = _mm512_setzero_si512(), emn = _mm512_set1_epi32(-1);
  size_t mr = (m + 15) & ~(size_t)15; /* the rest of the last 16 reads as zeros */
  for (size_t j = 0; j < mr; j += 16) {
    bx_prefetch_line(x + j);
    __mmask16 ld = m - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)tail_mask32(m - j);
    __m512i v = _mm512_maskz_loadu_epi32(ld, x + j);
    __m512i e = _mm512_and_si512(_mm512_srli_epi32(v, 23), ff);
    __m512i f = _mm512_and_si512(v, frac);
    __mmask16 spec = _mm512_cmpeq_epi32_mask(e, ff);
    if (spec) { /* NaN/Inf: counted; bin 255 is never deposited */
      __mmask16 nan = _mm512_mask_test_epi32_mask(spec, f, f);
      sp->nan += __builtin_popcount(nan);
      sp->inf += __builtin_popcount((unsigned)(spec & ~nan));
    }
    __m512i mm = _mm512_mask_or_epi32(f, _mm512_test_epi32_mask(e, e), f, hid);
    emx = _mm512_mask_max_epu32(emx, (__mmask16)~spec, emx, e);
    emn = _mm512_mask_min_epu32(emn, _mm512_test_epi32_mask(v, absm), emn, e);
    _mm512_store_si512(idx + j, _mm512_permutexvar_epi32(perm, e));
    __m512i p0 = _mm512_mul_epu32(mm, mm), odd = _mm512_srli_epi64(mm, 32);
    __m512i p1 = _mm512_mul_epu32(odd, odd);
    _mm512_store_si512(val + j, _mm512_unpacklo_epi64(p0, p1));
    _mm512_store_si512(val + j + 8, _mm512_unpackhi_epi64(p0, p1));
  }
  uint32_t hi = _mm512_reduce_max_epu32(emx), lo = _mm512_reduce_min_epu32(emn);
  sp->emax = hi > sp->emax ? hi : sp->emax;
  sp->eminnz = lo < sp->eminnz ? lo : sp->eminnz;
  return mr;
}

/* ---- the verified two-level window (exact_grid.h, VERIFIED WINDOWS) ----
 * t is rounded with exceptions suppressed ({rn-sae}), every other
 * operation must be exact, which the inexact flag (read by the driver)
 * and the binades of the final hi/lo lanes confirm. d = hi - t alternates
 * between the add and the FMA pipes (Zen 4 runs FADD and cvtps2pd on the
 * same two). */
#define F32_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline void sqv(__m512d x, __m512d *hi, __m512d *lo, int fma_sub) {
  __m512d t = _mm512_fmadd_round_pd(x, x, *hi, F32_RN);
  __m512d d = fma_sub ? _mm512_fnmadd_pd(t, _mm512_set1_pd(1.0), *hi) : _mm512_sub_pd(*hi, t);
  *lo = _mm512_add_pd(*lo, _mm512_fmadd_pd(x, x, d));
  *hi = t;
}

/* The verified window's end: 0 if a lane left its binade, else *v and
 * *hmax (micro.h: verified). */
static inline int f32_verified_fold(__m512d ah, __m512d al, __m512d h0, __m512d h1, __m512d h2, __m512d h3,
                                    __m512d l0, __m512d l1, __m512d l2, __m512d l3, bx_i128 *v, int64_t *hmax) {
  const __m512i ahi = _mm512_castpd_si512(ah), ali = _mm512_castpd_si512(al);
  __m512i bad = _mm512_setzero_si512();
  __m512i a0 = lanes_diff(h0, ahi, &bad), a1 = lanes_diff(h1, ahi, &bad);
  __m512i a2 = lanes_diff(h2, ahi, &bad), a3 = lanes_diff(h3, ahi, &bad);
  __m512i b0 = lanes_diff(l0, ali, &bad), b1 = lanes_diff(l1, ali, &bad);
  __m512i b2 = lanes_diff(l2, ali, &bad), b3 = lanes_diff(l3, ali, &bad);
  *v = 0;
  *hmax = 0;
  if (lanes_bad(bad)) return 0;
  *hmax = _mm512_reduce_max_epi64(_mm512_max_epi64(_mm512_max_epi64(a0, a1), _mm512_max_epi64(a2, a3)));
  int64_t hs = _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  int64_t ls = _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(b0, b1), _mm512_add_epi64(b2, b3)));
  *v = combine45(hs, ls);
  return 1;
}

/* micro.h: verified */
static int f32_verified(const float *x, int g, bx_i128 *v, int64_t *hmax) {
  const __m512d ah = anchor_pd(g), al = anchor_pd(g - 45);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  for (size_t i = 0; i < F32_BLOCK; i += 32) {
    bx_prefetch_line(x + i);
    bx_prefetch_line(x + i + 16);
    sqv(f32_ld(x + i), &h0, &l0, 0);
    sqv(f32_ld(x + i + 8), &h1, &l1, 1);
    sqv(f32_ld(x + i + 16), &h2, &l2, 0);
    sqv(f32_ld(x + i + 24), &h3, &l3, 1);
  }
  return f32_verified_fold(ah, al, h0, h1, h2, h3, l0, l1, l2, l3, v, hmax);
}

/* The elements of x[0..32) flagged in k into spikes[] (at most
 * BX_F32_SPIKES in all); 0 if there are more. Rare: scalar code. */
static int f32_set_apart(const float *x, uint32_t k, float *spikes, int *ns) {
  if (*ns + __builtin_popcount(k) > BX_F32_SPIKES) return 0;
  for (; k; k &= k - 1) spikes[(*ns)++] = x[__builtin_ctz(k)];
  return 1;
}

/* micro.h: verified_split. The verified loop plus, per 32 elements, 3
 * vrangeps (max |x| lane by lane) and one compare with thr; only a hit
 * (rare) finds the elements and zeroes them. Per-element compares and
 * masked conversions cost 1.5x the verified loop on the AMD EPYC of
 * docs/benchmarks.md; this costs 1.3x. */
static int f32_verified_split(const float *x, int g, uint32_t thr, float *spikes, int *nspikes, bx_i128 *v,
                              int64_t *hmax) {
  const __m512d ah = anchor_pd(g), al = anchor_pd(g - 45);
  const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), vt = _mm256_set1_epi32((int)thr);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  *nspikes = 0;
  *v = 0;
  *hmax = 0;
  for (size_t i = 0; i < F32_BLOCK; i += 32) {
    bx_prefetch_line(x + i);
    bx_prefetch_line(x + i + 16);
    __m256i b0 = _mm256_loadu_si256((const __m256i *)(x + i));
    __m256i b1 = _mm256_loadu_si256((const __m256i *)(x + i + 8));
    __m256i b2 = _mm256_loadu_si256((const __m256i *)(x + i + 16));
    __m256i b3 = _mm256_loadu_si256((const __m256i *)(x + i + 24));
    /* max |x| lane by lane (vrangeps, sign cleared) against thr, then
     * (rare) which elements are at or above it: set apart, zeroed. A NaN
     * missed here fails the block's verification (it is redone checked). */
    __m256 r = _mm256_range_ps(_mm256_range_ps(_mm256_castsi256_ps(b0), _mm256_castsi256_ps(b1), 0xB),
                               _mm256_range_ps(_mm256_castsi256_ps(b2), _mm256_castsi256_ps(b3), 0xB), 0xB);
    if (_mm256_cmpge_epu32_mask(_mm256_castps_si256(r), vt)) {
      __mmask8 k0 = _mm256_cmplt_epu32_mask(_mm256_and_si256(b0, absm), vt);
      __mmask8 k1 = _mm256_cmplt_epu32_mask(_mm256_and_si256(b1, absm), vt);
      __mmask8 k2 = _mm256_cmplt_epu32_mask(_mm256_and_si256(b2, absm), vt);
      __mmask8 k3 = _mm256_cmplt_epu32_mask(_mm256_and_si256(b3, absm), vt);
      uint32_t k = (uint32_t)(uint8_t)~k0 | (uint32_t)(uint8_t)~k1 << 8 | (uint32_t)(uint8_t)~k2 << 16 |
                   (uint32_t)(uint8_t)~k3 << 24;
      if (!f32_set_apart(x + i, k, spikes, nspikes)) return 0;
      b0 = _mm256_maskz_mov_epi32(k0, b0);
      b1 = _mm256_maskz_mov_epi32(k1, b1);
      b2 = _mm256_maskz_mov_epi32(k2, b2);
      b3 = _mm256_maskz_mov_epi32(k3, b3);
    }
    sqv(_mm512_cvtps_pd(_mm256_castsi256_ps(b0)), &h0, &l0, 0);
    sqv(_mm512_cvtps_pd(_mm256_castsi256_ps(b1)), &h1, &l1, 1);
    sqv(_mm512_cvtps_pd(_mm256_castsi256_ps(b2)), &h2, &l2, 0);
    sqv(_mm512_cvtps_pd(_mm256_castsi256_ps(b3)), &h3, &l3, 1);
  }
  return f32_verified_fold(ah, al, h0, h1, h2, h3, l0, l1, l2, l3, v, hmax);
}

const bx_f32_micro bx_micro_f32_avx512 = {
    F32_BLOCK, f32_stats, f32_window2, f32_window3, f32_split, f32_bins_prep, f32_verified, f32_verified_split,
};

/* ---- the table: the drivers with this ISA's micro-kernels -------------- */

static void sumsq_f16(const void *x, size_t n, bx_acc *a) { bx_drive_sumsq_f16(&bx_micro_f16_avx512, x, n, a); }
static void sumsq_bf16(const void *x, size_t n, bx_acc *a) { bx_drive_sumsq_bf16(&bx_micro_bf16_avx512, x, n, a); }
static void sumsq_f32(const void *x, size_t n, bx_acc *a) { bx_drive_sumsq_f32(&bx_micro_f32_avx512, x, n, a); }
static void sumsq_f64(const void *x, size_t n, bx_acc *a) { bx_drive_sumsq_f64(&bx_micro_f64_avx512, x, n, a); }

#ifndef BX_AVX512_NAME /* avx512_pf1.c builds these files again under another name */
#define BX_AVX512_NAME "avx512"
#endif

const bx_kernels bx_kernels_avx512 = {
    BX_AVX512_NAME,
    {sumsq_f16, sumsq_bf16, sumsq_f32, sumsq_f64},
    {bx_portable_sumabs_f16, bx_portable_sumabs_bf16, bx_portable_sumabs_f32, bx_portable_sumabs_f64},
};
