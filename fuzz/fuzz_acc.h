/*
 * fuzz_acc.h — the accumulator harness body, instantiated for squares
 * (fuzz_sumsq.c) and absolute values (fuzz_sumabs.c).
 *
 * Input: byte 0 = dtype (bits 0-1: fp16, bf16, fp32, fp64), misalignment
 * in elements (bits 2-3), tiling 2^k (bits 4-6: the element data repeated
 * up to 128 times, to reach many blocks from a short input), split side
 * (bit 7); the rest is raw little-endian element data.
 *
 * Under every ISA: bx_acc_value / _sqrt / _valuef / _sqrtf and the NaN,
 * Inf and element counters must equal the MPFR reference bit for bit
 * (DESIGN §2: a counted NaN reads as NaN, else a counted Inf as +Inf; the
 * exact sum of the finite elements is read with the counters cleared); the
 * normalised words must be the same for every ISA; the tensor split in two
 * views, accumulated separately and its words summed by hand, must give
 * the whole's words. Any difference traps.
 */
#include "fuzz_common.h"

#define FZ_MAX_ELEMS (1u << 18)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  fz_init_isas();
  int dt = data[0] & 3, mis = (data[0] >> 2) & 3, rep_log = (data[0] >> 4) & 7;
  size_t es = fz_dt_size[dt], n0 = (size - 1) / es, rep = (size_t)1 << rep_log;
  if (n0 * rep > FZ_MAX_ELEMS) rep = 1;
  size_t n = n0 * rep;
  char *buf = aligned_alloc(64, ((n + 4) * es + 63) / 64 * 64);
  for (size_t r = 0; r < rep; r++) memcpy(buf + (mis + r * n0) * es, data + 1, n0 * es);

  /* the reference: the sum over one tile, times the number of tiles */
  ref_sum want;
  ref_sum_init(&want);
  (FZ_ABS ? ref_add_abs : ref_add_squares)(&want, dt, data + 1, n0);
  mpfr_mul_ui(want.sum, want.sum, (unsigned long)rep, MPFR_RNDN); /* exact: 4480 bits */
  want.nan_count *= (int64_t)rep;
  want.inf_count *= (int64_t)rep;
  want.count *= (int64_t)rep;
  double fv = ref_round_d(want.sum), fs = ref_sqrt_d(want.sum);
  float fvf = ref_round_f(want.sum), fsf = ref_sqrt_f(want.sum);
  if (ref_inexact_events) FZ_FAIL("the reference lost exactness");
  int special = want.nan_count > 0 || want.inf_count > 0;
  double sd = want.nan_count > 0 ? NAN : INFINITY;
  double wv = special ? sd : fv, ws = special ? sd : fs;
  float wvf = special ? (float)sd : fvf, wsf = special ? (float)sd : fsf;

  bx_acc first;
  int64_t shape[3];
  for (int i = 0; i < fz_nisas; i++) {
    bx_force_isa(fz_isas[i]);
    bx_acc acc;
    bx_acc_init(&acc);
    DLTensor t = fz_tensor(buf, dt, shape, n, (size_t)mis);
    bx_status st = FZ_ABS ? bx_acc_add_abs(&acc, &t) : bx_acc_add_squares(&acc, &t);
    if (st != BX_OK) FZ_FAIL("status %d (isa %s)", (int)st, fz_isas[i]);
    fz_same_d(bx_acc_value(&acc), wv, "value", fz_isas[i]);
    fz_same_d(bx_acc_sqrt(&acc), ws, "sqrt", fz_isas[i]);
    fz_same_f(bx_acc_valuef(&acc), wvf, "valuef", fz_isas[i]);
    fz_same_f(bx_acc_sqrtf(&acc), wsf, "sqrtf", fz_isas[i]);
    bx_acc fin = acc; /* the finite part, exactly */
    fin.nan_count = fin.inf_count = 0;
    fz_same_d(bx_acc_value(&fin), fv, "value of the finite elements", fz_isas[i]);
    fz_same_d(bx_acc_sqrt(&fin), fs, "sqrt of the finite elements", fz_isas[i]);
    fz_same_f(bx_acc_valuef(&fin), fvf, "valuef of the finite elements", fz_isas[i]);
    fz_same_f(bx_acc_sqrtf(&fin), fsf, "sqrtf of the finite elements", fz_isas[i]);
    if (acc.nan_count != want.nan_count || acc.inf_count != want.inf_count ||
        acc.count != want.count)
      FZ_FAIL("counters nan %lld/%lld inf %lld/%lld count %lld/%lld (isa %s)",
              (long long)acc.nan_count, (long long)want.nan_count, (long long)acc.inf_count,
              (long long)want.inf_count, (long long)acc.count, (long long)want.count, fz_isas[i]);
    for (int d = 0; d < BX_ACC_DIGITS - 1; d++)
      if (acc.digit[d] < 0 || acc.digit[d] >= (1ll << 32)) FZ_FAIL("digit %d not normalised", d);
    if (i == 0)
      first = acc;
    else if (memcmp(&acc, &first, sizeof acc) != 0)
      FZ_FAIL("words of isa %s differ from isa %s", fz_isas[i], fz_isas[0]);

    /* two views, two accumulators, words summed as MPI_SUM would */
    size_t k = n ? (size_t)(data[size - 1] * 2654435761u) % (n + 1) : 0;
    if (data[0] >> 7) k = n - k;
    bx_acc a, b;
    bx_acc_init(&a);
    bx_acc_init(&b);
    DLTensor ta = fz_tensor(buf, dt, shape + 1, k, (size_t)mis);
    DLTensor tb = fz_tensor(buf, dt, shape + 2, n - k, (size_t)mis + k);
    if ((FZ_ABS ? bx_acc_add_abs(&b, &tb) : bx_acc_add_squares(&b, &tb)) != BX_OK ||
        (FZ_ABS ? bx_acc_add_abs(&a, &ta) : bx_acc_add_squares(&a, &ta)) != BX_OK)
      FZ_FAIL("split views refused");
    int64_t w[BX_ACC_WORDS];
    for (int j = 0; j < BX_ACC_WORDS; j++) w[j] = ((int64_t *)&b)[j] + ((int64_t *)&a)[j];
    bx_acc sum;
    memcpy(&sum, w, sizeof sum);
    if (bx_acc_check(&sum) != BX_OK) FZ_FAIL("word sum fails bx_acc_check");
    fz_same_d(bx_acc_value(&sum), wv, "value of the word sum", fz_isas[i]);
    bx_acc_normalize(&sum);
    if (memcmp(sum.digit, acc.digit, sizeof sum.digit) != 0 || sum.count != acc.count ||
        sum.nan_count != acc.nan_count || sum.inf_count != acc.inf_count)
      FZ_FAIL("split at %zu of %zu: words differ from the whole (isa %s)", k, n, fz_isas[i]);
  }
  bx_force_isa(NULL);
  ref_sum_clear(&want);
  free(buf);
  return 0;
}
