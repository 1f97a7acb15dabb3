/*
 * train_device.h — the training kernels' device backend: the launchers a
 * backend implements (the src/cuda/train .cu files for CUDA), reached from the
 * public entries of bitexact_train.h when every tensor of a call is a
 * kDLCUDA tensor of one device (train_check.h bx_tc_place_of). The
 * arithmetic of every launcher is the CPU's own (the src/common _hd.h headers), so a
 * device call gives the CPU call's bits (issue 30; docs/cuda.md says what
 * has and has not run on a GPU).
 *
 * The entries have checked everything before a launcher is called: shapes,
 * dtypes, layouts, overlaps, options; pointers are device addresses of
 * dense row-major tensors on device `device`. A launcher selects the
 * device, enqueues its kernels on the legacy default stream, waits for
 * them and returns BX_OK, or BX_EDEVICE / BX_ENOMEM with the CUDA text in
 * bx_last_error() (a CUDA error another library left pending stays for it
 * to see). Nothing here allocates device memory.
 *
 * src/train reaches a backend only through this table, registered in
 * train_devices.c (one line per backend); a backend includes nothing of
 * src/train but this header.
 */
#ifndef BX_TRAIN_DEVICE_H
#define BX_TRAIN_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "adamw_hd.h"
#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bx_train_device {
  const char *name;
  /* SwiGLU over rows x f elements; row strides in elements (ld*). */
  bx_status (*swiglu_fwd)(const char *fn, int device, const float *g, const float *u, float *h,
                          size_t rows, size_t f, size_t ldg, size_t ldu, size_t ldh);
  bx_status (*swiglu_bwd)(const char *fn, int device, const float *g, const float *u,
                          const float *dh, float *dg, float *du, size_t rows, size_t f,
                          size_t ldg, size_t ldu, size_t ldh, size_t lddg, size_t lddu);
  /* AdamW over n elements with the call's fp32 scalars. */
  bx_status (*adamw)(const char *fn, int device, float *p, const float *g, float *m, float *v,
                     size_t n, const bx_adamw_scalars *s);
  /* RMSNorm forward: rows x h; rstd may be NULL. */
  bx_status (*rmsnorm_fwd)(const char *fn, int device, const float *x, const float *w, float *y,
                           float *rstd, size_t rows, size_t h, float eps);
  /* RMSNorm backward: dx (may be dy exactly) and, unless partials is NULL,
   * the [nchunks, h] weight-gradient partials over chunks of chunk rows
   * (computed before dx is written). */
  bx_status (*rmsnorm_bwd)(const char *fn, int device, const float *x, const float *w,
                           const float *dy, const float *rstd, float *dx, float *partials,
                           size_t rows, size_t h, size_t chunk, size_t nchunks);
  /* RoPE on tokens x width (heads of head_dim), the first 2 * half features
   * of each head rotated, the rest copied (unless y is x); positions on the
   * device, already checked (0 <= pos <= 2^24); sin_sign +1 / -1. */
  bx_status (*rope)(const char *fn, int device, const float *x, float *y, const int64_t *pos,
                    size_t tokens, size_t width, size_t head_dim, size_t half, size_t rotary_dim,
                    float theta, float sin_sign);
  /* C (m x n, row-major) = A . op(B) (+ C with accumulate) in bx_gemm's
   * layouts; a_bf16 / b_bf16: the operand holds bf16. */
  bx_status (*gemm)(const char *fn, int device, const void *a, int a_bf16, const void *b,
                    int b_bf16, int layout, float *c, size_t m, size_t n, size_t k,
                    int accumulate);
  /* bytes from device memory to the host (the checks of device data that
   * decide an error: RoPE's positions). */
  bx_status (*to_host)(const char *fn, int device, void *dst, const void *src, size_t bytes);
  /* Causal GQA attention forward (bitexact_train_layers.h) over T = B * L
   * tokens: q, o [T, Hq*D]; k, v [T, Hkv*D]; stats [T, Hq, 2]; scale the
   * fp32 nearest to D^-1/2. */
  bx_status (*attention_fwd)(const char *fn, int device, const float *q, const float *k,
                             const float *v, float *o, float *stats, size_t T, size_t L,
                             size_t Hq, size_t Hkv, size_t D, float scale);
  /* Its backward: dout, q, dq [T, Hq*D]; k, v, dk, dv [T, Hkv*D]; stats
   * [T, Hq, 2] from the forward. */
  bx_status (*attention_bwd)(const char *fn, int device, const float *dout, const float *q,
                             const float *k, const float *v, const float *stats, float *dq,
                             float *dk, float *dv, size_t T, size_t L, size_t Hq, size_t Hkv,
                             size_t D, float scale);
} bx_train_device;

/* The CUDA backend's table, or NULL in a build without it. */
const bx_train_device *bx_train_device_cuda(void);

/* The same for a call whose tensors are all CUDA tensors: BX_EDEVICE
 * naming fn when this build has no CUDA backend. */
bx_status bx_train_cuda(const char *fn, const bx_train_device **dev);

#ifdef __cplusplus
}
#endif

#endif /* BX_TRAIN_DEVICE_H */
