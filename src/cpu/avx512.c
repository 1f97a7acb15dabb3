/*
 * avx512.c — exact sum-of-squares kernels for AVX-512 (F, DQ, BW, VL): the
 * fp32 kernel and the table. bf16/fp16 are in avx512_half.c, fp64 in
 * avx512_f64.c; the scheme and the proofs of exactness in exact_grid.h.
 *
 * 4 accumulator pairs (or triples) of 8 fp64 lanes = 32 lanes, so blocks
 * of 2048 keep k = 64 elements per lane (K = 6). Tails use masked loads
 * (masked-off lanes read as zero: no max, min-non-zero or sum changes).
 * Checked blocks are software-pipelined: the next block's pass 1 runs in
 * the loop that squares this one. Runs of gradient-like blocks take the
 * verified windows (no pass 1: about 5 vector operations an 8 elements
 * instead of 7), blocks no window takes the integer bins (bins.h) with
 * vector preprocessing.
 *
 * sumabs uses the scalar kernels (p = 1 is not on the hot path).
 */
#include <string.h>

#include "avx512_util.h"
#include "bins.h"

#define F32_BLOCK BX_AVX512_BLOCK

/* ======================================================================
 * fp32
 * ====================================================================== */

/* Max |x| bits and min non-zero |x| bits (0 if none) of x[0..len). */
static void f32_stats(const float *x, size_t len, uint32_t *amax, uint32_t *aminnz) {
  const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
  __m512i mx0 = _mm512_setzero_si512(), mx1 = mx0;
  __m512i mn0 = _mm512_set1_epi32(-1), mn1 = mn0;
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m512i a0 = _mm512_and_si512(_mm512_loadu_si512(x + i), absm);
    __m512i a1 = _mm512_and_si512(_mm512_loadu_si512(x + i + 16), absm);
    mx0 = _mm512_max_epu32(mx0, a0);
    mx1 = _mm512_max_epu32(mx1, a1);
    mn0 = _mm512_min_epu32(mn0, _mm512_sub_epi32(a0, one));
    mn1 = _mm512_min_epu32(mn1, _mm512_sub_epi32(a1, one));
  }
  if (i < len) { /* zeros from the masked load change neither */
    uint32_t m = tail_mask32(len - i);
    __m512i a0 = _mm512_and_si512(_mm512_maskz_loadu_epi32((__mmask16)m, x + i), absm);
    __m512i a1 = _mm512_and_si512(_mm512_maskz_loadu_epi32((__mmask16)(m >> 16), x + i + 16), absm);
    mx0 = _mm512_max_epu32(mx0, a0);
    mx1 = _mm512_max_epu32(mx1, a1);
    mn0 = _mm512_min_epu32(mn0, _mm512_sub_epi32(a0, one));
    mn1 = _mm512_min_epu32(mn1, _mm512_sub_epi32(a1, one));
  }
  *amax = _mm512_reduce_max_epu32(_mm512_max_epu32(mx0, mx1));
  *aminnz = _mm512_reduce_min_epu32(_mm512_min_epu32(mn0, mn1)) + 1u;
}

static inline __m512d f32_ld(const float *p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }

static inline __m512d f32_ldm(const float *p, uint32_t m) {
  return _mm512_cvtps_pd(_mm256_maskz_loadu_ps((__mmask8)m, p));
}

/* Pass 1 of the next block, fused into a window's loop (software
 * pipelining: the next block streams in while this one is squared). */
typedef struct f32_next {
  const float *y; /* F32_BLOCK elements, or NULL */
  uint32_t amax, aminnz;
} f32_next;

static inline void f32_stats32(const float *y, __m512i *mx, __m512i *mn) {
  const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
  _mm_prefetch((const char *)(y + 4 * F32_BLOCK), _MM_HINT_T1); /* never faults */
  _mm_prefetch((const char *)(y + 4 * F32_BLOCK + 16), _MM_HINT_T1);
  __m512i a0 = _mm512_and_si512(_mm512_loadu_si512(y), absm);
  __m512i a1 = _mm512_and_si512(_mm512_loadu_si512(y + 16), absm);
  *mx = _mm512_max_epu32(*mx, _mm512_max_epu32(a0, a1));
  *mn = _mm512_min_epu32(*mn, _mm512_min_epu32(_mm512_sub_epi32(a0, one), _mm512_sub_epi32(a1, one)));
}

