/*
 * util.h — test-side tensors and data: owned buffers wrapped in DLTensor
 * views, per-dtype element access, gradient-like and adversarial fills,
 * and the float -> bf16/fp16 conversions the torch-mode scale formula
 * needs (written here, checked against MPFR by test_ref_*).
 */
#ifndef BX_TEST_UTIL_H
#define BX_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact.h"
#include "harness.h"
#include "mpfr_ref.h"

/* Dtypes use the reference's numbering: REF_F16, REF_BF16, REF_F32, REF_F64. */
size_t bxt_dt_size(int dt);
const char *bxt_dt_name(int dt);
DLDataType bxt_dl_dtype(int dt);

/* A 1-D (or reshaped) dense tensor owning its buffer. The DLTensor points
 * into this struct (shape, strides): do not copy a bxt_tensor by value;
 * copying its .t into an array of DLTensors is fine while it lives. */
typedef struct bxt_tensor {
  DLTensor t;
  int64_t shape[4];
  int64_t strides[4];
  void *buf; /* n elements (plus padding), 64-byte aligned */
  size_t n;  /* elements */
  int dt;
} bxt_tensor;

/* 1-D tensor of n elements, zero-filled, strides NULL, device kDLCPU. */
void bxt_tensor_alloc(bxt_tensor *x, int dt, size_t n);
void bxt_tensor_free(bxt_tensor *x);
/* A copy with its own buffer (same shape/strides/dtype). */
void bxt_tensor_clone(bxt_tensor *dst, const bxt_tensor *src);

double bxt_get(const bxt_tensor *x, size_t i);
/* Stores v rounded to the dtype (nearest even). */
void bxt_set(bxt_tensor *x, size_t i, double v);
uint64_t bxt_get_bits(const bxt_tensor *x, size_t i);
void bxt_set_bits(bxt_tensor *x, size_t i, uint64_t bits);

/* Fills. */
/* N(0, sigma^2) values, ~1% exact zeros, ~0.1% spikes 1000x larger. */
void bxt_fill_gradient(bxt_rng *r, bxt_tensor *x, double sigma);
/* Uniform random bit patterns; non-finite ones replaced by random finite
 * ones unless keep_nonfinite. */
void bxt_fill_bits(bxt_rng *r, bxt_tensor *x, int keep_nonfinite);
/* Finite values with exponents uniform over the dtype's whole range
 * (subnormals included), random mantissas and signs. */
void bxt_fill_wide(bxt_rng *r, bxt_tensor *x);
/* One of the above, chosen at random (gradient-like twice as likely). */
void bxt_fill_mixed(bxt_rng *r, bxt_tensor *x);

/* Reference sums of a tensor's elements (dense, any element order). */
void bxt_ref_squares(ref_sum *s, const bxt_tensor *x);
void bxt_ref_abs(ref_sum *s, const bxt_tensor *x);

/* float -> bf16 / fp16 bits, round to nearest even (NaN stays NaN). */
uint16_t bxt_f32_to_bf16(float f);
uint16_t bxt_f32_to_f16(float f);
float bxt_bf16_to_f32(uint16_t b);
float bxt_f16_to_f32(uint16_t b);

/* The bits of a double / float. */
uint64_t bxt_dbits(double d);
uint32_t bxt_fbits(float f);

/* Does msg mention "<word> <index>" with no digit following the index? */
int bxt_mentions(const char *msg, const char *word, long index);

#endif /* BX_TEST_UTIL_H */
