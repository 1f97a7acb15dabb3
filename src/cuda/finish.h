/*
 * finish.h — the end of a GPU norm, written once for the device and the
 * host: the wire words (norm.c's to_wire: normalised accumulators, or the
 * 2-word encodings of p = 0 and p = ±inf), the agreement words
 * (collective.c's layout), and the finish (norm.c's finish and
 * bx_clip_coef: agreement check, one rounding per group and for the total,
 * the coefficient). The kernels of reduce.cu call these functions; the C
 * suite (tests/test_cuda_sim.c) runs them on the CPU against bx_total_norm
 * and bx_clip_coef, bit for bit.
 */
#ifndef BX_CUDA_FINISH_H
#define BX_CUDA_FINISH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "acc_round.h"
#include "ext_wire.h"
#include "internal.h"
#include "pow_det.h"
#include "scale_round.h"

#define BX_CU_INF_BITS 0x7FF0000000000000ull

/* The raw per-group words of p = 0 / ±inf the reduction kernel fills:
 * max |x| bits, ~min |x| bits (0 = none yet), non-zeros, NaNs. */
#define BX_CU_EXT_WORDS 4

/* The agreement step (collective.c's layout): 2 words per item (v, ~v),
 * then the offender key and the failure key. Items: accumulator format,
 * ngroups, norm_type bits, flavor, error_if_nonfinite, eps bits, formula,
 * scale mode, max_norm bits. */
#define BX_CU_AGREE_ITEMS 9
#define BX_CU_AGREE_WORDS (2 * BX_CU_AGREE_ITEMS + 2)
#define BX_CU_AGREE_MAX_NORM 8 /* the slot filled per call */

typedef struct bx_cu_agree_vals {
  int64_t v[BX_CU_AGREE_ITEMS];
} bx_cu_agree_vals;

static inline BX_HD void bx_cu_wire_agreement(int64_t *wire, const bx_cu_agree_vals *a,
                                              int64_t offender, int64_t failure_key) {
  for (int i = 0; i < BX_CU_AGREE_ITEMS; i++) {
    wire[2 * i] = a->v[i];
    wire[2 * i + 1] = ~a->v[i];
  }
  wire[2 * BX_CU_AGREE_ITEMS] = offender;
  wire[2 * BX_CU_AGREE_ITEMS + 1] = failure_key;
}

/* One group's wire words w from its raw words (raw: BX_ACC_WORDS words of
 * digits and counters; ext: BX_CU_EXT_WORDS; NULL for an empty group list,
 * which still sends one group). */
static inline BX_HD void bx_cu_wire_group(int mode, double p, const int64_t *raw,
                                          const uint64_t *ext, int64_t *w) {
  if (mode != BX_M_EXT) {
    if (!raw) {
      for (int i = 0; i < BX_ACC_WORDS; i++) w[i] = 0;
    } else {
      bx_digits_normalize(w, raw);
      w[BX_ACC_DIGITS] = raw[BX_ACC_DIGITS];
      w[BX_ACC_DIGITS + 1] = raw[BX_ACC_DIGITS + 1];
      w[BX_ACC_DIGITS + 2] = raw[BX_ACC_DIGITS + 2];
    }
    w[BX_ACC_DIGITS + 3] = 1; /* naccs */
    w[BX_ACC_DIGITS + 4] = BX_ACC_VERSION_TAG;
    return;
  }
  bx_ext e;
  e.maxabs = bx_f64_from_bits(ext ? ext[0] : 0);
  e.minabs = bx_f64_from_bits(ext && ext[1] ? ~ext[1] : BX_CU_INF_BITS);
  e.nonzero = ext ? (int64_t)ext[2] : 0;
  e.nan = ext ? (int64_t)ext[3] : 0;
  bx_ext_to_wire(p, &e, w);
}

/* ---- finish ------------------------------------------------------------- */

typedef struct bx_cu_partial {
  double maxabs, minabs;
  int64_t nan, inf, nonzero;
} bx_cu_partial;

typedef struct bx_cu_finish_args {
  int mode;
  double p;
  int error_if_nonfinite;
  int clip; /* compute the coefficient for max_norm */
  double max_norm, eps;
  int formula;  /* bx_coef_formula */
  int out_code; /* the dtype of the total (BX_DT_*) */
} bx_cu_finish_args;

