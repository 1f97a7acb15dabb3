/*
 * bitexact_train_tokred.h — the layout-invariant token reduction (canonical
 * addends on an int64 grid) and the weight gradients over tokens (DESIGN
 * §9). Part of bitexact_train.h (the umbrella: include that); the
 * conventions of bitexact.h and of bitexact_train.h (options, ownership, in
 * place, threading, names, Experimental) hold here too unless a comment
 * says otherwise.
 */
#ifndef BITEXACT_TRAIN_TOKRED_H
#define BITEXACT_TRAIN_TOKRED_H

#include "bitexact.h"
#include "bitexact_train_gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Token reduction
 * ==================================================================== */

/*
 * Sums over tokens that a layout splits (DESIGN §9 point 2): every weight
 * gradient, the loss sum, auxiliary statistics, token counts. They are made
 * of canonical addends combined in integers, so threads, micro-batches and
 * ranks may combine them in any order and get the same bits.
 *
 * Addends. The global token index set [0, total_tokens) is cut into chunks
 * of chunk_tokens consecutive global tokens: chunk c = tokens
 * [c*C, min((c+1)*C, total_tokens)). The addend of a tensor for chunk c is
 * the caller's fp32 partial over exactly those tokens, computed in a fixed
 * order (a fixed-order GEMM over the chunk's tokens, say): a function of
 * the data, never of the layout. A micro-batch or rank must hold whole
 * chunks: bx_tokred_chunks turns its token range into chunk indices and
 * refuses a range that does not start and end on chunk boundaries
 * (BX_ELAYOUT); bx_tokred_finish refuses (BX_ELAYOUT, naming the tensor
 * and chunk) unless every chunk of every tensor was added exactly once over
 * all threads, micro-batches and ranks.
 *
 * The grid (BX_TOKRED_GRID). Per tensor t an exponent bound E_t, a pure
 * function of the data agreed over ranks: E_t = the largest over all chunks
 * and elements of the frexp exponent of |addend| (|a| < 2^E_t; -149 when
 * every addend is 0), or a larger bound the caller states
 * (bx_tokred_bound_exp). With N = ceil(total_tokens / C) chunks and
 * L = ceil(log2 N), the tensor's grid step is 2^e_t with
 *     P = min(51, 62 - L),   e_t = E_t - P.
 * Each addend element a is rounded once onto the grid,
 *     q = round_nearest_even(a / 2^e_t),  |q| <= 2^P,
 * and the q of all chunks are summed in int64 words (|sum| <= 2^(P+L) <=
 * 2^62: no overflow in any order or grouping). The result is the exact
 * value Q * 2^e_t (or Q * 2^e_t / divisor) rounded once, nearest even, to
 * fp32 or fp64.
 *   Accuracy: |Q*2^e_t - exact sum of the addends| <= N * 2^(e_t - 1)
 *   = N * 2^(E_t - P - 1), i.e. at most 2^(L-P-1) <= 2^-40 (for N <= 2^11;
 *   2^(2L-63) beyond) relative to the bound 2^E_t, plus the final rounding
 *   (half an ulp of the output format).
 *   Exact when every addend is a multiple of 2^e_t: e.g. all addends with
 *   a dynamic range (2^E_t over the smallest non-zero |a|) of at most
 *   2^(P-23) — 2^28 for N <= 2048 chunks — or integer addends with
 *   E_t <= P (token counts).
 * Memory: one int64 word per gradient element (twice an fp32 gradient),
 * one per tensor (non-finite count) and one per (tensor, chunk) (the
 * coverage check). Speed: bench/bench_tokred.c, docs/train_tokred.md.
 *
 * Non-finite addends: a NaN or +-Inf element is left out of the sum and
 * counted in its tensor's non-finite word (summed over ranks like the
 * others); bx_tokred_finish then fails with BX_ENONFINITE naming the tensor
 * (every rank alike), nothing written. The bound ignores them.
 *
 * The ordinary mode (BX_TOKRED_ORDINARY): the negative control. The same
 * calls, but fp32 sums in the order of the calls (add, merge) and, over
 * ranks, the communicator's float all-reduce (bx_comm.allreduce_f32, as
 * DDP and Megatron reduce fp32 gradients) or, without one, a gather added
 * in rank order: its bits depend on the layout.
 *
 * A step, on each rank:
 *     bx_tokred_create(grads, n, C, T, &opts, &s);
 *     for each local chunk c, tensor t: bx_tokred_bound(s, t, c, &partial);
 *     bx_tokred_agree(s, comm);          // MAX all-reduce: the grid
 *     for each local chunk c, tensor t: bx_tokred_add(s, t, c, &partial);
 *     bx_tokred_allreduce(s, comm);      // one SUM all-reduce of the words
 *     bx_tokred_finish(s, out, n, 1);    // or divisor = T: a token mean
 *     bx_tokred_destroy(s);
 * (A caller who can state a bound before computing the partials, e.g. a
 * fixed exponent, calls bx_tokred_bound_exp instead of bx_tokred_bound and
 * adds each partial as soon as it is computed.)
 *
 * Threads: a bx_tokred is used by one thread at a time (every call below
 * that takes one); different states may be used by different threads at
 * once. The calls on a state are single-threaded, except
 * bx_linear_wgrad(_bound), which split their work over the pool. (A caller
 * with threads of its own gives each a state from bx_tokred_fork and merges
 * them with bx_tokred_merge in any order: Experimental section.)
 * Ownership: DLTensors are borrowed for the call; a state owns its words
 * until bx_tokred_destroy. In place: no call writes a tensor it reads.
 * Tensors: fp32 (kDLFloat, 32, lanes 1), host memory, dense (strides NULL
 * or row-major); a partial has the shape of its gradient.
 * CUDA (issue 30; not yet run on a GPU, docs/cuda.md): the partial of
 * bx_tokred_bound and bx_tokred_add, and dy and x of bx_linear_wgrad_bound
 * and bx_linear_wgrad (all on one device), may be kDLCUDA tensors: device
 * kernels give the host's words exactly, on the legacy default stream,
 * waiting; the state's words stay in host memory (a build without the
 * CUDA backend: BX_EDEVICE). comm may be a device communicator
 * (bx_comm_nccl) for bx_tokred_agree and bx_tokred_allreduce: the words
 * are staged through device memory.
 */
