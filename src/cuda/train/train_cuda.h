/*
 * train_cuda.h — what the training kernels' launchers (the src/cuda/train .cu files)
 * share: the launch of a grid-stride kernel on the legacy default stream,
 * and the wait that turns a launch's or a kernel's error into a status.
 * The thread bodies are train_grid.h's (plain C, simulated on the CPU by
 * tests/test_train_cuda_sim.c); the arithmetic is the src/common _hd.h headers's.
 */
#ifndef BX_TRAIN_CUDA_H
#define BX_TRAIN_CUDA_H

#include "cuda_internal.h"
#include "train_device.h"
#include "train_grid.h"

/* One block of BX_TG_BLOCK threads per BX_TG_BLOCK work items, at most
 * BX_TG_MAX_BLOCKS blocks (the kernels loop over the rest). */
static inline cudaError_t bx_cut_launch(const void *kernel, uint64_t items, void **args) {
  return cudaLaunchKernel(kernel, dim3(bx_tg_blocks(items)), dim3(BX_TG_BLOCK), args, 0, 0);
}

/* The end of a launcher: the launches' result e, then the wait for the
 * kernels (their asynchronous errors); BX_OK or the CUDA error. */
static inline bx_status bx_cut_done(const char *fn, const char *what, cudaError_t e,
                                    cudaError_t pending_before) {
  if (e == cudaSuccess) e = cudaStreamSynchronize(0);
  if (e != cudaSuccess) return bx_cu_fail(fn, what, e, pending_before);
  return BX_OK;
}

/* The grid-stride index loop of a kernel body over n items. */
#define BX_CUT_FOR(i, n)                                                               \
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);           \
       i += (uint64_t)gridDim.x * blockDim.x)

/* The launchers (one file each), collected in train_table.cu. */
bx_status bx_cut_swiglu_fwd(const char *fn, int device, const float *g, const float *u, float *h,
                            size_t rows, size_t f, size_t ldg, size_t ldu, size_t ldh);
bx_status bx_cut_swiglu_bwd(const char *fn, int device, const float *g, const float *u,
                            const float *dh, float *dg, float *du, size_t rows, size_t f,
                            size_t ldg, size_t ldu, size_t ldh, size_t lddg, size_t lddu);
bx_status bx_cut_adamw(const char *fn, int device, float *p, const float *g, float *m, float *v,
                       size_t n, const bx_adamw_scalars *s);
bx_status bx_cut_rmsnorm_fwd(const char *fn, int device, const float *x, const float *w, float *y,
                             float *rstd, size_t rows, size_t h, float eps);
bx_status bx_cut_rmsnorm_bwd(const char *fn, int device, const float *x, const float *w,
                             const float *dy, const float *rstd, float *dx, float *partials,
                             size_t rows, size_t h, size_t chunk, size_t nchunks);
bx_status bx_cut_rope(const char *fn, int device, const float *x, float *y, const int64_t *pos,
                      size_t tokens, size_t width, size_t head_dim, size_t half,
                      size_t rotary_dim, float theta, float sin_sign);
bx_status bx_cut_gemm(const char *fn, int device, const void *a, int a_bf16, const void *b,
                      int b_bf16, int layout, float *c, size_t m, size_t n, size_t k,
                      int accumulate);
bx_status bx_cut_attention_fwd(const char *fn, int device, const float *q, const float *k,
                               const float *v, float *o, float *stats, size_t T, size_t L,
                               size_t Hq, size_t Hkv, size_t D, float scale);
bx_status bx_cut_attention_bwd(const char *fn, int device, const float *dout, const float *q,
                               const float *k, const float *v, const float *stats, float *dq,
                               float *dk, float *dv, size_t T, size_t L, size_t Hq, size_t Hkv,
                               size_t D, float scale);

#endif /* BX_TRAIN_CUDA_H */
