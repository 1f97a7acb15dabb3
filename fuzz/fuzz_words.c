/*
 * fuzz_words.c — the final rounding: bx_acc_value / _valuef / _sqrt /
 * _sqrtf, bx_acc_norm into every format, bx_acc_normalize / bx_acc_compare on accumulator words as an
 * all-reduce delivers them (un-normalised, non-negative), against the exact
 * value of the words as the header defines it (digit i weighs
 * 2^(32 i + BX_ACC_LSB_EXP)).
 *
 * Input: byte 0 = index of the first digit set (mod BX_ACC_DIGITS - 1);
 * then 8 bytes per digit, masked to [0, 2^63) (a sum of up to 2^31
 * normalised digits fits in 2^63); the top digit is kept below 2^40.
 */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  bx_acc acc;
  bx_acc_init(&acc);
  int d = data[0] % (BX_ACC_DIGITS - 1);
  for (size_t at = 1; at + 8 <= size && d < BX_ACC_DIGITS; at += 8, d++) {
    uint64_t w;
    memcpy(&w, data + at, 8);
    w &= 0x7FFFFFFFFFFFFFFFull;
    if (d == BX_ACC_DIGITS - 1) w &= (1ull << 40) - 1;
    /* shorter words more often: shift right by the low byte's top bits */
    w >>= (data[at] >> 2) & 63;
    acc.digit[d] = (int64_t)w;
  }
  mpfr_t exact;
  mpfr_init2(exact, REF_SUM_PREC + 128);
  ref_acc_words_value(exact, acc.digit, BX_ACC_DIGITS, BX_ACC_LSB_EXP);
  if (ref_inexact_events) FZ_FAIL("the reference lost exactness");
  double wv = ref_round_d(exact), ws = ref_sqrt_d(exact);
  float wvf = ref_round_f(exact), wsf = ref_sqrt_f(exact);
  fz_same_d(bx_acc_value(&acc), wv, "value", "-");
  fz_same_d(bx_acc_sqrt(&acc), ws, "sqrt", "-");
  fz_same_f(bx_acc_valuef(&acc), wvf, "valuef", "-");
  fz_same_f(bx_acc_sqrtf(&acc), wsf, "sqrtf", "-");
  /* bx_acc_norm: rounded once into every format */
  for (int dt = 0; dt < REF_NDT; dt++) {
    DLDataType t = {dt == REF_BF16 ? kDLBfloat : kDLFloat,
                    (uint8_t)(dt == REF_F64 ? 64 : dt == REF_F32 ? 32 : 16), 1};
    for (int p = 1; p <= 2; p++) {
      uint64_t got = 0;
      if (bx_acc_norm(&acc, (double)p, t, &got) != BX_OK) FZ_FAIL("bx_acc_norm refused");
      uint64_t want = ref_encode(dt, p == 2 ? ref_sqrt_fmt(exact, REF_FMT[dt])
                                            : ref_round_fmt(exact, REF_FMT[dt]));
      if (got != want)
        FZ_FAIL("bx_acc_norm p=%d dtype %d: 0x%llx, want 0x%llx", p, dt,
                (unsigned long long)got, (unsigned long long)want);
    }
  }
  bx_acc norm = acc;
  bx_acc_normalize(&norm);
  for (int i = 0; i < BX_ACC_DIGITS - 1; i++)
    if (norm.digit[i] < 0 || norm.digit[i] >= (1ll << 32)) FZ_FAIL("digit %d not normalised", i);
  fz_same_d(bx_acc_value(&norm), wv, "value after normalise", "-");
  fz_same_d(bx_acc_sqrt(&norm), ws, "sqrt after normalise", "-");
  if (bx_acc_compare(&norm, &acc) != 0) FZ_FAIL("normalise changed the sum");
  /* merging into a zero accumulator keeps the value */
  bx_acc zero;
  bx_acc_init(&zero);
  bx_acc_merge(&zero, &acc);
  fz_same_d(bx_acc_value(&zero), wv, "value after merge", "-");
  mpfr_clear(exact);
  return 0;
}
