/*
 * tensor.h — validating borrowed DLTensors: the dense span of memory a
 * tensor's elements occupy (bx_tensor_span: the training kernels, CUDA),
 * the strided layout of any host tensor (bx_tensor_layout: norms and
 * scaling), where a call's tensors live, and whether tensors to be written
 * share memory. Errors name the tensor (text and location, error.h).
 */
#ifndef BX_TENSOR_H
#define BX_TENSOR_H

#include <stddef.h>

#include "bitexact.h"
#include "dtype.h"
#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bx_span {
  void *data;     /* first element (data + byte_offset) */
  size_t n;       /* elements */
  bx_dtype dtype;
} bx_span;

/* The element type of a DLPack dtype: fp16, bf16, fp32 or fp64 with one
 * lane; BX_EDTYPE otherwise (no message: the caller names the tensor). */
bx_status bx_dtype_from_dl(DLDataType dt, bx_dtype *out);

/* Validate t and describe its dense span. Errors name it as
 * "FN: group G, tensor I: ..." (or "FN: tensor I" with group BX_NO_GROUP). */
#define BX_NO_GROUP BX_NO_INDEX
bx_status bx_tensor_span(const DLTensor *t, const char *fn, size_t group, size_t index,
                         bx_span *out);

/* The layout of any host tensor (DLPack strides of any sign, zero,
 * permuted, with gaps): its logical elements, in a canonical order (the
 * layout's, not the tensor's: callers whose result does not depend on the
 * order of elements, norms and elementwise scaling, use it), are the
 * runs
 *   base + (r + sum_d i_d stride[d]) elements, r < inner, i_d < shape[d],
 * dim 0 of the outer dims varying fastest. Built from the dims of size > 1:
 * negative strides flipped (base moves to the lowest-addressed element),
 * sorted by stride with stride-0 dims last, contiguous neighbours merged,
 * the stride-1 dim (if any) taken as the inner run. A tensor that
 * bx_tensor_span accepts, or one that is dense after flipping, has
 * ndims == 0: one run [base, base + n). Same validation and messages as
 * bx_tensor_span besides the strides; data + byte_offset must be aligned
 * to the element size (so is every element). */
#define BX_LAYOUT_DIMS 64
enum { BX_DISJOINT = 0, BX_OVERLAP_MAYBE = 1, BX_OVERLAP_STRIDE0 = 2 };
typedef struct bx_layout {
  char *base;      /* the lowest-addressed element (NULL when n == 0) */
  size_t n;        /* logical elements */
  size_t inner;    /* elements of each contiguous run (>= 1) */
  size_t extent;   /* elements from base to the highest-addressed one, + 1 */
  bx_dtype dtype;
  int ndims;       /* outer dims */
  int self;        /* BX_DISJOINT: no two logical elements share memory;
                    * BX_OVERLAP_STRIDE0: a stride-0 dim (an expanded tensor);
                    * BX_OVERLAP_MAYBE: strides that may overlap (decided by
                    * bx_check_writable) */
  int64_t shape[BX_LAYOUT_DIMS], stride[BX_LAYOUT_DIMS]; /* elements, >= 0 */
} bx_layout;

bx_status bx_tensor_layout(const DLTensor *t, const char *fn, size_t group, size_t index,
                           bx_layout *out);

/* A position in a layout's canonical order. */
typedef struct bx_layout_cursor {
  const bx_layout *l;
  size_t r;    /* position in the current run */
  int64_t off; /* element offset (from base) of the current run */
  int64_t idx[BX_LAYOUT_DIMS];
} bx_layout_cursor;

/* Put c at logical element first (< l->n) of l. */
void bx_layout_seek(bx_layout_cursor *c, const bx_layout *l, size_t first);

/* The next elements of the current run, at most max (>= 1): their address
 * (returned) and count (*len); c moves past them. */
char *bx_layout_run(bx_layout_cursor *c, size_t max, size_t *len);

/* Copy the next count logical elements from the cursor to buf, packed
 * (to_tensor = 0), or from buf to the tensor (to_tensor = 1); c moves past
 * them. */
void bx_layout_copy(bx_layout_cursor *c, size_t count, void *buf, int to_tensor);

/* The same checks for a CUDA tensor (kDLCUDA; the span's data is then a
 * device address). */
bx_status bx_tensor_span_cuda(const DLTensor *t, const char *fn, size_t group, size_t index,
                              bx_span *out);

/* A call's tensors are all host-readable or all CUDA (kDLCUDA). */
typedef enum bx_where { BX_ON_HOST = 0, BX_ON_CUDA = 1 } bx_where;

/* Where the tensors of groups (or of flat[0..count) when groups is NULL)
 * live; BX_EDEVICE naming the first tensor that differs from tensor 0 when
 * they are mixed (NULL tensors are left to the full validation). */
bx_status bx_tensors_where(const char *fn, const bx_group *groups, size_t ngroups,
                           const DLTensor *flat, size_t count, bx_where *where);

/* Validate tensors to be written in place: groups, or flat[0..count) when
 * groups is NULL; host (cuda = 0: any strides, bx_tensor_layout) or CUDA
 * (cuda = 1: dense only, bx_tensor_span_cuda) tensors. BX_ELAYOUT when a
 * tensor's own logical elements overlap (a stride-0 dim of size > 1, or
 * overlapping strides: naming it) or two tensors share a byte (naming
 * both, locating the one that sorts later by address). Tensors whose
 * address ranges are disjoint, or overlap with every tensor involved
 * dense, are decided by sorting the ranges; interleaved strided ones
 * (e.g. the even and the odd columns of one buffer: accepted) by a bitmap
 * of the overlapping address range (at most 2^31 bits: beyond that
 * BX_ELAYOUT saying so). The one overlap check of the library (bx_scale,
 * bx_clip_grad_norm, CUDA plans and the Python binding). Uses the caller's
 * workspace (and heap memory for a bitmap). */
bx_status bx_check_writable(const char *fn, const DLTensor *flat, size_t count,
                            const bx_group *groups, size_t ngroups, int cuda);

#ifdef __cplusplus
}
#endif

#endif /* BX_TENSOR_H */
