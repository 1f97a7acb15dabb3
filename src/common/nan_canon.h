/*
 * nan_canon.h — the one NaN the library stores (docs/design.md, "NaN").
 *
 * IEEE-754 says an operation returns *a* NaN, not which one: x86-64's
 * default NaN (inf - inf, 0 * inf, sqrt(-1)) is the negative 0xFFC00000,
 * aarch64's and CUDA's are positive (0x7FC00000, 0x7FFFFFFF), and when an
 * operand is a NaN, which operand's payload comes out depends on the ISA
 * and on the operand order the compiler chose. So every value the library
 * computes is passed through these functions before it is stored: a NaN
 * becomes the canonical quiet NaN of its format (sign +, quiet bit set,
 * payload 0), anything else is returned unchanged, bit for bit:
 *
 *   fp32  0x7FC00000          bf16  0x7FC0 (c10's NaN)
 *   fp64  0x7FF8000000000000  fp16  0x7E00
 *
 * Values the library only moves (permutation rows, embedding rows, the
 * untouched part of a RoPE head) keep their bits. One explicit function
 * per dtype (grep finds every use); host and device (BX_HD). The x != x
 * test needs IEEE comparisons: never -ffast-math / -ffinite-math-only.
 */
#ifndef BX_NAN_CANON_H
#define BX_NAN_CANON_H

#include <stdint.h>

#include "hd.h"

#define BX_F32_CANON_NAN 0x7FC00000u
#define BX_F64_CANON_NAN 0x7FF8000000000000ull
#define BX_BF16_CANON_NAN ((uint16_t)0x7FC0u)
#define BX_F16_CANON_NAN ((uint16_t)0x7E00u)

/* x, or the canonical NaN when x is a NaN (one compare and a select). */
static inline BX_HD float bx_canon_f32(float x) {
  return x != x ? bx_f32_from_bits(BX_F32_CANON_NAN) : x;
}
static inline BX_HD double bx_canon_f64(double x) {
  return x != x ? bx_f64_from_bits(BX_F64_CANON_NAN) : x;
}

/* The same on a 16-bit pattern (bf16: exponent all ones and a non-zero
 * 7-bit fraction; fp16: exponent all ones and a non-zero 10-bit fraction). */
static inline BX_HD uint16_t bx_canon_bf16(uint16_t b) {
  return (uint16_t)(b & 0x7FFFu) > 0x7F80u ? BX_BF16_CANON_NAN : b;
}
static inline BX_HD uint16_t bx_canon_f16(uint16_t b) {
  return (uint16_t)(b & 0x7FFFu) > 0x7C00u ? BX_F16_CANON_NAN : b;
}

/* The array loops below run once per finished tile or row: GCC's -O2
 * cost model declines to vectorise them, so ask for it on the host (a
 * compare and a blend per 4, 8 or 16 lanes; the same bits either way). */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define BX_CANON_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define BX_CANON_VECTORIZE
#endif
#ifdef __cplusplus /* nvcc compiles the .cu files as C++ */
#define BX_CANON_RESTRICT __restrict__
#else
#define BX_CANON_RESTRICT restrict
#endif

/* In place over n fp32 values (a finished block of outputs, still in cache). */
static inline BX_HD BX_CANON_VECTORIZE void bx_canon_f32_n(float *x, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) x[i] = bx_canon_f32(x[i]);
}

/* dst[0..n) = src[0..n) canonicalised (a finished tile copied out). */
static inline BX_HD BX_CANON_VECTORIZE void bx_canon_f32_copy(float *BX_CANON_RESTRICT dst,
                                                               const float *BX_CANON_RESTRICT src, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) dst[i] = bx_canon_f32(src[i]);
}

#endif /* BX_NAN_CANON_H */