static inline void f32_stats_done(f32_next *nx, __m512i mx, __m512i mn) {
  nx->amax = _mm512_reduce_max_epu32(mx);
  nx->aminnz = _mm512_reduce_min_epu32(mn) + 1u;
}

/* Two-level sum of x^2 over all of x[0..len), len <= F32_BLOCK, every
 * non-zero element inside the window of G; in units of 2^(G-45). With nx
 * (then len == F32_BLOCK), the next block's pass 1 runs in the same loop. */
static bx_i128 f32_window_all(const float *x, size_t len, int g, f32_next *nx) {
  const __m512d ah = anchor_pd(g), al = anchor_pd(g - 45);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  __m512i mx = _mm512_setzero_si512(), mn = _mm512_set1_epi32(-1);
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    if (nx) f32_stats32(nx->y + i, &mx, &mn);
    sq2(f32_ld(x + i), &h0, &l0);
    sq2(f32_ld(x + i + 8), &h1, &l1);
    sq2(f32_ld(x + i + 16), &h2, &l2);
    sq2(f32_ld(x + i + 24), &h3, &l3);
  }
  if (i < len) {
    uint32_t m = tail_mask32(len - i);
    sq2(f32_ldm(x + i, m), &h0, &l0);
    sq2(f32_ldm(x + i + 8, m >> 8), &h1, &l1);
    sq2(f32_ldm(x + i + 16, m >> 16), &h2, &l2);
    sq2(f32_ldm(x + i + 24, m >> 24), &h3, &l3);
  }
  if (nx) f32_stats_done(nx, mx, mn);
  return combine45(lanes_sum(h0, h1, h2, h3, g), lanes_sum(l0, l1, l2, l3, g - 45));
}

/* Three-level window over all of x[0..len) (every non-zero element
 * inside it); results as f32_window3. */
static void f32_window3_all(const float *x, size_t len, int g, f32_next *nx, bx_i128 *v1,
                            bx_i128 *v2) {
  const __m512d ah = anchor_pd(g), am = anchor_pd(g - 45), al = anchor_pd(g - 90);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, m0 = am, m1 = am, m2 = am, m3 = am;
  __m512d l0 = al, l1 = al, l2 = al, l3 = al;
  __m512i mx = _mm512_setzero_si512(), mn = _mm512_set1_epi32(-1);
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    if (nx) f32_stats32(nx->y + i, &mx, &mn);
    sq3(f32_ld(x + i), &h0, &m0, &l0);
    sq3(f32_ld(x + i + 8), &h1, &m1, &l1);
    sq3(f32_ld(x + i + 16), &h2, &m2, &l2);
    sq3(f32_ld(x + i + 24), &h3, &m3, &l3);
  }
  if (i < len) {
    uint32_t m = tail_mask32(len - i);
    sq3(f32_ldm(x + i, m), &h0, &m0, &l0);
    sq3(f32_ldm(x + i + 8, m >> 8), &h1, &m1, &l1);
    sq3(f32_ldm(x + i + 16, m >> 16), &h2, &m2, &l2);
    sq3(f32_ldm(x + i + 24, m >> 24), &h3, &m3, &l3);
  }
  if (nx) f32_stats_done(nx, mx, mn);
  *v1 = combine45(lanes_sum(h0, h1, h2, h3, g), lanes_sum(m0, m1, m2, m3, g - 45));
  *v2 = lanes_sum(l0, l1, l2, l3, g - 90);
}

/* Spiky blocks: the few elements with |x| bits >= thr (at most F32_SPIKES)
 * are moved to top[] and x is copied to rest[] with them zeroed (rest
 * holds len rounded up to 16). Returns how many moved, or -1 if there are
 * more. *restmax = max |x| bits of the others. */
