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

#include "internal.h"

typedef unsigned __int128 u128;
typedef __int128 i128;

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

/* out = normalised digits of in (in may hold any int64 words). */
static void normalized_digits(int64_t out[DIGITS], const int64_t in[DIGITS]) {
  i128 carry = 0;
  for (int i = 0; i < DIGITS - 1; i++) {
    carry += in[i];
    out[i] = (int64_t)(carry & (i128)DIGIT_MASK);
    carry >>= 32;
  }
  out[DIGITS - 1] = (int64_t)(carry + in[DIGITS - 1]);
}

void bx_acc_normalize(bx_acc *acc) { normalized_digits(acc->digit, acc->digit); }

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

/* ---- magnitude view of a normalised digit vector ---------------------- */

typedef struct magnitude {
  int64_t d[DIGITS]; /* non-negative digits in [0,2^32), top may be larger */
  int negative;
  int top; /* index of the highest non-zero digit, -1 if zero */
} magnitude;

static void to_magnitude(const bx_acc *acc, magnitude *m) {
  normalized_digits(m->d, acc->digit);
  m->negative = m->d[DIGITS - 1] < 0;
  if (m->negative) { /* two's-complement negate over the digit vector */
    i128 carry = 1;
    for (int i = 0; i < DIGITS - 1; i++) {
      carry += (i128)(~m->d[i] & (int64_t)DIGIT_MASK);
      m->d[i] = (int64_t)(carry & (i128)DIGIT_MASK);
      carry >>= 32;
    }
    m->d[DIGITS - 1] = (int64_t)(carry - 1 - m->d[DIGITS - 1]);
  }
  m->top = -1;
  for (int i = DIGITS - 1; i >= 0; i--)
    if (m->d[i] != 0) {
      m->top = i;
      break;
    }
}

static int bitlen128(u128 w) {
  uint64_t hi = (uint64_t)(w >> 64);
  if (hi) return 128 - __builtin_clzll(hi);
  uint64_t lo = (uint64_t)w;
  return lo ? 64 - __builtin_clzll(lo) : 0;
}

/* Total bit length of the magnitude (position of its top bit + 1). */
static int mag_bitlen(const magnitude *m) {
  if (m->top < 0) return 0;
  return 32 * m->top + bitlen128((u128)(uint64_t)m->d[m->top]);
}

/* Bits [lo, lo+127) of the magnitude as an integer, and whether any bit
 * below lo is set. lo may be negative (then the low end is zero-filled). */
static u128 mag_bits(const magnitude *m, int lo, int *sticky) {
  u128 w = 0;
  *sticky = 0;
  for (int i = 0; i <= m->top; i++) {
    uint64_t dv = (uint64_t)m->d[i];
    int pos = 32 * i - lo; /* where this digit's bit 0 lands in w */
    if (pos >= 0) {
      if (pos < 128) w += (u128)dv << pos;
    } else if (pos > -64) {
      if (dv & ((1ull << -pos) - 1)) *sticky = 1;
      w += (u128)(dv >> -pos);
    } else if (dv) {
      *sticky = 1;
    }
  }
  return w;
}

/* A binary floating-point format: p significand bits, smallest ulp
 * exponent emin (subnormals), values below 2^emax are finite. */
typedef struct fmt {
  int p, emin, emax;
} fmt;
static const fmt FMT_F64 = {53, -1074, 1024};
static const fmt FMT_F32 = {24, -149, 128};

/* Round (w + f) * 2^e, 0 <= f < 1 with f > 0 iff sticky, to the format,
 * nearest-even. Returns the integer significand and sets *q (its ulp
 * exponent); *overflow when the result is >= 2^emax. */
