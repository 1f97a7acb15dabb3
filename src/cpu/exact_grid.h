/*
 * exact_grid.h — what the vector sum-of-squares kernels share: the
 * exactness argument, and the plain-C folding of block sums into the
 * accumulator. The drivers (drive_*.c) make the decisions below, the
 * micro-kernels (avx2*.c, avx512*.c) do the arithmetic (micro.h).
 *
 * THE SCHEME. Every kernel result is exact: after normalisation the
 * accumulator holds the same value as the portable integer-bin kernels'
 * for every input. Per block of B elements:
 *
 *  pass 1  integer max and min-non-zero of the |x| bit patterns (monotonic
 *          in |x|). Max Inf/NaN → the block goes to the integer bins
 *          (bins.h: the scalar kernels' scheme, no floating point). The
 *          VERIFIED and GUESSED WINDOWS below skip pass 1 and prove each
 *          block exact after the fact instead.
 *  pass 2  "two-level grid" in fp64 lanes. A lane holds hi, kept inside
 *          the binade [2^(G+52), 2^(G+53)) (ulp 2^G, anchored at
 *          ah = 1.5*2^(G+52)), and lo, kept in [2^(L+52), 2^(L+53))
 *          (anchored at al = 1.5*2^(L+52), ulp 2^L). Per element (x exact
 *          in fp64):
 *            t = fma(x,x,hi); d = hi - t; e = fma(x,x,d); lo += e; hi = t
 *          d is exact (Sterbenz: hi, t in one binade); e = x^2 - (t - hi)
 *          is exact when it has <= 53 significant bits; lo += e is exact
 *          while lo stays in its binade and e is a multiple of 2^L.
 *  fold    hi - ah and lo - al are exact integers of 2^G and 2^L: the
 *          differences of the bit patterns (same binade, same exponent
 *          field), so no scale factor 2^-G is ever built (fp64 squares
 *          reach 2^2048 and 2^-2148). sum x^2 = (hi - ah) + (lo - al).
 *
 * BOUNDS. k = 2^K elements per lane, x^2 <= 2^T for every admitted x, all
 * admitted x^2 multiples of 2^L, G = T + K - 50, L = G + K - 51:
 *  - hi = ah + S - E with 0 <= S <= k 2^T = 2^(G+50) and |E| <= k 2^(G-1)
 *    = 2^(G+K-1): hi stays within ah + [-2^(G+5), 2^(G+50) + 2^(G+5)],
 *    inside its binade, so each t is rounded to the grid 2^G and every
 *    rounding error has |e| <= 2^(G-1);
 *  - e is a multiple of 2^L (2^L divides x^2 and 2^G) with |e| / 2^L <=
 *    2^(G-1-L) = 2^(50-K) < 2^53: representable, so the second fma is
 *    exact;
 *  - lo = al + E, |E| <= 2^(G+K-1) = 2^(L+50): inside its binade, every
 *    partial sum a multiple of 2^L: exact;
 *  - fold: |hi - ah| / 2^G < 2^51, |lo - al| / 2^L <= 2^50; 32 lanes sum
 *    below 2^56 in int64; H * 2^(G-L) + L < 2^102 fits an int128, and 64
 *    such block sums (pending below) stay below 2^108.
 * An element whose x^2 is not a multiple of 2^L lies below the window: it
 * is masked out (zero) and handled by the next window, anchored at the max
 * of what is left (a cascade; the last window admits everything).
 *
 * THREE LEVELS (wide blocks: spikes, 40-binade spreads). e above is exact
 * for every fp32/bf16 x, not only admitted ones: if x^2 < 2^(G-1) then t =
 * hi and e = x^2; otherwise x^2 has <= 48 bits, so its quantum q >=
 * 2^(G-54) and |e| <= 2^(G-1) is a multiple of q. In both cases e is a
 * multiple of q(x^2). A third level takes lo's role for e:
 *            t2 = mid + e; e2 = e + (mid - t2); mid = t2; lo += e2
 * mid is anchored with ulp 2^M, M = G + K - 51 (|sum e| <= 2^(M+50) keeps
 * it in its binade); mid - t2 is exact (Sterbenz); e2 = e - (t2 - mid) is
 * e itself when |e| < 2^(M-1), else a multiple of q(e) no larger than |e|:
 * representable either way, so exact; |e2| <= 2^(M-1). lo (ulp 2^L, L =
 * M + K - 51) sums the e2 exactly when every q(x^2) >= 2^L. So L = T + 3K -
 * 152: fp32 eb >= ebtop - 43 (44 binades), bf16 eb >= ebtop - 59. The fold
 * gives H * 2^45 + Mid (units 2^M, below 2^102) and Lo (units 2^L).
 *
 * PER DTYPE (eb = biased exponent field; subnormals behave as eb = 1):
 *  fp32  x = m 2^(eb-150), x^2 a multiple of 2^(2eb-300), x^2 < 2^T with
 *        T = 2 ebtop - 252. K = 6 (64 elements per lane): G = 2 ebtop -
 *        296, L = G - 45; the two-level window admits eb >= ebtop - 20
 *        (2eb - 300 >= L): 21 binades; three levels: eb >= ebtop - 43.
 *        Per block, from pass 1: two levels if every non-zero element fits
 *        (gradients; this loop also runs the next block's pass 1), else
 *        three levels in one pass if they fit, else, if at most 32
 *        elements lie in the top two-level window (spikes), those go
 *        through that window and a copy of the block without them through
 *        its own, else the integer bins (a cascade of masked windows costs
 *        a full pass per window: more than the bins beyond one). ISAs
 *        with a verified window (AVX-512): runs of blocks that fit two
 *        levels switch to VERIFIED WINDOWS.
 *  bf16  x = m 2^(eb-134), x^2 a multiple of 2^(2eb-268); same T, K, G, L:
 *        one level (hi only: fma(x,x,hi) is exact when x^2 is a multiple
 *        of 2^G and hi stays in its binade) admits eb >= ebtop - 14, two
 *        levels eb >= ebtop - 36, three eb >= ebtop - 59. Without
 *        subnormals the doubles come from integer shifts, not conversions:
 *        with the bf16 word at bits 45..59 the double is |x| 2^-896
 *        exactly; setting bits 61, 62 gives |x| 2^640 (normal x), so the
 *        fma squares y * y' = x^2 2^-256 exactly (x = 0: y = 0). The
 *        windows move by -256 (every grid stays normal). Otherwise
 *        (subnormals) conversions: one level, or two, and wider blocks go
 *        to the integer bins. Runs of blocks without subnormals that fit
 *        two levels switch to VERIFIED WINDOWS in fp32 lanes (AVX-512,
 *        |x| within about 2^+-56), else to GUESSED WINDOWS.
 *  fp16  x^2 < 2^32 (T = 32), all multiples of 2^-48: one fixed window for
 *        the whole range, K = 6: G = -12, L = -57 <= -48. No pass 1: a NaN
 *        or Inf makes hi non-finite for good (an anchored finite hi never
 *        is), so the block is redone by the scalar kernel when the fold
 *        finds a hi lane outside its binade. (A partial block's tail is
 *        one more round over the accumulators, so a lane still takes at
 *        most 64 elements.) ISAs with a guessed window (AVX-512, AVX2):
 *        runs of full blocks switch to GUESSED WINDOWS (one level).
 *  fp64  x^2 has 106 bits. x' = x 2^s (exact; s = -E with E = floor(log2
 *        max|x|) puts the window's max in [1,2)), p = x'*x', r =
 *        fma(x',x',-p) (exact: x' >= 2^-18, nothing underflows). p and r
 *        each go through the add-form two-level grid (t = hi + v; e = v +
 *        (hi - t)), exact by the same argument with v for x^2. K = 5; p <
 *        4: G = -43, L = -89 (ulp(p) >= 2^(2ex-52), ex = floor(log2 x') >=
 *        -18); |r| <= ulp(p)/2 <= 2^-52: G = -97, L = -143 (r a multiple of
 *        2^(2ex-104)). Window x' >= 2^-18: 19 binades. The sums are
 *        deposited at 2^(L - 2s): multiples of 2^-2148 (every fp64 square
 *        is), so a deposit below the accumulator's LSB shifts out zeros.
 *        Pass 1 also ORs a bitmap of 32-binade buckets: a block in more
 *        than BX_F64_BUCKETS of them, or with NaN/Inf, goes to the 128-bit
 *        integer bins (bins.h) at once, while it is in L1; a cascade
 *        longer than BX_F64_WINDOWS leaves the rest to them too. A block
 *        inside one window takes it unmasked. ISAs with a verified window
 *        (AVX-512): runs of such blocks switch to VERIFIED WINDOWS.
 *
 * VERIFIED WINDOWS (fp32, fp64 and bf16; AVX-512). The two-level step without
 * pass 1:
 *            t = fma(x,x,hi) rounded to nearest with exceptions suppressed
 *            ({rn-sae}: it sets no flag); d = hi - t; e = fma(x,x,d);
 *            lo += e; hi = t
 * with G guessed (below), over a group of blocks whose inexact flag PE
 * (MXCSR, cleared before the group) is read after their last operation.
 * Claim: if PE is still clear and every final hi and lo lane has its
 * anchor's exponent field, then (hi - ah) + (lo - al) = sum x^2 exactly.
 * Proof: PE clear means d, e and every lo += e were exact (x exact in
 * fp64: cvtps2pd never rounds). Then per element hi' + lo' = t + lo +
 * (x^2 + hi - t) = hi + lo + x^2 in real arithmetic, so by induction the
 * final hi + lo = ah + al + sum x^2, whatever happened in between (no
 * bound on k, T or the binades of the intermediate values is needed). The
 * final lanes in their anchors' binades make the bit differences the
 * value differences (fold above). NaN/Inf: t is NaN/Inf (sae suppresses
 * only flags) and stays so, failing the binade test.
 * fp32 spikes (verified_split): the claim holds for any subset of a
 * block's elements, the others zeroed (0 adds nothing, exactly), so the
 * few elements with x^2 >= 2^(G+47) (and NaN/Inf) can be set apart,
 * copied exactly and summed later as a checked block of their own: runs
 * of spiky blocks (a two-level bulk plus at most BX_F32_SPIKES huge
 * elements) need no pass 1 and no copy of the bulk.
 * fp64: x' = x 2^sc (scalef: exact, or it raises PE), p = x' x' rounded
 * {rn-sae}, r = fma(x', x', -p) (x'^2 - p: exact, or PE), and p and r
 * each through the add-form step t = hi + v {rn-sae}; d = hi - t; lo +=
 * v + d. PE clear: x' is x 2^sc, p + r = x'^2, and each step keeps hi +
 * lo + v = hi' + lo' in real arithmetic, so as above the four final
 * lanes, in their binades, give sum x'^2 = (hp - ahp) + (lp - alp) + (hr
 * - ahr) + (lr - alr) exactly (the fold of the checked fp64 windows; the
 * checked window's bounds are not needed). An overflow of p or t (sae
 * returns Inf silently) makes a lane non-finite: the binade test fails.
 * bf16, in fp32 lanes: a bf16 word in the top half of a dword is its fp32
 * value x exactly; the fp32 step t = fma(x,x,hi) {rn-sae}; d = hi - t;
 * lo += fma(x,x,d), and the claim and proof above in fp32 arithmetic (16
 * lanes a vector instead of 8; bf16 squares have 16 bits). Lanes take 8
 * elements (K = 3) and are folded into int64 every 512 elements. G = 2
 * ebtop - 271 puts 8 of the largest squares at the top of hi's binade; the
 * lo grid 2^(G-19) holds 8 errors of 2^(G-1): the window admits |x| bits
 * >= thr (e >= ebtop - 11, 2e - 268 >= G - 19) and sets the non-zero
 * others apart into the integer bins (as the guessed one-level window
 * below); G stays in [-130, 104] so every fp32 grid is normal.
 * The flags are the
 * library's own inside a call: the generic drivers (call.c, pool.c) enter
 * the library's environment (fpenv.h), so no caller's DAZ, FTZ, rounding
 * mode, trap or stale flag reaches a kernel. The drivers clear the
 * flags (bx_fpenv_clear_flags: its memory clobber keeps the windows'
 * loads after it) and read PE with bx_fpenv_inexact(dep), dep a value
 * computed from every window's results: the read cannot move before the
 * arithmetic it checks (a data dependency, not just program order; the
 * micro-kernels are also opaque calls). A block that fails
 * (flag: the whole group; binade: that block) is redone by the checked
 * path. G (or the fp64 scale) only decides how often blocks fail: the
 * first is the checked one of the block before (fp32: 2 ebtop - 296;
 * fp64: one binade lower, the max in [1/2, 1)), then the largest hi lane
 * is kept near 2^46 of the 2^51 its binade holds above the anchor.
 *
 * GUESSED WINDOWS (bf16 and fp16; AVX-512 and AVX2). One level (h = fma(y, y', h),
 * y*y' = x^2 2^-256, G' = G - 256) or two levels (the step of pass 2 on
 * y*y'), normal rounding, no pass 1 and no flags: G guessed as for fp32
 * (largest lane near 2^49); the final lanes are tested for their binades.
 * One level admits the elements with |x| bits >= thr = max(1, ceil((G +
 * 268) / 2)) << 7, i.e. normal with 2e - 268 >= G; the loop zeroes the
 * others and sets the non-zero ones apart (rare: a few tiny elements
 * below a gradient block's window) into the integer bins, exactly; more
 * than BX_BF16_TINY of them fail the block. Two levels admit all, and the
 * same loop finds the block's least non-zero |x| bits. Claim: if every
 * admitted x is normal with 2e - 268 >= G (one level; >= G - 45 for two:
 * the least non-zero test) and every final lane is in its anchor's
 * binade, every operation was exact. Proof, one level: each admitted
 * product is a multiple of 2^(2e-268-256), so of 2^G' (zeroed or zero:
 * 0); h never decreases, so every intermediate h lies between ah and the
 * final h, in the binade, where every multiple of 2^G' is representable:
 * each fma is exact. Two levels: as in BOUNDS with hi in its binade
 * throughout (it never decreases): d exact (Sterbenz), |e| <= 2^(G'-1)
 * and a multiple of 2^(L') (x^2 2^-256 and t - hi are), so e has <= 46
 * bits; k = 64 elements a lane keep |lo - al| <= 2^(L'+50): lo in its
 * binade, every lo += e exact. NaN/Inf (|x| bits above any thr): the
 * shifted fields make y*y' = (1.f)^2 in [1, 4) (exponent field 255:
 * 2^-768 * 2^768), while finite squares give y*y' < 1; with G <= 203 the
 * binade top 2^(G'+53) <= 1, so a NaN/Inf product takes hi out of its
 * binade for good: the block fails. Subnormals would give a wrong y' (no
 * hidden bit), but one level sets them apart (thr >= 0x80) and two levels
 * fail the least-non-zero test (e = 0). A block that fails is redone by
 * the checked path, whose pass 1 restarts G.
 * fp16 (one level, fp64 lanes, the doubles by conversion: exact, any
 * finite x, subnormals included): admits |x| with 2 max(e, 1) - 50 >= G,
 * whose squares are multiples of 2^G, and sets the non-zero others apart
 * as above; the one-level proof applies unchanged (h never decreases and
 * ends in its binade). NaN/Inf: h becomes non-finite and fails the binade
 * test. G starts from the fixed window's largest hi lane (a block of it is
 * the fallback: no pass 1 exists for fp16) and then follows the lanes.
 */
