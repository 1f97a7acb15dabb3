/*
 * acc.c — the fixed-point accumulator: exact deposits, normalisation,
 * merging, and the single correct rounding at the end (value, sqrt).
 *
 * Every decision here is integer arithmetic; the only floating-point
 * operations are exact ones (ldexp of an integer that fits, and an initial
 * sqrt estimate that integer steps then correct), so results do not depend
 * on the FPU's mode or the compiler's contraction choices.
 */
#include <math.h>
#include <string.h>

#include "acc_round.h"
#include "internal.h"

typedef bx_u128 u128;
typedef bx_i128 i128;

#define DIGITS BX_ACC_DIGITS
#define DIGIT_MASK 0xFFFFFFFFull

_Static_assert(sizeof(bx_acc) == BX_ACC_WORDS * sizeof(int64_t),
               "bx_acc must be exactly BX_ACC_WORDS int64 words");
_Static_assert(BX_ACC_LSB_EXP % 2 == 0, "sqrt needs an even LSB exponent");

void bx_acc_init(bx_acc *acc) {
  memset(acc, 0, sizeof *acc);
  acc->naccs = 1;
  acc->version = BX_ACC_VERSION_TAG;
}

/* Add the (signed, up to 127-bit) value u * 2^(32*d) into the digits. */
static void add_at_digit(bx_acc *acc, int d, i128 u) {
  while (u != 0 && d < DIGITS - 1) {
    acc->digit[d] += (int64_t)(u & (i128)DIGIT_MASK);
    u >>= 32; /* arithmetic: floor division, so the chunks stay in [0,2^32) */
    d++;
  }
  if (u != 0) acc->digit[DIGITS - 1] += (int64_t)u; /* top digit: the rest */
}

void bx_acc_deposit_i64(bx_acc *acc, int64_t v, int exp) {
  int pos = exp - BX_ACC_LSB_EXP;
  add_at_digit(acc, pos >> 5, (i128)v * ((i128)1 << (pos & 31)));
}

void bx_acc_deposit_u64(bx_acc *acc, uint64_t v, int exp) {
  int pos = exp - BX_ACC_LSB_EXP;
  add_at_digit(acc, pos >> 5, (i128)((u128)v << (pos & 31)));
}

void bx_acc_deposit_f64(bx_acc *acc, double v) {
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  int e = (int)((bits >> 52) & 0x7FF);
  int64_t m = (int64_t)(bits & ((1ull << 52) - 1));
  if (e == 0) {
    e = 1; /* subnormal: same scale as the smallest normal, no hidden bit */
  } else {
    m |= (int64_t)1 << 52;
  }
  if (m == 0) return;
  bx_acc_deposit_i64(acc, (bits >> 63) ? -m : m, e - 1075);
}

void bx_acc_deposit_sq_f64(bx_acc *acc, double x) {
  uint64_t bits;
  memcpy(&bits, &x, sizeof bits);
  int e = (int)((bits >> 52) & 0x7FF);
  uint64_t m = bits & ((1ull << 52) - 1);
  if (e == 0) {
    e = 1;
  } else {
    m |= 1ull << 52;
  }
  if (m == 0) return;
  u128 sq = (u128)m * m; /* < 2^106, exact */
  int exp = 2 * (e - 1075);
  bx_acc_deposit_u64(acc, (uint64_t)sq, exp);
  bx_acc_deposit_u64(acc, (uint64_t)(sq >> 64), exp + 64);
}

void bx_acc_normalize(bx_acc *acc) { bx_digits_normalize(acc->digit, acc->digit); }

void bx_acc_merge(bx_acc *into, const bx_acc *from) {
  i128 carry = 0;
  for (int i = 0; i < DIGITS - 1; i++) {
    carry += (i128)into->digit[i] + from->digit[i];
    into->digit[i] = (int64_t)(carry & (i128)DIGIT_MASK);
    carry >>= 32;
  }
  into->digit[DIGITS - 1] =
      (int64_t)(carry + into->digit[DIGITS - 1] + from->digit[DIGITS - 1]);
  into->nan_count += from->nan_count;
  into->inf_count += from->inf_count;
  into->count += from->count;
  into->naccs += from->naccs;
  into->version += from->version;
}

bx_status bx_acc_check(const bx_acc *acc) {
  if (!acc) return bx_fail(BX_EINVAL, "bx_acc_check: acc is NULL");
  if (acc->naccs < 1 || acc->version != BX_ACC_VERSION_TAG * acc->naccs)
    return bx_fail(BX_EMISMATCH,
                   "accumulator version word %lld does not match %lld "
                   "accumulator(s) of format %d (summed with a different "
                   "bitexact build, or not initialised)",
                   (long long)acc->version, (long long)acc->naccs,
                   BX_ACC_FORMAT);
  return BX_OK;
}

double bx_acc_value(const bx_acc *acc) {
  bx_mag m;
  int ovf;
  bx_mag_from_digits(acc->digit, &m);
  double v = bx_mag_round(&m, bx_fmt_f64(), &ovf);
  return m.negative ? -v : v;
}

float bx_acc_valuef(const bx_acc *acc) {
  bx_mag m;
  int ovf;
  bx_mag_from_digits(acc->digit, &m);
  float v = (float)bx_mag_round(&m, bx_fmt_f32(), &ovf); /* exact: already in fp32 */
  return m.negative ? -v : v;
}

double bx_acc_sqrt(const bx_acc *acc) {
  bx_mag m;
  int ovf;
  bx_mag_from_digits(acc->digit, &m);
  if (m.negative) return NAN;
  return bx_mag_sqrt(&m, bx_fmt_f64(), &ovf);
}

float bx_acc_sqrtf(const bx_acc *acc) {
  bx_mag m;
  int ovf;
  bx_mag_from_digits(acc->digit, &m);
  if (m.negative) return NAN;
  return (float)bx_mag_sqrt(&m, bx_fmt_f32(), &ovf);
}

int bx_acc_compare(const bx_acc *a, const bx_acc *b) {
  int64_t da[DIGITS], db[DIGITS];
  bx_digits_normalize(da, a->digit);
  bx_digits_normalize(db, b->digit);
  for (int i = DIGITS - 1; i >= 0; i--)
    if (da[i] != db[i]) return da[i] < db[i] ? -1 : 1;
  return 0;
}
