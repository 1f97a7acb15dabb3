/*
 * train_moe_ep.c — the model's expert parallelism (docs/train_moe.md
 * "Expert parallelism: the order across ranks", docs/train_cli.md "Expert
 * parallelism"): which experts a rank holds, and the all-reduce of the
 * gradient words over the right ranks. The exchange of the rows is the
 * MoE node's (glm_moe.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_model_internal.h"

int tr_ep_holds(const tr_ep *ep, int64_t n_experts, int64_t e) {
  return !ep || glm_ep_holds(ep->size, ep->rank, n_experts, e);
}

int tr_ep_active(const tr_model *m) { return m->ep && m->ep->size > 1; }

void tr_model_set_ep(tr_model *m, tr_ep *ep) { m->ep = ep; }

static int oom(tr_ctx *c) { return glm_fail(&c->n, BX_ENOMEM, "expert parallelism: out of memory"); }

/* The gradient state's words (bx_tokred_words: per tensor its elements
 * and one non-finite word, then one coverage word per (tensor, chunk)):
 * the element words of the routed experts' tensors this rank holds are
 * summed over the replica ranks (the ranks of the same EP rank: the only
 * ones that add to them), those of the experts it does not hold stay zero
 * (no rank of its replica set adds to them; finish writes zero gradients
 * there), every other word (dense elements, every tensor's non-finite
 * count and chunk coverage) over all ranks. */
int tr_ep_allreduce(tr_ctx *c, const bx_comm *comm) {
  tr_model *m = c->m;
  tr_ep *ep = m->ep;
  int64_t *words;
  size_t count;
  if (tr_ck(c, bx_tokred_words(c->n.s, &words, &count), "tokred words")) return -1;
  size_t at = 0, nx = 0, nw = 0;
  for (size_t t = 0; t < m->nparams; t++) {
    size_t ne = (size_t)m->p[t].numel;
    if (m->p[t].group == TR_GROUP_EXPERT) nx += tr_ep_holds(ep, m->c.n_routed_experts, m->p[t].expert) ? ne : 0;
    else nw += ne;
    at += ne + 1;
  }
  if (at > count) {
    snprintf(c->n.err, c->n.errlen, "expert parallelism: the token reduction's words are not laid out "
             "as bx_tokred_words documents");
    return -1;
  }
  nw += count - at + m->nparams; /* + the non-finite and coverage words */
  int64_t *bw = malloc((nw ? nw : 1) * sizeof *bw), *bx = malloc((nx ? nx : 1) * sizeof *bx);
  if (!bw || !bx) {
    free(bw), free(bx);
    return oom(c);
  }
  size_t iw = 0, ix = 0;
  at = 0;
  for (size_t t = 0; t < m->nparams; t++) {
    size_t ne = (size_t)m->p[t].numel;
    if (m->p[t].group == TR_GROUP_EXPERT) {
      if (tr_ep_holds(ep, m->c.n_routed_experts, m->p[t].expert)) {
        memcpy(bx + ix, words + at, ne * sizeof *bx);
        ix += ne;
      } /* else: zero on every replica rank, left as it is */
    } else {
      memcpy(bw + iw, words + at, ne * sizeof *bw);
      iw += ne;
    }
    bw[iw++] = words[at + ne];
    at += ne + 1;
  }
  memcpy(bw + iw, words + at, (count - at) * sizeof *bw);
  int rc = 0;
  if (comm && comm->allreduce_i64(bw, nw, BX_OP_SUM, comm->ctx) != 0) rc = -1;
  if (rc == 0 && ep->replica && ep->replica->allreduce_i64(bx, nx, BX_OP_SUM, ep->replica->ctx) != 0) rc = -1;
  if (rc == 0) {
    ep->ar_world_words += comm ? (int64_t)nw : 0;
    ep->ar_replica_words += ep->replica ? (int64_t)nx : 0;
    iw = ix = at = 0;
    for (size_t t = 0; t < m->nparams; t++) {
      size_t ne = (size_t)m->p[t].numel;
      if (m->p[t].group == TR_GROUP_EXPERT) {
        if (tr_ep_holds(ep, m->c.n_routed_experts, m->p[t].expert)) {
          memcpy(words + at, bx + ix, ne * sizeof *bx);
          ix += ne;
        }
      } else {
        memcpy(words + at, bw + iw, ne * sizeof *bw);
        iw += ne;
      }
      words[at + ne] = bw[iw++];
      at += ne + 1;
    }
    memcpy(words + at, bw + iw, (count - at) * sizeof *bw);
  } else {
    snprintf(c->n.err, c->n.errlen, "expert parallelism: the all-reduce of the gradient words failed");
  }
  free(bw);
  free(bx);
  return rc;
}
