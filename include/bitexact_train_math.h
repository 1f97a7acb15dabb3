/*
 * bitexact_train_math.h — elementwise math built from IEEE basic operations
 * (exp, log, sigmoid, SiLU, rsqrt, ...) and AdamW (DESIGN §9). Part of
 * bitexact_train.h (the umbrella: include that); the conventions of
 * bitexact.h and of bitexact_train.h (options, ownership, in place,
 * threading, names, Experimental) hold here too unless a comment says
 * otherwise.
 */
#ifndef BITEXACT_TRAIN_MATH_H
#define BITEXACT_TRAIN_MATH_H

#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Elementwise math
 * ==================================================================== */

/* fp32 elementwise functions whose bits are bitexact's own (DESIGN §9.3):
 * built from IEEE basic operations only (src/common/math_det.h, shared
 * with the CUDA kernels), so no ISA, thread count or device changes them.
 * Every result is the exact value correctly rounded to fp32 (round to
 * nearest even; checked for all 2^32 inputs, docs/train_math.md):
 *
 *   exp      e^x
 *   log      ln x              (x < 0: NaN, +-0: -Inf)
 *   sigmoid  1 / (1 + e^-x)
 *   silu     x / (1 + e^-x)    (x sigmoid(x) rounded once, not the product
 *                               of a rounded sigmoid; -Inf -> -0)
 *   rsqrt    1 / sqrt(x)       (+-0: +-Inf, x < 0: NaN)
 *   sin, cos                   for |x| < 2^28 (BX_TRIG_DOMAIN; RoPE
 *                               angles), NaN beyond and for +-Inf
 *
 * A NaN input (any sign, any payload) and an invalid operation give the
 * canonical NaN 0x7fc00000 (bitexact.h, "NaN"). Each function exists on one value
 * (bx_exp_f32, ...) and over a tensor (bx_exp, ...), with the same bits.
 * The model uses bx_log_f32 and bx_cos_f32 (its normal initialisation);
 * the other forms are in the Experimental section at the end. */

/* |x| below this: the domain of bx_sin_f32 / bx_cos_f32 (2^28). */
#define BX_TRIG_DOMAIN 268435456.0f

/* One value, no error cases (every input has a defined result). No
 * memory, no threads: thread-safe; they run in the library's
 * floating-point environment whatever the caller's. */
