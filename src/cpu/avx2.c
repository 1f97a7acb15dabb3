/*
 * avx2.c — exact sum-of-squares kernels for AVX2 + FMA + F16C: the fp32
 * kernel and the table. bf16/fp16 are in avx2_half.c, fp64 in avx2_f64.c.
 *
 * The same scheme, windows and proofs as the AVX-512 kernels (see
 * exact_grid.h), with 256-bit vectors: 4 accumulator pairs of 4 fp64
 * lanes = 16 lanes, so a block of 1024 elements keeps k = 64 per lane
 * (K = 6) and every window constant is the one proven there; three levels
 * use 2 sets over half blocks. AVX2 has no masks: out-of-window lanes are
 * zeroed with AND, tails are copied into a zero-padded buffer (a zero
 * changes no max, no min-non-zero, no sum). No verified windows: AVX2 has
 * no per-instruction exception suppression, so every fp32 block is
 * checked; blocks no window takes go to the integer bins (bins.h).
 *
 * sumabs uses the scalar kernels (p = 1 is not on the hot path).
 */
#include <string.h>

#include "avx2_util.h"
#include "bins.h"

/* ======================================================================
 * fp32
 * ====================================================================== */

/* max and min-non-zero of |x| bits over 16 elements at p */
static inline void f32_stats16(const float *p, __m256i *mx, __m256i *mn) {
  const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), one = _mm256_set1_epi32(1);
  __m256i a0 = _mm256_and_si256(_mm256_loadu_si256((const void *)p), absm);
  __m256i a1 = _mm256_and_si256(_mm256_loadu_si256((const void *)(p + 8)), absm);
  *mx = _mm256_max_epu32(*mx, _mm256_max_epu32(a0, a1));
  *mn = _mm256_min_epu32(*mn, _mm256_min_epu32(_mm256_sub_epi32(a0, one), _mm256_sub_epi32(a1, one)));
}

static void f32_stats(const float *x, size_t len, uint32_t *amax, uint32_t *aminnz) {
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi32(-1);
  size_t i = 0;
  for (; i + 16 <= len; i += 16) f32_stats16(x + i, &mx, &mn);
  if (i < len) {
    float buf[16] = {0};
    memcpy(buf, x + i, (len - i) * sizeof *x);
    f32_stats16(buf, &mx, &mn);
  }
  *amax = hmax_epu32(mx);
  *aminnz = hmin_epu32(mn) + 1u;
}

static inline __m256d f32_ld(const float *p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }

static inline void f32_all16(const float *p, __m256d h[4], __m256d l[4]) {
  sq2(f32_ld(p), &h[0], &l[0]);
  sq2(f32_ld(p + 4), &h[1], &l[1]);
  sq2(f32_ld(p + 8), &h[2], &l[2]);
  sq2(f32_ld(p + 12), &h[3], &l[3]);
}

/* Pass 1 of the next block, fused into a window's loop (software
 * pipelining: the next block streams in while this one is squared). */
typedef struct f32_next {
  const float *y; /* BLOCK elements, or NULL */
  uint32_t amax, aminnz;
} f32_next;

static inline void f32_next16(const f32_next *nx, size_t i, __m256i *mx, __m256i *mn) {
  _mm_prefetch((const char *)(nx->y + 4 * BLOCK + i), _MM_HINT_T1); /* never faults */
  f32_stats16(nx->y + i, mx, mn);
}

static inline void f32_next_done(f32_next *nx, __m256i mx, __m256i mn) {
  nx->amax = hmax_epu32(mx);
  nx->aminnz = hmin_epu32(mn) + 1u;
}

/* Two-level sum of x^2 over x[0..len), len <= BLOCK, every non-zero
 * element inside the window of G; in units of 2^(G-45). With nx (then len
 * == BLOCK) the next block's pass 1 runs in the same loop. */
static bx_i128 f32_window_all(const float *x, size_t len, int g, f32_next *nx) {
  const __m256d ah = anchor4(g), al = anchor4(g - 45);
  __m256d h[4] = {ah, ah, ah, ah}, l[4] = {al, al, al, al};
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi32(-1);
  size_t i = 0;
  for (; i + 16 <= len; i += 16) {
    if (nx) f32_next16(nx, i, &mx, &mn);
    f32_all16(x + i, h, l);
  }
  if (i < len) {
    float buf[16] = {0};
    memcpy(buf, x + i, (len - i) * sizeof *x);
    f32_all16(buf, h, l);
  }
  if (nx) f32_next_done(nx, mx, mn);
  return bx_combine(lanes_sum(h[0], h[1], h[2], h[3], g), lanes_sum(l[0], l[1], l[2], l[3], g - 45), 45);
}

