/*
 * bitexact_train.h — the training kernels whose bits do not depend on the
 * layout (DESIGN §9): elementwise math built from IEEE basic operations,
 * batch-invariant GEMM, the layout-invariant token reduction (canonical
 * addends on an int64 grid), and AdamW. CPU, C11; DLPack tensors; bx_
 * names; bx_status errors with bx_last_error() as in bitexact.h (the
 * conventions listed there hold here too unless a comment says otherwise).
 *
 * Status: being built. Each section below states what it promises.
 */
#ifndef BITEXACT_TRAIN_H
#define BITEXACT_TRAIN_H

#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Elementwise math (section owner: math)
 * ==================================================================== */

/* fp32 elementwise functions whose bits are bitexact's own (DESIGN §9.3):
 * built from IEEE basic operations only (src/common/math_det.h, shared
 * with the CUDA kernels), so no ISA, thread count or device changes them.
 * Every result is the exact value correctly rounded to fp32 (round to
 * nearest even; checked for all 2^32 inputs, docs/train_math.md):
 *
 *   bx_exp      e^x
 *   bx_log      ln x              (x < 0: NaN, +-0: -Inf)
 *   bx_sigmoid  1 / (1 + e^-x)
 *   bx_silu     x / (1 + e^-x)    (x sigmoid(x) rounded once, not the
 *                                  product of a rounded sigmoid; -Inf -> -0)
 *   bx_rsqrt    1 / sqrt(x)       (+-0: +-Inf, x < 0: NaN)
 *   bx_sin, bx_cos                for |x| < 2^28 (BX_TRIG_DOMAIN; RoPE
 *                                  angles), NaN beyond and for +-Inf
 *
 * NaN inputs give the input NaN quieted (payload kept); an invalid
 * operation gives the NaN 0x7fc00000.
 *
 * Speed: the tensor calls run AVX-512 or AVX2 kernels where the CPU has
 * them (8 or 4 binary64 lanes; BX_ISA forces a table) and give the same
 * bits as the portable scalar code on every input (checked for all 2^32
 * inputs); figures against torch and glibc in docs/train_math.md.
 *
 * Tensors: x and y fp32 (BX_EDTYPE otherwise), host memory (kDLCPU,
 * kDLCUDAHost, kDLCUDAManaged; BX_EDEVICE otherwise), the same shape
 * (BX_EINVAL otherwise) and the same strides, dense (BX_ELAYOUT otherwise).
 * Both are borrowed for the duration of the call. In place is allowed: y
 * may be x itself (the same data, byte offset and strides); any other
 * overlap of y with x is BX_ELAYOUT. On error nothing is written and
 * bx_last_error() names the tensor ("bx_exp: tensor 1: ..."; x is tensor
 * 0, y tensor 1).
 *
 * Threading: the elements are split over the library's worker threads
 * (opts->num_threads, 0 = bx_default_threads()); the results do not
 * depend on the count. Thread-safe: calls on distinct outputs may run
 * concurrently. opts: NULL = BX_MATH_OPTS_DEFAULT; else opts->struct_size
 * must be sizeof(bx_math_opts) (BX_EINVAL otherwise; checked first). */
typedef struct bx_math_opts {
  size_t struct_size; /* sizeof(bx_math_opts) */
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
} bx_math_opts;
#define BX_MATH_OPTS_DEFAULT {sizeof(bx_math_opts), 0}

/* |x| below this: the domain of bx_sin / bx_cos (2^28). */
#define BX_TRIG_DOMAIN 268435456.0f

BX_API bx_status bx_exp(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);
BX_API bx_status bx_log(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);
BX_API bx_status bx_sigmoid(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);
BX_API bx_status bx_silu(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);
BX_API bx_status bx_rsqrt(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);
BX_API bx_status bx_sin(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);
BX_API bx_status bx_cos(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);