typedef enum bx_tokred_mode {
  BX_TOKRED_GRID = 0,    /* canonical addends on an int64 grid (default) */
  BX_TOKRED_ORDINARY = 1 /* negative control: fp32 sums in layout order */
} bx_tokred_mode;

/* What an add whose finite element breaks the agreed bound (|a| >= 2^E_t)
 * does. FAIL (default): the add is refused (BX_EINVAL, s unchanged).
 * FLAG: the add stands and flags the tensor instead: its words become
 * void, bx_tokred_allreduce tells every rank (the flag travels in its
 * agreement step, and a flagged state's words are not summed), and
 * bx_tokred_finish refuses the state. The one-pass step (a grid stated
 * before the partials exist, from the previous step's bx_tokred_observed:
 * docs/train_model.md) uses it: a flag means "run the step again with the
 * observed bounds". */
typedef enum bx_tokred_on_bound {
  BX_TOKRED_BOUND_FAIL = 0,
  BX_TOKRED_BOUND_FLAG = 1
} bx_tokred_on_bound;

typedef struct bx_tokred_opts {
  size_t struct_size; /* sizeof(bx_tokred_opts): see "Struct sizes" in bitexact.h */
  bx_tokred_mode mode;
  bx_tokred_on_bound on_bound; /* grid mode; the ordinary mode never flags */
} bx_tokred_opts;

#define BX_TOKRED_OPTS_DEFAULT {sizeof(bx_tokred_opts), BX_TOKRED_GRID, BX_TOKRED_BOUND_FAIL}

