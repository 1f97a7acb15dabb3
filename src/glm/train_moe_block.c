/*
 * train_moe_block.c — transformers' Glm4MoeMoE, forward and backward,
 * from bitexact_train.h's MoE kernels (bench/bench_moe.c times this block):
 *   logits = xn2·W_routerᵀ (fp32); bx_moe_router_forward (sigmoid,
 *   e_score_correction_bias for the choice only, group-limited top-k,
 *   norm_topk_prob, routed_scaling_factor); the dispatch plan (rows sorted
 *   by (expert, token)); per expert e with rows: g = X_e·W_gᵀ,
 *   u = X_e·W_uᵀ, h = SiLU(g)·u, y = h·W_dᵀ (the hub checkpoint's 2-D
 *   experts.e.{gate,up,down}_proj); the shared experts' MLP on xn2;
 *   out = bx_moe_unpermute(y, weights, initial = shared output), i.e.
 *   fl(Σ_j fl(w_j·y_j) + shared) with j in ascending expert id.
 * Backward: unpermute's gradient (dy per row, dweights per slot), the
 * experts' MLP backward per expert, the permute's gather, the router's
 * backward (through the normalisation and sigmoid), dxn2 =
 * gather(dX_e) + dlogits·W_router + the shared MLP's dX, summed in that
 * order. Weight gradients: the router and the shared experts as linear
 * layers; the routed experts per global chunk over their rows
 * (tr_wg_expert, with a zero partial where a chunk sent them nothing).
 */
#include <string.h>

#include "train_model_internal.h"

#define W(idx) (c->m->p[(idx)].data)

static bx_moe_router_opts router_opts(const tr_ctx *c) {
  bx_moe_router_opts ro = BX_MOE_ROUTER_OPTS_DEFAULT;
  ro.num_threads = c->n.threads;
  ro.n_group = c->m->c.n_group;
  ro.topk_group = c->m->c.topk_group;
  ro.norm_topk_prob = c->m->c.norm_topk_prob;
  ro.routed_scaling_factor = c->m->c.routed_scaling_factor;
  return ro;
}

int tr_moe_forward(tr_ctx *c, int64_t layer, float *out) {
  const tr_model *m = c->m;
  const tr_layer_ix *x = &m->lx[layer];
  tr_layer_act *a = &c->w->act[layer];
  int64_t T = c->w->T, H = m->c.hidden_size, E = m->c.n_routed_experts;
  int64_t K = m->c.num_experts_per_tok, R = T * K, I = m->c.moe_intermediate_size, SI = m->shared_inter;
  glm_view v[8];
  if (tr_gemm_nt(c, a->xn2, T, H, x->router_w, E, a->logits, "mlp.gate (router)")) return -1;
  bx_moe_router_opts ro = router_opts(c);
  bx_moe_dispatch_opts dop = BX_MOE_DISPATCH_OPTS_DEFAULT;
  dop.num_threads = c->n.threads;
  if (tr_ck(c, bx_moe_router_forward(glm_f32(&v[0], a->logits, 2, T, E, 0), glm_f32(&v[1], W(x->ecb), 1, E, 0, 0),
                                     glm_i64(&v[2], a->ids, 2, T, K), glm_f32(&v[3], a->w, 2, T, K, 0),
                                     c->w->C, NULL, &ro), "router"))
    return -1;
  if (tr_ck(c, bx_moe_dispatch_plan(glm_i64(&v[0], a->ids, 2, T, K), NULL, glm_i64(&v[1], a->offsets, 1, E + 1, 0),
                                    glm_i64(&v[2], a->row_map, 2, R, 2), glm_i64(&v[3], a->pos, 2, T, K), &dop),
            "dispatch plan"))
    return -1;
  if (tr_ck(c, bx_moe_permute(glm_f32(&v[0], a->xn2, 2, T, H, 0), glm_i64(&v[1], a->row_map, 2, R, 2),
                              glm_f32(&v[2], a->xp, 2, R, H, 0), &dop), "permute"))
    return -1;
  int ep = tr_ep_active(m);
  if (ep && tr_moe_ep_forward(c, layer)) return -1; /* the experts on their ranks */
  for (int64_t e = 0; e < (ep ? 0 : E); e++) {
    int64_t r0 = a->offsets[e], n = a->offsets[e + 1] - r0, p0 = x->expert0 + 3 * e;
    if (n == 0) continue;
    if (tr_gemm_nt(c, a->xp + r0 * H, n, H, p0, I, a->gp + r0 * I, "expert gate_proj") ||
        tr_gemm_nt(c, a->xp + r0 * H, n, H, p0 + 1, I, a->upp + r0 * I, "expert up_proj") ||
        tr_swiglu_fwd(c, a->gp + r0 * I, a->upp + r0 * I, a->hp + r0 * I, n, I, "expert swiglu") ||
        tr_gemm_nt(c, a->hp + r0 * I, n, I, p0 + 2, H, a->yp + r0 * H, "expert down_proj"))
      return -1;
  }
  if (tr_gemm_nt(c, a->xn2, T, H, x->sh_gate, SI, a->sg, "shared gate_proj") ||
      tr_gemm_nt(c, a->xn2, T, H, x->sh_up, SI, a->su, "shared up_proj") ||
      tr_swiglu_fwd(c, a->sg, a->su, a->sa, T, SI, "shared swiglu") ||
      tr_gemm_nt(c, a->sa, T, SI, x->sh_down, H, a->so, "shared down_proj"))
    return -1;
  return tr_ck(c, bx_moe_unpermute(glm_f32(&v[0], a->yp, 2, R, H, 0), glm_f32(&v[1], a->w, 2, T, K, 0),
                                   glm_i64(&v[2], a->row_map, 2, R, 2), glm_i64(&v[3], a->pos, 2, T, K),
                                   glm_f32(&v[4], a->so, 2, T, H, 0), glm_f32(&v[5], out, 2, T, H, 0), &dop),
               "unpermute");
}

