/*
 * embedding.cu — bx_embedding_forward / _backward on CUDA tensors
 * (grid_moe.h): the lookup one thread per output element; the backward's
 * compact partials one thread per (compact row, column), over the row ids
 * and offsets the host sorted (embedding.c) and copied to the call's
 * outputs; embedding_hd.h's adds. The ids were checked on the host first.
 */
#include "grid_moe.h"
#include "train_cuda.h"

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_embedding_fwd_kernel(bx_tg_embedding a) {
  BX_CUT_FOR(i, a.T * a.H) bx_tg_embedding_fwd_elem(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_embedding_bwd_kernel(bx_tg_embedding a,
                                                                           uint64_t n) {
  BX_CUT_FOR(i, n) bx_tg_embedding_bwd_elem(&a, i);
}

bx_status bx_cut_embedding_fwd(const char *fn, int device, const float *weight, const void *ids,
                               int ids_i64, float *y, size_t T, size_t H) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_embedding a = {weight, nullptr, ids, ids_i64, y, nullptr, nullptr, T, H, 0, 0};
  void *args[] = {&a};
  cudaError_t e = cudaSuccess;
  if (T && H) e = bx_cut_launch((const void *)bx_cut_embedding_fwd_kernel, (uint64_t)T * H, args);
  return bx_cut_done(fn, "embedding forward kernel", e, pending);
}

bx_status bx_cut_embedding_bwd(const char *fn, int device, const void *ids, int ids_i64,
                               const float *dy, const int64_t *row_ids, const int64_t *offsets,
                               float *rows, size_t T, size_t H, size_t chunk, size_t nchunks,
                               size_t total) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_embedding a = {nullptr, dy, ids, ids_i64, rows, row_ids, offsets, T, H, chunk, nchunks};
  uint64_t n = (uint64_t)total * H;
  void *args[] = {&a, &n};
  cudaError_t e = cudaSuccess;
  if (n) e = bx_cut_launch((const void *)bx_cut_embedding_bwd_kernel, n, args);
  return bx_cut_done(fn, "embedding backward kernel", e, pending);
}
