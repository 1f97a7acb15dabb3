/*
 * grid_attention.h — the thread bodies of attention's CUDA launchers
 * (attention.cu), in plain C with BX_HD like train_grid.h, so that the C
 * test suite (tests/test_train_cuda_sim_attn.c) runs the same
 * decomposition on the CPU with blocks and threads shuffled. The
 * arithmetic is attention_hd.h's, the CPU kernels' own; this file only
 * says which thread computes which outputs, each in the CPU's order.
 *
 * Forward: one thread per (token t, query head h), item t * Hq + h. It
 * holds no row of scores: it runs the dot chain of each j three times
 * (the same bits each time), once for the max m over j = 0..i, once for
 * l's fp64 sum (j ascending), once for o's chains, which accumulate in
 * the thread's own row of o (+0 first, j outer ascending, d inner: each
 * o[d] one fmaf chain over j), canonicalised at the end; then (m, l).
 *
 * Backward, three kernels in this order, each thread owning its outputs:
 *  1. delta, per (token t, query head h), item t * Hq + h: p_j and dp_j
 *     from their chains, delta's fp64 sum over j ascending; the fp32 delta
 *     is parked in dq[t, h, 0] (dq is an output that shares no byte with
 *     another tensor of the call, and is written last): no scratch.
 *  2. dK/dV, per (key token t = b L + j, kv head g), item t * Hkv + g:
 *     dk_j, dv_j from +0 in the thread's rows of dk, dv, one fmaf chain
 *     per element over h = g R .. g R + R - 1 ascending, then i = j..L-1
 *     ascending, with gs_ij from (p_ij, dp_ij, delta_hi) (delta read from
 *     dq), canonicalised at the end.
 *  3. dQ, per (token t, query head h), item t * Hq + h: delta read from
 *     dq[t, h, 0] first, then the row of dq from +0, one fmaf chain per
 *     element over j = 0..i ascending, canonicalised at the end.
 * Every score-sized value (s, p, dp, gs) is recomputed where it is used,
 * from the same chains: 2-3x the CPU's score work, all of it fp32 SIMT.
 */
#ifndef BX_GRID_ATTENTION_H
#define BX_GRID_ATTENTION_H

#include <stdint.h>

#include "attention_hd.h"
#include "hd.h"
#include "nan_canon.h"

/* The geometry and tensors of one attention call (dense row-major):
 * q, o, dout, dq [T, Hq*D]; k, v, dk, dv [T, Hkv*D]; stats [T, Hq, 2]
 * (the forward's output, the backward's input). T = B * L. */
typedef struct bx_tg_attn {
  const float *q, *k, *v, *dout, *stats_in;
  float *o, *stats, *dq, *dk, *dv;
  uint64_t T, L, Hq, Hkv, D;
  float scale; /* fp32 nearest to D^-1/2 */
} bx_tg_attn;

/* The score s_j = (q . k_j) * scale of a query row and key row (D each). */
static inline BX_HD float bx_tg_attn_score(const bx_tg_attn *a, const float *q, const float *kj) {
  return bx_attn_scale_f32(bx_attn_dot_f32(q, kj, a->D), a->scale);
}

/* ---- forward: one thread per (token, query head) ---------------------------------- */

static inline BX_HD void bx_tg_attn_fwd_row(const bx_tg_attn *a, uint64_t it) {
  const uint64_t D = a->D, ldq = a->Hq * D, ldk = a->Hkv * D;
  const uint64_t t = it / a->Hq, h = it % a->Hq, i = t % a->L, t0 = t - i;
  const uint64_t g = h / (a->Hq / a->Hkv);
  const float *q = a->q + t * ldq + h * D;
  const float *kb = a->k + t0 * ldk + g * D, *vb = a->v + t0 * ldk + g * D;
  float *o = a->o + t * ldq + h * D;
  float m = bx_tg_attn_score(a, q, kb); /* m = s_0, then the strict-max steps */
  for (uint64_t j = 1; j <= i; j++)
    m = bx_attn_max_step_f32(m, bx_tg_attn_score(a, q, kb + j * ldk));
  double sum = 0.0;
  for (uint64_t j = 0; j <= i; j++)
    sum = bx_attn_sum_step(sum, bx_attn_exp_f32(bx_tg_attn_score(a, q, kb + j * ldk), m));
  const float l = bx_attn_sum_end_f32(sum);
  for (uint64_t d = 0; d < D; d++) o[d] = 0.0f;
  for (uint64_t j = 0; j <= i; j++) {
    float p = bx_attn_p_f32(bx_attn_exp_f32(bx_tg_attn_score(a, q, kb + j * ldk), m), l);
    const float *vj = vb + j * ldk;
    for (uint64_t d = 0; d < D; d++) o[d] = bx_attn_step_f32(o[d], p, vj[d]);
  }
  for (uint64_t d = 0; d < D; d++) o[d] = bx_canon_f32(o[d]);
  bx_attn_store_stats(a->stats + it * 2, m, l);
}

/* ---- backward --------------------------------------------------------------------- */