int tr_moe_backward(tr_ctx *c, int64_t layer, const float *dout, float *dxn2) {
  const tr_model *m = c->m;
  const tr_layer_ix *x = &m->lx[layer];
  tr_layer_act *a = &c->w->act[layer];
  tr_scratch *s = &c->w->s;
  int64_t T = c->w->T, H = m->c.hidden_size, E = m->c.n_routed_experts;
  int64_t K = m->c.num_experts_per_tok, R = T * K, I = m->c.moe_intermediate_size, SI = m->shared_inter;
  glm_view v[8];
  bx_moe_dispatch_opts dop = BX_MOE_DISPATCH_OPTS_DEFAULT;
  dop.num_threads = c->n.threads;
  if (tr_ck(c, bx_moe_unpermute_backward(glm_f32(&v[0], dout, 2, T, H, 0), glm_f32(&v[1], a->yp, 2, R, H, 0),
                                         glm_f32(&v[2], a->w, 2, T, K, 0), glm_i64(&v[3], a->row_map, 2, R, 2),
                                         glm_i64(&v[4], a->pos, 2, T, K), glm_f32(&v[5], s->dyp, 2, R, H, 0),
                                         glm_f32(&v[6], s->dw, 2, T, K, 0), &dop), "unpermute backward"))
    return -1;
  int ep = tr_ep_active(m);
  if (ep && tr_moe_ep_backward(c, layer)) return -1; /* dxp and the held experts' wgrads */
  for (int64_t e = 0; e < (ep ? 0 : E); e++) {
    int64_t r0 = a->offsets[e], n = a->offsets[e + 1] - r0, p0 = x->expert0 + 3 * e;
    if (n == 0) continue;
    if (tr_gemm_nn(c, s->dyp + r0 * H, n, H, p0 + 2, I, s->dhp + r0 * I, 0, "expert down backward") ||
        tr_swiglu_bwd(c, a->gp + r0 * I, a->upp + r0 * I, s->dhp + r0 * I, s->dgp + r0 * I, s->dup + r0 * I,
                   n, I, "expert swiglu backward") ||
        tr_gemm_nn(c, s->dgp + r0 * I, n, I, p0, H, s->dxp + r0 * H, 0, "expert gate backward") ||
        tr_gemm_nn(c, s->dup + r0 * I, n, I, p0 + 1, H, s->dxp + r0 * H, 1, "expert up backward"))
      return -1;
  }
  if (tr_ck(c, bx_moe_permute_backward(glm_f32(&v[0], s->dxp, 2, R, H, 0), glm_i64(&v[1], a->row_map, 2, R, 2),
                                       glm_i64(&v[2], a->pos, 2, T, K), glm_f32(&v[3], dxn2, 2, T, H, 0), &dop),
            "permute backward"))
    return -1;
  bx_moe_router_opts ro = router_opts(c);
  if (tr_ck(c, bx_moe_router_backward(glm_f32(&v[0], a->logits, 2, T, E, 0), glm_i64(&v[1], a->ids, 2, T, K),
                                      glm_f32(&v[2], s->dw, 2, T, K, 0), glm_f32(&v[3], s->dlogits_r, 2, T, E, 0),
                                      &ro), "router backward"))
    return -1;
  if (tr_gemm_nn(c, s->dlogits_r, T, E, x->router_w, H, dxn2, 1, "router dX") ||
      tr_gemm_nn(c, dout, T, H, x->sh_down, SI, s->dsa, 0, "shared down backward") ||
      tr_swiglu_bwd(c, a->sg, a->su, s->dsa, s->dsg, s->dsu, T, SI, "shared swiglu backward") ||
      tr_gemm_nn(c, s->dsg, T, SI, x->sh_gate, H, dxn2, 1, "shared gate backward") ||
      tr_gemm_nn(c, s->dsu, T, SI, x->sh_up, H, dxn2, 1, "shared up backward"))
    return -1;
  /* weight gradients */
  if (tr_wg_linear(c, x->router_w, -1, s->dlogits_r, E, a->xn2, H, "router wgrad") ||
      tr_wg_linear(c, x->sh_gate, -1, s->dsg, SI, a->xn2, H, "shared gate wgrad") ||
      tr_wg_linear(c, x->sh_up, -1, s->dsu, SI, a->xn2, H, "shared up wgrad") ||
      tr_wg_linear(c, x->sh_down, -1, dout, H, a->sa, SI, "shared down wgrad"))
    return -1;
  if (ep) return 0;
  for (int64_t r = 0; r < R; r++) s->tok[r] = c->n.tok0 + a->row_map[2 * r];
  for (int64_t e = 0; e < E; e++) {
    int64_t r0 = a->offsets[e], n = a->offsets[e + 1] - r0, p0 = x->expert0 + 3 * e;
    if (tr_wg_expert(c, p0, s->dgp, I, a->xp, H, r0, n, "expert gate_proj wgrad") ||
        tr_wg_expert(c, p0 + 1, s->dup, I, a->xp, H, r0, n, "expert up_proj wgrad") ||
        tr_wg_expert(c, p0 + 2, s->dyp, H, a->hp, I, r0, n, "expert down_proj wgrad"))
      return -1;
  }
  return 0;
}
