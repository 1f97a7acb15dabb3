/*
 * avx512_math.c — the AVX-512 elementwise math kernels (kernels.h's
 * bx_math_avx512): binary64 fast paths in 8 fp64 lanes, four vectors a
 * step, the near-midpoint test per lane, the flagged lanes by the scalar
 * functions; every result the scalar function's bit for bit
 * (vmath_body.h says why).
 */
#include <immintrin.h>

#include "kernels.h"

#define W 8
#define U 4
#define VM_NAME "avx512"
#define VM_TABLE bx_math_avx512

/* 1/d for normal d > 0, relative error < 2^-52.8: r = rcp14(d) (|e| <=
 * 2^-14 for e = 1 - d r, one fma rounding: 2^-67 absolute), then 1/d =
 * r (1 + e + e^2 + e^3) + r e^4/(1 - e): truncation 2^-56, the two fmas
 * on e + e^2 + e^3 < 2^-66, the last fma 2^-53. */
static inline __m512d avx512_recip(__m512d d) {
  __m512d r = _mm512_rcp14_pd(d);
  __m512d e = _mm512_fnmadd_pd(d, r, _mm512_set1_pd(1.0));
  __m512d t = _mm512_fmadd_pd(e, e, e);
  t = _mm512_fmadd_pd(t, e, e);
  return _mm512_fmadd_pd(r, t, r);
}

/* 1/sqrt(x) for normal double x > 0, relative error < 2^-51.9: r =
 * rsqrt14(x) (2^-14), two Newton steps r += r e / 2 with e = 1 - x r^2
 * (errors 3e^2/8: 2^-27.4, then 2^-54.2; the rounding of r^2 moves e by
 * 2^-53, hence r by 2^-54; the last fma 2^-53). */
static inline __m512d avx512_rsqrt(__m512d x) {
  __m512d r = _mm512_rsqrt14_pd(x);
  for (int i = 0; i < 2; i++) {
    __m512d e = _mm512_fnmadd_pd(x, _mm512_mul_pd(r, r), _mm512_set1_pd(1.0));
    r = _mm512_fmadd_pd(_mm512_mul_pd(r, e), _mm512_set1_pd(0.5), r);
  }
  return r;
}

typedef __m512d VD;
typedef __m256 VF;
typedef __m256i VFI;
typedef __m512i VI;
typedef __mmask8 VM;

#define VSET1(v) _mm512_set1_pd(v)
#define VADD(a, b) _mm512_add_pd(a, b)
#define VSUB(a, b) _mm512_sub_pd(a, b)
#define VMUL(a, b) _mm512_mul_pd(a, b)
#define VDIV(a, b) _mm512_div_pd(a, b)
#define VSQRT(a) _mm512_sqrt_pd(a)
#define VFMA(a, b, c) _mm512_fmadd_pd(a, b, c)
#define VFNMA(a, b, c) _mm512_fnmadd_pd(a, b, c)
#define VRECIP(d) avx512_recip(d)
#define VRSQRT(x) avx512_rsqrt(x)
#define VTAB16(t, i) _mm512_permutex2var_epi64(_mm512_load_si512(t), i, _mm512_load_si512((t) + 8))
#define VNEG(a) _mm512_castsi512_pd(_mm512_xor_si512(_mm512_castpd_si512(a), _mm512_set1_epi64(INT64_MIN)))
#define VABS(a) _mm512_abs_pd(a)
#define VFNMS(a, b, c) _mm512_fnmsub_pd(a, b, c)
#define VI_TEST_AND(m, a, b) _mm512_mask_test_epi64_mask(m, a, b)
#define VFI_IN(b, lo, hi) _mm256_cmplt_epu32_mask(_mm256_sub_epi32(b, _mm256_set1_epi32((int)(lo))), _mm256_set1_epi32((int)((hi) - (lo))))
#define VCVT_PD(f) _mm512_cvtps_pd(f)
#define VCVT_PS(d) _mm512_cvtpd_ps(d)
#define VCMP(a, b, p) _mm512_cmp_pd_mask(a, b, p)
#define VBLEND(m, a, b) _mm512_mask_blend_pd(m, a, b)
#define M_OR(a, b) ((VM)((a) | (b)))
#define M_AND(a, b) ((VM)((a) & (b)))
#define M_ANDN(a, b) ((VM)((a) & ~(b)))
#define M_NOT(a) ((VM)~(a))
#define M_BITS(m) ((unsigned)(m))
#define VF_NE(a, b) _mm256_cmp_ps_mask(a, b, _CMP_NEQ_UQ)
#define VI_BITS(d) _mm512_castpd_si512(d)
#define VI_FROM(i) _mm512_castsi512_pd(i)
#define VI_SET1(v) _mm512_set1_epi64(v)
#define VI_ADD(a, b) _mm512_add_epi64(a, b)
#define VI_SLL(a, n) _mm512_slli_epi64(a, n)
#define VI_AND(a, b) _mm512_and_si512(a, b)
#define VI_TESTZ(a, b) _mm512_testn_epi64_mask(a, b)
#define VI_TESTNZ(a, b) _mm512_test_epi64_mask(a, b)
#define VF_BITS(f) _mm256_castps_si256(f)
#define VFI_FLT(i) _mm256_castsi256_ps(i)
#define VFI_SET1(v) _mm256_set1_epi32(v)
#define VFI_SRL(a, n) _mm256_srli_epi32(a, n)
#define VFI_AND(a, b) _mm256_and_si256(a, b)
#define VFI_OR(a, b) _mm256_or_si256(a, b)
#define VFI_SUB(a, b) _mm256_sub_epi32(a, b)
#define VFI_GT(a, b) _mm256_cmpgt_epi32(a, b)
#define VFI_CVT_PD(i) _mm512_cvtepi32_pd(i)
#define VF_LOAD(p) _mm256_loadu_ps(p)
#define VF_STORE(p, v) _mm256_storeu_ps(p, v)

#include "vmath_body.h"