/* The same functions on one value (the bits of the tensor calls; no
 * error cases: every input has a defined result). Thread-safe; they run
 * in the library's floating-point environment whatever the caller's. */
BX_API float bx_exp_f32(float x);
BX_API float bx_log_f32(float x);
BX_API float bx_sigmoid_f32(float x);
BX_API float bx_silu_f32(float x);
BX_API float bx_rsqrt_f32(float x);
BX_API float bx_sin_f32(float x);
BX_API float bx_cos_f32(float x);

/* ---- AdamW -------------------------------------------------------------
 *
 * One step of torch.optim.AdamW (foreach=False, amsgrad=False,
 * maximize=False; fp32 parameters, gradients and states: fp32 master
 * weights) with the roundings torch's CPU kernels make, in this order
 * (f32(.) rounds a double to fp32; every operation below on fp32 values
 * is one fp32 rounding, fmaf one rounding of the exact a*b + c):
 *
 *   t = step (>= 1, the count after this step, as torch's state["step"])
 *   bc1 = 1 - beta1^t, bc2 = 1 - beta2^t      double; ^ is bx_pow_det
 *   step_size = lr / bc1, bc2_sqrt = sqrt(bc2) double (torch: Python floats)
 *   if weight_decay != 0: p = p * f32(1 - lr*weight_decay)
 *   w = f32(1 - beta1), d = g - m
 *   m = |w| < 0.5 ? fmaf(w, d, m) : fmaf(w - 1, d, g)  (torch's lerp_)
 *   v = fmaf(f32(1 - beta2) * g, g, v * f32(beta2))   (mul_, addcmul_)
 *   denom = sqrtf(v) / f32(bc2_sqrt) + f32(eps)
 *   p = p + (f32(-step_size) * m) / denom           (addcdiv_)
 *
 * docs/train_math.md compares this with torch's CPU AdamW bit for bit.
 *
 * Tensors: param, exp_avg, exp_avg_sq are updated in place, grad is read;
 * all fp32 (BX_EDTYPE), host (BX_EDEVICE), the same shape (BX_EINVAL) and
 * strides, dense, and no two share a byte (BX_ELAYOUT). Borrowed for the
 * call. Errors name the tensor (param 0, grad 1, exp_avg 2, exp_avg_sq
 * 3); on any error nothing is written. Options: lr >= 0, 0 <= beta1, beta2
 * < 1, eps >= 0, weight_decay >= 0, all finite, step >= 1 (BX_EINVAL
 * otherwise). Threading as the elementwise calls: bits independent of the
 * thread count. opts: NULL = BX_ADAMW_OPTS_DEFAULT (torch's defaults);
 * else opts->struct_size must be sizeof(bx_adamw_opts) (BX_EINVAL, checked
 * first). */
typedef struct bx_adamw_opts {
  size_t struct_size; /* sizeof(bx_adamw_opts) */
  double lr;          /* 1e-3 */
  double beta1;       /* 0.9 */
  double beta2;       /* 0.999 */
  double eps;         /* 1e-8 */
  double weight_decay; /* 1e-2 */
  int num_threads;    /* 0 = default */
} bx_adamw_opts;
#define BX_ADAMW_OPTS_DEFAULT {sizeof(bx_adamw_opts), 1e-3, 0.9, 0.999, 1e-8, 1e-2, 0}

BX_API bx_status bx_adamw_step(DLTensor *param, const DLTensor *grad, DLTensor *exp_avg,
                               DLTensor *exp_avg_sq, int64_t step, const bx_adamw_opts *opts);


/* ====================================================================== */

/* ======================================================================
 * GEMM (section owner: gemm)
 * ==================================================================== */

