/*
 * acc.c — the fixed-point accumulator: exact deposits, normalisation,
 * merging, and the single correct rounding at the end (value, sqrt).
 *
 * Every decision here is integer arithmetic; the only floating-point
 * operations are exact ones (ldexp of an integer that fits, and an initial
 * sqrt estimate that integer steps then correct), run in the library's own
 * floating-point environment (call.h: a caller's flush-to-zero would
 * otherwise flush a subnormal result of ldexp or of the conversion to
 * float). The non-finite rules and the rounding into a format are
 * norm_finish.h's, shared with the norm driver and the CUDA finish.
 */
#include <math.h>
#include <string.h>

#include "acc_internal.h"
#include "acc_round.h"
#include "call.h"
#include "error.h"
#include "kernels.h"
#include "norm_finish.h"
#include "tensor.h"

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
  if (bx_wire_version_ok((const int64_t *)acc)) return BX_OK;
  return bx_fail(BX_EMISMATCH,
                 "accumulator version word %lld does not match %lld accumulator(s) of "
                 "format %d (summed with a different bitexact build, or not initialised)",
                 (long long)acc->version, (long long)acc->naccs, BX_ACC_FORMAT);
}

/* The sum held (sign kept: hand-made words may be negative) or its
 * square root, after the non-finite rules, rounded into dtype code and
 * stored there, all inside the library's floating-point environment (no
 * scratch memory: the environment alone, not a call level). */
static void acc_read(const bx_acc *acc, int root, int code, void *out) {
  bx_fpenv env;
  bx_mag m;
  int ovf;
  double v;
  bx_fpenv_enter(&env);
  if (!bx_nonfinite_rule(acc->nan_count, acc->inf_count, &v)) {
    bx_fmt fmt = bx_fmt_of_dtype(code);
    bx_mag_from_digits(acc->digit, &m);
    if (root) {
      v = m.negative ? NAN : bx_mag_sqrt(&m, fmt, &ovf);
    } else {
      v = bx_mag_round(&m, fmt, &ovf);
      v = m.negative ? -v : v;
    }
  }
  bx_norm_store(code, out, v);
  bx_fpenv_leave(&env);
}

double bx_acc_value(const bx_acc *acc) {
  double v;
  acc_read(acc, 0, BX_DT_F64, &v);
  return v;
}

float bx_acc_valuef(const bx_acc *acc) {
  float f;
  acc_read(acc, 0, BX_DT_F32, &f);
  return f;
}

double bx_acc_sqrt(const bx_acc *acc) {
  double v;
  acc_read(acc, 1, BX_DT_F64, &v);
  return v;
}

float bx_acc_sqrtf(const bx_acc *acc) {
  float f;
  acc_read(acc, 1, BX_DT_F32, &f);
  return f;
}

bx_status bx_acc_norm(const bx_acc *acc, double norm_type, DLDataType dtype, void *out) {
  static const char *fn = "bx_acc_norm";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  bx_dtype code = BX_DT_F64;
  bx_status known = bx_dtype_from_dl(dtype, &code);
  if (!acc || !out) {
    st = bx_fail(BX_EINVAL, "%s: %s is NULL", fn, acc ? "out" : "acc");
  } else if (!(norm_type == 1.0 || norm_type == 2.0)) {
    st = bx_fail(BX_EINVAL, "%s: norm_type %g: an accumulator holds the sum of squares (2) or "
                 "of |x| (1)", fn, norm_type);
  } else if (known != BX_OK) {
    st = bx_fail(BX_EDTYPE, "%s: dtype (code %u, %u bits, %u lanes) is not float16, bfloat16, "
                 "float32 or float64", fn, (unsigned)dtype.code, (unsigned)dtype.bits,
                 (unsigned)dtype.lanes);
  } else if ((st = bx_acc_check(acc)) == BX_OK) {
    int mode = norm_type == 2.0 ? BX_M_SQ : BX_M_ABS;
    bx_norm_part q;
    bx_mag scratch;
    bx_norm_part_empty(&q);
    q.nan = acc->nan_count;
    q.inf = acc->inf_count;
    bx_norm_store((int)code, out, bx_norm_value(mode, norm_type, acc->digit, &q,
                                                bx_fmt_of_dtype((int)code), &scratch));
  }
  bx_call_leave(&c);
  return st;
}

int bx_acc_compare(const bx_acc *a, const bx_acc *b) {
  int64_t da[DIGITS], db[DIGITS];
  bx_digits_normalize(da, a->digit);
  bx_digits_normalize(db, b->digit);
  for (int i = DIGITS - 1; i >= 0; i--)
    if (da[i] != db[i]) return da[i] < db[i] ? -1 : 1;
  return 0;
}
