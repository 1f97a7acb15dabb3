/*
 * checks.h — comparisons many tests share: an accumulator built by the
 * library against the MPFR reference (every ISA, bit for bit), reference
 * norms of tensor sets, and powers-of-two element sets whose sum of squares
 * is any chosen binary number (ties, near-ties).
 */
#ifndef BX_TEST_CHECKS_H
#define BX_TEST_CHECKS_H

#include "util.h"

/* Accumulates xs[0..count) with bx_acc_add_squares and with bx_acc_add_abs
 * under every ISA this CPU has, and checks bx_acc_value, bx_acc_sqrt,
 * bx_acc_valuef, bx_acc_sqrtf, the counters, the version word and the
 * normalised form against the reference. Returns the number of failed
 * checks. */
int bxt_check_acc(const char *what, bxt_tensor *xs, size_t count);

/* bxt_check_acc on n doubles stored in dtype dt (they must be exact there). */
void bxt_check_values(const char *what, int dt, const double *v, size_t n);

/* Checks one accumulator's outputs against an exact sum. */
int bxt_check_acc_vs(const char *what, const bx_acc *acc, const ref_sum *want);

/* Reference norms over tensor pointers (any element order):
 * p in {2, 1, 0, INFINITY, -INFINITY}; NaN anywhere -> NaN; otherwise for
 * p > 0 any Inf -> +Inf; p = 0 counts Inf as non-zero; p = -inf takes
 * min |x| with Inf as a value (+Inf when there are no elements). Other p:
 * NaN or Inf as above, else NaN (no exact reference). */
double bxt_ref_norm(bxt_tensor *const *xs, size_t count, double p);

/* Megatron-LM's reproducible fp32 norm, from its definition: each element
 * to fp32 (nearest even), its square rounded to fp32, the fp32 squares
 * summed exactly, that sum rounded once to fp32, then a correctly rounded
 * fp32 sqrt; returned widened to double. NaN -> NaN; an Inf element or an
 * Inf fp32 square -> +Inf. */
double bxt_ref_megatron(bxt_tensor *const *xs, size_t count);

/* Elements (powers of two) whose squares sum to sum_j 2^pos[j], where pos
 * lists distinct bit positions: an even position 2k gives one element 2^k,
 * an odd one 2k+1 two elements 2^k. Returns the number written (at most
 * 2 * npos). */
size_t bxt_pow2_square_terms(const int *pos, size_t npos, double *out);

/* The set bit positions of v * 2^shift (v a 128-bit integer), lowest
 * first; returns how many. */
size_t bxt_bit_positions(unsigned __int128 v, int shift, int *pos);

/* A tensor of dtype dt holding the given doubles, which must be exact in
 * dt (checked through ref_encode). */
void bxt_tensor_from(bxt_tensor *x, int dt, const double *v, size_t n);

/* ---- scaling references ----------------------------------------------
 * BX_SCALE_TORCH as the header documents it, written independently:
 * c32 = (float)coef; fp32 g = fl32(g * c32); bf16/fp16 g =
 * round_to_dtype(fl32((float)g * c32)); fp64 g = fl64(g * coef).
 * BX_SCALE_EXACT: the exact product rounded once to the dtype (MPFR). */
uint64_t bxt_torch_scale_bits(int dt, uint64_t g, double coef);
uint64_t bxt_exact_scale_bits(int dt, uint64_t g, double coef);
/* Compares after[i] with the formula applied to before[i] for every i.
 * NaN results compare as "is NaN" (payloads are not promised); a zero
 * result's sign is compared only with strict_zero_sign. Returns the number
 * of differing elements. */
int bxt_check_scaled(const char *what, const bxt_tensor *before, const bxt_tensor *after,
                     double coef, bx_scale_mode mode, int strict_zero_sign);

#endif /* BX_TEST_CHECKS_H */

/* ---- tensors arranged into groups (norm, clip and invariance tests) -- */
#define BXT_MAX_TENSORS 64
#define BXT_MAX_GROUPS 8
typedef struct bxt_layout {
  DLTensor dl[BXT_MAX_TENSORS];     /* views, grouped contiguously */
  bxt_tensor *src[BXT_MAX_TENSORS]; /* the tensor behind dl[i] */
  size_t n;
  bx_group groups[BXT_MAX_GROUPS];
  size_t ngroups;
} bxt_layout;

/* The tensors in a random order, split into ngroups groups of random sizes
 * (empty groups allowed unless no_empty). */
void bxt_layout_random(bxt_rng *r, bxt_layout *l, bxt_tensor *xs, size_t n, size_t ngroups,
                       int no_empty);
/* The tensors in their order, one group. */
void bxt_layout_single(bxt_layout *l, bxt_tensor *xs, size_t n);
/* Index in l->dl of group g's first tensor. */
size_t bxt_layout_first(const bxt_layout *l, size_t g);

/* n tensors of random dtypes and lengths (up to max_len; some empty) with
 * mixed fills. */
void bxt_tensors_random(bxt_rng *r, bxt_tensor *xs, size_t n, size_t max_len);
void bxt_tensors_free(bxt_tensor *xs, size_t n);
