/*
 * tokred_internal.h — the token-reduction state (bitexact_train.h, "Token
 * reduction"), shared by src/train/tokred.c (state, checks, kernels,
 * finish) and src/train/tokred_comm.c (the agreement and the all-reduce).
 *
 * Words of a state (one contiguous int64 array, the wire format):
 *   for each tensor t: numel_t grid words, then 1 non-finite count
 *   then ntensors * nchunks coverage counts (tensor-major)
 * The ordinary mode keeps its fp32 sums aside (fsum) and uses the same
 * words for the non-finite and coverage counts (its grid words stay 0).
 */
#ifndef BX_TOKRED_INTERNAL_H
#define BX_TOKRED_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact_train.h"

struct bx_tokred {
  int mode;
  int agreed;
  size_t ntensors;
  int64_t chunk_tokens, total_tokens, nchunks;
  int64_t *numel;   /* [ntensors] */
  int *ndim;        /* [ntensors] */
  int64_t *shape;   /* concatenated shapes */
  size_t *shape_at; /* [ntensors] start of tensor t's shape in shape[] */
  size_t *word_at;  /* [ntensors] start of tensor t's grid words */
  size_t fsum_total;
  int *bound;       /* [ntensors] E_t */
  int *grid;        /* [ntensors] e_t (after agree) */
  int on_bound;     /* bx_tokred_on_bound */
  int *observed;    /* [ntensors] the largest exponent of a finite addend element added (MAX) */
  int64_t *flagged; /* [ntensors] adds that broke the bound (BX_TOKRED_BOUND_FLAG) */
  int64_t *words;
  size_t nwords;
  size_t cover_at;  /* start of the coverage words */
  float *fsum;      /* ordinary mode: [fsum_total] */
  int64_t *scratch; /* [nwords] bx_tokred_allreduce's copy, kept (peak memory unchanged, no
                       allocation and page faults every step) */
};

#define TOKRED_TAG (0x746B0000LL + BX_TOKRED_FORMAT)

/* For callers in src/train/ that produce partials themselves and add them
 * piece by piece (wgrad.c's bx_linear_wgrad: grid words of tensor t at
 * s->words + s->word_at[t], its non-finite word after them, coverage at
 * s->cover_at + t * nchunks + chunk; grid add: kernels.h's table).
 *
 * bx_tokred_add's checks for (t, chunk) other than the partial's: s not
 * NULL, tensor index, chunk in range, grid agreed. */
bx_status bx_tokred_add_check(const char *fn, const bx_tokred *s, size_t t, int64_t chunk);
/* Undoes the grid kernel's w[i] += q(a[i]) exactly (the scalar rule). */
void bx_tokred_grid_sub(int64_t *w, const float *a, size_t n, double inv_step);
/* f[i] += a[i] in fp32 (the ordinary mode); returns the non-finite count. */
int64_t bx_tokred_plain_add(float *restrict f, const float *restrict a, size_t n);
/* After a grid add to tensor t whose largest finite |bits| was mx (the
 * grid kernel's result): 1 when mx breaks the agreed bound and the state
 * fails such adds (BX_TOKRED_BOUND_FAIL: the caller undoes the add and
 * fails with bx_tokred_bound_fail), else 0. s is only read. */
int bx_tokred_breaks(const bx_tokred *s, size_t t, uint32_t mx);
/* Commits that observation (after the add stands): raises tensor t's
 * observed exponent to mx's and, when mx breaks the bound, counts a
 * flagged add (BX_TOKRED_BOUND_FLAG; the words are then unspecified). */
void bx_tokred_observe(bx_tokred *s, size_t t, uint32_t mx);
/* The BX_EINVAL of bx_tokred_add for a partial a[0..n) of tensor t that
 * breaks the agreed bound (names the first such element). */
bx_status bx_tokred_bound_fail(const char *fn, const bx_tokred *s, size_t t, int64_t chunk,
                               const float *a, size_t n);
/* The same message for element i of value `value` (a partial that is not
 * in host memory: the device found the element). */
bx_status bx_tokred_bound_fail_at(const char *fn, const bx_tokred *s, size_t t, int64_t chunk,
                                  size_t i, float value);
/* w[i] += q[i] modulo 2^64 (the q words of a device's grid kernel). */
void bx_tokred_words_add(int64_t *restrict w, const int64_t *restrict q, size_t n);

#endif /* BX_TOKRED_INTERNAL_H */
