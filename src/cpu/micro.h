/*
 * micro.h — the split of the vector sum-of-squares kernels (BLIS style):
 * one generic block driver per dtype, ISA-neutral C compiled without ISA
 * flags (drive_f32.c, drive_half.c, drive_f64.c), and per ISA a small
 * table of micro-kernels per dtype (avx2*.c, avx512*.c) the driver calls
 * once per block of 1-2 K elements through a function pointer.
 *
 * The drivers own every decision: which window a block takes (from its
 * pass-1 statistics), when runs of verified windows (fp32, fp64, bf16:
 * verified.h) or guessed windows (bf16, fp16) replace pass 1 and how they
 * adapt, the spike and NaN/Inf splits, the integer-bin fallback and when
 * to stay on it, the elements set apart, the folding of block sums into
 * the accumulator (exact_grid.h: bx_pending). A micro-kernel does one pass of
 * arithmetic over one block and returns exact integers (lane sums minus
 * anchors) or statistics; the proofs that make those exact are in
 * exact_grid.h, named by the window each entry implements.
 *
 * Every micro-kernel that streams the tensor prefetches every line it
 * reads first (prefetch.h); `make dev-check` checks the emitted code.
 *
 * Adding an ISA: one kernel file (or a few, by dtype) defining a bx_micro
 * table for each dtype and the bx_kernels table whose entries call the
 * drivers with them (see the end of avx2.c), and one line in dispatch.c's
 * list of ISAs. Optional entries (NULL: the driver does without) are
 * marked below.
 */
#ifndef BX_MICRO_H
#define BX_MICRO_H

#include <stddef.h>
#include <stdint.h>

#include "bins.h"
#include "exact_grid.h"

#define BX_BLOCK_MAX 2048 /* most elements in a block, any ISA (32 lanes x 64) */
#define BX_BLOCK_PAD 16   /* room past a copied block for a vector's tail */

/* ---- fp32 --------------------------------------------------------------- */

/* Pass 1 of the next block, fused into a window's loop (software
 * pipelining: the next block streams in while this one is squared). */
typedef struct bx_f32_next {
  const float *y; /* the next block (block elements), or NULL */
  uint32_t amax, aminnz;
} bx_f32_next;

/* What bins_prep saw: exponent fields, max over finite elements, min over
 * non-zero ones (255 when none); NaN and Inf counted. */
typedef struct bx_bins_span {
  uint32_t emax, eminnz;
  int64_t nan, inf;
} bx_bins_span;

typedef struct bx_f32_micro {
  size_t block; /* elements a block: lanes x 64 (K = 6), <= BX_BLOCK_MAX */
  /* max |x| bits and min non-zero |x| bits (0 if none) of x[0..len) */
  void (*stats)(const float *x, size_t len, uint32_t *amax, uint32_t *aminnz);
  /* two-level window of G over all of x[0..len), len <= block, every
   * non-zero element inside it: the sum in units of 2^(G-45). nx (then
   * len == block): also the next block's pass 1 into nx */
  bx_i128 (*window2)(const float *x, size_t len, int g, bx_f32_next *nx);
  /* three-level window: *v1 in units of 2^(G-45), *v2 of 2^(G-90) */
  void (*window3)(const float *x, size_t len, int g, bx_f32_next *nx, bx_i128 *v1, bx_i128 *v2);
  /* the few (<= BX_F32_SPIKES) elements with |x| bits >= thr into top[],
   * x copied to rest[] (room for len + BX_BLOCK_PAD) with them zeroed;
   * returns how many, or -1 if more; *restmax = max |x| bits of the rest */
  int (*split)(const float *x, size_t len, uint32_t thr, float *top, float *rest, uint32_t *restmax);
  /* x[0..m), m <= BX_BINS_CHUNK: exponent fields into idx[], m^2 into
   * val[], zeros up to its vector width; returns the entries written */
  size_t (*bins_prep)(const float *x, size_t m, uint32_t *idx, uint64_t *val, bx_bins_span *sp);
  /* optional: the verified two-level window (exact_grid.h, VERIFIED
   * WINDOWS) over one full block; 0 if a lane left its binade, else *v
   * (units 2^(G-45)) and *hmax (largest hi lane, units 2^G). The driver
   * reads the inexact flag. NULL: every block is checked. */
  int (*verified)(const float *x, int g, bx_i128 *v, int64_t *hmax);
  /* optional: the same with the elements whose |x| bits are >= thr
   * (spikes, NaN/Inf) set apart: copied to spikes[] (*nspikes of them;
   * more than BX_F32_SPIKES: 0) and zeroed in the window. NULL: spiky
   * blocks are checked. */
  int (*verified_split)(const float *x, int g, uint32_t thr, float *spikes, int *nspikes, bx_i128 *v,
                        int64_t *hmax);
} bx_f32_micro;

