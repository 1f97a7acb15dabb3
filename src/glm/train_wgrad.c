/*
 * train_wgrad.c — the model's weight gradients as token reductions: every
 * gradient is a sum over tokens of per-chunk partials (chunk = one
 * sequence in grid mode, one micro-batch in the ordinary mode), bounded
 * in pass 0 and added in pass 1 (train_model.c's scheme).
 *
 * Bounds: a linear layer's weight and bias, and an expert's weight, take
 * the a-priori bound of the TN chain (bx_linear_wgrad_bound,
 * bx_wgrad_bound_exp) from the chunk's rows of dY and X, so pass 0 skips
 * their GEMMs; the small tensors (norm gains, the loss) are bounded on
 * their computed partials (bx_tokred_bound). Both are functions of one
 * chunk's data, so the agreed grid (the max over chunks) is the same for
 * every layout.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "train_model_internal.h"

/* With bf16 compute (tr_bf16_on) the weight's TN partials take dY and X
 * rounded to bf16 (the same rounding as the forward's operands), while the
 * bias partial (a plain sum, not a GEMM) keeps fp32 dY: two calls, one per
 * tensor of the state. The a-priori bound reads the bf16 operands it
 * bounds. */
int tr_wg_linear(tr_ctx *c, int64_t w_idx, int64_t b_idx, const float *dy, int64_t n,
                 const float *x, int64_t k, const char *what) {
  tr_view vd, vx;
  bx_wgrad_opts wo = BX_WGRAD_OPTS_DEFAULT;
  wo.num_threads = c->threads;
  size_t wi = w_idx >= 0 ? (size_t)w_idx : BX_WGRAD_NONE;
  size_t bi = b_idx >= 0 ? (size_t)b_idx : BX_WGRAD_NONE;
  int64_t T = c->w->T;
  if (wi != BX_WGRAD_NONE && x && tr_bf16_on(c, w_idx)) {
    uint16_t *bd = tr_bf16_ws(c->m, 0, T * n), *bx = tr_bf16_ws(c->m, 1, T * k);
    if (!bd || !bx) {
      snprintf(c->err, c->errlen, "%s: out of memory (bf16 operand)", what);
      return -1;
    }
    tr_bf16_convert(dy, bd, T * n);
    tr_bf16_convert(x, bx, T * k);
    const DLTensor *td = tr_bf16(&vd, bd, 2, T, n), *tx = tr_bf16(&vx, bx, 2, T, k);
    bx_status st = c->pass == 0 ? bx_linear_wgrad_bound(c->s, wi, BX_WGRAD_NONE, td, tx, c->tok0, &wo)
                                : bx_linear_wgrad(c->s, wi, BX_WGRAD_NONE, td, tx, c->tok0, &wo);
    if (tr_ck(c, st, what)) return -1;
    if (bi == BX_WGRAD_NONE) return 0;
    wi = BX_WGRAD_NONE;
    x = NULL;
  }
  const DLTensor *td = tr_f32(&vd, dy, 2, T, n, 0);
  const DLTensor *tx = x ? tr_f32(&vx, x, 2, T, k, 0) : NULL;
  bx_status st = c->pass == 0 ? bx_linear_wgrad_bound(c->s, wi, bi, td, tx, c->tok0, &wo)
                              : bx_linear_wgrad(c->s, wi, bi, td, tx, c->tok0, &wo);
  return tr_ck(c, st, what);
}

/* partials [nch, numel of the parameter]: chunk j of the micro-batch is
 * global chunk chunk0 + j. */
int tr_wg_partials(tr_ctx *c, int64_t idx, const float *partials, const char *what) {
  const tr_param *p = &c->m->p[idx];
  for (int64_t j = 0; j < c->w->nch; j++) {
    tr_view v;
    DLTensor *t = tr_f32(&v, partials + j * p->numel, p->ndim, p->shape[0], p->shape[1], 0);
    bx_status st = c->pass == 0 ? bx_tokred_bound(c->s, (size_t)idx, c->chunk0 + j, t)
                                : bx_tokred_add(c->s, (size_t)idx, c->chunk0 + j, t);
    if (tr_ck(c, st, what)) return -1;
  }
  return 0;
}

