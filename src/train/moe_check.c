/*
 * moe_check.c — the tensor checks of the MoE router and dispatch calls
 * (moe_internal.h). Nothing here writes a tensor.
 */
#include <string.h>

#include "error.h"
#include "moe_internal.h"
#include "pool.h"

static int host_readable(DLDeviceType dev) {
  return dev == kDLCPU || dev == kDLCUDAHost || dev == kDLCUDAManaged;
}

static unsigned dtype_of(DLDataType dt) {
  if (dt.lanes != 1) return 0;
  if (dt.code == kDLFloat && dt.bits == 32) return BX_MOE_F32;
  if (dt.code == kDLInt && dt.bits == 32) return BX_MOE_I32;
  if (dt.code == kDLInt && dt.bits == 64) return BX_MOE_I64;
  return 0;
}

static const char *dtypes_text(unsigned m) {
  switch (m) {
    case BX_MOE_F32: return "float32";
    case BX_MOE_I32: return "int32";
    case BX_MOE_I64: return "int64";
    case BX_MOE_IDS: return "int32 or int64";
    default: return "?";
  }
}

bx_status bx_moe_check(const char *fn, size_t index, const char *name, const DLTensor *t,
                       unsigned dtypes, int ndim, const int64_t *want, int writable,
                       bx_moe_tensor *out) {
#define FAIL(st, ...) return bx_fail_at(st, -1, BX_NO_INDEX, index, __VA_ARGS__)
  if (!t) FAIL(BX_EINVAL, "%s: tensor %zu (%s) is NULL", fn, index, name);
  if (!host_readable(t->device.device_type))
    FAIL(BX_EDEVICE, "%s: tensor %zu (%s) is on device type %d, not host memory", fn, index, name,
         (int)t->device.device_type);
  unsigned dt = dtype_of(t->dtype);
  if (!(dt & dtypes))
    FAIL(BX_EDTYPE, "%s: tensor %zu (%s) has dtype code %u bits %u lanes %u; want %s", fn, index,
         name, (unsigned)t->dtype.code, (unsigned)t->dtype.bits, (unsigned)t->dtype.lanes,
         dtypes_text(dtypes));
  if (t->ndim != ndim)
    FAIL(BX_EINVAL, "%s: tensor %zu (%s) has %d dimensions, want %d", fn, index, name, t->ndim,
         ndim);
  if (!t->shape) FAIL(BX_EINVAL, "%s: tensor %zu (%s) has no shape", fn, index, name);
  size_t n = 1;
  for (int d = 0; d < ndim; d++) {
    int64_t s = t->shape[d];
    if (s < 0)
      FAIL(BX_EINVAL, "%s: tensor %zu (%s): shape[%d] = %lld is negative", fn, index, name, d,
           (long long)s);
    if (want && want[d] >= 0 && s != want[d])
      FAIL(BX_EINVAL, "%s: tensor %zu (%s): shape[%d] = %lld, want %lld", fn, index, name, d,
           (long long)s, (long long)want[d]);
    if (s && n > ((size_t)1 << 60) / (size_t)s)
      FAIL(BX_EINVAL, "%s: tensor %zu (%s): too many elements", fn, index, name);
    n *= (size_t)s;
  }
  if (t->strides) {
    int64_t w = 1;
    for (int d = ndim - 1; d >= 0; d--) {
      if (t->shape[d] != 1 && t->strides[d] != w)
        FAIL(BX_ELAYOUT,
             "%s: tensor %zu (%s) is not row-major contiguous: strides[%d] = %lld, want %lld", fn,
             index, name, d, (long long)t->strides[d], (long long)w);
      w *= t->shape[d];
    }
  }
  size_t es = dt == BX_MOE_I64 ? 8 : 4;
  if (n && !t->data) FAIL(BX_EINVAL, "%s: tensor %zu (%s): data is NULL", fn, index, name);
  char *p = n ? (char *)t->data + t->byte_offset : NULL;
  if ((uintptr_t)p % es)
    FAIL(BX_ELAYOUT, "%s: tensor %zu (%s): data + byte_offset is not aligned to %zu bytes", fn,
         index, name, es);
#undef FAIL
  out->name = name;
  out->index = index;
  out->data = p;
  out->dim[0] = ndim >= 1 ? t->shape[0] : 1;
  out->dim[1] = ndim >= 2 ? t->shape[1] : 1;
  out->n = n;
  out->dtype = dt;
  out->writable = writable;
  return BX_OK;
}

