/*
 * tensor.c — validating a borrowed DLTensor: the dense span of memory its
 * elements occupy (bx_tensor_span: any permutation of a dense layout, e.g.
 * a transposed gradient, is one contiguous span; layouts with gaps or
 * aliasing are refused), the canonical strided layout of any host tensor
 * (bx_tensor_layout and its cursor: norms and scaling), and the overlap
 * check of tensors written in place.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

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

/* The checks every tensor passes whatever its strides: dtype, device,
 * shape, data. *n: its elements (0: nothing more to check). */
static bx_status check_common(const DLTensor *t, const char *what, int cuda, bx_dtype *dtype,
                              uint64_t *n_out) {
  if (!t) return bx_fail(BX_EINVAL, "%s: DLTensor pointer is NULL", what);
  if (t->dtype.lanes != 1)
    return bx_fail(BX_EDTYPE, "%s: dtype has %u lanes; only lanes == 1 is supported",
                   what, (unsigned)t->dtype.lanes);
  if (bx_dtype_from_dl(t->dtype, dtype) != BX_OK)
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
  uint64_t n = 1;
  int zero = 0;
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] < 0)
      return bx_fail(BX_EINVAL, "%s: shape[%d] = %lld is negative", what, i,
                     (long long)t->shape[i]);
    if (t->shape[i] == 0) zero = 1;
  }
  *n_out = 0;
  if (zero) return BX_OK;
  for (int i = 0; i < t->ndim; i++) {
    uint64_t s = (uint64_t)t->shape[i];
    if (n > (UINT64_MAX / 8) / s)
      return bx_fail(BX_EINVAL, "%s: shape overflows the address space", what);
    n *= s;
  }
  if (!t->data) return bx_fail(BX_EINVAL, "%s: data is NULL with %llu elements", what,
                               (unsigned long long)n);
  uintptr_t p = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
  if (p % bx_dtype_size(*dtype))
    return bx_fail(BX_ELAYOUT, "%s: data + byte_offset is not aligned to %zu bytes",
                   what, bx_dtype_size(*dtype));
  *n_out = n;
  return BX_OK;
}

static bx_status check_span(const DLTensor *t, const char *what, int cuda, bx_span *out) {
  uint64_t n;
  bx_status status = check_common(t, what, cuda, &out->dtype, &n);
  if (status != BX_OK) return status;
  if (n == 0) {
    out->data = NULL;
    out->n = 0;
    return BX_OK;
  }
  const char *hint = cuda ? "non-dense CUDA tensors are not supported: pass .contiguous()"
                          : "pass a contiguous tensor";
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
                       "reverse elements); %s",
                       what, i, (long long)t->strides[i], hint);
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
                       "dense layout needs %lld); %s",
                       what, (long long)st[j], (long long)expect, hint);
      expect *= sh[j];
    }
  }
  out->data = (void *)((uintptr_t)t->data + (uintptr_t)t->byte_offset);
  out->n = (size_t)n;
  return BX_OK;
}

/* ---- strided layouts (host) ------------------------------------------------ */

#define LAYOUT_LIMIT ((uint64_t)1 << 60) /* bytes a layout may reach */

static bx_status check_layout(const DLTensor *t, const char *what, bx_layout *l) {
  uint64_t n;
  bx_status st = check_common(t, what, 0, &l->dtype, &n);
  if (st != BX_OK) return st;
  size_t es = bx_dtype_size(l->dtype);
  l->n = (size_t)n;
  l->inner = 1;
  l->ndims = 0;
  l->self = BX_DISJOINT;
  l->extent = (size_t)n;
  if (n == 0) {
    l->base = NULL;
    l->extent = 0;
    return BX_OK;
  }
  uintptr_t p = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
  l->base = (char *)p;
  if (!t->strides || n == 1) { /* row-major, or one element */
    l->inner = (size_t)n;
    return BX_OK;
  }
  /* the dims of size > 1, strides flipped to >= 0, sorted (stride 0 last) */
  int64_t *sh = l->shape, *sd = l->stride;
  uint64_t reach = 0, back = 0; /* elements above / below p */
  int k = 0;
  for (int i = 0; i < t->ndim; i++) {
    int64_t size = t->shape[i], s = t->strides[i];
    if (size == 1) continue;
    if (k == BX_LAYOUT_DIMS) return bx_fail(BX_ELAYOUT, "%s: more than 64 non-trivial dims", what);
    if (s == INT64_MIN) return bx_fail(BX_ELAYOUT, "%s: stride[%d] overflows", what, i);
    uint64_t a = (uint64_t)(s < 0 ? -s : s), span = (uint64_t)(size - 1);
    if (a > LAYOUT_LIMIT / es / span)
      return bx_fail(BX_ELAYOUT, "%s: stride[%d] = %lld reaches past the address space", what,
                     i, (long long)s);
    if (s < 0) back += a * span;
    else reach += a * span;
    if (back + reach > LAYOUT_LIMIT / es)
      return bx_fail(BX_ELAYOUT, "%s: the strides reach past the address space", what);
    int64_t key = s == 0 ? INT64_MAX : (int64_t)a;
    int j = k++;
    while (j > 0 && (sd[j - 1] == 0 ? INT64_MAX : sd[j - 1]) > key) {
      sd[j] = sd[j - 1];
      sh[j] = sh[j - 1];
      j--;
    }
    sd[j] = (int64_t)a;
    sh[j] = size;
  }
  if (back * es > p)
    return bx_fail(BX_ELAYOUT, "%s: negative strides reach below address 0", what);
  l->base = (char *)(p - back * es);
  l->extent = (size_t)(back + reach + 1);
  /* merge neighbours that continue each other (stride-0 dims into one) */
  int m = 0;
  for (int j = 1; j < k; j++) {
    if (sd[j] == sd[m] * sh[m] || (sd[j] == 0 && sd[m] == 0)) {
      sh[m] *= sh[j];
    } else {
      m++;
      sd[m] = sd[j];
      sh[m] = sh[j];
    }
  }
  k = m + 1;
  int first = 0;
  if (sd[0] == 1) { /* the inner run */
    l->inner = (size_t)sh[0];
    first = 1;
  }
  /* disjoint when every stride reaches past all the dims below it (a
   * sufficient condition; the others are decided exactly when written) */
  uint64_t below = l->inner;
  for (int j = first; j < k; j++) {
    if (sd[j] == 0) l->self = BX_OVERLAP_STRIDE0;
    else if ((uint64_t)sd[j] < below && l->self == BX_DISJOINT) l->self = BX_OVERLAP_MAYBE;
    below += (uint64_t)sd[j] * (uint64_t)(sh[j] - 1);
  }
  l->ndims = k - first;
  for (int j = 0; j < l->ndims; j++) {
    sd[j] = sd[j + first];
    sh[j] = sh[j + first];
  }
  return BX_OK;
}