#define F32_SPIKES 32
static int f32_split(const float *x, size_t len, uint32_t thr, float *top, float *rest,
                     uint32_t *restmax) {
  const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), vt = _mm512_set1_epi32((int)thr);
  __m512i r = _mm512_setzero_si512();
  int cnt = 0;
  for (size_t i = 0; i < len; i += 16) {
    __m512i b = len - i >= 16 ? _mm512_loadu_si512(x + i)
                              : _mm512_maskz_loadu_epi32((__mmask16)tail_mask32(len - i), x + i);
    __m512i a = _mm512_and_si512(b, absm);
    __mmask16 k = _mm512_cmpge_epu32_mask(a, vt);
    r = _mm512_mask_max_epu32(r, (__mmask16)~k, r, a);
    _mm512_storeu_si512(rest + i, b);
    if (k) { /* rare */
      if (cnt + __builtin_popcount(k) > F32_SPIKES) return -1;
      for (unsigned kk = k; kk; kk &= kk - 1) {
        unsigned j = (unsigned)__builtin_ctz(kk);
        top[cnt++] = rest[i + j];
        rest[i + j] = 0.0f;
      }
    }
  }
  *restmax = _mm512_reduce_max_epu32(r);
  return cnt;
}

/* ---- wide blocks: the integer bins of bins.h ------------------------------
 * Significands, squares and exponent fields 16 at a time in vectors; the
 * scalar part is only bin[e] += m^2 (four tables), on data still in L1. */

#define F32_BINS_CHUNK 256

/* Exponent fields of what f32_bins_add saw: max over finite elements,
 * min over non-zero ones (255 when none), and whether a NaN/Inf was met. */
typedef struct f32_span {
  uint32_t emax, eminnz, special;
} f32_span;

static void f32_bins_add(bx_bins *b, const float *x, size_t len, bx_acc *acc, f32_span *sp) {
  const __m512i ff = _mm512_set1_epi32(0xFF), frac = _mm512_set1_epi32(0x7FFFFF);
  const __m512i hid = _mm512_set1_epi32(0x800000);
  /* products come out as even|odd dword pairs: the fields follow them */
  const __m512i perm = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  __m512i emx = _mm512_setzero_si512(), emn = _mm512_set1_epi32(-1);
  uint32_t idx[F32_BINS_CHUNK] __attribute__((aligned(64)));
  uint64_t prod[F32_BINS_CHUNK] __attribute__((aligned(64)));
  for (size_t i = 0; i < len; i += F32_BINS_CHUNK) {
    size_t m = len - i < F32_BINS_CHUNK ? len - i : F32_BINS_CHUNK;
    if (b->room < m) {
      bx_bins_flush(b, acc, 2, -300);
      b->room = BX_BINS_F32_ROOM;
    }
    b->room -= m;
    size_t mr = (m + 15) & ~(size_t)15; /* the rest of the last 16 reads as zeros */
    for (size_t j = 0; j < mr; j += 16) {
      __mmask16 ld = m - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)tail_mask32(m - j);
      __m512i v = _mm512_maskz_loadu_epi32(ld, x + i + j);
      __m512i e = _mm512_and_si512(_mm512_srli_epi32(v, 23), ff);
      __m512i f = _mm512_and_si512(v, frac);
      __mmask16 spec = _mm512_cmpeq_epi32_mask(e, ff);
      if (spec) { /* NaN/Inf: counted; bin 255 is never deposited */
        __mmask16 nan = _mm512_mask_test_epi32_mask(spec, f, f);
        b->nan += __builtin_popcount(nan);
        b->inf += __builtin_popcount((unsigned)(spec & ~nan));
      }
      __m512i mm = _mm512_mask_or_epi32(f, _mm512_test_epi32_mask(e, e), f, hid);
      emx = _mm512_mask_max_epu32(emx, (__mmask16)~spec, emx, e);
      emn = _mm512_mask_min_epu32(emn, _mm512_test_epi32_mask(v, _mm512_set1_epi32(0x7FFFFFFF)), emn, e);
      _mm512_store_si512(idx + j, _mm512_permutexvar_epi32(perm, e));
      __m512i p0 = _mm512_mul_epu32(mm, mm), odd = _mm512_srli_epi64(mm, 32);
      __m512i p1 = _mm512_mul_epu32(odd, odd);
      _mm512_store_si512(prod + j, _mm512_unpacklo_epi64(p0, p1));
      _mm512_store_si512(prod + j + 8, _mm512_unpackhi_epi64(p0, p1));
      sp->special |= spec;
    }
    for (size_t j = 0; j < mr; j += 4) {
      b->bin[0][idx[j]] += prod[j];
      b->bin[1][idx[j + 1]] += prod[j + 1];
      b->bin[2][idx[j + 2]] += prod[j + 2];
      b->bin[3][idx[j + 3]] += prod[j + 3];
    }
  }
  uint32_t hi = _mm512_reduce_max_epu32(emx), lo = _mm512_reduce_min_epu32(emn);
  bx_bins_touch(b, 0, hi); /* bin 0 takes the zeros of a partial chunk */
  sp->emax = hi > sp->emax ? hi : sp->emax;
  sp->eminnz = lo < sp->eminnz ? lo : sp->eminnz;
}

