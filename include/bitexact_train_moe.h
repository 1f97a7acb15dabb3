/*
 * bitexact_train_moe.h — the MoE router and the token dispatch (DESIGN §9).
 * Part of bitexact_train.h (the umbrella: include that); the conventions of
 * bitexact.h and of bitexact_train.h (options, ownership, in place,
 * threading, names, Experimental) hold here too unless a comment says
 * otherwise.
 */
#ifndef BITEXACT_TRAIN_MOE_H
#define BITEXACT_TRAIN_MOE_H

#include "bitexact.h"
#include "bitexact_train_tokred.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * MoE router and token dispatch
 * ==================================================================== */

/*
 * The routing of Hugging Face transformers' Glm4MoeMoE
 * (route_tokens_to_experts) and the token dispatch around its experts,
 * forward and backward, batch- and thread-invariant (DESIGN §9 rules 1
 * and 4). docs/train_moe.md has the formulas, the orders, the roundings,
 * the differences from transformers and the expert-parallel recipe.
 *
 * Shapes: T tokens (a token-major [B, L, ...] batch is read as [B*L,
 * ...]), E = n_routed_experts, k = num_experts_per_tok, G = n_group groups
 * of S = E / G experts, H features, R = T*k dispatched rows.
 * Dtypes: fp32 = kDLFloat 32; ids int32 (kDLInt 32) or int64 (kDLInt 64)
 * where a call says "ids"; offsets, maps, counts and global token ids
 * int64; one lane. Every tensor: host memory (kDLCPU, kDLCUDAHost,
 * kDLCUDAManaged), row-major contiguous (strides NULL or compact),
 * aligned to its element size, borrowed for the call only; an output
 * shares no byte with any other tensor of the call (BX_ELAYOUT). Errors,
 * all checked before the first write (a failing call writes nothing):
 * BX_EINVAL (NULL, shapes, options, ids out of range, duplicates),
 * BX_EDTYPE, BX_EDEVICE, BX_ELAYOUT, BX_ENONFINITE, BX_ENOMEM;
 * bx_last_error() names the function and the tensor ("bx_moe_permute:
 * tensor 1 (row_map): ..."; tensors are numbered in argument order from 0).
 * Threading: the calls with opts split tokens (or rows) in fixed pieces
 * over up to num_threads workers; every output element is computed by one
 * worker in one fixed order, so no bit depends on the thread count, T, the
 * ISA or the piece; the calls without opts are single-threaded.
 * Thread-safe on distinct outputs. In place: never (no output may be an
 * input) except bx_moe_bias_update's bias, updated in place. The
 * library's floating-point environment is used for the call, the caller's
 * given back.
 */

/* ---- router ------------------------------------------------------------ */

typedef struct bx_moe_router_opts {
  size_t struct_size; /* sizeof(bx_moe_router_opts): see "Struct sizes" in bitexact.h */
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
  int64_t n_group;              /* G >= 1, divides E, E / G >= 2 (transformers' topk(2)) */
  int64_t topk_group;           /* 1 <= topk_group <= G */
  int norm_topk_prob;           /* 0 or 1 */
  double routed_scaling_factor; /* finite; used as f32(routed_scaling_factor) */
} bx_moe_router_opts;
/* Glm4MoeConfig's defaults: n_group 1, topk_group 1, norm_topk_prob True,
 * routed_scaling_factor 1.0. */
#define BX_MOE_ROUTER_OPTS_DEFAULT {sizeof(bx_moe_router_opts), 0, 1, 1, 1, 1.0}

