/*
 * train_table.cu — the CUDA backend of the training kernels
 * (train_device.h), registered in src/train/train_devices.c.
 */
#include "train_cuda.h"

static bx_status to_host(const char *fn, int device, void *dst, const void *src, size_t bytes) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return bx_cu_fail(fn, "copying device data to the host", e, pending);
  return BX_OK;
}

/* bytes from the host to device memory (embedding backward's sort). */
static bx_status to_device(const char *fn, int device, void *dst, const void *src, size_t bytes) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) return bx_cu_fail(fn, "copying host data to the device", e, pending);
  return BX_OK;
}

extern "C" const bx_train_device bx_cuda_train = {
    "cuda",         bx_cut_swiglu_fwd, bx_cut_swiglu_bwd, bx_cut_adamw, bx_cut_rmsnorm_fwd,
    bx_cut_rmsnorm_bwd, bx_cut_rope,   bx_cut_gemm,       to_host,
    /* issue 30: the MoE router, dispatch, embedding, cross-entropy */
    to_device, bx_cut_router_fwd, bx_cut_router_bwd, bx_cut_moe_permute, bx_cut_moe_permute_bwd,
    bx_cut_moe_unpermute, bx_cut_moe_unpermute_bwd, bx_cut_embedding_fwd, bx_cut_embedding_bwd,
    bx_cut_xent};
