/*
 * norm_finish.h — the end of every norm, written once for the host and the
 * device: the wire words of a group, their decoding, DESIGN §2's non-finite
 * rules, the one rounding into the chosen format, and the clip coefficient.
 * src/core/norm.c (and so bx_total_norm, bx_clip_grad_norm), src/core/acc.c
 * (bx_acc_norm) and the CUDA finishing kernel (cuda_finish.h) all call
 * these functions, so the bits agree by construction.
 *
 * The wire of a group (what the norm's one collective sums or MAXes):
 *   p = 2, 1, other p, Megatron: BX_ACC_WORDS words, a normalised bx_acc
 *           (digits, nan_count, inf_count, count, naccs = 1, version)
 *   p = 0, +-inf: 2 words (ext_wire.h)
 */
#ifndef BX_NORM_FINISH_H
#define BX_NORM_FINISH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "acc_round.h"
#include "bitexact.h"
#include "dtype.h"
#include "ext_wire.h"
#include "hd.h"
#include "nan_canon.h"
#include "pow_det.h"
#include "scale_round.h"

#define BX_F64_NAN_BITS BX_F64_CANON_NAN /* the canonical NaN (nan_canon.h) */
#define BX_F64_INF_BITS 0x7FF0000000000000ull

/* Words per group on the wire, and whether they are MAX-reduced. */
static inline BX_HD size_t bx_wire_words(int mode) { return mode == BX_M_EXT ? 2 : BX_ACC_WORDS; }
static inline BX_HD int bx_wire_by_max(int mode, double p) { return mode == BX_M_EXT && p != 0.0; }

/* The format of a dtype (BX_DT_*): p significand bits, smallest ulp
 * exponent, values below 2^emax finite. */
static inline BX_HD bx_fmt bx_fmt_of_dtype(int dt) {
  bx_fmt f = bx_fmt_f64();
  if (dt == BX_DT_F32) {
    f = bx_fmt_f32();
  } else if (dt == BX_DT_BF16) {
    f.p = 8;
    f.emin = -133;
    f.emax = 128;
  } else if (dt == BX_DT_F16) {
    f.p = 11;
    f.emin = -24;
    f.emax = 16;
  }
  return f;
}

/* v rounded once (nearest-even) into fmt, as a double (exact there). NaN,
 * +-Inf and zeros stay as they are; past the format's range: +-Inf. */
static inline BX_HD double bx_round_double_to(double v, bx_fmt fmt) {
  if (fmt.p >= 53) return v;
  uint64_t b = bx_f64_bits(v);
  int ef = (int)((b >> 52) & 0x7FF);
  if (ef == 0x7FF || (b << 1) == 0) return v;
  uint64_t m = (b & 0xFFFFFFFFFFFFFull) | (ef ? 1ull << 52 : 0);
  int q, ovf;
  uint64_t mant = bx_round_to_fmt((bx_u128)m, 0, (ef ? ef : 1) - 1075, fmt, &q, &ovf);
  double r = ovf ? bx_f64_from_bits(BX_F64_INF_BITS) : ldexp((double)mant, q);
  return (b >> 63) ? -r : r;
}

/* A group's wire words from an accumulator's digits and counters (the
 * digits may be un-normalised; dst may not alias them). */
static inline BX_HD void bx_wire_of_acc(const int64_t *digits, int64_t nan, int64_t inf,
                                        int64_t count, int64_t *w) {
  bx_digits_normalize(w, digits);
  w[BX_ACC_DIGITS] = nan;
  w[BX_ACC_DIGITS + 1] = inf;
  w[BX_ACC_DIGITS + 2] = count;
  w[BX_ACC_DIGITS + 3] = 1; /* naccs */
  w[BX_ACC_DIGITS + 4] = BX_ACC_VERSION_TAG;
}

/* The accumulators' version check on (reduced) wire words: naccs >= 1 and
 * version == tag * naccs. */
static inline BX_HD int bx_wire_version_ok(const int64_t *w) {
  return w[BX_ACC_DIGITS + 3] >= 1 && w[BX_ACC_DIGITS + 4] == BX_ACC_VERSION_TAG * w[BX_ACC_DIGITS + 3];
}

/* What a group's (reduced) wire words say besides the digits. */
typedef struct bx_norm_part {
  double maxabs, minabs; /* p = +-inf: over non-NaN elements */
  int64_t nan, inf, nonzero;
  int64_t count; /* elements (the sums' words; 0 for p = 0, +-inf) */
} bx_norm_part;