/* Batch-invariant GEMM: C[M,N] = A[M,K] · op(B), fp32 accumulation, fp32
 * output, on host tensors.
 *
 * The order (DESIGN §9, rule 1). Every output element is one sequential
 * chain of fused multiply-adds over k = 0, 1, ..., K-1:
 *     acc = accumulate ? C[i][j] : +0.0f;
 *     for (k = 0; k < K; k++) acc = fmaf(A[i][k], Bop[k][j], acc);
 *     C[i][j] = acc;
 * with one rounding per step (fmaf), bf16 inputs widened to fp32 exactly,
 * IEEE binary32 round-to-nearest-even, no flush of subnormals. Nothing else
 * enters the chain: no split-K, no partial sums, no kernel choice by shape.
 * So the bits of row i of C depend only on row i of A, on B and (with
 * accumulate) on row i of C: the same for any M (a row computed in a batch
 * of 1 equals the same row in a batch of 10,000), any thread count, block
 * or tile size, padding, alignment, and ISA (AVX-512, AVX2 and portable C
 * give identical bits). NaN and Inf propagate as IEEE fma says.
 *
 * Layouts (all row-major, C-contiguous):
 *   BX_GEMM_NT: B is [N,K] (torch.nn.Linear's weight W): C = A · Bᵀ, the
 *               forward Y = X · Wᵀ.
 *   BX_GEMM_NN: B is [K,N]: C = A · B, e.g. the input gradient
 *               dX[M,K] = dY[M,N] · W[N,K].
 *   BX_GEMM_TN: the weight gradient dW[N,K] = dYᵀ · X of Y = X · Wᵀ, with
 *               A = dY [T,N] and B = X [T,K], both token-major (T rows =
 *               tokens), C [N,K]. Here the chain runs over the TOKENS:
 *                 acc = accumulate ? C[n][k] : +0.0f;
 *                 for (t = 0; t < T; t++) acc = fmaf(A[t][n], B[t][k], acc);
 *                 C[n][k] = acc;
 *               one sequential chain per element over t = 0..T-1 (never split
 *               over t: threads, blocks and ISAs take blocks of (n, k) only),
 *               so the bits depend on the T rows given and their order, never
 *               on the thread count, blocking or ISA. A and B may be 3-D
 *               [batch, rows, cols], read as [batch·rows, cols]; C is 2-D.
 *               A token reduction splits T (DESIGN §9 rule 2): the CHUNK
 *               PARTIAL of a weight gradient over the global tokens
 *               [c·C, min((c+1)·C, T)) is bx_gemm(TN) on views of dY and X
 *               restricted to those rows (a DLTensor with the same data,
 *               byte_offset advanced by first_row · row bytes and shape[0] =
 *               the chunk's rows), added to a bx_tokred state as chunk c;
 *               bx_linear_wgrad (below) does exactly that for a run of chunks.
 * A and C may also be 3-D (NT, NN), [batch, rows, cols] with the same batch,
 * read as [batch·rows, cols] (a row-major batch of sequences); B is 2-D. */
typedef enum bx_gemm_layout {
  BX_GEMM_NT = 0, /* B [N,K] */
  BX_GEMM_NN = 1, /* B [K,N] */
  BX_GEMM_TN = 2  /* A [T,N], B [T,K], C [N,K] = Aᵀ·B: the weight gradient */
} bx_gemm_layout;

typedef struct bx_gemm_opts {
  size_t struct_size; /* sizeof(bx_gemm_opts): see "Struct sizes" in bitexact.h */
  int num_threads;    /* 0 = library default; results never depend on it */
  int accumulate;     /* 0: C = A·op(B); 1: C += A·op(B) (C's value starts each chain) */
} bx_gemm_opts;

#define BX_GEMM_OPTS_DEFAULT {sizeof(bx_gemm_opts), 0, 0}