/* Format of the state's words and of its agreement; bump when the layout,
 * the grid or the agreement changes. 2: the all-reduce's agreement carries
 * the observed exponents and the flags (the words' layout is format 1's). */
#define BX_TOKRED_FORMAT 2
/* Largest chunk count (keeps P >= 24). */
#define BX_TOKRED_MAX_CHUNKS (1LL << 38)

/* The state: opaque, owned by the caller (bx_tokred_destroy). */
typedef struct bx_tokred bx_tokred;

/* A state for ntensors gradients shaped like grads[0..ntensors) (only
 * dtype, device, ndim, shape and strides are read; data may be NULL),
 * chunks of chunk_tokens >= 1 global tokens, total_tokens >= 0 tokens in
 * the global batch (N = ceil(total_tokens / chunk_tokens) chunks, at most
 * BX_TOKRED_MAX_CHUNKS). opts: NULL = BX_TOKRED_OPTS_DEFAULT (struct_size
 * checked first). ntensors == 0 is allowed. Errors: BX_EINVAL (NULL out,
 * NULL grads with ntensors > 0, bad counts, bad mode), BX_EDTYPE (not
 * fp32), BX_EDEVICE, BX_ELAYOUT (not dense), BX_ENOMEM; *out is written
 * only on success and owned by the caller. grads is borrowed (its shapes
 * are copied). Thread-safe. */
BX_API bx_status bx_tokred_create(const DLTensor *grads, size_t ntensors, int64_t chunk_tokens,
                                  int64_t total_tokens, const bx_tokred_opts *opts,
                                  bx_tokred **out);

/* Makes s the state bx_tokred_create would make with its configuration
 * (words, bounds, observations and flags cleared, not agreed), keeping its
 * memory: a trainer reuses a step's states instead of allocating (and
 * page-faulting in) their words every step. opts: NULL keeps s's options;
 * otherwise (struct_size checked first) its mode must be s's (BX_EINVAL:
 * the ordinary mode's sums need another state) and its on_bound is taken.
 * BX_EINVAL for NULL s; s unchanged on error. */
BX_API bx_status bx_tokred_reset(bx_tokred *s, const bx_tokred_opts *opts);

/* Frees s and its words (NULL: nothing); no call may be using s. */
BX_API void bx_tokred_destroy(bx_tokred *s);

/* The chunks [*chunk_begin, *chunk_end) of the token range
 * [token_begin, token_end) that a micro-batch or rank holds (global token
 * ids). BX_ELAYOUT, naming the range and the nearest chunk boundary, unless
 * 0 <= token_begin <= token_end <= total_tokens, token_begin is a multiple
 * of chunk_tokens and token_end is one or equals total_tokens. Outputs
 * written only on success. s is only read. */
BX_API bx_status bx_tokred_chunks(const bx_tokred *s, int64_t token_begin, int64_t token_end,
                                  int64_t *chunk_begin, int64_t *chunk_end);

/* Before bx_tokred_agree: raise tensor's exponent bound to cover every
 * finite element of chunk's partial (shape of the tensor). Non-finite
 * elements are ignored here (counted by bx_tokred_add). BX_EINVAL for a
 * bad tensor index or chunk, or after bx_tokred_agree; BX_EDTYPE,
 * BX_ELAYOUT (shape differs, not dense), BX_EDEVICE. s is unchanged on
 * error. Ordinary mode: checked, otherwise no effect. */
BX_API bx_status bx_tokred_bound(bx_tokred *s, size_t tensor, int64_t chunk,
                                 const DLTensor *partial);

/* Before bx_tokred_agree: the caller's promise that every addend element
 * of tensor, on every rank, has |a| < 2^exp2 (-149 <= exp2 <= 128);
 * raises the bound to exp2. bx_tokred_add refuses an addend that breaks
 * it. BX_EINVAL otherwise. */
BX_API bx_status bx_tokred_bound_exp(bx_tokred *s, size_t tensor, int exp2);

