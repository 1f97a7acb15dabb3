/*
 * lr.c — bx_lr_at: the learning rate of a step under transformers'
 * schedules (bitexact_train_math.h states the formulas), rounded once to
 * double, so the rate is a pure function of (schedule, lr, min_lr, warmup,
 * total, step) with the same bits on every machine (no libm).
 *
 * Two paths:
 * - Rational rates (constant, warmup, linear, and the cosine's steps where
 *   cos(pi k / n) is 0, +-1/2 or +-1, the only rational values it takes):
 *   (lr a + min_lr c) / b for integers a, c, b, computed exactly in a
 *   little integer of 64-bit limbs and rounded to nearest even with its
 *   sticky bit: always the correctly rounded rate, ties included.
 * - The other cosine steps: an irrational rate (never a tie), evaluated in
 *   double-double (pow_det.h, math_det.h: each operation ~2^-100 relative,
 *   the sine / cosine series 2^-98, no cancellation since every term is
 *   >= 0), so within about 2^-95 (relative) of the exact rate before the
 *   one rounding: correctly rounded unless the rate lies within 2^-95 of a
 *   midpoint between two doubles.
 * tests/test_lr.c checks both against MPFR.
 */
#include <math.h>
#include <stdint.h>

#include "abi.h"
#include "bitexact_train.h"
#include "call.h"
#include "error.h"
#include "math_det.h"
#include "pow_det.h"

/* a / b for integers 0 <= a, 1 <= b < 2^53, as a double-double */
static bx_pd_dd ratio(int64_t a, int64_t b) {
  return bx_md_dd_div_d(bx_pd_make((double)a, 0.0), (double)b);
}

/* (1 + cos(pi k / n)) / 2 = cos^2(pi k / (2n)) for k >= 0, n >= 1: k
 * reduced modulo 2n exactly, the angle folded into [0, pi/4] (a cosine or
 * a sine of pi j / (2n), j <= n / 2) before the series. Returns 1 and the
 * exact value q / 4 in *q4 where cos(pi k / n) is rational. */
static int half_cos_plus_half(int64_t k, int64_t n, bx_pd_dd *f, int64_t *q4) {
  static const int64_t quarters[12] = {4, -1, 3, 2, 1, -1, 0, -1, 1, 2, 3, -1};
  const bx_pd_dd half_pi = {0x1.921fb54442d18p+0, 0x1.1a62633145c07p-54};
  int64_t j = k % (2 * n); /* period 2n in j */
  if ((6 * (bx_u128)j) % (bx_u128)n == 0) { /* j / n a multiple of 1/6 */
    int64_t t = (int64_t)((6 * (bx_u128)j) / (bx_u128)n); /* 0..11 */
    if (quarters[t] >= 0) {
      *q4 = quarters[t];
      return 1;
    }
  }
  if (j > n) j = 2 * n - j; /* symmetric about j = n */
  int odd = 0;              /* j in [0, n]: angle pi j / (2n) in [0, pi/2] */
  if (2 * j > n) {          /* cos(x) = sin(pi/2 - x) */
    j = n - j;
    odd = 1;
  }
  bx_pd_dd x = bx_pd_mul(half_pi, ratio(j, n)); /* <= pi / 4 */
  bx_pd_dd c = bx_md_sincos_dd(x, odd);
  *f = bx_pd_mul(c, c);
  return 0;
}

/* ---- the exact rational path -------------------------------------------- */

#define LIMBS 36 /* 2304 bits: 2^-953 .. 2^900 operands, 106-bit products, 128 guard bits */

/* acc += v * 2^shift */
static void big_add(uint64_t *acc, bx_u128 v, int shift) {
  int w = shift / 64, b = shift % 64;
  uint64_t lo = (uint64_t)v, hi = (uint64_t)(v >> 64);
  uint64_t part[3] = {lo, hi, 0};
  if (b != 0) {
    part[0] = lo << b;
    part[1] = hi << b | lo >> (64 - b);
    part[2] = hi >> (64 - b);
  }
  uint64_t carry = 0;
  for (int i = 0; w + i < LIMBS && (i < 3 || carry); i++) {
    bx_u128 t = (bx_u128)acc[w + i] + (i < 3 ? part[i] : 0) + carry;
    acc[w + i] = (uint64_t)t;
    carry = (uint64_t)(t >> 64);
  }
}

/* x = mant * 2^exp with an integer mant < 2^53 (x finite, >= 0) */
static uint64_t split_double(double x, int *exp) {
  int e;
  double f = frexp(x, &e); /* x = f 2^e, f in [0.5, 1) */
  *exp = e - 53;
  return (uint64_t)ldexp(f, 53);
}

/* (x a + y c) / b rounded to nearest even, exactly: x, y finite >= 0 with
 * x or y non-zero in [2^-953, 2^900], 0 <= a, c < 2^53, 1 <= b < 2^53,
 * and a result in the normal range. */
