/*
 * train_wgrad.c — the routed experts' weight gradients as token
 * reductions (tr_wg_expert): per chunk of the micro-batch (one sequence in
 * grid mode, the micro-batch in the ordinary mode) the TN GEMM over the
 * expert's rows of that chunk, bounded a priori in pass 0 (glm_wg_bound_exp)
 * and added in pass 1. The linear layers' gradients are glm_node.c's
 * (glm_wg_linear; tr_wg_linear in glm_ops.c).
 */
#include <stdio.h>
#include <string.h>

#include "train_model_internal.h"

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
    glm_view vt, vb;
    bx_status st = bx_moe_expert_chunks(glm_i64(&vt, w->s.tok + r0, 1, rows, 0), w->C, c->n.chunk0,
                                        glm_i64(&vb, bd, 1, nch + 1, 0));
    if (tr_ck(c, st, what)) return -1;
  } else {
    for (int64_t j = 0; j <= nch; j++) bd[j] = 0;
  }
  for (int64_t ch = 0; ch < nch; ch++) {
    int64_t a = bd[ch], mrows = bd[ch + 1] - bd[ch];
    const float *pa = dy + (r0 + a) * n, *pb = x + (r0 + a) * k;
    bx_status st;
    glm_view vp;
    if (c->n.pass == 0) {
      if (mrows == 0) continue; /* a zero partial: bound -149, nothing to raise */
      int ex = glm_wg_bound_exp(tr_bf16_on(c, idx), mrows, pa, n, pb, k);
      st = bx_tokred_bound_exp(c->n.s, (size_t)idx, ex);
    } else if (mrows == 0) {
      st = bx_tokred_add(c->n.s, (size_t)idx, c->n.chunk0 + ch,
                         glm_f32(&vp, w->s.zeros, 2, p->shape[0], p->shape[1], 0));
    } else {
      if (glm_gemm(&c->n, tr_bf16_on(c, idx) ? 2 : 0, BX_GEMM_TN, pa, mrows, n, pb, NULL, mrows, k,
                     w->s.ep, n, k, 0, what))
        return -1;
      st = bx_tokred_add(c->n.s, (size_t)idx, c->n.chunk0 + ch,
                         glm_f32(&vp, w->s.ep, 2, p->shape[0], p->shape[1], 0));
    }
    if (tr_ck(c, st, what)) return -1;
  }
  return 0;
}
