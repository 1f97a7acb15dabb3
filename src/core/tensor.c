/*
 * tensor.c — validating a borrowed DLTensor and finding the dense span of
 * memory its elements occupy. A norm does not depend on element order, so
 * any permutation of a dense layout (e.g. a transposed gradient) is read as
 * one contiguous span; layouts with gaps or aliasing are refused.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tensor.h"
#include "workspace.h"

static int host_readable(DLDeviceType dev) {
  return dev == kDLCPU || dev == kDLCUDAHost || dev == kDLCUDAManaged ||
         dev == kDLROCMHost;
}

bx_status bx_dtype_from_dl(DLDataType dt, bx_dtype *out) {
  if (dt.lanes != 1) return BX_EDTYPE;
  if (dt.code == kDLFloat && dt.bits == 16) *out = BX_DT_F16;
  else if (dt.code == kDLBfloat && dt.bits == 16) *out = BX_DT_BF16;
  else if (dt.code == kDLFloat && dt.bits == 32) *out = BX_DT_F32;
  else if (dt.code == kDLFloat && dt.bits == 64) *out = BX_DT_F64;
  else return BX_EDTYPE;
  return BX_OK;
}

static const char *dtype_code_name(uint8_t code) {
  switch (code) {
    case kDLInt: return "int";
    case kDLUInt: return "uint";
    case kDLFloat: return "float";
    case kDLBfloat: return "bfloat";
    case kDLComplex: return "complex";
    case kDLOpaqueHandle: return "opaque";
    default: return "code";
  }
}

static bx_status check_span(const DLTensor *t, const char *what, int cuda, bx_span *out);

static bx_status span_named(const DLTensor *t, const char *fn, size_t group, size_t index,
                            int cuda, bx_span *out) {
  bx_status st = check_span(t, "", cuda, out);
  if (st == BX_OK) return BX_OK;
  /* failure path only: redo the check with the tensor's name in the text */
  char what[96];
  if (group == BX_NO_GROUP) snprintf(what, sizeof what, "%s: tensor %zu", fn, index);
  else snprintf(what, sizeof what, "%s: group %zu, tensor %zu", fn, group, index);
  st = check_span(t, what, cuda, out);
  bx_error_set_index(group, index);
  return st;
}

bx_status bx_tensor_span(const DLTensor *t, const char *fn, size_t group, size_t index,
                         bx_span *out) {
  return span_named(t, fn, group, index, 0, out);
}

bx_status bx_tensor_span_cuda(const DLTensor *t, const char *fn, size_t group, size_t index,
                              bx_span *out) {
  return span_named(t, fn, group, index, 1, out);
}

bx_status bx_tensors_where(const char *fn, const bx_group *groups, size_t ngroups,
                           const DLTensor *flat, size_t count, bx_where *where) {
  size_t ng = groups ? ngroups : 1;
  int first = -1; /* 0 host, 1 CUDA */
  size_t fg = 0, fi = 0;
  *where = BX_ON_HOST;
  for (size_t g = 0; g < ng; g++) {
    const DLTensor *ts = groups ? groups[g].tensors : flat;
    size_t cnt = groups ? groups[g].count : count;
    if (!ts) continue; /* the full validation names it */
    for (size_t i = 0; i < cnt; i++) {
      int cuda = ts[i].device.device_type == kDLCUDA;
      if (first < 0) {
        first = cuda;
        fg = g;
        fi = i;
      } else if (cuda != first) {
        char a[64], b[64];
        if (groups) {
          snprintf(a, sizeof a, "group %zu, tensor %zu", fg, fi);
          snprintf(b, sizeof b, "group %zu, tensor %zu", g, i);
        } else {
          snprintf(a, sizeof a, "tensor %zu", fi);
          snprintf(b, sizeof b, "tensor %zu", i);
        }
        return bx_fail_at(BX_EDEVICE, -1, groups ? g : BX_NO_GROUP, i,
                          "%s: %s is %s memory but %s is %s; one call works on host "
                          "tensors or on CUDA tensors, not both",
                          fn, a, first ? "CUDA device" : "host", b, cuda ? "CUDA device" : "host");
      }
    }
  }
  if (first == 1) *where = BX_ON_CUDA;
  return BX_OK;
}

