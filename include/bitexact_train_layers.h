/*
 * bitexact_train_layers.h — the layers: RMSNorm, RoPE, SwiGLU, causal GQA
 * attention, embedding, cross-entropy (DESIGN §9). Part of bitexact_train.h
 * (the umbrella: include that); the conventions of bitexact.h and of
 * bitexact_train.h (options, ownership, in place, threading, names,
 * Experimental) hold here too unless a comment says otherwise.
 */
#ifndef BITEXACT_TRAIN_LAYERS_H
#define BITEXACT_TRAIN_LAYERS_H

#include "bitexact.h"
#include "bitexact_train_tokred.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Layers: RMSNorm, RoPE, SwiGLU
 * ==================================================================== */

/* Forward and backward kernels of three layers of the GLM-4.5 MoE model as
 * Hugging Face transformers defines it (modeling_glm4_moe.py:
 * Glm4MoeRMSNorm, apply_rotary_pos_emb with partial rotary, Glm4MoeMLP /
 * the experts' act_fn(gate) * up), in fp32, batch invariant (DESIGN §9
 * rule 1): a token's output row depends only on that token's inputs (and
 * the weights), never on the token count T, the thread count, the ISA or
 * the tiling. Every reduction over features runs in one fixed sequential
 * order stated below; fmaf is one rounding of the exact a*b + c, every
 * other operation one IEEE fp32 rounding (nearest even), fl(.) a rounding
 * to fp32. docs/train_layers.md compares each with torch's eager CPU bits.
 *
 * Common rules. Tensors: fp32 (kDLFloat 32, one lane; positions int64),
 * host memory (kDLCPU, kDLCUDAHost, kDLCUDAManaged), row-major contiguous
 * (strides NULL or compact; a dimension of extent 1 may have any stride),
 * aligned to the element size. Token-major activations are [T, F] or
 * [B, L, F] read as [B*L, F] (any leading dimensions flatten into rows).
 * All tensors are borrowed for the call. An output shares no byte with
 * another tensor except where a call allows exactly in place (the same
 * first byte and element count). Every check runs before the first write:
 * on error nothing is written and bx_last_error() names the function and
 * the tensor by its position and name ("bx_rmsnorm_backward: tensor 2
 * (dy): ..."). Errors: BX_EINVAL (NULL tensor or data, shape, bad
 * parameter, bad struct_size, negative num_threads), BX_EDTYPE, BX_EDEVICE,
 * BX_ELAYOUT (strides, alignment, overlap). Threads: fixed pieces of whole
 * rows (or of weight-gradient chunks) over up to num_threads workers of
 * the library's pool (0 = bx_default_threads()); no piece splits a
 * reduction, so the bits do not depend on the count. Thread-safe on
 * distinct outputs. The caller's floating-point environment is not used.
 * opts: NULL = the call's DEFAULT macro; else opts->struct_size is checked
 * first (BX_EINVAL). */

/* ---- RMSNorm -----------------------------------------------------------
 *
 * Glm4MoeRMSNorm (also the QK-norm: the same call on q viewed as
 * [T*heads, head_dim], e.g. a 3-D [T, heads, head_dim] tensor: rows are
 * rows). Per row x[0..H) (H >= 1), weight w[0..H), e = fl(eps):
 *
 *   acc = +0; for j = 0..H-1: acc = fmaf(x[j], x[j], acc)   (sequential)
 *   mean = fl(acc / H)                  (H converted to fp32 exactly, H < 2^24)
 *   rstd = bx_rsqrt_f32(fl(mean + e))   (1/sqrt, correctly rounded)
 *   xhat[j] = fl(x[j] * rstd)
 *   y[j] = fl(w[j] * xhat[j])
 *
 * Forward: x [T, H] (or [B, L, H]), weight [H], eps >= 0 finite (rounded to
 * fp32 as torch does with the Python float), y like x (may be x itself:
 * in place), rstd: T elements ([T], [B, L] or [T, 1]) or NULL (not saved;
 * the backward needs it). Tensor positions: x 0, weight 1, y 2, rstd 3.
 *
 * Backward, per row, from the saved rstd (xhat recomputed with the
 * forward's formula, the same bits):
 *
 *   g[j] = fl(dy[j] * w[j])
 *   acc = +0; for j = 0..H-1: acc = fmaf(g[j], xhat[j], acc)  (sequential)
 *   m = fl(acc / H)
 *   dx[j] = fl(rstd * fmaf(-xhat[j], m, g[j]))
 *
 * (dx = rstd (g - xhat mean(g xhat)): the exact gradient of the forward
 * with eps, written with xhat.) The weight gradient as chunk partials
 * (DESIGN §9 rule 2): chunk_tokens = C >= 1, nchunks = ceil(T / C),
 * dweight_partials [nchunks, H]; partial c, column j:
 *
 *   acc = +0; for t = c*C .. min((c+1)*C, T)-1: acc = fmaf(dy[t][j], xhat[t][j], acc)
 *
 * Pass partial c to bx_tokred_bound / bx_tokred_add as chunk
 * (first_chunk + c), first_chunk from bx_tokred_chunks: that the rows
 * start on a global chunk boundary is the caller's duty (bx_tokred_chunks
 * checks it). chunk_tokens = T gives one partial (a framework's sum).
 * dweight_partials may be NULL (not wanted; chunk_tokens still checked).
 * Tensor positions: x 0, weight 1, dy 2 (like x), rstd 3 (T elements),
 * dx 4 (like x; may be dy itself: in place), dweight_partials 5. */
