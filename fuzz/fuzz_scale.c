/*
 * fuzz_scale.c — bx_scale in both modes against the references, every ISA.
 *
 * Input: byte 0 = dtype (bits 0-1), mode (bit 2: torch / exact-once),
 * threads - 1 (bits 3-4), misalignment in elements (bits 5-6); bytes 1-8 =
 * coef (raw fp64 bits: NaN must be refused with nothing written); the rest
 * = raw element data.
 *
 * Exact-once: the exact product rounded once to the dtype (MPFR).
 * Torch (header): c32 = (float)coef; fp32 fl32(g*c32); bf16/fp16
 * round_to_dtype(fl32((float)g*c32)); fp64 fl64(g*coef).
 * Bits must match (zero signs included); NaN results only as NaN.
 */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static double torch_ref(int dt, double g, double coef) {
  float c32 = (float)coef;
  switch (dt) {
  case 2:
    return (double)((float)g * c32);
  case 3:
    return g * coef;
  default:
    return ref_double_to(dt, (double)((float)g * c32)); /* g is exact in float */
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 9) return 0;
  fz_init_isas();
  int dt = data[0] & 3, exact = (data[0] >> 2) & 1, threads = 1 + ((data[0] >> 3) & 3);
  int mis = (data[0] >> 5) & 3;
  double coef;
  memcpy(&coef, data + 1, 8);
  size_t es = fz_dt_size[dt], n = (size - 9) / es;
  const uint8_t *elems = data + 9;
  size_t bytes = ((n + 4) * es + 63) / 64 * 64;
  char *buf = aligned_alloc(64, bytes), *orig = malloc(bytes);
  memset(buf, 0xA5, bytes);
  memcpy(buf + mis * es, elems, n * es);
  memcpy(orig, buf, bytes);
  double *want = malloc((n + 1) * sizeof *want);
  for (size_t i = 0; i < n; i++) {
    double g = ref_elem(dt, elems, i);
    want[i] = exact ? ref_mul_round(g, coef, dt) : torch_ref(dt, g, coef);
  }
  int64_t shape[1];
  for (int k = 0; k < fz_nisas; k++) {
    bx_force_isa(fz_isas[k]);
    memcpy(buf, orig, bytes);
    DLTensor t = fz_tensor(buf, dt, shape, n, (size_t)mis);
    bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
    o.mode = exact ? BX_SCALE_EXACT : BX_SCALE_TORCH;
    o.num_threads = threads;
    bx_status st = bx_scale(&t, 1, coef, &o);
    if (isnan(coef)) {
      if (st != BX_EINVAL) FZ_FAIL("NaN coef: status %d", (int)st);
      if (memcmp(buf, orig, bytes) != 0) FZ_FAIL("NaN coef: data modified");
      continue;
    }
    if (st != BX_OK) FZ_FAIL("status %d (isa %s)", (int)st, fz_isas[k]);
    for (size_t i = 0; i < n; i++) {
      double got = ref_elem(dt, buf + mis * es, i);
      int ok = isnan(want[i]) ? isnan(got) : memcmp(&got, &want[i], sizeof got) == 0;
      if (!ok)
        FZ_FAIL("%s mode, dtype %d, element %zu: g=%a coef=%a got %a want %a (isa %s)",
                exact ? "exact" : "torch", dt, i, ref_elem(dt, elems, i), coef, got, want[i],
                fz_isas[k]);
    }
    /* nothing outside the tensor was touched */
    if (memcmp(buf, orig, mis * es) != 0 ||
        memcmp(buf + (mis + n) * es, orig + (mis + n) * es, bytes - (mis + n) * es) != 0)
      FZ_FAIL("bytes outside the tensor modified (isa %s)", fz_isas[k]);
  }
  bx_force_isa(NULL);
  if (ref_inexact_events) FZ_FAIL("the reference lost exactness");
  free(want);
  free(orig);
  free(buf);
  return 0;
}
