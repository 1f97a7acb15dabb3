/*
 * train_check.h — the tensor validation of the training layer kernels
 * (rmsnorm.c, rope.c, swiglu.c, attention.c, router.c, permute.c,
 * embedding.c, xent.c): one borrowed DLTensor of a set of element types,
 * on host memory, row-major contiguous and aligned, of a range of
 * dimensions and optionally of a given shape; the overlap of outputs with
 * the other tensors of a call (with exactly-in-place exceptions); and the
 * thread count and row pieces of the pool (pool.h).
 *
 * Every error names the function and the tensor by its position in the
 * call and its name ("fn: tensor 2 (dy): ...") and carries the tensor's
 * index as its location (error.h bx_fail_at). Nothing here writes a
 * tensor, so a kernel that runs every check before its first write writes
 * nothing on error.
 *
 * The GEMM and wgrad.c check their operands with gemm.c's
 * bx_gemm_check_operand (gemm_internal.h), whose messages name tensors
 * without a position; math.c and adamw.c with bx_ew_check (tensor.h).
 */
#ifndef BX_TRAIN_CHECK_H
#define BX_TRAIN_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact.h"
#include "call.h"

/* Element types (a set is their OR). */
#define BX_TC_F32 1u
#define BX_TC_BF16 2u
#define BX_TC_I32 4u
#define BX_TC_I64 8u
#define BX_TC_IDS (BX_TC_I32 | BX_TC_I64) /* ids: int32 or int64 */

#define BX_TC_MAX_NDIM 4

/* One checked tensor. */
typedef struct bx_tc_tensor {
  const char *name;            /* "x", "dy", ... (for messages) */
  size_t index;                /* its position in the call (for messages) */
  void *data;                  /* first element (data + byte_offset); NULL when n == 0 */
  int ndim;
  int64_t dim[BX_TC_MAX_NDIM]; /* shape; 1 past ndim */
  size_t rows;                 /* product of all dimensions but the last (1 for 0-D, 1-D) */
  size_t cols;                 /* the last dimension (1 for 0-D) */
  size_t n;                    /* elements */
  unsigned dtype;              /* one BX_TC_* bit */
  size_t elsize;               /* bytes per element */
  int writable;                /* an output: bx_tc_overlap checks it */
  int inplace;                 /* -1, or the index of the one tensor this output may be exactly */
} bx_tc_tensor;

/* t present, on host memory (kDLCPU, kDLCUDAHost, kDLCUDAManaged,
 * kDLROCMHost), of one of the element types dtypes (one lane), with
 * min_ndim..max_ndim (<= BX_TC_MAX_NDIM) dimensions, shape[d] == want[d]
 * wherever want (may be NULL) has want[d] >= 0, at most SIZE_MAX / 16
 * elements, row-major contiguous (strides NULL or compact; a dimension of
 * extent 1 may have any stride), data non-NULL and aligned to the element
 * size when it has elements. Fills out (name, index, writable and
 * inplace = -1 first, so out names the tensor even on error).
 * Errors: BX_EINVAL, BX_EDTYPE, BX_EDEVICE, BX_ELAYOUT naming the tensor. */
bx_status bx_tc_check(const char *fn, size_t index, const char *name, const DLTensor *t,
                      unsigned dtypes, int min_ndim, int max_ndim, const int64_t *want,
                      int writable, bx_tc_tensor *out);

/* Where a layer call runs. cuda: every tensor of the call is a kDLCUDA
 * tensor (then of device `device`, the first one's), or a kDLCUDA or
 * kDLCUDAManaged tensor with at least one managed one and managed calls
 * run on the device (bx_train_managed_on_device; `device` the first CUDA
 * tensor's, else the first managed one's); otherwise the host path, whose
 * checks refuse any tensor not in host memory (so a mixed call names its
 * first device tensor, as before the device path existed). */
typedef struct bx_tc_place {
  int cuda;
  int device;
} bx_tc_place;

/* The place of a call's tensors ts[0..count) (NULL entries skipped). */
bx_tc_place bx_tc_place_of(const DLTensor *const *ts, size_t count);

/* 1 when t (not NULL) may go to the device: a kDLCUDA tensor, or a
 * kDLCUDAManaged one while managed calls run on the device
 * (bx_train_managed_on_device). For the calls that decide per operand. */
