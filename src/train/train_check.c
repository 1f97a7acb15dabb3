/*
 * train_check.c — the tensor checks of the training layer kernels
 * (train_check.h): every check runs before a kernel writes anything.
 */
#include <stdint.h>
#include <string.h>

#include "abi.h"

#include "error.h"
#include "pool.h"
#include "train_check.h"
#include "train_device.h"
#include "workspace.h"

static int host_readable(DLDeviceType dev) {
  return dev == kDLCPU || dev == kDLCUDAHost || dev == kDLCUDAManaged || dev == kDLROCMHost;
}

static unsigned dtype_of(DLDataType dt) {
  if (dt.lanes != 1) return 0;
  if (dt.code == kDLFloat && dt.bits == 32) return BX_TC_F32;
  if (dt.code == kDLBfloat && dt.bits == 16) return BX_TC_BF16;
  if (dt.code == kDLInt && dt.bits == 32) return BX_TC_I32;
  if (dt.code == kDLInt && dt.bits == 64) return BX_TC_I64;
  return 0;
}

static size_t size_of(unsigned dtype) {
  return dtype == BX_TC_I64 ? 8 : dtype == BX_TC_BF16 ? 2 : 4;
}

/* "float32", "int32 or int64", ... */
static const char *dtypes_text(unsigned m) {
  switch (m) {
    case BX_TC_F32: return "float32";
    case BX_TC_BF16: return "bfloat16";
    case BX_TC_I32: return "int32";
    case BX_TC_I64: return "int64";
    case BX_TC_IDS: return "int32 or int64";
    case BX_TC_F32 | BX_TC_BF16: return "float32 or bfloat16";
    default: return "another type";
  }
}

#define FAIL(st, ...) return bx_fail_at((st), -1, BX_NO_INDEX, index, __VA_ARGS__)

bx_tc_place bx_tc_place_of(const DLTensor *const *ts, size_t count) {
  bx_tc_place pl = {0, 0};
  size_t cuda = 0, managed = 0;
  for (size_t i = 0; i < count; i++) {
    if (!ts[i]) continue;
    int type = ts[i]->device.device_type;
    if (type == kDLCUDA) {
      if (!cuda++) pl.device = ts[i]->device.device_id;
    } else if (type == kDLCUDAManaged) {
      if (!cuda && !managed) pl.device = ts[i]->device.device_id;
      managed++;
    } else
      return pl; /* host memory (or another device): the host path's checks decide */
  }
  /* managed memory is host-readable: the device only where it can run */
  pl.cuda = cuda > 0 || (managed > 0 && bx_train_managed_on_device());
  return pl;
}

int bx_tc_on_device(const DLTensor *t) {
  return t->device.device_type == kDLCUDA ||
         (t->device.device_type == kDLCUDAManaged && bx_train_managed_on_device());
}

bx_status bx_tc_check(const char *fn, size_t index, const char *name, const DLTensor *t,
                      unsigned dtypes, int min_ndim, int max_ndim, const int64_t *want,
                      int writable, bx_tc_tensor *out) {
  return bx_tc_check_in(NULL, fn, index, name, t, dtypes, min_ndim, max_ndim, want, writable, out);
}

