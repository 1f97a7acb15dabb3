/*
 * drive_half.c — the bf16 and fp16 sum-of-squares block drivers, for
 * every ISA (micro.h). ISA-neutral C, compiled without ISA flags; the
 * arithmetic is the micro-kernels', the proofs exact_grid.h's.
 *
 * bf16: checked blocks, then verified windows in fp32 lanes (verified.h)
 * or guessed windows in fp64 lanes (no pass 1) while they hold, on ISAs
 * that have them; wide blocks to the integer bins. fp16: one fixed
 * two-level window for everything finite (a block with NaN/Inf is redone
 * by the scalar kernel), and runs of guessed one-level blocks.
 */
#include "fpenv.h"
#include "micro.h"
#include "verified.h"

/* ======================================================================
 * bf16
 * ====================================================================== */

typedef struct bf16_ctx {
  const bx_bf16_micro *mk;
  bx_acc *acc;
  bx_pending p1, p2, p3; /* units 2^(G-45), 2^(G-90); verified: 2^(G-19) */
  bx_bins bins;      /* wide blocks; set up at the first */
  int bins_live;
  int wide; /* blocks that go on to the bins without pass 1 */
} bf16_ctx;

#define BF16_WIDE_RUN 8 /* wide blocks in a row between two passes 1 */

/* x[0..len) into the bins (m^2 < 2^16 and n <= 2^22: never a flush).
 * After a block spread this wide the next ones skip pass 1 while they
 * stay wider than two levels take. */
static void bf16_wide(bf16_ctx *c, const uint16_t *x, size_t len) {
  if (!c->bins_live) {
    bx_bins_init(&c->bins, 0);
    c->bins_live = 1;
  }
  uint16_t idx[BX_BINS_CHUNK] __attribute__((aligned(64)));
  uint16_t val[BX_BINS_CHUNK] __attribute__((aligned(64)));
  bx_bins_span sp = {0, 255, 0, 0};
  for (size_t i = 0; i < len; i += BX_BINS_CHUNK) {
    size_t m = len - i < BX_BINS_CHUNK ? len - i : BX_BINS_CHUNK;
    size_t mr = c->mk->bins_prep(x + i, m, idx, val, &sp);
    bx_bins_scatter_u16(&c->bins, idx, val, mr);
  }
  bx_bins_touch(&c->bins, 0, sp.emax); /* bin 0 takes the zeros of a padded chunk */
  c->bins.nan += sp.nan;
  c->bins.inf += sp.inf;
  int special = sp.nan + sp.inf > 0;
  int ebtop = sp.emax ? (int)sp.emax : 1, ebot = sp.eminnz ? (int)sp.eminnz : 1;
  int fits = sp.eminnz == 255 || ebot >= ebtop - 36;
  if (c->wide) c->wide = special || !fits ? c->wide - 1 : 0;
  else c->wide = fits ? 0 : BF16_WIDE_RUN; /* a NaN/Inf alone does not make the next wide */
}

/* A checked block: pass 1 (into *amax, *aminnz), then the narrowest
 * window that takes it. Returns 1 if it is for the bins (NaN/Inf, or
 * spread wider than one window: a cascade of windows would cost more). */
