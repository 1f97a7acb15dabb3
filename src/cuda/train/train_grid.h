/*
 * train_grid.h — the thread bodies of the training kernels' CUDA launchers
 * (the src/cuda/train .cu files), in plain C with BX_HD, so that the C test suite
 * (tests/test_train_cuda_sim.c) runs the very same decomposition on the
 * CPU: which thread computes which output, the GEMM's tiles, edges and
 * shared-memory phases, with blocks and threads in a shuffled order. The
 * arithmetic is the CPU kernels' own (the src/common _hd.h headers); this file only
 * maps threads to outputs. A __global__ kernel is a loop of one of these
 * bodies over its grid-stride indices (or the GEMM's phases between
 * __syncthreads()).
 */
#ifndef BX_TRAIN_GRID_H
#define BX_TRAIN_GRID_H

#include <stddef.h>
#include <stdint.h>

#include "adamw_hd.h"
#include "gemm_hd.h"
#include "hd.h"
#include "rmsnorm_hd.h"
#include "rope_hd.h"
#include "swiglu_hd.h"

/* Threads per block of the elementwise and per-row kernels, and the most
 * blocks they launch (grid-stride loops cover the rest). */
#define BX_TG_BLOCK 256u
#define BX_TG_MAX_BLOCKS 65535u

/* Blocks for n threads' worth of work (at least 1). */
static inline BX_HD uint32_t bx_tg_blocks(uint64_t n) {
  uint64_t b = (n + BX_TG_BLOCK - 1) / BX_TG_BLOCK;
  return b < 1 ? 1u : b > BX_TG_MAX_BLOCKS ? BX_TG_MAX_BLOCKS : (uint32_t)b;
}

/* ---- SwiGLU: one thread per element, i over rows * f -------------------------- */

typedef struct bx_tg_swiglu {
  const float *g, *u, *dh;
  float *h, *dg, *du;
  uint64_t rows, f, ldg, ldu, ldh, lddg, lddu;
} bx_tg_swiglu;

static inline BX_HD void bx_tg_swiglu_fwd(const bx_tg_swiglu *a, uint64_t i) {
  uint64_t r = i / a->f, c = i % a->f;
  a->h[r * a->ldh + c] = bx_swiglu_fwd_f32(a->g[r * a->ldg + c], a->u[r * a->ldu + c]);
}

static inline BX_HD void bx_tg_swiglu_bwd(const bx_tg_swiglu *a, uint64_t i) {
  uint64_t r = i / a->f, c = i % a->f;
  float dg, du; /* read everything before writing: dg may be g, du u */
  bx_swiglu_bwd_f32(a->g[r * a->ldg + c], a->u[r * a->ldu + c], a->dh[r * a->ldh + c], &dg, &du);
  a->dg[r * a->lddg + c] = dg;
  a->du[r * a->lddu + c] = du;
}

/* ---- AdamW: one thread per element ------------------------------------------------ */

typedef struct bx_tg_adamw {
  float *p, *m, *v;
  const float *g;
  uint64_t n;
  bx_adamw_scalars s;
} bx_tg_adamw;

static inline BX_HD void bx_tg_adamw_elem(const bx_tg_adamw *a, uint64_t i) {
  bx_adamw_prep q = bx_adamw_prepare(&a->s);
  bx_adamw_elem_f32(&a->p[i], a->g[i], &a->m[i], &a->v[i], q.dec, q.wl, q.near0, a->s.one_m_b2,
                    a->s.beta2, a->s.bc2_sqrt, a->s.eps, a->s.neg_step);
}

/* ---- RMSNorm: one thread per row (forward, dx); one per (chunk, column) ---------- */

typedef struct bx_tg_rmsnorm {
  const float *x, *w, *dy, *rstd_in;
  float *y, *rstd, *dx, *partials;
  uint64_t rows, h, chunk, nchunks;
  float eps;
} bx_tg_rmsnorm;

static inline BX_HD void bx_tg_rmsnorm_fwd_row(const bx_tg_rmsnorm *a, uint64_t r) {
  const float *x = a->x + r * a->h;
  float *y = a->y + r * a->h;
  float rs = bx_rmsnorm_rstd_f32(x, 1, a->h, a->eps);
  for (uint64_t k = 0; k < a->h; k++) y[k] = bx_rmsnorm_y_f32(x[k], a->w[k], rs);
  if (a->rstd) a->rstd[r] = bx_canon_f32(rs);
}

