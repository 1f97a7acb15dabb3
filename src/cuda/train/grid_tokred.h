/*
 * grid_tokred.h — the thread bodies of the token reduction's CUDA
 * launchers (src/cuda/train/tokred.cu), in plain C with BX_HD, so that the
 * C suite (tests/test_train_cuda_sim_tokred.c) runs the very same
 * decomposition on the CPU with blocks, threads and atomics in a shuffled
 * order. The arithmetic is the CPU's own: src/common/tokred_grid.h's
 * bx_tokred_q (the grid), gemm_hd.h's chain (the weight partial, through
 * train_grid.h's SIMT tiles), wgrad.c's column sum (the bias partial).
 *
 * What the bodies produce are integers combined by addition modulo 2^64
 * (the q words: atomicAdd on the device, in any order), by MAX (the
 * largest finite |bits|: atomicMax) and by MIN (the first offending index
 * or chunk: atomicMin), so the order in which threads and blocks finish
 * cannot reach a bit. A body does not perform the atomics itself: it hands
 * its values to the caller (the kernel, or the simulation), which applies
 * them; so the simulation can apply them in any order it likes.
 *
 * The rules mirror the CPU kernels (src/cpu/portable_tokred.c and
 * wgrad.c): a non-finite element adds q = 0 and counts 1 non-finite; the
 * largest |bits| is over finite elements (0 when none); an element
 * "breaks" the agreed bound when it is finite with |bits| >= lim
 * (tokred_grid.h bx_tokred_abs_limit).
 */
#ifndef BX_GRID_TOKRED_H
#define BX_GRID_TOKRED_H

#include <stddef.h>
#include <stdint.h>

#include "gemm_hd.h"
#include "hd.h"
#include "tokred_grid.h"
#include "train_device.h"
#include "train_grid.h"

/* ---- one element ----------------------------------------------------------------- */

/* The finite |bits| of an fp32 element, 0 for Inf and NaN (the bound's and
 * the grid kernel's max ignore them). */
static inline BX_HD uint32_t bx_tgt_fin_abs(uint32_t bits) {
  uint32_t ab = bits & 0x7fffffffu;
  return ab < 0x7f800000u ? ab : 0u;
}

/* The same for element i of an fp32 or (bf16 != 0) bf16 array, the bf16
 * widened exactly (its bits shifted up: wgrad.c's max_finite_abs_rows). */
static inline BX_HD uint32_t bx_tgt_fin_abs_at(const void *a, int bf16, uint64_t i) {
  uint32_t b = bf16 ? (uint32_t)((const uint16_t *)a)[i] << 16 : bx_f32_bits(((const float *)a)[i]);
  return bx_tgt_fin_abs(b);
}

/* What one element contributes (portable_grid_add's rule, per element). */
typedef struct bx_tgt_elem {
  int64_t q;     /* its grid word (0 for a non-finite element) */
  uint32_t ab;   /* its finite |bits| (0 for a non-finite element) */
  int nonfinite; /* 1 for NaN or +-Inf */
  int breaks;    /* 1 when finite with |bits| >= lim */
} bx_tgt_elem;

static inline BX_HD bx_tgt_elem bx_tgt_grid_elem(float a, double inv_step, uint32_t lim) {
  bx_tgt_elem e;
  uint32_t ab = bx_f32_bits(a) & 0x7fffffffu;
  if (ab >= 0x7f800000u) {
    e.q = 0;
    e.ab = 0;
    e.nonfinite = 1;
    e.breaks = 0;
  } else {
    e.q = bx_tokred_q(a, inv_step);
    e.ab = ab;
    e.nonfinite = 0;
    e.breaks = ab >= lim;
  }
  return e;
}

/* ---- the largest finite |bits| per chunk of rows ------------------------------------ */

/* a [rows, cols] (fp32, or bf16 widened), chunks of chunk rows (the last
 * may be shorter): mx[c] = the largest finite |bits| of chunk c's rows.
 * bx_tokred_bound is one chunk of one row; bx_linear_wgrad_bound the
 * chunks of dy and x. Kernel: block b takes chunks b, b + gridDim, ...;
 * its threads stride over the chunk's elements, each keeps its own max
 * and hands it to an atomicMax on mx[c]. */