typedef struct f32_ctx {
  bx_acc *acc;
  bx_pending pa, pb;
  bx_bins bins; /* wide blocks; set up at the first */
  int bins_live;
  int wide; /* blocks that go on to the bins without pass 1 */
} f32_ctx;

#define F32_WIDE_RUN 8 /* wide blocks in a row between two passes 1 */

/* x[0..len) into the bins. When a checked block spread this wide lands
 * here its successors probably would too: the next F32_WIDE_RUN blocks
 * skip pass 1 while they stay wider than one three-level window (or hold
 * NaN/Inf). */
static void f32_wide(f32_ctx *c, const float *x, size_t len) {
  if (!c->bins_live) {
    bx_bins_init(&c->bins, BX_BINS_F32_ROOM);
    c->bins_live = 1;
  }
  f32_span sp = {0, 255, 0};
  f32_bins_add(&c->bins, x, len, c->acc, &sp);
  int ebtop = sp.emax ? (int)sp.emax : 1, ebot = sp.eminnz ? (int)sp.eminnz : 1;
  int fits = sp.eminnz == 255 || ebot >= ebtop - 43;
  if (c->wide) c->wide = sp.special || !fits ? c->wide - 1 : 0;
  else c->wide = fits ? 0 : F32_WIDE_RUN; /* a NaN/Inf alone does not make the next wide */
}

/* A finite block with max |x| bits top, min non-zero minnz: into c->pa
 * (units 2^(G-45)) and c->pb (units 2^(G-90)), or the bins when no single
 * window takes it (a cascade of masked windows would cost more: each is a
 * full pass). split: spikes may be set apart. nx: the next block's pass 1,
 * done here (returns 1) when the last pass over this block can carry it. */
static int f32_finite(f32_ctx *c, const float *x, size_t len, uint32_t top, uint32_t minnz,
                      int split, f32_next *nx) {
  if (top == 0) return 0;
  int ebtop = top >> 23 ? (int)(top >> 23) : 1, g = bx_f32_g(ebtop);
  f32_next *fuse = nx && nx->y && len == F32_BLOCK ? nx : NULL;
  bx_i128 v1, v2;
  if (minnz >= bx_f32_thr(ebtop)) { /* two levels */
    bx_pend_add(&c->pa, c->acc, f32_window_all(x, len, g, fuse), g - 45);
    return fuse != NULL;
  }
  if (minnz >= bx_f32_thr3(ebtop)) { /* three levels, one pass */
    f32_window3_all(x, len, g, fuse, &v1, &v2);
    bx_pend_add(&c->pa, c->acc, v1, g - 45);
    bx_pend_add(&c->pb, c->acc, v2, g - 90);
    return fuse != NULL;
  }
  if (split) { /* a few spikes above the bulk: each part in its own window */
    float spikes[F32_SPIKES], bulk[F32_BLOCK + 16];
    uint32_t rest;
    int k = f32_split(x, len, bx_f32_thr(ebtop), spikes, bulk, &rest);
    if (k >= 0) {
      bx_pend_add(&c->pa, c->acc, f32_window_all(spikes, (size_t)k, g, NULL), g - 45);
      return f32_finite(c, bulk, len, rest, minnz, 0, nx);
    }
  }
  f32_wide(c, x, len);
  return 0;
}

