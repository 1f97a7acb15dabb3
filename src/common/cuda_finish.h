/*
 * cuda_finish.h — the device's side of the end of a norm: the wire words
 * from the reduction kernel's raw words, and the finishing kernel's body
 * (the agreement's verdict as a status word, then norm_finish.h's
 * rounding and coefficient). Host/device code: the CUDA kernels of
 * src/cuda/reduce.cu call it, and the C suite (tests/test_cuda_sim.c) runs
 * it on the CPU against bx_total_norm and bx_clip_coef, bit for bit.
 *
 * On the host the same steps are src/core/norm.c's (the agreement's
 * verdict there comes with messages, before the norm's collective); the
 * numerics are norm_finish.h's on both sides.
 */
#ifndef BX_CUDA_FINISH_H
#define BX_CUDA_FINISH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "agree.h"
#include "norm_finish.h"

/* The raw per-group words of p = 0 / +-inf the reduction kernel fills:
 * max |x| bits, ~min |x| bits (0 = none yet), non-zeros, NaNs. */
#define BX_CU_EXT_WORDS 4

/* One group's wire words w from its raw words (raw: the accumulator's
 * digits and nan, inf, count; ext: BX_CU_EXT_WORDS; both NULL for an empty
 * group list, which still sends one group). */
static inline BX_HD void bx_cu_wire_group(int mode, double p, const int64_t *raw,
                                          const uint64_t *ext, int64_t *w) {
  if (mode != BX_M_EXT) {
    if (!raw) {
      int64_t zero[BX_ACC_DIGITS];
      for (int i = 0; i < BX_ACC_DIGITS; i++) zero[i] = 0;
      bx_wire_of_acc(zero, 0, 0, 0, w);
    } else {
      bx_wire_of_acc(raw, raw[BX_ACC_DIGITS], raw[BX_ACC_DIGITS + 1], raw[BX_ACC_DIGITS + 2], w);
    }
    return;
  }
  bx_ext e;
  e.maxabs = bx_f64_from_bits(ext ? ext[0] : 0);
  e.minabs = bx_f64_from_bits(ext && ext[1] ? ~ext[1] : BX_F64_INF_BITS);
  e.nonzero = ext ? (int64_t)ext[2] : 0;
  e.nan = ext ? (int64_t)ext[3] : 0;
  bx_ext_to_wire(p, &e, w);
}

typedef struct bx_cu_finish_args {
  int mode;
  double p;
  int error_if_nonfinite;
  int clip; /* compute the coefficient for max_norm */
  double max_norm, eps;
  int formula;  /* bx_coef_formula */
  int out_code; /* the dtype of the total (BX_DT_*) */
} bx_cu_finish_args;

/* The whole finish on the all-reduced wire (BX_AGREE_WORDS agreement
 * words, then ngroups groups of bx_wire_words(mode) words): returns the
 * status (BX_OK, BX_EMISMATCH, BX_ENONFINITE or the lowest failing rank's
 * local failure) and writes the total (NaN on failure) in out_code's
 * dtype, the group norms (fp64, may be NULL) and the coefficient (may be
 * NULL; 1 on failure). scratch and total_digits: working memory (one
 * bx_mag, BX_ACC_DIGITS words). */
static inline BX_HD int32_t bx_cu_finish(const int64_t *wire, size_t ngroups,
                                         const bx_cu_finish_args *a, bx_mag *scratch,
                                         int64_t *total_digits, void *d_total,
                                         double *d_groups, double *d_coef) {
  int32_t status = BX_OK;
  size_t ww = bx_wire_words(a->mode);
  if (bx_agree_mismatch(wire) >= 0) status = BX_EMISMATCH;
  int64_t failure = wire[BX_AGREE_W_FAILURE];
  if (failure >= 0) status = bx_agree_failure_status(failure);
  const int64_t *words = wire + BX_AGREE_WORDS;
  if (status == BX_OK && a->mode != BX_M_EXT)
    for (size_t g = 0; g < ngroups; g++)
      if (!bx_wire_version_ok(words + g * ww)) status = BX_EMISMATCH;
  double total = bx_f64_from_bits(BX_F64_NAN_BITS), out = total;
  if (status == BX_OK) {
    bx_finish_words(a->mode, a->p, words, ngroups, ww, bx_fmt_f64(), scratch, total_digits, &total,
                    d_groups);
    out = total;
    if (a->out_code != BX_DT_F64)
      bx_finish_words(a->mode, a->p, words, ngroups, ww, bx_fmt_of_dtype(a->out_code), scratch,
                      total_digits, &out, NULL);
    /* torch's rule: only a non-finite total fails */
    if (a->error_if_nonfinite && (out != out || out == bx_f64_from_bits(BX_F64_INF_BITS))) {
      status = BX_ENONFINITE;
      total = out = bx_f64_from_bits(BX_F64_NAN_BITS);
    }
  }
  bx_norm_store(a->out_code, d_total, out);
  if (status != BX_OK && d_groups)
    for (size_t g = 0; g < ngroups; g++) d_groups[g] = total;
  if (d_coef)
    *d_coef = status == BX_OK && a->clip ? bx_clip_coef_of(total, a->max_norm, a->eps, a->formula)
                                         : 1.0;
  return status;
}

#endif /* BX_CUDA_FINISH_H */
