/*
 * grid_moe.h — the thread bodies of the MoE router, the token dispatch's
 * permute/unpermute, the embedding and the cross-entropy on CUDA
 * (router.cu, permute.cu, embedding.cu, xent.cu), in plain C with BX_HD as
 * train_grid.h, so that tests/test_train_cuda_sim_moe.c runs the same
 * decomposition on the CPU with blocks and threads shuffled. This file
 * only maps threads to outputs; the arithmetic is the CPU kernels' own
 * (router_hd.h, permute_hd.h, embedding_hd.h, xent_hd.h). Every body
 * writes only its own outputs and reads only inputs (or, for the counts
 * and chunk partials, what an earlier launch of the same call wrote), so
 * the result does not depend on the order of threads.
 *
 * The host-side decisions stay in src/train: every check of device data
 * that decides an error (NaN logits, bias, id ranges, the plan, targets)
 * runs on a host copy before the first launch; embedding backward's
 * per-chunk sort of ids runs on the host and reaches the device as the
 * call's row_ids and offsets outputs.
 */
#ifndef BX_GRID_MOE_H
#define BX_GRID_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "embedding_hd.h"
#include "hd.h"
#include "nan_canon.h"
#include "permute_hd.h"
#include "router_hd.h"
#include "train_grid.h"
#include "xent_hd.h"

/* Element i of an id tensor of int32 (i64 = 0) or int64 elements. */
static inline BX_HD int64_t bx_tg_id(const void *ids, int i64, uint64_t i) {
  return i64 ? ((const int64_t *)ids)[i] : (int64_t)((const int32_t *)ids)[i];
}

/* ---- MoE router: one thread per token; counts one per (chunk, expert) ------------ */

/* The most experts and slots a device thread's scratch holds (its local
 * arrays: about 3 KiB a thread; router_hd.h). router.c refuses a larger
 * call on the device with BX_EINVAL (the host path has no such limit). */
#define BX_TG_ROUTER_MAX_E BX_ROUTER_DEVICE_MAX_E
#define BX_TG_ROUTER_MAX_K BX_ROUTER_DEVICE_MAX_K

typedef struct bx_tg_router {
  const float *logits; /* [T, E] */
  const float *bias;   /* [E] (forward) */
  const float *dw;     /* [T, k] (backward) */
  void *ids;           /* [T, k] int32 or (ids_i64) int64: written forward, read backward */
  int ids_i64;
  float *weights;      /* [T, k] (forward) */
  float *dl;           /* [T, E] (backward) */
  int64_t *counts;     /* [nchunks, E] or NULL (forward) */
  uint64_t T, chunk, nchunks;
  bx_router_cfg q;     /* E, G, S, kg, k, norm, rsf */
  double r;            /* backward: f64(f32(routed_scaling_factor)) */
} bx_tg_router;

/* Token t: its k weights and expert ids (ascending). */
static inline BX_HD void bx_tg_router_fwd_token(const bx_tg_router *a, uint64_t t) {
  float s[BX_TG_ROUTER_MAX_E], c[BX_TG_ROUTER_MAX_E], gs[BX_TG_ROUTER_MAX_E / 2];
  unsigned char kept[BX_TG_ROUTER_MAX_E / 2];
  int64_t sel[BX_TG_ROUTER_MAX_K];
  const uint64_t E = (uint64_t)a->q.E, k = (uint64_t)a->q.k;
  bx_router_token_f32(&a->q, a->logits + t * E, a->bias, s, c, gs, kept, sel, a->weights + t * k);
  for (uint64_t j = 0; j < k; j++) {
    if (a->ids_i64)
      ((int64_t *)a->ids)[t * k + j] = sel[j];
    else
      ((int32_t *)a->ids)[t * k + j] = (int32_t)sel[j];
  }
}

/* i over nchunks * E: the count of expert i % E in chunk i / E (tokens
 * [c * chunk, min(T, (c + 1) * chunk)), every slot), from the ids the
 * token kernel wrote (launched after it). */