/* One block whose pass-1 results are nx->amax/aminnz; nx->y is the next
 * block (F32_BLOCK elements) or NULL. On return nx holds the next block's
 * pass-1 results. */
static void f32_block(f32_ctx *c, const float *x, size_t len, f32_next *nx) {
  uint32_t top = nx->amax, minnz = nx->aminnz;
  int fused = 0;
  float specials[F32_SPIKES], finite[F32_BLOCK + 16];
  if (top >= 0x7F800000u) { /* a few NaN/Inf: counted, set apart like spikes */
    int k = f32_split(x, len, 0x7F800000u, specials, finite, &top);
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
  if (nx->y && !fused) f32_stats(nx->y, F32_BLOCK, &nx->amax, &nx->aminnz);
}

/* ---- the verified two-level window (exact_grid.h, VERIFIED WINDOWS) ----
 * No pass 1: t is rounded with exceptions suppressed ({rn-sae}), every
 * other operation must be exact, which the inexact flag and the binades
 * of the final hi/lo lanes confirm. d = hi - t alternates between the add
 * and the FMA pipes (Zen 4 runs FADD and cvtps2pd on the same two). */
#define F32_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline void sqv(__m512d x, __m512d *hi, __m512d *lo, int fma_sub) {
  __m512d t = _mm512_fmadd_round_pd(x, x, *hi, F32_RN);
  __m512d d = fma_sub ? _mm512_fnmadd_pd(t, _mm512_set1_pd(1.0), *hi) : _mm512_sub_pd(*hi, t);
  *lo = _mm512_add_pd(*lo, _mm512_fmadd_pd(x, x, d));
  *hi = t;
}

/* Lanes minus the anchor g; *bad gets lanes outside [anchor - 2^51,
 * anchor + 2^51), i.e. outside the anchor's binade (non-finite included). */
static inline __m512i lanes_diff(__m512d a, __m512i an, __m512i *bad) {
  __m512i d = _mm512_sub_epi64(_mm512_castpd_si512(a), an);
  *bad = _mm512_or_si512(*bad, _mm512_add_epi64(d, _mm512_set1_epi64((int64_t)1 << 51)));
  return d;
}

/* One full block through the verified window of G. Returns 0 if a lane
 * left its binade; else *v = the block's sum in units of 2^(G-45), *hmax =
 * the largest hi lane in units of 2^G. The caller checks the flag. */
