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
} bx_gemm_blocking;

#define BX_GEMM_KC 256
#define BX_GEMM_MC 192
#define BX_GEMM_NC 1024

/* bx_gemm with explicit blocking (NULL = the defaults); the same checks,
 * errors and bits. Also enters the call (call.h). */
bx_status bx_gemm_blocked(const DLTensor *a, const DLTensor *b, bx_gemm_layout layout,
                          DLTensor *c, const bx_gemm_opts *opts, const bx_gemm_blocking *blk);

#ifdef __cplusplus
}
#endif

#endif /* BX_GEMM_INTERNAL_H */
