/*
 * embedding_hd.h — the arithmetic of bx_embedding_backward's compact chunk
 * partials (src/train/embedding.c; bitexact_train.h states it), once for
 * the CPU and the GPU (BX_HD): the partial row of an id in a chunk is the
 * fp32 sum, from +0, of the rows of dy of that chunk's tokens with that
 * id, tokens ascending, one rounding per addition; the value stored is
 * NaN-canonical. (The forward is a lookup: rows keep their bits.)
 */
#ifndef BX_EMBEDDING_HD_H
#define BX_EMBEDDING_HD_H

#include <stdint.h>

#include "hd.h"
#include "nan_canon.h"

/* One step of a partial: acc + g. */
static inline BX_HD float bx_embedding_add_f32(float acc, float g) { return acc + g; }

/* Column h of the partial over the tokens toks[0..n) (ascending), dy's
 * rows of H values: what one device thread per (segment, column) stores. */
static inline BX_HD float bx_embedding_partial_f32(const float *dy, uint64_t H, const int64_t *toks,
                                                   uint64_t n, uint64_t h) {
  float acc = 0.0f;
  for (uint64_t i = 0; i < n; i++) acc = bx_embedding_add_f32(acc, dy[(uint64_t)toks[i] * H + h]);
  return bx_canon_f32(acc);
}

#endif /* BX_EMBEDDING_HD_H */