/* Router forward: the experts and weights of each token (row t of logits):
 *   s_e = bx_sigmoid_f32(logit_e)                 (correctly rounded)
 *   c_e = f32(s_e + bias_e)                       (for the choice only)
 *   group score gs_g = f32(m1 + m2), m1 >= m2 the two largest c_e of group g
 *   the topk_group groups of largest gs_g (ties: lower group id) are kept;
 *   c'_e = c_e in a kept group, -Inf otherwise (transformers 5.24's
 *          masked_fill(~mask, -inf): a masked expert is never chosen;
 *          transformers <= 5.0 filled 0.0, which let a masked expert win
 *          over negative c_e of kept groups)
 *   the k experts of largest c'_e (ties: lower expert id), written in
 *          ASCENDING EXPERT ID order in topk_ids[t][0..k) (a canonical
 *          order: transformers' topk(sorted=False) promises none; it is
 *          the order of its index_add_ over experts, so bx_moe_unpermute's
 *          sum over j runs in transformers' order)
 *   w_j = s_{id_j}
 *   norm_topk_prob:  D = (((0 + (double)w_0) + (double)w_1) ... + (double)w_{k-1}) + 1e-20
 *                        (fp64, j ascending, each + rounded in fp64)
 *                    q_j = f32((double)w_j / D)
 *                    topk_weights[t][j] = q_j * f32(routed_scaling_factor)  (fp32 multiply)
 *   otherwise:       topk_weights[t][j] = w_j * f32(routed_scaling_factor)  (fp32 multiply:
 *                        torch's bits exactly)
 * The decisions are exact comparisons of fp32 values (no tolerance).
 *   logits   [T, E] fp32 (the router GEMM's output); NaN is BX_ENONFINITE
 *            (+-Inf is fine: sigmoid 1 or 0)
 *   bias     [E] fp32 e_score_correction_bias, finite (BX_ENONFINITE)
 *   topk_ids [T, k] ids (int32 or int64), written; k >= 1 and
 *            k <= topk_group * S (more than the kept groups hold: refused)
 *   topk_weights [T, k] fp32, written
 *   chunk_tokens C >= 1; counts: NULL, or [ceil(T / C), E] int64, written:
 *            counts[c][e] = how many of rows [c*C, min((c+1)*C, T)) chose e
 *            (the chunk partials of the expert load; integers, so the
 *            caller may sum chunks, micro-batches and ranks in any order
 *            for bx_moe_bias_update and load statistics)
 * opts: NULL = BX_MOE_ROUTER_OPTS_DEFAULT; struct_size checked first. */
BX_API bx_status bx_moe_router_forward(const DLTensor *logits, const DLTensor *bias,
                                       DLTensor *topk_ids, DLTensor *topk_weights,
                                       int64_t chunk_tokens, DLTensor *counts,
                                       const bx_moe_router_opts *opts);

/* Router backward: dlogits from dweights (the gradient of topk_weights);
 * through the normalisation and the sigmoid, not through the selection or
 * the bias. Per token, with s_j = bx_sigmoid_f32(logit_{id_j}),
 * m_j = bx_sigmoid_f32(-logit_{id_j}) (1 - s_j correctly rounded: no
 * cancellation near s = 1) and r = (double)f32(routed_scaling_factor),
 * all in fp64, j ascending:
 *   g_j = (double)dweights[t][j] * r
 *   norm_topk_prob:  D as in the forward (same order, + 1e-20)
 *                    P = ((0 + g_0*s_0) + g_1*s_1) ... (each * and + rounded)
 *                    u = P / D;  dw_j = (g_j - u) / D
 *   otherwise:       dw_j = g_j
 *   dlogits[t][id_j] = f32(dw_j * ((double)s_j * (double)m_j))
 *   dlogits[t][e] = +0 for every expert not in topk_ids[t].
 * (The rounding of q_j and of the scaling in the forward is not
 * differentiated: the derivative is the exact one of the real function.)
 *   logits   [T, E] fp32 (the forward's input)
 *   topk_ids [T, k] ids: in [0, E), distinct within a token (BX_EINVAL)
 *   dweights [T, k] fp32
 *   dlogits  [T, E] fp32, written
 * opts as the forward (n_group and topk_group are checked against E but
 * not used). */
BX_API bx_status bx_moe_router_backward(const DLTensor *logits, const DLTensor *topk_ids,
                                        const DLTensor *dweights, DLTensor *dlogits,
                                        const bx_moe_router_opts *opts);

