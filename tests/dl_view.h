/*
 * dl_view.h — a DLTensor view of caller-owned memory: host (kDLCPU), one
 * lane, row-major contiguous (strides NULL), byte_offset 0. Header-only
 * and public-API only (it needs bitexact.h's DLPack types alone), so the
 * C tests, tests/cross/fixed_bits.c and the benchmarks can all use it.
 */
#ifndef BX_TEST_DL_VIEW_H
#define BX_TEST_DL_VIEW_H

#include <stdint.h>
#include <string.h>

#include "bitexact.h"

/* shape: ndim extents, owned by the caller and alive while the view is. */
static inline DLTensor bxt_view(void *data, DLDataTypeCode code, int bits, int ndim,
                                int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype.code = (uint8_t)code;
  t.dtype.bits = (uint8_t)bits;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

static inline DLTensor bxt_f32_view(void *data, int ndim, int64_t *shape) {
  return bxt_view(data, kDLFloat, 32, ndim, shape);
}

#endif /* BX_TEST_DL_VIEW_H */
