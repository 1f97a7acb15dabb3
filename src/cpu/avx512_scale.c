/*
 * avx512_scale.c — the scaling kernels of portable_scale.c with AVX-512
 * (F, DQ, BW, VL). Same arithmetic, lane by lane, so the same bits:
 *  - torch mode: fp32 g*c32; bf16/fp16 via fp32 then round to nearest-even
 *    (NaN → 0x7FC0 for bf16, sign|0x7E00 for fp16, as c10's scalar code);
 *  - exact mode: the product a*coef split as a*hi + a*lo (both exact),
 *    Fast2Sum, round-to-odd into a double, then one rounding to the dtype.
 * Tails are handled with masked loads and stores, never past the end.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "nan_canon.h"

/* ---- fp64 pieces shared by the exact kernels ------------------------- */

typedef struct split_coef {
  __m512d c, hi, lo;
} split_coef;

static split_coef split(double c) {
  double hi = c, lo = 0.0;
  if (c - c == 0.0) { /* finite */
    uint64_t b;
    memcpy(&b, &c, 8);
    b &= ~((1ull << 24) - 1);
    memcpy(&hi, &b, 8);
    lo = copysign(c - hi, c); /* signed like c: 0 * c keeps its sign */
  }
  split_coef k = {_mm512_set1_pd(c), _mm512_set1_pd(hi), _mm512_set1_pd(lo)};
  return k;
}

/* Round-to-odd of the exact a*c (8 lanes); see bx_mul_round_odd in
 * src/common/scale_round.h for the argument. */
static __m512d mul_round_odd8(__m512d a, const split_coef *k) {
  const __m512d absmask = _mm512_castsi512_pd(_mm512_set1_epi64(0x7FFFFFFFFFFFFFFFLL));
  __m512d p1 = _mm512_mul_pd(a, k->hi), p2 = _mm512_mul_pd(a, k->lo);
  __m512d p = _mm512_add_pd(p1, p2);
  __m512d err = _mm512_sub_pd(p2, _mm512_sub_pd(p, p1));
  __m512d ap = _mm512_and_pd(p, absmask);
  __m512i b = _mm512_castpd_si512(p);
  __mmask8 fix = _mm512_cmp_pd_mask(err, _mm512_setzero_pd(), _CMP_NEQ_UQ) &
                 _mm512_testn_epi64_mask(b, _mm512_set1_epi64(1)) &
                 _mm512_cmp_pd_mask(ap, _mm512_set1_pd(0x1p-151), _CMP_GE_OQ);
  __mmask8 finite = _mm512_cmp_pd_mask(ap, _mm512_set1_pd(0x1.fffffffffffffp+1023), _CMP_LE_OQ);
  fix &= finite;
  /* +1 ulp in magnitude when err and p have the same sign, else -1 */
  __mmask8 same = _mm512_cmp_pd_mask(_mm512_mul_pd(err, p), _mm512_setzero_pd(), _CMP_GT_OQ);
  b = _mm512_mask_add_epi64(b, fix & same, b, _mm512_set1_epi64(1));
  b = _mm512_mask_sub_epi64(b, fix & (__mmask8)~same, b, _mm512_set1_epi64(1));
  /* Inf/NaN: the plain product */
  return _mm512_mask_blend_pd(finite, _mm512_mul_pd(a, k->c), _mm512_castsi512_pd(b));
}

/* double -> float by round-to-odd (8 lanes). */
static __m256 f64_to_f32_odd8(__m512d d) {
  const __m512d absmask = _mm512_castsi512_pd(_mm512_set1_epi64(0x7FFFFFFFFFFFFFFFLL));
  __m256 f = _mm512_cvtpd_ps(d);
  __m512d back = _mm512_cvtps_pd(f);
  __m256i u = _mm256_castps_si256(f);
  __mmask8 inexact = _mm512_cmp_pd_mask(back, d, _CMP_NEQ_OQ); /* false for NaN */
  __mmask8 finite = _mm512_cmp_pd_mask(_mm512_and_pd(back, absmask),
                                       _mm512_set1_pd(0x1.fffffep+127), _CMP_LE_OQ);
  __mmask8 even = _mm256_testn_epi32_mask(u, _mm256_set1_epi32(1));
  __mmask8 fix = inexact & finite & even;
  __mmask8 up = _mm512_cmp_pd_mask(_mm512_and_pd(d, absmask), _mm512_and_pd(back, absmask),
                                   _CMP_GT_OQ);
  u = _mm256_mask_add_epi32(u, fix & up, u, _mm256_set1_epi32(1));
  u = _mm256_mask_sub_epi32(u, fix & (__mmask8)~up, u, _mm256_set1_epi32(1));
  return _mm256_castsi256_ps(u);
}

/* 16 floats → the exact-once product, round-to-odd in fp32 (for bf16/fp16
 * targets) or correctly rounded fp32 (for fp32 targets). */
static __m512 mul_exact16(__m512 x, const split_coef *k, int to_odd_f32) {
  __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  lo = mul_round_odd8(lo, k);
  hi = mul_round_odd8(hi, k);
  __m256 flo, fhi;
  if (to_odd_f32) {
    flo = f64_to_f32_odd8(lo);
    fhi = f64_to_f32_odd8(hi);
  } else {
    flo = _mm512_cvtpd_ps(lo);
    fhi = _mm512_cvtpd_ps(hi);
  }
  return _mm512_insertf32x8(_mm512_castps256_ps512(flo), fhi, 1);
}

/* ---- bf16 / fp16 <-> fp32 ----------------------------------------------- */