/* C = A · op(B) (or C += with opts->accumulate), in the order above.
 *   a     [M,K] (or [batch,rows,K]), fp32 or bf16 (kDLFloat 32 / kDLBfloat
 *         16, one lane), row-major contiguous (strides NULL or compact; a
 *         dimension of extent 1 may have any stride), host memory.
 *         TN: [T,N] (or [batch,rows,N]).
 *   b     [N,K] (BX_GEMM_NT) or [K,N] (BX_GEMM_NN), fp32 or bf16 (the dtype
 *         of a and b may differ), row-major contiguous, host memory.
 *         TN: [T,K] (or [batch,rows,K]) with a's T.
 *   c     [M,N] (or [batch,rows,N] when a is 3-D; TN: [N,K]), fp32, row-major
 *         contiguous, host memory; must not share a byte with a or b
 *         (a and b may overlap each other: they are only read).
 *   opts  NULL = BX_GEMM_OPTS_DEFAULT; opts->struct_size is checked first.
 * K = 0 (TN: T = 0) gives C = +0 (or leaves C as it was with accumulate);
 * M = 0 or N = 0 (TN: N = 0 or K = 0) does nothing. All tensors are borrowed for the call only. Data
 * pointers (with byte_offset) must be aligned to their element size; no
 * other alignment is needed.
 * Errors, every one checked before the first write (a failing call writes
 * nothing to c): BX_EINVAL (NULL tensor or data, bad layout, shape
 * mismatch, wrong dimension count, negative num_threads, bad struct_size),
 * BX_EDTYPE (a dtype not listed), BX_EDEVICE (not host memory), BX_ELAYOUT
 * (not row-major contiguous, misaligned, c overlapping a or b), BX_ENOMEM.
 * bx_last_error() names the tensor.
 * Threading: splits the M and N blocks (TN: N and K) over up to
 * num_threads workers of the library's pool, never the chain (K; TN: T). Safe to call from several threads at once on
 * distinct c. The caller's floating-point environment is not used (the
 * library's own is entered for the call) and is given back unchanged. */
BX_API bx_status bx_gemm(const DLTensor *a, const DLTensor *b, bx_gemm_layout layout, DLTensor *c,
                         const bx_gemm_opts *opts);

/* ====================================================================== */

/* ======================================================================
 * Token reduction (section owner: tokred)
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
 * ranks, in rank order, as frameworks do: its bits depend on the layout.
 *
 * A step, on each rank (threads: one state each from bx_tokred_fork):
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
 * Threads: a bx_tokred is used by one thread at a time; different states
 * may be used by different threads at once (bx_tokred_fork one per thread,
 * bx_tokred_merge them in any order). DLTensors are borrowed for the call.
 * Tensors: fp32 (kDLFloat, 32, lanes 1), host memory, dense (strides NULL
 * or row-major); a partial has the shape of its gradient.
 */
typedef enum bx_tokred_mode {
  BX_TOKRED_GRID = 0,    /* canonical addends on an int64 grid (default) */
  BX_TOKRED_ORDINARY = 1 /* negative control: fp32 sums in layout order */
} bx_tokred_mode;

typedef struct bx_tokred_opts {
  size_t struct_size; /* sizeof(bx_tokred_opts): see "Struct sizes" in bitexact.h */
  bx_tokred_mode mode;
} bx_tokred_opts;

#define BX_TOKRED_OPTS_DEFAULT {sizeof(bx_tokred_opts), BX_TOKRED_GRID}

/* Format of the state's words; bump when the layout or the grid changes. */
#define BX_TOKRED_FORMAT 1
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
 * only on success. Thread-safe. */
BX_API bx_status bx_tokred_create(const DLTensor *grads, size_t ntensors, int64_t chunk_tokens,
                                  int64_t total_tokens, const bx_tokred_opts *opts,
                                  bx_tokred **out);

/* Frees s (NULL: nothing). */
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

/* The tensor's agreed grid exponent e_t (after bx_tokred_agree; grid mode;
 * else BX_EINVAL). */
BX_API bx_status bx_tokred_grid_exp(const bx_tokred *s, size_t tensor, int *exp2);

/* A new empty state with s's configuration and agreed grid (s after
 * bx_tokred_agree): one per thread or micro-batch, merged back with
 * bx_tokred_merge. *out written only on success. s is only read. */
