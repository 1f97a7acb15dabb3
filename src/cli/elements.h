/*
 * elements.h — element-wise comparison of two tensors of one dtype, for
 * `bitexact diff` (the rules are in the --help text, main.c).
 */
#ifndef BX_CLI_ELEMENTS_H
#define BX_CLI_ELEMENTS_H

#include <stdint.h>

#include "safetensors.h"

typedef struct elem_stats {
  uint64_t compared;      /* elements (bytes for packed dtypes) */
  uint64_t differ;        /* bit patterns differ */
  uint64_t first;         /* flat index of the first differing element */
  uint64_t max_ulp;       /* over differing elements with no NaN */
  double max_abs, max_rel;
  uint64_t nan_payload;   /* both NaN, other bits */
  uint64_t nan_mismatch;  /* one NaN, one number */
  uint64_t signed_zero;   /* +0 vs -0 */
  int has_ulp;            /* max_ulp / max_abs / max_rel are meaningful */
  int is_integer;         /* integer dtype: "ULP" is |a - b| */
  int by_bytes;           /* packed dtypes: compared byte by byte */
  double first_a, first_b;/* values at `first` (NaN for packed) */
  uint64_t first_bits_a, first_bits_b;
} elem_stats;

/* Compares t elements of dtype dt at a and b (same byte length). */
void elem_compare(st_dtype dt, const uint8_t *a, const uint8_t *b, uint64_t nbytes,
                  elem_stats *s);

/* The ULP distance of two values of the IEEE float dtype dt (F16, BF16,
 * F32, F64), as elem_compare counts it: 1 with *ulp set when both are
 * exactly representable in dt and not NaN, else 0. */
int elem_ulp_values(st_dtype dt, double a, double b, uint64_t *ulp);

#endif /* BX_CLI_ELEMENTS_H */
