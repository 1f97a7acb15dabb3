/*
 * bins.h — per-exponent integer bins: the exact fallback of every kernel
 * (portable.c's scalar kernels, and the vector kernels' path for blocks no
 * window takes: NaN/Inf, exponents spread too wide).
 *
 * An element x = m 2^(k e + c) (integer significand m, exponent field e)
 * adds m^2 to bin e; a bin is deposited into the accumulator at 2^(2(k e
 * + c)) before it can overflow. No floating point: exact by construction.
 * Subnormals (e = 0) keep their own bin, deposited with the weight of
 * e = 1; the hidden bit comes from a table indexed by e (or a vector
 * mask), not from a branch. Four tables, element j of each group of four into table j mod
 * 4: updates of one bin by neighbouring elements (gradients crowd a few
 * exponents) do not wait for each other's store. NaN/Inf (e all ones)
 * are counted, not binned.
 *
 * Capacity: each table takes at most a quarter (plus one) of the elements
 * added since the last flush, so `room` elements of squares below 2^B
 * keep the four-table sum of a bin below 4 * (room/4 + 1) * 2^B: fp32
 * (B = 48) flushes every 2^15 elements, smaller formats never within one
 * kernel call (n <= BX_CHUNK = 2^22: 2^22 * 2^22 < 2^63 for fp16).
 */
#ifndef BX_BINS_H
#define BX_BINS_H

#include <stdint.h>
#include <string.h>

#include "kernels.h"

typedef struct bx_bins {
  uint64_t bin[4][256];
  uint32_t elo, ehi; /* exponent fields touched since the last flush; elo > ehi: none */
  size_t room;       /* elements that may still be added before a flush */
  int64_t nan, inf;
} bx_bins;

#define BX_BINS_F32_ROOM ((size_t)1 << 15)

static inline void bx_bins_init(bx_bins *b, size_t room) {
  memset(b->bin, 0, sizeof b->bin);
  b->elo = 256;
  b->ehi = 0;
  b->room = room;
  b->nan = b->inf = 0;
}

/* Deposit and clear the touched bins: bin e holds significand products at
 * 2^(step * max(e, 1) + exp0). Keeps nan/inf (bx_bins_done adds them). */
static inline void bx_bins_flush(bx_bins *b, bx_acc *acc, int step, int exp0) {
  for (uint32_t e = b->elo; e <= b->ehi; e++) {
    uint64_t s = b->bin[0][e] + b->bin[1][e] + b->bin[2][e] + b->bin[3][e];
    if (s) bx_acc_deposit_u64(acc, s, step * (int)(e ? e : 1) + exp0);
    b->bin[0][e] = b->bin[1][e] = b->bin[2][e] = b->bin[3][e] = 0;
  }
  b->elo = 256;
  b->ehi = 0;
}

static inline void bx_bins_done(bx_bins *b, bx_acc *acc, int step, int exp0) {
  bx_bins_flush(b, acc, step, exp0);
  acc->nan_count += b->nan;
  acc->inf_count += b->inf;
  b->nan = b->inf = 0;
}

/* Exponent range [lo, hi] about to be touched. */
static inline void bx_bins_touch(bx_bins *b, uint32_t lo, uint32_t hi) {
  if (lo < b->elo) b->elo = lo;
  if (hi > b->ehi) b->ehi = hi;
}

#endif /* BX_BINS_H */
