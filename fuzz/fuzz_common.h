/*
 * fuzz_common.h — shared by the libFuzzer harnesses in fuzz/: the tests'
 * MPFR reference (compiled into each harness, since `make fuzz` builds one
 * .c per binary), the ISAs this CPU can run, and a mismatch trap that
 * prints what differed before crashing so the input can become a test.
 */
#ifndef BX_FUZZ_COMMON_H
#define BX_FUZZ_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact.h"
#include "kernels.h"

#include "../tests/mpfr_ref.c" /* the exact reference, independent of src/ */

static const char *fz_isas[4];
static int fz_nisas = -1;

static inline void fz_init_isas(void) {
  static const char *all[4] = {"portable", "avx2", "avx512", "avx512-pf1"};
  if (fz_nisas >= 0) return;
  fz_nisas = 0;
  for (int i = 0; i < 4; i++)
    if (bx_force_isa(all[i]) == BX_OK) fz_isas[fz_nisas++] = all[i];
  bx_force_isa(NULL);
}

#define FZ_FAIL(...)                          \
  do {                                        \
    fprintf(stderr, "bitexact fuzz mismatch: "); \
    fprintf(stderr, __VA_ARGS__);             \
    fputc('\n', stderr);                      \
    __builtin_trap();                         \
  } while (0)

static inline void fz_same_d(double got, double want, const char *what, const char *isa) {
  if (memcmp(&got, &want, sizeof got) != 0)
    FZ_FAIL("%s (isa %s): got %a want %a", what, isa, got, want);
}

static inline void fz_same_f(float got, float want, const char *what, const char *isa) {
  if (memcmp(&got, &want, sizeof got) != 0)
    FZ_FAIL("%s (isa %s): got %a want %a", what, isa, (double)got, (double)want);
}

static const size_t fz_dt_size[4] = {2, 2, 4, 8};

static inline DLTensor fz_tensor(void *data, int dt, int64_t *shape, size_t n, size_t offset_elems) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = dt == 1 ? kDLBfloat : kDLFloat;
  t.dtype.bits = (uint8_t)(8 * fz_dt_size[dt]);
  t.dtype.lanes = 1;
  shape[0] = (int64_t)n;
  t.shape = shape;
  t.byte_offset = offset_elems * fz_dt_size[dt];
  return t;
}

#endif /* BX_FUZZ_COMMON_H */
