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
  int64_t *words;
  size_t nwords;
  size_t cover_at;  /* start of the coverage words */
  float *fsum;      /* ordinary mode: [fsum_total] */
};

#define TOKRED_TAG (0x746B0000LL + BX_TOKRED_FORMAT)

#endif /* BX_TOKRED_INTERNAL_H */
