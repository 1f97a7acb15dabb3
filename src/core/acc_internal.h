/*
 * acc_internal.h — exact deposits into a bx_acc, for the kernels. They do
 * not normalise: a kernel call on n elements may make at most
 * min(BX_MAX_DEPOSITS, 2n + 1024) deposits into one accumulator; the driver
 * normalises before 2^28 deposits can pile up (each deposit moves a word
 * by less than 2^33, words stay below 2^62).
 */
#ifndef BX_ACC_INTERNAL_H
#define BX_ACC_INTERNAL_H

#include <stdint.h>

#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BX_MAX_DEPOSITS (1u << 26)

/* acc += v * 2^exp exactly. Requires exp >= BX_ACC_LSB_EXP and
 * v * 2^exp < 2^2140 in magnitude. v may be negative. */
void bx_acc_deposit_i64(bx_acc *acc, int64_t v, int exp);

/* acc += v * 2^exp exactly, v unsigned (up to 2^64 - 1). */
void bx_acc_deposit_u64(bx_acc *acc, uint64_t v, int exp);

#ifdef __cplusplus
}
#endif

#endif /* BX_ACC_INTERNAL_H */
