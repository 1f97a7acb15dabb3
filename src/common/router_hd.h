/*
 * router_hd.h — one token of the GLM-4.5 MoE router (src/train/router.c;
 * bitexact_train.h, "MoE router and token dispatch" states the algorithm),
 * once for the CPU and the GPU (BX_HD): sigmoid scores, the choice scores
 * (+ bias), group scores (the two largest of each group added in fp32),
 * the topk_group best groups, the k best experts of the kept groups (ties
 * to the lower id: every decision is a compare of (value, id) pairs, no
 * fmaxf), written in ascending id, and the weights (normalised by the fp64
 * sum of the k scores, k ascending, one rounding each; times the scaling
 * factor). The backward of one token likewise. Every value stored is
 * NaN-canonical. The caller provides the token's scratch (no allocation
 * here): a thread of the CPU pool, or one device thread.
 */
#ifndef BX_ROUTER_HD_H
#define BX_ROUTER_HD_H

#include <stdint.h>

#include "fp_hd.h"
#include "hd.h"
#include "math_det.h"
#include "nan_canon.h"

/* The most experts and experts per token of a router call on a device:
 * a device thread keeps the token's scratch in local arrays of these
 * sizes (src/cuda/train/grid_moe.h, about 3 KiB a thread); router.c
 * refuses a larger device call (the host path has no such limit). */
#define BX_ROUTER_DEVICE_MAX_E 256
#define BX_ROUTER_DEVICE_MAX_K 32

/* The router's shape and options, as router.c checked them. */
typedef struct bx_router_cfg {
  int64_t E;   /* experts */
  int64_t G;   /* groups (n_group) */
  int64_t S;   /* experts per group, E / G >= 2 */
  int64_t kg;  /* topk_group */
  int64_t k;   /* experts per token */
  int norm;    /* norm_topk_prob */
  float rsf;   /* f32(routed_scaling_factor) */
} bx_router_cfg;

/* Is (va, a) ahead of (vb, b): larger value, ties the lower index. */
static inline BX_HD int bx_router_ahead(float va, int64_t a, float vb, int64_t b) {
  return va > vb || (va == vb && a < b);
}

/* One token: l = its E logits (no NaN: router.c refuses them), bias [E].
 * Scratch: s[E], c[E], gs[G], kept[G], sel[k]. Out: w[k] (weights) and
 * sel[k] (expert ids, ascending). */
static inline BX_HD void bx_router_token_f32(const bx_router_cfg *q, const float *l,
                                             const float *bias, float *s, float *c, float *gs,
                                             unsigned char *kept, int64_t *sel, float *w) {
  const int64_t E = q->E, G = q->G, S = q->S, k = q->k;
  for (int64_t e = 0; e < E; e++) {
    s[e] = bx_sigmoidf_det(l[e]);
    c[e] = s[e] + bias[e];
  }
  /* group scores: the two largest c of each group, added in fp32 */
  for (int64_t g = 0; g < G; g++) {
    const float *cg = c + g * S;
    float m1 = cg[0], m2 = cg[1];
    if (m2 > m1) { float x = m1; m1 = m2; m2 = x; }
    for (int64_t i = 2; i < S; i++) {
      if (cg[i] > m1) { m2 = m1; m1 = cg[i]; }
      else if (cg[i] > m2) m2 = cg[i];
    }
    gs[g] = m1 + m2;
    kept[g] = 0;
  }
  /* the topk_group best groups, ties to the lower group id */
  for (int64_t r = 0; r < q->kg; r++) {
    int64_t best = -1;
    for (int64_t g = 0; g < G; g++)
      if (!kept[g] && (best < 0 || bx_router_ahead(gs[g], g, gs[best], best))) best = g;
    if (best < 0) break; /* never (kg <= G); says so to a compiler that inlines local scratch */
    kept[best] = 1;
  }
  /* masked choice scores: -Inf outside the kept groups (transformers >= 5.12's
   * masked_fill(~mask, -inf): a masked expert is never chosen) */
  for (int64_t e = 0; e < E; e++)
    if (!kept[e / S]) c[e] = bx_neg_inf_f32();
  /* the k best experts: a list kept sorted by (value desc, id asc); an
   * expert enters only when strictly ahead of the current k-th, so the
   * lower id wins a tie (experts are visited in ascending id) */
  int64_t n = 0;
  for (int64_t e = 0; e < E; e++) {
    if (n == k && !bx_router_ahead(c[e], e, c[sel[n - 1]], sel[n - 1])) continue;
    int64_t i = n < k ? n++ : n - 1;
    while (i > 0 && bx_router_ahead(c[e], e, c[sel[i - 1]], sel[i - 1])) {
      sel[i] = sel[i - 1];
      i--;
    }
    sel[i] = e;
  }
  /* written in ascending expert id */
  for (int64_t a = 1; a < k; a++) {
    int64_t v = sel[a], b = a;
    while (b > 0 && sel[b - 1] > v) { sel[b] = sel[b - 1]; b--; }
    sel[b] = v;
  }
  double D = 0.0;
  if (q->norm) {
    for (int64_t a = 0; a < k; a++) D += (double)s[sel[a]];
    D += 1e-20;
  }
  for (int64_t a = 0; a < k; a++) {
    float v = q->norm ? (float)((double)s[sel[a]] / D) : s[sel[a]];
    w[a] = bx_canon_f32(v * q->rsf);
  }
}

/* The backward of one token: l its E logits, ids[k] its experts, dw[k]
 * the weights' gradient, r = f64(f32(routed_scaling_factor)); dl[E] is
 * written whole (zero outside the chosen experts). Scratch: g[k], s[k],
 * m[k] in fp64. */
static inline BX_HD void bx_router_token_bwd_f32(const float *l, const int64_t *ids,
                                                 const float *dw, int64_t E, int64_t k, int norm,
                                                 double r, double *g, double *s, double *m,
                                                 float *dl) {
  for (int64_t e = 0; e < E; e++) dl[e] = 0.0f;
  double D = 0.0, P = 0.0;
  for (int64_t a = 0; a < k; a++) {
    int64_t e = ids[a];
    s[a] = (double)bx_sigmoidf_det(l[e]);
    m[a] = (double)bx_sigmoidf_det(-l[e]); /* 1 - s, correctly rounded: no cancellation */
    g[a] = (double)dw[a] * r;
  }
  if (norm) {
    for (int64_t a = 0; a < k; a++) D += s[a];
    D += 1e-20;
    for (int64_t a = 0; a < k; a++) P += g[a] * s[a];
  }
  double u = norm ? P / D : 0.0;
  for (int64_t a = 0; a < k; a++) {
    double d = norm ? (g[a] - u) / D : g[a];
    dl[ids[a]] = bx_canon_f32((float)(d * (s[a] * m[a])));
  }
}

#endif /* BX_ROUTER_HD_H */