typedef struct bx_rmsnorm_opts {
  size_t struct_size; /* sizeof(bx_rmsnorm_opts): see "Struct sizes" in bitexact.h */
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
} bx_rmsnorm_opts;
#define BX_RMSNORM_OPTS_DEFAULT {sizeof(bx_rmsnorm_opts), 0}

BX_API bx_status bx_rmsnorm_forward(const DLTensor *x, const DLTensor *weight, double eps,
                                    DLTensor *y, DLTensor *rstd, const bx_rmsnorm_opts *opts);
BX_API bx_status bx_rmsnorm_backward(const DLTensor *x, const DLTensor *weight,
                                     const DLTensor *dy, const DLTensor *rstd,
                                     int64_t chunk_tokens, DLTensor *dx,
                                     DLTensor *dweight_partials, const bx_rmsnorm_opts *opts);

/* ---- RoPE ----------------------------------------------------------------
 *
 * transformers' apply_rotary_pos_emb with partial rotary (Glm4Moe: the
 * rotate_half form on the two halves of the rotary part, not the
 * interleaved pairs of Glm4 dense): per head, only the first rotary_dim
 * features rotate (rotary_dim = int(head_dim * partial_rotary_factor),
 * GLM-4.5: 128 * 0.5 = 64), the others pass through unchanged. With
 * half = rotary_dim / 2 and i = 0..half-1, the table is formed as torch
 * forms it in fp32 (Glm4MoeRotaryEmbedding), but with bitexact's
 * correctly rounded functions:
 *
 *   b        = fl(theta)                      (the base as an fp32 scalar)
 *   ex[i]    = fl((float)(2i) / (float)rotary_dim)
 *   p[i]     = fl(bx_pow_det(b, ex[i]))       (b^ex in binary64, then fp32)
 *   inv[i]   = fl(1 / p[i])
 *   ang[t,i] = fl((float)pos[t] * inv[i])
 *   cos[t,i] = bx_cos_f32(ang), sin[t,i] = bx_sin_f32(ang)  (correctly rounded)
 *
 * and each head's pair (a, b) = (x[i], x[i + half]) becomes
 *
 *   y[i]        = fl(fl(a * cos) - fl(b * sin))
 *   y[i + half] = fl(fl(b * cos) + fl(a * sin))
 *
 * (torch: q*cos + rotate_half(q)*sin, every product and sum rounded). The
 * backward is the transposed rotation of the gradient, as torch's autograd
 * of the same expression gives it:
 *
 *   dx[i]        = fl(fl(da * cos) + fl(db * sin))
 *   dx[i + half] = fl(fl(db * cos) - fl(da * sin))
 *
 * The bits differ from torch's only where torch's fp32 pow, sin or cos
 * (SLEEF, within 1 ulp) is not correctly rounded (docs/train_layers.md).
 *
 * Arguments: x (dy) [T, heads*head_dim] or [T, heads, head_dim] or
 * [B, L, heads*head_dim] (the last dimension a multiple of head_dim, or
 * head_dim itself with heads as a dimension); positions: int64 with T
 * elements ([T] or [B, L]), each 0 <= pos <= 2^24 (exact in fp32: torch's
 * position_ids.float()); 2 <= rotary_dim <= head_dim, rotary_dim even;
 * theta finite with fl(theta) >= 1 (config rope_theta; GLM-4.5 uses a
 * large base). y (dx) like x; may be x (dy) itself: in place. Tensor
 * positions: x (dy) 0, positions 1, y (dx) 2. */