/* Fixes the grid: one MAX all-reduce (through comm; NULL = this process
 * alone) of the bounds of every tensor together with the agreement items
 * (format, mode, tensor count and shapes, chunk_tokens, total_tokens, and
 * whether every rank passed its local checks): BX_EMISMATCH on every rank
 * when they differ, BX_ECOMM when the all-reduce fails. Every rank must
 * call it once per state, in the same order as its other collectives.
 * After it, bx_tokred_add may be called, bx_tokred_bound may not.
 * comm->struct_size is checked first (BX_EINVAL, no collective). */
BX_API bx_status bx_tokred_agree(bx_tokred *s, const bx_comm *comm);

/* Adds chunk's partial (shape of the tensor, fp32) of tensor: each element
 * rounded onto the tensor's grid and added as an int64 word (grid mode),
 * or added in fp32 (ordinary mode). The chunk's coverage word is
 * incremented. BX_EINVAL: bad tensor index, chunk outside [0, N), called
 * before bx_tokred_agree, or a finite element with |a| >= 2^E_t (the
 * agreed bound: the partial differs from the one bounded, or a stated
 * bound was wrong; the message names tensor, chunk and element; under
 * BX_TOKRED_BOUND_FLAG the add stands and flags the tensor instead);
 * BX_EDTYPE / BX_ELAYOUT / BX_EDEVICE for the partial. On error s is
 * unchanged. Single-threaded in the calling thread. */
BX_API bx_status bx_tokred_add(bx_tokred *s, size_t tensor, int64_t chunk,
                               const DLTensor *partial);

/* The state's wire words, for a caller's own all-reduce (grid mode): the
 * word-by-word int64 SUM over ranks of these words, in any order (MPI_SUM
 * on MPI_INT64_T, all_reduce(SUM) on an int64 tensor), written back in
 * place, is the state of the whole global batch. *words points into s
 * (owned by it), valid until s is destroyed; *count words (per tensor its
 * elements and one non-finite word, then one coverage word per (tensor,
 * chunk)). The grid must have been agreed first. Ordinary mode: BX_EINVAL (fp32 sums are not summable
 * words). */
BX_API bx_status bx_tokred_words(bx_tokred *s, int64_t **words, size_t *count);

/* Over ranks through comm (NULL: nothing to do): an agreement step (one
 * small MAX all-reduce: configuration, grid, local checks, and each
 * tensor's observed exponent and flag, bx_tokred_observed) then, in grid
 * mode, one SUM all-reduce of bx_tokred_words's words; every rank then
 * holds the global state. A state flagged on any rank skips the SUM (its
 * words are void; finish refuses it) and keeps only the observations.
 * Ordinary mode: where comm->allreduce_f32 is set (a host comm), the fp32
 * sums go through it (the transport's order: not exact) and the counts
 * through one SUM; else each rank's fp32 sums are gathered (a SUM
 * all-reduce of a rank count, then one of nranks * words with each rank in
 * its own slot, so comm->rank must number the ranks 0..n-1) and added in
 * rank order. Errors come back
 * on every rank (BX_EMISMATCH, BX_ECOMM, or the failing rank's status);
 * on error s is unchanged. */
BX_API bx_status bx_tokred_allreduce(bx_tokred *s, const bx_comm *comm);

/* What the adds saw (grid mode; after bx_tokred_allreduce: over every rank
 * of comm): *exp2 := the largest frexp exponent of any finite element of
 * any partial added to tensor (every such |a| < 2^*exp2; -149 when none
 * was added or all were 0) — the exponent bx_tokred_bound would have
 * found, so a later step can state it (bx_tokred_bound_exp) before its
 * partials exist; *flagged (may be NULL) := the adds that broke the agreed
 * bound under BX_TOKRED_BOUND_FLAG (after bx_tokred_allreduce over ranks:
 * 1 on every rank when any rank's add did; 0 otherwise). bx_tokred_merge
 * combines them (MAX, sum), bx_tokred_fork starts from none. The ordinary
 * mode observes nothing (-149, 0). BX_EINVAL for NULL s or exp2 or a bad
 * index. s is only read. */