static int bf16_checked(bf16_ctx *c, const uint16_t *x, size_t len, uint32_t *amax_out,
                        uint32_t *aminnz_out) {
  const bx_bf16_micro *mk = c->mk;
  uint32_t amax, aminnz;
  mk->stats(x, len, &amax, &aminnz);
  *amax_out = amax;
  *aminnz_out = aminnz;
  if (amax >= 0x7F80u) return 1; /* NaN/Inf */
  if (amax == 0) return 0;
  int ebtop = amax >> 7 ? (int)(amax >> 7) : 1, g = bx_f32_g(ebtop);
  int normal = aminnz >= 0x80; /* no subnormals: the shifted doubles */
  if (normal && aminnz >= bx_bf16_thr(ebtop, 15)) {
    bx_pend_add(&c->p1, c->acc, mk->window1_fast(x, len, g), g - 45);
  } else if (normal && aminnz >= bx_bf16_thr(ebtop, 37)) {
    bx_pend_add(&c->p1, c->acc, mk->window2_fast(x, len, g), g - 45);
  } else if (normal && aminnz >= bx_bf16_thr(ebtop, 60)) {
    bx_i128 v2, v1 = mk->window3_fast(x, len, g, &v2);
    bx_pend_add(&c->p1, c->acc, v1, g - 45);
    bx_pend_add(&c->p2, c->acc, v2, g - 90);
  } else if (aminnz >= bx_bf16_thr(ebtop, 15)) { /* subnormals among them */
    bx_pend_add(&c->p1, c->acc, mk->window1(x, len, g), g - 45);
  } else if (aminnz >= bx_bf16_thr(ebtop, 37)) {
    bx_pend_add(&c->p1, c->acc, mk->window2(x, len, g), g - 45);
  } else {
    return 1;
  }
  return 0;
}

/* ---- guessed windows (exact_grid.h, GUESSED WINDOWS) -------------------
 * G comes from the lane sums of the block before; the least non-zero |x|
 * of the block, found in the same loop, says whether the window's level
 * admitted every element; the binades of the final lanes say whether hi
 * held. No pass 1, no flags: a block that fails is redone. */
#define BF16_G_MAX 203 /* a NaN/Inf product (>= 1) overflows hi's binade */

/* A block whose least non-zero |x| bits are minnz fits the two-level
 * window of G: 2e - 268 >= G - 45 for its exponent field e, and e normal
 * (the y' of a subnormal is not |x| 2^640). */
static int bf16_fits2(uint32_t minnz, int g) {
  if (minnz == 0) return 1;
  int e = (int)(minnz >> 7);
  return e >= 1 && 2 * e - 268 >= g - 45;
}

/* The one-level window of G admits |x| bits >= this: normal, and 2e - 268
 * >= G (the least such e is ceil((G + 268) / 2)). */
static uint32_t bf16_thr1(int g) {
  int e = g + 268 > 0 ? (g + 268 + 1) / 2 : 1;
  return (uint32_t)(e > 1 ? e : 1) << 7;
}

/* The next block's G: its largest hi lane near 2^49 of the 2^51 above
 * the anchor (a guess; the binade check decides). */
static int bf16_adapt(int g, int64_t hmax) {
  int lg = hmax > 0 ? 63 - __builtin_clzll((uint64_t)hmax) : 0;
  if (lg != 49) g += lg - 49;
  return g < -300 ? -300 : g;
}

/* The elements a one-level block set apart (non-zero, finite, below its
 * window) into the integer bins. */
static void bf16_tiny_bins(bf16_ctx *c, const uint16_t *tiny, int nt) {
  if (!c->bins_live) {
    bx_bins_init(&c->bins, 0);
    c->bins_live = 1;
  }
  for (int j = 0; j < nt; j++) {
    uint32_t e = (tiny[j] >> 7) & 0xFF, m = (tiny[j] & 0x7Fu) | (e ? 0x80u : 0);
    c->bins.bin[j & 3][e] += m * m;
    bx_bins_touch(&c->bins, e, e);
  }
}

/* A full block through the guessed windows: one level (two when the last
 * checked block needed them); 0 if it did not hold. */
static int bf16_guessed(bf16_ctx *c, const uint16_t *x, int *g, int *levels) {
  bx_i128 v;
  int64_t hmax = 0;
  if (*levels == 1) {
    uint16_t tiny[BX_BF16_TINY];
    int nt = 0;
    if (!c->mk->guess1(x, *g, bf16_thr1(*g), tiny, &nt, &v, &hmax)) return 0;
    if (nt) bf16_tiny_bins(c, tiny, nt);
  } else {
    uint32_t minnz;
    if (!c->mk->guess2(x, *g, &minnz, &v, &hmax) || !bf16_fits2(minnz, *g)) return 0;
    if (minnz == 0 || minnz >= bf16_thr1(*g)) *levels = 1;
  }
  bx_pend_add(&c->p1, c->acc, v, *g - 45);
  *g = bf16_adapt(*g, hmax);
  return 1;
}

