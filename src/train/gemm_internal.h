/*
 * gemm_internal.h — the GEMM driver's blocking, exposed for the tests and
 * the benchmark: bx_gemm is bx_gemm_blocked with the default blocking of
 * the active micro-kernel. The blocking changes speed only, never bits
 * (every element is one fixed chain over k: bitexact_train.h).
 */
#ifndef BX_GEMM_INTERNAL_H
#define BX_GEMM_INTERNAL_H

#include <stddef.h>

#include "bitexact_train.h"
#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Block sizes in elements: mc rows of A and C, kc of the k range, nc
 * columns of B and C per block (BLIS's MC, KC, NC). 0 = the default. mc and
 * nc are rounded up to the micro-kernel's mr and nr. A task of the thread
 * pool is one nc-column block of C over a range of whole mc blocks of rows
 * and all of K (K is never split). */
typedef struct bx_gemm_blocking {
  size_t mc, kc, nc;
  /* 0, or: the chains are cut into segments of chunk k steps ([0, chunk),
   * [chunk, 2 chunk), ...), each from +0 (accumulate is ignored), and the
   * epilogue is called on every block after each segment (its values
   * overwritten by the next segment): one pass over A and B computes the
   * partial of every chunk. The bits of each segment are those of the
   * product over that segment's k range alone. */
  size_t chunk;
  /* With chunk and an epilogue: 0, or group the segments by about this
   * many k steps: B packed once per group (or read in place), then per mc
   * block of rows every segment of the group in turn, so that what the
   * epilogue touches per block stays in cache across the group (at the
   * price of streaming the group's B once per mc block). */
  size_t group_tokens;
} bx_gemm_blocking;

#define BX_GEMM_KC 256
#define BX_GEMM_MC 192
#define BX_GEMM_NC 1024
/* bx_linear_wgrad's group of segments (bx_gemm_blocking.group_tokens). */
#define BX_GEMM_GROUP_TOKENS 1024

/* bx_gemm with explicit blocking (NULL = the defaults); the same checks,
 * errors and bits. Also enters the call (call.h). */
bx_status bx_gemm_blocked(const DLTensor *a, const DLTensor *b, bx_gemm_layout layout,
                          DLTensor *c, const bx_gemm_opts *opts, const bx_gemm_blocking *blk);

/* A checked operand (also for wgrad.c's checks). */
typedef struct gemm_operand {
  const void *data; /* first element */
  bx_dtype dt;
  int ndim;
  size_t dim[3];
  size_t bytes;
} gemm_operand;

/* One tensor: present, host (BX_EDEVICE), fp32 or (unless c_dtype) bf16
 * (BX_EDTYPE), 2-D up to max_ndim dimensions, row-major contiguous and
 * aligned (BX_ELAYOUT); errors "fn: tensor NAME ...". */
bx_status bx_gemm_check_operand(const char *fn, const char *name, const DLTensor *t, int max_ndim,
                                int c_dtype, gemm_operand *o);
/* The same for a call on CUDA device cuda_device (>= 0: the tensor must be
 * a kDLCUDA tensor of that device, BX_EDEVICE otherwise; -1: host). */
bx_status bx_gemm_check_operand_in(const char *fn, const char *name, const DLTensor *t,
                                   int max_ndim, int c_dtype, int cuda_device, gemm_operand *o);
/* 1 when the two operands share a byte. */
int bx_gemm_overlaps(const gemm_operand *x, const gemm_operand *y);

/* Called by a worker on each block of C once its values are final (after
 * the last k block of the chain, or of the segment that starts at k0),
 * rows [row0, row0 + rows) and columns [col0, col0 + cols) of C, c
 * pointing at element (row0, col0), row stride ldc floats; every element
 * of C is passed exactly once per segment (k0 = 0 without segments), in no
 * fixed order between blocks and from any worker (worker: 0 .. threads-1;
 * two calls with the same worker never run at once); one block's segments
 * come in increasing k0. With K = 0 it is called once on the whole of C. */
typedef void (*bx_gemm_epilogue_fn)(void *ctx, int worker, float *c, size_t ldc, size_t k0,
                                    size_t row0, size_t col0, size_t rows, size_t cols);

/* bx_gemm_blocked with an epilogue (NULL: none) and the function name of
 * the error messages; enters a call of its own (its own workspace frame). */
bx_status bx_gemm_fused(const char *fn, const DLTensor *a, const DLTensor *b,
                        bx_gemm_layout layout, DLTensor *c, const bx_gemm_opts *opts,
                        const bx_gemm_blocking *blk, bx_gemm_epilogue_fn epi, void *epi_ctx);

#ifdef __cplusplus
}
#endif

#endif /* BX_GEMM_INTERNAL_H */