/* ---- dispatch ---------------------------------------------------------- */

typedef struct bx_moe_dispatch_opts {
  size_t struct_size; /* sizeof(bx_moe_dispatch_opts): see "Struct sizes" in bitexact.h */
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
} bx_moe_dispatch_opts;
#define BX_MOE_DISPATCH_OPTS_DEFAULT {sizeof(bx_moe_dispatch_opts), 0}

/* The dispatch plan of T local tokens: the R = T*k rows (t, j) sorted by
 * (expert topk_ids[t][j], global token id token_ids[t]). Rows of one
 * expert are contiguous, in global token order; since the global ids
 * ascend with t, the order is (expert, t).
 *   topk_ids  [T, k] ids in [0, E), distinct within a token (BX_EINVAL
 *             naming token and slot)
 *   token_ids NULL (= 0..T-1) or [T] int64, >= 0, strictly ascending
 *             (BX_EINVAL: a duplicate or a descent); the local tokens may
 *             be any subset of the global batch
 *   offsets   [E+1] int64, written: expert e's rows are
 *             [offsets[e], offsets[e+1]); offsets[0] = 0, offsets[E] = R
 *   row_map   [R, 2] int64, written: row r holds (t, j), source token row
 *             and slot
 *   pos       [T, k] int64, written: pos[t][j] = the row of (t, j)
 * row_map and pos are each other's inverse; the calls below take them. */
BX_API bx_status bx_moe_dispatch_plan(const DLTensor *topk_ids, const DLTensor *token_ids,
                                      DLTensor *offsets, DLTensor *row_map, DLTensor *pos,
                                      const bx_moe_dispatch_opts *opts);

/* The order of rows gathered from many ranks (expert parallelism): n rows
 * with their expert and global token id, in any order; order[i] = the
 * input row that goes to place i when sorted by (expert, token id);
 * offsets as above. The same (expert, token) twice is BX_EINVAL.
 *   expert_ids [n] ids in [0, E); token_ids [n] int64 >= 0
 *   offsets [E+1] int64, order [n] int64, written
 * Single-threaded (sorts). */
BX_API bx_status bx_moe_dispatch_order(const DLTensor *expert_ids, const DLTensor *token_ids,
                                       DLTensor *offsets, DLTensor *order);

/* The global chunks of one expert's rows: token_ids [n] int64, the global
 * token ids of the expert's rows in dispatch order (strictly ascending),
 * each in [first_chunk*C, (first_chunk + m)*C) for m = bounds' length - 1
 * (BX_EINVAL otherwise). bounds [m+1] int64, written: bounds[i] = the
 * number of rows with id < (first_chunk + i) * C, so the expert's rows of
 * global chunk first_chunk + i are [bounds[i], bounds[i+1]) — a
 * contiguous range: the expert's weight-gradient partial of that chunk
 * (bx_tokred_add) is a GEMM over those rows. C = chunk_tokens >= 1,
 * first_chunk >= 0. Single-threaded (no opts). */
BX_API bx_status bx_moe_expert_chunks(const DLTensor *token_ids, int64_t chunk_tokens,
                                      int64_t first_chunk, DLTensor *bounds);

/* Permute (the gather of the experts' inputs): x_perm[r] = x[row_map[r][0]].
 *   x [T, H] fp32; row_map [R, 2] int64 (t in [0, T), j in [0, R / T));
 *   x_perm [R, H] fp32, written (bits copied). */
BX_API bx_status bx_moe_permute(const DLTensor *x, const DLTensor *row_map, DLTensor *x_perm,
                                const bx_moe_dispatch_opts *opts);

/* Permute backward, a gather (no scatter-add): per element h,
 *   dx[t][h] = ((+0 + dx_perm[pos[t][0]][h]) + dx_perm[pos[t][1]][h]) ...
 * fp32 adds, j ascending (with the router's order: ascending expert id).
 *   dx_perm [R, H] fp32; row_map [R, 2], pos [T, k] int64, a plan (each
 *   other's inverse: BX_EINVAL otherwise); dx [T, H] fp32, written. */
