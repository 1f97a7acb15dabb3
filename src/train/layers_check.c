/*
 * layers_check.c — the argument checks of the layer kernels
 * (layers_internal.h): every check runs before a kernel writes anything.
 */
#include <stdint.h>

#include "error.h"
#include "layers_internal.h"
#include "pool.h"

static int host_readable(DLDeviceType dev) {
  return dev == kDLCPU || dev == kDLCUDAHost || dev == kDLCUDAManaged || dev == kDLROCMHost;
}

#define FAIL(st, ...) bx_fail_at((st), -1, BX_NO_INDEX, index, __VA_ARGS__)

bx_status bx_layer_check(const char *fn, size_t index, const char *name, const DLTensor *t,
                         bx_layer_kind kind, int min_ndim, int max_ndim, bx_layer_arg *out) {
  out->name = name;
  out->index = index;
  out->data = NULL;
  out->rows = out->cols = out->n = 0;
  out->ndim = 0;
  if (!t) return FAIL(BX_EINVAL, "%s: tensor %zu (%s) is NULL", fn, index, name);
  if (!host_readable(t->device.device_type))
    return FAIL(BX_EDEVICE, "%s: tensor %zu (%s) is on device type %d, not host memory", fn,
                index, name, (int)t->device.device_type);
  int ok = t->dtype.lanes == 1 &&
           (kind == BX_LAYER_F32 ? t->dtype.code == kDLFloat && t->dtype.bits == 32
                                 : t->dtype.code == kDLInt && t->dtype.bits == 64);
  if (!ok)
    return FAIL(BX_EDTYPE, "%s: tensor %zu (%s) has dtype code %u bits %u lanes %u; want %s", fn,
                index, name, (unsigned)t->dtype.code, (unsigned)t->dtype.bits,
                (unsigned)t->dtype.lanes, kind == BX_LAYER_F32 ? "float32" : "int64");
  if (t->ndim < min_ndim || t->ndim > max_ndim)
    return FAIL(BX_EINVAL, "%s: tensor %zu (%s) has %d dimensions, want %d to %d", fn, index,
                name, t->ndim, min_ndim, max_ndim);
  if (!t->shape) return FAIL(BX_EINVAL, "%s: tensor %zu (%s) has no shape", fn, index, name);
  size_t n = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] < 0)
      return FAIL(BX_EINVAL, "%s: tensor %zu (%s): shape[%d] = %lld is negative", fn, index, name,
                  d, (long long)t->shape[d]);
    size_t s = (size_t)t->shape[d];
    if (s && n > (SIZE_MAX / 16) / s)
      return FAIL(BX_EINVAL, "%s: tensor %zu (%s): too many elements", fn, index, name);
    n *= s;
  }
  if (t->strides) {
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (t->shape[d] != 1 && t->strides[d] != want)
        return FAIL(BX_ELAYOUT,
                    "%s: tensor %zu (%s) is not row-major contiguous: strides[%d] = %lld, "
                    "want %lld", fn, index, name, d, (long long)t->strides[d], (long long)want);
      want *= t->shape[d];
    }
  }
  size_t es = kind == BX_LAYER_F32 ? 4 : 8;
  if (n && !t->data)
    return FAIL(BX_EINVAL, "%s: tensor %zu (%s): data is NULL with %zu elements", fn, index,
                name, n);
  char *p = (char *)t->data + t->byte_offset;
  if (n && (uintptr_t)p % es)
    return FAIL(BX_ELAYOUT, "%s: tensor %zu (%s): data + byte_offset is not aligned to %zu bytes",
                fn, index, name, es);
  out->data = n ? p : NULL;
  out->n = n;
  out->ndim = t->ndim;
  out->cols = t->ndim ? (size_t)t->shape[t->ndim - 1] : 1;
  out->rows = out->cols ? n / out->cols : 0;
  if (t->ndim >= 1 && out->cols == 0) { /* rows = product of the leading dimensions */
    size_t r = 1;
    for (int d = 0; d + 1 < t->ndim; d++) r *= (size_t)t->shape[d];
    out->rows = r;
  }
  return BX_OK;
}

bx_status bx_layer_shape(const char *fn, const bx_layer_arg *a, size_t rows, size_t cols,
                         const char *what) {
  if (a->rows == rows && a->cols == cols) return BX_OK;
  return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, a->index,
                    "%s: tensor %zu (%s) is [%zu, %zu] (as rows, columns), want %s [%zu, %zu]", fn,
                    a->index, a->name, a->rows, a->cols, what, rows, cols);
}

bx_status bx_layer_overlap(const char *fn, const bx_layer_arg *args, const size_t *elsize,
                           size_t count, const int *writable, const int *inplace) {
  for (size_t o = 0; o < count; o++) {
    if (!writable[o] || args[o].n == 0) continue;
    uintptr_t lo = (uintptr_t)args[o].data, hi = lo + args[o].n * elsize[o];
    for (size_t i = 0; i < count; i++) {
      if (i == o || args[i].n == 0) continue;
      uintptr_t lo2 = (uintptr_t)args[i].data, hi2 = lo2 + args[i].n * elsize[i];
      if (!(lo < hi2 && lo2 < hi)) continue;
      if (inplace[o] == (int)i && lo == lo2 && args[o].n == args[i].n && elsize[o] == elsize[i])
        continue;
      return bx_fail_at(BX_ELAYOUT, -1, BX_NO_INDEX, args[o].index,
                        "%s: tensor %zu (%s) overlaps tensor %zu (%s)%s", fn, args[o].index,
                        args[o].name, args[i].index, args[i].name,
                        inplace[o] == (int)i ? " (only exactly in place is allowed)" : "");
    }
  }
  return BX_OK;
}

int bx_layer_threads(int num_threads, size_t pieces) {
  int t = num_threads > 0 ? num_threads : bx_default_threads();
  if (pieces < 1) pieces = 1;
  if ((size_t)t > pieces) t = (int)pieces;
  return t;
}

size_t bx_layer_piece_rows(size_t cols) {
  size_t r = cols ? ((size_t)1 << 14) / cols : ((size_t)1 << 14);
  return r ? r : 1;
}
