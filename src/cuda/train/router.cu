/*
 * router.cu — bx_moe_router_forward / _backward on CUDA tensors
 * (grid_moe.h): one thread per token (router_hd.h's token, its scratch in
 * the thread's local arrays), then for the forward's counts one thread per
 * (chunk, expert), launched after the tokens (it reads their ids). The
 * checks of device data (NaN logits, bias, ids) ran on the host first.
 */
#include "grid_moe.h"
#include "train_cuda.h"

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_router_fwd_kernel(bx_tg_router a) {
  BX_CUT_FOR(t, a.T) bx_tg_router_fwd_token(&a, t);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_router_count_kernel(bx_tg_router a) {
  BX_CUT_FOR(i, a.nchunks * (uint64_t)a.q.E) bx_tg_router_count(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_router_bwd_kernel(bx_tg_router a) {
  BX_CUT_FOR(t, a.T) bx_tg_router_bwd_token(&a, t);
}

bx_status bx_cut_router_fwd(const char *fn, int device, const float *logits, const float *bias,
                            void *ids, int ids_i64, float *weights, int64_t *counts, size_t T,
                            size_t chunk, size_t nchunks, const bx_router_cfg *q) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_router a = {logits, bias, nullptr, ids,    ids_i64, weights, nullptr, counts,
                    T,      chunk, nchunks, *q,    0.0};
  void *args[] = {&a};
  cudaError_t e = cudaSuccess;
  if (T) e = bx_cut_launch((const void *)bx_cut_router_fwd_kernel, T, args);
  if (e == cudaSuccess && counts && nchunks)
    e = bx_cut_launch((const void *)bx_cut_router_count_kernel, nchunks * (uint64_t)q->E, args);
  return bx_cut_done(fn, "MoE router forward kernels", e, pending);
}

bx_status bx_cut_router_bwd(const char *fn, int device, const float *logits, const void *ids,
                            int ids_i64, const float *dw, float *dl, size_t T, size_t E, size_t k,
                            int norm, double r) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_router_cfg q = {(int64_t)E, 1, (int64_t)E, 1, (int64_t)k, norm, 0.0f};
  bx_tg_router a = {logits, nullptr, dw, const_cast<void *>(ids), ids_i64, nullptr, dl, nullptr,
                    T,      0,       0,  q,                        r};
  void *args[] = {&a};
  cudaError_t e = cudaSuccess;
  if (T) e = bx_cut_launch((const void *)bx_cut_router_bwd_kernel, T, args);
  return bx_cut_done(fn, "MoE router backward kernel", e, pending);
}
