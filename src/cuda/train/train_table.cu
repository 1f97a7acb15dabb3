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

extern "C" const bx_train_device bx_cuda_train = {
    "cuda",         bx_cut_swiglu_fwd, bx_cut_swiglu_bwd, bx_cut_adamw, bx_cut_rmsnorm_fwd,
    bx_cut_rmsnorm_bwd, bx_cut_rope,   bx_cut_gemm,       to_host,
    bx_cut_attention_fwd, bx_cut_attention_bwd};
