/*
 * layers_internal.h — the argument checks shared by the layer kernels
 * (rmsnorm.c, rope.c, swiglu.c): token-major row-major host tensors read
 * as [rows, cols] (the last dimension is cols, the others flatten into
 * rows), errors naming the tensor by index and name ("fn: tensor 2 (dy):
 * ..."), overlap of outputs with other tensors, and fixed row pieces for
 * the pool.
 */
#ifndef BX_LAYERS_INTERNAL_H
#define BX_LAYERS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact.h"

/* Element kinds a layer tensor may have. */
typedef enum bx_layer_kind { BX_LAYER_F32 = 0, BX_LAYER_I64 = 1 } bx_layer_kind;

/* One checked tensor. */
typedef struct bx_layer_arg {
  const char *name; /* "x", "dy", ... (for messages) */
  size_t index;     /* its position in the call (for messages) */
  void *data;       /* first element (data + byte_offset); NULL when n == 0 */
  size_t rows;      /* product of all dimensions but the last (1 for 1-D) */
  size_t cols;      /* the last dimension */
  size_t n;         /* elements */
  int ndim;
} bx_layer_arg;

/* t present, on host memory (kDLCPU, kDLCUDAHost, kDLCUDAManaged,
 * kDLROCMHost), of kind (fp32 / int64, one lane), with min_ndim..max_ndim
 * dimensions, row-major contiguous (strides NULL or compact; a dimension of
 * extent 1 may have any stride), data non-NULL when it has elements, and
 * aligned to its element size. Fills out (name and index set first).
 * Errors: BX_EINVAL, BX_EDTYPE, BX_EDEVICE, BX_ELAYOUT naming the tensor. */
bx_status bx_layer_check(const char *fn, size_t index, const char *name, const DLTensor *t,
                         bx_layer_kind kind, int min_ndim, int max_ndim, bx_layer_arg *out);

/* BX_EINVAL naming a unless a->rows == rows and a->cols == cols. what
 * names the expected shape in the message ("x's", "[H]"). */
bx_status bx_layer_shape(const char *fn, const bx_layer_arg *a, size_t rows, size_t cols,
                         const char *what);

/* Output args[o] (for each o with writable[o]) shares no byte with any
 * other args[i], except that it may be exactly args[inplace[o]] (same first
 * byte and element count) when inplace[o] >= 0. BX_ELAYOUT naming both
 * tensors otherwise. Elements are 4 or 8 bytes: elsize[i]. */
bx_status bx_layer_overlap(const char *fn, const bx_layer_arg *args, const size_t *elsize,
                           size_t count, const int *writable, const int *inplace);

/* opts->num_threads: 0 -> bx_default_threads(), capped at the piece count. */
int bx_layer_threads(int num_threads, size_t pieces);

/* Rows per piece of work for rows of cols elements: about 2^14 elements
 * per piece, at least one row. Pieces never split a row, so the bits do
 * not depend on this number. */
size_t bx_layer_piece_rows(size_t cols);

#endif /* BX_LAYERS_INTERNAL_H */
