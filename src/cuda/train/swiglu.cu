/*
 * swiglu.cu — bx_swiglu_forward(_fused) / _backward(_fused) on CUDA
 * tensors: one thread per element (train_grid.h), swiglu_hd.h's arithmetic.
 */
#include "train_cuda.h"

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_swiglu_fwd_kernel(bx_tg_swiglu a) {
  BX_CUT_FOR(i, a.rows * a.f) bx_tg_swiglu_fwd(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_swiglu_bwd_kernel(bx_tg_swiglu a) {
  BX_CUT_FOR(i, a.rows * a.f) bx_tg_swiglu_bwd(&a, i);
}

bx_status bx_cut_swiglu_fwd(const char *fn, int device, const float *g, const float *u, float *h,
                            size_t rows, size_t f, size_t ldg, size_t ldu, size_t ldh) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_swiglu a = {g, u, nullptr, h, nullptr, nullptr, rows, f, ldg, ldu, ldh, 0, 0};
  void *args[] = {&a};
  return bx_cut_done(fn, "SwiGLU forward kernel",
                     bx_cut_launch((const void *)bx_cut_swiglu_fwd_kernel, rows * f, args),
                     pending);
}

bx_status bx_cut_swiglu_bwd(const char *fn, int device, const float *g, const float *u,
                            const float *dh, float *dg, float *du, size_t rows, size_t f,
                            size_t ldg, size_t ldu, size_t ldh, size_t lddg, size_t lddu) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_swiglu a = {g, u, dh, nullptr, dg, du, rows, f, ldg, ldu, ldh, lddg, lddu};
  void *args[] = {&a};
  return bx_cut_done(fn, "SwiGLU backward kernel",
                     bx_cut_launch((const void *)bx_cut_swiglu_bwd_kernel, rows * f, args),
                     pending);
}
