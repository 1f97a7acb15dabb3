/*
 * agree.h — the agreement step of a collective call, in one layout for the
 * CPU driver (src/core/collective.c) and the CUDA plans (src/cuda): what
 * every rank must agree on, how it travels, and how the answer is read.
 *
 * All of it is one MAX all-reduce of BX_AGREE_WORDS int64 words:
 *   [2i], [2i+1]   item i as (v, ~v): every rank learns max(v) and
 *                  min(v) = ~max(~v); the ranks agree iff they are equal
 *   OFFENDER       the first (rank, group, tensor) holding a NaN/Inf
 *                  (offender.h's key: MAX selects the smallest), -1 none
 *   FAILURE        the lowest rank that failed its local checks, and its
 *                  status (bx_agree_failure_key), -1 none
 *   FAILURE_AT     where that rank failed (an offender.h key of its rank,
 *                  group, tensor; MAX selects the lowest rank's), -1 none
 *   DTYPES + d     1 if some rank passed a tensor of dtype d (MAX is OR)
 */
#ifndef BX_AGREE_H
#define BX_AGREE_H

#include <stdint.h>

#include "dtype.h"
#include "hd.h"

typedef enum bx_agree_item {
  BX_AGREE_FORMAT = 0,  /* BX_ACC_VERSION_TAG: the same accumulator format */
  BX_AGREE_CALL,        /* which call: BX_CALL_NORM or BX_CALL_CLIP */
  BX_AGREE_NGROUPS,     /* the number of groups */
  BX_AGREE_NORM_TYPE,   /* bits of norm_type */
  BX_AGREE_FLAVOR,      /* bx_norm_flavor */
  BX_AGREE_NONFINITE,   /* error_if_nonfinite != 0 */
  BX_AGREE_NORM_DTYPE,  /* bx_norm_dtype */
  BX_AGREE_MAX_NORM,    /* bits of max_norm (0 for a norm) */
  BX_AGREE_EPS,         /* bits of eps (0 for a norm) */
  BX_AGREE_FORMULA,     /* bx_coef_formula (0 for a norm) */
  BX_AGREE_SCALE_MODE,  /* bx_scale_mode (0 for a norm) */
  BX_AGREE_ITEMS
} bx_agree_item;

#define BX_CALL_NORM 1
#define BX_CALL_CLIP 2

#define BX_AGREE_W_OFFENDER (2 * BX_AGREE_ITEMS)
#define BX_AGREE_W_FAILURE (BX_AGREE_W_OFFENDER + 1)
#define BX_AGREE_W_FAILURE_AT (BX_AGREE_W_OFFENDER + 2)
#define BX_AGREE_W_DTYPES (BX_AGREE_W_OFFENDER + 3)
#define BX_AGREE_WORDS (BX_AGREE_W_DTYPES + BX_DT_COUNT)

/* What each item is called in a mismatch message. */
static inline const char *bx_agree_name(int item) {
  static const char *const names[BX_AGREE_ITEMS] = {
      "the accumulator format (bitexact build)",
      "the call (a norm on some ranks, a clip on others)",
      "the number of groups",
      "norm_type",
      "flavor",
      "error_if_nonfinite",
      "norm_dtype",
      "max_norm",
      "eps",
      "the coefficient formula",
      "the scale mode"};
  return item >= 0 && item < BX_AGREE_ITEMS ? names[item] : "?";
}

/* A failure key: MAX selects the lowest failing rank; the status rides in
 * the low byte. -1 when st is 0 (BX_OK). */
static inline BX_HD int64_t bx_agree_failure_key(int rank, int st) {
  if (st == 0) return -1;
  int64_t r = rank < 0 ? 0 : rank > 0xFFFFFF ? 0xFFFFFF : rank;
  return ((0xFFFFFF - r) << 8) | (int64_t)(st & 0xFF);
}
static inline BX_HD int bx_agree_failure_status(int64_t key) { return (int)(key & 0xFF); }
static inline BX_HD int bx_agree_failure_rank(int64_t key) { return 0xFFFFFF - (int)(key >> 8); }

/* This rank's words: items (v, ~v), the offender, failure and failure
 * location keys, and its dtype mask (bit d: a tensor of dtype d). */
static inline BX_HD void bx_agree_fill(int64_t *w, const int64_t *items, int64_t offender,
                                       int64_t failure, int64_t failure_at, unsigned dtypes) {
  for (int i = 0; i < BX_AGREE_ITEMS; i++) {
    w[2 * i] = items[i];
    w[2 * i + 1] = ~items[i];
  }
  w[BX_AGREE_W_OFFENDER] = offender;
  w[BX_AGREE_W_FAILURE] = failure;
  w[BX_AGREE_W_FAILURE_AT] = failure < 0 ? -1 : failure_at;
  for (int d = 0; d < BX_DT_COUNT; d++) w[BX_AGREE_W_DTYPES + d] = (dtypes >> d) & 1;
}

/* After the MAX all-reduce: the first item the ranks disagree on, or -1. */
static inline BX_HD int bx_agree_mismatch(const int64_t *w) {
  for (int i = 0; i < BX_AGREE_ITEMS; i++)
    if (w[2 * i] != ~w[2 * i + 1]) return i;
  return -1;
}

/* After the MAX all-reduce: the dtype mask of all ranks together. */
static inline BX_HD unsigned bx_agree_dtypes(const int64_t *w) {
  unsigned m = 0;
  for (int d = 0; d < BX_DT_COUNT; d++) m |= (w[BX_AGREE_W_DTYPES + d] != 0 ? 1u : 0u) << d;
  return m;
}

#endif /* BX_AGREE_H */