#ifndef BX_EXACT_GRID_H
#define BX_EXACT_GRID_H

#include <stdint.h>

#include "kernels.h"

typedef __int128 bx_i128;

/* Block sums with equal exponents are added in an int128 before they are
 * deposited (two deposits per flush). */
typedef struct bx_pending {
  bx_i128 v;
  int exp, n;
} bx_pending;

static inline void bx_pend_flush(bx_pending *p, bx_acc *acc) {
  if (p->n && p->v) {
    bx_i128 v = p->v;
    int exp = p->exp;
    if (exp < BX_ACC_LSB_EXP) { /* exact: the value is a multiple of 2^-2148 */
      v >>= BX_ACC_LSB_EXP - exp;
      exp = BX_ACC_LSB_EXP;
    }
    bx_acc_deposit_u64(acc, (uint64_t)v, exp);
    bx_acc_deposit_i64(acc, (int64_t)(v >> 64), exp + 64);
  }
  p->v = 0;
  p->n = 0;
}

/* pending += v * 2^exp; |v| < 2^102, so 64 of them fit. */
static inline void bx_pend_add(bx_pending *p, bx_acc *acc, bx_i128 v, int exp) {
  if (p->n && (p->exp != exp || p->n >= 64)) bx_pend_flush(p, acc);
  p->v += v;
  p->exp = exp;
  p->n++;
}