typedef struct bx_rope_opts {
  size_t struct_size; /* sizeof(bx_rope_opts): see "Struct sizes" in bitexact.h */
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
} bx_rope_opts;
#define BX_ROPE_OPTS_DEFAULT {sizeof(bx_rope_opts), 0}

BX_API bx_status bx_rope_forward(const DLTensor *x, const DLTensor *positions, int64_t head_dim,
                                 int64_t rotary_dim, double theta, DLTensor *y,
                                 const bx_rope_opts *opts);
BX_API bx_status bx_rope_backward(const DLTensor *dy, const DLTensor *positions,
                                  int64_t head_dim, int64_t rotary_dim, double theta,
                                  DLTensor *dx, const bx_rope_opts *opts);

/* ---- SwiGLU --------------------------------------------------------------
 *
 * Glm4MoeMLP's act_fn(gate_proj(x)) * up_proj(x) with act_fn = SiLU, in
 * torch eager's order, elementwise:
 *
 *   h = fl(bx_silu_f32(g) * u)      (SiLU correctly rounded, then one product)
 *
 * Backward (torch's mul backward then its silu_backward CPU formula
 * dy * sigmoid * (1 + x * (1 - sigmoid)), left to right, with the one
 * fused multiply-add that torch's vectorised x86 kernels, built with FMA,
 * form: 1 + x * (1 - sigmoid)), with s = bx_sigmoid_f32(g) (correctly
 * rounded):
 *
 *   dsilu = fl(dh * u)
 *   dg    = fl(fl(dsilu * s) * fmaf(g, fl(1 - s), 1))
 *   du    = fl(dh * bx_silu_f32(g))
 *
 * Two-tensor form: gate, up, h, dh, dgate, dup all [T, F] (or [B, L, F]).
 * Fused form (Experimental section): gate_up [T, 2F] holds gate in
 * columns [0, F) and up in [F, 2F) of each row (the experts' gate_up_proj
 * output split by .chunk(2, dim=-1): gate first), h and dh [T, F],
 * dgate_up [T, 2F] in the same layout. In place: h may be gate or up itself; dgate may be gate
 * itself and dup up itself; dgate_up may be gate_up itself.
 * Tensor positions: forward gate 0, up 1, h 2 (fused: gate_up 0, h 1);
 * backward gate 0, up 1, dh 2, dgate 3, dup 4 (fused: gate_up 0, dh 1,
 * dgate_up 2). */
typedef struct bx_swiglu_opts {
  size_t struct_size; /* sizeof(bx_swiglu_opts): see "Struct sizes" in bitexact.h */
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
} bx_swiglu_opts;
#define BX_SWIGLU_OPTS_DEFAULT {sizeof(bx_swiglu_opts), 0}

BX_API bx_status bx_swiglu_forward(const DLTensor *gate, const DLTensor *up, DLTensor *h,
                                   const bx_swiglu_opts *opts);
BX_API bx_status bx_swiglu_backward(const DLTensor *gate, const DLTensor *up, const DLTensor *dh,
                                    DLTensor *dgate, DLTensor *dup, const bx_swiglu_opts *opts);
/* ======================================================================
 * Layers: causal GQA attention
 * ==================================================================== */