int bx_tc_on_device(const DLTensor *t);

/* bx_tc_check for a call at place pl (NULL: the host): on the CUDA path a
 * tensor must be kDLCUDA on pl->device or kDLCUDAManaged (BX_EDEVICE
 * naming it otherwise);
 * every other check is the same. */
bx_status bx_tc_check_in(const bx_tc_place *pl, const char *fn, size_t index, const char *name,
                         const DLTensor *t, unsigned dtypes, int min_ndim, int max_ndim,
                         const int64_t *want, int writable, bx_tc_tensor *out);

/* 1 when a and b have the same dimensions. */
static inline int bx_tc_same_shape(const bx_tc_tensor *a, const bx_tc_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->dim[d] != b->dim[d]) return 0;
  return 1;
}

/* BX_EINVAL naming a unless a->rows == rows and a->cols == cols. what
 * names the expected shape in the message ("x's shape", "[T, F] ="). */
bx_status bx_tc_shape(const char *fn, const bx_tc_tensor *a, size_t rows, size_t cols,
                      const char *what);

/* Each writable ts[o] shares no byte with any other ts[i], except that it
 * may be exactly the tensor of index ts[o]->inplace (same first byte,
 * element count and element size). NULL entries and empty tensors are
 * skipped. Outputs in array order, each against the others in array
 * order; the first overlap is BX_ELAYOUT naming both tensors. */
bx_status bx_tc_overlap(const char *fn, const bx_tc_tensor *const *ts, size_t count);

/* The start of a layer call whose options struct (NULL: the defaults)
 * begins with size_t struct_size and has int num_threads at byte
 * threads_at (offsetof): struct_size first (abi.h bx_check_struct_size
 * with type and macro for the message; no other field is read before it
 * passes), then num_threads >= 0 (BX_EINVAL) into *threads (0 without
 * opts), then bx_call_enter(call, fn). On error the call is not entered. */
bx_status bx_tc_enter(bx_call *call, const char *fn, const void *opts, size_t size,
                      size_t threads_at, const char *type, const char *macro, int *threads);

/* Threads for pieces fixed pieces of work: num_threads (0 = bx_default_threads()),
 * at most BX_MAX_THREADS and one per piece, at least 1. Speed only: the
 * pieces fix the bits. */
int bx_tc_threads(int num_threads, size_t pieces);

/* Rows per piece of work for rows of cols elements: about 2^14 elements
 * per piece, at least one row. Pieces never split a row, so the bits do
 * not depend on this number. */
size_t bx_tc_piece_rows(size_t cols);

/* Run fn over pieces fixed pieces (none: nothing) on
 * bx_tc_threads(num_threads, pieces) threads (pool.h bx_parallel_run). */
void bx_tc_run(int num_threads, size_t pieces, void (*fn)(void *ctx, size_t piece, int worker),
               void *ctx);

struct bx_train_device; /* train_device.h */

/* The device path's host copies (issue 30): the data of the call's device
 * tensors ts[0..count) (NULL or empty entries: hosts[i] a copy of the
 * entry, nothing copied) copied with dev->to_host into one bx_workspace
 * block on this thread, hosts[i] the same tensor with data in that block;
 * *extra (may be NULL when extra_bytes is 0): extra_bytes more of the
 * block, 16-byte aligned, for the host-side checks and decisions. Valid
 * until the next bx_workspace of this call. BX_ENOMEM, or the copy's
 * BX_EDEVICE. For checks of device data that decide an error: run on the
 * copies before any launch, they give the host path's errors. */
bx_status bx_tc_to_host(const char *fn, const bx_tc_place *pl, const struct bx_train_device *dev,
                        const bx_tc_tensor *const *ts, bx_tc_tensor *hosts, size_t count,
                        size_t extra_bytes, void **extra);

/* Element i of an ids tensor (int32 or int64). */
static inline int64_t bx_tc_id(const bx_tc_tensor *t, size_t i) {
  return t->dtype == BX_TC_I32 ? (int64_t)((const int32_t *)t->data)[i]
                               : ((const int64_t *)t->data)[i];
}

/* The elements of an int64 tensor. */
static inline const int64_t *bx_tc_i64(const bx_tc_tensor *t) { return (const int64_t *)t->data; }

#endif /* BX_TRAIN_CHECK_H */