static float max_abs(const float *p, int64_t n);

/* The a-priori exponent bound of a TN partial over rows of dY [rows, n]
 * and X [rows, k]; with bf (bf16 operands) the bound of the rounded
 * operands: rounding is monotone and odd, so max |bf16(v)| =
 * bf16(max |v|). */
int tr_wg_bound_exp(int bf, int64_t rows, const float *dy, int64_t n, const float *x, int64_t k) {
  float ma = max_abs(dy, rows * n), mb = max_abs(x, rows * k);
  if (bf) {
    ma = tr_bf16_widen(tr_bf16_round(ma));
    mb = tr_bf16_widen(tr_bf16_round(mb));
  }
  return bx_wgrad_bound_exp(rows, ma, mb);
}

static float max_abs(const float *p, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; i++) {
    float a = fabsf(p[i]);
    if (a > m && a <= 3.402823466e38f) m = a; /* finite only (NaN fails both tests) */
  }
  return m;
}

/* An expert weight [n, k]: dY rows dy[r0 .. r0+rows) ([., n]) and X rows
 * x[r0 ..] ([., k]) of the dispatched order, whose global token ids are
 * s.tok[r0 ..] (ascending: the dispatch order within an expert). Per chunk
 * of the micro-batch, the TN GEMM over the expert's rows of that chunk
 * (bx_moe_expert_chunks gives them as a contiguous range), or a zero
 * partial when no token of the chunk chose the expert: every chunk of
 * every tensor is added exactly once (bx_tokred_finish's coverage check). */
int tr_wg_expert(tr_ctx *c, int64_t idx, const float *dy, int64_t n, const float *x, int64_t k,
                 int64_t r0, int64_t rows, const char *what) {
  tr_work *w = c->w;
  const tr_param *p = &c->m->p[idx];
  int64_t nch = w->nch, *bd = w->s.bounds;
  if (rows > 0) {
    tr_view vt, vb;
    bx_status st = bx_moe_expert_chunks(tr_i64(&vt, w->s.tok + r0, 1, rows, 0), w->C, c->chunk0,
                                        tr_i64(&vb, bd, 1, nch + 1, 0));
    if (tr_ck(c, st, what)) return -1;
  } else {
    for (int64_t j = 0; j <= nch; j++) bd[j] = 0;
  }
  for (int64_t ch = 0; ch < nch; ch++) {
    int64_t a = bd[ch], mrows = bd[ch + 1] - bd[ch];
    const float *pa = dy + (r0 + a) * n, *pb = x + (r0 + a) * k;
    bx_status st;
    tr_view vp;
    if (c->pass == 0) {
      if (mrows == 0) continue; /* a zero partial: bound -149, nothing to raise */
      int ex = tr_wg_bound_exp(tr_bf16_on(c, idx), mrows, pa, n, pb, k);
      st = bx_tokred_bound_exp(c->s, (size_t)idx, ex);
    } else if (mrows == 0) {
      st = bx_tokred_add(c->s, (size_t)idx, c->chunk0 + ch,
                         tr_f32(&vp, w->s.zeros, 2, p->shape[0], p->shape[1], 0));
    } else {
      if (tr_gemm_op(c, tr_bf16_on(c, idx) ? 2 : 0, BX_GEMM_TN, pa, mrows, n, pb, NULL, mrows, k,
                     w->s.ep, n, k, 0, what))
        return -1;
      st = bx_tokred_add(c->s, (size_t)idx, c->chunk0 + ch,
                         tr_f32(&vp, w->s.ep, 2, p->shape[0], p->shape[1], 0));
    }
    if (tr_ck(c, st, what)) return -1;
  }
  return 0;
}
