/*
 * train_model.h — the GLM-4.5 MoE decoder of `bitexact train`, built from
 * the layer kernels of bitexact_train.h (DESIGN §9, §10): its parameters
 * under transformers' names, counter-based initialisation, and the forward
 * + backward of a micro-batch of whole sequences whose weight gradients
 * are canonical chunk partials added to a token-reduction state.
 *
 * Layout invariance: a token-reduction chunk is one sequence (chunk_tokens
 * = seq_len), so every layout of whole sequences (threads, micro-batches,
 * data-parallel ranks, expert placement) adds the same addends; the
 * per-sequence partials are computed in a fixed order from that
 * sequence's data alone.
 */
#ifndef BX_GLM_TRAIN_MODEL_H
#define BX_GLM_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact_train.h"
#include "glm_config.h"

/* Clipping groups (bx_clip_grad_norm's groups): dense parameters and the
 * routed experts' parameters. */
enum { TR_GROUP_DENSE = 0, TR_GROUP_EXPERT = 1 };

typedef struct tr_param {
  char name[96];        /* transformers' name, e.g. "model.layers.0.self_attn.q_proj.weight" */
  int ndim;
  int64_t shape[3];
  int64_t numel;
  int group;            /* TR_GROUP_DENSE / TR_GROUP_EXPERT */
  int64_t expert;       /* routed expert id, -1 otherwise */
  float *data;          /* fp32 master weight (owned by the model) */
  float *grad;          /* fp32 gradient of the last step (owned) */
  float *exp_avg, *exp_avg_sq; /* AdamW state (owned) */
  uint16_t *bf;         /* bf16 compute copy of data (--compute-dtype bf16; NULL: fp32) */
} tr_param;

typedef struct tr_model tr_model;

/* Mode of the token reductions: BX_TOKRED_GRID (invariant) or
 * BX_TOKRED_ORDINARY (negative control: float sums in layout order). */
/* A trace of the step (`bitexact train --trace`, docs/trace.md): the
 * model calls rows() with every module output (phase 0) and module input
 * gradient (phase 1) of every micro-batch, in execution order, named by
 * the transformers module path (module, what: "output" or
 * "grad_input.0"): x [T, cols] fp32, row t is global token tok0 + t
 * (x is the live buffer: a test may plant a change in it before the model
 * goes on). pass() is called before each pass over the micro-batches (a
 * step that falls back runs them again: drop what the last pass traced).
 * rows() returns 0, or -1 to fail the step (err: "trace: ..."). Called
 * in the calling thread; tr_model_eval never traces. */
typedef struct tr_trace {
  int (*rows)(void *ctx, int phase, const char *module, const char *what, float *x, int64_t T,
              int64_t cols, int64_t tok0);
  void (*pass)(void *ctx);
  void *ctx;
} tr_trace;

typedef struct tr_run_opts {
  int threads;          /* kernels' num_threads */
  bx_tokred_mode mode;
  int64_t seq_len;      /* L */
  int bf16;             /* 1: the GEMMs take bf16 operands (fp32 accumulation) */
  int two_pass;         /* 1: no step uses the grid history (grid mode: every step runs
                         * the fallback's two passes, observe then add: --grid-history
                         * off; ordinary mode: two passes, the same bits as one) */
  const tr_trace *trace; /* NULL: no trace (tr_model_grad only; costs one test per module) */
  /* Test-only fault injection (docs/faults.md; `bitexact train` reads BITEXACT_FAULT): NULL
   * in every real run. The model calls fault(fault_ctx, point) at its fault points and fails
   * there as the real failure would when it returns nonzero: "alloc" (the step's work
   * buffers), "kernel" (the routed experts' stage of a MoE layer), "loss" (the logits of a
   * micro-batch get a NaN: a non-finite loss on this rank). */
  int (*fault)(void *ctx, const char *point);
  void *fault_ctx;
} tr_run_opts;

/* The grid history (docs/train_model.md, "The one-pass invariant step"):
 * nparams + 1 exponents (every trainable parameter's gradient in
 * tr_model_params order, then the loss), the largest exponent of any
 * chunk partial element the last grid-mode step added, over all ranks; a
 * step states its grid from them (glm_gr_stated_bounds). tr_model_history:
 * *n := nparams + 1, returns the array (owned by m) or NULL when no step
 * has observed one since creation or tr_model_set_history(m, NULL, 0).
 * tr_model_set_history copies n == nparams + 1 values in [-149, 128] (a
 * checkpoint's); -1 otherwise (err). tr_model_last_passes: the forward +
 * backward passes the last tr_model_grad ran (1: the stated grid held). */
const int *tr_model_history(const tr_model *m, size_t *n);
int tr_model_set_history(tr_model *m, const int *hist, size_t n, char *err, size_t errlen);
int tr_model_last_passes(const tr_model *m);

/* Where the models this thread creates from now on keep their buffers
 * (`bitexact train --device`): device >= 0 in CUDA managed memory of that
 * device, their kernels run there where the call has a CUDA kernel
 * (bitexact_train.h, Devices; docs/cuda.md), the same bits as the host;
 * -1 host memory (the default). Set it before tr_model_create and keep it
 * until tr_model_destroy. 0, or -1 with err (err may be NULL with
 * device -1) when managed memory is not available: no CUDA backend in
 * this build, no usable device. */
int tr_model_use_device(int device, char *err, size_t errlen);

/* The DLPack device of m's parameters, gradients and moments (kDLCPU, or
 * kDLCUDAManaged with the device id): what a view of them says. */
DLDevice tr_model_device(const tr_model *m);

