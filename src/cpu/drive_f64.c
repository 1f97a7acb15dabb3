/*
 * drive_f64.c — the fp64 sum-of-squares block driver, for every ISA
 * (micro.h). ISA-neutral C, compiled without ISA flags; the arithmetic is
 * the micro-kernels', the proofs exact_grid.h's (PER DTYPE, fp64; VERIFIED
 * WINDOWS).
 *
 * Checked blocks: pass 1 (max and min non-zero |x|, the bucket bitmap),
 * then one window without masks when every element fits it (gradients;
 * the next block's pass 1 runs in its loop), else a cascade of masked
 * windows, each anchored at the max of what the ones before left. Blocks
 * with NaN/Inf or spread over more than BX_F64_BUCKETS buckets go to the
 * 128-bit integer bins (bins.h) at once, while the block is in L1, and so
 * does what a cascade of BX_F64_WINDOWS windows leaves. The bins live for
 * the whole call: one flush per 2^21 elements, never a second read of the
 * data. On ISAs with a verified window, runs of gradient-like blocks
 * switch to it (verified.h): no pass 1, the scale guessed from the lanes
 * before, the inexact flag read once per group of blocks.
 */
#include "fpenv.h"
#include "micro.h"
#include "verified.h"

typedef struct f64_ctx {
  const bx_f64_micro *mk;
  bx_acc *acc;
  bx_pending pend[4]; /* first window: p, r; later windows: p, r */
  bx_bins_f64 bins;   /* set up at the first block that needs them */
  int bins_live;
} f64_ctx;

/* The elements of b[0..len) whose |x| bits are below upper (all, NaN/Inf
 * counted, for UINT64_MAX) into the bins. A function of its own: the
 * streaming loop dev/check_prefetch.sh finds by name. */
__attribute__((noinline)) static void f64_bins(f64_ctx *c, const double *b, size_t len, uint64_t upper) {
  if (!c->bins_live) {
    bx_bins_f64_init(&c->bins);
    c->bins_live = 1;
  }
  if (c->bins.room < len) bx_bins_f64_flush(&c->bins, c->acc, -2150, 2);
  if (upper == UINT64_MAX) bx_bins_f64_add(&c->bins, b, len, UINT64_MAX, 1); /* no compare */
  else bx_bins_f64_add(&c->bins, b, len, upper, 1);
}

/* A checked block with pass-1 results st; nx->y is the next block (full)
 * or NULL. Returns 1 if nx->st now holds the next block's pass 1 (fused
 * into the unmasked window's loop, which needs both blocks full). */
static int f64_block(f64_ctx *c, const double *b, size_t len, const bx_f64_stats *st, bx_f64_next *nx) {
  const bx_f64_micro *mk = c->mk;
  uint64_t upper = 0x7FF0000000000000ull, amax = st->amax; /* a finite block's |x| bits are below */
  if (amax >= 0x7FF0000000000000ull || __builtin_popcountll(st->buckets) > BX_F64_BUCKETS) {
    f64_bins(c, b, len, UINT64_MAX);
    return 0;
  }
  int fused = 0;
  for (int w = 0; amax != 0; w++) {
    if (w == BX_F64_WINDOWS) {
      f64_bins(c, b, len, upper);
      break;
    }
    int sc;
    uint64_t thr = bx_f64_window(amax, &sc), rest = 0;
    bx_i128 vp, vr;
    if (w == 0 && st->aminnz >= thr) { /* the whole block in one window: no masks */
      int fuse = nx->y && len == mk->block;
      mk->window_all(b, len, sc, fuse ? nx : NULL, &vp, &vr);
      fused = fuse;
    } else {
      mk->window(b, len, sc, thr, upper, &rest, &vp, &vr);
    }
    bx_pend_add(&c->pend[w ? 2 : 0], c->acc, vp, -89 - 2 * sc);
    bx_pend_add(&c->pend[w ? 3 : 1], c->acc, vr, -143 - 2 * sc);
    upper = thr;
    amax = rest;
  }
  return fused;
}

/* A block the verified window may take: finite, narrow, one window. */
static int f64_plain(const bx_f64_stats *st) {
  int sc;
  return st->amax != 0 && st->amax < 0x7FF0000000000000ull && __builtin_popcountll(st->buckets) <= BX_F64_BUCKETS &&
         st->aminnz >= bx_f64_window(st->amax, &sc);
}

/* The next block's scale from this one's largest hp lane (units 2^-43):
 * keep it near 2^46 of the 2^51 its binade holds; each step of the scale
 * moves the squares by 4 (a guess; the check decides). */
