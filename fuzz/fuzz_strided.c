/*
 * fuzz_strided.c — bx_total_norm and bx_scale on strided views (any
 * strides: gaps, permuted, negative, zero, overlapping) against the dense
 * copy of the view's logical elements, made here by walking its indices;
 * norms under every ISA.
 *
 * Input: byte 0 = dtype (bits 0-1), p (bits 2-5, an index into P below,
 * mod 10), threads - 1 (bits 6-7); byte 1 = ndim - 1 (bits 0-1), scale
 * mode (bit 2: torch / exact-once); bytes 2-9 = per dim (4 at most) a size
 * byte (0..15) and a stride byte (int8, elements); the rest = raw element
 * data of the buffer (zero-padded).
 *
 * Checked: the view's norm has the copy's bits (every ISA); bx_scale
 * refuses (BX_ELAYOUT, buffer unchanged) exactly when two logical
 * elements share an address (found here by sorting the offsets), else
 * gives every logical element the scaled copy's bits and leaves every
 * other byte of the buffer as it was.
 */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const double P[10] = {2, 1, INFINITY, -INFINITY, 0, 3, 0.5, -1, -0.5, -2};

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 10) return 0;
  fz_init_isas();
  int dt = data[0] & 3, threads = 1 + (data[0] >> 6), ndim = 1 + (data[1] & 3);
  double p = P[((data[0] >> 2) & 15) % 10];
  bx_scale_mode mode = (data[1] >> 2) & 1 ? BX_SCALE_EXACT : BX_SCALE_TORCH;
  int64_t sh[4], st[4], back = 0, reach = 0;
  size_t n = 1, es = fz_dt_size[dt];
  for (int d = 0; d < ndim; d++) {
    sh[d] = data[2 + 2 * d] & 15;
    st[d] = (int8_t)data[3 + 2 * d];
    n *= (size_t)sh[d];
    if (sh[d] > 0) {
      if (st[d] < 0) back += -st[d] * (sh[d] - 1);
      else reach += st[d] * (sh[d] - 1);
    }
  }
  size_t len = (size_t)(back + reach) + 1, bytes = (len + 2) * es;
  char *buf = calloc(1, bytes), *orig = malloc(bytes);
  size_t avail = size - 10 < bytes ? size - 10 : bytes;
  memcpy(buf, data + 10, avail);
  memcpy(orig, buf, bytes);
  size_t origin = 1 + (size_t)back; /* element index of (0, ..., 0) */
  /* the dense copy and the offsets, walking the indices (last fastest) */
  char *dense = malloc(n ? n * es : 1);
  int64_t *offs = malloc((n ? n : 1) * sizeof *offs);
  int64_t idx[4] = {0, 0, 0, 0}, off = 0;
  for (size_t i = 0; i < n; i++) {
    offs[i] = (int64_t)origin + off;
    memcpy(dense + i * es, buf + (size_t)offs[i] * es, es);
    for (int d = ndim - 1; d >= 0; d--) {
      off += st[d];
      if (++idx[d] < sh[d]) break;
      off -= st[d] * sh[d];
      idx[d] = 0;
    }
  }
  int64_t shv[4], one = 1;
  DLTensor view = fz_tensor(buf, dt, &one, 1, 0), copy;
  memcpy(shv, sh, sizeof shv);
  view.ndim = ndim;
  view.shape = shv;
  view.strides = st;
  view.byte_offset = origin * es;
  int64_t nd = (int64_t)n;
  copy = fz_tensor(dense, dt, &nd, n, 0);
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.norm_type = p;
  o.num_threads = threads;
  for (int k = 0; k < fz_nisas; k++) {
    bx_force_isa(fz_isas[k]);
    bx_group gv = {&view, 1}, gc = {&copy, 1};
    double a = -1, b = -2;
    if (bx_total_norm(&gv, 1, NULL, &o, &a, NULL) != BX_OK)
      FZ_FAIL("norm of the view refused: %s", bx_last_error());
    if (bx_total_norm(&gc, 1, NULL, &o, &b, NULL) != BX_OK)
      FZ_FAIL("norm of the copy refused: %s", bx_last_error());
    fz_same_d(a, b, "norm of the view vs its dense copy", fz_isas[k]);
  }
  bx_force_isa(NULL);
  /* scaling: refused exactly when two logical elements share an address */
  qsort(offs, n, sizeof *offs, cmp_i64);
  int overlap = 0;
  for (size_t i = 1; i < n; i++) overlap |= offs[i] == offs[i - 1];
  bx_scale_opts so = BX_SCALE_OPTS_DEFAULT;
  so.mode = mode;
  so.num_threads = threads;
  bx_status s = bx_scale(&view, 1, 0.375, &so);
  if (overlap) {
    if (s != BX_ELAYOUT) FZ_FAIL("overlapping view scaled (status %d)", (int)s);
    if (memcmp(buf, orig, bytes) != 0) FZ_FAIL("refused scale modified the buffer");
  } else {
    if (s != BX_OK) FZ_FAIL("disjoint view refused: %s", bx_last_error());
    if (bx_scale(&copy, 1, 0.375, &so) != BX_OK) FZ_FAIL("copy refused");
    /* each logical element has the scaled copy's bits (walk again) */
    memset(idx, 0, sizeof idx);
    off = 0;
    char *mark = calloc(len + 2, 1);
    for (size_t i = 0; i < n; i++) {
      size_t at = (size_t)((int64_t)origin + off);
      if (memcmp(buf + at * es, dense + i * es, es) != 0) FZ_FAIL("element %zu differs", i);
      mark[at] = 1;
      for (int d = ndim - 1; d >= 0; d--) {
        off += st[d];
        if (++idx[d] < sh[d]) break;
        off -= st[d] * sh[d];
        idx[d] = 0;
      }
    }
    for (size_t j = 0; j < len + 2; j++)
      if (!mark[j] && memcmp(buf + j * es, orig + j * es, es) != 0)
        FZ_FAIL("byte of element %zu outside the view changed", j);
    free(mark);
  }
  free(buf);
  free(orig);
  free(dense);
  free(offs);
  return 0;
}
