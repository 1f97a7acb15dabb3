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
 * A and C may also be 3-D, [batch, rows, cols] with the same batch, read as
 * [batch·rows, cols] (a row-major batch of sequences); B is always 2-D. */
typedef enum bx_gemm_layout {
  BX_GEMM_NT = 0, /* B [N,K] */
  BX_GEMM_NN = 1  /* B [K,N] */
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
 *   b     [N,K] (BX_GEMM_NT) or [K,N] (BX_GEMM_NN), fp32 or bf16 (the dtype
 *         of a and b may differ), row-major contiguous, host memory.
 *   c     [M,N] (or [batch,rows,N] when a is 3-D), fp32, row-major
 *         contiguous, host memory; must not share a byte with a or b
 *         (a and b may overlap each other: they are only read).
 *   opts  NULL = BX_GEMM_OPTS_DEFAULT; opts->struct_size is checked first.
 * K = 0 gives C = +0 (or leaves C as it was with accumulate); M = 0 or
 * N = 0 does nothing. All tensors are borrowed for the call only. Data
 * pointers (with byte_offset) must be aligned to their element size; no
 * other alignment is needed.
 * Errors, every one checked before the first write (a failing call writes
 * nothing to c): BX_EINVAL (NULL tensor or data, bad layout, shape
 * mismatch, wrong dimension count, negative num_threads, bad struct_size),
 * BX_EDTYPE (a dtype not listed), BX_EDEVICE (not host memory), BX_ELAYOUT
 * (not row-major contiguous, misaligned, c overlapping a or b), BX_ENOMEM.
 * bx_last_error() names the tensor.
 * Threading: splits the M and N blocks over up to num_threads workers of
 * the library's pool, never K. Safe to call from several threads at once on
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


/* ====================================================================== */

#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_TRAIN_H */
