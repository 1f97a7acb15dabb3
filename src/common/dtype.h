/*
 * dtype.h — the element types and reduction modes the kernels know, by
 * number, for the CPU library and the CUDA kernels alike (the numbers are
 * part of the device chunk table and of the finish's arguments).
 */
#ifndef BX_DTYPE_H
#define BX_DTYPE_H

#include <stddef.h>

#include "hd.h"

/* Element types. */
typedef enum bx_dtype {
  BX_DT_F16 = 0,
  BX_DT_BF16 = 1,
  BX_DT_F32 = 2,
  BX_DT_F64 = 3,
  BX_DT_COUNT = 4
} bx_dtype;

/* Bytes per element of a bx_dtype (0 for anything else). */
static inline BX_HD size_t bx_dtype_size(int dt) {
  return dt == BX_DT_F16 || dt == BX_DT_BF16 ? 2 : dt == BX_DT_F32 ? 4 : dt == BX_DT_F64 ? 8 : 0;
}

/* Reduction modes: p = 2 (squares), p = 1 (|x|), p = 0 and p = +-inf
 * (counts and extremes), other p (|x|^p), and the Megatron-LM flavour. */
typedef enum bx_mode {
  BX_M_SQ = 0,
  BX_M_ABS = 1,
  BX_M_EXT = 2,
  BX_M_POW = 3,
  BX_M_MEGATRON = 4
} bx_mode;

#endif /* BX_DTYPE_H */