BX_API bx_status bx_moe_permute_backward(const DLTensor *dx_perm, const DLTensor *row_map,
                                         const DLTensor *pos, DLTensor *dx,
                                         const bx_moe_dispatch_opts *opts);

/* Unpermute (combine the experts' outputs): per element h,
 *   acc = +0; for j = 0..k-1: acc = acc + f32(w[t][j] * y_perm[pos[t][j]][h])
 *   out[t][h] = initial ? f32(acc + initial[t][h]) : acc
 * separate fp32 multiply and add, j ascending: with the router's order
 * (ascending expert id) these are the bits of transformers' CPU
 * Glm4MoeNaiveMoe (zeros, then index_add_ of y * w per expert ascending)
 * and, with initial = the shared experts' output, of
 * "experts(...) + shared_experts(residuals)".
 *   y_perm [R, H] fp32; weights [T, k] fp32; row_map, pos a plan;
 *   initial NULL or [T, H] fp32; out [T, H] fp32, written (not in place). */
BX_API bx_status bx_moe_unpermute(const DLTensor *y_perm, const DLTensor *weights,
                                  const DLTensor *row_map, const DLTensor *pos,
                                  const DLTensor *initial, DLTensor *out,
                                  const bx_moe_dispatch_opts *opts);

/* Unpermute backward, gathers only:
 *   dy_perm[r][h] = f32(w[t][j] * dout[t][h])          with (t, j) = row_map[r]
 *   dweights[t][j] = fmaf chain over h = 0..H-1 ascending from +0 of
 *                    dout[t][h] * y_perm[pos[t][j]][h]
 * (initial's gradient is dout itself: nothing to compute.)
 *   dout [T, H], y_perm [R, H], weights [T, k] fp32; row_map, pos a plan;
 *   dy_perm [R, H] and dweights [T, k] fp32, written; either may be NULL
 *   (not computed), not both. */
BX_API bx_status bx_moe_unpermute_backward(const DLTensor *dout, const DLTensor *y_perm,
                                           const DLTensor *weights, const DLTensor *row_map,
                                           const DLTensor *pos, DLTensor *dy_perm,
                                           DLTensor *dweights,
                                           const bx_moe_dispatch_opts *opts);

/* ======================================================================
 * Experimental: not used by any bitexact model
 * ======================================================================
 * No bitexact model calls this (src/glm, `bitexact train`, the Python
 * model path: e_score_correction_bias is a frozen buffer there, as in
 * transformers); tested like the rest but may change without an ABI
 * promise. Kept because it is the training frameworks' (Megatron's)
 * balancing rule over the router's exact integer counts, the one piece a
 * trainer that updates the bias needs on top of bx_moe_router_forward. */

/* Expert-bias update (auxiliary-loss-free balancing, DeepSeek-V3 /
 * GLM-4.5 training; Megatron's moe_router_bias_update_rate): with
 * N = sum of the counts of all experts and E experts, in exact integers,
 *   sgn_e = sign(N - E * count_e)   (= sign(mean - count_e), no division)
 *   bias_e = f32(bias_e + sgn_e * f32(rate))
 * transformers does not train this buffer (it is a no-grad buffer there);
 * the rule is the training frameworks'.
 *   bias   [E] fp32, updated in place
 *   counts [E] or [n, E] int64 >= 0: the GLOBAL counts (all ranks and
 *          micro-batches of the step summed, e.g. the router's chunk
 *          counts); a 2-D tensor's rows are summed first (int64)
 *   rate   finite, >= 0
 * BX_EINVAL for negative counts or sums past 2^62. Single-threaded. */
BX_API bx_status bx_moe_bias_update(DLTensor *bias, const DLTensor *counts, double rate);

#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_TRAIN_MOE_H */