static uint64_t round_to_fmt(u128 w, int sticky, int e, fmt f, int *q,
                             int *overflow) {
  *overflow = 0;
  int len = bitlen128(w);
  int ulp = e + len - f.p;
  if (ulp < f.emin) ulp = f.emin;
  int s = ulp - e;
  uint64_t mant;
  if (s <= 0) { /* already representable (sticky cannot occur: see callers) */
    mant = (uint64_t)(w << -s);
  } else if (s > len) { /* below half an ulp */
    mant = 0;
  } else {
    u128 keep = s >= 128 ? 0 : w >> s;
    u128 rem = w - (keep << s);
    u128 half = (u128)1 << (s - 1);
    mant = (uint64_t)keep;
    if (rem > half || (rem == half && (sticky || (mant & 1)))) mant++;
  }
  if (mant >> f.p) { /* carried into a new binade: 2^p */
    mant >>= 1;
    ulp++;
  }
  if (mant && ulp + bitlen128(mant) > f.emax) *overflow = 1;
  *q = ulp;
  return mant;
}

static double round_mag(const magnitude *m, fmt f, int *overflow) {
  int len = mag_bitlen(m);
  *overflow = 0;
  if (len == 0) return 0.0;
  int lo = len > 120 ? len - 120 : 0;
  int sticky;
  u128 w = mag_bits(m, lo, &sticky);
  int q;
  uint64_t mant = round_to_fmt(w, sticky, lo + BX_ACC_LSB_EXP, f, &q, overflow);
  if (*overflow) return INFINITY;
  return ldexp((double)mant, q); /* exact: mant fits the format */
}

double bx_acc_value(const bx_acc *acc) {
  magnitude m;
  int ovf;
  to_magnitude(acc, &m);
  double v = round_mag(&m, FMT_F64, &ovf);
  return m.negative ? -v : v;
}

float bx_acc_valuef(const bx_acc *acc) {
  magnitude m;
  int ovf;
  to_magnitude(acc, &m);
  float v = (float)round_mag(&m, FMT_F32, &ovf); /* exact: already in fp32 */
  return m.negative ? -v : v;
}

/* floor(sqrt(M)) for M < 2^127. */
static uint64_t isqrt128(u128 M) {
  if (M == 0) return 0;
  uint64_t s = (uint64_t)sqrt((double)M); /* estimate, error ~2^-52 rel. */
  if (s == 0) s = 1;
  s = (uint64_t)(((u128)s + M / s) / 2); /* one Newton step */
  while ((u128)s * s > M) s--;
  while ((u128)(s + 1) * (s + 1) <= M) s++;
  return s;
}

static double sqrt_mag(const magnitude *m, fmt f, int *overflow) {
  *overflow = 0;
  int len = mag_bitlen(m);
  if (len == 0) return 0.0;
  /* sum = N * 2^LSB; take M = floor(N / 2^(2k)) with ~120 bits; then
   * floor(sqrt(N) / 2^k) = isqrt(M) exactly and the remainder tells
   * whether anything lies below. */
  int k = len > 120 ? (len - 120 + 1) / 2 : 0;
  int sticky;
  u128 M = mag_bits(m, 2 * k, &sticky);
  uint64_t r = isqrt128(M);
  if ((u128)r * r != M) sticky = 1;
  int q;
  uint64_t mant =
      round_to_fmt(r, sticky, k + BX_ACC_LSB_EXP / 2, f, &q, overflow);
  if (*overflow) return INFINITY;
  return ldexp((double)mant, q);
}

double bx_acc_sqrt(const bx_acc *acc) {
  magnitude m;
  int ovf;
  to_magnitude(acc, &m);
  if (m.negative) return NAN;
  return sqrt_mag(&m, FMT_F64, &ovf);
}

float bx_acc_sqrtf(const bx_acc *acc) {
  magnitude m;
  int ovf;
  to_magnitude(acc, &m);
  if (m.negative) return NAN;
  return (float)sqrt_mag(&m, FMT_F32, &ovf);
}

int bx_acc_compare(const bx_acc *a, const bx_acc *b) {
  int64_t da[DIGITS], db[DIGITS];
  normalized_digits(da, a->digit);
  normalized_digits(db, b->digit);
  for (int i = DIGITS - 1; i >= 0; i--)
    if (da[i] != db[i]) return da[i] < db[i] ? -1 : 1;
  return 0;
}