/* ---- verified windows in fp32 lanes (exact_grid.h, VERIFIED WINDOWS) ---
 * K = 3 (8 elements a lane): G = 2 ebtop - 271 puts 8 of the largest
 * squares at the top of hi's binade, and the window admits e >= ebtop -
 * 11 (2e - 268 >= L = G - 19); the rest are set apart. */

static int bf16_vg(int ebtop) { return 2 * ebtop - 271; }

static uint32_t bf16_vthr(int g) {
  int e = (g + 249 + 1) / 2; /* the least e with 2e - 268 >= G - 19 */
  return (uint32_t)(e > 1 ? e : 1) << 7;
}

/* A checked block the verified window may take: finite, its G inside
 * the fp32 range, two levels wide at most (few elements to set apart). */
static int bf16_vplain(uint32_t amax, uint32_t aminnz) {
  int ebtop = amax >> 7 ? (int)(amax >> 7) : 1, g = bf16_vg(ebtop);
  return amax != 0 && amax < 0x7F80u && g >= BX_BF16_V_GMIN && g <= BX_BF16_V_GMAX &&
         aminnz >= bx_bf16_thr(ebtop, 37);
}

/* The next G from the largest hi lane: near 2^19 of the 2^22 its binade
 * holds above the anchor (each step of G moves it by 2). */
static int bf16_vadapt(int g, int64_t hmax) {
  int lg = hmax > 0 ? 63 - __builtin_clzll((uint64_t)hmax) : 0;
  if (lg > 21 || lg < 17) g += lg - 19;
  return g < BX_BF16_V_GMIN ? BX_BF16_V_GMIN : g > BX_BF16_V_GMAX ? BX_BF16_V_GMAX : g;
}

/* gsz full blocks at x through the verified window of *g, one read of
 * the flags; blocks that fail are redone checked. */
static void bf16_verified_group(bf16_ctx *c, bx_vrun *vr, int *g, const uint16_t *x, int gsz) {
  const bx_bf16_micro *mk = c->mk;
  uint16_t tiny[BX_V_GROUP][BX_BF16_TINY];
  int nt[BX_V_GROUP], gs[BX_V_GROUP], ok[BX_V_GROUP], failed = 0;
  bx_i128 v[BX_V_GROUP] = {0}; /* (read into dep even for a failed block) */
  uint64_t dep = 0; /* orders the flag read after the windows */
  for (int k = 0; k < gsz; k++) {
    int64_t hmax = 0;
    gs[k] = *g;
    ok[k] = mk->verified(x + (size_t)k * mk->block, *g, bf16_vthr(*g), tiny[k], &nt[k], &v[k], &hmax);
    if (ok[k]) *g = bf16_vadapt(*g, hmax);
    dep += (uint64_t)hmax + (uint64_t)v[k];
  }
  if (bx_fpenv_inexact(dep)) /* some block was not exact */
    for (int k = 0; k < gsz; k++) ok[k] = 0;
  for (int k = 0; k < gsz; k++) {
    const uint16_t *b = x + (size_t)k * mk->block;
    if (ok[k]) {
      bx_pend_add(&c->p3, c->acc, v[k], gs[k] - 19);
      if (nt[k]) bf16_tiny_bins(c, tiny[k], nt[k]);
      bx_vrun_good(vr);
      continue;
    }
    uint32_t amax, aminnz;
    if (bf16_checked(c, b, mk->block, &amax, &aminnz)) bf16_wide(c, b, mk->block);
    failed = 1;
    bx_vrun_bad(vr);
  }
  if (failed) bx_fpenv_clear_flags(); /* the checked windows set PE */
  bx_vrun_group_done(vr, failed, c->wide);
}