bx_status bx_tc_check_in(const bx_tc_place *pl, const char *fn, size_t index, const char *name,
                         const DLTensor *t, unsigned dtypes, int min_ndim, int max_ndim,
                         const int64_t *want, int writable, bx_tc_tensor *out) {
  out->name = name;
  out->index = index;
  out->data = NULL;
  out->ndim = 0;
  for (int d = 0; d < BX_TC_MAX_NDIM; d++) out->dim[d] = 1;
  out->rows = out->cols = out->n = 0;
  out->dtype = 0;
  out->elsize = 0;
  out->writable = writable;
  out->inplace = -1;
  if (!t) FAIL(BX_EINVAL, "%s: tensor %zu (%s) is NULL", fn, index, name);
  if (pl && pl->cuda) {
    int managed = t->device.device_type == kDLCUDAManaged; /* any device reads it */
    if (!managed && (t->device.device_type != kDLCUDA || t->device.device_id != pl->device))
      FAIL(BX_EDEVICE, "%s: tensor %zu (%s) is on device type %d id %d, not CUDA device %d like "
           "the call's other tensors", fn, index, name, (int)t->device.device_type,
           (int)t->device.device_id, pl->device);
  } else if (!host_readable(t->device.device_type))
    FAIL(BX_EDEVICE, "%s: tensor %zu (%s) is on device type %d, not host memory", fn, index, name,
         (int)t->device.device_type);
  unsigned dt = dtype_of(t->dtype);
  if (!(dt & dtypes))
    FAIL(BX_EDTYPE, "%s: tensor %zu (%s) has dtype code %u bits %u lanes %u; want %s", fn, index,
         name, (unsigned)t->dtype.code, (unsigned)t->dtype.bits, (unsigned)t->dtype.lanes,
         dtypes_text(dtypes));
  if (t->ndim < min_ndim || t->ndim > max_ndim || t->ndim > BX_TC_MAX_NDIM) {
    if (min_ndim == max_ndim)
      FAIL(BX_EINVAL, "%s: tensor %zu (%s) has %d dimensions, want %d", fn, index, name, t->ndim,
           min_ndim);
    FAIL(BX_EINVAL, "%s: tensor %zu (%s) has %d dimensions, want %d to %d", fn, index, name,
         t->ndim, min_ndim, max_ndim);
  }
  if (t->ndim > 0 && !t->shape)
    FAIL(BX_EINVAL, "%s: tensor %zu (%s) has no shape", fn, index, name);
  size_t n = 1;
  for (int d = 0; d < t->ndim; d++) {
    int64_t s = t->shape[d];
    if (s < 0)
      FAIL(BX_EINVAL, "%s: tensor %zu (%s): shape[%d] = %lld is negative", fn, index, name, d,
           (long long)s);
    if (want && want[d] >= 0 && s != want[d])
      FAIL(BX_EINVAL, "%s: tensor %zu (%s): shape[%d] = %lld, want %lld", fn, index, name, d,
           (long long)s, (long long)want[d]);
    if (s && n > (SIZE_MAX / 16) / (size_t)s)
      FAIL(BX_EINVAL, "%s: tensor %zu (%s): too many elements", fn, index, name);
    n *= (size_t)s;
  }
  if (t->strides) {
    int64_t w = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (t->shape[d] != 1 && t->strides[d] != w)
        FAIL(BX_ELAYOUT,
             "%s: tensor %zu (%s) is not row-major contiguous: strides[%d] = %lld, want %lld", fn,
             index, name, d, (long long)t->strides[d], (long long)w);
      w *= t->shape[d];
    }
  }
  size_t es = size_of(dt);
  if (n && !t->data)
    FAIL(BX_EINVAL, "%s: tensor %zu (%s): data is NULL with %zu elements", fn, index, name, n);
  char *p = n ? (char *)t->data + t->byte_offset : NULL;
  if ((uintptr_t)p % es)
    FAIL(BX_ELAYOUT, "%s: tensor %zu (%s): data + byte_offset is not aligned to %zu bytes", fn,
         index, name, es);
  out->data = p;
  out->ndim = t->ndim;
  for (int d = 0; d < t->ndim; d++) out->dim[d] = t->shape[d];
  out->n = n;
  out->dtype = dt;
  out->elsize = es;
  out->cols = t->ndim ? (size_t)t->shape[t->ndim - 1] : 1;
  size_t r = 1; /* rows = product of the leading dimensions (also when cols == 0) */
  for (int d = 0; d + 1 < t->ndim; d++) r *= (size_t)t->shape[d];
  out->rows = r;
  return BX_OK;
}

#undef FAIL

bx_status bx_tc_shape(const char *fn, const bx_tc_tensor *a, size_t rows, size_t cols,
                      const char *what) {
  if (a->rows == rows && a->cols == cols) return BX_OK;
  return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, a->index,
                    "%s: tensor %zu (%s) is [%zu, %zu] (as rows, columns), want %s [%zu, %zu]", fn,
                    a->index, a->name, a->rows, a->cols, what, rows, cols);
}

