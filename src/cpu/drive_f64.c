/*
 * drive_f64.c — the fp64 sum-of-squares block driver, for every ISA
 * (micro.h). ISA-neutral C, compiled without ISA flags; the arithmetic is
 * the micro-kernels', the proofs exact_grid.h's (PER DTYPE, fp64).
 *
 * Per block: pass 1 (max and min non-zero |x|, the bucket bitmap), then
 * one window without masks when every element fits it (gradients; the
 * next block's pass 1 runs in its loop), else a cascade of masked
 * windows, each anchored at the max of what the ones before left.
 * Blocks with NaN/Inf or spread over more than BX_F64_BUCKETS buckets go
 * to the 128-bit integer bins (bins.h) at once, while the block is in L1,
 * and so does what a cascade of BX_F64_WINDOWS windows leaves. The bins
 * live for the whole call: one flush per 2^21 elements, never a second
 * read of the data (data spread over the whole range cost the scalar
 * kernel's time plus a re-read and a flush of 2046 bins per 2^15
 * elements before).
 */
#include "micro.h"

void bx_drive_sumsq_f64(const bx_f64_micro *mk, const double *x, size_t n, bx_acc *acc) {
  const size_t bs = mk->block;
  bx_pending pend[4] = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
  bx_bins_f64 bins;
  int bins_live = 0, have = 0; /* have: nx.st holds the pass 1 of the block at i */
  bx_f64_next nx = {NULL, {0, 0, 0}};
  size_t i = 0, len = bs; /* the first block ends on a 64-byte boundary */
  if (((uintptr_t)x & 7) == 0) len -= ((uintptr_t)x >> 3) & 7;
  if (len > n) len = n;
  while (i < n) {
    const double *b = x + i;
    size_t nlen = n - (i + len) < bs ? n - (i + len) : bs;
    bx_f64_stats st;
    if (have) st = nx.st;
    else mk->stats(b, len, &st);
    nx.y = nlen == bs ? b + len : NULL; /* the next block's pass 1, fused if it can be */
    int fused = 0;
    /* every |x| bits of a finite block are below upper */
    uint64_t upper = 0x7FF0000000000000ull, rest_below = 0, amax = st.amax;
    if (amax >= 0x7FF0000000000000ull || __builtin_popcountll(st.buckets) > BX_F64_BUCKETS) {
      rest_below = UINT64_MAX; /* the whole block, NaN/Inf counted */
    } else {
      for (int w = 0; amax != 0; w++) {
        if (w == BX_F64_WINDOWS) {
          rest_below = upper;
          break;
        }
        int sc;
        uint64_t thr = bx_f64_window(amax, &sc), rest = 0;
        bx_i128 vp, vr;
        if (w == 0 && st.aminnz >= thr) { /* the whole block in one window: no masks */
          int fuse = nx.y && len == bs; /* its loop covers the next block: both full */
          mk->window_all(b, len, sc, fuse ? &nx : NULL, &vp, &vr);
          fused = fuse;
        } else {
          mk->window(b, len, sc, thr, upper, &rest, &vp, &vr);
        }
        bx_pend_add(&pend[w ? 2 : 0], acc, vp, -89 - 2 * sc);
        bx_pend_add(&pend[w ? 3 : 1], acc, vr, -143 - 2 * sc);
        upper = thr;
        amax = rest;
      }
    }
    if (rest_below) {
      if (!bins_live) {
        bx_bins_f64_init(&bins);
        bins_live = 1;
      }
      if (bins.room < len) bx_bins_f64_flush(&bins, acc, -2150, 2);
      if (rest_below == UINT64_MAX) bx_bins_f64_add(&bins, b, len, UINT64_MAX, 1); /* no compare */
      else bx_bins_f64_add(&bins, b, len, rest_below, 1);
    }
    if (nx.y && !fused) mk->stats(nx.y, bs, &nx.st);
    have = nx.y != NULL;
    i += len;
    len = nlen;
  }
  if (bins_live) {
    bx_bins_f64_flush(&bins, acc, -2150, 2);
    acc->nan_count += bins.nan;
    acc->inf_count += bins.inf;
  }
  for (int k = 0; k < 4; k++) bx_pend_flush(&pend[k], acc);
  acc->count += (int64_t)n;
}