static inline BX_HD void bx_tg_router_count(const bx_tg_router *a, uint64_t i) {
  const uint64_t E = (uint64_t)a->q.E, k = (uint64_t)a->q.k;
  uint64_t c = i / E, e = i % E;
  uint64_t t0 = c * a->chunk, t1 = a->T - t0 < a->chunk ? a->T : t0 + a->chunk;
  int64_t n = 0;
  for (uint64_t j = t0 * k; j < t1 * k; j++) n += bx_tg_id(a->ids, a->ids_i64, j) == (int64_t)e;
  a->counts[i] = n;
}

/* Token t's row of dlogits (all E written). */
static inline BX_HD void bx_tg_router_bwd_token(const bx_tg_router *a, uint64_t t) {
  double g[BX_TG_ROUTER_MAX_K], s[BX_TG_ROUTER_MAX_K], m[BX_TG_ROUTER_MAX_K];
  int64_t ids[BX_TG_ROUTER_MAX_K];
  const uint64_t E = (uint64_t)a->q.E, k = (uint64_t)a->q.k;
  for (uint64_t j = 0; j < k; j++) ids[j] = bx_tg_id(a->ids, a->ids_i64, t * k + j);
  bx_router_token_bwd_f32(a->logits + t * E, ids, a->dw + t * k, a->q.E, a->q.k, a->q.norm, a->r,
                          g, s, m, a->dl + t * E);
}

/* ---- token dispatch: one thread per output element -------------------------------- */

typedef struct bx_tg_permute {
  const float *x;        /* permute: x [T, H]; gathers: the [R, H] expert rows */
  const float *w;        /* weights [T, k] */
  const float *init;     /* unpermute: initial [T, H] or NULL */
  const float *dout;     /* unpermute backward: [T, H] */
  const int64_t *rm;     /* row_map [R, 2] */
  const int64_t *pos;    /* pos [T, k] */
  float *y;              /* the [R, H] or [T, H] output */
  float *dw;             /* unpermute backward: dweights [T, k] */
  uint64_t T, k, H, R;
} bx_tg_permute;

/* i over R * H: x_perm[r][h] = x[row_map[r][0]][h] (a copy: the bits kept). */
static inline BX_HD void bx_tg_permute_elem(const bx_tg_permute *a, uint64_t i) {
  uint64_t r = i / a->H, h = i % a->H;
  a->y[i] = a->x[(uint64_t)a->rm[2 * r] * a->H + h];
}

/* i over T * H: dx[t][h], the gather sum of dx_perm's rows pos[t][*]. */
static inline BX_HD void bx_tg_permute_bwd_elem(const bx_tg_permute *a, uint64_t i) {
  uint64_t t = i / a->H, h = i % a->H;
  a->y[i] = bx_permute_sum_out_f32(a->x, a->pos + t * a->k, (int64_t)a->k, (int64_t)a->H,
                                   (int64_t)h);
}

/* i over T * H: out[t][h]. */
static inline BX_HD void bx_tg_unpermute_elem(const bx_tg_permute *a, uint64_t i) {
  uint64_t t = i / a->H, h = i % a->H;
  a->y[i] = bx_unpermute_out_f32(a->x, a->pos + t * a->k, a->w + t * a->k, (int64_t)a->k,
                                 (int64_t)a->H, (int64_t)h, a->init ? a->init + t * a->H : NULL);
}

/* i over R * H: dy_perm[r][h] = w[t][j] * dout[t][h], (t, j) = row_map[r]. */
static inline BX_HD void bx_tg_unpermute_dy_elem(const bx_tg_permute *a, uint64_t i) {
  uint64_t r = i / a->H, h = i % a->H;
  uint64_t t = (uint64_t)a->rm[2 * r], j = (uint64_t)a->rm[2 * r + 1];
  a->y[i] = bx_unpermute_dy_f32(a->w[t * a->k + j], a->dout[t * a->H + h]);
}

/* i over T * k: dweights[t][j], one bx_fmaf chain over h. */
static inline BX_HD void bx_tg_unpermute_dw_slot(const bx_tg_permute *a, uint64_t i) {
  uint64_t t = i / a->k;
  a->dw[i] = bx_unpermute_dw_out_f32(a->dout + t * a->H, a->x + (uint64_t)a->pos[i] * a->H,
                                     (int64_t)a->H);
}

/* ---- embedding: one thread per output element -------------------------------------- */

