/*
 * train_moe_ep.c — the model's expert parallelism (docs/train_moe.md
 * "Expert parallelism: the order across ranks", docs/train_cli.md "Expert
 * parallelism"): which experts a rank holds. The exchange of the rows is
 * the MoE node's (glm_moe.c); the reduction of the held experts' words over
 * their replicas is the step's glm_gr's (GLM_GR_LOCAL, train_step.c).
 */
#include "train_model_internal.h"

int tr_ep_holds(const tr_ep *ep, int64_t n_experts, int64_t e) {
  return !ep || glm_ep_holds(ep->size, ep->rank, n_experts, e);
}

int tr_ep_active(const tr_model *m) { return m->ep && m->ep->size > 1; }

void tr_model_set_ep(tr_model *m, tr_ep *ep) { m->ep = ep; }
