/*
 * attention_hd.h — the arithmetic of bx_attention_forward/_backward
 * (src/train/attention.c, attention_bwd.c; bitexact_train_layers.h,
 * "Layers: causal GQA attention", states it), once for the CPU and the GPU
 * (BX_HD). Per (sequence, query head h, position i), j = 0..i:
 *
 *   dot    = +0; for d ascending: dot = fmaf(a[d], b[d], dot)   (q.k, dout.v)
 *   s_j    = dot * scale
 *   m      = s_0; for j = 1..i: m = s_j > m ? s_j : m
 *   e_j    = bx_expf_det(s_j - m)
 *   l      = fp32 of the fp64 sum of e_j, j ascending from +0 (one rounding)
 *   p_j    = e_j / l
 *   o[d]   = +0; for j ascending: o[d] = fmaf(p_j, v_j[d], o[d])
 * and backward (with the saved m, l):
 *   p_j    = bx_expf_det(s_j - m) / l        (the forward's p_j bits)
 *   delta  = fp32 of the fp64 sum of p_j*dp_j (exact products), j ascending
 *   gs_j   = (p_j * (dp_j - delta)) * scale
 *   dq[d]  = +0; for j ascending: dq[d] = fmaf(gs_j, k_j[d], dq[d])
 *   dk_j[d], dv_j[d] = +0; for h over the group ascending, i = j..L-1
 *            ascending: dk = fmaf(gs_ij, q_i[d], dk), dv = fmaf(p_ij, dout_i[d], dv)
 * Every value stored (o, stats, dq, dk, dv) is NaN-canonical (nan_canon.h).
 *
 * The max is a sequential compare-select (fp_hd.h bx_max_sel_f32, never
 * fmaxf): its value is the score at the first index of the largest
 * non-NaN score ((value, index) with the lower index on ties, so of -0
 * and +0 the first one met), except that a NaN s_0 stays (m is then NaN);
 * a NaN at j > 0 is passed over. A parallel reduction would have to carry
 * the index to keep these bits; both of bitexact's kernels run it
 * sequentially (one CPU row, one device thread per (token, head)).
 *
 * The two fp64 sums (l, delta) are sequential, j ascending, one rounding
 * to fp32 at the end: the CPU runs them in its row loop, the device in one
 * thread per (token, query head).
 *
 * The step functions are what a CPU loop or a device thread calls element
 * by element in the orders above; the row functions are the CPU's
 * in-place row passes over a row of scores held in memory (the device,
 * holding no row, recomputes each score from the same chain instead). The
 * CPU's chains over d and j run in the GEMM micro-kernels (kernels.h: the
 * same fmaf chains from +0, gemm_hd.h's step), the device's in
 * bx_attn_dot_f32 and the *_step_f32 functions here.
 */
#ifndef BX_ATTENTION_HD_H
#define BX_ATTENTION_HD_H

#include <stdint.h>

#include "fp_hd.h"
#include "hd.h"
#include "math_det.h"
#include "nan_canon.h"

/* ---- chains ---------------------------------------------------------------- */

/* One step of any of attention's fmaf chains (dot over d; o, dq over j;
 * dk, dv over (h, i)): acc + a * b, one rounding. */
static inline BX_HD float bx_attn_step_f32(float acc, float a, float b) {
  return bx_fmaf(a, b, acc);
}

/* The dot chain of n elements, +0 then d ascending (score q.k, dp dout.v). */
static inline BX_HD float bx_attn_dot_f32(const float *a, const float *b, uint64_t n) {
  float acc = 0.0f;
  for (uint64_t d = 0; d < n; d++) acc = bx_attn_step_f32(acc, a[d], b[d]);
  return acc;
}

/* ---- forward softmax --------------------------------------------------------- */

/* The score from its dot chain: dot * scale. */
static inline BX_HD float bx_attn_scale_f32(float dot, float scale) { return dot * scale; }

