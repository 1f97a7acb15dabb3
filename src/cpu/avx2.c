/*
 * avx2.c — the AVX2 + FMA + F16C fp32 micro-kernels and the AVX2 kernel
 * table. bf16/fp16 micro-kernels are in avx2_half.c, fp64 in avx2_f64.c;
 * the drivers in drive_*.c (micro.h); the proofs in exact_grid.h.
 *
 * The same windows as the AVX-512 kernels with 256-bit vectors: 4
 * accumulator pairs of 4 fp64 lanes = 16 lanes, so a block of 1024
 * elements keeps k = 64 per lane (K = 6) and every window constant is the
 * one proven there; three levels use 2 sets over half blocks. AVX2 has no
 * masks: tails are copied into a zero-padded buffer (a zero changes no
 * max, no min-non-zero, no sum). No verified window: AVX2 has no
 * per-instruction exception suppression, so every fp32 block is checked.
 *
 * This file is also the model for adding an ISA: micro-kernels for each
 * dtype, their bx_*_micro tables, a bx_kernels table whose entries call
 * the drivers with them (the end of this file), one line in dispatch.c.
 *
 * sumabs uses the scalar kernels (p = 1 is not on the hot path).
 */
#include <string.h>

#include "avx2_util.h"

/* max and min-non-zero (minus one, zeros wrapping) of |x| bits, 16 at p */
static inline void f32_stats16(const float *p, __m256i *mx, __m256i *mn) {
  const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), one = _mm256_set1_epi32(1);
  __m256i a0 = _mm256_and_si256(_mm256_loadu_si256((const void *)p), absm);
  __m256i a1 = _mm256_and_si256(_mm256_loadu_si256((const void *)(p + 8)), absm);
  *mx = _mm256_max_epu32(*mx, _mm256_max_epu32(a0, a1));
  *mn = _mm256_min_epu32(*mn, _mm256_min_epu32(_mm256_sub_epi32(a0, one), _mm256_sub_epi32(a1, one)));
}

static inline void f32_stats_done(__m256i mx, __m256i mn, uint32_t *amax, uint32_t *aminnz) {
  *amax = hmax_epu32(mx);
  *aminnz = hmin_epu32(mn) + 1u; /* 0: no non-zero element */
}

/* micro.h: stats */
static void f32_stats(const float *x, size_t len, uint32_t *amax, uint32_t *aminnz) {
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi32(-1);
  size_t i = 0;
  for (; i + 16 <= len; i += 16) {
    bx_prefetch_line(x + i);
    f32_stats16(x + i, &mx, &mn);
  }
  if (i < len) {
    float buf[16] = {0};
    memcpy(buf, x + i, (len - i) * sizeof *x);
    f32_stats16(buf, &mx, &mn);
  }
  f32_stats_done(mx, mn, amax, aminnz);
}

static inline __m256d f32_ld(const float *p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }

static inline void f32_all16(const float *p, __m256d h[4], __m256d l[4]) {
  sq2(f32_ld(p), &h[0], &l[0]);
  sq2(f32_ld(p + 4), &h[1], &l[1]);
  sq2(f32_ld(p + 8), &h[2], &l[2]);
  sq2(f32_ld(p + 12), &h[3], &l[3]);
}

/* micro.h: window2. The stream read for the first time is the next block
 * when it is fused (this one was read by its pass 1), else this one. */
static bx_i128 f32_window2(const float *x, size_t len, int g, bx_f32_next *nx) {
  const __m256d ah = anchor4(g), al = anchor4(g - 45);
  __m256d h[4] = {ah, ah, ah, ah}, l[4] = {al, al, al, al};
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi32(-1);
  const float *pf = nx ? nx->y : x;
  size_t i = 0;
  for (; i + 16 <= len; i += 16) {
    bx_prefetch_line(pf + i);
    if (nx) f32_stats16(nx->y + i, &mx, &mn);
    f32_all16(x + i, h, l);
  }
  if (i < len) {
    float buf[16] = {0};
    memcpy(buf, x + i, (len - i) * sizeof *x);
    f32_all16(buf, h, l);
  }
  if (nx) f32_stats_done(mx, mn, &nx->amax, &nx->aminnz);
  return bx_combine(lanes_sum(h[0], h[1], h[2], h[3], g), lanes_sum(l[0], l[1], l[2], l[3], g - 45), 45);
}

