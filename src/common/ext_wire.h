/*
 * ext_wire.h — the wire words of p = 0 and p = ±inf, two per group: for
 * p = 0 (non-zeros, NaNs), summed; for p = ±inf (max |x| bits, ~min |x|
 * bits), MAX-reduced: non-negative doubles order like their bit patterns,
 * and a NaN anywhere travels as INT64_MAX in both words. Shared by
 * src/core/norm.c and the CUDA finish (src/common/cuda_finish.h).
 */
#ifndef BX_EXT_WIRE_H
#define BX_EXT_WIRE_H

#include <stdint.h>

#include "hd.h"

typedef struct bx_ext {
  double maxabs, minabs; /* over non-NaN elements; 0 and +Inf when none */
  int64_t nan, nonzero;
} bx_ext;

static inline BX_HD void bx_ext_to_wire(double p, const bx_ext *e, int64_t *w) {
  if (p == 0.0) {
    w[0] = e->nonzero;
    w[1] = e->nan;
  } else {
    w[0] = e->nan ? INT64_MAX : (int64_t)bx_f64_bits(e->maxabs);
    w[1] = e->nan ? INT64_MAX : ~(int64_t)bx_f64_bits(e->minabs);
  }
}

static inline BX_HD void bx_ext_from_wire(double p, const int64_t *w, bx_ext *e) {
  e->maxabs = 0.0;
  e->minabs = bx_f64_from_bits(0x7FF0000000000000ull);
  e->nan = e->nonzero = 0;
  if (p == 0.0) {
    e->nonzero = w[0];
    e->nan = w[1];
  } else if (w[0] == INT64_MAX) {
    e->nan = 1;
  } else {
    e->maxabs = bx_f64_from_bits((uint64_t)w[0]);
    e->minabs = bx_f64_from_bits((uint64_t)~w[1]);
  }
}

#endif /* BX_EXT_WIRE_H */
