/*
 * portable_gemm.c — the portable GEMM micro-kernel: a 4 x 8 tile, one
 * fused multiply-add per element per k, k in increasing order (kernels.h's
 * chain, written out with gemm_hd.h's step, which is the device's chain
 * too). fmaf is the correctly rounded fused multiply-add of C99 wherever it
 * runs (hardware or libm), and -ffp-contract=off keeps the compiler from
 * fusing anything else, so the bits equal the vector kernels'.
 */
#include "gemm_hd.h"
#include "kernels.h"

#define MR 4
#define NR 8

static void portable_gemm_4x8(size_t kc, const float *ap, const float *bp, float *c, size_t ldc,
                              int load_c) {
  float acc[MR][NR];
  for (size_t i = 0; i < MR; i++)
    for (size_t j = 0; j < NR; j++) acc[i][j] = load_c ? c[i * ldc + j] : 0.0f;
  for (size_t k = 0; k < kc; k++, ap += MR, bp += NR)
    for (size_t i = 0; i < MR; i++) {
      float a = ap[i];
      for (size_t j = 0; j < NR; j++) acc[i][j] = bx_gemm_step_f32(acc[i][j], a, bp[j]);
    }
  for (size_t i = 0; i < MR; i++)
    for (size_t j = 0; j < NR; j++) c[i * ldc + j] = acc[i][j];
}

const bx_gemm_kernel bx_gemm_portable = {"portable", MR, NR, portable_gemm_4x8, NULL};
