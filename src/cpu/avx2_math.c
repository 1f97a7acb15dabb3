/*
 * avx2_math.c — the AVX2 elementwise math kernels (kernels.h's
 * bx_math_avx2): binary64 fast paths in 4 fp64 lanes, four vectors a
 * step, the near-midpoint test per lane, the flagged lanes by the scalar
 * functions; every result the scalar function's bit for bit
 * (vmath_body.h says why). VRECIP and VRSQRT are the IEEE division and
 * square root (2^-53 each); the exp table is read by a gather.
 */
#include <immintrin.h>

#include "kernels.h"

#define W 4
#define U 4
#define VM_NAME "avx2"
#define VM_TABLE bx_math_avx2

typedef __m256d VD;
typedef __m128 VF;
typedef __m128i VFI;
typedef __m256i VI;
typedef __m256d VM; /* all-ones / all-zeros lanes */

#define VSET1(v) _mm256_set1_pd(v)
#define VADD(a, b) _mm256_add_pd(a, b)
#define VSUB(a, b) _mm256_sub_pd(a, b)
#define VMUL(a, b) _mm256_mul_pd(a, b)
#define VDIV(a, b) _mm256_div_pd(a, b)
#define VSQRT(a) _mm256_sqrt_pd(a)
#define VFMA(a, b, c) _mm256_fmadd_pd(a, b, c)
#define VFNMA(a, b, c) _mm256_fnmadd_pd(a, b, c)
#define VRECIP(d) _mm256_div_pd(_mm256_set1_pd(1.0), d)
#define VRSQRT(x) _mm256_div_pd(_mm256_set1_pd(1.0), _mm256_sqrt_pd(x))
#define VTAB16(t, i) _mm256_i64gather_epi64((const long long *)(t), _mm256_and_si256(i, _mm256_set1_epi64x(15)), 8)
#define VNEG(a) _mm256_xor_pd(a, _mm256_set1_pd(-0.0))
#define VABS(a) _mm256_andnot_pd(_mm256_set1_pd(-0.0), a)
#define VFNMS(a, b, c) _mm256_fnmsub_pd(a, b, c)
#define VI_TEST_AND(m, a, b) _mm256_andnot_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(_mm256_and_si256(a, b), _mm256_setzero_si256())), m)
/* unsigned b - lo < hi - lo as a signed compare with the sign bits flipped, widened to 64-bit lanes */
#define VFI_IN(b, lo, hi)                                                                                   \
  _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_cmpgt_epi32(                                               \
      _mm_set1_epi32((int)(((unsigned)(hi) - (unsigned)(lo)) ^ 0x80000000u)),                               \
      _mm_xor_si128(_mm_sub_epi32(b, _mm_set1_epi32((int)(lo))), _mm_set1_epi32((int)0x80000000u)))))
#define VCVT_PD(f) _mm256_cvtps_pd(f)
#define VCVT_PS(d) _mm256_cvtpd_ps(d)
#define VCMP(a, b, p) _mm256_cmp_pd(a, b, p)
#define VBLEND(m, a, b) _mm256_blendv_pd(a, b, m)
#define M_OR(a, b) _mm256_or_pd(a, b)
#define M_AND(a, b) _mm256_and_pd(a, b)
#define M_ANDN(a, b) _mm256_andnot_pd(b, a)
#define M_NOT(a) _mm256_xor_pd(a, _mm256_castsi256_pd(_mm256_set1_epi64x(-1)))
#define M_BITS(m) ((unsigned)_mm256_movemask_pd(m))
#define VF_NE(a, b) _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_castps_si128(_mm_cmpneq_ps(a, b))))
#define VI_BITS(d) _mm256_castpd_si256(d)
#define VI_FROM(i) _mm256_castsi256_pd(i)
#define VI_SET1(v) _mm256_set1_epi64x(v)
#define VI_ADD(a, b) _mm256_add_epi64(a, b)
#define VI_SLL(a, n) _mm256_slli_epi64(a, n)
#define VI_AND(a, b) _mm256_and_si256(a, b)
#define VI_TESTZ(a, b) _mm256_castsi256_pd(_mm256_cmpeq_epi64(_mm256_and_si256(a, b), _mm256_setzero_si256()))
#define VI_TESTNZ(a, b) _mm256_castsi256_pd(_mm256_cmpeq_epi64(_mm256_and_si256(a, b), b))
#define VF_BITS(f) _mm_castps_si128(f)
#define VFI_FLT(i) _mm_castsi128_ps(i)
#define VFI_SET1(v) _mm_set1_epi32(v)
#define VFI_SRL(a, n) _mm_srli_epi32(a, n)
#define VFI_AND(a, b) _mm_and_si128(a, b)
#define VFI_OR(a, b) _mm_or_si128(a, b)
#define VFI_SUB(a, b) _mm_sub_epi32(a, b)
#define VFI_GT(a, b) _mm_cmpgt_epi32(a, b)
#define VFI_CVT_PD(i) _mm256_cvtepi32_pd(i)
#define VF_LOAD(p) _mm_loadu_ps(p)
#define VF_STORE(p, v) _mm_storeu_ps(p, v)

#include "vmath_body.h"