/* One step of the row max (m = s_0 first): s replaces m only when
 * strictly greater (the rule in the header comment). */
static inline BX_HD float bx_attn_max_step_f32(float m, float s) { return bx_max_sel_f32(m, s); }

/* e_j = exp(s_j - m), correctly rounded. */
static inline BX_HD float bx_attn_exp_f32(float s, float m) { return bx_expf_det(s - m); }

/* One step of l's fp64 sum (exact widening, one fp64 rounding). */
static inline BX_HD double bx_attn_sum_step(double sum, float e) { return sum + (double)e; }

/* l from the finished fp64 sum: one rounding. */
static inline BX_HD float bx_attn_sum_end_f32(double sum) { return (float)sum; }

/* p_j = e_j / l. */
static inline BX_HD float bx_attn_p_f32(float e, float l) { return e / l; }

/* The forward's stats (m, l) of a row, NaN-canonical, at st[0], st[1]. */
static inline BX_HD void bx_attn_store_stats(float *st, float m, float l) {
  st[0] = bx_canon_f32(m);
  st[1] = bx_canon_f32(l);
}

/* The CPU's softmax of one row of n >= 1 dot chains in s[0..n), in place:
 * s[j] becomes p_j; *m and *l get the row's stats (not canonicalised). */
static inline BX_HD void bx_attn_softmax_row_f32(float *s, uint64_t n, float scale, float *m,
                                                 float *l) {
  for (uint64_t j = 0; j < n; j++) s[j] = bx_attn_scale_f32(s[j], scale);
  float mx = s[0];
  for (uint64_t j = 1; j < n; j++) mx = bx_attn_max_step_f32(mx, s[j]);
  double sum = 0.0;
  for (uint64_t j = 0; j < n; j++) {
    s[j] = bx_attn_exp_f32(s[j], mx);
    sum = bx_attn_sum_step(sum, s[j]);
  }
  float lf = bx_attn_sum_end_f32(sum);
  for (uint64_t j = 0; j < n; j++) s[j] = bx_attn_p_f32(s[j], lf);
  *m = mx;
  *l = lf;
}

/* ---- backward ------------------------------------------------------------------- */

/* p_j again from the dot chain q_i.k_j and the saved (m, l): the bits of
 * the forward's p_j when the stats came from it. */
static inline BX_HD float bx_attn_prob_f32(float dot, float scale, float m, float l) {
  return bx_attn_p_f32(bx_attn_exp_f32(bx_attn_scale_f32(dot, scale), m), l);
}

/* One step of delta's fp64 sum: p * dp is exact in fp64, one rounding per
 * addition. */
static inline BX_HD double bx_attn_delta_step(double sum, float p, float dp) {
  return sum + (double)p * (double)dp;
}

/* delta from the finished fp64 sum: one rounding. */
static inline BX_HD float bx_attn_delta_end_f32(double sum) { return (float)sum; }

/* gs_j = (p_j * (dp_j - delta)) * scale, three roundings in that order. */
static inline BX_HD float bx_attn_gs_f32(float p, float dp, float delta, float scale) {
  return (p * (dp - delta)) * scale;
}

/* The CPU's backward pass over one row of n >= 1 positions, in place:
 * s[j] (the dot chain q.k_j) becomes p_j, dp[j] (the chain dout.v_j)
 * becomes gs_j; returns delta. */
static inline BX_HD float bx_attn_bwd_row_f32(float *s, float *dp, uint64_t n, float scale,
                                              float m, float l) {
  double sum = 0.0;
  for (uint64_t j = 0; j < n; j++) {
    s[j] = bx_attn_prob_f32(s[j], scale, m, l);
    sum = bx_attn_delta_step(sum, s[j], dp[j]);
  }
  float delta = bx_attn_delta_end_f32(sum);
  for (uint64_t j = 0; j < n; j++) dp[j] = bx_attn_gs_f32(s[j], dp[j], delta, scale);
  return delta;
}

#endif /* BX_ATTENTION_HD_H */
