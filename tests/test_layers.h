/*
 * test_layers.h — helpers shared by test_layers.c (RMSNorm, the thread and
 * ISA sweep) and test_layers_rope.c (RoPE, SwiGLU): owned fp32 / int64
 * tensors with a DLTensor view, fills, bitwise comparison, the error
 * expectation. Static: each test file has its own copy.
 */
#ifndef BX_TEST_LAYERS_H
#define BX_TEST_LAYERS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "harness.h"

#define U 0x1p-24 /* fp32 unit roundoff */

/* ---- tensors: owned fp32 / int64 buffers with a DLTensor view ------------- */

typedef struct lt {
  void *buf;
  size_t n;
  int64_t shape[3];
  DLTensor t;
} lt;

static inline void lt_make(lt *x, int i64, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  memset(x, 0, sizeof *x);
  x->shape[0] = d0;
  x->shape[1] = d1;
  x->shape[2] = d2;
  x->n = 1;
  for (int d = 0; d < ndim; d++) x->n *= (size_t)x->shape[d];
  x->buf = calloc(x->n + 16, 8);
  x->t.data = x->buf;
  x->t.device.device_type = kDLCPU;
  x->t.ndim = ndim;
  x->t.dtype.code = i64 ? kDLInt : kDLFloat;
  x->t.dtype.bits = i64 ? 64 : 32;
  x->t.dtype.lanes = 1;
  x->t.shape = x->shape;
}
static inline void lt_free(lt *x) { free(x->buf); }
static inline float *F(const lt *x) { return x->buf; }
static inline int64_t *I(const lt *x) { return x->buf; }

/* A view of the first k rows of a 2-D tensor (shares the buffer). */
static inline DLTensor rows_view(const lt *x, int64_t k, int64_t *shape) {
  DLTensor v = x->t;
  shape[0] = k;
  for (int d = 1; d < x->t.ndim; d++) shape[d] = x->shape[d];
  v.shape = shape;
  return v;
}

static inline void fill_normal(bxt_rng *r, lt *x, double sigma) {
  for (size_t i = 0; i < x->n; i++) {
    double v = bxt_normal(r) * sigma;
    if (bxt_below(r, 100) == 0) v = 0.0;
    F(x)[i] = (float)v;
  }
}

static inline uint32_t fb(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* elements whose bits differ; the first one in *first */
static inline size_t ndiff(const float *a, const float *b, size_t n, size_t *first) {
  size_t d = 0;
  for (size_t i = n; i-- > 0;)
    if (fb(a[i]) != fb(b[i])) {
      d++;
      if (first) *first = i;
    }
  return d;
}

/* expect status st and a message containing want; buffers unchanged */
#define EXPECT_FAIL(call, st, want, what)                                              \
  do {                                                                                 \
    CHECK_STATUS((call), (st), "%s", (what));                                          \
    CHECK(strstr(bx_last_error(), (want)) != NULL, "%s: message \"%s\" lacks \"%s\"", \
          (what), bx_last_error(), (want));                                            \
  } while (0)

#endif /* BX_TEST_LAYERS_H */