BX_API bx_status bx_tokred_fork(const bx_tokred *s, bx_tokred **out);

/* Adds chunk's partial (shape of the tensor, fp32) of tensor: each element
 * rounded onto the tensor's grid and added as an int64 word (grid mode),
 * or added in fp32 (ordinary mode). The chunk's coverage word is
 * incremented. BX_EINVAL: bad tensor index, chunk outside [0, N), called
 * before bx_tokred_agree, or a finite element with |a| >= 2^E_t (the
 * agreed bound: the partial differs from the one bounded, or a stated
 * bound was wrong; the message names tensor, chunk and element);
 * BX_EDTYPE / BX_ELAYOUT / BX_EDEVICE for the partial. On error s is
 * unchanged. Single-threaded in the calling thread. */
BX_API bx_status bx_tokred_add(bx_tokred *s, size_t tensor, int64_t chunk,
                               const DLTensor *partial);

/* into += from (both after bx_tokred_agree, the same configuration and
 * grid: BX_EMISMATCH otherwise, into unchanged). Grid mode: word-by-word
 * int64 addition, so any merge order gives the same words. into == from
 * is refused (BX_EINVAL). from is only read. */
BX_API bx_status bx_tokred_merge(bx_tokred *into, const bx_tokred *from);

/* The state's wire words, for a caller's own all-reduce (grid mode): the
 * word-by-word int64 SUM over ranks of these words, in any order (MPI_SUM
 * on MPI_INT64_T, all_reduce(SUM) on an int64 tensor), written back in
 * place, is the state of the whole global batch. Valid until s is
 * destroyed; *count words (per tensor its elements and one non-finite
 * word, then one coverage word per (tensor, chunk)). The grid must have
 * been agreed first. Ordinary mode: BX_EINVAL (fp32 sums are not summable
 * words). */
BX_API bx_status bx_tokred_words(bx_tokred *s, int64_t **words, size_t *count);

/* Over ranks through comm (NULL: nothing to do): an agreement step (one
 * small MAX all-reduce: configuration, grid, local checks) then, in grid
 * mode, one SUM all-reduce of bx_tokred_words's words; every rank then
 * holds the global state. Ordinary mode: each rank's fp32 sums are
 * gathered (a SUM all-reduce of a rank count, then one of nranks * words
 * with each rank in its own slot, so comm->rank must number the ranks
 * 0..n-1) and added in rank order. Errors come back
 * on every rank (BX_EMISMATCH, BX_ECOMM, or the failing rank's status);
 * on error s is unchanged. */
BX_API bx_status bx_tokred_allreduce(bx_tokred *s, const bx_comm *comm);

/* Writes each tensor's sum divided by divisor (>= 1; 1 for a sum, the
 * global token count for a token mean), rounded once, nearest even, into
 * out[0..nout), nout == the state's tensor count, each of the tensor's
 * shape, fp32 or fp64, writable, not overlapping each other. Grid mode:
 * the exact value Q * 2^e_t / divisor rounded once. Ordinary mode: the
 * fp32 sum, then fl32(sum / divisor). Checks everything first: BX_ELAYOUT
 * unless every chunk of every tensor was added exactly once (naming the
 * tensor, the chunk and its count), BX_ENONFINITE if a tensor saw a NaN or
 * Inf addend, BX_EINVAL / BX_EDTYPE / BX_ELAYOUT / BX_EDEVICE for the
 * outputs; on error nothing is written. s is only read. */
BX_API bx_status bx_tokred_finish(const bx_tokred *s, DLTensor *out, size_t nout,
                                  int64_t divisor);

/* ---- Weight gradients over tokens (section owner: gemm) ----------------
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
  int num_threads;    /* 0 = library default; results never depend on it */
} bx_wgrad_opts;
#define BX_WGRAD_OPTS_DEFAULT {sizeof(bx_wgrad_opts), 0}