static bx_status check_span(const DLTensor *t, const char *what, int cuda, bx_span *out) {
  if (!t) return bx_fail(BX_EINVAL, "%s: DLTensor pointer is NULL", what);
  if (t->dtype.lanes != 1)
    return bx_fail(BX_EDTYPE, "%s: dtype has %u lanes; only lanes == 1 is supported",
                   what, (unsigned)t->dtype.lanes);
  if (bx_dtype_from_dl(t->dtype, &out->dtype) != BX_OK)
    return bx_fail(BX_EDTYPE,
                   "%s: dtype %s%u (code %u) is not supported; use float16, "
                   "bfloat16, float32 or float64",
                   what, dtype_code_name(t->dtype.code), (unsigned)t->dtype.bits,
                   (unsigned)t->dtype.code);
  if (cuda && t->device.device_type != kDLCUDA)
    return bx_fail(BX_EDEVICE, "%s: device type %d is not CUDA device memory", what,
                   (int)t->device.device_type);
  if (!cuda && !host_readable(t->device.device_type))
    return bx_fail(BX_EDEVICE,
                   "%s: device type %d is neither host-readable memory nor CUDA "
                   "device memory (kDLCUDA)",
                   what, (int)t->device.device_type);
  if (t->ndim < 0) return bx_fail(BX_EINVAL, "%s: ndim %d is negative", what, t->ndim);
  if (t->ndim > 0 && !t->shape)
    return bx_fail(BX_EINVAL, "%s: shape is NULL with ndim %d", what, t->ndim);
  size_t esize = bx_dtype_size(out->dtype);
  uint64_t n = 1;
  int zero = 0;
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] < 0)
      return bx_fail(BX_EINVAL, "%s: shape[%d] = %lld is negative", what, i,
                     (long long)t->shape[i]);
    if (t->shape[i] == 0) zero = 1;
  }
  if (zero) {
    out->data = NULL;
    out->n = 0;
    return BX_OK;
  }
  for (int i = 0; i < t->ndim; i++) {
    uint64_t s = (uint64_t)t->shape[i];
    if (n > (UINT64_MAX / 8) / s)
      return bx_fail(BX_EINVAL, "%s: shape overflows the address space", what);
    n *= s;
  }
  if (!t->data) return bx_fail(BX_EINVAL, "%s: data is NULL with %llu elements", what,
                               (unsigned long long)n);
  if (t->strides && n > 1) {
    /* Dense iff the strides of the dims of size > 1, sorted, are 1, s0*n0,
     * ... (a permutation of a row-major layout). Size-1 dims are ignored. */
    int64_t st[64], sh[64];
    int k = 0;
    for (int i = 0; i < t->ndim; i++) {
      if (t->shape[i] == 1) continue;
      if (k == 64) return bx_fail(BX_ELAYOUT, "%s: more than 64 non-trivial dims", what);
      if (t->strides[i] <= 0)
        return bx_fail(BX_ELAYOUT,
                       "%s: stride[%d] = %lld (zero or negative strides alias or "
                       "reverse elements; pass a contiguous tensor)",
                       what, i, (long long)t->strides[i]);
      int j = k++;
      while (j > 0 && st[j - 1] > t->strides[i]) {
        st[j] = st[j - 1];
        sh[j] = sh[j - 1];
        j--;
      }
      st[j] = t->strides[i];
      sh[j] = t->shape[i];
    }
    int64_t expect = 1;
    for (int j = 0; j < k; j++) {
      if (st[j] != expect)
        return bx_fail(BX_ELAYOUT,
                       "%s: strided view with gaps or overlaps (stride %lld where a "
                       "dense layout needs %lld); pass a contiguous tensor",
                       what, (long long)st[j], (long long)expect);
      expect *= sh[j];
    }
  }
  uintptr_t p = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
  if (p % esize)
    return bx_fail(BX_ELAYOUT, "%s: data + byte_offset is not aligned to %zu bytes",
                   what, esize);
  out->data = (void *)p;
  out->n = (size_t)n;
  return BX_OK;
}

