/*
 * glm_moe.h — the GLM-4.5 MoE block as autograd nodes (glm_node.h's rules:
 * raw buffers, no tr_model; the model's layers in train_moe_block.c and
 * the bindings' MoE functions call these, nobody orders the block's
 * kernels again):
 *
 *   glm_moe_fwd / glm_moe_bwd          the whole block (transformers'
 *                                      Glm4MoeMoE): router, dispatch, the
 *                                      routed experts, the shared experts;
 *   glm_moe_experts_fwd / _bwd         the routed stage alone, given the
 *                                      routing (permute, the experts,
 *                                      unpermute), local or expert-parallel.
 *
 * Forward: logits = x·W_rᵀ (fp32); bx_moe_router_forward (sigmoid,
 * e_score_correction_bias for the choice only, group-limited top-k,
 * norm_topk_prob, routed_scaling_factor); the dispatch plan (rows sorted by
 * (expert, token)); bx_moe_permute; per expert e with rows: g = X_e·W_gᵀ,
 * u = X_e·W_uᵀ, h = SiLU(g)·u, y = h·W_dᵀ; the shared experts' MLP on x;
 * out = bx_moe_unpermute(y, weights, initial = shared output), i.e.
 * fl(Σ_j fl(w_j·y_j) + shared) with j in ascending expert id.
 * Backward: unpermute's gradient (dy per row, dweights per slot), the
 * experts' MLP backward per expert, the permute's gather, the router's
 * backward, dx = gather(dX_e) + dlogits·W_r + the shared MLP's dX, summed
 * in that order. Weight gradients: the router and the shared experts as
 * linear layers; the routed experts per global chunk over their rows (a
 * zero partial where a chunk sent them nothing: every chunk of every
 * tensor is added exactly once).
 *
 * Expert parallelism (ep non-NULL, size > 1; docs/train_moe.md "Expert
 * parallelism: the order across ranks"): the EP group's ranks hold experts
 * [rank * nl, (rank + 1) * nl), nl = E / size. The local plan sorts the
 * rows by (expert, token), so each EP rank's rows are one range; the row
 * counts, (expert, global token) and the rows go to their holders
 * (alltoall_i64, alltoallv), bx_moe_dispatch_order sorts the received
 * rows by (expert, global token) (the order one process holding the whole
 * batch builds), the held experts run, and the results go back. Backward:
 * dyp goes the same way, dxp comes back; the held experts' weight
 * gradients are per global chunk over the chunks of every EP peer's
 * current micro-batch: the same addends as one process.
 */
#ifndef BX_GLM_MOE_H
#define BX_GLM_MOE_H

#include "glm_node.h"

/* The block's weights and options. experts[3e + 0/1/2]: expert e's gate,
 * up, down ([I, H], [I, H], [H, I]); under EP only the held experts'
 * entries are read. The router's GEMMs are fp32 (router.wbf NULL). */
typedef struct glm_moe_w {
  int64_t E, K, H, I, SI;
  int64_t n_group, topk_group;
  int norm_topk_prob;
  double routed_scaling_factor;
  glm_lin router;           /* [E, H] */
  const float *ecb;         /* [E] e_score_correction_bias */
  const glm_lin *experts;   /* [3E] */
  glm_lin shared[3];        /* gate, up, down */
} glm_moe_w;

/* One layer's received rows between its forward and backward (EP), and
 * the staging every layer shares; opaque, grown on demand by the nodes,
 * freed by their owner. */
typedef struct glm_ep_layer glm_ep_layer;
typedef struct glm_ep_scratch glm_ep_scratch;
void glm_ep_layer_free(glm_ep_layer *l);
void glm_ep_scratch_free(glm_ep_scratch *s);

/* The EP group (size 1 or NULL: no expert parallelism). The callbacks
 * return 0 on success: alltoall_i64 one int64 to every EP rank and one
 * from each; alltoallv sbytes[i] bytes (consecutive in send) to EP rank i,
 * rbytes[i] from it. local_tokens: every rank's tokens in the step (the
 * same on every rank; the micro-batches are aligned over the ranks).
 * a2a_bytes (NULL: not counted) += the payload this rank sent. */
typedef struct glm_ep {
  int size, rank;
  int (*alltoall_i64)(const int64_t *send, int64_t *recv, void *ctx);
  int (*alltoallv)(const void *send, const int64_t *sbytes, void *recv, const int64_t *rbytes,
                   void *ctx);
  void *ctx;
  int64_t local_tokens;
  int64_t *a2a_bytes;
  glm_ep_scratch **scr;
} glm_ep;

