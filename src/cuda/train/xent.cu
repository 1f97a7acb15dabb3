/*
 * xent.cu — bx_xent_forward / _backward / _forward_backward on CUDA
 * tensors (grid_moe.h): one thread per token row (xent_hd.h's row with the
 * scalar bx_expf_det, the fp64 sum S sequential in ascending v as on the
 * CPU), then one thread per chunk for the loss partials and counts,
 * launched after the rows (it reads their losses). The targets were
 * checked on the host first.
 */
#include "grid_moe.h"
#include "train_cuda.h"

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_xent_row_kernel(bx_tg_xent a) {
  BX_CUT_FOR(t, a.T) bx_tg_xent_row(&a, t);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_xent_chunk_kernel(bx_tg_xent a) {
  BX_CUT_FOR(i, a.nchunks) bx_tg_xent_chunk(&a, i);
}

bx_status bx_cut_xent(const char *fn, int device, const float *z, const void *targets,
                      int targets_i64, int64_t ignore_index, float *g, float *losses,
                      float *partials, int64_t *counts, size_t T, size_t V, size_t chunk,
                      size_t nchunks, double c) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_xent a = {z, targets, targets_i64, ignore_index, g, losses, partials, counts,
                  T, V,       chunk,       nchunks,      c};
  void *args[] = {&a};
  cudaError_t e = cudaSuccess;
  if (T) e = bx_cut_launch((const void *)bx_cut_xent_row_kernel, T, args);
  if (e == cudaSuccess && (partials || counts) && nchunks)
    e = bx_cut_launch((const void *)bx_cut_xent_chunk_kernel, nchunks, args);
  return bx_cut_done(fn, "cross-entropy kernels", e, pending);
}
