/*
 * bins.h — per-exponent integer bins: the exact fallback of every kernel
 * (portable.c's scalar kernels, and the block drivers' path for blocks no
 * window takes: NaN/Inf, exponents spread too wide).
 *
 * An element x = m 2^(k e + c) (integer significand m, exponent field e)
 * adds m^2 to bin e; a bin is deposited into the accumulator at 2^(2(k e
 * + c)) before it can overflow. No floating point: exact by construction.
 * Subnormals (e = 0) keep their own bin, deposited with the weight of
 * e = 1; the hidden bit comes from a table indexed by e (or a vector
 * mask), not from a branch. Four tables, element j of each group of four
 * into table j mod 4: updates of one bin by neighbouring elements
 * (gradients crowd a few exponents) do not wait for each other's store.
 * NaN/Inf (e all ones) are counted, not binned.
 *
 * Capacity: each table takes at most a quarter (plus one) of the elements
 * added since the last flush, so `room` elements of squares below 2^B
 * keep the four-table sum of a bin below 4 * (room/4 + 1) * 2^B: fp32
 * (B = 48) flushes every 2^15 elements, smaller formats never within one
 * kernel call (n <= BX_CHUNK = 2^22: 2^22 * 2^22 < 2^63 for fp16).
 *
 * fp64 (bx_bins_f64): one table of 128-bit bins, m^2 < 2^106, flushed
 * every 2^21 elements (2^21 * 2^106 < 2^128); only the range of bins
 * touched is cleared and flushed (all 2048 would cost 32 KiB a call).
 */
#ifndef BX_BINS_H
#define BX_BINS_H

#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "prefetch.h"

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

/* ---- the scalar half of the vector kernels' bins ------------------------
 * A micro-kernel (micro.h: bins_prep) has turned a chunk of elements into
 * exponent fields idx[] and significand products val[] (padding with
 * zeros to its vector width, so m is a multiple of 4); these add them,
 * element j into table j mod 4. The data are in L1: no prefetch. */
#define BX_BINS_CHUNK 256 /* elements per bins_prep call, at most */

static inline void bx_bins_scatter_u64(bx_bins *b, const uint32_t *idx, const uint64_t *val, size_t m) {
  for (size_t j = 0; j < m; j += 4) {
    b->bin[0][idx[j]] += val[j];
    b->bin[1][idx[j + 1]] += val[j + 1];
    b->bin[2][idx[j + 2]] += val[j + 2];
    b->bin[3][idx[j + 3]] += val[j + 3];
  }
}

static inline void bx_bins_scatter_u16(bx_bins *b, const uint16_t *idx, const uint16_t *val, size_t m) {
  for (size_t j = 0; j < m; j += 4) {
    b->bin[0][idx[j]] += val[j];
    b->bin[1][idx[j + 1]] += val[j + 1];
    b->bin[2][idx[j + 2]] += val[j + 2];
    b->bin[3][idx[j + 3]] += val[j + 3];
  }
}

/* ---- fp64: x = m 2^(e - 1075), m < 2^53, 128-bit bins ------------------ */
typedef unsigned __int128 bx_u128bin;

#define BX_BINS_F64_ROOM ((size_t)1 << 21)

typedef struct bx_bins_f64 {
  bx_u128bin bin[2048];
  int lo, hi;  /* touched range; lo > hi when empty */
  size_t room; /* elements that may still be added before a flush */
  int64_t nan, inf;
} bx_bins_f64;

static inline void bx_bins_f64_init(bx_bins_f64 *b) {
  b->lo = 1;
  b->hi = 0;
  b->room = BX_BINS_F64_ROOM;
  b->nan = b->inf = 0;
}

static inline void bx_bins_f64_touch(bx_bins_f64 *b, int e) {
  if (b->lo > b->hi) {
    b->bin[e] = 0;
    b->lo = b->hi = e;
  } else if (e < b->lo) {
    memset(&b->bin[e], 0, (size_t)(b->lo - e) * sizeof(bx_u128bin));
    b->lo = e;
  } else if (e > b->hi) {
    memset(&b->bin[b->hi + 1], 0, (size_t)(e - b->hi) * sizeof(bx_u128bin));
    b->hi = e;
  }
}

/* Deposit the touched bins (bin e at 2^(exp0 + step e)) and empty them. */
static inline void bx_bins_f64_flush(bx_bins_f64 *b, bx_acc *acc, int exp0, int step) {
  for (int e = b->lo; e <= b->hi; e++)
    if (b->bin[e]) {
      int exp = exp0 + step * e;
      bx_acc_deposit_u64(acc, (uint64_t)b->bin[e], exp);
      bx_acc_deposit_u64(acc, (uint64_t)(b->bin[e] >> 64), exp + 64);
    }
  b->lo = 1;
  b->hi = 0;
  b->room = BX_BINS_F64_ROOM;
}

/* Bins m^2 (squares) or m of every element of x[0..n) whose |x| bits are
 * below upper; NaN/Inf are counted when upper lies above them. n <= room
 * (the caller flushes first). */
static inline void bx_bins_f64_add(bx_bins_f64 *b, const double *x, size_t n, uint64_t upper,
                                   int squares) {
  int lo = b->lo, hi = b->hi;
  for (size_t i = 0; i < n; i++) {
    if ((i & 7) == 0) bx_prefetch_line(x + i); /* every 64 bytes */
    uint64_t bits;
    memcpy(&bits, &x[i], 8);
    if ((bits & 0x7FFFFFFFFFFFFFFFull) >= upper) continue;
    int e = (int)((bits >> 52) & 0x7FF);
    uint64_t m = bits & ((1ull << 52) - 1);
    if (e == 0x7FF) {
      if (m) b->nan++;
      else b->inf++;
      continue;
    }
    if (e) m |= 1ull << 52;
    else e = 1;
    if (!m) continue;
    if (e < lo || e > hi) {
      b->lo = lo;
      b->hi = hi;
      bx_bins_f64_touch(b, e);
      lo = b->lo;
      hi = b->hi;
    }
    b->bin[e] += squares ? (bx_u128bin)m * m : (bx_u128bin)m;
  }
  b->lo = lo;
  b->hi = hi;
  b->room -= n;
}

#endif /* BX_BINS_H */
