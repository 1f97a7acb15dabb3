/*
 * drive_f32.c — the fp32 sum-of-squares block driver, for every ISA
 * (micro.h): window choice, spikes, NaN/Inf, the integer bins, and the
 * verified windows' state machine. ISA-neutral C, compiled without ISA
 * flags; the arithmetic is the micro-kernels', the proofs exact_grid.h's.
 *
 * Blocks start checked (pass 1, then the narrowest window that takes the
 * block, the next block's pass 1 fused into its loop). On ISAs with a
 * verified window, runs of gradient-like blocks switch to it (verified.h):
 * no pass 1, the inexact flag read once per group of blocks.
 */
#include <string.h>

#include "fpenv.h"
#include "micro.h"
#include "verified.h"

typedef struct f32_ctx {
  const bx_f32_micro *mk;
  bx_acc *acc;
  bx_pending pa, pb; /* units 2^(G-45) and 2^(G-90) */
  bx_bins bins;      /* wide blocks; set up at the first */
  int bins_live;
  int wide; /* blocks that go on to the bins without pass 1 */
  uint32_t split_top; /* the last checked block's bulk max when its spikes were set apart, else 0 */
  int vsplit;         /* the verified windows set spikes apart (verified_split) */
  int nspk;           /* elements in spk */
  float spk[BX_BLOCK_MAX]; /* spikes of verified blocks, summed checked when full */
} f32_ctx;

#define F32_WIDE_RUN 8 /* wide blocks in a row between two passes 1 */

/* x[0..len) into the bins: the micro-kernel's vector part per chunk, then
 * the scalar scatter (bins.h). *sp gets the exponent span seen. */
static void f32_bins_add(f32_ctx *c, const float *x, size_t len, bx_bins_span *sp) {
  bx_bins *b = &c->bins;
  uint32_t idx[BX_BINS_CHUNK] __attribute__((aligned(64)));
  uint64_t val[BX_BINS_CHUNK] __attribute__((aligned(64)));
  for (size_t i = 0; i < len; i += BX_BINS_CHUNK) {
    size_t m = len - i < BX_BINS_CHUNK ? len - i : BX_BINS_CHUNK;
    if (b->room < m) {
      bx_bins_flush(b, c->acc, 2, -300);
      b->room = BX_BINS_F32_ROOM;
    }
    b->room -= m;
    size_t mr = c->mk->bins_prep(x + i, m, idx, val, sp);
    bx_bins_scatter_u64(b, idx, val, mr);
  }
  bx_bins_touch(b, 0, sp->emax); /* bin 0 takes the zeros of a padded chunk */
}

/* x[0..len) into the bins. When a checked block spread this wide lands
 * here its successors probably would too: the next F32_WIDE_RUN blocks
 * skip pass 1 while they stay wider than one three-level window (or hold
 * NaN/Inf). */
static void f32_wide(f32_ctx *c, const float *x, size_t len) {
  if (!c->bins_live) {
    bx_bins_init(&c->bins, BX_BINS_F32_ROOM);
    c->bins_live = 1;
  }
  bx_bins_span sp = {0, 255, 0, 0};
  f32_bins_add(c, x, len, &sp);
  c->bins.nan += sp.nan;
  c->bins.inf += sp.inf;
  int special = sp.nan + sp.inf > 0;
  int ebtop = sp.emax ? (int)sp.emax : 1, ebot = sp.eminnz ? (int)sp.eminnz : 1;
  int fits = sp.eminnz == 255 || ebot >= ebtop - 43;
  if (c->wide) c->wide = special || !fits ? c->wide - 1 : 0;
  else c->wide = fits ? 0 : F32_WIDE_RUN; /* a NaN/Inf alone does not make the next wide */
}

/* A block the verified window may take: finite, two-level wide. */
static int f32_plain(uint32_t top, uint32_t minnz) {
  return top != 0 && top < 0x7F800000u && minnz >= bx_f32_thr(top >> 23 ? (int)(top >> 23) : 1);
}

/* A finite block with max |x| bits top, min non-zero minnz: into c->pa
 * and c->pb, or the bins when no single window takes it (a cascade of
 * masked windows would cost more: each is a full pass). split: spikes may
 * be set apart. nx: the next block's pass 1, done here (returns 1) when
 * the last pass over this block can carry it. */