/* Bit pattern of the anchor 1.5 * 2^(g+52); g + 1075 in [1, 2046]. */
static inline int64_t bx_anchor_bits(int g) {
  return ((int64_t)(g + 1075) << 52) | ((int64_t)1 << 51);
}

/* Bit pattern of the fp32 anchor 1.5 * 2^(g+23); g + 150 in [1, 254]. */
static inline int32_t bx_anchor_bits32(int g) { return (int32_t)(((uint32_t)(g + 150) << 23) | (1u << 22)); }

/* h * 2^shift + l, exactly (shift 45 or 46). */
static inline bx_i128 bx_combine(int64_t h, int64_t l, int shift) {
  return (bx_i128)h * ((bx_i128)1 << shift) + l;
}

/* fp32 window: lowest admitted |x| bits under biased exponent ebtop (0:
 * everything, subnormals and zeros included), and G. */
static inline uint32_t bx_f32_thr(int ebtop) {
  return ebtop - 20 <= 1 ? 0u : (uint32_t)(ebtop - 20) << 23;
}
static inline int bx_f32_g(int ebtop) { return 2 * ebtop - 296; }

/* fp32 three-level window: eb >= ebtop - 43. */
static inline uint32_t bx_f32_thr3(int ebtop) {
  return ebtop - 43 <= 1 ? 0u : (uint32_t)(ebtop - 43) << 23;
}