/* The format a norm is rounded into: the out dtype's. */
static inline BX_HD bx_fmt bx_cu_fmt_of(int code) {
  bx_fmt f = bx_fmt_f64();
  if (code == BX_DT_F32) {
    f = bx_fmt_f32();
  } else if (code == BX_DT_BF16) {
    f.p = 8;
    f.emin = -133;
    f.emax = 128;
  } else if (code == BX_DT_F16) {
    f.p = 11;
    f.emin = -24;
    f.emax = 16;
  }
  return f;
}

/* The norm of one set of words (a group's, or the total's digits), rounded
 * once into fmt for p = 2 and 1 (the result is exact in fmt); the other
 * modes give their double. */
static inline BX_HD double bx_cu_norm_of(int mode, double p, const int64_t *digits,
                                         const bx_cu_partial *q, bx_fmt fmt, bx_mag *scratch) {
  if (q->nan > 0) return bx_f64_from_bits(0x7FF8000000000000ull);
  if (mode == BX_M_EXT) {
    if (p == 0.0) return (double)q->nonzero;
    if (p > 0) return q->maxabs;
    return q->minabs == INFINITY && q->maxabs == 0.0 && q->nonzero == 0 ? 0.0 : q->minabs;
  }
  if (q->inf) return INFINITY;
  int ovf;
  bx_mag_from_digits(digits, scratch);
  switch (mode) {
    case BX_M_SQ:
      return scratch->negative ? bx_f64_from_bits(0x7FF8000000000000ull)
                               : bx_mag_sqrt(scratch, fmt, &ovf);
    case BX_M_ABS: return bx_mag_round(scratch, fmt, &ovf);
    case BX_M_POW: return bx_pow_det(bx_mag_round(scratch, bx_fmt_f64(), &ovf), 1.0 / p);
    default: /* BX_M_MEGATRON */
      return (double)sqrtf((float)bx_mag_round(scratch, bx_fmt_f32(), &ovf));
  }
}

/* v rounded once (nearest-even) into a 16-bit format's values, as a double
 * (then exact in fp32): no double rounding through fp32. */
static inline BX_HD double bx_cu_round_double(double v, bx_fmt fmt) {
  uint64_t b = bx_f64_bits(v);
  int ef = (int)((b >> 52) & 0x7FF);
  if (ef == 0x7FF || (b << 1) == 0) return v; /* NaN, Inf, zero */
  uint64_t m = (b & 0xFFFFFFFFFFFFFull) | (ef ? 1ull << 52 : 0);
  int q, ovf;
  uint64_t mant = bx_round_to_fmt((bx_u128)m, 0, (ef ? ef : 1) - 1075, fmt, &q, &ovf);
  double r = ovf ? INFINITY : ldexp((double)mant, q);
  return (b >> 63) ? -r : r;
}

/* Store a norm in the out dtype, rounded once (exact when bx_cu_norm_of
 * already rounded into it). Byte copies: the caller's buffer may be any
 * object (no aliasing rules). */
static inline BX_HD void bx_cu_store_as(int code, void *out, double v) {
  if (code == BX_DT_BF16 || code == BX_DT_F16) v = bx_cu_round_double(v, bx_cu_fmt_of(code));
  float f = (float)v;
  uint16_t h;
  switch (code) {
    case BX_DT_F32: memcpy(out, &f, 4); break;
    case BX_DT_BF16: h = bx_f32_to_bf16(f); memcpy(out, &h, 2); break;
    case BX_DT_F16: h = bx_f32_to_f16(f); memcpy(out, &h, 2); break;
    default: memcpy(out, &v, 8); break;
  }
}

/* norm.c's from_wire. */
static inline BX_HD void bx_cu_partial_of(int mode, double p, const int64_t *w, bx_cu_partial *q) {
  q->maxabs = 0.0;
  q->minabs = INFINITY;
  q->nan = q->inf = q->nonzero = 0;
  if (mode != BX_M_EXT) {
    q->nan = w[BX_ACC_DIGITS];
    q->inf = w[BX_ACC_DIGITS + 1];
  } else {
    bx_ext e;
    bx_ext_from_wire(p, w, &e);
    q->maxabs = e.maxabs;
    q->minabs = e.minabs;
    q->nan = e.nan;
    q->nonzero = e.nonzero;
  }
}