static void f32_window3_all(const float *x, size_t len, int g, f32_next *nx, bx_i128 *v1,
                            bx_i128 *v2) {
  __m256i mx = _mm256_setzero_si256(), mn = _mm256_set1_epi32(-1);
  *v1 = *v2 = 0;
  for (size_t h = 0; h < len; h += BLOCK / 2) {
    size_t end = len - h < BLOCK / 2 ? len : h + BLOCK / 2, i = h;
    bx_sets3 s;
    sets3_init(&s, g);
    for (; i + 16 <= end; i += 16) {
      if (nx) f32_next16(nx, i, &mx, &mn);
      sq3(f32_ld(x + i), &s.h0, &s.m0, &s.l0);
      sq3(f32_ld(x + i + 4), &s.h1, &s.m1, &s.l1);
      sq3(f32_ld(x + i + 8), &s.h0, &s.m0, &s.l0);
      sq3(f32_ld(x + i + 12), &s.h1, &s.m1, &s.l1);
    }
    for (; i < end; i += 4) {
      float buf[4] = {0, 0, 0, 0};
      memcpy(buf, x + i, (end - i < 4 ? end - i : 4) * sizeof *x);
      sq3(f32_ld(buf), &s.h0, &s.m0, &s.l0);
    }
    sets3_fold(&s, g, v1, v2);
  }
  if (nx) f32_next_done(nx, mx, mn);
}

/* Spiky blocks: the few elements with |x| bits >= thr (at most F32_SPIKES)
 * go to top[], x is copied to rest[] with them zeroed (rest holds len
 * rounded up to 8). Returns how many moved, or -1 if more; *restmax = max
 * |x| bits of the others. */
#define F32_SPIKES 32
static int f32_split(const float *x, size_t len, uint32_t thr, float *top, float *rest,
                     uint32_t *restmax) {
  const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), vt = _mm256_set1_epi32((int)thr - 1);
  __m256i r = _mm256_setzero_si256();
  int cnt = 0;
  for (size_t i = 0; i < len; i += 8) {
    if (len - i < 8) {
      memset(rest + i, 0, 8 * sizeof *rest);
      memcpy(rest + i, x + i, (len - i) * sizeof *x);
    } else {
      _mm256_storeu_ps(rest + i, _mm256_loadu_ps(x + i));
    }
    __m256i a = _mm256_and_si256(_mm256_loadu_si256((const void *)(rest + i)), absm);
    __m256i k = _mm256_cmpgt_epi32(a, vt); /* a >= thr */
    r = _mm256_max_epu32(r, _mm256_andnot_si256(k, a));
    unsigned km = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(k));
    if (km) { /* rare */
      if (cnt + __builtin_popcount(km) > F32_SPIKES) return -1;
      for (; km; km &= km - 1) {
        unsigned j = (unsigned)__builtin_ctz(km);
        top[cnt++] = rest[i + j];
        rest[i + j] = 0.0f;
      }
    }
  }
  *restmax = hmax_epu32(r);
  return cnt;
}

/* ---- wide blocks: the integer bins of bins.h ------------------------------
 * Significands, squares and exponent fields 8 at a time in vectors; the
 * scalar part is only bin[e] += m^2 (four tables), on data still in L1. */

#define F32_BINS_CHUNK 256

/* Exponent fields seen: max over finite elements, min over non-zero ones
 * (255 when none), and whether a NaN/Inf was met. */
typedef struct f32_span {
  uint32_t emax, eminnz, special;
} f32_span;