static size_t bytes_of(const bx_moe_tensor *t) { return t->n * (t->dtype == BX_MOE_I64 ? 8 : 4); }

bx_status bx_moe_check_overlap(const char *fn, const bx_moe_tensor *const *ts, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (!ts[i] || !ts[i]->writable || !ts[i]->n) continue;
    uintptr_t a0 = (uintptr_t)ts[i]->data, a1 = a0 + bytes_of(ts[i]);
    for (size_t j = 0; j < n; j++) {
      if (j == i || !ts[j] || !ts[j]->n) continue;
      uintptr_t b0 = (uintptr_t)ts[j]->data, b1 = b0 + bytes_of(ts[j]);
      if (a0 < b1 && b0 < a1)
        return bx_fail_at(BX_ELAYOUT, -1, BX_NO_INDEX, ts[i]->index,
                          "%s: tensor %zu (%s) overlaps tensor %zu (%s)", fn, ts[i]->index,
                          ts[i]->name, ts[j]->index, ts[j]->name);
    }
  }
  return BX_OK;
}

bx_status bx_moe_check_plan(const char *fn, const bx_moe_tensor *row_map,
                            const bx_moe_tensor *pos) {
  int64_t T = pos->dim[0], k = pos->dim[1], R = row_map->dim[0];
  if (row_map->dim[1] != 2)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, row_map->index,
                      "%s: tensor %zu (row_map): shape[1] = %lld, want 2", fn, row_map->index,
                      (long long)row_map->dim[1]);
  if (R != T * k)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, row_map->index,
                      "%s: tensor %zu (row_map) has %lld rows, want T*k = %lld", fn,
                      row_map->index, (long long)R, (long long)(T * k));
  const int64_t *rm = bx_moe_i64(row_map), *p = bx_moe_i64(pos);
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < k; j++) {
      int64_t r = p[t * k + j];
      if (r < 0 || r >= R || rm[2 * r] != t || rm[2 * r + 1] != j)
        return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, pos->index,
                          "%s: tensor %zu (pos): pos[%lld][%lld] = %lld is not the row of "
                          "(%lld, %lld) in row_map (not a dispatch plan)",
                          fn, pos->index, (long long)t, (long long)j, (long long)r, (long long)t,
                          (long long)j);
    }
  return BX_OK;
}

int bx_moe_threads(int num_threads, size_t npieces) {
  int t = num_threads > 0 ? num_threads : bx_default_threads();
  if (npieces < 1) npieces = 1;
  if ((size_t)t > npieces) t = (int)npieces;
  if (t < 1) t = 1;
  return t;
}

/* ---- ids of a token: in range, distinct ------------------------------------ */

bx_status bx_moe_check_ids(const char *fn, const bx_moe_tensor *ids, int64_t E,
                           unsigned char *seen) {
  int64_t T = ids->dim[0], k = ids->dim[1];
  bx_status st = BX_OK;
  for (int64_t t = 0; t < T && st == BX_OK; t++) {
    for (int64_t a = 0; a < k; a++) {
      int64_t e = bx_moe_id(ids, (size_t)(t * k + a));
      if (e < 0 || e >= E) {
        st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, ids->index,
                        "%s: tensor %zu (%s): token %lld slot %lld: expert id %lld is outside "
                        "[0, %lld)",
                        fn, ids->index, ids->name, (long long)t, (long long)a, (long long)e,
                        (long long)E);
        k = a; /* clear what was marked */
        break;
      }
      if (seen[e]) {
        st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, ids->index,
                        "%s: tensor %zu (%s): token %lld slot %lld: expert %lld chosen twice", fn,
                        ids->index, ids->name, (long long)t, (long long)a, (long long)e);
        k = a;
        break;
      }
      seen[e] = 1;
    }
    for (int64_t a = 0; a < k; a++) seen[bx_moe_id(ids, (size_t)(t * k + a))] = 0;
  }
  return st;
}
