/*
 * gemm_hd.h — the per-output chain of bx_gemm (bitexact_train_gemm.h states
 * it; src/train/gemm.c blocks it, the src/cpu gemm files are its micro-kernels),
 * once for the CPU and the GPU (BX_HD):
 *
 *   acc = accumulate ? C[i][j] : +0.0f;
 *   for k = 0 .. K-1 (ascending):  acc = fma(A(i,k), B(k,j), acc)   one rounding each
 *   C[i][j] = canon(acc)
 *
 * A bf16 operand is widened to fp32 exactly before the chain. No split of
 * k, no other order: a tile of any shape, a thread of any device computes
 * each output as this one chain (the CPU's vector micro-kernels hold the
 * same chains in registers; the device's SIMT tiles do too), so blocking,
 * padding (padded rows and columns are dropped, never stored), thread and
 * block counts never reach the bits. K = 0 stores +0, or (accumulate)
 * leaves C as it is.
 */
#ifndef BX_GEMM_HD_H
#define BX_GEMM_HD_H

#include <stdint.h>

#include "fp_hd.h"
#include "hd.h"
#include "nan_canon.h"
#include "scale_round.h"

/* The chain's start: C's value with accumulate, else +0. */
static inline BX_HD float bx_gemm_start_f32(int accumulate, float c) {
  return accumulate ? c : 0.0f;
}

/* One step of the chain. */
static inline BX_HD float bx_gemm_step_f32(float acc, float a, float b) {
  return bx_fmaf(a, b, acc);
}

/* The value stored. */
static inline BX_HD float bx_gemm_store_f32(float acc) { return bx_canon_f32(acc); }

/* An operand element, fp32 or bf16 widened exactly (p: the operand's
 * first element; bf16: 1 when it holds bf16). */
static inline BX_HD float bx_gemm_load(const void *p, int bf16, uint64_t i) {
  return bf16 ? bx_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* The scalar reference of one output: acc over k steps of a[k * sa] and
 * b[k * sb] (element strides; bf16 flags as bx_gemm_load), from acc. */
static inline BX_HD float bx_gemm_chain(float acc, const void *a, int a_bf16, uint64_t sa,
                                        const void *b, int b_bf16, uint64_t sb, uint64_t k) {
  for (uint64_t p = 0; p < k; p++)
    acc = bx_gemm_step_f32(acc, bx_gemm_load(a, a_bf16, p * sa), bx_gemm_load(b, b_bf16, p * sb));
  return acc;
}

#endif /* BX_GEMM_HD_H */