/* The core of Hugging Face transformers' Glm4MoeAttention with eager
 * attention (eager_attention_forward: repeat_kv, matmul(q, k^T) * scaling,
 * causal mask, softmax in fp32, matmul with v; no dropout), on q, k, v that
 * are already projected, normed and rotated (those are other kernels).
 * docs/train_attention.md has the formulas, error bounds and the
 * differences from torch.
 *
 * Shapes. T = B*L tokens: B sequences of L = seq_len tokens each, stored
 * one after another (token t = b*L + i is position i of sequence b).
 * Hq = num_heads query heads, Hkv = num_kv_heads key/value heads (Hq a
 * multiple of Hkv, R = Hq/Hkv), D = head_dim. Query head h uses kv head
 * g = h / R (transformers' repeat_kv). Tensors are token-major, heads
 * concatenated (the layout transformers' q_proj output has before its
 * view/transpose, and that attn_output has after reshape):
 *   q, o, dout, dq   [T, Hq*D]   element (t, h, d) at t*Hq*D + h*D + d
 *   k, v, dk, dv     [T, Hkv*D]  element (t, g, d) at t*Hkv*D + g*D + d
 *   stats            [T, Hq, 2]  (m, l) of each (token, query head)
 * q..dv may also be 3-D [B, L, F] (then shape[1] must be seq_len).
 * Sequences never interact: every value of sequence b is a function of
 * sequence b's rows only.
 *
 * The forward, for each sequence, query head h and position i, with
 * j = 0..i (the causal window; there is no other mask), k_j, v_j the rows
 * of kv head g (fmaf: one rounding of the exact a*b + c; other operations
 * on fp32 values: one fp32 rounding each, nearest even; no flush of
 * subnormals):
 *   scale  = fp32 nearest to D^-1/2 (bx_rsqrtf_det(D); torch rounds the
 *            Python float head_dim**-0.5 to fp32 for the multiply)
 *   dot    = +0; for d = 0..D-1: dot = fmaf(q_i[d], k_j[d], dot)
 *   s_j    = dot * scale                      (torch's order: matmul, then * scaling)
 *   m      = s_0; for j = 1..i: m = s_j > m ? s_j : m
 *   e_j    = bx_expf_det(s_j - m)             (correctly rounded e^x)
 *   l      = fp32(sum_{j=0..i} e_j), the sum in fp64 in ascending j
 *            from +0 (one fp64 rounding per addition), rounded once
 *   p_j    = e_j / l                          (softmax first, as torch)
 *   o_i[d] = +0; for j = 0..i: o_i[d] = fmaf(p_j, v_j[d], o_i[d])
 *   stats  = (m, l)
 * L = 1 gives p_0 = 1 and o = v (with -0 read as +0). |scores| of any
 * finite size are safe (s_j - m <= 0). Non-finite values propagate as IEEE
 * arithmetic says; a NaN score makes its whole row NaN; a row whose
 * scores are all -Inf (or with a +Inf score) is NaN, as torch's softmax.
 *
 * The backward (the gradient of the forward above, in torch autograd's
 * order), for each sequence, kv head g, its query heads h = g*R .. g*R+R-1
 * in ascending order, and i = 0..L-1 ascending:
 *   s_j, with the saved (m, l): p_j = bx_expf_det(s_j - m) / l (the bits
 *            of the forward's p_j when stats came from the forward)
 *   dp_j   = +0; for d: dp_j = fmaf(dout_i[d], v_j[d], dp_j)
 *   delta  = fp32(sum_{j=0..i} p_j*dp_j), the products exact in fp64,
 *            summed in fp64 in ascending j from +0, rounded once (torch's
 *            softmax backward: sum(grad * output))
 *   ds_j   = p_j * (dp_j - delta)             (two roundings)
 *   gs_j   = ds_j * scale                     (the gradient of q.k)
 *   dq_i[d] = +0; for j = 0..i: dq_i[d] = fmaf(gs_j, k_j[d], dq_i[d])
 *   and for j = 0..i: dk_j[d] = fmaf(gs_j, q_i[d], dk_j[d]),
 *                     dv_j[d] = fmaf(p_j, dout_i[d], dv_j[d]),
 * dk and dv of kv head g starting at +0: so dk_j[d] and dv_j[d] are each
 * one fmaf chain over (h, i) in lexicographic order: h ascending over the
 * group, i = j..L-1 ascending (repeat_kv's gradient, the sum over the
 * group's query heads, is part of the chain). o is not an input: delta is
 * computed from p and dp.
 *
 * Invariance: no value depends on B, on the other sequences of the batch,
 * on the thread count or on the ISA (the arithmetic is the fixed chains
 * above). Threads: the forward runs over (sequence, query head, block of
 * positions) pieces, the backward over (sequence, kv head) pieces; no
 * reduction is split.
 *
 * Tensors: fp32 (kDLFloat 32, lanes 1; BX_EDTYPE), host memory (kDLCPU,
 * kDLCUDAHost, kDLCUDAManaged; BX_EDEVICE), row-major contiguous (strides
 * NULL or compact; BX_ELAYOUT), data + byte_offset aligned to 4 bytes
 * (BX_ELAYOUT). All borrowed for the call. Outputs must not share a byte
 * with any other tensor of the call (BX_ELAYOUT); inputs may overlap each
 * other. Errors, all checked before the first write (on error nothing is
 * written): BX_EINVAL for a NULL tensor or data, seq_len, num_heads,
 * num_kv_heads or head_dim < 1, Hq not a multiple of Hkv, a shape that
 * does not match, T not a multiple of seq_len, negative num_threads, bad
 * opts->struct_size (checked first); BX_ENOMEM. bx_last_error() names the
 * function and the tensor ("bx_attention_forward: tensor 3 (o): ...").
 * T = 0 does nothing. Thread-safe on distinct outputs; the caller's
 * floating-point environment is not used. */