static int f32_finite(f32_ctx *c, const float *x, size_t len, uint32_t top, uint32_t minnz,
                      int split, bx_f32_next *nx) {
  if (top == 0) return 0;
  const bx_f32_micro *mk = c->mk;
  int ebtop = top >> 23 ? (int)(top >> 23) : 1, g = bx_f32_g(ebtop);
  bx_f32_next *fuse = nx && nx->y && len == mk->block ? nx : NULL;
  bx_i128 v1, v2;
  if (minnz >= bx_f32_thr(ebtop)) { /* two levels */
    bx_pend_add(&c->pa, c->acc, mk->window2(x, len, g, fuse), g - 45);
    return fuse != NULL;
  }
  if (minnz >= bx_f32_thr3(ebtop)) { /* three levels, one pass */
    mk->window3(x, len, g, fuse, &v1, &v2);
    bx_pend_add(&c->pa, c->acc, v1, g - 45);
    bx_pend_add(&c->pb, c->acc, v2, g - 90);
    return fuse != NULL;
  }
  if (split) { /* a few spikes above the bulk: each part in its own window */
    float spikes[BX_F32_SPIKES], bulk[BX_BLOCK_MAX + BX_BLOCK_PAD];
    uint32_t rest;
    int k = mk->split(x, len, bx_f32_thr(ebtop), spikes, bulk, &rest);
    if (k >= 0) {
      bx_pend_add(&c->pa, c->acc, mk->window2(spikes, (size_t)k, g, NULL), g - 45);
      c->split_top = f32_plain(rest, minnz) ? rest : 0;
      return f32_finite(c, bulk, len, rest, minnz, 0, nx);
    }
  }
  f32_wide(c, x, len);
  return 0;
}

/* One block whose pass-1 results are nx->amax/aminnz; nx->y is the next
 * block (block elements) or NULL. On return nx holds the next block's
 * pass-1 results. */
static void f32_block(f32_ctx *c, const float *x, size_t len, bx_f32_next *nx) {
  uint32_t top = nx->amax, minnz = nx->aminnz;
  int fused = 0;
  float specials[BX_F32_SPIKES], finite[BX_BLOCK_MAX + BX_BLOCK_PAD];
  if (top >= 0x7F800000u) { /* a few NaN/Inf: counted, set apart like spikes */
    int k = c->mk->split(x, len, 0x7F800000u, specials, finite, &top);
    if (k < 0) {
      f32_wide(c, x, len);
      goto next;
    }
    for (int j = 0; j < k; j++) {
      uint32_t b;
      memcpy(&b, &specials[j], 4);
      if (b & 0x7FFFFF) c->acc->nan_count++;
      else c->acc->inf_count++;
    }
    x = finite; /* the rest, with zeros in their places */
    if (minnz >= 0x7F800000u) minnz = 0;
  }
  if (bx_f32_too_wide(top, minnz)) f32_wide(c, x, len); /* too wide even for a split */
  else fused = f32_finite(c, x, len, top, minnz, 1, nx);
next:
  if (nx->y && !fused) c->mk->stats(nx->y, c->mk->block, &nx->amax, &nx->aminnz);
}

/* ---- the verified windows (verified.h decides when) -------------------- */

/* The next block's G from this one's largest hi lane: that lane near
 * 2^46 of the 2^51 its binade holds (a guess; the check decides). */
static int f32_adapt(int g, int64_t hmax) {
  int lg = hmax > 0 ? 63 - __builtin_clzll((uint64_t)hmax) : 0;
  if (lg > 48 || lg < 44) g += lg - 46;
  return g < -300 ? -300 : g > 212 ? 212 : g;
}

/* The spikes a verified_split window of G sets apart: |x| >=
 * 2^floor((G+48)/2), x^2 >= 2^(G+47), NaN/Inf included. From a bulk whose
 * max has biased exponent e (G = 2e - 296) these are x >= 2^(e-124): 8
 * times the bulk's binade and more. Only speed depends on it. */
static uint32_t f32_spike_thr(int g) {
  int e = (g + 648) / 2 - 300 + 127; /* g + 648 > 0: the division floors */
  return e >= 255 ? 0x7F800000u : (uint32_t)(e < 1 ? 1 : e) << 23;
}

/* The spikes gathered from verified blocks, summed as one checked block
 * (any spread, NaN/Inf counted). The checked windows raise PE: the flags
 * are cleared after them. The driver's state is kept. */
static void f32_spikes_flush(f32_ctx *c) {
  if (!c->nspk) return;
  int wide = c->wide;
  uint32_t st = c->split_top;
  bx_f32_next one = {NULL, 0, 0};
  c->mk->stats(c->spk, (size_t)c->nspk, &one.amax, &one.aminnz);
  f32_block(c, c->spk, (size_t)c->nspk, &one);
  c->wide = wide;
  c->split_top = st;
  c->nspk = 0;
  bx_fpenv_clear_flags();
}

static void f32_spikes_add(f32_ctx *c, const float *s, int k) {
  if ((size_t)(c->nspk + k) > c->mk->block) f32_spikes_flush(c);
  memcpy(c->spk + c->nspk, s, (size_t)k * sizeof *s);
  c->nspk += k;
}

/* gsz full blocks at x through the verified window of *g (with the spikes
 * set apart when c->vsplit), one read of the flags; blocks that fail are
 * redone checked. */