#define BX_F32_SPIKES 32

/* ---- bf16 --------------------------------------------------------------- */

typedef struct bx_bf16_micro {
  size_t block;
  /* max |x| bits and min non-zero |x| bits (0 if none), 16-bit patterns */
  void (*stats)(const uint16_t *x, size_t len, uint32_t *amax, uint32_t *aminnz);
  /* windows over all of x[0..len), len <= block, in units of 2^(G-45)
   * (window3: *v2 in units of 2^(G-90)). _fast: the shifted doubles of
   * exact_grid.h (no subnormals allowed); the others convert (any finite
   * block inside the window) */
  bx_i128 (*window1)(const uint16_t *x, size_t len, int g);
  bx_i128 (*window2)(const uint16_t *x, size_t len, int g);
  bx_i128 (*window1_fast)(const uint16_t *x, size_t len, int g);
  bx_i128 (*window2_fast)(const uint16_t *x, size_t len, int g);
  bx_i128 (*window3_fast)(const uint16_t *x, size_t len, int g, bx_i128 *v2);
  /* as bx_f32_micro.bins_prep; 16-bit products (m^2 < 2^16) */
  size_t (*bins_prep)(const uint16_t *x, size_t m, uint16_t *idx, uint16_t *val, bx_bins_span *sp);
  /* optional: the guessed windows (exact_grid.h, GUESSED WINDOWS) over
   * one full block; 0 if a lane left its binade, else *v, *hmax as for
   * fp32. guess1 (one level) admits the elements with |x| bits >= thr and
   * sets the non-zero others apart, their words into tiny[] (*ntiny of
   * them; more than BX_BF16_TINY: 0). guess2 (two levels) admits all and
   * gives *minnz = least non-zero |x| bits. NULL: every block is checked. */
  int (*guess1)(const uint16_t *x, int g, uint32_t thr, uint16_t *tiny, int *ntiny, bx_i128 *v,
                int64_t *hmax);
  int (*guess2)(const uint16_t *x, int g, uint32_t *minnz, bx_i128 *v, int64_t *hmax);
  /* optional, preferred to the guessed windows: the verified window in
   * fp32 lanes (exact_grid.h, VERIFIED WINDOWS, bf16) of G over one full
   * block, |x| bits >= thr admitted and the non-zero others set apart as
   * in guess1; 0 if a lane left its binade, else *v (units 2^(G-19)) and
   * *hmax (largest hi lane, units 2^G). The driver reads the inexact
   * flag. */
  int (*verified)(const uint16_t *x, int g, uint32_t thr, uint16_t *tiny, int *ntiny, bx_i128 *v,
                  int64_t *hmax);
} bx_bf16_micro;

/* The bf16 verified window's G range: its fp32 grids stay normal
 * (exact_grid.h). */
#define BX_BF16_V_GMIN (-130)
#define BX_BF16_V_GMAX 104

#define BX_BF16_TINY 64 /* elements a one-level guessed block may set apart */

/* ---- fp16 --------------------------------------------------------------- */