typedef struct bx_tgt_maxabs {
  const void *a;
  int bf16;
  uint64_t rows, cols, chunk, nchunks;
  uint32_t *mx; /* [nchunks], zeroed before the launch */
} bx_tgt_maxabs;

/* The elements [e0, e1) of chunk c. */
static inline BX_HD void bx_tgt_maxabs_range(const bx_tgt_maxabs *m, uint64_t c, uint64_t *e0,
                                             uint64_t *e1) {
  uint64_t r0 = c * m->chunk, r1 = m->rows - r0 < m->chunk ? m->rows : r0 + m->chunk;
  *e0 = r0 * m->cols;
  *e1 = r1 * m->cols;
}

/* Thread tid of nthreads's max over chunk c (its elements e0 + tid,
 * e0 + tid + nthreads, ...). */
static inline BX_HD uint32_t bx_tgt_maxabs_thread(const bx_tgt_maxabs *m, uint64_t c,
                                                  uint32_t tid, uint32_t nthreads) {
  uint64_t e0, e1;
  bx_tgt_maxabs_range(m, c, &e0, &e1);
  uint32_t mx = 0;
  for (uint64_t i = e0 + tid; i < e1; i += nthreads) {
    uint32_t ab = bx_tgt_fin_abs_at(m->a, m->bf16, i);
    mx = ab > mx ? ab : mx;
  }
  return mx;
}

/* ---- the grid add of one partial (bx_tokred_add) ----------------------------------- */

/* One thread per element (grid-stride): q[i] := the element's word (each
 * word written by exactly one thread: a plain store), and the thread's
 * largest |bits|, non-finite count and first breaking index go to
 * atomicMax / atomicAdd / atomicMin on res. */
typedef struct bx_tgt_grid {
  const float *a;
  uint64_t n;
  double inv_step;
  uint32_t lim;
  int64_t *q; /* [n] */
} bx_tgt_grid;

/* ---- the chunked weight and bias partials (bx_linear_wgrad) ------------------------- */

/* The local rows [0, t) of dy [t, n] and x [t, k] start on a chunk
 * boundary, so local chunk c is rows [c * chunk, min((c + 1) * chunk, t)).
 * Its weight partial is the TN product over exactly those rows (n x k,
 * every output one gemm_hd.h chain over the rows ascending from +0); its
 * bias partial, column j: acc = +0, acc = acc + dy[r][j] for r ascending
 * (wgrad.c's colsum). Each partial element is rounded onto its tensor's
 * grid (bx_tgt_grid_elem) and added into qw [n, k] / qb [n].
 *
 * Weight kernel: grid (row tiles of n, column tiles of k, zgroups); the
 * block (bm, bn, z) computes the 64 x 64 tile (bm, bn) of the partial of
 * chunks z, z + zgroups, ..., one after the other (train_grid.h's tile
 * bodies between __syncthreads()), each thread summing its outputs' q in
 * int64 registers over its chunks (modulo 2^64), then one atomicAdd per
 * output. The largest |bits| and non-finite count: per thread, atomics at
 * the end; the first chunk with a breaking element: atomicMin.
 * Bias kernel: one thread per (zgroup, column), the same chunks. */
typedef struct bx_tgt_wgrad {
  const void *dy, *x;
  int dy_bf16, x_bf16;
  uint64_t t, n, k, chunk, nchunks;
  uint64_t zgroups;  /* chunk groups (grid z of the weight kernel) */
  double inv_w, inv_b; /* 2^-e of the weight's and the bias's grid */
  uint32_t lim_w, lim_b;
  int64_t *qw, *qb;    /* [n * k], [n]: zeroed before the launch */
} bx_tgt_wgrad;

/* The rows [r0, r1) of local chunk c. */
static inline BX_HD void bx_tgt_chunk_rows(const bx_tgt_wgrad *w, uint64_t c, uint64_t *r0,
                                           uint64_t *r1) {
  *r0 = c * w->chunk;
  *r1 = w->t - *r0 < w->chunk ? w->t : *r0 + w->chunk;
}

