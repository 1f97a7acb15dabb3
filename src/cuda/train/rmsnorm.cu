/*
 * rmsnorm.cu — bx_rmsnorm_forward / _backward on CUDA tensors
 * (train_grid.h): one thread per row for the forward and for dx (each row
 * one sequential chain, as on the CPU), one thread per (chunk, column) for
 * the weight-gradient partials, launched first (dx may be dy).
 * rmsnorm_hd.h's arithmetic. (Coalescing through a shared-memory
 * transpose is a speed change for later: the chains stay.)
 */
#include "train_cuda.h"

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_rmsnorm_fwd_kernel(bx_tg_rmsnorm a) {
  BX_CUT_FOR(r, a.rows) bx_tg_rmsnorm_fwd_row(&a, r);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_rmsnorm_part_kernel(bx_tg_rmsnorm a) {
  BX_CUT_FOR(i, a.nchunks * a.h) bx_tg_rmsnorm_part(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_rmsnorm_dx_kernel(bx_tg_rmsnorm a) {
  BX_CUT_FOR(r, a.rows) bx_tg_rmsnorm_dx_row(&a, r);
}

bx_status bx_cut_rmsnorm_fwd(const char *fn, int device, const float *x, const float *w, float *y,
                             float *rstd, size_t rows, size_t h, float eps) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_rmsnorm a = {x, w, nullptr, nullptr, y, rstd, nullptr, nullptr, rows, h, 0, 0, eps};
  void *args[] = {&a};
  return bx_cut_done(fn, "RMSNorm forward kernel",
                     bx_cut_launch((const void *)bx_cut_rmsnorm_fwd_kernel, rows, args), pending);
}

bx_status bx_cut_rmsnorm_bwd(const char *fn, int device, const float *x, const float *w,
                             const float *dy, const float *rstd, float *dx, float *partials,
                             size_t rows, size_t h, size_t chunk, size_t nchunks) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_rmsnorm a = {x, w, dy, rstd, nullptr, nullptr, dx, partials, rows, h, chunk, nchunks, 0.0f};
  void *args[] = {&a};
  cudaError_t e = cudaSuccess;
  if (partials)
    e = bx_cut_launch((const void *)bx_cut_rmsnorm_part_kernel, nchunks * h, args);
  if (e == cudaSuccess) e = bx_cut_launch((const void *)bx_cut_rmsnorm_dx_kernel, rows, args);
  return bx_cut_done(fn, "RMSNorm backward kernels", e, pending);
}
