/*
 * train_table.cu — the CUDA backend of the training kernels
 * (train_device.h), registered in src/train/train_devices.c.
 */
#include <stdlib.h>
#include <string.h>

#include "train_cuda.h"

static unsigned read_max_blocks() {
  const char *e = getenv("BITEXACT_TEST_CUDA_BLOCKS");
  long v = e ? strtol(e, NULL, 10) : 0;
  return v > 0 && v <= 65535 ? (unsigned)v : 0u;
}

unsigned bx_cut_max_blocks(void) {
  static const unsigned cap = read_max_blocks(); /* thread-safe initialisation (C++11) */
  return cap;
}

static bx_status to_host(const char *fn, int device, void *dst, const void *src, size_t bytes) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return bx_cu_fail(fn, "copying device data to the host", e, pending);
  return BX_OK;
}

/* Managed memory: cudaMallocManaged (256-byte aligned), zeroed on the host
 * (first touch there; the kernels migrate what they read). */
static bx_status alloc_managed(const char *fn, size_t bytes, void **ptr) {
  cudaError_t pending = cudaPeekAtLastError();
  void *p = NULL;
  cudaError_t e = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal);
  if (e != cudaSuccess) return bx_cu_fail(fn, "allocating managed memory", e, pending);
  memset(p, 0, bytes);
  *ptr = p;
  return BX_OK;
}

static void free_managed(void *ptr) {
  if (ptr) (void)cudaFree(ptr);
}

static bx_status usable(const char *fn) {
  bx_status st = bx_cuda_available(); /* the norm backend's answer: a device and a driver */
  return st == BX_OK ? BX_OK : bx_fail(st, "%s: %s", fn, bx_last_error());
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
    bx_cut_rmsnorm_bwd, bx_cut_rope,   bx_cut_gemm,       to_host,      alloc_managed,
    free_managed,   usable,
    /* issue 30: the MoE router, dispatch, embedding, cross-entropy */
    to_device, bx_cut_router_fwd, bx_cut_router_bwd, bx_cut_moe_permute, bx_cut_moe_permute_bwd,
    bx_cut_moe_unpermute, bx_cut_moe_unpermute_bwd, bx_cut_embedding_fwd, bx_cut_embedding_bwd,
    bx_cut_xent,
    /* the token reduction (tokred.cu) */
    bx_cut_tokred_maxabs, bx_cut_tokred_grid, bx_cut_tokred_wgrad, bx_cut_tokred_wgrad_chunk,
    /* attention (attention.cu) */
    bx_cut_attention_fwd, bx_cut_attention_bwd,
    /* the elementwise math, RoPE's table, the bias partials (math.cu) */
    bx_cut_math, bx_cut_rope_table, bx_cut_bias_partials};