typedef struct bx_f16_micro {
  size_t block;
  /* the fixed window (G = -12, L = -57) over x[0..len), len <= block:
   * 1, *v (units 2^-57) and *hmax (largest hi lane, units 2^-12) if every
   * hi lane kept its binade, else 0 (a NaN or Inf: the driver redoes the
   * block with the scalar kernel) */
  int (*window)(const uint16_t *x, size_t len, bx_i128 *v, int64_t *hmax);
  /* optional: the guessed one-level window (exact_grid.h, GUESSED
   * WINDOWS, fp16) of G over one full block, |x| bits >= thr admitted, the
   * non-zero others set apart into tiny[] (more than BX_BF16_TINY: 0); 0
   * if a lane left its binade, else *v (units 2^G) and *hmax (largest
   * lane, units 2^G). */
  int (*guess)(const uint16_t *x, int g, uint32_t thr, uint16_t *tiny, int *ntiny, bx_i128 *v, int64_t *hmax);
} bx_f16_micro;

/* ---- fp64 --------------------------------------------------------------- */

/* Pass 1 of a block: max |x| bits, min non-zero |x| bits (0 if none), and
 * the bitmap of 32-binade buckets (exact_grid.h) */
typedef struct bx_f64_stats {
  uint64_t amax, aminnz, buckets;
} bx_f64_stats;

typedef struct bx_f64_next {
  const double *y; /* the next block (block elements), or NULL */
  bx_f64_stats st;
} bx_f64_next;

typedef struct bx_f64_micro {
  size_t block; /* lanes x 32 (K = 5) */
  void (*stats)(const double *x, size_t len, bx_f64_stats *st);
  /* x[0..len), every non-zero element inside the window of sc (|x| bits
   * >= bx_f64_window's threshold), scaled by 2^sc: *vp (units
   * 2^(-89-2sc)) and *vr (units 2^(-143-2sc)). nx (then len == block):
   * also the next block's pass 1 into nx->st */
  void (*window_all)(const double *x, size_t len, int sc, bx_f64_next *nx, bx_i128 *vp, bx_i128 *vr);
  /* the same over the elements with |x| bits in [thr, upper) (masked);
   * *restmax = max |x| bits of those below thr */
  void (*window)(const double *x, size_t len, int sc, uint64_t thr, uint64_t upper,
                 uint64_t *restmax, bx_i128 *vp, bx_i128 *vr);
  /* optional: the verified window (exact_grid.h, VERIFIED WINDOWS) of
   * scale sc over one full block; 0 if a lane left its binade, else *vp,
   * *vr as above and *hmax (largest p lane, units 2^-43). The driver
   * reads the inexact flag. NULL: every block is checked. */
  int (*verified)(const double *x, int sc, bx_i128 *vp, bx_i128 *vr, int64_t *hmax);
} bx_f64_micro;

/* ---- the drivers: acc += exact sum of x^2 over x[0..n), n <= BX_CHUNK,
 * NaN/Inf and elements counted (the bx_reduce_fn contract, kernels.h) --- */
void bx_drive_sumsq_f32(const bx_f32_micro *mk, const float *x, size_t n, bx_acc *acc);
void bx_drive_sumsq_bf16(const bx_bf16_micro *mk, const uint16_t *x, size_t n, bx_acc *acc);
void bx_drive_sumsq_f16(const bx_f16_micro *mk, const uint16_t *x, size_t n, bx_acc *acc);
void bx_drive_sumsq_f64(const bx_f64_micro *mk, const double *x, size_t n, bx_acc *acc);

/* ---- the ISAs' tables (avx2*.c, avx512*.c) ----------------------------- */
#ifdef BX_HAVE_X86
extern const bx_f32_micro bx_micro_f32_avx2, bx_micro_f32_avx512;
extern const bx_bf16_micro bx_micro_bf16_avx2, bx_micro_bf16_avx512;
extern const bx_f16_micro bx_micro_f16_avx2, bx_micro_f16_avx512;
extern const bx_f64_micro bx_micro_f64_avx2, bx_micro_f64_avx512;
#endif

#endif /* BX_MICRO_H */