BX_API bx_status bx_tokred_observed(const bx_tokred *s, size_t tensor, int *exp2,
                                    int64_t *flagged);

/* Writes each tensor's sum divided by divisor (>= 1; 1 for a sum, the
 * global token count for a token mean), rounded once, nearest even, into
 * out[0..nout), nout == the state's tensor count, each of the tensor's
 * shape, fp32 or fp64, writable, not overlapping each other. Grid mode:
 * the exact value Q * 2^e_t / divisor rounded once. Ordinary mode: the
 * fp32 sum, then fl32(sum / divisor). Checks everything first: BX_ELAYOUT
 * unless every chunk of every tensor was added exactly once (naming the
 * tensor, the chunk and its count), BX_EINVAL for a flagged tensor
 * (BX_TOKRED_BOUND_FLAG; naming it, its stated and observed bounds),
 * BX_ENONFINITE if a tensor saw a NaN or
 * Inf addend, BX_EINVAL / BX_EDTYPE / BX_ELAYOUT / BX_EDEVICE for the
 * outputs; on error nothing is written. s is only read. The outputs are
 * all in host memory (kDLCUDAManaged included: written by the host) or all
 * kDLCUDA tensors (the host's bits copied to each output's device;
 * BX_EDEVICE for a mix, or in a build without the CUDA backend). */
BX_API bx_status bx_tokred_finish(const bx_tokred *s, DLTensor *out, size_t nout,
                                  int64_t divisor);

/* bx_tokred_finish's checks alone (the same statuses and messages), nothing
 * written: a caller finishing several states checks them all first, so a
 * failure writes no output of any. s and out are only read. */
BX_API bx_status bx_tokred_finish_check(const bx_tokred *s, DLTensor *out, size_t nout,
                                        int64_t divisor);

/* ---- Weight gradients over tokens ----------------
 *
 * The token reductions of a linear layer Y = X · Wᵀ + bias: dW[N,K] =
 * Σ_t dY[t]ᵀ X[t] and dbias[N] = Σ_t dY[t], as chunk partials (the
 * addends above) and as one call that computes each chunk's partial and
 * adds it to a bx_tokred state.
 *
 * The weight partial of chunk c is bx_gemm(BX_GEMM_TN) over exactly the
 * chunk's rows of dY [T,N] and X [T,K] (GEMM section): per element one
 * fmaf chain over the chunk's tokens in ascending order, from +0. The
 * bias partial of chunk c, column n: acc = +0; for each token t of the
 * chunk in ascending order acc = acc + dY[t][n] (one fp32 rounding each;
 * the same bits as the TN chain with X a column of ones, since fmaf(d, 1,
 * acc) = acc + d).
 *
 * The a-priori bound. For one chain over M tokens (acc_0 = +0, acc_m =
 * fl(a_m b_m + acc_(m-1)), u = 2^-24) whose result is finite:
 *   |acc_M| <= (1+u)^M (Σ_m |a_m||b_m| + M·2^-150)
 *          <= (1+u)^M · M · (max|a| · max|b| + 2^-150).
 * Proof: every intermediate is finite (a non-finite acc stays non-finite:
 * Inf + finite = Inf, NaN stays NaN; so does an Inf or NaN input, through
 * Inf·0 = NaN), and fl(z) = z(1+δ) + η with |δ| <= u, |η| <= 2^-150 (η only
 * for subnormal results, δ = 0 there), so |acc_m| <= (|a_m b_m| +
 * |acc_(m-1)|)(1+u) + 2^-150; by induction |acc_M| <= Σ_m |a_m b_m|
 * (1+u)^(M-m+1) + 2^-150 Σ_(j<M) (1+u)^j, which is at most the first line;
 * the second follows from |a_m b_m| <= max|a| max|b|. The finite elements
 * of a chunk partial only involve finite inputs, so the maxima are over the
 * finite elements of the chunk's rows of dY and X (bias: max|b| = 1). */

