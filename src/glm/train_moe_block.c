/*
 * train_moe_block.c — the model's MoE layers: transformers' Glm4MoeMoE as
 * the node glm_moe_fwd / glm_moe_bwd (glm_moe.h: the block's kernel order,
 * expert parallelism and weight gradients live there), given the layer's
 * weights (the parameters' data, bf16 copies and state indices), its
 * activations and scratch in the workspace, and the model's EP group.
 * bench/bench_moe.c times this block.
 */
#include <string.h>

#include "train_model_internal.h"

/* The block's weights of layer `layer` (the experts' glm_lin in w->elin). */
static glm_moe_w moe_w(tr_ctx *c, int64_t layer) {
  const tr_model *m = c->m;
  const tr_layer_ix *x = &m->lx[layer];
  glm_moe_w b;
  b.E = m->c.n_routed_experts;
  b.K = m->c.num_experts_per_tok;
  b.H = m->c.hidden_size;
  b.I = m->c.moe_intermediate_size;
  b.SI = m->shared_inter;
  b.n_group = m->c.n_group;
  b.topk_group = m->c.topk_group;
  b.norm_topk_prob = m->c.norm_topk_prob;
  b.routed_scaling_factor = m->c.routed_scaling_factor;
  b.router = tr_lin(c, x->router_w, -1);
  b.ecb = m->p[x->ecb].data;
  for (int64_t i = 0; i < 3 * b.E; i++) c->w->elin[i] = tr_lin(c, x->expert0 + i, -1);
  b.experts = c->w->elin;
  b.shared[0] = tr_lin(c, x->sh_gate, -1);
  b.shared[1] = tr_lin(c, x->sh_up, -1);
  b.shared[2] = tr_lin(c, x->sh_down, -1);
  return b;
}

/* The model's EP group as the node's (NULL: none). */
static const glm_ep *moe_ep(tr_ctx *c, glm_ep *ep) {
  const tr_ep *t = c->m->ep;
  if (!tr_ep_active(c->m)) return NULL;
  ep->size = t->size;
  ep->rank = t->rank;
  ep->alltoall_i64 = t->alltoall_i64;
  ep->alltoallv = t->alltoallv;
  ep->ctx = t->ctx;
  ep->local_tokens = c->local_tokens;
  ep->a2a_bytes = &c->m->ep->a2a_bytes;
  ep->scr = &c->w->eps;
  return ep;
}

int tr_ep_status(tr_ctx *c, int failed) {
  if (!c->m || !tr_ep_active(c->m)) return failed ? -1 : 0;
  const tr_ep *t = c->m->ep;
  glm_ep ep; /* the status step needs the group alone (no work buffers: a drain may come first) */
  memset(&ep, 0, sizeof ep);
  ep.size = t->size;
  ep.rank = t->rank;
  ep.alltoall_i64 = t->alltoall_i64;
  ep.alltoallv = t->alltoallv;
  ep.ctx = t->ctx;
  return glm_ep_status(&c->n, &ep, failed);
}

static glm_moe_act moe_act(tr_ctx *c, int64_t layer) {
  tr_layer_act *a = &c->w->act[layer];
  glm_moe_act g = {a->logits, a->w, a->ids, a->sg, a->su, a->sa, a->so,
                   {a->offsets, a->row_map, a->pos, a->xp, a->gp, a->upp, a->hp, a->yp,
                    &c->w->epl[layer]}};
  return g;
}

int tr_moe_forward(tr_ctx *c, int64_t layer, float *out) {
  glm_moe_w b = moe_w(c, layer);
  glm_moe_act a = moe_act(c, layer);
  glm_ep ep;
  return glm_moe_fwd(&c->n, &b, moe_ep(c, &ep), c->w->act[layer].xn2, c->w->T, c->w->C, &a, out);
}

int tr_moe_backward(tr_ctx *c, int64_t layer, const float *dout, float *dxn2) {
  glm_moe_w b = moe_w(c, layer);
  glm_moe_act a = moe_act(c, layer);
  tr_scratch *s = &c->w->s;
  glm_moe_bscr bs = {s->dw, s->dlogits_r, s->dsa, s->dsg, s->dsu,
                     {s->dyp, s->dxp, s->dgp, s->dup, s->dhp, s->tok, s->bounds, s->ep, s->zeros}};
  glm_ep ep;
  return glm_moe_bwd(&c->n, &b, moe_ep(c, &ep), dout, c->w->act[layer].xn2, c->w->T, c->w->C, &a,
                     &bs, dxn2);
}
