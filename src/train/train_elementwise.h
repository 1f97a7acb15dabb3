/*
 * train_elementwise.h — the validation shared by the elementwise training
 * calls (math.c: bx_exp ...; adamw.c: bx_adamw_step): fp32 host tensors of
 * one shape and one layout, and the thread count for n elements.
 */
#ifndef BX_TRAIN_ELEMENTWISE_H
#define BX_TRAIN_ELEMENTWISE_H

#include <stddef.h>

#include "adamw_hd.h"
#include "bitexact.h"
#include "bitexact_train.h"
#include "tensor.h"

/* ts[0..count): each a valid dense host fp32 tensor (BX_EDTYPE /
 * BX_EDEVICE / BX_ELAYOUT / BX_EINVAL naming "tensor i"), all of tensor
 * 0's shape (BX_EINVAL) and strides (BX_ELAYOUT); a tensor with
 * writable[i] shares no byte with another one (BX_ELAYOUT), except that
 * with allow_inplace it may be exactly another one (same first byte).
 * spans[i] receives each tensor's span. Nothing is written. */
bx_status bx_ew_check(const char *fn, const DLTensor *const *ts, size_t count,
                      const int *writable, int allow_inplace, bx_span *spans);

/* bx_ew_check for host tensors (cuda = 0) or for CUDA tensors (cuda = 1:
 * every tensor kDLCUDA on tensor 0's device, dense; the spans' data are
 * device addresses). */
bx_status bx_ew_check_in(const char *fn, const DLTensor *const *ts, size_t count,
                         const int *writable, int allow_inplace, int cuda, bx_span *spans);

/* 1 when every one of ts[0..count) is a kDLCUDA tensor (none NULL). */
int bx_ew_all_cuda(const DLTensor *const *ts, size_t count);

/* Threads for n elements: num_threads (0 = bx_default_threads()), at most
 * one per piece of 2^14 elements. */
int bx_ew_threads(int num_threads, size_t n);

/* bx_adamw_step's fp32 scalars of one step (checked options, step >= 1):
 * what the host forms once and every element (CPU loop or device thread,
 * adamw_hd.h) uses. */
void bx_adamw_form_scalars(const bx_adamw_opts *o, int64_t step, bx_adamw_scalars *s);
#define BX_EW_PIECE ((size_t)1 << 14)

#endif /* BX_TRAIN_ELEMENTWISE_H */