/* The smallest E in [-149, 128] with 2^E above the bound's second line
 * (so every finite element of a TN chunk partial over rows tokens with
 * |A| <= max_abs_a, |B| <= max_abs_b has |a| < 2^E, as
 * bx_tokred_bound_exp requires): the bound is evaluated in fp64 with every
 * operation's rounding error covered by a factor (1 + 2^-50), (1+u)^M by
 * repeated squaring rounded upward the same way, so the result is one
 * deterministic integer on every machine. rows <= 0 or a zero maximum:
 * -149 (every element is ±0); a non-finite maximum or a bound >= 2^128:
 * 128. Signs of the maxima are ignored. Thread-safe, no error. */
BX_API int bx_wgrad_bound_exp(int64_t rows, float max_abs_a, float max_abs_b);

typedef struct bx_wgrad_opts {
  size_t struct_size; /* sizeof(bx_wgrad_opts): see "Struct sizes" in bitexact.h */
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
} bx_wgrad_opts;
#define BX_WGRAD_OPTS_DEFAULT {sizeof(bx_wgrad_opts), 0}

/* No tensor of the state (bx_linear_wgrad's bias or weight index). */
#define BX_WGRAD_NONE ((size_t)-1)

/* Before bx_tokred_agree, from the inputs alone: raises the exponent bound
 * of tensor w_tensor (the weight, [N,K]) to cover the TN partial of every
 * chunk of the local rows, bx_wgrad_bound_exp(rows of the chunk, max
 * finite |dy| over the chunk's rows, max finite |x| over them), and that of
 * b_tensor (the bias, [N]) to bx_wgrad_bound_exp(rows, max |dy|, 1).
 * Either index may be BX_WGRAD_NONE. dy [T,N] and x [T,K] (2-D or 3-D,
 * fp32 or bf16, host, row-major contiguous) are the local rows: global
 * tokens [token_begin, token_begin + T), which must hold whole chunks
 * (bx_tokred_chunks' rule: BX_ELAYOUT otherwise). x may be NULL when
 * w_tensor is BX_WGRAD_NONE. It reads dY and X once (M·(N+K) elements,
 * against the GEMM's M·N·K), so a backward pass can be one pass: bound from
 * the inputs, bx_tokred_agree, then bx_linear_wgrad adding each partial as
 * it is computed. The price is a looser bound than bx_tokred_bound on the
 * computed partials (docs/train_tokred.md: fewer exact cases, the same
 * accuracy far below fp32). Errors as bx_tokred_bound (after agree:
 * BX_EINVAL; shapes, dtypes, devices, layouts; named); s unchanged on
 * error. Ordinary mode: checked, no effect. */
BX_API bx_status bx_linear_wgrad_bound(bx_tokred *s, size_t w_tensor, size_t b_tensor,
                                       const DLTensor *dy, const DLTensor *x, int64_t token_begin,
                                       const bx_wgrad_opts *opts);

/* After bx_tokred_agree: for every chunk c of the local rows (global tokens
 * [token_begin, token_begin + T), whole chunks), computes the weight
 * partial (TN over the chunk's rows) and the bias partial and adds them to
 * tensors w_tensor and b_tensor of s as chunk c — the bits of
 * bx_gemm(TN) on row views + bx_tokred_add, and of bx_bias_grad_partials +
 * bx_tokred_add (grid mode: the same words in any case; ordinary mode: the
 * same fp32 sums). Either index may be BX_WGRAD_NONE (x may then be NULL
 * for a bias alone). Fused: each block of a partial is rounded onto the
 * grid by the GEMM's worker right after its last k block, while it is in
 * cache, so threads share the add; the partial itself lives in the call's
 * workspace (N·K floats). Shapes: dy [T,N], x [T,K], the weight tensor
 * [N,K], the bias [N]. Errors as bx_tokred_add (not agreed, indices,
 * shapes, dtypes, devices, layouts; a finite partial element not below the
 * agreed bound: BX_EINVAL naming tensor, chunk and element, after which
 * every chunk this call had added is subtracted again exactly); s is
 * unchanged on any error. */