typedef struct bx_attention_opts {
  size_t struct_size; /* sizeof(bx_attention_opts): see "Struct sizes" in bitexact.h */
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
} bx_attention_opts;
#define BX_ATTENTION_OPTS_DEFAULT {sizeof(bx_attention_opts), 0}

/* o = softmax(q k^T * scale, causal) v per head; stats = (m, l) per
 * (token, query head) for bx_attention_backward. Tensor indices: q 0, k 1,
 * v 2, o 3, stats 4. */
BX_API bx_status bx_attention_forward(const DLTensor *q, const DLTensor *k, const DLTensor *v,
                                      int64_t seq_len, int64_t num_heads, int64_t num_kv_heads,
                                      int64_t head_dim, DLTensor *o, DLTensor *stats,
                                      const bx_attention_opts *opts);

/* dq, dk, dv (overwritten) from dout (the gradient of o), q, k, v and the
 * forward's stats. Tensor indices: dout 0, q 1, k 2, v 3, stats 4, dq 5,
 * dk 6, dv 7. */
BX_API bx_status bx_attention_backward(const DLTensor *dout, const DLTensor *q, const DLTensor *k,
                                       const DLTensor *v, const DLTensor *stats, int64_t seq_len,
                                       int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                       DLTensor *dq, DLTensor *dk, DLTensor *dv,
                                       const bx_attention_opts *opts);


/* ======================================================================
 * Layers: embedding, cross-entropy
 * ==================================================================== */

/*
 * The first and the last layer of a causal LM (Hugging Face transformers'
 * Glm4MoeForCausalLM: nn.Embedding lookup of input_ids; an untied lm_head;
 * the loss of transformers' ForCausalLMLoss: cross-entropy in fp32 over the
 * vocabulary, ignore_index -100, the mean over every prediction of the
 * global batch). docs/train_loss.md gives the formulas, the roundings, the
 * error bounds and what differs from torch.
 *
 * Common rules. Tensors are DLPack, host memory (kDLCPU, kDLCUDAHost,
 * kDLCUDAManaged; BX_EDEVICE otherwise), row-major contiguous (strides NULL
 * or compact; a dimension of extent 1 may have any stride; BX_ELAYOUT
 * otherwise), aligned to their element size (BX_ELAYOUT), borrowed for the
 * call. Token-major tensors are [T, F] or [B, L, F] read as [B*L, F] (ids
 * and targets: [T] or [B, L]). Float tensors are fp32 (kDLFloat 32, one
 * lane); ids and targets int32 or int64 (kDLInt); offsets and counts int64
 * (BX_EDTYPE otherwise). An output never shares a byte with another tensor
 * of the call unless a comment allows it (BX_ELAYOUT). Every check runs
 * before the first write: on error nothing is written, and bx_last_error()
 * names the call and the tensor ("bx_xent_forward: tensor 1 (targets):
 * token 7 has target 50000, outside [0, 32000) ..."). The library's
 * floating-point environment is entered for the call. Threading: fixed
 * pieces over the pool (opts->num_threads, 0 = bx_default_threads(), < 0
 * BX_EINVAL); no result depends on the thread count, on T (a token's
 * outputs depend only on its own inputs and the weights), on the ISA or on
 * how the tokens are split into micro-batches and ranks. opts NULL = the
 * DEFAULT macro; else opts->struct_size is checked first (BX_EINVAL).
 *
 * Token reductions (the embedding gradient, the loss sum, the token count)
 * come out as chunk partials over chunks of chunk_tokens >= 1 consecutive
 * tokens of the call (nchunks = ceil(T / chunk_tokens); chunk j = tokens
 * [j*C, min((j+1)*C, T))), for bx_tokred (section above): the caller passes
 * chunk j as global chunk first_chunk + j, and that the call's tokens start
 * on a global chunk boundary is the caller's duty (bx_tokred_chunks checks
 * it).
 */