static inline BX_HD void bx_norm_part_empty(bx_norm_part *q) {
  q->maxabs = 0.0;
  q->minabs = bx_f64_from_bits(BX_F64_INF_BITS);
  q->nan = q->inf = q->nonzero = q->count = 0;
}

static inline BX_HD void bx_norm_part_of(int mode, double p, const int64_t *w, bx_norm_part *q) {
  bx_norm_part_empty(q);
  if (mode != BX_M_EXT) {
    q->nan = w[BX_ACC_DIGITS];
    q->inf = w[BX_ACC_DIGITS + 1];
    q->count = w[BX_ACC_DIGITS + 2];
  } else {
    bx_ext e;
    bx_ext_from_wire(p, w, &e);
    q->maxabs = e.maxabs;
    q->minabs = e.minabs;
    q->nan = e.nan;
    q->nonzero = e.nonzero;
  }
}

static inline BX_HD void bx_norm_part_add(bx_norm_part *into, const bx_norm_part *q) {
  if (q->maxabs > into->maxabs) into->maxabs = q->maxabs;
  if (q->minabs < into->minabs) into->minabs = q->minabs;
  into->nan += q->nan;
  into->inf += q->inf;
  into->nonzero += q->nonzero;
  into->count += q->count;
}

/* DESIGN §2's rule for the sums of p > 0: 1 and *v = NaN if a NaN was
 * counted, else 1 and *v = +Inf if an Inf was, else 0 (the sum decides). */
static inline BX_HD int bx_nonfinite_rule(int64_t nan, int64_t inf, double *v) {
  if (nan > 0) {
    *v = bx_f64_from_bits(BX_F64_NAN_BITS);
    return 1;
  }
  if (inf > 0) {
    *v = bx_f64_from_bits(BX_F64_INF_BITS);
    return 1;
  }
  return 0;
}

/* DESIGN §2's rule for the sums of |x|^p with p < 0 (torch's values):
 * 1 and *v = NaN if a NaN was counted; else 1 and *v = 0 if a term was
 * +Inf (a zero element: |0|^p = +Inf; or a term that overflowed fp64),
 * the sum being +Inf and +Inf^(1/p) = 0; else 1 and *v = 0 for no element
 * at all (as p = -inf: nothing gives 0); else 0 (the sum decides: an
 * Inf element added the term 0, and a sum of 0, every element infinite or
 * every term underflowed, gives 0^(1/p) = +Inf). */
static inline BX_HD int bx_negative_p_rule(int64_t nan, int64_t inf, int64_t count, double *v) {
  if (nan > 0) {
    *v = bx_f64_from_bits(BX_F64_NAN_BITS);
    return 1;
  }
  if (inf > 0 || count == 0) {
    *v = 0.0;
    return 1;
  }
  return 0;
}

/* The norm of one set of digits (a group's, or the total's; normalized:
 * they are bx_digits_normalize's output, else any int64 words) and what
 * its words say, in fmt: p = 2 and 1 rounded once from the exact sum;
 * p = 0 (the count: NaN and Inf are non-zero), +-inf and the Megatron
 * flavour their exact value rounded once; other p bx_pow_det's fp64
 * result rounded again (p < 0: bx_negative_p_rule first). scratch:
 * working memory. */
static inline BX_HD double bx_norm_value_of(int mode, double p, const int64_t *digits,
                                            int normalized, const bx_norm_part *q, bx_fmt fmt,
                                            bx_mag *scratch) {
  double v;
  int ovf;
  if (mode == BX_M_EXT) {
    if (p == 0.0) return bx_round_double_to((double)(q->nonzero + q->nan), fmt);
    if (q->nan > 0) return bx_f64_from_bits(BX_F64_NAN_BITS);
    if (p > 0) return bx_round_double_to(q->maxabs, fmt);
    /* p = -inf: min |x|, with Inf a value; nothing at all gives 0 */
    if (q->minabs == bx_f64_from_bits(BX_F64_INF_BITS) && q->maxabs == 0.0 && q->nonzero == 0)
      return 0.0;
    return bx_round_double_to(q->minabs, fmt);
  }
  if (mode == BX_M_POW && p < 0) {
    if (bx_negative_p_rule(q->nan, q->inf, q->count, &v)) return v;
  } else if (bx_nonfinite_rule(q->nan, q->inf, &v)) {
    return v;
  }
  if (normalized) bx_mag_from_normalized(digits, scratch);
  else bx_mag_from_digits(digits, scratch);
  if (scratch->negative) return bx_f64_from_bits(BX_F64_NAN_BITS); /* never, for sums of squares */
  switch (mode) {
    case BX_M_SQ: return bx_mag_sqrt(scratch, fmt, &ovf);
    case BX_M_ABS: return bx_mag_round(scratch, fmt, &ovf);
    case BX_M_POW:
      return bx_round_double_to(bx_pow_det(bx_mag_round(scratch, bx_fmt_f64(), &ovf), 1.0 / p), fmt);
    default: /* BX_M_MEGATRON: the exact sum rounded to fp32, then fp32 sqrt */
      return bx_round_double_to((double)sqrtf((float)bx_mag_round(scratch, bx_fmt_f32(), &ovf)), fmt);
  }
}

