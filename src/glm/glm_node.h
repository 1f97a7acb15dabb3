/*
 * glm_node.h — the autograd nodes of the model module (DESIGN §10: one C
 * entry per node). A node is the forward or the backward of one block that
 * a binding wraps as one autograd function (bitexact.torch / bitexact.paddle
 * layers) and that the model's own layers (train_layers.c) call: the order
 * of its kernels, its bf16 operands and its weight gradients' part of the
 * two-pass protocol (pass 0 bounds, pass 1 adds chunk partials to a token
 * reduction) live here once.
 *
 * Nothing here knows the model (no tr_model): a node takes raw fp32
 * row-major buffers, the weights' optional bf16 copies and the state
 * indices of their gradients. glm_node.c is the bottom (views, status,
 * bf16 rounding and workspaces, the one GEMM entry, the weight-gradient
 * pieces); glm_nodes.c the nodes over it. The Python extension
 * (python/csrc/_glm.c) checks its DLTensors with glm_dl_f32 /
 * glm_dl_bf16 and calls the nodes; nothing numeric is left to a binding.
 *
 * Threading: a node runs in the calling thread with c->threads kernel
 * workers (bits never depend on them); a context and its workspace are
 * one thread's. Errors: -1 with c->st (the bx_status) and c->err ("what:
 * status: detail"); a node that fails may have written its outputs.
 */
#ifndef BX_GLM_NODE_H
#define BX_GLM_NODE_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact_train.h"

/* ---- memory ----------------------------------------------------------------------------- */

/* Where this thread's model buffers live (`bitexact train --device`):
 * host memory (the default), or CUDA managed memory of device `device`
 * (bx_train_alloc's kDLCUDAManaged), whose kernels then run on the device
 * (bitexact_train.h, Devices). Set before a model is created and kept
 * until it is destroyed: glm_mem_alloc uses it, and every view glm_f32 /
 * glm_i64 / glm_i32 / glm_bf16 makes is tagged with it, so every buffer a
 * view covers must come from glm_mem_alloc. glm_mem_use returns 0, or -1
 * with err when managed memory is not available (no CUDA backend, no
 * device). */
int glm_mem_use(int managed, int device, char *err, size_t errlen);
/* This thread's setting as a DLPack device (kDLCPU, or kDLCUDAManaged). */
DLDevice glm_mem_device(void);
/* bytes (>= 0) zeroed, 64-byte aligned, in this thread's memory; NULL when
 * out of memory. glm_mem_realloc keeps the first min(old, new) bytes (new
 * ones zeroed; p NULL: glm_mem_alloc); glm_mem_free(NULL) does nothing.
 * A block remembers its memory, so it is freed rightly whatever the
 * thread's setting is then. */
void *glm_mem_alloc(size_t bytes);
void *glm_mem_realloc(void *p, size_t bytes);
void glm_mem_free(void *p);

/* ---- views ------------------------------------------------------------------------------ */

typedef struct glm_view {
  int64_t shape[3];
  DLTensor t;
} glm_view;

DLTensor *glm_f32(glm_view *v, const float *p, int ndim, int64_t d0, int64_t d1, int64_t d2);
/* glm_f32 of host memory that is not a model buffer (a caller's array, a
 * stack scalar): always kDLCPU, whatever glm_mem_use says. */
DLTensor *glm_f32_host(glm_view *v, const float *p, int ndim, int64_t d0, int64_t d1, int64_t d2);
DLTensor *glm_i64(glm_view *v, const int64_t *p, int ndim, int64_t d0, int64_t d1);
DLTensor *glm_i32(glm_view *v, const int32_t *p, int64_t d0);
DLTensor *glm_bf16(glm_view *v, const uint16_t *p, int ndim, int64_t d0, int64_t d1);

/* ---- bf16 operands ---------------------------------------------------------------------- */

/* fp32 -> bf16, round to nearest even (every NaN -> 0x7fc0, the canonical
 * bf16 NaN); bf16 -> fp32 exact. */
uint16_t glm_bf16_round(float x);
float glm_bf16_widen(uint16_t h);
/* y[0..n) = x rounded (bx_round_bf16 over `threads` threads, 0: the
 * library's default; the bits never depend on the count). */