/* The EP group's status step (docs/faults.md, "Agreement inside the step"): one
 * alltoall_i64 in which every EP rank sends its status (0: fine, -1: failed here) to every
 * other, so a local failure reaches the group at its next exchange instead of leaving the
 * others waiting in it. Every exchange of the block is preceded by one (the row counts carry
 * it: a negative count is a failed rank), so a rank that failed anywhere between two
 * exchanges (an allocation, a kernel) calls this once with failed = 1 ("the drain") and meets
 * the others at whatever exchange they wait in; the driver calls it with failed = 0 after
 * its last micro-batch of a pass ("the pass end"), so the drain always has a partner. 0 when
 * every EP rank is fine; -1 when failed (c->err untouched) or on a transport error; -1 with
 * c->learned = 1 and c->err naming the EP rank when another rank failed. */
int glm_ep_status(glm_nctx *c, const glm_ep *ep, int failed);

/* Whether EP rank `rank` of `size` holds expert e of E. */
int glm_ep_holds(int size, int rank, int64_t E, int64_t e);

/* The routed stage's activations (R = T·K rows): the plan (offsets [E+1],
 * row_map [R, 2], pos [T, K]: the forward's inputs), xp [R, H], gp, up, hp
 * [R, I] (the local experts' activations; untouched under EP), yp [R, H];
 * epl: this layer's EP state (*epl grown on demand; NULL without EP). */
typedef struct glm_moe_rows {
  int64_t *offsets, *row_map, *pos;
  float *xp, *gp, *up, *hp, *yp;
  glm_ep_layer **epl;
} glm_moe_rows;

/* The backward's scratch: dyp, dxp [R, H]; dgp, dup, dhp [R, I]; tok [R]
 * (the rows' global token ids); bounds [ceil(T / C) + 1]; part, zeros
 * [I·H] each (zeros all +0.0: the empty chunks' partial). */
typedef struct glm_moe_scr {
  float *dyp, *dxp, *dgp, *dup, *dhp;
  int64_t *tok, *bounds;
  float *part, *zeros;
} glm_moe_scr;

/* The routed stage over x [T, H] given the weights w [T, K] and the plan
 * in r: out [T, H] = unpermute(experts(permute(x)), w, initial) (initial
 * [T, H] or NULL). C: the tokens of a chunk. */
int glm_moe_experts_fwd(glm_nctx *c, const glm_moe_w *m, const glm_ep *ep, const float *x,
                        int64_t T, const float *w, const float *initial, glm_moe_rows *r,
                        float *out);
/* Its backward for dout [T, H]: dx [T, H] (the gather of the rows' dX),
 * dw [T, K] (NULL: not wanted), and the routed experts' weight gradients
 * (their glm_lin.gi; < 0: none) per global chunk of C tokens. */
int glm_moe_experts_bwd(glm_nctx *c, const glm_moe_w *m, const glm_ep *ep, const float *dout,
                        int64_t T, int64_t C, const float *w, glm_moe_rows *r, glm_moe_scr *s,
                        float *dx, float *dw);

/* The whole block's activations besides the rows: logits [T, E], ids,
 * w [T, K] (int64, fp32), the shared MLP's sg, su, sa [T, SI], so [T, H]. */
typedef struct glm_moe_act {
  float *logits, *w;
  int64_t *ids;
  float *sg, *su, *sa, *so;
  glm_moe_rows r;
} glm_moe_act;

/* The backward's scratch besides the rows': dw [T, K], dlogits [T, E],
 * dsa, dsg, dsu [T, SI]. */
typedef struct glm_moe_bscr {
  float *dw, *dlogits, *dsa, *dsg, *dsu;
  glm_moe_scr rows;
} glm_moe_bscr;

/* The routing of x [T, H] (m: router, ecb and the router options):
 * logits [T, E] = x·W_rᵀ (fp32), then bx_moe_router_forward: ids, w
 * [T, K] (ids ascending per token), counts [ceil(T / C), E] int64 per
 * chunk of C tokens (NULL: not wanted). */
int glm_moe_route(glm_nctx *c, const glm_moe_w *m, const float *x, int64_t T, int64_t C,
                  float *logits, int64_t *ids, float *w, int64_t *counts);

/* The block: out [T, H] of x [T, H] (C: the router's chunk of counts and
 * the weight gradients' chunk). Backward: dx [T, H] of dout; every weight
 * gradient to its glm_lin.gi (< 0: none). */
int glm_moe_fwd(glm_nctx *c, const glm_moe_w *m, const glm_ep *ep, const float *x, int64_t T,
                int64_t C, glm_moe_act *a, float *out);
int glm_moe_bwd(glm_nctx *c, const glm_moe_w *m, const glm_ep *ep, const float *dout,
                const float *x, int64_t T, int64_t C, glm_moe_act *a, glm_moe_bscr *s,
                float *dx);

#endif /* BX_GLM_MOE_H */
