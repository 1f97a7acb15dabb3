/*
 * portable_tokred.c — the portable kernel of the token reduction's grid
 * add (kernels.h, bx_tokred_grid_fn): the rule of tokred_grid.h's
 * bx_tokred_q per element, written branch-free so that the compiler
 * vectorises it with the baseline ISA (SSE2 on x86-64, NEON on aarch64).
 * Every step is an exact integer or exactly rounded IEEE operation on one
 * element, so vectorising cannot change a bit.
 */
#include <string.h>

#include "kernels.h"
#include "tokred_grid.h"

#if defined(__GNUC__) && !defined(__clang__)
#define BX_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define BX_VECTORIZE
#endif

BX_VECTORIZE static uint32_t portable_grid_add(int64_t *restrict w, const float *restrict a,
                                               size_t n, double inv_step, int64_t *nonfinite) {
  const double magic = 6755399441055744.0; /* 1.5 * 2^52: see bx_tokred_q */
  int64_t mbits;
  memcpy(&mbits, &magic, sizeof mbits);
  int32_t mx = 0;
  int64_t nf = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t b;
    memcpy(&b, &a[i], sizeof b);
    int32_t ab = b & 0x7fffffff;
    int32_t fin = -(int32_t)(ab < 0x7f800000); /* all ones when finite */
    nf += 1 + fin;
    b &= fin;
    ab &= fin;
    mx = ab > mx ? ab : mx;
    float v;
    memcpy(&v, &b, sizeof v);
    double r = (double)v * inv_step + magic;
    int64_t rb;
    memcpy(&rb, &r, sizeof rb);
    /* modulo 2^64 (no signed overflow, whatever an out-of-range a does) */
    w[i] = (int64_t)((uint64_t)w[i] + ((uint64_t)rb - (uint64_t)mbits));
  }
  *nonfinite = nf;
  return (uint32_t)mx;
}

BX_VECTORIZE static uint32_t portable_max_abs(const float *restrict a, size_t n) {
  int32_t mx = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t b;
    memcpy(&b, &a[i], sizeof b);
    int32_t ab = b & 0x7fffffff;
    ab &= -(int32_t)(ab < 0x7f800000);
    mx = ab > mx ? ab : mx;
  }
  return (uint32_t)mx;
}

const bx_tokred_kernels bx_tokred_portable = {"portable", portable_grid_add, portable_max_abs};
