/*
 * avx512_gemm.c — the AVX-512 GEMM micro-kernel: a 12 x 32 tile of C in 24
 * zmm accumulators (two 16-lane vectors per row), one _mm512_fmadd_ps per
 * element per k, k in increasing order: each element's chain is exactly
 * kernels.h's (fmaf(a, b, acc) = _mm512_fmadd_ps lane for lane), so the
 * bits equal the portable and AVX2 kernels'. The driver (src/train/gemm.c)
 * packs A and B and handles the edges.
 */
#include <immintrin.h>

#include "kernels.h"

#define MR 12
#define NR 32

#define ROW_DECL(i) __m512 c##i##0, c##i##1
#define ROW_INIT(i)                                        \
  do {                                                     \
    if (load_c) {                                          \
      c##i##0 = _mm512_loadu_ps(c + (size_t)(i) * ldc);      \
      c##i##1 = _mm512_loadu_ps(c + (size_t)(i) * ldc + 16); \
    } else {                                               \
      c##i##0 = _mm512_setzero_ps();                       \
      c##i##1 = _mm512_setzero_ps();                       \
    }                                                      \
  } while (0)
#define ROW_FMA(i)                                \
  do {                                            \
    __m512 a = _mm512_set1_ps(ap[i]);             \
    c##i##0 = _mm512_fmadd_ps(a, b0, c##i##0);    \
    c##i##1 = _mm512_fmadd_ps(a, b1, c##i##1);    \
  } while (0)
#define ROW_STORE(i)                                     \
  do {                                                   \
    _mm512_storeu_ps(c + (size_t)(i) * ldc, c##i##0);      \
    _mm512_storeu_ps(c + (size_t)(i) * ldc + 16, c##i##1); \
  } while (0)
#define ALL_ROWS(X) X(0); X(1); X(2); X(3); X(4); X(5); X(6); X(7); X(8); X(9); X(10); X(11)

static void avx512_gemm_12x32(size_t kc, const float *ap, const float *bp, float *c, size_t ldc,
                              int load_c) {
  ALL_ROWS(ROW_DECL);
  ALL_ROWS(ROW_INIT);
  /* the next tile down (the driver's next call) has its C rows fetched
   * while this one computes: 12 rows of two lines, one pair per k step
   * (a prefetch past the matrix is harmless) */
  const float *next = c + (size_t)MR * ldc;
  size_t k = 0;
  for (; k < kc && k < MR; k++, ap += MR, bp += NR) {
    _mm_prefetch((const char *)(next + k * ldc), _MM_HINT_T0);
    _mm_prefetch((const char *)(next + k * ldc + 16), _MM_HINT_T0);
    __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
    ALL_ROWS(ROW_FMA);
  }
  for (; k < kc; k++, ap += MR, bp += NR) {
    __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
    ALL_ROWS(ROW_FMA);
  }
  ALL_ROWS(ROW_STORE);
}

/* B unpacked: row k of the sliver at bp + k*ldb (fp32 row-major B of NN
 * and TN: X's rows), unaligned loads; the same chain. */
static void avx512_gemm_12x32_ldb(size_t kc, const float *ap, const float *bp, size_t ldb,
                                  float *c, size_t ldc, int load_c) {
  ALL_ROWS(ROW_DECL);
  ALL_ROWS(ROW_INIT);
  const float *next = c + (size_t)MR * ldc;
  size_t k = 0;
  for (; k < kc && k < MR; k++, ap += MR, bp += ldb) {
    _mm_prefetch((const char *)(next + k * ldc), _MM_HINT_T0);
    _mm_prefetch((const char *)(next + k * ldc + 16), _MM_HINT_T0);
    __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
    ALL_ROWS(ROW_FMA);
  }
  for (; k < kc; k++, ap += MR, bp += ldb) {
    __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
    ALL_ROWS(ROW_FMA);
  }
  ALL_ROWS(ROW_STORE);
}

const bx_gemm_kernel bx_gemm_avx512 = {"avx512", MR, NR, avx512_gemm_12x32, avx512_gemm_12x32_ldb};
