/*
 * bitexact_train_gemm.h — the batch-invariant GEMM (DESIGN §9). Part of
 * bitexact_train.h (the umbrella: include that); the conventions of
 * bitexact.h and of bitexact_train.h (options, ownership, in place,
 * threading, names, Experimental) hold here too unless a comment says
 * otherwise.
 */
#ifndef BITEXACT_TRAIN_GEMM_H
#define BITEXACT_TRAIN_GEMM_H

#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * GEMM
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
 * give identical bits). NaN and Inf propagate as IEEE fma says; a NaN
 * element of C is stored as the canonical 0x7fc00000 (bitexact.h, "NaN").
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
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
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


#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_TRAIN_GEMM_H */