static inline BX_HD double bx_norm_value(int mode, double p, const int64_t *digits,
                                         const bx_norm_part *q, bx_fmt fmt, bx_mag *scratch) {
  return bx_canon_f64(bx_norm_value_of(mode, p, digits, 0, q, fmt, scratch));
}

/* The norms of every group and of the total from the reduced words of
 * ngroups groups, stride words apart (bx_wire_words(mode) for a wire; the
 * host also finishes its partials in place, whose first words are the
 * same layout), in fmt. groups may be NULL. total_digits: BX_ACC_DIGITS
 * words of working memory. Each group's digits are normalised once (into
 * scratch) and added to the total as normalised digits (below 2^32 each),
 * which is normalised every 2^30 groups: one pass over the digits per
 * group. */
static inline BX_HD void bx_finish_words(int mode, double p, const int64_t *words, size_t ngroups,
                                         size_t stride, bx_fmt fmt, bx_mag *scratch,
                                         int64_t *total_digits, double *total, double *groups) {
  bx_norm_part all;
  bx_norm_part_empty(&all);
  for (int i = 0; i < BX_ACC_DIGITS; i++) total_digits[i] = 0;
  size_t pending = 0;
  for (size_t g = 0; g < ngroups; g++) {
    const int64_t *w = words + g * stride;
    bx_norm_part q;
    bx_norm_part_of(mode, p, w, &q);
    if (mode != BX_M_EXT) {
      int lo, end;
      bx_digits_normalize_span(scratch->d, w, &lo, &end);
      for (int i = lo; i < end; i++) total_digits[i] += scratch->d[i];
      total_digits[BX_ACC_DIGITS - 1] += scratch->d[BX_ACC_DIGITS - 1];
      if (++pending == ((size_t)1 << 30)) {
        bx_digits_normalize(total_digits, total_digits);
        pending = 0;
      }
    }
    if (groups) groups[g] = bx_canon_f64(bx_norm_value_of(mode, p, scratch->d, 1, &q, fmt, scratch));
    bx_norm_part_add(&all, &q);
  }
  if (mode != BX_M_EXT) bx_digits_normalize(total_digits, total_digits);
  *total = bx_canon_f64(bx_norm_value_of(mode, p, total_digits, 1, &all, fmt, scratch));
}

/* Store a norm in dtype code (BX_DT_*), rounded once into its format (a
 * no-op for a value of that format). Byte copies: out may be any object
 * (no aliasing rules), at any alignment. On the host, call it inside the
 * library's floating-point environment (a subnormal fp32 would be flushed
 * by the conversion under a caller's FTZ). */
static inline BX_HD void bx_norm_store(int code, void *out, double v) {
  v = bx_canon_f64(bx_round_double_to(v, bx_fmt_of_dtype(code)));
  float f = bx_canon_f32((float)v); /* exact; a NaN: the canonical one (nan_canon.h) */
  uint16_t h;
  switch (code) {
    case BX_DT_F32: memcpy(out, &f, 4); break;
    case BX_DT_BF16: h = bx_f32_to_bf16(f); memcpy(out, &h, 2); break;
    case BX_DT_F16: h = bx_f32_to_f16(f); memcpy(out, &h, 2); break;
    default: memcpy(out, &v, 8); break;
  }
}

/* The clip coefficient (bitexact.h, bx_clip_coef): 1 when max_norm == 0;
 * torch's max_norm / (total + eps) or max_norm / max(total, max_norm),
 * clamped to 1 (a NaN stays NaN, as torch.clamp: the canonical one). */
static inline BX_HD double bx_clip_coef_of(double total, double max_norm, double eps, int formula) {
  double c;
  if (max_norm == 0.0) return 1.0;
  if (formula == BX_COEF_TORCH) c = max_norm / (total + eps);
  else c = max_norm / (total > max_norm || total != total ? total : max_norm);
  return bx_canon_f64(c > 1.0 ? 1.0 : c);
}

#endif /* BX_NORM_FINISH_H */