/* No tensor of the state (bx_linear_wgrad's bias or weight index). */
#define BX_WGRAD_NONE ((size_t)-1)

/* Bias-gradient chunk partials: partials[j][n] = the bias partial (above)
 * of dy's rows [j·C, min((j+1)·C, T)), C = chunk_tokens >= 1, for
 * j < nchunks = ceil(T / C).
 *   dy        [T,N] (or [batch,rows,N], read as [T,N]), fp32 or bf16, row-major
 *             contiguous, host memory.
 *   partials  [nchunks, N], fp32, row-major contiguous, host memory, not
 *             overlapping dy.
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


/* ====================================================================== */

/* ======================================================================
 * MoE router and token dispatch (section owner: moe)
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
 * Threading: tokens (or rows) in fixed pieces over up to num_threads
 * workers; every output element is computed by one worker in one fixed
 * order, so no bit depends on the thread count, T, the ISA or the piece.
 * Thread-safe on distinct outputs. The library's floating-point
 * environment is used for the call, the caller's given back.
 */

/* ---- router ------------------------------------------------------------ */

typedef struct bx_moe_router_opts {
  size_t struct_size;           /* sizeof(bx_moe_router_opts) */
  int num_threads;              /* 0 = default; < 0 BX_EINVAL */
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

/* ---- dispatch ---------------------------------------------------------- */

typedef struct bx_moe_dispatch_opts {
  size_t struct_size; /* sizeof(bx_moe_dispatch_opts) */
  int num_threads;    /* 0 = default; < 0 BX_EINVAL */
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
 * each in [chunk_begin*C, (chunk_begin + m)*C) for m = bounds' length - 1
 * (BX_EINVAL otherwise). bounds [m+1] int64, written: bounds[i] = the
 * number of rows with id < (chunk_begin + i) * C, so the expert's rows of
 * global chunk chunk_begin + i are [bounds[i], bounds[i+1]) — a
 * contiguous range: the expert's weight-gradient partial of that chunk
 * (bx_tokred_add) is a GEMM over those rows. C = chunk_tokens >= 1,
 * chunk_begin >= 0. */
BX_API bx_status bx_moe_expert_chunks(const DLTensor *token_ids, int64_t chunk_tokens,
                                      int64_t chunk_begin, DLTensor *bounds);

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

/* ====================================================================== */

/* ======================================================================
 * Layers: RMSNorm, RoPE, SwiGLU (section owner: norms)
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
 * distinct outputs. The caller's floating-point environment is not used. */

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
  size_t struct_size; /* sizeof(bx_rope_opts) */
  int num_threads;    /* 0 = default; < 0 BX_EINVAL */
} bx_rope_opts;
#define BX_ROPE_OPTS_DEFAULT {sizeof(bx_rope_opts), 0}

BX_API bx_status bx_rope_forward(const DLTensor *x, const DLTensor *positions, int64_t head_dim,
                                 int64_t rotary_dim, double theta, DLTensor *y,
                                 const bx_rope_opts *opts);
BX_API bx_status bx_rope_backward(const DLTensor *dy, const DLTensor *positions,
                                  int64_t head_dim, int64_t rotary_dim, double theta,
                                  DLTensor *dx, const bx_rope_opts *opts);

/* The table itself: cos and sin [T, rotary_dim/2] (or any shape of T rows
 * of rotary_dim/2 elements), the distinct half of torch's
 * cat((freqs, freqs)) tables, computed as above. Tensor positions:
 * positions 0, cos 1, sin 2 (they must not overlap). */
BX_API bx_status bx_rope_cos_sin(const DLTensor *positions, int64_t rotary_dim, double theta,
                                 DLTensor *cos, DLTensor *sin, const bx_rope_opts *opts);

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
 * Fused form: gate_up [T, 2F] holds gate in columns [0, F) and up in
 * [F, 2F) of each row (the experts' gate_up_proj output split by
 * .chunk(2, dim=-1): gate first), h and dh [T, F], dgate_up [T, 2F] in the
 * same layout. In place: h may be gate or up itself; dgate may be gate
 * itself and dup up itself; dgate_up may be gate_up itself.
 * Tensor positions: forward gate 0, up 1, h 2 (fused: gate_up 0, h 1);
 * backward gate 0, up 1, dh 2, dgate 3, dup 4 (fused: gate_up 0, dh 1,
 * dgate_up 2). */
typedef struct bx_swiglu_opts {
  size_t struct_size; /* sizeof(bx_swiglu_opts) */
  int num_threads;    /* 0 = default; < 0 BX_EINVAL */
} bx_swiglu_opts;
#define BX_SWIGLU_OPTS_DEFAULT {sizeof(bx_swiglu_opts), 0}

BX_API bx_status bx_swiglu_forward(const DLTensor *gate, const DLTensor *up, DLTensor *h,
                                   const bx_swiglu_opts *opts);
BX_API bx_status bx_swiglu_forward_fused(const DLTensor *gate_up, DLTensor *h,
                                         const bx_swiglu_opts *opts);
BX_API bx_status bx_swiglu_backward(const DLTensor *gate, const DLTensor *up, const DLTensor *dh,
                                    DLTensor *dgate, DLTensor *dup, const bx_swiglu_opts *opts);
BX_API bx_status bx_swiglu_backward_fused(const DLTensor *gate_up, const DLTensor *dh,
                                          DLTensor *dgate_up, const bx_swiglu_opts *opts);

/* ====================================================================== */

/* ======================================================================
 * Layers: causal GQA attention (section owner: attn)
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
  size_t struct_size; /* sizeof(bx_attention_opts) */
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

/* ====================================================================== */

/* ======================================================================
 * Layers: embedding, cross-entropy (section owner: loss)
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
  size_t struct_size; /* sizeof(bx_embedding_opts) */
  int num_threads;    /* 0 = default */
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
 * rows). s is unchanged on error. */
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
  size_t struct_size;   /* sizeof(bx_xent_opts) */
  int num_threads;      /* 0 = default */
  int64_t ignore_index; /* -100 (torch's default) */
  double grad_scale;    /* dloss: the upstream gradient of the mean (1.0); finite */
} bx_xent_opts;
#define BX_XENT_OPTS_DEFAULT {sizeof(bx_xent_opts), 0, -100, 1.0}