/* Checked blocks until one fits a one- or two-level window without
 * subnormals; then guessed windows (if the ISA has them), G from the
 * lanes before. A block they do not take (or whose hi overflowed) is
 * redone checked, and its pass 1 restarts the guess. Blocks no window
 * takes go to the bins at once (their data in L1), and while they keep
 * coming the next ones skip pass 1. */
void bx_drive_sumsq_bf16(const bx_bf16_micro *mk, const uint16_t *x, size_t n, bx_acc *acc) {
  const size_t bs = mk->block;
  bf16_ctx c;
  c.mk = mk;
  c.acc = acc;
  c.p1 = c.p2 = c.p3 = (bx_pending){0, 0, 0};
  c.bins_live = c.wide = 0;
  size_t i = 0, len = bs; /* the first block ends on a 64-byte boundary */
  if (((uintptr_t)x & 1) == 0) len -= ((uintptr_t)x >> 1) & 31;
  int g = 0, levels = 1, guessed = 0, vg = 0;
  int can_guess = mk->guess1 && mk->guess2;
  bx_vrun vr;
  bx_vrun_init(&vr);
  while (i < n) {
    if (len > n - i) len = n - i;
    if (vr.on && len == bs && n - i >= bs) {
      int gsz = bx_vrun_group(&vr, (n - i) / bs);
      bf16_verified_group(&c, &vr, &vg, x + i, gsz);
      i += (size_t)gsz * bs;
      len = bs;
      continue;
    }
    int done = 0;
    if (c.wide) {
      bf16_wide(&c, x + i, len);
      vr.streak = 0;
      done = 1;
    }
    if (!done && guessed && len == bs && g <= BF16_G_MAX) done = bf16_guessed(&c, x + i, &g, &levels);
    if (!done) { /* checked */
      uint32_t amax, aminnz;
      int wide = bf16_checked(&c, x + i, len, &amax, &aminnz);
      int ebtop = amax >> 7 ? (int)(amax >> 7) : 1;
      int vplain = !wide && mk->verified && bf16_vplain(amax, aminnz);
      /* the guessed windows where the verified one cannot go (its fp32
       * range), or where the ISA has no verified one */
      guessed = can_guess && !vplain && !wide && amax != 0 && aminnz >= 0x80 &&
                aminnz >= bx_bf16_thr(ebtop, 37);
      g = bx_f32_g(ebtop);
      levels = aminnz >= bx_bf16_thr(ebtop, 15) ? 1 : 2;
      if (wide) bf16_wide(&c, x + i, len);
      if (bx_vrun_checked(&vr, vplain, mk->verified && len == bs)) {
        vg = bf16_vg(ebtop);
        bx_fpenv_clear_flags(); /* the checked windows leave PE set */
      }
    }
    i += len;
    len = bs;
  }
  if (c.bins_live) bx_bins_done(&c.bins, acc, 2, -268);
  bx_pend_flush(&c.p1, acc);
  bx_pend_flush(&c.p2, acc);
  bx_pend_flush(&c.p3, acc);
  acc->count += (int64_t)n;
}

/* ======================================================================
 * fp16: the fixed window (G = -12, L = -57, no pass 1) for anything
 * finite; runs of blocks switch to the guessed one-level window where the
 * ISA has it (half the operations), G from the lanes before.
 * ====================================================================== */

/* The one-level window of G admits |x| bits >= this: 2 max(e, 1) - 50 >=
 * G (subnormals count as e = 1); 0: everything. */
static uint32_t f16_thr(int g) {
  int e = g + 50 > 0 ? (g + 50 + 1) / 2 : 0;
  return e <= 1 ? 0 : e > 31 ? 0x7C00u : (uint32_t)e << 10;
}

/* G for the guessed window from the fixed window's largest hi lane (units
 * 2^-12, 64 elements a lane): a guessed lane (32) near 2^49. */
static int f16_g_from_fixed(int64_t hmax) {
  int lg = hmax > 0 ? 63 - __builtin_clzll((uint64_t)hmax) : 0;
  return lg - 62;
}