/* p_ij and gs_ij of the query row q (its dout row dout, stats st, delta
 * dl) and key j's rows kj, vj: the values of the CPU's backward row. */
static inline BX_HD void bx_tg_attn_pgs(const bx_tg_attn *a, const float *q, const float *dout,
                                        const float *st, float dl, const float *kj,
                                        const float *vj, float *p, float *gs) {
  float pj = bx_attn_prob_f32(bx_attn_dot_f32(q, kj, a->D), a->scale, st[0], st[1]);
  float dp = bx_attn_dot_f32(dout, vj, a->D);
  *p = pj;
  *gs = bx_attn_gs_f32(pj, dp, dl, a->scale);
}

/* Kernel 1: delta of (token, query head) it, parked in dq[t, h, 0]. */
static inline BX_HD void bx_tg_attn_delta_row(const bx_tg_attn *a, uint64_t it) {
  const uint64_t D = a->D, ldq = a->Hq * D, ldk = a->Hkv * D;
  const uint64_t t = it / a->Hq, h = it % a->Hq, i = t % a->L, t0 = t - i;
  const uint64_t g = h / (a->Hq / a->Hkv);
  const float *q = a->q + t * ldq + h * D, *dout = a->dout + t * ldq + h * D;
  const float *kb = a->k + t0 * ldk + g * D, *vb = a->v + t0 * ldk + g * D;
  const float *st = a->stats_in + it * 2;
  double sum = 0.0;
  for (uint64_t j = 0; j <= i; j++) {
    float p = bx_attn_prob_f32(bx_attn_dot_f32(q, kb + j * ldk, D), a->scale, st[0], st[1]);
    sum = bx_attn_delta_step(sum, p, bx_attn_dot_f32(dout, vb + j * ldk, D));
  }
  a->dq[t * ldq + h * D] = bx_attn_delta_end_f32(sum);
}

/* Kernel 2: dk, dv of (key token, kv head) it = t * Hkv + g. */
static inline BX_HD void bx_tg_attn_dkdv_row(const bx_tg_attn *a, uint64_t it) {
  const uint64_t D = a->D, ldq = a->Hq * D, ldk = a->Hkv * D, R = a->Hq / a->Hkv;
  const uint64_t t = it / a->Hkv, g = it % a->Hkv, j = t % a->L, t0 = t - j;
  const float *kj = a->k + t * ldk + g * D, *vj = a->v + t * ldk + g * D;
  float *dk = a->dk + t * ldk + g * D, *dv = a->dv + t * ldk + g * D;
  for (uint64_t d = 0; d < D; d++) dk[d] = dv[d] = 0.0f;
  for (uint64_t h = g * R; h < g * R + R; h++)
    for (uint64_t i = j; i < a->L; i++) {
      const uint64_t ti = t0 + i;
      const float *q = a->q + ti * ldq + h * D, *dout = a->dout + ti * ldq + h * D;
      float p, gs;
      bx_tg_attn_pgs(a, q, dout, a->stats_in + (ti * a->Hq + h) * 2, a->dq[ti * ldq + h * D], kj,
                     vj, &p, &gs);
      for (uint64_t d = 0; d < D; d++) {
        dk[d] = bx_attn_step_f32(dk[d], gs, q[d]);
        dv[d] = bx_attn_step_f32(dv[d], p, dout[d]);
      }
    }
  for (uint64_t d = 0; d < D; d++) {
    dk[d] = bx_canon_f32(dk[d]);
    dv[d] = bx_canon_f32(dv[d]);
  }
}

/* Kernel 3: dq of (token, query head) it (after kernel 2: its delta is
 * read first, then the row is overwritten). */
static inline BX_HD void bx_tg_attn_dq_row(const bx_tg_attn *a, uint64_t it) {
  const uint64_t D = a->D, ldq = a->Hq * D, ldk = a->Hkv * D;
  const uint64_t t = it / a->Hq, h = it % a->Hq, i = t % a->L, t0 = t - i;
  const uint64_t g = h / (a->Hq / a->Hkv);
  const float *q = a->q + t * ldq + h * D, *dout = a->dout + t * ldq + h * D;
  const float *kb = a->k + t0 * ldk + g * D, *vb = a->v + t0 * ldk + g * D;
  const float *st = a->stats_in + it * 2;
  float *dq = a->dq + t * ldq + h * D;
  const float dl = dq[0];
  for (uint64_t d = 0; d < D; d++) dq[d] = 0.0f;
  for (uint64_t j = 0; j <= i; j++) {
    const float *kj = kb + j * ldk;
    float p, gs;
    bx_tg_attn_pgs(a, q, dout, st, dl, kj, vb + j * ldk, &p, &gs);
    for (uint64_t d = 0; d < D; d++) dq[d] = bx_attn_step_f32(dq[d], gs, kj[d]);
  }
  for (uint64_t d = 0; d < D; d++) dq[d] = bx_canon_f32(dq[d]);
}

#endif /* BX_GRID_ATTENTION_H */