static int f32_verified(const float *x, int g, bx_i128 *v, int64_t *hmax) {
  const __m512d ah = anchor_pd(g), al = anchor_pd(g - 45);
  __m512d h0 = ah, h1 = ah, h2 = ah, h3 = ah, l0 = al, l1 = al, l2 = al, l3 = al;
  for (size_t i = 0; i < F32_BLOCK; i += 32) {
    sqv(f32_ld(x + i), &h0, &l0, 0);
    sqv(f32_ld(x + i + 8), &h1, &l1, 1);
    sqv(f32_ld(x + i + 16), &h2, &l2, 0);
    sqv(f32_ld(x + i + 24), &h3, &l3, 1);
  }
  const __m512i ahi = _mm512_castpd_si512(ah), ali = _mm512_castpd_si512(al);
  __m512i bad = _mm512_setzero_si512();
  __m512i a0 = lanes_diff(h0, ahi, &bad), a1 = lanes_diff(h1, ahi, &bad);
  __m512i a2 = lanes_diff(h2, ahi, &bad), a3 = lanes_diff(h3, ahi, &bad);
  __m512i b0 = lanes_diff(l0, ali, &bad), b1 = lanes_diff(l1, ali, &bad);
  __m512i b2 = lanes_diff(l2, ali, &bad), b3 = lanes_diff(l3, ali, &bad);
  *v = 0;
  *hmax = 0;
  if (_mm512_test_epi64_mask(bad, _mm512_set1_epi64(-((int64_t)1 << 52)))) return 0;
  *hmax = _mm512_reduce_max_epi64(_mm512_max_epi64(_mm512_max_epi64(a0, a1), _mm512_max_epi64(a2, a3)));
  int64_t hs = _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  int64_t ls = _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(b0, b1), _mm512_add_epi64(b2, b3)));
  *v = combine45(hs, ls);
  return 1;
}

/* The next block's G from this one's largest hi lane: that lane near
 * 2^46 of the 2^51 its binade holds (a guess; the check decides). */
static int f32_adapt(int g, int64_t hmax) {
  int lg = hmax > 0 ? 63 - __builtin_clzll((uint64_t)hmax) : 0;
  if (lg > 48 || lg < 44) g += lg - 46;
  return g < -300 ? -300 : g > 212 ? 212 : g;
}

/* ---- the driver --------------------------------------------------------- */

#define F32_GROUP 4       /* verified blocks per read of the flags, when calm */
#define F32_CALM 16       /* good blocks since the last failure that make it calm */
#define F32_DEBT 8        /* a failed block costs this much debt, a good one repays 1 */
#define F32_DEBT_MAX 32   /* more debt: back to checked blocks */
#define F32_STREAK_MAX 16 /* most plain checked blocks asked for before a retry */

/* A block the verified window may take: finite, two-level wide. */
static int f32_plain(uint32_t top, uint32_t minnz) {
  return top != 0 && top < 0x7F800000u && minnz >= bx_f32_thr(top >> 23 ? (int)(top >> 23) : 1);
}

/* Blocks start checked (pass 1, then f32_finite). After `need` checked
 * blocks in a row that each fit one two-level window, the driver switches
 * to verified windows, G guessed from the lanes before (f32_adapt). A
 * block that fails (flag or binade) is redone checked; failures run up a
 * debt that good blocks repay, and too much of it (spiky or wide data)
 * goes back to checked blocks and doubles `need` (a good group resets
 * it), so data whose pass 1 says they do not fit rarely try. Blocks no
 * window takes go to the bins at once (their data in L1), and while they
 * keep coming (spread, not NaN/Inf) the next ones skip pass 1. */