/* The next G from this block's largest lane (units 2^G): near 2^49. */
static int f16_adapt(int g, int64_t hmax) {
  int lg = hmax > 0 ? 63 - __builtin_clzll((uint64_t)hmax) : 0;
  if (lg != 49) g += lg - 49;
  return g < -1000 ? -1000 : g > 900 ? 900 : g;
}

/* The elements a guessed block set apart (non-zero, finite, below its
 * window) into the integer bins: x = m 2^(max(e,1) - 25). */
static void f16_tiny_bins(bx_bins *b, const uint16_t *tiny, int nt) {
  for (int j = 0; j < nt; j++) {
    uint32_t e = (tiny[j] >> 10) & 0x1F;
    uint64_t m = (tiny[j] & 0x3FFu) | (e ? 0x400u : 0);
    b->bin[j & 3][e] += m * m;
    bx_bins_touch(b, e, e);
  }
}

void bx_drive_sumsq_f16(const bx_f16_micro *mk, const uint16_t *x, size_t n, bx_acc *acc) {
  const size_t bs = mk->block;
  bx_pending p = {0, 0, 0}, pg = {0, 0, 0}; /* units 2^-57; guessed: 2^G */
  bx_bins bins;
  int bins_live = 0, g = 0;
  bx_vrun vr; /* (verified.h's state machine: here for the guessed runs) */
  bx_vrun_init(&vr);
  size_t scalar_n = 0, i = 0, len = bs, run = 0, run_at = 0; /* run: for the scalar kernel */
  if (((uintptr_t)x & 1) == 0) len -= ((uintptr_t)x >> 1) & 31;
  while (i < n) {
    if (len > n - i) len = n - i;
    bx_i128 v;
    int64_t hmax = 0;
    if (vr.on && len == bs) { /* guessed */
      uint16_t tiny[BX_BF16_TINY];
      int nt = 0, ok = mk->guess(x + i, g, f16_thr(g), tiny, &nt, &v, &hmax);
      if (ok) {
        bx_pend_add(&pg, acc, v, g);
        if (nt) {
          if (!bins_live) bx_bins_init(&bins, 0);
          bins_live = 1;
          f16_tiny_bins(&bins, tiny, nt);
        }
        g = f16_adapt(g, hmax);
        bx_vrun_good(&vr);
      } else {
        bx_vrun_bad(&vr);
      }
      bx_vrun_group_done(&vr, !ok, 0);
      if (ok) {
        if (run) { /* the run before ends here: runs stay contiguous */
          bx_sumsq_f16_scalar(x + run_at, run, acc); /* counts them */
          scalar_n += run;
          run = 0;
        }
        i += len;
        len = bs;
        continue;
      }
    }
    if (mk->window(x + i, len, &v, &hmax)) {
      bx_pend_add(&p, acc, v, -57);
      if (run) {
        bx_sumsq_f16_scalar(x + run_at, run, acc); /* counts them */
        scalar_n += run;
        run = 0;
      }
      if (len == bs) g = f16_g_from_fixed(hmax); /* the guess restarts here */
      bx_vrun_checked(&vr, 1, mk->guess && len == bs);
    } else { /* a NaN or Inf in the block: the scalar kernel redoes it */
      bx_vrun_checked(&vr, 0, 0);
      if (!run) run_at = i;
      run += len;
      if (run >= BX_SCALAR_RUN_MAX) { /* the run still in L2 */
        bx_sumsq_f16_scalar(x + run_at, run, acc);
        scalar_n += run;
        run = 0;
      }
    }
    i += len;
    len = bs;
  }
  if (run) {
    bx_sumsq_f16_scalar(x + run_at, run, acc);
    scalar_n += run;
  }
  if (bins_live) bx_bins_done(&bins, acc, 2, -50);
  bx_pend_flush(&p, acc);
  bx_pend_flush(&pg, acc);
  acc->count += (int64_t)(n - scalar_n);
}