/* The whole finish on the (all-reduced) wire: returns the status (BX_OK,
 * BX_EMISMATCH, BX_ENONFINITE or a rank's local failure) and writes the
 * total (NaN on failure) in out_code's dtype, the group norms (fp64, may be
 * NULL) and the coefficient (may be NULL; 1 on failure). scratch and
 * total_digits: working memory (one bx_mag, BX_ACC_DIGITS words). */
static inline BX_HD int32_t bx_cu_finish(const int64_t *wire, size_t ngroups, size_t ww,
                                         const bx_cu_finish_args *a, bx_mag *scratch,
                                         int64_t *total_digits, void *d_total,
                                         double *d_groups, double *d_coef) {
  int32_t status = BX_OK;
  /* the agreement: every (v, ~v) pair must give max(v) == min(v) */
  for (int i = 0; i < BX_CU_AGREE_ITEMS; i++)
    if (wire[2 * i] != ~wire[2 * i + 1]) status = BX_EMISMATCH;
  int64_t failure = wire[2 * BX_CU_AGREE_ITEMS + 1];
  if (failure >= 0) status = (int32_t)(failure & 0xFF);
  const int64_t *words = wire + BX_CU_AGREE_WORDS;
  if (status == BX_OK && a->mode != BX_M_EXT)
    for (size_t g = 0; g < ngroups; g++) { /* the accumulators' version check */
      const int64_t *w = words + g * ww;
      if (w[BX_ACC_DIGITS + 3] < 1 ||
          w[BX_ACC_DIGITS + 4] != BX_ACC_VERSION_TAG * w[BX_ACC_DIGITS + 3])
        status = BX_EMISMATCH;
    }
  if (status == BX_OK && a->error_if_nonfinite && wire[2 * BX_CU_AGREE_ITEMS] >= 0)
    status = BX_ENONFINITE;
  double total = bx_f64_from_bits(0x7FF8000000000000ull);
  if (status == BX_OK) {
    bx_cu_partial all;
    all.maxabs = 0.0;
    all.minabs = INFINITY;
    all.nan = all.inf = all.nonzero = 0;
    for (int i = 0; i < BX_ACC_DIGITS; i++) total_digits[i] = 0;
    for (size_t g = 0; g < ngroups; g++) {
      const int64_t *w = words + g * ww;
      bx_cu_partial q;
      bx_cu_partial_of(a->mode, a->p, w, &q);
      if (d_groups) d_groups[g] = bx_cu_norm_of(a->mode, a->p, w, &q, bx_fmt_f64(), scratch);
      if (a->mode != BX_M_EXT) { /* exact: add, then normalise (carries stay small) */
        for (int i = 0; i < BX_ACC_DIGITS; i++) total_digits[i] += w[i];
        bx_digits_normalize(total_digits, total_digits);
      }
      if (q.maxabs > all.maxabs) all.maxabs = q.maxabs;
      if (q.minabs < all.minabs) all.minabs = q.minabs;
      all.nan += q.nan;
      all.inf += q.inf;
      all.nonzero += q.nonzero;
    }
    total = bx_cu_norm_of(a->mode, a->p, total_digits, &all, bx_fmt_f64(), scratch);
    if (a->out_code != BX_DT_F64)
      bx_cu_store_as(a->out_code, d_total,
                     bx_cu_norm_of(a->mode, a->p, total_digits, &all, bx_cu_fmt_of(a->out_code),
                                   scratch));
    else
      bx_cu_store_as(a->out_code, d_total, total);
  } else {
    bx_cu_store_as(a->out_code, d_total, total);
    if (d_groups)
      for (size_t g = 0; g < ngroups; g++) d_groups[g] = total;
  }
  if (d_coef) {
    double c = 1.0; /* bx_clip_coef's arithmetic, step by step */
    if (a->clip && a->max_norm != 0.0) {
      if (a->formula == BX_COEF_TORCH) c = a->max_norm / (total + a->eps);
      else c = a->max_norm / (total > a->max_norm || total != total ? total : a->max_norm);
      if (c > 1.0) c = 1.0;
    }
    *d_coef = status == BX_OK ? c : 1.0;
  }
  return status;
}

#endif /* BX_CUDA_FINISH_H */