/* The TN product of chunk c's rows (the weight partial), for train_grid.h's
 * tile bodies: a = dy's rows [K = rows, M = n], b = x's rows [rows, k];
 * from +0 (no accumulate), nothing stored (c NULL). */
static inline BX_HD bx_tg_gemm bx_tgt_wgrad_gemm(const bx_tgt_wgrad *w, uint64_t c) {
  uint64_t r0, r1;
  bx_tgt_chunk_rows(w, c, &r0, &r1);
  bx_tg_gemm g;
  g.a = (const char *)w->dy + r0 * w->n * (w->dy_bf16 ? 2u : 4u);
  g.b = (const char *)w->x + r0 * w->k * (w->x_bf16 ? 2u : 4u);
  g.a_bf16 = w->dy_bf16;
  g.b_bf16 = w->x_bf16;
  g.layout = 2; /* TN */
  g.c = NULL;
  g.m = w->n;
  g.n = w->k;
  g.k = r1 - r0;
  g.accumulate = 0;
  return g;
}

/* What a thread of the weight kernel gathers over its chunks. */
typedef struct bx_tgt_acc {
  int64_t q[BX_TG_GEMM_TM * BX_TG_GEMM_TN]; /* its outputs' words (modulo 2^64) */
  uint32_t mx;                              /* largest finite |bits| */
  int64_t nf;                               /* non-finite elements */
  uint64_t bad;                             /* first breaking chunk, or UINT64_MAX */
} bx_tgt_acc;

static inline BX_HD void bx_tgt_acc_init(bx_tgt_acc *s) {
  for (uint32_t i = 0; i < BX_TG_GEMM_TM * BX_TG_GEMM_TN; i++) s->q[i] = 0;
  s->mx = 0;
  s->nf = 0;
  s->bad = UINT64_MAX;
}

/* The epilogue of chunk c of thread tid of block (bm, bn): its valid
 * outputs' chains (acc, after the last k tile) stored as the CPU stores
 * them (canonical) and rounded onto the weight's grid into s. */
static inline BX_HD void bx_tgt_wgrad_epi(const bx_tgt_wgrad *w, const bx_tg_gemm *g,
                                          uint64_t c, uint64_t bm, uint64_t bn, uint32_t tid,
                                          const float *acc, bx_tgt_acc *s) {
  uint32_t ty = tid / 16, tx = tid % 16;
  for (uint32_t r = 0; r < BX_TG_GEMM_TM; r++)
    for (uint32_t cc = 0; cc < BX_TG_GEMM_TN; cc++) {
      uint64_t i = bm * BX_TG_GEMM_BM + ty + 16 * r, j = bn * BX_TG_GEMM_BN + tx + 16 * cc;
      if (i >= g->m || j >= g->n) continue;
      uint32_t o = r * BX_TG_GEMM_TN + cc;
      bx_tgt_elem e = bx_tgt_grid_elem(bx_gemm_store_f32(acc[o]), w->inv_w, w->lim_w);
      s->q[o] = (int64_t)((uint64_t)s->q[o] + (uint64_t)e.q);
      s->mx = e.ab > s->mx ? e.ab : s->mx;
      s->nf += e.nonfinite;
      if (e.breaks && c < s->bad) s->bad = c;
    }
}

/* Output o of thread tid of block (bm, bn): its index in qw, or UINT64_MAX
 * for a padded one (nothing to add). */
static inline BX_HD uint64_t bx_tgt_wgrad_out(const bx_tgt_wgrad *w, uint64_t bm, uint64_t bn,
                                              uint32_t tid, uint32_t o) {
  uint32_t ty = tid / 16, tx = tid % 16, r = o / BX_TG_GEMM_TN, cc = o % BX_TG_GEMM_TN;
  uint64_t i = bm * BX_TG_GEMM_BM + ty + 16 * r, j = bn * BX_TG_GEMM_BN + tx + 16 * cc;
  return i < w->n && j < w->k ? i * w->k + j : UINT64_MAX;
}