static void f32_verified_group(f32_ctx *c, bx_vrun *vr, int *g, const float *x, int gsz) {
  const bx_f32_micro *mk = c->mk;
  bx_i128 v[BX_V_GROUP] = {0}; /* (read into dep even for a failed block) */
  int gs[BX_V_GROUP], ok[BX_V_GROUP], ns[BX_V_GROUP] = {0}, failed = 0;
  float sp[BX_V_GROUP][BX_F32_SPIKES];
  uint64_t dep = 0; /* orders the flag read after the windows */
  for (int k = 0; k < gsz; k++) {
    int64_t hmax = 0;
    const float *b = x + (size_t)k * mk->block;
    gs[k] = *g;
    ok[k] = c->vsplit ? mk->verified_split(b, *g, f32_spike_thr(*g), sp[k], &ns[k], &v[k], &hmax)
                      : mk->verified(b, *g, &v[k], &hmax);
    if (ok[k]) *g = f32_adapt(*g, hmax);
    dep += (uint64_t)hmax + (uint64_t)v[k];
  }
  if (bx_fpenv_inexact(dep)) /* some block was not exact */
    for (int k = 0; k < gsz; k++) ok[k] = 0;
  for (int k = 0; k < gsz; k++) {
    const float *b = x + (size_t)k * mk->block;
    if (ok[k]) {
      bx_pend_add(&c->pa, c->acc, v[k], gs[k] - 45);
      if (ns[k]) f32_spikes_add(c, sp[k], ns[k]);
      bx_vrun_good(vr);
      continue;
    }
    bx_f32_next one = {NULL, 0, 0};
    mk->stats(b, mk->block, &one.amax, &one.aminnz);
    f32_block(c, b, mk->block, &one);
    failed = 1;
    bx_vrun_bad(vr);
  }
  if (failed) bx_fpenv_clear_flags(); /* the checked windows set PE */
  bx_vrun_group_done(vr, failed, c->wide);
}

/* Checked blocks, then (verified.h) runs of verified ones with G guessed
 * from the lanes before (f32_adapt). Blocks no window takes go to the
 * bins at once (their data in L1), and while they keep coming (spread,
 * not NaN/Inf) the next ones skip pass 1. */
void bx_drive_sumsq_f32(const bx_f32_micro *mk, const float *x, size_t n, bx_acc *acc) {
  const size_t bs = mk->block;
  f32_ctx c;
  c.mk = mk;
  c.acc = acc;
  c.pa = c.pb = (bx_pending){0, 0, 0};
  c.bins_live = c.wide = 0;
  c.split_top = 0;
  c.vsplit = c.nspk = 0;
  size_t i = 0, len = bs; /* the first block ends on a 64-byte boundary */
  if (((uintptr_t)x & 3) == 0) len -= ((uintptr_t)x >> 2) & 15;
  if (len > n) len = n;
  bx_vrun vr;
  bx_vrun_init(&vr);
  int g = 0, have = 0; /* have: nx holds the pass 1 of the block at i */
  bx_f32_next nx = {NULL, 0, 0};
  while (i < n) {
    if (vr.on && len == bs && n - i >= bs) {
      int gsz = bx_vrun_group(&vr, (n - i) / bs);
      f32_verified_group(&c, &vr, &g, x + i, gsz);
      have = 0;
      i += (size_t)gsz * bs;
      len = n - i < bs ? n - i : bs;
      continue;
    }
    size_t nlen = n - (i + len) < bs ? n - (i + len) : bs;
    if (c.wide) { /* straight to the bins */
      f32_wide(&c, x + i, len);
      have = 0;
      vr.streak = 0;
      i += len;
      len = nlen;
      continue;
    }
    /* checked block at i, len elements. A plain one may start the verified
     * windows (decided first: its window then does not fuse the next pass
     * 1); one whose few spikes were set apart from a plain bulk may start
     * those that set spikes apart (known only after it). */
    if (!have) mk->stats(x + i, len, &nx.amax, &nx.aminnz);
    int plain = f32_plain(nx.amax, nx.aminnz), can = mk->verified && len == bs, go = 0;
    if (plain) go = bx_vrun_checked(&vr, 1, can);
    nx.y = !go && nlen == bs ? x + i + len : NULL; /* fuse the next pass 1 */
    if (go) {
      g = bx_f32_g(nx.amax >> 23 ? (int)(nx.amax >> 23) : 1);
      c.vsplit = 0;
    }
    c.split_top = 0;
    f32_block(&c, x + i, len, &nx);
    if (!plain) {
      go = bx_vrun_checked(&vr, c.split_top != 0 && !c.wide, can && mk->verified_split);
      if (go) {
        g = bx_f32_g(c.split_top >> 23 ? (int)(c.split_top >> 23) : 1);
        c.vsplit = 1;
      }
    }
    have = nx.y != NULL && !c.wide;
    if (go) bx_fpenv_clear_flags(); /* the checked windows leave PE set */
    i += len;
    len = nlen;
  }
  f32_spikes_flush(&c);
  if (c.bins_live) bx_bins_done(&c.bins, acc, 2, -300);
  bx_pend_flush(&c.pa, acc);
  bx_pend_flush(&c.pb, acc);
  acc->count += (int64_t)n;
}