bx_status bx_tc_overlap(const char *fn, const bx_tc_tensor *const *ts, size_t count) {
  for (size_t o = 0; o < count; o++) {
    const bx_tc_tensor *a = ts[o];
    if (!a || !a->writable || a->n == 0) continue;
    uintptr_t lo = (uintptr_t)a->data, hi = lo + a->n * a->elsize;
    for (size_t i = 0; i < count; i++) {
      const bx_tc_tensor *b = ts[i];
      if (i == o || !b || b->n == 0) continue;
      uintptr_t lo2 = (uintptr_t)b->data, hi2 = lo2 + b->n * b->elsize;
      if (!(lo < hi2 && lo2 < hi)) continue;
      int may = a->inplace >= 0 && (size_t)a->inplace == b->index;
      if (may && lo == lo2 && a->n == b->n && a->elsize == b->elsize) continue;
      return bx_fail_at(BX_ELAYOUT, -1, BX_NO_INDEX, a->index,
                        "%s: tensor %zu (%s) overlaps tensor %zu (%s)%s", fn, a->index, a->name,
                        b->index, b->name, may ? " (only exactly in place is allowed)" : "");
    }
  }
  return BX_OK;
}

bx_status bx_tc_enter(bx_call *call, const char *fn, const void *opts, size_t size,
                      size_t threads_at, const char *type, const char *macro, int *threads) {
  *threads = 0;
  if (opts) {
    size_t got;
    memcpy(&got, opts, sizeof got);
    bx_status st = bx_check_struct_size(fn, "opts->struct_size", got, size, type, macro);
    if (st != BX_OK) return st;
    memcpy(threads, (const char *)opts + threads_at, sizeof *threads);
    if (*threads < 0) return bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, *threads);
  }
  return bx_call_enter(call, fn);
}

int bx_tc_threads(int num_threads, size_t pieces) {
  int t = num_threads > 0 ? num_threads : bx_default_threads();
  if (t > BX_MAX_THREADS) t = BX_MAX_THREADS;
  if (pieces < 1) pieces = 1;
  if ((size_t)t > pieces) t = (int)pieces;
  return t < 1 ? 1 : t;
}

size_t bx_tc_piece_rows(size_t cols) {
  size_t r = cols ? ((size_t)1 << 14) / cols : ((size_t)1 << 14);
  return r ? r : 1;
}

void bx_tc_run(int num_threads, size_t pieces, void (*fn)(void *ctx, size_t piece, int worker),
               void *ctx) {
  if (pieces) bx_parallel_run(bx_tc_threads(num_threads, pieces), pieces, fn, ctx);
}

bx_status bx_tc_to_host(const char *fn, const bx_tc_place *pl, const bx_train_device *dev,
                        const bx_tc_tensor *const *ts, bx_tc_tensor *hosts, size_t count,
                        size_t extra_bytes, void **extra) {
  size_t bytes = 0;
  for (size_t i = 0; i < count; i++)
    if (ts[i] && ts[i]->n) bytes += (ts[i]->n * ts[i]->elsize + 15) & ~(size_t)15;
  size_t at = bytes;
  bytes += extra_bytes;
  char *ws = bx_workspace(bytes ? bytes : 1);
  if (!ws) return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes on the host for the device "
                          "data's checks", fn, bytes);
  size_t off = 0;
  for (size_t i = 0; i < count; i++) {
    if (!ts[i]) continue;
    hosts[i] = *ts[i];
    if (!ts[i]->n) continue;
    size_t b = ts[i]->n * ts[i]->elsize;
    bx_status st = dev->to_host(fn, pl->device, ws + off, ts[i]->data, b);
    if (st != BX_OK) return st;
    hosts[i].data = ws + off;
    off += (b + 15) & ~(size_t)15;
  }
  if (extra) *extra = ws + at;
  return BX_OK;
}
