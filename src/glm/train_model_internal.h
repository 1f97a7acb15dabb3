/*
 * train_model_internal.h — what the files of the model module (src/glm)
 * share: the model's layout (parameter indices per layer), the
 * per-micro-batch activations, the weight-gradient context of the two
 * passes, and the helpers of glm_ops.c. Public API only (bitexact.h,
 * bitexact_train.h): no src/core internals.
 *
 * Which file calls which (no circle; docs/architecture.md rule 8), from the
 * bottom: glm_node.c (views, status, bf16 operands, the GEMM entry, the
 * weight-gradient pieces; glm_node.h) <- glm_nodes.c (the autograd nodes
 * the bindings call too) <- glm_moe.c (the MoE block's nodes, expert
 * parallelism; glm_moe.h) <- glm_ops.c (the model's wrappers: its weights'
 * bf16 copies, its weights as the nodes' glm_lin) <- train_layers.c
 * (attention, dense MLP, head), train_moe_block.c (the MoE layers),
 * train_moe_ep.c (which experts a rank holds; the gradient words over the
 * EP ranks) <- train_step.c; train_model.c (parameters, init, workspaces)
 * beside them, calling only the nodes' free functions.
 */
#ifndef BX_GLM_TRAIN_MODEL_INTERNAL_H
#define BX_GLM_TRAIN_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "glm_moe.h"
#include "glm_node.h"
#include "train_model.h"

/* Parameter indices of one decoder layer (-1: absent). */
typedef struct tr_layer_ix {
  int64_t q_w, q_b, k_w, k_b, v_w, v_b, o_w, q_norm, k_norm;
  int moe;
  int64_t gate_w, up_w, down_w;             /* dense MLP */
  int64_t expert0;                          /* experts.e.{gate,up,down}: expert0 + 3e + 0/1/2 */
  int64_t router_w, sh_gate, sh_up, sh_down; /* MoE */
  int64_t ecb;                              /* e_score_correction_bias (a buffer, after the params) */
  int64_t in_norm, post_norm;
} tr_layer_ix;

/* Activations of one layer for one micro-batch (T tokens), kept from the
 * forward for the backward. */
typedef struct tr_layer_act {
  float *x_in, *xn1, *rstd1;        /* [T,H], [T,H], [T] */
  float *q_raw, *k_raw, *rstd_q, *rstd_k; /* before the QK-norm (use_qk_norm only) */
  float *q, *k, *v;                 /* rotated q, k (attention inputs), v */
  float *o, *stats;                 /* [T,Hq*D], [T,Hq,2] */
  float *h1, *xn2, *rstd2;          /* after attention's residual; its norm */
  /* dense MLP */
  float *g, *u, *a;                 /* [T,I] each */
  /* MoE */
  float *logits, *w;                /* [T,E], [T,k] */
  int64_t *ids, *offsets, *row_map, *pos; /* [T,k], [E+1], [R,2], [T,k] */
  float *xp, *gp, *upp, *hp, *yp;   /* [R,H], [R,I] x3, [R,H] */
  float *sg, *su, *sa, *so;         /* shared expert: [T,SI] x3, [T,H] */
} tr_layer_act;

/* Scratch of the backward, shared by the layers. */
typedef struct tr_scratch {
  float *dx, *dtmp;                 /* [T,H] */
  float *dq, *dk, *dv, *dattn;      /* [T,Hq*D], [T,Hkv*D] x2, [T,Hq*D] */
  float *dg, *du, *da;              /* [T,I] (dense) */
  float *dlogits_r, *dw;            /* [T,E], [T,k] */
  float *dyp, *dgp, *dup, *dhp, *dxp; /* [R,H], [R,I] x3, [R,H] */
  float *dsg, *dsu, *dsa;           /* [T,SI] */
  float *partials;                  /* [nchunks, max(H, D)]: norm-gain partials */
  int64_t *tok;                     /* [R] global token id of each dispatched row */
  int64_t *bounds;                  /* [nchunks+1] */
  float *ep;                        /* an expert weight's chunk partial (max numel) */
  float *zeros;                     /* max expert numel zeros (the empty chunks' partial) */
} tr_scratch;

/* The workspace of one micro-batch size (T tokens, nch chunks). */
typedef struct tr_work {
  int64_t T, nch, C;
  int32_t *ids, *targets;           /* [T] */
  int64_t *positions;               /* [T] */
  tr_layer_act *act;                /* [num_hidden_layers] */
  float *x_final, *xf, *rstdf;      /* output of the last layer, its norm */
  float *logits;                    /* [T,V] (dlogits in place) */
  float *losses, *loss_partials;    /* [T], [nch] */
  float *seq_losses;                /* [T] (>= the sequences): tr_model_eval's loss sums, copied
                                       to the caller's host array after each micro-batch */
  int64_t *emb_row_ids, *emb_offsets; /* [T], [nch+1] */
  float *emb_rows;                  /* [T,H] */
  tr_scratch s;
  void **allocs;                    /* every buffer above, for freeing */
  size_t nallocs, cap;
  int oom;                          /* an allocation failed */
  int64_t nlayers;
  glm_lin *elin;                    /* [3E]: the MoE node's expert weights (train_moe_block.c) */
  glm_ep_scratch *eps;              /* the MoE node's EP staging, lazily */
  glm_ep_layer **epl;               /* [nlayers]: each MoE layer's EP state, lazily */
} tr_work;

