/*
 * permute.cu — bx_moe_permute / _backward and bx_moe_unpermute /
 * _backward on CUDA tensors (grid_moe.h): one thread per output element
 * (a copy, a gather sum, an unpermute combine, a dy_perm product), one per
 * (token, slot) for dweights (one bx_fmaf chain over h); permute_hd.h's
 * arithmetic. The plan (row_map, pos) was checked on the host first.
 */
#include "grid_moe.h"
#include "train_cuda.h"

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_permute_kernel(bx_tg_permute a) {
  BX_CUT_FOR(i, a.R * a.H) bx_tg_permute_elem(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_permute_bwd_kernel(bx_tg_permute a) {
  BX_CUT_FOR(i, a.T * a.H) bx_tg_permute_bwd_elem(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_unpermute_kernel(bx_tg_permute a) {
  BX_CUT_FOR(i, a.T * a.H) bx_tg_unpermute_elem(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_unpermute_dy_kernel(bx_tg_permute a) {
  BX_CUT_FOR(i, a.R * a.H) bx_tg_unpermute_dy_elem(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_unpermute_dw_kernel(bx_tg_permute a) {
  BX_CUT_FOR(i, a.T * a.k) bx_tg_unpermute_dw_slot(&a, i);
}

bx_status bx_cut_moe_permute(const char *fn, int device, const float *x, const int64_t *row_map,
                             float *x_perm, size_t R, size_t H) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_permute a = {x, nullptr, nullptr, nullptr, row_map, nullptr, x_perm, nullptr, 0, 0, H, R};
  void *args[] = {&a};
  cudaError_t e = cudaSuccess;
  if (R && H) e = bx_cut_launch((const void *)bx_cut_permute_kernel, (uint64_t)R * H, args);
  return bx_cut_done(fn, "MoE permute kernel", e, pending);
}

bx_status bx_cut_moe_permute_bwd(const char *fn, int device, const float *dx_perm,
                                 const int64_t *pos, float *dx, size_t T, size_t k, size_t H) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_permute a = {dx_perm, nullptr, nullptr, nullptr, nullptr, pos, dx, nullptr, T, k, H, T * k};
  void *args[] = {&a};
  cudaError_t e = cudaSuccess;
  if (T && H) e = bx_cut_launch((const void *)bx_cut_permute_bwd_kernel, (uint64_t)T * H, args);
  return bx_cut_done(fn, "MoE permute backward kernel", e, pending);
}

bx_status bx_cut_moe_unpermute(const char *fn, int device, const float *y_perm, const float *w,
                               const int64_t *pos, const float *initial, float *out, size_t T,
                               size_t k, size_t H) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_permute a = {y_perm, w, initial, nullptr, nullptr, pos, out, nullptr, T, k, H, T * k};
  void *args[] = {&a};
  cudaError_t e = cudaSuccess;
  if (T && H) e = bx_cut_launch((const void *)bx_cut_unpermute_kernel, (uint64_t)T * H, args);
  return bx_cut_done(fn, "MoE unpermute kernel", e, pending);
}

bx_status bx_cut_moe_unpermute_bwd(const char *fn, int device, const float *dout,
                                   const float *y_perm, const float *w, const int64_t *row_map,
                                   const int64_t *pos, float *dy_perm, float *dweights, size_t T,
                                   size_t k, size_t H) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  size_t R = T * k;
  bx_tg_permute a = {y_perm, w, nullptr, dout, row_map, pos, dy_perm, dweights, T, k, H, R};
  void *args[] = {&a};
  cudaError_t e = cudaSuccess;
  if (dy_perm && R && H)
    e = bx_cut_launch((const void *)bx_cut_unpermute_dy_kernel, (uint64_t)R * H, args);
  if (e == cudaSuccess && dweights && T && k)
    e = bx_cut_launch((const void *)bx_cut_unpermute_dw_kernel, (uint64_t)T * k, args);
  return bx_cut_done(fn, "MoE unpermute backward kernels", e, pending);
}