bx_status bx_tensor_layout(const DLTensor *t, const char *fn, size_t group, size_t index,
                           bx_layout *out) {
  bx_status st = check_layout(t, "", out);
  if (st == BX_OK) return BX_OK;
  char what[96]; /* failure path only: again, naming the tensor */
  if (group == BX_NO_GROUP) snprintf(what, sizeof what, "%s: tensor %zu", fn, index);
  else snprintf(what, sizeof what, "%s: group %zu, tensor %zu", fn, group, index);
  st = check_layout(t, what, out);
  bx_error_set_index(group, index);
  return st;
}

void bx_layout_seek(bx_layout_cursor *c, const bx_layout *l, size_t first) {
  c->l = l;
  c->r = first % l->inner;
  size_t q = first / l->inner;
  c->off = 0;
  for (int d = 0; d < l->ndims; d++) {
    c->idx[d] = (int64_t)(q % (size_t)l->shape[d]);
    q /= (size_t)l->shape[d];
    c->off += c->idx[d] * l->stride[d];
  }
}

/* The next run: the odometer over the outer dims. */
static inline void next_run(bx_layout_cursor *c) {
  const bx_layout *l = c->l;
  c->r = 0;
  for (int d = 0; d < l->ndims; d++) {
    c->off += l->stride[d];
    if (++c->idx[d] < l->shape[d]) return;
    c->off -= l->stride[d] * l->shape[d];
    c->idx[d] = 0;
  }
}

char *bx_layout_run(bx_layout_cursor *c, size_t max, size_t *len) {
  const bx_layout *l = c->l;
  size_t es = bx_dtype_size(l->dtype), k = l->inner - c->r;
  if (k > max) k = max;
  char *at = l->base + ((size_t)c->off + c->r) * es;
  c->r += k;
  if (c->r == l->inner) next_run(c);
  *len = k;
  return at;
}

#define COPY_STRIDED(T)                                                              \
  do {                                                                               \
    T *b = (T *)buf, *x = (T *)l->base;                                              \
    for (size_t i = 0; i < count;) {                                                 \
      int64_t s0 = l->stride[0], o = c->off, left = l->shape[0] - c->idx[0];         \
      size_t k = count - i < (size_t)left ? count - i : (size_t)left;                \
      if (to_tensor)                                                                 \
        for (size_t j = 0; j < k; j++, o += s0) x[o] = b[i + j];                     \
      else                                                                           \
        for (size_t j = 0; j < k; j++, o += s0) b[i + j] = x[o];                     \
      i += k;                                                                        \
      c->idx[0] += (int64_t)k;                                                       \
      c->off += s0 * (int64_t)k;                                                     \
      if (c->idx[0] == l->shape[0]) { /* the carry: dim 0 wraps, the others step */  \
        c->idx[0] = l->shape[0] - 1;                                                 \
        c->off -= s0;                                                                \
        next_run(c);                                                                 \
      }                                                                              \
    }                                                                                \
  } while (0)

void bx_layout_copy(bx_layout_cursor *c, size_t count, void *buf, int to_tensor) {
  const bx_layout *l = c->l;
  size_t es = bx_dtype_size(l->dtype);
  if (l->inner == 1 && l->ndims > 0) { /* single elements: a strided loop over dim 0 */
    if (es == 2) COPY_STRIDED(uint16_t);
    else if (es == 4) COPY_STRIDED(uint32_t);
    else COPY_STRIDED(uint64_t);
    return;
  }
  char *b = buf;
  while (count > 0) {
    size_t k;
    char *at = bx_layout_run(c, count, &k);
    if (to_tensor) memcpy(at, b, k * es);
    else memcpy(b, at, k * es);
    b += k * es;
    count -= k;
  }
}
