/*
 * hd.h — code shared by the CPU library and the CUDA kernels (src/cuda):
 * BX_HD marks a function compiled for both host and device by nvcc; for the
 * C compiler it is empty. Keeping one copy of the rounding and scaling
 * logic is what makes the CPU and GPU bits identical by construction.
 */
#ifndef BX_HD_H
#define BX_HD_H

#include <stdint.h>

#ifdef __CUDACC__
#define BX_HD __host__ __device__
#else
#define BX_HD
#endif

typedef unsigned __int128 bx_u128;
typedef __int128 bx_i128;

/* Leading zeros of a non-zero 64-bit word. */
static inline BX_HD int bx_clz64(uint64_t x) {
#ifdef __CUDA_ARCH__
  return __clzll((long long)x);
#else
  return __builtin_clzll(x);
#endif
}

/* Bits of a double / float and back, without aliasing. */
static inline BX_HD uint64_t bx_f64_bits(double d) {
#ifdef __CUDA_ARCH__
  return (uint64_t)__double_as_longlong(d);
#else
  uint64_t u;
  __builtin_memcpy(&u, &d, 8);
  return u;
#endif
}
static inline BX_HD double bx_f64_from_bits(uint64_t u) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double((long long)u);
#else
  double d;
  __builtin_memcpy(&d, &u, 8);
  return d;
#endif
}
static inline BX_HD uint32_t bx_f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return (uint32_t)__float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}
static inline BX_HD float bx_f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

#endif /* BX_HD_H */