void glm_bf16_convert(const float *x, uint16_t *y, int64_t n, int threads);

/* Two growable bf16 workspaces (slot 0: the A operand, 1: the B operand
 * of a TN product). Zero-initialise; glm_bfws_free releases.
 * Held operand (glm_bfws_hold): while held is x, a conversion of x (n
 * elements) into a slot that already holds that conversion is skipped:
 * one rounding for the q/k/v products' shared input and the MLP's gate
 * and up input, forward and weight gradient (the same bits: the copy is
 * the same conversion of the same values; the node that holds x does not
 * write it before glm_bfws_release). */
typedef struct glm_bfws {
  uint16_t *p[2];
  int64_t cap[2];
  const float *held;      /* the held operand, or NULL */
  const float *src[2];    /* what each slot converted while held is set */
  int64_t srcn[2];
} glm_bfws;

uint16_t *glm_bfws_get(glm_bfws *ws, int slot, int64_t n); /* NULL: out of memory */
void glm_bfws_free(glm_bfws *ws);
void glm_bfws_hold(glm_bfws *ws, const float *x); /* ws may be NULL */
void glm_bfws_release(glm_bfws *ws);
/* x (n elements) as bf16 in slot `slot`: converted, or the held copy. */
uint16_t *glm_bfws_convert(glm_bfws *ws, int slot, const float *x, int64_t n, int threads);

/* ---- the node context ------------------------------------------------------------------- */

/* What a node needs besides its tensors. s NULL: no weight gradients (a
 * node's state indices are then ignored). The micro-batch's rows are
 * global tokens [tok0, tok0 + rows); chunk j of a partial array is global
 * chunk chunk0 + j. pass 0: weight gradients are bounded (their TN GEMMs
 * skipped), 1: added. */
typedef struct glm_nctx {
  int threads;
  glm_bfws *ws;          /* bf16 workspaces (needed when a bf16 copy is given) */
  bx_tokred *s;          /* the gradients' token reduction, or NULL */
  const DLTensor *grads; /* the descriptors s was created with (bx_embedding_grad_add) */
  size_t ngrads;
  /* A glm_gr with local tensors (glm_gr_bind): a node's state index i is
   * gmap[i] of s (>= 0), -2 - gmap[i] of sx (the local tensors': routed
   * experts under expert parallelism, reduced over their replicas only),
   * or not held here (-1). gmap NULL: index i is s's tensor i. */
  bx_tokred *sx;
  const int64_t *gmap;
  size_t ngmap;
  int pass;
  int64_t tok0, chunk0;
  bx_status st;          /* the failing call's status */
  char *err;
  size_t errlen;
  /* Test-only fault injection (docs/faults.md): NULL in every real run. When set, a node
   * calls fault(fault_ctx, point) at its fault points ("kernel": the routed experts' stage)
   * and fails there, as that kernel's error would, when it returns nonzero. */
  int (*fault)(void *ctx, const char *point);
  void *fault_ctx;
  /* 1: the failure in err is another rank's, learned from an agreement (an expert-parallel
   * peer's status word, glm_ep_status), not this rank's own */
  int learned;
} glm_nctx;

/* The state and tensor of node gradient index gi: 1 with *s and *t set; 0
 * when no gradient is wanted (c->s NULL or gi < 0); -1 with c->err (what)
 * when gi is out of range, not held here, or local and local_ok is 0
 * (only the routed experts' weights may be local). */
int glm_gidx(glm_nctx *c, int64_t gi, int local_ok, bx_tokred **s, size_t *t, const char *what);