/* i over nchunks * h: chunk i / h, column i % h (launched before dx: dx may be dy) */
static inline BX_HD void bx_tg_rmsnorm_part(const bx_tg_rmsnorm *a, uint64_t i) {
  uint64_t c = i / a->h, k = i % a->h;
  uint64_t t0 = c * a->chunk, t1 = a->rows - t0 < a->chunk ? a->rows : t0 + a->chunk;
  a->partials[c * a->h + k] = bx_rmsnorm_wpart_f32(a->x, a->dy, a->rstd_in, a->h, k, t0, t1);
}

static inline BX_HD void bx_tg_rmsnorm_dx_row(const bx_tg_rmsnorm *a, uint64_t r) {
  const float *x = a->x + r * a->h, *dy = a->dy + r * a->h;
  float *dx = a->dx + r * a->h;
  const float rs = a->rstd_in[r];
  float m = bx_rmsnorm_bwd_mean_f32(x, a->w, dy, 1, a->h, rs);
  for (uint64_t k = 0; k < a->h; k++) dx[k] = bx_rmsnorm_dx_f32(x[k], a->w[k], dy[k], rs, m);
}

/* ---- RoPE: one thread per (token, feature slot) ----------------------------------- */

/* i over tokens * (half + rest), rest = head_dim - 2 half: slot s < half
 * rotates pair (s, s + half) of every head; slot half + j copies feature
 * 2 half + j of every head (unless y is x). */
typedef struct bx_tg_rope {
  const float *x;
  float *y;
  const int64_t *pos;
  uint64_t tokens, width, head_dim, heads, half, rotary_dim;
  float theta, sin_sign;
} bx_tg_rope;

static inline BX_HD uint64_t bx_tg_rope_slots(const bx_tg_rope *a) {
  return a->half + (a->head_dim - 2 * a->half);
}

static inline BX_HD void bx_tg_rope_slot(const bx_tg_rope *a, uint64_t i) {
  uint64_t ns = bx_tg_rope_slots(a), t = i / ns, sl = i % ns;
  const float *x = a->x + t * a->width;
  float *y = a->y + t * a->width;
  if (sl < a->half) {
    float inv = bx_rope_inv_freq_f32(sl, a->rotary_dim, a->theta), c, s;
    bx_rope_cos_sin_f32(bx_rope_angle_f32(a->pos[t], inv), a->sin_sign, &c, &s);
    for (uint64_t hd = 0; hd < a->heads; hd++) {
      uint64_t o = hd * a->head_dim + sl;
      bx_rope_pair_f32(x[o], x[o + a->half], c, s, &y[o], &y[o + a->half]);
    }
  } else if (x != y) {
    uint64_t f = 2 * a->half + (sl - a->half);
    for (uint64_t hd = 0; hd < a->heads; hd++) y[hd * a->head_dim + f] = x[hd * a->head_dim + f];
  }
}

/* ---- GEMM: a tiled SIMT kernel, each output one chain over k ascending ------------ */

/* A block computes a BM x BN tile of C with BX_TG_GEMM_THREADS threads,
 * each a TM x TN sub-tile (rows ty + 16 r, columns tx + 16 c: strided, so
 * that neighbouring threads touch neighbouring columns); k advances BK at
 * a time through shared memory (A and B widened to fp32 exactly). No split
 * of k, no reordering: a thread's outputs are each one bx_gemm_step chain
 * from bx_gemm_start to the last k, and the last k tile runs only its
 * valid steps (a padded fma(0, 0, -0) would turn -0 into +0). Padded rows
 * and columns are computed from zeros and never stored. Grid: x over row
 * tiles, y over column tiles. */
#define BX_TG_GEMM_BM 64u
#define BX_TG_GEMM_BN 64u
#define BX_TG_GEMM_BK 16u
#define BX_TG_GEMM_TM 4u
#define BX_TG_GEMM_TN 4u
#define BX_TG_GEMM_THREADS 256u /* (BM / TM) * (BN / TN) */

typedef struct bx_tg_gemm {
  const void *a, *b;
  int a_bf16, b_bf16;
  int layout; /* bx_gemm_layout: 0 NT, 1 NN, 2 TN (bitexact_train_gemm.h) */
  float *c;
  uint64_t m, n, k;
  int accumulate;
} bx_tg_gemm;

/* A(i, p) and B(p, j) of the product in each layout (row-major storage):
 * NT: a [M,K], b [N,K]; NN: a [M,K], b [K,N]; TN: a [K,M], b [K,N]. */
static inline BX_HD float bx_tg_gemm_a(const bx_tg_gemm *g, uint64_t i, uint64_t p) {
  return bx_gemm_load(g->a, g->a_bf16, g->layout == 2 ? p * g->m + i : i * g->k + p);
}
static inline BX_HD float bx_tg_gemm_b(const bx_tg_gemm *g, uint64_t p, uint64_t j) {
  return bx_gemm_load(g->b, g->b_bf16, g->layout == 0 ? j * g->k + p : p * g->n + j);
}