/* Builds the model of c with every parameter initialised from (seed,
 * parameter index, element index) only: normal(0, initializer_range)
 * weights as transformers' _init_weights, ones for RMSNorm gains, zeros
 * for biases and e_score_correction_bias. 0 / -1 with err. */
int tr_model_create(const tr_config *c, uint64_t seed, tr_model **out, char *err, size_t errlen);
void tr_model_destroy(tr_model *m);

/* The parameters in one fixed order (the order of transformers'
 * named_parameters()), plus the non-trained buffers after them
 * (e_score_correction_bias: group -1 in the list, grad NULL). */
size_t tr_model_params(tr_model *m, tr_param **params);

/* Failures (docs/faults.md, "Agreement inside the step"): a rank that fails between two
 * collectives still meets the other ranks at the next one, so a failure anywhere ends the
 * call on every rank of comm, none left waiting: tr_model_grad agrees the ranks' status in one
 * small MAX all-reduce before the grid's agreement and one before the words' all-reduce, and
 * under expert parallelism the EP group exchanges a status word before every row exchange
 * and at the end of every pass (glm_ep_status). tr_model_grad and tr_model_eval return 0;
 * -1 with err when this rank failed; -2 with err ("rank R failed ...") when another rank did
 * and this one learned it from an agreement. */

/* One step's gradient pass over the local sequences: for every micro-batch
 * of whole sequences, forward + backward; the weight gradients' chunk
 * partials (one chunk per sequence) go into a token reduction over the
 * global batch (total = global_seqs sequences), which is agreed, summed
 * over ranks through comm (NULL: one process) and finished into each
 * parameter's grad. tokens: [local_seqs, L+1] token ids of the local
 * sequences, which are global sequences [first_seq, first_seq +
 * local_seqs) of the step; micro_batches divides local_seqs. The loss is
 * the mean over all global_seqs * L predictions (exact sum / count,
 * rounded once). Outputs: *loss, per-token losses [local_seqs * L] in
 * global token order (for the run record's hash). 0 / -1 / -2 with err (above). */
int tr_model_grad(tr_model *m, const tr_run_opts *o, const int32_t *tokens, int64_t local_seqs,
                  int64_t first_seq, int64_t global_seqs, int64_t micro_batches,
                  const bx_comm *comm, float *loss, float *token_losses, char *err,
                  size_t errlen);

/* Evaluation: the forward of the local sequences (tokens [local_seqs, L+1],
 * global sequences [first_seq, first_seq + local_seqs) of the eval batch:
 * the rows' token ids in the expert exchange; micro_batches divides
 * local_seqs) with the step's kernels, no gradient,
 * nothing of the model changed; seq_losses[q] := the fp32 sum of sequence
 * q's L token losses in the order the training loss's chunk partials use
 * (a chunk is a sequence), so the same bits on every layout. Under expert
 * parallelism every rank of the group must call it with the same
 * micro-batch count (the MoE layers exchange rows). 0 / -1 with err. */
int tr_model_eval(tr_model *m, const tr_run_opts *o, const int32_t *tokens, int64_t local_seqs,
                  int64_t first_seq, int64_t micro_batches, float *seq_losses, char *err,
                  size_t errlen);

/* The exact mean loss of an evaluation: the n sequence loss sums parts
 * (tr_model_eval's) of this rank, part j being global sequence (j / per) *
 * stride + first + j % per, summed exactly with every rank's over comm,
 * divided by total (the eval tokens) and rounded once to fp32. Every rank
 * calls it. 0 / -1 with err. */
int tr_eval_mean(const float *parts, int64_t n, int64_t per, int64_t stride, int64_t first,
                 int64_t chunk_tokens, int64_t total, const bx_comm *comm, float *mean, char *err,
                 size_t errlen);

/* Expert parallelism (docs/train_cli.md "Expert parallelism"): the ranks
 * form EP groups of `size` consecutive ranks; this rank is EP rank `rank`
 * of its group and holds the routed experts [rank * n/size, (rank+1) *
 * n/size) of every MoE layer (n = n_routed_experts). The MoE layers send
 * each dispatched row to its expert's rank (alltoallv inside the group),
 * the holders run the experts on the rows in (expert, global token)
 * order and send the results back; the expert tensors' token-reduction
 * words are summed over `replica` (the P/size ranks of this EP rank),
 * the others over all ranks. size 1 (or no tr_ep): every rank holds
 * every expert, the path of one process. The callbacks return 0 on
 * success; the counters are the bytes this rank sent in the last step. */
typedef struct tr_ep {
  int size, rank;
  const bx_comm *replica;   /* same-EP-rank ranks; NULL: this rank alone */
  /* one int64 to every EP rank of the group, one from each */
  int (*alltoall_i64)(const int64_t *send, int64_t *recv, void *ctx);
  /* sbytes[i] bytes (consecutive in send) to EP rank i, rbytes[i] from it */
  int (*alltoallv)(const void *send, const int64_t *sbytes, void *recv, const int64_t *rbytes,
                   void *ctx);
  void *ctx;
  int64_t a2a_bytes;        /* all-to-all payload sent (rows + ids), both passes */
  int64_t ar_world_words;   /* gradient words all-reduced over all ranks */
  int64_t ar_replica_words; /* expert words all-reduced over the replica ranks */
} tr_ep;

/* The model's expert parallelism (NULL or size 1: none); ep is borrowed
 * for the model's life. */
void tr_model_set_ep(tr_model *m, tr_ep *ep);

/* Whether this rank holds routed expert e (always under size 1). */
int tr_ep_holds(const tr_ep *ep, int64_t n_experts, int64_t e);

#endif /* BX_GLM_TRAIN_MODEL_H */