BX_API float bx_log_f32(float x);
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
 * otherwise). Threading: the elements over up to opts->num_threads
 * workers of the pool, bits independent of the count; thread-safe on
 * distinct param/state tensors. opts: NULL = BX_ADAMW_OPTS_DEFAULT
 * (torch's defaults); else opts->struct_size must be sizeof(bx_adamw_opts)
 * (BX_EINVAL, checked first). num_threads is the struct's last field here
 * (an older layout than the other options, kept for the ABI). */
typedef struct bx_adamw_opts {
  size_t struct_size; /* sizeof(bx_adamw_opts): see "Struct sizes" in bitexact.h */
  double lr;          /* 1e-3 */
  double beta1;       /* 0.9 */
  double beta2;       /* 0.999 */
  double eps;         /* 1e-8 */
  double weight_decay; /* 1e-2 */
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
} bx_adamw_opts;
#define BX_ADAMW_OPTS_DEFAULT {sizeof(bx_adamw_opts), 1e-3, 0.9, 0.999, 1e-8, 1e-2, 0}

BX_API bx_status bx_adamw_step(DLTensor *param, const DLTensor *grad, DLTensor *exp_avg,
                               DLTensor *exp_avg_sq, int64_t step, const bx_adamw_opts *opts);

/* ---- Learning-rate schedules --------------------------------------------
 *
 * transformers' schedules (get_scheduler(name, optimizer,
 * num_warmup_steps=W, num_training_steps=N), a LambdaLR over the base rate
 * lr), with "cosine" also its "cosine_with_min_lr" (min_lr > 0). The rate
 * of step s (0-based: the update that makes the optimizer's step count
 * s + 1, as the scheduler's lambda(s) gives it in transformers' Trainer):
 *
 *   constant                 lr
 *   s < W (the others)       lr * s / W                 (warmup from 0)
 *   constant_with_warmup     lr
 *   linear                   m + (lr - m) * max(0, (N - s) / max(1, N - W))
 *   cosine                   m + (lr - m) * (1 + cos(pi (s - W) / max(1, N - W))) / 2
 *
 * with m = min_lr (0: transformers' plain "linear" / "cosine"; for cosine
 * this is cosine_with_min_lr's factor * (1 - m / lr) + m / lr; for linear
 * it is Megatron's floor, which transformers' linear lacks). Past N the
 * cosine rises again, as transformers' does. */
typedef enum bx_lr_schedule {
  BX_LR_CONSTANT = 0,
  BX_LR_LINEAR = 1,
  BX_LR_COSINE = 2,
  BX_LR_CONSTANT_WITH_WARMUP = 3
} bx_lr_schedule;

/* *out := the rate of step `step` under `kind`, evaluated exactly from the
 * integer ratios (double-double, no libm; relative error below 2^-95) and
 * rounded once to double: the correctly rounded rate (checked against
 * MPFR), the same bits on every machine. transformers computes the same
 * formulas in Python floats, several roundings, so its rates may differ
 * from these by an ulp or two.
 * Arguments: lr finite in [0, 2^900), 0 <= min_lr <= lr (min_lr != 0 only
 * with linear and cosine), warmup_steps, total_steps and step in [0, 2^52];
 * out not NULL. Errors: BX_EINVAL naming the argument, *out unchanged.
 * No memory, no threads: thread-safe. */
BX_API bx_status bx_lr_at(bx_lr_schedule kind, double lr, double min_lr, int64_t warmup_steps,
                          int64_t total_steps, int64_t step, double *out);

/* ======================================================================
 * Experimental: not used by any bitexact model
 * ======================================================================
 * No bitexact model calls these (src/glm, `bitexact train`, the Python
 * model path); they are tested like the rest (all 2^32 inputs, the same
 * bits as the scalar calls) but may change without an ABI promise. Kept
 * because they are the bits the layers' contracts cite (bx_rsqrt_f32 in
 * RMSNorm, bx_sigmoid_f32 and bx_silu_f32 in SwiGLU and the router,
 * bx_sin_f32 in RoPE), so a caller can reproduce any elementwise step, and
 * because the tensor calls are the vectorised building blocks of other
 * models (benchmarks against torch and glibc: docs/train_math.md).
 *
 * Scalar calls: as bx_log_f32 above. */
BX_API float bx_exp_f32(float x);
BX_API float bx_sigmoid_f32(float x);
BX_API float bx_silu_f32(float x);
BX_API float bx_rsqrt_f32(float x);
BX_API float bx_sin_f32(float x);

/* Tensor calls: y = f(x) elementwise, the bits of the scalar call.
 *
 * Speed: AVX-512 or AVX2 kernels where the CPU has them (8 or 4 binary64
 * lanes; BX_ISA forces a table), the same bits as the portable scalar code
 * on every input.
 *
 * Tensors: x and y fp32 (BX_EDTYPE otherwise), host memory (kDLCPU,
 * kDLCUDAHost, kDLCUDAManaged) or both kDLCUDA tensors of one device (the
 * CUDA kernel, the same bits; bitexact_train.h, Devices; BX_EDEVICE
 * otherwise), the same shape
 * (BX_EINVAL otherwise) and the same strides, dense (BX_ELAYOUT otherwise).
 * Ownership: both borrowed for the call. In place: y may be x itself (the
 * same data, byte offset and strides); any other overlap of y with x is
 * BX_ELAYOUT. On error nothing is written and bx_last_error() names the
 * tensor ("bx_exp: tensor 1: ..."; x is tensor 0, y tensor 1).
 *
 * Threading: the elements are split over the library's worker threads
 * (opts->num_threads, 0 = bx_default_threads()); the results do not
 * depend on the count. Thread-safe: calls on distinct outputs may run
 * concurrently. opts: NULL = BX_MATH_OPTS_DEFAULT; else opts->struct_size
 * must be sizeof(bx_math_opts) (BX_EINVAL otherwise; checked first). */
typedef struct bx_math_opts {
  size_t struct_size; /* sizeof(bx_math_opts): see "Struct sizes" in bitexact.h */
  int num_threads;    /* 0 = default, >= 1 = at most that many; < 0 BX_EINVAL */
} bx_math_opts;
#define BX_MATH_OPTS_DEFAULT {sizeof(bx_math_opts), 0}

BX_API bx_status bx_exp(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);
BX_API bx_status bx_log(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);
BX_API bx_status bx_sigmoid(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);
BX_API bx_status bx_silu(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);
BX_API bx_status bx_rsqrt(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);
BX_API bx_status bx_sin(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);
BX_API bx_status bx_cos(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);

/* y = x rounded to bf16: nearest even on the bits (torch's
 * x.to(torch.bfloat16)), every NaN the canonical 0x7fc0 (c10's NaN),
 * overflow to +-Inf, subnormals rounded like any value: the rounding of
 * the models' bf16 GEMM operands (`--compute-dtype bf16`). x fp32, y bf16
 * (kDLBfloat, 16 bits), the same shape, both dense row-major (strides NULL
 * or compact), host memory or both kDLCUDA tensors of one device (the
 * CUDA kernel; Devices), not overlapping. The same bits on every ISA and
 * device (one integer rule, vectorised). Errors (nothing written): BX_EDTYPE,
 * BX_EDEVICE, BX_EINVAL (shapes, opts), BX_ELAYOUT (strides, overlap),
 * naming the tensor (x 0, y 1). Threads, ownership and opts as above. */
BX_API bx_status bx_round_bf16(const DLTensor *x, DLTensor *y, const bx_math_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_TRAIN_MATH_H */