/* Forward: losses [T] (or [B, L]) fp32 the per-token loss_t (0 for an
 * ignored token); loss_partials [nchunks] fp32, chunk j's sum
 *     acc = +0.0f; for t in chunk, ascending, not ignored: acc = acc + loss_t;
 * counts [nchunks] int64, chunk j's number of non-ignored tokens.
 * loss_partials and counts may be NULL (not computed). chunk_tokens >= 1. */
BX_API bx_status bx_xent_forward(const DLTensor *logits, const DLTensor *targets,
                                 int64_t chunk_tokens, DLTensor *losses,
                                 DLTensor *loss_partials, DLTensor *counts,
                                 const bx_xent_opts *opts);

/* Backward of the global mean: dlogits [T, V] (or [B, L, V]) fp32, the
 * formula above with n_global = N_global >= 1 (and >= this call's own
 * non-ignored count; BX_EINVAL otherwise). In place allowed: dlogits may be
 * logits itself (the same data, offset and shape); any other overlap is
 * BX_ELAYOUT. Recomputes m, e_v and S (e_v is kept in dlogits between the
 * two passes). */
BX_API bx_status bx_xent_backward(const DLTensor *logits, const DLTensor *targets,
                                  int64_t n_global, DLTensor *dlogits,
                                  const bx_xent_opts *opts);

/* Forward and backward in one pass over the logits: the outputs of both
 * calls, bit for bit (dlogits may be logits itself; loss_partials and
 * counts may be NULL). */
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

/* ====================================================================== */

#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_TRAIN_H */