/* micro.h: window3 (2 sets over halves of the block: 64 elements a lane) */
static void f32_window3(const float *x, size_t len, int g, bx_f32_next *nx, bx_i128 *v1, bx_i128 *v2) {
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi32(-1);
  const float *pf = nx ? nx->y : x;
  *v1 = *v2 = 0;
  for (size_t h = 0; h < len; h += BLOCK / 2) {
    size_t end = len - h < BLOCK / 2 ? len : h + BLOCK / 2, i = h;
    bx_sets3 s;
    sets3_init(&s, g);
    for (; i + 16 <= end; i += 16) {
      bx_prefetch_line(pf + i);
      if (nx) f32_stats16(nx->y + i, &mx, &mn);
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
  if (nx) f32_stats_done(mx, mn, &nx->amax, &nx->aminnz);
}

/* micro.h: split (rest holds len rounded up to 8) */
static int f32_split(const float *x, size_t len, uint32_t thr, float *top, float *rest, uint32_t *restmax) {
  const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), vt = _mm256_set1_epi32((int)thr - 1);
  __m256i r = _mm256_setzero_si256();
  int cnt = 0;
  for (size_t i = 0; i < len; i += 8) {
    if ((i & 15) == 0) bx_prefetch_line(x + i);
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
      if (cnt + __builtin_popcount(km) > BX_F32_SPIKES) return -1;
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

/* micro.h: bins_prep. Significands, squares and exponent fields 8 at a
 * time; products come out as even|odd pairs per 128 bits, the fields
 * follow them. */
static size_t f32_bins_prep(const float *x, size_t m, uint32_t *idx, uint64_t *val, bx_bins_span *sp) {
  const __m256i ff = _mm256_set1_epi32(0xFF), frac = _mm256_set1_epi32(0x7FFFFF);
  const __m256i hid = _mm256_set1_epi32(0x800000), zero = _mm256_setzero_si256();
  const __m256i perm = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  __m256i emx = zero, emn = _mm256_set1_epi32(0xFF);
  size_t mr = (m + 7) & ~(size_t)7; /* the rest of the last 8 reads as zeros */
  for (size_t j = 0; j < mr; j += 8) {
    if ((j & 15) == 0) bx_prefetch_line(x + j);
    float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const float *p = x + j;
    if (m - j < 8) {
      memcpy(buf, p, (m - j) * sizeof *p);
      p = buf;
    }
    __m256i v = _mm256_loadu_si256((const void *)p);
    __m256i e = _mm256_and_si256(_mm256_srli_epi32(v, 23), ff);
    __m256i f = _mm256_and_si256(v, frac);
    __m256i spec = _mm256_cmpeq_epi32(e, ff);
    unsigned ks = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(spec));
    if (ks) { /* NaN/Inf: counted; bin 255 is never deposited */
      unsigned kz = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(f, zero)));
      sp->nan += __builtin_popcount(ks & ~kz);
      sp->inf += __builtin_popcount(ks & kz);
    }
    __m256i mm = _mm256_or_si256(f, _mm256_andnot_si256(_mm256_cmpeq_epi32(e, zero), hid));
    emx = _mm256_max_epu32(emx, _mm256_andnot_si256(spec, e));
    __m256i isz = _mm256_cmpeq_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7FFFFFFF)), zero);
    emn = _mm256_min_epu32(emn, _mm256_or_si256(e, _mm256_and_si256(isz, ff)));
    _mm256_store_si256((void *)(idx + j), _mm256_permutevar8x32_epi32(e, perm));
    __m256i p0 = _mm256_mul_epu32(mm, mm), odd = _mm256_srli_epi64(mm, 32);
    __m256i p1 = _mm256_mul_epu32(odd, odd);
    _mm256_store_si256((void *)(val + j), _mm256_unpacklo_epi64(p0, p1));
    _mm256_store_si256((void *)(val + j + 4), _mm256_unpackhi_epi64(p0, p1));
  }
  uint32_t hi = hmax_epu32(emx), lo = hmin_epu32(emn);
  sp->emax = hi > sp->emax ? hi : sp->emax;
  sp->eminnz = lo < sp->eminnz ? lo : sp->eminnz;
  return mr;
}

const bx_f32_micro bx_micro_f32_avx2 = {
    BLOCK, f32_stats, f32_window2, f32_window3, f32_split, f32_bins_prep, NULL, NULL,
};

/* ---- the table: the drivers with this ISA's micro-kernels -------------- */

static void sumsq_f16(const void *x, size_t n, bx_acc *a) { bx_drive_sumsq_f16(&bx_micro_f16_avx2, x, n, a); }
static void sumsq_bf16(const void *x, size_t n, bx_acc *a) { bx_drive_sumsq_bf16(&bx_micro_bf16_avx2, x, n, a); }
static void sumsq_f32(const void *x, size_t n, bx_acc *a) { bx_drive_sumsq_f32(&bx_micro_f32_avx2, x, n, a); }
static void sumsq_f64(const void *x, size_t n, bx_acc *a) { bx_drive_sumsq_f64(&bx_micro_f64_avx2, x, n, a); }

const bx_kernels bx_kernels_avx2 = {
    "avx2",
    {sumsq_f16, sumsq_bf16, sumsq_f32, sumsq_f64},
    {bx_portable_sumabs_f16, bx_portable_sumabs_bf16, bx_portable_sumabs_f32, bx_portable_sumabs_f64},
};