static void sumsq_f32(const void *xv, size_t n, bx_acc *acc) {
  const float *x = xv;
  f32_ctx c;
  c.acc = acc;
  c.pa = c.pb = (bx_pending){0, 0, 0};
  c.bins_live = c.wide = 0;
  unsigned csr = bx_csr_enter();
  size_t i = 0, len = F32_BLOCK; /* first block ends on a 64-byte boundary */
  if (((uintptr_t)x & 3) == 0) len -= ((uintptr_t)x >> 2) & 15;
  if (len > n) len = n;
  int g = 0, verified = 0, streak = 0, need = 2, have = 0, calm = 0, debt = 0;
  f32_next nx = {NULL, 0, 0};
  while (i < n) {
    if (verified && len == F32_BLOCK && n - i >= F32_BLOCK) {
      /* a group of gsz blocks, then one read of the flags: four when
       * calm, one at a time after a failure (rare spikes or NaNs then
       * cost one block each, not a group) */
      int gsz = calm >= F32_CALM && n - i >= F32_GROUP * F32_BLOCK ? F32_GROUP : 1;
      bx_i128 v[F32_GROUP];
      int gs[F32_GROUP], ok[F32_GROUP], failed = 0;
      uint64_t dep = 0; /* orders the flag read after the windows */
      for (int k = 0; k < gsz; k++) {
        int64_t hmax = 0;
        gs[k] = g;
        ok[k] = f32_verified(x + i + (size_t)k * F32_BLOCK, g, &v[k], &hmax);
        if (ok[k]) g = f32_adapt(g, hmax);
        dep += (uint64_t)hmax + (uint64_t)v[k];
      }
      if (bx_csr_read(dep) & BX_CSR_PE) /* some block was not exact */
        for (int k = 0; k < gsz; k++) ok[k] = 0;
      for (int k = 0; k < gsz; k++) {
        const float *b = x + i + (size_t)k * F32_BLOCK;
        if (ok[k]) {
          bx_pend_add(&c.pa, acc, v[k], gs[k] - 45);
          calm++;
          debt -= debt > 0;
          continue;
        }
        f32_next one = {NULL, 0, 0};
        f32_stats(b, F32_BLOCK, &one.amax, &one.aminnz);
        f32_block(&c, b, F32_BLOCK, &one);
        failed = 1;
        calm = 0;
        debt += F32_DEBT;
      }
      if (failed) bx_csr_clear(); /* the checked windows set PE */
      if (debt > F32_DEBT_MAX || c.wide) { /* most blocks fail: back to checked */
        verified = have = streak = debt = 0;
        need = need * 2 > F32_STREAK_MAX ? F32_STREAK_MAX : need * 2;
      } else if (!failed) {
        need = 2;
      }
      i += (size_t)gsz * F32_BLOCK;
      len = n - i < F32_BLOCK ? n - i : F32_BLOCK;
      continue;
    }
    size_t nlen = n - (i + len) < F32_BLOCK ? n - (i + len) : F32_BLOCK;
    if (c.wide) { /* straight to the bins */
      f32_wide(&c, x + i, len);
      have = streak = 0;
      i += len;
      len = nlen;
      continue;
    }
    /* checked block at i, len elements */
    if (!have) f32_stats(x + i, len, &nx.amax, &nx.aminnz);
    streak = f32_plain(nx.amax, nx.aminnz) ? streak + 1 : 0;
    int go = len == F32_BLOCK && streak >= need;
    nx.y = !go && nlen == F32_BLOCK ? x + i + len : NULL; /* fuse the next pass 1 */
    if (go) {
      int ebtop = nx.amax >> 23 ? (int)(nx.amax >> 23) : 1;
      g = bx_f32_g(ebtop);
    }
    f32_block(&c, x + i, len, &nx);
    have = nx.y != NULL && !c.wide;
    if (go) {
      verified = 1;
      debt = F32_DEBT_MAX - F32_DEBT + 1; /* a failure before any success ends the try */
      bx_csr_clear(); /* the checked windows leave PE set */
    }
    i += len;
    len = nlen;
  }
  if (c.bins_live) bx_bins_done(&c.bins, acc, 2, -300);
  bx_pend_flush(&c.pa, acc);
  bx_pend_flush(&c.pb, acc);
  acc->count += (int64_t)n;
  bx_csr_leave(csr);
}

/* ---- sum |x|: the scalar kernels --------------------------------------- */

static void sumabs_f16(const void *x, size_t n, bx_acc *a) { bx_sumabs_f16_scalar(x, n, a); }
static void sumabs_bf16(const void *x, size_t n, bx_acc *a) { bx_sumabs_bf16_scalar(x, n, a); }
static void sumabs_f32(const void *x, size_t n, bx_acc *a) { bx_sumabs_f32_scalar(x, n, a); }
static void sumabs_f64(const void *x, size_t n, bx_acc *a) { bx_sumabs_f64_scalar(x, n, a); }

const bx_kernels bx_kernels_avx512 = {
    "avx512",
    {bx_avx512_sumsq_f16, bx_avx512_sumsq_bf16, sumsq_f32, bx_avx512_sumsq_f64},
    {sumabs_f16, sumabs_bf16, sumabs_f32, sumabs_f64},
};