typedef struct bx_embedding_opts {
  size_t struct_size; /* sizeof(bx_embedding_opts): see "Struct sizes" in bitexact.h */
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
  int64_t padding_idx; /* < 0: none (torch's padding_idx=None); else the row in
                          [0, V) whose gradient stays zero (torch's negative
                          padding_idx p is V + p here) */
} bx_embedding_opts;
#define BX_EMBEDDING_OPTS_DEFAULT {sizeof(bx_embedding_opts), 0, -1}

/* y[t] = weight[ids[t]]: a copy of the row, bits unchanged.
 *   weight [V, H] fp32; ids [T] or [B, L] int32/int64; y [T, H] or
 *   [B, L, H] fp32 (ids' shape then H), not overlapping weight or ids.
 * An id outside [0, V) is BX_EINVAL naming the token index and the value
 * (the first such token). padding_idx plays no part in the forward. */
BX_API bx_status bx_embedding_forward(const DLTensor *weight, const DLTensor *ids, DLTensor *y,
                                      const bx_embedding_opts *opts);

/* The embedding gradient dweight[v] = sum over tokens t with ids[t] == v
 * (and v != padding_idx) of dy[t], as COMPACT chunk partials: per chunk j
 * the ids present in it, ascending, each with its row sum over the chunk's
 * tokens with that id in ascending token order in fp32:
 *     acc = +0.0f; for t in chunk, ascending, ids[t] == v: acc = acc + dy[t][h];
 * (one fp32 rounding per addition; no fma). The rows of all chunks are
 * stored one after the other, CSR style:
 *   row_ids [T] int64: row_ids[k] the id of compact row k;
 *   rows    [T, H] fp32: rows[k] its sum;
 *   offsets [nchunks + 1] int64: chunk j owns compact rows
 *           [offsets[j], offsets[j+1]), offsets[0] = 0, ids strictly
 *           ascending within a chunk; offsets[nchunks] <= T rows are used,
 *           rows and row_ids past it are left as they were.
 * This equals, row for row, the dense partial [V, H] of the chunk (zero
 * rows elsewhere) at O(T H) memory instead of O(nchunks V H).
 *   ids [T] or [B, L] int32/int64 in [0, num_embeddings) (BX_EINVAL naming
 *   the token and value otherwise); dy [T, H] or [B, L, H] fp32;
 *   num_embeddings = V >= 1; chunk_tokens >= 1. Outputs overlap nothing.
 * Threads: chunks sorted in parallel, then compact rows in fixed pieces. */
BX_API bx_status bx_embedding_backward(const DLTensor *ids, const DLTensor *dy,
                                       int64_t num_embeddings, int64_t chunk_tokens,
                                       DLTensor *row_ids, DLTensor *rows, DLTensor *offsets,
                                       const bx_embedding_opts *opts);

/* bx_tokred_bound for every chunk of a bx_embedding_backward output at
 * once: raises tensor's exponent bound to cover every finite element of
 * rows[0 .. offsets[nchunks]) (the same bound as bx_tokred_bound on the
 * dense partials; through bx_tokred_bound_exp). Before bx_tokred_agree.
 * Errors as bx_tokred_bound_exp, and BX_EINVAL/BX_EDTYPE/BX_ELAYOUT for
 * rows and offsets (offsets not starting at 0, decreasing, or past the
 * rows). s is unchanged on error. Single-threaded in the calling thread;
 * rows and offsets are only read. */
BX_API bx_status bx_embedding_grad_bound(bx_tokred *s, size_t tensor, const DLTensor *rows,
                                         const DLTensor *offsets);