BX_API bx_status bx_linear_wgrad(bx_tokred *s, size_t w_tensor, size_t b_tensor,
                                 const DLTensor *dy, const DLTensor *x, int64_t token_begin,
                                 const bx_wgrad_opts *opts);

/* ======================================================================
 * Experimental: not used by any bitexact model
 * ======================================================================
 * No bitexact model calls these (src/glm, `bitexact train`, the Python
 * model path: their threads live inside bx_linear_wgrad, their bias
 * partials come from it too); they are tested like the rest but may
 * change without an ABI promise. Kept as tested building blocks: fork and
 * merge for a caller that adds partials from threads or micro-batches of
 * its own (the invariance tests and fuzz_tokred merge in every order),
 * the grid exponent for accuracy diagnostics, the bias partials for a
 * caller who bounds computed partials (bx_tokred_bound) instead of the
 * inputs (the bias counterpart of bx_gemm(BX_GEMM_TN) on row views). */

/* The tensor's agreed grid exponent e_t (after bx_tokred_agree; grid mode;
 * else BX_EINVAL): the accuracy of the reduction, for diagnostics and
 * tests. s is only read; *exp2 written only on success. */
BX_API bx_status bx_tokred_grid_exp(const bx_tokred *s, size_t tensor, int *exp2);

/* A new empty state with s's configuration and agreed grid (s after
 * bx_tokred_agree): one per thread or micro-batch, merged back with
 * bx_tokred_merge. *out written only on success, owned by the caller
 * (bx_tokred_destroy). s is only read. */
BX_API bx_status bx_tokred_fork(const bx_tokred *s, bx_tokred **out);

/* into += from (both after bx_tokred_agree, the same configuration and
 * grid: BX_EMISMATCH otherwise, into unchanged). Grid mode: word-by-word
 * int64 addition, so any merge order gives the same words. into == from
 * is refused (BX_EINVAL). from is only read. */
BX_API bx_status bx_tokred_merge(bx_tokred *into, const bx_tokred *from);

/* Bias-gradient chunk partials: partials[j][n] = the bias partial (above)
 * of dy's rows [j·C, min((j+1)·C, T)), C = chunk_tokens >= 1, for
 * j < nchunks = ceil(T / C).
 *   dy        [T,N] (or [batch,rows,N], read as [T,N]), fp32 or bf16, row-major
 *             contiguous, host memory.
 *   partials  [nchunks, N], fp32, row-major contiguous, host memory, not
 *             overlapping dy.
 * Both on a CUDA device (kDLCUDA of one device, or managed where managed
 * calls run there; bitexact_train.h, Devices): the CUDA kernel, the same
 * bits (a NaN partial is stored as the canonical NaN on both).
 * The caller passes partial j to bx_tokred_bound / bx_tokred_add as chunk
 * first_chunk + j, where dy's first row is the global token first_chunk·C
 * (a global chunk boundary: bx_tokred_chunks checks it). T = 0: nothing.
 * Threads take (chunk, column block) pieces, never a chunk's rows apart;
 * bits independent of the count. Errors (checked before any write; nothing
 * written): BX_EINVAL (NULLs, shapes, chunk_tokens < 1, num_threads < 0,
 * struct_size), BX_EDTYPE, BX_EDEVICE, BX_ELAYOUT (strides, alignment,
 * overlap), naming the tensor. */
BX_API bx_status bx_bias_grad_partials(const DLTensor *dy, int64_t chunk_tokens,
                                       DLTensor *partials, const bx_wgrad_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_TRAIN_TOKRED_H */