/* bf16: width 15 (one-level), 37 (two-level) or 60 (three-level) binades
 * ending at ebtop. */
static inline uint32_t bx_bf16_thr(int ebtop, int width) {
  return ebtop - (width - 1) <= 1 ? 0u : (uint32_t)(ebtop - (width - 1)) << 7;
}

/* fp64 window for a max |x| with bits amax (non-zero, finite): sets *sc =
 * -E and returns the lowest admitted |x| bits, 2^(E-18) (maybe subnormal;
 * 0 when that is below 2^-1074: everything admitted). */
static inline uint64_t bx_f64_window(uint64_t amax, int *sc) {
  int ebits = (int)(amax >> 52);
  int e = ebits ? ebits - 1023 : (63 - __builtin_clzll(amax)) - 1074;
  int et = e - 18;
  *sc = -e;
  if (et >= -1022) return (uint64_t)(et + 1023) << 52;
  return et >= -1074 ? 1ull << (et + 1074) : 0;
}

/* fp32 blocks spread so wide that no window (nor a split of their
 * spikes) can take them go to the integer bins without trying: beyond 3
 * three-level windows (132 binades between max and min non-zero). */
static inline int bx_f32_too_wide(uint32_t amax, uint32_t aminnz) {
  int top = amax >> 23 ? (int)(amax >> 23) : 1, bot = aminnz >> 23 ? (int)(aminnz >> 23) : 1;
  return aminnz != 0 && top - bot >= 132;
}

/* fp16 blocks with a NaN/Inf: elements a run of them may reach before the
 * scalar kernel sums it: the run is still in L2 when it is read again. */
#define BX_SCALAR_RUN_MAX ((size_t)1 << 15)

/* fp64: pass 1 also ORs 1 << (|x| bits >> 57) (64 buckets of 32 binades).
 * A block in more than BX_F64_BUCKETS buckets goes to the integer bins; a
 * cascade longer than BX_F64_WINDOWS hands what is left to them. */
#define BX_F64_BUCKETS 4
#define BX_F64_WINDOWS 6

#endif /* BX_EXACT_GRID_H */