static void f32_bins_add(bx_bins *b, const float *x, size_t len, bx_acc *acc, f32_span *sp) {
  const __m256i ff = _mm256_set1_epi32(0xFF), frac = _mm256_set1_epi32(0x7FFFFF);
  const __m256i hid = _mm256_set1_epi32(0x800000), zero = _mm256_setzero_si256();
  /* products come out as even|odd pairs per 128 bits: the fields follow them */
  const __m256i perm = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  __m256i emx = zero, emn = _mm256_set1_epi32(0xFF);
  uint32_t idx[F32_BINS_CHUNK] __attribute__((aligned(32)));
  uint64_t prod[F32_BINS_CHUNK] __attribute__((aligned(32)));
  for (size_t i = 0; i < len; i += F32_BINS_CHUNK) {
    size_t m = len - i < F32_BINS_CHUNK ? len - i : F32_BINS_CHUNK;
    if (b->room < m) {
      bx_bins_flush(b, acc, 2, -300);
      b->room = BX_BINS_F32_ROOM;
    }
    b->room -= m;
    size_t mr = (m + 7) & ~(size_t)7; /* the rest of the last 8 reads as zeros */
    for (size_t j = 0; j < mr; j += 8) {
      float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const float *p = x + i + j;
      if (m - j < 8) {
        memcpy(buf, p, (m - j) * sizeof *p);
        p = buf;
      }
      __m256i v = _mm256_loadu_si256((const void *)p);
      __m256i e = _mm256_and_si256(_mm256_srli_epi32(v, 23), ff);
      __m256i f = _mm256_and_si256(v, frac);
      __m256i spec = _mm256_cmpeq_epi32(e, ff);
      unsigned ks = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(spec));
      if (ks) { /* NaN/Inf: counted; bin 255 is never deposited */
        unsigned kz = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(f, zero)));
        b->nan += __builtin_popcount(ks & ~kz);
        b->inf += __builtin_popcount(ks & kz);
        sp->special = 1;
      }
      __m256i mm = _mm256_or_si256(f, _mm256_andnot_si256(_mm256_cmpeq_epi32(e, zero), hid));
      emx = _mm256_max_epu32(emx, _mm256_andnot_si256(spec, e));
      __m256i isz = _mm256_cmpeq_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7FFFFFFF)), zero);
      emn = _mm256_min_epu32(emn, _mm256_or_si256(e, _mm256_and_si256(isz, ff)));
      _mm256_store_si256((void *)(idx + j), _mm256_permutevar8x32_epi32(e, perm));
      __m256i p0 = _mm256_mul_epu32(mm, mm), odd = _mm256_srli_epi64(mm, 32);
      __m256i p1 = _mm256_mul_epu32(odd, odd);
      _mm256_store_si256((void *)(prod + j), _mm256_unpacklo_epi64(p0, p1));
      _mm256_store_si256((void *)(prod + j + 4), _mm256_unpackhi_epi64(p0, p1));
    }
    for (size_t j = 0; j < mr; j += 4) {
      b->bin[0][idx[j]] += prod[j];
      b->bin[1][idx[j + 1]] += prod[j + 1];
      b->bin[2][idx[j + 2]] += prod[j + 2];
      b->bin[3][idx[j + 3]] += prod[j + 3];
    }
  }
  uint32_t hi = hmax_epu32(emx), lo = hmin_epu32(emn);
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
  f32_next *fuse = nx && nx->y && len == BLOCK ? nx : NULL;
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
    float spikes[F32_SPIKES], bulk[BLOCK + 8];
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

/* One block whose pass-1 results are in nx; nx->y is the next block (BLOCK
 * elements) or NULL, whose pass-1 results nx holds on return. */
static void f32_block(f32_ctx *c, const float *x, size_t len, f32_next *nx) {
  uint32_t top = nx->amax, minnz = nx->aminnz;
  int fused = 0;
  float specials[F32_SPIKES], finite[BLOCK + 8];
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
  if (nx->y && !fused) f32_stats(nx->y, BLOCK, &nx->amax, &nx->aminnz);
}

static void sumsq_f32(const void *xv, size_t n, bx_acc *acc) {
  unsigned csr = bx_csr_enter(); /* exact_grid.h: no DAZ, flags our own */
  const float *x = xv;
  f32_ctx c;
  c.acc = acc;
  c.pa = c.pb = (bx_pending){0, 0, 0};
  c.bins_live = c.wide = 0;
  size_t i = 0, len = BLOCK;
  if (((uintptr_t)x & 3) == 0) len -= ((uintptr_t)x >> 2) & 7; /* later blocks 32-byte aligned */
  if (len > n) len = n;
  int have = 0; /* nx holds the pass 1 of the block at i */
  f32_next nx = {NULL, 0, 0};
  while (i < n) {
    size_t nlen = n - (i + len) < BLOCK ? n - (i + len) : BLOCK;
    if (c.wide) { /* straight to the bins */
      f32_wide(&c, x + i, len);
      have = 0;
    } else {
      if (!have) f32_stats(x + i, len, &nx.amax, &nx.aminnz);
      nx.y = nlen == BLOCK ? x + i + len : NULL;
      f32_block(&c, x + i, len, &nx);
      have = nx.y != NULL && !c.wide;
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

const bx_kernels bx_kernels_avx2 = {
    "avx2",
    {bx_avx2_sumsq_f16, bx_avx2_sumsq_bf16, sumsq_f32, bx_avx2_sumsq_f64},
    {sumabs_f16, sumabs_bf16, sumabs_f32, sumabs_f64},
};