/* ---- tensors written in place: no byte shared ---------------------------- */

typedef struct interval {
  uintptr_t lo, hi; /* [lo, hi) bytes */
  size_t group, index;
} interval;

static int cmp_interval(const void *a, const void *b) {
  const interval *x = a, *y = b;
  if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
  if (x->group != y->group) return x->group < y->group ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

static void name_of(char *buf, size_t len, size_t group, size_t index) {
  if (group == BX_NO_GROUP) snprintf(buf, len, "tensor %zu", index);
  else snprintf(buf, len, "group %zu, tensor %zu", group, index);
}

bx_status bx_check_writable(const char *fn, const DLTensor *flat, size_t count,
                            const bx_group *groups, size_t ngroups, int cuda) {
  size_t ng = groups ? ngroups : 1, ntensors = 0;
  for (size_t g = 0; g < ng; g++) {
    const DLTensor *ts = groups ? groups[g].tensors : flat;
    size_t cnt = groups ? groups[g].count : count;
    size_t gid = groups ? g : BX_NO_GROUP;
    if (cnt > 0 && !ts)
      return groups ? bx_fail_at(BX_EINVAL, -1, g, BX_NO_INDEX,
                                 "%s: group %zu: tensors is NULL with count %zu", fn, g, cnt)
                    : bx_fail(BX_EINVAL, "%s: tensors is NULL with count %zu", fn, cnt);
    for (size_t i = 0; i < cnt; i++) {
      bx_span s;
      bx_status st = cuda ? bx_tensor_span_cuda(&ts[i], fn, gid, i, &s)
                          : bx_tensor_span(&ts[i], fn, gid, i, &s);
      if (st != BX_OK) return st;
      ntensors++;
    }
  }
  if (ntensors < 2) return BX_OK;
  interval *iv = bx_workspace(ntensors * sizeof *iv);
  if (!iv) return bx_fail(BX_ENOMEM, "%s: cannot allocate workspace for %zu tensors", fn, ntensors);
  size_t k = 0;
  for (size_t g = 0; g < ng; g++) {
    const DLTensor *ts = groups ? groups[g].tensors : flat;
    size_t cnt = groups ? groups[g].count : count;
    for (size_t i = 0; i < cnt; i++) {
      bx_span s;
      if (cuda) bx_tensor_span_cuda(&ts[i], fn, BX_NO_GROUP, i, &s);
      else bx_tensor_span(&ts[i], fn, BX_NO_GROUP, i, &s);
      if (s.n == 0) continue; /* no element: shares nothing */
      iv[k].lo = (uintptr_t)s.data;
      iv[k].hi = (uintptr_t)s.data + s.n * bx_dtype_size(s.dtype);
      iv[k].group = groups ? g : BX_NO_GROUP;
      iv[k].index = i;
      k++;
    }
  }
  qsort(iv, k, sizeof *iv, cmp_interval);
  for (size_t i = 1; i < k; i++)
    if (iv[i].lo < iv[i - 1].hi) {
      char a[64], b[64];
      name_of(a, sizeof a, iv[i - 1].group, iv[i - 1].index);
      name_of(b, sizeof b, iv[i].group, iv[i].index);
      return bx_fail_at(BX_ELAYOUT, -1, iv[i].group, iv[i].index,
                        "%s: %s and %s share memory (the same tensor twice, or overlapping "
                        "views); each element must be scaled once, nothing was modified",
                        fn, a, b);
    }
  return BX_OK;
}