static double exact_ratio(double x, int64_t a, double y, int64_t c, int64_t b) {
  uint64_t num[LIMBS] = {0}, q[LIMBS];
  int ex = 0, ey = 0;
  uint64_t mx = x != 0 && a != 0 ? split_double(x, &ex) : 0;
  uint64_t my = y != 0 && c != 0 ? split_double(y, &ey) : 0;
  if (!mx && !my) return 0.0;
  /* exponent of bit 0 of num: 128 guard bits below the smaller operand */
  int e0 = (mx && my ? (ex < ey ? ex : ey) : mx ? ex : ey) - 128;
  if (mx) big_add(num, (bx_u128)mx * (uint64_t)a, ex - e0);
  if (my) big_add(num, (bx_u128)my * (uint64_t)c, ey - e0);
  bx_u128 rem = 0; /* q = num / b (short division), rem its remainder */
  for (int i = LIMBS - 1; i >= 0; i--) {
    bx_u128 cur = (rem << 64) | num[i];
    q[i] = (uint64_t)(cur / (uint64_t)b);
    rem = cur % (uint64_t)b;
  }
  int top = LIMBS - 1;
  while (q[top] == 0) top--;             /* q >= 2^128 / 2^53: never empty */
  int hb = top * 64 + 63 - bx_clz64(q[top]); /* the highest set bit */
  int lo = hb - 52;                      /* keep bits hb .. lo (53 bits) */
  uint64_t keep = 0;
  for (int bit = hb; bit >= lo; bit--) keep = keep << 1 | ((q[bit / 64] >> (bit % 64)) & 1);
  int half = (q[(lo - 1) / 64] >> ((lo - 1) % 64)) & 1;
  int sticky = rem != 0;
  for (int bit = lo - 2; bit >= 0 && !sticky; bit--)
    sticky = (q[bit / 64] >> (bit % 64)) & 1;
  if (half && (sticky || (keep & 1))) keep++; /* 2^53 stays exact */
  return ldexp((double)keep, lo + e0);
}

bx_status bx_lr_at(bx_lr_schedule kind, double lr, double min_lr, int64_t warmup_steps,
                   int64_t total_steps, int64_t step, double *out) {
  static const char *fn = "bx_lr_at";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  const int64_t big = (int64_t)1 << 52;
  if (!out) st = bx_fail(BX_EINVAL, "%s: out is NULL", fn);
  else if (kind != BX_LR_CONSTANT && kind != BX_LR_LINEAR && kind != BX_LR_COSINE &&
           kind != BX_LR_CONSTANT_WITH_WARMUP)
    st = bx_fail(BX_EINVAL, "%s: schedule %d is not a bx_lr_schedule", fn, (int)kind);
  else if (!(lr == 0 || (lr >= 0x1p-900 && lr <= 0x1p900)))
    st = bx_fail(BX_EINVAL, "%s: lr %g is not 0 or in [2^-900, 2^900]", fn, lr);
  else if (!(min_lr == 0 || (min_lr >= 0x1p-900 && min_lr <= lr)))
    st = bx_fail(BX_EINVAL, "%s: min_lr %g is not 0 or in [2^-900, lr = %g]", fn, min_lr, lr);
  else if (min_lr != 0 && kind != BX_LR_LINEAR && kind != BX_LR_COSINE)
    st = bx_fail(BX_EINVAL, "%s: min_lr %g applies to the linear and cosine schedules only", fn,
                 min_lr);
  else if (warmup_steps < 0 || warmup_steps > big)
    st = bx_fail(BX_EINVAL, "%s: warmup_steps %lld is not in [0, 2^52]", fn, (long long)warmup_steps);
  else if (total_steps < 0 || total_steps > big)
    st = bx_fail(BX_EINVAL, "%s: total_steps %lld is not in [0, 2^52]", fn, (long long)total_steps);
  else if (step < 0 || step > big)
    st = bx_fail(BX_EINVAL, "%s: step %lld is not in [0, 2^52]", fn, (long long)step);
  if (st != BX_OK) {
    bx_call_leave(&c);
    return st;
  }
  double r;
  if (kind == BX_LR_CONSTANT || (kind == BX_LR_CONSTANT_WITH_WARMUP && step >= warmup_steps)) {
    r = lr;
  } else if (step < warmup_steps) { /* lr step / warmup */
    r = exact_ratio(lr, step, 0.0, 0, warmup_steps);
  } else {
    /* m + (lr - m) f = (lr a + m (b - a)) / b for a rational f = a / b */
    int64_t n = total_steps - warmup_steps > 1 ? total_steps - warmup_steps : 1;
    int64_t a4 = 0;
    if (kind == BX_LR_LINEAR) {
      int64_t a = step >= total_steps ? 0 : total_steps - step; /* <= n */
      r = exact_ratio(lr, a, min_lr, n - a, n);
    } else {
      bx_pd_dd f;
      if (half_cos_plus_half(step - warmup_steps, n, &f, &a4)) {
        r = exact_ratio(lr, a4, min_lr, 4 - a4, 4);
      } else { /* irrational: double-double, lr - m exact as one */
        bx_pd_dd d = bx_pd_two_sum(lr, -min_lr);
        bx_pd_dd v = bx_md_dd_add(bx_pd_make(min_lr, 0.0), bx_pd_mul(d, f));
        r = v.hi + v.lo;
      }
    }
  }
  *out = r;
  bx_call_leave(&c);
  return BX_OK;
}