/* The bias partial of chunk c, column j (wgrad.c's colsum: acc + dy, one
 * fp32 rounding each, rows ascending from +0). */
static inline BX_HD float bx_tgt_bias_partial(const bx_tgt_wgrad *w, uint64_t c, uint64_t j) {
  uint64_t r0, r1;
  bx_tgt_chunk_rows(w, c, &r0, &r1);
  float acc = 0.0f;
  for (uint64_t r = r0; r < r1; r++) acc = acc + bx_gemm_load(w->dy, w->dy_bf16, r * w->n + j);
  return acc;
}

/* Bias thread i over zgroups * n items: group z = i / n, column j = i % n,
 * its chunks z, z + zgroups, ...; the words summed into *q (then one
 * atomicAdd on qb[j]), the rest into s (only s->q[0] unused). */
static inline BX_HD void bx_tgt_bias_item(const bx_tgt_wgrad *w, uint64_t i, int64_t *q,
                                          bx_tgt_acc *s) {
  uint64_t z = i / w->n, j = i % w->n;
  int64_t sum = 0;
  for (uint64_t c = z; c < w->nchunks; c += w->zgroups) {
    bx_tgt_elem e = bx_tgt_grid_elem(bx_tgt_bias_partial(w, c, j), w->inv_b, w->lim_b);
    sum = (int64_t)((uint64_t)sum + (uint64_t)e.q);
    s->mx = e.ab > s->mx ? e.ab : s->mx;
    s->nf += e.nonfinite;
    if (e.breaks && c < s->bad) s->bad = c;
  }
  *q = sum;
}

/* Thread (i0, stride) of the grid add's grid-stride kernel (bx_tgt_grid):
 * the words of its elements i0, i0 + stride, ... stored, their largest
 * |bits|, non-finite count and first breaking index into s (s->q unused). */
static inline BX_HD void bx_tgt_grid_thread(const bx_tgt_grid *g, uint64_t i0, uint64_t stride,
                                            bx_tgt_acc *s) {
  for (uint64_t i = i0; i < g->n; i += stride) {
    bx_tgt_elem e = bx_tgt_grid_elem(g->a[i], g->inv_step, g->lim);
    g->q[i] = e.q; /* one thread per word */
    s->mx = e.ab > s->mx ? e.ab : s->mx;
    s->nf += e.nonfinite;
    if (e.breaks && i < s->bad) s->bad = i;
  }
}

/* Chunk groups of a launch: enough blocks to fill a device (about 1024
 * tiles in all), at most one group per chunk and 65535 (grid z). Speed
 * only: any count gives the same words. */
static inline BX_HD uint64_t bx_tgt_zgroups(uint64_t tiles, uint64_t nchunks) {
  uint64_t z = tiles >= 1024 ? 1 : 1024 / (tiles ? tiles : 1);
  if (z > nchunks) z = nchunks;
  if (z > 65535) z = 65535;
  return z < 1 ? 1 : z;
}

/* The bodies' form of a weight-gradient launch (tokred.cu, and the host
 * simulation src/hostsim): zgroups for a weight grid of tiles tiles; qw and
 * qb NULL (the launcher's scratch sets them). Host code. */
static inline bx_tgt_wgrad bx_tgt_wgrad_of(const bx_tokred_dev_wgrad *w, uint64_t tiles) {
  bx_tgt_wgrad t;
  t.dy = w->dy;
  t.x = w->x;
  t.dy_bf16 = w->dy_bf16;
  t.x_bf16 = w->x_bf16;
  t.t = w->t;
  t.n = w->n;
  t.k = w->k;
  t.chunk = w->chunk;
  t.nchunks = w->nchunks;
  t.zgroups = bx_tgt_zgroups(tiles, w->nchunks);
  t.inv_w = w->inv_w;
  t.inv_b = w->inv_b;
  t.lim_w = w->lim_w;
  t.lim_b = w->lim_b;
  t.qw = t.qb = NULL;
  return t;
}

#endif /* BX_GRID_TOKRED_H */
