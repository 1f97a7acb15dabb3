/*
 * tensor.h — validating borrowed DLTensors: the dense span of memory a
 * tensor's elements occupy, where a call's tensors live, and whether
 * tensors to be written share memory. Errors name the tensor (text and
 * location, error.h).
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
 * groups is NULL; host (cuda = 0) or CUDA (cuda = 1) tensors; no two share
 * a byte (BX_ELAYOUT naming both). The one overlap check of the library
 * (bx_scale, bx_clip_grad_norm, CUDA plans and the Python binding). Uses
 * the caller's workspace. */
bx_status bx_check_writable(const char *fn, const DLTensor *flat, size_t count,
                            const bx_group *groups, size_t ngroups, int cuda);

#ifdef __cplusplus
}
#endif

#endif /* BX_TENSOR_H */