typedef struct bx_tg_embedding {
  const float *w;          /* forward: weight [V, H] */
  const float *dy;         /* backward: dy [T, H] */
  const void *ids;         /* [T] int32 or (ids_i64) int64, checked in [0, V) */
  int ids_i64;
  float *y;                /* forward: [T, H]; backward: rows [T, H] (total written) */
  const int64_t *row_ids;  /* backward: [total], the host's sort */
  const int64_t *offsets;  /* backward: [nchunks + 1], the host's prefix */
  uint64_t T, H, chunk, nchunks;
} bx_tg_embedding;

/* i over T * H: y[t][h] = weight[ids[t]][h] (a lookup: the bits kept). */
static inline BX_HD void bx_tg_embedding_fwd_elem(const bx_tg_embedding *a, uint64_t i) {
  uint64_t t = i / a->H, h = i % a->H;
  a->y[i] = a->w[(uint64_t)bx_tg_id(a->ids, a->ids_i64, t) * a->H + h];
}

/* i over total * H: column h of compact row q = i / H, the partial of id
 * row_ids[q] in its chunk (the last c with offsets[c] <= q): the fp32 sum
 * from +0 of dy's rows of the chunk's tokens with that id, tokens
 * ascending (embedding_hd.h's steps; the thread finds the tokens by
 * walking the chunk's ids: no device scratch for the host's token lists). */
static inline BX_HD void bx_tg_embedding_bwd_elem(const bx_tg_embedding *a, uint64_t i) {
  uint64_t q = i / a->H, h = i % a->H;
  uint64_t lo = 0, hi = a->nchunks; /* offsets[lo] <= q < offsets[hi] */
  while (hi - lo > 1) {
    uint64_t mid = lo + (hi - lo) / 2;
    if ((uint64_t)a->offsets[mid] <= q) lo = mid;
    else hi = mid;
  }
  uint64_t t0 = lo * a->chunk, t1 = a->T - t0 < a->chunk ? a->T : t0 + a->chunk;
  int64_t id = a->row_ids[q];
  float acc = 0.0f;
  for (uint64_t t = t0; t < t1; t++)
    if (bx_tg_id(a->ids, a->ids_i64, t) == id) acc = bx_embedding_add_f32(acc, a->dy[t * a->H + h]);
  a->y[i] = bx_canon_f32(acc);
}

/* ---- cross-entropy: one thread per token row; one per chunk ------------------------ */

typedef struct bx_tg_xent {
  const float *z;        /* logits [T, V] */
  const void *y;         /* targets [T] int32 or (y_i64) int64, checked */
  int y_i64;
  int64_t ignore;        /* ignore_index */
  float *g;              /* dlogits [T, V] or NULL (may be z exactly) */
  float *loss;           /* losses [T] or NULL */
  float *partials;       /* [nchunks] or NULL (forward) */
  int64_t *counts;       /* [nchunks] or NULL (forward) */
  uint64_t T, V, chunk, nchunks;
  double c;              /* f64(grad_scale / n_global) */
} bx_tg_xent;

/* Token t's loss and gradient row (xent_hd.h's row: max, exp, the fp64
 * sum S sequential in ascending v, as on the CPU). */
static inline BX_HD void bx_tg_xent_row(const bx_tg_xent *a, uint64_t t) {
  int64_t y = bx_tg_id(a->y, a->y_i64, t);
  bx_xent_row_f32(a->z + t * a->V, a->g ? a->g + t * a->V : NULL, a->V, y == a->ignore ? -1 : y,
                  a->c, a->loss ? &a->loss[t] : NULL);
}

/* Chunk i's loss partial (fp32 adds from +0 of its non-ignored losses,
 * tokens ascending) and count, from the losses the row kernel wrote
 * (launched after it). */
static inline BX_HD void bx_tg_xent_chunk(const bx_tg_xent *a, uint64_t i) {
  uint64_t t0 = i * a->chunk, t1 = a->T - t0 < a->chunk ? a->T : t0 + a->chunk;
  float acc = 0.0f;
  int64_t n = 0;
  for (uint64_t t = t0; t < t1; t++)
    if (bx_tg_id(a->y, a->y_i64, t) != a->ignore) {
      acc = acc + a->loss[t];
      n++;
    }
  if (a->partials) a->partials[i] = bx_canon_f32(acc);
  if (a->counts) a->counts[i] = n;
}

#endif /* BX_GRID_MOE_H */