struct tr_model {
  tr_config c;
  DLDevice device;                  /* where its buffers are (glm_mem's setting at creation) */
  glm_bfws ws;                      /* bf16 operand workspaces (glm_gemm) */
  int64_t rotary_dim, qdim, kvdim, shared_inter;
  size_t nparams;                   /* trainable */
  size_t nall;                      /* + the buffers */
  tr_param *p;
  DLTensor *grad_t;                 /* [nparams] DLTensors of the grads (the tokred's tensors) */
  tr_layer_ix *lx;
  int64_t embed, final_norm, lm_head;
  int64_t max_expert_numel;
  tr_work *work;                    /* cached for the last micro-batch size */
  tr_ep *ep;                        /* expert parallelism (NULL: none) */
  int *hist;                        /* [nparams + 1] the grid history (tr_model_history) */
  int32_t *peer;                    /* [nparams] the bound group of a routed expert's weight
                                       (layer, projection), -1 others (glm_gr_peer_bounds) */
  int *peer_max;                    /* [npeer] its scratch */
  size_t npeer;
  int hist_ok;                      /* hist holds a step's observation */
  int last_passes;                  /* passes of the last tr_model_grad (1 or 2) */
  struct glm_gr *gr;                /* the last step's gradient reduction, reused while the */
  int64_t gr_C, gr_total;           /* step's chunking, token count, mode and expert */
  int gr_mode, gr_ep;               /* placement are the same (its states' memory kept) */
};

/* The workspace of micro-batches of T tokens in chunks of C (NULL: out
 * of memory); the model keeps one (tr_model_set_work frees the old). */
tr_work *tr_work_make(const tr_model *m, int64_t T, int64_t C);
void tr_work_free(tr_work *w);
void tr_model_set_work(tr_model *m, tr_work *w);

/* ---- the run context ------------------------------------------------------ */

typedef struct tr_ctx {
  glm_nctx n;                       /* threads, bf16 workspace, the gradients' state (tensor i
                                       = parameter i), pass (0: bounds only, no weight TN
                                       GEMM; 1: add), tok0 (global token id of row 0 of the
                                       micro-batch), chunk0 (its chunk), err */
  tr_model *m;
  tr_work *w;
  bx_tokred_mode mode;
  int64_t L;
  int64_t n_global;                 /* global token count */
  int64_t local_tokens;             /* tokens of each rank (the same on every rank) */
  int bf16;                         /* tr_run_opts.bf16 */
  const tr_trace *trace;            /* tr_run_opts.trace (NULL: none) */
} tr_ctx;

/* 0 on BX_OK; else -1 with "what: status: detail" in c->n.err. */
int tr_ck(tr_ctx *c, bx_status st, const char *what);

/* The trace of a module's rows (tr_run_opts.trace; nothing when none):
 * layer < 0: the module `name`; else model.layers.<layer>.<name> (name
 * NULL: the layer itself). phase 0 output, 1 grad_input.0; x
 * [c->w->T, cols]. 0 / -1 (err). */
int tr_trace_rows(tr_ctx *c, int phase, int64_t layer, const char *name, float *x, int64_t cols);

/* y[i] = fl(y[i] + x[i]) */
void tr_add_inplace(float *y, const float *x, int64_t n);

/* ---- the model's GEMMs and bf16 weights (glm_ops.c); layers (train_layers.c,
 * train_moe_block.c) ------------------------------ */

/* The node weights (glm_lin) of parameter w with bias b (< 0: none): its
 * data, its bf16 copy when tr_bf16_on, the parameters' indices as the
 * gradients' state indices. */
glm_lin tr_lin(const tr_ctx *c, int64_t w, int64_t b);

/* The bf16 copies of the GEMM weights from the fp32 masters (once per
 * step, before its first GEMM): every 2-D parameter but the embedding and
 * the routers. 0 / -1 (out of memory). */
int tr_bf16_weights(tr_model *m, int threads);
/* Whether parameter idx's GEMMs run in bf16 in this context. */
int tr_bf16_on(const tr_ctx *c, int64_t idx);

int tr_head_forward(tr_ctx *c);       /* final norm, LM head: logits */
int tr_head_backward(tr_ctx *c);      /* logits = dlogits in; s.dx = d x_final out */
int tr_post_norm_backward(tr_ctx *c, int64_t layer); /* s.dtmp = dxn2 in; s.dx += dh1 part */
int tr_attention_forward(tr_ctx *c, int64_t layer);
int tr_attention_backward(tr_ctx *c, int64_t layer); /* s.dx holds dh1 in, dx_in out */
int tr_dense_mlp_forward(tr_ctx *c, int64_t layer, float *out);
int tr_dense_mlp_backward(tr_ctx *c, int64_t layer, const float *dout, float *dxn2);
int tr_moe_forward(tr_ctx *c, int64_t layer, float *out);
int tr_moe_backward(tr_ctx *c, int64_t layer, const float *dout, float *dxn2);

/* ---- expert parallelism (train_moe_ep.c) ------------------------------------ */

/* Whether the model's MoE layers run expert-parallel (m->ep, size > 1). */
int tr_ep_active(const tr_model *m);
/* The EP group's status step (glm_ep_status) over the model's tr_ep: the pass end (failed
 * 0) or this rank's drain (failed 1). 0 without expert parallelism. */
int tr_ep_status(tr_ctx *c, int failed);

/* ---- init ------------------------------------------------------------------ */

/* The initial value of element `elem` of parameter `param` for seed: a
 * standard normal from bx_rng-free integer hashing and bitexact's correctly
 * rounded fp32 log and cos (Box-Muller), times fl(std). */
float tr_init_normal(uint64_t seed, uint64_t param, uint64_t elem, float std);

#endif /* BX_GLM_TRAIN_MODEL_INTERNAL_H */