static int f64_adapt(int sc, int64_t hmax) {
  int lg = hmax > 0 ? 63 - __builtin_clzll((uint64_t)hmax) : 0;
  if (lg > 48) sc -= (lg - 45) / 2;
  if (lg < 44) sc += (47 - lg) / 2;
  return sc < -1000 ? -1000 : sc > 1000 ? 1000 : sc;
}

/* gsz full blocks at x through the verified window of scale *sc, one read
 * of the flags; blocks that fail are redone checked. */
static void f64_verified_group(f64_ctx *c, bx_vrun *vrun, int *sc, const double *x, int gsz) {
  const bx_f64_micro *mk = c->mk;
  bx_i128 vp[BX_V_GROUP] = {0}, vr[BX_V_GROUP] = {0}; /* (read into dep even for a failed block) */
  int scs[BX_V_GROUP], ok[BX_V_GROUP], failed = 0;
  uint64_t dep = 0; /* orders the flag read after the windows */
  for (int k = 0; k < gsz; k++) {
    int64_t hmax = 0;
    scs[k] = *sc;
    ok[k] = mk->verified(x + (size_t)k * mk->block, *sc, &vp[k], &vr[k], &hmax);
    if (ok[k]) *sc = f64_adapt(*sc, hmax);
    dep += (uint64_t)hmax + (uint64_t)vp[k] + (uint64_t)vr[k];
  }
  if (bx_fpenv_inexact(dep)) /* some block was not exact */
    for (int k = 0; k < gsz; k++) ok[k] = 0;
  for (int k = 0; k < gsz; k++) {
    const double *b = x + (size_t)k * mk->block;
    if (ok[k]) {
      bx_pend_add(&c->pend[0], c->acc, vp[k], -89 - 2 * scs[k]);
      bx_pend_add(&c->pend[1], c->acc, vr[k], -143 - 2 * scs[k]);
      bx_vrun_good(vrun);
      continue;
    }
    bx_f64_stats st;
    bx_f64_next none = {NULL, {0, 0, 0}};
    mk->stats(b, mk->block, &st);
    f64_block(c, b, mk->block, &st, &none);
    failed = 1;
    bx_vrun_bad(vrun);
  }
  if (failed) bx_fpenv_clear_flags(); /* the checked windows set PE */
  bx_vrun_group_done(vrun, failed, 0);
}

void bx_drive_sumsq_f64(const bx_f64_micro *mk, const double *x, size_t n, bx_acc *acc) {
  const size_t bs = mk->block;
  f64_ctx c;
  c.mk = mk;
  c.acc = acc;
  for (int k = 0; k < 4; k++) c.pend[k] = (bx_pending){0, 0, 0};
  c.bins_live = 0;
  bx_vrun vrun;
  bx_vrun_init(&vrun);
  int have = 0, sc = 0; /* have: nx.st holds the pass 1 of the block at i */
  bx_f64_next nx = {NULL, {0, 0, 0}};
  size_t i = 0, len = bs; /* the first block ends on a 64-byte boundary */
  if (((uintptr_t)x & 7) == 0) len -= ((uintptr_t)x >> 3) & 7;
  if (len > n) len = n;
  while (i < n) {
    if (vrun.on && len == bs && n - i >= bs) {
      int gsz = bx_vrun_group(&vrun, (n - i) / bs);
      f64_verified_group(&c, &vrun, &sc, x + i, gsz);
      have = 0;
      i += (size_t)gsz * bs;
      len = n - i < bs ? n - i : bs;
      continue;
    }
    const double *b = x + i;
    size_t nlen = n - (i + len) < bs ? n - (i + len) : bs;
    bx_f64_stats st;
    if (have) st = nx.st;
    else mk->stats(b, len, &st);
    int go = bx_vrun_checked(&vrun, f64_plain(&st), mk->verified && len == bs);
    if (go) sc = -(int)(st.amax >> 52) + 1022; /* -floor(log2 max) - 1: the max in [1/2, 1) */
    nx.y = !go && nlen == bs ? b + len : NULL; /* the next block's pass 1, fused if it can be */
    int fused = f64_block(&c, b, len, &st, &nx);
    if (nx.y && !fused) mk->stats(nx.y, bs, &nx.st);
    have = nx.y != NULL;
    if (go) bx_fpenv_clear_flags(); /* the checked windows leave PE set */
    i += len;
    len = nlen;
  }
  if (c.bins_live) {
    bx_bins_f64_flush(&c.bins, acc, -2150, 2);
    acc->nan_count += c.bins.nan;
    acc->inf_count += c.bins.inf;
  }
  for (int k = 0; k < 4; k++) bx_pend_flush(&c.pend[k], acc);
  acc->count += (int64_t)n;
}