/* The chains' starts of thread tid of block (bm, bn). */
static inline BX_HD void bx_tg_gemm_init(const bx_tg_gemm *g, uint64_t bm, uint64_t bn,
                                         uint32_t tid, float *acc) {
  uint32_t ty = tid / 16, tx = tid % 16;
  for (uint32_t r = 0; r < BX_TG_GEMM_TM; r++)
    for (uint32_t c = 0; c < BX_TG_GEMM_TN; c++) {
      uint64_t i = bm * BX_TG_GEMM_BM + ty + 16 * r, j = bn * BX_TG_GEMM_BN + tx + 16 * c;
      float c0 = i < g->m && j < g->n && g->accumulate ? g->c[i * g->n + j] : 0.0f;
      acc[r * BX_TG_GEMM_TN + c] = bx_gemm_start_f32(g->accumulate, c0);
    }
}

/* Thread tid's share of the k tile at k0: As[kk * BM + ii], Bs[kk * BN + jj]
 * (zeros outside the matrices). */
static inline BX_HD void bx_tg_gemm_load(const bx_tg_gemm *g, uint64_t bm, uint64_t bn,
                                         uint64_t k0, uint32_t tid, float *As, float *Bs) {
  for (uint32_t e = tid; e < BX_TG_GEMM_BK * BX_TG_GEMM_BM; e += BX_TG_GEMM_THREADS) {
    uint32_t kk = e / BX_TG_GEMM_BM, ii = e % BX_TG_GEMM_BM;
    uint64_t i = bm * BX_TG_GEMM_BM + ii, p = k0 + kk;
    As[e] = i < g->m && p < g->k ? bx_tg_gemm_a(g, i, p) : 0.0f;
  }
  for (uint32_t e = tid; e < BX_TG_GEMM_BK * BX_TG_GEMM_BN; e += BX_TG_GEMM_THREADS) {
    uint32_t kk = e / BX_TG_GEMM_BN, jj = e % BX_TG_GEMM_BN;
    uint64_t j = bn * BX_TG_GEMM_BN + jj, p = k0 + kk;
    Bs[e] = j < g->n && p < g->k ? bx_tg_gemm_b(g, p, j) : 0.0f;
  }
}

/* Thread tid's steps over the valid k of the tile at k0. */
static inline BX_HD void bx_tg_gemm_compute(const bx_tg_gemm *g, uint64_t k0, uint32_t tid,
                                            const float *As, const float *Bs, float *acc) {
  uint32_t ty = tid / 16, tx = tid % 16;
  uint32_t kb = g->k - k0 < BX_TG_GEMM_BK ? (uint32_t)(g->k - k0) : BX_TG_GEMM_BK;
  for (uint32_t kk = 0; kk < kb; kk++) {
    float av[BX_TG_GEMM_TM], bv[BX_TG_GEMM_TN];
    for (uint32_t r = 0; r < BX_TG_GEMM_TM; r++) av[r] = As[kk * BX_TG_GEMM_BM + ty + 16 * r];
    for (uint32_t c = 0; c < BX_TG_GEMM_TN; c++) bv[c] = Bs[kk * BX_TG_GEMM_BN + tx + 16 * c];
    for (uint32_t r = 0; r < BX_TG_GEMM_TM; r++)
      for (uint32_t c = 0; c < BX_TG_GEMM_TN; c++)
        acc[r * BX_TG_GEMM_TN + c] = bx_gemm_step_f32(acc[r * BX_TG_GEMM_TN + c], av[r], bv[c]);
  }
}

/* Thread tid's valid outputs stored. */
static inline BX_HD void bx_tg_gemm_store(const bx_tg_gemm *g, uint64_t bm, uint64_t bn,
                                          uint32_t tid, const float *acc) {
  uint32_t ty = tid / 16, tx = tid % 16;
  for (uint32_t r = 0; r < BX_TG_GEMM_TM; r++)
    for (uint32_t c = 0; c < BX_TG_GEMM_TN; c++) {
      uint64_t i = bm * BX_TG_GEMM_BM + ty + 16 * r, j = bn * BX_TG_GEMM_BN + tx + 16 * c;
      if (i < g->m && j < g->n) g->c[i * g->n + j] = bx_gemm_store_f32(acc[r * BX_TG_GEMM_TN + c]);
    }
}

#endif /* BX_TRAIN_GRID_H */
