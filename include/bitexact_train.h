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

/* ====================================================================== */

/* ======================================================================
 * GEMM (section owner: gemm)
 * ==================================================================== */

/* ====================================================================== */

/* ======================================================================
 * Token reduction (section owner: tokred)
 * ==================================================================== */

/* ====================================================================== */

#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_TRAIN_H */