/* 0 on BX_OK; else -1 with c->st = st and "what: status: detail" in c->err. */
int glm_ck(glm_nctx *c, bx_status st, const char *what);
/* -1 with c->st = st and the formatted text in c->err. */
int glm_fail(glm_nctx *c, bx_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The checked data of a binding's argument: fp32 (glm_dl_f32), bf16
 * (glm_dl_bf16) or int64 (glm_dl_i64), host, compact row-major (any ndim), viewed as rows x
 * cols: numel = rows * cols, or with rows -1 any multiple of cols
 * (*rows_out, when not NULL, gets the row count). NULL with c->err
 * naming `name` otherwise. */
const float *glm_dl_f32(glm_nctx *c, const DLTensor *t, const char *name, int64_t rows,
                        int64_t cols, int64_t *rows_out);
const uint16_t *glm_dl_bf16(glm_nctx *c, const DLTensor *t, const char *name, int64_t rows,
                            int64_t cols);
const int64_t *glm_dl_i64(glm_nctx *c, const DLTensor *t, const char *name, int64_t rows,
                          int64_t cols);

/* ---- the protocol: one step's gradient reduction (glm_gradred.c) -----------------------
 * The two passes of a step (DESIGN §9) as one object: begin makes the
 * token-reduction states of the gradients and of the loss (a 0-d tensor);
 * pass 0 runs every micro-batch (glm_gr_micro_batch: whole chunks; the
 * nodes bound their partials), glm_gr_agree agrees the grids over the
 * ranks, pass 1 runs the same micro-batches in the same order (the nodes
 * add), glm_gr_allreduce sums the words over the ranks, glm_gr_finish
 * writes the gradients and the loss. A call in the wrong phase, or a pass
 * 1 micro-batch that is not pass 0's, is BX_EINVAL naming both. Used by
 * `bitexact train` (train_step.c) and the bindings' GradReduction
 * (bitexact._core.GradRed). One thread at a time. */
typedef struct glm_gr glm_gr;

/* Where a tensor's gradient is reduced: over all ranks (comm), over the
 * local group only (xcomm: the ranks that hold the same routed experts
 * under expert parallelism; their grid agreed there too), or not held by
 * this rank (no state, finish leaves its output alone). */
enum { GLM_GR_ALL = 0, GLM_GR_LOCAL = 1, GLM_GR_ABSENT = 2 };

/* A reduction over gradients of the descriptors grads[0..n) (shapes and
 * dtypes; copied, data unused) in chunks of C tokens, total_tokens global
 * tokens a step, mode BX_TOKRED_GRID or BX_TOKRED_ORDINARY; where[i] one
 * of GLM_GR_* (NULL: every tensor GLM_GR_ALL). Every rank of comm must
 * create the same GLM_GR_ALL tensors in the same order, every rank of an
 * xcomm the same GLM_GR_LOCAL ones. */
int glm_gr_create(const DLTensor *grads, size_t n, const unsigned char *where, int64_t C,
                  int64_t total_tokens, bx_tokred_mode mode, glm_gr **out, glm_nctx *c);
void glm_gr_destroy(glm_gr *g);
/* A new step (fresh states): pass 0. */
int glm_gr_begin(glm_gr *g, glm_nctx *c);
/* A new step on a stated grid (the one-pass step, docs/train_model.md):
 * bounds[0..n] the exponent bound of every gradient tensor (in creation
 * order; absent ones ignored) and, last, of the loss, each in [-149, 128]
 * (bx_tokred_bound_exp). glm_gr_agree follows at once (no pass 0), then
 * the micro-batches once (the nodes add), glm_gr_allreduce. flag != 0: an
 * add that breaks a bound flags the step (BX_TOKRED_BOUND_FLAG) instead of
 * failing; glm_gr_history then says so on every rank, finish refuses, and
 * the caller runs the step again from glm_gr_begin_stated with the
 * observed exponents (flag 0: they hold, by the determinism of the
 * partials). */
int glm_gr_begin_stated(glm_gr *g, const int *bounds, int flag, glm_nctx *c);
/* After glm_gr_allreduce (-1 otherwise, nothing written): hist[0..n] :=
 * the largest exponent of any finite addend element of each gradient
 * tensor and, last, of the loss, over every rank (absent tensors: their
 * holders', when every rank of comm lists the same tensors, absent ones
 * included, as `bitexact train` does; -149: nothing added or all 0;
 * with local tensors the step takes one more small MAX over comm, so every
 * rank of comm must have local tensors or none): the history the next step
 * states its grid from; *overflowed := whether an add broke a stated
 * bound on any rank (the same on every rank). Either may be NULL. */
int glm_gr_history(const glm_gr *g, int *hist, int *overflowed);
/* The stated grid of a one-pass step from the history hist[0..n1) (NULL:
 * none, every bound -149, so the first attempt only observes):
 * bounds[i] = min(h + GLM_GR_MARGIN, 128), h = hist[i], or for a gradient
 * tensor that never saw an addend (hist -149: an expert no token chose
 * yet) the largest gradient history: a partial may grow 8x over the
 * history before the step runs again (docs/train_model.md). Both trainers
 * state their grids through it. */
#define GLM_GR_MARGIN 3
void glm_gr_stated_bounds(const int *hist, size_t n1, int *bounds);
/* Tensors that share one bound (the routed experts of one layer and one
 * projection: an expert's partials follow its layer's, but its own
 * history lags while few tokens choose it, docs/train_model.md): peer[i]
 * the group of bounds[i] (0 .. npeer-1; -1: none), i < n. gmax[npeer] in:
 * the largest bound of each group's members not in bounds (other ranks'
 * experts; -149: none), out: the group's largest; every member's bound
 * := its group's largest. Both trainers state their grids through it
 * after glm_gr_stated_bounds. */
void glm_gr_peer_bounds(const int32_t *peer, size_t n, int *gmax, size_t npeer, int *bounds);
/* The history after a step: next[i] = max(observed[i], prev[i] -
 * GLM_GR_DECAY) (prev NULL: observed), so a tensor that saw no addend
 * this step (an expert no token chose: observed -149) or a smaller one
 * keeps a bound that decays one binade a step instead of dropping at once
 * (docs/train_model.md: fewer fallbacks, a grid at most a few bits
 * coarser). next may be prev. */
#define GLM_GR_DECAY 1
void glm_gr_next_history(const int *prev, const int *observed, size_t n1, int *next);
/* The micro-batch of global tokens [tok0, tok0 + T) (whole chunks): pass 0
 * records it, pass 1 must repeat pass 0's in order. c gets what the nodes
 * read (glm_gr_bind), pass, tok0, chunk0. */
int glm_gr_micro_batch(glm_gr *g, int64_t tok0, int64_t T, glm_nctx *c);
/* c's s, sx, grads, ngrads, gmap, ngmap := the step's states (a binding
 * whose nodes take the reduction itself). */
void glm_gr_bind(const glm_gr *g, glm_nctx *c);
/* End of pass 0 (at least one micro-batch; in ordinary mode, where bounds
 * have no effect, none: then the step is one pass, pass 1 alone, its
 * micro-batches not checked against a ledger): the grids agreed, the local
 * tensors' over xcomm, the others' and the loss's over comm (NULL: this
 * process); pass 1. */
int glm_gr_agree(glm_gr *g, const bx_comm *comm, const bx_comm *xcomm, glm_nctx *c);
/* End of pass 1 (every micro-batch of pass 0 repeated): the words summed,
 * the local tensors' over xcomm, the others' and the loss's over comm. */
int glm_gr_allreduce(glm_gr *g, const bx_comm *comm, const bx_comm *xcomm, glm_nctx *c);
/* outs[0..n) := the gradients (replaced; an absent tensor's left alone);
 * *loss := the loss's exact sum / divisor when any rank added a loss
 * chunk (*has_loss 1; else 0 and loss untouched; loss may be NULL). Every
 * state is checked before anything is written (a failure writes
 * nothing). The step is done. */
int glm_gr_finish(glm_gr *g, DLTensor *outs, DLTensor *loss, int64_t divisor, int *has_loss,
                  glm_nctx *c);
/* The gradient descriptors it was created with (n of them; data NULL). */
const DLTensor *glm_gr_grads(const glm_gr *g, size_t *n);
/* The states (NULL before begin): the gradients' and the loss's. */
bx_tokred *glm_gr_state(const glm_gr *g);
bx_tokred *glm_gr_loss_state(const glm_gr *g);
/* The local tensors' state (NULL before begin or without local tensors). */
bx_tokred *glm_gr_local_state(const glm_gr *g);
/* Whether tensor i was created GLM_GR_ABSENT. */
int glm_gr_absent(const glm_gr *g, size_t i);
/* -1 idle or done, 0 pass 0, 1 pass 1, 2 pass 1 ended (all-reduced). */
int glm_gr_pass(const glm_gr *g);

/* ---- the GEMM entry and the weight-gradient pieces -------------------------------------- */

/* C (+)= A · op(B) (layout BX_GEMM_NT / NN / TN), a [ar, ac], b [br, bc],
 * out [orow, ocol]. bf: 0 fp32 operands; 1 a rounded to bf16 in workspace
 * slot 0, b's bf16 given in bbf; 2 a and b rounded (slots 0, 1). fp32
 * accumulation and output either way. Every GEMM of the model goes here. */
int glm_gemm(glm_nctx *c, int bf, bx_gemm_layout layout, const float *a, int64_t ar, int64_t ac,
             const float *b, const uint16_t *bbf, int64_t br, int64_t bc, float *out, int64_t orow,
             int64_t ocol, int accumulate, const char *what);

/* A linear layer's weight gradient dYᵀX (state tensor wi; < 0: none) and
 * its bias's column sums of dY (bi; < 0: none) over rows of dY [rows, n],
 * X [rows, k], as chunk partials: bounded a priori (pass 0) or computed
 * and added (pass 1). bf: the weight's partial from dY and X rounded to
 * bf16 (the bias's always from fp32 dY). Nothing without c->s. */
int glm_wg_linear(glm_nctx *c, int64_t wi, int bf, int64_t bi, const float *dy, int64_t rows,
                  int64_t n, const float *x, int64_t k, const char *what);
/* Per-chunk partials [nch, shape...] of state tensor idx (numel elements
 * each, shape of ndim <= 2 dims): bounded or added. */
int glm_wg_partials(glm_nctx *c, int64_t idx, const float *partials, int64_t nch, int ndim,
                    const int64_t *shape, const char *what);
/* The a-priori bound exponent of a TN partial over rows of dY [rows, n]
 * and X [rows, k] (bf: of their bf16 roundings). */
int glm_wg_bound_exp(int bf, int64_t rows, const float *dy, int64_t n, const float *x, int64_t k);

/* ---- the nodes -------------------------------------------------------------------------- */

/* A linear layer's weights: w [n, k] fp32, wbf its bf16 copy or NULL (then
 * fp32 GEMMs), b [n] or NULL; gi / bi the state indices of their
 * gradients (< 0: none). */
typedef struct glm_lin {
  const float *w;
  const uint16_t *wbf;
  const float *b;
  int64_t n, k;
  int64_t gi, bi;
} glm_lin;

/* y [T, n] = x [T, k] · Wᵀ, then y[t][j] = fl(y[t][j] + b[j]) with a
 * bias (one rounding, as torch's addmm). */
int glm_linear_fwd(glm_nctx *c, const glm_lin *l, const float *x, int64_t T, float *y,
                   const char *what);
/* dx [T, k] (+)= dy [T, n] · W alone (no weight gradient). */
int glm_linear_dx(glm_nctx *c, const glm_lin *l, const float *dy, int64_t T, float *dx,
                  int accumulate, const char *what);
/* dx [T, k] (+)= dy [T, n] · W (dx NULL: not wanted); then the weight and
 * bias gradients from dy and x (glm_wg_linear). */
int glm_linear_bwd(glm_nctx *c, const glm_lin *l, const float *dy, const float *x, int64_t T,
                   float *dx, int accumulate, const char *what);

/* q, k, v = three linear layers of one input (the attention's
 * projections). Backward: dx = dq·Wq + dk·Wk + dv·Wv as ONE fmaf chain per
 * element (the k and v NN GEMMs accumulate onto q's), then the three
 * weight (and bias) gradients. */
int glm_qkv_fwd(glm_nctx *c, const glm_lin l[3], const float *x, int64_t T, float *const y[3]);
int glm_qkv_bwd(glm_nctx *c, const glm_lin l[3], const float *const dy[3], const float *x,
                int64_t T, float *dx);

/* RMSNorm over rows [rows, h] (weight [h]; y may be x). */
int glm_rmsnorm_fwd(glm_nctx *c, const float *x, int64_t rows, int64_t h, const float *w,
                    double eps, float *y, float *rstd, const char *what);
/* dx (may be dy) and, with gi >= 0, the gain's per-chunk partials
 * (rows_per_chunk rows a chunk) in parts [ceil(rows / rows_per_chunk), h]
 * (scratch) bounded or added to state tensor gi. */
int glm_rmsnorm_bwd(glm_nctx *c, const float *x, int64_t rows, int64_t h, const float *w,
                    const float *dy, const float *rstd, int64_t rows_per_chunk, float *dx,
                    float *parts, int64_t gi, const char *what);

/* h = SiLU(g)·u over rows [rows, n] (bx_swiglu_forward) and its backward
 * (dg, du of dh). */
int glm_swiglu_fwd(glm_nctx *c, const float *g, const float *u, float *h, int64_t rows, int64_t n,
                   const char *what);
int glm_swiglu_bwd(glm_nctx *c, const float *g, const float *u, const float *dh, float *dg,
                   float *du, int64_t rows, int64_t n, const char *what);

/* SwiGLU MLP (Glm4MoeMLP): g = x·Wgᵀ, u = x·Wuᵀ, a = silu(g)·u, y =
 * a·Wdᵀ; l = {gate, up, down}; g, u, a [T, I] kept for the backward.
 * Backward: da = dy·Wd, the down gradient, (dg, du), dx = dg·Wg + du·Wu
 * as one fmaf chain (accumulate: onto dx's values; dx NULL: not wanted),
 * the gate and up gradients; da, dg, du [T, I] scratch. */
int glm_mlp_fwd(glm_nctx *c, const glm_lin l[3], const float *x, int64_t T, float *g, float *u,
                float *a, float *y);
int glm_mlp_bwd(glm_nctx *c, const glm_lin l[3], const float *dy, const float *x, int64_t T,
                const float *g, const float *u, const float *a, float *da, float *dg, float *du,
                float *dx, int accumulate);

/* The embedding's backward (no input gradient): bx_embedding_backward of
 * dy [T, H] for ids (int32/int64 [T], vocabulary V) into compact
 * per-chunk rows (row_ids [T], rows [T, H], offsets [ceil(T / C) + 1]
 * scratch, C tokens a chunk; padding_idx < 0: none, else that row's
 * gradient stays zero), then bounded (pass 0) or added (pass 1) as
 * state tensor gi's chunks (bx_embedding_grad_bound / _add; c->grads). */
int glm_embedding_bwd(glm_nctx *c, const DLTensor *ids, const float *dy, int64_t T, int64_t H,
                      int64_t V, int64_t C, int64_t padding_idx, int64_t *row_ids, float *rows,
                      int64_t *offsets, int64_t gi);

/* *mean := the exact sum of parts[0 .. n) over every rank of comm (NULL:
 * this process alone) / divisor, rounded once to fp32: a token reduction
 * of its own over `total` tokens in chunks of C; part j is global chunk
 * (j / per) * stride + first + j % per (per >= 1). Every rank of comm
 * calls it with the same C, total and divisor; a local failure reaches the
 * others through the agreement. *mean untouched on error. */
int glm_exact_mean(glm_nctx *c, const float *parts, int64_t n, int64_t per, int64_t stride,
                   int64_t first, int64_t C, int64_t total, int64_t divisor, const bx_comm *comm,
                   float *mean);

/* The cross-entropy of the global token mean over logits [T, V] and
 * targets (int32/int64 [T]): bx_xent_forward_backward (per-token losses
 * [T], per-chunk partials parts [ceil(T / C)], dlogits [T, V] for a unit
 * loss gradient; may be logits itself). With sl (a one-tensor 0-d state,
 * the loss) the partials are bounded or added as its chunks c->chunk0 +
 * j; with mean, *mean = the exact sum of the partials rounded once. */
int glm_xent_fwd(glm_nctx *c, bx_tokred *sl, const float *logits, int64_t T, int64_t V,
                 const DLTensor *targets, int64_t n_global, int64_t C, int64_t ignore_index,
                 float *losses, float *parts, float *dlogits, float *mean);

#endif /* BX_GLM_NODE_H */