/* bx_tokred_add of every chunk j of a bx_embedding_backward output as
 * global chunk first_chunk + j of the tensor: the same state as adding the
 * dense partials [V, H] one by one, at O(rows H) cost instead of
 * O(nchunks V H). grads/ntensors: the array the state was created with
 * (bx_tokred_create); its tensor `tensor` is the [V, H] fp32 gradient.
 * Grid mode: the compact rows are rounded onto the agreed grid and added
 * to the state's words (bx_tokred_words) directly, the chunks' coverage
 * counted, exactly as bx_tokred_add would; ids must be strictly ascending
 * within each chunk and in [0, V), and every finite element below the
 * agreed bound (else BX_EINVAL naming chunk, row and element; nothing
 * added). Ordinary mode (the negative control): each chunk is scattered
 * into a zeroed dense [V, H] scratch (O(V H) memory and time per chunk)
 * and given to bx_tokred_add, in DESCENDING chunk order (so that a bad
 * chunk index fails first, with nothing added). BX_EINVAL too when grads
 * does not describe the state (word count), before bx_tokred_agree, or for
 * a bad tensor index or chunk range; s is unchanged on error.
 * Single-threaded in the calling thread. */
BX_API bx_status bx_embedding_grad_add(bx_tokred *s, const DLTensor *grads, size_t ntensors,
                                       size_t tensor, int64_t first_chunk,
                                       const DLTensor *row_ids, const DLTensor *rows,
                                       const DLTensor *offsets);

/* ---- cross-entropy ----------------------------------------------------
 *
 * Over fp32 logits z [T, V] (or [B, L, V]) and targets y [T] (or [B, L])
 * int32/int64. A token whose target equals ignore_index contributes
 * nothing (loss 0, count 0, gradient row +0); every other target must be
 * in [0, V) (BX_EINVAL naming the token and the value). The order, per
 * token (f32/f64 round to fp32/fp64 nearest even; a "+" is one rounding):
 *   m   = max_v z[v]                     (exact; v = 0..V-1)
 *   e_v = bx_expf_det(f32(z[v] - m))     (correctly rounded exp)
 *   S   = sum_v e_v in fp64, v = 0..V-1 sequentially from +0.0
 *   L   = ln S: the high part of a double-double ln (pow_det.h's log2
 *         times ln 2; relative error < 2^-52 before the final rounding
 *         to double)
 *   loss_t = f32(f64(f64(m - z[y]) + L))
 *   dz[v] = f32(f64(f64(e_v / S) - [v == y]) * c),
 *           c = f64(grad_scale / N_global)     (1/N is not rounded apart)
 * Non-finite logits: a NaN anywhere in the row, or m = +-Inf, gives a NaN
 * loss and a NaN gradient row (0x7fc00000); z[y] = -Inf with a finite m
 * gives loss +Inf. The loss of the global batch as transformers computes
 * it (the mean over the non-ignored predictions, or the sum divided by
 * num_items_in_batch) is, layout-invariantly:
 *   bx_tokred over loss_partials (one scalar tensor, chunk j of the call
 *   as global chunk first_chunk + j), bx_tokred_finish with divisor =
 *   N_global = the global count of non-ignored tokens (the sum of counts
 *   over all calls; int64, order-free): the exact sum Q 2^e (exact unless
 *   the partials span more than 2^28 in magnitude) divided by N_global and
 *   rounded once.
 * Targets are the shifted labels: transformers pads labels with -100 and
 * shifts them left by one (target[t] = labels[t + 1], the last position
 * -100); the caller does that shift. */
typedef struct bx_xent_opts {
  size_t struct_size; /* sizeof(bx_xent_opts): see "Struct sizes" in bitexact.h */
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
  int64_t ignore_index; /* -100 (torch's default) */
  double grad_scale;    /* dloss: the upstream gradient of the mean (1.0); finite */
} bx_xent_opts;
#define BX_XENT_OPTS_DEFAULT {sizeof(bx_xent_opts), 0, -100, 1.0}

/* Backward of the global mean: dlogits [T, V] (or [B, L, V]) fp32, the
 * formula above with n_global = N_global >= 1 (and >= this call's own
 * non-ignored count; BX_EINVAL otherwise). In place allowed: dlogits may be
 * logits itself (the same data, offset and shape); any other overlap is
 * BX_ELAYOUT. Recomputes m, e_v and S (e_v is kept in dlogits between the
 * two passes). */
