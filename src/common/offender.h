/*
 * offender.h — the key that names the first (rank, group, tensor) holding a
 * NaN/Inf, packed so that the MAX over ranks (an integer all-reduce, or an
 * atomicMax on the GPU) selects the smallest location. Shared by the CPU
 * core (collective.c) and the CUDA kernels.
 */
#ifndef BX_OFFENDER_H
#define BX_OFFENDER_H

#include <stddef.h>
#include <stdint.h>

#include "hd.h"

#define BX_OFFENDER_RANK_BITS 20
#define BX_OFFENDER_GROUP_BITS 20
#define BX_OFFENDER_TENSOR_BITS 22

static inline BX_HD uint64_t bx_offender_clamp(uint64_t v, int bits) {
  uint64_t max = (1ull << bits) - 1;
  return v > max ? max : v;
}

/* Indices beyond the field widths are clamped (then reported as "at
 * least"); at one location a NaN ranks before an Inf. */
static inline BX_HD int64_t bx_offender_key_of(int rank, uint64_t group, uint64_t tensor,
                                               int is_nan) {
  uint64_t k = bx_offender_clamp((uint64_t)(rank < 0 ? 0 : rank), BX_OFFENDER_RANK_BITS);
  k = (k << BX_OFFENDER_GROUP_BITS) | bx_offender_clamp(group, BX_OFFENDER_GROUP_BITS);
  k = (k << BX_OFFENDER_TENSOR_BITS) | bx_offender_clamp(tensor, BX_OFFENDER_TENSOR_BITS);
  k = (k << 1) | (uint64_t)(is_nan ? 0 : 1);
  return (int64_t)((1ull << 63) - 1 - k);
}

#endif /* BX_OFFENDER_H */
