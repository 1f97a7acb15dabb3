/*
 * train_elementwise.h — the validation shared by the elementwise training
 * calls (math.c: bx_exp ...; adamw.c: bx_adamw_step): fp32 host tensors of
 * one shape and one layout, and the thread count for n elements.
 */
#ifndef BX_TRAIN_ELEMENTWISE_H
#define BX_TRAIN_ELEMENTWISE_H

#include <stddef.h>

#include "bitexact.h"
#include "tensor.h"

/* ts[0..count): each a valid dense host fp32 tensor (BX_EDTYPE /
 * BX_EDEVICE / BX_ELAYOUT / BX_EINVAL naming "tensor i"), all of tensor
 * 0's shape (BX_EINVAL) and strides (BX_ELAYOUT); a tensor with
 * writable[i] shares no byte with another one (BX_ELAYOUT), except that
 * with allow_inplace it may be exactly another one (same first byte).
 * spans[i] receives each tensor's span. Nothing is written. */
bx_status bx_ew_check(const char *fn, const DLTensor *const *ts, size_t count,
                      const int *writable, int allow_inplace, bx_span *spans);

/* Threads for n elements: num_threads (0 = bx_default_threads()), at most
 * one per piece of 2^14 elements. */
int bx_ew_threads(int num_threads, size_t n);

#define BX_EW_PIECE ((size_t)1 << 14)

#endif /* BX_TRAIN_ELEMENTWISE_H */