BX_API bx_status bx_xent_backward(const DLTensor *logits, const DLTensor *targets,
                                  int64_t n_global, DLTensor *dlogits,
                                  const bx_xent_opts *opts);

/* Forward and backward in one pass over the logits. Forward outputs:
 * losses [T] (or [B, L]) fp32 the per-token loss_t (0 for an ignored
 * token); loss_partials [nchunks] fp32, chunk j's sum
 *     acc = +0.0f; for t in chunk, ascending, not ignored: acc = acc + loss_t;
 * counts [nchunks] int64, chunk j's number of non-ignored tokens
 * (chunk_tokens >= 1); loss_partials and counts may be NULL (not
 * computed). Backward output: dlogits as bx_xent_backward, bit for bit.
 * In place: dlogits may be logits itself; nothing else overlaps. */
BX_API bx_status bx_xent_forward_backward(const DLTensor *logits, const DLTensor *targets,
                                          int64_t n_global, int64_t chunk_tokens,
                                          DLTensor *losses, DLTensor *loss_partials,
                                          DLTensor *counts, DLTensor *dlogits,
                                          const bx_xent_opts *opts);

/* The count of non-ignored targets per chunk (counts [nchunks] int64),
 * without the logits: N_global for the backward is the sum of these over
 * every micro-batch and rank (an int64 SUM all-reduce, order-free). The
 * targets are checked only against ignore_index and >= 0 here (no V). */
BX_API bx_status bx_xent_count(const DLTensor *targets, int64_t chunk_tokens, DLTensor *counts,
                               const bx_xent_opts *opts);

/* ======================================================================
 * Experimental: not used by any bitexact model
 * ======================================================================
 * No bitexact model calls these (src/glm, `bitexact train`, the Python
 * model path); they are tested like the rest (references, fixed bits,
 * Python cases) but may change without an ABI promise. Kept as building
 * blocks of other models: the RoPE table for a caller who applies the
 * rotation itself (fused into its own kernel; also what dev/
 * layers_vs_torch.py compares with torch's table), the fused SwiGLU for
 * models that store gate and up as one gate_up_proj, gate first
 * (transformers' fused experts, split by .chunk(2, dim=-1)), the loss
 * forward alone for an evaluation pass that needs no dlogits. */

/* The RoPE table itself: cos and sin [T, rotary_dim/2] (or any shape of T
 * rows of rotary_dim/2 elements), the distinct half of torch's
 * cat((freqs, freqs)) tables, computed as in the RoPE section. Tensor
 * positions: positions 0, cos 1, sin 2 (outputs: they must not overlap
 * each other or positions). Devices, threads, opts: as bx_rope_forward
 * (the CUDA kernel: one thread per (token, slot), the same bits). */
BX_API bx_status bx_rope_cos_sin(const DLTensor *positions, int64_t rotary_dim, double theta,
                                 DLTensor *cos, DLTensor *sin, const bx_rope_opts *opts);

/* SwiGLU on the fused gate_up layout (SwiGLU section: formulas, tensor
 * positions; in place: dgate_up may be gate_up itself, h overlaps
 * nothing). Threads, opts: as bx_swiglu_forward. */
BX_API bx_status bx_swiglu_forward_fused(const DLTensor *gate_up, DLTensor *h,
                                         const bx_swiglu_opts *opts);
BX_API bx_status bx_swiglu_backward_fused(const DLTensor *gate_up, const DLTensor *dh,
                                          DLTensor *dgate_up, const bx_swiglu_opts *opts);

/* The cross-entropy forward alone: losses, loss_partials and counts as
 * bx_xent_forward_backward writes them, bit for bit, without dlogits.
 * loss_partials and counts may be NULL; no output overlaps another
 * tensor. Threads, opts: as bx_xent_forward_backward. */
BX_API bx_status bx_xent_forward(const DLTensor *logits, const DLTensor *targets,
                                 int64_t chunk_tokens, DLTensor *losses,
                                 DLTensor *loss_partials, DLTensor *counts,
                                 const bx_xent_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_TRAIN_LAYERS_H */
