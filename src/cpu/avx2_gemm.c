/*
 * avx2_gemm.c — the AVX2 GEMM micro-kernel: a 6 x 16 tile of C in 12 ymm
 * accumulators (two 8-lane vectors per row), one _mm256_fmadd_ps per
 * element per k, k in increasing order: each element's chain is exactly
 * kernels.h's, so the bits equal the portable and AVX-512 kernels'.
 */
#include <immintrin.h>

#include "kernels.h"

#define MR 6
#define NR 16

#define ROW_DECL(i) __m256 c##i##0, c##i##1
#define ROW_INIT(i)                                       \
  do {                                                    \
    if (load_c) {                                         \
      c##i##0 = _mm256_loadu_ps(c + (size_t)(i) * ldc);     \
      c##i##1 = _mm256_loadu_ps(c + (size_t)(i) * ldc + 8); \
    } else {                                              \
      c##i##0 = _mm256_setzero_ps();                      \
      c##i##1 = _mm256_setzero_ps();                      \
    }                                                     \
  } while (0)
#define ROW_FMA(i)                              \
  do {                                          \
    __m256 a = _mm256_broadcast_ss(ap + (i));   \
    c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0);  \
    c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1);  \
  } while (0)
#define ROW_STORE(i)                                    \
  do {                                                  \
    _mm256_storeu_ps(c + (size_t)(i) * ldc, c##i##0);     \
    _mm256_storeu_ps(c + (size_t)(i) * ldc + 8, c##i##1); \
  } while (0)
#define ALL_ROWS(X) X(0); X(1); X(2); X(3); X(4); X(5)

static void avx2_gemm_6x16(size_t kc, const float *ap, const float *bp, float *c, size_t ldc,
                           int load_c) {
  ALL_ROWS(ROW_DECL);
  ALL_ROWS(ROW_INIT);
  for (size_t k = 0; k < kc; k++, ap += MR, bp += NR) {
    __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
    ALL_ROWS(ROW_FMA);
  }
  ALL_ROWS(ROW_STORE);
}

const bx_gemm_kernel bx_gemm_avx2 = {"avx2", MR, NR, avx2_gemm_6x16, NULL};