static __m512 bf16x16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static __m256i f32_to_bf16x16(__m512 f) {
  __m512i u = _mm512_castps_si512(f);
  __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

static __m256i f32_to_f16x16(__m512 f) {
  __m256i h = _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  /* NaN: the canonical 0x7E00, as the portable conversion */
  return _mm256_mask_mov_epi16(h, nan, _mm256_set1_epi16((short)BX_F16_CANON_NAN));
}

/* ---- the canonical NaN (nan_canon.h), 16 floats / 8 doubles ------------- */

static inline __m512 canon_f32x16(__m512 v) {
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(v, nan, _mm512_castsi512_ps(_mm512_set1_epi32((int)BX_F32_CANON_NAN)));
}

static inline __m512d canon_f64x8(__m512d v) {
  __mmask8 nan = _mm512_cmp_pd_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_pd(v, nan, _mm512_castsi512_pd(_mm512_set1_epi64((long long)BX_F64_CANON_NAN)));
}

/* ---- kernels ------------------------------------------------------------- */

static void scale_f32_torch(void *xv, size_t n, double coef) {
  float *x = xv;
  __m512 c = _mm512_set1_ps((float)coef);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, canon_f32x16(_mm512_mul_ps(_mm512_loadu_ps(x + i), c)));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, m, canon_f32x16(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), c)));
  }
}

static void scale_f32_exact(void *xv, size_t n, double coef) {
  float *x = xv;
  split_coef k = split(coef);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, canon_f32x16(mul_exact16(_mm512_loadu_ps(x + i), &k, 0)));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, m, canon_f32x16(mul_exact16(_mm512_maskz_loadu_ps(m, x + i), &k, 0)));
  }
}

static void scale_f64(void *xv, size_t n, double coef) {
  double *x = xv;
  __m512d c = _mm512_set1_pd(coef);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm512_storeu_pd(x + i, canon_f64x8(_mm512_mul_pd(_mm512_loadu_pd(x + i), c)));
  if (i < n) {
    __mmask8 m = (__mmask8)((1u << (n - i)) - 1);
    _mm512_mask_storeu_pd(x + i, m, canon_f64x8(_mm512_mul_pd(_mm512_maskz_loadu_pd(m, x + i), c)));
  }
}

/* 16 half-width elements at a time: load (masked), convert, op, store. */
static __m256i load16(const uint16_t *p, size_t left, __mmask16 *m) {
  *m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
  return _mm256_maskz_loadu_epi16(*m, p);
}

/* torch mode, 32 bf16 at a time without widening shuffles: the even
 * words shifted up and the odd words masked are the two halves as fp32;
 * each product is rounded to nearest-even in place (u + 0x7FFF + lsb,
 * then the top 16 bits), NaN products become 0x7FC0 (c10), and one
 * ternary-logic op puts the halves back together. */
static inline __m512i bf16_round_bits(__m512 f) {
  __m512i u = _mm512_castps_si512(f);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
}

static inline __m512i bf16x32_torch(__m512i v, __m512 c) {
  const __m512i top = _mm512_set1_epi32((int)0xFFFF0000u);
  __m512 ev = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), c);
  __m512 od = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(v, top)), c);
  __m512i re = bf16_round_bits(ev), ro = bf16_round_bits(od);
  __mmask16 ne = _mm512_cmp_ps_mask(ev, ev, _CMP_UNORD_Q), no = _mm512_cmp_ps_mask(od, od, _CMP_UNORD_Q);
  if (ne | no) { /* rare */
    re = _mm512_mask_mov_epi32(re, ne, _mm512_set1_epi32(0x7FC00000));
    ro = _mm512_mask_mov_epi32(ro, no, _mm512_set1_epi32(0x7FC00000));
  }
  return _mm512_ternarylogic_epi32(ro, top, _mm512_srli_epi32(re, 16), 0xEA); /* (ro & top) | re >> 16 */
}

static void scale_bf16_torch(void *xv, size_t n, double coef) {
  uint16_t *x = xv;
  __m512 c = _mm512_set1_ps((float)coef);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) _mm512_storeu_si512(x + i, bf16x32_torch(_mm512_loadu_si512(x + i), c));
  if (i < n) {
    __mmask32 m = (__mmask32)((1ull << (n - i)) - 1);
    _mm512_mask_storeu_epi16(x + i, m, bf16x32_torch(_mm512_maskz_loadu_epi16(m, x + i), c));
  }
}

static void scale_bf16_exact(void *xv, size_t n, double coef) {
  uint16_t *x = xv;
  split_coef k = split(coef);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 m;
    __m256i h = load16(x + i, n - i, &m);
    _mm256_mask_storeu_epi16(x + i, m, f32_to_bf16x16(mul_exact16(bf16x16_to_f32(h), &k, 1)));
  }
}

static void scale_f16_torch(void *xv, size_t n, double coef) {
  uint16_t *x = xv;
  __m512 c = _mm512_set1_ps((float)coef);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 m;
    __m256i h = load16(x + i, n - i, &m);
    _mm256_mask_storeu_epi16(x + i, m, f32_to_f16x16(_mm512_mul_ps(_mm512_cvtph_ps(h), c)));
  }
}

static void scale_f16_exact(void *xv, size_t n, double coef) {
  uint16_t *x = xv;
  split_coef k = split(coef);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 m;
    __m256i h = load16(x + i, n - i, &m);
    _mm256_mask_storeu_epi16(x + i, m, f32_to_f16x16(mul_exact16(_mm512_cvtph_ps(h), &k, 1)));
  }
}

const bx_scale_kernels bx_scale_avx512 = {
    "avx512",
    {scale_f16_torch, scale_bf16_torch, scale_f32_torch, scale_f64},
    {scale_f16_exact, scale_bf16_exact, scale_f32_exact, scale_f64},
};
