/*
 * gemm.cu — bx_gemm on CUDA tensors: a tiled SIMT kernel (train_grid.h),
 * every output one bx_gemm_step chain over k ascending, fp32 on CUDA cores;
 * no split-K, no tensor cores (their accumulation is not IEEE fma). Block
 * (x, y) computes row tile x and column tile y; the k tiles pass through
 * shared memory between __syncthreads().
 */
#include "train_cuda.h"

__global__ void __launch_bounds__(BX_TG_GEMM_THREADS) bx_cut_gemm_kernel(bx_tg_gemm g) {
  __shared__ float As[BX_TG_GEMM_BK * BX_TG_GEMM_BM];
  __shared__ float Bs[BX_TG_GEMM_BK * BX_TG_GEMM_BN];
  float acc[BX_TG_GEMM_TM * BX_TG_GEMM_TN];
  const uint64_t bm = blockIdx.x, bn = blockIdx.y;
  const uint32_t tid = threadIdx.x;
  bx_tg_gemm_init(&g, bm, bn, tid, acc);
  for (uint64_t k0 = 0; k0 < g.k; k0 += BX_TG_GEMM_BK) {
    bx_tg_gemm_load(&g, bm, bn, k0, tid, As, Bs);
    __syncthreads();
    bx_tg_gemm_compute(&g, k0, tid, As, Bs, acc);
    __syncthreads();
  }
  bx_tg_gemm_store(&g, bm, bn, tid, acc);
}

bx_status bx_cut_gemm(const char *fn, int device, const void *a, int a_bf16, const void *b,
                      int b_bf16, int layout, float *c, size_t m, size_t n, size_t k,
                      int accumulate) {
  if (k == 0 && accumulate) return BX_OK; /* C stays as it is (the CPU's rule) */
  uint64_t gx = (m + BX_TG_GEMM_BM - 1) / BX_TG_GEMM_BM, gy = (n + BX_TG_GEMM_BN - 1) / BX_TG_GEMM_BN;
  if (gx > 0x7FFFFFFFu || gy > 65535u)
    return bx_fail(BX_EINVAL, "%s: %zu x %zu outputs exceed the CUDA kernel's grid (at most "
                   "2^31 - 1 row tiles and 65535 column tiles of 64)", fn, m, n);
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_gemm g = {a, b, a_bf16, b_bf16, layout, c, m, n, k, accumulate};
  void *args[] = {&g};
  cudaError_t e = cudaLaunchKernel((const void *)bx_cut_gemm_kernel, dim3((unsigned)gx, (unsigned)gy),
                                   dim3(BX_TG_GEMM_THREADS), args, 0, 0);
  return bx_cut_done(fn, "GEMM kernel", e, pending);
}
